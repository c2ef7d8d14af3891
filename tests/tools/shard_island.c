/* One island rank of tests/scripts/shard_mpi.sh and bench/shard.sh:
 *
 *   shard_island STORE RUN LAYOUT M m N STEPDIR [TIMEOUT_S]
 *
 * holds the regions of rank m of M in LAYOUT (rows, cols, fused: see
 * shard_layout.h), follows versions 1..N of RUN (waiting for each), and
 * checks after every pull that each region is bit-identical to the slice
 * of STEPDIR/step-(v-1).safetensors and that the tile bytes it fetched are
 * at most 1/M of the version's objects + 5%.  Prints one JSON line per
 * version (bytes, share, seconds, peak RSS); exit 0 only if every version
 * passed both checks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "ferry_shard.h"
#include "shard_layout.h"

static double now_s(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

static long peak_rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kib = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return kib;
}

static ferry_model *step_model(const char *dir, uint64_t v)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/step-%03llu.safetensors", dir, (unsigned long long)(v - 1));
    ferry_model *m = NULL;
    if (ferry_model_open(path, &m)) fprintf(stderr, "shard_island: %s: %s\n", path, ferry_last_error());
    return m;
}

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: shard_island STORE RUN rows|cols|fused M m N STEPDIR [TIMEOUT_S]\n");
        return 2;
    }
    int L = shard_layout_parse(argv[3]), M = atoi(argv[4]), k = atoi(argv[5]);
    uint64_t N = strtoull(argv[6], NULL, 10), timeout_ms = (argc > 8 ? strtoull(argv[8], NULL, 10) : 120) * 1000;
    if (L < 0 || M < 1 || k < 0 || k >= M || !N) {
        fprintf(stderr, "shard_island: bad layout, M, m or N\n");
        return 2;
    }
    ferry_store *st = NULL;
    ferry_shard_subscriber *s = NULL;
    ferry_model *first = step_model(argv[7], 1);
    ferry_shard_region rg[512];
    size_t n = first ? shard_layout(first, L, k, M, rg) : 0;
    ferry_shard_sub_options so = {.poll_interval_ms = 50};
    int rc = first ? ferry_store_open(argv[1], NULL, &st) : FERRY_ERR_NOT_FOUND;
    if (!rc) rc = ferry_shard_subscriber_open(st, argv[2], rg, n, &so, &s);
    int bad = rc != 0, over = 0;
    for (uint64_t v = 1; v <= N && !bad; v++) {
        double t0 = now_s();
        ferry_shard_pull_info info;
        rc = ferry_shard_wait(s, v - 1, timeout_ms, NULL);
        double t1 = now_s();
        if (!rc) rc = ferry_shard_pull(s, FERRY_SYNC_EXACT, v, &info);
        double t2 = now_s();
        if (rc) {
            bad = 1;
            break;
        }
        ferry_model *m = step_model(argv[7], v);
        int same = m != NULL;
        for (size_t i = 0; i < n && same; i++) {
            uint64_t rows, cols, nb;
            if (ferry_shard_region_shape(s, i, NULL, &rows, &cols, &nb)) {
                same = 0;
                break;
            }
            void *buf = malloc(nb ? nb : 1);
            same = buf && !ferry_shard_region_copy(s, i, buf, nb) && shard_slice_equal(m, &rg[i], buf, rows, cols);
            if (!same) fprintf(stderr, "shard_island: version %llu: region %zu (%s) differs from the sliced checkpoint\n",
                               (unsigned long long)v, i, rg[i].name);
            free(buf);
        }
        ferry_model_free(m);
        double share = info.version_bytes ? (double)info.object_bytes / (double)info.version_bytes : 0;
        int within = share <= 1.0 / M * 1.05;
        printf("{\"layout\": \"%s\", \"M\": %d, \"rank\": %d, \"version\": %llu, \"path\": \"%s\", \"object_bytes\": %llu, "
               "\"version_bytes\": %llu, \"manifest_bytes\": %llu, \"requests\": %llu, \"share\": %.4f, \"within\": %s, "
               "\"identical\": %s, \"wait_s\": %.3f, \"pull_s\": %.3f, \"peak_rss_kib\": %ld}\n",
               argv[3], M, k, (unsigned long long)v, info.path, (unsigned long long)info.object_bytes,
               (unsigned long long)info.version_bytes, (unsigned long long)info.manifest_bytes, (unsigned long long)info.requests,
               share, within ? "true" : "false", same ? "true" : "false", t1 - t0, t2 - t1, peak_rss_kib());
        fflush(stdout);
        if (!same) bad = 1;
        if (!within) over = 1; /* reported, and the exit status says so, but the versions go on */
    }
    if (rc) fprintf(stderr, "shard_island: %s rank %d of %d: %s (%s)\n", argv[3], k, M, ferry_strerror(rc), ferry_last_error());
    ferry_shard_subscriber_free(s);
    ferry_store_free(st);
    ferry_model_free(first);
    return bad || over;
}
