/*
 * adamw.h — AdamW on the FP32 masters, PyTorch's torch.optim.AdamW
 * semantics (decoupled weight decay, bias-corrected moments):
 *     θ ← θ·(1 − lr·wd)
 *     m ← β1·m + (1−β1)·g          v ← β2·v + (1−β2)·g²
 *     θ ← θ − (lr / (1−β1^t)) · m / (√v / √(1−β2^t) + ε)
 *
 * Learning rate.  RL fine-tunes of LLMs use 1e-6..1e-5 (DESIGN.md); this
 * network is a thousand times smaller and starts from scratch, so it needs
 * more.  RL_ADAMW_DEFAULT_LR = 2e-4 takes the default task from chance
 * (0.04) past 0.5 mean reward in ~150 steps and to ~0.9 by step 220
 * (curves in rl_train.c).  The price is a higher BF16 change rate than an
 * LLM fine-tune shows (~40% of words per step against ~1%): Adam moves each
 * weight by ~lr per step and the BF16 cell at |w| ≈ 0.04 is ~2.4e-4 wide.
 * Lower --lr trades learning speed for smaller patches (1e-4: ~28% changed,
 * patches 7.7% of full, reward 0.5 near step 270).
 */
#ifndef RL_ADAMW_H
#define RL_ADAMW_H

#include <stddef.h>
#include <stdint.h>

#define RL_ADAMW_DEFAULT_LR 2e-4f

typedef struct rl_adamw_config {
    float lr;            /* default RL_ADAMW_DEFAULT_LR */
    float beta1, beta2;  /* 0.9, 0.999 */
    float eps;           /* 1e-8 */
    float weight_decay;  /* decoupled; default 0 */
} rl_adamw_config;

rl_adamw_config rl_adamw_config_default(void);

typedef struct rl_adamw {
    rl_adamw_config cfg;
    size_t n;
    uint64_t t;   /* steps taken */
    float *m, *v; /* n each, zero at start */
} rl_adamw;

/* Zeroed moments for n parameters.  FERRY_ERR_ARG (bad config: lr < 0,
 * betas outside [0, 1), eps <= 0, wd < 0), FERRY_ERR_NOMEM. */
int rl_adamw_init(rl_adamw *o, size_t n, const rl_adamw_config *cfg);
void rl_adamw_release(rl_adamw *o);

/* One step: params (n floats) updated in place from grad (n floats). */
void rl_adamw_step(rl_adamw *o, float *params, const float *grad);

#endif /* RL_ADAMW_H */
