/* sync_tool — helpers for the sync test scripts.
 *
 *   sync_tool gen DIR N ELEMS SEED     N BF16 checkpoints DIR/m-000.safetensors ...,
 *                                      three tensors of about ELEMS elements in all,
 *                                      moved like AdamW at an RL learning rate
 *   sync_tool hash FILE                the model hash (32 hex digits)
 *   sync_tool verify-head URL RUN      HEAD names a complete version: every object
 *                                      its manifest lists is in the store with its
 *                                      size, and the version pulled from nothing
 *                                      (anchor path) hashes as HEAD says; prints
 *                                      HEAD's version
 *   sync_tool conflict URL RUN CKPT    two publishers open on RUN; A publishes,
 *                                      then B must get FERRY_ERR_SYNC_CONFLICT
 *                                      naming A; prints B's message
 *   sync_tool race URL RUN ROUNDS KEY CKPT...
 *                                      per round: one publisher per CKPT opens
 *                                      RUN (each its own store handle), then all
 *                                      publish at once (a barrier): exactly one
 *                                      may win, every other must get
 *                                      FERRY_ERR_SYNC_CONFLICT; KEY signs (- = none);
 *                                      prints the winner's index per round
 *
 * Store options come from the environment (endpoint: $AWS_ENDPOINT_URL).
 * Exit status: 0, or the ferry error code. */
#ifdef FERRY_NO_NET
#include <stdio.h>
int main(void)
{
    puts("sync layer not built (NO_NET=1)");
    return 77;
}
#else
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ferry_sync.h"

static int fail(int rc, const char *what)
{
    fprintf(stderr, "error %d (%s): %s: %s\n", rc, ferry_strerror(rc), what, ferry_last_error());
    return rc > 0 && rc < 256 ? rc : 1;
}

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float unif(uint64_t *x) { return (float)(splitmix(x) >> 40) / (float)(1u << 24); }

static int gen(const char *dir, int n, uint64_t elems, uint64_t seed)
{
    const char *names[3] = {"blocks.0.attn.w", "blocks.0.mlp.w", "head.w"};
    uint64_t cols = 256, rows[3];
    rows[0] = elems / cols / 2 + 1;
    rows[1] = elems / cols / 3 + 1;
    rows[2] = elems / cols / 6 + 1;
    float *w[3], *drift[3];
    uint16_t *b[3];
    uint64_t rng = seed;
    for (int k = 0; k < 3; k++) {
        uint64_t m = rows[k] * cols;
        w[k] = malloc(m * 4);
        drift[k] = malloc(m * 4);
        b[k] = malloc(m * 2);
        for (uint64_t i = 0; i < m; i++) {
            w[k][i] = (unif(&rng) - 0.5f) * 0.08f;
            drift[k][i] = (unif(&rng) - 0.5f) * 1e-5f;
        }
    }
    mkdir(dir, 0755);
    int rc = 0;
    for (int s = 0; s < n && !rc; s++) {
        ferry_model *m = NULL;
        ferry_model_create(&m);
        for (int k = 0; k < 3; k++) {
            uint64_t cnt = rows[k] * cols;
            if (s)
                for (uint64_t i = 0; i < cnt; i++) w[k][i] += drift[k][i] + (unif(&rng) - 0.5f) * 2e-5f;
            ferry_f32_to_bf16_n(b[k], w[k], cnt);
            uint64_t shape[2] = {rows[k], cols};
            ferry_model_add(m, names[k], FERRY_BF16, 2, shape, b[k], cnt * 2, FERRY_ADD_COPY);
        }
        char path[4200];
        snprintf(path, sizeof path, "%s/m-%03d.safetensors", dir, s);
        rc = ferry_model_save(m, path);
        ferry_model_free(m);
        if (rc) rc = fail(rc, path);
    }
    for (int k = 0; k < 3; k++) free(w[k]), free(drift[k]), free(b[k]);
    return rc;
}

static int hash(const char *path)
{
    ferry_model *m = NULL;
    uint8_t h[16];
    int rc = ferry_model_open(path, &m);
    if (!rc) rc = ferry_model_hash(m, h);
    ferry_model_free(m);
    if (rc) return fail(rc, path);
    for (int i = 0; i < 16; i++) printf("%02x", h[i]);
    printf("\n");
    return 0;
}

static int open_store(const char *url, ferry_store **st)
{
    ferry_store_options o = {.deadline_ms = 30000, .retry_base_ms = 50};
    int rc = ferry_store_open(url, &o, st);
    return rc ? fail(rc, url) : 0;
}

static int verify_head(const char *url, const char *run)
{
    ferry_store *st = NULL;
    int rc = open_store(url, &st);
    if (rc) return rc;
    ferry_run_log *log = NULL;
    if ((rc = ferry_run_log_read(st, run, 1, &log))) {
        ferry_store_free(st);
        return fail(rc, "log");
    }
    const ferry_version_info *v = &log->versions[0];
    const char *ext[3] = {"json", "patch", "safetensors"};
    uint64_t want[3] = {0, v->delta_bytes, v->full_bytes};
    for (int i = 0; i < 3 && !rc; i++) {
        if (i && !want[i]) continue;
        char key[512];
        snprintf(key, sizeof key, "%s/v/%020" PRIu64 "-%s.%s", run, v->version, v->id, ext[i]);
        ferry_store_stat ss;
        if ((rc = ferry_store_head(st, key, &ss))) rc = fail(rc, key);
        else if (i && ss.size != want[i]) {
            fprintf(stderr, "%s: %" PRIu64 " bytes, manifest says %" PRIu64 "\n", key, ss.size, want[i]);
            rc = 1;
        }
    }
    ferry_subscriber *sub = NULL;
    ferry_subscriber_options so = {.no_compactions = 1};
    uint8_t h[16];
    if (!rc) {
        rc = ferry_subscriber_open(st, run, &so, &sub);
        if (!rc) rc = ferry_subscriber_sync(sub, FERRY_SYNC_EXACT, v->version, NULL);
        if (!rc) rc = ferry_subscriber_hash(sub, h);
        if (rc) rc = fail(rc, "pull of HEAD's version");
        else if (memcmp(h, v->model_hash, 16)) {
            fprintf(stderr, "version %" PRIu64 ": pulled model does not hash as HEAD says\n", v->version);
            rc = 1;
        }
    }
    if (!rc) printf("%" PRIu64 "\n", v->version);
    ferry_subscriber_free(sub);
    ferry_run_log_free(log);
    ferry_store_free(st);
    return rc;
}

static int conflict(const char *url, const char *run, const char *ckpt)
{
    ferry_store *st = NULL;
    int rc = open_store(url, &st);
    if (rc) return rc;
    ferry_model *m = NULL;
    ferry_publisher *a = NULL, *b = NULL;
    ferry_publisher_options oa = {.publisher_id = "publisher-A"}, ob = {.publisher_id = "publisher-B"};
    if ((rc = ferry_model_open(ckpt, &m)) || (rc = ferry_publisher_open(st, run, &oa, &a)) || (rc = ferry_publisher_open(st, run, &ob, &b))) {
        rc = fail(rc, "open");
    } else if ((rc = ferry_publish(a, m, NULL))) {
        rc = fail(rc, "publish A");
    } else {
        rc = ferry_publish(b, m, NULL);
        printf("%s\n", ferry_last_error());
        if (rc != FERRY_ERR_SYNC_CONFLICT || !strstr(ferry_last_error(), "publisher-A")) {
            fprintf(stderr, "publisher B: %d, want a conflict naming publisher-A\n", rc);
            rc = 1;
        } else {
            rc = 0;
        }
    }
    ferry_publisher_free(a);
    ferry_publisher_free(b);
    ferry_model_free(m);
    ferry_store_free(st);
    return rc;
}

/* ---- racing publishers ---- */

typedef struct racer {
    ferry_store *st;
    ferry_publisher *pub;
    ferry_model *m;
    pthread_barrier_t *go;
    int rc;
    char msg[256];
} racer;

static void *race_one(void *arg)
{
    racer *r = arg;
    pthread_barrier_wait(r->go);
    r->rc = ferry_publish(r->pub, r->m, NULL);
    snprintf(r->msg, sizeof r->msg, "%s", ferry_last_error());
    return NULL;
}

static int race(const char *url, const char *run, int rounds, const char *key, int n, char **ckpts)
{
    ferry_keys *keys = NULL;
    int rc = 0;
    if (strcmp(key, "-") && ((rc = ferry_keys_create(&keys)) || (rc = ferry_keys_set_signer(keys, key, NULL))))
        return fail(rc, key);
    racer *r = calloc((size_t)n, sizeof *r);
    pthread_t *t = calloc((size_t)n, sizeof *t);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, (unsigned)n);
    for (int i = 0; i < n && !rc; i++) {
        r[i].go = &go;
        if ((rc = open_store(url, &r[i].st))) break;
        if ((rc = ferry_model_open(ckpts[i], &r[i].m))) rc = fail(rc, ckpts[i]);
    }
    for (int round = 1; round <= rounds && !rc; round++) {
        for (int i = 0; i < n && !rc; i++) {
            char id[32];
            snprintf(id, sizeof id, "racer-%d", i);
            ferry_publisher_options o = {.publisher_id = id, .keys = keys};
            if ((rc = ferry_publisher_open(r[i].st, run, &o, &r[i].pub))) rc = fail(rc, "open");
        }
        for (int i = 0; i < n && !rc; i++) pthread_create(&t[i], NULL, race_one, &r[i]);
        int wins = 0, winner = -1;
        for (int i = 0; i < n && !rc; i++) {
            pthread_join(t[i], NULL);
            if (!r[i].rc) wins++, winner = i;
            else if (r[i].rc != FERRY_ERR_SYNC_CONFLICT) {
                fprintf(stderr, "round %d, racer %d: %d (%s), want 0 or a conflict\n", round, i, r[i].rc, r[i].msg);
                rc = 1;
            }
        }
        if (!rc && wins != 1) {
            fprintf(stderr, "round %d: %d winners\n", round, wins);
            rc = 1;
        }
        if (!rc) printf("%d\n", winner);
        for (int i = 0; i < n; i++) {
            ferry_publisher_free(r[i].pub);
            r[i].pub = NULL;
        }
    }
    for (int i = 0; i < n; i++) {
        ferry_model_free(r[i].m);
        ferry_store_free(r[i].st);
    }
    pthread_barrier_destroy(&go);
    free(r);
    free(t);
    ferry_keys_free(keys);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc >= 7 && !strcmp(argv[1], "race")) return race(argv[2], argv[3], atoi(argv[4]), argv[5], argc - 6, argv + 6);
    if (argc == 6 && !strcmp(argv[1], "gen")) return gen(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 10), strtoull(argv[5], NULL, 10));
    if (argc == 3 && !strcmp(argv[1], "hash")) return hash(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "verify-head")) return verify_head(argv[2], argv[3]);
    if (argc == 5 && !strcmp(argv[1], "conflict")) return conflict(argv[2], argv[3], argv[4]);
    fprintf(stderr, "usage: sync_tool gen DIR N ELEMS SEED | hash FILE | verify-head URL RUN | conflict URL RUN CKPT | race URL RUN ROUNDS KEY CKPT...\n");
    return 2;
}
#endif
