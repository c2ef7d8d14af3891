/* Compaction: one delta from version `from` to version `to`, stored as an
 * extra object next to the versions' own, and announced in the run's
 * compaction index.  It changes nothing about the versions themselves, so
 * it can run beside a publisher; readers use it only when it is the
 * smallest path and check it like any delta (base and target hashes). */
#include "sync_impl.h"

#include <stdlib.h>

/* The verified model of one version, through a private subscriber that
 * may start from `start` (borrowed). */
static int build(ferry_store *st, const char *run, const ferry_compact_options *o, uint64_t version, ferry_model *start,
                 const fs_state *start_st, ferry_subscriber **sub)
{
    ferry_subscriber_options so = {.threads = o->threads, .tmp_dir = o->tmp_dir, .keys = o->keys};
    int rc = ferry_subscriber_open(st, run, &so, sub);
    if (rc) return rc;
    if (start) ferry__sync_sub_adopt(*sub, start, false, start_st);
    return ferry_subscriber_sync(*sub, FERRY_SYNC_EXACT, version, NULL);
}

static int cmp_comp(const void *a, const void *b)
{
    const fs_compaction *x = a, *y = b;
    if (x->from != y->from) return x->from < y->from ? -1 : 1;
    if (x->to != y->to) return x->to < y->to ? -1 : 1;
    return 0;
}

typedef struct new_entry {
    const fs_compaction *c;
    const fs_cobj *obj;       /* c->world rank objects (a sharded compaction) */
    const char *run_id;       /* HEAD's: the run the index is of */
} new_entry;

/* Appends entry c (its rank objects from obj) to nx, renumbering obj0. */
static void put_entry(fs_index *nx, const fs_compaction *c, const fs_cobj *obj)
{
    fs_compaction *d = &nx->c[nx->n++];
    *d = *c;
    if (!c->world) return;
    memcpy(nx->obj + nx->nobj, obj, c->world * sizeof *obj);
    d->obj0 = nx->nobj;
    nx->nobj += c->world;
}

/* Adds c to the index, replacing an entry for the same range (its object
 * is then unreferenced and goes at the next GC).  An index of another run
 * id (a run restarted, an index copied in) names versions that are not
 * this run's: its entries are dropped, the index becomes this run's. */
static int add_entry(void *ctx, fs_index *ix, bool *write)
{
    const new_entry *e = ctx;
    const fs_compaction *c = e->c;
    *write = true;
    bool foreign = strcmp(ix->run_id, e->run_id) != 0 && ix->run_id[0];
    fs_index nx = {0};
    nx.c = ferry__calloc(ix->n + 1, sizeof *nx.c);
    nx.obj = ferry__calloc(ix->nobj + c->world + 1, sizeof *nx.obj);
    if (!nx.c || !nx.obj) {
        ferry__sync_index_release(&nx);
        return FERRY_ERR_NOMEM;
    }
    for (size_t i = 0; i < ix->n && !foreign; i++)
        if (ix->c[i].from != c->from || ix->c[i].to != c->to) put_entry(&nx, &ix->c[i], ix->c[i].world ? ix->obj + ix->c[i].obj0 : NULL);
    put_entry(&nx, c, e->obj);
    qsort(nx.c, nx.n, sizeof *nx.c, cmp_comp);
    ferry__sync_index_release(ix);
    *ix = nx;
    snprintf(ix->run_id, sizeof ix->run_id, "%s", e->run_id);
    return FERRY_OK;
}

int ferry__sync_compact_add(ferry_store *st, const char *run, const ferry_keys *keys, const char *run_id, const fs_compaction *c,
                            const fs_cobj *obj)
{
    new_entry ne = {c, obj, run_id};
    return ferry__sync_index_update(st, run, keys, add_entry, &ne);
}

int ferry_compact(ferry_store *store, const char *run, const ferry_compact_options *opts, ferry_compaction_info *out)
{
    if (!store) return ferry__fail(FERRY_ERR_ARG, "ferry_compact: NULL store");
    int rc = ferry_sync_run_check(run);
    if (rc) return rc;
    ferry_compact_options o = {0};
    if (opts) o = *opts;
    fs_head h;
    if ((rc = ferry__sync_head_read(store, run, o.keys, NULL, &h, NULL))) {
        if (rc == FERRY_ERR_STORE_NOT_FOUND) return ferry__fail(FERRY_ERR_SYNC_NOT_YET, "run %s: no version published yet", run);
        return rc;
    }
    uint64_t to = o.to ? o.to : h.version;
    if (to > h.version)
        return ferry__fail(FERRY_ERR_SYNC_NOT_YET, "run %s: version %llu asked for, HEAD is at %llu", run, (unsigned long long)to,
                           (unsigned long long)h.version);
    fs_manifest mto, mfrom;
    if ((rc = ferry__sync_find_manifest(store, run, o.keys, &h, to, NULL, &mto))) return rc;
    uint64_t from = o.from;
    if (!from) from = mto.anchor.ref.version < to ? mto.anchor.ref.version : mto.prev_anchor.ref.version;
    if (!from || from >= to)
        return ferry__fail(FERRY_ERR_ARG, "run %s: nothing to compact from version %llu to %llu", run, (unsigned long long)from,
                           (unsigned long long)to);
    if ((rc = ferry__sync_find_manifest(store, run, o.keys, &h, from, NULL, &mfrom))) return rc;

    ferry_subscriber *sa = NULL, *sb = NULL;
    void *patch = NULL;
    size_t psize = 0;
    fs_state sta;
    if ((rc = build(store, run, &o, from, NULL, NULL, &sa))) goto out;
    ferry__sync_sub_state(sa, &sta);
    const ferry_model *a = ferry_subscriber_model(sa);
    if ((rc = build(store, run, &o, to, (ferry_model *)a, &sta, &sb))) goto out;
    const ferry_model *b = ferry_subscriber_model(sb);
    ferry_diff_options d = {.level = o.level, .threads = o.threads, .base_hash = mfrom.model_hash};
    if ((rc = ferry_diff(a, b, &d, &patch, &psize))) goto out;
    fs_compaction c;
    memset(&c, 0, sizeof c);
    ferry_patch_info *pi = NULL;
    if ((rc = ferry_patch_inspect(patch, psize, &pi))) goto out;
    ferry_patch_info_hashes(pi, c.base_hash, c.target_hash);
    ferry_patch_info_free(pi);
    if (memcmp(c.base_hash, mfrom.model_hash, 16) || memcmp(c.target_hash, mto.model_hash, 16)) {
        rc = ferry__fail(FERRY_ERR_TARGET_MISMATCH, "run %s: the compacted delta %llu..%llu does not join the versions' hashes", run,
                         (unsigned long long)from, (unsigned long long)to);
        goto out;
    }
    c.from = from;
    c.to = to;
    memcpy(c.from_id, mfrom.id, FS_ID_CAP);
    memcpy(c.to_id, mto.id, FS_ID_CAP);
    c.bytes = psize;
    c.from_cum = mfrom.cum;
    c.to_cum = mto.cum;
    c.from_full_bytes = mfrom.kind == FERRY_SYNC_ANCHOR ? mfrom.full_bytes : 0;
    c.created = ferry__sync_now();
    if (ferry_keys_can_sign(o.keys)) {
        if ((rc = ferry__sha256(patch, psize, c.sha))) goto out;
        c.has_sha = true;
    }
    ferry__sync_new_id(c.id);
    char key[FS_KEY_CAP];
    ferry__sync_key_compact(key, run, from, to, c.id);
    /* the object is durable before the index names it */
    if ((rc = ferry_store_put(store, key, patch, psize, NULL))) goto out;
    if ((rc = ferry__sync_compact_add(store, run, o.keys, h.run_id, &c, NULL))) goto out;
    if (out) {
        memset(out, 0, sizeof *out);
        out->from = from;
        out->to = to;
        out->bytes = psize;
        out->chain_bytes = mto.cum - mfrom.cum;
        snprintf(out->key, sizeof out->key, "%s", key);
    }
out:
    ferry_free(patch);
    ferry_subscriber_free(sb); /* before sa: sb borrowed sa's model */
    ferry_subscriber_free(sa);
    if (rc) ferry__context(rc, "run %s: compacting %llu..%llu", run, (unsigned long long)from, (unsigned long long)to);
    return rc;
}
