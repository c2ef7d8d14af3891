/* AVX2 versions of the scan and the walk for 16-bit words (BF16, F16, I16,
 * U16).  They must produce exactly the arrays of the portable loops in
 * scan.c (tests run both).  Classes of a block of words become a byte
 * vector, and per class one compare + movemask gives its lanes: the scan
 * counts them (32 words per step) for the ranks of changed lanes, the walk
 * (64 words per step) deposits the class's wanted ranks onto them. */
#include <stdlib.h>
#include "simd.h"

#if FERRY_HAVE_AVX2
#include <immintrin.h>

#define TARGET __attribute__((target("avx2,bmi2,popcnt")))

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

TARGET int ferry__codec_scan16_avx2(const sp_dtype *t, uint32_t top, const uint8_t *a, const uint8_t *b, size_t lo, size_t hi,
                          sp_scratch *s, sp_scan_state *st)
{
    FERRY_ASSERT(t->W == 16 && lo <= hi);
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
            if (k + 32 > s->cap && ferry__codec_scratch_fit(s, k + 32)) return FERRY_ERR_NOMEM;
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
            if (k == s->cap && ferry__codec_scratch_fit(s, k + 1)) return FERRY_ERR_NOMEM;
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

/* The walk, branch-free per block: the wanted ranks of class c are bits of
 * a bitmap in rank space (s->rbm, made by ferry__codec_walk_bitmaps); for a block of
 * 64 words, the bc bits at the class's running count, deposited (pdep) onto
 * the class's lanes, are the block's changed words of that class.  No
 * branch depends on where the changes fall. */
TARGET int ferry__codec_walk16_avx2(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n, sp_scratch *s, size_t k)
{
    /* at most k positions come out (ferry__codec_walk checked the ranks): room for them */
    FERRY_ASSERT(t->W == 16 && k <= s->cap);
    uint32_t nclass = sp_nclass(t);
    uint64_t cnt[SP_NCLASS] = {0}, lim[SP_NCLASS];
    const uint8_t *bm[SP_NCLASS];
    int rc = ferry__codec_walk_bitmaps(s, bm, lim);
    if (rc) return rc;
    const __m256i vtop = _mm256_set1_epi16((short)top);
    size_t got = 0, i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m256i *v = (const __m256i *)(const void *)(a + 2 * i);
        __m256i lo = classes32(t, vtop, _mm256_loadu_si256(v), _mm256_loadu_si256(v + 1));
        __m256i hi = classes32(t, vtop, _mm256_loadu_si256(v + 2), _mm256_loadu_si256(v + 3));
        uint64_t hits = 0;
        for (uint32_t c = 0; c < nclass; c++) {
            __m256i cc = _mm256_set1_epi8((char)c);
            uint64_t m = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(lo, cc)) |
                         (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(hi, cc)) << 32;
            unsigned bc = (unsigned)__builtin_popcountll(m);
            hits |= _pdep_u64(sp_bits_for_pdep(bm[c], cnt[c], lim[c], bc), m);
            cnt[c] += bc;
        }
        /* each wanted rank is one bit, so at most k positions come out,
         * with their base words (for the delta decoder and the undo log) */
        while (hits) {
            size_t at = i + (size_t)__builtin_ctzll(hits);
            s->pos[got] = (uint32_t)at;
            s->word[got++] = (uint32_t)sp_load(a, at, 16);
            hits &= hits - 1;
        }
    }
    for (; i < n; i++) {
        uint32_t c = sp_class(t, top, sp_load(a, i, 16));
        if (sp_bits_at(bm[c], cnt[c], lim[c], 1)) {
            s->pos[got] = (uint32_t)i;
            s->word[got++] = (uint32_t)sp_load(a, i, 16);
        }
        cnt[c]++;
    }
    if (got != k) return ferry__codec_corrupt("a change lies past its class's last word");
    s->have_words = 1;
    return FERRY_OK;
}
#endif
