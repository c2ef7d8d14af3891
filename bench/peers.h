/*
 * peers.h — our own C implementations of the four peer wire formats that
 * ferry is measured against (DESIGN.md, "Wire formats of the peers").  Each
 * has an encoder and a decoder; the bench checks that every decoder rebuilds
 * NEW exactly from OLD and the patch, so a size is only reported for a patch
 * that really works.
 *
 *   trl    TRL delta sync "gap_delta": a safetensors file with NAME.idx
 *          (gaps, U16 or U32) and NAME.val (raw new values) per changed
 *          tensor; uncompressed.  Decoded by reading that file back through
 *          ferry_model_open, so it is a real safetensors file.
 *   pulse  PULSE / grail sparse_codec v3.1: 2-D COO, row deltas
 *          (u8/u16/i32), column deltas within a row (u16/i32), raw values;
 *          u32 header length + JSON header + data, one zstd frame, level 1.
 *   skyrl  SkyRL: per tensor the dense XOR of old and new, one zstd frame at
 *          level 3 each; a JSON manifest with version, base_version and each
 *          tensor's XXH3-128 (checked on decode).
 *   slime  slime "deltas_zstd": per changed tensor u16 gaps (u32 fallback)
 *          and raw values, one zstd frame at level 1 per tensor, behind a
 *          small JSON header.
 *
 * All four work on the words of bench_util.h: 2 bytes for BF16/F16, the
 * element width for other byte-aligned dtypes (F32 norms use the same scheme
 * on 4-byte words), raw bytes for sub-byte dtypes.  Tensors must match by
 * name, dtype and shape on both sides (the driver checks it): the peers
 * describe per-step deltas of one architecture, not structure changes.
 *
 * Every size counts every byte a receiver would need besides the base:
 * headers, manifests and length prefixes included.
 */
#ifndef BENCH_PEERS_H
#define BENCH_PEERS_H

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <unistd.h>
#include "xxh.h" /* the library's XXH3 shim (dispatched where libxxhash has it, vector state cleaned after) */
#include <zstd.h>

#include "bench_util.h"

typedef struct peer_ctx {
    const char *tmpdir;   /* scratch directory (TRL writes its file there) */
} peer_ctx;

typedef struct peer_format {
    const char *name;     /* short column name: "trl", "pulse", ... */
    const char *title;    /* one-line description */
    /* Appends the patch OLD -> NEW of pair to out (out starts empty). */
    int (*encode)(const peer_ctx *ctx, const bench_pair *pair, bench_buf *out, bench_err *err);
    /* Applies patch to base (whose cur pointers are NULL): out[i] holds a copy
     * of base->t[i].old on entry and the rebuilt tensor on success. */
    int (*decode)(const peer_ctx *ctx, const bench_pair *base, const uint8_t *patch,
                  size_t size, uint8_t *const *out, bench_err *err);
} peer_format;

/* =====================================================================
 * Shared pieces: JSON in and out, zstd frames, gap coding.
 * ===================================================================== */

/* Serialises a JSON value compactly, keys in insertion order (the output of
 * Python's json.dumps(separators=(",", ":")) and of serde_json for ASCII
 * names), appending to out.  Consumes the reference to v. */
static inline int peer_json_append(bench_buf *out, json_t *v, bench_err *err)
{
    if (!v) return bench_fail(err, "out of memory building a JSON header");
    char *s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
    json_decref(v);
    if (!s) return bench_fail(err, "out of memory serialising a JSON header");
    int rc = bench_buf_append(out, s, strlen(s));
    free(s);
    return rc ? bench_fail(err, "out of memory") : 0;
}

static inline json_t *peer_json_shape(const bench_tensor *t)
{
    json_t *a = json_array();
    for (uint32_t d = 0; a && d < t->ndim; d++)
        json_array_append_new(a, json_integer((json_int_t)t->shape[d]));
    return a;
}

/* Reads a non-negative integer field of a JSON object. */
static inline int peer_json_u64(const json_t *obj, const char *key, uint64_t *v, bench_err *err)
{
    json_t *x = json_object_get(obj, key);
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        return bench_fail(err, "header field '%s' missing or not a non-negative integer", key);
    *v = (uint64_t)json_integer_value(x);
    return 0;
}

static inline int peer_json_str(const json_t *obj, const char *key, const char **v, bench_err *err)
{
    json_t *x = json_object_get(obj, key);
    if (!json_is_string(x)) return bench_fail(err, "header field '%s' missing or not a string", key);
    *v = json_string_value(x);
    return 0;
}

/* The shape array of a JSON object must equal the base tensor's shape. */
static inline int peer_json_shape_check(const json_t *obj, const bench_tensor *t, bench_err *err)
{
    json_t *a = json_object_get(obj, "shape");
    if (!json_is_array(a) || json_array_size(a) != t->ndim)
        return bench_fail(err, "tensor '%s': shape differs from the base", t->name);
    for (uint32_t d = 0; d < t->ndim; d++) {
        json_t *x = json_array_get(a, d);
        if (!json_is_integer(x) || (uint64_t)json_integer_value(x) != t->shape[d])
            return bench_fail(err, "tensor '%s': shape differs from the base", t->name);
    }
    return 0;
}

/* Splits "u32 header_len | JSON header | rest" and parses the header. */
static inline int peer_split_header(const uint8_t *p, size_t n, json_t **hdr, size_t *data_at,
                                    bench_err *err)
{
    if (n < 4) return bench_fail(err, "patch shorter than its header length");
    uint64_t hl = bench_get_le(p, 4);
    if (hl > n - 4) return bench_fail(err, "header length %" PRIu64 " past the end", hl);
    json_error_t je;
    *hdr = json_loadb((const char *)p + 4, (size_t)hl, 0, &je);
    if (!*hdr) return bench_fail(err, "header is not JSON: %s", je.text);
    if (!json_is_object(*hdr)) {
        json_decref(*hdr);
        return bench_fail(err, "header is not a JSON object");
    }
    *data_at = 4 + (size_t)hl;
    return 0;
}

/* The header's "tensors" list when its "format" is fmt, else NULL with the
 * reason in err (the list is borrowed from hdr). */
static inline json_t *peer_tensor_list(json_t *hdr, const char *fmt, const char *who, bench_err *err)
{
    json_t *list = json_object_get(hdr, "tensors"), *f = json_object_get(hdr, "format");
    if (json_is_array(list) && json_is_string(f) && !strcmp(json_string_value(f), fmt)) return list;
    bench_fail(err, "%s: header is not %s", who, fmt);
    return NULL;
}

/* Prepends "u32 len(header)" and the header to body: out = len | hdr | body. */
static inline int peer_assemble(bench_buf *out, json_t *hdr, const bench_buf *body, bench_err *err)
{
    bench_buf h = {0};
    if (peer_json_append(&h, hdr, err)) return -1;
    int rc = h.size > UINT32_MAX || bench_buf_put_le(out, h.size, 4) ||
             bench_buf_append(out, h.data, h.size) || bench_buf_append(out, body->data, body->size);
    bench_buf_free(&h);
    return rc ? bench_fail(err, "out of memory (or header over 4 GiB)") : 0;
}

/* The end of a JSON-headed encoder: on success hdr gets "tensors" (its last
 * key) and out gets u32 length | header | body; on failure hdr and list are
 * released.  body is released either way. */
static inline int peer_finish(bench_buf *out, json_t *hdr, json_t *list, bench_buf *body, int rc, bench_err *err)
{
    if (rc) {
        json_decref(hdr);
        json_decref(list);
    } else {
        json_object_set_new(hdr, "tensors", list);
        rc = peer_assemble(out, hdr, body, err);
    }
    bench_buf_free(body);
    return rc;
}

/* Appends one zstd frame of src at level. */
static inline int peer_zstd_append(bench_buf *out, const void *src, size_t n, int level, bench_err *err)
{
    size_t bound = ZSTD_compressBound(n);
    if (bench_buf_reserve(out, bound)) return bench_fail(err, "out of memory");
    size_t z = ZSTD_compress(out->data + out->size, bound, src, n, level);
    if (ZSTD_isError(z)) return bench_fail(err, "zstd: %s", ZSTD_getErrorName(z));
    out->size += z;
    return 0;
}

/* Decompresses the one frame at p (at most n bytes) into a new buffer whose
 * size must be at most max; *used = the frame's compressed size. */
static inline int peer_zstd_frame(const uint8_t *p, size_t n, size_t max, uint8_t **dst,
                                  size_t *dsize, size_t *used, bench_err *err)
{
    size_t fz = ZSTD_findFrameCompressedSize(p, n);
    if (ZSTD_isError(fz)) return bench_fail(err, "zstd frame: %s", ZSTD_getErrorName(fz));
    unsigned long long cs = ZSTD_getFrameContentSize(p, fz);
    if (cs == ZSTD_CONTENTSIZE_ERROR || cs == ZSTD_CONTENTSIZE_UNKNOWN || cs > max)
        return bench_fail(err, "zstd frame: content size unknown or over %zu", max);
    uint8_t *d = malloc(cs ? (size_t)cs : 1);
    if (!d) return bench_fail(err, "out of memory");
    size_t got = ZSTD_decompress(d, (size_t)cs, p, fz);
    if (ZSTD_isError(got) || got != cs) {
        free(d);
        return bench_fail(err, "zstd frame: %s", ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short");
    }
    *dst = d;
    *dsize = (size_t)cs;
    *used = fz;
    return 0;
}

/* Gap coding of TRL and slime: gap[j] = pos[j] - pos[j-1] - 1 with
 * pos[-1] = -1; 2-byte gaps unless one exceeds 65535, then 4 bytes for the
 * whole tensor.  Returns the width, or 0 if a gap does not fit 32 bits. */
static inline unsigned peer_gap_width(const uint64_t *pos, uint64_t k)
{
    uint64_t prev = 0, maxg = 0;
    for (uint64_t j = 0; j < k; j++) {
        uint64_t g = pos[j] - prev; /* prev is pos[j-1] + 1 */
        if (g > maxg) maxg = g;
        prev = pos[j] + 1;
    }
    return maxg <= UINT16_MAX ? 2 : maxg <= UINT32_MAX ? 4 : 0;
}

static inline int peer_put_gaps(bench_buf *out, const uint64_t *pos, uint64_t k, unsigned gw)
{
    if (bench_buf_reserve(out, (size_t)k * gw)) return -1;
    uint64_t prev = 0;
    for (uint64_t j = 0; j < k; j++) {
        bench_put_le(out->data + out->size, pos[j] - prev, gw);
        out->size += gw;
        prev = pos[j] + 1;
    }
    return 0;
}

static inline int peer_put_values(bench_buf *out, const bench_tensor *t, const uint64_t *pos, uint64_t k)
{
    const unsigned w = t->width;
    if (bench_buf_reserve(out, (size_t)k * w)) return -1;
    for (uint64_t j = 0; j < k; j++) {
        memcpy(out->data + out->size, t->cur + pos[j] * w, w);
        out->size += w;
    }
    return 0;
}

/* Scatters k values (width t->width) to the positions given by k gaps of
 * width gw; every position must fall inside the tensor. */
static inline int peer_scatter_gaps(const bench_tensor *t, uint8_t *dst, const uint8_t *gaps,
                                    unsigned gw, const uint8_t *vals, uint64_t k, bench_err *err)
{
    const unsigned w = t->width;
    uint64_t next = 0; /* pos[j-1] + 1 */
    for (uint64_t j = 0; j < k; j++) {
        uint64_t p = next + bench_get_le(gaps + j * gw, gw);
        if (p < next || p >= t->nwords)
            return bench_fail(err, "tensor '%s': position %" PRIu64 " out of range", t->name, p);
        memcpy(dst + p * w, vals + j * w, w);
        next = p + 1;
    }
    return 0;
}

/* =====================================================================
 * TRL "gap_delta": a plain safetensors file.
 *
 * Laid out as the safetensors reference (Rust) serializer does: entries
 * sorted by dtype (descending, in its enum order) then name; header
 * {"NAME":{"dtype":..,"shape":[..],"data_offsets":[a,b]},...} with no
 * __metadata__, padded with spaces to a multiple of 8; u64 header length.
 * ===================================================================== */

/* Position of a dtype in the Rust safetensors Dtype enum (its sort key). */
static inline int trl_dtype_rank(ferry_dtype dt)
{
    switch (dt) {
    case FERRY_BOOL: return 0;     case FERRY_F4: return 1;
    case FERRY_F6_E2M3: return 2;  case FERRY_F6_E3M2: return 3;
    case FERRY_U8: return 4;       case FERRY_I8: return 5;
    case FERRY_F8_E5M2: return 6;  case FERRY_F8_E4M3: return 7;
    case FERRY_F8_E8M0: return 8;  case FERRY_I16: return 9;
    case FERRY_U16: return 10;     case FERRY_F16: return 11;
    case FERRY_BF16: return 12;    case FERRY_I32: return 13;
    case FERRY_U32: return 14;     case FERRY_F32: return 15;
    case FERRY_C64: return 16;     case FERRY_F64: return 17;
    case FERRY_I64: return 18;     case FERRY_U64: return 19;
    default: return 0;
    }
}

typedef struct trl_entry {
    char *name;          /* "TENSOR.idx" / "TENSOR.val" */
    ferry_dtype dtype;
    uint64_t count;      /* 1-D shape [count] */
    bench_buf bytes;
} trl_entry;

static inline int trl_entry_cmp(const void *a, const void *b)
{
    const trl_entry *x = a, *y = b;
    int rx = trl_dtype_rank(x->dtype), ry = trl_dtype_rank(y->dtype);
    if (rx != ry) return ry - rx;
    return strcmp(x->name, y->name);
}

/* The dtype a value array is stored with: the tensor's own, or U8 bytes
 * for sub-byte dtypes (whose words are bytes). */
static inline ferry_dtype trl_value_dtype(const bench_tensor *t)
{
    return ferry_dtype_bits(t->dtype) == 8 * t->width ? t->dtype : FERRY_U8;
}

static inline char *trl_join(const char *name, const char *suffix)
{
    size_t a = strlen(name), b = strlen(suffix);
    char *s = malloc(a + b + 1);
    if (s) { memcpy(s, name, a); memcpy(s + a, suffix, b + 1); }
    return s;
}

static inline int trl_serialize(trl_entry *e, size_t ne, bench_buf *out, bench_err *err)
{
    qsort(e, ne, sizeof *e, trl_entry_cmp);
    json_t *hdr = json_object();
    uint64_t off = 0;
    for (size_t i = 0; hdr && i < ne; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "dtype", json_string(ferry_dtype_name(e[i].dtype)));
        json_t *sh = json_array();
        json_array_append_new(sh, json_integer((json_int_t)e[i].count));
        json_object_set_new(o, "shape", sh);
        json_t *of = json_array();
        json_array_append_new(of, json_integer((json_int_t)off));
        json_array_append_new(of, json_integer((json_int_t)(off + e[i].bytes.size)));
        json_object_set_new(o, "data_offsets", of);
        if (json_object_set_new(hdr, e[i].name, o)) { json_decref(hdr); hdr = NULL; }
        off += e[i].bytes.size;
    }
    bench_buf h = {0};
    if (peer_json_append(&h, hdr, err)) return -1;
    while (h.size % 8) if (bench_buf_append(&h, " ", 1)) break;
    int rc = bench_buf_put_le(out, h.size, 8) || bench_buf_append(out, h.data, h.size);
    for (size_t i = 0; !rc && i < ne; i++) rc = bench_buf_append(out, e[i].bytes.data, e[i].bytes.size);
    bench_buf_free(&h);
    return rc ? bench_fail(err, "out of memory") : 0;
}

static inline int trl_encode(const peer_ctx *ctx, const bench_pair *pair, bench_buf *out, bench_err *err)
{
    (void)ctx;
    trl_entry *e = calloc(2 * pair->count + 1, sizeof *e);
    if (!e) return bench_fail(err, "out of memory");
    size_t ne = 0;
    int rc = 0;
    for (size_t i = 0; i < pair->count && !rc; i++) {
        const bench_tensor *t = &pair->t[i];
        uint64_t *pos, k;
        if (bench_changed(t, &pos, &k)) { rc = bench_fail(err, "out of memory"); break; }
        if (k == 0) continue;
        unsigned gw = peer_gap_width(pos, k);
        if (!gw) {
            rc = bench_fail(err, "trl: tensor '%s': gap over 32 bits", t->name);
        } else {
            trl_entry *ix = &e[ne++], *va = &e[ne++];
            ix->name = trl_join(t->name, ".idx");
            ix->dtype = gw == 2 ? FERRY_U16 : FERRY_U32;
            ix->count = k;
            va->name = trl_join(t->name, ".val");
            va->dtype = trl_value_dtype(t);
            va->count = k; /* one value of t->width bytes each (U8 for sub-byte dtypes) */
            if (!ix->name || !va->name || peer_put_gaps(&ix->bytes, pos, k, gw) ||
                peer_put_values(&va->bytes, t, pos, k))
                rc = bench_fail(err, "out of memory");
        }
        free(pos);
    }
    if (!rc) rc = trl_serialize(e, ne, out, err);
    for (size_t i = 0; i < ne; i++) { free(e[i].name); bench_buf_free(&e[i].bytes); }
    free(e);
    return rc;
}

/* Applies one NAME.idx / NAME.val couple of the patch model. */
static inline int trl_apply_one(const bench_pair *base, uint8_t *const *out, const ferry_model *pm,
                                const ferry_tensor *ix, bench_err *err)
{
    size_t nl = strlen(ix->name) - 4;
    char *tname = malloc(nl + 5);
    if (!tname) return bench_fail(err, "out of memory");
    memcpy(tname, ix->name, nl);
    tname[nl] = 0;
    long bi = bench_pair_find(base, tname);
    memcpy(tname + nl, ".val", 5);
    const ferry_tensor *va = ferry_model_find(pm, tname);
    tname[nl] = 0;
    int rc = 0;
    if (bi < 0) {
        rc = bench_fail(err, "trl: tensor '%s' not in the base", tname);
    } else if (!va) {
        rc = bench_fail(err, "trl: '%s.idx' without '%s.val'", tname, tname);
    } else {
        const bench_tensor *t = &base->t[bi];
        unsigned gw = ix->dtype == FERRY_U16 ? 2 : ix->dtype == FERRY_U32 ? 4 : 0;
        if (!gw || ix->ndim != 1 || va->ndim != 1 || va->dtype != trl_value_dtype(t) ||
            va->nbytes != ix->nelem * t->width)
            rc = bench_fail(err, "trl: tensor '%s': idx/val dtypes or lengths inconsistent", tname);
        else
            rc = peer_scatter_gaps(t, out[bi], ix->data, gw, va->data, ix->nelem, err);
    }
    free(tname);
    return rc;
}

static inline int trl_decode(const peer_ctx *ctx, const bench_pair *base, const uint8_t *patch,
                             size_t size, uint8_t *const *out, bench_err *err)
{
    if (size < 8) return bench_fail(err, "trl: patch shorter than a safetensors header");
    if (bench_get_le(patch, 8) == 8 && size == 16 && memcmp(patch + 8, "{}      ", 8) == 0)
        return 0; /* nothing changed: an empty safetensors file */
    char path[4096];
    if (bench_path(path, sizeof path, ctx->tmpdir, "trl-patch.safetensors", err)) return -1;
    FILE *f = fopen(path, "wb");
    if (!f) return bench_fail(err, "trl: cannot create %s: %s", path, strerror(errno));
    int ok = fwrite(patch, 1, size, f) == size;
    ok = (fclose(f) == 0) && ok;
    if (!ok) { unlink(path); return bench_fail(err, "trl: cannot write %s", path); }
    ferry_model *pm = NULL;
    int frc = ferry_model_open(path, &pm);
    if (frc) {
        unlink(path);
        return bench_fail(err, "trl: patch is not a valid safetensors file: %s", ferry_last_error());
    }
    int rc = 0;
    size_t n = ferry_model_count(pm);
    for (size_t i = 0; i < n && !rc; i++) {
        const ferry_tensor *x = ferry_model_tensor(pm, i);
        size_t l = strlen(x->name);
        if (l > 4 && strcmp(x->name + l - 4, ".idx") == 0)
            rc = trl_apply_one(base, out, pm, x, err);
        else if (!(l > 4 && strcmp(x->name + l - 4, ".val") == 0))
            rc = bench_fail(err, "trl: unexpected entry '%s'", x->name);
    }
    ferry_model_free(pm);
    unlink(path);
    return rc;
}

/* =====================================================================
 * PULSE / grail sparse_codec v3.1.
 *
 * Header (compact JSON, as grail writes it):
 *   {"version":31,"tensors":[{"name","shape","num_nonzero","value_dtype",
 *     "row_dtype","col_dtype","indices_offset","indices_size","rows_size",
 *     "cols_size","values_offset","values_size"},...]}
 * with offsets relative to the data that follows the header.  The 2-D view:
 * rows = shape[0] and cols = the product of the other dims for tensors of
 * two or more dims; one row of all elements otherwise (1-D, 0-D, sub-byte).
 * Row deltas are from the previous entry's row (the first from 0); column
 * deltas restart with the absolute column on every new row.
 * ===================================================================== */

static inline void pulse_view(const bench_tensor *t, uint64_t *rows, uint64_t *cols)
{
    if (t->ndim >= 2 && ferry_dtype_bits(t->dtype) == 8 * t->width && t->shape[0] > 0) {
        *rows = t->shape[0];
        *cols = t->nwords / t->shape[0];
    } else {
        *rows = 1;
        *cols = t->nwords;
    }
}

static inline const char *pulse_int_name(unsigned w)
{
    return w == 1 ? "uint8" : w == 2 ? "uint16" : "int32";
}

static inline unsigned pulse_int_width(const char *s)
{
    return !strcmp(s, "uint8") ? 1 : !strcmp(s, "uint16") ? 2 : !strcmp(s, "int32") ? 4 : 0;
}

static inline int pulse_encode(const peer_ctx *ctx, const bench_pair *pair, bench_buf *out, bench_err *err)
{
    (void)ctx;
    json_t *hdr = json_object(), *list = json_array();
    bench_buf body = {0};
    int rc = (!hdr || !list) ? bench_fail(err, "out of memory") : 0;
    for (size_t i = 0; i < pair->count && !rc; i++) {
        const bench_tensor *t = &pair->t[i];
        uint64_t *pos, k;
        if (bench_changed(t, &pos, &k)) { rc = bench_fail(err, "out of memory"); break; }
        if (k == 0) continue;
        uint64_t rows, cols, maxr = 0, maxc = 0, prow = 0, pcol = 0;
        pulse_view(t, &rows, &cols);
        (void)rows;
        /* First pass: the widths. */
        for (uint64_t j = 0; j < k; j++) {
            uint64_t r = pos[j] / cols, c = pos[j] % cols;
            uint64_t rd = r - prow, cd = (j == 0 || rd != 0) ? c : c - pcol;
            if (rd > maxr) maxr = rd;
            if (cd > maxc) maxc = cd;
            prow = r;
            pcol = c;
        }
        unsigned rw = maxr <= UINT8_MAX ? 1 : maxr <= UINT16_MAX ? 2 : maxr <= INT32_MAX ? 4 : 0;
        unsigned cw = maxc <= UINT16_MAX ? 2 : maxc <= INT32_MAX ? 4 : 0;
        if (!rw || !cw) {
            free(pos);
            rc = bench_fail(err, "pulse: tensor '%s': index delta over int32", t->name);
            break;
        }
        size_t at = body.size;
        if (bench_buf_reserve(&body, (size_t)k * (rw + cw + t->width))) {
            free(pos);
            rc = bench_fail(err, "out of memory");
            break;
        }
        prow = 0;
        for (uint64_t j = 0; j < k; j++) {       /* row deltas */
            uint64_t r = pos[j] / cols;
            bench_put_le(body.data + body.size, r - prow, rw);
            body.size += rw;
            prow = r;
        }
        prow = 0;
        for (uint64_t j = 0; j < k; j++) {       /* column deltas */
            uint64_t r = pos[j] / cols, c = pos[j] % cols;
            uint64_t cd = (j == 0 || r != prow) ? c : c - pcol;
            bench_put_le(body.data + body.size, cd, cw);
            body.size += cw;
            prow = r;
            pcol = c;
        }
        peer_put_values(&body, t, pos, k);      /* reserved above */
        free(pos);
        json_t *m = json_object();
        json_object_set_new(m, "name", json_string(t->name));
        json_object_set_new(m, "shape", peer_json_shape(t));
        json_object_set_new(m, "num_nonzero", json_integer((json_int_t)k));
        json_object_set_new(m, "value_dtype", json_string(ferry_dtype_name(trl_value_dtype(t))));
        json_object_set_new(m, "row_dtype", json_string(pulse_int_name(rw)));
        json_object_set_new(m, "col_dtype", json_string(pulse_int_name(cw)));
        json_object_set_new(m, "indices_offset", json_integer((json_int_t)at));
        json_object_set_new(m, "indices_size", json_integer((json_int_t)(k * (rw + cw))));
        json_object_set_new(m, "rows_size", json_integer((json_int_t)(k * rw)));
        json_object_set_new(m, "cols_size", json_integer((json_int_t)(k * cw)));
        json_object_set_new(m, "values_offset", json_integer((json_int_t)(at + k * (rw + cw))));
        json_object_set_new(m, "values_size", json_integer((json_int_t)(k * t->width)));
        if (json_array_append_new(list, m)) rc = bench_fail(err, "out of memory");
    }
    if (!rc) json_object_set_new(hdr, "version", json_integer(31));
    bench_buf raw = {0};
    rc = peer_finish(&raw, hdr, list, &body, rc, err);
    if (!rc) rc = peer_zstd_append(out, raw.data, raw.size, 1, err);
    bench_buf_free(&raw);
    return rc;
}

static inline int pulse_apply_one(const bench_pair *base, uint8_t *const *out, const json_t *m,
                                  const uint8_t *data, size_t dsize, bench_err *err)
{
    const char *name = NULL, *vd = NULL, *rds = NULL, *cds = NULL;
    uint64_t k = 0, io = 0, rs = 0, cs = 0, vo = 0, vs = 0;
    if (peer_json_str(m, "name", &name, err) || peer_json_str(m, "value_dtype", &vd, err) ||
        peer_json_str(m, "row_dtype", &rds, err) || peer_json_str(m, "col_dtype", &cds, err) ||
        peer_json_u64(m, "num_nonzero", &k, err) || peer_json_u64(m, "indices_offset", &io, err) ||
        peer_json_u64(m, "rows_size", &rs, err) || peer_json_u64(m, "cols_size", &cs, err) ||
        peer_json_u64(m, "values_offset", &vo, err) || peer_json_u64(m, "values_size", &vs, err))
        return -1;
    long bi = bench_pair_find(base, name);
    if (bi < 0) return bench_fail(err, "pulse: tensor '%s' not in the base", name);
    const bench_tensor *t = &base->t[bi];
    if (peer_json_shape_check(m, t, err)) return -1;
    unsigned rw = pulse_int_width(rds), cw = pulse_int_width(cds);
    if (!rw || !cw || cw == 1 || strcmp(vd, ferry_dtype_name(trl_value_dtype(t))) ||
        k > t->nwords || rs != k * rw || cs != k * cw || vs != k * t->width ||
        io > dsize || rs + cs > dsize - io || vo > dsize || vs > dsize - vo)
        return bench_fail(err, "pulse: tensor '%s': header fields inconsistent", name);
    const uint8_t *rp = data + io, *cp = rp + rs, *vp = data + vo;
    uint64_t rows, cols, r = 0, c = 0;
    pulse_view(t, &rows, &cols);
    for (uint64_t j = 0; j < k; j++) {
        uint64_t rd = bench_get_le(rp + j * rw, rw), cd = bench_get_le(cp + j * cw, cw);
        if ((rw == 4 && rd > INT32_MAX) || (cw == 4 && cd > INT32_MAX))
            return bench_fail(err, "pulse: tensor '%s': negative index delta", name);
        r += rd;
        c = (j == 0 || rd != 0) ? cd : c + cd;
        if (r >= rows || c >= cols)
            return bench_fail(err, "pulse: tensor '%s': entry (%" PRIu64 ", %" PRIu64 ") out of range",
                              name, r, c);
        memcpy(out[bi] + (r * cols + c) * t->width, vp + j * t->width, t->width);
    }
    return 0;
}

static inline int pulse_decode(const peer_ctx *ctx, const bench_pair *base, const uint8_t *patch,
                               size_t size, uint8_t *const *out, bench_err *err)
{
    (void)ctx;
    /* The whole patch is one frame; its content is bounded by a COO of every
     * word of the base plus a generous header allowance. */
    uint64_t max = 1u << 20;
    for (size_t i = 0; i < base->count; i++) max += base->t[i].nwords * (8 + base->t[i].width) + 4096;
    uint8_t *raw = NULL;
    size_t rsize = 0, used = 0;
    if (peer_zstd_frame(patch, size, (size_t)max, &raw, &rsize, &used, err)) return -1;
    if (used != size) { free(raw); return bench_fail(err, "pulse: bytes after the zstd frame"); }
    json_t *hdr = NULL;
    size_t at = 0;
    int rc = peer_split_header(raw, rsize, &hdr, &at, err);
    if (rc) { free(raw); return -1; }
    json_t *list = json_object_get(hdr, "tensors"), *v = json_object_get(hdr, "version");
    if (!json_is_integer(v) || json_integer_value(v) != 31 || !json_is_array(list))
        rc = bench_fail(err, "pulse: header is not sparse_codec v3.1");
    for (size_t i = 0; !rc && i < json_array_size(list); i++)
        rc = pulse_apply_one(base, out, json_array_get(list, i), raw + at, rsize - at, err);
    json_decref(hdr);
    free(raw);
    return rc;
}

/* =====================================================================
 * SkyRL: dense XOR per tensor, zstd level 3, manifest with hashes.
 *
 * Layout: u32 manifest length | manifest JSON
 *   {"version":V,"base_version":B,"tensors":[{"name":..,"xxh3_128":"32 hex"}]}
 * | one zstd frame per manifest tensor, in manifest order (frames are
 * self-delimiting).  Every tensor is sent: the format is dense, and an
 * unchanged tensor costs a frame of zeros (a few bytes).  The hash is
 * XXH3-128 of the new tensor's bytes, checked after the XOR is applied.
 * ===================================================================== */

static inline void skyrl_hash_hex(const uint8_t *p, uint64_t n, char hex[33])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, (size_t)n));
    for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", c.digest[i]);
}

static inline int skyrl_encode(const peer_ctx *ctx, const bench_pair *pair, bench_buf *out, bench_err *err)
{
    (void)ctx;
    json_t *hdr = json_object(), *list = json_array();
    bench_buf body = {0};
    uint8_t *x = NULL;
    int rc = (!hdr || !list) ? bench_fail(err, "out of memory") : 0;
    for (size_t i = 0; i < pair->count && !rc; i++) {
        const bench_tensor *t = &pair->t[i];
        uint8_t *nx = realloc(x, t->nbytes ? (size_t)t->nbytes : 1);
        if (!nx) { rc = bench_fail(err, "out of memory"); break; }
        x = nx;
        for (uint64_t b = 0; b < t->nbytes; b++) x[b] = t->old[b] ^ t->cur[b];
        rc = peer_zstd_append(&body, x, (size_t)t->nbytes, 3, err);
        char hex[33];
        skyrl_hash_hex(t->cur, t->nbytes, hex);
        json_t *m = json_object();
        json_object_set_new(m, "name", json_string(t->name));
        json_object_set_new(m, "xxh3_128", json_string(hex));
        if (!rc && json_array_append_new(list, m)) rc = bench_fail(err, "out of memory");
    }
    free(x);
    if (!rc) {
        json_object_set_new(hdr, "version", json_integer(pair->version));
        json_object_set_new(hdr, "base_version", json_integer(pair->base_version));
    }
    return peer_finish(out, hdr, list, &body, rc, err);
}

static inline int skyrl_decode(const peer_ctx *ctx, const bench_pair *base, const uint8_t *patch,
                               size_t size, uint8_t *const *out, bench_err *err)
{
    (void)ctx;
    json_t *hdr = NULL;
    size_t at = 0;
    if (peer_split_header(patch, size, &hdr, &at, err)) return -1;
    json_t *list = json_object_get(hdr, "tensors");
    int rc = json_is_array(list) && json_is_integer(json_object_get(hdr, "version")) &&
                     json_is_integer(json_object_get(hdr, "base_version"))
                 ? 0
                 : bench_fail(err, "skyrl: manifest lacks version, base_version or tensors");
    for (size_t i = 0; !rc && i < json_array_size(list); i++) {
        const json_t *m = json_array_get(list, i);
        const char *name = NULL, *hex = NULL;
        if (peer_json_str(m, "name", &name, err) || peer_json_str(m, "xxh3_128", &hex, err)) { rc = -1; break; }
        long bi = bench_pair_find(base, name);
        if (bi < 0) { rc = bench_fail(err, "skyrl: tensor '%s' not in the base", name); break; }
        const bench_tensor *t = &base->t[bi];
        uint8_t *x = NULL;
        size_t xs = 0, used = 0;
        if (peer_zstd_frame(patch + at, size - at, (size_t)t->nbytes, &x, &xs, &used, err)) { rc = -1; break; }
        if (xs != t->nbytes) {
            free(x);
            rc = bench_fail(err, "skyrl: tensor '%s': XOR frame of %zu bytes, tensor has %" PRIu64,
                            name, xs, t->nbytes);
            break;
        }
        for (size_t b = 0; b < xs; b++) out[bi][b] ^= x[b];
        free(x);
        at += used;
        char got[33];
        skyrl_hash_hex(out[bi], t->nbytes, got);
        if (strcmp(got, hex)) rc = bench_fail(err, "skyrl: tensor '%s': XXH3-128 mismatch after apply", name);
    }
    if (!rc && at != size) rc = bench_fail(err, "skyrl: bytes after the last frame");
    json_decref(hdr);
    return rc;
}

/* =====================================================================
 * slime "deltas_zstd".
 *
 * Layout: u32 header length | JSON header
 *   {"format":"deltas_zstd","tensors":[{"name":..,"num_changed":k,
 *     "gap_dtype":"uint16"|"uint32"},...]}
 * | per listed tensor one zstd frame (level 1) of [gaps | raw new values].
 * Only changed tensors are listed.
 * ===================================================================== */

static inline int slime_encode(const peer_ctx *ctx, const bench_pair *pair, bench_buf *out, bench_err *err)
{
    (void)ctx;
    json_t *hdr = json_object(), *list = json_array();
    bench_buf body = {0}, raw = {0};
    int rc = (!hdr || !list) ? bench_fail(err, "out of memory") : 0;
    for (size_t i = 0; i < pair->count && !rc; i++) {
        const bench_tensor *t = &pair->t[i];
        uint64_t *pos, k;
        if (bench_changed(t, &pos, &k)) { rc = bench_fail(err, "out of memory"); break; }
        if (k == 0) continue;
        unsigned gw = peer_gap_width(pos, k);
        raw.size = 0;
        if (!gw) rc = bench_fail(err, "slime: tensor '%s': gap over 32 bits", t->name);
        else if (peer_put_gaps(&raw, pos, k, gw) || peer_put_values(&raw, t, pos, k))
            rc = bench_fail(err, "out of memory");
        else rc = peer_zstd_append(&body, raw.data, raw.size, 1, err);
        free(pos);
        json_t *m = json_object();
        json_object_set_new(m, "name", json_string(t->name));
        json_object_set_new(m, "num_changed", json_integer((json_int_t)k));
        json_object_set_new(m, "gap_dtype", json_string(gw == 4 ? "uint32" : "uint16"));
        if (!rc && json_array_append_new(list, m)) rc = bench_fail(err, "out of memory");
    }
    bench_buf_free(&raw);
    if (!rc) json_object_set_new(hdr, "format", json_string("deltas_zstd"));
    return peer_finish(out, hdr, list, &body, rc, err);
}

static inline int slime_decode(const peer_ctx *ctx, const bench_pair *base, const uint8_t *patch,
                               size_t size, uint8_t *const *out, bench_err *err)
{
    (void)ctx;
    json_t *hdr = NULL;
    size_t at = 0;
    if (peer_split_header(patch, size, &hdr, &at, err)) return -1;
    json_t *list = peer_tensor_list(hdr, "deltas_zstd", "slime", err);
    int rc = list ? 0 : -1;
    for (size_t i = 0; !rc && i < json_array_size(list); i++) {
        const json_t *m = json_array_get(list, i);
        const char *name = NULL, *gd = NULL;
        uint64_t k = 0;
        if (peer_json_str(m, "name", &name, err) || peer_json_str(m, "gap_dtype", &gd, err) ||
            peer_json_u64(m, "num_changed", &k, err)) { rc = -1; break; }
        long bi = bench_pair_find(base, name);
        if (bi < 0) { rc = bench_fail(err, "slime: tensor '%s' not in the base", name); break; }
        const bench_tensor *t = &base->t[bi];
        unsigned gw = !strcmp(gd, "uint16") ? 2 : !strcmp(gd, "uint32") ? 4 : 0;
        if (!gw || k > t->nwords) { rc = bench_fail(err, "slime: tensor '%s': bad header entry", name); break; }
        uint8_t *raw = NULL;
        size_t rs = 0, used = 0;
        if (peer_zstd_frame(patch + at, size - at, (size_t)(k * (gw + t->width)), &raw, &rs, &used, err)) {
            rc = -1;
            break;
        }
        if (rs != k * (gw + t->width))
            rc = bench_fail(err, "slime: tensor '%s': frame of %zu bytes for %" PRIu64 " changes", name, rs, k);
        else
            rc = peer_scatter_gaps(t, out[bi], raw, gw, raw + k * gw, k, err);
        free(raw);
        at += used;
    }
    if (!rc && at != size) rc = bench_fail(err, "slime: bytes after the last frame");
    json_decref(hdr);
    return rc;
}

/* =====================================================================
 * Flat int32 indices (prime-rl and vLLM): index[j] = the word position of
 * the j-th change.  A tensor of more than 2^31 words cannot be described.
 * ===================================================================== */

static inline int peer_put_idx32(bench_buf *out, const bench_tensor *t, const uint64_t *pos, uint64_t k,
                                 bench_err *err)
{
    if (t->nwords > (uint64_t)INT32_MAX + 1)
        return bench_fail(err, "tensor '%s': %" PRIu64 " words, over int32 indices", t->name, t->nwords);
    if (bench_buf_reserve(out, (size_t)k * 4)) return bench_fail(err, "out of memory");
    uint8_t *o = out->data + out->size;
    for (uint64_t j = 0; j < k; j++) bench_put_le(o + 4 * j, pos[j], 4);
    out->size += (size_t)k * 4;
    return 0;
}

/* Scatters k values to k int32 indices (index_copy_): each must be in the
 * tensor; order and duplicates are the sender's business, as in the peers. */
static inline int peer_scatter_idx32(const bench_tensor *t, uint8_t *dst, const uint8_t *idx,
                                     const uint8_t *vals, uint64_t k, bench_err *err)
{
    const unsigned w = t->width;
    for (uint64_t j = 0; j < k; j++) {
        uint64_t p = bench_get_le(idx + 4 * j, 4);
        if (p >= t->nwords)
            return bench_fail(err, "tensor '%s': index %" PRIu64 " out of range", t->name, p);
        if (w == 2) memcpy(dst + 2 * p, vals + 2 * j, 2);
        else memcpy(dst + p * w, vals + j * w, w);
    }
    return 0;
}

/* A safetensors file held in memory: u64 header length, JSON header with
 * {"dtype","shape","data_offsets"} per entry, data.  Finds one 1-D entry of
 * the given dtype and element count; *p points at its bytes. */
static inline int peer_st_entry(const json_t *hdr, const uint8_t *data, size_t dsize, const char *name,
                                ferry_dtype dt, uint64_t count, size_t elem, const uint8_t **p, bench_err *err)
{
    const json_t *e = json_object_get(hdr, name);
    const json_t *d = json_object_get(e, "dtype"), *sh = json_object_get(e, "shape"),
                 *of = json_object_get(e, "data_offsets");
    ferry_dtype got;
    if (!json_is_string(d) || ferry_dtype_parse(json_string_value(d), &got) || got != dt)
        return bench_fail(err, "entry '%s' missing or not of dtype %s", name, ferry_dtype_name(dt));
    if (!json_is_array(sh) || json_array_size(sh) != 1 || !json_is_integer(json_array_get(sh, 0)) ||
        (uint64_t)json_integer_value(json_array_get(sh, 0)) != count)
        return bench_fail(err, "entry '%s': shape is not [%" PRIu64 "]", name, count);
    if (!json_is_array(of) || json_array_size(of) != 2 || !json_is_integer(json_array_get(of, 0)) ||
        !json_is_integer(json_array_get(of, 1)))
        return bench_fail(err, "entry '%s': data_offsets missing", name);
    json_int_t a = json_integer_value(json_array_get(of, 0)), b = json_integer_value(json_array_get(of, 1));
    if (a < 0 || b < a || (uint64_t)b > dsize || (uint64_t)(b - a) != count * elem)
        return bench_fail(err, "entry '%s': data_offsets out of range or of the wrong size", name);
    *p = data + a;
    return 0;
}

static inline int peer_st_split(const uint8_t *p, size_t n, json_t **hdr, const uint8_t **data, size_t *dsize,
                                bench_err *err)
{
    if (n < 8) return bench_fail(err, "safetensors shorter than its header length");
    uint64_t hl = bench_get_le(p, 8);
    if (hl > n - 8) return bench_fail(err, "safetensors header length past the end");
    json_error_t je;
    *hdr = json_loadb((const char *)p + 8, (size_t)hl, 0, &je);
    if (!json_is_object(*hdr)) {
        json_decref(*hdr);
        return bench_fail(err, "safetensors header is not a JSON object");
    }
    *data = p + 8 + hl;
    *dsize = n - 8 - (size_t)hl;
    return 0;
}

/* =====================================================================
 * prime-rl sparse update ("prime-rl-sparse-update" v1).
 *
 * Layout: u32 manifest length | manifest JSON
 *   {"format":"prime-rl-sparse-update","version":1,"step":V,"base_step":B,
 *    "tensors":[{"name","shape","dtype","checksum"}]}   (changed tensors;
 *    checksum = XXH3-128 hex of the new tensor, checked after apply)
 * | one zstd frame (level 3, zstd's default) of a safetensors file holding
 *   NAME.indices (I32, flat word indices) and NAME.values (absolute new
 *   values) per changed tensor, laid out as TRL's file.
 * The decoder refuses a base_step other than its base's version.
 * ===================================================================== */

static inline int prime_encode(const peer_ctx *ctx, const bench_pair *pair, bench_buf *out, bench_err *err)
{
    (void)ctx;
    json_t *hdr = json_object(), *list = json_array();
    trl_entry *e = calloc(2 * pair->count + 1, sizeof *e);
    size_t ne = 0;
    int rc = (!hdr || !list || !e) ? bench_fail(err, "out of memory") : 0;
    for (size_t i = 0; i < pair->count && !rc; i++) {
        const bench_tensor *t = &pair->t[i];
        uint64_t *pos, k;
        if (bench_changed(t, &pos, &k)) { rc = bench_fail(err, "out of memory"); break; }
        if (k == 0) continue;
        trl_entry *ix = &e[ne++], *va = &e[ne++];
        ix->name = trl_join(t->name, ".indices");
        ix->dtype = FERRY_I32;
        ix->count = k;
        va->name = trl_join(t->name, ".values");
        va->dtype = trl_value_dtype(t);
        va->count = k;
        if (!ix->name || !va->name) rc = bench_fail(err, "out of memory");
        if (!rc) rc = peer_put_idx32(&ix->bytes, t, pos, k, err);
        if (!rc && peer_put_values(&va->bytes, t, pos, k)) rc = bench_fail(err, "out of memory");
        free(pos);
        char hex[33];
        skyrl_hash_hex(t->cur, t->nbytes, hex);
        json_t *m = json_object();
        json_object_set_new(m, "name", json_string(t->name));
        json_object_set_new(m, "shape", peer_json_shape(t));
        json_object_set_new(m, "dtype", json_string(ferry_dtype_name(t->dtype)));
        json_object_set_new(m, "checksum", json_string(hex));
        if (!rc && json_array_append_new(list, m)) rc = bench_fail(err, "out of memory");
    }
    bench_buf st = {0}, body = {0};
    if (!rc) rc = trl_serialize(e, ne, &st, err);
    if (!rc) rc = peer_zstd_append(&body, st.data, st.size, 3, err);
    bench_buf_free(&st);
    for (size_t i = 0; i < ne; i++) { free(e[i].name); bench_buf_free(&e[i].bytes); }
    free(e);
    if (!rc) {
        json_object_set_new(hdr, "format", json_string("prime-rl-sparse-update"));
        json_object_set_new(hdr, "version", json_integer(1));
        json_object_set_new(hdr, "step", json_integer(pair->version));
        json_object_set_new(hdr, "base_step", json_integer(pair->base_version));
    }
    return peer_finish(out, hdr, list, &body, rc, err);
}

static inline int prime_apply_one(const bench_pair *base, uint8_t *const *out, const json_t *m,
                                  const json_t *st, const uint8_t *data, size_t dsize, bench_err *err)
{
    const char *name = NULL, *dt = NULL, *sum = NULL;
    if (peer_json_str(m, "name", &name, err) || peer_json_str(m, "dtype", &dt, err) ||
        peer_json_str(m, "checksum", &sum, err))
        return -1;
    long bi = bench_pair_find(base, name);
    if (bi < 0) return bench_fail(err, "prime: tensor '%s' not in the base", name);
    const bench_tensor *t = &base->t[bi];
    if (peer_json_shape_check(m, t, err)) return -1;
    if (strcmp(dt, ferry_dtype_name(t->dtype))) return bench_fail(err, "prime: tensor '%s': dtype differs", name);
    char en[FERRY_MAX_NAME + 16];
    snprintf(en, sizeof en, "%s.indices", name);
    const json_t *ie = json_object_get(json_object_get(st, en), "shape");
    if (!json_is_array(ie) || json_array_size(ie) != 1 || !json_is_integer(json_array_get(ie, 0)))
        return bench_fail(err, "prime: tensor '%s': no indices entry", name);
    json_int_t k = json_integer_value(json_array_get(ie, 0));
    if (k < 0 || (uint64_t)k > t->nwords) return bench_fail(err, "prime: tensor '%s': bad count", name);
    const uint8_t *ip = NULL, *vp = NULL;
    if (peer_st_entry(st, data, dsize, en, FERRY_I32, (uint64_t)k, 4, &ip, err)) return -1;
    snprintf(en, sizeof en, "%s.values", name);
    if (peer_st_entry(st, data, dsize, en, trl_value_dtype(t), (uint64_t)k, t->width, &vp, err)) return -1;
    if (peer_scatter_idx32(t, out[bi], ip, vp, (uint64_t)k, err)) return -1;
    char got[33];
    skyrl_hash_hex(out[bi], t->nbytes, got);
    return strcmp(got, sum) ? bench_fail(err, "prime: tensor '%s': checksum mismatch after apply", name) : 0;
}

static inline int prime_decode(const peer_ctx *ctx, const bench_pair *base, const uint8_t *patch,
                               size_t size, uint8_t *const *out, bench_err *err)
{
    (void)ctx;
    json_t *hdr = NULL, *st = NULL;
    size_t at = 0;
    if (peer_split_header(patch, size, &hdr, &at, err)) return -1;
    json_t *list = peer_tensor_list(hdr, "prime-rl-sparse-update", "prime", err), *bs = json_object_get(hdr, "base_step");
    int rc = !list ? -1
             : json_integer_value(json_object_get(hdr, "version")) == 1 && json_is_integer(bs)
                 ? 0
                 : bench_fail(err, "prime: manifest is not prime-rl-sparse-update v1");
    if (!rc && json_integer_value(bs) != base->base_version)
        rc = bench_fail(err, "prime: base_step %" JSON_INTEGER_FORMAT " is not the base's %ld",
                        json_integer_value(bs), base->base_version);
    uint64_t max = 1u << 20; /* a COO of every word plus header room bounds the file */
    for (size_t i = 0; i < base->count; i++) max += base->t[i].nwords * (4 + base->t[i].width) + 4096;
    uint8_t *raw = NULL;
    size_t rsize = 0, used = 0;
    if (!rc) rc = peer_zstd_frame(patch + at, size - at, (size_t)max, &raw, &rsize, &used, err);
    if (!rc && at + used != size) rc = bench_fail(err, "prime: bytes after the zstd frame");
    const uint8_t *data = NULL;
    size_t dsize = 0;
    if (!rc) rc = peer_st_split(raw, rsize, &st, &data, &dsize, err);
    if (!rc && json_object_size(st) != 2 * json_array_size(list))
        rc = bench_fail(err, "prime: the file has entries the manifest does not name");
    for (size_t i = 0; !rc && i < json_array_size(list); i++)
        rc = prime_apply_one(base, out, json_array_get(list, i), st, data, dsize, err);
    json_decref(st);
    json_decref(hdr);
    free(raw);
    return rc;
}

/* =====================================================================
 * vLLM sparse_nccl: per changed tensor int32 flat indices then the values
 * (same dtype), raw: what goes over NCCL, applied with index_copy_.  The
 * names, dtypes, shapes and counts travel in the update_weights call; they
 * are counted here as u32 length + compact JSON
 *   {"format":"sparse_nccl","tensors":[{"name","dtype","shape","num_changed"}]}.
 * ===================================================================== */

static inline int vllm_encode(const peer_ctx *ctx, const bench_pair *pair, bench_buf *out, bench_err *err)
{
    (void)ctx;
    json_t *hdr = json_object(), *list = json_array();
    bench_buf body = {0};
    int rc = (!hdr || !list) ? bench_fail(err, "out of memory") : 0;
    for (size_t i = 0; i < pair->count && !rc; i++) {
        const bench_tensor *t = &pair->t[i];
        uint64_t *pos, k;
        if (bench_changed(t, &pos, &k)) { rc = bench_fail(err, "out of memory"); break; }
        if (k == 0) continue;
        rc = peer_put_idx32(&body, t, pos, k, err);
        if (!rc && peer_put_values(&body, t, pos, k)) rc = bench_fail(err, "out of memory");
        free(pos);
        json_t *m = json_object();
        json_object_set_new(m, "name", json_string(t->name));
        json_object_set_new(m, "dtype", json_string(ferry_dtype_name(t->dtype)));
        json_object_set_new(m, "shape", peer_json_shape(t));
        json_object_set_new(m, "num_changed", json_integer((json_int_t)k));
        if (!rc && json_array_append_new(list, m)) rc = bench_fail(err, "out of memory");
    }
    if (!rc) json_object_set_new(hdr, "format", json_string("sparse_nccl"));
    return peer_finish(out, hdr, list, &body, rc, err);
}

/* One header entry of vLLM or verl: the base tensor it names, checked. */
static inline const bench_tensor *peer_entry_tensor(const char *who, const bench_pair *base, const json_t *m,
                                                    long *bi, bench_err *err)
{
    const char *name = NULL, *dt = NULL;
    if (peer_json_str(m, "name", &name, err) || peer_json_str(m, "dtype", &dt, err)) return NULL;
    *bi = bench_pair_find(base, name);
    if (*bi < 0) { bench_fail(err, "%s: tensor '%s' not in the base", who, name); return NULL; }
    const bench_tensor *t = &base->t[*bi];
    if (peer_json_shape_check(m, t, err)) return NULL;
    if (strcmp(dt, ferry_dtype_name(t->dtype))) { bench_fail(err, "%s: tensor '%s': dtype differs", who, name); return NULL; }
    return t;
}

static inline int vllm_decode(const peer_ctx *ctx, const bench_pair *base, const uint8_t *patch,
                              size_t size, uint8_t *const *out, bench_err *err)
{
    (void)ctx;
    json_t *hdr = NULL;
    size_t at = 0;
    if (peer_split_header(patch, size, &hdr, &at, err)) return -1;
    json_t *list = peer_tensor_list(hdr, "sparse_nccl", "vllm", err);
    int rc = list ? 0 : -1;
    for (size_t i = 0; !rc && i < json_array_size(list); i++) {
        const json_t *m = json_array_get(list, i);
        long bi;
        uint64_t k = 0;
        const bench_tensor *t = peer_entry_tensor("vllm", base, m, &bi, err);
        if (!t || peer_json_u64(m, "num_changed", &k, err)) { rc = -1; break; }
        if (k > t->nwords || k * (4 + t->width) > size - at) {
            rc = bench_fail(err, "vllm: tensor '%s': %" PRIu64 " changes past the end", t->name, k);
            break;
        }
        rc = peer_scatter_idx32(t, out[bi], patch + at, patch + at + 4 * k, k, err);
        at += (size_t)(k * (4 + t->width));
    }
    if (!rc && at != size) rc = bench_fail(err, "vllm: bytes after the last tensor");
    json_decref(hdr);
    return rc;
}

/* =====================================================================
 * verl delta_sharded, positions in 24 bits: each FSDP rank diffs its own
 * flat shard and sends (position, value) pairs, positions relative to the
 * shard in 3 bytes.  Shards are taken as 2^24-word pieces of each tensor
 * (the most a 24-bit position reaches); raw, as sent over NCCL.
 * Layout: u32 length | compact JSON
 *   {"format":"delta_sharded","pos_bits":24,"tensors":[{"name","dtype",
 *     "shape","shard_changes":[k0,k1,...]}]}
 * | per tensor, per shard: k_s 3-byte positions, then k_s raw values.
 * ===================================================================== */
#define VERL_SHARD_LOG2 24

static inline int verl_encode(const peer_ctx *ctx, const bench_pair *pair, bench_buf *out, bench_err *err)
{
    (void)ctx;
    json_t *hdr = json_object(), *list = json_array();
    bench_buf body = {0};
    int rc = (!hdr || !list) ? bench_fail(err, "out of memory") : 0;
    for (size_t i = 0; i < pair->count && !rc; i++) {
        const bench_tensor *t = &pair->t[i];
        uint64_t *pos, k;
        if (bench_changed(t, &pos, &k)) { rc = bench_fail(err, "out of memory"); break; }
        if (k == 0) continue;
        json_t *counts = json_array();
        if (!counts || bench_buf_reserve(&body, (size_t)k * (3 + t->width))) rc = bench_fail(err, "out of memory");
        uint64_t nsh = (t->nwords + (1u << VERL_SHARD_LOG2) - 1) >> VERL_SHARD_LOG2;
        for (uint64_t s = 0, j = 0; s < nsh && !rc; s++) {
            uint64_t j0 = j;
            while (j < k && (pos[j] >> VERL_SHARD_LOG2) == s) {
                bench_put_le(body.data + body.size, pos[j] & ((1u << VERL_SHARD_LOG2) - 1), 3);
                body.size += 3;
                j++;
            }
            peer_put_values(&body, t, pos + j0, j - j0); /* reserved above */
            json_array_append_new(counts, json_integer((json_int_t)(j - j0)));
        }
        free(pos);
        json_t *m = json_object();
        json_object_set_new(m, "name", json_string(t->name));
        json_object_set_new(m, "dtype", json_string(ferry_dtype_name(t->dtype)));
        json_object_set_new(m, "shape", peer_json_shape(t));
        json_object_set_new(m, "shard_changes", counts);
        if (!rc && json_array_append_new(list, m)) rc = bench_fail(err, "out of memory");
    }
    if (!rc) {
        json_object_set_new(hdr, "format", json_string("delta_sharded"));
        json_object_set_new(hdr, "pos_bits", json_integer(24));
    }
    return peer_finish(out, hdr, list, &body, rc, err);
}

static inline int verl_decode(const peer_ctx *ctx, const bench_pair *base, const uint8_t *patch,
                              size_t size, uint8_t *const *out, bench_err *err)
{
    (void)ctx;
    json_t *hdr = NULL;
    size_t at = 0;
    if (peer_split_header(patch, size, &hdr, &at, err)) return -1;
    json_t *list = peer_tensor_list(hdr, "delta_sharded", "verl", err);
    int rc = !list ? -1
             : json_integer_value(json_object_get(hdr, "pos_bits")) == 24 ? 0
                                                                          : bench_fail(err, "verl: positions are not 24-bit");
    for (size_t i = 0; !rc && i < json_array_size(list); i++) {
        const json_t *m = json_array_get(list, i);
        long bi;
        const bench_tensor *t = peer_entry_tensor("verl", base, m, &bi, err);
        const json_t *counts = t ? json_object_get(m, "shard_changes") : NULL;
        uint64_t nsh = t ? (t->nwords + (1u << VERL_SHARD_LOG2) - 1) >> VERL_SHARD_LOG2 : 0;
        if (!t || !json_is_array(counts) || json_array_size(counts) != nsh) {
            rc = t ? bench_fail(err, "verl: tensor '%s': shard_changes missing or not one per shard", t->name) : -1;
            break;
        }
        const unsigned w = t->width;
        uint8_t *dst = out[bi];
        for (uint64_t s = 0; s < nsh && !rc; s++) {
            json_t *c = json_array_get(counts, s);
            uint64_t base_w = s << VERL_SHARD_LOG2, shard = t->nwords - base_w;
            if (shard > (1u << VERL_SHARD_LOG2)) shard = 1u << VERL_SHARD_LOG2;
            json_int_t k = json_is_integer(c) ? json_integer_value(c) : -1;
            if (k < 0 || (uint64_t)k > shard || (uint64_t)k * (3 + w) > size - at) {
                rc = bench_fail(err, "verl: tensor '%s': shard %" PRIu64 " count bad or past the end", t->name, s);
                break;
            }
            const uint8_t *pp = patch + at, *vp = pp + 3 * (size_t)k;
            for (json_int_t j = 0; j < k; j++) {
                uint64_t p = (uint64_t)pp[3 * j] | (uint64_t)pp[3 * j + 1] << 8 | (uint64_t)pp[3 * j + 2] << 16;
                if (p >= shard) { rc = bench_fail(err, "verl: tensor '%s': position out of range", t->name); break; }
                memcpy(dst + (base_w + p) * w, vp + (size_t)j * w, w);
            }
            at += (size_t)k * (3 + w);
        }
    }
    if (!rc && at != size) rc = bench_fail(err, "verl: bytes after the last tensor");
    json_decref(hdr);
    return rc;
}

/* =====================================================================
 * The list the driver iterates over.
 * ===================================================================== */
#define PEER_COUNT 7
static const peer_format peer_formats[PEER_COUNT] = {
    {"trl", "TRL gap_delta: safetensors NAME.idx (u16/u32 gaps) + NAME.val, uncompressed",
     trl_encode, trl_decode},
    {"pulse", "PULSE/grail sparse_codec v3.1: 2-D COO deltas + values, one zstd-1 frame",
     pulse_encode, pulse_decode},
    {"skyrl", "SkyRL: dense XOR per tensor, zstd-3, manifest with XXH3-128",
     skyrl_encode, skyrl_decode},
    {"slime", "slime deltas_zstd: u16/u32 gaps + values, zstd-1 per tensor",
     slime_encode, slime_decode},
    {"prime", "prime-rl sparse update v1: manifest + safetensors of int32 indices + values, zstd-3",
     prime_encode, prime_decode},
    {"vllm", "vLLM sparse_nccl: int32 flat indices + values, raw",
     vllm_encode, vllm_decode},
    {"verl", "verl delta_sharded: 24-bit positions per 2^24-word shard + values, raw",
     verl_encode, verl_decode},
};

#endif /* BENCH_PEERS_H */
