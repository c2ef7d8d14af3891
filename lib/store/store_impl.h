/* Internals of the object-store layer: the backend table, the shared
 * request machinery of the network backends (retries, deadlines, sinks),
 * and the parsers.  Not part of the public API.
 *
 * Files:
 *   store.c        dispatcher: URL parsing, key checks, public entry points
 *   store_file.c   file:// backend
 *   store_net.c    libcurl requests: one attempt, retry loop, deadlines
 *   store_s3.c     s3:// backend (SigV4 through libcurl, multipart, CAS)
 *   store_http.c   http(s):// read-only backend
 *   store_xml.c    small XML scanner and the S3 response parsers
 *   store_util.c   URI encoding, times, etags, random numbers
 */
#ifndef FERRY_STORE_IMPL_H
#define FERRY_STORE_IMPL_H

#include "common.h"
#include "ferry_store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define FERRY__DEFAULT_DEADLINE_MS 300000u
#define FERRY__MAX_DEADLINE_MS (30ull * 24 * 3600 * 1000) /* 30 days */
#define FERRY__DEFAULT_MAX_OBJECT (1ull << 30)
#define FERRY__DEFAULT_CONNECT_MS 10000u
#define FERRY__DEFAULT_STALL_MS 30000u
#define FERRY__DEFAULT_RETRY_BASE_MS 100u
#define FERRY__RETRY_CAP_MS 8000u
#define FERRY__MAX_ATTEMPTS_CAP 1000u
#define FERRY__DEFAULT_PART (64ull << 20)
#define FERRY__MAX_PARTS 10000u
#define FERRY__MAX_SINGLE_PUT (5ull << 30) /* S3's limit for one PUT */
#define FERRY__DEFAULT_LIST_PAGE 1000u
#define FERRY__DEFAULT_MAX_LIST 10000000ull
#define FERRY__FILE_HASH_MAX (1u << 20)    /* file etags: content hash up to this size */
#define FERRY__POOL 8                      /* idle curl handles kept per store */
#define FERRY__DEFAULT_UPLOAD_CONC 4u       /* parts in flight of one multipart upload */
#define FERRY__MAX_UPLOAD_CONC 64u

typedef struct ferry__backend ferry__backend;
typedef struct ferry__group ferry__group;

/* The bytes of an upload: in memory, or read with pread from a file
 * descriptor as they are sent (ferry_store_put_fd), so that no backend
 * maps or buffers a whole object that comes from a file. */
typedef struct ferry__src {
    const uint8_t *mem;   /* the bytes, or NULL: from offset off of fd on */
    int fd;
    uint64_t off;
} ferry__src;

static inline ferry__src ferry__src_mem(const void *p)
{
    ferry__src b = {(const uint8_t *)p, -1, 0};
    return b;
}
/* The same source from its byte pos on (a part of a multipart upload). */
static inline ferry__src ferry__src_at(const ferry__src *b, uint64_t pos)
{
    ferry__src r = *b;
    if (r.mem) r.mem += pos;
    else r.off += pos;
    return r;
}
/* Copies n bytes at pos of the source into buf: 0, or FERRY_ERR_IO with a
 * message naming what (a read error, or a file that ends first). */
int ferry__src_read(const ferry__src *b, uint64_t pos, void *buf, size_t n, const char *what);

/* Where a download goes: a growable buffer bounded by max, a caller's
 * fixed buffer, a caller's function (ferry_store_get_stream), or a file
 * descriptor.  "written" counts bytes stored, across
 * attempts (a resumed download appends). */
typedef struct ferry__sink {
    ferry_buf *buf;       /* growable target, or NULL */
    uint8_t *fixed;       /* fixed target of fixed_cap bytes, or NULL */
    size_t fixed_cap;
    ferry_store_write_fn fn; /* function target (bytes cannot be taken back:
                                a reset after any byte fails), or NULL */
    void *fn_ctx;
    int fd;               /* file target, or -1 */
    uint64_t max;         /* bound on written (LIMIT beyond) */
    uint64_t written;
    const char *if_none_match; /* a conditional GET's etag (NULL or "": none) */
    int unchanged;        /* set: the object still had that etag, nothing was read */
} ferry__sink;

/* Stores n more bytes: FERRY_ERR_LIMIT past max (or a fixed buffer's end),
 * FERRY_ERR_IO / NOMEM.  No message for LIMIT: the caller names the object. */
int ferry__sink_write(ferry__sink *k, const void *p, size_t n);
/* Drops everything written (a download that must start over); for a
 * function target that was handed bytes, FERRY_ERR_STORE_NET (with a
 * message): they cannot be taken back. */
int ferry__sink_reset(ferry__sink *k);

struct ferry_store {
    const ferry__backend *be;
    int kind;
    int readonly;
    char *url;                    /* normalized, for messages and ferry_store_url */
    /* resolved options */
    uint64_t deadline_ms, max_object, part_size, max_bytes_per_s, max_list;
    uint32_t connect_ms, stall_ms, max_attempts, retry_base_ms, list_page;
    unsigned upload_conc;         /* parts of a multipart upload in flight at once */
    int cas_mode;
    ferry_store_progress_fn progress;
    void *progress_user;
    char *ca_file;
    /* file:// */
    char *root;                   /* absolute directory, no trailing '/' */
    /* s3:// and http(s):// */
    char *base;                   /* http(s) base URL without trailing '/':
                                     ENDPOINT/BUCKET for s3, the URL for http */
    char *prefix;                 /* s3 key prefix with trailing '/', or "" */
    char *bucket, *region, *sigv4_param, *userpwd, *token_header;
    int unsigned_payload;
    pthread_mutex_t pool_lock;
    int pool_inited;
    void *pool[FERRY__POOL];      /* idle CURL handles */
    int npool;
};

struct ferry__backend {
    int (*put)(ferry_store *s, const char *key, const ferry__src *src, uint64_t size, char *etag);
    int (*get)(ferry_store *s, const char *key, ferry__sink *sink, ferry_store_stat *st);
    /* g: the parallel transfer this range is part of (progress, stop), or NULL */
    int (*get_range)(ferry_store *s, const char *key, uint64_t off, size_t len, void *buf, size_t *got,
                     ferry__group *g);
    int (*head)(ferry_store *s, const char *key, ferry_store_stat *st);
    int (*list)(ferry_store *s, const char *prefix, ferry_store_listing *out);
    int (*del)(ferry_store *s, const char *key);
    int (*cas)(ferry_store *s, const char *key, const char *expected, const void *data, size_t size,
               char *etag);
    int (*probe_cas)(ferry_store *s, const char *key, int *atomic);
    void (*release)(ferry_store *s);
};

extern const ferry__backend ferry__file_backend;
extern const ferry__backend ferry__s3_backend;
extern const ferry__backend ferry__http_backend;

/* Backend constructors: fill the backend fields of s (common options are
 * already resolved).  rest is the URL after the scheme's "//". */
int ferry__file_init(ferry_store *s, const char *path, int create);
int ferry__s3_init(ferry_store *s, const char *rest, const ferry_store_options *o);
int ferry__http_init(ferry_store *s, const char *url);

/* ---- store.c ---- */
/* ferry_store_get_range as one request of the parallel transfer g. */
int ferry__get_range_group(ferry_store *s, const char *key, uint64_t off, size_t len, void *buf, size_t *got,
                           ferry__group *g);
/* Checks a prefix of a listing (may be empty; a last, partial segment may
 * be anything a key segment may start with). */
int ferry__prefix_check(const char *prefix);
/* Appends one entry (key copied) to a listing; FERRY_ERR_LIMIT past max. */
int ferry__listing_add(ferry_store_listing *l, size_t *cap, uint64_t max, const char *key,
                       const ferry_store_stat *st);
/* Sorts a listing by key and fails with STORE_CORRUPT on a duplicate. */
int ferry__listing_finish(ferry_store *s, ferry_store_listing *l);
void ferry__listing_clear(ferry_store_listing *l);

/* ---- store_util.c ---- */
/* Uniform random number in [0, n) (n > 0), for jitter and names; not for
 * secrets. */
uint64_t ferry__rand_below(uint64_t n);
/* Appends s URI-encoded as SigV4 wants it: unreserved characters
 * (A-Z a-z 0-9 - _ . ~) kept, '/' kept if keep_slash, all else %XX. */
int ferry__uri_encode(ferry_buf *b, const char *s, size_t n, int keep_slash);
/* Copies an etag from a header or XML, without surrounding quotes (and
 * without a "W/" weakness mark's quotes): printable ASCII, no spaces, fits
 * FERRY_STORE_ETAG_MAX; else returns -1. */
int ferry__etag_clean(const char *in, size_t n, char out[FERRY_STORE_ETAG_MAX]);
/* "2024-05-01T10:20:30.000Z" -> seconds since the epoch; -1 if malformed. */
int64_t ferry__parse_iso8601(const char *s, size_t n);
/* Decimal u64 of exactly n digits (n 1..20, no sign, no overflow): 0 or -1. */
int ferry__parse_u64(const char *s, size_t n, uint64_t *out);
/* Whether s[0..n) is valid UTF-8 (no overlongs, no surrogates). */
int ferry__utf8_valid(const char *s, size_t n);

/* ---- store_xml.c ---- */
typedef struct ferry__s3_entry {
    char key[FERRY_STORE_KEY_MAX * 2 + 1]; /* the store prefix + key, decoded */
    size_t key_len;
    ferry_store_stat st;
} ferry__s3_entry;

typedef struct ferry__s3_page {
    int truncated;
    char next_token[4097];
} ferry__s3_page;

/* Parses one ListObjectsV2 page, calling each(ctx, entry) for every
 * <Contents>; each returns 0 or a status that stops the parse.  Fails with
 * FERRY_ERR_STORE_CORRUPT (message names the problem) on anything
 * malformed: wrong root, bad nesting, overlong fields, non-numeric size,
 * a missing Key or Size, a truncated page without a continuation token. */
int ferry__s3_parse_list(const char *xml, size_t n, ferry__s3_page *page,
                         int (*each)(void *ctx, const ferry__s3_entry *e), void *ctx);
/* Text of the first element named `name` at depth 2 under root `root`
 * (e.g. root "InitiateMultipartUploadResult", name "UploadId"), decoded into
 * out (cap bytes with the NUL).  Returns 0, FERRY_ERR_NOT_FOUND if absent
 * (or the root differs), FERRY_ERR_STORE_CORRUPT if malformed or too long. */
int ferry__xml_child_text(const char *xml, size_t n, const char *root, const char *name, char *out,
                          size_t cap);
/* Name of the root element of a document into out; 0 or STORE_CORRUPT. */
int ferry__xml_root(const char *xml, size_t n, char *out, size_t cap);

/* ---- store_net.c ---- */
/* Requests of one transfer made in parallel (the parts of a multipart
 * upload, the chunks of a parallel download): their progress is summed and
 * reported as one, the callback never runs in two threads at once, and
 * setting stop makes the requests still running end at once (their
 * results are then ignored). */
struct ferry__group {
    pthread_mutex_t mu;
    uint64_t done;                 /* bytes of all the requests, under mu */
    uint64_t total;                /* the transfer's size (downloads) */
    atomic_int stop;               /* nonzero: the transfers end */
};

/* One logical request, retried.  The caller owns every pointer. */
typedef struct ferry__req {
    const char *op;                /* "GET", "PUT part 3", ... for messages */
    const char *method;            /* HTTP method */
    const char *url;
    const char *what;              /* "s3://bucket/prefix/key" for messages */
    struct curl_slist *headers;    /* fixed request headers, or NULL */
    int sign;                      /* SigV4 with the store's keys */
    int follow;                    /* follow redirects (http backend) */
    const uint8_t *body;           /* upload payload (PUT, POST), or NULL */
    const ferry__src *src;         /* or read from here as sent (a file's bytes: a
                                      read error ends the call, not retried) */
    size_t body_len;
    int has_body;                  /* send body_len bytes (may be 0) */
    ferry__sink *sink;             /* where a 2xx body goes; NULL: kept in resp->body
                                      up to 16 MiB (XML answers) */
    int ranged;                    /* ask for [range_off, range_off + range_len) */
    uint64_t range_off, range_len;
    int resume;                    /* on retry, continue after sink->written with
                                      If-Match on the first answer's etag */
    uint64_t progress_base, progress_total; /* for multipart uploads */
    ferry__group *group;           /* parallel parts: progress summed (base unused) */
    int no_progress;               /* a small control request (multipart XML): not
                                      a transfer the progress callback hears of */
    uint64_t deadline;             /* ferry__mono_ms() value; 0 = the store's default */
} ferry__req;

typedef struct ferry__resp {
    long status;                   /* final HTTP status */
    int has_length;
    uint64_t length;               /* Content-Length */
    int has_range;
    uint64_t range_start, range_end, range_total; /* Content-Range (total 0 if '*') */
    char etag[FERRY_STORE_ETAG_MAX];
    int64_t mtime;
    ferry_buf body;                /* non-2xx body (bounded), or a 2xx body without sink */
    char err_code[64];             /* S3 <Code> of an error body, if any */
    char err_msg[256];             /* S3 <Message> */
    unsigned attempts;
    int resent;                    /* the request may have reached the server more than
                                      once (a retry, or libcurl rewound the upload) */
} ferry__resp;

/* Deadline (absolute ferry__mono_ms) of a call starting now. */
uint64_t ferry__deadline(const ferry_store *s);
/* Performs req with retries on connection errors, timeouts of one
 * attempt, 429, 5xx and S3's RequestTimeout, with exponential backoff and
 * jitter, until success, a final status, max_attempts or the deadline.
 * Returns 0 with resp->status set to the final status (any 1xx..5xx not
 * retried), or FERRY_ERR_STORE_TIMEOUT / _NET / _CANCELED / _CORRUPT /
 * FERRY_ERR_LIMIT / FERRY_ERR_IO.  resp is reset first; release it with
 * ferry__resp_release. */
int ferry__net_call(ferry_store *s, const ferry__req *req, ferry__resp *resp);
void ferry__resp_release(ferry__resp *resp);
/* Maps a final non-success status to an error with a message: 401/403 ->
 * AUTH, 404 -> NOT_FOUND, 412 -> CONFLICT, 416 -> RANGE, else HTTP. */
int ferry__net_status_error(const ferry__req *req, const ferry__resp *resp);
/* curl_global_init once per process. */
int ferry__net_global_init(void);
void ferry__net_pool_release(ferry_store *s);
/* Appends "Name: value" to a header list; NOMEM on failure. */
int ferry__hdr_add(struct curl_slist **list, const char *fmt, ...) FERRY_PRINTF(2, 3);

/* ---- shared by s3 and http ---- */
/* Requests of both backends: s3 = 1 signs (when the store has keys) and
 * does not follow redirects; s3 = 0 follows up to 5 (CDNs).  deadline is
 * absolute (ferry__mono_ms), 0 = the store's default from now. */
typedef struct ferry__target {
    const char *url;              /* full URL of the object */
    const char *what;             /* name for messages */
    struct curl_slist *headers;   /* extra headers (x-amz-content-sha256 ...) */
    int s3;
    uint64_t deadline;
    ferry__group *group;          /* get_range: a chunk of a parallel download, or NULL */
} ferry__target;
/* GET into sink, resumed across retries; fills st from the answer. */
int ferry__net_get(ferry_store *s, const ferry__target *t, ferry__sink *sink, ferry_store_stat *st);
/* GET of [off, off + len) into buf, as ferry_store_get_range. */
int ferry__net_get_range(ferry_store *s, const ferry__target *t, uint64_t off, size_t len, void *buf,
                         size_t *got);
/* HEAD: size (Content-Length required), etag, mtime. */
int ferry__net_head(ferry_store *s, const ferry__target *t, ferry_store_stat *st);

#endif
