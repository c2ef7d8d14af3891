/* Shared by the fuzz targets of the sync layer's JSON records (HEAD,
 * manifests, the compaction index): the run and key every input is parsed
 * against, and the contract checks.  The seeds and must-fail files name
 * run "r" (tests/golden-errors/records/make.py). */
#ifndef FERRY_FUZZ_RECORDS_H
#define FERRY_FUZZ_RECORDS_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sync/sync_impl.h"

#define FZ_RUN "r"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void require(int ok)
{
    if (!ok) abort();
}

/* A failure must carry a message naming the object. */
static void require_failure(int rc, const char *key)
{
    require(rc == FERRY_ERR_SYNC_MANIFEST || rc == FERRY_ERR_NOMEM);
    require(strstr(ferry_last_error(), key) != NULL || rc == FERRY_ERR_NOMEM);
}

/* Versions and sizes the parsers accept fit a signed 64-bit JSON integer
 * and stay at or below FS_VERSION_MAX (docs/PROTOCOL.md). */
static void require_version(uint64_t v) { require(v >= 1 && v <= FS_VERSION_MAX); }
#endif
