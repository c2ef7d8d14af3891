/* Chunk decoder with static rANS: the inverse of rans_enc.c. */
#include <stdlib.h>
#include "rans.h"
#include "sparse.h"

#define NTAB (SP_NCLASS + DELTA_NCTX)

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

int sp_rans_decode(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n, const uint8_t *src, size_t len,
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
        if (have[i]) rans_table_lut(&tabs[i], s->lut + (size_t)i * RANS_M);

    if (end - p < 12) return sp_corrupt("truncated rANS header");
    uint32_t rlen = ferry__le32(p);
    if (rlen < 8 || rlen % 2 || rlen > (size_t)(end - p) - 4) return sp_corrupt("rANS stream length out of range");
    rans_dec d = {.p = p + 12, .end = p + 4 + rlen, .x = {ferry__le32(p + 4), ferry__le32(p + 8)}};
    for (int i = 0; i < 2; i++)
        if (d.x[i] < RANS_L || d.x[i] >= (1u << 31)) return sp_corrupt("rANS state out of range");
    bitr br = {.p = d.end, .end = end};
    size_t i = 0;

    /* Gaps, class by class. */
    size_t at = 0;
    for (uint32_t c = 0; c <= SP_NCLASS; c++) {
        s->start[c] = (uint32_t)at;
        if (c == nclass || c == SP_NCLASS) continue;
        uint64_t r = 0;
        for (uint64_t q = 0; q < kc[c]; q++, i++) {
            unsigned sym = rans_get(&d, i & 1, &tabs[c], s->lut + (size_t)c * RANS_M);
            uint64_t g = sym;
            if (sym >= 16) {
                unsigned L = 4 + (sym - 16) / 2;
                uint64_t x = (1ull << L) | ((uint64_t)((sym - 16) & 1) << (L - 1)) | bitr_get(&br, L - 1);
                g = x - 1;
            }
            r = q == 0 ? g : r + g + 1;
            if (g >= n || r >= n) return sp_corrupt("gap past the end of the chunk");
            s->order[at++] = (uint32_t)r;
        }
    }
    for (uint32_t c = nclass; c <= SP_NCLASS; c++) s->start[c] = (uint32_t)at;
    if (d.overrun || br.overrun) return sp_corrupt("stream ends early");
    if ((rc = sp_walk(t, top, a, n, s, (size_t)k))) return rc;

    /* Deltas, in position order. */
    for (size_t j = 0; j < k; j++, i++) {
        uint64_t x = sp_load(a, s->pos[j], t->W);
        unsigned tab = SP_NCLASS + sp_dclass(t, top, x);
        if (!have[tab]) return sp_corrupt("delta context without a table");
        unsigned sym = rans_get(&d, i & 1, &tabs[tab], s->lut + (size_t)tab * RANS_M);
        unsigned neg = (unsigned)bitr_get(&br, 1);
        uint64_t mag = sym + 1;
        if (sym >= 3) {
            unsigned L = 2 + (sym - 3) / 2;
            if (L > 63) return sp_corrupt("delta out of range");
            mag = (1ull << L) | ((uint64_t)((sym - 3) & 1) << (L - 1)) | bitr_get64(&br, L - 1);
        }
        if (!sp_undelta(t, x, neg, mag, &s->val[j])) return sp_corrupt("delta out of range");
    }
    if (d.overrun || br.overrun) return sp_corrupt("stream ends early");
    if (d.x[0] != RANS_L || d.x[1] != RANS_L || d.p != d.end) return sp_corrupt("rANS stream does not end where it should");
    if (!bitr_done(&br)) return sp_corrupt("unread raw bits");
    *kout = (size_t)k;
    return FERRY_OK;
}
