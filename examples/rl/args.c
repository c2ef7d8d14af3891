#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int rl_arg_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-') return -1;
    *out = v;
    return 0;
}

int rl_arg_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

int rl_arg_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    int v;
    if (rl_arg_int(s, (int)lo, (int)hi, &v)) return -1;
    *out = (uint32_t)v;
    return 0;
}

int rl_arg_float(const char *s, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return -1;
    *out = (float)v;
    return 0;
}

int rl_arg_common(const char *a, const char *v, rl_task *task, rl_policy_config *net, rl_adamw_config *adam, int *bad)
{
    if (!strcmp(a, "--task")) *bad = rl_task_parse(v, &task->kind);
    else if (!strcmp(a, "--digits")) {
        *bad = rl_arg_u32(v, 1, RL_TASK_MAX_LEN, &task->prompt_len);
        task->completion_len = task->prompt_len;
    }
    else if (!strcmp(a, "--vocab")) *bad = rl_arg_u32(v, RL_TASK_MIN_VOCAB, RL_MAX_VOCAB, &net->vocab);
    else if (!strcmp(a, "--embed")) *bad = rl_arg_u32(v, 1, 65536, &net->embed);
    else if (!strcmp(a, "--heads")) *bad = rl_arg_u32(v, 1, RL_MAX_HEADS, &net->heads);
    else if (!strcmp(a, "--dim")) *bad = rl_arg_u32(v, 1, 65536, &net->hidden);
    else if (!strcmp(a, "--layers")) *bad = rl_arg_u32(v, 1, RL_MAX_LAYERS, &net->layers);
    else if (!strcmp(a, "--lr")) *bad = rl_arg_float(v, &adam->lr);
    else if (!strcmp(a, "--beta1")) *bad = rl_arg_float(v, &adam->beta1);
    else if (!strcmp(a, "--beta2")) *bad = rl_arg_float(v, &adam->beta2);
    else if (!strcmp(a, "--eps")) *bad = rl_arg_float(v, &adam->eps);
    else if (!strcmp(a, "--wd")) *bad = rl_arg_float(v, &adam->weight_decay);
    else return 0;
    return 1;
}
