/*
 * ferry_dock.h — the trajectory dock: rollout islands put version-tagged
 * batches into an object store; the trainer takes them under a sync policy,
 * each batch at most once, never a corrupt one, never one of another run.
 *
 * The dock carries opaque bytes: the RL workload puts its own serialized
 * batch (examples/rl/traj.h) inside.  docs/DOCK.md is the long form: object
 * layout, header byte by byte, policies, de-duplication and the cursor,
 * failure modes.
 *
 * OBJECTS.  Every batch is one object, written with the store's atomic put:
 *
 *     RUN/traj/vVVVVVVVVVVVVVVVVVVVV/iIIIIIIIII-sSSSSSSSSSSSSSSSSSSSS
 *
 * (policy version, island id and sequence number in fixed-width decimal, so
 * that keys sort by version, then island, then sequence, and the prefix of
 * one version never matches another: "v…01/" is not a prefix of "v…010/").
 * Its bytes are a 128-byte header (magic "FDCK", format, policy version,
 * sequence, island, run id, payload length, put time, XXH3-128 of header and
 * payload) followed by the payload, and, for a signed batch, the island's
 * Ed25519 signature (SIGNATURES below).  The consumer keeps its progress in
 * RUN/dock/cursor, moved by compare-and-swap; rejected objects are moved to
 * RUN/quarantine/REASON/… (or deleted, see options).
 *
 * POLICIES.  take(trainer_version = T):
 *   FERRY_DOCK_SEQUENTIAL  T is the version the trainer requested: only
 *                          batches of version exactly T are admitted.
 *                          Batches of versions below T are stale (a
 *                          sequential trainer never asks for them again):
 *                          dropped, counted, deleted.  Batches above T are
 *                          left in place for a later request (a trainer may
 *                          request T+1 before it has drained T).
 *   FERRY_DOCK_ASYNC, S    T is the newest version the trainer has
 *                          published; a batch of version v is admitted iff
 *                          T − v <= S; older ones are dropped, counted,
 *                          deleted.  A batch with v > T cannot exist unless
 *                          something is wrong (an island or a trainer with a
 *                          broken version counter): it is rejected with
 *                          FERRY_ERR_DOCK_FUTURE, counted, reported through
 *                          the event callback and quarantined.
 * In both modes T may not go below a T already used by the run's consumer
 * (FERRY_ERR_DOCK_REGRESSED), unless the options allow it.
 *
 * DELIVERY is at-least-once from islands (an island may put the same
 * (island, seq) again after a crash) and at-most-once into the trainer:
 * the consumer records every (island, seq) it admitted or dropped in its
 * cursor before take returns, so a batch put twice, or found again by a
 * restarted trainer, is counted as a duplicate and deleted, never returned.
 * A batch is "consumed" when take returns it: a trainer that dies before
 * training on it does not get it again.
 *
 * SIGNATURES (include/ferry_sign.h, docs/SECURITY.md).  A producer whose
 * options carry a signing key signs every batch (header flag 1, then 72
 * bytes after the payload: key id and Ed25519 signature over header and
 * payload).  A consumer whose options trust keys ENROLLS them: it admits a
 * batch of island I only when signed by a key enrolled for I (or for any
 * island); an unsigned, forged or wrongly keyed batch is rejected with
 * FERRY_ERR_DOCK_SIGNATURE.  Replay protection is the cursor's record of
 * (island, seq): with enrolled keys a batch whose (island, seq) was already
 * taken or dropped is not deleted as a duplicate but rejected as
 * FERRY_ERR_DOCK_REPLAY.  Both are quarantined (or deleted with
 * delete_rejected) and counted, never admitted.  A forged batch does not
 * mark its (island, seq) taken, so it cannot make the island's own batch
 * of that number be refused; nor can an object merely named as a stale
 * batch (below the window, it is read and must verify to be dropped).
 *
 * SIGNED CURSOR.  A consumer whose ring holds a signing key (the trainer's:
 * a publisher key) signs its cursor (format 2) and takes only a cursor
 * signed by a publisher key of its ring: an unsigned or forged one is
 * FERRY_ERR_DOCK_CURSOR.  A consumer with a ring but no signing key writes
 * and takes an unsigned cursor (a store writer can rewrite it: give the
 * trainer's ring its key).  Whatever the keys, a handle never silently
 * starts over: when the cursor it held is gone, or has been replaced by one
 * that lost something it recorded (an older copy put back), its take fails
 * with FERRY_ERR_DOCK_ROLLBACK and consumes nothing until the cursor is
 * restored.  A new handle knows that history only if told: give it
 * resume_commits (from ferry_dock_stats.cursor_commits, saved with the
 * trainer's checkpoint); with 0, a missing cursor starts a new record.
 *
 * THREADS.  A dock handle is not thread-safe: use one per thread (they may
 * share one ferry_store, which is).  Any number of producers, in any number
 * of processes, may put concurrently.  Give each run one consumer at a time;
 * a second one is detected through the cursor's compare-and-swap and cannot
 * make a batch be consumed twice on stores where CAS is atomic (file://,
 * S3, MinIO), but on stores that ignore conditional writes (s3rver) two
 * live consumers of one run can each take the same batch.
 *
 * Conventions (those of ferry.h): 0 or a FERRY_ERR_* code,
 * ferry_last_error() names the run, key and field; handles are opaque and
 * *_free accepts NULL; every byte read from the store is validated.
 */
#ifndef FERRY_DOCK_H
#define FERRY_DOCK_H

#include "ferry_sign.h"
#include "ferry_store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Errors 100..119 (FERRY_ERR_DOCK_*): listed, with their
 * messages and meanings, in ferry_errors.h (included through ferry.h).
 * ====================================================================== */

#define FERRY_DOCK_RUN_MAX 64          /* bytes of a run id */
#define FERRY_DOCK_HEADER_SIZE 128     /* bytes before the payload */
#define FERRY_DOCK_SIG_SIZE 72         /* bytes after the payload of a signed batch */
#define FERRY_DOCK_FORMAT 1            /* header format written by this build */
#define FERRY_DOCK_KEY_MAX 160         /* buffer for a batch key, NUL included */
#define FERRY_DOCK_HIST 32             /* staleness histogram buckets */
#define FERRY_DOCK_MAX_ISLANDS 16384   /* distinct island ids one cursor tracks */
#define FERRY_DOCK_MAX_RANGES 32       /* disjoint seq ranges per island in the cursor */

/* Roles (ferry_dock_options.role). */
enum { FERRY_DOCK_PRODUCER = 0, FERRY_DOCK_CONSUMER = 1 };

/* Policies (ferry_dock_policy.mode). */
enum { FERRY_DOCK_SEQUENTIAL = 1, FERRY_DOCK_ASYNC = 2 };

typedef struct ferry_dock_policy {
    int mode;                /* FERRY_DOCK_SEQUENTIAL or FERRY_DOCK_ASYNC */
    uint64_t max_staleness;  /* ASYNC: S, admit iff T - v <= S (0: only v == T) */
} ferry_dock_policy;

/* What happened to an object that take did not return (event kinds). */
enum {
    FERRY_DOCK_EV_DROPPED = 1,   /* stale under the policy: counted, deleted */
    FERRY_DOCK_EV_DUPLICATE = 2, /* (island, seq) already consumed or dropped: deleted */
    FERRY_DOCK_EV_REJECTED = 3,  /* corrupt, foreign, misplaced or future: quarantined */
    FERRY_DOCK_EV_GAP = 4,       /* the cursor ran out of ranges for an island and
                                    declared seq..seq+count-1 done without seeing them */
};

typedef struct ferry_dock_event {
    int kind;                /* FERRY_DOCK_EV_* */
    int code;                /* EV_REJECTED: the FERRY_ERR_DOCK_* reason; else 0 */
    const char *key;         /* the object (NULL for EV_GAP) */
    uint64_t version;        /* from the key (0 if the key does not parse) */
    uint32_t island;
    uint64_t seq;            /* EV_GAP: first seq of the gap */
    uint64_t count;          /* EV_GAP: number of seqs; else 1 */
    uint64_t trainer_version;
    const char *message;     /* EV_REJECTED: why, naming the field; else "" */
} ferry_dock_event;

/* Called from inside take / sweep, after the cursor has recorded the
 * outcome; the pointers are valid during the call only.  It must not call
 * back into the same dock handle. */
typedef void (*ferry_dock_event_fn)(void *user, const ferry_dock_event *ev);

/* Options.  Zero-initialize and set what you need; NULL = all defaults. */
typedef struct ferry_dock_options {
    int role;                   /* FERRY_DOCK_PRODUCER (default) or _CONSUMER */
    uint64_t max_payload;       /* bound on a batch's payload, both ways; 0 = 256 MiB.
                                   Should not exceed the store's max_object_size - 128 */
    uint32_t max_scan;          /* objects one pass of take may fetch, delete or
                                   quarantine besides those it admits; 0 = 256.
                                   Of those reads, one island's name may take
                                   max_scan / 8 (at least 8) a pass.  Also:
                                   resume_seq's reads of objects that are not
                                   the island's batches */
    uint32_t sweep_every;       /* a full listing of RUN/traj/ every this many
                                   takes (and at the first); 0 = 16 */
    int32_t corrupt_grace_ms;   /* a corrupt-looking object is rejected only when
                                   seen unchanged (same etag) again this much later:
                                   stores whose puts are not atomic (s3rver) show
                                   objects mid-write.  0 = default (file://: none,
                                   s3://: 2000), < 0 = none.  Meanwhile a listing
                                   that shows it unchanged does not read it again */
    uint32_t poll_ms;           /* first wait between passes of a blocking take
                                   (doubles up to 1 s); 0 = 20 */
    int delete_rejected;        /* 1: delete rejected objects instead of moving
                                   them to RUN/quarantine/ */
    int allow_version_regress;  /* 1: accept a trainer_version below one already
                                   used (a deliberate rewind); else
                                   FERRY_ERR_DOCK_REGRESSED */
    ferry_dock_event_fn on_event;
    void *event_user;
    const ferry_keys *keys;     /* optional (borrowed; must outlive the handle).
                                   A signing key: put signs every batch; a
                                   consumer signs its cursor (a publisher's
                                   key only).  Trusted keys (consumer):
                                   enrolled island keys, see SIGNATURES */
    uint64_t resume_commits;    /* consumer: the cursor's commit count when
                                   the trainer last checkpointed
                                   (ferry_dock_stats.cursor_commits); open
                                   refuses a cursor below it, or none, with
                                   FERRY_ERR_DOCK_ROLLBACK.  0 = no history
                                   (a missing cursor starts a new record) */
} ferry_dock_options;

/* One batch returned by take.  Read-only; released by ferry_dock_batches_free. */
typedef struct ferry_dock_batch {
    char run[FERRY_DOCK_RUN_MAX + 1];
    uint64_t version;        /* policy version that produced it */
    uint32_t island;
    uint64_t seq;
    uint64_t staleness;      /* trainer_version - version at admission */
    uint64_t put_time_ms;    /* producer's clock at put (ms since the epoch) */
    const void *payload;
    size_t size;             /* payload bytes */
    void *internal_;         /* owned buffer; do not touch */
} ferry_dock_batch;

/* Counters.  The first group is the run's, kept in the cursor, so it
 * survives a restart of the trainer; the second is this handle's work. */
typedef struct ferry_dock_stats {
    uint64_t admitted;        /* batches returned by take */
    uint64_t dropped_stale;   /* stale under the policy, deleted */
    uint64_t duplicates;      /* already consumed / dropped, deleted */
    uint64_t rejected_corrupt;/* codes MAGIC..CHECKSUM, KEY, MISPLACED */
    uint64_t rejected_run;    /* FERRY_ERR_DOCK_RUN */
    uint64_t rejected_future; /* FERRY_ERR_DOCK_FUTURE */
    uint64_t rejected_by_code[10]; /* [code - 100] for codes 100..109 */
    uint64_t gaps;            /* seqs declared done unseen (EV_GAP) */
    uint64_t staleness_hist[FERRY_DOCK_HIST]; /* admitted batches by T - v;
                                   the last bucket holds >= FERRY_DOCK_HIST-1 */
    /* this handle */
    uint64_t puts, put_bytes; /* batches / bytes (header included) put */
    uint64_t takes, passes;   /* take calls, listing passes */
    uint64_t lists, gets, deletes, quarantined, cursor_writes, cursor_conflicts;
    uint64_t delete_failures; /* left for a later pass */
    uint64_t deferred;        /* corrupt-looking objects left for their grace period */
    /* run-wide, kept in the cursor (consumers with enrolled keys) */
    uint64_t rejected_signature; /* FERRY_ERR_DOCK_SIGNATURE */
    uint64_t rejected_replay;    /* FERRY_ERR_DOCK_REPLAY */
    uint64_t cursor_commits;     /* the cursor's commit count (as of the last
                                    commit or open): save it with the trainer's
                                    checkpoint, give it back as resume_commits */
    /* this handle */
    uint64_t listed;          /* entries the store's listings returned */
    uint64_t junk_skipped;    /* listed objects judged before and unchanged
                                 since (same etag and size), left unread */
} ferry_dock_stats;

typedef struct ferry_dock ferry_dock;

/* Opens a dock of run `run` on store (borrowed: it must outlive the dock).
 * run: 1..FERRY_DOCK_RUN_MAX bytes of [A-Za-z0-9._-], not starting with
 * '.'.  A consumer reads RUN/dock/cursor here (absent: a fresh run, unless
 * resume_commits says otherwise).
 * Returns FERRY_ERR_ARG for a bad run id or option (an empty ring, or a
 * consumer ring whose signing key is an island's); FERRY_ERR_DOCK_CURSOR if
 * the cursor is malformed, belongs to another run or is not signed as the
 * ring requires (SIGNED CURSOR); FERRY_ERR_DOCK_ROLLBACK if it is absent or
 * below resume_commits; store errors. */
FERRY_API int ferry_dock_open(ferry_store *store, const char *run, const ferry_dock_options *opts,
                              ferry_dock **out);
FERRY_API void ferry_dock_free(ferry_dock *d);

/* Puts one batch: header + payload as one object under its key (replacing
 * any object there: a re-put after a crash is allowed).  Any role may put.
 * Sequence numbers are the island's: unique per (run, island) for distinct
 * batches, ideally consecutive (the cursor stores ranges).  A batch whose
 * (island, seq) the consumer already took or dropped is a duplicate and will
 * never be returned, whatever its content.
 * Returns FERRY_ERR_ARG (NULL payload with len > 0), FERRY_ERR_LIMIT
 * (len > max_payload), or the store's errors. */
FERRY_API int ferry_dock_put(ferry_dock *d, uint32_t island, uint64_t version, uint64_t seq,
                             const void *payload, size_t len);

/* For an island that restarts without its own record: the smallest seq above
 * every seq of this island still in the store or already in the consumer's
 * cursor (0 for an unknown island).  Object names are anyone's: a listed
 * object counts only if it is the island's batch (it decodes, its header
 * matches its key and, with a ring, it is signed by a key enrolled for the
 * island), highest seq first, reading at most max_scan that are not
 * (FERRY_ERR_LIMIT past that); the cursor counts only if believed (with a
 * ring, signed by a publisher key of the ring; else it is left out).
 * Lists RUN/traj/ once, reads, then reads the cursor (in that order, so a
 * batch consumed in between is not missed); meant for start-up, not for
 * every put.  Concurrent puts by the same island id make the answer
 * meaningless. */
FERRY_API int ferry_dock_resume_seq(ferry_dock *d, uint32_t island, uint64_t *next_seq);

/* Takes up to max_batches admissible batches (consumer role).
 * Each pass lists only the version prefixes the policy can admit (or, when
 * the window spans more than 16 versions, RUN/traj/ once), plus the
 * versions that left the window since the last take; every sweep_every
 * takes it lists all of RUN/traj/ to find stale stragglers and future
 * batches.  Batches are admitted in key order (oldest version first, then
 * island, then seq).  It commits its decisions to the cursor (CAS) before
 * returning, then deletes admitted, dropped and duplicate objects and
 * quarantines rejected ones.  Never returns the same (island, seq) twice,
 * over the life of the run.
 * Waits: passes repeat (poll_ms, doubling to 1 s) until max_batches are
 * taken or timeout_ms passes; timeout_ms = 0 makes one pass.  Returns
 * FERRY_OK with *n possibly 0 on timeout.  If the store fails after some
 * batches were committed, the call returns FERRY_OK with them (the failure
 * shows again at the next call).  With none, a transient failure (a
 * malformed listing, HTTP or network errors, a store timeout, a contended
 * cursor) is retried at the next pass while time remains, and returned if
 * the last pass failed; any other failure is returned at once.
 * *out (an array of *n batches, NULL when *n = 0) is released with
 * ferry_dock_batches_free.  max_batches = 0 does one housekeeping pass.
 * Returns FERRY_ERR_ARG (producer handle, bad policy), FERRY_ERR_DOCK_REGRESSED,
 * FERRY_ERR_DOCK_CONTENDED, FERRY_ERR_DOCK_CURSOR (the cursor was replaced by
 * a malformed or wrongly signed one), FERRY_ERR_DOCK_ROLLBACK (the cursor
 * this handle held is gone or went backwards: nothing consumed),
 * FERRY_ERR_LIMIT (more than FERRY_DOCK_MAX_ISLANDS islands), store errors. */
FERRY_API int ferry_dock_take(ferry_dock *d, const ferry_dock_policy *p, uint64_t trainer_version,
                              size_t max_batches, uint32_t timeout_ms, ferry_dock_batch **out,
                              size_t *n);
FERRY_API void ferry_dock_batches_free(ferry_dock_batch *b, size_t n);

/* One housekeeping pass over all of RUN/traj/ (consumer role): drops the
 * stale, rejects the future (ASYNC), deletes duplicates; admits nothing.  Useful at
 * the end of a run, before checking that the store is empty. */
FERRY_API int ferry_dock_sweep(ferry_dock *d, const ferry_dock_policy *p, uint64_t trainer_version);

/* The counters (run-wide ones as of the last commit or open). */
FERRY_API void ferry_dock_get_stats(const ferry_dock *d, ferry_dock_stats *out);

/* ======================================================================
 * The wire format, for tools and tests (no I/O).
 * ====================================================================== */

/* Header fields of a decoded batch; payload points into the decoded buffer. */
typedef struct ferry_dock_header {
    char run[FERRY_DOCK_RUN_MAX + 1];
    uint64_t version, seq, put_time_ms;
    uint32_t island;
    const void *payload;
    uint64_t size;
    const void *signature;   /* FERRY_DOCK_SIG_SIZE bytes (key id, Ed25519
                                signature) after the payload; NULL if unsigned */
} ferry_dock_header;

/* Checks a run id: 0 or FERRY_ERR_ARG. */
FERRY_API int ferry_dock_run_check(const char *run);

/* The key of a batch: "RUN/traj/vV/iI-sS" into buf (FERRY_DOCK_KEY_MAX
 * bytes are always enough).  FERRY_ERR_ARG for a bad run id. */
FERRY_API int ferry_dock_key(const char *run, uint64_t version, uint32_t island, uint64_t seq,
                             char buf[FERRY_DOCK_KEY_MAX]);
/* Parses a batch key of run `run`: FERRY_ERR_DOCK_KEY unless it is exactly
 * what ferry_dock_key makes. */
FERRY_API int ferry_dock_key_parse(const char *run, const char *key, uint64_t *version,
                                   uint32_t *island, uint64_t *seq);

/* Encodes header + payload into a new buffer (ferry_free it).
 * put_time_ms is stored as given. */
FERRY_API int ferry_dock_encode(const char *run, uint64_t version, uint32_t island, uint64_t seq,
                                uint64_t put_time_ms, const void *payload, size_t len,
                                void **out, size_t *out_size);

/* Validates size bytes as a batch: MAGIC, FORMAT, TRUNCATED, LENGTH (payload
 * over max_payload, 0 = 256 MiB, or trailing bytes other than a signed
 * batch's signature), HEADER, CHECKSUM, in
 * that order, then RUN if run is not NULL and differs.  Allocates nothing;
 * h->payload points into data. */
FERRY_API int ferry_dock_decode(const void *data, size_t size, uint64_t max_payload,
                                const char *run, ferry_dock_header *h);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_DOCK_H */
