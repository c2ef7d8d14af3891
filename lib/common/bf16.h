/* Bit-level BF16 helpers shared by codec, sync and loco. */
#ifndef FERRY_BF16_H
#define FERRY_BF16_H
#include <stdbool.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FERRY_HAVE_X86_SIMD 1
/* True when the CPU has AVX2 (and BMI2) and FERRY_NO_SIMD is not set: the
 * vectorised kernels (BF16 cast, codec scan and walk) may run.  Each
 * kernel must give exactly the bytes of its portable loop. */
bool ferry__cpu_avx2(void);
/* True when, in addition, the CPU has AVX-512 F/BW/VL (and BMI2) and
 * FERRY_NO_SIMD is neither set nor "avx512" (which keeps AVX2 but disables
 * AVX-512, so tests can compare all three levels). */
bool ferry__cpu_avx512(void);
#else
#define FERRY_HAVE_X86_SIMD 0
#endif

/* Round-to-nearest-even of FP32 bits to BF16 bits, NaN -> 0x7FC0
 * (PyTorch's c10::BFloat16 round_to_nearest_even). */
static inline uint16_t ferry__bf16_from_bits(uint32_t u)
{
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* Total-order key of a sign-magnitude float bit pattern of `bits` bits:
 * monotone in the float's value and a bijection on bit patterns, with
 * -0 and +0 adjacent.  Adjacent representable values differ by 1, so the
 * difference of keys counts units in the last place (ULPs). */
/* Branch-free (signs are random, a branch would mispredict half the
 * time): a negative u flips every bit, a positive one the sign bit. */
static inline __attribute__((always_inline)) uint64_t ferry__fkey(uint64_t u, unsigned bits)
{
    uint64_t sign = (uint64_t)1 << (bits - 1);
    uint64_t mask = bits == 64 ? ~(uint64_t)0 : (sign << 1) - 1;
    return u ^ (sign | ((0 - ((u >> (bits - 1)) & 1)) & mask));
}
static inline __attribute__((always_inline)) uint64_t ferry__fkey_inv(uint64_t k, unsigned bits)
{
    uint64_t sign = (uint64_t)1 << (bits - 1);
    uint64_t mask = bits == 64 ? ~(uint64_t)0 : (sign << 1) - 1;
    return (k ^ (sign | ((((k >> (bits - 1)) & 1) - 1) & mask))) & mask;
}
#endif
