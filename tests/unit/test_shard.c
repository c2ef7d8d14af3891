/* Sharded publish and sliced pull (include/ferry_shard.h), in one process:
 * R publisher handles stand for R trainer ranks and M subscribers for M
 * island ranks (tests/scripts/shard_mpi.sh runs them as real processes
 * under mpirun).  Every region is compared with the slice of the full
 * checkpoint; every bad input of the issue is a distinct error naming the
 * part, and leaves HEAD and the islands where they were. */
#include "check.h"
#include "ferry_quant.h"
#include "ferry_shard.h"
#include "ferry_sign.h"
#include "shard/shard_impl.h"
#include "../tools/shard_layout.h"

#include <stdint.h>
#include <unistd.h>

static char g_root[256];
static int g_run_no;

static ferry_store *open_store(void)
{
    ferry_store_options o = {.create = 1};
    ferry_store *s = NULL;
    if (ferry_store_open(g_root, &o, &s)) fprintf(stderr, "store: %s\n", ferry_last_error());
    return s;
}

static void new_run(char *run, size_t n) { snprintf(run, n, "t/run-%d", ++g_run_no); }

static ferry_model *step(int i)
{
    char rel[64], path[512];
    snprintf(rel, sizeof rel, "rl-a/step-%03d.safetensors", i);
    ferry_model *m = NULL;
    if (ferry_model_open(data_path(path, sizeof path, rel), &m)) fprintf(stderr, "%s: %s\n", path, ferry_last_error());
    return m;
}

/* R ranks, each with the rows [r*rows/R, (r+1)*rows/R) of every tensor. */
typedef struct group {
    ferry_shard_publisher *p[8];
    int R;
} group;

static const ferry_keys *g_group_keys; /* the next groups' keys (NULL: unsigned) */
static int g_group_quant;              /* the next groups' quantize (0: none) */
static uint64_t g_cut_grid;            /* parts_of's cuts rounded up to multiples of it (0: none) */

static int group_open(group *g, ferry_store *st, const char *run, int R, uint64_t words, uint32_t anchor_every, int cast)
{
    g->R = R;
    for (int r = 0; r < R; r++) {
        ferry_shard_options o = {.rank = (uint32_t)r, .world = (uint32_t)R, .min_tile_words = words, .anchor_every = anchor_every,
                                 .cast_bf16 = cast, .publisher_id = "test-group", .keys = g_group_keys,
                                 .quantize = g_group_quant};
        int rc = ferry_shard_publisher_open(st, run, &o, &g->p[r]);
        if (rc) return rc;
    }
    return 0;
}

static void group_close(group *g)
{
    for (int r = 0; r < g->R; r++) ferry_shard_publisher_free(g->p[r]);
    memset(g, 0, sizeof *g);
}

/* Every case's first lines: a store, a new run name (run[64]) and a group
 * of R ranks on it (tile words W, an anchor every A versions, cast). */
static ferry_store *run_open(char *run, group *g, int R, uint64_t W, uint32_t A, int cast)
{
    ferry_store *st = open_store();
    new_run(run, 64);
    CHECK_OK(group_open(g, st, run, R, W, A, cast));
    return st;
}

/* The parts rank r of R owns in model m. */
static size_t parts_of(const ferry_model *m, int r, int R, ferry_shard_part *out)
{
    size_t n = 0;
    for (size_t i = 0; i < ferry_model_count(m); i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        uint64_t rows, cols;
        ferry__shard_view(t->ndim, t->shape, &rows, &cols);
        uint64_t a = rows * (uint64_t)r / (uint64_t)R, b = rows * (uint64_t)(r + 1) / (uint64_t)R;
        if (g_cut_grid) { /* on the grid: rank r's rows begin where the grid puts its cut */
            a = a % g_cut_grid ? (a / g_cut_grid + 1) * g_cut_grid : a;
            b = b % g_cut_grid ? (b / g_cut_grid + 1) * g_cut_grid : b;
            a = a < rows ? a : rows;
            b = b < rows ? b : rows;
        }
        if (a == b) continue;
        size_t es = ferry_dtype_bits(t->dtype) / 8;
        out[n++] = (ferry_shard_part){t->name, t->dtype, t->ndim, t->shape, a, b, (const uint8_t *)t->data + a * cols * es};
    }
    return n;
}

/* One version from model m through the four steps; returns commit's status. */
static int group_publish(group *g, const ferry_model *m, unsigned flags, ferry_shard_publish_info *info)
{
    char *tok = NULL, *rec[8] = {0};
    size_t tn = 0, rn[8] = {0};
    ferry_shard_part parts[64];
    int rc = ferry_shard_begin(g->p[0], flags, &tok, &tn);
    for (int r = 0; r < g->R && !rc; r++) rc = ferry_shard_put(g->p[r], tok, tn, parts, parts_of(m, r, g->R, parts), &rec[r], &rn[r]);
    if (!rc) rc = ferry_shard_commit(g->p[0], tok, tn, (const char *const *)rec, rn, (size_t)g->R, info);
    for (int r = 0; r < g->R; r++) {
        int f = ferry_shard_finish(g->p[r], rc == 0);
        if (!rc) rc = f;
        ferry_free(rec[r]);
    }
    ferry_free(tok);
    return rc;
}

/* ---- islands ---- */

/* Region i of s equals the slice of model's tensor (BF16). */
static int region_matches(ferry_shard_subscriber *s, size_t i, const ferry_model *model, const ferry_shard_region *r)
{
    uint64_t rows, cols, nb;
    ferry_dtype dt;
    if (ferry_shard_region_shape(s, i, &dt, &rows, &cols, &nb)) return 0;
    uint8_t *buf = malloc(nb + 1);
    int ok = buf && !ferry_shard_region_copy(s, i, buf, nb) && dt == FERRY_BF16 && shard_slice_equal(model, r, buf, rows, cols);
    free(buf);
    return ok;
}

typedef struct island {
    ferry_shard_subscriber *s;
    ferry_shard_region rg[64];
    size_t n;
    uint8_t *prev[64];       /* each region as of the last pull, to check the change lists */
    uint64_t requests;       /* ranged GETs of the last pull */
    uint64_t object_bytes;   /* tile bytes of the last pull */
    uint64_t manifest_bytes; /* HEAD, manifest (layout record) and index bytes of the last pull */
} island;

/* get_bytes: options.get_bytes (0: the default; 1: an index-form object
 * is read whole only when the island wants all of it) */
static int island_open_gb(island *is, ferry_store *st, const char *run, const ferry_model *m, int L, int k, int M,
                          uint64_t get_bytes)
{
    memset(is, 0, sizeof *is);
    is->n = shard_layout(m, L, k, M, is->rg);
    ferry_shard_sub_options so = {.get_bytes = get_bytes};
    return ferry_shard_subscriber_open(st, run, is->rg, is->n, &so, &is->s);
}

static int island_open(island *is, ferry_store *st, const char *run, const ferry_model *m, int L, int k, int M)
{
    return island_open_gb(is, st, run, m, L, k, M, 0);
}

static void island_close(island *is)
{
    ferry_shard_subscriber_free(is->s);
    for (size_t i = 0; i < is->n; i++) free(is->prev[i]);
    memset(is, 0, sizeof *is);
}

/* Pulls version v and checks every region against model, and the change
 * lists against the previous contents.  *frac: object bytes / version bytes. */
static int island_pull(island *is, uint64_t v, const ferry_model *model, double *frac)
{
    ferry_shard_pull_info info;
    int rc = ferry_shard_pull(is->s, FERRY_SYNC_EXACT, v, &info);
    if (rc) return rc;
    if (info.to_version != v) return -1;
    is->requests = info.requests;
    is->object_bytes = info.object_bytes;
    is->manifest_bytes = info.manifest_bytes;
    if (frac) *frac = info.version_bytes ? (double)info.object_bytes / (double)info.version_bytes : 0;
    for (size_t i = 0; i < is->n; i++) {
        if (!region_matches(is->s, i, model, &is->rg[i])) {
            fprintf(stderr, "region %zu (%s [%llu,%llu) x [%llu,%llu)) differs at version %llu\n", i, is->rg[i].name,
                    (unsigned long long)is->rg[i].row_begin, (unsigned long long)is->rg[i].row_end,
                    (unsigned long long)is->rg[i].col_begin, (unsigned long long)is->rg[i].col_end, (unsigned long long)v);
            return -2;
        }
        uint64_t nb;
        ferry_shard_region_shape(is->s, i, NULL, NULL, NULL, &nb);
        int all = 0;
        const int64_t *pos;
        const void *vals;
        size_t cnt;
        if (ferry_shard_region_changes(is->s, i, &all, &pos, &vals, &cnt)) return -3;
        if (!all) { /* the previous contents plus the changes are the new ones */
            if (!is->prev[i]) return -4;
            for (size_t k = 0; k < cnt; k++) {
                if ((uint64_t)pos[k] * 2 >= nb || (k && pos[k] <= pos[k - 1])) return -5;
                memcpy(is->prev[i] + pos[k] * 2, (const uint8_t *)vals + k * 2, 2);
            }
            uint8_t *now = malloc(nb);
            int same = now && !ferry_shard_region_copy(is->s, i, now, nb) && !memcmp(now, is->prev[i], nb);
            free(now);
            if (!same) return -6;
        } else {
            free(is->prev[i]);
            if (!(is->prev[i] = malloc(nb)) || ferry_shard_region_copy(is->s, i, is->prev[i], nb)) return -7;
        }
    }
    return 0;
}

/* ---- cases ---- */

static void t_grid(void)
{
    uint64_t nr, nc;
    ferry__shard_grid(192, 192, 256, &nr, &nc);
    CHECK(nc == 24 && nr == 6);
    ferry__shard_grid(2048, 192, 256, &nr, &nc);
    CHECK(nc == 24 && nr == 32);
    ferry__shard_grid(192, 1, 256, &nr, &nc);
    CHECK(nc == 1 && nr == 1);
    ferry__shard_grid(7, 5, 1, &nr, &nc);
    CHECK(nc == 1 && nr == 1);
    sh_part p = {.name = strdup("w"), .rows = 192, .cols = 192, .r0 = 48, .r1 = 96};
    CHECK_OK(ferry__shard_part_cut(&p, 256));
    /* grid lines at multiples of 32 inside [48, 96): 64 */
    CHECK(p.nrc == 3 && p.rcut[0] == 48 && p.rcut[1] == 64 && p.rcut[2] == 96);
    CHECK(p.ncc == 25 && p.ntiles == 48 && p.tiles[25].r0 == 64 && p.tiles[25].c0 == 8 && p.tiles[25].c1 == 16);
    ferry__shard_part_release(&p);
}

static void t_publish_and_follow(void)
{
    SKIP_UNLESS_DATA("rl-a");
    char run[64];
    group g;
    ferry_store *st = run_open(run, &g, 4, 1024, 3, 0);
    ferry_model *m0 = step(0);
    island rows[2], cols[3]; /* the fused layout runs in tests/scripts/shard_mpi.sh */
    for (int k = 0; k < 2; k++) CHECK_OK(island_open(&rows[k], st, run, m0, L_ROWS, k, 2));
    for (int k = 0; k < 3; k++) CHECK_OK(island_open(&cols[k], st, run, m0, L_COLS, k, 3));
    for (int v = 1; v <= 5; v++) {
        ferry_model *m = step(v - 1);
        ferry_shard_publish_info info;
        CHECK_OK(group_publish(&g, m, 0, &info));
        CHECK(info.version == (uint64_t)v && info.world == 4);
        CHECK(info.kind == (v == 1 || v == 4 ? FERRY_SYNC_ANCHOR : FERRY_SYNC_DELTA));
        double f;
        for (int k = 0; k < 2; k++) {
            CHECK_RC(island_pull(&rows[k], (uint64_t)v, m, &f), 0);
                CHECK(f <= 1.0 / 2 * 1.05);
        }
        for (int k = 0; k < 3; k++) {
            CHECK_RC(island_pull(&cols[k], (uint64_t)v, m, &f), 0);
            /* its share of the tiles, or (the index form, where the
             * objects' leaves would cost more than the tiles it does not
             * want) whole objects in at most R GETs */
            CHECK(f <= 1.0 / 3 * 1.05 || (cols[k].requests <= 4 && f <= 1.0));
        }
        ferry_model_free(m);
    }
    /* a cold island joins at version 5: anchor 4 + chain */
    ferry_model *m4 = step(4);
    island late;
    CHECK_OK(island_open(&late, st, run, m4, L_ROWS, 1, 2));
    CHECK_RC(island_pull(&late, 5, m4, NULL), 0);
    /* and goes back to version 2, through anchor 1 */
    ferry_model *m1 = step(1);
    CHECK_RC(island_pull(&late, 2, m1, NULL), 0);
    ferry_model_free(m1);
    island_close(&late);
    /* a new group of processes (a restart) resumes from its own tiles */
    group_close(&g);
    CHECK_OK(group_open(&g, st, run, 4, 0, 3, 0));
    ferry_model *m5 = step(5);
    CHECK_OK(group_publish(&g, m5, 0, NULL));
    for (int k = 0; k < 2; k++) CHECK_RC(island_pull(&rows[k], 6, m5, NULL), 0);
    ferry_model_free(m5);
    ferry_model_free(m4);
    for (int k = 0; k < 2; k++) island_close(&rows[k]);
    for (int k = 0; k < 3; k++) island_close(&cols[k]);
    ferry_model_free(m0);
    group_close(&g);
    ferry_store_free(st);
}

static void t_fp32_master(void)
{
    SKIP_UNLESS_DATA("rl-a");
    ferry_store *st = open_store();
    char run[64], path[512];
    new_run(run, sizeof run);
    group g;
    CHECK_OK(group_open(&g, st, run, 2, 1024, 10, 1));
    island is;
    for (int v = 1; v <= 3; v++) {
        ferry_model *m = NULL, *b = NULL;
        char rel[64];
        snprintf(rel, sizeof rel, "rl-a/master-%03d.safetensors", v - 1);
        CHECK_OK(ferry_model_open(data_path(path, sizeof path, rel), &m));
        CHECK_OK(ferry__sync_model_copy(m, 1, &b)); /* the BF16 cast, what islands must receive */
        if (v == 1) {
            CHECK_OK(island_open(&is, st, run, b, L_COLS, 1, 2));
            for (size_t i = 0; i < is.n; i++) is.rg[i].name = strdup(is.rg[i].name); /* outlive b */
        }
        CHECK_OK(group_publish(&g, m, 0, NULL));
        CHECK_RC(island_pull(&is, (uint64_t)v, b, NULL), 0);
        ferry_model_free(m);
        ferry_model_free(b);
    }
    for (size_t i = 0; i < is.n; i++) free((char *)is.rg[i].name);
    island_close(&is);
    group_close(&g);
    ferry_store_free(st);
}

/* HEAD's version, 0 if none. */
static uint64_t head_of(ferry_store *st, const char *run)
{
    fs_head h;
    if (ferry__sync_head_read(st, run, NULL, NULL, &h, NULL)) {
        ferry__clear_error();
        return 0;
    }
    return h.version;
}

/* FP8 (quantize, issue 25): 2 ranks cut every tensor on the 128-row grid
 * and quantize their own rows; an island holding every tensor of the FP8
 * model whole (one region each) receives at each version exactly
 * ferry_quantize of the step.  A cut off the grid, the sticky scheme, and
 * a rank without quantize continuing the run are refused, HEAD unchanged. */
static void t_fp8(void)
{
    SKIP_UNLESS_DATA("rl-a");
    ferry_store *st = open_store();
    char run[64];
    new_run(run, sizeof run);
    ferry_shard_options so = {.rank = 0, .world = 2, .quantize = FERRY_QUANT_FP8_BLOCK128_STICKY};
    ferry_shard_publisher *bad = NULL;
    CHECK_RC(ferry_shard_publisher_open(st, run, &so, &bad), FERRY_ERR_UNSUPPORTED);
    group g;
    g_group_quant = FERRY_QUANT_FP8_BLOCK128;
    CHECK_OK(group_open(&g, st, run, 2, 1024, 3, 0));
    ferry_model *m0 = step(0);
    CHECK_RC(group_publish(&g, m0, 0, NULL), FERRY_ERR_SHARD_PARTS); /* 192 rows cut at 96 */
    CHECK(strstr(ferry_last_error(), "cut a 128x128 FP8 block") != NULL);
    ferry_model_free(m0);
    g_cut_grid = FERRY_QUANT_BLOCK;
    ferry_shard_subscriber *s = NULL;
    ferry_shard_region rg[128];
    size_t n = 0;
    for (int v = 1; v <= 4; v++) {
        ferry_model *m = step(v - 1), *q = NULL;
        CHECK_OK(ferry_quantize(m, FERRY_QUANT_FP8_BLOCK128, 0, NULL, &q, NULL));
        ferry_shard_publish_info info;
        CHECK_OK(group_publish(&g, m, 0, &info));
        CHECK(info.version == (uint64_t)v && info.model_bytes == ferry_model_nbytes(q));
        if (v == 1) {
            n = ferry_model_count(q);
            CHECK(n <= 128);
            n = n < 128 ? n : 128;
            for (size_t i = 0; i < n; i++) {
                const ferry_tensor *t = ferry_model_tensor(q, i);
                uint64_t rows, cols;
                ferry__shard_view(t->ndim, t->shape, &rows, &cols);
                rg[i] = (ferry_shard_region){strdup(t->name), 0, rows, 0, cols};
            }
            CHECK_OK(ferry_shard_subscriber_open(st, run, rg, n, NULL, &s));
        }
        CHECK_OK(ferry_shard_pull(s, FERRY_SYNC_EXACT, (uint64_t)v, NULL));
        size_t same = 0, fp8 = 0;
        for (size_t i = 0; i < n; i++) {
            const ferry_tensor *t = ferry_model_find(q, rg[i].name);
            uint64_t rows, cols, nb;
            ferry_dtype dt;
            CHECK_OK(ferry_shard_region_shape(s, i, &dt, &rows, &cols, &nb));
            uint8_t *buf = malloc(nb + 1);
            if (buf && t && dt == t->dtype && nb == t->nbytes && !ferry_shard_region_copy(s, i, buf, nb) && !memcmp(buf, t->data, nb))
                same++;
            fp8 += t && t->dtype == FERRY_F8_E4M3;
            free(buf);
        }
        CHECK(same == n && fp8 > 0);
        if (same != n) fprintf(stderr, "version %d: %zu of %zu tensors as ferry_quantize gives them\n", v, same, n);
        ferry_model_free(q);
        ferry_model_free(m);
    }
    /* the run is FP8: ranks without quantize cannot continue it */
    uint64_t head = head_of(st, run);
    group_close(&g);
    g_group_quant = 0;
    CHECK_OK(group_open(&g, st, run, 2, 1024, 3, 0));
    ferry_model *m = step(4);
    CHECK_RC(group_publish(&g, m, 0, NULL), FERRY_ERR_SHARD_PARTS);
    CHECK(head_of(st, run) == head);
    ferry_model_free(m);
    g_cut_grid = 0;
    for (size_t i = 0; i < n; i++) free((char *)rg[i].name);
    ferry_shard_subscriber_free(s);
    group_close(&g);
    ferry_store_free(st);
}

static int has(const char *needle) { return strstr(ferry_last_error(), needle) != NULL; }

static void t_bad_parts(void)
{
    SKIP_UNLESS_DATA("rl-a");
    char run[64];
    group g;
    ferry_store *st = run_open(run, &g, 2, 1024, 10, 0);
    ferry_model *m = step(0);
    ferry_shard_part p0[64], p1[64];
    size_t n0 = parts_of(m, 0, 2, p0), n1 = parts_of(m, 1, 2, p1);
    char *tok = NULL, *r[2] = {0};
    size_t tn, rn[2];
    int rc;

    /* overlap: rank 1 also claims the last row of rank 0 */
    CHECK_OK(ferry_shard_begin(g.p[0], 0, &tok, &tn));
    CHECK_OK(ferry_shard_put(g.p[0], tok, tn, p0, n0, &r[0], &rn[0]));
    ferry_shard_part q = p1[0];
    q.row_begin -= 1;
    q.data = (const uint8_t *)q.data - ferry_model_tensor(m, 0)->shape[1] * 2;
    ferry_shard_part p1b[64];
    memcpy(p1b, p1, sizeof p1);
    p1b[0] = q;
    CHECK_OK(ferry_shard_put(g.p[1], tok, tn, p1b, n1, &r[1], &rn[1]));
    rc = ferry_shard_commit(g.p[0], tok, tn, (const char *const *)r, rn, 2, NULL);
    CHECK(rc == FERRY_ERR_SHARD_PARTS && has("overlap") && has(p1[0].name));
    ferry_free(r[1]);
    /* gap: rank 1 leaves its first row out */
    p1b[0] = p1[0];
    p1b[0].row_begin += 1;
    p1b[0].data = (const uint8_t *)p1[0].data + ferry_model_tensor(m, 0)->shape[1] * 2;
    CHECK_OK(ferry_shard_put(g.p[1], tok, tn, p1b, n1, &r[1], &rn[1]));
    rc = ferry_shard_commit(g.p[0], tok, tn, (const char *const *)r, rn, 2, NULL);
    CHECK(rc == FERRY_ERR_SHARD_PARTS && has("in no part"));
    ferry_free(r[1]);
    /* duplicate: rank 1 puts rank 0's parts */
    CHECK_OK(ferry_shard_put(g.p[1], tok, tn, p0, n0, &r[1], &rn[1]));
    rc = ferry_shard_commit(g.p[0], tok, tn, (const char *const *)r, rn, 2, NULL);
    CHECK(rc == FERRY_ERR_SHARD_PARTS && has("given twice"));
    ferry_free(r[1]);
    /* a record given twice / a rank missing */
    const char *twice[2] = {r[0], r[0]};
    size_t tw[2] = {rn[0], rn[0]};
    CHECK(ferry_shard_commit(g.p[0], tok, tn, twice, tw, 2, NULL) == FERRY_ERR_SHARD_WORLD);
    CHECK(ferry_shard_commit(g.p[0], tok, tn, twice, tw, 1, NULL) == FERRY_ERR_SHARD_WORLD);
    /* a part outside its tensor */
    p1b[0] = p1[0];
    p1b[0].row_end = p1[0].row_end + 5;
    CHECK(ferry_shard_put(g.p[1], tok, tn, p1b, n1, &r[1], &rn[1]) == FERRY_ERR_SHARD_PARTS && has("outside"));
    /* a record of another version: put against an older token */
    char *tok2 = NULL;
    size_t tn2;
    CHECK_OK(ferry_shard_put(g.p[1], tok, tn, p1, n1, &r[1], &rn[1]));
    CHECK_OK(ferry_shard_begin(g.p[0], 0, &tok2, &tn2)); /* a new publish began: new id */
    rc = ferry_shard_commit(g.p[0], tok2, tn2, (const char *const *)r, rn, 2, NULL);
    CHECK(rc == FERRY_ERR_SHARD_FOREIGN && has("belongs to version"));
    rc = ferry_shard_commit(g.p[0], tok, tn, (const char *const *)r, rn, 2, NULL);
    CHECK(rc == FERRY_ERR_SHARD_FOREIGN); /* the old token is no longer this handle's publish */
    /* a token of another run */
    ferry_shard_publisher *other = NULL;
    ferry_shard_options oo = {.rank = 1, .world = 2};
    CHECK_OK(ferry_shard_publisher_open(st, "t/other", &oo, &other));
    char *rx = NULL;
    size_t rxn;
    CHECK(ferry_shard_put(other, tok2, tn2, p1, n1, &rx, &rxn) == FERRY_ERR_SHARD_FOREIGN);
    ferry_shard_publisher_free(other);
    for (int k = 0; k < 2; k++) {
        ferry_free(r[k]);
        ferry_shard_finish(g.p[k], 0);
    }
    ferry_free(tok);
    ferry_free(tok2);
    CHECK(head_of(st, run) == 0);
    CHECK_OK(group_publish(&g, m, 0, NULL));
    /* rank count change: 3 ranks on a run of 2 */
    group g3;
    CHECK_OK(group_open(&g3, st, run, 3, 1024, 10, 0));
    char *t3 = NULL;
    size_t t3n;
    CHECK(ferry_shard_begin(g3.p[0], 0, &t3, &t3n) == FERRY_ERR_SHARD_WORLD && has("rank count"));
    group_close(&g3);
    /* the run still publishes cleanly */
    ferry_model *m1 = step(1);
    CHECK_OK(group_publish(&g, m1, 0, NULL));
    CHECK(head_of(st, run) == 2);
    island is;
    CHECK_OK(island_open(&is, st, run, m1, L_ROWS, 0, 2));
    CHECK_RC(island_pull(&is, 2, m1, NULL), 0);
    /* regions outside their tensor, or naming none */
    ferry_shard_subscriber *s = NULL;
    ferry_shard_region bad1 = {"model.norm.weight", 0, 193, 0, 0}, bad2 = {"nope", 0, 0, 0, 0};
    CHECK_OK(ferry_shard_subscriber_open(st, run, &bad1, 1, NULL, &s));
    CHECK(ferry_shard_pull(s, FERRY_SYNC_LATEST, 0, NULL) == FERRY_ERR_SHARD_REGION && has("outside"));
    ferry_shard_subscriber_free(s);
    CHECK_OK(ferry_shard_subscriber_open(st, run, &bad2, 1, NULL, &s));
    CHECK(ferry_shard_pull(s, FERRY_SYNC_LATEST, 0, NULL) == FERRY_ERR_SHARD_REGION && has("nope"));
    ferry_shard_subscriber_free(s);
    island_close(&is);
    ferry_model_free(m1);
    ferry_model_free(m);
    group_close(&g);
    ferry_store_free(st);
}

/* Rewrites an object of the store (file backend) with bytes changed. */
/* Flips a byte in (flip) or cuts in half rank's delta of version v, in the
 * file store at root. */
static void tamper_at(const char *root, const char *run, uint64_t v, const char *id, uint32_t rank, int flip)
{
    char key[FS_KEY_CAP], path[1024];
    ferry__shard_key_object(key, run, v, id, rank, SH_DELTA);
    snprintf(path, sizeof path, "%s/%s", root, key);
    void *d;
    size_t n;
    if (ferry_file_read(path, (size_t)1 << 30, &d, &n)) return;
    if (flip) ((uint8_t *)d)[n / 2] ^= 0x10;
    else n /= 2;
    ferry_file_write(path, d, n);
    ferry_free(d);
}

static void tamper(const char *run, uint64_t v, const char *id, uint32_t rank, int flip) { tamper_at(g_root, run, v, id, rank, flip); }

/* Issue 24 item 4: the ranged GETs of a version, counted
 * (ferry_shard_pull_info.requests) for 8 island layouts on rl-a at
 * 256-word tiles from 4 ranks (about 2000 tiles a version).  Row splits
 * whose M divides R read whole rank objects: at most R GETs a version.
 * At this grid the tile index is most of a sparse delta's objects, so
 * every layout reads them whole (R GETs); the cold start (an anchor)
 * reads the indexes, then runs of wanted tiles: printed (docs/SHARDING.md
 * "Limits"). */
static void t_requests(void)
{
    SKIP_UNLESS_DATA("rl-a");
    char run[64];
    group g;
    ferry_store *st = run_open(run, &g, 4, 256, 10, 0);
    ferry_model *m0 = step(0);
    static const struct { int L, M; } lay[] = {{L_ROWS, 2}, {L_ROWS, 4}, {L_ROWS, 3}, {L_ROWS, 8}, {L_COLS, 2}, {L_COLS, 3},
                                              {L_COLS, 4}, {L_FUSED, 2}, {L_FUSED, 4}};
    enum { NL = sizeof lay / sizeof lay[0] };
    island is[NL];
    for (int k = 0; k < NL; k++) CHECK_OK(island_open(&is[k], st, run, m0, lay[k].L, lay[k].M - 1, lay[k].M));
    for (int v = 1; v <= 4; v++) {
        ferry_model *m = step(v - 1);
        ferry_shard_publish_info info;
        CHECK_OK(group_publish(&g, m, 0, &info));
        CHECK(info.tiles > 1000);
        for (int k = 0; k < NL; k++) {
            double f = 0;
            CHECK_RC(island_pull(&is[k], (uint64_t)v, m, &f), 0);
            CHECK(is[k].requests >= 1);
            /* row splits of whole rank parts: whole objects; and every
             * delta version here: objects read whole where that costs
             * fewer bytes than their index's leaves and a second GET */
            if ((lay[k].L == L_ROWS && 4 % lay[k].M == 0) || v > 1) CHECK(is[k].requests <= 4);
            /* row splits of whole rank parts carry no gap */
            if (lay[k].L == L_ROWS && 4 % lay[k].M == 0) CHECK(f <= 1.0 / lay[k].M * 1.05);
            if (v == 4) printf("  %s M=%d rank %d: %llu ranged GETs, %.3f of the version's objects\n",
                               lay[k].L == L_ROWS ? "rows" : lay[k].L == L_COLS ? "cols" : "fused", lay[k].M, lay[k].M - 1,
                               (unsigned long long)is[k].requests, f);
        }
        ferry_model_free(m);
    }
    for (int k = 0; k < NL; k++) island_close(&is[k]);
    ferry_model_free(m0);
    group_close(&g);
    ferry_store_free(st);
}

static void t_corrupt_objects(void)
{
    SKIP_UNLESS_DATA("rl-a");
    ferry__shard_legacy_manifest = 1; /* the old form (every tile in the manifest): runs in stores still pull */
    char run[64];
    group g;
    ferry_store *st = run_open(run, &g, 2, 1024, 10, 0);
    ferry_model *m0 = step(0), *m1 = step(1), *m2 = step(2);
    CHECK_OK(group_publish(&g, m0, 0, NULL));
    island is;
    CHECK_OK(island_open(&is, st, run, m0, L_ROWS, 0, 2));
    CHECK_RC(island_pull(&is, 1, m0, NULL), 0);
    ferry_shard_publish_info info;
    CHECK_OK(group_publish(&g, m1, 0, &info));
    tamper(run, 2, info.id, 0, 1);
    CHECK(ferry_shard_pull(is.s, FERRY_SYNC_LATEST, 0, NULL) == FERRY_ERR_SYNC_CORRUPT && has("SHA-256"));
    CHECK(ferry_shard_subscriber_version(is.s) == 1 && region_matches(is.s, 0, m0, &is.rg[0]));
    CHECK_OK(group_publish(&g, m2, 0, &info));
    tamper(run, 3, info.id, 0, 0);
    CHECK(ferry_shard_pull(is.s, FERRY_SYNC_EXACT, 3, NULL) == FERRY_ERR_SYNC_CORRUPT);
    CHECK(ferry_shard_subscriber_version(is.s) == 1);
    for (size_t i = 0; i < is.n; i++) CHECK(region_matches(is.s, i, m0, &is.rg[i]));
    /* the single-rank subscriber refuses the sharded manifest, naming what reads it */
    ferry_subscriber *sub = NULL;
    CHECK_OK(ferry_subscriber_open(st, run, NULL, &sub));
    CHECK(ferry_subscriber_sync(sub, FERRY_SYNC_LATEST, 0, NULL) == FERRY_ERR_SYNC_MANIFEST && has("ferry-manifest-2") && has("ferry shard-pull"));
    ferry_subscriber_free(sub);
    island_close(&is);
    ferry_model_free(m0);
    ferry_model_free(m1);
    ferry_model_free(m2);
    group_close(&g);
    ferry_store_free(st);
    ferry__shard_legacy_manifest = 0;
}

/* A ferry-tile-1 payload whose SHA-256 the (unsigned) manifest was made to
 * agree with: the decoder and the target hash still refuse it.  what: 0 an
 * unknown code byte, 1 a byte inside the sparse chunk, 2 a SPARSE tile
 * claimed SAME. */
static int forge_tile(const char *run, uint64_t v, const char *id, int what)
{
    char key[FS_KEY_CAP], path[1024];
    ferry__sync_key_version(key, run, v, id, FS_OBJ_MANIFEST);
    snprintf(path, sizeof path, "%s/%s", g_root, key);
    void *mt;
    size_t mn;
    if (ferry_file_read(path, (size_t)1 << 28, &mt, &mn)) return -1;
    char *text = mt;
    /* the first delta of rank 0 with more than a few bytes */
    char *d = text;
    unsigned long long off = 0, size = 0;
    char sha[65] = "";
    while ((d = strstr(d, "\"delta\":["))) {
        if (sscanf(d, "\"delta\":[%llu,%llu,\"%64[0-9a-f]\"]", &off, &size, sha) == 3 && size > 8) break;
        d++;
    }
    int rc = -1;
    if (d) {
        /* which rank's object holds it: the part's "rank" follows its tiles */
        const char *rk = strstr(d, "\"rank\":");
        unsigned rank = rk ? (unsigned)strtoul(rk + 7, NULL, 10) : 0;
        char okey[FS_KEY_CAP], opath[1024];
        ferry__shard_key_object(okey, run, v, id, rank, SH_DELTA);
        snprintf(opath, sizeof opath, "%s/%s", g_root, okey);
        void *od;
        size_t on;
        if (!ferry_file_read(opath, (size_t)1 << 30, &od, &on) && off + size <= on) {
            uint8_t *pl = (uint8_t *)od + off;
            if (what == 0) pl[0] = 9;
            else if (what == 1) pl[size / 2] ^= 0x41;
            else pl[0] = SH_TILE_SAME;
            char hex[65];
            ferry__sha256_hex(pl, what == 2 ? 1 : (size_t)size, hex);
            char *at = strstr(d, sha);
            memcpy(at, hex, 64);
            if (what == 2) { /* [off, 1, sha of the one SAME byte]: decodes cleanly, to the old tile */
                char *comma = strchr(d + 9, ',');
                size_t tail = mn - (size_t)(at - 1 - text);
                memmove(comma + 3, at - 1, tail);
                memcpy(comma, ",1,", 3);
                mn = (size_t)(comma + 3 - text) + tail;
            }
            if (!ferry_file_write(opath, od, on) && !ferry_file_write(path, text, mn)) rc = 0;
            ferry_free(od);
        }
    }
    ferry_free(mt);
    return rc;
}

/* What the hostile-store cases share: a store, a new run of 2 ranks at
 * 1024-word tiles, version 1 (step 0) pulled by island rank 0 of M by
 * rows, then version 2 (step 1) published (info) for the case to tamper
 * with. */
typedef struct v2run {
    ferry_store *st;
    char run[64];
    group g;
    ferry_model *m0, *m1;
    island is;
    ferry_shard_publish_info info;
} v2run;

static void v2run_open(v2run *f, int M)
{
    f->st = run_open(f->run, &f->g, 2, 1024, 10, 0);
    f->m0 = step(0);
    f->m1 = step(1);
    CHECK_OK(group_publish(&f->g, f->m0, 0, NULL));
    CHECK_OK(island_open(&f->is, f->st, f->run, f->m0, L_ROWS, 0, M));
    CHECK_RC(island_pull(&f->is, 1, f->m0, NULL), 0);
    CHECK_OK(group_publish(&f->g, f->m1, 0, &f->info));
}

/* The island refused version 2: it still holds version 1, bit for bit. */
static void v2run_kept(v2run *f)
{
    CHECK(ferry_shard_subscriber_version(f->is.s) == 1);
    for (size_t i = 0; i < f->is.n; i++) CHECK(region_matches(f->is.s, i, f->m0, &f->is.rg[i]));
}

static void v2run_close(v2run *f)
{
    island_close(&f->is);
    ferry_model_free(f->m0);
    ferry_model_free(f->m1);
    group_close(&f->g);
    ferry_store_free(f->st);
}

static void t_forged_tile(void)
{
    SKIP_UNLESS_DATA("rl-a");
    ferry__shard_legacy_manifest = 1; /* the old form: its tiles' SHA-256 in the manifest */
    for (int what = 0; what < 3; what++) {
        v2run f;
        v2run_open(&f, 1);
        CHECK(forge_tile(f.run, 2, f.info.id, what) == 0);
        int rc = ferry_shard_pull(f.is.s, FERRY_SYNC_LATEST, 0, NULL);
        if (what == 0) CHECK(rc == FERRY_ERR_SYNC_CORRUPT && has("tile code 9"));
        else if (what == 1) CHECK(rc == FERRY_ERR_SYNC_CORRUPT || rc == FERRY_ERR_PATCH_CORRUPT);
        else CHECK(rc == FERRY_ERR_SYNC_CORRUPT && has("target hash"));
        if (rc) CHECK(has(".patch") && has("tile ["));
        v2run_kept(&f);
        v2run_close(&f);
    }
    ferry__shard_legacy_manifest = 0;
}

/* ---- the index form (issue 24 items 2 and 4) ---- */

static uint64_t le64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
    return v;
}

/* Edits the tile index (or a payload) of rank's delta object of version v:
 * 0 a payload byte, 1 entry 0's length + 1, 2 a byte of leaf 0, 3 a tile
 * count of 2^60, 4 entry 0's length 2^32 - 1.  The index is found by its
 * magic from the end.  0 on success. */
static int ix_edit(const char *run, uint64_t v, const char *id, uint32_t rank, int what)
{
    char key[FS_KEY_CAP], path[1024];
    ferry__shard_key_object(key, run, v, id, rank, SH_DELTA);
    snprintf(path, sizeof path, "%s/%s", g_root, key);
    void *dv;
    size_t n;
    if (ferry_file_read(path, (size_t)1 << 30, &dv, &n)) return -1;
    uint8_t *d = dv;
    size_t at = n;
    while (at-- > 0)
        if (at + 8 <= n && !memcmp(d + at, SH_INDEX_MAGIC, 8)) break;
    int rc = -1;
    if (at < n) {
        uint64_t cnt = le64(d + at + 8);
        uint8_t *e0 = d + at + SH_IX_HEAD;
        if (what == 0) d[0] ^= 0x10;
        else if (what == 1) e0[0]++;
        else if (what == 2) e0[cnt * SH_IX_ENTRY] ^= 1;
        else if (what == 3) d[at + 15] = 0x10;
        else memset(e0, 0xff, 4);
        rc = ferry_file_write(path, d, n) ? -1 : 0;
    }
    ferry_free(dv);
    return rc;
}

static int count_keys(const char *dir, const char *part)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "ls '%.1200s' 2>/dev/null | grep -c '%.60s'", dir, part);
    FILE *f = popen(cmd, "r");
    int k = -1;
    if (f) {
        if (fscanf(f, "%d", &k) != 1) k = -1;
        pclose(f);
    }
    return k;
}

/* New runs write the index form: a manifest of R objects (no tiles) and
 * one layout record a run; each island rank reads, per delta version,
 * manifest + index bytes within max(8 KB, 2% of its object bytes) and at
 * most R ranged GETs (HEAD and the manifest besides), rows and columns at
 * M = 2, 3, 4 on rl-a at the default grid. */
static void t_index_form(void)
{
    SKIP_UNLESS_DATA("rl-a");
    char run[64];
    group g;
    ferry_store *st = run_open(run, &g, 4, 0, 10, 0);
    ferry_model *m0 = step(0);
    static const struct { int L, M; } lay[] = {{L_ROWS, 2}, {L_ROWS, 3}, {L_ROWS, 4}, {L_COLS, 2}, {L_COLS, 3}, {L_COLS, 4}};
    enum { NL = sizeof lay / sizeof lay[0] };
    island is[4 * NL];
    size_t ni = 0;
    for (int k = 0; k < NL; k++)
        for (int j = 0; j < lay[k].M; j++) CHECK_OK(island_open(&is[ni++], st, run, m0, lay[k].L, j, lay[k].M));
    for (int v = 1; v <= 4; v++) {
        ferry_model *m = step(v - 1);
        ferry_shard_publish_info info;
        CHECK_OK(group_publish(&g, m, 0, &info));
        /* the manifest: the index form, no tile listed */
        char key[FS_KEY_CAP], path[1024];
        ferry__sync_key_version(key, run, (uint64_t)v, info.id, FS_OBJ_MANIFEST);
        snprintf(path, sizeof path, "%s/%s", g_root, key);
        void *mt;
        size_t mn;
        CHECK_OK(ferry_file_read(path, (size_t)1 << 28, &mt, &mn));
        CHECK(strstr(mt, "\"" SH_INDEX_NAME "\"") && !strstr(mt, "\"tiles\"") && !strstr(mt, "\"target\""));
        ferry_free(mt);
        if (v > 1) CHECK(info.manifest_bytes < 4096);
        size_t i = 0;
        for (int k = 0; k < NL; k++)
            for (int j = 0; j < lay[k].M; j++, i++) {
                CHECK_RC(island_pull(&is[i], (uint64_t)v, m, NULL), 0);
                if (v == 1) continue;
                double bound = 0.02 * (double)is[i].object_bytes;
                if (bound < 8192) bound = 8192;
                CHECK(is[i].requests >= 1 && is[i].requests <= 4);
                CHECK(is[i].manifest_bytes <= bound);
                if (is[i].requests > 4 || is[i].manifest_bytes > bound)
                    fprintf(stderr, "  v%d %s M=%d rank %d: %llu GETs, manifest+index %llu B, tiles %llu B\n", v,
                            lay[k].L == L_ROWS ? "rows" : "cols", lay[k].M, j, (unsigned long long)is[i].requests,
                            (unsigned long long)is[i].manifest_bytes, (unsigned long long)is[i].object_bytes);
                if (v == 4 && j == lay[k].M - 1)
                    printf("  %s M=%d rank %d: %llu GETs + HEAD + manifest, manifest+index %llu B, tiles %llu B\n",
                           lay[k].L == L_ROWS ? "rows" : "cols", lay[k].M, j, (unsigned long long)is[i].requests,
                           (unsigned long long)is[i].manifest_bytes, (unsigned long long)is[i].object_bytes);
            }
        ferry_model_free(m);
    }
    /* one layout record for the run */
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/%s/layout", g_root, run);
    CHECK(count_keys(dir, ".json") == 1);
    for (size_t i = 0; i < ni; i++) island_close(&is[i]);
    ferry_model_free(m0);
    group_close(&g);
    ferry_store_free(st);
}

/* Hostile indexes: a payload, an entry, a leaf, the count, a length; an
 * island reading its object whole (rows 0 of 2 from 2 ranks) and one
 * reading the index section, then its tiles (columns 0 of 8: an eighth
 * of rank 0's tiles).  Each refuses
 * with its own code, naming the object, and keeps version 1. */
static void t_index_hostile(void)
{
    SKIP_UNLESS_DATA("rl-a");
    static const struct { int what, whole_rc, part_rc; const char *msg; } cs[] = {
        {0, FERRY_ERR_SYNC_CORRUPT, FERRY_ERR_SYNC_CORRUPT, "hash to"},
        {1, FERRY_ERR_SHARD_INDEX, FERRY_ERR_SHARD_INDEX, "runs past"},
        {2, 0, FERRY_ERR_SYNC_CORRUPT, "root"},
        {3, FERRY_ERR_SHARD_INDEX, FERRY_ERR_SHARD_INDEX, "counts"},
        {4, FERRY_ERR_SHARD_INDEX, FERRY_ERR_SHARD_INDEX, "runs past"},
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        char run[64];
        group g;
        ferry_store *st = run_open(run, &g, 2, 1024, 10, 0);
        ferry_model *m0 = step(0), *m1 = step(1);
        CHECK_OK(group_publish(&g, m0, 0, NULL));
        island a, b;
        CHECK_OK(island_open(&a, st, run, m0, L_ROWS, 0, 2));
        CHECK_OK(island_open_gb(&b, st, run, m0, L_COLS, 0, 8, 1)); /* reads rank 0's object in part */
        CHECK_RC(island_pull(&a, 1, m0, NULL), 0);
        CHECK_RC(island_pull(&b, 1, m0, NULL), 0);
        ferry_shard_publish_info info;
        CHECK_OK(group_publish(&g, m1, 0, &info));
        CHECK(ix_edit(run, 2, info.id, 0, cs[c].what) == 0);
        island *both[2] = {&a, &b};
        for (int k = 0; k < 2; k++) {
            int want = k ? cs[c].part_rc : cs[c].whole_rc;
            int rc = ferry_shard_pull(both[k]->s, FERRY_SYNC_LATEST, 0, NULL);
            CHECK_RC(rc, want);
            if (rc) {
                CHECK(has(cs[c].msg) && has("-r000000.patch"));
                if (!has(cs[c].msg)) fprintf(stderr, "case %d island %d: %s\n", cs[c].what, k, ferry_last_error());
                CHECK(ferry_shard_subscriber_version(both[k]->s) == 1);
                for (size_t i = 0; i < both[k]->n; i++) CHECK(region_matches(both[k]->s, i, m0, &both[k]->rg[i]));
            } else {
                for (size_t i = 0; i < both[k]->n; i++) CHECK(region_matches(both[k]->s, i, m1, &both[k]->rg[i]));
            }
        }
        island_close(&a);
        island_close(&b);
        ferry_model_free(m0);
        ferry_model_free(m1);
        group_close(&g);
        ferry_store_free(st);
    }
}

/* A layout record whose grid differs from the one the island holds (an
 * unsigned run: the store rewrote the record and the manifest's digest of
 * it): a column cut of the first tensor moved right by one, so its first
 * tile is wider than the held one it would be decoded against and written
 * into.  Refused as a changed grid before any decode (before: the delta
 * was decoded against, and diffed into, a smaller held tile), version 1
 * kept. */
static void t_index_grid_changed(void)
{
    SKIP_UNLESS_DATA("rl-a");
    v2run f;
    v2run_open(&f, 1);
    char key[FS_KEY_CAP], path[1024];
    ferry__sync_key_version(key, f.run, 2, f.info.id, FS_OBJ_MANIFEST);
    snprintf(path, sizeof path, "%s/%s", g_root, key);
    void *mt = NULL, *lt = NULL;
    size_t mn = 0, ln = 0;
    CHECK_OK(ferry_file_read(path, (size_t)1 << 28, &mt, &mn));
    char *ls = mt ? strstr((char *)mt, "\"sha256\":\"") : NULL;
    CHECK(ls != NULL);
    uint8_t sha[32];
    if (ls && ferry__unhex(sha, ls + 10, 32)) {
        char lk[FS_KEY_CAP], lp[1024];
        ferry__shard_key_layout(lk, f.run, sha);
        snprintf(lp, sizeof lp, "%s/%s", g_root, lk);
        CHECK_OK(ferry_file_read(lp, (size_t)1 << 28, &lt, &ln));
        /* the first column grid with an inner cut: [0,X,Y,...] -> [0,X+1,Y,...]
           in every part with that grid (the parts of a tensor agree) */
        char *cc = lt, *t = NULL;
        unsigned long long x = 0, y = 0;
        while (cc && (cc = strstr(cc, "\"col_cuts\":[0,"))) {
            if (sscanf(cc, "\"col_cuts\":[0,%llu,%llu", &x, &y) == 2 && x + 1 < y) {
                t = cc;
                break;
            }
            cc++;
        }
        CHECK(t != NULL);
        char *end = t ? strchr(t, ']') : NULL;
        if (t && end) {
            char from[4096], to[4096];
            size_t fl = (size_t)(end + 1 - t);
            snprintf(from, sizeof from, "%.*s", (int)fl, t);
            char *comma = strchr(from + 14, ',');
            snprintf(to, sizeof to, "\"col_cuts\":[0,%llu%s", x + 1, comma ? comma : "]");
            size_t tl = strlen(to), on = 0;
            char *out = malloc(ln * 2 + 64);
            for (size_t i = 0; i < ln;)
                if (i + fl <= ln && !memcmp((char *)lt + i, from, fl)) {
                    memcpy(out + on, to, tl);
                    on += tl;
                    i += fl;
                } else out[on++] = ((char *)lt)[i++];
            uint8_t nsha[32];
            char hex[65], nk[FS_KEY_CAP], np[1024];
            CHECK_OK(ferry__sha256(out, on, nsha));
            ferry__hex(hex, nsha, 32);
            ferry__shard_key_layout(nk, f.run, nsha);
            snprintf(np, sizeof np, "%s/%s", g_root, nk);
            CHECK_OK(ferry_file_write(np, out, on));
            /* the manifest names the new record: its key and digest (same lengths) */
            char oh[65];
            memcpy(oh, ls + 10, 64);
            oh[64] = 0;
            for (char *q = mt; (q = strstr(q, oh)); q += 64) memcpy(q, hex, 64);
            CHECK_OK(ferry_file_write(path, mt, mn));
            free(out);
        }
    }
    int rc = ferry_shard_pull(f.is.s, FERRY_SYNC_LATEST, 0, NULL);
    CHECK_RC(rc, FERRY_ERR_SYNC_MANIFEST);
    CHECK(has("grid changed"));
    v2run_kept(&f);
    ferry_free(mt);
    ferry_free(lt);
    v2run_close(&f);
}

/* An index-form manifest without 'tile_codec' (tiles as standalone
 * patches, whose base hashes a tile index does not carry; no writer makes
 * it) is refused as a malformed manifest, version 1 kept (before: read,
 * and its deltas refused one by one as corrupt tiles). */
static void t_index_no_codec(void)
{
    SKIP_UNLESS_DATA("rl-a");
    v2run f;
    v2run_open(&f, 2);
    char key[FS_KEY_CAP], path[1024];
    ferry__sync_key_version(key, f.run, 2, f.info.id, FS_OBJ_MANIFEST);
    snprintf(path, sizeof path, "%s/%s", g_root, key);
    void *mt = NULL;
    size_t mn = 0;
    CHECK_OK(ferry_file_read(path, (size_t)1 << 28, &mt, &mn));
    static const char field[] = ",\"tile_codec\":\"" SH_TILE_CODEC_NAME "\"";
    char *at = mt ? strstr((char *)mt, field) : NULL;
    CHECK(at != NULL);
    if (at) {
        size_t fl = sizeof field - 1;
        memmove(at, at + fl, mn - (size_t)(at - (char *)mt) - fl);
        CHECK_OK(ferry_file_write(path, mt, mn - fl));
    }
    CHECK_RC(ferry_shard_pull(f.is.s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_MANIFEST);
    CHECK(has("tile_codec") && has(".json"));
    v2run_kept(&f);
    ferry_free(mt);
    v2run_close(&f);
}

static void t_kind_mismatch(void)
{
    SKIP_UNLESS_DATA("rl-a");
    ferry_store *st = open_store();
    char run[64];
    new_run(run, sizeof run);
    ferry_publisher *p = NULL;
    ferry_model *m0 = step(0);
    CHECK_OK(ferry_publisher_open(st, run, NULL, &p));
    CHECK_OK(ferry_publish(p, m0, NULL));
    ferry_publisher_free(p);
    group g;
    CHECK_OK(group_open(&g, st, run, 2, 1024, 10, 0));
    CHECK(group_publish(&g, m0, 0, NULL) == FERRY_ERR_SHARD_KIND);
    island is;
    CHECK_OK(island_open(&is, st, run, m0, L_ROWS, 0, 2));
    CHECK(ferry_shard_pull(is.s, FERRY_SYNC_LATEST, 0, NULL) == FERRY_ERR_SHARD_KIND);
    island_close(&is);
    group_close(&g);
    ferry_model_free(m0);
    ferry_store_free(st);
}

static int g_deleted;
static void count_deleted(void *u, const char *key, uint64_t bytes, int action, const char *why)
{
    (void)u, (void)bytes, (void)why;
    if (action && strstr(key, "-r0000")) g_deleted++;
}

static void t_gc(void)
{
    SKIP_UNLESS_DATA("rl-a");
    char run[64];
    group g;
    ferry_store *st = run_open(run, &g, 2, 1024, 2, 0);
    for (int v = 1; v <= 4; v++) {
        ferry_model *m = step(v - 1);
        CHECK_OK(group_publish(&g, m, 0, NULL));
        ferry_model_free(m);
    }
    /* an orphan: every rank put version 5, rank 0 never committed */
    char *tok = NULL, *r[2] = {0};
    size_t tn, rn[2];
    ferry_shard_part parts[64];
    ferry_model *m = step(4);
    CHECK_OK(ferry_shard_begin(g.p[0], 0, &tok, &tn));
    for (int k = 0; k < 2; k++) CHECK_OK(ferry_shard_put(g.p[k], tok, tn, parts, parts_of(m, k, 2, parts), &r[k], &rn[k]));
    for (int k = 0; k < 2; k++) {
        ferry_free(r[k]);
        ferry_shard_finish(g.p[k], 0);
    }
    ferry_free(tok);
    /* the group publishes version 5 again, cleanly (a new id) */
    CHECK_OK(group_publish(&g, m, 0, NULL));
    ferry_gc_options o = {.keep = 1, .grace_s = -1, .on_object = count_deleted};
    ferry_gc_report rep;
    g_deleted = 0;
    CHECK_OK(ferry_gc(st, run, &o, &rep));
    CHECK(rep.head == 5 && rep.oldest_retained == 5);
    /* versions 1..4's rank objects and the orphan's: 4 + 1 delta/anchor objects of each rank, at least */
    CHECK(g_deleted >= 5);
    island is;
    CHECK_OK(island_open(&is, st, run, m, L_ROWS, 1, 2));
    CHECK_RC(island_pull(&is, 5, m, NULL), 0);
    ferry_run_log *log = NULL;
    CHECK_OK(ferry_run_log_read(st, run, 0, &log));
    CHECK(log && log->head == 5 && log->count >= 1 && log->versions[log->count - 1].version == 5);
    ferry_run_log_free(log);
    island_close(&is);
    ferry_model_free(m);
    group_close(&g);
    ferry_store_free(st);
}

/* Signed sharded runs: rank 0 signs the manifest and HEAD; an island with
 * trusted keys refuses a forged manifest, another signer and an unsigned
 * run before using anything in them, keeps its version, and recovers when
 * the store is repaired; a publisher with a key will not resume an
 * unsigned HEAD. */
static ferry_keys *ring(const char *who, int signer)
{
    char prefix[400], path[420];
    snprintf(prefix, sizeof prefix, "%s/%s", g_root, who);
    snprintf(path, sizeof path, "%s.key", prefix);
    if (access(path, F_OK)) ferry_keygen(prefix, NULL);
    ferry_keys *k = NULL;
    ferry_keys_create(&k);
    if (signer) ferry_keys_set_signer(k, path, NULL);
    snprintf(path, sizeof path, "%s.pub", prefix);
    if (!signer) ferry_keys_trust(k, path, -1, NULL);
    return k;
}

static int signed_island(island *is, ferry_store *st, const char *run, const ferry_model *m, const ferry_keys *k)
{
    memset(is, 0, sizeof *is);
    is->n = shard_layout(m, L_ROWS, 0, 2, is->rg);
    ferry_shard_sub_options so = {.keys = k};
    return ferry_shard_subscriber_open(st, run, is->rg, is->n, &so, &is->s);
}

static void t_signed(void)
{
    SKIP_UNLESS_DATA("rl-a");
    ferry_store *st = open_store();
    ferry_keys *trainer = ring("trainer", 1), *trust = ring("trainer", 0), *other = ring("mallory", 0);
    char run[64], unsigned_run[64];
    new_run(run, sizeof run);
    new_run(unsigned_run, sizeof unsigned_run);
    ferry_model *m0 = step(0), *m1 = step(1);
    group g;
    g_group_keys = trainer;
    CHECK_OK(group_open(&g, st, run, 2, 1024, 10, 0));
    g_group_keys = NULL;
    ferry_shard_publish_info info;
    CHECK_OK(group_publish(&g, m0, 0, NULL));
    CHECK_OK(group_publish(&g, m1, 0, &info));
    island is, bad;
    CHECK_OK(signed_island(&is, st, run, m0, trust));
    CHECK_OK(island_pull(&is, 1, m0, NULL));
    CHECK_OK(signed_island(&bad, st, run, m0, other));
    CHECK_RC(ferry_shard_pull(bad.s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SIG_UNTRUSTED);
    island_close(&bad);
    /* a forged manifest of version 2: one byte of its body changed */
    char key[FS_KEY_CAP], path[1024];
    ferry__sync_key_version(key, run, 2, info.id, FS_OBJ_MANIFEST);
    snprintf(path, sizeof path, "%s/%s", g_root, key);
    void *d = NULL;
    size_t n = 0;
    CHECK_OK(ferry_file_read(path, (size_t)1 << 30, &d, &n));
    char *at = d ? strstr((char *)d, "\"anchor_every\"") : NULL;
    CHECK(at != NULL);
    if (at) {
        at[1] ^= 0x20; /* "Anchor_every" */
        CHECK_OK(ferry_file_write(path, d, n));
        CHECK_RC(ferry_shard_pull(is.s, FERRY_SYNC_EXACT, 2, NULL), FERRY_ERR_SIG_INVALID);
        CHECK(ferry_shard_subscriber_version(is.s) == 1 && region_matches(is.s, 0, m0, &is.rg[0]));
        at[1] ^= 0x20; /* repaired */
        CHECK_OK(ferry_file_write(path, d, n));
        CHECK_OK(island_pull(&is, 2, m1, NULL));
    }
    ferry_free(d);
    island_close(&is);
    group_close(&g);
    /* an unsigned sharded run: refused by a reader with keys, and not
     * resumed by a publisher with a key */
    CHECK_OK(group_open(&g, st, unsigned_run, 2, 1024, 10, 0));
    CHECK_OK(group_publish(&g, m0, 0, NULL));
    group_close(&g);
    CHECK_OK(signed_island(&is, st, unsigned_run, m0, trust));
    CHECK_RC(ferry_shard_pull(is.s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SIG_MISSING);
    CHECK(ferry_shard_subscriber_version(is.s) == 0);
    island_close(&is);
    g_group_keys = trainer;
    CHECK_OK(group_open(&g, st, unsigned_run, 2, 1024, 10, 0));
    g_group_keys = NULL;
    CHECK_RC(group_publish(&g, m1, 0, NULL), FERRY_ERR_SIG_MISSING);
    group_close(&g);
    ferry_model_free(m0);
    ferry_model_free(m1);
    ferry_keys_free(trainer);
    ferry_keys_free(trust);
    ferry_keys_free(other);
    ferry_store_free(st);
}

/* Store lists (ferry_shard_subscriber_add_store): an island reads a
 * mirror (A) first and falls back to the origin (B) when A is behind, when
 * A serves a corrupt object after versions it did serve (the versions
 * completed from A are kept and the change lists cover the whole pull),
 * and when A's HEAD is below the version held. */
static void t_store_list(void)
{
    SKIP_UNLESS_DATA("rl-a");
    char ra[300], rb[300], run[64];
    snprintf(ra, sizeof ra, "%s/mirror", g_root);
    snprintf(rb, sizeof rb, "%s/origin", g_root);
    ferry_store_options so = {.create = 1};
    ferry_store *a = NULL, *b = NULL;
    CHECK_OK(ferry_store_open(ra, &so, &a));
    CHECK_OK(ferry_store_open(rb, &so, &b));
    new_run(run, sizeof run);
    ferry_model *m[7] = {0};
    for (int i = 1; i <= 6; i++) m[i] = step(i);
    group g;
    CHECK_OK(group_open(&g, b, run, 2, 1024, 10, 0));
    ferry_shard_publish_info info;
    CHECK_OK(group_publish(&g, m[1], 0, &info));
    CHECK_OK(group_publish(&g, m[2], 0, &info));
    ferry_mirror_info mi;
    CHECK_OK(ferry_mirror_once(b, a, run, NULL, &mi));
    CHECK(mi.to_version == 2);
    char head_path[400];
    snprintf(head_path, sizeof head_path, "%s/%s/HEAD", ra, run);
    void *head2 = NULL;
    size_t head2_n = 0;
    CHECK_OK(ferry_file_read(head_path, 1 << 20, &head2, &head2_n));

    island is;
    CHECK_OK(island_open(&is, a, run, m[1], L_ROWS, 0, 2));
    CHECK_OK(ferry_shard_subscriber_add_store(is.s, b));
    CHECK_RC(island_pull(&is, 1, m[1], NULL), 0);
    CHECK(ferry_shard_subscriber_store_used(is.s) == 0);

    /* A behind: version 3 only at B */
    CHECK_OK(group_publish(&g, m[3], 0, &info));
    CHECK_RC(island_pull(&is, 3, m[3], NULL), 0);
    CHECK(ferry_shard_subscriber_store_used(is.s) == 1);

    /* A has 4 and a corrupt 5: 4 from A, 5 from B, one pull, change lists from 3 */
    CHECK_OK(group_publish(&g, m[4], 0, &info));
    char id4[FS_ID_CAP];
    memcpy(id4, info.id, FS_ID_CAP);
    CHECK_OK(group_publish(&g, m[5], 0, &info));
    CHECK_OK(ferry_mirror_once(b, a, run, NULL, &mi));
    CHECK(mi.to_version == 5);
    tamper_at(ra, run, 5, info.id, 0, 1);
    for (uint32_t r = 0; r < 2; r++) { /* B cannot serve 4: it must come from A */
        char key[FS_KEY_CAP];
        ferry__shard_key_object(key, run, 4, id4, r, SH_DELTA);
        CHECK_OK(ferry_store_delete(b, key));
    }
    ferry_shard_pull_info pi;
    CHECK_OK(ferry_shard_pull(is.s, FERRY_SYNC_EXACT, 5, &pi));
    CHECK(pi.from_version == 3 && pi.to_version == 5 && ferry_shard_subscriber_store_used(is.s) == 1);
    /* the island's checks: regions equal step 5, and the change lists of
       the pull turn what it held at 3 into them */
    for (size_t i = 0; i < is.n; i++) CHECK(region_matches(is.s, i, m[5], &is.rg[i]));
    for (size_t i = 0; i < is.n; i++) {
        int all = 0;
        const int64_t *pos;
        const void *vals;
        size_t cnt;
        uint64_t nb = 0;
        CHECK_OK(ferry_shard_region_changes(is.s, i, &all, &pos, &vals, &cnt));
        ferry_shard_region_shape(is.s, i, NULL, NULL, NULL, &nb);
        if (all || !is.prev[i]) continue; /* whole region: nothing to replay */
        for (size_t k = 0; k < cnt; k++) memcpy(is.prev[i] + pos[k] * 2, (const uint8_t *)vals + k * 2, 2);
        uint8_t *now = malloc(nb);
        CHECK(now && !ferry_shard_region_copy(is.s, i, now, nb) && !memcmp(now, is.prev[i], nb));
        free(now);
    }

    /* A's HEAD back at 2, below the 5 held: A is skipped as behind */
    CHECK_OK(group_publish(&g, m[6], 0, &info));
    CHECK_OK(ferry_file_write(head_path, head2, head2_n));
    CHECK_OK(ferry_shard_pull(is.s, FERRY_SYNC_LATEST, 0, &pi));
    CHECK(pi.to_version == 6 && ferry_shard_subscriber_store_used(is.s) == 1);
    for (size_t i = 0; i < is.n; i++) CHECK(region_matches(is.s, i, m[6], &is.rg[i]));
    /* ... and alone, A says so and the island keeps its version */
    island lone;
    CHECK_OK(island_open(&lone, a, run, m[1], L_ROWS, 0, 2));
    CHECK_OK(ferry_shard_pull(lone.s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(ferry_shard_subscriber_version(lone.s) == 2);
    CHECK_OK(ferry_file_write(head_path, "", 0));
    CHECK(ferry_shard_pull(lone.s, FERRY_SYNC_LATEST, 0, NULL) != 0);
    CHECK(ferry_shard_subscriber_version(lone.s) == 2);
    island_close(&lone);

    ferry_free(head2);
    island_close(&is);
    group_close(&g);
    for (int i = 1; i <= 6; i++) ferry_model_free(m[i]);
    ferry_store_free(a);
    ferry_store_free(b);
}

/* Steps 0..n-1 of rl-a opened into m[] and published by g as versions
 * 1..n. */
static void publish_steps(group *g, ferry_model **m, int n)
{
    for (int v = 1; v <= n; v++) {
        m[v - 1] = step(v - 1);
        CHECK_OK(group_publish(g, m[v - 1], 0, NULL));
    }
}

/* ferry_shard_compact: per-rank objects coding version 5's tiles against
 * version 2's; an island at 2 takes them (cheaper than the chain 3..5) and
 * holds version 5 exactly; one whose compacted object is corrupt falls back
 * to the chain, still exact; an old-form run and a single-rank call are
 * refused. */
static void t_compact(void)
{
    SKIP_UNLESS_DATA("rl-a");
    char run[64];
    group g;
    ferry_store *st = run_open(run, &g, 2, 1024, 10, 0);
    ferry_model *m[5];
    publish_steps(&g, m, 5);
    island a, b, c;
    CHECK_OK(island_open(&a, st, run, m[1], L_ROWS, 0, 2));
    CHECK_OK(island_open(&b, st, run, m[1], L_ROWS, 0, 2));
    CHECK_OK(island_open(&c, st, run, m[1], L_COLS, 1, 2));
    CHECK_RC(island_pull(&a, 2, m[1], NULL), 0);
    CHECK_RC(island_pull(&b, 2, m[1], NULL), 0);
    CHECK_RC(island_pull(&c, 2, m[1], NULL), 0);
    ferry_compact_options co = {.from = 2, .to = 5};
    ferry_shard_compact_info ci;
    CHECK_OK(ferry_shard_compact(st, run, &co, &ci));
    CHECK(ci.from == 2 && ci.to == 5 && ci.world == 2 && ci.tiles > 0 && ci.bytes > 0 && ci.bytes < ci.chain_bytes &&
          ci.bytes < ci.anchor_bytes);
    ferry_shard_pull_info pi;
    CHECK_OK(ferry_shard_pull(a.s, FERRY_SYNC_EXACT, 5, &pi));
    CHECK(!strcmp(pi.path, "compacted 2..5"));
    for (size_t i = 0; i < a.n; i++) CHECK(region_matches(a.s, i, m[4], &a.rg[i]));
    /* rank 0's first payload byte flipped (island b wants that tile), rank
       1's object cut in half: refused, the chain taken, still exact */
    for (uint32_t r = 0; r < 2; r++) {
        char key[FS_KEY_CAP], path[1024];
        ferry__sync_key_compact_rank(key, run, 2, 5, ci.id, r);
        snprintf(path, sizeof path, "%s/%s", g_root, key);
        void *d;
        size_t n;
        CHECK_OK(ferry_file_read(path, (size_t)1 << 30, &d, &n));
        if (r == 0) ((uint8_t *)d)[0] ^= 0x40;
        CHECK_OK(ferry_file_write(path, d, r == 0 ? n : n / 2));
        ferry_free(d);
    }
    CHECK_OK(ferry_shard_pull(b.s, FERRY_SYNC_EXACT, 5, &pi));
    CHECK(!strcmp(pi.path, "chain 2..5 (compacted 2..5 refused)"));
    for (size_t i = 0; i < b.n; i++) CHECK(region_matches(b.s, i, m[4], &b.rg[i]));
    CHECK_OK(ferry_shard_pull(c.s, FERRY_SYNC_EXACT, 5, &pi));
    CHECK(!strcmp(pi.path, "chain 2..5 (compacted 2..5 refused)"));
    for (size_t i = 0; i < c.n; i++) CHECK(region_matches(c.s, i, m[4], &c.rg[i]));
    island_close(&a);
    island_close(&b);
    island_close(&c);
    group_close(&g);
    /* the old form (tiles listed in the manifest) is not compacted */
    ferry__shard_legacy_manifest = 1;
    new_run(run, sizeof run);
    CHECK_OK(group_open(&g, st, run, 2, 1024, 10, 0));
    for (int v = 1; v <= 3; v++) CHECK_OK(group_publish(&g, m[v - 1], 0, NULL));
    co = (ferry_compact_options){.from = 1, .to = 3};
    CHECK(ferry_shard_compact(st, run, &co, &ci) == FERRY_ERR_UNSUPPORTED && has("old form"));
    ferry__shard_legacy_manifest = 0;
    group_close(&g);
    /* a single-rank run: SHARD_KIND (ferry compact then calls ferry_compact) */
    new_run(run, sizeof run);
    ferry_publisher *p = NULL;
    CHECK_OK(ferry_publisher_open(st, run, NULL, &p));
    for (int v = 1; v <= 2; v++) CHECK_OK(ferry_publish(p, m[v - 1], NULL));
    ferry_publisher_free(p);
    CHECK(ferry_shard_compact(st, run, NULL, &ci) == FERRY_ERR_SHARD_KIND);
    for (int v = 0; v < 5; v++) ferry_model_free(m[v]);
    ferry_store_free(st);
}

/* The compaction index's sharded entries ("objects") are hostile input:
 * a well-formed one round-trips; a key of another rank, an index section
 * that does not end its object, sizes that do not sum to the entry's,
 * a root that is not hex, no objects: FERRY_ERR_SYNC_MANIFEST naming it. */
static int index_text(char *out, size_t cap, const char *key1, uint64_t tiles1, uint64_t bytes, const char *root1, const char *objs)
{
    const char *c = "t/c/00000000000000000002-00000000000000000005-00000000000000ab";
    char o[2048];
    if (objs) snprintf(o, sizeof o, "%s", objs);
    else
        snprintf(o, sizeof o, "[{\"key\": \"%s-r000000.patch\", \"bytes\": 1068, \"index\": 1000, \"tiles\": 1, \"root\": \"%064d\"},"
                 "{\"key\": \"%s\", \"bytes\": %llu, \"index\": 10, \"tiles\": %llu, \"root\": \"%s\"}]",
                 c, 0, key1, (unsigned long long)(10 + 16 + 52 * tiles1), (unsigned long long)tiles1, root1);
    return snprintf(out, cap, "{\"format\": \"ferry-compactions-1\", \"run\": \"t\", \"compactions\": [{\"from\": 2, "
                    "\"from_id\": \"0123456789abcdef\", \"to\": 5, \"to_id\": \"00000000000000aa\", \"id\": \"00000000000000ab\", "
                    "\"key\": \"%s.patch\", \"bytes\": %llu, \"base_hash\": \"%032d\", \"target_hash\": \"%032d\", "
                    "\"from_delta_bytes_cum\": 0, \"to_delta_bytes_cum\": 9000, \"from_full_bytes\": 0, \"created_unix\": 1, "
                    "\"chain_bytes\": 9000, \"objects\": %s}]}", c, (unsigned long long)bytes, 0, 1, o);
}

static void t_compact_index(void)
{
    const char *k1 = "t/c/00000000000000000002-00000000000000000005-00000000000000ab-r000001.patch";
    const char *k0 = "t/c/00000000000000000002-00000000000000000005-00000000000000ab-r000000.patch";
    char root[65], text[8192];
    memset(root, 'a', 64);
    root[64] = 0;
    fs_index ix;
    int n = index_text(text, sizeof text, k1, 3, 1068 + 10 + 16 + 156, root, NULL);
    CHECK_OK(ferry__sync_index_parse("t", "ix", text, (size_t)n, &ix));
    CHECK(ix.n == 1 && ix.c[0].world == 2 && ix.nobj == 2 && ix.obj[1].tiles == 3 && ix.obj[1].index == 10 && ix.obj[1].root[0] == 0xaa);
    char *back = ferry__sync_index_json("t", &ix); /* and back: the same entry */
    fs_index iy;
    CHECK(back && !ferry__sync_index_parse("t", "ix", back, strlen(back), &iy) && iy.n == 1 && iy.c[0].world == 2 &&
          !memcmp(iy.obj, ix.obj, 2 * sizeof *ix.obj));
    free(back);
    ferry__sync_index_release(&iy);
    ferry__sync_index_release(&ix);
    struct {
        const char *key1, *root, *objs, *what;
        uint64_t tiles1, bytes;
        int bump_index;
    } bad[] = {
        {k0, root, NULL, "object key", 3, 1068 + 10 + 16 + 156, 0},
        {k1, root, NULL, "sum to the entry", 3, 1068 + 10 + 16 + 156 + 1, 0},
        {k1, "xyz", NULL, "'root'", 3, 1068 + 10 + 16 + 156, 0},
        {k1, root, "[]", "'objects'", 3, 0, 0},
        {k1, root, "{}", "'objects'", 3, 0, 0},
        {k1, root, "[{\"key\": 1}]", "", 3, 0, 0},
        {k1, root, NULL, "do not end it", 3, 1068 + 10 + 16 + 156, 1},
        {k1, root, NULL, "do not end it", 0, 1068 + 10 + 16, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        n = index_text(text, sizeof text, bad[i].key1, bad[i].tiles1, bad[i].bytes, bad[i].root, bad[i].objs);
        if (bad[i].bump_index) { /* the section no longer ends the object */
            char *p = strstr(text, "\"index\": 10,");
            if (p) memcpy(p, "\"index\": 11,", 12);
        }
        int rc = ferry__sync_index_parse("t", "ix", text, (size_t)n, &ix);
        CHECK(rc == FERRY_ERR_SYNC_MANIFEST && has(bad[i].what));
        if (rc != FERRY_ERR_SYNC_MANIFEST || !has(bad[i].what)) fprintf(stderr, "case %zu: %s\n", i, ferry_last_error());
        if (!rc) ferry__sync_index_release(&ix);
    }
}

/* A signed run: the compaction index is signed by the compactor's key and
 * an island with trusted keys uses it; an index rewritten without a key
 * (unsigned) is ignored by that island, which takes the chain. */
static void t_compact_signed(void)
{
    SKIP_UNLESS_DATA("rl-a");
    ferry_store *st = open_store();
    ferry_keys *trainer = ring("trainer", 1), *trust = ring("trainer", 0);
    char run[64];
    new_run(run, sizeof run);
    ferry_model *m[4];
    group g;
    g_group_keys = trainer;
    CHECK_OK(group_open(&g, st, run, 2, 1024, 10, 0));
    g_group_keys = NULL;
    publish_steps(&g, m, 4);
    island a, b;
    CHECK_OK(signed_island(&a, st, run, m[1], trust));
    CHECK_OK(signed_island(&b, st, run, m[1], trust));
    CHECK_RC(island_pull(&a, 2, m[1], NULL), 0);
    CHECK_RC(island_pull(&b, 2, m[1], NULL), 0);
    ferry_compact_options co = {.from = 2, .to = 4, .keys = trainer};
    ferry_shard_compact_info ci;
    CHECK_OK(ferry_shard_compact(st, run, &co, &ci));
    ferry_shard_pull_info pi;
    CHECK_OK(ferry_shard_pull(a.s, FERRY_SYNC_EXACT, 4, &pi));
    CHECK(!strcmp(pi.path, "compacted 2..4"));
    for (size_t i = 0; i < a.n; i++) CHECK(region_matches(a.s, i, m[3], &a.rg[i]));
    co.keys = NULL; /* the same compaction again, the index now unsigned */
    CHECK_OK(ferry_shard_compact(st, run, &co, &ci));
    CHECK_OK(ferry_shard_pull(b.s, FERRY_SYNC_EXACT, 4, &pi));
    CHECK(!strcmp(pi.path, "chain 2..4"));
    for (size_t i = 0; i < b.n; i++) CHECK(region_matches(b.s, i, m[3], &b.rg[i]));
    island_close(&a);
    island_close(&b);
    group_close(&g);
    for (int v = 0; v < 4; v++) ferry_model_free(m[v]);
    ferry_keys_free(trainer);
    ferry_keys_free(trust);
    ferry_store_free(st);
}

/* Two ranks publish steps 0..4 (versions 1..5, one anchor) into a new
 * run, compacted 2..5 (*ci); the group stays open. */
static void compacted_run(ferry_store *st, char run[64], group *g, ferry_model *m[5], ferry_shard_compact_info *ci)
{
    new_run(run, 64);
    CHECK_OK(group_open(g, st, run, 2, 1024, 10, 0));
    publish_steps(g, m, 5);
    ferry_compact_options co = {.from = 2, .to = 5};
    CHECK_OK(ferry_shard_compact(st, run, &co, ci));
}

/* A forged entry of an unsigned run's compaction index (the store rewrote
 * it; the objects stay the real ones): one that does not end at version
 * 5 as the island's chain has it (another to_id, target hash, tile count,
 * rank count), does not start at the version held (another from_id), or
 * is of another run id is not taken: the island at 2 pulls 5 by the chain,
 * exact.  A mirror refuses to copy the objects of one whose target hash,
 * tile or rank count is not its manifest of 5's (and writes no index);
 * the real index is mirrored with its objects. */
typedef enum { F_TO_ID, F_FROM_ID, F_TARGET, F_TILES, F_WORLD, F_RUN_ID, F_N } forgery;

static void forge(ferry_store *st, const char *run, const fs_index *real, forgery f)
{
    fs_index ix = *real;
    fs_compaction c = real->c[0];
    fs_cobj o[3];
    memcpy(o, real->obj + c.obj0, 2 * sizeof *o);
    c.obj0 = 0;
    ix.c = &c;
    ix.obj = o;
    switch (f) {
    case F_TO_ID: c.to_id[0] = c.to_id[0] == '0' ? '1' : '0'; break;
    case F_FROM_ID: c.from_id[0] = c.from_id[0] == '0' ? '1' : '0'; break;
    case F_TARGET: c.target_hash[0] ^= 1; break;
    case F_TILES: /* rank 1 claims a tile more (its index section 52 bytes longer) */
        o[1].tiles++;
        o[1].bytes += 52;
        c.bytes += 52;
        break;
    case F_WORLD: /* a third rank object */
        o[2] = o[1];
        c.world = 3;
        c.bytes += o[2].bytes;
        ix.nobj = 3;
        break;
    case F_RUN_ID: ix.run_id[0] = ix.run_id[0] == '0' ? '1' : '0'; break;
    default: break;
    }
    char key[FS_KEY_CAP];
    ferry__sync_key_index(key, run);
    char *text = ferry__sync_index_json(run, &ix);
    CHECK(text != NULL);
    if (text) CHECK_OK(ferry_store_put(st, key, text, strlen(text), NULL));
    free(text);
}

static void t_compact_forged(void)
{
    SKIP_UNLESS_DATA("rl-a");
    ferry_store *st = open_store();
    char run[64];
    group g;
    ferry_model *m[5];
    ferry_shard_compact_info ci;
    compacted_run(st, run, &g, m, &ci);
    fs_index real;
    CHECK_OK(ferry__sync_index_read(st, run, NULL, NULL, &real, NULL));
    CHECK(real.n == 1 && real.c[0].world == 2 && real.nobj == 2);
    char mroot[400];
    snprintf(mroot, sizeof mroot, "%s/mirror-%s", g_root, run + 2); /* (beside the run's keys) */
    for (int f = 0; f < F_N && real.n == 1 && real.nobj == 2; f++) {
        forge(st, run, &real, (forgery)f);
        island a;
        ferry_shard_pull_info pi;
        CHECK_OK(island_open(&a, st, run, m[1], L_ROWS, 0, 2));
        CHECK_RC(island_pull(&a, 2, m[1], NULL), 0);
        CHECK_OK(ferry_shard_pull(a.s, FERRY_SYNC_EXACT, 5, &pi));
        CHECK(!strcmp(pi.path, "chain 2..5"));
        if (strcmp(pi.path, "chain 2..5")) fprintf(stderr, "forgery %d: path %s\n", f, pi.path);
        for (size_t i = 0; i < a.n; i++) CHECK(region_matches(a.s, i, m[4], &a.rg[i]));
        island_close(&a);
        /* (a mirror copies an entry of another from_id or run id: it fits
           5; one of another to_id names no version the mirror holds) */
        if (f == F_FROM_ID || f == F_RUN_ID || f == F_TO_ID) continue;
        ferry_store *dst = NULL;
        char droot[420];
        snprintf(droot, sizeof droot, "%s/%d", mroot, f);
        ferry_store_options so = {.create = 1};
        CHECK_OK(ferry_store_open(droot, &so, &dst));
        ferry_mirror_info mi;
        int rc = ferry_mirror_once(st, dst, run, NULL, &mi);
        CHECK(rc == FERRY_ERR_SYNC_MANIFEST && has("sharded"));
        if (rc != FERRY_ERR_SYNC_MANIFEST) fprintf(stderr, "forgery %d: mirror rc %d %s\n", f, rc, ferry_last_error());
        char ikey[FS_KEY_CAP];
        ferry__sync_key_index(ikey, run);
        ferry_store_stat ss;
        CHECK(ferry_store_head(dst, ikey, &ss) == FERRY_ERR_STORE_NOT_FOUND);
        ferry_store_free(dst);
    }
    /* the real index back: mirrored with its 2 objects, used there */
    char key[FS_KEY_CAP];
    ferry__sync_key_index(key, run);
    char *text = ferry__sync_index_json(run, &real);
    CHECK(text && !ferry_store_put(st, key, text, strlen(text), NULL));
    free(text);
    ferry_store *dst = NULL;
    char droot[420];
    snprintf(droot, sizeof droot, "%s/real", mroot);
    ferry_store_options so = {.create = 1};
    CHECK_OK(ferry_store_open(droot, &so, &dst));
    ferry_mirror_info mi;
    CHECK_OK(ferry_mirror_once(st, dst, run, NULL, &mi));
    CHECK(mi.compactions_copied == 2 && mi.index_copied == 1);
    ferry__sync_index_release(&real);
    ferry_store_free(dst);
    group_close(&g);
    for (int v = 0; v < 5; v++) ferry_model_free(m[v]);
    ferry_store_free(st);
}

/* A compaction whose objects cannot be read for a reason of the store's
 * (here: a file where RUN/c/ should be, FERRY_ERR_STORE_KEY, not a bad or
 * missing object) costs that pull the shortcut, the chain taken,
 * but is not remembered as refused: once readable, the same island back
 * at 2 takes it (before: refused for the subscriber's life, as for a
 * transient network error). */
static void t_compact_transient(void)
{
    SKIP_UNLESS_DATA("rl-a");
    ferry_store *st = open_store();
    char run[64];
    group g;
    ferry_model *m[5];
    ferry_shard_compact_info ci;
    compacted_run(st, run, &g, m, &ci);
    island a;
    ferry_shard_pull_info pi;
    CHECK_OK(island_open(&a, st, run, m[1], L_ROWS, 0, 2));
    CHECK_RC(island_pull(&a, 2, m[1], NULL), 0);
    char dir[1024], aside[1040];
    snprintf(dir, sizeof dir, "%s/%s/c", g_root, run);
    snprintf(aside, sizeof aside, "%s.aside", dir);
    FILE *f = NULL;
    CHECK(!rename(dir, aside) && (f = fopen(dir, "w")) != NULL);
    if (f) fclose(f);
    CHECK_OK(ferry_shard_pull(a.s, FERRY_SYNC_EXACT, 5, &pi));
    CHECK(!strcmp(pi.path, "chain 2..5 (compacted 2..5 refused)"));
    for (size_t i = 0; i < a.n; i++) CHECK(region_matches(a.s, i, m[4], &a.rg[i]));
    CHECK(!unlink(dir) && !rename(aside, dir));
    CHECK_OK(ferry_shard_pull(a.s, FERRY_SYNC_EXACT, 2, &pi)); /* back to 2 (through anchor 1) */
    CHECK_OK(ferry_shard_pull(a.s, FERRY_SYNC_EXACT, 5, &pi));
    CHECK(!strcmp(pi.path, "compacted 2..5"));
    if (strcmp(pi.path, "compacted 2..5")) fprintf(stderr, "path: %s\n", pi.path);
    for (size_t i = 0; i < a.n; i++) CHECK(region_matches(a.s, i, m[4], &a.rg[i]));
    island_close(&a);
    group_close(&g);
    for (int v = 0; v < 5; v++) ferry_model_free(m[v]);
    ferry_store_free(st);
}

/* The compaction index is read bounded (1 MiB, FS_JSON_MAX): a sharded
 * entry of 5000 rank objects (~1.2 MB of JSON) would make an index no
 * reader, GC or compactor could read again.  Refused with FERRY_ERR_LIMIT
 * before it is written (before: written, and every later read failed);
 * the index keeps its entry. */
static void t_compact_index_full(void)
{
    ferry_store *st = open_store();
    char run[64];
    new_run(run, sizeof run);
    fs_compaction c;
    memset(&c, 0, sizeof c);
    c.from = 2;
    c.to = 5;
    snprintf(c.from_id, sizeof c.from_id, "0123456789abcdef");
    snprintf(c.to_id, sizeof c.to_id, "00000000000000aa");
    snprintf(c.id, sizeof c.id, "00000000000000ab");
    c.to_cum = 9000;
    c.created = 1;
    enum { W = 5000 };
    fs_cobj *o = calloc(W, sizeof *o);
    CHECK(o != NULL);
    if (!o) return;
    for (size_t r = 0; r < W; r++) o[r] = (fs_cobj){.bytes = 16 + 52, .index = 0, .tiles = 1};
    c.world = 1;
    c.bytes = 68;
    CHECK_OK(ferry__sync_compact_add(st, run, NULL, "", &c, o));
    c.from = 3;
    c.world = W;
    c.bytes = 68 * (uint64_t)W;
    int rc = ferry__sync_compact_add(st, run, NULL, "", &c, o);
    CHECK(rc == FERRY_ERR_LIMIT && has("compactions.json"));
    if (rc != FERRY_ERR_LIMIT) fprintf(stderr, "rc %d: %s\n", rc, ferry_last_error());
    fs_index ix;
    rc = ferry__sync_index_read(st, run, NULL, NULL, &ix, NULL);
    CHECK(rc == FERRY_OK && ix.n == 1 && ix.c[0].from == 2 && ix.c[0].world == 1);
    if (rc) fprintf(stderr, "read: %s\n", ferry_last_error());
    else ferry__sync_index_release(&ix);
    free(o);
    ferry_store_free(st);
}

/* GC (keep 2: versions 5..7 retained, anchors every 4) removes versions
 * 2..4 but keeps the compaction 2..6: an island still holding 2 goes
 * through it ("compacted 2..6 + chain 6..7"); with the compacted objects
 * truncated it starts over from anchor 5.  Both exact. */
static void t_compact_gc(void)
{
    SKIP_UNLESS_DATA("rl-a");
    char run[64];
    group g;
    ferry_store *st = run_open(run, &g, 2, 1024, 4, 0);
    ferry_model *m[7];
    publish_steps(&g, m, 7);
    island a, b;
    CHECK_OK(island_open(&a, st, run, m[1], L_ROWS, 0, 2));
    CHECK_OK(island_open(&b, st, run, m[1], L_COLS, 1, 2));
    CHECK_RC(island_pull(&a, 2, m[1], NULL), 0);
    CHECK_RC(island_pull(&b, 2, m[1], NULL), 0);
    ferry_compact_options co = {.from = 2, .to = 6};
    ferry_shard_compact_info ci;
    CHECK_OK(ferry_shard_compact(st, run, &co, &ci));
    ferry_gc_options o = {.keep = 2, .grace_s = -1};
    ferry_gc_report rep;
    CHECK_OK(ferry_gc(st, run, &o, &rep));
    CHECK(rep.oldest_retained == 5 && rep.compactions_dropped == 0);
    ferry_shard_pull_info pi;
    CHECK_OK(ferry_shard_pull(a.s, FERRY_SYNC_EXACT, 7, &pi));
    CHECK(!strcmp(pi.path, "compacted 2..6 + chain 6..7"));
    for (size_t i = 0; i < a.n; i++) CHECK(region_matches(a.s, i, m[6], &a.rg[i]));
    for (uint32_t r = 0; r < 2; r++) {
        char key[FS_KEY_CAP], path[1024];
        ferry__sync_key_compact_rank(key, run, 2, 6, ci.id, r);
        snprintf(path, sizeof path, "%s/%s", g_root, key);
        void *d;
        size_t n;
        CHECK_OK(ferry_file_read(path, (size_t)1 << 30, &d, &n));
        CHECK_OK(ferry_file_write(path, d, n / 2));
        ferry_free(d);
    }
    CHECK_OK(ferry_shard_pull(b.s, FERRY_SYNC_EXACT, 7, &pi));
    CHECK(!strcmp(pi.path, "anchor 5 + chain 5..7"));
    for (size_t i = 0; i < b.n; i++) CHECK(region_matches(b.s, i, m[6], &b.rg[i]));
    island_close(&a);
    island_close(&b);
    group_close(&g);
    for (int v = 0; v < 7; v++) ferry_model_free(m[v]);
    ferry_store_free(st);
}

int main(void)
{
    snprintf(g_root, sizeof g_root, "%s/ferry-test-shard-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(t_grid);
    RUN(t_publish_and_follow);
    RUN(t_fp32_master);
    RUN(t_bad_parts);
    RUN(t_corrupt_objects);
    RUN(t_forged_tile);
    RUN(t_index_form);
    RUN(t_index_hostile);
    RUN(t_index_grid_changed);
    RUN(t_index_no_codec);
    RUN(t_kind_mismatch);
    RUN(t_gc);
    RUN(t_signed);
    RUN(t_store_list);
    RUN(t_fp8);
    RUN(t_requests);
    RUN(t_compact);
    RUN(t_compact_index);
    RUN(t_compact_signed);
    RUN(t_compact_gc);
    RUN(t_compact_forged);
    RUN(t_compact_transient);
    RUN(t_compact_index_full);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_root);
    return CHECK_SUMMARY();
}
