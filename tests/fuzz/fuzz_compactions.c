/* libFuzzer target for the compaction index parser (ferry__sync_index_parse):
 * RUN/compactions.json is written by anyone with write access to the bucket.
 * Contract: a refusal is FERRY_ERR_SYNC_MANIFEST (or NOMEM) with a message
 * naming the key and leaves an empty index; an accepted index has entries
 * with 1 <= from < to <= FS_VERSION_MAX, and writing it again
 * (ferry__sync_index_json) parses back to the same entries.  A broken rule aborts.
 * Seeds: tests/fuzz/corpus/compactions; after `make fuzz`:
 *   mkdir -p /tmp/fzc && ./build-fuzz/fuzz_compactions -max_total_time=600 -dict=tests/fuzz/fuzz_records.dict /tmp/fzc tests/fuzz/corpus/compactions */
#include "fuzz_records.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > FS_JSON_MAX) return 0;
    const char *key = FZ_RUN "/compactions.json";
    fs_index ix;
    int rc = ferry__sync_index_parse(FZ_RUN, key, data, size, &ix);
    if (rc) {
        require_failure(rc, key);
        require(ix.n == 0 && ix.c == NULL);
        return 0;
    }
    for (size_t i = 0; i < ix.n; i++) {
        require(ix.c[i].from >= 1 && ix.c[i].from < ix.c[i].to);
        require_version(ix.c[i].to);
        require(ix.c[i].from_cum <= ix.c[i].to_cum);
    }
    char *text = ferry__sync_index_json(FZ_RUN, &ix);
    require(text != NULL);
    fs_index ix2;
    require(ferry__sync_index_parse(FZ_RUN, key, text, strlen(text), &ix2) == FERRY_OK);
    require(ix2.n == ix.n && (!ix.n || !memcmp(ix.c, ix2.c, ix.n * sizeof *ix.c)));
    free(text);
    ferry__sync_index_release(&ix2);
    ferry__sync_index_release(&ix);
    return 0;
}
