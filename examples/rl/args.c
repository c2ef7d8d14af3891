#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

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
