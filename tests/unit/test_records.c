/* The must-fail objects of the parsers that read what anyone with bucket
 * access can write: HEAD, manifests, the compaction index (lib/sync/records.c)
 * and the dock's batches and cursor (lib/dock).  Each file
 * tests/golden-errors/{head,manifest,compactions,batch,cursor}/NN-description.ERRNAME.ext
 * must fail with exactly FERRY_ERR_<ERRNAME> and a message; the generators
 * are tests/golden-errors/records/make.py and tests/tools/mkdock.c.  Plus
 * the version bound of docs/PROTOCOL.md "Versions" at the parsers. */
#ifdef FERRY_NO_NET
#include "helpers.h"
NOT_BUILT_MAIN("sync layer not built (NO_NET=1)")
#else
#include <dirent.h>
#include <stdint.h>

#include "check.h"
#include "dock/dock_impl.h"
#include "sync/sync_impl.h"

static const struct { const char *name; int code; } k_codes[] = {
    {"SYNC_MANIFEST", FERRY_ERR_SYNC_MANIFEST}, {"DOCK_MAGIC", FERRY_ERR_DOCK_MAGIC},
    {"DOCK_FORMAT", FERRY_ERR_DOCK_FORMAT},     {"DOCK_TRUNCATED", FERRY_ERR_DOCK_TRUNCATED},
    {"DOCK_LENGTH", FERRY_ERR_DOCK_LENGTH},     {"DOCK_HEADER", FERRY_ERR_DOCK_HEADER},
    {"DOCK_CHECKSUM", FERRY_ERR_DOCK_CHECKSUM}, {"DOCK_RUN", FERRY_ERR_DOCK_RUN},
    {"DOCK_CURSOR", FERRY_ERR_DOCK_CURSOR},
};

/* FERRY_ERR_ code named by "NN-description.ERRNAME.ext", or -1. */
static int expected_code(const char *file)
{
    const char *ext = strrchr(file, '.');
    if (!ext || ext == file) return -1;
    const char *dot = ext;
    while (dot > file && dot[-1] != '.') dot--;
    if (dot == file) return -1;
    for (size_t i = 0; i < sizeof k_codes / sizeof k_codes[0]; i++)
        if (strlen(k_codes[i].name) == (size_t)(ext - dot) && !strncmp(dot, k_codes[i].name, (size_t)(ext - dot)))
            return k_codes[i].code;
    return -1;
}

static int parse(const char *kind, const uint8_t *d, size_t n)
{
    if (!strcmp(kind, "head")) {
        fs_head h;
        return ferry__sync_head_parse("r", "r/HEAD", d, n, &h);
    }
    if (!strcmp(kind, "manifest")) {
        fs_manifest m;
        return ferry__sync_manifest_parse("r", "r/v/manifest.json", d, n, &m);
    }
    if (!strcmp(kind, "compactions")) {
        fs_index ix;
        int rc = ferry__sync_index_parse("r", "r/compactions.json", d, n, &ix);
        ferry__sync_index_release(&ix);
        return rc;
    }
    if (!strcmp(kind, "batch")) {
        ferry_dock_header h;
        return ferry_dock_decode(d, n, 1 << 20, "r", &h);
    }
    dk_state s;
    const uint8_t *sig;
    int rc = ferry__dock_cursor_decode(d, n, "r", &s, &sig);
    ferry__dock_state_release(&s);
    return rc;
}

/* Every file of one directory fails as its name says; at least min files. */
static void golden_dir(const char *kind, int min)
{
    char dir[256];
    snprintf(dir, sizeof dir, "tests/golden-errors/%s", kind);
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    if (!d) return;
    int files = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        int want = expected_code(de->d_name);
        if (want < 0) {
            fprintf(stderr, "  %s/%s: no known ERRNAME in the file name\n", kind, de->d_name);
            CHECK(0);
            continue;
        }
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        void *data = NULL;
        size_t n = 0;
        CHECK_OK(ferry_file_read(path, 1 << 24, &data, &n));
        ferry__clear_error();
        int rc = parse(kind, data, n);
        if (rc != want || !ferry_last_error()[0]) {
            fprintf(stderr, "  %s/%s: got %d (%s), want %d\n", kind, de->d_name, rc, ferry_last_error(), want);
            CHECK(0);
        }
        ferry_free(data);
        files++;
    }
    closedir(d);
    CHECK(files >= min);
}

static void test_golden_head(void) { golden_dir("head", 20); }
static void test_golden_manifest(void) { golden_dir("manifest", 20); }
static void test_golden_compactions(void) { golden_dir("compactions", 12); }
static void test_golden_batch(void) { golden_dir("batch", 15); }
static void test_golden_cursor(void) { golden_dir("cursor", 12); }

/* The highest version a record may name is 2^63 - 2 (FS_VERSION_MAX): one
 * above is refused with a message saying so, and the bound itself parses. */
static void test_version_bound(void)
{
    fs_head h = {.version = FS_VERSION_MAX, .kind = FERRY_SYNC_DELTA, .publisher = "p", .time = 1};
    memcpy(h.id, "0123456789abcdef", FS_ID_CAP);
    char mk[FS_KEY_CAP];
    ferry__sync_key_version(mk, "r", h.version, h.id, FS_OBJ_MANIFEST);
    char *t = ferry__sync_head_json("r", &h, mk);
    CHECK(t != NULL);
    fs_head back;
    CHECK_OK(ferry__sync_head_parse("r", "r/HEAD", t, strlen(t), &back));
    CHECK(back.version == FS_VERSION_MAX);
    free(t);
    h.version = FS_VERSION_MAX + 1;
    ferry__sync_key_version(mk, "r", h.version, h.id, FS_OBJ_MANIFEST);
    t = ferry__sync_head_json("r", &h, mk);
    CHECK(t != NULL);
    CHECK_RC(ferry__sync_head_parse("r", "r/HEAD", t, strlen(t), &back), FERRY_ERR_SYNC_MANIFEST);
    CHECK(strstr(ferry_last_error(), "version out of range") != NULL);
    free(t);
}

int main(void)
{
    RUN(test_golden_head);
    RUN(test_golden_manifest);
    RUN(test_golden_compactions);
    RUN(test_golden_batch);
    RUN(test_golden_cursor);
    RUN(test_version_bound);
    return CHECK_SUMMARY();
}
#endif
