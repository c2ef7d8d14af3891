/*
 * task.h — the reference workload's task: digit puzzles with a verifiable
 * reward.
 *
 * A prompt is prompt_len random digits; the completion is exactly
 * answer-length tokens (completion_len == prompt_len, no end token: fixed
 * length keeps the policy's context layout static).  The answer is a pure
 * function of the prompt, so any party — island or trainer — can check a
 * reward without trusting whoever computed it.
 *
 *   RL_TASK_REVERSE  the prompt's digits in reverse order (the default:
 *                    learnable within a couple of minutes, and not linear in
 *                    the context, so the hidden layers have work to do)
 *   RL_TASK_COPY     the prompt's digits as they are (easiest)
 *   RL_TASK_SORT     the prompt's digits in ascending order (hardest)
 *
 * Reward: the fraction of answer positions whose token is right, in [0, 1]
 * (partial credit per token; 1 is an exact answer).  A uniform policy over
 * a vocabulary of V tokens scores 1/V on average.
 *
 * Tokens: 0 is PAD (an empty context slot), 1..10 are the digits 0..9, and
 * tokens above 10 are never correct — they exist so that a policy has wrong
 * answers to unlearn, as an LLM must unlearn most of its vocabulary.
 */
#ifndef RL_TASK_H
#define RL_TASK_H

#include <stdint.h>

#define RL_TOK_PAD 0u
#define RL_TOK_DIGIT0 1u          /* token of digit d is RL_TOK_DIGIT0 + d */
#define RL_TASK_MIN_VOCAB 11u     /* PAD + ten digits */
#define RL_TASK_MAX_LEN 64u       /* bound on prompt_len (and completion_len) */

typedef enum rl_task_kind { RL_TASK_REVERSE = 0, RL_TASK_COPY = 1, RL_TASK_SORT = 2 } rl_task_kind;

typedef struct rl_task {
    rl_task_kind kind;
    uint32_t prompt_len;     /* digits per prompt, 1..RL_TASK_MAX_LEN */
    uint32_t completion_len; /* tokens per completion; must equal prompt_len */
} rl_task;

/* The default task: reverse 6 digits. */
rl_task rl_task_default(void);

/* 0 if the task is well-formed, else FERRY_ERR_ARG. */
int rl_task_check(const rl_task *t);

/* "reverse" / "copy" / "sort"; NULL for an unknown kind. */
const char *rl_task_name(rl_task_kind k);
/* Parses a name from rl_task_name; -1 if unknown. */
int rl_task_parse(const char *name, rl_task_kind *out);

/* Prompt of (seed, step, prompt_index): prompt_len digit tokens into out.
 * A pure function of its arguments (see rng.h). */
void rl_task_prompt(const rl_task *t, uint64_t seed, uint64_t step, uint64_t prompt_index,
                    uint8_t *out);

/* The correct completion for a prompt (completion_len tokens into out). */
void rl_task_answer(const rl_task *t, const uint8_t *prompt, uint8_t *out);

/* Reward of a completion, in [0, 1]: correct positions / completion_len.
 * Safe on any token values (a token that is not the answer scores 0). */
float rl_task_reward(const rl_task *t, const uint8_t *prompt, const uint8_t *completion);

#endif /* RL_TASK_H */
