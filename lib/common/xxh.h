/* libxxhash for every hash in the library.  Where the installed library
 * exports its run-time dispatched functions (Debian's amd64 build does; the
 * Makefile probes for them and defines FERRY_XXH_DISPATCH), the XXH3 calls
 * go to those, which pick SSE2, AVX2 or AVX-512 for the CPU at hand.  The
 * hash values are the same either way; only the speed differs: XXH3-128 of
 * 64 KiB pieces already in cache, 19.6 GB/s plain and 44.6 GB/s dispatched
 * on the development machine (AMD EPYC with AVX-512). */
#ifndef FERRY_XXH_H
#define FERRY_XXH_H
#ifndef XXH_STATIC_LINKING_ONLY
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#endif
#include <xxhash.h>
#if FERRY_XXH_DISPATCH
#include <xxh_x86dispatch.h>
#endif
#endif
