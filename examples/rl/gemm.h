/*
 * gemm.h — the one dense kernel of the reference workload (internal).
 *
 * Every matrix product of the forward and the backward pass is written as
 * C[M,N] += A[M,K] · B[K,N] on row-major FP32 arrays (the backward pass
 * transposes a weight or an activation first, which costs O(K·N), not
 * O(M·K·N)).  One kernel means one place to make fast and one order of
 * floating-point operations to reason about.
 *
 * Determinism: each C[m][n] is accumulated over k in ascending order, one
 * multiply and one add per step, whatever M is and however rows are
 * blocked.  So a row's result does not depend on which other rows share the
 * call — a rollout of prompt p gives the same tokens alone or in a batch.
 */
#ifndef RL_GEMM_H
#define RL_GEMM_H

#include <stddef.h>

/* C += A·B.  A is M×K with row stride lda, B is K×N (stride N), C is M×N
 * (stride N).  C must not overlap A or B. */
void rl_gemm_acc(float *restrict c, const float *restrict a, size_t lda,
                 const float *restrict b, size_t m, size_t k, size_t n);

/* dst[N,M] = transpose of src[M,N] (both row-major). */
void rl_transpose(float *restrict dst, const float *restrict src, size_t m, size_t n);

#endif /* RL_GEMM_H */
