/* The file:// fixture the sync-layer tests share: one temporary root per
 * test program (removed with rm_rf(g_root), from helpers.h), a new empty
 * store under it per case.  Include after the
 * public headers (needs ferry_store.h). */
#ifndef FERRY_TESTS_SYNC_FIXTURE_H
#define FERRY_TESTS_SYNC_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "helpers.h" /* tmpdir_make, rm_rf */

static char g_root[256];
static int g_nstore;

/* Makes g_root ($TMPDIR or /tmp, "ferry-TAG-test.XXXXXX"); 0 on success. */
static int fixture_root(const char *tag)
{
    char name[64];
    snprintf(name, sizeof name, "ferry-%s-test", tag);
    return tmpdir_make(g_root, sizeof g_root, name);
}

/* A new empty file store under g_root; its directory in dir. */
static ferry_store *fixture_store(char dir[512])
{
    snprintf(dir, 512, "%s/store-%d", g_root, ++g_nstore);
    ferry_store_options o = {.create = 1, .deadline_ms = 20000};
    ferry_store *s = NULL;
    if (ferry_store_open(dir, &o, &s)) fprintf(stderr, "store: %s\n", ferry_last_error());
    return s;
}

#endif
