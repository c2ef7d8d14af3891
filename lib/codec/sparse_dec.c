/* Sparse chunk decoder: the inverse of sparse_enc.c.  The input is hostile:
 * every count, class id, gap and magnitude is range-checked, and positions
 * are recovered by walking the base words, so a stream can never address a
 * word outside the chunk. */
#include <stdlib.h>
#include "sparse.h"

static bool get_delta(rc_dec *d, const sp_dtype *t, sp_models *m, uint32_t dc, uint64_t x, uint64_t *y)
{
    unsigned neg = rc_decode(d, &m->sign[dc][sp_sign(t, x)]);
    uint64_t v;
    if (!sp_num_get(d, &m->mag[dc], &v) || v == UINT64_MAX) return false;
    return sp_undelta(t, x, neg, v + 1, y);
}

int ferry__codec_adaptive_decode(const sp_dtype *t, uint32_t top, const uint64_t *est, const uint8_t *a, size_t n,
                       const uint8_t *src, size_t len, sp_scratch *s, sp_models *m, size_t *kout)
{
    rc_dec d;
    rc_dec_init(&d, src, len);
    ferry__codec_models_reset(m);
    uint32_t nclass = sp_nclass(t);
    uint64_t nact, v, c = 0;
    if (!sp_num_get(&d, &m->meta, &nact) || nact == 0 || nact > nclass) return ferry__codec_corrupt("active class count out of range");
    memset(s->start, 0, sizeof s->start);
    size_t k = 0;
    uint32_t next = 0; /* classes below next are settled */
    for (uint64_t j = 0; j < nact; j++) {
        if (!sp_num_get(&d, &m->meta, &v) || v >= nclass) return ferry__codec_corrupt("bad class id");
        c = j == 0 ? v : c + v + 1;
        if (c >= nclass) return ferry__codec_corrupt("class id out of range");
        uint64_t kc;
        if (!sp_num_get(&d, &m->meta, &kc) || kc >= n - k) return ferry__codec_corrupt("class change count out of range");
        kc += 1;
        int rc = ferry__codec_scratch_fit(s, k + kc);
        if (rc) return rc;
        for (; next <= c; next++) s->start[next] = (uint32_t)k;
        sp_num *g = &m->gap[c];
        sp_geo geo = {0};
        if (est) sp_geo_init(&geo, kc, sp_counted_population(est[c], kc));
        uint64_t r = 0;
        for (uint64_t q = 0; q < kc; q++) {
            if (est ? !sp_geo_get(&d, &geo, n, &v) : !sp_num_get(&d, g, &v)) return ferry__codec_corrupt("bad gap");
            r = q == 0 ? v : r + v + 1;
            if (v >= n || r >= n) return ferry__codec_corrupt("gap past the end of the chunk");
            s->order[k++] = (uint32_t)r;
        }
        if (d.overrun) return ferry__codec_corrupt("stream ends early");
    }
    for (; next <= SP_NCLASS; next++) s->start[next] = (uint32_t)k;
    FERRY_ASSERT(k <= n); /* each class's count was bounded by the words left */
    int rc = ferry__codec_walk(t, top, a, n, s, k);
    if (rc) return rc;
    for (size_t j = 0; j < k; j++) {
        uint64_t x = sp_load(a, s->pos[j], t->W);
        if (!get_delta(&d, t, m, sp_dclass(t, top, x), x, &s->val[j])) return ferry__codec_corrupt("delta out of range");
    }
    if (d.overrun) return ferry__codec_corrupt("stream ends early");
    *kout = k;
    return FERRY_OK;
}

int ferry__codec_decode_chunk(const sp_dtype *t, const uint8_t *a, size_t n, const uint8_t *src, size_t len, unsigned version,
                    sp_coder *c, size_t *k)
{
    /* positions inside a chunk fit in 32 bits (sparse.h) */
    FERRY_ASSERT(n > 0 && n <= (size_t)1 << SP_CHUNK_LOG2_MAX);
    if (len < 1) return ferry__codec_corrupt("empty chunk");
    if (src[0] == SP_CODEC_EMPTY) {
        if (len != 1) return ferry__codec_corrupt("bytes after an empty chunk");
        *k = 0;
        return FERRY_OK;
    }
    size_t head = t->exp_mask > 0xFF ? 3 : 2;
    if (len < head) return ferry__codec_corrupt("truncated chunk header");
    uint32_t top = src[1] | (head == 3 ? (uint32_t)src[2] << 8 : 0);
    if (top > t->exp_mask) return ferry__codec_corrupt("class origin out of range");
    int rc = ferry__codec_scratch_fit(&c->s, 4096);
    if (rc) return rc;
    if (src[0] > SP_CODEC_MAX || sp_codec_version(src[0]) > version) return ferry__codec_corrupt("unknown chunk codec");
    if (src[0] == SP_CODEC_ADAPTIVE || src[0] == SP_CODEC_COUNTED) {
        uint64_t est[SP_NCLASS];
        if (src[0] == SP_CODEC_COUNTED) ferry__codec_sample_classes(t, top, a, n, est);
        return ferry__codec_adaptive_decode(t, top, src[0] == SP_CODEC_COUNTED ? est : NULL, a, n, src + head, len - head, &c->s,
                                  &c->m, k);
    }
    return ferry__codec_rans_decode(t, top, src[0], a, n, src + head, len - head, &c->s, k);
}
