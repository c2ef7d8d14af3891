/* The golden models, built in code from a fixed seed.
 *
 *   a  the base of every golden patch and of the patch fuzzer;
 *   b  a's successor with everything a patch can carry: sparse BF16 changes
 *      of +-1/+-2 ULP (and a few far ones) with sign crossings around zero,
 *      an F32 norm vector changed everywhere, sparse F16, I8, U8 and F64
 *      changes (every word width of the sparse coder), an
 *      unchanged tensor, an empty tensor, a tensor removed, a tensor added, a
 *      re-shaped tensor, a changed scalar, and changed metadata;
 *   c  a's successor with the same structure (names, dtypes, shapes,
 *      metadata) and sparse changes only: its patch applies in place.
 *
 * tests/tools/mkgolden.c writes them to tests/golden/, and
 * tests/fuzz/fuzz_patch.c uses a as its base.  The golden tests read the
 * files, not this code (except to check that the fuzzer's base is a), so
 * editing this header cannot silently move the golden bytes: regenerating
 * them is a deliberate act.  Uses the public API only. */
#ifndef FERRY_GOLDEN_MODEL_H
#define FERRY_GOLDEN_MODEL_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "ferry.h"

/* xorshift64*: the same sequence on every platform. */
static inline uint64_t golden_rnd(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}
/* Uniform in [lo, hi). */
static inline float golden_unif(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(golden_rnd(s) >> 11) * (1.0 / 9007199254740992.0));
}

/* Steps a W-bit float word by d units in the last place along the value
 * order (the order key of docs/FORMAT.md), crossing zero as values do. */
static inline uint64_t golden_fstep(uint64_t u, unsigned W, int d)
{
    uint64_t sign = (uint64_t)1 << (W - 1), mask = W == 64 ? ~(uint64_t)0 : (sign << 1) - 1;
    uint64_t k = (u & sign) ? (~u & mask) : (u | sign);
    k = (k + (uint64_t)(int64_t)d) & mask;
    return (k & sign) ? (k & ~sign) : (~k & mask);
}

/* A sparse-change delta in ULP with the measured mix: mostly +-1, some
 * +-2, rarely far. */
static inline int golden_delta(uint64_t *s)
{
    unsigned r = (unsigned)(golden_rnd(s) % 100);
    if (r < 44) return 1;
    if (r < 88) return -1;
    if (r < 93) return 2;
    if (r < 98) return -2;
    int far = 5 + (int)(golden_rnd(s) % 36);
    return r & 1 ? far : -far;
}

static inline uint16_t golden_ld16(const uint8_t *p, size_t i) { uint16_t v; memcpy(&v, p + 2 * i, 2); return v; }
static inline void golden_st16(uint8_t *p, size_t i, uint16_t v) { memcpy(p + 2 * i, &v, 2); }
static inline uint32_t golden_ld32(const uint8_t *p, size_t i) { uint32_t v; memcpy(&v, p + 4 * i, 4); return v; }
static inline void golden_st32(uint8_t *p, size_t i, uint32_t v) { memcpy(p + 4 * i, &v, 4); }

/* Sizes of the tensors (elements). */
enum {
    GOLDEN_EMBED = 32 * 48, /* > 1024 words: two chunks at the smallest chunk size */
    GOLDEN_WQ = 24 * 24,
    GOLDEN_LN = 24,
    GOLDEN_NORM = 24,
    GOLDEN_F16 = 16 * 8,
    GOLDEN_I8 = 128,
    GOLDEN_OLD = 16,
    GOLDEN_NEW = 8,
    GOLDEN_RESHAPED = 6 * 16,
    GOLDEN_MASK = 64,
    GOLDEN_F64 = 16,
};

/* Model 'a', 'b' or 'c' (NULL on an allocation failure or a bad letter). */
static inline ferry_model *golden_model(char which)
{
    if (which != 'a' && which != 'b' && which != 'c') return NULL;
    uint8_t embed[2 * GOLDEN_EMBED], wq[2 * GOLDEN_WQ], ln[2 * GOLDEN_LN], norm[4 * GOLDEN_NORM], f16[2 * GOLDEN_F16];
    uint8_t i8[GOLDEN_I8], old[2 * GOLDEN_OLD], newb[4 * GOLDEN_NEW], resh[2 * GOLDEN_RESHAPED], scale[4];
    uint8_t mask[GOLDEN_MASK], f64[8 * GOLDEN_F64];
    uint64_t s = 0x6F6C64656E2D61ull; /* "golden-a" */

    /* ---- a ---- */
    static const uint16_t tiny[6] = {0x0000, 0x8000, 0x0001, 0x8001, 0x0002, 0x8002};
    for (size_t i = 0; i < GOLDEN_EMBED; i++)
        golden_st16(embed, i, i % 97 == 5 ? tiny[(i / 97) % 6] : ferry_f32_to_bf16(golden_unif(&s, -0.06f, 0.06f)));
    for (size_t i = 0; i < GOLDEN_WQ; i++) golden_st16(wq, i, ferry_f32_to_bf16(golden_unif(&s, -0.1f, 0.1f)));
    for (size_t i = 0; i < GOLDEN_LN; i++) golden_st16(ln, i, ferry_f32_to_bf16(golden_unif(&s, -0.01f, 0.01f)));
    for (size_t i = 0; i < GOLDEN_NORM; i++) {
        float f = 1.0f + golden_unif(&s, -0.05f, 0.05f);
        uint32_t u;
        memcpy(&u, &f, 4);
        golden_st32(norm, i, u);
    }
    for (size_t i = 0; i < GOLDEN_F16; i++) {
        uint64_t r = golden_rnd(&s);
        uint16_t e = (uint16_t)(10 + r % 7), m = (uint16_t)((r >> 8) & 0x3FF), sg = (uint16_t)((r >> 20) & 1);
        golden_st16(f16, i, (uint16_t)(sg << 15 | e << 10 | m));
    }
    for (size_t i = 0; i < GOLDEN_I8; i++) i8[i] = (uint8_t)golden_rnd(&s);
    i8[0] = 0x80; /* -128 */
    i8[1] = 0x7F; /* 127 */
    i8[2] = 0xFF; /* -1 */
    i8[3] = 0x00;
    for (size_t i = 0; i < GOLDEN_OLD; i++) golden_st16(old, i, ferry_f32_to_bf16(golden_unif(&s, -0.02f, 0.02f)));
    for (size_t i = 0; i < GOLDEN_NEW; i++) golden_st32(newb, i, (uint32_t)golden_rnd(&s));
    for (size_t i = 0; i < GOLDEN_RESHAPED; i++) golden_st16(resh, i, (uint16_t)(0x3C00 + 0x10 * (i % 7)));
    float half = 0.5f;
    memcpy(scale, &half, 4);
    for (size_t i = 0; i < GOLDEN_MASK; i++) mask[i] = (uint8_t)(golden_rnd(&s) & 0x0F);
    for (size_t i = 0; i < GOLDEN_F64; i++) {
        double f = 1.0;
        for (size_t k = 0; k < i; k++) f *= 0.5623413251903491; /* 10000^(-1/16) */
        memcpy(f64 + 8 * i, &f, 8);
    }

    /* ---- b / c: changes drawn from their own streams ---- */
    uint64_t t = which == 'b' ? 0x6F6C64656E2D62ull : 0x6F6C64656E2D63ull;
    if (which == 'b') {
        for (size_t i = 0; i < GOLDEN_EMBED; i++) {
            uint16_t u = golden_ld16(embed, i);
            if (i % 97 == 5) /* around zero: +-2 ULP crosses the sign */
                golden_st16(embed, i, (uint16_t)golden_fstep(u, 16, (u & 0x8000) ? 2 : -2));
            else if (golden_rnd(&t) % 100 < 5)
                golden_st16(embed, i, (uint16_t)golden_fstep(u, 16, golden_delta(&t)));
        }
        for (size_t i = 0; i < GOLDEN_WQ; i++)
            if (golden_rnd(&t) % 100 < 3) golden_st16(wq, i, (uint16_t)golden_fstep(golden_ld16(wq, i), 16, golden_delta(&t)));
        golden_st16(wq, 7, (uint16_t)(golden_ld16(wq, 7) ^ 0x8000));       /* sign flip */
        golden_st16(wq, 100, (uint16_t)golden_fstep(golden_ld16(wq, 100), 16, 300));
        for (size_t i = 0; i < GOLDEN_NORM; i++) { /* dense: every element moves */
            float f;
            uint32_t u = golden_ld32(norm, i);
            memcpy(&f, &u, 4);
            f *= 1.0f + golden_unif(&t, -1e-3f, 1e-3f);
            memcpy(&u, &f, 4);
            if (u == golden_ld32(norm, i)) u++;
            golden_st32(norm, i, u);
        }
        for (size_t i = 0; i < GOLDEN_F16; i++)
            if (golden_rnd(&t) % 100 < 4) golden_st16(f16, i, (uint16_t)golden_fstep(golden_ld16(f16, i), 16, golden_delta(&t)));
        for (size_t i = 4; i < GOLDEN_I8; i++)
            if (golden_rnd(&t) % 100 < 5) i8[i] = (uint8_t)(i8[i] + (golden_rnd(&t) & 1 ? 1 : -1) * (int)(1 + golden_rnd(&t) % 3));
        mask[5] = (uint8_t)(mask[5] + 1);
        mask[40] = (uint8_t)(mask[40] ^ 0x80);
        for (size_t i = 3; i < GOLDEN_F64; i += 9) {
            uint64_t u;
            memcpy(&u, f64 + 8 * i, 8);
            u = golden_fstep(u, 64, i & 1 ? 1 : -1);
            memcpy(f64 + 8 * i, &u, 8);
        }
        i8[0] = 0x81; /* -128 -> -127 */
        i8[2] = 0x01; /* -1 -> 1, across zero */
        golden_st32(scale, 0, (uint32_t)golden_fstep(golden_ld32(scale, 0), 32, 1));
    } else if (which == 'c') {
        for (size_t i = 0; i < GOLDEN_EMBED; i++)
            if (golden_rnd(&t) % 100 < 2) golden_st16(embed, i, (uint16_t)golden_fstep(golden_ld16(embed, i), 16, golden_delta(&t)));
        golden_st16(wq, 300, (uint16_t)golden_fstep(golden_ld16(wq, 300), 16, -1));
        for (size_t i = 3; i < GOLDEN_NORM; i += 8) golden_st32(norm, i, (uint32_t)golden_fstep(golden_ld32(norm, i), 32, 1));
        i8[10] = (uint8_t)(i8[10] + 1);
        i8[99] = (uint8_t)(i8[99] - 2);
        mask[63] = (uint8_t)(mask[63] - 1);
        {
            uint64_t u;
            memcpy(&u, f64 + 8 * 7, 8);
            u = golden_fstep(u, 64, 2);
            memcpy(f64 + 8 * 7, &u, 8);
        }
        /* the scalar stays: c is the sparse-only successor (a changed
         * scalar is wholly changed and carried WHOLE) */
    }

    ferry_model *m = NULL;
    if (ferry_model_create(&m)) return NULL;
    const uint64_t s_embed[2] = {32, 48}, s_wq[2] = {24, 24}, s_ln[1] = {GOLDEN_LN}, s_norm[1] = {GOLDEN_NORM};
    const uint64_t s_f16[2] = {16, 8}, s_i8[1] = {GOLDEN_I8}, s_old[1] = {GOLDEN_OLD}, s_new[1] = {GOLDEN_NEW};
    const uint64_t s_resh_a[2] = {6, 16}, s_resh_b[2] = {16, 6}, s_empty[2] = {0, 4};
    const uint64_t s_mask[1] = {GOLDEN_MASK}, s_f64[1] = {GOLDEN_F64};
    int rc = ferry_model_add(m, "embed.weight", FERRY_BF16, 2, s_embed, embed, sizeof embed, FERRY_ADD_COPY);
    if (!rc) rc = ferry_model_add(m, "layers.0.attn.wq", FERRY_BF16, 2, s_wq, wq, sizeof wq, FERRY_ADD_COPY);
    if (!rc) rc = ferry_model_add(m, "layers.0.empty", FERRY_BF16, 2, s_empty, NULL, 0, FERRY_ADD_COPY);
    if (!rc) rc = ferry_model_add(m, "layers.0.mask", FERRY_U8, 1, s_mask, mask, sizeof mask, FERRY_ADD_COPY);
    if (!rc) rc = ferry_model_add(m, "layers.0.ln.bias", FERRY_BF16, 1, s_ln, ln, sizeof ln, FERRY_ADD_COPY);
    if (!rc) rc = ferry_model_add(m, "layers.0.norm.weight", FERRY_F32, 1, s_norm, norm, sizeof norm, FERRY_ADD_COPY);
    if (!rc) rc = ferry_model_add(m, "layers.0.proj.f16", FERRY_F16, 2, s_f16, f16, sizeof f16, FERRY_ADD_COPY);
    if (!rc) rc = ferry_model_add(m, "layers.0.quant.i8", FERRY_I8, 1, s_i8, i8, sizeof i8, FERRY_ADD_COPY);
    if (!rc && which != 'b') rc = ferry_model_add(m, "old.bias", FERRY_BF16, 1, s_old, old, sizeof old, FERRY_ADD_COPY);
    if (!rc && which == 'b') rc = ferry_model_add(m, "new.bias", FERRY_F32, 1, s_new, newb, sizeof newb, FERRY_ADD_COPY);
    if (!rc) rc = ferry_model_add(m, "reshaped.weight", FERRY_BF16, 2, which == 'b' ? s_resh_b : s_resh_a, resh, sizeof resh, FERRY_ADD_COPY);
    if (!rc) rc = ferry_model_add(m, "rope.freqs", FERRY_F64, 1, s_f64, f64, sizeof f64, FERRY_ADD_COPY);
    if (!rc) rc = ferry_model_add(m, "scale", FERRY_F32, 0, NULL, scale, sizeof scale, FERRY_ADD_COPY);
    if (!rc) rc = ferry_model_set_metadata(m, "format", "pt");
    if (!rc) rc = ferry_model_set_metadata(m, "step", which == 'b' ? "1" : "0");
    if (!rc && which == 'b') rc = ferry_model_set_metadata(m, "run", "golden");
    if (rc) {
        ferry_model_free(m);
        return NULL;
    }
    return m;
}
#endif
