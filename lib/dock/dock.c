/* Dock handles: open (and the consumer's cursor load), put, resume_seq,
 * stats.  take and sweep live in dock_take.c. */
#include "dock_impl.h"
#include "sign/sig.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

uint64_t ferry__dock_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec < 0 ? 0 : (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Whether a decoded cursor's signature may be believed (ferry_dock.h,
 * "SIGNED CURSOR").  need: this handle takes only a signed cursor.  With a
 * ring, a signature must verify against a publisher key; with none, it is
 * not checked (nothing is, without keys). */
static int cursor_verify(const ferry_dock *d, const uint8_t *data, size_t size, const uint8_t *sig, bool need)
{
    if (!sig) {
        if (!need) return FERRY_OK;
        return ferry__fail(FERRY_ERR_DOCK_CURSOR, "dock '%s': %s is unsigned, and this handle takes only a cursor signed by "
                           "a publisher (the trainer's) key: a store writer may have replaced it", d->run, d->cursor_key);
    }
    if (!d->o.keys) return FERRY_OK;
    if (ferry__sign_verify_publisher(d->o.keys, FS_DOM_CURSOR, d->cursor_key, data, size - FS_SIG_RAW, sig))
        return ferry__context(FERRY_ERR_DOCK_CURSOR, "dock '%s': the cursor's signature", d->run);
    return FERRY_OK;
}

/* How read_cursor takes a signature. */
enum {
    CUR_CHECK,  /* verified when signed (with a ring); unsigned is fine */
    CUR_STRICT, /* must be signed (and verify, with a ring) */
    CUR_HINT,   /* with a ring, one not signed by a publisher key is left
                   out (*found = false) rather than failing; else CHECK */
};

/* Reads the cursor: *found = false when there is none.  A malformed one
 * is FERRY_ERR_DOCK_CURSOR whatever the mode. */
static int read_cursor(ferry_dock *d, int mode, dk_state *out, bool *found, char etag[FERRY_STORE_ETAG_MAX])
{
    memset(out, 0, sizeof *out);
    *found = false;
    void *data = NULL;
    size_t size = 0;
    ferry_store_stat st;
    int rc = ferry_store_get_max(d->store, d->cursor_key, DK_CURSOR_MAX_BYTES, &data, &size, &st);
    if (rc == FERRY_ERR_STORE_NOT_FOUND) return FERRY_OK;
    if (rc) return ferry__context(rc, "dock '%s': reading the cursor", d->run);
    const uint8_t *sig;
    rc = ferry__dock_cursor_decode(data, size, d->run, out, &sig);
    if (rc) {
        ferry_free(data);
        return ferry__context(rc, "dock '%s': %s", d->run, d->cursor_key);
    }
    rc = cursor_verify(d, data, size, sig, mode == CUR_STRICT || (mode == CUR_HINT && d->o.keys));
    ferry_free(data);
    if (rc) {
        ferry__dock_state_release(out);
        if (mode != CUR_HINT) return rc;
        ferry__clear_error(); /* not believed: left out */
        return FERRY_OK;
    }
    *found = true;
    if (etag) memcpy(etag, st.etag, FERRY_STORE_ETAG_MAX);
    return FERRY_OK;
}

/* A consumer's record only grows: the cursor this handle held (or the one
 * resume_commits vouches for) may be replaced by a later one, never
 * deleted nor put back older.  Either would reopen replays of what was
 * consumed since, and reset the run's counters, so it is refused. */
static int check_not_rolled_back(const ferry_dock *d, const dk_state *now, bool found)
{
    if (!found) {
        if (d->have_cursor)
            return ferry__fail(FERRY_ERR_DOCK_ROLLBACK, "dock '%s': %s is gone, though this consumer held it at commit %" PRIu64
                               " (deleted by someone with write access to the store?); nothing is taken until it is put back",
                               d->run, d->cursor_key, d->st.commits);
        if (d->o.resume_commits)
            return ferry__fail(FERRY_ERR_DOCK_ROLLBACK, "dock '%s': there is no %s, though resume_commits says this run's "
                               "consumer committed %" PRIu64 " times (deleted?)", d->run, d->cursor_key, d->o.resume_commits);
        return FERRY_OK;
    }
    if (!d->have_cursor) {
        if (now->commits < d->o.resume_commits)
            return ferry__fail(FERRY_ERR_DOCK_ROLLBACK, "dock '%s': %s is at commit %" PRIu64 ", below the %" PRIu64
                               " of resume_commits (an older copy put back?)", d->run, d->cursor_key, now->commits,
                               d->o.resume_commits);
        return FERRY_OK;
    }
    char why[256];
    if (now->commits <= d->st.commits)
        return ferry__fail(FERRY_ERR_DOCK_ROLLBACK, "dock '%s': %s went from commit %" PRIu64 " to %" PRIu64
                           " (an older copy put back?)", d->run, d->cursor_key, d->st.commits, now->commits);
    if (!ferry__dock_state_covers(now, &d->st, why, sizeof why))
        return ferry__fail(FERRY_ERR_DOCK_ROLLBACK, "dock '%s': %s at commit %" PRIu64 " does not hold what commit %" PRIu64
                           " did: %s", d->run, d->cursor_key, now->commits, d->st.commits, why);
    return FERRY_OK;
}

int ferry__dock_load_cursor(ferry_dock *d)
{
    dk_state fresh;
    bool found;
    char etag[FERRY_STORE_ETAG_MAX];
    /* a consumer that signs its cursor takes only a signed one */
    int rc = read_cursor(d, ferry_keys_can_sign(d->o.keys) ? CUR_STRICT : CUR_CHECK, &fresh, &found, etag);
    if (!rc) rc = check_not_rolled_back(d, &fresh, found);
    if (rc) {
        ferry__dock_state_release(&fresh);
        return rc;
    }
    d->have_cursor = found;
    if (found) memcpy(d->etag, etag, sizeof d->etag);
    else d->etag[0] = 0;
    ferry__dock_state_release(&d->st);
    d->st = fresh;
    return FERRY_OK;
}

int ferry_dock_open(ferry_store *store, const char *run, const ferry_dock_options *opts,
                    ferry_dock **out)
{
    if (!out) return ferry__fail(FERRY_ERR_ARG, "dock: open: out is NULL");
    *out = NULL;
    if (!store) return ferry__fail(FERRY_ERR_ARG, "dock: open: store is NULL");
    int rc = ferry_dock_run_check(run);
    if (rc) return rc;
    ferry_dock_options o = {0};
    if (opts) o = *opts;
    if (o.role != FERRY_DOCK_PRODUCER && o.role != FERRY_DOCK_CONSUMER)
        return ferry__fail(FERRY_ERR_ARG, "dock: open: role %d (want FERRY_DOCK_PRODUCER or _CONSUMER)", o.role);
    if ((rc = ferry__sign_ring_check(o.keys, "dock: open"))) return rc; /* an empty ring is no "unsigned" */
    if (o.role == FERRY_DOCK_CONSUMER && ferry_keys_can_sign(o.keys)) {
        /* it will sign its cursor, which only a publisher's key may */
        uint8_t raw[FS_SIG_RAW];
        if ((rc = ferry__sign_bytes(o.keys, FS_DOM_CURSOR, "", 0, raw)))
            return ferry__context(rc, "dock: open: a consumer signs its cursor with its ring's signing key");
    }
    if (!o.max_payload) o.max_payload = DK_DEFAULT_MAX_PAYLOAD;
    if (o.max_payload > UINT64_MAX - FERRY_DOCK_HEADER_SIZE)
        return ferry__fail(FERRY_ERR_ARG, "dock: open: max_payload %" PRIu64 " too large", o.max_payload);
    if (!o.max_scan) o.max_scan = DK_DEFAULT_MAX_SCAN;
    if (!o.sweep_every) o.sweep_every = DK_DEFAULT_SWEEP_EVERY;
    if (!o.poll_ms) o.poll_ms = DK_DEFAULT_POLL_MS;

    ferry_dock *d = ferry__calloc(1, sizeof *d);
    if (!d) return FERRY_ERR_NOMEM;
    d->store = store;
    memcpy(d->run, run, strlen(run) + 1);
    snprintf(d->cursor_key, sizeof d->cursor_key, "%s/dock/cursor", run);
    d->o = o;
    /* Only stores whose puts are not atomic need the grace period; S3
     * itself does not, but an s3:// URL may well be s3rver or a gateway. */
    if (o.corrupt_grace_ms < 0) d->grace_ms = 0;
    else if (o.corrupt_grace_ms > 0) d->grace_ms = o.corrupt_grace_ms;
    else d->grace_ms = ferry_store_kind(store) == FERRY_STORE_S3 ? DK_DEFAULT_S3_GRACE_MS : 0;
    /* only has to differ between handles (it makes each cursor's bytes
     * unique, see ferry_store_cas): ferry__random_bytes' fallback will do */
    ferry__random_bytes(&d->nonce, sizeof d->nonce);
    ferry__random_bytes(&d->suspects.seed, sizeof d->suspects.seed);
    d->sweep_due = 1;
    if (o.role == FERRY_DOCK_CONSUMER) {
        rc = ferry__dock_load_cursor(d);
        if (rc) {
            ferry_dock_free(d);
            return rc;
        }
    }
    *out = d;
    return FERRY_OK;
}

void ferry_dock_free(ferry_dock *d)
{
    if (!d) return;
    ferry__dock_state_release(&d->st);
    ferry__dock_memo_release(&d->suspects);
    free(d);
}

int ferry_dock_put(ferry_dock *d, uint32_t island, uint64_t version, uint64_t seq,
                   const void *payload, size_t len)
{
    if (!d) return ferry__fail(FERRY_ERR_ARG, "dock: put: handle is NULL");
    if (!payload && len) return ferry__fail(FERRY_ERR_ARG, "dock: put: NULL payload of %zu bytes", len);
    if (len > d->o.max_payload)
        return ferry__fail(FERRY_ERR_LIMIT, "dock '%s': put: payload of %zu bytes over max_payload %" PRIu64,
                           d->run, len, d->o.max_payload);
    char key[FERRY_DOCK_KEY_MAX];
    int rc = ferry_dock_key(d->run, version, island, seq, key);
    if (rc) return rc;
    void *obj = NULL;
    size_t size = 0;
    rc = ferry__dock_encode(d->run, version, island, seq, ferry__dock_wall_ms(), payload, len, d->o.keys, &obj, &size);
    if (rc) return rc;
    rc = ferry_store_put(d->store, key, obj, size, NULL);
    ferry_free(obj);
    if (rc) return ferry__context(rc, "dock: put %s", key);
    d->work.puts++;
    d->work.put_bytes += size;
    return FERRY_OK;
}

typedef struct dk_cand {
    uint64_t seq;
    size_t at; /* index in the listing */
} dk_cand;

static int cand_desc(const void *a, const void *b)
{
    uint64_t x = ((const dk_cand *)a)->seq, y = ((const dk_cand *)b)->seq;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Whether the object listed as island's batch `key` is one: it decodes as a
 * batch of this run whose header names the key's version, island and seq,
 * and, with a ring, is signed by a key enrolled for the island.  *gone: it
 * was deleted since the listing.  Store errors only are returned. */
static int is_batch(ferry_dock *d, const char *key, uint64_t v, uint32_t island, uint64_t seq, bool *ok, bool *gone)
{
    *ok = *gone = false;
    void *data = NULL;
    size_t size = 0;
    int rc = ferry_store_get_max(d->store, key, FERRY_DOCK_HEADER_SIZE + d->o.max_payload + FERRY_DOCK_SIG_SIZE, &data, &size, NULL);
    d->work.gets++;
    if (rc == FERRY_ERR_STORE_NOT_FOUND) {
        *gone = true;
        return FERRY_OK;
    }
    if (rc == FERRY_ERR_LIMIT) return FERRY_OK; /* too large to be a batch */
    if (rc) return ferry__context(rc, "dock '%s': resume_seq: reading %s", d->run, key);
    ferry_dock_header h;
    *ok = !ferry_dock_decode(data, size, d->o.max_payload, d->run, &h) && h.version == v && h.island == island && h.seq == seq &&
          !ferry__dock_batch_verify(d->o.keys, key, data, &h);
    ferry_free(data);
    return FERRY_OK;
}

/* The answer counts only what the island (or the trainer) wrote: object
 * names are anyone's, so each candidate is read and checked, highest seq
 * first, until one holds (issue 23: an object merely named
 * "i0000000000-s18446744073709551615" stopped island 0 for good).  The
 * cursor counts when it is believed: with a ring, only signed by a
 * publisher key; an unsigned or forged one is left out (islands need it
 * only as a hint, and must not be stopped by a planted one). */
int ferry_dock_resume_seq(ferry_dock *d, uint32_t island, uint64_t *next_seq)
{
    if (!d || !next_seq) return ferry__fail(FERRY_ERR_ARG, "dock: resume_seq: NULL argument");
    *next_seq = 0;
    char prefix[FERRY_DOCK_KEY_MAX];
    ferry__dock_traj_prefix(d->run, prefix);
    ferry_store_listing *l = NULL;
    int rc = ferry_store_list(d->store, prefix, &l);
    if (rc) return ferry__context(rc, "dock '%s': resume_seq: listing %s", d->run, prefix);
    d->work.lists++;
    d->work.listed += l->count;
    dk_cand *c = ferry__calloc(l->count, sizeof *c);
    if (!c) {
        ferry_store_listing_free(l);
        return FERRY_ERR_NOMEM;
    }
    size_t nc = 0;
    for (size_t i = 0; i < l->count; i++) {
        uint64_t v, s;
        uint32_t is;
        if (ferry_dock_key_parse(d->run, l->entries[i].key, &v, &is, &s) || is != island) continue;
        c[nc++] = (dk_cand){s, i};
    }
    qsort(c, nc, sizeof *c, cand_desc);
    bool any = false;
    uint64_t top = 0;
    uint32_t failed = 0;
    for (size_t i = 0; !rc && i < nc && !any; i++) {
        const char *key = l->entries[c[i].at].key;
        uint64_t v, s;
        uint32_t is;
        bool ok, gone;
        ferry_dock_key_parse(d->run, key, &v, &is, &s);
        rc = is_batch(d, key, v, island, s, &ok, &gone);
        if (!rc && ok) top = s, any = true;
        /* a batch taken since the listing is in the cursor read below */
        if (!rc && !ok && !gone && ++failed >= d->o.max_scan)
            rc = ferry__fail(FERRY_ERR_LIMIT, "dock '%s': resume_seq: the %" PRIu32 " highest-numbered objects named as island %" PRIu32
                             "'s batches are not its batches (junk planted under %s?)", d->run, failed, island, prefix);
    }
    free(c);
    ferry_store_listing_free(l);
    if (rc) return rc;
    /* The cursor is read after the listing and the reads: a batch consumed
     * (and deleted) meanwhile is then in the cursor; the other order could
     * miss it. */
    dk_state st;
    bool found;
    rc = read_cursor(d, CUR_HINT, &st, &found, NULL);
    if (rc) return rc;
    uint64_t s;
    if (found && ferry__dock_state_max_seq(&st, island, &s) && (!any || s > top)) top = s, any = true;
    ferry__dock_state_release(&st);
    if (any && top == UINT64_MAX)
        return ferry__fail(FERRY_ERR_LIMIT, "dock '%s': island %" PRIu32 " has used every sequence number", d->run, island);
    *next_seq = any ? top + 1 : 0;
    return FERRY_OK;
}

void ferry_dock_get_stats(const ferry_dock *d, ferry_dock_stats *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!d) return;
    *out = d->work;
    const uint64_t *c = d->st.counters;
    out->admitted = c[DK_C_ADMITTED];
    out->dropped_stale = c[DK_C_DROPPED];
    out->duplicates = c[DK_C_DUPLICATES];
    out->gaps = c[DK_C_GAPS];
    out->rejected_corrupt = out->rejected_run = out->rejected_future = 0;
    for (int i = 0; i < DK_REJ_CODES; i++) {
        uint64_t v = c[DK_C_REJ0 + i];
        out->rejected_by_code[i] = v;
        int code = FERRY_ERR_DOCK_MAGIC + i;
        if (code == FERRY_ERR_DOCK_RUN) out->rejected_run += v;
        else if (code == FERRY_ERR_DOCK_FUTURE) out->rejected_future += v;
        else out->rejected_corrupt += v;
    }
    for (int i = 0; i < FERRY_DOCK_HIST; i++) out->staleness_hist[i] = c[DK_C_HIST0 + i];
    out->rejected_signature = c[DK_C_SIGNATURE];
    out->rejected_replay = c[DK_C_REPLAY];
    out->cursor_commits = d->st.commits;
}

void ferry_dock_batches_free(ferry_dock_batch *b, size_t n)
{
    if (!b) return;
    for (size_t i = 0; i < n; i++) ferry_free(b[i].internal_);
    free(b);
}
