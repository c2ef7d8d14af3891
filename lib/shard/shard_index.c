/* The tile index at the end of a rank object (issue 24 item 2; the layout
 * is in shard_impl.h, the protocol in docs/PROTOCOL.md "Sharded
 * versions").  The index is hostile input until its leaves hash to the
 * root the signed manifest gives: every count and length is checked and
 * overflow-checked before anything is allocated or addressed with it. */
#include "shard_impl.h"

#include <stdlib.h>

int ferry__shard_legacy_manifest = 0;

static void put_u32(uint8_t *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *b)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)b[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
    return v;
}

void ferry__shard_ix_release(sh_ix *x)
{
    free(x->off);
    free(x->target);
    free(x->leaf);
    memset(x, 0, sizeof *x);
}

bool ferry__shard_ix_size(uint64_t n, bool leaves, uint64_t *out)
{
    uint64_t per = SH_IX_ENTRY + (leaves ? SH_IX_LEAF : 0), b;
    return n <= SH_TILES_MAX && ferry__mul_u64(n, per, &b) && ferry__add_u64(b, SH_IX_HEAD, out);
}

int ferry__shard_ix_write(ferry_buf *obj, sh_tile *const *t, size_t n, int kind, uint64_t *index_off, uint8_t root[32])
{
    uint64_t size;
    if (!n || !ferry__shard_ix_size(n, true, &size)) return ferry__fail(FERRY_ERR_LIMIT, "tile index of %zu tiles", n);
    uint8_t *sec = ferry__malloc((size_t)size), *nodes = NULL;
    if (!sec) return FERRY_ERR_NOMEM;
    memcpy(sec, SH_INDEX_MAGIC, 8);
    put_u64(sec + 8, n);
    uint8_t *ent = sec + SH_IX_HEAD, *leaves = ent + (size_t)n * SH_IX_ENTRY;
    int rc = FERRY_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        const sh_loc *l = &t[i]->loc[kind];
        uint8_t sha[32];
        if (l->size > UINT32_MAX) rc = ferry__fail(FERRY_ERR_LIMIT, "a tile payload of %llu bytes (the index holds 32-bit lengths)",
                                                   (unsigned long long)l->size);
        else if (!ferry__unhex(sha, l->sha, 32)) rc = ferry__fail(FERRY_ERR_ARG, "a tile's SHA-256 is not hex");
        if (rc) break;
        put_u32(ent + i * SH_IX_ENTRY, (uint32_t)l->size);
        memcpy(ent + i * SH_IX_ENTRY + 4, t[i]->target, 16);
        ferry__shard_merkle_leaf(l->size, t[i]->target, sha, leaves + i * SH_IX_LEAF);
        t[i]->leaf = i;
    }
    if (!rc) rc = ferry__shard_merkle_build(leaves, n, &nodes, root);
    free(nodes);
    *index_off = obj->size;
    if (!rc) rc = ferry__buf_append(obj, sec, (size_t)size);
    free(sec);
    return rc;
}

int ferry__shard_ix_parse(const char *key, const uint8_t *sec, uint64_t len, uint64_t want_n, uint64_t index_off, bool leaves,
                          sh_ix *out)
{
    memset(out, 0, sizeof *out);
    uint64_t need = 0;
    if (len < SH_IX_HEAD || memcmp(sec, SH_INDEX_MAGIC, 8))
        return ferry__fail(FERRY_ERR_SHARD_INDEX, "%s: the tile index at offset %llu does not begin with %s", key,
                           (unsigned long long)index_off, SH_INDEX_MAGIC);
    uint64_t n = get_u64(sec + 8);
    if (n != want_n)
        return ferry__fail(FERRY_ERR_SHARD_INDEX, "%s: the tile index counts %llu tiles, the manifest %llu", key, (unsigned long long)n,
                           (unsigned long long)want_n);
    if (!ferry__shard_ix_size(n, leaves, &need) || len != need)
        return ferry__fail(FERRY_ERR_SHARD_INDEX, "%s: the tile index of %llu tiles is %llu bytes, not %llu", key, (unsigned long long)n,
                           (unsigned long long)len, (unsigned long long)need);
    out->n = n;
    out->off = ferry__calloc((size_t)n + 1, sizeof *out->off);
    out->target = ferry__malloc((size_t)n * 16 + 1);
    if (leaves) out->leaf = ferry__malloc((size_t)n * SH_IX_LEAF + 1);
    if (!out->off || !out->target || (leaves && !out->leaf)) {
        ferry__shard_ix_release(out);
        return FERRY_ERR_NOMEM;
    }
    const uint8_t *ent = sec + SH_IX_HEAD;
    uint64_t at = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t l = get_u32(ent + i * SH_IX_ENTRY);
        out->off[i] = at;
        if (!l || !ferry__add_u64(at, l, &at) || at > index_off) {
            ferry__shard_ix_release(out);
            if (!l) return ferry__fail(FERRY_ERR_SHARD_INDEX, "%s: tile index entry %llu: length 0", key, (unsigned long long)i);
            return ferry__fail(FERRY_ERR_SHARD_INDEX, "%s: tile index entry %llu: length %u runs past the payloads (they end at "
                               "offset %llu)", key, (unsigned long long)i, l, (unsigned long long)index_off);
        }
        memcpy(out->target + i * 16, ent + i * SH_IX_ENTRY + 4, 16);
    }
    out->off[n] = at;
    if (at != index_off) {
        ferry__shard_ix_release(out);
        return ferry__fail(FERRY_ERR_SHARD_INDEX, "%s: the tile index's lengths sum to %llu, its payloads end at %llu", key,
                           (unsigned long long)at, (unsigned long long)index_off);
    }
    if (leaves) memcpy(out->leaf, ent + n * SH_IX_ENTRY, (size_t)n * SH_IX_LEAF);
    return FERRY_OK;
}

int ferry__shard_ix_check_root(const char *key, const sh_ix *x, const uint8_t root[32])
{
    uint8_t *nodes = NULL, r[32];
    int rc = ferry__shard_merkle_build(x->leaf, (size_t)x->n, &nodes, r);
    free(nodes);
    if (rc) return rc;
    if (memcmp(r, root, 32))
        return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: the tile index's leaves do not hash to the manifest's root", key);
    return FERRY_OK;
}

int ferry__shard_ix_leaf(const sh_ix *x, size_t i, const uint8_t *payload, uint8_t out[32])
{
    uint8_t sha[32];
    uint64_t len = x->off[i + 1] - x->off[i];
    int rc = ferry__sha256(payload, (size_t)len, sha);
    if (!rc) ferry__shard_merkle_leaf(len, x->target + 16 * i, sha, out);
    return rc;
}

int ferry__shard_object_check(const char *key, const sh_doc *m, uint32_t r, int kind, const uint8_t *d, uint64_t n)
{
    size_t o = 2 * (size_t)r + (size_t)kind;
    uint64_t ioff = m->obj_index[o], len = n - (ioff < n ? ioff : n);
    if (ioff >= n) return ferry__fail(FERRY_ERR_SHARD_INDEX, "%s: its index offset %llu lies outside its %llu bytes", key,
                                      (unsigned long long)ioff, (unsigned long long)n);
    sh_ix x;
    int rc = ferry__shard_ix_parse(key, d + ioff, len, m->obj_tiles[o], ioff, true, &x);
    if (rc) return rc;
    for (uint64_t i = 0; i < x.n && !rc; i++) {
        uint8_t leaf[32];
        if ((rc = ferry__shard_ix_leaf(&x, (size_t)i, d + x.off[i], leaf))) break;
        if (memcmp(leaf, x.leaf + i * SH_IX_LEAF, 32))
            rc = ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: tile %llu (bytes %llu..%llu) does not hash to its index leaf", key,
                             (unsigned long long)i, (unsigned long long)x.off[i], (unsigned long long)x.off[i + 1]);
    }
    if (!rc) rc = ferry__shard_ix_check_root(key, &x, m->obj_root + 32 * o);
    ferry__shard_ix_release(&x);
    return rc;
}
