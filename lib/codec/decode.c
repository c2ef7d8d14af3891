/* ferry_apply / ferry_apply_inplace: patch v1 decoding.  The base is
 * verified before any work and the result after it; nothing partial is ever
 * returned or written. */
#include <stdio.h>
#include <stdlib.h>
#include <zstd.h>
#include "model.h"
#include "patch.h"
#include "sparse.h"

typedef struct dec_ctx {
    const uint8_t *patch;
    const patch_table *t;
    const ferry_model *base;
    uint8_t (*bh)[16];       /* base tensor hashes */
    sp_models models;
    bool have_models;
    ferry_dtype models_dt;
    sp_dscratch scratch;
} dec_ctx;

static void dec_release(dec_ctx *d)
{
    free(d->bh);
    if (d->have_models) sp_models_release(&d->models);
    sp_dscratch_release(&d->scratch);
}

static int mismatch(int code, const char *what, const uint8_t got[16], const uint8_t want[16])
{
    char g[33], w[33];
    for (int i = 0; i < 16; i++) {
        snprintf(g + 2 * i, 3, "%02x", got[i]);
        snprintf(w + 2 * i, 3, "%02x", want[i]);
    }
    return ferry__fail(code, "%s hash %s, patch expects %s", what, g, w);
}

/* Hashes the base and checks it is the model the patch was made from. */
static int verify_base(dec_ctx *d)
{
    size_t n = ferry_model_count(d->base);
    d->bh = ferry__malloc((n ? n : 1) * 16);
    if (!d->bh) return FERRY_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) ferry_tensor_hash(ferry_model_tensor(d->base, i), d->bh[i]);
    uint8_t h[16];
    int rc = ferry__model_hash_tensors(d->base, (const uint8_t (*)[16])d->bh, h);
    if (rc) return rc;
    if (memcmp(h, d->t->base_hash, 16)) return mismatch(FERRY_ERR_BASE_MISMATCH, "base model", h, d->t->base_hash);
    return FERRY_OK;
}

/* Matches every entry to its base tensor (index or -1) and checks that the
 * table accounts for every base tensor. */
static int match_base(dec_ctx *d, long *bi)
{
    size_t nb = ferry_model_count(d->base), i = 0;
    for (size_t j = 0; j < d->t->n; j++) {
        const patch_entry *e = &d->t->e[j];
        while (i < nb && strcmp(ferry_model_tensor(d->base, i)->name, e->name) < 0) {
            return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch does not account for base tensor '%s'",
                               ferry_model_tensor(d->base, i)->name);
        }
        bi[j] = i < nb && strcmp(ferry_model_tensor(d->base, i)->name, e->name) == 0 ? (long)i++ : -1;
        if (bi[j] < 0 && e->kind != PK_WHOLE)
            return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': patch needs it in the base, which lacks it", e->name);
        if ((e->kind == PK_SAME || e->kind == PK_SPARSE)) {
            const ferry_tensor *b = ferry_model_tensor(d->base, (size_t)bi[j]);
            if (b->dtype != e->dtype || b->ndim != e->ndim || memcmp(b->shape, e->shape, e->ndim * sizeof *e->shape))
                return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': dtype or shape differs from the base", e->name);
        }
    }
    if (i < nb)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch does not account for base tensor '%s'", ferry_model_tensor(d->base, i)->name);
    return FERRY_OK;
}

static int models_for(dec_ctx *d, ferry_dtype dt, const sp_dtype *st)
{
    if (d->have_models && d->models_dt == dt) return FERRY_OK;
    if (d->have_models) sp_models_release(&d->models);
    d->have_models = false;
    int rc = sp_models_alloc(&d->models, st);
    if (rc) return rc;
    d->have_models = true;
    d->models_dt = dt;
    return FERRY_OK;
}

/* Decodes a SPARSE entry chunk by chunk; for each chunk calls
 * fn(ctx, first_word, words_in_chunk, pos, val, k). */
typedef int (*chunk_fn)(void *ctx, const sp_dtype *st, uint64_t lo, size_t n, const uint32_t *pos, const uint64_t *val, size_t k);

static int decode_sparse(dec_ctx *d, const patch_entry *e, const ferry_tensor *b, chunk_fn fn, void *ctx)
{
    sp_dtype st = sp_dtype_of(e->dtype);
    int rc = models_for(d, e->dtype, &st);
    if (rc) return rc;
    uint64_t nchunks = patch_chunks(e), csize = (uint64_t)1 << e->chunk_log2;
    if (nchunks > e->payload_size / 4) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "chunk table larger than the payload");
    const uint8_t *p = d->patch + e->payload_off, *sizes = p;
    uint64_t off = nchunks * 4, total = 0;
    for (uint64_t c = 0; c < nchunks; c++) {
        uint64_t len = ferry__le32(sizes + 4 * c);
        if (len > e->payload_size - off) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "chunk %llu past the payload", (unsigned long long)c);
        uint64_t lo = c * csize, n = e->nwords - lo < csize ? e->nwords - lo : csize;
        size_t k;
        rc = sp_decode_chunk(&st, (const uint8_t *)b->data + lo * st.W / 8, (size_t)n, p + off, (size_t)len, &d->models,
                             &d->scratch, &k);
        if (rc) return ferry__context(rc, "chunk %llu", (unsigned long long)c);
        if ((rc = fn(ctx, &st, lo, (size_t)n, d->scratch.pos, d->scratch.val, k))) return rc;
        off += len;
        total += k;
    }
    if (off != e->payload_size) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "%llu unread payload bytes", (unsigned long long)(e->payload_size - off));
    if (total != e->changed)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "%llu changes decoded, table says %llu", (unsigned long long)total,
                           (unsigned long long)e->changed);
    return FERRY_OK;
}

static int write_changes(void *ctx, const sp_dtype *st, uint64_t lo, size_t n, const uint32_t *pos, const uint64_t *val, size_t k)
{
    (void)n;
    uint8_t *out = (uint8_t *)ctx + lo * st->W / 8;
    for (size_t j = 0; j < k; j++) sp_store(out, pos[j], st->W, val[j]);
    return FERRY_OK;
}

static int decode_whole(dec_ctx *d, const patch_entry *e, uint8_t *out)
{
    const uint8_t *src = d->patch + e->payload_off;
    if (e->codec == WHOLE_RAW) {
        if (e->payload_size != e->nbytes)
            return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "raw payload of %llu bytes for %llu", (unsigned long long)e->payload_size,
                               (unsigned long long)e->nbytes);
        memcpy(out, src, (size_t)e->nbytes);
        return FERRY_OK;
    }
    size_t got = ZSTD_decompress(out, (size_t)e->nbytes, src, (size_t)e->payload_size);
    if (ZSTD_isError(got) || got != e->nbytes)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "zstd payload does not decode to %llu bytes", (unsigned long long)e->nbytes);
    return FERRY_OK;
}

static int check_tensor_hash(const patch_entry *e, const void *data, uint8_t out[16])
{
    ferry__tensor_hash_parts(e->name, e->dtype, e->ndim, e->shape, data, e->nbytes, out);
    if (memcmp(out, e->hash, 16)) return mismatch(FERRY_ERR_TARGET_MISMATCH, "result tensor", out, e->hash);
    return FERRY_OK;
}

static int check_target(const patch_table *t, const uint8_t (*th)[16], size_t n)
{
    uint8_t h[16];
    ferry__model_hash_from(th, n, t->nmeta, (const char *const *)t->meta_key, (const char *const *)t->meta_val, h);
    if (memcmp(h, t->target_hash, 16)) return mismatch(FERRY_ERR_TARGET_MISMATCH, "result model", h, t->target_hash);
    return FERRY_OK;
}

static int build_entry(dec_ctx *d, const patch_entry *e, long bi, ferry_model *m, uint8_t th[16])
{
    const ferry_tensor *b = bi >= 0 ? ferry_model_tensor(d->base, (size_t)bi) : NULL;
    uint8_t *buf = ferry__malloc((size_t)e->nbytes);
    if (!buf) return FERRY_ERR_NOMEM;
    int rc = FERRY_OK;
    if (e->kind == PK_WHOLE) rc = decode_whole(d, e, buf);
    else {
        memcpy(buf, b->data, (size_t)e->nbytes);
        if (e->kind == PK_SPARSE) rc = decode_sparse(d, e, b, write_changes, buf);
    }
    if (!rc) {
        if (e->kind == PK_SAME) {
            memcpy(th, d->bh[bi], 16);
            if (memcmp(th, e->hash, 16)) rc = mismatch(FERRY_ERR_PATCH_CORRUPT, "unchanged tensor", th, e->hash);
        } else {
            rc = check_tensor_hash(e, buf, th);
        }
    }
    if (rc) {
        free(buf);
        return rc;
    }
    return ferry__model_add_owned(m, e->name, e->dtype, e->ndim, e->shape, buf, e->nbytes);
}

static int begin(dec_ctx *d, patch_table *t, const ferry_model *base, const void *patch, size_t size, long **bi)
{
    memset(d, 0, sizeof *d);
    int rc = patch_table_parse(patch, size, t);
    if (rc) return rc;
    d->patch = patch;
    d->t = t;
    d->base = base;
    if ((rc = verify_base(d))) return rc;
    *bi = ferry__malloc((t->n ? t->n : 1) * sizeof **bi);
    if (!*bi) return FERRY_ERR_NOMEM;
    return match_base(d, *bi);
}

int ferry_apply(const ferry_model *base, const void *patch, size_t size, ferry_model **out)
{
    if (!base || !patch || !out) return ferry__fail(FERRY_ERR_ARG, "ferry_apply: NULL argument");
    *out = NULL;
    patch_table t;
    dec_ctx d;
    long *bi = NULL;
    ferry_model *m = NULL;
    uint8_t (*th)[16] = NULL;
    int rc = begin(&d, &t, base, patch, size, &bi);
    if (!rc) rc = ferry_model_create(&m);
    if (!rc && !(th = ferry__malloc((t.n ? t.n : 1) * 16))) rc = FERRY_ERR_NOMEM;
    size_t nt = 0;
    for (size_t j = 0; !rc && j < t.n; j++) {
        const patch_entry *e = &t.e[j];
        if (e->kind == PK_REMOVED) continue;
        rc = build_entry(&d, e, bi[j], m, th[nt++]);
        if (rc) rc = ferry__context(rc, "tensor '%s'", e->name);
    }
    for (size_t i = 0; !rc && i < t.nmeta; i++) rc = ferry_model_set_metadata(m, t.meta_key[i], t.meta_val[i]);
    if (!rc) rc = check_target(&t, (const uint8_t (*)[16])th, nt);
    free(th);
    free(bi);
    dec_release(&d);
    patch_table_release(&t);
    if (rc) {
        ferry_model_free(m);
        return rc;
    }
    *out = m;
    return FERRY_OK;
}

/* In place, pass 1 hashes each changed tensor as it will be, streaming the
 * base chunk by chunk through a scratch copy; pass 2 writes. */
typedef struct hash_ctx {
    XXH3_state_t st;
    const uint8_t *base;
    uint8_t *tmp;
} hash_ctx;

static int hash_changes(void *ctx, const sp_dtype *st, uint64_t lo, size_t n, const uint32_t *pos, const uint64_t *val, size_t k)
{
    hash_ctx *h = ctx;
    size_t bytes = n * st->W / 8;
    memcpy(h->tmp, h->base + lo * st->W / 8, bytes);
    write_changes(h->tmp, st, 0, n, pos, val, k);
    XXH3_128bits_update(&h->st, h->tmp, bytes);
    return FERRY_OK;
}

int ferry_apply_inplace(ferry_model *base, const void *patch, size_t size)
{
    if (!base || !patch) return ferry__fail(FERRY_ERR_ARG, "ferry_apply_inplace: NULL argument");
    patch_table t;
    dec_ctx d;
    long *bi = NULL;
    uint8_t (*th)[16] = NULL;
    hash_ctx h = {0};
    int rc = begin(&d, &t, base, patch, size, &bi);
    /* Structure must stay: no added, removed or whole tensors, same metadata. */
    for (size_t j = 0; !rc && j < t.n; j++)
        if (t.e[j].kind == PK_WHOLE || t.e[j].kind == PK_REMOVED)
            rc = ferry__fail(FERRY_ERR_SHAPE_MISMATCH, "tensor '%s' is added, removed or re-shaped: cannot apply in place", t.e[j].name);
    if (!rc && t.nmeta != ferry_model_metadata_count(base)) rc = ferry__fail(FERRY_ERR_SHAPE_MISMATCH, "metadata changes: cannot apply in place");
    for (size_t i = 0; !rc && i < t.nmeta; i++) {
        const char *k, *v;
        ferry_model_metadata(base, i, &k, &v);
        if (strcmp(k, t.meta_key[i]) || strcmp(v, t.meta_val[i]))
            rc = ferry__fail(FERRY_ERR_SHAPE_MISMATCH, "metadata '%s' changes: cannot apply in place", t.meta_key[i]);
    }
    for (size_t j = 0; !rc && j < t.n; j++)
        if (t.e[j].kind == PK_SPARSE && !ferry_model_data_mut(base, (size_t)bi[j]))
            rc = ferry__fail(FERRY_ERR_ARG, "tensor '%s' is read-only (a mapped file): cannot apply in place", t.e[j].name);
    if (!rc && !(th = ferry__malloc((t.n ? t.n : 1) * 16))) rc = FERRY_ERR_NOMEM;
    if (!rc && !(h.tmp = ferry__malloc(((size_t)8) << SP_CHUNK_LOG2_DEFAULT))) rc = FERRY_ERR_NOMEM;
    for (size_t j = 0; !rc && j < t.n; j++) {
        const patch_entry *e = &t.e[j];
        const ferry_tensor *b = ferry_model_tensor(base, (size_t)bi[j]);
        if (e->kind == PK_SAME) {
            memcpy(th[j], d.bh[bi[j]], 16);
            if (memcmp(th[j], e->hash, 16)) rc = mismatch(FERRY_ERR_PATCH_CORRUPT, "unchanged tensor", th[j], e->hash);
            continue;
        }
        if (e->chunk_log2 > SP_CHUNK_LOG2_DEFAULT) {
            free(h.tmp);
            if (!(h.tmp = ferry__malloc(((size_t)8) << e->chunk_log2))) { rc = FERRY_ERR_NOMEM; break; }
        }
        ferry__tensor_hash_begin(&h.st, e->name, e->dtype, e->ndim, e->shape);
        h.base = b->data;
        rc = decode_sparse(&d, e, b, hash_changes, &h);
        if (!rc) {
            ferry__hash_digest(&h.st, th[j]);
            if (memcmp(th[j], e->hash, 16)) rc = mismatch(FERRY_ERR_TARGET_MISMATCH, "result tensor", th[j], e->hash);
        }
        if (rc) rc = ferry__context(rc, "tensor '%s'", e->name);
    }
    if (!rc) rc = check_target(&t, (const uint8_t (*)[16])th, t.n);
    /* Verified: now write.  Decoding is deterministic, so pass 2 reproduces
     * exactly what pass 1 hashed. */
    for (size_t j = 0; !rc && j < t.n; j++)
        if (t.e[j].kind == PK_SPARSE)
            rc = decode_sparse(&d, &t.e[j], ferry_model_tensor(base, (size_t)bi[j]), write_changes, ferry_model_data_mut(base, (size_t)bi[j]));
    free(h.tmp);
    free(th);
    free(bi);
    dec_release(&d);
    patch_table_release(&t);
    return rc;
}
