/*
 * bench_util.h — small helpers shared by the bench programs: a growable byte
 * buffer, little-endian stores, a monotonic clock, errors as text, and the
 * "pair" view that the peer formats and the entropy bound work on.
 *
 * Header-only (static inline) because the Makefile builds every .c file of
 * bench/ into its own program; a bench that does not use a helper pays nothing.
 */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ferry.h"

/* ---------------------------------------------------------------------
 * Errors: every helper that can fail returns -1 and writes one line into a
 * caller-provided bench_err; the driver prints it and exits non-zero.
 * --------------------------------------------------------------------- */
typedef struct bench_err { char msg[512]; } bench_err;

static inline int bench_fail(bench_err *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline int bench_fail(bench_err *e, const char *fmt, ...)
{
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* ---------------------------------------------------------------------
 * Growable byte buffer.  data is NULL until the first append.
 * --------------------------------------------------------------------- */
typedef struct bench_buf { uint8_t *data; size_t size, cap; } bench_buf;

static inline int bench_buf_reserve(bench_buf *b, size_t extra)
{
    if (extra <= b->cap - b->size) return 0;
    if (extra > SIZE_MAX / 2 - b->size) return -1;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->size < extra) cap *= 2;
    uint8_t *p = realloc(b->data, cap);
    if (!p) return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

static inline int bench_buf_append(bench_buf *b, const void *p, size_t n)
{
    if (n == 0) return 0;
    if (bench_buf_reserve(b, n)) return -1;
    memcpy(b->data + b->size, p, n);
    b->size += n;
    return 0;
}

/* Appends the low `width` bytes of v, little-endian (width 1, 2, 4 or 8). */
static inline int bench_buf_put_le(bench_buf *b, uint64_t v, unsigned width)
{
    uint8_t tmp[8];
    for (unsigned i = 0; i < width; i++) tmp[i] = (uint8_t)(v >> (8 * i));
    return bench_buf_append(b, tmp, width);
}

static inline void bench_buf_free(bench_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->size = b->cap = 0;
}

static inline uint64_t bench_get_le(const uint8_t *p, unsigned width)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < width; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static inline void bench_put_le(uint8_t *p, uint64_t v, unsigned width)
{
    for (unsigned i = 0; i < width; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* dir/name into dst (n bytes); -1 if it does not fit. */
static inline int bench_path(char *dst, size_t n, const char *dir, const char *name, bench_err *e)
{
    int w = snprintf(dst, n, "%s/%s", dir, name);
    return (w < 0 || (size_t)w >= n) ? bench_fail(e, "path too long: %s/%s", dir, name) : 0;
}

/* Monotonic seconds. */
static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n values (sorts them in place); 0 for n == 0. */
static inline double bench_median(double *v, size_t n)
{
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---------------------------------------------------------------------
 * The pair view.  Peers and the entropy bound see a checkpoint pair as a
 * list of tensors with identical names, dtypes and shapes on both sides,
 * each cut into `words` of `width` bytes:
 *   - width = the element size for 8/16/32/64-bit dtypes (BF16 -> 2, F32 -> 4);
 *   - width = 1 (the raw bytes) for sub-byte dtypes (F4, F6_*), whose
 *     elements do not fall on byte boundaries.
 * A change is a word whose bytes differ.  Decoders get a view whose `cur`
 * pointers are NULL: they may use only the base and the patch.
 * --------------------------------------------------------------------- */
typedef struct bench_tensor {
    const char *name;
    ferry_dtype dtype;
    uint32_t ndim;
    const uint64_t *shape;
    uint64_t nbytes;
    unsigned width;        /* bytes per word: 1, 2, 4 or 8 */
    uint64_t nwords;       /* nbytes / width */
    const uint8_t *old;    /* base bytes */
    const uint8_t *cur;    /* target bytes; NULL in a decoder's view */
} bench_tensor;

typedef struct bench_pair {
    size_t count;
    bench_tensor *t;       /* sorted by name (bytewise), like ferry models */
    long version, base_version; /* step numbers when known (SkyRL manifest) */
} bench_pair;

static inline unsigned bench_word_width(ferry_dtype dt)
{
    unsigned bits = ferry_dtype_bits(dt);
    return (bits == 8 || bits == 16 || bits == 32 || bits == 64) ? bits / 8 : 1;
}

/* Index of the tensor called name in a pair, or -1 (binary search). */
static inline long bench_pair_find(const bench_pair *p, const char *name)
{
    size_t lo = 0, hi = p->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(p->t[mid].name, name);
        if (c == 0) return (long)mid;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return -1;
}

/* Ascending positions (word indices) of the changed words of t, in a new
 * array *pos of *k entries (NULL when k == 0).  Returns -1 on no memory. */
static inline int bench_changed(const bench_tensor *t, uint64_t **pos, uint64_t *k)
{
    uint64_t n = 0, cap = 0;
    uint64_t *v = NULL;
    const unsigned w = t->width;
    for (uint64_t i = 0; i < t->nwords; i++) {
        /* Skip 8 equal bytes at once where words fit them evenly (the peers'
         * encoders would compare vectors too; a byte loop would slow them). */
        if (w <= 8 && i % (8 / w) == 0 && (i + 8 / w) <= t->nwords) {
            uint64_t x, y;
            memcpy(&x, t->old + i * w, 8);
            memcpy(&y, t->cur + i * w, 8);
            if (x == y) { i += 8 / w - 1; continue; }
        }
        int diff;
        if (w == 2) {
            diff = t->old[2 * i] != t->cur[2 * i] || t->old[2 * i + 1] != t->cur[2 * i + 1];
        } else {
            diff = memcmp(t->old + i * w, t->cur + i * w, w) != 0;
        }
        if (!diff) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            uint64_t *nv = realloc(v, cap * sizeof *v);
            if (!nv) { free(v); return -1; }
            v = nv;
        }
        v[n++] = i;
    }
    *pos = v;
    *k = n;
    return 0;
}

/* An owned copy of model a (tensors and metadata), for in-place applies;
 * 0 or a ferry status code (ferry_last_error() says why). */
static inline int bench_model_copy(const ferry_model *a, ferry_model **out)
{
    ferry_model *c = NULL;
    int rc = ferry_model_create(&c);
    for (size_t i = 0; !rc && i < ferry_model_count(a); i++) {
        const ferry_tensor *t = ferry_model_tensor(a, i);
        rc = ferry_model_add(c, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, FERRY_ADD_COPY);
    }
    for (size_t i = 0; !rc && i < ferry_model_metadata_count(a); i++) {
        const char *k, *v;
        ferry_model_metadata(a, i, &k, &v);
        rc = ferry_model_set_metadata(c, k, v);
    }
    if (rc) ferry_model_free(c);
    else *out = c;
    return rc;
}

/* Puts a copy made by bench_model_copy back to a's bytes. */
static inline void bench_model_reset(ferry_model *c, const ferry_model *a)
{
    for (size_t i = 0; i < ferry_model_count(a); i++)
        memcpy(ferry_model_data_mut(c, i), ferry_model_tensor(a, i)->data, ferry_model_tensor(a, i)->nbytes);
}

#endif /* BENCH_UTIL_H */
