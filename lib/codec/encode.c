/* ferry_diff: the patch A -> B (docs/FORMAT.md).
 *
 * Three parallel phases over a job list: hash every tensor of A and B, code
 * every chunk of every comparable tensor, compress the tensors carried
 * whole; then one serial pass assembles header, table and payloads. */
#include <stdlib.h>
#include <zstd.h>
#include "model.h"
#include "parallel.h"
#include "patch.h"
#include "sparse.h"

/* One entry of the patch, in name order. */
typedef struct enc_entry {
    const ferry_tensor *a, *b;   /* a NULL: added; b NULL: removed */
    ferry_dtype dtype;           /* B's dtype as patched (BF16 for cast F32) */
    uint64_t nbytes;             /* B's bytes as patched */
    bool cast;                   /* B is F32 masters cast to BF16 */
    bool comparable;             /* same dtype and shape: coded sparse */
    uint8_t kind, codec;
    uint64_t nchunks, first_job; /* chunk jobs of a comparable entry */
    uint64_t changed;
    ferry_buf whole;             /* WHOLE payload */
    uint8_t (*blocks)[16];       /* B's block digests (comparable entries) */
    uint8_t hash[16];            /* B's tensor hash */
} enc_entry;

typedef struct enc {
    const ferry_model *a, *b;
    int level, threads;
    enc_entry *e;
    size_t n;
    const uint8_t *base_hash;    /* A's model hash if the caller knows it */
    uint8_t (*ha)[16];           /* A's tensor hashes (when base_hash is NULL) */
    ferry_buf *chunk;            /* per chunk job */
    uint64_t *chunk_changed;
    size_t *job_entry;           /* chunk job -> entry */
    size_t njobs;
    sp_coder *coder;             /* per worker */
    size_t *dense;               /* entries to try whole */
    size_t ndense;
} enc;

static int put_u8(ferry_buf *b, uint8_t v) { return ferry__buf_append(b, &v, 1); }
static int put_u16(ferry_buf *b, uint16_t v) { uint8_t t[2]; ferry__put16(t, v); return ferry__buf_append(b, t, 2); }
static int put_u32(ferry_buf *b, uint32_t v) { uint8_t t[4]; ferry__put32(t, v); return ferry__buf_append(b, t, 4); }
static int put_u64(ferry_buf *b, uint64_t v) { uint8_t t[8]; ferry__put64(t, v); return ferry__buf_append(b, t, 8); }

/* Hash of B's tensor as patched, for entries that are not chunk-coded
 * (those hash their target while scanning it).  F32 masters are cast one
 * hash block at a time, never as a second full copy. */
static int hash_target(const enc_entry *e, uint8_t out[16])
{
    const ferry_tensor *t = e->b;
    if (!e->cast) {
        ferry_tensor_hash(t, out);
        return FERRY_OK;
    }
    XXH3_state_t st;
    ferry__tensor_hash_begin(&st, t->name, FERRY_BF16, t->ndim, t->shape, e->nbytes);
    uint16_t *buf = ferry__malloc(FERRY_HASH_BLOCK);
    if (!buf) return FERRY_ERR_NOMEM;
    for (uint64_t i = 0; i < t->nelem; i += FERRY_HASH_BLOCK / 2) {
        size_t m = t->nelem - i < FERRY_HASH_BLOCK / 2 ? (size_t)(t->nelem - i) : FERRY_HASH_BLOCK / 2;
        uint8_t d[16];
        ferry_f32_to_bf16_n(buf, (const float *)t->data + i, m);
        ferry__block_hash(buf, 2 * m, d);
        XXH3_128bits_update(&st, d, 16);
    }
    free(buf);
    ferry__hash_digest(&st, out);
    return FERRY_OK;
}

/* Jobs 0..n-1 hash B's tensors; n..n+|A|-1 hash A's. */
/* Jobs: chunks first (the bulk), then hashes of B's entries that are not
 * chunk-coded. */
static int chunk_job(void *ctx, size_t j, int w);
static int scan_job(void *ctx, size_t j, int w)
{
    enc *c = ctx;
    if (j < c->njobs) return chunk_job(ctx, j, w);
    j -= c->njobs;
    if (j < c->n) {
        enc_entry *e = &c->e[j];
        return e->b && !e->comparable ? hash_target(e, e->hash) : FERRY_OK;
    }
    return FERRY_OK;
}

static int chunk_job(void *ctx, size_t j, int w)
{
    enc *c = ctx;
    enc_entry *e = &c->e[c->job_entry[j]];
    sp_dtype st = sp_dtype_of(e->dtype);
    uint64_t nwords = e->nbytes * 8 / st.W, csize = (uint64_t)1 << SP_CHUNK_LOG2_DEFAULT;
    uint64_t lo = (j - e->first_job) * csize, n = nwords - lo < csize ? nwords - lo : csize;
    /* a chunk (2^22 words of at least a byte) starts at a hash block: its
     * block digests are whole ones of the tensor's */
    FERRY_ASSERT(lo < nwords && (lo * st.W / 8) % FERRY_HASH_BLOCK == 0);
    sp_src src = {(const uint8_t *)e->b->data + lo * (e->cast ? 4 : st.W / 8), e->cast};
    uint64_t block = lo * st.W / 8 / FERRY_HASH_BLOCK;
    int rc = ferry__codec_encode_chunk(&st, (const uint8_t *)e->a->data + lo * st.W / 8, &src, (size_t)n, e->nchunks > 1, &c->coder[w],
                             &c->chunk[j], &c->chunk_changed[j], e->blocks + block);
    return rc ? ferry__context(rc, "tensor '%s'", e->b->name) : FERRY_OK;
}

/* Whole payload: zstd when it helps, else raw. */
static int whole_job(void *ctx, size_t j, int w)
{
    (void)w;
    enc *c = ctx;
    enc_entry *e = &c->e[c->dense[j]];
    const void *data = e->b->data;
    uint16_t *cast = NULL;
    if (e->cast) {
        if (!(cast = ferry__malloc((size_t)e->nbytes))) return FERRY_ERR_NOMEM;
        ferry_f32_to_bf16_n(cast, e->b->data, (size_t)e->b->nelem);
        data = cast;
    }
    size_t bound = ZSTD_compressBound((size_t)e->nbytes);
    int rc = ferry__buf_reserve(&e->whole, bound);
    if (!rc) {
        size_t z = ZSTD_compress(e->whole.data, bound, data, (size_t)e->nbytes, c->level);
        if (!ZSTD_isError(z) && z < e->nbytes) {
            e->whole.size = z;
            e->codec = WHOLE_ZSTD;
        } else {
            e->whole.size = 0;
            e->codec = WHOLE_RAW;
            rc = ferry__buf_append(&e->whole, data, (size_t)e->nbytes);
        }
    }
    free(cast);
    return rc;
}

static int plan(enc *c, bool cast)
{
    size_t na = ferry_model_count(c->a), nb = ferry_model_count(c->b), i = 0, j = 0;
    c->e = ferry__calloc(na + nb + 1, sizeof *c->e);
    if (!c->e) return FERRY_ERR_NOMEM;
    while (i < na || j < nb) {
        const ferry_tensor *ta = i < na ? ferry_model_tensor(c->a, i) : NULL;
        const ferry_tensor *tb = j < nb ? ferry_model_tensor(c->b, j) : NULL;
        int cmp = !ta ? 1 : !tb ? -1 : strcmp(ta->name, tb->name);
        enc_entry *e = &c->e[c->n++];
        if (strlen((cmp <= 0 ? ta : tb)->name) > UINT16_MAX)
            return ferry__fail(FERRY_ERR_LIMIT, "tensor name longer than 65535 bytes");
        if (cmp <= 0) e->a = ta, i++;
        if (cmp >= 0) e->b = tb, j++;
        if (!e->b) {
            e->kind = PK_REMOVED;
            continue;
        }
        e->cast = cast && tb->dtype == FERRY_F32;
        e->dtype = e->cast ? FERRY_BF16 : tb->dtype;
        e->nbytes = e->cast ? tb->nelem * 2 : tb->nbytes;
        e->comparable = e->a && e->a->dtype == e->dtype && e->a->ndim == tb->ndim &&
                        memcmp(e->a->shape, tb->shape, tb->ndim * sizeof *tb->shape) == 0;
        if (e->comparable) {
            if (!(e->blocks = ferry__malloc((size_t)(ferry__hash_nblocks(e->nbytes) + 1) * 16))) return FERRY_ERR_NOMEM;
            uint64_t nwords = e->nbytes * 8 / sp_dtype_of(e->dtype).W;
            e->nchunks = (nwords + ((uint64_t)1 << SP_CHUNK_LOG2_DEFAULT) - 1) >> SP_CHUNK_LOG2_DEFAULT;
            e->first_job = c->njobs;
            c->njobs += e->nchunks;
        }
    }
    c->chunk = ferry__calloc(c->njobs + 1, sizeof *c->chunk);
    c->chunk_changed = ferry__calloc(c->njobs + 1, sizeof *c->chunk_changed);
    c->job_entry = ferry__calloc(c->njobs + 1, sizeof *c->job_entry);
    c->dense = ferry__calloc(c->n + 1, sizeof *c->dense);
    c->ha = ferry__malloc((na + 1) * 16);
    c->coder = ferry__calloc((size_t)c->threads, sizeof *c->coder);
    if (!c->chunk || !c->chunk_changed || !c->job_entry || !c->dense || !c->ha || !c->coder) return FERRY_ERR_NOMEM;
    for (size_t k = 0; k < c->n; k++)
        for (uint64_t q = 0; q < c->e[k].nchunks; q++) c->job_entry[c->e[k].first_job + q] = k;
    return FERRY_OK;
}

/* After the chunk phase: unchanged tensors become SAME; dense ones and the
 * incomparable ones go to the whole phase. */
static void classify(enc *c)
{
    for (size_t k = 0; k < c->n; k++) {
        enc_entry *e = &c->e[k];
        if (!e->b) continue;
        if (e->comparable)
            ferry__tensor_hash_blocks(e->b->name, e->dtype, e->b->ndim, e->b->shape, e->nbytes,
                                      (const uint8_t (*)[16])e->blocks, e->hash);
        if (!e->comparable) {
            e->kind = PK_WHOLE;
            c->dense[c->ndense++] = k;
            continue;
        }
        for (uint64_t q = 0; q < e->nchunks; q++) e->changed += c->chunk_changed[e->first_job + q];
        e->kind = e->changed ? PK_SPARSE : PK_SAME;
        /* Dense changes (an FP32 norm that moved everywhere) may code
         * smaller whole: try it only when the change rate makes it likely. */
        if (e->changed * 4 > e->b->nelem) c->dense[c->ndense++] = k;
    }
}

static uint64_t sparse_size(const enc *c, const enc_entry *e)
{
    uint64_t s = 4 * e->nchunks;
    for (uint64_t q = 0; q < e->nchunks; q++) s += c->chunk[e->first_job + q].size;
    return s;
}

static int put_entry(const enc *c, enc_entry *e, ferry_buf *tab)
{
    const ferry_tensor *named = e->b ? e->b : e->a;
    size_t nl = strlen(named->name);
    int rc;
    if ((rc = put_u16(tab, (uint16_t)nl)) || (rc = ferry__buf_append(tab, named->name, nl))) return rc;
    if (e->kind == PK_SPARSE && e->whole.size && e->whole.size < sparse_size(c, e)) e->kind = PK_WHOLE;
    if ((rc = put_u8(tab, e->kind)) || e->kind == PK_REMOVED) return rc;
    if ((rc = put_u8(tab, (uint8_t)e->dtype)) || (rc = put_u8(tab, (uint8_t)e->b->ndim))) return rc;
    for (uint32_t i = 0; i < e->b->ndim; i++)
        if ((rc = put_u64(tab, e->b->shape[i]))) return rc;
    if ((rc = ferry__buf_append(tab, e->hash, 16))) return rc;
    if (e->kind == PK_SAME) return FERRY_OK;
    if (e->kind == PK_WHOLE) {
        if ((rc = put_u8(tab, e->codec))) return rc;
        return put_u64(tab, e->whole.size);
    }
    if ((rc = put_u8(tab, SP_CHUNK_LOG2_DEFAULT)) || (rc = put_u64(tab, e->changed))) return rc;
    return put_u64(tab, sparse_size(c, e));
}

static int put_payload(const enc *c, const enc_entry *e, ferry_buf *out)
{
    if (e->kind == PK_WHOLE) return ferry__buf_append(out, e->whole.data, e->whole.size);
    if (e->kind != PK_SPARSE) return FERRY_OK;
    int rc = FERRY_OK;
    for (uint64_t q = 0; !rc && q < e->nchunks; q++) {
        size_t size = c->chunk[e->first_job + q].size;
        FERRY_ASSERT(size <= UINT32_MAX); /* 2^22 words code in far less */
        rc = put_u32(out, (uint32_t)size);
    }
    for (uint64_t q = 0; !rc && q < e->nchunks; q++) {
        const ferry_buf *b = &c->chunk[e->first_job + q];
        rc = ferry__buf_append(out, b->data, b->size);
    }
    return rc;
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

/* Header, zstd(table), payloads, checksum trailer. */
static int assemble(enc *c, ferry_buf *out)
{
    ferry_buf tab = {0};
    uint8_t base_hash[16], target_hash[16];
    uint8_t (*hb)[16] = ferry__malloc((c->n + 1) * 16);
    if (!hb) return FERRY_ERR_NOMEM;
    size_t nb = 0;
    for (size_t k = 0; k < c->n; k++)
        if (c->e[k].b) memcpy(hb[nb++], c->e[k].hash, 16);
    int rc = FERRY_OK;
    if (c->base_hash) memcpy(base_hash, c->base_hash, 16);
    else rc = ferry__model_hash_tensors(c->a, (const uint8_t (*)[16])c->ha, base_hash);
    if (!rc) rc = ferry__model_hash_tensors(c->b, (const uint8_t (*)[16])hb, target_hash);
    free(hb);
    /* the lowest version that has every chunk codec used */
    unsigned version = PATCH_VERSION;
    for (size_t j = 0; j < c->njobs; j++)
        if (c->chunk[j].size && sp_codec_version(c->chunk[j].data[0]) > version) version = sp_codec_version(c->chunk[j].data[0]);
    if (!rc) rc = put_metadata(&tab, c->b);
    if (!rc) rc = put_u32(&tab, (uint32_t)c->n);
    for (size_t k = 0; !rc && k < c->n; k++) rc = put_entry(c, &c->e[k], &tab);
    if (!rc && tab.size > PATCH_TABLE_MAX) rc = ferry__fail(FERRY_ERR_LIMIT, "patch table of %zu bytes exceeds the limit", tab.size);
    if (!rc) rc = ferry__buf_reserve(out, PATCH_HEADER_SIZE + ZSTD_compressBound(tab.size));
    if (!rc) {
        size_t z = ZSTD_compress(out->data + PATCH_HEADER_SIZE, out->cap - PATCH_HEADER_SIZE, tab.data, tab.size, 19);
        if (ZSTD_isError(z)) rc = ferry__fail(FERRY_ERR_NOMEM, "zstd: %s", ZSTD_getErrorName(z));
        else {
            uint8_t *h = out->data;
            memcpy(h, PATCH_MAGIC, 8);
            ferry__put32(h + 8, version);
            ferry__put32(h + 12, 0);
            memcpy(h + 16, base_hash, 16);
            memcpy(h + 32, target_hash, 16);
            ferry__put32(h + 56, (uint32_t)tab.size);
            ferry__put32(h + 60, (uint32_t)z);
            out->size = PATCH_HEADER_SIZE + z;
        }
    }
    for (size_t k = 0; !rc && k < c->n; k++) rc = put_payload(c, &c->e[k], out);
    if (!rc) rc = ferry__buf_reserve(out, PATCH_TRAILER_SIZE);
    if (!rc) {
        ferry__put64(out->data + 48, out->size + PATCH_TRAILER_SIZE);
        XXH128_canonical_t sum;
        XXH128_canonicalFromHash(&sum, XXH3_128bits(out->data, out->size));
        memcpy(out->data + out->size, &sum, 16);
        out->size += 16;
    }
    ferry__buf_release(&tab);
    return rc;
}

static void release(enc *c)
{
    for (size_t k = 0; c->e && k < c->n; k++) {
        ferry__buf_release(&c->e[k].whole);
        free(c->e[k].blocks);
    }
    for (size_t j = 0; c->chunk && j < c->njobs; j++) ferry__buf_release(&c->chunk[j]);
    for (int w = 0; c->coder && w < c->threads; w++) ferry__codec_coder_release(&c->coder[w]);
    free(c->e);
    free(c->chunk);
    free(c->chunk_changed);
    free(c->job_entry);
    free(c->dense);
    free(c->ha);
    free(c->coder);
}

int ferry_diff(const ferry_model *a, const ferry_model *b, const ferry_diff_options *opts, void **patch, size_t *size)
{
    if (!a || !b || !patch || !size) return ferry__fail(FERRY_ERR_ARG, "ferry_diff: NULL argument");
    *patch = NULL;
    *size = 0;
    enc c = {.a = a, .b = b, .level = opts && opts->level ? opts->level : 3,
             .threads = ferry__threads(opts ? opts->threads : 1), .base_hash = opts ? opts->base_hash : NULL};
    if (c.level < 1 || c.level > ZSTD_maxCLevel()) return ferry__fail(FERRY_ERR_ARG, "ferry_diff: level %d out of range", c.level);
    ferry_buf out = {0};
    int rc = plan(&c, opts && opts->cast_bf16);
    if (!rc && !c.base_hash) rc = ferry__hash_tensors_mt(a, c.threads, c.ha);
    if (!rc) rc = ferry__parallel(c.threads, c.njobs + c.n, scan_job, &c);
    if (!rc) {
        classify(&c);
        rc = ferry__parallel(c.threads, c.ndense, whole_job, &c);
    }
    if (!rc) rc = assemble(&c, &out);
    release(&c);
    if (rc) {
        ferry__buf_release(&out);
        return rc;
    }
    *patch = out.data;
    *size = out.size;
    return FERRY_OK;
}
