/* The documents of a sharded publish: token, part record, manifest-2
 * (docs/PROTOCOL.md, "Sharded versions").  Writers and parsers live
 * together so that the layout is in one place; parsers treat every text as
 * hostile: each field is type- and range-checked, offsets overflow-checked,
 * tiles kept inside their objects, parts checked to cover every tensor's
 * rows exactly once. */
#include "shard_impl.h"
#include "sign/sig.h"
#include "sync/json_split.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>

#define J_MAX ((uint64_t)1 << 53) /* integers JSON readers keep exactly */
/* A manifest-2 or part record is split (sync/json_split.h) rather than
 * parsed whole: its lists (parts, objects, a part's tiles) are walked an
 * element at a time, each element bounded (FS_M2_*), and what is parsed at
 * once stays small whatever the text's size (issue 23 item 15). */

static json_t *jint(uint64_t v) { return json_integer((json_int_t)v); }

static char *dump(json_t *root)
{
    if (!root) return NULL;
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

void ferry__shard_key_object(char out[FS_KEY_CAP], const char *run, uint64_t version, const char *id, uint32_t rank, int kind)
{
    snprintf(out, FS_KEY_CAP, "%s/v/%020llu-%s-r%06u.%s", run, (unsigned long long)version, id, rank,
             kind == SH_ANCHOR ? "anchor" : "patch");
}

static json_t *ref_json(const fs_ref *r)
{
    if (!r->version) return json_null();
    return json_pack("{s:o,s:s}", "version", jint(r->version), "id", r->id);
}

/* ---- parsing context ---- */

typedef struct pc {
    const char *key;
    int code;
    int rc;
} pc;

static int bad(pc *c, const char *fmt, ...) FERRY_PRINTF(2, 3);
static int bad(pc *c, const char *fmt, ...)
{
    if (c->rc) return c->rc;
    char w[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w, sizeof w, fmt, ap);
    va_end(ap);
    c->rc = ferry__fail(c->code, "%s: %s", c->key, w);
    return c->rc;
}

static uint64_t g_u64v(pc *c, json_t *v, const char *what)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > J_MAX) {
        bad(c, "%s is missing or not a non-negative integer", what);
        return 0;
    }
    return (uint64_t)json_integer_value(v);
}
static uint64_t g_u64(pc *c, json_t *o, const char *name) { return g_u64v(c, json_object_get(o, name), name); }

static const char *g_str(pc *c, json_t *o, const char *name)
{
    json_t *v = json_object_get(o, name);
    const char *s = json_string_value(v);
    if (!s || strlen(s) != json_string_length(v)) {
        bad(c, "field '%s' is missing or not a string", name);
        return "";
    }
    return s;
}

static void g_id(pc *c, json_t *o, const char *name, char out[FS_ID_CAP])
{
    const char *s = g_str(c, o, name);
    if (c->rc) return;
    if (strlen(s) != FERRY_SYNC_ID_LEN || !ferry__sync_id_valid(s)) {
        bad(c, "field '%s' is not a %d-hex-digit id", name, FERRY_SYNC_ID_LEN);
        return;
    }
    memcpy(out, s, FS_ID_CAP);
}

static void g_hash(pc *c, json_t *o, const char *name, uint8_t out[16])
{
    const char *s = g_str(c, o, name);
    if (!c->rc && !ferry__sync_unhex(s, out)) bad(c, "field '%s' is not 32 lowercase hex digits", name);
}

static void g_ref(pc *c, json_t *o, const char *name, fs_ref *r)
{
    memset(r, 0, sizeof *r);
    json_t *v = json_object_get(o, name);
    if (json_is_null(v)) return;
    if (!json_is_object(v)) {
        bad(c, "field '%s' is neither null nor an object", name);
        return;
    }
    r->version = g_u64(c, v, "version");
    g_id(c, v, "id", r->id);
    if (!c->rc && !r->version) bad(c, "field '%s' names version 0", name);
}

static int g_kind(pc *c, json_t *o)
{
    const char *s = g_str(c, o, "kind");
    if (!strcmp(s, "delta")) return FERRY_SYNC_DELTA;
    if (!strcmp(s, "anchor")) return FERRY_SYNC_ANCHOR;
    bad(c, "field 'kind' is neither \"anchor\" nor \"delta\"");
    return 0;
}

/* root, if its field 'format' is format; else NULL, root released */
static json_t *with_format(pc *c, json_t *root, const char *format)
{
    const char *f = g_str(c, root, "format");
    if (!c->rc && strcmp(f, format)) bad(c, "format \"%.40s\" is not \"%s\"", f, format);
    if (c->rc) {
        json_decref(root);
        return NULL;
    }
    return root;
}

static json_t *load(pc *c, const void *text, size_t n, const char *format)
{
    if (n > SH_MANIFEST_MAX) {
        bad(c, "%zu bytes is over the bound of %zu", n, SH_MANIFEST_MAX);
        return NULL;
    }
    json_error_t err;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        bad(c, "not valid JSON (line %d: %s)", err.line, err.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        bad(c, "not a JSON object");
        json_decref(root);
        return NULL;
    }
    return with_format(c, root, format);
}

/* load() for a document with large lists: the lists named in big are
 * located (spans), the rest parsed. */
static json_t *load_split(pc *c, const void *text, size_t n, const char *format, const char *const *big, fs_span *spans)
{
    if (n > SH_MANIFEST_MAX) {
        bad(c, "%zu bytes is over the bound of %zu", n, SH_MANIFEST_MAX);
        return NULL;
    }
    json_t *root = NULL;
    char why[300];
    if (ferry__sync_json_split(text, n, big, spans, FS_M2_TOP_MAX, &root, why, sizeof why)) {
        bad(c, "%s", why);
        return NULL;
    }
    return with_format(c, root, format);
}

/* ---- token ---- */

char *ferry__shard_token_json(const sh_token *t)
{
    return dump(json_pack("{s:s,s:s,s:o,s:s,s:s,s:o,s:o,s:o}", "format", "ferry-shard-token-1", "run", t->run, "version",
                          jint(t->version), "id", t->id, "kind", t->kind == FERRY_SYNC_ANCHOR ? "anchor" : "delta", "base",
                          ref_json(&t->base), "world", jint(t->world), "tile_words", jint(t->tile_words)));
}

int ferry__shard_token_parse(const char *text, size_t n, sh_token *t)
{
    pc c = {"shard token", FERRY_ERR_SHARD_FOREIGN, 0};
    memset(t, 0, sizeof *t);
    json_t *root = load(&c, text, n, "ferry-shard-token-1");
    if (!root) return c.rc;
    const char *run = g_str(&c, root, "run");
    if (!c.rc && ferry_sync_run_check(run)) bad(&c, "field 'run' is not a run name");
    if (!c.rc) snprintf(t->run, sizeof t->run, "%s", run);
    t->version = g_u64(&c, root, "version");
    g_id(&c, root, "id", t->id);
    t->kind = g_kind(&c, root);
    g_ref(&c, root, "base", &t->base);
    uint64_t w = g_u64(&c, root, "world");
    t->tile_words = g_u64(&c, root, "tile_words");
    if (!c.rc && (!w || w > FERRY_SHARD_WORLD_MAX)) bad(&c, "world %llu out of range", (unsigned long long)w);
    if (!c.rc && (!t->version || t->base.version + 1 != t->version)) bad(&c, "version and base are not consecutive");
    if (!c.rc && !t->tile_words) bad(&c, "tile_words is 0");
    t->world = (uint32_t)w;
    json_decref(root);
    return c.rc;
}

/* ---- parts ---- */

static json_t *loc_json(const sh_loc *l) { return json_pack("[o,o,s]", jint(l->off), jint(l->size), l->sha); }

static json_t *part_json(const sh_part *p, bool with_rank, bool with_tiles)
{
    json_t *shape = json_array(), *rc = json_array(), *cc = json_array(), *tiles = json_array();
    for (uint32_t i = 0; i < p->ndim; i++) json_array_append_new(shape, jint(p->shape[i]));
    for (uint32_t i = 0; i < p->nrc; i++) json_array_append_new(rc, jint(p->rcut[i]));
    for (uint32_t i = 0; i < p->ncc; i++) json_array_append_new(cc, jint(p->ccut[i]));
    for (size_t i = 0; i < p->ntiles; i++) {
        const sh_tile *t = &p->tiles[i];
        char h[33];
        ferry__hex(h, t->target, 16);
        json_t *o = json_pack("{s:s}", "target", h);
        if (t->loc[SH_DELTA].size) {
            ferry__hex(h, t->base, 16);
            json_object_set_new(o, "base", json_string(h));
            json_object_set_new(o, "delta", loc_json(&t->loc[SH_DELTA]));
        }
        if (t->loc[SH_ANCHOR].size) json_object_set_new(o, "anchor", loc_json(&t->loc[SH_ANCHOR]));
        json_array_append_new(tiles, o);
    }
    json_t *o = json_pack("{s:s,s:s,s:o,s:[o,o],s:o,s:o}", "name", p->name, "dtype", ferry_dtype_name(p->dtype), "shape", shape,
                          "rows", jint(p->r0), jint(p->r1), "row_cuts", rc, "col_cuts", cc);
    if (o && with_tiles) json_object_set_new(o, "tiles", tiles);
    else json_decref(tiles);
    if (o && with_rank) json_object_set_new(o, "rank", jint(p->rank));
    return o;
}

static uint64_t *g_cuts(pc *c, json_t *a, const char *what, uint64_t from, uint64_t to, uint32_t *n)
{
    size_t k = json_array_size(a);
    if (!json_is_array(a) || k < 2 || k > SH_CUTS_MAX) {
        bad(c, "%s is not an array of 2..%d cuts", what, SH_CUTS_MAX);
        return NULL;
    }
    uint64_t *v = ferry__calloc(k, sizeof *v);
    if (!v) {
        c->rc = FERRY_ERR_NOMEM;
        return NULL;
    }
    for (size_t i = 0; i < k && !c->rc; i++) {
        v[i] = g_u64v(c, json_array_get(a, i), what);
        if (!c->rc && i && v[i] <= v[i - 1]) bad(c, "%s is not strictly increasing", what);
    }
    if (!c->rc && (v[0] != from || v[k - 1] != to)) bad(c, "%s does not run from %llu to %llu", what, (unsigned long long)from,
                                                       (unsigned long long)to);
    *n = (uint32_t)k;
    return v;
}

static void g_loc(pc *c, json_t *a, const char *what, sh_loc *l)
{
    const char *s = json_string_value(json_array_get(a, 2));
    if (!json_is_array(a) || json_array_size(a) != 3 || !s || strlen(s) != 64) {
        bad(c, "%s is not [offset, size, sha256]", what);
        return;
    }
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) {
            bad(c, "%s: sha256 is not 64 lowercase hex digits", what);
            return;
        }
    l->off = g_u64v(c, json_array_get(a, 0), what);
    l->size = g_u64v(c, json_array_get(a, 1), what);
    memcpy(l->sha, s, 65);
    if (!c->rc && !l->size) bad(c, "%s: size 0", what);
}

/* One part; need_delta / need_anchor say which locations its tiles must
 * (and may only) have. */
/* One tile of a part (its grid cell already set). */
static void g_tile(pc *c, json_t *to, const char *name, sh_tile *t, bool need_delta, bool need_anchor)
{
    if (!json_is_object(to)) {
        bad(c, "tensor '%s': a tile is not an object", name);
        return;
    }
    g_hash(c, to, "target", t->target);
    json_t *d = json_object_get(to, "delta"), *a = json_object_get(to, "anchor");
    if (!c->rc && ((d != NULL) != need_delta || (a != NULL) != need_anchor))
        bad(c, "tensor '%s' tile [%llu:%llu, %llu:%llu]: its delta/anchor entries do not match the version's kind", name,
            (unsigned long long)t->r0, (unsigned long long)t->r1, (unsigned long long)t->c0, (unsigned long long)t->c1);
    if (d && !c->rc) {
        g_hash(c, to, "base", t->base);
        g_loc(c, d, "a tile's 'delta'", &t->loc[SH_DELTA]);
    }
    if (a && !c->rc) g_loc(c, a, "a tile's 'anchor'", &t->loc[SH_ANCHOR]);
}

/* One part (o: its members but 'tiles', whose array is tt[tiles]). */
static void g_part(pc *c, json_t *o, const char *tt, fs_span tiles, sh_part *p, bool with_rank, bool need_delta, bool need_anchor,
                   bool layout)
{
    memset(p, 0, sizeof *p);
    if (!json_is_object(o)) {
        bad(c, "a part is not an object");
        return;
    }
    const char *name = g_str(c, o, "name");
    if (c->rc) return;
    if (!*name || strlen(name) > FERRY_MAX_NAME) {
        bad(c, "a part's tensor name is empty or too long");
        return;
    }
    if (!(p->name = ferry__strdup(name))) {
        c->rc = FERRY_ERR_NOMEM;
        return;
    }
    if (ferry_dtype_parse(g_str(c, o, "dtype"), &p->dtype) && !c->rc) bad(c, "tensor '%s': unknown dtype", name);
    if (!c->rc && !ferry__shard_esize(p->dtype)) bad(c, "tensor '%s': sub-byte dtype %s is not tiled", name, ferry_dtype_name(p->dtype));
    json_t *shape = json_object_get(o, "shape");
    if (!c->rc && (!json_is_array(shape) || json_array_size(shape) > FERRY_MAX_DIMS)) bad(c, "tensor '%s': bad shape", name);
    if (c->rc) return;
    p->ndim = (uint32_t)json_array_size(shape);
    for (uint32_t i = 0; i < p->ndim && !c->rc; i++) p->shape[i] = g_u64v(c, json_array_get(shape, i), "a shape entry");
    uint64_t bytes;
    if (!c->rc && (!ferry__shard_view(p->ndim, p->shape, &p->rows, &p->cols) || !ferry__mul_u64(p->rows, p->cols, &bytes) ||
                   !ferry__mul_u64(bytes, ferry__shard_esize(p->dtype), &bytes) || !p->rows || !p->cols))
        bad(c, "tensor '%s': empty shape or element count overflows", name);
    json_t *rows = json_object_get(o, "rows");
    if (!c->rc && (!json_is_array(rows) || json_array_size(rows) != 2)) bad(c, "tensor '%s': 'rows' is not [begin, end]", name);
    if (c->rc) return;
    p->r0 = g_u64v(c, json_array_get(rows, 0), "rows");
    p->r1 = g_u64v(c, json_array_get(rows, 1), "rows");
    if (!c->rc && (p->r0 >= p->r1 || p->r1 > p->rows))
        bad(c, "tensor '%s': part rows [%llu, %llu) outside its %llu rows", name, (unsigned long long)p->r0,
            (unsigned long long)p->r1, (unsigned long long)p->rows);
    if (with_rank) p->rank = (uint32_t)g_u64(c, o, "rank");
    if (c->rc) return;
    p->rcut = g_cuts(c, json_object_get(o, "row_cuts"), "row_cuts", p->r0, p->r1, &p->nrc);
    if (!c->rc) p->ccut = g_cuts(c, json_object_get(o, "col_cuts"), "col_cuts", 0, p->cols, &p->ncc);
    if (c->rc) return;
    p->ntiles = (size_t)(p->nrc - 1) * (p->ncc - 1);
    if (layout) { /* a layout record: the grid, no tile entries */
        if (json_object_get(o, "tiles") || tiles.len) {
            bad(c, "tensor '%s': a layout record lists no tiles", name);
            return;
        }
        if (!(p->tiles = ferry__calloc(p->ntiles, sizeof *p->tiles))) {
            c->rc = FERRY_ERR_NOMEM;
            return;
        }
        for (size_t i = 0; i < p->ntiles; i++) {
            size_t ri = i / (p->ncc - 1), ci = i % (p->ncc - 1);
            p->tiles[i].r0 = p->rcut[ri];
            p->tiles[i].r1 = p->rcut[ri + 1];
            p->tiles[i].c0 = p->ccut[ci];
            p->tiles[i].c1 = p->ccut[ci + 1];
        }
        return;
    }
    /* counted before anything is allocated for them */
    const char *ta = tt + tiles.off;
    size_t pos = 0, count = 0;
    fs_span el;
    int r = -1;
    while (tiles.len && (r = ferry__sync_json_next(ta, tiles.len, &pos, &el)) == 1) count++;
    if (r < 0 || count != p->ntiles) {
        bad(c, "tensor '%s' rows [%llu, %llu): 'tiles' does not have one entry per grid cell", name, (unsigned long long)p->r0,
            (unsigned long long)p->r1);
        return;
    }
    if (!(p->tiles = ferry__calloc(p->ntiles, sizeof *p->tiles))) {
        c->rc = FERRY_ERR_NOMEM;
        return;
    }
    pos = 0;
    for (size_t i = 0; i < p->ntiles && !c->rc && ferry__sync_json_next(ta, tiles.len, &pos, &el) == 1; i++) {
        sh_tile *t = &p->tiles[i];
        size_t ri = i / (p->ncc - 1), ci = i % (p->ncc - 1);
        t->r0 = p->rcut[ri];
        t->r1 = p->rcut[ri + 1];
        t->c0 = p->ccut[ci];
        t->c1 = p->ccut[ci + 1];
        char why[300];
        json_t *to = ferry__sync_json_load(ta + el.off, el.len, FS_M2_ELEM_MAX, why, sizeof why);
        if (!to) bad(c, "tensor '%s': a tile: %s", name, why);
        else g_tile(c, to, name, t, need_delta, need_anchor);
        json_decref(to);
    }
}

/* Tiles of each object lie inside it (objects: 2 sizes per rank). */
static void check_locs(pc *c, const sh_part *p, const uint64_t *obj)
{
    for (size_t i = 0; i < p->ntiles && !c->rc; i++)
        for (int k = 0; k < 2; k++) {
            const sh_loc *l = &p->tiles[i].loc[k];
            uint64_t end;
            if (l->size && (!ferry__add_u64(l->off, l->size, &end) || end > obj[k]))
                bad(c, "tensor '%s' rows [%llu, %llu) of rank %u: a tile lies outside its %s object", p->name,
                    (unsigned long long)p->r0, (unsigned long long)p->r1, p->rank, k ? "anchor" : "delta");
        }
}

static json_t *parts_json(const sh_doc *d, bool with_rank)
{
    json_t *a = json_array();
    for (size_t i = 0; i < d->nparts; i++) json_array_append_new(a, part_json(&d->parts[i], with_rank, true));
    return a;
}

/* The parts, from the array t[sp], one at a time. */
static void g_parts(pc *c, const char *t, fs_span sp, sh_doc *d, bool with_rank, bool layout)
{
    if (!sp.len) {
        bad(c, "field 'parts' is missing or not an array");
        return;
    }
    static const char *const big[] = {"tiles", NULL};
    const char *a = t + sp.off;
    bool need_delta = d->version > 1, need_anchor = d->kind == FERRY_SYNC_ANCHOR;
    uint64_t tiles = 0;
    size_t pos = 0, cap = 0;
    fs_span el;
    int r = 0;
    while (!c->rc && (r = ferry__sync_json_next(a, sp.len, &pos, &el)) == 1) {
        if (ferry__grow((void **)&d->parts, &cap, d->nparts + 1, sizeof *d->parts)) {
            c->rc = FERRY_ERR_NOMEM;
            return;
        }
        sh_part *p = &d->parts[d->nparts++];
        memset(p, 0, sizeof *p);
        json_t *o = NULL;
        fs_span ts;
        char why[300];
        if (ferry__sync_json_split(a + el.off, el.len, big, &ts, FS_M2_PART_MAX, &o, why, sizeof why)) {
            bad(c, "a part: %s", why);
            return;
        }
        g_part(c, o, a + el.off, ts, p, with_rank, need_delta, need_anchor, layout);
        json_decref(o);
        tiles += p->ntiles;
        if (!c->rc && tiles > SH_TILES_MAX) bad(c, "more than %llu tiles", (unsigned long long)SH_TILES_MAX);
        if (!c->rc && with_rank && p->rank >= d->world) bad(c, "tensor '%s': rank %u is not below world %u", p->name, p->rank, d->world);
        if (!c->rc && !layout) check_locs(c, p, with_rank ? d->obj_bytes + 2 * (size_t)p->rank : d->obj_bytes);
    }
    if (!c->rc && r < 0) bad(c, "field 'parts' is not a valid JSON array");
}

/* ---- record ---- */

/* An object's index: [offset, tiles, root] or null. */
static json_t *index_json(const sh_doc *d, size_t o)
{
    if (!d->obj_index || !d->obj_bytes[o]) return json_null();
    char h[65];
    ferry__hex(h, d->obj_root + 32 * o, 32);
    return json_pack("[o,o,s]", jint(d->obj_index[o]), jint(d->obj_tiles[o]), h);
}

static void g_index(pc *c, json_t *a, const char *what, sh_doc *d, size_t o)
{
    const char *h = json_string_value(json_array_get(a, 2));
    if (!json_is_array(a) || json_array_size(a) != 3 || !h || strlen(h) != 64 || !ferry__unhex(d->obj_root + 32 * o, h, 32)) {
        bad(c, "%s: 'index' is not [offset, tiles, root (64 hex digits)]", what);
        return;
    }
    d->obj_index[o] = g_u64v(c, json_array_get(a, 0), "an index offset");
    d->obj_tiles[o] = g_u64v(c, json_array_get(a, 1), "an index tile count");
    uint64_t need, end;
    if (!c->rc && (!d->obj_tiles[o] || !ferry__shard_ix_size(d->obj_tiles[o], true, &need) ||
                   !ferry__add_u64(d->obj_index[o], need, &end) || end != d->obj_bytes[o]))
        bad(c, "%s: an index of %llu tiles at offset %llu does not end the object's %llu bytes", what,
            (unsigned long long)d->obj_tiles[o], (unsigned long long)d->obj_index[o], (unsigned long long)d->obj_bytes[o]);
}

static int index_alloc(sh_doc *d, size_t n)
{
    d->obj_index = ferry__calloc(n, sizeof *d->obj_index);
    d->obj_tiles = ferry__calloc(n, sizeof *d->obj_tiles);
    d->obj_root = ferry__calloc(n, 32);
    return d->obj_index && d->obj_tiles && d->obj_root ? FERRY_OK : FERRY_ERR_NOMEM;
}

char *ferry__shard_record_json(const sh_doc *r)
{
    json_t *o = json_pack("{s:s,s:s,s:o,s:s,s:s,s:o,s:o,s:[o,o],s:o}", "format", "ferry-shard-record-1", "run", r->run, "version",
                          jint(r->version), "id", r->id, "kind", r->kind == FERRY_SYNC_ANCHOR ? "anchor" : "delta", "rank",
                          jint(r->rank), "world", jint(r->world), "objects", jint(r->obj_bytes[0]), jint(r->obj_bytes[1]),
                          "parts", parts_json(r, false));
    /* the index form: each object's index (absent: the old form) */
    if (o && r->index_form) json_object_set_new(o, "index", json_pack("[o,o]", index_json(r, 0), index_json(r, 1)));
    return dump(o);
}

static void g_head(pc *c, json_t *root, const char *run, sh_doc *d)
{
    const char *r = g_str(c, root, "run");
    if (!c->rc && strcmp(r, run)) bad(c, "belongs to run '%.200s', not '%s'", r, run);
    if (!c->rc) snprintf(d->run, sizeof d->run, "%s", r);
    d->version = g_u64(c, root, "version");
    g_id(c, root, "id", d->id);
    d->kind = g_kind(c, root);
    uint64_t w = g_u64(c, root, "world");
    if (!c->rc && (!w || w > FERRY_SHARD_WORLD_MAX)) bad(c, "world %llu out of range", (unsigned long long)w);
    d->world = (uint32_t)w;
    if (!c->rc && !d->version) bad(c, "version 0");
    if (!c->rc && d->version == 1 && d->kind != FERRY_SYNC_ANCHOR) bad(c, "version 1 is not an anchor");
}

int ferry__shard_record_parse(const char *run, const char *key, const void *text, size_t n, sh_doc *d)
{
    pc c = {key, FERRY_ERR_SHARD_FOREIGN, 0};
    memset(d, 0, sizeof *d);
    static const char *const big[] = {"parts", NULL};
    fs_span sp[1];
    json_t *root = load_split(&c, text, n, "ferry-shard-record-1", big, sp);
    if (!root) return c.rc;
    g_head(&c, root, run, d);
    d->rank = (uint32_t)g_u64(&c, root, "rank");
    if (!c.rc && d->rank >= d->world) bad(&c, "rank %u is not below world %u", d->rank, d->world);
    json_t *ob = json_object_get(root, "objects");
    if (!c.rc && (!json_is_array(ob) || json_array_size(ob) != 2)) bad(&c, "field 'objects' is not [delta bytes, anchor bytes]");
    if (!c.rc && !(d->obj_bytes = ferry__calloc(2, sizeof *d->obj_bytes))) c.rc = FERRY_ERR_NOMEM;
    for (int k = 0; k < 2 && !c.rc; k++) d->obj_bytes[k] = g_u64v(&c, json_array_get(ob, k), "an object size");
    json_t *ix = json_object_get(root, "index");
    if (!c.rc && ix) {
        d->index_form = true;
        if (!json_is_array(ix) || json_array_size(ix) != 2) bad(&c, "field 'index' is not [delta index, anchor index]");
        else if ((c.rc = index_alloc(d, 2))) {
        } else
            for (size_t k = 0; k < 2 && !c.rc; k++) {
                json_t *e = json_array_get(ix, k);
                if (json_is_null(e) != !d->obj_bytes[k]) bad(&c, "field 'index' does not match field 'objects'");
                else if (!json_is_null(e)) g_index(&c, e, k ? "the anchor object" : "the delta object", d, k);
            }
    }
    d->targets_known = true;
    c.code = FERRY_ERR_SHARD_PARTS;
    if (!c.rc) g_parts(&c, text, sp[0], d, false, false);
    for (size_t i = 0; i < d->nparts; i++) d->parts[i].rank = d->rank;
    json_decref(root);
    if (c.rc) ferry__shard_doc_release(d);
    return c.rc;
}

/* ---- manifest ---- */

char *ferry__shard_manifest_json(const sh_doc *m)
{
    json_t *objs = json_array();
    for (uint32_t r = 0; r < m->world; r++)
        for (int k = 0; k < 2; k++) {
            if (!m->obj_bytes[2 * r + k]) continue;
            char key[FS_KEY_CAP];
            ferry__shard_key_object(key, m->run, m->version, m->id, r, k);
            json_t *o = json_pack("{s:o,s:s,s:s,s:o}", "rank", jint(r), "kind", k ? "anchor" : "delta", "key", key, "bytes",
                                  jint(m->obj_bytes[2 * r + k]));
            if (o && m->index_form) json_object_set_new(o, "index", index_json(m, 2 * (size_t)r + (size_t)k));
            json_array_append_new(objs, o);
        }
    char h[33];
    ferry__hex(h, m->model_hash, 16);
    json_t *root = json_pack("{s:s,s:s,s:o,s:s,s:s,s:o,s:o,s:o,s:o,s:s,s:o,s:o,s:o,s:s,s:o,s:o}", "format", "ferry-manifest-2",
                          "run", m->run, "version", jint(m->version), "id", m->id, "kind",
                          m->kind == FERRY_SYNC_ANCHOR ? "anchor" : "delta", "prev", ref_json(&m->prev), "anchor",
                          ref_json(&m->anchor), "world", jint(m->world), "tile_words", jint(m->tile_words), "model_hash", h,
                          "model_bytes", jint(m->model_bytes), "created_unix", jint(m->created), "anchor_every",
                          jint(m->anchor_every), "publisher", m->publisher, "objects", objs, "parts",
                          m->index_form ? json_array() : parts_json(m, true));
    /* the index form: the parts are in the layout record it names, the
       tiles in the objects' indexes */
    if (root && m->index_form) {
        char lk[FS_KEY_CAP], lh[65];
        ferry__shard_key_layout(lk, m->run, m->layout_sha);
        ferry__hex(lh, m->layout_sha, 32);
        if (json_object_set_new(root, "index", json_string(SH_INDEX_NAME)) ||
            json_object_set_new(root, "layout", json_pack("{s:s,s:s}", "key", lk, "sha256", lh))) {
            json_decref(root);
            root = NULL;
        }
    }
    /* the run id, signed with the rest (docs/PROTOCOL.md "Run identity") */
    if (root && m->run_id[0] && json_object_set_new(root, "run_id", json_string(m->run_id))) {
        json_decref(root);
        root = NULL;
    }
    /* tiles as ferry-tile-1 payloads; absent: standalone patches */
    if (root && m->tile_codec == SH_TC_CHUNK && json_object_set_new(root, "tile_codec", json_string(SH_TILE_CODEC_NAME))) {
        json_decref(root);
        root = NULL;
    }
    return dump(root);
}

static int cmp_part(const void *a, const void *b)
{
    const sh_part *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    return x->r0 < y->r0 ? -1 : x->r0 > y->r0;
}

void ferry__shard_parts_sort(sh_part *p, size_t n)
{
    if (n) qsort(p, n, sizeof *p, cmp_part);
}

/* Parts sorted by (name, r0) cover each tensor's rows exactly once and agree
 * on its dtype, shape and column cuts. */
int ferry__shard_parts_cover(const sh_part *p, size_t n, int code, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        const sh_part *a = &p[i];
        bool first = !i || strcmp(p[i - 1].name, a->name);
        if (first && a->r0)
            return ferry__fail(code, "%s: tensor '%s': rows [0, %llu) are in no part (gap before rank %u's rows [%llu, %llu))", what,
                               a->name, (unsigned long long)a->r0, a->rank, (unsigned long long)a->r0, (unsigned long long)a->r1);
        if (!first) {
            const sh_part *b = &p[i - 1];
            if (a->dtype != b->dtype || a->ndim != b->ndim || memcmp(a->shape, b->shape, a->ndim * sizeof a->shape[0]) ||
                a->ncc != b->ncc || memcmp(a->ccut, b->ccut, a->ncc * sizeof a->ccut[0]))
                return ferry__fail(code, "%s: tensor '%s': ranks %u and %u disagree on its dtype, shape or column grid", what,
                                   a->name, b->rank, a->rank);
            if (a->r0 == b->r0 && a->r1 == b->r1)
                return ferry__fail(code, "%s: tensor '%s': part rows [%llu, %llu) given twice (ranks %u and %u)", what, a->name,
                                   (unsigned long long)a->r0, (unsigned long long)a->r1, b->rank, a->rank);
            if (a->r0 < b->r1)
                return ferry__fail(code, "%s: tensor '%s': rank %u's rows [%llu, %llu) overlap rank %u's rows [%llu, %llu)", what,
                                   a->name, a->rank, (unsigned long long)a->r0, (unsigned long long)a->r1, b->rank,
                                   (unsigned long long)b->r0, (unsigned long long)b->r1);
            if (a->r0 > b->r1)
                return ferry__fail(code, "%s: tensor '%s': rows [%llu, %llu) are in no part (gap between ranks %u and %u)", what,
                                   a->name, (unsigned long long)b->r1, (unsigned long long)a->r0, b->rank, a->rank);
        }
        bool last = i + 1 == n || strcmp(p[i + 1].name, a->name);
        if (last && a->r1 != a->rows)
            return ferry__fail(code, "%s: tensor '%s': rows [%llu, %llu) are in no part (gap after rank %u's rows)", what, a->name,
                               (unsigned long long)a->r1, (unsigned long long)a->rows, a->rank);
    }
    return FERRY_OK;
}

/* One entry of a manifest's object list (the rank's object of a kind, its
 * protocol key and size). */
static void g_object(pc *c, json_t *o, const char *run, sh_doc *m)
{
    uint64_t r = g_u64(c, o, "rank");
    const char *k = g_str(c, o, "kind");
    int kind = !strcmp(k, "anchor") ? SH_ANCHOR : !strcmp(k, "delta") ? SH_DELTA : -1;
    if (c->rc) return;
    if (kind < 0 || r >= m->world) {
        bad(c, "an object's rank or kind is out of range");
        return;
    }
    char want[FS_KEY_CAP];
    ferry__shard_key_object(want, run, m->version, m->id, (uint32_t)r, kind);
    if (strcmp(g_str(c, o, "key"), want) && !c->rc) bad(c, "an object key is not the one the protocol gives (%s)", want);
    if (m->obj_bytes[2 * r + (uint64_t)kind] && !c->rc) bad(c, "object %s listed twice", want);
    m->obj_bytes[2 * r + (uint64_t)kind] = g_u64(c, o, "bytes");
    if (!c->rc && !m->obj_bytes[2 * r + (uint64_t)kind]) bad(c, "object %s has 0 bytes", want);
    json_t *ix = json_object_get(o, "index");
    if (!c->rc && (ix != NULL) != m->index_form) bad(c, "object %s: 'index' %s", want, m->index_form ? "is missing" : "in the old form");
    if (!c->rc && ix) g_index(c, ix, want, m, 2 * (size_t)r + (size_t)kind);
}

int ferry__shard_manifest_parse(const char *run, const char *key, const void *text, size_t n, sh_doc *m)
{
    pc c = {key, FERRY_ERR_SYNC_MANIFEST, 0};
    memset(m, 0, sizeof *m);
    static const char *const big[] = {"objects", "parts", NULL};
    fs_span sp[2];
    json_t *root = load_split(&c, text, n, "ferry-manifest-2", big, sp);
    if (!root) return c.rc;
    g_head(&c, root, run, m);
    if (!c.rc && json_object_get(root, "run_id")) g_id(&c, root, "run_id", m->run_id); /* absent before run ids */
    if (!c.rc && json_object_get(root, "tile_codec")) { /* absent: tiles are standalone patches */
        if (strcmp(g_str(&c, root, "tile_codec"), SH_TILE_CODEC_NAME) && !c.rc)
            bad(&c, "field 'tile_codec' is not \"%s\" (a newer ferry wrote it?)", SH_TILE_CODEC_NAME);
        m->tile_codec = SH_TC_CHUNK;
    }
    if (!c.rc && json_object_get(root, "index")) { /* absent: every tile in 'parts' */
        if (strcmp(g_str(&c, root, "index"), SH_INDEX_NAME) && !c.rc)
            bad(&c, "field 'index' is not \"%s\" (a newer ferry wrote it?)", SH_INDEX_NAME);
        json_t *l = json_object_get(root, "layout");
        const char *lh = json_is_object(l) ? json_string_value(json_object_get(l, "sha256")) : NULL;
        if (!c.rc && (!lh || strlen(lh) != 64 || !ferry__unhex(m->layout_sha, lh, 32)))
            bad(&c, "field 'layout' is not {key, sha256 (64 hex digits)}");
        char want[FS_KEY_CAP];
        if (!c.rc) ferry__shard_key_layout(want, run, m->layout_sha);
        if (!c.rc && strcmp(g_str(&c, l, "key"), want) && !c.rc) bad(&c, "field 'layout': key is not %s", want);
        m->index_form = true;
        /* its tiles are ferry-tile-1 payloads: a standalone patch's base
           hash has no place in a tile index (no writer makes the pair) */
        if (!c.rc && m->tile_codec != SH_TC_CHUNK) bad(&c, "field 'index' without 'tile_codec' \"%s\"", SH_TILE_CODEC_NAME);
    }
    m->targets_known = !m->index_form;
    g_ref(&c, root, "prev", &m->prev);
    g_ref(&c, root, "anchor", &m->anchor);
    m->tile_words = g_u64(&c, root, "tile_words");
    g_hash(&c, root, "model_hash", m->model_hash);
    m->model_bytes = g_u64(&c, root, "model_bytes");
    m->created = g_u64(&c, root, "created_unix");
    m->anchor_every = (uint32_t)g_u64(&c, root, "anchor_every");
    const char *pub = g_str(&c, root, "publisher");
    if (!c.rc && !ferry__sync_publisher_valid(pub)) bad(&c, "field 'publisher' is not a publisher id");
    if (!c.rc) snprintf(m->publisher, sizeof m->publisher, "%s", pub);
    if (!c.rc && (m->prev.version + 1 != m->version)) bad(&c, "'prev' is not the version before");
    if (!c.rc && (!m->anchor.version || m->anchor.version > m->version ||
                  (m->kind == FERRY_SYNC_ANCHOR) != (m->anchor.version == m->version && !strcmp(m->anchor.id, m->id))))
        bad(&c, "'anchor' does not name the version's nearest anchor");
    if (!c.rc && !(m->obj_bytes = ferry__calloc(2 * (size_t)m->world, sizeof *m->obj_bytes))) c.rc = FERRY_ERR_NOMEM;
    if (!c.rc && m->index_form) c.rc = index_alloc(m, 2 * (size_t)m->world);
    if (!c.rc && !sp[0].len) bad(&c, "field 'objects' is malformed");
    const char *ot = (const char *)text + sp[0].off;
    size_t pos = 0, nobj = 0;
    fs_span el;
    int r = 0;
    while (!c.rc && (r = ferry__sync_json_next(ot, sp[0].len, &pos, &el)) == 1) {
        char why[300];
        json_t *o = ++nobj > 2 * (size_t)m->world ? NULL : ferry__sync_json_load(ot + el.off, el.len, FS_M2_ELEM_MAX, why, sizeof why);
        if (!json_is_object(o)) bad(&c, "field 'objects' is malformed");
        else g_object(&c, o, run, m);
        json_decref(o);
    }
    if (!c.rc && r < 0) bad(&c, "field 'objects' is malformed");
    if (!c.rc && m->index_form) {
        if (!sp[1].len || ferry__sync_json_next((const char *)text + sp[1].off, sp[1].len, &(size_t){0}, &el) != 0)
            bad(&c, "field 'parts' is not empty (the index form's parts are in its layout record)");
        json_decref(root);
        if (c.rc) ferry__shard_doc_release(m);
        return c.rc;
    }
    if (!c.rc) g_parts(&c, text, sp[1], m, true, false);
    json_decref(root);
    if (!c.rc) {
        for (size_t i = 1; i < m->nparts && !c.rc; i++)
            if (cmp_part(&m->parts[i - 1], &m->parts[i]) >= 0) bad(&c, "parts are not sorted by tensor name and first row");
        if (!c.rc && !m->nparts) bad(&c, "no parts");
        if (!c.rc) c.rc = ferry__shard_parts_cover(m->parts, m->nparts, FERRY_ERR_SYNC_MANIFEST, key);
        uint8_t h[16];
        if (!c.rc) c.rc = ferry__shard_hash(m, h);
        if (!c.rc && memcmp(h, m->model_hash, 16)) bad(&c, "model_hash is not the shard hash of its tiles");
    }
    if (c.rc) ferry__shard_doc_release(m);
    return c.rc;
}

/* ---- layout record ---- */

void ferry__shard_key_layout(char out[FS_KEY_CAP], const char *run, const uint8_t sha[32])
{
    char h[65];
    ferry__hex(h, sha, 32);
    snprintf(out, FS_KEY_CAP, "%s/layout/%s.json", run, h);
}

char *ferry__shard_layout_json(const sh_doc *m)
{
    json_t *a = json_array();
    for (size_t i = 0; i < m->nparts; i++) json_array_append_new(a, part_json(&m->parts[i], true, false));
    return dump(json_pack("{s:s,s:s,s:o,s:o}", "format", SH_LAYOUT_FORMAT, "run", m->run, "world", jint(m->world), "parts", a));
}

void ferry__shard_lcache_release(sh_lcache *c)
{
    ferry_free(c->text);
    memset(c, 0, sizeof *c);
}

int ferry__shard_layout_attach(sh_doc *m, const char *key, const void *text, size_t n)
{
    pc c = {key, FERRY_ERR_SYNC_MANIFEST, 0};
    uint8_t sha[32];
    int rc = ferry__sha256(text, n, sha);
    if (rc) return rc;
    if (memcmp(sha, m->layout_sha, 32)) return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: its SHA-256 is not the manifest's", key);
    static const char *const big[] = {"parts", NULL};
    fs_span sp[1];
    json_t *root = load_split(&c, text, n, SH_LAYOUT_FORMAT, big, sp);
    if (!root) return c.rc;
    const char *run = g_str(&c, root, "run");
    if (!c.rc && strcmp(run, m->run)) bad(&c, "belongs to run '%.200s', not '%s'", run, m->run);
    if (!c.rc && g_u64(&c, root, "world") != m->world && !c.rc) bad(&c, "its world is not the manifest's %u", m->world);
    json_decref(root);
    sh_doc d;
    memset(&d, 0, sizeof d);
    d.version = 2; /* no tile entries are looked for */
    d.world = m->world;
    if (!c.rc) g_parts(&c, text, sp[0], &d, true, true);
    for (size_t i = 1; i < d.nparts && !c.rc; i++)
        if (cmp_part(&d.parts[i - 1], &d.parts[i]) >= 0) bad(&c, "parts are not sorted by tensor name and first row");
    if (!c.rc && !d.nparts) bad(&c, "no parts");
    if (!c.rc) c.rc = ferry__shard_parts_cover(d.parts, d.nparts, FERRY_ERR_SYNC_MANIFEST, key);
    /* leaf positions: a rank's tiles in part order, row-major */
    uint64_t *count = c.rc ? NULL : ferry__calloc(m->world, sizeof *count);
    if (!c.rc && !count) c.rc = FERRY_ERR_NOMEM;
    for (size_t i = 0; i < d.nparts && !c.rc; i++)
        for (size_t j = 0; j < d.parts[i].ntiles; j++) d.parts[i].tiles[j].leaf = count[d.parts[i].rank]++;
    bool need[2] = {m->version > 1, m->kind == FERRY_SYNC_ANCHOR};
    for (uint32_t r = 0; r < m->world && !c.rc; r++)
        for (int k = 0; k < 2 && !c.rc; k++) {
            size_t o = 2 * (size_t)r + (size_t)k;
            if (m->obj_bytes[o] ? m->obj_tiles[o] != count[r] : count[r] && need[k])
                bad(&c, "rank %u holds %llu tiles, its %s object's index %llu", r, (unsigned long long)count[r], k ? "anchor" : "delta",
                    (unsigned long long)m->obj_tiles[o]);
        }
    free(count);
    if (c.rc) {
        ferry__shard_doc_release(&d);
        return c.rc;
    }
    for (size_t i = 0; i < m->nparts; i++) ferry__shard_part_release(&m->parts[i]);
    free(m->parts);
    m->parts = d.parts;
    m->nparts = d.nparts;
    free(d.obj_bytes);
    return FERRY_OK;
}

/* Reads the layout record m names (from the cache when it holds it). */
static int layout_load(ferry_store *st, const char *run, sh_doc *m, fs_count *cnt, sh_lcache *lc)
{
    char key[FS_KEY_CAP];
    ferry__shard_key_layout(key, run, m->layout_sha);
    if (lc && lc->text && !memcmp(lc->sha, m->layout_sha, 32)) return ferry__shard_layout_attach(m, key, lc->text, lc->n);
    void *d;
    size_t n;
    int rc = ferry_store_get_max(st, key, SH_MANIFEST_MAX, &d, &n, NULL);
    if (rc == FERRY_ERR_LIMIT)
        return ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s: larger than %llu bytes", key, (unsigned long long)SH_MANIFEST_MAX);
    if (rc == FERRY_ERR_STORE_NOT_FOUND) return ferry__fail(FERRY_ERR_SYNC_GONE, "%s: the layout record is gone", key);
    if (rc) return rc;
    if (cnt) {
        cnt->bytes += n;
        cnt->manifests++;
    }
    if (!(rc = ferry__shard_layout_attach(m, key, d, n)) && lc) {
        ferry__shard_lcache_release(lc);
        lc->text = d;
        lc->n = n;
        memcpy(lc->sha, m->layout_sha, 32);
        return FERRY_OK;
    }
    ferry_free(d);
    return rc;
}

int ferry__shard_manifest_read(ferry_store *st, const char *run, const ferry_keys *keys, uint64_t version, const char *id, fs_count *cnt,
                     sh_doc *out)
{
    return ferry__shard_manifest_read_lc(st, run, keys, version, id, cnt, NULL, out);
}

int ferry__shard_manifest_read_lc(ferry_store *st, const char *run, const ferry_keys *keys, uint64_t version, const char *id,
                                  fs_count *cnt, sh_lcache *lc, sh_doc *out)
{
    char key[FS_KEY_CAP];
    ferry__sync_key_version(key, run, version, id, FS_OBJ_MANIFEST);
    void *d;
    size_t n;
    memset(out, 0, sizeof *out);
    /* bounded in the GET itself: a manifest-2 lists every tile, so it may
     * exceed FS_JSON_MAX, but never SH_MANIFEST_MAX */
    int rc = ferry_store_get_max(st, key, SH_MANIFEST_MAX, &d, &n, NULL);
    if (rc == FERRY_ERR_LIMIT)
        return ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s: larger than %llu bytes, too large for a sharded manifest", key,
                           (unsigned long long)SH_MANIFEST_MAX);
    if (rc) return rc;
    if (cnt) {
        cnt->bytes += n;
        cnt->manifests++;
    }
    /* the signature before anything else is looked at: with trusted keys an
     * unsigned or forged manifest is refused unparsed */
    bool is_signed;
    size_t body = n;
    if ((rc = ferry__sign_open(keys, FS_DOM_RECORD, key, d, n, &body, &is_signed))) {
        ferry_free(d);
        return rc;
    }
    n = body;
    /* a single-rank manifest is a distinct, clear error */
    if (n < 4096 && strstr((const char *)d, "\"ferry-manifest-1\"")) {
        ferry_free(d);
        return ferry__fail(FERRY_ERR_SHARD_KIND, "%s: a single-rank version (ferry-manifest-1): this run is not sharded", key);
    }
    rc = ferry__shard_manifest_parse(run, key, d, n, out);
    ferry_free(d);
    if (!rc && (out->version != version || strcmp(out->id, id))) {
        ferry__shard_doc_release(out);
        rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s: holds the manifest of another version", key);
    }
    if (!rc && out->index_form && (rc = layout_load(st, run, out, cnt, lc))) {
        ferry__shard_doc_release(out);
        ferry__context(rc, "%s", key);
    }
    return rc;
}

/* ---- links of either manifest format (GC, run log) ---- */

void ferry__shard_manifest_view(const sh_doc *m, fs_manifest *out)
{
    memset(out, 0, sizeof *out);
    out->version = m->version;
    memcpy(out->id, m->id, FS_ID_CAP);
    out->kind = m->kind;
    out->prev = m->prev;
    out->anchor.ref = m->anchor;
    memcpy(out->model_hash, m->model_hash, 16);
    out->model_bytes = m->model_bytes;
    for (uint32_t r = 0; r < m->world; r++) {
        out->delta_bytes += m->obj_bytes[2 * r];
        out->full_bytes += m->obj_bytes[2 * r + 1];
    }
    for (size_t i = 0; i < m->nparts; i++)
        if (!i || strcmp(m->parts[i].name, m->parts[i - 1].name)) out->tensors++;
    out->created = (int64_t)m->created;
    snprintf(out->publisher, sizeof out->publisher, "%s", m->publisher);
    out->anchor_every = m->anchor_every;
}
