/* Sparse chunk decoder: the inverse of sparse_enc.c.  The input is hostile:
 * every count, class id, gap and magnitude is range-checked, and the
 * positions are recovered by re-walking the base words, so a stream can
 * never address an element outside the chunk. */
#include <stdlib.h>
#include "sparse.h"

static int corrupt(const char *what) { return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "sparse chunk: %s", what); }

static int grow(void **p, size_t n, size_t size)
{
    void *q = ferry__realloc(*p, n * size);
    if (!q) return FERRY_ERR_NOMEM;
    *p = q;
    return FERRY_OK;
}

static int dscratch_fit(sp_dscratch *s, size_t need, uint32_t nclass)
{
    if (need > s->cap) {
        size_t cap = s->cap ? s->cap : 1024;
        while (cap < need) cap *= 2;
        if (grow((void **)&s->pos, cap, 4) || grow((void **)&s->loc, cap, 4) || grow((void **)&s->val, cap, 8))
            return FERRY_ERR_NOMEM;
        s->cap = cap;
    }
    if (nclass > s->ncls_cap) {
        if (grow((void **)&s->ptr, nclass, 4) || grow((void **)&s->end, nclass, 4) || grow((void **)&s->cnt, nclass, 4) ||
            grow((void **)&s->act, nclass, 4))
            return FERRY_ERR_NOMEM;
        s->ncls_cap = nclass;
    }
    return FERRY_OK;
}

static bool get_delta(rc_dec *d, const sp_dtype *t, sp_models *m, uint64_t x, uint64_t *y)
{
    sp_dctx *c = &m->dctx[sp_class(t, x)];
    unsigned neg = rc_decode(d, &c->sign[sp_sign(t, x)]);
    uint64_t v = 0;
    unsigned i = 0;
    while (i < SP_MAG_UNARY && rc_decode(d, &c->mag[i])) i++;
    if (i < SP_MAG_UNARY) v = i;
    else {
        uint64_t e;
        if (!sp_num_get(d, &m->esc, &e) || e > UINT64_MAX - SP_MAG_UNARY - 1) return false;
        v = e + SP_MAG_UNARY;
    }
    uint64_t mag = v + 1, half = (uint64_t)1 << (t->W - 1);
    if (mag > half || (!neg && mag == half)) return false;
    uint64_t delta = neg ? (~mag + 1) : mag;
    *y = sp_key_inv(t, (sp_key(t, x) + delta) & sp_wmask(t->W));
    return true;
}

static inline __attribute__((always_inline)) int decode_w(const sp_dtype *t, const uint8_t *a, size_t n, unsigned W,
                                                          const uint8_t *src, size_t srclen, sp_models *m,
                                                          sp_dscratch *s, size_t *kout)
{
    uint32_t nclass = m->nclass;
    int rc = dscratch_fit(s, 1024, nclass);
    if (rc) return rc;
    rc_dec d;
    rc_dec_init(&d, src, srclen);
    sp_models_reset(m);

    uint64_t nact, v;
    if (!sp_num_get(&d, &m->meta, &nact) || nact > nclass) return corrupt("active class count out of range");
    uint32_t *ptr = s->ptr, *end = s->end;
    memset(ptr, 0, nclass * sizeof *ptr);
    memset(end, 0, nclass * sizeof *end);
    size_t k = 0;
    uint64_t c = 0;
    for (uint64_t j = 0; j < nact; j++) {
        if (!sp_num_get(&d, &m->meta, &v)) return corrupt("bad class id");
        c = j == 0 ? v : c + v + 1;
        if (c >= nclass || (j && v > nclass)) return corrupt("class id out of range");
        uint64_t kc;
        if (!sp_num_get(&d, &m->meta, &kc) || kc >= n - k) return corrupt("class change count out of range");
        kc += 1;
        if ((rc = dscratch_fit(s, k + kc, nclass))) return rc;
        ptr[c] = (uint32_t)k;
        end[c] = (uint32_t)(k + kc);
        sp_num *g = &m->gap[c];
        sp_num_init(g);
        uint64_t l = 0;
        for (uint64_t q = 0; q < kc; q++) {
            if (!sp_num_get(&d, g, &v)) return corrupt("bad gap");
            l = q == 0 ? v : l + v + 1;
            if (v >= n || l >= n) return corrupt("gap past the end of the chunk");
            s->loc[k++] = (uint32_t)l;
        }
        if (d.overrun) return corrupt("stream ends early");
    }

    /* Re-walk the base: the change of class c with class-local index l is
     * the l-th element of class c. */
    uint32_t *cnt = s->cnt;
    memset(cnt, 0, nclass * sizeof *cnt);
    size_t got = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cl = sp_class(t, sp_load(a, i, W));
        if (FERRY_UNLIKELY(ptr[cl] < end[cl]) && s->loc[ptr[cl]] == cnt[cl]) {
            s->pos[got++] = (uint32_t)i;
            ptr[cl]++;
        }
        cnt[cl]++;
    }
    if (got != k) return corrupt("a change lies past its class's last element");

    for (size_t j = 0; j < k; j++)
        if (!get_delta(&d, t, m, sp_load(a, s->pos[j], W), &s->val[j])) return corrupt("delta out of range");
    if (d.overrun) return corrupt("stream ends early");
    *kout = k;
    return FERRY_OK;
}

int sp_decode_chunk(const sp_dtype *t, const uint8_t *a, size_t n, const uint8_t *src, size_t srclen,
                    sp_models *m, sp_dscratch *s, size_t *k)
{
    switch (t->W) {
    case 8: return decode_w(t, a, n, 8, src, srclen, m, s, k);
    case 16: return decode_w(t, a, n, 16, src, srclen, m, s, k);
    case 32: return decode_w(t, a, n, 32, src, srclen, m, s, k);
    default: return decode_w(t, a, n, 64, src, srclen, m, s, k);
    }
}
