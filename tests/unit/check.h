/* Minimal test harness: each RUN(fn) is one test case; a case fails if any
 * CHECK inside it fails.  main() ends with CHECK_SUMMARY(), which prints
 * "N passed, N failed" (read by tests/run.sh) and returns the exit code. */
#ifndef FERRY_CHECK_H
#define FERRY_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ferry.h"

static int check_case_failed, check_passed, check_failed;

#define CHECK(c)                                                                        \
    do {                                                                                \
        if (!(c)) {                                                                     \
            check_case_failed = 1;                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);       \
        }                                                                               \
    } while (0)

/* Expects a ferry status; prints ferry_last_error() when it differs. */
#define CHECK_RC(expr, want)                                                            \
    do {                                                                                \
        int check_rc_ = (expr);                                                         \
        if (check_rc_ != (want)) {                                                      \
            check_case_failed = 1;                                                      \
            fprintf(stderr, "%s:%d: %s returned %d (%s: %s), want %d\n", __FILE__,      \
                    __LINE__, #expr, check_rc_, ferry_strerror(check_rc_),               \
                    ferry_last_error(), (int)(want));                                   \
        }                                                                               \
    } while (0)
#define CHECK_OK(expr) CHECK_RC(expr, 0)

#define RUN(fn)                                                                         \
    do {                                                                                \
        check_case_failed = 0;                                                          \
        fn();                                                                           \
        if (check_case_failed) { check_failed++; fprintf(stderr, "FAIL %s\n", #fn); }   \
        else { check_passed++; printf("ok   %s\n", #fn); }                              \
        fflush(stdout);                                                                 \
    } while (0)

#define CHECK_SUMMARY()                                                                 \
    (printf("%d passed, %d failed\n", check_passed, check_failed), check_failed != 0)

/* Path of a file under the shared data directory ($FERRY_DATA or ../shared/data). */
static inline const char *data_path(char *buf, size_t n, const char *rel)
{
    const char *d = getenv("FERRY_DATA");
    snprintf(buf, n, "%s/%s", d && *d ? d : "../shared/data", rel);
    return buf;
}
#endif
