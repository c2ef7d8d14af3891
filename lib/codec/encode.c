/* ferry_diff: the patch A -> B (format v1, docs/FORMAT.md). */
#include <stdlib.h>
#include <zstd.h>
#include "model.h"
#include "patch.h"
#include "sparse.h"

typedef struct enc_ctx {
    int level;
    sp_models models[4];   /* by word width index: reused across tensors */
    bool have_models[4];
    ferry_dtype models_dt[4];
    sp_scratch scratch;
} enc_ctx;

static int put_u8(ferry_buf *b, uint8_t v) { return ferry__buf_append(b, &v, 1); }
static int put_u16(ferry_buf *b, uint16_t v) { uint8_t t[2]; ferry__put16(t, v); return ferry__buf_append(b, t, 2); }
static int put_u32(ferry_buf *b, uint32_t v) { uint8_t t[4]; ferry__put32(t, v); return ferry__buf_append(b, t, 4); }
static int put_u64(ferry_buf *b, uint64_t v) { uint8_t t[8]; ferry__put64(t, v); return ferry__buf_append(b, t, 8); }

static int put_desc(ferry_buf *tab, const ferry_tensor *t, const uint8_t hash[16])
{
    int rc = put_u8(tab, (uint8_t)t->dtype);
    if (!rc) rc = put_u8(tab, (uint8_t)t->ndim);
    for (uint32_t i = 0; !rc && i < t->ndim; i++) rc = put_u64(tab, t->shape[i]);
    if (!rc) rc = ferry__buf_append(tab, hash, 16);
    return rc;
}

static int models_for(enc_ctx *c, ferry_dtype dt, const sp_dtype *st, sp_models **out)
{
    /* One model set per dtype family would do; keyed by dtype to size the
     * class tables correctly. */
    unsigned slot = st->W == 8 ? 0 : st->W == 16 ? 1 : st->W == 32 ? 2 : 3;
    if (c->have_models[slot] && c->models_dt[slot] != dt) {
        sp_models_release(&c->models[slot]);
        c->have_models[slot] = false;
    }
    if (!c->have_models[slot]) {
        int rc = sp_models_alloc(&c->models[slot], st);
        if (rc) return rc;
        c->have_models[slot] = true;
        c->models_dt[slot] = dt;
    }
    *out = &c->models[slot];
    return FERRY_OK;
}

/* Sparse payload: u32 size of each chunk, then the chunks. */
static int encode_sparse(enc_ctx *c, const ferry_tensor *a, const ferry_tensor *b, ferry_buf *pay, uint64_t *changed)
{
    sp_dtype st = sp_dtype_of(b->dtype);
    sp_models *m;
    int rc = models_for(c, b->dtype, &st, &m);
    if (rc) return rc;
    uint64_t nwords = b->nbytes * 8 / st.W;
    uint64_t csize = (uint64_t)1 << SP_CHUNK_LOG2_DEFAULT;
    uint64_t nchunks = (nwords + csize - 1) / csize;
    size_t table_at = pay->size;
    if ((rc = ferry__buf_reserve(pay, nchunks * 4))) return rc;
    pay->size += nchunks * 4;
    *changed = 0;
    for (uint64_t ch = 0; ch < nchunks; ch++) {
        uint64_t lo = ch * csize, n = nwords - lo < csize ? nwords - lo : csize;
        size_t before = pay->size;
        uint64_t k;
        rc = sp_encode_chunk(&st, (const uint8_t *)a->data + lo * st.W / 8, (const uint8_t *)b->data + lo * st.W / 8,
                             (size_t)n, m, &c->scratch, pay, &k);
        if (rc) return rc;
        if (pay->size - before > UINT32_MAX) return ferry__fail(FERRY_ERR_LIMIT, "tensor '%s': chunk too large", b->name);
        ferry__put32(pay->data + table_at + ch * 4, (uint32_t)(pay->size - before));
        *changed += k;
    }
    return FERRY_OK;
}

static int encode_whole(enc_ctx *c, const ferry_tensor *b, ferry_buf *pay, uint8_t *codec)
{
    size_t bound = ZSTD_compressBound((size_t)b->nbytes);
    int rc = ferry__buf_reserve(pay, bound);
    if (rc) return rc;
    size_t z = ZSTD_compress(pay->data + pay->size, bound, b->data, (size_t)b->nbytes, c->level);
    if (!ZSTD_isError(z) && z < b->nbytes) {
        pay->size += z;
        *codec = WHOLE_ZSTD;
        return FERRY_OK;
    }
    *codec = WHOLE_RAW;
    return ferry__buf_append(pay, b->data, (size_t)b->nbytes);
}

/* One entry: table bytes into tab, payload into pay. */
static int encode_entry(enc_ctx *c, const ferry_tensor *a, const ferry_tensor *b, const uint8_t bhash[16],
                        ferry_buf *tab, ferry_buf *pay)
{
    const ferry_tensor *named = b ? b : a;
    size_t nl = strlen(named->name);
    int rc = put_u16(tab, (uint16_t)nl);
    if (!rc) rc = ferry__buf_append(tab, named->name, nl);
    if (rc) return rc;
    if (!b) return put_u8(tab, PK_REMOVED);

    bool comparable = a && a->dtype == b->dtype && a->ndim == b->ndim &&
                      memcmp(a->shape, b->shape, a->ndim * sizeof *a->shape) == 0;
    if (comparable && memcmp(a->data, b->data, (size_t)b->nbytes) == 0) {
        rc = put_u8(tab, PK_SAME);
        return rc ? rc : put_desc(tab, b, bhash);
    }
    size_t start = pay->size;
    uint8_t codec = WHOLE_RAW;
    if (comparable) {
        uint64_t changed;
        if ((rc = encode_sparse(c, a, b, pay, &changed))) return rc;
        bool sparse = true;
        /* Dense changes (say an FP32 norm that moved everywhere) may code
         * smaller whole: try it only when the change rate makes it likely. */
        if (changed * 4 > b->nelem) {
            ferry_buf alt = {0};
            rc = encode_whole(c, b, &alt, &codec);
            if (!rc && alt.size < pay->size - start) {
                pay->size = start;
                rc = ferry__buf_append(pay, alt.data, alt.size);
                sparse = false;
            }
            ferry__buf_release(&alt);
            if (rc) return rc;
        }
        if (sparse) {
            if ((rc = put_u8(tab, PK_SPARSE)) || (rc = put_desc(tab, b, bhash)) || (rc = put_u8(tab, SP_CHUNK_LOG2_DEFAULT)) ||
                (rc = put_u64(tab, changed)))
                return rc;
            return put_u64(tab, pay->size - start);
        }
    } else if ((rc = encode_whole(c, b, pay, &codec))) {
        return rc;
    }
    if ((rc = put_u8(tab, PK_WHOLE)) || (rc = put_desc(tab, b, bhash)) || (rc = put_u8(tab, codec))) return rc;
    return put_u64(tab, pay->size - start);
}

static int put_metadata(ferry_buf *tab, const ferry_model *b)
{
    size_t nm = ferry_model_metadata_count(b);
    int rc = put_u32(tab, (uint32_t)nm);
    for (size_t i = 0; !rc && i < nm; i++) {
        const char *k, *v;
        ferry_model_metadata(b, i, &k, &v);
        size_t kl = strlen(k), vl = strlen(v);
        if (kl > UINT32_MAX || vl > UINT32_MAX) return ferry__fail(FERRY_ERR_LIMIT, "metadata entry too large");
        if ((rc = put_u32(tab, (uint32_t)kl)) || (rc = ferry__buf_append(tab, k, kl)) || (rc = put_u32(tab, (uint32_t)vl)))
            return rc;
        rc = ferry__buf_append(tab, v, vl);
    }
    return rc;
}

static int hash_all(const ferry_model *m, uint8_t (**th)[16], uint8_t model_hash[16])
{
    size_t n = ferry_model_count(m);
    *th = ferry__malloc((n ? n : 1) * 16);
    if (!*th) return FERRY_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) ferry_tensor_hash(ferry_model_tensor(m, i), (*th)[i]);
    return ferry__model_hash_tensors(m, (const uint8_t (*)[16]) * th, model_hash);
}

int ferry_diff(const ferry_model *a, const ferry_model *b, const ferry_diff_options *opts, void **patch, size_t *size)
{
    if (!a || !b || !patch || !size) return ferry__fail(FERRY_ERR_ARG, "ferry_diff: NULL argument");
    *patch = NULL;
    *size = 0;
    enc_ctx c = {.level = opts && opts->level ? opts->level : 3};
    if (c.level < 1 || c.level > ZSTD_maxCLevel()) return ferry__fail(FERRY_ERR_ARG, "ferry_diff: level %d out of range", c.level);
    uint8_t (*ha)[16] = NULL, (*hb)[16] = NULL, base_hash[16], target_hash[16];
    ferry_buf tab = {0}, pay = {0}, out = {0};
    int rc = hash_all(a, &ha, base_hash);
    if (!rc) rc = hash_all(b, &hb, target_hash);
    if (!rc) rc = put_metadata(&tab, b);
    size_t na = ferry_model_count(a), nb = ferry_model_count(b), i = 0, j = 0;
    uint32_t nent = 0;
    size_t count_at = tab.size;
    if (!rc) rc = put_u32(&tab, 0);
    /* Merge-walk both name-sorted tensor lists. */
    while (!rc && (i < na || j < nb)) {
        const ferry_tensor *ta = i < na ? ferry_model_tensor(a, i) : NULL;
        const ferry_tensor *tb = j < nb ? ferry_model_tensor(b, j) : NULL;
        int cmp = !ta ? 1 : !tb ? -1 : strcmp(ta->name, tb->name);
        if (strlen(cmp <= 0 ? ta->name : tb->name) > UINT16_MAX) {
            rc = ferry__fail(FERRY_ERR_LIMIT, "tensor name longer than 65535 bytes");
            break;
        }
        if (cmp < 0) rc = encode_entry(&c, ta, NULL, NULL, &tab, &pay), i++;
        else if (cmp > 0) rc = encode_entry(&c, NULL, tb, hb[j], &tab, &pay), j++;
        else rc = encode_entry(&c, ta, tb, hb[j], &tab, &pay), i++, j++;
        if (rc) rc = ferry__context(rc, "tensor '%s'", (cmp <= 0 ? ta : tb)->name);
        nent++;
    }
    if (!rc) {
        ferry__put32(tab.data + count_at, nent);
        if (tab.size > PATCH_TABLE_MAX) rc = ferry__fail(FERRY_ERR_LIMIT, "patch table of %zu bytes exceeds the limit", tab.size);
    }
    /* Assemble: header, zstd(table), payloads, checksum trailer. */
    if (!rc) rc = ferry__buf_reserve(&out, PATCH_HEADER_SIZE + ZSTD_compressBound(tab.size) + pay.size + PATCH_TRAILER_SIZE);
    if (!rc) {
        size_t z = ZSTD_compress(out.data + PATCH_HEADER_SIZE, out.cap - PATCH_HEADER_SIZE, tab.data, tab.size, 19);
        if (ZSTD_isError(z)) rc = ferry__fail(FERRY_ERR_NOMEM, "zstd: %s", ZSTD_getErrorName(z));
        else {
            uint8_t *h = out.data;
            memcpy(h, PATCH_MAGIC, 8);
            ferry__put32(h + 8, PATCH_VERSION);
            ferry__put32(h + 12, 0);
            memcpy(h + 16, base_hash, 16);
            memcpy(h + 32, target_hash, 16);
            ferry__put64(h + 48, PATCH_HEADER_SIZE + z + pay.size + PATCH_TRAILER_SIZE);
            ferry__put32(h + 56, (uint32_t)tab.size);
            ferry__put32(h + 60, (uint32_t)z);
            out.size = PATCH_HEADER_SIZE + z;
            if (pay.size) memcpy(out.data + out.size, pay.data, pay.size);
            out.size += pay.size;
            XXH128_canonical_t sum;
            XXH128_canonicalFromHash(&sum, XXH3_128bits(out.data, out.size));
            memcpy(out.data + out.size, &sum, 16);
            out.size += 16;
        }
    }
    for (int s = 0; s < 4; s++)
        if (c.have_models[s]) sp_models_release(&c.models[s]);
    sp_scratch_release(&c.scratch);
    free(ha);
    free(hb);
    ferry__buf_release(&tab);
    ferry__buf_release(&pay);
    if (rc) {
        ferry__buf_release(&out);
        return rc;
    }
    *patch = out.data;
    *size = out.size;
    return FERRY_OK;
}
