/* AVX-512 versions of the encoder's scan and the decoder's walk for 16-bit
 * float words, 64 words per step.  They must give exactly the results of
 * the portable loops in scan.c (tests compare every level:
 * FERRY_NO_SIMD=avx512 falls back to AVX2, FERRY_NO_SIMD=1 to portable).
 *
 * The scan keeps, per class, the changed flags of the class's words as a
 * bitmap in rank space: for a step, the diff mask's bits on the class's
 * lanes, extracted (pext) and appended at the class's count.  So no rank is
 * computed per change: ferry__codec_scan_group only counts, and the rANS coder reads
 * the ranks off the bitmaps (ferry__codec_scan_unlazy makes the arrays for the
 * adaptive coder).  The old and new words of the changes leave by
 * vpcompressd, paired in 32-bit lanes.
 *
 * Compared with the AVX2 walk: the 64 classes of a step are packed into one
 * byte vector, so each class's lanes are one compare into a mask register;
 * and the changed positions leave the step by compressing a vector of lane
 * indices (vpcompressd) instead of a loop whose trip count is the number of
 * changes in the block, which mispredicted about once per block.  The base
 * words of the changes leave the same way (s->word), so that the delta
 * decoder does not have to gather them from the chunk again. */
#include <stdlib.h>
#include "simd.h"

#if FERRY_HAVE_AVX512
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,bmi,bmi2,popcnt")))

/* Classes of 64 base words as 64 bytes, in word order. */
static inline TARGET __m512i classes64(const sp_dtype *t, __m512i top, const uint8_t *a)
{
    const __m512i mask = _mm512_set1_epi16((short)t->exp_mask), zero = _mm512_setzero_si512(),
                  seven = _mm512_set1_epi16(SP_NCLASS - 1);
    __m512i e0 = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(a), t->exp_shift), mask);
    __m512i e1 = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(a + 64), t->exp_shift), mask);
    __m512i c0 = _mm512_min_epi16(_mm512_max_epi16(_mm512_sub_epi16(top, e0), zero), seven);
    __m512i c1 = _mm512_min_epi16(_mm512_max_epi16(_mm512_sub_epi16(top, e1), zero), seven);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(c0)), _mm512_cvtepi16_epi8(c1), 1);
}

/* Appends v (whose bits above the count being appended are 0) at bit off
 * of the bitmap w.  The word after off's word is overwritten, not or-ed:
 * nothing was appended there yet. */
static inline void put_bits(uint64_t *w, uint64_t off, uint64_t v)
{
    uint64_t i = off >> 6;
    unsigned sh = (unsigned)(off & 63);
    w[i] = (w[i] & ((1ull << sh) - 1)) | (v << sh);
    w[i + 1] = (v >> 1) >> (63 - sh);
}

/* Room in s->ebm for each class to grow by `more` ranks. */
static int ebm_fit(sp_scratch *s, const sp_scan_state *st, size_t more)
{
    uint64_t most = 0;
    for (int c = 0; c < SP_NCLASS; c++) most = st->cnt[c] > most ? st->cnt[c] : most;
    size_t need = (size_t)((most + more) / 64 + 2);
    if (need <= s->ebm_words) return FERRY_OK;
    size_t words = s->ebm_words ? s->ebm_words : 1024;
    while (words < need) words *= 2;
    uint64_t *p = ferry__malloc(SP_NCLASS * words * 8);
    if (!p) return FERRY_ERR_NOMEM;
    for (int c = 0; s->ebm && c < SP_NCLASS; c++) memcpy(p + c * words, s->ebm + c * s->ebm_words, s->ebm_words * 8);
    free(s->ebm);
    s->ebm = p;
    s->ebm_words = words;
    return FERRY_OK;
}

TARGET int ferry__codec_scan16_avx512(const sp_dtype *t, uint32_t top, const uint8_t *a, const uint8_t *b, size_t lo, size_t hi,
                            sp_scratch *s, sp_scan_state *st)
{
    FERRY_ASSERT(t->W == 16 && t->exp_mask && lo <= hi);
    size_t k = st->k;
    int rc = ferry__codec_scratch_fit(s, k + (hi - lo) + 16);
    if (rc || (rc = ebm_fit(s, st, hi - lo))) return rc;
    /* the compressed stores write whole vectors: 16 lanes past the last change */
    FERRY_ASSERT(s->cap >= k + (hi - lo) + 16);
    uint64_t *bm[SP_NCLASS], cnt[SP_NCLASS];
    for (int c = 0; c < SP_NCLASS; c++) {
        bm[c] = s->ebm + c * s->ebm_words;
        cnt[c] = st->cnt[c];
    }
    const __m512i vtop = _mm512_set1_epi16((short)top);
    /* word i of x, then word i of y (index 32 + i), for i in 0..15 or 16..31 */
    const __m512i pairs_lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4,
                                              35, 3, 34, 2, 33, 1, 32, 0),
                  pairs_hi = _mm512_add_epi16(pairs_lo, _mm512_set1_epi16(16));
    uint32_t *word = s->word;
    size_t i = lo;
    for (; i + 64 <= hi; i += 64) {
        const uint8_t *pa = a + 2 * i, *pb = b + 2 * (i - lo);
        uint64_t diff = (uint64_t)_mm512_cmpneq_epi16_mask(_mm512_loadu_si512(pa), _mm512_loadu_si512(pb)) |
                        (uint64_t)_mm512_cmpneq_epi16_mask(_mm512_loadu_si512(pa + 64), _mm512_loadu_si512(pb + 64)) << 32;
        __m512i cls = classes64(t, vtop, pa);
#pragma GCC unroll 8
        for (uint32_t c = 0; c < SP_NCLASS; c++) {
            uint64_t m = _mm512_cmpeq_epi8_mask(cls, _mm512_set1_epi8((char)c));
            put_bits(bm[c], cnt[c], _pext_u64(diff, m));
            cnt[c] += (uint64_t)__builtin_popcountll(m);
        }
        /* each change as one 32-bit lane: old word | new word << 16 */
        size_t o[4] = {k, k + (size_t)__builtin_popcountll(diff & 0xFFFF), k + (size_t)__builtin_popcountll(diff & 0xFFFFFFFF),
                       k + (size_t)__builtin_popcountll(diff & 0xFFFFFFFFFFFF)};
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            __mmask16 h = (__mmask16)(diff >> (16 * q));
            __m512i x = _mm512_loadu_si512(pa + 64 * (q >> 1)), y = _mm512_loadu_si512(pb + 64 * (q >> 1));
            __m512i xy = _mm512_permutex2var_epi16(x, (q & 1) ? pairs_hi : pairs_lo, y);
            _mm512_storeu_si512(word + o[q], _mm512_maskz_compress_epi32(h, xy));
        }
        k += (size_t)__builtin_popcountll(diff);
    }
    for (; i < hi; i++) { /* tail: one word at a time */
        uint32_t x = (uint32_t)sp_load(a, i, 16), y = (uint32_t)sp_load(b, i - lo, 16), c = sp_class(t, top, x);
        put_bits(bm[c], cnt[c]++, x != y);
        if (x != y) word[k++] = x | y << 16;
    }
    for (int c = 0; c < SP_NCLASS; c++) st->cnt[c] = (uint32_t)cnt[c];
    st->k = k;
    return FERRY_OK;
}

TARGET void ferry__codec_scan_group_bitmaps(sp_scratch *s, const sp_scan_state *st)
{
    size_t at = 0;
    for (int c = 0; c < SP_NCLASS; c++) {
        s->start[c] = (uint32_t)at;
        s->ebm_bits[c] = st->cnt[c];
        const uint64_t *w = s->ebm + c * s->ebm_words;
        for (uint64_t q = 0; q * 64 < st->cnt[c]; q++) at += (size_t)__builtin_popcountll(w[q]); /* bits past the count are 0 */
    }
    s->start[SP_NCLASS] = (uint32_t)at;
    s->lazy = 1;
}

TARGET int ferry__codec_walk16_avx512(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n, sp_scratch *s, size_t k)
{
    if (!t->exp_mask) return ferry__codec_walk16_avx2(t, top, a, n, s, k); /* one class: nothing to vectorise here */
    /* the compressed stores write whole vectors: room for 16 lanes past k */
    int rc = ferry__codec_scratch_fit(s, k + 16);
    if (rc) return rc;
    FERRY_ASSERT(t->W == 16 && s->cap >= k + 16);
    uint64_t cnt[SP_NCLASS] = {0}, lim[SP_NCLASS];
    const uint8_t *bm[SP_NCLASS];
    if ((rc = ferry__codec_walk_bitmaps(s, bm, lim))) return rc;
    const __m512i vtop = _mm512_set1_epi16((short)top), sixteen = _mm512_set1_epi32(16),
                  thirty2 = _mm512_set1_epi32(32), fourty8 = _mm512_set1_epi32(48), sixty4 = _mm512_set1_epi32(64);
    __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    uint32_t *pos = s->pos, *word = s->word;
    size_t got = 0, i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i cls = classes64(t, vtop, a + 2 * i);
        uint64_t hits = 0;
#pragma GCC unroll 8
        for (uint32_t c = 0; c < SP_NCLASS; c++) {
            uint64_t m = _mm512_cmpeq_epi8_mask(cls, _mm512_set1_epi8((char)c));
            unsigned bc = (unsigned)__builtin_popcountll(m);
            hits |= _pdep_u64(sp_bits_for_pdep(bm[c], cnt[c], lim[c], bc), m);
            cnt[c] += bc;
        }
        /* each wanted rank is one bit, so at most k positions come out.
         * The four stores' offsets come from prefix popcounts, so only one
         * add per step is on the chain through `got`. */
        size_t o1 = got + (size_t)__builtin_popcountll(hits & 0xFFFF), o2 = got + (size_t)__builtin_popcountll(hits & 0xFFFFFFFF),
               o3 = got + (size_t)__builtin_popcountll(hits & 0xFFFFFFFFFFFF);
        __mmask16 h0 = (__mmask16)hits, h1 = (__mmask16)(hits >> 16), h2 = (__mmask16)(hits >> 32), h3 = (__mmask16)(hits >> 48);
        _mm512_storeu_si512(pos + got, _mm512_maskz_compress_epi32(h0, lane));
        _mm512_storeu_si512(pos + o1, _mm512_maskz_compress_epi32(h1, _mm512_add_epi32(lane, sixteen)));
        _mm512_storeu_si512(pos + o2, _mm512_maskz_compress_epi32(h2, _mm512_add_epi32(lane, thirty2)));
        _mm512_storeu_si512(pos + o3, _mm512_maskz_compress_epi32(h3, _mm512_add_epi32(lane, fourty8)));
        const __m256i *w = (const __m256i *)(const void *)(a + 2 * i);
        _mm512_storeu_si512(word + got, _mm512_maskz_compress_epi32(h0, _mm512_cvtepu16_epi32(_mm256_loadu_si256(w))));
        _mm512_storeu_si512(word + o1, _mm512_maskz_compress_epi32(h1, _mm512_cvtepu16_epi32(_mm256_loadu_si256(w + 1))));
        _mm512_storeu_si512(word + o2, _mm512_maskz_compress_epi32(h2, _mm512_cvtepu16_epi32(_mm256_loadu_si256(w + 2))));
        _mm512_storeu_si512(word + o3, _mm512_maskz_compress_epi32(h3, _mm512_cvtepu16_epi32(_mm256_loadu_si256(w + 3))));
        got += (size_t)__builtin_popcountll(hits);
        lane = _mm512_add_epi32(lane, sixty4);
    }
    for (; i < n; i++) {
        uint32_t c = sp_class(t, top, sp_load(a, i, 16));
        if (sp_bits_at(bm[c], cnt[c], lim[c], 1)) {
            word[got] = (uint32_t)sp_load(a, i, 16);
            pos[got++] = (uint32_t)i;
        }
        cnt[c]++;
    }
    if (got != k) return ferry__codec_corrupt("a change lies past its class's last word");
    s->have_words = 1;
    return FERRY_OK;
}

TARGET size_t ferry__codec_narrow16_avx512(uint16_t *dst, const uint32_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(void *)(dst + i), _mm512_cvtepi32_epi16(_mm512_loadu_si512(src + i)));
    return i;
}
#endif

#if FERRY_HAVE_AVX512
/* The walk with the eight classes' work of a step in vector lanes (CPUs
 * with GFNI, VBMI and VPOPCNTDQ: ferry__codec_walk16_gfni_ok).  The scalar
 * walk above makes each class's mask with a compare, counts it and reads the
 * class's wanted bits one class at a time: about 8 x 8 dependent scalar
 * operations per step.  Here:
 *  - the 64 classes become one-hot bytes (vpshufb), in each qword in reverse
 *    word order, and one GF(2) affine transform (a bit transpose of each
 *    8 x 8 block) plus a byte transpose (vpermb) turn them into the eight
 *    64-bit class masks, class c in qword c;
 *  - vpopcntq counts them, and the eight classes' counts are one vector;
 *  - one gather reads each class's next 64 wanted bits at its count (a
 *    second one only in a step where a class holding more than 56 of its
 *    64 words straddles the bytes read);
 *  - only the eight pdeps stay scalar.
 * The result is that of the portable walk (tests compare every level). */
#define TARGET_G __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,avx512vpopcntdq,gfni,avx2,bmi,bmi2,popcnt")))

bool ferry__codec_walk16_gfni_ok(void)
{
    const char *off = getenv("FERRY_NO_GFNI");
    if (off && *off && strcmp(off, "0")) return false; /* tests: the AVX-512 walk above instead */
    return ferry__cpu_avx512() && __builtin_cpu_supports("gfni") && __builtin_cpu_supports("avx512vbmi") &&
           __builtin_cpu_supports("avx512vbmi2") &&
           __builtin_cpu_supports("avx512vpopcntdq");
}

TARGET_G int ferry__codec_walk16_gfni(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n, sp_scratch *s, size_t k)
{
    if (!t->exp_mask) return ferry__codec_walk16_avx2(t, top, a, n, s, k);
    int rc = ferry__codec_scratch_fit(s, k + 16);
    if (rc) return rc;
    FERRY_ASSERT(t->W == 16 && s->cap >= k + 16 && t->exp_shift < 16 && t->exp_mask <= 0xFF && top <= 0xFF);
    uint64_t lim[SP_NCLASS];
    const uint8_t *bm[SP_NCLASS];
    if ((rc = ferry__codec_walk_bitmaps(s, bm, lim))) return rc;
    /* the classes' bitmaps lie in one buffer: gather offsets from its start */
    uint64_t boff[SP_NCLASS];
    for (int c = 0; c < SP_NCLASS; c++) boff[c] = (uint64_t)(bm[c] - s->rbm);
    const __m512i vlim = _mm512_loadu_si512(lim), vboff = _mm512_loadu_si512(boff), seven = _mm512_set1_epi64(7),
                  sixty4 = _mm512_set1_epi64(64);
    /* exponent bytes: byte p = 8j + t of the result is the low byte of word
     * 8j + 7 - t (shifted words: x0 holds words 0..31, x1 32..63) */
    uint8_t pick[64], tr[64];
    for (int p = 0; p < 64; p++) {
        int w = 8 * (p / 8) + 7 - p % 8;
        pick[p] = (uint8_t)(2 * w); /* byte 2w of the 128 bytes x0 | x1 */
        tr[p] = (uint8_t)(8 * (p % 8) + p / 8);
    }
    const __m512i vpick = _mm512_loadu_si512(pick), vtr = _mm512_loadu_si512(tr);
    const __m512i emask = _mm512_set1_epi8((char)t->exp_mask), vtop = _mm512_set1_epi8((char)top),
                  cmax = _mm512_set1_epi8(SP_NCLASS - 1),
                  onehot = _mm512_broadcast_i32x4(_mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, (char)128, 0, 0, 0, 0, 0, 0, 0, 0)),
                  unit = _mm512_set1_epi64((long long)0x8040201008040201ull);
    const __m128i shift = _mm_cvtsi32_si128((int)t->exp_shift);
    const __m512i l16 = _mm512_set1_epi32(16), l32 = _mm512_set1_epi32(32), l48 = _mm512_set1_epi32(48), l64 = _mm512_set1_epi32(64);
    const __m512i lane0 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    uint8_t b64[64];
    for (int p = 0; p < 64; p++) b64[p] = (uint8_t)p;
    const __m512i bytes = _mm512_loadu_si512(b64);
    __m512i base = _mm512_setzero_si512(), cnt = _mm512_setzero_si512();
    /* more than one change in 8 words: steps of more than 16 hits are common */
    const bool dense = (uint64_t)k * 8 > (uint64_t)n;
    uint32_t *pos = s->pos, *word = s->word;
    size_t got = 0, i = 0;
    uint64_t mq[SP_NCLASS] __attribute__((aligned(64))), bq[SP_NCLASS] __attribute__((aligned(64)));
    for (; i + 64 <= n; i += 64) {
        const uint8_t *pa = a + 2 * i;
        _mm_prefetch((const char *)pa + 2048, _MM_HINT_T0);
        _mm_prefetch((const char *)pa + 2048 + 64, _MM_HINT_T0);
        __m512i w0 = _mm512_loadu_si512(pa), w1 = _mm512_loadu_si512(pa + 64);
        __m512i x0 = _mm512_srl_epi16(w0, shift), x1 = _mm512_srl_epi16(w1, shift);
        __m512i e = _mm512_and_si512(_mm512_permutex2var_epi8(x0, vpick, x1), emask);
        __m512i cls = _mm512_min_epu8(_mm512_subs_epu8(vtop, e), cmax); /* min(7, max(0, top - e)) */
        __m512i h = _mm512_shuffle_epi8(onehot, cls);
        /* qword j, byte c: bit b set iff word 8j + b is of class c */
        __m512i tq = _mm512_gf2p8affine_epi64_epi8(unit, h, 0);
        __m512i m = _mm512_permutexvar_epi8(vtr, tq); /* qword c: class c's mask */
        __m512i bc = _mm512_popcnt_epi64(m);
        __m512i sh = _mm512_and_si512(cnt, seven);
        __m512i at = _mm512_add_epi64(vboff, _mm512_min_epu64(_mm512_srli_epi64(cnt, 3), vlim));
        __m512i bits = _mm512_srlv_epi64(_mm512_i64gather_epi64(at, (const void *)s->rbm, 1), sh);
        __mmask8 straddle = _mm512_cmpgt_epu64_mask(_mm512_add_epi64(sh, bc), sixty4);
        if (FERRY_UNLIKELY(straddle)) {
            __m512i hi = _mm512_mask_i64gather_epi64(_mm512_setzero_si512(), straddle, _mm512_add_epi64(at, _mm512_set1_epi64(8)),
                                                     (const void *)s->rbm, 1);
            bits = _mm512_mask_or_epi64(bits, straddle, bits, _mm512_sllv_epi64(hi, _mm512_sub_epi64(sixty4, sh)));
        }
        cnt = _mm512_add_epi64(cnt, bc);
        _mm512_store_si512(mq, m);
        _mm512_store_si512(bq, bits);
        uint64_t hits = 0;
#pragma GCC unroll 8
        for (int c = 0; c < SP_NCLASS; c++) hits |= _pdep_u64(bq[c], mq[c]);
        unsigned nh = (unsigned)__builtin_popcountll(hits);
        if (FERRY_LIKELY(!dense) && nh <= 16) {
            /* the usual step of a sparse chunk: the (at most 16) hits' word
             * indices leave as bytes, once; their base words are picked by
             * those indices */
            __m128i ib = _mm512_castsi512_si128(_mm512_maskz_compress_epi8(hits, bytes));
            __m512i iw = _mm512_cvtepu8_epi32(ib);
            _mm512_storeu_si512(pos + got, _mm512_add_epi32(iw, base));
            __m512i bw = _mm512_permutex2var_epi16(w0, _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(ib)), w1);
            _mm512_storeu_si512(word + got, _mm512_cvtepu16_epi32(_mm512_castsi512_si256(bw)));
        } else {
            size_t o1 = got + (size_t)__builtin_popcountll(hits & 0xFFFF), o2 = got + (size_t)__builtin_popcountll(hits & 0xFFFFFFFF),
                   o3 = got + (size_t)__builtin_popcountll(hits & 0xFFFFFFFFFFFF);
            __mmask16 h0 = (__mmask16)hits, h1 = (__mmask16)(hits >> 16), h2 = (__mmask16)(hits >> 32), h3 = (__mmask16)(hits >> 48);
            __m512i lane = _mm512_add_epi32(lane0, base);
            _mm512_storeu_si512(pos + got, _mm512_maskz_compress_epi32(h0, lane));
            _mm512_storeu_si512(pos + o1, _mm512_maskz_compress_epi32(h1, _mm512_add_epi32(lane, l16)));
            _mm512_storeu_si512(pos + o2, _mm512_maskz_compress_epi32(h2, _mm512_add_epi32(lane, l32)));
            _mm512_storeu_si512(pos + o3, _mm512_maskz_compress_epi32(h3, _mm512_add_epi32(lane, l48)));
            const __m256i *w = (const __m256i *)(const void *)pa;
            _mm512_storeu_si512(word + got, _mm512_maskz_compress_epi32(h0, _mm512_cvtepu16_epi32(_mm256_loadu_si256(w))));
            _mm512_storeu_si512(word + o1, _mm512_maskz_compress_epi32(h1, _mm512_cvtepu16_epi32(_mm256_loadu_si256(w + 1))));
            _mm512_storeu_si512(word + o2, _mm512_maskz_compress_epi32(h2, _mm512_cvtepu16_epi32(_mm256_loadu_si256(w + 2))));
            _mm512_storeu_si512(word + o3, _mm512_maskz_compress_epi32(h3, _mm512_cvtepu16_epi32(_mm256_loadu_si256(w + 3))));
        }
        got += nh;
        base = _mm512_add_epi32(base, l64);
    }
    uint64_t cq[SP_NCLASS];
    _mm512_storeu_si512(cq, cnt);
    for (; i < n; i++) {
        uint32_t c = sp_class(t, top, sp_load(a, i, 16));
        if (sp_bits_at(bm[c], cq[c], lim[c], 1)) {
            word[got] = (uint32_t)sp_load(a, i, 16);
            pos[got++] = (uint32_t)i;
        }
        cq[c]++;
    }
    if (got != k) return ferry__codec_corrupt("a change lies past its class's last word");
    s->have_words = 1;
    return FERRY_OK;
}
#endif
