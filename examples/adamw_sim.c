/*
 * adamw_sim — a checkpoint simulator: AdamW at an RL learning rate on FP32
 * master weights, cast to BF16 after every optimizer step and written as
 * .safetensors, exactly the mechanism of DESIGN.md ("Why patches are small").
 *
 *   build/examples/adamw_sim --out DIR [--steps 8] [--params N | layout options]
 *
 * writes DIR/step-000.safetensors (the initial weights) … DIR/step-NNN, and
 * with --masters the FP32 masters DIR/master-NNN.safetensors.  Everything is
 * deterministic in --seed.
 *
 * Why the BF16 checkpoints look like real ones.  A BF16 weight changes only
 * when its FP32 master crosses a rounding boundary; the cell is ~|w|/256 wide
 * while AdamW moves every weight by about lr per step.  So the statistics that
 * matter for a patch codec follow from three ingredients, all modelled here:
 *   1. the |w| distribution (weights ~ N(0, 0.02) like a Llama-style model,
 *      RMSNorm gains near 1.0) — it sets the change rate per exponent and the
 *      share of multi-ULP changes (tiny |w| ⇒ tiny cells ⇒ several ULP);
 *   2. Adam's normalised step m̂/(√v̂+ε): exactly ±lr on step 1, shrinking as
 *      the moments average noisy gradients — the reason the change rate falls
 *      over an RL run.  RL gradients are mostly fresh noise from step to step
 *      (measured on ../shared/data/rl-a: the sign of the step-2 update agrees
 *      with step 1's 74% of the time, what independent gradients give), plus
 *      a small, slowly drifting persistent part (--persist);
 *   3. which rows get a gradient at all: an embedding row only when its token
 *      is in the batch (--embed-active), a position row only below the
 *      sequence length (--pos-active).  Rows never touched keep m = v = 0 and
 *      do not move; rows touched once keep drifting on their momentum.
 * Per-row and per-column gradient scales (log-normal, heavy-tailed) are there
 * too; Adam divides them out except near ε, which is also what happens in
 * real models (the real data shows no row structure in the change mask beyond
 * what |w| explains).
 *
 * Memory (why 14 bytes/param): the optimizer state is inherent — FP32 master,
 * m and v, 12 bytes/param — and ferry_model_save() writes a whole file from
 * memory, so the current step's BF16 image adds 2 bytes/param.  The FP32
 * master file (--masters) borrows the master array, so it costs nothing more.
 * Gradients are never stored: every random number is a pure function of
 * (seed, tensor, step, element index) — a counter-based generator — so a row
 * of gradients is generated, consumed by the update and the cast, and
 * forgotten.  1G params therefore need ~14 GB, no matter the step count.
 *
 * The loops are single-threaded and branch-free in their bodies so that the
 * compiler can vectorise them; the counter-based generator keeps every
 * element independent of every other (no sequential PRNG state).  (With the
 * project's -O2 and baseline x86-64 they run scalar; -O3 -march=native
 * vectorises the gradient loops, and -fno-math-errno the update loop too.)
 * Measured: ~50-70 M params/s per step for update + cast, ~2 min for a 1G-
 * param model's initial weights plus two steps, on a shared 2-core VM.
 *
 * Only the public API (include/ferry.h) is used.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include "ferry.h"

/* ======================================================================
 * Options
 * ====================================================================== */
typedef struct sim_opts {
    const char *out;
    int steps;
    uint64_t params;      /* 0: use the explicit layout */
    int dim, layers, vocab, ffn, kv_dim, pos, tied;
    double lr, beta1, beta2, eps, wd;
    uint64_t seed;
    ferry_dtype norm_dtype;
    int masters, verify, quiet, exp_stats;
    double init_std;      /* 0: 1/sqrt(fan_in) */
    double norm_jitter;   /* spread of the RMSNorm gains around 1.0 */
    double persist;       /* size of the persistent gradient part vs fresh noise */
    double persist_sigma; /* log-normal spread of it across rows and columns */
    double drift_steps;   /* steps over which the persistent part turns over */
    double scale_sigma;   /* log-normal sigma of per-row and per-column scales */
    double embed_active;  /* mean fraction of embedding rows in a batch */
    double pos_active;    /* fraction of position rows below the sequence length */
} sim_opts;

static void usage(FILE *f)
{
    fprintf(f,
"usage: adamw_sim --out DIR [options]\n"
"\n"
"Simulates AdamW on FP32 master weights at an RL learning rate and writes the\n"
"BF16 checkpoint of every step: DIR/step-000.safetensors (initial weights) ..\n"
"DIR/step-NNN.safetensors.  Deterministic in --seed.\n"
"\n"
"run:\n"
"  --out DIR            output directory (created if missing)\n"
"  --steps N            optimizer steps (default 8; writes N+1 checkpoints)\n"
"  --seed S             random seed (default 1)\n"
"  --masters            also write the FP32 masters as DIR/master-NNN.safetensors\n"
"  --dtype-norms T      dtype of the RMSNorm gains in the step files: BF16\n"
"                       (default) or F32 (stored as the FP32 master itself)\n"
"  --verify             reopen every written file with ferry_model_open and check\n"
"                       it: model hash as written, step == cast(master) bit for bit\n"
"                       (with --masters), change counts as computed; exit 1 if not\n"
"  --exp-stats          print the change rate per base exponent at the end\n"
"  --quiet              only errors and the final summary\n"
"\n"
"model (Llama-style: embeddings, q/k/v/o, gate/up/down, RMSNorm; default is\n"
"the layout of ../shared/data/rl-a, 2.7M params):\n"
"  --params N           pick the smallest Llama-like layout with >= N params\n"
"                       (suffixes k, M, G; e.g. 1G for a 2 GB BF16 model)\n"
"  --dim D              hidden size (default 192)\n"
"  --layers L           decoder layers (default 4)\n"
"  --vocab V            vocabulary (default 2048)\n"
"  --ffn F              MLP width (default 8/3*dim rounded up to 64)\n"
"  --kv-dim K           k/v projection rows (default dim; smaller = GQA)\n"
"  --pos P              rows of a learned position table (default 32; 0 = none)\n"
"  --tied               tie lm_head to embed_tokens (no lm_head tensor)\n"
"  --init-std X         weight init std (default 0.02; 0 = 1/sqrt(fan_in))\n"
"  --norm-jitter X      RMSNorm gains ~ 1 + N(0, X) (default 0.002, as after\n"
"                       a short warm-up; 0 = exactly 1.0)\n"
"\n"
"optimizer (PyTorch AdamW semantics):\n"
"  --lr X               learning rate (default 3e-6)\n"
"  --beta1 X --beta2 X  (defaults 0.9, 0.999)\n"
"  --eps X              (default 1e-8)\n"
"  --weight-decay X     decoupled weight decay (default 0.01)\n"
"\n"
"gradients (RL-like: mostly fresh noise each step):\n"
"  --persist X          persistent part relative to the fresh noise (default 0.1)\n"
"  --persist-sigma X    its log-normal spread over rows and over columns, e.g.\n"
"                       hidden dims with outlier activations (default 0.5)\n"
"  --drift-steps X      steps over which the persistent part turns over (default 50)\n"
"  --scale-sigma X      log-normal sigma of per-row/column scales (default 1.0)\n"
"  --embed-active X     mean fraction of embedding rows with a gradient per step\n"
"                       (tokens in the batch; default 0.12)\n"
"  --pos-active X       fraction of position rows used (default 0.4)\n"
"\n"
"Memory: 14 bytes per parameter (FP32 master, m, v; BF16 image of a step).\n");
}

static int parse_count(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1e3, end++;
    else if (*end == 'M' || *end == 'm') mul = 1e6, end++;
    else if (*end == 'G' || *end == 'g') mul = 1e9, end++;
    if (errno || end == s || *end || !(v >= 0) || v * mul > 1e15) return -1;
    *out = (uint64_t)(v * mul + 0.5);
    return 0;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    *out = strtod(s, &end);
    return (errno || end == s || *end || !isfinite(*out)) ? -1 : 0;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

/* Returns 0 to run, 1 for --help, -1 on a bad command line. */
static int parse_args(int argc, char **argv, sim_opts *o)
{
    *o = (sim_opts){.steps = 8, .dim = 192, .layers = 4, .vocab = 2048, .pos = 32,
                    .lr = 3e-6, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .wd = 0.01,
                    .seed = 1, .norm_dtype = FERRY_BF16, .init_std = 0.02,
                    .norm_jitter = 0.002, .persist = 0.1, .persist_sigma = 0.5, .drift_steps = 50,
                    .scale_sigma = 1.0, .embed_active = 0.12, .pos_active = 0.4};
    int vocab_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0, takes = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        else if (!strcmp(a, "--masters")) { o->masters = 1; takes = 0; }
        else if (!strcmp(a, "--verify")) { o->verify = 1; takes = 0; }
        else if (!strcmp(a, "--quiet")) { o->quiet = 1; takes = 0; }
        else if (!strcmp(a, "--exp-stats")) { o->exp_stats = 1; takes = 0; }
        else if (!strcmp(a, "--tied")) { o->tied = 1; takes = 0; }
        else if (!v) bad = 1;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--steps")) bad = parse_int(v, 0, 100000, &o->steps);
        else if (!strcmp(a, "--seed")) { uint64_t s; bad = parse_count(v, &s); o->seed = s; }
        else if (!strcmp(a, "--params")) bad = parse_count(v, &o->params) || o->params == 0;
        else if (!strcmp(a, "--dim")) bad = parse_int(v, 1, 1 << 20, &o->dim);
        else if (!strcmp(a, "--layers")) bad = parse_int(v, 0, 10000, &o->layers);
        else if (!strcmp(a, "--vocab")) { bad = parse_int(v, 1, 1 << 24, &o->vocab); vocab_set = 1; }
        else if (!strcmp(a, "--ffn")) bad = parse_int(v, 1, 1 << 22, &o->ffn);
        else if (!strcmp(a, "--kv-dim")) bad = parse_int(v, 1, 1 << 20, &o->kv_dim);
        else if (!strcmp(a, "--pos")) bad = parse_int(v, 0, 1 << 20, &o->pos);
        else if (!strcmp(a, "--lr")) bad = parse_double(v, &o->lr) || o->lr < 0;
        else if (!strcmp(a, "--beta1")) bad = parse_double(v, &o->beta1) || o->beta1 < 0 || o->beta1 >= 1;
        else if (!strcmp(a, "--beta2")) bad = parse_double(v, &o->beta2) || o->beta2 < 0 || o->beta2 >= 1;
        else if (!strcmp(a, "--eps")) bad = parse_double(v, &o->eps) || o->eps < 0;
        else if (!strcmp(a, "--weight-decay")) bad = parse_double(v, &o->wd) || o->wd < 0;
        else if (!strcmp(a, "--init-std")) bad = parse_double(v, &o->init_std) || o->init_std < 0;
        else if (!strcmp(a, "--norm-jitter")) bad = parse_double(v, &o->norm_jitter) || o->norm_jitter < 0;
        else if (!strcmp(a, "--persist")) bad = parse_double(v, &o->persist) || o->persist < 0;
        else if (!strcmp(a, "--persist-sigma")) bad = parse_double(v, &o->persist_sigma) || o->persist_sigma < 0;
        else if (!strcmp(a, "--drift-steps")) bad = parse_double(v, &o->drift_steps) || o->drift_steps <= 0;
        else if (!strcmp(a, "--scale-sigma")) bad = parse_double(v, &o->scale_sigma) || o->scale_sigma < 0;
        else if (!strcmp(a, "--embed-active")) bad = parse_double(v, &o->embed_active) || o->embed_active < 0 || o->embed_active > 1;
        else if (!strcmp(a, "--pos-active")) bad = parse_double(v, &o->pos_active) || o->pos_active < 0 || o->pos_active > 1;
        else if (!strcmp(a, "--dtype-norms")) {
            bad = ferry_dtype_parse(v, &o->norm_dtype) != FERRY_OK ||
                  (o->norm_dtype != FERRY_BF16 && o->norm_dtype != FERRY_F32);
        } else {
            fprintf(stderr, "adamw_sim: unknown option '%s' (try --help)\n", a);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "adamw_sim: bad or missing value for %s\n", a);
            return -1;
        }
        i += takes;
    }
    if (!o->out) {
        fprintf(stderr, "adamw_sim: --out DIR is required (try --help)\n");
        return -1;
    }
    /* For --params the vocabulary grows with the model (a 200k-param model
     * with a 32k vocabulary would be all embedding). */
    if (o->params && !vocab_set) {
        double v = 2.0 * sqrt((double)o->params);
        v = v < 256 ? 256 : v > 32000 ? 32000 : v;
        o->vocab = ((int)v + 63) / 64 * 64;
        if (o->vocab > 32000) o->vocab = 32000;
    }
    return 0;
}

/* ======================================================================
 * Counter-based random numbers.
 *
 * Every draw is mix(key + index * golden), where key names (seed, tensor,
 * purpose, step) and mix is the splitmix64 finaliser.  No generator state
 * is carried from element to element, so rows can be produced in any order
 * or chunking with identical results, and the loops vectorise.
 * ====================================================================== */
#define GOLDEN 0x9E3779B97F4A7C15ull

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

enum { S_INIT = 1, S_NOISE, S_PERSIST, S_ROWSCALE, S_COLSCALE, S_ROWPERSIST,
       S_ROWACTIVE_P, S_ACTIVE, S_COLPERSIST };

static uint64_t key_of(uint64_t seed, uint64_t tensor, uint64_t purpose, uint64_t step)
{
    return mix64(mix64(mix64(seed ^ 0x5EEDull) ^ (tensor * 0xD1B54A32D192ED03ull)) ^
                 (purpose << 40) ^ step);
}

static inline double uniform01(uint64_t key, uint64_t i) /* in (0, 1] */
{
    return (double)((mix64(key + i * GOLDEN) >> 11) + 1) * 0x1p-53;
}

/* Approximate standard normal from one 64-bit draw: the sum of four 16-bit
 * uniforms (Irwin-Hall, bounded at ±3.46σ).  Cheap and vectorisable; used
 * for gradient noise, where Adam's normalisation makes the tails
 * irrelevant.  Exact Box-Muller normals are used for the initial weights,
 * whose tails set the share of large |w|. */
static inline float normal_ih4(uint64_t key, uint64_t i)
{
    uint64_t h = mix64(key + i * GOLDEN);
    uint32_t s = (uint32_t)(h & 0xFFFF) + (uint32_t)((h >> 16) & 0xFFFF) +
                 (uint32_t)((h >> 32) & 0xFFFF) + (uint32_t)(h >> 48);
    return ((float)s - 131070.0f) * (1.7320508f / 65536.0f);
}

/* Exact normal (Box-Muller on draws 2i, 2i+1); for the few scalar draws. */
static double normal_bm(uint64_t key, uint64_t i)
{
    double u1 = uniform01(key, 2 * i), u2 = uniform01(key, 2 * i + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* dst[i] = mean + std * N(0,1) for i < n, Box-Muller using both outputs of
 * each pair (in float: 24-bit uniforms reach 5.8 sigma, far beyond what
 * millions of weights sample).  Element i depends only on (key, i / 2). */
static void fill_normal(float *dst, size_t n, uint64_t key, float mean, float std)
{
    for (size_t j = 0; j < (n + 1) / 2; j++) {
        float u1 = (float)((mix64(key + (2 * j) * GOLDEN) >> 40) + 1) * 0x1p-24f;
        float u2 = (float)(mix64(key + (2 * j + 1) * GOLDEN) >> 40) * 0x1p-24f;
        float rad = sqrtf(-2.0f * logf(u1)), th = 6.2831853f * u2;
        dst[2 * j] = mean + std * rad * cosf(th);
        if (2 * j + 1 < n) dst[2 * j + 1] = mean + std * rad * sinf(th);
    }
}

/* Log-normal with median 1 (heavy-tailed scales). */
static double lognormal(uint64_t key, uint64_t i, double sigma)
{
    return exp(sigma * normal_bm(key, i));
}

/* ======================================================================
 * Layout and state
 * ====================================================================== */
enum kind { K_MATRIX, K_EMBED, K_POS, K_NORM, K_KINDS };
static const char *const k_kind_name[K_KINDS] = {"matrices", "embed_tokens", "pos_embed", "norms"};

typedef struct tensor_state {
    char name[96];
    enum kind kind;
    uint32_t ndim;
    uint64_t shape[2];
    uint64_t rows, cols, n;   /* norms: rows = 1 */
    ferry_dtype out_dtype;    /* dtype in the step files */
    float *w, *m, *v;         /* FP32 master and Adam moments */
    void *out;                /* the step image: uint16 BF16 or the F32 bits */
    float *row_scale, *col_scale, *row_persist, *col_persist, *row_active_p;
    uint64_t active_rows;     /* rows that ever get a gradient (K_POS prefix) */
} tensor_state;

typedef struct sim {
    sim_opts o;
    tensor_state *t;
    size_t nt, capt;
    uint64_t params;
    double grad_scale;        /* typical |g|: unit global norm spread over the params */
} sim;

static int default_ffn(int dim) { return (8 * dim / 3 / 64 + 1) * 64; }

static uint64_t layout_params(int dim, int layers, int vocab, int ffn, int kv, int pos, int tied)
{
    uint64_t d = (uint64_t)dim;
    uint64_t layer = 2 * d * d + 2 * d * (uint64_t)kv + 3 * d * (uint64_t)ffn + 2 * d;
    return (uint64_t)layers * layer + (uint64_t)vocab * d * (tied ? 1 : 2) + (uint64_t)pos * d + d;
}

/* --params N: the smallest Llama-like shape (dim a multiple of 64, one layer
 * per 128 of width, at least 2) with >= N parameters. */
static void choose_layout(sim_opts *o)
{
    for (int dim = 64;; dim += 64) {
        int layers = dim / 128 < 2 ? 2 : dim / 128;
        int ffn = default_ffn(dim);
        if (layout_params(dim, layers, o->vocab, ffn, dim, o->pos, o->tied) >= o->params || dim >= (1 << 16)) {
            o->dim = dim, o->layers = layers, o->ffn = ffn, o->kv_dim = dim;
            return;
        }
    }
}

static int add_tensor(sim *s, const char *name, enum kind kind, uint64_t rows, uint64_t cols)
{
    if (s->nt == s->capt) {
        size_t cap = s->capt ? s->capt * 2 : 64;
        tensor_state *nt = realloc(s->t, cap * sizeof *nt);
        if (!nt) return -1;
        s->t = nt, s->capt = cap;
    }
    tensor_state *t = &s->t[s->nt++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->rows = rows, t->cols = cols, t->n = rows * cols;
    if (kind == K_NORM) t->ndim = 1, t->shape[0] = cols;
    else t->ndim = 2, t->shape[0] = rows, t->shape[1] = cols;
    t->out_dtype = kind == K_NORM ? s->o.norm_dtype : FERRY_BF16;
    s->params += t->n;
    return 0;
}

/* Tensor names follow the Hugging Face Llama convention, as in the real
 * data (nn.Linear weights are [out_features, in_features]). */
static int build_layout(sim *s)
{
    const sim_opts *o = &s->o;
    uint64_t D = (uint64_t)o->dim, F = (uint64_t)o->ffn, KV = (uint64_t)o->kv_dim, V = (uint64_t)o->vocab;
    char nm[96];
    int rc = 0;
    if (o->pos) rc |= add_tensor(s, "model.pos_embed", K_POS, (uint64_t)o->pos, D);
    rc |= add_tensor(s, "model.embed_tokens.weight", K_EMBED, V, D);
    for (int l = 0; l < o->layers; l++) {
        static const struct { const char *n; int kind; int r, c; } parts[] = {
            /* r/c: 0 = D, 1 = F, 2 = KV, 3 = 1 (norm) */
            {"input_layernorm", K_NORM, 3, 0}, {"post_attention_layernorm", K_NORM, 3, 0},
            {"self_attn.q_proj", K_MATRIX, 0, 0}, {"self_attn.k_proj", K_MATRIX, 2, 0},
            {"self_attn.v_proj", K_MATRIX, 2, 0}, {"self_attn.o_proj", K_MATRIX, 0, 0},
            {"mlp.gate_proj", K_MATRIX, 1, 0}, {"mlp.up_proj", K_MATRIX, 1, 0},
            {"mlp.down_proj", K_MATRIX, 0, 1},
        };
        for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++) {
            const uint64_t dims[4] = {D, F, KV, 1};
            snprintf(nm, sizeof nm, "model.layers.%d.%s.weight", l, parts[p].n);
            rc |= add_tensor(s, nm, (enum kind)parts[p].kind, dims[parts[p].r], dims[parts[p].c]);
        }
    }
    rc |= add_tensor(s, "model.norm.weight", K_NORM, 1, D);
    if (!o->tied) rc |= add_tensor(s, "lm_head.weight", K_MATRIX, V, D);
    return rc ? -1 : 0;
}

/* ======================================================================
 * Initialisation: weights like a freshly initialised (or briefly warmed-up)
 * Llama-style model; per-row/column gradient structure drawn once.
 * ====================================================================== */
/* The big per-parameter arrays: 2 MiB-aligned and marked for transparent
 * huge pages, because at 1G params the first-touch faults on 4 KiB pages
 * cost more system time than the simulation costs user time. */
static void *big_alloc(size_t bytes)
{
    void *p = NULL;
    size_t align = bytes >= ((size_t)4 << 20) ? ((size_t)2 << 20) : 64;
    if (posix_memalign(&p, align, bytes ? bytes : 1)) return NULL;
#ifdef MADV_HUGEPAGE
    if (align > 64) (void)madvise(p, bytes, MADV_HUGEPAGE); /* advisory only */
#endif
    return p;
}

static int init_tensor(sim *s, size_t ti)
{
    const sim_opts *o = &s->o;
    tensor_state *t = &s->t[ti];
    size_t n = (size_t)t->n, esz = t->out_dtype == FERRY_F32 ? 4 : 2;
    t->w = big_alloc(n * sizeof(float));
    t->m = big_alloc(n * sizeof(float));
    t->v = big_alloc(n * sizeof(float));
    t->out = big_alloc(n * esz);
    t->row_scale = malloc(t->rows * sizeof(float));
    t->row_persist = malloc(t->rows * sizeof(float));
    t->row_active_p = malloc(t->rows * sizeof(float));
    t->col_scale = malloc(t->cols * sizeof(float));
    t->col_persist = malloc(t->cols * sizeof(float));
    if (!t->w || !t->m || !t->v || !t->out || !t->row_scale || !t->row_persist ||
        !t->row_active_p || !t->col_scale || !t->col_persist)
        return -1;
    memset(t->m, 0, n * sizeof(float));
    memset(t->v, 0, n * sizeof(float));

    uint64_t k = key_of(o->seed, ti, S_INIT, 0);
    if (t->kind == K_NORM) {
        fill_normal(t->w, n, k, 1.0f, (float)o->norm_jitter);
    } else {
        double std = o->init_std > 0 ? o->init_std : 1.0 / sqrt((double)t->cols);
        fill_normal(t->w, n, k, 0.0f, (float)std);
    }

    uint64_t kr = key_of(o->seed, ti, S_ROWSCALE, 0), kc = key_of(o->seed, ti, S_COLSCALE, 0);
    uint64_t kp = key_of(o->seed, ti, S_ROWPERSIST, 0), ka = key_of(o->seed, ti, S_ROWACTIVE_P, 0);
    const double ps = o->persist_sigma;
    for (uint64_t r = 0; r < t->rows; r++) {
        t->row_scale[r] = (float)lognormal(kr, r, o->scale_sigma);
        /* Signal-to-noise varies by row and by column (product of the two,
         * mean o->persist): an input dim with a consistently large
         * activation gives its whole column a persistent gradient, which
         * shows in the real lm_head as columns that change more often. */
        t->row_persist[r] = (float)(o->persist * lognormal(kp, r, ps) * exp(-0.5 * ps * ps));
        /* Token frequencies are skewed: some rows are in nearly every
         * batch, most in few (mean o->embed_active before clipping). */
        double p = o->embed_active * lognormal(ka, r, 1.0) * exp(-0.5);
        t->row_active_p[r] = (float)(p > 1 ? 1 : p);
    }
    uint64_t kq = key_of(o->seed, ti, S_COLPERSIST, 0);
    for (uint64_t c = 0; c < t->cols; c++) {
        t->col_scale[c] = (float)lognormal(kc, c, o->scale_sigma);
        t->col_persist[c] = (float)(lognormal(kq, c, ps) * exp(-0.5 * ps * ps));
    }
    t->active_rows = t->rows;
    if (t->kind == K_POS) {
        t->active_rows = (uint64_t)ceil(o->pos_active * (double)t->rows);
        if (t->active_rows > t->rows) t->active_rows = t->rows;
    }
    return 0;
}

static void free_tensor(tensor_state *t)
{
    free(t->w), free(t->m), free(t->v), free(t->out);
    free(t->row_scale), free(t->col_scale), free(t->row_persist), free(t->col_persist), free(t->row_active_p);
}

/* ======================================================================
 * Change statistics of the step images (counted while casting, against the
 * previous image still in the buffer: no second copy is needed).
 * ====================================================================== */
#define ULP_BINS 9
typedef struct step_stats {
    uint64_t nelem, changed;            /* BF16 tensors only */
    uint64_t hist[ULP_BINS], far;       /* deltas -4..+4 in sign-magnitude order, |d| > 4 */
    uint64_t kind_n[K_KINDS], kind_changed[K_KINDS];
    uint64_t f32_n, f32_changed;        /* F32 tensors (--dtype-norms F32) */
    uint64_t exp_n[256], exp_changed[256];
} step_stats;

static inline int32_t bf16_order(uint16_t h) /* sign-magnitude -> ordered integer */
{
    return (h & 0x8000) ? -(int32_t)(h & 0x7FFF) : (int32_t)(h & 0x7FFF);
}

/* Casts one row into the step image, counting what changed.  count = 0 on
 * the initial image, where there is nothing to compare with. */
static void emit_row(tensor_state *t, uint64_t r, uint16_t *tmp, int count, int exp_stats,
                     step_stats *st)
{
    const float *w = t->w + r * t->cols;
    size_t cols = (size_t)t->cols;
    if (t->out_dtype == FERRY_F32) {
        uint32_t *dst = (uint32_t *)t->out + r * t->cols;
        uint64_t ch = 0;
        for (size_t c = 0; c < cols; c++) {
            uint32_t b;
            memcpy(&b, &w[c], 4);
            ch += b != dst[c];
            dst[c] = b;
        }
        if (count) st->f32_n += cols, st->f32_changed += ch;
        return;
    }
    uint16_t *dst = (uint16_t *)t->out + r * t->cols;
    ferry_f32_to_bf16_n(tmp, w, cols);
    if (count) {
        uint64_t ch = 0;
        for (size_t c = 0; c < cols; c++) {
            if (exp_stats) st->exp_n[(dst[c] >> 7) & 0xFF]++;
            if (tmp[c] == dst[c]) continue;
            ch++;
            if (exp_stats) st->exp_changed[(dst[c] >> 7) & 0xFF]++;
            int32_t d = bf16_order(tmp[c]) - bf16_order(dst[c]);
            if (d >= -4 && d <= 4) st->hist[d + 4]++;
            else st->far++;
        }
        st->nelem += cols, st->changed += ch;
        st->kind_n[t->kind] += cols, st->kind_changed[t->kind] += ch;
    }
    memcpy(dst, tmp, cols * sizeof *dst);
}

/* ======================================================================
 * One AdamW step on one tensor, row by row: generate the row's gradient,
 * update master and moments (PyTorch's AdamW, foreach=False order), cast.
 * ====================================================================== */
static void step_tensor(sim *s, size_t ti, int step, float *g, uint16_t *tmp, step_stats *st)
{
    const sim_opts *o = &s->o;
    tensor_state *t = &s->t[ti];
    size_t cols = (size_t)t->cols;

    /* Scalars as PyTorch computes them (in double, used in float ops). */
    double bc1 = 1.0 - pow(o->beta1, step), bc2 = 1.0 - pow(o->beta2, step);
    const float step_size = (float)(o->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    const float decay = (float)(1.0 - o->lr * o->wd), eps = (float)o->eps;
    const float one_b1 = (float)(1.0 - o->beta1);
    const float b2 = (float)o->beta2, one_b2 = (float)(1.0 - o->beta2);

    /* Persistent part: a unit-variance field that rotates between two
     * independent anchors every drift_steps steps (slow drift, no state). */
    double phase = (step - 1) / o->drift_steps;
    uint64_t epoch = (uint64_t)floor(phase);
    double ang = 1.5707963267948966 * (phase - (double)epoch);
    const float ca = (float)cos(ang), sa = (float)sin(ang);
    const uint64_t kz = key_of(o->seed, ti, S_NOISE, (uint64_t)step);
    const uint64_t k0 = key_of(o->seed, ti, S_PERSIST, epoch), k1 = key_of(o->seed, ti, S_PERSIST, epoch + 1);
    const uint64_t ka = key_of(o->seed, ti, S_ACTIVE, (uint64_t)step);

    for (uint64_t r = 0; r < t->rows; r++) {
        int active = r < t->active_rows;
        /* Tied embeddings also serve as the output layer, whose softmax
         * gives every row a gradient. */
        if (t->kind == K_EMBED && !o->tied) active = uniform01(ka, r) <= t->row_active_p[r];
        const uint64_t base = r * t->cols;
        if (active) {
            const float rs = (float)s->grad_scale * t->row_scale[r], p = t->row_persist[r];
            const float *cs = t->col_scale, *cp = t->col_persist;
            if (p > 0) {
                for (size_t c = 0; c < cols; c++) {
                    float mu = ca * normal_ih4(k0, base + c) + sa * normal_ih4(k1, base + c);
                    g[c] = rs * cs[c] * (normal_ih4(kz, base + c) + p * cp[c] * mu);
                }
            } else {
                for (size_t c = 0; c < cols; c++) g[c] = rs * cs[c] * normal_ih4(kz, base + c);
            }
        } else {
            memset(g, 0, cols * sizeof *g); /* PyTorch's dense zero gradient rows */
        }
        float *w = t->w + base, *m = t->m + base, *v = t->v + base;
        for (size_t c = 0; c < cols; c++) {
            w[c] *= decay;
            m[c] += one_b1 * (g[c] - m[c]);                 /* exp_avg.lerp_(g, 1-b1) */
            v[c] = b2 * v[c] + one_b2 * g[c] * g[c];         /* mul_(b2).addcmul_(g, g, 1-b2) */
            float denom = sqrtf(v[c]) / bc2_sqrt + eps;
            w[c] -= step_size * (m[c] / denom);
        }
        emit_row(t, r, tmp, 1, o->exp_stats, st);
    }
}

/* ======================================================================
 * Output
 * ====================================================================== */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int mkdir_p(const char *path)
{
    char buf[4096];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof buf) return -1;
    memcpy(buf, path, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        buf[i] = c;
    }
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "adamw_sim: %s: %s (%s)\n", what, ferry_strerror(rc), ferry_last_error());
    return -1;
}

/* Builds a model over the state's buffers (borrowed, no copy) and saves it.
 * masters = 1 writes the FP32 masters, else the step image.  hash (may be
 * NULL) receives the model hash of what was written. */
static int save_step(const sim *s, int masters, const char *path, uint8_t hash[16])
{
    ferry_model *m = NULL;
    int rc = ferry_model_create(&m);
    if (rc) return fail("ferry_model_create", rc);
    for (size_t i = 0; i < s->nt && !rc; i++) {
        const tensor_state *t = &s->t[i];
        ferry_dtype dt = masters ? FERRY_F32 : t->out_dtype;
        const void *data = masters ? (const void *)t->w : t->out;
        rc = ferry_model_add(m, t->name, dt, t->ndim, t->shape, data,
                             t->n * (dt == FERRY_F32 ? 4 : 2), FERRY_ADD_BORROW);
    }
    if (!rc) rc = ferry_model_set_metadata(m, "format", "pt");
    if (!rc) rc = ferry_model_set_metadata(m, "producer", "ferry adamw_sim");
    if (!rc && hash) rc = ferry_model_hash(m, hash);
    if (!rc) rc = ferry_model_save(m, path);
    ferry_model_free(m);
    if (rc) return fail(path, rc);
    return 0;
}

static void file_path(char *buf, size_t n, const char *dir, const char *what, int step)
{
    snprintf(buf, n, "%s/%s-%03d.safetensors", dir, what, step);
}

/* ======================================================================
 * --verify: reopen what was written and check it against what was meant.
 * ====================================================================== */
typedef struct step_record {
    uint8_t step_hash[16], master_hash[16];
    uint64_t changed, nelem;   /* BF16 elements changed vs the previous step */
} step_record;

static int verify_outputs(const sim *s, const step_record *rec)
{
    const sim_opts *o = &s->o;
    char path[4096];
    ferry_model *prev = NULL;
    int bad = 0;
    size_t maxn = 1; /* the cast of the largest tensor: 2 bytes x its elements */
    for (size_t i = 0; i < s->nt; i++)
        if (s->t[i].n > maxn) maxn = (size_t)s->t[i].n;
    uint16_t *cast = malloc(maxn * sizeof *cast);
    if (!cast) { fprintf(stderr, "adamw_sim: out of memory\n"); return -1; }

    for (int k = 0; k <= o->steps && !bad; k++) {
        ferry_model *cur = NULL, *mas = NULL;
        uint8_t h[16];
        file_path(path, sizeof path, o->out, "step", k);
        int rc = ferry_model_open(path, &cur);
        if (rc) { fail(path, rc); bad = 1; break; }
        if (ferry_model_count(cur) != s->nt) {
            fprintf(stderr, "verify: %s: %zu tensors, want %zu\n", path, ferry_model_count(cur), s->nt);
            bad = 1;
        }
        for (size_t i = 0; i < s->nt && !bad; i++) {
            const tensor_state *t = &s->t[i];
            const ferry_tensor *ft = ferry_model_find(cur, t->name);
            if (!ft || ft->dtype != t->out_dtype || ft->ndim != t->ndim || ft->nelem != t->n ||
                memcmp(ft->shape, t->shape, t->ndim * sizeof(uint64_t))) {
                fprintf(stderr, "verify: %s: tensor '%s' missing or of the wrong dtype/shape\n", path, t->name);
                bad = 1;
            }
        }
        if (!bad && (ferry_model_hash(cur, h) || memcmp(h, rec[k].step_hash, 16))) {
            fprintf(stderr, "verify: %s: model hash differs from the model that was saved\n", path);
            bad = 1;
        }
        if (!bad && o->masters) {
            file_path(path, sizeof path, o->out, "master", k);
            rc = ferry_model_open(path, &mas);
            if (rc) { fail(path, rc); bad = 1; }
            if (!bad && (ferry_model_hash(mas, h) || memcmp(h, rec[k].master_hash, 16))) {
                fprintf(stderr, "verify: %s: model hash differs from the model that was saved\n", path);
                bad = 1;
            }
            /* The invariant the whole project rests on: the rollout
             * weights are exactly PyTorch's cast of the masters. */
            for (size_t i = 0; i < s->nt && !bad; i++) {
                const ferry_tensor *st = ferry_model_find(cur, s->t[i].name);
                const ferry_tensor *mt = ferry_model_find(mas, s->t[i].name);
                if (!mt || mt->dtype != FERRY_F32 || mt->nelem != st->nelem) {
                    fprintf(stderr, "verify: %s: tensor '%s' missing or not F32\n", path, s->t[i].name);
                    bad = 1;
                } else if (st->dtype == FERRY_F32) {
                    bad = memcmp(st->data, mt->data, (size_t)st->nbytes) != 0;
                } else {
                    ferry_f32_to_bf16_n(cast, (const float *)mt->data, (size_t)mt->nelem);
                    bad = memcmp(st->data, cast, (size_t)st->nbytes) != 0;
                }
                if (bad) fprintf(stderr, "verify: step %d: '%s' is not the cast of its master\n", k, s->t[i].name);
            }
        }
        if (!bad && prev) {
            /* Recount from the files, independently of the in-memory count. */
            uint64_t changed = 0, nelem = 0;
            for (size_t i = 0; i < ferry_model_count(cur); i++) {
                const ferry_tensor *b = ferry_model_tensor(cur, i);
                const ferry_tensor *a = ferry_model_find(prev, b->name);
                if (b->dtype != FERRY_BF16 || !a) continue;
                const uint16_t *pa = a->data, *pb = b->data;
                for (uint64_t j = 0; j < b->nelem; j++) changed += pa[j] != pb[j];
                nelem += b->nelem;
            }
            if (changed != rec[k].changed || nelem != rec[k].nelem) {
                fprintf(stderr, "verify: step %d: %" PRIu64 " changed in the files, %" PRIu64 " counted while writing\n",
                        k, changed, rec[k].changed);
                bad = 1;
            } else {
                printf("verify: step %03d ok: changed %.6f of %" PRIu64 " BF16%s\n", k,
                       nelem ? (double)changed / (double)nelem : 0.0, nelem,
                       o->masters ? ", == cast(master)" : "");
            }
        } else if (!bad) {
            printf("verify: step %03d ok%s\n", k, o->masters ? ", == cast(master)" : "");
        }
        ferry_model_free(mas);
        ferry_model_free(prev);
        prev = cur;
    }
    ferry_model_free(prev);
    free(cast);
    printf("verify: %s\n", bad ? "FAILED" : "all files ok");
    return bad ? -1 : 0;
}

/* ======================================================================
 * Main loop
 * ====================================================================== */
static void print_step(int step, const step_stats *st, double secs, uint64_t params)
{
    double ch = st->changed ? (double)st->changed : 1;
    uint64_t u1 = st->hist[3] + st->hist[5], u2 = st->hist[2] + st->hist[6];
    uint64_t u34 = st->hist[0] + st->hist[1] + st->hist[7] + st->hist[8];
    printf("step %03d: changed %6.3f%% of BF16  (+-1 %.1f%%, +-2 %.1f%%, +-3..4 %.1f%%, >4 %.1f%%)",
           step, 100.0 * (double)st->changed / (double)(st->nelem ? st->nelem : 1),
           100.0 * (double)u1 / ch, 100.0 * (double)u2 / ch, 100.0 * (double)u34 / ch,
           100.0 * (double)st->far / ch);
    if (st->f32_n) printf("  F32 changed %.3f%%", 100.0 * (double)st->f32_changed / (double)st->f32_n);
    printf("  [%.2f s, %.1f M params/s]\n", secs, (double)params / secs / 1e6);
}

static void print_summary(const sim *s, const step_stats *tot)
{
    double ch = tot->changed ? (double)tot->changed : 1;
    printf("all steps: changed %.3f%% per step; of changes +-1 %.1f%%, +-2 %.1f%%, >4 %.2f%%\n",
           100.0 * (double)tot->changed / (double)(tot->nelem ? tot->nelem : 1),
           100.0 * (double)(tot->hist[3] + tot->hist[5]) / ch,
           100.0 * (double)(tot->hist[2] + tot->hist[6]) / ch, 100.0 * (double)tot->far / ch);
    printf("by kind (changed per step):");
    for (int k = 0; k < K_KINDS; k++)
        if (tot->kind_n[k])
            printf(" %s %.2f%%", k_kind_name[k], 100.0 * (double)tot->kind_changed[k] / (double)tot->kind_n[k]);
    printf("\n");
    if (s->o.exp_stats) {
        printf("by base exponent (|w| in [2^e, 2^(e+1))): change rate, share of elements\n");
        uint64_t total = 0;
        for (int e = 0; e < 256; e++) total += tot->exp_n[e];
        for (int e = 0; e < 256; e++)
            if (tot->exp_n[e] && (double)tot->exp_n[e] > 0.002 * (double)total)
                printf("  2^%-4d %6.2f%%  (%.1f%%)\n", e - 127,
                       100.0 * (double)tot->exp_changed[e] / (double)tot->exp_n[e],
                       100.0 * (double)tot->exp_n[e] / (double)total);
    }
}

int main(int argc, char **argv)
{
    sim s = {0};
    int pr = parse_args(argc, argv, &s.o);
    if (pr > 0) { usage(stdout); return 0; }
    if (pr < 0) return 2;
    sim_opts *o = &s.o;
    if (o->params) choose_layout(o);
    if (!o->ffn) o->ffn = default_ffn(o->dim);
    if (!o->kv_dim) o->kv_dim = o->dim;
    if (build_layout(&s)) { fprintf(stderr, "adamw_sim: out of memory\n"); return 1; }
    /* A clipped global gradient norm of ~1 spread over all parameters: the
     * typical |g| Adam's eps is compared with. */
    s.grad_scale = 1.0 / sqrt((double)s.params);
    if (mkdir_p(o->out)) { fprintf(stderr, "adamw_sim: cannot create %s: %s\n", o->out, strerror(errno)); return 1; }

    double mem = 14.0 * (double)s.params;
    printf("adamw_sim: %zu tensors, %" PRIu64 " params (dim %d, layers %d, vocab %d, ffn %d, kv %d%s), "
           "%d steps, lr %g, wd %g, seed %" PRIu64 "; state %.2f GiB\n",
           s.nt, s.params, o->dim, o->layers, o->vocab, o->ffn, o->kv_dim, o->tied ? ", tied" : "",
           o->steps, o->lr, o->wd, o->seed, mem / (1024.0 * 1024 * 1024));

    size_t maxcols = 1;
    for (size_t i = 0; i < s.nt; i++)
        if (s.t[i].cols > maxcols) maxcols = (size_t)s.t[i].cols;
    float *g = malloc(maxcols * sizeof *g);
    uint16_t *tmp = malloc(maxcols * sizeof *tmp);
    step_record *rec = calloc((size_t)o->steps + 1, sizeof *rec);
    step_stats *st = calloc(1, sizeof *st), *tot = calloc(1, sizeof *tot);
    int status = 1;
    if (!g || !tmp || !rec || !st || !tot) { fprintf(stderr, "adamw_sim: out of memory\n"); goto done; }

    double t0 = now_s();
    for (size_t i = 0; i < s.nt; i++) {
        if (init_tensor(&s, i)) {
            fprintf(stderr, "adamw_sim: out of memory (%" PRIu64 " params need %.2f GiB)\n", s.params,
                    mem / (1024.0 * 1024 * 1024));
            goto done;
        }
        for (uint64_t r = 0; r < s.t[i].rows; r++) emit_row(&s.t[i], r, tmp, 0, 0, st);
    }
    char path[4096];
    double write_s = 0, step_total_s = 0;
    for (int k = 0; k <= o->steps; k++) {
        double ts = now_s();
        memset(st, 0, sizeof *st);
        if (k > 0)
            for (size_t i = 0; i < s.nt; i++) step_tensor(&s, i, k, g, tmp, st);
        double tw = now_s();
        file_path(path, sizeof path, o->out, "step", k);
        if (save_step(&s, 0, path, o->verify ? rec[k].step_hash : NULL)) goto done;
        if (o->masters) {
            file_path(path, sizeof path, o->out, "master", k);
            if (save_step(&s, 1, path, o->verify ? rec[k].master_hash : NULL)) goto done;
        }
        double te = now_s();
        write_s += te - tw;
        rec[k].changed = st->changed, rec[k].nelem = st->nelem;
        if (k == 0) {
            if (!o->quiet) printf("step 000: initial weights  [%.2f s incl. init]\n", te - t0);
            continue;
        }
        step_total_s += tw - ts;
        tot->nelem += st->nelem, tot->changed += st->changed, tot->far += st->far;
        for (int b = 0; b < ULP_BINS; b++) tot->hist[b] += st->hist[b];
        for (int b = 0; b < K_KINDS; b++) tot->kind_n[b] += st->kind_n[b], tot->kind_changed[b] += st->kind_changed[b];
        for (int b = 0; b < 256; b++) tot->exp_n[b] += st->exp_n[b], tot->exp_changed[b] += st->exp_changed[b];
        if (!o->quiet) print_step(k, st, te - ts, s.params);
    }
    if (o->steps > 0) print_summary(&s, tot);
    printf("time: %.2f s total; update+cast %.1f M params/s; writing %.2f s\n", now_s() - t0,
           step_total_s > 0 ? (double)s.params * o->steps / step_total_s / 1e6 : 0.0, write_s);
    status = 0;
    if (o->verify && verify_outputs(&s, rec)) status = 1;
done:
    for (size_t i = 0; i < s.nt; i++) free_tensor(&s.t[i]);
    free(s.t), free(g), free(tmp), free(rec), free(st), free(tot);
    return status;
}
