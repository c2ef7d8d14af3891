/* mkdock: writes the dock's must-fail objects and the seeds of its fuzz
 * targets (the batch and the cursor carry an XXH3-128, so they are made
 * with the library's own encoders, then damaged and resealed).
 *
 *   make build/tools/mkdock && build/tools/mkdock tests
 *
 * writes, under the directory given (the repository's tests/):
 *   golden-errors/batch/NN-description.ERRNAME.batch   each fails
 *       ferry_dock_decode(data, size, 1 MiB, "r") with FERRY_ERR_<ERRNAME>
 *   golden-errors/cursor/NN-description.DOCK_CURSOR.cursor   each fails the
 *       cursor decoder for run "r"
 *   fuzz/corpus/{batch,cursor}/valid-* (valid-02-signed.cursor: the signed
 *       form, under a key made and thrown away), and a copy of every
 *       must-fail file
 * (tests/unit/test_records.c checks the must-fail files).  Every file is
 * verified against the library before it is written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dock/dock_impl.h"
#include "xxh.h"

static const char *g_root;
static int g_count;

static void die(const char *what)
{
    fprintf(stderr, "mkdock: %s: %s\n", what, ferry_last_error());
    exit(1);
}

static void put(const char *dir, const char *name, const uint8_t *b, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", g_root, dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(b, 1, n, f) != n) || fclose(f)) die(path);
}

/* Recomputes the batch checksum (bytes 112..127). */
static void seal_batch(uint8_t *b, size_t n)
{
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, b, 112);
    if (n > FERRY_DOCK_HEADER_SIZE) XXH3_128bits_update(&st, b + FERRY_DOCK_HEADER_SIZE, n - FERRY_DOCK_HEADER_SIZE);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    memcpy(b + 112, c.digest, 16);
}

static void seal_cursor(uint8_t *b, size_t n)
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(b, n - 16));
    memcpy(b + n - 16, c.digest, 16);
}

static void bad_batch(const char *name, int want, const char *err, const uint8_t *b, size_t n)
{
    ferry_dock_header h;
    int rc = ferry_dock_decode(b, n, 1 << 20, "r", &h);
    if (rc != want) {
        fprintf(stderr, "mkdock: batch %s: got %d, want %d\n", name, rc, want);
        exit(1);
    }
    char fname[256];
    snprintf(fname, sizeof fname, "%02d-%s.%s.batch", g_count++, name, err);
    put("golden-errors/batch", fname, b, n);
    put("fuzz/corpus/batch", fname, b, n);
}

static void bad_cursor(const char *name, const uint8_t *b, size_t n)
{
    dk_state s;
    const uint8_t *sig;
    int rc = ferry__dock_cursor_decode(b, n, "r", &s, &sig);
    if (rc != FERRY_ERR_DOCK_CURSOR) {
        fprintf(stderr, "mkdock: cursor %s: got %d\n", name, rc);
        exit(1);
    }
    char fname[256];
    snprintf(fname, sizeof fname, "%02d-%s.DOCK_CURSOR.cursor", g_count++, name);
    put("golden-errors/cursor", fname, b, n);
    put("fuzz/corpus/cursor", fname, b, n);
}

#define EDIT(buf, n, stmt, reseal)        \
    do {                                  \
        uint8_t *x = malloc((n) + 1);     \
        memcpy(x, buf, n);                \
        stmt;                             \
        reseal;                           \
        cur = x;                          \
    } while (0)

static void batches(void)
{
    static const char payload[] = "trajectory payload";
    void *v = NULL;
    size_t n = 0;
    if (ferry_dock_encode("r", 7, 3, 42, 1795965145000ull, payload, sizeof payload - 1, &v, &n)) die("encode");
    const uint8_t *b = v;
    put("fuzz/corpus/batch", "valid-00.batch", b, n);
    void *e = NULL;
    size_t en = 0;
    if (ferry_dock_encode("r", 1, 0, 0, 0, NULL, 0, &e, &en)) die("encode");
    put("fuzz/corpus/batch", "valid-01.batch", e, en);
    ferry_free(e);
    g_count = 0;
    uint8_t *cur;
    bad_batch("empty", FERRY_ERR_DOCK_TRUNCATED, "DOCK_TRUNCATED", b, 0);
    EDIT(b, n, x[0] = 'X', (void)0);
    bad_batch("bad-magic", FERRY_ERR_DOCK_MAGIC, "DOCK_MAGIC", cur, n), free(cur);
    bad_batch("magic-only", FERRY_ERR_DOCK_TRUNCATED, "DOCK_TRUNCATED", b, 4);
    bad_batch("header-cut", FERRY_ERR_DOCK_TRUNCATED, "DOCK_TRUNCATED", b, FERRY_DOCK_HEADER_SIZE - 1);
    bad_batch("payload-cut", FERRY_ERR_DOCK_TRUNCATED, "DOCK_TRUNCATED", b, n - 1);
    EDIT(b, n, x[4] = 2, seal_batch(x, n));
    bad_batch("format-2", FERRY_ERR_DOCK_FORMAT, "DOCK_FORMAT", cur, n), free(cur);
    EDIT(b, n, x[6] = 64, seal_batch(x, n));
    bad_batch("header-length-64", FERRY_ERR_DOCK_FORMAT, "DOCK_FORMAT", cur, n), free(cur);
    EDIT(b, n, ferry__put64(x + 40, 2ull << 20), seal_batch(x, n));
    bad_batch("payload-over-bound", FERRY_ERR_DOCK_LENGTH, "DOCK_LENGTH", cur, n), free(cur);
    EDIT(b, n, ferry__put64(x + 40, UINT64_MAX), seal_batch(x, n));
    bad_batch("payload-length-2-64-minus-1", FERRY_ERR_DOCK_LENGTH, "DOCK_LENGTH", cur, n), free(cur);
    EDIT(b, n, ferry__put64(x + 40, 3), seal_batch(x, n));
    bad_batch("bytes-after-payload", FERRY_ERR_DOCK_LENGTH, "DOCK_LENGTH", cur, n), free(cur);
    EDIT(b, n, ferry__put16(x + 28, 0), seal_batch(x, n));
    bad_batch("run-length-zero", FERRY_ERR_DOCK_HEADER, "DOCK_HEADER", cur, n), free(cur);
    EDIT(b, n, ferry__put16(x + 28, 65), seal_batch(x, n));
    bad_batch("run-length-65", FERRY_ERR_DOCK_HEADER, "DOCK_HEADER", cur, n), free(cur);
    EDIT(b, n, x[30] = 2, seal_batch(x, n));
    bad_batch("flags-undefined-bit", FERRY_ERR_DOCK_HEADER, "DOCK_HEADER", cur, n), free(cur);
    EDIT(b, n, x[30] = 1, seal_batch(x, n));
    bad_batch("signed-flag-without-signature", FERRY_ERR_DOCK_TRUNCATED, "DOCK_TRUNCATED", cur, n), free(cur);
    EDIT(b, n, x[48] = '/', seal_batch(x, n));
    bad_batch("run-char-slash", FERRY_ERR_DOCK_HEADER, "DOCK_HEADER", cur, n), free(cur);
    EDIT(b, n, x[60] = 'z', seal_batch(x, n));
    bad_batch("run-padding-not-zero", FERRY_ERR_DOCK_HEADER, "DOCK_HEADER", cur, n), free(cur);
    EDIT(b, n, x[n - 1] ^= 1, (void)0);
    bad_batch("payload-bitflip", FERRY_ERR_DOCK_CHECKSUM, "DOCK_CHECKSUM", cur, n), free(cur);
    EDIT(b, n, x[8] ^= 1, (void)0);
    bad_batch("version-bitflip", FERRY_ERR_DOCK_CHECKSUM, "DOCK_CHECKSUM", cur, n), free(cur);
    EDIT(b, n, x[48] = 'q', seal_batch(x, n));
    bad_batch("another-run", FERRY_ERR_DOCK_RUN, "DOCK_RUN", cur, n), free(cur);
    ferry_free(v);
}

static void cursors(void)
{
    dk_state s = {0};
    int fresh;
    uint64_t gl, gh;
    uint64_t seqs[] = {0, 1, 2, 5, 9, 10};
    for (size_t i = 0; i < sizeof seqs / sizeof seqs[0]; i++) {
        if (ferry__dock_state_mark(&s, 3, seqs[i], &fresh, &gl, &gh)) die("mark");
        if (ferry__dock_state_mark(&s, 11, seqs[i] * 2, &fresh, &gl, &gh)) die("mark");
    }
    s.counters[DK_C_ADMITTED] = 12;
    s.top_tv = 8;
    s.commits = 4;
    ferry_buf out = {0}, empty = {0}, sout = {0};
    dk_state none = {0};
    /* the signed form, with a key made for the occasion (the decoder does
     * not check signatures: the handle does) */
    char dir[] = "/tmp/mkdock.XXXXXX", prefix[64];
    ferry_keys *k = NULL;
    if (!mkdtemp(dir)) die("mkdtemp");
    snprintf(prefix, sizeof prefix, "%s/trainer", dir);
    if (ferry_keygen(prefix, NULL) || ferry_keys_create(&k)) die("keygen");
    snprintf(prefix, sizeof prefix, "%s/trainer.key", dir);
    if (ferry_keys_set_signer(k, prefix, NULL)) die("signer");
    remove(prefix);
    snprintf(prefix, sizeof prefix, "%s/trainer.pub", dir);
    remove(prefix);
    remove(dir);
    if (ferry__dock_cursor_encode(&s, "r", 99, NULL, &out) || ferry__dock_cursor_encode(&none, "r", 1, NULL, &empty) ||
        ferry__dock_cursor_encode(&s, "r", 98, k, &sout))
        die("cursor encode");
    ferry_keys_free(k);
    put("fuzz/corpus/cursor", "valid-00.cursor", out.data, out.size);
    put("fuzz/corpus/cursor", "valid-01.cursor", empty.data, empty.size);
    put("fuzz/corpus/cursor", "valid-02-signed.cursor", sout.data, sout.size);
    const uint8_t *b = out.data;
    size_t n = out.size;
    uint8_t *cur;
    g_count = 0;
    bad_cursor("empty", b, 0);
    bad_cursor("fixed-part-cut", b, 100);
    EDIT(b, n, x[0] = 'X', seal_cursor(x, n));
    bad_cursor("bad-magic", cur, n), free(cur);
    EDIT(b, n, x[n - 1] ^= 1, (void)0);
    bad_cursor("checksum", cur, n), free(cur);
    EDIT(b, n, x[4] = 3, seal_cursor(x, n));
    bad_cursor("format-3", cur, n), free(cur);
    EDIT(b, n, x[8] = 'q', seal_cursor(x, n));
    bad_cursor("another-run", cur, n), free(cur);
    EDIT(b, n, x[20] = 'z', seal_cursor(x, n));
    bad_cursor("run-padding-not-zero", cur, n), free(cur);
    EDIT(b, n, ferry__put32(x + 96, 3), seal_cursor(x, n));
    bad_cursor("counter-count", cur, n), free(cur);
    EDIT(b, n, ferry__put32(x + 100, 0xFFFFFFFFu), seal_cursor(x, n));
    bad_cursor("islands-huge", cur, n), free(cur);
    EDIT(b, n, ferry__put32(x + 100, 3), seal_cursor(x, n));
    bad_cursor("islands-one-more", cur, n), free(cur);
    size_t isl = 104 + (size_t)DK_C_COUNT * 8; /* first island */
    size_t isl2 = isl + 8 + 16 * ferry__le32(b + isl + 4);
    EDIT(b, n, ferry__put32(x + isl2, 3), seal_cursor(x, n));
    bad_cursor("islands-not-ascending", cur, n), free(cur);
    EDIT(b, n, ferry__put32(x + isl + 4, 0), seal_cursor(x, n));
    bad_cursor("island-zero-ranges", cur, n), free(cur);
    EDIT(b, n, ferry__put64(x + isl + 8, 100), seal_cursor(x, n));
    bad_cursor("range-lo-above-hi", cur, n), free(cur);
    EDIT(b, n, ferry__put64(x + isl + 24, 3), seal_cursor(x, n));
    bad_cursor("ranges-touch", cur, n), free(cur);
    {
        uint8_t *x = malloc(n + 8);
        memcpy(x, b, n - 16);
        memset(x + n - 16, 0, 8);
        seal_cursor(x, n + 8);
        bad_cursor("bytes-after-last-island", x, n + 8);
        free(x);
    }
    /* the signed form: its checksum sits before the 72-byte signature */
    const uint8_t *sb = sout.data;
    size_t sn = sout.size;
    EDIT(b, n, x[4] = 2, seal_cursor(x, n));
    bad_cursor("format-2-without-signature", cur, n), free(cur);
    bad_cursor("signed-signature-cut", sb, sn - 1);
    EDIT(sb, sn, x[sn - 73] ^= 1, (void)0);
    bad_cursor("signed-checksum", cur, sn), free(cur);
    EDIT(sb, sn, x[4] = 1, (void)0);
    bad_cursor("signed-marked-unsigned", cur, sn), free(cur);
    ferry__buf_release(&sout);
    ferry__buf_release(&out);
    ferry__buf_release(&empty);
    ferry__dock_state_release(&s);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: mkdock TESTS_DIR\n");
        return 2;
    }
    g_root = argv[1];
    batches();
    cursors();
    printf("mkdock: batch and cursor files written under %s\n", g_root);
    return 0;
}
