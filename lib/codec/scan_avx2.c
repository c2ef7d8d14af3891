/* AVX2 versions of the scan and the walk for 16-bit words (BF16, F16, I16,
 * U16).  They must produce exactly the arrays of the portable loops in
 * scan.c (tests run both).  32 words per step: classes become a byte
 * vector, and per class one compare + movemask + popcount gives both the
 * block's count and, for the rare changed lanes, the rank. */
#include <stdlib.h>
#include "simd.h"

#if FERRY_HAVE_AVX2
#include <immintrin.h>

#define TARGET __attribute__((target("avx2,popcnt")))

bool ferry__cpu_avx2(void)
{
    static int cached = -1;
    if (cached < 0) {
        const char *off = getenv("FERRY_NO_SIMD");
        cached = !(off && *off && *off != '0') && __builtin_cpu_supports("avx2");
    }
    return cached;
}

/* Classes of 32 base words as 32 bytes, in word order. */
static inline TARGET __m256i classes32(const sp_dtype *t, __m256i top, __m256i a0, __m256i a1)
{
    if (!t->exp_mask) return _mm256_setzero_si256();
    const __m256i mask = _mm256_set1_epi16((short)t->exp_mask), zero = _mm256_setzero_si256(),
                  seven = _mm256_set1_epi16(SP_NCLASS - 1);
    __m256i e0 = _mm256_and_si256(_mm256_srli_epi16(a0, (int)t->exp_shift), mask);
    __m256i e1 = _mm256_and_si256(_mm256_srli_epi16(a1, (int)t->exp_shift), mask);
    __m256i c0 = _mm256_min_epi16(_mm256_max_epi16(_mm256_sub_epi16(top, e0), zero), seven);
    __m256i c1 = _mm256_min_epi16(_mm256_max_epi16(_mm256_sub_epi16(top, e1), zero), seven);
    /* packus interleaves 128-bit lanes; the permute restores word order */
    return _mm256_permute4x64_epi64(_mm256_packus_epi16(c0, c1), 0xD8);
}

/* 16 FP32 masters -> 16 BF16 words (round to nearest even, NaN -> 0x7FC0). */
static inline TARGET __m256i cast16(const uint8_t *p)
{
    const __m256i abs = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000),
                  bias = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1), qnan = _mm256_set1_epi32(0x7FC0);
    __m256i r[2];
    for (int h = 0; h < 2; h++) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * h));
        __m256i rnd = _mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
        __m256i v = _mm256_srli_epi32(rnd, 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
        r[h] = _mm256_blendv_epi8(v, qnan, nan);
    }
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8);
}

static inline TARGET __m256i load_b(const sp_src *b, size_t i)
{
    if (b->f32_to_bf16) return cast16(b->p + 4 * i);
    return _mm256_loadu_si256((const __m256i *)(const void *)(b->p + 2 * i));
}

/* Bit l set where the 16-bit words of x and y differ, for 32 words. */
static inline TARGET uint32_t diff32(__m256i a0, __m256i a1, __m256i b0, __m256i b1)
{
    __m256i e = _mm256_permute4x64_epi64(_mm256_packs_epi16(_mm256_cmpeq_epi16(a0, b0), _mm256_cmpeq_epi16(a1, b1)), 0xD8);
    return ~(uint32_t)_mm256_movemask_epi8(e);
}

TARGET int sp_scan16_avx2(const sp_dtype *t, uint32_t top, const uint8_t *a, const sp_src *b, size_t n, sp_scratch *s,
                          size_t *kout)
{
    uint32_t cnt[SP_NCLASS] = {0}, nclass = sp_nclass(t);
    const __m256i vtop = _mm256_set1_epi16((short)top);
    size_t k = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i a0 = _mm256_loadu_si256((const __m256i *)(const void *)(a + 2 * i));
        __m256i a1 = _mm256_loadu_si256((const __m256i *)(const void *)(a + 2 * i + 32));
        uint32_t ch = diff32(a0, a1, load_b(b, i), load_b(b, i + 16));
        __m256i cls = classes32(t, vtop, a0, a1);
        uint32_t m[SP_NCLASS];
        for (uint32_t c = 0; c < nclass; c++)
            m[c] = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(cls, _mm256_set1_epi8((char)c)));
        if (FERRY_UNLIKELY(ch)) {
            if (k + 32 > s->cap && sp_scratch_fit(s, k + 32)) return FERRY_ERR_NOMEM;
            uint8_t cb[32];
            _mm256_storeu_si256((__m256i *)(void *)cb, cls);
            do {
                unsigned l = (unsigned)__builtin_ctz(ch);
                uint32_t c = cb[l];
                s->pos[k] = (uint32_t)(i + l);
                s->cls[k] = c;
                s->rank[k] = cnt[c] + (uint32_t)__builtin_popcount(m[c] & ((1u << l) - 1));
                k++;
                ch &= ch - 1;
            } while (ch);
        }
        for (uint32_t c = 0; c < nclass; c++) cnt[c] += (uint32_t)__builtin_popcount(m[c]);
    }
    for (; i < n; i++) { /* tail: the portable loop */
        uint64_t x = sp_load(a, i, 16);
        uint32_t c = sp_class(t, top, x);
        if (x != sp_src_load(b, i, 16)) {
            if (k == s->cap && sp_scratch_fit(s, k + 1)) return FERRY_ERR_NOMEM;
            s->pos[k] = (uint32_t)i;
            s->cls[k] = c;
            s->rank[k] = cnt[c];
            k++;
        }
        cnt[c]++;
    }
    *kout = k;
    return FERRY_OK;
}

TARGET int sp_walk16_avx2(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n, sp_scratch *s, size_t k)
{
    uint32_t cnt[SP_NCLASS] = {0}, ptr[SP_NCLASS], end[SP_NCLASS], nclass = sp_nclass(t);
    uint64_t tgt[SP_NCLASS]; /* next wanted rank of each class, or beyond any */
    memcpy(ptr, s->start, sizeof ptr);
    memcpy(end, s->start + 1, sizeof end);
    for (uint32_t c = 0; c < SP_NCLASS; c++) tgt[c] = ptr[c] < end[c] ? s->order[ptr[c]] : UINT64_MAX;
    const __m256i vtop = _mm256_set1_epi16((short)top);
    size_t got = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i a0 = _mm256_loadu_si256((const __m256i *)(const void *)(a + 2 * i));
        __m256i a1 = _mm256_loadu_si256((const __m256i *)(const void *)(a + 2 * i + 32));
        __m256i cls = classes32(t, vtop, a0, a1);
        uint32_t hits = 0;
        for (uint32_t c = 0; c < nclass; c++) {
            uint32_t m = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(cls, _mm256_set1_epi8((char)c)));
            uint32_t bc = (uint32_t)__builtin_popcount(m);
            /* the class's wanted ranks inside this block mark their lanes */
            while (FERRY_UNLIKELY(tgt[c] < (uint64_t)cnt[c] + bc)) {
                uint32_t skip = (uint32_t)(tgt[c] - cnt[c]), mm = m;
                while (skip--) mm &= mm - 1;
                hits |= mm & -mm;
                ptr[c]++;
                tgt[c] = ptr[c] < end[c] ? s->order[ptr[c]] : UINT64_MAX;
            }
            cnt[c] += bc;
        }
        if (FERRY_UNLIKELY(hits)) {
            uint8_t cb[32];
            _mm256_storeu_si256((__m256i *)(void *)cb, cls);
            do {
                unsigned l = (unsigned)__builtin_ctz(hits);
                if (got == k) return sp_corrupt("more changes than declared");
                s->pos[got] = (uint32_t)(i + l);
                s->cls[got] = cb[l];
                got++;
                hits &= hits - 1;
            } while (hits);
        }
    }
    for (; i < n; i++) {
        uint32_t c = sp_class(t, top, sp_load(a, i, 16));
        if (tgt[c] == cnt[c]) {
            if (got == k) return sp_corrupt("more changes than declared");
            s->pos[got] = (uint32_t)i;
            s->cls[got] = c;
            got++;
            ptr[c]++;
            tgt[c] = ptr[c] < end[c] ? s->order[ptr[c]] : UINT64_MAX;
        }
        cnt[c]++;
    }
    return got == k ? FERRY_OK : sp_corrupt("a change lies past its class's last word");
}
#endif
