/* The hash tree of a rank object's tiles (issue 24 item 2; the index layout
 * sized in bench/shard_index.py, "C"): the root of each object's tile index
 * (shard_index.c) that the manifest signs.  Proofs of a subset
 * (ferry__shard_merkle_proof / _verify) are not used yet: the inner nodes
 * are not stored (docs/SHARDING.md "Limits").
 *
 *   leaf  = SHA-256(0x00 || u32le length || target[16] || SHA-256(payload))
 *   node  = SHA-256(0x01 || left || right)
 * A level of cnt nodes makes ceil(cnt / 2) parents; an odd last node is
 * promoted unchanged (it has no sibling).  The nodes are stored level by
 * level, leaves first; position() gives a node's place in that array. */
#include "shard_impl.h"

#include <stdlib.h>

void ferry__shard_merkle_leaf(uint64_t len, const uint8_t target[16], const uint8_t payload_sha[32], uint8_t out[32])
{
    uint8_t b[1 + 4 + 16 + 32];
    b[0] = 0;
    for (int i = 0; i < 4; i++) b[1 + i] = (uint8_t)(len >> (8 * i));
    memcpy(b + 5, target, 16);
    memcpy(b + 21, payload_sha, 32);
    ferry__sha256(b, sizeof b, out);
}

static void node(const uint8_t *l, const uint8_t *r, uint8_t out[32])
{
    uint8_t b[65];
    b[0] = 1;
    memcpy(b + 1, l, 32);
    memcpy(b + 33, r, 32);
    ferry__sha256(b, sizeof b, out);
}

size_t ferry__shard_merkle_count(size_t n)
{
    size_t total = n;
    while (n > 1) {
        n = (n + 1) / 2;
        total += n;
    }
    return total;
}

/* Index in the stored array of node i of `level` (0: leaves) of a tree of n leaves. */
static size_t position(size_t n, unsigned level, size_t i)
{
    size_t at = 0;
    for (unsigned l = 0; l < level; l++) {
        at += n;
        n = (n + 1) / 2;
    }
    return at + i;
}

int ferry__shard_merkle_build(const uint8_t *leaves, size_t n, uint8_t **nodes, uint8_t root[32])
{
    *nodes = NULL;
    if (!n || n > SH_TILES_MAX) return ferry__fail(FERRY_ERR_ARG, "hash tree of %zu tiles (1..%llu)", n, (unsigned long long)SH_TILES_MAX);
    size_t total = ferry__shard_merkle_count(n);
    uint8_t *a = ferry__malloc(total * 32);
    if (!a) return FERRY_ERR_NOMEM;
    memcpy(a, leaves, n * 32);
    size_t at = 0, cnt = n;
    while (cnt > 1) {
        size_t up = (cnt + 1) / 2;
        for (size_t i = 0; i < up; i++) {
            const uint8_t *l = a + (at + 2 * i) * 32;
            if (2 * i + 1 < cnt) node(l, l + 32, a + (at + cnt + i) * 32);
            else memcpy(a + (at + cnt + i) * 32, l, 32);
        }
        at += cnt;
        cnt = up;
    }
    memcpy(root, a + at * 32, 32);
    *nodes = a;
    return FERRY_OK;
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* The walk shared by proof and verify: `have` holds the sorted, distinct
 * indices of the known nodes of the current level (hash[k] for have[k]
 * when hashing).  need: appends the positions of the sibling nodes the
 * reader must fetch; verify (get != NULL): takes them from get(). */
typedef int (*sibling_fn)(void *ctx, size_t pos, uint8_t out[32]);

static int walk(size_t n, size_t *have, uint8_t *hash, size_t k, size_t **need, size_t *nneed, sibling_fn get, void *ctx,
                uint8_t root[32])
{
    size_t cnt = n, cap = 0;
    unsigned level = 0;
    while (cnt > 1) {
        size_t m = 0;
        for (size_t j = 0; j < k; j++) {
            size_t i = have[j], sib = i ^ 1, parent = i / 2;
            bool paired = j + 1 < k && have[j + 1] == sib && !(i & 1);
            uint8_t h[32];
            if (sib >= cnt) { /* promoted */
                if (hash) memcpy(h, hash + j * 32, 32);
            } else if (paired) {
                if (hash) node(hash + j * 32, hash + (j + 1) * 32, h);
                j++;
            } else {
                size_t pos = position(n, level, sib);
                if (need) {
                    if (ferry__grow((void **)need, &cap, *nneed + 1, sizeof **need)) return FERRY_ERR_NOMEM;
                    (*need)[(*nneed)++] = pos;
                }
                if (hash) {
                    uint8_t s[32];
                    int rc = get(ctx, pos, s);
                    if (rc) return rc;
                    if (i & 1) node(s, hash + j * 32, h);
                    else node(hash + j * 32, s, h);
                }
            }
            have[m] = parent;
            if (hash) memcpy(hash + m * 32, h, 32);
            m++;
        }
        k = m;
        cnt = (cnt + 1) / 2;
        level++;
    }
    if (hash) memcpy(root, hash, 32);
    return FERRY_OK;
}

static int sorted_copy(size_t n, const size_t *idx, size_t k, size_t **out)
{
    if (!k || k > n) return ferry__fail(FERRY_ERR_ARG, "hash tree: %zu of %zu leaves", k, n);
    size_t *h = ferry__malloc(k * sizeof *h);
    if (!h) return FERRY_ERR_NOMEM;
    memcpy(h, idx, k * sizeof *h);
    qsort(h, k, sizeof *h, cmp_size);
    for (size_t j = 0; j < k; j++)
        if (h[j] >= n || (j && h[j] == h[j - 1])) {
            size_t leaf = h[j];
            free(h);
            return ferry__fail(FERRY_ERR_ARG, "hash tree of %zu leaves: leaf %zu out of range or given twice", n, leaf);
        }
    *out = h;
    return FERRY_OK;
}

int ferry__shard_merkle_proof(size_t n, const size_t *idx, size_t k, size_t **pos, size_t *npos)
{
    *pos = NULL;
    *npos = 0;
    size_t *have = NULL;
    int rc = sorted_copy(n, idx, k, &have);
    if (rc) return rc;
    rc = walk(n, have, NULL, k, pos, npos, NULL, NULL, NULL);
    free(have);
    if (rc) {
        free(*pos);
        *pos = NULL;
        *npos = 0;
    }
    return rc;
}

typedef struct {
    const size_t *pos;
    const uint8_t *hash;
    size_t n;
    const char *what;
} given;

static int from_given(void *ctx, size_t pos, uint8_t out[32])
{
    const given *g = ctx;
    const size_t *p = bsearch(&pos, g->pos, g->n, sizeof *g->pos, cmp_size);
    if (!p) return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: the hash tree's node %zu is missing", g->what, pos);
    memcpy(out, g->hash + (size_t)(p - g->pos) * 32, 32);
    return FERRY_OK;
}

int ferry__shard_merkle_verify(const char *what, size_t n, const size_t *idx, const uint8_t *leaves, size_t k, const size_t *pos,
                               const uint8_t *nodes, size_t npos, const uint8_t root[32])
{
    if (!n || n > SH_TILES_MAX) return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: a hash tree of %zu tiles", what, n);
    for (size_t j = 1; j < npos; j++)
        if (pos[j] <= pos[j - 1]) return ferry__fail(FERRY_ERR_ARG, "%s: hash tree node positions not ascending", what);
    if (!k || k > n) return ferry__fail(FERRY_ERR_ARG, "%s: %zu of %zu leaves", what, k, n);
    for (size_t j = 0; j < k; j++)
        if (idx[j] >= n || (j && idx[j] <= idx[j - 1]))
            return ferry__fail(FERRY_ERR_ARG, "%s: leaf indices not ascending below %zu", what, n);
    size_t *have = ferry__malloc(k * sizeof *have);
    uint8_t *h = ferry__malloc(k * 32);
    if (!h || !have) {
        free(have);
        free(h);
        return FERRY_ERR_NOMEM;
    }
    memcpy(have, idx, k * sizeof *have);
    memcpy(h, leaves, k * 32);
    given g = {pos, nodes, npos, what};
    uint8_t got[32];
    int rc = walk(n, have, h, k, NULL, NULL, from_given, &g, got);
    if (!rc && memcmp(got, root, 32)) rc = ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: its tiles do not hash to the signed root", what);
    free(have);
    free(h);
    return rc;
}
