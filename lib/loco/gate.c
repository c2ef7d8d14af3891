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

/* The value the gate would send for the accumulated s (0: nothing). */
static inline float sent_value(float s, float g, int values)
{
    if (values != FERRY_LOCO_VALUES_CELL || s != s) return s; /* a NaN goes on to fail */
    int64_t k = ferry__loco_cell_quantize(s, g);
    return k ? ferry__loco_cell_value(k, g) : 0.0f;
}

int ferry__loco_gate(const float *global, const float *local, const float *update, float *residual,
                     uint64_t n, int values, ferry_loco_sparse *out)
{
    if (!out || (n && (!global || (!local && !update) || !residual)))
        return ferry__fail(FERRY_ERR_ARG, "loco gate: NULL argument");
    if (values != FERRY_LOCO_VALUES_FP32 && values != FERRY_LOCO_VALUES_CELL)
        return ferry__fail(FERRY_ERR_ARG, "loco gate: value coding %d", values);
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
        float s = residual[i] + (update ? update[i] : global[i] - local[i]);
        float q = sent_value(s, global[i], values);
        /* what is sent is what moves the weights: it must change what a
         * rollout engine sees, else it waits in the residual */
        if (q == 0.0f || bf16_of(global[i] - q) == bf16_of(global[i])) continue;
        if (!isfinite(s) || !isfinite(q)) {
            out->count = 0;
            return ferry__fail(FERRY_ERR_LOCO_VALUE,
                               "loco gate: update %g at index %llu is not finite or too large "
                               "to code (global %g, residual %g)",
                               (double)s, (unsigned long long)i, (double)global[i],
                               (double)residual[i]);
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
        out->val[out->count] = q;
        out->count++;
    }
    /* Pass 2: the residual keeps what was not sent: s where the gate held
     * the entry back, s − q where it sent q (0 for FP32 values; the cell
     * code's rounding error otherwise, exact in FP32 because q is within
     * half a unit of s, so nothing is lost over rounds).  s is recomputed
     * with the same FP32 operations, so it is the value pass 1 saw. */
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; i++) {
        float s = residual[i] + (update ? update[i] : global[i] - local[i]);
        if (k < out->count && out->idx[k] == i) {
            residual[i] = s - out->val[k];
            k++;
        } else {
            residual[i] = s;
        }
    }
    return FERRY_OK;
}

int ferry_loco_gate(const float *global, const float *local, float *residual, uint64_t n,
                    ferry_loco_sparse *out)
{
    if (n && !local) return ferry__fail(FERRY_ERR_ARG, "loco gate: NULL argument");
    return ferry__loco_gate(global, local, NULL, residual, n, FERRY_LOCO_VALUES_FP32, out);
}

int ferry_loco_gate_update(const float *global, const float *update, float *residual, uint64_t n,
                           int values, ferry_loco_sparse *out)
{
    if (n && !update) return ferry__fail(FERRY_ERR_ARG, "loco gate: NULL argument");
    return ferry__loco_gate(global, NULL, update, residual, n, values, out);
}
