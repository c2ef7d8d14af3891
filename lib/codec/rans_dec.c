/* Chunk decoder with static rANS: the inverse of rans_enc.c. */
#include <stdlib.h>
#include "rans.h"
#include "sparse.h"

#define NTAB (SP_NCLASS + DELTA_NCTX)

int ferry__codec_rans_dec_open(rans_dec *d, const uint8_t **pp, const uint8_t *end, unsigned nstates)
{
    const uint8_t *p = *pp;
    if (end - p < 4) return ferry__codec_corrupt("truncated rANS header");
    uint32_t len = ferry__le32(p);
    if (len < 4 * nstates || len % 2 || len > (size_t)(end - p) - 4) return ferry__codec_corrupt("rANS stream length out of range");
    memset(d, 0, sizeof *d);
    for (unsigned j = 0; j < nstates; j++) {
        d->x[j] = ferry__le32(p + 4 + 4 * j);
        if (d->x[j] < RANS_L || d->x[j] >= (1u << 31)) return ferry__codec_corrupt("rANS state out of range");
    }
    d->p = p + 4 + 4 * nstates;
    d->end = p + 4 + len;
    d->mask = nstates - 1;
    *pp = d->end;
    return FERRY_OK;
}

bool ferry__codec_rans_dec_done(const rans_dec *d)
{
    for (unsigned j = 0; j <= d->mask; j++)
        if (d->x[j] != RANS_L) return false;
    return d->p == d->end && !d->overrun;
}

static bool get_varint(const uint8_t **pp, const uint8_t *end, uint64_t *v)
{
    uint64_t r = 0;
    for (unsigned sh = 0; sh < 64; sh += 7) {
        if (*pp >= end) return false;
        uint8_t b = *(*pp)++;
        r |= (uint64_t)(b & 0x7F) << sh;
        if (!(b & 0x80)) {
            *v = r;
            return true;
        }
    }
    return false;
}

/* Decodes n symbols of stream d, symbol j with table tab[j], into sym[j]:
 * codec 3's streams in vector lanes where the CPU can, the rest one by
 * one. */
static int get_syms(rans_dec *d, const sp_scratch *s, const uint32_t (*fs)[RANS_MAXSYM], int simd, const uint8_t *tab,
                    uint8_t *sym, size_t n)
{
    size_t j = 0;
#if FERRY_HAVE_X86_SIMD
    if (simd == 2) j = ferry__codec_rans32_syms_avx512(d, s->lut32, tab, sym, n);
    if (simd == 1) j = ferry__codec_rans32_syms_avx2(d, s->lut32, tab, sym, n);
#else
    (void)simd;
#endif
    /* the kernels stop while 64 bytes remain: never past the stream */
    FERRY_ASSERT(j <= n && d->p <= d->end);
    for (; j < n; j++) sym[j] = (uint8_t)rans_dget(d, s->lut + (size_t)tab[j] * RANS_M, fs[tab[j]]);
    return FERRY_OK;
}

/* The deltas of k changes, for a constant word width W: each one's table
 * (the base word's delta class), their symbols, then sign and raw bits. */
static inline __attribute__((always_inline)) int deltas(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t k,
                                                        sp_scratch *s, rans_dec *d, bitr *br, const uint8_t *raw,
                                                        size_t rawlen, const uint32_t (*fs)[RANS_MAXSYM], int simd, int level,
                                                        const bool *have, const uint64_t *dbase, const uint8_t *draw,
                                                        unsigned W)
{
    sp_dtype tw = *t;
    tw.W = W;
    (void)level; /* the kernels' level: x86 only */
    uint8_t *tab = s->syms, *sym = s->syms + k;
    size_t j0 = 0, j1 = 0;
#if FERRY_HAVE_X86_SIMD
    int bad = 0;
    bool vec = W == 16 && t->is_float && s->have_words && level;
    if (vec) {
        uint32_t hv = 0;
        for (unsigned i = 0; i < NTAB; i++) hv |= (uint32_t)have[i] << i;
        j0 = level == 2 ? ferry__codec_rans_dtabs16_avx512(t->exp_shift, t->exp_mask, top, s->word, k, hv, tab, &bad)
                        : ferry__codec_rans_dtabs16_avx2(t->exp_shift, t->exp_mask, top, s->word, k, hv, tab, &bad);
        if (bad) return ferry__codec_corrupt("delta context without a table");
        FERRY_ASSERT(j0 <= k);
    }
#endif
    for (size_t j = j0; j < k; j++) {
        tab[j] = (uint8_t)(SP_NCLASS + sp_dclass(&tw, top, sp_load(a, s->pos[j], W)));
        if (FERRY_UNLIKELY(!have[tab[j]])) return ferry__codec_corrupt("delta context without a table");
    }
    int rc = get_syms(d, s, fs, simd, tab, sym, k);
    if (rc) return rc;
#if FERRY_HAVE_X86_SIMD
    if (vec) {
        uint64_t bp = bitr_tell(br, raw);
        j1 = level == 2 ? ferry__codec_rans_deltas16_avx512(s->word, sym, k, raw, rawlen, &bp, s->val, &bad)
                        : ferry__codec_rans_deltas16_avx2(s->word, sym, k, raw, rawlen, &bp, s->val, &bad);
        if (bad) return ferry__codec_corrupt("delta out of range");
        FERRY_ASSERT(j1 <= k);
        if (j1) bitr_seek(br, raw, bp);
    }
#endif
    for (size_t j = j1; j < k; j++) {
        uint64_t x = sp_load(a, s->pos[j], W);
        unsigned neg = (unsigned)bitr_get(br, 1);
        if (FERRY_UNLIKELY(draw[sym[j]] > 62)) return ferry__codec_corrupt("delta out of range");
        uint64_t mag = dbase[sym[j]] | bitr_get64(br, draw[sym[j]]);
        if (FERRY_UNLIKELY(!sp_undelta(&tw, x, neg, mag, &s->val[j]))) return ferry__codec_corrupt("delta out of range");
    }
    return FERRY_OK;
}

int ferry__codec_rans_decode(const sp_dtype *t, uint32_t top, unsigned codec, const uint8_t *a, size_t n, const uint8_t *src,
                   size_t len, sp_scratch *s, size_t *kout)
{
    const uint8_t *p = src, *end = src + len;
    uint32_t nclass = sp_nclass(t);
    uint64_t kc[SP_NCLASS] = {0}, k = 0;
    for (uint32_t c = 0; c < nclass; c++) {
        if (!get_varint(&p, end, &kc[c]) || kc[c] > n - k) return ferry__codec_corrupt("class change count out of range");
        k += kc[c];
    }
    if (k == 0) return ferry__codec_corrupt("rANS chunk without changes");
    int rc = ferry__codec_scratch_fit(s, k);
    if (rc) return rc;
    if (!s->lut && !(s->lut = ferry__malloc((size_t)NTAB * RANS_M))) return FERRY_ERR_NOMEM;
    uint32_t fs[NTAB][RANS_MAXSYM];
    rans_table tabs[NTAB];
    bool have[NTAB] = {false};
    for (uint32_t c = 0; c < nclass; c++)
        if (kc[c]) {
            if ((rc = ferry__codec_rans_table_read(&tabs[c], &p, end, GAP_NSYM))) return rc;
            have[c] = true;
        }
    if (end - p < 4) return ferry__codec_corrupt("truncated delta table bitmap");
    uint32_t used = ferry__le32(p);
    p += 4;
    if (used >> DELTA_NCTX) return ferry__codec_corrupt("unknown delta context");
    for (unsigned i = 0; i < DELTA_NCTX; i++)
        if (used >> i & 1) {
            if ((rc = ferry__codec_rans_table_read(&tabs[SP_NCLASS + i], &p, end, DELTA_NSYM))) return rc;
            have[SP_NCLASS + i] = true;
        }
    for (unsigned i = 0; i < NTAB; i++)
        if (have[i]) ferry__codec_rans_table_dtab(&tabs[i], s->lut + (size_t)i * RANS_M, fs[i]);
    /* vector kernels: 2 AVX-512, 1 AVX2, 0 none; decided once per chunk.
     * Gaps use them with either codec, symbols only with codec 3's lanes. */
    int level = 0;
#if FERRY_HAVE_X86_SIMD
    level = ferry__cpu_avx512() ? 2 : ferry__cpu_avx2() ? 1 : 0;
#endif
    int simd = codec == SP_CODEC_RANS32 ? level : 0;
#if FERRY_HAVE_X86_SIMD
    if (simd && !s->lut32 && !(s->lut32 = ferry__malloc((size_t)NTAB * RANS_M * 4))) return FERRY_ERR_NOMEM;
    for (unsigned i = 0; simd && i < NTAB; i++)
        if (have[i]) ferry__codec_rans32_fused_table(&tabs[i], s->lut32 + (size_t)i * RANS_M);
#endif
    /* per symbol its table, then the symbol: 2 bytes per change, per phase */
    uint8_t *sy = ferry__realloc(s->syms, 2 * (size_t)k);
    if (!sy) return FERRY_ERR_NOMEM;
    s->syms = sy;

    /* codec 2: one stream for gaps and deltas; codec 3: one each */
    rans_dec ds[2], *dg = &ds[0], *dd = codec == SP_CODEC_RANS ? &ds[0] : &ds[1];
    if ((rc = ferry__codec_rans_dec_open(dg, &p, end, codec == SP_CODEC_RANS ? 2 : RANS3_NSTATE))) return rc;
    if (dd != dg && (rc = ferry__codec_rans_dec_open(dd, &p, end, RANS3_NSTATE))) return rc;
    const uint8_t *raw = p;
    size_t rawlen = (size_t)(end - p);
    bitr br = {.p = p, .end = end};

    /* Gaps, class by class: a symbol, then its raw bits (gap_sym). */
    uint32_t gbase[GAP_NSYM];
    uint8_t graw[GAP_NSYM];
    for (unsigned y = 0; y < GAP_NSYM; y++) {
        unsigned L = 4 + (y - 16) / 2;
        gbase[y] = y < 16 ? y : ((1u << L) | (((y - 16) & 1u) << (L - 1))) - 1;
        graw[y] = (uint8_t)(y < 16 ? 0 : L - 1);
    }
    size_t at = 0;
    for (uint32_t c = 0; c < nclass; c++) {
        memset(sy + at, (int)c, kc[c]);
        at += kc[c];
    }
    if ((rc = get_syms(dg, s, fs, simd, sy, sy + k, k))) return rc;
    at = 0;
    for (uint32_t c = 0; c <= SP_NCLASS; c++) {
        s->start[c] = (uint32_t)at;
        if (c == nclass || c == SP_NCLASS) continue;
        uint64_t r = UINT64_MAX, q = 0; /* r + g + 1 wraps to the first gap */
#if FERRY_HAVE_X86_SIMD
        if (level) {
            uint64_t bp = bitr_tell(&br, raw);
            int bad = 0;
            q = (level == 2 ? ferry__codec_rans_gaps_avx512 : ferry__codec_rans_gaps_avx2)(sy + k + at, kc[c], n, raw, rawlen, &bp, &r, s->order + at,
                                                                 &bad);
            if (bad) return ferry__codec_corrupt("gap past the end of the chunk");
            FERRY_ASSERT(q <= kc[c]);
            if (q) bitr_seek(&br, raw, bp);
            at += q;
        }
#endif
        for (; q < kc[c]; q++) {
            unsigned sym = sy[k + at];
            uint64_t g = gbase[sym] + bitr_get(&br, graw[sym]);
            r = r + g + 1;
            if (g >= n || r >= n) return ferry__codec_corrupt("gap past the end of the chunk");
            s->order[at++] = (uint32_t)r;
        }
    }
    for (uint32_t c = nclass; c <= SP_NCLASS; c++) s->start[c] = (uint32_t)at;
    FERRY_ASSERT(at == k);
    if (dg->overrun || br.overrun) return ferry__codec_corrupt("stream ends early");
    if ((rc = ferry__codec_walk(t, top, a, n, s, (size_t)k))) return rc;

    /* Deltas, in position order: a symbol with the base word's delta class
     * as context, the sign, the raw bits of the magnitude (delta_sym). */
    uint64_t dbase[DELTA_NSYM];
    uint8_t draw[DELTA_NSYM];
    for (unsigned y = 0; y < DELTA_NSYM; y++) {
        unsigned L = 2 + (y - 3) / 2;
        dbase[y] = y < 3 ? y + 1 : L > 63 ? 0 : (1ull << L) | ((uint64_t)((y - 3) & 1) << (L - 1));
        draw[y] = (uint8_t)(y < 3 ? 0 : L - 1);
    }
    switch (t->W) {
    case 8: rc = deltas(t, top, a, k, s, dd, &br, raw, rawlen, fs, simd, level, have, dbase, draw, 8); break;
    case 16: rc = deltas(t, top, a, k, s, dd, &br, raw, rawlen, fs, simd, level, have, dbase, draw, 16); break;
    case 32: rc = deltas(t, top, a, k, s, dd, &br, raw, rawlen, fs, simd, level, have, dbase, draw, 32); break;
    default: rc = deltas(t, top, a, k, s, dd, &br, raw, rawlen, fs, simd, level, have, dbase, draw, 64); break;
    }
    if (rc) return rc;
    if (dd->overrun || br.overrun) return ferry__codec_corrupt("stream ends early");
    if (!ferry__codec_rans_dec_done(dg) || !ferry__codec_rans_dec_done(dd)) return ferry__codec_corrupt("rANS stream does not end where it should");
    if (!bitr_done(&br)) return ferry__codec_corrupt("unread raw bits");
    *kout = (size_t)k;
    return FERRY_OK;
}
