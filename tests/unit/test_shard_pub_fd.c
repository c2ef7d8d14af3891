/* The shard publisher's temporary files (lib/shard/shard_pub.c): the tile
 * file and the two object files each rank object is written into as it is
 * coded and uploaded from (ferry_store_put_fd).  One rank, a synthetic
 * model of a BF16 matrix and a 1-D tensor, on a fresh file:// store, with
 * TMPDIR a fresh directory.  Checked: the files are unlinked and
 * close-on-exec, no descriptor is added per version (/proc/self/fd counted
 * over many versions, anchors and deltas), every descriptor is closed by
 * ferry_shard_publisher_free; a write error on an object file (the file
 * size limit, as a full disk) fails the put with FERRY_ERR_IO naming the
 * object file, uploads nothing, finish(1) after it is a no-op, and the
 * next publish is exact; so does a failed upload (the store's rename
 * refused), its temporary file removed; every version an island pulls is
 * exactly the tensors published (the uploaded objects decode to them). */
#include "check.h"
#include "ferry_shard.h"
#include "ferry_sync.h"
#include "shard/shard_impl.h" /* the token's id and the rank object's key (t_upload_error) */

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <unistd.h>

#define ROWS 300
#define COLS 512
#define VEC 1000

static char g_root[120], g_tmp[200];
static int g_run_no;
static uint16_t g_mat[ROWS * COLS], g_vec[VEC];
static const uint64_t g_mat_shape[2] = {ROWS, COLS}, g_vec_shape[1] = {VEC};

static uint64_t g_rng = 88172645463325252ull;
static uint16_t rnd16(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint16_t)(0x3c00u + (g_rng >> 40) % 0x0800u); /* finite BF16 values */
}

/* Version v's tensors: the first all new, later ones a few rows changed. */
static void make_version(int v)
{
    if (v == 1) {
        for (size_t i = 0; i < ROWS * COLS; i++) g_mat[i] = rnd16();
        for (size_t i = 0; i < VEC; i++) g_vec[i] = rnd16();
        return;
    }
    for (size_t r = (size_t)(v * 37) % ROWS, k = 0; k < 5; k++, r = (r + 61) % ROWS)
        for (size_t c = 0; c < COLS; c += 3) g_mat[r * COLS + c] = rnd16();
    g_vec[(size_t)v % VEC] = rnd16();
}

static ferry_store *open_store(void)
{
    ferry_store_options o = {.create = 1};
    ferry_store *s = NULL;
    if (ferry_store_open(g_root, &o, &s)) fprintf(stderr, "store: %s\n", ferry_last_error());
    return s;
}

static int open_pub(ferry_store *st, const char *run, ferry_shard_publisher **p)
{
    ferry_shard_options o = {.rank = 0, .world = 1, .min_tile_words = 8192, .anchor_every = 4, .publisher_id = "test-pub-fd"};
    int rc = ferry_shard_publisher_open(st, run, &o, p);
    if (rc) fprintf(stderr, "publisher: %s\n", ferry_last_error());
    return rc;
}

/* The current tensors as the next version, through the four steps (world
 * 1); returns the first failure. */
static int publish(ferry_shard_publisher *p)
{
    ferry_shard_part parts[2] = {
        {"a.weight", FERRY_BF16, 2, g_mat_shape, 0, ROWS, g_mat},
        {"b.bias", FERRY_BF16, 1, g_vec_shape, 0, VEC, g_vec},
    };
    char *tok = NULL, *rec = NULL;
    size_t tn = 0, rn = 0;
    int rc = ferry_shard_begin(p, 0, &tok, &tn);
    if (!rc) rc = ferry_shard_put(p, tok, tn, parts, 2, &rec, &rn);
    if (!rc) rc = ferry_shard_commit(p, tok, tn, (const char *const *)&rec, &rn, 1, NULL);
    int f = ferry_shard_finish(p, rc == 0);
    if (!rc) rc = f;
    ferry_free(rec);
    ferry_free(tok);
    return rc;
}

/* An island of both whole tensors pulls version v: exactly the tensors. */
static int pulls_exact(ferry_store *st, const char *run, uint64_t v)
{
    ferry_shard_region rg[2] = {{"a.weight", 0, ROWS, 0, COLS}, {"b.bias", 0, VEC, 0, 1}};
    ferry_shard_subscriber *s = NULL;
    int ok = !ferry_shard_subscriber_open(st, run, rg, 2, NULL, &s) && !ferry_shard_pull(s, FERRY_SYNC_EXACT, v, NULL);
    static uint16_t got[ROWS * COLS];
    ok = ok && !ferry_shard_region_copy(s, 0, got, sizeof got) && !memcmp(got, g_mat, sizeof g_mat);
    ok = ok && !ferry_shard_region_copy(s, 1, got, sizeof g_vec) && !memcmp(got, g_vec, sizeof g_vec);
    if (!ok) fprintf(stderr, "pull of %s version %llu: %s\n", run, (unsigned long long)v, ferry_last_error());
    ferry_shard_subscriber_free(s);
    return ok;
}

/* Open descriptors of this process; *tmp_fds: how many of them name a
 * deleted file in g_tmp, *no_cloexec: how many of those lack FD_CLOEXEC. */
static int count_fds(int *tmp_fds, int *no_cloexec)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0, self = dirfd(d);
    *tmp_fds = *no_cloexec = 0;
    struct dirent *e;
    for (int i = 0; i < 10000 && (e = readdir(d)); i++) {
        if (e->d_name[0] == '.') continue;
        int fd = atoi(e->d_name);
        if (fd == self) continue;
        n++;
        char link[64], target[512];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t k = readlink(link, target, sizeof target - 1);
        if (k <= 0) continue;
        target[k] = 0;
        if (!strncmp(target, g_tmp, strlen(g_tmp)) && strstr(target, "(deleted)")) {
            (*tmp_fds)++;
            if (!(fcntl(fd, F_GETFD) & FD_CLOEXEC)) (*no_cloexec)++;
        }
    }
    closedir(d);
    return n;
}

/* Entries of g_tmp (nothing must be left there). */
static int tmp_entries(void)
{
    DIR *d = opendir(g_tmp);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    for (int i = 0; i < 10000 && (e = readdir(d)); i++)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* 14 versions (anchors at 1, 5, 9, 13), then a 15th from a new publisher
 * (a restarted rank): each exact; the publisher's
 * descriptors are its three unlinked close-on-exec files from the second
 * version on (the first has no delta object), not one more per version, and all closed by free. */
static void t_descriptors(void)
{
    char run[64];
    snprintf(run, sizeof run, "fd/run-%d", ++g_run_no);
    ferry_store *st = open_store();
    ferry_shard_publisher *p = NULL;
    int t0, c0, t1, c1, t2, c2;
    int base = count_fds(&t0, &c0);
    CHECK(base > 0 && t0 == 0);
    if (!st || open_pub(st, run, &p)) goto out;
    int after_first = -1;
    for (int v = 1; v <= 14; v++) {
        make_version(v);
        int rc = publish(p);
        if (rc) fprintf(stderr, "version %d: %s\n", v, ferry_last_error());
        CHECK_OK(rc);
        if (rc) break;
        CHECK(pulls_exact(st, run, (uint64_t)v));
        int n = count_fds(&t1, &c1);
        if (v == 2) after_first = n; /* (version 1, an anchor, has no delta object file yet) */
        if (v >= 2 && n != after_first) fprintf(stderr, "version %d: %d descriptors, %d after version 2\n", v, n, after_first);
        CHECK(v < 2 || n == after_first);
        CHECK(t1 == (v == 1 ? 2 : 3)); /* the tile file and the object files */
        CHECK(c1 == 0);
    }
    CHECK(tmp_entries() == 0);
    ferry_shard_publisher_free(p);
    p = NULL;
    CHECK(count_fds(&t2, &c2) == base && t2 == 0);
    /* a restarted rank: its tiles fetched back (resume), a delta, exact */
    if (open_pub(st, run, &p)) goto out;
    make_version(15);
    CHECK_OK(publish(p));
    CHECK(ferry_shard_publisher_version(p) == 15 && pulls_exact(st, run, 15));
    int n15 = count_fds(&t1, &c1);
    if (t1 != 2) fprintf(stderr, "restarted: %d descriptors, %d of files in TMPDIR\n", n15, t1);
    CHECK(n15 == after_first - 1 && t1 == 2 && c1 == 0); /* a delta: no anchor object file */
    ferry_shard_publisher_free(p);
    p = NULL;
    CHECK(count_fds(&t2, &c2) == base && t2 == 0);
out:
    ferry_shard_publisher_free(p);
    ferry_store_free(st);
}

/* A write error on an object file (RLIMIT_FSIZE below the object, as a
 * full disk): FERRY_ERR_IO naming the object file, no object uploaded,
 * finish(1) a no-op; with room again the next publish is exact, and so is
 * a delta on it. */
static void t_write_error(void)
{
    char run[64];
    snprintf(run, sizeof run, "fd/run-%d", ++g_run_no);
    ferry_store *st = open_store();
    ferry_shard_publisher *p = NULL;
    if (!st || open_pub(st, run, &p)) goto out;
    struct rlimit old, lim;
    CHECK(!getrlimit(RLIMIT_FSIZE, &old));
    lim = old;
    lim.rlim_cur = 16384; /* the version's object is ~300 KiB (random values) */
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    make_version(1);
    CHECK(!setrlimit(RLIMIT_FSIZE, &lim));
    char *tok = NULL, *rec = NULL;
    size_t tn = 0, rn = 0;
    ferry_shard_part parts[2] = {
        {"a.weight", FERRY_BF16, 2, g_mat_shape, 0, ROWS, g_mat},
        {"b.bias", FERRY_BF16, 1, g_vec_shape, 0, VEC, g_vec},
    };
    CHECK_OK(ferry_shard_begin(p, 0, &tok, &tn));
    int rc = ferry_shard_put(p, tok, tn, parts, 2, &rec, &rn);
    CHECK(!setrlimit(RLIMIT_FSIZE, &old));
    signal(SIGXFSZ, prev);
    CHECK_RC(rc, FERRY_ERR_IO);
    printf("  the put's error: %s\n", ferry_last_error());
    CHECK(strstr(ferry_last_error(), "object file") != NULL);
    CHECK(strstr(ferry_last_error(), "tensor 'a.weight' tile") != NULL); /* where it was */
    CHECK(rec == NULL);
    CHECK_OK(ferry_shard_finish(p, 1)); /* nothing pending: nothing taken */
    /* no rank object was uploaded */
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s/", run);
    ferry_store_listing *ls = NULL;
    int lrc = ferry_store_list(st, prefix, &ls);
    CHECK(lrc == FERRY_OK || lrc == FERRY_ERR_STORE_NOT_FOUND);
    size_t objs = 0;
    for (size_t i = 0; !lrc && ls && i < ls->count; i++)
        if (strstr(ls->entries[i].key, "-r000000.")) { /* a rank object */
            fprintf(stderr, "left in the store: %s\n", ls->entries[i].key);
            objs++;
        }
    CHECK(objs == 0);
    ferry_store_listing_free(ls);
    ferry_free(tok);
    ferry_free(rec);
    /* room again: the publish goes through, exact; then a delta on it */
    rc = publish(p);
    if (rc) fprintf(stderr, "after the error: %s\n", ferry_last_error());
    CHECK_OK(rc);
    uint64_t v = ferry_shard_publisher_version(p);
    CHECK(v >= 1 && pulls_exact(st, run, v));
    make_version(2);
    CHECK_OK(publish(p));
    CHECK(ferry_shard_publisher_version(p) == v + 1 && pulls_exact(st, run, v + 1));
    CHECK(tmp_entries() == 0);
out:
    ferry_shard_publisher_free(p);
    ferry_store_free(st);
}

/* The upload itself fails (a directory where the store renames the rank
 * object into place): the store's error, no rank object, finish(1) a
 * no-op; then the same publisher publishes, exact, its object files
 * reused (no descriptor added past the delta object file made once). */
static void t_upload_error(void)
{
    char run[64];
    snprintf(run, sizeof run, "fd/run-%d", ++g_run_no);
    ferry_store *st = open_store();
    ferry_shard_publisher *p = NULL;
    if (!st || open_pub(st, run, &p)) goto out;
    make_version(1);
    CHECK_OK(publish(p)); /* version 1, so that the failed one is a delta */
    int t0, c0, t1, c1;
    int n0 = count_fds(&t0, &c0);
    make_version(2);
    char *tok = NULL, *rec = NULL;
    size_t tn = 0, rn = 0;
    ferry_shard_part parts[2] = {
        {"a.weight", FERRY_BF16, 2, g_mat_shape, 0, ROWS, g_mat},
        {"b.bias", FERRY_BF16, 1, g_vec_shape, 0, VEC, g_vec},
    };
    CHECK_OK(ferry_shard_begin(p, 0, &tok, &tn));
    sh_token t;
    char key[FS_KEY_CAP], path[600];
    CHECK_OK(ferry__shard_token_parse(tok, tn, &t));
    ferry__shard_key_object(key, run, t.version, t.id, 0, SH_DELTA);
    snprintf(path, sizeof path, "%s/%s", g_root, key);
    CHECK(!mkdir(path, 0755));
    int rc = ferry_shard_put(p, tok, tn, parts, 2, &rec, &rn);
    printf("  the failed upload: rc %d: %s\n", rc, ferry_last_error());
    CHECK(rc != FERRY_OK && rec == NULL && strstr(ferry_last_error(), "rename") != NULL);
    CHECK_OK(ferry_shard_finish(p, 1));
    ferry_free(tok);
    ferry_free(rec);
    /* the store's temporary file of the failed put is gone too */
    char vdir[400];
    snprintf(vdir, sizeof vdir, "%s/%s/v", g_root, run);
    DIR *d = opendir(vdir);
    int temps = 0;
    struct dirent *e;
    for (int i = 0; d && i < 10000 && (e = readdir(d)); i++) temps += !strncmp(e->d_name, ".ferry-", 7);
    if (d) closedir(d);
    CHECK(d != NULL && temps == 0);
    CHECK(!rmdir(path));
    CHECK_OK(publish(p));
    CHECK(ferry_shard_publisher_version(p) == 2 && pulls_exact(st, run, 2));
    CHECK(count_fds(&t1, &c1) == n0 + 1 && t1 == t0 + 1);
    make_version(3);
    CHECK_OK(publish(p));
    CHECK(ferry_shard_publisher_version(p) == 3 && pulls_exact(st, run, 3));
    CHECK(count_fds(&t1, &c1) == n0 + 1 && t1 == t0 + 1);
    CHECK(tmp_entries() == 0);
out:
    ferry_shard_publisher_free(p);
    ferry_store_free(st);
}

int main(void)
{
    snprintf(g_root, sizeof g_root, "/tmp/ferry-shard-pub-fd-%ld", (long)getpid());
    snprintf(g_tmp, sizeof g_tmp, "%s.tmp", g_root);
    if (mkdir(g_root, 0755) || mkdir(g_tmp, 0755)) {
        perror(g_root);
        return 1;
    }
    setenv("TMPDIR", g_tmp, 1);
    RUN(t_descriptors);
    RUN(t_write_error);
    RUN(t_upload_error);
    char cmd[500];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", g_root, g_tmp);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", g_root);
    return CHECK_SUMMARY();
}
