/* http(s):// backend: read-only access to objects published under a base
 * URL (a CDN, a static file server, a bucket's public website).  GET, ranged
 * GET and HEAD; redirects are followed (at most 5, http and https only).
 * Listing is not possible over plain HTTP (there is no standard index), and
 * every write fails with FERRY_ERR_STORE_READONLY. */

#include "store_impl.h"

#include <stdio.h>

typedef struct hreq {
    char what[FERRY_STORE_KEY_MAX + 4200];
    ferry_buf url;
} hreq;

static int hreq_init(ferry_store *s, hreq *r, const char *key)
{
    memset(r, 0, sizeof *r);
    snprintf(r->what, sizeof r->what, "%s/%s", s->url, key);
    int rc = ferry__buf_append(&r->url, s->base, strlen(s->base));
    if (!rc) rc = ferry__buf_append(&r->url, "/", 1);
    if (!rc) rc = ferry__uri_encode(&r->url, key, strlen(key), 1);
    if (!rc) rc = ferry__buf_append(&r->url, "", 1);
    if (rc) ferry__buf_release(&r->url);
    return rc;
}

static ferry__target target(hreq *r)
{
    ferry__target t = {.url = (const char *)r->url.data, .what = r->what};
    return t;
}

static int http_get(ferry_store *s, const char *key, ferry__sink *sink, ferry_store_stat *st)
{
    hreq r;
    int rc = hreq_init(s, &r, key);
    if (rc) return rc;
    ferry__target t = target(&r);
    rc = ferry__net_get(s, &t, sink, st);
    ferry__buf_release(&r.url);
    return rc;
}

static int http_get_range(ferry_store *s, const char *key, uint64_t off, size_t len, void *buf, size_t *got,
                          ferry__group *g)
{
    hreq r;
    int rc = hreq_init(s, &r, key);
    if (rc) return rc;
    ferry__target t = target(&r);
    t.group = g;
    rc = ferry__net_get_range(s, &t, off, len, buf, got);
    ferry__buf_release(&r.url);
    return rc;
}

static int http_head(ferry_store *s, const char *key, ferry_store_stat *st)
{
    hreq r;
    int rc = hreq_init(s, &r, key);
    if (rc) return rc;
    ferry__target t = target(&r);
    rc = ferry__net_head(s, &t, st);
    ferry__buf_release(&r.url);
    return rc;
}

/* Writes never get here (the dispatcher checks s->readonly); these answer
 * anyway, so that the table has no hole. */
static int ro_put(ferry_store *s, const char *key, const ferry__src *src, uint64_t n, char *etag)
{
    (void)src, (void)n, (void)etag;
    return ferry__fail(FERRY_ERR_STORE_READONLY, "%s/%s: the store is read-only", s->url, key);
}
static int ro_del(ferry_store *s, const char *key) { return ro_put(s, key, NULL, 0, NULL); }
static int ro_cas(ferry_store *s, const char *key, const char *e, const void *d, size_t n, char *etag)
{
    (void)e, (void)d;
    return ro_put(s, key, NULL, n, etag);
}
static int ro_probe(ferry_store *s, const char *key, int *atomic)
{
    *atomic = 0;
    return ro_put(s, key, NULL, 0, NULL);
}

static void http_release(ferry_store *s) { ferry__net_pool_release(s); }

const ferry__backend ferry__http_backend = {
    .put = ro_put,
    .get = http_get,
    .get_range = http_get_range,
    .head = http_head,
    .list = NULL, /* FERRY_ERR_UNSUPPORTED */
    .del = ro_del,
    .cas = ro_cas,
    .probe_cas = ro_probe,
    .release = http_release,
};

int ferry__http_init(ferry_store *s, const char *url)
{
    s->be = &ferry__http_backend;
    s->kind = FERRY_STORE_HTTP;
    s->readonly = 1;
    if (pthread_mutex_init(&s->pool_lock, NULL)) return ferry__fail(FERRY_ERR_NOMEM, "pthread_mutex_init failed");
    s->pool_inited = 1;
    int rc = ferry__net_global_init();
    if (rc) return rc;
    size_t n = strlen(url);
    while (n && url[n - 1] == '/') n--;
    const char *host = strstr(url, "://") + 3;
    if ((size_t)(host - url) >= n)
        return ferry__fail(FERRY_ERR_STORE_URL, "%s: no host", url);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)url[i] <= 0x20 || (unsigned char)url[i] >= 0x7f || url[i] == '?' || url[i] == '#')
            return ferry__fail(FERRY_ERR_STORE_URL, "%.200s: forbidden character in the base URL (0x%02x)", url,
                               (unsigned char)url[i]);
    if (!(s->base = ferry__malloc(n + 1)) || !(s->url = ferry__malloc(n + 1))) return FERRY_ERR_NOMEM;
    memcpy(s->base, url, n);
    s->base[n] = 0;
    memcpy(s->url, url, n + 1);
    s->url[n] = 0;
    return FERRY_OK;
}
