/* The outer optimizer and the weight hash ranks compare. */
#include "xxh.h"

#include "loco.h"

ferry_loco_outer ferry_loco_outer_default(void)
{
    /* DiLoCo's published outer settings (Douillard et al., 2023). */
    return (ferry_loco_outer){.lr = 0.7f, .momentum = 0.9f, .nesterov = 1};
}

/* PyTorch's SGD (momentum, dampening 0): its first step sets buf = grad,
 * which is what μ·0 + grad gives too.  One operation per statement and no
 * FMA-prone expression shapes beyond what every rank runs alike.  Returns
 * η·d, the step the weight takes. */
static inline float outer_delta(const ferry_loco_outer *cfg, float *buf, float g)
{
    const float mu = cfg->momentum;
    float b = mu * *buf + g;
    *buf = b;
    float d = cfg->nesterov ? g + mu * b : b;
    return cfg->lr * d;
}

void ferry_loco_outer_step(const ferry_loco_outer *cfg, float *w, float *buf, const float *grad,
                           uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) w[i] = w[i] - outer_delta(cfg, &buf[i], grad[i]);
}

void ferry_loco_outer_update(const ferry_loco_outer *cfg, float *buf, const float *grad, float *upd,
                             uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) upd[i] = outer_delta(cfg, &buf[i], grad[i]);
}

void ferry_loco_hash(const float *w, uint64_t n, uint8_t out[16])
{
    XXH128_hash_t h = XXH3_128bits(w, (size_t)n * sizeof *w);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(out, c.digest, 16);
}
