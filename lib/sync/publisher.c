/* Publisher: one version per call — objects, then the manifest, then HEAD
 * by compare-and-swap (docs/PROTOCOL.md, "Publishing").
 *
 * The publisher keeps a private copy of the model it last published (the
 * BF16 cast when publishing FP32 masters): the next delta is computed
 * against exactly the bits subscribers hold, with the diff's base_hash
 * option so that copy is never hashed again.  A restarted publisher gets
 * those bits back through the subscriber path (or its cache file), so a
 * restart never resets the version counter nor diffs against anything but
 * the published model. */
#include "sync_impl.h"

#include "ferry_quant.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

struct ferry_publisher {
    ferry_store *st;
    char run[FERRY_SYNC_RUN_MAX + 1];
    char pubid[FERRY_SYNC_PUBLISHER_MAX];
    uint32_t anchor_every;
    int cast, level, threads, verify;
    ferry_quant quant;           /* each version published as its quantized model */
    char *cache_path, *tmp_dir;
    const ferry_keys *keys;      /* borrowed: signs, and verifies what is read */
    ferry_model *prev;           /* last published model, or NULL */
    fs_manifest last;            /* its manifest (version 0 = none) */
    char run_id[FS_ID_CAP];      /* the run's id: pinned (option, cache), HEAD's,
                                    or drawn at version 1; "" = not yet */
    char head_etag[FERRY_STORE_ETAG_MAX];
    char fence[512];             /* set after a conflict: why every publish fails */
};

static void state_of(const fs_manifest *m, fs_state *st)
{
    memset(st, 0, sizeof *st);
    if (!m->version) return;
    st->version = m->version;
    memcpy(st->id, m->id, FS_ID_CAP);
    memcpy(st->hash, m->model_hash, 16);
    st->cum = m->cum;
    memcpy(st->run_id, m->run_id, FS_ID_CAP);
}

/* The model of HEAD's version, through a subscriber (file mode on the
 * cache path, else private). */
static int resume_model(ferry_publisher *p, const fs_head *h)
{
    ferry_subscriber_options so = {.path = p->cache_path, .threads = p->threads, .tmp_dir = p->tmp_dir, .keys = p->keys,
                                   .run_id = p->run_id[0] ? p->run_id : NULL};
    ferry_subscriber *sub = NULL;
    int rc = ferry_subscriber_open(p->st, p->run, &so, &sub);
    if (!rc) rc = ferry_subscriber_sync(sub, FERRY_SYNC_EXACT, h->version, NULL);
    if (!rc) {
        fs_state st;
        p->prev = ferry__sync_sub_take(sub, &st);
        if (st.version != h->version || strcmp(st.id, h->id) || !p->prev)
            rc = ferry__fail(FERRY_ERR_SYNC_CONFLICT, "run %s: HEAD moved while this publisher resumed from version %llu", p->run,
                             (unsigned long long)h->version);
    }
    ferry_subscriber_free(sub);
    if (rc) ferry__context(rc, "run %s: resuming after version %llu", p->run, (unsigned long long)h->version);
    return rc;
}

/* The resumed model's scheme (its "ferry.quantize" metadata, none when
 * absent) must be this publisher's: a delta from an FP8 model to a BF16 one
 * (or to another quantization) would change every island's layout. */
static int quant_check(const ferry_publisher *p)
{
    const char *had = ferry_model_metadata_get(p->prev, FERRY_QUANT_METADATA_KEY);
    const char *want = ferry_quant_name(p->quant);
    if (!had) had = ferry_quant_name(FERRY_QUANT_NONE);
    if (!strcmp(had, want)) return FERRY_OK;
    return ferry__fail(FERRY_ERR_ARG, "run %s: version %llu was published with quantize '%.64s' (model metadata %s); this publisher's "
                       "quantize is '%s': refused (open it with the run's scheme)", p->run, (unsigned long long)p->last.version, had,
                       FERRY_QUANT_METADATA_KEY, want);
}

int ferry_publisher_open(ferry_store *store, const char *run, const ferry_publisher_options *opts, ferry_publisher **out)
{
    if (!store || !out) return ferry__fail(FERRY_ERR_ARG, "ferry_publisher_open: NULL argument");
    *out = NULL;
    int rc = ferry_sync_run_check(run);
    if (rc) return rc;
    if (ferry_store_kind(store) == FERRY_STORE_HTTP)
        return ferry__fail(FERRY_ERR_STORE_READONLY, "%s: cannot publish through a read-only http(s) store", ferry_store_url(store));
    ferry_publisher_options o = {0};
    if (opts) o = *opts;
    if ((rc = ferry__sign_ring_check(o.keys, "ferry_publisher_open"))) return rc;
    char pin[FS_ID_CAP];
    if ((rc = ferry__sync_run_id_option(o.run_id, pin, "ferry_publisher_open"))) return rc;
    if (pin[0] && o.new_run) return ferry__fail(FERRY_ERR_ARG, "ferry_publisher_open: run_id and new_run together (a new run draws its own id)");
    if (!ferry_quant_name((ferry_quant)o.quantize))
        return ferry__fail(FERRY_ERR_ARG, "ferry_publisher_open: quantize %d is no ferry_quant", o.quantize);
    if (o.publisher_id && !ferry__sync_publisher_valid(o.publisher_id))
        return ferry__fail(FERRY_ERR_ARG, "publisher id '%.200s': empty, longer than %d bytes, or not printable ASCII without quotes",
                           o.publisher_id, FERRY_SYNC_PUBLISHER_MAX - 1);
    ferry_publisher *p = ferry__calloc(1, sizeof *p);
    if (!p) return FERRY_ERR_NOMEM;
    p->st = store;
    snprintf(p->run, sizeof p->run, "%s", run);
    if (o.publisher_id) snprintf(p->pubid, sizeof p->pubid, "%s", o.publisher_id);
    else ferry__sync_default_publisher(p->pubid);
    p->anchor_every = o.anchor_every ? o.anchor_every : 10;
    p->cast = o.cast_bf16;
    p->level = o.level;
    p->threads = o.threads;
    p->verify = o.verify;
    p->quant = (ferry_quant)o.quantize;
    p->keys = o.keys;
    if ((o.cache_path && !(p->cache_path = ferry__strdup(o.cache_path))) || (o.tmp_dir && !(p->tmp_dir = ferry__strdup(o.tmp_dir)))) {
        ferry_publisher_free(p);
        return FERRY_ERR_NOMEM;
    }
    memcpy(p->run_id, pin, FS_ID_CAP);
    /* the cache's state pins the run it holds (no model read here) */
    fs_state cached = {0};
    if (p->cache_path && !o.new_run && !pin[0]) {
        ferry__sync_local_peek(p->cache_path, run, &cached);
        memcpy(p->run_id, cached.run_id, FS_ID_CAP);
    }
    const char *holder = pin[0] ? "publisher (run_id option)" : "publisher (its cache_path's state)";
    fs_head h;
    rc = ferry__sync_head_read(store, run, p->keys, NULL, &h, p->head_etag);
    if (rc == FERRY_ERR_STORE_NOT_FOUND) {
        ferry__clear_error();
        p->head_etag[0] = 0;
        /* a run whose HEAD is gone is not a new run: versions left under
           RUN/v/ (or in the cache) mean HEAD was deleted, and a version 1
           published now would take fresh islands into another lineage */
        if (!o.new_run && (rc = ferry__sync_head_gone_check(store, run, &cached, p->cache_path))) {
            ferry_publisher_free(p);
            return rc;
        }
        if (o.new_run) p->run_id[0] = 0;
        *out = p;
        return FERRY_OK;
    }
    if (!rc) rc = ferry__sync_run_id_pinned(run, p->run_id, h.run_id, "HEAD", h.version, holder);
    if (!rc) rc = ferry__sync_manifest_read(store, run, p->keys, h.version, h.id, NULL, &p->last);
    if (!rc && memcmp(p->last.model_hash, h.model_hash, 16))
        rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "run %s: HEAD and the manifest of version %llu disagree on its model hash", run,
                         (unsigned long long)h.version);
    if (!rc) rc = ferry__sync_run_id_agree(run, "the manifest HEAD names", h.run_id, p->last.run_id);
    if (!rc) {
        memcpy(p->run_id, h.run_id, FS_ID_CAP);
        rc = resume_model(p, &h);
    }
    if (!rc) rc = quant_check(p);
    if (rc) {
        ferry_publisher_free(p);
        return rc;
    }
    *out = p;
    return FERRY_OK;
}

void ferry_publisher_free(ferry_publisher *p)
{
    if (!p) return;
    ferry_model_free(p->prev);
    free(p->cache_path);
    free(p->tmp_dir);
    free(p);
}

uint64_t ferry_publisher_version(const ferry_publisher *p) { return p ? p->last.version : 0; }

const char *ferry_publisher_run_id(const ferry_publisher *p) { return p ? p->run_id : ""; }

static int fenced(ferry_publisher *p, int code, const char *fmt, const fs_head *h)
{
    /* a long run name or publisher id may cut the message short: fine */
    if (snprintf(p->fence, sizeof p->fence, fmt, p->run, (unsigned long long)h->version, h->id, h->publisher, p->pubid,
                 (unsigned long long)p->last.version) < 0)
        p->fence[0] = 0;
    return ferry__fail(code, "%s", p->fence);
}

static const char k_other[] =
    "run %s: HEAD is at version %llu (id %s) published by '%s'; this publisher ('%s') last published version %llu: "
    "another publisher is writing this run (reopen to resume after it)";

/* HEAD must still name this publisher's last version. */
static int check_head(ferry_publisher *p)
{
    fs_head h;
    char etag[FERRY_STORE_ETAG_MAX];
    int rc = ferry__sync_head_read(p->st, p->run, p->keys, NULL, &h, etag);
    if (rc == FERRY_ERR_STORE_NOT_FOUND) {
        if (!p->last.version) {
            ferry__clear_error();
            p->head_etag[0] = 0;
            return FERRY_OK;
        }
        snprintf(p->fence, sizeof p->fence, "run %s: HEAD is gone, this publisher had moved it to version %llu", p->run,
                 (unsigned long long)p->last.version);
        return ferry__fail(FERRY_ERR_SYNC_BACKWARDS, "%s", p->fence);
    }
    if (rc) return rc;
    if (h.version != p->last.version || strcmp(h.id, p->last.id)) return fenced(p, FERRY_ERR_SYNC_CONFLICT, k_other, &h);
    memcpy(p->head_etag, etag, sizeof etag);
    return FERRY_OK;
}

/* Moves HEAD from this publisher's last version to m (head.c: retries,
 * our own landed write, BACKWARDS vs CONFLICT); a HEAD found elsewhere
 * fences the handle. */
static int move_head(ferry_publisher *p, const fs_manifest *m, const char *manifest_record, char new_etag[FERRY_STORE_ETAG_MAX])
{
    fs_head nh;
    ferry__sync_head_init(&nh, m->version, m->id, m->kind, m->model_hash, p->pubid);
    memcpy(nh.run_id, m->run_id, FS_ID_CAP);
    nh.manifest_record = manifest_record; /* a reader's one round trip */
    fs_ref from = {p->last.version, ""};
    memcpy(from.id, p->last.id, FS_ID_CAP);
    memcpy(new_etag, p->head_etag, FERRY_STORE_ETAG_MAX);
    int rc = ferry__sync_head_move(p->st, p->run, p->keys, &nh, &from, p->pubid, new_etag);
    if (rc == FERRY_ERR_SYNC_CONFLICT || rc == FERRY_ERR_SYNC_BACKWARDS) snprintf(p->fence, sizeof p->fence, "%s", ferry_last_error());
    return rc;
}

/* Saves the anchor aside and uploads it; *bytes is its size and, when
 * signing, *sha its SHA-256 (of the staged file, the bytes uploaded). */
static int put_full(ferry_publisher *p, const ferry_model *m, const char *id, uint64_t version, uint64_t *bytes, uint8_t sha[32],
                    bool *has_sha)
{
    char tmp[4200], key[FS_KEY_CAP];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s/ferry-publish.%ld.%s.safetensors", ferry__sync_tmp_dir(p->tmp_dir), (long)getpid(), id) >= sizeof tmp)
        return ferry__fail(FERRY_ERR_ARG, "tmp_dir too long");
    ferry__sync_key_version(key, p->run, version, id, FS_OBJ_FULL);
    int rc = ferry_model_save(m, tmp);
    if (rc) return rc;
    struct stat sb = {0};
    if (stat(tmp, &sb)) rc = ferry__fail(FERRY_ERR_IO, "%s: cannot stat the staged anchor", tmp);
    else if (ferry_keys_can_sign(p->keys) && !(rc = ferry__sign_sha256_file(tmp, sha, NULL))) *has_sha = true;
    if (!rc) rc = ferry_store_put_file(p->st, key, tmp, NULL);
    unlink(tmp);
    *bytes = (uint64_t)sb.st_size;
    return rc;
}

int ferry_publish_ex(ferry_publisher *p, const ferry_model *model, unsigned flags, ferry_publish_info *info)
{
    if (!p || !model) return ferry__fail(FERRY_ERR_ARG, "ferry_publish: NULL argument");
    if (p->fence[0]) return ferry__fail(FERRY_ERR_SYNC_CONFLICT, "%s", p->fence);
    uint64_t t0 = ferry__mono_ms();
    int rc = check_head(p);
    if (rc) return rc;
    const fs_manifest *L = &p->last;
    if (L->version >= FS_VERSION_MAX) /* refused before anything is written */
        return ferry__fail(FERRY_ERR_LIMIT, "run %s: HEAD is at version %llu, the highest the protocol allows (2^63 - 2): "
                           "nothing can be published after it", p->run, (unsigned long long)L->version);
    fs_manifest m;
    memset(&m, 0, sizeof m);
    m.version = L->version + 1;
    bool anchor = m.version == 1 || (flags & FERRY_PUBLISH_ANCHOR) || m.version - L->anchor.ref.version >= p->anchor_every;
    m.kind = anchor ? FERRY_SYNC_ANCHOR : FERRY_SYNC_DELTA;
    ferry__sync_new_id(m.id);
    /* the run's id, drawn at version 1 (or at the first version a run
       written before run ids gets from this publisher) */
    if (p->run_id[0]) memcpy(m.run_id, p->run_id, FS_ID_CAP);
    else ferry__sync_new_id(m.run_id);

    ferry_model *next = NULL;
    void *patch = NULL;
    size_t psize = 0;
    /* quantized: the FP8 model (owned, made here; sticky scales from the
       previous version's) is what is published, diffed and kept */
    int cast = p->cast;
    if (p->quant != FERRY_QUANT_NONE) {
        if ((rc = ferry_quantize(model, p->quant, cast, p->prev, &next, NULL))) {
            ferry__context(rc, "run %s: quantizing version %llu (%s)", p->run, (unsigned long long)m.version, ferry_quant_name(p->quant));
            return rc;
        }
        model = next;
        cast = 0;
    }
    /* A delta version needs no copy of the model before HEAD moves: the
     * previous model's buffers are overwritten with it once the version is
     * published (off the time-to-fresh-policy path, no allocation).  An
     * anchor (saved from the copy), --verify (hashes it) or a new layout
     * copies it first; a quantized model is a copy already. */
    bool reuse = !next && !anchor && !p->verify && p->prev && ferry__sync_model_fits(p->prev, model, cast);
    if (!reuse && !next && (rc = ferry__sync_model_copy(model, cast, &next))) return rc;
    const ferry_model *pub = reuse ? p->prev : next; /* its layout is the published model's */
    if (m.version > 1) {
        ferry_diff_options d = {.level = p->level, .threads = p->threads, .cast_bf16 = cast, .base_hash = L->model_hash};
        ferry_patch_info *pi = NULL;
        if ((rc = ferry_diff(p->prev, model, &d, &patch, &psize))) goto out;
        if ((rc = ferry_patch_inspect(patch, psize, &pi))) goto out;
        ferry_patch_info_hashes(pi, m.base_hash, m.model_hash);
        ferry_patch_info_free(pi);
        if (p->verify) {
            /* the delta applies to what subscribers hold, and our copy
             * is bit for bit its result */
            ferry_apply_options ao = {.threads = p->threads, .base_hash = L->model_hash};
            ferry_model *r = NULL;
            uint8_t h[16];
            rc = ferry_apply_ex(p->prev, patch, psize, &ao, &r);
            ferry_model_free(r);
            if (!rc && !(rc = ferry_model_hash(next, h)) && memcmp(h, m.model_hash, 16))
                rc = ferry__fail(FERRY_ERR_TARGET_MISMATCH, "run %s: the published copy does not hash to the delta's target", p->run);
            if (rc) goto out;
        }
    }
    if (anchor) {
        uint8_t h[16];
        if ((rc = ferry_model_hash(next, h))) goto out;
        if (m.version > 1 && memcmp(h, m.model_hash, 16)) {
            rc = ferry__fail(FERRY_ERR_TARGET_MISMATCH, "run %s: the anchor of version %llu does not hash to its delta's target",
                             p->run, (unsigned long long)m.version);
            goto out;
        }
        memcpy(m.model_hash, h, 16);
        if ((rc = put_full(p, next, m.id, m.version, &m.full_bytes, m.full_sha, &m.has_full_sha))) goto out;
    }
    if (patch) {
        char key[FS_KEY_CAP];
        ferry__sync_key_version(key, p->run, m.version, m.id, FS_OBJ_DELTA);
        if (ferry_keys_can_sign(p->keys)) {
            if ((rc = ferry__sha256(patch, psize, m.delta_sha))) goto out;
            m.has_delta_sha = true;
        }
        if ((rc = ferry_store_put(p->st, key, patch, psize, NULL))) goto out;
        m.delta_bytes = psize;
    }
    if (L->version) {
        m.prev.version = L->version;
        memcpy(m.prev.id, L->id, FS_ID_CAP);
    }
    m.cum = L->cum + m.delta_bytes;
    if (anchor) {
        m.anchor = (fs_anchor_ref){{m.version, ""}, m.full_bytes, m.cum};
        memcpy(m.anchor.ref.id, m.id, FS_ID_CAP);
        m.prev_anchor = L->anchor;
    } else {
        m.anchor = L->anchor;
        m.prev_anchor = L->prev_anchor;
    }
    m.model_bytes = ferry_model_nbytes(pub);
    m.tensors = ferry_model_count(pub);
    m.created = ferry__sync_now();
    snprintf(m.publisher, sizeof m.publisher, "%s", p->pubid);
    m.anchor_every = p->anchor_every;
    char etag[FERRY_STORE_ETAG_MAX];
    {
        char key[FS_KEY_CAP];
        ferry__sync_key_version(key, p->run, m.version, m.id, FS_OBJ_MANIFEST);
        char *text = ferry__sync_manifest_json(p->run, &m);
        if (!text) {
            rc = FERRY_ERR_NOMEM;
            goto out;
        }
        if ((rc = ferry__sync_record_seal(p->keys, &text))) goto out;
        rc = ferry_store_put(p->st, key, text, strlen(text), NULL);
        if (!rc) rc = move_head(p, &m, text, etag);
        free(text);
        if (rc) goto out;
    }

    /* published: this is now the base of the next delta */
    if (reuse) {
        ferry__sync_model_overwrite(p->prev, model, cast);
    } else {
        ferry_model_free(p->prev);
        p->prev = next;
        next = NULL;
    }
    if (p->cache_path) {
        fs_state from, to;
        state_of(L, &from);
        state_of(&m, &to);
        if (ferry__sync_local_commit(p->cache_path, p->run, p->prev, NULL, &from, &to)) ferry__clear_error(); /* only an optimisation */
    }
    memcpy(p->head_etag, etag, sizeof etag);
    p->last = m;
    memcpy(p->run_id, m.run_id, FS_ID_CAP);
    if (info) {
        memset(info, 0, sizeof *info);
        info->version = m.version;
        info->kind = m.kind;
        info->delta_bytes = m.delta_bytes;
        info->full_bytes = m.full_bytes;
        info->model_bytes = m.model_bytes;
        memcpy(info->model_hash, m.model_hash, 16);
        memcpy(info->id, m.id, FS_ID_CAP);
        info->seconds = (double)(ferry__mono_ms() - t0) / 1e3;
    }
out:
    ferry_free(patch);
    ferry_model_free(next);
    if (rc && rc != FERRY_ERR_SYNC_CONFLICT && rc != FERRY_ERR_SYNC_BACKWARDS)
        ferry__context(rc, "run %s: publishing version %llu", p->run, (unsigned long long)m.version);
    return rc;
}

int ferry_publish(ferry_publisher *p, const ferry_model *model, uint64_t *version)
{
    ferry_publish_info info;
    int rc = ferry_publish_ex(p, model, 0, &info);
    if (!rc && version) *version = info.version;
    return rc;
}
