/* The subscriber handle, shared by subscriber.c (open, target, retries,
 * wait) and steps.c (executing a path, committing the result). */
#ifndef FERRY_SYNC_SUB_H
#define FERRY_SYNC_SUB_H

#include "sync_impl.h"
#include "codec/undo.h"

#include <pthread.h>

enum { SUB_FILE = 1, SUB_MEMORY = 2, SUB_PRIVATE = 3 };

#define SUB_CACHE 64   /* manifests kept (they are immutable) */
#define SUB_BAD 64     /* rejected object keys remembered */

struct ferry_subscriber {
    ferry_store *st;
    char run[FERRY_SYNC_RUN_MAX + 1];
    int mode;
    char *path;                 /* file mode */
    char *tmp_dir;
    ferry_model *user;          /* memory mode: the caller's model */
    ferry_model *own;           /* file mode: PATH mapped; private mode: the model */
    bool own_owned;             /* free `own` with the handle (not when adopted borrowed) */
    bool own_writable;          /* `own` may be patched in place */
    fs_state cur;               /* what user/own holds (version 0 = none) */
    char pin[FS_ID_CAP];        /* the run id pinned (option, PATH's state, or
                                   the first version synced); "" = none */
    bool cur_unchecked;         /* memory mode: claimed by the caller, not yet compared */
    bool cur_off_lineage;       /* cur is not on HEAD's lineage: no chain from it */
    uint64_t max_head;          /* highest version verified and applied (a HEAD
                                   below it is refused).  Not the highest HEAD
                                   merely read: one absurd HEAD (2^63 - 2 written
                                   by hand) must not wedge the subscriber after
                                   HEAD is restored. */
    int threads;
    unsigned concurrency;       /* ranged GETs per anchor download */
    uint64_t chunk_size;
    uint32_t poll_ms, max_attempts;
    int no_compactions;
    const ferry_keys *keys;     /* borrowed; enforcing when it trusts a key */
    fs_count cnt;
    ferry_subscriber_stats stats;
    fs_manifest cache[SUB_CACHE];
    size_t ncache, cache_next;
    char bad[SUB_BAD][FS_KEY_CAP];
    size_t nbad, bad_next;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool woken;
    /* when the last ferry_subscriber_wait returned on a new HEAD
       (ferry__mono_ms; single store only; 0 = none to reuse): that HEAD,
       poll_head[0], is reused by the next sync if read less than poll_ms
       ago */
    uint64_t polled_ms;
    /* per store of the list (home first): the HEAD the last wait poll read
       and its etag ("" : none), for the next poll's conditional GET */
    fs_head poll_head[FERRY_SYNC_STORES_MAX];
    char poll_etag[FERRY_SYNC_STORES_MAX][FERRY_STORE_ETAG_MAX];
    /* store list (sub_stores.c): further stores in order of preference;
       home is the first (st is the one a sync runs on, any of them) */
    ferry_store *home;
    ferry_store *alt[FERRY_SYNC_STORES_MAX - 1];
    size_t nalt;
    unsigned used;              /* which one served the last sync */
    unsigned refetched;         /* objects of the last sync taken from another store */
    /* change lists of the last sync (changes.c): per tensor of the model
       held, or chg_all (every tensor whole); none listed = nothing changed */
    struct sub_chg *chg;
    size_t nchg;
    bool chg_all;
    ferry__codec_undo **chg_rec; /* the committed route's records, until the
                                    lists are built from them */
    size_t chg_nrec;
};

/* The words one tensor changed in the last sync (ferry_subscriber_changes). */
typedef struct sub_chg {
    bool all;        /* replaced whole, or more changes than the list budget */
    bool unsorted;   /* while built */
    int64_t *pos;    /* n element positions, ascending */
    uint8_t *vals;   /* their n new values */
    size_t n;
} sub_chg;

/* The model a sync is building: it starts as what the subscriber holds
 * and moves one verified version per step. */
typedef struct sub_work {
    ferry_model *m;
    bool owned;     /* created by this sync: freed when replaced */
    bool held;      /* is the subscriber's exposed model (patched in place) */
    bool writable;  /* in-place apply allowed */
    char *staged;   /* file mode: m is mapped from this downloaded anchor, unchanged */
    fs_state st;
    /* What each step applied in place to the exposed model overwrote,
       oldest first: a sync that fails puts that model back to the version
       it held when the sync began (ferry__sync_sub_work_undo), not to the
       last version a step reached. */
    ferry__codec_undo **undo;
    size_t nundo;
} sub_work;

/* Runs one sync (subscriber.c's sync_run) on each store of the list in
 * turn until one succeeds or fails in a way another store cannot help
 * (sub_stores.c). */
typedef int (*sub_sync_fn)(ferry_subscriber *s, int mode, uint64_t version, ferry_sync_info *info);
int ferry__sync_sub_sync_stores(ferry_subscriber *s, int mode, uint64_t version, ferry_sync_info *info, sub_sync_fn fn);
/* HEAD for ferry_subscriber_wait: from the first store of the list that
 * answers (NOT_FOUND counts as an answer). */
int ferry__sync_sub_head_poll(ferry_subscriber *s, fs_head *h);

/* Manifest through the cache; cache_put adds a verified one (HEAD's copy). */
int ferry__sync_sub_manifest(ferry_subscriber *s, uint64_t version, const char *id, fs_manifest *out);
void ferry__sync_sub_cache_put(ferry_subscriber *s, const fs_manifest *m);
/* Executes one plan; on an object-level failure *badkey names the object
 * (empty if the failure was that the start is not on the lineage, which
 * sets *off_lineage). */
int ferry__sync_sub_exec(ferry_subscriber *s, sub_work *w, const fs_plan *p, const fs_manifest *target, const fs_compaction *comps,
             char badkey[FS_KEY_CAP], bool *off_lineage, uint32_t *steps);
/* Makes w the subscriber's version (file: written and renamed; memory:
 * copied into the caller's buffers if the structure matches). */
int ferry__sync_sub_commit(ferry_subscriber *s, sub_work *w);
/* The change lists: dropped (before a sync: nothing changed yet), and set
 * from a committed sync (w NULL, or not applied in place: all whole; else
 * w's undo records are taken, for lists built when first asked for). */
void ferry__sync_sub_changes_clear(ferry_subscriber *s);
void ferry__sync_sub_changes_set(ferry_subscriber *s, sub_work *w);
/* Frees what the sync created and did not commit. */
void ferry__sync_sub_work_release(ferry_subscriber *s, sub_work *w);
/* After a failed sync: reverts the steps applied in place to the exposed
 * model, newest first, and makes start (what it held before) the
 * subscriber's version again. */
void ferry__sync_sub_work_undo(ferry_subscriber *s, sub_work *w, const fs_state *start, bool start_off_lineage);

#endif
