/* Internal interface of lib/sync (versions, publisher, subscriber,
 * compaction, retention).  The protocol is specified in docs/PROTOCOL.md;
 * this header names its pieces. */
#ifndef FERRY_SYNC_IMPL_H
#define FERRY_SYNC_IMPL_H

#include "common.h"
#include "ferry_sync.h"
#include "sign/sig.h"

#include <stdio.h>

#define FS_KEY_CAP 320   /* run (<= 200) + "/c/" + 20 + "-" + 20 + "-" + 16 + ".patch" */
#define FS_ID_CAP (FERRY_SYNC_ID_LEN + 1)
#define FS_JSON_MAX ((size_t)1 << 20) /* bound on HEAD, manifests, index, state files */
#define FS_MANIFEST2_MAX ((size_t)256 << 20) /* bound on a sharded manifest (manifest-2), token, record */
/* Highest version a record may name (docs/PROTOCOL.md "Versions"): 2^63 - 2,
 * so that every version and version + 1 is a non-negative JSON integer.
 * Publishing past it is refused; a record naming more is corrupt. */
#define FS_VERSION_MAX ((uint64_t)INT64_MAX - 1)

/* ---- keys, ids, hex, time (keys.c) ---- */

/* A version of the lineage: its number and random id (version 0 = none). */
typedef struct fs_ref {
    uint64_t version;
    char id[FS_ID_CAP];
} fs_ref;

enum { FS_OBJ_MANIFEST, FS_OBJ_FULL, FS_OBJ_DELTA };
void ferry__sync_key_head(char out[FS_KEY_CAP], const char *run);
void ferry__sync_key_index(char out[FS_KEY_CAP], const char *run);
void ferry__sync_key_version(char out[FS_KEY_CAP], const char *run, uint64_t version, const char *id, int obj);
void ferry__sync_key_compact(char out[FS_KEY_CAP], const char *run, uint64_t from, uint64_t to, const char *id);
/* Rank `rank`'s object of a sharded compaction: RUN/c/FROM-TO-ID-rRANK.patch
 * (parsed as FS_KEY_COMPACT of (from, to, id), so GC treats it as the entry's). */
void ferry__sync_key_compact_rank(char out[FS_KEY_CAP], const char *run, uint64_t from, uint64_t to, const char *id, uint32_t rank);

/* What a key under RUN/ is (gc.c): the kinds above, a compacted delta, or
 * FS_KEY_OTHER for anything the protocol does not name. */
enum { FS_KEY_OTHER = -1, FS_KEY_HEAD = 10, FS_KEY_INDEX = 11, FS_KEY_COMPACT = 12, FS_KEY_SHARD = 13 /* a rank's object */ };
typedef struct fs_key_info {
    int kind;                 /* FS_OBJ_* or FS_KEY_* */
    uint64_t version, to;     /* version (from, for a compacted delta), to */
    char id[FS_ID_CAP];
} fs_key_info;
void ferry__sync_key_parse(const char *run, const char *key, fs_key_info *out);

/* A fresh random id (FERRY_SYNC_ID_LEN hex digits). */
void ferry__sync_new_id(char out[FS_ID_CAP]);
bool ferry__sync_id_valid(const char *s);
/* A content hash (xxh128, 16 bytes) from exactly 32 lowercase hex digits
 * (ferry__hex writes them). */
bool ferry__sync_unhex(const char *s, uint8_t out[16]);
int64_t ferry__sync_now(void);
/* The default publisher id, "HOST:PID:RANDOM". */
void ferry__sync_default_publisher(char out[FERRY_SYNC_PUBLISHER_MAX]);
bool ferry__sync_publisher_valid(const char *s);
/* tmp_dir option, $TMPDIR, or /tmp. */
const char *ferry__sync_tmp_dir(const char *opt);

/* ---- records: HEAD, manifests, the compaction index (records.c) ---- */

/* The link of a manifest to an anchor: its version, id, full-object bytes
 * and cumulative delta bytes (for pricing paths without reading it). */
typedef struct fs_anchor_ref {
    fs_ref ref;               /* version 0 = none */
    uint64_t bytes, cum;
} fs_anchor_ref;

typedef struct fs_manifest {
    uint64_t version;
    char id[FS_ID_CAP];
    char run_id[FS_ID_CAP];   /* "" before run ids */
    int kind;                 /* FERRY_SYNC_ANCHOR / _DELTA */
    fs_ref prev;              /* version - 1 (version 0 for version 1) */
    fs_anchor_ref anchor;     /* nearest anchor <= version (itself for an anchor) */
    fs_anchor_ref prev_anchor;/* the anchor before that one (version 0 = none) */
    uint64_t full_bytes;      /* anchors only */
    uint64_t delta_bytes;     /* versions > 1: the delta from prev */
    uint8_t base_hash[16];    /* prev's model hash (versions > 1) */
    uint8_t model_hash[16];
    uint8_t full_sha[32], delta_sha[32]; /* SHA-256 of the objects (signed runs) */
    bool has_full_sha, has_delta_sha;
    uint64_t model_bytes, tensors;
    uint64_t cum;             /* sum of delta_bytes of versions 2..version */
    int64_t created;
    char publisher[FERRY_SYNC_PUBLISHER_MAX];
    uint32_t anchor_every;
} fs_manifest;

/* The run id (run_id, docs/PROTOCOL.md "Run identity"): FERRY_SYNC_ID_LEN
 * random hex digits drawn at version 1 and carried, signed, by every
 * record of the run; "" in records written before run ids (read only by
 * a reader that has none pinned). */
typedef struct fs_head {
    uint64_t version;
    char id[FS_ID_CAP];
    char run_id[FS_ID_CAP];
    int kind;
    uint8_t model_hash[16];
    char publisher[FERRY_SYNC_PUBLISHER_MAX];
    int64_t time;
    /* Writing: the sealed record of the manifest HEAD names, carried inside
     * HEAD as "manifest_record" (NULL: none; not owned).  Reading: that
     * record, checked as a manifest fetched from the store is (has_manifest
     * false when absent or when it does not verify: the reader then fetches
     * the manifest).  One round trip a version instead of two (issue 26). */
    const char *manifest_record;
    bool has_manifest;
    fs_manifest manifest;
} fs_head;

typedef struct fs_compaction {
    uint64_t from, to;
    char from_id[FS_ID_CAP], to_id[FS_ID_CAP], id[FS_ID_CAP];
    uint64_t bytes;
    uint8_t base_hash[16], target_hash[16];
    uint64_t from_cum, to_cum;
    uint64_t from_full_bytes; /* full object of `from` if it is an anchor, else 0 */
    int64_t created;
    uint8_t sha[32];          /* SHA-256 of the compacted delta (signed runs) */
    bool has_sha;
    /* a sharded compaction (lib/shard, "objects"): one object per trainer
       rank, fs_index.obj[obj0 .. obj0 + world); 0 = one delta at `key` */
    uint32_t world;
    size_t obj0;
} fs_compaction;

/* One rank object of a sharded compaction: its size, where its tile index
 * starts, its tile count and the Merkle root of its index (the index form
 * of docs/PROTOCOL.md "Sharded versions"); its key is
 * ferry__sync_key_compact_rank of the entry and the rank. */
typedef struct fs_cobj {
    uint64_t bytes, index, tiles;
    uint8_t root[32];
} fs_cobj;
#define FS_COMPACT_WORLD_MAX 65536 /* ranks of a sharded compaction (FERRY_SHARD_WORLD_MAX) */

typedef struct fs_index {
    fs_compaction *c;
    size_t n;
    fs_cobj *obj;             /* the sharded entries' rank objects */
    size_t nobj;
    char run_id[FS_ID_CAP];   /* the run whose versions it names ("" before run ids) */
} fs_index;

/* Serialisers return a new NUL-terminated JSON text (free()). */
char *ferry__sync_head_json(const char *run, const fs_head *h, const char *manifest_key);
char *ferry__sync_manifest_json(const char *run, const fs_manifest *m);
char *ferry__sync_index_json(const char *run, const fs_index *ix);
/* Signs a serialised record in place when keys can sign (the text is
 * replaced by body + signature trailer); else leaves it.  Frees *text on
 * failure. */
int ferry__sync_record_seal(const ferry_keys *keys, char **text);
/* Parsers validate every field and its consistency; key names the object
 * in errors (FERRY_ERR_SYNC_MANIFEST).  They take the record's body, its
 * signature trailer already checked and cut off by the readers below. */
int ferry__sync_head_parse(const char *run, const char *key, const void *text, size_t n, fs_head *out);
int ferry__sync_manifest_parse(const char *run, const char *key, const void *text, size_t n, fs_manifest *out);
int ferry__sync_index_parse(const char *run, const char *key, const void *text, size_t n, fs_index *out);
void ferry__sync_index_release(fs_index *ix);

/* Byte counters of a reader (NULL = not counted). */
typedef struct fs_count {
    uint64_t bytes, objects, manifests;
} fs_count;

/* The readers verify a record's signature before parsing it when keys
 * trust any key (FERRY_ERR_SIG_*, sig.h), and only strip it otherwise
 * (keys may be NULL).
 * Reads HEAD; FERRY_ERR_STORE_NOT_FOUND for a run without one.  A HEAD
 * that does not parse or verify is read again (up to 3 times, 50 ms
 * apart), since a store that writes objects in place (s3rver) can show a
 * partial one.  etag (may be NULL) receives its etag. */
/* HEAD of a new version (time = now), and its one write: serialised,
 * sealed with keys when they can sign, put by compare-and-swap against
 * expected_etag (NULL: no HEAD yet) — head.c. */
void ferry__sync_head_init(fs_head *h, uint64_t version, const char *id, int kind, const uint8_t hash[16], const char *publisher);
int ferry__sync_head_swap(ferry_store *st, const char *run, const ferry_keys *keys, const fs_head *h, const char *expected_etag,
                 char new_etag[FERRY_STORE_ETAG_MAX]);
/* Moves HEAD from `from` (version 0: no HEAD yet) to nh by compare-and-swap
 * against etag (HEAD's etag when it named `from`), with the retries of
 * ferry__sync_cas_retry while HEAD still names `from` under a new etag; our
 * own write found landed (its answer lost) is success.  etag receives the
 * new HEAD's.  Else FERRY_ERR_SYNC_BACKWARDS (HEAD below `from`, or gone),
 * FERRY_ERR_SYNC_CONFLICT (another version: another publisher), each named
 * with `who` (the publisher id) in the message. */
int ferry__sync_head_move(ferry_store *st, const char *run, const ferry_keys *keys, const fs_head *nh, const fs_ref *from,
                          const char *who, char etag[FERRY_STORE_ETAG_MAX]);
int ferry__sync_head_read(ferry_store *st, const char *run, const ferry_keys *keys, fs_count *cnt, fs_head *h,
                 char etag[FERRY_STORE_ETAG_MAX]);
/* ferry__sync_head_read that also hands over HEAD's bytes as read (*text,
 * *n: the signed record whole, for a mirror that copies them verbatim;
 * ferry_free), under the same retries. */
int ferry__sync_head_read_raw(ferry_store *st, const char *run, const ferry_keys *keys, fs_count *cnt, fs_head *h,
                              char etag[FERRY_STORE_ETAG_MAX], void **text, size_t *n);
/* ferry__sync_head_read for a poller: *h is the HEAD it read before under
 * etag ("" : none yet), and is read again only if HEAD changed (a
 * conditional GET: an unchanged HEAD costs no body on the link).  On
 * success *h and etag are HEAD's; on failure etag is cleared. */
int ferry__sync_head_poll(ferry_store *st, const char *run, const ferry_keys *keys, fs_count *cnt, fs_head *h,
                          char etag[FERRY_STORE_ETAG_MAX]);

/* ---- compare-and-swap with retries (cas.c) ---- */

/* Calls attempt until it returns something other than
 * FERRY_ERR_STORE_CONFLICT, at most 10 times, waiting 20, 40 ... 640 ms
 * between calls; then FERRY_ERR_STORE_CONFLICT naming `what`. */
int ferry__sync_cas_retry(int (*attempt)(void *ctx), void *ctx, const char *what);
/* Changes the compaction index by compare-and-swap, with those retries:
 * each attempt reads it (verified with keys), lets edit change ix (edit may
 * replace ix->c; FERRY_OK with *write false leaves the index as it is) and
 * writes it back sealed with keys against the etag read. */
typedef int (*fs_index_edit)(void *ctx, fs_index *ix, bool *write);
int ferry__sync_index_update(ferry_store *st, const char *run, const ferry_keys *keys, fs_index_edit edit, void *ctx);
/* Adds compaction c (with its c->world rank objects obj[], NULL when 0) to
 * the index by compare-and-swap, as ferry_compact does (compact.c): an
 * entry of the same range is replaced, an index of another run id than
 * run_id (HEAD's) is emptied first. */
int ferry__sync_compact_add(ferry_store *st, const char *run, const ferry_keys *keys, const char *run_id, const fs_compaction *c,
                            const fs_cobj *obj);
/* Reads and checks the manifest of (version, id).  With enforcing keys a
 * signed manifest must give the SHA-256 of each object it lists. */
int ferry__sync_manifest_read(ferry_store *st, const char *run, const ferry_keys *keys, uint64_t version, const char *id,
                     fs_count *cnt, fs_manifest *out);
/* The links of (version, id)'s manifest in either format, single-rank
 * (ferry-manifest-1) or sharded (ferry-manifest-2): version, id, kind, prev,
 * anchor, hashes, object byte totals, tensor count — what GC and the run log
 * walk.  Signature checked as for every record; the sharded fields beyond the
 * links are left to lib/shard. */
int ferry__sync_manifest_links(ferry_store *st, const char *run, const ferry_keys *keys, uint64_t version, const char *id,
                      fs_manifest *out);
int ferry__sync_manifest_links_parse(const char *run, const char *key, const void *text, size_t n, fs_manifest *m);
/* Reads the compaction index (an absent one is empty); etag may be NULL.
 * With enforcing keys every entry must give its SHA-256. */
int ferry__sync_index_read(ferry_store *st, const char *run, const ferry_keys *keys, fs_count *cnt, fs_index *out,
                  char etag[FERRY_STORE_ETAG_MAX]);
/* Gets a whole object, checks its size against the manifest's and, when
 * sha is not NULL, its SHA-256 (FERRY_ERR_SIG_DIGEST), counts it. */
int ferry__sync_object_get(ferry_store *st, const char *key, uint64_t want_size, const uint8_t *sha, fs_count *cnt, void **data,
                  size_t *size);
/* The digest a reader with keys must check (NULL: none to check), or
 * FERRY_ERR_SIG_DIGEST when enforcing and the manifest gives none. */
int ferry__sync_want_sha(const ferry_keys *keys, const char *key, bool has, const uint8_t sha[32], const uint8_t **out);

/* ---- run identity (runid.c) ---- */

/* An option's run id: NULL or "" = none (out = ""), else exactly
 * FERRY_SYNC_ID_LEN lowercase hex digits (FERRY_ERR_ARG naming who). */
int ferry__sync_run_id_option(const char *opt, char out[FS_ID_CAP], const char *who);
/* FERRY_ERR_SYNC_FOREIGN naming both ids when a run id is pinned and the
 * one found (in `what`, of `version`) is another; holder names who pinned
 * it ("island", "publisher"). */
int ferry__sync_run_id_pinned(const char *run, const char *pinned, const char *found, const char *what, uint64_t version,
                              const char *holder);
/* A record read under a HEAD (a manifest, the compaction index) that
 * carries a run id other than HEAD's: FERRY_ERR_SYNC_FOREIGN.  A record
 * without one (written before run ids) agrees with any HEAD. */
int ferry__sync_run_id_agree(const char *run, const char *key, const char *head_run_id, const char *record_run_id);
/* Manifests listed under RUN/v/ (either format): how many, the newest
 * version among them. */
int ferry__sync_versions_listed(ferry_store *st, const char *run, uint64_t *newest, size_t *count);

/* ---- local state of file mode (local.c) ---- */

/* A complete, verified version held locally. */
typedef struct fs_state {
    uint64_t version;         /* 0 = none */
    char id[FS_ID_CAP];
    uint8_t hash[16];
    uint64_t cum;
    char run_id[FS_ID_CAP];   /* the run id of that version ("" before run ids,
                                 or not known) */
} fs_state;

/* Opens PATH (if any) and its state file; *st is the state whose hash the
 * file has, or none.  *model is NULL when PATH is missing or unreadable. */
int ferry__sync_local_open(const char *path, const char *run, ferry_model **model, fs_state *st);
/* Removes the resumable anchor downloads beside PATH (PATH.ferry-download.ID
 * and its .part, .part.state) of every anchor id but keep_id (NULL: all). */
void ferry__sync_local_drop_downloads(const char *path, const char *keep_id);
/* Makes PATH hold model (of state to), replacing the version `from`:
 * state file with both, PATH written aside and renamed (or staged_file
 * renamed, when model is that file mapped), state file with `to`. */
int ferry__sync_local_commit(const char *path, const char *run, const ferry_model *model, const char *staged_file,
                    const fs_state *from, const fs_state *to);
/* (runid.c) A publisher found no HEAD: FERRY_ERR_SYNC_BACKWARDS if the run still has
 * versions (manifests under RUN/v/, or cached, a state with a version),
 * naming them and the two ways on (head-repair, new_run); FERRY_OK for a
 * new run. */
int ferry__sync_head_gone_check(ferry_store *st, const char *run, const fs_state *cached, const char *cache_path);
/* The state PATH's state file names (current, else pending), without
 * reading PATH: what a publisher's cache pins.  Nothing (version 0) when
 * there is no state file or it does not parse. */
void ferry__sync_local_peek(const char *path, const char *run, fs_state *st);
/* "PATH.ferry.json" */
int ferry__sync_local_state_path(const char *path, char *out, size_t cap);

/* ---- subscriber internals used by the publisher and compaction ---- */

/* Gives the (private-mode) subscriber a starting model and state; with
 * owned false the model is borrowed read-only and must outlive the sync. */
void ferry__sync_sub_adopt(ferry_subscriber *s, ferry_model *model, bool owned, const fs_state *st);
/* Takes the private-mode model away (the subscriber then holds none). */
ferry_model *ferry__sync_sub_take(ferry_subscriber *s, fs_state *st);
void ferry__sync_sub_state(const ferry_subscriber *s, fs_state *st);
/* Finds the manifest of `version` on the lineage of HEAD (head, head_id),
 * walking back through prev and anchor links; FERRY_ERR_SYNC_GONE if the
 * walk meets a manifest that is gone before reaching it. */
int ferry__sync_find_manifest(ferry_store *st, const char *run, const ferry_keys *keys, const fs_head *head, uint64_t version,
                     fs_count *cnt, fs_manifest *out);

/* ---- paths (plan.c) ---- */

enum { FS_STEP_FULL = 1, FS_STEP_CHAIN = 2, FS_STEP_COMPACT = 3 };
typedef struct fs_step {
    int kind;
    uint64_t from, to;        /* CHAIN: deltas from+1..to; FULL: to = the anchor */
    char to_id[FS_ID_CAP];    /* id of `to` (CHAIN, FULL) */
    size_t compaction;        /* COMPACT: index into the compaction list */
} fs_step;

typedef struct fs_plan {
    int n;
    fs_step step[4];
    uint64_t bytes;
    char desc[128];
} fs_plan;

/* What the planner knows. */
typedef struct fs_plan_in {
    const fs_state *cur;      /* where the subscriber is (version 0 = none) */
    bool cur_usable;          /* cur is on the target's lineage as far as known */
    const fs_manifest *target;
    const fs_compaction *c;   /* usable compactions (already filtered) */
    size_t nc;
    /* exclusions: a path may not use these */
    const uint64_t *bad_delta_versions;
    size_t nbad_delta;
    const uint64_t *bad_full_versions;
    size_t nbad_full;
} fs_plan_in;

/* Prices the options (chain, anchor, compacted; UINT64_MAX where not
 * available) and picks the cheapest; returns false if none is left. */
bool ferry__sync_plan_pick(const fs_plan_in *in, fs_plan *out, uint64_t *chain_bytes, uint64_t *anchor_bytes,
                  uint64_t *compact_bytes);

/* ---- models ---- */

/* Owned copy of m; with cast_bf16, F32 tensors become their BF16 cast. */
int ferry__sync_model_copy(const ferry_model *m, int cast_bf16, ferry_model **out);
/* The same copy into dst's existing buffers (the publisher's previous
 * model, reused: no allocation, no page faults); only when ferry__sync_model_fits
 * said yes, and then it cannot fail. */
bool ferry__sync_model_fits(ferry_model *dst, const ferry_model *m, int cast_bf16);
void ferry__sync_model_overwrite(ferry_model *dst, const ferry_model *m, int cast_bf16);
/* Same tensor names, dtypes, shapes (in order) in both models. */
bool ferry__sync_same_structure(const ferry_model *a, const ferry_model *b, char *why, size_t cap);

/* ferry_gc; with keep_index the compaction index is left as it is (a
 * mirror's copy of its upstream's signed bytes) while the compacted
 * deltas it names that end before the retained set are still deleted. */
int ferry__sync_gc(ferry_store *store, const char *run, const ferry_gc_options *opts, bool keep_index, ferry_gc_report *out);

/* Failures another store of a list (mirrors of one another) may not have:
 * down, behind, or serving what does not verify (sub_stores.c). */
bool ferry__sync_store_worth_next(int rc);

/* Object-level failures (a corrupt, foreign or vanished object or manifest
 * on a path) are answered by trying another path; others abort a sync. */
bool ferry__sync_object_error(int rc);

#endif
