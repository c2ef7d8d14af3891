/*
 * rl_train — the reference RL workload in one process: trainer and one
 * rollout island side by side, with ferry carrying the policy between them.
 *
 *   build/examples/rl_train [--steps 200] [--seed 1] [--json] …  (--help)
 *
 * Each step s:
 *   1. the trainer casts its FP32 masters to BF16 (version s), exactly as
 *      PyTorch would, and ferry_diff()s it against version s-1: the patch an
 *      island would fetch;
 *   2. the island applies that patch in place to the BF16 weights it holds
 *      (ferry_apply_inplace; --sync full copies the cast instead, the
 *      full-checkpoint baseline) and samples a batch of prompts × group
 *      completions with the BF16 values (rollout.h);
 *   3. the batch crosses to the trainer in its wire format (traj.h) and is
 *      parsed back, rewards re-verified against the task;
 *   4. the trainer recomputes log-probs with its FP32 masters, takes the
 *      GRPO gradient (grpo.h) and an AdamW step (adamw.h).
 * It prints per step the mean reward, the share of BF16 words that changed
 * since the previous version and the patch size against a full BF16
 * checkpoint.
 *
 * Uses only ferry's public API plus the examples/rl module; a later
 * ferry-demo (examples/rl/demo) puts a store between steps 1-2 and 3-4.
 *
 * Measured (2-core AMD EPYC VM shared with other jobs; mean reward per 20
 * steps; `rl_train --steps 300 --json`, defaults: reverse 6 digits,
 * 1,001,298 params, 16 prompts x 8 samples, lr 2e-4):
 *     steps     0-19  20-39 40-59 60-79 80-99 100- 120- 140- 160- 180- 200- 220- 240- 260- 280-
 *     seed 1    0.04  0.08  0.13  0.18  0.24  0.29 0.38 0.51 0.65 0.79 0.89 0.96 0.995 0.998 0.998
 *     seed 2    0.05  0.10  0.15  0.17  0.21  0.26 0.32 0.44 0.55 0.71 0.85 0.97 0.99
 *     lr 1e-4   0.04  0.06  0.08  0.11  0.13  0.15 0.18 0.22 0.25 0.28 0.32 0.38 0.45 0.52 0.61
 * Chance is 1/32 per token.  BF16 words changed per step: ~40% while
 * learning, falling to ~15% once most groups are solved (a group whose
 * rewards are all equal has zero advantage, so Adam's moments decay);
 * ferry patches 10-12% of a full BF16 checkpoint, 4.5% at the end (lr 1e-4:
 * ~28%, 7.7%).  Speed: 0.27-0.30 CPU s per step including ferry_diff and
 * apply (~3.3 steps/s on an idle core; 300 steps = 82-91 CPU s).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "args.h"
#include "adamw.h"
#include "ferry.h"
#include "grpo.h"
#include "policy.h"
#include "rollout.h"
#include "sft.h"
#include "task.h"
#include "traj.h"

/* ======================================================================
 * Options
 * ====================================================================== */
typedef struct opts {
    int steps, prompts, group, json, quiet, full_sync, level;
    uint64_t seed;
    rl_task task;
    rl_policy_config net;
    rl_adamw_config adam;
    rl_sft_config warmup;  /* steps 0: none */
    const char *init_path, *save_path;
} opts;

static void usage(FILE *f)
{
    rl_policy_config d = rl_policy_config_default();
    fprintf(f,
"usage: rl_train [options]\n"
"\n"
"Trains the reference policy with GRPO on a digit task in one process,\n"
"sampling with the BF16 weights an island would hold (synced by ferry\n"
"patches) and updating FP32 masters with AdamW.  Deterministic in --seed.\n"
"\n"
"run:\n"
"  --steps N             optimizer steps (default 200)\n"
"  --seed S              run seed (default 1): weights, prompts, samples\n"
"  --prompts-per-step P  prompts per step (default 16)\n"
"  --group-size G        completions per prompt (default 8)\n"
"  --sync patch|full     island weights by ferry_apply_inplace of each patch\n"
"                        (default) or by copying the full cast; trajectories\n"
"                        are bit-identical either way\n"
"  --level N             ferry_diff entropy level (default 0 = library default)\n"
"  --json                one JSON object per step (and a summary object)\n"
"  --init PATH           start from the FP32 weights in PATH (.safetensors, as\n"
"                        --save writes them) instead of seeded random ones;\n"
"                        names and shapes must match the network options\n"
"  --save PATH           write the final FP32 masters to PATH (.safetensors;\n"
"                        a pre-trained policy for --init here or in loco_train)\n"
"  --quiet               only the summary\n"
"  --warmup-steps N      first, N steps of supervised warm-up (sft.h) on the\n"
"                        task's answers: the pre-trained start (default 0)\n"
"  --warmup-lr X         its AdamW learning rate (default 1e-3)\n"
"  --warmup-prompts P    its prompts per step (default 64)\n"
"\n"
"task:\n"
"  --task reverse|copy|sort   (default reverse)\n"
"  --digits K            prompt length = completion length (default 6)\n"
"\n"
"network (MLP over a window of 2*digits-1 slots, with mixing heads):\n"
"  --vocab V             tokens (default %u; >= 11)\n"
"  --embed E             embedding width (default %u)\n"
"  --heads A             positional mixing heads, 1..%d (default %u)\n"
"  --dim H               hidden width (default %u)\n"
"  --layers L            hidden layers, 1..%d (default %u)\n"
"\n"
"optimizer (AdamW, PyTorch semantics):\n"
"  --lr X                learning rate (default %g)\n"
"  --beta1 X --beta2 X   (defaults 0.9, 0.999)\n"
"  --eps X               (default 1e-8)\n"
"  --wd X                decoupled weight decay (default 0)\n",
            d.vocab, d.embed, RL_MAX_HEADS, d.heads, d.hidden, RL_MAX_LAYERS, d.layers, (double)RL_ADAMW_DEFAULT_LR);
}

/* 0: run, 1: --help, -1: bad command line. */
static int parse_args(int argc, char **argv, opts *o)
{
    *o = (opts){.steps = 200, .prompts = 16, .group = 8, .seed = 1,
                .task = rl_task_default(), .net = rl_policy_config_default(),
                .adam = rl_adamw_config_default(),
                .warmup = {.steps = 0, .prompts = 64, .adam = rl_adamw_config_default()}};
    o->warmup.adam.lr = 1e-3f;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0, takes = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        else if (!strcmp(a, "--json")) { o->json = 1; takes = 0; }
        else if (!strcmp(a, "--quiet")) { o->quiet = 1; takes = 0; }
        else if (!v) bad = 1;
        else if (!strcmp(a, "--steps")) bad = rl_arg_int(v, 0, 10000000, &o->steps);
        else if (!strcmp(a, "--seed")) bad = rl_arg_u64(v, &o->seed);
        else if (!strcmp(a, "--prompts-per-step")) bad = rl_arg_int(v, 1, 65536, &o->prompts);
        else if (!strcmp(a, "--group-size")) bad = rl_arg_int(v, 1, 1024, &o->group);
        else if (!strcmp(a, "--sync")) {
            if (!strcmp(v, "full")) o->full_sync = 1;
            else if (!strcmp(v, "patch")) o->full_sync = 0;
            else bad = 1;
        }
        else if (!strcmp(a, "--level")) bad = rl_arg_int(v, 0, 19, &o->level);
        else if (!strcmp(a, "--init")) o->init_path = v;
        else if (!strcmp(a, "--warmup-steps")) bad = rl_arg_u32(v, 0, 1000000, &o->warmup.steps);
        else if (!strcmp(a, "--warmup-lr")) bad = rl_arg_float(v, &o->warmup.adam.lr);
        else if (!strcmp(a, "--warmup-prompts")) bad = rl_arg_u32(v, 1, 65536, &o->warmup.prompts);
        else if (!strcmp(a, "--save")) o->save_path = v;
        else if (!rl_arg_common(a, v, &o->task, &o->net, &o->adam, &bad)) bad = 1;
        if (bad) {
            fprintf(stderr, "rl_train: bad option or value: %s%s%s\n", a, v && takes ? " " : "",
                    v && takes ? v : "");
            return -1;
        }
        i += takes;
    }
    /* The window covers the longest context: prompt + completion - 1. */
    o->net.window = rl_policy_config_for_task(&o->task).window;
    return 0;
}

/* ======================================================================
 * Helpers
 * ====================================================================== */
static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* CPU seconds of this process: the honest speed on a shared machine,
 * where wall time includes everyone else's work. */
static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "rl_train: %s: %s (%s)\n", what, rl_strerror(rc), ferry_last_error());
    return 1;
}

static uint64_t count_changed(const uint16_t *a, const uint16_t *b, size_t n)
{
    uint64_t c = 0;
    for (size_t i = 0; i < n; i++) c += a[i] != b[i];
    return c;
}

/* ======================================================================
 * The run
 * ====================================================================== */
typedef struct run {
    rl_policy master;      /* trainer: FP32 masters */
    rl_policy island;      /* island: FP32 values of the BF16 weights */
    rl_adamw adam;
    rl_work ws_train, ws_roll;
    float *grad;
    uint16_t *bf[2];       /* trainer's BF16 casts, ping-pong: [cur], [prev] */
    uint16_t *held;        /* the island's BF16 weights */
    ferry_model *m[2], *m_held;
    unsigned char *wire;
    size_t wire_cap;
    int apply_fallbacks;   /* patches ferry_apply_inplace refused */
} run;

static void run_release(run *r)
{
    rl_policy_release(&r->master);
    rl_policy_release(&r->island);
    rl_adamw_release(&r->adam);
    rl_work_release(&r->ws_train);
    rl_work_release(&r->ws_roll);
    free(r->grad);
    for (int i = 0; i < 2; i++) {
        ferry_model_free(r->m[i]);
        free(r->bf[i]);
    }
    ferry_model_free(r->m_held);
    free(r->held);
    free(r->wire);
}

/* The island applies a patch to the BF16 weights it holds.  In place when
 * the library allows it; ferry_apply_inplace refuses patches that carry a
 * tensor whole (the codec's choice when most of a small tensor changed,
 * e.g. head.bias) with FERRY_ERR_SHAPE_MISMATCH, so then apply out of
 * place and copy the result back. */
static int island_apply(run *r, const void *patch, size_t size)
{
    int rc = ferry_apply_inplace(r->m_held, patch, size);
    if (rc != FERRY_ERR_SHAPE_MISMATCH) return rc;
    ferry_model *out;
    if ((rc = ferry_apply(r->m_held, patch, size, &out))) return rc;
    rc = rl_policy_bf16_from_model(&r->island, out, r->held);
    ferry_model_free(out);
    r->apply_fallbacks++;
    return rc;
}

static int run_setup(run *r, const opts *o)
{
    int rc;
    memset(r, 0, sizeof *r);
    if ((rc = rl_policy_create(&r->master, &o->net)) || (rc = rl_policy_create(&r->island, &o->net)))
        return fail("policy", rc);
    if ((rc = rl_task_fits(&r->master, &o->task))) return fail("task does not fit the network", rc);
    rl_policy_init_weights(&r->master, o->seed);
    if (o->init_path) {
        char err[1024];
        if ((rc = rl_policy_load_file(&r->master, o->init_path, err, sizeof err, NULL))) {
            fprintf(stderr, "rl_train: --init: %s\n", err);
            return 1;
        }
    }
    if (o->warmup.steps) {
        double loss = 0, t0 = now_ms();
        if ((rc = rl_sft_run(&r->master, &o->task, o->seed, &o->warmup, &loss))) return fail("warm-up", rc);
        fprintf(stderr, "rl_train: warm-up: %u steps in %.1f s, last loss %.4f\n", o->warmup.steps,
                (now_ms() - t0) / 1e3, loss);
    }
    if ((rc = rl_adamw_init(&r->adam, r->master.nparams, &o->adam))) return fail("adamw", rc);
    size_t n = r->master.nparams;
    r->grad = malloc(n * sizeof *r->grad);
    r->bf[0] = malloc(n * 2);
    r->bf[1] = malloc(n * 2);
    r->held = malloc(n * 2);
    if (!r->grad || !r->bf[0] || !r->bf[1] || !r->held) return fail("alloc", FERRY_ERR_NOMEM);
    for (int i = 0; i < 2; i++)
        if ((rc = rl_policy_model_bf16(&r->master, r->bf[i], &r->m[i]))) return fail("model", rc);
    if ((rc = rl_policy_model_bf16(&r->master, r->held, &r->m_held))) return fail("model", rc);
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    int pa = parse_args(argc, argv, &o);
    if (pa) {
        usage(pa > 0 ? stdout : stderr);
        return pa > 0 ? 0 : 2;
    }
    run r;
    int rc, status = 1;
    if (run_setup(&r, &o)) goto out;
    size_t n = r.master.nparams;
    uint64_t full_bytes = (uint64_t)n * 2;
    if (!o.json)
        printf("rl_train: task %s/%u digits, %zu params (vocab %u, window %u, embed %u, %u heads, "
               "%u x %u hidden), %d prompts x %d samples/step, lr %g, seed %" PRIu64 ", sync %s\n",
               rl_task_name(o.task.kind), o.task.prompt_len, n, o.net.vocab, o.net.window,
               o.net.embed, o.net.heads, o.net.layers, o.net.hidden, o.prompts, o.group, (double)o.adam.lr,
               o.seed, o.full_sync ? "full" : "patch");
    else
        printf("{\"event\":\"start\",\"task\":\"%s\",\"digits\":%u,\"params\":%zu,\"vocab\":%u,"
               "\"window\":%u,\"embed\":%u,\"heads\":%u,\"hidden\":%u,\"layers\":%u,"
               "\"prompts\":%d,\"group\":%d,\"lr\":%g,\"seed\":%" PRIu64 ",\"sync\":\"%s\"}\n",
               rl_task_name(o.task.kind), o.task.prompt_len, n, o.net.vocab, o.net.window,
               o.net.embed, o.net.heads, o.net.hidden, o.net.layers, o.prompts, o.group, (double)o.adam.lr,
               o.seed, o.full_sync ? "full" : "patch");
    if (!o.json && !o.quiet)
        printf("%5s %7s %8s %11s %11s %7s %7s %7s %7s\n", "step", "reward", "changed%",
               "patch_B", "full_B", "ratio", "enc_ms", "app_ms", "step_ms");

    double t_start = now_ms(), cpu_start = cpu_s(), first_sum = 0, last_sum = 0;
    int first_n = 0, last_n = 0, window = o.steps >= 20 ? 10 : (o.steps + 1) / 2;
    uint64_t patch_total = 0, changed_total = 0;
    for (int step = 0; step < o.steps; step++) {
        double t0 = now_ms();
        /* 1. version `step` of the policy as BF16, and the patch from the last. */
        uint16_t *cur = r.bf[step & 1], *prev = r.bf[(step & 1) ^ 1];
        ferry_model *mcur = r.m[step & 1], *mprev = r.m[(step & 1) ^ 1];
        rl_policy_cast_bf16(&r.master, cur);
        void *patch = NULL;
        size_t psize = 0;
        uint64_t changed = 0;
        double enc_ms = 0, app_ms = 0;
        if (step > 0) {
            ferry_diff_options dopt = {.level = o.level};
            double te = now_ms();
            if ((rc = ferry_diff(mprev, mcur, &dopt, &patch, &psize))) {
                fail("ferry_diff", rc);
                goto out;
            }
            enc_ms = now_ms() - te;
            changed = count_changed(prev, cur, n);
        }
        /* 2. the island syncs: a full copy at version 0 (or always, with
         * --sync full), the patch otherwise. */
        double ta = now_ms();
        if (step == 0 || o.full_sync) {
            memcpy(r.held, cur, n * 2);
        } else if ((rc = island_apply(&r, patch, psize))) {
            ferry_free(patch);
            fail("apply", rc);
            goto out;
        }
        app_ms = now_ms() - ta;
        ferry_free(patch);
        if (memcmp(r.held, cur, n * 2)) {
            fprintf(stderr, "rl_train: step %d: island weights differ from the trainer's cast\n", step);
            goto out;
        }
        rl_policy_set_bf16(&r.island, r.held);

        /* 2b. rollouts with the island's weights. */
        rl_rollout_args ra = {.seed = o.seed, .step = (uint64_t)step, .version = (uint64_t)step,
                              .first_prompt = 0, .n_prompts = (uint32_t)o.prompts,
                              .group = (uint32_t)o.group};
        rl_batch sent, got;
        if ((rc = rl_rollout(&r.island, &o.task, &ra, &r.ws_roll, &sent))) {
            fail("rollout", rc);
            goto out;
        }
        /* 3. through the wire format, as from a store. */
        size_t need = rl_batch_wire_size(&sent), wlen = 0;
        if (need > r.wire_cap) {
            unsigned char *w = realloc(r.wire, need);
            if (!w) {
                rl_batch_release(&sent);
                fail("alloc", FERRY_ERR_NOMEM);
                goto out;
            }
            r.wire = w;
            r.wire_cap = need;
        }
        rc = rl_batch_serialize(&sent, r.wire, r.wire_cap, &wlen);
        rl_batch_release(&sent);
        char err[160];
        if (rc || (rc = rl_batch_parse(r.wire, wlen, &got, err, sizeof err)) ||
            (rc = rl_batch_verify_rewards(&got, &o.task))) {
            fprintf(stderr, "rl_train: batch: %s %s\n", rl_strerror(rc), err);
            goto out;
        }
        if (got.version != (uint64_t)step) { /* the trainer's staleness check */
            fprintf(stderr, "rl_train: batch of version %" PRIu64 " at step %d\n", got.version, step);
            rl_batch_release(&got);
            goto out;
        }

        /* 4. GRPO gradient on the FP32 masters, AdamW step. */
        rl_grpo_stats st;
        rc = rl_grpo_grad(&r.master, &got, &r.ws_train, r.grad, &st);
        rl_batch_release(&got);
        if (rc) {
            fail("grpo", rc);
            goto out;
        }
        rl_adamw_step(&r.adam, r.master.w, r.grad);
        double step_ms = now_ms() - t0;

        double reward = st.reward_sum / (double)st.completions;
        if (step < window) first_sum += reward, first_n++;
        if (step >= o.steps - window) last_sum += reward, last_n++;
        patch_total += psize;
        changed_total += changed;
        double chg_pct = step ? 100.0 * (double)changed / (double)n : 0.0;
        if (o.json)
            printf("{\"step\":%d,\"version\":%d,\"reward\":%.4f,\"loss\":%.6f,\"changed\":%" PRIu64
                   ",\"changed_pct\":%.3f,\"patch_bytes\":%zu,\"full_bytes\":%" PRIu64
                   ",\"flat_groups\":%" PRIu64 ",\"encode_ms\":%.2f,\"apply_ms\":%.2f,"
                   "\"step_ms\":%.1f}\n",
                   step, step, reward, st.loss, changed, chg_pct, psize, full_bytes,
                   st.flat_groups, enc_ms, app_ms, step_ms);
        else if (!o.quiet)
            printf("%5d %7.4f %8.3f %11zu %11" PRIu64 " %7.4f %7.1f %7.1f %7.1f\n", step, reward,
                   chg_pct, psize, full_bytes, step ? (double)psize / (double)full_bytes : 0.0,
                   enc_ms, app_ms, step_ms);
        fflush(stdout);
    }
    double secs = (now_ms() - t_start) / 1e3, cpu = cpu_s() - cpu_start;
    double first = first_n ? first_sum / first_n : 0, last = last_n ? last_sum / last_n : 0;
    double ratio = o.steps > 1 ? (double)patch_total / ((double)full_bytes * (o.steps - 1)) : 0;
    double chg = o.steps > 1 ? 100.0 * (double)changed_total / ((double)n * (o.steps - 1)) : 0;
    if (o.json)
        printf("{\"event\":\"summary\",\"steps\":%d,\"seconds\":%.2f,\"cpu_seconds\":%.2f,"
               "\"steps_per_s\":%.3f,\"reward_first\":%.4f,\"reward_last\":%.4f,\"window\":%d,"
               "\"changed_pct\":%.3f,\"patch_bytes_total\":%" PRIu64 ",\"patch_over_full\":%.4f,"
               "\"apply_fallbacks\":%d}\n",
               o.steps, secs, cpu, secs > 0 ? o.steps / secs : 0, first, last, window, chg,
               patch_total, ratio, r.apply_fallbacks);
    else
        printf("rl_train: %d steps in %.1f s (%.1f s CPU; %.2f steps/s); mean reward first %d "
               "steps %.4f, last %d steps %.4f; BF16 changed %.2f%%/step; patches %.1f%% of full "
               "checkpoints\n",
               o.steps, secs, cpu, secs > 0 ? o.steps / secs : 0, window, first, window, last, chg,
               100 * ratio);
    if (o.save_path) {
        char sv[4][40], err[1024];
        snprintf(sv[0], sizeof sv[0], "%d", o.steps);
        snprintf(sv[1], sizeof sv[1], "%g", (double)o.adam.lr);
        snprintf(sv[2], sizeof sv[2], "%" PRIu64, o.seed);
        snprintf(sv[3], sizeof sv[3], "%.4f", last);
        const char *meta[] = {"rl.trainer", "rl_train", "rl.steps", sv[0], "rl.lr", sv[1], "rl.seed", sv[2],
                              "rl.task", rl_task_name(o.task.kind), "rl.reward_last_window", sv[3],
                              "rl.init", o.init_path ? "file" : "seed", NULL};
        if ((rc = rl_policy_save_file(&r.master, o.save_path, meta, err, sizeof err))) {
            fprintf(stderr, "rl_train: --save: %s\n", err);
            goto out;
        }
        if (!o.json) printf("rl_train: saved the FP32 masters to %s\n", o.save_path);
    }
    if (r.apply_fallbacks && !o.json)
        printf("rl_train: %d patches carried a tensor whole, which ferry_apply_inplace refuses; "
               "applied out of place instead\n", r.apply_fallbacks);
    status = 0;
out:
    run_release(&r);
    return status;
}
