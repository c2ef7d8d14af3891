/* Streamed deltas end to end (issue 26 item 3): ferry_store_get_stream
 * (file:// here; s3:// too when FERRY_TEST_S3 names a bucket URL, as
 * tests/scripts/stream_s3.sh does with s3rver), and a memory-mode
 * subscriber whose delta steps over s3:// are streamed into its model:
 * the versions it reaches are bit for bit the published ones; a corrupt,
 * truncated, forged (signed) or other-version delta is refused and the
 * model is put back exactly, and with a second store the one bad object
 * comes from there. */
#ifdef FERRY_NO_NET
#include "helpers.h"
NOT_BUILT_MAIN("store layer not built (NO_NET=1)")
#else
#include <stdbool.h>
#include <stdint.h>
#include "check.h"
#include "ferry_sign.h"
#include "ferry_store.h"
#include "ferry_sync.h"
#include "helpers.h"

static char g_root[256];

static uint64_t rng = 0x0DDB1A5E5BAD5EEDull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* ---- ferry_store_get_stream ---- */

typedef struct sink {
    uint8_t *buf;
    size_t n, cap, calls;
    size_t stop_at; /* fail once this many bytes arrived (0: never) */
    /* at the first call, key is replaced in store by other (other_n bytes) */
    ferry_store *store;
    const char *key;
    const uint8_t *other;
    size_t other_n;
} sink;

static int sink_write(void *ctx, const void *p, size_t n)
{
    sink *k = ctx;
    if (k->n + n > k->cap) {
        k->cap = (k->n + n) * 2;
        k->buf = realloc(k->buf, k->cap);
    }
    memcpy(k->buf + k->n, p, n);
    k->n += n;
    k->calls++;
    if (k->store && k->calls == 1 && ferry_store_put(k->store, k->key, k->other, k->other_n, NULL)) return FERRY_ERR_INTERNAL;
    if (k->stop_at && k->n >= k->stop_at) return FERRY_ERR_STORE_CANCELED;
    return FERRY_OK;
}

static int feed_stream(void *ctx, const void *p, size_t n) { return ferry_apply_stream_feed(ctx, p, n); }

static void get_stream_cases(ferry_store *s)
{
    size_t n = 3 * 1000 * 1000 + 17;
    uint8_t *data = malloc(n);
    for (size_t i = 0; i < n; i++) data[i] = (uint8_t)rnd();
    CHECK_OK(ferry_store_put(s, "stream/obj", data, n, NULL));
    sink k = {0};
    ferry_store_stat st;
    CHECK_OK(ferry_store_get_stream(s, "stream/obj", n, sink_write, &k, &st));
    CHECK(k.n == n && !memcmp(k.buf, data, n) && st.size == n);
    /* an object over the bound: refused before any byte is handed on */
    k.n = 0;
    CHECK_RC(ferry_store_get_stream(s, "stream/obj", n - 1, sink_write, &k, NULL), FERRY_ERR_LIMIT);
    CHECK(k.n == 0);
    /* the callback stops the transfer with its status */
    k.n = 0;
    k.stop_at = 100000;
    CHECK_RC(ferry_store_get_stream(s, "stream/obj", 0, sink_write, &k, NULL), FERRY_ERR_STORE_CANCELED);
    CHECK(k.n >= 100000); /* file:// hands on 8 MiB reads: all of it at once */
    k.stop_at = 0;
    k.n = 0;
    CHECK_RC(ferry_store_get_stream(s, "stream/none", 0, sink_write, &k, NULL), FERRY_ERR_STORE_NOT_FOUND);
    CHECK(k.n == 0);
    CHECK_RC(ferry_store_get_stream(s, "stream/obj", 0, NULL, &k, NULL), FERRY_ERR_ARG);
    free(k.buf);
    free(data);

    /* a patch whose header declares 2^60 bytes, streamed into
     * ferry_apply_stream: refused by the stream's own bound (LIMIT, its
     * message, not the store's), nothing allocated, the model untouched */
    ferry_model *a = ramp_model(0x3c00), *b = ramp_model(0x3c01);
    void *patch = NULL;
    size_t pn = 0;
    CHECK_OK(ferry_diff(a, b, NULL, &patch, &pn));
    if (patch) {
        uint8_t *p = patch;
        for (int i = 0; i < 8; i++) p[48 + i] = (uint8_t)((uint64_t)1 << 60 >> (8 * i));
        CHECK_OK(ferry_store_put(s, "stream/huge.patch", p, pn, NULL));
        ferry_apply_stream *as = NULL;
        ferry_apply_stream_options so = {.max_size = pn};
        CHECK_OK(ferry_apply_stream_begin(a, NULL, &so, &as));
        CHECK_RC(ferry_store_get_stream(s, "stream/huge.patch", 0, feed_stream, as, NULL),
                 FERRY_ERR_LIMIT);
        CHECK(strstr(ferry_last_error(), "header declares") != NULL);
        ferry_apply_stream_abort(as);
        ferry_model *c = ramp_model(0x3c00);
        CHECK(!memcmp(ferry_model_tensor(a, 0)->data, ferry_model_tensor(c, 0)->data, ferry_model_tensor(c, 0)->nbytes));
        ferry_model_free(c);
    }
    ferry_free(patch);
    ferry_model_free(a);
    ferry_model_free(b);
}

static void test_get_stream_file(void)
{
    ferry_store *s = NULL;
    ferry_store_options o = {.create = 1};
    CHECK_OK(ferry_store_open(g_root, &o, &s));
    if (s) get_stream_cases(s);
    ferry_store_free(s);
}

static const char *s3_url(void)
{
    const char *u = getenv("FERRY_TEST_S3");
    return u && *u ? u : NULL;
}

static ferry_store *open_s3(const char *prefix)
{
    char url[512];
    snprintf(url, sizeof url, "%s/%s", s3_url(), prefix);
    ferry_store *s = NULL;
    ferry_store_options o = {.deadline_ms = 30000, .retry_base_ms = 20};
    CHECK_OK(ferry_store_open(url, &o, &s));
    return s;
}

static void test_get_stream_s3(void)
{
    if (!s3_url()) SKIP("FERRY_TEST_S3 not set (tests/scripts/stream_s3.sh sets it)");
    ferry_store *s = open_s3("getstream");
    if (s) get_stream_cases(s);
    ferry_store_free(s);
}

/* With FERRY_TEST_FAULT set, the script armed the strict server
 * (tests/tools/s3_strict_server.py) to cut the next object GET in the
 * middle: "cut" (the object unchanged: the retry resumes after the bytes
 * handed on, every byte once, in order) or "cut_shrink" (the object
 * replaced meanwhile: the bytes cannot be taken back, the call fails), or
 * "cut_replace": the server also ignores If-Match (as s3rver does) and
 * the object is replaced by another of the same size while the first
 * attempt runs: the resumed answer is of another etag, and its bytes must
 * never be spliced onto the old object's (the call fails). */
static void test_get_stream_fault(void)
{
    const char *fault = getenv("FERRY_TEST_FAULT");
    if (!s3_url() || !fault) SKIP("FERRY_TEST_S3 and FERRY_TEST_FAULT not set (tests/scripts/stream_s3.sh sets them)");
    ferry_store *s = open_s3("fault");
    size_t n = 2 * 1000 * 1000 + 3;
    uint8_t *data = malloc(n);
    for (size_t i = 0; i < n; i++) data[i] = (uint8_t)rnd();
    sink k = {0};
    ferry_store *s2 = NULL;
    uint8_t *other = NULL;
    if (s) CHECK_OK(ferry_store_put(s, "obj", data, n, NULL));
    if (s && !strcmp(fault, "cut_replace")) {
        s2 = open_s3("fault");
        other = malloc(n);
        for (size_t i = 0; i < n; i++) other[i] = (uint8_t)~data[i];
        k = (sink){.store = s2, .key = "obj", .other = other, .other_n = n};
    }
    if (s && !strcmp(fault, "cut")) {
        CHECK_OK(ferry_store_get_stream(s, "obj", 0, sink_write, &k, NULL));
        CHECK(k.n == n && !memcmp(k.buf, data, n));
    } else if (s) {
        int rc = ferry_store_get_stream(s, "obj", 0, sink_write, &k, NULL);
        fprintf(stderr, "    (%s: %s)\n", fault, ferry_last_error());
        CHECK_RC(rc, FERRY_ERR_STORE_NET);
        CHECK(k.n > 0 && k.n < n && !memcmp(k.buf, data, k.n)); /* what was handed on is the old object's start */
    }
    free(k.buf);
    free(data);
    free(other);
    ferry_store_free(s2);
    ferry_store_free(s);
}

/* With FERRY_TEST_HTTP set, tests/scripts/stream_s3.sh runs a plain HTTP
 * server that cuts the first GET of "obj" (2000003 bytes of a seeded
 * generator; we only compare with what the first answer handed on) in the
 * middle and answers the resumed request as FERRY_TEST_HTTP_MODE says (see
 * the script): only an honest 206 may complete the call, and no byte of
 * another object or position may be handed on. */
static void test_get_stream_http_fault(void)
{
    const char *url = getenv("FERRY_TEST_HTTP"), *mode = getenv("FERRY_TEST_HTTP_MODE");
    if (!url || !mode) SKIP("FERRY_TEST_HTTP and FERRY_TEST_HTTP_MODE not set (tests/scripts/stream_s3.sh sets them)");
    ferry_store *s = NULL;
    ferry_store_options o = {.deadline_ms = 20000, .retry_base_ms = 20};
    CHECK_OK(ferry_store_open(url, &o, &s));
    if (!s) return;
    size_t n = 2000003, half = n / 2;
    sink k = {0};
    int rc = ferry_store_get_stream(s, "obj", 0, sink_write, &k, NULL);
    fprintf(stderr, "    (%s: rc %d, %zu bytes handed on: %s)\n", mode, rc, k.n, rc ? ferry_last_error() : "");
    if (!strcmp(mode, "honest")) {
        CHECK_OK(rc);
        CHECK(k.n == n);
    } else {
        CHECK_RC(rc, !strcmp(mode, "wrong_start") || !strcmp(mode, "short206") ? FERRY_ERR_STORE_CORRUPT : FERRY_ERR_STORE_NET);
        CHECK(k.n <= half); /* nothing but the first answer's bytes */
    }
    free(k.buf);
    ferry_store_free(s);
}

/* ---- the subscriber ---- */

#define NV 6 /* versions: rl-a steps 0..5, version v = step v - 1 */

/* The key of version v's delta in run r (listed: its id is random). */
static bool delta_key(ferry_store *s, const char *run, uint64_t v, char *out, size_t cap)
{
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s/v/%020llu-", run, (unsigned long long)v);
    ferry_store_listing *l = NULL;
    if (ferry_store_list(s, prefix, &l)) return false;
    bool found = false;
    for (size_t i = 0; i < l->count; i++) {
        size_t n = strlen(l->entries[i].key);
        if (n > 6 && !strcmp(l->entries[i].key + n - 6, ".patch")) {
            snprintf(out, cap, "%s", l->entries[i].key);
            found = true;
        }
    }
    ferry_store_listing_free(l);
    return found;
}

static uint8_t g_other[1 << 20];
static size_t g_other_n;

/* Replaces an object by what edit makes of its bytes. */
static void tamper(ferry_store *s, const char *key, void (*edit)(uint8_t *p, size_t *n))
{
    void *d = NULL;
    size_t n = 0;
    CHECK_OK(ferry_store_get(s, key, &d, &n, NULL));
    uint8_t *p = malloc(n + sizeof g_other); /* room for swap_other */
    memcpy(p, d, n);
    edit(p, &n);
    CHECK_OK(ferry_store_put(s, key, p, n, NULL));
    free(p);
    ferry_free(d);
}
static void flip_late(uint8_t *p, size_t *n) { p[*n - *n / 5] ^= 0x10; }  /* in the last chunks */
static void cut_tail(uint8_t *p, size_t *n) { (void)p, *n -= *n / 3; }     /* a truncated copy */
static void swap_other(uint8_t *p, size_t *n) { memcpy(p, g_other, g_other_n), *n = g_other_n; } /* another version's delta */

typedef struct world {
    ferry_store *origin, *mirror;
    char run[64];
    ferry_model *steps[NV];
    ferry_keys *pub, *sub; /* signed runs only */
    char keydir[400];
} world;

static void publish(world *w, bool is_signed)
{
    snprintf(w->run, sizeof w->run, "run%llu", (unsigned long long)(rnd() % 1000000));
    ferry_publisher_options po = {.anchor_every = 100, .threads = 2};
    if (is_signed) {
        snprintf(w->keydir, sizeof w->keydir, "%s/k%s", g_root, w->run);
        char id[FERRY_KEY_ID_LEN + 1], priv[420], pubk[420];
        CHECK_OK(ferry_keygen(w->keydir, id));
        snprintf(priv, sizeof priv, "%s.key", w->keydir);
        snprintf(pubk, sizeof pubk, "%s.pub", w->keydir);
        CHECK_OK(ferry_keys_create(&w->pub));
        CHECK_OK(ferry_keys_set_signer(w->pub, priv, id));
        CHECK_OK(ferry_keys_create(&w->sub));
        CHECK_OK(ferry_keys_trust(w->sub, pubk, FERRY_KEY_PUBLISHER, id));
        po.keys = w->pub;
    }
    ferry_publisher *p = NULL;
    CHECK_OK(ferry_publisher_open(w->origin, w->run, &po, &p));
    for (int v = 1; p && v <= NV; v++) CHECK_OK(ferry_publish(p, w->steps[v - 1], NULL));
    ferry_publisher_free(p);
    ferry_mirror_options mo = {.keys = w->sub};
    CHECK_OK(ferry_mirror_once(w->origin, w->mirror, w->run, &mo, NULL));
}

/* A memory-mode island on store s at version `at` (its model a copy of that
 * step), plus further stores. */
static ferry_subscriber *island(world *w, ferry_store *s, ferry_model **m, int at, ferry_store *also)
{
    *m = model_copy(w->steps[at - 1]);
    ferry_subscriber_options so = {.model = *m, .model_version = (uint64_t)at, .threads = 2, .no_compactions = 1, .keys = w->sub};
    ferry_subscriber *sub = NULL;
    CHECK_OK(ferry_subscriber_open(s, w->run, &so, &sub));
    if (also && sub) CHECK_OK(ferry_subscriber_add_store(sub, also));
    return sub;
}

/* The change lists of the last sync (ferry_subscriber_changes) against
 * the models: every element that differs between `from` and the model now
 * is listed (or the tensor is whole), with its value now; a sync that
 * changed nothing lists nothing. */
static bool changes_match(ferry_subscriber *sub, const ferry_model *from, const ferry_model *now)
{
    for (size_t i = 0; i < ferry_model_count(now); i++) {
        const ferry_tensor *a = ferry_model_tensor(from, i), *b = ferry_model_tensor(now, i);
        int all = 0;
        const int64_t *pos = NULL;
        const void *val = NULL;
        size_t count = 0;
        if (ferry_subscriber_changes(sub, i, &all, &pos, &val, &count)) return false;
        if (all) continue;
        size_t es = ferry_dtype_bits(b->dtype) / 8, ne = (size_t)(b->nbytes / es), j = 0;
        const uint8_t *pa = a->data, *pb = b->data;
        for (size_t k = 0; k < count; k++)
            if (pos[k] < 0 || (size_t)pos[k] >= ne || memcmp((const uint8_t *)val + k * es, pb + (size_t)pos[k] * es, es)) return false;
        for (size_t e = 0; e < ne; e++) {
            if (!memcmp(pa + e * es, pb + e * es, es)) continue;
            while (j < count && (size_t)pos[j] < e) j++;
            if (j == count || (size_t)pos[j] != e) return false; /* a changed element not listed */
        }
    }
    return true;
}

/* Streamed steps feed the change lists as buffered ones do; a streamed
 * step that fails leaves version, model and lists as before (nothing
 * listed), and the subscriber syncs on once the object is right again. */
static void subscriber_changes_case(world *w, const char *key4)
{
    ferry_model *m;
    ferry_subscriber *sub = island(w, w->mirror, &m, 1, NULL);
    ferry_sync_info info;
    if (!sub) return;
    CHECK_OK(ferry_subscriber_sync(sub, FERRY_SYNC_EXACT, 3, &info));
    CHECK(models_same(m, w->steps[2]));
    CHECK(changes_match(sub, w->steps[0], m));
    /* the mirror's delta 4 is still bad: nothing changes */
    CHECK(ferry_subscriber_sync(sub, FERRY_SYNC_LATEST, 0, &info) != FERRY_OK);
    CHECK(ferry_subscriber_version(sub) == 3 && models_same(m, w->steps[2]));
    CHECK(changes_match(sub, w->steps[2], m));
    int all = 1;
    const int64_t *pos;
    const void *val;
    size_t count = 1;
    CHECK_OK(ferry_subscriber_changes(sub, 0, &all, &pos, &val, &count));
    CHECK(all == 0 && count == 0);
    /* the right object again (a rejected key is remembered for the
       handle's life: a new island at 3): on to the last version */
    void *d = NULL;
    size_t n = 0;
    CHECK_OK(ferry_store_get(w->origin, key4, &d, &n, NULL));
    CHECK_OK(ferry_store_put(w->mirror, key4, d, n, NULL));
    ferry_free(d);
    ferry_subscriber_free(sub);
    ferry_model_free(m);
    if (!(sub = island(w, w->mirror, &m, 3, NULL))) return;
    CHECK_OK(ferry_subscriber_sync(sub, FERRY_SYNC_LATEST, 0, &info));
    CHECK(info.to_version == NV && models_same(m, w->steps[NV - 1]));
    CHECK(changes_match(sub, w->steps[2], m));
    ferry_subscriber_free(sub);
    ferry_model_free(m);
}

static void subscriber_cases(world *w, bool is_signed)
{
    publish(w, is_signed);
    /* 1. the chain 2..NV streamed, each version bit for bit */
    ferry_model *m;
    ferry_subscriber *sub = island(w, w->mirror, &m, 1, NULL);
    for (int v = 2; sub && v <= NV; v++) {
        ferry_sync_info info;
        CHECK_OK(ferry_subscriber_sync(sub, FERRY_SYNC_EXACT, (uint64_t)v, &info));
        CHECK(info.to_version == (uint64_t)v && info.rejected == 0);
        CHECK(models_same(m, w->steps[v - 1]));
    }
    ferry_subscriber_free(sub);
    ferry_model_free(m);

    /* 2. a corrupt delta (4) in the mirror alone: the island at 2 syncs to
     *    NV from the mirror, fetching that one object from the origin */
    char key[512];
    CHECK(delta_key(w->mirror, w->run, 4, key, sizeof key));
    tamper(w->mirror, key, flip_late);
    sub = island(w, w->mirror, &m, 2, w->origin);
    ferry_sync_info info;
    CHECK_OK(ferry_subscriber_sync(sub, FERRY_SYNC_LATEST, 0, &info));
    CHECK(info.to_version == NV && models_same(m, w->steps[NV - 1]));
    CHECK(ferry_subscriber_objects_refetched(sub) == 1);
    ferry_subscriber_free(sub);
    ferry_model_free(m);

    /* 3. the mirror alone, no way around the bad delta (the anchor is
     *    before it): the sync fails and the model is version 3 again,
     *    bit for bit (version 4's chunks were written, then put back) */
    sub = island(w, w->mirror, &m, 3, NULL);
    CHECK(ferry_subscriber_sync(sub, FERRY_SYNC_LATEST, 0, &info) != FERRY_OK);
    CHECK(models_same(m, w->steps[2]));
    CHECK(ferry_subscriber_version(sub) == 3);
    ferry_subscriber_stats ss;
    ferry_subscriber_get_stats(sub, &ss);
    fprintf(stderr, "    (corrupt delta: %s)\n", ss.last_rejection);
    CHECK(strstr(ss.last_rejection, key) != NULL);
    /* signed: the digest; unsigned: the streamed patch's own checks */
    CHECK(strstr(ss.last_rejection, is_signed ? "SHA-256" : "patch") != NULL);
    ferry_subscriber_free(sub);
    ferry_model_free(m);

    /* 4. a truncated copy, and another version's delta under its key */
    tamper(w->mirror, key, cut_tail);
    sub = island(w, w->mirror, &m, 3, NULL);
    CHECK(ferry_subscriber_sync(sub, FERRY_SYNC_LATEST, 0, &info) != FERRY_OK);
    CHECK(models_same(m, w->steps[2]));
    ferry_subscriber_get_stats(sub, &ss);
    fprintf(stderr, "    (truncated: %s)\n", ss.last_rejection);
    ferry_subscriber_free(sub);
    ferry_model_free(m);
    char k5[512];
    CHECK(delta_key(w->origin, w->run, 5, k5, sizeof k5));
    void *d = NULL;
    size_t n = 0;
    CHECK_OK(ferry_store_get(w->origin, k5, &d, &n, NULL));
    CHECK(n <= sizeof g_other);
    if (n <= sizeof g_other) {
        memcpy(g_other, d, n);
        g_other_n = n;
        tamper(w->mirror, key, swap_other);
    }
    ferry_free(d);
    sub = island(w, w->mirror, &m, 3, NULL);
    CHECK(ferry_subscriber_sync(sub, FERRY_SYNC_LATEST, 0, &info) != FERRY_OK);
    CHECK(models_same(m, w->steps[2]));
    ferry_subscriber_get_stats(sub, &ss);
    fprintf(stderr, "    (another version's delta: %s)\n", ss.last_rejection);
    CHECK(strstr(ss.last_rejection, is_signed ? "SHA-256" : "another version") != NULL);
    ferry_subscriber_free(sub);
    ferry_model_free(m);
    /* ... and with the origin as a second store, the version all the same */
    sub = island(w, w->mirror, &m, 3, w->origin);
    CHECK_OK(ferry_subscriber_sync(sub, FERRY_SYNC_LATEST, 0, &info));
    CHECK(models_same(m, w->steps[NV - 1]));
    ferry_subscriber_free(sub);
    ferry_model_free(m);
    /* 5. change lists over streamed steps, and after a failed one */
    subscriber_changes_case(w, key);
    ferry_keys_free(w->pub);
    ferry_keys_free(w->sub);
    w->pub = w->sub = NULL;
}

static void test_subscriber_s3(void)
{
    if (!s3_url()) SKIP("FERRY_TEST_S3 not set (tests/scripts/stream_s3.sh sets it)");
    SKIP_UNLESS_DATA("rl-a/step-005.safetensors");
    world w = {0};
    w.origin = open_s3("origin");
    w.mirror = open_s3("mirror");
    for (int i = 0; i < NV; i++) {
        ferry_model *s = open_step("rl-a", i);
        w.steps[i] = model_copy(s);
        ferry_model_free(s);
    }
    if (w.origin && w.mirror) {
        fprintf(stderr, "  unsigned run\n");
        subscriber_cases(&w, false);
        fprintf(stderr, "  signed run\n");
        subscriber_cases(&w, true);
    }
    for (int i = 0; i < NV; i++) ferry_model_free(w.steps[i]);
    ferry_store_free(w.origin);
    ferry_store_free(w.mirror);
}

int main(void)
{
    if (tmpdir_make(g_root, sizeof g_root, "ferry-stream-sync")) return 1;
    RUN(test_get_stream_file);
    RUN(test_get_stream_s3);
    RUN(test_get_stream_fault);
    RUN(test_get_stream_http_fault);
    RUN(test_subscriber_s3);
    rm_rf(g_root);
    return CHECK_SUMMARY();
}
#endif
