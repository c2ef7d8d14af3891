/* AVX-512 kernels of the rANS chunk coders (declared in rans.h): codec-3
 * symbol decoding and emission in 32 lanes, and the loops around them
 * (gaps to ranks, deltas, delta symbols) 16 changes at a time.  Each gives
 * exactly the result of its portable loop (tests and fuzz_chunk compare the
 * levels).
 *
 * Decoding: a codec-3 stream's 32 states live in two vectors of 16 lanes,
 * so one step decodes 32 symbols, as rans_dget would one by one:
 *   - symbol j of a group uses state j, as in the scalar decoder;
 *   - the lanes that renormalise take the next 16-bit words of the stream
 *     in lane order (vpexpandd), which is the order the scalar decoder
 *     reads them in, since a lane's renormalisation only depends on its
 *     own state.
 * One table entry per slot holds the symbol, its frequency - 1 and the
 * slot's offset in the symbol's range, so a step needs one gather. */
#include "rans.h"
#include "simd.h"
#include "sparse.h"

#if FERRY_HAVE_AVX512
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,popcnt")))

static inline TARGET __m512i step(__m512i x, __m512i tabv, const uint32_t *lut32, const uint8_t **pp, uint8_t *sym)
{
    const __m512i slotm = _mm512_set1_epi32(RANS_M - 1), low12 = _mm512_set1_epi32(0xFFF), one = _mm512_set1_epi32(1),
                  lbound = _mm512_set1_epi32(RANS_L), bytem = _mm512_set1_epi32(0xFF);
    __m512i slot = _mm512_and_si512(x, slotm);
    __m512i e = _mm512_i32gather_epi32(_mm512_add_epi32(_mm512_slli_epi32(tabv, RANS_BITS), slot), (const void *)lut32, 4);
    __m512i freq = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(e, 8), low12), one);
    x = _mm512_add_epi32(_mm512_mullo_epi32(freq, _mm512_srli_epi32(x, RANS_BITS)), _mm512_srli_epi32(e, 20));
    __mmask16 need = _mm512_cmplt_epu32_mask(x, lbound);
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)*pp));
    x = _mm512_mask_or_epi32(x, need, _mm512_slli_epi32(x, 16), _mm512_maskz_expand_epi32(need, w));
    *pp += 2 * (unsigned)__builtin_popcount(need);
    _mm_storeu_si128((__m128i *)(void *)sym, _mm512_cvtepi32_epi8(_mm512_and_si512(e, bytem)));
    return x;
}

TARGET size_t ferry__codec_rans32_syms_avx512(rans_dec *d, const uint32_t *lut32, const uint8_t *tab, uint8_t *sym, size_t n)
{
    if (d->mask != RANS3_NSTATE - 1 || d->i != 0) return 0;
    __m512i x0 = _mm512_loadu_si512(d->x), x1 = _mm512_loadu_si512(d->x + 16);
    const uint8_t *p = d->p;
    size_t j = 0;
    /* a group reads at most 32 words: 64 bytes must remain */
    for (; j + 32 <= n && d->end - p >= 64; j += 32) {
        x0 = step(x0, _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(tab + j))), lut32, &p, sym + j);
        x1 = step(x1, _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(tab + j + 16))), lut32, &p,
                  sym + j + 16);
    }
    _mm512_storeu_si512(d->x, x0);
    _mm512_storeu_si512(d->x + 16, x1);
    d->p = p;
    return j;
}
/* ---- the loops after symbol decoding ---- */

/* Inclusive prefix sum of 16 lanes. */
static inline TARGET __m512i prefix16(__m512i v)
{
    const __m512i z = _mm512_setzero_si512();
    v = _mm512_add_epi32(v, _mm512_alignr_epi32(v, z, 15));
    v = _mm512_add_epi32(v, _mm512_alignr_epi32(v, z, 14));
    v = _mm512_add_epi32(v, _mm512_alignr_epi32(v, z, 12));
    return _mm512_add_epi32(v, _mm512_alignr_epi32(v, z, 8));
}

static inline TARGET uint32_t last16(__m512i v) { return (uint32_t)_mm_extract_epi32(_mm512_extracti32x4_epi32(v, 3), 3); }

/* Fields of nb[l] <= 32 bits at consecutive positions from bit *bp of raw,
 * least significant bit first; false (nothing read) when a read could pass
 * byte rawlen - 1 (each lane loads 8 bytes). */
static inline TARGET bool fields(const uint8_t *raw, size_t rawlen, uint64_t *bp, __m512i nb, __m512i *out)
{
    __m512i incl = prefix16(nb);
    uint32_t total = last16(incl);
    uint64_t byte0 = *bp >> 3, sh0 = *bp & 7;
    if (byte0 + ((sh0 + total) >> 3) + 8 > rawlen) return false;
    __m512i off = _mm512_add_epi32(_mm512_sub_epi32(incl, nb), _mm512_set1_epi32((int)sh0));
    __m512i byteo = _mm512_srli_epi32(off, 3), sh = _mm512_and_si512(off, _mm512_set1_epi32(7));
    const uint8_t *base = raw + byte0;
    __m512i lo = _mm512_i32gather_epi64(_mm512_castsi512_si256(byteo), (const void *)base, 1);
    __m512i hi = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(byteo, 1), (const void *)base, 1);
    lo = _mm512_srlv_epi64(lo, _mm512_cvtepu32_epi64(_mm512_castsi512_si256(sh)));
    hi = _mm512_srlv_epi64(hi, _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(sh, 1)));
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(lo)), _mm512_cvtepi64_epi32(hi), 1);
    const __m512i one = _mm512_set1_epi32(1);
    *out = _mm512_and_si512(v, _mm512_sub_epi32(_mm512_sllv_epi32(one, nb), one)); /* a shift by 32 gives 0: all ones */
    *bp += total;
    return true;
}

TARGET size_t ferry__codec_rans_gaps_avx512(const uint8_t *sym, size_t cnt, uint64_t n, const uint8_t *raw, size_t rawlen, uint64_t *bp,
                               uint64_t *r, uint32_t *order, int *bad)
{
    /* 16 gaps below n plus a rank below n stay below 2^32 */
    if (n > ((uint64_t)1 << 27)) return 0;
    const __m512i one = _mm512_set1_epi32(1), three = _mm512_set1_epi32(3), four = _mm512_set1_epi32(4),
                  sixteen = _mm512_set1_epi32(16), vn = _mm512_set1_epi32((int)n);
    uint32_t carry = (uint32_t)*r; /* UINT64_MAX before the first: r + g + 1 wraps to g */
    size_t q = 0;
    for (; q + 16 <= cnt; q += 16) {
        /* gap_sym inverted: g < 16 is itself, else L = 4 + (y - 16) / 2,
         * ((1 << L) | bit << (L - 1)) - 1 plus L - 1 raw bits */
        __m512i y = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(sym + q)));
        __mmask16 big = _mm512_cmpge_epu32_mask(y, sixteen);
        __m512i h = _mm512_srli_epi32(_mm512_sub_epi32(y, sixteen), 1), L = _mm512_add_epi32(h, four);
        __m512i gbig = _mm512_sub_epi32(
            _mm512_or_si512(_mm512_sllv_epi32(one, L), _mm512_sllv_epi32(_mm512_and_si512(y, one), _mm512_sub_epi32(L, one))), one);
        __m512i f;
        if (!fields(raw, rawlen, bp, _mm512_maskz_add_epi32(big, h, three), &f)) break;
        /* big ? gbig : y, as arithmetic: a blend or masked move here crashes
         * clang 14 with -g (instruction selection) */
        __m512i g = _mm512_add_epi32(_mm512_add_epi32(y, _mm512_maskz_sub_epi32(big, gbig, y)), f);
        if (_mm512_cmpge_epu32_mask(g, vn)) {
            *bad = 1;
            return q;
        }
        __m512i rv = _mm512_add_epi32(prefix16(_mm512_add_epi32(g, one)), _mm512_set1_epi32((int)carry));
        uint32_t last = last16(rv);
        if (last >= n) { /* ranks increase: the last is the largest */
            *bad = 1;
            return q;
        }
        _mm512_storeu_si512(order + q, rv);
        carry = last;
    }
    if (q) *r = carry;
    return q;
}

/* ---- deltas of 16-bit floats ---- */

/* A base word's delta table: SP_NCLASS + its delta class (sp_dclass). */
static inline TARGET __m512i dtab16(__m512i x, __m128i shift, __m512i emask, __m512i vtop)
{
    __m512i e = _mm512_and_si512(_mm512_srl_epi32(x, shift), emask);
    return _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(_mm512_sub_epi32(vtop, e), _mm512_setzero_si512()),
                                             _mm512_set1_epi32(SP_NDCLASS - 1)),
                            _mm512_set1_epi32(SP_NCLASS));
}

/* The order key of 16-bit float words (ferry__fkey): a negative word flips
 * every bit, a positive one the sign. */
static inline TARGET __m512i fkey16(__m512i x)
{
    __m512i sgn = _mm512_srai_epi32(_mm512_slli_epi32(x, 16), 31);
    return _mm512_xor_si512(x, _mm512_or_si512(_mm512_and_si512(sgn, _mm512_set1_epi32(0x7FFF)), _mm512_set1_epi32(0x8000)));
}

TARGET size_t ferry__codec_rans_dtabs16_avx512(unsigned exp_shift, uint32_t exp_mask, uint32_t top, const uint32_t *word, size_t k,
                                  uint32_t have, uint8_t *tab, int *bad)
{
    const __m512i vtop = _mm512_set1_epi32((int)top), emask = _mm512_set1_epi32((int)exp_mask),
                  vhave = _mm512_set1_epi32((int)have), one = _mm512_set1_epi32(1);
    const __m128i shift = _mm_cvtsi32_si128((int)exp_shift);
    size_t j = 0;
    for (; j + 16 <= k; j += 16) {
        __m512i t = dtab16(_mm512_loadu_si512(word + j), shift, emask, vtop);
        if (_mm512_test_epi32_mask(_mm512_srlv_epi32(vhave, t), one) != 0xFFFF) {
            *bad = 1;
            return j;
        }
        _mm_storeu_si128((__m128i *)(void *)(tab + j), _mm512_cvtepi32_epi8(t));
    }
    return j;
}

TARGET size_t ferry__codec_rans_deltas16_avx512(const uint32_t *word, const uint8_t *sym, size_t k,
                                   const uint8_t *raw, size_t rawlen, uint64_t *bp, uint64_t *val, int *bad)
{
    const __m512i one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2), three = _mm512_set1_epi32(3),
                  w16 = _mm512_set1_epi32(0xFFFF), half = _mm512_set1_epi32(0x8000), low15 = _mm512_set1_epi32(0x7FFF),
                  maxsym = _mm512_set1_epi32(30);
    size_t j = 0;
    for (; j + 16 <= k; j += 16) {
        __m512i x = _mm512_loadu_si512(word + j);
        __m512i y = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(sym + j)));
        /* delta_sym inverted: 1, 2, 3 are symbols 0..2, else L = 2 + (y - 3) / 2,
         * (1 << L) | bit << (L - 1) plus L - 1 raw bits after the sign bit.
         * Symbols above 30 are magnitudes over 2^15: out of range for W 16. */
        if (_mm512_cmpgt_epu32_mask(y, maxsym)) {
            *bad = 1;
            return j;
        }
        __mmask16 big = _mm512_cmpge_epu32_mask(y, three);
        __m512i h = _mm512_srli_epi32(_mm512_sub_epi32(y, three), 1), L = _mm512_add_epi32(h, two);
        __m512i f;
        if (!fields(raw, rawlen, bp, _mm512_add_epi32(_mm512_maskz_add_epi32(big, h, one), one), &f)) break;
        __m512i dbig = _mm512_or_si512(_mm512_sllv_epi32(one, L),
                                       _mm512_sllv_epi32(_mm512_and_si512(_mm512_sub_epi32(y, three), one), _mm512_sub_epi32(L, one)));
        __m512i mag = _mm512_or_si512(_mm512_mask_blend_epi32(big, _mm512_add_epi32(y, one), dbig), _mm512_srli_epi32(f, 1));
        __mmask16 neg = _mm512_test_epi32_mask(f, one);
        /* sp_undelta's range: magnitude at most 2^15, and 2^15 only downwards */
        if (_mm512_cmpgt_epu32_mask(mag, half) | (_mm512_cmpeq_epi32_mask(mag, half) & (__mmask16)~neg)) {
            *bad = 1;
            return j;
        }
        __m512i key = fkey16(x);
        __m512i k2 = _mm512_and_si512(_mm512_mask_sub_epi32(_mm512_add_epi32(key, mag), neg, key, mag), w16);
        __m512i s2 = _mm512_srai_epi32(_mm512_slli_epi32(k2, 16), 31);
        __m512i v = _mm512_xor_si512(k2, _mm512_or_si512(_mm512_andnot_si512(s2, low15), half));
        _mm512_storeu_si512(val + j, _mm512_cvtepu32_epi64(_mm512_castsi512_si256(v)));
        _mm512_storeu_si512(val + j + 8, _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(v, 1)));
    }
    return j;
}
/* ---- encoding ---- */

/* One rans_put for 16 lanes; the lanes that renormalise store their low
 * words below *pp in lane order (the order the decoder reads them in). */
static inline TARGET __m512i put16(__m512i x, __m512i idx, const uint32_t *es, uint16_t **pp)
{
    __m512i xmax = _mm512_i32gather_epi32(idx, (const void *)es, 4);
    __m512i rcp = _mm512_i32gather_epi32(_mm512_add_epi32(idx, _mm512_set1_epi32(1)), (const void *)es, 4);
    __m512i bias = _mm512_i32gather_epi32(_mm512_add_epi32(idx, _mm512_set1_epi32(2)), (const void *)es, 4);
    __m512i cs = _mm512_i32gather_epi32(_mm512_add_epi32(idx, _mm512_set1_epi32(3)), (const void *)es, 4);
    __mmask16 big = _mm512_cmpge_epu32_mask(x, xmax);
    unsigned c = (unsigned)__builtin_popcount(big);
    *pp -= c;
    _mm256_mask_storeu_epi16(*pp, (__mmask16)((1u << c) - 1), _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(big, x)));
    x = _mm512_mask_srli_epi32(x, big, x, 16);
    /* q = (x * rcp) >> 32 >> shift: even and odd lanes' 64-bit products */
    __m512i pe = _mm512_mul_epu32(x, rcp), po = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), _mm512_srli_epi64(rcp, 32));
    __m512i q = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pe, 32), po);
    q = _mm512_srlv_epi32(q, _mm512_and_si512(_mm512_srli_epi32(cs, 16), _mm512_set1_epi32(0xFF)));
    __m512i cmpl = _mm512_and_si512(cs, _mm512_set1_epi32(0xFFFF));
    return _mm512_add_epi32(_mm512_add_epi32(x, bias), _mm512_mullo_epi32(q, cmpl));
}

/* (table, symbol) byte pairs -> rans_esym index in 32-bit words */
static inline TARGET __m512i esym_index(const uint8_t *pairs)
{
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)pairs));
    __m512i i = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0xFF)), 7), _mm512_srli_epi32(v, 8));
    return _mm512_slli_epi32(i, 2);
}

TARGET uint16_t *ferry__codec_rans32_emit_avx512(const uint8_t *syms, size_t lo, size_t hi, const rans_esym (*es)[RANS_MAXSYM],
                                    uint16_t *p, uint32_t *x)
{
    const uint32_t *e = (const uint32_t *)(const void *)es;
    __m512i x0 = _mm512_loadu_si512(x), x1 = _mm512_loadu_si512(x + 16);
    for (size_t g = hi; g > lo; g -= 32) { /* groups backwards; in a group, the high lanes first */
        x1 = put16(x1, esym_index(syms + 2 * (g - 16)), e, &p);
        x0 = put16(x0, esym_index(syms + 2 * (g - 32)), e, &p);
    }
    _mm512_storeu_si512(x, x0);
    _mm512_storeu_si512(x + 16, x1);
    return p;
}
/* Delta symbols of k changes of a 16-bit float dtype, from old | new << 16
 * pairs (the AVX-512 scan's): sp_delta, sp_dclass and delta_sym 16 at a
 * time.  (table, symbol) pairs go to syms; the sign and raw bits of changes
 * 4q..4q+3, in order, to quads[q] (qbits[q] bits).  Returns how many
 * it did (whole groups of 16). */
TARGET size_t ferry__codec_rans_delta_syms16_avx512(const uint32_t *pairs, size_t k, uint32_t top, unsigned exp_shift, uint32_t exp_mask,
                                       uint8_t *syms, uint64_t *quads, uint8_t *qbits)
{
    const __m512i w16 = _mm512_set1_epi32(0xFFFF), half = _mm512_set1_epi32(0x8000), one = _mm512_set1_epi32(1),
                  three = _mm512_set1_epi32(3), vtop = _mm512_set1_epi32((int)top), emask = _mm512_set1_epi32((int)exp_mask),
                  bias = _mm512_set1_epi32(127), wrap = _mm512_set1_epi32(0x10000), lo32 = _mm512_set1_epi64(0xFFFFFFFF);
    const __m128i shift = _mm_cvtsi32_si128((int)exp_shift);
    size_t j = 0;
    for (; j + 16 <= k; j += 16) {
        __m512i xy = _mm512_loadu_si512(pairs + j), x = _mm512_and_si512(xy, w16), y = _mm512_srli_epi32(xy, 16);
        __m512i d = _mm512_and_si512(_mm512_sub_epi32(fkey16(y), fkey16(x)), w16); /* the order keys' difference */
        __mmask16 neg = _mm512_cmpge_epu32_mask(d, half);
        __m512i mag = _mm512_mask_sub_epi32(d, neg, wrap, d);
        /* L = floor(log2 mag), exact through the float's exponent (mag <= 2^15) */
        __m512i L = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(_mm512_cvtepu32_ps(mag)), 23), bias);
        __mmask16 small = _mm512_cmple_epu32_mask(mag, three);
        __m512i Lm1 = _mm512_sub_epi32(L, one);
        __m512i big = _mm512_add_epi32(_mm512_sub_epi32(_mm512_add_epi32(L, L), one),
                                       _mm512_and_si512(_mm512_srlv_epi32(mag, Lm1), one)); /* 3 + 2 (L - 2) + bit L-1 */
        __m512i sym = _mm512_mask_blend_epi32(small, big, _mm512_sub_epi32(mag, one));
        __m512i nr = _mm512_maskz_mov_epi32((__mmask16)~small, Lm1);
        __m512i raw = _mm512_and_si512(mag, _mm512_sub_epi32(_mm512_sllv_epi32(one, nr), one));
        /* the fields (sign, then nr raw bits; at most 15 bits) of 4
         * consecutive changes as one value of at most 60 bits: pairs in
         * 64-bit lanes, then pairs of pairs */
        __m512i field = _mm512_or_si512(_mm512_maskz_mov_epi32(neg, one), _mm512_slli_epi32(raw, 1));
        __m512i flen = _mm512_add_epi32(nr, one);
        __m512i len2 = _mm512_and_si512(flen, lo32);
        __m512i pair = _mm512_or_si512(_mm512_and_si512(field, lo32), _mm512_sllv_epi64(_mm512_srli_epi64(field, 32), len2));
        __m512i plen = _mm512_add_epi64(len2, _mm512_srli_epi64(flen, 32));
        __m512i quad = _mm512_or_si512(pair, _mm512_sllv_epi64(_mm512_unpackhi_epi64(pair, pair), plen));
        __m512i qlen = _mm512_add_epi64(plen, _mm512_unpackhi_epi64(plen, plen));
        _mm256_storeu_si256((__m256i *)(void *)(quads + j / 4), _mm512_castsi512_si256(_mm512_maskz_compress_epi64(0x55, quad)));
        uint32_t ql = (uint32_t)_mm_cvtsi128_si32(_mm512_cvtepi64_epi8(_mm512_maskz_compress_epi64(0x55, qlen)));
        memcpy(qbits + j / 4, &ql, 4);
        __m512i tab = dtab16(x, shift, emask, vtop);
        _mm256_storeu_si256((__m256i *)(void *)(syms + 2 * j), _mm512_cvtepi32_epi16(_mm512_or_si512(tab, _mm512_slli_epi32(sym, 8))));
    }
    return j;
}
#endif
