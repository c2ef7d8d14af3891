/* The dense kernel (see gemm.h for its contract). */
#include <string.h>

#include "gemm.h"

#ifdef __clang__
/* clang contracts a*b+c into an FMA where the target has one; the edge code
 * and the vector body could then round differently.  GCC needs nothing:
 * -std=c11 turns contraction off. */
#pragma STDC FP_CONTRACT OFF
#endif

/* A 4×8 block of C lives in eight 4-lane registers while k runs (SSE2 has
 * sixteen), so each loaded element of B feeds four rows and each element of
 * A eight columns: ~3x the throughput of a row-at-a-time loop.  Generic
 * vectors (GCC/clang extension), so any target compiles it. */
typedef float v4f __attribute__((vector_size(16)));

#define MR 4
#define NR 8
#define KB 256 /* k-panel: the 8-column strip of B stays in L1 across row blocks */

static inline v4f ld(const float *p)
{
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void st(float *p, v4f v) { memcpy(p, &v, sizeof v); }

static inline v4f splat(float x) { return (v4f){x, x, x, x}; }

/* C[0..4)[0..8) += A[0..4)[0..kn) · B[0..kn)[0..8). */
static void block_4x8(float *restrict c, size_t ldc, const float *restrict a, size_t lda,
                      const float *restrict b, size_t ldb, size_t kn)
{
    v4f c00 = ld(c), c01 = ld(c + 4);
    v4f c10 = ld(c + ldc), c11 = ld(c + ldc + 4);
    v4f c20 = ld(c + 2 * ldc), c21 = ld(c + 2 * ldc + 4);
    v4f c30 = ld(c + 3 * ldc), c31 = ld(c + 3 * ldc + 4);
    for (size_t k = 0; k < kn; k++) {
        v4f b0 = ld(b + k * ldb), b1 = ld(b + k * ldb + 4);
        v4f a0 = splat(a[k]), a1 = splat(a[lda + k]);
        v4f a2 = splat(a[2 * lda + k]), a3 = splat(a[3 * lda + k]);
        c00 += a0 * b0;
        c01 += a0 * b1;
        c10 += a1 * b0;
        c11 += a1 * b1;
        c20 += a2 * b0;
        c21 += a2 * b1;
        c30 += a3 * b0;
        c31 += a3 * b1;
    }
    st(c, c00), st(c + 4, c01);
    st(c + ldc, c10), st(c + ldc + 4, c11);
    st(c + 2 * ldc, c20), st(c + 2 * ldc + 4, c21);
    st(c + 3 * ldc, c30), st(c + 3 * ldc + 4, c31);
}

/* Any block, one element at a time — the same ascending-k multiply-add per
 * element as block_4x8, hence the same bits. */
static void block_any(float *restrict c, size_t ldc, const float *restrict a, size_t lda,
                      const float *restrict b, size_t ldb, size_t mn, size_t nn, size_t kn)
{
    for (size_t i = 0; i < mn; i++)
        for (size_t k = 0; k < kn; k++) {
            float av = a[i * lda + k];
            for (size_t j = 0; j < nn; j++) c[i * ldc + j] += av * b[k * ldb + j];
        }
}

void rl_gemm_acc(float *restrict c, const float *restrict a, size_t lda,
                 const float *restrict b, size_t m, size_t k, size_t n)
{
    size_t m4 = m - m % MR, n8 = n - n % NR;
    for (size_t k0 = 0; k0 < k; k0 += KB) {
        size_t kn = k - k0 < KB ? k - k0 : KB;
        const float *ap = a + k0, *bp = b + k0 * n;
        for (size_t j = 0; j < n8; j += NR) {
            for (size_t i = 0; i < m4; i += MR)
                block_4x8(c + i * n + j, n, ap + i * lda, lda, bp + j, n, kn);
            if (m4 < m)
                block_any(c + m4 * n + j, n, ap + m4 * lda, lda, bp + j, n, m - m4, NR, kn);
        }
        if (n8 < n) block_any(c + n8, n, ap, lda, bp + n8, n, m, n - n8, kn);
    }
}

void rl_transpose(float *restrict dst, const float *restrict src, size_t m, size_t n)
{
    /* 32×32 tiles keep both sides in L1. */
    for (size_t i0 = 0; i0 < m; i0 += 32)
        for (size_t j0 = 0; j0 < n; j0 += 32) {
            size_t ie = i0 + 32 < m ? i0 + 32 : m, je = j0 + 32 < n ? j0 + 32 : n;
            for (size_t i = i0; i < ie; i++)
                for (size_t j = j0; j < je; j++) dst[j * m + i] = src[i * n + j];
        }
}
