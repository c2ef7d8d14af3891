/* FP32 -> BF16 exactly as PyTorch casts: round to nearest even on the FP32
 * bits; every NaN becomes the canonical quiet NaN 0x7FC0. */
#include "common.h"
#include "bf16.h"

uint16_t ferry_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return ferry__bf16_from_bits(u);
}

float ferry_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void ferry_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n)
{
    /* memcpy per element keeps it strict-aliasing clean; compilers vectorise
     * this loop (the NaN select becomes a blend). */
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, src + i, 4);
        dst[i] = ferry__bf16_from_bits(u);
    }
}
