/* Parsing and validation of the patch header and tensor table. */
#include <stdlib.h>
#include <zstd.h>
#include "patch.h"
#include "sparse.h"
#include "model.h"

static int trunc_err(const char *what) { return ferry__fail(FERRY_ERR_PATCH_TRUNCATED, "patch table: truncated in %s", what); }

static bool take(ferry_rd *r, void *dst, size_t n)
{
    if (ferry__rd_left(r) < n) return false;
    memcpy(dst, r->p, n);
    r->p += n;
    return true;
}
static bool take_u8(ferry_rd *r, uint8_t *v) { return take(r, v, 1); }
static bool take_u16(ferry_rd *r, uint16_t *v)
{
    uint8_t b[2];
    if (!take(r, b, 2)) return false;
    *v = ferry__le16(b);
    return true;
}
static bool take_u32(ferry_rd *r, uint32_t *v)
{
    uint8_t b[4];
    if (!take(r, b, 4)) return false;
    *v = ferry__le32(b);
    return true;
}
static bool take_u64(ferry_rd *r, uint64_t *v)
{
    uint8_t b[8];
    if (!take(r, b, 8)) return false;
    *v = ferry__le64(b);
    return true;
}

/* A length-prefixed string without NUL bytes, copied out. */
static int take_str(ferry_rd *r, uint32_t len, char **out, const char *what)
{
    if (ferry__rd_left(r) < len) return trunc_err(what);
    if (memchr(r->p, 0, len)) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch table: %s contains a NUL byte", what);
    char *s = ferry__malloc((size_t)len + 1);
    if (!s) return FERRY_ERR_NOMEM;
    memcpy(s, r->p, len);
    s[len] = 0;
    r->p += len;
    *out = s;
    return FERRY_OK;
}

void ferry__codec_patch_table_release(patch_table *t)
{
    for (size_t i = 0; i < t->nmeta; i++) {
        free(t->meta_key[i]);
        free(t->meta_val[i]);
    }
    free(t->meta_key);
    free(t->meta_val);
    for (size_t i = 0; i < t->n; i++) free(t->e[i].name);
    free(t->e);
    memset(t, 0, sizeof *t);
}

static int parse_entry(ferry_rd *r, patch_entry *e, const char *prev_name)
{
    uint16_t nl;
    int rc;
    if (!take_u16(r, &nl)) return trunc_err("entry name length");
    if (nl == 0) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch table: empty tensor name");
    if (nl > FERRY_MAX_NAME)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch table: tensor name of %u bytes exceeds %d", nl, FERRY_MAX_NAME);
    if ((rc = take_str(r, nl, &e->name, "tensor name"))) return rc;
    if (prev_name && strcmp(prev_name, e->name) >= 0)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch table: tensor '%s' out of name order", e->name);
    if (!take_u8(r, &e->kind)) return trunc_err("entry kind");
    if (e->kind > PK_SAME) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': unknown entry kind %u", e->name, e->kind);
    if (e->kind == PK_REMOVED) return FERRY_OK;
    uint8_t dt, nd;
    if (!take_u8(r, &dt) || !take_u8(r, &nd)) return trunc_err("entry dtype");
    if (dt >= FERRY_DTYPE_COUNT) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': invalid dtype %u", e->name, dt);
    if (nd > FERRY_MAX_DIMS) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': %u dims", e->name, nd);
    e->dtype = (ferry_dtype)dt;
    e->ndim = nd;
    for (unsigned i = 0; i < nd; i++)
        if (!take_u64(r, &e->shape[i])) return trunc_err("entry shape");
    if (!ferry__tensor_size(e->dtype, e->ndim, e->shape, &e->nelem, &e->nbytes) || e->nbytes > SIZE_MAX)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': shape overflows", e->name);
    e->nwords = e->nbytes * 8 / sp_dtype_of(e->dtype).W;
    if (!take(r, e->hash, 16)) return trunc_err("entry hash");
    if (e->kind == PK_SAME) return FERRY_OK;
    if (e->kind == PK_SPARSE) {
        if (!take_u8(r, &e->chunk_log2) || !take_u64(r, &e->changed)) return trunc_err("sparse entry");
        if (e->chunk_log2 < SP_CHUNK_LOG2_MIN || e->chunk_log2 > SP_CHUNK_LOG2_MAX)
            return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': chunk size 2^%u out of range", e->name, e->chunk_log2);
        if (e->changed > e->nwords)
            return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': %llu changed of %llu words", e->name,
                               (unsigned long long)e->changed, (unsigned long long)e->nwords);
    } else {
        if (!take_u8(r, &e->codec)) return trunc_err("whole entry");
        if (e->codec > WHOLE_ZSTD) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': unknown codec %u", e->name, e->codec);
        e->changed = e->nelem;
    }
    if (!take_u64(r, &e->payload_size)) return trunc_err("payload size");
    return FERRY_OK;
}

static int parse_table(ferry_rd *r, patch_table *t, uint64_t payload_start, uint64_t payload_end)
{
    uint32_t nm, n;
    int rc;
    if (!take_u32(r, &nm)) return trunc_err("metadata count");
    /* each entry takes at least 8 bytes: bounds the allocation by the input */
    if (nm > ferry__rd_left(r) / 8) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch table: metadata count %u too large", nm);
    t->meta_key = ferry__calloc(nm, sizeof(char *));
    t->meta_val = ferry__calloc(nm, sizeof(char *));
    if (!t->meta_key || !t->meta_val) return FERRY_ERR_NOMEM;
    for (uint32_t i = 0; i < nm; i++) {
        uint32_t kl, vl;
        t->nmeta = i + 1;
        if (!take_u32(r, &kl)) return trunc_err("metadata key");
        if ((rc = take_str(r, kl, &t->meta_key[i], "metadata key"))) return rc;
        if (!take_u32(r, &vl)) return trunc_err("metadata value");
        if ((rc = take_str(r, vl, &t->meta_val[i], "metadata value"))) return rc;
        if (i && strcmp(t->meta_key[i - 1], t->meta_key[i]) >= 0)
            return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch table: metadata key '%s' out of order", t->meta_key[i]);
    }
    if (!take_u32(r, &n)) return trunc_err("tensor count");
    if (n > ferry__rd_left(r) / 4) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch table: tensor count %u too large", n);
    t->e = ferry__calloc(n, sizeof *t->e);
    if (!t->e) return FERRY_ERR_NOMEM;
    uint64_t off = payload_start;
    for (uint32_t i = 0; i < n; i++) {
        t->n = i + 1;
        patch_entry *e = &t->e[i];
        if ((rc = parse_entry(r, e, i ? t->e[i - 1].name : NULL))) return rc;
        if (e->payload_size > payload_end - off)
            return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': payload of %llu bytes past the end of the patch",
                               e->name, (unsigned long long)e->payload_size);
        e->payload_off = off;
        off += e->payload_size;
    }
    if (ferry__rd_left(r)) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch table: %zu trailing bytes", ferry__rd_left(r));
    if (off != payload_end)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch: %llu payload bytes not claimed by any tensor",
                           (unsigned long long)(payload_end - off));
    return FERRY_OK;
}

/* The header's format version and flags (both ends: buffered and streamed). */
static int version_flags(const uint8_t *p)
{
    uint32_t version = ferry__le32(p + 8);
    if (version < PATCH_VERSION || version > PATCH_VERSION_MAX)
        return ferry__fail(FERRY_ERR_PATCH_VERSION, "patch format version %u (this build reads %d to %d)", version, PATCH_VERSION,
                           PATCH_VERSION_MAX);
    if (ferry__le32(p + 12) != 0) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch header: unknown flags 0x%x", ferry__le32(p + 12));
    return FERRY_OK;
}

int ferry__codec_patch_table_parse(const uint8_t *p, size_t size, patch_table *t)
{
    memset(t, 0, sizeof *t);
    if (size < 8 || memcmp(p, PATCH_MAGIC, 8) != 0)
        return ferry__fail(FERRY_ERR_PATCH_MAGIC, "not a ferry patch (magic bytes differ)");
    if (size < PATCH_HEADER_SIZE + PATCH_TRAILER_SIZE)
        return ferry__fail(FERRY_ERR_PATCH_TRUNCATED, "patch of %zu bytes is shorter than header and trailer", size);
    int rc = version_flags(p);
    if (rc) return rc;
    uint64_t declared = ferry__le64(p + 48);
    if (declared > size)
        return ferry__fail(FERRY_ERR_PATCH_TRUNCATED, "patch is %zu bytes, header declares %llu", size, (unsigned long long)declared);
    if (declared < size)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch has %llu bytes after its declared end", (unsigned long long)(size - declared));
    XXH128_canonical_t want;
    XXH128_canonicalFromHash(&want, XXH3_128bits(p, size - PATCH_TRAILER_SIZE));
    if (memcmp(&want, p + size - PATCH_TRAILER_SIZE, 16) != 0)
        return ferry__fail(FERRY_ERR_PATCH_CHECKSUM, "patch checksum (XXH3-128 trailer) does not match its bytes");
    return ferry__codec_patch_table_parse_at(p, size, t);
}

int ferry__codec_patch_header(const uint8_t *p, uint64_t *declared, uint32_t *zsize)
{
    if (memcmp(p, PATCH_MAGIC, 8) != 0) return ferry__fail(FERRY_ERR_PATCH_MAGIC, "not a ferry patch (magic bytes differ)");
    int rc = version_flags(p);
    if (rc) return rc;
    uint64_t size = ferry__le64(p + 48);
    if (size < PATCH_HEADER_SIZE + PATCH_TRAILER_SIZE)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch header declares %llu bytes, less than header and trailer",
                           (unsigned long long)size);
    uint32_t raw = ferry__le32(p + 56), zsz = ferry__le32(p + 60);
    if (zsz > size - PATCH_HEADER_SIZE - PATCH_TRAILER_SIZE)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch table size %u exceeds the patch", zsz);
    if (raw > PATCH_TABLE_MAX) return ferry__fail(FERRY_ERR_LIMIT, "patch table of %u bytes exceeds the limit %u", raw, PATCH_TABLE_MAX);
    *declared = size;
    *zsize = zsz;
    return FERRY_OK;
}

int ferry__codec_patch_table_parse_at(const uint8_t *p, uint64_t size, patch_table *t)
{
    memset(t, 0, sizeof *t);
    t->version = ferry__le32(p + 8);
    memcpy(t->base_hash, p + 16, 16);
    memcpy(t->target_hash, p + 32, 16);
    uint32_t raw = ferry__le32(p + 56), zsz = ferry__le32(p + 60);
    if (zsz > size - PATCH_HEADER_SIZE - PATCH_TRAILER_SIZE)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch table size %u exceeds the patch", zsz);
    if (raw > PATCH_TABLE_MAX) return ferry__fail(FERRY_ERR_LIMIT, "patch table of %u bytes exceeds the limit %u", raw, PATCH_TABLE_MAX);
    uint8_t *tab = ferry__malloc(raw);
    if (!tab) return FERRY_ERR_NOMEM;
    size_t got = ZSTD_decompress(tab, raw, p + PATCH_HEADER_SIZE, zsz);
    if (ZSTD_isError(got) || got != raw) {
        free(tab);
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch table does not decompress to its declared %u bytes", raw);
    }
    ferry_rd r = {tab, tab + raw};
    int rc = parse_table(&r, t, PATCH_HEADER_SIZE + (uint64_t)zsz, size - PATCH_TRAILER_SIZE);
    free(tab);
    if (rc) ferry__codec_patch_table_release(t);
    return rc;
}
