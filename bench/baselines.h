/*
 * baselines.h — generic binary-delta baselines run through their command-line
 * tools on the raw checkpoint files: `zstd --patch-from` and `xdelta3`.
 * They know nothing of tensors; they show what a format-blind delta gets.
 * Each patch is decoded again with the same tool and compared with NEW, so
 * a reported size is a working patch.
 *
 * The tools are started with posix_spawnp (no shell, so any path is safe);
 * their stderr goes to a log in the scratch directory and is quoted in the
 * error line when a run fails.
 */
#ifndef BENCH_BASELINES_H
#define BENCH_BASELINES_H

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"

extern char **environ;

#define BASELINE_ZSTD_LEVEL 19 /* --long does not shrink these patches (checked on rl-a) */

/* Reads a whole file into a new buffer. */
static inline int bench_read_file(const char *path, uint8_t **data, size_t *size, bench_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return bench_fail(err, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) || st.st_size < 0) {
        fclose(f);
        return bench_fail(err, "cannot stat %s", path);
    }
    size_t n = (size_t)st.st_size;
    uint8_t *p = malloc(n ? n : 1);
    if (!p) { fclose(f); return bench_fail(err, "out of memory reading %s", path); }
    size_t got = fread(p, 1, n, f);
    fclose(f);
    if (got != n) { free(p); return bench_fail(err, "short read on %s", path); }
    *data = p;
    *size = n;
    return 0;
}

/* Runs argv (argv[0] looked up in PATH) with stdout and stderr sent to log;
 * fails unless it exits 0, quoting the last line of the log (zstd prints
 * advice before its error). */
static inline int baseline_run(char *const argv[], const char *log, bench_err *err)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) return bench_fail(err, "cannot run %s: %s", argv[0], strerror(rc));
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return bench_fail(err, "waitpid(%s): %s", argv[0], strerror(errno));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    char line[300] = "", buf[300];
    FILE *f = fopen(log, "r");
    while (f && fgets(buf, sizeof buf, f)) {
        buf[strcspn(buf, "\n")] = 0;
        if (buf[0]) memcpy(line, buf, sizeof line);
    }
    if (f) fclose(f);
    return bench_fail(err, "%s failed (%s %d): %s", argv[0],
                      WIFEXITED(status) ? "exit" : "signal",
                      WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), line);
}

/* Size of a file, or -1. */
static inline int64_t baseline_file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) ? -1 : (int64_t)st.st_size;
}

/* The decoded file must equal the expected bytes. */
static inline int baseline_check(const char *tool, const char *decoded, const uint8_t *want,
                                 size_t want_size, bench_err *err)
{
    uint8_t *got = NULL;
    size_t n = 0;
    if (bench_read_file(decoded, &got, &n, err)) return -1;
    int same = n == want_size && memcmp(got, want, n) == 0;
    free(got);
    return same ? 0 : bench_fail(err, "%s: decoded file differs from NEW", tool);
}

typedef struct baseline_result {
    uint64_t size;       /* patch bytes */
    double encode_s;     /* one run of the encoder, wall clock */
} baseline_result;

/* zstd -19 --patch-from=OLD NEW, decoded again with zstd -d --patch-from.
 * zstd refuses one file as both input and dictionary, so a pair of one path
 * twice gets a copy of OLD as the dictionary. */
static inline int baseline_zstd(const char *oldp, const char *newp, const uint8_t *want, size_t want_size,
                                const char *tmpdir, baseline_result *r, bench_err *err)
{
    char patch[4096], dec[4096], log[4096], from[4096], lvl[8], copy[4096];
    if (bench_path(patch, sizeof patch, tmpdir, "zstd.patch", err) ||
        bench_path(dec, sizeof dec, tmpdir, "zstd.out", err) ||
        bench_path(log, sizeof log, tmpdir, "zstd.log", err) ||
        bench_path(copy, sizeof copy, tmpdir, "zstd.base", err))
        return -1;
    struct stat so, sn;
    if (stat(oldp, &so) == 0 && stat(newp, &sn) == 0 && so.st_dev == sn.st_dev && so.st_ino == sn.st_ino) {
        FILE *f = fopen(copy, "wb");
        int ok = f && fwrite(want, 1, want_size, f) == want_size; /* same file: NEW's bytes are OLD's */
        if (f && fclose(f)) ok = 0;
        if (!ok) return bench_fail(err, "cannot write %s", copy);
        oldp = copy;
    }
    int w = snprintf(from, sizeof from, "--patch-from=%s", oldp);
    if (w < 0 || (size_t)w >= sizeof from) return bench_fail(err, "path too long: %s", oldp);
    snprintf(lvl, sizeof lvl, "-%d", BASELINE_ZSTD_LEVEL);
    char *enc[] = {"zstd", "-q", "-f", lvl, from, (char *)newp, "-o", patch, NULL};
    char *dcd[] = {"zstd", "-q", "-f", "-d", from, patch, "-o", dec, NULL};
    double t0 = bench_now();
    if (baseline_run(enc, log, err)) return -1;
    r->encode_s = bench_now() - t0;
    int64_t sz = baseline_file_size(patch);
    if (sz < 0) return bench_fail(err, "zstd wrote no patch");
    r->size = (uint64_t)sz;
    int rc = baseline_run(dcd, log, err) || baseline_check("zstd --patch-from", dec, want, want_size, err);
    unlink(patch);
    unlink(dec);
    unlink(log);
    unlink(copy);
    return rc ? -1 : 0;
}

/* xdelta3 -e -s OLD NEW (default settings), decoded with xdelta3 -d -s OLD. */
static inline int baseline_xdelta3(const char *oldp, const char *newp, const uint8_t *want, size_t want_size,
                                   const char *tmpdir, baseline_result *r, bench_err *err)
{
    char patch[4096], dec[4096], log[4096];
    if (bench_path(patch, sizeof patch, tmpdir, "xdelta3.patch", err) ||
        bench_path(dec, sizeof dec, tmpdir, "xdelta3.out", err) ||
        bench_path(log, sizeof log, tmpdir, "xdelta3.log", err))
        return -1;
    char *enc[] = {"xdelta3", "-e", "-f", "-s", (char *)oldp, (char *)newp, patch, NULL};
    char *dcd[] = {"xdelta3", "-d", "-f", "-s", (char *)oldp, patch, dec, NULL};
    double t0 = bench_now();
    if (baseline_run(enc, log, err)) return -1;
    r->encode_s = bench_now() - t0;
    int64_t sz = baseline_file_size(patch);
    if (sz < 0) return bench_fail(err, "xdelta3 wrote no patch");
    r->size = (uint64_t)sz;
    int rc = baseline_run(dcd, log, err) || baseline_check("xdelta3", dec, want, want_size, err);
    unlink(patch);
    unlink(dec);
    unlink(log);
    return rc ? -1 : 0;
}

#endif /* BENCH_BASELINES_H */
