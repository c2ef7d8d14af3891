/* AVX2 kernels of the rANS chunk decoder, for CPUs without AVX-512: a
 * codec-3 stream's 32 states in four vectors of 8 lanes, and gaps to ranks
 * 8 at a time, with the arithmetic of the AVX-512 kernels (rans_avx512.c,
 * which explains the equivalence with the portable loops).  AVX2 has no
 * expand, so the renormalising lanes take their words through a
 * permutation looked up by the lane mask.  Also the delta tables and the
 * deltas of 16-bit floats, 8 at a time. */
#include <pthread.h>
#include "rans.h"
#include "simd.h"

#if FERRY_HAVE_AVX2
#include <immintrin.h>

#define TARGET __attribute__((target("avx2,popcnt")))

/* For each 8-lane mask: lane i takes word popcount(mask & ((1 << i) - 1)). */
static uint8_t expand_lut[256][8];
static pthread_once_t expand_once = PTHREAD_ONCE_INIT;

static void expand_init(void)
{
    for (unsigned m = 0; m < 256; m++)
        for (unsigned i = 0, k = 0; i < 8; i++) {
            expand_lut[m][i] = (uint8_t)k;
            k += m >> i & 1;
        }
}

/* The low byte of each of 8 lanes, in lane order, to dst[0..8). */
static inline TARGET void store_low_bytes8(uint8_t *dst, __m256i v)
{
    __m256i b = _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8,
                                                        12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
    uint32_t lo = (uint32_t)_mm256_extract_epi32(b, 0), hi = (uint32_t)_mm256_extract_epi32(b, 4);
    memcpy(dst, &lo, 4);
    memcpy(dst + 4, &hi, 4);
}

static inline TARGET __m256i step(__m256i x, __m256i tabv, const uint32_t *lut32, const uint8_t **pp, uint8_t *sym)
{
    const __m256i slotm = _mm256_set1_epi32(RANS_M - 1), low12 = _mm256_set1_epi32(0xFFF), one = _mm256_set1_epi32(1),
                  lbound = _mm256_set1_epi32(RANS_L);
    __m256i slot = _mm256_and_si256(x, slotm);
    __m256i e = _mm256_i32gather_epi32((const int *)(const void *)lut32,
                                       _mm256_add_epi32(_mm256_slli_epi32(tabv, RANS_BITS), slot), 4);
    __m256i freq = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(e, 8), low12), one);
    x = _mm256_add_epi32(_mm256_mullo_epi32(freq, _mm256_srli_epi32(x, RANS_BITS)), _mm256_srli_epi32(e, 20));
    __m256i need = _mm256_cmpgt_epi32(lbound, x); /* states stay below 2^31: a signed compare */
    unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(need));
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)*pp));
    uint64_t perm;
    memcpy(&perm, expand_lut[m], 8);
    w = _mm256_permutevar8x32_epi32(w, _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)perm)));
    x = _mm256_blendv_epi8(x, _mm256_or_si256(_mm256_slli_epi32(x, 16), w), need);
    *pp += 2 * (unsigned)__builtin_popcount(m);
    store_low_bytes8(sym, e); /* the symbols */
    return x;
}

TARGET size_t ferry__codec_rans32_syms_avx2(rans_dec *d, const uint32_t *lut32, const uint8_t *tab, uint8_t *sym, size_t n)
{
    if (d->mask != RANS3_NSTATE - 1 || d->i != 0) return 0;
    pthread_once(&expand_once, expand_init);
    __m256i x[4];
    for (int v = 0; v < 4; v++) x[v] = _mm256_loadu_si256((const __m256i *)(const void *)(d->x + 8 * v));
    const uint8_t *p = d->p;
    size_t j = 0;
    /* a group reads at most 32 words, each step loads 16 bytes: 64 bytes
     * must remain */
    for (; j + 32 <= n && d->end - p >= 64; j += 32)
        for (int v = 0; v < 4; v++)
            x[v] = step(x[v], _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(tab + j + 8 * v))), lut32, &p,
                        sym + j + 8 * v);
    for (int v = 0; v < 4; v++) _mm256_storeu_si256((__m256i *)(void *)(d->x + 8 * v), x[v]);
    d->p = p;
    return j;
}
/* ---- gaps to ranks (ferry__codec_rans_gaps_avx512's work, 8 at a time) ---- */

/* Inclusive prefix sum of 8 lanes. */
static inline TARGET __m256i prefix8(__m256i v)
{
    v = _mm256_add_epi32(v, _mm256_slli_si256(v, 4));
    v = _mm256_add_epi32(v, _mm256_slli_si256(v, 8));
    __m256i t = _mm256_permutevar8x32_epi32(v, _mm256_set1_epi32(3)); /* the low half's total */
    return _mm256_add_epi32(v, _mm256_blend_epi32(_mm256_setzero_si256(), t, 0xF0));
}

/* Fields of nb[l] <= 32 bits at consecutive positions from bit *bp of raw;
 * false (nothing read) when a read could pass byte rawlen - 1. */
static inline TARGET bool fields8(const uint8_t *raw, size_t rawlen, uint64_t *bp, __m256i nb, __m256i *out)
{
    __m256i incl = prefix8(nb);
    uint32_t total = (uint32_t)_mm256_extract_epi32(incl, 7);
    uint64_t byte0 = *bp >> 3, sh0 = *bp & 7;
    if (byte0 + ((sh0 + total) >> 3) + 8 > rawlen) return false;
    __m256i off = _mm256_add_epi32(_mm256_sub_epi32(incl, nb), _mm256_set1_epi32((int)sh0));
    __m256i byteo = _mm256_srli_epi32(off, 3), sh = _mm256_and_si256(off, _mm256_set1_epi32(7));
    const long long *base = (const long long *)(const void *)(raw + byte0);
    __m256i lo = _mm256_i32gather_epi64(base, _mm256_castsi256_si128(byteo), 1);
    __m256i hi = _mm256_i32gather_epi64(base, _mm256_extracti128_si256(byteo, 1), 1);
    lo = _mm256_srlv_epi64(lo, _mm256_cvtepu32_epi64(_mm256_castsi256_si128(sh)));
    hi = _mm256_srlv_epi64(hi, _mm256_cvtepu32_epi64(_mm256_extracti128_si256(sh, 1)));
    const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6), one = _mm256_set1_epi32(1);
    __m256i v = _mm256_inserti128_si256(_mm256_permutevar8x32_epi32(lo, even),
                                        _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(hi, even)), 1);
    *out = _mm256_and_si256(v, _mm256_sub_epi32(_mm256_sllv_epi32(one, nb), one)); /* a shift by 32 gives 0 */
    *bp += total;
    return true;
}

TARGET size_t ferry__codec_rans_gaps_avx2(const uint8_t *sym, size_t cnt, uint64_t n, const uint8_t *raw, size_t rawlen, uint64_t *bp,
                             uint64_t *r, uint32_t *order, int *bad)
{
    if (n > ((uint64_t)1 << 27)) return 0; /* 8 gaps below n plus a rank below n stay below 2^31 */
    const __m256i one = _mm256_set1_epi32(1), three = _mm256_set1_epi32(3), four = _mm256_set1_epi32(4),
                  fifteen = _mm256_set1_epi32(15), sixteen = _mm256_set1_epi32(16), nm1 = _mm256_set1_epi32((int)n - 1);
    uint32_t carry = (uint32_t)*r;
    size_t q = 0;
    for (; q + 8 <= cnt; q += 8) {
        __m256i y = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(sym + q)));
        __m256i big = _mm256_cmpgt_epi32(y, fifteen);
        __m256i h = _mm256_srli_epi32(_mm256_sub_epi32(y, sixteen), 1), L = _mm256_add_epi32(h, four);
        __m256i gbig = _mm256_sub_epi32(
            _mm256_or_si256(_mm256_sllv_epi32(one, L), _mm256_sllv_epi32(_mm256_and_si256(y, one), _mm256_sub_epi32(L, one))), one);
        __m256i f;
        if (!fields8(raw, rawlen, bp, _mm256_and_si256(big, _mm256_add_epi32(h, three)), &f)) break;
        __m256i g = _mm256_add_epi32(_mm256_blendv_epi8(y, gbig, big), f);
        /* g < n for every lane, unsigned: max(g, n - 1) == n - 1 */
        if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_max_epu32(g, nm1), nm1)) != -1) {
            *bad = 1;
            return q;
        }
        __m256i rv = _mm256_add_epi32(prefix8(_mm256_add_epi32(g, one)), _mm256_set1_epi32((int)carry));
        uint32_t last = (uint32_t)_mm256_extract_epi32(rv, 7);
        if (last >= n) {
            *bad = 1;
            return q;
        }
        _mm256_storeu_si256((__m256i *)(void *)(order + q), rv);
        carry = last;
    }
    if (q) *r = carry;
    return q;
}

/* ---- delta tables and deltas (ferry__codec_rans_dtabs16_avx512 and ferry__codec_rans_deltas16_avx512, 8 at a time) ---- */

TARGET size_t ferry__codec_rans_dtabs16_avx2(unsigned exp_shift, uint32_t exp_mask, uint32_t top, const uint32_t *word, size_t k,
                                uint32_t have, uint8_t *tab, int *bad)
{
    const __m256i vtop = _mm256_set1_epi32((int)top), emask = _mm256_set1_epi32((int)exp_mask), zero = _mm256_setzero_si256(),
                  fifteen = _mm256_set1_epi32(SP_NDCLASS - 1), eight = _mm256_set1_epi32(SP_NCLASS),
                  vhave = _mm256_set1_epi32((int)have), one = _mm256_set1_epi32(1);
    const __m128i shift = _mm_cvtsi32_si128((int)exp_shift);
    size_t j = 0;
    for (; j + 8 <= k; j += 8) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(word + j));
        __m256i e = _mm256_and_si256(_mm256_srl_epi32(x, shift), emask);
        __m256i t = _mm256_add_epi32(_mm256_min_epi32(_mm256_max_epi32(_mm256_sub_epi32(vtop, e), zero), fifteen), eight);
        __m256i ok = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_srlv_epi32(vhave, t), one), one);
        if (_mm256_movemask_epi8(ok) != -1) {
            *bad = 1;
            return j;
        }
        store_low_bytes8(tab + j, t);
    }
    return j;
}

TARGET size_t ferry__codec_rans_deltas16_avx2(const uint32_t *word, const uint8_t *sym, size_t k, const uint8_t *raw, size_t rawlen,
                                 uint64_t *bp, uint64_t *val, int *bad)
{
    const __m256i one = _mm256_set1_epi32(1), two = _mm256_set1_epi32(2), three = _mm256_set1_epi32(3),
                  w16 = _mm256_set1_epi32(0xFFFF), half = _mm256_set1_epi32(0x8000), low15 = _mm256_set1_epi32(0x7FFF),
                  maxsym = _mm256_set1_epi32(30);
    size_t j = 0;
    for (; j + 8 <= k; j += 8) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(word + j));
        __m256i y = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(sym + j)));
        /* small values throughout: signed compares are the unsigned ones */
        if (_mm256_movemask_epi8(_mm256_cmpgt_epi32(y, maxsym))) {
            *bad = 1;
            return j;
        }
        __m256i big = _mm256_cmpgt_epi32(y, two); /* y >= 3 */
        __m256i h = _mm256_srli_epi32(_mm256_sub_epi32(y, three), 1), L = _mm256_add_epi32(h, two);
        __m256i f;
        if (!fields8(raw, rawlen, bp, _mm256_add_epi32(_mm256_and_si256(big, _mm256_add_epi32(h, one)), one), &f)) break;
        __m256i dbig = _mm256_or_si256(_mm256_sllv_epi32(one, L),
                                       _mm256_sllv_epi32(_mm256_and_si256(_mm256_sub_epi32(y, three), one), _mm256_sub_epi32(L, one)));
        __m256i mag = _mm256_or_si256(_mm256_blendv_epi8(_mm256_add_epi32(y, one), dbig, big), _mm256_srli_epi32(f, 1));
        __m256i neg = _mm256_cmpeq_epi32(_mm256_and_si256(f, one), one);
        /* sp_undelta's range: magnitude at most 2^15, and 2^15 only downwards */
        __m256i out = _mm256_or_si256(_mm256_cmpgt_epi32(mag, half), _mm256_andnot_si256(neg, _mm256_cmpeq_epi32(mag, half)));
        if (_mm256_movemask_epi8(out)) {
            *bad = 1;
            return j;
        }
        __m256i sgn = _mm256_srai_epi32(_mm256_slli_epi32(x, 16), 31);
        __m256i key = _mm256_xor_si256(x, _mm256_or_si256(_mm256_and_si256(sgn, low15), half));
        __m256i k2 = _mm256_and_si256(_mm256_blendv_epi8(_mm256_add_epi32(key, mag), _mm256_sub_epi32(key, mag), neg), w16);
        __m256i s2 = _mm256_srai_epi32(_mm256_slli_epi32(k2, 16), 31);
        __m256i v = _mm256_xor_si256(k2, _mm256_or_si256(_mm256_andnot_si256(s2, low15), half));
        _mm256_storeu_si256((__m256i *)(void *)(val + j), _mm256_cvtepu32_epi64(_mm256_castsi256_si128(v)));
        _mm256_storeu_si256((__m256i *)(void *)(val + j + 4), _mm256_cvtepu32_epi64(_mm256_extracti128_si256(v, 1)));
    }
    return j;
}
#endif
