/* Tile payloads (docs/FORMAT.md "Tiles", tile codec "ferry-tile-1").
 *
 * A tile's update is no standalone patch: it is the sparse chunk(s) of the
 * patch codec (lib/codec/sparse.h) coding the tile's words against the
 * previous version's tile, or the tile's bytes whole (zstd or raw), behind
 * one code byte.  What a standalone patch added per tile (a 64-byte header,
 * a zstd-framed table naming the tensor, a 16-byte trailer: about 150
 * bytes) is gone; the tile's identity, base and target hashes and the
 * SHA-256 of its bytes are in the signed manifest, which a reader checks
 * before and after decoding. */
#include "shard_impl.h"

#include "codec/sparse.h"
#include "model.h"

#include <stdlib.h>
#include <zstd.h>

#define TILE_CHUNK ((uint64_t)1 << SP_CHUNK_LOG2_DEFAULT)

struct sh_coder {
    sp_coder c;
};

sh_coder *ferry__shard_coder_new(void) { return ferry__calloc(1, sizeof(sh_coder)); }

void ferry__shard_coder_free(sh_coder *c)
{
    if (!c) return;
    ferry__codec_coder_release(&c->c);
    free(c);
}

static uint64_t nchunks_of(uint64_t words) { return (words + TILE_CHUNK - 1) / TILE_CHUNK; }

static int put_whole(const uint8_t *data, size_t nbytes, int level, ferry_buf *out)
{
    size_t bound = ZSTD_compressBound(nbytes), at = out->size;
    int rc = ferry__buf_reserve(out, at + 1 + bound);
    if (rc) return rc;
    size_t z = ZSTD_compress(out->data + at + 1, bound, data, nbytes, level > 0 ? level : 3);
    if (!ZSTD_isError(z) && z < nbytes) {
        out->data[at] = SH_TILE_ZSTD;
        out->size = at + 1 + z;
        return FERRY_OK;
    }
    out->data[at] = SH_TILE_RAW;
    out->size = at + 1;
    return ferry__buf_append(out, data, nbytes);
}

int ferry__shard_tile_encode(sh_coder *c, ferry_dtype dt, const uint8_t *base, const uint8_t *target, uint64_t nwords, int level,
                             ferry_buf *out)
{
    size_t es = ferry__shard_esize(dt);
    uint64_t nbytes = nwords * es;
    if (!base) return put_whole(target, (size_t)nbytes, level, out);
    size_t at = out->size;
    if (!memcmp(base, target, (size_t)nbytes)) {
        uint8_t same = SH_TILE_SAME;
        return ferry__buf_append(out, &same, 1);
    }
    sp_dtype st = sp_dtype_of(dt);
    uint64_t nch = nchunks_of(nwords), changed = 0;
    uint8_t code = SH_TILE_SPARSE;
    int rc = ferry__buf_append(out, &code, 1);
    size_t table = out->size;
    if (!rc && nch > 1) /* chunk sizes, filled in below */
        for (uint64_t q = 0; q < nch && !rc; q++) rc = ferry__buf_append(out, "\0\0\0\0", 4);
    uint8_t(*bh)[16] = ferry__malloc((size_t)(ferry__hash_nblocks(TILE_CHUNK * 8) + 1) * 16);
    if (!bh) rc = FERRY_ERR_NOMEM;
    for (uint64_t q = 0; q < nch && !rc; q++) {
        uint64_t lo = q * TILE_CHUNK, n = nwords - lo < TILE_CHUNK ? nwords - lo : TILE_CHUNK, ch = 0;
        sp_src src = {target + lo * es, 0};
        size_t before = out->size;
        rc = ferry__codec_encode_chunk(&st, base + lo * es, &src, (size_t)n, nch > 1, &c->c, out, &ch, bh);
        changed += ch;
        if (!rc && nch > 1) {
            uint64_t sz = out->size - before;
            if (sz > UINT32_MAX) rc = ferry__fail(FERRY_ERR_LIMIT, "a tile chunk of %llu bytes", (unsigned long long)sz);
            uint32_t s32 = (uint32_t)sz;
            memcpy(out->data + table + 4 * q, &s32, 4);
        }
    }
    free(bh);
    if (rc) return rc;
    /* dense changes may code smaller whole (as the patch encoder decides) */
    if (changed * 4 > nwords) {
        ferry_buf w = {0};
        if ((rc = put_whole(target, (size_t)nbytes, level, &w))) return rc;
        if (w.size < out->size - at) {
            out->size = at;
            rc = ferry__buf_append(out, w.data, w.size);
        }
        ferry__buf_release(&w);
    }
    return rc;
}

int ferry__shard_tile_decode(sh_coder *c, ferry_dtype dt, const uint8_t *base, uint64_t nwords, const uint8_t *p, size_t n,
                             uint8_t *out)
{
    size_t es = ferry__shard_esize(dt);
    uint64_t nbytes = nwords * es;
    if (!n) return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "an empty tile payload");
    switch (p[0]) {
    case SH_TILE_RAW:
        if (n - 1 != nbytes) return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "a raw tile of %zu bytes, the tile has %llu", n - 1,
                                                (unsigned long long)nbytes);
        memcpy(out, p + 1, (size_t)nbytes);
        return FERRY_OK;
    case SH_TILE_ZSTD: {
        unsigned long long fs = ZSTD_getFrameContentSize(p + 1, n - 1);
        if (fs != nbytes) return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "a zstd tile whose frame does not declare the tile's %llu bytes",
                                             (unsigned long long)nbytes);
        size_t z = ZSTD_decompress(out, (size_t)nbytes, p + 1, n - 1);
        if (ZSTD_isError(z) || z != nbytes) return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "a zstd tile does not decompress to the tile");
        return FERRY_OK;
    }
    case SH_TILE_SAME:
    case SH_TILE_SPARSE:
        break;
    default:
        return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "tile code %u is none of ferry-tile-1", p[0]);
    }
    if (!base) return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "an anchor tile coded against a base");
    if (out != base) memcpy(out, base, (size_t)nbytes);
    if (p[0] == SH_TILE_SAME) return n == 1 ? FERRY_OK : ferry__fail(FERRY_ERR_SYNC_CORRUPT, "an unchanged tile with a payload");
    sp_dtype st = sp_dtype_of(dt);
    uint64_t nch = nchunks_of(nwords);
    size_t at = 1 + (nch > 1 ? 4 * (size_t)nch : 0);
    if (at > n) return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "a sparse tile shorter than its chunk table");
    for (uint64_t q = 0; q < nch; q++) {
        uint64_t lo = q * TILE_CHUNK, w = nwords - lo < TILE_CHUNK ? nwords - lo : TILE_CHUNK;
        size_t len = n - at;
        if (nch > 1) {
            uint32_t s32;
            memcpy(&s32, p + 1 + 4 * q, 4);
            if (s32 > n - at) return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "tile chunk %llu runs past the payload", (unsigned long long)q);
            len = s32;
        }
        size_t k = 0;
        int rc = ferry__codec_decode_chunk(&st, base + lo * es, (size_t)w, p + at, len, 3, &c->c, &k);
        if (rc) return ferry__context(rc, "tile chunk %llu", (unsigned long long)q);
        for (size_t i = 0; i < k; i++) sp_store(out + lo * es, c->c.s.pos[i], st.W, c->c.s.val[i]);
        at += len;
    }
    if (at != n) return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "a sparse tile with %zu bytes its chunks do not account for", n - at);
    return FERRY_OK;
}

int ferry__shard_tile_hash(const char *name, ferry_dtype dt, uint64_t rows, uint64_t cols, const void *data, uint8_t out[16])
{
    ferry_model *m = NULL;
    int rc = ferry__shard_tile_model(name, dt, rows, cols, data, FERRY_ADD_BORROW, &m);
    if (!rc) rc = ferry_model_hash(m, out);
    ferry_model_free(m);
    return rc;
}

int ferry__shard_tile_new(const char *name, ferry_dtype dt, uint64_t rows, uint64_t cols, ferry_model **out, uint8_t **data)
{
    *out = NULL;
    uint64_t nbytes = rows * cols * ferry__shard_esize(dt), shape[2] = {rows, cols};
    uint8_t *buf = ferry__malloc(nbytes ? (size_t)nbytes : 1);
    ferry_model *m = NULL;
    if (!buf) return FERRY_ERR_NOMEM;
    int rc = ferry_model_create(&m);
    if (rc) {
        free(buf);
        return rc;
    }
    if ((rc = ferry__model_add_owned(m, name, dt, 2, shape, buf, nbytes))) { /* frees buf */
        ferry_model_free(m);
        return rc;
    }
    *out = m;
    *data = buf;
    return FERRY_OK;
}
