/* The shared system helpers of util.h. */
#include "common.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#ifndef FERRY_NO_NET
#include <openssl/err.h>
#include <openssl/evp.h>
#endif

uint64_t ferry__mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void ferry__sleep_ms(uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR) {}
}

void ferry__hex(char *out, const void *data, size_t n)
{
    static const char digit[] = "0123456789abcdef";
    const uint8_t *d = data;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digit[d[i] >> 4];
        out[2 * i + 1] = digit[d[i] & 15];
    }
    out[2 * n] = 0;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

bool ferry__unhex(uint8_t *out, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int hi = hex_digit(s[2 * i]);
        if (hi < 0) return false; /* before reading s[2i+1]: s may end here */
        int lo = hex_digit(s[2 * i + 1]);
        if (lo < 0) return false;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

/* splitmix64's finalizer: every input bit reaches every output bit. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void ferry__random_bytes(void *out, size_t n)
{
    uint8_t *p = out;
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(p + got, n - got, GRND_NONBLOCK);
        if (r > 0) got += (size_t)r;
        else if (r < 0 && errno == EINTR) continue;
        else break; /* EAGAIN (no entropy yet), ENOSYS, EPERM: the fallback */
    }
    if (got == n) return;
    static _Atomic uint64_t counter;
    struct timespec rt, mt;
    clock_gettime(CLOCK_REALTIME, &rt);
    clock_gettime(CLOCK_MONOTONIC, &mt);
    uint64_t s = (uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec;
    s ^= mix64((uint64_t)mt.tv_sec * 1000000000ull + (uint64_t)mt.tv_nsec);
    s ^= mix64((uint64_t)getpid() << 32 ^ atomic_fetch_add(&counter, 1));
    s ^= (uint64_t)(uintptr_t)&s; /* the stack's address, randomised per process */
    while (got < n) {
        s += 0x9e3779b97f4a7c15ull;
        uint64_t v = mix64(s);
        size_t k = n - got < 8 ? n - got : 8;
        memcpy(p + got, &v, k);
        got += k;
    }
}

int ferry__grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return FERRY_OK;
    size_t c = *cap ? *cap : 8;
    while (c < need) {
        if (c > SIZE_MAX / 2) { c = need; break; }
        c *= 2;
    }
    size_t bytes;
    if (__builtin_mul_overflow(c, elem, &bytes))
        return ferry__fail(FERRY_ERR_NOMEM, "array of %zu x %zu bytes: size overflow", c, elem);
    void *q = ferry__realloc(*p, bytes);
    if (!q) return FERRY_ERR_NOMEM;
    *p = q;
    *cap = c;
    return FERRY_OK;
}

int ferry__assert_fail(const char *file, int line, const char *expr)
{
#ifdef FERRY_ASSERT_ABORT
    fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, expr);
    abort();
#else
    return ferry__fail(FERRY_ERR_INTERNAL, "%s:%d: assertion failed: %s", file, line, expr);
#endif
}

#ifndef FERRY_NO_NET
int ferry__sha256(const void *data, size_t n, uint8_t out[32])
{
    unsigned len = 0;
    if (!EVP_Digest(data, n, out, &len, EVP_sha256(), NULL) || len != 32) {
        char why[160] = "no detail";
        unsigned long e = ERR_get_error();
        if (e) ERR_error_string_n(e, why, sizeof why);
        ERR_clear_error();
        return ferry__fail(FERRY_ERR_NOMEM, "SHA-256: %s", why);
    }
    return FERRY_OK;
}

int ferry__sha256_hex(const void *data, size_t n, char out[65])
{
    uint8_t d[32];
    int rc = ferry__sha256(data, n, d);
    if (rc) {
        out[0] = 0;
        return rc;
    }
    ferry__hex(out, d, 32);
    return FERRY_OK;
}
#endif
