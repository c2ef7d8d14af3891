/* Small system helpers every room shares (one copy each): the monotonic
 * clock, sleeping, hex, random bytes, array growth, SHA-256.  Included by
 * common.h.  Not part of the public API. */
#ifndef FERRY_UTIL_H
#define FERRY_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Milliseconds of CLOCK_MONOTONIC: for deadlines and durations, never for
 * dates (it does not jump with the wall clock). */
uint64_t ferry__mono_ms(void);
/* Sleeps ms milliseconds (resumed after a signal, so the whole time). */
void ferry__sleep_ms(uint64_t ms);

/* Lowercase hex of n bytes: 2n digits and a NUL into out (2n + 1 bytes). */
void ferry__hex(char *out, const void *data, size_t n);
/* Decodes 2n lowercase hex digits at s into out[n]; false at any other
 * character.  A NUL is another character, so a short string is never read
 * past its end; whether s ends after the digits is the caller's check. */
bool ferry__unhex(uint8_t *out, const char *s, size_t n);

/* n random bytes from the kernel (getrandom).  Where it has none to give
 * without blocking (early boot, an old kernel, a seccomp filter), bytes
 * mixed from the clocks, the pid and a process-wide counter stand in: they
 * still differ between calls and between processes, which is all that
 * names, nonces and jitter need.  Never for secrets. */
void ferry__random_bytes(void *out, size_t n);

/* Grows the array *p (*cap elements of elem bytes) to hold at least need
 * elements: doubling from 8, so n appends cost O(n).  Overflow-checked.  On
 * failure (FERRY_ERR_NOMEM, recorded) *p and *cap are unchanged and still
 * valid.  Call as ferry__grow((void **)&a, &cap, n + 1, sizeof *a). */
int ferry__grow(void **p, size_t *cap, size_t need, size_t elem);

#ifndef FERRY_NO_NET
/* SHA-256 through libcrypto, which only network builds link (the core
 * itself never needs it): the store's SigV4 signing, signatures, object
 * digests.  FERRY_ERR_NOMEM (recorded) if libcrypto fails. */
int ferry__sha256(const void *data, size_t n, uint8_t out[32]);
/* The same as 64 lowercase hex digits and a NUL. */
int ferry__sha256_hex(const void *data, size_t n, char out[65]);
#endif

/* An invariant of the code (not a check of input: bad input gets its own
 * error code and message).  When it does not hold, the build decides:
 * with FERRY_ASSERT_ABORT (sanitizer builds) it prints "file:line:
 * assertion failed: expr" and aborts, where a debugger or the sanitizer's
 * report is wanted; otherwise it records FERRY_ERR_INTERNAL with that text
 * for ferry_last_error() and makes the enclosing function return it, so a
 * library bug fails the one call instead of the caller's process.
 * FERRY_ASSERT is for functions returning a status (int); FERRY_ASSERT_RC
 * for those that clean up before they return (it sets rc, if still
 * FERRY_OK, instead of returning); FERRY_ASSERT_V for void ones (the
 * failure is still recorded).  Per call or per chunk, never per word. */
#define FERRY_ASSERT(expr)                                                    \
    do {                                                                      \
        if (__builtin_expect(!(expr), 0)) return ferry__assert_fail(__FILE__, __LINE__, #expr); \
    } while (0)
#define FERRY_ASSERT_V(expr)                                                  \
    do {                                                                      \
        if (__builtin_expect(!(expr), 0)) {                                   \
            (void)ferry__assert_fail(__FILE__, __LINE__, #expr);              \
            return;                                                           \
        }                                                                     \
    } while (0)
#define FERRY_ASSERT_RC(rc, expr)                                             \
    do {                                                                      \
        if (!(rc) && __builtin_expect(!(expr), 0)) (rc) = ferry__assert_fail(__FILE__, __LINE__, #expr); \
    } while (0)
/* Returns FERRY_ERR_INTERNAL (or aborts, see above). */
int ferry__assert_fail(const char *file, int line, const char *expr);

#endif
