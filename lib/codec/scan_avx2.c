/* AVX2 versions of the scan and the walk for 16-bit words (BF16, F16, I16,
 * U16).  They must produce exactly the arrays of the portable loops in
 * scan.c (tests run both).  32 words per step: classes become a byte
 * vector, and per class one compare + movemask + popcount gives both the
 * block's count and, for the rare changed lanes, the rank. */
#include <stdlib.h>
#include "simd.h"

#if FERRY_HAVE_AVX2
#include <immintrin.h>

#define TARGET __attribute__((target("avx2,bmi2,popcnt")))

bool ferry__cpu_avx2(void)
{
    /* read per chunk (cheap next to a chunk's work), so that a test can
     * switch the kernels off and compare */
    const char *off = getenv("FERRY_NO_SIMD");
    if (off && *off && *off != '0') return false;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
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

/* Bit l set where the 16-bit words of x and y differ, for 32 words. */
static inline TARGET uint32_t diff32(__m256i a0, __m256i a1, __m256i b0, __m256i b1)
{
    __m256i e = _mm256_permute4x64_epi64(_mm256_packs_epi16(_mm256_cmpeq_epi16(a0, b0), _mm256_cmpeq_epi16(a1, b1)), 0xD8);
    return ~(uint32_t)_mm256_movemask_epi8(e);
}

TARGET int sp_scan16_avx2(const sp_dtype *t, uint32_t top, const uint8_t *a, const uint8_t *b, size_t lo, size_t hi,
                          sp_scratch *s, sp_scan_state *st)
{
    uint32_t nclass = sp_nclass(t), *cnt = st->cnt;
    const __m256i vtop = _mm256_set1_epi16((short)top);
    size_t k = st->k, i = lo;
    for (; i + 32 <= hi; i += 32) {
        __m256i a0 = _mm256_loadu_si256((const __m256i *)(const void *)(a + 2 * i));
        __m256i a1 = _mm256_loadu_si256((const __m256i *)(const void *)(a + 2 * i + 32));
        __m256i b0 = _mm256_loadu_si256((const __m256i *)(const void *)(b + 2 * (i - lo)));
        __m256i b1 = _mm256_loadu_si256((const __m256i *)(const void *)(b + 2 * (i - lo) + 32));
        uint32_t ch = diff32(a0, a1, b0, b1);
        __m256i cls = classes32(t, vtop, a0, a1);
        uint32_t m[SP_NCLASS];
        for (uint32_t c = 0; c < nclass; c++)
            m[c] = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(cls, _mm256_set1_epi8((char)c)));
        if (FERRY_UNLIKELY(ch)) {
            if (k + 32 > s->cap && sp_scratch_fit(s, k + 32)) return FERRY_ERR_NOMEM;
            uint8_t cb[32];
            _mm256_storeu_si256((__m256i *)(void *)cb, cls);
            const uint16_t *pa = (const uint16_t *)(const void *)(a + 2 * i), *pb = (const uint16_t *)(const void *)(b + 2 * (i - lo));
            do {
                unsigned l = (unsigned)__builtin_ctz(ch);
                uint32_t c = cb[l];
                s->old[k] = pa[l];
                s->val[k] = pb[l];
                s->pos[k] = (uint32_t)(i + l);
                s->cls[k] = c;
                s->rank[k] = cnt[c] + (uint32_t)__builtin_popcount(m[c] & ((1u << l) - 1));
                k++;
                ch &= ch - 1;
            } while (ch);
        }
        for (uint32_t c = 0; c < nclass; c++) cnt[c] += (uint32_t)__builtin_popcount(m[c]);
    }
    for (; i < hi; i++) { /* tail: the portable loop */
        uint64_t x = sp_load(a, i, 16), y = sp_load(b, i - lo, 16);
        uint32_t c = sp_class(t, top, x);
        if (x != y) {
            if (k == s->cap && sp_scratch_fit(s, k + 1)) return FERRY_ERR_NOMEM;
            s->old[k] = x;
            s->val[k] = y;
            s->pos[k] = (uint32_t)i;
            s->cls[k] = c;
            s->rank[k] = cnt[c];
            k++;
        }
        cnt[c]++;
    }
    st->k = k;
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
                /* the lane of the class's (tgt - cnt)-th word in the block */
                hits |= _pdep_u32(1u << (tgt[c] - cnt[c]), m);
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
