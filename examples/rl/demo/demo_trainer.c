/*
 * ferry-demo: the trainer and the islands' supervisor (one leg of a demo).
 *
 * The trainer holds the FP32 masters and AdamW's moments.  Version 1 is the
 * initial policy; after each optimizer step it publishes the next version
 * through the sync layer (ferry_publish_ex of the FP32 masters with
 * cast_bf16: the codec gates the masters directly into BF16 words; the
 * publisher diffs against the exact bits of the previous version, whose
 * hash it passes as the diff's base_hash).  A step:
 *
 *   sequential: writes the request "step S version T" to RUN/demo/control;
 *     each island syncs to exactly T and puts its shard of step S; the dock
 *     admits only batches of version T; the trainer waits for every shard;
 *   async: islands sample continuously with what they hold; the dock
 *     admits a batch of version v iff T - v <= max_staleness and drops
 *     (counts, deletes) older ones; the trainer takes one batch per island.
 *
 * Then: each batch parsed (traj.h) and its rewards re-verified, the GRPO
 * gradient accumulated in a fixed order (shards in prompt order, so the
 * result does not depend on which island was faster), an AdamW step, the
 * cast, and — unless adaptive publication holds it back — a publish.
 *
 * FP8 rollouts (quant, --rollout-dtype fp8): the publisher quantizes each
 * version's BF16 cast (ferry_publisher_options.quantize, fp8-block128) and
 * the run holds the FP8 checkpoints, shipped as patches of FP8 codes; the
 * islands sample with their dequantized values while the trainer learns on
 * its FP32 masters as before.  Each version's BF16 patch (ferry_diff of
 * the two casts, not shipped) is measured beside it.
 *
 * Adaptive publication (ECHO's proposal): publish only when the share of
 * BF16 words that differ from the last published version reaches the
 * threshold (or after max_skip steps without a publish); until then the
 * islands keep sampling with the last published version.
 *
 * The supervisor starts the islands (fork + exec of `ferry-demo island`), kills
 * island 0 with SIGKILL at --kill-island-at and restarts it, and restarts
 * any island that dies (at most 5 times each).  Islands get
 * PR_SET_PDEATHSIG, so they never outlive the trainer.
 */
#include "demo.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "adamw.h"
#include "ferry_store.h"
#include "ferry_sync.h"
#include "grpo.h"
#include "rollout.h"
#include "traj.h"
#include "util.h"

#define MAX_RESTARTS 5

volatile int demo_interrupted;

/* ======================================================================
 * Supervisor
 * ====================================================================== */
typedef struct sup {
    const demo_options *o;
    const char *url, *run;
    uint32_t n;
    pid_t pid[DEMO_MAX_ISLANDS];
    int restarts[DEMO_MAX_ISLANDS];
    int pending[DEMO_MAX_ISLANDS];            /* dead, to restart */
    uint32_t restart_step[DEMO_MAX_ISLANDS];  /* not before this step */
    double restart_ms[DEMO_MAX_ISLANDS];      /* not before this time */
    uint64_t restarted_wall_ms[DEMO_MAX_ISLANDS]; /* when the current process started after a restart */
    int killed[DEMO_MAX_ISLANDS];             /* killed on purpose, not yet reaped */
    pid_t mirror;                             /* the `ferry mirror` child, 0 = none */
    const char *policy_run;
} sup;

/* Runs this program with argv as a child that dies with the trainer and
 * writes nothing on stdout (it carries the trainer's rows or JSON). */
static pid_t spawn_argv(const sup *s, char **argv)
{
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        if (!freopen("/dev/null", "w", stdout)) _exit(1);
        execv(s->o->exe, argv);
        fprintf(stderr, "ferry-demo: cannot run %s: %s\n", s->o->exe, strerror(errno));
        _exit(127);
    }
    return pid;
}

static pid_t spawn(const sup *s, uint32_t i)
{
    char idbuf[16];
    snprintf(idbuf, sizeof idbuf, "%u", i);
    char *argv[] = {"ferry-demo", "island", "--store", (char *)s->url, "--run", (char *)s->run, "--island", idbuf,
                    NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    /* optional pairs, packed so that the first NULL ends the list */
    int k = 8;
    if (s->o->key_dir) argv[k++] = "--keys", argv[k++] = (char *)s->o->key_dir;
    if (s->o->mirror_url) argv[k++] = "--policy-store", argv[k++] = (char *)s->o->mirror_url;
    if (s->o->dump_dir) argv[k++] = "--dump", argv[k++] = (char *)s->o->dump_dir;
    return spawn_argv(s, argv);
}

/* The mirror child (--mirror): follows the policy run from the store into
 * the mirror store, which the islands prefer (docs/MIRROR.md).  It is
 * `ferry mirror`, linked into ferry-demo as its hidden `mirror` command. */
static pid_t spawn_mirror(const sup *s)
{
    char *argv[] = {"ferry-demo", "mirror", (char *)s->url, (char *)s->o->mirror_url, "--run", (char *)s->policy_run, "--follow",
                    "--poll-ms", "10", "-q", NULL};
    return spawn_argv(s, argv);
}

static void add_event(demo_leg *leg, int kind, uint32_t step, uint32_t island, long pid, const char *what)
{
    if (leg->nevents >= sizeof leg->events / sizeof leg->events[0]) return;
    demo_event *e = &leg->events[leg->nevents++];
    e->kind = kind;
    e->step = step;
    e->island = island;
    e->pid = pid;
    snprintf(e->what, sizeof e->what, "%s", what);
}

/* Reaps dead islands, restarts those that are due.  Returns 0, or 1 if an
 * island keeps dying. */
static int supervise(sup *s, demo_leg *leg, uint32_t step)
{
    int st;
    pid_t p;
    while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
        if (p == s->mirror) { /* islands fall back to the store itself */
            s->mirror = 0;
            fprintf(stderr, "ferry-demo: the mirror (pid %ld) ended; islands use the store\n", (long)p);
            continue;
        }
        for (uint32_t i = 0; i < s->n; i++) {
            if (s->pid[i] != p) continue;
            s->pid[i] = 0;
            if (s->killed[i]) {
                s->killed[i] = 0;
                break;
            }
            char what[120];
            if (WIFSIGNALED(st)) snprintf(what, sizeof what, "island %u (pid %ld) died: signal %d", i, (long)p, WTERMSIG(st));
            else snprintf(what, sizeof what, "island %u (pid %ld) exited with status %d", i, (long)p, WEXITSTATUS(st));
            add_event(leg, DEMO_EV_DIED, step, i, (long)p, what);
            demo_print_event(s->o, leg, &leg->events[leg->nevents - 1]);
            if (s->restarts[i] >= MAX_RESTARTS) {
                fprintf(stderr, "ferry-demo: island %u died %d times; giving up\n", i, s->restarts[i] + 1);
                return 1;
            }
            s->pending[i] = 1;
            s->restart_step[i] = step;
            s->restart_ms[i] = demo_now_ms() + 200;
            break;
        }
    }
    for (uint32_t i = 0; i < s->n; i++) {
        if (!s->pending[i] || s->pid[i] || step < s->restart_step[i] || demo_now_ms() < s->restart_ms[i]) continue;
        s->pending[i] = 0;
        s->restarts[i]++;
        s->restarted_wall_ms[i] = demo_wall_ms();
        s->pid[i] = spawn(s, i);
        if (s->pid[i] < 0) {
            s->pid[i] = 0;
            fprintf(stderr, "ferry-demo: fork: %s\n", strerror(errno));
            return 1;
        }
        char what[120];
        snprintf(what, sizeof what, "island %u restarted (pid %ld)", i, (long)s->pid[i]);
        add_event(leg, DEMO_EV_RESTART, step, i, (long)s->pid[i], what);
        demo_print_event(s->o, leg, &leg->events[leg->nevents - 1]);
    }
    return 0;
}

static void kill_island(sup *s, demo_leg *leg, uint32_t i, uint32_t step)
{
    if (!s->pid[i]) return;
    long pid = (long)s->pid[i];
    kill(s->pid[i], SIGKILL);
    s->killed[i] = 1;
    s->pending[i] = 1;
    s->restart_step[i] = step + (s->o->mode == DEMO_ASYNC ? s->o->restart_after : 0);
    s->restart_ms[i] = demo_now_ms() + 300;
    char what[120];
    snprintf(what, sizeof what, "island %u (pid %ld) killed with SIGKILL", i, pid);
    add_event(leg, DEMO_EV_KILL, step, i, pid, what);
    demo_print_event(s->o, leg, &leg->events[leg->nevents - 1]);
    /* reap it now, so that supervise() does not report it as a death */
    int st;
    if (waitpid(s->pid[i], &st, 0) == s->pid[i]) {
        s->pid[i] = 0;
        s->killed[i] = 0;
    }
}

/* Stops every island: "stop" was written; waits up to 10 s, then SIGKILL. */
static void stop_all(sup *s)
{
    double until = demo_now_ms() + 10000;
    for (;;) {
        int alive = 0;
        for (uint32_t i = 0; i < s->n; i++) {
            if (!s->pid[i]) continue;
            int st;
            pid_t r = waitpid(s->pid[i], &st, WNOHANG);
            if (r == s->pid[i] || (r < 0 && errno == ECHILD)) s->pid[i] = 0;
            else alive++;
        }
        if (!alive) return;
        if (demo_now_ms() > until) break;
        demo_sleep_ms(20);
    }
    for (uint32_t i = 0; i < s->n; i++)
        if (s->pid[i]) {
            kill(s->pid[i], SIGKILL);
            waitpid(s->pid[i], NULL, 0);
            s->pid[i] = 0;
        }
}

/* ======================================================================
 * Trainer state
 * ====================================================================== */
typedef struct kept {
    rl_batch b;
    void *payload;
    size_t size;
    uint64_t version, staleness, seq, put_ms;
    uint32_t island, shard;
} kept;

/* Quantized legs: the logits of the FP8 weights the islands sample with
 * against those of the BF16 version, on a fixed probe set. */
typedef struct probe {
    rl_policy pol;              /* the weights evaluated */
    rl_work ws;
    uint8_t *ctx;               /* rows x window */
    uint32_t *len;
    size_t rows;
    float *ref;                 /* rows x vocab: the BF16 version's logits */
} probe;

typedef struct trainer {
    const demo_options *o;
    ferry_store *st;
    char run[DEMO_RUN_MAX + 1];
    char policy_run[DEMO_KEY_MAX];
    rl_policy master;
    rl_adamw adam;
    rl_work ws;
    float *grad;
    uint16_t *cast, *published; /* BF16 cast now; last published version */
    ferry_model *m_f32;         /* borrows master.w */
    ferry_model *m_cast, *m_published; /* borrow cast and published */
    int quant;                  /* the leg's ferry_quant */
    probe pr;                   /* quantized legs */
    ferry_publisher *pub;
    ferry_dock *dock;
    ferry_keys *sign, *enrolled; /* signed run: the trainer's key; the islands' keys */
    uint64_t version;           /* last published (the trainer version T) */
    kept *k;
    size_t nk;
    XXH3_state_t *traj_hash;
    /* islands' status, for sync times and fetched bytes */
    demo_island_status isl[DEMO_MAX_ISLANDS];
    uint64_t fetched_dead;      /* bytes fetched by island processes that are gone */
    uint64_t batches_dead;      /* batches they put */
    double wait_dead, busy_dead; /* their time waiting for weights / working */
    double prev_wait[DEMO_MAX_ISLANDS], prev_busy[DEMO_MAX_ISLANDS]; /* at the last read */
    /* time-to-fresh-policy, per version v (1..max_version): when its publish
     * started, which process each island ran then (0: none), and when that
     * process first held v or newer (0: not yet) */
    uint64_t max_version;
    uint64_t *pub_wall;         /* [v] */
    long *pub_pid;              /* [v * islands + i] */
    uint64_t *reach;            /* [v * islands + i] */
    uint32_t *ver_step;         /* [v] the step that published v, UINT32_MAX: none */
    const sup *sp;
    char last_warning[256];
} trainer;

static int tfail(const char *what, int rc)
{
    const char *d = ferry_last_error();
    fprintf(stderr, "ferry-demo: %s: %s (%s)\n", what, d[0] ? d : ferry_strerror(rc), rl_strerror(rc));
    return 1;
}

static void kept_clear(trainer *t)
{
    for (size_t i = 0; i < t->nk; i++) {
        rl_batch_release(&t->k[i].b);
        free(t->k[i].payload);
    }
    t->nk = 0;
}

static void trainer_release(trainer *t)
{
    kept_clear(t);
    free(t->k);
    ferry_dock_free(t->dock);
    ferry_publisher_free(t->pub);
    ferry_keys_free(t->sign);
    ferry_keys_free(t->enrolled);
    ferry_model_free(t->m_f32);
    ferry_model_free(t->m_cast);
    ferry_model_free(t->m_published);
    rl_policy_release(&t->pr.pol);
    rl_work_release(&t->pr.ws);
    free(t->pr.ctx);
    free(t->pr.len);
    free(t->pr.ref);
    free(t->grad);
    free(t->cast);
    free(t->published);
    free(t->pub_wall);
    free(t->pub_pid);
    free(t->reach);
    free(t->ver_step);
    rl_adamw_release(&t->adam);
    rl_work_release(&t->ws);
    rl_policy_release(&t->master);
    if (t->traj_hash) XXH3_freeState(t->traj_hash);
}

static void warn_once(trainer *t, const char *msg)
{
    if (!strcmp(t->last_warning, msg)) return;
    snprintf(t->last_warning, sizeof t->last_warning, "%s", msg);
    fprintf(stderr, "ferry-demo: %s\n", msg);
}

/* Checks one batch the dock returned; keeps it (parsed) or counts it as
 * discarded.  Sequential: it must be a shard of this step not seen yet. */
static void consider(trainer *t, const ferry_dock_batch *db, uint32_t step, uint8_t *shard_seen, demo_step *ds)
{
    const demo_options *o = t->o;
    kept k;
    memset(&k, 0, sizeof k);
    char err[160] = "", msg[256];
    int rc = rl_batch_parse(db->payload, db->size, &k.b, err, sizeof err);
    if (!rc) rc = rl_batch_verify_rewards(&k.b, &o->task);
    if (rc) {
        snprintf(msg, sizeof msg, "batch of island %u seq %" PRIu64 " rejected: %s %s", db->island, db->seq, rl_strerror(rc), err);
        warn_once(t, msg);
        ds->discarded++;
        return;
    }
    uint32_t shard = UINT32_MAX;
    for (uint32_t i = 0; i < o->islands; i++) {
        uint32_t f, c;
        demo_shard(o->prompts, o->islands, i, &f, &c);
        if (k.b.first_prompt == f && k.b.n_prompts == c) shard = i;
    }
    int ok = k.b.version == db->version && k.b.seed == o->seed && k.b.group == o->group && shard != UINT32_MAX;
    if (ok && o->mode == DEMO_SEQUENTIAL) ok = k.b.step == step && !shard_seen[shard];
    if (!ok) {
        /* a restarted island may redo a shard it had already put */
        ds->discarded++;
        rl_batch_release(&k.b);
        return;
    }
    if (o->mode == DEMO_SEQUENTIAL) shard_seen[shard] = 1;
    if (!(k.payload = malloc(db->size ? db->size : 1))) {
        rl_batch_release(&k.b);
        ds->discarded++;
        return;
    }
    memcpy(k.payload, db->payload, db->size);
    k.size = db->size;
    k.version = db->version;
    k.staleness = db->staleness;
    k.seq = db->seq;
    k.island = db->island;
    k.put_ms = db->put_time_ms;
    k.shard = shard;
    t->k[t->nk++] = k;
}

static int cmp_kept(const void *a, const void *b)
{
    const kept *x = a, *y = b;
    if (x->version != y->version) return x->version < y->version ? -1 : 1;
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    if (x->island != y->island) return x->island < y->island ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Takes this step's batches: one per island (async) or every shard
 * (sequential). */
static int collect(trainer *t, sup *s, demo_leg *leg, uint32_t step, demo_step *ds)
{
    const demo_options *o = t->o;
    ferry_dock_policy pol = {o->mode == DEMO_ASYNC ? FERRY_DOCK_ASYNC : FERRY_DOCK_SEQUENTIAL, o->max_staleness};
    uint8_t shard_seen[DEMO_MAX_ISLANDS] = {0};
    ferry_dock_stats before, after;
    ferry_dock_get_stats(t->dock, &before);
    double last_progress = demo_now_ms();
    while (t->nk < o->islands) {
        if (demo_interrupted) {
            fprintf(stderr, "ferry-demo: interrupted\n");
            return 1;
        }
        if (supervise(s, leg, step)) return 1;
        ferry_dock_batch *b = NULL;
        size_t n = 0;
        int rc = ferry_dock_take(t->dock, &pol, t->version, o->islands - t->nk, 50, &b, &n);
        if (rc) return tfail("taking batches", rc);
        for (size_t i = 0; i < n && t->nk < o->islands; i++) consider(t, &b[i], step, shard_seen, ds);
        ferry_dock_batches_free(b, n);
        if (n) last_progress = demo_now_ms();
        if (demo_now_ms() - last_progress > o->timeout_s * 1e3) {
            fprintf(stderr, "ferry-demo: step %u: no batch from the islands for %.0f s (version %" PRIu64 ")\n", step,
                    o->timeout_s, t->version);
            return 1;
        }
    }
    ferry_dock_get_stats(t->dock, &after);
    ds->dropped = after.dropped_stale - before.dropped_stale;
    return 0;
}

/* Time-to-fresh-policy of version v: publish start -> the last island
 * (of those running when it was published) holding v or newer, verified.
 * Written into the step that published v once every such island has
 * reported it. */
static void update_fresh(trainer *t, demo_leg *leg, uint64_t v)
{
    uint32_t j = t->ver_step[v];
    if (j == UINT32_MAX || leg->steps[j].fresh_ms >= 0) return;
    uint64_t last = 0;
    int need = 0;
    for (uint32_t i = 0; i < t->o->islands; i++) {
        size_t k = (size_t)v * t->o->islands + i;
        if (!t->pub_pid[k]) continue;
        need++;
        if (!t->reach[k]) return;
        if (t->reach[k] > last) last = t->reach[k];
    }
    if (!need) return;
    leg->steps[j].fresh_ms = last > t->pub_wall[v] ? (double)(last - t->pub_wall[v]) : 0;
}

/* An island's status names the versions its last syncs reached and when:
 * the first time its current process held each version or a newer one. */
static void note_fresh(trainer *t, uint32_t i, const demo_island_status *s)
{
    for (uint32_t f = 0; f < s->nfresh; f++) {
        uint64_t fv = s->fresh_version[f] < t->max_version ? s->fresh_version[f] : t->max_version;
        for (uint64_t v = fv; v >= 2; v--) {
            size_t k = (size_t)v * t->o->islands + i;
            if (t->pub_pid[k] != s->pid) continue;
            if (t->reach[k] && t->reach[k] <= s->fresh_wall_ms[f]) break; /* older ones too */
            t->reach[k] = s->fresh_wall_ms[f];
        }
    }
}

/* Reads the islands' status objects: mean time of their last syncs, and the
 * bytes they fetched and batches they put (a restarted island starts its
 * counters again: those of its previous process are kept apart). */
static void read_status(trainer *t, demo_leg *leg, uint32_t step, double *sync_ms, double *wait_share)
{
    double sum = 0;
    int n = 0;
    for (uint32_t i = 0; i < t->o->islands; i++) {
        char key[DEMO_KEY_MAX], leaf[32];
        snprintf(leaf, sizeof leaf, "island-%u", i);
        demo_key(key, t->run, leaf);
        void *data = NULL;
        size_t size = 0;
        demo_island_status s;
        if (!ferry_store_get(t->st, key, &data, &size, NULL) && !demo_status_parse(data, &s)) {
            if (s.pid != t->isl[i].pid) {
                t->fetched_dead += t->isl[i].fetched_total;
                t->batches_dead += t->isl[i].batches;
                t->wait_dead += t->isl[i].wait_ms;
                t->busy_dead += t->isl[i].busy_ms;
                t->prev_wait[i] = t->prev_busy[i] = 0;
                if (t->isl[i].pid && s.syncs) {
                    /* a restarted island's first words: how it caught up */
                    char what[200];
                    snprintf(what, sizeof what, "island %u (pid %ld) rejoined: synced to version %" PRIu64 " by %s",
                             i, s.pid, s.join_version, s.join);
                    add_event(leg, DEMO_EV_REJOIN, step, i, s.pid, what);
                    demo_print_event(t->o, leg, &leg->events[leg->nevents - 1]);
                }
            }
            t->isl[i] = s;
            note_fresh(t, i, &s);
        }
        ferry_free(data);
        if (t->isl[i].syncs) {
            sum += t->isl[i].sync_ms;
            n++;
        }
    }
    uint64_t fetched = t->fetched_dead, batches = t->batches_dead;
    double wait = t->wait_dead, busy = t->busy_dead, share = 0;
    int nshare = 0;
    for (uint32_t i = 0; i < t->o->islands; i++) {
        fetched += t->isl[i].fetched_total;
        batches += t->isl[i].batches;
        wait += t->isl[i].wait_ms;
        busy += t->isl[i].busy_ms;
        double dw = t->isl[i].wait_ms - t->prev_wait[i], db = t->isl[i].busy_ms - t->prev_busy[i];
        if (db > 0 && dw >= 0) {
            share += dw / db;
            nshare++;
        }
        t->prev_wait[i] = t->isl[i].wait_ms;
        t->prev_busy[i] = t->isl[i].busy_ms;
    }
    if (wait_share) *wait_share = nshare ? share / nshare : 0;
    leg->wait_share = busy > 0 ? wait / busy : 0;
    if (sync_ms) *sync_ms = n ? sum / n : 0;
    leg->fetched_total = fetched;
    leg->produced = batches;
}

/* The gradient of the kept batches (in a fixed order), an AdamW step. */
static int train(trainer *t, demo_step *ds)
{
    qsort(t->k, t->nk, sizeof *t->k, cmp_kept);
    uint64_t completions = 0;
    for (size_t i = 0; i < t->nk; i++) completions += (uint64_t)t->k[i].b.n_prompts * t->k[i].b.group;
    memset(t->grad, 0, t->master.nparams * sizeof *t->grad);
    rl_grpo_stats gs;
    memset(&gs, 0, sizeof gs);
    ds->stale_min = UINT64_MAX;
    for (size_t i = 0; i < t->nk; i++) {
        const kept *k = &t->k[i];
        int rc = rl_grpo_accumulate(&t->master, &k->b, 1.0 / (double)completions, &t->ws, t->grad, &gs);
        if (rc) return tfail("GRPO gradient", rc);
        XXH3_128bits_update(t->traj_hash, k->payload, k->size);
        ds->prompts += k->b.n_prompts;
        if (k->staleness < ds->stale_min) ds->stale_min = k->staleness;
        if (k->staleness > ds->stale_max) ds->stale_max = k->staleness;
    }
    ds->batches = (uint32_t)t->nk;
    ds->reward = completions ? gs.reward_sum / (double)completions : 0;
    /* linear learning-rate warm-up, as RL fine-tunes do: Adam's first steps
     * move every weight by the full rate whatever its gradient */
    uint32_t w = t->o->lr_warmup;
    t->adam.cfg.lr = w && t->adam.t < w ? t->o->lr * (float)(t->adam.t + 1) / (float)w : t->o->lr;
    rl_adamw_step(&t->adam, t->master.w, t->grad);
    return 0;
}

static uint64_t count_changed(const uint16_t *a, const uint16_t *b, size_t n)
{
    uint64_t c = 0;
    for (size_t i = 0; i < n; i++) c += a[i] != b[i];
    return c;
}

/* Bytes of the .safetensors file of model m (written aside in $TMPDIR and
 * removed): a full BF16 checkpoint, for a quantized leg's comparison. */
static int checkpoint_bytes(const ferry_model *m, uint64_t *out)
{
    const char *tmp = getenv("TMPDIR");
    char path[4200];
    snprintf(path, sizeof path, "%s/ferry-demo-bf16-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) {
        fprintf(stderr, "ferry-demo: cannot create %s: %s\n", path, strerror(errno));
        return FERRY_ERR_IO;
    }
    close(fd);
    int rc = ferry_model_save(m, path);
    struct stat sb;
    if (!rc && stat(path, &sb)) rc = FERRY_ERR_IO;
    if (!rc) *out = (uint64_t)sb.st_size;
    unlink(path);
    return rc;
}

/* The probe set: DEMO_PROBE_PROMPTS prompts of their own stream and every
 * teacher-forced context of their correct answers. */
static int probe_init(trainer *t, const rl_task *task)
{
    probe *pr = &t->pr;
    int rc = rl_policy_create(&pr->pol, &t->master.cfg);
    if (rc) return rc;
    uint32_t T = task->completion_len, W = pr->pol.cfg.window, V = pr->pol.cfg.vocab;
    pr->rows = (size_t)DEMO_PROBE_PROMPTS * T;
    if (!(pr->ctx = malloc(pr->rows * W)) || !(pr->len = malloc(pr->rows * sizeof *pr->len)) ||
        !(pr->ref = malloc(pr->rows * V * sizeof *pr->ref)))
        return FERRY_ERR_NOMEM;
    for (uint32_t c = 0; c < DEMO_PROBE_PROMPTS; c++) {
        uint8_t prompt[RL_TASK_MAX_LEN], ans[RL_TASK_MAX_LEN];
        rl_task_prompt(task, t->o->seed ^ DEMO_PROBE_SEED, 0, c, prompt);
        rl_task_answer(task, prompt, ans);
        for (uint32_t k = 0; k < T; k++) {
            size_t r = (size_t)c * T + k;
            if ((rc = rl_policy_context(&pr->pol, prompt, task->prompt_len, ans, k, pr->ctx + r * W, pr->len + r))) return rc;
        }
    }
    return 0;
}

/* ds->fp8_*: the logits of the version just published as the islands hold
 * it (ferry_quantize of the BF16 cast, which is what the publisher
 * quantizes: test demo_fp8.sh), dequantized as they do
 * (rl_policy_weights), against the BF16 cast's. */
static int probe_measure(trainer *t, demo_leg *leg, demo_step *ds)
{
    probe *pr = &t->pr;
    size_t V = pr->pol.cfg.vocab;
    rl_policy_set_bf16(&pr->pol, t->cast);
    int rc = rl_forward(&pr->pol, pr->ctx, pr->len, pr->rows, &pr->ws);
    if (rc) return rc;
    memcpy(pr->ref, pr->ws.logits, pr->rows * V * sizeof *pr->ref);
    ferry_model *q = NULL;
    if ((rc = ferry_quantize(t->m_cast, (ferry_quant)t->quant, 0, NULL, &q, NULL))) return rc;
    rc = rl_policy_weights(&pr->pol, q, pr->pol.w);
    ferry_model_free(q);
    if (rc || (rc = rl_forward(&pr->pol, pr->ctx, pr->len, pr->rows, &pr->ws))) return rc;
    double mx = 0, sum = 0, kl = 0;
    size_t same = 0;
    for (size_t r = 0; r < pr->rows; r++) {
        const float *a = pr->ref + r * V, *b = pr->ws.logits + r * V;
        size_t ia = 0, ib = 0;
        double ma = a[0], mb = b[0], sa = 0, sb = 0;
        for (size_t v = 0; v < V; v++) {
            double d = fabs((double)a[v] - (double)b[v]);
            if (d > mx) mx = d;
            sum += d;
            if (a[v] > a[ia]) ia = v;
            if (b[v] > b[ib]) ib = v;
            if (a[v] > ma) ma = a[v];
            if (b[v] > mb) mb = b[v];
        }
        same += ia == ib;
        for (size_t v = 0; v < V; v++) sa += exp((double)a[v] - ma), sb += exp((double)b[v] - mb);
        double la = ma + log(sa), lb = mb + log(sb);
        for (size_t v = 0; v < V; v++) {
            double lpa = (double)a[v] - la, lpb = (double)b[v] - lb;
            kl += exp(lpa) * (lpa - lpb);
        }
    }
    ds->fp8_logit_max = mx;
    ds->fp8_logit_mean = sum / (double)(pr->rows * V);
    ds->fp8_kl = kl / (double)pr->rows;
    ds->fp8_top1 = (double)same / (double)pr->rows;
    if (mx > leg->fp8_logit_max) leg->fp8_logit_max = mx;
    double n = (double)leg->probes;
    leg->fp8_logit_mean = (leg->fp8_logit_mean * n + ds->fp8_logit_mean) / (n + 1);
    leg->fp8_kl = (leg->fp8_kl * n + ds->fp8_kl) / (n + 1);
    leg->fp8_top1 = (leg->fp8_top1 * n + ds->fp8_top1) / (n + 1);
    leg->probes++;
    return 0;
}

static int publish(trainer *t, demo_leg *leg, demo_step *ds)
{
    ferry_publish_info info;
    unsigned flags = t->o->full_sync ? FERRY_PUBLISH_ANCHOR : 0;
    int rc;
    if (t->quant && ds) {
        /* the BF16 patch of this step, measured beside the FP8 one */
        void *patch = NULL;
        size_t size = 0;
        if ((rc = ferry_diff(t->m_published, t->m_cast, NULL, &patch, &size))) return tfail("the BF16 patch of the step", rc);
        ferry_free(patch);
        ds->bf16_delta_bytes = size;
        leg->bf16_delta_total += size;
    }
    double t0 = demo_now_ms();
    uint64_t wall0 = demo_wall_ms();
    rc = ferry_publish_ex(t->pub, t->m_f32, flags, &info);
    if (rc) return tfail("publishing", rc);
    if (ds) {
        ds->pub_ms = demo_now_ms() - t0;
        ds->published = 1;
        ds->pub_version = info.version;
        ds->delta_bytes = info.delta_bytes;
        ds->anchor_bytes = info.full_bytes;
        ds->pub_wall_ms = wall0;
        ds->fresh_ms = -1;
    }
    t->version = info.version;
    if (info.version <= t->max_version) {
        t->pub_wall[info.version] = wall0;
        t->ver_step[info.version] = ds ? ds->step : UINT32_MAX;
        for (uint32_t i = 0; i < t->o->islands; i++)
            t->pub_pid[(size_t)info.version * t->o->islands + i] = t->sp ? (long)t->sp->pid[i] : 0;
    }
    if (t->quant && ds && (rc = probe_measure(t, leg, ds))) return tfail("the FP8 logits probe", rc);
    if (t->o->dump_dir) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s-trainer-v%" PRIu64 ".safetensors", t->o->dump_dir, t->run, info.version);
        if ((rc = ferry_model_save(t->m_cast, path))) return tfail(path, rc);
    }
    memcpy(t->published, t->cast, t->master.nparams * 2);
    leg->versions++;
    leg->delta_total += info.delta_bytes;
    if (info.kind == FERRY_SYNC_ANCHOR) {
        leg->anchors++;
        leg->anchor_total += info.full_bytes;
        if (!leg->full_bytes) leg->full_bytes = info.full_bytes;
        if (!t->quant && !leg->bf16_full_bytes) leg->bf16_full_bytes = info.full_bytes;
    }
    /* keep the store bounded: versions a reader can no longer need */
    if (info.version % 25 == 0) {
        ferry_gc_options g = {.keep = 2u * (t->o->anchor_every ? t->o->anchor_every : 10) + t->o->max_staleness + 2, .grace_s = -1,
                              .keys = t->sign};
        ferry_gc_report rep;
        if ((rc = ferry_gc(t->st, t->policy_run, &g, &rep))) return tfail("GC of old versions", rc);
    }
    return 0;
}

static int write_text(ferry_store *st, const char *run, const char *leaf, const char *text)
{
    char key[DEMO_KEY_MAX];
    demo_key(key, run, leaf);
    return ferry_store_put(st, key, text, strlen(text), NULL);
}

/* ======================================================================
 * One leg
 * ====================================================================== */
void demo_leg_release(demo_leg *leg)
{
    free(leg->steps);
    leg->steps = NULL;
}

/* The trainer's rings of a signed run: its signing key, and (the dock's)
 * each island's public key enrolled for that island plus the trainer's
 * signing key, which signs the dock's cursor. */
static int demo_trainer_keys(const demo_options *o, ferry_keys **sign, ferry_keys **enrolled)
{
    char path[4400];
    int rc = ferry_keys_create(sign);
    if (!rc) rc = ferry_keys_create(enrolled);
    snprintf(path, sizeof path, "%s/trainer.key", o->key_dir);
    if (!rc) rc = ferry_keys_set_signer(*sign, path, NULL);
    if (!rc) rc = ferry_keys_set_signer(*enrolled, path, NULL);
    for (uint32_t i = 0; !rc && i < o->islands; i++) {
        snprintf(path, sizeof path, "%s/island-%u.pub", o->key_dir, i);
        rc = ferry_keys_trust(*enrolled, path, i, NULL);
    }
    return rc;
}

int demo_run_leg(const demo_options *o, ferry_store *st, double adaptive, int quant, const char *name, demo_leg *leg)
{
    memset(leg, 0, sizeof *leg);
    snprintf(leg->name, sizeof leg->name, "%s", name);
    leg->adaptive = adaptive;
    leg->quant = quant;
    trainer t;
    memset(&t, 0, sizeof t);
    t.o = o;
    t.quant = quant;
    t.st = st;
    sup s;
    memset(&s, 0, sizeof s);
    s.o = o;
    s.n = o->islands;
    int rc, status = 1;
    double t_start = demo_now_ms();

    /* a fresh run id: runs never share objects */
    uint8_t rnd[4] = {0};
    FILE *ur = fopen("/dev/urandom", "rb");
    if (!ur || fread(rnd, 1, sizeof rnd, ur) != sizeof rnd) {
        uint32_t x = (uint32_t)getpid() ^ (uint32_t)demo_wall_ms();
        memcpy(rnd, &x, 4);
    }
    if (ur) fclose(ur);
    snprintf(t.run, sizeof t.run, "ferry-demo-%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2], rnd[3]);
    demo_policy_run(t.policy_run, t.run);
    s.url = o->store_url;
    s.run = t.run;
    s.policy_run = t.policy_run;

    if (!(leg->steps = calloc(o->steps ? o->steps : 1, sizeof *leg->steps)) || !(t.k = calloc(o->islands, sizeof *t.k)) ||
        !(t.traj_hash = XXH3_createState())) {
        tfail("alloc", FERRY_ERR_NOMEM);
        goto out;
    }
    XXH3_128bits_reset(t.traj_hash);
    t.sp = &s;
    t.max_version = (uint64_t)o->steps + 1;
    if (!(t.pub_wall = calloc(t.max_version + 1, sizeof *t.pub_wall)) ||
        !(t.pub_pid = calloc((t.max_version + 1) * o->islands, sizeof *t.pub_pid)) ||
        !(t.reach = calloc((t.max_version + 1) * o->islands, sizeof *t.reach)) ||
        !(t.ver_step = malloc((t.max_version + 1) * sizeof *t.ver_step))) {
        tfail("alloc", FERRY_ERR_NOMEM);
        goto out;
    }
    memset(t.ver_step, 0xff, (t.max_version + 1) * sizeof *t.ver_step);
    if ((rc = rl_policy_create(&t.master, &o->net))) {
        tfail("policy", rc);
        goto out;
    }
    if ((rc = rl_task_fits(&t.master, &o->task))) {
        tfail("the task does not fit the network", rc);
        goto out;
    }
    if (o->base_w) memcpy(t.master.w, o->base_w, t.master.nparams * sizeof *t.master.w);
    else rl_policy_init_weights(&t.master, o->seed);
    rl_adamw_config ac = rl_adamw_config_default();
    ac.lr = o->lr;
    ac.beta1 = o->beta1;
    ac.eps = o->eps;
    size_t n = t.master.nparams;
    if ((rc = rl_adamw_init(&t.adam, n, &ac))) {
        tfail("adamw", rc);
        goto out;
    }
    if (!(t.grad = malloc(n * sizeof *t.grad)) || !(t.cast = malloc(n * 2)) || !(t.published = malloc(n * 2))) {
        tfail("alloc", FERRY_ERR_NOMEM);
        goto out;
    }
    if ((rc = rl_policy_model_f32(&t.master, &t.m_f32)) || (rc = rl_policy_model_bf16(&t.master, t.cast, &t.m_cast)) ||
        (rc = rl_policy_model_bf16(&t.master, t.published, &t.m_published))) {
        tfail("model", rc);
        goto out;
    }

    /* the run's parameters, for the islands */
    demo_config cfg = {.mode = o->mode, .full_sync = o->full_sync, .islands = o->islands, .prompts = o->prompts,
                       .group = o->group, .queue = o->queue, .max_staleness = o->max_staleness, .seed = o->seed, .task = o->task, .net = o->net,
                       .quant = quant};
    char text[1024];
    if ((rc = demo_config_format(&cfg, text, sizeof text)) || (rc = write_text(st, t.run, "config", text))) {
        tfail("writing the run's config", rc);
        goto out;
    }

    /* version 1: the initial policy (an anchor) */
    /* signed run: versions signed with the trainer's key, batches admitted
     * only from the islands' enrolled keys */
    if (o->key_dir && (rc = demo_trainer_keys(o, &t.sign, &t.enrolled))) {
        tfail("keys", rc);
        goto out;
    }
    ferry_publisher_options po = {.publisher_id = "ferry-demo-trainer",
                                  .anchor_every = o->full_sync ? 1 : o->anchor_every,
                                  .cast_bf16 = 1, .keys = t.sign, .quantize = quant};
    if ((rc = ferry_publisher_open(st, t.policy_run, &po, &t.pub))) {
        tfail("publisher", rc);
        goto out;
    }
    rl_policy_cast_bf16(&t.master, t.cast);
    if (quant && (rc = checkpoint_bytes(t.m_cast, &leg->bf16_full_bytes))) {
        tfail("the size of a BF16 checkpoint", rc);
        goto out;
    }
    if (quant && (rc = probe_init(&t, &o->task))) {
        tfail("the FP8 logits probe", rc);
        goto out;
    }
    if (publish(&t, leg, NULL)) goto out;
    ferry_dock_options dopt = {.role = FERRY_DOCK_CONSUMER, .poll_ms = 2, .delete_rejected = 1, .keys = t.enrolled};
    if ((rc = ferry_dock_open(st, t.run, &dopt, &t.dock))) {
        tfail("dock", rc);
        goto out;
    }

    if (o->mirror_url && (s.mirror = spawn_mirror(&s)) < 0) {
        s.mirror = 0;
        fprintf(stderr, "ferry-demo: fork: %s\n", strerror(errno));
        goto out;
    }
    for (uint32_t i = 0; i < o->islands; i++) {
        if ((s.pid[i] = spawn(&s, i)) < 0) {
            s.pid[i] = 0;
            fprintf(stderr, "ferry-demo: fork: %s\n", strerror(errno));
            goto out;
        }
    }
    long pids[DEMO_MAX_ISLANDS];
    for (uint32_t i = 0; i < o->islands; i++) pids[i] = (long)s.pid[i];
    demo_print_leg_start(o, leg, t.run, n, pids);

    uint32_t since_publish = 0;
    for (uint32_t step = 0; step < o->steps; step++) {
        demo_step *ds = &leg->steps[step];
        memset(ds, 0, sizeof *ds);
        ds->step = step;
        ds->version = t.version;
        ds->fresh_ms = -1;
        double step_t0 = demo_now_ms();
        if (o->mode == DEMO_SEQUENTIAL) {
            char req[96];
            snprintf(req, sizeof req, "step %u version %" PRIu64 "\n", step, t.version);
            if ((rc = write_text(st, t.run, "control", req))) {
                tfail("writing the rollout request", rc);
                goto out;
            }
        }
        if (o->kill_at >= 0 && (long)step == o->kill_at) {
            demo_sleep_ms(30); /* let island 0 get busy with this step */
            kill_island(&s, leg, 0, step);
        }
        if (collect(&t, &s, leg, step, ds) || train(&t, ds)) goto out;
        for (size_t i = 0; i < t.nk; i++) {
            const kept *k = &t.k[i];
            leg->stale_hist[k->staleness < FERRY_DOCK_HIST ? k->staleness : FERRY_DOCK_HIST - 1]++;
            if (s.restarts[k->island] && k->put_ms >= s.restarted_wall_ms[k->island]) leg->restarted_batches++;
        }
        kept_clear(&t);
        read_status(&t, leg, step, &ds->sync_ms, &ds->wait_share);
        for (uint64_t v = t.version > 64 ? t.version - 64 : 2; v <= t.version; v++) update_fresh(&t, leg, v);
        ds->ver_fresh_ms = -1;
        for (uint64_t v = t.version; v >= 2 && v + 64 > t.version; v--) {
            uint32_t j = t.ver_step[v];
            if (j != UINT32_MAX && leg->steps[j].fresh_ms >= 0) {
                ds->ver_fresh_ms = leg->steps[j].fresh_ms;
                ds->fresh_version = v;
                break;
            }
        }

        rl_policy_cast_bf16(&t.master, t.cast);
        ds->changed = (double)count_changed(t.cast, t.published, n) / (double)n;
        since_publish++;
        if (adaptive <= 0 || ds->changed >= adaptive || since_publish >= o->max_skip) {
            if (publish(&t, leg, ds)) goto out;
            since_publish = 0;
        }
        ds->step_ms = demo_now_ms() - step_t0;
        ds->t_s = (demo_now_ms() - t_start) / 1e3;
        leg->nsteps = step + 1;
        leg->discarded += ds->discarded;
        demo_print_step(o, leg, ds);
    }
    status = 0;
out:
    /* islands that miss this die with us anyway (PR_SET_PDEATHSIG) */
    if (t.st && t.run[0]) (void)write_text(st, t.run, "control", "stop\n");
    stop_all(&s);
    if (s.mirror) {
        kill(s.mirror, SIGTERM);
        waitpid(s.mirror, NULL, 0);
        s.mirror = 0;
    }
    if (t.st && t.run[0]) read_status(&t, leg, o->steps, NULL, NULL); /* the islands' last words */
    if (t.reach) {
        for (uint64_t v = 2; v <= t.version && v <= t.max_version; v++) update_fresh(&t, leg, v);
        double sum = 0;
        for (size_t j = 0; j < leg->nsteps; j++) {
            double f = leg->steps[j].fresh_ms;
            if (!leg->steps[j].published || f < 0) continue;
            sum += f;
            leg->fresh_known++;
            if (f > leg->fresh_max_ms) leg->fresh_max_ms = f;
        }
        leg->fresh_mean_ms = leg->fresh_known ? sum / (double)leg->fresh_known : 0;
    }
    if (t.dock) {
        ferry_dock_stats ds, end;
        ferry_dock_get_stats(t.dock, &ds);
        leg->admitted = ds.admitted;
        leg->dropped = ds.dropped_stale;
        leg->duplicates = ds.duplicates;
        leg->rejected = ds.rejected_corrupt + ds.rejected_run + ds.rejected_future + ds.rejected_signature + ds.rejected_replay;
        /* batches sampled but never needed: dropped by a sweep as if the
         * trainer had moved past them, counted apart */
        ferry_dock_policy pol = {o->mode == DEMO_ASYNC ? FERRY_DOCK_ASYNC : FERRY_DOCK_SEQUENTIAL, o->max_staleness};
        if (ferry_dock_sweep(t.dock, &pol, t.version + o->max_staleness + 1) && !status) tfail("final sweep", 1);
        ferry_dock_get_stats(t.dock, &end);
        leg->leftover = end.dropped_stale - ds.dropped_stale;
    }
    leg->seconds = (demo_now_ms() - t_start) / 1e3;
    if (t.traj_hash) {
        XXH128_hash_t h = XXH3_128bits_digest(t.traj_hash);
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, h);
        hex16(leg->traj_hash, c.digest);
    }
    if (t.m_f32) {
        uint8_t mh[16];
        if (!ferry_model_hash(t.m_f32, mh)) hex16(leg->masters_hash, mh);
    }
    int w = leg->nsteps >= 20 ? 10 : (int)(leg->nsteps + 1) / 2;
    leg->window = w;
    double a = 0, b = 0;
    for (int i = 0; i < w && i < (int)leg->nsteps; i++) {
        a += leg->steps[i].reward;
        b += leg->steps[leg->nsteps - 1 - (size_t)i].reward;
    }
    leg->reward_first = w ? a / w : 0;
    leg->reward_last = w ? b / w : 0;
    trainer_release(&t);
    return status;
}
