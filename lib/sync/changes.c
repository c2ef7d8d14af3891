/* Per-tensor change lists of the last sync (ferry_subscriber_changes).
 *
 * A sync whose every step was applied in place to the exposed model
 * (memory mode, private mode on a writable model) kept, step by step, the
 * record of every word it overwrote (steps.c's undo records, made to undo
 * a failed route).  After the commit those records say exactly which
 * words the route wrote: their positions, per tensor, are the union over
 * the route, sorted, and the new values are read from the model.  They are
 * built when first asked for (until the next sync the records are kept):
 * a caller that never asks pays nothing.  Any
 * other sync (an anchor, a model built aside, file mode) reports every
 * tensor whole. */
#include "sub.h"

#include <stdlib.h>

/* A tensor whose list would hold more than 1/CHG_BUDGET of its elements is
 * reported whole: its positions and values (10 bytes per BF16 change)
 * would outweigh the tensor (2 bytes per element). */
#define CHG_BUDGET 5

static void drop_records(ferry_subscriber *s)
{
    for (size_t i = 0; i < s->chg_nrec; i++) ferry__codec_undo_free(s->chg_rec[i]);
    free(s->chg_rec);
    s->chg_rec = NULL;
    s->chg_nrec = 0;
}

void ferry__sync_sub_changes_clear(ferry_subscriber *s)
{
    drop_records(s);
    for (size_t i = 0; i < s->nchg; i++) {
        free(s->chg[i].pos);
        free(s->chg[i].vals);
    }
    free(s->chg);
    s->chg = NULL;
    s->nchg = 0;
    s->chg_all = false;
}

typedef struct by_addr {
    const uint8_t *lo, *hi;
    size_t i;
} by_addr;

static int cmp_addr(const void *a, const void *b)
{
    const uint8_t *x = ((const by_addr *)a)->lo, *y = ((const by_addr *)b)->lo;
    return x < y ? -1 : x > y;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct chg_ctx {
    ferry_subscriber *s;
    const ferry_model *m;
    by_addr *ix;
    size_t nix;
    uint64_t *cnt;   /* pass 1: words listed per tensor (duplicates included) */
    bool fill;       /* pass 2: positions written */
    bool lost;       /* a word outside every tensor: report all whole */
} chg_ctx;

/* The tensor holding address p, or -1. */
static ptrdiff_t tensor_at(const chg_ctx *c, const uint8_t *p)
{
    size_t lo = 0, hi = c->nix;
    while (lo < hi) { /* the first entry starting above p */
        size_t mid = lo + (hi - lo) / 2;
        if (c->ix[mid].lo <= p) lo = mid + 1;
        else hi = mid;
    }
    if (!lo || p >= c->ix[lo - 1].hi) return -1;
    return (ptrdiff_t)c->ix[lo - 1].i;
}

static void visit(void *ctx, const uint8_t *at, unsigned W, uint64_t hi, const uint16_t *lo, size_t k)
{
    chg_ctx *c = ctx;
    ptrdiff_t ti = tensor_at(c, at);
    if (ti < 0) {
        c->lost = true;
        return;
    }
    sub_chg *g = &c->s->chg[ti];
    const ferry_tensor *t = ferry_model_tensor(c->m, (size_t)ti);
    /* a tensor carried whole, or words that are not its elements (sub-byte
     * types are coded per byte) */
    if (!W || t->nbytes * 8 / W != t->nelem) g->all = true;
    if (g->all) return;
    if (!c->fill) {
        c->cnt[ti] += k;
        return;
    }
    uint64_t base = (uint64_t)(at - (const uint8_t *)t->data) / (W / 8) + hi;
    for (size_t j = 0; j < k; j++) {
        int64_t p = (int64_t)(base + lo[j]);
        if (g->n && p <= g->pos[g->n - 1]) g->unsorted = true;
        g->pos[g->n++] = p;
    }
}

/* Lists from the route's records (kept in s since the commit) of the
 * model m; FERRY_OK or FERRY_ERR_NOMEM. */
static int from_records(ferry_subscriber *s, const ferry_model *m)
{
    size_t n = ferry_model_count(m);
    chg_ctx c = {s, m, NULL, 0, NULL, false, false};
    s->chg = ferry__calloc(n + 1, sizeof *s->chg);
    c.ix = ferry__calloc(n + 1, sizeof *c.ix);
    c.cnt = ferry__calloc(n + 1, sizeof *c.cnt);
    int rc = s->chg && c.ix && c.cnt ? FERRY_OK : FERRY_ERR_NOMEM;
    if (rc) goto out;
    s->nchg = n;
    for (size_t i = 0; i < n; i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        if (t->nbytes) c.ix[c.nix++] = (by_addr){t->data, (const uint8_t *)t->data + t->nbytes, i};
    }
    qsort(c.ix, c.nix, sizeof *c.ix, cmp_addr);
    for (size_t i = 1; i < c.nix; i++)
        if (c.ix[i].lo < c.ix[i - 1].hi) { /* tensors sharing memory: a word's tensor is not one */
            s->chg_all = true;
            goto out;
        }
    for (size_t r = 0; r < s->chg_nrec; r++) ferry__codec_undo_visit(s->chg_rec[r], visit, &c);
    if (c.lost) {
        s->chg_all = true;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        sub_chg *g = &s->chg[i];
        const ferry_tensor *t = ferry_model_tensor(m, i);
        if (!g->all && c.cnt[i] > t->nelem / CHG_BUDGET) g->all = true;
        if (g->all || !c.cnt[i]) continue;
        if (c.cnt[i] > SIZE_MAX / 8 || !(g->pos = ferry__malloc((size_t)c.cnt[i] * sizeof *g->pos))) {
            rc = FERRY_ERR_NOMEM;
            goto out;
        }
    }
    c.fill = true;
    for (size_t r = 0; r < s->chg_nrec; r++) ferry__codec_undo_visit(s->chg_rec[r], visit, &c);
    for (size_t i = 0; i < n; i++) {
        sub_chg *g = &s->chg[i];
        if (g->all || !g->n) continue;
        FERRY_ASSERT(g->n == c.cnt[i]);
        if (g->unsorted) { /* several steps, or chunks out of order: the union, sorted */
            qsort(g->pos, g->n, sizeof *g->pos, cmp_i64);
            size_t u = 1;
            for (size_t j = 1; j < g->n; j++)
                if (g->pos[j] != g->pos[u - 1]) g->pos[u++] = g->pos[j];
            g->n = u;
        }
        const ferry_tensor *t = ferry_model_tensor(m, i);
        size_t es = (size_t)(t->nbytes / t->nelem);
        if (!(g->vals = ferry__malloc(g->n * es))) {
            rc = FERRY_ERR_NOMEM;
            goto out;
        }
        for (size_t j = 0; j < g->n; j++) memcpy(g->vals + j * es, (const uint8_t *)t->data + (size_t)g->pos[j] * es, es);
    }
out:
    free(c.ix);
    free(c.cnt);
    return rc;
}

void ferry__sync_sub_changes_set(ferry_subscriber *s, sub_work *w)
{
    ferry__sync_sub_changes_clear(s);
    if (w && w->held && w->nundo) {
        /* the lists are built from the records when first asked for (most
           callers never ask): until then the records are kept, not freed */
        s->chg_rec = w->undo;
        s->chg_nrec = w->nundo;
        w->undo = NULL;
        w->nundo = 0;
        return;
    }
    s->chg_all = true; /* nothing to read positions from: every tensor whole */
}

/* The lists of the records kept, built once. */
static void build(ferry_subscriber *s, const ferry_model *m)
{
    if (!s->chg_nrec) return;
    if (from_records(s, m)) {
        /* no memory for the lists: every tensor whole (always a correct answer) */
        ferry__clear_error();
        ferry__sync_sub_changes_clear(s);
        s->chg_all = true;
    }
    drop_records(s);
}

int ferry_subscriber_changes(ferry_subscriber *s, size_t i, int *all, const int64_t **positions, const void **values,
                             size_t *count)
{
    if (!s) return ferry__fail(FERRY_ERR_ARG, "ferry_subscriber_changes: NULL subscriber");
    const ferry_model *m = ferry_subscriber_model(s);
    if (!m) return ferry__fail(FERRY_ERR_NOT_FOUND, "run %s: the subscriber holds no version", s->run);
    if (i >= ferry_model_count(m))
        return ferry__fail(FERRY_ERR_ARG, "run %s: tensor %zu of a model of %zu", s->run, i, ferry_model_count(m));
    build(s, m);
    const sub_chg *g = s->chg_all || i >= s->nchg ? NULL : &s->chg[i];
    if (all) *all = s->chg_all || (g && g->all);
    if (positions) *positions = g && !g->all ? g->pos : NULL;
    if (values) *values = g && !g->all ? g->vals : NULL;
    if (count) *count = g && !g->all ? g->n : 0;
    return FERRY_OK;
}
