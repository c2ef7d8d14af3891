/* Island ranks that keep their slices between processes
 * (include/ferry_shard_state.h), in one process: two publisher handles
 * stand for 2 trainer ranks; an island pulls, its regions are handed to a
 * new handle (ferry_shard_subscriber_resume), which then fetches only the
 * deltas and holds what a fresh island holds.  Data that are not the
 * version's, a gone version, regions off the tile edges and misuse are
 * distinct errors that leave the handle holding nothing.
 * tests/scripts/shard_pull_follow.sh runs the CLI side. */
#include "check.h"
#include "ferry_shard_state.h"

#include <stdbool.h>
#include <stdint.h>
#include <glob.h>
#include <unistd.h>

#ifndef FERRY_NO_NET /* a core build (NO_NET=1) has no store: the case skips */
static char g_root[256];

static ferry_model *step(int i)
{
    char rel[64], path[512];
    snprintf(rel, sizeof rel, "rl-a/step-%03d.safetensors", i);
    ferry_model *m = NULL;
    if (ferry_model_open(data_path(path, sizeof path, rel), &m)) fprintf(stderr, "%s: %s\n", path, ferry_last_error());
    return m;
}

/* One version of m from 2 ranks: rank r owns rows [r*rows/2, (r+1)*rows/2). */
static int publish2(ferry_shard_publisher *const p[2], const ferry_model *m)
{
    ferry_shard_part parts[2][128];
    size_t np[2] = {0, 0};
    for (size_t i = 0; i < ferry_model_count(m); i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        uint64_t rows = t->ndim ? t->shape[0] : 1, cols = 1;
        for (uint32_t d = 1; d < t->ndim; d++) cols *= t->shape[d];
        for (int r = 0; r < 2; r++) {
            uint64_t a = rows * (uint64_t)r / 2, b = rows * (uint64_t)(r + 1) / 2;
            if (a == b || np[r] == 128) continue;
            parts[r][np[r]++] = (ferry_shard_part){t->name, t->dtype, t->ndim, t->shape, a, b,
                                                   (const uint8_t *)t->data + a * cols * (ferry_dtype_bits(t->dtype) / 8)};
        }
    }
    char *tok = NULL, *rec[2] = {0};
    size_t tn = 0, rn[2] = {0};
    int rc = ferry_shard_begin(p[0], 0, &tok, &tn);
    for (int r = 0; r < 2 && !rc; r++) rc = ferry_shard_put(p[r], tok, tn, parts[r], np[r], &rec[r], &rn[r]);
    if (!rc) rc = ferry_shard_commit(p[0], tok, tn, (const char *const *)rec, rn, 2, NULL);
    for (int r = 0; r < 2; r++) {
        int f = ferry_shard_finish(p[r], rc == 0);
        if (!rc) rc = f;
        ferry_free(rec[r]);
    }
    ferry_free(tok);
    return rc;
}

/* The regions of s, copied out (bufs[i], sizes[i]); 0 or an error. */
static int copy_out(const ferry_shard_subscriber *s, size_t n, uint8_t **bufs, size_t *sizes)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t nb;
        int rc = ferry_shard_region_shape(s, i, NULL, NULL, NULL, &nb);
        if (rc) return rc;
        if (!(bufs[i] = malloc(nb + 1))) return FERRY_ERR_NOMEM;
        sizes[i] = (size_t)nb;
        if ((rc = ferry_shard_region_copy(s, i, bufs[i], nb))) return rc;
    }
    return 0;
}

static bool same_regions(const ferry_shard_subscriber *a, const ferry_shard_subscriber *b, size_t n)
{
    uint8_t *x[8] = {0}, *y[8] = {0};
    size_t xs[8], ys[8];
    bool same = !copy_out(a, n, x, xs) && !copy_out(b, n, y, ys);
    for (size_t i = 0; i < n && same; i++) same = xs[i] == ys[i] && !memcmp(x[i], y[i], xs[i]);
    for (size_t i = 0; i < n; i++) {
        free(x[i]);
        free(y[i]);
    }
    return same;
}

static void t_resume(void)
{
    SKIP_UNLESS_DATA("rl-a");
    ferry_store_options so = {.create = 1};
    ferry_store *st = NULL;
    CHECK_OK(ferry_store_open(g_root, &so, &st));
    const char *run = "t/state";
    ferry_shard_publisher *p[2] = {0};
    for (uint32_t r = 0; r < 2; r++) {
        ferry_shard_options o = {.rank = r, .world = 2, .min_tile_words = 256, .publisher_id = "test-state"};
        CHECK_OK(ferry_shard_publisher_open(st, run, &o, &p[r]));
    }
    for (int v = 1; v <= 2; v++) {
        ferry_model *m = step(v - 1);
        CHECK_OK(publish2(p, m));
        ferry_model_free(m);
    }
    /* regions on tile edges: whole tensors and a rank's half */
    const ferry_shard_region rg[] = {{"model.norm.weight", 0, 0, 0, 0},
                                     {"lm_head.weight", 1024, 2048, 0, 0},
                                     {"model.layers.0.self_attn.q_proj.weight", 0, 0, 0, 0}};
    size_t n = sizeof rg / sizeof rg[0];

    /* the tensor list of the run */
    ferry_shard_tensor_list *tl = NULL;
    CHECK_OK(ferry_shard_tensors(st, run, NULL, &tl));
    ferry_model *m1 = step(1);
    CHECK(tl && tl->version == 2 && tl->count == ferry_model_count(m1));
    for (size_t i = 0; tl && m1 && i < tl->count; i++) {
        const ferry_tensor *t = ferry_model_find(m1, tl->tensors[i].name);
        CHECK(t && t->dtype == tl->tensors[i].dtype && t->ndim == tl->tensors[i].ndim &&
              !memcmp(t->shape, tl->tensors[i].shape, t->ndim * sizeof *t->shape));
    }
    ferry_shard_tensor_list_free(tl);
    ferry_model_free(m1);
    CHECK_RC(ferry_shard_tensors(st, "t/none", NULL, &tl), FERRY_ERR_SYNC_NOT_YET);

    /* an island at version 2; its regions kept */
    ferry_shard_subscriber *a = NULL, *b = NULL, *fresh = NULL;
    CHECK_OK(ferry_shard_subscriber_open(st, run, rg, n, NULL, &a));
    CHECK_OK(ferry_shard_pull(a, FERRY_SYNC_LATEST, 0, NULL));
    char id[FERRY_SYNC_ID_LEN + 1];
    ferry_shard_subscriber_held_id(a, id);
    CHECK(strlen(id) == FERRY_SYNC_ID_LEN);
    uint8_t *kept[8] = {0};
    size_t ks[8] = {0};
    CHECK_OK(copy_out(a, n, kept, ks));
    const void *data[8];
    for (size_t i = 0; i < n; i++) data[i] = kept[i];

    /* misuse and bad data: distinct errors, nothing held after them */
    CHECK_OK(ferry_shard_subscriber_open(st, run, rg, n, NULL, &b));
    size_t bad_sizes[8];
    memcpy(bad_sizes, ks, sizeof ks);
    bad_sizes[1]--;
    CHECK_RC(ferry_shard_subscriber_resume(b, 2, id, data, bad_sizes, NULL), FERRY_ERR_ARG);
    CHECK_RC(ferry_shard_subscriber_resume(b, 2, "not-hex", data, ks, NULL), FERRY_ERR_ARG);
    CHECK_RC(ferry_shard_subscriber_resume(b, 2, "0123456789abcdef", data, ks, NULL), FERRY_ERR_SYNC_GONE);
    kept[2][ks[2] / 2] ^= 0x01;
    uint64_t mb = 0;
    CHECK_RC(ferry_shard_subscriber_resume(b, 2, id, data, ks, &mb), FERRY_ERR_SYNC_CORRUPT);
    CHECK(strstr(ferry_last_error(), "q_proj") != NULL);
    CHECK(mb > 0 && ferry_shard_subscriber_version(b) == 0);
    kept[2][ks[2] / 2] ^= 0x01;
    const ferry_shard_region odd[] = {{"lm_head.weight", 3, 70, 0, 0}};
    ferry_shard_subscriber *o = NULL;
    CHECK_OK(ferry_shard_subscriber_open(st, run, odd, 1, NULL, &o));
    uint8_t *ob = calloc(67 * 192 * 2, 1);
    const void *od[1] = {ob};
    size_t os[1] = {67 * 192 * 2};
    CHECK_RC(ferry_shard_subscriber_resume(o, 2, id, od, os, NULL), FERRY_ERR_SHARD_REGION);
    CHECK(strstr(ferry_last_error(), "tile edges") != NULL);
    free(ob);
    ferry_shard_subscriber_free(o);

    /* the right data: held at 2, as the island that pulled it */
    CHECK_OK(ferry_shard_subscriber_resume(b, 2, id, data, ks, &mb));
    CHECK(ferry_shard_subscriber_version(b) == 2);
    CHECK(same_regions(a, b, n));
    CHECK_RC(ferry_shard_subscriber_resume(b, 2, id, data, ks, NULL), FERRY_ERR_ARG); /* holds one already */

    /* version 3: the resumed handle fetches only the deltas */
    ferry_model *m2 = step(2);
    CHECK_OK(publish2(p, m2));
    ferry_model_free(m2);
    ferry_shard_pull_info ib, ifr;
    CHECK_OK(ferry_shard_pull(b, FERRY_SYNC_LATEST, 0, &ib));
    CHECK_OK(ferry_shard_subscriber_open(st, run, rg, n, NULL, &fresh));
    CHECK_OK(ferry_shard_pull(fresh, FERRY_SYNC_LATEST, 0, &ifr));
    CHECK(ib.from_version == 2 && ib.to_version == 3 && !strcmp(ib.path, "chain 2..3"));
    CHECK(ifr.from_version == 0 && ifr.to_version == 3);
    /* all bytes read (HEAD, manifests, tile indexes, tiles): at this
     * 256-word grid the index form reads the delta objects whole (their
     * leaves would cost more than the tiles not wanted), so the tile bytes
     * alone are not the measure */
    CHECK(ib.object_bytes > 0 && ib.bytes_fetched * 3 < ifr.bytes_fetched);
    CHECK(same_regions(b, fresh, n));
    int all = 1;
    size_t cnt = 0;
    CHECK_OK(ferry_shard_region_changes(b, 2, &all, NULL, NULL, &cnt));
    CHECK(!all); /* a delta: the elements changed, not the region whole */

    for (size_t i = 0; i < n; i++) free(kept[i]);
    ferry_shard_subscriber_free(a);
    ferry_shard_subscriber_free(b);
    ferry_shard_subscriber_free(fresh);
    for (int r = 0; r < 2; r++) ferry_shard_publisher_free(p[r]);
    ferry_store_free(st);
}

/* The tile index section at the end of the object file matching pattern
 * under g_root (its data, size, and where the index starts); 0 or -1. */
static int ix_load(const char *pattern, uint8_t **d, size_t *n, size_t *at, char path[1024])
{
    char pat[1400];
    snprintf(pat, sizeof pat, "%s/%s", g_root, pattern);
    glob_t gl;
    if (glob(pat, 0, NULL, &gl) || gl.gl_pathc != 1) {
        globfree(&gl);
        return -1;
    }
    snprintf(path, 1024, "%s", gl.gl_pathv[0]);
    globfree(&gl);
    void *dv;
    if (ferry_file_read(path, (size_t)1 << 30, &dv, n)) return -1;
    *d = dv;
    for (*at = *n; (*at)-- > 0;)
        if (*at + 16 <= *n && !memcmp(*d + *at, "FSHIDX01", 8)) return 0;
    ferry_free(dv);
    return -1;
}

/* Resume trusts no unsigned byte of a tile index: a store that puts
 * version 1's tile targets into version 2's index entries (lengths and
 * leaves kept) so that version 1's data pass for version 2's is refused
 * (the leaves no longer hash to the signed root), nothing held. */
static void t_resume_hostile_index(void)
{
    SKIP_UNLESS_DATA("rl-a");
    ferry_store_options so = {.create = 1};
    ferry_store *st = NULL;
    CHECK_OK(ferry_store_open(g_root, &so, &st));
    const char *run = "t/state-ix";
    ferry_shard_publisher *p[2] = {0};
    for (uint32_t r = 0; r < 2; r++) {
        ferry_shard_options o = {.rank = r, .world = 2, .min_tile_words = 256, .publisher_id = "test-state"};
        CHECK_OK(ferry_shard_publisher_open(st, run, &o, &p[r]));
    }
    const ferry_shard_region rg[] = {{"model.layers.0.self_attn.q_proj.weight", 0, 0, 0, 0}, {"lm_head.weight", 0, 0, 0, 0}};
    size_t n = sizeof rg / sizeof rg[0];
    ferry_model *m0 = step(0), *m1 = step(1);
    CHECK_OK(publish2(p, m0));
    ferry_shard_subscriber *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(ferry_shard_subscriber_open(st, run, rg, n, NULL, &a));
    CHECK_OK(ferry_shard_pull(a, FERRY_SYNC_LATEST, 0, NULL));
    uint8_t *v1[8] = {0};
    size_t ks[8] = {0};
    CHECK_OK(copy_out(a, n, v1, ks));
    CHECK_OK(publish2(p, m1));
    CHECK_OK(ferry_shard_subscriber_open(st, run, rg, n, NULL, &c));
    CHECK_OK(ferry_shard_pull(c, FERRY_SYNC_LATEST, 0, NULL));
    char id[FERRY_SYNC_ID_LEN + 1];
    ferry_shard_subscriber_held_id(c, id);
    CHECK(!same_regions(a, c, n)); /* version 1's data are not version 2's */
    for (int r = 0; r < 2; r++) {
        char pa[64], pd[64], fa[1024], fd[1024];
        snprintf(pa, sizeof pa, "t/state-ix/v/*1-*-r%06d.anchor", r);
        snprintf(pd, sizeof pd, "t/state-ix/v/*2-*-r%06d.patch", r);
        uint8_t *da = NULL, *dd = NULL;
        size_t na = 0, nd = 0, xa = 0, xd = 0;
        CHECK(ix_load(pa, &da, &na, &xa, fa) == 0 && ix_load(pd, &dd, &nd, &xd, fd) == 0);
        if (!da || !dd) continue;
        CHECK(!memcmp(da + xa + 8, dd + xd + 8, 8)); /* one grid: as many tiles */
        uint64_t cnt = 0;
        for (int i = 0; i < 8; i++) cnt |= (uint64_t)dd[xd + 8 + i] << (8 * i);
        for (uint64_t i = 0; i < cnt; i++) memcpy(dd + xd + 16 + 20 * i + 4, da + xa + 16 + 20 * i + 4, 16);
        CHECK(ferry_file_write(fd, dd, nd) == 0);
        ferry_free(da);
        ferry_free(dd);
    }
    const void *data[8];
    for (size_t i = 0; i < n; i++) data[i] = v1[i];
    CHECK_OK(ferry_shard_subscriber_open(st, run, rg, n, NULL, &b));
    CHECK_RC(ferry_shard_subscriber_resume(b, 2, id, data, ks, NULL), FERRY_ERR_SYNC_CORRUPT);
    CHECK(strstr(ferry_last_error(), "index leaf") != NULL && strstr(ferry_last_error(), ".patch") != NULL);
    CHECK(ferry_shard_subscriber_version(b) == 0);
    for (size_t i = 0; i < n; i++) free(v1[i]);
    ferry_model_free(m0);
    ferry_model_free(m1);
    ferry_shard_subscriber_free(a);
    ferry_shard_subscriber_free(b);
    ferry_shard_subscriber_free(c);
    for (int r = 0; r < 2; r++) ferry_shard_publisher_free(p[r]);
    ferry_store_free(st);
}

#else
static void t_resume(void) { SKIP("no store layer in a core build (NO_NET=1)"); }
static void t_resume_hostile_index(void) { SKIP("no store layer in a core build (NO_NET=1)"); }
#endif

int main(void)
{
#ifdef FERRY_NO_NET
    RUN(t_resume);
    RUN(t_resume_hostile_index);
    return CHECK_SUMMARY();
#else
    snprintf(g_root, sizeof g_root, "%s/ferry-test-shard-state-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(t_resume);
    RUN(t_resume_hostile_index);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_root);
    return CHECK_SUMMARY();
#endif
}
