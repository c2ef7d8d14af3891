/*
 * sft.h — supervised warm-up: the "pre-trained" policy RL post-training
 * starts from.
 *
 * RL fine-tuning of an LLM starts from a model that already does the task
 * somewhat (pre-training, then supervised fine-tuning) and moves it with a
 * learning rate of 1e-6..1e-5.  Here the same split: a few dozen steps of
 * teacher-forced cross-entropy on the task's correct answers, at a
 * pre-training learning rate, give a policy that is right on some answer
 * positions and unsure on others; GRPO then improves it at a small rate.
 *
 * The loss over a step's P prompts (each with its answer y, T tokens) is
 *     L = -(1/(P·T)) Σ_prompts Σ_t log π(y_t | prompt ++ y_<t)
 * (what GRPO's loss is with advantage 1 on the correct completion).
 * Prompts come from their own stream (rl_rng domain RL_RNG_SFT, so a
 * warm-up never sees the RL run's prompts): a warm-up is a pure function of
 * (seed, task, network, settings).
 */
#ifndef RL_SFT_H
#define RL_SFT_H

#include <stdint.h>

#include "adamw.h"
#include "policy.h"
#include "task.h"

typedef struct rl_sft_config {
    uint32_t steps;     /* optimizer steps */
    uint32_t prompts;   /* prompts per step */
    rl_adamw_config adam;
} rl_sft_config;

/* Prompt i of warm-up step s: rl_task_prompt's digits from the stream
 * (seed, RL_RNG_SFT, s, i). */
void rl_sft_prompt(const rl_task *t, uint64_t seed, uint64_t step, uint64_t i, uint8_t *out);

/* Zeroes grad, then writes dL/dθ of warm-up step `step` (the mean
 * cross-entropy above over cfg->prompts prompts) into grad (p->nparams
 * floats) and the loss into *loss (may be NULL).  FERRY_ERR_ARG if the task
 * does not fit the policy, FERRY_ERR_NOMEM. */
int rl_sft_grad(const rl_policy *p, const rl_task *t, uint64_t seed, uint64_t step, uint32_t prompts,
                rl_work *ws, float *grad, double *loss);

/* Runs the whole warm-up on p->w in place (its own AdamW, freed at the
 * end).  Deterministic in (p->w, t, seed, cfg).  *loss_last (may be NULL)
 * gets the last step's loss.  FERRY_ERR_ARG, FERRY_ERR_NOMEM. */
int rl_sft_run(rl_policy *p, const rl_task *t, uint64_t seed, const rl_sft_config *cfg, double *loss_last);

#endif /* RL_SFT_H */
