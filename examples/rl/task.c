/* Digit puzzles with a verifiable reward (see task.h). */
#include <string.h>

#include "ferry.h"
#include "rng.h"
#include "task.h"

rl_task rl_task_default(void)
{
    return (rl_task){.kind = RL_TASK_REVERSE, .prompt_len = 6, .completion_len = 6};
}

int rl_task_check(const rl_task *t)
{
    if (!t || (unsigned)t->kind > RL_TASK_SORT) return FERRY_ERR_ARG;
    if (t->prompt_len < 1 || t->prompt_len > RL_TASK_MAX_LEN) return FERRY_ERR_ARG;
    if (t->completion_len != t->prompt_len) return FERRY_ERR_ARG;
    return FERRY_OK;
}

const char *rl_task_name(rl_task_kind k)
{
    switch (k) {
    case RL_TASK_REVERSE: return "reverse";
    case RL_TASK_COPY: return "copy";
    case RL_TASK_SORT: return "sort";
    }
    return NULL;
}

int rl_task_parse(const char *name, rl_task_kind *out)
{
    for (int k = RL_TASK_REVERSE; k <= RL_TASK_SORT; k++)
        if (!strcmp(name, rl_task_name((rl_task_kind)k))) {
            *out = (rl_task_kind)k;
            return 0;
        }
    return -1;
}

void rl_task_prompt(const rl_task *t, uint64_t seed, uint64_t step, uint64_t prompt_index,
                    uint8_t *out)
{
    rl_rng r = rl_rng_stream(seed, RL_RNG_PROMPT, step, prompt_index, 0);
    for (uint32_t i = 0; i < t->prompt_len; i++)
        out[i] = (uint8_t)(RL_TOK_DIGIT0 + rl_rng_below(&r, 10));
}

void rl_task_answer(const rl_task *t, const uint8_t *prompt, uint8_t *out)
{
    uint32_t n = t->prompt_len;
    switch (t->kind) {
    case RL_TASK_REVERSE:
        for (uint32_t i = 0; i < n; i++) out[i] = prompt[n - 1 - i];
        break;
    case RL_TASK_COPY:
        memcpy(out, prompt, n);
        break;
    case RL_TASK_SORT: {
        /* Counting sort over all 256 byte values: a prompt read back from a
         * store may hold anything, and the answer must still be defined. */
        uint32_t count[256] = {0};
        for (uint32_t i = 0; i < n; i++) count[prompt[i]]++;
        uint32_t k = 0;
        for (uint32_t v = 0; v < 256; v++)
            for (uint32_t c = 0; c < count[v]; c++) out[k++] = (uint8_t)v;
        break;
    }
    }
}

float rl_task_reward(const rl_task *t, const uint8_t *prompt, const uint8_t *completion)
{
    uint8_t want[RL_TASK_MAX_LEN];
    rl_task_answer(t, prompt, want);
    uint32_t hit = 0;
    for (uint32_t i = 0; i < t->completion_len; i++) hit += completion[i] == want[i];
    return (float)hit / (float)t->completion_len;
}
