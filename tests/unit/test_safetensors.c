/* lib/io: safetensors reading (real checkpoints, every rejection rule,
 * golden must-fail files), writing (reference bytes, round trips, atomic
 * failure) and sharded checkpoints. */
#include "check.h"
#include "helpers.h"
#include "io/io.h"

#include <dirent.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------------- *
 * Helpers
 * ---------------------------------------------------------------------- */

static char g_tmp[256]; /* per-run scratch directory */

static const char *tmp_path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", g_tmp, name);
    return buf;
}

static int write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = n ? fwrite(p, 1, n, f) : 0;
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

/* A safetensors image: u64 length | header (space-padded to 8) | data_len
 * bytes 0, 1, 2, ... */
static size_t build_st(uint8_t *out, size_t cap, const char *header, size_t data_len)
{
    size_t h = strlen(header), padded = h + (8 - h % 8) % 8, total = 8 + padded + data_len;
    if (total > cap) abort();
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(out + 8, header, h);
    memset(out + 8 + h, ' ', padded - h);
    for (size_t i = 0; i < data_len; i++) out[8 + padded + i] = (uint8_t)i;
    return total;
}

/* Writes the image to a file, opens it, and checks the status and (when
 * given) a fragment of the message; the in-memory parser must agree.
 * Returns the model on success (caller frees). */
static ferry_model *expect_open(const uint8_t *img, size_t n, int want, const char *fragment)
{
    char path[512];
    tmp_path(path, sizeof path, "case.safetensors");
    CHECK(write_bytes(path, img, n) == 0);
    ferry_model *m = NULL;
    CHECK_RC(ferry_model_open(path, &m), want);
    if (want) {
        CHECK(m == NULL);
        CHECK(strstr(ferry_last_error(), "case.safetensors") != NULL);
        if (fragment && !strstr(ferry_last_error(), fragment)) {
            fprintf(stderr, "  message '%s' lacks '%s'\n", ferry_last_error(), fragment);
            CHECK(0);
        }
    }
    ferry_model *mb = NULL;
    CHECK_RC(ferry__st_parse_buffer(img, n, "mem", &mb), want);
    ferry_model_free(mb);
    unlink(path);
    return m;
}

static void expect_header(const char *header, size_t data_len, int want, const char *fragment)
{
    uint8_t img[8192];
    ferry_model_free(expect_open(img, build_st(img, sizeof img, header, data_len), want, fragment));
}

static void write_text(const char *path, const char *fmt, ...);

static void hash_of(const ferry_model *m, uint8_t h[16])
{
    memset(h, 0, 16);
    CHECK_OK(ferry_model_hash(m, h));
}

static bool same_hash(const ferry_model *a, const ferry_model *b)
{
    uint8_t x[16], y[16];
    hash_of(a, x);
    hash_of(b, y);
    return memcmp(x, y, 16) == 0;
}

/* ---------------------------------------------------------------------- *
 * Real checkpoints (../shared/data)
 * ---------------------------------------------------------------------- */

static const char *const k_runs[] = {"rl-a", "rl-b"};

static void test_open_shared_data(void)
{
    SKIP_UNLESS_DATA("rl-a");
    SKIP_UNLESS_DATA("rl-b");
    int files = 0;
    for (size_t r = 0; r < 2; r++) {
        char dir[512];
        data_path(dir, sizeof dir, k_runs[r]);
        DIR *d = opendir(dir);
        CHECK(d != NULL);
        if (!d) continue;
        struct dirent *de;
        while ((de = readdir(d))) {
            size_t len = strlen(de->d_name);
            if (len < 12 || strcmp(de->d_name + len - 12, ".safetensors")) continue;
            char path[1024];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            ferry_model *m = NULL;
            CHECK_RC(ferry_model_open(path, &m), 0);
            if (!m) continue;
            files++;
            ferry_dtype want = strncmp(de->d_name, "step-", 5) == 0 ? FERRY_BF16 : FERRY_F32;
            CHECK(ferry_model_count(m) > 0);
            for (size_t i = 0; i < ferry_model_count(m); i++) {
                CHECK(ferry_model_tensor(m, i)->dtype == want);
                CHECK(ferry_model_data_mut(m, i) == NULL); /* read-only mapping */
            }
            CHECK(ferry_model_metadata_get(m, "format") && strcmp(ferry_model_metadata_get(m, "format"), "pt") == 0);
            uint8_t h[16];
            hash_of(m, h);
            ferry_model_free(m);
        }
        closedir(d);
    }
    CHECK(files >= 14);
}

/* Issue requirement: casting every master-NNN (FP32) reproduces the
 * matching step-NNN (BF16) exactly, tensor by tensor, bit for bit. */
static void test_master_cast_reproduces_step(void)
{
    SKIP_UNLESS_DATA("rl-a");
    SKIP_UNLESS_DATA("rl-b");
    int pairs = 0;
    for (size_t r = 0; r < 2; r++) {
        for (int step = 0; step < 1000; step++) {
            char rel[64], mp[512], sp[512];
            snprintf(rel, sizeof rel, "%s/master-%03d.safetensors", k_runs[r], step);
            data_path(mp, sizeof mp, rel);
            if (access(mp, R_OK)) break;
            snprintf(rel, sizeof rel, "%s/step-%03d.safetensors", k_runs[r], step);
            data_path(sp, sizeof sp, rel);
            ferry_model *master = NULL, *bf = NULL;
            CHECK_OK(ferry_model_open(mp, &master));
            CHECK_OK(ferry_model_open(sp, &bf));
            if (!master || !bf) { ferry_model_free(master); ferry_model_free(bf); continue; }
            CHECK(ferry_model_count(master) == ferry_model_count(bf));
            for (size_t i = 0; i < ferry_model_count(master); i++) {
                const ferry_tensor *f = ferry_model_tensor(master, i), *b = ferry_model_tensor(bf, i);
                CHECK(strcmp(f->name, b->name) == 0 && f->dtype == FERRY_F32 && b->dtype == FERRY_BF16);
                CHECK(f->nelem == b->nelem && f->ndim == b->ndim);
                if (f->nelem != b->nelem) continue;
                /* mapped data is only byte-aligned in general: copy first */
                float *src = malloc(f->nbytes ? f->nbytes : 1);
                uint16_t *dst = malloc(b->nbytes ? b->nbytes : 1);
                memcpy(src, f->data, f->nbytes);
                ferry_f32_to_bf16_n(dst, src, f->nelem);
                if (memcmp(dst, b->data, b->nbytes)) {
                    fprintf(stderr, "  %s: %s differs after the cast\n", sp, b->name);
                    CHECK(0);
                }
                free(src);
                free(dst);
            }
            pairs++;
            ferry_model_free(master);
            ferry_model_free(bf);
        }
    }
    CHECK(pairs >= 5); /* rl-a has 3 masters, rl-b 2 */
}

static void test_real_file_roundtrip(void)
{
    SKIP_UNLESS_DATA("rl-b");
    char src[512], dst[512];
    data_path(src, sizeof src, "rl-b/step-001.safetensors");
    tmp_path(dst, sizeof dst, "rt-real.safetensors");
    ferry_model *a = NULL, *b = NULL;
    CHECK_OK(ferry_model_open(src, &a));
    if (!a) return;
    CHECK_OK(ferry_model_save(a, dst));
    CHECK_OK(ferry_model_open(dst, &b));
    if (b) CHECK(same_hash(a, b));
    ferry_model_free(a);
    ferry_model_free(b);
    unlink(dst);
}

/* ---------------------------------------------------------------------- *
 * Writer
 * ---------------------------------------------------------------------- */

/* Byte-exact outputs of the reference serializer (safetensors' own
 * test_empty and test_serialization): our header must match it. */
static void test_save_reference_bytes(void)
{
    static const uint8_t empty[] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    static const char meta[] = "{\"__metadata__\":{\"framework\":\"pt\"}}     ";
    static const char attn[] = "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}";
    char path[512];
    tmp_path(path, sizeof path, "ref.safetensors");
    ferry_model *m = NULL;
    CHECK_OK(ferry_model_create(&m));
    uint8_t *got = NULL;
    size_t n = 0;

    CHECK_OK(ferry_model_save(m, path));
    CHECK_OK(ferry__read_file(path, 1 << 20, &got, &n));
    CHECK(n == sizeof empty && got && memcmp(got, empty, n) == 0);
    free(got);

    CHECK_OK(ferry_model_set_metadata(m, "framework", "pt"));
    CHECK_OK(ferry_model_save(m, path));
    CHECK_OK(ferry__read_file(path, 1 << 20, &got, &n));
    CHECK(n == 8 + 40 && got && got[0] == 40 && memcmp(got + 8, meta, 40) == 0);
    free(got);

    ferry_model_free(m);
    CHECK_OK(ferry_model_create(&m));
    float v[6] = {0, 1, 2, 3, 4, 5};
    uint64_t sh[3] = {1, 2, 3};
    CHECK_OK(ferry_model_add(m, "attn.0", FERRY_F32, 3, sh, v, sizeof v, FERRY_ADD_BORROW));
    CHECK_OK(ferry_model_save(m, path));
    CHECK_OK(ferry__read_file(path, 1 << 20, &got, &n));
    CHECK(n == 8 + 64 + 24 && got && got[0] == 64 && memcmp(got + 8, attn, 64) == 0 &&
          memcmp(got + 72, v, 24) == 0);
    free(got);
    ferry_model_free(m);
    unlink(path);
}

/* Every dtype, a scalar, an empty tensor, odd sizes, metadata: save, open,
 * same hash, same bytes, header padded to 8. */
static void test_save_roundtrip(void)
{
    ferry_model *m = NULL, *r = NULL;
    CHECK_OK(ferry_model_create(&m));
    uint8_t bytes[64];
    for (int i = 0; i < 64; i++) bytes[i] = (uint8_t)(i * 37 + 1);
    for (int dt = 0; dt < FERRY_DTYPE_COUNT; dt++) {
        char name[32];
        snprintf(name, sizeof name, "t.%s", ferry_dtype_name((ferry_dtype)dt));
        uint64_t sh[1] = {ferry_dtype_bits((ferry_dtype)dt) == 6 ? 4 : 3}; /* F4 x 4 below */
        if (dt == FERRY_F4) sh[0] = 4;
        uint64_t nbytes = sh[0] * ferry_dtype_bits((ferry_dtype)dt) / 8;
        CHECK_OK(ferry_model_add(m, name, (ferry_dtype)dt, 1, sh, bytes, nbytes, FERRY_ADD_COPY));
    }
    uint64_t none[2] = {0, 5};
    CHECK_OK(ferry_model_add(m, "empty", FERRY_BF16, 2, none, NULL, 0, FERRY_ADD_COPY));
    CHECK_OK(ferry_model_add(m, "scalar", FERRY_F64, 0, NULL, bytes, 8, FERRY_ADD_COPY));
    CHECK_OK(ferry_model_add(m, "naïve \"quoted\"\n", FERRY_U8, 1, (uint64_t[]){1}, bytes, 1, FERRY_ADD_COPY));
    CHECK_OK(ferry_model_set_metadata(m, "format", "pt"));
    CHECK_OK(ferry_model_set_metadata(m, "note", "tab\there, ünïcode, \"quotes\""));

    char path[512];
    tmp_path(path, sizeof path, "rt.safetensors");
    CHECK_OK(ferry_model_save(m, path));
    CHECK_OK(ferry_model_open(path, &r));
    if (r) {
        CHECK(same_hash(m, r));
        CHECK(ferry_model_count(r) == ferry_model_count(m));
        for (size_t i = 0; i < ferry_model_count(m); i++) {
            const ferry_tensor *a = ferry_model_tensor(m, i), *b = ferry_model_tensor(r, i);
            CHECK(strcmp(a->name, b->name) == 0 && a->dtype == b->dtype && a->nbytes == b->nbytes);
            CHECK(memcmp(a->data, b->data, a->nbytes) == 0);
        }
        CHECK(strcmp(ferry_model_metadata_get(r, "note"), "tab\there, ünïcode, \"quotes\"") == 0);
        CHECK(ferry_model_find(r, "scalar")->ndim == 0 && ferry_model_find(r, "scalar")->nelem == 1);
        CHECK(ferry_model_find(r, "empty")->nelem == 0);
    }
    uint8_t *img = NULL;
    size_t n = 0;
    CHECK_OK(ferry__read_file(path, 1 << 20, &img, &n));
    if (img) CHECK(ferry__le64(img) % 8 == 0);
    free(img);
    ferry_model_free(r);
    ferry_model_free(m);
    unlink(path);
}

static bool dir_is_empty(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
    closedir(d);
    return n == 0;
}

/* A save that cannot complete leaves nothing behind, neither the file nor
 * its temporary. */
static void test_save_failures_leave_nothing(void)
{
    char dir[512], path[600];
    tmp_path(dir, sizeof dir, "savefail");
    CHECK(mkdir(dir, 0755) == 0);
    ferry_model *m = NULL;
    CHECK_OK(ferry_model_create(&m));
    uint8_t b[4] = {0};
    CHECK_OK(ferry_model_add(m, "__metadata__", FERRY_U8, 1, (uint64_t[]){4}, b, 4, 0));
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    CHECK_RC(ferry_model_save(m, path), FERRY_ERR_ARG);
    ferry_model_free(m);

    CHECK_OK(ferry_model_create(&m));
    CHECK_OK(ferry_model_add(m, "bad\xff", FERRY_U8, 1, (uint64_t[]){4}, b, 4, 0));
    CHECK_RC(ferry_model_save(m, path), FERRY_ERR_ARG);
    ferry_model_free(m);

    CHECK_OK(ferry_model_create(&m));
    CHECK_OK(ferry_model_add(m, "ok", FERRY_U8, 1, (uint64_t[]){4}, b, 4, 0));
    snprintf(path, sizeof path, "%s/no/such/dir/x.safetensors", dir);
    CHECK_RC(ferry_model_save(m, path), FERRY_ERR_IO);
    ferry_model_free(m);
    CHECK(dir_is_empty(dir));
    rmdir(dir);
}

/* ---------------------------------------------------------------------- *
 * Reader: valid edge cases
 * ---------------------------------------------------------------------- */

static void test_open_valid_edge_cases(void)
{
    uint8_t img[512];
    ferry_model *m = expect_open(img, build_st(img, sizeof img, "{}", 0), 0, NULL);
    CHECK(m && ferry_model_count(m) == 0);
    ferry_model_free(m);

    /* offsets listed out of order, zero-size tensors sharing an offset,
     * sub-byte dtypes filling whole bytes, trailing whitespace in the header */
    const char *h = "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
                    "\"z1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[2,2]},"
                    "\"z0\":{\"data_offsets\":[2,2],\"shape\":[3,0],\"dtype\":\"BF16\"},"
                    "\"a\":{\"dtype\":\"F4\",\"shape\":[2,2],\"data_offsets\":[0,2]},"
                    "\"__metadata__\":{\"k\":\"v\"}} \n\t ";
    m = expect_open(img, build_st(img, sizeof img, h, 4), 0, NULL);
    CHECK(m && ferry_model_count(m) == 4);
    if (m) {
        CHECK(strcmp(ferry_model_tensor(m, 0)->name, "a") == 0);
        CHECK(((const uint8_t *)ferry_model_find(m, "b")->data)[0] == 2);
        CHECK(ferry_model_find(m, "a")->nbytes == 2 && ferry_model_find(m, "z0")->nelem == 0);
        CHECK(strcmp(ferry_model_metadata_get(m, "k"), "v") == 0);
    }
    ferry_model_free(m);

    /* every dtype name is accepted */
    for (int dt = 0; dt < FERRY_DTYPE_COUNT; dt++) {
        char hdr[256];
        snprintf(hdr, sizeof hdr, "{\"t\":{\"dtype\":\"%s\",\"shape\":[8],\"data_offsets\":[0,%u]}}",
                 ferry_dtype_name((ferry_dtype)dt), ferry_dtype_bits((ferry_dtype)dt));
        expect_header(hdr, ferry_dtype_bits((ferry_dtype)dt), 0, NULL);
    }
}

static void test_open_missing_and_empty(void)
{
    ferry_model *m = (ferry_model *)1;
    CHECK_RC(ferry_model_open("/nonexistent/x.safetensors", &m), FERRY_ERR_NOT_FOUND);
    CHECK(m == NULL);
    CHECK_RC(ferry_model_open(NULL, &m), FERRY_ERR_ARG);
    expect_open((const uint8_t *)"", 0, FERRY_ERR_ST_TRUNCATED, "too short");
    CHECK_RC(ferry__st_parse_buffer(NULL, 0, NULL, &m), FERRY_ERR_ST_TRUNCATED);
    CHECK_RC(ferry_model_open("/dev/null", &m), FERRY_ERR_IO);

    /* a FIFO, opened directly or as a shard, fails at once instead of
     * waiting for a writer */
    char fifo[512], idx[512];
    tmp_path(fifo, sizeof fifo, "fifo.safetensors");
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK_RC(ferry_model_open(fifo, &m), FERRY_ERR_IO);
    tmp_path(idx, sizeof idx, "fifo.index.json");
    write_text(idx, "{\"weight_map\":{\"w\":\"fifo.safetensors\"}}");
    CHECK_RC(ferry_model_open(idx, &m), FERRY_ERR_IO);
    CHECK(m == NULL);
    unlink(idx);
    unlink(fifo);
}

/* ---------------------------------------------------------------------- *
 * Reader: one test per rejection rule
 * ---------------------------------------------------------------------- */

static void test_reject_short_file(void)
{
    expect_open((const uint8_t *)"\x10\0\0\0\0", 5, FERRY_ERR_ST_TRUNCATED, "too short");
}

static void test_reject_header_length(void)
{
    uint8_t img[32] = {0};
    memcpy(img + 8, "{}      ", 8);
    expect_open(img, 16, FERRY_ERR_ST_HEADER_SIZE, "header length 0"); /* N = 0 */
    ferry__put64(img, 100000001);
    expect_open(img, 16, FERRY_ERR_ST_HEADER_SIZE, "100000001");
    ferry__put64(img, UINT64_MAX);
    expect_open(img, 16, FERRY_ERR_ST_HEADER_SIZE, NULL);
}

static void test_reject_header_past_eof(void)
{
    uint8_t img[16] = {0};
    ferry__put64(img, 9);
    memcpy(img + 8, "{}      ", 8);
    expect_open(img, 16, FERRY_ERR_ST_TRUNCATED, "header length 9 exceeds the 8 bytes");
}

static void test_reject_not_brace(void)
{
    expect_header("[]", 0, FERRY_ERR_ST_JSON, "'{'");
    expect_header(" {}", 0, FERRY_ERR_ST_JSON, "'{'");
}

static void test_reject_bad_json(void)
{
    expect_header("{\"a\":", 0, FERRY_ERR_ST_JSON, "header");
    expect_header("{} {}", 0, FERRY_ERR_ST_JSON, NULL);
    expect_header("{\"\xc3\x28\":1}", 0, FERRY_ERR_ST_JSON, NULL); /* invalid UTF-8 */
    uint8_t img[64];
    size_t n = build_st(img, sizeof img, "{}", 0);
    img[10] = 0; /* NUL inside the padding */
    expect_open(img, n, FERRY_ERR_ST_JSON, NULL);
}

static void test_reject_entry_shape(void)
{
    expect_header("{\"w\":7}", 0, FERRY_ERR_ST_JSON, "tensor 'w': entry is not an object");
    expect_header("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"align\":8}}", 1, FERRY_ERR_ST_JSON,
                  "tensor 'w': unknown field 'align'");
}

static void test_reject_dtype(void)
{
    expect_header("{\"w\":{\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,16]}}", 16, FERRY_ERR_ST_DTYPE,
                  "tensor 'w': unknown dtype 'F128'");
    expect_header("{\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, FERRY_ERR_ST_DTYPE, "dtype missing");
    expect_header("{\"w\":{\"dtype\":null,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, FERRY_ERR_ST_DTYPE, "not a string");
}

static void test_reject_shape(void)
{
    expect_header("{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, FERRY_ERR_ST_SHAPE, "shape missing");
    expect_header("{\"w\":{\"dtype\":\"U8\",\"shape\":{},\"data_offsets\":[0,1]}}", 1, FERRY_ERR_ST_SHAPE, "not an array");
    expect_header("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,-2],\"data_offsets\":[0,1]}}", 1, FERRY_ERR_ST_SHAPE,
                  "tensor 'w': shape[1]");
    expect_header("{\"w\":{\"dtype\":\"U8\",\"shape\":[2.0],\"data_offsets\":[0,2]}}", 2, FERRY_ERR_ST_SHAPE, "shape[0]");
    expect_header("{\"w\":{\"dtype\":\"U8\",\"shape\":[\"2\"],\"data_offsets\":[0,2]}}", 2, FERRY_ERR_ST_SHAPE, NULL);
}

static void test_reject_shape_overflow(void)
{
    expect_header("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,2],\"data_offsets\":[0,0]}}", 0,
                  FERRY_ERR_ST_SHAPE, "element count overflows");
    expect_header("{\"w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
                  FERRY_ERR_ST_SHAPE, "overflows");
    /* a zero dimension makes the count 0 whatever follows */
    expect_header("{\"w\":{\"dtype\":\"U8\",\"shape\":[0,9223372036854775807,9223372036854775807],"
                  "\"data_offsets\":[0,0]}}", 0, 0, NULL);
}

static void test_reject_offsets_malformed(void)
{
    expect_header("{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, FERRY_ERR_ST_OFFSETS, "data_offsets missing");
    expect_header("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, FERRY_ERR_ST_OFFSETS, NULL);
    expect_header("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,1]}}", 1, FERRY_ERR_ST_OFFSETS, NULL);
    expect_header("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, FERRY_ERR_ST_OFFSETS, NULL);
    expect_header("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":\"0,1\"}}", 1, FERRY_ERR_ST_OFFSETS, NULL);
}

static void test_reject_offsets_reversed(void)
{
    expect_header("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[3,2]}}", 3, FERRY_ERR_ST_OFFSETS,
                  "tensor 'w': data_offsets begin 3 > end 2");
}

static void test_reject_offsets_gap(void)
{
    expect_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}",
                  3, FERRY_ERR_ST_OFFSETS, "tensor 'b': data_offsets begin 2 leaves a gap");
    expect_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, FERRY_ERR_ST_OFFSETS,
                  "leaves a gap");
}

static void test_reject_offsets_overlap(void)
{
    expect_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}",
                  3, FERRY_ERR_ST_OFFSETS, "tensor 'b': data_offsets begin 1 overlaps");
    /* the same bytes claimed twice */
    expect_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                  "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
                  2, FERRY_ERR_ST_OFFSETS, "overlaps");
}

static void test_reject_offsets_out_of_bounds(void)
{
    expect_header("{\"layers.0.wq\":{\"dtype\":\"U8\",\"shape\":[1234],\"data_offsets\":[0,1234]}}", 1000,
                  FERRY_ERR_ST_TRUNCATED, "tensor 'layers.0.wq': data_offsets end 1234 exceeds data size 1000");
    /* a valid file cut short */
    uint8_t img[256];
    size_t n = build_st(img, sizeof img, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16);
    expect_open(img, n - 1, FERRY_ERR_ST_TRUNCATED, "exceeds data size 15");
}

static void test_reject_size_mismatch(void)
{
    expect_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, FERRY_ERR_ST_SIZE,
                  "tensor 'w': data_offsets span 8 bytes, dtype and shape need 12");
}

static void test_reject_partial_bytes(void)
{
    expect_header("{\"w\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, FERRY_ERR_ST_SIZE,
                  "12 bits of F4");
    expect_header("{\"w\":{\"dtype\":\"F6_E3M2\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, FERRY_ERR_ST_SIZE, NULL);
}

static void test_reject_trailing(void)
{
    expect_header("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 2, FERRY_ERR_ST_TRAILING,
                  "1 bytes after the last tensor");
    expect_header("{}", 5, FERRY_ERR_ST_TRAILING, NULL);
}

static void test_reject_metadata(void)
{
    expect_header("{\"__metadata__\":[\"pt\"]}", 0, FERRY_ERR_ST_METADATA, "__metadata__ is not an object");
    expect_header("{\"__metadata__\":{\"format\":\"pt\",\"step\":3}}", 0, FERRY_ERR_ST_METADATA,
                  "value of 'step' is not a string");
    expect_header("{\"__metadata__\":null}", 0, FERRY_ERR_ST_METADATA, NULL);
}

static void test_reject_duplicate(void)
{
    expect_header("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                  "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                  2, FERRY_ERR_ST_DUPLICATE, "duplicate");
    expect_header("{\"__metadata__\":{},\"__metadata__\":{}}", 0, FERRY_ERR_ST_DUPLICATE, NULL);
}

static void test_reject_unrepresentable(void)
{
    char h[512] = "{\"w\":{\"dtype\":\"U8\",\"shape\":[1";
    for (int i = 0; i < FERRY_MAX_DIMS; i++) strcat(h, ",1");
    strcat(h, "],\"data_offsets\":[0,1]}}");
    expect_header(h, 1, FERRY_ERR_UNSUPPORTED, "33 dimensions");
    expect_header("{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, FERRY_ERR_UNSUPPORTED, NULL);
}

/* ---------------------------------------------------------------------- *
 * Golden must-fail files: NN-description.ERRNAME.safetensors
 * ---------------------------------------------------------------------- */

static const struct { const char *name; int code; } k_codes[] = {
    {"ST_TRUNCATED", FERRY_ERR_ST_TRUNCATED}, {"ST_HEADER_SIZE", FERRY_ERR_ST_HEADER_SIZE},
    {"ST_JSON", FERRY_ERR_ST_JSON},           {"ST_DTYPE", FERRY_ERR_ST_DTYPE},
    {"ST_SHAPE", FERRY_ERR_ST_SHAPE},         {"ST_OFFSETS", FERRY_ERR_ST_OFFSETS},
    {"ST_SIZE", FERRY_ERR_ST_SIZE},           {"ST_TRAILING", FERRY_ERR_ST_TRAILING},
    {"ST_METADATA", FERRY_ERR_ST_METADATA},   {"ST_DUPLICATE", FERRY_ERR_ST_DUPLICATE},
    {"ST_INDEX", FERRY_ERR_ST_INDEX},         {"UNSUPPORTED", FERRY_ERR_UNSUPPORTED},
};

/* Expected code from the name's ERRNAME part, or -1. */
static int expected_code(const char *file)
{
    const char *ext = strstr(file, ".safetensors");
    if (!ext || ext[12]) return -1;
    const char *dot = ext;
    while (dot > file && dot[-1] != '.') dot--;
    if (dot == file) return -1;
    for (size_t i = 0; i < sizeof k_codes / sizeof k_codes[0]; i++)
        if (strlen(k_codes[i].name) == (size_t)(ext - dot) && !strncmp(dot, k_codes[i].name, (size_t)(ext - dot)))
            return k_codes[i].code;
    return -1;
}

static void test_golden_errors(void)
{
    const char *dir = "tests/golden-errors/safetensors";
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    if (!d) return;
    int files = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strstr(de->d_name, ".safetensors")) continue;
        int want = expected_code(de->d_name);
        if (want < 0) {
            fprintf(stderr, "  %s: no known ERRNAME in the file name\n", de->d_name);
            CHECK(0);
            continue;
        }
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        ferry_model *m = NULL;
        int rc = ferry_model_open(path, &m);
        if (rc != want || m || !ferry_last_error()[0]) {
            fprintf(stderr, "  %s: got %d (%s), want %d\n", de->d_name, rc, ferry_last_error(), want);
            CHECK(0);
        }
        ferry_model_free(m);
        files++;
    }
    closedir(d);
    CHECK(files >= 40);
}

/* ---------------------------------------------------------------------- *
 * Sharded checkpoints and directories
 * ---------------------------------------------------------------------- */

/* A 4-tensor model with metadata; shard k of 2 holds tensors i with i % 2 == k. */
static ferry_model *sample_model(int shard)
{
    static const uint16_t v[8] = {0x3F80, 0x3F81, 0xBF80, 0, 1, 2, 3, 0x7FC0};
    static const char *const names[4] = {"embed", "layers.0.wq", "layers.0.wk", "lm_head"};
    ferry_model *m = NULL;
    CHECK_OK(ferry_model_create(&m));
    for (int i = 0; i < 4; i++) {
        if (shard >= 0 && i % 2 != shard) continue;
        uint64_t sh[2] = {2, (uint64_t)i + 1};
        CHECK_OK(ferry_model_add(m, names[i], FERRY_BF16, 2, sh, v, sh[0] * sh[1] * 2, FERRY_ADD_COPY));
    }
    CHECK_OK(ferry_model_set_metadata(m, "format", "pt"));
    return m;
}

static void write_text(const char *path, const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    CHECK(write_bytes(path, buf, strlen(buf)) == 0);
}

#define GOOD_MAP "\"embed\":\"s-0.safetensors\",\"layers.0.wk\":\"s-0.safetensors\"," \
                 "\"layers.0.wq\":\"s-1.safetensors\",\"lm_head\":\"s-1.safetensors\""

/* Writes an index with the given weight_map body into dir and opens it. */
static void expect_index(const char *dir, const char *map, int want, const char *fragment)
{
    char idx[600];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    write_text(idx, "{\"metadata\":{\"total_size\":40},\"weight_map\":{%s}}", map);
    ferry_model *m = NULL;
    CHECK_RC(ferry_model_open(idx, &m), want);
    if (want && fragment && !strstr(ferry_last_error(), fragment)) {
        fprintf(stderr, "  message '%s' lacks '%s'\n", ferry_last_error(), fragment);
        CHECK(0);
    }
    CHECK(!want || !m);
    ferry_model_free(m);
}

static void test_sharded_index(void)
{
    char dir[512], p[600];
    tmp_path(dir, sizeof dir, "sharded");
    CHECK(mkdir(dir, 0755) == 0);
    ferry_model *whole = sample_model(-1), *s0 = sample_model(0), *s1 = sample_model(1);
    CHECK_OK(ferry_model_set_metadata(s1, "format", "np")); /* conflict: the first shard wins */
    CHECK_OK(ferry_model_set_metadata(s1, "extra", "1"));
    CHECK_OK(ferry_model_set_metadata(whole, "extra", "1"));
    snprintf(p, sizeof p, "%s/s-0.safetensors", dir);
    CHECK_OK(ferry_model_save(s0, p));
    snprintf(p, sizeof p, "%s/s-1.safetensors", dir);
    CHECK_OK(ferry_model_save(s1, p));
    expect_index(dir, GOOD_MAP, 0, NULL);

    /* the directory and the index path open the same model as the whole */
    ferry_model *a = NULL, *b = NULL;
    CHECK_OK(ferry_model_open(dir, &a));
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    CHECK_OK(ferry_model_open(p, &b));
    if (a && b) {
        CHECK(ferry_model_count(a) == 4);
        CHECK(same_hash(a, whole) && same_hash(b, whole));
        CHECK(strcmp(ferry_model_metadata_get(a, "format"), "pt") == 0);
    }
    ferry_model_free(a);
    ferry_model_free(b);
    ferry_model_free(whole);
    ferry_model_free(s0);
    ferry_model_free(s1);
}

static void test_sharded_index_rejects(void)
{
    char dir[512], p[600];
    tmp_path(dir, sizeof dir, "sharded");
    /* shard files from test_sharded_index */
    expect_index(dir, "\"embed\":\"../s-0.safetensors\"", FERRY_ERR_ST_INDEX, "not a plain file name");
    expect_index(dir, "\"embed\":\"sub/s-0.safetensors\"", FERRY_ERR_ST_INDEX, "not a plain file name");
    expect_index(dir, "\"embed\":\"\"", FERRY_ERR_ST_INDEX, "not a plain file name");
    expect_index(dir, "\"embed\":3", FERRY_ERR_ST_INDEX, "not a string");
    expect_index(dir, GOOD_MAP ",\"extra\":\"s-9.safetensors\"", FERRY_ERR_ST_INDEX,
                 "shard 's-9.safetensors' named in the weight_map does not exist");
    expect_index(dir, GOOD_MAP ",\"ghost\":\"s-0.safetensors\"", FERRY_ERR_ST_INDEX,
                 "weight_map puts tensor 'ghost' in shard 's-0.safetensors'");
    expect_index(dir, "\"embed\":\"s-0.safetensors\",\"layers.0.wq\":\"s-1.safetensors\",\"lm_head\":\"s-1.safetensors\"",
                 FERRY_ERR_ST_INDEX, "tensor 'layers.0.wk' of shard 's-0.safetensors' is not in the weight_map");
    expect_index(dir, GOOD_MAP ",\"embed\":\"s-0.safetensors\"", FERRY_ERR_ST_DUPLICATE, NULL);

    /* a third shard holding a tensor of s-0 again */
    ferry_model *dup = sample_model(0);
    snprintf(p, sizeof p, "%s/s-2.safetensors", dir);
    CHECK_OK(ferry_model_save(dup, p));
    ferry_model_free(dup);
    expect_index(dir, "\"embed\":\"s-2.safetensors\",\"layers.0.wk\":\"s-0.safetensors\","
                      "\"layers.0.wq\":\"s-1.safetensors\",\"lm_head\":\"s-1.safetensors\"",
                 FERRY_ERR_ST_DUPLICATE, "tensor 'embed' is in shards");
    unlink(p);

    /* a corrupt shard keeps its own code */
    snprintf(p, sizeof p, "%s/s-1.safetensors", dir);
    write_text(p, "garbage!");
    expect_index(dir, GOOD_MAP, FERRY_ERR_ST_HEADER_SIZE, "s-1.safetensors");

    /* malformed index files */
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    const char *bad[] = {"{\"weight_map\":", "[]", "{\"metadata\":{}}", "{\"weight_map\":[]}",
                         "{\"metadata\":3,\"weight_map\":{}}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(p, "%s", bad[i]);
        ferry_model *m = NULL;
        CHECK_RC(ferry_model_open(p, &m), FERRY_ERR_ST_INDEX);
    }
    write_text(p, "{\"weight_map\":{}}"); /* an empty checkpoint is valid */
    ferry_model *m = NULL;
    CHECK_OK(ferry_model_open(dir, &m));
    CHECK(m && ferry_model_count(m) == 0);
    ferry_model_free(m);

    unlink(p);
    snprintf(p, sizeof p, "%s/s-0.safetensors", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/s-1.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

/* Without an index a directory must hold exactly one *.safetensors. */
static void test_directory_without_index(void)
{
    char dir[512], p[600];
    tmp_path(dir, sizeof dir, "plain");
    CHECK(mkdir(dir, 0755) == 0);
    ferry_model *m = NULL;
    CHECK_RC(ferry_model_open(dir, &m), FERRY_ERR_NOT_FOUND);
    ferry_model *whole = sample_model(-1);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK_OK(ferry_model_save(whole, p));
    CHECK_OK(ferry_model_open(dir, &m));
    if (m) CHECK(same_hash(m, whole));
    ferry_model_free(m);
    m = NULL;
    snprintf(p, sizeof p, "%s/other.safetensors", dir);
    CHECK_OK(ferry_model_save(whole, p));
    CHECK_RC(ferry_model_open(dir, &m), FERRY_ERR_ST_INDEX);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
    ferry_model_free(whole);
}

int main(void)
{
    if (tmpdir_make(g_tmp, sizeof g_tmp, "ferry-st")) return 1;
    RUN(test_open_shared_data);
    RUN(test_master_cast_reproduces_step);
    RUN(test_real_file_roundtrip);
    RUN(test_save_reference_bytes);
    RUN(test_save_roundtrip);
    RUN(test_save_failures_leave_nothing);
    RUN(test_open_valid_edge_cases);
    RUN(test_open_missing_and_empty);
    RUN(test_reject_short_file);
    RUN(test_reject_header_length);
    RUN(test_reject_header_past_eof);
    RUN(test_reject_not_brace);
    RUN(test_reject_bad_json);
    RUN(test_reject_entry_shape);
    RUN(test_reject_dtype);
    RUN(test_reject_shape);
    RUN(test_reject_shape_overflow);
    RUN(test_reject_offsets_malformed);
    RUN(test_reject_offsets_reversed);
    RUN(test_reject_offsets_gap);
    RUN(test_reject_offsets_overlap);
    RUN(test_reject_offsets_out_of_bounds);
    RUN(test_reject_size_mismatch);
    RUN(test_reject_partial_bytes);
    RUN(test_reject_trailing);
    RUN(test_reject_metadata);
    RUN(test_reject_duplicate);
    RUN(test_reject_unrepresentable);
    RUN(test_golden_errors);
    RUN(test_sharded_index);
    RUN(test_sharded_index_rejects);
    RUN(test_directory_without_index);
    rmdir(g_tmp);
    return CHECK_SUMMARY();
}
