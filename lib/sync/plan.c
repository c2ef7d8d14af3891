/* Path selection: the cheapest way, in bytes to download, from what the
 * subscriber holds to the target version.
 *
 * Every manifest carries the cumulative size of the deltas of its lineage
 * (delta_bytes_cum), so the deltas between any two versions u < v cost
 * cum(v) - cum(u) without reading the manifests in between; anchors and
 * compacted deltas carry their sizes in the links that name them.  The
 * planner therefore prices every option from the target's manifest, the
 * subscriber's state and the compaction index alone:
 *
 *   chain      deltas cur+1 .. T
 *   anchor     the full object of T's anchor (or the one before it) plus
 *              the deltas after it
 *   compacted  reach the compaction's start (be there; deltas from cur;
 *              its full object if it is an anchor; an anchor plus deltas),
 *              the compacted delta, then deltas to T
 *
 * Objects rejected earlier in the sync are excluded, so a corrupt delta
 * sends the subscriber through an anchor. */
#include "sync_impl.h"

typedef struct cand {
    uint64_t bytes;
    int n;
    fs_step step[4];
} cand;

static bool bad_in(const uint64_t *v, size_t n, uint64_t lo, uint64_t hi) /* any v in (lo, hi] */
{
    for (size_t i = 0; i < n; i++)
        if (v[i] > lo && v[i] <= hi) return true;
    return false;
}

static bool chain_ok(const fs_plan_in *in, uint64_t from, uint64_t to)
{
    return from <= to && !bad_in(in->bad_delta_versions, in->nbad_delta, from, to);
}

static bool full_ok(const fs_plan_in *in, uint64_t v) { return !bad_in(in->bad_full_versions, in->nbad_full, v - 1, v); }

static void push(cand *c, int kind, uint64_t from, uint64_t to, const char *to_id, size_t comp)
{
    fs_step *s = &c->step[c->n++];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->from = from;
    s->to = to;
    if (to_id) memcpy(s->to_id, to_id, FS_ID_CAP);
    s->compaction = comp;
}

static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

/* Reaching a compaction's start; false if there is no way. */
static bool reach_start(const fs_plan_in *in, const fs_compaction *c, cand *out)
{
    cand best = {UINT64_MAX, 0, {{0}}};
    const fs_state *cur = in->cur;
    if (in->cur_usable && cur->version == c->from && !strcmp(cur->id, c->from_id)) best.bytes = 0;
    if (in->cur_usable && cur->version && cur->version < c->from && chain_ok(in, cur->version, c->from) &&
        c->from_cum >= cur->cum && c->from_cum - cur->cum < best.bytes) {
        best.bytes = c->from_cum - cur->cum;
        best.n = 0;
        push(&best, FS_STEP_CHAIN, cur->version, c->from, c->from_id, 0);
    }
    if (c->from_full_bytes && full_ok(in, c->from) && c->from_full_bytes < best.bytes) {
        best.bytes = c->from_full_bytes;
        best.n = 0;
        push(&best, FS_STEP_FULL, 0, c->from, c->from_id, 0);
    }
    const fs_anchor_ref *anchors[2] = {&in->target->anchor, &in->target->prev_anchor};
    for (int i = 0; i < 2; i++) {
        const fs_anchor_ref *a = anchors[i];
        if (!a->ref.version || a->ref.version > c->from || !full_ok(in, a->ref.version) || !chain_ok(in, a->ref.version, c->from) ||
            c->from_cum < a->cum)
            continue;
        uint64_t b = sat_add(a->bytes, c->from_cum - a->cum);
        if (b < best.bytes) {
            best.bytes = b;
            best.n = 0;
            push(&best, FS_STEP_FULL, 0, a->ref.version, a->ref.id, 0);
            if (a->ref.version < c->from) push(&best, FS_STEP_CHAIN, a->ref.version, c->from, c->from_id, 0);
        }
    }
    *out = best;
    return best.bytes != UINT64_MAX;
}

static void describe(const cand *c, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < c->n && n < cap; i++) {
        const fs_step *s = &c->step[i];
        const char *sep = i ? " + " : "";
        int w = 0;
        if (s->kind == FS_STEP_FULL) w = snprintf(out + n, cap - n, "%sanchor %llu", sep, (unsigned long long)s->to);
        else
            w = snprintf(out + n, cap - n, "%s%s %llu..%llu", sep, s->kind == FS_STEP_CHAIN ? "chain" : "compacted",
                         (unsigned long long)s->from, (unsigned long long)s->to);
        if (w < 0) break;
        n += (size_t)w;
    }
}

bool ferry__sync_plan_pick(const fs_plan_in *in, fs_plan *out, uint64_t *chain_bytes, uint64_t *anchor_bytes, uint64_t *compact_bytes)
{
    const fs_manifest *T = in->target;
    const fs_state *cur = in->cur;
    cand best = {UINT64_MAX, 0, {{0}}};
    *chain_bytes = *anchor_bytes = *compact_bytes = UINT64_MAX;

    if (in->cur_usable && cur->version && cur->version < T->version && chain_ok(in, cur->version, T->version) &&
        T->cum >= cur->cum) {
        cand c = {T->cum - cur->cum, 0, {{0}}};
        push(&c, FS_STEP_CHAIN, cur->version, T->version, T->id, 0);
        *chain_bytes = c.bytes;
        best = c;
    }

    const fs_anchor_ref *anchors[2] = {&T->anchor, &T->prev_anchor};
    for (int i = 0; i < 2; i++) {
        const fs_anchor_ref *a = anchors[i];
        if (!a->ref.version || !full_ok(in, a->ref.version) || !chain_ok(in, a->ref.version, T->version) || T->cum < a->cum) continue;
        cand c = {sat_add(a->bytes, T->cum - a->cum), 0, {{0}}};
        push(&c, FS_STEP_FULL, 0, a->ref.version, a->ref.id, 0);
        if (a->ref.version < T->version) push(&c, FS_STEP_CHAIN, a->ref.version, T->version, T->id, 0);
        if (c.bytes < *anchor_bytes) *anchor_bytes = c.bytes;
        if (c.bytes < best.bytes) best = c;
    }

    for (size_t i = 0; i < in->nc; i++) {
        const fs_compaction *k = &in->c[i];
        if (k->to > T->version || !chain_ok(in, k->to, T->version) || T->cum < k->to_cum) continue;
        cand c;
        if (!reach_start(in, k, &c)) continue;
        c.bytes = sat_add(sat_add(c.bytes, k->bytes), T->cum - k->to_cum);
        push(&c, FS_STEP_COMPACT, k->from, k->to, k->to_id, i);
        if (k->to < T->version) push(&c, FS_STEP_CHAIN, k->to, T->version, T->id, 0);
        if (c.bytes < *compact_bytes) *compact_bytes = c.bytes;
        if (c.bytes < best.bytes) best = c;
    }

    if (best.bytes == UINT64_MAX) return false;
    memset(out, 0, sizeof *out);
    out->n = best.n;
    memcpy(out->step, best.step, sizeof best.step);
    out->bytes = best.bytes;
    describe(&best, out->desc, sizeof out->desc);
    return true;
}
