/* Dispatcher of the object-store layer: URL parsing, option defaults, key
 * validation, and the public entry points, which check their arguments and
 * call the backend.  Keys are checked here, once, before any backend sees
 * them: a backend may rely on every key being safe to append to its root. */

#include "store_impl.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------------
 * Keys and prefixes
 * ------------------------------------------------------------------- */

#define SEGMENT_MAX 255
#define RESERVED ".ferry-"

/* Checks one complete segment s[0..n) of a key or prefix. */
static int segment_check(const char *what, const char *s, size_t n)
{
    if (n == 0) return ferry__fail(FERRY_ERR_STORE_KEY, "%s: empty path segment", what);
    if (n > SEGMENT_MAX)
        return ferry__fail(FERRY_ERR_STORE_KEY, "%s: segment of %zu bytes (limit %d)", what, n, SEGMENT_MAX);
    if ((n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
        return ferry__fail(FERRY_ERR_STORE_KEY, "%s: '.' or '..' segment", what);
    size_t rl = strlen(RESERVED);
    if (n >= rl && !memcmp(s, RESERVED, rl))
        return ferry__fail(FERRY_ERR_STORE_KEY, "%s: segments starting with '" RESERVED "' are reserved", what);
    return FERRY_OK;
}

static int path_check(const char *what, const char *k, int is_prefix)
{
    size_t n = strnlen(k, FERRY_STORE_KEY_MAX + 1);
    if (n > FERRY_STORE_KEY_MAX)
        return ferry__fail(FERRY_ERR_STORE_KEY, "%s: longer than %d bytes", what, FERRY_STORE_KEY_MAX);
    if (n == 0) return is_prefix ? FERRY_OK : ferry__fail(FERRY_ERR_STORE_KEY, "empty key");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)k[i];
        if (c < 0x20 || c == 0x7f)
            return ferry__fail(FERRY_ERR_STORE_KEY, "%s: control character 0x%02x at byte %zu", what, c, i);
        if (c == '\\') return ferry__fail(FERRY_ERR_STORE_KEY, "%s: backslash at byte %zu", what, i);
    }
    if (!ferry__utf8_valid(k, n)) return ferry__fail(FERRY_ERR_STORE_KEY, "%s: not valid UTF-8", what);
    if (k[0] == '/') return ferry__fail(FERRY_ERR_STORE_KEY, "%s: leading '/'", what);
    if (!is_prefix && k[n - 1] == '/') return ferry__fail(FERRY_ERR_STORE_KEY, "%s: trailing '/'", what);
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && k[i] != '/') continue;
        if (i == n && is_prefix) {
            /* The last segment of a prefix is partial ("." may begin
             * ".x"): only its length matters; it is never used as a path. */
            if (i - start > SEGMENT_MAX)
                return ferry__fail(FERRY_ERR_STORE_KEY, "%s: segment of %zu bytes (limit %d)", what, i - start,
                                   SEGMENT_MAX);
            break;
        }
        int rc = segment_check(what, k + start, i - start);
        if (rc) return rc;
        start = i + 1;
    }
    return FERRY_OK;
}

int ferry_store_key_check(const char *key)
{
    if (!key) return ferry__fail(FERRY_ERR_STORE_KEY, "NULL key");
    char what[80];
    snprintf(what, sizeof what, "key '%.60s%s'", key, strnlen(key, 61) > 60 ? "..." : "");
    return path_check(what, key, 0);
}

int ferry__prefix_check(const char *prefix)
{
    char what[80];
    snprintf(what, sizeof what, "prefix '%.60s%s'", prefix, strnlen(prefix, 61) > 60 ? "..." : "");
    return path_check(what, prefix, 1);
}

/* ---------------------------------------------------------------------
 * Listings
 * ------------------------------------------------------------------- */

int ferry__listing_add(ferry_store_listing *l, size_t *cap, uint64_t max, const char *key,
                       const ferry_store_stat *st)
{
    if (l->count >= max)
        return ferry__fail(FERRY_ERR_LIMIT, "listing exceeds %llu entries (max_list_entries)",
                           (unsigned long long)max);
    if (ferry__grow((void **)&l->entries, cap, l->count + 1, sizeof *l->entries)) return FERRY_ERR_NOMEM;
    char *k = ferry__strdup(key);
    if (!k) return FERRY_ERR_NOMEM;
    l->entries[l->count].key = k;
    l->entries[l->count].stat = *st;
    l->count++;
    return FERRY_OK;
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const ferry_store_entry *)a)->key, ((const ferry_store_entry *)b)->key);
}

int ferry__listing_finish(ferry_store *s, ferry_store_listing *l)
{
    if (l->count > 1) qsort(l->entries, l->count, sizeof *l->entries, entry_cmp);
    for (size_t i = 1; i < l->count; i++)
        if (!strcmp(l->entries[i - 1].key, l->entries[i].key))
            return ferry__fail(FERRY_ERR_STORE_CORRUPT, "%s: listing names key '%s' twice", s->url,
                               l->entries[i].key);
    return FERRY_OK;
}

void ferry__listing_clear(ferry_store_listing *l)
{
    for (size_t i = 0; i < l->count; i++) free((char *)l->entries[i].key);
    free(l->entries);
    l->entries = NULL;
    l->count = 0;
}

void ferry_store_listing_free(ferry_store_listing *l)
{
    if (!l) return;
    ferry__listing_clear(l);
    free(l);
}

/* ---------------------------------------------------------------------
 * Open / free
 * ------------------------------------------------------------------- */

static int starts(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

/* Whether a path without "://" reads as a URL with its slashes lost
 * ("s3:/bkt", "http:/x", "file:/x", "s3:bkt"): a scheme-like first word
 * (a letter, then letters, digits, '+', '-', '.') and a ':' followed by a
 * '/' or after one of our schemes.  Taken as a plain path it would become
 * a local directory "./s3:/bkt" and publish there without a word; a real
 * directory of that name is still reachable as "./s3:/bkt". */
static int scheme_like(const char *url)
{
    const char *p = url;
    if (!isalpha((unsigned char)*p)) return 0;
    while (isalnum((unsigned char)*p) || *p == '+' || *p == '-' || *p == '.') p++;
    if (*p != ':') return 0;
    size_t n = (size_t)(p - url);
    static const char *const ours[] = {"file", "s3", "http", "https"};
    for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++)
        if (n == strlen(ours[i]) && !strncasecmp(url, ours[i], n)) return 1;
    return p[1] == '/';
}

int ferry_store_open(const char *url, const ferry_store_options *opts, ferry_store **out)
{
    if (!url || !out) return ferry__fail(FERRY_ERR_ARG, "ferry_store_open: NULL argument");
    *out = NULL;
    static const ferry_store_options none;
    const ferry_store_options *o = opts ? opts : &none;
    if (!*url) return ferry__fail(FERRY_ERR_STORE_URL, "empty store URL");
    if (strlen(url) > 4096) return ferry__fail(FERRY_ERR_STORE_URL, "store URL longer than 4096 bytes");

    ferry_store *s = ferry__calloc(1, sizeof *s);
    if (!s) return FERRY_ERR_NOMEM;
    s->deadline_ms = o->deadline_ms ? o->deadline_ms : FERRY__DEFAULT_DEADLINE_MS;
    if (s->deadline_ms > FERRY__MAX_DEADLINE_MS) s->deadline_ms = FERRY__MAX_DEADLINE_MS; /* no overflow anywhere */
    s->max_object = o->max_object_size ? o->max_object_size : FERRY__DEFAULT_MAX_OBJECT;
    s->connect_ms = o->connect_timeout_ms ? o->connect_timeout_ms : FERRY__DEFAULT_CONNECT_MS;
    s->stall_ms = o->stall_timeout_ms ? o->stall_timeout_ms : FERRY__DEFAULT_STALL_MS;
    s->max_attempts = o->max_attempts && o->max_attempts < FERRY__MAX_ATTEMPTS_CAP ? o->max_attempts
                                                                                   : FERRY__MAX_ATTEMPTS_CAP;
    s->retry_base_ms = o->retry_base_ms ? o->retry_base_ms : FERRY__DEFAULT_RETRY_BASE_MS;
    s->max_bytes_per_s = o->max_bytes_per_s;
    s->part_size = o->part_size ? o->part_size : FERRY__DEFAULT_PART;
    s->upload_conc = o->upload_concurrency ? o->upload_concurrency : FERRY__DEFAULT_UPLOAD_CONC;
    s->cas_mode = o->cas_mode;
    s->list_page = o->list_page_size ? o->list_page_size : FERRY__DEFAULT_LIST_PAGE;
    s->max_list = o->max_list_entries ? o->max_list_entries : FERRY__DEFAULT_MAX_LIST;
    s->progress = o->progress;
    s->progress_user = o->progress_user;

    int rc = FERRY_OK;
    if (s->cas_mode != FERRY_STORE_CAS_CONDITIONAL && s->cas_mode != FERRY_STORE_CAS_VERIFY)
        rc = ferry__fail(FERRY_ERR_STORE_URL, "unknown cas_mode %d", s->cas_mode);
    else if (s->list_page > 1000)
        rc = ferry__fail(FERRY_ERR_STORE_URL, "list_page_size %u exceeds 1000", s->list_page);
    else if (s->part_size > FERRY__MAX_SINGLE_PUT)
        rc = ferry__fail(FERRY_ERR_STORE_URL, "part_size %llu exceeds S3's 5 GiB",
                         (unsigned long long)s->part_size);
    else if (s->upload_conc > FERRY__MAX_UPLOAD_CONC)
        rc = ferry__fail(FERRY_ERR_STORE_URL, "upload_concurrency %u exceeds %u", s->upload_conc, FERRY__MAX_UPLOAD_CONC);
    else if (o->ca_file && !(s->ca_file = ferry__strdup(o->ca_file)))
        rc = FERRY_ERR_NOMEM;
    if (rc) goto fail;

    if (starts(url, "file://")) {
        const char *p = url + 7;
        if (starts(p, "localhost/")) p += 9;
        if (*p != '/') {
            rc = ferry__fail(FERRY_ERR_STORE_URL, "%s: file URLs need an absolute path (file:///dir)", url);
            goto fail;
        }
        rc = ferry__file_init(s, p, o->create);
    } else if (starts(url, "s3://")) {
        rc = ferry__s3_init(s, url + 5, o);
    } else if (starts(url, "http://") || starts(url, "https://")) {
        rc = ferry__http_init(s, url);
    } else if (strstr(url, "://")) {
        rc = ferry__fail(FERRY_ERR_STORE_URL, "%s: unknown scheme (file://, s3://, http://, https://)", url);
    } else if (scheme_like(url)) {
        rc = ferry__fail(FERRY_ERR_STORE_URL,
                         "'%s' looks like a URL without its '//' (s3://BUCKET, http://HOST, file:///DIR); "
                         "for a local directory of that name write ./%s",
                         url, url);
    } else {
        rc = ferry__file_init(s, url, o->create);
    }
    if (rc) goto fail;
    *out = s;
    return FERRY_OK;
fail:
    ferry_store_free(s);
    return rc;
}

void ferry_store_free(ferry_store *s)
{
    if (!s) return;
    if (s->be && s->be->release) s->be->release(s);
    free(s->url);
    free(s->ca_file);
    free(s->root);
    free(s->base);
    free(s->prefix);
    free(s->bucket);
    free(s->region);
    free(s->sigv4_param);
    if (s->userpwd) {
        /* the secret should not linger in freed memory */
        volatile char *p = s->userpwd;
        while (*p) *p++ = 0;
        free(s->userpwd);
    }
    free(s->token_header);
    free(s);
}

int ferry_store_kind(const ferry_store *s) { return s ? s->kind : 0; }
const char *ferry_store_url(const ferry_store *s) { return s ? s->url : ""; }

/* ---------------------------------------------------------------------
 * Entry points
 * ------------------------------------------------------------------- */

#define NEED(c)                                                                          \
    do {                                                                                 \
        if (!(c)) return ferry__fail(FERRY_ERR_ARG, "%s: NULL argument", __func__);      \
    } while (0)

static int writable(const ferry_store *s, const char *op, const char *key)
{
    if (s->readonly)
        return ferry__fail(FERRY_ERR_STORE_READONLY, "%s/%s: %s: the store is read-only", s->url, key, op);
    return FERRY_OK;
}

int ferry_store_put(ferry_store *s, const char *key, const void *data, size_t size,
                    char etag_out[FERRY_STORE_ETAG_MAX])
{
    NEED(s && (data || !size));
    int rc = ferry_store_key_check(key);
    if (!rc) rc = writable(s, "put", key);
    if (rc) return rc;
    char tmp[FERRY_STORE_ETAG_MAX];
    ferry__src src = ferry__src_mem(data ? data : "");
    rc = s->be->put(s, key, &src, size, tmp);
    if (!rc && etag_out) memcpy(etag_out, tmp, sizeof tmp);
    return rc;
}

int ferry_store_put_fd(ferry_store *s, const char *key, int fd, uint64_t offset, uint64_t size,
                       char etag_out[FERRY_STORE_ETAG_MAX])
{
    NEED(s);
    int rc = ferry_store_key_check(key);
    if (!rc) rc = writable(s, "put", key);
    if (rc) return rc;
    if (fd < 0) return ferry__fail(FERRY_ERR_ARG, "%s/%s: put_fd: no file descriptor (%d)", s->url, key, fd);
    if (offset > INT64_MAX || size > INT64_MAX - offset)
        return ferry__fail(FERRY_ERR_ARG, "%s/%s: put_fd: range %llu+%llu overflows", s->url, key,
                           (unsigned long long)offset, (unsigned long long)size);
    char tmp[FERRY_STORE_ETAG_MAX];
    ferry__src src = {NULL, fd, offset};
    rc = s->be->put(s, key, &src, size, tmp);
    if (!rc && etag_out) memcpy(etag_out, tmp, sizeof tmp);
    return rc;
}

int ferry__src_read(const ferry__src *b, uint64_t pos, void *buf, size_t n, const char *what)
{
    if (b->mem) {
        memcpy(buf, b->mem + pos, n);
        return FERRY_OK;
    }
    uint8_t *d = buf;
    while (n) {
        ssize_t k = pread(b->fd, d, n, (off_t)(b->off + pos));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return ferry__fail(FERRY_ERR_IO, "%s: reading the object's bytes at offset %llu of descriptor %d: %s", what,
                               (unsigned long long)(b->off + pos), b->fd, k < 0 ? strerror(errno) : "the file ends first");
        d += k;
        n -= (size_t)k;
        pos += (uint64_t)k;
    }
    return FERRY_OK;
}

int ferry_store_put_file(ferry_store *s, const char *key, const char *path,
                         char etag_out[FERRY_STORE_ETAG_MAX])
{
    NEED(s && path);
    int rc = ferry_store_key_check(key);
    if (!rc) rc = writable(s, "put", key);
    if (rc) return rc;
    struct stat st;
    int fd = ferry__open_input(path, &st); /* a FIFO would block the open */
    if (fd < 0) return -fd;
    rc = ferry_store_put_fd(s, key, fd, 0, (uint64_t)st.st_size, etag_out);
    close(fd);
    if (rc) ferry__context(rc, "put of %s", path);
    return rc;
}

int ferry_store_get(ferry_store *s, const char *key, void **data, size_t *size, ferry_store_stat *st)
{
    return ferry_store_get_max(s, key, 0, data, size, st);
}

int ferry_store_get_max(ferry_store *s, const char *key, uint64_t max, void **data, size_t *size,
                        ferry_store_stat *st)
{
    return ferry_store_get_if_changed(s, key, NULL, max, data, size, NULL, st);
}

int ferry_store_get_if_changed(ferry_store *s, const char *key, const char *if_none_match, uint64_t max, void **data,
                               size_t *size, int *unchanged, ferry_store_stat *st)
{
    NEED(s && data && size && (!if_none_match || !if_none_match[0] || unchanged));
    *data = NULL;
    *size = 0;
    if (unchanged) *unchanged = 0;
    int rc = ferry_store_key_check(key);
    if (rc) return rc;
    ferry_buf buf = {0};
    ferry__sink sink = {.buf = &buf, .fd = -1, .max = max && max < s->max_object ? max : s->max_object,
                        .if_none_match = if_none_match};
    ferry_store_stat tmp = {0};
    rc = s->be->get(s, key, &sink, &tmp);
    /* a backend that read the object anyway (file://): the same test */
    if (!rc && !sink.unchanged && if_none_match && if_none_match[0] && !strcmp(tmp.etag, if_none_match)) sink.unchanged = 1;
    if (!rc && sink.unchanged) {
        ferry__buf_release(&buf);
        *unchanged = 1;
        if (st) *st = tmp;
        return FERRY_OK;
    }
    if (!rc) rc = ferry__buf_append(&buf, "", 1); /* the NUL after the data */
    if (rc) {
        ferry__buf_release(&buf);
        return rc;
    }
    *data = buf.data;
    *size = buf.size - 1;
    if (st) *st = tmp;
    return FERRY_OK;
}

int ferry_store_get_stream(ferry_store *s, const char *key, uint64_t max, ferry_store_write_fn fn, void *ctx,
                           ferry_store_stat *st)
{
    NEED(s && fn);
    int rc = ferry_store_key_check(key);
    if (rc) return rc;
    ferry__sink sink = {.fn = fn, .fn_ctx = ctx, .fd = -1, .max = max && max < s->max_object ? max : s->max_object};
    ferry_store_stat tmp = {0};
    if ((rc = s->be->get(s, key, &sink, &tmp))) return rc;
    if (st) *st = tmp;
    return FERRY_OK;
}

int ferry_store_get_file(ferry_store *s, const char *key, const char *path, ferry_store_stat *st)
{
    return ferry_store_get_file_max(s, key, path, 0, st);
}

int ferry_store_get_file_max(ferry_store *s, const char *key, const char *path, uint64_t max,
                             ferry_store_stat *st)
{
    NEED(s && path);
    int rc = ferry_store_key_check(key);
    if (rc) return rc;
    char tmp[4200];
    int fd = ferry__tmp_create(path, 1, tmp, sizeof tmp);
    if (fd < 0) return -fd;
    ferry__sink sink = {.fd = fd, .max = max ? max : UINT64_MAX};
    ferry_store_stat info = {0};
    rc = s->be->get(s, key, &sink, &info);
    if ((rc = ferry__tmp_commit(fd, tmp, path, rc))) return rc;
    if (st) *st = info;
    return FERRY_OK;
}

int ferry_store_get_range(ferry_store *s, const char *key, uint64_t offset, size_t len, void *buf,
                          size_t *got)
{
    return ferry__get_range_group(s, key, offset, len, buf, got, NULL);
}

int ferry__get_range_group(ferry_store *s, const char *key, uint64_t offset, size_t len, void *buf, size_t *got,
                           ferry__group *g)
{
    NEED(s && got && (buf || !len));
    *got = 0;
    int rc = ferry_store_key_check(key);
    if (rc) return rc;
    if (offset > INT64_MAX || len > INT64_MAX - offset)
        return ferry__fail(FERRY_ERR_STORE_RANGE, "%s/%s: range %llu+%zu overflows", s->url, key,
                           (unsigned long long)offset, len);
    return s->be->get_range(s, key, offset, len, buf, got, g);
}

int ferry_store_head(ferry_store *s, const char *key, ferry_store_stat *st)
{
    NEED(s && st);
    memset(st, 0, sizeof *st);
    int rc = ferry_store_key_check(key);
    if (rc) return rc;
    return s->be->head(s, key, st);
}

int ferry_store_list(ferry_store *s, const char *prefix, ferry_store_listing **out)
{
    NEED(s && out);
    *out = NULL;
    if (!prefix) prefix = "";
    int rc = ferry__prefix_check(prefix);
    if (rc) return rc;
    if (!s->be->list)
        return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: listing is not supported by this backend", s->url);
    ferry_store_listing *l = ferry__calloc(1, sizeof *l);
    if (!l) return FERRY_ERR_NOMEM;
    rc = s->be->list(s, prefix, l);
    if (!rc) rc = ferry__listing_finish(s, l);
    if (rc) {
        ferry_store_listing_free(l);
        return rc;
    }
    *out = l;
    return FERRY_OK;
}

int ferry_store_delete(ferry_store *s, const char *key)
{
    NEED(s);
    int rc = ferry_store_key_check(key);
    if (!rc) rc = writable(s, "delete", key);
    if (rc) return rc;
    return s->be->del(s, key);
}

int ferry_store_cas(ferry_store *s, const char *key, const char *expected_etag, const void *data,
                    size_t size, char new_etag[FERRY_STORE_ETAG_MAX])
{
    NEED(s && (data || !size));
    int rc = ferry_store_key_check(key);
    if (!rc) rc = writable(s, "cas", key);
    if (rc) return rc;
    if (expected_etag && (!*expected_etag || strlen(expected_etag) >= FERRY_STORE_ETAG_MAX))
        return ferry__fail(FERRY_ERR_ARG, "%s/%s: cas: expected etag is empty or too long", s->url, key);
    if (expected_etag) {
        for (const char *p = expected_etag; *p; p++)
            if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f || *p == '"')
                return ferry__fail(FERRY_ERR_ARG, "%s/%s: cas: expected etag has a forbidden character", s->url,
                                   key);
    }
    if (size > s->part_size)
        return ferry__fail(FERRY_ERR_ARG, "%s/%s: cas: %zu bytes exceed part_size (%llu): cas is for small objects",
                           s->url, key, size, (unsigned long long)s->part_size);
    char tmp[FERRY_STORE_ETAG_MAX];
    rc = s->be->cas(s, key, expected_etag, data ? data : "", size, tmp);
    if (!rc && new_etag) memcpy(new_etag, tmp, sizeof tmp);
    return rc;
}

int ferry_store_probe_cas(ferry_store *s, const char *probe_key, int *atomic)
{
    NEED(s && atomic);
    *atomic = 0;
    int rc = ferry_store_key_check(probe_key);
    if (!rc) rc = writable(s, "probe_cas", probe_key);
    if (rc) return rc;
    return s->be->probe_cas(s, probe_key, atomic);
}
