/* Sparse chunk encoder: find changed words, code their positions as
 * per-class gaps and their values as order-key deltas (docs/FORMAT.md). */
#include <stdlib.h>
#include "sparse.h"

static int grow_u32(uint32_t **p, size_t n)
{
    uint32_t *q = ferry__realloc(*p, n * sizeof *q);
    if (!q) return FERRY_ERR_NOMEM;
    *p = q;
    return FERRY_OK;
}

static int scratch_fit(sp_scratch *s, size_t need, uint32_t nclass)
{
    if (need > s->cap) {
        size_t cap = s->cap ? s->cap : 1024;
        while (cap < need) cap *= 2;
        if (grow_u32(&s->pos, cap) || grow_u32(&s->loc, cap) || grow_u32(&s->cls, cap) || grow_u32(&s->order, cap))
            return FERRY_ERR_NOMEM;
        s->cap = cap;
    }
    if (nclass > s->ncls_cap) {
        if (grow_u32(&s->cnt, nclass) || grow_u32(&s->start, nclass + 1)) return FERRY_ERR_NOMEM;
        s->ncls_cap = nclass;
    }
    return FERRY_OK;
}

/* Scans the chunk: records each changed element's position, class and its
 * index among the elements of its class (the class-local index). */
static inline __attribute__((always_inline)) int scan(const sp_dtype *t, const uint8_t *a, const uint8_t *b, size_t n, unsigned W,
                       sp_scratch *s, uint32_t nclass, size_t *kout)
{
    uint32_t *cnt = s->cnt;
    memset(cnt, 0, nclass * sizeof *cnt);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t x = sp_load(a, i, W);
        uint32_t c = sp_class(t, x);
        if (FERRY_UNLIKELY(x != sp_load(b, i, W))) {
            if (k == s->cap && scratch_fit(s, k + 1, nclass)) return FERRY_ERR_NOMEM;
            s->pos[k] = (uint32_t)i;
            s->cls[k] = c;
            s->loc[k] = cnt[c];
            k++;
        }
        cnt[c]++;
    }
    *kout = k;
    return FERRY_OK;
}

static void put_delta(rc_enc *e, const sp_dtype *t, sp_models *m, uint64_t x, uint64_t y)
{
    uint64_t d = (sp_key(t, y) - sp_key(t, x)) & sp_wmask(t->W);
    uint64_t half = (uint64_t)1 << (t->W - 1);
    unsigned neg = d >= half && d != 0;
    uint64_t mag = neg ? ((~d + 1) & sp_wmask(t->W)) : d; /* 1 .. 2^(W-1) */
    sp_dctx *c = &m->dctx[sp_class(t, x)];
    rc_encode(e, &c->sign[sp_sign(t, x)], neg);
    uint64_t v = mag - 1;
    for (unsigned i = 0; i < SP_MAG_UNARY; i++) {
        if (v == i) {
            rc_encode(e, &c->mag[i], 0);
            return;
        }
        rc_encode(e, &c->mag[i], 1);
    }
    sp_num_put(e, &m->esc, v - SP_MAG_UNARY);
}

static inline __attribute__((always_inline)) int encode_w(const sp_dtype *t, const uint8_t *a, const uint8_t *b, size_t n, unsigned W,
                    sp_models *m, sp_scratch *s, ferry_buf *out, uint64_t *changed)
{
    uint32_t nclass = m->nclass;
    int rc = scratch_fit(s, 1024, nclass);
    if (rc) return rc;
    size_t k;
    if ((rc = scan(t, a, b, n, W, s, nclass, &k))) return rc;
    *changed = k;

    /* Bucket the changes by class (counting sort keeps each class's
     * class-local indices increasing). */
    uint32_t *start = s->start;
    memset(start, 0, (nclass + 1) * sizeof *start);
    for (size_t j = 0; j < k; j++) start[s->cls[j] + 1]++;
    uint32_t nact = 0;
    for (uint32_t c = 0; c < nclass; c++) {
        nact += start[c + 1] != 0;
        start[c + 1] += start[c];
    }
    /* reuse cnt as the fill cursor */
    memcpy(s->cnt, start, nclass * sizeof *start);
    for (size_t j = 0; j < k; j++) s->order[s->cnt[s->cls[j]]++] = s->loc[j];

    rc_enc e;
    rc_enc_init(&e, out);
    sp_models_reset(m);
    sp_num_put(&e, &m->meta, nact);
    uint32_t prev_c = 0;
    int first = 1;
    for (uint32_t c = 0; c < nclass; c++) {
        uint32_t kc = start[c + 1] - start[c];
        if (!kc) continue;
        sp_num_put(&e, &m->meta, first ? c : c - prev_c - 1);
        sp_num_put(&e, &m->meta, kc - 1);
        first = 0;
        prev_c = c;
        sp_num *g = &m->gap[c];
        sp_num_init(g);
        uint32_t last = 0;
        for (uint32_t j = start[c]; j < start[c + 1]; j++) {
            uint32_t l = s->order[j];
            sp_num_put(&e, g, j == start[c] ? l : l - last - 1);
            last = l;
        }
    }
    for (size_t j = 0; j < k; j++) {
        size_t i = s->pos[j];
        put_delta(&e, t, m, sp_load(a, i, W), sp_load(b, i, W));
    }
    return rc_enc_finish(&e);
}

int sp_encode_chunk(const sp_dtype *t, const uint8_t *a, const uint8_t *b, size_t n,
                    sp_models *m, sp_scratch *s, ferry_buf *out, uint64_t *changed)
{
    /* Constant word widths let the compiler specialise the scan loop. */
    switch (t->W) {
    case 8: return encode_w(t, a, b, n, 8, m, s, out, changed);
    case 16: return encode_w(t, a, b, n, 16, m, s, out, changed);
    case 32: return encode_w(t, a, b, n, 32, m, s, out, changed);
    default: return encode_w(t, a, b, n, 64, m, s, out, changed);
    }
}
