/* The protocol's small JSON records — HEAD, version manifests, the
 * compaction index — written and parsed with jansson.  Parsers treat the
 * text as hostile: every field is type- and range-checked and the record
 * must agree with the key it was read from (run, version, id), so a
 * manifest copied under another version's name is refused. */
#include "sync_impl.h"

#include "json_split.h"

#include <jansson.h>
#include <stdlib.h>
#include <time.h>


static const char *k_kind[] = {"delta", "anchor"};

/* ---- writing ---- */

static json_t *jhash(const uint8_t h[16])
{
    char x[33];
    ferry__hex(x, h, 16);
    return json_string(x);
}

static json_t *jint(uint64_t v) { return json_integer((json_int_t)v); }

static json_t *jref(const fs_ref *r)
{
    if (!r->version) return json_null();
    return json_pack("{s:o,s:s}", "version", jint(r->version), "id", r->id);
}

static json_t *janchor(const fs_anchor_ref *a)
{
    if (!a->ref.version) return json_null();
    return json_pack("{s:o,s:s,s:o,s:o}", "version", jint(a->ref.version), "id", a->ref.id, "bytes", jint(a->bytes),
                     "delta_bytes_cum", jint(a->cum));
}

static json_t *jsha(const uint8_t d[32])
{
    char x[65];
    ferry__hex(x, d, 32);
    return json_string(x);
}

/* Adds "run_id" to a record when the run has one, and serialises it. */
static char *dump(json_t *root);
static char *with_run_id(json_t *root, const char *run_id)
{
    if (root && run_id[0] && json_object_set_new(root, "run_id", json_string(run_id))) {
        json_decref(root);
        root = NULL;
    }
    return dump(root);
}

/* Adds "sha256" to an object entry when the digest is known. */
static json_t *with_sha(json_t *o, bool has, const uint8_t d[32])
{
    if (o && has && json_object_set_new(o, "sha256", jsha(d))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static char *dump(json_t *root)
{
    if (!root) {
        ferry__fail(FERRY_ERR_NOMEM, "cannot build a JSON record");
        return NULL;
    }
    char *s = json_dumps(root, JSON_INDENT(1) | JSON_ENSURE_ASCII);
    json_decref(root);
    if (!s) ferry__fail(FERRY_ERR_NOMEM, "cannot serialise a JSON record");
    return s;
}

static void iso_time(char out[32], int64_t t)
{
    time_t tt = (time_t)t;
    struct tm tm;
    if (!gmtime_r(&tt, &tm) || !strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm)) snprintf(out, 32, "?");
}

char *ferry__sync_head_json(const char *run, const fs_head *h, const char *manifest_key)
{
    char t[32];
    iso_time(t, h->time);
    json_t *root = json_pack("{s:s,s:s,s:o,s:s,s:s,s:s,s:o,s:s,s:o,s:s}", "format", "ferry-head-1", "run", run, "version",
                             jint(h->version), "id", h->id, "kind", k_kind[h->kind], "manifest", manifest_key,
                             "model_hash", jhash(h->model_hash), "publisher", h->publisher, "time_unix", jint((uint64_t)h->time),
                             "time", t);
    if (root && h->manifest_record && json_object_set_new(root, "manifest_record", json_string(h->manifest_record))) {
        json_decref(root);
        return NULL;
    }
    return with_run_id(root, h->run_id);
}

char *ferry__sync_manifest_json(const char *run, const fs_manifest *m)
{
    char key[FS_KEY_CAP], t[32];
    iso_time(t, m->created);
    json_t *full = json_null(), *delta = json_null();
    if (m->kind == FERRY_SYNC_ANCHOR) {
        ferry__sync_key_version(key, run, m->version, m->id, FS_OBJ_FULL);
        full = with_sha(json_pack("{s:s,s:o}", "key", key, "bytes", jint(m->full_bytes)), m->has_full_sha, m->full_sha);
    }
    if (m->version > 1) {
        ferry__sync_key_version(key, run, m->version, m->id, FS_OBJ_DELTA);
        delta = with_sha(json_pack("{s:s,s:o,s:o,s:s,s:o}", "key", key, "bytes", jint(m->delta_bytes), "base_version",
                                   jint(m->prev.version), "base_id", m->prev.id, "base_hash", jhash(m->base_hash)),
                         m->has_delta_sha, m->delta_sha);
    }
    json_t *root = json_pack("{s:s,s:s,s:o,s:s,s:s,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:s,s:s,s:o}",
                             "format", "ferry-manifest-1", "run", run, "version", jint(m->version), "id", m->id,
                             "kind", k_kind[m->kind], "prev", jref(&m->prev), "anchor", janchor(&m->anchor),
                             "prev_anchor", janchor(&m->prev_anchor), "full", full, "delta", delta,
                             "model_hash", jhash(m->model_hash), "model_bytes", jint(m->model_bytes),
                             "tensors", jint(m->tensors), "delta_bytes_cum", jint(m->cum),
                             "created_unix", jint((uint64_t)m->created), "created", t, "publisher", m->publisher,
                             "anchor_every", jint(m->anchor_every));
    return with_run_id(root, m->run_id);
}

char *ferry__sync_index_json(const char *run, const fs_index *ix)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < ix->n; i++) {
        const fs_compaction *c = &ix->c[i];
        char key[FS_KEY_CAP];
        ferry__sync_key_compact(key, run, c->from, c->to, c->id);
        json_t *e = json_pack("{s:o,s:s,s:o,s:s,s:s,s:s,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "from", jint(c->from),
                              "from_id", c->from_id, "to", jint(c->to), "to_id", c->to_id, "id", c->id, "key", key,
                              "bytes", jint(c->bytes), "base_hash", jhash(c->base_hash), "target_hash",
                              jhash(c->target_hash), "from_delta_bytes_cum", jint(c->from_cum),
                              "to_delta_bytes_cum", jint(c->to_cum), "from_full_bytes", jint(c->from_full_bytes),
                              "created_unix", jint((uint64_t)c->created), "chain_bytes", jint(c->to_cum - c->from_cum));
        e = with_sha(e, c->has_sha, c->sha);
        if (e && c->world) { /* a sharded compaction: its rank objects (an entry
                                without them in ix is written as nothing) */
            json_t *objs = ix->obj && c->obj0 + c->world <= ix->nobj ? json_array() : NULL;
            for (uint32_t r = 0; objs && r < c->world; r++) {
                const fs_cobj *o = &ix->obj[c->obj0 + r];
                char rh[65];
                ferry__hex(rh, o->root, 32);
                ferry__sync_key_compact_rank(key, run, c->from, c->to, c->id, r);
                if (json_array_append_new(objs, json_pack("{s:s,s:o,s:o,s:o,s:s}", "key", key, "bytes", jint(o->bytes), "index",
                                                          jint(o->index), "tiles", jint(o->tiles), "root", rh))) {
                    json_decref(objs);
                    objs = NULL;
                }
            }
            if (!objs || json_object_set_new(e, "objects", objs)) {
                json_decref(e);
                e = NULL;
            }
        }
        if (!e || json_array_append_new(arr, e)) {
            json_decref(arr);
            arr = NULL;
        }
    }
    if (!arr) return dump(NULL);
    return with_run_id(json_pack("{s:s,s:s,s:o}", "format", "ferry-compactions-1", "run", run, "compactions", arr), ix->run_id);
}

/* ---- parsing ---- */

typedef struct pctx {
    const char *key;
    int rc;
} pctx;

static int bad(pctx *c, const char *what)
{
    if (!c->rc) c->rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s: %s", c->key, what);
    return c->rc;
}

static uint64_t g_u64(pctx *c, json_t *o, const char *name)
{
    json_t *v = json_object_get(o, name);
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        char w[96];
        snprintf(w, sizeof w, "field '%s' is missing or not a non-negative integer", name);
        bad(c, w);
        return 0;
    }
    return (uint64_t)json_integer_value(v);
}

static const char *g_str(pctx *c, json_t *o, const char *name)
{
    const char *s = json_string_value(json_object_get(o, name));
    if (!s) {
        char w[96];
        snprintf(w, sizeof w, "field '%s' is missing or not a string", name);
        bad(c, w);
        return "";
    }
    return s;
}

static void g_hash(pctx *c, json_t *o, const char *name, uint8_t out[16])
{
    const char *s = g_str(c, o, name);
    if (!c->rc && !ferry__sync_unhex(s, out)) {
        char w[96];
        snprintf(w, sizeof w, "field '%s' is not 32 lowercase hex digits", name);
        bad(c, w);
    }
}

static void g_id(pctx *c, json_t *o, const char *name, char out[FS_ID_CAP])
{
    const char *s = g_str(c, o, name);
    if (c->rc) return;
    if (strlen(s) != FERRY_SYNC_ID_LEN || !ferry__sync_id_valid(s)) {
        char w[96];
        snprintf(w, sizeof w, "field '%s' is not a %d-hex-digit id", name, FERRY_SYNC_ID_LEN);
        bad(c, w);
        return;
    }
    memcpy(out, s, FS_ID_CAP);
}

static void g_publisher(pctx *c, json_t *o, char out[FERRY_SYNC_PUBLISHER_MAX])
{
    const char *s = g_str(c, o, "publisher");
    if (c->rc) return;
    if (!ferry__sync_publisher_valid(s)) {
        bad(c, "field 'publisher' is empty, too long or not printable ASCII");
        return;
    }
    snprintf(out, FERRY_SYNC_PUBLISHER_MAX, "%s", s);
}

static int g_kind(pctx *c, json_t *o)
{
    const char *s = g_str(c, o, "kind");
    if (!strcmp(s, "delta")) return FERRY_SYNC_DELTA;
    if (!strcmp(s, "anchor")) return FERRY_SYNC_ANCHOR;
    bad(c, "field 'kind' is neither \"anchor\" nor \"delta\"");
    return 0;
}

static void g_ref(pctx *c, json_t *o, const char *name, fs_ref *r)
{
    memset(r, 0, sizeof *r);
    json_t *v = json_object_get(o, name);
    if (json_is_null(v)) return;
    if (!json_is_object(v)) {
        char w[96];
        snprintf(w, sizeof w, "field '%s' is neither null nor an object", name);
        bad(c, w);
        return;
    }
    r->version = g_u64(c, v, "version");
    g_id(c, v, "id", r->id);
    if (!c->rc && !r->version) bad(c, "a link names version 0");
}

static void g_anchor(pctx *c, json_t *o, const char *name, fs_anchor_ref *a)
{
    memset(a, 0, sizeof *a);
    g_ref(c, o, name, &a->ref);
    if (c->rc || !a->ref.version) return;
    json_t *v = json_object_get(o, name);
    a->bytes = g_u64(c, v, "bytes");
    a->cum = g_u64(c, v, "delta_bytes_cum");
}

/* An optional "sha256" of an object entry: 64 hex digits when present. */
static bool g_sha(pctx *c, json_t *o, uint8_t out[32])
{
    json_t *v = json_object_get(o, "sha256");
    if (!v || c->rc) return false;
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    if (!s || !ferry__unhex(out, s, 32) || s[64]) {
        bad(c, "field 'sha256' is not 64 lowercase hex digits");
        return false;
    }
    return true;
}

static json_t *load(pctx *c, const void *text, size_t n, const char *format)
{
    json_error_t err;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        char w[200];
        snprintf(w, sizeof w, "not valid JSON (line %d: %s)", err.line, err.text);
        bad(c, w);
        return NULL;
    }
    if (!json_is_object(root)) bad(c, "not a JSON object");
    else if (strcmp(g_str(c, root, "format"), format) && !c->rc) {
        char w[160];
        if (!strcmp(format, "ferry-manifest-1") && !strcmp(json_string_value(json_object_get(root, "format")), "ferry-manifest-2"))
            snprintf(w, sizeof w, "a sharded version (ferry-manifest-2): read it with ferry shard-pull or ferry_shard_pull");
        else
            snprintf(w, sizeof w, "format is not \"%s\"", format);
        bad(c, w);
    }
    if (c->rc) {
        json_decref(root);
        return NULL;
    }
    return root;
}

static void check_run(pctx *c, json_t *root, const char *run)
{
    const char *r = g_str(c, root, "run");
    if (!c->rc && strcmp(r, run)) bad(c, "belongs to another run");
}

/* "run_id": absent in records written before run ids (out = ""), else
 * FERRY_SYNC_ID_LEN lowercase hex digits. */
static void g_run_id(pctx *c, json_t *root, char out[FS_ID_CAP])
{
    out[0] = 0;
    if (c->rc || !json_object_get(root, "run_id")) return;
    g_id(c, root, "run_id", out);
}

/* What a HEAD and a manifest both begin with: the record of one version of
 * RUN (format, run, run id, version, id, kind). */
static json_t *load_version(pctx *c, const void *text, size_t n, const char *format, const char *run,
                            char run_id[FS_ID_CAP], uint64_t *version, char id[FS_ID_CAP], int *kind)
{
    json_t *root = load(c, text, n, format);
    if (!root) return NULL;
    check_run(c, root, run);
    g_run_id(c, root, run_id);
    *version = g_u64(c, root, "version");
    g_id(c, root, "id", id);
    *kind = g_kind(c, root);
    return root;
}

/* The HEAD parsed into *h; *keep (when given) gets the parsed document
 * on success, for head_inline. */
static int head_parse(const char *run, const char *key, const void *text, size_t n, fs_head *h, json_t **keep)
{
    pctx c = {key, 0};
    memset(h, 0, sizeof *h);
    json_t *root = load_version(&c, text, n, "ferry-head-1", run, h->run_id, &h->version, h->id, &h->kind);
    if (!root) return c.rc;
    g_hash(&c, root, "model_hash", h->model_hash);
    g_publisher(&c, root, h->publisher);
    h->time = (int64_t)g_u64(&c, root, "time_unix");
    if (!c.rc) {
        char want[FS_KEY_CAP];
        ferry__sync_key_version(want, run, h->version, h->id, FS_OBJ_MANIFEST);
        if (strcmp(g_str(&c, root, "manifest"), want) && !c.rc) bad(&c, "field 'manifest' is not the manifest key of its version");
    }
    if (!c.rc && (!h->version || h->version > FS_VERSION_MAX)) bad(&c, "version out of range (1 .. 2^63 - 2)");
    if (!c.rc && keep) *keep = root;
    else json_decref(root);
    return c.rc;
}

int ferry__sync_head_parse(const char *run, const char *key, const void *text, size_t n, fs_head *h)
{
    return head_parse(run, key, text, n, h, NULL);
}

static void check_key(pctx *c, json_t *obj, const char *want)
{
    if (c->rc) return;
    if (strcmp(g_str(c, obj, "key"), want) && !c->rc) bad(c, "an object key is not the one the protocol gives its version");
}

int ferry__sync_manifest_parse(const char *run, const char *key, const void *text, size_t n, fs_manifest *m)
{
    pctx c = {key, 0};
    memset(m, 0, sizeof *m);
    json_t *root = load_version(&c, text, n, "ferry-manifest-1", run, m->run_id, &m->version, m->id, &m->kind);
    if (!root) return c.rc;
    g_ref(&c, root, "prev", &m->prev);
    g_anchor(&c, root, "anchor", &m->anchor);
    g_anchor(&c, root, "prev_anchor", &m->prev_anchor);
    g_hash(&c, root, "model_hash", m->model_hash);
    m->model_bytes = g_u64(&c, root, "model_bytes");
    m->tensors = g_u64(&c, root, "tensors");
    m->cum = g_u64(&c, root, "delta_bytes_cum");
    m->created = (int64_t)g_u64(&c, root, "created_unix");
    g_publisher(&c, root, m->publisher);
    m->anchor_every = (uint32_t)g_u64(&c, root, "anchor_every");
    char want[FS_KEY_CAP];
    json_t *full = json_object_get(root, "full"), *delta = json_object_get(root, "delta");
    if (!c.rc) {
        if (m->kind == FERRY_SYNC_ANCHOR) {
            if (!json_is_object(full)) bad(&c, "an anchor without a 'full' object");
            m->full_bytes = g_u64(&c, full, "bytes");
            m->has_full_sha = g_sha(&c, full, m->full_sha);
            ferry__sync_key_version(want, run, m->version, m->id, FS_OBJ_FULL);
            check_key(&c, full, want);
        } else if (!json_is_null(full)) bad(&c, "a delta version with a 'full' object");
    }
    if (!c.rc) {
        if (m->version > 1) {
            if (!json_is_object(delta)) bad(&c, "a version above 1 without a 'delta' object");
            m->delta_bytes = g_u64(&c, delta, "bytes");
            m->has_delta_sha = g_sha(&c, delta, m->delta_sha);
            g_hash(&c, delta, "base_hash", m->base_hash);
            fs_ref base;
            base.version = g_u64(&c, delta, "base_version");
            g_id(&c, delta, "base_id", base.id);
            ferry__sync_key_version(want, run, m->version, m->id, FS_OBJ_DELTA);
            check_key(&c, delta, want);
            if (!c.rc && (base.version != m->prev.version || strcmp(base.id, m->prev.id)))
                bad(&c, "the delta's base is not the previous version");
        } else if (!json_is_null(delta)) bad(&c, "version 1 with a 'delta' object");
    }
    /* The links must describe a lineage: prev is version - 1, the anchor is
     * at or below the version (itself for an anchor), the previous anchor
     * below the anchor. */
    if (!c.rc) {
        if (!m->version || m->version > FS_VERSION_MAX) bad(&c, "version out of range (1 .. 2^63 - 2)");
        else if (m->version == 1 ? m->prev.version != 0 : m->prev.version != m->version - 1)
            bad(&c, "'prev' is not the previous version");
        else if (!m->anchor.ref.version || m->anchor.ref.version > m->version) bad(&c, "'anchor' is missing or above the version");
        else if (m->kind == FERRY_SYNC_ANCHOR &&
                 (m->anchor.ref.version != m->version || strcmp(m->anchor.ref.id, m->id) || m->anchor.bytes != m->full_bytes ||
                  m->anchor.cum != m->cum))
            bad(&c, "an anchor whose 'anchor' link is not itself");
        else if (m->kind == FERRY_SYNC_DELTA && m->anchor.ref.version == m->version) bad(&c, "a delta version names itself as anchor");
        else if (m->prev_anchor.ref.version >= m->anchor.ref.version && m->prev_anchor.ref.version)
            bad(&c, "'prev_anchor' is not below 'anchor'");
        else if (m->anchor.cum > m->cum || m->prev_anchor.cum > m->anchor.cum) bad(&c, "cumulative delta bytes decrease");
        else if (m->version == 1 && m->kind != FERRY_SYNC_ANCHOR) bad(&c, "version 1 is not an anchor");
    }
    json_decref(root);
    return c.rc;
}

/* The links of a manifest-2 (sharded version): the fields both formats
 * share, checked as ferry__sync_manifest_parse checks them.  Only GC and the run log
 * read a sharded manifest this way (lib/shard parses and verifies the rest),
 * so lib/sync never depends on lib/shard. */
/* The links of a manifest-2 (root: its members but the lists objects and
 * parts, which are walked an element at a time in text[sp]: json_split.h). */
static int manifest2_links_parse(const char *run, const char *key, json_t *root, const char *text, const fs_span sp[2],
                                 fs_manifest *m)
{
    pctx c = {key, 0};
    check_run(&c, root, run);
    g_run_id(&c, root, m->run_id);
    m->version = g_u64(&c, root, "version");
    g_id(&c, root, "id", m->id);
    m->kind = g_kind(&c, root);
    g_ref(&c, root, "prev", &m->prev);
    g_ref(&c, root, "anchor", &m->anchor.ref);
    g_hash(&c, root, "model_hash", m->model_hash);
    m->model_bytes = g_u64(&c, root, "model_bytes");
    m->created = (int64_t)g_u64(&c, root, "created_unix");
    g_publisher(&c, root, m->publisher);
    m->anchor_every = (uint32_t)g_u64(&c, root, "anchor_every");
    if (!c.rc && (!sp[0].len || !sp[1].len)) bad(&c, "field 'objects' or 'parts' is not an array");
    size_t pos = 0;
    fs_span el;
    int r = 0;
    char why[300];
    while (!c.rc && (r = ferry__sync_json_next(text + sp[0].off, sp[0].len, &pos, &el)) == 1) {
        json_t *o = ferry__sync_json_load(text + sp[0].off + el.off, el.len, FS_M2_ELEM_MAX, why, sizeof why);
        if (!json_is_object(o)) {
            json_decref(o);
            bad(&c, "an entry of 'objects' is not an object of at most 4 KiB");
            break;
        }
        int kind = g_kind(&c, o);
        uint64_t b = g_u64(&c, o, "bytes");
        uint64_t *sum = kind == FERRY_SYNC_ANCHOR ? &m->full_bytes : &m->delta_bytes;
        if (!c.rc && b > UINT64_MAX - *sum) bad(&c, "object sizes overflow");
        *sum += b;
        json_decref(o);
    }
    if (!c.rc && r < 0) bad(&c, "field 'objects' is not a valid JSON array");
    /* tensors: the distinct names of the parts, each part read without its tiles */
    static const char *const tiles[] = {"tiles", NULL};
    char last[FERRY_MAX_NAME + 1] = "";
    pos = 0;
    while (!c.rc && (r = ferry__sync_json_next(text + sp[1].off, sp[1].len, &pos, &el)) == 1) {
        json_t *part = NULL;
        fs_span ts;
        if (ferry__sync_json_split(text + sp[1].off + el.off, el.len, tiles, &ts, FS_M2_PART_MAX, &part, why, sizeof why)) {
            char w[340];
            snprintf(w, sizeof w, "a part: %s", why);
            bad(&c, w);
            break;
        }
        const char *name = g_str(&c, part, "name");
        if (!c.rc && strcmp(name, last)) m->tensors++;
        snprintf(last, sizeof last, "%s", name);
        json_decref(part);
    }
    if (!c.rc && r < 0) bad(&c, "field 'parts' is not a valid JSON array");
    if (!c.rc) {
        if (!m->version || m->version > FS_VERSION_MAX) bad(&c, "version out of range (1 .. 2^63 - 2)");
        else if (m->prev.version + 1 != m->version) bad(&c, "'prev' is not the previous version");
        else if (!m->anchor.ref.version || m->anchor.ref.version > m->version ||
                 (m->kind == FERRY_SYNC_ANCHOR) != (m->anchor.ref.version == m->version && !strcmp(m->anchor.ref.id, m->id)))
            bad(&c, "'anchor' does not name the version's nearest anchor");
    }
    return c.rc;
}

int ferry__sync_manifest_links_parse(const char *run, const char *key, const void *text, size_t n, fs_manifest *m)
{
    memset(m, 0, sizeof *m);
    /* split, not parsed whole: a manifest-2 may be large (json_split.h) */
    static const char *const lists[] = {"objects", "parts", NULL};
    fs_span sp[2];
    json_t *root = NULL;
    char why[300] = "";
    const char *format = NULL;
    if (!ferry__sync_json_split(text, n, lists, sp, FS_M2_TOP_MAX, &root, why, sizeof why))
        format = json_string_value(json_object_get(root, "format"));
    int rc;
    if (format && !strcmp(format, "ferry-manifest-2")) rc = manifest2_links_parse(run, key, root, text, sp, m);
    else if (n > FS_JSON_MAX)
        rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s: %s%slarger than %zu bytes, too large for a protocol record", key, why,
                         why[0] ? "; " : "", FS_JSON_MAX);
    else rc = ferry__sync_manifest_parse(run, key, text, n, m); /* its own errors, malformed text included */
    json_decref(root);
    return rc;
}

/* The rank objects of a sharded entry p ("objects", one per trainer rank):
 * each at the key the protocol gives it, its tile index section (16 bytes,
 * then 52 a tile: entry and leaf) ending the object, the sizes summing to
 * the entry's bytes; appended to ix->obj. */
static void index_objects(pctx *c, const char *run, json_t *e, fs_compaction *p, fs_index *ix)
{
    json_t *arr = json_object_get(e, "objects");
    size_t w = json_is_array(arr) ? json_array_size(arr) : 0;
    if (!w || w > FS_COMPACT_WORLD_MAX) {
        bad(c, "field 'objects' is not an array of 1 to 65536 rank objects");
        return;
    }
    fs_cobj *no = ferry__realloc(ix->obj, (ix->nobj + w) * sizeof *no);
    if (!no) {
        c->rc = FERRY_ERR_NOMEM;
        return;
    }
    ix->obj = no;
    p->world = (uint32_t)w;
    p->obj0 = ix->nobj;
    uint64_t sum = 0;
    for (size_t r = 0; r < w && !c->rc; r++) {
        json_t *o = json_array_get(arr, r);
        fs_cobj *x = &ix->obj[ix->nobj + r];
        memset(x, 0, sizeof *x);
        if (!json_is_object(o)) {
            bad(c, "a rank object of 'objects' is not an object");
            break;
        }
        char want[FS_KEY_CAP];
        ferry__sync_key_compact_rank(want, run, p->from, p->to, p->id, (uint32_t)r);
        check_key(c, o, want);
        x->bytes = g_u64(c, o, "bytes");
        x->index = g_u64(c, o, "index");
        x->tiles = g_u64(c, o, "tiles");
        const char *rh = g_str(c, o, "root");
        if (c->rc) break;
        if (!ferry__unhex(x->root, rh, 32) || rh[64]) bad(c, "a rank object's 'root' is not 64 lowercase hex digits");
        /* the section is the object's tail: 16 + 52 x tiles bytes (tiles
           bounded first, so that nothing overflows) */
        else if (!x->tiles || x->tiles > ((uint64_t)1 << 24) || x->index >= x->bytes || x->bytes - x->index != 16 + 52 * x->tiles)
            bad(c, "a rank object's 'index' and 'tiles' do not end it in its tile index");
        else if (!ferry__add_u64(sum, x->bytes, &sum)) bad(c, "the rank objects' sizes overflow");
    }
    if (!c->rc && sum != p->bytes) bad(c, "the rank objects' sizes do not sum to the entry's 'bytes'");
    if (!c->rc) ix->nobj += w;
}

int ferry__sync_index_parse(const char *run, const char *key, const void *text, size_t n, fs_index *ix)
{
    pctx c = {key, 0};
    memset(ix, 0, sizeof *ix);
    json_t *root = load(&c, text, n, "ferry-compactions-1");
    if (!root) return c.rc;
    check_run(&c, root, run);
    g_run_id(&c, root, ix->run_id);
    json_t *arr = json_object_get(root, "compactions");
    if (!c.rc && !json_is_array(arr)) bad(&c, "'compactions' is not an array");
    size_t cnt = c.rc ? 0 : json_array_size(arr);
    if (cnt && !(ix->c = ferry__calloc(cnt, sizeof *ix->c))) c.rc = FERRY_ERR_NOMEM;
    for (size_t i = 0; !c.rc && i < cnt; i++) {
        json_t *e = json_array_get(arr, i);
        fs_compaction *p = &ix->c[i];
        if (!json_is_object(e)) {
            bad(&c, "an entry is not an object");
            break;
        }
        p->from = g_u64(&c, e, "from");
        p->to = g_u64(&c, e, "to");
        g_id(&c, e, "from_id", p->from_id);
        g_id(&c, e, "to_id", p->to_id);
        g_id(&c, e, "id", p->id);
        p->bytes = g_u64(&c, e, "bytes");
        g_hash(&c, e, "base_hash", p->base_hash);
        g_hash(&c, e, "target_hash", p->target_hash);
        p->from_cum = g_u64(&c, e, "from_delta_bytes_cum");
        p->to_cum = g_u64(&c, e, "to_delta_bytes_cum");
        p->from_full_bytes = g_u64(&c, e, "from_full_bytes");
        p->created = (int64_t)g_u64(&c, e, "created_unix");
        p->has_sha = g_sha(&c, e, p->sha);
        if (!c.rc) {
            char want[FS_KEY_CAP];
            ferry__sync_key_compact(want, run, p->from, p->to, p->id);
            check_key(&c, e, want);
        }
        if (!c.rc && (!p->from || p->from >= p->to || p->to > FS_VERSION_MAX || p->from_cum > p->to_cum))
            bad(&c, "an entry's range is empty or out of order");
        if (!c.rc && json_object_get(e, "objects")) index_objects(&c, run, e, p, ix);
        ix->n = i + 1;
    }
    json_decref(root);
    if (c.rc) ferry__sync_index_release(ix);
    return c.rc;
}

void ferry__sync_index_release(fs_index *ix)
{
    free(ix->c);
    free(ix->obj);
    ix->c = NULL;
    ix->obj = NULL;
    ix->n = ix->nobj = 0;
}

/* ---- reading from the store ---- */

static void count(fs_count *cnt, uint64_t bytes, bool manifest)
{
    if (!cnt) return;
    cnt->bytes += bytes;
    if (manifest) cnt->manifests++;
    else cnt->objects++;
}

int ferry__sync_record_seal(const ferry_keys *keys, char **text)
{
    if (!ferry_keys_can_sign(keys)) return FERRY_OK;
    char *sealed = NULL;
    int rc = ferry__sign_seal(keys, FS_DOM_RECORD, *text, strlen(*text), &sealed);
    free(*text);
    *text = sealed;
    return rc;
}

/* Small records are bounded by FS_JSON_MAX whatever the store's own limit;
 * the signature is checked (or only cut off) before anything is parsed:
 * *body_len is the body's length. */
static int get_small_if(ferry_store *st, const char *key, const ferry_keys *keys, fs_count *cnt, void **data, size_t *size,
                        size_t *body_len, char etag[FERRY_STORE_ETAG_MAX], const char *if_none_match, bool *unchanged)
{
    ferry_store_stat ss;
    int same = 0;
    /* bounded in the GET itself: a larger object is refused before it is
     * downloaded, and not read again */
    int rc = ferry_store_get_if_changed(st, key, if_none_match, FS_JSON_MAX, data, size, &same, &ss);
    if (rc == FERRY_ERR_LIMIT)
        return ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s: larger than %zu bytes, too large for a protocol record", key, FS_JSON_MAX);
    if (rc) return rc;
    count(cnt, *size, true);
    if (unchanged) *unchanged = same;
    if (same) return FERRY_OK; /* what the caller holds, verified when it was read */
    bool is_signed;
    rc = ferry__sign_open(keys, FS_DOM_RECORD, key, *data, *size, body_len, &is_signed);
    if (rc) {
        ferry_free(*data);
        *data = NULL;
        return rc;
    }
    if (etag) memcpy(etag, ss.etag, FERRY_STORE_ETAG_MAX);
    return FERRY_OK;
}

static int get_small(ferry_store *st, const char *key, const ferry_keys *keys, fs_count *cnt, void **data, size_t *size,
                     size_t *body_len, char etag[FERRY_STORE_ETAG_MAX])
{
    return get_small_if(st, key, keys, cnt, data, size, body_len, etag, NULL, NULL);
}

/* A manifest record's body (its seal opened) parsed and checked as the
 * manifest of version/id under key. */
static int manifest_checked(const char *run, const char *key, const ferry_keys *keys, const void *d, size_t body,
                            uint64_t version, const char *id, fs_manifest *out)
{
    int rc = ferry__sync_manifest_parse(run, key, d, body, out);
    if (!rc && (out->version != version || strcmp(out->id, id)))
        rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s: holds the manifest of version %llu id %s", key,
                         (unsigned long long)out->version, out->id);
    if (!rc && ferry__sign_keys_enforce(keys) &&
        ((out->kind == FERRY_SYNC_ANCHOR && !out->has_full_sha) || (out->version > 1 && !out->has_delta_sha)))
        rc = ferry__fail(FERRY_ERR_SIG_DIGEST, "%s: a signed manifest without the SHA-256 of each object it lists", key);
    return rc;
}

/* HEAD's copy of the manifest it names ("manifest_record": the stored
 * record, seal included), checked exactly as that manifest fetched from the
 * store would be, and agreeing with HEAD on the model hash.  One that is
 * absent or does not verify is ignored: the reader fetches the manifest,
 * which must then verify on its own, so a HEAD can make a reader trust
 * nothing it would not have trusted before. */
static void head_inline(const char *run, const ferry_keys *keys, json_t *root, fs_head *h)
{
    h->has_manifest = false;
    json_t *rec = json_object_get(root, "manifest_record");
    if (json_is_string(rec)) {
        char key[FS_KEY_CAP];
        ferry__sync_key_version(key, run, h->version, h->id, FS_OBJ_MANIFEST);
        size_t body;
        bool is_signed;
        const char *r = json_string_value(rec);
        size_t len = json_string_length(rec);
        if (!ferry__sign_open(keys, FS_DOM_RECORD, key, r, len, &body, &is_signed) &&
            !manifest_checked(run, key, keys, r, body, h->version, h->id, &h->manifest) &&
            !memcmp(h->manifest.model_hash, h->model_hash, 16) && !strcmp(h->manifest.run_id, h->run_id))
            h->has_manifest = true;
        ferry__clear_error();
    }
}

/* if_none_match: the etag of the HEAD *h holds (a poller's); when HEAD still
 * has it, *h is left as it is and *unchanged set. */
static int head_read(ferry_store *st, const char *run, const ferry_keys *keys, fs_count *cnt, fs_head *h,
                     char etag[FERRY_STORE_ETAG_MAX], void **text, size_t *n, const char *if_none_match, bool *unchanged)
{
    char key[FS_KEY_CAP];
    ferry__sync_key_head(key, run);
    int rc = FERRY_OK;
    for (int attempt = 0; attempt < 3; attempt++) {
        void *d;
        size_t nd, body;
        bool same = false;
        if (attempt) ferry__sleep_ms(50);
        rc = get_small_if(st, key, keys, cnt, &d, &nd, &body, etag, if_none_match, &same);
        if (!rc && same) {
            *unchanged = true;
            return FERRY_OK;
        }
        if (!rc) {
            json_t *root = NULL;
            rc = head_parse(run, key, d, body, h, &root);
            if (!rc) head_inline(run, keys, root, h);
            json_decref(root);
            if (!rc && text) {
                *text = d;
                *n = nd;
                d = NULL;
            }
            ferry_free(d);
        }
        /* a HEAD caught mid-write looks malformed or cut (a signed one: its
           trailer malformed or not matching): read it again */
        if (rc != FERRY_ERR_SYNC_MANIFEST && rc != FERRY_ERR_SIG_MALFORMED && rc != FERRY_ERR_SIG_INVALID) return rc;
    }
    return rc;
}

int ferry__sync_head_read_raw(ferry_store *st, const char *run, const ferry_keys *keys, fs_count *cnt, fs_head *h,
                              char etag[FERRY_STORE_ETAG_MAX], void **text, size_t *n)
{
    return head_read(st, run, keys, cnt, h, etag, text, n, NULL, NULL);
}

int ferry__sync_head_read(ferry_store *st, const char *run, const ferry_keys *keys, fs_count *cnt, fs_head *h,
                 char etag[FERRY_STORE_ETAG_MAX])
{
    return ferry__sync_head_read_raw(st, run, keys, cnt, h, etag, NULL, NULL);
}

int ferry__sync_head_poll(ferry_store *st, const char *run, const ferry_keys *keys, fs_count *cnt, fs_head *h,
                          char etag[FERRY_STORE_ETAG_MAX])
{
    char held[FERRY_STORE_ETAG_MAX];
    memcpy(held, etag, FERRY_STORE_ETAG_MAX);
    bool same = false;
    int rc = head_read(st, run, keys, cnt, h, etag, NULL, NULL, held, &same);
    if (rc) etag[0] = 0; /* *h is no longer what HEAD holds */
    return rc;
}

int ferry__sync_want_sha(const ferry_keys *keys, const char *key, bool has, const uint8_t sha[32], const uint8_t **out)
{
    *out = NULL;
    if (!ferry__sign_keys_enforce(keys)) return FERRY_OK;
    if (!has) return ferry__fail(FERRY_ERR_SIG_DIGEST, "%s: its signed record gives no SHA-256 for it", key);
    *out = sha;
    return FERRY_OK;
}

int ferry__sync_manifest_links(ferry_store *st, const char *run, const ferry_keys *keys, uint64_t version, const char *id,
                      fs_manifest *out)
{
    char key[FS_KEY_CAP];
    ferry__sync_key_version(key, run, version, id, FS_OBJ_MANIFEST);
    memset(out, 0, sizeof *out);
    void *d;
    size_t n, body;
    /* bounded in the GET itself: a manifest-2 lists every tile, so it may
     * exceed FS_JSON_MAX, but never FS_MANIFEST2_MAX */
    int rc = ferry_store_get_max(st, key, FS_MANIFEST2_MAX, &d, &n, NULL);
    if (rc == FERRY_ERR_LIMIT)
        return ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s: larger than %zu bytes, too large for a manifest", key, FS_MANIFEST2_MAX);
    if (rc) return rc;
    bool is_signed;
    if (!(rc = ferry__sign_open(keys, FS_DOM_RECORD, key, d, n, &body, &is_signed))) rc = ferry__sync_manifest_links_parse(run, key, d, body, out);
    ferry_free(d);
    if (!rc && (out->version != version || strcmp(out->id, id)))
        rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s: holds the manifest of another version", key);
    return rc;
}

int ferry__sync_manifest_read(ferry_store *st, const char *run, const ferry_keys *keys, uint64_t version, const char *id,
                     fs_count *cnt, fs_manifest *out)
{
    char key[FS_KEY_CAP];
    ferry__sync_key_version(key, run, version, id, FS_OBJ_MANIFEST);
    void *d;
    size_t n, body;
    int rc = get_small(st, key, keys, cnt, &d, &n, &body, NULL);
    if (rc) return rc;
    rc = manifest_checked(run, key, keys, d, body, version, id, out);
    ferry_free(d);
    return rc;
}

int ferry__sync_index_read(ferry_store *st, const char *run, const ferry_keys *keys, fs_count *cnt, fs_index *out,
                  char etag[FERRY_STORE_ETAG_MAX])
{
    char key[FS_KEY_CAP];
    ferry__sync_key_index(key, run);
    memset(out, 0, sizeof *out);
    void *d;
    size_t n, body;
    int rc = get_small(st, key, keys, cnt, &d, &n, &body, etag);
    if (rc == FERRY_ERR_STORE_NOT_FOUND) {
        if (etag) etag[0] = 0;
        ferry__clear_error();
        return FERRY_OK;
    }
    if (rc) return rc;
    rc = ferry__sync_index_parse(run, key, d, body, out);
    ferry_free(d);
    /* (a sharded entry's objects are bound by the roots it lists) */
    for (size_t i = 0; !rc && ferry__sign_keys_enforce(keys) && i < out->n; i++)
        if (!out->c[i].has_sha && !out->c[i].world) rc = ferry__fail(FERRY_ERR_SIG_DIGEST, "%s: entry %zu gives no SHA-256", key, i);
    if (rc) ferry__sync_index_release(out);
    return rc;
}

int ferry__sync_object_get(ferry_store *st, const char *key, uint64_t want_size, const uint8_t *sha, fs_count *cnt, void **data,
                  size_t *size)
{
    /* Never more than the manifest declares (a larger object stops the
     * download with FERRY_ERR_LIMIT); a declared size the memory cannot
     * hold is a rejected object too, so another path is tried. */
    int rc = ferry_store_get_max(st, key, want_size ? want_size : 1, data, size, NULL);
    if (rc == FERRY_ERR_NOMEM)
        return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: its manifest declares %llu bytes, more than this process can allocate",
                           key, (unsigned long long)want_size);
    if (rc == FERRY_ERR_LIMIT) /* with a signed digest to check, a forgery (as below) */
        return sha ? ferry__fail(FERRY_ERR_SIG_DIGEST, "%s: larger than the %llu bytes its signed manifest declares (replaced)", key,
                                 (unsigned long long)want_size)
                   : ferry__context(rc, "%s: larger than the %llu bytes its manifest declares", key, (unsigned long long)want_size);
    if (rc) return rc;
    count(cnt, *size, false);
    uint8_t d[32];
    /* with a signed digest to check, any difference is a forgery until
     * shown otherwise: FERRY_ERR_SIG_DIGEST, whatever the size */
    if (*size != want_size)
        rc = ferry__fail(sha ? FERRY_ERR_SIG_DIGEST : FERRY_ERR_SYNC_CORRUPT,
                         "%s: %zu bytes, its %smanifest says %llu (truncated or replaced)", key, *size, sha ? "signed " : "",
                         (unsigned long long)want_size);
    else if (sha && !(rc = ferry__sha256(*data, *size, d)) && memcmp(d, sha, 32))
        rc = ferry__fail(FERRY_ERR_SIG_DIGEST, "%s: SHA-256 is not the one its signed manifest gives (replaced)", key);
    if (rc) {
        ferry_free(*data);
        *data = NULL;
    }
    return rc;
}
