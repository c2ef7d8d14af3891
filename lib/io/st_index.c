/* Sharded checkpoints: model.safetensors.index.json
 *
 *   {"metadata": {"total_size": 123}, "weight_map": {"tensor": "shard-1.safetensors", ...}}
 *
 * The index is untrusted like the shards.  Rules (code on failure):
 *   - the index is a JSON object (FERRY_ERR_ST_INDEX; a repeated key is
 *     FERRY_ERR_ST_DUPLICATE); "weight_map" is an object of strings;
 *     "metadata", if present, is an object; other keys are ignored;
 *   - a shard name is a plain file name in the index's directory: non-empty,
 *     no '/', no '\\', no ".." (FERRY_ERR_ST_INDEX) — a hostile index must
 *     not reach files elsewhere;
 *   - every shard named opens and validates as a .safetensors file (a
 *     missing one is FERRY_ERR_ST_INDEX naming it; a corrupt one keeps its
 *     own FERRY_ERR_ST_* code);
 *   - every tensor of a shard is in the weight_map, mapped to that shard,
 *     and every weight_map entry is held by the shard it names
 *     (FERRY_ERR_ST_INDEX); a tensor held by two shards is
 *     FERRY_ERR_ST_DUPLICATE.
 *
 * The merged model borrows every shard's mapping.  Its metadata is the
 * union of the shards' __metadata__; where shards disagree on a key, the
 * first shard in file-name order wins (they normally all say
 * {"format": "pt"}).  The index's own "metadata" (total_size) is checked
 * for type only and not kept, so a sharded checkpoint hashes like the same
 * tensors saved as one file. */
#include "io.h"

#include <jansson.h>
#include <libgen.h>
#include <stdlib.h>

typedef struct shard {
    const char *file;   /* name as in the weight_map (owned by the JSON) */
    ferry_model *m;
} shard;

typedef struct index_ctx {
    const char *path;   /* the index file, for messages */
    const json_t *wm;   /* weight_map */
    shard *sh;          /* sorted by file name */
    size_t nsh;
} index_ctx;

static bool shard_name_ok(const char *s)
{
    return s[0] && !strchr(s, '/') && !strchr(s, '\\') && !strstr(s, "..");
}

static int cmp_shard(const void *a, const void *b)
{
    return strcmp(((const shard *)a)->file, ((const shard *)b)->file);
}

static shard *find_shard(const index_ctx *x, const char *file)
{
    shard key = {.file = file};
    return bsearch(&key, x->sh, x->nsh, sizeof key, cmp_shard);
}

/* Validates the weight_map's values and collects the distinct shard names
 * (sorted) into x->sh. */
static int collect_shards(index_ctx *x)
{
    size_t n = json_object_size(x->wm);
    x->sh = ferry__calloc(n, sizeof *x->sh);
    if (!x->sh) return FERRY_ERR_NOMEM;
    const char *name;
    const json_t *v;
    json_object_foreach((json_t *)x->wm, name, v) {
        if (!json_is_string(v))
            return ferry__fail(FERRY_ERR_ST_INDEX, "%s: weight_map entry '%.200s' is not a string", x->path, name);
        const char *file = json_string_value(v);
        if (!shard_name_ok(file))
            return ferry__fail(FERRY_ERR_ST_INDEX, "%s: weight_map entry '%.200s': shard name '%.200s' is not a plain "
                               "file name", x->path, name, file);
        x->sh[x->nsh++].file = file;
    }
    qsort(x->sh, x->nsh, sizeof *x->sh, cmp_shard);
    size_t k = 0; /* drop repeats: entries of one shard are adjacent now */
    for (size_t i = 0; i < x->nsh; i++)
        if (k == 0 || strcmp(x->sh[k - 1].file, x->sh[i].file)) x->sh[k++] = x->sh[i];
    x->nsh = k;
    return FERRY_OK;
}

static int open_shards(index_ctx *x)
{
    char *copy = ferry__strdup(x->path);
    if (!copy) return FERRY_ERR_NOMEM;
    const char *dir = dirname(copy);
    int rc = FERRY_OK;
    for (size_t i = 0; i < x->nsh && !rc; i++) {
        char p[4096];
        rc = ferry__path_join(p, sizeof p, dir, x->sh[i].file);
        if (!rc) rc = ferry__st_open_file(p, &x->sh[i].m);
        if (rc == FERRY_ERR_NOT_FOUND)
            rc = ferry__fail(FERRY_ERR_ST_INDEX, "%s: shard '%.200s' named in the weight_map does not exist", x->path,
                             x->sh[i].file);
    }
    free(copy);
    return rc;
}

/* Both directions of the weight_map <-> shards correspondence. */
static int check_consistency(const index_ctx *x)
{
    for (size_t i = 0; i < x->nsh; i++) {
        for (size_t j = 0; j < ferry_model_count(x->sh[i].m); j++) {
            const char *name = ferry_model_tensor(x->sh[i].m, j)->name;
            const json_t *v = json_object_get(x->wm, name);
            if (!v)
                return ferry__fail(FERRY_ERR_ST_INDEX, "%s: tensor '%.200s' of shard '%.200s' is not in the weight_map",
                                   x->path, name, x->sh[i].file);
            const char *want = json_string_value(v);
            if (strcmp(want, x->sh[i].file) == 0) continue;
            const shard *other = find_shard(x, want);
            if (other && ferry_model_find(other->m, name))
                return ferry__fail(FERRY_ERR_ST_DUPLICATE, "%s: tensor '%.200s' is in shards '%.200s' and '%.200s'",
                                   x->path, name, x->sh[i].file, want);
            return ferry__fail(FERRY_ERR_ST_INDEX, "%s: tensor '%.200s' is in shard '%.200s' but the weight_map puts it "
                               "in '%.200s'", x->path, name, x->sh[i].file, want);
        }
    }
    const char *name;
    const json_t *v;
    json_object_foreach((json_t *)x->wm, name, v) {
        const shard *s = find_shard(x, json_string_value(v));
        if (!ferry_model_find(s->m, name))
            return ferry__fail(FERRY_ERR_ST_INDEX, "%s: weight_map puts tensor '%.200s' in shard '%.200s', which does "
                               "not hold it", x->path, name, s->file);
    }
    return FERRY_OK;
}

static int cmp_tensor_ptr(const void *a, const void *b)
{
    return strcmp((*(const ferry_tensor *const *)a)->name, (*(const ferry_tensor *const *)b)->name);
}

/* Builds the merged model: tensors borrowed from the shards (added in name
 * order so that each insertion appends), metadata first-shard-wins, then
 * the mappings moved over so the merged model outlives the shards. */
static int merge(const index_ctx *x, ferry_model *m)
{
    size_t total = 0;
    for (size_t i = 0; i < x->nsh; i++) total += ferry_model_count(x->sh[i].m);
    const ferry_tensor **all = ferry__calloc(total, sizeof *all);
    if (!all) return FERRY_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < x->nsh; i++)
        for (size_t j = 0; j < ferry_model_count(x->sh[i].m); j++) all[k++] = ferry_model_tensor(x->sh[i].m, j);
    qsort(all, total, sizeof *all, cmp_tensor_ptr);
    int rc = FERRY_OK;
    for (size_t i = 0; i < total && !rc; i++)
        rc = ferry__model_add(m, all[i]->name, all[i]->dtype, all[i]->ndim, all[i]->shape, all[i]->data,
                              all[i]->nbytes, false, false);
    free(all);
    for (size_t i = 0; i < x->nsh && !rc; i++) {
        for (size_t j = 0; j < ferry_model_metadata_count(x->sh[i].m) && !rc; j++) {
            const char *key, *value;
            ferry_model_metadata(x->sh[i].m, j, &key, &value);
            if (!ferry_model_metadata_get(m, key)) rc = ferry_model_set_metadata(m, key, value);
        }
    }
    for (size_t i = 0; i < x->nsh && !rc; i++) rc = ferry__model_adopt_mappings(m, x->sh[i].m);
    return rc;
}

static int parse_index(index_ctx *x, const json_t *root)
{
    if (!json_is_object(root)) return ferry__fail(FERRY_ERR_ST_INDEX, "%s: not a JSON object", x->path);
    const json_t *md = json_object_get(root, "metadata");
    if (md && !json_is_object(md)) return ferry__fail(FERRY_ERR_ST_INDEX, "%s: metadata is not an object", x->path);
    x->wm = json_object_get(root, "weight_map");
    if (!json_is_object(x->wm))
        return ferry__fail(FERRY_ERR_ST_INDEX, "%s: weight_map missing or not an object", x->path);
    return FERRY_OK;
}

int ferry__st_open_index(const char *path, ferry_model **out)
{
    *out = NULL;
    uint8_t *text;
    size_t len;
    int rc = ferry__read_file(path, FERRY__ST_MAX_HEADER, &text, &len);
    if (rc) return rc;
    json_error_t err;
    json_t *root = json_loadb((const char *)text, len, JSON_REJECT_DUPLICATES, &err);
    free(text);
    if (!root) return ferry__json_load_fail(&err, FERRY_ERR_ST_INDEX, path, "index");
    index_ctx x = {.path = path};
    ferry_model *m = NULL;
    if (!(rc = parse_index(&x, root)) && !(rc = collect_shards(&x)) && !(rc = open_shards(&x)) &&
        !(rc = check_consistency(&x)) && !(rc = ferry_model_create(&m)))
        rc = merge(&x, m);
    /* m borrows from the shards' mappings only once merge() moved them, so
     * on failure m goes first, then the shards (which still own theirs). */
    if (rc) ferry_model_free(m);
    for (size_t i = 0; i < x.nsh; i++) ferry_model_free(x.sh[i].m);
    free(x.sh);
    json_decref(root);
    if (rc) return rc;
    *out = m;
    return FERRY_OK;
}
