/* Internal interface of sharded versions (include/ferry_shard.h): the tile
 * grid, the tile sets a rank holds, and the three small JSON documents of a
 * sharded publish (token, part record, manifest-2).  docs/PROTOCOL.md
 * "Sharded versions" and docs/FORMAT.md "Tiles" specify them. */
#ifndef FERRY_SHARD_IMPL_H
#define FERRY_SHARD_IMPL_H

#include "ferry_shard.h"
#include "sync/sync_impl.h"

#define SH_MANIFEST_MAX FS_MANIFEST2_MAX /* bound on a manifest-2, token, record */
#define SH_TILES_MAX ((uint64_t)1 << 24)    /* tiles of one version */
#define SH_CUTS_MAX 4096                    /* cuts of one dimension of one part */
#define SH_DEFAULT_TILE_WORDS 262144

enum { SH_DELTA = 0, SH_ANCHOR = 1 }; /* the two objects of a rank */

/* Where one tile patch lies: in the object of (rank, kind), at off, size
 * bytes, whose SHA-256 is sha (hex).  size 0 = none. */
typedef struct sh_loc {
    uint64_t off, size;
    char sha[65];
} sh_loc;

typedef struct sh_tile {
    uint64_t r0, r1, c0, c1;  /* in the tensor's 2-D view */
    uint8_t base[16];         /* hash of the previous version's tile (delta) */
    uint8_t target[16];       /* hash of this version's tile */
    sh_loc loc[2];            /* SH_DELTA, SH_ANCHOR */
    uint64_t leaf;            /* its place in its rank's objects (index form) */
} sh_tile;

/* A part: rows [r0, r1) of tensor `name`, owned by `rank`, cut into
 * (nrc - 1) x (ncc - 1) tiles, row-major. */
typedef struct sh_part {
    char *name;
    ferry_dtype dtype;
    uint32_t ndim;
    uint64_t shape[FERRY_MAX_DIMS];
    uint64_t rows, cols;
    uint64_t r0, r1;
    uint32_t rank;
    uint32_t nrc, ncc;
    uint64_t *rcut, *ccut;
    sh_tile *tiles;
    size_t ntiles;
} sh_part;

/* The token of a publish (rank 0 -> every rank). */
typedef struct sh_token {
    char run[FERRY_SYNC_RUN_MAX + 1];
    uint64_t version;
    char id[FS_ID_CAP];
    int kind;
    fs_ref base;              /* version 0 = none */
    uint32_t world;
    uint64_t tile_words;
} sh_token;

/* A part record (one rank -> rank 0) or a manifest-2 (rank 0 -> store). */
typedef struct sh_doc {
    char run[FERRY_SYNC_RUN_MAX + 1];
    uint64_t version;
    char id[FS_ID_CAP];
    int kind;
    uint32_t world;
    uint32_t rank;            /* record only */
    fs_ref prev, anchor;      /* manifest only */
    uint64_t *obj_bytes;      /* manifest: 2 x world (SH_DELTA, SH_ANCHOR per rank);
                                 record: 2 */
    uint8_t model_hash[16];   /* manifest: the shard hash */
    uint64_t model_bytes, created, tile_words;
    uint32_t anchor_every;
    char publisher[FERRY_SYNC_PUBLISHER_MAX];
    char run_id[FS_ID_CAP];   /* manifest: the run id ("" before run ids) */
    int tile_codec;           /* SH_TC_PATCH (manifests before "tile_codec") or SH_TC_CHUNK */
    sh_part *parts;           /* manifest: sorted by (name, r0) */
    size_t nparts;
    /* the index form (SH_INDEX_NAME): each object ends in its tile index;
     * the manifest lists the objects, the parts are in the layout record */
    bool index_form;
    bool targets_known;       /* tiles carry their target/base hashes (the old
                                 form, or the records at commit) */
    uint64_t *obj_index;      /* like obj_bytes: where each object's index starts */
    uint64_t *obj_tiles;      /* like obj_bytes: its tile count */
    uint8_t *obj_root;        /* like obj_bytes, 32 bytes each: its Merkle root */
    uint8_t layout_sha[32];   /* manifest: SHA-256 of the layout record */
    /* a reader's view of a sharded compaction comp_from..version (shard_sub.c):
       the objects are RUN/c/COMP_FROM-VERSION-COMP_ID-rRANK.patch ("" = the
       version's own) */
    uint64_t comp_from;
    char comp_id[FS_ID_CAP];
} sh_doc;

/* ---- grid (shard_grid.c) ---- */

/* 2-D view of a shape: rows, cols; false on overflow. */
bool ferry__shard_view(uint32_t ndim, const uint64_t *shape, uint64_t *rows, uint64_t *cols);
/* Block counts of the grid of a rows x cols tensor. */
void ferry__shard_grid(uint64_t rows, uint64_t cols, uint64_t tile_words, uint64_t *nr, uint64_t *nc);
/* Cuts part [r0, r1) of the tensor into tiles: fills p->rcut/ccut/tiles
 * (coordinates only). */
int ferry__shard_part_cut(sh_part *p, uint64_t tile_words);
void ferry__shard_part_release(sh_part *p);
void ferry__shard_doc_release(sh_doc *d);
/* Bytes per element (0 for sub-byte dtypes, which are not tiled). */
size_t ferry__shard_esize(ferry_dtype dt);
/* Copies the rectangle [r0,r1) x [c0,c1) of a row-major matrix of `cols`
 * columns whose first row is `row0` into dst (row-major, packed). */
void ferry__shard_gather(void *dst, const void *src, uint64_t row0, uint64_t cols, size_t es, uint64_t r0, uint64_t r1, uint64_t c0,
               uint64_t c1);
/* The shard hash of a manifest: SHA-256 over every tile's target hash in
 * manifest order, first 16 bytes. */
int ferry__shard_hash(const sh_doc *m, uint8_t out[16]);

/* ---- tile payloads (shard_tile.c) ---- */

/* How a version's tiles are coded: manifests without "tile_codec" hold
 * standalone patches (read, never written), "ferry-tile-1" payloads. */
enum { SH_TC_PATCH = 0, SH_TC_CHUNK = 1 };
#define SH_TILE_CODEC_NAME "ferry-tile-1"
/* The code byte a ferry-tile-1 payload starts with. */
enum { SH_TILE_SAME = 0, SH_TILE_SPARSE = 1, SH_TILE_RAW = 2, SH_TILE_ZSTD = 3 };

typedef struct sh_coder sh_coder; /* codec scratch, one per thread */
sh_coder *ferry__shard_coder_new(void);
void ferry__shard_coder_free(sh_coder *c);
/* Appends the payload of a tile of nwords words of dt to out: against base
 * (a delta; SAME, SPARSE or whole, whichever is smallest) or, base NULL,
 * whole (an anchor). */
int ferry__shard_tile_encode(sh_coder *c, ferry_dtype dt, const uint8_t *base, const uint8_t *target, uint64_t nwords, int level,
                             ferry_buf *out);
/* Decodes payload p (n bytes) into out (nwords words): from base for a
 * delta, base NULL for an anchor tile.  Every inconsistency is
 * FERRY_ERR_SYNC_CORRUPT (or the codec's PATCH_CORRUPT); the caller names
 * the object and tile. */
int ferry__shard_tile_decode(sh_coder *c, ferry_dtype dt, const uint8_t *base, uint64_t nwords, const uint8_t *p, size_t n,
                             uint8_t *out);
/* A one-tensor tile model owning rows x cols elements of dt (not
 * initialised), *data its bytes. */
int ferry__shard_tile_new(const char *name, ferry_dtype dt, uint64_t rows, uint64_t cols, ferry_model **out, uint8_t **data);
/* The hash of a tile: the model hash of the one-tensor tile model. */
int ferry__shard_tile_hash(const char *name, ferry_dtype dt, uint64_t rows, uint64_t cols, const void *data, uint8_t out[16]);

/* A reader's copy of the last layout record it read (by digest). */
typedef struct sh_lcache {
    uint8_t sha[32];
    char *text;
    size_t n;
} sh_lcache;

/* ---- documents (shard_doc.c) ---- */

char *ferry__shard_token_json(const sh_token *t);
int ferry__shard_token_parse(const char *text, size_t n, sh_token *out);
char *ferry__shard_record_json(const sh_doc *r);
char *ferry__shard_manifest_json(const sh_doc *m);
/* Parsers check every field (hostile input); key names the object in
 * errors. kind_doc: 0 record, 1 manifest. */
int ferry__shard_record_parse(const char *run, const char *key, const void *text, size_t n, sh_doc *out);
int ferry__shard_manifest_parse(const char *run, const char *key, const void *text, size_t n, sh_doc *out);
/* Sorts parts by (name, r0). */
void ferry__shard_parts_sort(sh_part *p, size_t n);
/* Sorted parts cover each tensor's rows exactly once and agree on its
 * dtype, shape and column cuts; else `code`, naming the parts. */
int ferry__shard_parts_cover(const sh_part *p, size_t n, int code, const char *what);
/* Reads and parses the manifest of (version, id); FERRY_ERR_SHARD_KIND if
 * it is a single-rank one. */
int ferry__shard_manifest_read(ferry_store *st, const char *run, const ferry_keys *keys, uint64_t version, const char *id, fs_count *cnt,
                     sh_doc *out);
/* As ferry__shard_manifest_read, the layout of an index-form manifest
 * read through cache lc (NULL: none) and attached. */
int ferry__shard_manifest_read_lc(ferry_store *st, const char *run, const ferry_keys *keys, uint64_t version, const char *id,
                                  fs_count *cnt, sh_lcache *lc, sh_doc *out);
/* The fields of a single-rank manifest that a parsed manifest-2 has (links,
 * sizes, hash; delta_bytes and full_bytes: its ranks' objects summed). */
void ferry__shard_manifest_view(const sh_doc *m, fs_manifest *out);
/* Key of rank's object of a version. */
void ferry__shard_key_object(char out[FS_KEY_CAP], const char *run, uint64_t version, const char *id, uint32_t rank, int kind);

/* ---- a sharded compaction as a version (shard_compact.c) ---- */

/* Key of rank's object of kind of m: the version's, or, for a view of a
 * compaction (m->comp_id set), the compaction's rank object. */
void ferry__shard_doc_object_key(char out[FS_KEY_CAP], const char *run, const sh_doc *m, uint32_t rank, int kind);
/* Compaction c (its c->world rank objects obj[]) ends at B: B's version and
 * id, rank count, index form, shard hash, and each rank object's tile
 * count is B's delta object's.  FERRY_ERR_SYNC_MANIFEST naming what not. */
int ferry__shard_comp_check(const char *run, const sh_doc *B, const fs_compaction *c, const fs_cobj *obj);
/* *cm: B's manifest reading c's objects as its delta objects (its own
 * object arrays, B's parts borrowed; comp_from and comp_id set), for a
 * c that ferry__shard_comp_check accepted.  Free with
 * ferry__shard_comp_view_release. */
int ferry__shard_comp_view(const sh_doc *B, const fs_compaction *c, const fs_cobj *obj, sh_doc *cm);
void ferry__shard_comp_view_release(sh_doc *cm);

/* ---- hash tree over a rank object's tiles (shard_merkle.c; the index
 * form's roots) ---- */

/* A tile's leaf: SHA-256(0x00 || u32le len || target || SHA-256(payload)). */
void ferry__shard_merkle_leaf(uint64_t len, const uint8_t target[16], const uint8_t payload_sha[32], uint8_t out[32]);
/* Nodes of a tree of n leaves (all levels, leaves first). */
size_t ferry__shard_merkle_count(size_t n);
/* Builds every level from n leaf hashes (32 bytes each): *nodes (32 x
 * ferry__shard_merkle_count(n) bytes, the caller frees) and the root. */
int ferry__shard_merkle_build(const uint8_t *leaves, size_t n, uint8_t **nodes, uint8_t root[32]);
/* Positions (ascending, in the array of build) of the nodes a reader of
 * leaves idx[0..k) (any order, distinct) needs besides them; *pos freed by
 * the caller. */
int ferry__shard_merkle_proof(size_t n, const size_t *idx, size_t k, size_t **pos, size_t *npos);
/* Checks leaves idx[0..k) (ascending; leaves: their hashes in that order)
 * with the nodes at pos[0..npos) (ascending) against root:
 * FERRY_ERR_SYNC_CORRUPT naming `what` when they do not hash to it or a
 * node is missing. */
int ferry__shard_merkle_verify(const char *what, size_t n, const size_t *idx, const uint8_t *leaves, size_t k, const size_t *pos,
                               const uint8_t *nodes, size_t npos, const uint8_t root[32]);

/* ---- the tile index at the end of a rank object (shard_index.c) ----
 *
 * An object of the index form is its tiles' payloads end to end (in the
 * rank's part order, parts sorted by (name, r0), tiles row-major), then
 *   "FSHIDX01" | u64le n | n x (u32le length | target[16]) | n x leaf[32]
 * whose leaves are ferry__shard_merkle_leaf(length, target,
 * SHA-256(payload)); the manifest signs the root of their tree, the offset
 * of the section and n. */
#define SH_INDEX_NAME "ferry-shard-index-1"
#define SH_LAYOUT_FORMAT "ferry-shard-layout-1"
#define SH_INDEX_MAGIC "FSHIDX01"
#define SH_IX_HEAD 16u
#define SH_IX_ENTRY 20u
#define SH_IX_LEAF 32u
/* Set (by tests): put and commit write the old form (every tile in the
 * manifest, no index), which readers still read. */
extern int ferry__shard_legacy_manifest;

typedef struct sh_ix {
    uint64_t n;
    uint64_t *off;            /* n + 1: tile i is [off[i], off[i + 1]) */
    uint8_t *target;          /* 16 x n */
    uint8_t *leaf;            /* 32 x n, NULL when the leaves were not read */
} sh_ix;

void ferry__shard_ix_release(sh_ix *x);
/* Bytes of the section of n tiles (with or without its leaves); false on overflow. */
bool ferry__shard_ix_size(uint64_t n, bool leaves, uint64_t *out);
/* Appends the index of tiles t[0..n) (their loc[kind] and targets) to obj,
 * whose payloads they are; *index_off: where it starts; root: of its tree. */
int ferry__shard_ix_write(ferry_buf *obj, sh_tile *const *t, size_t n, int kind, uint64_t *index_off, uint8_t root[32]);
/* Parses a section read from object `key` (len bytes; its leaves too when
 * `leaves`): the count must be want_n, the lengths must sum to index_off
 * (the payloads end where the index starts).  FERRY_ERR_SHARD_INDEX naming
 * the object and field otherwise. */
int ferry__shard_ix_parse(const char *key, const uint8_t *sec, uint64_t len, uint64_t want_n, uint64_t index_off, bool leaves,
                          sh_ix *out);
/* The tree over x->leaf has root `root`, else FERRY_ERR_SYNC_CORRUPT. */
int ferry__shard_ix_check_root(const char *key, const sh_ix *x, const uint8_t root[32]);
/* The leaf of tile i given its payload (off[i+1] - off[i] bytes). */
int ferry__shard_ix_leaf(const sh_ix *x, size_t i, const uint8_t *payload, uint8_t out[32]);
/* Checks a whole object d (n bytes) of either form against manifest m
 * (the mirror): every byte accounted for, every tile verified. */
int ferry__shard_object_check(const char *key, const sh_doc *m, uint32_t r, int kind, const uint8_t *d, uint64_t n);

/* ---- the layout record (shard_doc.c): the parts of a run, fixed for it,
 * at RUN/layout/SHA256.json; a manifest of the index form names it ---- */
char *ferry__shard_layout_json(const sh_doc *m);
void ferry__shard_key_layout(char out[FS_KEY_CAP], const char *run, const uint8_t sha[32]);
/* Parses layout text (its SHA-256 must be m->layout_sha) into m's parts
 * and tiles (coordinates, leaf positions), checked against m's objects. */
int ferry__shard_layout_attach(sh_doc *m, const char *key, const void *text, size_t n);
void ferry__shard_lcache_release(sh_lcache *c);

/* ---- held tiles (shard_tiles.c) ---- */

typedef struct sh_held {
    char *name;
    uint64_t r0, r1, c0, c1;
    ferry_model *m;           /* one tensor, [r1-r0, c1-c0] */
    uint8_t hash[16];
    uint8_t *changed;         /* bitmap of elements the current pull changed */
    bool fresh;               /* replaced whole by the current pull */
    /* a publisher's previous tile kept in its tile file (m NULL): its
       bytes at offset `at`, of dtype `dtype` (shard_pub.c) */
    uint64_t at;
    ferry_dtype dtype;
} sh_held;

typedef struct sh_tileset {
    sh_held *t;
    size_t n, cap;
    uint64_t version;
    char id[FS_ID_CAP];
} sh_tileset;

sh_held *ferry__shard_tiles_find(const sh_tileset *s, const char *name, uint64_t r0, uint64_t c0);
int ferry__shard_tiles_add(sh_tileset *s, const char *name, const sh_tile *t, ferry_model *m);
void ferry__shard_tiles_sort(sh_tileset *s);
void ferry__shard_tiles_release(sh_tileset *s);
/* A one-tensor tile model over data (borrowed). */
int ferry__shard_tile_model(const char *name, ferry_dtype dt, uint64_t rows, uint64_t cols, const void *data, unsigned flags,
                  ferry_model **out);

/* The handle's rank and world (shard_mpi.c checks them against the communicator). */
void ferry__shard_pub_rank_world(const ferry_shard_publisher *p, uint32_t *rank, uint32_t *world);

/* ---- island internals used by the publisher's resume (shard_sub.c) ---- */

/* Moves the subscriber's held tiles into *out (the subscriber then holds none). */
void ferry__shard_sub_take_tiles(ferry_shard_subscriber *s, sh_tileset *out);
/* For shard_state.c (a pull resumed from a state the caller kept): the
 * handle's store, run, keys, region count and held tiles; region i as
 * given (row_end / col_end filled in once resolved; NULL past the end);
 * the regions checked against manifest m. */
sh_tileset *ferry__shard_sub_inner(ferry_shard_subscriber *s, ferry_store **st, const char **run, const ferry_keys **keys,
                                   size_t *nregions);
const ferry_shard_region *ferry__shard_sub_region(const ferry_shard_subscriber *s, size_t i);
/* (index form: also fills the covering tiles' targets from their objects'
 * index entries, as the data given back are checked against them) */
int ferry__shard_sub_resolve(ferry_shard_subscriber *s, sh_doc *m);

#endif
