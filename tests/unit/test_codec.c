/* Patch codec: lossless round trips on real checkpoints and on every dtype,
 * structure changes, verified in-place apply, and rejection of wrong bases
 * and damaged patches. */
#include <math.h>
#include <stdint.h>
#include <unistd.h>
#include "check.h"
#include "helpers.h"
#include "model.h"
#include "codec/patch.h"
#include "codec/sparse.h"
#include "codec/undo.h"
#include "xxhash.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static bool same_model(const ferry_model *a, const ferry_model *b)
{
    uint8_t ha[16], hb[16];
    if (ferry_model_hash(a, ha) || ferry_model_hash(b, hb)) return false;
    return memcmp(ha, hb, 16) == 0;
}

/* diff a->b, apply (copy and in place when possible), compare to b. */
static void round_trip(const ferry_model *a, const ferry_model *b, size_t *patch_size)
{
    void *p = NULL;
    size_t n = 0;
    ferry_model *out = NULL;
    CHECK_OK(ferry_diff(a, b, NULL, &p, &n));
    CHECK_OK(ferry_apply(a, p, n, &out));
    CHECK(out && same_model(out, b));
    ferry_patch_info *pi = NULL;
    CHECK_OK(ferry_patch_inspect(p, n, &pi));
    CHECK(ferry_patch_info_format(pi) >= 1 && ferry_patch_info_format(pi) <= 3); /* 2: codec 3, 3: codec 4 in use */
    ferry_patch_info_free(pi);
    ferry_model *c = model_copy(a);
    int rc = ferry_apply_inplace(c, p, n);
    CHECK(rc == FERRY_OK || rc == FERRY_ERR_SHAPE_MISMATCH);
    if (rc == FERRY_OK) CHECK(same_model(c, b));
    else CHECK(same_model(c, a)); /* refused: untouched */
    if (patch_size) *patch_size = n;
    ferry_model_free(c);
    ferry_model_free(out);
    ferry_free(p);
}

static void consecutive_pair(ferry_model *a, ferry_model *b, int i, void *ctx)
{
    (void)i, (void)ctx;
    size_t n = 0;
    round_trip(a, b, &n);
    /* lossless and small: well under 10% of the BF16 bytes */
    CHECK(n > 0 && n < ferry_model_nbytes(b) / 10);
}

static void test_real_consecutive(void) { each_real_pair(1, consecutive_pair, NULL); }

static void test_real_far_pairs(void)
{
    SKIP_UNLESS_DATA("rl-a");
    SKIP_UNLESS_DATA("rl-b");
    ferry_model *a = open_step("rl-a", 0), *b = open_step("rl-a", 8);
    if (a && b) {
        round_trip(a, b, NULL);
        round_trip(b, a, NULL); /* backwards too */
    }
    ferry_model_free(a);
    ferry_model_free(b);
    a = open_step("rl-b", 0);
    b = open_step("rl-b", 4);
    if (a && b) round_trip(a, b, NULL);
    ferry_model_free(a);
    ferry_model_free(b);
}

/* A tensor of dtype dt with random words and a copy with sparse changes:
 * small deltas, sign crossings, special values and arbitrary new words. */
static void add_pair(ferry_model *a, ferry_model *b, const char *name, ferry_dtype dt, uint64_t nelem, double rate)
{
    uint64_t nbytes = nelem * ferry_dtype_bits(dt) / 8;
    uint8_t *x = malloc(nbytes ? nbytes : 1), *y = malloc(nbytes ? nbytes : 1);
    for (uint64_t i = 0; i < nbytes; i++) x[i] = (uint8_t)rnd();
    memcpy(y, x, nbytes);
    unsigned wb = ferry_dtype_bits(dt) >= 8 ? ferry_dtype_bits(dt) / 8 : 1;
    for (uint64_t w = 0; w < nbytes / wb; w++) {
        if ((double)(rnd() % 1000000) / 1e6 >= rate) continue;
        uint8_t *p = y + w * wb;
        switch (rnd() % 4) {
        case 0: p[0] ^= 1; break;                              /* low bit */
        case 1: p[0] = (uint8_t)(p[0] + 1 + rnd() % 3); break; /* small step, may carry */
        case 2: p[wb - 1] ^= 0x80; break;                      /* sign flip */
        default: for (unsigned k = 0; k < wb; k++) p[k] = (uint8_t)rnd();
        }
    }
    uint64_t shape[2] = {nelem / 4, 4};
    uint32_t nd = nelem % 4 == 0 ? 2 : 1;
    if (nd == 1) shape[0] = nelem;
    CHECK_OK(ferry_model_add(a, name, dt, nd, shape, x, nbytes, FERRY_ADD_COPY));
    CHECK_OK(ferry_model_add(b, name, dt, nd, shape, y, nbytes, FERRY_ADD_COPY));
    free(x);
    free(y);
}

static void test_every_dtype(void)
{
    ferry_model *a, *b;
    CHECK_OK(ferry_model_create(&a));
    CHECK_OK(ferry_model_create(&b));
    for (int dt = 0; dt < FERRY_DTYPE_COUNT; dt++) {
        char name[64];
        snprintf(name, sizeof name, "t.%s", ferry_dtype_name((ferry_dtype)dt));
        uint64_t n = (dt == FERRY_F6_E2M3 || dt == FERRY_F6_E3M2) ? 4000 : 4096;
        add_pair(a, b, name, (ferry_dtype)dt, n, dt % 3 == 0 ? 0.6 : 0.02);
    }
    round_trip(a, b, NULL);
    ferry_model_free(a);
    ferry_model_free(b);
}

static void test_special_bf16_values(void)
{
    /* +0/-0, infinities, NaNs, subnormals and max-magnitude deltas */
    static const uint16_t x[] = {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x8001, 0x7F7F, 0xFF7F, 0x3F80};
    static const uint16_t y[] = {0x8000, 0x0000, 0x7FC0, 0x7F80, 0xFFFF, 0x8001, 0x0001, 0xFF7F, 0x7F7F, 0xBF80};
    ferry_model *a, *b;
    uint64_t sh[1] = {10};
    CHECK_OK(ferry_model_create(&a));
    CHECK_OK(ferry_model_create(&b));
    CHECK_OK(ferry_model_add(a, "w", FERRY_BF16, 1, sh, x, sizeof x, 0));
    CHECK_OK(ferry_model_add(b, "w", FERRY_BF16, 1, sh, y, sizeof y, 0));
    round_trip(a, b, NULL);
    ferry_model_free(a);
    ferry_model_free(b);
}

static void test_structure_changes(void)
{
    ferry_model *a, *b;
    CHECK_OK(ferry_model_create(&a));
    CHECK_OK(ferry_model_create(&b));
    add_pair(a, b, "kept", FERRY_BF16, 1024, 0.05);
    uint16_t v[12] = {0};
    uint64_t s34[2] = {3, 4}, s43[2] = {4, 3}, s12[1] = {12};
    CHECK_OK(ferry_model_add(a, "gone", FERRY_BF16, 2, s34, v, 24, 0));
    CHECK_OK(ferry_model_add(b, "new", FERRY_F16, 1, s12, v, 24, 0));
    CHECK_OK(ferry_model_add(a, "reshaped", FERRY_BF16, 2, s34, v, 24, 0));
    CHECK_OK(ferry_model_add(b, "reshaped", FERRY_BF16, 2, s43, v, 24, 0));
    CHECK_OK(ferry_model_add(a, "retyped", FERRY_BF16, 1, s12, v, 24, 0));
    CHECK_OK(ferry_model_add(b, "retyped", FERRY_F16, 1, s12, v, 24, 0));
    CHECK_OK(ferry_model_add(a, "scalar", FERRY_F32, 0, NULL, v, 4, 0));
    CHECK_OK(ferry_model_add(b, "scalar", FERRY_F32, 0, NULL, v + 2, 4, 0));
    uint64_t s0[1] = {0};
    CHECK_OK(ferry_model_add(a, "empty", FERRY_BF16, 1, s0, NULL, 0, 0));
    CHECK_OK(ferry_model_add(b, "empty", FERRY_BF16, 1, s0, NULL, 0, 0));
    CHECK_OK(ferry_model_set_metadata(a, "format", "pt"));
    CHECK_OK(ferry_model_set_metadata(b, "format", "pt"));
    CHECK_OK(ferry_model_set_metadata(b, "step", "7"));
    round_trip(a, b, NULL);
    round_trip(b, a, NULL);
    /* empty models both ways */
    ferry_model *e;
    CHECK_OK(ferry_model_create(&e));
    round_trip(e, a, NULL);
    round_trip(a, e, NULL);
    round_trip(e, e, NULL);
    ferry_model_free(e);
    ferry_model_free(a);
    ferry_model_free(b);
}

static void test_multi_chunk(void)
{
    /* larger than one 2^22-word chunk */
    ferry_model *a, *b;
    CHECK_OK(ferry_model_create(&a));
    CHECK_OK(ferry_model_create(&b));
    add_pair(a, b, "big", FERRY_BF16, (1u << 22) + 12345, 0.01);
    round_trip(a, b, NULL);
    ferry_model_free(a);
    ferry_model_free(b);
}

static void reseal(uint8_t *p, size_t n)
{
    XXH128_canonical_t sum;
    XXH128_canonicalFromHash(&sum, XXH3_128bits(p, n - 16));
    memcpy(p + n - 16, &sum, 16);
}

/* Chunks with many changes take the rANS coder (codec 3 and format
 * version 2 from 32768 changes; codec 2 only read): every word width,
 * with deltas of every size, and the portable and vectorised kernels must
 * write identical bytes. */
static void rans_every_width(size_t n, unsigned want_version)
{
    ferry_model *a, *b;
    CHECK_OK(ferry_model_create(&a));
    CHECK_OK(ferry_model_create(&b));
    const ferry_dtype dts[] = {FERRY_BF16, FERRY_F16, FERRY_I16, FERRY_F32, FERRY_U32, FERRY_F64, FERRY_I64, FERRY_U8, FERRY_F8_E4M3};
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "r.%s", ferry_dtype_name(dts[i]));
        add_pair(a, b, name, dts[i], n, 0.4); /* 0.4 n changes */
    }
    /* every kernel level: AVX-512 (where the CPU has it), AVX2, portable */
    static const char *const levels[] = {"0", "avx512", "1"};
    void *p1 = NULL;
    size_t n1 = 0;
    for (int l = 0; l < 3; l++) {
        setenv("FERRY_NO_SIMD", levels[l], 1);
        void *p2;
        size_t n2;
        CHECK_OK(ferry_diff(a, b, NULL, &p2, &n2));
        if (l == 0) {
            p1 = p2;
            n1 = n2;
        } else {
            CHECK(n1 == n2 && memcmp(p1, p2, n1) == 0);
            ferry_free(p2);
        }
        ferry_model *o = NULL;
        CHECK_OK(ferry_apply(a, p1, n1, &o));
        CHECK(o && same_model(o, b));
        ferry_model_free(o);
    }
    unsetenv("FERRY_NO_SIMD");
    ferry_patch_info *pi = NULL;
    CHECK_OK(ferry_patch_inspect(p1, n1, &pi));
    CHECK(ferry_patch_info_format(pi) == want_version);
    ferry_patch_info_free(pi);
    if (want_version == 2) { /* codec 3 is corrupt in a version-1 patch */
        uint8_t *v1 = malloc(n1);
        memcpy(v1, p1, n1);
        ferry__put32(v1 + 8, 1);
        reseal(v1, n1);
        ferry_model *o = NULL;
        CHECK(ferry_apply(a, v1, n1, &o) == FERRY_ERR_PATCH_CORRUPT && o == NULL);
        CHECK(strstr(ferry_last_error(), "unknown chunk codec") != NULL);
        free(v1);
    }
    round_trip(a, b, NULL);
    /* damage behind a valid checksum reaches the rANS decoder: it must fail
     * cleanly or, by chance, still produce exactly b; and every kernel
     * level must answer the same, down to the error message */
    uint8_t *q = malloc(n1);
    for (int r = 0; r < 150; r++) {
        memcpy(q, p1, n1);
        size_t at = 64 + rnd() % (n1 - 80);
        q[at] ^= (uint8_t)(1u << (rnd() % 8));
        reseal(q, n1);
        int rc0 = 0;
        char msg0[512] = "";
        for (int l = 0; l < 3; l++) {
            setenv("FERRY_NO_SIMD", levels[l], 1);
            ferry_model *o3 = NULL;
            int rc = ferry_apply(a, q, n1, &o3);
            if (rc == FERRY_OK) CHECK(same_model(o3, b));
            else CHECK(o3 == NULL);
            ferry_model_free(o3);
            if (l == 0) {
                rc0 = rc;
                snprintf(msg0, sizeof msg0, "%s", rc ? ferry_last_error() : "");
            } else {
                CHECK(rc == rc0);
                if (rc && rc == rc0 && strcmp(msg0, ferry_last_error())) {
                    fprintf(stderr, "  level %s: '%s' vs '%s'\n", levels[l], ferry_last_error(), msg0);
                    CHECK(0);
                }
            }
        }
    }
    unsetenv("FERRY_NO_SIMD");
    free(q);
    ferry_free(p1);
    ferry_model_free(a);
    ferry_model_free(b);
}

/* The codec a chunk gets: by its number of changes, with codec 3 from
 * 8192 changes in a tensor of several chunks (its small last chunk) and
 * from 32768 otherwise; every choice decodes to the target. */
static void test_chunk_codec_choice(void)
{
    enum { N = 40000 };
    static sp_coder enc, dec;
    uint16_t *x = malloc(2 * N), *y = malloc(2 * N);
    for (int i = 0; i < N; i++) x[i] = y[i] = (uint16_t)(0x3C00 + rnd() % 0x800); /* BF16 around 2^-7 .. 1 */
    size_t want = 0;
    for (int i = 0; i < N; i++)
        if (rnd() % 4 == 0) { y[i] ^= 1; want++; } /* ~10000 changes */
    for (int part = 0; part < 2; part++) {
        sp_dtype t = sp_dtype_of(FERRY_BF16);
        ferry_buf out = {0};
        uint64_t changed = 0;
        uint8_t bh[4][16];
        sp_src src = {(const uint8_t *)y, 0};
        CHECK_OK(ferry__codec_encode_chunk(&t, (const uint8_t *)x, &src, N, part, &enc, &out, &changed, bh));
        /* codec 4, or codec 1 where that came out smaller */
        CHECK(changed == want && out.size > 0 &&
              (part ? out.data[0] == SP_CODEC_RANS32 : out.data[0] == SP_CODEC_COUNTED || out.data[0] == SP_CODEC_ADAPTIVE));
        size_t k = 0;
        CHECK_OK(ferry__codec_decode_chunk(&t, (const uint8_t *)x, N, out.data, out.size, 3, &dec, &k));
        CHECK(k == want);
        for (size_t j = 0; j < k && j < want; j++) CHECK(dec.s.val[j] == y[dec.s.pos[j]] && x[dec.s.pos[j]] != y[dec.s.pos[j]]);
        free(out.data);
    }
    ferry__codec_coder_release(&enc);
    ferry__codec_coder_release(&dec);
    free(x);
    free(y);
}

/* Codec 4 on a sparse chunk shaped like an RL step at a low learning rate
 * (weights ~ N(0, 0.02), flips more likely the smaller |w|, +-1 ULP): the
 * encoder picks it, it is smaller than codec 1 on the same chunk, it
 * decodes exactly, and a version-2 reader refuses it.  Then codec 4 forced
 * on every word width round-trips. */
static void test_counted_codec(void)
{
    enum { N = 1 << 18 };
    static sp_coder enc, dec;
    uint16_t *x = malloc(2 * N), *y = malloc(2 * N);
    size_t want = 0;
    for (int i = 0; i < N; i++) {
        double u1 = ((rnd() >> 11) + 1.0) / 9007199254740993.0, u2 = (rnd() >> 11) / 9007199254740992.0;
        float w = (float)(0.02 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
        uint32_t bits;
        memcpy(&bits, &w, 4);
        x[i] = y[i] = (uint16_t)(bits >> 16);
        if (rnd() % 1000000 < (uint64_t)(2e-5 / (fabs(w) + 1e-4) * 1e6)) { /* ~0.5% of words */
            y[i] = (uint16_t)(x[i] + ((rnd() & 1) ? 1 : -1));
            want += y[i] != x[i];
        }
    }
    sp_dtype t = sp_dtype_of(FERRY_BF16);
    sp_src src = {(const uint8_t *)y, 0};
    uint8_t bh[4][16];
    ferry_buf chosen = {0}, one = {0};
    uint64_t changed = 0;
    CHECK_OK(ferry__codec_encode_chunk(&t, (const uint8_t *)x, &src, N, false, &enc, &chosen, &changed, bh));
    CHECK(changed == want && want > 100 && want < 4000 && chosen.data[0] == SP_CODEC_COUNTED);
    CHECK_OK(ferry__codec_encode_chunk_as(SP_CODEC_ADAPTIVE, &t, (const uint8_t *)x, &src, N, &enc, &one, &changed, bh));
    CHECK(one.data[0] == SP_CODEC_ADAPTIVE && chosen.size < one.size);
    fprintf(stderr, "     %zu changes of %d words: codec 4 %zu bytes, codec 1 %zu\n", want, N, chosen.size, one.size);
    size_t k = 0;
    CHECK_OK(ferry__codec_decode_chunk(&t, (const uint8_t *)x, N, chosen.data, chosen.size, 3, &dec, &k));
    CHECK(k == want);
    for (size_t j = 0; j < k && j < want; j++) CHECK(dec.s.val[j] == y[dec.s.pos[j]] && x[dec.s.pos[j]] != y[dec.s.pos[j]]);
    CHECK(ferry__codec_decode_chunk(&t, (const uint8_t *)x, N, chosen.data, chosen.size, 2, &dec, &k) == FERRY_ERR_PATCH_CORRUPT);
    free(chosen.data);
    free(one.data);
    static const ferry_dtype dts[] = {FERRY_U8, FERRY_BF16, FERRY_F32, FERRY_F64, FERRY_I16};
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
        t = sp_dtype_of(dts[d]);
        size_t w = t.W / 8, n = 5000;
        uint8_t *a = malloc(n * w), *b = malloc(n * w);
        for (size_t i = 0; i < n * w; i++) a[i] = (uint8_t)rnd();
        memcpy(b, a, n * w);
        for (size_t i = 0; i < n; i += 1 + rnd() % 300) b[i * w] ^= 1;
        ferry_buf out = {0};
        sp_src sb = {b, 0};
        CHECK_OK(ferry__codec_encode_chunk_as(SP_CODEC_COUNTED, &t, a, &sb, n, &enc, &out, &changed, bh));
        CHECK(out.data[0] == SP_CODEC_COUNTED);
        CHECK_OK(ferry__codec_decode_chunk(&t, a, n, out.data, out.size, 3, &dec, &k));
        CHECK(k == changed);
        for (size_t j = 0; j < k; j++) CHECK(sp_load(b, dec.s.pos[j], t.W) == dec.s.val[j]);
        free(out.data);
        free(a);
        free(b);
    }
    ferry__codec_coder_release(&enc);
    ferry__codec_coder_release(&dec);
    free(x);
    free(y);
}

/* The walk (positions from class ranks) at every kernel level: the GFNI
 * walk (classes of a step in vector lanes; its one-store path for steps of
 * up to 16 changes and its four-store path), the AVX-512 walk before it
 * (FERRY_NO_GFNI=1), AVX2 and portable.  BF16 and F16 chunks of weights
 * ~ N(0, 0.02) with runs of one exponent (a class holding all 64 words of a
 * step: the second gather), at densities from 0.3% to 60% (the dense
 * chunks' four-store path), a length that is not a multiple of 64 (the
 * tail); every codec that walks; each level must give the positions and
 * words of the changes exactly, and damaged chunks the same answer (error
 * message included) at every level. */
static void test_walk_levels(void)
{
    static const char *const simd[] = {"0", "0", "avx512", "1"}, *const gfni[] = {"0", "1", "1", "1"};
    static sp_coder enc, dec;
    static const double rates[] = {0.003, 0.04, 0.2, 0.6};
    static const unsigned codecs[] = {SP_CODEC_ADAPTIVE, SP_CODEC_COUNTED, SP_CODEC_RANS32};
    const size_t n = 200000 + 37;
    uint16_t *x = malloc(2 * n), *y = malloc(2 * n);
    uint32_t *pos = malloc(4 * n);
    uint64_t *val = malloc(8 * n);
    uint8_t *q = NULL;
    for (int dt = 0; dt < 2; dt++) {
        sp_dtype t = sp_dtype_of(dt ? FERRY_F16 : FERRY_BF16);
        for (size_t r = 0; r < sizeof rates / sizeof *rates; r++) {
            size_t want = 0;
            for (size_t i = 0; i < n; i++) {
                double u1 = ((rnd() >> 11) + 1.0) / 9007199254740993.0, u2 = (rnd() >> 11) / 9007199254740992.0;
                float w = (float)(0.02 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
                /* runs of one exponent, whose class count before them is not a multiple of 8 */
                if ((i / 4096) % 5 == 3 || rnd() % 1000 == 0) w = 0.5f + (float)(rnd() % 1000) * 1e-4f;
                uint32_t bits;
                memcpy(&bits, &w, 4);
                /* F16: the float's sign, its exponent moved to F16's bias (clamped), 10 mantissa bits */
                int e16 = (int)((bits >> 23) & 0xFF) - 127 + 15;
                e16 = e16 < 1 ? 1 : e16 > 30 ? 30 : e16;
                x[i] = dt ? (uint16_t)((bits >> 16 & 0x8000) | (uint32_t)e16 << 10 | (bits >> 13 & 0x3FF)) : (uint16_t)(bits >> 16);
                y[i] = x[i];
                if ((double)(rnd() % 1000000) / 1e6 < rates[r]) y[i] = (uint16_t)(x[i] + 1 + rnd() % 3);
                if (y[i] != x[i]) pos[want] = (uint32_t)i, val[want++] = y[i];
            }
            for (size_t cc = 0; cc < sizeof codecs / sizeof *codecs; cc++) {
                if (codecs[cc] == SP_CODEC_COUNTED && want >= 32768) continue;
                ferry_buf out = {0};
                uint64_t changed = 0;
                uint8_t bh[4][16];
                sp_src src = {(const uint8_t *)y, 0};
                CHECK_OK(ferry__codec_encode_chunk_as(codecs[cc], &t, (const uint8_t *)x, &src, n, &enc, &out, &changed, bh));
                CHECK(changed == want && out.data[0] == codecs[cc]);
                for (int l = 0; l < 4; l++) {
                    setenv("FERRY_NO_SIMD", simd[l], 1);
                    setenv("FERRY_NO_GFNI", gfni[l], 1);
                    size_t k = 0;
                    CHECK_OK(ferry__codec_decode_chunk(&t, (const uint8_t *)x, n, out.data, out.size, 3, &dec, &k));
                    CHECK(k == want);
                    size_t bad = 0;
                    for (size_t j = 0; j < k && j < want; j++) bad += dec.s.pos[j] != pos[j] || dec.s.val[j] != val[j];
                    CHECK(bad == 0);
                }
                /* damage: every level answers alike */
                q = realloc(q, out.size);
                for (int d = 0; d < 40; d++) {
                    memcpy(q, out.data, out.size);
                    size_t at = 1 + rnd() % (out.size - 1);
                    q[at] ^= (uint8_t)(1u << (rnd() % 8));
                    int rc0 = 0;
                    size_t k0 = 0;
                    char msg0[512] = "";
                    uint64_t h0 = 0;
                    for (int l = 0; l < 4; l++) {
                        setenv("FERRY_NO_SIMD", simd[l], 1);
                        setenv("FERRY_NO_GFNI", gfni[l], 1);
                        size_t k = 0;
                        int rc = ferry__codec_decode_chunk(&t, (const uint8_t *)x, n, q, out.size, 3, &dec, &k);
                        uint64_t h = rc ? 0 : XXH3_64bits(dec.s.pos, 4 * k) ^ XXH3_64bits(dec.s.val, 8 * k);
                        if (l == 0) {
                            rc0 = rc, k0 = k, h0 = h;
                            snprintf(msg0, sizeof msg0, "%s", rc ? ferry_last_error() : "");
                        } else {
                            CHECK(rc == rc0 && (rc || (k == k0 && h == h0)));
                            if (rc && strcmp(msg0, ferry_last_error())) {
                                fprintf(stderr, "  level %d: '%s' vs '%s'\n", l, ferry_last_error(), msg0);
                                CHECK(0);
                            }
                        }
                    }
                }
                free(out.data);
            }
        }
    }
    unsetenv("FERRY_NO_SIMD");
    unsetenv("FERRY_NO_GFNI");
    ferry__codec_coder_release(&enc);
    ferry__codec_coder_release(&dec);
    free(q);
    free(x);
    free(y);
    free(pos);
    free(val);
}

/* 60000 changes in one chunk: codec 3 (format version 2) since every
 * chunk that takes rANS takes its vector lanes; codec 2 is still read
 * (test_rans2_forced, tests/golden/v1). */
static void test_rans_every_width(void) { rans_every_width(150000, 2); }

/* Codec 2, which ferry no longer chooses but still reads: forced on a
 * chunk of every word width, decoded at every kernel level to exactly the
 * changed words. */
static void test_rans2_forced(void)
{
    static sp_coder enc, dec;
    static const ferry_dtype dts[] = {FERRY_BF16, FERRY_F16, FERRY_I16, FERRY_F32, FERRY_U32, FERRY_F64, FERRY_U8, FERRY_F8_E4M3};
    static const char *const levels[] = {"0", "avx512", "1"};
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
        sp_dtype t = sp_dtype_of(dts[d]);
        size_t w = t.W / 8, n = 150000;
        uint8_t *a = malloc(n * w), *b = malloc(n * w);
        for (size_t i = 0; i < n * w; i++) a[i] = (uint8_t)rnd();
        memcpy(b, a, n * w);
        for (size_t i = 0; i < n; i++)
            if (rnd() % 10 < 4) b[i * w + (rnd() % 3 ? 0 : w - 1)] ^= (uint8_t)(1u << (rnd() % 8));
        ferry_buf out = {0};
        sp_src sb = {b, 0};
        uint8_t bh[4][16];
        uint64_t changed = 0;
        CHECK_OK(ferry__codec_encode_chunk_as(SP_CODEC_RANS, &t, a, &sb, n, &enc, &out, &changed, bh));
        CHECK(out.data[0] == SP_CODEC_RANS && changed > 32768);
        for (int l = 0; l < 3; l++) {
            setenv("FERRY_NO_SIMD", levels[l], 1);
            size_t k = 0;
            CHECK_OK(ferry__codec_decode_chunk(&t, a, n, out.data, out.size, 1, &dec, &k));
            CHECK(k == changed);
            for (size_t j = 0; j < k; j++) CHECK(sp_load(b, dec.s.pos[j], t.W) == dec.s.val[j] && (j == 0 || dec.s.pos[j] > dec.s.pos[j - 1]));
        }
        unsetenv("FERRY_NO_SIMD");
        free(out.data);
        free(a);
        free(b);
    }
    ferry__codec_coder_release(&enc);
    ferry__codec_coder_release(&dec);
}

/* In-place applies keep their undo log and decoder scratch for the next
 * one (decode.c): a later apply of another size, into another model, with
 * the stale bytes of the last one in that memory, must still give its
 * target, and put its base back exactly when it fails; and an undo record
 * (which keeps its log) must still revert after other applies used the
 * kept memory. */
static void test_inplace_reuse(void)
{
    ferry_model *a1, *b1, *a2, *b2;
    CHECK_OK(ferry_model_create(&a1));
    CHECK_OK(ferry_model_create(&b1));
    CHECK_OK(ferry_model_create(&a2));
    CHECK_OK(ferry_model_create(&b2));
    add_pair(a1, b1, "big", FERRY_BF16, (1u << 22) + 99, 0.2);  /* a 3.4 MB log */
    add_pair(a1, b1, "small", FERRY_BF16, 5000, 0.05);
    add_pair(a2, b2, "other", FERRY_BF16, (1u << 23) + 5, 0.12); /* a larger log: replaces the kept one */
    add_pair(a2, b2, "tail", FERRY_F32, 4000, 0.3);
    void *p1, *p2;
    size_t n1, n2;
    CHECK_OK(ferry_diff(a1, b1, NULL, &p1, &n1));
    CHECK_OK(ferry_diff(a2, b2, NULL, &p2, &n2));
    uint8_t *q2 = malloc(n2);
    memcpy(q2, p2, n2);
    q2[n2 - 16 - 20] ^= 0x10; /* the last tensor's payload: the big tensor is written first */
    reseal(q2, n2);
    for (int round = 0; round < 3; round++) {
        for (int th = 1; th <= 2; th++) {
            ferry_apply_options o = {.threads = th};
            ferry_model *c1 = model_copy(a1), *c2 = model_copy(a2);
            CHECK_OK(ferry_apply_inplace_ex(c1, p1, n1, &o));
            CHECK(same_model(c1, b1));
            CHECK(ferry_apply_inplace_ex(c2, q2, n2, &o) != FERRY_OK);
            CHECK(same_model(c2, a2));
            CHECK_OK(ferry_apply_inplace_ex(c2, p2, n2, &o));
            CHECK(same_model(c2, b2));
            ferry_model_free(c1);
            c1 = model_copy(a1);
            CHECK(ferry_apply_inplace_ex(c1, p2, n2, &o) == FERRY_ERR_BASE_MISMATCH);
            CHECK(same_model(c1, a1));
            ferry_model_free(c1);
            ferry_model_free(c2);
        }
        /* records: a1 -> b1 kept, then other applies, then revert */
        ferry_model *c = model_copy(a1);
        ferry__codec_undo *r = NULL;
        CHECK_OK(ferry__codec_apply_inplace_undo(c, p1, n1, NULL, &r));
        CHECK(r != NULL && same_model(c, b1));
        ferry_model *c2 = model_copy(a2);
        CHECK_OK(ferry_apply_inplace_ex(c2, p2, n2, NULL));
        CHECK(same_model(c2, b2));
        ferry__codec_undo_revert(r);
        CHECK(same_model(c, a1));
        ferry__codec_undo_free(r);
        ferry_model_free(c);
        ferry_model_free(c2);
    }
    free(q2);
    ferry_free(p1);
    ferry_free(p2);
    ferry_model_free(a1);
    ferry_model_free(b1);
    ferry_model_free(a2);
    ferry_model_free(b2);
}
static void test_rans32_every_width(void) { rans_every_width(400000, 2); }

/* Threads change nothing in the bytes; a vouched base hash skips hashing
 * the base but still verifies the result. */
static void test_threads_and_known_hash(void)
{
    SKIP_UNLESS_DATA("rl-a");
    ferry_model *a = open_step("rl-a", 3), *b = open_step("rl-a", 4);
    if (!a || !b) { CHECK(0); return; }
    void *p1, *p2;
    size_t n1, n2;
    uint8_t ha[16];
    CHECK_OK(ferry_model_hash(a, ha));
    ferry_diff_options o = {.threads = 3, .base_hash = ha};
    CHECK_OK(ferry_diff(a, b, NULL, &p1, &n1));
    CHECK_OK(ferry_diff(a, b, &o, &p2, &n2));
    CHECK(n1 == n2 && memcmp(p1, p2, n1) == 0);
    ferry_apply_options ao = {.threads = 2, .base_hash = ha};
    ferry_model *out = NULL;
    CHECK_OK(ferry_apply_ex(a, p1, n1, &ao, &out));
    CHECK(out && same_model(out, b));
    ferry_model_free(out);
    out = NULL;
    uint8_t wrong[16] = {1};
    ao.base_hash = wrong;
    CHECK_RC(ferry_apply_ex(a, p1, n1, &ao, &out), FERRY_ERR_BASE_MISMATCH);
    ferry_free(p1);
    ferry_free(p2);
    ferry_model_free(a);
    ferry_model_free(b);
}

/* The FP32 gate: diffing masters with cast_bf16 is exactly diffing their
 * BF16 cast (PyTorch's rounding). */
static void test_fp32_gate(void)
{
    SKIP_UNLESS_DATA("rl-a");
    char path[512];
    ferry_model *a = open_step("rl-a", 1), *m = NULL, *cast = NULL;
    CHECK_OK(ferry_model_open(data_path(path, sizeof path, "rl-a/master-002.safetensors"), &m));
    if (!a || !m) return;
    CHECK_OK(ferry_model_create(&cast));
    for (size_t i = 0; i < ferry_model_count(m); i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        uint16_t *bf = malloc(t->nelem * 2 + 1);
        ferry_f32_to_bf16_n(bf, t->data, t->nelem);
        CHECK_OK(ferry_model_add(cast, t->name, FERRY_BF16, t->ndim, t->shape, bf, t->nelem * 2, FERRY_ADD_COPY));
        free(bf);
    }
    for (size_t i = 0; i < ferry_model_metadata_count(m); i++) {
        const char *k, *v;
        ferry_model_metadata(m, i, &k, &v);
        ferry_model_set_metadata(cast, k, v);
    }
    void *p1, *p2;
    size_t n1, n2;
    ferry_diff_options o = {.cast_bf16 = 1, .threads = 2};
    CHECK_OK(ferry_diff(a, m, &o, &p1, &n1));
    CHECK_OK(ferry_diff(a, cast, NULL, &p2, &n2));
    CHECK(n1 == n2 && memcmp(p1, p2, n1) == 0);
    ferry_model *out = NULL, *step2 = open_step("rl-a", 2);
    CHECK_OK(ferry_apply(a, p1, n1, &out));
    CHECK(out && step2 && same_model(out, cast));
    /* the cast masters are the published step, bit for bit (tensors) */
    for (size_t i = 0; out && step2 && i < ferry_model_count(out); i++) {
        const ferry_tensor *x = ferry_model_tensor(out, i), *y = ferry_model_find(step2, x->name);
        CHECK(y && x->nbytes == y->nbytes && memcmp(x->data, y->data, x->nbytes) == 0);
    }
    ferry_model_free(out);
    ferry_model_free(step2);
    ferry_free(p1);
    ferry_free(p2);
    ferry_model_free(a);
    ferry_model_free(m);
    ferry_model_free(cast);
}

/* The streaming file apply: the file holds exactly b; a failure leaves
 * nothing new behind and keeps what was at the path. */
static void test_apply_file(void)
{
    SKIP_UNLESS_DATA("rl-b");
    ferry_model *a = open_step("rl-b", 1), *b = open_step("rl-b", 2), *got = NULL;
    if (!a || !b) { CHECK(0); return; }
    char dir[] = "/tmp/ferry-apply-XXXXXX", path[512];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/out.safetensors", dir);
    void *p;
    size_t n;
    CHECK_OK(ferry_diff(a, b, NULL, &p, &n));
    ferry_apply_options o = {.threads = 2};
    CHECK_OK(ferry_apply_file(a, p, n, &o, path));
    CHECK_OK(ferry_model_open(path, &got));
    CHECK(got && same_model(got, b));
    ferry_model_free(got);
    /* wrong base: refused, the earlier file untouched, no temporary left */
    CHECK_RC(ferry_apply_file(b, p, n, NULL, path), FERRY_ERR_BASE_MISMATCH);
    got = NULL;
    CHECK_OK(ferry_model_open(path, &got));
    CHECK(got && same_model(got, b));
    ferry_model_free(got);
    /* a damaged payload behind a valid checksum: fails, nothing partial */
    uint8_t *q = malloc(n);
    memcpy(q, p, n);
    q[n / 2] ^= 0x10;
    reseal(q, n);
    char path2[600];
    snprintf(path2, sizeof path2, "%s/other.safetensors", dir);
    int rc = ferry_apply_file(a, q, n, NULL, path2);
    if (rc) CHECK(access(path2, F_OK) != 0);
    free(q);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c tmp > /dev/null", dir);
    CHECK(system(cmd) != 0); /* no *.tmp.* file remains */
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    ferry_free(p);
    ferry_model_free(a);
    ferry_model_free(b);
}

static void make_pair(ferry_model **a, ferry_model **b, void **p, size_t *n)
{
    CHECK_OK(ferry_model_create(a));
    CHECK_OK(ferry_model_create(b));
    add_pair(*a, *b, "w1", FERRY_BF16, 4096, 0.05);
    add_pair(*a, *b, "w2", FERRY_F32, 512, 0.5);
    CHECK_OK(ferry_diff(*a, *b, NULL, p, n));
}

static void test_wrong_base(void)
{
    ferry_model *a, *b, *out = NULL;
    void *p;
    size_t n;
    make_pair(&a, &b, &p, &n);
    CHECK_RC(ferry_apply(b, p, n, &out), FERRY_ERR_BASE_MISMATCH);
    CHECK(out == NULL);
    CHECK(strstr(ferry_last_error(), "base model hash") != NULL);
    ferry_model *c = model_copy(b);
    CHECK_RC(ferry_apply_inplace(c, p, n), FERRY_ERR_BASE_MISMATCH);
    CHECK(same_model(c, b));
    ferry_model_free(c);
    ferry_model_free(a);
    ferry_model_free(b);
    ferry_free(p);
}


static void test_damaged_patches(void)
{
    ferry_model *a, *b, *out = NULL;
    void *p;
    size_t n;
    make_pair(&a, &b, &p, &n);
    uint8_t *q = malloc(n);
    /* truncation at every length: a clean error, never a model */
    for (size_t len = 0; len < n; len += (len < 128 ? 1 : 7)) {
        memcpy(q, p, len);
        int rc = ferry_apply(a, q, len, &out);
        CHECK(rc != FERRY_OK && out == NULL);
        CHECK(rc == FERRY_ERR_PATCH_TRUNCATED || rc == FERRY_ERR_PATCH_MAGIC);
    }
    /* any flipped bit is caught by the checksum */
    for (size_t i = 0; i < n; i += 3) {
        memcpy(q, p, n);
        q[i] ^= (uint8_t)(1u << (i % 8));
        int rc = ferry_apply(a, q, n, &out);
        CHECK(rc != FERRY_OK && out == NULL);
    }
    /* flipped bits behind a recomputed checksum reach the inner checks:
     * they must fail cleanly too (or, by chance, decode to the same bits) */
    ferry_model *c = model_copy(a);
    for (size_t i = 16; i + 16 < n; i++) {
        memcpy(q, p, n);
        q[i] ^= (uint8_t)(1u << (rnd() % 8));
        reseal(q, n);
        int rc = ferry_apply(a, q, n, &out);
        if (rc == FERRY_OK) {
            CHECK(same_model(out, b));
            ferry_model_free(out);
            out = NULL;
        }
        rc = ferry_apply_inplace(c, q, n);
        CHECK(same_model(c, rc == FERRY_OK ? b : a));
        if (rc == FERRY_OK) { ferry_model_free(c); c = model_copy(a); }
    }
    ferry_model_free(c);
    free(q);
    ferry_model_free(a);
    ferry_model_free(b);
    ferry_free(p);
}

/* A tensor that changed densely travels whole but keeps its place:
 * in-place apply takes it. */
static void test_inplace_dense_tensor(void)
{
    ferry_model *a, *b;
    CHECK_OK(ferry_model_create(&a));
    CHECK_OK(ferry_model_create(&b));
    add_pair(a, b, "sparse", FERRY_BF16, 4096, 0.02);
    /* every word changes, to one value: whole + zstd beats sparse */
    float x[256], y[256];
    for (int i = 0; i < 256; i++) x[i] = (float)rnd() / 1e19f, y[i] = 0.5f;
    uint64_t sh[1] = {256};
    CHECK_OK(ferry_model_add(a, "dense", FERRY_F32, 1, sh, x, sizeof x, FERRY_ADD_COPY));
    CHECK_OK(ferry_model_add(b, "dense", FERRY_F32, 1, sh, y, sizeof y, FERRY_ADD_COPY));
    void *p;
    size_t n;
    CHECK_OK(ferry_diff(a, b, NULL, &p, &n));
    ferry_patch_info *pi = NULL;
    CHECK_OK(ferry_patch_inspect(p, n, &pi));
    int whole = 0;
    for (size_t i = 0; pi && i < ferry_patch_info_count(pi); i++) whole += ferry_patch_info_tensor(pi, i)->kind == FERRY_PT_WHOLE;
    CHECK(whole == 1);
    ferry_patch_info_free(pi);
    CHECK_OK(ferry_apply_inplace(a, p, n));
    CHECK(same_model(a, b));
    ferry_free(p);
    ferry_model_free(a);
    ferry_model_free(b);
}

static void test_inplace_refuses_structure(void)
{
    ferry_model *a, *b;
    CHECK_OK(ferry_model_create(&a));
    CHECK_OK(ferry_model_create(&b));
    add_pair(a, b, "w", FERRY_BF16, 256, 0.1);
    uint16_t v[4] = {1, 2, 3, 4};
    uint64_t s[1] = {4};
    CHECK_OK(ferry_model_add(b, "extra", FERRY_BF16, 1, s, v, 8, 0));
    void *p;
    size_t n;
    CHECK_OK(ferry_diff(a, b, NULL, &p, &n));
    CHECK_RC(ferry_apply_inplace(a, p, n), FERRY_ERR_SHAPE_MISMATCH);
    ferry_free(p);
    ferry_model_free(a);
    ferry_model_free(b);
}

static void test_stats(void)
{
    ferry_model *a, *b;
    uint16_t x[4] = {0x3F80, 0x3F80, 0x0000, 0x1234}, y[4] = {0x3F81, 0x3F7F, 0x8000, 0x1234};
    uint64_t s[1] = {4};
    CHECK_OK(ferry_model_create(&a));
    CHECK_OK(ferry_model_create(&b));
    CHECK_OK(ferry_model_add(a, "w", FERRY_BF16, 1, s, x, 8, 0));
    CHECK_OK(ferry_model_add(b, "w", FERRY_BF16, 1, s, y, 8, 0));
    ferry_stats st;
    CHECK_OK(ferry_stats_compute(a, b, &st));
    CHECK(st.changed == 3 && st.nelem == 4);
    CHECK(st.ulp_hist[4 + 1] == 1 && st.ulp_hist[4 - 1] == 2); /* +1, -1 (1.0 down), +0 -> -0 is -1 */
    ferry_stats_release(&st);
    ferry_model_free(a);
    ferry_model_free(b);
}

/* In place with every undo budget: none (verify, then decode again and
 * write), part of the chunks, all of them (default).  A result that fails
 * verification after earlier chunks were written must leave the base as it
 * was, bit for bit. */
static void test_inplace_undo(void)
{
    ferry_model *a, *b;
    CHECK_OK(ferry_model_create(&a));
    CHECK_OK(ferry_model_create(&b));
    add_pair(a, b, "a.big", FERRY_BF16, (1u << 23) + 777, 0.15); /* three chunks; a 5 MB undo log: mmap'd */
    add_pair(a, b, "a.sparse", FERRY_BF16, (1u << 22) + 5, 0.00002); /* undo windows (2^16 words) with no change */
    add_pair(a, b, "b.f32", FERRY_F32, 3000, 0.2);
    add_pair(a, b, "c.last", FERRY_BF16, 20000, 0.1);
    void *p;
    size_t n;
    CHECK_OK(ferry_diff(a, b, NULL, &p, &n));
    uint8_t *q = malloc(n);
    const uint64_t limits[] = {1, 3u << 20, 0};
    for (int li = 0; li < 3; li++) {
        for (int th = 1; th <= 2; th++) {
            ferry_apply_options o = {.threads = th, .undo_limit = limits[li]};
            ferry_model *c = model_copy(a);
            CHECK_OK(ferry_apply_inplace_ex(c, p, n, &o));
            CHECK(same_model(c, b));
            ferry_model_free(c);
        }
        /* damage the last tensor's payload (the checksum resealed): the
         * big tensor's chunks come first and may already be written */
        int refused = 0;
        ferry_model *c = model_copy(a);
        for (size_t i = n - 16 - 64; i < n - 16; i += 3) {
            memcpy(q, p, n);
            q[i] ^= (uint8_t)(1u << (i % 8));
            reseal(q, n);
            ferry_apply_options o = {.threads = 1, .undo_limit = limits[li]};
            int rc = ferry_apply_inplace_ex(c, q, n, &o);
            CHECK(same_model(c, rc == FERRY_OK ? b : a));
            if (rc == FERRY_OK) { ferry_model_free(c); c = model_copy(a); }
            else refused++;
        }
        CHECK(refused > 0);
        ferry_model_free(c);
    }
    free(q);
    ferry_free(p);
    ferry_model_free(a);
    ferry_model_free(b);
}

/* The caller's vector state after ferry returns: the upper halves of the
 * YMM/ZMM registers must be clean (XINUSE, xgetbv with ecx = 1), or the
 * caller's SSE code runs several times slower (libxxhash's dispatched
 * AVX-512 hashing left them dirty: a plain compare loop after ferry_diff
 * went from 13.5 to 3.8 GB/s). */
#if defined(__x86_64__)
#include <cpuid.h>
static bool xinuse_readable(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false; /* OSXSAVE */
    if (__get_cpuid_max(0, NULL) < 0xD) return false;
    __cpuid_count(0xD, 1, a, b, c, d);
    return a & (1u << 2); /* XGETBV with ECX = 1 */
}
static uint64_t xinuse(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
    return (uint64_t)hi << 32 | lo;
}
#endif

static void test_clean_vector_state(void)
{
#if defined(__x86_64__)
    if (!xinuse_readable()) return; /* nothing to see: no YMM state to leave dirty */
    ferry_model *a, *b;
    CHECK_OK(ferry_model_create(&a));
    CHECK_OK(ferry_model_create(&b));
    add_pair(a, b, "w", FERRY_BF16, 1u << 20, 0.05); /* 2 MiB: the hashes take their long (vector) path */
    uint8_t h[16];
    void *p;
    size_t n;
    const uint64_t upper = (1u << 2) | (1u << 6); /* YMM_Hi128, ZMM_Hi256 */
    CHECK_OK(ferry_model_hash(a, h));
    CHECK((xinuse() & upper) == 0);
    CHECK_OK(ferry_diff(a, b, NULL, &p, &n));
    CHECK((xinuse() & upper) == 0);
    ferry_model *c = model_copy(a);
    CHECK_OK(ferry_apply_inplace(c, p, n));
    CHECK((xinuse() & upper) == 0);
    CHECK(same_model(c, b));
    ferry_model_free(c);
    ferry_free(p);
    ferry_model_free(a);
    ferry_model_free(b);
#endif
}

int main(void)
{
    RUN(test_real_consecutive);
    RUN(test_real_far_pairs);
    RUN(test_every_dtype);
    RUN(test_special_bf16_values);
    RUN(test_structure_changes);
    RUN(test_multi_chunk);
    RUN(test_rans_every_width);
    RUN(test_rans32_every_width);
    RUN(test_rans2_forced);
    RUN(test_chunk_codec_choice);
    RUN(test_counted_codec);
    RUN(test_walk_levels);
    RUN(test_threads_and_known_hash);
    RUN(test_fp32_gate);
    RUN(test_apply_file);
    RUN(test_wrong_base);
    RUN(test_damaged_patches);
    RUN(test_inplace_dense_tensor);
    RUN(test_inplace_refuses_structure);
    RUN(test_inplace_undo);
    RUN(test_inplace_reuse);
    RUN(test_stats);
    RUN(test_clean_vector_state);
    return CHECK_SUMMARY();
}
