/*
 * bench/stream — time-to-fresh of one delta over a rate-capped link,
 * buffered (GET the whole object, then ferry_apply_inplace_ex) against
 * streamed (ferry_store_get_stream into ferry_apply_stream_*: chunks
 * decoded and written while the rest arrives).  Issue 26 item 3: streamed
 * should be close to max(transfer, apply), buffered is their sum.
 *
 *   stream BASE TARGET STORE_URL KEY [--rates MBIT,...] [--reps N] [--threads T]
 *
 * The object KEY of STORE_URL (http://, s3://, file://) must be the patch
 * BASE -> TARGET (bench/stream.sh serves it over HTTP on 127.0.0.1).  Each
 * rate (Mbit/s; 0 = no cap) is the store's max_bytes_per_s (libcurl's
 * receive cap, on loopback the link).  Per rep, in turn: the transfer
 * alone, the apply alone (from memory), buffered, streamed; the model is
 * reset to BASE between applies (not timed), the base hash vouched for as
 * a subscriber does; one untimed run of each first.  Prints medians.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "ferry_store.h"

static void die(const char *what)
{
    fprintf(stderr, "stream: %s: %s\n", what, ferry_last_error());
    exit(1);
}

typedef struct feed_ctx {
    ferry_apply_stream *st;
} feed_ctx;

static int feed(void *ctx, const void *p, size_t n) { return ferry_apply_stream_feed(((feed_ctx *)ctx)->st, p, n); }

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: stream BASE TARGET STORE_URL KEY [--rates MBIT,...] [--reps N] [--threads T]\n");
        return 2;
    }
    const char *rates = "100,1000,0";
    int reps = 3, threads = 1;
    for (int i = 5; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rates")) rates = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    }
    if (reps < 1 || reps > 50) reps = 3;
    ferry_model *a = NULL, *b = NULL, *m = NULL;
    if (ferry_model_open(argv[1], &a) || ferry_model_open(argv[2], &b)) die("open");
    if (bench_model_copy(a, &m)) die("copy");
    uint8_t ha[16], hb[16], hm[16];
    if (ferry_model_hash(a, ha) || ferry_model_hash(b, hb)) die("hash");
    ferry_apply_options ao = {.threads = threads, .base_hash = ha};
    printf("base %s (%.3f GB), delta %s, %d thread(s), median of %d\n", argv[1], (double)ferry_model_nbytes(a) / 1e9, argv[4],
           threads, reps);
    printf("%10s %10s %12s %10s %12s %12s %10s %10s\n", "Mbit/s", "MB", "transfer s", "apply s", "sum s", "buffered s",
           "streamed s", "str/max");
    for (const char *r = rates; *r;) {
        double mbit = strtod(r, NULL);
        const char *comma = strchr(r, ',');
        r = comma ? comma + 1 : r + strlen(r);
        ferry_store_options so = {.max_bytes_per_s = (uint64_t)(mbit * 1e6 / 8), .deadline_ms = 600000};
        ferry_store *s = NULL;
        if (ferry_store_open(argv[3], &so, &s)) die("store");
        double tt[50], ta[50], tb[50], ts[50];
        size_t size = 0;
        for (int k = -1; k < reps; k++) {
            /* transfer alone */
            void *d = NULL;
            double t0 = bench_now();
            if (ferry_store_get_max(s, argv[4], 0, &d, &size, NULL)) die("get");
            double t1 = bench_now();
            /* apply alone */
            bench_model_reset(m, a);
            double t2 = bench_now();
            if (ferry_apply_inplace_ex(m, d, size, &ao)) die("apply");
            double t3 = bench_now();
            ferry_free(d);
            if (ferry_model_hash(m, hm) || memcmp(hm, hb, 16)) die("buffered result");
            /* buffered: GET, then apply */
            bench_model_reset(m, a);
            double t4 = bench_now();
            if (ferry_store_get_max(s, argv[4], 0, &d, &size, NULL)) die("get");
            if (ferry_apply_inplace_ex(m, d, size, &ao)) die("apply");
            double t5 = bench_now();
            ferry_free(d);
            /* streamed */
            bench_model_reset(m, a);
            double t6 = bench_now();
            feed_ctx c = {NULL};
            if (ferry_apply_stream_begin(m, &ao, NULL, &c.st)) die("stream begin");
            int rc = ferry_store_get_stream(s, argv[4], 0, feed, &c, NULL);
            if (rc) {
                ferry_apply_stream_abort(c.st);
                die("stream");
            }
            if (ferry_apply_stream_end(c.st)) die("stream end");
            double t7 = bench_now();
            if (ferry_model_hash(m, hm) || memcmp(hm, hb, 16)) die("streamed result");
            if (k < 0) continue; /* warm-up: the undo log, scratch, connections */
            tt[k] = t1 - t0, ta[k] = t3 - t2, tb[k] = t5 - t4, ts[k] = t7 - t6;
        }
        double T = bench_median(tt, (size_t)reps), A = bench_median(ta, (size_t)reps), B = bench_median(tb, (size_t)reps),
               S = bench_median(ts, (size_t)reps);
        char rate[32];
        snprintf(rate, sizeof rate, mbit > 0 ? "%.0f" : "no cap", mbit);
        printf("%10s %10.2f %12.3f %10.3f %12.3f %12.3f %10.3f %10.2f\n", rate, (double)size / 1e6, T, A, T + A, B, S,
               S / (T > A ? T : A));
        fflush(stdout);
        ferry_store_free(s);
    }
    ferry_model_free(m);
    ferry_model_free(a);
    ferry_model_free(b);
    return 0;
}
