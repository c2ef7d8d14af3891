/* The reference RL workload (examples/rl): the GRPO gradient against finite
 * differences of an independent float64 forward pass, AdamW against its
 * formula, the trajectory wire format on valid and hostile input, sampling
 * reproducible from (seed, step, prompt, sample) alone, the BF16 export and
 * patch path, and a short training run that must learn. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#include "adamw.h"
#include "grpo.h"
#include "policy.h"
#include "rng.h"
#include "rollout.h"
#include "sft.h"
#include "task.h"
#include "traj.h"

/* ======================================================================
 * A float64 reference of the loss, written from the definitions in
 * policy.h and grpo.h, sharing no code with the module but the layout.
 * ====================================================================== */

static void ref_advantages(const rl_batch *b, double *adv)
{
    uint32_t g = b->group;
    for (uint32_t i = 0; i < b->n_prompts; i++) {
        const float *r = b->rewards + (size_t)i * g;
        double mean = 0, var = 0;
        for (uint32_t j = 0; j < g; j++) mean += r[j];
        mean /= g;
        for (uint32_t j = 0; j < g; j++) var += (r[j] - mean) * (r[j] - mean);
        double sd = g > 1 ? sqrt(var / (g - 1)) : 0;
        for (uint32_t j = 0; j < g; j++)
            adv[(size_t)i * g + j] = var > 0 ? (r[j] - mean) / (sd + (double)RL_GRPO_EPS) : 0;
    }
}

static size_t off(const rl_policy *p, const char *name)
{
    int i = rl_policy_find(p, name);
    if (i < 0) {
        fprintf(stderr, "no tensor %s\n", name);
        abort();
    }
    return p->tensors[i].offset;
}

/* log π(y | ctx of length n) in float64 with weights w (laid out as p->w). */
static double ref_logp(const rl_policy *p, const double *w, const uint8_t *ctx, uint32_t n,
                       uint8_t y)
{
    const rl_policy_config *c = &p->cfg;
    size_t E = c->embed, H = c->hidden, V = c->vocab, W = c->window;
    size_t in0 = (W + c->heads) * E;
    double x[1024], h[64], lg[64];
    if (in0 > 1024 || H > 64 || V > 64) abort(); /* tiny networks only */
    const double *emb = w + off(p, "embed.weight");
    for (size_t s = 0; s < W; s++)
        for (size_t e = 0; e < E; e++) x[s * E + e] = emb[ctx[s] * E + e];
    for (size_t hd = 0; hd < c->heads; hd++) {
        const double *score = w + off(p, "mix.weight") + (hd * W + n - 1) * W;
        double z = 0, mx = -1e300;
        const double g = RL_MIX_SCALE;
        for (size_t s = 0; s < n; s++) mx = fmax(mx, g * score[s]);
        for (size_t s = 0; s < n; s++) z += exp(g * score[s] - mx);
        for (size_t e = 0; e < E; e++) {
            double m = 0;
            for (size_t s = 0; s < n; s++) m += exp(g * score[s] - mx) / z * emb[ctx[s] * E + e];
            x[(W + hd) * E + e] = m;
        }
    }
    size_t nin = in0;
    for (uint32_t l = 0; l < c->layers; l++) {
        char wn[32], bn[32];
        snprintf(wn, sizeof wn, "mlp.%u.weight", l);
        snprintf(bn, sizeof bn, "mlp.%u.bias", l);
        for (size_t j = 0; j < H; j++) {
            double z = w[off(p, bn) + j];
            for (size_t i = 0; i < nin; i++) z += x[i] * w[off(p, wn) + i * H + j];
            h[j] = tanh(z);
        }
        memcpy(x, h, H * sizeof *h);
        nin = H;
    }
    double mx = -1e300, sum = 0;
    for (size_t v = 0; v < V; v++) {
        lg[v] = w[off(p, "head.bias") + v];
        for (size_t i = 0; i < H; i++) lg[v] += x[i] * w[off(p, "head.weight") + i * V + v];
        if (lg[v] > mx) mx = lg[v];
    }
    for (size_t v = 0; v < V; v++) sum += exp(lg[v] - mx);
    return lg[y] - mx - log(sum);
}

/* -(1/N) Σ_k A_k Σ_t log π(y_kt). */
static double ref_loss(const rl_policy *p, const double *w, const rl_batch *b)
{
    size_t n = (size_t)b->n_prompts * b->group;
    double *adv = malloc(n * sizeof *adv), loss = 0;
    uint8_t ctx[256];
    ref_advantages(b, adv);
    for (size_t k = 0; k < n; k++) {
        const uint8_t *prompt = b->prompts + (k / b->group) * b->prompt_len;
        const uint8_t *comp = b->completions + k * b->completion_len;
        for (uint32_t t = 0; t < b->completion_len; t++) {
            memset(ctx, RL_TOK_PAD, sizeof ctx);
            memcpy(ctx, prompt, b->prompt_len);
            memcpy(ctx + b->prompt_len, comp, t);
            loss -= adv[k] * ref_logp(p, w, ctx, b->prompt_len + t, comp[t]) / (double)n;
        }
    }
    free(adv);
    return loss;
}

/* A tiny policy with weights large enough that every layer matters. */
static void tiny_policy(rl_policy *p, uint32_t layers, uint64_t seed)
{
    rl_policy_config c = {.vocab = 12, .window = 5, .embed = 3, .heads = 2, .hidden = 7,
                          .layers = layers};
    CHECK_OK(rl_policy_create(p, &c));
    rl_policy_init_weights(p, seed);
    rl_rng r = rl_rng_stream(seed, RL_RNG_TEST, 1, 0, 0);
    for (size_t i = 0; i < p->nparams; i++) p->w[i] += (float)(0.3 * rl_rng_normal(&r));
    /* Mixing scores ~ N(0, 0.3²) too, not RL_MIX_SCALE times that. */
    const rl_param *mix = &p->tensors[rl_policy_find(p, "mix.weight")];
    for (size_t i = 0; i < mix->count; i++) p->w[mix->offset + i] /= (float)RL_MIX_SCALE;
}

/* A hand-made batch: 2 prompts x 4 completions of 3 tokens, random tokens
 * (any of the vocabulary) and rewards with a flat group to exercise A = 0. */
static void tiny_batch(rl_batch *b, int flat_second)
{
    CHECK_OK(rl_batch_alloc(b, 2, 4, 3, 3, 12));
    rl_rng r = rl_rng_stream(7, RL_RNG_TEST, 2, 0, 0);
    for (size_t i = 0; i < 6; i++) b->prompts[i] = (uint8_t)rl_rng_below(&r, 12);
    for (size_t i = 0; i < 24; i++) b->completions[i] = (uint8_t)rl_rng_below(&r, 12);
    const float rw[8] = {0.0f, 1.0f / 3, 1.0f, 2.0f / 3, 0.5f, 0.25f, 0.0f, 1.0f};
    for (size_t i = 0; i < 8; i++) b->rewards[i] = flat_second && i >= 4 ? 0.5f : rw[i];
}

static void gradcheck(uint32_t layers, int flat_second)
{
    rl_policy p;
    rl_batch b;
    rl_work ws = {0};
    tiny_policy(&p, layers, 3 + layers);
    tiny_batch(&b, flat_second);
    float *g = malloc(p.nparams * sizeof *g);
    double *w = malloc(p.nparams * sizeof *w);
    rl_grpo_stats st;
    CHECK_OK(rl_grpo_grad(&p, &b, &ws, g, &st));
    for (size_t i = 0; i < p.nparams; i++) w[i] = p.w[i];
    double l0 = ref_loss(&p, w, &b);
    CHECK(fabs(st.loss - l0) <= 1e-5 * (1 + fabs(l0)));
    CHECK(st.completions == 8 && st.active == (flat_second ? 4u : 8u));
    CHECK(st.flat_groups == (flat_second ? 1u : 0u));

    double gmax = 0, worst = 0;
    double *fd = malloc(p.nparams * sizeof *fd);
    for (size_t i = 0; i < p.nparams; i++) {
        const double h = 1e-5;
        double wi = w[i];
        w[i] = wi + h;
        double lp = ref_loss(&p, w, &b);
        w[i] = wi - h;
        double lm = ref_loss(&p, w, &b);
        w[i] = wi;
        fd[i] = (lp - lm) / (2 * h);
        if (fabs(fd[i]) > gmax) gmax = fabs(fd[i]);
    }
    CHECK(gmax > 1e-3); /* the check must not pass vacuously */
    for (size_t i = 0; i < p.nparams; i++) {
        double err = fabs(g[i] - fd[i]) / (1e-3 * gmax + fabs(fd[i]));
        if (err > worst) worst = err;
    }
    if (!(worst < 1e-3))
        fprintf(stderr, "gradcheck(layers %u): worst relative error %.3g (max |g| %.3g)\n", layers,
                worst, gmax);
    CHECK(worst < 1e-3);
    free(fd);
    free(g);
    free(w);
    rl_batch_release(&b);
    rl_work_release(&ws);
    rl_policy_release(&p);
}

static void test_gradient_matches_finite_differences(void)
{
    gradcheck(1, 0);
    gradcheck(2, 0);
    gradcheck(2, 1);
}

/* Accumulating two batches at scale 1/N each equals the gradient of their
 * concatenation; zero advantage gives zero gradient. */
static void test_gradient_accumulates(void)
{
    rl_policy p;
    rl_batch b;
    rl_work ws = {0};
    tiny_policy(&p, 2, 11);
    tiny_batch(&b, 0);
    size_t n = p.nparams;
    float *g1 = malloc(n * sizeof *g1), *g2 = calloc(n, sizeof *g2);
    CHECK_OK(rl_grpo_grad(&p, &b, &ws, g1, NULL));
    CHECK_OK(rl_grpo_accumulate(&p, &b, 1.0 / 16, &ws, g2, NULL));
    CHECK_OK(rl_grpo_accumulate(&p, &b, 1.0 / 16, &ws, g2, NULL));
    double err = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs(g2[i] - g1[i]));
        mx = fmax(mx, fabs(g1[i]));
    }
    CHECK(mx > 0 && err <= 1e-5 * mx);
    for (size_t i = 0; i < 8; i++) b.rewards[i] = 1.0f;
    CHECK_OK(rl_grpo_grad(&p, &b, &ws, g1, NULL));
    mx = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(g1[i]));
    CHECK(mx == 0);
    b.completions[5] = 12; /* out of the vocabulary: refused, not read */
    CHECK_RC(rl_grpo_grad(&p, &b, &ws, g1, NULL), FERRY_ERR_ARG);
    free(g1);
    free(g2);
    rl_batch_release(&b);
    rl_work_release(&ws);
    rl_policy_release(&p);
}

static void test_task_rewards(void)
{
    rl_task t = {RL_TASK_REVERSE, 4, 4};
    const uint8_t p[4] = {1 + 3, 1 + 1, 1 + 4, 1 + 1}; /* digits 3 1 4 1 */
    const uint8_t rev[4] = {2, 5, 2, 4}, half[4] = {2, 5, 9, 31}, none[4] = {0, 0, 0, 0};
    CHECK_OK(rl_task_check(&t));
    CHECK(rl_task_reward(&t, p, rev) == 1.0f);
    CHECK(rl_task_reward(&t, p, half) == 0.5f);
    CHECK(rl_task_reward(&t, p, none) == 0.0f);
    t.kind = RL_TASK_COPY;
    CHECK(rl_task_reward(&t, p, p) == 1.0f);
    t.kind = RL_TASK_SORT;
    const uint8_t sorted[4] = {2, 2, 4, 5};
    CHECK(rl_task_reward(&t, p, sorted) == 1.0f);
    t.completion_len = 3;
    CHECK_RC(rl_task_check(&t), FERRY_ERR_ARG);
    rl_task_kind k;
    CHECK(rl_task_parse("reverse", &k) == 0 && k == RL_TASK_REVERSE);
    CHECK(rl_task_parse("nope", &k) == -1);
    /* Prompts: digits only, a function of (seed, step, index). */
    rl_task d = rl_task_default();
    uint8_t a[6], b[6], c[6];
    rl_task_prompt(&d, 1, 2, 3, a);
    rl_task_prompt(&d, 1, 2, 3, b);
    rl_task_prompt(&d, 1, 2, 4, c);
    CHECK(!memcmp(a, b, 6) && memcmp(a, c, 6));
    for (int i = 0; i < 6; i++) CHECK(a[i] >= RL_TOK_DIGIT0 && a[i] < RL_TOK_DIGIT0 + 10);
}

static void test_advantages(void)
{
    const float r[6] = {0, 1, 0.5f, 0.25f, 0.25f, 0.25f};
    float a[6];
    rl_grpo_advantages(r, 2, 3, RL_GRPO_EPS, a);
    /* group 1: mean 0.5, sample std 0.5 */
    CHECK(fabsf(a[0] + 0.5f / (0.5f + RL_GRPO_EPS)) < 1e-6f);
    CHECK(fabsf(a[1] - 0.5f / (0.5f + RL_GRPO_EPS)) < 1e-6f);
    CHECK(a[2] == 0.0f);
    CHECK(a[3] == 0.0f && a[4] == 0.0f && a[5] == 0.0f);
    rl_grpo_advantages(r, 6, 1, RL_GRPO_EPS, a); /* groups of one teach nothing */
    for (int i = 0; i < 6; i++) CHECK(a[i] == 0.0f);
}

/* ======================================================================
 * AdamW against the formula of torch.optim.AdamW, in double.
 * ====================================================================== */
static void test_adamw_formula(void)
{
    rl_adamw_config c = rl_adamw_config_default();
    c.lr = 1e-3f;
    c.weight_decay = 0.1f;
    rl_adamw o;
    CHECK_OK(rl_adamw_init(&o, 3, &c));
    float p[3] = {0.5f, -0.25f, 0.0f};
    double rp[3] = {0.5, -0.25, 0.0}, m[3] = {0}, v[3] = {0};
    const float g[4][3] = {{0.1f, -2.0f, 0.0f}, {0.3f, 1.0f, 1e-3f}, {-0.2f, 0.5f, 0.0f},
                           {0.0f, 0.0f, 0.0f}};
    for (int t = 1; t <= 4; t++) {
        rl_adamw_step(&o, p, g[t - 1]);
        for (int i = 0; i < 3; i++) {
            double gi = g[t - 1][i];
            rp[i] *= 1 - (double)c.lr * c.weight_decay;
            m[i] = 0.9 * m[i] + 0.1 * gi;
            v[i] = 0.999 * v[i] + 0.001 * gi * gi;
            double mh = m[i] / (1 - pow(0.9, t)), vh = v[i] / (1 - pow(0.999, t));
            rp[i] -= c.lr * mh / (sqrt(vh) + 1e-8);
            CHECK(fabs(p[i] - rp[i]) <= 1e-6 * (fabs(rp[i]) + 1e-3));
        }
    }
    /* First step moves by ~lr·sign(g): what makes BF16 words flip. */
    CHECK(o.t == 4);
    rl_adamw_release(&o);
    c.beta1 = 1.0f;
    CHECK_RC(rl_adamw_init(&o, 3, &c), FERRY_ERR_ARG);
}

/* ======================================================================
 * Trajectory batches: round trip and hostile input.
 * ====================================================================== */

/* A small real policy whose rollouts fit the default task shape. */
static void small_policy(rl_policy *p, const rl_task *t, uint32_t hidden, uint64_t seed)
{
    rl_policy_config c = {.vocab = 16, .window = t->prompt_len + t->completion_len - 1,
                          .embed = 8, .heads = 2, .hidden = hidden, .layers = 2};
    CHECK_OK(rl_policy_create(p, &c));
    rl_policy_init_weights(p, seed);
}

static int batches_equal(const rl_batch *a, const rl_batch *b)
{
    if (a->version != b->version || a->seed != b->seed || a->step != b->step ||
        a->first_prompt != b->first_prompt || a->n_prompts != b->n_prompts ||
        a->group != b->group || a->prompt_len != b->prompt_len ||
        a->completion_len != b->completion_len || a->vocab != b->vocab)
        return 0;
    size_t n = (size_t)a->n_prompts * a->group;
    return !memcmp(a->prompts, b->prompts, (size_t)a->n_prompts * a->prompt_len) &&
           !memcmp(a->completions, b->completions, n * a->completion_len) &&
           !memcmp(a->rewards, b->rewards, n * sizeof(float));
}

/* Rewrites the checksum after an edit, so that the field checks behind it
 * are reached. */
static void reseal(unsigned char *buf, size_t size)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i + 8 < size; i++) h = (h ^ buf[i]) * 0x100000001B3ull;
    for (int i = 0; i < 8; i++) buf[size - 8 + i] = (unsigned char)(h >> (8 * i));
}

static void put32le(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void test_batch_wire(void)
{
    rl_task t = rl_task_default();
    rl_policy p;
    rl_work ws = {0};
    small_policy(&p, &t, 16, 5);
    rl_batch b, got;
    rl_rollout_args a = {.seed = 9, .step = 4, .version = 77, .first_prompt = 3, .n_prompts = 3,
                         .group = 5};
    CHECK_OK(rl_rollout(&p, &t, &a, &ws, &b));
    size_t size = rl_batch_wire_size(&b), w = 0;
    CHECK(size == RL_BATCH_HEADER + 3 * 6 + 15 * 6 + 15 * 4 + 8);
    unsigned char *buf = malloc(size + 1), *bad = malloc(size + 1);
    CHECK_OK(rl_batch_serialize(&b, buf, size, &w));
    CHECK(w == size);
    CHECK_RC(rl_batch_serialize(&b, buf, size - 1, &w), FERRY_ERR_ARG);
    char err[160];
    CHECK_OK(rl_batch_parse(buf, size, &got, err, sizeof err));
    CHECK(batches_equal(&b, &got));
    CHECK_OK(rl_batch_verify_rewards(&got, &t));
    rl_batch_release(&got);

    /* Every truncation fails, and leaves *out empty. */
    for (size_t n = 0; n < size; n++) {
        int rc = rl_batch_parse(buf, n, &got, err, sizeof err);
        CHECK(rc != 0 && got.prompts == NULL);
        if (!rc) rl_batch_release(&got);
    }
    /* Trailing bytes fail. */
    memcpy(bad, buf, size);
    bad[size] = 0;
    CHECK_RC(rl_batch_parse(bad, size + 1, &got, err, sizeof err), RL_ERR_BATCH_CORRUPT);
    /* Every single-bit flip fails (the checksum, or a field check first). */
    int all_failed = 1;
    for (size_t i = 0; i < size; i++)
        for (int bit = 0; bit < 8; bit += 3) {
            memcpy(bad, buf, size);
            bad[i] ^= (unsigned char)(1u << bit);
            int rc = rl_batch_parse(bad, size, &got, NULL, 0);
            if (!rc) {
                all_failed = 0;
                rl_batch_release(&got);
            }
        }
    CHECK(all_failed);

    /* Field checks behind a valid checksum. */
    struct {
        size_t at;
        uint32_t value;
        int want;
    } edits[] = {
        {0, 0x424C5246u ^ 1u, RL_ERR_BATCH_MAGIC},   /* magic */
        {4, 2, RL_ERR_BATCH_MAGIC},                  /* format */
        {36, 0, FERRY_ERR_LIMIT},                    /* n_prompts 0 */
        {36, 0xFFFFFFFFu, FERRY_ERR_LIMIT},          /* n_prompts huge */
        {40, 1025, FERRY_ERR_LIMIT},                 /* group over the bound */
        {36, 65536, RL_ERR_BATCH_TRUNCATED},         /* in bounds, but not there */
        {44, 65, FERRY_ERR_LIMIT},                   /* prompt_len */
        {48, 0, FERRY_ERR_LIMIT},                    /* completion_len */
        {52, 257, FERRY_ERR_LIMIT},                  /* vocab */
        {52, 5, RL_ERR_BATCH_CORRUPT},               /* tokens now >= vocab */
    };
    for (size_t e = 0; e < sizeof edits / sizeof *edits; e++) {
        memcpy(bad, buf, size);
        put32le(bad + edits[e].at, edits[e].value);
        reseal(bad, size);
        int rc = rl_batch_parse(bad, size, &got, err, sizeof err);
        if (rc != edits[e].want)
            fprintf(stderr, "edit %zu: got %d (%s), want %d\n", e, rc, err, edits[e].want);
        CHECK(rc == edits[e].want && got.prompts == NULL);
        if (!rc) rl_batch_release(&got);
    }
    /* A NaN reward, and a reward the task disagrees with. */
    size_t roff = size - 8 - 15 * 4;
    memcpy(bad, buf, size);
    put32le(bad + roff, 0x7FC00000u);
    reseal(bad, size);
    CHECK_RC(rl_batch_parse(bad, size, &got, err, sizeof err), RL_ERR_BATCH_CORRUPT);
    memcpy(bad, buf, size);
    float lie = b.rewards[0] + 0.5f;
    uint32_t u;
    memcpy(&u, &lie, 4);
    put32le(bad + roff, u);
    reseal(bad, size);
    CHECK_OK(rl_batch_parse(bad, size, &got, err, sizeof err));
    CHECK_RC(rl_batch_verify_rewards(&got, &t), RL_ERR_BATCH_REWARD);
    rl_batch_release(&got);
    /* Garbage and NULL. */
    CHECK_RC(rl_batch_parse(NULL, 0, &got, err, sizeof err), RL_ERR_BATCH_TRUNCATED);
    memset(bad, 0xA5, size);
    CHECK(rl_batch_parse(bad, size, &got, err, sizeof err) != 0);

    free(buf);
    free(bad);
    rl_batch_release(&b);
    rl_work_release(&ws);
    rl_policy_release(&p);
}

/* ======================================================================
 * Sampling: a function of (seed, step, prompt, sample) and the weights.
 * ====================================================================== */
static void test_sampling_deterministic(void)
{
    rl_task t = rl_task_default();
    rl_policy p;
    rl_work ws = {0}, ws2 = {0};
    small_policy(&p, &t, 24, 6);
    rl_batch all, again, part, wide, other;
    rl_rollout_args a = {.seed = 42, .step = 3, .first_prompt = 10, .n_prompts = 6, .group = 4};
    CHECK_OK(rl_rollout(&p, &t, &a, &ws, &all));
    CHECK_OK(rl_rollout(&p, &t, &a, &ws2, &again));
    CHECK(batches_equal(&all, &again));
    /* Prompts 13..15 alone, as another island would draw them. */
    rl_rollout_args b = a;
    b.first_prompt = 13;
    b.n_prompts = 3;
    CHECK_OK(rl_rollout(&p, &t, &b, &ws, &part));
    CHECK(!memcmp(part.prompts, all.prompts + 3 * 6, 3 * 6));
    CHECK(!memcmp(part.completions, all.completions + 3 * 4 * 6, 3 * 4 * 6));
    /* A larger group: its first 4 samples are the same. */
    rl_rollout_args c = a;
    c.group = 7;
    CHECK_OK(rl_rollout(&p, &t, &c, &ws, &wide));
    int same = 1;
    for (uint32_t i = 0; i < 6; i++)
        same &= !memcmp(wide.completions + (size_t)i * 7 * 6, all.completions + (size_t)i * 4 * 6,
                        4 * 6);
    CHECK(same);
    /* Another step draws other prompts and samples. */
    rl_rollout_args d = a;
    d.step = 4;
    CHECK_OK(rl_rollout(&p, &t, &d, &ws, &other));
    CHECK(memcmp(other.prompts, all.prompts, 6 * 6) != 0);
    CHECK(memcmp(other.completions, all.completions, 24 * 6) != 0);
    /* More rows than one sampling chunk (1024): the same per-row streams. */
    rl_batch big, last;
    rl_rollout_args e = {.seed = 42, .step = 3, .first_prompt = 0, .n_prompts = 5, .group = 250};
    CHECK_OK(rl_rollout(&p, &t, &e, &ws, &big));
    e.first_prompt = 4;
    e.n_prompts = 1;
    CHECK_OK(rl_rollout(&p, &t, &e, &ws2, &last));
    CHECK(!memcmp(last.completions, big.completions + 4 * 250 * 6, 250 * 6));
    CHECK(!memcmp(last.rewards, big.rewards + 4 * 250, 250 * sizeof(float)));
    rl_batch_release(&big);
    rl_batch_release(&last);
    rl_batch_release(&all);
    rl_batch_release(&again);
    rl_batch_release(&part);
    rl_batch_release(&wide);
    rl_batch_release(&other);
    rl_work_release(&ws);
    rl_work_release(&ws2);
    rl_policy_release(&p);
}

/* ======================================================================
 * ferry models: export, BF16 cast, load back, patches between versions.
 * ====================================================================== */
static void test_models_and_patches(void)
{
    rl_task t = rl_task_default();
    rl_policy p, island, island2;
    small_policy(&p, &t, 32, 8);
    small_policy(&island, &t, 32, 0);
    small_policy(&island2, &t, 32, 0);
    size_t n = p.nparams;
    CHECK(n == 16 * 8 + 2 * 11 * 11 + (13 * 8 * 32 + 32) + (32 * 32 + 32) + (32 * 16 + 16));
    CHECK(n == rl_policy_config_params(&p.cfg));
    rl_policy_config def = rl_policy_config_default();
    CHECK(rl_policy_config_params(&def) >= 1000000);

    ferry_model *mf = NULL, *m0 = NULL, *m1 = NULL, *out = NULL;
    uint16_t *b0 = malloc(n * 2), *b1 = malloc(n * 2), *b2 = malloc(n * 2);
    CHECK_OK(rl_policy_model_f32(&p, &mf));
    CHECK(ferry_model_count(mf) == p.ntensors);
    const ferry_tensor *ft = ferry_model_find(mf, "mlp.1.weight");
    CHECK(ft && ft->dtype == FERRY_F32 && ft->ndim == 2 && ft->shape[0] == 32 && ft->shape[1] == 32);
    CHECK(ferry_model_nbytes(mf) == n * 4);

    rl_policy_cast_bf16(&p, b0);
    CHECK_OK(rl_policy_model_bf16(&p, b0, &m0));
    CHECK(ferry_model_nbytes(m0) == n * 2);
    /* Island: load the BF16 model == set_bf16 of the image. */
    CHECK_OK(rl_policy_load(&island, m0));
    rl_policy_set_bf16(&island2, b0);
    CHECK(!memcmp(island.w, island2.w, n * 4));
    for (size_t i = 0; i < n; i += 97) CHECK(island.w[i] == ferry_bf16_to_f32(b0[i]));
    /* The F32 masters load back exactly. */
    CHECK_OK(rl_policy_load(&island, mf));
    CHECK(!memcmp(island.w, p.w, n * 4));

    /* One training step, then the patch version 0 -> 1 reproduces version 1. */
    rl_adamw o;
    rl_adamw_config ac = rl_adamw_config_default();
    CHECK_OK(rl_adamw_init(&o, n, &ac));
    rl_work ws = {0};
    rl_batch b;
    rl_rollout_args a = {.seed = 1, .n_prompts = 4, .group = 4};
    rl_policy_set_bf16(&island, b0);
    CHECK_OK(rl_rollout(&island, &t, &a, &ws, &b));
    float *g = malloc(n * sizeof *g);
    CHECK_OK(rl_grpo_grad(&p, &b, &ws, g, NULL));
    rl_adamw_step(&o, p.w, g);
    rl_policy_cast_bf16(&p, b1);
    CHECK_OK(rl_policy_model_bf16(&p, b1, &m1));
    void *patch = NULL;
    size_t psize = 0;
    CHECK_OK(ferry_diff(m0, m1, NULL, &patch, &psize));
    CHECK(psize > 0 && psize < n * 2);
    CHECK_OK(ferry_apply(m0, patch, psize, &out));
    CHECK_OK(rl_policy_bf16_from_model(&p, out, b2));
    CHECK(!memcmp(b1, b2, n * 2));
    CHECK_RC(rl_policy_bf16_from_model(&p, mf, b2), FERRY_ERR_UNSUPPORTED);

    /* An island can size its policy from the first model it receives. */
    rl_policy_config got;
    CHECK_OK(rl_policy_config_from_model(m0, &got));
    CHECK(!memcmp(&got, &p.cfg, sizeof got));
    rl_policy_config want = rl_policy_config_for_task(&t);
    CHECK(want.window == 11 && rl_policy_config_params(&want) == 1001298);
    ferry_model *empty = NULL;
    CHECK_OK(ferry_model_create(&empty));
    CHECK_RC(rl_policy_config_from_model(empty, &got), FERRY_ERR_NOT_FOUND);
    ferry_model_free(empty);

    /* A model of another network is refused, and the policy is untouched. */
    rl_policy other;
    rl_policy_config oc = p.cfg;
    oc.hidden = 24;
    CHECK_OK(rl_policy_create(&other, &oc));
    ferry_model *mo = NULL;
    CHECK_OK(rl_policy_model_f32(&other, &mo));
    memcpy(island2.w, island.w, n * 4);
    CHECK_RC(rl_policy_load(&island, mo), FERRY_ERR_SHAPE_MISMATCH);
    CHECK(!memcmp(island2.w, island.w, n * 4));

    ferry_free(patch);
    ferry_model_free(mo);
    ferry_model_free(out);
    ferry_model_free(m1);
    ferry_model_free(m0);
    ferry_model_free(mf);
    rl_policy_release(&other);
    rl_batch_release(&b);
    rl_work_release(&ws);
    rl_adamw_release(&o);
    free(g);
    free(b0);
    free(b1);
    free(b2);
    rl_policy_release(&p);
    rl_policy_release(&island);
    rl_policy_release(&island2);
}

/* ======================================================================
 * Training: the parity hook and learning itself.
 * ====================================================================== */
typedef struct train_result {
    double reward[64];
    uint64_t batch_hash;  /* FNV of every batch's wire bytes, in order */
    uint64_t weight_hash; /* FNV of the final masters */
} train_result;

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001B3ull;
    return h;
}

/* The loop of rl_train in miniature.  via_patch: the island's BF16 weights
 * are the previous ones patched with ferry_apply (as ferry-demo will
 * sync them); else a copy of the trainer's cast (full checkpoints). */
static void train(const rl_task *t, const rl_policy_config *cfg, float lr, int steps,
                  uint32_t prompts, uint32_t group, uint64_t seed, int via_patch,
                  train_result *res)
{
    rl_policy p, island;
    rl_adamw o;
    rl_work ws = {0};
    rl_adamw_config ac = rl_adamw_config_default();
    ac.lr = lr;
    CHECK_OK(rl_policy_create(&p, cfg));
    CHECK_OK(rl_policy_create(&island, cfg));
    rl_policy_init_weights(&p, seed);
    CHECK_OK(rl_adamw_init(&o, p.nparams, &ac));
    size_t n = p.nparams;
    uint16_t *cast = malloc(n * 2), *held = malloc(n * 2), *prev = malloc(n * 2);
    float *g = malloc(n * sizeof *g);
    memset(res, 0, sizeof *res);
    res->batch_hash = res->weight_hash = 0xCBF29CE484222325ull;
    for (int s = 0; s < steps; s++) {
        rl_policy_cast_bf16(&p, cast);
        if (s == 0 || !via_patch) {
            memcpy(held, cast, n * 2);
        } else {
            ferry_model *mp = NULL, *mc = NULL, *out = NULL;
            void *patch = NULL;
            size_t ps = 0;
            CHECK_OK(rl_policy_model_bf16(&p, prev, &mp));
            CHECK_OK(rl_policy_model_bf16(&p, cast, &mc));
            CHECK_OK(ferry_diff(mp, mc, NULL, &patch, &ps));
            CHECK_OK(ferry_apply(mp, patch, ps, &out)); /* mp borrows prev == held */
            CHECK_OK(rl_policy_bf16_from_model(&p, out, held));
            ferry_free(patch);
            ferry_model_free(out);
            ferry_model_free(mc);
            ferry_model_free(mp);
        }
        memcpy(prev, held, n * 2);
        rl_policy_set_bf16(&island, held);
        rl_rollout_args a = {.seed = seed, .step = (uint64_t)s, .version = (uint64_t)s,
                             .n_prompts = prompts, .group = group};
        rl_batch b;
        CHECK_OK(rl_rollout(&island, t, &a, &ws, &b));
        size_t wsz = rl_batch_wire_size(&b), wl = 0;
        unsigned char *wire = malloc(wsz);
        CHECK_OK(rl_batch_serialize(&b, wire, wsz, &wl));
        res->batch_hash = fnv(res->batch_hash, wire, wl);
        free(wire);
        if (s < 64) res->reward[s] = rl_batch_mean_reward(&b);
        CHECK_OK(rl_grpo_grad(&p, &b, &ws, g, NULL));
        rl_adamw_step(&o, p.w, g);
        rl_batch_release(&b);
    }
    res->weight_hash = fnv(res->weight_hash, p.w, n * 4);
    free(cast);
    free(held);
    free(prev);
    free(g);
    rl_adamw_release(&o);
    rl_work_release(&ws);
    rl_policy_release(&island);
    rl_policy_release(&p);
}

/* Learning-test setting: reverse 3 digits with a small net and a high lr.
 * Measured with rl_train (--task reverse --digits 3 --vocab 16 --embed 8
 * --dim 64 --lr 1e-2 --steps 30) on seeds 1..11: mean reward of the first
 * 10 steps 0.09..0.15, of the last 10 steps 0.51..0.80 (seed 1: 0.09 ->
 * 0.64), so a gain of 0.25 fails only if learning breaks. */
static const rl_task LEARN_TASK = {RL_TASK_REVERSE, 3, 3};
static const rl_policy_config LEARN_NET = {.vocab = 16, .window = 5, .embed = 8, .heads = 2,
                                           .hidden = 64, .layers = 2};
#define LEARN_LR 1e-2f

static void test_parity_patch_vs_full(void)
{
    train_result a, b;
    train(&LEARN_TASK, &LEARN_NET, LEARN_LR, 6, 8, 4, 5, 1, &a);
    train(&LEARN_TASK, &LEARN_NET, LEARN_LR, 6, 8, 4, 5, 0, &b);
    CHECK(a.batch_hash == b.batch_hash);
    CHECK(a.weight_hash == b.weight_hash);
    train(&LEARN_TASK, &LEARN_NET, LEARN_LR, 6, 8, 4, 6, 0, &b); /* and seeds matter */
    CHECK(a.batch_hash != b.batch_hash);
}

static void test_training_learns(void)
{
    train_result r;
    train(&LEARN_TASK, &LEARN_NET, LEARN_LR, 30, 16, 8, 1, 0, &r);
    double first = 0, last = 0;
    for (int s = 0; s < 10; s++) first += r.reward[s] / 10;
    for (int s = 20; s < 30; s++) last += r.reward[s] / 10;
    printf("     reward: first 10 steps %.3f, last 10 steps %.3f\n", first, last);
    CHECK(first < 0.2);
    CHECK(last > first + 0.25);
}

/* The supervised warm-up (sft.h): its gradient is the derivative of the
 * loss it reports (central differences on the tiny policy, task reverse 3
 * digits), it is deterministic in its seed, it draws its own prompts (not
 * the RL run's), and it teaches the task: the loss falls and the reward of
 * a rollout rises far above chance. */
static void test_sft_warmup(void)
{
    rl_policy p;
    rl_work ws = {0};
    tiny_policy(&p, 2, 5);
    rl_task t = {RL_TASK_REVERSE, 3, 3};
    size_t n = p.nparams;
    float *g = malloc(n * sizeof *g), *g2 = malloc(n * sizeof *g2);
    double l0 = 0, lp = 0, lm = 0;
    CHECK_OK(rl_sft_grad(&p, &t, 9, 0, 6, &ws, g, &l0));
    CHECK(l0 > 0);
    double gmax = 0, worst = 0;
    for (size_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(g[i]));
    CHECK(gmax > 1e-3);
    for (size_t i = 0; i < n; i += 7) {
        const float h = 1e-2f;
        float wi = p.w[i];
        p.w[i] = wi + h;
        CHECK_OK(rl_sft_grad(&p, &t, 9, 0, 6, &ws, g2, &lp));
        p.w[i] = wi - h;
        CHECK_OK(rl_sft_grad(&p, &t, 9, 0, 6, &ws, g2, &lm));
        p.w[i] = wi;
        double fd = (lp - lm) / (2.0 * h);
        worst = fmax(worst, fabs(fd - g[i]) / (1e-2 * gmax + fabs(fd)));
    }
    if (!(worst < 2e-2)) fprintf(stderr, "sft gradcheck: worst relative error %.3g (max |g| %.3g)\n", worst, gmax);
    CHECK(worst < 2e-2);
    /* its own prompt stream */
    uint8_t a[3], b[3];
    int same = 1;
    for (uint64_t i = 0; i < 8; i++) {
        rl_sft_prompt(&t, 9, 0, i, a);
        rl_task_prompt(&t, 9, 0, i, b);
        same &= !memcmp(a, b, 3);
    }
    CHECK(!same);
    CHECK_RC(rl_sft_grad(&p, &t, 9, 0, 0, &ws, g, NULL), FERRY_ERR_ARG);
    rl_task big = {RL_TASK_REVERSE, 6, 6}; /* needs a window of 11 */
    CHECK_RC(rl_sft_grad(&p, &big, 9, 0, 4, &ws, g, NULL), FERRY_ERR_ARG);
    free(g);
    free(g2);
    rl_work_release(&ws);
    rl_policy_release(&p);

    /* a run: deterministic, and it learns */
    rl_policy q1, q2;
    CHECK_OK(rl_policy_create(&q1, &LEARN_NET));
    CHECK_OK(rl_policy_create(&q2, &LEARN_NET));
    rl_policy_init_weights(&q1, 3);
    rl_policy_init_weights(&q2, 3);
    rl_sft_config cfg = {.steps = 0, .prompts = 32, .adam = rl_adamw_config_default()};
    cfg.adam.lr = 1e-2f;
    double before = 0, after = 0;
    CHECK_OK(rl_sft_grad(&q1, &LEARN_TASK, 3, 0, 32, &ws, (g = malloc(q1.nparams * sizeof *g)), &before));
    free(g);
    cfg.steps = 40;
    CHECK_OK(rl_sft_run(&q1, &LEARN_TASK, 3, &cfg, &after));
    CHECK_OK(rl_sft_run(&q2, &LEARN_TASK, 3, &cfg, NULL));
    CHECK(!memcmp(q1.w, q2.w, q1.nparams * sizeof *q1.w));
    rl_rollout_args ra = {.seed = 3, .step = 0, .version = 1, .first_prompt = 0, .n_prompts = 16, .group = 4};
    rl_batch bt;
    CHECK_OK(rl_rollout(&q1, &LEARN_TASK, &ra, &ws, &bt));
    double reward = rl_batch_mean_reward(&bt);
    printf("     warm-up: loss %.3f -> %.3f, reward %.3f\n", before, after, reward);
    CHECK(after < 0.5 * before);
    CHECK(reward > 0.5);
    rl_batch_release(&bt);
    rl_work_release(&ws);
    rl_policy_release(&q1);
    rl_policy_release(&q2);
}

int main(void)
{
    RUN(test_task_rewards);
    RUN(test_advantages);
    RUN(test_gradient_matches_finite_differences);
    RUN(test_gradient_accumulates);
    RUN(test_adamw_formula);
    RUN(test_batch_wire);
    RUN(test_sampling_deterministic);
    RUN(test_models_and_patches);
    RUN(test_parity_patch_vs_full);
    RUN(test_training_learns);
    RUN(test_sft_warmup);
    return CHECK_SUMMARY();
}
