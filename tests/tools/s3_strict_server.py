#!/usr/bin/python3
"""A small, strict S3 for ferry's tests: it checks what s3rver does not.

 * Every request must carry a valid AWS Signature Version 4 (Authorization
   header): the server recomputes the canonical request, string to sign and
   signature from what arrived on the wire, with its own secret, and answers
   403 SignatureDoesNotMatch / InvalidAccessKeyId / AccessDenied /
   InvalidToken on any mismatch; 400 XAmzContentSHA256Mismatch if the
   x-amz-content-sha256 header is absent or not the SHA-256 of the body.
   Before serving, it checks its own signer against AWS's published vectors
   (the S3 "GET /test.txt" example and the SigV4 test suite's
   get-vanilla-query-order-key-case) and exits if they do not match.
 * Conditional writes as AWS documents them ("Add preconditions to S3
   operations with conditional requests"), on PUT and on
   CompleteMultipartUpload, checked and applied under one lock (so racing
   writers see exactly one winner):
     If-None-Match: *     412 PreconditionFailed if the key exists
     If-None-Match: other 501 NotImplemented (only "*" is supported)
     If-Match: ETAG       412 PreconditionFailed if the key's ETag differs,
                          404 NoSuchKey if there is no such key
     a conditional CompleteMultipartUpload whose key was written or deleted
     since the upload was initiated: 409 ConditionalRequestConflict (the
     client must start the upload again).
 * Objects (in memory): PUT, GET (Range, If-Match), HEAD, DELETE,
   ListObjectsV2 (prefix, max-keys, continuation-token), multipart uploads
   (etag md5-of-md5s "-N", as S3).
 * Fault injection for retry tests, set through unsigned control requests:
   GET /__ctl?fail=N    the next N requests answer 503 SlowDown
   GET /__ctl?cut=N     the next N object GETs send half the body, then close
   GET /__ctl?cut_shrink=N  the same, and the object is then replaced by its
                        first eighth (a new ETag): a writer between attempts
   GET /__ctl?no_get_if_match=1  GET ignores If-Match (as s3rver 3.7 does: a
                        resumed GET of a changed object gets the new one's
                        bytes, or 416 when it is shorter, never 412)
   GET /__ctl?lose=N    the next N PUTs are applied, then the connection is
                        closed without an answer
   GET /__ctl?part_delay=MS   every UploadPart waits MS ms before its answer
                        (so that parts in flight at once can be seen)
   GET /__ctl?bad_part=N the next UploadPart of part number N answers
                        400 InvalidArgument (a final error, not retried)
   GET /__ctl?fail_part=N the next UploadPart of part number N answers 503
   GET /__ctl?reset=1   all counters back to 0
   GET /__stats         JSON counters, among them parts_in_flight_max (the
                        most UploadPart requests handled at once), uploads
                        (multipart uploads open: initiated, neither
                        completed nor aborted), aborts, range_bytes (body
                        bytes of 206 answers) and get_bytes (of 200 GETs)

Usage: s3_strict_server.py --bucket B --access-key K --secret-key S
       [--token T] [--region R] [--port 0]
Prints "listening PORT" when ready.  Python standard library only.
"""
import argparse
import base64
import datetime
import hashlib
import hmac
import http.server
import json
import sys
import threading
import urllib.parse
from xml.sax.saxutils import escape

EMPTY_SHA = hashlib.sha256(b"").hexdigest()


# ---------------------------------------------------------------------------
# SigV4
# ---------------------------------------------------------------------------

def uri_encode(s, keep_slash):
    return urllib.parse.quote(s, safe="-_.~" + ("/" if keep_slash else ""))


def canonical_query(raw):
    pairs = []
    if raw:
        for part in raw.split("&"):
            k, _, v = part.partition("=")
            pairs.append((uri_encode(urllib.parse.unquote(k), False),
                          uri_encode(urllib.parse.unquote(v), False)))
    pairs.sort()
    return "&".join(k + "=" + v for k, v in pairs)


def signing_key(secret, date, region, service):
    k = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k


def signature(secret, method, raw_path, raw_query, headers, signed, payload_hash,
              amz_date, scope):
    """headers: list of (name, value) as received; signed: list of lowercase names."""
    values = {}
    for name, value in headers:
        values.setdefault(name.lower(), []).append(" ".join(value.split()))
    canon_headers = "".join(h + ":" + ",".join(values.get(h, [])) + "\n" for h in signed)
    creq = "\n".join([method, raw_path, canonical_query(raw_query), canon_headers,
                      ";".join(signed), payload_hash])
    sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                     hashlib.sha256(creq.encode()).hexdigest()])
    date, region, service, _ = scope.split("/")
    return hmac.new(signing_key(secret, date, region, service), sts.encode(),
                    hashlib.sha256).hexdigest()


def self_test():
    """AWS's published vectors; the server refuses to start if one fails."""
    # S3 "Example: GET Object" (sig-v4-header-based-auth).
    got = signature(
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "GET", "/test.txt", "",
        [("Host", "examplebucket.s3.amazonaws.com"), ("Range", "bytes=0-9"),
         ("x-amz-content-sha256", EMPTY_SHA), ("x-amz-date", "20130524T000000Z")],
        ["host", "range", "x-amz-content-sha256", "x-amz-date"], EMPTY_SHA,
        "20130524T000000Z", "20130524/us-east-1/s3/aws4_request")
    want = "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    if got != want:
        sys.exit("self-test failed: S3 GET example: %s != %s" % (got, want))
    # SigV4 test suite: get-vanilla-query-order-key-case (query sorting).
    got = signature(
        "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "GET", "/", "Param2=value2&Param1=value1",
        [("Host", "example.amazonaws.com"), ("X-Amz-Date", "20150830T123600Z")],
        ["host", "x-amz-date"], EMPTY_SHA, "20150830T123600Z",
        "20150830/us-east-1/service/aws4_request")
    want = "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
    if got != want:
        sys.exit("self-test failed: get-vanilla-query-order-key-case: %s != %s" % (got, want))


# ---------------------------------------------------------------------------
# State
# ---------------------------------------------------------------------------

class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.objects = {}     # key -> (bytes, etag, mtime)
        self.uploads = {}     # upload id -> (key, {part: (bytes, etag)})
        self.next_upload = 1
        self.fail = self.cut = self.lose = 0
        self.cut_shrink = self.no_get_if_match = 0
        self.part_delay = 0
        self.bad_part = self.fail_part = 0
        self.parts_in_flight = 0
        self.stats = {"requests": 0, "auth_failures": 0, "sha_mismatch": 0, "precondition_failed": 0,
                      "faults": 0, "conditional_puts": 0, "resumed_gets": 0, "conditional_conflicts": 0,
                      "parts_in_flight_max": 0, "upload_parts": 0, "truncated_requests": 0, "aborts": 0, "range_bytes": 0,
                      "get_bytes": 0}


class S3Error(Exception):
    def __init__(self, status, code, message=""):
        super().__init__(code)
        self.status, self.code, self.message = status, code, message


def http_date(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT")


def iso_date(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ferry-strict-s3"

    def log_message(self, fmt, *a):
        if self.server.state.args.verbose:
            sys.stderr.write("%s\n" % (fmt % a))

    # -- plumbing --------------------------------------------------------
    def send(self, status, body=b"", headers=(), head=False):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and not head:
            self.wfile.write(body)

    def send_error_xml(self, e, head=False):
        body = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s</Code><Message>%s</Message>"
                "</Error>" % (escape(e.code), escape(e.message))).encode()
        self.send(e.status, body, [("Content-Type", "application/xml")], head)

    def do_GET(self): self.handle_any("GET")
    def do_HEAD(self): self.handle_any("HEAD")
    def do_PUT(self): self.handle_any("PUT")
    def do_POST(self): self.handle_any("POST")
    def do_DELETE(self): self.handle_any("DELETE")

    def handle_any(self, method):
        st = self.server.state
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        if len(body) < n:
            # the client gave up mid-body (a canceled or stopped upload):
            # nothing to answer, and no payload to check
            with st.lock:
                st.stats["truncated_requests"] += 1
            self.close_connection = True
            return
        path, _, query = self.path.partition("?")
        if path in ("/__ctl", "/__stats"):
            return self.control(path, query)
        with st.lock:
            st.stats["requests"] += 1
            if st.fail > 0:
                st.fail -= 1
                st.stats["faults"] += 1
                return self.send_error_xml(S3Error(503, "SlowDown", "injected"), method == "HEAD")
        try:
            self.verify(method, path, query, body)
            self.route(method, path, query, body)
        except S3Error as e:
            with st.lock:
                if e.status == 403:
                    st.stats["auth_failures"] += 1
                if e.code == "XAmzContentSHA256Mismatch":
                    st.stats["sha_mismatch"] += 1
                if e.status == 412:
                    st.stats["precondition_failed"] += 1
            self.send_error_xml(e, method == "HEAD")

    def control(self, path, query):
        st = self.server.state
        with st.lock:
            if path == "/__ctl":
                for k, v in urllib.parse.parse_qsl(query):
                    if k in ("fail", "cut", "lose", "part_delay", "bad_part", "fail_part", "cut_shrink", "no_get_if_match"):
                        setattr(st, k, int(v))
                    elif k == "reset":
                        st.stats = dict.fromkeys(st.stats, 0)
            body = json.dumps(dict(st.stats, fail=st.fail, cut=st.cut, lose=st.lose,
                                   uploads=len(st.uploads))).encode()
        self.send(200, body, [("Content-Type", "application/json")])

    # -- authentication --------------------------------------------------
    def verify(self, method, path, query, body):
        a = self.server.state.args
        auth = self.headers.get("Authorization")
        if not auth:
            raise S3Error(403, "AccessDenied", "anonymous access is not allowed")
        try:
            algo, rest = auth.split(" ", 1)
            fields = dict(p.strip().split("=", 1) for p in rest.split(","))
            cred, signed, sig = fields["Credential"], fields["SignedHeaders"], fields["Signature"]
            key_id, date, region, service, term = cred.split("/")
        except (ValueError, KeyError):
            raise S3Error(400, "AuthorizationHeaderMalformed", auth)
        if algo != "AWS4-HMAC-SHA256" or term != "aws4_request" or service != "s3":
            raise S3Error(400, "AuthorizationHeaderMalformed", "bad algorithm or scope")
        if key_id != a.access_key:
            raise S3Error(403, "InvalidAccessKeyId", key_id)
        if region != a.region:
            raise S3Error(400, "AuthorizationHeaderMalformed", "region %s, expected %s" % (region, a.region))
        amz_date = self.headers.get("x-amz-date", "")
        try:
            t = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
        except ValueError:
            raise S3Error(403, "AccessDenied", "bad x-amz-date")
        if amz_date[:8] != date:
            raise S3Error(403, "SignatureDoesNotMatch", "scope date differs from x-amz-date")
        if abs((datetime.datetime.now(datetime.timezone.utc) - t).total_seconds()) > 900:
            raise S3Error(403, "RequestTimeTooSkewed", amz_date)
        signed_list = signed.split(";")
        for required in ("host", "x-amz-date", "x-amz-content-sha256"):
            if required not in signed_list:
                raise S3Error(403, "AccessDenied", "%s is not signed" % required)
        if a.token is not None:
            if "x-amz-security-token" not in signed_list:
                raise S3Error(403, "AccessDenied", "x-amz-security-token is not signed")
            if self.headers.get("x-amz-security-token") != a.token:
                raise S3Error(403, "InvalidToken", "bad session token")
        payload = self.headers.get("x-amz-content-sha256")
        if payload is None:
            raise S3Error(400, "InvalidRequest", "missing x-amz-content-sha256")
        if payload != "UNSIGNED-PAYLOAD" and payload != hashlib.sha256(body).hexdigest():
            raise S3Error(400, "XAmzContentSHA256Mismatch", "payload hash differs")
        want = signature(a.secret_key, self.command, path, query, self.headers.items(), signed_list,
                         payload, amz_date, "/".join([date, region, service, term]))
        if not hmac.compare_digest(want, sig):
            raise S3Error(403, "SignatureDoesNotMatch", "signature mismatch")

    # -- operations ------------------------------------------------------
    def route(self, method, path, query, body):
        st = self.server.state
        parts = path.split("/", 2)
        bucket = urllib.parse.unquote(parts[1]) if len(parts) > 1 else ""
        key = urllib.parse.unquote(parts[2]) if len(parts) > 2 else ""
        q = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
        if bucket != st.args.bucket:
            raise S3Error(404, "NoSuchBucket", bucket)
        if not key:
            if method == "GET" and q.get("list-type") == "2":
                return self.list_v2(q)
            raise S3Error(400, "InvalidRequest", "unsupported bucket operation")
        if method == "POST" and "uploads" in q:
            with st.lock:
                uid = "up%d" % st.next_upload
                st.next_upload += 1
                cur = st.objects.get(key)
                st.uploads[uid] = (key, {}, cur[1] if cur else None)  # the key's ETag at initiation
            xml = ("<InitiateMultipartUploadResult><Bucket>%s</Bucket><Key>%s</Key><UploadId>%s</UploadId>"
                   "</InitiateMultipartUploadResult>" % (escape(bucket), escape(key), uid))
            return self.send(200, xml.encode(), [("Content-Type", "application/xml")])
        if method == "PUT" and "uploadId" in q:
            return self.upload_part(key, q, body)
        if method == "POST" and "uploadId" in q:
            return self.complete(key, q, body)
        if method == "DELETE" and "uploadId" in q:
            with st.lock:
                if st.uploads.pop(q["uploadId"], None) is not None:
                    st.stats["aborts"] += 1
            return self.send(204)
        if method == "PUT":
            return self.put(key, body)
        if method in ("GET", "HEAD"):
            return self.get(key, method == "HEAD")
        if method == "DELETE":
            with st.lock:
                st.objects.pop(key, None)
            return self.send(204)
        raise S3Error(405, "MethodNotAllowed", method)

    def check_conditions(self, cur):
        inm, im = self.headers.get("If-None-Match"), self.headers.get("If-Match")
        if inm is not None:
            if inm.strip() != "*":
                raise S3Error(501, "NotImplemented", "If-None-Match other than *")
            if cur is not None:
                raise S3Error(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold")
        if im is not None:
            if cur is None:
                raise S3Error(404, "NoSuchKey", "If-Match on a missing object")
            if im.strip().strip('"') != cur[1]:
                raise S3Error(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold")

    def put(self, key, body):
        st = self.server.state
        import time
        with st.lock:
            if self.headers.get("If-None-Match") is not None or self.headers.get("If-Match") is not None:
                st.stats["conditional_puts"] += 1
            self.check_conditions(st.objects.get(key))
            etag = hashlib.md5(body).hexdigest()
            st.objects[key] = (body, etag, time.time())
            lose = st.lose > 0
            if lose:
                st.lose -= 1
                st.stats["faults"] += 1
        if lose:  # applied, but the answer is lost
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.send(200, b"", [("ETag", '"%s"' % etag)])

    def get(self, key, head):
        st = self.server.state
        with st.lock:
            cur = st.objects.get(key)
            cut = False
            if cur is None:
                raise S3Error(404, "NoSuchKey", key)
            im = self.headers.get("If-Match")
            if im is not None and not st.no_get_if_match and im.strip().strip('"') != cur[1]:
                raise S3Error(412, "PreconditionFailed", "If-Match")
            if im is not None and self.headers.get("Range"):
                st.stats["resumed_gets"] += 1
            if not head and (st.cut > 0 or st.cut_shrink > 0) and len(cur[0]) > 1:
                if st.cut_shrink > 0:
                    st.cut_shrink -= 1
                    short = cur[0][:max(1, len(cur[0]) // 8)]
                    st.objects[key] = (short, hashlib.md5(short).hexdigest(), cur[2])
                else:
                    st.cut -= 1
                st.stats["faults"] += 1
                cut = True
        data, etag, mtime = cur
        hdrs = [("ETag", '"%s"' % etag), ("Last-Modified", http_date(mtime)), ("Accept-Ranges", "bytes")]
        rng = self.headers.get("Range")
        status = 200
        if rng:
            spec = rng.replace("bytes=", "", 1)
            a, _, b = spec.partition("-")
            start = int(a)
            end = int(b) if b else len(data) - 1
            if start >= len(data):
                self.send_error_xml(S3Error(416, "InvalidRange", "The requested range is not satisfiable"))
                return
            end = min(end, len(data) - 1)
            hdrs.append(("Content-Range", "bytes %d-%d/%d" % (start, end, len(data))))
            data = data[start:end + 1]
            status = 206
        if not head:
            with st.lock:
                st.stats["range_bytes" if status == 206 else "get_bytes"] += len(data) // 2 if cut else len(data)
        if cut:
            self.send_response(status)
            for k, v in hdrs:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.send(status, data, hdrs, head)

    def upload_part(self, key, q, body):
        import time
        st = self.server.state
        num = int(q["partNumber"])
        with st.lock:
            st.stats["upload_parts"] += 1
            st.parts_in_flight += 1
            st.stats["parts_in_flight_max"] = max(st.stats["parts_in_flight_max"], st.parts_in_flight)
            delay = st.part_delay
        try:
            if delay:
                time.sleep(delay / 1000.0)
            with st.lock:
                if st.bad_part == num:
                    st.bad_part = 0
                    st.stats["faults"] += 1
                    raise S3Error(400, "InvalidArgument", "injected failure of part %d" % num)
                if st.fail_part == num:
                    st.fail_part = 0
                    st.stats["faults"] += 1
                    raise S3Error(503, "SlowDown", "injected")
                up = st.uploads.get(q["uploadId"])
                if up is None or up[0] != key:
                    raise S3Error(404, "NoSuchUpload", q["uploadId"])
                etag = hashlib.md5(body).hexdigest()
                up[1][num] = (body, etag)
        finally:
            with st.lock:
                st.parts_in_flight -= 1
        self.send(200, b"", [("ETag", '"%s"' % etag)])

    def complete(self, key, q, body):
        import re
        import time
        st = self.server.state
        parts = re.findall(rb"<PartNumber>(\d+)</PartNumber>\s*<ETag>([^<]*)</ETag>", body)
        with st.lock:
            up = st.uploads.get(q["uploadId"])
            if up is None or up[0] != key:
                raise S3Error(404, "NoSuchUpload", q["uploadId"])
            if not parts:
                raise S3Error(400, "MalformedXML", "no parts")
            if self.headers.get("If-None-Match") is not None or self.headers.get("If-Match") is not None:
                st.stats["conditional_puts"] += 1
                cur = st.objects.get(key)
                if (cur[1] if cur else None) != up[2]:
                    st.stats["conditional_conflicts"] += 1
                    raise S3Error(409, "ConditionalRequestConflict",
                                  "A conflicting operation occurred. If using PutObject you can retry the request. "
                                  "If using multipart upload you should initiate another CreateMultipartUpload request "
                                  "and re-upload each part.")
                self.check_conditions(cur)
            data, md5s, last = b"", b"", 0
            for num, tag in parts:
                num = int(num)
                tag = tag.decode().replace("&quot;", "").strip('"')
                if num <= last or num not in up[1] or up[1][num][1] != tag:
                    raise S3Error(400, "InvalidPart", str(num))
                last = num
                data += up[1][num][0]
                md5s += bytes.fromhex(up[1][num][1])
            etag = "%s-%d" % (hashlib.md5(md5s).hexdigest(), len(parts))
            st.objects[key] = (data, etag, time.time())
            del st.uploads[q["uploadId"]]
        xml = ("<CompleteMultipartUploadResult><Key>%s</Key><ETag>&quot;%s&quot;</ETag>"
               "</CompleteMultipartUploadResult>" % (escape(key), etag))
        self.send(200, xml.encode(), [("Content-Type", "application/xml")])

    def list_v2(self, q):
        st = self.server.state
        prefix = q.get("prefix", "")
        max_keys = min(int(q.get("max-keys", "1000")), 1000)
        after = ""
        if q.get("continuation-token"):
            after = base64.b64decode(q["continuation-token"]).decode()
        with st.lock:
            keys = sorted(k for k in st.objects if k.startswith(prefix) and k > after)
            page, truncated = keys[:max_keys], len(keys) > max_keys
            entries = [(k, st.objects[k]) for k in page]
        out = ["<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">",
               "<Name>%s</Name><Prefix>%s</Prefix><KeyCount>%d</KeyCount><MaxKeys>%d</MaxKeys>"
               % (escape(st.args.bucket), escape(prefix), len(page), max_keys),
               "<IsTruncated>%s</IsTruncated>" % ("true" if truncated else "false")]
        if truncated:
            out.append("<NextContinuationToken>%s</NextContinuationToken>"
                       % base64.b64encode(page[-1].encode()).decode())
        for k, (data, etag, mtime) in entries:
            out.append("<Contents><Key>%s</Key><LastModified>%s</LastModified><ETag>&quot;%s&quot;</ETag>"
                       "<Size>%d</Size><StorageClass>STANDARD</StorageClass></Contents>"
                       % (escape(k, {'"': "&quot;"}), iso_date(mtime), etag, len(data)))
        out.append("</ListBucketResult>")
        self.send(200, "".join(out).encode(), [("Content-Type", "application/xml")])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bucket", required=True)
    p.add_argument("--access-key", required=True)
    p.add_argument("--secret-key", required=True)
    p.add_argument("--token")
    p.add_argument("--region", default="us-east-1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    self_test()
    # racing writers connect at once: a listen backlog of 5 (the default)
    # would refuse some of them under load
    http.server.ThreadingHTTPServer.request_queue_size = 128
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    srv.daemon_threads = True
    srv.state = State(args)
    print("listening %d" % srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
