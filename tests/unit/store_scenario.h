/* The behaviour every writable store must show, as check.h cases.  Used by
 * tests/unit/test_store_file.c (file://) and by tests/tools/store_tool.c
 * "selftest" (s3:// against s3rver and the SigV4-checking server), so that
 * every backend is held to the same contract.
 *
 * sc_url / sc_opts name the store; every key lives under sc_base (a fresh
 * prefix per run), so runs do not see each other. */
#ifndef FERRY_STORE_SCENARIO_H
#define FERRY_STORE_SCENARIO_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ferry_store.h"

static const char *sc_url;
static ferry_store_options sc_opts;
static char sc_base[256];

static const char *sc_key(const char *rel)
{
    static char bufs[8][1200];
    static int i;
    char *b = bufs[i++ & 7];
    snprintf(b, 1200, "%s/%s", sc_base, rel);
    return b;
}

static ferry_store *sc_open(void)
{
    ferry_store *s = NULL;
    int rc = ferry_store_open(sc_url, &sc_opts, &s);
    if (rc) fprintf(stderr, "open %s: %s\n", sc_url, ferry_last_error());
    return s;
}

static uint8_t *sc_pattern(size_t n, unsigned seed)
{
    uint8_t *p = malloc(n ? n : 1);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        p[i] = (uint8_t)x;
    }
    return p;
}

static int sc_get_eq(ferry_store *s, const char *key, const void *want, size_t n)
{
    void *d = NULL;
    size_t sz = 0;
    int rc = ferry_store_get(s, key, &d, &sz, NULL);
    int ok = !rc && sz == n && (!n || !memcmp(d, want, n)) && ((char *)d)[sz] == 0;
    if (!ok) fprintf(stderr, "get %s: rc %d (%s), %zu bytes, want %zu\n", key, rc, ferry_last_error(), sz, n);
    ferry_free(d);
    return ok;
}

static void sc_roundtrip(void)
{
    ferry_store *s = sc_open();
    CHECK(s);
    if (!s) return;
    const char *msg = "hello, islands\n";
    char etag[FERRY_STORE_ETAG_MAX] = "";
    CHECK_OK(ferry_store_put(s, sc_key("rt/a.txt"), msg, strlen(msg), etag));
    CHECK(etag[0]);
    CHECK(sc_get_eq(s, sc_key("rt/a.txt"), msg, strlen(msg)));
    ferry_store_stat st;
    CHECK_OK(ferry_store_head(s, sc_key("rt/a.txt"), &st));
    CHECK(st.size == strlen(msg));
    CHECK(!strcmp(st.etag, etag));
    CHECK(st.mtime > 1500000000);
    void *d = NULL;
    size_t n = 0;
    ferry_store_stat gst;
    CHECK_OK(ferry_store_get(s, sc_key("rt/a.txt"), &d, &n, &gst));
    CHECK(!strcmp(gst.etag, etag) && gst.size == n);
    ferry_free(d);
    /* overwrite: a new etag, the new bytes */
    char etag2[FERRY_STORE_ETAG_MAX];
    CHECK_OK(ferry_store_put(s, sc_key("rt/a.txt"), "v2", 2, etag2));
    CHECK(strcmp(etag, etag2));
    CHECK(sc_get_eq(s, sc_key("rt/a.txt"), "v2", 2));
    /* empty object */
    CHECK_OK(ferry_store_put(s, sc_key("rt/empty"), NULL, 0, NULL));
    CHECK(sc_get_eq(s, sc_key("rt/empty"), "", 0));
    CHECK_OK(ferry_store_head(s, sc_key("rt/empty"), &st));
    CHECK(st.size == 0);
    /* keys with characters that need escaping in URLs and XML */
    const char *odd = sc_key("rt/sp ace/\xc3\xbc+%26&=?#;<x>'\"@!$,()*~.bin");
    CHECK_OK(ferry_store_put(s, odd, "odd", 3, NULL));
    CHECK(sc_get_eq(s, odd, "odd", 3));
    ferry_store_listing *l = NULL;
    CHECK_OK(ferry_store_list(s, sc_key("rt/sp"), &l));
    CHECK(l && l->count == 1 && !strcmp(l->entries[0].key, odd));
    ferry_store_listing_free(l);
    ferry_store_free(s);
}

static void sc_missing(void)
{
    ferry_store *s = sc_open();
    CHECK(s);
    if (!s) return;
    void *d = (void *)1;
    size_t n = 7;
    ferry_store_stat st;
    char buf[4];
    size_t got = 9;
    CHECK_RC(ferry_store_get(s, sc_key("missing/x"), &d, &n, NULL), FERRY_ERR_STORE_NOT_FOUND);
    CHECK(d == NULL && n == 0);
    CHECK_RC(ferry_store_head(s, sc_key("missing/x"), &st), FERRY_ERR_STORE_NOT_FOUND);
    CHECK_RC(ferry_store_get_range(s, sc_key("missing/x"), 0, 4, buf, &got), FERRY_ERR_STORE_NOT_FOUND);
    CHECK(got == 0);
    CHECK_OK(ferry_store_delete(s, sc_key("missing/x"))); /* idempotent */
    ferry_store_free(s);
}

static void sc_range(void)
{
    ferry_store *s = sc_open();
    CHECK(s);
    if (!s) return;
    const char *k = sc_key("range/obj");
    const char *data = "0123456789abcdefghij"; /* 20 bytes */
    CHECK_OK(ferry_store_put(s, k, data, 20, NULL));
    char buf[32];
    size_t got = 0;
    CHECK_OK(ferry_store_get_range(s, k, 5, 4, buf, &got));
    CHECK(got == 4 && !memcmp(buf, "5678", 4));
    CHECK_OK(ferry_store_get_range(s, k, 0, 1, buf, &got));
    CHECK(got == 1 && buf[0] == '0');
    CHECK_OK(ferry_store_get_range(s, k, 15, 10, buf, &got)); /* runs past the end: short */
    CHECK(got == 5 && !memcmp(buf, "fghij", 5));
    CHECK_OK(ferry_store_get_range(s, k, 19, 1, buf, &got));
    CHECK(got == 1 && buf[0] == 'j');
    CHECK_OK(ferry_store_get_range(s, k, 20, 4, buf, &got)); /* exactly at the end */
    CHECK(got == 0);
    CHECK_RC(ferry_store_get_range(s, k, 21, 4, buf, &got), FERRY_ERR_STORE_RANGE);
    CHECK_OK(ferry_store_get_range(s, k, 3, 0, buf, &got));
    CHECK(got == 0);
    CHECK_RC(ferry_store_get_range(s, k, 30, 0, buf, &got), FERRY_ERR_STORE_RANGE);
    CHECK_RC(ferry_store_get_range(s, k, UINT64_MAX - 1, 4, buf, &got), FERRY_ERR_STORE_RANGE);
    ferry_store_free(s);
}

static int sc_has(const ferry_store_listing *l, const char *key, uint64_t size)
{
    for (size_t i = 0; i < l->count; i++)
        if (!strcmp(l->entries[i].key, key)) return l->entries[i].stat.size == size && l->entries[i].stat.etag[0];
    return 0;
}

static void sc_list(void)
{
    ferry_store *s = sc_open();
    CHECK(s);
    if (!s) return;
    const char *names[] = {"ls/a", "ls/b/c", "ls/b/d", "ls/bz", "ls/c", "ls/b/e/f", "ls/ba"};
    for (int i = 0; i < 7; i++) CHECK_OK(ferry_store_put(s, sc_key(names[i]), names[i], strlen(names[i]), NULL));
    ferry_store_listing *l = NULL;
    CHECK_OK(ferry_store_list(s, sc_key("ls/"), &l));
    CHECK(l && l->count == 7);
    for (int i = 0; l && i < 7; i++) CHECK(sc_has(l, sc_key(names[i]), strlen(names[i])));
    for (size_t i = 1; l && i < l->count; i++) CHECK(strcmp(l->entries[i - 1].key, l->entries[i].key) < 0);
    ferry_store_listing_free(l);
    /* a string prefix, not a directory */
    CHECK_OK(ferry_store_list(s, sc_key("ls/b"), &l));
    CHECK(l && l->count == 5);
    ferry_store_listing_free(l);
    CHECK_OK(ferry_store_list(s, sc_key("ls/b/"), &l));
    CHECK(l && l->count == 3 && sc_has(l, sc_key("ls/b/e/f"), 8));
    ferry_store_listing_free(l);
    CHECK_OK(ferry_store_list(s, sc_key("ls/nothing"), &l));
    CHECK(l && l->count == 0);
    ferry_store_listing_free(l);
    CHECK_OK(ferry_store_list(s, sc_key("ls/b/e/f"), &l));
    CHECK(l && l->count == 1);
    ferry_store_listing_free(l);
    /* delete, then gone from head and list */
    CHECK_OK(ferry_store_delete(s, sc_key("ls/bz")));
    ferry_store_stat st;
    CHECK_RC(ferry_store_head(s, sc_key("ls/bz"), &st), FERRY_ERR_STORE_NOT_FOUND);
    CHECK_OK(ferry_store_delete(s, sc_key("ls/bz")));
    CHECK_OK(ferry_store_list(s, sc_key("ls/"), &l));
    CHECK(l && l->count == 6 && !sc_has(l, sc_key("ls/bz"), 2));
    ferry_store_listing_free(l);
    /* bad prefixes */
    CHECK_RC(ferry_store_list(s, "../", &l), FERRY_ERR_STORE_KEY);
    CHECK_RC(ferry_store_list(s, "/abs", &l), FERRY_ERR_STORE_KEY);
    CHECK_RC(ferry_store_list(s, "a/../b", &l), FERRY_ERR_STORE_KEY);
    CHECK(l == NULL);
    ferry_store_free(s);
}

static void sc_cas(void)
{
    ferry_store *s = sc_open();
    CHECK(s);
    if (!s) return;
    const char *k = sc_key("cas/latest");
    char e1[FERRY_STORE_ETAG_MAX] = "", e2[FERRY_STORE_ETAG_MAX] = "", e3[FERRY_STORE_ETAG_MAX] = "";
    CHECK_RC(ferry_store_cas(s, k, "no-such-etag", "v0", 2, e1), FERRY_ERR_STORE_CONFLICT); /* absent */
    CHECK_OK(ferry_store_cas(s, k, NULL, "v1", 2, e1));                                      /* create */
    CHECK(e1[0]);
    CHECK_RC(ferry_store_cas(s, k, NULL, "v1b", 3, e2), FERRY_ERR_STORE_CONFLICT);           /* exists */
    CHECK(sc_get_eq(s, k, "v1", 2));
    CHECK_OK(ferry_store_cas(s, k, e1, "v2", 2, e2)); /* swap */
    CHECK(e2[0] && strcmp(e1, e2));
    CHECK(sc_get_eq(s, k, "v2", 2));
    CHECK_RC(ferry_store_cas(s, k, e1, "v3", 2, e3), FERRY_ERR_STORE_CONFLICT); /* stale etag */
    CHECK(sc_get_eq(s, k, "v2", 2));
    ferry_store_stat st;
    CHECK_OK(ferry_store_head(s, k, &st));
    CHECK(!strcmp(st.etag, e2));
    CHECK_OK(ferry_store_cas(s, k, st.etag, "v3", 2, e3));
    CHECK(sc_get_eq(s, k, "v3", 2));
    CHECK_RC(ferry_store_cas(s, k, "", "x", 1, NULL), FERRY_ERR_ARG);
    CHECK_RC(ferry_store_cas(s, k, "bad etag", "x", 1, NULL), FERRY_ERR_ARG);
    ferry_store_free(s);
}

static void sc_hostile_keys(void)
{
    ferry_store *s = sc_open();
    CHECK(s);
    if (!s) return;
    static char longkey[FERRY_STORE_KEY_MAX + 2], longseg[300];
    memset(longkey, 'a', sizeof longkey - 1);
    for (size_t i = 100; i < sizeof longkey - 1; i += 100) longkey[i] = '/';
    memset(longseg, 'b', sizeof longseg - 1);
    const char *bad[] = {"", "/etc/passwd", "../x", "a/../../x", "a/..", "..", ".", "a/./b", "a//b", "a/",
                         "a\\b", "a\x01" "b", "a\x7f", "\xff\xfe", "\xc0\xaf", "\xed\xa0\x80", ".ferry-cas.lock",
                         "d/.ferry-tmp.1", longkey, longseg};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        void *d = NULL;
        size_t n = 0;
        ferry_store_stat st;
        CHECK_RC(ferry_store_key_check(bad[i]), FERRY_ERR_STORE_KEY);
        CHECK_RC(ferry_store_put(s, bad[i], "x", 1, NULL), FERRY_ERR_STORE_KEY);
        CHECK_RC(ferry_store_get(s, bad[i], &d, &n, NULL), FERRY_ERR_STORE_KEY);
        CHECK_RC(ferry_store_head(s, bad[i], &st), FERRY_ERR_STORE_KEY);
        CHECK_RC(ferry_store_delete(s, bad[i]), FERRY_ERR_STORE_KEY);
        CHECK_RC(ferry_store_cas(s, bad[i], NULL, "x", 1, NULL), FERRY_ERR_STORE_KEY);
    }
    CHECK_RC(ferry_store_key_check(NULL), FERRY_ERR_STORE_KEY);
    CHECK_OK(ferry_store_key_check("a/b.c/..d/d..e/.hidden/\xc3\xa9t\xc3\xa9"));
    ferry_store_free(s);
}

static void sc_limit(void)
{
    ferry_store_options o = sc_opts;
    o.max_object_size = 10;
    ferry_store *s = NULL;
    CHECK_OK(ferry_store_open(sc_url, &o, &s));
    if (!s) return;
    CHECK_OK(ferry_store_put(s, sc_key("limit/big"), "0123456789A", 11, NULL));
    CHECK_OK(ferry_store_put(s, sc_key("limit/ok"), "0123456789", 10, NULL));
    void *d = NULL;
    size_t n = 0;
    CHECK_RC(ferry_store_get(s, sc_key("limit/big"), &d, &n, NULL), FERRY_ERR_LIMIT);
    CHECK(d == NULL);
    CHECK_OK(ferry_store_get(s, sc_key("limit/ok"), &d, &n, NULL));
    ferry_free(d);
    ferry_store_free(s);
}

static int sc_progress_calls;
static int sc_progress(void *user, uint64_t done, uint64_t total)
{
    (void)done;
    (void)total;
    sc_progress_calls++;
    return user != NULL; /* a non-NULL user asks to cancel */
}

/* A large object: multipart on S3 when it exceeds part_size.  n is chosen
 * by the caller (file: > 8 MiB chunks; s3: 3.5 parts). */
static void sc_large_n(size_t n)
{
    ferry_store_options o = sc_opts;
    o.progress = sc_progress;
    ferry_store *s = NULL;
    CHECK_OK(ferry_store_open(sc_url, &o, &s));
    if (!s) return;
    uint8_t *data = sc_pattern(n, 7);
    sc_progress_calls = 0;
    char etag[FERRY_STORE_ETAG_MAX] = "";
    CHECK_OK(ferry_store_put(s, sc_key("large/blob"), data, n, etag));
    CHECK(sc_progress_calls > 0);
    CHECK(etag[0]);
    CHECK(sc_get_eq(s, sc_key("large/blob"), data, n));
    ferry_store_stat st;
    CHECK_OK(ferry_store_head(s, sc_key("large/blob"), &st));
    CHECK(st.size == n);
    uint8_t buf[100];
    size_t got = 0;
    CHECK_OK(ferry_store_get_range(s, sc_key("large/blob"), n - 150, 100, buf, &got));
    CHECK(got == 100 && !memcmp(buf, data + n - 150, 100));
    /* put_file / get_file */
    char tmpl[] = "/tmp/ferry-sc-XXXXXX";
    int fd = mkstemp(tmpl);
    CHECK(fd >= 0);
    if (fd >= 0) {
        CHECK(write(fd, data, n) == (ssize_t)n);
        close(fd);
        CHECK_OK(ferry_store_put_file(s, sc_key("large/fromfile"), tmpl, NULL));
        CHECK(sc_get_eq(s, sc_key("large/fromfile"), data, n));
        char out[64];
        snprintf(out, sizeof out, "%s.out", tmpl);
        ferry_store_stat fst;
        CHECK_OK(ferry_store_get_file(s, sc_key("large/fromfile"), out, &fst));
        CHECK(fst.size == n);
        FILE *f = fopen(out, "rb");
        uint8_t *back = malloc(n + 1);
        CHECK(f && fread(back, 1, n + 1, f) == n);
        CHECK(!memcmp(back, data, n));
        if (f) fclose(f);
        free(back);
        CHECK_RC(ferry_store_get_file(s, sc_key("large/nothing"), out, &fst), FERRY_ERR_STORE_NOT_FOUND);
        CHECK(access(out, F_OK) == 0); /* the failed download left the old file alone */
        unlink(out);
        unlink(tmpl);
    }
    ferry_store_free(s);
    /* cancel from the progress callback: nothing is written */
    o.progress_user = (void *)1;
    CHECK_OK(ferry_store_open(sc_url, &o, &s));
    if (s) {
        CHECK_RC(ferry_store_put(s, sc_key("large/canceled"), data, n, NULL), FERRY_ERR_STORE_CANCELED);
        CHECK_RC(ferry_store_head(s, sc_key("large/canceled"), &st), FERRY_ERR_STORE_NOT_FOUND);
        ferry_store_free(s);
    }
    free(data);
}

static void sc_args(void)
{
    ferry_store *s = sc_open();
    CHECK(s);
    if (!s) return;
    void *d;
    size_t n;
    CHECK_RC(ferry_store_put(NULL, "k", "x", 1, NULL), FERRY_ERR_ARG);
    CHECK_RC(ferry_store_put(s, "k", NULL, 1, NULL), FERRY_ERR_ARG);
    CHECK_RC(ferry_store_get(s, "k", NULL, &n, NULL), FERRY_ERR_ARG);
    CHECK_RC(ferry_store_get(s, "k", &d, NULL, NULL), FERRY_ERR_ARG);
    ferry_store_free(NULL);
    ferry_store_listing_free(NULL);
    ferry_store_free(s);
}

#endif
