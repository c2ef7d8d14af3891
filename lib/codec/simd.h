/* Run-time dispatch to vectorised kernels.  The portable code is the
 * definition; each kernel must produce identical results (tests compare
 * them with FERRY_NO_SIMD=1 in the environment, which disables them, and
 * FERRY_NO_SIMD=avx512, which disables only the AVX-512 ones). */
#ifndef FERRY_SIMD_H
#define FERRY_SIMD_H
#include "sparse.h"

#if FERRY_HAVE_X86_SIMD /* bf16.h: also ferry__cpu_avx2, the dispatch test */
#include <immintrin.h>
#define FERRY_HAVE_AVX2 1
int ferry__codec_scan16_avx2(const sp_dtype *t, uint32_t top, const uint8_t *a, const uint8_t *b, size_t lo, size_t hi,
                   sp_scratch *s, sp_scan_state *st);
int ferry__codec_walk16_avx2(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n, sp_scratch *s, size_t k);
/* The walks' read of a class's wanted ranks: nbits (<= 64) bits of its
 * rank bitmap from bit off; past the bitmap's end (lim bytes) its zero
 * padding (ferry__codec_walk_bitmaps leaves 16 bytes). */
static inline __attribute__((target("bmi2"))) uint64_t sp_bits_at(const uint8_t *bm, uint64_t off, uint64_t lim,
                                                                  unsigned nbits)
{
    uint64_t byte = off >> 3 < lim ? off >> 3 : lim, lo, hi;
    memcpy(&lo, bm + byte, 8);
    memcpy(&hi, bm + byte + 8, 8);
    unsigned sh = (unsigned)(off & 7);
    return _bzhi_u64((lo >> sh) | ((hi << 1) << (63 - sh)), nbits);
}
/* The same for a pdep by a mask of nbits set bits, which reads only the
 * low nbits: the bits above are left as they are.  One load, a second only
 * when the nbits straddle it (a class holding more than 56 of 64 words). */
static inline __attribute__((target("bmi2"))) uint64_t sp_bits_for_pdep(const uint8_t *bm, uint64_t off, uint64_t lim,
                                                                        unsigned nbits)
{
    uint64_t byte = off >> 3 < lim ? off >> 3 : lim, lo, hi;
    unsigned sh = (unsigned)(off & 7);
    memcpy(&lo, bm + byte, 8);
    lo >>= sh;
    if (__builtin_expect(sh + nbits > 64, 0)) {
        memcpy(&hi, bm + byte + 8, 8);
        lo |= (hi << 1) << (63 - sh);
    }
    return lo;
}
#define FERRY_HAVE_AVX512 1 /* ferry__cpu_avx512 */
size_t ferry__codec_narrow16_avx512(uint16_t *dst, const uint32_t *src, size_t n); /* the whole vectors: returns how many */
int ferry__codec_walk16_avx512(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n, sp_scratch *s, size_t k);
int ferry__codec_scan16_avx512(const sp_dtype *t, uint32_t top, const uint8_t *a, const uint8_t *b, size_t lo, size_t hi,
                     sp_scratch *s, sp_scan_state *st);
void ferry__codec_scan_group_bitmaps(sp_scratch *s, const sp_scan_state *st);
/* The walk with the classes of a step in vector lanes, where the CPU has GFNI, VBMI and VPOPCNTDQ
 * (FERRY_NO_GFNI=1: not used). */
bool ferry__codec_walk16_gfni_ok(void);
int ferry__codec_walk16_gfni(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n, sp_scratch *s, size_t k);
#else
#define FERRY_HAVE_AVX2 0
#define FERRY_HAVE_AVX512 0
#endif
#endif
