/* AdamW (see adamw.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adamw.h"
#include "ferry.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* see gemm.c */
#endif

rl_adamw_config rl_adamw_config_default(void)
{
    return (rl_adamw_config){.lr = RL_ADAMW_DEFAULT_LR, .beta1 = 0.9f, .beta2 = 0.999f,
                             .eps = 1e-8f, .weight_decay = 0.0f};
}

int rl_adamw_init(rl_adamw *o, size_t n, const rl_adamw_config *cfg)
{
    memset(o, 0, sizeof *o);
    if (!cfg || !(cfg->lr >= 0) || !(cfg->beta1 >= 0 && cfg->beta1 < 1) ||
        !(cfg->beta2 >= 0 && cfg->beta2 < 1) || !(cfg->eps > 0) || !(cfg->weight_decay >= 0))
        return FERRY_ERR_ARG;
    o->m = calloc(n ? n : 1, sizeof *o->m);
    o->v = calloc(n ? n : 1, sizeof *o->v);
    if (!o->m || !o->v) {
        rl_adamw_release(o);
        return FERRY_ERR_NOMEM;
    }
    o->cfg = *cfg;
    o->n = n;
    return FERRY_OK;
}

void rl_adamw_release(rl_adamw *o)
{
    if (!o) return;
    free(o->m);
    free(o->v);
    memset(o, 0, sizeof *o);
}

void rl_adamw_step(rl_adamw *o, float *restrict params, const float *restrict grad)
{
    o->t++;
    const rl_adamw_config *c = &o->cfg;
    /* Scalars in double, then rounded once, as PyTorch's foreach path does
     * with its Python-float step sizes. */
    double bc1 = 1.0 - pow(c->beta1, (double)o->t);
    double bc2 = 1.0 - pow(c->beta2, (double)o->t);
    float step = (float)(c->lr / bc1);
    float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    float decay = (float)(1.0 - (double)c->lr * c->weight_decay);
    float b1 = c->beta1, b2 = c->beta2, a1 = 1.0f - b1, a2 = 1.0f - b2, eps = c->eps;
    float *restrict m = o->m, *restrict v = o->v;
    for (size_t i = 0; i < o->n; i++) {
        float g = grad[i];
        float p = params[i] * decay;
        m[i] = b1 * m[i] + a1 * g;
        v[i] = b2 * v[i] + a2 * g * g;
        float denom = sqrtf(v[i]) * inv_sqrt_bc2 + eps;
        params[i] = p - step * (m[i] / denom);
    }
}
