/* Island ranks that keep their slices between processes
 * (include/ferry_shard_state.h): a handle given back the regions it held
 * at a version, checked tile by tile against that version's manifest, and
 * the tensor list of a sharded run (a whole-model island: `ferry pull` of
 * a sharded run into one file). */
#include "shard_impl.h"
#include "ferry_shard_state.h"

#include <stdlib.h>

void ferry_shard_subscriber_held_id(const ferry_shard_subscriber *s, char id[FERRY_SYNC_ID_LEN + 1])
{
    id[0] = 0;
    if (!s) return;
    ferry_store *st;
    const char *run;
    const ferry_keys *keys;
    size_t n;
    /* read only: the accessor takes the handle as the library's own code does */
    const sh_tileset *held = ferry__shard_sub_inner((ferry_shard_subscriber *)s, &st, &run, &keys, &n);
    if (held->version) snprintf(id, FERRY_SYNC_ID_LEN + 1, "%s", held->id);
}

static bool id_ok(const char *id)
{
    size_t n = id ? strlen(id) : 0;
    if (!n || n > FERRY_SYNC_ID_LEN) return false;
    for (size_t i = 0; i < n; i++)
        if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f'))) return false;
    return true;
}

/* The part of tensor `name` holding row r0, or NULL (parts are sorted by
 * name, then first row). */
static const sh_part *part_of(const sh_doc *m, const char *name, uint64_t r0)
{
    for (size_t i = 0; i < m->nparts; i++)
        if (!strcmp(m->parts[i].name, name) && r0 >= m->parts[i].r0 && r0 < m->parts[i].r1) return &m->parts[i];
    return NULL;
}

/* Builds tile t of tensor `name` from the one region wholly holding it. */
static int rebuild(ferry_shard_subscriber *s, size_t nrg, const void *const *data, const char *name, const sh_part *p,
                   const sh_tile *t, const sh_doc *m, sh_tileset *out)
{
    size_t es = ferry__shard_esize(p->dtype);
    for (size_t i = 0; i < nrg; i++) {
        const ferry_shard_region *g = ferry__shard_sub_region(s, i);
        if (strcmp(g->name, name) || t->r0 < g->row_begin || t->r1 > g->row_end || t->c0 < g->col_begin || t->c1 > g->col_end)
            continue;
        uint64_t tr = t->r1 - t->r0, tc = t->c1 - t->c0;
        uint8_t *buf = ferry__malloc((size_t)(tr * tc) * es + 1);
        if (!buf) return FERRY_ERR_NOMEM;
        ferry__shard_gather(buf, data[i], g->row_begin, g->col_end - g->col_begin, es, t->r0, t->r1, t->c0 - g->col_begin,
                            t->c1 - g->col_begin);
        ferry_model *tm = NULL;
        int rc = ferry__shard_tile_model(name, p->dtype, tr, tc, buf, FERRY_ADD_COPY, &tm);
        free(buf);
        uint8_t h[16];
        if (!rc && !(rc = ferry_model_hash(tm, h)) && memcmp(h, t->target, 16))
            rc = ferry__fail(FERRY_ERR_SYNC_CORRUPT, "tile [%llu:%llu, %llu:%llu] of '%s' does not hash to version %llu's (%s): the "
                             "data given are not that version's", (unsigned long long)t->r0, (unsigned long long)t->r1,
                             (unsigned long long)t->c0, (unsigned long long)t->c1, name, (unsigned long long)m->version, m->id);
        if (!rc && (rc = ferry__shard_tiles_add(out, name, t, tm))) ferry_model_free(tm);
        else if (rc) ferry_model_free(tm);
        return rc;
    }
    return ferry__fail(FERRY_ERR_SHARD_REGION, "tile [%llu:%llu, %llu:%llu] of '%s' reaches outside the regions: only regions on "
                       "tile edges can be resumed", (unsigned long long)t->r0, (unsigned long long)t->r1, (unsigned long long)t->c0,
                       (unsigned long long)t->c1, name);
}

int ferry_shard_subscriber_resume(ferry_shard_subscriber *s, uint64_t version, const char *id, const void *const *data,
                                  const size_t *sizes, uint64_t *manifest_bytes)
{
    if (manifest_bytes) *manifest_bytes = 0;
    if (!s || !data || !sizes) return ferry__fail(FERRY_ERR_ARG, "ferry_shard_subscriber_resume: NULL argument");
    ferry_store *st;
    const char *run;
    const ferry_keys *keys;
    size_t nrg;
    sh_tileset *held = ferry__shard_sub_inner(s, &st, &run, &keys, &nrg);
    if (held->version || held->n) return ferry__fail(FERRY_ERR_ARG, "ferry_shard_subscriber_resume: the handle holds version %llu already",
                                                     (unsigned long long)held->version);
    if (!version || !id_ok(id)) return ferry__fail(FERRY_ERR_ARG, "ferry_shard_subscriber_resume: no version or a malformed id");
    sh_doc m;
    fs_count cnt = {0};
    int rc = ferry__shard_manifest_read(st, run, keys, version, id, &cnt, &m);
    if (manifest_bytes) *manifest_bytes = cnt.bytes;
    if (rc == FERRY_ERR_STORE_NOT_FOUND)
        return ferry__fail(FERRY_ERR_SYNC_GONE, "run %s: the manifest of version %llu (%s) is gone", run, (unsigned long long)version, id);
    if (rc) return ferry__context(rc, "run %s: resuming at version %llu", run, (unsigned long long)version);
    sh_tileset out = {0};
    if ((rc = ferry__shard_sub_resolve(s, &m))) goto done;
    for (size_t i = 0; i < nrg && !rc; i++) { /* sizes first: nothing is read past a short buffer */
        const ferry_shard_region *g = ferry__shard_sub_region(s, i);
        const sh_part *p = part_of(&m, g->name, g->row_begin);
        uint64_t want = (g->row_end - g->row_begin) * (g->col_end - g->col_begin) * ferry__shard_esize(p->dtype);
        if (!data[i] || sizes[i] != want)
            rc = ferry__fail(FERRY_ERR_ARG, "ferry_shard_subscriber_resume: region %zu ('%s'): %zu bytes given, the region is %llu", i,
                             g->name, sizes[i], (unsigned long long)want);
    }
    for (size_t i = 0; i < nrg && !rc; i++) {
        const ferry_shard_region *g = ferry__shard_sub_region(s, i);
        for (size_t j = 0; j < m.nparts && !rc; j++) {
            const sh_part *p = &m.parts[j];
            if (strcmp(p->name, g->name) || p->r1 <= g->row_begin || p->r0 >= g->row_end) continue;
            for (size_t k = 0; k < p->ntiles && !rc; k++) {
                const sh_tile *t = &p->tiles[k];
                if (t->r1 <= g->row_begin || t->r0 >= g->row_end || t->c1 <= g->col_begin || t->c0 >= g->col_end) continue;
                bool have = false; /* a tile covered by several regions is built once */
                for (size_t q = out.n; q-- > 0 && !have;)
                    have = out.t[q].r0 == t->r0 && out.t[q].c0 == t->c0 && !strcmp(out.t[q].name, p->name);
                if (!have) rc = rebuild(s, nrg, data, p->name, p, t, &m, &out);
            }
        }
    }
    if (!rc) {
        ferry__shard_tiles_sort(&out);
        out.version = m.version;
        memcpy(out.id, m.id, FS_ID_CAP);
        *held = out;
        memset(&out, 0, sizeof out);
    }
done:
    ferry__shard_tiles_release(&out);
    ferry__shard_doc_release(&m);
    if (rc) ferry__context(rc, "run %s: resuming at version %llu", run, (unsigned long long)version);
    return rc;
}

void ferry_shard_tensor_list_free(ferry_shard_tensor_list *l)
{
    if (!l) return;
    for (size_t i = 0; i < l->count; i++) free(l->tensors[i].name);
    free(l->tensors);
    free(l);
}

int ferry_shard_tensors(ferry_store *store, const char *run, const ferry_keys *keys, ferry_shard_tensor_list **out)
{
    if (!store || !out) return ferry__fail(FERRY_ERR_ARG, "ferry_shard_tensors: NULL argument");
    *out = NULL;
    int rc = ferry_sync_run_check(run);
    if (rc) return rc;
    fs_head h;
    if ((rc = ferry__sync_head_read(store, run, keys, NULL, &h, NULL))) {
        if (rc == FERRY_ERR_STORE_NOT_FOUND) rc = ferry__fail(FERRY_ERR_SYNC_NOT_YET, "run %s: no version published yet", run);
        return rc;
    }
    sh_doc m;
    if ((rc = ferry__shard_manifest_read(store, run, keys, h.version, h.id, NULL, &m))) return rc;
    ferry_shard_tensor_list *l = ferry__calloc(1, sizeof *l);
    if (!l || !(l->tensors = ferry__calloc(m.nparts + 1, sizeof *l->tensors))) {
        free(l);
        ferry__shard_doc_release(&m);
        return FERRY_ERR_NOMEM;
    }
    l->version = m.version;
    for (size_t i = 0; i < m.nparts && !rc; i++) { /* sorted by (name, r0): one entry per name */
        const sh_part *p = &m.parts[i];
        if (l->count && !strcmp(l->tensors[l->count - 1].name, p->name)) continue;
        ferry_shard_tensor *t = &l->tensors[l->count];
        if (!(t->name = ferry__strdup(p->name))) {
            rc = FERRY_ERR_NOMEM;
            break;
        }
        t->dtype = p->dtype;
        t->ndim = p->ndim;
        memcpy(t->shape, p->shape, sizeof t->shape);
        l->count++;
    }
    ferry__shard_doc_release(&m);
    if (rc) {
        ferry_shard_tensor_list_free(l);
        return rc;
    }
    *out = l;
    return FERRY_OK;
}
