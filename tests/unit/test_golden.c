/* Golden files (tests/golden/README.md): the patch format cannot drift
 * silently, and every must-fail patch fails with exactly its code, in
 * every entry point.
 *
 *  - ferry_diff on the golden models writes exactly the committed bytes of
 *    ab.patch, ba.patch and ac.patch, and on pairs of the shared checkpoints
 *    a patch of the size and XXH3-128 listed in tests/golden/real.txt;
 *  - the golden patches apply (copy and in place) to their targets;
 *  - each tests/golden-errors/patch/NN-description.ERRNAME.patch fails
 *    ferry_apply on base a with FERRY_ERR_ERRNAME, a message and no model;
 *    ferry_patch_inspect fails with the same code exactly when the damage
 *    is in the header or table; ferry_apply_inplace fails with the same code,
 *    or with FERRY_ERR_SHAPE_MISMATCH when the damage lies past the point
 *    where in-place apply refuses a patch that changes structure, and leaves
 *    the base untouched. */
#include <dirent.h>
#include <stdint.h>

#include "check.h"
#include "codec/patch.h"
#include "xxhash.h"
#include "../tools/golden_model.h"

#define GOLDEN "tests/golden"
#define ERRORS "tests/golden-errors/patch"

static bool hash_of(const ferry_model *m, uint8_t h[16]) { return m && ferry_model_hash(m, h) == FERRY_OK; }

static bool same_model(const ferry_model *a, const ferry_model *b)
{
    uint8_t ha[16], hb[16];
    return hash_of(a, ha) && hash_of(b, hb) && memcmp(ha, hb, 16) == 0;
}

static ferry_model *open_golden(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, GOLDEN "/%s", name);
    ferry_model *m = NULL;
    CHECK_OK(ferry_model_open(path, &m));
    return m;
}

static void *read_file(const char *path, size_t *n)
{
    void *p = NULL;
    *n = 0;
    CHECK_OK(ferry_file_read(path, (size_t)1 << 30, &p, n));
    return p;
}

/* A copy of m whose tensors the model owns (writable: in-place apply). */
static ferry_model *clone(const ferry_model *m)
{
    ferry_model *c = NULL;
    if (ferry_model_create(&c)) return NULL;
    for (size_t i = 0; i < ferry_model_count(m); i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        if (ferry_model_add(c, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, FERRY_ADD_COPY)) {
            ferry_model_free(c);
            return NULL;
        }
    }
    for (size_t i = 0; i < ferry_model_metadata_count(m); i++) {
        const char *k, *v;
        ferry_model_metadata(m, i, &k, &v);
        if (ferry_model_set_metadata(c, k, v)) {
            ferry_model_free(c);
            return NULL;
        }
    }
    return c;
}

/* ---------------------------------------------------------------------- *
 * The format pinned
 * ---------------------------------------------------------------------- */

static void check_diff_bytes(const char *from, const char *to, const char *patch)
{
    ferry_model *a = open_golden(from), *b = open_golden(to);
    char path[256];
    snprintf(path, sizeof path, GOLDEN "/%s", patch);
    size_t n_want = 0, n = 0;
    void *want = read_file(path, &n_want), *p = NULL;
    if (a && b) CHECK_OK(ferry_diff(a, b, NULL, &p, &n));
    if (!p || !want || n != n_want || memcmp(p, want, n)) {
        size_t at = 0;
        while (p && want && at < n && at < n_want && ((uint8_t *)p)[at] == ((uint8_t *)want)[at]) at++;
        fprintf(stderr, "  ferry_diff(%s, %s): %zu bytes, first difference at byte %zu; %s has %zu bytes.\n"
                        "  The patch format changed: if that is intended, bump the format version (docs/FORMAT.md)\n"
                        "  and regenerate (tests/golden/README.md).\n",
                from, to, n, at, path, n_want);
        CHECK(0);
    }
    ferry_free(p);
    ferry_free(want);
    ferry_model_free(a);
    ferry_model_free(b);
}

static void test_diff_is_golden(void)
{
    check_diff_bytes("a.safetensors", "b.safetensors", "ab.patch");
    check_diff_bytes("b.safetensors", "a.safetensors", "ba.patch");
    check_diff_bytes("a.safetensors", "c.safetensors", "ac.patch");
}

/* The golden models exercise what the README says they do: every kind of
 * entry, and the dtypes. */
static void test_golden_patch_contents(void)
{
    size_t n = 0;
    void *p = read_file(GOLDEN "/ab.patch", &n);
    ferry_patch_info *pi = NULL;
    if (p) CHECK_OK(ferry_patch_inspect(p, n, &pi));
    int kinds[4] = {0}, dtypes[FERRY_DTYPE_COUNT] = {0};
    for (size_t i = 0; i < ferry_patch_info_count(pi); i++) {
        const ferry_patch_tensor_info *t = ferry_patch_info_tensor(pi, i);
        kinds[t->kind]++;
        if (t->kind == FERRY_PT_SPARSE) dtypes[t->dtype]++;
    }
    CHECK(kinds[FERRY_PT_SPARSE] >= 4 && kinds[FERRY_PT_WHOLE] >= 2 && kinds[FERRY_PT_REMOVED] == 1 && kinds[FERRY_PT_SAME] >= 2);
    CHECK(dtypes[FERRY_BF16] >= 2 && dtypes[FERRY_F32] >= 1 && dtypes[FERRY_F16] == 1 && dtypes[FERRY_I8] == 1 &&
          dtypes[FERRY_U8] == 1 && dtypes[FERRY_F64] == 1); /* word widths 16, 32, 8 signed and unsigned, 64 */
    ferry_patch_info_free(pi);
    ferry_free(p);
}

/* tests/fuzz/fuzz_patch.c builds its base in code: it must be golden a. */
static void test_fuzz_base_is_golden_a(void)
{
    ferry_model *a = open_golden("a.safetensors"), *g = golden_model('a');
    CHECK(same_model(a, g));
    ferry_model_free(g);
    ferry_model_free(a);
}

static void check_apply(const char *from, const char *to, const char *patch, int inplace_rc, unsigned version)
{
    ferry_model *a = open_golden(from), *b = open_golden(to), *out = NULL;
    char path[256];
    snprintf(path, sizeof path, GOLDEN "/%s", patch);
    size_t n = 0;
    void *p = read_file(path, &n);
    if (a && b && p) {
        CHECK_OK(ferry_apply(a, p, n, &out));
        CHECK(same_model(out, b));
        ferry_model *c = clone(a);
        CHECK_RC(ferry_apply_inplace(c, p, n), inplace_rc);
        CHECK(same_model(c, inplace_rc == FERRY_OK ? b : a));
        ferry_model_free(c);
        /* the patch names the models it joins */
        ferry_patch_info *pi = NULL;
        uint8_t hb[16], ht[16], ha[16], hbb[16];
        CHECK_OK(ferry_patch_inspect(p, n, &pi));
        ferry_patch_info_hashes(pi, hb, ht);
        CHECK(hash_of(a, ha) && hash_of(b, hbb) && !memcmp(ha, hb, 16) && !memcmp(hbb, ht, 16));
        CHECK(ferry_patch_info_format(pi) == version);
        ferry_patch_info_free(pi);
    }
    ferry_model_free(out);
    ferry_free(p);
    ferry_model_free(a);
    ferry_model_free(b);
}

static void test_golden_patches_apply(void)
{
    /* what ferry writes today: version 3 (codec 4 in its sparse chunks) */
    check_apply("a.safetensors", "b.safetensors", "ab.patch", FERRY_ERR_SHAPE_MISMATCH, 3);
    check_apply("b.safetensors", "a.safetensors", "ba.patch", FERRY_ERR_SHAPE_MISMATCH, 3);
    check_apply("a.safetensors", "c.safetensors", "ac.patch", FERRY_OK, 3);
    /* what ferry wrote before codec 4 (version 1, codec 1): still read */
    check_apply("a.safetensors", "b.safetensors", "v1/ab.patch", FERRY_ERR_SHAPE_MISMATCH, 1);
    check_apply("b.safetensors", "a.safetensors", "v1/ba.patch", FERRY_ERR_SHAPE_MISMATCH, 1);
    check_apply("a.safetensors", "c.safetensors", "v1/ac.patch", FERRY_OK, 1);
}

/* tests/golden/real.txt: OLD NEW BYTES XXH3-128 per line. */
static void test_real_data_golden(void)
{
    SKIP_UNLESS_DATA("rl-a"); /* real.txt names rl-a and rl-b files */
    SKIP_UNLESS_DATA("rl-b");
    FILE *f = fopen(GOLDEN "/real.txt", "r");
    CHECK(f != NULL);
    if (!f) return;
    char line[1024];
    int pairs = 0;
    while (fgets(line, sizeof line, f)) {
        char old[256], new_[256], hex_want[64], hex[33], pa[512], pb[512];
        unsigned long long bytes;
        if (line[0] == '#' || line[0] == '\n') continue;
        if (sscanf(line, "%255s %255s %llu %63s", old, new_, &bytes, hex_want) != 4) {
            fprintf(stderr, "  real.txt: malformed line: %s", line);
            CHECK(0);
            continue;
        }
        ferry_model *a = NULL, *b = NULL, *out = NULL;
        CHECK_OK(ferry_model_open(data_path(pa, sizeof pa, old), &a));
        CHECK_OK(ferry_model_open(data_path(pb, sizeof pb, new_), &b));
        void *p = NULL;
        size_t n = 0;
        if (a && b) CHECK_OK(ferry_diff(a, b, NULL, &p, &n));
        if (p) {
            XXH128_canonical_t h;
            XXH128_canonicalFromHash(&h, XXH3_128bits(p, n));
            for (int k = 0; k < 16; k++) snprintf(hex + 2 * k, 3, "%02x", h.digest[k]);
            if (n != bytes || strcmp(hex, hex_want)) {
                fprintf(stderr, "  %s -> %s: patch of %zu bytes, XXH3-128 %s; real.txt says %llu bytes, %s\n", old, new_, n, hex,
                        bytes, hex_want);
                CHECK(0);
            }
            CHECK_OK(ferry_apply(a, p, n, &out));
            CHECK(same_model(out, b));
        }
        pairs++;
        ferry_model_free(out);
        ferry_free(p);
        ferry_model_free(a);
        ferry_model_free(b);
    }
    fclose(f);
    CHECK(pairs >= 2);
}

/* ---------------------------------------------------------------------- *
 * Must-fail patches
 * ---------------------------------------------------------------------- */

static const struct { const char *name; int code; } k_codes[] = {
    {"PATCH_MAGIC", FERRY_ERR_PATCH_MAGIC},         {"PATCH_VERSION", FERRY_ERR_PATCH_VERSION},
    {"PATCH_TRUNCATED", FERRY_ERR_PATCH_TRUNCATED}, {"PATCH_CORRUPT", FERRY_ERR_PATCH_CORRUPT},
    {"PATCH_CHECKSUM", FERRY_ERR_PATCH_CHECKSUM},   {"BASE_MISMATCH", FERRY_ERR_BASE_MISMATCH},
    {"TARGET_MISMATCH", FERRY_ERR_TARGET_MISMATCH}, {"LIMIT", FERRY_ERR_LIMIT},
};

/* Expected code from NN-description.ERRNAME.patch, or -1. */
static int expected_code(const char *file)
{
    size_t l = strlen(file);
    if (l < 7 || strcmp(file + l - 6, ".patch")) return -1;
    const char *end = file + l - 6, *dot = end;
    while (dot > file && dot[-1] != '.') dot--;
    if (dot == file) return -1;
    for (size_t i = 0; i < sizeof k_codes / sizeof k_codes[0]; i++)
        if (strlen(k_codes[i].name) == (size_t)(end - dot) && !strncmp(dot, k_codes[i].name, (size_t)(end - dot)))
            return k_codes[i].code;
    return -1;
}

/* Whether the table fits base a the way FORMAT.md requires: every base
 * tensor named, SAME / SPARSE / REMOVED entries present in the base, SAME and
 * SPARSE with the base's dtype and shape.  (Apply checks this before
 * anything else, in place or not.) */
static bool table_fits_base(const patch_table *t, const ferry_model *base)
{
    size_t named = 0;
    for (size_t j = 0; j < t->n; j++) {
        const patch_entry *e = &t->e[j];
        const ferry_tensor *b = ferry_model_find(base, e->name);
        if (!b) {
            if (e->kind != PK_WHOLE) return false;
            continue;
        }
        named++;
        if ((e->kind == PK_SAME || e->kind == PK_SPARSE) &&
            (b->dtype != e->dtype || b->ndim != e->ndim || memcmp(b->shape, e->shape, e->ndim * sizeof *e->shape)))
            return false;
    }
    return named == ferry_model_count(base);
}

/* Whether the patch changes structure, which in-place apply refuses:
 * tensors removed, added, re-typed or re-shaped (carried whole), or metadata
 * that differs.  (A tensor carried whole with its base's dtype and shape,
 * because it changed densely, keeps its place.) */
static bool table_changes_structure(const patch_table *t, const ferry_model *base)
{
    for (size_t j = 0; j < t->n; j++) {
        const patch_entry *e = &t->e[j];
        const ferry_tensor *b = ferry_model_find(base, e->name);
        if (e->kind == PK_REMOVED) return true;
        if (e->kind == PK_WHOLE &&
            (!b || b->dtype != e->dtype || b->ndim != e->ndim || memcmp(b->shape, e->shape, e->ndim * sizeof *e->shape)))
            return true;
    }
    if (t->nmeta != ferry_model_metadata_count(base)) return true;
    for (size_t i = 0; i < t->nmeta; i++) {
        const char *v = ferry_model_metadata_get(base, t->meta_key[i]);
        if (!v || strcmp(v, t->meta_val[i])) return true;
    }
    return false;
}

typedef struct tally {
    int files, inspect_fails, inspect_ok, inplace_same, inplace_shape;
    int codes[8];
} tally;

static void check_error_file(const char *dir, const char *name, const ferry_model *a, tally *t)
{
    int want = expected_code(name);
    if (want < 0) {
        fprintf(stderr, "  %s: no known ERRNAME in the file name\n", name);
        CHECK(0);
        return;
    }
    for (size_t i = 0; i < sizeof k_codes / sizeof k_codes[0]; i++)
        if (k_codes[i].code == want) t->codes[i]++;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t n = 0;
    uint8_t *p = read_file(path, &n);
    if (!p) return;
    t->files++;
    int case_failed = check_case_failed;
    check_case_failed = 0;

    /* apply */
    ferry_model *out = NULL;
    int rc = ferry_apply(a, p, n, &out);
    if (rc != want || out || !ferry_last_error()[0]) {
        fprintf(stderr, "  %s: ferry_apply returned %d (%s: %s)%s, want %d\n", name, rc, ferry_strerror(rc), ferry_last_error(),
                out ? " and a model" : "", want);
        CHECK(0);
    }
    ferry_model_free(out);

    /* inspect: fails exactly when the damage is in the header or table */
    static int not_null;
    ferry_patch_info *pi = (ferry_patch_info *)(void *)&not_null; /* failure must reset it to NULL */
    int irc = ferry_patch_inspect(p, n, &pi);
    patch_table tab;
    bool parsed = false;
    if (irc) {
        t->inspect_fails++;
        if (irc != want || pi) {
            fprintf(stderr, "  %s: ferry_patch_inspect returned %d (%s), want %d\n", name, irc, ferry_last_error(), want);
            CHECK(0);
        }
    } else {
        t->inspect_ok++;
        ferry_patch_info_free(pi);
        if (want != FERRY_ERR_BASE_MISMATCH && want != FERRY_ERR_TARGET_MISMATCH && want != FERRY_ERR_PATCH_CORRUPT) {
            fprintf(stderr, "  %s: ferry_patch_inspect accepts it, but %d is a header or table error\n", name, want);
            CHECK(0);
        }
        CHECK_OK(ferry__codec_patch_table_parse(p, n, &tab));
        parsed = true;
    }

    /* in place: base check, then matching the table to the base, then the
     * refusal of structure changes, then decoding */
    int want_inplace = want;
    if (parsed && want != FERRY_ERR_BASE_MISMATCH && table_fits_base(&tab, a) && table_changes_structure(&tab, a))
        want_inplace = FERRY_ERR_SHAPE_MISMATCH;
    if (parsed) ferry__codec_patch_table_release(&tab);
    if (want_inplace == FERRY_ERR_SHAPE_MISMATCH) t->inplace_shape++;
    else if (irc == FERRY_OK) t->inplace_same++;
    ferry_model *c = clone(a);
    CHECK(c != NULL);
    if (c) {
        rc = ferry_apply_inplace(c, p, n);
        if (rc != want_inplace || !ferry_last_error()[0]) {
            fprintf(stderr, "  %s: ferry_apply_inplace returned %d (%s), want %d\n", name, rc, ferry_last_error(), want_inplace);
            CHECK(0);
        }
        if (!same_model(c, a)) {
            fprintf(stderr, "  %s: ferry_apply_inplace changed the base\n", name);
            CHECK(0);
        }
    }
    ferry_model_free(c);
    ferry_free(p);
    if (check_case_failed) fprintf(stderr, "  ^ %s\n", name);
    check_case_failed |= case_failed;
}

static void test_golden_errors(void)
{
    ferry_model *a = open_golden("a.safetensors");
    DIR *d = opendir(ERRORS);
    CHECK(a && d);
    if (!a || !d) {
        if (d) closedir(d);
        ferry_model_free(a);
        return;
    }
    tally t = {0};
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') check_error_file(ERRORS, de->d_name, a, &t);
    closedir(d);
    ferry_model_free(a);
    printf("     %d must-fail patches: inspect fails on %d, accepts %d; in place: %d same code past the table, %d refused as "
           "structure changes\n",
           t.files, t.inspect_fails, t.inspect_ok, t.inplace_same, t.inplace_shape);
    /* every path is exercised, and every code the set promises */
    CHECK(t.files >= 70);
    CHECK(t.inspect_fails > 0 && t.inspect_ok > 0 && t.inplace_same > 0 && t.inplace_shape > 0);
    for (size_t i = 0; i < sizeof k_codes / sizeof k_codes[0]; i++)
        if (!t.codes[i]) {
            fprintf(stderr, "  no must-fail patch for %s\n", k_codes[i].name);
            CHECK(0);
        }
}

/* In place on a mapped (read-only) base is refused as an argument error
 * after the base and the table check out, and touches nothing. */
static void test_inplace_on_mapped_base(void)
{
    ferry_model *a = open_golden("a.safetensors");
    size_t n = 0;
    void *p = read_file(GOLDEN "/ac.patch", &n);
    if (a && p) CHECK_RC(ferry_apply_inplace(a, p, n), FERRY_ERR_ARG);
    ferry_free(p);
    ferry_model_free(a);
}

int main(void)
{
    RUN(test_diff_is_golden);
    RUN(test_golden_patch_contents);
    RUN(test_fuzz_base_is_golden_a);
    RUN(test_golden_patches_apply);
    RUN(test_real_data_golden);
    RUN(test_golden_errors);
    RUN(test_inplace_on_mapped_base);
    return CHECK_SUMMARY();
}
