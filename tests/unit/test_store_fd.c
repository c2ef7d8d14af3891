/* ferry_store_put_fd: an object written from a range of an open file, read
 * part by part as it is sent.  `test_store_fd` runs against a fresh local
 * directory (file://); `test_store_fd s3://BUCKET` against an S3 server
 * (endpoint and keys from the environment, as tests/scripts/store_s3.sh
 * sets them for s3rver), with 64 KiB parts, so that the larger objects
 * here are multipart uploads.  Checked on both: byte-identical objects at
 * every size around the part size and from an offset, the file position
 * left alone, the etag the store reports, and that a failure (the file
 * ends before the range, a descriptor that cannot be read) leaves no
 * object, not even part of one, and an object already there untouched. */
#ifdef FERRY_NO_NET /* a core-only build (make NO_NET=1) has no store layer */
#include "helpers.h"
NOT_BUILT_MAIN("store layer not built (NO_NET=1)")
#else
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

/* its helpers (sc_open, sc_key, sc_pattern, sc_get_eq); not its cases */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "store_scenario.h"
#pragma GCC diagnostic pop

#define PART 65536
#define FILE_BYTES (5 * PART + 1234)
#define LEAD 1000 /* the objects start this far into the file */

static int g_s3;
static char g_dir[128], g_file[160];
static uint8_t *g_data; /* the file's bytes */

/* The temporary data file, opened read-only. */
static int open_data(void)
{
    int fd = open(g_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) perror(g_file);
    return fd;
}

/* Whether key is absent (HEAD says NOT_FOUND). */
static int absent(ferry_store *s, const char *key)
{
    ferry_store_stat st;
    int rc = ferry_store_head(s, key, &st);
    if (rc != FERRY_ERR_STORE_NOT_FOUND) fprintf(stderr, "head %s: rc %d (%s)\n", key, rc, ferry_last_error());
    return rc == FERRY_ERR_STORE_NOT_FOUND;
}

/* file://: no temporary file of a put left in the objects' directory. */
static int no_temporaries(void)
{
    if (g_s3) return 1;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, sc_base);
    DIR *d = opendir(path);
    if (!d) return 1; /* nothing was ever created there */
    int clean = 1;
    struct dirent *e;
    for (int i = 0; i < 100000 && (e = readdir(d)); i++)
        if (!strncmp(e->d_name, ".ferry-", 7)) {
            fprintf(stderr, "left behind: %s/%s\n", path, e->d_name);
            clean = 0;
        }
    closedir(d);
    return clean;
}

/* Every size around the part size, from offset LEAD: the object is those
 * bytes, the etag is the one HEAD gives, the file position is unmoved. */
static void t_sizes(void)
{
    ferry_store *s = sc_open();
    int fd = open_data();
    CHECK(s && fd >= 0);
    if (!s || fd < 0) goto out;
    CHECK(lseek(fd, 77, SEEK_SET) == 77);
    static const size_t sizes[] = {0, 1, PART - 1, PART, PART + 1, 3 * PART, FILE_BYTES - LEAD};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char rel[64], etag[FERRY_STORE_ETAG_MAX] = "";
        snprintf(rel, sizeof rel, "sizes/%zu", sizes[i]);
        CHECK_OK(ferry_store_put_fd(s, sc_key(rel), fd, LEAD, sizes[i], etag));
        CHECK(sc_get_eq(s, sc_key(rel), g_data + LEAD, sizes[i]));
        ferry_store_stat st;
        CHECK_OK(ferry_store_head(s, sc_key(rel), &st));
        CHECK(st.size == sizes[i]);
        if (etag[0] && st.etag[0] && strcmp(etag, st.etag)) fprintf(stderr, "etag %s, head says %s\n", etag, st.etag);
        CHECK(!etag[0] || !st.etag[0] || !strcmp(etag, st.etag));
    }
    /* from offset 0, the whole file: the same as put_file */
    CHECK_OK(ferry_store_put_fd(s, sc_key("sizes/whole"), fd, 0, FILE_BYTES, NULL));
    CHECK(sc_get_eq(s, sc_key("sizes/whole"), g_data, FILE_BYTES));
    CHECK_OK(ferry_store_put_file(s, sc_key("sizes/put_file"), g_file, NULL));
    CHECK(sc_get_eq(s, sc_key("sizes/put_file"), g_data, FILE_BYTES));
    CHECK(lseek(fd, 0, SEEK_CUR) == 77);
    CHECK(no_temporaries());
out:
    if (fd >= 0) close(fd);
    ferry_store_free(s);
}

/* The file ends before the range: FERRY_ERR_IO, no object (on s3 the
 * multipart upload is aborted after its first parts went out); an object
 * already under the key keeps its bytes. */
static void t_short_file(void)
{
    ferry_store *s = sc_open();
    int fd = open_data();
    CHECK(s && fd >= 0);
    if (!s || fd < 0) goto out;
    /* small (one PUT on s3) and large (the fourth of five parts fails) */
    CHECK_RC(ferry_store_put_fd(s, sc_key("short/small"), fd, FILE_BYTES - 10, 100, NULL), FERRY_ERR_IO);
    CHECK(strstr(ferry_last_error(), "ends first") != NULL);
    CHECK(absent(s, sc_key("short/small")));
    CHECK_RC(ferry_store_put_fd(s, sc_key("short/large"), fd, 2 * PART, 5 * PART, NULL), FERRY_ERR_IO);
    CHECK(absent(s, sc_key("short/large")));
    /* over an object that is there: it stays as it was */
    CHECK_OK(ferry_store_put(s, sc_key("short/kept"), "old bytes", 9, NULL));
    CHECK_RC(ferry_store_put_fd(s, sc_key("short/kept"), fd, PART, FILE_BYTES, NULL), FERRY_ERR_IO);
    CHECK(sc_get_eq(s, sc_key("short/kept"), "old bytes", 9));
    CHECK(no_temporaries());
out:
    if (fd >= 0) close(fd);
    ferry_store_free(s);
}

/* A descriptor that cannot be read (write-only): FERRY_ERR_IO, no object;
 * bad arguments: FERRY_ERR_ARG before any request. */
static void t_bad_descriptor(void)
{
    ferry_store *s = sc_open();
    int fd = open(g_file, O_WRONLY | O_CLOEXEC);
    CHECK(s && fd >= 0);
    if (!s || fd < 0) goto out;
    CHECK_RC(ferry_store_put_fd(s, sc_key("bad/wronly"), fd, 0, 3 * PART, NULL), FERRY_ERR_IO);
    CHECK(absent(s, sc_key("bad/wronly")));
    CHECK_RC(ferry_store_put_fd(s, sc_key("bad/nofd"), -1, 0, 10, NULL), FERRY_ERR_ARG);
    CHECK_RC(ferry_store_put_fd(s, sc_key("bad/range"), fd, UINT64_MAX - 5, 10, NULL), FERRY_ERR_ARG);
    CHECK_RC(ferry_store_put_fd(s, "../escape", fd, 0, 10, NULL), FERRY_ERR_STORE_KEY);
    if (g_s3) {
        /* more than S3's 10 000 parts of at most 5 GiB (50 TiB): refused
         * before any request (no upload begun, nothing read) */
        int rfd = open_data();
        CHECK_RC(ferry_store_put_fd(s, sc_key("bad/huge"), rfd, 0, 10000ull * (5ull << 30) + 1, NULL), FERRY_ERR_LIMIT);
        CHECK(strstr(ferry_last_error(), "10000 parts") != NULL);
        CHECK(absent(s, sc_key("bad/huge")));
        if (rfd >= 0) close(rfd);
    }
    CHECK(absent(s, sc_key("bad/nofd")) && absent(s, sc_key("bad/range")));
    CHECK(no_temporaries());
out:
    if (fd >= 0) close(fd);
    ferry_store_free(s);
}


/* Ranges past 4 GiB of a sparse file (off_t and the 64-bit offsets of
 * every layer): the object is the bytes written there, not those at the
 * offset taken modulo 2^32 (the file's start, also written). */
static void t_past_4gib(void)
{
    ferry_store *s = sc_open();
    char path[200];
    snprintf(path, sizeof path, "%s.sparse", g_dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    CHECK(s && fd >= 0);
    if (!s || fd < 0) goto out;
    const uint64_t far = (5ull << 30) + 4096; /* 5 GiB + 4 KiB */
    uint8_t *other = sc_pattern(FILE_BYTES, 9);
    int ok = other && pwrite(fd, other, FILE_BYTES, 4096) == FILE_BYTES &&
             pwrite(fd, g_data, FILE_BYTES, (off_t)far) == FILE_BYTES;
    CHECK(ok);
    if (ok) {
        CHECK_OK(ferry_store_put_fd(s, sc_key("far/small"), fd, far + LEAD, 100, NULL));
        CHECK(sc_get_eq(s, sc_key("far/small"), g_data + LEAD, 100));
        CHECK_OK(ferry_store_put_fd(s, sc_key("far/large"), fd, far + LEAD, 3 * PART + 7, NULL));
        CHECK(sc_get_eq(s, sc_key("far/large"), g_data + LEAD, 3 * PART + 7));
        /* ends past the file's end, 5 GiB in: the read's error, no object */
        CHECK_RC(ferry_store_put_fd(s, sc_key("far/short"), fd, far + FILE_BYTES - 10, 2 * PART, NULL), FERRY_ERR_IO);
        CHECK(absent(s, sc_key("far/short")));
    }
    free(other);
    CHECK(no_temporaries());
out:
    if (fd >= 0) close(fd);
    unlink(path);
    ferry_store_free(s);
}

/* Only with the strict server (FERRY_TEST_STRICT_EP, its endpoint): a
 * request it fails is retried and its bytes read again from the file at
 * the right offset: one PUT answered 503, one applied and its answer lost,
 * part 3 of a multipart upload answered 503, the first 3 requests of one
 * (its CreateMultipartUpload and parts sent first) answered 503.  The
 * objects are the file's bytes (the server checks each payload hash). */
static int strict_ctl(const char *q)
{
    const char *ep = getenv("FERRY_TEST_STRICT_EP");
    char cmd[400];
    snprintf(cmd, sizeof cmd, "curl -sf '%s/__ctl?%s' >/dev/null", ep, q);
    return system(cmd) == 0;
}

static void t_retried(void)
{
    if (!g_s3 || !getenv("FERRY_TEST_STRICT_EP")) {
        puts("  (t_retried: strict server only)");
        return;
    }
    ferry_store *s = sc_open();
    int fd = open_data();
    CHECK(s && fd >= 0);
    if (!s || fd < 0) goto out;
    static const struct { const char *ctl; uint64_t off, size; } c[] = {
        {"fail=1", LEAD, PART - 3},           /* a single PUT answered 503 */
        {"lose=1", LEAD + 1, PART},           /* applied, its answer lost */
        {"fail_part=3", LEAD + 5, 4 * PART},  /* a part answered 503 */
        {"fail=3", 3, 5 * PART},              /* Create, then the first parts sent: 503 */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "retried/%zu", i);
        CHECK(strict_ctl(c[i].ctl));
        CHECK_OK(ferry_store_put_fd(s, sc_key(rel), fd, c[i].off, c[i].size, NULL));
        CHECK(sc_get_eq(s, sc_key(rel), g_data + c[i].off, c[i].size));
    }
out:
    if (fd >= 0) close(fd);
    ferry_store_free(s);
}

int main(int argc, char **argv)
{
    (void)argc;
    snprintf(g_dir, sizeof g_dir, "/tmp/ferry-store-fd-%ld", (long)getpid());
    snprintf(g_file, sizeof g_file, "%s.data", g_dir);
    snprintf(sc_base, sizeof sc_base, "putfd-%ld", (long)getpid());
    g_s3 = argv[1] && !strncmp(argv[1], "s3://", 5);
    if (g_s3) {
        sc_url = argv[1];
        sc_opts.part_size = PART; /* under S3's 5 MiB: test servers take it */
        sc_opts.retry_base_ms = 50;
        sc_opts.deadline_ms = 20000;
    } else {
        if (mkdir(g_dir, 0755)) {
            perror(g_dir);
            return 1;
        }
        sc_url = g_dir;
    }
    g_data = sc_pattern(FILE_BYTES, 7);
    int fd = open(g_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, g_data, FILE_BYTES) != FILE_BYTES || close(fd)) {
        perror(g_file);
        return 1;
    }
    RUN(t_sizes);
    RUN(t_short_file);
    RUN(t_bad_descriptor);
    RUN(t_past_4gib);
    RUN(t_retried);
    unlink(g_file);
    if (!g_s3) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd)) fprintf(stderr, "cannot remove %s\n", g_dir);
    }
    free(g_data);
    return CHECK_SUMMARY();
}
#endif /* FERRY_NO_NET */
