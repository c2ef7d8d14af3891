/* Chunk encoder with static rANS (docs/FORMAT.md, "rANS chunks"). */
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

int sp_rans_encode(const sp_dtype *t, uint32_t top, const uint8_t *a, const sp_src *b, sp_scratch *s, size_t k, ferry_buf *out)
{
    uint32_t nclass = sp_nclass(t);
    size_t nsyms = 2 * k;
    uint8_t *syms = ferry__realloc(s->syms, 2 * nsyms);
    if (!syms) return FERRY_ERR_NOMEM;
    s->syms = syms;
    static _Thread_local uint32_t count[NTAB][RANS_MAXSYM];
    memset(count, 0, sizeof count);
    ferry_buf raw = {0};
    bitw bw = {.out = &raw};
    size_t ns = 0;

    /* 1. Symbols in decoding order; raw bits go to their own stream. */
    for (uint32_t c = 0; c < nclass; c++) {
        for (uint32_t j = s->start[c]; j < s->start[c + 1]; j++) {
            uint64_t g = j == s->start[c] ? s->order[j] : (uint64_t)s->order[j] - s->order[j - 1] - 1, rb = 0;
            unsigned nr, sym = gap_sym(g, &rb, &nr);
            bitw_put(&bw, rb, nr);
            syms[2 * ns] = (uint8_t)c;
            syms[2 * ns + 1] = (uint8_t)sym;
            count[c][sym]++;
            ns++;
        }
    }
    for (size_t j = 0; j < k; j++) {
        uint64_t x = sp_load(a, s->pos[j], t->W), y = sp_src_load(b, s->pos[j], t->W), rb = 0;
        unsigned neg, nr, tab = SP_NCLASS + sp_dclass(t, top, x);
        unsigned sym = delta_sym(sp_delta(t, x, y, &neg), &rb, &nr);
        bitw_put(&bw, neg, 1);
        bitw_put(&bw, rb, nr);
        syms[2 * ns] = (uint8_t)tab;
        syms[2 * ns + 1] = (uint8_t)sym;
        count[tab][sym]++;
        ns++;
    }
    int rc = bitw_flush(&bw);

    /* 2. Tables: per-class counts, gap tables of active classes, a bitmap
     * of the delta contexts in use and their tables. */
    rans_table tabs[NTAB];
    for (unsigned i = 0; !rc && i < NTAB; i++) rc = rans_table_build(&tabs[i], count[i], i < SP_NCLASS ? GAP_NSYM : DELTA_NSYM);
    for (uint32_t c = 0; !rc && c < nclass; c++) rc = put_varint(out, s->start[c + 1] - s->start[c]);
    for (uint32_t c = 0; !rc && c < nclass; c++)
        if (s->start[c + 1] > s->start[c]) rc = rans_table_write(&tabs[c], out);
    uint32_t used = 0;
    for (unsigned i = 0; i < DELTA_NCTX; i++)
        if (tabs[SP_NCLASS + i].nsym) used |= 1u << i;
    uint8_t ub[4];
    ferry__put32(ub, used);
    if (!rc) rc = ferry__buf_append(out, ub, 4);
    for (unsigned i = 0; !rc && i < DELTA_NCTX; i++)
        if (used >> i & 1) rc = rans_table_write(&tabs[SP_NCLASS + i], out);

    /* 3. rANS, backwards: symbol i uses state i & 1.  At most one 16-bit
     * word per symbol, plus the two states. */
    uint16_t *words = rc ? NULL : ferry__malloc((nsyms + 1) * sizeof *words);
    if (!rc && !words) rc = FERRY_ERR_NOMEM;
    if (!rc) {
        uint16_t *end = words + nsyms + 1, *p = end;
        uint32_t x[2] = {RANS_L, RANS_L};
        for (size_t i = ns; i-- > 0;) {
            const rans_table *tb = &tabs[syms[2 * i]];
            unsigned sym = syms[2 * i + 1];
            rans_put(&x[i & 1], &p, tb->start[sym], tb->freq[sym]);
        }
        size_t nw = (size_t)(end - p);
        uint64_t len = 8 + 2 * (uint64_t)nw;
        uint8_t head[12];
        ferry__put32(head, (uint32_t)len);
        ferry__put32(head + 4, x[0]);
        ferry__put32(head + 8, x[1]);
        rc = ferry__buf_reserve(out, 12 + 2 * nw + raw.size);
        if (!rc && len > UINT32_MAX) rc = ferry__fail(FERRY_ERR_LIMIT, "rANS stream too large");
        if (!rc) {
            ferry__buf_append(out, head, 12);
            for (size_t i = 0; i < nw; i++) {
                out->data[out->size++] = (uint8_t)p[i];
                out->data[out->size++] = (uint8_t)(p[i] >> 8);
            }
            ferry__buf_append(out, raw.data, raw.size);
        }
    }
    free(words);
    ferry__buf_release(&raw);
    return rc;
}
