/* The cell code of PULSELoCo values (ferry_loco.h, "VALUE CODING"): a sent
 * value is an integer multiple k of the BF16 cell of the global weight it
 * updates, so that a payload carries k (a small integer, almost always ±1)
 * instead of 32 bits, and the receiver, which holds the same global
 * weights, rebuilds the exact FP32 value.  (Half a cell as the unit was
 * tried first: about 15% more bytes per entry, k spread over ±1..±3.) */
#include <math.h>

#include "loco.h"

int ferry__loco_cell_exp(float base)
{
    uint32_t u;
    memcpy(&u, &base, 4);
    /* biased exponent 0 (zero, subnormal) and tiny weights share the floor:
     * their BF16 cell is far below any update worth sending */
    int e = (int)((u >> 23) & 0xFFu) - 127;
    if (e < FERRY_LOCO_CELL_EMIN) e = FERRY_LOCO_CELL_EMIN;
    return e - 7; /* BF16 keeps 7 mantissa bits: its cell is 2^(e-7) */
}

float ferry__loco_cell_value(int64_t k, float base)
{
    /* |k| < 2^24 and a power-of-two unit: exact in double and, when it
     * does not overflow, in float */
    return (float)ldexp((double)k, ferry__loco_cell_exp(base));
}

int64_t ferry__loco_cell_quantize(float s, float base)
{
    double x = nearbyint(ldexp((double)s, -ferry__loco_cell_exp(base)));
    if (!(x == x)) return 0; /* NaN: the caller's finiteness check reports it */
    if (x > FERRY_LOCO_CELL_KMAX) x = FERRY_LOCO_CELL_KMAX;
    if (x < -FERRY_LOCO_CELL_KMAX) x = -FERRY_LOCO_CELL_KMAX;
    return (int64_t)x;
}

int ferry__loco_cell_of(float v, float base, int64_t *k)
{
    double x = ldexp((double)v, -ferry__loco_cell_exp(base));
    if (!(fabs(x) >= 1 && fabs(x) <= FERRY_LOCO_CELL_KMAX) || x != floor(x)) return 0;
    *k = (int64_t)x;
    return 1;
}
