/* bench/verify: what signed versions cost a reader (docs/SECURITY.md).
 *
 *   verify BASE NEXT [--reps N] [--dir D] [--threads N]
 *
 * Publishes BASE as version 1 (an anchor) and NEXT as version 2 (a delta)
 * into two runs of a file:// store under D ($TMPDIR or /tmp): one unsigned,
 * one signed with a fresh Ed25519 key.  Then, N times each, pulls
 *   - the delta: a subscriber holding version 1 syncs to version 2;
 *   - the anchor: a subscriber holding nothing syncs to version 1;
 * from the unsigned run without keys and from the signed run with the key
 * trusted (HEAD and manifest signatures checked, the object's SHA-256
 * compared with its signed manifest).  Prints the medians, the difference
 * (the cost of verification per version) in ms and in % of the signed
 * pull, and the SHA-256 of the objects alone (OpenSSL EVP, best of N). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "bench_util.h"
#include "ferry_sign.h"
#include "ferry_sync.h"

static void die(const char *what, int rc)
{
    fprintf(stderr, "verify: %s: %s (%s)\n", what, ferry_last_error(), ferry_strerror(rc));
    exit(1);
}

static double publish_two(ferry_store *st, const char *run, const ferry_keys *k, const ferry_model *a, const ferry_model *b,
                          int threads)
{
    ferry_publisher_options o = {.keys = k, .threads = threads, .publisher_id = "bench"};
    ferry_publisher *p = NULL;
    int rc = ferry_publisher_open(st, run, &o, &p);
    double t0 = bench_now();
    if (!rc) rc = ferry_publish(p, a, NULL);
    if (!rc) rc = ferry_publish(p, b, NULL);
    if (rc) die("publish", rc);
    ferry_publisher_free(p);
    return bench_now() - t0;
}

/* Seconds of one sync to `to` (from version `from`, 0 = nothing). */
static double pull(ferry_store *st, const char *run, const ferry_keys *k, uint64_t from, uint64_t to, int threads)
{
    ferry_subscriber_options o = {.keys = k, .threads = threads, .no_compactions = 1};
    ferry_subscriber *s = NULL;
    int rc = ferry_subscriber_open(st, run, &o, &s);
    if (!rc && from) rc = ferry_subscriber_sync(s, FERRY_SYNC_EXACT, from, NULL);
    double t0 = bench_now();
    if (!rc) rc = ferry_subscriber_sync(s, FERRY_SYNC_EXACT, to, NULL);
    double t = bench_now() - t0;
    if (rc) die("pull", rc);
    if (ferry_subscriber_version(s) != to) die("pull: wrong version", 1);
    ferry_subscriber_free(s);
    return t;
}

static double sha_best(const void *d, size_t n, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        unsigned char out[32];
        double t0 = bench_now();
        EVP_Digest(d, n, out, NULL, EVP_sha256(), NULL);
        double t = bench_now() - t0;
        if (t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv)
{
    const char *basep = NULL, *nextp = NULL, *dir = getenv("TMPDIR");
    int reps = 5, threads = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!basep) basep = argv[i];
        else if (!nextp) nextp = argv[i];
        else basep = NULL, i = argc;
    }
    if (!basep || !nextp || reps < 1 || reps > 100 || threads < 1 || threads > 64) {
        fprintf(stderr, "usage: verify BASE NEXT [--reps N] [--dir D] [--threads N]\n");
        return 2;
    }
    char root[4096], url[4200], prefix[4200];
    snprintf(root, sizeof root, "%s/ferry-bench-verify.XXXXXX", dir && *dir ? dir : "/tmp");
    if (!mkdtemp(root)) die("mkdtemp", FERRY_ERR_IO);
    snprintf(url, sizeof url, "%s/store", root);
    snprintf(prefix, sizeof prefix, "%s/trainer", root);
    ferry_model *a = NULL, *b = NULL;
    int rc;
    if ((rc = ferry_model_open(basep, &a)) || (rc = ferry_model_open(nextp, &b))) die("open", rc);
    ferry_store_options so = {.create = 1, .max_object_size = (uint64_t)64 << 30};
    ferry_store *st = NULL;
    if ((rc = ferry_store_open(url, &so, &st))) die(url, rc);
    ferry_keys *sign = NULL, *trust = NULL;
    char kp[4300], pp[4300];
    snprintf(kp, sizeof kp, "%s.key", prefix);
    snprintf(pp, sizeof pp, "%s.pub", prefix);
    if ((rc = ferry_keygen(prefix, NULL)) || (rc = ferry_keys_create(&sign)) || (rc = ferry_keys_set_signer(sign, kp, NULL)) ||
        (rc = ferry_keys_create(&trust)) || (rc = ferry_keys_trust(trust, pp, -1, NULL)))
        die("keys", rc);

    double pub_plain = publish_two(st, "plain", NULL, a, b, threads);
    double pub_signed = publish_two(st, "signed", sign, a, b, threads);
    double *d0 = calloc((size_t)reps, sizeof *d0), *d1 = calloc((size_t)reps, sizeof *d1);
    double *f0 = calloc((size_t)reps, sizeof *f0), *f1 = calloc((size_t)reps, sizeof *f1);
    for (int r = 0; r < reps; r++) { /* interleaved, so drift hits both alike */
        d0[r] = pull(st, "plain", NULL, 1, 2, threads);
        d1[r] = pull(st, "signed", trust, 1, 2, threads);
        f0[r] = pull(st, "plain", NULL, 0, 1, threads);
        f1[r] = pull(st, "signed", trust, 0, 1, threads);
    }
    /* the objects' digests alone */
    ferry_run_log *log = NULL;
    if ((rc = ferry_run_log_read(st, "signed", 0, &log)) || log->count != 2) die("log", rc ? rc : 1);
    uint64_t delta_bytes = log->versions[1].delta_bytes, full_bytes = log->versions[0].full_bytes;
    char key[512];
    snprintf(key, sizeof key, "signed/v/%020d-%s.patch", 2, log->versions[1].id);
    void *delta = NULL;
    size_t dn = 0;
    if ((rc = ferry_store_get(st, key, &delta, &dn, NULL))) die(key, rc);
    snprintf(key, sizeof key, "signed/v/%020d-%s.safetensors", 1, log->versions[0].id);
    void *full = NULL;
    size_t fn = 0;
    if ((rc = ferry_store_get(st, key, &full, &fn, NULL))) die(key, rc);
    double sha_d = sha_best(delta, dn, reps), sha_f = sha_best(full, fn, reps);

    double md0 = bench_median(d0, (size_t)reps), md1 = bench_median(d1, (size_t)reps);
    double mf0 = bench_median(f0, (size_t)reps), mf1 = bench_median(f1, (size_t)reps);
    printf("model %.3f GB (%s -> %s); delta %llu bytes, anchor %llu bytes; %d reps, %d thread(s), medians\n",
           (double)ferry_model_nbytes(b) / 1e9, basep, nextp, (unsigned long long)delta_bytes, (unsigned long long)full_bytes,
           reps, threads);
    printf("%-22s %12s %12s %12s %8s %14s\n", "pull", "unsigned ms", "signed ms", "verify ms", "% pull", "SHA-256 ms");
    printf("%-22s %12.1f %12.1f %12.1f %7.1f%% %14.1f\n", "delta (v1 -> v2)", md0 * 1e3, md1 * 1e3, (md1 - md0) * 1e3,
           100.0 * (md1 - md0) / md1, sha_d * 1e3);
    printf("%-22s %12.1f %12.1f %12.1f %7.1f%% %14.1f\n", "anchor (none -> v1)", mf0 * 1e3, mf1 * 1e3, (mf1 - mf0) * 1e3,
           100.0 * (mf1 - mf0) / mf1, sha_f * 1e3);
    printf("publish v1 + v2: unsigned %.2f s, signed %.2f s\n", pub_plain, pub_signed);
    ferry_free(delta);
    ferry_free(full);
    ferry_run_log_free(log);
    free(d0), free(d1), free(f0), free(f1);
    ferry_keys_free(sign);
    ferry_keys_free(trust);
    ferry_store_free(st);
    ferry_model_free(a);
    ferry_model_free(b);
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd)) fprintf(stderr, "verify: could not remove %s\n", root);
    return 0;
}
