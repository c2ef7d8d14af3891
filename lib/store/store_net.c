/* libcurl requests of the network backends: one attempt (headers parsed and
 * checked as they arrive, bodies routed to a bounded sink), and the retry
 * loop around it (backoff with jitter, per-call deadline, resumed
 * downloads).
 *
 * Why a resume: an anchor is gigabytes; a connection reset at 90% should
 * cost the last 10%, not the whole download.  A resumed attempt asks for
 * "Range: bytes=N-" with "If-Match" on the etag of the first answer, so it
 * can only ever append bytes of the same object; if the object changed
 * (412), or the server has no etags or ignores Range (200), the download
 * starts over. */

#include "store_impl.h"

#include <curl/curl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#if LIBCURL_VERSION_NUM < 0x074b00
#error "ferry's store layer needs libcurl >= 7.75 (CURLOPT_AWS_SIGV4)"
#endif

#define ERR_BODY_MAX (16u << 10)  /* kept of an error answer */
#define XML_BODY_MAX (16u << 20)  /* kept of a 2xx answer without sink (listings) */

/* ---------------------------------------------------------------------
 * Global init and the handle pool
 * ------------------------------------------------------------------- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static CURLcode g_init_rc;
static void global_init(void) { g_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

int ferry__net_global_init(void)
{
    pthread_once(&g_once, global_init);
    if (g_init_rc) return ferry__fail(FERRY_ERR_STORE_NET, "curl_global_init: %s", curl_easy_strerror(g_init_rc));
    return FERRY_OK;
}

static CURL *pool_get(ferry_store *s)
{
    CURL *c = NULL;
    pthread_mutex_lock(&s->pool_lock);
    if (s->npool) c = s->pool[--s->npool];
    pthread_mutex_unlock(&s->pool_lock);
    if (!c) c = curl_easy_init();
    return c;
}

/* Idle handles keep their connections open for the next request. */
static void pool_put(ferry_store *s, CURL *c)
{
    pthread_mutex_lock(&s->pool_lock);
    if (s->npool < FERRY__POOL) {
        s->pool[s->npool++] = c;
        c = NULL;
    }
    pthread_mutex_unlock(&s->pool_lock);
    if (c) curl_easy_cleanup(c);
}

void ferry__net_pool_release(ferry_store *s)
{
    if (!s->pool_inited) return;
    for (int i = 0; i < s->npool; i++) curl_easy_cleanup(s->pool[i]);
    s->npool = 0;
    pthread_mutex_destroy(&s->pool_lock);
    s->pool_inited = 0;
}

int ferry__hdr_add(struct curl_slist **list, const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= (int)sizeof line) return ferry__fail(FERRY_ERR_ARG, "request header too long");
    struct curl_slist *l = curl_slist_append(*list, line);
    if (!l) return ferry__fail(FERRY_ERR_NOMEM, "cannot allocate a request header");
    *list = l;
    return FERRY_OK;
}

uint64_t ferry__deadline(const ferry_store *s) { return ferry__mono_ms() + s->deadline_ms; }

void ferry__resp_release(ferry__resp *resp) { ferry__buf_release(&resp->body); }

/* ---------------------------------------------------------------------
 * One attempt
 * ------------------------------------------------------------------- */

typedef struct xfer {
    ferry_store *s;
    const ferry__req *req;
    ferry__resp *resp;
    size_t up_off;           /* upload position */
    uint64_t start_written;  /* sink->written when the attempt began */
    uint64_t sent_from;      /* position the request asked for (ranged / resumed) */
    int asked_range;         /* this attempt sent a Range header */
    int decided;             /* the 2xx body's handling is set */
    uint64_t skip, want;     /* drop `skip` bytes, then take up to `want` */
    int full;                /* took all we wanted: the rest is dropped */
    int err;                 /* status set by a callback (message set) */
    int canceled;
    int stopped;             /* ended because req->group->stop was set */
    const char *resume_etag; /* a resumed attempt: the etag of the bytes held, or "" */
    uint64_t resume_total;   /* ... and the object's size then (0: unknown) */
    int changed;             /* the resumed answer is of another object */
    uint64_t last_done;
    uint64_t group_counted;  /* bytes of this attempt added to req->group->done */
} xfer;

static int ieq_prefix(const char *line, size_t n, const char *name, const char **val, size_t *vlen)
{
    size_t k = strlen(name);
    if (n <= k || strncasecmp(line, name, k) || line[k] != ':') return 0;
    const char *v = line + k + 1;
    const char *end = line + n;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t')) end--;
    *val = v;
    *vlen = (size_t)(end - v);
    return 1;
}

static int set_err(xfer *x, int code, const char *fmt, ...) FERRY_PRINTF(3, 4);
static int set_err(xfer *x, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!x->err) {
        x->err = code;
        ferry__fail(code, "%s: %s: %s", x->req->what, x->req->op, msg);
    }
    return code;
}

/* Content-Range: "bytes A-B/T", or "bytes '*'/T" for an unsatisfied range; T may be '*' too. */
static int parse_content_range(const char *v, size_t n, ferry__resp *r)
{
    if (n < 7 || strncmp(v, "bytes ", 6)) return -1;
    v += 6;
    n -= 6;
    const char *slash = memchr(v, '/', n);
    if (!slash) return -1;
    size_t left = (size_t)(slash - v), right = n - left - 1;
    r->range_total = 0;
    if (!(right == 1 && slash[1] == '*') && ferry__parse_u64(slash + 1, right, &r->range_total)) return -1;
    if (left == 1 && v[0] == '*') {
        r->has_range = 0;
        return 0;
    }
    const char *dash = memchr(v, '-', left);
    if (!dash || ferry__parse_u64(v, (size_t)(dash - v), &r->range_start) ||
        ferry__parse_u64(dash + 1, left - (size_t)(dash - v) - 1, &r->range_end))
        return -1;
    if (r->range_end < r->range_start || (r->range_total && r->range_end >= r->range_total)) return -1;
    r->has_range = 1;
    return 0;
}

/* Sets how a 2xx body is taken, once its headers are complete. */
static void decide(xfer *x)
{
    const ferry__req *q = x->req;
    ferry__resp *r = x->resp;
    ferry__sink *k = q->sink;
    x->decided = 1;
    x->skip = 0;
    x->want = UINT64_MAX;
    if (!k) return;
    if (r->status == 206) {
        if (!x->asked_range) {
            set_err(x, FERRY_ERR_STORE_CORRUPT, "206 answer to a request without Range");
            return;
        }
        if (!r->has_range || r->range_start != x->sent_from) {
            set_err(x, FERRY_ERR_STORE_CORRUPT, "206 answer starts at %llu, asked for %llu",
                    (unsigned long long)r->range_start, (unsigned long long)x->sent_from);
            return;
        }
        /* A resumed request asks for the rest: a part that ends before
           the object does would leave it short. */
        if (!q->ranged && r->range_total && r->range_end + 1 != r->range_total) {
            set_err(x, FERRY_ERR_STORE_CORRUPT, "206 answer ends at byte %llu of %llu, asked for the rest from %llu",
                    (unsigned long long)r->range_end, (unsigned long long)r->range_total, (unsigned long long)x->sent_from);
            return;
        }
        /* A resumed answer must be of the object whose bytes are held: a
           store that ignores If-Match (s3rver) answers with the bytes of
           an object replaced meanwhile, which would splice two objects. */
        if (!q->ranged && x->resume_etag && x->resume_etag[0] &&
            ((r->etag[0] && strcmp(r->etag, x->resume_etag)) ||
             (x->resume_total && r->range_total && r->range_total != x->resume_total))) {
            x->changed = 1;
            return;
        }
        if (q->ranged) x->want = q->range_len - k->written;
        return;
    }
    /* 200 (or another 2xx): the whole object from its first byte. */
    if (q->ranged) {
        x->skip = q->range_off + k->written;
        x->want = q->range_len - k->written;
        return;
    }
    int rc;
    if (k->written && (rc = ferry__sink_reset(k))) {
        x->err = rc;
        return;
    }
    x->start_written = 0;
    if (r->has_length && r->length > k->max)
        set_err(x, FERRY_ERR_LIMIT, "object of %llu bytes exceeds the limit of %llu", (unsigned long long)r->length,
                (unsigned long long)k->max);
    else if (r->has_length && k->buf && r->length < SIZE_MAX)
        ferry__buf_reserve(k->buf, (size_t)r->length + 1); /* one allocation; on failure, growth reports it */
}

static size_t on_header(char *line, size_t size, size_t nitems, void *ud)
{
    xfer *x = ud;
    ferry__resp *r = x->resp;
    size_t n = size * nitems;
    const char *v;
    size_t vl;
    if (n >= 5 && !strncmp(line, "HTTP/", 5)) {
        /* A new answer (after 100 Continue or a redirect): forget the last. */
        const char *sp = memchr(line, ' ', n);
        uint64_t code = 0;
        if (!sp || (size_t)(line + n - sp) < 4 || ferry__parse_u64(sp + 1, 3, &code) || code < 100) {
            set_err(x, FERRY_ERR_STORE_CORRUPT, "malformed status line");
            return 0;
        }
        r->status = (long)code;
        r->has_length = r->has_range = 0;
        r->range_total = 0;
        r->etag[0] = 0;
        r->mtime = 0;
        x->decided = 0;
        return n;
    }
    if (n <= 2 && (line[0] == '\r' || line[0] == '\n')) { /* end of this answer's headers */
        if (r->status >= 200 && r->status < 300 && !x->decided) decide(x);
        return x->err || x->changed ? 0 : n;
    }
    if (ieq_prefix(line, n, "ETag", &v, &vl)) {
        if (ferry__etag_clean(v, vl, r->etag)) r->etag[0] = 0; /* unusable: treated as absent */
    } else if (ieq_prefix(line, n, "Content-Length", &v, &vl)) {
        if (ferry__parse_u64(v, vl, &r->length)) {
            set_err(x, FERRY_ERR_STORE_CORRUPT, "malformed Content-Length");
            return 0;
        }
        r->has_length = 1;
    } else if (ieq_prefix(line, n, "Content-Range", &v, &vl)) {
        if (parse_content_range(v, vl, r)) {
            set_err(x, FERRY_ERR_STORE_CORRUPT, "malformed Content-Range");
            return 0;
        }
    } else if (ieq_prefix(line, n, "Last-Modified", &v, &vl)) {
        char tmp[128];
        if (vl < sizeof tmp) {
            memcpy(tmp, v, vl);
            tmp[vl] = 0;
            time_t t = curl_getdate(tmp, NULL);
            r->mtime = t > 0 ? (int64_t)t : 0;
        }
    }
    return n;
}

static size_t on_body(char *data, size_t size, size_t nitems, void *ud)
{
    xfer *x = ud;
    ferry__resp *r = x->resp;
    size_t n = size * nitems;
    if (x->err) return 0;
    if (r->status < 200 || r->status >= 300 || !x->req->sink) {
        size_t cap = r->status >= 200 && r->status < 300 ? XML_BODY_MAX : ERR_BODY_MAX;
        if (r->body.size + n > cap) {
            if (cap == ERR_BODY_MAX) {
                /* keep the beginning of an error body, drop the rest */
                size_t keep = cap > r->body.size ? cap - r->body.size : 0;
                if (keep && ferry__buf_append(&r->body, data, keep)) return 0;
                return n;
            }
            set_err(x, FERRY_ERR_STORE_CORRUPT, "answer longer than %u bytes", XML_BODY_MAX);
            return 0;
        }
        if (ferry__buf_append(&r->body, data, n)) {
            x->err = FERRY_ERR_NOMEM;
            return 0;
        }
        return n;
    }
    if (!x->decided) decide(x);
    if (x->err || x->changed) return 0;
    size_t used = 0;
    if (x->skip) {
        size_t d = x->skip < n ? (size_t)x->skip : n;
        x->skip -= d;
        used = d;
    }
    if (used < n && !x->full) {
        size_t take = n - used;
        if ((uint64_t)take > x->want) take = (size_t)x->want;
        ferry__sink *k = x->req->sink;
        bool over = (uint64_t)take > k->max - k->written; /* else a function target's own status */
        int rc = ferry__sink_write(k, data + used, take);
        if (rc == FERRY_ERR_LIMIT && over) {
            set_err(x, rc, "object exceeds the limit of %llu bytes", (unsigned long long)x->req->sink->max);
            return 0;
        }
        if (rc) {
            x->err = rc;
            return 0;
        }
        used += take;
        if (x->want != UINT64_MAX) {
            x->want -= take;
            if (!x->want) x->full = 1;
        }
    }
    /* Returning short stops the transfer; the loop treats a full stop as success. */
    return x->full ? used : n;
}

static size_t on_read(char *buf, size_t size, size_t nitems, void *ud)
{
    xfer *x = ud;
    size_t n = size * nitems, left = x->req->body_len - x->up_off;
    if (n > left) n = left;
    if (n && x->req->src) {
        int rc = ferry__src_read(x->req->src, x->up_off, buf, n, x->req->what);
        if (rc) { /* the file, not the network: final (its message is set) */
            if (!x->err) x->err = rc;
            return CURL_READFUNC_ABORT;
        }
    } else if (n) {
        memcpy(buf, x->req->body + x->up_off, n);
    }
    x->up_off += n;
    return n;
}

static int on_seek(void *ud, curl_off_t off, int origin)
{
    xfer *x = ud;
    if (origin != SEEK_SET || off < 0 || (uint64_t)off > x->req->body_len) return CURL_SEEKFUNC_FAIL;
    if (x->up_off) x->resp->resent = 1; /* libcurl sends the body again */
    x->up_off = (size_t)off;
    return CURL_SEEKFUNC_OK;
}

/* A part of a parallel upload: its bytes go into the group's sum, which
 * is what the callback sees (under the group's lock: one call at a time). */
static int group_progress(xfer *x, uint64_t ulnow)
{
    ferry__group *g = x->req->group;
    ferry_store *s = x->s;
    int stop = 0;
    pthread_mutex_lock(&g->mu);
    g->done += ulnow - x->group_counted; /* may go back: a retried part starts at 0 */
    x->group_counted = ulnow;
    if (s->progress && g->done != x->last_done) {
        x->last_done = g->done;
        if (s->progress(s->progress_user, g->done, x->req->progress_total ? x->req->progress_total : g->total)) {
            x->canceled = 1; /* the group's owner then stops the others */
            stop = 1;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return stop;
}

/* Takes back what an upload attempt that will be retried added to its
 * group (the part is sent again from its first byte; a download keeps
 * its bytes and resumes). */
static void group_undo(xfer *x)
{
    ferry__group *g = x->req->group;
    if (!g || !x->group_counted || !x->req->has_body) return;
    pthread_mutex_lock(&g->mu);
    g->done -= x->group_counted;
    pthread_mutex_unlock(&g->mu);
    x->group_counted = 0;
}

static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow)
{
    xfer *x = ud;
    ferry_store *s = x->s;
    if (x->req->group) {
        if (atomic_load(&x->req->group->stop)) {
            x->stopped = 1;
            return 1;
        }
        return group_progress(x, (uint64_t)(x->req->has_body ? ulnow : dlnow));
    }
    if (!s->progress) return 0;
    uint64_t done, total;
    if (x->req->has_body) {
        done = x->req->progress_base + (uint64_t)ulnow;
        total = x->req->progress_total ? x->req->progress_total : (uint64_t)ultotal;
    } else if (x->req->sink) {
        done = x->start_written + (uint64_t)dlnow;
        total = dltotal ? x->start_written + (uint64_t)dltotal : 0;
    } else {
        return 0;
    }
    if (done == x->last_done) return 0;
    x->last_done = done;
    if (s->progress(s->progress_user, done, total)) {
        x->canceled = 1;
        return 1;
    }
    return 0;
}

/* Builds this attempt's header list: the request's own plus Range / If-Match. */
static int attempt_headers(xfer *x, const char *resume_etag, struct curl_slist **out)
{
    const ferry__req *q = x->req;
    struct curl_slist *h = NULL;
    int rc = FERRY_OK;
    for (struct curl_slist *p = q->headers; p && !rc; p = p->next) {
        struct curl_slist *t = curl_slist_append(h, p->data);
        if (!t) rc = ferry__fail(FERRY_ERR_NOMEM, "cannot allocate a request header");
        else h = t;
    }
    uint64_t written = q->sink ? q->sink->written : 0;
    x->asked_range = 0;
    if (!rc && q->ranged) {
        x->sent_from = q->range_off + written;
        rc = ferry__hdr_add(&h, "Range: bytes=%llu-%llu", (unsigned long long)x->sent_from,
                            (unsigned long long)(q->range_off + q->range_len - 1));
        x->asked_range = 1;
    } else if (!rc && q->resume && written) {
        x->sent_from = written;
        rc = ferry__hdr_add(&h, "Range: bytes=%llu-", (unsigned long long)written);
        x->asked_range = 1;
    }
    if (!rc && x->asked_range && written && resume_etag[0]) rc = ferry__hdr_add(&h, "If-Match: \"%s\"", resume_etag);
    else if (!rc && !written && q->sink && q->sink->if_none_match && q->sink->if_none_match[0])
        rc = ferry__hdr_add(&h, "If-None-Match: \"%s\"", q->sink->if_none_match);
    /* No "Expect: 100-continue": it costs a round trip per upload (and a
     * 1 s stall with servers that never answer 100); signed requests stay
     * valid without it (checked by tests/scripts/store_sigv4.sh). */
    if (!rc && q->has_body) rc = ferry__hdr_add(&h, "Expect:");
    if (rc) {
        curl_slist_free_all(h);
        return rc;
    }
    *out = h;
    return FERRY_OK;
}

static CURLcode attempt(ferry_store *s, CURL *c, xfer *x, struct curl_slist *hdrs, uint64_t remaining_ms,
                        char *errbuf)
{
    const ferry__req *q = x->req;
    curl_easy_reset(c);
    errbuf[0] = 0;
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_URL, q->url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    /* A request that starts over TLS is never redirected to plain http (a
     * redirect must not downgrade an https store to cleartext). */
    bool tls = !strncmp(q->url, "https://", 8);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, tls ? "https" : "http,https");
#else
    curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS, tls ? (long)CURLPROTO_HTTPS : (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(c, CURLOPT_USERAGENT, "ferry/" FERRY_VERSION_STRING);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(remaining_ms ? remaining_ms : 1));
    uint64_t cto = s->connect_ms < remaining_ms ? s->connect_ms : remaining_ms;
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)(cto ? cto : 1));
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)(s->stall_ms < 1000 ? 1 : s->stall_ms / 1000));
    if (s->max_bytes_per_s) {
        curl_easy_setopt(c, CURLOPT_MAX_SEND_SPEED_LARGE, (curl_off_t)s->max_bytes_per_s);
        curl_easy_setopt(c, CURLOPT_MAX_RECV_SPEED_LARGE, (curl_off_t)s->max_bytes_per_s);
        /* libcurl checks the cap only after up to 100 reads of one buffer
         * (16 KiB): a burst of 1.6 MB at full speed, which is a whole
         * ranged chunk.  A smaller buffer keeps the burst near 0.1 s of
         * the cap. */
        uint64_t b = s->max_bytes_per_s / 1000;
        curl_easy_setopt(c, CURLOPT_BUFFERSIZE, (long)(b < 1024 ? 1024 : b > 16384 ? 16384 : b));
    }
    if (s->ca_file) curl_easy_setopt(c, CURLOPT_CAINFO, s->ca_file);
    if (q->follow) {
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
    }
    if (q->sign && s->userpwd) {
        curl_easy_setopt(c, CURLOPT_AWS_SIGV4, s->sigv4_param);
        curl_easy_setopt(c, CURLOPT_USERPWD, s->userpwd);
    }
    if (!strcmp(q->method, "HEAD")) {
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (!strcmp(q->method, "PUT")) {
        curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)q->body_len);
    } else if (!strcmp(q->method, "POST")) {
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
    } else if (strcmp(q->method, "GET")) {
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, q->method);
    }
    if (q->has_body) {
        curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(c, CURLOPT_READDATA, x);
        curl_easy_setopt(c, CURLOPT_SEEKFUNCTION, on_seek);
        curl_easy_setopt(c, CURLOPT_SEEKDATA, x);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, x);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, (s->progress || q->group) && !q->no_progress ? 0L : 1L);
    return curl_easy_perform(c);
}

/* ---------------------------------------------------------------------
 * The retry loop
 * ------------------------------------------------------------------- */

static int retryable_status(const ferry__resp *r)
{
    if (r->status == 429 || r->status == 500 || r->status == 502 || r->status == 503 || r->status == 504) return 1;
    /* S3 answers 400 RequestTimeout when an upload stalls: worth a retry. */
    return r->status == 400 && !strcmp(r->err_code, "RequestTimeout");
}

static int final_curl_error(CURLcode cc)
{
    switch (cc) {
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
    case CURLE_NOT_BUILT_IN:
    case CURLE_TOO_MANY_REDIRECTS:
    case CURLE_BAD_FUNCTION_ARGUMENT:
    case CURLE_OUT_OF_MEMORY:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_LOGIN_DENIED:
    case CURLE_FILESIZE_EXCEEDED:
        return 1;
    default:
        return 0;
    }
}

/* Fills err_code / err_msg from an S3 error body (<Error><Code>..). */
static void parse_error_body(ferry__resp *r)
{
    r->err_code[0] = r->err_msg[0] = 0;
    if (!r->body.size) return;
    if (ferry__xml_child_text((const char *)r->body.data, r->body.size, "Error", "Code", r->err_code,
                              sizeof r->err_code))
        r->err_code[0] = 0;
    if (ferry__xml_child_text((const char *)r->body.data, r->body.size, "Error", "Message", r->err_msg,
                              sizeof r->err_msg))
        r->err_msg[0] = 0;
    ferry__clear_error(); /* a missing field is not a failure of the request */
}

/* A request of a group that another request's failure stopped: the
 * group's owner reports that failure, not this one. */
static int group_stopped(const ferry__req *q)
{
    return ferry__fail(FERRY_ERR_STORE_CANCELED, "%s: %s: stopped (another request of the transfer failed)", q->what,
                       q->op);
}

int ferry__net_call(ferry_store *s, const ferry__req *q, ferry__resp *r)
{
    memset(r, 0, sizeof *r);
    CURL *c = pool_get(s);
    if (!c) return ferry__fail(FERRY_ERR_NOMEM, "%s: curl_easy_init failed", q->what);
    uint64_t deadline = q->deadline ? q->deadline : ferry__deadline(s);
    char errbuf[CURL_ERROR_SIZE];
    char last[400] = "";
    char resume_etag[FERRY_STORE_ETAG_MAX] = "";
    uint64_t resume_total = 0; /* the size of the object resume_etag names (0: unknown) */
    int rc = FERRY_OK;
    unsigned attempt_no = 0;
    for (;;) {
        uint64_t now = ferry__mono_ms();
        if (now >= deadline) {
            rc = ferry__fail(FERRY_ERR_STORE_TIMEOUT, "%s: %s: deadline of %.1f s passed after %u attempt%s; last error: %s",
                             q->what, q->op, (double)s->deadline_ms / 1000.0, attempt_no, attempt_no == 1 ? "" : "s",
                             last[0] ? last : "none");
            break;
        }
        if (q->group && atomic_load(&q->group->stop)) {
            rc = group_stopped(q);
            break;
        }
        attempt_no++;
        r->attempts = attempt_no;
        if (attempt_no > 1) r->resent = 1;
        ferry__buf_release(&r->body);
        r->status = 0;
        r->has_length = r->has_range = 0;
        r->etag[0] = 0;
        xfer x = {.s = s, .req = q, .resp = r, .start_written = q->sink ? q->sink->written : 0, .resume_etag = resume_etag,
                  .resume_total = resume_total};
        /* Bytes of an earlier attempt are kept only if we know which object
         * they came from (etag): the next attempt then sends If-Match. */
        if (q->sink && q->sink->written && !resume_etag[0]) {
            if ((rc = ferry__sink_reset(q->sink))) break;
            x.start_written = 0;
        }
        struct curl_slist *hdrs = NULL;
        if ((rc = attempt_headers(&x, resume_etag, &hdrs))) break;
        CURLcode cc = attempt(s, c, &x, hdrs, deadline - now, errbuf);
        curl_slist_free_all(hdrs);
        if (x.canceled) {
            rc = ferry__fail(FERRY_ERR_STORE_CANCELED, "%s: %s: canceled by the progress callback", q->what, q->op);
            break;
        }
        if (x.stopped) {
            rc = group_stopped(q);
            break;
        }
        if (x.err) { /* message already set */
            rc = x.err;
            break;
        }
        if (x.changed) {
            /* The resumed answer names another etag or size: the object
               changed between attempts (If-Match ignored): start over. */
            snprintf(last, sizeof last, "object changed during the download (a resumed answer of another etag or size)");
            resume_etag[0] = 0;
            resume_total = 0;
            if ((rc = ferry__sink_reset(q->sink))) break;
            if (attempt_no < s->max_attempts) continue;
            rc = ferry__fail(FERRY_ERR_STORE_NET, "%s: %s: %s, after %u attempts", q->what, q->op, last, attempt_no);
            break;
        }
        if (cc == CURLE_WRITE_ERROR && x.full) cc = CURLE_OK;
        if (cc == CURLE_OK) {
            if (r->status < 200 || r->status >= 300) parse_error_body(r);
            if (r->status == 416 && !q->ranged && x.asked_range && r->range_total &&
                r->range_total == q->sink->written && (!resume_total || resume_total == r->range_total)) {
                /* A resumed download that had, in fact, every byte. */
                r->status = 200;
                r->has_length = 0;
                memcpy(r->etag, resume_etag, sizeof r->etag);
                rc = FERRY_OK;
                break;
            }
            if (r->status == 416 && !q->ranged && x.asked_range && resume_etag[0]) {
                /* Resumed past the end: the object changed and is shorter
                   now (a store that ignores If-Match, s3rver, answers 416
                   where S3 answers 412): start over, as below. */
                snprintf(last, sizeof last, "object shorter than the part already read (changed); starting over");
                resume_etag[0] = 0;
                if ((rc = ferry__sink_reset(q->sink))) break;
                if (attempt_no < s->max_attempts) continue;
            }
            if (r->status == 412 && x.asked_range && resume_etag[0]) {
                /* The object changed between attempts: start over. */
                snprintf(last, sizeof last, "object changed during the download; starting over");
                resume_etag[0] = 0;
                if ((rc = ferry__sink_reset(q->sink))) break;
                if (attempt_no < s->max_attempts) continue;
            }
            if (!retryable_status(r) || attempt_no >= s->max_attempts) {
                if (retryable_status(r) && attempt_no >= s->max_attempts) {
                    rc = ferry__fail(FERRY_ERR_STORE_HTTP, "%s: %s: HTTP %ld %s after %u attempts", q->what, q->op,
                                     r->status, r->err_code, attempt_no);
                    break;
                }
                rc = FERRY_OK; /* a final status: the caller interprets it */
                break;
            }
            snprintf(last, sizeof last, "HTTP %ld%s%s", r->status, r->err_code[0] ? " " : "", r->err_code);
        } else {
            snprintf(last, sizeof last, "%s%s%s", curl_easy_strerror(cc), errbuf[0] ? ": " : "", errbuf);
            size_t ll = strlen(last);
            while (ll && last[ll - 1] == '\n') last[--ll] = 0;
            if (cc == CURLE_OPERATION_TIMEDOUT && ferry__mono_ms() >= deadline) continue; /* reported above */
            if (final_curl_error(cc)) {
                rc = ferry__fail(cc == CURLE_URL_MALFORMAT || cc == CURLE_UNSUPPORTED_PROTOCOL ? FERRY_ERR_STORE_URL
                                                                                               : FERRY_ERR_STORE_NET,
                                 "%s: %s: %s", q->what, q->op, last);
                break;
            }
            if (attempt_no >= s->max_attempts) {
                rc = ferry__fail(FERRY_ERR_STORE_NET, "%s: %s: failed after %u attempts; last error: %s", q->what, q->op,
                                 attempt_no, last);
                break;
            }
        }
        group_undo(&x);
        /* Keep what a download got, to resume if we know which object it was. */
        if (q->sink && q->sink->written && r->etag[0] && !resume_etag[0] && r->status >= 200 && r->status < 300) {
            memcpy(resume_etag, r->etag, sizeof resume_etag);
            resume_total = r->status == 200 && r->has_length ? r->length : r->has_range ? r->range_total : 0;
        }
        /* Backoff: base x 2^(n-1), capped, "equal jitter" (half fixed,
         * half random) so that clients that failed together spread out. */
        uint64_t d = s->retry_base_ms;
        for (unsigned i = 1; i < attempt_no && d < FERRY__RETRY_CAP_MS; i++) d *= 2;
        if (d > FERRY__RETRY_CAP_MS) d = FERRY__RETRY_CAP_MS;
        d = d / 2 + ferry__rand_below(d / 2 + 1);
        now = ferry__mono_ms();
        if (now < deadline) ferry__sleep_ms(d < deadline - now ? d : deadline - now);
    }
    pool_put(s, c);
    return rc;
}

int ferry__net_status_error(const ferry__req *q, const ferry__resp *r)
{
    int code;
    switch (r->status) {
    case 401:
    case 403: code = FERRY_ERR_STORE_AUTH; break;
    case 404: code = !strcmp(r->err_code, "NoSuchBucket") ? FERRY_ERR_STORE_HTTP : FERRY_ERR_STORE_NOT_FOUND; break;
    case 409:
    case 412: code = FERRY_ERR_STORE_CONFLICT; break;
    case 416: code = FERRY_ERR_STORE_RANGE; break;
    default: code = FERRY_ERR_STORE_HTTP; break;
    }
    const char *msg = r->err_msg[0] ? r->err_msg
                    : code == FERRY_ERR_STORE_NOT_FOUND ? "no such object"
                    : code == FERRY_ERR_STORE_AUTH
                        ? "access refused without detail (check the keys, session token, region and clock; on AWS a "
                          "missing object reads as 403 without s3:ListBucket)"
                        : "";
    return ferry__fail(code, "%s: %s: HTTP %ld%s%s%s%s", q->what, q->op, r->status, r->err_code[0] ? " " : "",
                       r->err_code, msg[0] ? ": " : "", msg);
}

/* ---------------------------------------------------------------------
 * GET / HEAD shared by the s3 and http backends
 * ------------------------------------------------------------------- */

static void stat_from(const ferry__resp *r, uint64_t size, ferry_store_stat *st)
{
    st->size = size;
    memcpy(st->etag, r->etag, sizeof st->etag);
    st->mtime = r->mtime;
}

int ferry__net_head(ferry_store *s, const ferry__target *t, ferry_store_stat *st)
{
    ferry__req q = {.op = "HEAD", .method = "HEAD", .url = t->url, .what = t->what, .headers = t->headers,
                    .sign = t->s3, .follow = !t->s3, .deadline = t->deadline};
    ferry__resp r;
    int rc = ferry__net_call(s, &q, &r);
    if (!rc && r.status != 200) rc = ferry__net_status_error(&q, &r);
    if (!rc && !r.has_length) rc = ferry__fail(FERRY_ERR_STORE_CORRUPT, "%s: HEAD: no Content-Length", t->what);
    if (!rc) stat_from(&r, r.length, st);
    ferry__resp_release(&r);
    return rc;
}

int ferry__net_get(ferry_store *s, const ferry__target *t, ferry__sink *sink, ferry_store_stat *st)
{
    ferry__req q = {.op = "GET", .method = "GET", .url = t->url, .what = t->what, .headers = t->headers,
                    .sign = t->s3, .follow = !t->s3, .sink = sink, .resume = 1, .deadline = t->deadline};
    ferry__resp r;
    int rc = ferry__net_call(s, &q, &r);
    if (!rc && r.status == 304 && sink->if_none_match && sink->if_none_match[0] && !sink->written) {
        /* not modified: the object is the one the caller holds */
        sink->unchanged = 1;
        memset(st, 0, sizeof *st);
        snprintf(st->etag, sizeof st->etag, "%s", sink->if_none_match);
        ferry__resp_release(&r);
        return FERRY_OK;
    }
    if (!rc && r.status != 200 && r.status != 206) rc = ferry__net_status_error(&q, &r);
    if (!rc && r.has_length && r.status == 200 && sink->written != r.length)
        rc = ferry__fail(FERRY_ERR_STORE_CORRUPT, "%s: GET: short read: %llu of %llu bytes", t->what,
                         (unsigned long long)sink->written, (unsigned long long)r.length);
    if (!rc && r.status == 206 && r.has_range && r.range_total && sink->written != r.range_total) /* a resumed GET */
        rc = ferry__fail(FERRY_ERR_STORE_CORRUPT, "%s: GET: short read: %llu of %llu bytes", t->what,
                         (unsigned long long)sink->written, (unsigned long long)r.range_total);
    if (!rc) stat_from(&r, sink->written, st);
    ferry__resp_release(&r);
    return rc;
}

static int past_end(const ferry__target *t, uint64_t off, uint64_t size)
{
    return ferry__fail(FERRY_ERR_STORE_RANGE, "%s: offset %llu is past the end (%llu bytes)", t->what,
                       (unsigned long long)off, (unsigned long long)size);
}

int ferry__net_get_range(ferry_store *s, const ferry__target *t, uint64_t off, size_t len, void *buf, size_t *got)
{
    ferry_store_stat st;
    if (len == 0) { /* nothing to read: only check that the object and offset exist */
        int rc = ferry__net_head(s, t, &st);
        return !rc && off > st.size ? past_end(t, off, st.size) : rc;
    }
    ferry__sink sink = {.fixed = buf, .fixed_cap = len, .fd = -1, .max = len};
    ferry__req q = {.op = "GET range", .method = "GET", .url = t->url, .what = t->what, .headers = t->headers,
                    .sign = t->s3, .follow = !t->s3, .sink = &sink, .ranged = 1, .range_off = off,
                    .range_len = len, .resume = 1, .group = t->group, .deadline = t->deadline};
    ferry__resp r;
    int rc = ferry__net_call(s, &q, &r);
    if (!rc && r.status == 416) {
        /* Past the end, or exactly at it (an empty read). */
        ferry__resp_release(&r);
        rc = ferry__net_head(s, t, &st);
        if (!rc && off > st.size) return past_end(t, off, st.size);
        if (!rc && off < st.size)
            rc = ferry__fail(FERRY_ERR_STORE_CORRUPT, "%s: server refused the range at %llu of a %llu-byte object",
                             t->what, (unsigned long long)off, (unsigned long long)st.size);
        return rc;
    }
    if (!rc && r.status != 200 && r.status != 206) rc = ferry__net_status_error(&q, &r);
    if (!rc && r.status == 200 && r.has_length && r.length < off) rc = past_end(t, off, r.length);
    if (!rc) *got = (size_t)sink.written;
    ferry__resp_release(&r);
    return rc;
}
