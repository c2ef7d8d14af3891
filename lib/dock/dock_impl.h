/* Internals of the trajectory dock (lib/dock).  Not part of the public API.
 *
 *   dock_wire.c    run ids, keys, the batch header (no I/O)
 *   dock_cursor.c  the consumer's record of resolved (island, seq) ranges
 *                  and counters, and its on-store form (no I/O)
 *   dock.c         handles, put, resume_seq, cursor load, stats
 *   dock_take.c    take / sweep: listing, classification, commit, cleanup
 *   dock_memo.c    objects judged and left in place, by key, etag and size
 */
#ifndef FERRY_DOCK_IMPL_H
#define FERRY_DOCK_IMPL_H

#include "common.h"
#include "ferry_dock.h"

#define DK_DEFAULT_MAX_PAYLOAD (256ull << 20)
#define DK_DEFAULT_MAX_SCAN 256u
#define DK_DEFAULT_SWEEP_EVERY 16u
#define DK_DEFAULT_POLL_MS 20u
#define DK_DEFAULT_S3_GRACE_MS 2000
#define DK_MAX_POLL_MS 1000u
/* A window (or a set of versions that left it) wider than this is read
 * with one listing of RUN/traj/ instead of one listing per version. */
#define DK_MAX_VERSION_LISTS 16u
/* Reads that admit nothing one island may spend in a pass: max_scan / 8,
 * at least this (dock_take.c, "each island's share"). */
#define DK_MIN_SHARE 8u
/* Cursor CAS attempts per commit before FERRY_ERR_DOCK_CONTENDED. */
#define DK_COMMIT_ATTEMPTS 8
/* Slots of the memory of objects judged and left in place (dock_memo.c);
 * it holds at most half as many. */
#define DK_MEMO_SLOTS 65536u

/* ---- counters kept in the cursor (their order is the cursor format) ---- */
enum {
    DK_C_ADMITTED = 0,
    DK_C_DROPPED,
    DK_C_DUPLICATES,
    DK_C_GAPS,
    DK_C_REJ0,                         /* 10 counters: codes 100..109 */
    DK_C_HIST0 = DK_C_REJ0 + 10,       /* FERRY_DOCK_HIST counters */
    DK_C_SIGNATURE = DK_C_HIST0 + FERRY_DOCK_HIST, /* FERRY_ERR_DOCK_SIGNATURE */
    DK_C_REPLAY,                       /* FERRY_ERR_DOCK_REPLAY */
    DK_C_COUNT,
    DK_C_COUNT_V1 = DK_C_SIGNATURE     /* cursors written before signatures */
};

/* The counter of a rejection code. */
static inline int dk_rej_counter(int code)
{
    if (code == FERRY_ERR_DOCK_SIGNATURE) return DK_C_SIGNATURE;
    if (code == FERRY_ERR_DOCK_REPLAY) return DK_C_REPLAY;
    return DK_C_REJ0 + (code - FERRY_ERR_DOCK_MAGIC);
}

/* The largest cursor ferry__dock_cursor_decode accepts (every island, every range,
 * every counter): reads of the cursor are bounded by it, so a planted
 * object cannot make the trainer download more than this. */
#define DK_CURSOR_MAX_BYTES (104u + 8u * DK_C_COUNT + (size_t)FERRY_DOCK_MAX_ISLANDS * (8u + 16u * FERRY_DOCK_MAX_RANGES) + 16u + 72u)
#define DK_FLAG_SIGNED 1u /* header flags: a signature follows the payload */
#define DK_REJ_CODES 10

/* ---- the consumer's record ---- */

/* Seqs lo..hi (inclusive) are resolved: admitted or dropped. */
typedef struct dk_range {
    uint64_t lo, hi;
} dk_range;

/* Ranges sorted, disjoint and never adjacent (adjacent ones are merged), so
 * an island that numbers its batches 0, 1, 2, ... needs exactly one. */
typedef struct dk_island {
    uint32_t id, n;
    dk_range r[FERRY_DOCK_MAX_RANGES];
} dk_island;

typedef struct dk_state {
    uint64_t counters[DK_C_COUNT];
    uint64_t top_tv;   /* highest trainer_version committed + 1; 0 = none */
    uint64_t commits;  /* cursor writes so far (makes every cursor unique) */
    size_t n_islands, cap;
    dk_island *islands; /* sorted by id */
} dk_state;

void ferry__dock_state_release(dk_state *s);
int ferry__dock_state_clone(const dk_state *src, dk_state *dst);
bool ferry__dock_state_has(const dk_state *s, uint32_t island, uint64_t seq);
/* Largest resolved seq of island; false if the island has none. */
bool ferry__dock_state_max_seq(const dk_state *s, uint32_t island, uint64_t *seq);
/* Whether `now` holds everything `held` held: a cursor only grows (ranges
 * are added or merged, counters and the trainer version only go up).  On
 * false, why (cap bytes) names the first thing lost. */
bool ferry__dock_state_covers(const dk_state *now, const dk_state *held, char *why, size_t cap);
/* Records (island, seq) as resolved.  *fresh = 0 if it already was.  When
 * the island would need more than FERRY_DOCK_MAX_RANGES ranges, the two
 * closest are merged and the seqs between them are reported as a gap
 * (*gap_n > 0, first *gap_lo).  FERRY_ERR_LIMIT past FERRY_DOCK_MAX_ISLANDS. */
int ferry__dock_state_mark(dk_state *s, uint32_t island, uint64_t seq, int *fresh, uint64_t *gap_lo,
                  uint64_t *gap_n);

/* Cursor object <-> state.  The writer nonce makes the bytes unique per
 * handle, as the store's CAS wants (docs/STORE.md).  encode signs (format
 * 2) when k holds a signing key.  decode parses either format, checking no
 * signature: *sig = the 72-byte signature of a format-2 cursor, over its
 * first size - 72 bytes (NULL for format 1); ferry__dock_cursor_trust
 * judges it. */
int ferry__dock_cursor_encode(const dk_state *s, const char *run, uint64_t nonce, const ferry_keys *k, ferry_buf *out);
int ferry__dock_cursor_decode(const void *data, size_t size, const char *run, dk_state *out, const uint8_t **sig);

/* ---- wire helpers ---- */
/* ferry_dock_encode, signing with keys' signing key when it has one. */
int ferry__dock_encode(const char *run, uint64_t version, uint32_t island, uint64_t seq, uint64_t put_time_ms,
              const void *payload, size_t len, const ferry_keys *keys, void **out, size_t *out_size);
/* With a ring: the batch (data, decoded into h) must be signed by a key
 * enrolled for its island, else FERRY_ERR_DOCK_SIGNATURE naming why.  No
 * ring: FERRY_OK. */
int ferry__dock_batch_verify(const ferry_keys *k, const char *key, const void *data, const ferry_dock_header *h);
/* "RUN/traj/" and "RUN/traj/vVVV…/" (the listing prefix of one version). */
void ferry__dock_traj_prefix(const char *run, char buf[FERRY_DOCK_KEY_MAX]);
void ferry__dock_version_prefix(const char *run, uint64_t version, char buf[FERRY_DOCK_KEY_MAX]);
/* Short name of a rejection code ("checksum"), for quarantine keys. */
const char *ferry__dock_reason_name(int code);
/* The rejection codes an object's content can earn (100..105). */
static inline bool dk_is_content_code(int code)
{
    return code >= FERRY_ERR_DOCK_MAGIC && code <= FERRY_ERR_DOCK_CHECKSUM;
}

/* ---- objects judged and left in place (dock_memo.c) ---- */
typedef struct dk_seen {
    uint64_t key_h;    /* seeded hash of the key; 0 = empty slot */
    uint64_t etag_h;   /* seeded hash of the etag (and size) when judged */
    uint64_t size;
    uint64_t first_ms; /* monotonic: first seen failing, unchanged since */
} dk_seen;

typedef struct dk_memo {
    dk_seen *slot;     /* DK_MEMO_SLOTS, allocated at first use */
    size_t used;
    uint64_t seed;
} dk_memo;

void ferry__dock_memo_release(dk_memo *m);
/* The entry of key, or NULL. */
dk_seen *ferry__dock_memo_get(const dk_memo *m, const char *key);
/* Records key as judged now with st's etag and size (replacing what was
 * known of it); NULL only when out of memory. */
dk_seen *ferry__dock_memo_put(dk_memo *m, const char *key, const ferry_store_stat *st, uint64_t now_ms);
/* Whether st (a listing's or a read's) shows the object as it was judged. */
bool ferry__dock_memo_same(const dk_memo *m, const dk_seen *s, const ferry_store_stat *st);

/* ---- the handle ---- */

struct ferry_dock {
    ferry_store *store;
    char run[FERRY_DOCK_RUN_MAX + 1];
    char cursor_key[FERRY_DOCK_KEY_MAX];
    ferry_dock_options o;     /* defaults resolved */
    int32_t grace_ms;         /* resolved: 0 = none */
    uint64_t nonce;

    /* consumer */
    dk_state st;              /* as of the last commit / load */
    int have_cursor;          /* the cursor object exists (CAS expects etag) */
    char etag[FERRY_STORE_ETAG_MAX];
    int sweep_due;
    uint32_t takes_since_sweep;
    int have_last_lo;
    uint64_t last_lo;         /* lowest admissible version at the last pass */
    dk_memo suspects;         /* corrupt-looking objects in their grace period */

    ferry_dock_stats work;    /* this handle's work counters */
};

/* Reads RUN/dock/cursor into d->st (absent: an empty state). */
int ferry__dock_load_cursor(ferry_dock *d);
uint64_t ferry__dock_wall_ms(void);      /* since the epoch */

#endif
