/*
 * dock_junk — what junk planted in RUN/traj/ costs the trainer
 * (bench/dock_junk.sh runs it; issue 23 item 10).
 *
 *   dock_junk plant STORE RUN JUNK KIND
 *       a store writer plants JUNK objects in version 1 of run RUN
 *   dock_junk take STORE RUN KIND TAKES
 *       an island puts one good batch before each of TAKES one-pass takes
 *       (async, staleness 0, trainer version 1; default max_scan, 256)
 *
 * KIND says what the junk is and how the trainer is set up:
 *   names         names under RUN/traj/v…1/ that are not batch keys;
 *                 rejected objects are quarantined (copied, then deleted)
 *   names-delete  the same, with delete_rejected (as ferry-demo runs)
 *   grace         batch keys of island 7 holding garbage, ahead of the good
 *                 batches (island 9) in key order; a 2 s grace period for
 *                 corrupt-looking objects (the s3:// default), as on a
 *                 store whose puts may be seen mid-write
 * take prints one JSON line: seconds per take (mean, first, max, last), the
 * dock's counters per take (listings, objects read, quarantined, deleted),
 * the takes that returned the good batch, and what is left in RUN/traj/.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "ferry_dock.h"

static int die(const char *what)
{
    fprintf(stderr, "dock_junk: %s: %s\n", what, ferry_last_error());
    return 1;
}

static int plant(ferry_store *st, const char *run, long junk, const char *kind)
{
    static const char garbage[] = "not a batch, but it may look like one from its name";
    char key[FERRY_STORE_KEY_MAX];
    for (long i = 0; i < junk; i++) {
        if (!strcmp(kind, "grace")) {
            if (ferry_dock_key(run, 1, 7, (uint64_t)i, key)) return die("key");
        } else {
            snprintf(key, sizeof key, "%s/traj/v%020d/junk-%08ld", run, 1, i);
        }
        if (ferry_store_put(st, key, garbage, sizeof garbage, NULL)) return die("plant");
    }
    return 0;
}

static size_t count(ferry_store *st, const char *prefix)
{
    ferry_store_listing *l = NULL;
    if (ferry_store_list(st, prefix, &l)) return (size_t)-1;
    size_t n = l->count;
    ferry_store_listing_free(l);
    return n;
}

static int take(ferry_store *st, const char *run, const char *kind, long takes)
{
    ferry_dock *p = NULL, *c = NULL;
    ferry_dock_options po = {.role = FERRY_DOCK_PRODUCER}, co = {.role = FERRY_DOCK_CONSUMER, .corrupt_grace_ms = -1};
    if (!strcmp(kind, "names-delete")) co.delete_rejected = 1;
    if (!strcmp(kind, "grace")) co.corrupt_grace_ms = 2000;
    if (ferry_dock_open(st, run, &po, &p) || ferry_dock_open(st, run, &co, &c)) return die("open");
    ferry_dock_policy pol = {FERRY_DOCK_ASYNC, 0};
    double sum = 0, first = 0, max = 0, last = 0;
    long good = 0;
    for (long t = 0; t < takes; t++) {
        char payload[64];
        int n = snprintf(payload, sizeof payload, "batch %ld", t);
        if (ferry_dock_put(p, 9, 1, (uint64_t)t, payload, (size_t)n)) return die("put");
        ferry_dock_batch *b = NULL;
        size_t got = 0;
        double t0 = bench_now();
        if (ferry_dock_take(c, &pol, 1, 1, 0, &b, &got)) return die("take");
        double dt = bench_now() - t0;
        good += (long)got;
        ferry_dock_batches_free(b, got);
        sum += dt;
        if (!t) first = dt;
        if (dt > max) max = dt;
        last = dt;
    }
    ferry_dock_stats s;
    ferry_dock_get_stats(c, &s);
    char prefix[FERRY_DOCK_KEY_MAX];
    snprintf(prefix, sizeof prefix, "%s/traj/", run);
    double k = takes ? (double)takes : 1;
    printf("{\"kind\": \"%s\", \"takes\": %ld, \"take_mean_s\": %.4f, \"take_first_s\": %.4f, \"take_max_s\": %.4f, "
           "\"take_last_s\": %.4f, \"lists_per_take\": %.2f, \"gets_per_take\": %.1f, \"quarantined_per_take\": %.1f, "
           "\"deletes_per_take\": %.1f, \"good_taken\": %ld, \"left_in_traj\": %zu}\n",
           kind, takes, sum / k, first, max, last, (double)s.lists / k, (double)s.gets / k, (double)s.quarantined / k,
           (double)s.deletes / k, good, count(st, prefix));
    ferry_dock_free(c);
    ferry_dock_free(p);
    return 0;
}

int main(int argc, char **argv)
{
    int is_plant = argc == 6 && !strcmp(argv[1], "plant"), is_take = argc == 6 && !strcmp(argv[1], "take");
    const char *kind = is_plant || is_take ? argv[is_plant ? 5 : 4] : "";
    if ((!is_plant && !is_take) || (strcmp(kind, "names") && strcmp(kind, "names-delete") && strcmp(kind, "grace"))) {
        fprintf(stderr, "usage: dock_junk plant STORE RUN JUNK KIND | take STORE RUN KIND TAKES\n"
                        "  KIND: names, names-delete or grace\n");
        return 2;
    }
    ferry_store *st;
    ferry_store_options so = {.create = 1, .deadline_ms = 60000};
    if (ferry_store_open(argv[2], &so, &st)) return die(argv[2]);
    int rc = is_plant ? plant(st, argv[3], strtol(argv[4], NULL, 10), kind) : take(st, argv[3], kind, strtol(argv[5], NULL, 10));
    ferry_store_free(st);
    return rc;
}
