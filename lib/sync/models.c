/* Model helpers of the sync layer: the publisher's private copy of what
 * it published (with the FP32 -> BF16 cast of masters), and the structure
 * check memory mode needs before it copies a model into caller buffers. */
#include "sync_impl.h"

#include "model.h"

#include <stdlib.h>

/* The cast goes through an aligned scratch block: tensor data mapped from
 * a file need not be 4-byte aligned. */
static void cast_into(uint16_t *dst, const ferry_tensor *t)
{
    float block[4096];
    const uint8_t *src = t->data;
    for (uint64_t i = 0; i < t->nelem; i += 4096) {
        size_t k = (size_t)(t->nelem - i < 4096 ? t->nelem - i : 4096);
        memcpy(block, src + i * 4, k * 4);
        ferry_f32_to_bf16_n(dst + i, block, k);
    }
}

static int cast_tensor(ferry_model *out, const ferry_tensor *t)
{
    uint64_t nbytes = t->nelem * 2;
    uint16_t *dst = ferry__malloc(nbytes ? (size_t)nbytes : 1);
    if (!dst) return FERRY_ERR_NOMEM;
    cast_into(dst, t);
    return ferry__model_add_owned(out, t->name, FERRY_BF16, t->ndim, t->shape, dst, nbytes);
}

int ferry__sync_model_copy(const ferry_model *m, int cast_bf16, ferry_model **out)
{
    ferry_model *c = NULL;
    int rc = ferry_model_create(&c);
    for (size_t i = 0; !rc && i < ferry_model_count(m); i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        if (cast_bf16 && t->dtype == FERRY_F32) rc = cast_tensor(c, t);
        else rc = ferry_model_add(c, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, FERRY_ADD_COPY);
    }
    for (size_t i = 0; !rc && i < ferry_model_metadata_count(m); i++) {
        const char *k, *v;
        if (!(rc = ferry_model_metadata(m, i, &k, &v))) rc = ferry_model_set_metadata(c, k, v);
    }
    if (rc) {
        ferry_model_free(c);
        return rc;
    }
    *out = c;
    return FERRY_OK;
}

/* Whether ferry__sync_model_overwrite(dst, m, cast_bf16) can run: dst's tensors
 * are writable and have the names, dtypes (after the cast) and shapes of
 * m's, and the metadata is the same. */
bool ferry__sync_model_fits(ferry_model *dst, const ferry_model *m, int cast_bf16)
{
    size_t n = ferry_model_count(m);
    if (n != ferry_model_count(dst) || ferry_model_metadata_count(m) != ferry_model_metadata_count(dst)) return false;
    for (size_t i = 0; i < n; i++) {
        const ferry_tensor *x = ferry_model_tensor(m, i), *y = ferry_model_tensor(dst, i);
        ferry_dtype dt = cast_bf16 && x->dtype == FERRY_F32 ? FERRY_BF16 : x->dtype;
        if (!ferry_model_data_mut(dst, i) || strcmp(x->name, y->name) || dt != y->dtype || x->ndim != y->ndim ||
            (x->ndim && memcmp(x->shape, y->shape, x->ndim * sizeof *x->shape)))
            return false;
    }
    for (size_t i = 0; i < ferry_model_metadata_count(m); i++) {
        const char *k, *v, *k2, *v2;
        if (ferry_model_metadata(m, i, &k, &v) || ferry_model_metadata(dst, i, &k2, &v2) || strcmp(k, k2) || strcmp(v, v2))
            return false;
    }
    return true;
}

void ferry__sync_model_overwrite(ferry_model *dst, const ferry_model *m, int cast_bf16)
{
    for (size_t i = 0; i < ferry_model_count(m); i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        if (cast_bf16 && t->dtype == FERRY_F32) cast_into(ferry_model_data_mut(dst, i), t);
        else if (t->nbytes) memcpy(ferry_model_data_mut(dst, i), t->data, (size_t)t->nbytes);
    }
}

bool ferry__sync_same_structure(const ferry_model *a, const ferry_model *b, char *why, size_t cap)
{
    size_t n = ferry_model_count(a);
    if (n != ferry_model_count(b)) {
        snprintf(why, cap, "%zu tensors instead of %zu", ferry_model_count(b), n);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const ferry_tensor *x = ferry_model_tensor(a, i), *y = ferry_model_tensor(b, i);
        if (strcmp(x->name, y->name)) {
            snprintf(why, cap, "tensor '%.200s' instead of '%.200s'", y->name, x->name);
            return false;
        }
        if (x->dtype != y->dtype || x->ndim != y->ndim || (x->ndim && memcmp(x->shape, y->shape, x->ndim * sizeof *x->shape))) {
            snprintf(why, cap, "tensor '%.200s' changes dtype or shape", x->name);
            return false;
        }
    }
    return true;
}
