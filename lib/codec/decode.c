/* ferry_apply / ferry_apply_inplace.  The base is verified before any
 * work and the result after it; nothing partial is ever returned or
 * written.  Chunks and tensors are decoded and hashed in parallel. */
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <sys/mman.h>
#include <zstd.h>
#include "model.h"
#include "parallel.h"
#include "patch.h"
#include "sparse.h"
#include "apply_sink.h"
#include "undo.h"
#include "decode_impl.h"

/* chunks decode on separate workers, each hashing its own leaves */
_Static_assert(((uint64_t)1 << SP_CHUNK_LOG2_MIN) >= FERRY_HASH_BLOCK, "a chunk covers whole hash leaves");

/* Default undo budget of ferry_apply_inplace: 64 MiB + 16 x the patch, and
 * never more than a quarter of the model on top (dense changes would need
 * 4 bytes per changed BF16 word: twice the model itself). */
static uint64_t undo_limit_default(uint64_t patch, uint64_t model)
{
    uint64_t by_patch = patch > UINT64_MAX / 32 ? UINT64_MAX / 2 : 16 * patch;
    return ((uint64_t)64 << 20) + (by_patch < model / 4 ? by_patch : model / 4);
}

static size_t undo_windows(uint64_t n) { return (size_t)((n + ((uint64_t)1 << UNDO_WIN_LOG2) - 1) >> UNDO_WIN_LOG2); }

/* A large undo log is mapped memory, and the next in-place apply reuses it
 * instead of mapping a new one: first writes to fresh pages cost far more
 * than the log's own writes (page faults and zeroing; 0.3-0.4 s for 80 MB
 * on the development VM, against 16 ms to write the same pages again), and
 * an island applies a version after another.  One mapping is kept per
 * process, the largest seen, until the process ends.  Its bytes are never
 * read before this apply wrote them. */
static pthread_mutex_t arena_lock = PTHREAD_MUTEX_INITIALIZER;
static void *arena_spare;
static size_t arena_spare_size;

/* A mapping of at least size bytes (its size in *map), or NULL. */
static void *arena_get(size_t size, size_t *map)
{
    void *p = NULL, *drop = NULL;
    size_t drop_size = 0;
    pthread_mutex_lock(&arena_lock);
    if (arena_spare && arena_spare_size >= size) {
        p = arena_spare;
        *map = arena_spare_size;
        arena_spare = NULL;
    } else if (arena_spare) { /* too small for this model: a larger one replaces it */
        drop = arena_spare;
        drop_size = arena_spare_size;
        arena_spare = NULL;
    }
    pthread_mutex_unlock(&arena_lock);
    if (drop) munmap(drop, drop_size);
    if (p) return p;
#ifdef MAP_POPULATE
    /* its pages populated in one call: as page faults, scattered over the
     * workers, they cost more, and contend */
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
#else
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
#endif
    if (p == MAP_FAILED) return NULL;
    *map = size;
    return p;
}

/* Gives a log back: kept for the next apply (the larger of two), or freed. */
static void arena_put(void *p, size_t map)
{
    if (!map) {
        free(p);
        return;
    }
    pthread_mutex_lock(&arena_lock);
    if (!arena_spare || arena_spare_size < map) {
        void *q = p;
        size_t n = map;
        p = arena_spare;
        map = arena_spare_size;
        arena_spare = q;
        arena_spare_size = n;
    }
    pthread_mutex_unlock(&arena_lock);
    if (p) munmap(p, map);
}

/* The workers' decoder scratch (positions, words, rank bitmaps, rANS
 * tables: about 40 bytes per change of the largest chunk) is likewise kept
 * for the next apply, for up to SCRATCH_KEEP workers and chunks of up to
 * 2^20 changes, instead of being grown from nothing by every apply. */
#define SCRATCH_KEEP 16
static sp_scratch scratch_spare[SCRATCH_KEEP];
static int scratch_nspare;

static void scratch_get(sp_scratch *s)
{
    pthread_mutex_lock(&arena_lock);
    if (scratch_nspare > 0) *s = scratch_spare[--scratch_nspare];
    pthread_mutex_unlock(&arena_lock);
}

static void scratch_put(sp_scratch *s)
{
    bool kept = false;
    if (s->cap <= (size_t)1 << 20) {
        pthread_mutex_lock(&arena_lock);
        if (scratch_nspare < SCRATCH_KEEP) {
            s->have_words = 0;
            s->lazy = 0;
            scratch_spare[scratch_nspare++] = *s;
            kept = true;
        }
        pthread_mutex_unlock(&arena_lock);
    }
    if (!kept) ferry__codec_scratch_release(s);
    memset(s, 0, sizeof *s);
}

static int mismatch(int code, const char *what, const uint8_t got[16], const uint8_t want[16])
{
    char g[33], w[33];
    ferry__hex(g, got, 16);
    ferry__hex(w, want, 16);
    return ferry__fail(code, "%s hash %s, patch expects %s", what, g, w);
}

static const ferry_tensor *base_of(const dec *d, size_t j) { return ferry_model_tensor(d->base, (size_t)d->bi[j]); }

/* Matches every entry to its base tensor and checks that the table
 * accounts for every base tensor with a consistent dtype and shape. */
static int match_base(dec *d)
{
    size_t nb = ferry_model_count(d->base), i = 0;
    for (size_t j = 0; j < d->t.n; j++) {
        const patch_entry *e = &d->t.e[j];
        if (i < nb && strcmp(ferry_model_tensor(d->base, i)->name, e->name) < 0) break;
        d->bi[j] = i < nb && strcmp(ferry_model_tensor(d->base, i)->name, e->name) == 0 ? (long)i++ : -1;
        if (d->bi[j] < 0 && e->kind != PK_WHOLE)
            return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': patch needs it in the base, which lacks it", e->name);
        if (e->kind == PK_SAME || e->kind == PK_SPARSE) {
            const ferry_tensor *b = base_of(d, j);
            if (b->dtype != e->dtype || b->ndim != e->ndim || memcmp(b->shape, e->shape, e->ndim * sizeof *e->shape))
                return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': dtype or shape differs from the base", e->name);
        }
    }
    if (i < nb)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch does not account for base tensor '%s'", ferry_model_tensor(d->base, i)->name);
    return FERRY_OK;
}

/* Sizes the chunk list of every SPARSE entry (indexed later, entry by
 * entry, when its chunk size table is at hand). */
static int alloc_chunks(dec *d)
{
    size_t total = 0;
    for (size_t j = 0; j < d->t.n; j++) {
        const patch_entry *e = &d->t.e[j];
        if (e->kind != PK_SPARSE) continue;
        uint64_t nc = patch_chunks(e);
        if (nc > e->payload_size / 5) /* 4 size bytes + at least 1 byte each */
            return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': chunk table larger than its payload", e->name);
        total += (size_t)nc;
    }
    d->ch = ferry__calloc(total + 1, sizeof *d->ch);
    d->ent_first = ferry__calloc(d->t.n + 1, sizeof *d->ent_first);
    if (!d->ch || !d->ent_first) return FERRY_ERR_NOMEM;
    d->nch_cap = total;
    return FERRY_OK;
}

int ferry__codec_dec_index_entry(dec *d, size_t j)
{
    const patch_entry *e = &d->t.e[j];
    d->ent_first[j] = d->nch;
    if (e->kind != PK_SPARSE) return FERRY_OK;
    uint64_t nc = patch_chunks(e), csize = (uint64_t)1 << e->chunk_log2, off = 4 * nc;
    FERRY_ASSERT(d->nch + nc <= d->nch_cap);
    const uint8_t *sizes = d->patch + e->payload_off;
    for (uint64_t c = 0; c < nc; c++) {
        uint64_t len = ferry__le32(sizes + 4 * c);
        if (len > e->payload_size - off)
            return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': chunk %llu past its payload", e->name, (unsigned long long)c);
        uint64_t lo = c * csize;
        d->ch[d->nch++] = (chunk_ref){j, lo, e->nwords - lo < csize ? e->nwords - lo : csize, e->payload_off + off, len};
        off += len;
    }
    if (off != e->payload_size)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': %llu payload bytes after its last chunk", e->name,
                           (unsigned long long)(e->payload_size - off));
    return FERRY_OK;
}

/* Lists the chunks of every SPARSE entry with their payload ranges. */
static int index_chunks(dec *d)
{
    int rc = FERRY_OK;
    for (size_t j = 0; !rc && j < d->t.n; j++) rc = ferry__codec_dec_index_entry(d, j);
    if (!rc) FERRY_ASSERT(d->nch == d->nch_cap);
    return rc;
}

/* Decodes chunk c into the worker's scratch (positions and new words). */
static int decode_chunk(dec *d, const chunk_ref *c, int w, size_t *k)
{
    const patch_entry *e = &d->t.e[c->entry];
    sp_dtype st = sp_dtype_of(e->dtype);
    /* index_chunks cut the tensor: the chunk lies inside it and inside the patch */
    FERRY_ASSERT(c->n > 0 && c->lo + c->n <= e->nwords && c->off + c->len <= e->payload_off + e->payload_size);
    const uint8_t *a = (const uint8_t *)base_of(d, c->entry)->data + c->lo * st.W / 8;
    int rc = ferry__codec_decode_chunk(&st, a, (size_t)c->n, d->patch + c->off, (size_t)c->len, d->t.version, &d->coder[w], k);
    if (rc) return ferry__context(rc, "tensor '%s', chunk at word %llu", e->name, (unsigned long long)c->lo);
    FERRY_ASSERT(*k <= c->n); /* distinct positions inside the chunk */
    __atomic_fetch_add(&d->got[c->entry], (uint64_t)*k, __ATOMIC_RELAXED);
    return FERRY_OK;
}

static void write_changes(uint8_t *dst, unsigned W, const sp_scratch *s, size_t k)
{
    for (size_t j = 0; j < k; j++) sp_store(dst, s->pos[j], W, s->val[j]);
}

/* Hash of a SPARSE entry's result from its block digests, checked, and
 * its decoded change count against the table's. */
static int check_sparse(dec *d, size_t j)
{
    const patch_entry *e = &d->t.e[j];
    uint64_t got = __atomic_load_n(&d->got[j], __ATOMIC_RELAXED);
    if (got != e->changed)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': %llu changes decoded, table says %llu", e->name,
                           (unsigned long long)got, (unsigned long long)e->changed);
    ferry__tensor_hash_blocks(e->name, e->dtype, e->ndim, e->shape, e->nbytes, (const uint8_t (*)[16])d->blocks[j], d->th[j]);
    if (memcmp(d->th[j], e->hash, 16))
        return ferry__context(mismatch(FERRY_ERR_TARGET_MISMATCH, "result tensor", d->th[j], e->hash), "tensor '%s'", e->name);
    return FERRY_OK;
}

/* An unchanged tensor's hash: the base's, which must be the table's; when
 * the caller vouched for the base, the table's (the base hash matched). */
static int check_same(dec *d, size_t j)
{
    const patch_entry *e = &d->t.e[j];
    if (d->vouched) {
        memcpy(d->th[j], e->hash, 16);
        return FERRY_OK;
    }
    memcpy(d->th[j], d->bh[d->bi[j]], 16);
    if (memcmp(d->th[j], e->hash, 16))
        return ferry__context(mismatch(FERRY_ERR_PATCH_CORRUPT, "unchanged tensor", d->th[j], e->hash), "tensor '%s'", e->name);
    return FERRY_OK;
}

/* A WHOLE payload must declare exactly its tensor's size (raw: its length;
 * zstd: the frame's content size), checked before anything is allocated
 * for the result. */
static int check_whole_size(const dec *d, size_t j)
{
    const patch_entry *e = &d->t.e[j];
    if (e->kind != PK_WHOLE) return FERRY_OK;
    unsigned long long n = e->codec == WHOLE_RAW ? e->payload_size
                                                 : ZSTD_getFrameContentSize(d->patch + e->payload_off, (size_t)e->payload_size);
    if (n != e->nbytes)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': payload holds %s bytes, shape needs %llu", e->name,
                           n == ZSTD_CONTENTSIZE_UNKNOWN || n == ZSTD_CONTENTSIZE_ERROR ? "an undeclared number of" : "another number of",
                           (unsigned long long)e->nbytes);
    return FERRY_OK;
}

static int check_whole_sizes(const dec *d)
{
    int rc = FERRY_OK;
    for (size_t j = 0; !rc && j < d->t.n; j++) rc = check_whole_size(d, j);
    return rc;
}

int ferry__codec_dec_setup(dec *d, const ferry_model *base, const ferry_apply_options *opts)
{
    d->base = base;
    d->threads = ferry__threads(opts ? opts->threads : 1);
    int rc;
    size_t nb = ferry_model_count(base), n = d->t.n + 1;
    d->bh = ferry__malloc((nb + 1) * 16);
    d->bi = ferry__malloc(n * sizeof *d->bi);
    d->th = ferry__calloc(n, 16);
    d->coder = ferry__calloc((size_t)d->threads, sizeof *d->coder);
    if (!d->bh || !d->bi || !d->th || !d->coder) return FERRY_ERR_NOMEM;
    for (int w = 0; w < d->threads; w++) scratch_get(&d->coder[w].s);
    /* The base must be the model the patch was made from. */
    uint8_t h[16];
    if (opts && opts->base_hash) {
        memcpy(h, opts->base_hash, 16);
        d->vouched = true;
    } else if ((rc = ferry__hash_tensors_mt(base, d->threads, d->bh)) ||
               (rc = ferry__model_hash_tensors(base, (const uint8_t (*)[16])d->bh, h))) {
        return rc;
    }
    if (memcmp(h, d->t.base_hash, 16)) return mismatch(FERRY_ERR_BASE_MISMATCH, "base model", h, d->t.base_hash);
    if ((rc = match_base(d))) return rc;
    if (!(d->li = ferry__calloc(d->t.n + 1, sizeof *d->li)) || !(d->got = ferry__calloc(d->t.n + 1, sizeof *d->got)))
        return FERRY_ERR_NOMEM;
    for (size_t j = 0, i = 0; j < d->t.n; j++)
        if (d->t.e[j].kind != PK_REMOVED) d->li[j] = i++;
    if (!(d->blocks = ferry__calloc(d->t.n + 1, sizeof *d->blocks))) return FERRY_ERR_NOMEM;
    for (size_t j = 0; j < d->t.n; j++)
        if (d->t.e[j].kind == PK_SPARSE &&
            !(d->blocks[j] = ferry__malloc((size_t)(ferry__hash_nblocks(d->t.e[j].nbytes) + 1) * 16)))
            return FERRY_ERR_NOMEM;
    return alloc_chunks(d);
}

static int begin(dec *d, const ferry_model *base, const void *patch, size_t size, const ferry_apply_options *opts)
{
    memset(d, 0, sizeof *d);
    d->patch = patch;
    int rc = ferry__codec_patch_table_parse(patch, size, &d->t);
    if (!rc) rc = ferry__codec_dec_setup(d, base, opts);
    return rc ? rc : index_chunks(d);
}

void ferry__codec_dec_end(dec *d)
{
    for (size_t j = 0; d->undo && j < d->nch; j++) free(d->undo[j].own);
    free(d->undo);
    arena_put(d->arena, d->arena_map);
    for (int w = 0; d->coder && w < d->threads; w++) scratch_put(&d->coder[w].s);
    for (int w = 0; d->tmp && w < d->threads; w++) free(d->tmp[w]);
    free(d->tmp);
    free(d->bh);
    free(d->bi);
    free(d->th);
    free(d->leaf);
    free(d->li);
    free(d->got);
    for (size_t j = 0; d->whole && j < d->t.n; j++) free(d->whole[j]);
    free(d->whole);
    for (size_t j = 0; d->blocks && j < d->t.n; j++) free(d->blocks[j]);
    free(d->blocks);
    free(d->ch);
    free(d->ent_first);
    free(d->coder);
    ferry__codec_patch_table_release(&d->t);
}

/* The result's model hash from its tensor hashes and the table's metadata. */
static int check_target(const dec *d)
{
    uint8_t (*th)[16] = ferry__malloc((d->t.n + 1) * 16), h[16];
    if (!th) return FERRY_ERR_NOMEM;
    size_t n = 0;
    for (size_t j = 0; j < d->t.n; j++)
        if (d->t.e[j].kind != PK_REMOVED) memcpy(th[n++], d->th[j], 16);
    ferry__model_hash_from((const uint8_t (*)[16])th, n, d->t.nmeta, (const char *const *)d->t.meta_key,
                           (const char *const *)d->t.meta_val, h);
    free(th);
    if (memcmp(h, d->t.target_hash, 16)) return mismatch(FERRY_ERR_TARGET_MISMATCH, "result model", h, d->t.target_hash);
    return FERRY_OK;
}

/* ---- ferry_apply: into a sink (new buffers, or a file) ---- */

/* Writes changes j.. below position hi into the piece p of words [lo, hi),
 * the overwritten words into old (if not NULL); returns the next change. */
static inline __attribute__((always_inline)) size_t put_changes(uint8_t *p, size_t lo, size_t hi, const sp_scratch *s,
                                                                size_t j, size_t k, uint8_t *old, unsigned W)
{
    for (; j < k && s->pos[j] < hi; j++) {
        if (old) sp_store(old, j, W, sp_load(p, s->pos[j] - lo, W));
        sp_store(p, s->pos[j] - lo, W, s->val[j]);
    }
    return j;
}

/* put_changes with a constant word width in each loop */
static size_t put_changes_w(uint8_t *p, size_t lo, size_t hi, const sp_scratch *s, size_t j, size_t k, uint8_t *old,
                            unsigned W)
{
    switch (W) {
    case 8: return put_changes(p, lo, hi, s, j, k, old, 8);
    case 16: return put_changes(p, lo, hi, s, j, k, old, 16);
    case 32: return put_changes(p, lo, hi, s, j, k, old, 32);
    default: return put_changes(p, lo, hi, s, j, k, old, 64);
    }
}

/* Emits a SPARSE chunk's result through the sink piece by piece, hashing
 * each piece while it is in cache.  A sink whose pieces are the base's own
 * words patches it in place; old (if not NULL) then receives the words
 * overwritten, one per change. */
static int sparse_out_leaves(dec *d, const chunk_ref *c, int w, size_t k, const ferry__sink *sk, uint8_t *old);

static int sparse_out(dec *d, const chunk_ref *c, int w, size_t k, const ferry__sink *sk, uint8_t *old)
{
    const patch_entry *e = &d->t.e[c->entry];
    unsigned W = sp_dtype_of(e->dtype).W;
    const sp_scratch *s = &d->coder[w].s;
    const uint8_t *base = (const uint8_t *)base_of(d, c->entry)->data + c->lo * W / 8;
    /* with the base's leaf digests: a chunk of whole leaves takes the leaf path */
    if (d->leaf && d->leaf[c->entry] && c->lo * W / 8 % FERRY_HASH_BLOCK == 0 &&
        ((c->lo + c->n) * W / 8 % FERRY_HASH_BLOCK == 0 || (c->lo + c->n) * W / 8 == e->nbytes))
        return sparse_out_leaves(d, c, w, k, sk, old);
    ferry__blockhash h;
    ferry__bh_begin(&h, d->blocks[c->entry] + c->lo * W / 8 / FERRY_HASH_BLOCK);
    size_t j = 0;
    for (size_t lo = 0; lo < c->n; lo += SP_SCAN_PIECE) {
        size_t hi = c->n - lo < SP_SCAN_PIECE ? (size_t)c->n : lo + SP_SCAN_PIECE, bytes = (hi - lo) * W / 8;
        uint64_t off = (c->lo + lo) * W / 8;
        uint8_t *p = sk->piece(sk->ctx, d->li[c->entry], off, bytes, w);
        if (p != base + lo * W / 8) memcpy(p, base + lo * W / 8, bytes);
        j = put_changes_w(p, lo, hi, s, j, k, old, W);
        ferry__bh_feed(&h, p, bytes);
        int rc = sk->done(sk->ctx, d->li[c->entry], off, bytes, w);
        if (rc) return rc;
    }
    ferry__bh_end(&h);
    FERRY_ASSERT(j == k); /* the positions are sorted and inside the chunk: every change was written */
    return FERRY_OK;
}

/* sparse_out with the base's leaf digests (in place, a base vouched for
 * whose digests the model keeps; docs/FORMAT.md "Verification on apply"):
 * a leaf no change touches is neither read nor written, and its digest is
 * the cached one; a touched leaf is hashed as it was (the base) and as it
 * becomes (the result) piece by piece in cache, and its base digest must be
 * the cached one (FERRY_ERR_BASE_MISMATCH). */
static int sparse_out_leaves(dec *d, const chunk_ref *c, int w, size_t k, const ferry__sink *sk, uint8_t *old)
{
    const patch_entry *e = &d->t.e[c->entry];
    unsigned W = sp_dtype_of(e->dtype).W;
    const sp_scratch *s = &d->coder[w].s;
    const uint8_t *base = (const uint8_t *)base_of(d, c->entry)->data + c->lo * W / 8;
    const uint8_t (*leaf)[16] = (const uint8_t (*)[16])d->leaf[c->entry];
    uint64_t bw = FERRY_HASH_BLOCK * 8 / W, b0 = c->lo / bw; /* words per leaf, first leaf */
    size_t j = 0;
    for (size_t blo = 0; blo < c->n; blo += (size_t)bw) {
        size_t bhi = c->n - blo < bw ? (size_t)c->n : blo + (size_t)bw;
        uint64_t b = b0 + blo / bw;
        uint8_t *out = d->blocks[c->entry][b];
        if (j == k || s->pos[j] >= bhi) { /* untouched */
            memcpy(out, leaf[b], 16);
            continue;
        }
        XXH3_state_t hb, hr;
        XXH3_128bits_reset(&hb);
        XXH3_128bits_reset(&hr);
        for (size_t lo = blo; lo < bhi; lo += SP_SCAN_PIECE) {
            size_t hi = bhi - lo < SP_SCAN_PIECE ? bhi : lo + SP_SCAN_PIECE, bytes = (hi - lo) * W / 8;
            uint64_t off = (c->lo + lo) * W / 8;
            uint8_t *p = sk->piece(sk->ctx, d->li[c->entry], off, bytes, w);
            if (p != base + lo * W / 8) memcpy(p, base + lo * W / 8, bytes);
            XXH3_128bits_update(&hb, p, bytes);
            j = put_changes_w(p, lo, hi, s, j, k, old, W);
            XXH3_128bits_update(&hr, p, bytes);
            int rc = sk->done(sk->ctx, d->li[c->entry], off, bytes, w);
            if (rc) return rc;
        }
        uint8_t g[16];
        ferry__hash_digest(&hb, g);
        if (memcmp(g, leaf[b], 16))
            return ferry__context(mismatch(FERRY_ERR_BASE_MISMATCH, "base leaf", g, leaf[b]), "tensor '%s', leaf %llu", e->name,
                                  (unsigned long long)b);
        ferry__hash_digest(&hr, out);
    }
    FERRY_ASSERT(j == k);
    return FERRY_OK;
}

/* Copies an unchanged tensor through the sink, a hash block at a time. */
static int same_out(dec *d, size_t j, int w, const ferry__sink *sk)
{
    const patch_entry *e = &d->t.e[j];
    const uint8_t *src = base_of(d, j)->data;
    for (uint64_t off = 0; off < e->nbytes; off += FERRY_HASH_BLOCK) {
        size_t n = (size_t)(e->nbytes - off < FERRY_HASH_BLOCK ? e->nbytes - off : FERRY_HASH_BLOCK);
        memcpy(sk->piece(sk->ctx, d->li[j], off, n, w), src + off, n);
        int rc = sk->done(sk->ctx, d->li[j], off, n, w);
        if (rc) return rc;
    }
    return check_same(d, j);
}

/* A WHOLE tensor through the sink, a hash block at a time: raw bytes, or
 * a streaming zstd decompression that must end exactly at the tensor's
 * size (never more memory than a block, whatever the frame claims). */
static int whole_out(dec *d, size_t j, int w, const ferry__sink *sk)
{
    const patch_entry *e = &d->t.e[j];
    const uint8_t *src = d->patch + e->payload_off;
    if (e->codec == WHOLE_RAW && e->payload_size != e->nbytes)
        return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "tensor '%s': raw payload of %llu bytes for %llu", e->name,
                           (unsigned long long)e->payload_size, (unsigned long long)e->nbytes);
    ZSTD_DStream *zs = NULL;
    if (e->codec == WHOLE_ZSTD && !(zs = ZSTD_createDStream())) return ferry__fail(FERRY_ERR_NOMEM, "zstd stream");
    ZSTD_inBuffer in = {src, (size_t)e->payload_size, 0};
    XXH3_state_t st;
    ferry__tensor_hash_begin(&st, e->name, e->dtype, e->ndim, e->shape, e->nbytes);
    int rc = FERRY_OK;
    size_t ret = 1;
    for (uint64_t off = 0; !rc && off < e->nbytes; off += FERRY_HASH_BLOCK) {
        size_t n = (size_t)(e->nbytes - off < FERRY_HASH_BLOCK ? e->nbytes - off : FERRY_HASH_BLOCK);
        uint8_t *p = sk->piece(sk->ctx, d->li[j], off, n, w);
        if (!zs) memcpy(p, src + off, n);
        else {
            ZSTD_outBuffer o = {p, n, 0};
            while (o.pos < n && !ZSTD_isError(ret) && ret != 0) {
                size_t before = o.pos + in.pos;
                ret = ZSTD_decompressStream(zs, &o, &in);
                if (o.pos + in.pos == before) break; /* no progress: input ended */
            }
            if (ZSTD_isError(ret) || o.pos != n) rc = FERRY_ERR_PATCH_CORRUPT;
        }
        if (!rc) {
            uint8_t dg[16];
            ferry__block_hash(p, n, dg);
            XXH3_128bits_update(&st, dg, 16);
            rc = sk->done(sk->ctx, d->li[j], off, n, w);
        }
    }
    if (!rc && zs) { /* the frame must end exactly here */
        uint8_t extra;
        ZSTD_outBuffer o = {&extra, 1, 0};
        if (ret != 0) ret = ZSTD_decompressStream(zs, &o, &in);
        if (ZSTD_isError(ret) || ret != 0 || o.pos || in.pos != in.size) rc = FERRY_ERR_PATCH_CORRUPT;
    }
    ZSTD_freeDStream(zs);
    if (rc == FERRY_ERR_PATCH_CORRUPT)
        return ferry__fail(rc, "tensor '%s': zstd payload does not decode to exactly %llu bytes", e->name,
                           (unsigned long long)e->nbytes);
    if (rc) return rc;
    ferry__hash_digest(&st, d->th[j]);
    if (memcmp(d->th[j], e->hash, 16))
        return ferry__context(mismatch(FERRY_ERR_TARGET_MISMATCH, "result tensor", d->th[j], e->hash), "tensor '%s'", e->name);
    return FERRY_OK;
}

typedef struct build_ctx {
    dec *d;
    const ferry__sink *sk;
} build_ctx;

/* Jobs: every chunk, then every other non-removed entry. */
static int build_job(void *ctx, size_t j, int w)
{
    build_ctx *b = ctx;
    dec *d = b->d;
    if (j < d->nch) {
        size_t k;
        int rc = decode_chunk(d, &d->ch[j], w, &k);
        return rc ? rc : sparse_out(d, &d->ch[j], w, k, b->sk, NULL);
    }
    j -= d->nch;
    switch (d->t.e[j].kind) {
    case PK_SAME: return same_out(d, j, w, b->sk);
    case PK_WHOLE: return whole_out(d, j, w, b->sk);
    default: return FERRY_OK;
    }
}

static int sparse_hash_job(void *ctx, size_t j, int w)
{
    (void)w;
    dec *d = ctx;
    return d->t.e[j].kind == PK_SPARSE ? check_sparse(d, j) : FERRY_OK;
}

/* The target's layout (tensors without data, and metadata), for sinks
 * that must know it up front (a file header). */
static int target_layout(const dec *d, ferry_model **out)
{
    ferry_model *m;
    int rc = ferry_model_create(&m);
    for (size_t i = 0; !rc && i < d->t.nmeta; i++) rc = ferry_model_set_metadata(m, d->t.meta_key[i], d->t.meta_val[i]);
    for (size_t j = 0; !rc && j < d->t.n; j++) {
        const patch_entry *e = &d->t.e[j];
        if (e->kind != PK_REMOVED) rc = ferry__model_add_layout(m, e->name, e->dtype, e->ndim, e->shape, e->nbytes);
    }
    if (rc) ferry_model_free(m);
    else *out = m;
    return rc;
}

/* The target's size against the caller's bound, from the table alone. */
static int check_output_bound(const dec *d, uint64_t max)
{
    uint64_t total = 0;
    for (size_t j = 0; max && j < d->t.n; j++)
        if (d->t.e[j].kind != PK_REMOVED && (!ferry__add_u64(total, d->t.e[j].nbytes, &total) || total > max))
            return ferry__fail(FERRY_ERR_LIMIT, "patch: the target model exceeds the bound of %llu bytes (max_output_bytes) "
                               "at tensor '%s'", (unsigned long long)max, d->t.e[j].name);
    return FERRY_OK;
}

int ferry__apply_to(const ferry_model *base, const void *patch, size_t size, const ferry_apply_options *opts,
                    const ferry__sink *sk)
{
    dec d;
    ferry_model *layout = NULL;
    int rc = begin(&d, base, patch, size, opts);
    if (!rc) rc = check_output_bound(&d, opts ? opts->max_output_bytes : 0);
    if (!rc) rc = check_whole_sizes(&d);
    if (!rc) rc = target_layout(&d, &layout);
    if (!rc) rc = sk->begin(sk->ctx, layout, d.threads);
    build_ctx b = {&d, sk};
    if (!rc) rc = ferry__parallel(d.threads, d.nch + d.t.n, build_job, &b);
    if (!rc) rc = ferry__parallel(d.threads, d.t.n, sparse_hash_job, &d);
    if (!rc) rc = check_target(&d);
    ferry_model_free(layout);
    ferry__codec_dec_end(&d);
    return rc;
}

/* Sinks whose pieces are already where they belong. */
static int no_done(void *ctx, size_t i, uint64_t off, size_t len, int w)
{
    (void)ctx, (void)i, (void)off, (void)len, (void)w;
    return FERRY_OK;
}

/* The memory sink: one new buffer per result tensor, handed to a model. */
typedef struct mem_sink {
    ferry_model *m; /* the layout, whose tensors get owned buffers */
    uint8_t **buf;
} mem_sink;

static int mem_begin(void *ctx, const ferry_model *layout, int threads)
{
    (void)threads;
    mem_sink *ms = ctx;
    size_t n = ferry_model_count(layout);
    if (!(ms->buf = ferry__calloc(n + 1, sizeof *ms->buf))) return FERRY_ERR_NOMEM;
    int rc = ferry_model_create(&ms->m);
    for (size_t i = 0; !rc && i < ferry_model_metadata_count(layout); i++) {
        const char *k, *v;
        ferry_model_metadata(layout, i, &k, &v);
        rc = ferry_model_set_metadata(ms->m, k, v);
    }
    for (size_t i = 0; !rc && i < n; i++) {
        const ferry_tensor *t = ferry_model_tensor(layout, i);
        if (!(ms->buf[i] = ferry__malloc((size_t)t->nbytes))) return FERRY_ERR_NOMEM;
        rc = ferry__model_add_owned(ms->m, t->name, t->dtype, t->ndim, t->shape, ms->buf[i], t->nbytes);
    }
    return rc;
}

static uint8_t *mem_piece(void *ctx, size_t i, uint64_t off, size_t len, int w)
{
    (void)len, (void)w;
    return ((mem_sink *)ctx)->buf[i] + off;
}

int ferry_apply_ex(const ferry_model *base, const void *patch, size_t size, const ferry_apply_options *opts,
                   ferry_model **out)
{
    if (!base || !patch || !out) return ferry__fail(FERRY_ERR_ARG, "ferry_apply: NULL argument");
    *out = NULL;
    mem_sink ms = {0};
    ferry__sink sk = {&ms, mem_begin, mem_piece, no_done};
    int rc = ferry__apply_to(base, patch, size, opts, &sk);
    free(ms.buf);
    if (rc) {
        ferry_model_free(ms.m);
        return rc;
    }
    *out = ms.m;
    return FERRY_OK;
}

int ferry_apply(const ferry_model *base, const void *patch, size_t size, ferry_model **out)
{
    return ferry_apply_ex(base, patch, size, NULL, out);
}

/* ---- ferry_apply_inplace: write while verifying (undo log), or verify then write ---- */

/* Pass 1, one job per chunk.  When the undo log has room: write the
 * changes into the base piece by piece, keeping the old words, and hash each
 * piece where it lies (one decode).  Otherwise: hash the result as it will
 * be through a scratch copy, and leave the writing to pass 2. */
static uint8_t *scratch_piece(void *ctx, size_t i, uint64_t off, size_t len, int w)
{
    (void)i, (void)off, (void)len, (void)w;
    return ctx;
}

/* In place, a WHOLE tensor is decoded (and verified) into a buffer of its
 * own; a chunk written with undo is patched where it lies: pieces at ctx +
 * the byte offset in the tensor. */
static uint8_t *whole_piece(void *ctx, size_t i, uint64_t off, size_t len, int w)
{
    (void)i, (void)len, (void)w;
    return (uint8_t *)ctx + off;
}

/* 1 if the undo log has no room for the chunk (deferred to pass 2), else
 * the result of patching it where it lies, keeping what it overwrote. */
static int write_with_undo(dec *d, const chunk_ref *c, int w, size_t k)
{
    unsigned W = sp_dtype_of(d->t.e[c->entry].dtype).W;
    undo *u = &d->undo[c - d->ch];
    size_t nwin = undo_windows(c->n);
    uint64_t bytes = ((nwin + 1) * 4 + (uint64_t)k * (2 + W / 8) + 7) & ~(uint64_t)7;
    uint8_t *mem = NULL;
    if (d->arena) {
        uint64_t at = __atomic_fetch_add(&d->arena_used, bytes, __ATOMIC_RELAXED);
        if (at <= d->arena_size && bytes <= d->arena_size - at) mem = d->arena + at;
    }
    if (!mem) { /* no room: deferred to pass 2, or (keep mode) a buffer of its own */
        if (!d->keep) return 1;
        if (bytes > SIZE_MAX || !(mem = u->own = ferry__malloc((size_t)bytes))) return FERRY_ERR_NOMEM;
    }
    const sp_scratch *s = &d->coder[w].s;
    u->first = (uint32_t *)(void *)mem;
    u->lo = (uint16_t *)(void *)(u->first + nwin + 1);
    u->old = (uint8_t *)(u->lo + k); /* 2-byte aligned: the BF16 path stores uint16_t */
    u->k = k;
    u->nwin = nwin;
    for (size_t h = 0; h <= nwin; h++) { /* positions increase: a binary search per window */
        size_t lo = 0, hi = k;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (s->pos[mid] >> UNDO_WIN_LOG2 < h) lo = mid + 1;
            else hi = mid;
        }
        u->first[h] = (uint32_t)lo;
    }
    ferry__codec_narrow16(u->lo, s->pos, k);
    ferry__sink sk = {(uint8_t *)base_of(d, c->entry)->data, NULL, whole_piece, no_done};
    if (W == 16 && s->have_words) { /* the walk handed out the base words: no second read of them */
        ferry__codec_narrow16((uint16_t *)(void *)u->old, s->word, k);
        return sparse_out(d, c, w, k, &sk, NULL);
    }
    if (d->leaf && d->leaf[c->entry]) {
        /* the leaf path may fail (a base leaf that is not the kept one)
           after it wrote part of the chunk: every old word is kept first,
           so that the roll back puts back exactly the words written */
        const uint8_t *at = sk.ctx;
        for (size_t i = 0; i < k; i++) sp_store(u->old, i, W, sp_load(at, s->pos[i], W));
        return sparse_out(d, c, w, k, &sk, NULL);
    }
    return sparse_out(d, c, w, k, &sk, u->old);
}

int ferry__codec_dec_chunk_job(void *ctx, size_t j, int w)
{
    dec *d = ctx;
    const chunk_ref *c = &d->ch[j];
    size_t k;
    int rc = decode_chunk(d, c, w, &k);
    if (rc) return rc;
    if ((rc = write_with_undo(d, c, w, k)) != 1) return rc;
    if (!d->tmp[w] && !(d->tmp[w] = ferry__malloc(SP_SCAN_PIECE * 8))) return FERRY_ERR_NOMEM;
    ferry__sink sk = {d->tmp[w], NULL, scratch_piece, no_done};
    return sparse_out(d, c, w, k, &sk, NULL);
}

/* The undo log: what the table's change counts need, up to the limit
 * (counts are hostile: saturating sums; without memory, every chunk is
 * simply deferred). */
static void undo_arena(dec *d, uint64_t limit)
{
    if (limit > (uint64_t)1 << 62) limit = (uint64_t)1 << 62;
    uint64_t need = 0; /* saturates at the limit */
    for (size_t j = 0; j < d->t.n && need < limit; j++) {
        const patch_entry *e = &d->t.e[j];
        if (e->kind != PK_SPARSE) continue;
        uint64_t per = 2 + sp_dtype_of(e->dtype).W / 8, chunks = patch_chunks(e);
        uint64_t words = e->nwords < ((uint64_t)1 << e->chunk_log2) ? e->nwords : (uint64_t)1 << e->chunk_log2;
        uint64_t per_chunk = 8 + 4 * ((uint64_t)undo_windows(words) + 1); /* padding, window starts */
        uint64_t pad = chunks > limit / per_chunk ? limit : chunks * per_chunk;
        if (e->changed > limit / per || pad >= limit) need = limit;
        else need += e->changed * per + pad; /* each term < 2 x limit: no overflow */
    }
    uint64_t size = need < limit ? need : limit;
    d->arena_map = 0;
    if (size > 0 && size <= SIZE_MAX && (d->arena = arena_get((size_t)size, &d->arena_map))) {
        d->arena_size = size; /* the budget, whatever the mapping's size */
        return;
    }
    if (size > SIZE_MAX || !(d->arena = ferry__malloc((size_t)size))) size = 0;
    d->arena_size = size;
}

/* Puts back the words of one chunk (at: its first word). */
static void undo_chunk(const undo *u, uint8_t *at, unsigned W)
{
    for (size_t h = 0; h < u->nwin; h++)
        for (size_t i = u->first[h]; i < u->first[h + 1]; i++)
            sp_store(at, (h << UNDO_WIN_LOG2) | u->lo[i], W, sp_load(u->old, i, W));
}

static uint8_t *chunk_at(const dec *d, const chunk_ref *c, unsigned *W)
{
    *W = sp_dtype_of(d->t.e[c->entry].dtype).W;
    return (uint8_t *)base_of(d, c->entry)->data + c->lo * *W / 8;
}

/* Puts back every word pass 1 wrote. */
static void roll_back(dec *d)
{
    for (size_t j = 0; j < d->nch; j++) {
        unsigned W;
        uint8_t *at = chunk_at(d, &d->ch[j], &W);
        if (d->undo[j].first) undo_chunk(&d->undo[j], at, W);
    }
}



int ferry__codec_dec_whole_job(dec *d, size_t j, int w)
{
    int rc = check_whole_size(d, j);
    if (rc) return rc;
    uint8_t *buf = ferry__malloc((size_t)d->t.e[j].nbytes);
    if (!buf) return FERRY_ERR_NOMEM;
    ferry__sink sk = {buf, NULL, whole_piece, no_done};
    if ((rc = whole_out(d, j, w, &sk))) {
        free(buf);
        return rc;
    }
    d->whole[j] = buf;
    return FERRY_OK;
}

/* Jobs j < n: the unchanged and WHOLE entries; then n + j: the SPARSE
 * entries' hashes.  The same order as ferry_apply (which checks the former
 * while it builds), so that both report the same first error. */
static int verify_entry_job(void *ctx, size_t j, int w)
{
    dec *d = ctx;
    if (j >= d->t.n) return d->t.e[j - d->t.n].kind == PK_SPARSE ? check_sparse(d, j - d->t.n) : FERRY_OK;
    switch (d->t.e[j].kind) {
    case PK_SAME: return check_same(d, j);
    case PK_WHOLE: return d->whole[j] ? FERRY_OK /* streamed: done as it arrived */ : ferry__codec_dec_whole_job(d, j, w);
    default: return FERRY_OK;
    }
}

/* Pass 2, for the chunks pass 1 deferred: decoding is deterministic, so it
 * reproduces what pass 1 hashed. */
static int write_job(void *ctx, size_t j, int w)
{
    dec *d = ctx;
    const chunk_ref *c = &d->ch[j];
    if (d->undo[j].first) return FERRY_OK;
    unsigned W = sp_dtype_of(d->t.e[c->entry].dtype).W;
    size_t k;
    int rc = decode_chunk(d, c, w, &k);
    if (!rc) write_changes((uint8_t *)base_of(d, c->entry)->data + c->lo * W / 8, W, &d->coder[w].s, k);
    return rc;
}

static int check_inplace(const dec *d, ferry_model *base)
{
    for (size_t j = 0; j < d->t.n; j++) {
        const patch_entry *e = &d->t.e[j];
        const ferry_tensor *b = d->bi[j] >= 0 ? base_of(d, j) : NULL;
        /* a tensor carried whole because it changed densely keeps its
         * place; one that is new, re-typed or re-shaped does not */
        if (e->kind == PK_REMOVED || (e->kind == PK_WHOLE && (!b || b->dtype != e->dtype || b->ndim != e->ndim ||
                                                              memcmp(b->shape, e->shape, e->ndim * sizeof *e->shape))))
            return ferry__fail(FERRY_ERR_SHAPE_MISMATCH, "tensor '%s' is added, removed or re-shaped: cannot apply in place", e->name);
        if ((e->kind == PK_SPARSE || e->kind == PK_WHOLE) && !base->e[d->bi[j]]->writable)
            return ferry__fail(FERRY_ERR_ARG, "tensor '%s' is read-only (a mapped file): cannot apply in place", e->name);
    }
    if (d->t.nmeta != ferry_model_metadata_count(base)) return ferry__fail(FERRY_ERR_SHAPE_MISMATCH, "metadata changes: cannot apply in place");
    for (size_t i = 0; i < d->t.nmeta; i++) {
        const char *k, *v;
        ferry_model_metadata(base, i, &k, &v);
        if (strcmp(k, d->t.meta_key[i]) || strcmp(v, d->t.meta_val[i]))
            return ferry__fail(FERRY_ERR_SHAPE_MISMATCH, "metadata '%s' changes: cannot apply in place", d->t.meta_key[i]);
    }
    return FERRY_OK;
}

struct ferry__codec_undo {
    size_t n;                /* chunks */
    undo *u;                 /* per chunk: its old words (first NULL: none) */
    uint8_t **at;            /* per chunk: its first word in the model */
    uint8_t *W;              /* per chunk: word width */
    uint8_t *arena;          /* the undo log the chunks point into */
    ferry_model *m;          /* the model written: its digest cache is dropped on revert */
    uint64_t arena_size;
    size_t arena_map;
    size_t nwhole;           /* tensors carried whole: where, old bytes, size */
    uint8_t **whole_at, **whole_old;
    uint64_t *whole_n;
};

/* Exchanges n bytes of a and b (a tensor carried whole and its new bytes:
 * the buffer then holds the old ones, for the undo record). */
static void swap_bytes(uint8_t *a, uint8_t *b, uint64_t n)
{
    uint8_t t[4096];
    for (uint64_t off = 0; off < n; off += sizeof t) {
        size_t k = (size_t)(n - off < sizeof t ? n - off : sizeof t);
        memcpy(t, a + off, k);
        memcpy(a + off, b + off, k);
        memcpy(b + off, t, k);
    }
}

/* The record's arrays, allocated before anything is written (so that
 * handing the record over cannot fail once the model has changed). */
static ferry__codec_undo *undo_record_new(const dec *d)
{
    ferry__codec_undo *r = ferry__calloc(1, sizeof *r);
    if (!r) return NULL;
    for (size_t j = 0; j < d->t.n; j++) r->nwhole += d->t.e[j].kind == PK_WHOLE;
    r->at = ferry__calloc(d->nch_cap + 1, sizeof *r->at);
    r->W = ferry__calloc(d->nch_cap + 1, 1);
    r->whole_at = ferry__calloc(r->nwhole + 1, sizeof *r->whole_at);
    r->whole_old = ferry__calloc(r->nwhole + 1, sizeof *r->whole_old);
    r->whole_n = ferry__calloc(r->nwhole + 1, sizeof *r->whole_n);
    if (!r->at || !r->W || !r->whole_at || !r->whole_old || !r->whole_n) {
        ferry__codec_undo_free(r);
        return NULL;
    }
    r->nwhole = 0;
    return r;
}

/* Moves what the apply overwrote (undo log, chunk buffers, whole tensors'
 * old bytes) from d into r. */
static void undo_record_take(dec *d, ferry__codec_undo *r)
{
    r->n = d->nch;
    r->m = (ferry_model *)d->base;
    r->u = d->undo;
    d->undo = NULL;
    for (size_t j = 0; j < d->nch; j++) {
        unsigned W;
        r->at[j] = chunk_at(d, &d->ch[j], &W);
        r->W[j] = (uint8_t)W;
    }
    r->arena = d->arena;
    r->arena_size = d->arena_size;
    r->arena_map = d->arena_map;
    d->arena = NULL;
    d->arena_map = 0;
    for (size_t j = 0; j < d->t.n; j++)
        if (d->whole[j]) {
            r->whole_at[r->nwhole] = (uint8_t *)base_of(d, j)->data;
            r->whole_old[r->nwhole] = d->whole[j];
            r->whole_n[r->nwhole++] = d->t.e[j].nbytes;
            d->whole[j] = NULL;
        }
}

void ferry__codec_undo_revert(const ferry__codec_undo *r)
{
    if (!r) return;
    if (r->m) ferry__model_cache_drop(r->m, SIZE_MAX);
    for (size_t j = 0; j < r->n; j++)
        if (r->u[j].first) undo_chunk(&r->u[j], r->at[j], r->W[j]);
    for (size_t k = 0; k < r->nwhole; k++) memcpy(r->whole_at[k], r->whole_old[k], (size_t)r->whole_n[k]);
}

void ferry__codec_undo_free(ferry__codec_undo *r)
{
    if (!r) return;
    for (size_t j = 0; r->u && j < r->n; j++) free(r->u[j].own);
    free(r->u);
    arena_put(r->arena, r->arena_map);
    for (size_t k = 0; k < r->nwhole; k++) free(r->whole_old[k]);
    free(r->at);
    free(r->W);
    free(r->whole_at);
    free(r->whole_old);
    free(r->whole_n);
    free(r);
}

void ferry__codec_undo_visit(const ferry__codec_undo *r, ferry__codec_undo_fn fn, void *ctx)
{
    for (size_t j = 0; r && j < r->n; j++)
        for (size_t h = 0; r->u[j].first && h < r->u[j].nwin; h++)
            if (r->u[j].first[h + 1] > r->u[j].first[h])
                fn(ctx, r->at[j], r->W[j], (uint64_t)h << UNDO_WIN_LOG2, r->u[j].lo + r->u[j].first[h],
                   r->u[j].first[h + 1] - r->u[j].first[h]);
    for (size_t k = 0; r && k < r->nwhole; k++) fn(ctx, r->whole_at[k], 0, r->whole_n[k], NULL, 0);
}

/* The model hash from the digest cache, when every tensor has one. */
static bool cached_hash(const ferry_model *m, uint8_t out[16])
{
    for (size_t i = 0; i < m->n; i++)
        if (!m->e[i]->hash_ok) return false;
    uint8_t (*th)[16] = ferry__malloc((m->n + 1) * 16);
    if (!th) return false;
    for (size_t i = 0; i < m->n; i++) memcpy(th[i], m->e[i]->hash, 16);
    int rc = ferry__model_hash_tensors(m, (const uint8_t (*)[16])th, out);
    free(th);
    return rc == FERRY_OK;
}

/* After a verified apply, the model's digest cache describes the result:
 * tensor hashes, and the leaf digests of every SPARSE entry (an unchanged
 * tensor keeps its own; one carried whole has none). */
static void cache_result(dec *d, ferry_model *m)
{
    for (size_t j = 0; j < d->t.n; j++) {
        ferry__entry *x = m->e[d->bi[j]];
        memcpy(x->hash, d->th[j], 16);
        x->hash_ok = true;
        if (d->t.e[j].kind == PK_SAME) continue;
        free(x->leaf);
        x->leaf = NULL;
        if (d->t.e[j].kind == PK_SPARSE) {
            x->leaf = d->blocks[j];
            d->blocks[j] = NULL;
        }
    }
}

bool ferry__codec_dec_cached(ferry_model *base, const ferry_apply_options *opts)
{
    /* A base vouched for whose digest cache gives the same model hash: its
     * touched leaves are checked against the cache, the others reused. */
    uint8_t ch[16];
    if (!opts || !opts->base_hash || !cached_hash(base, ch)) return false;
    if (!memcmp(ch, opts->base_hash, 16)) return true;
    ferry__model_cache_drop(base, SIZE_MAX);
    return false;
}

int ferry__codec_dec_inplace_prepare(dec *d, ferry_model *base, const ferry_apply_options *opts, uint64_t patch_size,
                                     bool cached, ferry__codec_undo **rec)
{
    d->keep = rec != NULL;
    int rc = check_inplace(d, base);
    if (!rc && cached) {
        if (!(d->leaf = ferry__calloc(d->t.n + 1, sizeof *d->leaf))) rc = FERRY_ERR_NOMEM;
        for (size_t j = 0; !rc && j < d->t.n; j++)
            if (d->t.e[j].kind == PK_SPARSE) d->leaf[j] = base->e[d->bi[j]]->leaf;
    }
    if (!rc && (!(d->tmp = ferry__calloc((size_t)d->threads, sizeof *d->tmp)) ||
                !(d->whole = ferry__calloc(d->t.n + 1, sizeof *d->whole)) ||
                !(d->undo = ferry__calloc(d->nch_cap + 1, sizeof *d->undo)) || (rec && !(*rec = undo_record_new(d)))))
        rc = FERRY_ERR_NOMEM;
    if (!rc)
        undo_arena(d, opts && opts->undo_limit ? opts->undo_limit : undo_limit_default(patch_size, ferry_model_nbytes(base)));
    return rc;
}

int ferry__codec_dec_inplace_finish(dec *d, ferry_model *base, int rc, ferry__codec_undo **keep, ferry__codec_undo **rec)
{
    if (!rc) rc = ferry__parallel(d->threads, 2 * d->t.n, verify_entry_job, d);
    if (!rc) rc = check_target(d);
    if (rc && d->undo) roll_back(d);
    if (!rc) rc = ferry__parallel(d->threads, d->nch, write_job, d);
    for (size_t j = 0; !rc && j < d->t.n; j++) {
        if (!d->whole[j]) continue;
        uint8_t *dst = ferry_model_data_mut(base, (size_t)d->bi[j]);
        if (keep) swap_bytes(dst, d->whole[j], d->t.e[j].nbytes);
        else memcpy(dst, d->whole[j], (size_t)d->t.e[j].nbytes);
    }
    if (!rc) cache_result(d, base);
    else if (rc == FERRY_ERR_BASE_MISMATCH) ferry__model_cache_drop(base, SIZE_MAX);
    if (!rc && keep) {
        undo_record_take(d, *rec);
        *keep = *rec;
        *rec = NULL;
    }
    ferry__codec_undo_free(*rec);
    *rec = NULL;
    return rc;
}

static int apply_inplace(ferry_model *base, const void *patch, size_t size, const ferry_apply_options *opts, ferry__codec_undo **keep)
{
    if (keep) *keep = NULL;
    if (!base || !patch) return ferry__fail(FERRY_ERR_ARG, "ferry_apply_inplace: NULL argument");
    dec d;
    ferry__codec_undo *rec = NULL;
    bool cached = ferry__codec_dec_cached(base, opts);
    int rc = begin(&d, base, patch, size, opts);
    if (!rc) rc = ferry__codec_dec_inplace_prepare(&d, base, opts, size, cached, keep ? &rec : NULL);
    /* a WHOLE payload's size is checked before the first word is written */
    if (!rc) rc = check_whole_sizes(&d);
    if (!rc) rc = ferry__parallel(d.threads, d.nch, ferry__codec_dec_chunk_job, &d);
    rc = ferry__codec_dec_inplace_finish(&d, base, rc, keep, &rec);
    ferry__codec_dec_end(&d);
    return rc;
}

int ferry_apply_inplace_ex(ferry_model *base, const void *patch, size_t size, const ferry_apply_options *opts)
{
    return apply_inplace(base, patch, size, opts, NULL);
}

int ferry__codec_apply_inplace_undo(ferry_model *base, const void *patch, size_t size, const ferry_apply_options *opts,
                                    ferry__codec_undo **record)
{
    return apply_inplace(base, patch, size, opts, record);
}

int ferry_apply_inplace(ferry_model *base, const void *patch, size_t size)
{
    return ferry_apply_inplace_ex(base, patch, size, NULL);
}
