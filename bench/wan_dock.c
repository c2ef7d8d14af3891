/*
 * wan_dock — trajectories across the WAN (bench/wan_dock.sh): islands put
 * batches, the trainer takes them, through one store.
 *
 *   wan_dock put STORE RUN ISLAND COUNT BYTES INTERVAL_MS
 *       puts COUNT batches of BYTES (version 1, seqs 0..COUNT-1), one every
 *       INTERVAL_MS (0: back to back); prints "put N S" (batches, seconds)
 *   wan_dock take STORE RUN TOTAL PER_STEP TIMEOUT_S
 *       the trainer: takes PER_STEP batches per step (async, staleness 0,
 *       trainer version 1) until TOTAL are admitted or TIMEOUT_S passes;
 *       prints one JSON line: admitted, seconds, batches_per_s, put->admit
 *       latency p50/p99 (the batch's put time, same machine clock), the
 *       time each step waited in take (mean, p50, p99), and the dock's
 *       listing, get and cursor counters per admitted batch
 *
 * STORE as for ferry (file:// path or s3:// with the AWS_* environment).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "ferry_dock.h"

static uint64_t wall_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

static int die(const char *what)
{
    fprintf(stderr, "wan_dock: %s: %s\n", what, ferry_last_error());
    return 1;
}

static double pct(double *v, size_t n, double q)
{
    if (!n) return 0;
    qsort(v, n, sizeof *v, bench_cmp_double);
    return v[(size_t)((double)(n - 1) * q + 0.5)];
}

static int put(ferry_store *st, const char *run, long island, long count, long bytes, long interval_ms)
{
    ferry_dock *d;
    ferry_dock_options o = {.role = FERRY_DOCK_PRODUCER};
    if (ferry_dock_open(st, run, &o, &d)) return die("open");
    uint8_t *payload = calloc((size_t)bytes + 1, 1);
    if (!payload) return die("alloc");
    double t0 = bench_now();
    long i = 0;
    for (; i < count; i++) {
        for (long b = 0; b < bytes; b++) payload[b] = (uint8_t)(b * 31 + i + island);
        if (ferry_dock_put(d, (uint32_t)island, 1, (uint64_t)i, payload, (size_t)bytes)) {
            die("put");
            break;
        }
        if (interval_ms) {
            struct timespec ts = {interval_ms / 1000, (interval_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    printf("put %ld %.3f\n", i, bench_now() - t0);
    free(payload);
    ferry_dock_free(d);
    return i == count ? 0 : 1;
}

static int take(ferry_store *st, const char *run, long total, long per_step, long timeout_s)
{
    ferry_dock *d;
    ferry_dock_options o = {.role = FERRY_DOCK_CONSUMER, .poll_ms = 5};
    if (ferry_dock_open(st, run, &o, &d)) return die("open");
    double *lat = calloc((size_t)total + 1, sizeof *lat), *wait = calloc((size_t)total + 1, sizeof *wait);
    if (!lat || !wait) return die("alloc");
    ferry_dock_policy pol = {FERRY_DOCK_ASYNC, 0};
    size_t got = 0, steps = 0;
    double t0 = bench_now(), first = 0;
    int rc = 0;
    while ((long)got < total && bench_now() - t0 < (double)timeout_s) {
        ferry_dock_batch *b = NULL;
        size_t n = 0;
        double w0 = bench_now();
        size_t want = (size_t)(total - (long)got < per_step ? total - (long)got : per_step);
        if ((rc = ferry_dock_take(d, &pol, 1, want, 1000, &b, &n))) {
            die("take");
            break;
        }
        if (!n) continue;
        if (!got) first = w0;
        wait[steps++] = bench_now() - w0;
        uint64_t now = wall_ms();
        for (size_t i = 0; i < n && got < (size_t)total; i++) lat[got++] = (double)(now - b[i].put_time_ms) / 1000.0;
        ferry_dock_batches_free(b, n);
    }
    double secs = bench_now() - (first ? first : t0);
    ferry_dock_stats s;
    ferry_dock_get_stats(d, &s);
    double wmean = 0;
    for (size_t i = 0; i < steps; i++) wmean += wait[i];
    wmean = steps ? wmean / (double)steps : 0;
    double g = got ? (double)got : 1;
    printf("{\"admitted\": %zu, \"seconds\": %.3f, \"batches_per_s\": %.1f, \"latency_p50_s\": %.4f, \"latency_p99_s\": %.4f, "
           "\"steps\": %zu, \"wait_mean_s\": %.4f, \"wait_p50_s\": %.4f, \"wait_p99_s\": %.4f, \"lists_per_batch\": %.3f, "
           "\"gets_per_batch\": %.3f, \"cursor_writes_per_batch\": %.3f}\n",
           got, secs, (double)got / (secs > 0 ? secs : 1), pct(lat, got, 0.5), pct(lat, got, 0.99), steps, wmean,
           pct(wait, steps, 0.5), pct(wait, steps, 0.99), (double)s.lists / g, (double)s.gets / g, (double)s.cursor_writes / g);
    free(lat);
    free(wait);
    ferry_dock_free(d);
    return rc || (long)got < total ? 1 : 0;
}

int main(int argc, char **argv)
{
    long a[4] = {0};
    int is_put = argc == 8 && !strcmp(argv[1], "put"), is_take = argc == 7 && !strcmp(argv[1], "take");
    if (!is_put && !is_take) {
        fprintf(stderr, "usage: wan_dock put STORE RUN ISLAND COUNT BYTES INTERVAL_MS | take STORE RUN TOTAL PER_STEP TIMEOUT_S\n");
        return 2;
    }
    for (int i = 0; i < argc - 4; i++) a[i] = strtol(argv[4 + i], NULL, 10);
    ferry_store *st;
    ferry_store_options so = {.create = 1, .deadline_ms = 60000};
    if (ferry_store_open(argv[2], &so, &st)) return die(argv[2]);
    int rc = is_put ? put(st, argv[3], a[0], a[1], a[2], a[3]) : take(st, argv[3], a[0], a[1], a[2]);
    ferry_store_free(st);
    return rc;
}
