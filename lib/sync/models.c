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

/* "BF16 [4, 8]" */
static void describe(char *out, size_t cap, const ferry_tensor *t)
{
    size_t n = (size_t)snprintf(out, cap, "%s [", ferry_dtype_name(t->dtype));
    for (uint32_t d = 0; d < t->ndim && n < cap; d++)
        n += (size_t)snprintf(out + n, cap - n, "%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* Up to 4 names of x's tensors that y lacks, quoted, into out. */
static void names_missing(char *out, size_t cap, const ferry_model *x, const ferry_model *y)
{
    size_t n = 0, k = 0;
    out[0] = 0;
    for (size_t i = 0; i < ferry_model_count(x) && n < cap; i++) {
        const char *name = ferry_model_tensor(x, i)->name;
        if (ferry_model_find(y, name)) continue;
        if (k++ == 4) {
            snprintf(out + n, cap - n, ", ...");
            return;
        }
        n += (size_t)snprintf(out + n, cap - n, "%s'%.100s'", k > 1 ? ", " : "", name);
    }
}

/* a: the model that must be fitted (the caller's), b: the candidate (a
 * version); why says what differs, with both sides. */
bool ferry__sync_same_structure(const ferry_model *a, const ferry_model *b, char *why, size_t cap)
{
    size_t n = ferry_model_count(a);
    char only_a[256], only_b[256];
    names_missing(only_a, sizeof only_a, a, b);
    names_missing(only_b, sizeof only_b, b, a);
    if (only_a[0] || only_b[0] || n != ferry_model_count(b)) {
        snprintf(why, cap, "the version has %zu tensors, the caller's model %zu; not in the caller's model: %s; missing from the version: %s",
                 ferry_model_count(b), n, only_b[0] ? only_b : "none", only_a[0] ? only_a : "none");
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const ferry_tensor *x = ferry_model_tensor(a, i), *y = ferry_model_tensor(b, i);
        if (strcmp(x->name, y->name)) {
            snprintf(why, cap, "tensor '%.200s' instead of '%.200s'", y->name, x->name);
            return false;
        }
        if (x->dtype != y->dtype || x->ndim != y->ndim || (x->ndim && memcmp(x->shape, y->shape, x->ndim * sizeof *x->shape))) {
            char dx[160], dy[160];
            describe(dx, sizeof dx, x);
            describe(dy, sizeof dy, y);
            snprintf(why, cap, "tensor '%.200s' is %s in the version, %s in the caller's model", x->name, dy, dx);
            return false;
        }
    }
    return true;
}
