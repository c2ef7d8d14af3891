/* ferry_head_repair: the owner's recovery after HEAD was deleted, forged
 * or rolled back (docs/SECURITY.md "Recovering HEAD").  The store listing
 * says which objects exist and how large; every manifest under RUN/v/ is
 * read once and verified against the ring's publisher keys; a version is
 * complete when the manifests down to its anchor verify and link and the
 * objects a reader needs (the anchor's full object, each delta above it)
 * are listed with their signed sizes.  HEAD becomes the newest complete
 * version, signed, by compare-and-swap. */
#include "sync_impl.h"

#include <stdlib.h>

typedef struct cand {
    uint64_t version;
    char id[FS_ID_CAP];
    uint64_t full_listed, delta_listed; /* bytes the listing shows for its objects */
    bool full_seen, delta_seen, has_manifest;
    int state;                          /* 0 not read, 1 verified, -1 refused */
    int complete;                       /* 0 not known, 1 yes, -1 no */
    fs_manifest m;
} cand;

typedef struct repair {
    ferry_store *st;
    const char *run;
    const ferry_keys *keys;
    cand *c;
    size_t n, cap;
    ferry_head_repair_info *info;
} repair;

static int cmp_cand(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->version != y->version) return x->version < y->version ? -1 : 1;
    return strcmp(x->id, y->id);
}

static cand *find(repair *r, uint64_t version, const char *id)
{
    cand key = {.version = version};
    snprintf(key.id, sizeof key.id, "%s", id);
    return bsearch(&key, r->c, r->n, sizeof *r->c, cmp_cand);
}

static cand *add(repair *r, uint64_t version, const char *id)
{
    for (size_t i = 0; i < r->n; i++) /* listings are sorted: only the last few can match */
        if (r->c[r->n - 1 - i].version != version) break;
        else if (!strcmp(r->c[r->n - 1 - i].id, id)) return &r->c[r->n - 1 - i];
    if (ferry__grow((void **)&r->c, &r->cap, r->n + 1, sizeof *r->c)) return NULL;
    cand *c = &r->c[r->n++];
    memset(c, 0, sizeof *c);
    c->version = version;
    memcpy(c->id, id, FS_ID_CAP);
    return c;
}

static void refuse(repair *r, const char *why)
{
    r->info->refused++;
    snprintf(r->info->last_refusal, sizeof r->info->last_refusal, "%s", why);
}

/* Every version named under RUN/v/, with the sizes of its objects. */
static int list_versions(repair *r)
{
    char prefix[FS_KEY_CAP];
    snprintf(prefix, sizeof prefix, "%s/v/", r->run);
    ferry_store_listing *l = NULL;
    int rc = ferry_store_list(r->st, prefix, &l);
    if (rc) return rc;
    for (size_t i = 0; !rc && i < l->count; i++) {
        const ferry_store_entry *e = &l->entries[i];
        fs_key_info ki;
        ferry__sync_key_parse(r->run, e->key, &ki);
        if (ki.kind != FS_OBJ_MANIFEST && ki.kind != FS_OBJ_FULL && ki.kind != FS_OBJ_DELTA && ki.kind != FS_KEY_SHARD) continue;
        cand *c = add(r, ki.version, ki.id);
        if (!c) {
            rc = FERRY_ERR_NOMEM;
            break;
        }
        size_t kl = strlen(e->key);
        bool full = ki.kind == FS_OBJ_FULL || (ki.kind == FS_KEY_SHARD && kl > 7 && !strcmp(e->key + kl - 7, ".anchor"));
        if (ki.kind == FS_OBJ_MANIFEST) {
            r->info->manifests++;
            c->has_manifest = true;
        } else if (full) {
            c->full_listed += e->stat.size;
            c->full_seen = true;
        } else {
            c->delta_listed += e->stat.size;
            c->delta_seen = true;
        }
    }
    ferry_store_listing_free(l);
    if (!rc && r->n) qsort(r->c, r->n, sizeof *r->c, cmp_cand);
    return rc;
}

/* Reads and verifies c's manifest (once). */
static bool verified(repair *r, cand *c)
{
    if (c->state) return c->state > 0;
    int rc = ferry__sync_manifest_links(r->st, r->run, r->keys, c->version, c->id, &c->m);
    if (!rc && c->m.kind == FERRY_SYNC_ANCHOR && !c->m.full_bytes)
        rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s/v/%020llu-%s.json: an anchor without a full object", r->run,
                         (unsigned long long)c->version, c->id);
    c->state = rc ? -1 : 1;
    if (rc) {
        refuse(r, ferry_last_error());
        ferry__clear_error();
    }
    return !rc;
}

/* Whether a reader can build c: the manifests down to its anchor verify,
 * link by (version, id) and agree on the run id, and the objects are listed
 * with their signed sizes. */
static bool complete(repair *r, cand *top, const char *run_id)
{
    if (top->complete) return top->complete > 0;
    char why[512] = "";
    cand *c = top;
    for (;;) {
        if (!c || !c->has_manifest || !verified(r, c)) {
            if (c && c->has_manifest) break; /* refused already, with its reason */
            snprintf(why, sizeof why, "run %s: version %llu: a manifest below it (on the way to its anchor) is missing", r->run,
                     (unsigned long long)top->version);
            break;
        }
        if (run_id[0] && c->m.run_id[0] && strcmp(c->m.run_id, run_id)) {
            snprintf(why, sizeof why, "run %s: version %llu is of run id %s, not %s", r->run, (unsigned long long)c->version,
                     c->m.run_id, run_id);
            break;
        }
        if (c->m.kind == FERRY_SYNC_ANCHOR) {
            if (!c->full_seen || c->full_listed != c->m.full_bytes)
                snprintf(why, sizeof why, "run %s: version %llu: the anchor's full object is missing or not of its signed size "
                         "(%llu bytes listed, %llu signed)", r->run, (unsigned long long)c->version,
                         (unsigned long long)c->full_listed, (unsigned long long)c->m.full_bytes);
            else top->complete = 1;
            break;
        }
        if (!c->delta_seen || c->delta_listed != c->m.delta_bytes) {
            snprintf(why, sizeof why, "run %s: version %llu: its delta is missing or not of its signed size (%llu bytes listed, "
                     "%llu signed)", r->run, (unsigned long long)c->version, (unsigned long long)c->delta_listed,
                     (unsigned long long)c->m.delta_bytes);
            break;
        }
        if (c->m.prev.version + 1 != c->version) break; /* the parser refuses this; never loop */
        c = find(r, c->m.prev.version, c->m.prev.id);
    }
    if (top->complete > 0) return true;
    top->complete = -1;
    if (why[0]) refuse(r, why);
    return false;
}

static void set_info(ferry_head_repair_info *info, const cand *c)
{
    info->version = c->version;
    memcpy(info->id, c->id, FS_ID_CAP);
    memcpy(info->run_id, c->m.run_id, FS_ID_CAP);
}

int ferry_head_repair(ferry_store *store, const char *run, const ferry_head_repair_options *opts, ferry_head_repair_info *out)
{
    ferry_head_repair_info local;
    ferry_head_repair_info *info = out ? out : &local;
    memset(info, 0, sizeof *info);
    if (!store || !opts) return ferry__fail(FERRY_ERR_ARG, "ferry_head_repair: NULL argument");
    int rc = ferry_sync_run_check(run);
    if (rc) return rc;
    if (!ferry_keys_can_sign(opts->keys) || !ferry_keys_publishers(opts->keys))
        return ferry__fail(FERRY_ERR_ARG, "ferry_head_repair: run %s: needs the publisher's signing key (the new HEAD is signed, "
                           "and only versions a publisher key signed are candidates)", run);
    char want[FS_ID_CAP];
    if ((rc = ferry__sync_run_id_option(opts->run_id, want, "ferry_head_repair"))) return rc;

    /* HEAD as it is: its etag (the swap's expectation), and whether it verifies */
    char hkey[FS_KEY_CAP];
    ferry__sync_key_head(hkey, run);
    ferry_store_stat hs;
    const char *expect = NULL;
    if (!(rc = ferry_store_head(store, hkey, &hs))) expect = hs.etag;
    else if (rc != FERRY_ERR_STORE_NOT_FOUND) return rc;
    ferry__clear_error();
    fs_head h;
    memset(&h, 0, sizeof h);
    if (expect) {
        int hr = ferry__sync_head_read(store, run, opts->keys, NULL, &h, NULL);
        if (!hr && want[0] && strcmp(h.run_id, want))
            hr = ferry__sync_run_id_pinned(run, want, h.run_id, "HEAD", h.version, "repair");
        info->head_state = hr ? 2 : 1;
        if (hr) {
            snprintf(info->head_error, sizeof info->head_error, "%s", ferry_last_error());
            ferry__clear_error();
        } else {
            info->head_before = h.version;
        }
    }

    repair r = {store, run, opts->keys, NULL, 0, 0, info};
    if ((rc = list_versions(&r))) goto out;
    /* without a run id: the versions that verify must be of one run (a HEAD
       that verifies says nothing: a copied one verifies too) */
    if (!want[0]) {
        for (size_t i = 0; i < r.n; i++) {
            cand *c = &r.c[i];
            if (!c->has_manifest || !verified(&r, c) || !c->m.run_id[0]) continue;
            if (!want[0]) memcpy(want, c->m.run_id, FS_ID_CAP);
            else if (strcmp(want, c->m.run_id)) {
                rc = ferry__fail(FERRY_ERR_SYNC_FOREIGN,
                                 "run %s: versions of two run ids verify (%s, and %s at version %llu): another run's were put "
                                 "here; give the run id of yours (--run-id, as `ferry log` or the publisher printed it)",
                                 run, want, c->m.run_id, (unsigned long long)c->version);
                goto out;
            }
        }
    }
    if (info->head_state == 1 && want[0] && h.run_id[0] && strcmp(h.run_id, want)) {
        info->head_state = 2;
        ferry__sync_run_id_pinned(run, want, h.run_id, "HEAD", h.version, "repair (run id of the versions listed)");
        snprintf(info->head_error, sizeof info->head_error, "%s", ferry_last_error());
        ferry__clear_error();
    }
    cand *best = NULL;
    for (size_t i = r.n; i-- > 0 && !best;)
        if (r.c[i].has_manifest && complete(&r, &r.c[i], want)) best = &r.c[i];
    if (!best) {
        rc = ferry__fail(FERRY_ERR_SYNC_NOT_YET, "run %s: no complete version that verifies (%llu manifests listed; last refused: %.300s)",
                         run, (unsigned long long)info->manifests, info->last_refusal[0] ? info->last_refusal : "none");
        goto out;
    }
    set_info(info, best);
    if (info->head_state == 1) {
        if (h.version >= best->version) {
            /* HEAD already names the newest complete version, or a newer one
               this listing shows as incomplete (not moved back: islands that
               took it would refuse a HEAD below it) */
            cand *hc = find(&r, h.version, h.id);
            if (h.version == best->version && !strcmp(h.id, best->id)) {
                set_info(info, best);
                goto out;
            }
            if (!hc || !complete(&r, hc, want)) {
                rc = ferry__fail(FERRY_ERR_SYNC_BACKWARDS,
                                 "run %s: HEAD verifies and names version %llu, which is no longer complete (%.300s); the newest "
                                 "complete version is %llu: HEAD is not moved back (islands that took %llu would refuse it): "
                                 "publish a new version",
                                 run, (unsigned long long)h.version, info->last_refusal, (unsigned long long)best->version,
                                 (unsigned long long)h.version);
                goto out;
            }
        }
    }
    if (opts->dry_run) goto out;
    fs_head nh;
    ferry__sync_head_init(&nh, best->version, best->id, best->m.kind, best->m.model_hash, "ferry-head-repair");
    memcpy(nh.run_id, best->m.run_id, FS_ID_CAP);
    rc = ferry__sync_head_swap(store, run, opts->keys, &nh, expect, NULL);
    if (rc == FERRY_ERR_STORE_CONFLICT)
        rc = ferry__fail(FERRY_ERR_SYNC_CONFLICT, "run %s: HEAD changed while it was repaired: read it again (ferry log) and rerun",
                         run);
    if (!rc) info->written = 1;
out:
    free(r.c);
    if (rc && rc != FERRY_ERR_SYNC_FOREIGN && rc != FERRY_ERR_SYNC_CONFLICT && rc != FERRY_ERR_SYNC_BACKWARDS)
        ferry__context(rc, "run %s: repairing HEAD", run);
    return rc;
}
