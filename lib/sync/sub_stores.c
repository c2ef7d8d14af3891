/* Store lists of a subscriber (docs/MIRROR.md, "Islands with several
 * stores"): a sync runs on the preferred store and falls back to the next
 * one when the preferred is down, behind, or serves what does not verify.
 * The stores hold byte-identical copies of one run (mirrors), so manifests
 * cached from one are valid for the others; rejected object keys are not
 * (a corrupt copy in a mirror says nothing of the upstream's), so they are
 * forgotten when the sync moves to another store. */
#include "sub.h"

/* Whether a sync that failed with rc on one store should try the next.
 * Every failure a store can cause is: one that is down, slow, refuses
 * (auth, any HTTP status, 416 to every range), redirects where a store
 * may not go (ftp://, https -> http: STORE_URL), holds what is not an
 * object (a link or FIFO at a key's place: STORE_CORRUPT, STORE_KEY), is
 * behind, or serves what does not verify: a hostile first store must not
 * disable the fallback (review of issue 23).  Failures of this process
 * stay fatal, as the next store would fail the same way: memory,
 * arguments, the local output (I/O: a full disk, an output refused), the
 * caller's cancel, the model's structure. */
bool ferry__sync_store_worth_next(int rc)
{
    if (rc >= FERRY_ERR_STORE_URL && rc <= FERRY_ERR_STORE_RANGE && rc != FERRY_ERR_STORE_CONFLICT &&
        rc != FERRY_ERR_STORE_READONLY)
        return true;
    switch (rc) {
    case FERRY_ERR_SYNC_NOT_YET:
    case FERRY_ERR_SYNC_GONE:
    case FERRY_ERR_SYNC_NO_PATH:
    case FERRY_ERR_SYNC_BACKWARDS:
        return true;
    default:
        return ferry__sync_object_error(rc) || fs_sig_error(rc); /* forged or unsigned in this store */
    }
}

int ferry__sync_sub_sync_stores(ferry_subscriber *s, int mode, uint64_t version, ferry_sync_info *info, sub_sync_fn fn)
{
    if (!s->nalt) {
        int rc = fn(s, mode, version, info);
        if (!rc) s->used = 0;
        return rc;
    }
    ferry_store *primary = s->st;
    char first[512] = "";
    int rc = FERRY_OK;
    for (size_t i = 0; i <= s->nalt; i++) {
        s->st = i ? s->alt[i - 1] : primary;
        if (i) s->nbad = s->bad_next = 0;
        rc = fn(s, mode, version, info);
        if (!rc) {
            s->used = (unsigned)i;
            break;
        }
        if (!i) snprintf(first, sizeof first, "%s", ferry_last_error());
        if (!ferry__sync_store_worth_next(rc) || i == s->nalt) break;
    }
    s->st = primary;
    s->nbad = s->bad_next = 0;
    if (rc && first[0] && ferry__sync_store_worth_next(rc))
        ferry__context(rc, "every store failed (the first, %s: %.400s); the last", ferry_store_url(primary), first);
    return rc;
}

int ferry__sync_sub_head_poll(ferry_subscriber *s, fs_head *h)
{
    int rc = FERRY_OK;
    for (size_t i = 0; i <= s->nalt; i++) {
        rc = ferry__sync_head_poll(i ? s->alt[i - 1] : s->st, s->run, s->keys, &s->cnt, &s->poll_head[i], s->poll_etag[i]);
        if (!rc) *h = s->poll_head[i];
        if (!rc || rc == FERRY_ERR_STORE_NOT_FOUND || !ferry__sync_store_worth_next(rc)) return rc;
    }
    return rc;
}

int ferry_subscriber_add_store(ferry_subscriber *s, ferry_store *store)
{
    if (!s || !store) return ferry__fail(FERRY_ERR_ARG, "ferry_subscriber_add_store: NULL argument");
    if (s->nalt + 1 >= FERRY_SYNC_STORES_MAX)
        return ferry__fail(FERRY_ERR_ARG, "ferry_subscriber_add_store: at most %d stores", FERRY_SYNC_STORES_MAX);
    s->alt[s->nalt++] = store;
    return FERRY_OK;
}

unsigned ferry_subscriber_store_used(const ferry_subscriber *s) { return s ? s->used : 0; }
unsigned ferry_subscriber_objects_refetched(const ferry_subscriber *s) { return s ? s->refetched : 0; }
