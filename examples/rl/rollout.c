/* Sampling completions from a policy (see rollout.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "rollout.h"

/* Rows (completions) sampled together. */
#define ROLLOUT_CHUNK 1024

int rl_task_fits(const rl_policy *p, const rl_task *t)
{
    if (rl_task_check(t)) return FERRY_ERR_ARG;
    if (p->cfg.vocab < RL_TASK_MIN_VOCAB) return FERRY_ERR_ARG;
    if ((uint64_t)t->prompt_len + t->completion_len - 1 > p->cfg.window) return FERRY_ERR_ARG;
    return FERRY_OK;
}

/* Draws a token from softmax(logits) with one uniform u in [0, 1).
 * Double precision and a fixed summation order make the draw a function of
 * the logits' bits and u only. */
static uint8_t draw(const float *logits, uint32_t v, double u)
{
    double mx = logits[0];
    for (uint32_t i = 1; i < v; i++)
        if (logits[i] > mx) mx = logits[i];
    double e[RL_MAX_VOCAB], sum = 0;
    for (uint32_t i = 0; i < v; i++) sum += e[i] = exp((double)logits[i] - mx);
    double target = u * sum, acc = 0;
    for (uint32_t i = 0; i < v; i++) {
        acc += e[i];
        if (target < acc) return (uint8_t)i;
    }
    return (uint8_t)(v - 1); /* u·sum rounded up to sum */
}

int rl_rollout(const rl_policy *p, const rl_task *t, const rl_rollout_args *a, rl_work *ws,
               rl_batch *out)
{
    memset(out, 0, sizeof *out);
    if (rl_task_fits(p, t)) return FERRY_ERR_ARG;
    if (a->n_prompts && (uint64_t)a->first_prompt + a->n_prompts - 1 > UINT32_MAX)
        return FERRY_ERR_ARG;
    int rc = rl_batch_alloc(out, a->n_prompts, a->group, t->prompt_len, t->completion_len,
                            p->cfg.vocab);
    if (rc) return rc;
    out->version = a->version;
    out->seed = a->seed;
    out->step = a->step;
    out->first_prompt = a->first_prompt;

    size_t rows = (size_t)a->n_prompts * a->group, W = p->cfg.window, V = p->cfg.vocab;
    uint32_t K = t->prompt_len, T = t->completion_len;
    size_t crows = rows < ROLLOUT_CHUNK ? rows : ROLLOUT_CHUNK;
    uint8_t *ctx = malloc(crows * W);
    uint32_t *len = malloc(crows * sizeof *len);
    rl_rng *rng = malloc(rows * sizeof *rng);
    if (!ctx || !len || !rng) {
        rc = FERRY_ERR_NOMEM;
        goto done;
    }
    for (uint32_t i = 0; i < a->n_prompts; i++) {
        uint8_t *prompt = out->prompts + (size_t)i * K;
        rl_task_prompt(t, a->seed, a->step, (uint64_t)a->first_prompt + i, prompt);
        for (uint32_t j = 0; j < a->group; j++)
            rng[(size_t)i * a->group + j] =
                rl_rng_stream(a->seed, RL_RNG_SAMPLE, a->step, (uint64_t)a->first_prompt + i, j);
    }
    /* The rows of a chunk advance together, one token per forward pass.
     * (The whole context is recomputed each time: with a window of a dozen
     * slots that is cheaper than caching anything.)  Chunks bound the
     * scratch memory; rows do not interact, so they change no result. */
    for (size_t r0 = 0; r0 < rows; r0 += ROLLOUT_CHUNK) {
        size_t rn = rows - r0 < ROLLOUT_CHUNK ? rows - r0 : ROLLOUT_CHUNK;
        for (uint32_t pos = 0; pos < T; pos++) {
            for (size_t r = r0; r < r0 + rn; r++)
                rl_policy_context(p, out->prompts + (r / a->group) * K, K,
                                  out->completions + r * T, pos, ctx + (r - r0) * W,
                                  len + (r - r0));
            if ((rc = rl_forward(p, ctx, len, rn, ws))) goto done;
            for (size_t r = r0; r < r0 + rn; r++)
                out->completions[r * T + pos] =
                    draw(ws->logits + (r - r0) * V, (uint32_t)V, rl_rng_uniform(&rng[r]));
        }
    }
    for (size_t r = 0; r < rows; r++)
        out->rewards[r] = rl_task_reward(t, out->prompts + (r / a->group) * K,
                                         out->completions + r * T);
done:
    free(ctx);
    free(len);
    free(rng);
    if (rc) rl_batch_release(out);
    return rc;
}
