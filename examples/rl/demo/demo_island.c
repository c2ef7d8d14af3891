/*
 * ferry-demo island — one rollout island of ferry-demo (hidden command).
 *
 *   ferry-demo island --store URL --run RUN --island I
 *
 * An island is told only where the store is, which run, and its id; it
 * reads the rest (RUN/demo/config) from the store and talks to nothing
 * else.  It holds the policy as BF16 weights, kept current through the
 * sync layer in memory mode (ferry_subscriber_sync patches its own buffer in
 * place, verified), computes with their exact FP32 values
 * (rl_policy_weights) and puts each batch of trajectories, tagged with the
 * version that sampled it, through the dock.  In a quantized run (the
 * config's "quantize fp8-block128": --rollout-dtype fp8) the model it holds
 * is the run's FP8 checkpoint (rl_policy_model_quant: F8_E4M3 codes and
 * their block scales where the scheme quantizes, BF16 elsewhere), patched
 * in place the same way, and it samples with the dequantized values
 * (code x scale per 128 x 128 block, the library's ferry_dequantize_fp8).
 *
 *  sequential pull: it polls RUN/demo/control ("step S version V"), syncs
 *    to exactly V, samples its shard of step S's prompts and puts it;
 *  async push-pull: a background thread follows HEAD (ferry_subscriber_wait
 *    + sync to the latest version into a second buffer); the rollout loop
 *    samples with whatever version it holds, picking up a newer one between
 *    batches, and pauses while `queue` of its batches are still waiting in
 *    the store (the trainer deletes what it takes or drops).
 *
 * A restarted island (kill -9 and start again) needs nothing from its
 * previous life: the subscriber starts from no version and reaches the one
 * it needs through the cheapest verified path (an anchor plus deltas); the
 * dock tells it the next free sequence number (ferry_dock_resume_seq).
 */
#include "util.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "demo.h"
#include "ferry_store.h"
#include "ferry_sync.h"
#include "rollout.h"
#include "traj.h"

#define ISLAND_IDLE_EXIT_MS (600 * 1000.0) /* backstop: no work for this long */
#define CONTROL_BAD_MS (10 * 1000.0)        /* a control object unreadable this long is an error */

typedef struct island {
    ferry_store *st;
    ferry_store *pst;           /* --policy-store, or NULL */
    char run[DEMO_RUN_MAX + 1];
    char policy_run[DEMO_KEY_MAX];
    char control_key[DEMO_KEY_MAX], status_key[DEMO_KEY_MAX];
    uint32_t id;
    demo_config cfg;
    rl_policy pol;          /* FP32 values of the weights held */
    rl_work ws;
    uint16_t *held;         /* BF16 weights the rollouts use (BF16 runs) */
    ferry_model *m_held;    /* sequential: the memory-mode subscriber's model:
                               borrows held, or (quantized run) owns the FP8
                               checkpoint's buffers */
    const char *dump_dir;   /* --dump (tests): what it holds, at the stop */
    ferry_subscriber *sub;
    ferry_dock *dock;
    ferry_keys *trust, *sign; /* signed run: the trainer's public key; this island's key */
    uint64_t seq;
    demo_island_status status;
    unsigned char *wire;
    size_t wire_cap;
    /* async: the background follower */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    uint16_t *bg;           /* the follower's buffer (BF16 runs) */
    ferry_model *m_bg;      /* its subscriber's model: borrows bg, or owns the
                               FP8 checkpoint's buffers */
    float *bg_w;            /* the follower's FP32 values of m_bg */
    float *ready;           /* FP32 values of the last version the follower
                               completed */
    uint64_t ready_version;
    demo_island_status bg_status;
    volatile int stop, fatal;
    double control_bad_since; /* first unreadable control object in a row, or 0 */
} island;

static int island_fail(const island *is, const char *what, int rc)
{
    const char *d = ferry_last_error();
    fprintf(stderr, "ferry-demo island %u: %s: %s (%s)\n", is->id, what, d[0] ? d : ferry_strerror(rc), rl_strerror(rc));
    return 1;
}

/* With --policy-store, the policy comes from that store (a mirror) and
 * the run's store is the fallback (docs/MIRROR.md). */
static int open_subscriber(island *is, ferry_model *m, ferry_subscriber **out)
{
    ferry_store *first = is->pst ? is->pst : is->st;
    ferry_subscriber_options so = {.model = m, .keys = is->trust,
                                   .poll_interval_ms = ferry_store_kind(first) == FERRY_STORE_FILE ? 10 : 50};
    int rc = ferry_subscriber_open(first, is->policy_run, &so, out);
    if (!rc && is->pst && (rc = ferry_subscriber_add_store(*out, is->st))) {
        ferry_subscriber_free(*out);
        *out = NULL;
    }
    return rc;
}

/* One sync, timed, recorded in *s. */
static int sync_to(island *is, ferry_subscriber **sub, ferry_model *m, int mode, uint64_t version,
                   demo_island_status *s)
{
    int rc;
    if (is->cfg.full_sync) {
        /* the full-checkpoint baseline: a subscriber that holds nothing can
         * only take an anchor, and the trainer makes every version one */
        ferry_subscriber_free(*sub);
        *sub = NULL;
        if ((rc = open_subscriber(is, m, sub))) return rc;
    }
    ferry_sync_info info;
    double t0 = demo_now_ms();
    if ((rc = ferry_subscriber_sync(*sub, mode, version, &info))) return rc;
    if (info.to_version != info.from_version || is->cfg.full_sync) {
        s->syncs++;
        s->sync_ms = demo_now_ms() - t0;
        s->sync_bytes = info.bytes_fetched;
        snprintf(s->path, sizeof s->path, "%s", info.path);
        if (!s->join[0]) {
            snprintf(s->join, sizeof s->join, "%s", info.path);
            s->join_version = info.to_version;
        }
        demo_status_fresh(s, info.to_version, demo_wall_ms());
    }
    s->fetched_total += info.bytes_fetched;
    s->version = info.to_version;
    return 0;
}

static int read_control(island *is, int *stop, uint64_t *step, uint64_t *version)
{
    void *data = NULL;
    size_t size = 0;
    int rc = ferry_store_get(is->st, is->control_key, &data, &size, NULL);
    *stop = 0;
    *step = *version = UINT64_MAX;
    if (rc == FERRY_ERR_STORE_NOT_FOUND) return 0;
    if (rc) return rc;
    const char *t = data;
    unsigned long long s, v;
    int end = 0;
    /* A store that writes objects in place (s3rver, docs/STORE.md) can show
     * the trainer's control object empty or cut while it is rewritten, so a
     * request counts only whole, up to its newline ("step 1 version 1" may
     * be the start of "step 1 version 12"), and an unreadable one means "no
     * request yet" until it has stayed so for CONTROL_BAD_MS. */
    if (!strncmp(t, "stop\n", 5)) *stop = 1;
    else if (sscanf(t, "step %llu version %llu%n", &s, &v, &end) == 2 && t[end] == '\n') *step = s, *version = v;
    else if (!is->control_bad_since) is->control_bad_since = demo_now_ms();
    else if (demo_now_ms() - is->control_bad_since > CONTROL_BAD_MS) {
        fprintf(stderr, "ferry-demo island %u: %s: unreadable for %.0f s (%zu bytes, not \"step S version V\" or \"stop\")\n",
                is->id, is->control_key, CONTROL_BAD_MS / 1e3, size);
        rc = FERRY_ERR_ARG;
    }
    if (*stop || *step != UINT64_MAX) is->control_bad_since = 0;
    ferry_free(data);
    return rc;
}

static int put_status(island *is)
{
    char buf[1024];
    int rc = demo_status_format(&is->status, buf, sizeof buf);
    if (!rc) rc = ferry_store_put(is->st, is->status_key, buf, strlen(buf), NULL);
    return rc;
}

/* Samples one batch with the weights held and puts it. */
static int rollout_put(island *is, uint64_t step, uint32_t first, uint32_t count, uint64_t version, char key[DEMO_KEY_MAX])
{
    rl_rollout_args ra = {.seed = is->cfg.seed, .step = step, .version = version, .first_prompt = first,
                          .n_prompts = count, .group = is->cfg.group};
    rl_batch b;
    int rc = rl_rollout(&is->pol, &is->cfg.task, &ra, &is->ws, &b);
    if (rc) return rc;
    size_t need = rl_batch_wire_size(&b), len = 0;
    if (need > is->wire_cap) {
        unsigned char *w = realloc(is->wire, need);
        if (!w) {
            rl_batch_release(&b);
            return FERRY_ERR_NOMEM;
        }
        is->wire = w;
        is->wire_cap = need;
    }
    rc = rl_batch_serialize(&b, is->wire, is->wire_cap, &len);
    rl_batch_release(&b);
    if (rc) return rc;
    if ((rc = ferry_dock_put(is->dock, is->id, version, is->seq, is->wire, len))) return rc;
    if (key && (rc = ferry_dock_key(is->run, version, is->id, is->seq, key))) return rc;
    is->seq++;
    is->status.batches++;
    return 0;
}

/* ---- sequential pull ---------------------------------------------------- */
static int run_sequential(island *is)
{
    uint64_t last_step = UINT64_MAX;
    double backoff = 1, idle_since = demo_now_ms(), started = -1;
    uint32_t first, count;
    demo_shard(is->cfg.prompts, is->cfg.islands, is->id % is->cfg.islands, &first, &count);
    for (;;) {
        int stop, rc;
        uint64_t step, version;
        if ((rc = read_control(is, &stop, &step, &version))) return island_fail(is, "reading the control object", rc);
        if (stop) return 0;
        if (step == UINT64_MAX || step == last_step) {
            if (demo_now_ms() - idle_since > ISLAND_IDLE_EXIT_MS) {
                fprintf(stderr, "ferry-demo island %u: no request for %.0f s, exiting\n", is->id, ISLAND_IDLE_EXIT_MS / 1e3);
                return 1;
            }
            demo_sleep_ms(backoff);
            if (backoff < 16) backoff *= 2;
            continue;
        }
        backoff = 1;
        double t0 = demo_now_ms();
        if (started < 0) started = t0; /* working from the first request on */
        if (is->status.version != version || is->cfg.full_sync) {
            /* the rollout of this step waits for these weights */
            if ((rc = sync_to(is, &is->sub, is->m_held, FERRY_SYNC_EXACT, version, &is->status)))
                return island_fail(is, "syncing to the requested version", rc);
            if ((rc = rl_policy_weights(&is->pol, is->m_held, is->pol.w)))
                return island_fail(is, "the weights of the version held", rc);
        }
        is->status.wait_ms += demo_now_ms() - t0;
        if ((rc = rollout_put(is, step, first, count, version, NULL))) return island_fail(is, "rollout / put", rc);
        is->status.busy_ms = demo_now_ms() - started;
        if ((rc = put_status(is))) return island_fail(is, "status", rc);
        last_step = step;
        idle_since = demo_now_ms();
    }
}

/* ---- async push-pull ---------------------------------------------------- */
static void *follower(void *arg)
{
    island *is = arg;
    ferry_subscriber *sub = NULL;
    int rc = open_subscriber(is, is->m_bg, &sub), failures = 0;
    if (rc) {
        island_fail(is, "subscriber", rc);
        is->fatal = 1;
        return NULL;
    }
    pthread_mutex_lock(&is->mu);
    is->sub = sub; /* for ferry_subscriber_wake */
    pthread_mutex_unlock(&is->mu);
    demo_island_status s = {0};
    while (!is->stop) {
        uint64_t head = 0;
        rc = ferry_subscriber_wait(sub, s.version, 1000, &head);
        if (is->stop) break;
        if (rc == FERRY_ERR_SYNC_TIMEOUT) continue;
        if (!rc && head > s.version) {
            /* a full-checkpoint sync replaces the subscriber: hide it from
             * ferry_subscriber_wake meanwhile */
            if (is->cfg.full_sync) {
                pthread_mutex_lock(&is->mu);
                is->sub = NULL;
                pthread_mutex_unlock(&is->mu);
            }
            rc = sync_to(is, &sub, is->m_bg, FERRY_SYNC_LATEST, 0, &s);
            pthread_mutex_lock(&is->mu);
            is->sub = sub;
            pthread_mutex_unlock(&is->mu);
            if (!sub) {
                island_fail(is, "subscriber", rc);
                is->fatal = 1;
                break;
            }
        }
        if (rc) {
            island_fail(is, "following the policy", rc);
            if (++failures >= 20) {
                is->fatal = 1;
                break;
            }
            demo_sleep_ms(100);
            continue;
        }
        failures = 0;
        if (s.version > is->ready_version) {
            /* the values outside the lock: the rollout loop copies them */
            if ((rc = rl_policy_weights(&is->pol, is->m_bg, is->bg_w))) {
                island_fail(is, "the weights of the version held", rc);
                is->fatal = 1;
                break;
            }
            pthread_mutex_lock(&is->mu);
            memcpy(is->ready, is->bg_w, is->pol.nparams * sizeof *is->ready);
            is->ready_version = s.version;
            is->bg_status = s;
            pthread_mutex_unlock(&is->mu);
        }
    }
    pthread_mutex_lock(&is->mu);
    is->sub = NULL;
    pthread_mutex_unlock(&is->mu);
    ferry_subscriber_free(sub);
    return NULL;
}

static int run_async(island *is)
{
    size_t n = is->pol.nparams;
    int rc;
    if (!(is->bg_w = malloc(n * sizeof *is->bg_w)) || !(is->ready = malloc(n * sizeof *is->ready)))
        return island_fail(is, "alloc", FERRY_ERR_NOMEM);
    if (is->cfg.quant) rc = rl_policy_model_quant(&is->pol, (ferry_quant)is->cfg.quant, &is->m_bg);
    else if (!(is->bg = malloc(n * 2))) rc = FERRY_ERR_NOMEM;
    else rc = rl_policy_model_bf16(&is->pol, is->bg, &is->m_bg);
    if (rc) return island_fail(is, "model", rc);
    if (pthread_mutex_init(&is->mu, NULL)) return island_fail(is, "mutex", FERRY_ERR_NOMEM);
    if (pthread_create(&is->thread, NULL, follower, is)) return island_fail(is, "thread", FERRY_ERR_NOMEM);
    is->thread_started = 1;

    uint32_t first, count;
    demo_shard(is->cfg.prompts, is->cfg.islands, is->id % is->cfg.islands, &first, &count);
    char out_keys[64][DEMO_KEY_MAX];
    uint32_t nout = 0;
    double backoff = 1, idle_since = demo_now_ms(), started = demo_now_ms(), wait = 0;
    for (;;) {
        int stop;
        uint64_t step, version;
        if (is->fatal) return 1;
        if ((rc = read_control(is, &stop, &step, &version))) return island_fail(is, "reading the control object", rc);
        if (stop) return 0;
        /* a newer version from the follower, between batches */
        double t0 = demo_now_ms();
        pthread_mutex_lock(&is->mu);
        if (is->ready_version > is->status.version) {
            memcpy(is->pol.w, is->ready, n * sizeof *is->pol.w);
            uint64_t batches = is->status.batches;
            is->status = is->bg_status;
            is->status.batches = batches;
            is->status.pid = (long)getpid();
        }
        pthread_mutex_unlock(&is->mu);
        /* the rollout loop waits for weights only to pick up a new version
         * (the follower syncs in the background), and before the first */
        wait += demo_now_ms() - t0;
        /* batches of ours the trainer has not taken (or dropped) yet; one
         * that is already too old for the trainer (whose version is at
         * least the one we hold) will only be dropped: not worth waiting
         * for (the trainer's sweeps may find it late) */
        for (uint32_t i = 0; i < nout;) {
            ferry_store_stat sst;
            uint64_t v = 0, sq;
            uint32_t isl;
            int stale = !ferry_dock_key_parse(is->run, out_keys[i], &v, &isl, &sq) && is->status.version > v &&
                        is->status.version - v > is->cfg.max_staleness;
            rc = stale ? FERRY_ERR_STORE_NOT_FOUND : ferry_store_head(is->st, out_keys[i], &sst);
            if (rc == FERRY_ERR_STORE_NOT_FOUND) {
                memmove(out_keys[i], out_keys[nout - 1], DEMO_KEY_MAX);
                nout--;
            } else if (rc) {
                return island_fail(is, "checking a batch", rc);
            } else {
                i++;
            }
        }
        if (!is->status.version) {
            if (demo_now_ms() - idle_since > ISLAND_IDLE_EXIT_MS) {
                fprintf(stderr, "ferry-demo island %u: no policy for %.0f s, exiting\n", is->id, ISLAND_IDLE_EXIT_MS / 1e3);
                return 1;
            }
            double w0 = demo_now_ms();
            demo_sleep_ms(2);
            wait += demo_now_ms() - w0;
            continue;
        }
        if (nout >= is->cfg.queue || nout >= 64) {
            if (demo_now_ms() - idle_since > ISLAND_IDLE_EXIT_MS) {
                fprintf(stderr, "ferry-demo island %u: idle for %.0f s, exiting\n", is->id, ISLAND_IDLE_EXIT_MS / 1e3);
                return 1;
            }
            demo_sleep_ms(backoff);
            if (backoff < 16) backoff *= 2;
            continue;
        }
        backoff = 1;
        /* a PRNG coordinate of our own: island and sequence number */
        uint64_t coord = ((uint64_t)(is->id + 1) << 40) | is->seq;
        if ((rc = rollout_put(is, coord, first, count, is->status.version, out_keys[nout])))
            return island_fail(is, "rollout / put", rc);
        nout++;
        is->status.wait_ms = wait;
        is->status.busy_ms = demo_now_ms() - started;
        if ((rc = put_status(is))) return island_fail(is, "status", rc);
        idle_since = demo_now_ms();
    }
}

static void stop_follower(island *is)
{
    if (!is->thread_started) return;
    is->stop = 1;
    pthread_mutex_lock(&is->mu);
    if (is->sub) ferry_subscriber_wake(is->sub);
    pthread_mutex_unlock(&is->mu);
    pthread_join(is->thread, NULL);
    pthread_mutex_destroy(&is->mu);
    is->thread_started = 0;
    is->sub = NULL; /* the follower freed its subscriber */
}

/* --dump (tests): the model the island holds, as the sync layer left it
 * (RUN-island-I-vV.safetensors: the FP8 checkpoint in a quantized run),
 * and the FP32 weights its rollouts used (RUN-island-I-vV-f32.safetensors).
 * Sequential: both are version status.version; async: the follower's
 * model is the newest version it completed, the weights those of the
 * version the rollout loop held last. */
static int dump(island *is)
{
    char path[4400], err[512];
    const ferry_model *m = is->cfg.mode == DEMO_SEQUENTIAL ? is->m_held : is->m_bg;
    uint64_t mv = is->cfg.mode == DEMO_SEQUENTIAL ? is->status.version : is->ready_version;
    int rc = 0;
    if (m && mv) {
        snprintf(path, sizeof path, "%s/%s-island-%u-v%" PRIu64 ".safetensors", is->dump_dir, is->run, is->id, mv);
        if ((rc = ferry_model_save(m, path))) return island_fail(is, path, rc);
    }
    if (is->status.version) {
        snprintf(path, sizeof path, "%s/%s-island-%u-v%" PRIu64 "-f32.safetensors", is->dump_dir, is->run, is->id,
                 is->status.version);
        if ((rc = rl_policy_save_file(&is->pol, path, NULL, err, sizeof err))) {
            fprintf(stderr, "ferry-demo island %u: %s\n", is->id, err);
            return 1;
        }
    }
    return 0;
}

static void island_release(island *is)
{
    if (is->thread_started) stop_follower(is);
    else ferry_subscriber_free(is->sub);
    ferry_dock_free(is->dock);
    ferry_keys_free(is->trust);
    ferry_keys_free(is->sign);
    ferry_model_free(is->m_held);
    ferry_model_free(is->m_bg);
    free(is->held);
    free(is->bg);
    free(is->bg_w);
    free(is->ready);
    free(is->wire);
    rl_work_release(&is->ws);
    rl_policy_release(&is->pol);
    ferry_store_free(is->st);
    ferry_store_free(is->pst);
}

static void island_help(void)
{
    puts("usage: ferry-demo island --store URL --run RUN --island I [--keys DIR] [--policy-store URL]\n"
         "                         [--dump DIR]\n\n"
         "One rollout island of ferry-demo (started by it; not meant to be run by\n"
         "hand).  Reads its parameters from RUN/demo/config in the store, follows\n"
         "the policy of RUN/policy through the sync layer, and puts version-tagged\n"
         "trajectory batches through the dock until RUN/demo/control says stop.\n"
         "With --policy-store, the policy comes from that store (a mirror), the\n"
         "run's store being the fallback.  With --dump, it writes the model it\n"
         "holds and the FP32 weights it sampled with into DIR when told to stop.");
}

int cmd_island(int argc, char **argv)
{
    const char *url = NULL, *run = NULL, *key_dir = NULL, *purl = NULL, *dump_dir = NULL;
    long id = -1;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (cli_is_help(a)) {
            island_help();
            return 0;
        }
        if (!v) return cli_usage_error("island", "option '%s' needs a value", a);
        if (!strcmp(a, "--store")) url = v;
        else if (!strcmp(a, "--run")) run = v;
        else if (!strcmp(a, "--keys")) key_dir = v;
        else if (!strcmp(a, "--policy-store")) purl = v;
        else if (!strcmp(a, "--dump")) dump_dir = v;
        else if (!strcmp(a, "--island")) {
            if (!cli_parse_int(v, 0, DEMO_MAX_ISLANDS - 1, &id)) return cli_usage_error("island", "bad island id '%s'", v);
        } else
            return cli_usage_error("island", "unknown option '%s'", a);
    }
    if (!url || !run || id < 0) return cli_usage_error("island", "needs --store, --run and --island");
    if (strlen(run) > DEMO_RUN_MAX || ferry_dock_run_check(run)) return cli_usage_error("island", "bad run id '%s'", run);

    island is;
    memset(&is, 0, sizeof is);
    is.id = (uint32_t)id;
    is.dump_dir = dump_dir;
    snprintf(is.run, sizeof is.run, "%s", run);
    demo_policy_run(is.policy_run, run);
    demo_key(is.control_key, run, "control");
    char leaf[32];
    snprintf(leaf, sizeof leaf, "island-%u", is.id);
    demo_key(is.status_key, run, leaf);
    is.status.pid = (long)getpid();

    int rc, status = 1;
    ferry_store_options so = {.deadline_ms = 60000};
    if ((rc = ferry_store_open(url, &so, &is.st)) || (purl && (rc = ferry_store_open(purl, &so, &is.pst)))) {
        island_fail(&is, "store", rc);
        goto out;
    }
    char ckey[DEMO_KEY_MAX];
    demo_key(ckey, run, "config");
    void *text = NULL;
    size_t tsize = 0;
    if ((rc = ferry_store_get(is.st, ckey, &text, &tsize, NULL))) {
        island_fail(&is, "reading the run's config", rc);
        goto out;
    }
    rc = demo_config_parse(text, &is.cfg);
    ferry_free(text);
    if (rc) {
        fprintf(stderr, "ferry-demo island %u: %s is malformed\n", is.id, ckey);
        goto out;
    }
    if ((rc = rl_policy_create(&is.pol, &is.cfg.net)) || (rc = rl_task_fits(&is.pol, &is.cfg.task))) {
        island_fail(&is, "policy", rc);
        goto out;
    }
    if (is.cfg.mode == DEMO_SEQUENTIAL) {
        /* the subscriber's model: BF16 buffers of ours, or the FP8
         * checkpoint's layout (async: the follower's, run_async) */
        if (is.cfg.quant) rc = rl_policy_model_quant(&is.pol, (ferry_quant)is.cfg.quant, &is.m_held);
        else if (!(is.held = calloc(is.pol.nparams, 2))) rc = FERRY_ERR_NOMEM;
        else rc = rl_policy_model_bf16(&is.pol, is.held, &is.m_held);
        if (rc) {
            island_fail(&is, "model", rc);
            goto out;
        }
    }
    if (key_dir) {
        /* signed run: follow only versions the trainer's key signed, sign
         * every batch with this island's own key (an island signer: it
         * signs batches only); the dock ring also trusts the trainer's key,
         * so that resume_seq believes the trainer's signed cursor */
        char kp[4200], pp[4200];
        snprintf(kp, sizeof kp, "%s/island-%u.key", key_dir, is.id);
        snprintf(pp, sizeof pp, "%s/trainer.pub", key_dir);
        if ((rc = ferry_keys_create(&is.trust)) || (rc = ferry_keys_trust(is.trust, pp, FERRY_KEY_PUBLISHER, NULL)) ||
            (rc = ferry_keys_create(&is.sign)) || (rc = ferry_keys_set_island_signer(is.sign, kp, is.id, NULL)) ||
            (rc = ferry_keys_trust(is.sign, pp, FERRY_KEY_PUBLISHER, NULL))) {
            island_fail(&is, "keys", rc);
            goto out;
        }
    }
    ferry_dock_options dopt = {.role = FERRY_DOCK_PRODUCER, .keys = is.sign};
    if ((rc = ferry_dock_open(is.st, run, &dopt, &is.dock)) || (rc = ferry_dock_resume_seq(is.dock, is.id, &is.seq))) {
        island_fail(&is, "dock", rc);
        goto out;
    }
    if (is.cfg.mode == DEMO_SEQUENTIAL) {
        if ((rc = open_subscriber(&is, is.m_held, &is.sub))) {
            island_fail(&is, "subscriber", rc);
            goto out;
        }
        status = run_sequential(&is);
    } else {
        status = run_async(&is);
        stop_follower(&is);
    }
    if (!status && is.dump_dir) status = dump(&is);
out:
    island_release(&is);
    return status;
}
