/* libFuzzer target for the dock's batch decoder (ferry_dock_decode): a
 * batch under RUN/traj/ is written by any island, or anyone with write
 * access to the bucket.
 * Each input is decoded twice: as it is, and with its checksum field
 * recomputed (bytes 112..127, when the input is long enough), so that the
 * fuzzer gets past the checksum to the fields behind it.
 * Contract: a refusal is one of the dock's content codes (MAGIC, FORMAT,
 * TRUNCATED, LENGTH, HEADER, CHECKSUM, RUN) with a message; an accepted
 * batch has a payload inside the input, exactly as long as the input
 * after the header (and the signature of a signed one), and encoding an
 * unsigned one again gives the same bytes.  A broken
 * rule aborts.  Seeds: tests/fuzz/corpus/batch
 * (tests/golden-errors/batch/make.py); after `make fuzz`:
 *   mkdir -p /tmp/fzb && ./build-fuzz/fuzz_batch -max_total_time=600 /tmp/fzb tests/fuzz/corpus/batch */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "ferry_dock.h"
#include "xxh.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void require(int ok)
{
    if (!ok) abort();
}

static void check(const uint8_t *data, size_t size)
{
    ferry_dock_header h;
    int rc = ferry_dock_decode(data, size, 1 << 20, NULL, &h);
    if (rc) {
        require(rc >= FERRY_ERR_DOCK_MAGIC && rc <= FERRY_ERR_DOCK_RUN && ferry_last_error()[0]);
        return;
    }
    require(size == FERRY_DOCK_HEADER_SIZE + h.size + (h.signature ? FERRY_DOCK_SIG_SIZE : 0));
    require((const uint8_t *)h.payload == data + FERRY_DOCK_HEADER_SIZE);
    require(!h.signature || (const uint8_t *)h.signature == data + FERRY_DOCK_HEADER_SIZE + h.size);
    require(ferry_dock_decode(data, size, 1 << 20, h.run, &h) == FERRY_OK);
    if (h.signature) return; /* the encoder writes unsigned batches (signing is the dock's) */
    void *again = NULL;
    size_t n = 0;
    require(ferry_dock_encode(h.run, h.version, h.island, h.seq, h.put_time_ms, h.payload, (size_t)h.size, &again, &n) ==
            FERRY_OK);
    require(n == size && !memcmp(again, data, size));
    ferry_free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check(data, size);
    if (size < FERRY_DOCK_HEADER_SIZE) return 0;
    uint8_t *fixed = malloc(size);
    require(fixed != NULL);
    memcpy(fixed, data, size);
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, fixed, 112);
    XXH3_128bits_update(&st, fixed + FERRY_DOCK_HEADER_SIZE, size - FERRY_DOCK_HEADER_SIZE);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    memcpy(fixed + 112, c.digest, 16);
    check(fixed, size);
    free(fixed);
    return 0;
}
