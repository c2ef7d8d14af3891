/* Sparse vectors: growth and release. */
#include <stdlib.h>

#include "loco.h"

void ferry_loco_sparse_release(ferry_loco_sparse *s)
{
    if (!s) return;
    free(s->idx);
    free(s->val);
    memset(s, 0, sizeof *s);
}

int ferry__loco_sparse_reserve(ferry_loco_sparse *s, uint64_t cap)
{
    if (cap <= s->cap) return FERRY_OK;
    /* Callers bound cap by the model size (<= FERRY_LOCO_MAX_N), so the
     * byte counts below cannot overflow size_t on a 64-bit host; check
     * anyway for 32-bit ones. */
    if (cap > SIZE_MAX / sizeof(uint64_t))
        return ferry__fail(FERRY_ERR_NOMEM, "loco: %llu sparse entries do not fit in memory",
                           (unsigned long long)cap);
    uint64_t *idx = ferry__realloc(s->idx, (size_t)cap * sizeof *idx);
    if (!idx) return FERRY_ERR_NOMEM;
    s->idx = idx;
    float *val = ferry__realloc(s->val, (size_t)cap * sizeof *val);
    if (!val) return FERRY_ERR_NOMEM;
    s->val = val;
    s->cap = cap;
    return FERRY_OK;
}
