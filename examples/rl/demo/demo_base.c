/*
 * ferry-demo: the pre-trained starting policy.
 *
 * RL post-training starts from a model that already does the task somewhat.
 * The demo's base policy is the seeded initial network after a short
 * supervised warm-up (examples/rl/sft.h) at a pre-training learning rate;
 * the RL run then moves it at a post-training rate.  The warm-up is a pure
 * function of (seed, task, network, warm-up settings), so it is cached:
 * CACHE/demo-base-KEY.safetensors, where KEY hashes a text of those
 * settings.  The file records that text and the XXH3-128 of the weights in
 * its metadata; a file whose text or hash does not match (another version
 * of the demo, a truncated or edited file) is recomputed and replaced.
 */
#include "demo.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

/* Bump when the warm-up's code changes what it computes. */
#define BASE_FORMAT 1

static void base_key(char *buf, size_t cap, const rl_policy_config *n, const rl_task *t, uint64_t seed,
                     const rl_sft_config *w)
{
    snprintf(buf, cap,
             "ferry-demo-base %d seed %" PRIu64 " task %s digits %u vocab %u window %u embed %u heads %u hidden %u "
             "layers %u warmup_steps %u prompts %u lr %.9g beta1 %.9g beta2 %.9g eps %.9g wd %.9g",
             BASE_FORMAT, seed, rl_task_name(t->kind), t->prompt_len, n->vocab, n->window, n->embed, n->heads, n->hidden,
             n->layers, w->steps, w->prompts, (double)w->adam.lr, (double)w->adam.beta1, (double)w->adam.beta2,
             (double)w->adam.eps, (double)w->adam.weight_decay);
}

static int weights_hash(const rl_policy *p, char out[33])
{
    ferry_model *m = NULL;
    uint8_t h[16];
    int rc = rl_policy_model_f32(p, &m);
    if (!rc) rc = ferry_model_hash(m, h);
    ferry_model_free(m);
    if (!rc) hex16(out, h);
    return rc;
}

/* mkdir -p of dir (0700 for the parts it makes); 0 or -1. */
static int make_dirs(const char *dir)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp) return -1;
    for (char *q = tmp + 1; *q; q++) {
        if (*q != '/') continue;
        *q = 0;
        if (mkdir(tmp, 0700) && errno != EEXIST) return -1;
        *q = '/';
    }
    return mkdir(tmp, 0700) && errno != EEXIST ? -1 : 0;
}

/* Reuses the cached file if it is the one of these settings. */
static int try_reuse(rl_policy *p, const char *path, const char *key, demo_base *out)
{
    struct stat sb;
    if (stat(path, &sb)) return -1;
    char err[1024];
    ferry_model *meta = NULL;
    float *save = malloc(p->nparams * sizeof *save);
    if (!save) return -1;
    memcpy(save, p->w, p->nparams * sizeof *save);
    int ok = 0;
    if (!rl_policy_load_file(p, path, err, sizeof err, &meta)) {
        const char *k = ferry_model_metadata_get(meta, "ferry.demo.base"), *h = ferry_model_metadata_get(meta, "ferry.demo.hash");
        ok = k && h && !strcmp(k, key) && !weights_hash(p, out->hash) && !strcmp(h, out->hash);
        if (!ok) fprintf(stderr, "ferry-demo: %s is not the base policy of these settings (or is damaged); recomputing it\n", path);
    } else {
        fprintf(stderr, "ferry-demo: ignoring the cached base policy: %s\n", err);
    }
    ferry_model_free(meta);
    if (!ok) memcpy(p->w, save, p->nparams * sizeof *save);
    free(save);
    return ok ? 0 : -1;
}

int demo_base_policy(rl_policy *p, const rl_task *t, uint64_t seed, const rl_sft_config *w, const char *cache_dir,
                     demo_base *out)
{
    memset(out, 0, sizeof *out);
    char key[600];
    base_key(key, sizeof key, &p->cfg, t, seed, w);
    if (cache_dir && *cache_dir) {
        XXH64_hash_t kh = XXH3_64bits(key, strlen(key));
        if (snprintf(out->path, sizeof out->path, "%s/demo-base-%016" PRIx64 ".safetensors", cache_dir, (uint64_t)kh) >=
            (int)sizeof out->path)
            out->path[0] = 0;
        if (out->path[0] && !try_reuse(p, out->path, key, out)) {
            out->reused = 1;
            return 0;
        }
    }
    rl_policy_init_weights(p, seed);
    double t0 = demo_now_ms();
    int rc = w->steps ? rl_sft_run(p, t, seed, w, &out->loss) : 0;
    if (rc) {
        fprintf(stderr, "ferry-demo: the warm-up failed: %s\n", ferry_strerror(rc));
        return rc;
    }
    out->seconds = (demo_now_ms() - t0) / 1e3;
    if ((rc = weights_hash(p, out->hash))) return rc;
    if (!out->path[0]) return 0;
    char err[1024];
    const char *meta[] = {"ferry.demo.base", key, "ferry.demo.hash", out->hash, NULL};
    if (make_dirs(cache_dir) || rl_policy_save_file(p, out->path, meta, err, sizeof err)) {
        fprintf(stderr, "ferry-demo: cannot cache the base policy in %s (continuing without): %s\n", cache_dir,
                errno ? strerror(errno) : err);
        out->path[0] = 0;
    }
    return 0;
}
