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

int ferry__dock_load_cursor(ferry_dock *d)
{
    void *data = NULL;
    size_t size = 0;
    ferry_store_stat st;
    int rc = ferry_store_get_max(d->store, d->cursor_key, DK_CURSOR_MAX_BYTES, &data, &size, &st);
    dk_state fresh;
    if (rc == FERRY_ERR_STORE_NOT_FOUND) {
        memset(&fresh, 0, sizeof fresh);
        d->have_cursor = 0;
        d->etag[0] = 0;
    } else if (rc) {
        return ferry__context(rc, "dock '%s': reading the cursor", d->run);
    } else {
        rc = ferry__dock_cursor_decode(data, size, d->run, &fresh);
        ferry_free(data);
        if (rc) return ferry__context(rc, "dock '%s': %s", d->run, d->cursor_key);
        d->have_cursor = 1;
        memcpy(d->etag, st.etag, sizeof d->etag);
    }
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
    for (size_t i = 0; i < d->n_suspects; i++) free(d->suspects[i].key);
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
    bool any = false;
    uint64_t top = 0;
    for (size_t i = 0; i < l->count; i++) {
        uint64_t v, s;
        uint32_t is;
        if (ferry_dock_key_parse(d->run, l->entries[i].key, &v, &is, &s) || is != island) continue;
        if (!any || s > top) top = s;
        any = true;
    }
    ferry_store_listing_free(l);
    /* The cursor is read after the listing: a batch consumed (and deleted)
     * in between is then in the cursor; the other order could miss it. */
    void *data = NULL;
    size_t size = 0;
    rc = ferry_store_get_max(d->store, d->cursor_key, DK_CURSOR_MAX_BYTES, &data, &size, NULL);
    if (rc && rc != FERRY_ERR_STORE_NOT_FOUND) return ferry__context(rc, "dock '%s': resume_seq: reading the cursor", d->run);
    if (!rc) {
        dk_state st;
        rc = ferry__dock_cursor_decode(data, size, d->run, &st);
        ferry_free(data);
        if (rc) return ferry__context(rc, "dock '%s': %s", d->run, d->cursor_key);
        uint64_t s;
        if (ferry__dock_state_max_seq(&st, island, &s) && (!any || s > top)) top = s, any = true;
        ferry__dock_state_release(&st);
    }
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
}

void ferry_dock_batches_free(ferry_dock_batch *b, size_t n)
{
    if (!b) return;
    for (size_t i = 0; i < n; i++) ferry_free(b[i].internal_);
    free(b);
}
