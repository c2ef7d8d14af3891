/* Writing HEAD: the one place that serialises, seals and compare-and-swaps
 * it, and retries a refused swap, for the single-rank publisher and the
 * sharded commit alike (docs/PROTOCOL.md, "HEAD and compare-and-swap").
 * Reading it is ferry__sync_head_read (records.c), for every reader. */
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

/* ---- moving HEAD: ferry__sync_head_move ---- */

typedef struct head_job {
    ferry_store *st;
    const char *run, *who;
    const ferry_keys *keys;
    const fs_head *nh;
    const fs_ref *from;
    char *etag;
} head_job;

/* One swap; a refusal is read back: our own write that landed (the answer
 * lost) is success, HEAD still at `from` under a new etag is tried again
 * (STORE_CONFLICT to the retry loop), anything else is final. */
static int head_attempt(void *p)
{
    head_job *j = p;
    char new_etag[FERRY_STORE_ETAG_MAX];
    int rc = ferry__sync_head_swap(j->st, j->run, j->keys, j->nh, j->from->version ? j->etag : NULL, new_etag);
    if (!rc) memcpy(j->etag, new_etag, FERRY_STORE_ETAG_MAX);
    if (rc != FERRY_ERR_STORE_CONFLICT) return rc;
    ferry__clear_error();
    fs_head h;
    char etag[FERRY_STORE_ETAG_MAX];
    rc = ferry__sync_head_read(j->st, j->run, j->keys, NULL, &h, etag);
    if (rc == FERRY_ERR_STORE_NOT_FOUND) {
        if (!j->from->version) return FERRY_ERR_STORE_CONFLICT; /* created and deleted meanwhile: again */
        ferry__clear_error();
        return ferry__fail(FERRY_ERR_SYNC_BACKWARDS, "run %s: HEAD is gone; '%s' had it at version %llu: refused", j->run, j->who,
                           (unsigned long long)j->from->version);
    }
    if (rc) return rc;
    if (h.version == j->nh->version && !strcmp(h.id, j->nh->id)) {
        memcpy(j->etag, etag, FERRY_STORE_ETAG_MAX);
        return FERRY_OK;
    }
    if (j->from->version && h.version == j->from->version && !strcmp(h.id, j->from->id)) {
        memcpy(j->etag, etag, FERRY_STORE_ETAG_MAX);
        return FERRY_ERR_STORE_CONFLICT;
    }
    if (h.version < j->from->version)
        return ferry__fail(FERRY_ERR_SYNC_BACKWARDS,
                           "run %s: HEAD went back to version %llu (id %s, '%s'); '%s' had it at version %llu: refused", j->run,
                           (unsigned long long)h.version, h.id, h.publisher, j->who, (unsigned long long)j->from->version);
    return ferry__fail(FERRY_ERR_SYNC_CONFLICT,
                       "run %s: HEAD is at version %llu (id %s) published by '%s', not version %llu this publish by '%s' started from: "
                       "another publisher is writing this run (reopen to resume after it)",
                       j->run, (unsigned long long)h.version, h.id, h.publisher, (unsigned long long)j->from->version, j->who);
}

int ferry__sync_head_move(ferry_store *st, const char *run, const ferry_keys *keys, const fs_head *nh, const fs_ref *from,
                          const char *who, char etag[FERRY_STORE_ETAG_MAX])
{
    head_job j = {st, run, who, keys, nh, from, etag};
    char key[FS_KEY_CAP];
    ferry__sync_key_head(key, run);
    return ferry__sync_cas_retry(head_attempt, &j, key);
}
