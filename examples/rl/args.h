/* Strict number parsing for the command lines of the RL drivers
 * (rl_train, loco_train): the whole string must be a number in range.
 * Each returns 0, or -1 for malformed or out-of-range input. */
#ifndef RL_ARGS_H
#define RL_ARGS_H
#include <stdint.h>

int rl_arg_u64(const char *s, uint64_t *out);   /* no sign allowed */
int rl_arg_int(const char *s, int lo, int hi, int *out);
int rl_arg_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out);
int rl_arg_float(const char *s, float *out);    /* finite only */
#endif
