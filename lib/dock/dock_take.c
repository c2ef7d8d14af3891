/* take and sweep: one "pass" lists the versions a policy can admit (plus
 * those that just left its window, or everything at a sweep), classifies
 * each object, commits the outcome to the cursor with compare-and-swap, and
 * only then deletes what was consumed, dropped or found twice and moves
 * rejected objects to RUN/quarantine/.
 *
 * Why this order: the cursor is the only record of what was consumed.
 * Committing before deleting means a crash in between leaves objects whose
 * (island, seq) the cursor already holds: the next pass deletes them as
 * duplicates.  Deleting first could lose a batch that was never recorded;
 * returning before the commit could hand a batch out twice. */
#include "dock_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "xxh.h"
#include "sign/sig.h"

enum { IT_ADMIT = 1, IT_DROP, IT_DUP, IT_REJECT };

typedef struct dk_item {
    char *key;
    int want;            /* decided against the state at classification */
    int kind;            /* after the commit: ADMIT / DROP may turn into DUP */
    int code;            /* IT_REJECT: FERRY_ERR_DOCK_* */
    uint64_t version, seq; /* from the key (0 if it does not parse) */
    uint32_t island;
    uint8_t *buf;        /* IT_ADMIT: the object; payload at +128 */
    ferry_dock_header h; /* IT_ADMIT */
    char *msg;           /* IT_REJECT */
} dk_item;

typedef struct dk_items {
    dk_item *v;
    size_t n, cap;
} dk_items;

typedef struct dk_gap {
    uint32_t island;
    uint64_t lo, n;
} dk_gap;

typedef struct dk_gaps {
    dk_gap *v;
    size_t n, cap;
} dk_gaps;

static void items_release(dk_items *it)
{
    for (size_t i = 0; i < it->n; i++) {
        free(it->v[i].key);
        free(it->v[i].msg);
        ferry_free(it->v[i].buf);
    }
    free(it->v);
    memset(it, 0, sizeof *it);
}

static dk_item *items_add(dk_items *it, const char *key, int want)
{
    if (ferry__grow((void **)&it->v, &it->cap, it->n + 1, sizeof *it->v)) return NULL;
    char *k = ferry__strdup(key);
    if (!k) return NULL;
    dk_item *x = &it->v[it->n++];
    memset(x, 0, sizeof *x);
    x->key = k;
    x->want = x->kind = want;
    return x;
}

/* ---- the (island, seq) pairs this pass has already picked ------------- */
typedef struct dk_pairs {
    uint64_t *slot; /* (seq, island+1) pairs; island+1 == 0 marks empty */
    size_t mask;
} dk_pairs;

static int pairs_init(dk_pairs *p, size_t expect)
{
    size_t cap = 64;
    while (cap < expect * 2 && cap < ((size_t)1 << 40)) cap *= 2;
    p->slot = ferry__calloc(cap, 2 * sizeof(uint64_t));
    p->mask = cap - 1;
    return p->slot ? FERRY_OK : FERRY_ERR_NOMEM;
}

/* The slot holding (island, seq), or the empty slot where it would go.
 * Pairs are added only for objects admitted or dropped, at most
 * want + max_scan per pass, and the table has twice that many slots, so an
 * empty slot always ends the probe. */
static uint64_t *pairs_slot(dk_pairs *p, uint32_t island, uint64_t seq)
{
    uint64_t h = XXH3_64bits_withSeed(&seq, sizeof seq, island);
    for (size_t i = (size_t)h & p->mask;; i = (i + 1) & p->mask) {
        uint64_t *s = &p->slot[2 * i];
        if (!s[1] || (s[0] == seq && s[1] == (uint64_t)island + 1)) return s;
    }
}

static bool pairs_has(dk_pairs *p, uint32_t island, uint64_t seq)
{
    return pairs_slot(p, island, seq)[1] != 0;
}

/* Adds (island, seq); returns false if it was there. */
static bool pairs_add(dk_pairs *p, uint32_t island, uint64_t seq)
{
    uint64_t *s = pairs_slot(p, island, seq);
    if (s[1]) return false;
    s[0] = seq;
    s[1] = (uint64_t)island + 1;
    return true;
}

/* ---- helpers ---------------------------------------------------------- */
static void window(const ferry_dock_policy *p, uint64_t tv, uint64_t *lo)
{
    if (p->mode == FERRY_DOCK_SEQUENTIAL) *lo = tv;
    else *lo = tv > p->max_staleness ? tv - p->max_staleness : 0;
}

static void emit(ferry_dock *d, int kind, int code, const char *key, uint64_t version,
                 uint32_t island, uint64_t seq, uint64_t count, uint64_t tv, const char *msg)
{
    if (!d->o.on_event) return;
    ferry_dock_event ev = {kind, code, key, version, island, seq, count, tv, msg ? msg : ""};
    d->o.on_event(d->o.event_user, &ev);
}

/* Grace period for stores whose puts are not atomic: an object that fails
 * to decode may be one an island is still writing.  It is rejected only
 * once it has been seen failing, unchanged (same etag and size), for
 * grace_ms.  Returns true to leave it for now (st: of the bytes read). */
static bool grace_defer(ferry_dock *d, const char *key, const ferry_store_stat *st)
{
    if (!d->grace_ms) return false;
    uint64_t now = ferry__mono_ms();
    dk_seen *s = ferry__dock_memo_get(&d->suspects, key);
    if (s && ferry__dock_memo_same(&d->suspects, s, st)) return now - s->first_ms < (uint64_t)d->grace_ms;
    /* first seen failing, or changed since: the grace period starts now
     * (no memory to remember it: rejected now) */
    return ferry__dock_memo_put(&d->suspects, key, st, now) != NULL;
}

/* Whether the listed object e is one grace_defer left, that the listing
 * shows unchanged and whose grace period is not over: then it is left
 * unread, spending nothing, and counted in junk_skipped. */
static bool grace_skip(ferry_dock *d, const ferry_store_entry *e)
{
    if (!d->grace_ms) return false;
    const dk_seen *s = ferry__dock_memo_get(&d->suspects, e->key);
    if (!s || !ferry__dock_memo_same(&d->suspects, s, &e->stat) || ferry__mono_ms() - s->first_ms >= (uint64_t)d->grace_ms)
        return false;
    d->work.junk_skipped++;
    return true;
}

/* RUN/quarantine/REASON/<the key below RUN/traj/>, or a hash of the key
 * when that would not be a valid key. */
static void quarantine_key(const ferry_dock *d, const char *key, int code, char *q, size_t cap)
{
    char traj[FERRY_DOCK_KEY_MAX];
    ferry__dock_traj_prefix(d->run, traj);
    size_t tl = strlen(traj);
    const char *tail = strncmp(key, traj, tl) ? key : key + tl;
    int n = snprintf(q, cap, "%s/quarantine/%s/%s", d->run, ferry__dock_reason_name(code), tail);
    if (n < 0 || (size_t)n >= cap || ferry_store_key_check(q))
        snprintf(q, cap, "%s/quarantine/%s/h%016" PRIx64, d->run, ferry__dock_reason_name(code),
                 (uint64_t)XXH3_64bits(key, strlen(key)));
}

/* ---- classification --------------------------------------------------- */
/* ---- each island's share of a pass's reads ------------------------------ */
/* Reads that admit nothing are counted per island (names that are not batch
 * keys share one count); once an island has spent its share, the rest of
 * its objects wait for a later pass.  So objects planted under one name
 * cannot use up a pass's budget ahead of the other islands' batches: 20 000
 * of them ahead in key order kept every good batch out for 78 passes, each
 * reading 256 of them (issue 23 item 10). */
typedef struct dk_shares {
    uint64_t *id;    /* island + 2; 1 = names that are not batch keys; 0 = empty */
    uint32_t *spent;
    size_t mask;
    uint32_t cap;    /* reads one share may spend in a pass */
} dk_shares;

#define DK_SHARE_NAMES 1u
static uint64_t share_of(uint32_t island) { return (uint64_t)island + 2; }

/* Every read that admits nothing spends budget, so at most max_scan + 1
 * shares are ever spent from: twice that many slots always hold them. */
static int shares_init(dk_shares *sh, uint32_t max_scan)
{
    size_t cap = 16;
    while (cap < 2 * ((size_t)max_scan + 1)) cap *= 2;
    sh->id = ferry__calloc(cap, sizeof *sh->id);
    sh->spent = ferry__calloc(cap, sizeof *sh->spent);
    sh->mask = cap - 1;
    sh->cap = max_scan / 8 > DK_MIN_SHARE ? max_scan / 8 : DK_MIN_SHARE;
    return sh->id && sh->spent ? FERRY_OK : FERRY_ERR_NOMEM;
}

static void shares_release(dk_shares *sh)
{
    free(sh->id);
    free(sh->spent);
}

static uint32_t *share_slot(dk_shares *sh, uint64_t who)
{
    for (size_t i = (size_t)XXH3_64bits(&who, sizeof who) & sh->mask;; i = (i + 1) & sh->mask) {
        if (sh->id[i] == who) return &sh->spent[i];
        if (!sh->id[i]) {
            sh->id[i] = who;
            return &sh->spent[i];
        }
    }
}

typedef struct dk_pass {
    ferry_dock *d;
    uint64_t tv, lo, hi;
    bool sequential; /* versions above the window are left, not "future" */
    size_t want, admitted;
    uint32_t budget;
    bool budget_hit; /* objects were left for lack of budget or share */
    dk_items items;
    dk_pairs picked;
    dk_shares shares;
} dk_pass;

/* Whether `who` may still read in this pass; if not, what it left waits. */
static bool share_left(dk_pass *ps, uint64_t who)
{
    if (*share_slot(&ps->shares, who) < ps->shares.cap) return true;
    ps->budget_hit = true;
    return false;
}

static void share_spend(dk_pass *ps, uint64_t who) { (*share_slot(&ps->shares, who))++; }

/* Records a rejection.  With the object's bytes, they are copied to the
 * quarantine now (before the commit, so the bytes need not be held);
 * if that copy fails the object is left alone and the error returned. */
static int reject(dk_pass *ps, const char *key, int code, uint64_t v, uint32_t isl, uint64_t s,
                  uint8_t *buf, size_t size)
{
    ferry_dock *d = ps->d;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ferry_last_error());
    if (buf && !d->o.delete_rejected) {
        char q[FERRY_STORE_KEY_MAX + 1];
        quarantine_key(d, key, code, q, sizeof q);
        int rc = ferry_store_put(d->store, q, buf, size, NULL);
        ferry_free(buf);
        if (rc) return ferry__context(rc, "dock '%s': quarantining %s as %s", d->run, key, q);
        d->work.quarantined++;
    } else {
        ferry_free(buf);
    }
    dk_item *x = items_add(&ps->items, key, IT_REJECT);
    if (!x) return FERRY_ERR_NOMEM;
    x->code = code;
    x->version = v, x->island = isl, x->seq = s;
    x->msg = ferry__strdup(msg);
    return x->msg ? FERRY_OK : FERRY_ERR_NOMEM;
}

/* Fetches and judges one object.  *admitted is set when it becomes an
 * IT_ADMIT item.  Returns a store error only (the pass stops there). */
/* With enrolled keys: the batch must be signed by a key enrolled for its
 * island (FERRY_ERR_DOCK_SIGNATURE naming why), and, when its (island,
 * seq) is already resolved, it is a replay. */
static int judge_signature(dk_pass *ps, const char *key, const uint8_t *data, const ferry_dock_header *h, bool replay)
{
    int rc = ferry__dock_batch_verify(ps->d->o.keys, key, data, h);
    if (rc) return rc;
    if (replay)
        return ferry__fail(FERRY_ERR_DOCK_REPLAY, "%s: island %" PRIu32 " seq %" PRIu64 " was already taken or dropped: a replay",
                           key, h->island, h->seq);
    return FERRY_OK;
}

/* An object dropped or found twice, decided without (or after) a read. */
static int add_resolved(dk_pass *ps, const char *key, int want, uint64_t v, uint32_t isl, uint64_t s)
{
    dk_item *x = items_add(&ps->items, key, want);
    if (!x) return FERRY_ERR_NOMEM;
    x->version = v, x->island = isl, x->seq = s;
    return FERRY_OK;
}

/* What a read is for (fetch). */
enum {
    FETCH_ADMIT,  /* a candidate (or, above the window, a future batch) */
    FETCH_REPLAY, /* (keys) its (island, seq) is resolved: a replay or a forgery */
    FETCH_STALE,  /* (keys) below the window: dropped only if it is the
                     island's own batch, else a forged name would mark a
                     seq the island has yet to use */
};

static int fetch(dk_pass *ps, const ferry_store_entry *e, bool key_ok, uint64_t v, uint32_t isl,
                 uint64_t s, int mode, bool *admitted)
{
    ferry_dock *d = ps->d;
    *admitted = false;
    if (e->stat.size > FERRY_DOCK_HEADER_SIZE + d->o.max_payload + FERRY_DOCK_SIG_SIZE) {
        /* Too large to read: judged on the listing's size and deleted,
         * not quarantined (copying it is what the bound forbids). */
        int code = key_ok ? FERRY_ERR_DOCK_LENGTH : FERRY_ERR_DOCK_KEY;
        ferry__fail(code, "%s: %" PRIu64 " bytes, over max_payload %" PRIu64 " + header%s", e->key,
                    e->stat.size, d->o.max_payload, key_ok ? "" : ", and not a batch key");
        return reject(ps, e->key, code, v, isl, s, NULL, 0);
    }
    void *data = NULL;
    size_t size = 0;
    ferry_store_stat st;
    /* bounded by what a valid batch can be, whatever the listing said (a
     * batch rewritten larger after the listing is cut off, not read) */
    int rc = ferry_store_get_max(d->store, e->key, FERRY_DOCK_HEADER_SIZE + d->o.max_payload + FERRY_DOCK_SIG_SIZE, &data,
                                 &size, &st);
    d->work.gets++;
    if (rc == FERRY_ERR_STORE_NOT_FOUND) return FERRY_OK; /* deleted since the listing */
    if (rc == FERRY_ERR_LIMIT) {
        ferry__context(FERRY_ERR_DOCK_LENGTH, "%s", e->key);
        return reject(ps, e->key, FERRY_ERR_DOCK_LENGTH, v, isl, s, NULL, 0);
    }
    if (rc) return ferry__context(rc, "dock '%s': reading %s", d->run, e->key);
    ferry_dock_header h;
    int code;
    if (!key_ok) { /* whatever it holds, it has no place here */
        code = ferry__fail(FERRY_ERR_DOCK_KEY, "%s: not a batch key of run '%s'", e->key, d->run);
        return reject(ps, e->key, code, 0, 0, 0, data, size);
    }
    code = ferry_dock_decode(data, size, d->o.max_payload, d->run, &h);
    if (dk_is_content_code(code) && grace_defer(d, e->key, &st)) {
        d->work.deferred++;
        ferry_free(data);
        return FERRY_OK;
    }
    if (!code && (h.version != v || h.island != isl || h.seq != s))
        code = ferry__fail(FERRY_ERR_DOCK_MISPLACED, "%s: header says version %" PRIu64 ", island %" PRIu32 ", seq %" PRIu64,
                           e->key, h.version, h.island, h.seq);
    if (!code) code = judge_signature(ps, e->key, data, &h, mode == FETCH_REPLAY);
    if (!code && v > ps->hi)
        code = ferry__fail(FERRY_ERR_DOCK_FUTURE, "%s: batch of version %" PRIu64 " > trainer version %" PRIu64
                           " (a version counter went wrong)", e->key, v, ps->tv);
    if (code) {
        if (code == FERRY_ERR_DOCK_RUN || dk_is_content_code(code)) ferry__context(code, "%s", e->key);
        return reject(ps, e->key, code, v, isl, s, data, size);
    }
    if (mode == FETCH_STALE) { /* the island's own: dropped */
        ferry_free(data);
        return add_resolved(ps, e->key, pairs_add(&ps->picked, isl, s) ? IT_DROP : IT_DUP, v, isl, s);
    }
    dk_item *x = items_add(&ps->items, e->key, IT_ADMIT);
    if (!x) {
        ferry_free(data);
        return FERRY_ERR_NOMEM;
    }
    x->version = v, x->island = isl, x->seq = s;
    x->buf = data;
    x->h = h;
    *admitted = true;
    return FERRY_OK;
}

static bool spend(dk_pass *ps)
{
    if (!ps->budget) {
        ps->budget_hit = true;
        return false;
    }
    ps->budget--;
    return true;
}

/* Decides what to do with one listed object.  Order of the questions:
 * is it a batch key at all; above the window (future: read, to quarantine
 * it); with keys, resolved or below the window (read: only a batch that
 * verifies is a replay, or is dropped; object names are anyone's); below
 * the window (drop: no read needed without keys); already resolved
 * (duplicate: no read); else read and judge it.  A corrupt-looking object
 * in its grace period, listed unchanged, is not read again. */
static int classify(dk_pass *ps, const ferry_store_entry *e)
{
    ferry_dock *d = ps->d;
    uint64_t v = 0, s = 0;
    uint32_t isl = 0;
    bool admitted;
    bool keys = ferry__sign_keys_enforce(d->o.keys);
    if (ferry_dock_key_parse(d->run, e->key, &v, &isl, &s)) {
        if (!share_left(ps, DK_SHARE_NAMES) || !spend(ps)) return FERRY_OK;
        if (d->o.delete_rejected) { /* no copy to keep: its bytes do not matter */
            ferry__fail(FERRY_ERR_DOCK_KEY, "%s: not a batch key of run '%s' (deleted unread)", e->key, d->run);
            return reject(ps, e->key, FERRY_ERR_DOCK_KEY, 0, 0, 0, NULL, 0);
        }
        share_spend(ps, DK_SHARE_NAMES);
        return fetch(ps, e, false, 0, 0, 0, FETCH_ADMIT, &admitted);
    }
    if (keys && !ferry__sign_role_keys(d->o.keys, isl)) {
        /* no key is enrolled for that island: nothing under its name can
         * ever verify, so it is not read (nor copied: deleted) */
        if (!spend(ps)) return FERRY_OK;
        ferry__fail(FERRY_ERR_DOCK_SIGNATURE, "%s: no key is enrolled for island %" PRIu32 " in this consumer's ring (deleted unread)",
                    e->key, isl);
        return reject(ps, e->key, FERRY_ERR_DOCK_SIGNATURE, v, isl, s, NULL, 0);
    }
    if (v > ps->hi) {
        if (ps->sequential) return FERRY_OK; /* a later request's version */
        if (grace_skip(d, e) || !share_left(ps, share_of(isl)) || !spend(ps)) return FERRY_OK;
        share_spend(ps, share_of(isl));
        return fetch(ps, e, true, v, isl, s, FETCH_ADMIT, &admitted);
    }
    bool seen = ferry__dock_state_has(&d->st, isl, s);
    if (keys && (seen || v < ps->lo)) {
        /* read: a replay of a signed batch from a forgery, or (stale) the
         * island's own batch from a name planted to burn its seq */
        if (grace_skip(d, e) || !share_left(ps, share_of(isl)) || !spend(ps)) return FERRY_OK;
        share_spend(ps, share_of(isl));
        return fetch(ps, e, true, v, isl, s, seen ? FETCH_REPLAY : FETCH_STALE, &admitted);
    }
    if (v < ps->lo || seen) {
        if (!spend(ps)) return FERRY_OK;
        /* (v < lo here unless seen) */
        return add_resolved(ps, e->key, !seen && pairs_add(&ps->picked, isl, s) ? IT_DROP : IT_DUP, v, isl, s);
    }
    if (ps->admitted >= ps->want) return FERRY_OK; /* left for a later take */
    if (pairs_has(&ps->picked, isl, s)) { /* same (island, seq) under another version */
        if (!spend(ps)) return FERRY_OK;
        return add_resolved(ps, e->key, IT_DUP, v, isl, s);
    }
    if (grace_skip(d, e) || !share_left(ps, share_of(isl))) return FERRY_OK;
    if (!ps->budget) { /* reading may end in a rejection, which needs budget */
        ps->budget_hit = true;
        return FERRY_OK;
    }
    int rc = fetch(ps, e, true, v, isl, s, FETCH_ADMIT, &admitted);
    if (admitted) {
        ps->admitted++;
        pairs_add(&ps->picked, isl, s);
    } else {
        ps->budget--;
        share_spend(ps, share_of(isl));
    }
    return rc;
}

/* ---- commit ----------------------------------------------------------- */
static int gaps_add(dk_gaps *g, uint32_t island, uint64_t lo, uint64_t n)
{
    if (ferry__grow((void **)&g->v, &g->cap, g->n + 1, sizeof *g->v)) return FERRY_ERR_NOMEM;
    g->v[g->n++] = (dk_gap){island, lo, n};
    return FERRY_OK;
}

/* Applies the items to a copy of the state.  ADMIT and DROP items whose
 * (island, seq) the state already holds (another consumer got there, seen
 * after a CAS conflict) become duplicates. */
static int apply(dk_state *st, dk_items *it, uint64_t tv, dk_gaps *gaps)
{
    gaps->n = 0;
    for (size_t i = 0; i < it->n; i++) {
        dk_item *x = &it->v[i];
        x->kind = x->want;
        if (x->kind == IT_ADMIT || x->kind == IT_DROP) {
            int fresh;
            uint64_t glo, gn;
            int rc = ferry__dock_state_mark(st, x->island, x->seq, &fresh, &glo, &gn);
            if (rc) return rc;
            if (!fresh) x->kind = IT_DUP;
            if (gn) {
                st->counters[DK_C_GAPS] += gn;
                if ((rc = gaps_add(gaps, x->island, glo, gn))) return rc;
            }
        }
        switch (x->kind) {
        case IT_ADMIT: {
            uint64_t age = tv - x->version;
            st->counters[DK_C_ADMITTED]++;
            st->counters[DK_C_HIST0 + (age < FERRY_DOCK_HIST - 1 ? age : FERRY_DOCK_HIST - 1)]++;
            break;
        }
        case IT_DROP: st->counters[DK_C_DROPPED]++; break;
        case IT_DUP: st->counters[DK_C_DUPLICATES]++; break;
        default: st->counters[dk_rej_counter(x->code)]++; break;
        }
    }
    if (st->top_tv < tv + 1) st->top_tv = tv + 1;
    st->commits++;
    return FERRY_OK;
}

static int commit(ferry_dock *d, dk_items *it, uint64_t tv, dk_gaps *gaps)
{
    ferry_buf buf = {0};
    int rc = FERRY_OK;
    for (int attempt = 0; attempt < DK_COMMIT_ATTEMPTS; attempt++) {
        dk_state next;
        if ((rc = ferry__dock_state_clone(&d->st, &next))) break;
        rc = apply(&next, it, tv, gaps);
        if (!rc) rc = ferry__dock_cursor_encode(&next, d->run, d->nonce, d->o.keys, &buf);
        if (rc) {
            ferry__dock_state_release(&next);
            break;
        }
        char etag[FERRY_STORE_ETAG_MAX];
        rc = ferry_store_cas(d->store, d->cursor_key, d->have_cursor ? d->etag : NULL, buf.data,
                             buf.size, etag);
        if (!rc) {
            d->work.cursor_writes++;
            ferry__dock_state_release(&d->st);
            d->st = next;
            d->have_cursor = 1;
            memcpy(d->etag, etag, sizeof d->etag);
            ferry__buf_release(&buf);
            return FERRY_OK;
        }
        ferry__dock_state_release(&next);
        if (rc != FERRY_ERR_STORE_CONFLICT) {
            ferry__context(rc, "dock '%s': writing the cursor", d->run);
            break;
        }
        /* Someone else moved the cursor: take its view and decide again. */
        d->work.cursor_conflicts++;
        if ((rc = ferry__dock_load_cursor(d))) break;
        rc = ferry__fail(FERRY_ERR_DOCK_CONTENDED, "dock '%s': the cursor changed under %d commits in a row (another consumer?)",
                         d->run, DK_COMMIT_ATTEMPTS);
    }
    ferry__buf_release(&buf);
    return rc;
}

/* ---- the pass ----------------------------------------------------------- */
static int list_into(ferry_dock *d, const char *prefix, ferry_store_listing **ls, size_t *nls)
{
    int rc = ferry_store_list(d->store, prefix, &ls[*nls]);
    if (rc) return ferry__context(rc, "dock '%s': listing %s", d->run, prefix);
    d->work.lists++;
    d->work.listed += ls[*nls]->count;
    (*nls)++;
    return FERRY_OK;
}

static int append_batch(ferry_dock_batch **acc, size_t *n, size_t *cap, dk_item *x, uint64_t tv)
{
    if (ferry__grow((void **)acc, cap, *n + 1, sizeof **acc)) return FERRY_ERR_NOMEM;
    ferry_dock_batch *b = &(*acc)[(*n)++];
    memset(b, 0, sizeof *b);
    memcpy(b->run, x->h.run, sizeof b->run);
    b->version = x->h.version;
    b->island = x->h.island;
    b->seq = x->h.seq;
    b->staleness = tv - x->h.version;
    b->put_time_ms = x->h.put_time_ms;
    b->payload = x->h.payload;
    b->size = (size_t)x->h.size;
    b->internal_ = x->buf;
    x->buf = NULL;
    return FERRY_OK;
}

#define MAX_LISTS (2 * DK_MAX_VERSION_LISTS + 2)

static int pass(ferry_dock *d, const ferry_dock_policy *p, uint64_t tv, size_t want, bool force_full,
                ferry_dock_batch **acc, size_t *nacc, size_t *capacc)
{
    dk_pass ps = {.d = d, .tv = tv, .hi = tv, .want = want, .budget = d->o.max_scan};
    window(p, tv, &ps.lo);
    ps.sequential = p->mode == FERRY_DOCK_SEQUENTIAL;
    d->work.passes++;

    /* What to list: the window's versions, those that left it since the
     * last pass, or all of RUN/traj/ (a sweep, or too many versions). */
    uint64_t from = ps.lo;
    if (d->have_last_lo && d->last_lo < ps.lo) from = d->last_lo;
    bool full = force_full || d->sweep_due || ps.hi - from >= 2 * DK_MAX_VERSION_LISTS ||
                ps.hi - ps.lo >= DK_MAX_VERSION_LISTS;
    ferry_store_listing *ls[MAX_LISTS];
    size_t nls = 0, total = 0;
    char prefix[FERRY_DOCK_KEY_MAX];
    int rc = FERRY_OK;
    if (full) {
        ferry__dock_traj_prefix(d->run, prefix);
        rc = list_into(d, prefix, ls, &nls);
    } else {
        /* ascending versions: the entries come out in key order */
        for (uint64_t k = 0; !rc && k <= ps.hi - from; k++) {
            ferry__dock_version_prefix(d->run, from + k, prefix);
            rc = list_into(d, prefix, ls, &nls);
        }
    }
    for (size_t i = 0; i < nls; i++) total += ls[i]->count;
    size_t expect = (want < total ? want : total) + d->o.max_scan + 1;
    if (!rc) rc = pairs_init(&ps.picked, expect);
    if (!rc) rc = shares_init(&ps.shares, d->o.max_scan);

    /* Classify, stopping at the first store error: what was decided
     * before it is still committed below.  The window's objects go first,
     * so that when one (island, seq) sits under an admissible and a stale
     * version (an island re-put it after re-syncing), the admissible copy
     * is the one consumed and the stale one the duplicate. */
    int rc_store = FERRY_OK;
    for (int phase = 0; phase < 2 && !rc && !rc_store; phase++)
        for (size_t i = 0; !rc_store && i < nls; i++)
            for (size_t j = 0; !rc_store && j < ls[i]->count; j++) {
                uint64_t v;
                bool in = !ferry_dock_key_parse(d->run, ls[i]->entries[j].key, &v, NULL, NULL) &&
                          v >= ps.lo && v <= ps.hi;
                if (in != (phase == 0)) continue;
                rc_store = classify(&ps, &ls[i]->entries[j]);
                if (rc_store == FERRY_ERR_NOMEM) rc = rc_store;
            }
    for (size_t i = 0; i < nls; i++) ferry_store_listing_free(ls[i]);
    free(ps.picked.slot);
    shares_release(&ps.shares);
    if (rc) {
        items_release(&ps.items);
        return rc;
    }

    dk_gaps gaps = {0};
    bool moved = d->st.top_tv < tv + 1;
    if (ps.items.n || moved) {
        char saved[1024];
        snprintf(saved, sizeof saved, "%s", ferry_last_error());
        rc = commit(d, &ps.items, tv, &gaps);
        if (rc) {
            items_release(&ps.items);
            free(gaps.v);
            return rc;
        }
        if (rc_store) ferry__fail(rc_store, "%s", saved);
    }

    /* Committed: now clean up the store and report. */
    for (size_t i = 0; i < ps.items.n; i++) {
        dk_item *x = &ps.items.v[i];
        int drc = ferry_store_delete(d->store, x->key);
        d->work.deletes++;
        if (drc) d->work.delete_failures++; /* found again later as a duplicate */
        if (x->kind == IT_DROP)
            emit(d, FERRY_DOCK_EV_DROPPED, 0, x->key, x->version, x->island, x->seq, 1, tv, NULL);
        else if (x->kind == IT_DUP)
            emit(d, FERRY_DOCK_EV_DUPLICATE, 0, x->key, x->version, x->island, x->seq, 1, tv, NULL);
        else if (x->kind == IT_REJECT)
            emit(d, FERRY_DOCK_EV_REJECTED, x->code, x->key, x->version, x->island, x->seq, 1, tv, x->msg);
    }
    for (size_t i = 0; i < gaps.n; i++)
        emit(d, FERRY_DOCK_EV_GAP, 0, NULL, 0, gaps.v[i].island, gaps.v[i].lo, gaps.v[i].n, tv, NULL);
    free(gaps.v);
    for (size_t i = 0; !rc && i < ps.items.n; i++)
        if (ps.items.v[i].kind == IT_ADMIT) rc = append_batch(acc, nacc, capacc, &ps.items.v[i], tv);
    items_release(&ps.items);
    if (rc) return rc;

    d->last_lo = ps.lo;
    d->have_last_lo = 1;
    if (ps.budget_hit || rc_store) {
        d->sweep_due = 1; /* what this pass left is found by the next full listing */
    } else if (full) {
        d->sweep_due = 0;
        d->takes_since_sweep = 0;
    }
    return rc_store;
}

static int check_call(ferry_dock *d, const ferry_dock_policy *p, uint64_t tv, const char *what)
{
    if (!d || !p) return ferry__fail(FERRY_ERR_ARG, "dock: %s: NULL argument", what);
    if (d->o.role != FERRY_DOCK_CONSUMER)
        return ferry__fail(FERRY_ERR_ARG, "dock '%s': %s needs a consumer handle", d->run, what);
    if (p->mode != FERRY_DOCK_SEQUENTIAL && p->mode != FERRY_DOCK_ASYNC)
        return ferry__fail(FERRY_ERR_ARG, "dock '%s': %s: policy mode %d", d->run, what, p->mode);
    if (tv == UINT64_MAX) return ferry__fail(FERRY_ERR_ARG, "dock '%s': %s: trainer version %" PRIu64, d->run, what, tv);
    if (d->st.top_tv > tv + 1 && !d->o.allow_version_regress)
        return ferry__fail(FERRY_ERR_DOCK_REGRESSED, "dock '%s': %s: trainer version %" PRIu64 " is below %" PRIu64
                           ", already used by this run's consumer (a version counter reset?)",
                           d->run, what, tv, d->st.top_tv - 1);
    return FERRY_OK;
}

/* Store failures worth another pass while a take still has time: the
 * store has already retried each request within its own deadline, but a
 * malformed listing (a server caught mid-write) or an outage that just
 * ended may well be gone by the next pass.  Anything else (credentials,
 * keys, the cursor, limits) will not improve by waiting. */
static bool transient(int rc)
{
    return rc == FERRY_ERR_STORE_CORRUPT || rc == FERRY_ERR_STORE_HTTP || rc == FERRY_ERR_STORE_NET ||
           rc == FERRY_ERR_STORE_TIMEOUT || rc == FERRY_ERR_DOCK_CONTENDED;
}

int ferry_dock_take(ferry_dock *d, const ferry_dock_policy *p, uint64_t trainer_version,
                    size_t max_batches, uint32_t timeout_ms, ferry_dock_batch **out, size_t *n)
{
    if (!out || !n) return ferry__fail(FERRY_ERR_ARG, "dock: take: NULL output");
    *out = NULL;
    *n = 0;
    int rc = check_call(d, p, trainer_version, "take");
    if (rc) return rc;
    d->work.takes++;
    if (++d->takes_since_sweep >= d->o.sweep_every) d->sweep_due = 1;
    uint64_t deadline = ferry__mono_ms() + timeout_ms;
    uint64_t wait = d->o.poll_ms;
    ferry_dock_batch *acc = NULL;
    size_t got = 0, cap = 0;
    for (;;) {
        rc = pass(d, p, trainer_version, max_batches - got, false, &acc, &got, &cap);
        if (rc && got) {
            rc = FERRY_OK; /* committed batches are the caller's now */
            break;
        }
        if (rc && !transient(rc)) break;
        if (!rc && got >= max_batches) break;
        uint64_t now = ferry__mono_ms();
        if (now >= deadline) break; /* with the last pass's status */
        ferry__sleep_ms(wait < deadline - now ? wait : deadline - now);
        wait = wait * 2 < DK_MAX_POLL_MS ? wait * 2 : DK_MAX_POLL_MS;
    }
    if (rc || !got) {
        ferry_dock_batches_free(acc, got);
        return rc;
    }
    *out = acc;
    *n = got;
    return FERRY_OK;
}

int ferry_dock_sweep(ferry_dock *d, const ferry_dock_policy *p, uint64_t trainer_version)
{
    int rc = check_call(d, p, trainer_version, "sweep");
    if (rc) return rc;
    size_t got = 0, cap = 0;
    ferry_dock_batch *acc = NULL;
    rc = pass(d, p, trainer_version, 0, true, &acc, &got, &cap);
    ferry_dock_batches_free(acc, got);
    return rc;
}
