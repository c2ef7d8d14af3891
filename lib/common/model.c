/* In-memory models: sorted named tensors, metadata, hashing. */
#include "model.h"
#include "parallel.h"

#include <stdlib.h>
#include <sys/mman.h>

int ferry_model_create(ferry_model **out)
{
    if (!out) return ferry__fail(FERRY_ERR_ARG, "ferry_model_create: out is NULL");
    *out = ferry__calloc(1, sizeof **out);
    return *out ? FERRY_OK : FERRY_ERR_NOMEM;
}

void ferry_model_free(ferry_model *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->n; i++) {
        free(m->e[i]->owned);
        free(m->e[i]->leaf);
        free(m->e[i]);
    }
    free(m->e);
    for (size_t i = 0; i < m->nmeta; i++) {
        free(m->meta[i].key);
        free(m->meta[i].value);
    }
    free(m->meta);
    for (size_t i = 0; i < m->nmaps; i++) munmap(m->maps[i].addr, m->maps[i].len);
    free(m->maps);
    free(m);
}

bool ferry__tensor_size(ferry_dtype dt, uint32_t ndim, const uint64_t *shape,
                        uint64_t *nelem, uint64_t *nbytes)
{
    uint64_t n = 1, bits;
    for (uint32_t i = 0; i < ndim; i++)
        if (!ferry__mul_u64(n, shape[i], &n)) return false;
    if (!ferry__mul_u64(n, ferry_dtype_bits(dt), &bits) || bits % 8) return false;
    *nelem = n;
    *nbytes = bits / 8;
    return true;
}

long ferry__model_lookup(const ferry_model *m, const char *name)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->e[mid]->t.name, name);
        if (c == 0) return (long)mid;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return -(long)lo - 1;
}

int ferry__model_add(ferry_model *m, const char *name, ferry_dtype dt, uint32_t ndim,
                     const uint64_t *shape, const void *data, uint64_t nbytes,
                     bool copy, bool writable)
{
    if (!m || !name || (ndim && !shape) || (nbytes && !data && (copy || writable)))
        return ferry__fail(FERRY_ERR_ARG, "ferry_model_add: NULL argument");
    size_t len = strlen(name);
    if (len == 0 || len > FERRY_MAX_NAME)
        return ferry__fail(FERRY_ERR_ARG, "tensor name length %zu not in 1..%d", len, FERRY_MAX_NAME);
    if ((unsigned)dt >= FERRY_DTYPE_COUNT)
        return ferry__fail(FERRY_ERR_ARG, "tensor '%s': invalid dtype %d", name, (int)dt);
    if (ndim > FERRY_MAX_DIMS)
        return ferry__fail(FERRY_ERR_ARG, "tensor '%s': %u dims > %d", name, ndim, FERRY_MAX_DIMS);
    uint64_t nelem, want;
    if (!ferry__tensor_size(dt, ndim, shape, &nelem, &want))
        return ferry__fail(FERRY_ERR_ARG, "tensor '%s': element count overflows or is not byte-aligned", name);
    if (want != nbytes)
        return ferry__fail(FERRY_ERR_ARG, "tensor '%s': %llu bytes given, shape needs %llu", name,
                           (unsigned long long)nbytes, (unsigned long long)want);
    long at = ferry__model_lookup(m, name);
    if (at >= 0) return ferry__fail(FERRY_ERR_ARG, "tensor '%s' already in model", name);
    size_t pos = (size_t)(-at - 1);
    if (copy && nbytes > SIZE_MAX) return ferry__fail(FERRY_ERR_NOMEM, "tensor '%s' too large", name);

    /* One allocation for the entry, its shape and its name. */
    size_t sz = sizeof(ferry__entry) + ndim * sizeof(uint64_t) + len + 1;
    ferry__entry *e = ferry__calloc(1, sz);
    if (!e) return FERRY_ERR_NOMEM;
    uint64_t *sh = (uint64_t *)(e + 1);
    char *nm = (char *)(sh + ndim);
    if (ndim) memcpy(sh, shape, ndim * sizeof(uint64_t));
    memcpy(nm, name, len + 1);
    e->t = (ferry_tensor){.name = nm, .dtype = dt, .ndim = ndim, .shape = sh,
                          .nelem = nelem, .nbytes = nbytes, .data = data};
    e->writable = writable;
    if (copy) {
        e->owned = ferry__malloc((size_t)nbytes);
        if (!e->owned) { free(e); return FERRY_ERR_NOMEM; }
        if (nbytes) memcpy(e->owned, data, (size_t)nbytes);
        e->t.data = e->owned;
        e->writable = true;
    }
    if (ferry__grow((void **)&m->e, &m->cap, m->n + 1, sizeof *m->e)) { free(e->owned); free(e); return FERRY_ERR_NOMEM; }
    memmove(m->e + pos + 1, m->e + pos, (m->n - pos) * sizeof *m->e);
    m->e[pos] = e;
    m->n++;
    return FERRY_OK;
}

int ferry_model_add(ferry_model *m, const char *name, ferry_dtype dt, uint32_t ndim,
                    const uint64_t *shape, const void *data, uint64_t nbytes, unsigned flags)
{
    if (flags & ~FERRY_ADD_BORROW) return ferry__fail(FERRY_ERR_ARG, "ferry_model_add: unknown flags 0x%x", flags);
    bool borrow = flags & FERRY_ADD_BORROW;
    return ferry__model_add(m, name, dt, ndim, shape, data, nbytes, !borrow, true);
}

int ferry__model_add_owned(ferry_model *m, const char *name, ferry_dtype dt, uint32_t ndim,
                           const uint64_t *shape, void *buf, uint64_t nbytes)
{
    int rc = ferry__model_add(m, name, dt, ndim, shape, buf, nbytes, false, true);
    if (rc) {
        free(buf);
        return rc;
    }
    m->e[ferry__model_lookup(m, name)]->owned = buf;
    return FERRY_OK;
}

int ferry__model_add_layout(ferry_model *m, const char *name, ferry_dtype dt, uint32_t ndim,
                            const uint64_t *shape, uint64_t nbytes)
{
    return ferry__model_add(m, name, dt, ndim, shape, NULL, nbytes, false, false);
}

int ferry__model_add_mapping(ferry_model *m, void *addr, size_t len)
{
    ferry__mapping *nm = ferry__realloc(m->maps, (m->nmaps + 1) * sizeof *nm);
    if (!nm) return FERRY_ERR_NOMEM;
    m->maps = nm;
    m->maps[m->nmaps++] = (ferry__mapping){addr, len};
    return FERRY_OK;
}

/* First metadata index whose key is >= key (binary search: a hostile
 * header may carry very many entries, and a linear scan per insertion
 * would make loading it quadratic). */
static size_t meta_lower_bound(const ferry_model *m, const char *key)
{
    size_t lo = 0, hi = m->nmeta;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(m->meta[mid].key, key) < 0) lo = mid + 1; else hi = mid;
    }
    return lo;
}

int ferry_model_set_metadata(ferry_model *m, const char *key, const char *value)
{
    if (!m || !key || !value) return ferry__fail(FERRY_ERR_ARG, "ferry_model_set_metadata: NULL argument");
    size_t i = meta_lower_bound(m, key);
    char *v = ferry__strdup(value);
    if (!v) return FERRY_ERR_NOMEM;
    if (i < m->nmeta && strcmp(m->meta[i].key, key) == 0) {
        free(m->meta[i].value);
        m->meta[i].value = v;
        return FERRY_OK;
    }
    char *k = ferry__strdup(key);
    if (!k) { free(v); return FERRY_ERR_NOMEM; }
    if (ferry__grow((void **)&m->meta, &m->capmeta, m->nmeta + 1, sizeof *m->meta)) { free(k); free(v); return FERRY_ERR_NOMEM; }
    memmove(m->meta + i + 1, m->meta + i, (m->nmeta - i) * sizeof *m->meta);
    m->meta[i] = (ferry__meta){k, v};
    m->nmeta++;
    return FERRY_OK;
}

size_t ferry_model_count(const ferry_model *m) { return m ? m->n : 0; }

const ferry_tensor *ferry_model_tensor(const ferry_model *m, size_t i)
{
    return m && i < m->n ? &m->e[i]->t : NULL;
}

const ferry_tensor *ferry_model_find(const ferry_model *m, const char *name)
{
    if (!m || !name) return NULL;
    long at = ferry__model_lookup(m, name);
    return at >= 0 ? &m->e[at]->t : NULL;
}

void ferry__model_cache_drop(ferry_model *m, size_t i)
{
    for (size_t j = i < m->n ? i : 0; j < m->n && (i >= m->n || j == i); j++) {
        m->e[j]->hash_ok = false;
        free(m->e[j]->leaf);
        m->e[j]->leaf = NULL;
    }
}

void *ferry_model_data_mut(ferry_model *m, size_t i)
{
    if (!m || i >= m->n || !m->e[i]->writable) return NULL;
    ferry__model_cache_drop(m, i); /* the caller may write: cached digests no longer vouched for */
    return (void *)m->e[i]->t.data;
}

size_t ferry_model_metadata_count(const ferry_model *m) { return m ? m->nmeta : 0; }

int ferry_model_metadata(const ferry_model *m, size_t i, const char **key, const char **value)
{
    if (!m || i >= m->nmeta) return ferry__fail(FERRY_ERR_ARG, "metadata index out of range");
    if (key) *key = m->meta[i].key;
    if (value) *value = m->meta[i].value;
    return FERRY_OK;
}

const char *ferry_model_metadata_get(const ferry_model *m, const char *key)
{
    if (!m || !key) return NULL;
    size_t i = meta_lower_bound(m, key);
    return i < m->nmeta && strcmp(m->meta[i].key, key) == 0 ? m->meta[i].value : NULL;
}

uint64_t ferry_model_nbytes(const ferry_model *m)
{
    uint64_t s = 0;
    for (size_t i = 0; m && i < m->n; i++) s += m->e[i]->t.nbytes;
    return s;
}

/* Tensor hash (docs/FORMAT.md, "Hashes"): XXH3-128 of
 *   u32 name_len, name, u8 dtype_len, dtype name, u32 ndim, u64 shape[ndim],
 *   u64 nbytes, then the XXH3-128 digest of each FERRY_HASH_BLOCK bytes of
 *   data in order (the last block may be shorter)
 * (integers little-endian).  Hashing blocks apart lets any number of
 * threads hash one tensor, and lets the codec hash each chunk while it is
 * still in cache. */
void ferry__tensor_hash_begin(XXH3_state_t *st, const char *name, ferry_dtype dt, uint32_t ndim,
                              const uint64_t *shape, uint64_t nbytes)
{
    XXH3_128bits_reset(st);
    uint8_t tmp[8];
    uint32_t nl = (uint32_t)strlen(name);
    const char *dn = ferry_dtype_name(dt);
    uint8_t dl = (uint8_t)strlen(dn);
    ferry__put32(tmp, nl);
    XXH3_128bits_update(st, tmp, 4);
    XXH3_128bits_update(st, name, nl);
    XXH3_128bits_update(st, &dl, 1);
    XXH3_128bits_update(st, dn, dl);
    ferry__put32(tmp, ndim);
    XXH3_128bits_update(st, tmp, 4);
    for (uint32_t i = 0; i < ndim; i++) {
        ferry__put64(tmp, shape[i]);
        XXH3_128bits_update(st, tmp, 8);
    }
    ferry__put64(tmp, nbytes);
    XXH3_128bits_update(st, tmp, 8);
}

void ferry__hash_digest(XXH3_state_t *st, uint8_t out[16])
{
    XXH128_canonicalFromHash((XXH128_canonical_t *)out, XXH3_128bits_digest(st));
}

void ferry__block_hash(const void *data, size_t n, uint8_t out[16])
{
    XXH128_canonicalFromHash((XXH128_canonical_t *)out, XXH3_128bits(data, n));
}

void ferry__bh_begin(ferry__blockhash *h, uint8_t (*out)[16])
{
    XXH3_128bits_reset(&h->st);
    h->in_block = 0;
    h->out = out;
}

void ferry__bh_feed(ferry__blockhash *h, const void *p, size_t n)
{
    XXH3_128bits_update(&h->st, p, n);
    h->in_block += n;
    if (h->in_block == FERRY_HASH_BLOCK) {
        ferry__hash_digest(&h->st, *h->out++);
        XXH3_128bits_reset(&h->st);
        h->in_block = 0;
    }
}

void ferry__bh_end(ferry__blockhash *h)
{
    if (h->in_block) ferry__hash_digest(&h->st, *h->out++);
    h->in_block = 0;
}

void ferry__tensor_hash_blocks(const char *name, ferry_dtype dt, uint32_t ndim, const uint64_t *shape, uint64_t nbytes,
                               const uint8_t (*blocks)[16], uint8_t out[16])
{
    XXH3_state_t st;
    ferry__tensor_hash_begin(&st, name, dt, ndim, shape, nbytes);
    XXH3_128bits_update(&st, blocks, (size_t)ferry__hash_nblocks(nbytes) * 16);
    ferry__hash_digest(&st, out);
}

void ferry__tensor_hash_parts(const char *name, ferry_dtype dt, uint32_t ndim, const uint64_t *shape,
                              const void *data, uint64_t nbytes, uint8_t out[16])
{
    XXH3_state_t st;
    ferry__tensor_hash_begin(&st, name, dt, ndim, shape, nbytes);
    for (uint64_t off = 0; off < nbytes; off += FERRY_HASH_BLOCK) {
        uint8_t d[16];
        uint64_t n = nbytes - off < FERRY_HASH_BLOCK ? nbytes - off : FERRY_HASH_BLOCK;
        ferry__block_hash((const uint8_t *)data + off, (size_t)n, d);
        XXH3_128bits_update(&st, d, 16);
    }
    ferry__hash_digest(&st, out);
}

void ferry_tensor_hash(const ferry_tensor *t, uint8_t out[16])
{
    ferry__tensor_hash_parts(t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, out);
}

/* Model hash from per-tensor hashes (given in name order):
 *   "ferry-model-1", u64 ntensors, tensor hashes,
 *   u64 nmeta, per entry (key order) u64 key_len, key, u64 value_len, value. */
void ferry__model_hash_from(const uint8_t (*th)[16], size_t n, size_t nmeta, const char *const *keys,
                            const char *const *vals, uint8_t out[16])
{
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    uint8_t tmp[8];
    XXH3_128bits_update(&st, "ferry-model-1", 13);
    ferry__put64(tmp, n);
    XXH3_128bits_update(&st, tmp, 8);
    XXH3_128bits_update(&st, th, n * 16);
    ferry__put64(tmp, nmeta);
    XXH3_128bits_update(&st, tmp, 8);
    for (size_t i = 0; i < nmeta; i++) {
        const char *s[2] = {keys[i], vals[i]};
        for (int j = 0; j < 2; j++) {
            size_t l = strlen(s[j]);
            ferry__put64(tmp, l);
            XXH3_128bits_update(&st, tmp, 8);
            XXH3_128bits_update(&st, s[j], l);
        }
    }
    ferry__hash_digest(&st, out);
}

int ferry__model_hash_tensors(const ferry_model *m, const uint8_t (*th)[16], uint8_t out[16])
{
    const char **kv = ferry__malloc((m->nmeta ? m->nmeta : 1) * 2 * sizeof *kv);
    if (!kv) return FERRY_ERR_NOMEM;
    for (size_t i = 0; i < m->nmeta; i++) {
        kv[i] = m->meta[i].key;
        kv[m->nmeta + i] = m->meta[i].value;
    }
    ferry__model_hash_from(th, m->n, m->nmeta, kv, kv + m->nmeta, out);
    free(kv);
    return FERRY_OK;
}

int ferry_model_hash(const ferry_model *m, uint8_t out[16])
{
    if (!m || !out) return ferry__fail(FERRY_ERR_ARG, "ferry_model_hash: NULL argument");
    uint8_t (*th)[16] = ferry__malloc((m->n ? m->n : 1) * 16);
    if (!th) return FERRY_ERR_NOMEM;
    int rc = ferry__hash_tensors_mt(m, 1, th);
    if (!rc) rc = ferry__model_hash_tensors(m, (const uint8_t (*)[16])th, out);
    free(th);
    return rc;
}

/* Parallel tensor hashes: one job per block of every tensor. */
typedef struct hash_mt {
    const ferry_model *m;
    uint64_t *first;      /* tensor i's blocks are jobs first[i] .. first[i+1]-1 */
    uint8_t (*blocks)[16];
} hash_mt;

static int hash_block_job(void *ctx, size_t j, int w)
{
    (void)w;
    hash_mt *h = ctx;
    size_t lo = 0, hi = h->m->n; /* find the tensor of job j */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (h->first[mid] <= j) lo = mid; else hi = mid;
    }
    const ferry_tensor *t = &h->m->e[lo]->t;
    uint64_t off = (j - h->first[lo]) * FERRY_HASH_BLOCK, n = t->nbytes - off;
    ferry__block_hash((const uint8_t *)t->data + off, (size_t)(n < FERRY_HASH_BLOCK ? n : FERRY_HASH_BLOCK), h->blocks[j]);
    return FERRY_OK;
}

int ferry__hash_tensors_mt(const ferry_model *m, int threads, uint8_t (*th)[16])
{
    hash_mt h = {.m = m};
    h.first = ferry__malloc((m->n + 1) * sizeof *h.first);
    if (!h.first) return FERRY_ERR_NOMEM;
    uint64_t nb = 0;
    for (size_t i = 0; i < m->n; i++) {
        h.first[i] = nb;
        nb += ferry__hash_nblocks(m->e[i]->t.nbytes);
    }
    h.first[m->n] = nb;
    int rc = FERRY_OK;
    if (nb > SIZE_MAX / 16 || !(h.blocks = ferry__malloc((size_t)(nb + 1) * 16))) rc = FERRY_ERR_NOMEM;
    if (!rc) rc = ferry__parallel(threads, (size_t)nb, hash_block_job, &h);
    for (size_t i = 0; !rc && i < m->n; i++) {
        const ferry_tensor *t = &m->e[i]->t;
        ferry__tensor_hash_blocks(t->name, t->dtype, t->ndim, t->shape, t->nbytes,
                                  (const uint8_t (*)[16])h.blocks + h.first[i], th[i]);
    }
    free(h.first);
    free(h.blocks);
    return rc;
}
