/* BF16 cast vectors (DESIGN.md), dtype table, model building and hashing;
 * the helpers of lib/common/util.h and FERRY_ASSERT. */
#include "check.h"
#include "bf16.h"
#include "model.h"

#include <signal.h>
#include <sys/wait.h>

static void test_bf16_vectors(void)
{
    static const uint32_t in[] = {0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0x00000001, 0xFF800000, 0x7F800001,
                                  0xFFC00001, 0x80000000, 0x7F800000};
    static const uint16_t want[] = {0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x0000, 0xFF80, 0x7FC0, 0x7FC0, 0x8000, 0x7F80};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        float f;
        memcpy(&f, &in[i], 4);
        CHECK(ferry_f32_to_bf16(f) == want[i]);
        uint16_t v;
        ferry_f32_to_bf16_n(&v, &f, 1);
        CHECK(v == want[i]);
    }
    CHECK(ferry_bf16_to_f32(0x3F80) == 1.0f);
}

/* The vectorised bulk cast equals the scalar definition bit for bit:
 * special values at every lane, rounding ties, random patterns, odd
 * lengths; at every level (AVX-512, AVX2 with FERRY_NO_SIMD=avx512, none). */
static void test_bf16_bulk_cast(void)
{
    enum { N = 4099 };
    static uint32_t in[N];
    static uint16_t out[N];
    static const uint32_t special[] = {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7F800001, 0xFFFFFFFF,
                                       0x7FC00000, 0x7F7FFFFF, 0x3F808000, 0x3F818000, 0x00008000, 0x80018000,
                                       0x7F7F8000, 0x7F7FFFFF, 0x00000001, 0x0001FFFF};
    uint64_t r = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < N; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        in[i] = i % 3 == 0 ? special[(i / 3) % (sizeof special / sizeof special[0])] : (uint32_t)r;
    }
    static const char *levels[] = {"1", "avx512", "0"};
    for (int l = 0; l < 3; l++) {
        setenv("FERRY_NO_SIMD", levels[l], 1);
        for (size_t n = 0; n <= N; n += n < 40 ? 1 : 997) {
            memset(out, 0xAB, sizeof out);
            ferry_f32_to_bf16_n(out, (const float *)(const void *)in, n);
            bool ok = true;
            for (size_t i = 0; i < n; i++) ok &= out[i] == ferry__bf16_from_bits(in[i]);
            for (size_t i = n; i < N; i++) ok &= out[i] == 0xABAB; /* nothing past n */
            CHECK(ok);
        }
    }
    unsetenv("FERRY_NO_SIMD");
}

static void test_fkey_bijective(void)
{
    /* every 16-bit pattern maps to a distinct key, and -0/+0 are adjacent */
    static uint8_t seen[65536];
    for (uint32_t u = 0; u < 65536; u++) {
        uint64_t k = ferry__fkey(u, 16);
        CHECK(k < 65536 && !seen[k]);
        seen[k] = 1;
        CHECK(ferry__fkey_inv(k, 16) == u);
    }
    CHECK(ferry__fkey(0x0000, 16) - ferry__fkey(0x8000, 16) == 1);
    CHECK(ferry__fkey(0x3F81, 16) - ferry__fkey(0x3F80, 16) == 1);
    CHECK(ferry__fkey(0xBF80, 16) - ferry__fkey(0xBF81, 16) == 1); /* -1.0 > -1.0078 */
    CHECK(ferry__fkey_inv(ferry__fkey(0x8000000000000001ull, 64), 64) == 0x8000000000000001ull);
}

static void test_dtypes(void)
{
    ferry_dtype d;
    CHECK_OK(ferry_dtype_parse("BF16", &d));
    CHECK(d == FERRY_BF16 && ferry_dtype_bits(d) == 16);
    CHECK_OK(ferry_dtype_parse("F8_E4M3", &d));
    CHECK(ferry_dtype_bits(d) == 8);
    CHECK_OK(ferry_dtype_parse("F4", &d));
    CHECK(ferry_dtype_bits(d) == 4);
    CHECK_RC(ferry_dtype_parse("bf16", &d), FERRY_ERR_ST_DTYPE);
    for (int i = 0; i < FERRY_DTYPE_COUNT; i++) {
        CHECK_OK(ferry_dtype_parse(ferry_dtype_name((ferry_dtype)i), &d));
        CHECK(d == (ferry_dtype)i);
    }
}

static void test_model_build_and_hash(void)
{
    ferry_model *m = NULL, *m2 = NULL;
    CHECK_OK(ferry_model_create(&m));
    uint16_t a[6] = {1, 2, 3, 4, 5, 6};
    uint64_t sh[2] = {2, 3};
    CHECK_OK(ferry_model_add(m, "z.weight", FERRY_BF16, 2, sh, a, sizeof a, FERRY_ADD_COPY));
    CHECK_OK(ferry_model_add(m, "a.weight", FERRY_BF16, 2, sh, a, sizeof a, FERRY_ADD_BORROW));
    CHECK_RC(ferry_model_add(m, "a.weight", FERRY_BF16, 2, sh, a, sizeof a, 0), FERRY_ERR_ARG);
    CHECK_RC(ferry_model_add(m, "b", FERRY_BF16, 2, sh, a, 10, 0), FERRY_ERR_ARG);
    uint64_t huge[2] = {UINT64_MAX / 2, 3};
    CHECK_RC(ferry_model_add(m, "c", FERRY_BF16, 2, huge, a, 12, 0), FERRY_ERR_ARG);
    uint64_t odd[1] = {3};
    CHECK_RC(ferry_model_add(m, "f4", FERRY_F4, 1, odd, a, 1, 0), FERRY_ERR_ARG); /* 12 bits: not whole bytes */
    CHECK(ferry_model_count(m) == 2);
    CHECK(strcmp(ferry_model_tensor(m, 0)->name, "a.weight") == 0);
    CHECK(ferry_model_find(m, "z.weight")->nelem == 6);
    CHECK(ferry_model_find(m, "nope") == NULL);
    CHECK_OK(ferry_model_set_metadata(m, "format", "pt"));

    /* same content built in the other order hashes the same */
    CHECK_OK(ferry_model_create(&m2));
    CHECK_OK(ferry_model_set_metadata(m2, "format", "pt"));
    CHECK_OK(ferry_model_add(m2, "a.weight", FERRY_BF16, 2, sh, a, sizeof a, 0));
    CHECK_OK(ferry_model_add(m2, "z.weight", FERRY_BF16, 2, sh, a, sizeof a, 0));
    uint8_t h1[16], h2[16];
    CHECK_OK(ferry_model_hash(m, h1));
    CHECK_OK(ferry_model_hash(m2, h2));
    CHECK(memcmp(h1, h2, 16) == 0);
    /* one bit, one metadata value or one shape change moves the hash */
    ((uint16_t *)ferry_model_data_mut(m2, 1))[5] ^= 1;
    CHECK_OK(ferry_model_hash(m2, h2));
    CHECK(memcmp(h1, h2, 16) != 0);
    ((uint16_t *)ferry_model_data_mut(m2, 1))[5] ^= 1;
    CHECK_OK(ferry_model_set_metadata(m2, "format", "np"));
    CHECK_OK(ferry_model_hash(m2, h2));
    CHECK(memcmp(h1, h2, 16) != 0);
    ferry_model_free(m);
    ferry_model_free(m2);
    ferry_model_free(NULL);
}

static void test_errors(void)
{
    CHECK(strcmp(ferry_strerror(FERRY_OK), "ok") == 0);
    CHECK(strcmp(ferry_strerror(99999), "unknown error") == 0);
    CHECK(ferry_strerror(FERRY_ERR_BASE_MISMATCH)[0] != 0);
}

static void test_util_hex(void)
{
    const uint8_t b[4] = {0x00, 0x9f, 0xa0, 0xff};
    char x[9];
    ferry__hex(x, b, sizeof b);
    CHECK(strcmp(x, "009fa0ff") == 0);
    uint8_t back[4] = {0};
    CHECK(ferry__unhex(back, x, 4) && memcmp(back, b, 4) == 0);
    CHECK(!ferry__unhex(back, "009FA0FF", 4)); /* lowercase only */
    CHECK(!ferry__unhex(back, "009fa0f", 4));  /* stops at the NUL */
    CHECK(!ferry__unhex(back, "00 9fa0ff", 4));
    CHECK(ferry__unhex(back, "", 0));
    ferry__hex(x, b, 0);
    CHECK(x[0] == 0);
#ifndef FERRY_NO_NET
    char h[65];
    CHECK_OK(ferry__sha256_hex("abc", 3, h));
    CHECK(strcmp(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
#endif
}

static void test_util_grow(void)
{
    uint32_t *a = NULL;
    size_t cap = 0;
    for (uint32_t i = 0; i < 1000; i++) {
        CHECK_OK(ferry__grow((void **)&a, &cap, (size_t)i + 1, sizeof *a));
        if (!a || cap <= i) break;
        a[i] = i;
    }
    CHECK(a && cap >= 1000 && cap < 2048 && a[999] == 999 && a[0] == 0);
    size_t before = cap;
    CHECK_OK(ferry__grow((void **)&a, &cap, 10, sizeof *a)); /* enough already: unchanged */
    CHECK(cap == before);
    /* need x elem past SIZE_MAX: NOMEM with the array kept as it was */
    uint32_t *keep = a;
    CHECK_RC(ferry__grow((void **)&a, &cap, SIZE_MAX / 2, sizeof *a), FERRY_ERR_NOMEM);
    CHECK(a == keep && cap == before && a[999] == 999);
    CHECK(strstr(ferry_last_error(), "overflow") != NULL);
    free(a);
}

static void test_util_random_clock(void)
{
    uint8_t r1[32], r2[32], zero[32] = {0};
    ferry__random_bytes(r1, sizeof r1);
    ferry__random_bytes(r2, sizeof r2);
    CHECK(memcmp(r1, r2, sizeof r1) != 0 && memcmp(r1, zero, sizeof r1) != 0);
    ferry__random_bytes(r1, 0); /* nothing asked, nothing written */
    uint64_t t0 = ferry__mono_ms();
    ferry__sleep_ms(20);
    uint64_t t1 = ferry__mono_ms();
    CHECK(t1 >= t0 + 20 && t1 < t0 + 5000);
}

/* A function with an invariant, as library code has them. */
static int g_assert_line;
static int guarded(int x)
{
    g_assert_line = __LINE__ + 1;
    FERRY_ASSERT(x > 1);
    return FERRY_OK;
}

/* Release builds: a broken invariant fails the call with
 * FERRY_ERR_INTERNAL naming file:line and the expression.  Sanitizer
 * builds (FERRY_ASSERT_ABORT) abort with that text on stderr instead:
 * checked in a child process. */
static void test_assert(void)
{
    char want[256];
    CHECK_OK(guarded(2));
    snprintf(want, sizeof want, "%s:%d: assertion failed: x > 1", __FILE__, g_assert_line);
#ifndef FERRY_ASSERT_ABORT
    CHECK_RC(guarded(1), FERRY_ERR_INTERNAL);
    CHECK(strcmp(ferry_last_error(), want) == 0);
    CHECK(strcmp(ferry_strerror(FERRY_ERR_INTERNAL), "internal error: an invariant does not hold") == 0);
#else
    int fd[2];
    CHECK(pipe(fd) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        guarded(1);
        _exit(0); /* not reached when the assertion aborts */
    }
    close(fd[1]);
    char got[512] = {0};
    size_t n = 0;
    ssize_t k;
    while (n < sizeof got - 1 && (k = read(fd[0], got + n, sizeof got - 1 - n)) > 0) n += (size_t)k;
    close(fd[0]);
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    CHECK(strstr(got, want) != NULL);
#endif
}

int main(void)
{
    RUN(test_bf16_vectors);
    RUN(test_bf16_bulk_cast);
    RUN(test_fkey_bijective);
    RUN(test_dtypes);
    RUN(test_model_build_and_hash);
    RUN(test_errors);
    RUN(test_util_hex);
    RUN(test_util_grow);
    RUN(test_util_random_clock);
    RUN(test_assert);
    return CHECK_SUMMARY();
}
