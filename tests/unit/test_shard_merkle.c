/* The hash tree over a rank object's tiles (lib/shard/shard_merkle.c, issue
 * 24 item 2): for every tree size up to 300 leaves and subsets of leaves
 * (one, runs, scattered, all), a reader holding the subset and the proof
 * nodes recomputes the root; a changed leaf, a changed or missing proof
 * node, or another root is FERRY_ERR_SYNC_CORRUPT; the proof sizes are
 * those bench/shard_index.py counts (layout C). */
#include "check.h"

#include <stdlib.h>

#ifndef FERRY_NO_NET
#include "shard/shard_impl.h"

static void leaves_of(size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t target[16], sha[32];
        memset(target, (int)(i * 7 + 1), sizeof target);
        memset(sha, (int)(i * 13 + 5), sizeof sha);
        ferry__shard_merkle_leaf(100 + i, target, sha, out + i * 32);
    }
}

/* Proof, then verify of leaves idx[0..k) (ascending); mode 0: as given,
 * 1: one leaf changed, 2: one proof node changed, 3: one proof node
 * missing, 4: another root.  Returns verify's status (-1: setup failed). */
static int try_subset(size_t n, const size_t *idx, size_t k, int mode, size_t *nproof)
{
    uint8_t *lv = malloc(n * 32), *nodes = NULL, root[32];
    if (!lv) return -1;
    leaves_of(n, lv);
    if (ferry__shard_merkle_build(lv, n, &nodes, root)) {
        free(lv);
        return -1;
    }
    size_t *pos = NULL, np = 0;
    int rc = -1;
    if (!ferry__shard_merkle_proof(n, idx, k, &pos, &np)) {
        *nproof = np;
        uint8_t *have = malloc(k * 32 + 1), *pn = malloc(np * 32 + 1);
        for (size_t j = 0; have && j < k; j++) memcpy(have + j * 32, nodes + idx[j] * 32, 32);
        for (size_t j = 0; pn && j < np; j++) memcpy(pn + j * 32, nodes + pos[j] * 32, 32);
        if (have && pn) {
            if (mode == 1) have[(k / 2) * 32] ^= 1;
            if (mode == 2 && np) pn[(np / 2) * 32 + 3] ^= 0x80;
            size_t used = mode == 3 && np ? np - 1 : np;
            if (mode == 4) root[0] ^= 1;
            rc = ferry__shard_merkle_verify("test object", n, idx, have, k, pos, pn, used, root);
        }
        free(have);
        free(pn);
    }
    free(pos);
    free(nodes);
    free(lv);
    return rc;
}

/* bench/shard_index.py's proof_nodes, in C. */
static size_t model_count(size_t n, const size_t *idx, size_t k)
{
    size_t *lv = malloc(k * sizeof *lv), m = k, cnt = n, count = 0;
    memcpy(lv, idx, k * sizeof *lv);
    while (cnt > 1) {
        for (size_t j = 0; j < m; j++) {
            size_t s = lv[j] ^ 1;
            bool in = false;
            for (size_t q = 0; q < m; q++) in |= lv[q] == s;
            count += s < cnt && !in;
        }
        size_t w = 0;
        for (size_t j = 0; j < m; j++)
            if (!w || lv[w - 1] != lv[j] / 2) lv[w++] = lv[j] / 2;
        m = w;
        cnt = (cnt + 1) / 2;
    }
    free(lv);
    return count;
}

static void t_tree(void)
{
    size_t idx[300];
    int ok = 0, bad = 0, sizes = 0, cases = 0;
    uint64_t seed = 12345;
    for (size_t n = 1; n <= 300; n += (n < 40 ? 1 : 13)) {
        for (int shape = 0; shape < 4; shape++) {
            size_t k = 0;
            if (shape == 0) idx[k++] = (n * 5) / 7; /* one leaf */
            if (shape == 1)                         /* a run */
                for (size_t i = n / 3; i < n && i < n / 3 + 1 + n / 4; i++) idx[k++] = i;
            if (shape == 2) /* scattered */
                for (size_t i = 0; i < n; i++) {
                    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
                    if ((seed >> 33) % 3 == 0) idx[k++] = i;
                }
            if (shape == 3 || !k) /* all */
                for (k = 0; k < n; k++) idx[k] = k;
            cases++;
            size_t np = 0;
            ok += try_subset(n, idx, k, 0, &np) == FERRY_OK;
            sizes += np == model_count(n, idx, k);
            size_t np2;
            bad += try_subset(n, idx, k, 1, &np2) == FERRY_ERR_SYNC_CORRUPT;
            bad += try_subset(n, idx, k, 4, &np2) == FERRY_ERR_SYNC_CORRUPT;
            if (np) {
                bad += try_subset(n, idx, k, 2, &np2) == FERRY_ERR_SYNC_CORRUPT;
                bad += try_subset(n, idx, k, 3, &np2) == FERRY_ERR_SYNC_CORRUPT;
            } else {
                bad += 2;
            }
        }
    }
    CHECK(ok == cases);
    CHECK(sizes == cases);
    CHECK(bad == 4 * cases);
    /* all leaves need no proof; one leaf of 256 needs 8 siblings */
    for (size_t i = 0; i < 256; i++) idx[i] = i;
    size_t np = 9;
    CHECK(try_subset(256, idx, 256, 0, &np) == FERRY_OK && np == 0);
    idx[0] = 200;
    CHECK(try_subset(256, idx, 1, 0, &np) == FERRY_OK && np == 8);
    /* misuse */
    size_t *pos = NULL, npos = 0, two[2] = {3, 3};
    CHECK_RC(ferry__shard_merkle_proof(4, two, 2, &pos, &npos), FERRY_ERR_ARG);
    two[1] = 4;
    CHECK_RC(ferry__shard_merkle_proof(4, two, 2, &pos, &npos), FERRY_ERR_ARG);
    uint8_t *nodes = NULL, root[32];
    CHECK_RC(ferry__shard_merkle_build(NULL, 0, &nodes, root), FERRY_ERR_ARG);
    CHECK(nodes == NULL && pos == NULL);
}
#else
static void t_tree(void) { SKIP("lib/shard is not in a core build (NO_NET=1)"); }
#endif

int main(void)
{
    RUN(t_tree);
    return CHECK_SUMMARY();
}
