/* Temporary files are created with O_CREAT | O_EXCL | O_NOFOLLOW under an
 * unpredictable name (review of issue 16): a symbolic link planted at the
 * name the writers used to take, PATH.tmp.PID, must not redirect the write
 * (root's `ferry apply -o`, `diff -o`, `pull --to` and the state files went
 * through it to whatever the link named).  Each writer runs with links
 * planted at PATH.tmp.PID; the file they point at must stay untouched and
 * the output must be complete.  And ferry__tmp_create itself never opens
 * through a link: a name taken by a link is skipped for another. */
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "helpers.h"
#include "common.h"
#ifndef FERRY_NO_NET
#include "ferry_sync.h"
#endif

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

#ifndef FERRY_NO_NET /* the sync layer */
static bool exists(const char *p)
{
    struct stat sb;
    return lstat(p, &sb) == 0;
}

/* ferry_sync_local_clean removes the temp files of writers that ended, a
 * zombie included (killed, not yet reaped: `timeout -s KILL` leaves its
 * child so), and keeps those of living processes. */
static void test_clean_zombie(void)
{
    char path[200], live[400], zombie[400], reaped[400];
    snprintf(path, sizeof path, "%s/island.safetensors", g_dir);
    pid_t z = fork();
    if (z == 0) _exit(0);
    pid_t r = fork();
    if (r == 0) _exit(0);
    CHECK(z > 0 && r > 0);
    CHECK(waitpid(r, NULL, 0) == r); /* r is gone; z stays a zombie until waited for */
    siginfo_t si;
    CHECK(waitid(P_PID, (id_t)z, &si, WEXITED | WNOWAIT) == 0); /* z has ended, still unreaped */
    snprintf(live, sizeof live, "%s.tmp.%ld.00", path, (long)getpid());
    snprintf(zombie, sizeof zombie, "%s.tmp.%ld.00", path, (long)z);
    snprintf(reaped, sizeof reaped, "%s.ferry.json.tmp.%ld", path, (long)r);
    CHECK_OK(ferry_file_write(live, "x", 1));
    CHECK_OK(ferry_file_write(zombie, "x", 1));
    CHECK_OK(ferry_file_write(reaped, "x", 1));
    CHECK(kill(z, 0) == 0); /* kill() alone would call the zombie alive */
    ferry_sync_local_clean(path);
    CHECK(exists(live));
    CHECK(!exists(zombie));
    CHECK(!exists(reaped));
    unlink(live);
    waitpid(z, NULL, 0);
}
#endif

int main(void)
{
    if (tmpdir_make(g_dir, sizeof g_dir, "ferry-tmpfiles")) return 1;
    snprintf(g_victim, sizeof g_victim, "%s/victim", g_dir);
    if (ferry_file_write(g_victim, "precious", 8)) return 1;
    RUN(test_planted_links);
    RUN(test_tmp_create_skips_links);
#ifndef FERRY_NO_NET
    RUN(test_clean_zombie);
#endif
    rm_rf(g_dir);
    return CHECK_SUMMARY();
}
