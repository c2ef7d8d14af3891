/*
 * scatter.h — the reference an in-place apply is measured against: a raw
 * scatter of int32 flat indices and word values (BF16: 2 bytes) into the
 * model, per tensor, each index checked against the tensor's size (as the
 * peers' decoders check theirs).  No entropy coding, no verification: the
 * least work that turns OLD into NEW in place given the changed positions.
 *
 * bench_scatter_make builds the arrays from OLD and NEW (outside any timing);
 * bench_scatter_run applies them with T threads (each tensor's changes cut
 * into T contiguous parts, one per thread).
 */
#ifndef BENCH_SCATTER_H
#define BENCH_SCATTER_H

#include <pthread.h>

#include "bench_util.h"

typedef struct bench_scatter_t {
    uint32_t *idx;   /* flat word indices of the changes */
    uint8_t *val;    /* their new words, w bytes each */
    uint64_t k;      /* changes */
    uint64_t nwords; /* words of the tensor */
    unsigned w;      /* word bytes */
} bench_scatter_t;

typedef struct bench_scatter {
    size_t n;
    bench_scatter_t *t;
    uint64_t changes;
} bench_scatter;

/* Word width of a dtype as ferry's codec reads it (bench_word_width). */
static inline int bench_scatter_make(const ferry_model *a, const ferry_model *b, bench_scatter *s)
{
    memset(s, 0, sizeof *s);
    s->n = ferry_model_count(b);
    if (ferry_model_count(a) != s->n || !(s->t = calloc(s->n + 1, sizeof *s->t))) return -1;
    for (size_t i = 0; i < s->n; i++) {
        const ferry_tensor *x = ferry_model_tensor(a, i), *y = ferry_model_tensor(b, i);
        unsigned w = bench_word_width(y->dtype);
        if (x->nbytes != y->nbytes || y->nbytes / w > UINT32_MAX) return -1;
        bench_scatter_t *t = &s->t[i];
        t->w = w;
        t->nwords = y->nbytes / w;
        const uint8_t *p = x->data, *q = y->data;
        for (uint64_t j = 0; j < t->nwords; j++) t->k += memcmp(p + j * w, q + j * w, w) != 0;
        t->idx = malloc(t->k * 4 + 4);
        t->val = malloc(t->k * w + 8);
        if (!t->idx || !t->val) return -1;
        uint64_t at = 0;
        for (uint64_t j = 0; j < t->nwords; j++)
            if (memcmp(p + j * w, q + j * w, w)) {
                t->idx[at] = (uint32_t)j;
                memcpy(t->val + at * w, q + j * w, w);
                at++;
            }
        s->changes += t->k;
    }
    return 0;
}

static inline void bench_scatter_free(bench_scatter *s)
{
    for (size_t i = 0; s->t && i < s->n; i++) {
        free(s->t[i].idx);
        free(s->t[i].val);
    }
    free(s->t);
    memset(s, 0, sizeof *s);
}

typedef struct bench_scatter_job {
    const bench_scatter *s;
    ferry_model *m;
    int part, parts;
    int bad;
} bench_scatter_job;

static inline void *bench_scatter_part(void *arg)
{
    bench_scatter_job *j = arg;
    for (size_t i = 0; i < j->s->n; i++) {
        const bench_scatter_t *t = &j->s->t[i];
        uint8_t *dst = ferry_model_data_mut(j->m, i);
        uint64_t lo = t->k * (uint64_t)j->part / (uint64_t)j->parts, hi = t->k * (uint64_t)(j->part + 1) / (uint64_t)j->parts;
        if (t->w == 2) {
            const uint16_t *v = (const uint16_t *)(const void *)t->val;
            for (uint64_t q = lo; q < hi; q++) {
                uint32_t p = t->idx[q];
                if (p >= t->nwords) { j->bad = 1; return NULL; }
                memcpy(dst + 2 * (uint64_t)p, v + q, 2);
            }
        } else {
            for (uint64_t q = lo; q < hi; q++) {
                uint32_t p = t->idx[q];
                if (p >= t->nwords) { j->bad = 1; return NULL; }
                memcpy(dst + (uint64_t)p * t->w, t->val + q * t->w, t->w);
            }
        }
    }
    return NULL;
}

/* Scatters every change into m (a writable copy of OLD); 0, or -1 on an
 * index out of range (never, for arrays from bench_scatter_make). */
static inline int bench_scatter_run(const bench_scatter *s, ferry_model *m, int threads)
{
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    bench_scatter_job jobs[64];
    pthread_t th[64];
    for (int i = 0; i < threads; i++) jobs[i] = (bench_scatter_job){s, m, i, threads, 0};
    for (int i = 1; i < threads; i++)
        if (pthread_create(&th[i], NULL, bench_scatter_part, &jobs[i])) return -1;
    bench_scatter_part(&jobs[0]);
    int bad = jobs[0].bad;
    for (int i = 1; i < threads; i++) {
        pthread_join(th[i], NULL);
        bad |= jobs[i].bad;
    }
    return bad ? -1 : 0;
}

#endif /* BENCH_SCATTER_H */
