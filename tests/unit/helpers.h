/* What the unit test programs share beyond check.h, written once:
 *   tmpdir_make(buf, n, name)  a scratch directory $TMPDIR/NAME.XXXXXX
 *                              (/tmp when TMPDIR is unset or empty)
 *   rm_rf(path)                removes it and everything under it
 *   UNDER_ASAN                 defined when built with AddressSanitizer
 *   ramp_model(fill)           (with check.h included first) a one-tensor
 *                              model: BF16 "w" of 4096 words, fill plus a
 *                              ramp on every 7th word
 *   NOT_BUILT_MAIN(why)        the whole program of a test whose subject
 *                              this build leaves out (make NO_NET=1): it
 *                              prints why and one skipped case, e.g.
 *     #ifdef FERRY_NO_NET
 *     #include "helpers.h"
 *     NOT_BUILT_MAIN("sync layer not built (NO_NET=1)")
 *     #else
 *     ... the tests ...
 *     #endif
 * (tests/unit/sync_fixture.h builds the sync-layer tests' file:// fixture
 * on these.) */
#ifndef FERRY_TESTS_HELPERS_H
#define FERRY_TESTS_HELPERS_H

#include <stdio.h>
#include <stdlib.h>

/* Makes the directory $TMPDIR/NAME.XXXXXX (mkdtemp) into buf; 0 on
 * success, else prints why and returns 1. */
static inline int tmpdir_make(char *buf, size_t n, const char *name)
{
    const char *t = getenv("TMPDIR");
    int len = snprintf(buf, n, "%s/%s.XXXXXX", t && *t ? t : "/tmp", name);
    if (len < 0 || (size_t)len >= n) {
        fprintf(stderr, "scratch directory name too long: %s/%s\n", t && *t ? t : "/tmp", name);
        return 1;
    }
    if (mkdtemp(buf)) return 0;
    perror("mkdtemp");
    return 1;
}

/* Removes path and everything under it (a scratch directory). */
static inline void rm_rf(const char *path)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", path);
}

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

#ifdef FERRY_CHECK_H
#include <stdint.h>
/* A model of one BF16 tensor "w" [4096]: word i is fill, plus i when i is
 * a multiple of 7.  The library copies the words (FERRY_ADD_COPY). */
static inline ferry_model *ramp_model(uint16_t fill)
{
    static uint16_t w[4096];
    for (size_t i = 0; i < 4096; i++) w[i] = (uint16_t)(fill + (i % 7 == 0 ? i : 0));
    ferry_model *m = NULL;
    uint64_t shape[1] = {4096};
    CHECK_OK(ferry_model_create(&m));
    CHECK_OK(ferry_model_add(m, "w", FERRY_BF16, 1, shape, w, sizeof w, FERRY_ADD_COPY));
    return m;
}
#endif

#define NOT_BUILT_MAIN(why)                                                             \
    int main(void)                                                                      \
    {                                                                                   \
        puts(why);                                                                      \
        puts("0 passed, 0 failed, 1 skipped");                                          \
        return 0;                                                                       \
    }

#endif
