/* Run identity (docs/PROTOCOL.md "Run identity"): a run name says where a
 * run lives, its run id which run it is.  The id is drawn at version 1 and
 * signed into every record; a handle that has seen a version pins it, so a
 * version of another run put under this name (copied from another store or
 * prefix, signed by the same key, or a run restarted at version 1) is
 * refused by name, both ids given. */
#include "sync_impl.h"

int ferry__sync_run_id_option(const char *opt, char out[FS_ID_CAP], const char *who)
{
    out[0] = 0;
    if (!opt || !*opt) return FERRY_OK;
    if (strlen(opt) != FERRY_SYNC_ID_LEN || !ferry__sync_id_valid(opt))
        return ferry__fail(FERRY_ERR_ARG, "%s: run id '%.40s' is not %d lowercase hex digits", who, opt, FERRY_SYNC_ID_LEN);
    memcpy(out, opt, FS_ID_CAP);
    return FERRY_OK;
}

int ferry__sync_run_id_pinned(const char *run, const char *pinned, const char *found, const char *what, uint64_t version,
                              const char *holder)
{
    if (!pinned[0] || !strcmp(pinned, found)) return FERRY_OK;
    return ferry__fail(FERRY_ERR_SYNC_FOREIGN,
                       "run %s: %s names version %llu of run id %s, but this %s is pinned to run id %s: a version of another "
                       "run (copied from another store or prefix, or the run restarted) is refused",
                       run, what, (unsigned long long)version, found[0] ? found : "(none: written before run ids)", holder, pinned);
}

int ferry__sync_run_id_agree(const char *run, const char *key, const char *head_run_id, const char *record_run_id)
{
    /* a record written before run ids ("") may sit under a HEAD that has
       one (the run continued by a newer publisher); two ids never differ */
    if (!record_run_id[0] || !strcmp(head_run_id, record_run_id)) return FERRY_OK;
    return ferry__fail(FERRY_ERR_SYNC_FOREIGN, "run %s: %s is of run id %s, HEAD of run id %s: records of two runs mixed", run,
                       key, record_run_id, head_run_id[0] ? head_run_id : "(none)");
}

int ferry__sync_versions_listed(ferry_store *st, const char *run, uint64_t *newest, size_t *count)
{
    *newest = 0;
    *count = 0;
    char prefix[FS_KEY_CAP];
    snprintf(prefix, sizeof prefix, "%s/v/", run);
    ferry_store_listing *l = NULL;
    int rc = ferry_store_list(st, prefix, &l);
    if (rc) return rc;
    for (size_t i = 0; i < l->count; i++) {
        fs_key_info ki;
        ferry__sync_key_parse(run, l->entries[i].key, &ki);
        if (ki.kind != FS_OBJ_MANIFEST) continue;
        (*count)++;
        if (ki.version > *newest) *newest = ki.version;
    }
    ferry_store_listing_free(l);
    return FERRY_OK;
}

int ferry__sync_head_gone_check(ferry_store *st, const char *run, const fs_state *cached, const char *cache_path)
{
    uint64_t newest;
    size_t n;
    int rc = ferry__sync_versions_listed(st, run, &newest, &n);
    if (rc) return ferry__context(rc, "run %s: HEAD is absent; listing %s/v/ to tell a new run from a deleted HEAD", run, run);
    if (!n && !cached->version) return FERRY_OK; /* a new run */
    char also[512] = "";
    if (cached->version)
        snprintf(also, sizeof also, "%sthe cache %s holds version %llu%s%s", n ? "; " : "", cache_path ? cache_path : "",
                 (unsigned long long)cached->version, cached->run_id[0] ? " of run id " : "", cached->run_id);
    char listed[160] = "";
    if (n) snprintf(listed, sizeof listed, "%s/v/ holds %zu manifest(s), up to version %llu", run, n, (unsigned long long)newest);
    return ferry__fail(FERRY_ERR_SYNC_BACKWARDS,
                       "run %s: HEAD is gone but the run has versions (%s%s): refused, a new version 1 would restart the "
                       "run under islands that hold its versions. Restore HEAD (ferry head-repair STORE --run %s --sign-key "
                       "KEY rewrites it to the newest version that verifies), or start the run anew on purpose "
                       "(--new-run, ferry_publisher_options.new_run)",
                       run, listed, also, run);
}
