/* Island rank: sliced pull of sharded versions (docs/PROTOCOL.md,
 * "Sharded versions", reading side).
 *
 * The rank holds the COVER of its regions: every tile that intersects one,
 * as a one-tensor model.  A pull reads HEAD and the manifests of the
 * versions it crosses, fetches only the cover's tile patches (ranged GETs
 * in parallel: runs of one object's tiles, the smallest gaps fetched
 * through while more than R GETs are left), and applies one version at
 * a time as a transaction: each tile's SHA-256 against the manifest, its
 * patch decoded into a scratch tile (the codec checks the base and target
 * hashes), the changed elements recorded; only when every tile of the
 * version verified are the held tiles written.  From the version held, a
 * sharded compaction (shard_compact.c) may stand for the first versions of
 * the chain when its objects cost less (pick_compaction); it is read as an
 * index-form version whose objects are the compaction's.  Memory: the cover, one
 * scratch tile, the fetched ranges of one version (at most SH_BATCH_BYTES
 * at a time), the change lists. */
#include "shard_impl.h"
#include "common/parallel.h"

#include <stdlib.h>

typedef struct region {
    ferry_shard_region r;     /* name owned */
    bool resolved, all;
    ferry_dtype dtype;
    uint64_t tcols;           /* the tensor's columns */
    int64_t *pos;
    uint8_t *vals;
    size_t nchg;
} region;

struct ferry_shard_subscriber {
    ferry_store *st;          /* the store being read (one of the list below) */
    ferry_store *alt[FERRY_SYNC_STORES_MAX]; /* [0] = the store opened with, then those added */
    size_t nst;
    unsigned used;
    char run[FERRY_SYNC_RUN_MAX + 1];
    ferry_shard_sub_options o;
    region *rg;
    size_t nrg;
    sh_tileset held;
    uint64_t max_held;        /* highest version held: a HEAD below it is refused */
    char pin[FS_ID_CAP];      /* the run id of the versions pulled ("" = none
                                 yet): a HEAD of another is refused */
    ferry_model *empty;
    sh_coder *coder;          /* ferry-tile-1 decoding scratch */
    sh_lcache lc;             /* the run's layout record (index form) */
    char refused[FS_ID_CAP];  /* the last sharded compaction that did not
                                 verify: not tried again */
    ferry_shard_sub_stats stats;
};

/* What a GET more is worth in bytes by default (options.get_bytes; index
 * form: read an object whole or its index, then its tiles): a round trip
 * of 4 ms at 1 Gbit/s, 40 ms at 100 Mbit/s, which islands in other regions
 * pay (at 8 KiB, column islands of 9-34 M-parameter models read objects in
 * 58-135 GETs a version for a few hundred KB; bench/README "Sharding on
 * unseen sequences").  An island rank of a large model still reads in
 * part: the payloads it does not want are many MB. */
#define SH_GET_BYTES ((uint64_t)512 << 10)

int ferry_shard_subscriber_open(ferry_store *store, const char *run, const ferry_shard_region *regions, size_t nregions,
                                const ferry_shard_sub_options *opts, ferry_shard_subscriber **out)
{
    if (!store || !out || (nregions && !regions)) return ferry__fail(FERRY_ERR_ARG, "ferry_shard_subscriber_open: NULL argument");
    *out = NULL;
    int rc = ferry_sync_run_check(run);
    if (rc) return rc;
    if (opts && (rc = ferry__sign_ring_check(opts->keys, "ferry_shard_subscriber_open"))) return rc;
    ferry_shard_subscriber *s = ferry__calloc(1, sizeof *s);
    if (!s) return FERRY_ERR_NOMEM;
    s->st = s->alt[0] = store;
    s->nst = 1;
    snprintf(s->run, sizeof s->run, "%s", run);
    if (opts) s->o = *opts;
    if (!s->o.poll_interval_ms) s->o.poll_interval_ms = 1000;
    if (!s->o.get_bytes) s->o.get_bytes = SH_GET_BYTES;
    if (nregions && !(s->rg = ferry__calloc(nregions, sizeof *s->rg))) rc = FERRY_ERR_NOMEM;
    for (size_t i = 0; i < nregions && !rc; i++) {
        s->nrg = i + 1;
        s->rg[i].r = regions[i];
        s->rg[i].r.name = NULL;
        if (!regions[i].name || !*regions[i].name) rc = ferry__fail(FERRY_ERR_ARG, "region %zu: no tensor name", i);
        else if (!(s->rg[i].r.name = ferry__strdup(regions[i].name))) rc = FERRY_ERR_NOMEM;
    }
    if (!rc) rc = ferry_model_create(&s->empty);
    if (!rc && !(s->coder = ferry__shard_coder_new())) rc = FERRY_ERR_NOMEM;
    if (rc) {
        ferry_shard_subscriber_free(s);
        return rc;
    }
    *out = s;
    return FERRY_OK;
}

static void clear_changes(ferry_shard_subscriber *s)
{
    for (size_t i = 0; i < s->nrg; i++) {
        free(s->rg[i].pos);
        free(s->rg[i].vals);
        s->rg[i].pos = NULL;
        s->rg[i].vals = NULL;
        s->rg[i].nchg = 0;
        s->rg[i].all = false;
    }
    for (size_t i = 0; i < s->held.n; i++) {
        free(s->held.t[i].changed);
        s->held.t[i].changed = NULL;
    }
}

void ferry_shard_subscriber_free(ferry_shard_subscriber *s)
{
    if (!s) return;
    clear_changes(s);
    for (size_t i = 0; i < s->nrg; i++) free((char *)s->rg[i].r.name);
    free(s->rg);
    ferry__shard_tiles_release(&s->held);
    ferry_model_free(s->empty);
    ferry__shard_coder_free(s->coder);
    ferry__shard_lcache_release(&s->lc);
    free(s);
}

uint64_t ferry_shard_subscriber_version(const ferry_shard_subscriber *s) { return s ? s->held.version : 0; }

void ferry_shard_subscriber_get_stats(const ferry_shard_subscriber *s, ferry_shard_sub_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!s) return;
    *out = s->stats;
    for (size_t i = 0; i < s->held.n; i++) out->held_bytes += ferry_model_nbytes(s->held.t[i].m);
}

void ferry__shard_sub_take_tiles(ferry_shard_subscriber *s, sh_tileset *out)
{
    clear_changes(s);
    *out = s->held;
    memset(&s->held, 0, sizeof s->held);
}

/* ---- looking things up in a manifest ---- */

/* The first part of tensor `name` (parts are sorted), or n. */
static size_t first_part(const sh_doc *m, const char *name)
{
    size_t lo = 0, hi = m->nparts;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(m->parts[mid].name, name) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < m->nparts && !strcmp(m->parts[lo].name, name) ? lo : m->nparts;
}

static size_t cut_index(const uint64_t *cut, uint32_t n, uint64_t x) /* i with cut[i] <= x < cut[i+1] */
{
    size_t lo = 0, hi = n - 1;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (cut[mid] <= x) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* The tile of tensor `name` whose corner is (r0, c0) with the given extent,
 * or NULL. */
static const sh_tile *find_tile(const sh_doc *m, const char *name, uint64_t r0, uint64_t r1, uint64_t c0, uint64_t c1, const sh_part **pp)
{
    for (size_t i = first_part(m, name); i < m->nparts && !strcmp(m->parts[i].name, name); i++) {
        const sh_part *p = &m->parts[i];
        if (r0 < p->r0 || r0 >= p->r1) continue;
        size_t ri = cut_index(p->rcut, p->nrc, r0), ci = cut_index(p->ccut, p->ncc, c0);
        const sh_tile *t = &p->tiles[ri * (p->ncc - 1) + ci];
        if (t->r0 != r0 || t->r1 != r1 || t->c0 != c0 || t->c1 != c1) return NULL;
        *pp = p;
        return t;
    }
    return NULL;
}

/* ---- the cover ---- */

typedef struct cov {
    const char *name;
    uint64_t r0, r1, c0, c1;
    ferry_dtype dtype;
} cov;

typedef struct covset {
    cov *c;
    size_t n, cap;
} covset;

static int cov_add(covset *cs, const char *name, const sh_part *p, const sh_tile *t)
{
    for (size_t i = cs->n; i-- > 0;) /* regions of one tensor add neighbouring tiles: look back a little */
        if (cs->n - i > 4096) break;
        else if (cs->c[i].r0 == t->r0 && cs->c[i].c0 == t->c0 && !strcmp(cs->c[i].name, name)) return FERRY_OK;
    if (ferry__grow((void **)&cs->c, &cs->cap, cs->n + 1, sizeof *cs->c)) return FERRY_ERR_NOMEM;
    cs->c[cs->n++] = (cov){name, t->r0, t->r1, t->c0, t->c1, p->dtype};
    return FERRY_OK;
}

/* Checks the regions against manifest m and lists the tiles covering them. */
static int resolve(ferry_shard_subscriber *s, const sh_doc *m, covset *cs)
{
    char key[FS_KEY_CAP];
    ferry__sync_key_version(key, s->run, m->version, m->id, FS_OBJ_MANIFEST);
    for (size_t i = 0; i < s->nrg; i++) {
        region *g = &s->rg[i];
        size_t f = first_part(m, g->r.name);
        if (f == m->nparts)
            return ferry__fail(FERRY_ERR_SHARD_REGION, "region %zu: tensor '%s' is not in version %llu (%s)", i, g->r.name,
                               (unsigned long long)m->version, key);
        const sh_part *p0 = &m->parts[f];
        uint64_t r0 = g->r.row_begin, r1 = g->r.row_end ? g->r.row_end : p0->rows;
        uint64_t c0 = g->r.col_begin, c1 = g->r.col_end ? g->r.col_end : p0->cols;
        if (r0 >= r1 || r1 > p0->rows || c0 >= c1 || c1 > p0->cols)
            return ferry__fail(FERRY_ERR_SHARD_REGION, "region %zu: rows [%llu, %llu) x cols [%llu, %llu) lie outside tensor '%s' "
                               "(%llu x %llu in its 2-D view)", i, (unsigned long long)r0, (unsigned long long)r1,
                               (unsigned long long)c0, (unsigned long long)c1, g->r.name, (unsigned long long)p0->rows,
                               (unsigned long long)p0->cols);
        if (g->resolved && (g->dtype != p0->dtype || g->tcols != p0->cols || g->r.row_end != r1 || g->r.col_end != c1))
            return ferry__fail(FERRY_ERR_SHARD_REGION, "region %zu: tensor '%s' changed dtype or shape in version %llu", i, g->r.name,
                               (unsigned long long)m->version);
        g->r.row_end = r1;
        g->r.col_end = c1;
        g->dtype = p0->dtype;
        g->tcols = p0->cols;
        g->resolved = true;
        for (size_t j = f; j < m->nparts && !strcmp(m->parts[j].name, g->r.name); j++) {
            const sh_part *p = &m->parts[j];
            if (p->r1 <= r0 || p->r0 >= r1) continue;
            for (size_t k = 0; k < p->ntiles; k++) {
                const sh_tile *t = &p->tiles[k];
                if (t->r1 <= r0 || t->r0 >= r1 || t->c1 <= c0 || t->c0 >= c1) continue;
                int rc = cov_add(cs, g->r.name, p, t);
                if (rc) return rc;
            }
        }
    }
    return FERRY_OK;
}

/* ---- one version, as a transaction ---- */

typedef struct want {
    size_t ci;                /* cover index */
    const sh_part *part;
    const sh_tile *tile;
    uint64_t off, size;
} want;

static int cmp_want(const void *a, const void *b)
{
    const want *x = a, *y = b;
    if (x->part->rank != y->part->rank) return x->part->rank < y->part->rank ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* What a verified tile will change: a whole new tile, or elements. */
typedef struct pending {
    ferry_model *fresh;       /* a tile the rank did not hold */
    size_t ci;
    uint64_t first, count;    /* into the step's change arrays */
    size_t voff;              /* byte offset of its values in vals: the
                                 tiles of one step differ in element size
                                 (BF16, F32, F8 codes) */
} pending;

typedef struct step {
    pending *pd;
    size_t npd;
    uint64_t *elem;
    ferry_buf vals;
    size_t nelem, capelem;
} step;

static void step_release(step *x)
{
    for (size_t i = 0; i < x->npd; i++) ferry_model_free(x->pd[i].fresh);
    free(x->pd);
    free(x->elem);
    ferry__buf_release(&x->vals);
    memset(x, 0, sizeof *x);
}

static int record_diff(step *x, const uint8_t *old, const uint8_t *nw, uint64_t n, size_t es, pending *pd)
{
    pd->first = x->nelem;
    pd->voff = x->vals.size;
    for (uint64_t e = 0; e < n; e++) {
        if (!memcmp(old + e * es, nw + e * es, es)) continue;
        if (ferry__grow((void **)&x->elem, &x->capelem, x->nelem + 1, sizeof *x->elem)) return FERRY_ERR_NOMEM;
        x->elem[x->nelem++] = e;
        int rc = ferry__buf_append(&x->vals, nw + e * es, es);
        if (rc) return rc;
    }
    pd->count = x->nelem - pd->first;
    return FERRY_OK;
}

/* Key of rank's object of kind of m: the version's, or a compaction's. */
static void object_key(char key[FS_KEY_CAP], const ferry_shard_subscriber *s, const sh_doc *m, uint32_t rank, int kind)
{
    ferry__shard_doc_object_key(key, s->run, m, rank, kind);
}

/* Verifies and decodes one fetched tile patch. */
static int take_tile(ferry_shard_subscriber *s, const sh_doc *m, int kind, const cov *c, const want *w, const uint8_t *patch,
                     step *x, bool verified)
{
    char key[FS_KEY_CAP], hex[65];
    object_key(key, s, m, w->part->rank, kind);
    const sh_tile *t = w->tile;
#define TILE_FMT "%s: tile [%llu:%llu, %llu:%llu] of '%s'"
#define TILE_ARGS key, (unsigned long long)t->r0, (unsigned long long)t->r1, (unsigned long long)t->c0, (unsigned long long)t->c1, c->name
    int rc = FERRY_OK;
    if (!verified) { /* the old form: the manifest's SHA-256 and base (the index form: the leaf, checked by the caller) */
        if ((rc = ferry__sha256_hex(patch, w->size, hex))) return rc;
        if (strcmp(hex, t->loc[kind].sha))
            return ferry__fail(FERRY_ERR_SYNC_CORRUPT, TILE_FMT ": SHA-256 does not match the manifest", TILE_ARGS);
    }
    sh_held *h = ferry__shard_tiles_find(&s->held, c->name, c->r0, c->c0);
    /* the held tile at this corner has this tile's extent and dtype: it is
       decoded against, diffed with and written into as tr x tc words (the
       base hash that implies it is not checked in the index form, and an
       unsigned manifest's is the store's word) */
    const ferry_tensor *hel = h ? ferry_model_tensor(h->m, 0) : NULL;
    if (h && (!hel || h->r1 != t->r1 || h->c1 != t->c1 || hel->dtype != c->dtype || hel->ndim != 2 ||
              hel->shape[0] != t->r1 - t->r0 || hel->shape[1] != t->c1 - t->c0))
        return ferry__fail(FERRY_ERR_SYNC_MANIFEST, TILE_FMT ": the tile grid changed (this rank holds [%llu:%llu, %llu:%llu])", TILE_ARGS,
                           (unsigned long long)h->r0, (unsigned long long)h->r1, (unsigned long long)h->c0, (unsigned long long)h->c1);
    if (kind == SH_DELTA && (!h || (!verified && memcmp(h->hash, t->base, 16))))
        return ferry__fail(FERRY_ERR_SYNC_MANIFEST, TILE_FMT ": its base is not the tile this rank holds", TILE_ARGS);
    ferry_model *out = NULL;
    if (m->tile_codec == SH_TC_CHUNK) { /* a ferry-tile-1 payload, checked against the manifest's target */
        uint64_t tr = t->r1 - t->r0, tc = t->c1 - t->c0;
        uint8_t *d = NULL, th[16];
        if ((rc = ferry__shard_tile_new(c->name, c->dtype, tr, tc, &out, &d))) return rc;
        rc = ferry__shard_tile_decode(s->coder, c->dtype, kind == SH_DELTA ? ferry_model_tensor(h->m, 0)->data : NULL, tr * tc, patch,
                                      (size_t)w->size, d);
        if (!rc && !(rc = ferry__shard_tile_hash(c->name, c->dtype, tr, tc, d, th)) && memcmp(th, t->target, 16))
            rc = ferry__fail(FERRY_ERR_SYNC_CORRUPT, TILE_FMT ": decodes to another tile than the manifest's target hash", TILE_ARGS);
        if (rc) {
            ferry_model_free(out);
            return ferry__context(rc, TILE_FMT, TILE_ARGS);
        }
    } else { /* a standalone patch (manifests before ferry-tile-1) */
        ferry_patch_info *pi = NULL;
        if ((rc = ferry_patch_inspect(patch, w->size, &pi))) return ferry__context(rc, TILE_FMT, TILE_ARGS);
        uint8_t pb[16], pt[16];
        ferry_patch_info_hashes(pi, pb, pt);
        ferry_patch_info_free(pi);
        if (memcmp(pt, t->target, 16) || (kind == SH_DELTA && memcmp(pb, t->base, 16)))
            return ferry__fail(FERRY_ERR_SYNC_CORRUPT, TILE_FMT ": the patch's hashes are not the manifest's", TILE_ARGS);
        ferry_apply_options ao = {.threads = s->o.threads, .base_hash = kind == SH_DELTA ? h->hash : NULL};
        if ((rc = ferry_apply_ex(kind == SH_DELTA ? h->m : s->empty, patch, w->size, &ao, &out)))
            return ferry__context(rc, TILE_FMT, TILE_ARGS);
    }
    const ferry_tensor *ot = ferry_model_count(out) == 1 ? ferry_model_tensor(out, 0) : NULL;
    if (!ot || strcmp(ot->name, c->name) || ot->dtype != c->dtype || ot->ndim != 2 || ot->shape[0] != t->r1 - t->r0 ||
        ot->shape[1] != t->c1 - t->c0) {
        ferry_model_free(out);
        return ferry__fail(FERRY_ERR_SYNC_CORRUPT, TILE_FMT ": the patch makes another tensor", TILE_ARGS);
    }
#undef TILE_FMT
#undef TILE_ARGS
    pending pd = {NULL, w->ci, 0, 0};
    if (h) {
        const ferry_tensor *ht = ferry_model_tensor(h->m, 0);
        rc = record_diff(x, ht->data, ot->data, ot->nelem, ferry__shard_esize(c->dtype), &pd);
        ferry_model_free(out);
    } else {
        pd.fresh = out;
    }
    if (rc) {
        ferry_model_free(pd.fresh);
        return rc;
    }
    pending *y = ferry__realloc(x->pd, (x->npd + 1) * sizeof *y);
    if (!y) {
        ferry_model_free(pd.fresh);
        return FERRY_ERR_NOMEM;
    }
    x->pd = y;
    x->pd[x->npd++] = pd;
    return FERRY_OK;
}

static int set_bit(sh_held *h, uint64_t e)
{
    if (!h->changed) {
        const ferry_tensor *t = ferry_model_tensor(h->m, 0);
        if (!(h->changed = ferry__calloc(t->nelem / 8 + 1, 1))) return FERRY_ERR_NOMEM;
    }
    h->changed[e / 8] |= (uint8_t)(1u << (e % 8));
    return FERRY_OK;
}

/* Writes a verified step into the held tiles.  Allocation only where a
 * tile is new; the bitmaps are allocated before any element is written. */
static int step_commit(ferry_shard_subscriber *s, const sh_doc *m, const covset *cs, step *x)
{
    for (size_t i = 0; i < x->npd; i++) {
        pending *pd = &x->pd[i];
        const cov *c = &cs->c[pd->ci];
        if (pd->fresh) continue;
        sh_held *h = ferry__shard_tiles_find(&s->held, c->name, c->r0, c->c0);
        for (uint64_t k = 0; k < pd->count; k++) {
            int rc = set_bit(h, x->elem[pd->first + k]);
            if (rc) return rc;
        }
    }
    /* from here on nothing fails but the adds of new tiles, whose rank
     * held nothing of them: a failure there leaves the old tiles intact */
    bool added = false;
    for (size_t i = 0; i < x->npd; i++) {
        pending *pd = &x->pd[i];
        const cov *c = &cs->c[pd->ci];
        const sh_part *p;
        const sh_tile *t = find_tile(m, c->name, c->r0, c->r1, c->c0, c->c1, &p);
        if (pd->fresh) {
            int rc = ferry__shard_tiles_add(&s->held, c->name, t, pd->fresh);
            if (rc) return rc;
            pd->fresh = NULL;
            added = true;
            continue;
        }
        sh_held *h = ferry__shard_tiles_find(&s->held, c->name, c->r0, c->c0);
        const ferry_tensor *ht = ferry_model_tensor(h->m, 0);
        size_t es = ferry__shard_esize(ht->dtype);
        uint8_t *d = ferry_model_data_mut(h->m, 0);
        for (uint64_t k = 0; k < pd->count; k++) memcpy(d + x->elem[pd->first + k] * es, x->vals.data + pd->voff + k * es, es);
        memcpy(h->hash, t->target, 16);
    }
    if (added) ferry__shard_tiles_sort(&s->held);
    s->held.version = m->version;
    memcpy(s->held.id, m->id, FS_ID_CAP);
    return FERRY_OK;
}

/* ---- the ranged GETs of one version ---- */

#define SH_RANGE_MAX ((uint64_t)64 << 20)   /* bytes of one ranged GET */
#define SH_FETCH_THREADS 8                  /* GETs of one version in flight */
#define SH_BATCH_BYTES ((uint64_t)256 << 20) /* bytes of one version held fetched at once */
#define SH_GAP_SHARE 50                     /* gaps fetched through: at most 1/50 of the wanted bytes */
#define SH_WHOLE_SHARE 8                    /* index form: an object is read whole when the payloads
                                               not wanted are at most 1/8 of those wanted */

/* One ranged GET: the wanted tiles w[i0, i1) of one object, the bytes
 * [off, off + len) including the gaps between them. */
typedef struct range {
    size_t i0, i1;
    uint64_t off, len;
    uint8_t *buf;
    size_t got;
} range;

typedef struct fetch {
    ferry_shard_subscriber *s;
    const sh_doc *m;
    int kind;
    const want *w;
    range *rg;
} fetch;

/* One ranged GET of [off, off + len) of rank's object of kind: *buf (the
 * caller frees it, also on failure), *got; fewer bytes than asked is a
 * truncated object. */
static int get_exact(const ferry_shard_subscriber *s, const sh_doc *m, int kind, uint32_t rank, uint64_t off, uint64_t len,
                     uint8_t **buf, size_t *got)
{
    char key[FS_KEY_CAP];
    object_key(key, s, m, rank, kind);
    if (!(*buf = ferry__malloc((size_t)len + 1))) return FERRY_ERR_NOMEM;
    int rc = ferry_store_get_range(s->st, key, off, (size_t)len, *buf, got);
    if (!rc && *got != len)
        rc = ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: %zu bytes at offset %llu, its manifest says %llu (truncated)", key, *got,
                         (unsigned long long)off, (unsigned long long)len);
    return rc;
}

static int fetch_one(void *ctx, size_t j, int worker)
{
    (void)worker;
    fetch *f = ctx;
    range *r = &f->rg[j];
    return get_exact(f->s, f->m, f->kind, f->w[r->i0].part->rank, r->off, r->len, &r->buf, &r->got);
}

/* Fetches the batch of ranges that starts at rg[i] (up to SH_BATCH_BYTES,
 * at least one range) in parallel; *end: the range after it.  With info,
 * the GETs and bytes are counted.  The caller uses the buffers, then
 * batch_free. */
static int fetch_batch(ferry_shard_subscriber *s, const sh_doc *m, int kind, const want *w, range *rg, size_t nrg, size_t i,
                       size_t *end, ferry_shard_pull_info *info)
{
    size_t j = i + 1;
    uint64_t bytes = rg[i].len;
    while (j < nrg && bytes + rg[j].len <= SH_BATCH_BYTES) bytes += rg[j++].len;
    *end = j;
    fetch f = {s, m, kind, w, rg + i};
    int rc = ferry__parallel(j - i < SH_FETCH_THREADS ? (int)(j - i) : SH_FETCH_THREADS, j - i, fetch_one, &f);
    for (size_t k = i; info && k < j; k++)
        if (rg[k].got) {
            info->requests++;
            info->object_bytes += rg[k].got;
            info->bytes_fetched += rg[k].got;
        }
    return rc;
}

static void batch_free(range *rg, size_t i, size_t j)
{
    for (size_t k = i; k < j; k++) {
        free(rg[k].buf);
        rg[k].buf = NULL;
    }
}

static int cmp_gap(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b; /* {gap bytes, index} */
    if (x[0] != y[0]) return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

/* The ranged GETs of the wanted tiles w[0, n) (sorted by object and
 * offset): runs of one object coalesced where the gap is at most
 * coalesce_gap, then the smallest gaps between runs of one object fetched
 * through until at most `budget` GETs are left, as long as the gaps
 * fetched through stay within 1/SH_GAP_SHARE of the wanted bytes (no GET
 * above SH_RANGE_MAX).  A row split of whole rank parts takes at most R
 * GETs; other layouts may take more rather than fetch large gaps. */
static int plan_ranges(const want *w, size_t n, uint64_t coalesce_gap, size_t budget, range **out, size_t *nout)
{
    *out = NULL;
    *nout = 0;
    range *rg = ferry__calloc(n + 1, sizeof *rg);
    if (!rg) return FERRY_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        uint64_t end = w[i].off + w[i].size;
        while (j < n && w[j].part->rank == w[i].part->rank && w[j].off >= end && w[j].off - end <= coalesce_gap &&
               w[j].off + w[j].size - w[i].off <= SH_RANGE_MAX) {
            end = w[j].off + w[j].size;
            j++;
        }
        rg[k++] = (range){i, j, w[i].off, end - w[i].off, NULL, 0};
        i = j;
    }
    if (k > budget && k > 1) {
        /* gaps between neighbouring runs of one object, smallest first;
         * lo[] / hi[] hold the first and last run of each merged group at
         * its two ends (groups are intervals of runs) */
        uint64_t (*gap)[2] = ferry__calloc(k, sizeof *gap);
        size_t *lo = ferry__calloc(k, sizeof *lo), *hi = ferry__calloc(k, sizeof *hi);
        if (!gap || !lo || !hi) {
            free(gap);
            free(lo);
            free(hi);
            free(rg);
            return FERRY_ERR_NOMEM;
        }
        size_t ng = 0;
        for (size_t i = 0; i < k; i++) lo[i] = hi[i] = i;
        for (size_t i = 0; i + 1 < k; i++)
            if (w[rg[i].i0].part->rank == w[rg[i + 1].i0].part->rank && rg[i + 1].off >= rg[i].off + rg[i].len) {
                /* (tiles a hostile manifest makes overlap are never merged) */
                gap[ng][0] = rg[i + 1].off - (rg[i].off + rg[i].len);
                gap[ng][1] = i;
                ng++;
            }
        qsort(gap, ng, sizeof *gap, cmp_gap);
        size_t left = k;
        uint64_t wanted = 0, spent = 0;
        for (size_t i = 0; i < n; i++) wanted += w[i].size;
        for (size_t g = 0; g < ng && left > budget; g++) {
            size_t i = (size_t)gap[g][1], a = lo[i], b = hi[i + 1];
            if (spent + gap[g][0] > wanted / SH_GAP_SHARE) break; /* the smallest gap left is too large */
            if (rg[b].off + rg[b].len - rg[a].off > SH_RANGE_MAX) continue;
            spent += gap[g][0];
            hi[a] = b;
            lo[b] = a;
            left--;
        }
        size_t m = 0;
        for (size_t i = 0; i < k; m++) {
            size_t b = hi[i];
            rg[m] = (range){rg[i].i0, rg[b].i1, rg[i].off, rg[b].off + rg[b].len - rg[i].off, NULL, 0};
            i = b + 1;
        }
        k = m;
        free(gap);
        free(lo);
        free(hi);
    }
    *out = rg;
    *nout = k;
    return FERRY_OK;
}

static int apply_ix(ferry_shard_subscriber *s, sh_doc *m, int kind, const covset *cs, ferry_shard_pull_info *info);

/* Applies version m (kind: SH_ANCHOR from nothing, SH_DELTA from m-1). */
static int apply_version(ferry_shard_subscriber *s, sh_doc *m, int kind, const covset *cs, ferry_shard_pull_info *info)
{
    if (m->index_form) return apply_ix(s, m, kind, cs, info);
    want *w = ferry__calloc(cs->n + 1, sizeof *w);
    if (!w) return FERRY_ERR_NOMEM;
    int rc = FERRY_OK;
    for (size_t i = 0; i < cs->n && !rc; i++) {
        const cov *c = &cs->c[i];
        const sh_part *p = NULL;
        const sh_tile *t = find_tile(m, c->name, c->r0, c->r1, c->c0, c->c1, &p);
        if (!t || p->dtype != c->dtype)
            rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "run %s version %llu: tensor '%s' has no tile [%llu:%llu, %llu:%llu] (the tile "
                             "grid changed)", s->run, (unsigned long long)m->version, c->name, (unsigned long long)c->r0,
                             (unsigned long long)c->r1, (unsigned long long)c->c0, (unsigned long long)c->c1);
        else if (!t->loc[kind].size)
            rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "run %s version %llu: tensor '%s' tile has no %s patch", s->run,
                             (unsigned long long)m->version, c->name, kind ? "anchor" : "delta");
        else w[i] = (want){i, p, t, t->loc[kind].off, t->loc[kind].size};
    }
    if (!rc) qsort(w, cs->n, sizeof *w, cmp_want);
    /* aiming at `world` ranged GETs a version (with HEAD and the manifest,
     * world + 2 GETs), issued in parallel */
    range *rg = NULL;
    size_t nrg = 0;
    if (!rc) rc = plan_ranges(w, cs->n, s->o.coalesce_gap, (size_t)m->world, &rg, &nrg);
    step x;
    memset(&x, 0, sizeof x);
    for (size_t i = 0, j; i < nrg && !rc; i = j) {
        rc = fetch_batch(s, m, kind, w, rg, nrg, i, &j, info);
        for (size_t k = i; k < j && !rc; k++) {
            for (size_t t = rg[k].i0; t < rg[k].i1 && !rc; t++)
                rc = take_tile(s, m, kind, &cs->c[w[t].ci], &w[t], rg[k].buf + (w[t].off - rg[k].off), &x, false);
            if (!rc) info->tiles += rg[k].i1 - rg[k].i0;
        }
        batch_free(rg, i, j);
    }
    if (!rc) rc = step_commit(s, m, cs, &x);
    step_release(&x);
    free(rg);
    free(w);
    return rc;
}

/* ---- the index form: each object's tile index, then its tiles ----
 *
 * Per object the island holds tiles of: when the payloads it does not want
 * are estimated at most the index's leaves plus options.get_bytes, or at most
 * 1/SH_WHOLE_SHARE of those it wants, and the object is at most
 * SH_RANGE_MAX: one GET of the payloads and the index
 * entries (not the leaves: it computes them); else one GET of the
 * index section (entries and leaves, checked against the root), then the
 * wanted tiles' ranges, planned as the old form's are.  The GETs of each
 * round are issued in parallel. */

typedef struct ixobj {
    uint32_t rank;
    size_t first, count;      /* its wants w[first, first + count) */
    bool whole;
    uint64_t off, len;        /* the first GET */
    uint8_t *buf;
    size_t got;
    sh_ix ix;
} ixobj;

typedef struct ixfetch {
    ferry_shard_subscriber *s;
    const sh_doc *m;
    int kind;
    ixobj *o;
} ixfetch;

static int ix_fetch_one(void *ctx, size_t j, int worker)
{
    (void)worker;
    ixfetch *f = ctx;
    ixobj *o = &f->o[j];
    return get_exact(f->s, f->m, f->kind, o->rank, o->off, o->len, &o->buf, &o->got);
}

static int cmp_want_leaf(const void *a, const void *b)
{
    const want *x = a, *y = b;
    if (x->part->rank != y->part->rank) return x->part->rank < y->part->rank ? -1 : 1;
    return x->tile->leaf < y->tile->leaf ? -1 : x->tile->leaf > y->tile->leaf;
}

/* Checks the payload of want w (tile i of object o) against its leaf. */
static int ix_check(const char *key, const ixobj *o, const want *w, const uint8_t *payload, const uint8_t *leaf)
{
    uint8_t l[32];
    int rc = ferry__shard_ix_leaf(&o->ix, (size_t)w->tile->leaf, payload, l);
    if (!rc && memcmp(l, leaf, 32))
        rc = ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: tile %llu ([%llu:%llu, %llu:%llu]) does not hash to its index leaf", key,
                         (unsigned long long)w->tile->leaf, (unsigned long long)w->tile->r0, (unsigned long long)w->tile->r1,
                         (unsigned long long)w->tile->c0, (unsigned long long)w->tile->c1);
    return rc;
}

static int apply_ix(ferry_shard_subscriber *s, sh_doc *m, int kind, const covset *cs, ferry_shard_pull_info *info)
{
    want *w = ferry__calloc(cs->n + 1, sizeof *w);
    ixobj *ob = ferry__calloc(m->world + 1, sizeof *ob);
    if (!w || !ob) {
        free(w);
        free(ob);
        return FERRY_ERR_NOMEM;
    }
    int rc = FERRY_OK;
    for (size_t i = 0; i < cs->n && !rc; i++) {
        const cov *c = &cs->c[i];
        const sh_part *p = NULL;
        const sh_tile *t = find_tile(m, c->name, c->r0, c->r1, c->c0, c->c1, &p);
        if (!t || p->dtype != c->dtype)
            rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "run %s version %llu: tensor '%s' has no tile [%llu:%llu, %llu:%llu] (the tile "
                             "grid changed)", s->run, (unsigned long long)m->version, c->name, (unsigned long long)c->r0,
                             (unsigned long long)c->r1, (unsigned long long)c->c0, (unsigned long long)c->c1);
        else if (!m->obj_bytes[2 * (size_t)p->rank + (size_t)kind])
            rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "run %s version %llu: tensor '%s': rank %u has no %s object", s->run,
                             (unsigned long long)m->version, c->name, p->rank, kind ? "anchor" : "delta");
        else w[i] = (want){i, p, t, 0, 0};
    }
    if (!rc) qsort(w, cs->n, sizeof *w, cmp_want_leaf);
    size_t nob = 0;
    for (size_t i = 0; i < cs->n && !rc;) {
        size_t j = i + 1;
        while (j < cs->n && w[j].part->rank == w[i].part->rank) j++;
        uint32_t r = w[i].part->rank;
        size_t o = 2 * (size_t)r + (size_t)kind;
        uint64_t n = m->obj_tiles[o], ioff = m->obj_index[o], head = 0;
        ferry__shard_ix_size(n, false, &head); /* checked at parse */
        ixobj *x = &ob[nob++];
        x->rank = r;
        x->first = i;
        x->count = j - i;
        /* The payloads it does not want are estimated from the object's
           payload bytes (ioff) by tile area.  Read whole (one GET, no
           leaves read) unless they outweigh both the leaves and a second
           GET (options.get_bytes) and 1/SH_WHOLE_SHARE of the payloads it wants */
        double aw = 0, at = 0; /* by tile area: the words it wants of the rank's words */
        for (size_t k = i; k < j; k++) aw += (double)(w[k].tile->r1 - w[k].tile->r0) * (double)(w[k].tile->c1 - w[k].tile->c0);
        for (size_t q = 0; q < m->nparts; q++)
            if (m->parts[q].rank == r) at += (double)(m->parts[q].r1 - m->parts[q].r0) * (double)m->parts[q].cols;
        uint64_t unwanted = at > 0 ? (uint64_t)((double)ioff * (1 - aw / at)) : 0, wanted = ioff - unwanted;
        x->whole = ioff + head <= SH_RANGE_MAX &&
                   (unwanted <= n * SH_IX_LEAF + s->o.get_bytes || unwanted <= wanted / SH_WHOLE_SHARE);
        x->off = x->whole ? 0 : ioff;
        x->len = x->whole ? ioff + head : m->obj_bytes[o] - ioff;
        i = j;
    }
    /* round 1: the indexes (with the payloads of objects read whole), in
       batches of at most SH_BATCH_BYTES (at least one object) */
    step x;
    memset(&x, 0, sizeof x);
    size_t npart = 0;         /* wants of the objects not read whole, in w2 */
    want *w2 = rc ? NULL : ferry__calloc(cs->n + 1, sizeof *w2);
    if (!rc && !w2) rc = FERRY_ERR_NOMEM;
    for (size_t b0 = 0; b0 < nob && !rc;) {
        size_t b1 = b0 + 1;
        uint64_t bytes = ob[b0].len;
        while (b1 < nob && bytes + ob[b1].len <= SH_BATCH_BYTES) bytes += ob[b1++].len;
        ixfetch f = {s, m, kind, ob + b0};
        rc = ferry__parallel(b1 - b0 < SH_FETCH_THREADS ? (int)(b1 - b0) : SH_FETCH_THREADS, b1 - b0, ix_fetch_one, &f);
        for (size_t k = b0; k < b1; k++)
            if (ob[k].got) {
                uint64_t ib = ob[k].whole ? ob[k].len - m->obj_index[2 * (size_t)ob[k].rank + (size_t)kind] : ob[k].len;
                info->requests++;
                info->bytes_fetched += ob[k].got;
                info->manifest_bytes += ib;
                info->object_bytes += ob[k].got - ib;
            }
        for (size_t k = b0; k < b1 && !rc; k++) {
            ixobj *o = &ob[k];
            size_t oi = 2 * (size_t)o->rank + (size_t)kind;
            uint64_t ioff = m->obj_index[oi];
            char key[FS_KEY_CAP];
            object_key(key, s, m, o->rank, kind);
            if ((rc = ferry__shard_ix_parse(key, o->buf + (o->whole ? ioff : 0), o->len - (o->whole ? ioff : 0), m->obj_tiles[oi],
                                            ioff, !o->whole, &o->ix)))
                break;
            if (o->whole) { /* every leaf from the payloads read, then the root */
                if (!(o->ix.leaf = ferry__malloc((size_t)o->ix.n * SH_IX_LEAF + 1))) rc = FERRY_ERR_NOMEM;
                for (size_t i = 0; i < o->ix.n && !rc; i++)
                    rc = ferry__shard_ix_leaf(&o->ix, i, o->buf + o->ix.off[i], o->ix.leaf + i * SH_IX_LEAF);
            }
            if (!rc) rc = ferry__shard_ix_check_root(key, &o->ix, m->obj_root + 32 * oi);
            /* the index verified: the wanted tiles' targets and places;
               the tiles of an object read whole made its root */
            for (size_t i = o->first; i < o->first + o->count && !rc; i++) {
                sh_tile *t = (sh_tile *)w[i].tile;
                size_t li = (size_t)t->leaf;
                memcpy(t->target, o->ix.target + 16 * li, 16);
                t->loc[kind].off = w[i].off = o->ix.off[li];
                t->loc[kind].size = w[i].size = o->ix.off[li + 1] - o->ix.off[li];
                if (!o->whole) {
                    w2[npart++] = w[i];
                    continue;
                }
                rc = take_tile(s, m, kind, &cs->c[w[i].ci], &w[i], o->buf + w[i].off, &x, true);
                if (!rc) info->tiles++;
            }
        }
        for (size_t k = b0; k < b1; k++) {
            free(ob[k].buf);
            ob[k].buf = NULL;
            if (ob[k].whole) { /* its leaves are not needed again */
                free(ob[k].ix.leaf);
                ob[k].ix.leaf = NULL;
            }
        }
        b0 = b1;
    }
    /* round 2: the wanted tiles of the other objects */
    range *rg = NULL;
    size_t nrg = 0, nparto = 0;
    for (size_t k = 0; k < nob; k++) nparto += !ob[k].whole;
    if (!rc && npart) {
        qsort(w2, npart, sizeof *w2, cmp_want);
        rc = plan_ranges(w2, npart, s->o.coalesce_gap, nparto, &rg, &nrg);
    }
    for (size_t i = 0, j; i < nrg && !rc; i = j) {
        rc = fetch_batch(s, m, kind, w2, rg, nrg, i, &j, info);
        for (size_t k = i; k < j && !rc; k++)
            for (size_t t = rg[k].i0; t < rg[k].i1 && !rc; t++) {
                const uint8_t *pl = rg[k].buf + (w2[t].off - rg[k].off);
                const ixobj *o = NULL;
                for (size_t q = 0; q < nob && !o; q++)
                    if (ob[q].rank == w2[t].part->rank) o = &ob[q];
                char key[FS_KEY_CAP];
                object_key(key, s, m, o->rank, kind);
                rc = ix_check(key, o, &w2[t], pl, o->ix.leaf + SH_IX_LEAF * w2[t].tile->leaf);
                if (!rc) rc = take_tile(s, m, kind, &cs->c[w2[t].ci], &w2[t], pl, &x, true);
                if (!rc) info->tiles++;
            }
        batch_free(rg, i, j);
    }
    if (!rc) rc = step_commit(s, m, cs, &x);
    step_release(&x);
    for (size_t k = 0; k < nob; k++) ferry__shard_ix_release(&ob[k].ix);
    free(rg);
    free(ob);
    free(w2);
    free(w);
    return rc;
}

/* ---- changes of the last pull ---- */

static int region_changes(ferry_shard_subscriber *s, region *g)
{
    uint64_t rows = g->r.row_end - g->r.row_begin, cols = g->r.col_end - g->r.col_begin;
    size_t es = ferry__shard_esize(g->dtype);
    size_t n = 0, cap_pos = 0, cap_vals = 0, nin = 0;
    /* the held tiles that intersect the region, in (r0, c0) order */
    size_t *in = ferry__calloc(s->held.n + 1, sizeof *in);
    if (!in) return FERRY_ERR_NOMEM;
    for (size_t i = 0; i < s->held.n; i++) {
        sh_held *h = &s->held.t[i];
        if (!strcmp(h->name, g->r.name) && h->r1 > g->r.row_begin && h->r0 < g->r.row_end && h->c1 > g->r.col_begin &&
            h->c0 < g->r.col_end)
            in[nin++] = i;
    }
    for (uint64_t r = g->r.row_begin; r < g->r.row_end; r++) {
        for (size_t ii = 0; ii < nin; ii++) {
            sh_held *h = &s->held.t[in[ii]];
            if (r < h->r0 || r >= h->r1) continue;
            if (h->fresh) {
                g->all = true;
                continue;
            }
            if (!h->changed) continue;
            uint64_t a = h->c0 > g->r.col_begin ? h->c0 : g->r.col_begin, b = h->c1 < g->r.col_end ? h->c1 : g->r.col_end;
            uint64_t tc = h->c1 - h->c0;
            const uint8_t *d = ferry_model_tensor(h->m, 0)->data;
            for (uint64_t c = a; c < b; c++) {
                uint64_t e = (r - h->r0) * tc + (c - h->c0);
                if (!(h->changed[e / 8] >> (e % 8) & 1)) continue;
                if (ferry__grow((void **)&g->pos, &cap_pos, n + 1, sizeof *g->pos) ||
                    ferry__grow((void **)&g->vals, &cap_vals, n + 1, es)) {
                    free(in);
                    return FERRY_ERR_NOMEM;
                }
                g->pos[n] = (int64_t)((r - g->r.row_begin) * cols + (c - g->r.col_begin));
                memcpy(g->vals + n * es, d + e * es, es);
                n++;
            }
        }
    }
    (void)rows;
    free(in);
    g->nchg = g->all ? 0 : n;
    return FERRY_OK;
}

/* ---- pull ---- */

typedef struct chain {
    sh_doc *m;                /* manifests, lowest version first */
    size_t n;
} chain;

static void chain_release(chain *c)
{
    for (size_t i = 0; i < c->n; i++) ferry__shard_doc_release(&c->m[i]);
    free(c->m);
    memset(c, 0, sizeof *c);
}

/* Manifests from `top` (version, id) down to version lo, by prev links. */
static int walk(ferry_shard_subscriber *s, fs_ref top, uint64_t lo, chain *out, ferry_shard_pull_info *info)
{
    memset(out, 0, sizeof *out);
    size_t n = (size_t)(top.version - lo + 1);
    if (!(out->m = ferry__calloc(n, sizeof *out->m))) return FERRY_ERR_NOMEM;
    out->n = n;
    fs_ref r = top;
    for (size_t i = n; i-- > 0;) {
        fs_count cnt = {0};
        int rc = ferry__shard_manifest_read_lc(s->st, s->run, s->o.keys, r.version, r.id, &cnt, &s->lc, &out->m[i]);
        info->bytes_fetched += cnt.bytes;
        info->manifest_bytes += cnt.bytes;
        if (rc == FERRY_ERR_STORE_NOT_FOUND)
            rc = ferry__fail(FERRY_ERR_SYNC_GONE, "run %s: the manifest of version %llu is gone (GC)", s->run, (unsigned long long)r.version);
        if (rc) return rc;
        r = out->m[i].prev;
    }
    return FERRY_OK;
}

/* The compaction index, when it is usable: a broken, unsigned or foreign
 * one only costs the shortcut (false, nothing to release). */
static bool comp_index(ferry_shard_subscriber *s, const char *run_id, ferry_shard_pull_info *in, fs_index *ix)
{
    fs_count cnt = {0};
    int rc = ferry__sync_index_read(s->st, s->run, s->o.keys, &cnt, ix, NULL);
    in->bytes_fetched += cnt.bytes;
    in->manifest_bytes += cnt.bytes;
    if (!rc && (rc = ferry__sync_run_id_agree(s->run, "the compaction index", run_id, ix->run_id))) ferry__sync_index_release(ix);
    if (rc) ferry__clear_error();
    return !rc;
}

/* Entry c starts at the version held (and its id), is sharded and was not
 * refused. */
static bool comp_from_held(const ferry_shard_subscriber *s, const fs_compaction *c)
{
    return c->world && c->from == s->held.version && !strcmp(c->from_id, s->held.id) && c->to > c->from &&
           strcmp(c->id, s->refused);
}

/* The highest version B <= target that a usable sharded compaction from
 * the version held reaches (0: none): where the walk stops when the chain
 * below it is gone. */
static uint64_t comp_reach(const ferry_shard_subscriber *s, const fs_index *ix, uint64_t target)
{
    uint64_t b = 0;
    for (size_t e = 0; e < ix->n; e++)
        if (comp_from_held(s, &ix->c[e]) && ix->c[e].to <= target && ix->c[e].to > b) b = ix->c[e].to;
    return b;
}

/* A sharded compaction (docs/SHARDING.md "Compaction") the island at cur
 * (the version held) takes instead of the chain's first k versions
 * ch->m[0, k) (cur+1..B, B <= the target): from exactly cur and its id to
 * B and its id, of B's rank count and shard hash, one object per rank with
 * B's tile count (the layout's leaves index it), and fewer bytes in the
 * objects of the ranks the cover touches than the chain's delta objects of
 * those ranks; the largest saving wins.  gone: the chain below B is gone
 * (ch->m[0] is B): the compaction to B is taken, k = 1.  Returns k (0:
 * none) and *cm: B's manifest reading the compaction's objects (its own
 * arrays; the parts are B's, borrowed). */
static size_t pick_compaction(const ferry_shard_subscriber *s, const fs_index *ix, const chain *ch, const covset *cs, bool gone,
                              sh_doc *cm)
{
    const sh_doc *T = &ch->m[ch->n - 1];
    bool *touch = ferry__calloc(T->world + 1, sizeof *touch);
    for (size_t i = 0; touch && i < cs->n; i++) {
        const sh_part *p = NULL;
        if (find_tile(T, cs->c[i].name, cs->c[i].r0, cs->c[i].r1, cs->c[i].c0, cs->c[i].c1, &p)) touch[p->rank] = true;
    }
    size_t best = 0;
    uint64_t saving = 0;
    const fs_compaction *be = NULL;
    for (size_t e = 0; touch && e < ix->n; e++) {
        const fs_compaction *c = &ix->c[e];
        if (!comp_from_held(s, c)) continue;
        size_t k = gone ? 1 : c->to - c->from <= ch->n ? (size_t)(c->to - c->from) : 0;
        const sh_doc *B = k ? &ch->m[k - 1] : NULL;
        if (!B || B->world != T->world || ferry__shard_comp_check(s->run, B, c, ix->obj + c->obj0)) {
            ferry__clear_error();
            continue;
        }
        uint64_t comp = 0, chn = 0;
        for (uint32_t r = 0; r < c->world; r++) {
            if (!touch[r]) continue;
            comp += ix->obj[c->obj0 + r].bytes;
            for (size_t i = 0; i < k; i++) chn += ch->m[i].obj_bytes[2 * (size_t)r + SH_DELTA];
        }
        if (gone || (comp < chn && chn - comp > saving)) {
            saving = chn - comp;
            best = k;
            be = c;
            if (gone) break;
        }
    }
    free(touch);
    if (best && ferry__shard_comp_view(&ch->m[best - 1], be, ix->obj + be->obj0, cm)) best = 0;
    return best;
}

/* One pull from the store s->st; counters and change lists accumulate
 * in `in` and the held tiles (ferry_shard_pull starts them).  no_comp: no
 * compaction is taken (the second try, from the anchor, after the one a
 * gone chain left refused). */
static int pull_from(ferry_shard_subscriber *s, int mode, uint64_t version, ferry_shard_pull_info *in, bool no_comp)
{
    fs_head h;
    fs_count cnt = {0};
    int rc = ferry__sync_head_read(s->st, s->run, s->o.keys, &cnt, &h, NULL);
    in->bytes_fetched += cnt.bytes;
    in->manifest_bytes += cnt.bytes;
    chain ch = {0};
    covset cs = {0};
    fs_index ix = {0};
    bool ix_read = false, gone = false, again = false;
    if (rc == FERRY_ERR_STORE_NOT_FOUND) rc = ferry__fail(FERRY_ERR_SYNC_NOT_YET, "run %s: no version published yet", s->run);
    if (rc) goto out;
    in->head_version = h.version;
    if ((rc = ferry__sync_run_id_pinned(s->run, s->pin, h.run_id, "HEAD", h.version, "island"))) goto out;
    uint64_t cur = s->held.version, target = h.version, floor = s->max_held > cur ? s->max_held : cur;
    /* a store behind (the next one may not be), or one whose HEAD was put
       back to an older signed version: never a way back, in any mode */
    if (h.version < floor) {
        rc = ferry__fail(FERRY_ERR_SYNC_BACKWARDS, "run %s: HEAD is at %llu, below version %llu held: refused", s->run,
                         (unsigned long long)h.version, (unsigned long long)floor);
        goto out;
    }
    if (mode == FERRY_SYNC_MIN && cur >= version && cur) target = cur;
    else if ((mode == FERRY_SYNC_MIN || mode == FERRY_SYNC_EXACT) && version > h.version) {
        rc = ferry__fail(FERRY_ERR_SYNC_NOT_YET, "run %s: version %llu asked, HEAD is at %llu", s->run, (unsigned long long)version,
                         (unsigned long long)h.version);
        goto out;
    } else if (mode == FERRY_SYNC_EXACT) target = version;
    if (mode == FERRY_SYNC_EXACT && !version) {
        rc = ferry__fail(FERRY_ERR_ARG, "ferry_shard_pull: version 0");
        goto out;
    }
    if (target == cur) goto out;
    /* the manifests from HEAD down to the target, then below it what the
     * path needs: the chain from cur, or from the target's anchor */
    fs_ref top = {h.version, ""};
    memcpy(top.id, h.id, FS_ID_CAP);
    if ((rc = walk(s, top, target, &ch, in))) goto out;
    if ((rc = ferry__sync_run_id_agree(s->run, "the target's manifest", h.run_id, ch.m[0].run_id))) goto out;
    sh_doc tm = ch.m[0];
    ch.m[0] = (sh_doc){0};
    chain_release(&ch);
    bool use_chain = cur && cur < target;
    uint64_t lo = use_chain ? cur + 1 : tm.anchor.version;
    if (lo < target) {
        rc = walk(s, tm.prev, lo, &ch, in);
        if (rc == FERRY_ERR_SYNC_GONE && use_chain && !no_comp) { /* the chain is gone (GC): a compaction from cur, else the anchor */
            ferry__clear_error();
            chain_release(&ch);
            uint64_t b = (ix_read = comp_index(s, h.run_id, in, &ix)) ? comp_reach(s, &ix, target) : 0;
            rc = !b ? FERRY_ERR_SYNC_GONE : b < target ? walk(s, tm.prev, b, &ch, in) : FERRY_OK;
            if (!rc) gone = true;
        }
        if (rc == FERRY_ERR_SYNC_GONE && use_chain) {
            ferry__clear_error();
            chain_release(&ch);
            use_chain = false;
            lo = tm.anchor.version;
            rc = lo < target ? walk(s, tm.prev, lo, &ch, in) : FERRY_OK;
        }
        if (rc) {
            ferry__shard_doc_release(&tm);
            goto out;
        }
    }
    sh_doc *all = ferry__realloc(ch.m, (ch.n + 1) * sizeof *all);
    if (!all) {
        ferry__shard_doc_release(&tm);
        rc = FERRY_ERR_NOMEM;
        goto out;
    }
    ch.m = all;
    ch.m[ch.n++] = tm;
    /* another lineage (a recreated run); past a gone chain the compaction
       is from the version held (its id) */
    if (use_chain && !gone && strcmp(ch.m[0].prev.id, s->held.id)) {
        use_chain = false;
        chain_release(&ch);
        if ((rc = walk(s, top, tm.anchor.version, &ch, in))) goto out;
        /* keep only anchor..target */
        size_t keep = (size_t)(target - ch.m[0].version + 1);
        for (size_t i = keep; i < ch.n; i++) ferry__shard_doc_release(&ch.m[i]);
        ch.n = keep;
    }
    if ((rc = resolve(s, &ch.m[ch.n - 1], &cs))) goto out;
    /* from the anchor, the tiles are built aside: the old ones come back
     * if the anchor does not verify */
    sh_tileset old = {0};
    if (!use_chain) {
        old = s->held;
        memset(&s->held, 0, sizeof s->held);
    }
    for (size_t i = 0; i < ch.n; i++)
        for (uint32_t r = 0; r < ch.m[i].world; r++) in->version_bytes += ch.m[i].obj_bytes[2 * r + (use_chain || i ? 0 : 1)];
    if (use_chain) snprintf(in->path, sizeof in->path, "chain %llu..%llu", (unsigned long long)cur, (unsigned long long)target);
    else if (ch.n > 1)
        snprintf(in->path, sizeof in->path, "anchor %llu + chain %llu..%llu", (unsigned long long)ch.m[0].version,
                 (unsigned long long)ch.m[0].version, (unsigned long long)target);
    else snprintf(in->path, sizeof in->path, "anchor %llu", (unsigned long long)target);
    /* a compaction from the version held, when it costs less than the
       chain (past a gone chain: the only way short of the anchor); one
       that fails (gone, corrupt) leaves the tiles at cur and is not tried
       again: the chain is taken, or the pull starts over (the anchor) */
    size_t i0 = 0;
    if (use_chain && !no_comp && (ch.n > 1 || gone) && (ix_read || (ix_read = comp_index(s, h.run_id, in, &ix)))) {
        sh_doc cm = {0};
        size_t k = pick_compaction(s, &ix, &ch, &cs, gone, &cm);
        int r2 = k ? apply_version(s, &cm, SH_DELTA, &cs, in) : FERRY_OK;
        if (k && !r2) {
            i0 = k;
            int w = snprintf(in->path, sizeof in->path, "compacted %llu..%llu", (unsigned long long)cur,
                             (unsigned long long)cm.version);
            if (k < ch.n && w > 0 && (size_t)w < sizeof in->path)
                snprintf(in->path + w, sizeof in->path - (size_t)w, " + chain %llu..%llu", (unsigned long long)cm.version,
                         (unsigned long long)target);
        } else if (k && r2 == FERRY_ERR_NOMEM) {
            rc = r2;
        } else if (k) {
            snprintf(in->path, sizeof in->path, "chain %llu..%llu (compacted %llu..%llu refused)", (unsigned long long)cur,
                     (unsigned long long)target, (unsigned long long)cur, (unsigned long long)cm.version);
            /* remembered only when the compaction is at fault (its objects
               bad, cut short or gone); a read error of the store's (network,
               I/O) is tried again at the next pull */
            if (ferry__sync_object_error(r2) || r2 == FERRY_ERR_STORE_RANGE) memcpy(s->refused, cm.comp_id, FS_ID_CAP);
            ferry__clear_error();
        }
        if (gone && !i0 && !rc) again = true; /* no way past the gone chain but the anchor */
        ferry__shard_comp_view_release(&cm);
    } else if (gone) {
        again = true;
    }
    if (again) goto out;
    for (size_t i = i0; i < ch.n && !rc; i++) {
        rc = apply_version(s, &ch.m[i], use_chain || i ? SH_DELTA : SH_ANCHOR, &cs, in);
        if (use_chain || i) continue;
        if (rc) {
            ferry__shard_tiles_release(&s->held);
            s->held = old;
        } else {
            ferry__shard_tiles_release(&old);
            for (size_t k = 0; k < s->held.n; k++) s->held.t[k].fresh = true;
        }
    }
    in->to_version = s->held.version;
    for (size_t i = 0; i < s->nrg && s->held.version; i++) {
        int r2 = region_changes(s, &s->rg[i]);
        if (r2 && !rc) rc = r2;
    }
    if (!rc && h.run_id[0]) memcpy(s->pin, h.run_id, FS_ID_CAP); /* pinned by the first version pulled */
out:
    chain_release(&ch);
    free(cs.c);
    ferry__sync_index_release(&ix);
    if (again && !rc) return pull_from(s, mode, version, in, true); /* once, from the anchor */
    if (rc) ferry__context(rc, "run %s: pulling %llu regions from %s", s->run, (unsigned long long)s->nrg, ferry_store_url(s->st));
    return rc;
}

int ferry_shard_pull(ferry_shard_subscriber *s, int mode, uint64_t version, ferry_shard_pull_info *info)
{
    if (!s) return ferry__fail(FERRY_ERR_ARG, "ferry_shard_pull: NULL argument");
    ferry_shard_pull_info dummy, *in = info ? info : &dummy;
    memset(in, 0, sizeof *in);
    in->from_version = in->to_version = s->held.version;
    snprintf(in->path, sizeof in->path, "none");
    clear_changes(s);
    for (size_t i = 0; i < s->held.n; i++) s->held.t[i].fresh = false;
    s->stats.pulls++;
    /* the store list (docs/MIRROR.md): the next store after a failure
       another store may not have; versions completed stay */
    char first[512] = "";
    int rc = FERRY_OK;
    for (size_t i = 0; i < s->nst; i++) {
        s->st = s->alt[i];
        if (!(rc = pull_from(s, mode, version, in, false))) {
            s->used = (unsigned)i;
            if (s->held.version > s->max_held) s->max_held = s->held.version;
            break;
        }
        if (!i) snprintf(first, sizeof first, "%s", ferry_last_error());
        if (!ferry__sync_store_worth_next(rc) || i + 1 == s->nst) break;
    }
    s->st = s->alt[0];
    if (rc && s->nst > 1 && ferry__sync_store_worth_next(rc))
        ferry__context(rc, "every store failed (the first: %.400s); the last", first);
    s->stats.bytes_fetched += in->bytes_fetched;
    s->stats.object_bytes += in->object_bytes;
    s->stats.manifest_bytes += in->manifest_bytes;
    s->stats.requests += in->requests;
    s->stats.tiles += in->tiles;
    return rc;
}

int ferry_shard_subscriber_add_store(ferry_shard_subscriber *s, ferry_store *store)
{
    if (!s || !store) return ferry__fail(FERRY_ERR_ARG, "ferry_shard_subscriber_add_store: NULL argument");
    if (s->nst >= FERRY_SYNC_STORES_MAX)
        return ferry__fail(FERRY_ERR_ARG, "ferry_shard_subscriber_add_store: at most %d stores", FERRY_SYNC_STORES_MAX);
    s->alt[s->nst++] = store;
    return FERRY_OK;
}

unsigned ferry_shard_subscriber_store_used(const ferry_shard_subscriber *s) { return s ? s->used : 0; }

int ferry_shard_wait(ferry_shard_subscriber *s, uint64_t after_version, uint64_t timeout_ms, uint64_t *head)
{
    if (!s) return ferry__fail(FERRY_ERR_ARG, "ferry_shard_wait: NULL argument");
    uint64_t t0 = ferry__mono_ms();
    for (;;) {
        fs_head h;
        fs_count cnt = {0};
        int rc = FERRY_OK;
        for (size_t i = 0; i < s->nst; i++) /* the first store that answers */
            if (!(rc = ferry__sync_head_read(s->alt[i], s->run, s->o.keys, &cnt, &h, NULL)) || rc == FERRY_ERR_STORE_NOT_FOUND ||
                !ferry__sync_store_worth_next(rc))
                break;
        s->stats.bytes_fetched += cnt.bytes;
        s->stats.manifest_bytes += cnt.bytes;
        if (rc == FERRY_ERR_STORE_NOT_FOUND) {
            ferry__clear_error();
            h.version = 0;
        } else if (rc) {
            return rc;
        }
        if (head) *head = h.version;
        if (h.version > after_version) return FERRY_OK;
        uint64_t now = ferry__mono_ms();
        if (now - t0 >= timeout_ms)
            return ferry__fail(FERRY_ERR_SYNC_TIMEOUT, "run %s: no version above %llu within %llu ms", s->run,
                               (unsigned long long)after_version, (unsigned long long)timeout_ms);
        uint64_t left = timeout_ms - (now - t0);
        ferry__sleep_ms(left < s->o.poll_interval_ms ? left : s->o.poll_interval_ms);
    }
}

/* ---- regions out ---- */

static const region *get_region(const ferry_shard_subscriber *s, size_t i, int *rc)
{
    *rc = FERRY_OK;
    if (!s || i >= s->nrg) *rc = ferry__fail(FERRY_ERR_ARG, "region %zu: no such region", i);
    else if (!s->held.version || !s->rg[i].resolved) *rc = ferry__fail(FERRY_ERR_NOT_FOUND, "region %zu: nothing pulled yet", i);
    return *rc ? NULL : &s->rg[i];
}

int ferry_shard_region_shape(const ferry_shard_subscriber *s, size_t i, ferry_dtype *dtype, uint64_t *rows, uint64_t *cols,
                             uint64_t *nbytes)
{
    int rc;
    const region *g = get_region(s, i, &rc);
    if (!g) return rc;
    uint64_t r = g->r.row_end - g->r.row_begin, c = g->r.col_end - g->r.col_begin;
    if (dtype) *dtype = g->dtype;
    if (rows) *rows = r;
    if (cols) *cols = c;
    if (nbytes) *nbytes = r * c * ferry__shard_esize(g->dtype);
    return FERRY_OK;
}

int ferry_shard_region_copy(const ferry_shard_subscriber *s, size_t i, void *dst, size_t cap)
{
    int rc;
    const region *g = get_region(s, i, &rc);
    if (!g) return rc;
    uint64_t cols = g->r.col_end - g->r.col_begin;
    size_t es = ferry__shard_esize(g->dtype);
    if (!dst || cap < (g->r.row_end - g->r.row_begin) * cols * es)
        return ferry__fail(FERRY_ERR_ARG, "region %zu: buffer of %zu bytes is smaller than the region", i, cap);
    for (size_t k = 0; k < s->held.n; k++) {
        const sh_held *h = &s->held.t[k];
        if (strcmp(h->name, g->r.name) || h->r1 <= g->r.row_begin || h->r0 >= g->r.row_end || h->c1 <= g->r.col_begin ||
            h->c0 >= g->r.col_end)
            continue;
        uint64_t r0 = h->r0 > g->r.row_begin ? h->r0 : g->r.row_begin, r1 = h->r1 < g->r.row_end ? h->r1 : g->r.row_end;
        uint64_t c0 = h->c0 > g->r.col_begin ? h->c0 : g->r.col_begin, c1 = h->c1 < g->r.col_end ? h->c1 : g->r.col_end;
        const uint8_t *d = ferry_model_tensor(h->m, 0)->data;
        uint64_t tc = h->c1 - h->c0;
        for (uint64_t r = r0; r < r1; r++)
            memcpy((uint8_t *)dst + ((r - g->r.row_begin) * cols + (c0 - g->r.col_begin)) * es, d + ((r - h->r0) * tc + (c0 - h->c0)) * es,
                   (size_t)(c1 - c0) * es);
    }
    return FERRY_OK;
}

int ferry_shard_region_changes(const ferry_shard_subscriber *s, size_t i, int *all, const int64_t **positions, const void **values,
                               size_t *count)
{
    int rc;
    const region *g = get_region(s, i, &rc);
    if (!g) return rc;
    if (all) *all = g->all;
    if (positions) *positions = g->pos;
    if (values) *values = g->vals;
    if (count) *count = g->nchg;
    return FERRY_OK;
}

/* ---- a state kept by the caller (shard_state.c) ---- */

sh_tileset *ferry__shard_sub_inner(ferry_shard_subscriber *s, ferry_store **st, const char **run, const ferry_keys **keys,
                                   size_t *nregions)
{
    *st = s->st;
    *run = s->run;
    *keys = s->o.keys;
    *nregions = s->nrg;
    return &s->held;
}

const ferry_shard_region *ferry__shard_sub_region(const ferry_shard_subscriber *s, size_t i) { return i < s->nrg ? &s->rg[i].r : NULL; }

int ferry__shard_sub_resolve(ferry_shard_subscriber *s, sh_doc *m)
{
    covset cs = {0};
    int rc = resolve(s, m, &cs);
    /* the index form: the covering tiles' targets from their objects'
       index entries.  An entry's target is bound to the signed root only
       through its leaf, H(length, target, SHA-256 of the payload): the
       stored leaves hash to the root whatever the entries say, so each
       object's index section is read whole (leaves checked against the
       root), then the covering tiles' payloads, and each of their leaves
       recomputed (ix_check) before a target is believed. */
    ixobj *ob = rc || !m->index_form ? NULL : ferry__calloc(m->world + 1, sizeof *ob);
    if (!rc && m->index_form && !ob) rc = FERRY_ERR_NOMEM;
    int kind = m->version > 1 ? SH_DELTA : SH_ANCHOR;
    size_t nob = 0;
    for (uint32_t r = 0; r < m->world && ob && !rc; r++) {
        size_t o = 2 * (size_t)r + (size_t)kind;
        bool any = false;
        for (size_t i = 0; i < cs.n && !any; i++) {
            const sh_part *p = NULL;
            any = find_tile(m, cs.c[i].name, cs.c[i].r0, cs.c[i].r1, cs.c[i].c0, cs.c[i].c1, &p) && p->rank == r;
        }
        if (!any || !m->obj_bytes[o]) continue;
        ob[nob++] = (ixobj){.rank = r, .off = m->obj_index[o], .len = m->obj_bytes[o] - m->obj_index[o]};
    }
    if (!rc && nob) {
        ixfetch f = {s, m, kind, ob};
        rc = ferry__parallel(nob < SH_FETCH_THREADS ? (int)nob : SH_FETCH_THREADS, nob, ix_fetch_one, &f);
    }
    for (size_t k = 0; k < nob && !rc; k++) {
        size_t o = 2 * (size_t)ob[k].rank + (size_t)kind;
        char key[FS_KEY_CAP];
        object_key(key, s, m, ob[k].rank, kind);
        if ((rc = ferry__shard_ix_parse(key, ob[k].buf, ob[k].len, m->obj_tiles[o], m->obj_index[o], true, &ob[k].ix))) break;
        rc = ferry__shard_ix_check_root(key, &ob[k].ix, m->obj_root + 32 * o);
        free(ob[k].buf);
        ob[k].buf = NULL;
    }
    /* the covering tiles' payloads, planned and batched as a pull's */
    want *w = rc || !nob ? NULL : ferry__calloc(cs.n + 1, sizeof *w);
    if (!rc && nob && !w) rc = FERRY_ERR_NOMEM;
    size_t nw = 0, nrg = 0;
    range *rg = NULL;
    for (size_t i = 0; i < cs.n && w && !rc; i++) {
        const sh_part *p = NULL;
        const sh_tile *t = find_tile(m, cs.c[i].name, cs.c[i].r0, cs.c[i].r1, cs.c[i].c0, cs.c[i].c1, &p);
        const ixobj *x = NULL;
        for (size_t q = 0; t && q < nob && !x; q++)
            if (ob[q].rank == p->rank) x = &ob[q];
        if (!x) continue; /* no object of this kind: resolve's callers refuse the tile */
        uint64_t li = t->leaf;
        w[nw++] = (want){i, p, t, x->ix.off[li], x->ix.off[li + 1] - x->ix.off[li]};
    }
    if (!rc && nw) {
        qsort(w, nw, sizeof *w, cmp_want);
        rc = plan_ranges(w, nw, s->o.coalesce_gap, nob, &rg, &nrg);
    }
    for (size_t i = 0, j; i < nrg && !rc; i = j) {
        rc = fetch_batch(s, m, kind, w, rg, nrg, i, &j, NULL);
        for (size_t k = i; k < j && !rc; k++)
            for (size_t t = rg[k].i0; t < rg[k].i1 && !rc; t++) {
                const ixobj *x = NULL;
                for (size_t q = 0; q < nob && !x; q++)
                    if (ob[q].rank == w[t].part->rank) x = &ob[q];
                char key[FS_KEY_CAP];
                object_key(key, s, m, x->rank, kind);
                uint64_t li = w[t].tile->leaf;
                rc = ix_check(key, x, &w[t], rg[k].buf + (w[t].off - rg[k].off), x->ix.leaf + SH_IX_LEAF * li);
                if (!rc) memcpy(((sh_tile *)w[t].tile)->target, x->ix.target + 16 * li, 16);
            }
        batch_free(rg, i, j);
    }
    free(rg);
    free(w);
    for (size_t k = 0; k < nob; k++) {
        free(ob[k].buf);
        ferry__shard_ix_release(&ob[k].ix);
    }
    free(ob);
    free(cs.c);
    return rc;
}
