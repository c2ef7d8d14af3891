/* The exchange over MPI: PULSELoCo and DiLoCo rounds, DDP's mean, and the
 * cross-rank weight check (ferry_loco.h).
 *
 * Every collective starts with an exchange of each rank's local status, so
 * that a failure on one rank (a non-finite pseudo-gradient, no memory)
 * ends the call on every rank with a named error instead of leaving the
 * others blocked in a collective the failed rank never enters. */
#define FERRY_LOCO_MPI_SOURCE
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "loco.h"

struct ferry_loco {
    MPI_Comm comm;
    int rank, size;
    ferry_loco_config cfg;
    uint64_t n, round;
    float *global;     /* θ_g */
    float *momentum;   /* outer momentum: identical on every rank, except for
                          the outer gate's, which is this rank's own b_r */
    float *mom_next;   /* outer gate: b_r advanced on a copy, kept on success */
    float *residual;   /* PULSE: error feedback e */
    float *res_next;   /* PULSE: the gate works on a copy, kept only on success */
    float *acc;        /* n: DiLoCo's δ, then the sum / mean */
    float *gather;     /* size·n: dense contributions of every rank */
    ferry_loco_sparse sp, dec;
    uint8_t *recv;     /* PULSE: every rank's payload, back to back */
    size_t recv_cap;
    int *counts, *displs;
    uint64_t *status;  /* size × STATUS_WORDS */
};

enum { STATUS_WORDS = 4 };

void (*ferry__loco_tamper)(unsigned char **payload, size_t *size); /* status, then up to three values per rank */

static int mpi_fail(int mrc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mrc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", mrc);
    return ferry__fail(FERRY_ERR_LOCO_MPI, "loco: %s: %s", what, msg);
}

/* Gathers (rc, v0, v1, v2) of every rank into s->status.  Returns rc if it
 * is non-zero (this rank's own message stays), else FERRY_ERR_LOCO_PEER
 * naming the first rank that failed, else 0. */
static int agree(ferry_loco *s, int rc, const char *what, uint64_t v0, uint64_t v1, uint64_t v2)
{
    uint64_t mine[STATUS_WORDS] = {(uint64_t)(int64_t)rc, v0, v1, v2};
    int mrc = MPI_Allgather(mine, STATUS_WORDS, MPI_UINT64_T, s->status, STATUS_WORDS, MPI_UINT64_T,
                            s->comm);
    if (mrc != MPI_SUCCESS) return mpi_fail(mrc, what);
    if (rc) return rc;
    for (int r = 0; r < s->size; r++) {
        int prc = (int)(int64_t)s->status[(size_t)r * STATUS_WORDS];
        if (prc)
            return ferry__fail(FERRY_ERR_LOCO_PEER, "loco: %s (round %llu): rank %d failed: %s (%d)",
                               what, (unsigned long long)s->round, r, ferry_strerror(prc), prc);
    }
    return FERRY_OK;
}

static uint64_t peer_value(const ferry_loco *s, int r, int k)
{
    return s->status[(size_t)r * STATUS_WORDS + 1 + (size_t)k];
}

/* The check behind ferry_loco_check, for any label ("round 7", "initial
 * weights"). */
static int check_hash(ferry_loco *s, const float *w, const char *label, uint8_t hash[16])
{
    uint8_t mine[16];
    ferry_loco_hash(w, s->n, mine);
    if (hash) memcpy(hash, mine, 16);
    uint8_t *all = ferry__malloc((size_t)s->size * 16);
    int rc = agree(s, all ? 0 : FERRY_ERR_NOMEM, "weight check", 0, 0, 0);
    if (rc) {
        free(all);
        return rc;
    }
    int mrc = MPI_Allgather(mine, 16, MPI_BYTE, all, 16, MPI_BYTE, s->comm);
    if (mrc != MPI_SUCCESS) {
        free(all);
        return mpi_fail(mrc, "weight check");
    }
    char msg[768], h0[33], hr[33];
    size_t len = 0;
    int bad = 0;
    ferry__hex(h0, all, 16);
    for (int r = 1; r < s->size; r++) {
        if (!memcmp(all + (size_t)r * 16, all, 16)) continue;
        ferry__hex(hr, all + (size_t)r * 16, 16);
        if (!bad++)
            len += (size_t)snprintf(msg, sizeof msg, "rank 0 holds %s", h0);
        if (len < sizeof msg)
            len += (size_t)snprintf(msg + len, sizeof msg - len, ", rank %d holds %s", r, hr);
    }
    free(all);
    if (bad)
        return ferry__fail(FERRY_ERR_LOCO_DIVERGED,
                           "loco: %s: weights differ across ranks (%d of %d disagree with rank 0; this is rank %d): %s",
                           label, bad, s->size, s->rank, msg);
    return FERRY_OK;
}

ferry_loco_config ferry_loco_config_default(void)
{
    return (ferry_loco_config){.mode = FERRY_LOCO_PULSE, .outer = ferry_loco_outer_default(), .level = 1,
                               .gate = FERRY_LOCO_GATE_OUTER, .values = FERRY_LOCO_VALUES_CELL};
}

static int outer_gate(const ferry_loco *s)
{
    return s->cfg.mode == FERRY_LOCO_PULSE && s->cfg.gate == FERRY_LOCO_GATE_OUTER;
}

/* Everything but the status words, which create allocates first. */
static int alloc_state(ferry_loco *s)
{
    size_t n = (size_t)s->n;
    s->counts = ferry__calloc((size_t)s->size, sizeof *s->counts);
    s->displs = ferry__calloc((size_t)s->size, sizeof *s->displs);
    s->global = ferry__malloc(n * sizeof *s->global);
    s->acc = ferry__malloc(n * sizeof *s->acc);
    if (!s->counts || !s->displs || !s->global || !s->acc) return FERRY_ERR_NOMEM;
    if (s->cfg.mode != FERRY_LOCO_DDP && !(s->momentum = ferry__calloc(n, sizeof *s->momentum)))
        return FERRY_ERR_NOMEM;
    if (s->cfg.mode == FERRY_LOCO_PULSE &&
        (!(s->residual = ferry__calloc(n, sizeof *s->residual)) ||
         !(s->res_next = ferry__malloc(n * sizeof *s->res_next))))
        return FERRY_ERR_NOMEM;
    if (outer_gate(s) && !(s->mom_next = ferry__malloc(n * sizeof *s->mom_next))) return FERRY_ERR_NOMEM;
    return FERRY_OK;
}

static int check_config(uint64_t n, const ferry_loco_config *cfg)
{
    /* n bounds the dense collectives' int counts (and the payloads' sizes). */
    if (n == 0 || n > (uint64_t)INT_MAX / 4)
        return ferry__fail(FERRY_ERR_LIMIT, "loco create: %llu weights (1..%d supported)",
                           (unsigned long long)n, INT_MAX / 4);
    if ((unsigned)cfg->mode > FERRY_LOCO_DDP || cfg->level < 0 || cfg->level > 19)
        return ferry__fail(FERRY_ERR_ARG, "loco create: mode %d, level %d", (int)cfg->mode, cfg->level);
    if ((cfg->gate != FERRY_LOCO_GATE_SENT && cfg->gate != FERRY_LOCO_GATE_OUTER) ||
        (cfg->values != FERRY_LOCO_VALUES_FP32 && cfg->values != FERRY_LOCO_VALUES_CELL))
        return ferry__fail(FERRY_ERR_ARG, "loco create: gate %d, values %d", cfg->gate, cfg->values);
    if (!isfinite(cfg->outer.lr) || !isfinite(cfg->outer.momentum) || cfg->outer.lr < 0 ||
        cfg->outer.momentum < 0 || cfg->outer.momentum >= 1)
        return ferry__fail(FERRY_ERR_ARG, "loco create: outer lr %g, momentum %g",
                           (double)cfg->outer.lr, (double)cfg->outer.momentum);
    return FERRY_OK;
}

int ferry_loco_create(MPI_Comm comm, const float *init, uint64_t n, const ferry_loco_config *cfg,
                      ferry_loco **out)
{
    if (!out || !init || !cfg) return ferry__fail(FERRY_ERR_ARG, "loco create: NULL argument");
    *out = NULL;
    ferry_loco *s = ferry__calloc(1, sizeof *s);
    if (!s) return FERRY_ERR_NOMEM; /* (the other ranks would block: a ~200-byte allocation) */
    s->comm = MPI_COMM_NULL;
    int mrc = MPI_Comm_dup(comm, &s->comm);
    if (mrc != MPI_SUCCESS) {
        free(s);
        return mpi_fail(mrc, "MPI_Comm_dup");
    }
    /* Report MPI failures as status codes on our own communicator rather
     * than aborting the job from inside the library. */
    MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(s->comm, &s->rank);
    MPI_Comm_size(s->comm, &s->size);
    s->cfg = *cfg;
    s->n = n;
    s->status = ferry__calloc((size_t)s->size * STATUS_WORDS, sizeof *s->status);
    if (!s->status) {
        ferry_loco_free(s);
        return FERRY_ERR_NOMEM;
    }
    int rc = check_config(n, cfg);
    if (!rc) rc = alloc_state(s);
    /* Gate and value coding decide what a payload means, so they must
     * agree.  So must the outer settings under the outer gate: each rank
     * applies its own there, and ranks configured differently would keep
     * the same global weights while computing something else. */
    uint64_t v1 = (uint64_t)cfg->mode, v2 = 0;
    if (!rc) {
        v2 = (uint64_t)cfg->gate | (uint64_t)cfg->values << 8;
        if (cfg->mode == FERRY_LOCO_PULSE && cfg->gate == FERRY_LOCO_GATE_OUTER) {
            uint32_t lr, mu;
            memcpy(&lr, &cfg->outer.lr, 4);
            memcpy(&mu, &cfg->outer.momentum, 4);
            v1 |= (uint64_t)mu << 32;
            v2 |= (uint64_t)(cfg->outer.nesterov != 0) << 16 | (uint64_t)lr << 32;
        }
    }
    rc = agree(s, rc, "create", n, v1, v2);
    for (int r = 0; !rc && r < s->size; r++)
        if (peer_value(s, r, 0) != n || peer_value(s, r, 1) != v1 || peer_value(s, r, 2) != v2)
            rc = ferry__fail(FERRY_ERR_ARG, "loco create: rank %d has %llu weights, mode and outer momentum %#llx, "
                             "gate, values, outer lr %#llx; rank %d %llu, %#llx, %#llx (n, mode, gate, values "
                             "and, with the outer gate, the outer settings must agree)",
                             r, (unsigned long long)peer_value(s, r, 0), (unsigned long long)peer_value(s, r, 1),
                             (unsigned long long)peer_value(s, r, 2), s->rank, (unsigned long long)n,
                             (unsigned long long)v1, (unsigned long long)v2);
    if (!rc) {
        memcpy(s->global, init, (size_t)n * sizeof *init);
        rc = check_hash(s, s->global, "initial weights", NULL);
    }
    if (rc) {
        ferry_loco_free(s);
        return rc;
    }
    *out = s;
    return FERRY_OK;
}

void ferry_loco_free(ferry_loco *s)
{
    if (!s) return;
    if (s->comm != MPI_COMM_NULL) MPI_Comm_free(&s->comm);
    free(s->global);
    free(s->momentum);
    free(s->mom_next);
    free(s->residual);
    free(s->res_next);
    free(s->acc);
    free(s->gather);
    free(s->recv);
    free(s->counts);
    free(s->displs);
    free(s->status);
    ferry_loco_sparse_release(&s->sp);
    ferry_loco_sparse_release(&s->dec);
    free(s);
}

int ferry_loco_rank(const ferry_loco *s) { return s->rank; }
int ferry_loco_size(const ferry_loco *s) { return s->size; }
const float *ferry_loco_global(const ferry_loco *s) { return s->global; }
uint64_t ferry_loco_round(const ferry_loco *s) { return s->round; }

int ferry_loco_check(ferry_loco *s, const float *w, uint64_t round, uint8_t hash[16])
{
    if (!s || !w) return ferry__fail(FERRY_ERR_ARG, "loco check: NULL argument");
    char label[48];
    snprintf(label, sizeof label, "round %llu", (unsigned long long)round);
    return check_hash(s, w, label, hash);
}

/* s->gather = every rank's n floats (rank-major), after agreeing on rc. */
static int gather_dense(ferry_loco *s, int rc, const float *mine, const char *what)
{
    if (!rc && !s->gather && !(s->gather = ferry__malloc((size_t)s->size * (size_t)s->n * sizeof(float))))
        rc = FERRY_ERR_NOMEM;
    if ((rc = agree(s, rc, what, 0, 0, 0))) return rc;
    int mrc = MPI_Allgather(mine, (int)s->n, MPI_FLOAT, s->gather, (int)s->n, MPI_FLOAT, s->comm);
    return mrc == MPI_SUCCESS ? FERRY_OK : mpi_fail(mrc, what);
}

/* acc = (Σ_r contribution_r) / size, the sum in rank order from +0. */
static void mean_dense(ferry_loco *s)
{
    size_t n = (size_t)s->n;
    memset(s->acc, 0, n * sizeof *s->acc);
    for (int r = 0; r < s->size; r++) {
        const float *v = s->gather + (size_t)r * n;
        for (size_t i = 0; i < n; i++) s->acc[i] += v[i];
    }
    const float R = (float)s->size;
    for (size_t i = 0; i < n; i++) s->acc[i] /= R;
}

int ferry_loco_mean(ferry_loco *s, float *vec, uint64_t *bytes)
{
    if (!s || !vec) return ferry__fail(FERRY_ERR_ARG, "loco mean: NULL argument");
    int rc = gather_dense(s, 0, vec, "mean");
    if (rc) return rc;
    mean_dense(s);
    memcpy(vec, s->acc, (size_t)s->n * sizeof *vec);
    if (bytes) *bytes = s->n * 4;
    return FERRY_OK;
}

/* The gate for either kind: the outer gate runs this rank's outer step on
 * δ first (its momentum advanced in s->mom_next) and gates the update. */
static int pulse_gate(ferry_loco *s, const float *local)
{
    size_t n = (size_t)s->n;
    memcpy(s->res_next, s->residual, n * sizeof *s->res_next);
    if (!outer_gate(s))
        return ferry__loco_gate(s->global, local, NULL, s->res_next, s->n, s->cfg.values, &s->sp);
    for (size_t i = 0; i < n; i++) s->acc[i] = s->global[i] - local[i];
    memcpy(s->mom_next, s->momentum, n * sizeof *s->mom_next);
    ferry_loco_outer_update(&s->cfg.outer, s->mom_next, s->acc, s->acc, s->n);
    return ferry__loco_gate(s->global, NULL, s->acc, s->res_next, s->n, s->cfg.values, &s->sp);
}

/* PULSE: gate, encode, gather every payload, decode and sum in rank order
 * into s->acc, then divide.  On success s->res_next holds the new
 * residual (and s->mom_next the outer gate's momentum). */
static int pulse_exchange(ferry_loco *s, const float *local, ferry_loco_stats *st)
{
    size_t n = (size_t)s->n;
    void *payload = NULL;
    size_t psize = 0;
    int rc = pulse_gate(s, local);
    if (!rc) {
        ferry_loco_header h = {.round = s->round, .rank = (uint32_t)s->rank, .n = s->n, .count = s->sp.count,
                               .values = s->cfg.values};
        rc = ferry_loco_encode_with(&h, &s->sp, s->global, s->cfg.level, &payload, &psize);
    }
    if (!rc && ferry__loco_tamper) {
        unsigned char *p = payload;
        ferry__loco_tamper(&p, &psize);
        payload = p;
    }
    if ((rc = agree(s, rc, "sync", psize, rc ? 0 : s->sp.count, 0))) {
        free(payload);
        return rc;
    }
    /* Allgatherv counts and displacements are ints: the round's payloads
     * must fit in 2 GiB together (every rank sees the same sizes, so every
     * rank fails alike). */
    uint64_t total = 0;
    for (int r = 0; r < s->size; r++) {
        uint64_t sz = peer_value(s, r, 0);
        if (sz > (uint64_t)INT_MAX || total + sz > (uint64_t)INT_MAX) {
            free(payload);
            return ferry__fail(FERRY_ERR_LIMIT, "loco sync (round %llu): payloads over 2 GiB in one round",
                               (unsigned long long)s->round);
        }
        s->counts[r] = (int)sz;
        s->displs[r] = (int)total;
        total += sz;
        st->bytes_all += sz;
        st->gated_all += peer_value(s, r, 1);
    }
    st->bytes_rank = psize;
    st->gated_rank = s->sp.count;
    if (total > s->recv_cap) {
        uint8_t *p = ferry__realloc(s->recv, (size_t)total);
        rc = p ? FERRY_OK : FERRY_ERR_NOMEM;
        if (p) {
            s->recv = p;
            s->recv_cap = (size_t)total;
        }
    }
    if ((rc = agree(s, rc, "sync buffers", 0, 0, 0))) {
        free(payload);
        return rc;
    }
    int mrc = MPI_Allgatherv(payload, (int)psize, MPI_BYTE, s->recv, s->counts, s->displs, MPI_BYTE, s->comm);
    free(payload);
    if (mrc != MPI_SUCCESS) return mpi_fail(mrc, "sync: MPI_Allgatherv");

    /* Every rank decodes the same bytes, so a bad payload fails everywhere
     * with the same code; own payload included, which checks the round
     * trip. */
    memset(s->acc, 0, n * sizeof *s->acc);
    for (int r = 0; r < s->size; r++) {
        ferry_loco_header h;
        rc = ferry_loco_decode_with(s->recv + s->displs[r], (size_t)s->counts[r], s->n, s->global, &h, &s->dec);
        if (rc) return ferry__context(rc, "loco sync (round %llu): payload of rank %d",
                                      (unsigned long long)s->round, r);
        if (h.values != s->cfg.values)
            return ferry__fail(FERRY_ERR_LOCO_VERSION, "loco sync (round %llu): rank %d sent %s values, this run codes %s",
                               (unsigned long long)s->round, r, h.values ? "cell-coded" : "FP32",
                               s->cfg.values ? "cell-coded" : "FP32");
        if (h.round != s->round || h.rank != (uint32_t)r)
            return ferry__fail(FERRY_ERR_LOCO_ROUND, "loco sync (round %llu): rank %d sent a payload of round %llu, rank %u",
                               (unsigned long long)s->round, r, (unsigned long long)h.round, h.rank);
        for (uint64_t k = 0; k < s->dec.count; k++) s->acc[s->dec.idx[k]] += s->dec.val[k];
    }
    const float R = (float)s->size;
    for (size_t i = 0; i < n; i++) s->acc[i] /= R;
    return FERRY_OK;
}

/* DiLoCo: δ = θ_g − θ_local dense, gathered, mean in rank order. */
static int diloco_exchange(ferry_loco *s, const float *local, ferry_loco_stats *st)
{
    size_t n = (size_t)s->n;
    int rc = FERRY_OK;
    for (size_t i = 0; i < n; i++) {
        s->acc[i] = s->global[i] - local[i];
        if (!rc && !isfinite(s->acc[i]))
            rc = ferry__fail(FERRY_ERR_LOCO_VALUE, "loco sync (round %llu): pseudo-gradient at index %zu is %g",
                             (unsigned long long)s->round, i, (double)s->acc[i]);
    }
    if ((rc = gather_dense(s, rc, s->acc, "sync"))) return rc;
    mean_dense(s);
    st->bytes_rank = s->n * 4;
    st->bytes_all = st->bytes_rank * (uint64_t)s->size;
    st->gated_rank = s->n;
    st->gated_all = s->n * (uint64_t)s->size;
    return FERRY_OK;
}

int ferry_loco_sync(ferry_loco *s, float *local, ferry_loco_stats *st)
{
    if (!s || !local) return ferry__fail(FERRY_ERR_ARG, "loco sync: NULL argument");
    if (s->cfg.mode == FERRY_LOCO_DDP)
        return ferry__fail(FERRY_ERR_LOCO_MODE, "loco sync: DDP has no outer step (use ferry_loco_mean)");
    ferry_loco_stats tmp;
    if (!st) st = &tmp;
    memset(st, 0, sizeof *st);
    st->round = s->round;
    st->n = s->n;
    st->nranks = s->size;
    int rc = s->cfg.mode == FERRY_LOCO_PULSE ? pulse_exchange(s, local, st) : diloco_exchange(s, local, st);
    if (rc) return rc;
    /* From here on every rank runs the same FP32 operations on the same
     * inputs.  A disagreement means a rank computed differently (another
     * binary, other outer settings, corrupted memory): the new weights are
     * kept for inspection, the round fails on every rank. */
    if (outer_gate(s)) {
        /* the ranks' outer steps are in what they sent: apply the mean */
        for (size_t i = 0; i < (size_t)s->n; i++) s->global[i] = s->global[i] - s->acc[i];
    } else {
        ferry_loco_outer_step(&s->cfg.outer, s->global, s->momentum, s->acc, s->n);
    }
    char label[48];
    snprintf(label, sizeof label, "round %llu", (unsigned long long)s->round);
    if ((rc = check_hash(s, s->global, label, st->hash))) return rc;
    st->gated_fraction = (double)st->gated_all / ((double)s->n * s->size);
    if (s->cfg.mode == FERRY_LOCO_PULSE) {
        float *t = s->residual;
        s->residual = s->res_next;
        s->res_next = t;
        if (outer_gate(s)) {
            t = s->momentum;
            s->momentum = s->mom_next;
            s->mom_next = t;
        }
        double l1 = 0;
        for (size_t i = 0; i < (size_t)s->n; i++) l1 += fabs((double)s->residual[i]);
        st->residual_l1 = l1;
    }
    memcpy(local, s->global, (size_t)s->n * sizeof *local);
    s->round++;
    return FERRY_OK;
}
