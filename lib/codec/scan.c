/* Positions <-> class-local ranks: the encoder's scan and the decoder's
 * walk over the base words of a chunk, plus the shared scratch.  These are
 * the only passes over every word, so they are the codec's speed: the
 * portable loops below define the result, and vectorised versions
 * (scan_avx2.c) must produce exactly the same arrays. */
#include <stdlib.h>
#include "sparse.h"
#include "simd.h"

int ferry__codec_corrupt(const char *what) { return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "sparse chunk: %s", what); }

static int grow(void **p, size_t n, size_t size)
{
    void *q = ferry__realloc(*p, n * size);
    if (!q) return FERRY_ERR_NOMEM;
    *p = q;
    return FERRY_OK;
}

int ferry__codec_scratch_fit(sp_scratch *s, size_t need)
{
    if (need <= s->cap) return FERRY_OK;
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < need) cap *= 2;
    if (grow((void **)&s->pos, cap, 4) || grow((void **)&s->cls, cap, 4) || grow((void **)&s->rank, cap, 4) ||
        grow((void **)&s->order, cap, 4) || grow((void **)&s->val, cap, 8) || grow((void **)&s->old, cap, 8) ||
        grow((void **)&s->word, cap, 4))
        return FERRY_ERR_NOMEM;
    s->cap = cap;
    return FERRY_OK;
}

void ferry__codec_scratch_release(sp_scratch *s)
{
    free(s->pos);
    free(s->cls);
    free(s->rank);
    free(s->order);
    free(s->val);
    free(s->old);
    free(s->word);
    free(s->ebm);
    free(s->lut);
    free(s->lut32);
    free(s->syms);
    free(s->rbm);
    memset(s, 0, sizeof *s);
}

uint32_t ferry__codec_choose_top(const sp_dtype *t, const uint8_t *a, size_t n)
{
    if (!t->exp_mask || n == 0) return 0;
    static _Thread_local uint32_t hist[2048];
    memset(hist, 0, (t->exp_mask + 1) * sizeof *hist);
    size_t step = n / 4096 ? n / 4096 : 1, samples = 0;
    for (size_t i = 0; i < n; i += step, samples++) hist[(sp_load(a, i, t->W) >> t->exp_shift) & t->exp_mask]++;
    size_t above = 0;
    for (uint32_t e = t->exp_mask;; e--) {
        above += hist[e];
        if (above * 100 > samples || e == 0) return e;
    }
}

void ferry__codec_sample_classes(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n, uint64_t est[SP_NCLASS])
{
    uint64_t hits[SP_NCLASS] = {0}, samples = 0;
    size_t step = n / 4096 ? n / 4096 : 1;
    for (size_t i = 0; i < n; i += step, samples++) hits[sp_class(t, top, sp_load(a, i, t->W))]++;
    for (int c = 0; c < SP_NCLASS; c++)
        est[c] = samples ? ((2 * hits[c] + 1) * (uint64_t)n + 2 * samples - 1) / (2 * samples) : 1;
}

void ferry__codec_scan_unlazy(sp_scratch *s, size_t k)
{
    if (!s->lazy) return;
    size_t at = 0;
    for (int c = 0; c < SP_NCLASS; c++) {
        const uint64_t *w = s->ebm + c * s->ebm_words;
        for (uint64_t q = 0; q * 64 < s->ebm_bits[c]; q++)
            for (uint64_t v = w[q]; v; v &= v - 1) s->order[at++] = (uint32_t)(q * 64 + (uint64_t)__builtin_ctzll(v));
    }
    for (size_t j = 0; j < k; j++) {
        s->old[j] = s->word[j] & 0xFFFF;
        s->val[j] = s->word[j] >> 16;
    }
    s->lazy = 0;
}

int ferry__codec_scan_group(sp_scratch *s, const sp_scan_state *st)
{
    s->lazy = 0;
#if FERRY_HAVE_AVX512
    if (st->bm == 1) {
        ferry__codec_scan_group_bitmaps(s, st);
        FERRY_ASSERT(s->start[SP_NCLASS] == st->k); /* the bitmaps hold every change once */
        return FERRY_OK;
    }
#endif
    size_t k = st->k;
    uint32_t fill[SP_NCLASS];
    memset(s->start, 0, sizeof s->start);
    for (size_t j = 0; j < k; j++) s->start[s->cls[j] + 1]++;
    for (int c = 0; c < SP_NCLASS; c++) s->start[c + 1] += s->start[c];
    memcpy(fill, s->start, sizeof fill);
    for (size_t j = 0; j < k; j++) s->order[fill[s->cls[j]]++] = s->rank[j];
    return FERRY_OK;
}

static inline __attribute__((always_inline)) int scan_w(const sp_dtype *t, uint32_t top, const uint8_t *a,
                                                        const uint8_t *b, size_t lo, size_t hi, unsigned W,
                                                        sp_scratch *s, sp_scan_state *st)
{
    for (size_t i = lo; i < hi; i++) {
        uint64_t x = sp_load(a, i, W);
        uint32_t c = sp_class(t, top, x);
        uint64_t y = sp_load(b, i - lo, W);
        if (FERRY_UNLIKELY(x != y)) {
            if (st->k == s->cap && ferry__codec_scratch_fit(s, st->k + 1)) return FERRY_ERR_NOMEM;
            s->old[st->k] = x;
            s->val[st->k] = y;
            s->pos[st->k] = (uint32_t)i;
            s->cls[st->k] = c;
            s->rank[st->k] = st->cnt[c];
            st->k++;
        }
        st->cnt[c]++;
    }
    return FERRY_OK;
}

int ferry__codec_scan_range(const sp_dtype *t, uint32_t top, const uint8_t *a, const uint8_t *b, size_t lo, size_t hi,
                  sp_scratch *s, sp_scan_state *st)
{
    /* a piece of a chunk: positions fit in 32 bits */
    FERRY_ASSERT(lo <= hi && hi <= (size_t)1 << SP_CHUNK_LOG2_MAX);
    int rc = ferry__codec_scratch_fit(s, 4096);
    if (rc) return rc;
    if (!st->bm) { /* decided once per chunk */
        st->bm = 2;
#if FERRY_HAVE_AVX512
        if (t->W == 16 && t->exp_mask && ferry__cpu_avx512()) st->bm = 1;
#endif
    }
#if FERRY_HAVE_AVX512
    if (st->bm == 1) return ferry__codec_scan16_avx512(t, top, a, b, lo, hi, s, st);
#endif
#if FERRY_HAVE_AVX2
    if (t->W == 16 && ferry__cpu_avx2()) return ferry__codec_scan16_avx2(t, top, a, b, lo, hi, s, st);
#endif
    switch (t->W) {
    case 8: return scan_w(t, top, a, b, lo, hi, 8, s, st);
    case 16: return scan_w(t, top, a, b, lo, hi, 16, s, st);
    case 32: return scan_w(t, top, a, b, lo, hi, 32, s, st);
    default: return scan_w(t, top, a, b, lo, hi, 64, s, st);
    }
}

int ferry__codec_walk_bitmaps(sp_scratch *s, const uint8_t *bm[SP_NCLASS], uint64_t lim[SP_NCLASS])
{
    size_t total = 0, off[SP_NCLASS];
    for (int c = 0; c < SP_NCLASS; c++) {
        uint32_t a = s->start[c], b = s->start[c + 1];
        lim[c] = a < b ? s->order[b - 1] / 8 + 1 : 0; /* ranks increase: the last is the largest */
        off[c] = total;
        total += lim[c] + 16; /* zero padding: reads at lim[c] see no wanted rank */
    }
    if (total > s->rbm_cap) {
        uint8_t *p = ferry__realloc(s->rbm, total);
        if (!p) return FERRY_ERR_NOMEM;
        s->rbm = p;
        s->rbm_cap = total;
    }
    memset(s->rbm, 0, total);
    for (int c = 0; c < SP_NCLASS; c++) {
        uint8_t *p = s->rbm + off[c];
        for (uint32_t j = s->start[c]; j < s->start[c + 1]; j++) p[s->order[j] >> 3] |= (uint8_t)(1u << (s->order[j] & 7));
        bm[c] = p;
    }
    return FERRY_OK;
}

static inline __attribute__((always_inline)) int walk_w(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n,
                                                        unsigned W, sp_scratch *s, size_t k)
{
    uint32_t cnt[SP_NCLASS] = {0}, ptr[SP_NCLASS], end[SP_NCLASS];
    memcpy(ptr, s->start, sizeof ptr);
    memcpy(end, s->start + 1, sizeof end);
    size_t got = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = sp_class(t, top, sp_load(a, i, W));
        if (FERRY_UNLIKELY(ptr[c] < end[c]) && s->order[ptr[c]] == cnt[c]) {
            s->pos[got] = (uint32_t)i;
            got++;
            ptr[c]++;
        }
        cnt[c]++;
    }
    return got == k ? FERRY_OK : ferry__codec_corrupt("a change lies past its class's last word");
}

int ferry__codec_walk(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n, sp_scratch *s, size_t k)
{
    /* the k ranks, grouped by class, are all there is to find (the
     * vector walks store up to k positions on that promise) */
    FERRY_ASSERT(s->start[SP_NCLASS] == k && k <= s->cap && n <= (size_t)1 << SP_CHUNK_LOG2_MAX);
    s->have_words = 0;
#if FERRY_HAVE_AVX512
    if (t->W == 16 && ferry__codec_walk16_gfni_ok()) return ferry__codec_walk16_gfni(t, top, a, n, s, k);
    if (t->W == 16 && ferry__cpu_avx512()) return ferry__codec_walk16_avx512(t, top, a, n, s, k);
#endif
#if FERRY_HAVE_AVX2
    if (t->W == 16 && ferry__cpu_avx2()) return ferry__codec_walk16_avx2(t, top, a, n, s, k);
#endif
    switch (t->W) {
    case 8: return walk_w(t, top, a, n, 8, s, k);
    case 16: return walk_w(t, top, a, n, 16, s, k);
    case 32: return walk_w(t, top, a, n, 32, s, k);
    default: return walk_w(t, top, a, n, 64, s, k);
    }
}

void ferry__codec_narrow16(uint16_t *dst, const uint32_t *src, size_t n)
{
    size_t i = 0;
#if FERRY_HAVE_AVX512
    if (ferry__cpu_avx512()) i = ferry__codec_narrow16_avx512(dst, src, n);
#endif
    for (; i < n; i++) dst[i] = (uint16_t)src[i];
}
