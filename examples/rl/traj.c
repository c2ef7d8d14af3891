/* Trajectory batches: allocation, wire format, hostile-input parser
 * (see traj.h for the layout). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "traj.h"

static const unsigned char MAGIC[4] = {'F', 'R', 'L', 'B'};

/* ---- little-endian helpers (byte by byte: no alignment, any host) ---- */
static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint64_t fnv1a64(const unsigned char *p, size_t n)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

/* ---- sizes ---------------------------------------------------------- */

/* Checks the dimension fields; on success the section sizes in bytes.  All
 * factors are bounded first, so the uint64 products below cannot wrap
 * (65536 × 64 and 2^20 × 64 are far below 2^64). */
static int dims_ok(uint32_t n_prompts, uint32_t group, uint32_t prompt_len,
                   uint32_t completion_len, uint32_t vocab, uint64_t *p_bytes,
                   uint64_t *c_bytes, uint64_t *r_bytes, const char **why)
{
    if (n_prompts < 1 || n_prompts > RL_BATCH_MAX_PROMPTS) return *why = "n_prompts", 0;
    if (group < 1 || group > RL_BATCH_MAX_GROUP) return *why = "group", 0;
    if ((uint64_t)n_prompts * group > RL_BATCH_MAX_COMPLETIONS) return *why = "n_prompts x group", 0;
    if (prompt_len < 1 || prompt_len > RL_TASK_MAX_LEN) return *why = "prompt_len", 0;
    if (completion_len < 1 || completion_len > RL_TASK_MAX_LEN) return *why = "completion_len", 0;
    if (vocab < 2 || vocab > 256) return *why = "vocab", 0;
    uint64_t n = (uint64_t)n_prompts * group;
    *p_bytes = (uint64_t)n_prompts * prompt_len;
    *c_bytes = n * completion_len;
    *r_bytes = n * 4;
    return 1;
}

static uint64_t wire_size(uint64_t pb, uint64_t cb, uint64_t rb)
{
    return RL_BATCH_HEADER + pb + cb + rb + 8;
}

size_t rl_batch_wire_size(const rl_batch *b)
{
    uint64_t pb, cb, rb;
    const char *why;
    if (!b || !dims_ok(b->n_prompts, b->group, b->prompt_len, b->completion_len, b->vocab, &pb,
                       &cb, &rb, &why))
        return 0;
    uint64_t n = wire_size(pb, cb, rb);
    return n > SIZE_MAX ? 0 : (size_t)n;
}

/* ---- allocation ----------------------------------------------------- */

int rl_batch_alloc(rl_batch *b, uint32_t n_prompts, uint32_t group, uint32_t prompt_len,
                   uint32_t completion_len, uint32_t vocab)
{
    memset(b, 0, sizeof *b);
    uint64_t pb, cb, rb;
    const char *why;
    if (!dims_ok(n_prompts, group, prompt_len, completion_len, vocab, &pb, &cb, &rb, &why))
        return FERRY_ERR_LIMIT;
    b->prompts = calloc((size_t)pb, 1);
    b->completions = calloc((size_t)cb, 1);
    b->rewards = calloc((size_t)rb / 4, sizeof(float));
    if (!b->prompts || !b->completions || !b->rewards) {
        rl_batch_release(b);
        return FERRY_ERR_NOMEM;
    }
    b->n_prompts = n_prompts;
    b->group = group;
    b->prompt_len = prompt_len;
    b->completion_len = completion_len;
    b->vocab = vocab;
    return FERRY_OK;
}

void rl_batch_release(rl_batch *b)
{
    if (!b) return;
    free(b->prompts);
    free(b->completions);
    free(b->rewards);
    memset(b, 0, sizeof *b);
}

/* ---- content checks shared by both directions ----------------------- */

static int tokens_ok(const uint8_t *t, uint64_t n, uint32_t vocab)
{
    for (uint64_t i = 0; i < n; i++)
        if (t[i] >= vocab) return 0;
    return 1;
}

static int rewards_ok(const float *r, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(r[i])) return 0;
    return 1;
}

/* ---- serialize ------------------------------------------------------ */

int rl_batch_serialize(const rl_batch *b, void *buf, size_t cap, size_t *written)
{
    uint64_t pb, cb, rb;
    const char *why;
    if (!b || !buf || !dims_ok(b->n_prompts, b->group, b->prompt_len, b->completion_len,
                               b->vocab, &pb, &cb, &rb, &why))
        return FERRY_ERR_ARG;
    uint64_t total = wire_size(pb, cb, rb);
    if (total > cap) return FERRY_ERR_ARG;
    if (!tokens_ok(b->prompts, pb, b->vocab) || !tokens_ok(b->completions, cb, b->vocab) ||
        !rewards_ok(b->rewards, rb / 4))
        return FERRY_ERR_ARG;
    unsigned char *p = buf;
    memcpy(p, MAGIC, 4);
    put32(p + 4, RL_BATCH_FORMAT);
    put64(p + 8, b->version);
    put64(p + 16, b->seed);
    put64(p + 24, b->step);
    put32(p + 32, b->first_prompt);
    put32(p + 36, b->n_prompts);
    put32(p + 40, b->group);
    put32(p + 44, b->prompt_len);
    put32(p + 48, b->completion_len);
    put32(p + 52, b->vocab);
    unsigned char *q = p + RL_BATCH_HEADER;
    memcpy(q, b->prompts, (size_t)pb);
    q += pb;
    memcpy(q, b->completions, (size_t)cb);
    q += cb;
    for (uint64_t i = 0; i < rb / 4; i++, q += 4) {
        uint32_t u;
        memcpy(&u, &b->rewards[i], 4);
        put32(q, u);
    }
    put64(q, fnv1a64(p, (size_t)(total - 8)));
    if (written) *written = (size_t)total;
    return FERRY_OK;
}

/* ---- parse ---------------------------------------------------------- */

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

int rl_batch_parse(const void *buf, size_t size, rl_batch *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (err && errlen) err[0] = 0;
    const unsigned char *p = buf;
    if (!buf || size < 8) return fail(err, errlen, RL_ERR_BATCH_TRUNCATED, "batch: %zu bytes", size);
    if (memcmp(p, MAGIC, 4)) return fail(err, errlen, RL_ERR_BATCH_MAGIC, "batch: bad magic");
    if (get32(p + 4) != RL_BATCH_FORMAT)
        return fail(err, errlen, RL_ERR_BATCH_MAGIC, "batch: format %u, want %u", get32(p + 4),
                    RL_BATCH_FORMAT);
    if (size < RL_BATCH_HEADER + 8)
        return fail(err, errlen, RL_ERR_BATCH_TRUNCATED, "batch: %zu bytes, header needs %u",
                    size, RL_BATCH_HEADER + 8);
    rl_batch h = {0};
    h.version = get64(p + 8);
    h.seed = get64(p + 16);
    h.step = get64(p + 24);
    h.first_prompt = get32(p + 32);
    h.n_prompts = get32(p + 36);
    h.group = get32(p + 40);
    h.prompt_len = get32(p + 44);
    h.completion_len = get32(p + 48);
    h.vocab = get32(p + 52);
    uint64_t pb, cb, rb;
    const char *why = "";
    if (!dims_ok(h.n_prompts, h.group, h.prompt_len, h.completion_len, h.vocab, &pb, &cb, &rb,
                 &why))
        return fail(err, errlen, FERRY_ERR_LIMIT, "batch: field %s out of range", why);
    uint64_t total = wire_size(pb, cb, rb);
    if (size < total)
        return fail(err, errlen, RL_ERR_BATCH_TRUNCATED, "batch: %zu bytes, header declares %llu",
                    size, (unsigned long long)total);
    if (size > total)
        return fail(err, errlen, RL_ERR_BATCH_CORRUPT, "batch: %llu trailing bytes",
                    (unsigned long long)(size - total));
    if (get64(p + total - 8) != fnv1a64(p, (size_t)(total - 8)))
        return fail(err, errlen, RL_ERR_BATCH_CHECKSUM, "batch: checksum mismatch");

    const unsigned char *q = p + RL_BATCH_HEADER;
    if (!tokens_ok(q, pb, h.vocab))
        return fail(err, errlen, RL_ERR_BATCH_CORRUPT, "batch: prompt token >= vocab %u", h.vocab);
    if (!tokens_ok(q + pb, cb, h.vocab))
        return fail(err, errlen, RL_ERR_BATCH_CORRUPT, "batch: completion token >= vocab %u",
                    h.vocab);
    int rc = rl_batch_alloc(out, h.n_prompts, h.group, h.prompt_len, h.completion_len, h.vocab);
    if (rc) return fail(err, errlen, rc, "batch: allocation failed");
    memcpy(out->prompts, q, (size_t)pb);
    memcpy(out->completions, q + pb, (size_t)cb);
    q += pb + cb;
    for (uint64_t i = 0; i < rb / 4; i++) {
        uint32_t u = get32(q + 4 * i);
        memcpy(&out->rewards[i], &u, 4);
    }
    if (!rewards_ok(out->rewards, rb / 4)) {
        rl_batch_release(out);
        return fail(err, errlen, RL_ERR_BATCH_CORRUPT, "batch: reward not finite");
    }
    out->version = h.version;
    out->seed = h.seed;
    out->step = h.step;
    out->first_prompt = h.first_prompt;
    return FERRY_OK;
}

/* ---- checks --------------------------------------------------------- */

int rl_batch_verify_rewards(const rl_batch *b, const rl_task *t)
{
    if (rl_task_check(t) || b->prompt_len != t->prompt_len ||
        b->completion_len != t->completion_len)
        return FERRY_ERR_ARG;
    for (uint32_t i = 0; i < b->n_prompts; i++)
        for (uint32_t j = 0; j < b->group; j++) {
            size_t k = (size_t)i * b->group + j;
            float r = rl_task_reward(t, b->prompts + (size_t)i * b->prompt_len,
                                     b->completions + k * b->completion_len);
            if (r != b->rewards[k]) return RL_ERR_BATCH_REWARD;
        }
    return FERRY_OK;
}

double rl_batch_mean_reward(const rl_batch *b)
{
    size_t n = (size_t)b->n_prompts * b->group;
    double s = 0;
    for (size_t i = 0; i < n; i++) s += b->rewards[i];
    return n ? s / (double)n : 0.0;
}

const char *rl_strerror(int code)
{
    switch (code) {
    case RL_ERR_BATCH_MAGIC: return "not a trajectory batch";
    case RL_ERR_BATCH_TRUNCATED: return "trajectory batch truncated";
    case RL_ERR_BATCH_CORRUPT: return "trajectory batch corrupt";
    case RL_ERR_BATCH_CHECKSUM: return "trajectory batch checksum mismatch";
    case RL_ERR_BATCH_REWARD: return "trajectory reward does not match the task";
    }
    return ferry_strerror(code);
}
