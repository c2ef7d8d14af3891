/* file:// backend: the common store scenario, plus what only a local
 * directory can show: atomic replacement, temporary files never listed,
 * the CAS lock released when its holder crashes or is killed, CAS under
 * contention from threads and processes, URL forms. */
#ifdef FERRY_NO_NET /* a core-only build (make NO_NET=1) has no store layer */
#include "helpers.h"
NOT_BUILT_MAIN("store layer not built (NO_NET=1)")
#else
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>

#include "store_scenario.h"

static char g_root[128];

static void msleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void rm_rf(const char *path)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", path);
}

static ferry_store *open_root(void)
{
    ferry_store *s = NULL;
    int rc = ferry_store_open(g_root, NULL, &s);
    if (rc) fprintf(stderr, "open: %s\n", ferry_last_error());
    return s;
}

static void test_scenario(void)
{
    sc_roundtrip();
    sc_missing();
    sc_range();
    sc_list();
    sc_cas();
    sc_hostile_keys();
    sc_limit();
    sc_args();
}

static void test_large(void) { sc_large_n((9u << 20) + 12345); }

static void test_open_forms(void)
{
    ferry_store *s = NULL;
    char url[300];
    snprintf(url, sizeof url, "file://%s", g_root);
    CHECK_OK(ferry_store_open(url, NULL, &s));
    CHECK(s && ferry_store_kind(s) == FERRY_STORE_FILE);
    CHECK(s && !strncmp(ferry_store_url(s), "file:///", 8));
    ferry_store_free(s);
    snprintf(url, sizeof url, "file://localhost%s", g_root);
    CHECK_OK(ferry_store_open(url, NULL, &s));
    ferry_store_free(s);
    s = NULL;
    CHECK_RC(ferry_store_open("file://relative/dir", NULL, &s), FERRY_ERR_STORE_URL);
    CHECK(s == NULL);
    CHECK_RC(ferry_store_open("ftp://host/x", NULL, &s), FERRY_ERR_STORE_URL);
    CHECK_RC(ferry_store_open("", NULL, &s), FERRY_ERR_STORE_URL);
    /* a URL that lost its "//" is refused, naming it, never made a local
     * directory (issue 27: Publisher("s3:/bkt/typo") published into ./s3:/bkt/typo) */
    {
        char here[256];
        CHECK(getcwd(here, sizeof here) != NULL);
        CHECK(chdir(g_root) == 0);
        static const char *const lost[] = {"s3:/bkt/typo", "http:/x", "file:/x", "HTTPS:/h", "s3:bkt", "gs:/b"};
        ferry_store_options mk = {.create = 1};
        for (size_t i = 0; i < sizeof lost / sizeof lost[0]; i++) {
            CHECK_RC(ferry_store_open(lost[i], &mk, &s), FERRY_ERR_STORE_URL);
            CHECK(s == NULL && strstr(ferry_last_error(), lost[i]) != NULL);
        }
        struct stat ls;
        CHECK(stat("s3:", &ls) != 0 && stat("http:", &ls) != 0 && stat("file:", &ls) != 0);
        /* the escape it names works, and a ':' elsewhere is a plain path */
        CHECK_OK(ferry_store_open("./s3:/bkt", &mk, &s));
        ferry_store_free(s);
        CHECK_OK(ferry_store_open("data:2024", &mk, &s));
        ferry_store_free(s);
        s = NULL;
        CHECK(chdir(here) == 0);
    }
    CHECK_RC(ferry_store_open(NULL, NULL, &s), FERRY_ERR_ARG);
    /* a missing root: refused unless create is set */
    char missing[200];
    snprintf(missing, sizeof missing, "%s/new/deeper", g_root);
    CHECK_RC(ferry_store_open(missing, NULL, &s), FERRY_ERR_STORE_NOT_FOUND);
    ferry_store_options o = {.create = 1};
    CHECK_OK(ferry_store_open(missing, &o, &s));
    struct stat st;
    CHECK(stat(missing, &st) == 0 && S_ISDIR(st.st_mode));
    ferry_store_free(s);
    /* a root that is a file */
    char file[200];
    snprintf(file, sizeof file, "%s/plainfile", g_root);
    FILE *f = fopen(file, "w");
    if (f) fclose(f);
    CHECK_RC(ferry_store_open(file, NULL, &s), FERRY_ERR_IO);
    unlink(file);
    /* a relative path is made absolute */
    char cwd[256];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK(chdir(g_root) == 0);
    CHECK_OK(ferry_store_open("new", NULL, &s));
    CHECK(s && strstr(ferry_store_url(s), g_root + 1) && !strstr(ferry_store_url(s), "/./"));
    ferry_store_free(s);
    CHECK(chdir(cwd) == 0);
    /* codes all have names */
    for (int c = FERRY_ERR_STORE_URL; c <= FERRY_ERR_STORE_CANCELED; c++)
        CHECK(strcmp(ferry_strerror(c), "unknown error") != 0);
}

/* What the file layout looks like: objects at ROOT/KEY, and no '..' can
 * climb out; a key and a "directory" of the same name conflict. */
static void test_layout(void)
{
    ferry_store *s = open_root();
    if (!s) return;
    CHECK_OK(ferry_store_put(s, "lay/x/y.bin", "abc", 3, NULL));
    char path[300];
    snprintf(path, sizeof path, "%s/lay/x/y.bin", g_root);
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size == 3);
    CHECK_RC(ferry_store_put(s, "lay/x", "dir", 3, NULL), FERRY_ERR_STORE_KEY);
    CHECK_RC(ferry_store_put(s, "lay/x/y.bin/z", "f", 1, NULL), FERRY_ERR_STORE_KEY);
    void *d = NULL;
    size_t n;
    CHECK_RC(ferry_store_get(s, "lay/x", &d, &n, NULL), FERRY_ERR_STORE_NOT_FOUND); /* a directory is no object */
    CHECK_OK(ferry_store_delete(s, "lay/x"));
    /* names that are not keys, and symlinks, are not listed */
    snprintf(path, sizeof path, "%s/lay/bad\x01name", g_root);
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
    snprintf(path, sizeof path, "%s/lay/link", g_root);
    CHECK(symlink("/etc", path) == 0);
    ferry_store_listing *l = NULL;
    CHECK_OK(ferry_store_list(s, "lay", &l));
    CHECK(l && l->count == 1 && !strcmp(l->entries[0].key, "lay/x/y.bin"));
    ferry_store_listing_free(l);
    ferry_store_free(s);
}

/* etags: exact content hash for small objects (so equal content gives an
 * equal etag, different content a different one), cheap for large ones. */
static void test_etags(void)
{
    ferry_store *s = open_root();
    if (!s) return;
    char a[FERRY_STORE_ETAG_MAX], b[FERRY_STORE_ETAG_MAX], c[FERRY_STORE_ETAG_MAX];
    CHECK_OK(ferry_store_put(s, "et/a", "same", 4, a));
    CHECK_OK(ferry_store_put(s, "et/b", "same", 4, b));
    CHECK_OK(ferry_store_put(s, "et/c", "diff", 4, c));
    CHECK(!strcmp(a, b) && strcmp(a, c) && strlen(a) == 32);
    size_t n = (1u << 20) + 1;
    uint8_t *big = sc_pattern(n, 3);
    CHECK_OK(ferry_store_put(s, "et/big", big, n, a));
    ferry_store_stat st;
    CHECK_OK(ferry_store_head(s, "et/big", &st));
    CHECK(!strcmp(st.etag, a) && a[0] == 'm');
    ferry_store_listing *l = NULL;
    CHECK_OK(ferry_store_list(s, "et/", &l));
    CHECK(l && l->count == 4 && !strcmp(l->entries[3].key, "et/c") && !strcmp(l->entries[3].stat.etag, c));
    CHECK(l && !strcmp(l->entries[2].key, "et/big") && !strcmp(l->entries[2].stat.etag, a));
    ferry_store_listing_free(l);
    free(big);
    /* a poller's conditional read: nothing handed over while the etag holds */
    void *d = (void *)1;
    size_t dn = 7;
    int same = 0;
    CHECK_OK(ferry_store_get_if_changed(s, "et/c", c, 0, &d, &dn, &same, &st));
    CHECK(same == 1 && d == NULL && dn == 0 && !strcmp(st.etag, c));
    CHECK_OK(ferry_store_put(s, "et/c", "next", 4, b));
    CHECK_OK(ferry_store_get_if_changed(s, "et/c", c, 0, &d, &dn, &same, &st));
    CHECK(same == 0 && dn == 4 && d && !memcmp(d, "next", 4) && !strcmp(st.etag, b));
    ferry_free(d);
    CHECK_OK(ferry_store_get_if_changed(s, "et/c", "", 0, &d, &dn, &same, NULL));
    CHECK(same == 0 && dn == 4);
    ferry_free(d);
    CHECK_RC(ferry_store_get_if_changed(s, "et/c", c, 0, &d, &dn, NULL, NULL), FERRY_ERR_ARG);
    ferry_store_free(s);
}

/* ---------------------------------------------------------------------
 * Crashes: a writer killed in the middle of a CAS (holding the lock,
 * temporary file half written) leaves the object as it was, no listed
 * debris, and no stuck lock.
 * ------------------------------------------------------------------- */

static int g_pipe_w = -1;
static int block_in_progress(void *user, uint64_t done, uint64_t total)
{
    (void)user, (void)done, (void)total;
    char c = 'L';
    if (write(g_pipe_w, &c, 1) != 1) _exit(3);
    for (int i = 0; i < 3000; i++) msleep(10); /* at most 30 s: the parent kills us first */
    _exit(4);
}

static void test_crashed_holder(void)
{
    ferry_store *s = open_root();
    if (!s) return;
    CHECK_OK(ferry_store_put(s, "crash/latest", "old", 3, NULL));
    ferry_store_stat before;
    CHECK_OK(ferry_store_head(s, "crash/latest", &before));
    for (int mode = 0; mode < 2; mode++) { /* 0: SIGKILL, 1: the child _exit()s holding the lock */
        int p[2];
        CHECK(pipe(p) == 0);
        pid_t pid = fork();
        if (pid == 0) {
            close(p[0]);
            if (mode == 1) {
                /* take the lock the way ferry does, and die without unlocking */
                char lock[300];
                snprintf(lock, sizeof lock, "%s/.ferry-cas.lock", g_root);
                int fd = open(lock, O_RDWR | O_CREAT, 0644);
                if (fd < 0 || flock(fd, LOCK_EX)) _exit(2);
                char c = 'L';
                if (write(p[1], &c, 1) != 1) _exit(3);
                msleep(300);
                _exit(0);
            }
            g_pipe_w = p[1];
            ferry_store_options o = {.progress = block_in_progress};
            ferry_store *cs = NULL;
            if (ferry_store_open(g_root, &o, &cs)) _exit(2);
            size_t n = 20u << 20; /* > 8 MiB: the progress callback runs mid-write */
            uint8_t *big = calloc(1, n);
            ferry_store_cas(cs, "crash/latest", before.etag, big, n, NULL);
            _exit(5);
        }
        close(p[1]);
        char c = 0;
        CHECK(read(p[0], &c, 1) == 1 && c == 'L');
        close(p[0]);
        /* the lock is held by a live process: a CAS waits, then times out */
        ferry_store_options o = {.deadline_ms = mode ? 50 : 300};
        ferry_store *t = NULL;
        CHECK_OK(ferry_store_open(g_root, &o, &t));
        if (mode == 0) {
            CHECK_RC(ferry_store_cas(t, "crash/latest", before.etag, "new", 3, NULL), FERRY_ERR_STORE_TIMEOUT);
            CHECK(strstr(ferry_last_error(), "lock") != NULL);
            kill(pid, SIGKILL);
        }
        int status = 0;
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(mode == 0 ? WIFSIGNALED(status) : WIFEXITED(status) && WEXITSTATUS(status) == 0);
        /* the object is untouched, nothing half-written is visible */
        CHECK(sc_get_eq(t, "crash/latest", "old", 3));
        ferry_store_listing *l = NULL;
        CHECK_OK(ferry_store_list(t, "crash/", &l));
        CHECK(l && l->count == 1);
        ferry_store_listing_free(l);
        ferry_store_free(t);
        /* and the lock is free: the next CAS goes through at once */
        o.deadline_ms = 2000;
        CHECK_OK(ferry_store_open(g_root, &o, &t));
        char e[FERRY_STORE_ETAG_MAX];
        CHECK_OK(ferry_store_cas(t, "crash/latest", before.etag, "old", 3, e)); /* same bytes, same etag */
        CHECK(!strcmp(e, before.etag));
        ferry_store_free(t);
    }
    /* the temporary file of the killed writer is still there, but unlisted */
    ferry_store_free(s);
}

/* ---------------------------------------------------------------------
 * Contention: N threads and M processes each increment a counter object
 * K times with read + cas, retrying on conflict.  Lost updates would show
 * as a final count below the total.
 * ------------------------------------------------------------------- */

#define K_INC 25

static int increment(ferry_store *s, const char *key, int k)
{
    for (int i = 0; i < k; i++) {
        for (int tries = 0;; tries++) {
            if (tries > 10000) return -1;
            void *d = NULL;
            size_t n = 0;
            ferry_store_stat st;
            if (ferry_store_get(s, key, &d, &n, &st)) return -1;
            char next[32];
            snprintf(next, sizeof next, "%ld", strtol(d, NULL, 10) + 1);
            ferry_free(d);
            int rc = ferry_store_cas(s, key, st.etag, next, strlen(next), NULL);
            if (rc == 0) break;
            if (rc != FERRY_ERR_STORE_CONFLICT) return -1;
        }
    }
    return 0;
}

static void *inc_thread(void *arg)
{
    ferry_store *s = arg;
    return (void *)(intptr_t)increment(s, "cnt/value", K_INC);
}

static void test_contention(void)
{
    ferry_store *s = open_root();
    if (!s) return;
    CHECK_OK(ferry_store_put(s, "cnt/value", "0", 1, NULL));
    pid_t pids[3];
    for (int i = 0; i < 3; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            ferry_store *cs = open_root();
            _exit(cs && increment(cs, "cnt/value", K_INC) == 0 ? 0 : 1);
        }
    }
    pthread_t th[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&th[i], NULL, inc_thread, s) == 0);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        CHECK(r == NULL);
    }
    for (int i = 0; i < 3; i++) {
        int status = 0;
        CHECK(waitpid(pids[i], &status, 0) == pids[i] && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    void *d = NULL;
    size_t n = 0;
    CHECK_OK(ferry_store_get(s, "cnt/value", &d, &n, NULL));
    CHECK(d && strtol(d, NULL, 10) == 7 * K_INC);
    ferry_free(d);
    ferry_store_free(s);
}

/* Readers never see a partial object while a writer replaces it. */
static void *reader(void *arg)
{
    ferry_store *s = arg;
    for (int i = 0; i < 300; i++) {
        void *d = NULL;
        size_t n = 0;
        if (ferry_store_get(s, "atom/obj", &d, &n, NULL)) return (void *)1;
        const uint8_t *b = d;
        int bad = n != 65536;
        for (size_t j = 1; !bad && j < n; j++) bad = b[j] != b[0];
        ferry_free(d);
        if (bad) return (void *)2;
    }
    return NULL;
}

static void test_atomic_replace(void)
{
    ferry_store *s = open_root();
    if (!s) return;
    static uint8_t buf[65536];
    memset(buf, 0, sizeof buf);
    CHECK_OK(ferry_store_put(s, "atom/obj", buf, sizeof buf, NULL));
    pthread_t th;
    CHECK(pthread_create(&th, NULL, reader, s) == 0);
    for (int i = 1; i <= 100; i++) {
        memset(buf, i, sizeof buf);
        CHECK_OK(ferry_store_put(s, "atom/obj", buf, sizeof buf, NULL));
    }
    void *r;
    pthread_join(th, &r);
    CHECK(r == NULL);
    ferry_store_free(s);
}

/* Symbolic links planted inside the root are never followed (review of
 * issue 16): a link "out" -> a directory outside the root must not let
 * get, head, get_range, put or delete reach what is out there, and a link
 * as the object itself is not an object. */
static void test_symlinks_not_followed(void)
{
    ferry_store *s = open_root();
    if (!s) return;
    char outside[200], secret[260], link[260], victim[260];
    snprintf(outside, sizeof outside, "%s-outside", g_root);
    rm_rf(outside);
    CHECK(mkdir(outside, 0755) == 0);
    snprintf(secret, sizeof secret, "%s/secret", outside);
    CHECK_OK(ferry_file_write(secret, "top secret", 10));
    snprintf(link, sizeof link, "%s/ln", g_root);
    CHECK(symlink(outside, link) == 0);
    snprintf(victim, sizeof victim, "%s/obj", g_root);
    CHECK(symlink(secret, victim) == 0);

    void *d = NULL;
    size_t n = 0;
    ferry_store_stat st;
    char buf[16];
    CHECK(ferry_store_get(s, "ln/secret", &d, &n, NULL) != FERRY_OK && d == NULL);
    CHECK(strstr(ferry_last_error(), "symbolic link") != NULL);
    CHECK(ferry_store_head(s, "ln/secret", &st) != FERRY_OK);
    CHECK(ferry_store_get_range(s, "ln/secret", 0, sizeof buf, buf, &n) != FERRY_OK);
    CHECK(ferry_store_get(s, "obj", &d, &n, NULL) != FERRY_OK && d == NULL);
    CHECK(ferry_store_put(s, "ln/new", "x", 1, NULL) != FERRY_OK);
    char created[300];
    snprintf(created, sizeof created, "%s/new", outside);
    CHECK(access(created, F_OK) != 0);
    ferry_store_delete(s, "ln/secret");
    CHECK(access(secret, F_OK) == 0);
    /* the link itself can be replaced by a real object */
    CHECK_OK(ferry_store_put(s, "obj", "mine", 4, NULL));
    CHECK_OK(ferry_store_get(s, "obj", &d, &n, NULL));
    CHECK(n == 4 && !memcmp(d, "mine", 4));
    ferry_free(d);
    CHECK_OK(ferry_file_read(secret, 100, &d, &n));
    CHECK(n == 10 && !memcmp(d, "top secret", 10));
    ferry_free(d);
    unlink(link);
    rm_rf(outside);
    ferry_store_free(s);
}

/* Special files planted in the store (review of issue 23): a FIFO (or,
 * as root, a character device made in the store with /dev/null's numbers)
 * at a key's place used to block every reader forever (pull, publish,
 * log and mirror past their deadline).  They are not objects: refused at
 * once with FERRY_ERR_STORE_CORRUPT (a store list moves on to the next
 * store), never opened, skipped by listings; so is a symbolic link.  A
 * FIFO as the CAS lock is refused too.  SIGALRM ends a hang as a failure. */
static void test_special_objects(void)
{
    ferry_store *s = open_root();
    if (!s) return;
    alarm(20);
    char path[300];
    CHECK_OK(ferry_store_put(s, "sp/real", "real", 4, NULL));
    const char *keys[3] = {"sp/fifo", "sp/link", "sp/null"};
    snprintf(path, sizeof path, "%s/sp/fifo", g_root);
    CHECK(mkfifo(path, 0600) == 0);
    snprintf(path, sizeof path, "%s/sp/link", g_root);
    CHECK(symlink("real", path) == 0);
    int n_keys = 2;
    if (geteuid() == 0) {
        snprintf(path, sizeof path, "%s/sp/null", g_root);
        CHECK(mknod(path, S_IFCHR | 0600, makedev(1, 3)) == 0);
        n_keys = 3;
    }
    for (int i = 0; i < n_keys; i++) {
        void *d = NULL;
        size_t n = 0;
        ferry_store_stat st;
        char buf[8], tmp[300];
        CHECK_RC(ferry_store_get(s, keys[i], &d, &n, NULL), FERRY_ERR_STORE_CORRUPT);
        CHECK(d == NULL && strstr(ferry_last_error(), keys[i]) != NULL);
        CHECK_RC(ferry_store_head(s, keys[i], &st), FERRY_ERR_STORE_CORRUPT);
        CHECK_RC(ferry_store_get_range(s, keys[i], 0, sizeof buf, buf, &n), FERRY_ERR_STORE_CORRUPT);
        snprintf(tmp, sizeof tmp, "%s-out", g_root);
        CHECK_RC(ferry_store_get_file(s, keys[i], tmp, NULL), FERRY_ERR_STORE_CORRUPT);
        CHECK(access(tmp, F_OK) != 0);
        CHECK_RC(ferry_store_cas(s, keys[i], "x", "new", 3, NULL), FERRY_ERR_STORE_CORRUPT);
    }
    struct stat sb;
    snprintf(path, sizeof path, "%s/sp/fifo", g_root);
    CHECK(lstat(path, &sb) == 0 && S_ISFIFO(sb.st_mode));
    ferry_store_listing *l = NULL;
    CHECK_OK(ferry_store_list(s, "sp/", &l));
    CHECK(l && l->count == 1 && !strcmp(l->entries[0].key, "sp/real"));
    ferry_store_listing_free(l);

    /* a FIFO as the CAS lock: refused, not waited on */
    char root2[200];
    snprintf(root2, sizeof root2, "%s-lock", g_root);
    rm_rf(root2);
    CHECK(mkdir(root2, 0755) == 0);
    snprintf(path, sizeof path, "%s/.ferry-cas.lock", root2);
    CHECK(mkfifo(path, 0600) == 0);
    ferry_store *s2 = NULL;
    CHECK_OK(ferry_store_open(root2, NULL, &s2));
    if (s2) CHECK_RC(ferry_store_cas(s2, "k", NULL, "v", 1, NULL), FERRY_ERR_STORE_CORRUPT);
    ferry_store_free(s2);
    rm_rf(root2);
    alarm(0);
    ferry_store_free(s);
}

/* A prefix directory that is a symbolic link out of the root (a dock whose
 * RUN/traj -> /usr/share listed 61,187 outside files, with their sizes and
 * hashes, on every pass): nothing under it is listed, whether the prefix
 * names the link's directory, a part of its name, or a directory above. */
static void test_symlinked_prefix(void)
{
    ferry_store *s = open_root();
    if (!s) return;
    char outside[200], path[300];
    snprintf(outside, sizeof outside, "%s-away", g_root);
    rm_rf(outside);
    CHECK(mkdir(outside, 0755) == 0);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/batch-%d", outside, i);
        CHECK_OK(ferry_file_write(path, "outside", 7));
    }
    snprintf(path, sizeof path, "%s/sub", outside);
    CHECK(mkdir(path, 0755) == 0);
    snprintf(path, sizeof path, "%s/sub/deep", outside);
    CHECK_OK(ferry_file_write(path, "outside", 7));
    CHECK_OK(ferry_store_put(s, "dk/RUN/own", "mine", 4, NULL));
    snprintf(path, sizeof path, "%s/dk/RUN/traj", g_root);
    CHECK(symlink(outside, path) == 0);
    const char *prefixes[] = {"dk/RUN/traj/", "dk/RUN/traj/b", "dk/RUN/traj/sub/", "dk/RUN/tr", "dk/RUN/", "dk/", ""};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
        ferry_store_listing *l = NULL;
        CHECK_OK(ferry_store_list(s, prefixes[i], &l));
        for (size_t j = 0; l && j < l->count; j++)
            if (strstr(l->entries[j].key, "traj")) {
                fprintf(stderr, "prefix '%s' listed %s (outside the root)\n", prefixes[i], l->entries[j].key);
                CHECK(!"a file outside the root was listed");
            }
        ferry_store_listing_free(l);
    }
    ferry_store_listing *l = NULL;
    CHECK_OK(ferry_store_list(s, "dk/", &l));
    CHECK(l && l->count == 1 && !strcmp(l->entries[0].key, "dk/RUN/own"));
    ferry_store_listing_free(l);
    unlink(path);
    rm_rf(outside);
    ferry_store_free(s);
}

int main(void)
{
    snprintf(g_root, sizeof g_root, "/tmp/ferry-store-test-%ld", (long)getpid());
    rm_rf(g_root);
    if (mkdir(g_root, 0755)) {
        perror(g_root);
        return 1;
    }
    sc_url = g_root;
    snprintf(sc_base, sizeof sc_base, "scenario");
    RUN(test_scenario);
    RUN(test_large);
    RUN(test_open_forms);
    RUN(test_layout);
    RUN(test_etags);
    RUN(test_crashed_holder);
    RUN(test_contention);
    RUN(test_atomic_replace);
    RUN(test_symlinks_not_followed);
    RUN(test_special_objects);
    RUN(test_symlinked_prefix);
    rm_rf(g_root);
    return CHECK_SUMMARY();
}
#endif /* FERRY_NO_NET */
