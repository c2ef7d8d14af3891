/*
 * ferry_shard.h — sharded publish from R trainer ranks, sliced pull on M
 * island ranks, over the same store and runs as ferry_sync.h.
 *
 * docs/SHARDING.md is the how-to, docs/PROTOCOL.md ("Sharded versions")
 * and docs/FORMAT.md ("Tiles") the long form.  In short:
 *
 *  - Every tensor is viewed as 2-D: rows = shape[0], cols = the product of
 *    the other dimensions (a 1-D tensor of n elements is n x 1, a 0-D one
 *    1 x 1).  A trainer rank owns PARTS: a part is the row range
 *    [row_begin, row_end) of one tensor (all rows = the whole tensor), in
 *    any assignment the caller likes, as long as the parts of all ranks
 *    cover every row of every tensor exactly once.
 *  - Each part is cut into TILES on a grid that depends only on the
 *    tensor's shape, the part boundaries and min_tile_words (column blocks
 *    and row blocks are the largest of 24, 16, 12, 8, 6, 4, 3, 2, 1 that
 *    divide the dimension and keep a tile at least min_tile_words
 *    elements; part boundaries are always row cuts).  The grid is written
 *    into the manifest; readers never recompute it.
 *  - A tile is a one-tensor ferry model and its update is a ferry-tile-1
 *    payload (docs/FORMAT.md "Tiles"): the patch codec's sparse chunk(s)
 *    against the tile of the previous version (or the tile whole); on
 *    anchor versions also the tile whole.  A tile verifies itself: the
 *    SHA-256 of its bytes, its base and its target hash, all in the
 *    manifest.
 *  - Each rank uploads ONE object per version with its tile payloads
 *    (RUN/v/VERSION-ID-rRANK.patch, and .anchor on anchor versions), and
 *    rank 0 commits: the manifest RUN/v/VERSION-ID.json (format
 *    "ferry-manifest-2", which readers of ferry_sync.h refuse as an
 *    unknown format) naming every part and tile, then HEAD by
 *    compare-and-swap exactly as ferry_publish does.  A version is
 *    visible only when every part is durable; a rank that dies mid-publish
 *    leaves HEAD where it was, and ferry_gc removes its orphaned objects.
 *  - An island rank declares REGIONS (a tensor, a row range, a column
 *    range), fetches with ranged GETs (in parallel) only the tile
 *    patches that cover them, verifies each tile, and exposes each
 *    region as a contiguous row-major buffer plus the list of elements
 *    the last pull changed.
 *
 * The library runs no collective of its own: a publish is three calls
 * (begin on rank 0, put on every rank, commit on rank 0) whose small
 * results the caller moves between ranks with its own collectives
 * (MPI, torch.distributed).  ferry_shard_publish_mpi does it over MPI.
 *
 * Conventions (those of ferry.h): functions return 0 or a FERRY_ERR_*
 * code; ferry_last_error() names the run, version, rank, part or tile;
 * handles are opaque, used by one thread at a time, and *_free accepts
 * NULL; buffers the library returns are released with ferry_free().
 */
#ifndef FERRY_SHARD_H
#define FERRY_SHARD_H

#include "ferry.h"
#include "ferry_store.h"
#include "ferry_sync.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Errors 160..179 (FERRY_ERR_SHARD_*): listed, with their
 * messages and meanings, in ferry_errors.h (included through ferry.h).
 * ====================================================================== */

#define FERRY_SHARD_WORLD_MAX 65536    /* ranks of one publish */

/* ======================================================================
 * Publisher (one handle per trainer rank).
 * ====================================================================== */
typedef struct ferry_shard_publisher ferry_shard_publisher;

typedef struct ferry_shard_options {
    uint32_t rank;            /* this rank, 0 <= rank < world */
    uint32_t world;           /* R, the number of trainer ranks (>= 1) */
    const char *publisher_id; /* written into HEAD and the manifest;
                                 NULL = "HOST:PID:RANDOM" (rank 0's counts) */
    uint32_t anchor_every;    /* as ferry_publisher_options; 0 = 10 */
    int cast_bf16;            /* F32 parts are published as their BF16 cast
                                 (bit-identical to PyTorch), gated directly
                                 from the caller's FP32 rows */
    int level;                /* zstd level of whole tiles, 0 = 3 */
    int threads;              /* codec threads, 0 = 1 */
    uint64_t min_tile_words;  /* smallest grid block (all of a tensor's rows
                                 x a column block, elements) unless a
                                 dimension forbids it; row parts cut blocks,
                                 so a tile is about min_tile_words / R;
                                 0 = 262144 (65536-element tiles at R = 4) */
    const ferry_keys *keys;   /* optional (borrowed; must outlive the handle).
                                 With a signing key, rank 0 signs the manifest
                                 and HEAD it writes (include/ferry_sign.h);
                                 with trusted keys, HEAD and the manifests a
                                 rank reads (begin, a restarted rank's own
                                 tiles) must verify: a publisher with a key
                                 never resumes from a HEAD it cannot verify */
    int new_run;              /* as ferry_publisher_options.new_run: HEAD is
                                 absent but RUN/v/ holds versions: begin the
                                 run anew at version 1 (a new run id) instead
                                 of FERRY_ERR_SYNC_BACKWARDS */
    int quantize;             /* a ferry_quant (include/ferry_quant.h), 0 =
                                 none: the run holds the FP8 checkpoint, as
                                 ferry_publisher_options.quantize; each rank
                                 quantizes its own rows, which must then
                                 begin and end on multiples of 128 (or at a
                                 tensor's end) for every quantized tensor
                                 (else FERRY_ERR_SHARD_PARTS).  Fresh scales
                                 only: fp8-block128-sticky is
                                 FERRY_ERR_UNSUPPORTED */
} ferry_shard_options;

/* Opens the publisher of one rank on RUN; sends no request.  The handle
 * keeps this rank's previous BF16 tiles (never another rank's) to diff
 * against, in an unlinked temporary file in $TMPDIR (else /tmp; the
 * shard's size of disk, not of memory); each version's rank objects are
 * written tile by tile into two more such files (delta, anchor) and
 * uploaded from them (ferry_store_put_fd), never held whole.  On a tmpfs
 * TMPDIR these files are memory that RSS does not show.  A handle without
 * them (a new process, a restart after a
 * crash) gets them back at its first put: it pulls its own parts of the
 * token's base version through the island path (ranged GETs of its own
 * tiles only, each verified).
 * Returns FERRY_ERR_SYNC_RUN, FERRY_ERR_ARG (rank >= world, world 0 or
 * above FERRY_SHARD_WORLD_MAX, a bad publisher id),
 * FERRY_ERR_STORE_READONLY on an http(s) store. */
FERRY_API int ferry_shard_publisher_open(ferry_store *store, const char *run, const ferry_shard_options *opts,
                                         ferry_shard_publisher **out);
FERRY_API void ferry_shard_publisher_free(ferry_shard_publisher *p);

/* What a rank owns: rows [row_begin, row_end) of one tensor of the full
 * checkpoint (row_begin = row_end = 0: the whole tensor).  data holds
 * those rows, row-major: (row_end - row_begin) x cols elements of dtype.
 * Borrowed for the duration of ferry_shard_put only. */
typedef struct ferry_shard_part {
    const char *name;         /* the checkpoint's tensor name */
    ferry_dtype dtype;        /* of data (F32 with cast_bf16 publishes BF16) */
    uint32_t ndim;
    const uint64_t *shape;    /* the FULL tensor's shape, ndim entries */
    uint64_t row_begin, row_end;
    const void *data;
} ferry_shard_part;

/* Flags of ferry_shard_begin. */
#define FERRY_SHARD_ANCHOR 1u     /* make this version an anchor */

/* Step 1, rank 0 only: reads HEAD, checks that the run is sharded (or
 * new), and makes the TOKEN of the next version: a small NUL-terminated
 * JSON text (run, version, its random id, the base version and id, kind,
 * world) that the caller broadcasts to every rank.  *token is released
 * with ferry_free; *size excludes the NUL.  Returns FERRY_ERR_SHARD_KIND
 * (HEAD is a single-rank version), FERRY_ERR_SHARD_WORLD (world differs
 * from HEAD's manifest), FERRY_ERR_ARG (called on a rank other than 0),
 * store and manifest errors. */
FERRY_API int ferry_shard_begin(ferry_shard_publisher *p, unsigned flags, char **token, size_t *size);

/* Step 2, every rank: cuts its parts into tiles, diffs each against this
 * rank's tile of the base version, uploads its object(s) (each
 * acknowledged by the store: durable when this returns) and returns its
 * PART RECORD: a NUL-terminated JSON text naming every tile with its
 * offset, size, SHA-256 and base and target hashes, that the caller
 * gathers to rank 0 (*record released with ferry_free; *record_size
 * excludes the NUL).  nparts may be 0 (a rank without rows).
 * The handle keeps this version's patches until ferry_shard_finish.
 * Returns FERRY_ERR_SHARD_FOREIGN (token of another run or world, or not
 * parseable), FERRY_ERR_SHARD_PARTS (a part outside its tensor, parts of
 * this rank overlapping, a size that does not match), FERRY_ERR_ARG,
 * store errors.  On failure nothing is kept (objects already uploaded
 * are unreferenced garbage for GC). */
FERRY_API int ferry_shard_put(ferry_shard_publisher *p, const char *token, size_t token_size,
                              const ferry_shard_part *parts, size_t nparts, char **record, size_t *record_size);

/* What a commit did. */
typedef struct ferry_shard_publish_info {
    uint64_t version;
    int kind;                     /* FERRY_SYNC_ANCHOR / FERRY_SYNC_DELTA */
    uint32_t world;
    uint64_t parts, tiles;
    uint64_t delta_bytes;         /* all ranks' delta objects */
    uint64_t anchor_bytes;        /* all ranks' anchor objects */
    uint64_t manifest_bytes;
    uint64_t model_bytes;         /* tensor bytes of the published model */
    uint8_t model_hash[16];       /* the version's "shard hash" (FORMAT.md) */
    char id[FERRY_SYNC_ID_LEN + 1];
} ferry_shard_publish_info;

/* Step 3, rank 0 only: validates the records of all `world` ranks (one
 * per rank, any order) against the token and the previous version —
 * overlap, gap, duplicate part, a record of another run, version or
 * publish, a rank count change, a base that is not the previous tile —
 * each a distinct error naming the part; then writes the manifest and
 * moves HEAD by compare-and-swap (FERRY_ERR_SYNC_CONFLICT if another
 * publisher moved it).  On any failure HEAD is unchanged.  info may be
 * NULL.  The caller then broadcasts the status to every rank, which calls
 * ferry_shard_finish with it. */
FERRY_API int ferry_shard_commit(ferry_shard_publisher *p, const char *token, size_t token_size,
                                 const char *const *records, const size_t *record_sizes, size_t nrecords,
                                 ferry_shard_publish_info *info);

/* Step 4, every rank: committed != 0 makes the version put by this rank
 * the base of its next delta (its kept patches are applied, in place and
 * verified, to its previous tiles); committed == 0 drops them (the next
 * token is again based on the old version).  Returns errors of that
 * apply only (then the handle forgets its tiles and the next put pulls
 * them back). */
FERRY_API int ferry_shard_finish(ferry_shard_publisher *p, int committed);

/* The last version this rank's handle holds tiles of (0 = none). */
FERRY_API uint64_t ferry_shard_publisher_version(const ferry_shard_publisher *p);

/* ======================================================================
 * Island rank (subscriber of slices).
 * ====================================================================== */
typedef struct ferry_shard_subscriber ferry_shard_subscriber;

/* A slice of one checkpoint tensor in its 2-D view: rows [row_begin,
 * row_end) x cols [col_begin, col_end).  row_end = 0 means all rows and
 * col_end = 0 all columns (so {name} alone is the whole tensor).  A fused
 * engine parameter (qkv, gate_up, a vocabulary shard) is several regions;
 * the caller concatenates them. */
typedef struct ferry_shard_region {
    const char *name;
    uint64_t row_begin, row_end;
    uint64_t col_begin, col_end;
} ferry_shard_region;

typedef struct ferry_shard_sub_options {
    int threads;              /* codec threads, 0 = 1 */
    uint32_t poll_interval_ms;/* ferry_shard_wait's HEAD polling, 0 = 1000 */
    uint64_t coalesce_gap;    /* tiles of one object at most this many bytes
                                 apart are always fetched in one ranged GET
                                 (the gap is read and dropped); 0 = 0
                                 (adjacent only).  Larger gaps are fetched
                                 through too, smallest first, while a version
                                 takes more than R (world) ranged GETs and
                                 they stay within 1/50 of the wanted bytes */
    const ferry_keys *keys;   /* optional (borrowed): with trusted keys, HEAD
                                 and every manifest must carry a valid
                                 signature before anything in them is used
                                 (FERRY_ERR_SIG_*); the tiles are then
                                 authenticated by the signed SHA-256 each
                                 manifest gives them */
    uint64_t get_bytes;       /* what one more ranged GET is worth in bytes
                                 (its round trip at the link's rate): an
                                 index-form object is read whole, in one
                                 GET, when the payloads of it the island does
                                 not want are at most its tile index's
                                 leaves plus this (or 1/8 of those it
                                 wants); else its index, then its tiles.
                                 0 = 512 KiB (4 ms at 1 Gbit/s, 40 ms at
                                 100 Mbit/s) */
} ferry_shard_sub_options;

/* Opens an island rank with its regions (copied); sends no request.
 * Regions are checked against the checkpoint at the first pull. */
FERRY_API int ferry_shard_subscriber_open(ferry_store *store, const char *run, const ferry_shard_region *regions,
                                          size_t nregions, const ferry_shard_sub_options *opts,
                                          ferry_shard_subscriber **out);
FERRY_API void ferry_shard_subscriber_free(ferry_shard_subscriber *s);

/* What one pull did. */
typedef struct ferry_shard_pull_info {
    uint64_t from_version, to_version, head_version;
    uint64_t bytes_fetched;       /* every byte read (HEAD, manifests, tiles) */
    uint64_t object_bytes;        /* tile bytes read (ranged GETs) */
    uint64_t manifest_bytes;      /* HEAD, manifests, the layout record and
                                     the tile index bytes read */
    uint64_t version_bytes;       /* all ranks' object bytes of the versions
                                     crossed (what a whole-model pull reads) */
    uint64_t requests;            /* ranged GETs of objects (one per object
                                     read whole with its index; else its
                                     index, then one per run of wanted
                                     tiles, coalesced as coalesce_gap says) */
    uint64_t tiles;               /* tile patches applied */
    char path[128];               /* "anchor 1 + chain 1..8", "chain 5..8",
                                     "compacted 2..6 + chain 6..8", "none" */
} ferry_shard_pull_info;

/* Brings the regions to the target version (modes FERRY_SYNC_LATEST, _MIN,
 * _EXACT of ferry_sync.h; an older version or a cold start goes through
 * the newest anchor at or below it).  Each version is one transaction:
 * every covering tile is fetched (ranged GETs), checked against its
 * object's tile index (its leaf, the leaves against the root the manifest
 * gives; old runs: its SHA-256 in the manifest), decoded into a scratch
 * tile and checked against
 * its target hash, and its changed elements recorded, before any held
 * element is written; on failure the regions stay at the last complete
 * version (a pull over several versions may stop at an intermediate one:
 * ferry_shard_subscriber_version says where).  A sharded compaction A..B
 * in the run's compaction index (ferry_shard_compact) stands for the
 * versions A+1..B when the regions hold exactly A (its id too), B is at
 * or below the target, and its objects of the ranks the regions touch
 * are fewer bytes than those ranks' delta objects of A+1..B (the largest
 * saving wins; past a chain GC removed, it is taken whatever it costs):
 * path "compacted A..B" (" + chain B..T").  Its objects are checked as a
 * version's (index and leaves against the roots the index gives, each
 * decode against its target hash); one that does not verify leaves the
 * regions at A and is not tried again by this subscriber: the chain is
 * taken ("chain A..T (compacted A..B refused)"), or the anchor past a gone
 * chain.  With keys, an unsigned index is ignored.  info may be NULL.
 * Returns FERRY_ERR_SYNC_NOT_YET, _GONE, _MANIFEST, _CORRUPT (names the
 * object and tile), FERRY_ERR_SHARD_KIND (a single-rank run),
 * FERRY_ERR_SHARD_REGION, store errors. */
FERRY_API int ferry_shard_pull(ferry_shard_subscriber *s, int mode, uint64_t version, ferry_shard_pull_info *info);

/* Store lists, as ferry_subscriber_add_store (include/ferry_sync.h,
 * docs/MIRROR.md): further stores holding the same run (mirrors of one
 * another), in order of preference, at most FERRY_SYNC_STORES_MAX in all.
 * A pull tries them in order and moves to the next when one is down,
 * behind (FERRY_ERR_SYNC_NOT_YET for a version asked for; a HEAD below
 * the version held: _BACKWARDS, except for FERRY_SYNC_EXACT) or serves
 * what does not verify; versions completed from one
 * store are kept (the stores hold identical bytes) and the change lists
 * cover the whole pull.  ferry_shard_wait reads the first store that
 * answers.  Returns FERRY_ERR_ARG (NULL, or the list is full). */
FERRY_API int ferry_shard_subscriber_add_store(ferry_shard_subscriber *s, ferry_store *store);
/* Which store served the last successful pull: 0 = the one the handle was
 * opened with, 1.. = the stores added, in order. */
FERRY_API unsigned ferry_shard_subscriber_store_used(const ferry_shard_subscriber *s);

/* Waits until HEAD names a version above after_version (as
 * ferry_subscriber_wait; FERRY_ERR_SYNC_TIMEOUT after timeout_ms). */
FERRY_API int ferry_shard_wait(ferry_shard_subscriber *s, uint64_t after_version, uint64_t timeout_ms, uint64_t *head);

/* The version the regions hold (0 = none). */
FERRY_API uint64_t ferry_shard_subscriber_version(const ferry_shard_subscriber *s);

/* Region i as held (after a pull): dtype, rows, cols and bytes of its
 * contiguous row-major form.  FERRY_ERR_NOT_FOUND before the first pull,
 * FERRY_ERR_ARG for i out of range. */
FERRY_API int ferry_shard_region_shape(const ferry_shard_subscriber *s, size_t i, ferry_dtype *dtype, uint64_t *rows,
                                       uint64_t *cols, uint64_t *nbytes);
/* Copies region i, row-major, into dst (cap >= its nbytes). */
FERRY_API int ferry_shard_region_copy(const ferry_shard_subscriber *s, size_t i, void *dst, size_t cap);

/* The elements of region i the last successful pull changed: *count flat
 * positions within the region (row * cols + col, ascending, int64 so that
 * they index a tensor directly) and their new values (count elements of
 * the region's dtype).  *all = 1 when the pull replaced the region
 * whole (first pull, an anchor): then the lists are empty and the caller
 * copies the region.  Pointers valid until the next pull or free. */
FERRY_API int ferry_shard_region_changes(const ferry_shard_subscriber *s, size_t i, int *all, const int64_t **positions,
                                         const void **values, size_t *count);

/* Counters since open. */
typedef struct ferry_shard_sub_stats {
    uint64_t pulls, bytes_fetched, object_bytes, manifest_bytes, requests, tiles;
    uint64_t held_bytes;          /* the tiles held (the cover of the regions) */
} ferry_shard_sub_stats;
FERRY_API void ferry_shard_subscriber_get_stats(const ferry_shard_subscriber *s, ferry_shard_sub_stats *out);

/* ======================================================================
 * Compaction of a sharded run (docs/SHARDING.md "Compaction").
 * ====================================================================== */

/* What ferry_shard_compact did. */
typedef struct ferry_shard_compact_info {
    uint64_t from, to;            /* the objects turn version `from` into `to` */
    uint32_t world;               /* R: one compacted object per trainer rank */
    uint64_t tiles;               /* tiles of all ranks */
    uint64_t bytes;               /* the compacted objects, all ranks */
    uint64_t chain_bytes;         /* the delta objects of versions from+1..to
                                     they replace, all ranks */
    uint64_t anchor_bytes;        /* the anchor objects of the newest anchor at
                                     or below `to` (what a cold island reads) */
    uint64_t read_bytes;          /* bytes the compaction read (its islands) */
    char id[FERRY_SYNC_ID_LEN + 1];
    char key[FERRY_STORE_KEY_MAX + 1]; /* rank 0's object; rank r's ends in -rRRRRRR.patch */
} ferry_shard_compact_info;

/* The sharded ferry_compact (options as there; from = 0: the newest anchor
 * below `to`, to = 0: HEAD).  For each trainer rank r in turn it pulls
 * rank r's tiles of `from` and then of `to` through an island of its own
 * (every byte verified as ferry_shard_pull verifies it; memory: one rank's
 * tiles twice), codes each tile of `to` against the same tile of `from`
 * (ferry-tile-1), and uploads RUN/c/FROM-TO-ID-rRANK.patch: the payloads
 * in the rank's tile order, then its tile index (the index form of
 * docs/PROTOCOL.md "Sharded versions").  Only then is the compaction added
 * to RUN/compactions.json by compare-and-swap (signed with a signing key):
 * from, to, their ids, the shard hashes, and per rank object its size,
 * index offset, tile count and Merkle root.  ferry_shard_pull uses it when
 * an island holds exactly `from` and it is cheaper than the chain.
 * It changes no version and can run beside a publisher.  info may be NULL.
 * Returns FERRY_ERR_SHARD_KIND (a single-rank run: use ferry_compact),
 * FERRY_ERR_UNSUPPORTED (`from` or `to` of the old form, which lists its
 * tiles in the manifest; the tile layout or the rank count changed in the
 * range; a rank without tiles), FERRY_ERR_ARG (an empty range),
 * FERRY_ERR_SYNC_NOT_YET / _GONE, and the errors of ferry_shard_pull. */
FERRY_API int ferry_shard_compact(ferry_store *store, const char *run, const ferry_compact_options *opts,
                                  ferry_shard_compact_info *info);

/* ======================================================================
 * MPI convenience (build/libferry_shard_mpi.a, built with mpicc; link it
 * before libferry.a).  Declared when FERRY_SHARD_MPI is defined before
 * this header (it needs <mpi.h>).
 * ====================================================================== */
#ifdef FERRY_SHARD_MPI
#include <mpi.h>
/* Collective over comm (size = the handle's world, rank = its rank): begin
 * on rank 0 + MPI_Bcast of the token, put on every rank + MPI_Gatherv of
 * the records to rank 0, commit on rank 0 + MPI_Bcast of its status and
 * info, finish on every rank.  Every rank returns the same status (a
 * rank's own failure is reported to rank 0, which then does not commit);
 * info (may be NULL) is rank 0's. */
FERRY_API int ferry_shard_publish_mpi(ferry_shard_publisher *p, MPI_Comm comm, const ferry_shard_part *parts,
                                      size_t nparts, unsigned flags, ferry_shard_publish_info *info);
#endif

#ifdef __cplusplus
}
#endif
#endif /* FERRY_SHARD_H */
