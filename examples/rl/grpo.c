/* GRPO advantages, loss and gradient (see grpo.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grpo.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* see gemm.c */
#endif

/* Rows (completion tokens) per forward/backward chunk: bounds the scratch
 * memory whatever the batch size, and keeps activations cache-sized. */
#define CHUNK_ROWS 512

void rl_grpo_advantages(const float *rewards, uint32_t groups, uint32_t g, float eps, float *adv)
{
    for (uint32_t i = 0; i < groups; i++) {
        const float *r = rewards + (size_t)i * g;
        float *a = adv + (size_t)i * g;
        double mean = 0, var = 0;
        for (uint32_t j = 0; j < g; j++) mean += r[j];
        mean /= g;
        for (uint32_t j = 0; j < g; j++) var += (r[j] - mean) * (r[j] - mean);
        double sd = g > 1 ? sqrt(var / (g - 1)) : 0.0;
        for (uint32_t j = 0; j < g; j++)
            a[j] = (g > 1 && var > 0) ? (float)((r[j] - mean) / (sd + eps)) : 0.0f;
    }
}

int rl_grpo_accumulate(const rl_policy *p, const rl_batch *b, double scale, rl_work *ws,
                       float *grad, rl_grpo_stats *st)
{
    uint32_t K = b->prompt_len, T = b->completion_len, G = b->group;
    size_t W = p->cfg.window, V = p->cfg.vocab;
    size_t n = (size_t)b->n_prompts * G;
    if (b->vocab > V || (uint64_t)K + T - 1 > W) return FERRY_ERR_ARG;
    /* Tokens index the logits: a batch built by hand (not parsed) must
     * still be in range. */
    for (size_t i = 0; i < (size_t)b->n_prompts * K; i++)
        if (b->prompts[i] >= V) return FERRY_ERR_ARG;
    for (size_t i = 0; i < n * T; i++)
        if (b->completions[i] >= V) return FERRY_ERR_ARG;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(b->rewards[i])) return FERRY_ERR_ARG;

    float *adv = malloc(n * sizeof *adv);
    size_t *act = malloc(n * sizeof *act); /* completions with A != 0 */
    size_t chunk_seqs = CHUNK_ROWS / T ? CHUNK_ROWS / T : 1;
    uint8_t *ctx = malloc(chunk_seqs * T * W);
    uint32_t *len = malloc(chunk_seqs * T * sizeof *len);
    int rc = FERRY_OK;
    if (!adv || !act || !ctx || !len) {
        rc = FERRY_ERR_NOMEM;
        goto done;
    }
    rl_grpo_advantages(b->rewards, b->n_prompts, G, RL_GRPO_EPS, adv);
    size_t nact = 0;
    for (size_t k = 0; k < n; k++)
        if (adv[k] != 0.0f) act[nact++] = k;
    if (st) {
        st->completions += n;
        st->active += nact;
        for (uint32_t i = 0; i < b->n_prompts; i++) {
            int flat = 1;
            for (uint32_t j = 0; j < G; j++) flat &= adv[(size_t)i * G + j] == 0.0f;
            st->flat_groups += flat;
        }
        for (size_t k = 0; k < n; k++) st->reward_sum += b->rewards[k];
    }

    double loss = 0;
    for (size_t c0 = 0; c0 < nact; c0 += chunk_seqs) {
        size_t cn = nact - c0 < chunk_seqs ? nact - c0 : chunk_seqs;
        /* Row (c, t): completion act[c0 + c] predicting its token t. */
        for (size_t c = 0; c < cn; c++) {
            size_t k = act[c0 + c];
            const uint8_t *prompt = b->prompts + (k / G) * K;
            const uint8_t *comp = b->completions + k * T;
            for (uint32_t t = 0; t < T; t++)
                rl_policy_context(p, prompt, K, comp, t, ctx + (c * T + t) * W,
                                  len + c * T + t);
        }
        size_t rows = cn * T;
        if ((rc = rl_forward(p, ctx, len, rows, ws))) goto done;
        /* logits -> dlogits in place.  A completion's term is
         * −scale·A·Σ_t log π(y_t), so dL/dlogit_v = scale·A·(p_v − [v = y]). */
        for (size_t c = 0; c < cn; c++) {
            size_t k = act[c0 + c];
            double coef = scale * adv[k];
            for (uint32_t t = 0; t < T; t++) {
                float *l = ws->logits + (c * T + t) * V;
                uint8_t y = b->completions[k * T + t];
                double mx = l[0], sum = 0;
                for (size_t v = 1; v < V; v++)
                    if (l[v] > mx) mx = l[v];
                for (size_t v = 0; v < V; v++) sum += exp((double)l[v] - mx);
                double lse = mx + log(sum);
                loss -= coef * ((double)l[y] - lse);
                for (size_t v = 0; v < V; v++)
                    l[v] = (float)(coef * exp((double)l[v] - lse));
                l[y] -= (float)coef;
            }
        }
        if ((rc = rl_backward(p, ctx, len, rows, ws, grad))) goto done;
    }
    if (st) st->loss += loss;
done:
    free(adv);
    free(act);
    free(ctx);
    free(len);
    return rc;
}

int rl_grpo_grad(const rl_policy *p, const rl_batch *b, rl_work *ws, float *grad,
                 rl_grpo_stats *st)
{
    memset(grad, 0, p->nparams * sizeof *grad);
    if (st) memset(st, 0, sizeof *st);
    size_t n = (size_t)b->n_prompts * b->group;
    return rl_grpo_accumulate(p, b, n ? 1.0 / (double)n : 0.0, ws, grad, st);
}
