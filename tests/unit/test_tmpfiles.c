/* Temporary files are created with O_CREAT | O_EXCL | O_NOFOLLOW under an
 * unpredictable name (review of issue 16): a symbolic link planted at the
 * name the writers used to take, PATH.tmp.PID, must not redirect the write
 * (root's `ferry apply -o`, `diff -o`, `pull --to` and the state files went
 * through it to whatever the link named).  Each writer runs with links
 * planted at PATH.tmp.PID; the file they point at must stay untouched and
 * the output must be complete.  And ferry__tmp_create itself never opens
 * through a link: a name taken by a link is skipped for another. */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "helpers.h"
#include "common.h"

static char g_dir[128], g_victim[200];

static void plant(const char *path)
{
    char tmp[400];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    unlink(tmp);
    CHECK(symlink(g_victim, tmp) == 0);
}

static void victim_intact(void)
{
    void *d = NULL;
    size_t n = 0;
    CHECK_OK(ferry_file_read(g_victim, 1 << 20, &d, &n));
    CHECK(n == 8 && !memcmp(d, "precious", 8));
    ferry_free(d);
}

static void test_planted_links(void)
{
    char out[200];
    snprintf(out, sizeof out, "%s/out.bin", g_dir);
    plant(out);
    CHECK_OK(ferry_file_write(out, "hello", 5));
    victim_intact();

    snprintf(out, sizeof out, "%s/model.safetensors", g_dir);
    plant(out);
    ferry_model *a = ramp_model(0x3F80), *b = ramp_model(0x3F81);
    CHECK_OK(ferry_model_save(a, out));
    victim_intact();

    void *patch = NULL;
    size_t plen = 0;
    CHECK_OK(ferry_diff(a, b, NULL, &patch, &plen));
    snprintf(out, sizeof out, "%s/applied.safetensors", g_dir);
    plant(out);
    CHECK_OK(ferry_apply_file(a, patch, plen, NULL, out));
    victim_intact();
    ferry_model *got = NULL;
    CHECK_OK(ferry_model_open(out, &got));
    uint8_t h1[16], h2[16];
    CHECK_OK(ferry_model_hash(got, h1));
    CHECK_OK(ferry_model_hash(b, h2));
    CHECK(!memcmp(h1, h2, 16));
    ferry_model_free(got);
    ferry_free(patch);
    ferry_model_free(a);
    ferry_model_free(b);
}

static void test_tmp_create_skips_links(void)
{
    char path[200], tmp[400];
    snprintf(path, sizeof path, "%s/t", g_dir);
    for (int i = 0; i < 4; i++) {
        int fd = ferry__tmp_create(path, 0, tmp, sizeof tmp);
        CHECK(fd >= 0);
        if (fd < 0) return;
        struct stat sb;
        CHECK(lstat(tmp, &sb) == 0 && S_ISREG(sb.st_mode));
        close(fd);
        /* the same name again must not open: O_EXCL */
        CHECK(open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644) < 0);
        unlink(tmp);
        CHECK(symlink(g_victim, tmp) == 0); /* a link at a name once handed out */
    }
    CHECK_OK(ferry__tmp_commit(ferry__tmp_create(path, 1, tmp, sizeof tmp), tmp, path, FERRY_OK));
    victim_intact();
}

int main(void)
{
    if (tmpdir_make(g_dir, sizeof g_dir, "ferry-tmpfiles")) return 1;
    snprintf(g_victim, sizeof g_victim, "%s/victim", g_dir);
    if (ferry_file_write(g_victim, "precious", 8)) return 1;
    RUN(test_planted_links);
    RUN(test_tmp_create_skips_links);
    rm_rf(g_dir);
    return CHECK_SUMMARY();
}
