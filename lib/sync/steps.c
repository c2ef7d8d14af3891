/* Executing a path: downloading anchors and deltas, checking each object
 * against its manifest before use, applying, and committing the result.
 *
 * Checks per step (docs/PROTOCOL.md, "Verification"):
 *  - the object's size is the manifest's (a truncated or replaced object
 *    is refused before it is parsed);
 *  - a delta's header names the base hash the subscriber holds and the
 *    target hash the manifest gives the version (an object of another
 *    version is refused by name); ferry_apply then verifies the patch's
 *    checksum and the result's hash;
 *  - an anchor is hashed after download and compared with its manifest;
 *  - with trusted keys, every object's SHA-256 must be its signed
 *    manifest's (or the signed index's) before it is parsed: the model hash
 *    (XXH3) guards against accidents, the digest against a forger.
 * The model the subscriber exposes changes only to a verified version: in
 * place (returning with the verified target or with the base exactly as it
 * was, and keeping what it overwrote so that a failure at a later step of
 * the route puts back the version held before the sync), or
 * by an atomic rename, or by a copy of a verified model. */
#include "sub.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

/* Objects of a route from a list of stores (docs/MIRROR.md): each is
 * fetched from the store the sync runs on and, when that copy is refused
 * (does not verify, is missing, or the store fails), from the others in
 * turn.  They hold byte-identical copies of one run, so one bad object on
 * a mirror costs that object again, not the whole route from the origin
 * (issue 26).  A failure of this process (memory, the local output) is
 * not retried: another store would fail the same way. */
typedef int (*from_fn)(ferry_subscriber *s, ferry_store *st, void *arg);

static int on_stores(ferry_subscriber *s, from_fn fn, void *arg)
{
    int rc = fn(s, s->st, arg);
    if (!rc || !s->nalt || !ferry__sync_store_worth_next(rc)) return rc;
    int rc0 = rc;
    char first[512];
    snprintf(first, sizeof first, "%s", ferry_last_error());
    ferry_store *last = NULL;
    for (size_t i = 0; i <= s->nalt; i++) {
        ferry_store *o = i ? s->alt[i - 1] : s->home;
        if (o == s->st) continue;
        ferry__clear_error();
        if (!(rc = fn(s, o, arg))) {
            s->refetched++;
            return FERRY_OK;
        }
        if (!ferry__sync_store_worth_next(rc)) return rc;
        last = o;
    }
    return ferry__fail(rc0, "%s (refused on every store of the list; the last, %s: %.300s)", first, ferry_store_url(last),
                       ferry_last_error());
}

struct manifest_arg {
    uint64_t version;
    const char *id;
    fs_manifest *out;
};

static int manifest_from(ferry_subscriber *s, ferry_store *st, void *arg)
{
    struct manifest_arg *a = arg;
    return ferry__sync_manifest_read(st, s->run, s->keys, a->version, a->id, &s->cnt, a->out);
}

int ferry__sync_sub_manifest(ferry_subscriber *s, uint64_t version, const char *id, fs_manifest *out)
{
    for (size_t i = 0; i < s->ncache; i++)
        if (s->cache[i].version == version && !strcmp(s->cache[i].id, id)) {
            *out = s->cache[i];
            return FERRY_OK;
        }
    struct manifest_arg a = {version, id, out};
    int rc = on_stores(s, manifest_from, &a);
    if (!rc) ferry__sync_sub_cache_put(s, out);
    return rc;
}

void ferry__sync_sub_cache_put(ferry_subscriber *s, const fs_manifest *m)
{
    for (size_t i = 0; i < s->ncache; i++)
        if (s->cache[i].version == m->version && !strcmp(s->cache[i].id, m->id)) return;
    s->cache[s->cache_next] = *m;
    s->cache_next = (s->cache_next + 1) % SUB_CACHE;
    if (s->ncache < SUB_CACHE) s->ncache++;
}

/* Replaces the work model by m (owned by the sync from now on). */
static void work_replace(sub_work *w, ferry_model *m, char *staged)
{
    if (w->owned) ferry_model_free(w->m);
    if (w->staged) {
        unlink(w->staged);
        free(w->staged);
    }
    w->m = m;
    w->owned = true;
    w->held = false;
    w->writable = m && ferry_model_count(m) ? ferry_model_data_mut(m, 0) != NULL : true;
    w->staged = staged;
}

static void drop_undo(sub_work *w)
{
    for (size_t i = 0; i < w->nundo; i++) ferry__codec_undo_free(w->undo[i]);
    free(w->undo);
    w->undo = NULL;
    w->nundo = 0;
}

void ferry__sync_sub_work_undo(ferry_subscriber *s, sub_work *w, const fs_state *start, bool start_off_lineage)
{
    if (!w->nundo) return;
    for (size_t i = w->nundo; i-- > 0;) ferry__codec_undo_revert(w->undo[i]);
    drop_undo(w);
    s->cur = *start;
    s->cur_off_lineage = start_off_lineage;
}

void ferry__sync_sub_work_release(ferry_subscriber *s, sub_work *w)
{
    (void)s;
    drop_undo(w);
    if (w->owned) ferry_model_free(w->m);
    if (w->staged) {
        unlink(w->staged);
        free(w->staged);
    }
    memset(w, 0, sizeof *w);
}

static void advance(ferry_subscriber *s, sub_work *w, const fs_state *to)
{
    w->st = *to;
    if (w->held) {
        /* patched in place: the exposed model is this version now */
        s->cur = *to;
        s->cur_off_lineage = false;
    }
    s->stats.steps++;
}

/* One delta from one store. */
struct delta_arg {
    sub_work *w;
    const char *key;
    uint64_t size;
    const uint8_t *want;
    uint64_t max_out;
    const uint8_t *target;
    const fs_state *to;
};

/* A patch whose header names other models than the step's base and
 * target: an object of another version (of a signed one: replaced). */
static int other_version(const uint8_t pb[16], const uint8_t pt[16], const uint8_t base[16], const uint8_t target[16],
                         uint64_t version, bool is_signed)
{
    char a[33], b[33], x[33], y[33];
    ferry__hex(a, pb, 16), ferry__hex(b, pt, 16), ferry__hex(x, base, 16), ferry__hex(y, target, 16);
    return ferry__fail(is_signed ? FERRY_ERR_SIG_DIGEST : FERRY_ERR_SYNC_CORRUPT,
                       "the patch turns model %.12s.. into %.12s.., but version %llu needs %.12s.. into %.12s.. "
                       "(an object of another version?%s)",
                       a, b, (unsigned long long)version, x, y,
                       is_signed ? " its SHA-256 cannot be the one its signed manifest gives: replaced" : "");
}

/* Room for one more undo record of a held model (none needed otherwise). */
static int undo_room(sub_work *w)
{
    if (!w->held) return FERRY_OK;
    ferry__codec_undo **more = ferry__realloc(w->undo, (w->nundo + 1) * sizeof *more);
    if (!more) return FERRY_ERR_NOMEM;
    w->undo = more;
    return FERRY_OK;
}

/* A delta streamed into the model (docs/PROTOCOL.md, "Streamed deltas"):
 * the store hands the bytes on as they arrive, the header's hashes are
 * checked against the manifest's as soon as its first 64 bytes are in,
 * and the codec decodes and writes each chunk as soon as it is complete
 * (ferry_apply_stream_*), so that the version is applied about when its
 * last byte arrives.  The checks are those of the buffered path (size,
 * signed SHA-256 before the version counts, header hashes, checksum,
 * every hash); any failure puts the model back exactly. */
struct stream_ctx {
    ferry_apply_stream *st;
    const uint8_t *base, *target, *want;
    uint64_t version;
    uint64_t fed;
    bool checked;      /* the header's hashes were compared */
};

static int stream_write(void *ctx, const void *data, size_t n)
{
    struct stream_ctx *c = ctx;
    const uint8_t *p = data;
    if (!c->checked) { /* the header first, alone: is it the version asked for? */
        size_t take = c->fed < 64 ? (64 - (size_t)c->fed < n ? 64 - (size_t)c->fed : n) : 0;
        int rc = ferry_apply_stream_feed(c->st, p, take);
        if (rc) return rc;
        c->fed += take;
        p += take;
        n -= take;
        uint8_t pb[16], pt[16];
        if (c->fed >= 64) c->checked = true;
        /* the signed object names the manifest's hashes: these bytes are not it */
        if (c->fed >= 64 && !ferry_apply_stream_hashes(c->st, pb, pt) && (memcmp(pb, c->base, 16) || memcmp(pt, c->target, 16)))
            return other_version(pb, pt, c->base, c->target, c->version, c->want != NULL);
    }
    c->fed += n;
    return ferry_apply_stream_feed(c->st, p, n);
}

/* 1: the model cannot be patched in place (the version changes its
 * structure): the caller takes the buffered path.  Else as delta_from. */
static int delta_stream(ferry_subscriber *s, ferry_store *from, const struct delta_arg *da)
{
    sub_work *w = da->w;
    int rc = undo_room(w);
    if (rc) return rc;
    uint64_t max = da->size ? da->size : 1;
    ferry_apply_options ao = {.threads = s->threads, .base_hash = w->st.hash};
    ferry_apply_stream_options so = {.max_size = max, .sha256 = da->want};
    struct stream_ctx c = {.base = w->st.hash, .target = da->target, .want = da->want, .version = da->to->version};
    if ((rc = ferry__codec_apply_stream_begin(w->m, &ao, &so, w->held, &c.st))) return rc;
    rc = ferry_store_get_stream(from, da->key, max, stream_write, &c, NULL);
    s->cnt.bytes += c.fed;
    if (!rc || c.fed) s->cnt.objects++;
    if (rc == FERRY_ERR_NOMEM && c.fed < 64) { /* the buffer of the size the header declares (at most the manifest's) */
        ferry_apply_stream_abort(c.st);
        return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: its manifest declares %llu bytes, more than this process can allocate",
                           da->key, (unsigned long long)da->size);
    }
    if (rc == FERRY_ERR_SHAPE_MISMATCH) {
        ferry_apply_stream_abort(c.st);
        ferry__clear_error();
        return 1;
    }
    if (rc) {
        ferry_apply_stream_abort(c.st);
        if (rc == FERRY_ERR_LIMIT && c.fed >= max) /* the store's bound: a larger object */
            return da->want ? ferry__fail(FERRY_ERR_SIG_DIGEST, "%s: larger than the %llu bytes its signed manifest declares (replaced)",
                                          da->key, (unsigned long long)da->size)
                            : ferry__context(rc, "%s: larger than the %llu bytes its manifest declares", da->key,
                                             (unsigned long long)da->size);
        return ferry__context(rc, "%s", da->key);
    }
    if (c.fed != da->size) {
        ferry_apply_stream_abort(c.st);
        return ferry__fail(da->want ? FERRY_ERR_SIG_DIGEST : FERRY_ERR_SYNC_CORRUPT,
                           "%s: %llu bytes, its %smanifest says %llu (truncated or replaced)", da->key, (unsigned long long)c.fed,
                           da->want ? "signed " : "", (unsigned long long)da->size);
    }
    ferry__codec_undo *rec = NULL;
    if ((rc = ferry__codec_apply_stream_end(c.st, w->held ? &rec : NULL))) return ferry__context(rc, "%s", da->key);
    if (rec) w->undo[w->nundo++] = rec;
    advance(s, w, da->to);
    return FERRY_OK;
}

static int delta_from(ferry_subscriber *s, ferry_store *from, void *arg)
{
    const struct delta_arg *da = arg;
    /* in memory, over the network: streamed (a local file gains nothing) */
    if (s->mode != SUB_FILE && da->w->writable && ferry_store_kind(from) != FERRY_STORE_FILE) {
        int rc = delta_stream(s, from, da);
        if (rc != 1) return rc;
    }
    sub_work *w = da->w;
    const char *key = da->key;
    const uint8_t *target = da->target;
    const fs_state *to = da->to;
    uint64_t max_out = da->max_out;
    void *patch = NULL;
    size_t n = 0;
    int rc = ferry__sync_object_get(from, key, da->size, da->want, &s->cnt, &patch, &n);
    if (rc) return rc;
    ferry_patch_info *pi = NULL;
    if ((rc = ferry_patch_inspect(patch, n, &pi))) {
        ferry_free(patch);
        return ferry__context(rc, "%s", key);
    }
    uint8_t pb[16], pt[16];
    ferry_patch_info_hashes(pi, pb, pt);
    ferry_patch_info_free(pi);
    if (memcmp(pb, w->st.hash, 16) || memcmp(pt, target, 16)) {
        ferry_free(patch); /* the digest, where signed, was checked on download: another version's object */
        return ferry__context(other_version(pb, pt, w->st.hash, target, to->version, false), "%s", key);
    }
    /* the result may not exceed the model size its manifest declares */
    ferry_apply_options ao = {.threads = s->threads, .base_hash = w->st.hash, .max_output_bytes = max_out ? max_out : 1};
    if (w->writable) {
        /* the exposed model keeps a record of what it lost (a later step
           may fail); a model this sync built needs none */
        ferry__codec_undo *rec = NULL;
        if ((rc = undo_room(w))) {
            ferry_free(patch);
            return rc;
        }
        rc = ferry__codec_apply_inplace_undo(w->m, patch, n, &ao, w->held ? &rec : NULL);
        if (rc != FERRY_ERR_SHAPE_MISMATCH) {
            ferry_free(patch);
            if (rc) return ferry__context(rc, "%s", key);
            if (rec) w->undo[w->nundo++] = rec;
            advance(s, w, to);
            return FERRY_OK;
        }
        /* the version changes the structure: build it aside */
        ferry__clear_error();
    }
    ferry_model *out = NULL;
    rc = ferry_apply_ex(w->m, patch, n, &ao, &out);
    ferry_free(patch);
    if (rc) return ferry__context(rc, "%s", key);
    work_replace(w, out, NULL);
    advance(s, w, to);
    return FERRY_OK;
}

/* One delta (of a version, or compacted): fetch, check, apply; the result
 * is bounded by max_out bytes (its manifest's model size).  A step that
 * fails leaves w as it was, so the copy of another store can follow. */
static int step_delta(ferry_subscriber *s, sub_work *w, const char *key, uint64_t size, bool has_sha, const uint8_t sha[32],
                      uint64_t max_out, const uint8_t target[16], const fs_state *to)
{
    struct delta_arg a = {w, key, size, NULL, max_out, target, to};
    int rc = ferry__sync_want_sha(s->keys, key, has_sha, sha, &a.want);
    return rc ? rc : on_stores(s, delta_from, &a);
}

/* Where an anchor is downloaded.  File mode without tmp_dir: beside PATH
 * under a name without the pid (*resumable), so that the next process
 * continues a download this one did not finish. */
static int stage_path(ferry_subscriber *s, char *out, size_t cap, const fs_manifest *m, bool *resumable)
{
    int w;
    *resumable = s->mode == SUB_FILE && !s->tmp_dir;
    if (*resumable)
        w = snprintf(out, cap, "%s.ferry-download.%s", s->path, m->id);
    else
        w = snprintf(out, cap, "%s/ferry-anchor.%ld.%s.safetensors", s->tmp_dir ? s->tmp_dir : ferry__sync_tmp_dir(NULL), (long)getpid(),
                     m->id);
    if (w < 0 || (size_t)w >= cap) return ferry__fail(FERRY_ERR_ARG, "staging path too long");
    return FERRY_OK;
}

/* The full object of an anchor from one store: downloaded aside, parsed,
 * hashed. */
struct full_arg {
    sub_work *w;
    const fs_manifest *m;
};

static int full_from(ferry_subscriber *s, ferry_store *from, void *arg)
{
    sub_work *w = ((struct full_arg *)arg)->w;
    const fs_manifest *m = ((struct full_arg *)arg)->m;
    char key[FS_KEY_CAP], tmp[4200];
    ferry__sync_key_version(key, s->run, m->version, m->id, FS_OBJ_FULL);
    const uint8_t *want;
    bool resumable;
    int rc = ferry__sync_want_sha(s->keys, key, m->has_full_sha, m->full_sha, &want);
    if (!rc) rc = stage_path(s, tmp, sizeof tmp, m, &resumable);
    if (rc) return rc;
    if (resumable) ferry__sync_local_drop_downloads(s->path, m->id); /* those of other anchors are of no use */
    ferry_store_stat ss;
    /* at most the size the manifest declares: a larger object stops the
     * download (FERRY_ERR_LIMIT, a rejected object; a forgery if signed).
     * Over the network: parallel ranged GETs (a long link), resumable;
     * a local file:// copy gains nothing from them. */
    uint64_t max = m->full_bytes ? m->full_bytes : 1;
    ferry_store_transfer_options xo = {.concurrency = s->concurrency, .chunk_size = s->chunk_size, .resume = resumable,
                                       .max_size = max};
    if ((rc = ferry_store_kind(from) == FERRY_STORE_FILE ? ferry_store_get_file_max(from, key, tmp, max, &ss)
                                                         : ferry_store_get_file_parallel(from, key, tmp, &xo, &ss)))
        return rc != FERRY_ERR_LIMIT ? rc
               : ferry__fail(want ? FERRY_ERR_SIG_DIGEST : FERRY_ERR_LIMIT, "%s: larger than the %llu bytes its %smanifest declares",
                             key, (unsigned long long)m->full_bytes, want ? "signed " : "");
    s->cnt.bytes += ss.size;
    s->cnt.objects++;
    ferry_model *a = NULL;
    uint8_t d[32];
    if (ss.size != m->full_bytes) {
        rc = ferry__fail(want ? FERRY_ERR_SIG_DIGEST : FERRY_ERR_SYNC_CORRUPT,
                         "%s: %llu bytes, its %smanifest says %llu (truncated or replaced)", key, (unsigned long long)ss.size,
                         want ? "signed " : "", (unsigned long long)m->full_bytes);
    } else if (want && !(rc = ferry__sign_sha256_file(tmp, d, NULL)) && memcmp(d, want, 32)) {
        rc = ferry__fail(FERRY_ERR_SIG_DIGEST, "%s: SHA-256 is not the one its signed manifest gives (replaced)", key);
    } else if (rc) {
        /* the digest could not be computed */
    } else if ((rc = ferry_model_open(tmp, &a))) {
        rc = ferry__context(rc, "%s", key);
    } else {
        uint8_t h[16];
        if (!(rc = ferry_model_hash(a, h)) && memcmp(h, m->model_hash, 16)) {
            char x[33], y[33];
            ferry__hex(x, h, 16), ferry__hex(y, m->model_hash, 16);
            rc = ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: model hash %s, but the manifest of version %llu says %s", key, x,
                             (unsigned long long)m->version, y);
        }
    }
    if (rc) {
        ferry_model_free(a);
        unlink(tmp);
        return rc;
    }
    char *staged = NULL;
    if (s->mode == SUB_FILE) {
        /* kept: renamed over PATH if nothing is applied after it */
        if (!(staged = ferry__strdup(tmp))) {
            ferry_model_free(a);
            unlink(tmp);
            return FERRY_ERR_NOMEM;
        }
    } else {
        unlink(tmp); /* the mapping outlives the name */
    }
    work_replace(w, a, staged);
    fs_state to = {m->version, "", {0}, m->cum};
    memcpy(to.id, m->id, FS_ID_CAP);
    memcpy(to.hash, m->model_hash, 16);
    advance(s, w, &to);
    return FERRY_OK;
}

static int step_full(ferry_subscriber *s, sub_work *w, const fs_manifest *m)
{
    struct full_arg a = {w, m};
    return on_stores(s, full_from, &a);
}

/* Deltas from+1 .. to: the manifests are read from `to` back (each names
 * its predecessor), then the deltas are applied forward. */
static int step_chain(ferry_subscriber *s, sub_work *w, const fs_step *st, char badkey[FS_KEY_CAP], bool *off_lineage,
                      uint32_t *steps)
{
    uint64_t n = st->to - st->from;
    fs_manifest *list = n <= SIZE_MAX / sizeof *list ? ferry__calloc((size_t)n, sizeof *list) : NULL;
    if (!list) { /* versions numbered beyond reason: a rejected lineage, not the end of the sync */
        ferry__sync_key_version(badkey, s->run, st->to, st->to_id, FS_OBJ_DELTA);
        return ferry__fail(FERRY_ERR_SYNC_MANIFEST, "run %s: a chain of %llu deltas to version %llu cannot be held in memory",
                           s->run, (unsigned long long)n, (unsigned long long)st->to);
    }
    int rc = FERRY_OK;
    fs_ref at = {st->to, ""};
    memcpy(at.id, st->to_id, FS_ID_CAP);
    for (uint64_t i = n; i-- > 0;) {
        if ((rc = ferry__sync_sub_manifest(s, at.version, at.id, &list[i]))) {
            ferry__sync_key_version(badkey, s->run, at.version, at.id, FS_OBJ_MANIFEST);
            goto out;
        }
        at = list[i].prev;
    }
    /* The first delta must start from exactly the version held. */
    if (list[0].prev.version != w->st.version || strcmp(list[0].prev.id, w->st.id) || memcmp(list[0].base_hash, w->st.hash, 16)) {
        rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "run %s: version %llu (id %s) held locally is not on the lineage of version %llu",
                         s->run, (unsigned long long)w->st.version, w->st.id, (unsigned long long)st->to);
        *off_lineage = true;
        goto out;
    }
    for (uint64_t i = 0; i < n; i++) {
        const fs_manifest *m = &list[i];
        char key[FS_KEY_CAP];
        ferry__sync_key_version(key, s->run, m->version, m->id, FS_OBJ_DELTA);
        if (i && memcmp(m->base_hash, list[i - 1].model_hash, 16)) {
            ferry__sync_key_version(badkey, s->run, m->version, m->id, FS_OBJ_MANIFEST);
            rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s: base hash is not the model hash of version %llu", badkey,
                             (unsigned long long)list[i - 1].version);
            goto out;
        }
        fs_state to = {m->version, "", {0}, m->cum};
        memcpy(to.id, m->id, FS_ID_CAP);
        memcpy(to.hash, m->model_hash, 16);
        if ((rc = step_delta(s, w, key, m->delta_bytes, m->has_delta_sha, m->delta_sha, m->model_bytes, m->model_hash, &to))) {
            snprintf(badkey, FS_KEY_CAP, "%s", key);
            goto out;
        }
        (*steps)++;
    }
out:
    free(list);
    return rc;
}

int ferry__sync_sub_exec(ferry_subscriber *s, sub_work *w, const fs_plan *p, const fs_manifest *target, const fs_compaction *comps,
             char badkey[FS_KEY_CAP], bool *off_lineage, uint32_t *steps)
{
    badkey[0] = 0;
    *off_lineage = false;
    for (int i = 0; i < p->n; i++) {
        const fs_step *st = &p->step[i];
        int rc;
        if (st->kind == FS_STEP_FULL) {
            fs_manifest m;
            if ((rc = ferry__sync_sub_manifest(s, st->to, st->to_id, &m))) {
                ferry__sync_key_version(badkey, s->run, st->to, st->to_id, FS_OBJ_MANIFEST);
                return rc;
            }
            if (m.kind != FERRY_SYNC_ANCHOR) {
                ferry__sync_key_version(badkey, s->run, st->to, st->to_id, FS_OBJ_MANIFEST);
                return ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s: named as an anchor but is not one", badkey);
            }
            if ((rc = step_full(s, w, &m))) {
                ferry__sync_key_version(badkey, s->run, m.version, m.id, FS_OBJ_FULL);
                return rc;
            }
            (*steps)++;
        } else if (st->kind == FS_STEP_CHAIN) {
            if ((rc = step_chain(s, w, st, badkey, off_lineage, steps))) return rc;
        } else {
            const fs_compaction *c = &comps[st->compaction];
            ferry__sync_key_compact(badkey, s->run, c->from, c->to, c->id);
            if (w->st.version != c->from || strcmp(w->st.id, c->from_id))
                return ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s: starts from version %llu id %s, not the one reached", badkey,
                                   (unsigned long long)c->from, c->from_id);
            fs_state to = {c->to, "", {0}, c->to_cum};
            memcpy(to.id, c->to_id, FS_ID_CAP);
            memcpy(to.hash, c->target_hash, 16);
            if ((rc = step_delta(s, w, badkey, c->bytes, c->has_sha, c->sha,
                                  c->to == target->version ? target->model_bytes : UINT64_MAX, c->target_hash, &to)))
                return rc;
            badkey[0] = 0;
            (*steps)++;
        }
    }
    if (w->st.version != target->version || strcmp(w->st.id, target->id) || memcmp(w->st.hash, target->model_hash, 16)) {
        /* only a compaction entry can lead elsewhere: its target differs
         * from the lineage's version */
        for (int i = 0; i < p->n; i++)
            if (p->step[i].kind == FS_STEP_COMPACT) {
                const fs_compaction *c = &comps[p->step[i].compaction];
                ferry__sync_key_compact(badkey, s->run, c->from, c->to, c->id);
            }
        return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "run %s: the path ended at version %llu id %s, not version %llu id %s", s->run,
                           (unsigned long long)w->st.version, w->st.id, (unsigned long long)target->version, target->id);
    }
    return FERRY_OK;
}

/* Memory mode: the verified model w->m goes into the caller's buffers. */
static int commit_memory(ferry_subscriber *s, sub_work *w)
{
    char why[512];
    if (!ferry__sync_same_structure(s->user, w->m, why, sizeof why))
        return ferry__fail(FERRY_ERR_SYNC_SHAPE,
                           "run %s: version %llu does not fit the caller's model (%s); its buffers still hold version %llu",
                           s->run, (unsigned long long)w->st.version, why, (unsigned long long)s->cur.version);
    /* Metadata is part of the model hash: the caller's keys must be the
     * target's (values are replaced, keys cannot be removed). */
    size_t nm = ferry_model_metadata_count(s->user);
    for (size_t i = 0; i < nm; i++) {
        const char *k, *v;
        ferry_model_metadata(s->user, i, &k, &v);
        if (!ferry_model_metadata_get(w->m, k))
            return ferry__fail(FERRY_ERR_SYNC_SHAPE, "run %s: version %llu has no metadata key '%.200s' the caller's model has",
                               s->run, (unsigned long long)w->st.version, k);
    }
    for (size_t i = 0; i < ferry_model_count(w->m); i++)
        if (!ferry_model_data_mut(s->user, i))
            return ferry__fail(FERRY_ERR_ARG, "run %s: the caller's tensor '%.200s' is not writable", s->run,
                               ferry_model_tensor(s->user, i)->name);
    for (size_t i = 0; i < ferry_model_metadata_count(w->m); i++) {
        const char *k, *v;
        ferry_model_metadata(w->m, i, &k, &v);
        const char *old = ferry_model_metadata_get(s->user, k);
        int rc;
        if ((!old || strcmp(old, v)) && (rc = ferry_model_set_metadata(s->user, k, v))) return rc;
    }
    for (size_t i = 0; i < ferry_model_count(w->m); i++) {
        const ferry_tensor *t = ferry_model_tensor(w->m, i);
        if (t->nbytes) memcpy(ferry_model_data_mut(s->user, i), t->data, (size_t)t->nbytes);
    }
    return FERRY_OK;
}

int ferry__sync_sub_commit(ferry_subscriber *s, sub_work *w)
{
    if (w->held) { /* every step was applied in place: already exposed */
        ferry__sync_sub_changes_set(s, w);
        return FERRY_OK;
    }
    fs_state to = w->st;
    int rc;
    switch (s->mode) {
    case SUB_MEMORY:
        if ((rc = commit_memory(s, w))) return rc;
        ferry__sync_sub_work_release(s, w);
        break;
    case SUB_PRIVATE:
        if (s->own_owned) ferry_model_free(s->own);
        s->own = w->m;
        s->own_owned = true;
        s->own_writable = w->writable;
        drop_undo(w); /* the model they would revert is replaced */
        if (w->staged) {
            unlink(w->staged);
            free(w->staged);
        }
        memset(w, 0, sizeof *w);
        break;
    default: { /* SUB_FILE */
        if ((rc = ferry__sync_local_commit(s->path, s->run, w->m, w->staged, &s->cur, &w->st))) return rc;
        ferry_model *now = NULL;
        if (w->staged) {
            /* the mapping is of the file now at PATH */
            free(w->staged);
            w->staged = NULL;
            now = w->m;
        } else if (ferry_model_open(s->path, &now)) {
            /* keep the verified model in memory rather than lose it */
            ferry__clear_error();
            now = w->m;
        } else {
            ferry_model_free(w->m);
        }
        if (s->own_owned) ferry_model_free(s->own);
        s->own = now;
        s->own_owned = true;
        s->own_writable = false;
        memset(w, 0, sizeof *w);
        break;
    }
    }
    s->cur = to;
    s->cur_off_lineage = false;
    ferry__sync_sub_changes_set(s, NULL); /* a model built aside: every tensor whole */
    return FERRY_OK;
}
