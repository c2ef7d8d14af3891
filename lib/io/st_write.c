/* safetensors writer: ferry_model_save.
 *
 * Output: u64 N | header | tensor data in name order, contiguous from 0.
 * The header is compact JSON in the reference serializer's shape:
 *   {"__metadata__":{...},"name":{"dtype":"BF16","shape":[..],"data_offsets":[b,e]},...}
 * ("__metadata__" only when the model has metadata), padded with spaces to
 * a multiple of 8 bytes as the reference does.  Name order (not the
 * reference's dtype-then-name order) keeps the file in the order of the
 * model hash; a tensor after an odd-sized one may then be unaligned, which
 * every reader must accept anyway.
 *
 * Everything the reader would reject is refused before writing, so a saved
 * file always opens again with the same model hash: names or metadata that
 * are not valid UTF-8 and a tensor named "__metadata__" (FERRY_ERR_ARG),
 * integers above INT64_MAX (FERRY_ERR_UNSUPPORTED: JSON numbers the reader
 * cannot hold), a header over 100,000,000 bytes (FERRY_ERR_LIMIT). */
#include "io.h"

#include <stdlib.h>

/* An integer for the header; fails where jansson's int64 cannot hold it. */
static int put_u64(json_t *arr, uint64_t v, const char *name)
{
    if (v > INT64_MAX)
        return ferry__fail(FERRY_ERR_UNSUPPORTED, "tensor '%.200s': %llu does not fit a JSON integer", name,
                           (unsigned long long)v);
    return json_array_append_new(arr, json_integer((json_int_t)v)) ? FERRY_ERR_NOMEM : FERRY_OK;
}

/* The header entry of one tensor whose data starts at *offset (advanced). */
static int tensor_entry(const ferry_tensor *t, uint64_t *offset, json_t **out)
{
    json_t *e = json_object(), *shape = json_array(), *offs = json_array();
    json_t *dtype = json_string(ferry_dtype_name(t->dtype));
    int rc = e && shape && offs && dtype ? FERRY_OK : FERRY_ERR_NOMEM;
    for (uint32_t d = 0; d < t->ndim && !rc; d++) rc = put_u64(shape, t->shape[d], t->name);
    uint64_t end;
    if (!rc && !ferry__add_u64(*offset, t->nbytes, &end))
        rc = ferry__fail(FERRY_ERR_UNSUPPORTED, "tensor '%.200s': data offset overflows", t->name);
    if (!rc) rc = put_u64(offs, *offset, t->name);
    if (!rc) rc = put_u64(offs, end, t->name);
    /* json_object_set_new takes the value even when it fails. */
    if (!rc && (json_object_set_new(e, "dtype", dtype) | json_object_set_new(e, "shape", shape) |
                json_object_set_new(e, "data_offsets", offs)))
        rc = FERRY_ERR_NOMEM;
    else if (rc) {
        json_decref(dtype);
        json_decref(shape);
        json_decref(offs);
    }
    if (rc) {
        json_decref(e);
        return rc == FERRY_ERR_NOMEM ? ferry__fail(rc, "tensor '%.200s': out of memory building the header", t->name)
                                     : rc;
    }
    *offset = end;
    *out = e;
    return FERRY_OK;
}

static int metadata_object(const ferry_model *m, json_t **out)
{
    json_t *md = json_object();
    if (!md) return FERRY_ERR_NOMEM;
    for (size_t i = 0; i < ferry_model_metadata_count(m); i++) {
        const char *k, *v;
        ferry_model_metadata(m, i, &k, &v);
        /* jansson validates UTF-8 in both and returns NULL / -1 if not. */
        if (json_object_set_new(md, k, json_string(v))) {
            json_decref(md);
            return ferry__fail(FERRY_ERR_ARG, "metadata '%.200s': key or value is not valid UTF-8", k);
        }
    }
    *out = md;
    return FERRY_OK;
}

/* The whole header object, in output order. */
static int build_header(const ferry_model *m, json_t **out)
{
    json_t *root = json_object();
    if (!root) return FERRY_ERR_NOMEM;
    int rc = FERRY_OK;
    if (ferry_model_metadata_count(m)) {
        json_t *md = NULL;
        rc = metadata_object(m, &md);
        if (!rc && json_object_set_new(root, "__metadata__", md)) rc = FERRY_ERR_NOMEM;
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < ferry_model_count(m) && !rc; i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        if (strcmp(t->name, "__metadata__") == 0) {
            rc = ferry__fail(FERRY_ERR_ARG, "a tensor named '__metadata__' cannot be saved as safetensors");
            break;
        }
        json_t *e = NULL;
        rc = tensor_entry(t, &offset, &e);
        if (!rc && json_object_set_new(root, t->name, e))
            rc = ferry__fail(FERRY_ERR_ARG, "tensor '%.200s': name is not valid UTF-8", t->name);
    }
    if (rc) {
        json_decref(root);
        return rc;
    }
    *out = root;
    return FERRY_OK;
}

int ferry__st_header(const ferry_model *m, char **out, size_t *len)
{
    json_t *root = NULL;
    int rc = build_header(m, &root);
    if (rc) return rc;
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!s) return ferry__fail(FERRY_ERR_NOMEM, "out of memory serializing the header");
    size_t n = strlen(s), padded = n + (8 - n % 8) % 8;
    if (padded > FERRY__ST_MAX_HEADER) {
        free(s);
        return ferry__fail(FERRY_ERR_LIMIT, "header of %zu bytes exceeds the safetensors bound of %u", padded,
                           FERRY__ST_MAX_HEADER);
    }
    char *h = ferry__realloc(s, padded);
    if (!h) {
        free(s);
        return FERRY_ERR_NOMEM;
    }
    memset(h + n, ' ', padded - n);
    *out = h;
    *len = padded;
    return FERRY_OK;
}

int ferry_model_save(const ferry_model *m, const char *path)
{
    if (!m || !path) return ferry__fail(FERRY_ERR_ARG, "ferry_model_save: NULL argument");
    char *hdr = NULL;
    size_t hlen = 0;
    int rc = ferry__st_header(m, &hdr, &hlen);
    if (rc) return ferry__context(rc, "%s", path);

    /* One write part per tensor: the data goes straight from the model
     * (an mmap, say) to the file without a staging copy. */
    size_t n = ferry_model_count(m), nparts = n + 2;
    const void **parts = ferry__calloc(nparts, sizeof *parts);
    size_t *sizes = ferry__calloc(nparts, sizeof *sizes);
    if (!parts || !sizes) {
        rc = FERRY_ERR_NOMEM;
        goto done;
    }
    uint8_t len8[8];
    ferry__put64(len8, hlen);
    parts[0] = len8;
    sizes[0] = 8;
    parts[1] = hdr;
    sizes[1] = hlen;
    for (size_t i = 0; i < n; i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        parts[i + 2] = t->data;
        sizes[i + 2] = (size_t)t->nbytes; /* in memory, so it fits a size_t */
    }
    rc = ferry__write_file_atomic(path, (const void *const *)parts, sizes, nparts);
done:
    free(parts);
    free(sizes);
    free(hdr);
    return rc;
}
