/* lib/loco's MPI exchange against a serial reference, under
 * `mpirun -np R` (tests/scripts/loco_mpi.sh runs it with R = 3).
 *
 * Every rank can compute every rank's synthetic local weights (a pure
 * function of rank, round and index), so each rank replays the whole
 * algorithm serially — gate per rank with its own residual, sum in rank
 * order, divide, outer step — and the exchange must give exactly those
 * bits.  Also: DiLoCo and the DDP mean against their references; a failure
 * on one rank ends the collective on every rank (FERRY_ERR_LOCO_PEER) and
 * changes nothing; disagreeing weights fail everywhere, naming the round;
 * mismatched sizes at creation. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry_loco.h"

static int rank, nranks, cases, failed_cases, case_failed;

#define EXPECT(c)                                                                              \
    do {                                                                                       \
        if (!(c)) {                                                                            \
            case_failed = 1;                                                                   \
            fprintf(stderr, "rank %d: %s:%d: EXPECT failed: %s (last error: %s)\n", rank,      \
                    __FILE__, __LINE__, #c, ferry_last_error());                               \
        }                                                                                      \
    } while (0)

/* A case passes when it passed on every rank. */
static void run_case(void (*fn)(void), const char *name)
{
    case_failed = 0;
    fn();
    int any = 0;
    MPI_Allreduce(&case_failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    cases++;
    if (any) failed_cases++;
    if (rank == 0) printf("%s %s\n", any ? "FAIL" : "ok  ", name);
    fflush(stdout);
}
#define RUN(fn) run_case(fn, #fn)

enum { N = 6000 };

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
static double unit(uint64_t a, uint64_t b, uint64_t c)
{
    return (double)(mix(mix(mix(a) ^ b) ^ c) >> 11) * 0x1.0p-53;
}

static void init_weights(float *w)
{
    for (int i = 0; i < N; i++) w[i] = (float)((unit(1, 0, (uint64_t)i) - 0.5) * 0.2);
}

/* Rank r's weights after its local steps of round t: global minus a
 * rank-specific move from far below a BF16 cell to a few cells.  Such
 * moves are multiples of the global weight's FP32 ULP, so their sums are
 * often exact in any order; `wild` draws local weights independent of the
 * global ones instead, whose sums round, so that summing the ranks in
 * another order than 0..R-1 shows. */
static int wild;
static void local_of(const float *global, int r, int t, float *out)
{
    uint64_t k = (uint64_t)(r * 1000 + t);
    for (int i = 0; i < N; i++) {
        if (wild) {
            out[i] = (float)((unit(5, k, (uint64_t)i) - 0.5) * 0.2);
            continue;
        }
        double scale = fabs((double)global[i]) * pow(2.0, -14.0 + 10.0 * unit(2, k, (uint64_t)i));
        out[i] = global[i] - (float)((unit(3, k, (uint64_t)i) - 0.45) * scale);
    }
}

/* The serial reference of PULSELoCo / DiLoCo for every rank: with the
 * outer gate, each rank's own momentum turns its δ into an update that is
 * gated, and the global step is the plain mean of what was sent; with the
 * gate "sent", δ is gated and the outer step runs on the mean. */
typedef struct ref {
    float global[N], momentum[N], acc[N], local[N], upd[N];
    float residual[16][N], rank_mom[16][N];
    ferry_loco_sparse sp;
} ref;

static void ref_round(ref *x, int pulse, const ferry_loco_config *c, int t)
{
    int outer = pulse && c->gate == FERRY_LOCO_GATE_OUTER;
    memset(x->acc, 0, sizeof x->acc);
    for (int r = 0; r < nranks; r++) {
        local_of(x->global, r, t, x->local);
        for (int i = 0; i < N; i++) x->upd[i] = x->global[i] - x->local[i];
        if (outer) ferry_loco_outer_update(&c->outer, x->rank_mom[r], x->upd, x->upd, N);
        if (pulse) {
            ferry_loco_gate_update(x->global, x->upd, x->residual[r], N, c->values, &x->sp);
            for (uint64_t k = 0; k < x->sp.count; k++) x->acc[x->sp.idx[k]] += x->sp.val[k];
        } else {
            for (int i = 0; i < N; i++) x->acc[i] += x->upd[i];
        }
    }
    for (int i = 0; i < N; i++) x->acc[i] /= (float)nranks;
    if (outer)
        for (int i = 0; i < N; i++) x->global[i] = x->global[i] - x->acc[i];
    else
        ferry_loco_outer_step(&c->outer, x->global, x->momentum, x->acc, N);
}

static void exchange_matches_with(ferry_loco_mode mode, int wild_locals, int gate, int values)
{
    wild = wild_locals;
    static ref x;
    memset(&x, 0, sizeof x);
    init_weights(x.global);
    ferry_loco_config cfg = ferry_loco_config_default();
    cfg.mode = mode;
    cfg.gate = gate;
    cfg.values = values;
    ferry_loco *s = NULL;
    EXPECT(ferry_loco_create(MPI_COMM_WORLD, x.global, N, &cfg, &s) == 0);
    if (!s) return;
    float *local = malloc(N * sizeof *local);
    for (int t = 0; t < 6; t++) {
        local_of(ferry_loco_global(s), rank, t, local);
        ferry_loco_stats st;
        EXPECT(ferry_loco_sync(s, local, &st) == 0);
        ref_round(&x, mode == FERRY_LOCO_PULSE, &cfg, t);
        EXPECT(memcmp(local, x.global, sizeof x.global) == 0);
        EXPECT(memcmp(ferry_loco_global(s), x.global, sizeof x.global) == 0);
        EXPECT(st.round == (uint64_t)t && ferry_loco_round(s) == (uint64_t)t + 1);
        uint8_t h[16];
        ferry_loco_hash(x.global, N, h);
        EXPECT(memcmp(h, st.hash, 16) == 0);
        if (mode == FERRY_LOCO_PULSE) {
            /* a real mix of sent and held entries, and bytes to match */
            EXPECT(wild || (st.gated_fraction > 0.05 && st.gated_fraction < 0.95));
            EXPECT(st.bytes_rank > FERRY_LOCO_HEADER_SIZE && st.bytes_rank < (uint64_t)N * 4);
        } else {
            EXPECT(st.bytes_rank == (uint64_t)N * 4 && st.gated_fraction == 1.0);
        }
        EXPECT(st.bytes_all >= st.bytes_rank && st.nranks == nranks);
    }
    free(local);
    ferry_loco_free(s);
    ferry_loco_sparse_release(&x.sp);
    wild = 0;
}

static void exchange_matches(ferry_loco_mode mode, int wild_locals)
{
    exchange_matches_with(mode, wild_locals, ferry_loco_config_default().gate, ferry_loco_config_default().values);
}

static void test_pulse_matches_serial(void) { exchange_matches(FERRY_LOCO_PULSE, 0); }
/* every gate and value coding, the original (sent, FP32) included */
static void test_pulse_codings(void)
{
    exchange_matches_with(FERRY_LOCO_PULSE, 0, FERRY_LOCO_GATE_SENT, FERRY_LOCO_VALUES_FP32);
    exchange_matches_with(FERRY_LOCO_PULSE, 0, FERRY_LOCO_GATE_SENT, FERRY_LOCO_VALUES_CELL);
    exchange_matches_with(FERRY_LOCO_PULSE, 0, FERRY_LOCO_GATE_OUTER, FERRY_LOCO_VALUES_FP32);
    exchange_matches_with(FERRY_LOCO_PULSE, 1, FERRY_LOCO_GATE_OUTER, FERRY_LOCO_VALUES_CELL);
}
static void test_diloco_matches_serial(void) { exchange_matches(FERRY_LOCO_DILOCO, 0); }
static void test_pulse_order_exact(void) { exchange_matches(FERRY_LOCO_PULSE, 1); }
static void test_diloco_order_exact(void) { exchange_matches(FERRY_LOCO_DILOCO, 1); }

static void test_ddp_mean(void)
{
    float *w = malloc(N * sizeof *w), *v = malloc(N * sizeof *v), *want = calloc(N, sizeof *want);
    init_weights(w);
    ferry_loco_config cfg = ferry_loco_config_default();
    cfg.mode = FERRY_LOCO_DDP;
    ferry_loco *s = NULL;
    EXPECT(ferry_loco_create(MPI_COMM_WORLD, w, N, &cfg, &s) == 0);
    if (!s) goto out;
    for (int r = 0; r < nranks; r++)
        for (int i = 0; i < N; i++) want[i] += (float)(unit(4, (uint64_t)r, (uint64_t)i) - 0.5);
    for (int i = 0; i < N; i++) {
        want[i] /= (float)nranks;
        v[i] = (float)(unit(4, (uint64_t)rank, (uint64_t)i) - 0.5);
    }
    uint64_t bytes = 0;
    EXPECT(ferry_loco_mean(s, v, &bytes) == 0);
    EXPECT(bytes == (uint64_t)N * 4);
    EXPECT(memcmp(v, want, N * sizeof *v) == 0);
    float dummy[1] = {0};
    EXPECT(ferry_loco_sync(s, dummy, NULL) == FERRY_ERR_LOCO_MODE);
    EXPECT(ferry_loco_check(s, w, 3, NULL) == 0);
out:
    ferry_loco_free(s);
    free(w), free(v), free(want);
}

/* A reference at round 0 and the object it must match (NULL on failure). */
static ferry_loco *fresh(ref *x, const ferry_loco_config *cfg)
{
    memset(x, 0, sizeof *x);
    init_weights(x->global);
    ferry_loco *s = NULL;
    EXPECT(ferry_loco_create(MPI_COMM_WORLD, x->global, N, cfg, &s) == 0);
    return s;
}

/* Rank 1 (or 0 alone) fails its gate with a NaN: every rank returns, the
 * failing one with its own code, the others with PEER naming it; nothing
 * changes, and the next round goes through. */
static void test_peer_failure(void)
{
    static ref x;
    ferry_loco_config cfg = ferry_loco_config_default();
    ferry_loco *s = fresh(&x, &cfg);
    if (!s) return;
    int bad = nranks > 1 ? 1 : 0;
    float *local = malloc(N * sizeof *local), *before = malloc(N * sizeof *before);
    memcpy(before, ferry_loco_global(s), N * sizeof *before);
    local_of(before, rank, 0, local);
    if (rank == bad) local[17] = NAN;
    int rc = ferry_loco_sync(s, local, NULL);
    if (rank == bad) {
        EXPECT(rc == FERRY_ERR_LOCO_VALUE);
    } else {
        EXPECT(rc == FERRY_ERR_LOCO_PEER);
        char want[32];
        snprintf(want, sizeof want, "rank %d failed", bad);
        EXPECT(strstr(ferry_last_error(), want) != NULL);
    }
    EXPECT(memcmp(before, ferry_loco_global(s), N * sizeof *before) == 0);
    EXPECT(ferry_loco_round(s) == 0);
    /* the failed round left residuals and momentum as they were: the retry
     * is round 0 of the reference */
    local_of(ferry_loco_global(s), rank, 0, local);
    EXPECT(ferry_loco_sync(s, local, NULL) == 0);
    ref_round(&x, 1, &cfg, 0);
    EXPECT(memcmp(local, x.global, sizeof x.global) == 0);
    free(local), free(before);
    ferry_loco_free(s);
    ferry_loco_sparse_release(&x.sp);
}

/* The payload hook of lib/loco/exchange.c (tests only): rank `victim`
 * damages its own payload after encoding, before the exchange. */
extern void (*ferry__loco_tamper)(unsigned char **payload, size_t *size);
extern uint64_t ferry__loco_checksum(const unsigned char *hdr, const unsigned char *body, size_t body_len);
static int tamper_kind;

static void reseal(unsigned char *p, size_t size)
{
    uint64_t c = ferry__loco_checksum(p, p + 64, size - 64);
    for (int i = 0; i < 8; i++) p[56 + i] = (unsigned char)(c >> (8 * i));
}

static void tamper(unsigned char **p, size_t *size)
{
    switch (tamper_kind) {
    case 0: *size -= 3; break;                       /* truncated */
    case 1: (*p)[*size - 2] ^= 0x10; break;          /* a bit flipped in the body */
    case 2: {                                        /* bytes after the body */
        unsigned char *q = realloc(*p, *size + 100);
        if (!q) break;
        memset(q + *size, 0xAB, 100);
        *p = q;
        *size += 100;
        break;
    }
    case 3: (*p)[32] = 0xFF, (*p)[33] = 0xFF, (*p)[34] = 0xFF; break; /* count > n */
    case 4: (*p)[8] ^= 1, reseal(*p, *size); break;  /* another round, checksum fixed */
    case 5: (*p)[5] = 1, reseal(*p, *size); break;   /* cell values declared FP32 */
    }
}

/* A bad payload from one rank is refused on every rank with the same
 * code, naming the rank; nothing changes; the next clean round is the
 * reference's round 0. */
static void test_bad_payloads(void)
{
    static const int want[] = {FERRY_ERR_LOCO_TRUNCATED, FERRY_ERR_LOCO_CHECKSUM, FERRY_ERR_LOCO_TRAILING,
                               FERRY_ERR_LOCO_COUNT, FERRY_ERR_LOCO_ROUND, FERRY_ERR_LOCO_CORRUPT};
    static ref x;
    ferry_loco_config cfg = ferry_loco_config_default();
    ferry_loco *s = fresh(&x, &cfg);
    if (!s) return;
    int victim = nranks - 1;
    float *local = malloc(N * sizeof *local), *before = malloc(N * sizeof *before);
    memcpy(before, ferry_loco_global(s), N * sizeof *before);
    char name[32];
    snprintf(name, sizeof name, "payload of rank %d", victim);
    for (tamper_kind = 0; tamper_kind < (int)(sizeof want / sizeof want[0]); tamper_kind++) {
        local_of(before, rank, 0, local);
        ferry__loco_tamper = rank == victim ? tamper : NULL;
        int rc = ferry_loco_sync(s, local, NULL);
        ferry__loco_tamper = NULL;
        if (rc != want[tamper_kind])
            fprintf(stderr, "rank %d: tamper %d: %d (%s)\n", rank, tamper_kind, rc, ferry_last_error());
        EXPECT(rc == want[tamper_kind]);
        EXPECT(tamper_kind == 4 ? strstr(ferry_last_error(), "rank") != NULL
                                : strstr(ferry_last_error(), name) != NULL);
        EXPECT(memcmp(before, ferry_loco_global(s), N * sizeof *before) == 0 && ferry_loco_round(s) == 0);
    }
    local_of(ferry_loco_global(s), rank, 0, local);
    EXPECT(ferry_loco_sync(s, local, NULL) == 0);
    ref_round(&x, 1, &cfg, 0);
    EXPECT(memcmp(local, x.global, sizeof x.global) == 0);
    free(local), free(before);
    ferry_loco_free(s);
    ferry_loco_sparse_release(&x.sp);
}

static void test_divergence_detected(void)
{
    float *w = malloc(N * sizeof *w);
    init_weights(w);
    ferry_loco_config cfg = ferry_loco_config_default();
    ferry_loco *s = NULL;
    EXPECT(ferry_loco_create(MPI_COMM_WORLD, w, N, &cfg, &s) == 0);
    if (s) {
        EXPECT(ferry_loco_check(s, w, 7, NULL) == 0);
        w[N - 1] = (float)rank; /* rank 0 agrees with itself only */
        int rc = ferry_loco_check(s, w, 7, NULL);
        EXPECT(nranks == 1 ? rc == 0 : rc == FERRY_ERR_LOCO_DIVERGED);
        if (nranks > 1) {
            EXPECT(strstr(ferry_last_error(), "round 7") != NULL);
            EXPECT(strstr(ferry_last_error(), "rank 1 holds") != NULL);
        }
        ferry_loco_free(s);
    }
    /* differing initial weights are refused at creation */
    s = NULL;
    EXPECT(ferry_loco_create(MPI_COMM_WORLD, w, N, &cfg, &s) == (nranks > 1 ? FERRY_ERR_LOCO_DIVERGED : 0));
    ferry_loco_free(s);
    free(w);
}

static void test_create_mismatch(void)
{
    float *w = calloc(N, sizeof *w);
    ferry_loco_config cfg = ferry_loco_config_default();
    ferry_loco *s = NULL;
    /* n differs on odd ranks */
    int rc = ferry_loco_create(MPI_COMM_WORLD, w, N - (uint64_t)(rank & 1), &cfg, &s);
    EXPECT(nranks == 1 ? rc == 0 : rc == FERRY_ERR_ARG);
    ferry_loco_free(s);
    s = NULL;
    /* a bad setting on one rank fails creation everywhere */
    if (rank == nranks - 1) cfg.outer.momentum = 1.5f;
    rc = ferry_loco_create(MPI_COMM_WORLD, w, N, &cfg, &s);
    EXPECT(rc == (rank == nranks - 1 ? FERRY_ERR_ARG : FERRY_ERR_LOCO_PEER) && s == NULL);
    /* under the outer gate each rank runs its own outer step: settings that
     * differ are refused on every rank (they would not show as divergence);
     * under the gate "sent" they are not compared (they diverge, loudly) */
    cfg = ferry_loco_config_default();
    if (rank == nranks - 1) cfg.outer.lr = 0.71f;
    rc = ferry_loco_create(MPI_COMM_WORLD, w, N, &cfg, &s);
    EXPECT(nranks == 1 ? rc == 0 : rc == FERRY_ERR_ARG && s == NULL);
    if (nranks > 1) EXPECT(strstr(ferry_last_error(), "outer settings must agree") != NULL);
    ferry_loco_free(s);
    s = NULL;
    cfg.gate = FERRY_LOCO_GATE_SENT;
    EXPECT(ferry_loco_create(MPI_COMM_WORLD, w, N, &cfg, &s) == 0);
    ferry_loco_free(s);
    s = NULL;
    /* and so are gate and value coding, in any case */
    cfg = ferry_loco_config_default();
    if (rank == 0) cfg.values = FERRY_LOCO_VALUES_FP32;
    rc = ferry_loco_create(MPI_COMM_WORLD, w, N, &cfg, &s);
    EXPECT(nranks == 1 ? rc == 0 : rc == FERRY_ERR_ARG && s == NULL);
    ferry_loco_free(s);
    free(w);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks > 16) {
        if (rank == 0) fprintf(stderr, "test_loco_mpi: at most 16 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    RUN(test_pulse_matches_serial);
    RUN(test_pulse_codings);
    RUN(test_bad_payloads);
    RUN(test_diloco_matches_serial);
    RUN(test_pulse_order_exact);
    RUN(test_diloco_order_exact);
    RUN(test_ddp_mean);
    RUN(test_peer_failure);
    RUN(test_divergence_detected);
    RUN(test_create_mismatch);
    if (rank == 0) printf("mpi: %d passed, %d failed (%d ranks)\n", cases - failed_cases, failed_cases, nranks);
    MPI_Finalize();
    return failed_cases != 0;
}
