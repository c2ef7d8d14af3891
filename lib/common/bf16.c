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

static void cast_portable(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, src + i, 4); /* strict-aliasing clean */
        dst[i] = ferry__bf16_from_bits(u);
    }
}

#if FERRY_HAVE_X86_SIMD
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

/* read per call (cheap next to a chunk's work), so that a test can switch
 * the kernels off and compare: FERRY_NO_SIMD=1 disables every kernel,
 * FERRY_NO_SIMD=avx512 only the AVX-512 ones */
static int simd_off(void)
{
    const char *off = getenv("FERRY_NO_SIMD");
    if (!off || !*off || !strcmp(off, "0")) return 0;
    return strcmp(off, "avx512") ? 2 : 1;
}

bool ferry__cpu_avx2(void)
{
    return simd_off() < 2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
}

bool ferry__cpu_avx512(void)
{
    return simd_off() == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") &&
           __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

/* 16 floats per step, the same arithmetic as ferry__bf16_from_bits: round
 * to nearest even on the bits, NaN to 0x7FC0 (the FP32 gate casts every
 * master weight: the scalar loop was most of its time). */
__attribute__((target("avx2"))) static void cast_avx2(uint16_t *dst, const float *src, size_t n)
{
    const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000),
                  bias = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1), qnan = _mm256_set1_epi32(0x7FC0);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        for (int h = 0; h < 2; h++) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)(src + i + 8 * h));
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
            __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
            __m256i v = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), odd), 16);
            r[h] = _mm256_blendv_epi8(v, qnan, nan);
        }
        /* packus interleaves 128-bit lanes; the permute restores order */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8);
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), p);
    }
    cast_portable(dst + i, src + i, n - i);
}

/* The same, 16 floats per step (vpmovdw truncates: the values fit 16 bits). */
__attribute__((target("avx512f,avx512bw"))) static void cast_avx512(uint16_t *dst, const float *src, size_t n)
{
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000),
                  bias = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1), qnan = _mm512_set1_epi32(0x7FC0);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512(src + i);
        __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, absm), inf);
        __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i v = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), odd), 16);
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(v, nan, qnan)));
    }
    cast_portable(dst + i, src + i, n - i);
}

void ferry_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n)
{
    if (n >= 16 && ferry__cpu_avx512()) cast_avx512(dst, src, n);
    else if (n >= 16 && ferry__cpu_avx2()) cast_avx2(dst, src, n);
    else cast_portable(dst, src, n);
}
#else
void ferry_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n) { cast_portable(dst, src, n); }
#endif
