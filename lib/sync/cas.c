/* Compare-and-swap with retries: the one loop behind every record that is
 * replaced by CAS — HEAD (head.c, for the single-rank publisher and the
 * sharded commit), the compaction index (compaction adding an entry, GC
 * pruning it).  A refused swap is tried again after a growing wait (20,
 * 40, ... 640 ms) so that two writers that collide do not collide again
 * at once; what a refusal means beyond "try again" is the caller's
 * attempt's to say (docs/PROTOCOL.md, "HEAD and compare-and-swap"). */
#include "sync_impl.h"

#include <stdlib.h>

#define CAS_ATTEMPTS 10

int ferry__sync_cas_retry(int (*attempt)(void *ctx), void *ctx, const char *what)
{
    for (int i = 0; i < CAS_ATTEMPTS; i++) {
        if (i) ferry__sleep_ms(20u << (i - 1 < 5 ? i - 1 : 5));
        int rc = attempt(ctx);
        if (rc != FERRY_ERR_STORE_CONFLICT) return rc;
        ferry__clear_error();
    }
    return ferry__fail(FERRY_ERR_STORE_CONFLICT, "%s: still changing after %d compare-and-swap attempts (another writer)", what,
                       CAS_ATTEMPTS);
}

/* ---- the compaction index ---- */

typedef struct index_job {
    ferry_store *st;
    const char *run;
    const ferry_keys *keys;
    fs_index_edit edit;
    void *ctx;
} index_job;

static int index_attempt(void *p)
{
    index_job *j = p;
    char key[FS_KEY_CAP], etag[FERRY_STORE_ETAG_MAX];
    ferry__sync_key_index(key, j->run);
    fs_index ix;
    int rc = ferry__sync_index_read(j->st, j->run, j->keys, NULL, &ix, etag);
    if (rc) return rc;
    bool write = true;
    rc = j->edit(j->ctx, &ix, &write);
    char *text = !rc && write ? ferry__sync_index_json(j->run, &ix) : NULL;
    ferry__sync_index_release(&ix);
    if (rc || !write) return rc;
    if (!text) return FERRY_ERR_NOMEM;
    if ((rc = ferry__sync_record_seal(j->keys, &text))) return rc;
    /* readers take at most FS_JSON_MAX: a larger index would be read by
       no one again (not by GC either), so it is not written */
    size_t n = strlen(text);
    if (n > FS_JSON_MAX) {
        free(text);
        return ferry__fail(FERRY_ERR_LIMIT, "%s: %zu bytes with this edit, more than the %zu a reader takes: not written (ferry gc "
                           "drops entries; a sharded compaction lists one object per rank)", key, n, FS_JSON_MAX);
    }
    rc = ferry_store_cas(j->st, key, etag[0] ? etag : NULL, text, n, NULL);
    free(text);
    return rc;
}

int ferry__sync_index_update(ferry_store *st, const char *run, const ferry_keys *keys, fs_index_edit edit, void *ctx)
{
    char key[FS_KEY_CAP];
    ferry__sync_key_index(key, run);
    index_job j = {st, run, keys, edit, ctx};
    return ferry__sync_cas_retry(index_attempt, &j, key);
}
