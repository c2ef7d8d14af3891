/*
 * entropy.h — the order-0 entropy bound of a patch (DESIGN.md):
 *
 *     bits = n·H(k/n) + k·H(Δ)
 *
 * per tensor, with n words, k of them changed, and H(Δ) the empirical
 * entropy of the change deltas over the changed words.  Δ is measured on the
 * total order of the float bits (sign-magnitude → unsigned): for a w-byte
 * word u with sign bit s, key(u) = (u & s) ? ~u : (u | s), and
 * Δ = key(new) − key(old).  For BF16 that is key = (u & 0x8000) ?
 * (~u & 0xFFFF) : (u | 0x8000), so a ±1 ULP step is Δ = ±1 whatever the sign.
 * For widths other than 2, Δ is taken modulo 2^(8w) (a bijection given the
 * old word, so the entropy is the same as for the signed difference).
 *
 * "order0" is the sum of the per-tensor bounds; the pooled variant uses one
 * change rate and one Δ histogram for the whole model.  Context modelling
 * (conditioning on the base value, neighbours, ...) can go below either; a
 * real coder also pays for headers, which the bound leaves out.
 */
#ifndef BENCH_ENTROPY_H
#define BENCH_ENTROPY_H

#include <math.h>

#include "bench_util.h"

typedef struct order0_result {
    double bits;         /* sum over tensors of n·H(k/n) + k·H(Δ) */
    double mask_bits;    /* its first part: sum of n·H(k/n) */
    double delta_bits;   /* its second part: sum of k·H(Δ) */
    double pooled_bits;  /* N·H(K/N) + K·H(Δ) with whole-model statistics */
    uint64_t n, k;       /* words, changed words */
    uint64_t distinct;   /* distinct Δ values over the model */
} order0_result;

/* n·H(k/n) in bits. */
static inline double order0_mask_bits(uint64_t n, uint64_t k)
{
    if (k == 0 || k == n) return 0;
    double p = (double)k / (double)n, q = 1 - p;
    return -(double)k * log2(p) - (double)(n - k) * log2(q);
}

/* c·log2(c), 0 for c = 0. */
static inline double order0_clogc(uint64_t c)
{
    return c ? (double)c * log2((double)c) : 0;
}

static inline uint64_t order0_key(uint64_t u, unsigned w)
{
    uint64_t s = 1ull << (8 * w - 1), m = s | (s - 1);
    return (u & s) ? (~u & m) : (u | s);
}

typedef struct order0_sym { unsigned w; uint64_t d; } order0_sym;

static inline int order0_sym_cmp(const void *a, const void *b)
{
    const order0_sym *x = a, *y = b;
    if (x->w != y->w) return x->w < y->w ? -1 : 1;
    return (x->d > y->d) - (x->d < y->d);
}

/* Σ c·log2(c) over the runs of equal symbols of a sorted array; counts the
 * distinct ones into *distinct. */
static inline double order0_runs(const order0_sym *v, uint64_t n, uint64_t *distinct)
{
    double s = 0;
    for (uint64_t i = 0; i < n;) {
        uint64_t j = i + 1;
        while (j < n && v[j].w == v[i].w && v[j].d == v[i].d) j++;
        s += order0_clogc(j - i);
        (*distinct)++;
        i = j;
    }
    return s;
}

#define ORDER0_BF16_BINS (2 * 65535 + 1) /* Δ in -65535..65535 */

static inline int order0_compute(const bench_pair *p, order0_result *r, bench_err *err)
{
    memset(r, 0, sizeof *r);
    uint64_t *hist = calloc(ORDER0_BF16_BINS, sizeof *hist);    /* one tensor, 2-byte words */
    uint64_t *pooled = calloc(ORDER0_BF16_BINS, sizeof *pooled);
    order0_sym *other = NULL, *pool_other = NULL;   /* Δ of other widths */
    uint64_t n_pool_other = 0, cap_pool_other = 0;
    int rc = (!hist || !pooled) ? bench_fail(err, "out of memory") : 0;
    for (size_t i = 0; i < p->count && !rc; i++) {
        const bench_tensor *t = &p->t[i];
        const unsigned w = t->width;
        uint64_t *pos, k;
        if (bench_changed(t, &pos, &k)) { rc = bench_fail(err, "out of memory"); break; }
        double sum_clogc = 0;
        if (w == 2) {
            for (uint64_t j = 0; j < k; j++) {
                int64_t ko = (int64_t)order0_key(bench_get_le(t->old + 2 * pos[j], 2), 2);
                int64_t kn = (int64_t)order0_key(bench_get_le(t->cur + 2 * pos[j], 2), 2);
                uint64_t bin = (uint64_t)(kn - ko + 65535);
                hist[bin]++;
                pooled[bin]++;
            }
            for (uint64_t b = 0; b < ORDER0_BF16_BINS && k; b++) {
                if (!hist[b]) continue;
                sum_clogc += order0_clogc(hist[b]);
                hist[b] = 0;
            }
        } else if (k) {
            order0_sym *no = realloc(other, (size_t)k * sizeof *other);
            if (!no) { free(pos); rc = bench_fail(err, "out of memory"); break; }
            other = no;
            if (n_pool_other + k > cap_pool_other) {
                cap_pool_other = 2 * (n_pool_other + k);
                order0_sym *np = realloc(pool_other, (size_t)cap_pool_other * sizeof *np);
                if (!np) { free(pos); rc = bench_fail(err, "out of memory"); break; }
                pool_other = np;
            }
            uint64_t m = w == 8 ? ~0ull : (1ull << (8 * w)) - 1;
            for (uint64_t j = 0; j < k; j++) {
                uint64_t ko = order0_key(bench_get_le(t->old + w * pos[j], w), w);
                uint64_t kn = order0_key(bench_get_le(t->cur + w * pos[j], w), w);
                other[j] = (order0_sym){w, (kn - ko) & m};
                pool_other[n_pool_other++] = other[j];
            }
            qsort(other, (size_t)k, sizeof *other, order0_sym_cmp);
            uint64_t unused = 0;
            sum_clogc = order0_runs(other, k, &unused);
        }
        free(pos);
        double mask = order0_mask_bits(t->nwords, k);
        double delta = order0_clogc(k) - sum_clogc; /* k·H(Δ) = k·log2 k − Σ c·log2 c */
        if (delta < 0) delta = 0;                   /* rounding when all Δ are equal */
        r->mask_bits += mask;
        r->delta_bits += delta;
        r->n += t->nwords;
        r->k += k;
    }
    if (!rc) {
        double pool_clogc = 0;
        for (uint64_t b = 0; b < ORDER0_BF16_BINS; b++) {
            if (!pooled[b]) continue;
            pool_clogc += order0_clogc(pooled[b]);
            r->distinct++;
        }
        if (n_pool_other) {
            qsort(pool_other, (size_t)n_pool_other, sizeof *pool_other, order0_sym_cmp);
            pool_clogc += order0_runs(pool_other, n_pool_other, &r->distinct);
        }
        double pd = order0_clogc(r->k) - pool_clogc;
        r->bits = r->mask_bits + r->delta_bits;
        r->pooled_bits = order0_mask_bits(r->n, r->k) + (pd > 0 ? pd : 0);
    }
    free(hist);
    free(pooled);
    free(other);
    free(pool_other);
    return rc;
}

#endif /* BENCH_ENTROPY_H */
