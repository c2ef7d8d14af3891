/*
 * loco_train — the reference RL workload trained by R trainers that
 * synchronise over MPI (include/ferry_loco.h):
 *
 *   mpirun -np R build/examples/loco_train --mode pulseloco|diloco|ddp \
 *          --h H --rounds N [--seed S] [--json] [--publish-dir DIR] …   (--help)
 *
 * Every rank is one trainer with its own rollouts.  A round is H steps; each
 * step t = round·H + h a rank:
 *   1. casts its FP32 weights to BF16 and samples P prompts × G completions
 *      with those values (as its rollout engine would; rollout.h).  Rank r
 *      draws prompts r·P … r·P+P−1 of step t: the streams are a pure
 *      function of (seed, rank, step), disjoint between ranks, and R ranks
 *      with P prompts each see exactly the batch one process with R·P
 *      prompts would;
 *   2. takes the GRPO gradient on its FP32 weights (grpo.h);
 *   3. pulseloco, diloco: an AdamW step on its local weights;
 *      ddp: averages the gradient over ranks (ferry_loco_mean, dense,
 *      rank-ordered, so every rank gets the same bits), then the AdamW step
 *      (identical on every rank).
 * After the H steps: pulseloco and diloco call ferry_loco_sync (gate or
 * dense pseudo-gradient, exchange, rank-ordered mean, Nesterov outer step,
 * cross-rank hash check; local weights reset to the new global ones); ddp
 * calls ferry_loco_check.  Any rank holding different weights fails the
 * round on every rank: the program names the round and the ranks and exits
 * non-zero.  AdamW moments stay local to each rank across rounds (DiLoCo's
 * inner optimizer state).
 *
 * Rank 0 prints per round the mean reward over every rank's completions of
 * the round, the bytes the ranks sent (this round and cumulative), the
 * share of entries PULSELoCo's gate let through, and the hash all ranks
 * agreed on ("hash-agree R/R").  --publish-dir DIR writes the BF16 cast of
 * the global weights after each round as DIR/round-NNNNNN.safetensors
 * (rank 0, ferry_model_save): the checkpoint islands get through the sync
 * layer, which can publish from there.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "args.h"
#include "adamw.h"
#include "ferry.h"
#include "ferry_loco.h"
#include "grpo.h"
#include "policy.h"
#include "rollout.h"
#include "task.h"

/* ======================================================================
 * Options
 * ====================================================================== */
typedef struct opts {
    ferry_loco_mode mode;
    int h, rounds, prompts, group, json, quiet, level, gate, values;
    uint64_t seed;
    rl_task task;
    rl_policy_config net;
    rl_adamw_config adam;
    ferry_loco_outer outer;
    const char *publish_dir, *init_path, *save_path;
} opts;

static const char *mode_name(ferry_loco_mode m)
{
    return m == FERRY_LOCO_PULSE ? "pulseloco" : m == FERRY_LOCO_DILOCO ? "diloco" : "ddp";
}

static void usage(FILE *f)
{
    rl_policy_config d = rl_policy_config_default();
    fprintf(f,
"usage: mpirun -np R loco_train [options]\n"
"\n"
"Trains the reference policy (GRPO on a digit task) with R trainers that\n"
"synchronise over MPI: PULSELoCo (sparse BF16-gated pseudo-gradients with\n"
"error feedback), DiLoCo (dense pseudo-gradients) or DDP (gradient mean\n"
"every step).  Deterministic in --seed and R; every rank must hold the same\n"
"weights after every round, or the run fails.\n"
"\n"
"sync:\n"
"  --mode pulseloco|diloco|ddp   (default pulseloco)\n"
"  --h H                 local steps per round (default 8)\n"
"  --rounds N            rounds (default 25)\n"
"  --outer-lr X          outer SGD learning rate (default 0.7)\n"
"  --outer-momentum X    outer momentum (default 0.9)\n"
"  --no-nesterov         plain momentum instead of Nesterov\n"
"  --gate outer|sent     PULSELoCo's gate (default outer): gate each rank's\n"
"                        outer-step update by the BF16 change it makes, the\n"
"                        global step the mean of what was sent; or gate the\n"
"                        pseudo-gradient as sent, the outer step on the mean\n"
"  --values cell|fp32    PULSELoCo's sent values (default cell): integer\n"
"                        multiples of half the weight's BF16 cell, the\n"
"                        rounding error kept in the residual; or exact FP32\n"
"  --level N             zstd level of PULSELoCo payloads (default 1)\n"
"  --publish-dir DIR     rank 0 writes DIR/round-NNNNNN.safetensors, the BF16\n"
"                        cast of the global weights after each round\n"
"\n"
"run:\n"
"  --seed S              run seed (default 1): weights, prompts, samples\n"
"  --init PATH           start from the weights in PATH (.safetensors, F32, as\n"
"                        written by --save or rl_train --save: a pre-trained\n"
"                        policy to fine-tune) instead of seeded random ones;\n"
"                        every rank reads it; names and shapes must match the\n"
"                        network options; AdamW and outer state start fresh\n"
"  --save PATH           rank 0 writes the final global FP32 weights to PATH\n"
"  --prompts-per-step P  prompts per step and rank (default 16)\n"
"  --group-size G        completions per prompt (default 8)\n"
"  --json                one JSON object per round (and start/summary)\n"
"  --quiet               only the summary\n"
"\n"
"task:\n"
"  --task reverse|copy|sort   (default reverse)\n"
"  --digits K            prompt length = completion length (default 6)\n"
"\n"
"network:\n"
"  --vocab V --embed E --heads A --dim H --layers L\n"
"                        (defaults %u, %u, %u, %u, %u: 1.0M parameters)\n"
"\n"
"inner optimizer (AdamW, local to each rank):\n"
"  --lr X                (default %g)\n"
"  --beta1 X --beta2 X --eps X --wd X   (0.9, 0.999, 1e-8, 0)\n",
            d.vocab, d.embed, d.heads, d.hidden, d.layers, (double)RL_ADAMW_DEFAULT_LR);
}

/* 0: run, 1: --help, -1: bad command line (message printed). */
static int parse_args(int argc, char **argv, opts *o)
{
    *o = (opts){.mode = FERRY_LOCO_PULSE, .h = 8, .rounds = 25, .prompts = 16, .group = 8,
                .level = 1, .seed = 1, .task = rl_task_default(),
                .net = rl_policy_config_default(), .adam = rl_adamw_config_default(),
                .outer = ferry_loco_outer_default(), .gate = ferry_loco_config_default().gate,
                .values = ferry_loco_config_default().values};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0, takes = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        else if (!strcmp(a, "--json")) { o->json = 1; takes = 0; }
        else if (!strcmp(a, "--quiet")) { o->quiet = 1; takes = 0; }
        else if (!strcmp(a, "--no-nesterov")) { o->outer.nesterov = 0; takes = 0; }
        else if (!v) bad = 1;
        else if (!strcmp(a, "--mode")) {
            if (!strcmp(v, "pulseloco") || !strcmp(v, "pulse")) o->mode = FERRY_LOCO_PULSE;
            else if (!strcmp(v, "diloco")) o->mode = FERRY_LOCO_DILOCO;
            else if (!strcmp(v, "ddp")) o->mode = FERRY_LOCO_DDP;
            else bad = 1;
        }
        else if (!strcmp(a, "--gate")) {
            if (!strcmp(v, "outer")) o->gate = FERRY_LOCO_GATE_OUTER;
            else if (!strcmp(v, "sent")) o->gate = FERRY_LOCO_GATE_SENT;
            else bad = 1;
        }
        else if (!strcmp(a, "--values")) {
            if (!strcmp(v, "cell")) o->values = FERRY_LOCO_VALUES_CELL;
            else if (!strcmp(v, "fp32")) o->values = FERRY_LOCO_VALUES_FP32;
            else bad = 1;
        }
        else if (!strcmp(a, "--h")) bad = rl_arg_int(v, 1, 1000000, &o->h);
        else if (!strcmp(a, "--rounds")) bad = rl_arg_int(v, 0, 10000000, &o->rounds);
        else if (!strcmp(a, "--outer-lr")) bad = rl_arg_float(v, &o->outer.lr);
        else if (!strcmp(a, "--outer-momentum")) bad = rl_arg_float(v, &o->outer.momentum);
        else if (!strcmp(a, "--level")) bad = rl_arg_int(v, 1, 19, &o->level);
        else if (!strcmp(a, "--publish-dir")) o->publish_dir = v;
        else if (!strcmp(a, "--init")) o->init_path = v;
        else if (!strcmp(a, "--save")) o->save_path = v;
        else if (!strcmp(a, "--seed")) bad = rl_arg_u64(v, &o->seed);
        else if (!strcmp(a, "--prompts-per-step")) bad = rl_arg_int(v, 1, 65536, &o->prompts);
        else if (!strcmp(a, "--group-size")) bad = rl_arg_int(v, 1, 1024, &o->group);
        else if (!rl_arg_common(a, v, &o->task, &o->net, &o->adam, &bad)) bad = 1;
        if (bad) {
            fprintf(stderr, "loco_train: bad option or value: %s%s%s\n", a, v && takes ? " " : "",
                    v && takes ? v : "");
            return -1;
        }
        i += takes;
    }
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

static void hex16(const uint8_t h[16], char out[33])
{
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", h[i]);
}

/* Fails loudly: names the rank and the round, and takes the whole job down
 * (a rank that stops while the others wait in a collective would hang). */
static _Noreturn void die(int rank, long long round, const char *what, int rc)
{
    fprintf(stderr, "loco_train: rank %d, round %lld: %s: %s (%s)\n", rank, round, what,
            rl_strerror(rc), ferry_last_error());
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1); /* not reached */
}

/* ======================================================================
 * One trainer
 * ====================================================================== */
typedef struct trainer {
    rl_policy w;       /* this rank's FP32 weights (local; global after a sync) */
    rl_policy roll;    /* the exact values of their BF16 cast, for rollouts */
    rl_adamw adam;
    rl_work ws_train, ws_roll;
    float *grad;
    uint16_t *bf16;
} trainer;

static void trainer_release(trainer *t)
{
    rl_policy_release(&t->w);
    rl_policy_release(&t->roll);
    rl_adamw_release(&t->adam);
    rl_work_release(&t->ws_train);
    rl_work_release(&t->ws_roll);
    free(t->grad);
    free(t->bf16);
}

/* err receives a message for failures worth more than a code (--init). */
static int trainer_setup(trainer *t, const opts *o, char *err, size_t errlen)
{
    int rc;
    memset(t, 0, sizeof *t);
    if ((rc = rl_policy_create(&t->w, &o->net)) || (rc = rl_policy_create(&t->roll, &o->net)))
        return rc;
    if ((rc = rl_task_fits(&t->w, &o->task))) return rc;
    rl_policy_init_weights(&t->w, o->seed); /* the same on every rank */
    if (o->init_path && (rc = rl_policy_load_file(&t->w, o->init_path, err, errlen, NULL))) return rc;
    if ((rc = rl_adamw_init(&t->adam, t->w.nparams, &o->adam))) return rc;
    t->grad = malloc(t->w.nparams * sizeof *t->grad);
    t->bf16 = malloc(t->w.nparams * sizeof *t->bf16);
    return t->grad && t->bf16 ? 0 : FERRY_ERR_NOMEM;
}

/* Step t of this rank: rollouts with the BF16 cast, GRPO gradient into
 * t->grad.  Adds the batch's rewards and completions to *st. */
static int trainer_grad(trainer *t, const opts *o, int rank, uint64_t step, rl_grpo_stats *st)
{
    rl_policy_cast_bf16(&t->w, t->bf16);
    rl_policy_set_bf16(&t->roll, t->bf16);
    rl_rollout_args ra = {.seed = o->seed, .step = step, .version = step,
                          .first_prompt = (uint32_t)rank * (uint32_t)o->prompts,
                          .n_prompts = (uint32_t)o->prompts, .group = (uint32_t)o->group};
    rl_batch b;
    int rc = rl_rollout(&t->roll, &o->task, &ra, &t->ws_roll, &b);
    if (rc) return rc;
    rl_grpo_stats s;
    rc = rl_grpo_grad(&t->w, &b, &t->ws_train, t->grad, &s);
    rl_batch_release(&b);
    if (rc) return rc;
    st->reward_sum += s.reward_sum;
    st->completions += s.completions;
    return 0;
}

/* rank 0: DIR/round-NNNNNN.safetensors, the BF16 cast of the global
 * weights, with the round, mode and FP32 hash as metadata. */
static int publish(trainer *t, const opts *o, uint64_t round, const uint8_t hash[16])
{
    char path[4096], v[64], hx[33];
    if (mkdir(o->publish_dir, 0777) && errno != EEXIST) {
        fprintf(stderr, "loco_train: mkdir %s: %s\n", o->publish_dir, strerror(errno));
        return FERRY_ERR_IO;
    }
    rl_policy_cast_bf16(&t->w, t->bf16);
    ferry_model *m;
    int rc = rl_policy_model_bf16(&t->w, t->bf16, &m);
    if (rc) return rc;
    snprintf(v, sizeof v, "%" PRIu64, round);
    hex16(hash, hx);
    if (!(rc = ferry_model_set_metadata(m, "loco.round", v)) &&
        !(rc = ferry_model_set_metadata(m, "loco.mode", mode_name(o->mode))) &&
        !(rc = ferry_model_set_metadata(m, "loco.fp32_xxh3_128", hx))) {
        snprintf(path, sizeof path, "%s/round-%06" PRIu64 ".safetensors", o->publish_dir, round);
        rc = ferry_model_save(m, path);
    }
    ferry_model_free(m);
    return rc;
}

/* ======================================================================
 * The run
 * ====================================================================== */
int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    opts o;
    int pa = parse_args(argc, argv, &o);
    if (pa) {
        if (rank == 0) usage(pa > 0 ? stdout : stderr);
        MPI_Finalize();
        return pa > 0 ? 0 : 2;
    }
    trainer t;
    char err[1024] = "";
    int rc = trainer_setup(&t, &o, err, sizeof err);
    /* A setup failure (an --init file missing or of another network) is
     * the same on every rank as a rule: report it once per failing rank
     * and leave cleanly rather than through MPI_Abort. */
    int any = rc != 0, all_any = 0;
    MPI_Allreduce(&any, &all_any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (all_any) {
        if (rc && err[0]) fprintf(stderr, "loco_train: rank %d: --init: %s\n", rank, err);
        else if (rc) fprintf(stderr, "loco_train: rank %d: setup: %s\n", rank, rl_strerror(rc));
        trainer_release(&t);
        MPI_Finalize();
        return 1;
    }
    uint8_t init_hash[16];
    char init_hx[33];
    ferry_loco_hash(t.w.w, t.w.nparams, init_hash);
    hex16(init_hash, init_hx);
    uint64_t n = t.w.nparams;
    ferry_loco_config cfg = {.mode = o.mode, .outer = o.outer, .level = o.level, .gate = o.gate,
                             .values = o.values};
    ferry_loco *lc;
    if ((rc = ferry_loco_create(MPI_COMM_WORLD, t.w.w, n, &cfg, &lc))) die(rank, -1, "ferry_loco_create", rc);

    int out = rank == 0;
    if (out && o.json)
        printf("{\"event\":\"start\",\"mode\":\"%s\",\"ranks\":%d,\"h\":%d,\"rounds\":%d,\"params\":%" PRIu64
               ",\"task\":\"%s\",\"digits\":%u,\"dim\":%u,\"layers\":%u,\"prompts_per_rank\":%d,\"group\":%d,"
               "\"lr\":%g,\"outer_lr\":%g,\"outer_momentum\":%g,\"nesterov\":%d,\"gate\":\"%s\",\"values\":\"%s\","
               "\"seed\":%" PRIu64 ",\"init\":\"%s\",\"init_hash\":\"%s\"}\n",
               mode_name(o.mode), nranks, o.h, o.rounds, n, rl_task_name(o.task.kind),
               o.task.prompt_len, o.net.hidden, o.net.layers, o.prompts, o.group, (double)o.adam.lr,
               (double)o.outer.lr, (double)o.outer.momentum, o.outer.nesterov,
               o.gate == FERRY_LOCO_GATE_OUTER ? "outer" : "sent", o.values == FERRY_LOCO_VALUES_CELL ? "cell" : "fp32",
               o.seed, o.init_path ? "file" : "seed", init_hx);
    else if (out)
        printf("loco_train: %s, %d ranks, H %d, %d rounds; %" PRIu64 " params (%s/%u digits, %u x %u hidden); "
               "%d prompts x %d samples per step and rank; lr %g, outer lr %g momentum %g%s; seed %" PRIu64 "\n",
               mode_name(o.mode), nranks, o.h, o.rounds, n, rl_task_name(o.task.kind),
               o.task.prompt_len, o.net.layers, o.net.hidden, o.prompts, o.group, (double)o.adam.lr,
               (double)o.outer.lr, (double)o.outer.momentum, o.outer.nesterov ? " (Nesterov)" : "",
               o.seed);
    if (out && !o.json)
        printf("loco_train: initial weights %s %s\n", o.init_path ? o.init_path : "from --seed", init_hx);
    if (out && !o.json && !o.quiet)
        printf("%5s %7s %7s %12s %14s %7s  %s\n", "round", "steps", "reward", "bytes", "bytes_cum",
               "gated%", "weights");
    fflush(stdout);

    double t_start = now_ms(), last_sum = 0, first_reward = 0, last_reward = 0;
    int last_n = 0, window = o.rounds >= 5 ? o.rounds / 5 : 1;
    uint64_t bytes_cum = 0;
    double gated_sum = 0;
    for (int r = 0; r < o.rounds; r++) {
        double t0 = now_ms();
        rl_grpo_stats st = {0};
        uint64_t ddp_bytes = 0;
        double sync_ms = 0; /* time in the exchange (and the weight check) */
        for (int h = 0; h < o.h; h++) {
            uint64_t step = (uint64_t)r * (uint64_t)o.h + (uint64_t)h;
            if ((rc = trainer_grad(&t, &o, rank, step, &st))) die(rank, r, "rollout/grpo", rc);
            if (o.mode == FERRY_LOCO_DDP) {
                uint64_t b;
                double m0 = now_ms();
                if ((rc = ferry_loco_mean(lc, t.grad, &b))) die(rank, r, "ferry_loco_mean", rc);
                sync_ms += now_ms() - m0;
                ddp_bytes += b;
            }
            rl_adamw_step(&t.adam, t.w.w, t.grad);
        }
        ferry_loco_stats ls = {0};
        double s0 = now_ms();
        if (o.mode == FERRY_LOCO_DDP) {
            if ((rc = ferry_loco_check(lc, t.w.w, (uint64_t)r, ls.hash))) die(rank, r, "weight check", rc);
            ls.bytes_rank = ddp_bytes;
            ls.bytes_all = ddp_bytes * (uint64_t)nranks; /* every rank sends the same 4·n per step */
            ls.gated_all = n * (uint64_t)nranks;
            ls.gated_fraction = 1.0;
        } else if ((rc = ferry_loco_sync(lc, t.w.w, &ls))) {
            die(rank, r, "ferry_loco_sync", rc);
        }
        sync_ms += now_ms() - s0;
        /* mean reward over every completion of every rank this round */
        double mine[2] = {st.reward_sum, (double)st.completions}, all[2];
        MPI_Allreduce(mine, all, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); /* for display only */
        double reward = all[1] > 0 ? all[0] / all[1] : 0;
        bytes_cum += ls.bytes_all;
        gated_sum += ls.gated_fraction;
        if (r == 0) first_reward = reward;
        last_reward = reward;
        if (r >= o.rounds - window) last_sum += reward, last_n++;
        if (o.publish_dir && rank == 0 && (rc = publish(&t, &o, (uint64_t)r, ls.hash)))
            die(rank, r, "publish", rc);
        double round_ms = now_ms() - t0;
        char hx[33];
        hex16(ls.hash, hx);
        if (out && o.json)
            printf("{\"round\":%d,\"steps\":%" PRIu64 ",\"reward\":%.4f,\"bytes\":%" PRIu64
                   ",\"bytes_per_rank\":%" PRIu64 ",\"bytes_cum\":%" PRIu64 ",\"gated\":%" PRIu64
                   ",\"gated_fraction\":%.6f,\"residual_l1_rank0\":%.6g,\"hash\":\"%s\",\"ranks_agree\":%d,"
                   "\"round_ms\":%.1f,\"sync_ms\":%.1f}\n",
                   r, (uint64_t)(r + 1) * (uint64_t)o.h, reward, ls.bytes_all, ls.bytes_all / (uint64_t)nranks,
                   bytes_cum, ls.gated_all, ls.gated_fraction, ls.residual_l1, hx, nranks, round_ms, sync_ms);
        else if (out && !o.quiet)
            printf("%5d %7" PRIu64 " %7.4f %12" PRIu64 " %14" PRIu64 " %7.3f  hash-agree %d/%d %s\n", r,
                   (uint64_t)(r + 1) * (uint64_t)o.h, reward, ls.bytes_all, bytes_cum,
                   100 * ls.gated_fraction, nranks, nranks, hx);
        fflush(stdout);
    }
    double secs = (now_ms() - t_start) / 1e3;
    double last = last_n ? last_sum / last_n : 0;
    uint64_t steps = (uint64_t)o.rounds * (uint64_t)o.h;
    if (out && o.json)
        printf("{\"event\":\"summary\",\"mode\":\"%s\",\"ranks\":%d,\"h\":%d,\"rounds\":%d,\"steps\":%" PRIu64
               ",\"seconds\":%.2f,\"bytes_total\":%" PRIu64 ",\"bytes_total_per_rank\":%" PRIu64
               ",\"mean_gated_fraction\":%.6f,\"reward_first\":%.4f,\"reward_last\":%.4f,"
               "\"reward_last_window\":%.4f,\"window_rounds\":%d}\n",
               mode_name(o.mode), nranks, o.h, o.rounds, steps, secs, bytes_cum,
               bytes_cum / (uint64_t)nranks, o.rounds ? gated_sum / o.rounds : 0, first_reward,
               last_reward, last, window);
    else if (out)
        printf("loco_train: %s: %d rounds x %d steps on %d ranks in %.1f s; %" PRIu64
               " bytes sent (%.1f per rank per step); mean gated %.3f%%; reward first round %.4f, "
               "last %d rounds %.4f; every round's weights agreed on all ranks\n",
               mode_name(o.mode), o.rounds, o.h, nranks, secs, bytes_cum,
               steps ? (double)bytes_cum / nranks / (double)steps : 0,
               o.rounds ? 100 * gated_sum / o.rounds : 0, first_reward, window, last);
    fflush(stdout);
    int status = 0;
    if (o.save_path && rank == 0) {
        char sv[4][40], hx[33];
        uint8_t h[16];
        ferry_loco_hash(t.w.w, n, h); /* the global weights (local == global after a sync) */
        hex16(h, hx);
        snprintf(sv[0], sizeof sv[0], "%d", o.rounds);
        snprintf(sv[1], sizeof sv[1], "%d", o.h);
        snprintf(sv[2], sizeof sv[2], "%g", (double)o.adam.lr);
        snprintf(sv[3], sizeof sv[3], "%" PRIu64, o.seed);
        const char *meta[] = {"loco.mode", mode_name(o.mode), "loco.rounds", sv[0], "loco.h", sv[1],
                              "rl.lr", sv[2], "rl.seed", sv[3], "rl.task", rl_task_name(o.task.kind),
                              "fp32_xxh3_128", hx, NULL};
        if ((rc = rl_policy_save_file(&t.w, o.save_path, meta, err, sizeof err))) {
            fprintf(stderr, "loco_train: --save: %s\n", err);
            status = 1;
        } else if (!o.json) {
            printf("loco_train: saved the global weights to %s (%s)\n", o.save_path, hx);
        }
    }
    ferry_loco_free(lc);
    trainer_release(&t);
    MPI_Finalize();
    return status;
}
