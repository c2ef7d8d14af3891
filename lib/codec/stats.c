/* ferry_stats_compute: how two models differ, element by element, without
 * coding a patch (the ULP histogram uses the same order keys as the codec). */
#include <stdlib.h>
#include "sparse.h"

static void tensor_stats(const ferry_tensor *a, const ferry_tensor *b, ferry_tensor_stats *s)
{
    sp_dtype st = sp_dtype_of(b->dtype);
    uint64_t n = b->nbytes * 8 / st.W, half = (uint64_t)1 << (st.W - 1);
    const uint8_t *pa = a->data, *pb = b->data;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t x = sp_load(pa, i, st.W), y = sp_load(pb, i, st.W);
        if (x == y) continue;
        s->changed++;
        uint64_t d = (sp_key(&st, y) - sp_key(&st, x)) & sp_wmask(st.W);
        int64_t sd; /* signed delta, saturated to the histogram's range */
        if (d < half) sd = d > 4 ? 5 : (int64_t)d;
        else {
            uint64_t mag = (~d + 1) & sp_wmask(st.W);
            sd = mag > 4 || mag == 0 ? -5 : -(int64_t)mag;
        }
        if (sd > 4 || sd < -4) s->ulp_far++;
        else s->ulp_hist[sd + 4]++;
    }
}

int ferry_stats_compute(const ferry_model *a, const ferry_model *b, ferry_stats *out)
{
    if (!a || !b || !out) return ferry__fail(FERRY_ERR_ARG, "ferry_stats_compute: NULL argument");
    memset(out, 0, sizeof *out);
    size_t n = ferry_model_count(b);
    out->tensors = ferry__calloc(n ? n : 1, sizeof *out->tensors);
    if (!out->tensors) return FERRY_ERR_NOMEM;
    out->count = n;
    for (size_t i = 0; i < n; i++) {
        const ferry_tensor *tb = ferry_model_tensor(b, i), *ta = ferry_model_find(a, tb->name);
        ferry_tensor_stats *s = &out->tensors[i];
        s->name = tb->name;
        s->dtype = tb->dtype;
        s->nelem = tb->nelem;
        s->comparable = ta && ta->dtype == tb->dtype && ta->ndim == tb->ndim &&
                        memcmp(ta->shape, tb->shape, ta->ndim * sizeof *ta->shape) == 0;
        if (s->comparable) tensor_stats(ta, tb, s);
        else s->changed = tb->nelem;
        out->nelem += s->nelem;
        out->changed += s->changed;
        for (int j = 0; j < FERRY_ULP_BINS; j++) out->ulp_hist[j] += s->ulp_hist[j];
        out->ulp_far += s->ulp_far;
    }
    return FERRY_OK;
}

void ferry_stats_release(ferry_stats *s)
{
    if (!s) return;
    free(s->tensors);
    memset(s, 0, sizeof *s);
}
