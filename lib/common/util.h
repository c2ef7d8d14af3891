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

#endif
