/* Writing HEAD: the one place that serialises, seals and compare-and-swaps
 * it, for the single-rank publisher and the sharded commit alike
 * (docs/PROTOCOL.md, "HEAD and compare-and-swap"). */
#include "sync_impl.h"

#include <stdlib.h>

void ferry__sync_head_init(fs_head *h, uint64_t version, const char *id, int kind, const uint8_t hash[16], const char *publisher)
{
    memset(h, 0, sizeof *h);
    h->version = version;
    memcpy(h->id, id, FS_ID_CAP);
    h->kind = kind;
    memcpy(h->model_hash, hash, 16);
    snprintf(h->publisher, sizeof h->publisher, "%s", publisher);
    h->time = ferry__sync_now();
}

int ferry__sync_head_swap(ferry_store *st, const char *run, const ferry_keys *keys, const fs_head *h, const char *expected_etag,
                 char new_etag[FERRY_STORE_ETAG_MAX])
{
    char key[FS_KEY_CAP], mkey[FS_KEY_CAP];
    ferry__sync_key_head(key, run);
    ferry__sync_key_version(mkey, run, h->version, h->id, FS_OBJ_MANIFEST);
    char *text = ferry__sync_head_json(run, h, mkey);
    if (!text) return FERRY_ERR_NOMEM;
    int rc = ferry__sync_record_seal(keys, &text); /* frees text on failure */
    if (rc) return rc;
    rc = ferry_store_cas(st, key, expected_etag, text, strlen(text), new_etag);
    free(text);
    return rc;
}
