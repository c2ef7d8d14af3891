/*
 * ferry_sync.h — versioned policy distribution over an object store:
 * a publisher (the trainer) and any number of subscribers (rollout islands)
 * that share nothing but a store (include/ferry_store.h).
 *
 * docs/PROTOCOL.md is the long form: object layout, manifest format, HEAD
 * and compare-and-swap, anchors, compaction, retention, path selection and
 * the crash-safety argument.  In short:
 *
 *  - a RUN is a key prefix in the store ("rl/run-7"); its versions are
 *    numbered 1, 2, 3 ... and never reused or renumbered;
 *  - every version has a manifest (JSON) and one or two immutable objects:
 *    a DELTA (a ferry patch from the previous version) and, for an ANCHOR
 *    version, also the FULL model (a .safetensors file).  Object keys carry
 *    the version and a random id, so no object is ever overwritten;
 *  - RUN/HEAD names the latest version.  It is written only after every
 *    object and the manifest of that version are durable, by
 *    compare-and-swap against the HEAD the publisher last saw, and never to
 *    a lower version.  A second publisher on the same run gets
 *    FERRY_ERR_SYNC_CONFLICT naming the other one;
 *  - subscribers read HEAD, choose the cheapest verified path from what they
 *    hold to the version they want (deltas, a compacted delta, an anchor
 *    plus deltas), check the base hash before and the target hash after
 *    every step, and switch what they expose only to a complete, verified
 *    version.
 *
 * Conventions (those of ferry.h): functions return 0 or a FERRY_ERR_* code;
 * ferry_last_error() names the run, version and object key; handles are
 * opaque and *_free accepts NULL.  Every byte read from the store (HEAD,
 * manifests, objects) is validated before use.  A handle is used by one
 * thread at a time, except ferry_subscriber_wake.  The store must outlive
 * every handle opened on it; deadlines, retries and the progress callback
 * are those of the store's options.
 */
#ifndef FERRY_SYNC_H
#define FERRY_SYNC_H

#include "ferry.h"
#include "ferry_sign.h"
#include "ferry_store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Errors 80..99 (FERRY_ERR_SYNC_*): listed, with their
 * messages and meanings, in ferry_errors.h (included through ferry.h).
 * ====================================================================== */

/* Version kinds. */
enum { FERRY_SYNC_DELTA = 0, FERRY_SYNC_ANCHOR = 1 };

#define FERRY_SYNC_ID_LEN 16          /* hex digits of a version's random id */
#define FERRY_SYNC_PUBLISHER_MAX 128  /* bytes of a publisher id, with the NUL */
#define FERRY_SYNC_RUN_MAX 200        /* bytes of a run name */

/* Run names: 1..FERRY_SYNC_RUN_MAX bytes, '/'-separated segments of
 * [A-Za-z0-9._-] that do not start with '.'.  Returns 0 or
 * FERRY_ERR_SYNC_RUN. */
FERRY_API int ferry_sync_run_check(const char *run);

/* ======================================================================
 * Publisher.
 * ====================================================================== */
typedef struct ferry_publisher ferry_publisher;

typedef struct ferry_publisher_options {
    const char *publisher_id; /* written into HEAD and manifests, named in
                                 conflict errors; printable ASCII, at most
                                 FERRY_SYNC_PUBLISHER_MAX-1 bytes.
                                 NULL = "HOST:PID:RANDOM" */
    uint32_t anchor_every;    /* K: a version is an ANCHOR when K or more
                                 versions have passed since the last anchor
                                 (and version 1 always is).  0 = 10 */
    int cast_bf16;            /* publish FP32 masters: every F32 tensor is
                                 published as its BF16 cast (bit-identical to
                                 PyTorch); subscribers receive BF16 */
    int level;                /* zstd level for whole tensors, 0 = 3 */
    int threads;              /* codec threads, 0 = 1 */
    int verify;               /* also apply each new delta to the previous
                                 model and compare the result's hash before
                                 publishing (costs one apply per version) */
    const char *cache_path;   /* optional local .safetensors where the last
                                 published model is kept (with a state file
                                 beside it, as a file-mode subscriber keeps
                                 it), so a restart need not download it */
    const char *tmp_dir;      /* where anchors are staged before upload;
                                 NULL = $TMPDIR, else /tmp */
    const ferry_keys *keys;   /* optional (borrowed; must outlive the handle).
                                 With a signing key: HEAD and every manifest
                                 are signed and list the SHA-256 of each
                                 object.  With trusted keys (the signer's is
                                 one): the HEAD and manifest resumed from
                                 must verify (include/ferry_sign.h) */
    int quantize;             /* a ferry_quant (include/ferry_quant.h), 0 =
                                 none: every version's model is
                                 ferry_quantize(model, quantize, cast_bf16,
                                 the previous version's model): the FP8
                                 checkpoint is what the run holds (anchors,
                                 deltas, hashes).  Its name is in the model's
                                 metadata ("ferry.quantize"); resuming a run
                                 published under another scheme (none
                                 included) is refused (FERRY_ERR_ARG) */
    const char *run_id;       /* optional: the run id (FERRY_SYNC_ID_LEN hex
                                 digits, ferry_publisher_run_id) this
                                 publisher must resume; a HEAD of another
                                 (a version copied from another store or
                                 prefix) is FERRY_ERR_SYNC_FOREIGN.  The
                                 cache_path state pins it too.  NULL = the
                                 run id of HEAD, or a new one at version 1 */
    int new_run;              /* HEAD is absent but RUN/v/ (or cache_path)
                                 holds versions: start the run anew at
                                 version 1 with a new run id.  Without it
                                 that open is refused
                                 (FERRY_ERR_SYNC_BACKWARDS): a deleted HEAD
                                 must be restored (ferry head-repair), not
                                 silently replaced by a new version 1 */
} ferry_publisher_options;

/* Opens a publisher on RUN.  Reads HEAD: on a new run the first publish
 * makes version 1 (a run whose HEAD is gone while versions remain is
 * refused unless new_run); otherwise the publisher resumes after HEAD, fetching
 * that version's model through the subscriber path (or taking it from
 * cache_path when its hash matches) so that the next delta is against the
 * exact bits subscribers hold.  opts may be NULL.
 * Returns FERRY_ERR_SYNC_RUN, store errors, or the subscriber's errors
 * while fetching the resumed version. */
FERRY_API int ferry_publisher_open(ferry_store *store, const char *run, const ferry_publisher_options *opts,
                                   ferry_publisher **out);
FERRY_API void ferry_publisher_free(ferry_publisher *p);
/* The run id of the versions this publisher writes ("" until version 1 of
 * a new run is published): FERRY_SYNC_ID_LEN random hex digits drawn at
 * version 1 and signed into every record (docs/PROTOCOL.md "Run
 * identity").  Valid until the handle is freed. */
FERRY_API const char *ferry_publisher_run_id(const ferry_publisher *p);

/* Flags of ferry_publish_ex. */
#define FERRY_PUBLISH_ANCHOR 1u   /* make this version an anchor whatever K says */

/* What one publish did. */
typedef struct ferry_publish_info {
    uint64_t version;
    int kind;                     /* FERRY_SYNC_ANCHOR or FERRY_SYNC_DELTA */
    uint64_t delta_bytes;         /* bytes of the delta object (0 for version 1) */
    uint64_t full_bytes;          /* bytes of the full object (anchors only) */
    uint64_t model_bytes;         /* tensor bytes of the published model */
    uint8_t model_hash[16];       /* model hash of the published (BF16) model */
    char id[FERRY_SYNC_ID_LEN + 1];
    double seconds;               /* wall time of the publish */
} ferry_publish_info;

/* Publishes model as the next version.  Order: objects put (each
 * acknowledged by the store), then the manifest, then HEAD by
 * compare-and-swap; HEAD is re-read first, and if it no longer names this
 * publisher's last version the call fails with FERRY_ERR_SYNC_CONFLICT
 * before uploading anything.  The model is copied (the caller may change
 * it after the call).  On any failure HEAD is unchanged (or names another
 * publisher's version) and the objects written are unreferenced garbage
 * that ferry_gc removes.  After a conflict every later publish fails too:
 * reopen to resume after the other publisher's HEAD. */
FERRY_API int ferry_publish(ferry_publisher *p, const ferry_model *model, uint64_t *version);
FERRY_API int ferry_publish_ex(ferry_publisher *p, const ferry_model *model, unsigned flags,
                               ferry_publish_info *info);

/* The last version this publisher published or resumed from (0 = none). */
FERRY_API uint64_t ferry_publisher_version(const ferry_publisher *p);

/* ======================================================================
 * Subscriber.
 *
 * Three modes, chosen by the options:
 *  - file mode (path set): the local checkpoint PATH plus a state file
 *    PATH.ferry.json (run, version, id, model hash).  A new version is
 *    written beside PATH and renamed over it only after it verified; the
 *    state file is updated around the rename so that a crash at any point
 *    leaves PATH at a complete version the next open recognises (by its
 *    hash).  A PATH whose hash matches no recorded state is treated as
 *    holding no version (it is replaced, atomically, by the next sync).
 *  - memory mode (model set): the caller's model, whose tensors are
 *    writable buffers it owns (FERRY_ADD_BORROW of its own memory, e.g. an
 *    inference engine's weights).  Deltas are applied in place by
 *    ferry_apply_inplace_ex, which returns with the whole result verified
 *    or with the buffers exactly as they were; a sync of several steps is
 *    undone as a whole (a failure at a later step puts back what the
 *    earlier ones wrote: the buffers hold the version they held before the
 *    sync); a step that needs an anchor
 *    or changes metadata is built
 *    aside and copied in only if every tensor keeps its name, dtype and
 *    shape, else FERRY_ERR_SYNC_SHAPE and the buffers are untouched.  The
 *    caller must not read the buffers while a sync runs (between syncs
 *    they always hold the complete version ferry_subscriber_version says).
 *  - private mode (neither): the library holds the model
 *    (ferry_subscriber_model).
 * ====================================================================== */
typedef struct ferry_subscriber ferry_subscriber;

typedef struct ferry_subscriber_options {
    const char *path;          /* file mode */
    ferry_model *model;        /* memory mode (borrowed; must outlive the handle) */
    uint64_t model_version;    /* memory mode: the version the caller says its
                                  buffers hold (0 = none / unknown).  Checked:
                                  the model is hashed and compared with that
                                  version's manifest at the first sync.  A
                                  HEAD below it is refused
                                  (FERRY_ERR_SYNC_BACKWARDS): a store rolled
                                  back must not take a restarted island back */
    int threads;               /* codec threads, 0 = 1 */
    uint32_t poll_interval_ms; /* ferry_subscriber_wait's HEAD polling, 0 = 1000 */
    uint32_t max_attempts;     /* paths tried per sync after a rejected object
                                  or a vanished one, 0 = 4 */
    int no_compactions;        /* ignore compacted deltas when choosing paths */
    const char *tmp_dir;       /* staging of downloaded anchors; NULL = PATH's
                                  directory (file mode), else $TMPDIR or /tmp */
    const ferry_keys *keys;    /* optional (borrowed; must outlive the handle).
                                  With trusted keys: HEAD, every manifest and
                                  the compaction index must be signed by one
                                  (else FERRY_ERR_SIG_*, checked before they are
                                  parsed), and every object fetched must match
                                  its signed SHA-256 (FERRY_ERR_SIG_DIGEST,
                                  a rejected object).  An unsigned or wrongly
                                  signed compaction index only costs the
                                  shortcuts.  Without: signatures are ignored */
    unsigned concurrency;      /* anchors (full objects) are fetched as this many
                                  parallel ranged GETs, 1..64; 0 = 4
                                  (ferry_store_get_file_parallel; the store's
                                  max_bytes_per_s caps each of them) */
    uint64_t chunk_size;       /* bytes per ranged GET, 4 KiB..1 GiB; 0 = 8 MiB.
                                  File mode without tmp_dir: an anchor download
                                  cut short (a failure, a killed process) is
                                  kept as PATH.ferry-download.ID.part and
                                  continued by the next sync that needs the
                                  same anchor; the object is verified (size,
                                  hashes) as a whole before it is used */
    const char *run_id;        /* optional: pin the run id (FERRY_SYNC_ID_LEN
                                  hex digits) before the first sync.  Without
                                  it the first version synced pins it (file
                                  mode: kept in PATH's state file).  A HEAD of
                                  another run id — a version copied from
                                  another store or prefix, signed by the same
                                  key — is FERRY_ERR_SYNC_FOREIGN, naming both */
} ferry_subscriber_options;

/* Opens a subscriber; sends no request.  File mode reads PATH and its
 * state file if they exist (hashing PATH once).
 * Returns FERRY_ERR_SYNC_RUN, FERRY_ERR_ARG (path and model both set, or a
 * tensor of model not writable), I/O and safetensors errors of PATH. */
FERRY_API int ferry_subscriber_open(ferry_store *store, const char *run, const ferry_subscriber_options *opts,
                                    ferry_subscriber **out);
FERRY_API void ferry_subscriber_free(ferry_subscriber *s);

/* Removes what killed processes left beside a local checkpoint PATH while
 * they wrote it (PATH.tmp.PID.*, PATH.ferry.json.tmp.PID.*,
 * PATH.ferry-anchor.PID.*) — only files of processes that no longer exist.
 * A file-mode subscriber does it when it opens; a program that keeps its
 * own files under these names (ferry shard-pull --out) calls it. */
FERRY_API void ferry_sync_local_clean(const char *path);
/* The run id this subscriber is pinned to ("" if none yet). */
FERRY_API const char *ferry_subscriber_run_id(const ferry_subscriber *s);

/* Targets of ferry_subscriber_sync. */
enum {
    FERRY_SYNC_LATEST = 0, /* the version HEAD names */
    FERRY_SYNC_MIN = 1,    /* at least `version`: nothing to do if already there,
                              else the latest (FERRY_ERR_SYNC_NOT_YET if HEAD is
                              below `version`) */
    FERRY_SYNC_EXACT = 2,  /* exactly `version` (older than the current one is
                              allowed: reached through an anchor) */
};

/* What one sync did. */
typedef struct ferry_sync_info {
    uint64_t from_version;     /* what the subscriber held before (0 = none) */
    uint64_t to_version;       /* what it holds now */
    uint64_t head_version;     /* HEAD as read by this sync */
    uint64_t bytes_fetched;    /* every byte read from the store by this sync
                                  (HEAD, manifests, index, objects) */
    uint64_t planned_bytes;    /* object bytes of the path chosen (the last
                                  one, if a rejected object forced another) */
    uint64_t chain_bytes;      /* the options priced: deltas from the current */
    uint64_t anchor_bytes;     /*   version; the newest anchor plus deltas; */
    uint64_t compacted_bytes;  /*   the best path through a compacted delta.
                                  UINT64_MAX where not available */
    uint32_t steps;            /* objects applied (an anchor counts as one) */
    uint32_t rejected;         /* objects rejected (corrupt, vanished) */
    char path[128];            /* "chain 41..50", "anchor 41 + chain 41..50",
                                  "compacted 5..55 + chain 55..60", "none" */
} ferry_sync_info;

/* Brings the subscriber to the target version (mode and version as
 * above; version is ignored for FERRY_SYNC_LATEST).  info may be NULL.
 * A rejected object (truncated, bit-flipped, another version's object,
 * vanished by a concurrent GC) is recorded in the statistics and the sync
 * tries the next cheapest path that avoids it, at most max_attempts paths;
 * the subscriber's model and version change only to complete, verified
 * versions.
 * Returns FERRY_ERR_SYNC_NOT_YET, _GONE, _NO_PATH (naming the last
 * rejected object), _SHAPE, _BACKWARDS, _MANIFEST, with trusted keys the
 * FERRY_ERR_SIG_* of HEAD or of the target's manifest (a forged object on
 * a path is a rejection: last_rejection names it), and store errors
 * (FERRY_ERR_STORE_TIMEOUT after the store's deadline ...). */
FERRY_API int ferry_subscriber_sync(ferry_subscriber *s, int mode, uint64_t version, ferry_sync_info *info);

/* The version the subscriber holds (its file, the caller's buffers, its
 * own model): 0 = none.  Always a complete, verified version. */
FERRY_API uint64_t ferry_subscriber_version(const ferry_subscriber *s);
/* Model hash of that version; FERRY_ERR_NOT_FOUND if none. */
FERRY_API int ferry_subscriber_hash(const ferry_subscriber *s, uint8_t out[16]);
/* Raises the floor below which a HEAD is refused (FERRY_ERR_SYNC_BACKWARDS,
 * in every mode) to `version`, and returns the floor in force (0 leaves it:
 * a read).  The floor starts at model_version and rises with every version
 * synced.  For a caller that reopens a handle for the same weights (new
 * buffers, a restarted process): it carries the old handle's floor over,
 * so that a store writer who puts an older signed HEAD back cannot take
 * the island back to it. */
FERRY_API uint64_t ferry_subscriber_min_head(ferry_subscriber *s, uint64_t version);
/* The model held (memory mode: the caller's; private mode: the library's,
 * valid until the next sync or free; file mode: PATH mapped read-only), or
 * NULL if none. */
FERRY_API const ferry_model *ferry_subscriber_model(const ferry_subscriber *s);

/* The elements of tensor i (of ferry_subscriber_model, in its order) that
 * the last ferry_subscriber_sync changed, for a caller that keeps a copy
 * of the weights elsewhere (an inference engine's device memory) and
 * updates only those: *count flat element positions within the tensor
 * (ascending, int64 so that they index a tensor directly) and their new
 * values (count elements of the tensor's dtype, as the model now holds
 * them).  The same contract as ferry_shard_region_changes.
 *  - A route of several versions lists the union of the positions every
 *    step wrote (a word changed and changed back may be listed, with its
 *    value now; every word that differs from the version held before the
 *    sync is listed).
 *  - *all = 1, with empty lists, when the tensor is to be copied whole:
 *    the sync went through an anchor (a first sync among them), built the
 *    model aside (file mode; a version that changes the structure), the
 *    delta carried the tensor whole, or its list would hold more than a
 *    fifth of its elements (positions and values outweighing the tensor).
 *    Lists are read from what the in-place apply overwrote, so only a sync
 *    applied in place (memory mode, or private mode) gives them.
 *  - A sync that changed nothing (already at the target, or one that
 *    failed and left the model as it was): all = 0 and count = 0.
 * The lists are built at the first call after a sync (a subscriber that
 * never asks does not pay for them; until then it keeps what the in-place
 * apply overwrote, about 4 bytes per BF16 change).  Pointers valid until
 * the next sync or free.  FERRY_ERR_NOT_FOUND while no version is held,
 * FERRY_ERR_ARG for i out of range. */
FERRY_API int ferry_subscriber_changes(ferry_subscriber *s, size_t i, int *all, const int64_t **positions,
                                       const void **values, size_t *count);

/* Waits until HEAD names a version above after_version, polling HEAD every
 * poll_interval_ms; *head (may be NULL) receives the version HEAD names (0
 * while the run has none: a run without HEAD yet is waited for, not an
 * error).  Returns 0 when HEAD is above after_version, or when
 * ferry_subscriber_wake interrupted the wait (then *head may not be above
 * it); FERRY_ERR_SYNC_TIMEOUT after timeout_ms (0 = read HEAD once); the
 * store's errors.  A sync called less than poll_interval_ms after the wait
 * returned (HEAD above after_version, one store) uses the HEAD the wait
 * read instead of reading it again: one round trip less per version. */
FERRY_API int ferry_subscriber_wait(ferry_subscriber *s, uint64_t after_version, uint64_t timeout_ms,
                                    uint64_t *head);
/* Makes a concurrent (or the next) ferry_subscriber_wait return at once.
 * The only call that may come from another thread. */
FERRY_API void ferry_subscriber_wake(ferry_subscriber *s);

/* Counters since open. */
typedef struct ferry_subscriber_stats {
    uint64_t syncs, steps;
    uint64_t bytes_fetched;        /* all reads from the store */
    uint64_t objects_fetched;      /* anchors, deltas, compacted deltas */
    uint64_t manifests_fetched;    /* HEAD, manifests, the compaction index */
    uint64_t rejected;             /* objects rejected */
    char last_rejection[512];      /* message of the last rejection (names the key) */
} ferry_subscriber_stats;
FERRY_API void ferry_subscriber_get_stats(const ferry_subscriber *s, ferry_subscriber_stats *out);

/* ======================================================================
 * Run log.
 * ====================================================================== */
typedef struct ferry_version_info {
    uint64_t version;
    int kind;                      /* FERRY_SYNC_ANCHOR / FERRY_SYNC_DELTA */
    uint64_t base_version;         /* the delta's base (version - 1), 0 for version 1 */
    uint64_t anchor_version;       /* nearest anchor at or below this version */
    uint64_t delta_bytes, full_bytes, model_bytes;
    int64_t created;               /* seconds since the epoch */
    uint8_t model_hash[16];
    char id[FERRY_SYNC_ID_LEN + 1];
    char publisher[FERRY_SYNC_PUBLISHER_MAX];
} ferry_version_info;

typedef struct ferry_compaction_info {
    uint64_t from, to;             /* the delta turns version `from` into `to` */
    uint64_t bytes;                /* size of the compacted delta */
    uint64_t chain_bytes;          /* the deltas it replaces, summed */
    char key[FERRY_STORE_KEY_MAX + 1];
    uint32_t objects;              /* a sharded compaction (ferry_shard_compact):
                                      its rank objects, one per trainer rank,
                                      `bytes` their sum and `key` rank 0's
                                      (rank r's ends in -rRRRRRR.patch); 0: one
                                      compacted delta at `key` */
} ferry_compaction_info;

typedef struct ferry_run_log {
    uint64_t head;                 /* HEAD's version */
    char head_publisher[FERRY_SYNC_PUBLISHER_MAX];
    size_t count;
    ferry_version_info *versions;  /* oldest first: every version still in the
                                      store reachable from HEAD */
    size_t ncompactions;
    ferry_compaction_info *compactions;
    int verified;                  /* 1: read with trusted keys, and HEAD, every
                                      manifest listed and the compaction index
                                      verified (ferry_run_log_read_keys) */
    char run_id[FERRY_SYNC_ID_LEN + 1]; /* HEAD's run id ("" before run ids) */
} ferry_run_log;

/* Reads HEAD, walks the manifests back until one is gone (GC) or version 1,
 * at most max_versions of them (0 = all), and reads the compaction index.
 * No signature is checked: what it lists is what the store says.
 * Returns FERRY_ERR_SYNC_NOT_YET for a run without HEAD. */
FERRY_API int ferry_run_log_read(ferry_store *store, const char *run, uint64_t max_versions, ferry_run_log **out);
/* As ferry_run_log_read, checking each record against keys (borrowed; a
 * ring that trusts no key checks nothing) as a subscriber does before it
 * uses one: HEAD, every manifest on the walk (either format) and the
 * compaction index must carry a valid signature by a trusted key, and a
 * signed manifest or index must give the SHA-256 of every object it
 * names.  Objects themselves are not read.  On success log->verified is 1
 * when the ring trusts a key.  Fails with the first refusal
 * (FERRY_ERR_SIG_MISSING, _INVALID, _UNTRUSTED, _MALFORMED, ...), naming
 * the record, and lists nothing. */
FERRY_API int ferry_run_log_read_keys(ferry_store *store, const char *run, uint64_t max_versions,
                                      const ferry_keys *keys, ferry_run_log **out);
FERRY_API void ferry_run_log_free(ferry_run_log *log);

/* ======================================================================
 * Compaction: one delta for a range of versions, as a shortcut.
 * ====================================================================== */
typedef struct ferry_compact_options {
    uint64_t from, to;   /* the range; to = 0: HEAD; from = 0: the newest
                            anchor below `to` */
    int level, threads;
    const char *tmp_dir;
    const ferry_keys *keys; /* as the publisher's: verify what is read, sign
                               the index and list the compacted delta's
                               SHA-256 (readers with trusted keys ignore an
                               unsigned index) */
} ferry_compact_options;

/* Builds the models of `from` and `to` (through the subscriber path, each
 * verified), diffs them into one delta, writes it under
 * RUN/c/FROM-TO-ID.patch and then adds it to RUN/compactions.json by
 * compare-and-swap.  Subscribers at `from` (or that reach it cheaply) use
 * it when it is the smallest path.  out may be NULL.
 * Returns FERRY_ERR_ARG for an empty range, FERRY_ERR_SYNC_NOT_YET /
 * _GONE for versions not (or no longer) there. */
FERRY_API int ferry_compact(ferry_store *store, const char *run, const ferry_compact_options *opts,
                            ferry_compaction_info *out);

/* ======================================================================
 * Retention (garbage collection).
 *
 * With HEAD at version N and keep = k, the RETAINED set is every version
 * from A to N on HEAD's lineage, where A is the anchor that version
 * max(1, N-k+1) chains back to: the last k versions plus everything a
 * reader needs to reach any of them from their anchor.  GC keeps the
 * manifests, deltas and full objects of the retained set, every compacted
 * delta that ends in it, HEAD, the index, every object of a version above
 * N (a publish in flight), unreferenced objects younger than the grace
 * period (a compaction in flight, a losing publisher's orphans), and any
 * key it does not recognise.  It deletes everything else under RUN/.  So
 * GC never deletes the version HEAD names or anything reachable from the
 * retained set; a reader on a dropped version gets FERRY_ERR_SYNC_GONE or
 * a clean NOT_FOUND and retries from HEAD.
 * ====================================================================== */
typedef struct ferry_gc_options {
    uint64_t keep;            /* k >= 1 */
    int dry_run;              /* report, delete nothing */
    int64_t grace_s;          /* age before unreferenced objects (not on HEAD's
                                 lineage) are deleted: 0 = 3600; < 0 = none */
    /* optional: called once per object considered, with action 1 = delete
       (or would, in a dry run), 0 = keep; why is a short reason */
    void (*on_object)(void *user, const char *key, uint64_t bytes, int action, const char *why);
    void *user;
    const ferry_keys *keys;   /* optional: HEAD and manifests must verify before
                                 anything is deleted; an index rewritten without
                                 dropped compactions is signed */
} ferry_gc_options;

typedef struct ferry_gc_report {
    uint64_t head;                 /* HEAD's version */
    uint64_t oldest_retained;      /* A, as above */
    uint64_t objects_kept, bytes_kept;
    uint64_t objects_deleted, bytes_deleted;
    uint64_t compactions_dropped;
} ferry_gc_report;

FERRY_API int ferry_gc(ferry_store *store, const char *run, const ferry_gc_options *opts, ferry_gc_report *out);

/* ======================================================================
 * Owner's recovery: HEAD rewritten to the newest version that verifies.
 * ====================================================================== */
typedef struct ferry_head_repair_options {
    const ferry_keys *keys;   /* required: a signing key (the publisher's:
                                 the new HEAD is signed); the manifests must
                                 verify against its public half or another
                                 publisher key of the ring */
    const char *run_id;       /* only versions of this run id (16 hex digits,
                                 as `ferry log` or ferry_publisher_run_id
                                 gave it).  NULL: the run id of the versions
                                 found; refused (FERRY_ERR_SYNC_FOREIGN) when
                                 versions of several run ids verify (another
                                 run's copied in: say which one is yours) */
    int dry_run;              /* find the version, write nothing */
} ferry_head_repair_options;

typedef struct ferry_head_repair_info {
    uint64_t version;                   /* the version HEAD names now (or would) */
    char id[FERRY_SYNC_ID_LEN + 1];
    char run_id[FERRY_SYNC_ID_LEN + 1];
    uint64_t head_before;               /* the version HEAD named, if it verified */
    int head_state;                     /* HEAD before: 0 absent, 1 verified (of
                                           the run id), 2 did not verify, or of
                                           another run id */
    char head_error[256];               /* why, for head_state 2 */
    int written;                        /* 1 if HEAD was rewritten */
    uint64_t manifests, refused;        /* manifests listed; refused (unsigned,
                                           wrongly signed, malformed, another run
                                           id) or incomplete (an object missing
                                           or of another size, a link broken) */
    char last_refusal[512];
} ferry_head_repair_info;

/* The owner's recovery after HEAD was deleted, forged or rolled back: lists
 * RUN/v/, verifies every manifest against the ring's publisher keys, and
 * rewrites HEAD — signed, by compare-and-swap against the HEAD it read —
 * to the newest version that is complete: its manifest and every manifest
 * down to its anchor verify and link, and the anchor's full object and
 * each delta above it are in the store with their signed sizes.  A HEAD
 * that verifies and names that version (or a newer complete one) is left
 * as it is; one that verifies but names a version that is no longer
 * complete is not moved back (FERRY_ERR_SYNC_BACKWARDS: republish).  The
 * objects' bytes are not read: the publisher that resumes afterwards, and
 * every island, check them against their signed digests.
 * Errors: FERRY_ERR_ARG (no signing or publisher key), FERRY_ERR_SYNC_NOT_YET
 * (no complete version), _FOREIGN (several run ids), _CONFLICT (HEAD changed
 * meanwhile: run it again), _BACKWARDS, the store's.  info may be NULL. */
FERRY_API int ferry_head_repair(ferry_store *store, const char *run, const ferry_head_repair_options *opts,
                                ferry_head_repair_info *info);


/* ======================================================================
 * Mirrors and store lists (docs/MIRROR.md).
 *
 * A MIRROR follows a run from an upstream store (SRC) into a nearer one
 * (DST), from which the islands of one datacenter pull: every version's
 * objects cross the long link once, whatever the number of islands.  A
 * mirror copies bytes verbatim — manifests, deltas, full objects, the
 * ranks' objects of sharded versions, compacted deltas, the compaction
 * index and HEAD itself — so DST holds exactly the run SRC holds (same
 * keys, same content, signatures included) and a mirror of a mirror makes
 * a tree.
 * ====================================================================== */
typedef struct ferry_mirror_options {
    uint64_t keep;          /* after each copy, GC DST keeping this many
                               versions (ferry_gc's rule); 0 = no GC */
    int64_t grace_s;        /* that GC's grace period (ferry_gc_options) */
    const char *tmp_dir;    /* staging of full objects while they are
                               verified; NULL = $TMPDIR, else /tmp */
    uint64_t max_versions;  /* bound on the versions copied by one call
                               (the walk down SRC's lineage); 0 = 100000 */
    unsigned concurrency;   /* full objects: parallel ranged GETs
                               (ferry_store_get_file_parallel), 0 = 4 */
    uint64_t chunk_size;    /* their chunk size, 0 = 8 MiB */
    const ferry_keys *keys; /* optional (borrowed): with trusted keys, SRC's HEAD
                               and manifests must verify before anything is
                               copied, and each object must match the SHA-256
                               its signed manifest gives (include/ferry_sign.h);
                               without, signatures are copied unchecked */
} ferry_mirror_options;

typedef struct ferry_mirror_info {
    uint64_t from_version;      /* DST's HEAD before the call (0 = none) */
    uint64_t to_version;        /* DST's HEAD after it */
    uint64_t src_version;       /* SRC's HEAD as read by the call */
    uint64_t first_copied;      /* lowest version copied (0 = none) */
    uint32_t versions_copied;   /* versions made visible in DST */
    uint32_t objects_copied;    /* deltas and full objects transferred */
    uint32_t objects_reused;    /* already in DST with the manifest's size (a
                                   copy interrupted earlier): not transferred */
    uint64_t bytes_copied;      /* bytes read from SRC: HEAD, manifests, objects */
    uint64_t gc_deleted;        /* objects DST's GC deleted */
    double seconds;
    uint32_t compactions_copied;/* compacted deltas transferred */
    uint32_t index_copied;      /* 1 when SRC's compaction index was written to DST */
} ferry_mirror_info;

/* Brings DST's copy of RUN up to SRC's HEAD, once.  Reads SRC's HEAD, walks
 * SRC's lineage down from it to the version above DST's HEAD when DST is
 * on that lineage and the versions between it and the anchor A of SRC's
 * HEAD cost at most A's full object (so DST's islands chain from where
 * they are); else it starts at A (a DST empty, far behind or on another
 * lineage: the cheapest route; versions below A are not copied).  Then for
 * each version from the lowest up copies its delta and full object (each
 * verified: size from the manifest; a delta's header, trailer checksum and
 * base and target hashes against the manifest; a full object's model hash)
 * and then its manifest, and last writes SRC's HEAD bytes to DST by
 * compare-and-swap against the HEAD read at the start.  Nothing in DST
 * becomes visible before every object it names is there and verified; a
 * mirror killed at any point leaves DST's HEAD on its old, complete
 * version (the copied objects are reused by the next call).  With keep,
 * DST is then garbage-collected by ferry_gc's rules (its compaction index
 * left as SRC wrote it).  Sharded versions (ferry-manifest-2) are copied
 * rank object by rank object, every tile verified against the manifest
 * (SHA-256, checksum, base and target hashes).  Last, also when HEAD did
 * not move, SRC's compaction index is copied verbatim if it differs from
 * DST's, after every compacted delta it names whose target version DST
 * holds was copied and verified (a failure leaves DST's index as it was).
 * info may be NULL.
 * Returns 0 when DST's HEAD equals SRC's (also when nothing was to do);
 * FERRY_ERR_SYNC_NOT_YET (SRC has no version), _BACKWARDS (DST is ahead of
 * SRC: refused), _CONFLICT (DST's HEAD is another version of the same
 * number, or moved during the copy to something other than SRC's HEAD),
 * _CORRUPT / _MANIFEST (SRC served an object or record that does not
 * verify; DST is unchanged, or for a compacted delta DST's index is),
 * FERRY_ERR_SIG_* with keys, store errors of either side. */
FERRY_API int ferry_mirror_once(ferry_store *src, ferry_store *dst, const char *run, const ferry_mirror_options *opts,
                                ferry_mirror_info *info);

/* Store lists: an island names further stores after the one it opened
 * with, in order of preference (a mirror first, then its upstream, then
 * the origin).  A sync tries them in that order and falls back to the next
 * when one is down (store errors), behind (FERRY_ERR_SYNC_NOT_YET for a
 * version asked for, or a HEAD below one already seen elsewhere:
 * _BACKWARDS), or serves something that does not verify (_CORRUPT,
 * _MANIFEST, _NO_PATH, _GONE).  Within a sync, an object (manifest,
 * delta, anchor) whose copy is refused is fetched from the other stores in
 * turn and the route goes on where it was: one bad object on a mirror costs
 * that object again, not the route.  ferry_subscriber_wait reads the first store that
 * answers.  The stores must hold the same run (mirrors of one another)
 * and outlive the handle.  At most FERRY_SYNC_STORES_MAX stores in all.
 * Returns FERRY_ERR_ARG (NULL, or the list is full). */
#define FERRY_SYNC_STORES_MAX 8
FERRY_API int ferry_subscriber_add_store(ferry_subscriber *s, ferry_store *store);
/* Which store served the last successful sync: 0 = the one the handle was
 * opened with, 1.. = the stores added, in order. */
FERRY_API unsigned ferry_subscriber_store_used(const ferry_subscriber *s);
/* How many objects the last sync took from another store than the one it
 * ran on, because that store's copy was refused or missing. */
FERRY_API unsigned ferry_subscriber_objects_refetched(const ferry_subscriber *s);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_SYNC_H */
