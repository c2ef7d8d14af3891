/* bench/throughput: how fast ferry finds, codes and applies the changes of
 * one checkpoint pair, against the machine's own streaming compare of the
 * same bytes, at each thread count; and the peak RSS of encode and apply.
 *
 *   throughput OLD NEW [--masters M] [--threads 1,2] [--reps N] [--json F]
 *
 * GB/s are of the BF16 model (NEW's tensor bytes).  The streaming compare
 * is a plain count of a[i] != b[i] over OLD's and NEW's tensors, split in
 * contiguous ranges over the threads: the physical reference the codec's
 * passes are measured against.  Encode and apply are timed as a publisher
 * and a subscriber run them in a loop: the base hash is known from the
 * previous version (ferry_diff_options.base_hash / ferry_apply_options.
 * base_hash), so the base is not re-hashed; the result is still verified in
 * full.  RSS is the peak (VmHWM) that the ferry CLI (../ferry beside this
 * program) reports running the same diff and apply.  Two more references
 * cap the apply columns whatever the codec does: fresh memory (malloc +
 * first write of the model's size: apply-mem's output) and the disk
 * (write + fsync of it: apply-file's); an apply is no faster than these. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <libgen.h>

#include "bench_util.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "throughput: %s: %s (%s)\n", what, ferry_last_error(), ferry_strerror(rc));
    exit(1);
}

/* ---- streaming compare ---- */
typedef struct range {
    const uint16_t *a, *b;
    size_t n;
} range;

typedef struct cmp_job {
    range *r;
    size_t nr;
    size_t count;
} cmp_job;

/* The reference loop is compiled for speed (vectorised), so that it is
 * the machine's bandwidth and not a weak baseline. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
static void *cmp_run(void *arg)
{
    cmp_job *j = arg;
    size_t c = 0;
    for (size_t i = 0; i < j->nr; i++)
        for (size_t k = 0; k < j->r[i].n; k++) c += j->r[i].a[k] != j->r[i].b[k];
    j->count = c;
    return NULL;
}

/* Splits the byte stream of all tensors into `threads` equal contiguous
 * ranges, and counts differing 16-bit words. */
static double compare_gbs(const ferry_model *a, const ferry_model *b, int threads, int reps, size_t *diff)
{
    uint64_t total = 0;
    for (size_t i = 0; i < ferry_model_count(b); i++) total += ferry_model_tensor(b, i)->nbytes / 2;
    cmp_job jobs[64];
    range *rs = calloc((ferry_model_count(b) + 1) * (size_t)threads, sizeof *rs);
    uint64_t per = (total + (uint64_t)threads - 1) / (uint64_t)threads, filled = 0;
    int t = 0;
    memset(jobs, 0, sizeof jobs);
    jobs[0].r = rs;
    for (size_t i = 0; i < ferry_model_count(b); i++) {
        const ferry_tensor *tb = ferry_model_tensor(b, i), *ta = ferry_model_find(a, tb->name);
        if (!ta || ta->nbytes != tb->nbytes) continue;
        size_t n = tb->nbytes / 2, off = 0;
        while (off < n) {
            size_t take = n - off;
            if (filled + take > per && t < threads - 1) take = (size_t)(per - filled);
            jobs[t].r[jobs[t].nr++] = (range){(const uint16_t *)ta->data + off, (const uint16_t *)tb->data + off, take};
            off += take;
            filled += take;
            if (filled >= per && t < threads - 1) {
                t++;
                jobs[t].r = rs + (size_t)t * (ferry_model_count(b) + 1);
                filled = 0;
            }
        }
    }
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        pthread_t tid[64];
        double t0 = now();
        for (int k = 1; k < threads; k++) pthread_create(&tid[k], NULL, cmp_run, &jobs[k]);
        cmp_run(&jobs[0]);
        for (int k = 1; k < threads; k++) pthread_join(tid[k], NULL);
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    *diff = 0;
    for (int k = 0; k < threads; k++) *diff += jobs[k].count;
    free(rs);
    return (double)ferry_model_nbytes(b) / 1e9 / best;
}

/* ---- what the output side costs on this machine, without ferry ---- */
/* Fresh memory: malloc + the first write of every byte (page faults and
 * zeroing), one thread: what apply into new buffers pays before decoding
 * anything.  Best of reps. */
static double fresh_memory_gbs(size_t bytes, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        volatile uint8_t *p = malloc(bytes);
        if (!p) return 0;
        memset((void *)p, r + 1, bytes);
        uint8_t keep = p[bytes / 2]; /* the write is observable */
        double dt = now() - t0;
        free((void *)p);
        if (keep != r + 1) return 0;
        if (dt < best) best = dt;
    }
    return (double)bytes / 1e9 / best;
}

/* Disk: write `bytes` to path and fsync, as ferry_apply_file does at the
 * end; once. */
static double disk_gbs(const char *path, size_t bytes)
{
    enum { BUF = 1 << 24 };
    uint8_t *buf = calloc(1, BUF);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (!buf || fd < 0) { free(buf); if (fd >= 0) close(fd); return 0; }
    double t0 = now();
    size_t done = 0;
    while (done < bytes) {
        size_t n = bytes - done < BUF ? bytes - done : BUF;
        if (write(fd, buf, n) != (ssize_t)n) break;
        done += n;
    }
    int ok = done == bytes && fsync(fd) == 0;
    double dt = now() - t0;
    close(fd);
    unlink(path);
    free(buf);
    return ok ? (double)bytes / 1e9 / dt : 0;
}

/* ---- peak RSS of one operation: the ferry CLI in a fresh process ---- */
/* The CLI reports its own VmHWM with --json: a forked child's rusage would
 * include the pages of this (large) process from before its exec. */
static long run_rss_kb(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[1024];
    long kb = -1;
    while (fgets(line, sizeof line, p)) {
        const char *at = strstr(line, "\"peak_rss_kib\": ");
        if (at) kb = atol(at + 16);
    }
    return pclose(p) == 0 ? kb : -1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: throughput OLD NEW [--masters M] [--threads LIST] [--reps N] [--json FILE]\n"
               "  OLD NEW     BF16 checkpoints (.safetensors); NEW is the target\n"
               "  --masters M FP32 masters whose BF16 cast is NEW (measures the FP32 gate)\n"
               "  --threads   comma-separated thread counts (default 1,2)\n"
               "  --reps N    timing repetitions, best kept (default 3)\n"
               "  --json F    also write the results as JSON\n");
}

int main(int argc, char **argv)
{
    const char *oldp = NULL, *newp = NULL, *masters = NULL, *json = NULL, *tlist = "1,2";
    int reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }
        if (!strcmp(argv[i], "--masters") && i + 1 < argc) masters = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) tlist = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!oldp) oldp = argv[i];
        else if (!newp) newp = argv[i];
        else { usage(stderr); return 2; }
    }
    if (!oldp || !newp || reps < 1) { usage(stderr); return 2; }
    ferry_model *a, *b, *m = NULL;
    int rc;
    if ((rc = ferry_model_open(oldp, &a))) die(oldp, rc);
    if ((rc = ferry_model_open(newp, &b))) die(newp, rc);
    if (masters && (rc = ferry_model_open(masters, &m))) die(masters, rc);
    uint8_t ha[16], hb[16];
    if ((rc = ferry_model_hash(a, ha)) || (rc = ferry_model_hash(b, hb))) die("hash", rc); /* also pages everything in */
    double gb = (double)ferry_model_nbytes(b) / 1e9;
    void *patch;
    size_t psize;
    if ((rc = ferry_diff(a, b, &(ferry_diff_options){.threads = 2, .base_hash = ha}, &patch, &psize))) die("diff", rc);
    char patch_path[] = "/tmp/ferry-tp-XXXXXX";
    int pfd = mkstemp(patch_path);
    if (pfd < 0 || write(pfd, patch, psize) != (ssize_t)psize) die("temp patch", FERRY_ERR_IO);
    close(pfd);
    char out_path[600];
    snprintf(out_path, sizeof out_path, "%s.out", patch_path);

    FILE *js = json ? fopen(json, "w") : NULL;
    if (js) fprintf(js, "{\"model_bytes\": %llu, \"patch_bytes\": %zu, \"runs\": [", (unsigned long long)ferry_model_nbytes(b), psize);
    printf("model %.3f GB (BF16), patch %zu bytes\n", gb, psize);
    printf("%-8s %10s %10s %10s %10s %10s %10s | %s\n", "threads", "compare", "enc-bf16", "enc-fp32", "apply-mem", "apply-file",
           "in-place", "ratios to compare (enc-bf16, enc-fp32, apply-mem, apply-file, in-place)");
    char *tl = strdup(tlist), *save = NULL;
    int first = 1;
    double one[6] = {0}, two[6] = {0}; /* the rows at 1 and 2 threads, for the scaling line */
    for (char *tok = strtok_r(tl, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int th = atoi(tok);
        if (th < 1 || th > 64) { fprintf(stderr, "throughput: bad thread count '%s'\n", tok); return 2; }
        size_t diff;
        double cmp = compare_gbs(a, b, th, reps, &diff);
        double enc = 1e30, encm = 1e30, app = 1e30, appf = 1e30, inpl = 1e30;
        for (int r = 0; r < reps; r++) {
            void *p;
            size_t n;
            double t0 = now();
            if ((rc = ferry_diff(a, b, &(ferry_diff_options){.threads = th, .base_hash = ha}, &p, &n))) die("diff", rc);
            double dt = now() - t0;
            if (dt < enc) enc = dt;
            ferry_free(p);
            if (m) {
                t0 = now();
                if ((rc = ferry_diff(a, m, &(ferry_diff_options){.threads = th, .base_hash = ha, .cast_bf16 = 1}, &p, &n)))
                    die("diff masters", rc);
                dt = now() - t0;
                if (dt < encm) encm = dt;
                if (n != psize || memcmp(p, patch, n)) die("masters patch differs from the BF16 patch", FERRY_ERR_TARGET_MISMATCH);
                ferry_free(p);
            }
            ferry_model *out;
            ferry_apply_options ao = {.threads = th, .base_hash = ha};
            t0 = now();
            if ((rc = ferry_apply_ex(a, patch, psize, &ao, &out))) die("apply", rc);
            dt = now() - t0;
            if (dt < app) app = dt;
            ferry_model_free(out);
            t0 = now();
            if ((rc = ferry_apply_file(a, patch, psize, &ao, out_path))) die("apply file", rc);
            dt = now() - t0;
            if (dt < appf) appf = dt;
        }
        /* in place: into an owned copy of OLD (made outside the timing) */
        ferry_model *c;
        if ((rc = bench_model_copy(a, &c))) die("copy", rc);
        for (int r = 0; r < reps; r++) {
            if (r) bench_model_reset(c, a); /* back to OLD, outside the timing */
            double t0 = now();
            if ((rc = ferry_apply_inplace_ex(c, patch, psize, &(ferry_apply_options){.threads = th, .base_hash = ha})))
                die("apply in place", rc);
            double dt = now() - t0;
            if (dt < inpl) inpl = dt;
        }
        ferry_model_free(c);
        double E = gb / enc, EM = m ? gb / encm : 0, A = gb / app, AF = gb / appf, I = gb / inpl;
        double row[6] = {cmp, E, EM, A, AF, I};
        if (th == 1) memcpy(one, row, sizeof row);
        if (th == 2) memcpy(two, row, sizeof row);
        printf("%-8d %9.2f  %9.2f  %9.2f  %9.2f  %9.2f  %9.2f  | %.2f %.2f %.2f %.2f %.2f\n", th, cmp, E, EM, A, AF, I, E / cmp,
               m ? EM / cmp : 0.0, A / cmp, AF / cmp, I / cmp);
        if (js)
            fprintf(js, "%s{\"threads\": %d, \"compare_gbs\": %.4f, \"changed_words\": %zu, \"encode_bf16_gbs\": %.4f, "
                        "\"encode_fp32_gbs\": %.4f, \"apply_mem_gbs\": %.4f, \"apply_file_gbs\": %.4f, \"apply_inplace_gbs\": %.4f}",
                    first ? "" : ", ", th, cmp, diff, E, EM, A, AF, I);
        first = 0;
    }
    free(tl);
    printf("(GB/s of BF16 model; compare = count of a[i] != b[i] over the same bytes; best of %d)\n", reps);
    double scale[6] = {0};
    if (one[0] > 0 && two[0] > 0) {
        for (int i = 0; i < 6; i++) scale[i] = one[i] > 0 ? two[i] / one[i] : 0;
        printf("2 threads / 1 thread: compare %.2fx | enc-bf16 %.2fx, enc-fp32 %.2fx, apply-mem %.2fx, apply-file %.2fx, "
               "in-place %.2fx\n", scale[0], scale[1], scale[2], scale[3], scale[4], scale[5]);
    }

    double fresh = fresh_memory_gbs((size_t)ferry_model_nbytes(b), reps), disk = disk_gbs(out_path, (size_t)ferry_model_nbytes(b));
    printf("output side, without ferry (1 thread): fresh memory %.2f GB/s (malloc + first write, best of %d), "
           "disk %.2f GB/s (write + fsync, once)\n", fresh, reps, disk);

    char ferry_bin[4096], dirbuf[4096];
    snprintf(dirbuf, sizeof dirbuf, "%s", argv[0]);
    snprintf(ferry_bin, sizeof ferry_bin, "%s/../ferry", dirname(dirbuf));
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "'%s' diff '%s' '%s' -o '%s' --json", ferry_bin, oldp, newp, out_path);
    long rss_enc = run_rss_kb(cmd);
    snprintf(cmd, sizeof cmd, "'%s' apply '%s' '%s' -o '%s' --json", ferry_bin, oldp, patch_path, out_path);
    long rss_app = run_rss_kb(cmd);
    if (rss_enc < 0 || rss_app < 0) fprintf(stderr, "throughput: running %s failed\n", ferry_bin);
    double budget = (double)ferry_model_nbytes(a) + 2.0 * (double)psize + 64.0 * (1 << 20);
    printf("peak RSS: encode %.1f MiB; apply (streaming to a file) %.1f MiB, budget checkpoint + 2 x patch + 64 MiB = %.1f MiB: %s\n",
           rss_enc / 1024.0, rss_app / 1024.0, budget / (1 << 20), rss_app * 1024.0 <= budget ? "within" : "OVER");
    if (js) {
        fprintf(js, "], \"scaling_2_over_1\": {\"compare\": %.4f, \"encode_bf16\": %.4f, \"encode_fp32\": %.4f, "
                    "\"apply_mem\": %.4f, \"apply_file\": %.4f, \"apply_inplace\": %.4f}",
                scale[0], scale[1], scale[2], scale[3], scale[4], scale[5]);
        fprintf(js, ", \"fresh_memory_gbs\": %.4f, \"disk_fsync_gbs\": %.4f", fresh, disk);
        fprintf(js, ", \"rss_encode_kib\": %ld, \"rss_apply_kib\": %ld, \"rss_apply_budget_bytes\": %.0f}\n", rss_enc, rss_app, budget);
        fclose(js);
    }
    unlink(patch_path);
    unlink(out_path);
    ferry_free(patch);
    ferry_model_free(a);
    ferry_model_free(b);
    ferry_model_free(m);
    return 0;
}
