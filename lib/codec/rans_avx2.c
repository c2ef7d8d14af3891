/* AVX2 decoding of a codec-3 rANS stream, for CPUs without AVX-512: the
 * 32 states in four vectors of 8 lanes, the same arithmetic as the AVX-512
 * decoder (rans_avx512.c, which explains the equivalence with rans_dget).
 * AVX2 has no expand, so the renormalising lanes take their words through
 * a permutation looked up by the lane mask. */
#include <pthread.h>
#include "rans.h"
#include "simd.h"

#if FERRY_HAVE_AVX2
#include <immintrin.h>

#define TARGET __attribute__((target("avx2,popcnt")))

/* For each 8-lane mask: lane i takes word popcount(mask & ((1 << i) - 1)). */
static uint8_t expand_lut[256][8];
static pthread_once_t expand_once = PTHREAD_ONCE_INIT;

static void expand_init(void)
{
    for (unsigned m = 0; m < 256; m++)
        for (unsigned i = 0, k = 0; i < 8; i++) {
            expand_lut[m][i] = (uint8_t)k;
            k += m >> i & 1;
        }
}

static inline TARGET __m256i step(__m256i x, __m256i tabv, const uint32_t *lut32, const uint8_t **pp, uint8_t *sym)
{
    const __m256i slotm = _mm256_set1_epi32(RANS_M - 1), low12 = _mm256_set1_epi32(0xFFF), one = _mm256_set1_epi32(1),
                  lbound = _mm256_set1_epi32(RANS_L);
    __m256i slot = _mm256_and_si256(x, slotm);
    __m256i e = _mm256_i32gather_epi32((const int *)(const void *)lut32,
                                       _mm256_add_epi32(_mm256_slli_epi32(tabv, RANS_BITS), slot), 4);
    __m256i freq = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(e, 8), low12), one);
    x = _mm256_add_epi32(_mm256_mullo_epi32(freq, _mm256_srli_epi32(x, RANS_BITS)), _mm256_srli_epi32(e, 20));
    __m256i need = _mm256_cmpgt_epi32(lbound, x); /* states stay below 2^31: a signed compare */
    unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(need));
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)*pp));
    uint64_t perm;
    memcpy(&perm, expand_lut[m], 8);
    w = _mm256_permutevar8x32_epi32(w, _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)perm)));
    x = _mm256_blendv_epi8(x, _mm256_or_si256(_mm256_slli_epi32(x, 16), w), need);
    *pp += 2 * (unsigned)__builtin_popcount(m);
    /* the symbols: the low byte of each lane */
    __m256i b = _mm256_shuffle_epi8(e, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8,
                                                        12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
    uint32_t lo = (uint32_t)_mm256_extract_epi32(b, 0), hi = (uint32_t)_mm256_extract_epi32(b, 4);
    memcpy(sym, &lo, 4);
    memcpy(sym + 4, &hi, 4);
    return x;
}

TARGET size_t rans32_syms_avx2(rans_dec *d, const uint32_t *lut32, const uint8_t *tab, uint8_t *sym, size_t n)
{
    if (d->mask != RANS3_NSTATE - 1 || d->i != 0) return 0;
    pthread_once(&expand_once, expand_init);
    __m256i x[4];
    for (int v = 0; v < 4; v++) x[v] = _mm256_loadu_si256((const __m256i *)(const void *)(d->x + 8 * v));
    const uint8_t *p = d->p;
    size_t j = 0;
    /* a group reads at most 32 words, each step loads 16 bytes: 64 bytes
     * must remain */
    for (; j + 32 <= n && d->end - p >= 64; j += 32)
        for (int v = 0; v < 4; v++)
            x[v] = step(x[v], _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(tab + j + 8 * v))), lut32, &p,
                        sym + j + 8 * v);
    for (int v = 0; v < 4; v++) _mm256_storeu_si256((__m256i *)(void *)(d->x + 8 * v), x[v]);
    d->p = p;
    return j;
}
#endif
