/* bench/profile: one ferry operation on one checkpoint pair, repeated, each
 * run timed on its own; for `perf record` and for A/B runs of two builds.
 * bench/throughput measures every operation in one run; this one isolates
 * one, with nothing else in the process between repetitions.
 *
 *   profile MODE OLD NEW [--masters M] [--threads N] [--reps N] [--out F] [--scatter] [--warmup] [--island]
 *
 * MODE: diff (NEW as BF16), diff-fp32 (--masters M, cast on the fly),
 * apply (into new memory), apply-file (to --out, fsync'd), in-place (into
 * an owned copy of OLD, put back between runs outside the timing).  As in
 * bench/throughput, the base hash is passed as known.  Each run prints its
 * seconds and GB/s of NEW's tensor bytes; the last line is the best.
 * To profile only the timed runs:
 *   mkfifo /tmp/ctl && PERF_CTL_FIFO=/tmp/ctl perf record -D -1 --control fifo:/tmp/ctl -- profile ... */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "scatter.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: profile MODE OLD NEW [--masters M] [--threads N] [--reps N] [--out F] [--scatter] [--warmup]\n"
               "  MODE        diff | diff-fp32 | apply | apply-file | in-place\n"
               "  OLD NEW     BF16 checkpoints (.safetensors); NEW is the target\n"
               "  --masters M FP32 masters whose BF16 cast is NEW (diff-fp32)\n"
               "  --threads N worker threads (default 1)\n"
               "  --reps N    runs (default 5)\n"
               "  --out F     apply-file's output (default /tmp/ferry-profile.safetensors)\n"
               "  --scatter   in-place: after each run, time the raw scatter of the same changes\n"
               "              (int32 indices + words, bench/scatter.h) with as many threads, into\n"
               "              the same copy put back to OLD; prints both and their ratio\n"
               "  --warmup    one run first that is neither timed nor profiled (memory the\n"
               "              library keeps between calls is then in place, as on an island)\n"
               "  --island    in-place: put the copy back to OLD by applying the patch NEW->OLD\n"
               "              in place (untimed) instead of copying OLD over it, so that the\n"
               "              leaf digests an island keeps stay valid (docs/FORMAT.md)\n");
}

/* With PERF_CTL_FIFO set (perf record -D -1 --control fifo:PATH), the
 * profile covers the timed runs only: enabled before each, disabled after. */
static void perf_ctl(int on)
{
    const char *path = getenv("PERF_CTL_FIFO");
    if (!path || !*path) return;
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(on ? "enable\n" : "disable\n", f);
    fclose(f);
}

/* CPU seconds of the whole process: on a machine shared with other work,
 * less disturbed than the wall clock by the time slices others take. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "profile: %s: %s (%s)\n", what, ferry_last_error(), ferry_strerror(rc));
    exit(1);
}

int main(int argc, char **argv)
{
    const char *mode = NULL, *oldp = NULL, *newp = NULL, *masters = NULL, *out = "/tmp/ferry-profile.safetensors";
    int threads = 1, reps = 5, scatter = 0, warmup = 0, island = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }
        if (!strcmp(argv[i], "--masters") && i + 1 < argc) masters = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--scatter")) scatter = 1;
        else if (!strcmp(argv[i], "--warmup")) warmup = 1;
        else if (!strcmp(argv[i], "--island")) island = 1;
        else if (!mode) mode = argv[i];
        else if (!oldp) oldp = argv[i];
        else if (!newp) newp = argv[i];
        else { usage(stderr); return 2; }
    }
    int m_diff = mode && !strcmp(mode, "diff"), m_fp32 = mode && !strcmp(mode, "diff-fp32"),
        m_apply = mode && !strcmp(mode, "apply"), m_file = mode && !strcmp(mode, "apply-file"),
        m_inplace = mode && !strcmp(mode, "in-place");
    if (!newp || reps < 1 || threads < 1 || threads > 64 || !(m_diff || m_fp32 || m_apply || m_file || m_inplace) ||
        (m_fp32 && !masters)) {
        usage(stderr);
        return 2;
    }
    ferry_model *a, *b, *m = NULL, *c = NULL;
    int rc;
    if ((rc = ferry_model_open(oldp, &a))) die(oldp, rc);
    if ((rc = ferry_model_open(newp, &b))) die(newp, rc);
    if (m_fp32 && (rc = ferry_model_open(masters, &m))) die(masters, rc);
    uint8_t ha[16];
    if ((rc = ferry_model_hash(a, ha))) die("hash", rc); /* also pages OLD in */
    void *patch = NULL;
    size_t psize = 0;
    if (!m_diff && !m_fp32 && (rc = ferry_diff(a, b, &(ferry_diff_options){.threads = threads, .base_hash = ha}, &patch, &psize)))
        die("diff", rc);
    if (m_inplace && (rc = bench_model_copy(a, &c))) die("copy", rc); /* made outside the timing */
    uint8_t hb[16];
    void *back = NULL; /* --island: the patch NEW -> OLD */
    size_t nback = 0;
    if (island && (!m_inplace || scatter)) {
        fprintf(stderr, "profile: --island needs in-place, without --scatter\n");
        return 2;
    }
    if (island && ((rc = ferry_model_hash(b, hb)) ||
                   (rc = ferry_diff(b, a, &(ferry_diff_options){.threads = threads, .base_hash = hb}, &back, &nback))))
        die("diff back", rc);
    bench_scatter sc = {0};
    if (scatter && (!m_inplace || bench_scatter_make(a, b, &sc))) {
        fprintf(stderr, "profile: --scatter needs in-place and two models of the same tensors\n");
        return 2;
    }
    double gb = (double)ferry_model_nbytes(b) / 1e9, best = 1e30, best_sc = 1e30, best_cpu = 1e30, best_sc_cpu = 1e30;
    for (int r = -warmup; r < reps; r++) { /* runs below 0: warm-up, neither timed nor profiled */
        if (island && r > -warmup &&
            (rc = ferry_apply_inplace_ex(c, back, nback, &(ferry_apply_options){.threads = threads, .base_hash = hb})))
            die("apply back", rc);
        else if (m_inplace && !island && r > -warmup) bench_model_reset(c, a); /* back to OLD */
        ferry_diff_options d = {.threads = threads, .base_hash = ha, .cast_bf16 = m_fp32};
        ferry_apply_options o = {.threads = threads, .base_hash = ha};
        void *p = NULL;
        size_t n = 0;
        ferry_model *res = NULL;
        if (r >= 0) perf_ctl(1);
        double c0 = cpu_now(), t0 = bench_now();
        if (m_diff || m_fp32) rc = ferry_diff(a, m_fp32 ? m : b, &d, &p, &n);
        else if (m_apply) rc = ferry_apply_ex(a, patch, psize, &o, &res);
        else if (m_file) rc = ferry_apply_file(a, patch, psize, &o, out);
        else rc = ferry_apply_inplace_ex(c, patch, psize, &o);
        double dt = bench_now() - t0, dc = cpu_now() - c0;
        if (r >= 0) perf_ctl(0);
        if (rc) die(mode, rc);
        ferry_free(p);
        ferry_model_free(res);
        if (r < 0) continue;
        if (dt < best) best = dt;
        if (dc < best_cpu) best_cpu = dc;
        printf("%s run %d: %.3f s, %.2f GB/s, cpu %.3f s\n", mode, r + 1, dt, gb / dt, dc);
        if (scatter) {
            bench_model_reset(c, a);
            double sc0 = cpu_now(), s0 = bench_now();
            if (bench_scatter_run(&sc, c, threads)) die("scatter", FERRY_ERR_ARG);
            double ds = bench_now() - s0, dsc = cpu_now() - sc0;
            if (ds < best_sc) best_sc = ds;
            if (dsc < best_sc_cpu) best_sc_cpu = dsc;
            printf("raw scatter run %d: %.4f s, cpu %.4f s (%llu changes); in-place / scatter %.2f, cpu %.2f\n", r + 1, ds, dsc,
                   (unsigned long long)sc.changes, dt / ds, dc / dsc);
        }
    }
    if (scatter)
        printf("raw scatter best of %d, %d thread(s): %.4f s, cpu %.4f s; best in-place / best scatter %.2f, cpu %.2f\n", reps,
               threads, best_sc, best_sc_cpu, best / best_sc, best_cpu / best_sc_cpu);
    bench_scatter_free(&sc);
    printf("%s best of %d, %d thread(s): %.3f s, %.2f GB/s of BF16 model (%.3f GB), cpu %.3f s\n", mode, reps, threads, best,
           gb / best, gb, best_cpu);
    if (m_file) unlink(out);
    ferry_free(patch);
    ferry_free(back);
    ferry_model_free(a);
    ferry_model_free(b);
    ferry_model_free(m);
    ferry_model_free(c);
    return 0;
}
