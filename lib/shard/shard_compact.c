/* Compaction of a sharded run (include/ferry_shard.h ferry_shard_compact,
 * docs/SHARDING.md "Compaction", docs/PROTOCOL.md "Compaction index").
 *
 * One object per trainer rank whose tiles code the tile of `to` against the
 * tile of `from`, with its own tile index and root, recorded in the run's
 * compaction index (lib/sync's, one entry with its rank objects).  The
 * tiles are read through islands (shard_sub.c), so every byte is verified
 * against the signed manifests before it is coded; each payload is decoded
 * again and compared before it is uploaded. */
#include "shard_impl.h"

#include <stdlib.h>

/* A deep copy of a tile set (the island goes on to `to`). */
static int copy_tiles(const sh_tileset *src, sh_tileset *dst)
{
    memset(dst, 0, sizeof *dst);
    for (size_t i = 0; i < src->n; i++) {
        const sh_held *h = &src->t[i];
        const ferry_tensor *t = ferry_model_tensor(h->m, 0);
        ferry_model *m = NULL;
        uint8_t *d = NULL;
        int rc = ferry__shard_tile_new(h->name, t->dtype, t->shape[0], t->shape[1], &m, &d);
        if (rc) return rc;
        memcpy(d, t->data, (size_t)t->nelem * ferry__shard_esize(t->dtype));
        sh_tile x = {.r0 = h->r0, .r1 = h->r1, .c0 = h->c0, .c1 = h->c1};
        memcpy(x.target, h->hash, 16);
        if ((rc = ferry__shard_tiles_add(dst, h->name, &x, m))) {
            ferry_model_free(m);
            return rc;
        }
    }
    ferry__shard_tiles_sort(dst);
    dst->version = src->version;
    memcpy(dst->id, src->id, FS_ID_CAP);
    return FERRY_OK;
}

/* The held tile of an island that holds whole parts: present, of the
 * tile's extent and dtype (else the island broke its contract). */
static const ferry_tensor *tile_of(const sh_tileset *s, const char *name, const sh_tile *t, ferry_dtype dt, uint64_t v, const sh_held **out)
{
    const sh_held *h = ferry__shard_tiles_find(s, name, t->r0, t->c0);
    const ferry_tensor *x = h ? ferry_model_tensor(h->m, 0) : NULL;
    if (!x || h->r1 != t->r1 || h->c1 != t->c1 || x->dtype != dt || x->nelem != (t->r1 - t->r0) * (t->c1 - t->c0)) {
        ferry__fail(FERRY_ERR_SYNC_MANIFEST, "tensor '%s' tile [%llu:%llu, %llu:%llu]: not held at version %llu as the layout gives it",
                    name, (unsigned long long)t->r0, (unsigned long long)t->r1, (unsigned long long)t->c0, (unsigned long long)t->c1,
                    (unsigned long long)v);
        return NULL;
    }
    *out = h;
    return x;
}

typedef struct cjob {
    ferry_store *st;
    const char *run;
    const ferry_compact_options *o;
    const sh_doc *a, *b;      /* manifests of from and to (same layout) */
    char id[FS_ID_CAP];       /* the compaction's */
    sh_coder *coder;
    uint64_t read_bytes;
} cjob;

/* Rank r: its tiles of from and to through an island, its object coded
 * and uploaded; *out its size, index offset, tile count and root. */
static int compact_rank(cjob *j, uint32_t r, fs_cobj *out)
{
    const sh_doc *b = j->b;
    size_t np = 0, nt = 0;
    for (size_t i = 0; i < b->nparts; i++)
        if (b->parts[i].rank == r) {
            np++;
            nt += b->parts[i].ntiles;
        }
    if (!np || !nt)
        return ferry__fail(FERRY_ERR_UNSUPPORTED, "run %s: rank %u has no tiles (a rank without rows is not compacted)", j->run, r);
    ferry_shard_region *rg = ferry__calloc(np, sizeof *rg);
    sh_tile *tl = ferry__calloc(nt, sizeof *tl);
    sh_tile **tp = ferry__calloc(nt, sizeof *tp);
    uint8_t *scratch = NULL;
    ferry_shard_subscriber *s = NULL;
    sh_tileset ta = {0}, tb = {0};
    ferry_buf obj = {0};
    int rc = rg && tl && tp ? FERRY_OK : FERRY_ERR_NOMEM;
    for (size_t i = 0, k = 0; !rc && i < b->nparts; i++)
        if (b->parts[i].rank == r) rg[k++] = (ferry_shard_region){b->parts[i].name, b->parts[i].r0, b->parts[i].r1, 0, 0};
    ferry_shard_sub_options so = {.threads = j->o->threads, .keys = j->o->keys};
    ferry_shard_pull_info pi;
    if (!rc) rc = ferry_shard_subscriber_open(j->st, j->run, rg, np, &so, &s);
    if (!rc && !(rc = ferry_shard_pull(s, FERRY_SYNC_EXACT, j->a->version, &pi))) j->read_bytes += pi.bytes_fetched;
    if (!rc) {
        ferry_store *ist;
        const char *irun;
        const ferry_keys *ikeys;
        size_t inr;
        const sh_tileset *held = ferry__shard_sub_inner(s, &ist, &irun, &ikeys, &inr);
        if (strcmp(held->id, j->a->id))
            rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "run %s: version %llu pulled is not the one walked to (another lineage)", j->run,
                             (unsigned long long)j->a->version);
        else rc = copy_tiles(held, &ta);
    }
    if (!rc && !(rc = ferry_shard_pull(s, FERRY_SYNC_EXACT, b->version, &pi))) j->read_bytes += pi.bytes_fetched;
    if (!rc) ferry__shard_sub_take_tiles(s, &tb);
    if (!rc && strcmp(tb.id, b->id))
        rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "run %s: version %llu pulled is not the one walked to (another lineage)", j->run,
                         (unsigned long long)b->version);
    /* the rank's tiles in its objects' order (parts by (name, r0), tiles
       row-major: the layout's leaf numbers), each coded against from's */
    size_t n = 0;
    for (size_t i = 0; !rc && i < b->nparts; i++) {
        const sh_part *p = &b->parts[i];
        if (p->rank != r) continue;
        size_t es = ferry__shard_esize(p->dtype);
        for (size_t k = 0; !rc && k < p->ntiles; k++) {
            const sh_tile *t = &p->tiles[k];
            const sh_held *ha, *hb;
            const ferry_tensor *xa = tile_of(&ta, p->name, t, p->dtype, j->a->version, &ha);
            const ferry_tensor *xb = xa ? tile_of(&tb, p->name, t, p->dtype, b->version, &hb) : NULL;
            if (!xb) {
                rc = FERRY_ERR_SYNC_MANIFEST;
                break;
            }
            if (t->leaf != n) {
                rc = ferry__fail(FERRY_ERR_SHARD_INDEX, "run %s version %llu: tensor '%s' tile %zu of rank %u has leaf %llu in the layout",
                                 j->run, (unsigned long long)b->version, p->name, n, r, (unsigned long long)t->leaf);
                break;
            }
            sh_tile *x = &tl[n];
            *x = (sh_tile){.r0 = t->r0, .r1 = t->r1, .c0 = t->c0, .c1 = t->c1};
            memcpy(x->base, ha->hash, 16);
            memcpy(x->target, hb->hash, 16);
            size_t at = obj.size;
            if ((rc = ferry__shard_tile_encode(j->coder, p->dtype, xa->data, xb->data, xb->nelem, j->o->level, &obj))) break;
            x->loc[SH_DELTA].off = at;
            x->loc[SH_DELTA].size = obj.size - at;
            if ((rc = ferry__sha256_hex(obj.data + at, obj.size - at, x->loc[SH_DELTA].sha))) break;
            /* what a reader will decode: from's tile + payload = to's tile */
            uint8_t *sc = ferry__realloc(scratch, (size_t)xb->nelem * es + 1);
            if (!sc) {
                rc = FERRY_ERR_NOMEM;
                break;
            }
            scratch = sc;
            rc = ferry__shard_tile_decode(j->coder, p->dtype, xa->data, xb->nelem, obj.data + at, obj.size - at, scratch);
            if (!rc && memcmp(scratch, xb->data, (size_t)xb->nelem * es))
                rc = ferry__fail(FERRY_ERR_INTERNAL, "tensor '%s' tile [%llu:%llu, %llu:%llu]: the compacted payload does not decode to "
                                 "version %llu's tile", p->name, (unsigned long long)t->r0, (unsigned long long)t->r1,
                                 (unsigned long long)t->c0, (unsigned long long)t->c1, (unsigned long long)b->version);
            tp[n++] = x;
        }
    }
    char key[FS_KEY_CAP];
    ferry__sync_key_compact_rank(key, j->run, j->a->version, b->version, j->id, r);
    if (!rc) rc = ferry__shard_ix_write(&obj, tp, n, SH_DELTA, &out->index, out->root);
    if (!rc) {
        out->bytes = obj.size;
        out->tiles = n;
        rc = ferry_store_put(j->st, key, obj.data, obj.size, NULL);
    }
    if (rc) ferry__context(rc, "rank %u (%s)", r, key);
    ferry__buf_release(&obj);
    ferry__shard_tiles_release(&ta);
    ferry__shard_tiles_release(&tb);
    ferry_shard_subscriber_free(s);
    free(scratch);
    free(tp);
    free(tl);
    free(rg);
    return rc;
}

static uint64_t objects_sum(const sh_doc *m, int kind)
{
    uint64_t n = 0;
    for (uint32_t r = 0; r < m->world; r++) n += m->obj_bytes[2 * (size_t)r + (size_t)kind];
    return n;
}

static int read_doc(cjob *j, sh_lcache *lc, fs_ref ref, sh_doc *out)
{
    fs_count cnt = {0};
    int rc = ferry__shard_manifest_read_lc(j->st, j->run, j->o->keys, ref.version, ref.id, &cnt, lc, out);
    j->read_bytes += cnt.bytes;
    if (rc == FERRY_ERR_STORE_NOT_FOUND)
        rc = ferry__fail(FERRY_ERR_SYNC_GONE, "run %s: the manifest of version %llu is gone (GC)", j->run, (unsigned long long)ref.version);
    return rc;
}

int ferry_shard_compact(ferry_store *store, const char *run, const ferry_compact_options *opts, ferry_shard_compact_info *info)
{
    if (!store) return ferry__fail(FERRY_ERR_ARG, "ferry_shard_compact: NULL store");
    int rc = ferry_sync_run_check(run);
    if (rc) return rc;
    ferry_compact_options o = {0};
    if (opts) o = *opts;
    fs_head h;
    fs_count hc = {0};
    if ((rc = ferry__sync_head_read(store, run, o.keys, &hc, &h, NULL))) {
        if (rc == FERRY_ERR_STORE_NOT_FOUND) return ferry__fail(FERRY_ERR_SYNC_NOT_YET, "run %s: no version published yet", run);
        return rc;
    }
    uint64_t to = o.to ? o.to : h.version, from = o.from;
    if (to > h.version)
        return ferry__fail(FERRY_ERR_SYNC_NOT_YET, "run %s: version %llu asked for, HEAD is at %llu", run, (unsigned long long)to,
                           (unsigned long long)h.version);
    if (from >= to && from)
        return ferry__fail(FERRY_ERR_ARG, "run %s: nothing to compact from version %llu to %llu", run, (unsigned long long)from,
                           (unsigned long long)to);
    cjob j = {store, run, &o, NULL, NULL, "", NULL, hc.bytes};
    sh_lcache lc = {0};
    sh_doc a = {0}, b = {0}, d = {0};
    fs_cobj *obj = NULL;
    /* down from HEAD to `to`, then to `from`, summing the deltas crossed */
    fs_ref ref = {h.version, ""};
    memcpy(ref.id, h.id, FS_ID_CAP);
    while (!rc && ref.version > to) {
        if (!(rc = read_doc(&j, &lc, ref, &d))) ref = d.prev;
        ferry__shard_doc_release(&d);
    }
    if (!rc) rc = read_doc(&j, &lc, ref, &b);
    if (!rc && !from && b.anchor.version < to) from = b.anchor.version;
    uint64_t chain = rc ? 0 : objects_sum(&b, SH_DELTA);
    ref = b.prev;
    while (!rc) {
        if (!ref.version || (from && ref.version < from)) {
            rc = ferry__fail(FERRY_ERR_ARG, "run %s: nothing to compact from version %llu to %llu", run, (unsigned long long)from,
                             (unsigned long long)to);
            break;
        }
        if ((rc = read_doc(&j, &lc, ref, &d))) break;
        if (!from) from = d.anchor.version; /* `to` is an anchor: the one before it */
        if (ref.version == from) {
            a = d;
            d = (sh_doc){0};
            break;
        }
        chain += objects_sum(&d, SH_DELTA);
        ref = d.prev;
        ferry__shard_doc_release(&d);
    }
    if (!rc && (!a.index_form || !b.index_form))
        rc = ferry__fail(FERRY_ERR_UNSUPPORTED, "run %s: version %llu is of the old form (its tiles listed in the manifest, no tile "
                         "index): compaction reads the index form only", run, (unsigned long long)(a.index_form ? to : from));
    if (!rc && (a.world != b.world || memcmp(a.layout_sha, b.layout_sha, 32) || a.tile_codec != SH_TC_CHUNK ||
                b.tile_codec != SH_TC_CHUNK))
        rc = ferry__fail(FERRY_ERR_UNSUPPORTED, "run %s: the rank count or the tile layout changed between versions %llu and %llu", run,
                         (unsigned long long)from, (unsigned long long)to);
    if (!rc && !(obj = ferry__calloc(b.world, sizeof *obj))) rc = FERRY_ERR_NOMEM;
    if (!rc && !(j.coder = ferry__shard_coder_new())) rc = FERRY_ERR_NOMEM;
    j.a = &a;
    j.b = &b;
    ferry__sync_new_id(j.id);
    uint64_t bytes = 0, tiles = 0;
    for (uint32_t r = 0; !rc && r < b.world; r++) {
        if (!(rc = compact_rank(&j, r, &obj[r]))) {
            bytes += obj[r].bytes;
            tiles += obj[r].tiles;
        }
    }
    /* the newest anchor at or below `to`, for the report */
    uint64_t anchor = 0;
    if (!rc) {
        if (b.anchor.version == to) anchor = objects_sum(&b, SH_ANCHOR);
        else if (!(rc = read_doc(&j, &lc, b.anchor, &d))) anchor = objects_sum(&d, SH_ANCHOR);
        ferry__shard_doc_release(&d);
    }
    if (!rc) {
        fs_manifest va;
        ferry__shard_manifest_view(&a, &va);
        fs_compaction c;
        memset(&c, 0, sizeof c);
        c.from = from;
        c.to = to;
        memcpy(c.from_id, a.id, FS_ID_CAP);
        memcpy(c.to_id, b.id, FS_ID_CAP);
        memcpy(c.id, j.id, FS_ID_CAP);
        c.bytes = bytes;
        memcpy(c.base_hash, a.model_hash, 16);
        memcpy(c.target_hash, b.model_hash, 16);
        /* manifest-2 links carry no cumulative delta bytes: the entry's
           count from `from` (so its chain_bytes is the deltas' sum) */
        c.from_cum = va.cum;
        c.to_cum = va.cum + chain;
        c.from_full_bytes = a.kind == FERRY_SYNC_ANCHOR ? objects_sum(&a, SH_ANCHOR) : 0;
        c.created = ferry__sync_now();
        c.world = b.world;
        /* the objects are durable before the index names them */
        rc = ferry__sync_compact_add(store, run, o.keys, h.run_id, &c, obj);
    }
    if (!rc && info) {
        memset(info, 0, sizeof *info);
        info->from = from;
        info->to = to;
        info->world = b.world;
        info->tiles = tiles;
        info->bytes = bytes;
        info->chain_bytes = chain;
        info->anchor_bytes = anchor;
        info->read_bytes = j.read_bytes;
        memcpy(info->id, j.id, FS_ID_CAP);
        char key[FS_KEY_CAP];
        ferry__sync_key_compact_rank(key, run, from, to, j.id, 0);
        snprintf(info->key, sizeof info->key, "%s", key);
    }
    free(obj);
    ferry__shard_coder_free(j.coder);
    ferry__shard_doc_release(&a);
    ferry__shard_doc_release(&b);
    ferry__shard_doc_release(&d);
    ferry__shard_lcache_release(&lc);
    if (rc) ferry__context(rc, "run %s: compacting %llu..%llu", run, (unsigned long long)from, (unsigned long long)to);
    return rc;
}

void ferry__shard_doc_object_key(char out[FS_KEY_CAP], const char *run, const sh_doc *m, uint32_t rank, int kind)
{
    if (m->comp_id[0]) ferry__sync_key_compact_rank(out, run, m->comp_from, m->version, m->comp_id, rank);
    else ferry__shard_key_object(out, run, m->version, m->id, rank, kind);
}

int ferry__shard_comp_check(const char *run, const sh_doc *B, const fs_compaction *c, const fs_cobj *obj)
{
    char key[FS_KEY_CAP];
    ferry__sync_key_compact(key, run, c->from, c->to, c->id);
    const char *why = NULL;
    if (B->version != c->to || strcmp(B->id, c->to_id)) why = "its end is not this version (version or id)";
    else if (!c->world || B->world != c->world) why = "its rank count is not the version's";
    else if (!B->index_form) why = "the version is of the old form (no tile index)";
    else if (memcmp(B->model_hash, c->target_hash, 16)) why = "its target hash is not the version's shard hash";
    for (uint32_t r = 0; !why && r < c->world; r++)
        if (obj[r].tiles != B->obj_tiles[2 * (size_t)r + SH_DELTA]) why = "a rank object's tile count is not the version's";
    if (why)
        return ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s (sharded, %u ranks): %s (version %llu)", key, c->world, why,
                           (unsigned long long)B->version);
    return FERRY_OK;
}

int ferry__shard_comp_view(const sh_doc *B, const fs_compaction *c, const fs_cobj *obj, sh_doc *cm)
{
    FERRY_ASSERT(c->world == B->world);
    *cm = *B;
    size_t n2 = 2 * (size_t)B->world;
    cm->obj_bytes = ferry__calloc(n2, sizeof *cm->obj_bytes);
    cm->obj_index = ferry__calloc(n2, sizeof *cm->obj_index);
    cm->obj_tiles = ferry__calloc(n2, sizeof *cm->obj_tiles);
    cm->obj_root = ferry__calloc(n2, 32);
    if (!cm->obj_bytes || !cm->obj_index || !cm->obj_tiles || !cm->obj_root) {
        ferry__shard_comp_view_release(cm);
        return FERRY_ERR_NOMEM;
    }
    for (uint32_t r = 0; r < B->world; r++) {
        size_t o = 2 * (size_t)r + SH_DELTA;
        cm->obj_bytes[o] = obj[r].bytes;
        cm->obj_index[o] = obj[r].index;
        cm->obj_tiles[o] = obj[r].tiles;
        memcpy(cm->obj_root + 32 * o, obj[r].root, 32);
    }
    cm->comp_from = c->from;
    memcpy(cm->comp_id, c->id, FS_ID_CAP);
    return FERRY_OK;
}

void ferry__shard_comp_view_release(sh_doc *cm)
{
    free(cm->obj_bytes);
    free(cm->obj_index);
    free(cm->obj_tiles);
    free(cm->obj_root);
    memset(cm, 0, sizeof *cm);
}
