/* Minimal test harness: each RUN(fn) is one test case; a case fails if any
 * CHECK inside it fails, and is skipped if it calls SKIP("why") (reported as
 * "skip fn: why", counted apart; a case that failed a CHECK before its SKIP
 * still fails).  main() ends with CHECK_SUMMARY(), which prints
 * "N passed, N failed, N skipped" (read by tests/run.sh and CI, which match
 * "N passed, N failed" at the start) and returns the exit code.
 *
 * Options every test program takes (check.h removes them from argv before
 * main() sees it, so a program's own positional arguments stay argv[1]...;
 * argc is not updated, so such a program tests argv[1] != NULL):
 *   --case NAME   run only the case whose function is NAME (repeatable);
 *                 naming no case that RUN reaches is a failure, not a pass
 *   --list        print the cases' names instead of running them */
#ifndef FERRY_CHECK_H
#define FERRY_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ferry.h"

static int check_case_failed, check_passed, check_failed, check_skipped;
static const char *check_case_skip; /* set by SKIP: why the current case skipped */

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

/* Ends the current case as skipped: call it in the case function itself (it
 * returns from the function it is in); `why` must outlive the
 * case (a literal, or a static buffer). */
#define SKIP(why)                                                                       \
    do {                                                                                \
        check_case_skip = (why);                                                        \
        return;                                                                         \
    } while (0)

/* --case / --list, filled in by check_args_ below. */
enum { CHECK_MAX_CASES = 32 };
static const char *check_only[CHECK_MAX_CASES];
static int check_only_ran[CHECK_MAX_CASES];
static int check_n_only, check_list;

/* Reads the harness options before main().  glibc calls a main program's
 * constructors with (argc, argv, envp), and the tests only run on
 * Linux/glibc; elsewhere the options are not recognised and every case runs. */
#ifdef __GLIBC__
__attribute__((constructor)) static void check_args_(int argc, char **argv)
{
    int out = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--list")) {
            check_list = 1;
        } else if (!strcmp(argv[i], "--case") && i + 1 < argc) {
            if (check_n_only == CHECK_MAX_CASES) {
                fprintf(stderr, "too many --case options (at most %d)\n", CHECK_MAX_CASES);
                exit(2);
            }
            check_only[check_n_only++] = argv[++i];
        } else if (!strcmp(argv[i], "--case")) {
            fprintf(stderr, "--case needs a case name (see --list)\n");
            exit(2);
        } else {
            argv[out++] = argv[i];
        }
    }
    for (int i = out; i < argc; i++) argv[i] = NULL;
}
#endif

/* Whether RUN should run the case named `name` (in --list mode: prints it). */
static inline int check_selected_(const char *name)
{
    if (check_list) {
        printf("%s\n", name);
        return 0;
    }
    if (!check_n_only) return 1;
    int hit = 0;
    for (int i = 0; i < check_n_only; i++)
        if (!strcmp(check_only[i], name)) hit = check_only_ran[i] = 1;
    return hit;
}

static inline void check_case_end_(const char *name)
{
    if (check_case_failed) {
        check_failed++;
        fprintf(stderr, "FAIL %s\n", name);
    } else if (check_case_skip) {
        check_skipped++;
        printf("skip %s: %s\n", name, check_case_skip);
    } else {
        check_passed++;
        printf("ok   %s\n", name);
    }
    fflush(stdout);
}

#define RUN(fn)                                                                         \
    do {                                                                                \
        if (check_selected_(#fn)) {                                                     \
            check_case_failed = 0;                                                      \
            check_case_skip = NULL;                                                     \
            fn();                                                                       \
            check_case_end_(#fn);                                                       \
        }                                                                               \
    } while (0)

static inline int check_summary_(void)
{
    if (check_list) return 0;
    for (int i = 0; i < check_n_only; i++)
        if (!check_only_ran[i]) {
            fprintf(stderr, "--case %s: no such case was run (see --list)\n", check_only[i]);
            check_failed++;
        }
    printf("%d passed, %d failed, %d skipped\n", check_passed, check_failed, check_skipped);
    return check_failed != 0;
}
#define CHECK_SUMMARY() check_summary_()

/* Path of a file under the shared data directory ($FERRY_DATA or ../shared/data). */
static inline const char *data_path(char *buf, size_t n, const char *rel)
{
    const char *d = getenv("FERRY_DATA");
    snprintf(buf, n, "%s/%s", d && *d ? d : "../shared/data", rel);
    return buf;
}

/* Skips the current case when the shared data file `rel` is not there (a
 * checkout without ../shared/data), instead of failing on every read. */
#define SKIP_UNLESS_DATA(rel)                                                           \
    do {                                                                                \
        static char check_why_[1100];                                                   \
        char check_p_[1024];                                                            \
        if (access(data_path(check_p_, sizeof check_p_, (rel)), R_OK)) {                \
            snprintf(check_why_, sizeof check_why_, "shared data %s missing (set FERRY_DATA)", \
                     check_p_);                                                         \
            SKIP(check_why_);                                                           \
        }                                                                               \
    } while (0)
#endif
