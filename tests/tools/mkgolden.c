/* mkgolden: writes the golden patch files (tests/golden/README.md).
 *
 *   make build/tools/mkgolden && build/tools/mkgolden tests
 *
 * writes, under the directory given (the repository's tests/):
 *   golden/{a,b,c}.safetensors      the models of tests/tools/golden_model.h
 *   golden/{ab,ba,ac}.patch         ferry_diff with default options
 *   golden-errors/patch/NN-description.ERRNAME.patch
 *                                   damaged and hostile patches for base a,
 *                                   each failing ferry_apply with exactly
 *                                   FERRY_ERR_<ERRNAME>
 *   golden-errors/patch-pending/    known bugs: patches that should fail so
 *                                   and do not yet (not checked)
 *   golden/real.txt                 size and XXH3-128 of ferry_diff on a few
 *                                   pairs of ../shared/data ($FERRY_DATA)
 *   fuzz/corpus/patch/seed-*, err-* the patch fuzzer's seeds (seed-rawtab-*
 *                                   in its raw-table mode)
 *
 * Hostile tables are made by decomposing a valid patch (header, parsed
 * table, one payload per entry), editing fields, re-serialising the table,
 * recompressing it and resealing the XXH3-128 trailer, so that the damage
 * reaches the check it is meant for instead of the checksum.  Every file is
 * verified against the library before it is written; the program fails if
 * one does not fail the way its name says. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "codec/patch.h"
#include "codec/sparse.h"
#include "golden_model.h"
#include "model.h"

static const char *g_root;
static ferry_model *g_a;
static int g_files;

static void die(const char *fmt, const char *arg)
{
    fprintf(stderr, "mkgolden: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (%s)\n", ferry_last_error());
    exit(1);
}

static void mkdirs(const char *rel)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_root, rel);
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(path, 0755) && errno != EEXIST) die("cannot create %s", path);
            *p = '/';
        }
    if (mkdir(path, 0755) && errno != EEXIST) die("cannot create %s", path);
}

static void put_file(const char *rel, const void *p, size_t n)
{
    char path[1024];
    static const uint8_t none[1];
    snprintf(path, sizeof path, "%s/%s", g_root, rel);
    if (ferry_file_write(path, n ? p : none, n)) die("cannot write %s", path);
}

/* Removes the generated *.patch files of a directory (a renamed or dropped
 * case must not linger). */
static void clear_dir(const char *rel, const char *prefix)
{
    char dir[1024], path[2048];
    snprintf(dir, sizeof dir, "%s/%s", g_root, rel);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l > 6 && !strcmp(de->d_name + l - 6, ".patch") && !strncmp(de->d_name, prefix, strlen(prefix))) {
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            unlink(path);
        }
    }
    closedir(d);
}

static void model_hash(const ferry_model *m, uint8_t h[16])
{
    if (ferry_model_hash(m, h)) die("%s", "model hash");
}

/* ---------------------------------------------------------------------- *
 * A patch taken apart: header, table, one payload per entry, and bytes
 * after the last payload that no entry claims.
 * ---------------------------------------------------------------------- */

typedef struct gp {
    uint8_t hdr[PATCH_HEADER_SIZE];
    patch_table t;
    ferry_buf *pay; /* t.n payloads */
    ferry_buf tail;
} gp;

static void buf_put(ferry_buf *b, const void *p, size_t n)
{
    if (ferry__buf_append(b, p, n)) die("%s", "out of memory");
}
static void buf_u8(ferry_buf *b, uint8_t v) { buf_put(b, &v, 1); }
static void buf_u16(ferry_buf *b, uint16_t v) { uint8_t t[2]; ferry__put16(t, v); buf_put(b, t, 2); }
static void buf_u32(ferry_buf *b, uint32_t v) { uint8_t t[4]; ferry__put32(t, v); buf_put(b, t, 4); }
static void buf_u64(ferry_buf *b, uint64_t v) { uint8_t t[8]; ferry__put64(t, v); buf_put(b, t, 8); }

static void gp_load(gp *g, const void *patch, size_t n)
{
    memset(g, 0, sizeof *g);
    if (ferry__codec_patch_table_parse(patch, n, &g->t)) die("%s", "cannot parse a generated patch");
    memcpy(g->hdr, patch, PATCH_HEADER_SIZE);
    g->pay = calloc(g->t.n + 1, sizeof *g->pay);
    if (!g->pay) die("%s", "out of memory");
    for (size_t i = 0; i < g->t.n; i++) buf_put(&g->pay[i], (const uint8_t *)patch + g->t.e[i].payload_off, g->t.e[i].payload_size);
}

static void gp_free(gp *g)
{
    for (size_t i = 0; i < g->t.n; i++) ferry__buf_release(&g->pay[i]);
    free(g->pay);
    ferry__buf_release(&g->tail);
    ferry__codec_patch_table_release(&g->t);
}

static size_t gp_find(const gp *g, const char *name)
{
    for (size_t i = 0; i < g->t.n; i++)
        if (!strcmp(g->t.e[i].name, name)) return i;
    die("no entry '%s'", name);
    return 0;
}

static void gp_rename(gp *g, size_t i, const char *name)
{
    free(g->t.e[i].name);
    if (!(g->t.e[i].name = strdup(name))) die("%s", "out of memory");
}

/* Inserts a copy of entry `like` (no payload) at index i under a new name. */
static void gp_insert(gp *g, size_t i, const patch_entry *like_, const char *name)
{
    patch_entry like = *like_; /* may point into the array realloc moves */
    patch_entry *e = realloc(g->t.e, (g->t.n + 1) * sizeof *e);
    ferry_buf *p = realloc(g->pay, (g->t.n + 2) * sizeof *p);
    if (!e || !p) die("%s", "out of memory");
    g->t.e = e;
    g->pay = p;
    memmove(e + i + 1, e + i, (g->t.n - i) * sizeof *e);
    memmove(p + i + 1, p + i, (g->t.n - i) * sizeof *p);
    e[i] = like;
    e[i].payload_size = 0;
    memset(&p[i], 0, sizeof p[i]);
    g->t.n++;
    e[i].name = NULL;
    gp_rename(g, i, name);
}

static void gp_remove(gp *g, size_t i)
{
    free(g->t.e[i].name);
    ferry__buf_release(&g->pay[i]);
    memmove(g->t.e + i, g->t.e + i + 1, (g->t.n - i - 1) * sizeof *g->t.e);
    memmove(g->pay + i, g->pay + i + 1, (g->t.n - i - 1) * sizeof *g->pay);
    g->t.n--;
}

/* Table serialisation (docs/FORMAT.md, "Table"), writing whatever the
 * fields hold: out-of-range values are the point.  Counts may be forced. */
typedef struct tab_over {
    int64_t nmeta, n; /* -1: the real count */
} tab_over;
static const tab_over k_real = {-1, -1};

static void gp_table(const gp *g, const tab_over *o, ferry_buf *tab)
{
    const patch_table *t = &g->t;
    buf_u32(tab, o->nmeta >= 0 ? (uint32_t)o->nmeta : (uint32_t)t->nmeta);
    for (size_t i = 0; i < t->nmeta; i++) {
        buf_u32(tab, (uint32_t)strlen(t->meta_key[i]));
        buf_put(tab, t->meta_key[i], strlen(t->meta_key[i]));
        buf_u32(tab, (uint32_t)strlen(t->meta_val[i]));
        buf_put(tab, t->meta_val[i], strlen(t->meta_val[i]));
    }
    buf_u32(tab, o->n >= 0 ? (uint32_t)o->n : (uint32_t)t->n);
    for (size_t i = 0; i < t->n; i++) {
        const patch_entry *e = &t->e[i];
        buf_u16(tab, (uint16_t)strlen(e->name));
        buf_put(tab, e->name, strlen(e->name));
        buf_u8(tab, e->kind);
        if (e->kind == PK_REMOVED) continue;
        buf_u8(tab, (uint8_t)e->dtype);
        buf_u8(tab, (uint8_t)e->ndim);
        for (uint32_t d = 0; d < e->ndim; d++) buf_u64(tab, d < FERRY_MAX_DIMS ? e->shape[d] : 1);
        buf_put(tab, e->hash, 16);
        if (e->kind == PK_SAME) continue;
        if (e->kind == PK_SPARSE) {
            buf_u8(tab, e->chunk_log2);
            buf_u64(tab, e->changed);
        } else {
            buf_u8(tab, e->codec);
        }
        buf_u64(tab, e->payload_size);
    }
}

static void reseal(ferry_buf *p)
{
    if (p->size < PATCH_TRAILER_SIZE) return;
    XXH128_canonical_t sum;
    XXH128_canonicalFromHash(&sum, XXH3_128bits(p->data, p->size - PATCH_TRAILER_SIZE));
    memcpy(p->data + p->size - PATCH_TRAILER_SIZE, &sum, 16);
}

/* header, zstd(table) (level 19, as ferry_diff writes it), payloads, tail,
 * trailer; the header's sizes describe what was written. */
static void gp_assemble(const gp *g, const void *tab, size_t tab_size, ferry_buf *out)
{
    memset(out, 0, sizeof *out);
    size_t bound = ZSTD_compressBound(tab_size);
    uint8_t *z = malloc(bound);
    if (!z) die("%s", "out of memory");
    size_t zs = ZSTD_compress(z, bound, tab, tab_size, 19);
    if (ZSTD_isError(zs)) die("zstd: %s", ZSTD_getErrorName(zs));
    buf_put(out, g->hdr, PATCH_HEADER_SIZE);
    buf_put(out, z, zs);
    free(z);
    for (size_t i = 0; i < g->t.n; i++) buf_put(out, g->pay[i].data, g->pay[i].size);
    buf_put(out, g->tail.data, g->tail.size);
    buf_put(out, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 16);
    ferry__put64(out->data + 48, out->size);
    ferry__put32(out->data + 56, (uint32_t)tab_size);
    ferry__put32(out->data + 60, (uint32_t)zs);
    reseal(out);
}

static void gp_build(const gp *g, const tab_over *o, ferry_buf *out)
{
    ferry_buf tab = {0};
    gp_table(g, o, &tab);
    gp_assemble(g, tab.data, tab.size, out);
    ferry__buf_release(&tab);
}

/* Sets every entry's payload_size to its payload's length. */
static void gp_sync(gp *g)
{
    for (size_t i = 0; i < g->t.n; i++) g->t.e[i].payload_size = g->pay[i].size;
}

/* ---------------------------------------------------------------------- *
 * Emitting and verifying
 * ---------------------------------------------------------------------- */

static const struct { const char *name; int code; } k_codes[] = {
    {"PATCH_MAGIC", FERRY_ERR_PATCH_MAGIC},         {"PATCH_VERSION", FERRY_ERR_PATCH_VERSION},
    {"PATCH_TRUNCATED", FERRY_ERR_PATCH_TRUNCATED}, {"PATCH_CORRUPT", FERRY_ERR_PATCH_CORRUPT},
    {"PATCH_CHECKSUM", FERRY_ERR_PATCH_CHECKSUM},   {"BASE_MISMATCH", FERRY_ERR_BASE_MISMATCH},
    {"TARGET_MISMATCH", FERRY_ERR_TARGET_MISMATCH}, {"LIMIT", FERRY_ERR_LIMIT},
};

/* Writes golden-errors/patch/NN-what.ERR.patch (and the fuzz seed) after
 * checking that ferry_apply on base a fails with exactly that code. */
static void emit(int nn, const char *what, const char *err, const void *p, size_t n)
{
    int want = -1;
    for (size_t i = 0; i < sizeof k_codes / sizeof k_codes[0]; i++)
        if (!strcmp(k_codes[i].name, err)) want = k_codes[i].code;
    char name[256], rel[512];
    snprintf(name, sizeof name, "%02d-%s.%s.patch", nn, what, err);
    if (want < 0) die("%s: unknown error name", name);
    ferry_model *out = NULL;
    int rc = ferry_apply(g_a, n ? p : "", n, &out);
    if (rc != want || out) {
        fprintf(stderr, "mkgolden: %s: ferry_apply returned %d (%s: %s), want %d\n", name, rc, ferry_strerror(rc),
                ferry_last_error(), want);
        exit(1);
    }
    snprintf(rel, sizeof rel, "golden-errors/patch/%s", name);
    put_file(rel, p, n);
    snprintf(rel, sizeof rel, "fuzz/corpus/patch/err-%s", name);
    put_file(rel, p, n);
    printf("  %-60s %6zu bytes  %s\n", name, n, ferry_last_error());
    g_files++;
}

static void emit_buf(int nn, const char *what, const char *err, ferry_buf *b)
{
    emit(nn, what, err, b->data, b->size);
    ferry__buf_release(b);
}

/* A fresh editable copy of a patch. */
static ferry_buf copy_of(const void *p, size_t n)
{
    ferry_buf b = {0};
    buf_put(&b, p, n);
    return b;
}

/* Emits g rebuilt with the real counts, then frees g. */
static void emit_gp(int nn, const char *what, const char *err, gp *g)
{
    ferry_buf b;
    gp_build(g, &k_real, &b);
    gp_free(g);
    emit_buf(nn, what, err, &b);
}

/* Replaces the first occurrence of needle in the buffer's bytes from `from`
 * on; dies if absent. */
static void replace_bytes(ferry_buf *b, size_t from, const char *needle, const void *with, size_t len)
{
    size_t nl = strlen(needle);
    for (size_t i = from; i + nl <= b->size; i++)
        if (!memcmp(b->data + i, needle, nl)) {
            memcpy(b->data + i, with, len);
            return;
        }
    die("'%s' not found", needle);
}

/* ---------------------------------------------------------------------- *
 * The cases.  P = ab.patch (changes structure: whole, removed, metadata);
 * S = ac.patch (sparse changes only: applies in place), so damage found
 * while decoding gives the same code in place; X = a patch for base c.
 * ---------------------------------------------------------------------- */

typedef struct src { const uint8_t *p; size_t n; } src;

static void framing_cases(src P, src X)
{
    ferry_buf b;
    emit(0, "empty-file", "PATCH_MAGIC", "", 0);
    b = copy_of(P.p, P.n);
    b.data[0] = 'G';
    reseal(&b);
    emit_buf(1, "bad-magic", "PATCH_MAGIC", &b);
    emit(2, "magic-only", "PATCH_TRUNCATED", P.p, 8);
    emit(3, "truncated-header", "PATCH_TRUNCATED", P.p, 40);
    emit(4, "truncated-in-table", "PATCH_TRUNCATED", P.p, PATCH_HEADER_SIZE + ferry__le32(P.p + 60) / 2);
    emit(5, "truncated-in-payload", "PATCH_TRUNCATED", P.p, P.n - 100);
    emit(6, "truncated-tail", "PATCH_TRUNCATED", P.p, P.n - 1);
    b = copy_of(P.p, P.n);
    buf_put(&b, "\0\0\0\0", 4);
    emit_buf(7, "extra-bytes-after-end", "PATCH_CORRUPT", &b);
    b = copy_of(P.p, P.n);
    ferry__put32(b.data + 8, PATCH_VERSION_MAX + 1);
    reseal(&b);
    emit_buf(8, "unknown-version", "PATCH_VERSION", &b);
    b = copy_of(P.p, P.n);
    ferry__put32(b.data + 8, 0);
    reseal(&b);
    emit_buf(9, "version-zero", "PATCH_VERSION", &b);
    b = copy_of(P.p, P.n);
    ferry__put32(b.data + 12, 1);
    reseal(&b);
    emit_buf(10, "unknown-flags", "PATCH_CORRUPT", &b);
    b = copy_of(P.p, P.n);
    ferry__put64(b.data + 48, P.n + 1);
    reseal(&b);
    emit_buf(11, "declared-size-larger", "PATCH_TRUNCATED", &b);
    b = copy_of(P.p, P.n);
    b.data[40] ^= 0x10;
    emit_buf(12, "bitflip-header", "PATCH_CHECKSUM", &b);
    b = copy_of(P.p, P.n);
    b.data[PATCH_HEADER_SIZE + 9] ^= 0x01;
    emit_buf(13, "bitflip-table", "PATCH_CHECKSUM", &b);
    b = copy_of(P.p, P.n);
    b.data[P.n - 40] ^= 0x80;
    emit_buf(14, "bitflip-payload", "PATCH_CHECKSUM", &b);
    b = copy_of(P.p, P.n);
    b.data[P.n - 1] ^= 0x04;
    emit_buf(15, "bitflip-trailer", "PATCH_CHECKSUM", &b);
    b = copy_of(P.p, P.n);
    memset(b.data + P.n - 16, 0, 16);
    emit_buf(16, "zeroed-trailer", "PATCH_CHECKSUM", &b);
    emit(17, "patch-for-another-base", "BASE_MISMATCH", X.p, X.n);
    b = copy_of(P.p, P.n);
    b.data[20] ^= 0xFF;
    reseal(&b);
    emit_buf(18, "base-hash-edited", "BASE_MISMATCH", &b);
}

/* Header table sizes, behind a resealed trailer. */
static void header_table_cases(src P)
{
    ferry_buf b;
    uint32_t raw = ferry__le32(P.p + 56), zs = ferry__le32(P.p + 60);
    b = copy_of(P.p, P.n);
    ferry__put32(b.data + 56, PATCH_TABLE_MAX + 1);
    reseal(&b);
    emit_buf(20, "table-size-over-limit", "LIMIT", &b);
    b = copy_of(P.p, P.n);
    ferry__put32(b.data + 56, UINT32_MAX);
    reseal(&b);
    emit_buf(21, "table-size-max", "LIMIT", &b);
    b = copy_of(P.p, P.n);
    ferry__put32(b.data + 60, (uint32_t)(P.n - PATCH_HEADER_SIZE - PATCH_TRAILER_SIZE + 1));
    reseal(&b);
    emit_buf(22, "table-zsize-past-end", "PATCH_CORRUPT", &b);
    b = copy_of(P.p, P.n);
    ferry__put32(b.data + 56, raw - 1);
    reseal(&b);
    emit_buf(23, "table-size-too-small", "PATCH_CORRUPT", &b);
    b = copy_of(P.p, P.n);
    ferry__put32(b.data + 56, raw + 1);
    reseal(&b);
    emit_buf(24, "table-size-too-large", "PATCH_CORRUPT", &b);
    b = copy_of(P.p, P.n);
    for (uint32_t i = 0; i < zs; i++) b.data[PATCH_HEADER_SIZE + i] = (uint8_t)(0xA5 ^ i);
    reseal(&b);
    emit_buf(25, "table-not-zstd", "PATCH_CORRUPT", &b);
    b = copy_of(P.p, P.n);
    ferry__put32(b.data + 60, zs - 1);
    reseal(&b);
    emit_buf(26, "table-zsize-short", "PATCH_CORRUPT", &b);
}

/* Table contents: decompressed, edited, recompressed, resealed. */
static void table_cases(src P)
{
    gp g;
    ferry_buf tab = {0}, b;

    gp_load(&g, P.p, P.n);
    gp_table(&g, &k_real, &tab);
    tab.size = tab.size * 3 / 5; /* cut inside an entry */
    gp_assemble(&g, tab.data, tab.size, &b);
    ferry__buf_release(&tab);
    gp_free(&g);
    emit_buf(30, "table-truncated-in-entry", "PATCH_TRUNCATED", &b);

    gp_load(&g, P.p, P.n);
    gp_table(&g, &k_real, &tab);
    buf_put(&tab, "xyz", 3);
    gp_assemble(&g, tab.data, tab.size, &b);
    ferry__buf_release(&tab);
    gp_free(&g);
    emit_buf(31, "table-trailing-bytes", "PATCH_CORRUPT", &b);

    gp_load(&g, P.p, P.n);
    gp_build(&g, &(tab_over){UINT32_MAX, -1}, &b);
    gp_free(&g);
    emit_buf(32, "metadata-count-huge", "PATCH_CORRUPT", &b);

    gp_load(&g, P.p, P.n);
    { /* keys strictly increasing: swap the first two */
        char *k = g.t.meta_key[0], *v = g.t.meta_val[0];
        g.t.meta_key[0] = g.t.meta_key[1], g.t.meta_val[0] = g.t.meta_val[1];
        g.t.meta_key[1] = k, g.t.meta_val[1] = v;
    }
    emit_gp(33, "metadata-out-of-order", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    gp_table(&g, &k_real, &tab);
    replace_bytes(&tab, 0, "format", "for\0at", 6);
    gp_assemble(&g, tab.data, tab.size, &b);
    ferry__buf_release(&tab);
    gp_free(&g);
    emit_buf(34, "metadata-key-with-nul", "PATCH_CORRUPT", &b);

    gp_load(&g, P.p, P.n);
    gp_build(&g, &(tab_over){-1, UINT32_MAX}, &b);
    gp_free(&g);
    emit_buf(35, "tensor-count-huge", "PATCH_CORRUPT", &b);

    gp_load(&g, P.p, P.n);
    gp_build(&g, &(tab_over){-1, (int64_t)g.t.n + 1}, &b);
    gp_free(&g);
    emit_buf(36, "tensor-count-one-more", "PATCH_TRUNCATED", &b);

    gp_load(&g, P.p, P.n);
    { /* swap two entries together with their payloads */
        patch_entry e = g.t.e[1];
        ferry_buf p = g.pay[1];
        g.t.e[1] = g.t.e[2], g.pay[1] = g.pay[2];
        g.t.e[2] = e, g.pay[2] = p;
    }
    emit_gp(37, "names-out-of-order", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    gp_rename(&g, 2, g.t.e[1].name);
    emit_gp(38, "duplicate-name", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    gp_rename(&g, 0, "");
    emit_gp(39, "empty-name", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    gp_table(&g, &k_real, &tab);
    replace_bytes(&tab, 0, "layers.0.attn.wq", "layers.0\0attn.wq", 16);
    gp_assemble(&g, tab.data, tab.size, &b);
    ferry__buf_release(&tab);
    gp_free(&g);
    emit_buf(40, "name-with-nul", "PATCH_CORRUPT", &b);

    gp_load(&g, P.p, P.n);
    g.t.e[gp_find(&g, "layers.0.attn.wq")].kind = 4;
    emit_gp(41, "unknown-kind", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    g.t.e[gp_find(&g, "layers.0.attn.wq")].dtype = FERRY_DTYPE_COUNT;
    emit_gp(42, "invalid-dtype", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    g.t.e[gp_find(&g, "layers.0.attn.wq")].ndim = FERRY_MAX_DIMS + 1;
    emit_gp(43, "too-many-dims", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    {
        patch_entry *e = &g.t.e[gp_find(&g, "new.bias")];
        e->ndim = 3;
        e->shape[0] = e->shape[1] = e->shape[2] = (uint64_t)1 << 22;
    }
    emit_gp(44, "shape-element-count-overflows", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    {
        patch_entry *e = &g.t.e[gp_find(&g, "new.bias")];
        e->dtype = FERRY_F4;
        e->shape[0] = 7; /* 28 bits: not whole bytes */
    }
    emit_gp(45, "subbyte-shape-not-whole-bytes", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    g.t.e[gp_find(&g, "embed.weight")].chunk_log2 = SP_CHUNK_LOG2_MIN - 1;
    emit_gp(46, "chunk-log2-too-small", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    g.t.e[gp_find(&g, "embed.weight")].chunk_log2 = SP_CHUNK_LOG2_MAX + 1;
    emit_gp(47, "chunk-log2-too-large", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    {
        patch_entry *e = &g.t.e[gp_find(&g, "embed.weight")];
        e->changed = e->nwords + 1;
    }
    emit_gp(48, "changed-more-than-tensor", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    g.t.e[gp_find(&g, "new.bias")].codec = 2;
    emit_gp(49, "unknown-whole-codec", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    g.t.e[gp_find(&g, "embed.weight")].payload_size = UINT64_MAX;
    emit_gp(50, "payload-size-huge", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    g.t.e[gp_find(&g, "embed.weight")].payload_size += 1;
    emit_gp(51, "payload-sizes-past-the-end", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    buf_put(&g.tail, "\x01\x02\x03\x04\x05", 5);
    emit_gp(52, "payload-bytes-unclaimed", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    g.t.e[gp_find(&g, "scale")].payload_size -= 1;
    emit_gp(53, "payload-sizes-short", "PATCH_CORRUPT", &g);
}

/* The table is well formed but does not fit base a (found when the entries
 * are matched to the base, before anything is decoded). */
static void base_match_cases(src P)
{
    gp g;
    gp_load(&g, P.p, P.n);
    gp_remove(&g, gp_find(&g, "layers.0.ln.bias"));
    emit_gp(60, "base-tensor-not-named", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    {
        patch_entry like = {.kind = PK_REMOVED};
        gp_insert(&g, g.t.n, &like, "zz.ghost");
    }
    emit_gp(61, "removed-tensor-not-in-base", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    gp_insert(&g, 0, &g.t.e[gp_find(&g, "layers.0.ln.bias")], "aa.ghost");
    emit_gp(62, "same-tensor-not-in-base", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    {
        patch_entry *e = &g.t.e[gp_find(&g, "layers.0.attn.wq")];
        e->shape[0] = 12, e->shape[1] = 48; /* same element count */
    }
    emit_gp(63, "sparse-base-has-another-shape", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    g.t.e[gp_find(&g, "embed.weight")].dtype = FERRY_F16; /* same size */
    emit_gp(64, "sparse-base-has-another-dtype", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    {
        patch_entry *e = &g.t.e[gp_find(&g, "layers.0.ln.bias")];
        e->ndim = 2, e->shape[0] = 2, e->shape[1] = 12;
    }
    emit_gp(65, "same-base-has-another-shape", "PATCH_CORRUPT", &g);
}

/* Damage found while decoding payloads or checking the result. */
static void decode_cases(src P, src S)
{
    gp g;
    ferry_buf b;

    gp_load(&g, S.p, S.n);
    g.t.e[gp_find(&g, "layers.0.ln.bias")].hash[3] ^= 1;
    emit_gp(70, "same-tensor-wrong-hash", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    {
        size_t i = gp_find(&g, "new.bias");
        if (g.t.e[i].codec != WHOLE_RAW) die("%s", "new.bias is expected raw");
        buf_put(&g.pay[i], "\0\0\0\0", 4);
        gp_sync(&g);
    }
    emit_gp(71, "whole-raw-payload-wrong-size", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    {
        patch_entry *e = &g.t.e[gp_find(&g, "reshaped.weight")];
        if (e->codec != WHOLE_ZSTD) die("%s", "reshaped.weight is expected zstd");
        e->shape[1] += 1; /* declares 16 x 7: the frame holds 16 x 6 */
    }
    emit_gp(72, "whole-zstd-decodes-to-wrong-size", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    {
        patch_entry *e = &g.t.e[gp_find(&g, "reshaped.weight")];
        e->shape[1] -= 1; /* 16 x 5: the frame does not fit */
    }
    emit_gp(73, "whole-zstd-larger-than-tensor", "PATCH_CORRUPT", &g);

    gp_load(&g, P.p, P.n);
    {
        ferry_buf *p = &g.pay[gp_find(&g, "reshaped.weight")];
        memset(p->data, 0xFF, p->size);
    }
    emit_gp(74, "whole-zstd-not-a-frame", "PATCH_CORRUPT", &g);

    gp_load(&g, S.p, S.n);
    {
        ferry_buf *p = &g.pay[gp_find(&g, "embed.weight")];
        uint64_t s = 0x6761726261676521ull;
        for (size_t i = 4; i < p->size; i++) p->data[i] = (uint8_t)golden_rnd(&s);
    }
    emit_gp(75, "sparse-stream-garbage", "PATCH_CORRUPT", &g);

    gp_load(&g, S.p, S.n);
    {
        size_t i = gp_find(&g, "embed.weight");
        ferry_buf *p = &g.pay[i];
        p->size -= 4; /* the coder's last bytes: the decoder reads past the end */
        ferry__put32(p->data, (uint32_t)(p->size - 4));
        gp_sync(&g);
    }
    emit_gp(76, "sparse-stream-truncated", "PATCH_CORRUPT", &g);

    gp_load(&g, S.p, S.n);
    ferry__put32(g.pay[gp_find(&g, "embed.weight")].data, UINT32_MAX);
    emit_gp(78, "chunk-length-past-payload", "PATCH_CORRUPT", &g);

    gp_load(&g, S.p, S.n);
    g.t.e[gp_find(&g, "embed.weight")].chunk_log2 = SP_CHUNK_LOG2_MIN; /* 2 chunks, one length */
    emit_gp(79, "chunk-table-disagrees", "PATCH_CORRUPT", &g);

    gp_load(&g, S.p, S.n);
    { /* embed's payload shrinks to 3 bytes, the next one takes the rest */
        size_t i = gp_find(&g, "embed.weight"), j = gp_find(&g, "layers.0.attn.wq");
        g.t.e[j].payload_size += g.t.e[i].payload_size - 3;
        g.t.e[i].payload_size = 3;
    }
    emit_gp(80, "sparse-payload-shorter-than-chunk-table", "PATCH_CORRUPT", &g);

    gp_load(&g, S.p, S.n);
    {
        size_t i = gp_find(&g, "embed.weight");
        buf_put(&g.pay[i], "\0\0\0", 3);
        gp_sync(&g);
    }
    emit_gp(81, "sparse-payload-unread-bytes", "PATCH_CORRUPT", &g);

    gp_load(&g, S.p, S.n);
    g.t.e[gp_find(&g, "embed.weight")].hash[0] ^= 0x80;
    emit_gp(82, "wrong-target-tensor-hash", "TARGET_MISMATCH", &g);

    gp_load(&g, P.p, P.n);
    g.t.e[gp_find(&g, "new.bias")].hash[15] ^= 0x01;
    emit_gp(83, "wrong-target-tensor-hash-whole", "TARGET_MISMATCH", &g);

    b = copy_of(S.p, S.n);
    b.data[32] ^= 0x01;
    reseal(&b);
    emit_buf(84, "wrong-target-model-hash", "TARGET_MISMATCH", &b);

    b = copy_of(P.p, P.n);
    b.data[47] ^= 0x01;
    reseal(&b);
    emit_buf(85, "wrong-target-model-hash-structural", "TARGET_MISMATCH", &b);

    gp_load(&g, S.p, S.n);
    { /* the metadata is covered by the target hash */
        size_t k = 0;
        while (k < g.t.nmeta && strcmp(g.t.meta_key[k], "step")) k++;
        if (k == g.t.nmeta) die("%s", "no 'step' metadata");
        free(g.t.meta_val[k]);
        g.t.meta_val[k] = strdup("9");
    }
    emit_gp(86, "metadata-not-the-target", "TARGET_MISMATCH", &g);
}

/* Known bugs go to golden-errors/patch-pending/ (tests/golden/README.md,
 * "Pending"), unchecked, until the library passes them; none now. */
/* Cases found by fuzzing and fixed since (they were pending once). */
static void fixed_cases(src P, src S, const ferry_model *c)
{
    gp g;
    ferry_buf b;

    /* A WHOLE entry declaring 4 TiB: refused before anything is allocated
     * (the payload's size must be the tensor's). */
    gp_load(&g, P.p, P.n);
    g.t.e[gp_find(&g, "new.bias")].shape[0] = (uint64_t)1 << 40;
    gp_build(&g, &k_real, &b);
    gp_free(&g);
    emit_buf(90, "whole-shape-larger-than-payload", "PATCH_CORRUPT", &b);

    /* A WHOLE tensor named with 5000 bytes, hashes correct: names are
     * bounded by FERRY_MAX_NAME in the table too. */
    gp_load(&g, S.p, S.n);
    {
        char name[5001];
        memset(name, 'z', 5000);
        name[5000] = 0;
        patch_entry like = g.t.e[gp_find(&g, "scale")];
        like.kind = PK_WHOLE;
        like.codec = WHOLE_RAW;
        gp_insert(&g, g.t.n, &like, name);
        size_t i = g.t.n - 1, k = 0;
        float v = 1.0f;
        buf_put(&g.pay[i], &v, 4);
        gp_sync(&g);
        ferry__tensor_hash_parts(name, FERRY_F32, 0, NULL, &v, 4, g.t.e[i].hash);
        uint8_t(*th)[16] = calloc(g.t.n, 16), mh[16];
        if (!th) die("%s", "out of memory");
        for (size_t j = 0; j < g.t.n; j++) {
            const ferry_tensor *t = ferry_model_find(c, g.t.e[j].name);
            if (t) ferry_tensor_hash(t, th[k++]);
            else memcpy(th[k++], g.t.e[j].hash, 16);
        }
        ferry__model_hash_from((const uint8_t(*)[16])th, k, g.t.nmeta, (const char *const *)g.t.meta_key,
                               (const char *const *)g.t.meta_val, mh);
        memcpy(g.hdr + 32, mh, 16);
        free(th);
    }
    gp_build(&g, &k_real, &b);
    gp_free(&g);
    emit_buf(91, "name-longer-than-FERRY_MAX_NAME", "PATCH_CORRUPT", &b);

    /* The entry's changed count is one more than its stream codes: the
     * decoder checks the total (docs/FORMAT.md). */
    gp_load(&g, S.p, S.n);
    g.t.e[gp_find(&g, "embed.weight")].changed += 1;
    gp_build(&g, &k_real, &b);
    gp_free(&g);
    emit_buf(77, "changed-count-disagrees-with-stream", "PATCH_CORRUPT", &b);
}

/* ---------------------------------------------------------------------- */

static void save_model(const ferry_model *m, const char *rel)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_root, rel);
    if (ferry_model_save(m, path)) die("cannot save %s", path);
}

/* diff, check that it applies to the target, write (and seed the fuzzer). */
static void golden_patch(const ferry_model *from, const ferry_model *to, const char *rel, const char *seed, void **p, size_t *n)
{
    if (ferry_diff(from, to, NULL, p, n)) die("diff for %s", rel);
    ferry_model *out = NULL;
    uint8_t h1[16], h2[16];
    if (ferry_apply(from, *p, *n, &out)) die("apply of %s", rel);
    model_hash(out, h1);
    model_hash(to, h2);
    if (memcmp(h1, h2, 16)) die("%s does not reproduce its target", rel);
    ferry_model_free(out);
    if (rel) put_file(rel, *p, *n);
    char srel[256];
    snprintf(srel, sizeof srel, "fuzz/corpus/patch/seed-%s.patch", seed);
    put_file(srel, *p, *n);
    printf("  %-60s %6zu bytes\n", rel ? rel : srel, *n);
}

/* golden/real.txt: size and XXH3-128 of ferry_diff on pairs of the shared
 * checkpoints ($FERRY_DATA, default ../shared/data); kept as is when the
 * data is absent. */
static void real_pairs(void)
{
    static const char *const pairs[][2] = {
        {"rl-b/step-000.safetensors", "rl-b/step-001.safetensors"},
        {"rl-a/step-007.safetensors", "rl-a/step-008.safetensors"},
        {"rl-a/step-000.safetensors", "rl-a/step-008.safetensors"},
        {"rl-a/master-000.safetensors", "rl-a/master-001.safetensors"},
    };
    const char *data = getenv("FERRY_DATA");
    if (!data || !*data) data = "../shared/data";
    ferry_buf txt = {0};
    const char *head = "# ferry_diff(OLD, NEW, default options) on the shared checkpoints ($FERRY_DATA):\n"
                       "# OLD NEW patch-bytes XXH3-128-of-the-patch (canonical hex).  Written by mkgolden.\n";
    buf_put(&txt, head, strlen(head));
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        char pa[1024], pb[1024], line[512], hex[33];
        snprintf(pa, sizeof pa, "%s/%s", data, pairs[i][0]);
        snprintf(pb, sizeof pb, "%s/%s", data, pairs[i][1]);
        ferry_model *a = NULL, *b = NULL;
        if (ferry_model_open(pa, &a) || ferry_model_open(pb, &b)) {
            fprintf(stderr, "mkgolden: %s: %s; golden/real.txt kept as it is\n", data, ferry_last_error());
            ferry_model_free(a);
            ferry__buf_release(&txt);
            return;
        }
        void *p;
        size_t n;
        if (ferry_diff(a, b, NULL, &p, &n)) die("diff of %s", pa);
        XXH128_canonical_t h;
        XXH128_canonicalFromHash(&h, XXH3_128bits(p, n));
        for (int k = 0; k < 16; k++) snprintf(hex + 2 * k, 3, "%02x", h.digest[k]);
        snprintf(line, sizeof line, "%s %s %zu %s\n", pairs[i][0], pairs[i][1], n, hex);
        buf_put(&txt, line, strlen(line));
        printf("  real: %s", line);
        ferry_free(p);
        ferry_model_free(a);
        ferry_model_free(b);
    }
    put_file("golden/real.txt", txt.data, txt.size);
    ferry__buf_release(&txt);
}

/* A fuzz seed in the patch fuzzer's raw-table mode (tests/fuzz/fuzz_patch.c):
 * the table uncompressed, table_zsize = its length, trailer ending in 0x03. */
static void rawtab_seed(const char *seed, const void *patch, size_t n)
{
    gp g;
    ferry_buf tab = {0}, out = {0};
    gp_load(&g, patch, n);
    gp_table(&g, &k_real, &tab);
    buf_put(&out, g.hdr, PATCH_HEADER_SIZE);
    buf_put(&out, tab.data, tab.size);
    for (size_t i = 0; i < g.t.n; i++) buf_put(&out, g.pay[i].data, g.pay[i].size);
    buf_put(&out, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\3", 16);
    ferry__put64(out.data + 48, out.size);
    ferry__put32(out.data + 56, (uint32_t)tab.size);
    ferry__put32(out.data + 60, (uint32_t)tab.size);
    char rel[256];
    snprintf(rel, sizeof rel, "fuzz/corpus/patch/seed-rawtab-%s.patch", seed);
    put_file(rel, out.data, out.size);
    ferry__buf_release(&out);
    ferry__buf_release(&tab);
    gp_free(&g);
}

int main(int argc, char **argv)
{
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: mkgolden TESTS_DIR   (from the repository root: build/tools/mkgolden tests)\n");
        return 2;
    }
    g_root = argv[1];
    mkdirs("golden");
    mkdirs("golden-errors/patch");
    mkdirs("fuzz/corpus/patch");
    clear_dir("golden-errors/patch", "");
    clear_dir("fuzz/corpus/patch", "err-");
    clear_dir("fuzz/corpus/patch", "seed-");

    ferry_model *a = golden_model('a'), *b = golden_model('b'), *c = golden_model('c'), *e = NULL;
    if (!a || !b || !c || ferry_model_create(&e)) die("%s", "cannot build the golden models");
    g_a = a;
    save_model(a, "golden/a.safetensors");
    save_model(b, "golden/b.safetensors");
    save_model(c, "golden/c.safetensors");

    void *ab, *ba, *ac, *cb, *tmp;
    size_t nab, nba, nac, ncb, ntmp;
    golden_patch(a, b, "golden/ab.patch", "ab", &ab, &nab);
    golden_patch(b, a, "golden/ba.patch", "ba", &ba, &nba);
    golden_patch(a, c, "golden/ac.patch", "ac", &ac, &nac);
    golden_patch(c, b, NULL, "cb", &cb, &ncb);
    golden_patch(a, a, NULL, "aa", &tmp, &ntmp);
    ferry_free(tmp);
    golden_patch(a, e, NULL, "a-empty", &tmp, &ntmp);
    ferry_free(tmp);

    /* The table serialiser must be the format: rebuilding a patch from its
     * parts gives back the same bytes. */
    const src P = {ab, nab}, S = {ac, nac}, X = {cb, ncb};
    const src all[3] = {P, S, X};
    for (int i = 0; i < 3; i++) {
        gp g;
        ferry_buf r;
        gp_load(&g, all[i].p, all[i].n);
        gp_build(&g, &k_real, &r);
        if (r.size != all[i].n || memcmp(r.data, all[i].p, r.size)) die("%s", "table serialiser differs from ferry_diff");
        ferry__buf_release(&r);
        gp_free(&g);
    }

    rawtab_seed("ab", ab, nab);
    rawtab_seed("ac", ac, nac);

    framing_cases(P, X);
    header_table_cases(P);
    table_cases(P);
    base_match_cases(P);
    decode_cases(P, S);
    printf("%d must-fail patches\n", g_files);
    mkdirs("golden-errors/patch-pending");
    clear_dir("golden-errors/patch-pending", "");
    fixed_cases(P, S, c);
    real_pairs();

    ferry_free(ab);
    ferry_free(ba);
    ferry_free(ac);
    ferry_free(cb);
    ferry_model_free(a);
    ferry_model_free(b);
    ferry_model_free(c);
    ferry_model_free(e);
    return 0;
}
