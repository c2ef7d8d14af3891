/*
 * grpo.h — group-relative policy gradient (GRPO without KL and clipping).
 *
 * For each prompt, its G completions form a group.  Advantage of completion
 * j:  A_j = (r_j - mean(r)) / (std(r) + eps), std with Bessel's correction
 * (G - 1, as torch.std and TRL), eps = RL_GRPO_EPS; a group of one, or whose
 * rewards are all equal, has A = 0 and teaches nothing.  The loss over N
 * completions is
 *     L = -(1/N) Σ_j A_j · Σ_t log π(y_jt | context_jt)
 * with log-probabilities recomputed by the trainer with its FP32 masters
 * (the islands sampled with the BF16 weights; the ratio between the two
 * is ignored, as on-policy GRPO does).  dL/dlogits = (A_j/N)(softmax − onehot).
 *
 * Completions with A = 0 contribute nothing, so they are not even run
 * through the network (the saving grows as groups saturate).
 */
#ifndef RL_GRPO_H
#define RL_GRPO_H

#include <stdint.h>

#include "policy.h"
#include "traj.h"

#define RL_GRPO_EPS 1e-4f

typedef struct rl_grpo_stats {
    double loss;            /* Σ of the batch's loss terms (already scaled) */
    double reward_sum;      /* Σ rewards */
    uint64_t completions;   /* completions seen */
    uint64_t active;        /* completions with A != 0 (run through the network) */
    uint64_t flat_groups;   /* groups whose advantages are all 0 */
} rl_grpo_stats;

/* Advantages of groups × group_size rewards (group-major), into adv. */
void rl_grpo_advantages(const float *rewards, uint32_t groups, uint32_t group_size, float eps,
                        float *adv);

/* ADDS scale · dL'/dθ to grad, where L' = -Σ_j A_j Σ_t log π(y_jt) over
 * the batch's completions, and adds scale · L' and the counts to *st
 * (st may be NULL).  Use scale = 1/N for the mean over N completions (of
 * one batch or of several the trainer consumes together).  FERRY_ERR_ARG if
 * the batch does not fit the policy (vocab, window, a token out of range)
 * or holds a non-finite reward; FERRY_ERR_NOMEM. */
int rl_grpo_accumulate(const rl_policy *p, const rl_batch *b, double scale, rl_work *ws,
                       float *grad, rl_grpo_stats *st);

/* One batch, mean loss: zeroes grad and *st, then accumulates with
 * scale 1/(n_prompts · group). */
int rl_grpo_grad(const rl_policy *p, const rl_batch *b, rl_work *ws, float *grad,
                 rl_grpo_stats *st);

#endif /* RL_GRPO_H */
