/* The run log: HEAD's lineage as far back as the store still holds it. */
#include "sync_impl.h"

#include <stdlib.h>

static void version_info(const fs_manifest *m, ferry_version_info *v)
{
    memset(v, 0, sizeof *v);
    v->version = m->version;
    v->kind = m->kind;
    v->base_version = m->prev.version;
    v->anchor_version = m->anchor.ref.version;
    v->delta_bytes = m->delta_bytes;
    v->full_bytes = m->full_bytes;
    v->model_bytes = m->model_bytes;
    v->created = m->created;
    memcpy(v->model_hash, m->model_hash, 16);
    memcpy(v->id, m->id, FS_ID_CAP);
    snprintf(v->publisher, sizeof v->publisher, "%s", m->publisher);
}

int ferry_run_log_read(ferry_store *store, const char *run, uint64_t max_versions, ferry_run_log **out)
{
    return ferry_run_log_read_keys(store, run, max_versions, NULL, out);
}

int ferry_run_log_read_keys(ferry_store *store, const char *run, uint64_t max_versions, const ferry_keys *keys,
                            ferry_run_log **out)
{
    if (!store || !out) return ferry__fail(FERRY_ERR_ARG, "ferry_run_log_read: NULL argument");
    *out = NULL;
    int rc = ferry_sync_run_check(run);
    if (rc) return rc;
    fs_head h;
    if ((rc = ferry__sync_head_read(store, run, keys, NULL, &h, NULL))) {
        if (rc == FERRY_ERR_STORE_NOT_FOUND) return ferry__fail(FERRY_ERR_SYNC_NOT_YET, "run %s: no version published yet", run);
        return rc;
    }
    ferry_run_log *log = ferry__calloc(1, sizeof *log);
    if (!log) return FERRY_ERR_NOMEM;
    log->head = h.version;
    snprintf(log->head_publisher, sizeof log->head_publisher, "%s", h.publisher);
    memcpy(log->run_id, h.run_id, FS_ID_CAP);
    size_t cap = 0;
    fs_ref r = {h.version, ""};
    memcpy(r.id, h.id, FS_ID_CAP);
    while (r.version && (!max_versions || log->count < max_versions)) {
        fs_manifest m;
        rc = ferry__sync_manifest_links(store, run, keys, r.version, r.id, &m); /* either format */
        if (rc == FERRY_ERR_STORE_NOT_FOUND && r.version != h.version) { /* retention: older versions are gone */
            ferry__clear_error();
            rc = FERRY_OK;
            break;
        }
        if (rc) goto fail;
        if ((rc = ferry__grow((void **)&log->versions, &cap, log->count + 1, sizeof *log->versions))) goto fail;
        version_info(&m, &log->versions[log->count++]);
        r = m.prev;
    }
    for (size_t i = 0; i < log->count / 2; i++) { /* oldest first */
        ferry_version_info t = log->versions[i];
        log->versions[i] = log->versions[log->count - 1 - i];
        log->versions[log->count - 1 - i] = t;
    }
    fs_index ix;
    if ((rc = ferry__sync_index_read(store, run, keys, NULL, &ix, NULL))) goto fail;
    if (ix.n && !(log->compactions = ferry__calloc(ix.n, sizeof *log->compactions))) {
        ferry__sync_index_release(&ix);
        rc = FERRY_ERR_NOMEM;
        goto fail;
    }
    for (size_t i = 0; i < ix.n; i++) {
        ferry_compaction_info *c = &log->compactions[i];
        c->from = ix.c[i].from;
        c->to = ix.c[i].to;
        c->bytes = ix.c[i].bytes;
        c->chain_bytes = ix.c[i].to_cum - ix.c[i].from_cum;
        /* a sharded entry names no object of its own: rank 0's */
        if ((c->objects = ix.c[i].world)) ferry__sync_key_compact_rank(c->key, run, ix.c[i].from, ix.c[i].to, ix.c[i].id, 0);
        else ferry__sync_key_compact(c->key, run, ix.c[i].from, ix.c[i].to, ix.c[i].id);
    }
    log->ncompactions = ix.n;
    log->verified = ferry__sign_keys_enforce(keys);
    ferry__sync_index_release(&ix);
    *out = log;
    return FERRY_OK;
fail:
    ferry_run_log_free(log);
    return rc;
}

void ferry_run_log_free(ferry_run_log *log)
{
    if (!log) return;
    free(log->versions);
    free(log->compactions);
    free(log);
}
