/* ferry-demo: the run's shared objects (config, status) and small helpers.
 * Both forms are "key value" lines: easy to read in the store by hand, and
 * parsed as untrusted input (every value bounded, unknown keys refused). */
#include "demo.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void demo_key(char out[DEMO_KEY_MAX], const char *run, const char *leaf)
{
    snprintf(out, DEMO_KEY_MAX, "%s/demo/%s", run, leaf);
}

void demo_policy_run(char out[DEMO_KEY_MAX], const char *run) { snprintf(out, DEMO_KEY_MAX, "%s/policy", run); }

void demo_shard(uint32_t prompts, uint32_t islands, uint32_t i, uint32_t *first, uint32_t *count)
{
    uint64_t a = (uint64_t)i * prompts / islands, b = (uint64_t)(i + 1) * prompts / islands;
    *first = (uint32_t)a;
    *count = (uint32_t)(b - a);
}

int demo_config_format(const demo_config *c, char *buf, size_t cap)
{
    int n = snprintf(buf, cap,
                     "ferry-demo-config 1\nmode %s\nfull_sync %d\nislands %u\nprompts %u\ngroup %u\nqueue %u\nmax_staleness %" PRIu64 "\n"
                     "seed %" PRIu64 "\ntask %s\ndigits %u\nvocab %u\nwindow %u\nembed %u\nheads %u\nhidden %u\n"
                     "layers %u\n",
                     c->mode == DEMO_ASYNC ? "async" : "sequential", c->full_sync, c->islands, c->prompts, c->group,
                     c->queue, c->max_staleness, c->seed, rl_task_name(c->task.kind), c->task.prompt_len, c->net.vocab, c->net.window,
                     c->net.embed, c->net.heads, c->net.hidden, c->net.layers);
    if (n < 0 || (size_t)n >= cap) return FERRY_ERR_LIMIT;
    if (c->quant) {
        /* only in quantized runs: a BF16 run's config reads as before */
        const char *q = ferry_quant_name((ferry_quant)c->quant);
        if (!q) return FERRY_ERR_ARG;
        int k = snprintf(buf + n, cap - (size_t)n, "quantize %s\n", q);
        if (k < 0 || (size_t)k >= cap - (size_t)n) return FERRY_ERR_LIMIT;
    }
    return 0;
}

static int parse_u64(const char *s, uint64_t hi, uint64_t *out) { return cli_parse_u64(s, hi, out) ? 0 : -1; }

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    uint64_t v;
    if (parse_u64(s, hi, &v) || v < lo) return -1;
    *out = (uint32_t)v;
    return 0;
}

int demo_config_parse(const char *text, demo_config *c)
{
    memset(c, 0, sizeof *c);
    unsigned seen = 0, quant_seen = 0;
    const char *p = text;
    int line = 0;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char l[128], k[64], v[64];
        if (len >= sizeof l) return FERRY_ERR_ARG;
        memcpy(l, p, len);
        l[len] = 0;
        p += len + (nl ? 1 : 0);
        if (sscanf(l, "%63s %63s", k, v) != 2) return FERRY_ERR_ARG;
        int bad = 0;
        if (line++ == 0) {
            if (strcmp(k, "ferry-demo-config") || strcmp(v, "1")) return FERRY_ERR_ARG;
            continue;
        }
        uint32_t u = 0;
        if (!strcmp(k, "mode")) {
            c->mode = !strcmp(v, "async") ? DEMO_ASYNC : !strcmp(v, "sequential") ? DEMO_SEQUENTIAL : 0;
            bad = !c->mode, seen |= 1u << 0;
        } else if (!strcmp(k, "full_sync")) bad = parse_u32(v, 0, 1, &u), c->full_sync = (int)u, seen |= 1u << 1;
        else if (!strcmp(k, "islands")) bad = parse_u32(v, 1, DEMO_MAX_ISLANDS, &c->islands), seen |= 1u << 2;
        else if (!strcmp(k, "prompts")) bad = parse_u32(v, 1, 65536, &c->prompts), seen |= 1u << 3;
        else if (!strcmp(k, "group")) bad = parse_u32(v, 1, 1024, &c->group), seen |= 1u << 4;
        else if (!strcmp(k, "queue")) bad = parse_u32(v, 1, 64, &c->queue), seen |= 1u << 5;
        else if (!strcmp(k, "max_staleness")) bad = parse_u64(v, UINT64_MAX, &c->max_staleness), seen |= 1u << 15;
        else if (!strcmp(k, "seed")) bad = parse_u64(v, UINT64_MAX, &c->seed), seen |= 1u << 6;
        else if (!strcmp(k, "task")) bad = rl_task_parse(v, &c->task.kind) != 0, seen |= 1u << 7;
        else if (!strcmp(k, "digits")) {
            bad = parse_u32(v, 1, RL_TASK_MAX_LEN, &c->task.prompt_len), seen |= 1u << 8;
            c->task.completion_len = c->task.prompt_len;
        } else if (!strcmp(k, "vocab")) bad = parse_u32(v, 2, RL_MAX_VOCAB, &c->net.vocab), seen |= 1u << 9;
        else if (!strcmp(k, "window")) bad = parse_u32(v, 1, RL_MAX_WINDOW, &c->net.window), seen |= 1u << 10;
        else if (!strcmp(k, "embed")) bad = parse_u32(v, 1, 65536, &c->net.embed), seen |= 1u << 11;
        else if (!strcmp(k, "heads")) bad = parse_u32(v, 1, RL_MAX_HEADS, &c->net.heads), seen |= 1u << 12;
        else if (!strcmp(k, "hidden")) bad = parse_u32(v, 1, 65536, &c->net.hidden), seen |= 1u << 13;
        else if (!strcmp(k, "layers")) bad = parse_u32(v, 1, RL_MAX_LAYERS, &c->net.layers), seen |= 1u << 14;
        else if (!strcmp(k, "quantize")) { /* optional */
            ferry_quant q = FERRY_QUANT_NONE;
            bad = ferry_quant_parse(v, &q) != 0 || (quant_seen++);
            c->quant = (int)q;
        } else bad = 1;
        if (bad) return FERRY_ERR_ARG;
    }
    if (seen != (1u << 16) - 1 || c->prompts < c->islands || rl_task_check(&c->task)) return FERRY_ERR_ARG;
    return 0;
}

/* Paths have spaces; the status line is space-separated: '_' stands for ' '. */
static void underscores(char *dst, size_t cap, const char *src)
{
    size_t j = 0;
    for (const char *q = src; *q && j + 1 < cap; q++) dst[j++] = *q == ' ' ? '_' : *q;
    dst[j] = 0;
    if (!j) snprintf(dst, cap, "-");
}

static void spaces(char *s)
{
    for (; *s; s++)
        if (*s == '_') *s = ' ';
}

void demo_status_fresh(demo_island_status *s, uint64_t v, uint64_t ms)
{
    if (s->nfresh == DEMO_FRESH_HIST) {
        memmove(s->fresh_version, s->fresh_version + 1, (DEMO_FRESH_HIST - 1) * sizeof s->fresh_version[0]);
        memmove(s->fresh_wall_ms, s->fresh_wall_ms + 1, (DEMO_FRESH_HIST - 1) * sizeof s->fresh_wall_ms[0]);
        s->nfresh--;
    }
    s->fresh_version[s->nfresh] = v;
    s->fresh_wall_ms[s->nfresh] = ms;
    s->nfresh++;
}

int demo_status_format(const demo_island_status *s, char *buf, size_t cap)
{
    char path[128], join[128], fresh[DEMO_FRESH_HIST * 44 + 2] = "-";
    underscores(path, sizeof path, s->path);
    underscores(join, sizeof join, s->join);
    for (uint32_t i = 0, o = 0; i < s->nfresh && i < DEMO_FRESH_HIST; i++)
        o += (uint32_t)snprintf(fresh + o, sizeof fresh - o, "%s%" PRIu64 ":%" PRIu64, i ? "," : "", s->fresh_version[i],
                                s->fresh_wall_ms[i]);
    int n = snprintf(buf, cap,
                     "pid %ld version %" PRIu64 " syncs %" PRIu64 " sync_ms %.3f sync_bytes %" PRIu64 " fetched %" PRIu64
                     " batches %" PRIu64 " path %s join %s join_version %" PRIu64 " wait_ms %.1f busy_ms %.1f fresh %s\n",
                     s->pid, s->version, s->syncs, s->sync_ms, s->sync_bytes, s->fetched_total, s->batches, path, join,
                     s->join_version, s->wait_ms, s->busy_ms, fresh);
    return n < 0 || (size_t)n >= cap ? FERRY_ERR_LIMIT : 0;
}

/* "v:ms,v:ms,..." (at most DEMO_FRESH_HIST pairs) or "-". */
static int parse_fresh(const char *t, demo_island_status *s)
{
    if (!strcmp(t, "-")) return 0;
    while (*t) {
        unsigned long long v, ms;
        int used = 0;
        if (s->nfresh == DEMO_FRESH_HIST || sscanf(t, "%20llu:%20llu%n", &v, &ms, &used) != 2 || !used) return FERRY_ERR_ARG;
        s->fresh_version[s->nfresh] = v;
        s->fresh_wall_ms[s->nfresh] = ms;
        s->nfresh++;
        t += used;
        if (*t == ',') t++;
        else if (*t) return FERRY_ERR_ARG;
    }
    return 0;
}

int demo_status_parse(const char *text, demo_island_status *s)
{
    memset(s, 0, sizeof *s);
    char fresh[DEMO_FRESH_HIST * 44 + 2];
    if (sscanf(text,
               "pid %ld version %" SCNu64 " syncs %" SCNu64 " sync_ms %lf sync_bytes %" SCNu64 " fetched %" SCNu64
               " batches %" SCNu64 " path %127s join %127s join_version %" SCNu64 " wait_ms %lf busy_ms %lf fresh %353s",
               &s->pid, &s->version, &s->syncs, &s->sync_ms, &s->sync_bytes, &s->fetched_total, &s->batches, s->path, s->join,
               &s->join_version, &s->wait_ms, &s->busy_ms, fresh) != 13)
        return FERRY_ERR_ARG;
    if (!(s->wait_ms >= 0 && s->busy_ms >= 0 && s->wait_ms < 1e12 && s->busy_ms < 1e12) || parse_fresh(fresh, s)) {
        memset(s, 0, sizeof *s);
        return FERRY_ERR_ARG;
    }
    spaces(s->path);
    spaces(s->join);
    return 0;
}

double demo_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

uint64_t demo_wall_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

void demo_sleep_ms(double ms)
{
    if (ms <= 0) return;
    struct timespec t = {(time_t)(ms / 1e3), (long)(((ms / 1e3) - (double)(time_t)(ms / 1e3)) * 1e9)};
    while (nanosleep(&t, &t) && errno == EINTR) {}
}
