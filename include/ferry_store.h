/*
 * ferry_store.h — object stores: a local directory, S3 (or any S3-compatible
 * service), and read-only HTTP(S).
 *
 * Trainer and islands share nothing but an object store.  This layer gives
 * them one small interface over three backends:
 *
 *   file:///abs/dir  or a plain path   a directory on a local or shared file
 *                                      system (the embedded default);
 *   s3://BUCKET[/PREFIX]               S3 or an S3-compatible server
 *                                      (MinIO, Ceph RGW, R2, s3rver ...);
 *   http://HOST/PATH, https://...      read-only: islands pulling through a
 *                                      CDN or a static file server.
 *
 * docs/STORE.md is the long form: URLs, options, environment variables, the
 * consistency each backend gives, compare-and-swap, retries and deadlines.
 *
 * Conventions (those of ferry.h): every function returns 0 (FERRY_OK) or a
 * FERRY_ERR_* code; ferry_last_error() names the store, key and operation
 * ("s3://b/p/latest: PUT: HTTP 403 SignatureDoesNotMatch: ...").  Handles are
 * opaque; *_free accepts NULL.  Every byte that comes back from a server (a
 * status, a header, a listing) is validated: a hostile or broken server
 * yields FERRY_ERR_STORE_CORRUPT / _HTTP, never a crash or an unbounded
 * allocation.
 *
 * Keys.  An object is named by a key relative to the store's root: UTF-8,
 * 1..FERRY_STORE_KEY_MAX bytes, segments separated by '/'.  Rejected with
 * FERRY_ERR_STORE_KEY before any I/O: an empty key, a leading or trailing
 * '/', an empty segment ("a//b"), a "." or ".." segment, a segment longer
 * than 255 bytes, control characters (0x00..0x1F, 0x7F), '\\', invalid
 * UTF-8, and segments starting with ".ferry-" (reserved for the file
 * backend's temporary and lock files).  So no key can name anything outside
 * the root, on any backend.
 *
 * Threads.  A ferry_store may be used by several threads at once; each call
 * is independent (the S3 and HTTP backends keep a small pool of connections).
 *
 * Deadlines.  Every call has its own deadline (options.deadline_ms, default
 * 300 s) that covers all its retries.  When it passes, the call fails with
 * FERRY_ERR_STORE_TIMEOUT and a message naming the operation, the number of
 * attempts and the last error.  No network call can hang forever.  On the
 * file backend the deadline bounds the wait for the CAS lock; local reads
 * and writes themselves are not interruptible.
 */
#ifndef FERRY_STORE_H
#define FERRY_STORE_H

#include "ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Errors 60..79 (FERRY_ERR_STORE_*): listed, with their
 * messages and meanings, in ferry_errors.h (included through ferry.h).
 * ====================================================================== */

#define FERRY_STORE_KEY_MAX 1024   /* bytes, as S3's limit */
#define FERRY_STORE_ETAG_MAX 128   /* bytes of an etag, including the NUL */

/* Backend kinds (ferry_store_kind). */
enum { FERRY_STORE_FILE = 1, FERRY_STORE_S3 = 2, FERRY_STORE_HTTP = 3 };

/* How ferry_store_cas guards the swap on S3 (ignored by the other backends). */
enum {
    /* Default.  HEAD first (fail fast with CONFLICT without uploading), then a
     * conditional PUT (If-None-Match: * / If-Match: "etag"); the server's 412
     * is the real guard.  Atomic on stores that honour conditional writes
     * (AWS S3 since 2024, MinIO, Ceph RGW).  On stores that ignore them
     * (s3rver 3.7.1) a stale writer is still refused, but two writers racing
     * between HEAD and PUT can both succeed: not atomic. */
    FERRY_STORE_CAS_CONDITIONAL = 0,
    /* As CONDITIONAL, plus a read-back after the PUT: if the object no longer
     * carries the etag just written, report CONFLICT.  Narrows the race on
     * stores that ignore conditional headers (a writer that overwrote us
     * before the read-back is detected); still not atomic there.  On a
     * compliant store a legitimate successor landing in that instant turns
     * our success into CONFLICT (the safe direction: the caller re-reads). */
    FERRY_STORE_CAS_VERIFY = 1,
};

/* Progress of a long transfer: bytes done out of total (total is 0 when not
 * yet known).  "done" may go back after a retry restarts a part.  Return 0
 * to go on, nonzero to stop: the call then fails with
 * FERRY_ERR_STORE_CANCELED (a multipart upload is aborted). */
typedef int (*ferry_store_progress_fn)(void *user, uint64_t done, uint64_t total);

/* Options.  Zero-initialize ("= {0}") and set what you need: every zero
 * field means "the default", and NULL options mean all defaults.  Strings
 * are copied by ferry_store_open. */
typedef struct ferry_store_options {
    /* --- every backend --- */
    uint64_t deadline_ms;        /* per call, all retries included; 0 = 300000;
                                    at most 30 days */
    uint64_t max_object_size;    /* bound on ferry_store_get; 0 = 1 GiB; larger
                                    objects fail with FERRY_ERR_LIMIT */
    ferry_store_progress_fn progress; /* optional; called on long transfers */
    void *progress_user;
    int create;                  /* file://: create the root directory (mkdir -p)
                                    if missing; else FERRY_ERR_STORE_NOT_FOUND */

    /* --- network backends (s3://, http://, https://) --- */
    uint32_t connect_timeout_ms; /* per connection attempt; 0 = 10000 */
    uint32_t stall_timeout_ms;   /* abort (and retry) an attempt whose transfer
                                    moved no byte for this long; 0 = 30000 */
    uint32_t max_attempts;       /* attempts per request; 0 = until the deadline
                                    (hard cap 1000) */
    uint32_t retry_base_ms;      /* first backoff; doubles per retry with jitter,
                                    capped at 8 s; 0 = 100 */
    uint64_t max_bytes_per_s;    /* cap on each transfer's speed; 0 = none */
    const char *ca_file;         /* PEM bundle for https; NULL = system default */

    /* --- s3:// --- */
    const char *endpoint;        /* "http://127.0.0.1:4568"; NULL = $AWS_ENDPOINT_URL_S3,
                                    $AWS_ENDPOINT_URL, else https://s3.REGION.amazonaws.com.
                                    Requests are path-style: ENDPOINT/BUCKET/KEY */
    const char *region;          /* NULL = $AWS_REGION, $AWS_DEFAULT_REGION, us-east-1 */
    const char *access_key;      /* NULL = $AWS_ACCESS_KEY_ID */
    const char *secret_key;      /* NULL = $AWS_SECRET_ACCESS_KEY */
    const char *session_token;   /* NULL = $AWS_SESSION_TOKEN (only with env keys) */
    int anonymous;               /* send unsigned requests even if keys are set */
    int unsigned_payload;        /* sign "UNSIGNED-PAYLOAD" instead of hashing the
                                    body (saves a SHA-256 pass; use with https) */
    uint64_t part_size;          /* uploads larger than this are multipart, in
                                    parts of this size; 0 = 64 MiB.  S3 rejects
                                    parts under 5 MiB (except the last) at
                                    completion: smaller values are for test
                                    servers.  Raised automatically so that no
                                    upload needs more than 10000 parts. */
    int cas_mode;                /* FERRY_STORE_CAS_* (default CONDITIONAL) */
    uint32_t list_page_size;     /* keys per ListObjectsV2 page, 1..1000; 0 = 1000 */
    uint64_t max_list_entries;   /* bound on one listing; 0 = 10000000 */
    unsigned upload_concurrency; /* parts of one multipart upload sent at once,
                                    1..64; 0 = 4.  Each part is its own request,
                                    retried alone; max_bytes_per_s caps each of
                                    them (so an upload may reach concurrency x
                                    the cap); the first part that fails for good
                                    stops the others and the upload is aborted
                                    (no part of it ever becomes visible).
                                    The progress callback sees the sum of the
                                    parts, from one thread at a time. */
} ferry_store_options;

typedef struct ferry_store ferry_store;

/* What a store knows of one object. */
typedef struct ferry_store_stat {
    uint64_t size;                      /* bytes */
    char etag[FERRY_STORE_ETAG_MAX];    /* opaque version tag, printable ASCII
                                           without quotes; "" if the server
                                           gave none (plain HTTP servers) */
    int64_t mtime;                      /* last modification, seconds since
                                           the epoch; 0 if unknown */
} ferry_store_stat;

/* Opens a store.  url: "file:///abs/dir", a plain path (absolute or
 * relative to the working directory), "s3://BUCKET[/PREFIX]",
 * "http[s]://HOST[:PORT][/PATH]".  No network traffic happens here: a wrong
 * endpoint or credentials show up at the first call.
 * Returns FERRY_ERR_STORE_URL for a malformed or unknown URL, bucket, prefix
 * or endpoint; FERRY_ERR_STORE_NOT_FOUND if a file root is missing and
 * opts->create is 0 (or FERRY_ERR_IO if it is not a directory);
 * FERRY_ERR_STORE_AUTH if only one of access and secret key is given. */
FERRY_API int ferry_store_open(const char *url, const ferry_store_options *opts, ferry_store **out);
FERRY_API void ferry_store_free(ferry_store *s);

/* FERRY_STORE_FILE, _S3 or _HTTP. */
FERRY_API int ferry_store_kind(const ferry_store *s);
/* Normalized URL of the root ("file:///abs/dir", "s3://bucket/prefix"). */
FERRY_API const char *ferry_store_url(const ferry_store *s);

/* Checks a key against the rules above: 0 or FERRY_ERR_STORE_KEY. */
FERRY_API int ferry_store_key_check(const char *key);

/* Writes an object atomically: readers see the old object or the whole new
 * one, never a part (on the file backend and on S3; s3rver writes in
 * place, see docs/STORE.md).  Replaces any object under key.  etag_out (may
 * be NULL) receives the new object's etag ("" if the server sent none).
 * file: temporary file in the key's directory, fsync, rename, fsync of the
 * directory; missing directories are created.  s3: one PUT up to
 * part_size, else a multipart upload with upload_concurrency parts in
 * flight (aborted on failure).
 * Returns FERRY_ERR_STORE_KEY, _READONLY, _AUTH, _TIMEOUT, _HTTP, _NET,
 * _CANCELED, _CORRUPT (a malformed answer), FERRY_ERR_IO (file) or
 * FERRY_ERR_NOMEM.  Every call below can also fail with the network errors
 * (_AUTH, _TIMEOUT, _HTTP, _NET, _CORRUPT) where it talks to a server. */
FERRY_API int ferry_store_put(ferry_store *s, const char *key, const void *data, size_t size,
                              char etag_out[FERRY_STORE_ETAG_MAX]);

/* Writes bytes [offset, offset + size) of an open file as the object, as
 * ferry_store_put does (atomic; a failure leaves no object and no part of
 * one: the file backend's temporary file is removed, a multipart upload is
 * aborted), reading them with pread as they are sent, so that the object
 * is never mapped or held whole in memory: file: copied CHUNK (8 MiB) at a
 * time into the temporary file, then renamed; s3: one streamed PUT up to
 * part_size, else a multipart upload whose parts (upload_concurrency at
 * once) are each read from fd when sent (and read once more before, for
 * the SigV4 payload hash, unless unsigned_payload); http(s): read-only,
 * FERRY_ERR_STORE_READONLY.  fd's file position is not used or moved.  The
 * bytes must not change during the call (a retried part is read again).
 * A read error or a file that ends before offset + size fails the call
 * with FERRY_ERR_IO (not retried).  FERRY_ERR_ARG for a negative fd or a
 * range past 2^63; on s3, FERRY_ERR_LIMIT before any request for a size
 * that needs more than 10 000 parts of 5 GiB (below it, part_size is
 * raised so that 10 000 parts suffice). */
FERRY_API int ferry_store_put_fd(ferry_store *s, const char *key, int fd, uint64_t offset, uint64_t size,
                                 char etag_out[FERRY_STORE_ETAG_MAX]);

/* Writes the contents of a local file as the object (ferry_store_put_fd
 * over the whole file). */
FERRY_API int ferry_store_put_file(ferry_store *s, const char *key, const char *path,
                                   char etag_out[FERRY_STORE_ETAG_MAX]);

/* Reads a whole object into a new buffer (*data, *size), released with
 * ferry_free(); the buffer has one extra NUL byte after the data, so text
 * objects can be used as strings.  st (may be NULL) receives size, etag and
 * mtime of the object read.  Objects larger than options.max_object_size
 * fail with FERRY_ERR_LIMIT before any byte is transferred (when the size
 * is announced) or as soon as the bound is passed.
 * Returns FERRY_ERR_STORE_NOT_FOUND if absent; FERRY_ERR_STORE_CORRUPT if
 * fewer bytes arrive than announced. */
FERRY_API int ferry_store_get(ferry_store *s, const char *key, void **data, size_t *size,
                              ferry_store_stat *st);

/* As ferry_store_get, bounded by max bytes for this call (the smaller of
 * max and options.max_object_size; max 0 = options.max_object_size alone).
 * For objects whose size is known in advance (a manifest declares it): an
 * object larger than that fails with FERRY_ERR_LIMIT before any byte is
 * transferred when the size is announced (file://, a Content-Length), else
 * as soon as the bound is passed; it is never retried. */
FERRY_API int ferry_store_get_max(ferry_store *s, const char *key, uint64_t max, void **data,
                                  size_t *size, ferry_store_stat *st);

/* As ferry_store_get_max for a poller that holds the object as it was
 * under etag if_none_match (NULL or "": an unconditional GET): when the
 * object still has that etag, FERRY_OK with *data NULL, *size 0,
 * *unchanged 1 and st->etag that etag (st's size and mtime 0).  HTTP(S) and
 * S3 send If-None-Match and take the server's 304 Not Modified (a HEAD
 * poll then costs no body on the link); file:// reads the object and
 * compares its etag.  A server that ignores the condition answers with the
 * object, compared the same way. */
FERRY_API int ferry_store_get_if_changed(ferry_store *s, const char *key, const char *if_none_match, uint64_t max,
                                         void **data, size_t *size, int *unchanged, ferry_store_stat *st);

/* Hands an object's bytes to fn(ctx, bytes, n) as they arrive, in order,
 * in pieces of any size (the network backends: as libcurl receives them;
 * file://: 8 MiB reads), from the calling thread: for a consumer that works
 * while the transfer goes on (ferry_apply_stream_feed).  Bounded as
 * ferry_store_get_max (max, and options.max_object_size): a larger object
 * fails with FERRY_ERR_LIMIT before any byte is handed on when its size is
 * announced, else as soon as the bound is passed.  fn returns 0 to go on;
 * any other status stops the transfer at once and is returned (with the
 * message fn left).  A network failure after some bytes were handed on is
 * retried from the next byte (If-Match on the object's etag, as every GET
 * resumes); where it cannot resume (no etag, the object changed, a server
 * that ignores Range) the call fails with FERRY_ERR_STORE_NET, since bytes
 * handed on cannot be taken back.  Fewer bytes than announced:
 * FERRY_ERR_STORE_CORRUPT.  st (may be NULL): size (bytes handed on), etag
 * and mtime. */
typedef int (*ferry_store_write_fn)(void *ctx, const void *data, size_t n);
FERRY_API int ferry_store_get_stream(ferry_store *s, const char *key, uint64_t max, ferry_store_write_fn fn,
                                     void *ctx, ferry_store_stat *st);

/* Streams an object into a local file, atomically (a new temporary file
 * beside path, opened with O_EXCL | O_NOFOLLOW, fsync, rename, fsync of the
 * directory): on failure nothing is left at path.  No size bound; a retry
 * resumes where the previous attempt stopped if the object is unchanged
 * (same etag), else starts over. */
FERRY_API int ferry_store_get_file(ferry_store *s, const char *key, const char *path,
                                   ferry_store_stat *st);
/* As ferry_store_get_file, bounded by max bytes (0 = no bound): the
 * download stops with FERRY_ERR_LIMIT as ferry_store_get_max does, and
 * nothing is left at path. */
FERRY_API int ferry_store_get_file_max(ferry_store *s, const char *key, const char *path, uint64_t max,
                                       ferry_store_stat *st);

/* Reads up to len bytes from offset into buf; *got receives the count,
 * which is less than len only at the end of the object (offset == size
 * gives 0 bytes).  Works against HTTP servers that ignore Range (the
 * unwanted bytes are skipped).
 * Returns FERRY_ERR_STORE_RANGE if offset > size; FERRY_ERR_STORE_NOT_FOUND
 * if absent. */
FERRY_API int ferry_store_get_range(ferry_store *s, const char *key, uint64_t offset, size_t len,
                                    void *buf, size_t *got);

/* Size, etag and mtime of an object, without its data.
 * Returns FERRY_ERR_STORE_NOT_FOUND if absent. */
FERRY_API int ferry_store_head(ferry_store *s, const char *key, ferry_store_stat *st);

/* One entry of a listing. */
typedef struct ferry_store_entry {
    const char *key;             /* relative to the store root; owned by the listing */
    ferry_store_stat stat;       /* as ferry_store_head would give it */
} ferry_store_entry;

typedef struct ferry_store_listing {
    size_t count;
    ferry_store_entry *entries;  /* sorted by key, bytewise */
} ferry_store_listing;

/* Lists the objects whose keys start with prefix ("" = all; a plain string
 * prefix, not a directory: "v1" matches "v1/a" and "v10").  S3 listings are
 * fetched page by page (ListObjectsV2 with continuation tokens); each page
 * is checked (well-formed XML, numeric sizes, keys under the prefix, no key
 * twice, no continuation token repeated).  Objects whose names are not valid keys (for instance
 * "folder/" markers made by consoles) are skipped; the file backend skips
 * its own temporary and lock files and does not follow symbolic links.
 * *out is released with ferry_store_listing_free.
 * Returns FERRY_ERR_STORE_KEY for a prefix with control characters, '\\',
 * a leading '/' or a "."/".." segment; FERRY_ERR_UNSUPPORTED on http(s)://;
 * FERRY_ERR_LIMIT past options.max_list_entries; FERRY_ERR_STORE_CORRUPT for
 * a malformed listing. */
FERRY_API int ferry_store_list(ferry_store *s, const char *prefix, ferry_store_listing **out);
FERRY_API void ferry_store_listing_free(ferry_store_listing *l);

/* Deletes an object.  Deleting an absent key succeeds (deletes are
 * idempotent, so they can be retried).  The file backend leaves the
 * (possibly empty) directories in place. */
FERRY_API int ferry_store_delete(ferry_store *s, const char *key);

/* Compare-and-swap of a (small) pointer object: writes data under key only
 * if the object currently there is the one the caller read — etag equal to
 * expected_etag — or, with expected_etag NULL, if there is none.  Otherwise
 * returns FERRY_ERR_STORE_CONFLICT and writes nothing.  new_etag (may be
 * NULL) receives the etag of the object written.  size must not exceed
 * part_size (one request).
 * file: under an flock(2) on <root>/.ferry-cas.lock, which the kernel
 *   releases when the holder dies, so a crashed writer cannot leave it stuck;
 *   waiting for the lock is bounded by the deadline (FERRY_ERR_STORE_TIMEOUT).
 *   Atomic against every other CAS on the same root (also across processes
 *   and, with working flock, across NFS clients); a plain put to the same key
 *   does not take the lock.
 * s3: see FERRY_STORE_CAS_* for the guarantees.  A conditional PUT that
 *   was sent more than once (a retry after a lost answer) and then meets
 *   412 is checked by reading the object back: if it holds exactly data,
 *   the first copy landed and the call succeeds.  (Byte-identical data
 *   from another writer would pass this check too: make pointer contents
 *   unique per writer, e.g. with a writer id, if that matters.)
 * http(s): FERRY_ERR_STORE_READONLY. */
FERRY_API int ferry_store_cas(ferry_store *s, const char *key, const char *expected_etag,
                              const void *data, size_t size, char new_etag[FERRY_STORE_ETAG_MAX]);

/* Finds out whether the store enforces conditional writes, using a scratch
 * object under probe_key (written, then deleted): *atomic = 1 if a second
 * create-only PUT and a PUT with a wrong If-Match are both refused (CAS is
 * atomic), 0 if they are not (s3rver 3.7.1: see docs/STORE.md).  The file
 * backend always answers 1 without touching probe_key; http(s) returns
 * FERRY_ERR_STORE_READONLY. */
FERRY_API int ferry_store_probe_cas(ferry_store *s, const char *probe_key, int *atomic);


/* ======================================================================
 * Downloads that fill long links (lib/store/store_parallel.c).
 * ====================================================================== */
typedef struct ferry_store_transfer_options {
    unsigned concurrency;   /* parallel ranged GETs, 1..64; 0 = 4 */
    uint64_t chunk_size;    /* bytes per GET, 4 KiB..1 GiB; 0 = 8 MiB */
    int resume;             /* keep PATH.part and PATH.part.state when the call
                               fails, and continue from them when called again
                               for the same object (same size and etag) */
    uint64_t max_size;      /* 0 = no bound; else a larger object fails with
                               FERRY_ERR_LIMIT before any byte of it is
                               fetched, as ferry_store_get_file_max */
} ferry_store_transfer_options;

/* As ferry_store_get_file, but an object larger than one chunk is fetched
 * as up to `concurrency` parallel ranged GETs written at their offsets into
 * PATH.part (one stream over a long link rarely fills it); with resume, a
 * download interrupted by a failure or a killed process continues where it
 * stopped.  The object's etag is read before and after: an object that
 * changed meanwhile is discarded (FERRY_ERR_STORE_CONFLICT), and one
 * without an etag goes through ferry_store_get_file.  The store's deadline
 * applies to each request; rate caps (max_bytes_per_s) to each stream.
 * Nothing is left at PATH but the complete object.  PATH.part is locked
 * (flock) while written: a second call for the same PATH at the same time,
 * in any process, fails with FERRY_ERR_STORE_CONFLICT and touches nothing.
 * opts may be NULL. */
FERRY_API int ferry_store_get_file_parallel(ferry_store *s, const char *key, const char *path,
                                            const ferry_store_transfer_options *opts, ferry_store_stat *st);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_STORE_H */
