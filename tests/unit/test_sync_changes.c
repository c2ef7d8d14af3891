/* ferry_subscriber_changes: the per-tensor change lists of the last sync.
 * The versions are BF16 words set in code, so the words that differ from
 * one version to the next are known independently of the library: one
 * step lists exactly them (with their new values), a route of several
 * the union over its steps; a tensor changed densely, a first sync, file
 * mode report the tensor whole; a sync that changes nothing lists nothing. */
#ifdef FERRY_NO_NET /* a core-only build (make NO_NET=1) has no sync layer */
#include "helpers.h"
NOT_BUILT_MAIN("sync layer not built (NO_NET=1)")
#else
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ferry_sync.h"
#include "sync_fixture.h"

#define NT 4
/* w: sparse changes; z: never changes; d: every word changes (the delta
 * carries it whole, or the list would exceed its budget); f: F32 */
static const char *const k_names[NT] = {"a.w", "b.z", "c.d", "d.f"};
static const uint64_t k_rows[NT] = {96, 16, 1, 8}, k_cols[NT] = {512, 64, 512, 300};
static const ferry_dtype k_dt[NT] = {FERRY_BF16, FERRY_BF16, FERRY_BF16, FERRY_F32};

typedef struct ver {
    uint8_t *buf[NT];
    uint64_t n[NT];
    size_t es[NT];
} ver;

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void ver_init(ver *v, uint64_t seed)
{
    for (int k = 0; k < NT; k++) {
        v->n[k] = k_rows[k] * k_cols[k];
        v->es[k] = k_dt[k] == FERRY_F32 ? 4 : 2;
        v->buf[k] = malloc(v->n[k] * v->es[k]);
        for (uint64_t i = 0; i < v->n[k]; i++) {
            uint64_t r = splitmix(&seed);
            if (v->es[k] == 2) {
                uint16_t w = (uint16_t)(0x3c00 | (r & 0x3ff)); /* finite, ~0.01..0.03 */
                memcpy(v->buf[k] + i * 2, &w, 2);
            } else {
                uint32_t w = (uint32_t)(0x3c000000u | (r & 0x3ffffff));
                memcpy(v->buf[k] + i * 4, &w, 4);
            }
        }
    }
}

static void ver_copy(ver *dst, const ver *src)
{
    for (int k = 0; k < NT; k++) {
        dst->n[k] = src->n[k];
        dst->es[k] = src->es[k];
        dst->buf[k] = malloc(src->n[k] * src->es[k]);
        memcpy(dst->buf[k], src->buf[k], src->n[k] * src->es[k]);
    }
}

static void ver_free(ver *v)
{
    for (int k = 0; k < NT; k++) free(v->buf[k]);
}

/* The next version: about one word in 50 of a.w and d.f moved by one ulp,
 * every word of c.d; b.z as it was. */
static void ver_step(ver *v, uint64_t *rng)
{
    for (int k = 0; k < NT; k++) {
        if (k == 1) continue;
        for (uint64_t i = 0; i < v->n[k]; i++) {
            if (k != 2 && splitmix(rng) % 50) continue;
            v->buf[k][i * v->es[k]] ^= 1; /* lowest mantissa bit (little-endian) */
        }
    }
}

static ferry_model *ver_model(ver *v, bool borrow)
{
    ferry_model *m = NULL;
    ferry_model_create(&m);
    for (int k = 0; k < NT; k++) {
        uint64_t shape[2] = {k_rows[k], k_cols[k]};
        ferry_model_add(m, k_names[k], k_dt[k], 2, shape, v->buf[k], v->n[k] * v->es[k], borrow ? FERRY_ADD_BORROW : FERRY_ADD_COPY);
    }
    return m;
}

static int publish(ferry_publisher *pub, ver *v)
{
    ferry_model *m = ver_model(v, false);
    int rc = ferry_publish_ex(pub, m, 0, NULL);
    ferry_model_free(m);
    if (rc) fprintf(stderr, "publish: %s\n", ferry_last_error());
    return rc;
}

/* Positions where a and b differ in tensor k; marks them in `mark` (n flags)
 * when not NULL; returns the count. */
static size_t diff_words(const ver *a, const ver *b, int k, uint8_t *mark)
{
    size_t c = 0;
    for (uint64_t i = 0; i < a->n[k]; i++)
        if (memcmp(a->buf[k] + i * a->es[k], b->buf[k] + i * b->es[k], a->es[k])) {
            c++;
            if (mark) mark[i] = 1;
        }
    return c;
}

/* The lists of tensor k are exactly the words marked, ascending, with the
 * values `now` holds. */
static bool lists_are(ferry_subscriber *s, int k, const uint8_t *mark, const ver *now)
{
    int all = -1;
    const int64_t *pos = NULL;
    const void *vals = NULL;
    size_t n = 0, want = 0;
    if (ferry_subscriber_changes(s, (size_t)k, &all, &pos, &vals, &n) || all) return false;
    for (uint64_t i = 0; i < now->n[k]; i++) want += mark[i];
    if (n != want) {
        fprintf(stderr, "%s: %zu listed, %zu differ\n", k_names[k], n, want);
        return false;
    }
    size_t es = now->es[k];
    for (size_t j = 0; j < n; j++) {
        if (pos[j] < 0 || (uint64_t)pos[j] >= now->n[k] || !mark[pos[j]] || (j && pos[j] <= pos[j - 1])) return false;
        if (memcmp((const uint8_t *)vals + j * es, now->buf[k] + (size_t)pos[j] * es, es)) return false;
    }
    return true;
}

static int changes_all(ferry_subscriber *s, int k)
{
    int all = -1;
    size_t n = 99;
    const int64_t *pos = (const int64_t *)1;
    if (ferry_subscriber_changes(s, (size_t)k, &all, &pos, NULL, &n)) return -1;
    if (all && (n || pos)) return -1; /* whole: the lists are empty */
    return all;
}

static size_t changes_count(ferry_subscriber *s, int k)
{
    int all = -1;
    size_t n = 0;
    if (ferry_subscriber_changes(s, (size_t)k, &all, NULL, NULL, &n) || all) return SIZE_MAX;
    return n;
}

static void test_memory_mode(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    ferry_publisher *pub = NULL;
    ferry_publisher_options po = {.anchor_every = 100};
    CHECK_OK(ferry_publisher_open(st, "chg", &po, &pub));
    uint64_t rng = 7;
    ver v[6];
    ver_init(&v[1], 1);
    CHECK_OK(publish(pub, &v[1]));

    ver mine; /* the caller's buffers */
    ver_init(&mine, 99);
    ferry_model *cm = ver_model(&mine, true);
    ferry_subscriber_options so = {.model = cm};
    ferry_subscriber *s = NULL;
    CHECK_OK(ferry_subscriber_open(st, "chg", &so, &s));
    CHECK_RC(ferry_subscriber_changes(s, 0, NULL, NULL, NULL, NULL), FERRY_ERR_NOT_FOUND); /* nothing held */
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    for (int k = 0; k < NT; k++) CHECK(changes_all(s, k) == 1); /* the first sync: an anchor */
    CHECK_RC(ferry_subscriber_changes(s, NT, NULL, NULL, NULL, NULL), FERRY_ERR_ARG);

    /* one step: exactly the words that differ */
    ver_copy(&v[2], &v[1]);
    ver_step(&v[2], &rng);
    CHECK_OK(publish(pub, &v[2]));
    ferry_sync_info info;
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
    CHECK(!strcmp(info.path, "chain 1..2"));
    for (int k = 0; k < NT; k++) CHECK(!memcmp(mine.buf[k], v[2].buf[k], v[2].n[k] * v[2].es[k]));
    for (int k = 0; k < NT; k++) {
        uint8_t *mark = calloc(v[2].n[k], 1);
        size_t nd = diff_words(&v[1], &v[2], k, mark);
        if (k == 2) CHECK(nd == v[2].n[k] && changes_all(s, k) == 1);
        else if (k == 1) CHECK(nd == 0 && changes_all(s, k) == 0 && changes_count(s, k) == 0);
        else CHECK(nd > 0 && lists_are(s, k, mark, &v[2]));
        free(mark);
    }

    /* nothing new: nothing listed */
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    for (int k = 0; k < NT; k++) CHECK(changes_all(s, k) == 0 && changes_count(s, k) == 0);

    /* a route of three versions, one word of a.w changed and changed
     * back: the union of the steps' words (a superset of v2 -> v5's) */
    for (int i = 3; i <= 5; i++) {
        ver_copy(&v[i], &v[i - 1]);
        ver_step(&v[i], &rng);
        if (i == 3) v[i].buf[0][2 * 12345] ^= 0x10;
        if (i == 4) v[i].buf[0][2 * 12345] ^= 0x10;
        CHECK_OK(publish(pub, &v[i]));
    }
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
    CHECK(!strcmp(info.path, "chain 2..5") && info.steps == 3);
    for (int k = 0; k < NT; k++) {
        if (k == 2) {
            CHECK(changes_all(s, k) == 1);
            continue;
        }
        uint8_t *mark = calloc(v[5].n[k], 1), *net = calloc(v[5].n[k], 1);
        for (int i = 3; i <= 5; i++) diff_words(&v[i - 1], &v[i], k, mark);
        size_t nnet = diff_words(&v[2], &v[5], k, net);
        CHECK(lists_are(s, k, mark, &v[5]));
        if (k == 0) CHECK(mark[12345] && !net[12345] && changes_count(s, k) > nnet);
        free(mark);
        free(net);
    }
    ferry_subscriber_free(s);
    ferry_model_free(cm);
    ver_free(&mine);

    /* file mode builds the model aside: every tensor whole */
    char path[600];
    snprintf(path, sizeof path, "%s/chg.safetensors", dir);
    ferry_subscriber_options fo = {.path = path};
    CHECK_OK(ferry_subscriber_open(st, "chg", &fo, &s));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 4, NULL));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    for (int k = 0; k < NT; k++) CHECK(changes_all(s, k) == 1);
    ferry_subscriber_free(s);

    /* private mode: once the library's model is its own (writable), lists */
    CHECK_OK(ferry_subscriber_open(st, "chg", NULL, &s));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 2, NULL));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 3, NULL));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 4, NULL));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 5, NULL));
    {
        uint8_t *mark = calloc(v[5].n[0], 1);
        diff_words(&v[4], &v[5], 0, mark);
        CHECK(lists_are(s, 0, mark, &v[5]));
        free(mark);
    }
    ferry_subscriber_free(s);

    ferry_publisher_free(pub);
    ferry_store_free(st);
    ver_free(&v[1]);
    for (int i = 2; i <= 5; i++) ver_free(&v[i]);
}

int main(void)
{
    if (fixture_root("sync-changes")) return 1;
    RUN(test_memory_mode);
    rm_rf(g_root);
    return CHECK_SUMMARY();
}
#endif
