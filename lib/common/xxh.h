/* libxxhash for every hash in the library.  Where the installed library
 * exports its run-time dispatched functions (Debian's amd64 build does; the
 * Makefile probes for them and defines FERRY_XXH_DISPATCH), the XXH3 calls
 * go to those, which pick SSE2, AVX2 or AVX-512 for the CPU at hand.  The
 * hash values are the same either way; only the speed differs: XXH3-128 of
 * 64 KiB pieces already in cache, 19.6 GB/s plain and 44.6 GB/s dispatched
 * on the development machine (AMD EPYC with AVX-512).
 *
 * The dispatched AVX2/AVX-512 code returns with the upper halves of the
 * vector registers dirty, and the caller's SSE code then ran 3.5x slower
 * (a plain compare loop after ferry_diff: 13.5 -> 3.8 GB/s): every call
 * is followed by vzeroupper, on CPUs that have AVX. */
#ifndef FERRY_XXH_H
#define FERRY_XXH_H
#ifndef XXH_STATIC_LINKING_ONLY
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#endif
#include <xxhash.h>
#if FERRY_XXH_DISPATCH
#define XXH_DISPATCH_DISABLE_REPLACE /* the wrappers below instead */
#include <xxh_x86dispatch.h>
#include <immintrin.h>

__attribute__((target("avx"))) static inline void ferry__xxh_zeroupper(void) { _mm256_zeroupper(); }
static inline void ferry__xxh_clean(void)
{
    if (__builtin_cpu_supports("avx")) ferry__xxh_zeroupper();
}
/* ferry__xxh3_*: the dispatched function, then the clean-up */
#define FERRY__XXH_WRAP(type, name, params, fn, args)                                                                   \
    static inline type name params                                                                                     \
    {                                                                                                                  \
        type r = fn args;                                                                                              \
        ferry__xxh_clean();                                                                                            \
        return r;                                                                                                      \
    }
FERRY__XXH_WRAP(XXH64_hash_t, ferry__xxh3_64, (const void *p, size_t n), XXH3_64bits_dispatch, (p, n))
FERRY__XXH_WRAP(XXH64_hash_t, ferry__xxh3_64_seed, (const void *p, size_t n, XXH64_hash_t seed), XXH3_64bits_withSeed_dispatch,
                (p, n, seed))
FERRY__XXH_WRAP(XXH_errorcode, ferry__xxh3_64_update, (XXH3_state_t * st, const void *p, size_t n), XXH3_64bits_update_dispatch,
                (st, p, n))
FERRY__XXH_WRAP(XXH128_hash_t, ferry__xxh3_128, (const void *p, size_t n), XXH3_128bits_dispatch, (p, n))
FERRY__XXH_WRAP(XXH_errorcode, ferry__xxh3_128_update, (XXH3_state_t * st, const void *p, size_t n), XXH3_128bits_update_dispatch,
                (st, p, n))
#undef XXH3_64bits
#define XXH3_64bits ferry__xxh3_64
#undef XXH3_64bits_withSeed
#define XXH3_64bits_withSeed ferry__xxh3_64_seed
#undef XXH3_64bits_update
#define XXH3_64bits_update ferry__xxh3_64_update
#undef XXH3_128bits
#define XXH3_128bits ferry__xxh3_128
#undef XXH3_128bits_update
#define XXH3_128bits_update ferry__xxh3_128_update
#endif
#endif
