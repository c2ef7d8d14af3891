/* What the unit test programs share beyond check.h, written once:
 *   tmpdir_make(buf, n, name)  a scratch directory $TMPDIR/NAME.XXXXXX
 *                              (/tmp when TMPDIR is unset or empty)
 *   rm_rf(path)                removes it and everything under it
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

#define NOT_BUILT_MAIN(why)                                                             \
    int main(void)                                                                      \
    {                                                                                   \
        puts(why);                                                                      \
        puts("0 passed, 0 failed, 1 skipped");                                          \
        return 0;                                                                       \
    }

#endif
