/* libFuzzer target for the manifest parser (ferry__sync_manifest_parse): manifests
 * are written by anyone with write access to the bucket.
 * Contract: a refusal is FERRY_ERR_SYNC_MANIFEST with a message naming the
 * key; an accepted manifest has versions in 1..FS_VERSION_MAX and links that
 * describe a lineage (prev = version - 1, anchor at or below the version),
 * and writing it again (ferry__sync_manifest_json) parses back to the same record.
 * A broken rule aborts.  Seeds: tests/fuzz/corpus/manifest; after `make fuzz`:
 *   mkdir -p /tmp/fzm && ./build-fuzz/fuzz_manifest -max_total_time=600 -dict=tests/fuzz/fuzz_records.dict /tmp/fzm tests/fuzz/corpus/manifest */
#include "fuzz_records.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > FS_JSON_MAX) return 0;
    const char *key = FZ_RUN "/v/manifest.json";
    fs_manifest m;
    int rc = ferry__sync_manifest_parse(FZ_RUN, key, data, size, &m);
    if (rc) {
        require_failure(rc, key);
        return 0;
    }
    require_version(m.version);
    require(m.version == 1 ? m.prev.version == 0 : m.prev.version == m.version - 1);
    require(m.anchor.ref.version >= 1 && m.anchor.ref.version <= m.version);
    require(m.prev_anchor.ref.version < m.anchor.ref.version);
    char *text = ferry__sync_manifest_json(FZ_RUN, &m);
    require(text != NULL);
    fs_manifest m2;
    require(ferry__sync_manifest_parse(FZ_RUN, key, text, strlen(text), &m2) == FERRY_OK);
    require(!memcmp(&m, &m2, sizeof m));
    free(text);
    return 0;
}
