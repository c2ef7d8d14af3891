/*
 * rollout.h — sampling completions: what an island does with its weights.
 *
 * An island holds BF16 weights (a ferry_model patched version by version);
 * it computes in FP32 with their exact values: rl_policy_set_bf16 (or
 * rl_policy_load of the BF16 model) into an rl_policy, then rl_rollout.
 *
 * Reproducibility: the prompt i of a rollout is rl_task_prompt(seed, step,
 * first_prompt + i) and completion j of it is drawn token by token (softmax
 * at temperature 1, inverse CDF in double precision) from the stream
 * rl_rng_stream(seed, RL_RNG_SAMPLE, step, first_prompt + i, j), one uniform
 * per token.  With the same weights, a completion is thus a pure function
 * of (seed, step, prompt index, sample index): the same whichever island
 * draws it and however prompts are split into calls (gemm.h: rows do not
 * interact).  Two runs whose islands hold bit-identical BF16 weights —
 * synced by ferry patches or by full checkpoints — draw identical batches.
 */
#ifndef RL_ROLLOUT_H
#define RL_ROLLOUT_H

#include <stdint.h>

#include "policy.h"
#include "task.h"
#include "traj.h"

typedef struct rl_rollout_args {
    uint64_t seed;          /* run seed */
    uint64_t step;          /* rollout step (the PRNG coordinate) */
    uint64_t version;       /* policy version of the weights, copied into the batch */
    uint32_t first_prompt;  /* index of the first prompt of this call */
    uint32_t n_prompts;     /* prompts in this call */
    uint32_t group;         /* completions per prompt (GRPO's G) */
} rl_rollout_args;

/* Samples a batch (allocated into *out; rl_batch_release it) with the
 * weights in p->w and fills its rewards from the task.  FERRY_ERR_ARG if
 * the task does not fit the policy (window < prompt_len + completion_len - 1,
 * vocab < RL_TASK_MIN_VOCAB), FERRY_ERR_LIMIT past the batch bounds,
 * FERRY_ERR_NOMEM. */
int rl_rollout(const rl_policy *p, const rl_task *t, const rl_rollout_args *a, rl_work *ws,
               rl_batch *out);

/* The task fits the policy: 0 or FERRY_ERR_ARG. */
int rl_task_fits(const rl_policy *p, const rl_task *t);

#endif /* RL_ROLLOUT_H */
