/* Chunk encoder with static rANS, codecs 2 and 3 (docs/FORMAT.md). */
#include <stdlib.h>
#include "rans.h"
#include "sparse.h"

#define NTAB (SP_NCLASS + DELTA_NCTX) /* gap tables by class, then delta tables */

static int put_varint(ferry_buf *b, uint64_t v)
{
    uint8_t tmp[10];
    size_t n = 0;
    do {
        tmp[n++] = (uint8_t)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return ferry__buf_append(b, tmp, n);
}

/* Raw bits into a buffer reserved for the worst case (no checks per bit). */
typedef struct fastbits {
    uint8_t *p;
    uint64_t acc;
    unsigned n;
} fastbits;

static inline void fb_put(fastbits *w, uint64_t v, unsigned nbits) /* nbits <= 32 */
{
    /* branch-free: the low 32 bits are stored every time and kept when
     * full (field lengths vary with the data: a branch would mispredict) */
    w->acc |= (v & ((1ull << nbits) - 1)) << w->n;
    w->n += nbits;
    ferry__put32(w->p, (uint32_t)w->acc);
    unsigned full = w->n >> 5; /* n < 64 */
    w->p += 4 * full;
    w->acc >>= 32 * full;
    w->n -= 32 * full;
}

static inline void fb_put64(fastbits *w, uint64_t v, unsigned nbits)
{
    if (nbits > 32) {
        fb_put(w, v, 32);
        v >>= 32;
        nbits -= 32;
    }
    fb_put(w, v, nbits);
}

/* Symbols in decoding order: all gaps class by class, then the deltas in
 * position order; raw bits go to their own stream in the same order. */
static inline __attribute__((always_inline)) size_t build(const sp_dtype *t, uint32_t top, const sp_scratch *s,
                                                          size_t k, unsigned W, uint8_t *syms,
                                                          uint32_t (*count)[RANS_MAXSYM], fastbits *bw)
{
    /* locals: the byte stores below may alias anything */
    size_t ns = 0;
    const uint32_t *order = s->order;
    const uint64_t *old = s->old, *val = s->val;
#define GAP(r)                                                                                                         \
    do {                                                                                                               \
        uint64_t g = (uint32_t)((r) - prev - 1), rb = 0;                                                               \
        prev = (r);                                                                                                    \
        unsigned nr, sym = gap_sym(g, &rb, &nr);                                                                       \
        fb_put(bw, rb, nr);                                                                                            \
        syms[2 * ns] = (uint8_t)c;                                                                                     \
        syms[2 * ns + 1] = (uint8_t)sym;                                                                               \
        count[c][sym]++;                                                                                               \
        ns++;                                                                                                          \
    } while (0)
    for (uint32_t c = 0; c < sp_nclass(t); c++) {
        uint32_t prev = UINT32_MAX; /* r - prev - 1 is the first rank itself */
        if (s->lazy) { /* ranks straight off the scan's bitmap */
            const uint64_t *w = s->ebm + c * s->ebm_words;
            for (uint64_t q = 0; q * 64 < s->ebm_bits[c]; q++)
                for (uint64_t v = w[q]; v; v &= v - 1) GAP((uint32_t)(q * 64 + (uint64_t)__builtin_ctzll(v)));
        } else {
            for (uint32_t j = s->start[c], end = s->start[c + 1]; j < end; j++) GAP(order[j]);
        }
    }
#undef GAP
    sp_dtype tw = *t;
    tw.W = W; /* a constant for the compiler */
    const uint32_t *pairs = s->lazy ? s->word : NULL; /* old | new << 16 (W 16 only) */
    size_t j = 0;
#if FERRY_HAVE_X86_SIMD
    if (W == 16 && pairs && ferry__cpu_avx512()) {
        /* symbols 16 at a time, the raw fields packed 4 changes to a
         * word (in s->order, unused while lazy: 2.25 of its 4 bytes per
         * change); then the histogram, and the raw bits in order */
        uint64_t *quads = (uint64_t *)(void *)s->order;
        uint8_t *qbits = (uint8_t *)(quads + k / 4);
        j = ferry__codec_rans_delta_syms16_avx512(pairs, k, top, t->exp_shift, t->exp_mask, syms + 2 * ns, quads, qbits);
        for (size_t i = 0; i < j; i++, ns++) count[syms[2 * ns]][syms[2 * ns + 1]]++;
        for (size_t q = 0; q < j / 4; q++) fb_put64(bw, quads[q], qbits[q]);
    }
#endif
    for (; j < k; j++) {
        uint64_t x = pairs ? pairs[j] & 0xFFFF : old[j], y = pairs ? pairs[j] >> 16 : val[j], rb = 0;
        unsigned neg, nr, tab = SP_NCLASS + sp_dclass(&tw, top, x);
        unsigned sym = delta_sym(sp_delta(&tw, x, y, &neg), &rb, &nr);
        if (W <= 16) { /* the sign, then the raw bits: one field */
            fb_put(bw, neg | rb << 1, nr + 1);
        } else {
            fb_put(bw, neg, 1);
            fb_put64(bw, rb, nr);
        }
        syms[2 * ns] = (uint8_t)tab;
        syms[2 * ns + 1] = (uint8_t)sym;
        count[tab][sym]++;
        ns++;
    }
    return ns;
}

int ferry__codec_rans_encode(const sp_dtype *t, uint32_t top, unsigned codec, sp_scratch *s, size_t k, ferry_buf *out)
{
    uint32_t nclass = sp_nclass(t);
    size_t nsyms = 2 * k;
    uint8_t *syms = ferry__realloc(s->syms, 2 * nsyms);
    if (!syms) return FERRY_ERR_NOMEM;
    s->syms = syms;
    static _Thread_local uint32_t count[NTAB][RANS_MAXSYM];
    memset(count, 0, sizeof count);
    /* at most 31 gap bits and 64 delta bits per change */
    uint8_t *raw = ferry__malloc(k * 12 + 16);
    if (!raw) return FERRY_ERR_NOMEM;
    fastbits bw = {raw, 0, 0};
    size_t ns;
    switch (t->W) {
    case 8: ns = build(t, top, s, k, 8, syms, count, &bw); break;
    case 16: ns = build(t, top, s, k, 16, syms, count, &bw); break;
    case 32: ns = build(t, top, s, k, 32, syms, count, &bw); break;
    default: ns = build(t, top, s, k, 64, syms, count, &bw); break;
    }
    while (bw.n) { /* flush whole bytes, the last one zero-padded */
        *bw.p++ = (uint8_t)bw.acc;
        bw.acc >>= 8;
        bw.n = bw.n > 8 ? bw.n - 8 : 0;
    }
    size_t raw_size = (size_t)(bw.p - raw);

    /* Tables: per-class counts, gap tables of active classes, a bitmap of
     * the delta contexts in use and their tables. */
    int rc = FERRY_OK;
    FERRY_ASSERT_RC(rc, ns <= nsyms && raw_size <= k * 12 + 16); /* the bounds the buffers were sized by */
    rans_table tabs[NTAB];
    for (unsigned i = 0; !rc && i < NTAB; i++) rc = ferry__codec_rans_table_build(&tabs[i], count[i], i < SP_NCLASS ? GAP_NSYM : DELTA_NSYM);
    for (uint32_t c = 0; !rc && c < nclass; c++) rc = put_varint(out, s->start[c + 1] - s->start[c]);
    for (uint32_t c = 0; !rc && c < nclass; c++)
        if (s->start[c + 1] > s->start[c]) rc = ferry__codec_rans_table_write(&tabs[c], out);
    uint32_t used = 0;
    for (unsigned i = 0; i < DELTA_NCTX; i++)
        if (tabs[SP_NCLASS + i].nsym) used |= 1u << i;
    uint8_t ub[4];
    ferry__put32(ub, used);
    if (!rc) rc = ferry__buf_append(out, ub, 4);
    for (unsigned i = 0; !rc && i < DELTA_NCTX; i++)
        if (used >> i & 1) rc = ferry__codec_rans_table_write(&tabs[SP_NCLASS + i], out);

    /* rANS: codec 2 codes all symbols as one stream of 2 states, codec 3
     * the gaps and the deltas as two streams of RANS3_NSTATE states each
     * (symbol i of a stream uses state i mod nstates), which a decoder can
     * run in vector lanes; then the raw bits. */
    static _Thread_local rans_esym es[NTAB][RANS_MAXSYM];
    for (unsigned i = 0; !rc && i < NTAB; i++)
        for (unsigned y = 0; y < tabs[i].nsym; y++)
            if (tabs[i].freq[y]) rans_esym_init(&es[i][y], tabs[i].start[y], tabs[i].freq[y]);
    if (!rc && codec == SP_CODEC_RANS) rc = ferry__codec_rans_emit(syms, 0, ns, 2, (const rans_esym (*)[RANS_MAXSYM])es, out);
    if (!rc && codec != SP_CODEC_RANS) rc = ferry__codec_rans_emit(syms, 0, k, RANS3_NSTATE, (const rans_esym (*)[RANS_MAXSYM])es, out);
    if (!rc && codec != SP_CODEC_RANS) rc = ferry__codec_rans_emit(syms, k, ns, RANS3_NSTATE, (const rans_esym (*)[RANS_MAXSYM])es, out);
    if (!rc) rc = ferry__buf_append(out, raw, raw_size);
    free(raw);
    return rc;
}

int ferry__codec_rans_emit(const uint8_t *syms, size_t lo, size_t hi, unsigned nstates, const rans_esym (*es)[RANS_MAXSYM],
              ferry_buf *out)
{
    FERRY_ASSERT(nstates && !(nstates & (nstates - 1)) && nstates <= RANS3_NSTATE && lo <= hi);
    /* at most one 16-bit word per symbol */
    uint16_t *words = ferry__malloc((hi - lo + 1) * sizeof *words);
    if (!words) return FERRY_ERR_NOMEM;
    uint16_t *end = words + (hi - lo) + 1, *p = end;
    uint32_t x[RANS3_NSTATE];
    for (unsigned j = 0; j < nstates; j++) x[j] = RANS_L;
    size_t mid = lo;
#if FERRY_HAVE_X86_SIMD
    if (nstates == 32 && ferry__cpu_avx512()) mid = lo + ((hi - lo) & ~(size_t)31); /* whole groups in vectors */
#endif
    for (size_t i = hi; i-- > mid;) rans_put(&x[(i - lo) & (nstates - 1)], &p, &es[syms[2 * i]][syms[2 * i + 1]]);
#if FERRY_HAVE_X86_SIMD
    if (mid > lo) p = ferry__codec_rans32_emit_avx512(syms, lo, mid, es, p, x);
#endif
    size_t nw = (size_t)(end - p);
    uint64_t len = 4 * (uint64_t)nstates + 2 * (uint64_t)nw;
    int rc = len > UINT32_MAX ? ferry__fail(FERRY_ERR_LIMIT, "rANS stream too large") : FERRY_OK;
    FERRY_ASSERT_RC(rc, p >= words);
    if (!rc) rc = ferry__buf_reserve(out, 4 + len);
    if (!rc) {
        uint8_t *o = out->data + out->size;
        ferry__put32(o, (uint32_t)len);
        for (unsigned j = 0; j < nstates; j++) ferry__put32(o + 4 + 4 * j, x[j]);
        o += 4 + 4 * nstates;
        for (size_t i = 0; i < nw; i++) ferry__put16(o + 2 * i, p[i]);
        out->size += 4 + len;
    }
    free(words);
    return rc;
}
