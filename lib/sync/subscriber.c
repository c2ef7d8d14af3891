/* Subscriber: open, choose the target from HEAD, plan and retry, wait for
 * new versions.  Executing a path is steps.c; pricing paths is plan.c. */
#include "sub.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

int ferry_subscriber_open(ferry_store *store, const char *run, const ferry_subscriber_options *opts, ferry_subscriber **out)
{
    if (!store || !out) return ferry__fail(FERRY_ERR_ARG, "ferry_subscriber_open: NULL argument");
    *out = NULL;
    int rc = ferry_sync_run_check(run);
    if (rc) return rc;
    ferry_subscriber_options o = {0};
    if (opts) o = *opts;
    if ((rc = ferry__sign_ring_check(o.keys, "ferry_subscriber_open"))) return rc;
    char pin[FS_ID_CAP];
    if ((rc = ferry__sync_run_id_option(o.run_id, pin, "ferry_subscriber_open"))) return rc;
    if (o.path && o.model) return ferry__fail(FERRY_ERR_ARG, "ferry_subscriber_open: set path (file mode) or model (memory mode), not both");
    if (o.model_version && !o.model) return ferry__fail(FERRY_ERR_ARG, "ferry_subscriber_open: model_version without a model");
    if (o.concurrency > 64 || (o.chunk_size && (o.chunk_size < 4096 || o.chunk_size > (1ull << 30))))
        return ferry__fail(FERRY_ERR_ARG, "ferry_subscriber_open: concurrency %u (1..64) or chunk_size %llu (4 KiB..1 GiB) out of range",
                           o.concurrency, (unsigned long long)o.chunk_size);
    if (o.model)
        for (size_t i = 0; i < ferry_model_count(o.model); i++)
            if (!ferry_model_data_mut(o.model, i))
                return ferry__fail(FERRY_ERR_ARG, "ferry_subscriber_open: tensor '%.200s' of the caller's model is not writable",
                                   ferry_model_tensor(o.model, i)->name);
    ferry_subscriber *s = ferry__calloc(1, sizeof *s);
    if (!s) return FERRY_ERR_NOMEM;
    s->st = s->home = store;
    snprintf(s->run, sizeof s->run, "%s", run);
    s->mode = o.path ? SUB_FILE : o.model ? SUB_MEMORY : SUB_PRIVATE;
    s->threads = o.threads;
    s->concurrency = o.concurrency;
    s->chunk_size = o.chunk_size;
    s->poll_ms = o.poll_interval_ms ? o.poll_interval_ms : 1000;
    s->max_attempts = o.max_attempts ? o.max_attempts : 4;
    s->no_compactions = o.no_compactions;
    s->keys = o.keys;
    memcpy(s->pin, pin, FS_ID_CAP);
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    if ((o.path && !(s->path = ferry__strdup(o.path))) || (o.tmp_dir && !(s->tmp_dir = ferry__strdup(o.tmp_dir)))) {
        ferry_subscriber_free(s);
        return FERRY_ERR_NOMEM;
    }
    if (s->mode == SUB_FILE) {
        if ((rc = ferry__sync_local_open(s->path, s->run, &s->own, &s->cur))) {
            ferry_subscriber_free(s);
            return rc;
        }
        s->own_owned = true;
        /* PATH's state pins its run: a restart is no way into another run */
        if (s->cur.version && s->cur.run_id[0]) {
            if ((rc = ferry__sync_run_id_pinned(s->run, s->pin, s->cur.run_id, s->path, s->cur.version, "subscriber (run_id option)"))) {
                ferry_subscriber_free(s);
                return rc;
            }
            memcpy(s->pin, s->cur.run_id, FS_ID_CAP);
        }
    } else if (s->mode == SUB_MEMORY) {
        s->user = o.model;
        if (o.model_version) {
            /* the caller's word, checked against the store at the first sync */
            if ((rc = ferry_model_hash(o.model, s->cur.hash))) {
                ferry_subscriber_free(s);
                return rc;
            }
            s->cur.version = o.model_version;
            s->cur_unchecked = true;
            s->max_head = o.model_version; /* a restart is not a way back */
        }
    }
    *out = s;
    return FERRY_OK;
}

void ferry_subscriber_free(ferry_subscriber *s)
{
    if (!s) return;
    if (s->own_owned) ferry_model_free(s->own);
    ferry__sync_sub_changes_clear(s);
    free(s->path);
    free(s->tmp_dir);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

uint64_t ferry_subscriber_version(const ferry_subscriber *s) { return s && !s->cur_unchecked ? s->cur.version : 0; }

const char *ferry_subscriber_run_id(const ferry_subscriber *s) { return s ? s->pin : ""; }

int ferry_subscriber_hash(const ferry_subscriber *s, uint8_t out[16])
{
    if (!s || !out) return ferry__fail(FERRY_ERR_ARG, "ferry_subscriber_hash: NULL argument");
    if (!s->cur.version || s->cur_unchecked) return ferry__fail(FERRY_ERR_NOT_FOUND, "run %s: the subscriber holds no version", s->run);
    memcpy(out, s->cur.hash, 16);
    return FERRY_OK;
}

uint64_t ferry_subscriber_min_head(ferry_subscriber *s, uint64_t version)
{
    if (!s) return 0;
    if (version > s->max_head) s->max_head = version;
    return s->max_head;
}

const ferry_model *ferry_subscriber_model(const ferry_subscriber *s)
{
    if (!s || !s->cur.version) return NULL;
    return s->mode == SUB_MEMORY ? s->user : s->own;
}

void ferry_subscriber_get_stats(const ferry_subscriber *s, ferry_subscriber_stats *out)
{
    if (!s || !out) return;
    *out = s->stats;
    out->bytes_fetched = s->cnt.bytes;
    out->objects_fetched = s->cnt.objects;
    out->manifests_fetched = s->cnt.manifests;
}

void ferry__sync_sub_adopt(ferry_subscriber *s, ferry_model *model, bool owned, const fs_state *st)
{
    if (s->own_owned) ferry_model_free(s->own);
    s->own = model;
    s->own_owned = owned;
    s->own_writable = owned && model && (!ferry_model_count(model) || ferry_model_data_mut(model, 0));
    s->cur = *st;
    s->cur_off_lineage = false;
    s->cur_unchecked = false;
    ferry__sync_sub_changes_clear(s);
}

ferry_model *ferry__sync_sub_take(ferry_subscriber *s, fs_state *st)
{
    ferry_model *m = s->own;
    *st = s->cur;
    s->own = NULL;
    s->own_owned = false;
    memset(&s->cur, 0, sizeof s->cur);
    ferry__sync_sub_changes_clear(s);
    return m;
}

void ferry__sync_sub_state(const ferry_subscriber *s, fs_state *st) { *st = s->cur; }

/* ---- finding versions ---- */

static int get_m(ferry_subscriber *s, ferry_store *st, const char *run, const ferry_keys *keys, fs_count *cnt, const fs_ref *r,
                 fs_manifest *out)
{
    return s ? ferry__sync_sub_manifest(s, r->version, r->id, out) : ferry__sync_manifest_read(st, run, keys, r->version, r->id, cnt, out);
}

/* Walks down from HEAD: through anchor links while they stay above the
 * version wanted (about (N - T) / K reads), then through prev links. */
static int find_in(ferry_subscriber *s, ferry_store *st, const char *run, const ferry_keys *keys, const fs_head *h,
                   uint64_t version, fs_count *cnt, fs_manifest *out)
{
    fs_ref r = {h->version, ""};
    memcpy(r.id, h->id, FS_ID_CAP);
    fs_manifest m;
    int rc = get_m(s, st, run, keys, cnt, &r, &m);
    if (rc) return rc;
    while (m.version > version) {
        fs_ref next = m.prev;
        if (m.anchor.ref.version > version && m.anchor.ref.version < m.version) next = m.anchor.ref;
        else if (m.prev_anchor.ref.version > version) next = m.prev_anchor.ref;
        if ((rc = get_m(s, st, run, keys, cnt, &next, &m))) {
            if (rc != FERRY_ERR_STORE_NOT_FOUND) return rc;
            return ferry__fail(FERRY_ERR_SYNC_GONE,
                               "run %s: version %llu is no longer in the store (the manifest of version %llu is gone: "
                               "retention); HEAD is version %llu",
                               run, (unsigned long long)version, (unsigned long long)next.version, (unsigned long long)h->version);
        }
    }
    *out = m;
    return FERRY_OK;
}

int ferry__sync_find_manifest(ferry_store *st, const char *run, const ferry_keys *keys, const fs_head *head, uint64_t version,
                     fs_count *cnt, fs_manifest *out)
{
    return find_in(NULL, st, run, keys, head, version, cnt, out);
}

static int read_head(ferry_subscriber *s, fs_head *h, bool allow_below)
{
    /* A HEAD a wait read (verified, as here) less than one poll interval
     * ago is as fresh as polling makes any HEAD: the sync that follows
     * the wait need not pay another round trip for it.  Once only. */
    bool reuse = s->polled_ms && ferry__mono_ms() - s->polled_ms < s->poll_ms;
    s->polled_ms = 0;
    int rc = FERRY_OK;
    if (reuse) *h = s->poll_head[0];
    else rc = ferry__sync_head_read(s->st, s->run, s->keys, &s->cnt, h, NULL);
    if (rc == FERRY_ERR_STORE_NOT_FOUND)
        return ferry__fail(FERRY_ERR_SYNC_NOT_YET, "run %s: no version published yet (no %s/HEAD)", s->run, s->run);
    if (rc) return rc;
    if (h->version < s->max_head || (!allow_below && h->version < s->cur.version && !s->cur_unchecked))
        return ferry__fail(FERRY_ERR_SYNC_BACKWARDS,
                           "run %s: HEAD names version %llu, below version %llu seen before (store restored or run "
                           "recreated?): refused",
                           s->run, (unsigned long long)h->version,
                           (unsigned long long)(s->max_head > s->cur.version ? s->max_head : s->cur.version));
    /* (after the version check: a HEAD both older and foreign reads as
       what an island most needs to know, that HEAD went back) */
    if ((rc = ferry__sync_run_id_pinned(s->run, s->pin, h->run_id, "HEAD", h->version, "island"))) return rc;
    return FERRY_OK;
}

static int target_manifest(ferry_subscriber *s, const fs_head *h, uint64_t T, fs_manifest *out)
{
    if (T != h->version) {
        int rc = find_in(s, s->st, s->run, s->keys, h, T, &s->cnt, out);
        return rc ? rc : ferry__sync_run_id_agree(s->run, "the target's manifest", h->run_id, out->run_id);
    }
    /* HEAD's own copy of its manifest (verified as one fetched): no round trip */
    int rc = h->has_manifest ? (*out = h->manifest, FERRY_OK) : ferry__sync_sub_manifest(s, h->version, h->id, out);
    if (!rc && h->has_manifest) ferry__sync_sub_cache_put(s, out);
    if (!rc && (rc = ferry__sync_run_id_agree(s->run, "the manifest HEAD names", h->run_id, out->run_id))) return rc;
    if (rc == FERRY_ERR_STORE_NOT_FOUND)
        return ferry__fail(FERRY_ERR_SYNC_MANIFEST, "run %s: HEAD names version %llu, whose manifest is missing", s->run,
                           (unsigned long long)h->version);
    if (!rc && memcmp(out->model_hash, h->model_hash, 16))
        return ferry__fail(FERRY_ERR_SYNC_MANIFEST, "run %s: HEAD and the manifest of version %llu disagree on its model hash",
                           s->run, (unsigned long long)h->version);
    return rc;
}

/* Memory mode with a version claimed by the caller: compare the hash of
 * its buffers with that version's manifest; a mismatch means "none". */
static void check_claim(ferry_subscriber *s, const fs_head *h)
{
    fs_manifest m;
    s->cur_unchecked = false;
    if (s->cur.version <= h->version && !find_in(s, s->st, s->run, s->keys, h, s->cur.version, &s->cnt, &m) &&
        !memcmp(m.model_hash, s->cur.hash, 16)) {
        memcpy(s->cur.id, m.id, FS_ID_CAP);
        s->cur.cum = m.cum;
    } else {
        memset(&s->cur, 0, sizeof s->cur);
    }
    ferry__clear_error();
}

static void reject(ferry_subscriber *s, const char *key, ferry_sync_info *info)
{
    s->stats.rejected++;
    info->rejected++;
    snprintf(s->stats.last_rejection, sizeof s->stats.last_rejection, "%s", ferry_last_error());
    if (!key[0]) return;
    for (size_t i = 0; i < s->nbad; i++)
        if (!strcmp(s->bad[i], key)) return;
    snprintf(s->bad[s->bad_next], FS_KEY_CAP, "%s", key);
    s->bad_next = (s->bad_next + 1) % SUB_BAD;
    if (s->nbad < SUB_BAD) s->nbad++;
}

static bool is_bad(const ferry_subscriber *s, const char *key)
{
    for (size_t i = 0; i < s->nbad; i++)
        if (!strcmp(s->bad[i], key)) return true;
    return false;
}

/* Compactions that can lead to T and have not been rejected. */
static int load_compactions(ferry_subscriber *s, const fs_manifest *T, fs_index *ix)
{
    int rc = ferry__sync_index_read(s->st, s->run, s->keys, &s->cnt, ix, NULL);
    if (!rc && (rc = ferry__sync_run_id_agree(s->run, "the compaction index", T->run_id, ix->run_id)))
        ferry__sync_index_release(ix); /* another run's index: its entries name versions not ours */
    if (rc == FERRY_ERR_SYNC_MANIFEST || rc == FERRY_ERR_SYNC_FOREIGN || fs_sig_error(rc)) {
        /* a broken, unsigned, forged or foreign index only costs the shortcuts */
        snprintf(s->stats.last_rejection, sizeof s->stats.last_rejection, "%s", ferry_last_error());
        s->stats.rejected++;
        ferry__clear_error();
        return FERRY_OK;
    }
    if (rc) return rc;
    size_t k = 0;
    for (size_t i = 0; i < ix->n; i++) {
        char key[FS_KEY_CAP];
        ferry__sync_key_compact(key, s->run, ix->c[i].from, ix->c[i].to, ix->c[i].id);
        if (ix->c[i].to <= T->version && !is_bad(s, key)) ix->c[k++] = ix->c[i];
    }
    ix->n = k;
    return FERRY_OK;
}

typedef struct target {
    fs_head h;
    fs_manifest m;
} target;

/* Reads HEAD and the target's manifest; *done when nothing is to do. */
static int choose(ferry_subscriber *s, int mode, uint64_t version, target *t, bool *done, ferry_sync_info *info)
{
    *done = false;
    int rc = read_head(s, &t->h, mode == FERRY_SYNC_EXACT);
    if (rc) return rc;
    info->head_version = t->h.version;
    uint64_t T = t->h.version;
    if (mode == FERRY_SYNC_MIN && t->h.version < version)
        return ferry__fail(FERRY_ERR_SYNC_NOT_YET, "run %s: version %llu asked for, HEAD is at %llu", s->run,
                           (unsigned long long)version, (unsigned long long)t->h.version);
    if (mode == FERRY_SYNC_EXACT) {
        if (version > t->h.version)
            return ferry__fail(FERRY_ERR_SYNC_NOT_YET, "run %s: version %llu asked for, HEAD is at %llu", s->run,
                               (unsigned long long)version, (unsigned long long)t->h.version);
        T = version;
    }
    if ((rc = target_manifest(s, &t->h, T, &t->m))) return rc;
    if (s->cur_unchecked) check_claim(s, &t->h);
    *done = s->cur.version == T && !strcmp(s->cur.id, t->m.id) && !memcmp(s->cur.hash, t->m.model_hash, 16);
    /* holding HEAD, no anchor download a killed pull left beside PATH can
       serve (the commit that drops them is not coming) */
    if (*done && T == t->h.version && s->mode == SUB_FILE) ferry__sync_local_drop_downloads(s->path, NULL);
    return FERRY_OK;
}

static int sync_run(ferry_subscriber *s, int mode, uint64_t version, ferry_sync_info *info)
{
    if (mode != FERRY_SYNC_LATEST && mode != FERRY_SYNC_MIN && mode != FERRY_SYNC_EXACT)
        return ferry__fail(FERRY_ERR_ARG, "ferry_subscriber_sync: unknown mode %d", mode);
    if (mode == FERRY_SYNC_EXACT && !version) return ferry__fail(FERRY_ERR_ARG, "ferry_subscriber_sync: exact version 0");
    if (mode == FERRY_SYNC_MIN && s->cur.version && !s->cur_unchecked && s->cur.version >= version) {
        info->to_version = s->cur.version;
        return FERRY_OK;
    }
    target t;
    bool done, retargeted = false;
    int rc = choose(s, mode, version, &t, &done, info);
    if (rc || done) return rc;
    /* a state found not to be on the target's lineage: no chain from it */
    bool off = s->cur_off_lineage;
    fs_state off_state = s->cur;
    /* a sync that fails leaves the version held before it (the whole route,
       not only its last step: steps.c keeps what in-place steps overwrote) */
    const fs_state start = s->cur;
    const bool start_off = s->cur_off_lineage;

    sub_work w = {0};
    w.m = s->mode == SUB_MEMORY ? s->user : s->own;
    w.held = s->mode != SUB_FILE;
    w.writable = s->mode == SUB_MEMORY || (s->mode == SUB_PRIVATE && s->own_owned && s->own_writable);
    w.st = s->cur;
    fs_index ix = {0};
    bool ix_read = false, ix_dropped = false;
    uint64_t bad_d[SUB_BAD], bad_f[SUB_BAD];

    for (uint32_t attempt = 0;; attempt++) {
        if (attempt >= s->max_attempts) {
            rc = ferry__fail(FERRY_ERR_SYNC_NO_PATH, "run %s: no verified path to version %llu after %u attempts; last rejected: %.400s",
                             s->run, (unsigned long long)t.m.version, attempt, s->stats.last_rejection);
            break;
        }
        bool usable = w.st.version && !(off && w.st.version == off_state.version && !strcmp(w.st.id, off_state.id));
        bool chain_of_one = usable && w.st.version + 1 == t.m.version;
        if (!ix_read && !ix_dropped && !s->no_compactions && !chain_of_one) {
            if ((rc = load_compactions(s, &t.m, &ix))) break;
            ix_read = true;
        }
        size_t nd = 0, nf = 0, kc = 0;
        for (size_t i = 0; i < ix.n; i++) { /* drop compactions rejected since the index was read */
            char key[FS_KEY_CAP];
            ferry__sync_key_compact(key, s->run, ix.c[i].from, ix.c[i].to, ix.c[i].id);
            if (!is_bad(s, key)) ix.c[kc++] = ix.c[i];
        }
        ix.n = kc;
        for (size_t i = 0; i < s->nbad; i++) {
            fs_key_info ki;
            ferry__sync_key_parse(s->run, s->bad[i], &ki);
            if (ki.kind == FS_OBJ_DELTA || ki.kind == FS_OBJ_MANIFEST) bad_d[nd++] = ki.version;
            if (ki.kind == FS_OBJ_FULL || ki.kind == FS_OBJ_MANIFEST) bad_f[nf++] = ki.version;
        }
        fs_plan_in in = {&w.st, usable, &t.m, ix.c, ix.n, bad_d, nd, bad_f, nf};
        fs_plan p;
        if (!ferry__sync_plan_pick(&in, &p, &info->chain_bytes, &info->anchor_bytes, &info->compacted_bytes)) {
            rc = ferry__fail(FERRY_ERR_SYNC_NO_PATH, "run %s: no verified path to version %llu is left; last rejected: %.400s", s->run,
                             (unsigned long long)t.m.version, s->stats.last_rejection[0] ? s->stats.last_rejection : "none");
            break;
        }
        info->planned_bytes = p.bytes;
        snprintf(info->path, sizeof info->path, "%s", p.desc);
        char badkey[FS_KEY_CAP];
        bool lineage = false;
        rc = ferry__sync_sub_exec(s, &w, &p, &t.m, ix.c, badkey, &lineage, &info->steps);
        if (!rc) {
            memcpy(w.st.run_id, t.h.run_id, FS_ID_CAP); /* kept in PATH's state: the pin after a restart */
            rc = ferry__sync_sub_commit(s, &w);
            if (!rc && s->cur.version > s->max_head) s->max_head = s->cur.version;
            if (!rc && t.h.run_id[0]) memcpy(s->pin, t.h.run_id, FS_ID_CAP);
            break;
        }
        if (!ferry__sync_object_error(rc)) break;
        if (lineage) {
            off = true;
            off_state = w.st;
            if (w.st.version == s->cur.version && !strcmp(w.st.id, s->cur.id)) s->cur_off_lineage = true;
            s->stats.rejected++;
            info->rejected++;
            snprintf(s->stats.last_rejection, sizeof s->stats.last_rejection, "%s", ferry_last_error());
        } else {
            reject(s, badkey, info);
            fs_key_info ki;
            ferry__sync_key_parse(s->run, badkey, &ki);
            if (ki.kind == FS_KEY_COMPACT) {
                /* A shortcut failed: the index is dropped for the rest of
                   this sync.  Whoever can write it can list any number of
                   well-formed entries whose objects are absent or bad, each
                   costing an attempt, while the chain needs no index. */
                ferry__sync_index_release(&ix);
                ix_dropped = true;
            }
        }
        if (rc == FERRY_ERR_STORE_NOT_FOUND && mode != FERRY_SYNC_EXACT && !retargeted) {
            /* something vanished (a GC since HEAD was read): start again
             * from the HEAD of now */
            retargeted = true;
            target t2;
            bool done2;
            if ((rc = choose(s, mode, version, &t2, &done2, info))) break;
            if (done2) break;
            if (t2.m.version != t.m.version) {
                t = t2;
                ferry__sync_index_release(&ix);
                ix_read = false;
            }
        }
    }
    ferry__sync_index_release(&ix);
    if (rc) ferry__sync_sub_work_undo(s, &w, &start, start_off);
    /* frees whatever the sync built and did not commit (after a commit,
     * or with w still the subscriber's own model, there is nothing) */
    ferry__sync_sub_work_release(s, &w);
    return rc;
}

int ferry_subscriber_sync(ferry_subscriber *s, int mode, uint64_t version, ferry_sync_info *info)
{
    if (!s) return ferry__fail(FERRY_ERR_ARG, "ferry_subscriber_sync: NULL subscriber");
    ferry_sync_info local;
    if (!info) info = &local;
    memset(info, 0, sizeof *info);
    info->from_version = ferry_subscriber_version(s);
    info->chain_bytes = info->anchor_bytes = info->compacted_bytes = UINT64_MAX;
    snprintf(info->path, sizeof info->path, "none");
    uint64_t b0 = s->cnt.bytes;
    s->stats.syncs++;
    s->refetched = 0;
    ferry__sync_sub_changes_clear(s);
    int rc = ferry__sync_sub_sync_stores(s, mode, version, info, sync_run);
    info->to_version = ferry_subscriber_version(s);
    info->bytes_fetched = s->cnt.bytes - b0;
    return rc;
}

/* ---- waiting for new versions ---- */

int ferry_subscriber_wait(ferry_subscriber *s, uint64_t after_version, uint64_t timeout_ms, uint64_t *head)
{
    if (!s) return ferry__fail(FERRY_ERR_ARG, "ferry_subscriber_wait: NULL subscriber");
    uint64_t t0 = ferry__mono_ms();
    for (;;) {
        fs_head h;
        uint64_t hv = 0;
        int rc = ferry__sync_sub_head_poll(s, &h);
        if (!rc) hv = h.version;
        else if (rc == FERRY_ERR_STORE_NOT_FOUND) ferry__clear_error();
        else return rc;
        if (head) *head = hv;
        if (hv > after_version) {
            if (!s->nalt) s->polled_ms = ferry__mono_ms(); /* h is poll_head[0]; with a store list another store may be the one synced from */
            return FERRY_OK;
        }
        pthread_mutex_lock(&s->mu);
        uint64_t el = ferry__mono_ms() - t0;
        if (!s->woken && el < timeout_ms) {
            uint64_t wait = timeout_ms - el < s->poll_ms ? timeout_ms - el : s->poll_ms;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_sec += (time_t)(wait / 1000);
            ts.tv_nsec += (long)(wait % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            while (!s->woken && pthread_cond_timedwait(&s->cv, &s->mu, &ts) != ETIMEDOUT) {}
        }
        bool woken = s->woken;
        s->woken = false;
        pthread_mutex_unlock(&s->mu);
        if (woken) return FERRY_OK;
        /* past the deadline: HEAD was read once more after the last sleep */
        if (el >= timeout_ms)
            return ferry__fail(FERRY_ERR_SYNC_TIMEOUT, "run %s: no version above %llu within %llu ms (HEAD is at %llu)", s->run,
                               (unsigned long long)after_version, (unsigned long long)timeout_ms, (unsigned long long)hv);
    }
}

void ferry_subscriber_wake(ferry_subscriber *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->woken = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}
