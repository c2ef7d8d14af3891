/* FP8 block quantization of a BF16 model (include/ferry_quant.h,
 * docs/FORMAT.md "FP8 block quantization").  Bit-exact by construction:
 * every step is one IEEE FP32 operation (the max, one division for the
 * scale, one division per weight) followed by an exact round to E4M3FN, so
 * any conforming implementation (numpy, torch on CPU) gives the same codes;
 * tests/python/test_fp8.py holds this file to a numpy reference. */
#include "common.h"
#include "bf16.h"
#include "ferry_quant.h"
#include "model.h"
#include "quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define QB FERRY_QUANT_BLOCK
#define E4M3_MAX 448.0f

static const char *const k_names[] = {"none", "fp8-block128", "fp8-block128-sticky"};

const char *ferry_quant_name(ferry_quant q)
{
    return (unsigned)q < sizeof k_names / sizeof k_names[0] ? k_names[q] : NULL;
}

int ferry_quant_parse(const char *name, ferry_quant *out)
{
    for (unsigned i = 0; name && i < sizeof k_names / sizeof k_names[0]; i++)
        if (!strcmp(name, k_names[i])) {
            *out = (ferry_quant)i;
            return FERRY_OK;
        }
    return ferry__fail(FERRY_ERR_ARG, "quantization '%s' is unknown (none, fp8-block128, fp8-block128-sticky)",
                       name ? name : "(null)");
}

int ferry_quant_eligible(const ferry_tensor *t, int cast_bf16)
{
    if (t->dtype != FERRY_BF16 && !(cast_bf16 && t->dtype == FERRY_F32)) return 0;
    return t->ndim == 2 && t->shape[0] >= QB && t->shape[1] >= QB && !strstr(t->name, "embed") && !strstr(t->name, "lm_head");
}

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Round to nearest even on the FP32 bits: normals keep 3 of 23 mantissa
 * bits; below 2^-6 the step is 2^-9, so a * 2^9 (exact: a power of two) is
 * rounded to an integer 0..8 (8 is the smallest normal, code 0x08). */
uint8_t ferry_f32_to_e4m3(float x)
{
    uint32_t u = f32_bits(x);
    uint8_t sign = (uint8_t)(u >> 24 & 0x80);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7F; /* NaN */
    if (a >= 0x43E00000u) return sign | 0x7E; /* >= 448 (infinity too): saturate */
    if (a < 0x3C800000u) {                   /* below 2^-6: subnormal step 2^-9 */
        float v;
        memcpy(&v, &a, 4);
        return sign | (uint8_t)nearbyintf(v * 512.0f);
    }
    int e = (int)(a >> 23) - 127; /* -6 .. 8 */
    uint32_t m = a & 0x7FFFFFu, q = m >> 20, rest = m & 0xFFFFFu;
    if (rest > 0x80000u || (rest == 0x80000u && (q & 1))) q++;
    if (q == 8) q = 0, e++;
    /* 448 + less than half a step rounds to 448 at most: a < 464 here */
    return sign | (uint8_t)((uint32_t)(e + 7) << 3 | q);
}

float ferry_e4m3_to_f32(uint8_t q)
{
    unsigned e = q >> 3 & 15, m = q & 7;
    float v;
    if (e == 15 && m == 7) v = NAN;
    else if (!e) v = ldexpf((float)m, -9);
    else v = ldexpf(1.0f + (float)m / 8.0f, (int)e - 7);
    return q & 0x80 ? -v : v;
}

/* FP32 value of element i of BF16 (or, cast, FP32) data. */
static inline float wval(ferry_dtype dtype, const void *data, uint64_t i)
{
    uint32_t u;
    if (dtype == FERRY_BF16) u = (uint32_t)ferry__le16((const uint8_t *)data + 2 * i) << 16;
    else u = (uint32_t)ferry__bf16_from_bits(ferry__le32((const uint8_t *)data + 4 * i)) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* prev's scales of tensor name, when prev holds them with this grid. */
static const float *prev_scales(const ferry_model *prev, const char *sname, uint64_t nbr, uint64_t nbc)
{
    const ferry_tensor *s = prev ? ferry_model_find(prev, sname) : NULL;
    if (!s || s->dtype != FERRY_F32 || s->ndim != 2 || s->shape[0] != nbr || s->shape[1] != nbc) return NULL;
    return s->data;
}

int ferry__quantize_rows(const char *name, ferry_dtype dtype, const void *data, uint64_t row0, uint64_t rows, uint64_t cols,
                         const float *ps, uint8_t *codes, float *scale, uint64_t *kept)
{
    uint64_t nbr = (rows + QB - 1) / QB, nbc = (cols + QB - 1) / QB;
    float *amax = ferry__malloc(nbc * sizeof *amax);
    if (!amax) return FERRY_ERR_NOMEM;
    int rc = FERRY_OK;
    for (uint64_t br = 0; br < nbr; br++) {
        uint64_t r0 = br * QB, r1 = r0 + QB < rows ? r0 + QB : rows;
        for (uint64_t bc = 0; bc < nbc; bc++) amax[bc] = 0.0f;
        /* pass 1: max |w| of each block of this block row (row-major reads) */
        for (uint64_t r = r0; r < r1; r++)
            for (uint64_t c = 0; c < cols; c++) {
                float a = fabsf(wval(dtype, data, r * cols + c));
                if (!isfinite(a)) {
                    rc = ferry__fail(FERRY_ERR_ARG, "tensor '%s': element [%llu, %llu] is not finite: no FP8 scale exists for its block",
                                     name, (unsigned long long)(row0 + r), (unsigned long long)c);
                    goto done;
                }
                if (a > amax[c / QB]) amax[c / QB] = a;
            }
        for (uint64_t bc = 0; bc < nbc; bc++) {
            float a = amax[bc], s = a > 0.0f ? a / E4M3_MAX : 1.0f;
            if (ps) {
                float p = ps[br * nbc + bc];
                if (isfinite(p) && p > 0.0f && a <= E4M3_MAX * p && a > (E4M3_MAX / 2) * p) {
                    s = p;
                    (*kept)++;
                }
            }
            scale[br * nbc + bc] = s;
        }
        /* pass 2: the codes */
        for (uint64_t r = r0; r < r1; r++)
            for (uint64_t c = 0; c < cols; c++)
                codes[r * cols + c] = ferry_f32_to_e4m3(wval(dtype, data, r * cols + c) / scale[br * nbc + c / QB]);
    }
done:
    free(amax);
    return rc;
}

static int quantize_tensor(const ferry_tensor *t, bool sticky, const ferry_model *prev, ferry_model *out,
                           ferry_quant_stats *st)
{
    uint64_t rows = t->shape[0], cols = t->shape[1];
    uint64_t nbr = (rows + QB - 1) / QB, nbc = (cols + QB - 1) / QB;
    size_t nl = strlen(t->name) + sizeof FERRY_QUANT_SCALE_SUFFIX;
    char *sname = ferry__malloc(nl);
    uint8_t *codes = ferry__malloc(rows * cols); /* both dims >= 128 */
    float *scale = ferry__malloc(nbr * nbc * sizeof *scale);
    int rc = FERRY_OK;
    if (!sname || !codes || !scale) {
        rc = FERRY_ERR_NOMEM;
        goto done;
    }
    snprintf(sname, nl, "%s%s", t->name, FERRY_QUANT_SCALE_SUFFIX);
    const float *ps = sticky ? prev_scales(prev, sname, nbr, nbc) : NULL;
    if ((rc = ferry__quantize_rows(t->name, t->dtype, t->data, 0, rows, cols, ps, codes, scale, &st->scales_kept))) goto done;
    st->tensors++;
    st->blocks += nbr * nbc;
    uint64_t sshape[2] = {nbr, nbc};
    rc = ferry__model_add_owned(out, t->name, FERRY_F8_E4M3, 2, t->shape, codes, rows * cols);
    codes = NULL; /* taken (or freed) by the model */
    if (!rc) {
        rc = ferry__model_add_owned(out, sname, FERRY_F32, 2, sshape, scale, nbr * nbc * sizeof *scale);
        scale = NULL;
    }
done:
    free(sname);
    free(codes);
    free(scale);
    return rc;
}

/* A tensor the scheme leaves alone: copied, FP32 cast to BF16 under the gate. */
static int copy_tensor(const ferry_tensor *t, int cast_bf16, ferry_model *out)
{
    if (!(cast_bf16 && t->dtype == FERRY_F32))
        return ferry_model_add(out, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, FERRY_ADD_COPY);
    uint16_t *b = ferry__malloc(t->nelem ? t->nelem * 2 : 1);
    if (!b) return FERRY_ERR_NOMEM;
    for (uint64_t i = 0; i < t->nelem; i++) b[i] = ferry__bf16_from_bits(ferry__le32((const uint8_t *)t->data + 4 * i));
    return ferry__model_add_owned(out, t->name, FERRY_BF16, t->ndim, t->shape, b, t->nelem * 2);
}

int ferry_quantize(const ferry_model *m, ferry_quant q, int cast_bf16, const ferry_model *prev, ferry_model **out,
                   ferry_quant_stats *stats)
{
    *out = NULL;
    if (!ferry_quant_name(q)) return ferry__fail(FERRY_ERR_ARG, "quantization %d is unknown", (int)q);
    ferry_quant_stats st = {0};
    ferry_model *o;
    int rc = ferry_model_create(&o);
    if (rc) return rc;
    size_t n = ferry_model_count(m);
    for (size_t i = 0; i < n && !rc; i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        if (q == FERRY_QUANT_NONE || !ferry_quant_eligible(t, cast_bf16)) {
            rc = copy_tensor(t, cast_bf16, o);
            continue;
        }
        char sname[FERRY_MAX_NAME + sizeof FERRY_QUANT_SCALE_SUFFIX];
        snprintf(sname, sizeof sname, "%s%s", t->name, FERRY_QUANT_SCALE_SUFFIX);
        if (ferry_model_find(m, sname))
            rc = ferry__fail(FERRY_ERR_ARG, "tensor '%s': the model already holds '%s', the name of its FP8 scales", t->name, sname);
        else rc = quantize_tensor(t, q == FERRY_QUANT_FP8_BLOCK128_STICKY, prev, o, &st);
    }
    for (size_t i = 0; i < ferry_model_metadata_count(m) && !rc; i++) {
        const char *k, *v;
        if (!(rc = ferry_model_metadata(m, i, &k, &v))) rc = ferry_model_set_metadata(o, k, v);
    }
    if (!rc && q != FERRY_QUANT_NONE) rc = ferry_model_set_metadata(o, FERRY_QUANT_METADATA_KEY, ferry_quant_name(q));
    if (rc) {
        ferry_model_free(o);
        return rc;
    }
    if (stats) *stats = st;
    *out = o;
    return FERRY_OK;
}

void ferry_dequantize_fp8(const uint8_t *codes, const float *scale_inv, uint64_t rows, uint64_t cols, float *out)
{
    uint64_t nbc = (cols + QB - 1) / QB;
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t c = 0; c < cols; c++)
            out[r * cols + c] = ferry_e4m3_to_f32(codes[r * cols + c]) * scale_inv[(r / QB) * nbc + c / QB];
}
