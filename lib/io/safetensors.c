/* safetensors reader: validation of the header and the data layout, mmap of
 * single files, and ferry_model_open's choice between a file, a directory
 * and a sharded index.
 *
 * File layout: u64 N (little-endian) | N bytes of JSON header | data.
 * The header is one JSON object; each key is a tensor name mapped to
 *   {"dtype": "BF16", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
 * with offsets relative to the start of the data, except the optional key
 * "__metadata__", a map of strings to strings.
 *
 * Rules (those of huggingface/safetensors, plus the '{' start it plans for
 * 0.4) and the code each failure returns, checked in this order:
 *   file < 8 bytes, or N > file size - 8           FERRY_ERR_ST_TRUNCATED
 *   N == 0, or N > 100,000,000                      FERRY_ERR_ST_HEADER_SIZE
 *   header does not start with '{', is not UTF-8,
 *     not well-formed JSON, or has bytes after the
 *     object other than whitespace (padding)        FERRY_ERR_ST_JSON
 *   a key appears twice in one object               FERRY_ERR_ST_DUPLICATE
 * then per entry, in header order:
 *   entry not an object, unknown field in it        FERRY_ERR_ST_JSON
 *   __metadata__ not an object of strings           FERRY_ERR_ST_METADATA
 *   dtype missing, not a string or unknown          FERRY_ERR_ST_DTYPE
 *   shape missing, not an array of integers >= 0,
 *     or elements x bits overflows 64 bits          FERRY_ERR_ST_SHAPE
 *   data_offsets not [begin, end] integers >= 0
 *     with begin <= end                             FERRY_ERR_ST_OFFSETS
 *   elements x bits not whole bytes, or
 *     end - begin != elements x bits / 8            FERRY_ERR_ST_SIZE
 * then over the tensors sorted by (begin, end, name):
 *   begin != end of the previous (0 for the first):
 *     a gap or an overlap                           FERRY_ERR_ST_OFFSETS
 *   end > data size (the file is shorter than its
 *     own header says)                              FERRY_ERR_ST_TRUNCATED
 *   last end < data size                            FERRY_ERR_ST_TRAILING
 * So "out of bounds" is reported as ST_TRUNCATED whenever the tensor table
 * is otherwise consistent: a cut download reads as truncated.
 *
 * Valid files ferry's model cannot represent return FERRY_ERR_UNSUPPORTED:
 * more than FERRY_MAX_DIMS dimensions, an empty name, a name longer than
 * FERRY_MAX_NAME bytes.  jansson cannot hold integers above INT64_MAX nor
 * keys or strings containing U+0000; those headers fail as ST_JSON (no real
 * file can have such offsets, and names with NUL cannot be C strings).
 *
 * Tensor data is not required to be aligned (the reference pads the header
 * to 8 bytes but does not demand it): readers of ferry_tensor.data must not
 * assume more than byte alignment. */
#include "io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* One tensor entry of the header, validated field by field; name and shape
 * point into the parsed JSON, which outlives the records. */
typedef struct st_rec {
    const char *name;
    const json_t *shape; /* array of ndim non-negative integers */
    ferry_dtype dtype;
    uint32_t ndim;
    uint64_t nbytes;
    uint64_t begin, end;
} st_rec;

/* Context of one parse, for error messages. */
typedef struct st_ctx {
    const char *label;
    const uint8_t *data; /* start of the data section */
    uint64_t data_size;
} st_ctx;

/* ---------------------------------------------------------------------- *
 * JSON helpers
 * ---------------------------------------------------------------------- */

/* A JSON integer >= 0 (jansson integers are int64, so it fits a u64). */
static bool json_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

int ferry__json_load_fail(const json_error_t *err, int code, const char *label, const char *what)
{
    if (json_error_code(err) == json_error_duplicate_key) code = FERRY_ERR_ST_DUPLICATE;
    else if (json_error_code(err) == json_error_out_of_memory) code = FERRY_ERR_NOMEM;
    return ferry__fail(code, "%s: %s: %s (byte %d)", label, what, err->text, err->position);
}

/* ---------------------------------------------------------------------- *
 * One header entry
 * ---------------------------------------------------------------------- */

static int parse_metadata(const st_ctx *c, const json_t *v, ferry_model *m)
{
    if (!json_is_object(v))
        return ferry__fail(FERRY_ERR_ST_METADATA, "%s: __metadata__ is not an object", c->label);
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        if (!json_is_string(val))
            return ferry__fail(FERRY_ERR_ST_METADATA, "%s: __metadata__ value of '%.200s' is not a string",
                               c->label, key);
        int rc = ferry_model_set_metadata(m, key, json_string_value(val));
        if (rc) return rc;
    }
    return FERRY_OK;
}

/* Only these three fields are allowed in a tensor entry. */
static int check_fields(const st_ctx *c, const char *name, const json_t *v)
{
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        (void)val;
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return ferry__fail(FERRY_ERR_ST_JSON, "%s: tensor '%.200s': unknown field '%.200s'", c->label, name, key);
    }
    return FERRY_OK;
}

static int parse_dtype(const st_ctx *c, const char *name, const json_t *v, ferry_dtype *out)
{
    if (!v) return ferry__fail(FERRY_ERR_ST_DTYPE, "%s: tensor '%.200s': dtype missing", c->label, name);
    if (!json_is_string(v))
        return ferry__fail(FERRY_ERR_ST_DTYPE, "%s: tensor '%.200s': dtype is not a string", c->label, name);
    if (ferry_dtype_parse(json_string_value(v), out))
        return ferry__fail(FERRY_ERR_ST_DTYPE, "%s: tensor '%.200s': unknown dtype '%.64s'", c->label, name,
                           json_string_value(v));
    return FERRY_OK;
}

/* Checks the shape and computes the tensor's size in bits (overflow-checked:
 * the reference's ValidationOverflow). */
static int parse_shape(const st_ctx *c, const char *name, const json_t *v, ferry_dtype dt, st_rec *r,
                       uint64_t *bits)
{
    if (!v) return ferry__fail(FERRY_ERR_ST_SHAPE, "%s: tensor '%.200s': shape missing", c->label, name);
    if (!json_is_array(v))
        return ferry__fail(FERRY_ERR_ST_SHAPE, "%s: tensor '%.200s': shape is not an array", c->label, name);
    uint64_t n = 1;
    size_t ndim = json_array_size(v);
    for (size_t i = 0; i < ndim; i++) {
        uint64_t d;
        if (!json_u64(json_array_get(v, i), &d))
            return ferry__fail(FERRY_ERR_ST_SHAPE, "%s: tensor '%.200s': shape[%zu] is not an integer >= 0",
                               c->label, name, i);
        if (!ferry__mul_u64(n, d, &n))
            return ferry__fail(FERRY_ERR_ST_SHAPE, "%s: tensor '%.200s': element count overflows at shape[%zu]",
                               c->label, name, i);
    }
    if (ndim > FERRY_MAX_DIMS)
        return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: tensor '%.200s': %zu dimensions (ferry holds at most %d)",
                           c->label, name, ndim, FERRY_MAX_DIMS);
    if (!ferry__mul_u64(n, ferry_dtype_bits(dt), bits))
        return ferry__fail(FERRY_ERR_ST_SHAPE, "%s: tensor '%.200s': size in bits overflows (%llu elements)",
                           c->label, name, (unsigned long long)n);
    r->shape = v;
    r->ndim = (uint32_t)ndim;
    return FERRY_OK;
}

static int parse_offsets(const st_ctx *c, const char *name, const json_t *v, st_rec *r)
{
    if (!v) return ferry__fail(FERRY_ERR_ST_OFFSETS, "%s: tensor '%.200s': data_offsets missing", c->label, name);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_u64(json_array_get(v, 0), &r->begin) ||
        !json_u64(json_array_get(v, 1), &r->end))
        return ferry__fail(FERRY_ERR_ST_OFFSETS, "%s: tensor '%.200s': data_offsets is not [begin, end] of integers >= 0",
                           c->label, name);
    if (r->begin > r->end)
        return ferry__fail(FERRY_ERR_ST_OFFSETS, "%s: tensor '%.200s': data_offsets begin %llu > end %llu", c->label,
                           name, (unsigned long long)r->begin, (unsigned long long)r->end);
    return FERRY_OK;
}

static int parse_entry(const st_ctx *c, const char *name, const json_t *v, st_rec *r)
{
    size_t len = strlen(name);
    if (len == 0 || len > FERRY_MAX_NAME)
        return ferry__fail(FERRY_ERR_UNSUPPORTED, "%s: tensor name of %zu bytes (ferry holds 1..%d)", c->label, len,
                           FERRY_MAX_NAME);
    if (!json_is_object(v))
        return ferry__fail(FERRY_ERR_ST_JSON, "%s: tensor '%.200s': entry is not an object", c->label, name);
    uint64_t bits = 0;
    int rc;
    if ((rc = check_fields(c, name, v)) || (rc = parse_dtype(c, name, json_object_get(v, "dtype"), &r->dtype)) ||
        (rc = parse_shape(c, name, json_object_get(v, "shape"), r->dtype, r, &bits)) ||
        (rc = parse_offsets(c, name, json_object_get(v, "data_offsets"), r)))
        return rc;
    if (bits % 8)
        return ferry__fail(FERRY_ERR_ST_SIZE, "%s: tensor '%.200s': %llu bits of %s is not a whole number of bytes",
                           c->label, name, (unsigned long long)bits, ferry_dtype_name(r->dtype));
    r->nbytes = bits / 8;
    if (r->end - r->begin != r->nbytes)
        return ferry__fail(FERRY_ERR_ST_SIZE, "%s: tensor '%.200s': data_offsets span %llu bytes, dtype and shape need %llu",
                           c->label, name, (unsigned long long)(r->end - r->begin), (unsigned long long)r->nbytes);
    r->name = name;
    return FERRY_OK;
}

/* ---------------------------------------------------------------------- *
 * Data layout: the tensors tile the data section exactly
 * ---------------------------------------------------------------------- */

static int cmp_by_offsets(const void *a, const void *b)
{
    const st_rec *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name); /* zero-size tensors may share offsets */
}

static int cmp_by_name(const void *a, const void *b)
{
    return strcmp(((const st_rec *)a)->name, ((const st_rec *)b)->name);
}

/* Sorts recs by offsets and checks they cover [0, data_size) with no gap,
 * overlap or excess. */
static int check_layout(const st_ctx *c, st_rec *recs, size_t n)
{
    qsort(recs, n, sizeof *recs, cmp_by_offsets);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const st_rec *r = &recs[i];
        if (r->begin != at)
            return ferry__fail(FERRY_ERR_ST_OFFSETS, "%s: tensor '%.200s': data_offsets begin %llu %s: the tensors "
                               "before it end at %llu", c->label, r->name, (unsigned long long)r->begin,
                               r->begin > at ? "leaves a gap" : "overlaps", (unsigned long long)at);
        if (r->end > c->data_size)
            return ferry__fail(FERRY_ERR_ST_TRUNCATED, "%s: tensor '%.200s': data_offsets end %llu exceeds data size %llu",
                               c->label, r->name, (unsigned long long)r->end, (unsigned long long)c->data_size);
        at = r->end;
    }
    if (at != c->data_size)
        return ferry__fail(FERRY_ERR_ST_TRAILING, "%s: %llu bytes after the last tensor (tensors end at %llu, data size %llu)",
                           c->label, (unsigned long long)(c->data_size - at), (unsigned long long)at,
                           (unsigned long long)c->data_size);
    return FERRY_OK;
}

/* Adds the validated tensors in name order, so that every insertion appends
 * (the model keeps names sorted; random order would be quadratic). */
static int add_tensors(const st_ctx *c, st_rec *recs, size_t n, ferry_model *m)
{
    qsort(recs, n, sizeof *recs, cmp_by_name);
    for (size_t i = 0; i < n; i++) {
        const st_rec *r = &recs[i];
        uint64_t shape[FERRY_MAX_DIMS];
        for (uint32_t d = 0; d < r->ndim; d++) json_u64(json_array_get(r->shape, d), &shape[d]);
        int rc = ferry__model_add(m, r->name, r->dtype, r->ndim, shape, c->data + r->begin, r->nbytes, false, false);
        if (rc) return ferry__context(rc, "%s", c->label);
    }
    return FERRY_OK;
}

/* Walks the header object: metadata and entries in header order, then the
 * layout over all tensors, then the model. */
static int parse_header(const st_ctx *c, const json_t *root, ferry_model *m)
{
    /* At most one record per key: bounded by the header size. */
    st_rec *recs = ferry__calloc(json_object_size(root), sizeof *recs);
    if (!recs) return FERRY_ERR_NOMEM;
    size_t n = 0;
    int rc = FERRY_OK;
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)root, key, val) {
        rc = strcmp(key, "__metadata__") == 0 ? parse_metadata(c, val, m) : parse_entry(c, key, val, &recs[n++]);
        if (rc) break;
    }
    if (!rc) rc = check_layout(c, recs, n);
    if (!rc) rc = add_tensors(c, recs, n, m);
    free(recs);
    return rc;
}

int ferry__st_parse_buffer(const uint8_t *buf, size_t size, const char *label, ferry_model **out)
{
    if (!out || (!buf && size)) return ferry__fail(FERRY_ERR_ARG, "ferry__st_parse_buffer: NULL argument");
    *out = NULL;
    if (!label) label = "safetensors";
    if (size < 8)
        return ferry__fail(FERRY_ERR_ST_TRUNCATED, "%s: %zu bytes, too short for the 8-byte header length", label, size);
    uint64_t n = ferry__le64(buf);
    if (n == 0 || n > FERRY__ST_MAX_HEADER)
        return ferry__fail(FERRY_ERR_ST_HEADER_SIZE, "%s: header length %llu not in 1..%u", label,
                           (unsigned long long)n, FERRY__ST_MAX_HEADER);
    if (n > size - 8)
        return ferry__fail(FERRY_ERR_ST_TRUNCATED, "%s: header length %llu exceeds the %zu bytes after it", label,
                           (unsigned long long)n, size - 8);
    const char *hdr = (const char *)buf + 8;
    if (hdr[0] != '{') return ferry__fail(FERRY_ERR_ST_JSON, "%s: header does not start with '{'", label);

    /* jansson checks UTF-8, rejects NUL, limits nesting depth and, without
     * JSON_DISABLE_EOF_CHECK, allows only whitespace after the object (the
     * space padding). */
    json_error_t err;
    json_t *root = json_loadb(hdr, (size_t)n, JSON_REJECT_DUPLICATES, &err);
    if (!root) return ferry__json_load_fail(&err, FERRY_ERR_ST_JSON, label, "header");

    st_ctx c = {.label = label, .data = buf + 8 + n, .data_size = size - 8 - n};
    ferry_model *m = NULL;
    int rc = ferry_model_create(&m);
    if (!rc) rc = parse_header(&c, root, m);
    json_decref(root);
    if (rc) {
        ferry_model_free(m);
        return rc;
    }
    *out = m;
    return FERRY_OK;
}

/* ---------------------------------------------------------------------- *
 * Files
 * ---------------------------------------------------------------------- */

int ferry__model_adopt_mappings(ferry_model *dst, ferry_model *src)
{
    if (!src->nmaps) return FERRY_OK;
    ferry__mapping *nm = ferry__realloc(dst->maps, (dst->nmaps + src->nmaps) * sizeof *nm);
    if (!nm) return FERRY_ERR_NOMEM;
    dst->maps = nm;
    memcpy(dst->maps + dst->nmaps, src->maps, src->nmaps * sizeof *nm);
    dst->nmaps += src->nmaps;
    src->nmaps = 0;
    return FERRY_OK;
}

int ferry__path_join(char *out, size_t cap, const char *dir, const char *name)
{
    int w = snprintf(out, cap, "%s/%s", dir, name);
    if (w < 0 || (size_t)w >= cap) return ferry__fail(FERRY_ERR_ARG, "%s/%s: path too long", dir, name);
    return FERRY_OK;
}

static int open_fail(const char *path, const char *what)
{
    int e = errno;
    return ferry__fail(e == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO, "%s: %s: %s", path, what, strerror(e));
}

int ferry__st_open_file(const char *path, ferry_model **out)
{
    *out = NULL;
    /* a FIFO planted where a shard should be is refused, never opened */
    struct stat st;
    int fd = ferry__open_input(path, &st);
    if (fd < 0) return -fd;
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return ferry__fail(FERRY_ERR_LIMIT, "%s: %lld bytes do not fit in memory", path, (long long)st.st_size);
    }
    size_t size = (size_t)st.st_size;
    if (size == 0) { /* mmap cannot map 0 bytes; the parser rejects it anyway */
        close(fd);
        return ferry__st_parse_buffer(NULL, 0, path, out);
    }
    /* A private read-only mapping: the model never writes through it.  If
     * another process truncates the file while it is mapped, accesses
     * fault (SIGBUS), as with every mmap reader; writers replace files by
     * rename, which leaves this mapping intact. */
    void *addr = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (addr == MAP_FAILED) return ferry__fail(FERRY_ERR_IO, "%s: mmap failed: %s", path, strerror(e));
    ferry_model *m = NULL;
    int rc = ferry__st_parse_buffer(addr, size, path, &m);
    if (!rc) rc = ferry__model_add_mapping(m, addr, size);
    if (rc) {
        ferry_model_free(m); /* frees tensors only: the mapping is not registered */
        munmap(addr, size);
        return rc;
    }
    *out = m;
    return FERRY_OK;
}

/* ---------------------------------------------------------------------- *
 * ferry_model_open: file, directory or index
 * ---------------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

static bool is_regular(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A directory is a checkpoint if it holds model.safetensors.index.json
 * (the Hugging Face name; it wins over everything else), or else exactly
 * one regular *.safetensors file.  Several *.safetensors without an index
 * are ambiguous (FERRY_ERR_ST_INDEX); none is FERRY_ERR_NOT_FOUND. */
static int open_dir(const char *dir, ferry_model **out)
{
    char path[4096];
    int rc = ferry__path_join(path, sizeof path, dir, "model.safetensors.index.json");
    if (rc) return rc;
    if (is_regular(path)) return ferry__st_open_index(path, out);

    DIR *d = opendir(dir);
    if (!d) return open_fail(dir, "cannot list");
    char found[4096] = "";
    size_t count = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char p[4096];
        if (!ends_with(de->d_name, ".safetensors") || ferry__path_join(p, sizeof p, dir, de->d_name) || !is_regular(p))
            continue;
        if (count++ == 0) memcpy(found, p, sizeof p);
    }
    closedir(d);
    if (count == 0)
        return ferry__fail(FERRY_ERR_NOT_FOUND, "%s: no model.safetensors.index.json and no *.safetensors file", dir);
    if (count > 1)
        return ferry__fail(FERRY_ERR_ST_INDEX, "%s: %zu *.safetensors files but no model.safetensors.index.json",
                           dir, count);
    return ferry__st_open_file(found, out);
}

int ferry_model_open(const char *path, ferry_model **out)
{
    if (!out) return ferry__fail(FERRY_ERR_ARG, "ferry_model_open: out is NULL");
    *out = NULL;
    if (!path) return ferry__fail(FERRY_ERR_ARG, "ferry_model_open: path is NULL");
    struct stat st;
    if (stat(path, &st)) return open_fail(path, "cannot open");
    if (S_ISDIR(st.st_mode)) return open_dir(path, out);
    if (!S_ISREG(st.st_mode)) return ferry__fail(FERRY_ERR_IO, "%s: not a regular file or directory", path);
    if (ends_with(path, ".index.json")) return ferry__st_open_index(path, out);
    return ferry__st_open_file(path, out);
}
