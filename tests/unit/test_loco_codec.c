/* lib/loco without MPI: the gate against a direct computation, residual
 * bookkeeping, the payload codec's exact round trip, hostile payloads
 * (each rejected with its own code), the outer step and the hash. */
#define FERRY_LOCO_NO_MPI
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#include <zstd.h>

#include "check.h"
#include "ferry_loco.h"

/* ---- helpers ----------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double unif(void) { return (double)(rnd() >> 11) * 0x1.0p-53; }
static float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i); return v; }

/* Recomputes the checksum field (bytes 56..63) after a mutation, so that
 * the decoder's later checks are reached. */
static void reseal(uint8_t *p, size_t size)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, p, 56);
    if (size > 64) XXH3_64bits_update(&st, p + 64, size - 64);
    put64(p + 56, XXH3_64bits_digest(&st));
}

/* A sealed payload around a hand-made raw body (NULL/0 for none). */
static uint8_t *make_payload(uint64_t round, uint32_t rank, uint64_t n, uint64_t count,
                             const uint8_t *raw, size_t raw_len, size_t *size)
{
    size_t cap = 64 + (raw_len ? ZSTD_compressBound(raw_len) : 0);
    uint8_t *p = calloc(1, cap);
    memcpy(p, "FLOC", 4);
    p[4] = 1;
    p[5] = 1;
    put64(p + 8, round);
    p[16] = (uint8_t)rank, p[17] = (uint8_t)(rank >> 8), p[18] = (uint8_t)(rank >> 16), p[19] = (uint8_t)(rank >> 24);
    put64(p + 24, n);
    put64(p + 32, count);
    size_t body = raw_len ? ZSTD_compress(p + 64, cap - 64, raw, raw_len, 1) : 0;
    put64(p + 40, raw_len);
    put64(p + 48, body);
    *size = 64 + body;
    reseal(p, *size);
    return p;
}

static void random_sparse(ferry_loco_sparse *sp, uint64_t n, double density)
{
    sp->count = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (unif() >= density) continue;
        if (sp->count == sp->cap) {
            sp->cap = sp->cap ? 2 * sp->cap : 64;
            sp->idx = realloc(sp->idx, sp->cap * sizeof *sp->idx);
            sp->val = realloc(sp->val, sp->cap * sizeof *sp->val);
        }
        sp->idx[sp->count] = i;
        sp->val[sp->count] = (float)((unif() - 0.5) * 1e-3);
        sp->count++;
    }
}

static int same_sparse(const ferry_loco_sparse *a, const ferry_loco_sparse *b)
{
    if (a->count != b->count) return 0;
    for (uint64_t k = 0; k < a->count; k++)
        if (a->idx[k] != b->idx[k] || f_bits(a->val[k]) != f_bits(b->val[k])) return 0;
    return 1;
}

static int round_trip(const ferry_loco_sparse *sp, uint64_t n, uint64_t round, uint32_t rank)
{
    ferry_loco_header h = {.round = round, .rank = rank, .n = n, .count = sp->count}, g;
    void *buf;
    size_t size;
    int ok = 0;
    if (ferry_loco_encode(&h, sp, 1, &buf, &size)) return 0;
    ferry_loco_sparse out = {0};
    if (!ferry_loco_decode(buf, size, n, &g, &out))
        ok = same_sparse(sp, &out) && g.round == round && g.rank == rank && g.n == n &&
             g.count == sp->count;
    ferry_loco_sparse_release(&out);
    ferry_free(buf);
    return ok;
}

/* ---- the gate ----------------------------------------------------------- */

/* A weight with a random magnitude over many binades, so that BF16 cells of
 * every size are crossed; occasionally exact zeros and tiny values. */
static float random_weight(void)
{
    double r = unif();
    if (r < 0.02) return 0.0f;
    if (r < 0.04) return (float)((unif() - 0.5) * 1e-38); /* subnormal range */
    double mag = pow(2.0, -12.0 + 14.0 * unif());
    return (float)(unif() < 0.5 ? -mag : mag);
}

static void test_gate_matches_direct(void)
{
    enum { N = 200000 };
    float *g = malloc(N * 4), *l = malloc(N * 4), *r = malloc(N * 4), *r0 = malloc(N * 4);
    for (int i = 0; i < N; i++) {
        g[i] = random_weight();
        /* steps from far below a BF16 cell to several cells */
        float step = (float)((unif() - 0.5) * fabs((double)g[i]) * pow(2.0, -14.0 + 12.0 * unif()));
        l[i] = g[i] - step;
        r[i] = r0[i] = (float)((unif() - 0.5) * fabs((double)g[i]) * 1e-3);
    }
    ferry_loco_sparse sp = {0};
    CHECK_OK(ferry_loco_gate(g, l, r, N, &sp));
    uint64_t k = 0, gated = 0;
    int bad = 0;
    for (int i = 0; i < N; i++) {
        float s = r0[i] + (g[i] - l[i]);
        int gate = ferry_f32_to_bf16(g[i] - s) != ferry_f32_to_bf16(g[i]);
        if (gate) {
            gated++;
            if (k >= sp.count || sp.idx[k] != (uint64_t)i || f_bits(sp.val[k]) != f_bits(s) ||
                f_bits(r[i]) != 0)
                bad++;
            k++;
        } else if (f_bits(r[i]) != f_bits(s)) {
            bad++;
        }
    }
    CHECK(bad == 0);
    CHECK(k == sp.count && gated == sp.count);
    /* the generator should give both outcomes plenty of times */
    CHECK(sp.count > N / 20 && sp.count < N - N / 20);
    printf("     gate: %llu of %d entries gated\n", (unsigned long long)sp.count, N);
    ferry_loco_sparse_release(&sp);
    free(g), free(l), free(r), free(r0);
}

/* Known cases around a BF16 cell: 1.0 has ULP 2^-7 in BF16; moving the
 * FP32 value by less than half a cell keeps the cast, by more flips it. */
static void test_gate_cases(void)
{
    float g[6] = {1.0f, 1.0f, 1.0f, 1.0f, 0.0f, -3.0f};
    float l[6], r[6] = {0};
    l[0] = 1.0f + 0x1.0p-9f;  /* δ = −2^-9: 1 + 2^-9 casts to 1.0: held */
    l[1] = 1.0f + 0x1.8p-8f;  /* δ = −1.5·2^-8: casts to 1 + 2^-7: sent */
    l[2] = 1.0f + 0x1.0p-8f;  /* exactly half a cell: ties to even (1.0): held */
    l[3] = 1.0f;              /* no change: held, residual 0 */
    l[4] = 1e-30f;            /* any change of 0 is visible */
    l[5] = -3.0f - 0x1.0p-5f; /* cell of 3 is 2^-6: two cells: sent */
    ferry_loco_sparse sp = {0};
    CHECK_OK(ferry_loco_gate(g, l, r, 6, &sp));
    CHECK(sp.count == 3);
    if (sp.count == 3) {
        CHECK(sp.idx[0] == 1 && sp.val[0] == -0x1.8p-8f);
        CHECK(sp.idx[1] == 4 && sp.val[1] == -1e-30f);
        CHECK(sp.idx[2] == 5 && sp.val[2] == 0x1.0p-5f);
    }
    CHECK(r[0] == -0x1.0p-9f && r[1] == 0 && r[2] == -0x1.0p-8f && r[3] == 0 && r[4] == 0 && r[5] == 0);
    /* error feedback: what was held adds to the next round's δ.  Entry 0:
     * −2^-9 held + −2^-8 = −1.5·2^-8 crosses; entry 2: −2^-8 + −2^-9, the
     * same; entry 3 gets −2^-9 only (held). */
    float l2[6];
    memcpy(l2, g, sizeof l2);
    l2[0] = 1.0f + 0x1.0p-8f;
    l2[2] = 1.0f + 0x1.0p-9f;
    l2[3] = 1.0f + 0x1.0p-9f;
    CHECK_OK(ferry_loco_gate(g, l2, r, 6, &sp));
    CHECK(sp.count == 2 && sp.idx[0] == 0 && sp.idx[1] == 2);
    if (sp.count == 2) CHECK(sp.val[0] == -0x1.8p-8f && sp.val[1] == -0x1.8p-8f);
    CHECK(r[0] == 0 && r[2] == 0 && r[3] == -0x1.0p-9f);
    ferry_loco_sparse_release(&sp);
}

/* With values on a 2^-24 grid every sum is exact, so error feedback must
 * conserve mass exactly: Σ sent + residual = Σ δ per weight. */
static void test_residual_conserves(void)
{
    enum { N = 4096, ROUNDS = 40 };
    float *g = malloc(N * 4), *l = malloc(N * 4), *r = calloc(N, 4);
    double *sent = calloc(N, sizeof *sent), *total = calloc(N, sizeof *total);
    for (int i = 0; i < N; i++) g[i] = (float)(ldexp((double)(rnd() % 4096) + 4096, -13)); /* [0.5,1) */
    ferry_loco_sparse sp = {0};
    uint64_t sends = 0;
    for (int t = 0; t < ROUNDS; t++) {
        for (int i = 0; i < N; i++) {
            /* a per-weight drift of 2^-14..2^-12 plus noise: both below a
             * BF16 cell of [0.5, 1) (2^-8), so sends need accumulation */
            double d = ldexp((double)((i % 4) + 1), -14) + ldexp((double)(rnd() % 64) - 32, -20);
            l[i] = g[i] - (float)d;
            total[i] += d;
        }
        CHECK_OK(ferry_loco_gate(g, l, r, N, &sp));
        for (uint64_t k = 0; k < sp.count; k++) sent[sp.idx[k]] += sp.val[k];
        sends += sp.count;
    }
    int bad = 0;
    for (int i = 0; i < N; i++)
        if (sent[i] + r[i] != total[i]) bad++;
    CHECK(bad == 0);
    /* drift of ~2^-13/round against a half cell of 2^-9: roughly one send
     * every 8..32 rounds per weight */
    CHECK(sends > N && sends < (uint64_t)N * ROUNDS / 4);
    ferry_loco_sparse_release(&sp);
    free(g), free(l), free(r), free(sent), free(total);
}

static void test_gate_rejects_nonfinite(void)
{
    float g[3] = {1, 2, 3}, l[3] = {1, NAN, 3}, r[3] = {0.25f, 0.5f, 0.75f};
    ferry_loco_sparse sp = {0};
    CHECK_RC(ferry_loco_gate(g, l, r, 3, &sp), FERRY_ERR_LOCO_VALUE);
    CHECK(sp.count == 0 && r[0] == 0.25f && r[1] == 0.5f && r[2] == 0.75f);
    l[1] = INFINITY;
    CHECK_RC(ferry_loco_gate(g, l, r, 3, &sp), FERRY_ERR_LOCO_VALUE);
    CHECK(strstr(ferry_last_error(), "index 1") != NULL);
    ferry_loco_sparse_release(&sp);
}

/* ---- payload codec --------------------------------------------------------- */

static void test_round_trip(void)
{
    ferry_loco_sparse sp = {0};
    /* empty */
    CHECK(round_trip(&sp, 10, 0, 0));
    /* densities from a few entries to all of them */
    const double dens[] = {0.0005, 0.01, 0.05, 0.3, 1.0};
    for (size_t d = 0; d < sizeof dens / sizeof *dens; d++) {
        random_sparse(&sp, 100000, dens[d]);
        CHECK(round_trip(&sp, 100000, 7 + d, (uint32_t)d));
    }
    /* every special bit pattern that is finite, and huge gaps (10-byte
     * varints need gaps >= 2^63: n is bounded by 2^40, so 6 bytes) */
    sp.count = 6;
    uint64_t n = (uint64_t)1 << 40;
    uint64_t idx[6] = {0, 1, 127, 128 + 127, ((uint64_t)1 << 35), n - 1};
    uint32_t bits[6] = {0x80000000u, 0x00000001u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x80000001u, 0x3F800000u};
    for (int k = 0; k < 6; k++) sp.idx[k] = idx[k], sp.val[k] = bits_f(bits[k]);
    CHECK(round_trip(&sp, n, UINT64_MAX, UINT32_MAX));
    ferry_loco_sparse_release(&sp);
}

static void test_compact(void)
{
    /* 5% of 10^6 weights with values of a pseudo-gradient's spread: the
     * payload must be well under DiLoCo's 4 bytes per weight / 10 */
    ferry_loco_sparse sp = {0};
    random_sparse(&sp, 1000000, 0.05);
    ferry_loco_header h = {.n = 1000000, .count = sp.count};
    void *buf;
    size_t size;
    CHECK_OK(ferry_loco_encode(&h, &sp, 1, &buf, &size));
    double per = (double)size / (double)sp.count;
    printf("     payload: %llu entries in %zu bytes (%.2f bytes/entry; dense FP32 %d bytes)\n",
           (unsigned long long)sp.count, size, per, 4000000);
    CHECK(per < 5.0);
    CHECK(size < 4000000 / 10);
    ferry_free(buf);
    ferry_loco_sparse_release(&sp);
}

static void test_encode_rejects(void)
{
    ferry_loco_sparse sp = {0};
    random_sparse(&sp, 100, 0.5);
    ferry_loco_header h = {.n = 100, .count = sp.count};
    void *buf = (void *)1;
    size_t size = 1;
    h.count = sp.count + 1;
    CHECK_RC(ferry_loco_encode(&h, &sp, 1, &buf, &size), FERRY_ERR_ARG);
    CHECK(buf == NULL && size == 0);
    h.count = sp.count;
    uint64_t save = sp.idx[1];
    sp.idx[1] = sp.idx[0];
    CHECK_RC(ferry_loco_encode(&h, &sp, 1, &buf, &size), FERRY_ERR_ARG);
    sp.idx[1] = save;
    h.n = sp.idx[sp.count - 1];
    CHECK_RC(ferry_loco_encode(&h, &sp, 1, &buf, &size), FERRY_ERR_ARG);
    h.n = 100;
    sp.val[2] = NAN;
    CHECK_RC(ferry_loco_encode(&h, &sp, 1, &buf, &size), FERRY_ERR_ARG);
    sp.val[2] = 1;
    CHECK_RC(ferry_loco_encode(&h, &sp, 20, &buf, &size), FERRY_ERR_ARG);
    CHECK_OK(ferry_loco_encode(&h, &sp, 19, &buf, &size));
    ferry_free(buf);
    ferry_loco_sparse_release(&sp);
}

/* Decodes and expects code; out->count must be 0 after a failure. */
static int decode_code(const void *p, size_t size, uint64_t n)
{
    ferry_loco_header h;
    ferry_loco_sparse out = {0};
    int rc = ferry_loco_decode(p, size, n, &h, &out);
    if (rc && out.count) rc = -1;
    ferry_loco_sparse_release(&out);
    return rc;
}

static void test_hostile_header(void)
{
    ferry_loco_sparse sp = {0};
    random_sparse(&sp, 1000, 0.1);
    ferry_loco_header h = {.round = 3, .rank = 1, .n = 1000, .count = sp.count};
    void *v;
    size_t size;
    CHECK_OK(ferry_loco_encode(&h, &sp, 1, &v, &size));
    uint8_t *good = v, *p = malloc(size + 8);
    CHECK_OK(decode_code(good, size, 1000));

    CHECK_RC(decode_code(good, 0, 1000), FERRY_ERR_LOCO_TRUNCATED);
    CHECK_RC(decode_code(good, 63, 1000), FERRY_ERR_LOCO_TRUNCATED);
    memcpy(p, good, size), p[0] = 'X';
    CHECK_RC(decode_code(p, size, 1000), FERRY_ERR_LOCO_MAGIC);
    memcpy(p, good, size), p[4] = 2;
    CHECK_RC(decode_code(p, size, 1000), FERRY_ERR_LOCO_VERSION);
    memcpy(p, good, size), p[5] = 7;
    CHECK_RC(decode_code(p, size, 1000), FERRY_ERR_LOCO_VERSION);
    memcpy(p, good, size), p[6] = 1;
    CHECK_RC(decode_code(p, size, 1000), FERRY_ERR_LOCO_CORRUPT);
    memcpy(p, good, size), p[21] = 1;
    CHECK_RC(decode_code(p, size, 1000), FERRY_ERR_LOCO_CORRUPT);
    CHECK_RC(decode_code(good, size, 999), FERRY_ERR_LOCO_SIZE);
    /* a count over n is refused before anything is allocated, even a huge one */
    memcpy(p, good, size), put64(p + 32, UINT64_MAX), reseal(p, size);
    CHECK_RC(decode_code(p, size, 1000), FERRY_ERR_LOCO_COUNT);
    memcpy(p, good, size), put64(p + 32, 1001);
    CHECK_RC(decode_code(p, size, 1000), FERRY_ERR_LOCO_COUNT);
    /* declared lengths */
    CHECK_RC(decode_code(good, size - 1, 1000), FERRY_ERR_LOCO_TRUNCATED);
    memcpy(p, good, size), p[size] = 0;
    CHECK_RC(decode_code(p, size + 1, 1000), FERRY_ERR_LOCO_TRAILING);
    memcpy(p, good, size), put64(p + 48, UINT64_MAX);
    CHECK_RC(decode_code(p, size, 1000), FERRY_ERR_LOCO_TRUNCATED);
    memcpy(p, good, size), put64(p + 40, get64(good + 40) * 100), reseal(p, size);
    CHECK_RC(decode_code(p, size, 1000), FERRY_ERR_LOCO_CORRUPT); /* raw over 14·count */
    memcpy(p, good, size), put64(p + 40, sp.count * 4), reseal(p, size);
    CHECK_RC(decode_code(p, size, 1000), FERRY_ERR_LOCO_CORRUPT); /* raw under 5·count */
    memcpy(p, good, size), put64(p + 40, get64(good + 40) + 1), reseal(p, size);
    CHECK_RC(decode_code(p, size, 1000), FERRY_ERR_LOCO_CORRUPT); /* frame holds another size */
    /* checksum: header and body bytes are covered */
    memcpy(p, good, size), p[8] ^= 1;
    CHECK_RC(decode_code(p, size, 1000), FERRY_ERR_LOCO_CHECKSUM);
    memcpy(p, good, size), p[size - 1] ^= 0x10;
    CHECK_RC(decode_code(p, size, 1000), FERRY_ERR_LOCO_CHECKSUM);
    memcpy(p, good, size), p[60] ^= 1;
    CHECK_RC(decode_code(p, size, 1000), FERRY_ERR_LOCO_CHECKSUM);
    /* a body that is not a zstd frame, checksum resealed */
    memcpy(p, good, size), memset(p + 64, 0xA5, size - 64), reseal(p, size);
    CHECK_RC(decode_code(p, size, 1000), FERRY_ERR_LOCO_CORRUPT);
    /* an empty payload must not declare a body */
    {
        uint8_t e[64 + 4];
        ferry_loco_sparse none = {0};
        ferry_loco_header eh = {.n = 10};
        void *ev;
        size_t es;
        CHECK_OK(ferry_loco_encode(&eh, &none, 1, &ev, &es));
        CHECK(es == 64);
        memcpy(e, ev, 64);
        CHECK_OK(decode_code(e, 64, 10));
        put64(e + 40, 5), reseal(e, 64);
        CHECK_RC(decode_code(e, 64, 10), FERRY_ERR_LOCO_CORRUPT);
        ferry_free(ev);
    }
    /* peek reads the header alone */
    ferry_loco_header ph;
    CHECK_OK(ferry_loco_peek(good, size, &ph));
    CHECK(ph.round == 3 && ph.rank == 1 && ph.n == 1000 && ph.count == sp.count);
    free(p);
    ferry_free(good);
    ferry_loco_sparse_release(&sp);
}

/* Well-sealed payloads whose body breaks a rule. */
static void test_hostile_body(void)
{
    size_t size;
    uint8_t *p;
    /* index past n: gaps 3, 5 in n = 8 -> indices 3, 9 */
    uint8_t r1[2 + 8] = {3, 5, 0x3F, 0x3F, 0, 0, 0, 0, 0, 0};
    p = make_payload(0, 0, 8, 2, r1, sizeof r1, &size);
    CHECK_RC(decode_code(p, size, 8), FERRY_ERR_LOCO_INDEX);
    free(p);
    p = make_payload(0, 0, 10, 2, r1, sizeof r1, &size); /* index 9 is fine in n = 10 */
    CHECK_OK(decode_code(p, size, 10));
    free(p);
    /* gap overflowing 64 bits: prev + gap wraps -> INDEX, not a small index */
    uint8_t r2[1 + 10 + 8] = {1, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01};
    p = make_payload(0, 0, 8, 2, r2, sizeof r2, &size);
    CHECK_RC(decode_code(p, size, 8), FERRY_ERR_LOCO_INDEX);
    free(p);
    /* a varint longer than 64 bits */
    uint8_t r3[11 + 4] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x02};
    p = make_payload(0, 0, 8, 1, r3, sizeof r3 - 1, &size);
    CHECK_RC(decode_code(p, size, 8), FERRY_ERR_LOCO_CORRUPT);
    free(p);
    /* non-minimal varint (0x81 0x00 is 1 spelled in two bytes) */
    uint8_t r4[2 + 4] = {0x81, 0x00, 0x3F, 0, 0, 0};
    p = make_payload(0, 0, 8, 1, r4, sizeof r4, &size);
    CHECK_RC(decode_code(p, size, 8), FERRY_ERR_LOCO_CORRUPT);
    free(p);
    /* a gap stream with a byte left over (raw_len says 6 = 2 gap bytes for
     * one entry whose varint takes 1) */
    uint8_t r5[2 + 4] = {0x01, 0x01, 0x3F, 0, 0, 0};
    p = make_payload(0, 0, 8, 1, r5, sizeof r5, &size);
    CHECK_RC(decode_code(p, size, 8), FERRY_ERR_LOCO_CORRUPT);
    free(p);
    /* a gap running into the value planes */
    uint8_t r6[1 + 4] = {0x80, 0x3F, 0, 0, 0};
    p = make_payload(0, 0, 8, 1, r6, sizeof r6, &size);
    CHECK_RC(decode_code(p, size, 8), FERRY_ERR_LOCO_CORRUPT);
    free(p);
    /* non-finite values: +inf (7F800000) and a NaN (FFC00001), planes
     * most significant byte first */
    uint8_t r7[1 + 4] = {0x00, 0x7F, 0x80, 0x00, 0x00};
    p = make_payload(0, 0, 8, 1, r7, sizeof r7, &size);
    CHECK_RC(decode_code(p, size, 8), FERRY_ERR_LOCO_VALUE);
    free(p);
    uint8_t r8[2 + 8] = {0x00, 0x00, 0x3F, 0xFF, 0x80, 0xC0, 0x00, 0x00, 0x00, 0x01};
    p = make_payload(0, 0, 8, 2, r8, sizeof r8, &size);
    CHECK_RC(decode_code(p, size, 8), FERRY_ERR_LOCO_VALUE);
    free(p);
    /* and the same shape with finite values decodes to exactly them */
    uint8_t r9[2 + 8] = {0x02, 0x00, 0x3F, 0xBF, 0x80, 0xC0, 0x00, 0x00, 0x00, 0x01};
    p = make_payload(0, 0, 8, 2, r9, sizeof r9, &size);
    ferry_loco_header h;
    ferry_loco_sparse out = {0};
    CHECK_OK(ferry_loco_decode(p, size, 8, &h, &out));
    CHECK(out.count == 2 && out.idx[0] == 2 && out.idx[1] == 3);
    if (out.count == 2) CHECK(f_bits(out.val[0]) == 0x3F800000u && f_bits(out.val[1]) == 0xBFC00001u);
    ferry_loco_sparse_release(&out);
    free(p);
}

/* Random mutations of valid payloads, resealed half of the time: never a
 * crash (run under ASan in `make test SAN=1`), only loco codes or OK. */
static void test_mutations(void)
{
    ferry_loco_sparse sp = {0}, out = {0};
    int bad = 0, ok = 0, fails = 0;
    for (int t = 0; t < 3000; t++) {
        random_sparse(&sp, 500, 0.02 + 0.3 * unif());
        ferry_loco_header h = {.round = (uint64_t)t, .n = 500, .count = sp.count};
        void *v;
        size_t size;
        if (ferry_loco_encode(&h, &sp, 1, &v, &size)) { bad++; continue; }
        uint8_t *p = v;
        int flips = 1 + (int)(rnd() % 4);
        for (int f = 0; f < flips; f++) p[rnd() % size] ^= (uint8_t)(1u << (rnd() % 8));
        size_t cut = (rnd() % 8 == 0) ? (size_t)(rnd() % size) : size;
        if ((t & 1) && cut >= 64) reseal(p, cut);
        ferry_loco_header g;
        int rc = ferry_loco_decode(p, cut, 500, &g, &out);
        if (rc == 0) {
            ok++;
            for (uint64_t k = 0; k < out.count; k++)
                if (out.idx[k] >= 500 || !isfinite(out.val[k]) || (k && out.idx[k] <= out.idx[k - 1])) bad++;
        } else {
            fails++;
            if (rc < 120 || rc > 139 || out.count) bad++;
        }
        ferry_free(v);
    }
    printf("     mutations: %d decoded, %d rejected\n", ok, fails);
    CHECK(bad == 0);
    CHECK(fails > 1000);
    ferry_loco_sparse_release(&sp);
    ferry_loco_sparse_release(&out);
}

/* ---- the outer gate's update and the cell code ------------------------------ */

/* The BF16 cell of g, independently of the library: 2^(E − 7) with E g's
 * binary exponent, floored at −32. */
static double cell_unit(float g)
{
    int e;
    double m = frexp(fabs((double)g), &e); /* |g| = m·2^e, m in [0.5, 1) */
    int E = m == 0 || e - 1 < -32 ? -32 : e - 1;
    return ldexp(1.0, E - 7);
}

static uint16_t bf16(float f) { return ferry_f32_to_bf16(f); }

static void test_cell_gate(void)
{
    enum { N = 100000 };
    float *g = malloc(N * sizeof *g), *u = malloc(N * sizeof *u), *r = malloc(N * sizeof *r),
          *r0 = malloc(N * sizeof *r0);
    for (int i = 0; i < N; i++) {
        g[i] = random_weight();
        /* updates from far below a cell to several cells */
        u[i] = (float)((unif() - 0.5) * fabs((double)g[i]) * pow(2.0, -14.0 + 12.0 * unif()));
        r[i] = r0[i] = (float)((unif() - 0.5) * fabs((double)g[i]) * 0x1.0p-9);
    }
    ferry_loco_sparse sp = {0};
    CHECK_OK(ferry_loco_gate_update(g, u, r, N, FERRY_LOCO_VALUES_CELL, &sp));
    uint64_t k = 0;
    int bad = 0, multiples = 0;
    for (int i = 0; i < N; i++) {
        float sv = r0[i] + u[i];
        double c = cell_unit(g[i]), m = nearbyint((double)sv / c);
        if (m > 16777215) m = 16777215;
        if (m < -16777215) m = -16777215;
        float q = (float)(m * c);
        int want = m != 0 && bf16(g[i] - q) != bf16(g[i]);
        int sent = k < sp.count && sp.idx[k] == (uint64_t)i;
        if (want != sent) bad++;
        if (sent) {
            if (f_bits(sp.val[k]) != f_bits(q)) bad++;
            /* what was not sent stays, exactly: r + q == s */
            if ((double)r[i] + (double)q != (double)sv) bad++;
            if (fabs(m) > 1) multiples++;
            k++;
        } else if (f_bits(r[i]) != f_bits(sv)) {
            bad++;
        }
    }
    printf("     cell gate: %llu of %d sent, %d of them more than one unit\n", (unsigned long long)sp.count,
           N, multiples);
    CHECK(bad == 0 && k == sp.count);
    CHECK(sp.count > N / 20 && sp.count < N - N / 20 && multiples > 0);
    /* FP32 values through the same entry point are the original gate */
    ferry_loco_sparse sp2 = {0};
    float *l = malloc(N * sizeof *l), *ra = malloc(N * sizeof *ra), *rb = malloc(N * sizeof *rb);
    for (int i = 0; i < N; i++) l[i] = g[i] - u[i], u[i] = g[i] - l[i], ra[i] = rb[i] = r0[i];
    CHECK_OK(ferry_loco_gate_update(g, u, ra, N, FERRY_LOCO_VALUES_FP32, &sp2));
    CHECK_OK(ferry_loco_gate(g, l, rb, N, &sp));
    CHECK(same_sparse(&sp, &sp2) && !memcmp(ra, rb, N * sizeof *ra));
    /* a NaN update fails and leaves the residual alone; so does an unknown coding */
    u[5] = NAN;
    memcpy(ra, r0, N * sizeof *ra);
    CHECK_RC(ferry_loco_gate_update(g, u, ra, N, FERRY_LOCO_VALUES_CELL, &sp2), FERRY_ERR_LOCO_VALUE);
    CHECK(sp2.count == 0 && !memcmp(ra, r0, N * sizeof *ra));
    CHECK_RC(ferry_loco_gate_update(g, u, ra, N, 7, &sp2), FERRY_ERR_ARG);
    ferry_loco_sparse_release(&sp);
    ferry_loco_sparse_release(&sp2);
    free(g), free(u), free(r), free(r0), free(l), free(ra), free(rb);
}

/* A random cell-coded sparse vector against base: k mostly ±1..±3. */
static void random_cells(ferry_loco_sparse *sp, const float *base, uint64_t n, double density)
{
    random_sparse(sp, n, density);
    for (uint64_t k = 0; k < sp->count; k++) {
        int64_t m = 1 + (int64_t)(rnd() % 3);
        if (rnd() % 16 == 0) m = 1 + (int64_t)(rnd() % 16777215);
        if (rnd() & 1) m = -m;
        sp->val[k] = (float)((double)m * cell_unit(base[sp->idx[k]]));
    }
}

static void test_cell_round_trip(void)
{
    enum { N = 50000 };
    float *base = malloc(N * sizeof *base);
    for (int i = 0; i < N; i++) base[i] = random_weight();
    ferry_loco_sparse sp = {0}, out = {0};
    random_cells(&sp, base, N, 0.1);
    ferry_loco_header h = {.round = 9, .rank = 2, .n = N, .count = sp.count, .values = FERRY_LOCO_VALUES_CELL}, g;
    void *buf = NULL, *fbuf = NULL;
    size_t size = 0, fsize = 0;
    CHECK_OK(ferry_loco_encode_with(&h, &sp, base, 3, &buf, &size));
    if (!buf) return;
    CHECK(((uint8_t *)buf)[5] == 2);
    CHECK_OK(ferry_loco_decode_with(buf, size, N, base, &g, &out));
    CHECK(same_sparse(&sp, &out) && g.values == FERRY_LOCO_VALUES_CELL && g.round == 9 && g.rank == 2);
    /* without the global weights a cell payload cannot be read */
    CHECK_RC(ferry_loco_decode(buf, size, N, &g, &out), FERRY_ERR_ARG);
    CHECK(out.count == 0);
    /* the same entries as FP32 (whose low mantissa bytes are 0 here, unlike
     * real updates'): the cell code is still the smaller */
    ferry_loco_header hf = h;
    hf.values = FERRY_LOCO_VALUES_FP32;
    CHECK_OK(ferry_loco_encode_with(&hf, &sp, base, 3, &fbuf, &fsize));
    printf("     cell code: %.2f bytes per entry (FP32 %.2f), %llu entries\n", (double)size / (double)sp.count,
           (double)fsize / (double)sp.count, (unsigned long long)sp.count);
    CHECK(4 * size < 3 * fsize);
    ferry_free(fbuf);
    fbuf = NULL;
    /* the encoder refuses what it cannot code exactly */
    CHECK_RC(ferry_loco_encode_with(&h, &sp, NULL, 1, &fbuf, &fsize), FERRY_ERR_ARG);
    float keep = sp.val[0];
    sp.val[0] = keep * 1.5f + (float)cell_unit(base[sp.idx[0]]) * 0.25f; /* off the grid */
    CHECK_RC(ferry_loco_encode_with(&h, &sp, base, 1, &fbuf, &fsize), FERRY_ERR_ARG);
    sp.val[0] = (float)(16777216.0 * cell_unit(base[sp.idx[0]])); /* |k| = 2^24 */
    CHECK_RC(ferry_loco_encode_with(&h, &sp, base, 1, &fbuf, &fsize), FERRY_ERR_ARG);
    sp.val[0] = keep;
    h.values = 5;
    CHECK_RC(ferry_loco_encode_with(&h, &sp, base, 1, &fbuf, &fsize), FERRY_ERR_ARG);
    ferry_free(buf);
    ferry_loco_sparse_release(&sp);
    ferry_loco_sparse_release(&out);
    free(base);
}

static void test_cell_hostile(void)
{
    float base[8] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 3e38f, 1.0f};
    ferry_loco_header h;
    ferry_loco_sparse out = {0};
    size_t size;
    struct { uint8_t raw[8]; size_t len; uint64_t count; int want; } cases[] = {
        {{0x02, 0x03}, 2, 1, 0},                          /* index 2, k = −2 */
        {{0x02, 0x00}, 2, 1, FERRY_ERR_LOCO_CORRUPT},     /* k = 0 is never sent */
        {{0x02, 0xFF, 0xFF, 0xFF, 0x0F}, 5, 1, FERRY_ERR_LOCO_CORRUPT}, /* |k| >= 2^24 */
        {{0x02, 0x81, 0x00}, 3, 1, FERRY_ERR_LOCO_CORRUPT}, /* non-minimal */
        {{0x02, 0x02, 0x02}, 3, 1, FERRY_ERR_LOCO_CORRUPT}, /* a byte left over */
        {{0x02, 0x80}, 2, 1, FERRY_ERR_LOCO_CORRUPT},     /* runs past the stream */
        {{0x00, 0x00, 0x02}, 3, 2, FERRY_ERR_LOCO_CORRUPT}, /* two gaps, one value */
        {{0x06, 0xFE, 0x0F}, 3, 1, FERRY_ERR_LOCO_VALUE}, /* 1023 cells of 3e38 overflow */
        {{0x06, 0x02}, 2, 1, 0},                          /* 1 cell of 3e38 does not */
        {{0x09, 0x02}, 2, 1, FERRY_ERR_LOCO_INDEX},       /* index 9 in n = 8 */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint8_t *p = make_payload(4, 0, 8, cases[c].count, cases[c].raw, cases[c].len, &size);
        p[5] = 2;
        reseal(p, size);
        int rc = ferry_loco_decode_with(p, size, 8, base, &h, &out);
        if (rc != cases[c].want) fprintf(stderr, "cell case %zu: %d (%s)\n", c, rc, ferry_last_error());
        CHECK(rc == cases[c].want);
        if (rc) CHECK(out.count == 0);
        else if (cases[c].raw[0] == 2) CHECK(out.count == 1 && out.idx[0] == 2 && out.val[0] == -2.0f * 0x1.0p-7f);
        else CHECK(out.count == 1 && out.idx[0] == 6 && out.val[0] == 0x1.0p120f);
        free(p);
    }
    /* random damage to cell payloads: loco codes or clean values, never a crash */
    float *b2 = malloc(500 * sizeof *b2);
    for (int i = 0; i < 500; i++) b2[i] = random_weight();
    ferry_loco_sparse sp = {0};
    int bad = 0, fails = 0;
    for (int t = 0; t < 2000; t++) {
        random_cells(&sp, b2, 500, 0.02 + 0.3 * unif());
        ferry_loco_header hh = {.round = (uint64_t)t, .n = 500, .count = sp.count, .values = FERRY_LOCO_VALUES_CELL};
        void *v;
        if (ferry_loco_encode_with(&hh, &sp, b2, 1, &v, &size)) { bad++; continue; }
        uint8_t *p = v;
        for (int f = 0, flips = 1 + (int)(rnd() % 4); f < flips; f++) p[rnd() % size] ^= (uint8_t)(1u << (rnd() % 8));
        size_t cut = (rnd() % 8 == 0) ? (size_t)(rnd() % size) : size;
        if ((t & 1) && cut >= 64) reseal(p, cut);
        int rc = ferry_loco_decode_with(p, cut, 500, b2, &h, &out);
        if (rc == 0) {
            for (uint64_t k = 0; k < out.count; k++)
                if (out.idx[k] >= 500 || !isfinite(out.val[k])) bad++;
        } else {
            fails++;
            if ((rc < 120 || rc > 139) || out.count) bad++;
        }
        ferry_free(v);
    }
    CHECK(bad == 0 && fails > 500);
    ferry_loco_sparse_release(&sp);
    ferry_loco_sparse_release(&out);
    free(b2);
}

static void test_outer_update(void)
{
    ferry_loco_outer c = ferry_loco_outer_default();
    enum { N = 1000 };
    float w[N], w0[N], b1[N] = {0}, b2[N] = {0}, g[N], u[N];
    for (int t = 0; t < 3; t++) {
        for (int i = 0; i < N; i++) w[i] = w0[i] = random_weight(), g[i] = (float)(unif() - 0.5) * 1e-3f;
        ferry_loco_outer_step(&c, w, b1, g, N);
        ferry_loco_outer_update(&c, b2, g, u, N);
        int bad = 0;
        for (int i = 0; i < N; i++) bad += f_bits(w[i]) != f_bits(w0[i] - u[i]) || f_bits(b1[i]) != f_bits(b2[i]);
        CHECK(bad == 0);
    }
    /* in place, and with lr 1 / momentum 0 the update is the gradient itself */
    ferry_loco_outer plain = {.lr = 1.0f, .momentum = 0.0f, .nesterov = 1};
    memcpy(u, g, sizeof g);
    ferry_loco_outer_update(&plain, b1, u, u, N);
    CHECK(!memcmp(u, g, sizeof g));
}

/* ---- outer step, hash, names ------------------------------------------------ */

static void test_outer_step(void)
{
    ferry_loco_outer c = ferry_loco_outer_default();
    CHECK(c.lr == 0.7f && c.momentum == 0.9f && c.nesterov == 1);
    float w[2] = {1.0f, -2.0f}, b[2] = {0, 0}, g[2] = {1.0f, 0.5f};
    ferry_loco_outer_step(&c, w, b, g, 2);
    /* PyTorch SGD(nesterov): buf = g; w -= lr·(g + μ·buf) */
    float e0 = 1.0f - 0.7f * (1.0f + 0.9f * 1.0f);
    CHECK(b[0] == 1.0f && w[0] == e0);
    ferry_loco_outer_step(&c, w, b, g, 2);
    float b1 = 0.9f * 1.0f + 1.0f;
    CHECK(b[0] == b1 && w[0] == e0 - 0.7f * (1.0f + 0.9f * b1));
    ferry_loco_outer plain = {.lr = 0.5f, .momentum = 0.0f, .nesterov = 0};
    float w2[1] = {1.0f}, b2[1] = {0}, g2[1] = {0.25f};
    ferry_loco_outer_step(&plain, w2, b2, g2, 1);
    CHECK(w2[0] == 0.875f);
}

static void test_hash(void)
{
    float w[3] = {1.0f, -0.0f, 3.5f};
    uint8_t h[16], h2[16];
    ferry_loco_hash(w, 3, h);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(w, sizeof w));
    CHECK(!memcmp(h, c.digest, 16));
    w[1] = 0.0f; /* -0 and +0 differ in bits, and so must the hash */
    ferry_loco_hash(w, 3, h2);
    CHECK(memcmp(h, h2, 16) != 0);
}

static void test_error_names(void)
{
    for (int c = FERRY_ERR_LOCO_MAGIC; c <= FERRY_ERR_LOCO_MODE; c++)
        CHECK(strncmp(ferry_strerror(c), "loco: ", 6) == 0);
}

int main(void)
{
    RUN(test_gate_matches_direct);
    RUN(test_gate_cases);
    RUN(test_residual_conserves);
    RUN(test_gate_rejects_nonfinite);
    RUN(test_round_trip);
    RUN(test_compact);
    RUN(test_encode_rejects);
    RUN(test_hostile_header);
    RUN(test_hostile_body);
    RUN(test_mutations);
    RUN(test_outer_step);
    RUN(test_cell_gate);
    RUN(test_cell_round_trip);
    RUN(test_cell_hostile);
    RUN(test_outer_update);
    RUN(test_hash);
    RUN(test_error_names);
    return CHECK_SUMMARY();
}
