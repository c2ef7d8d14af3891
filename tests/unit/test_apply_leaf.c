/* Verification proportional to what changed (docs/FORMAT.md, "Verification
 * on apply"): after a verified ferry_apply_inplace the model keeps its leaf
 * (4 MiB block) digests; the next in-place apply of a base vouched for
 * checks the leaves its changes touch against them and reuses the others.
 * A wrong base and a wrong result must still be detected in every leaf
 * position, and the model left as the base. */
#include <stdint.h>
#include "check.h"
#include "model.h"
#include "xxhash.h"

#define LEAF_WORDS ((size_t)1 << 21) /* BF16 words per 4 MiB leaf */

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Tensors: "a" 4.5 leaves, "b" 2 leaves, "c" small and never changed. */
static const char *names[3] = {"a", "b", "c"};
static const size_t words[3] = {4 * LEAF_WORDS + LEAF_WORDS / 2, 2 * LEAF_WORDS, 4096};

static ferry_model *make(uint16_t **buf)
{
    ferry_model *m;
    if (ferry_model_create(&m)) return NULL;
    for (int i = 0; i < 3; i++) {
        uint64_t shape[1] = {words[i]};
        if (ferry_model_add(m, names[i], FERRY_BF16, 1, shape, buf[i], words[i] * 2, FERRY_ADD_COPY)) return NULL;
    }
    return m;
}

static uint16_t *tensor_words(ferry_model *m, int i) { return (uint16_t *)(uintptr_t)ferry_model_tensor(m, i)->data; }

static bool same(const ferry_model *a, const ferry_model *b)
{
    for (size_t i = 0; i < ferry_model_count(a); i++)
        if (memcmp(ferry_model_tensor(a, i)->data, ferry_model_tensor(b, i)->data, ferry_model_tensor(a, i)->nbytes)) return false;
    return true;
}

/* Changes `per` words in each leaf of tensor i from `first` on (of words[i]). */
static void change(uint16_t *w, size_t n, size_t first_leaf, size_t last_leaf, size_t per)
{
    for (size_t l = first_leaf; l <= last_leaf; l++)
        for (size_t k = 0; k < per; k++) {
            size_t at = l * LEAF_WORDS + rnd() % LEAF_WORDS;
            if (at < n) w[at] = (uint16_t)(w[at] + 1 + rnd() % 3);
        }
}

/* Replaces every copy of the 16 bytes `from` in the patch by `to`. */
static void swap_digest(uint8_t *p, size_t n, const uint8_t *from, const uint8_t *to)
{
    for (size_t i = 0; i + 16 <= n - 16; i++)
        if (!memcmp(p + i, from, 16)) memcpy(p + i, to, 16);
}

static void reseal(uint8_t *p, size_t n)
{
    XXH128_canonical_t sum;
    XXH128_canonicalFromHash(&sum, XXH3_128bits(p, n - 16));
    memcpy(p + n - 16, &sum, 16);
}

typedef struct fixture {
    ferry_model *m0, *m1, *m2;
    void *p1, *p2;
    size_t n1, n2;
    uint8_t h0[16], h1[16];
} fixture;

static void setup(fixture *f)
{
    uint16_t *buf[3];
    for (int i = 0; i < 3; i++) {
        buf[i] = malloc(words[i] * 2);
        for (size_t j = 0; j < words[i]; j++) buf[i][j] = (uint16_t)(0x3c00 + rnd() % 512);
    }
    f->m0 = make(buf);
    change(buf[0], words[0], 0, 4, 200); /* v1: every leaf of a and b */
    change(buf[1], words[1], 0, 1, 200);
    f->m1 = make(buf);
    change(buf[0], words[0], 0, 4, 200); /* v2: every leaf of a, only leaf 0 of b */
    change(buf[1], words[1], 0, 0, 200);
    f->m2 = make(buf);
    for (int i = 0; i < 3; i++) free(buf[i]);
    CHECK_OK(ferry_diff(f->m0, f->m1, NULL, &f->p1, &f->n1));
    CHECK_OK(ferry_diff(f->m1, f->m2, NULL, &f->p2, &f->n2));
    CHECK_OK(ferry_model_hash(f->m0, f->h0));
    CHECK_OK(ferry_model_hash(f->m1, f->h1));
}

static void teardown(fixture *f)
{
    ferry_model_free(f->m0);
    ferry_model_free(f->m1);
    ferry_model_free(f->m2);
    ferry_free(f->p1);
    ferry_free(f->p2);
}

/* A copy of v0 brought to v1 by a verified in-place apply: it keeps v1's
 * leaf digests. */
static ferry_model *island(fixture *f)
{
    uint16_t *buf[3];
    for (int i = 0; i < 3; i++) buf[i] = tensor_words(f->m0, i);
    ferry_model *x = make(buf);
    ferry_apply_options o = {.threads = 1, .base_hash = f->h0};
    CHECK_OK(ferry_apply_inplace_ex(x, f->p1, f->n1, &o));
    CHECK(same(x, f->m1));
    return x;
}

/* The cache is used and correct: v1 -> v2 applies, and the result's kept
 * digests are v2's (a third apply back-to-back would rely on them). */
static void test_cached_chain(void)
{
    fixture f;
    setup(&f);
    for (int th = 1; th <= 2; th++) {
        ferry_model *x = island(&f);
        ferry_apply_options o = {.threads = th, .base_hash = f.h1};
        CHECK_OK(ferry_apply_inplace_ex(x, f.p2, f.n2, &o));
        CHECK(same(x, f.m2));
        /* the kept leaf digests are the result's */
        for (int i = 0; i < 2; i++) {
            const ferry__entry *e = x->e[i];
            CHECK(e->hash_ok && e->leaf);
            for (size_t l = 0; e->leaf && l * LEAF_WORDS < words[i]; l++) {
                uint8_t d[16];
                size_t n = words[i] - l * LEAF_WORDS < LEAF_WORDS ? words[i] - l * LEAF_WORDS : LEAF_WORDS;
                ferry__block_hash(tensor_words(x, i) + l * LEAF_WORDS, n * 2, d);
                CHECK(!memcmp(d, e->leaf[l], 16));
            }
        }
        /* handing the memory out writable drops the tensor's digests */
        CHECK(ferry_model_data_mut(x, 0) != NULL);
        CHECK(!x->e[0]->hash_ok && !x->e[0]->leaf);
        ferry_model_free(x);
    }
    teardown(&f);
}

/* A wrong base: one word flipped behind the cache's back, in every leaf the
 * patch touches -> FERRY_ERR_BASE_MISMATCH, the model left as it was; and
 * without a vouched hash (the whole base hashed), in every leaf of every
 * tensor. */
static void test_wrong_base_every_leaf(void)
{
    fixture f;
    setup(&f);
    int tested = 0;
    for (int i = 0; i < 2; i++)
        for (size_t l = 0; l * LEAF_WORDS < words[i]; l++) {
            if (i == 1 && l == 1) continue; /* untouched by v1 -> v2: below */
            ferry_model *x = island(&f);
            size_t at = l * LEAF_WORDS + (rnd() % (words[i] - l * LEAF_WORDS < LEAF_WORDS ? words[i] - l * LEAF_WORDS : LEAF_WORDS));
            tensor_words(x, i)[at] ^= 0x0100;
            ferry_model *want = make((uint16_t *[3]){tensor_words(x, 0), tensor_words(x, 1), tensor_words(x, 2)});
            ferry_apply_options o = {.threads = 1 + (int)(l % 2), .base_hash = f.h1};
            CHECK_RC(ferry_apply_inplace_ex(x, f.p2, f.n2, &o), FERRY_ERR_BASE_MISMATCH);
            CHECK(same(x, want));
            /* the digests no longer vouched for are dropped */
            CHECK(!x->e[0]->hash_ok && !x->e[1]->leaf);
            ferry_model_free(want);
            ferry_model_free(x);
            tested++;
        }
    CHECK(tested == 6);
    /* no vouched hash: every leaf of every tensor, touched or not */
    for (int i = 0; i < 3; i++)
        for (size_t l = 0; l * LEAF_WORDS < words[i]; l++) {
            ferry_model *x = island(&f);
            size_t at = l * LEAF_WORDS + (words[i] < LEAF_WORDS ? words[i] / 2 : LEAF_WORDS / 2);
            if (at >= words[i]) at = words[i] - 1;
            tensor_words(x, i)[at] ^= 0x0100;
            ferry_model *want = make((uint16_t *[3]){tensor_words(x, 0), tensor_words(x, 1), tensor_words(x, 2)});
            CHECK_RC(ferry_apply_inplace(x, f.p2, f.n2), FERRY_ERR_BASE_MISMATCH);
            CHECK(same(x, want));
            ferry_model_free(want);
            ferry_model_free(x);
        }
    teardown(&f);
}

/* A wrong result in every leaf position: a patch v1 -> v2' (v2 with one
 * more word changed in that leaf) that claims v2's hashes.  Applied over a
 * cached island -> FERRY_ERR_TARGET_MISMATCH, the model left as v1, and its
 * digests still v1's (a correct patch applies next). */
static void test_wrong_result_every_leaf(void)
{
    fixture f;
    setup(&f);
    uint8_t h2[16];
    CHECK_OK(ferry_model_hash(f.m2, h2));
    for (int i = 0; i < 3; i++)
        for (size_t l = 0; l * LEAF_WORDS < words[i]; l++) {
            uint16_t *buf[3] = {tensor_words(f.m2, 0), tensor_words(f.m2, 1), tensor_words(f.m2, 2)};
            ferry_model *bad = make(buf);
            size_t at = l * LEAF_WORDS + (words[i] < LEAF_WORDS ? words[i] / 3 : LEAF_WORDS / 3);
            tensor_words(bad, i)[at] ^= 0x0001;
            void *q = NULL;
            size_t nq = 0;
            CHECK_OK(ferry_diff(f.m1, bad, NULL, &q, &nq));
            uint8_t tb[16], tg[16], hb[16];
            ferry_tensor_hash(ferry_model_tensor(bad, i), tb);
            ferry_tensor_hash(ferry_model_tensor(f.m2, i), tg);
            CHECK_OK(ferry_model_hash(bad, hb));
            swap_digest(q, nq, tb, tg);
            swap_digest(q, nq, hb, h2);
            reseal(q, nq);
            ferry_model *x = island(&f);
            ferry_apply_options o = {.threads = 1 + (int)(l % 2), .base_hash = f.h1};
            CHECK_RC(ferry_apply_inplace_ex(x, q, nq, &o), FERRY_ERR_TARGET_MISMATCH);
            CHECK(same(x, f.m1));
            CHECK_OK(ferry_apply_inplace_ex(x, f.p2, f.n2, &o));
            CHECK(same(x, f.m2));
            ferry_model_free(x);
            ferry_free(q);
            ferry_model_free(bad);
        }
    teardown(&f);
}

int main(void)
{
    RUN(test_cached_chain);
    RUN(test_wrong_base_every_leaf);
    RUN(test_wrong_result_every_leaf);
    return CHECK_SUMMARY();
}
