/* The tile grid of sharded versions, and the tiles a rank holds.
 *
 * Why this grid: engines split a dimension by their tensor-parallel degree
 * M (2, 3, 4, 8, ...).  Block counts from the list below are divisible by
 * as many of those as possible (24 by 2, 3, 4, 6, 8, 12; 32 by 2, 4, 8 and
 * the 64-multiples vLLM pads vocabularies to), so an engine's split falls
 * on tile edges whenever the dimension allows, and an island rank fetches
 * exactly its share.  min_tile_words keeps tiles large enough that the
 * per-tile patch header stays small against the data. */
#include "shard_impl.h"

#include <stdlib.h>

static const uint64_t k_pref[] = {24, 32, 12, 16, 8, 6, 4, 3, 2, 1};

bool ferry__shard_view(uint32_t ndim, const uint64_t *shape, uint64_t *rows, uint64_t *cols)
{
    uint64_t c = 1;
    for (uint32_t i = 1; i < ndim; i++)
        if (!ferry__mul_u64(c, shape[i], &c)) return false;
    *rows = ndim ? shape[0] : 1;
    *cols = ndim ? c : 1;
    return true;
}

/* The first block count of the list that divides n and keeps a tile of
 * (n / b) x other >= words; 1 if none does. */
static uint64_t blocks(uint64_t n, uint64_t other, uint64_t words)
{
    for (size_t i = 0; i < sizeof k_pref / sizeof k_pref[0]; i++) {
        uint64_t b = k_pref[i], w;
        if (n % b || !ferry__mul_u64(n / b, other, &w)) continue;
        if (w >= words) return b;
    }
    return 1;
}

void ferry__shard_grid(uint64_t rows, uint64_t cols, uint64_t tile_words, uint64_t *nr, uint64_t *nc)
{
    *nc = cols > 1 ? blocks(cols, rows, tile_words) : 1;
    *nr = rows > 1 ? blocks(rows, cols / *nc, tile_words) : 1;
}

int ferry__shard_part_cut(sh_part *p, uint64_t tile_words)
{
    uint64_t nr, nc;
    ferry__shard_grid(p->rows, p->cols, tile_words, &nr, &nc);
    uint64_t rstep = p->rows / nr, cstep = p->cols / nc;
    /* row cuts: the part's edges and the grid's lines inside it */
    uint64_t first = p->r0 / rstep + 1, last = (p->r1 - 1) / rstep; /* grid lines strictly inside */
    uint64_t inner = last >= first ? last - first + 1 : 0;
    if (inner + 2 > SH_CUTS_MAX || nc + 1 > SH_CUTS_MAX)
        return ferry__fail(FERRY_ERR_LIMIT, "tensor '%s': more than %d tiles along a dimension", p->name, SH_CUTS_MAX);
    p->nrc = (uint32_t)(inner + 2);
    p->ncc = (uint32_t)(nc + 1);
    p->rcut = ferry__calloc(p->nrc, sizeof *p->rcut);
    p->ccut = ferry__calloc(p->ncc, sizeof *p->ccut);
    p->ntiles = (size_t)(p->nrc - 1) * (p->ncc - 1);
    p->tiles = ferry__calloc(p->ntiles, sizeof *p->tiles);
    if (!p->rcut || !p->ccut || !p->tiles) return FERRY_ERR_NOMEM;
    p->rcut[0] = p->r0;
    for (uint64_t i = 0; i < inner; i++) p->rcut[1 + i] = (first + i) * rstep;
    p->rcut[p->nrc - 1] = p->r1;
    for (uint64_t j = 0; j <= nc; j++) p->ccut[j] = j * cstep;
    for (uint32_t i = 0; i + 1 < p->nrc; i++)
        for (uint32_t j = 0; j + 1 < p->ncc; j++) {
            sh_tile *t = &p->tiles[(size_t)i * (p->ncc - 1) + j];
            t->r0 = p->rcut[i];
            t->r1 = p->rcut[i + 1];
            t->c0 = p->ccut[j];
            t->c1 = p->ccut[j + 1];
        }
    return FERRY_OK;
}

void ferry__shard_part_release(sh_part *p)
{
    free(p->name);
    free(p->rcut);
    free(p->ccut);
    free(p->tiles);
    memset(p, 0, sizeof *p);
}

void ferry__shard_doc_release(sh_doc *d)
{
    for (size_t i = 0; i < d->nparts; i++) ferry__shard_part_release(&d->parts[i]);
    free(d->parts);
    free(d->obj_bytes);
    free(d->obj_index);
    free(d->obj_tiles);
    free(d->obj_root);
    d->parts = NULL;
    d->obj_bytes = d->obj_index = d->obj_tiles = NULL;
    d->obj_root = NULL;
    d->nparts = 0;
}

size_t ferry__shard_esize(ferry_dtype dt)
{
    unsigned b = ferry_dtype_bits(dt);
    return b && b % 8 == 0 ? b / 8 : 0;
}

void ferry__shard_gather(void *dst, const void *src, uint64_t row0, uint64_t cols, size_t es, uint64_t r0, uint64_t r1, uint64_t c0,
               uint64_t c1)
{
    size_t w = (size_t)(c1 - c0) * es;
    uint8_t *d = dst;
    for (uint64_t r = r0; r < r1; r++, d += w) memcpy(d, (const uint8_t *)src + ((r - row0) * cols + c0) * es, w);
}

int ferry__shard_hash(const sh_doc *m, uint8_t out[16])
{
    size_t n = 0;
    for (size_t i = 0; i < m->nparts; i++) n += m->parts[i].ntiles;
    uint8_t *buf = ferry__malloc(n * 16 + 1);
    if (!buf) return FERRY_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < m->nparts; i++)
        for (size_t j = 0; j < m->parts[i].ntiles; j++) memcpy(buf + 16 * k++, m->parts[i].tiles[j].target, 16);
    uint8_t d[32];
    int rc = ferry__sha256(buf, n * 16, d);
    free(buf);
    if (!rc) memcpy(out, d, 16);
    return rc;
}

/* ---- held tiles ---- */

static int cmp_held(const sh_held *a, const char *name, uint64_t r0, uint64_t c0)
{
    int c = strcmp(a->name, name);
    if (c) return c;
    if (a->r0 != r0) return a->r0 < r0 ? -1 : 1;
    if (a->c0 != c0) return a->c0 < c0 ? -1 : 1;
    return 0;
}

sh_held *ferry__shard_tiles_find(const sh_tileset *s, const char *name, uint64_t r0, uint64_t c0)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = cmp_held(&s->t[mid], name, r0, c0);
        if (!c) return &s->t[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

int ferry__shard_tiles_add(sh_tileset *s, const char *name, const sh_tile *t, ferry_model *m)
{
    if (ferry__grow((void **)&s->t, &s->cap, s->n + 1, sizeof *s->t)) return FERRY_ERR_NOMEM;
    sh_held *h = &s->t[s->n];
    memset(h, 0, sizeof *h);
    if (!(h->name = ferry__strdup(name))) return FERRY_ERR_NOMEM;
    h->r0 = t->r0;
    h->r1 = t->r1;
    h->c0 = t->c0;
    h->c1 = t->c1;
    h->m = m;
    memcpy(h->hash, t->target, 16);
    s->n++;
    return FERRY_OK;
}

static int qcmp(const void *a, const void *b)
{
    const sh_held *y = b;
    return cmp_held(a, y->name, y->r0, y->c0);
}

void ferry__shard_tiles_sort(sh_tileset *s)
{
    if (s->n) qsort(s->t, s->n, sizeof *s->t, qcmp);
}

void ferry__shard_tiles_release(sh_tileset *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->t[i].name);
        free(s->t[i].changed);
        ferry_model_free(s->t[i].m);
    }
    free(s->t);
    memset(s, 0, sizeof *s);
}

int ferry__shard_tile_model(const char *name, ferry_dtype dt, uint64_t rows, uint64_t cols, const void *data, unsigned flags,
                  ferry_model **out)
{
    uint64_t shape[2] = {rows, cols};
    ferry_model *m = NULL;
    int rc = ferry_model_create(&m);
    if (!rc) rc = ferry_model_add(m, name, dt, 2, shape, data, rows * cols * ferry__shard_esize(dt), flags);
    if (rc) {
        ferry_model_free(m);
        return rc;
    }
    *out = m;
    return FERRY_OK;
}
