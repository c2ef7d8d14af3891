/* libFuzzer target for patch decoding: ferry_patch_inspect, ferry_apply and
 * ferry_apply_inplace on a fixed base (golden model a, built in code once:
 * tests/tools/golden_model.h), checking the contract on untrusted patches:
 *
 *   - a failure returns no model, leaves a message, and is one of the codes
 *     a patch can earn (a hostile patch is never the caller's ARG error,
 *     and never makes the library run out of memory);
 *   - inspect, apply and apply-in-place agree: a header or table error is
 *     the same code from all three; in place fails with apply's code or
 *     refuses a structure change (SHAPE_MISMATCH); it succeeds only where
 *     apply succeeds;
 *   - a failed in-place apply leaves the base's bits unchanged;
 *   - a success yields a model whose hash is the header's target hash.
 * A broken contract aborts, so libFuzzer records the input.
 *
 * The XXH3-128 trailer would stop almost every mutation at the checksum, so
 * the input's last byte (part of the trailer) picks a mode:
 *   bit 0 clear  the input as is;
 *   bit 0 set    the trailer is recomputed first ("resealed"), so mutations
 *                reach the table and the range-coded streams;
 *   bits 0,1 set also the table is given raw: the header's table_zsize
 *                field is the length of an uncompressed table in the input,
 *                which is zstd-compressed here (and the header's table_zsize
 *                and patch size fixed) before resealing, so mutations edit
 *                table fields instead of breaking the zstd frame.
 * Seeds: tests/fuzz/corpus/patch (seed-* and err-* are written by
 * tests/tools/mkgolden; other files are inputs the fuzzer found, kept by
 * -merge=1).  Run, from the repository root after `make fuzz`:
 *   mkdir -p /tmp/fz && ./build-fuzz/fuzz_patch -max_total_time=600 -max_len=4096 \
 *       -dict=tests/fuzz/fuzz_patch.dict /tmp/fz tests/fuzz/corpus/patch
 * (new inputs go to the first directory; `make test` replays the corpus). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zstd.h>

#include "../tools/golden_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define HEADER 64
#define TRAILER 16

/* An invariant of the library: abort (a finding), naming the line. */
#define require(ok) require_at((ok), __LINE__)
static void require_at(int ok, int line)
{
    if (!ok) {
        fprintf(stderr, "fuzz_patch: invariant at tests/fuzz/fuzz_patch.c:%d failed; last error: %s\n", line,
                ferry_last_error());
        abort();
    }
}

static const ferry_model *g_base;
static uint8_t g_base_hash[16];

static void hash_of(const ferry_model *m, uint8_t h[16]) { require(ferry_model_hash(m, h) == FERRY_OK); }

static const ferry_model *base(void)
{
    if (!g_base) {
        ferry_model *m = golden_model('a');
        require(m != NULL);
        hash_of(m, g_base_hash);
        g_base = m;
    }
    return g_base;
}

static ferry_model *clone(const ferry_model *m)
{
    ferry_model *c = NULL;
    require(ferry_model_create(&c) == FERRY_OK);
    for (size_t i = 0; i < ferry_model_count(m); i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        require(ferry_model_add(c, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, FERRY_ADD_COPY) == FERRY_OK);
    }
    for (size_t i = 0; i < ferry_model_metadata_count(m); i++) {
        const char *k, *v;
        require(ferry_model_metadata(m, i, &k, &v) == FERRY_OK);
        require(ferry_model_set_metadata(c, k, v) == FERRY_OK);
    }
    return c;
}

static void reseal(uint8_t *p, size_t n)
{
    XXH128_canonical_t sum;
    XXH128_canonicalFromHash(&sum, XXH3_128bits(p, n - TRAILER));
    memcpy(p + n - TRAILER, &sum, 16);
}

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* The patch to feed, in a buffer of exactly its size (ASan sees overreads). */
static uint8_t *prepare(const uint8_t *data, size_t size, size_t *n)
{
    unsigned mode = size >= HEADER + TRAILER ? data[size - 1] & 3u : 0;
    if (mode == 3) {
        size_t raw = le32(data + 60);
        if (raw > size - HEADER - TRAILER) raw = size - HEADER - TRAILER;
        size_t rest = size - HEADER - raw, bound = ZSTD_compressBound(raw);
        uint8_t *p = malloc(HEADER + bound + rest);
        require(p != NULL);
        size_t z = ZSTD_compress(p + HEADER, bound, data + HEADER, raw, 1);
        require(!ZSTD_isError(z));
        memcpy(p, data, HEADER);
        memcpy(p + HEADER + z, data + HEADER + raw, rest);
        *n = HEADER + z + rest;
        put32(p + 60, (uint32_t)z);
        put64(p + 48, *n);
        reseal(p, *n);
        return p;
    }
    uint8_t *p = malloc(size ? size : 1);
    require(p != NULL);
    if (size) memcpy(p, data, size);
    if (mode & 1) reseal(p, size);
    *n = size;
    return p;
}

/* Codes a patch can earn from apply. */
static int patch_code(int rc)
{
    return (rc >= FERRY_ERR_PATCH_MAGIC && rc <= FERRY_ERR_TARGET_MISMATCH) || rc == FERRY_ERR_LIMIT;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const ferry_model *a = base();
    size_t n;
    uint8_t *p = prepare(data, size, &n);

    /* inspect */
    static int not_null;
    ferry_patch_info *pi = (ferry_patch_info *)(void *)&not_null;
    uint8_t hb[16], ht[16];
    int irc = ferry_patch_inspect(p, n, &pi);
    if (irc) {
        require(pi == NULL && ferry_last_error()[0] != 0 && patch_code(irc) && irc != FERRY_ERR_BASE_MISMATCH &&
                irc != FERRY_ERR_TARGET_MISMATCH);
    } else {
        require(ferry_patch_info_format(pi) >= 1 && ferry_patch_info_format(pi) <= 3);
        ferry_patch_info_hashes(pi, hb, ht);
        uint64_t bytes = 0;
        for (size_t i = 0; i < ferry_patch_info_count(pi); i++) {
            const ferry_patch_tensor_info *t = ferry_patch_info_tensor(pi, i);
            require(t && t->name && t->name[0] && t->kind >= FERRY_PT_SPARSE && t->kind <= FERRY_PT_SAME);
            require(t->kind == FERRY_PT_REMOVED || (unsigned)t->dtype < FERRY_DTYPE_COUNT);
            require(t->changed <= t->nelem);
            require(t->bytes <= n && bytes + t->bytes <= n);
            bytes += t->bytes;
        }
        require(ferry_patch_info_tensor(pi, ferry_patch_info_count(pi)) == NULL);
        ferry_patch_info_free(pi);
    }

    /* apply */
    ferry_model *out = (ferry_model *)(void *)&not_null;
    int rc = ferry_apply(a, p, n, &out);
    if (rc) {
        require(out == NULL && ferry_last_error()[0] != 0 && patch_code(rc));
        require(!irc || rc == irc);
    } else {
        uint8_t h[16];
        require(irc == FERRY_OK && memcmp(hb, g_base_hash, 16) == 0);
        hash_of(out, h);
        require(memcmp(h, ht, 16) == 0);
        ferry_model_free(out);
    }

    /* in place, on a copy the model owns */
    ferry_model *c = clone(a);
    int rc2 = ferry_apply_inplace(c, p, n);
    uint8_t h2[16];
    hash_of(c, h2);
    if (rc2) {
        require(ferry_last_error()[0] != 0 && memcmp(h2, g_base_hash, 16) == 0);
        require(rc2 == rc || (rc2 == FERRY_ERR_SHAPE_MISMATCH && !irc && rc != FERRY_ERR_BASE_MISMATCH));
    } else {
        require(rc == FERRY_OK && memcmp(h2, ht, 16) == 0);
    }
    ferry_model_free(c);
    free(p);
    return 0;
}
