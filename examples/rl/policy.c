/* The policy network: layout, initialisation, ferry_model export/import,
 * forward and backward passes (see policy.h). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "policy.h"
#include "rng.h"
#include "task.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* see gemm.c */
#endif

/* ======================================================================
 * Layout
 * ====================================================================== */

rl_policy_config rl_policy_config_default(void)
{
    return (rl_policy_config){.vocab = 32, .window = 11, .embed = 32, .heads = 2, .hidden = 800,
                              .layers = 2};
}

rl_policy_config rl_policy_config_for_task(const rl_task *t)
{
    rl_policy_config c = rl_policy_config_default();
    c.window = t->prompt_len + t->completion_len - 1;
    return c;
}

/* Dimension d of a named tensor, or 0 if absent or of another rank. */
static uint64_t dim_of(const ferry_model *m, const char *name, uint32_t ndim, uint32_t d)
{
    const ferry_tensor *t = ferry_model_find(m, name);
    return t && t->ndim == ndim ? t->shape[d] : 0;
}

int rl_policy_config_from_model(const ferry_model *m, rl_policy_config *out)
{
    if (!m || !out) return FERRY_ERR_ARG;
    if (!ferry_model_find(m, "embed.weight") || !ferry_model_find(m, "mix.weight") ||
        !ferry_model_find(m, "mlp.0.weight") || !ferry_model_find(m, "head.weight"))
        return FERRY_ERR_NOT_FOUND;
    uint64_t v = dim_of(m, "embed.weight", 2, 0), e = dim_of(m, "embed.weight", 2, 1);
    uint64_t a = dim_of(m, "mix.weight", 3, 0), w = dim_of(m, "mix.weight", 3, 1);
    uint64_t h = dim_of(m, "mlp.0.weight", 2, 1);
    uint32_t layers = 0;
    char name[32];
    for (; layers <= RL_MAX_LAYERS; layers++) {
        snprintf(name, sizeof name, "mlp.%u.weight", layers);
        if (!ferry_model_find(m, name)) break;
    }
    if (!v || !e || !a || !w || !h || v > RL_MAX_VOCAB || w > RL_MAX_WINDOW || a > RL_MAX_HEADS ||
        e > 65536 || h > 65536 || layers < 1 || layers > RL_MAX_LAYERS)
        return FERRY_ERR_SHAPE_MISMATCH;
    *out = (rl_policy_config){.vocab = (uint32_t)v, .window = (uint32_t)w, .embed = (uint32_t)e,
                              .heads = (uint32_t)a, .hidden = (uint32_t)h, .layers = layers};
    return FERRY_OK;
}

static int config_ok(const rl_policy_config *c)
{
    return c && c->vocab >= 2 && c->vocab <= RL_MAX_VOCAB && c->window >= 1 &&
           c->window <= RL_MAX_WINDOW && c->embed >= 1 && c->embed <= 65536 &&
           c->heads >= 1 && c->heads <= RL_MAX_HEADS && c->hidden >= 1 &&
           c->hidden <= 65536 && c->layers >= 1 && c->layers <= RL_MAX_LAYERS;
}

size_t rl_policy_config_params(const rl_policy_config *c)
{
    if (!config_ok(c)) return 0;
    /* Every factor is bounded above, so these uint64 products cannot wrap. */
    uint64_t in0 = ((uint64_t)c->window + c->heads) * c->embed;
    uint64_t n = (uint64_t)c->vocab * c->embed + (uint64_t)c->heads * c->window * c->window;
    n += in0 * c->hidden + c->hidden;
    n += (uint64_t)(c->layers - 1) * ((uint64_t)c->hidden * c->hidden + c->hidden);
    n += (uint64_t)c->hidden * c->vocab + c->vocab;
    return n > ((uint64_t)1 << 31) ? 0 : (size_t)n;
}

/* Appends a tensor of shape d[0..ndim) to the layout. */
static void add_param(rl_policy *p, const char *name, uint32_t ndim, uint64_t d0, uint64_t d1,
                      uint64_t d2)
{
    rl_param *t = &p->tensors[p->ntensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    t->offset = p->nparams;
    t->count = (size_t)(d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1));
    p->nparams += t->count;
}

int rl_policy_create(rl_policy *p, const rl_policy_config *cfg)
{
    memset(p, 0, sizeof *p);
    size_t total = rl_policy_config_params(cfg);
    if (!total) return FERRY_ERR_ARG;
    p->cfg = *cfg;
    char name[32];
    add_param(p, "embed.weight", 2, cfg->vocab, cfg->embed, 0);
    add_param(p, "mix.weight", 3, cfg->heads, cfg->window, cfg->window);
    for (uint32_t l = 0; l < cfg->layers; l++) {
        uint64_t in = l ? cfg->hidden : ((uint64_t)cfg->window + cfg->heads) * cfg->embed;
        snprintf(name, sizeof name, "mlp.%u.weight", l);
        add_param(p, name, 2, in, cfg->hidden, 0);
        snprintf(name, sizeof name, "mlp.%u.bias", l);
        add_param(p, name, 1, cfg->hidden, 0, 0);
    }
    add_param(p, "head.weight", 2, cfg->hidden, cfg->vocab, 0);
    add_param(p, "head.bias", 1, cfg->vocab, 0, 0);
    p->w = calloc(p->nparams, sizeof *p->w);
    if (!p->w) {
        memset(p, 0, sizeof *p);
        return FERRY_ERR_NOMEM;
    }
    return FERRY_OK;
}

void rl_policy_release(rl_policy *p)
{
    if (!p) return;
    free(p->w);
    memset(p, 0, sizeof *p);
}

int rl_policy_find(const rl_policy *p, const char *name)
{
    for (size_t i = 0; i < p->ntensors; i++)
        if (!strcmp(p->tensors[i].name, name)) return (int)i;
    return -1;
}

/* Tensor indices of the layout built by rl_policy_create. */
static const rl_param *t_embed(const rl_policy *p) { return &p->tensors[0]; }
static const rl_param *t_mix(const rl_policy *p) { return &p->tensors[1]; }
static const rl_param *t_w(const rl_policy *p, uint32_t l) { return &p->tensors[2 + 2 * l]; }
static const rl_param *t_b(const rl_policy *p, uint32_t l) { return &p->tensors[3 + 2 * l]; }
static const rl_param *t_hw(const rl_policy *p) { return &p->tensors[2 + 2 * p->cfg.layers]; }
static const rl_param *t_hb(const rl_policy *p) { return &p->tensors[3 + 2 * p->cfg.layers]; }

void rl_policy_init_weights(rl_policy *p, uint64_t seed)
{
    memset(p->w, 0, p->nparams * sizeof *p->w);
    for (size_t i = 0; i < p->ntensors; i++) {
        const rl_param *t = &p->tensors[i];
        double std;
        if (t->ndim == 1 || t == t_mix(p)) continue; /* biases and mixing scores start at 0 */
        if (t == t_embed(p)) std = 1.0;
        else if (t == t_hw(p)) std = 0.5 / sqrt((double)p->cfg.hidden);
        else std = 1.0 / sqrt((double)t->shape[0]); /* fan_in */
        rl_rng r = rl_rng_stream(seed, RL_RNG_INIT, i, 0, 0);
        float *w = p->w + t->offset;
        for (size_t j = 0; j < t->count; j++) w[j] = (float)(std * rl_rng_normal(&r));
    }
}

/* ======================================================================
 * ferry models
 * ====================================================================== */

static int wrap(const rl_policy *p, ferry_dtype dt, const void *base, size_t esize,
                ferry_model **out)
{
    ferry_model *m;
    int rc = ferry_model_create(&m);
    if (rc) return rc;
    for (size_t i = 0; i < p->ntensors && !rc; i++) {
        const rl_param *t = &p->tensors[i];
        rc = ferry_model_add(m, t->name, dt, t->ndim, t->shape,
                             (const char *)base + t->offset * esize, (uint64_t)t->count * esize,
                             FERRY_ADD_BORROW);
    }
    if (rc) {
        ferry_model_free(m);
        return rc;
    }
    *out = m;
    return FERRY_OK;
}

int rl_policy_model_f32(const rl_policy *p, ferry_model **out)
{
    return wrap(p, FERRY_F32, p->w, 4, out);
}

int rl_policy_model_bf16(const rl_policy *p, uint16_t *bf16, ferry_model **out)
{
    return wrap(p, FERRY_BF16, bf16, 2, out);
}

void rl_policy_cast_bf16(const rl_policy *p, uint16_t *bf16)
{
    ferry_f32_to_bf16_n(bf16, p->w, p->nparams);
}

void rl_policy_set_bf16(rl_policy *p, const uint16_t *bf16)
{
    for (size_t i = 0; i < p->nparams; i++) {
        uint32_t u = (uint32_t)bf16[i] << 16;
        memcpy(&p->w[i], &u, 4);
    }
}

/* Every tensor of p in m with its shape, nothing else, dtypes allowed by
 * the caller.  Validates everything before anyone writes anything. */
static int model_matches(const rl_policy *p, const ferry_model *m, int allow_f32)
{
    if (!m) return FERRY_ERR_ARG;
    if (ferry_model_count(m) != p->ntensors) return FERRY_ERR_SHAPE_MISMATCH;
    for (size_t i = 0; i < p->ntensors; i++) {
        const rl_param *t = &p->tensors[i];
        const ferry_tensor *ft = ferry_model_find(m, t->name);
        if (!ft) return FERRY_ERR_NOT_FOUND;
        if (ft->dtype != FERRY_BF16 && !(allow_f32 && ft->dtype == FERRY_F32))
            return FERRY_ERR_UNSUPPORTED;
        if (ft->ndim != t->ndim) return FERRY_ERR_SHAPE_MISMATCH;
        for (uint32_t d = 0; d < t->ndim; d++)
            if (ft->shape[d] != t->shape[d]) return FERRY_ERR_SHAPE_MISMATCH;
    }
    return FERRY_OK;
}

int rl_policy_bf16_from_model(const rl_policy *p, const ferry_model *m, uint16_t *bf16)
{
    int rc = model_matches(p, m, 0);
    if (rc) return rc;
    for (size_t i = 0; i < p->ntensors; i++) {
        const rl_param *t = &p->tensors[i];
        const unsigned char *b = ferry_model_find(m, t->name)->data; /* LE, maybe unaligned */
        uint16_t *dst = bf16 + t->offset;
        for (size_t j = 0; j < t->count; j++)
            dst[j] = (uint16_t)(b[2 * j] | b[2 * j + 1] << 8);
    }
    return FERRY_OK;
}

int rl_policy_load(rl_policy *p, const ferry_model *m)
{
    int rc = model_matches(p, m, 1);
    if (rc) return rc;
    for (size_t i = 0; i < p->ntensors; i++) {
        const rl_param *t = &p->tensors[i];
        const ferry_tensor *ft = ferry_model_find(m, t->name);
        float *w = p->w + t->offset;
        if (ft->dtype == FERRY_F32) {
            memcpy(w, ft->data, t->count * 4);
        } else {
            const unsigned char *b = ft->data; /* may be unaligned (mmap) */
            for (size_t j = 0; j < t->count; j++) {
                uint32_t u = ((uint32_t)b[2 * j] | (uint32_t)b[2 * j + 1] << 8) << 16;
                memcpy(&w[j], &u, 4);
            }
        }
    }
    return FERRY_OK;
}

/* ======================================================================
 * FP8 rollout weights (include/ferry_quant.h)
 * ====================================================================== */

int rl_policy_model_quant(const rl_policy *p, ferry_quant q, ferry_model **out)
{
    *out = NULL;
    uint16_t *zero = calloc(p->nparams ? p->nparams : 1, 2);
    if (!zero) return FERRY_ERR_NOMEM;
    ferry_model *m = NULL;
    int rc = rl_policy_model_bf16(p, zero, &m);
    if (!rc) rc = ferry_quantize(m, q, 0, NULL, out, NULL);
    ferry_model_free(m);
    free(zero);
    return rc;
}

/* Whether t has exactly shape (ndim, shape). */
static int same_shape(const ferry_tensor *t, uint32_t ndim, const uint64_t *shape)
{
    if (t->ndim != ndim) return 0;
    for (uint32_t d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d]) return 0;
    return 1;
}

int rl_policy_weights(const rl_policy *p, const ferry_model *m, float *w)
{
    if (!m || !w) return FERRY_ERR_ARG;
    /* everything checked before anything is written */
    size_t expected = p->ntensors;
    for (size_t i = 0; i < p->ntensors; i++) {
        const rl_param *t = &p->tensors[i];
        const ferry_tensor *ft = ferry_model_find(m, t->name);
        if (!ft) return FERRY_ERR_NOT_FOUND;
        if (!same_shape(ft, t->ndim, t->shape)) return FERRY_ERR_SHAPE_MISMATCH;
        if (ft->dtype == FERRY_F8_E4M3) {
            char sn[sizeof t->name + sizeof FERRY_QUANT_SCALE_SUFFIX];
            snprintf(sn, sizeof sn, "%s%s", t->name, FERRY_QUANT_SCALE_SUFFIX);
            const ferry_tensor *sc = ferry_model_find(m, sn);
            if (!sc) return FERRY_ERR_NOT_FOUND;
            if (t->ndim != 2) return FERRY_ERR_SHAPE_MISMATCH;
            uint64_t grid[2] = {(t->shape[0] + FERRY_QUANT_BLOCK - 1) / FERRY_QUANT_BLOCK,
                                (t->shape[1] + FERRY_QUANT_BLOCK - 1) / FERRY_QUANT_BLOCK};
            if (sc->dtype != FERRY_F32) return FERRY_ERR_UNSUPPORTED;
            if (!same_shape(sc, 2, grid)) return FERRY_ERR_SHAPE_MISMATCH;
            expected++;
        } else if (ft->dtype != FERRY_BF16 && ft->dtype != FERRY_F32) {
            return FERRY_ERR_UNSUPPORTED;
        }
    }
    if (ferry_model_count(m) != expected) return FERRY_ERR_SHAPE_MISMATCH;
    for (size_t i = 0; i < p->ntensors; i++) {
        const rl_param *t = &p->tensors[i];
        const ferry_tensor *ft = ferry_model_find(m, t->name);
        const unsigned char *b = ft->data; /* may be unaligned (mmap) */
        float *dst = w + t->offset;
        if (ft->dtype == FERRY_F32) {
            memcpy(dst, b, t->count * 4);
        } else if (ft->dtype == FERRY_BF16) {
            for (size_t j = 0; j < t->count; j++) {
                uint32_t u = ((uint32_t)b[2 * j] | (uint32_t)b[2 * j + 1] << 8) << 16;
                memcpy(&dst[j], &u, 4);
            }
        } else {
            /* FP8: the library's decoding, code x scale per block */
            char sn[sizeof t->name + sizeof FERRY_QUANT_SCALE_SUFFIX];
            snprintf(sn, sizeof sn, "%s%s", t->name, FERRY_QUANT_SCALE_SUFFIX);
            const ferry_tensor *sc = ferry_model_find(m, sn);
            const float *scale = sc->data;
            float *aligned = NULL;
            if ((uintptr_t)scale % sizeof(float)) {
                if (!(aligned = malloc((size_t)sc->nbytes))) return FERRY_ERR_NOMEM;
                memcpy(aligned, sc->data, (size_t)sc->nbytes);
                scale = aligned;
            }
            ferry_dequantize_fp8(b, scale, t->shape[0], t->shape[1], dst);
            free(aligned);
        }
    }
    return FERRY_OK;
}

/* ======================================================================
 * Checkpoint files
 * ====================================================================== */

int rl_policy_save_file(const rl_policy *p, const char *path, const char *const *meta, char *err,
                        size_t errlen)
{
    ferry_model *m;
    int rc = rl_policy_model_f32(p, &m);
    for (size_t i = 0; !rc && meta && meta[i] && meta[i + 1]; i += 2)
        rc = ferry_model_set_metadata(m, meta[i], meta[i + 1]);
    if (!rc) rc = ferry_model_save(m, path);
    if (rc) snprintf(err, errlen, "%s: cannot save: %s (%s)", path, ferry_strerror(rc), ferry_last_error());
    ferry_model_free(m);
    return rc;
}

static void shape_str(char *buf, size_t len, uint32_t ndim, const uint64_t *shape)
{
    size_t k = (size_t)snprintf(buf, len, "[");
    for (uint32_t d = 0; d < ndim && k < len; d++)
        k += (size_t)snprintf(buf + k, len - k, "%s%llu", d ? ", " : "", (unsigned long long)shape[d]);
    if (k < len) snprintf(buf + k, len - k, "]");
}

/* Why m does not fit p, in words (err); 0 if it fits. */
static int explain_mismatch(const rl_policy *p, const ferry_model *m, const char *path, char *err,
                            size_t errlen)
{
    for (size_t i = 0; i < p->ntensors; i++) {
        const rl_param *t = &p->tensors[i];
        const ferry_tensor *ft = ferry_model_find(m, t->name);
        char want[96], have[96];
        if (!ft) {
            snprintf(err, errlen, "%s: tensor '%s' is missing (the policy network has %zu tensors; "
                     "the file has %zu)", path, t->name, p->ntensors, ferry_model_count(m));
            return FERRY_ERR_NOT_FOUND;
        }
        if (ft->dtype != FERRY_F32 && ft->dtype != FERRY_BF16) {
            snprintf(err, errlen, "%s: tensor '%s' is %s; F32 (or BF16) expected", path, t->name,
                     ferry_dtype_name(ft->dtype));
            return FERRY_ERR_UNSUPPORTED;
        }
        int same = ft->ndim == t->ndim;
        for (uint32_t d = 0; same && d < t->ndim; d++) same = ft->shape[d] == t->shape[d];
        if (!same) {
            shape_str(want, sizeof want, t->ndim, t->shape);
            shape_str(have, sizeof have, ft->ndim <= 8 ? ft->ndim : 8, ft->shape);
            rl_policy_config c;
            char hint[160] = "";
            if (!rl_policy_config_from_model(m, &c))
                snprintf(hint, sizeof hint, "; the file holds a network of --vocab %u --embed %u --heads %u "
                         "--dim %u --layers %u with a window of %u slots (--digits %u)", c.vocab, c.embed,
                         c.heads, c.hidden, c.layers, c.window, (c.window + 1) / 2);
            snprintf(err, errlen, "%s: tensor '%s' has shape %s, the network expects %s%s", path, t->name,
                     have, want, hint);
            return FERRY_ERR_SHAPE_MISMATCH;
        }
    }
    for (size_t i = 0; i < ferry_model_count(m); i++) {
        const ferry_tensor *ft = ferry_model_tensor(m, i);
        if (rl_policy_find(p, ft->name) < 0) {
            snprintf(err, errlen, "%s: tensor '%s' is not part of the policy network (a model of another "
                     "network?)", path, ft->name);
            return FERRY_ERR_SHAPE_MISMATCH;
        }
    }
    return 0;
}

int rl_policy_load_file(rl_policy *p, const char *path, char *err, size_t errlen,
                        ferry_model **meta_out)
{
    if (meta_out) *meta_out = NULL;
    ferry_model *m;
    int rc = ferry_model_open(path, &m);
    if (rc) {
        snprintf(err, errlen, "%s: cannot open: %s (%s)", path, ferry_strerror(rc), ferry_last_error());
        return rc;
    }
    if ((rc = explain_mismatch(p, m, path, err, errlen))) goto out;
    for (size_t i = 0; i < p->ntensors; i++) {
        const rl_param *t = &p->tensors[i];
        const ferry_tensor *ft = ferry_model_find(m, t->name);
        const unsigned char *b = ft->data; /* may be unaligned (mmap) */
        for (size_t j = 0; j < t->count; j++) {
            uint32_t u;
            if (ft->dtype == FERRY_F32)
                u = (uint32_t)b[4 * j] | (uint32_t)b[4 * j + 1] << 8 | (uint32_t)b[4 * j + 2] << 16 |
                    (uint32_t)b[4 * j + 3] << 24;
            else
                u = ((uint32_t)b[2 * j] | (uint32_t)b[2 * j + 1] << 8) << 16;
            if ((u & 0x7F800000u) == 0x7F800000u) {
                float f;
                memcpy(&f, &u, 4);
                snprintf(err, errlen, "%s: tensor '%s' element %zu is %g (weights must be finite)", path,
                         t->name, j, (double)f);
                rc = FERRY_ERR_ARG;
                goto out;
            }
        }
    }
    rc = rl_policy_load(p, m); /* checked above: cannot fail */
    if (rc) snprintf(err, errlen, "%s: %s", path, ferry_strerror(rc));
out:
    if (!rc && meta_out) *meta_out = m;
    else ferry_model_free(m);
    return rc;
}

/* ======================================================================
 * Forward / backward
 * ====================================================================== */

static int grow(float **buf, size_t *cap, size_t n)
{
    if (n <= *cap) return 0;
    float *b = realloc(*buf, n * sizeof *b);
    if (!b) return -1;
    *buf = b;
    *cap = n;
    return 0;
}

/* Width of the first layer's input: the window's slots, then the heads. */
static size_t in0_width(const rl_policy_config *c)
{
    return ((size_t)c->window + c->heads) * c->embed;
}

static int work_reserve(const rl_policy *p, rl_work *ws, size_t rows)
{
    if (rows <= ws->rows_cap) return 0;
    const rl_policy_config *c = &p->cfg;
    size_t in0 = in0_width(c);
    size_t wide = in0 > c->hidden ? in0 : c->hidden;
    float **bufs[] = {&ws->x, &ws->alpha, &ws->logits, &ws->d0, &ws->d1};
    size_t widths[] = {in0, (size_t)c->heads * c->window, c->vocab, wide, wide};
    for (size_t i = 0; i < 5; i++) {
        float *b = realloc(*bufs[i], rows * widths[i] * sizeof *b);
        if (!b) return FERRY_ERR_NOMEM;
        *bufs[i] = b;
    }
    for (uint32_t l = 0; l < c->layers; l++) {
        float *b = realloc(ws->h[l], rows * c->hidden * sizeof *b);
        if (!b) return FERRY_ERR_NOMEM;
        ws->h[l] = b;
    }
    ws->rows_cap = rows;
    return 0;
}

void rl_work_release(rl_work *ws)
{
    if (!ws) return;
    free(ws->x);
    free(ws->alpha);
    free(ws->logits);
    free(ws->d0);
    free(ws->d1);
    free(ws->wt);
    free(ws->at);
    for (int l = 0; l < RL_MAX_LAYERS; l++) free(ws->h[l]);
    memset(ws, 0, sizeof *ws);
}

int rl_policy_context(const rl_policy *p, const uint8_t *prompt, uint32_t prompt_len,
                      const uint8_t *completion, uint32_t t, uint8_t *ctx, uint32_t *len)
{
    uint32_t w = p->cfg.window;
    if (prompt_len < 1 || (uint64_t)prompt_len + t > w) return FERRY_ERR_ARG;
    memcpy(ctx, prompt, prompt_len);
    if (t) memcpy(ctx + prompt_len, completion, t);
    memset(ctx + prompt_len + t, 0, w - prompt_len - t); /* empty slots: token 0 */
    *len = prompt_len + t;
    return FERRY_OK;
}

/* y[rows, n] = bias broadcast; then y += x · W. */
static void linear(float *y, const float *x, size_t rows, size_t in, size_t n, const float *w,
                   const float *b)
{
    for (size_t r = 0; r < rows; r++) memcpy(y + r * n, b, n * sizeof *y);
    rl_gemm_acc(y, x, in, w, rows, in, n);
}

/* Mixing head h of a row of length n:
 *     alpha = softmax(RL_MIX_SCALE · mix[h][n-1][0..n)),  out = Σ_s alpha_s · embed[ctx[s]].
 * Double-precision softmax, fixed order: a function of the weights' bits
 * only. */
static void mix_forward(const rl_policy *p, const uint8_t *ctx, uint32_t n, uint32_t h,
                        float *alpha, float *out)
{
    const rl_policy_config *c = &p->cfg;
    size_t E = c->embed, W = c->window;
    const float *score = p->w + t_mix(p)->offset + ((size_t)h * W + (n - 1)) * W;
    const float *emb = p->w + t_embed(p)->offset;
    const double g = RL_MIX_SCALE;
    double mx = g * score[0], sum = 0;
    for (uint32_t s = 1; s < n; s++)
        if (g * score[s] > mx) mx = g * score[s];
    for (uint32_t s = 0; s < n; s++) sum += exp(g * score[s] - mx);
    for (uint32_t s = 0; s < n; s++) alpha[s] = (float)(exp(g * score[s] - mx) / sum);
    for (uint32_t s = n; s < W; s++) alpha[s] = 0.0f;
    memset(out, 0, E * sizeof *out);
    for (uint32_t s = 0; s < n; s++) {
        const float *e = emb + (size_t)ctx[s] * E;
        for (size_t k = 0; k < E; k++) out[k] += alpha[s] * e[k];
    }
}

int rl_forward(const rl_policy *p, const uint8_t *ctx, const uint32_t *len, size_t rows,
               rl_work *ws)
{
    const rl_policy_config *c = &p->cfg;
    if (work_reserve(p, ws, rows)) return FERRY_ERR_NOMEM;
    size_t E = c->embed, W = c->window, A = c->heads, in0 = in0_width(c), H = c->hidden;
    const float *emb = p->w + t_embed(p)->offset;
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *cr = ctx + r * W;
        if (len[r] < 1 || len[r] > W) return FERRY_ERR_ARG;
        float *x = ws->x + r * in0;
        for (size_t s = 0; s < W; s++) {
            if (cr[s] >= c->vocab) return FERRY_ERR_ARG;
            memcpy(x + s * E, emb + (size_t)cr[s] * E, E * sizeof(float));
        }
        for (uint32_t h = 0; h < A; h++)
            mix_forward(p, cr, len[r], h, ws->alpha + (r * A + h) * W, x + (W + h) * E);
    }
    const float *in = ws->x;
    size_t nin = in0;
    for (uint32_t l = 0; l < c->layers; l++) {
        float *h = ws->h[l];
        linear(h, in, rows, nin, H, p->w + t_w(p, l)->offset, p->w + t_b(p, l)->offset);
        for (size_t i = 0; i < rows * H; i++) h[i] = tanhf(h[i]);
        in = h;
        nin = H;
    }
    linear(ws->logits, in, rows, H, c->vocab, p->w + t_hw(p)->offset, p->w + t_hb(p)->offset);
    return FERRY_OK;
}

/* g[in, n] += x^T · dy, via a transposed copy of x (ws->at). */
static int grad_weight(rl_work *ws, float *g, const float *x, const float *dy, size_t rows,
                       size_t in, size_t n)
{
    if (grow(&ws->at, &ws->at_cap, rows * in)) return FERRY_ERR_NOMEM;
    rl_transpose(ws->at, x, rows, in);
    rl_gemm_acc(g, ws->at, rows, dy, in, rows, n);
    return 0;
}

/* dx[rows, in] = dy · W^T, via a transposed copy of W (ws->wt). */
static int grad_input(rl_work *ws, float *dx, const float *dy, const float *w, size_t rows,
                      size_t in, size_t n)
{
    if (grow(&ws->wt, &ws->wt_cap, in * n)) return FERRY_ERR_NOMEM;
    rl_transpose(ws->wt, w, in, n);
    memset(dx, 0, rows * in * sizeof *dx);
    rl_gemm_acc(dx, dy, n, ws->wt, rows, n, in);
    return 0;
}

static void grad_bias(float *g, const float *dy, size_t rows, size_t n)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < n; j++) g[j] += dy[r * n + j];
}

/* Gradient of the input layer: dx (rows × in0) flows into the embedding
 * rows of the slots' tokens and, through the heads, into the mixing
 * weights and again into the embeddings.  With o = Σ_s α_s e_s and
 * α = softmax(g·w), g = RL_MIX_SCALE:  dα_s = do·e_s,
 * dw_s = g α_s (dα_s − Σ_j α_j dα_j),  de_s += α_s do. */
static void grad_embed_mix(const rl_policy *p, const uint8_t *ctx, const uint32_t *len,
                           size_t rows, const rl_work *ws, const float *dx, float *grad)
{
    const rl_policy_config *c = &p->cfg;
    size_t E = c->embed, W = c->window, A = c->heads, in0 = in0_width(c);
    const float *emb = p->w + t_embed(p)->offset;
    float *ge = grad + t_embed(p)->offset, *gm = grad + t_mix(p)->offset;
    double da[RL_MAX_WINDOW];
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *cr = ctx + r * W;
        const float *d = dx + r * in0;
        uint32_t n = len[r];
        for (size_t s = 0; s < W; s++) {
            float *g = ge + (size_t)cr[s] * E;
            for (size_t k = 0; k < E; k++) g[k] += d[s * E + k];
        }
        for (uint32_t h = 0; h < A; h++) {
            const float *alpha = ws->alpha + (r * A + h) * W, *dout = d + (W + h) * E;
            double dot = 0;
            for (uint32_t s = 0; s < n; s++) {
                const float *e = emb + (size_t)cr[s] * E;
                double v = 0;
                for (size_t k = 0; k < E; k++) v += (double)dout[k] * e[k];
                da[s] = v;
                dot += alpha[s] * v;
            }
            float *gs = gm + ((size_t)h * W + (n - 1)) * W;
            for (uint32_t s = 0; s < n; s++) {
                gs[s] += (float)(RL_MIX_SCALE * alpha[s] * (da[s] - dot));
                float *g = ge + (size_t)cr[s] * E;
                for (size_t k = 0; k < E; k++) g[k] += alpha[s] * dout[k];
            }
        }
    }
}

int rl_backward(const rl_policy *p, const uint8_t *ctx, const uint32_t *len, size_t rows,
                rl_work *ws, float *grad)
{
    const rl_policy_config *c = &p->cfg;
    size_t in0 = in0_width(c), H = c->hidden, V = c->vocab;
    uint32_t L = c->layers;
    if (rows > ws->rows_cap) return FERRY_ERR_ARG; /* no forward pass of these rows */

    /* Head. */
    const float *dy = ws->logits;
    if (grad_weight(ws, grad + t_hw(p)->offset, ws->h[L - 1], dy, rows, H, V)) return FERRY_ERR_NOMEM;
    grad_bias(grad + t_hb(p)->offset, dy, rows, V);
    float *dh = ws->d0, *dspare = ws->d1;
    if (grad_input(ws, dh, dy, p->w + t_hw(p)->offset, rows, H, V)) return FERRY_ERR_NOMEM;

    /* Hidden layers, top down: dz = dh ⊙ (1 - h²). */
    for (uint32_t l = L; l-- > 0;) {
        const float *h = ws->h[l];
        for (size_t i = 0; i < rows * H; i++) dh[i] *= 1.0f - h[i] * h[i];
        const float *x = l ? ws->h[l - 1] : ws->x;
        size_t nin = l ? H : in0;
        if (grad_weight(ws, grad + t_w(p, l)->offset, x, dh, rows, nin, H)) return FERRY_ERR_NOMEM;
        grad_bias(grad + t_b(p, l)->offset, dh, rows, H);
        if (grad_input(ws, dspare, dh, p->w + t_w(p, l)->offset, rows, nin, H))
            return FERRY_ERR_NOMEM;
        float *tmp = dh;
        dh = dspare;
        dspare = tmp;
    }
    grad_embed_mix(p, ctx, len, rows, ws, dh, grad);
    return FERRY_OK;
}
