/* s3:// backend: path-style requests (ENDPOINT/BUCKET/KEY) over libcurl.
 *
 * Signing.  libcurl signs (CURLOPT_AWS_SIGV4 "aws:amz:REGION:s3" with
 * CURLOPT_USERPWD "KEY:SECRET"); it signs every header we add, and it
 * takes the payload hash of the canonical request from our
 * x-amz-content-sha256 header, which S3 requires and libcurl 7.88 does not
 * add.  libcurl 7.88 does not sort the query string of the canonical
 * request, so every query here is written already in canonical form:
 * parameters sorted by name, names and values URI-encoded.  Keys in paths
 * are URI-encoded once, '/' kept (S3 does not double-encode).
 *
 * Compare-and-swap: see FERRY_STORE_CAS_* in ferry_store.h and
 * docs/STORE.md. */

#include "store_impl.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define ABORT_DEADLINE_MS 30000u

/* ---------------------------------------------------------------------
 * Request helpers
 * ------------------------------------------------------------------- */

typedef struct s3req {
    char what[FERRY_STORE_KEY_MAX * 2 + 600];
    ferry_buf url;
    struct curl_slist *hdrs;
} s3req;

static void s3req_release(s3req *r)
{
    ferry__buf_release(&r->url);
    curl_slist_free_all(r->hdrs);
    r->hdrs = NULL;
}

/* SHA-256 (hex) of n bytes of a source read from a file: 1 MiB at a time,
 * never the whole part in memory. */
static int src_sha256_hex(const ferry__src *b, uint64_t n, const char *what, char out[65])
{
    if (b->mem) return ferry__sha256_hex(b->mem, (size_t)n, out);
    size_t cap = n < (1u << 20) ? (size_t)n + 1 : (1u << 20);
    uint8_t *buf = ferry__malloc(cap), md[32];
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    int rc = buf && c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) ? FERRY_OK
                                                                 : ferry__fail(FERRY_ERR_NOMEM, "%s: SHA-256 of a part: no memory", what);
    for (uint64_t at = 0; !rc && at < n;) {
        size_t k = n - at < cap ? (size_t)(n - at) : cap;
        if (!(rc = ferry__src_read(b, at, buf, k, what)) && !EVP_DigestUpdate(c, buf, k))
            rc = ferry__fail(FERRY_ERR_NOMEM, "%s: SHA-256 of a part failed", what);
        at += k;
    }
    unsigned len = 0;
    if (!rc && (!EVP_DigestFinal_ex(c, md, &len) || len != 32)) rc = ferry__fail(FERRY_ERR_NOMEM, "%s: SHA-256 of a part failed", what);
    if (!rc) ferry__hex(out, md, 32);
    EVP_MD_CTX_free(c);
    free(buf);
    return rc;
}

/* URL of key (NULL: the bucket) with an optional canonical query, the
 * message name, and the headers every request carries. */
static int s3req_init(ferry_store *s, s3req *r, const char *key, const char *query, const ferry__src *body,
                      uint64_t body_len)
{
    memset(r, 0, sizeof *r);
    snprintf(r->what, sizeof r->what, "%s%s%s", s->url, key ? "/" : "", key ? key : "");
    int rc = ferry__buf_append(&r->url, s->base, strlen(s->base));
    if (!rc && key) {
        rc = ferry__buf_append(&r->url, "/", 1);
        if (!rc) rc = ferry__uri_encode(&r->url, s->prefix, strlen(s->prefix), 1);
        if (!rc) rc = ferry__uri_encode(&r->url, key, strlen(key), 1);
    }
    if (!rc && query) {
        rc = ferry__buf_append(&r->url, "?", 1);
        if (!rc) rc = ferry__buf_append(&r->url, query, strlen(query));
    }
    if (!rc) rc = ferry__buf_append(&r->url, "", 1);
    if (!rc && s->userpwd) {
        char sha[65];
        if (body && s->unsigned_payload) snprintf(sha, sizeof sha, "UNSIGNED-PAYLOAD");
        else if (body && body_len) rc = src_sha256_hex(body, body_len, r->what, sha);
        else snprintf(sha, sizeof sha, "%s", EMPTY_SHA256);
        if (!rc) rc = ferry__hdr_add(&r->hdrs, "x-amz-content-sha256: %s", sha);
        if (!rc && s->token_header) rc = ferry__hdr_add(&r->hdrs, "%s", s->token_header);
    }
    if (rc) s3req_release(r);
    return rc;
}

static ferry__target target(s3req *r, uint64_t deadline)
{
    ferry__target t = {.url = (const char *)r->url.data, .what = r->what, .headers = r->hdrs, .s3 = 1,
                       .deadline = deadline};
    return t;
}

/* One PUT of a whole body, with an optional condition header. */
static int put_once(ferry_store *s, const char *key, const char *query, const char *cond, const ferry__src *data,
                    size_t size, const char *op, uint64_t progress_base, uint64_t progress_total, uint64_t deadline,
                    ferry__resp *resp, s3req *rq)
{
    int rc = s3req_init(s, rq, key, query, data, size);
    if (!rc && cond) rc = ferry__hdr_add(&rq->hdrs, "%s", cond);
    if (rc) return rc;
    ferry__req q = {.op = op, .method = "PUT", .url = (const char *)rq->url.data, .what = rq->what,
                    .headers = rq->hdrs, .sign = 1, .body = data->mem, .src = data->mem ? NULL : data, .body_len = size,
                    .has_body = 1,
                    .progress_base = progress_base, .progress_total = progress_total, .deadline = deadline};
    return ferry__net_call(s, &q, resp);
}

static int need_etag(const s3req *rq, const char *op, const ferry__resp *r)
{
    if (!r->etag[0]) return ferry__fail(FERRY_ERR_STORE_CORRUPT, "%s: %s: answer has no usable ETag", rq->what, op);
    return FERRY_OK;
}

static int status_error(const s3req *rq, const char *op, const ferry__resp *r)
{
    ferry__req q = {.op = op, .what = rq->what};
    return ferry__net_status_error(&q, r);
}

/* ---------------------------------------------------------------------
 * put: one request, or a multipart upload
 * ------------------------------------------------------------------- */

static int put_single(ferry_store *s, const char *key, const ferry__src *data, size_t size, char *etag)
{
    s3req rq;
    ferry__resp r = {0};
    int rc = put_once(s, key, NULL, NULL, data, size, "PUT", 0, size, 0, &r, &rq);
    if (!rc && r.status != 200) rc = status_error(&rq, "PUT", &r);
    if (!rc) memcpy(etag, r.etag, FERRY_STORE_ETAG_MAX); /* "" if the server sent none */
    ferry__resp_release(&r);
    s3req_release(&rq);
    return rc;
}

static int xml_escape(ferry_buf *b, const char *s)
{
    int rc = FERRY_OK;
    for (; *s && !rc; s++) {
        switch (*s) {
        case '&': rc = ferry__buf_append(b, "&amp;", 5); break;
        case '<': rc = ferry__buf_append(b, "&lt;", 4); break;
        case '>': rc = ferry__buf_append(b, "&gt;", 4); break;
        default: rc = ferry__buf_append(b, s, 1); break;
        }
    }
    return rc;
}

/* A POST with a (possibly empty) XML body whose answer is XML. */
static int post_xml(ferry_store *s, const char *key, const char *query, const char *op, const ferry_buf *body,
                    uint64_t deadline, ferry__resp *r, s3req *rq)
{
    const void *data = body && body->size ? (const void *)body->data : (const void *)"";
    size_t n = body ? body->size : 0;
    ferry__src src = ferry__src_mem(data);
    int rc = s3req_init(s, rq, key, query, &src, n);
    if (!rc) rc = ferry__hdr_add(&rq->hdrs, "Content-Type: application/xml");
    if (rc) return rc;
    ferry__req q = {.op = op, .method = "POST", .url = (const char *)rq->url.data, .what = rq->what,
                    .headers = rq->hdrs, .sign = 1, .body = data, .body_len = n, .has_body = 1, .no_progress = 1,
                    .deadline = deadline};
    return ferry__net_call(s, &q, r);
}

static void abort_upload(ferry_store *s, const char *key, const char *query)
{
    s3req rq;
    ferry__resp r = {0};
    if (s3req_init(s, &rq, key, query, NULL, 0)) return;
    uint64_t dl = ferry__mono_ms() + (s->deadline_ms < ABORT_DEADLINE_MS ? s->deadline_ms : ABORT_DEADLINE_MS);
    ferry__req q = {.op = "AbortMultipartUpload", .method = "DELETE", .url = (const char *)rq.url.data,
                    .what = rq.what, .headers = rq.hdrs, .sign = 1, .deadline = dl};
    ferry__net_call(s, &q, &r); /* best effort: S3 lifecycle rules clean up what this misses */
    ferry__resp_release(&r);
    s3req_release(&rq);
}

/* The parts of one multipart upload, sent by up to s->upload_conc threads
 * (one stream rarely fills a long link; S3 takes parts in any order).  Each
 * part is an ordinary request, retried alone within the upload's deadline;
 * the first failure stops the others, and the caller aborts the upload. */
typedef struct parts {
    ferry_store *s;
    const char *key;
    const ferry__src *src;       /* the object's bytes (each part read as sent) */
    uint64_t size, part;
    size_t nparts;
    const char *idq;             /* "uploadId=..." */
    uint64_t deadline;
    char (*etags)[FERRY_STORE_ETAG_MAX];
    ferry__group group;          /* progress summed; stop on the first failure */
    size_t next;                 /* next part to send, under group.mu */
    int rc;                      /* first failure, under group.mu */
    char msg[1024];
} parts;

static int part_send(parts *P, size_t i)
{
    uint64_t off = (uint64_t)i * P->part;
    size_t n = (size_t)(P->size - off < P->part ? P->size - off : P->part);
    char op[64], q2[1300];
    snprintf(op, sizeof op, "UploadPart %zu/%zu", i + 1, P->nparts);
    snprintf(q2, sizeof q2, "partNumber=%zu&%s", i + 1, P->idq); /* sorted: p < u */
    s3req rq;
    ferry__resp r = {0};
    ferry__src ps = ferry__src_at(P->src, off);
    int rc = s3req_init(P->s, &rq, P->key, q2, &ps, n);
    if (rc) return rc;
    ferry__req q = {.op = op, .method = "PUT", .url = (const char *)rq.url.data, .what = rq.what,
                    .headers = rq.hdrs, .sign = 1, .body = ps.mem, .src = ps.mem ? NULL : &ps, .body_len = n, .has_body = 1,
                    .progress_total = P->size, .group = &P->group, .deadline = P->deadline};
    rc = ferry__net_call(P->s, &q, &r);
    if (!rc && r.status != 200) rc = status_error(&rq, op, &r);
    if (!rc) rc = need_etag(&rq, op, &r);
    if (!rc) memcpy(P->etags[i], r.etag, sizeof P->etags[i]); /* each thread its own slots */
    ferry__resp_release(&r);
    s3req_release(&rq);
    return rc;
}

static void *parts_worker(void *arg)
{
    parts *P = arg;
    for (;;) {
        pthread_mutex_lock(&P->group.mu);
        size_t i = P->rc ? P->nparts : P->next++;
        pthread_mutex_unlock(&P->group.mu);
        if (i >= P->nparts) break;
        int rc = part_send(P, i);
        if (!rc) continue;
        pthread_mutex_lock(&P->group.mu);
        if (!P->rc) { /* the first failure; later ones are its consequences */
            P->rc = rc;
            snprintf(P->msg, sizeof P->msg, "%s", ferry_last_error());
            atomic_store(&P->group.stop, 1);
        }
        pthread_mutex_unlock(&P->group.mu);
        break;
    }
    return NULL;
}

static int parts_run(parts *P)
{
    if (pthread_mutex_init(&P->group.mu, NULL)) return ferry__fail(FERRY_ERR_NOMEM, "pthread_mutex_init failed");
    atomic_init(&P->group.stop, 0);
    size_t n = P->s->upload_conc < P->nparts ? P->s->upload_conc : P->nparts;
    pthread_t t[FERRY__MAX_UPLOAD_CONC];
    size_t started = 0;
    /* the calling thread is one of the senders: nothing to start for one */
    for (; started + 1 < n; started++)
        if (pthread_create(&t[started], NULL, parts_worker, P)) break;
    parts_worker(P);
    for (size_t i = 0; i < started; i++) pthread_join(t[i], NULL);
    pthread_mutex_destroy(&P->group.mu);
    return P->rc ? ferry__fail(P->rc, "%s", P->msg) : FERRY_OK;
}

static int put_multipart(ferry_store *s, const char *key, const ferry__src *data, uint64_t size, char *etag)
{
    uint64_t part = s->part_size;
    if ((size + part - 1) / part > FERRY__MAX_PARTS) part = (size + FERRY__MAX_PARTS - 1) / FERRY__MAX_PARTS;
    /* S3 takes parts of at most 5 GiB: past 10 000 of them no part size
     * works; refused before an upload is begun or a byte read */
    if (part > FERRY__MAX_SINGLE_PUT)
        return ferry__fail(FERRY_ERR_LIMIT, "%s/%s: put of %llu bytes: more than S3's %u parts of 5 GiB", s->url, key,
                           (unsigned long long)size, FERRY__MAX_PARTS);
    size_t nparts = (size_t)((size + part - 1) / part);
    uint64_t deadline = ferry__deadline(s);
    char upload_id[1025] = "", idq[1200] = "";
    ferry_buf enc = {0}, body = {0};
    char (*etags)[FERRY_STORE_ETAG_MAX] = NULL;
    s3req rq;
    ferry__resp r = {0};

    /* 1. CreateMultipartUpload */
    int rc = post_xml(s, key, "uploads=", "CreateMultipartUpload", NULL, deadline, &r, &rq);
    if (!rc && r.status != 200) rc = status_error(&rq, "CreateMultipartUpload", &r);
    if (!rc) {
        rc = ferry__xml_child_text((const char *)r.body.data, r.body.size, "InitiateMultipartUploadResult", "UploadId",
                                   upload_id, sizeof upload_id);
        if (rc == FERRY_ERR_NOT_FOUND)
            rc = ferry__fail(FERRY_ERR_STORE_CORRUPT, "%s: CreateMultipartUpload: answer has no UploadId", rq.what);
        if (!rc && !upload_id[0])
            rc = ferry__fail(FERRY_ERR_STORE_CORRUPT, "%s: CreateMultipartUpload: empty UploadId", rq.what);
    }
    ferry__resp_release(&r);
    s3req_release(&rq);
    if (rc) return rc;
    if ((rc = ferry__uri_encode(&enc, upload_id, strlen(upload_id), 0)) || (rc = ferry__buf_append(&enc, "", 1)))
        goto done;
    snprintf(idq, sizeof idq, "uploadId=%s", (const char *)enc.data);

    /* 2. UploadPart, up to upload_conc at once, each retried alone */
    etags = ferry__calloc(nparts, sizeof *etags);
    if (!etags) {
        rc = ferry__fail(FERRY_ERR_NOMEM, "%s/%s: the etags of %zu parts: no memory", s->url, key, nparts);
        goto done;
    }
    parts P = {.s = s, .key = key, .src = data, .size = size, .part = part, .nparts = nparts, .idq = idq,
               .deadline = deadline, .etags = etags};
    if ((rc = parts_run(&P))) goto done;

    /* 3. CompleteMultipartUpload.  S3 may answer 200 with an <Error> body
     * (the work takes a while): an InternalError there is retried. */
    rc = ferry__buf_append(&body, "<CompleteMultipartUpload>", 25);
    for (size_t i = 0; i < nparts && !rc; i++) {
        char num[64];
        snprintf(num, sizeof num, "<Part><PartNumber>%zu</PartNumber><ETag>\"", i + 1);
        rc = ferry__buf_append(&body, num, strlen(num));
        if (!rc) rc = xml_escape(&body, etags[i]);
        if (!rc) rc = ferry__buf_append(&body, "\"</ETag></Part>", 15);
    }
    if (!rc) rc = ferry__buf_append(&body, "</CompleteMultipartUpload>", 26);
    for (unsigned tries = 0; !rc; tries++) {
        rc = post_xml(s, key, idq, "CompleteMultipartUpload", &body, deadline, &r, &rq);
        char root[64] = "";
        if (!rc && r.status == 200 && ferry__xml_root((const char *)r.body.data, r.body.size, root, sizeof root))
            rc = FERRY_ERR_STORE_CORRUPT;
        if (!rc && r.status == 200 && !strcmp(root, "CompleteMultipartUploadResult")) {
            char tag[FERRY_STORE_ETAG_MAX * 2];
            if (ferry__xml_child_text((const char *)r.body.data, r.body.size, "CompleteMultipartUploadResult", "ETag",
                                      tag, sizeof tag) ||
                ferry__etag_clean(tag, strlen(tag), etag))
                etag[0] = 0;
            ferry__clear_error();
        } else if (!rc && r.status == 200) {
            char code[64] = "";
            ferry__xml_child_text((const char *)r.body.data, r.body.size, "Error", "Code", code, sizeof code);
            int again = (!strcmp(code, "InternalError") || !strcmp(code, "SlowDown")) && tries < 5 &&
                        ferry__mono_ms() + 1000 < deadline;
            if (again) {
                ferry__resp_release(&r);
                s3req_release(&rq);
                ferry__sleep_ms(500u << tries > 4000 ? 4000 : 500u << tries);
                continue;
            }
            rc = ferry__fail(FERRY_ERR_STORE_HTTP, "%s: CompleteMultipartUpload: error in a 200 answer: %s", rq.what,
                             code[0] ? code : "(unparsable)");
        } else if (!rc && r.status == 404 && r.resent && !strcmp(r.err_code, "NoSuchUpload")) {
            /* An earlier attempt completed the upload but its answer was
             * lost: the object is there if it has our size. */
            ferry__resp_release(&r);
            s3req_release(&rq);
            ferry_store_stat st;
            if (!(rc = s3req_init(s, &rq, key, NULL, NULL, 0))) {
                ferry__target t = target(&rq, deadline);
                rc = ferry__net_head(s, &t, &st);
                if (!rc && st.size != size)
                    rc = ferry__fail(FERRY_ERR_STORE_HTTP, "%s: CompleteMultipartUpload: upload vanished", rq.what);
                if (!rc) memcpy(etag, st.etag, FERRY_STORE_ETAG_MAX);
            }
        } else if (!rc) {
            rc = status_error(&rq, "CompleteMultipartUpload", &r);
        }
        ferry__resp_release(&r);
        s3req_release(&rq);
        break;
    }
done:
    if (rc && upload_id[0] && enc.size) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ferry_last_error());
        abort_upload(s, key, idq);
        ferry__fail(rc, "%s", msg); /* the abort's own messages do not matter */
    }
    free(etags);
    ferry__buf_release(&enc);
    ferry__buf_release(&body);
    return rc;
}

static int s3_put(ferry_store *s, const char *key, const ferry__src *data, uint64_t size, char *etag)
{
    if (size > s->part_size) return put_multipart(s, key, data, size, etag);
    return put_single(s, key, data, (size_t)size, etag);
}

/* ---------------------------------------------------------------------
 * Reads
 * ------------------------------------------------------------------- */

static int s3_get(ferry_store *s, const char *key, ferry__sink *sink, ferry_store_stat *st)
{
    s3req rq;
    int rc = s3req_init(s, &rq, key, NULL, NULL, 0);
    if (rc) return rc;
    ferry__target t = target(&rq, 0);
    rc = ferry__net_get(s, &t, sink, st);
    s3req_release(&rq);
    return rc;
}

static int s3_get_range(ferry_store *s, const char *key, uint64_t off, size_t len, void *buf, size_t *got,
                        ferry__group *g)
{
    s3req rq;
    int rc = s3req_init(s, &rq, key, NULL, NULL, 0);
    if (rc) return rc;
    ferry__target t = target(&rq, 0);
    t.group = g;
    rc = ferry__net_get_range(s, &t, off, len, buf, got);
    s3req_release(&rq);
    return rc;
}

static int head_at(ferry_store *s, const char *key, ferry_store_stat *st, uint64_t deadline)
{
    s3req rq;
    int rc = s3req_init(s, &rq, key, NULL, NULL, 0);
    if (rc) return rc;
    ferry__target t = target(&rq, deadline);
    rc = ferry__net_head(s, &t, st);
    s3req_release(&rq);
    return rc;
}

static int s3_head(ferry_store *s, const char *key, ferry_store_stat *st) { return head_at(s, key, st, 0); }

/* ---------------------------------------------------------------------
 * Listing: ListObjectsV2, page by page
 * ------------------------------------------------------------------- */

typedef struct lister {
    ferry_store *s;
    const char *full_prefix;
    size_t fplen, plen;
    ferry_store_listing *out;
    size_t cap;
    const char *what;
} lister;

static int on_entry(void *ctx, const ferry__s3_entry *e)
{
    lister *L = ctx;
    if (e->key_len < L->fplen || memcmp(e->key, L->full_prefix, L->fplen))
        return ferry__fail(FERRY_ERR_STORE_CORRUPT, "%s: listing returned key '%.200s' outside the prefix", L->what,
                           e->key);
    const char *key = e->key + L->plen; /* relative to the store's root */
    if (ferry_store_key_check(key)) {
        ferry__clear_error();
        return FERRY_OK; /* not a valid key ("dir/" markers ...): skipped */
    }
    return ferry__listing_add(L->out, &L->cap, L->s->max_list, key, &e->st);
}

static int s3_list(ferry_store *s, const char *prefix, ferry_store_listing *out)
{
    ferry_buf full = {0}, enc = {0}, tok = {0}, query = {0};
    char last_token[sizeof ((ferry__s3_page *)0)->next_token] = "";
    uint64_t deadline = ferry__deadline(s);
    int rc = ferry__buf_append(&full, s->prefix, strlen(s->prefix));
    if (!rc) rc = ferry__buf_append(&full, prefix, strlen(prefix));
    if (!rc) rc = ferry__uri_encode(&enc, (const char *)full.data, full.size, 0);
    if (!rc) rc = ferry__buf_append(&full, "", 1);
    if (!rc) rc = ferry__buf_append(&enc, "", 1);
    lister L = {.s = s, .full_prefix = (const char *)full.data, .fplen = full.size - 1, .plen = strlen(s->prefix),
                .out = out, .what = s->url};
    for (unsigned pageno = 0; !rc; pageno++) {
        /* Canonical order: continuation-token < list-type < max-keys < prefix. */
        query.size = 0;
        char mid[96];
        snprintf(mid, sizeof mid, "list-type=2&max-keys=%u&prefix=", s->list_page);
        if (last_token[0]) {
            tok.size = 0;
            rc = ferry__uri_encode(&tok, last_token, strlen(last_token), 0);
            if (!rc) rc = ferry__buf_append(&query, "continuation-token=", 19);
            if (!rc) rc = ferry__buf_append(&query, tok.data, tok.size);
            if (!rc) rc = ferry__buf_append(&query, "&", 1);
        }
        if (!rc) rc = ferry__buf_append(&query, mid, strlen(mid));
        if (!rc) rc = ferry__buf_append(&query, enc.data, enc.size); /* with its NUL */
        if (rc) break;
        s3req rq;
        if ((rc = s3req_init(s, &rq, NULL, (const char *)query.data, NULL, 0))) break;
        snprintf(rq.what, sizeof rq.what, "%s (list '%.200s', page %u)", s->url, prefix, pageno + 1);
        L.what = rq.what;
        ferry__req q = {.op = "ListObjectsV2", .method = "GET", .url = (const char *)rq.url.data, .what = rq.what,
                        .headers = rq.hdrs, .sign = 1, .deadline = deadline};
        ferry__resp r;
        rc = ferry__net_call(s, &q, &r);
        if (!rc && r.status != 200) rc = ferry__net_status_error(&q, &r);
        ferry__s3_page page;
        if (!rc) {
            rc = ferry__s3_parse_list((const char *)r.body.data, r.body.size, &page, on_entry, &L);
            if (rc == FERRY_ERR_STORE_CORRUPT && strncmp(ferry_last_error(), s->url, strlen(s->url)))
                ferry__context(rc, "%s", rq.what);
        }
        ferry__resp_release(&r);
        s3req_release(&rq);
        if (rc || !page.truncated) break;
        /* A server that hands back the same token would loop forever. */
        if (!strcmp(page.next_token, last_token)) {
            rc = ferry__fail(FERRY_ERR_STORE_CORRUPT, "%s: listing repeats its continuation token", s->url);
            break;
        }
        memcpy(last_token, page.next_token, sizeof last_token);
    }
    ferry__buf_release(&full);
    ferry__buf_release(&enc);
    ferry__buf_release(&tok);
    ferry__buf_release(&query);
    return rc;
}

/* ---------------------------------------------------------------------
 * delete
 * ------------------------------------------------------------------- */

static int s3_del(ferry_store *s, const char *key)
{
    s3req rq;
    int rc = s3req_init(s, &rq, key, NULL, NULL, 0);
    if (rc) return rc;
    ferry__req q = {.op = "DELETE", .method = "DELETE", .url = (const char *)rq.url.data, .what = rq.what,
                    .headers = rq.hdrs, .sign = 1};
    ferry__resp r;
    rc = ferry__net_call(s, &q, &r);
    if (!rc && r.status != 204 && r.status != 200 && r.status != 404) rc = ferry__net_status_error(&q, &r);
    ferry__resp_release(&r);
    s3req_release(&rq);
    return rc;
}

/* ---------------------------------------------------------------------
 * Compare-and-swap
 * ------------------------------------------------------------------- */

/* Whether the object now under key has exactly these bytes (and its etag). */
static int holds(ferry_store *s, const char *key, const void *data, size_t size, uint64_t deadline, char *etag)
{
    s3req rq;
    if (s3req_init(s, &rq, key, NULL, NULL, 0)) return 0;
    ferry_buf buf = {0};
    ferry__sink sink = {.buf = &buf, .fd = -1, .max = size};
    ferry_store_stat st;
    ferry__target t = target(&rq, deadline);
    int same = !ferry__net_get(s, &t, &sink, &st) && buf.size == size && (!size || !memcmp(buf.data, data, size));
    if (same) memcpy(etag, st.etag, FERRY_STORE_ETAG_MAX);
    ferry__buf_release(&buf);
    s3req_release(&rq);
    return same;
}

static int s3_cas(ferry_store *s, const char *key, const char *expected, const void *data, size_t size, char *etag)
{
    uint64_t deadline = ferry__deadline(s);
    char what[FERRY_STORE_KEY_MAX + 600];
    snprintf(what, sizeof what, "%s/%s", s->url, key);

    /* 1. Fail fast (and guard stores that ignore conditions) with a HEAD. */
    ferry_store_stat cur;
    int rc = head_at(s, key, &cur, deadline);
    if (rc == FERRY_ERR_STORE_NOT_FOUND) {
        if (expected)
            return ferry__fail(FERRY_ERR_STORE_CONFLICT, "%s: cas: the object is absent, expected etag %s", what,
                               expected);
    } else if (rc) {
        return rc;
    } else if (!expected) {
        return ferry__fail(FERRY_ERR_STORE_CONFLICT, "%s: cas: the object exists (etag %s), expected none", what,
                           cur.etag);
    } else if (strcmp(cur.etag, expected)) {
        return ferry__fail(FERRY_ERR_STORE_CONFLICT, "%s: cas: current etag %s, expected %s", what, cur.etag,
                           expected);
    }

    /* 2. The conditional PUT: on a compliant store, the real guard. */
    char cond[FERRY_STORE_ETAG_MAX + 32];
    if (expected) snprintf(cond, sizeof cond, "If-Match: \"%s\"", expected);
    else snprintf(cond, sizeof cond, "If-None-Match: *");
    s3req rq;
    ferry__resp r = {0};
    ferry__src src = ferry__src_mem(data);
    rc = put_once(s, key, NULL, cond, &src, size, "PUT (cas)", 0, size, deadline, &r, &rq);
    if (!rc && r.status == 200) {
        rc = need_etag(&rq, "PUT (cas)", &r);
        if (!rc) memcpy(etag, r.etag, FERRY_STORE_ETAG_MAX);
    } else if (!rc && (r.status == 412 || r.status == 409)) {
        /* If the request went out more than once (our retry, or libcurl's
         * own resend on a reused connection that died), the 412 may answer
         * our first copy, which landed while its answer was lost: then the
         * object holds exactly our bytes, and the swap did happen. */
        if (r.resent && holds(s, key, data, size, deadline, etag)) rc = FERRY_OK;
        else
            rc = ferry__fail(FERRY_ERR_STORE_CONFLICT, "%s: cas: precondition failed (HTTP %ld%s%s): another writer won",
                             what, r.status, r.err_code[0] ? " " : "", r.err_code);
    } else if (!rc) {
        rc = status_error(&rq, "PUT (cas)", &r);
    }
    ferry__resp_release(&r);
    s3req_release(&rq);
    if (rc || s->cas_mode != FERRY_STORE_CAS_VERIFY) return rc;

    /* 3. VERIFY: is the object still the one we wrote? */
    rc = head_at(s, key, &cur, deadline);
    if (rc == FERRY_ERR_STORE_NOT_FOUND || (!rc && strcmp(cur.etag, etag)))
        return ferry__fail(FERRY_ERR_STORE_CONFLICT,
                           "%s: cas: read-back shows %s%s instead of our etag %s: a concurrent writer replaced it",
                           what, rc ? "no object" : "etag ", rc ? "" : cur.etag, etag);
    return rc;
}

/* Writes a scratch object three times: plain, create-only, wrong If-Match. */
static int s3_probe_cas(ferry_store *s, const char *key, int *atomic)
{
    uint64_t deadline = ferry__deadline(s);
    const char *conds[3] = {NULL, "If-None-Match: *", "If-Match: \"ferry-probe-no-such-etag\""};
    int refused = 0, rc = FERRY_OK;
    for (int i = 0; i < 3 && !rc; i++) {
        char body[32];
        snprintf(body, sizeof body, "ferry cas probe %d\n", i);
        s3req rq;
        ferry__resp r = {0};
        ferry__src src = ferry__src_mem(body);
        rc = put_once(s, key, NULL, conds[i], &src, strlen(body), "PUT (probe)", 0, 0, deadline, &r, &rq);
        if (!rc && i && (r.status == 412 || r.status == 409)) refused++;
        else if (!rc && r.status != 200) rc = status_error(&rq, "PUT (probe)", &r);
        ferry__resp_release(&r);
        s3req_release(&rq);
    }
    int drc = s3_del(s, key);
    if (!rc) rc = drc;
    if (!rc) *atomic = refused == 2;
    return rc;
}

static void s3_release(ferry_store *s) { ferry__net_pool_release(s); }

const ferry__backend ferry__s3_backend = {
    .put = s3_put,
    .get = s3_get,
    .get_range = s3_get_range,
    .head = s3_head,
    .list = s3_list,
    .del = s3_del,
    .cas = s3_cas,
    .probe_cas = s3_probe_cas,
    .release = s3_release,
};

/* ---------------------------------------------------------------------
 * Open: bucket, prefix, region, endpoint, credentials
 * ------------------------------------------------------------------- */

/* Whether an endpoint's host (after "http://") is this machine. */
static bool loopback_host(const char *h)
{
    static const char *const lo[] = {"127.", "localhost:", "localhost/", "[::1]"};
    for (size_t i = 0; i < sizeof lo / sizeof *lo; i++)
        if (!strncmp(h, lo[i], strlen(lo[i]))) return true;
    return !strcmp(h, "localhost");
}

/* A session token travels in a header that SigV4 does not protect from
 * being read: over plain http anyone on the path can reuse it until it
 * expires.  Said once per process on stderr (the library has no log hook);
 * loopback endpoints (test servers) are exempt.  docs/STORE.md. */
static void warn_cleartext_token(const char *url, const char *ep, size_t el)
{
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&said)) return;
    fprintf(stderr, "ferry: warning: %s: the AWS session token is sent over plain http to %.*s (no TLS): anyone on the "
                    "path can read and reuse it; use an https:// endpoint\n", url, (int)(el > 200 ? 200 : el), ep);
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static int printable(const char *v, const char *also_forbidden)
{
    for (; *v; v++)
        if ((unsigned char)*v <= 0x20 || (unsigned char)*v >= 0x7f || strchr(also_forbidden, *v)) return 0;
    return 1;
}

int ferry__s3_init(ferry_store *s, const char *rest, const ferry_store_options *o)
{
    s->be = &ferry__s3_backend;
    s->kind = FERRY_STORE_S3;
    s->unsigned_payload = o->unsigned_payload;
    if (pthread_mutex_init(&s->pool_lock, NULL)) return ferry__fail(FERRY_ERR_NOMEM, "pthread_mutex_init failed");
    s->pool_inited = 1;
    int rc = ferry__net_global_init();
    if (rc) return rc;

    /* bucket[/prefix] */
    const char *slash = strchr(rest, '/');
    size_t bl = slash ? (size_t)(slash - rest) : strlen(rest);
    if (bl < 3 || bl > 255) return ferry__fail(FERRY_ERR_STORE_URL, "s3://%s: bucket name must have 3..255 characters", rest);
    for (size_t i = 0; i < bl; i++) {
        char c = rest[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
              c == '_'))
            return ferry__fail(FERRY_ERR_STORE_URL, "s3://%s: bucket name has character '%c'", rest, c);
    }
    if (!(s->bucket = ferry__malloc(bl + 1))) return FERRY_ERR_NOMEM;
    memcpy(s->bucket, rest, bl);
    s->bucket[bl] = 0;
    const char *p = slash ? slash + 1 : "";
    size_t pl = strlen(p);
    while (pl && p[pl - 1] == '/') pl--;
    char pfx[FERRY_STORE_KEY_MAX + 2];
    if (pl > FERRY_STORE_KEY_MAX) return ferry__fail(FERRY_ERR_STORE_URL, "s3://%s: prefix too long", rest);
    memcpy(pfx, p, pl);
    pfx[pl] = 0;
    if (pl && ferry_store_key_check(pfx)) return ferry__context(FERRY_ERR_STORE_URL, "s3://%s: bad prefix", rest);
    if (pl) {
        pfx[pl] = '/';
        pfx[pl + 1] = 0;
    }
    if (!(s->prefix = ferry__strdup(pfx))) return FERRY_ERR_NOMEM;

    /* region */
    const char *region = o->region && *o->region ? o->region : env("AWS_REGION");
    if (!region) region = env("AWS_DEFAULT_REGION");
    if (!region) region = "us-east-1";
    if (strlen(region) > 64 || !printable(region, "/:\"\\"))
        return ferry__fail(FERRY_ERR_STORE_URL, "bad region '%.64s'", region);
    if (!(s->region = ferry__strdup(region))) return FERRY_ERR_NOMEM;
    char param[128];
    snprintf(param, sizeof param, "aws:amz:%s:s3", region);
    if (!(s->sigv4_param = ferry__strdup(param))) return FERRY_ERR_NOMEM;

    /* endpoint */
    const char *ep = o->endpoint && *o->endpoint ? o->endpoint : env("AWS_ENDPOINT_URL_S3");
    if (!ep) ep = env("AWS_ENDPOINT_URL");
    char defep[160];
    if (!ep) {
        snprintf(defep, sizeof defep, "https://s3.%s.amazonaws.com", region);
        ep = defep;
    }
    size_t el = strlen(ep);
    while (el && ep[el - 1] == '/') el--;
    if (el > 2048 || (strncmp(ep, "http://", 7) && strncmp(ep, "https://", 8)))
        return ferry__fail(FERRY_ERR_STORE_URL, "endpoint '%.200s' must be an http:// or https:// URL", ep);
    for (size_t i = 0; i < el; i++)
        if ((unsigned char)ep[i] <= 0x20 || (unsigned char)ep[i] >= 0x7f || ep[i] == '?' || ep[i] == '#')
            return ferry__fail(FERRY_ERR_STORE_URL, "endpoint '%.200s' has a forbidden character", ep);
    ferry_buf b = {0};
    rc = ferry__buf_append(&b, ep, el);
    if (!rc) rc = ferry__buf_append(&b, "/", 1);
    if (!rc) rc = ferry__buf_append(&b, s->bucket, bl);
    if (!rc) rc = ferry__buf_append(&b, "", 1);
    if (rc) {
        ferry__buf_release(&b);
        return rc;
    }
    s->base = (char *)b.data;

    size_t ul = bl + pl + 8;
    if (!(s->url = ferry__malloc(ul))) return FERRY_ERR_NOMEM;
    snprintf(s->url, ul, "s3://%s%s%.*s", s->bucket, pl ? "/" : "", (int)pl, p);

    /* credentials: options, else the environment; none = anonymous */
    if (o->anonymous) return FERRY_OK;
    const char *ak = o->access_key && *o->access_key ? o->access_key : NULL;
    const char *sk = o->secret_key && *o->secret_key ? o->secret_key : NULL;
    const char *tok = o->session_token && *o->session_token ? o->session_token : NULL;
    if (!ak && !sk) {
        ak = env("AWS_ACCESS_KEY_ID");
        sk = env("AWS_SECRET_ACCESS_KEY");
        if (!tok) tok = env("AWS_SESSION_TOKEN");
    }
    if (!ak && !sk) return FERRY_OK;
    if (!ak || !sk)
        return ferry__fail(FERRY_ERR_STORE_AUTH, "%s: an access key without a secret key, or the reverse", s->url);
    if (!printable(ak, ":") || !printable(sk, "") || (tok && !printable(tok, "")) || strlen(ak) > 256 ||
        strlen(sk) > 256 || (tok && strlen(tok) > 1900))
        return ferry__fail(FERRY_ERR_STORE_AUTH, "%s: credentials have forbidden characters or are too long", s->url);
    size_t n = strlen(ak) + strlen(sk) + 2;
    if (!(s->userpwd = ferry__malloc(n))) return FERRY_ERR_NOMEM;
    snprintf(s->userpwd, n, "%s:%s", ak, sk);
    if (tok) {
        n = strlen(tok) + 32;
        if (!(s->token_header = ferry__malloc(n))) return FERRY_ERR_NOMEM;
        snprintf(s->token_header, n, "x-amz-security-token: %s", tok);
        if (!strncmp(ep, "http://", 7) && !loopback_host(ep + 7)) warn_cleartext_token(s->url, ep, el);
    }
    return FERRY_OK;
}
