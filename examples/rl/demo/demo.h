/*
 * demo.h — ferry-demo: a decoupled RL run on one machine.
 *
 * One trainer (the ferry-demo process: FP32 masters, AdamW, GRPO) and N
 * rollout islands (separate processes, `ferry-demo island`, BF16 weights, or
 * the FP8 checkpoint of each version with --rollout-dtype fp8) that
 * share nothing but an object store.  Three kinds of objects cross it:
 *
 *   RUN/policy/...       policy versions (ferry_sync.h): the trainer
 *                        publishes, islands subscribe
 *   RUN/traj/...         trajectory batches (ferry_dock.h): islands put,
 *                        the trainer takes
 *   RUN/demo/config      the run's parameters, written once by the trainer
 *   RUN/demo/control     "step S version V" (sequential pull: the rollout
 *                        request) or "stop"; islands poll it
 *   RUN/demo/island-I    island I's status line (pid, version held, sync
 *                        times and bytes, batches put), for the trainer's
 *                        per-step report
 *
 * Islands are told only the store URL, the run and their id; everything
 * else they read from the store.  The workload itself is examples/rl
 * (policy.h, rollout.h, grpo.h, adamw.h, traj.h).
 *
 * Files: main.c (the commands), cmd_demo.c (options, output),
 * demo_trainer.c (trainer, supervisor), demo_island.c (the island),
 * demo_report.c (the HTML report), demo_common.c (the objects above),
 * demo_base.c (the pre-trained starting policy and its cache).  It links
 * the CLI's helpers (programs/ferry/util.c) and `ferry mirror`
 * (programs/ferry/cmd_mirror.c, cmd_sync.c) as objects; the ferry CLI
 * links none of this.
 */
#ifndef FERRY_DEMO_H
#define FERRY_DEMO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry.h"
#include "ferry_dock.h"
#include "policy.h"
#include "sft.h"
#include "task.h"

enum { DEMO_SEQUENTIAL = 1, DEMO_ASYNC = 2 };

#define DEMO_MAX_ISLANDS 64
#define DEMO_RUN_MAX 48
/* The command name given to the CLI's message helpers (util.h): none, so
 * that they read "ferry-demo: ..." */
#define DEMO_CMD ""
#define DEMO_KEY_MAX 160

/* RUN/demo/config: everything an island needs besides the store. */
typedef struct demo_config {
    int mode;               /* DEMO_SEQUENTIAL / DEMO_ASYNC */
    int full_sync;          /* islands fetch a full checkpoint per version
                               (the baseline of the parity test) */
    uint32_t islands;       /* N */
    uint32_t prompts;       /* prompts per trainer step, split in N shards */
    uint32_t group;         /* completions per prompt */
    uint32_t queue;         /* async: batches an island may have waiting in
                               the store before it pauses */
    uint64_t max_staleness; /* async: the trainer's S (an island stops
                               waiting for a batch that can only be dropped) */
    uint64_t seed;
    rl_task task;
    rl_policy_config net;
    int quant;              /* a ferry_quant: the run publishes each version
                               quantized (FP8 rollouts: islands hold the FP8
                               checkpoint and sample with its dequantized
                               values); 0: BF16.  Written as "quantize
                               SCHEME", absent for BF16 runs */
} demo_config;

/* The keys of a run. */
void demo_key(char out[DEMO_KEY_MAX], const char *run, const char *leaf);
/* The sync layer's run name of a demo run: RUN/policy. */
void demo_policy_run(char out[DEMO_KEY_MAX], const char *run);

/* Shard i of N of a step's prompts: [*first, *first + *count). */
void demo_shard(uint32_t prompts, uint32_t islands, uint32_t i, uint32_t *first, uint32_t *count);

/* Text form of the config; parse returns 0 or FERRY_ERR_ARG. */
int demo_config_format(const demo_config *c, char *buf, size_t cap);
int demo_config_parse(const char *text, demo_config *c);

/* The probe set of quantized legs (demo_step.fp8_*): prompts of a stream of
 * their own (seed ^ DEMO_PROBE_SEED). */
#define DEMO_PROBE_PROMPTS 8
#define DEMO_PROBE_SEED 0x70726f6265ull

/* Status line of an island. */
#define DEMO_FRESH_HIST 8
typedef struct demo_island_status {
    long pid;
    uint64_t version;       /* held */
    uint64_t syncs;         /* syncs that moved the version */
    double sync_ms;         /* wall time of the last one (fetch + apply + verify) */
    uint64_t sync_bytes;    /* bytes it fetched */
    uint64_t fetched_total; /* bytes fetched since the island started */
    uint64_t batches;       /* batches put since it started */
    char path[128];         /* the sync's path ("chain 4..5", "anchor 1 + chain 1..7") */
    char join[128];         /* the path of this process's first sync: how it joined */
    uint64_t join_version;  /* the version it joined at */
    /* the last DEMO_FRESH_HIST syncs that moved the version: the version
     * reached and the wall time (ms since the epoch) at which it was held,
     * verified — the trainer's time-to-fresh-policy */
    uint64_t fresh_version[DEMO_FRESH_HIST];
    uint64_t fresh_wall_ms[DEMO_FRESH_HIST];
    uint32_t nfresh;
    double wait_ms;         /* total ms the rollout loop waited for weights
                               (sequential: the sync of the requested
                               version; async: before the first version) */
    double busy_ms;         /* total ms since the island started working */
} demo_island_status;

/* Records a sync that reached version v at wall time ms (most recent last). */
void demo_status_fresh(demo_island_status *s, uint64_t v, uint64_t ms);

int demo_status_format(const demo_island_status *s, char *buf, size_t cap);
int demo_status_parse(const char *text, demo_island_status *s);

double demo_now_ms(void);       /* monotonic */
uint64_t demo_wall_ms(void);    /* since the epoch */
void demo_sleep_ms(double ms);

/* ---- results, for the printout, the JSON and the report ---------------- */

typedef struct demo_step {
    uint32_t step;
    uint64_t version;       /* trainer version when the step took its batches */
    double reward;          /* mean reward of the step's completions */
    uint32_t batches, prompts;
    uint64_t stale_min, stale_max;
    uint64_t dropped;       /* batches dropped as stale during this step */
    uint64_t discarded;     /* duplicate shards / invalid payloads ignored */
    int published;          /* a new version followed this step */
    uint64_t pub_version;
    double changed;         /* fraction of BF16 words that differ from the
                               last published version */
    uint64_t delta_bytes;   /* bytes of the new version's delta */
    uint64_t anchor_bytes;  /* bytes of its full object (anchors only) */
    uint64_t bf16_delta_bytes; /* quantized legs: the BF16 patch of the same
                               step (ferry_diff of the BF16 casts, not
                               shipped), to set beside delta_bytes */
    /* quantized legs: the logits of the weights the islands sample with
     * (the FP8 version, dequantized) against those of the BF16 version, on
     * the probe set (DEMO_PROBE_PROMPTS prompts, every teacher-forced
     * context of their answers): max and mean |difference|, mean KL(BF16 ||
     * FP8) per context in nats, share of contexts with the same argmax */
    double fp8_logit_max, fp8_logit_mean, fp8_kl, fp8_top1;
    double pub_ms;          /* ferry_publish_ex: diff + uploads + HEAD */
    double sync_ms;         /* islands' mean sync time to the consumed version */
    double fresh_ms;        /* time-to-fresh-policy of pub_version: publish
                               start -> last island holding it (or newer),
                               verified; < 0 while unknown */
    double ver_fresh_ms;    /* time-to-fresh of fresh_version, the newest
                               version every island held when the row was
                               printed; < 0: none yet */
    uint64_t fresh_version;
    double step_ms;         /* wall time of the step */
    double wait_share;      /* share of the islands' time spent waiting for
                               weights during the step (mean over islands) */
    double t_s;             /* seconds since the leg started */
    uint64_t pub_wall_ms;   /* when the publish of pub_version started */
} demo_step;

enum { DEMO_EV_KILL = 1, DEMO_EV_RESTART = 2, DEMO_EV_DIED = 3, DEMO_EV_REJOIN = 4 };

typedef struct demo_event {
    int kind;
    uint32_t step, island;
    long pid;
    char what[200];
} demo_event;

typedef struct demo_leg {
    char name[48];
    double adaptive;        /* 0: publish after every step */
    int quant;              /* the run's ferry_quant (0: BF16 rollouts) */
    demo_step *steps;
    size_t nsteps;
    demo_event events[64];
    size_t nevents;
    uint64_t stale_hist[FERRY_DOCK_HIST];
    uint64_t full_bytes;    /* one full checkpoint as the run ships it
                               (.safetensors: BF16, or FP8 in a quantized leg) */
    uint64_t bf16_full_bytes; /* one full BF16 checkpoint (every leg) */
    uint64_t bf16_delta_total; /* quantized legs: Σ bf16_delta_bytes */
    uint64_t probes;        /* quantized legs: versions probed (fp8_* of steps) */
    double fp8_logit_max, fp8_logit_mean, fp8_kl, fp8_top1; /* over them: max,
                               and means */
    uint64_t versions, anchors, delta_total, anchor_total;
    uint64_t fetched_total; /* bytes the islands fetched, summed */
    uint64_t admitted, dropped, duplicates, rejected, discarded;
    uint64_t leftover;      /* batches still in the store at the end (deleted) */
    uint64_t produced;      /* batches the islands say they put (a process
                               killed between a put and its status line
                               leaves that batch uncounted here) */
    uint64_t restarted_batches; /* batches of restarted islands consumed after their restart */
    double seconds, reward_first, reward_last;
    double fresh_mean_ms, fresh_max_ms; /* over versions with a known time-to-fresh */
    uint64_t fresh_known;
    double wait_share;      /* islands' time waiting for weights / their working time */
    int window;             /* steps averaged in reward_first / _last */
    char traj_hash[33], masters_hash[33];
} demo_leg;

typedef struct demo_report_info {
    const char *title;
    const char *store_url;
    const char *mode;       /* "sequential" / "async" */
    uint64_t max_staleness;
    uint32_t islands, prompts, group;
    uint64_t seed;
    size_t params;
    const char *task;
    uint32_t digits;
    double lr;
    const char *base;       /* one line: where the starting policy came from */
    const char *machine;    /* one line: cores, CPU */
    int full_sync;
} demo_report_info;

/* ---- the trainer (demo_trainer.c) --------------------------------------- */

typedef struct demo_options {
    const char *store_url;  /* resolved URL of the store */
    const char *mirror_url; /* NULL, or a store the islands take the policy from,
                               kept current by a `ferry mirror` child (the
                               store itself stays their fallback) */
    const char *exe;        /* this program, for the islands */
    const char *key_dir;    /* signed run (docs/SECURITY.md): trainer.key/.pub and
                               island-I.key/.pub here; NULL = unsigned */
    uint32_t islands, steps, prompts, group, queue, anchor_every, max_skip;
    int mode, full_sync, json, quiet;
    const char *dump_dir;   /* NULL, or (tests) where the trainer writes the
                               BF16 cast of every version it publishes
                               (RUN-trainer-vV.safetensors) and each island,
                               when told to stop, the model it holds
                               (RUN-island-I-vV.safetensors) and the FP32
                               weights it sampled with
                               (RUN-island-I-vV-f32.safetensors) */
    uint64_t max_staleness, seed;
    long kill_at;           /* step at which island 0 is killed, -1: never */
    uint32_t restart_after; /* async: steps before the killed island restarts */
    double timeout_s;       /* a step that gets no batch for this long fails */
    float lr;               /* the RL run's AdamW: learning rate */
    float beta1, eps;       /* and its other settings (beta2 stays 0.999) */
    uint32_t lr_warmup;     /* steps of linear learning-rate warm-up (0: none) */
    rl_task task;
    rl_policy_config net;
    const float *base_w;    /* the pre-trained starting policy (FP32,
                               net's layout), or NULL: seeded random weights */
} demo_options;

/* ---- the pre-trained starting policy (demo_base.c) ---------------------- */

typedef struct demo_base {
    char path[4096];        /* the cache file used ("" when not cached) */
    int reused;             /* 1: read back from the cache (hash verified) */
    double seconds;         /* warm-up time (0 when reused) */
    double loss;            /* last warm-up loss */
    char hash[33];          /* XXH3-128 of the FP32 weights */
} demo_base;

/* Makes p's weights the base policy of (seed, task, net, warm-up
 * settings): seeded initial weights, then the supervised warm-up
 * (sft.h).  With cache_dir, first looks for the file of those settings
 * there and reuses it if its recorded settings and weight hash match; else
 * computes and writes it (atomically; a failed write only warns).  p must
 * be created with the config; returns 0 or a FERRY_ERR_* code after
 * printing why to stderr. */
int demo_base_policy(rl_policy *p, const rl_task *t, uint64_t seed, const rl_sft_config *w, const char *cache_dir,
                     demo_base *out);

/* Runs one leg: a fresh run in the store, islands started and stopped,
 * `steps` trainer steps; adaptive = 0 publishes after every step; quant
 * (a ferry_quant, 0: none) publishes every version quantized and makes
 * the islands sample with the quantized weights.  Fills
 * leg (free leg->steps) and prints as it goes (demo_print_*).  Returns 0,
 * or 1 after printing why it failed. */
int demo_run_leg(const demo_options *o, ferry_store *st, double adaptive, int quant, const char *name, demo_leg *leg);
void demo_leg_release(demo_leg *leg);

/* Output (cmd_demo.c): text rows or JSON lines. */
void demo_print_leg_start(const demo_options *o, const demo_leg *leg, const char *run, size_t params,
                          const long *pids);
void demo_print_step(const demo_options *o, const demo_leg *leg, const demo_step *s);
void demo_print_event(const demo_options *o, const demo_leg *leg, const demo_event *e);

/* Set by SIGINT / SIGTERM: the run stops cleanly. */
extern volatile int demo_interrupted;

/* Writes the self-contained HTML report (inline SVG, no external assets)
 * atomically.  Returns 0 or a FERRY_ERR_* code. */
int demo_report_write(const char *path, const demo_report_info *info, const demo_leg *legs, size_t nlegs);

/* ferry-demo's commands: the run (cmd_demo.c) and the hidden `island`
 * (demo_island.c); main.c dispatches. */
int cmd_demo(int argc, char **argv);
int cmd_island(int argc, char **argv);

#endif /* FERRY_DEMO_H */
