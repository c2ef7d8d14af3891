/*
 * wan_peer — the peer formats of bench/wan.sh as files, for islands that
 * fetch an object over a link and decode it into a checkpoint:
 *
 *   wan_peer encode FORMAT OLD NEW PATCH
 *   wan_peer decode FORMAT BASE PATCH OUT    (prints "decode_s SECONDS")
 *
 * FORMAT:
 *   skyrl   SkyRL: per tensor the dense XOR of old and new, zstd-3, with a
 *           JSON manifest and each tensor's XXH3-128 (bench/peers.h);
 *   sparse  prime-rl-style sparse update: per changed tensor its int32 flat
 *           indices and the new BF16 (raw word) values, one zstd-3 frame,
 *           behind a u32-length JSON header listing name and count.
 *
 * decode reads BASE (mmap), applies PATCH into a copy, and writes OUT as a
 * .safetensors file with BASE's metadata (written aside and renamed by
 * ferry_model_save); the time printed covers all of it, as an island pays
 * it.  OUT is bit-identical to NEW (bench/wan.sh checks the model hashes).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "peers.h"

/* A view of one model (cur = NULL) or of a pair (old = a, cur = b). */
static int view(const ferry_model *a, const ferry_model *b, bench_pair *p, bench_err *err)
{
    size_t n = ferry_model_count(a);
    if (b && ferry_model_count(b) != n) return bench_fail(err, "OLD and NEW differ in their tensors");
    p->t = calloc(n ? n : 1, sizeof *p->t);
    if (!p->t) return bench_fail(err, "out of memory");
    p->count = n;
    for (size_t i = 0; i < n; i++) {
        const ferry_tensor *x = ferry_model_tensor(a, i), *y = b ? ferry_model_tensor(b, i) : x;
        if (strcmp(x->name, y->name) || x->dtype != y->dtype || x->nbytes != y->nbytes)
            return bench_fail(err, "tensor '%s' differs between OLD and NEW", y->name);
        bench_tensor *t = &p->t[i];
        *t = (bench_tensor){x->name, x->dtype, x->ndim, x->shape, x->nbytes, bench_word_width(x->dtype), 0, x->data,
                            b ? y->data : NULL};
        t->nwords = t->nbytes / t->width;
    }
    return 0;
}

/* ---- the prime-rl-style sparse format ---- */

static int sparse_encode(const peer_ctx *ctx, const bench_pair *pair, bench_buf *out, bench_err *err)
{
    (void)ctx;
    json_t *hdr = json_object(), *list = json_array();
    bench_buf body = {0}, frame = {0};
    int rc = (!hdr || !list) ? bench_fail(err, "out of memory") : 0;
    for (size_t i = 0; i < pair->count && !rc; i++) {
        const bench_tensor *t = &pair->t[i];
        uint64_t *pos = NULL, k = 0;
        if (bench_changed(t, &pos, &k)) { rc = bench_fail(err, "out of memory"); break; }
        if (!k) continue;
        if (t->nwords > INT32_MAX) { free(pos); rc = bench_fail(err, "sparse: '%s' has more than 2^31 words", t->name); break; }
        frame.size = 0;
        for (uint64_t j = 0; j < k && !rc; j++) rc = bench_buf_put_le(&frame, pos[j], 4) ? bench_fail(err, "out of memory") : 0;
        for (uint64_t j = 0; j < k && !rc; j++)
            rc = bench_buf_append(&frame, t->cur + pos[j] * t->width, t->width) ? bench_fail(err, "out of memory") : 0;
        free(pos);
        if (!rc) rc = peer_zstd_append(&body, frame.data, frame.size, 3, err);
        json_t *m = json_object();
        json_object_set_new(m, "name", json_string(t->name));
        json_object_set_new(m, "k", json_integer((json_int_t)k));
        if (!rc && json_array_append_new(list, m)) rc = bench_fail(err, "out of memory");
    }
    bench_buf_free(&frame);
    return peer_finish(out, hdr, list, &body, rc, err);
}

static int sparse_decode(const peer_ctx *ctx, const bench_pair *base, const uint8_t *patch, size_t size,
                         uint8_t *const *out, bench_err *err)
{
    (void)ctx;
    json_t *hdr = NULL;
    size_t at = 0;
    if (peer_split_header(patch, size, &hdr, &at, err)) return -1;
    json_t *list = json_object_get(hdr, "tensors");
    int rc = json_is_array(list) ? 0 : bench_fail(err, "sparse: header lacks tensors");
    for (size_t i = 0; !rc && i < json_array_size(list); i++) {
        const json_t *m = json_array_get(list, i);
        const char *name = NULL;
        uint64_t k = 0;
        if (peer_json_str(m, "name", &name, err) || peer_json_u64(m, "k", &k, err)) { rc = -1; break; }
        long bi = bench_pair_find(base, name);
        if (bi < 0) { rc = bench_fail(err, "sparse: tensor '%s' not in the base", name); break; }
        const bench_tensor *t = &base->t[bi];
        if (k > t->nwords) { rc = bench_fail(err, "sparse: '%s': %" PRIu64 " changes, %" PRIu64 " words", name, k, t->nwords); break; }
        size_t want = (size_t)k * (4 + t->width), xs = 0, used = 0;
        uint8_t *x = NULL;
        if (peer_zstd_frame(patch + at, size - at, want, &x, &xs, &used, err)) { rc = -1; break; }
        if (xs != want) { free(x); rc = bench_fail(err, "sparse: '%s': frame of %zu bytes, want %zu", name, xs, want); break; }
        const uint8_t *vals = x + 4 * k;
        for (uint64_t j = 0; j < k && !rc; j++) {
            uint64_t p = bench_get_le(x + 4 * j, 4);
            if (p >= t->nwords) rc = bench_fail(err, "sparse: '%s': index %" PRIu64 " out of range", name, p);
            else memcpy(out[bi] + p * t->width, vals + j * t->width, t->width);
        }
        free(x);
        at += used;
    }
    if (!rc && at != size) rc = bench_fail(err, "sparse: bytes after the last frame");
    json_decref(hdr);
    return rc;
}

static const peer_format k_formats[] = {
    {"skyrl", "", skyrl_encode, skyrl_decode},
    {"sparse", "", sparse_encode, sparse_decode},
};

static int die(const char *what, const char *msg)
{
    fprintf(stderr, "wan_peer: %s: %s\n", what, msg);
    return 1;
}

static int encode(const peer_format *f, const char *old_path, const char *new_path, const char *out_path)
{
    ferry_model *a = NULL, *b = NULL;
    if (ferry_model_open(old_path, &a) || ferry_model_open(new_path, &b)) return die("open", ferry_last_error());
    bench_pair pair = {0};
    bench_buf out = {0};
    bench_err err = {""};
    peer_ctx ctx = {"/tmp"};
    int rc = view(a, b, &pair, &err) || f->encode(&ctx, &pair, &out, &err);
    if (!rc && ferry_file_write(out_path, out.data, out.size)) rc = die("write", ferry_last_error());
    else if (rc) die("encode", err.msg);
    bench_buf_free(&out);
    free(pair.t);
    ferry_model_free(a);
    ferry_model_free(b);
    return rc ? 1 : 0;
}

static int decode(const peer_format *f, const char *base_path, const char *patch_path, const char *out_path)
{
    double t0 = bench_now();
    ferry_model *a = NULL, *m = NULL;
    void *patch = NULL;
    size_t size = 0;
    if (ferry_model_open(base_path, &a) || ferry_file_read(patch_path, (size_t)1 << 34, &patch, &size))
        return die("open", ferry_last_error());
    bench_pair base = {0};
    bench_err err = {""};
    peer_ctx ctx = {"/tmp"};
    int rc = view(a, NULL, &base, &err);
    uint8_t **out = calloc(base.count ? base.count : 1, sizeof *out);
    if (!out) rc = bench_fail(&err, "out of memory");
    for (size_t i = 0; i < base.count && !rc; i++) {
        out[i] = malloc(base.t[i].nbytes ? base.t[i].nbytes : 1);
        if (!out[i]) rc = bench_fail(&err, "out of memory");
        else memcpy(out[i], base.t[i].old, base.t[i].nbytes);
    }
    if (!rc) rc = f->decode(&ctx, &base, patch, size, out, &err);
    if (rc) die("decode", err.msg);
    if (!rc && ferry_model_create(&m)) rc = die("model", ferry_last_error());
    for (size_t i = 0; i < base.count && !rc; i++) {
        const bench_tensor *t = &base.t[i];
        if (ferry_model_add(m, t->name, t->dtype, t->ndim, t->shape, out[i], t->nbytes, FERRY_ADD_BORROW))
            rc = die("model", ferry_last_error());
    }
    for (size_t i = 0; i < ferry_model_metadata_count(a) && !rc; i++) {
        const char *k, *v;
        if (ferry_model_metadata(a, i, &k, &v) || ferry_model_set_metadata(m, k, v)) rc = die("metadata", ferry_last_error());
    }
    if (!rc && ferry_model_save(m, out_path)) rc = die("save", ferry_last_error());
    if (!rc) printf("decode_s %.4f\n", bench_now() - t0);
    ferry_model_free(m);
    for (size_t i = 0; out && i < base.count; i++) free(out[i]);
    free(out);
    free(base.t);
    ferry_free(patch);
    ferry_model_free(a);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc != 6 || (strcmp(argv[1], "encode") && strcmp(argv[1], "decode"))) {
        fprintf(stderr, "usage: wan_peer encode FORMAT OLD NEW PATCH | decode FORMAT BASE PATCH OUT  (FORMAT: skyrl, sparse)\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof k_formats / sizeof k_formats[0]; i++)
        if (!strcmp(argv[2], k_formats[i].name))
            return argv[1][0] == 'e' ? encode(&k_formats[i], argv[3], argv[4], argv[5])
                                     : decode(&k_formats[i], argv[3], argv[4], argv[5]);
    return die(argv[2], "unknown format (skyrl, sparse)");
}
