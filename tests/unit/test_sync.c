/* The sync protocol on file:// stores: publish sequences (built in code from
 * FP32 masters moved like AdamW at an RL learning rate, and the rl-a step
 * files), pull latest / exact / min from nothing and from every version,
 * anchors every K, HEAD never backwards, a second publisher, compaction as a
 * shortcut, retention GC, corrupted objects, bytes fetched when far behind,
 * file / memory / private modes, waiting. */
#ifdef FERRY_NO_NET /* a core-only build (make NO_NET=1) has no sync layer */
#include <stdio.h>
int main(void)
{
    puts("sync layer not built (NO_NET=1)");
    puts("0 passed, 0 failed, 1 skipped");
    return 0;
}
#else
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "ferry_sync.h"

/* ---- fixtures ---------------------------------------------------------- */

#include "sync_fixture.h"

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float unif(uint64_t *x) { return (float)(splitmix(x) >> 40) / (float)(1u << 24); }

/* FP32 masters of three tensors, moved each step by a per-weight drift and
 * noise of about the learning rate: a few percent of the BF16 weights
 * change per step, and changes partly cancel over many steps (which is
 * what makes a compacted delta smaller than the chain it replaces). */
#define NT 3
static const char *const k_names[NT] = {"layers.0.w", "layers.1.w", "norm.b"};
static const uint64_t k_shape[NT][2] = {{192, 512}, {128, 256}, {1, 512}};

typedef struct trainer {
    float *w[NT], *drift[NT];
    uint64_t n[NT];
    uint64_t rng;
    float lr;
} trainer;

static void tr_init(trainer *t, uint64_t seed, float lr)
{
    memset(t, 0, sizeof *t);
    t->rng = seed;
    t->lr = lr;
    for (int k = 0; k < NT; k++) {
        t->n[k] = k_shape[k][0] * k_shape[k][1];
        t->w[k] = malloc(t->n[k] * sizeof(float));
        t->drift[k] = malloc(t->n[k] * sizeof(float));
        for (uint64_t i = 0; i < t->n[k]; i++) {
            t->w[k][i] = (unif(&t->rng) - 0.5f) * 0.08f;
            t->drift[k][i] = (unif(&t->rng) - 0.5f) * lr;
        }
    }
}

static void tr_step(trainer *t)
{
    for (int k = 0; k < NT; k++)
        for (uint64_t i = 0; i < t->n[k]; i++) t->w[k][i] += t->drift[k][i] + (unif(&t->rng) - 0.5f) * 2.0f * t->lr;
}

static void tr_free(trainer *t)
{
    for (int k = 0; k < NT; k++) {
        free(t->w[k]);
        free(t->drift[k]);
    }
}

/* The BF16 model of the current masters (owned), or the FP32 masters. */
static ferry_model *tr_model(const trainer *t, int fp32)
{
    ferry_model *m = NULL;
    ferry_model_create(&m);
    for (int k = 0; k < NT; k++) {
        uint32_t nd = k_shape[k][0] == 1 ? 1 : 2;
        const uint64_t *shape = nd == 1 ? &k_shape[k][1] : k_shape[k];
        if (fp32) {
            ferry_model_add(m, k_names[k], FERRY_F32, nd, shape, t->w[k], t->n[k] * 4, FERRY_ADD_COPY);
        } else {
            uint16_t *b = malloc(t->n[k] * 2);
            ferry_f32_to_bf16_n(b, t->w[k], t->n[k]);
            ferry_model_add(m, k_names[k], FERRY_BF16, nd, shape, b, t->n[k] * 2, FERRY_ADD_COPY);
            free(b);
        }
    }
    ferry_model_set_metadata(m, "format", "pt");
    return m;
}

static void model_hash(const ferry_model *m, uint8_t h[16])
{
    if (ferry_model_hash(m, h)) memset(h, 0, 16);
}

/* Publishes n versions with pub, recording each version's model hash in
 * hashes[version] (the trainer steps before every version but the first
 * of a fresh run). */
static int publish_n(ferry_publisher *pub, trainer *t, int n, uint8_t (*hashes)[16])
{
    for (int i = 0; i < n; i++) {
        if (ferry_publisher_version(pub)) tr_step(t);
        ferry_model *m = tr_model(t, 0);
        ferry_publish_info info;
        int rc = ferry_publish_ex(pub, m, 0, &info);
        if (!rc && hashes) model_hash(m, hashes[info.version]);
        ferry_model_free(m);
        if (rc) {
            fprintf(stderr, "publish: %s\n", ferry_last_error());
            return rc;
        }
    }
    return 0;
}

static bool sub_has(ferry_subscriber *s, const uint8_t want[16])
{
    uint8_t h[16];
    if (ferry_subscriber_hash(s, h)) return false;
    const ferry_model *m = ferry_subscriber_model(s);
    uint8_t mh[16];
    model_hash(m, mh);
    return !memcmp(h, want, 16) && !memcmp(mh, want, 16);
}

static ferry_subscriber *private_sub(ferry_store *st, const char *run)
{
    ferry_subscriber *s = NULL;
    if (ferry_subscriber_open(st, run, NULL, &s)) fprintf(stderr, "sub: %s\n", ferry_last_error());
    return s;
}

/* Key of a version's object, through the run log. */
static bool version_key(ferry_store *st, const char *run, uint64_t v, const char *ext, char out[512])
{
    ferry_run_log *log = NULL;
    if (ferry_run_log_read(st, run, 0, &log)) return false;
    bool ok = false;
    for (size_t i = 0; i < log->count; i++)
        if (log->versions[i].version == v) {
            snprintf(out, 512, "%s/v/%020" PRIu64 "-%s.%s", run, v, log->versions[i].id, ext);
            ok = true;
        }
    ferry_run_log_free(log);
    return ok;
}

static bool file_exists(const char *p)
{
    struct stat sb;
    return !stat(p, &sb);
}

static long file_size(const char *p)
{
    struct stat sb;
    return stat(p, &sb) ? -1 : (long)sb.st_size;
}

static void flip_byte(const char *path, long off)
{
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static void copy_file(const char *from, const char *to)
{
    void *d;
    size_t n;
    if (ferry_file_read(from, (size_t)1 << 30, &d, &n)) return;
    ferry_file_write(to, d, n);
    ferry_free(d);
}

/* ---- publish and pull -------------------------------------------------- */

static void test_publish_pull_targets(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    trainer t;
    tr_init(&t, 1, 2e-5f);
    ferry_publisher *pub = NULL;
    ferry_publisher_options po = {.anchor_every = 5, .publisher_id = "trainer-0", .verify = 1};
    CHECK_OK(ferry_publisher_open(st, "runs/a", &po, &pub));
    CHECK(ferry_publisher_version(pub) == 0);
    uint8_t h[16][16];
    /* kinds: anchors at 1, 6, 11 */
    for (int i = 0; i < 12; i++) {
        if (i) tr_step(&t);
        ferry_model *m = tr_model(&t, 0);
        ferry_publish_info info;
        CHECK_OK(ferry_publish_ex(pub, m, 0, &info));
        model_hash(m, h[info.version]);
        CHECK(info.version == (uint64_t)i + 1);
        CHECK(!memcmp(info.model_hash, h[info.version], 16));
        CHECK(info.kind == (i % 5 == 0 ? FERRY_SYNC_ANCHOR : FERRY_SYNC_DELTA));
        CHECK((info.full_bytes > 0) == (info.kind == FERRY_SYNC_ANCHOR));
        CHECK((info.delta_bytes > 0) == (i > 0));
        ferry_model_free(m);
    }
    ferry_run_log *log = NULL;
    CHECK_OK(ferry_run_log_read(st, "runs/a", 0, &log));
    CHECK(log && log->head == 12 && log->count == 12 && !strcmp(log->head_publisher, "trainer-0"));
    for (size_t i = 0; log && i < log->count; i++) {
        const ferry_version_info *v = &log->versions[i];
        CHECK(v->version == i + 1 && v->base_version == i && !memcmp(v->model_hash, h[i + 1], 16));
        CHECK(v->anchor_version == (i / 5) * 5 + 1);
    }
    ferry_run_log_free(log);

    /* From nothing: latest, exact, min. */
    ferry_subscriber *s = private_sub(st, "runs/a");
    ferry_sync_info info;
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 13, &info), FERRY_ERR_SYNC_NOT_YET);
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_MIN, 13, &info), FERRY_ERR_SYNC_NOT_YET);
    CHECK(ferry_subscriber_version(s) == 0 && !ferry_subscriber_model(s));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
    CHECK(info.to_version == 12 && sub_has(s, h[12]) && strstr(info.path, "anchor 11"));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 7, &info));
    CHECK(ferry_subscriber_version(s) == 7 && sub_has(s, h[7]) && strstr(info.path, "anchor 6"));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_MIN, 3, &info)); /* already past it: nothing read */
    CHECK(ferry_subscriber_version(s) == 7 && info.bytes_fetched == 0);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_MIN, 9, &info));
    CHECK(ferry_subscriber_version(s) == 12 && sub_has(s, h[12]) && !strcmp(info.path, "chain 7..12"));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info)); /* at HEAD: one read of HEAD */
    CHECK(info.steps == 0 && info.bytes_fetched < 4096); /* HEAD carries its manifest's record */
    ferry_subscriber_free(s);

    /* From every version to the latest, and to every later version. */
    for (uint64_t v = 1; v <= 12; v++) {
        s = private_sub(st, "runs/a");
        CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, v, NULL));
        CHECK(sub_has(s, h[v]));
        for (uint64_t w = v + 1; w <= 12; w += 4) {
            CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, w, &info));
            CHECK(sub_has(s, h[w]));
        }
        CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
        CHECK(sub_has(s, h[12]));
        ferry_subscriber_free(s);
    }
    ferry_publisher_free(pub);
    ferry_store_free(st);
    tr_free(&t);
}

/* The rl-a checkpoints as a run, pulled in file mode. */
static void test_rl_steps_file_mode(void)
{
    SKIP_UNLESS_DATA("rl-a");
    char dir[512], p[512];
    ferry_store *st = fixture_store(dir);
    ferry_publisher *pub = NULL;
    ferry_publisher_options po = {.anchor_every = 4};
    CHECK_OK(ferry_publisher_open(st, "rl-a", &po, &pub));
    uint8_t h[10][16];
    int n = 0;
    for (int i = 0; i < 9; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "rl-a/step-%03d.safetensors", i);
        ferry_model *m = NULL;
        if (ferry_model_open(data_path(p, sizeof p, rel), &m)) break;
        uint64_t v;
        CHECK_OK(ferry_publish(pub, m, &v));
        model_hash(m, h[v]);
        ferry_model_free(m);
        n = (int)v;
    }
    CHECK(n >= 2); /* the data is there (SKIP above): all its steps publish */
    if (n < 2) {
        ferry_publisher_free(pub);
        ferry_store_free(st);
        return;
    }
    char path[600], state[700];
    snprintf(path, sizeof path, "%s/local/policy.safetensors", g_root);
    snprintf(state, sizeof state, "%s.ferry.json", path);
    mkdir(g_root, 0755);
    char ldir[600];
    snprintf(ldir, sizeof ldir, "%s/local", g_root);
    mkdir(ldir, 0755);
    ferry_subscriber_options so = {.path = path};
    ferry_subscriber *s = NULL;
    CHECK_OK(ferry_subscriber_open(st, "rl-a", &so, &s));
    CHECK(ferry_subscriber_version(s) == 0);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 3, NULL));
    CHECK(sub_has(s, h[3]) && file_exists(path) && file_exists(state));
    ferry_subscriber_free(s);
    /* reopened: the file and its state say version 3 */
    CHECK_OK(ferry_subscriber_open(st, "rl-a", &so, &s));
    CHECK(ferry_subscriber_version(s) == 3 && sub_has(s, h[3]));
    ferry_sync_info info;
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
    CHECK(ferry_subscriber_version(s) == (uint64_t)n && sub_has(s, h[n]));
    ferry_model *mine = NULL, *want = NULL;
    char rel[64];
    snprintf(rel, sizeof rel, "rl-a/step-%03d.safetensors", n - 1);
    CHECK_OK(ferry_model_open(path, &mine));
    CHECK_OK(ferry_model_open(data_path(p, sizeof p, rel), &want));
    ferry_stats stt;
    if (mine && want && !ferry_stats_compute(want, mine, &stt)) {
        CHECK(stt.changed == 0 && stt.nelem == ferry_model_nbytes(want) / 2);
        ferry_stats_release(&stt);
    }
    ferry_model_free(mine);
    ferry_model_free(want);
    ferry_subscriber_free(s);
    /* nothing staged is left beside the checkpoint */
    DIR *d = opendir(ldir);
    int files = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') files++;
    if (d) closedir(d);
    CHECK(files == 2);
    /* a checkpoint that matches no recorded state holds no version */
    copy_file(data_path(p, sizeof p, "rl-a/step-000.safetensors"), path);
    CHECK_OK(ferry_subscriber_open(st, "rl-a", &so, &s));
    CHECK(ferry_subscriber_version(s) == 0);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(sub_has(s, h[n]));
    ferry_subscriber_free(s);
    ferry_publisher_free(pub);
    ferry_store_free(st);
}

/* ---- memory mode ------------------------------------------------------- */

typedef struct caller_model {
    uint16_t *buf[NT];
    ferry_model *m;
} caller_model;

static void caller_init(caller_model *c, int drop_one)
{
    memset(c, 0, sizeof *c);
    ferry_model_create(&c->m);
    for (int k = 0; k < NT - drop_one; k++) {
        uint64_t n = k_shape[k][0] * k_shape[k][1];
        c->buf[k] = calloc(n, 2);
        uint32_t nd = k_shape[k][0] == 1 ? 1 : 2;
        ferry_model_add(c->m, k_names[k], FERRY_BF16, nd, nd == 1 ? &k_shape[k][1] : k_shape[k], c->buf[k], n * 2, FERRY_ADD_BORROW);
    }
    ferry_model_set_metadata(c->m, "format", "pt");
}

static void caller_free(caller_model *c)
{
    ferry_model_free(c->m);
    for (int k = 0; k < NT; k++) free(c->buf[k]);
}

static void test_memory_mode(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    trainer t;
    tr_init(&t, 2, 2e-5f);
    ferry_publisher *pub = NULL;
    ferry_publisher_options po = {.anchor_every = 4};
    CHECK_OK(ferry_publisher_open(st, "mem", &po, &pub));
    uint8_t h[16][16];
    CHECK_OK(publish_n(pub, &t, 6, h));

    caller_model c;
    caller_init(&c, 0);
    void *ptr0 = c.buf[0];
    ferry_subscriber_options so = {.model = c.m};
    ferry_subscriber *s = NULL;
    CHECK_OK(ferry_subscriber_open(st, "mem", &so, &s));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 2, NULL));
    uint8_t mh[16];
    model_hash(c.m, mh);
    CHECK(ferry_subscriber_version(s) == 2 && !memcmp(mh, h[2], 16));
    CHECK(ferry_subscriber_model(s) == c.m && ferry_model_tensor(c.m, 0)->data == ptr0);
    ferry_sync_info info;
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
    model_hash(c.m, mh);
    CHECK(ferry_subscriber_version(s) == 6 && !memcmp(mh, h[6], 16) && ferry_model_tensor(c.m, 0)->data == ptr0);
    /* one more version, in place */
    CHECK_OK(publish_n(pub, &t, 1, h));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
    model_hash(c.m, mh);
    CHECK(!strcmp(info.path, "chain 6..7") && !memcmp(mh, h[7], 16));
    ferry_subscriber_free(s);

    /* a caller whose buffers already hold version 7 says so: deltas only */
    CHECK_OK(publish_n(pub, &t, 2, h));
    ferry_subscriber_options so2 = {.model = c.m, .model_version = 7};
    CHECK_OK(ferry_subscriber_open(st, "mem", &so2, &s));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
    model_hash(c.m, mh);
    CHECK(!strcmp(info.path, "chain 7..9") && !memcmp(mh, h[9], 16));
    ferry_subscriber_free(s);
    /* ... and a wrong claim is not believed */
    ferry_subscriber_options so3 = {.model = c.m, .model_version = 4};
    CHECK_OK(ferry_subscriber_open(st, "mem", &so3, &s));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
    CHECK(info.from_version == 0 && strstr(info.path, "anchor"));
    ferry_subscriber_free(s);

    /* a caller model of another structure: refused, buffers untouched */
    caller_model small;
    caller_init(&small, 1);
    memset(small.buf[0], 0x5a, k_shape[0][0] * k_shape[0][1] * 2);
    ferry_subscriber_options so4 = {.model = small.m};
    CHECK_OK(ferry_subscriber_open(st, "mem", &so4, &s));
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_SHAPE);
    CHECK(ferry_subscriber_version(s) == 0 && small.buf[0][0] == 0x5a5a && small.buf[0][1000] == 0x5a5a);
    ferry_subscriber_free(s);
    caller_free(&small);

    /* a read-only tensor is refused at open */
    ferry_model *ro = tr_model(&t, 0);
    char tmpf[600];
    snprintf(tmpf, sizeof tmpf, "%s/ro.safetensors", g_root);
    ferry_model_save(ro, tmpf);
    ferry_model_free(ro);
    ferry_model_open(tmpf, &ro);
    ferry_subscriber_options so5 = {.model = ro};
    CHECK_RC(ferry_subscriber_open(st, "mem", &so5, &s), FERRY_ERR_ARG);
    ferry_model_free(ro);

    caller_free(&c);
    ferry_publisher_free(pub);
    ferry_store_free(st);
    tr_free(&t);
}

/* FP32 masters published directly: subscribers get the BF16 cast. */
static void test_cast_masters(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    trainer t;
    tr_init(&t, 3, 2e-5f);
    ferry_publisher *pub = NULL;
    ferry_publisher_options po = {.anchor_every = 3, .cast_bf16 = 1, .verify = 1};
    CHECK_OK(ferry_publisher_open(st, "cast", &po, &pub));
    ferry_subscriber *s = private_sub(st, "cast");
    for (int i = 0; i < 5; i++) {
        if (i) tr_step(&t);
        ferry_model *fp = tr_model(&t, 1), *bf = tr_model(&t, 0);
        uint8_t want[16];
        model_hash(bf, want);
        ferry_publish_info info;
        CHECK_OK(ferry_publish_ex(pub, fp, 0, &info));
        CHECK(!memcmp(info.model_hash, want, 16) && info.model_bytes == ferry_model_nbytes(bf));
        CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
        CHECK(sub_has(s, want));
        ferry_model_free(fp);
        ferry_model_free(bf);
    }
    ferry_subscriber_free(s);
    ferry_publisher_free(pub);
    ferry_store_free(st);
    tr_free(&t);
}

/* ---- publishers -------------------------------------------------------- */

static void test_anchor_rule_and_resume(void)
{
    char dir[512], cache[600];
    ferry_store *st = fixture_store(dir);
    snprintf(cache, sizeof cache, "%s/pub-cache.safetensors", g_root);
    trainer t;
    tr_init(&t, 4, 2e-5f);
    ferry_publisher *pub = NULL;
    ferry_publisher_options po = {.anchor_every = 3, .cache_path = cache};
    CHECK_OK(ferry_publisher_open(st, "resume", &po, &pub));
    uint8_t h[32][16];
    CHECK_OK(publish_n(pub, &t, 4, h)); /* anchors 1, 4 */
    tr_step(&t);
    ferry_model *m = tr_model(&t, 0);
    ferry_publish_info info;
    CHECK_OK(ferry_publish_ex(pub, m, FERRY_PUBLISH_ANCHOR, &info)); /* forced: 5 */
    CHECK(info.version == 5 && info.kind == FERRY_SYNC_ANCHOR);
    model_hash(m, h[5]);
    ferry_model_free(m);
    ferry_publisher_free(pub);
    CHECK(file_exists(cache));

    /* a restart resumes after HEAD (from its cache, or from the store) with
     * another K: the counter never resets and the next delta applies */
    ferry_publisher_options po2 = {.anchor_every = 2};
    CHECK_OK(ferry_publisher_open(st, "resume", &po2, &pub));
    CHECK(ferry_publisher_version(pub) == 5);
    CHECK_OK(publish_n(pub, &t, 3, h)); /* 6 delta, 7 anchor, 8 delta */
    ferry_publisher_free(pub);
    CHECK_OK(ferry_publisher_open(st, "resume", &po, &pub)); /* the cache is stale: refreshed */
    CHECK(ferry_publisher_version(pub) == 8);
    CHECK_OK(publish_n(pub, &t, 1, h));
    ferry_publisher_free(pub);
    ferry_run_log *log = NULL;
    CHECK_OK(ferry_run_log_read(st, "resume", 0, &log));
    const char *want = "AddAAdAdd";
    for (size_t i = 0; log && i < log->count; i++) CHECK((log->versions[i].kind == FERRY_SYNC_ANCHOR) == (want[i] == 'A'));
    CHECK(log && log->count == 9);
    ferry_run_log_free(log);
    ferry_subscriber *s = private_sub(st, "resume");
    for (uint64_t v = 1; v <= 9; v++) {
        CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, v, NULL));
        CHECK(sub_has(s, h[v]));
    }
    ferry_subscriber_free(s);
    ferry_store_free(st);
    tr_free(&t);
}

static void test_second_publisher_conflict(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    trainer t;
    tr_init(&t, 5, 2e-5f);
    ferry_publisher *a = NULL, *b = NULL;
    ferry_publisher_options pa = {.publisher_id = "trainer-a"}, pb = {.publisher_id = "trainer-b"};
    CHECK_OK(ferry_publisher_open(st, "c", &pa, &a));
    CHECK_OK(publish_n(a, &t, 2, NULL));
    CHECK_OK(ferry_publisher_open(st, "c", &pb, &b));
    CHECK(ferry_publisher_version(b) == 2);
    CHECK_OK(publish_n(b, &t, 1, NULL));
    ferry_store_listing *before = NULL, *after = NULL;
    ferry_store_list(st, "c/", &before);
    ferry_model *m = tr_model(&t, 0);
    CHECK_RC(ferry_publish(a, m, NULL), FERRY_ERR_SYNC_CONFLICT);
    CHECK(strstr(ferry_last_error(), "trainer-b") && strstr(ferry_last_error(), "version 3"));
    CHECK_RC(ferry_publish(a, m, NULL), FERRY_ERR_SYNC_CONFLICT); /* fenced */
    ferry_store_list(st, "c/", &after);
    CHECK(before && after && before->count == after->count); /* refused before any upload */
    ferry_store_listing_free(before);
    ferry_store_listing_free(after);
    uint64_t v = 0;
    CHECK_OK(ferry_publish(b, m, &v));
    CHECK(v == 4);
    ferry_model_free(m);

    /* HEAD never goes backwards: a HEAD put back by hand is refused by
     * subscribers that saw a later one, and by the publisher */
    ferry_subscriber *s = private_sub(st, "c");
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(ferry_subscriber_version(s) == 4);
    void *head4;
    size_t n4;
    CHECK_OK(ferry_store_get(st, "c/HEAD", &head4, &n4, NULL));
    ferry_publisher *c = NULL;
    /* an old HEAD: reopen b's view of version 2 by publishing nothing;
     * build it from the manifest key of version 2 instead */
    char k2[512];
    CHECK(version_key(st, "c", 2, "json", k2));
    char hb[1400];
    ferry_run_log *log = NULL;
    ferry_run_log_read(st, "c", 0, &log);
    char hx[33];
    for (int i = 0; i < 16; i++) snprintf(hx + 2 * i, 3, "%02x", log->versions[1].model_hash[i]);
    snprintf(hb, sizeof hb,
             "{\"format\":\"ferry-head-1\",\"run\":\"c\",\"version\":2,\"id\":\"%s\",\"kind\":\"delta\",\"manifest\":\"%s\","
             "\"model_hash\":\"%s\",\"publisher\":\"rogue\",\"time_unix\":1,\"time\":\"x\"}",
             log->versions[1].id, k2, hx);
    ferry_run_log_free(log);
    CHECK_OK(ferry_store_put(st, "c/HEAD", hb, strlen(hb), NULL));
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_BACKWARDS);
    CHECK(strstr(ferry_last_error(), "below version 4"));
    CHECK(ferry_subscriber_version(s) == 4);
    m = tr_model(&t, 0);
    CHECK_RC(ferry_publish(b, m, NULL), FERRY_ERR_SYNC_CONFLICT);
    ferry_model_free(m);
    CHECK_OK(ferry_store_put(st, "c/HEAD", head4, n4, NULL));
    ferry_free(head4);
    CHECK_OK(ferry_publisher_open(st, "c", NULL, &c));
    CHECK(ferry_publisher_version(c) == 4);
    ferry_publisher_free(c);
    ferry_subscriber_free(s);
    ferry_publisher_free(a);
    ferry_publisher_free(b);
    ferry_store_free(st);
    tr_free(&t);
}

/* ---- compaction and far-behind subscribers ---------------------------- */

/* Bytes of the cheapest path from `from` (0 = none) to `to` that goes
 * through an anchor or through one compacted delta, from the run log. */
static uint64_t best_alternative(ferry_store *st, const char *run, uint64_t from, uint64_t to, uint64_t *anchor_path,
                                 uint64_t *comp_path)
{
    ferry_run_log *log = NULL;
    *anchor_path = *comp_path = UINT64_MAX;
    if (ferry_run_log_read(st, run, 0, &log)) return UINT64_MAX;
    uint64_t d[1024] = {0}, full[1024] = {0};
    for (size_t i = 0; i < log->count; i++) {
        d[log->versions[i].version] = log->versions[i].delta_bytes;
        full[log->versions[i].version] = log->versions[i].full_bytes;
    }
    for (uint64_t a = 1; a <= to; a++) {
        if (!full[a]) continue;
        uint64_t b = full[a];
        for (uint64_t v = a + 1; v <= to; v++) b += d[v];
        if (b < *anchor_path) *anchor_path = b;
    }
    for (size_t i = 0; i < log->ncompactions; i++) {
        const ferry_compaction_info *c = &log->compactions[i];
        if (c->to > to || c->from < from) continue;
        uint64_t b = c->bytes;
        for (uint64_t v = from + 1; v <= c->from; v++) b += d[v];
        for (uint64_t v = c->to + 1; v <= to; v++) b += d[v];
        if (b < *comp_path) *comp_path = b;
    }
    ferry_run_log_free(log);
    return *anchor_path < *comp_path ? *anchor_path : *comp_path;
}

static void far_behind(uint32_t K, bool compact)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    trainer t;
    tr_init(&t, 6, 1e-5f);
    ferry_publisher *pub = NULL;
    ferry_publisher_options po = {.anchor_every = K};
    CHECK_OK(ferry_publisher_open(st, "far", &po, &pub));
    uint8_t h[80][16];
    CHECK_OK(publish_n(pub, &t, 60, h));
    ferry_subscriber *s = private_sub(st, "far");
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 10, NULL));
    if (compact) {
        ferry_compact_options co = {.from = 10, .to = 55};
        ferry_compaction_info ci;
        CHECK_OK(ferry_compact(st, "far", &co, &ci));
        printf("    compacted 10..55: %" PRIu64 " bytes for a chain of %" PRIu64 "\n", ci.bytes, ci.chain_bytes);
        CHECK(ci.bytes < ci.chain_bytes);
    }
    ferry_sync_info info;
    ferry_subscriber_stats s0, s1;
    ferry_subscriber_get_stats(s, &s0);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
    ferry_subscriber_get_stats(s, &s1);
    CHECK(sub_has(s, h[60]) && info.from_version == 10);
    uint64_t ap, cp;
    uint64_t best = best_alternative(st, "far", 10, 60, &ap, &cp);
    printf("    50 behind, K=%u%s: fetched %" PRIu64 " bytes (%s); anchor path %" PRIu64 ", compacted path %" PRIu64
           ", chain %" PRIu64 "\n",
           K, compact ? ", compacted" : "", info.bytes_fetched, info.path, ap, cp == UINT64_MAX ? 0 : cp, info.chain_bytes);
    CHECK(info.bytes_fetched == s1.bytes_fetched - s0.bytes_fetched);
    CHECK(info.bytes_fetched <= best + best / 10);
    CHECK(!compact || strstr(info.path, "compacted 10..55"));
    ferry_subscriber_free(s);
    ferry_publisher_free(pub);
    ferry_store_free(st);
    tr_free(&t);
}

static void test_fifty_behind_anchor(void) { far_behind(10, false); }
static void test_fifty_behind_compacted(void) { far_behind(100, true); }

/* A compaction from an anchor serves fresh subscribers too; a broken one
 * is rejected and the path goes around it. */
static void test_compaction_shortcut(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    trainer t;
    tr_init(&t, 7, 1e-5f);
    ferry_publisher *pub = NULL;
    ferry_publisher_options po = {.anchor_every = 30};
    CHECK_OK(ferry_publisher_open(st, "cmp", &po, &pub));
    uint8_t h[40][16];
    CHECK_OK(publish_n(pub, &t, 25, h));
    ferry_compaction_info ci;
    CHECK_OK(ferry_compact(st, "cmp", NULL, &ci)); /* default: from the anchor below HEAD */
    CHECK(ci.from == 1 && ci.to == 25);
    ferry_subscriber *s = private_sub(st, "cmp");
    ferry_sync_info info;
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
    CHECK(sub_has(s, h[25]) && !strcmp(info.path, "anchor 1 + compacted 1..25"));
    ferry_subscriber_free(s);
    /* recompacting the same range replaces the entry */
    CHECK_OK(ferry_compact(st, "cmp", NULL, &ci));
    ferry_run_log *log = NULL;
    CHECK_OK(ferry_run_log_read(st, "cmp", 0, &log));
    CHECK(log && log->ncompactions == 1 && !strcmp(log->compactions[0].key, ci.key));
    ferry_run_log_free(log);
    /* damaged: rejected by name, the subscriber takes the chain */
    char p[1600];
    snprintf(p, sizeof p, "%s/%s", dir, ci.key);
    flip_byte(p, file_size(p) / 2);
    s = private_sub(st, "cmp");
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
    ferry_subscriber_stats ss;
    ferry_subscriber_get_stats(s, &ss);
    CHECK(sub_has(s, h[25]) && info.rejected == 1 && strstr(ss.last_rejection, ci.key));
    CHECK(!strcmp(info.path, "chain 1..25")); /* the anchor, fetched before the compaction failed, is kept */
    ferry_subscriber_free(s);
    /* compacting nothing, or past HEAD */
    ferry_compact_options bad = {.from = 5, .to = 5};
    CHECK_RC(ferry_compact(st, "cmp", &bad, NULL), FERRY_ERR_ARG);
    ferry_compact_options past = {.from = 5, .to = 26};
    CHECK_RC(ferry_compact(st, "cmp", &past, NULL), FERRY_ERR_SYNC_NOT_YET);
    ferry_publisher_free(pub);
    ferry_store_free(st);
    tr_free(&t);
}

/* ---- retention --------------------------------------------------------- */

typedef struct gc_seen {
    int deleted, kept;
} gc_seen;

static void on_obj(void *user, const char *key, uint64_t bytes, int action, const char *why)
{
    (void)key, (void)bytes, (void)why;
    gc_seen *g = user;
    if (action) g->deleted++;
    else g->kept++;
}

static void test_gc(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    trainer t;
    tr_init(&t, 8, 2e-5f);
    ferry_publisher *pub = NULL;
    ferry_publisher_options po = {.anchor_every = 4}; /* anchors 1 5 9 13 17 */
    CHECK_OK(ferry_publisher_open(st, "gc", &po, &pub));
    uint8_t h[32][16];
    CHECK_OK(publish_n(pub, &t, 20, h));
    ferry_compact_options c1 = {.from = 2, .to = 10}, c2 = {.from = 13, .to = 20};
    CHECK_OK(ferry_compact(st, "gc", &c1, NULL));
    CHECK_OK(ferry_compact(st, "gc", &c2, NULL));
    ferry_subscriber *old = private_sub(st, "gc"), *dropped = private_sub(st, "gc");
    CHECK_OK(ferry_subscriber_sync(old, FERRY_SYNC_EXACT, 14, NULL));
    CHECK_OK(ferry_subscriber_sync(dropped, FERRY_SYNC_EXACT, 6, NULL));
    /* orphans: a crashed publish above HEAD, and one at a taken version */
    CHECK_OK(ferry_store_put(st, "gc/v/00000000000000000021-0123456789abcdef.patch", "x", 1, NULL));
    CHECK_OK(ferry_store_put(st, "gc/v/00000000000000000015-0123456789abcdef.patch", "x", 1, NULL));
    CHECK_OK(ferry_store_put(st, "gc/notes.txt", "mine", 4, NULL));

    /* dry run: nothing goes */
    ferry_store_listing *l0 = NULL, *l1 = NULL;
    ferry_store_list(st, "gc/", &l0);
    gc_seen seen = {0, 0};
    ferry_gc_options go = {.keep = 5, .dry_run = 1, .on_object = on_obj, .user = &seen};
    ferry_gc_report rep;
    CHECK_OK(ferry_gc(st, "gc", &go, &rep));
    ferry_store_list(st, "gc/", &l1);
    CHECK(l0 && l1 && l0->count == l1->count && rep.objects_deleted > 0 && (size_t)(seen.deleted + seen.kept) == l0->count);
    ferry_store_listing_free(l1);
    /* keep 5: retained = 13..20 (16 chains back to anchor 13) */
    go.dry_run = 0;
    go.on_object = NULL;
    CHECK_OK(ferry_gc(st, "gc", &go, &rep));
    CHECK(rep.head == 20 && rep.oldest_retained == 13 && rep.compactions_dropped == 1);
    printf("    gc keep 5: %" PRIu64 " objects deleted (%" PRIu64 " bytes), %" PRIu64 " kept\n", rep.objects_deleted, rep.bytes_deleted,
           rep.objects_kept);
    ferry_store_list(st, "gc/", &l1);
    int below = 0, above = 0, orphan15 = 0, notes = 0;
    for (size_t i = 0; l1 && i < l1->count; i++) {
        const char *k = l1->entries[i].key;
        if (!strncmp(k, "gc/v/", 5)) {
            unsigned long long v = strtoull(k + 5, NULL, 10);
            if (v < 13) below++;
            if (v == 21) above++;
            if (strstr(k, "00015-0123456789abcdef")) orphan15++;
        }
        if (!strcmp(k, "gc/notes.txt")) notes++;
    }
    CHECK(below == 0 && above == 1 && orphan15 == 1 && notes == 1);
    ferry_store_listing_free(l0);
    ferry_store_listing_free(l1);
    /* a subscriber at a retained version still reaches the latest by deltas */
    ferry_sync_info info;
    CHECK_OK(ferry_subscriber_sync(old, FERRY_SYNC_LATEST, 0, &info));
    CHECK(sub_has(old, h[20]) && !strstr(info.path, "anchor"));
    /* one at a dropped version goes through an anchor */
    CHECK_OK(ferry_subscriber_sync(dropped, FERRY_SYNC_LATEST, 0, &info));
    CHECK(sub_has(dropped, h[20]) && strstr(info.path, "anchor") && info.rejected >= 1);
    /* and a dropped version is gone, cleanly */
    ferry_subscriber *s = private_sub(st, "gc");
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 5, NULL), FERRY_ERR_SYNC_GONE);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 13, NULL));
    CHECK(sub_has(s, h[13]));
    ferry_subscriber_free(s);
    /* orphans go once older than the grace period (here: none) */
    ferry_gc_options go2 = {.keep = 5, .grace_s = -1};
    CHECK_OK(ferry_gc(st, "gc", &go2, &rep));
    CHECK(rep.objects_deleted == 1);
    ferry_gc_options go0 = {.keep = 0};
    CHECK_RC(ferry_gc(st, "gc", &go0, &rep), FERRY_ERR_ARG);
    /* keep 1 with HEAD an anchor's successor: HEAD's chain stays whole */
    ferry_gc_options go1 = {.keep = 1, .grace_s = -1};
    CHECK_OK(ferry_gc(st, "gc", &go1, &rep));
    CHECK(rep.oldest_retained == 17);
    s = private_sub(st, "gc");
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(sub_has(s, h[20]));
    ferry_subscriber_free(s);
    ferry_subscriber_free(old);
    ferry_subscriber_free(dropped);
    ferry_publisher_free(pub);
    ferry_store_free(st);
    tr_free(&t);
}

/* ---- corruption -------------------------------------------------------- */

static void test_corrupt_objects(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    trainer t;
    tr_init(&t, 9, 2e-5f);
    ferry_publisher *pub = NULL;
    ferry_publisher_options po = {.anchor_every = 5}; /* anchors 1 6 11 */
    CHECK_OK(ferry_publisher_open(st, "bad", &po, &pub));
    uint8_t h[20][16];
    CHECK_OK(publish_n(pub, &t, 13, h));
    char k[512], p[1100], q[1100];
    ferry_sync_info info;
    ferry_subscriber_stats ss;

    /* truncated delta 8: a subscriber at 7 is refused it, goes by anchor 11 */
    ferry_subscriber *s = private_sub(st, "bad");
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 7, NULL));
    CHECK(version_key(st, "bad", 8, "patch", k));
    snprintf(p, sizeof p, "%s/%s", dir, k);
    snprintf(q, sizeof q, "%s/saved", g_root);
    copy_file(p, q);
    CHECK(truncate(p, file_size(p) - 7) == 0);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
    ferry_subscriber_get_stats(s, &ss);
    CHECK(sub_has(s, h[13]) && info.rejected == 1 && strstr(ss.last_rejection, k) && strstr(ss.last_rejection, "truncated"));
    CHECK(!strcmp(info.path, "anchor 11 + chain 11..13"));
    ferry_subscriber_free(s);
    copy_file(q, p); /* repaired */

    /* bit-flipped delta 9 */
    s = private_sub(st, "bad");
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 8, NULL));
    CHECK(version_key(st, "bad", 9, "patch", k));
    snprintf(p, sizeof p, "%s/%s", dir, k);
    copy_file(p, q);
    flip_byte(p, file_size(p) - 30);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
    ferry_subscriber_get_stats(s, &ss);
    CHECK(sub_has(s, h[13]) && info.rejected == 1 && strstr(ss.last_rejection, k));
    ferry_subscriber_free(s);
    copy_file(q, p);

    /* a delta of another version under version 12's name, cut or padded
     * to 12's size so that the size check cannot tell */
    CHECK(version_key(st, "bad", 12, "patch", k));
    snprintf(p, sizeof p, "%s/%s", dir, k);
    char k13[512];
    CHECK(version_key(st, "bad", 13, "patch", k13));
    snprintf(q, sizeof q, "%s/%s", dir, k13);
    void *d13;
    size_t n13;
    CHECK_OK(ferry_file_read(q, 1 << 26, &d13, &n13));
    long n12 = file_size(p);
    void *pad = calloc(1, (size_t)n12 + n13);
    memcpy(pad, d13, n13 < (size_t)n12 ? n13 : (size_t)n12);
    ferry_file_write(p, pad, (size_t)n12); /* 13's patch, cut or padded to 12's size */
    free(pad);
    ferry_free(d13);
    caller_model c;
    caller_init(&c, 0);
    ferry_subscriber_options so = {.model = c.m};
    CHECK_OK(ferry_subscriber_open(st, "bad", &so, &s));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 11, NULL));
    uint16_t snap0 = c.buf[0][12345];
    uint8_t mh[16];
    /* 12 is refused; 13 needs 12: no path is left, the buffers keep 11 */
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info), FERRY_ERR_SYNC_NO_PATH);
    CHECK(strstr(ferry_last_error(), k));
    model_hash(c.m, mh);
    CHECK(ferry_subscriber_version(s) == 11 && !memcmp(mh, h[11], 16) && c.buf[0][12345] == snap0);
    ferry_subscriber_free(s);
    caller_free(&c);

    /* an anchor swapped with another (same size): refused by hash; the
     * anchor before it and its chain serve */
    char ka6[512], ka11[512];
    CHECK(version_key(st, "bad", 6, "safetensors", ka6));
    CHECK(version_key(st, "bad", 11, "safetensors", ka11));
    snprintf(p, sizeof p, "%s/%s", dir, ka6);
    snprintf(q, sizeof q, "%s/%s", dir, ka11);
    copy_file(p, q);
    s = private_sub(st, "bad");
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 11, &info));
    ferry_subscriber_get_stats(s, &ss);
    CHECK(sub_has(s, h[11]) && strstr(ss.last_rejection, ka11) && strstr(ss.last_rejection, "model hash"));
    CHECK(!strcmp(info.path, "anchor 6 + chain 6..11"));
    ferry_subscriber_free(s);

    /* a manifest that is not JSON: named (HEAD without its copy of it, as
       HEADs written before "manifest_record" are) */
    char km[512];
    CHECK(version_key(st, "bad", 13, "json", km));
    CHECK_OK(ferry_store_put(st, km, "{not json", 9, NULL));
    {
        void *d = NULL;
        size_t n = 0;
        CHECK_OK(ferry_store_get(st, "bad/HEAD", &d, &n, NULL));
        json_t *root = d ? json_loadb(d, n, 0, NULL) : NULL;
        CHECK(root && !json_object_del(root, "manifest_record"));
        char *text = root ? json_dumps(root, JSON_INDENT(1)) : NULL;
        CHECK(text && !ferry_store_put(st, "bad/HEAD", text, strlen(text), NULL));
        free(text);
        json_decref(root);
        ferry_free(d);
    }
    s = private_sub(st, "bad");
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_MANIFEST);
    CHECK(strstr(ferry_last_error(), km));
    ferry_subscriber_free(s);
    ferry_publisher_free(pub);
    ferry_store_free(st);
    tr_free(&t);
}

/* ---- waiting and names ------------------------------------------------- */

typedef struct later {
    ferry_publisher *pub;
    trainer *t;
    ferry_subscriber *wake;
} later;

static void *publish_later(void *arg)
{
    later *l = arg;
    struct timespec ts = {0, 200 * 1000000L};
    nanosleep(&ts, NULL);
    if (l->wake) ferry_subscriber_wake(l->wake);
    else publish_n(l->pub, l->t, 1, NULL);
    return NULL;
}

static void test_wait(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    trainer t;
    tr_init(&t, 10, 2e-5f);
    ferry_publisher *pub = NULL;
    CHECK_OK(ferry_publisher_open(st, "w", NULL, &pub));
    ferry_subscriber_options so = {.poll_interval_ms = 20};
    ferry_subscriber *s = NULL;
    CHECK_OK(ferry_subscriber_open(st, "w", &so, &s));
    uint64_t head = 99;
    CHECK_RC(ferry_subscriber_wait(s, 0, 0, &head), FERRY_ERR_SYNC_TIMEOUT); /* no HEAD yet: waited for */
    CHECK(head == 0);
    later l = {pub, &t, NULL};
    pthread_t th;
    pthread_create(&th, NULL, publish_later, &l);
    CHECK_OK(ferry_subscriber_wait(s, 0, 10000, &head));
    pthread_join(th, NULL);
    CHECK(head == 1);
    CHECK_RC(ferry_subscriber_wait(s, 1, 100, &head), FERRY_ERR_SYNC_TIMEOUT);
    l.wake = s;
    pthread_create(&th, NULL, publish_later, &l);
    time_t t0 = time(NULL);
    CHECK_OK(ferry_subscriber_wait(s, 1, 20000, &head)); /* woken */
    pthread_join(th, NULL);
    CHECK(head == 1 && time(NULL) - t0 < 10);
    ferry_subscriber *s2 = NULL;
    CHECK_RC(ferry_subscriber_open(st, "../x", NULL, &s2), FERRY_ERR_SYNC_RUN);
    CHECK(s2 == NULL);
    CHECK_RC(ferry_sync_run_check("a//b"), FERRY_ERR_SYNC_RUN);
    CHECK_RC(ferry_sync_run_check(".hidden"), FERRY_ERR_SYNC_RUN);
    CHECK_OK(ferry_sync_run_check("team-1/run_7.b"));
    ferry_subscriber_free(s);
    ferry_publisher_free(pub);
    ferry_store_free(st);
    tr_free(&t);
}

/* A sync right after a wait uses the HEAD the wait read (one round trip
 * less) only within one poll interval; the publisher's copy of what it
 * published stays exact when a version changes the layout. */
static void test_wait_then_sync(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    trainer t;
    tr_init(&t, 11, 2e-5f);
    ferry_publisher *pub = NULL;
    CHECK_OK(ferry_publisher_open(st, "ws", NULL, &pub));
    uint8_t h[8][16];
    CHECK_OK(publish_n(pub, &t, 1, h));
    ferry_subscriber_options so = {.poll_interval_ms = 60000}, so2 = {.poll_interval_ms = 20};
    ferry_subscriber *s = NULL, *s2 = NULL;
    CHECK_OK(ferry_subscriber_open(st, "ws", &so, &s));
    CHECK_OK(ferry_subscriber_open(st, "ws", &so2, &s2));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK_OK(ferry_subscriber_sync(s2, FERRY_SYNC_LATEST, 0, NULL));
    CHECK_OK(publish_n(pub, &t, 1, h));
    ferry_subscriber_stats a, b;
    uint64_t head = 0;
    CHECK_OK(ferry_subscriber_wait(s, 1, 1000, &head));
    ferry_subscriber_get_stats(s, &a);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    ferry_subscriber_get_stats(s, &b);
    CHECK(head == 2 && ferry_subscriber_version(s) == 2 && sub_has(s, h[2]));
    /* one round trip (issue 26): HEAD from the wait, the manifest inside it */
    CHECK(b.manifests_fetched - a.manifests_fetched == 0);
    /* a wait older than the poll interval: HEAD read again */
    CHECK_OK(ferry_subscriber_wait(s2, 1, 1000, &head));
    struct timespec ts = {0, 60 * 1000000L};
    nanosleep(&ts, NULL);
    ferry_subscriber_get_stats(s2, &a);
    CHECK_OK(ferry_subscriber_sync(s2, FERRY_SYNC_LATEST, 0, NULL));
    ferry_subscriber_get_stats(s2, &b);
    CHECK(ferry_subscriber_version(s2) == 2 && b.manifests_fetched - a.manifests_fetched == 1);
    /* no wait: HEAD read by the sync (the wait's HEAD is used once) */
    CHECK_OK(publish_n(pub, &t, 1, h));
    ferry_subscriber_get_stats(s, &a);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    ferry_subscriber_get_stats(s, &b);
    CHECK(ferry_subscriber_version(s) == 3 && sub_has(s, h[3]) && b.manifests_fetched - a.manifests_fetched == 1);
    /* new metadata (the publisher cannot reuse its copy's layout), then back */
    for (int k = 0; k < 2; k++) {
        tr_step(&t);
        ferry_model *m = tr_model(&t, 0);
        if (!k) ferry_model_set_metadata(m, "step", "4");
        ferry_publish_info info;
        CHECK_OK(ferry_publish_ex(pub, m, 0, &info));
        model_hash(m, h[info.version]);
        ferry_model_free(m);
        CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
        CHECK(ferry_subscriber_version(s) == info.version && sub_has(s, h[info.version]));
    }
    CHECK_OK(publish_n(pub, &t, 1, h));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(ferry_subscriber_version(s) == 6 && sub_has(s, h[6]));
    ferry_subscriber_free(s);
    ferry_subscriber_free(s2);
    ferry_publisher_free(pub);
    ferry_store_free(st);
    tr_free(&t);
}

/* HEAD's copy of its manifest (one round trip a version, issue 26) is
 * checked exactly as the stored manifest would be, and against HEAD: one
 * altered inside an unsigned HEAD (a model hash that is not HEAD's) is
 * ignored, and the manifest is fetched and checked on its own.  (In a
 * signed run HEAD's signature covers the copy, and the copy keeps its own.) */
static void test_head_inline_manifest(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    trainer t;
    tr_init(&t, 12, 2e-5f);
    ferry_publisher *pub = NULL;
    CHECK_OK(ferry_publisher_open(st, "hi", NULL, &pub));
    uint8_t h[8][16];
    CHECK_OK(publish_n(pub, &t, 2, h));
    ferry_subscriber *s = NULL;
    ferry_subscriber_stats a, b;
    CHECK_OK(ferry_subscriber_open(st, "hi", NULL, &s));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    ferry_subscriber_get_stats(s, &a); /* HEAD (with manifest 2), manifest 1 */
    CHECK(ferry_subscriber_version(s) == 2 && sub_has(s, h[2]) && a.manifests_fetched == 2);
    ferry_subscriber_free(s);
    void *d = NULL;
    size_t n = 0;
    CHECK_OK(ferry_store_get(st, "hi/HEAD", &d, &n, NULL));
    json_t *root = d ? json_loadb(d, n, 0, NULL) : NULL;
    const char *rec = json_string_value(json_object_get(root, "manifest_record"));
    json_t *m = rec ? json_loads(rec, 0, NULL) : NULL;
    CHECK(m && json_is_string(json_object_get(m, "model_hash")));
    if (m) {
        json_object_set_new(m, "model_hash", json_string("00112233445566778899aabbccddeeff"));
        char *mt = json_dumps(m, JSON_INDENT(1));
        json_object_set_new(root, "manifest_record", json_string(mt));
        free(mt);
        char *text = json_dumps(root, JSON_INDENT(1));
        CHECK(text && !ferry_store_put(st, "hi/HEAD", text, strlen(text), NULL));
        free(text);
    }
    json_decref(m);
    json_decref(root);
    ferry_free(d);
    CHECK_OK(ferry_subscriber_open(st, "hi", NULL, &s));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    ferry_subscriber_get_stats(s, &b);
    CHECK(ferry_subscriber_version(s) == 2 && sub_has(s, h[2]));
    CHECK(b.manifests_fetched == 3); /* HEAD, then manifest 2 itself, manifest 1 */
    ferry_subscriber_free(s);
    ferry_publisher_free(pub);
    ferry_store_free(st);
    tr_free(&t);
}

int main(void)
{
    if (fixture_root("sync")) return 1;
    RUN(test_publish_pull_targets);
    RUN(test_rl_steps_file_mode);
    RUN(test_memory_mode);
    RUN(test_cast_masters);
    RUN(test_anchor_rule_and_resume);
    RUN(test_second_publisher_conflict);
    RUN(test_fifty_behind_anchor);
    RUN(test_fifty_behind_compacted);
    RUN(test_compaction_shortcut);
    RUN(test_gc);
    RUN(test_corrupt_objects);
    RUN(test_wait);
    RUN(test_wait_then_sync);
    RUN(test_head_inline_manifest);
    rm_rf(g_root);
    return CHECK_SUMMARY();
}
#endif
