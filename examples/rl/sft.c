/* Supervised warm-up (see sft.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "rollout.h"
#include "sft.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* see gemm.c */
#endif

/* Prompts per forward/backward chunk (bounds the scratch memory). */
#define CHUNK_PROMPTS 64

void rl_sft_prompt(const rl_task *t, uint64_t seed, uint64_t step, uint64_t i, uint8_t *out)
{
    rl_rng r = rl_rng_stream(seed, RL_RNG_SFT, step, i, 0);
    for (uint32_t k = 0; k < t->prompt_len; k++) out[k] = (uint8_t)(RL_TOK_DIGIT0 + rl_rng_below(&r, 10));
}

int rl_sft_grad(const rl_policy *p, const rl_task *t, uint64_t seed, uint64_t step, uint32_t prompts,
                rl_work *ws, float *grad, double *loss)
{
    if (rl_task_check(t) || rl_task_fits(p, t) || !prompts) return FERRY_ERR_ARG;
    uint32_t K = t->prompt_len, T = t->completion_len;
    size_t W = p->cfg.window, V = p->cfg.vocab;
    memset(grad, 0, p->nparams * sizeof *grad);
    uint8_t *ctx = malloc((size_t)CHUNK_PROMPTS * T * W);
    uint32_t *len = malloc((size_t)CHUNK_PROMPTS * T * sizeof *len);
    uint8_t *ys = malloc((size_t)CHUNK_PROMPTS * T);
    int rc = FERRY_OK;
    if (!ctx || !len || !ys) {
        rc = FERRY_ERR_NOMEM;
        goto done;
    }
    double coef = 1.0 / ((double)prompts * T), total = 0;
    for (uint32_t c0 = 0; c0 < prompts; c0 += CHUNK_PROMPTS) {
        uint32_t cn = prompts - c0 < CHUNK_PROMPTS ? prompts - c0 : CHUNK_PROMPTS;
        for (uint32_t c = 0; c < cn; c++) {
            uint8_t prompt[RL_TASK_MAX_LEN];
            rl_sft_prompt(t, seed, step, c0 + c, prompt);
            rl_task_answer(t, prompt, ys + (size_t)c * T);
            for (uint32_t k = 0; k < T; k++)
                rl_policy_context(p, prompt, K, ys + (size_t)c * T, k, ctx + ((size_t)c * T + k) * W,
                                  len + (size_t)c * T + k);
        }
        size_t rows = (size_t)cn * T;
        if ((rc = rl_forward(p, ctx, len, rows, ws))) goto done;
        /* logits -> dL/dlogits = coef·(softmax − onehot(y)) in place */
        for (size_t r = 0; r < rows; r++) {
            float *l = ws->logits + r * V;
            uint8_t y = ys[r];
            double mx = l[0], sum = 0;
            for (size_t v = 1; v < V; v++)
                if (l[v] > mx) mx = l[v];
            for (size_t v = 0; v < V; v++) sum += exp((double)l[v] - mx);
            double lse = mx + log(sum);
            total -= coef * ((double)l[y] - lse);
            for (size_t v = 0; v < V; v++) l[v] = (float)(coef * exp((double)l[v] - lse));
            l[y] -= (float)coef;
        }
        if ((rc = rl_backward(p, ctx, len, rows, ws, grad))) goto done;
    }
    if (loss) *loss = total;
done:
    free(ctx);
    free(len);
    free(ys);
    return rc;
}

int rl_sft_run(rl_policy *p, const rl_task *t, uint64_t seed, const rl_sft_config *cfg, double *loss_last)
{
    rl_adamw adam;
    rl_work ws;
    memset(&ws, 0, sizeof ws);
    int rc = rl_adamw_init(&adam, p->nparams, &cfg->adam);
    if (rc) return rc;
    float *grad = malloc(p->nparams * sizeof *grad);
    if (!grad) rc = FERRY_ERR_NOMEM;
    double loss = 0;
    for (uint32_t s = 0; !rc && s < cfg->steps; s++) {
        if (!(rc = rl_sft_grad(p, t, seed, s, cfg->prompts, &ws, grad, &loss))) rl_adamw_step(&adam, p->w, grad);
    }
    if (!rc && loss_last) *loss_last = loss;
    free(grad);
    rl_work_release(&ws);
    rl_adamw_release(&adam);
    return rc;
}
