/* Special files as inputs and outputs (review of issue 23, items 6 and 17).
 *
 * Outputs: `ferry pull --to /dev/null` as root once replaced the device
 * node with a regular file (every writer renames a new file over its
 * output).  An existing output that is not a regular file, a FIFO, a
 * character device (made here with mknod when root, a copy of /dev/null's
 * numbers inside the test's own directory: /dev is never touched), a
 * directory, a socket or a symbolic link, is refused by every writer with
 * FERRY_ERR_IO naming it, stays what it was, and nothing is left beside it.
 *
 * Inputs: a FIFO given where a file is read (a key file, a patch, a file
 * to put in a store, a file store object) used to block the open forever;
 * it is refused at once with an error naming the path.  alarm() turns a
 * hang into a failure of this program instead of a stuck CI job. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include "check.h"
#include "helpers.h"
#include "common.h"
#ifndef FERRY_NO_NET
#include "ferry_sign.h"
#include "ferry_store.h"
#endif

static char g_dir[128];

static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_dir, name); }

/* The special files of this run, made fresh in g_dir. */
enum { K_FIFO, K_DIR, K_SOCK, K_LINK, K_CHR, K_N };
static const char *const k_name[K_N] = {"fifo", "dir", "sock", "link", "null"};
static mode_t k_type[K_N] = {S_IFIFO, S_IFDIR, S_IFSOCK, S_IFLNK, S_IFCHR};
static int g_sock = -1;

static bool make_special(int k, char *path, size_t cap)
{
    path_in(path, cap, k_name[k]);
    struct stat sb;
    if (!lstat(path, &sb)) return true; /* made by an earlier case */
    switch (k) {
    case K_FIFO: return mkfifo(path, 0600) == 0;
    case K_DIR: return mkdir(path, 0700) == 0;
    case K_SOCK: {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        if (strlen(path) >= sizeof a.sun_path) return false;
        strcpy(a.sun_path, path);
        if (g_sock < 0) g_sock = socket(AF_UNIX, SOCK_STREAM, 0);
        return g_sock >= 0 && bind(g_sock, (struct sockaddr *)&a, sizeof a) == 0;
    }
    case K_LINK: {
        char target[200];
        path_in(target, sizeof target, "link-target");
        return ferry_file_write(target, "target", 6) == 0 && symlink(target, path) == 0;
    }
    default: /* the numbers of /dev/null (1, 3), in our own directory */
        return mknod(path, S_IFCHR | 0600, makedev(1, 3)) == 0;
    }
}

static int kinds(void) { return geteuid() == 0 ? K_N : K_CHR; } /* mknod needs root */

/* The special file is still what it was, and nothing was left beside it. */
static void intact(int k, const char *path)
{
    struct stat sb;
    CHECK(lstat(path, &sb) == 0 && (sb.st_mode & S_IFMT) == k_type[k]);
    if (k == K_CHR) CHECK(major(sb.st_rdev) == 1 && minor(sb.st_rdev) == 3);
    if (k == K_LINK) {
        char target[200];
        path_in(target, sizeof target, "link-target");
        void *d = NULL;
        size_t n = 0;
        CHECK_OK(ferry_file_read(target, 100, &d, &n));
        CHECK(n == 6 && !memcmp(d, "target", 6));
        ferry_free(d);
    }
    DIR *dir = opendir(g_dir);
    CHECK(dir != NULL);
    if (!dir) return;
    const char *base = strrchr(path, '/') + 1;
    size_t bl = strlen(base);
    for (struct dirent *e; (e = readdir(dir));)
        if (!strncmp(e->d_name, base, bl) && e->d_name[bl] == '.') {
            fprintf(stderr, "left beside %s: %s\n", path, e->d_name);
            CHECK(!"a file was left beside the refused output");
        }
    closedir(dir);
}

static void refused(int rc, const char *path)
{
    CHECK_RC(rc, FERRY_ERR_IO);
    CHECK(strstr(ferry_last_error(), path) != NULL);
    CHECK(strstr(ferry_last_error(), "not a regular file") != NULL);
}

/* Every library writer refuses every kind of special output. */
static void test_outputs_refused(void)
{
    ferry_model *a = ramp_model(0x3F80), *b = ramp_model(0x3F81);
    void *patch = NULL;
    size_t plen = 0;
    CHECK_OK(ferry_diff(a, b, NULL, &patch, &plen));
    for (int k = 0; k < kinds(); k++) {
        char p[200];
        CHECK(make_special(k, p, sizeof p));
        refused(ferry_file_write(p, "data", 4), p);
        intact(k, p);
        refused(ferry_model_save(a, p), p);
        intact(k, p);
        refused(ferry_apply_file(a, patch, plen, NULL, p), p);
        intact(k, p);
    }
    if (geteuid() != 0) printf("note: not root, no character device made (mknod needs root)\n");
    ferry_free(patch);
    ferry_model_free(a);
    ferry_model_free(b);
}

/* A FIFO made at PATH while the writer was busy (after the check at the
 * start) is still not replaced: the rename is checked again. */
static void test_swapped_in_before_rename(void)
{
    char p[200], tmp[400];
    path_in(p, sizeof p, "late");
    unlink(p);
    int fd = ferry__tmp_create(p, 0, tmp, sizeof tmp);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK(write(fd, "x", 1) == 1);
    CHECK(mkfifo(p, 0600) == 0);
    refused(ferry__tmp_commit(fd, tmp, p, FERRY_OK), p);
    intact(K_FIFO, p);
    CHECK(access(tmp, F_OK) != 0);
    unlink(p);
}

/* A regular file is still replaced as before. */
static void test_regular_output_replaced(void)
{
    char p[200];
    path_in(p, sizeof p, "plain");
    CHECK_OK(ferry_file_write(p, "one", 3));
    CHECK_OK(ferry_file_write(p, "two!", 4));
    void *d = NULL;
    size_t n = 0;
    CHECK_OK(ferry_file_read(p, 100, &d, &n));
    CHECK(n == 4 && !memcmp(d, "two!", 4));
    ferry_free(d);
}

/* Inputs: refused at once (no open of a FIFO), naming the path. */
static void test_inputs_refused(void)
{
    for (int k = 0; k < kinds(); k++) {
        if (k == K_LINK) continue; /* a link to a regular file is a valid input (key files often are) */
        char p[200];
        CHECK(make_special(k, p, sizeof p));
        void *d = NULL;
        size_t n = 0;
        refused(ferry_file_read(p, 1 << 20, &d, &n), p);
        CHECK(d == NULL);
        ferry_model *m = NULL;
        if (k != K_DIR) refused(ferry_model_open(p, &m), p); /* a directory of shards is a model */
#ifndef FERRY_NO_NET
        ferry_keys *keys = NULL;
        CHECK_OK(ferry_keys_create(&keys));
        char id[FERRY_KEY_ID_LEN + 1];
        CHECK(ferry_keys_set_signer(keys, p, id) != FERRY_OK);
        CHECK(strstr(ferry_last_error(), p) != NULL);
        CHECK(ferry_keys_trust(keys, p, -1, id) != FERRY_OK); /* -1: the publisher role */
        CHECK(strstr(ferry_last_error(), p) != NULL);
        ferry_keys_free(keys);
#endif
        intact(k, p);
    }
    char p[200], fifo[200];
    CHECK(make_special(K_LINK, p, sizeof p));
    void *d = NULL;
    size_t n = 0;
    CHECK_OK(ferry_file_read(p, 100, &d, &n));
    CHECK(n == 6 && !memcmp(d, "target", 6));
    ferry_free(d);
    /* a link is followed, and what it names must be a regular file */
    CHECK(make_special(K_FIFO, fifo, sizeof fifo));
    path_in(p, sizeof p, "link-to-fifo");
    CHECK(symlink(fifo, p) == 0);
    refused(ferry_file_read(p, 100, &d, &n), p);
}

#ifndef FERRY_NO_NET
/* Store transfers: a download into a special PATH is refused before
 * anything is fetched, the plain and the parallel way; a special file
 * given to put is refused without blocking. */
static void test_store_transfers(void)
{
    char root[200];
    path_in(root, sizeof root, "store");
    ferry_store *s = NULL;
    ferry_store_options o = {0};
    o.create = 1;
    CHECK_OK(ferry_store_open(root, &o, &s));
    if (!s) return;
    static uint8_t big[1 << 16];
    memset(big, 7, sizeof big);
    CHECK_OK(ferry_store_put(s, "obj", big, sizeof big, NULL));
    ferry_store_transfer_options xo = {.chunk_size = 4096, .concurrency = 2};
    for (int k = 0; k < kinds(); k++) {
        char p[200];
        CHECK(make_special(k, p, sizeof p));
        refused(ferry_store_get_file(s, "obj", p, NULL), p);
        intact(k, p);
        refused(ferry_store_get_file_parallel(s, "obj", p, &xo, NULL), p);
        intact(k, p);
        if (k != K_LINK) {
            refused(ferry_store_put_file(s, "in", p, NULL), p);
            intact(k, p);
        }
    }
    /* PATH.part (the parallel download's staging file) a FIFO: refused */
    char p[200], part[220];
    path_in(p, sizeof p, "dl");
    snprintf(part, sizeof part, "%s.part", p);
    CHECK(mkfifo(part, 0600) == 0);
    CHECK_RC(ferry_store_get_file_parallel(s, "obj", p, &xo, NULL), FERRY_ERR_IO);
    CHECK(strstr(ferry_last_error(), part) != NULL);
    struct stat sb;
    CHECK(lstat(part, &sb) == 0 && S_ISFIFO(sb.st_mode) && lstat(p, &sb) != 0);
    unlink(part);
    CHECK_OK(ferry_store_get_file_parallel(s, "obj", p, &xo, NULL));
    ferry_store_free(s);
}
#endif

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "test_special_files: hung for 20 s (a FIFO blocked an open?)\n";
    if (write(2, m, sizeof m - 1)) {}
    _exit(2);
}

int main(void)
{
    signal(SIGALRM, on_alarm);
    alarm(20);
    if (tmpdir_make(g_dir, sizeof g_dir, "ferry-special")) return 1;
    RUN(test_outputs_refused);
    RUN(test_swapped_in_before_rename);
    RUN(test_regular_output_replaced);
    RUN(test_inputs_refused);
#ifndef FERRY_NO_NET
    RUN(test_store_transfers);
#endif
    if (g_sock >= 0) close(g_sock);
    rm_rf(g_dir);
    return CHECK_SUMMARY();
}
