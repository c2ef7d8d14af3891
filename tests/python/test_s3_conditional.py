"""tests/tools/s3_strict_server.py implements S3's conditional writes as AWS
documents them: If-None-Match: * / If-Match on PUT and on
CompleteMultipartUpload, 412 PreconditionFailed, 404 NoSuchKey for If-Match
on a missing key, 501 for If-None-Match other than *, 409
ConditionalRequestConflict for a conditional multipart completion whose key
changed since initiation, and exactly one winner among racing writers.
The client signs every request with SigV4 (the server verifies it).
Standard library only; prints "conditional: N passed, N failed"."""
import datetime
import hashlib
import http.client
import os
import re
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import s3_strict_server as srv  # noqa: E402

KEY, SECRET, REGION, BUCKET = "AKIACOND", "cond/secret+key", "us-east-1", "bkt"
passed = failed = 0


def check(what, cond):
    global passed, failed
    if cond:
        passed += 1
        print("ok   " + what)
    else:
        failed += 1
        print("FAIL " + what)


def request(port, method, key, body=b"", headers=(), query=""):
    """One signed request; returns (status, body bytes, headers dict)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    amz = now.strftime("%Y%m%dT%H%M%SZ")
    scope = "%s/%s/s3/aws4_request" % (amz[:8], REGION)
    path = "/%s/%s" % (BUCKET, srv.uri_encode(key, True))
    sha = hashlib.sha256(body).hexdigest()
    hdrs = [("Host", "127.0.0.1:%d" % port), ("x-amz-date", amz), ("x-amz-content-sha256", sha)]
    hdrs += list(headers)
    signed = sorted(h.lower() for h, _ in hdrs)
    sig = srv.signature(SECRET, method, path, query, hdrs, signed, sha, amz, scope)
    auth = "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s" % (KEY, scope, ";".join(signed), sig)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    c.putrequest(method, path + ("?" + query if query else ""), skip_host=True, skip_accept_encoding=True)
    for h, v in hdrs:
        c.putheader(h, v)
    c.putheader("Authorization", auth)
    c.putheader("Content-Length", str(len(body)))
    c.endheaders()
    c.send(body)
    r = c.getresponse()
    data = r.read()
    out = (r.status, data, {k.lower(): v for k, v in r.getheaders()})
    c.close()
    return out


def code_of(body):
    m = re.search(rb"<Code>([^<]*)</Code>", body)
    return m.group(1).decode() if m else ""


def race(port, key, headers, tag, n=16):
    """n threads PUT key at once with the same precondition; statuses.
    Bodies differ from every earlier write (an identical body keeps the
    ETag, so a second If-Match writer would rightly succeed too)."""
    out, start = [], threading.Barrier(n)

    def one(i):
        start.wait()
        try:
            out.append(request(port, "PUT", key, b"%s writer %d" % (tag, i), headers)[0])
        except OSError as e:  # reported below: a writer that got no answer
            out.append("no answer: %s" % e)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return out


def multipart(port, key, parts, complete_headers=(), before_complete=None):
    st, body, _ = request(port, "POST", key, query="uploads=")
    uid = re.search(rb"<UploadId>([^<]*)</UploadId>", body).group(1).decode()
    xml = "<CompleteMultipartUpload>"
    for i, p in enumerate(parts, 1):
        st, _, h = request(port, "PUT", key, p, query="partNumber=%d&uploadId=%s" % (i, uid))
        xml += "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>" % (i, h["etag"])
    xml += "</CompleteMultipartUpload>"
    if before_complete:
        before_complete()
    st, body, _ = request(port, "POST", key, xml.encode(), complete_headers, query="uploadId=" + uid)
    return st, body


def main():
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "tools", "s3_strict_server.py"), "--bucket", BUCKET,
                          "--access-key", KEY, "--secret-key", SECRET, "--region", REGION],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = p.stdout.readline()
        m = re.match(r"listening (\d+)", line)
        if not m:
            check("server starts", False)
            return
        port = int(m.group(1))
        st, _, h = request(port, "PUT", "k", b"one", [("If-None-Match", "*")])
        check("If-None-Match: * creates a missing key (200)", st == 200)
        etag = h.get("etag", "")
        st, body, _ = request(port, "PUT", "k", b"two", [("If-None-Match", "*")])
        check("If-None-Match: * on an existing key: 412 PreconditionFailed", st == 412 and code_of(body) == "PreconditionFailed")
        st, body, _ = request(port, "PUT", "k", b"two", [("If-None-Match", '"%s"' % etag.strip('"'))])
        check("If-None-Match other than *: 501 NotImplemented", st == 501)
        st, body, _ = request(port, "PUT", "k", b"two", [("If-Match", '"0123"')])
        check("If-Match with another ETag: 412", st == 412 and code_of(body) == "PreconditionFailed")
        st, _, h2 = request(port, "PUT", "k", b"two", [("If-Match", etag)])
        check("If-Match with the current ETag replaces (200)", st == 200 and h2.get("etag") != etag)
        st, body, _ = request(port, "PUT", "missing", b"x", [("If-Match", etag)])
        check("If-Match on a missing key: 404 NoSuchKey", st == 404 and code_of(body) == "NoSuchKey")
        st, got, _ = request(port, "GET", "k")
        check("the object is the one the successful conditional write put", st == 200 and got == b"two")

        sts = race(port, "race/new", [("If-None-Match", "*")], b"create")
        check("16 racing If-None-Match: * writers: exactly one 200, the rest 412 (got %s)" % sorted(map(str, sts)),
              sorted(map(str, sts)) == ["200"] + ["412"] * 15)
        _, _, h = request(port, "HEAD", "race/new")
        sts = race(port, "race/new", [("If-Match", h["etag"])], b"replace")
        check("16 racing If-Match writers on one ETag: exactly one 200, the rest 412 (got %s)" % sorted(map(str, sts)),
              sorted(map(str, sts)) == ["200"] + ["412"] * 15)

        big = [os.urandom(64), os.urandom(32)]
        st, body = multipart(port, "mp/new", big, [("If-None-Match", "*")])
        check("conditional CompleteMultipartUpload creates a missing key", st == 200)
        st, body = multipart(port, "mp/new", big, [("If-None-Match", "*")])
        check("conditional CompleteMultipartUpload on an existing key: 412", st == 412)
        st, body = multipart(port, "mp/race", big, [("If-None-Match", "*")],
                             before_complete=lambda: request(port, "PUT", "mp/race", b"someone else"))
        check("key written between initiate and a conditional complete: 409 ConditionalRequestConflict",
              st == 409 and code_of(body) == "ConditionalRequestConflict")
        st, got, _ = request(port, "GET", "mp/race")
        check("... and the other writer's object stands", got == b"someone else")
        _, _, h = request(port, "HEAD", "mp/race")
        st, body = multipart(port, "mp/race", big, [("If-Match", h["etag"])])
        check("CompleteMultipartUpload with If-Match of the current ETag replaces it", st == 200)
        st, body = multipart(port, "mp/race", big)
        check("an unconditional CompleteMultipartUpload is not refused", st == 200)
    finally:
        p.kill()
        p.wait()


def test_conditional_writes():
    """pytest's entry: every check above as one case."""
    main()
    assert failed == 0 and passed > 0, "%d of %d checks failed (see the FAIL lines)" % (failed, passed + failed)


if __name__ == "__main__":
    main()
    print("conditional: %d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)
