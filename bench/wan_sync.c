/*
 * wan_sync — the library rows of bench/wan.sh: a trainer and islands that
 * run ferry the way a real trainer and inference engine do, one long-lived
 * process each, the model in memory (include/ferry_sync.h):
 *
 *   wan_sync publish STORE RUN OLDEST... --period S --log F --go F [--threads N]
 *       loads every checkpoint given into memory, publishes the first as
 *       version 1, prints "ready", waits for the file --go to exist, then
 *       publishes one more every S seconds; for each one logs
 *       "STEP T_START T_END" (wall clock; T_START is "optimizer step done",
 *       just before ferry_publish_ex) to --log.
 *   wan_sync island URL RUN BASE --log F --until V [--poll-ms MS]
 *                   [--deadline S] [--save F] [--threads N]
 *       holds BASE (version 1) in its own buffers as a memory-mode
 *       subscriber, writes F.ready once synced to version 1, then waits
 *       (ferry_subscriber_wait, polling HEAD every MS) and syncs in place
 *       until it holds version V; logs "STEP TIME SYNC_S" per version it
 *       reached (STEP = version - 1).  --save writes the final model (after
 *       the measurement) for the script's bit-identity check.
 *   wan_sync apply-time OLD NEW...
 *       prints "decode_s MEDIAN": ferry_apply_inplace_ex of each
 *       consecutive pair's delta into an owned copy (what an island's sync
 *       does to its buffers, target verified, base hash known), one thread.
 *   wan_sync pubtime OLD NEW DIR [--reps N] [--threads N]
 *       what the publisher costs on top of the codec: ferry_diff alone
 *       (base hash known) against ferry_publish_ex of the same change into
 *       a file:// store in DIR (NEW, OLD, NEW ... as deltas after OLD as
 *       version 1); medians of N each, and their ratio.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "ferry_sync.h"

static void die(const char *what, int rc)
{
    fprintf(stderr, "wan_sync: %s: %s (%s)\n", what, ferry_last_error(), ferry_strerror(rc));
    exit(1);
}

static double wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s)
{
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) && errno == EINTR) {}
}

/* An owned, writable copy of the checkpoint at path. */
static ferry_model *load_owned(const char *path)
{
    ferry_model *m = NULL, *c = NULL;
    int rc = ferry_model_open(path, &m);
    if (!rc) rc = bench_model_copy(m, &c);
    ferry_model_free(m);
    if (rc) die(path, rc);
    return c;
}

static ferry_store *open_store(const char *url, double deadline_s)
{
    ferry_store_options so = {.deadline_ms = (uint64_t)(deadline_s * 1000), .connect_timeout_ms = 5000};
    ferry_store *st = NULL;
    int rc = ferry_store_open(url, &so, &st);
    if (rc) die(url, rc);
    return st;
}

/* Option VALUE after argv[*i] named name, or NULL if argv[*i] is not it. */
static const char *opt(int argc, char **argv, int *i, const char *name)
{
    if (strcmp(argv[*i], name)) return NULL;
    if (*i + 1 >= argc) {
        fprintf(stderr, "wan_sync: %s needs a value\n", name);
        exit(2);
    }
    return argv[++*i];
}

static int publish_main(int argc, char **argv)
{
    const char *url = argv[2], *run = argv[3], *log = NULL, *go = NULL, *v;
    double period = 3;
    int threads = 1;
    ferry_model *steps[256];
    int n = 0;
    for (int i = 4; i < argc; i++) {
        if ((v = opt(argc, argv, &i, "--period"))) period = atof(v);
        else if ((v = opt(argc, argv, &i, "--log"))) log = v;
        else if ((v = opt(argc, argv, &i, "--go"))) go = v;
        else if ((v = opt(argc, argv, &i, "--threads"))) threads = atoi(v);
        else if (n < 256) steps[n++] = load_owned(argv[i]);
    }
    if (n < 2 || !log || !go || period <= 0) {
        fprintf(stderr, "wan_sync publish: need two checkpoints or more, --log, --go and a period > 0\n");
        return 2;
    }
    ferry_store *st = open_store(url, 60);
    ferry_publisher_options po = {.anchor_every = 1000000, .threads = threads};
    ferry_publisher *p = NULL;
    int rc = ferry_publisher_open(st, run, &po, &p);
    if (!rc) rc = ferry_publish(p, steps[0], NULL);
    if (rc) die("publishing version 1", rc);
    FILE *lf = fopen(log, "w");
    if (!lf) die(log, FERRY_ERR_IO);
    printf("ready\n");
    fflush(stdout);
    struct stat sb;
    for (int k = 0; stat(go, &sb); k++) {
        if (k > 120000) { fprintf(stderr, "wan_sync publish: no %s after 20 min\n", go); return 1; }
        sleep_s(0.01);
    }
    double next = wall();
    for (int s = 1; s < n; s++) {
        double t0 = wall();
        ferry_publish_info info;
        if ((rc = ferry_publish_ex(p, steps[s], 0, &info))) die("publish", rc);
        fprintf(lf, "%d %.6f %.6f %llu\n", s, t0, wall(), (unsigned long long)info.delta_bytes);
        fflush(lf);
        next += period;
        sleep_s(next - wall());
    }
    fclose(lf);
    ferry_publisher_free(p);
    for (int s = 0; s < n; s++) ferry_model_free(steps[s]);
    ferry_store_free(st);
    return 0;
}

static int island_main(int argc, char **argv)
{
    const char *url = argv[2], *run = argv[3], *base = argv[4], *log = NULL, *save = NULL, *v;
    uint64_t until = 0;
    unsigned poll_ms = 20;
    double deadline = 600;
    int threads = 1;
    for (int i = 5; i < argc; i++) {
        if ((v = opt(argc, argv, &i, "--log"))) log = v;
        else if ((v = opt(argc, argv, &i, "--until"))) until = strtoull(v, NULL, 10);
        else if ((v = opt(argc, argv, &i, "--poll-ms"))) poll_ms = (unsigned)atoi(v);
        else if ((v = opt(argc, argv, &i, "--deadline"))) deadline = atof(v);
        else if ((v = opt(argc, argv, &i, "--save"))) save = v;
        else if ((v = opt(argc, argv, &i, "--threads"))) threads = atoi(v);
        else { fprintf(stderr, "wan_sync island: unknown argument %s\n", argv[i]); return 2; }
    }
    if (!log || until < 2) { fprintf(stderr, "wan_sync island: need --log and --until >= 2\n"); return 2; }
    ferry_store *st = open_store(url, 60);
    ferry_model *m = load_owned(base);
    ferry_subscriber_options so = {.model = m, .model_version = 1, .threads = threads,
                                   .poll_interval_ms = poll_ms ? poll_ms : 1};
    ferry_subscriber *s = NULL;
    int rc = ferry_subscriber_open(st, run, &so, &s);
    if (!rc) rc = ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 1, NULL);
    if (rc) die("first sync", rc);
    FILE *lf = fopen(log, "w");
    char ready[4200];
    snprintf(ready, sizeof ready, "%s.ready", log);
    FILE *rf = fopen(ready, "w");
    if (!lf || !rf) die(log, FERRY_ERR_IO);
    fputs("ready\n", rf);
    fclose(rf);
    double t_end = bench_now() + deadline;
    uint64_t cur = 1;
    while (cur < until && bench_now() < t_end) {
        uint64_t head = 0;
        rc = ferry_subscriber_wait(s, cur, (uint64_t)((t_end - bench_now()) * 1000) + 1, &head);
        if (rc == FERRY_ERR_SYNC_TIMEOUT) break;
        if (rc) die("wait", rc);
        double t0 = bench_now();
        if ((rc = ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL))) die("sync", rc);
        double t1 = bench_now(), now = wall();
        cur = ferry_subscriber_version(s);
        fprintf(lf, "%llu %.6f %.6f\n", (unsigned long long)(cur - 1), now, t1 - t0);
        fflush(lf);
    }
    fclose(lf);
    if (save && (rc = ferry_model_save(m, save))) die(save, rc);
    ferry_subscriber_free(s);
    ferry_model_free(m);
    ferry_store_free(st);
    return cur >= until ? 0 : 1;
}

static int apply_time_main(int argc, char **argv)
{
    double t[256];
    int n = 0;
    for (int i = 3; i < argc && n < 256; i++) {
        ferry_model *a = load_owned(argv[i - 1]), *b = NULL;
        int rc = ferry_model_open(argv[i], &b);
        void *patch = NULL;
        size_t size = 0;
        ferry_diff_options d = {.level = 3};
        if (!rc) rc = ferry_diff(a, b, &d, &patch, &size);
        if (rc) die(argv[i], rc);
        uint8_t h[16]; /* a subscriber knows the hash of what it holds */
        if ((rc = ferry_model_hash(a, h))) die("hash", rc);
        ferry_apply_options ao = {.threads = 1, .base_hash = h};
        double t0 = bench_now();
        if ((rc = ferry_apply_inplace_ex(a, patch, size, &ao))) die("apply", rc);
        t[n++] = bench_now() - t0;
        ferry_free(patch);
        ferry_model_free(a);
        ferry_model_free(b);
    }
    printf("decode_s %.4f\n", bench_median(t, (size_t)n));
    return 0;
}

static int pubtime_main(int argc, char **argv)
{
    const char *dir = argv[4], *v;
    int reps = 5, threads = 1;
    for (int i = 5; i < argc; i++) {
        if ((v = opt(argc, argv, &i, "--reps"))) reps = atoi(v);
        else if ((v = opt(argc, argv, &i, "--threads"))) threads = atoi(v);
        else { fprintf(stderr, "wan_sync pubtime: unknown argument %s\n", argv[i]); return 2; }
    }
    if (reps < 1 || reps > 100) { fprintf(stderr, "wan_sync pubtime: --reps 1..100\n"); return 2; }
    ferry_model *m[2] = {load_owned(argv[2]), load_owned(argv[3])};
    uint8_t h[2][16];
    for (int k = 0; k < 2; k++)
        if (ferry_model_hash(m[k], h[k])) die("hash", FERRY_ERR_IO);
    ferry_store_options so = {.create = 1};
    ferry_store *st = NULL;
    int rc = ferry_store_open(dir, &so, &st);
    if (rc) die(dir, rc);
    char run[64];
    snprintf(run, sizeof run, "pubtime-%ld-%ld", (long)getpid(), (long)time(NULL));
    ferry_publisher_options po = {.anchor_every = 1000000, .threads = threads};
    ferry_publisher *p = NULL;
    if ((rc = ferry_publisher_open(st, run, &po, &p)) || (rc = ferry_publish(p, m[0], NULL))) die("publish version 1", rc);
    double td[100], tp[100];
    size_t psize = 0;
    for (int r = 0; r < reps; r++) {
        int from = r % 2, to = 1 - from;
        ferry_diff_options d = {.threads = threads, .base_hash = h[from]};
        void *patch = NULL;
        double t0 = bench_now();
        if ((rc = ferry_diff(m[from], m[to], &d, &patch, &psize))) die("diff", rc);
        td[r] = bench_now() - t0;
        ferry_free(patch);
        t0 = bench_now();
        if ((rc = ferry_publish(p, m[to], NULL))) die("publish", rc);
        tp[r] = bench_now() - t0;
        printf("rep %d: diff %.3f s, publish %.3f s\n", r + 1, td[r], tp[r]);
    }
    double md = bench_median(td, (size_t)reps), mp = bench_median(tp, (size_t)reps);
    printf("model %llu bytes, delta %zu bytes, %d reps, %d thread(s): diff %.3f s, publish %.3f s (median), publish/diff %.2f\n",
           (unsigned long long)ferry_model_nbytes(m[0]), psize, reps, threads, md, mp, mp / md);
    ferry_publisher_free(p);
    ferry_store_free(st);
    ferry_model_free(m[0]);
    ferry_model_free(m[1]);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 5 && !strcmp(argv[1], "publish")) return publish_main(argc, argv);
    if (argc >= 5 && !strcmp(argv[1], "island")) return island_main(argc, argv);
    if (argc >= 4 && !strcmp(argv[1], "apply-time")) return apply_time_main(argc, argv);
    if (argc >= 5 && !strcmp(argv[1], "pubtime")) return pubtime_main(argc, argv);
    fprintf(stderr, "usage: wan_sync publish STORE RUN CKPT... --period S --log F --go F [--threads N]\n"
                    "       wan_sync island URL RUN BASE --log F --until V [--poll-ms MS] [--deadline S] [--save F] [--threads N]\n"
                    "       wan_sync apply-time CKPT CKPT...\n"
                    "       wan_sync pubtime OLD NEW DIR [--reps N] [--threads N]\n");
    return 2;
}
