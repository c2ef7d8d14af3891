/* Strict number parsing for the command lines of the RL drivers
 * (rl_train, loco_train): the whole string must be a number in range.
 * Each returns 0, or -1 for malformed or out-of-range input. */
#ifndef RL_ARGS_H
#define RL_ARGS_H
#include <stdint.h>
#include "adamw.h"
#include "policy.h"
#include "task.h"

int rl_arg_u64(const char *s, uint64_t *out);   /* no sign allowed */
int rl_arg_int(const char *s, int lo, int hi, int *out);
int rl_arg_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out);
int rl_arg_float(const char *s, float *out);    /* finite only */

/* The options both drivers share (--task --digits, the network's --vocab
 * --embed --heads --dim --layers, the inner AdamW's --lr --beta1 --beta2
 * --eps --wd) with value v: 1 if a is one of them (*bad = 1 when v is
 * invalid), else 0. */
int rl_arg_common(const char *a, const char *v, rl_task *task, rl_policy_config *net, rl_adamw_config *adam, int *bad);
#endif
