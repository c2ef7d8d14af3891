/* Retention: delete what no retained version needs (docs/PROTOCOL.md,
 * "Retention").
 *
 * The retained set is computed from one reading of HEAD (version N): the
 * versions from A to N on HEAD's lineage, A being the anchor that version
 * max(1, N-keep+1) chains back to.  Why a publisher or compactor running
 * beside GC is safe: a new version is above N (kept: "above HEAD"), and a
 * newer HEAD's retained set lies within [A, new HEAD] since every version
 * chains back through its predecessor; a compaction in flight is an
 * unreferenced object younger than the grace period.  A reader still on a
 * dropped version meets a missing object, a clean error it answers by
 * going back to HEAD. */
#include "sync_impl.h"

#include <stdlib.h>

typedef struct gc {
    ferry_store *st;
    const char *run;
    const ferry_gc_options *o;
    ferry_gc_report *rep;
    uint64_t N, A;
    char (*ids)[FS_ID_CAP];      /* ids of versions A..N */
    int64_t grace, now;
    bool keep_index;             /* a mirror's DST: the index is SRC's bytes, never rewritten */
} gc;

static bool on_lineage(const gc *g, uint64_t v, const char *id)
{
    return v >= g->A && v <= g->N && !strcmp(g->ids[v - g->A], id);
}

/* Walks HEAD's lineage down to the anchor of version N-keep+1. */
static int retained(gc *g, const fs_head *h, uint64_t keep)
{
    uint64_t lowest = h->version >= keep ? h->version - keep + 1 : 1;
    size_t cap = 0, n = 0;
    fs_ref r = {h->version, ""};
    memcpy(r.id, h->id, FS_ID_CAP);
    uint64_t stop = lowest;
    char (*ids)[FS_ID_CAP] = NULL;
    int rc = FERRY_OK;
    while (r.version && r.version >= stop) {
        fs_manifest m;
        rc = ferry__sync_manifest_links(g->st, g->run, g->o->keys, r.version, r.id, &m); /* either format */
        if (rc == FERRY_ERR_STORE_NOT_FOUND && r.version != h->version) {
            /* an earlier GC kept less: what is there is all there is */
            ferry__clear_error();
            rc = FERRY_OK;
            break;
        }
        if (rc) break; /* never delete on a view we could not read */
        if ((rc = ferry__grow((void **)&ids, &cap, n + 1, sizeof *ids))) break;
        memcpy(ids[n++], m.id, FS_ID_CAP);
        if (m.version == lowest) stop = m.anchor.ref.version;
        r = m.prev;
    }
    if (rc) {
        free(ids);
        return rc;
    }
    /* ids[] runs from N down; store it from A up */
    g->A = h->version - n + 1;
    for (size_t i = 0; i < n / 2; i++) {
        char t[FS_ID_CAP];
        memcpy(t, ids[i], FS_ID_CAP);
        memcpy(ids[i], ids[n - 1 - i], FS_ID_CAP);
        memcpy(ids[n - 1 - i], t, FS_ID_CAP);
    }
    g->ids = ids;
    return FERRY_OK;
}

static bool keep_entry(const gc *g, const fs_compaction *c)
{
    if (c->to > g->N) return true; /* made after our HEAD read */
    return on_lineage(g, c->to, c->to_id) && c->from >= 1;
}

typedef struct prune {
    gc *g;
    fs_index *kept, *dropped;
} prune;

/* One reading of the index split into what GC keeps and drops (the kept
 * entries are what is written back, if anything was dropped). */
static int prune_edit(void *ctx, fs_index *ix, bool *write)
{
    prune *p = ctx;
    ferry__sync_index_release(p->kept);
    ferry__sync_index_release(p->dropped);
    fs_compaction *kc = ferry__calloc(ix->n + 1, sizeof *kc), *dc = ferry__calloc(ix->n + 1, sizeof *dc);
    if (!kc || !dc) {
        free(kc);
        free(dc);
        return FERRY_ERR_NOMEM;
    }
    size_t k = 0, d = 0;
    for (size_t i = 0; i < ix->n; i++) {
        if (keep_entry(p->g, &ix->c[i])) kc[k++] = ix->c[i];
        else dc[d++] = ix->c[i];
    }
    *p->kept = (fs_index){.c = kc, .n = k};
    *p->dropped = (fs_index){.c = dc, .n = d};
    for (size_t i = 0; i < k; i++) ix->c[i] = kc[i];
    ix->n = k;
    *write = d && !p->g->o->dry_run && !p->g->keep_index;
    return FERRY_OK;
}

/* Drops the index entries that end outside the retained set, by
 * compare-and-swap; *kept gets the index as written (or as it would be,
 * in a dry run). */
static int prune_index(gc *g, fs_index *kept, fs_index *dropped)
{
    *kept = *dropped = (fs_index){0};
    prune p = {g, kept, dropped};
    return ferry__sync_index_update(g->st, g->run, g->o->keys, prune_edit, &p);
}

static bool in_index(const fs_index *ix, const fs_key_info *ki)
{
    for (size_t i = 0; i < ix->n; i++)
        if (ix->c[i].from == ki->version && ix->c[i].to == ki->to && !strcmp(ix->c[i].id, ki->id)) return true;
    return false;
}

/* The decision for one key: 1 delete, 0 keep; *why says which rule. */
static int decide(const gc *g, const ferry_store_entry *e, const fs_index *kept, const fs_index *dropped, const char **why)
{
    fs_key_info ki;
    ferry__sync_key_parse(g->run, e->key, &ki);
    bool old = !e->stat.mtime || g->now - e->stat.mtime >= g->grace;
    switch (ki.kind) {
    case FS_KEY_HEAD: *why = "HEAD"; return 0;
    case FS_KEY_INDEX: *why = "compaction index"; return 0;
    case FS_KEY_OTHER: *why = "not a protocol key"; return 0;
    case FS_KEY_COMPACT:
        if (in_index(kept, &ki)) { *why = "compaction ending in the retained set"; return 0; }
        if (in_index(dropped, &ki)) { *why = "compaction ending before the retained set"; return 1; }
        if (!old) { *why = "unreferenced compaction, younger than the grace period"; return 0; }
        *why = "unreferenced compaction";
        return 1;
    default:
        if (ki.version > g->N) { *why = "above HEAD (a publish in flight)"; return 0; }
        if (on_lineage(g, ki.version, ki.id)) { *why = "retained version"; return 0; }
        if (ki.version < g->A) { *why = "version below the retained set"; return 1; }
        if (!old) { *why = "not on HEAD's lineage, younger than the grace period"; return 0; }
        *why = "not on HEAD's lineage (a crashed or losing publish)";
        return 1;
    }
}

int ferry_gc(ferry_store *store, const char *run, const ferry_gc_options *opts, ferry_gc_report *out)
{
    return ferry__sync_gc(store, run, opts, false, out);
}

int ferry__sync_gc(ferry_store *store, const char *run, const ferry_gc_options *opts, bool keep_index, ferry_gc_report *out)
{
    if (!store || !opts) return ferry__fail(FERRY_ERR_ARG, "ferry_gc: NULL argument");
    int rc = ferry_sync_run_check(run);
    if (rc) return rc;
    if (!opts->keep) return ferry__fail(FERRY_ERR_ARG, "ferry_gc: keep must be at least 1 (HEAD's version is always kept)");
    ferry_gc_report rep;
    memset(&rep, 0, sizeof rep);
    gc g = {store, run, opts, &rep, 0, 0, NULL, opts->grace_s == 0 ? 3600 : opts->grace_s < 0 ? 0 : opts->grace_s, ferry__sync_now(),
           keep_index};
    fs_head h;
    if ((rc = ferry__sync_head_read(store, run, opts->keys, NULL, &h, NULL))) {
        if (rc == FERRY_ERR_STORE_NOT_FOUND) return ferry__fail(FERRY_ERR_SYNC_NOT_YET, "run %s: no version published yet", run);
        return rc;
    }
    g.N = h.version;
    if ((rc = retained(&g, &h, opts->keep))) return ferry__context(rc, "run %s: GC", run);
    rep.head = g.N;
    rep.oldest_retained = g.A;
    fs_index kept = {0}, dropped = {0};
    ferry_store_listing *ls = NULL;
    char prefix[FS_KEY_CAP];
    snprintf(prefix, sizeof prefix, "%s/", run);
    if ((rc = prune_index(&g, &kept, &dropped))) goto out;
    rep.compactions_dropped = dropped.n;
    if ((rc = ferry_store_list(store, prefix, &ls))) goto out;
    /* objects first, manifests last: a reader then meets either a missing
     * manifest or a manifest whose object is missing, both clean errors */
    for (int pass = 0; pass < 2 && !rc; pass++) {
        for (size_t i = 0; i < ls->count; i++) {
            const ferry_store_entry *e = &ls->entries[i];
            fs_key_info ki;
            ferry__sync_key_parse(run, e->key, &ki);
            if ((ki.kind == FS_OBJ_MANIFEST) != (pass == 1)) continue;
            const char *why = "";
            int del = decide(&g, e, &kept, &dropped, &why);
            if (opts->on_object) opts->on_object(opts->user, e->key, e->stat.size, del, why);
            if (!del) {
                rep.objects_kept++;
                rep.bytes_kept += e->stat.size;
                continue;
            }
            if (!opts->dry_run && (rc = ferry_store_delete(store, e->key))) break;
            rep.objects_deleted++;
            rep.bytes_deleted += e->stat.size;
        }
    }
out:
    ferry_store_listing_free(ls);
    ferry__sync_index_release(&kept);
    ferry__sync_index_release(&dropped);
    free(g.ids);
    if (out) *out = rep;
    if (rc) ferry__context(rc, "run %s: GC", run);
    return rc;
}
