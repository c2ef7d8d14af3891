/* Sharded publisher: begin (rank 0), put (every rank), commit (rank 0),
 * finish (every rank) — docs/PROTOCOL.md, "Sharded versions".
 *
 * A rank keeps only its own previous tiles (BF16 when gating FP32 masters)
 * to diff against.  Its upload is durable when put returns; nothing is
 * visible until rank 0 has checked every record and written the manifest
 * and then HEAD, by compare-and-swap.  A rank's kept patches become its
 * next base only when the caller reports the commit (finish), by applying
 * them in place (each verified) to its previous tiles.  The previous tiles
 * live in the rank's tile file, not on the heap: a temporary file in
 * $TMPDIR (else /tmp), created with mkstemp and unlinked at once (nothing
 * is left behind on any exit, a crash included), read and written one
 * tile at a time with pread/pwrite.  This version's rank objects are
 * written tile by tile as they are coded into two more such files (the
 * delta and the anchor object), uploaded from there part by part
 * (ferry_store_put_fd) and read back from there by finish.  Memory stays
 * at the caller's rows and a few tile-sized scratch buffers. */
#include "shard_impl.h"

#include "ferry_quant.h"
#include "quant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

struct ferry_shard_publisher {
    ferry_store *st;
    char run[FERRY_SYNC_RUN_MAX + 1];
    char pubid[FERRY_SYNC_PUBLISHER_MAX];
    ferry_shard_options o;
    ferry_model *empty;
    sh_tileset prev;          /* this rank's tiles of version prev.version
                                 (m NULL: their bytes in the tile file) */
    int fd;                   /* the tile file (unlinked), -1 = none yet */
    uint64_t fd_end;          /* bytes of it in use */
    /* after put, until finish */
    bool pending;
    sh_token ptok;
    sh_doc rec;
    int ofd[2];               /* the object files (unlinked), -1 = none yet */
    uint64_t osize[2];        /* bytes of this version's object in each */
    ferry_buf enc;            /* the payload of the tile being coded */
    /* rank 0, between begin and commit */
    bool begun;
    sh_token btok;
    char run_id[FS_ID_CAP];   /* the run id the version begun is written with */
    char head_etag[FERRY_STORE_ETAG_MAX];
    sh_doc last;              /* HEAD's manifest at begin (version 0 = none) */
    sh_coder *coder;          /* tile codec scratch */
    int qcast;                /* quantize: cast_bf16 as given (the parts are cast
                                 while quantized; o.cast_bf16 is then 0) */
};

int ferry_shard_publisher_open(ferry_store *store, const char *run, const ferry_shard_options *opts, ferry_shard_publisher **out)
{
    if (!store || !out || !opts) return ferry__fail(FERRY_ERR_ARG, "ferry_shard_publisher_open: NULL argument");
    *out = NULL;
    int rc = ferry_sync_run_check(run);
    if (rc) return rc;
    if (ferry_store_kind(store) == FERRY_STORE_HTTP)
        return ferry__fail(FERRY_ERR_STORE_READONLY, "%s: cannot publish through a read-only http(s) store", ferry_store_url(store));
    if (!opts->world || opts->world > FERRY_SHARD_WORLD_MAX || opts->rank >= opts->world)
        return ferry__fail(FERRY_ERR_ARG, "run %s: rank %u of world %u: world must be 1..%d and rank below it", run, opts->rank,
                           opts->world, FERRY_SHARD_WORLD_MAX);
    if (opts->publisher_id && !ferry__sync_publisher_valid(opts->publisher_id))
        return ferry__fail(FERRY_ERR_ARG, "publisher id '%.200s': empty, too long, or not printable ASCII without quotes",
                           opts->publisher_id);
    if ((rc = ferry__sign_ring_check(opts->keys, "ferry_shard_publisher_open"))) return rc;
    if (!ferry_quant_name((ferry_quant)opts->quantize))
        return ferry__fail(FERRY_ERR_ARG, "run %s: quantize %d is no ferry_quant", run, opts->quantize);
    if (opts->quantize == FERRY_QUANT_FP8_BLOCK128_STICKY) /* a rank holds tiles, not its previous scales */
        return ferry__fail(FERRY_ERR_UNSUPPORTED, "run %s: a sharded run quantizes with fresh scales (fp8-block128), not %s", run,
                           ferry_quant_name(FERRY_QUANT_FP8_BLOCK128_STICKY));
    ferry_shard_publisher *p = ferry__calloc(1, sizeof *p);
    if (!p) return FERRY_ERR_NOMEM;
    p->st = store;
    p->fd = p->ofd[0] = p->ofd[1] = -1;
    snprintf(p->run, sizeof p->run, "%s", run);
    p->o = *opts;
    p->o.publisher_id = NULL;
    if (p->o.quantize) {
        p->qcast = p->o.cast_bf16;
        p->o.cast_bf16 = 0;
    }
    if (!p->o.anchor_every) p->o.anchor_every = 10;
    if (!p->o.min_tile_words) p->o.min_tile_words = SH_DEFAULT_TILE_WORDS;
    if (opts->publisher_id) snprintf(p->pubid, sizeof p->pubid, "%s", opts->publisher_id);
    else ferry__sync_default_publisher(p->pubid);
    if ((rc = ferry_model_create(&p->empty))) {
        free(p);
        return rc;
    }
    if (!(p->coder = ferry__shard_coder_new())) {
        ferry_model_free(p->empty);
        free(p);
        return FERRY_ERR_NOMEM;
    }
    *out = p;
    return FERRY_OK;
}

/* Empties object file k; its descriptor stays for the next version.  A
 * truncation that fails leaves bytes past osize, which nothing reads:
 * disk space only, so it is not an error of the caller's call. */
static void object_drop(ferry_shard_publisher *p, int k)
{
    if (p->ofd[k] >= 0 && p->osize[k]) (void)!ftruncate(p->ofd[k], 0);
    p->osize[k] = 0;
}

static void drop_pending(ferry_shard_publisher *p)
{
    ferry__shard_doc_release(&p->rec);
    object_drop(p, 0);
    object_drop(p, 1);
    ferry__buf_release(&p->enc);
    p->pending = false;
}

void ferry_shard_publisher_free(ferry_shard_publisher *p)
{
    if (!p) return;
    drop_pending(p);
    ferry__shard_tiles_release(&p->prev);
    if (p->fd >= 0) close(p->fd);
    for (int k = 0; k < 2; k++)
        if (p->ofd[k] >= 0) close(p->ofd[k]);
    ferry__shard_doc_release(&p->last);
    ferry_model_free(p->empty);
    ferry__shard_coder_free(p->coder);
    free(p);
}

uint64_t ferry_shard_publisher_version(const ferry_shard_publisher *p) { return p ? p->prev.version : 0; }

/* ---- the tile file: this rank's previous tiles ---- */

/* A temporary file for this rank (what: "tile file", "object file"):
 * mkstemp in the tmp directory, unlinked at once (only the descriptor
 * names it, so nothing is left behind on any exit), close-on-exec. */
static int tmp_file(ferry_shard_publisher *p, const char *what, int *out)
{
    const char *dir = ferry__sync_tmp_dir(NULL);
    size_t n = strlen(dir) + 40;
    char *path = ferry__malloc(n);
    if (!path) return FERRY_ERR_NOMEM;
    snprintf(path, n, "%s/ferry-shard-tiles.XXXXXX", dir);
    /* close-on-exec from its creation (a child process would keep its disk
     * space; set afterwards, a fork + exec in another thread of the
     * trainer in between would inherit it) */
    int fd = mkostemp(path, O_CLOEXEC);
    int rc = FERRY_OK;
    if (fd < 0) rc = ferry__fail(FERRY_ERR_IO, "run %s rank %u: creating its %s %s: %s", p->run, p->o.rank, what, path, strerror(errno));
    else if (unlink(path)) {
        rc = ferry__fail(FERRY_ERR_IO, "run %s rank %u: unlinking its %s %s: %s", p->run, p->o.rank, what, path, strerror(errno));
        close(fd);
    } else {
        *out = fd;
    }
    free(path);
    return rc;
}

/* Empties the tile file, creating it first if needed. */
static int tiles_file_reset(ferry_shard_publisher *p)
{
    p->fd_end = 0;
    if (p->fd < 0) return tmp_file(p, "tile file", &p->fd);
    if (!ftruncate(p->fd, 0)) return FERRY_OK;
    return ferry__fail(FERRY_ERR_IO, "run %s rank %u: emptying its tile file: %s", p->run, p->o.rank, strerror(errno));
}

static uint64_t held_bytes(const sh_held *h) { return (h->r1 - h->r0) * (h->c1 - h->c0) * ferry__shard_esize(h->dtype); }

/* n bytes at off of one of the rank's files (fd, named what): written
 * from src (dst NULL) or read into dst. */
static int file_io(ferry_shard_publisher *p, int fd, const char *what, const uint8_t *src, uint8_t *dst, uint64_t n, uint64_t off)
{
    while (n) {
        size_t c = n > ((size_t)1 << 30) ? (size_t)1 << 30 : (size_t)n;
        ssize_t k = dst ? pread(fd, dst, c, (off_t)off) : pwrite(fd, src, c, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return ferry__fail(FERRY_ERR_IO, "run %s rank %u: %s its %s at %llu: %s", p->run, p->o.rank,
                               dst ? "reading" : "writing", what, (unsigned long long)off, k < 0 ? strerror(errno) : "short file");
        if (dst) dst += k;
        else src += k;
        n -= (uint64_t)k;
        off += (uint64_t)k;
    }
    return FERRY_OK;
}

/* The same on the tile file. */
static int tiles_file_io(ferry_shard_publisher *p, const uint8_t *src, uint8_t *dst, uint64_t n, uint64_t off)
{
    return file_io(p, p->fd, "tile file", src, dst, n, off);
}

/* Appends p->enc (a payload or the tile index just written there) to
 * object file k, creating the file first if needed; *at: where it went. */
static int object_append(ferry_shard_publisher *p, int k, uint64_t *at)
{
    int rc = p->ofd[k] < 0 ? tmp_file(p, "object file", &p->ofd[k]) : FERRY_OK;
    *at = p->osize[k];
    if (!rc) rc = file_io(p, p->ofd[k], "object file", p->enc.data, NULL, p->enc.size, p->osize[k]);
    if (!rc) p->osize[k] += p->enc.size;
    return rc;
}

/* Appends a tile's bytes to the tile file; h->at and h->dtype are set. */
static int tiles_file_append(ferry_shard_publisher *p, sh_held *h, ferry_dtype dt, const uint8_t *data)
{
    h->dtype = dt;
    h->at = p->fd_end;
    uint64_t n = held_bytes(h);
    int rc = tiles_file_io(p, data, NULL, n, h->at);
    if (!rc) p->fd_end += n;
    return rc;
}

/* Moves the held tiles' bytes (a subscriber's, in models) into the tile
 * file, freeing each model as it is written. */
static int tiles_spill(ferry_shard_publisher *p, sh_tileset *s)
{
    int rc = tiles_file_reset(p);
    for (size_t i = 0; i < s->n && !rc; i++) {
        sh_held *h = &s->t[i];
        const ferry_tensor *ht = h->m ? ferry_model_tensor(h->m, 0) : NULL;
        if (!ht || ht->nbytes != (h->r1 - h->r0) * (h->c1 - h->c0) * ferry__shard_esize(ht->dtype))
            return ferry__fail(FERRY_ERR_SHARD_PARTS, "tensor '%s': a held tile without its data", h->name);
        if (!(rc = tiles_file_append(p, h, ht->dtype, ht->data))) {
            ferry_model_free(h->m);
            h->m = NULL;
        }
    }
    return rc;
}

/* ---- begin ---- */

int ferry_shard_begin(ferry_shard_publisher *p, unsigned flags, char **token, size_t *size)
{
    if (!p || !token || !size) return ferry__fail(FERRY_ERR_ARG, "ferry_shard_begin: NULL argument");
    *token = NULL;
    if (p->o.rank) return ferry__fail(FERRY_ERR_ARG, "run %s: ferry_shard_begin is rank 0's (this is rank %u)", p->run, p->o.rank);
    p->begun = false;
    ferry__shard_doc_release(&p->last);
    memset(&p->last, 0, sizeof p->last);
    fs_head h;
    int rc = ferry__sync_head_read(p->st, p->run, p->o.keys, NULL, &h, p->head_etag);
    sh_token t;
    memset(&t, 0, sizeof t);
    snprintf(t.run, sizeof t.run, "%s", p->run);
    t.world = p->o.world;
    t.tile_words = p->o.min_tile_words;
    if (rc == FERRY_ERR_STORE_NOT_FOUND) {
        ferry__clear_error();
        p->head_etag[0] = 0;
        /* HEAD deleted is no new run (ferry__sync_head_gone_check) */
        fs_state none = {0};
        if (!p->o.new_run && (rc = ferry__sync_head_gone_check(p->st, p->run, &none, NULL))) return rc;
        t.version = 1;
        t.kind = FERRY_SYNC_ANCHOR;
        ferry__sync_new_id(p->run_id);
    } else if (rc) {
        return rc;
    } else {
        if ((rc = ferry__shard_manifest_read(p->st, p->run, p->o.keys, h.version, h.id, NULL, &p->last))) return rc;
        if (memcmp(h.model_hash, p->last.model_hash, 16))
            return ferry__fail(FERRY_ERR_SYNC_MANIFEST, "run %s: HEAD and the manifest of version %llu disagree on its hash", p->run,
                               (unsigned long long)h.version);
        if ((rc = ferry__sync_run_id_agree(p->run, "the manifest HEAD names", h.run_id, p->last.run_id))) return rc;
        /* the run's id goes on; a run written before run ids gets one */
        if (h.run_id[0]) memcpy(p->run_id, h.run_id, FS_ID_CAP);
        else ferry__sync_new_id(p->run_id);
        if (p->last.world != p->o.world)
            return ferry__fail(FERRY_ERR_SHARD_WORLD, "run %s: version %llu was published by %u ranks, this publish has %u: "
                               "the rank count may not change within a run", p->run, (unsigned long long)h.version,
                               p->last.world, p->o.world);
        t.version = h.version + 1;
        t.base.version = h.version;
        memcpy(t.base.id, h.id, FS_ID_CAP);
        t.tile_words = p->last.tile_words; /* the grid stays that of the run */
        bool anchor = (flags & FERRY_SHARD_ANCHOR) || t.version - p->last.anchor.version >= p->o.anchor_every;
        t.kind = anchor ? FERRY_SYNC_ANCHOR : FERRY_SYNC_DELTA;
    }
    ferry__sync_new_id(t.id);
    char *s = ferry__shard_token_json(&t);
    if (!s) return FERRY_ERR_NOMEM;
    size_t n = strlen(s);
    char *c = ferry__malloc(n + 1);
    if (c) memcpy(c, s, n + 1);
    free(s);
    if (!c) return FERRY_ERR_NOMEM;
    p->btok = t;
    p->begun = true;
    *token = c;
    *size = n;
    return FERRY_OK;
}

/* ---- put ---- */

/* The caller's parts, checked, as record parts (coordinates cut). */
static int make_parts(ferry_shard_publisher *p, const sh_token *t, const ferry_shard_part *in, size_t n, sh_doc *rec)
{
    if (n && !(rec->parts = ferry__calloc(n, sizeof *rec->parts))) return FERRY_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        const ferry_shard_part *a = &in[i];
        sh_part *q = &rec->parts[i];
        rec->nparts = i + 1;
        q->rank = p->o.rank;
        if (!a->name || !*a->name || strlen(a->name) > FERRY_MAX_NAME || (a->ndim && !a->shape) || a->ndim > FERRY_MAX_DIMS ||
            !a->data || (unsigned)a->dtype >= FERRY_DTYPE_COUNT)
            return ferry__fail(FERRY_ERR_ARG, "run %s rank %u: part %zu: missing name, shape or data, or a bad dtype", p->run,
                               p->o.rank, i);
        if (!ferry__shard_esize(a->dtype))
            return ferry__fail(FERRY_ERR_UNSUPPORTED, "tensor '%s': sub-byte dtype %s cannot be sharded", a->name,
                               ferry_dtype_name(a->dtype));
        if (!(q->name = ferry__strdup(a->name))) return FERRY_ERR_NOMEM;
        q->dtype = p->o.cast_bf16 && a->dtype == FERRY_F32 ? FERRY_BF16 : a->dtype;
        q->ndim = a->ndim;
        if (a->ndim) memcpy(q->shape, a->shape, a->ndim * sizeof *a->shape);
        uint64_t b;
        if (!ferry__shard_view(q->ndim, q->shape, &q->rows, &q->cols) || !q->rows || !q->cols || !ferry__mul_u64(q->rows, q->cols, &b) ||
            !ferry__mul_u64(b, 8, &b))
            return ferry__fail(FERRY_ERR_SHARD_PARTS, "tensor '%s': empty shape or element count overflows", a->name);
        q->r0 = a->row_begin;
        q->r1 = a->row_end;
        if (!q->r0 && !q->r1) q->r1 = q->rows;
        if (q->r0 >= q->r1 || q->r1 > q->rows)
            return ferry__fail(FERRY_ERR_SHARD_PARTS, "tensor '%s': part rows [%llu, %llu) of rank %u lie outside its %llu rows",
                               a->name, (unsigned long long)q->r0, (unsigned long long)q->r1, p->o.rank,
                               (unsigned long long)q->rows);
        int rc = ferry__shard_part_cut(q, t->tile_words);
        if (rc) return rc;
    }
    /* a rank's own parts may not overlap (the others' are checked at commit) */
    sh_part *sorted = ferry__calloc(n + 1, sizeof *sorted);
    if (!sorted) return FERRY_ERR_NOMEM;
    if (n) memcpy(sorted, rec->parts, n * sizeof *sorted); /* a rank whose checkpoint failed has none (parts NULL) */
    ferry__shard_parts_sort(sorted, n);
    int rc = FERRY_OK;
    for (size_t i = 1; i < n && !rc; i++)
        if (!strcmp(sorted[i].name, sorted[i - 1].name) && sorted[i].r0 < sorted[i - 1].r1)
            rc = ferry__fail(FERRY_ERR_SHARD_PARTS, "tensor '%s': rank %u's parts rows [%llu, %llu) and [%llu, %llu) overlap",
                             sorted[i].name, p->o.rank, (unsigned long long)sorted[i - 1].r0,
                             (unsigned long long)sorted[i - 1].r1, (unsigned long long)sorted[i].r0,
                             (unsigned long long)sorted[i].r1);
    free(sorted);
    return rc;
}

/* Gets this rank's tiles of the token's base back through the island path. */
static int resume(ferry_shard_publisher *p, const sh_token *t, const sh_doc *rec)
{
    ferry__shard_tiles_release(&p->prev);
    ferry_shard_region *rg = ferry__calloc(rec->nparts + 1, sizeof *rg);
    if (!rg) return FERRY_ERR_NOMEM;
    for (size_t i = 0; i < rec->nparts; i++)
        rg[i] = (ferry_shard_region){rec->parts[i].name, rec->parts[i].r0, rec->parts[i].r1, 0, 0};
    ferry_shard_sub_options so = {.threads = p->o.threads, .keys = p->o.keys};
    ferry_shard_subscriber *s = NULL;
    int rc = ferry_shard_subscriber_open(p->st, p->run, rg, rec->nparts, &so, &s);
    if (!rc && rec->nparts) rc = ferry_shard_pull(s, FERRY_SYNC_EXACT, t->base.version, NULL);
    if (!rc) {
        ferry__shard_sub_take_tiles(s, &p->prev);
        if (rec->nparts && strcmp(p->prev.id, t->base.id))
            rc = ferry__fail(FERRY_ERR_SHARD_FOREIGN, "run %s: version %llu on HEAD's lineage is not the token's base (id %s)", p->run,
                             (unsigned long long)t->base.version, t->base.id);
        p->prev.version = t->base.version;
        memcpy(p->prev.id, t->base.id, FS_ID_CAP);
    }
    ferry_shard_subscriber_free(s);
    if (!rc) rc = tiles_spill(p, &p->prev);
    free(rg);
    if (rc) {
        ferry__shard_tiles_release(&p->prev);
        ferry__context(rc, "run %s rank %u: getting back its tiles of version %llu", p->run, p->o.rank,
                       (unsigned long long)t->base.version);
    }
    return rc;
}

/* Codes one payload of tile (of part q: the delta against base, or the
 * anchor with base NULL) into object k: its location there and its
 * SHA-256.  A failure (the coder's, or writing the object file: a full
 * disk) names the tile. */
static int code_payload(ferry_shard_publisher *p, int k, const sh_part *q, sh_tile *tile, const uint8_t *base, const uint8_t *tgt,
                        uint64_t nw)
{
    sh_loc *l = &tile->loc[k];
    p->enc.size = 0;
    int rc = ferry__shard_tile_encode(p->coder, q->dtype, base, tgt, nw, p->o.level, &p->enc);
    if (!rc) rc = ferry__sha256_hex(p->enc.data, p->enc.size, l->sha);
    l->size = p->enc.size;
    if (!rc) rc = object_append(p, k, &l->off);
    if (rc)
        ferry__context(rc, "tensor '%s' tile [%llu:%llu, %llu:%llu]", q->name, (unsigned long long)tile->r0, (unsigned long long)tile->r1,
                       (unsigned long long)tile->c0, (unsigned long long)tile->c1);
    return rc;
}

/* Codes one tile (ferry-tile-1): the delta against this rank's tile of the
 * previous version, the anchor whole; fills the tile's hashes and
 * locations.  F32 rows under cast_bf16 are cast first: the BF16 cast is
 * what is published (the gate). */
static int put_tile(ferry_shard_publisher *p, const sh_token *t, const sh_part *q, const ferry_shard_part *a, sh_tile *tile,
                    uint8_t *scratch, uint16_t *cast, uint8_t *base)
{
    size_t es = ferry__shard_esize(a->dtype);
    uint64_t tr = tile->r1 - tile->r0, tc = tile->c1 - tile->c0, nw = tr * tc;
    ferry__shard_gather(scratch, a->data, q->r0, q->cols, es, tile->r0, tile->r1, tile->c0, tile->c1);
    const uint8_t *tgt = scratch;
    if (a->dtype != q->dtype) {
        ferry_f32_to_bf16_n(cast, (const float *)(const void *)scratch, nw);
        tgt = (const uint8_t *)cast;
    }
    int rc = ferry__shard_tile_hash(q->name, q->dtype, tr, tc, tgt, tile->target);
    if (rc) return rc;
    if (t->base.version) {
        sh_held *h = ferry__shard_tiles_find(&p->prev, q->name, tile->r0, tile->c0);
        if (!h || h->r1 != tile->r1 || h->c1 != tile->c1 || h->dtype != q->dtype)
            return ferry__fail(FERRY_ERR_SHARD_PARTS, "tensor '%s' tile [%llu:%llu, %llu:%llu]: not a tile of rank %u in version %llu "
                               "(the part layout or dtype changed)", q->name, (unsigned long long)tile->r0,
                               (unsigned long long)tile->r1, (unsigned long long)tile->c0, (unsigned long long)tile->c1, p->o.rank,
                               (unsigned long long)t->base.version);
        memcpy(tile->base, h->hash, 16);
        if ((rc = tiles_file_io(p, NULL, base, held_bytes(h), h->at))) return rc;
        if ((rc = code_payload(p, SH_DELTA, q, tile, base, tgt, nw))) return rc;
    }
    if (t->kind == FERRY_SYNC_ANCHOR) rc = code_payload(p, SH_ANCHOR, q, tile, NULL, tgt, nw);
    return rc;
}

/* The FP8 parts of a rank's parts (quantize): each eligible part (as
 * ferry_quant_eligible judges its full tensor) becomes NAME (F8_E4M3, its
 * rows) and NAME_scale_inv (F32, its rows of the block grid); an FP32 part
 * left alone is cast under cast_bf16; the others are passed as they are.
 * Rows must be cut on the 128-row grid: a block is quantized whole by one
 * rank.  *out (2 * n parts) and *owned (the buffers, NULL-ended) are the
 * caller's to release with free_quantized. */
typedef struct qparts {
    ferry_shard_part *parts;
    size_t n;
    void **owned;             /* codes, scales, casts and names */
    size_t nowned;
    uint64_t (*sshape)[2];
} qparts;

static void free_quantized(qparts *q)
{
    for (size_t i = 0; i < q->nowned; i++) free(q->owned[i]);
    free(q->owned);
    free(q->parts);
    free(q->sshape);
    memset(q, 0, sizeof *q);
}

static void *own(qparts *q, size_t bytes)
{
    void *b = ferry__malloc(bytes ? bytes : 1);
    if (b) q->owned[q->nowned++] = b;
    return b;
}

static int quantize_parts(const ferry_shard_publisher *p, const ferry_shard_part *in, size_t n, qparts *q)
{
    memset(q, 0, sizeof *q);
    if (!(q->parts = ferry__calloc(2 * n + 1, sizeof *q->parts)) || !(q->owned = ferry__calloc(3 * n + 1, sizeof *q->owned)) ||
        !(q->sshape = ferry__calloc(n + 1, sizeof *q->sshape)))
        return FERRY_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        const ferry_shard_part *a = &in[i];
        uint64_t rows, cols;
        if (!a->name || !a->data || (a->ndim && !a->shape) || !ferry__shard_view(a->ndim, a->shape, &rows, &cols)) {
            q->parts[q->n++] = *a; /* refused by make_parts, naming it */
            continue;
        }
        uint64_t r0 = a->row_begin, r1 = a->row_end ? a->row_end : rows;
        ferry_tensor t = {.name = a->name, .dtype = a->dtype, .ndim = a->ndim, .shape = a->shape};
        if (r0 >= r1 || r1 > rows || !ferry_quant_eligible(&t, p->qcast)) {
            q->parts[q->n] = *a;
            if (p->qcast && a->dtype == FERRY_F32 && r0 < r1 && r1 <= rows) { /* the gate, as unquantized runs do it */
                uint16_t *b = own(q, (r1 - r0) * cols * 2);
                if (!b) return FERRY_ERR_NOMEM;
                ferry_f32_to_bf16_n(b, a->data, (r1 - r0) * cols);
                q->parts[q->n].dtype = FERRY_BF16;
                q->parts[q->n].data = b;
            }
            q->n++;
            continue;
        }
        if (r0 % FERRY_QUANT_BLOCK || (r1 % FERRY_QUANT_BLOCK && r1 != rows))
            return ferry__fail(FERRY_ERR_SHARD_PARTS, "tensor '%s': rank %u's rows [%llu, %llu) cut a %dx%d FP8 block: a quantized "
                               "run needs each rank's rows to begin and end on multiples of %d (or at the tensor's end)", a->name,
                               p->o.rank, (unsigned long long)r0, (unsigned long long)r1, FERRY_QUANT_BLOCK, FERRY_QUANT_BLOCK,
                               FERRY_QUANT_BLOCK);
        uint64_t nbr = (r1 - r0 + FERRY_QUANT_BLOCK - 1) / FERRY_QUANT_BLOCK, nbc = (cols + FERRY_QUANT_BLOCK - 1) / FERRY_QUANT_BLOCK;
        size_t nl = strlen(a->name) + sizeof FERRY_QUANT_SCALE_SUFFIX;
        uint8_t *codes = own(q, (r1 - r0) * cols);
        float *scale = own(q, nbr * nbc * sizeof *scale);
        char *sname = own(q, nl);
        if (!codes || !scale || !sname) return FERRY_ERR_NOMEM;
        snprintf(sname, nl, "%s%s", a->name, FERRY_QUANT_SCALE_SUFFIX);
        uint64_t kept = 0;
        int rc = ferry__quantize_rows(a->name, a->dtype, a->data, r0, r1 - r0, cols, NULL, codes, scale, &kept);
        if (rc) return rc;
        q->sshape[i][0] = (rows + FERRY_QUANT_BLOCK - 1) / FERRY_QUANT_BLOCK;
        q->sshape[i][1] = nbc;
        q->parts[q->n++] = (ferry_shard_part){a->name, FERRY_F8_E4M3, a->ndim, a->shape, r0, r1, codes};
        q->parts[q->n++] = (ferry_shard_part){sname, FERRY_F32, 2, q->sshape[i], r0 / FERRY_QUANT_BLOCK,
                                              r0 / FERRY_QUANT_BLOCK + nbr, scale};
    }
    return FERRY_OK;
}

static int put_parts(ferry_shard_publisher *p, const char *token, size_t token_size, const ferry_shard_part *parts, size_t nparts,
                     char **record, size_t *record_size);

int ferry_shard_put(ferry_shard_publisher *p, const char *token, size_t token_size, const ferry_shard_part *parts, size_t nparts,
                    char **record, size_t *record_size)
{
    if (!p || !p->o.quantize || !token || !record || !record_size || (nparts && !parts))
        return put_parts(p, token, token_size, parts, nparts, record, record_size);
    qparts q;
    int rc = quantize_parts(p, parts, nparts, &q);
    if (!rc) rc = put_parts(p, token, token_size, q.parts, q.n, record, record_size);
    else {
        *record = NULL;
        drop_pending(p);
        ferry__context(rc, "run %s rank %u: quantizing its parts (%s)", p->run, p->o.rank, ferry_quant_name((ferry_quant)p->o.quantize));
    }
    free_quantized(&q);
    return rc;
}

static int put_parts(ferry_shard_publisher *p, const char *token, size_t token_size, const ferry_shard_part *parts, size_t nparts,
                     char **record, size_t *record_size)
{
    if (!p || !token || !record || !record_size || (nparts && !parts)) return ferry__fail(FERRY_ERR_ARG, "ferry_shard_put: NULL argument");
    *record = NULL;
    drop_pending(p);
    sh_token t;
    int rc = ferry__shard_token_parse(token, token_size, &t);
    if (rc) return rc;
    if (strcmp(t.run, p->run) || t.world != p->o.world)
        return ferry__fail(FERRY_ERR_SHARD_FOREIGN, "shard token: for run '%s' with %u ranks, this is rank %u of %u of run '%s'", t.run,
                           t.world, p->o.rank, p->o.world, p->run);
    sh_doc *r = &p->rec;
    memset(r, 0, sizeof *r);
    snprintf(r->run, sizeof r->run, "%s", p->run);
    r->version = t.version;
    memcpy(r->id, t.id, FS_ID_CAP);
    r->kind = t.kind;
    r->world = t.world;
    r->rank = p->o.rank;
    uint8_t *scratch = NULL, *base = NULL;
    uint16_t *cast = NULL;
    if (!(r->obj_bytes = ferry__calloc(2, sizeof *r->obj_bytes))) return FERRY_ERR_NOMEM;
    if ((rc = make_parts(p, &t, parts, nparts, r))) goto out;
    if (t.base.version && (p->prev.version != t.base.version || strcmp(p->prev.id, t.base.id)) && (rc = resume(p, &t, r))) goto out;
    uint64_t most = 0;
    for (size_t i = 0; i < r->nparts; i++)
        for (size_t j = 0; j < r->parts[i].ntiles; j++) {
            const sh_tile *x = &r->parts[i].tiles[j];
            uint64_t w = (x->r1 - x->r0) * (x->c1 - x->c0);
            if (w > most) most = w;
        }
    if (!(scratch = ferry__malloc(most * 8 + 8)) || !(cast = ferry__malloc(most * 2 + 2)) || !(base = ferry__malloc(most * 8 + 8))) {
        rc = FERRY_ERR_NOMEM;
        goto out;
    }
    /* the tiles in the manifest's part order, (name, r0): the order of the
       index's leaves an island counts from the layout record */
    size_t *ord = ferry__calloc(r->nparts + 1, sizeof *ord);
    if (!ord) {
        rc = FERRY_ERR_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < r->nparts; i++) ord[i] = i;
    for (size_t i = 1; i < r->nparts; i++) /* insertion sort: a rank has few parts, and they usually come sorted */
        for (size_t j = i; j > 0; j--) {
            const sh_part *a = &r->parts[ord[j - 1]], *b = &r->parts[ord[j]];
            int cmp = strcmp(a->name, b->name);
            if (cmp < 0 || (!cmp && a->r0 < b->r0)) break;
            size_t x = ord[j];
            ord[j] = ord[j - 1];
            ord[j - 1] = x;
        }
    for (size_t i = 0; i < r->nparts && !rc; i++)
        for (size_t j = 0; j < r->parts[ord[i]].ntiles && !rc; j++)
            rc = put_tile(p, &t, &r->parts[ord[i]], &parts[ord[i]], &r->parts[ord[i]].tiles[j], scratch, cast, base);
    /* each object ends in its tile index (the old form lists the tiles in
       the manifest instead: tests only) */
    if (!rc && !ferry__shard_legacy_manifest) {
        r->index_form = true;
        if (!(r->obj_index = ferry__calloc(2, sizeof *r->obj_index)) || !(r->obj_tiles = ferry__calloc(2, sizeof *r->obj_tiles)) ||
            !(r->obj_root = ferry__calloc(2, 32)))
            rc = FERRY_ERR_NOMEM;
        size_t total = 0;
        for (size_t i = 0; i < r->nparts; i++) total += r->parts[i].ntiles;
        sh_tile **tl = rc ? NULL : ferry__calloc(total + 1, sizeof *tl);
        if (!rc && !tl) rc = FERRY_ERR_NOMEM;
        for (int k = 0; k < 2 && !rc; k++) {
            size_t n = 0;
            for (size_t i = 0; i < r->nparts; i++)
                for (size_t j = 0; j < r->parts[ord[i]].ntiles; j++)
                    if (r->parts[ord[i]].tiles[j].loc[k].size) tl[n++] = &r->parts[ord[i]].tiles[j];
            if (!n) continue;
            r->obj_tiles[k] = n;
            p->enc.size = 0; /* (the index section alone; its place is the object's end) */
            uint64_t unused;
            if (!(rc = ferry__shard_ix_write(&p->enc, tl, n, k, &unused, r->obj_root + 32 * k)))
                rc = object_append(p, k, &r->obj_index[k]);
        }
        free(tl);
    }
    free(ord);
    for (int k = 0; k < 2 && !rc; k++) {
        r->obj_bytes[k] = p->osize[k];
        if (!p->osize[k]) continue;
        char key[FS_KEY_CAP];
        ferry__shard_key_object(key, p->run, t.version, t.id, p->o.rank, k);
        rc = ferry_store_put_fd(p->st, key, p->ofd[k], 0, p->osize[k], NULL);
    }
    if (!rc) {
        char *s = ferry__shard_record_json(r);
        size_t n = s ? strlen(s) : 0;
        if (s && (*record = ferry__malloc(n + 1))) {
            memcpy(*record, s, n + 1);
            *record_size = n;
        } else {
            rc = FERRY_ERR_NOMEM;
        }
        free(s);
    }
#ifdef FERRY_TEST_HOOKS
    /* Test builds only (the Makefile compiles this file so for
     * build/tests/ferry-shard-mpi-hooks; libferry never has it):
     * FERRY_SHARD_TEST_STALL="RANK:VERSION" stalls that rank after its
     * upload, for tests/scripts/shard_mpi.sh to kill it mid-publish. */
    if (!rc && getenv("FERRY_SHARD_TEST_STALL")) {
        unsigned sr = 0;
        unsigned long long sv = 0;
        if (sscanf(getenv("FERRY_SHARD_TEST_STALL"), "%u:%llu", &sr, &sv) == 2 && sr == p->o.rank && sv == t.version)
            ferry__sleep_ms(60000);
    }
#endif
out:
    free(scratch);
    free(cast);
    free(base);
    if (rc) {
        drop_pending(p);
        ferry__context(rc, "run %s rank %u: putting version %llu", p->run, p->o.rank, (unsigned long long)t.version);
        return rc;
    }
    p->pending = true;
    p->ptok = t;
    ferry__buf_release(&p->enc);
    /* the anchor object is not needed by finish when a delta exists */
    if (t.base.version) object_drop(p, SH_ANCHOR);
    return FERRY_OK;
}

/* ---- finish ---- */

int ferry_shard_finish(ferry_shard_publisher *p, int committed)
{
    if (!p) return ferry__fail(FERRY_ERR_ARG, "ferry_shard_finish: NULL argument");
    if (!p->pending || !committed) {
        drop_pending(p);
        return FERRY_OK;
    }
    const sh_token *t = &p->ptok;
    int kind = t->base.version ? SH_DELTA : SH_ANCHOR;
    uint64_t most = 0, most_pl = 0, ntiles = 0;
    for (size_t i = 0; i < p->rec.nparts; i++)
        for (size_t j = 0; j < p->rec.parts[i].ntiles; j++) {
            const sh_tile *x = &p->rec.parts[i].tiles[j];
            uint64_t b = (x->r1 - x->r0) * (x->c1 - x->c0) * ferry__shard_esize(p->rec.parts[i].dtype);
            if (b > most) most = b;
            if (x->loc[kind].size > most_pl) most_pl = x->loc[kind].size;
            ntiles++;
        }
    /* a delta is applied in place in the tile file (the tiles keep their
       places); an anchor's tiles fill it anew */
    sh_tileset fresh;
    memset(&fresh, 0, sizeof fresh);
    uint8_t *d = ferry__malloc((size_t)most + 1), *pl = ferry__malloc((size_t)most_pl + 1);
    int rc = d && pl ? FERRY_OK : FERRY_ERR_NOMEM;
    if (!rc && kind == SH_ANCHOR) {
        ferry__shard_tiles_release(&p->prev);
        rc = tiles_file_reset(p);
    }
    if (!rc && kind == SH_DELTA && ntiles != p->prev.n)
        rc = ferry__fail(FERRY_ERR_SHARD_PARTS, "%llu tiles put, %zu held of version %llu", (unsigned long long)ntiles, p->prev.n,
                         (unsigned long long)p->prev.version);
    for (size_t i = 0; i < p->rec.nparts && !rc; i++) {
        const sh_part *q = &p->rec.parts[i];
        for (size_t j = 0; j < q->ntiles && !rc; j++) {
            const sh_tile *x = &q->tiles[j];
            uint64_t tr = x->r1 - x->r0, tc = x->c1 - x->c0;
            sh_held *h = NULL;
            if (kind == SH_DELTA) { /* in place on the previous tile */
                h = ferry__shard_tiles_find(&p->prev, q->name, x->r0, x->c0);
                if (!h || h->r1 != x->r1 || h->c1 != x->c1 || h->dtype != q->dtype)
                    rc = ferry__fail(FERRY_ERR_SHARD_PARTS, "tensor '%s': a tile put that is not held", q->name);
                else rc = tiles_file_io(p, NULL, d, held_bytes(h), h->at);
            }
            /* its payload, from the object file it was uploaded from */
            if (!rc && (x->loc[kind].off > p->osize[kind] || x->loc[kind].size > p->osize[kind] - x->loc[kind].off))
                rc = ferry__fail(FERRY_ERR_SHARD_PARTS, "tensor '%s': a payload past the end of the object put", q->name);
            if (!rc) rc = file_io(p, p->ofd[kind], "object file", NULL, pl, x->loc[kind].size, x->loc[kind].off);
            if (!rc) rc = ferry__shard_tile_decode(p->coder, q->dtype, kind == SH_DELTA ? d : NULL, tr * tc, pl, (size_t)x->loc[kind].size, d);
            uint8_t hash[16];
            if (!rc) rc = ferry__shard_tile_hash(q->name, q->dtype, tr, tc, d, hash);
            if (!rc && memcmp(hash, x->target, 16))
                rc = ferry__fail(FERRY_ERR_TARGET_MISMATCH, "tensor '%s' tile [%llu:%llu, %llu:%llu]: its payload does not make the tile",
                                 q->name, (unsigned long long)x->r0, (unsigned long long)x->r1, (unsigned long long)x->c0,
                                 (unsigned long long)x->c1);
            if (rc) break;
            if (kind == SH_DELTA) {
                if (memcmp(h->hash, x->target, 16)) rc = tiles_file_io(p, d, NULL, held_bytes(h), h->at); /* SAME tiles stay */
                memcpy(h->hash, x->target, 16);
            } else if (!(rc = ferry__shard_tiles_add(&fresh, q->name, x, NULL))) {
                rc = tiles_file_append(p, &fresh.t[fresh.n - 1], q->dtype, d);
            }
        }
    }
    free(d);
    free(pl);
    if (rc) { /* the tile file is no version's now: the next put gets the tiles back */
        ferry__shard_tiles_release(&p->prev);
        ferry__shard_tiles_release(&fresh);
        drop_pending(p);
        return ferry__context(rc, "run %s rank %u: taking version %llu as its base", p->run, p->o.rank, (unsigned long long)t->version);
    }
    if (kind == SH_ANCHOR) {
        ferry__shard_tiles_sort(&fresh);
        p->prev = fresh;
    }
    p->prev.version = t->version;
    memcpy(p->prev.id, t->id, FS_ID_CAP);
    drop_pending(p);
    return FERRY_OK;
}

/* ---- commit ---- */

/* The new version's parts against the previous version's: same tensors,
 * same cuts, and every delta's base is the previous tile. */
static int check_against_last(const sh_doc *last, const sh_doc *m)
{
    if (!last->version) return FERRY_OK;
    if (last->nparts != m->nparts)
        return ferry__fail(FERRY_ERR_SHARD_PARTS, "version %llu: %zu parts, version %llu had %zu: the part layout may not change "
                           "within a run", (unsigned long long)m->version, m->nparts, (unsigned long long)last->version, last->nparts);
    for (size_t i = 0; i < m->nparts; i++) {
        const sh_part *a = &m->parts[i], *b = &last->parts[i];
        if (strcmp(a->name, b->name) || a->r0 != b->r0 || a->r1 != b->r1 || a->nrc != b->nrc || a->ncc != b->ncc ||
            memcmp(a->rcut, b->rcut, a->nrc * sizeof *a->rcut) || memcmp(a->ccut, b->ccut, a->ncc * sizeof *a->ccut) ||
            a->dtype != b->dtype || a->ndim != b->ndim || memcmp(a->shape, b->shape, a->ndim * sizeof a->shape[0]))
            return ferry__fail(FERRY_ERR_SHARD_PARTS, "version %llu: tensor '%s' rows [%llu, %llu) of rank %u: not a part of version "
                               "%llu (tensor, rows, dtype, shape or tile grid changed)", (unsigned long long)m->version, a->name,
                               (unsigned long long)a->r0, (unsigned long long)a->r1, a->rank, (unsigned long long)last->version);
        for (size_t j = 0; j < a->ntiles && last->targets_known; j++) /* (a manifest of the index form read back holds no targets) */
            if (memcmp(a->tiles[j].base, b->tiles[j].target, 16))
                return ferry__fail(FERRY_ERR_SHARD_FOREIGN, "version %llu: tensor '%s' tile [%llu:%llu, %llu:%llu] of rank %u: its base "
                                   "is not version %llu's tile (a part diffed against another version)",
                                   (unsigned long long)m->version, a->name, (unsigned long long)a->tiles[j].r0,
                                   (unsigned long long)a->tiles[j].r1, (unsigned long long)a->tiles[j].c0,
                                   (unsigned long long)a->tiles[j].c1, a->rank, (unsigned long long)last->version);
    }
    return FERRY_OK;
}

/* Merges the records into the manifest's parts (moved out of the records). */
static int merge(const sh_token *t, sh_doc *recs, size_t n, sh_doc *m)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += recs[i].nparts;
    if (!(m->parts = ferry__calloc(total + 1, sizeof *m->parts)) || !(m->obj_bytes = ferry__calloc(2 * (size_t)t->world, sizeof *m->obj_bytes)))
        return FERRY_ERR_NOMEM;
    m->index_form = n && recs[0].index_form;
    m->targets_known = true;
    if (m->index_form &&
        (!(m->obj_index = ferry__calloc(2 * (size_t)t->world, sizeof *m->obj_index)) ||
         !(m->obj_tiles = ferry__calloc(2 * (size_t)t->world, sizeof *m->obj_tiles)) || !(m->obj_root = ferry__calloc(2 * (size_t)t->world, 32))))
        return FERRY_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        if (recs[i].nparts) memcpy(m->parts + m->nparts, recs[i].parts, recs[i].nparts * sizeof *m->parts); /* none: NULL */
        m->nparts += recs[i].nparts;
        free(recs[i].parts);
        recs[i].parts = NULL;
        recs[i].nparts = 0;
        m->obj_bytes[2 * recs[i].rank] = recs[i].obj_bytes[0];
        m->obj_bytes[2 * recs[i].rank + 1] = recs[i].obj_bytes[1];
        if (recs[i].index_form != m->index_form)
            return ferry__fail(FERRY_ERR_SHARD_FOREIGN, "version %llu: rank %u's part record is %s the index form, rank %u's %s",
                               (unsigned long long)t->version, recs[i].rank, recs[i].index_form ? "in" : "not in", recs[0].rank,
                               m->index_form ? "is" : "is not");
        for (size_t k = 0; k < 2 && m->index_form; k++) {
            size_t o = 2 * (size_t)recs[i].rank + k;
            m->obj_index[o] = recs[i].obj_index[k];
            m->obj_tiles[o] = recs[i].obj_tiles[k];
            memcpy(m->obj_root + 32 * o, recs[i].obj_root + 32 * k, 32);
        }
    }
    ferry__shard_parts_sort(m->parts, m->nparts);
    if (!m->nparts) return ferry__fail(FERRY_ERR_SHARD_PARTS, "version %llu: no rank put any part", (unsigned long long)t->version);
    char what[64];
    snprintf(what, sizeof what, "version %llu", (unsigned long long)t->version);
    return ferry__shard_parts_cover(m->parts, m->nparts, FERRY_ERR_SHARD_PARTS, what);
}

/* HEAD from the previous version to m: the single-rank publisher's move
 * (head.c: retries while HEAD is unchanged, our own landed write, a HEAD
 * gone back refused as BACKWARDS, another version as CONFLICT). */
static int move_head(ferry_shard_publisher *p, const sh_doc *m)
{
    fs_head nh;
    ferry__sync_head_init(&nh, m->version, m->id, m->kind, m->model_hash, p->pubid);
    memcpy(nh.run_id, m->run_id, FS_ID_CAP);
    return ferry__sync_head_move(p->st, p->run, p->o.keys, &nh, &m->prev, p->pubid, p->head_etag);
}

int ferry_shard_commit(ferry_shard_publisher *p, const char *token, size_t token_size, const char *const *records,
                       const size_t *record_sizes, size_t nrecords, ferry_shard_publish_info *info)
{
    if (!p || !token || (nrecords && (!records || !record_sizes))) return ferry__fail(FERRY_ERR_ARG, "ferry_shard_commit: NULL argument");
    if (p->o.rank) return ferry__fail(FERRY_ERR_ARG, "run %s: ferry_shard_commit is rank 0's (this is rank %u)", p->run, p->o.rank);
    sh_token t;
    int rc = ferry__shard_token_parse(token, token_size, &t);
    if (rc) return rc;
    if (!p->begun || t.version != p->btok.version || strcmp(t.id, p->btok.id) || strcmp(t.run, p->run))
        return ferry__fail(FERRY_ERR_SHARD_FOREIGN, "shard token of run '%s' version %llu id %s: not the publish this handle began",
                           t.run, (unsigned long long)t.version, t.id);
    if (nrecords != t.world)
        return ferry__fail(FERRY_ERR_SHARD_WORLD, "version %llu: %zu part records for %u ranks", (unsigned long long)t.version, nrecords,
                           t.world);
    sh_doc *recs = ferry__calloc(nrecords, sizeof *recs);
    bool *seen = ferry__calloc(t.world, sizeof *seen);
    sh_doc m;
    memset(&m, 0, sizeof m);
    char *text = NULL;
    if (!recs || !seen) {
        rc = FERRY_ERR_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < nrecords && !rc; i++) {
        char what[64];
        snprintf(what, sizeof what, "part record %zu", i);
        if (!records[i]) {
            rc = ferry__fail(FERRY_ERR_ARG, "%s is NULL", what);
            break;
        }
        if ((rc = ferry__shard_record_parse(p->run, what, records[i], record_sizes[i], &recs[i]))) break;
        const sh_doc *r = &recs[i];
        if (r->version != t.version || strcmp(r->id, t.id) || r->kind != t.kind || r->world != t.world)
            rc = ferry__fail(FERRY_ERR_SHARD_FOREIGN, "%s (rank %u): belongs to version %llu id %s, this publish is version %llu id %s",
                             what, r->rank, (unsigned long long)r->version, r->id, (unsigned long long)t.version, t.id);
        else if (seen[r->rank])
            rc = ferry__fail(FERRY_ERR_SHARD_WORLD, "version %llu: rank %u's part record given twice", (unsigned long long)t.version,
                             r->rank);
        seen[r->rank] = true;
    }
    if (rc) goto out;
    m.version = t.version;
    memcpy(m.id, t.id, FS_ID_CAP);
    memcpy(m.run_id, p->run_id, FS_ID_CAP);
    snprintf(m.run, sizeof m.run, "%s", p->run);
    m.kind = t.kind;
    m.world = t.world;
    m.prev = t.base;
    m.tile_words = t.tile_words;
    m.tile_codec = SH_TC_CHUNK;
    if ((rc = merge(&t, recs, nrecords, &m))) goto out;
    if (p->last.version && p->last.world != t.world) {
        rc = ferry__fail(FERRY_ERR_SHARD_WORLD, "version %llu: %u ranks, version %llu had %u", (unsigned long long)t.version, t.world,
                         (unsigned long long)p->last.version, p->last.world);
        goto out;
    }
    if ((rc = check_against_last(&p->last, &m))) goto out;
    if (t.kind == FERRY_SYNC_ANCHOR) {
        m.anchor.version = m.version;
        memcpy(m.anchor.id, m.id, FS_ID_CAP);
    } else {
        m.anchor = p->last.anchor;
    }
    for (size_t i = 0; i < m.nparts; i++)
        m.model_bytes += (m.parts[i].r1 - m.parts[i].r0) * m.parts[i].cols * ferry__shard_esize(m.parts[i].dtype);
    if ((rc = ferry__shard_hash(&m, m.model_hash))) goto out;
    m.created = (uint64_t)ferry__sync_now();
    m.anchor_every = p->o.anchor_every;
    snprintf(m.publisher, sizeof m.publisher, "%s", p->pubid);
    if (!(text = ferry__shard_manifest_json(&m))) {
        rc = FERRY_ERR_NOMEM;
        goto out;
    }
    char key[FS_KEY_CAP];
    if (m.index_form) { /* the layout record, once per run (named by its digest) */
        char *lt = ferry__shard_layout_json(&m);
        if (!lt) {
            rc = FERRY_ERR_NOMEM;
            goto out;
        }
        size_t ln = strlen(lt);
        rc = ferry__sha256(lt, ln, m.layout_sha);
        ferry__shard_key_layout(key, p->run, m.layout_sha);
        if (!rc && !(p->last.version && p->last.index_form && !memcmp(p->last.layout_sha, m.layout_sha, 32)))
            rc = ferry_store_put(p->st, key, lt, ln, NULL);
        free(lt);
        if (rc) goto out;
        free(text);
        if (!(text = ferry__shard_manifest_json(&m))) {
            rc = FERRY_ERR_NOMEM;
            goto out;
        }
    }
    ferry__sync_key_version(key, p->run, m.version, m.id, FS_OBJ_MANIFEST);
    if ((rc = ferry__sync_record_seal(p->o.keys, &text))) goto out; /* frees text on failure */
    size_t mbytes = strlen(text);
    if ((rc = ferry_store_put(p->st, key, text, mbytes, NULL))) goto out;
    if ((rc = move_head(p, &m))) goto out;
    if (info) {
        memset(info, 0, sizeof *info);
        info->version = m.version;
        info->kind = m.kind;
        info->world = m.world;
        info->parts = m.nparts;
        for (size_t i = 0; i < m.nparts; i++) info->tiles += m.parts[i].ntiles;
        for (uint32_t r = 0; r < m.world; r++) {
            info->delta_bytes += m.obj_bytes[2 * r];
            info->anchor_bytes += m.obj_bytes[2 * r + 1];
        }
        info->manifest_bytes = mbytes;
        info->model_bytes = m.model_bytes;
        memcpy(info->model_hash, m.model_hash, 16);
        memcpy(info->id, m.id, FS_ID_CAP);
    }
    ferry__shard_doc_release(&p->last);
    p->last = m;
    memset(&m, 0, sizeof m);
    p->begun = false;
out:
    free(text);
    for (size_t i = 0; recs && i < nrecords; i++) ferry__shard_doc_release(&recs[i]);
    free(recs);
    free(seen);
    ferry__shard_doc_release(&m);
    if (rc && rc != FERRY_ERR_SYNC_CONFLICT && rc != FERRY_ERR_SYNC_BACKWARDS)
        ferry__context(rc, "run %s: committing version %llu", p->run, (unsigned long long)t.version);
    return rc;
}

void ferry__shard_pub_rank_world(const ferry_shard_publisher *p, uint32_t *rank, uint32_t *world)
{
    *rank = p->o.rank;
    *world = p->o.world;
}
