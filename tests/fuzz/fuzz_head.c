/* libFuzzer target for the HEAD parser (ferry__sync_head_parse): HEAD is written by
 * anyone with write access to the bucket, so its text is hostile.
 * Contract: a refusal is FERRY_ERR_SYNC_MANIFEST with a message naming the
 * key; an accepted HEAD has a version in 1..FS_VERSION_MAX, and writing it
 * again (ferry__sync_head_json) parses back to the same record.  A broken rule
 * aborts.  Seeds: tests/fuzz/corpus/head (tests/golden-errors/records/make.py);
 * after `make fuzz`:
 *   mkdir -p /tmp/fzh && ./build-fuzz/fuzz_head -max_total_time=600 -dict=tests/fuzz/fuzz_records.dict /tmp/fzh tests/fuzz/corpus/head */
#include "fuzz_records.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > FS_JSON_MAX) return 0; /* get_small refuses these before parsing */
    const char *key = FZ_RUN "/HEAD";
    fs_head h;
    int rc = ferry__sync_head_parse(FZ_RUN, key, data, size, &h);
    if (rc) {
        require_failure(rc, key);
        return 0;
    }
    require_version(h.version);
    require(h.kind == FERRY_SYNC_ANCHOR || h.kind == FERRY_SYNC_DELTA);
    char mkey[FS_KEY_CAP];
    ferry__sync_key_version(mkey, FZ_RUN, h.version, h.id, FS_OBJ_MANIFEST);
    char *text = ferry__sync_head_json(FZ_RUN, &h, mkey);
    require(text != NULL);
    fs_head h2;
    require(ferry__sync_head_parse(FZ_RUN, key, text, strlen(text), &h2) == FERRY_OK);
    require(!memcmp(&h, &h2, sizeof h));
    free(text);
    return 0;
}
