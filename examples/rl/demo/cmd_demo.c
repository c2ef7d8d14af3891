/*
 * ferry-demo — the main job on one machine: a decoupled RL run, one trainer
 * and N rollout islands (separate processes) that share only a store.
 *
 *   ferry-demo [--islands 3] [--steps N] [--mode async|sequential] ...  (--help)
 *
 * This file: options, the work directory and store, the printout (text rows
 * or JSON lines), the legs (one, or a baseline and an adaptive one) and the
 * report.  The trainer and the islands' supervisor are demo_trainer.c, the
 * island demo_island.c, the HTML report demo_report.c; demo.h describes the
 * objects they share in the store.
 */
#include "util.h"

#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adamw.h"
#include "demo.h"
#include "ferry_store.h"

/* The RL run's defaults: post-training from a pre-trained start (see
 * docs/DEMO.md, "Choosing the settings", for what was tried). */
#define DEFAULT_STEPS 150
#define DEFAULT_LR 5e-5f
#define DEFAULT_BETA1 0.9f
#define DEFAULT_EPS 1e-3f
#define DEFAULT_LR_WARMUP 10
#define DEFAULT_WARMUP_STEPS 20
#define DEFAULT_WARMUP_PROMPTS 64
#define DEFAULT_WARMUP_LR 1e-3f

static void demo_help(void)
{
    rl_policy_config d = rl_policy_config_default();
    printf("usage: ferry-demo [options]\n"
"\n"
"A decoupled RL run on this machine: one trainer (this process: FP32 master\n"
"weights, AdamW, GRPO) and N rollout islands (separate processes holding BF16\n"
"weights) that share nothing but an object store.  As RL post-training does,\n"
"it starts from a pre-trained policy (a supervised warm-up, cached) and moves\n"
"it at a small learning rate.  The trainer publishes every\n"
"policy version through the sync layer as a ferry patch (an anchor every K\n"
"versions); islands sync, sample trajectories of a digit-reversal task with\n"
"their BF16 weights and put version-tagged batches through the dock; the\n"
"trainer takes them under the staleness policy and steps.  Prints one row per\n"
"step and writes an HTML report.\n"
"\n"
"  --store URL           object store (default: a file:// store in a new\n"
"                        temporary directory, removed at the end); s3://BUCKET\n"
"                        [/PREFIX] takes credentials from AWS_* variables\n"
"  --islands N           rollout islands, 1..%d (default 3)\n"
"  --steps N             trainer steps (default %d)\n"
"  --mode async|sequential\n"
"                        async (default): islands sample continuously with the\n"
"                        version they hold and follow HEAD in the background;\n"
"                        sequential: every step requests rollouts of one exact\n"
"                        version, and only batches of it are admitted\n"
"  --max-staleness S     async: admit a batch iff trainer version - batch\n"
"                        version <= S; older ones are dropped and counted\n"
"                        (default 2)\n"
"  --seed S              run seed: weights, prompts, samples (default 1)\n"
"  --adaptive THRESH     adaptive publication: publish a new version only when\n"
"                        this fraction (0..1] of BF16 words differs from the\n"
"                        last published version (or after --max-skip steps).\n"
"                        Runs a baseline leg (publish every step) first, then\n"
"                        the adaptive leg, and compares them\n"
"  --rollout-dtype bf16|fp8\n"
"                        fp8: the trainer publishes every version as its FP8\n"
"                        checkpoint (fp8-block128: E4M3 codes, one scale per\n"
"                        128x128 block, as DeepSeek-V3 and Qwen3-FP8), shipped\n"
"                        as patches of FP8 codes; islands sample with the\n"
"                        dequantized FP8 weights; the trainer learns on its\n"
"                        FP32 masters as before.  Runs a BF16 leg first, then\n"
"                        the FP8 leg, and compares bytes per version (FP8\n"
"                        patch against the BF16 patch of the same step) and\n"
"                        reward (default bf16)\n"
"  --no-baseline         with --adaptive or --rollout-dtype fp8: only the\n"
"                        adaptive or FP8 leg\n"
"  --max-skip N          adaptive: publish at least every N steps (default 8)\n"
"  --kill-island-at STEP kill -9 island 0 at that step; it is restarted (async:\n"
"                        --restart-after steps later, default 3) and rejoins\n"
"  --report PATH         HTML report (default: report.html in the work\n"
"                        directory, whose path is printed)\n"
"  --keep                keep the temporary store\n"
"  --unsigned            no keys: versions and batches unsigned (by default the\n"
"                        trainer signs versions with a key made for the run,\n"
"                        each island signs its batches with its own and trusts\n"
"                        the trainer's; see docs/SECURITY.md)\n"
"  --mirror URL          islands take the policy from this store (a file://\n"
"                        path, or any writable store URL), which a `ferry\n"
"                        mirror --follow` child keeps current from the store;\n"
"                        the store stays their fallback (docs/MIRROR.md)\n"
"  --json                JSON lines instead of the table\n"
"  --dump DIR            (tests) the trainer writes the BF16 cast of every\n"
"                        version it publishes to DIR (RUN-trainer-vV\n"
"                        .safetensors), each island, when stopped, the model\n"
"                        it holds (RUN-island-I-vV.safetensors) and the FP32\n"
"                        weights it sampled with (RUN-island-I-vV-f32...)\n"
"  --quiet               only the summary\n"
"\n"
"starting policy (RL post-training starts from a pre-trained model):\n"
"  --warmup-steps N      supervised warm-up steps that make it from the seeded\n"
"                        weights (default %d; 0: start from random weights)\n"
"  --warmup-lr X         its learning rate (default %g)\n"
"  --warmup-prompts P    its prompts per step (default %d)\n"
"  --cache DIR           where the warm-up is cached, keyed by its settings and\n"
"                        verified by hash when reused (default\n"
"                        $XDG_CACHE_HOME/ferry or ~/.cache/ferry)\n"
"  --no-cache            always run the warm-up\n"
"\n"
"workload (examples/rl):\n"
"  --prompts P           prompts per trainer step, split among the islands\n"
"                        (default 16)\n"
"  --group G             samples per prompt (default 8)\n"
"  --lr X                AdamW learning rate of the RL run (default %g)\n"
"  --lr-warmup N         steps of linear learning-rate warm-up (default %d)\n"
"  --beta1 X             AdamW beta1 (default %g)\n"
"  --eps X               AdamW epsilon (default %g): weights whose gradients\n"
"                        are far below it move less than the learning rate\n"
"  --task reverse|copy|sort  (default reverse)\n"
"  --digits K            prompt length (default 6)\n"
"  --dim H               hidden width (default %u: %s parameters)\n"
"\n"
"transport:\n"
"  --sync patch|full     islands fetch ferry patches (default), or a full\n"
"                        checkpoint per version (every version an anchor;\n"
"                        the baseline: trajectories are bit-identical)\n"
"  --anchor-every K      an anchor (full checkpoint) every K versions (default 20)\n"
"  --queue Q             async: batches an island may have waiting (default 1)\n"
"  --timeout SEC         fail a step that gets no batch for SEC s (default 120)\n"
"\n"
"Exit status 0 when every step completed, 1 on failure, 2 on bad options.\n",
           DEMO_MAX_ISLANDS, DEFAULT_STEPS, DEFAULT_WARMUP_STEPS, (double)DEFAULT_WARMUP_LR, DEFAULT_WARMUP_PROMPTS,
           (double)DEFAULT_LR, DEFAULT_LR_WARMUP, (double)DEFAULT_BETA1, (double)DEFAULT_EPS, d.hidden, "1,001,298");
}

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

typedef struct cli_opts {
    demo_options d;
    const char *store, *report, *cache;
    double adaptive;
    int no_baseline, keep, unsigned_run, no_cache;
    int quant;              /* --rollout-dtype fp8: FERRY_QUANT_FP8_BLOCK128 */
    rl_sft_config warmup;   /* the base policy's warm-up; steps 0: start from random weights */
} cli_opts;

/* 0: run, 1: help printed, 2: usage error printed. */
static int parse_args(int argc, char **argv, cli_opts *c)
{
    demo_options *o = &c->d;
    memset(c, 0, sizeof *c);
    o->islands = 3;
    o->steps = DEFAULT_STEPS;
    o->prompts = 16;
    o->group = 8;
    o->queue = 1;
    o->anchor_every = 20;
    o->max_skip = 8;
    o->mode = DEMO_ASYNC;
    o->max_staleness = 2;
    o->seed = 1;
    o->kill_at = -1;
    o->restart_after = 3;
    o->timeout_s = 120;
    o->lr = DEFAULT_LR;
    o->beta1 = DEFAULT_BETA1;
    o->eps = DEFAULT_EPS;
    o->lr_warmup = DEFAULT_LR_WARMUP;
    c->warmup = (rl_sft_config){.steps = DEFAULT_WARMUP_STEPS, .prompts = DEFAULT_WARMUP_PROMPTS,
                                .adam = rl_adamw_config_default()};
    c->warmup.adam.lr = DEFAULT_WARMUP_LR;
    o->task = rl_task_default();
    o->net = rl_policy_config_default();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        double x;
        if (cli_is_help(a)) {
            demo_help();
            return 1;
        }
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!strcmp(a, "--quiet")) { o->quiet = 1; continue; }
        if (!strcmp(a, "--keep")) { c->keep = 1; continue; }
        if (!strcmp(a, "--no-baseline")) { c->no_baseline = 1; continue; }
        if (!strcmp(a, "--unsigned")) { c->unsigned_run = 1; continue; }
        if (!strcmp(a, "--no-cache")) { c->no_cache = 1; continue; }
        if (strncmp(a, "--", 2)) return cli_usage_error(DEMO_CMD, "unexpected argument '%s'", a);
        if (!v) {
            static const char *const k_valued[] = {"--store", "--report", "--islands", "--steps", "--mode", "--max-staleness",
                                                   "--seed", "--adaptive", "--max-skip", "--kill-island-at", "--restart-after",
                                                   "--prompts", "--group", "--lr", "--task", "--digits", "--dim", "--sync",
                                                   "--anchor-every", "--queue", "--timeout", "--warmup-steps",
                                                   "--warmup-lr", "--warmup-prompts", "--cache", "--beta1", "--eps",
                                                   "--lr-warmup", "--mirror", "--rollout-dtype", "--dump"};
            for (size_t j = 0; j < sizeof k_valued / sizeof k_valued[0]; j++)
                if (!strcmp(a, k_valued[j])) return cli_usage_error(DEMO_CMD, "option '%s' needs a value", a);
            return cli_usage_error(DEMO_CMD, "unknown option '%s'", a);
        }
        int bad = 0;
        if (!strcmp(a, "--store")) c->store = v;
        else if (!strcmp(a, "--mirror")) o->mirror_url = v;
        else if (!strcmp(a, "--dump")) o->dump_dir = v;
        else if (!strcmp(a, "--rollout-dtype")) {
            if (!strcmp(v, "fp8")) c->quant = FERRY_QUANT_FP8_BLOCK128;
            else if (!strcmp(v, "bf16")) c->quant = FERRY_QUANT_NONE;
            else bad = 1;
        }
        else if (!strcmp(a, "--report")) c->report = v;
        else if (!strcmp(a, "--islands")) bad = !cli_parse_int(v, 1, DEMO_MAX_ISLANDS, &l), o->islands = (uint32_t)l;
        else if (!strcmp(a, "--steps")) bad = !cli_parse_int(v, 1, 1000000, &l), o->steps = (uint32_t)l;
        else if (!strcmp(a, "--mode")) {
            if (!strcmp(v, "async")) o->mode = DEMO_ASYNC;
            else if (!strcmp(v, "sequential")) o->mode = DEMO_SEQUENTIAL;
            else bad = 1;
        } else if (!strcmp(a, "--max-staleness")) bad = !cli_parse_int(v, 0, 1000000, &l), o->max_staleness = (uint64_t)l;
        else if (!strcmp(a, "--seed")) bad = !cli_parse_u64(v, UINT64_MAX, &o->seed);
        else if (!strcmp(a, "--adaptive")) bad = parse_double(v, &c->adaptive) || c->adaptive <= 0 || c->adaptive > 1;
        else if (!strcmp(a, "--max-skip")) bad = !cli_parse_int(v, 1, 1000000, &l), o->max_skip = (uint32_t)l;
        else if (!strcmp(a, "--kill-island-at")) bad = !cli_parse_int(v, 0, 1000000, &l), o->kill_at = l;
        else if (!strcmp(a, "--restart-after")) bad = !cli_parse_int(v, 0, 1000000, &l), o->restart_after = (uint32_t)l;
        else if (!strcmp(a, "--prompts")) bad = !cli_parse_int(v, 1, 65536, &l), o->prompts = (uint32_t)l;
        else if (!strcmp(a, "--group")) bad = !cli_parse_int(v, 1, 1024, &l), o->group = (uint32_t)l;
        else if (!strcmp(a, "--lr")) bad = parse_double(v, &x) || x <= 0 || x > 1, o->lr = (float)x;
        else if (!strcmp(a, "--beta1")) bad = parse_double(v, &x) || x < 0 || x >= 1, o->beta1 = (float)x;
        else if (!strcmp(a, "--lr-warmup")) bad = !cli_parse_int(v, 0, 1000000, &l), o->lr_warmup = (uint32_t)l;
        else if (!strcmp(a, "--eps")) bad = parse_double(v, &x) || x <= 0 || x > 1, o->eps = (float)x;
        else if (!strcmp(a, "--warmup-steps")) bad = !cli_parse_int(v, 0, 1000000, &l), c->warmup.steps = (uint32_t)l;
        else if (!strcmp(a, "--warmup-lr")) bad = parse_double(v, &x) || x <= 0 || x > 1, c->warmup.adam.lr = (float)x;
        else if (!strcmp(a, "--warmup-prompts")) bad = !cli_parse_int(v, 1, 65536, &l), c->warmup.prompts = (uint32_t)l;
        else if (!strcmp(a, "--cache")) c->cache = v;
        else if (!strcmp(a, "--task")) bad = rl_task_parse(v, &o->task.kind) != 0;
        else if (!strcmp(a, "--digits")) {
            bad = !cli_parse_int(v, 1, RL_TASK_MAX_LEN, &l);
            o->task.prompt_len = o->task.completion_len = (uint32_t)l;
        } else if (!strcmp(a, "--dim")) bad = !cli_parse_int(v, 1, 65536, &l), o->net.hidden = (uint32_t)l;
        else if (!strcmp(a, "--sync")) {
            if (!strcmp(v, "full")) o->full_sync = 1;
            else if (!strcmp(v, "patch")) o->full_sync = 0;
            else bad = 1;
        } else if (!strcmp(a, "--anchor-every")) bad = !cli_parse_int(v, 1, 1000000, &l), o->anchor_every = (uint32_t)l;
        else if (!strcmp(a, "--queue")) bad = !cli_parse_int(v, 1, 64, &l), o->queue = (uint32_t)l;
        else if (!strcmp(a, "--timeout")) bad = parse_double(v, &o->timeout_s) || o->timeout_s <= 0 || o->timeout_s > 86400;
        else return cli_usage_error(DEMO_CMD, "unknown option '%s'", a);
        if (bad) return cli_usage_error(DEMO_CMD, "bad value for %s: '%s'", a, v);
        i++;
    }
    if (o->prompts < o->islands)
        return cli_usage_error(DEMO_CMD, "--prompts (%u) must be at least --islands (%u): each island samples a share", o->prompts,
                               o->islands);
    if (c->no_baseline && c->adaptive <= 0 && !c->quant)
        return cli_usage_error(DEMO_CMD, "--no-baseline goes with --adaptive or --rollout-dtype fp8");
    o->net.window = rl_policy_config_for_task(&o->task).window;
    if (!rl_policy_config_params(&o->net)) return cli_usage_error(DEMO_CMD, "the network is too large (--dim)");
    return 0;
}

/* ======================================================================
 * Output
 * ====================================================================== */
/* 1001298 -> "1,001,298" */
static void commas(char *buf, size_t cap, uint64_t v)
{
    char d[32];
    int n = snprintf(d, sizeof d, "%" PRIu64, v), j = 0;
    for (int i = 0; i < n && (size_t)j + 2 < cap; i++) {
        if (i && (n - i) % 3 == 0) buf[j++] = ',';
        buf[j++] = d[i];
    }
    buf[j] = 0;
}
static void mb(char *buf, size_t cap, uint64_t bytes)
{
    if (bytes >= 10u * 1000 * 1000) snprintf(buf, cap, "%.1f MB", (double)bytes / 1e6);
    else if (bytes >= 10000) snprintf(buf, cap, "%.1f kB", (double)bytes / 1e3);
    else snprintf(buf, cap, "%" PRIu64 " B", bytes);
}

void demo_print_leg_start(const demo_options *o, const demo_leg *leg, const char *run, size_t params, const long *pids)
{
    if (o->json) {
        printf("{\"event\":\"leg\",\"leg\":");
        json_str(stdout, leg->name);
        printf(",\"run\":\"%s\",\"trainer_pid\":%ld,\"params\":%zu,\"full_bytes\":%" PRIu64 ",\"quantize\":\"%s\",\"island_pids\":[",
               run, (long)getpid(), params, leg->full_bytes, ferry_quant_name((ferry_quant)leg->quant));
        for (uint32_t i = 0; i < o->islands; i++) printf("%s%ld", i ? "," : "", pids[i]);
        printf("]}\n");
    } else {
        printf("\n== leg: %s (run %s)\n   trainer: pid %ld (this process); islands:", leg->name, run, (long)getpid());
        for (uint32_t i = 0; i < o->islands; i++) printf(" %u=pid %ld", i, pids[i]);
        printf("\n");
        if (leg->quant)
            printf("   rollouts with the FP8 weights (%s): patch_B = the FP8 patch shipped;\n"
                   "   bf16_B (in place of ratio) = the BF16 patch of the same step, measured, not shipped\n",
                   ferry_quant_name((ferry_quant)leg->quant));
        if (!o->quiet)
            printf("%5s %5s %7s %6s %9s %*s %7s %7s %8s %6s %5s %4s\n", "step", "ver", "reward", "chg%", "patch_B", leg->quant ? 9 : 6,
                   leg->quant ? "bf16_B" : "ratio", "pub_ms", "sync_ms", "fresh_ms", "wait%", "stale", "drop");
    }
    fflush(stdout);
}

void demo_print_step(const demo_options *o, const demo_leg *leg, const demo_step *s)
{
    if (o->json) {
        printf("{\"event\":\"step\",\"leg\":");
        json_str(stdout, leg->name);
        printf(",\"step\":%u,\"version\":%" PRIu64 ",\"reward\":%.4f,\"batches\":%u,\"prompts\":%u,"
               "\"staleness_min\":%" PRIu64 ",\"staleness_max\":%" PRIu64 ",\"dropped\":%" PRIu64 ",\"discarded\":%" PRIu64
               ",\"published\":%s,\"new_version\":%" PRIu64 ",\"changed_pct\":%.3f,\"patch_bytes\":%" PRIu64
               ",\"anchor_bytes\":%" PRIu64 ",\"full_bytes\":%" PRIu64 ",\"patch_pct\":%.3f,\"publish_ms\":%.2f,\"sync_ms\":%.2f,"
               "\"fresh_version\":%" PRIu64 ",\"fresh_ms\":%.1f,\"wait_share\":%.4f,\"step_ms\":%.1f,\"t_s\":%.3f,"
               "\"bf16_patch_bytes\":%" PRIu64,
               s->step, s->version, s->reward, s->batches, s->prompts, s->stale_min, s->stale_max, s->dropped, s->discarded,
               s->published ? "true" : "false", s->published ? s->pub_version : s->version, 100 * s->changed, s->delta_bytes,
               s->anchor_bytes, leg->full_bytes, leg->full_bytes ? 100.0 * (double)s->delta_bytes / (double)leg->full_bytes : 0,
               s->pub_ms, s->sync_ms, s->fresh_version, s->ver_fresh_ms, s->wait_share, s->step_ms, s->t_s,
               leg->quant ? s->bf16_delta_bytes : s->delta_bytes);
        if (leg->quant && s->published)
            printf(",\"fp8_logit_max_abs\":%.6g,\"fp8_logit_mean_abs\":%.6g,\"fp8_kl\":%.6g,\"fp8_same_argmax\":%.6f", s->fp8_logit_max,
                   s->fp8_logit_mean, s->fp8_kl, s->fp8_top1);
        printf("}\n");
    } else if (!o->quiet) {
        char stale[24], patch[24], ratio[24], pub[16], fresh[16];
        if (s->stale_min == s->stale_max) snprintf(stale, sizeof stale, "%" PRIu64, s->stale_min);
        else snprintf(stale, sizeof stale, "%" PRIu64 "-%" PRIu64, s->stale_min, s->stale_max);
        if (s->published) {
            snprintf(patch, sizeof patch, "%" PRIu64, s->delta_bytes);
            if (leg->quant) snprintf(ratio, sizeof ratio, "%" PRIu64, s->bf16_delta_bytes);
            else snprintf(ratio, sizeof ratio, "%.2f%%", leg->full_bytes ? 100.0 * (double)s->delta_bytes / (double)leg->full_bytes : 0);
            snprintf(pub, sizeof pub, "%.1f", s->pub_ms);
        } else {
            snprintf(patch, sizeof patch, "(held)");
            snprintf(ratio, sizeof ratio, "-");
            snprintf(pub, sizeof pub, "-");
        }
        if (s->ver_fresh_ms >= 0) snprintf(fresh, sizeof fresh, "%.1f", s->ver_fresh_ms);
        else snprintf(fresh, sizeof fresh, "-");
        printf("%5u %5" PRIu64 " %7.4f %6.2f %9s %*s %7s %7.1f %8s %6.1f %5s %4" PRIu64 "%s\n", s->step, s->version, s->reward,
               100 * s->changed, patch, leg->quant ? 9 : 6, ratio, pub, s->sync_ms, fresh, 100 * s->wait_share, stale, s->dropped,
               s->anchor_bytes ? "  +anchor" : "");
    }
    fflush(stdout);
}

static const char *event_name(int kind)
{
    return kind == DEMO_EV_KILL ? "kill" : kind == DEMO_EV_RESTART ? "restart" : kind == DEMO_EV_REJOIN ? "rejoin" : "died";
}

void demo_print_event(const demo_options *o, const demo_leg *leg, const demo_event *e)
{
    if (o->json) {
        printf("{\"event\":\"%s\",\"leg\":", event_name(e->kind));
        json_str(stdout, leg->name);
        printf(",\"step\":%u,\"island\":%u,\"pid\":%ld,\"what\":", e->step, e->island, e->pid);
        json_str(stdout, e->what);
        printf("}\n");
    } else {
        printf("  ** step %u: %s\n", e->step, e->what);
    }
    fflush(stdout);
}

/* Mean patch of the versions the steps published, as a share of a full
 * BF16 checkpoint (anchors, which also carry a full checkpoint, apart). */
static double patch_mean(const demo_leg *leg, uint64_t *count)
{
    uint64_t n = 0, bytes = 0;
    for (size_t i = 0; i < leg->nsteps; i++)
        if (leg->steps[i].published) n++, bytes += leg->steps[i].delta_bytes;
    if (count) *count = n;
    return n && leg->full_bytes ? (double)bytes / ((double)n * (double)leg->full_bytes) : 0;
}

static void print_summary(const demo_options *o, const demo_leg *leg)
{
    uint64_t full_equiv = leg->versions * leg->full_bytes, ferry = leg->delta_total + leg->anchor_total, npatch = 0;
    double pm = patch_mean(leg, &npatch);
    uint64_t maxst = 0, restarts = 0;
    for (int i = 0; i < FERRY_DOCK_HIST; i++)
        if (leg->stale_hist[i]) maxst = (uint64_t)i;
    for (size_t i = 0; i < leg->nevents; i++) restarts += leg->events[i].kind == DEMO_EV_RESTART;
    if (o->json) {
        printf("{\"event\":\"summary\",\"leg\":");
        json_str(stdout, leg->name);
        printf(",\"adaptive\":%g,\"steps\":%zu,\"seconds\":%.2f,\"steps_per_s\":%.3f,\"reward_first\":%.4f,\"reward_last\":%.4f,"
               "\"window\":%d,\"versions\":%" PRIu64 ",\"anchors\":%" PRIu64 ",\"delta_bytes\":%" PRIu64 ",\"anchor_bytes\":%" PRIu64
               ",\"full_bytes\":%" PRIu64 ",\"full_checkpoint_bytes\":%" PRIu64 ",\"fetched_bytes\":%" PRIu64 ",\"admitted\":%" PRIu64
               ",\"dropped\":%" PRIu64 ",\"duplicates\":%" PRIu64 ",\"rejected\":%" PRIu64 ",\"discarded\":%" PRIu64
               ",\"leftover\":%" PRIu64 ",\"produced\":%" PRIu64 ",\"max_staleness_seen\":%" PRIu64 ",\"patch_mean_pct\":%.3f,"
               "\"patches\":%" PRIu64 ",\"fresh_mean_ms\":%.1f,\"fresh_max_ms\":%.1f,\"fresh_known\":%" PRIu64 ",\"wait_share\":%.4f,"
               "\"reward_gain\":%.4f,\"staleness_hist\":[",
               leg->adaptive, leg->nsteps, leg->seconds, leg->seconds > 0 ? (double)leg->nsteps / leg->seconds : 0, leg->reward_first,
               leg->reward_last, leg->window, leg->versions, leg->anchors, leg->delta_total, leg->anchor_total, leg->full_bytes,
               full_equiv, leg->fetched_total, leg->admitted, leg->dropped, leg->duplicates, leg->rejected, leg->discarded,
               leg->leftover, leg->produced, maxst, 100 * pm, npatch, leg->fresh_mean_ms, leg->fresh_max_ms, leg->fresh_known,
               leg->wait_share, leg->reward_last - leg->reward_first);
        for (uint64_t i = 0; i <= maxst; i++) printf("%s%" PRIu64, i ? "," : "", leg->stale_hist[i]);
        printf("],\"restarts\":%" PRIu64 ",\"restarted_batches\":%" PRIu64 ",\"traj_hash\":\"%s\",\"masters_hash\":\"%s\","
               "\"quantize\":\"%s\",\"bf16_full_bytes\":%" PRIu64 ",\"bf16_delta_bytes\":%" PRIu64,
               restarts, leg->restarted_batches, leg->traj_hash, leg->masters_hash, ferry_quant_name((ferry_quant)leg->quant),
               leg->bf16_full_bytes, leg->quant ? leg->bf16_delta_total : leg->delta_total);
        if (leg->quant)
            printf(",\"fp8_probes\":%" PRIu64 ",\"fp8_logit_max_abs\":%.6g,\"fp8_logit_mean_abs\":%.6g,\"fp8_kl\":%.6g,"
                   "\"fp8_same_argmax\":%.6f",
                   leg->probes, leg->fp8_logit_max, leg->fp8_logit_mean, leg->fp8_kl, leg->fp8_top1);
        printf("}\n");
        fflush(stdout);
        return;
    }
    char a[32], b[32], c[32], d[32];
    mb(a, sizeof a, leg->delta_total);
    mb(b, sizeof b, leg->anchor_total);
    mb(c, sizeof c, full_equiv);
    mb(d, sizeof d, leg->fetched_total);
    /* the headline: what a reader would quote */
    printf("== %s: each version shipped as %.1f%% of a full checkpoint (%.0fx smaller);\n"
           "   islands fresh %.0f ms after publish; reward %.3f -> %.3f; %.1f%% of time waiting for weights\n",
           leg->name, 100 * pm, pm > 0 ? 1 / pm : 0, leg->fresh_mean_ms, leg->reward_first, leg->reward_last,
           100 * leg->wait_share);
    printf("   %zu steps in %.1f s (%.2f steps/s); mean reward %.3f (first %d steps) -> %.3f (last %d)\n", leg->nsteps,
           leg->seconds, leg->seconds > 0 ? (double)leg->nsteps / leg->seconds : 0, leg->reward_first, leg->window,
           leg->reward_last, leg->window);
    printf("   time-to-fresh policy (publish start -> last island synced, verified): mean %.1f ms,\n"
           "     max %.1f ms, over %" PRIu64 " versions\n",
           leg->fresh_mean_ms, leg->fresh_max_ms, leg->fresh_known);
    printf("   policy: %" PRIu64 " versions: deltas %s + %" PRIu64 " anchors %s, against %s as full\n"
           "     checkpoints (%.1fx less); islands fetched %s\n",
           leg->versions, a, leg->anchors, b, c, ferry ? (double)full_equiv / (double)ferry : 0, d);
    printf("   batches: %" PRIu64 " put, %" PRIu64 " consumed (staleness", leg->produced, leg->admitted - leg->discarded);
    for (uint64_t i = 0; i <= maxst; i++) printf(" %" PRIu64 ":%" PRIu64, i, leg->stale_hist[i]);
    printf("), %" PRIu64 " dropped as stale,\n     %" PRIu64 " duplicates, %" PRIu64 " rejected, %" PRIu64 " discarded, %" PRIu64
           " unused at the end\n",
           leg->dropped, leg->duplicates, leg->rejected, leg->discarded, leg->leftover);
    if (leg->quant) {
        char e[32], g[32], h[32];
        mb(e, sizeof e, leg->bf16_delta_total);
        mb(g, sizeof g, leg->full_bytes);
        mb(h, sizeof h, leg->bf16_full_bytes);
        printf("   FP8 rollouts (%s): FP8 deltas %s, the BF16 patches of the same steps\n"
               "     %s (%.2fx); an FP8 checkpoint is %s, a BF16 one %s\n",
               ferry_quant_name((ferry_quant)leg->quant), a, e,
               leg->bf16_delta_total ? (double)leg->delta_total / (double)leg->bf16_delta_total : 0, g, h);
        printf("     logits of the FP8 weights vs the BF16 version (%u prompts x %u contexts, %" PRIu64 " versions):\n"
               "     max |diff| %.3g, mean |diff| %.3g, KL %.3g nats, same argmax %.2f%%\n",
               DEMO_PROBE_PROMPTS, o->task.completion_len, leg->probes, leg->fp8_logit_max, leg->fp8_logit_mean, leg->fp8_kl,
               100 * leg->fp8_top1);
    }
    if (restarts)
        printf("   churn: %" PRIu64 " island restart(s); %" PRIu64 " batches from restarted islands consumed\n     after the restart\n", restarts,
               leg->restarted_batches);
    printf("   hashes: trajectories %s\n           final masters %s\n", leg->traj_hash, leg->masters_hash);
    fflush(stdout);
}

/* ======================================================================
 * Work directory, store, machine
 * ====================================================================== */
static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void on_signal(int sig)
{
    (void)sig;
    demo_interrupted = 1;
}

static void machine_line(char *buf, size_t cap)
{
    char model[160] = "unknown CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            char *p = strchr(line, ':');
            if (!strncmp(line, "model name", 10) && p) {
                snprintf(model, sizeof model, "%s", p + 2);
                model[strcspn(model, "\n")] = 0;
                break;
            }
        }
        fclose(f);
    }
    snprintf(buf, cap, "%ld cores, %s", sysconf(_SC_NPROCESSORS_ONLN), model);
}

/* --cache DIR, else $XDG_CACHE_HOME/ferry, else $HOME/.cache/ferry; ""
 * with --no-cache (or no home): the warm-up runs every time. */
static void default_cache_dir(const cli_opts *c, char *buf, size_t cap)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    buf[0] = 0;
    if (c->no_cache) return;
    if (c->cache) snprintf(buf, cap, "%s", c->cache);
    else if (xdg && *xdg) snprintf(buf, cap, "%s/ferry", xdg);
    else if (home && *home) snprintf(buf, cap, "%s/.cache/ferry", home);
}

int cmd_demo(int argc, char **argv)
{
    cli_opts c;
    int pa = parse_args(argc, argv, &c);
    if (pa) return pa == 1 ? 0 : 2;
    demo_options *o = &c.d;

    char exe[4096];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (el <= 0) {
        fprintf(stderr, "ferry-demo: cannot find this program (/proc/self/exe): %s\n", strerror(errno));
        return 1;
    }
    exe[el] = 0;
    /* islands exec this very binary, even if a rebuild replaced the file */
    o->exe = "/proc/self/exe";

    char work[4096] = "", store_dir[4200] = "", url[4300], report[4300];
    int made_store = 0, status = 1;
    if (!c.store || !c.report || !c.unsigned_run) {
        const char *tmp = getenv("TMPDIR");
        snprintf(work, sizeof work, "%s/ferry-demo.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(work)) {
            fprintf(stderr, "ferry-demo: cannot create a work directory %s: %s\n", work, strerror(errno));
            return 1;
        }
    }
    if (c.store) {
        snprintf(url, sizeof url, "%s", c.store);
    } else {
        snprintf(store_dir, sizeof store_dir, "%s/store", work);
        snprintf(url, sizeof url, "file://%s", store_dir);
        made_store = 1;
    }
    if (c.report) snprintf(report, sizeof report, "%s", c.report);
    else snprintf(report, sizeof report, "%s/report.html", work);

    rl_policy base; /* the starting policy, released at the end */
    memset(&base, 0, sizeof base);
    ferry_store *st = NULL;
    ferry_store_options so = {.create = 1, .deadline_ms = 60000};
    int rc = ferry_store_open(url, &so, &st);
    if (rc) {
        cli_fail(DEMO_CMD, rc, url);
        goto out;
    }
    o->store_url = ferry_store_url(st);
    if (o->mirror_url) {
        /* made here, before the islands that read it and the mirror child
         * that fills it start: an island must not find it missing */
        ferry_store *ms = NULL;
        if ((rc = ferry_store_open(o->mirror_url, &so, &ms))) {
            cli_fail(DEMO_CMD, rc, o->mirror_url);
            goto out;
        }
        ferry_store_free(ms);
    }
    char key_dir[4200];
    if (!c.unsigned_run) {
        /* a trainer key and one per island, for this run only */
        snprintf(key_dir, sizeof key_dir, "%s/keys", work);
        if (mkdir(key_dir, 0700)) {
            fprintf(stderr, "ferry-demo: cannot create %s: %s\n", key_dir, strerror(errno));
            goto out;
        }
        char prefix[4300];
        int krc = 0;
        for (uint32_t i = 0; i <= o->islands && !krc; i++) {
            if (i == o->islands) snprintf(prefix, sizeof prefix, "%s/trainer", key_dir);
            else snprintf(prefix, sizeof prefix, "%s/island-%u", key_dir, i);
            krc = ferry_keygen(prefix, NULL);
        }
        if (krc) {
            cli_fail(DEMO_CMD, krc, "keygen");
            goto out;
        }
        o->key_dir = key_dir;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    /* the pre-trained starting policy (cached), unless --warmup-steps 0 */
    demo_base bi;
    memset(&bi, 0, sizeof bi);
    char cache_dir[4096] = "", base_line[4400] = "seeded random weights (--warmup-steps 0)";
    if ((rc = rl_policy_create(&base, &o->net))) {
        cli_fail(DEMO_CMD, rc, "policy");
        goto out;
    }
    size_t params = base.nparams;
    if (c.warmup.steps) {
        default_cache_dir(&c, cache_dir, sizeof cache_dir);
        if (demo_base_policy(&base, &o->task, o->seed, &c.warmup, cache_dir, &bi)) goto out;
        o->base_w = base.w;
        if (bi.reused)
            snprintf(base_line, sizeof base_line, "pre-trained by %u supervised warm-up steps, reused (hash verified) from\n    %s",
                     c.warmup.steps, bi.path);
        else
            snprintf(base_line, sizeof base_line, "pre-trained by %u supervised warm-up steps (%u prompts, lr %g) in %.1f s%s%s",
                     c.warmup.steps, c.warmup.prompts, (double)c.warmup.adam.lr, bi.seconds, bi.path[0] ? "; cached in\n    " : "",
                     bi.path);
    }
    char machine[256];
    machine_line(machine, sizeof machine);
    const char *mode = o->mode == DEMO_ASYNC ? "async" : "sequential";
    if (o->json) {
        printf("{\"event\":\"start\",\"store\":");
        json_str(stdout, o->store_url);
        printf(",\"mode\":\"%s\",\"max_staleness\":%" PRIu64 ",\"islands\":%u,\"steps\":%u,\"prompts\":%u,\"group\":%u,"
               "\"seed\":%" PRIu64 ",\"params\":%zu,\"task\":\"%s\",\"digits\":%u,\"lr\":%g,\"sync\":\"%s\",\"adaptive\":%g,"
               "\"anchor_every\":%u,\"machine\":",
               mode, o->max_staleness, o->islands, o->steps, o->prompts, o->group, o->seed, params, rl_task_name(o->task.kind),
               o->task.prompt_len, (double)o->lr, o->full_sync ? "full" : "patch", c.adaptive, o->anchor_every);
        json_str(stdout, machine);
        printf(",\"rollout_dtype\":\"%s\",\"signed\":%s,\"beta1\":%g,\"eps\":%g,\"lr_warmup\":%u,\"warmup_steps\":%u,\"warmup_prompts\":%u,\"warmup_lr\":%g,\"base_reused\":%s,"
               "\"warmup_s\":%.3f,\"base_hash\":\"%s\",\"base_path\":",
               c.quant ? "fp8" : "bf16", o->key_dir ? "true" : "false", (double)o->beta1, (double)o->eps, o->lr_warmup, c.warmup.steps, c.warmup.prompts, (double)c.warmup.adam.lr,
               bi.reused ? "true" : "false", bi.seconds, bi.hash);
        json_str(stdout, bi.path);
        printf("}\n");
    } else {
        printf("ferry-demo: 1 trainer + %u rollout islands (separate processes) sharing only the store\n  %s\n", o->islands,
               o->store_url);
        char pc[32];
        commas(pc, sizeof pc, params);
        printf("  policy: %s parameters: FP32 masters + AdamW on the trainer, BF16 on the islands%s\n", pc,
               c.quant ? "\n  (FP8 leg: the FP8 checkpoint of each version, fp8-block128, dequantized to sample)" : "");
        printf("  start: %s\n", base_line);
        printf("  RL: %u steps of %u prompts x %u samples, task %s %u digits, AdamW lr %g (warm-up %u\n"
               "  steps, eps %g); mode %s",
               o->steps, o->prompts, o->group, rl_task_name(o->task.kind), o->task.prompt_len, (double)o->lr, o->lr_warmup,
               (double)o->eps, mode);
        if (o->mode == DEMO_ASYNC) printf(" (max staleness %" PRIu64 ")", o->max_staleness);
        printf("; seed %" PRIu64 "\n  islands sync by %s; versions and batches %s\n", o->seed,
               o->full_sync ? "full checkpoints" : "ferry patches", o->key_dir ? "signed (Ed25519)" : "unsigned (--unsigned)");
        printf("  columns: ver = policy version the step trained on; chg%% = BF16 words of the new version that\n"
               "  differ from the last published one; patch_B, ratio = its ferry delta, and that against a full\n"
               "  BF16 checkpoint; pub_ms = publish (diff + upload); sync_ms = islands' last sync (fetch + apply\n"
               "  + verify); fresh_ms = time-to-fresh-policy of the newest version all islands hold (publish start\n"
               "  -> last island synced and verified); wait%% = islands' time waiting for weights during the step;\n"
               "  stale = trainer version - batch version; drop = batches dropped as stale\n");
    }
    fflush(stdout);

    demo_leg legs[2];
    memset(legs, 0, sizeof legs);
    size_t nlegs = 0;
    int failed = 0;
    /* the baseline (BF16 rollouts, a version per step), then the leg the
     * options ask for: adaptive publication and/or FP8 rollouts */
    int second = c.adaptive > 0 || c.quant;
    if (!second || !c.no_baseline) {
        failed = demo_run_leg(o, st, 0, 0, c.quant ? "BF16 rollouts" : "publish every step", &legs[nlegs]);
        nlegs++;
        if (!failed) print_summary(o, &legs[nlegs - 1]);
    }
    if (!failed && second && !demo_interrupted) {
        char name[48];
        if (c.quant && c.adaptive > 0) snprintf(name, sizeof name, "FP8 rollouts, adaptive %g", c.adaptive);
        else if (c.quant) snprintf(name, sizeof name, "FP8 rollouts");
        else snprintf(name, sizeof name, "adaptive %g", c.adaptive);
        failed = demo_run_leg(o, st, c.adaptive, c.quant, name, &legs[nlegs]);
        nlegs++;
        if (!failed) print_summary(o, &legs[nlegs - 1]);
    }
    if (!failed) {
        demo_report_info info = {.title = "ferry-demo", .store_url = o->store_url, .mode = mode, .max_staleness = o->max_staleness,
                                 .islands = o->islands, .prompts = o->prompts, .group = o->group, .seed = o->seed,
                                 .params = params, .task = rl_task_name(o->task.kind), .digits = o->task.prompt_len,
                                 .lr = o->lr, .base = base_line, .machine = machine, .full_sync = o->full_sync};
        if ((rc = demo_report_write(report, &info, legs, nlegs))) {
            cli_fail(DEMO_CMD, rc, report);
        } else {
            if (o->json) {
                printf("{\"event\":\"report\",\"path\":");
                json_str(stdout, report);
                printf("}\n");
            } else {
                printf("report: %s\n", report);
            }
            status = 0;
        }
    }
    for (size_t i = 0; i < nlegs; i++) demo_leg_release(&legs[i]);
out:
    rl_policy_release(&base);
    ferry_store_free(st);
    if (made_store) {
        if (c.keep) {
            if (!o->json) printf("store kept: %s\n", url);
        } else {
            nftw(store_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        }
    }
    /* the work directory stays while it holds the report or a kept store */
    if (work[0] && !((!c.report && status == 0) || (c.keep && made_store))) nftw(work, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    fflush(stdout);
    return status;
}
