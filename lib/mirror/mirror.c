/* Mirrors: a run followed from an upstream store into a nearer one
 * (docs/MIRROR.md).  Bytes are copied verbatim — HEAD included — so that
 * a mirror holds exactly what its upstream holds and never has to sign or
 * re-serialise anything; every object is verified before the manifest
 * that names it is written, and HEAD, written last by compare-and-swap, is
 * the only thing that makes a version visible (as for a publisher). */
#include "mirror_impl.h"

#include <stdlib.h>
#include <unistd.h>

#define MIRROR_DEFAULT_MAX 100000u

/* One version to copy: its manifest's bytes and what they say (m; for a
 * sharded version, m is the view GC and the run log use and sd the
 * manifest-2 itself). */
typedef struct mver {
    fs_manifest m;
    sh_doc sd;
    bool sharded;
    void *text;
    size_t n;
} mver;

int ferry__mirror_get_record(mirror *mr, const char *key, size_t max, void **text, size_t *n, size_t *body)
{
    /* bounded in the GET: a larger record is refused unread (docs/PROTOCOL.md "Bounds") */
    int rc = ferry_store_get_max(mr->src, key, max, text, n, NULL);
    if (rc == FERRY_ERR_LIMIT)
        return ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s: larger than %zu bytes, too large for a protocol record", key, max);
    if (rc) return rc;
    mr->cnt.bytes += *n;
    mr->cnt.manifests++;
    bool is_signed;
    rc = ferry__sign_open(mr->o->keys, FS_DOM_RECORD, key, *text, *n, body, &is_signed);
    if (rc) {
        ferry_free(*text);
        *text = NULL;
    }
    return rc;
}

/* SRC's HEAD: its bytes and what they say, through the readers' HEAD
 * reader (a torn HEAD, signed or not, is read again). */
static int src_head(mirror *mr, fs_head *h, void **text, size_t *n)
{
    int rc = ferry__sync_head_read_raw(mr->src, mr->run, mr->o->keys, &mr->cnt, h, NULL, text, n);
    if (rc == FERRY_ERR_STORE_NOT_FOUND)
        return ferry__fail(FERRY_ERR_SYNC_NOT_YET, "run %s: the upstream %s has no version yet (no HEAD)", mr->run,
                           ferry_store_url(mr->src));
    return rc;
}

/* Parses a manifest of either format (a sharded one says "ferry-manifest-2"
 * near its start; a single-rank one is held to FS_JSON_MAX). */
static int parse_manifest(mirror *mr, const char *key, size_t body, mver *out)
{
    size_t head = body < 4096 ? body : 4096;
    if (memmem(out->text, head, "\"ferry-manifest-2\"", 18)) {
        int rc = ferry__shard_manifest_parse(mr->run, key, out->text, body, &out->sd);
        if (rc) return rc;
        out->sharded = true;
        ferry__shard_manifest_view(&out->sd, &out->m);
        return FERRY_OK;
    }
    if (body > FS_JSON_MAX)
        return ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s: larger than %zu bytes, too large for a protocol record", key, FS_JSON_MAX);
    return ferry__sync_manifest_parse(mr->run, key, out->text, body, &out->m);
}

static void release_one(mver *v)
{
    ferry_free(v->text);
    v->text = NULL;
    if (v->sharded) ferry__shard_doc_release(&v->sd);
    v->sharded = false;
}

static int src_manifest(mirror *mr, const fs_ref *r, mver *out)
{
    char key[FS_KEY_CAP];
    ferry__sync_key_version(key, mr->run, r->version, r->id, FS_OBJ_MANIFEST);
    size_t body;
    /* a manifest-2 lists every tile: bounded as sharded readers bound it */
    int rc = ferry__mirror_get_record(mr, key, SH_MANIFEST_MAX, &out->text, &out->n, &body);
    if (rc) return rc;
    rc = parse_manifest(mr, key, body, out);
    if (!rc && (out->m.version != r->version || strcmp(out->m.id, r->id)))
        rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s: holds the manifest of version %llu id %s", key,
                         (unsigned long long)out->m.version, out->m.id);
    if (rc) release_one(out);
    return rc;
}

bool ferry__mirror_in_dst(mirror *mr, const char *key, uint64_t bytes)
{
    ferry_store_stat ss;
    int rc = ferry_store_head(mr->dst, key, &ss);
    ferry__clear_error();
    return !rc && ss.size == bytes;
}

int ferry__mirror_check_patch(const char *key, const char *what, const void *d, size_t n, const uint8_t *base, const uint8_t target[16])
{
    ferry_patch_info *pi;
    int rc = ferry_patch_inspect(d, n, &pi);
    if (rc) return ferry__context(FERRY_ERR_SYNC_CORRUPT, "%s%s", key, what);
    uint8_t b[16], t[16];
    ferry_patch_info_hashes(pi, b, t);
    ferry_patch_info_free(pi);
    if ((base && memcmp(b, base, 16)) || memcmp(t, target, 16))
        return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s%s: its base or target hash is not the one its record gives (another version's patch?)",
                           key, what);
    return FERRY_OK;
}

int ferry__mirror_copy_patch(mirror *mr, const char *key, uint64_t bytes, bool has_sha, const uint8_t *sha, const uint8_t *base,
                      const uint8_t target[16], uint32_t *copied)
{
    if (ferry__mirror_in_dst(mr, key, bytes)) {
        mr->info->objects_reused++;
        return FERRY_OK;
    }
    void *d = NULL;
    size_t n;
    const uint8_t *want;
    int rc = ferry__sync_want_sha(mr->o->keys, key, has_sha, sha, &want);
    if (!rc) rc = ferry__sync_object_get(mr->src, key, bytes, want, &mr->cnt, &d, &n);
    if (!rc) rc = ferry__mirror_check_patch(key, "", d, n, base, target);
    if (!rc) rc = ferry_store_put(mr->dst, key, d, n, NULL);
    ferry_free(d);
    if (!rc) (*copied)++;
    return rc;
}

static int copy_delta(mirror *mr, const fs_manifest *m)
{
    char key[FS_KEY_CAP];
    ferry__sync_key_version(key, mr->run, m->version, m->id, FS_OBJ_DELTA);
    return ferry__mirror_copy_patch(mr, key, m->delta_bytes, m->has_delta_sha, m->delta_sha, m->base_hash, m->model_hash,
                             &mr->info->objects_copied);
}

/* A full object goes through a local file (it may be large): downloaded
 * (in parallel ranged GETs, resumable), opened, hashed against the
 * manifest, then uploaded from the file. */
static int copy_full(mirror *mr, const fs_manifest *m)
{
    char key[FS_KEY_CAP];
    ferry__sync_key_version(key, mr->run, m->version, m->id, FS_OBJ_FULL);
    if (ferry__mirror_in_dst(mr, key, m->full_bytes)) {
        mr->info->objects_reused++;
        return FERRY_OK;
    }
    /* named by the version's id, so that a pass after a killed one resumes
       the download (PATH.part, PATH.part.state) instead of starting over */
    char path[4096];
    snprintf(path, sizeof path, "%s/ferry-mirror.%s.safetensors", ferry__sync_tmp_dir(mr->o->tmp_dir), m->id);
    ferry_store_stat ss;
    ferry_store_transfer_options to = {.concurrency = mr->o->concurrency, .chunk_size = mr->o->chunk_size, .resume = 1};
    const uint8_t *want;
    int rc = ferry__sync_want_sha(mr->o->keys, key, m->has_full_sha, m->full_sha, &want);
    if (!rc) rc = ferry_store_get_file_parallel(mr->src, key, path, &to, &ss);
    if (rc) return rc;
    mr->cnt.bytes += ss.size;
    mr->cnt.objects++;
    ferry_model *model = NULL;
    uint8_t h[16], d[32];
    if (ss.size != m->full_bytes)
        rc = ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: %llu bytes, its manifest says %llu (truncated or replaced)", key,
                         (unsigned long long)ss.size, (unsigned long long)m->full_bytes);
    else if (want && !(rc = ferry__sign_sha256_file(path, d, NULL)) && memcmp(d, want, 32))
        rc = ferry__fail(FERRY_ERR_SIG_DIGEST, "%s: SHA-256 is not the one its signed manifest gives (replaced)", key);
    else if (rc)
        ; /* the digest could not be computed */
    else if ((rc = ferry_model_open(path, &model)) || (rc = ferry_model_hash(model, h)))
        rc = ferry__context(FERRY_ERR_SYNC_CORRUPT, "%s", key);
    else if (memcmp(h, m->model_hash, 16))
        rc = ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: model hash is not the manifest's", key);
    ferry_model_free(model);
    if (!rc) rc = ferry_store_put_file(mr->dst, key, path, NULL);
    unlink(path);
    if (!rc) mr->info->objects_copied++;
    return rc;
}

static int copy_version(mirror *mr, const mver *v)
{
    if (v->sharded) return ferry__mirror_copy_shard(mr, &v->sd, v->text, v->n);
    int rc = FERRY_OK;
    if (v->m.version > 1 && (rc = copy_delta(mr, &v->m))) return rc;
    if (v->m.kind == FERRY_SYNC_ANCHOR && (rc = copy_full(mr, &v->m))) return rc;
    char key[FS_KEY_CAP];
    ferry__sync_key_version(key, mr->run, v->m.version, v->m.id, FS_OBJ_MANIFEST);
    return ferry_store_put(mr->dst, key, v->text, v->n, NULL);
}

/* Frees the texts of n entries (not the array). */
static void release_texts(mver *vs, size_t n)
{
    for (size_t i = 0; i < n; i++) release_one(&vs[i]);
}

static void release(mver *vs, size_t n)
{
    release_texts(vs, n);
    free(vs);
}

/* Bytes a version adds to DST: its objects and manifest. */
static uint64_t version_bytes(const mver *v)
{
    return v->m.delta_bytes + (v->m.kind == FERRY_SYNC_ANCHOR ? v->m.full_bytes : 0) + v->n;
}

/* Walks SRC's lineage down from HEAD, collecting the versions to copy
 * (newest first).  Down to the anchor A of HEAD in any case (DST needs a
 * complete version and a way in for islands that hold nothing); below A,
 * on towards DST's HEAD while the versions in between cost at most A's
 * full object — then DST's islands can chain from where they are instead
 * of fetching A — else the copy starts at A (a DST empty, far behind, or
 * on another lineage). */
static int collect(mirror *mr, const fs_head *sh, const fs_head *dh, mver **out, size_t *count)
{
    uint64_t max = mr->o->max_versions ? mr->o->max_versions : MIRROR_DEFAULT_MAX;
    size_t cap = 0, n = 0, at_anchor = 0; /* entries down to A (0 = A not reached yet) */
    mver *vs = NULL;
    fs_ref r = {sh->version, ""};
    memcpy(r.id, sh->id, FS_ID_CAP);
    uint64_t anchor = 0, budget = 0, extra = 0;
    int rc = FERRY_OK;
    for (;;) {
        if ((rc = ferry__grow((void **)&vs, &cap, n + 1, sizeof *vs))) break;
        memset(&vs[n], 0, sizeof vs[n]);
        if ((rc = src_manifest(mr, &r, &vs[n]))) {
            if (rc == FERRY_ERR_STORE_NOT_FOUND && at_anchor) { /* gone below A (GC): start at A */
                ferry__clear_error();
                rc = FERRY_OK;
                break;
            }
            if (rc == FERRY_ERR_STORE_NOT_FOUND)
                rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "run %s: the upstream's manifest of version %llu is missing", mr->run,
                                 (unsigned long long)r.version);
            break;
        }
        const fs_manifest *m = &vs[n++].m;
        if (!anchor) anchor = m->anchor.ref.version;
        if (dh->version && m->version == dh->version + 1 && !strcmp(m->prev.id, dh->id)) {
            at_anchor = n; /* DST holds prev: copy everything collected */
            break;
        }
        if (at_anchor) {
            extra += version_bytes(&vs[n - 1]);
            if (extra > budget) break;
        } else if (m->version <= anchor) {
            at_anchor = n;
            budget = m->full_bytes;
            if (!dh->version) break;
        }
        /* the start of the run, or below DST's HEAD without meeting it: DST
           is on another lineage */
        if (m->version == 1 || (at_anchor && m->version <= dh->version)) break;
        if (n >= max) {
            rc = ferry__fail(FERRY_ERR_LIMIT, "run %s: more than %llu versions to copy (max_versions)", mr->run,
                             (unsigned long long)max);
            break;
        }
        r = m->prev;
    }
    if (!rc && at_anchor && at_anchor < n) { /* DST not reached within the budget: start at A */
        release_texts(vs + at_anchor, n - at_anchor);
        n = at_anchor;
    } else if (!rc && !at_anchor) {
        rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "run %s: no anchor below HEAD %llu in the upstream", mr->run,
                         (unsigned long long)sh->version);
    }
    if (rc) {
        release(vs, n);
        return rc;
    }
    *out = vs;
    *count = n;
    return FERRY_OK;
}

/* HEAD of DST by compare-and-swap: SRC's bytes, against the etag read. */
static int swap_head(mirror *mr, const fs_head *sh, const void *text, size_t n, const char *etag)
{
    char key[FS_KEY_CAP];
    ferry__sync_key_head(key, mr->run);
    int rc = ferry_store_cas(mr->dst, key, etag[0] ? etag : NULL, text, n, NULL);
    if (rc != FERRY_ERR_STORE_CONFLICT) return rc;
    /* another mirror process may have written the same HEAD */
    fs_head now;
    ferry__clear_error();
    if (!ferry__sync_head_read(mr->dst, mr->run, mr->o->keys, NULL, &now, NULL) && now.version == sh->version && !strcmp(now.id, sh->id))
        return FERRY_OK;
    return ferry__fail(FERRY_ERR_SYNC_CONFLICT, "run %s: HEAD of %s moved during the copy (another writer): not replaced", mr->run,
                       ferry_store_url(mr->dst));
}

static int mirror_run(mirror *mr)
{
    fs_head sh, dh;
    void *text = NULL;
    size_t n = 0;
    char etag[FERRY_STORE_ETAG_MAX] = "";
    int rc = src_head(mr, &sh, &text, &n);
    if (rc) return rc;
    mr->info->src_version = sh.version;
    memset(&dh, 0, sizeof dh);
    rc = ferry__sync_head_read(mr->dst, mr->run, mr->o->keys, NULL, &dh, etag);
    if (rc == FERRY_ERR_STORE_NOT_FOUND) {
        ferry__clear_error();
        etag[0] = 0;
        rc = FERRY_OK;
    }
    if (rc) goto out;
    mr->info->from_version = mr->info->to_version = dh.version;
    if (dh.version > sh.version) {
        rc = ferry__fail(FERRY_ERR_SYNC_BACKWARDS, "run %s: %s is at version %llu, ahead of its upstream %s at %llu: refused", mr->run,
                         ferry_store_url(mr->dst), (unsigned long long)dh.version, ferry_store_url(mr->src),
                         (unsigned long long)sh.version);
        goto out;
    }
    if (dh.version == sh.version) {
        if (strcmp(dh.id, sh.id))
            rc = ferry__fail(FERRY_ERR_SYNC_CONFLICT, "run %s: %s holds another version %llu (id %s, upstream id %s)", mr->run,
                             ferry_store_url(mr->dst), (unsigned long long)dh.version, dh.id, sh.id);
        goto out;
    }
    mver *vs = NULL;
    size_t nv = 0;
    if ((rc = collect(mr, &sh, &dh, &vs, &nv))) goto out;
    /* oldest first, so that every manifest written names objects already
       there; HEAD last */
    for (size_t i = nv; i-- > 0 && !rc;) rc = copy_version(mr, &vs[i]);
    if (!rc) rc = swap_head(mr, &sh, text, n, etag);
    if (!rc) {
        mr->info->first_copied = vs[nv - 1].m.version;
        mr->info->versions_copied = (uint32_t)nv;
        mr->info->to_version = sh.version;
    }
    release(vs, nv);
out:
    ferry_free(text);
    return rc;
}

int ferry_mirror_once(ferry_store *src, ferry_store *dst, const char *run, const ferry_mirror_options *opts,
                      ferry_mirror_info *info)
{
    if (!src || !dst || !run) return ferry__fail(FERRY_ERR_ARG, "ferry_mirror_once: NULL argument");
    if (src == dst) return ferry__fail(FERRY_ERR_ARG, "ferry_mirror_once: SRC and DST are the same store");
    int rc = ferry_sync_run_check(run);
    if (rc) return rc;
    ferry_mirror_options defaults = {0};
    ferry_mirror_info local;
    if (!info) info = &local;
    memset(info, 0, sizeof *info);
    uint64_t t0 = ferry__mono_ms();
    mirror mr = {src, dst, run, opts ? opts : &defaults, info, {0, 0, 0}};
    rc = mirror_run(&mr);
    if (!rc && mr.o->keep && info->versions_copied) {
        /* DST's index is SRC's bytes (signed, perhaps): GC leaves it */
        ferry_gc_options go = {.keep = mr.o->keep, .grace_s = mr.o->grace_s};
        ferry_gc_report rep;
        rc = ferry__sync_gc(dst, run, &go, true, &rep);
        if (!rc) info->gc_deleted = rep.objects_deleted;
    }
    /* after GC, so that no compacted delta is copied only to be deleted;
       also when HEAD did not move (a compaction adds no version) */
    if (!rc) rc = ferry__mirror_compactions(&mr);
    info->bytes_copied = mr.cnt.bytes;
    info->seconds = (double)(ferry__mono_ms() - t0) / 1000.0;
    return rc;
}
