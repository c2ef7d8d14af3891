/* The BF16-visibility gate with FP32 error feedback (ferry_loco.h). */
#include <math.h>

#include "bf16.h"
#include "loco.h"

/* bf16 of an FP32 value, by bits: ferry_f32_to_bf16's rounding, inlined. */
static inline uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return ferry__bf16_from_bits(u);
}

int ferry_loco_gate(const float *global, const float *local, float *residual, uint64_t n,
                    ferry_loco_sparse *out)
{
    if (!out || (n && (!global || !local || !residual)))
        return ferry__fail(FERRY_ERR_ARG, "loco gate: NULL argument");
    if (n > FERRY_LOCO_MAX_N)
        return ferry__fail(FERRY_ERR_LIMIT, "loco gate: %llu weights > %llu",
                           (unsigned long long)n, (unsigned long long)FERRY_LOCO_MAX_N);
    out->count = 0;
    /* Pass 1 collects the gated entries without touching the residual, so
     * that a failure (non-finite s, no memory) leaves the caller's state as
     * it was.  The list grows geometrically: a round rarely gates more
     * than a few percent of n, so reserving n up front would waste memory
     * on large models. */
    for (uint64_t i = 0; i < n; i++) {
        float s = residual[i] + (global[i] - local[i]);
        if (bf16_of(global[i] - s) == bf16_of(global[i])) continue;
        if (!isfinite(s)) {
            out->count = 0;
            return ferry__fail(FERRY_ERR_LOCO_VALUE,
                               "loco gate: pseudo-gradient %g at index %llu is not finite "
                               "(global %g, local %g, residual %g)",
                               (double)s, (unsigned long long)i, (double)global[i],
                               (double)local[i], (double)residual[i]);
        }
        if (out->count == out->cap) {
            uint64_t cap = out->cap < 1024 ? 1024 : out->cap * 2;
            if (cap > n) cap = n;
            int rc = ferry__loco_sparse_reserve(out, cap);
            if (rc) {
                out->count = 0;
                return rc;
            }
        }
        out->idx[out->count] = i;
        out->val[out->count] = s;
        out->count++;
    }
    /* Pass 2: the residual keeps s where the gate held the entry back and
     * is cleared where it was sent.  s is recomputed with the same FP32
     * operations, so it is the value pass 1 saw. */
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (k < out->count && out->idx[k] == i) {
            residual[i] = 0.0f;
            k++;
        } else {
            residual[i] = residual[i] + (global[i] - local[i]);
        }
    }
    return FERRY_OK;
}
