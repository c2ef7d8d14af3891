/* Chunk decoder with static rANS: the inverse of rans_enc.c. */
#include <stdlib.h>
#include "rans.h"
#include "sparse.h"

#define NTAB (SP_NCLASS + DELTA_NCTX)

int rans_dec_open(rans_dec *d, const uint8_t **pp, const uint8_t *end, unsigned nstates)
{
    const uint8_t *p = *pp;
    if (end - p < 4) return sp_corrupt("truncated rANS header");
    uint32_t len = ferry__le32(p);
    if (len < 4 * nstates || len % 2 || len > (size_t)(end - p) - 4) return sp_corrupt("rANS stream length out of range");
    memset(d, 0, sizeof *d);
    for (unsigned j = 0; j < nstates; j++) {
        d->x[j] = ferry__le32(p + 4 + 4 * j);
        if (d->x[j] < RANS_L || d->x[j] >= (1u << 31)) return sp_corrupt("rANS state out of range");
    }
    d->p = p + 4 + 4 * nstates;
    d->end = p + 4 + len;
    d->mask = nstates - 1;
    *pp = d->end;
    return FERRY_OK;
}

bool rans_dec_done(const rans_dec *d)
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

/* The deltas of k changes, for a constant word width W. */
static inline __attribute__((always_inline)) int deltas(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t k,
                                                        sp_scratch *s, rans_dec *d, bitr *br, const uint32_t (*fs)[RANS_MAXSYM],
                                                        const bool *have, const uint64_t *dbase, const uint8_t *draw,
                                                        unsigned W)
{
    sp_dtype tw = *t;
    tw.W = W;
    for (size_t j = 0; j < k; j++) {
        uint64_t x = sp_load(a, s->pos[j], W);
        unsigned tab = SP_NCLASS + sp_dclass(&tw, top, x);
        if (FERRY_UNLIKELY(!have[tab])) return sp_corrupt("delta context without a table");
        unsigned sym = rans_dget(d, s->lut + (size_t)tab * RANS_M, fs[tab]);
        unsigned neg = (unsigned)bitr_get(br, 1);
        if (FERRY_UNLIKELY(draw[sym] > 62)) return sp_corrupt("delta out of range");
        uint64_t mag = dbase[sym] | bitr_get64(br, draw[sym]);
        if (FERRY_UNLIKELY(!sp_undelta(&tw, x, neg, mag, &s->val[j]))) return sp_corrupt("delta out of range");
    }
    return FERRY_OK;
}

int sp_rans_decode(const sp_dtype *t, uint32_t top, unsigned codec, const uint8_t *a, size_t n, const uint8_t *src, size_t len,
                   sp_scratch *s, size_t *kout)
{
    const uint8_t *p = src, *end = src + len;
    uint32_t nclass = sp_nclass(t);
    uint64_t kc[SP_NCLASS] = {0}, k = 0;
    for (uint32_t c = 0; c < nclass; c++) {
        if (!get_varint(&p, end, &kc[c]) || kc[c] > n - k) return sp_corrupt("class change count out of range");
        k += kc[c];
    }
    if (k == 0) return sp_corrupt("rANS chunk without changes");
    int rc = sp_scratch_fit(s, k);
    if (rc) return rc;
    if (!s->lut && !(s->lut = ferry__malloc((size_t)NTAB * RANS_M))) return FERRY_ERR_NOMEM;
    uint32_t fs[NTAB][RANS_MAXSYM];
    rans_table tabs[NTAB];
    bool have[NTAB] = {false};
    for (uint32_t c = 0; c < nclass; c++)
        if (kc[c]) {
            if ((rc = rans_table_read(&tabs[c], &p, end, GAP_NSYM))) return rc;
            have[c] = true;
        }
    if (end - p < 4) return sp_corrupt("truncated delta table bitmap");
    uint32_t used = ferry__le32(p);
    p += 4;
    if (used >> DELTA_NCTX) return sp_corrupt("unknown delta context");
    for (unsigned i = 0; i < DELTA_NCTX; i++)
        if (used >> i & 1) {
            if ((rc = rans_table_read(&tabs[SP_NCLASS + i], &p, end, DELTA_NSYM))) return rc;
            have[SP_NCLASS + i] = true;
        }
    for (unsigned i = 0; i < NTAB; i++)
        if (have[i]) rans_table_dtab(&tabs[i], s->lut + (size_t)i * RANS_M, fs[i]);

    /* codec 2: one stream for gaps and deltas; codec 3: one each */
    rans_dec ds[2], *dg = &ds[0], *dd = codec == SP_CODEC_RANS ? &ds[0] : &ds[1];
    if ((rc = rans_dec_open(dg, &p, end, codec == SP_CODEC_RANS ? 2 : RANS3_NSTATE))) return rc;
    if (dd != dg && (rc = rans_dec_open(dd, &p, end, RANS3_NSTATE))) return rc;
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
    for (uint32_t c = 0; c <= SP_NCLASS; c++) {
        s->start[c] = (uint32_t)at;
        if (c == nclass || c == SP_NCLASS) continue;
        const uint8_t *lut = s->lut + (size_t)c * RANS_M;
        uint64_t r = 0;
        for (uint64_t q = 0; q < kc[c]; q++) {
            unsigned sym = rans_dget(dg, lut, fs[c]);
            uint64_t g = gbase[sym] + bitr_get(&br, graw[sym]);
            r = q == 0 ? g : r + g + 1;
            if (g >= n || r >= n) return sp_corrupt("gap past the end of the chunk");
            s->order[at++] = (uint32_t)r;
        }
    }
    for (uint32_t c = nclass; c <= SP_NCLASS; c++) s->start[c] = (uint32_t)at;
    if (dg->overrun || br.overrun) return sp_corrupt("stream ends early");
    if ((rc = sp_walk(t, top, a, n, s, (size_t)k))) return rc;

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
    case 8: rc = deltas(t, top, a, k, s, dd, &br, fs, have, dbase, draw, 8); break;
    case 16: rc = deltas(t, top, a, k, s, dd, &br, fs, have, dbase, draw, 16); break;
    case 32: rc = deltas(t, top, a, k, s, dd, &br, fs, have, dbase, draw, 32); break;
    default: rc = deltas(t, top, a, k, s, dd, &br, fs, have, dbase, draw, 64); break;
    }
    if (rc) return rc;
    if (dd->overrun || br.overrun) return sp_corrupt("stream ends early");
    if (!rans_dec_done(dg) || !rans_dec_done(dd)) return sp_corrupt("rANS stream does not end where it should");
    if (!bitr_done(&br)) return sp_corrupt("unread raw bits");
    *kout = (size_t)k;
    return FERRY_OK;
}
