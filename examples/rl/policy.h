/*
 * policy.h — the reference workload's policy network (examples/rl).
 *
 * LINKING.  The examples/rl module is not part of libferry.  A program that
 * uses it links the objects of every .c file in examples/rl except the
 * drivers (files named rl_NAME.c, which hold a main()):
 *     adamw.o gemm.o grpo.o policy.o rollout.o task.o traj.o   + libferry.a
 * The Makefile names that list RL_OBJ (under $(BUILD)/examples/rl/); see its
 * rules for rl_train and tests/unit/test_rl.c.  Add -Iexamples/rl.
 *
 * The module, file by file:
 *   rng.h      counter-derived random streams (determinism hooks)
 *   task.h     the task and its verifiable reward
 *   policy.h   this file: parameters, forward, backward, ferry_model export
 *   rollout.h  sampling completions from (BF16-valued) weights
 *   traj.h     trajectory batches and their wire format
 *   grpo.h     group-relative advantages, policy-gradient loss and gradient
 *   adamw.h    AdamW on the FP32 masters
 *
 * THE NETWORK.  An MLP over a fixed window of context slots, plus a few
 * positional mixing heads:
 *     e_s = embed[ctx[s]]                      slot s = token s of the sequence
 *                                              (prompt, completion so far), token
 *                                              0 in the empty slots after it
 *     m_h = Σ_{s<n} softmax(g·mix[h][n-1])_s e_s  head h: a learned mixture of
 *                                              the n filled slots, chosen by n
 *                                              alone (g = RL_MIX_SCALE)
 *     x  = concat(e_0, …, e_{window-1}, m_0, …, m_{heads-1})
 *     h1 = tanh(x · mlp.0.weight + mlp.0.bias)
 *     hl = tanh(hl-1 · mlp.l-1.weight + mlp.l-1.bias)        (layers of them)
 *     logits = hL · head.weight + head.bias
 * Why the heads: an MLP over absolute slots must learn a multiplexer to
 * answer "the digit at slot f(n)" (to copy or reverse), which plain
 * gradient noise teaches slowly; a head is attention whose weights depend
 * on the position only (a "dense synthesizer"), so it learns "read slot
 * f(n)" directly, and the MLP has only to map what it read to an answer.
 * Why g: Adam moves every weight by about lr per step whatever its
 * gradient, and a pointer needs score gaps of several units — thousands of
 * steps at lr 1e-3.  Storing the scores divided by g is a per-tensor
 * learning rate, g times the base one, that keeps a single lr for AdamW.
 * tanh rather than ReLU: smooth, so the finite-difference gradient check is
 * meaningful everywhere.
 *
 * PARAMETERS are named tensors stored back to back in one FP32 array, in
 * the order of rl_policy.tensors[]:
 *     embed.weight  [vocab, embed]
 *     mix.weight    [heads, window, window]  row n-1: scores for length n;
 *                                            only the first n columns are used
 *     mlp.L.weight  [in, out]   (input-major, like GPT-2's Conv1D, so the
 *     mlp.L.bias    [out]        forward product is x · W)
 *     head.weight   [hidden, vocab]
 *     head.bias     [vocab]
 * The same offsets index a BF16 image of the weights (uint16_t per element),
 * so a ferry_model of either dtype maps 1:1 onto the flat array.
 *
 * Everything is single-threaded and deterministic: weights from a seed
 * (rng.h), fixed operation orders in the kernels (gemm.h), no FMA
 * contraction.  Bit-identical results need the same binary: libm's
 * tanhf/exp may differ between libc versions.
 */
#ifndef RL_POLICY_H
#define RL_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "ferry_quant.h"

#define RL_MAX_LAYERS 4
#define RL_MAX_TENSORS (2 + 2 * RL_MAX_LAYERS + 2)
#define RL_MAX_VOCAB 256  /* tokens travel as bytes */
#define RL_MAX_WINDOW 256
#define RL_MAX_HEADS 16
#define RL_MIX_SCALE 32.0 /* scores = RL_MIX_SCALE × mix.weight (see above) */

typedef struct rl_policy_config {
    uint32_t vocab;  /* tokens, 2..RL_MAX_VOCAB */
    uint32_t window; /* context slots, 1..RL_MAX_WINDOW; a task needs
                        prompt_len + completion_len - 1 */
    uint32_t embed;  /* embedding width */
    uint32_t heads;  /* positional mixing heads, 1..RL_MAX_HEADS */
    uint32_t hidden; /* width of every hidden layer */
    uint32_t layers; /* hidden layers, 1..RL_MAX_LAYERS */
} rl_policy_config;

/* The default: vocab 32, window = prompt_len + completion_len - 1 of the
 * default task (11), embed 32, 2 heads, 2 hidden layers of 800:
 * 1,001,298 parameters. */
rl_policy_config rl_policy_config_default(void);

/* The default dimensions with the window a task needs (prompt_len +
 * completion_len - 1). */
struct rl_task;
rl_policy_config rl_policy_config_for_task(const struct rl_task *t);

/* The configuration a model's tensors imply (embed.weight, mix.weight,
 * mlp.N.weight, head.weight shapes): lets an island build its policy from
 * the first BF16 model it receives.  FERRY_ERR_NOT_FOUND or
 * FERRY_ERR_SHAPE_MISMATCH if the model is not one of these networks (the
 * full check is rl_policy_load's). */
int rl_policy_config_from_model(const ferry_model *m, rl_policy_config *out);

/* Parameter count of a configuration, 0 if it is malformed or too big
 * (bound: 2^31 elements). */
size_t rl_policy_config_params(const rl_policy_config *cfg);

typedef struct rl_param {
    char name[32];      /* "embed.weight", "mlp.0.weight", … */
    uint32_t ndim;      /* 1, 2 or 3 */
    uint64_t shape[3];
    size_t offset;      /* first element in the flat array */
    size_t count;       /* elements */
} rl_param;

typedef struct rl_policy {
    rl_policy_config cfg;
    size_t nparams;
    size_t ntensors;
    rl_param tensors[RL_MAX_TENSORS];
    float *w;           /* nparams FP32 values (owned) */
} rl_policy;

/* Allocates the parameter array (zeros).  FERRY_ERR_ARG for a malformed
 * config, FERRY_ERR_NOMEM. */
int rl_policy_create(rl_policy *p, const rl_policy_config *cfg);
/* Frees the array; p may be zeroed or NULL. */
void rl_policy_release(rl_policy *p);

/* Initial weights from seed: embed ~ N(0,1), hidden weights ~ N(0, 1/fan_in),
 * head ~ N(0, 0.25/hidden) (a near-uniform initial policy), biases and
 * mix.weight 0 (every head starts as the mean of the filled slots).
 * Tensor i draws from its own stream (seed, INIT, i). */
void rl_policy_init_weights(rl_policy *p, uint64_t seed);

/* Index in tensors[] of a name, or -1. */
int rl_policy_find(const rl_policy *p, const char *name);

/* ---- ferry models ------------------------------------------------------ */

/* An F32 ferry_model borrowing p->w (the masters); keep p alive and
 * unmoved while the model lives.  Free with ferry_model_free. */
int rl_policy_model_f32(const rl_policy *p, ferry_model **out);

/* A BF16 ferry_model borrowing bf16 (p->nparams words laid out as p->w),
 * writable, so ferry_apply_inplace can update it.  Use it for the weights
 * islands hold; fill bf16 with rl_policy_cast_bf16. */
int rl_policy_model_bf16(const rl_policy *p, uint16_t *bf16, ferry_model **out);

/* bf16 = cast of the masters (ferry_f32_to_bf16_n, PyTorch's rounding). */
void rl_policy_cast_bf16(const rl_policy *p, uint16_t *bf16);

/* p->w = exact FP32 values of a BF16 image (bf16 << 16): what an island
 * computes with. */
void rl_policy_set_bf16(rl_policy *p, const uint16_t *bf16);

/* Copies a model's tensors into p->w: every tensor of p must be present
 * with its shape, as F32 or BF16 (exactly widened); extra tensors are an
 * error too (a model of another network).  FERRY_ERR_NOT_FOUND,
 * FERRY_ERR_SHAPE_MISMATCH or FERRY_ERR_UNSUPPORTED (other dtypes); p is
 * unchanged on error. */
int rl_policy_load(rl_policy *p, const ferry_model *m);

/* Copies a BF16 model's tensors into bf16 (p->nparams words laid out as
 * p->w): for islands that receive whole models (ferry_apply's output, a
 * full checkpoint).  Same checks as rl_policy_load but BF16 only; bf16 is
 * unchanged on error. */
int rl_policy_bf16_from_model(const rl_policy *p, const ferry_model *m, uint16_t *bf16);

/* ---- FP8 rollout weights (include/ferry_quant.h) ----------------------- */

/* The model an FP8 island holds: p's tensors as a run quantized under q
 * publishes them (those the scheme quantizes as F8_E4M3 NAME +
 * NAME_scale_inv F32, the others BF16) with the scheme's metadata:
 * ferry_quantize of a zero BF16 image, so names, dtypes, shapes and
 * metadata keys are those of every version of the run.  The model owns
 * writable buffers: give it to a memory-mode subscriber.  Free with
 * ferry_model_free.  FERRY_ERR_NOMEM, or ferry_quantize's errors. */
int rl_policy_model_quant(const rl_policy *p, ferry_quant q, ferry_model **out);

/* w (p->nparams floats, laid out as p->w) = the values of a model of p's
 * tensors, each F32, BF16 (widened exactly) or F8_E4M3 with its
 * NAME_scale_inv (w = code x scale per 128 x 128 block, decoded by the
 * library's ferry_dequantize_fp8); no other tensor.  Checks everything
 * before writing: FERRY_ERR_NOT_FOUND, FERRY_ERR_SHAPE_MISMATCH,
 * FERRY_ERR_UNSUPPORTED (another dtype), FERRY_ERR_NOMEM; w is unchanged
 * on error.  What an FP8 island computes with. */
int rl_policy_weights(const rl_policy *p, const ferry_model *m, float *w);

/* ---- checkpoint files --------------------------------------------------- */

/* Writes p's FP32 weights to path as a .safetensors file (ferry_model_save:
 * atomic), with the metadata pairs meta[0]=meta[1], meta[2]=meta[3], …
 * (NULL-terminated list; may be NULL).  On failure writes a message
 * naming the file into err and returns the ferry code. */
int rl_policy_save_file(const rl_policy *p, const char *path, const char *const *meta, char *err,
                        size_t errlen);

/* Loads p->w from the .safetensors file at path (a pre-trained policy to
 * start from).  Checks everything before writing anything: every tensor of
 * p present with its exact shape, no other tensor, dtype F32 (BF16 is
 * widened exactly), every value finite.  On failure p is unchanged and err
 * holds a message naming the file and the tensor (and, on a shape
 * mismatch, the network options the file's shapes imply); returns
 * FERRY_ERR_* (the open's code, FERRY_ERR_NOT_FOUND,
 * FERRY_ERR_SHAPE_MISMATCH, FERRY_ERR_UNSUPPORTED, or FERRY_ERR_ARG for a
 * non-finite value).  *meta_out, if not NULL, receives the opened model
 * (the caller reads its metadata and frees it); else it is freed here. */
int rl_policy_load_file(rl_policy *p, const char *path, char *err, size_t errlen,
                        ferry_model **meta_out);

/* ---- forward / backward ---------------------------------------------- */

/* Scratch of the passes, grown on demand; zero-initialise, then
 * rl_work_release. */
typedef struct rl_work {
    size_t rows_cap;
    float *x;                    /* [rows, (window + heads)·embed] */
    float *alpha;                /* [rows, heads, window] mixing weights */
    float *h[RL_MAX_LAYERS];     /* [rows, hidden] post-tanh */
    float *logits;               /* [rows, vocab]; the backward pass reads
                                    dlogits from here */
    float *d0, *d1;              /* [rows, max(hidden, window·embed)] */
    float *wt;                   /* a transposed weight */
    float *at;                   /* a transposed activation */
    size_t wt_cap, at_cap;
} rl_work;

void rl_work_release(rl_work *ws);

/* A context row: cfg.window tokens and the length n of the sequence in it.
 * Fills ctx with prompt ++ completion[0..t), token 0 after it, and *len
 * with prompt_len + t.  FERRY_ERR_ARG if that is 0 or over the window. */
int rl_policy_context(const rl_policy *p, const uint8_t *prompt, uint32_t prompt_len,
                      const uint8_t *completion, uint32_t t, uint8_t *ctx, uint32_t *len);

/* Forward pass of rows contexts (ctx: rows × window tokens, each < vocab;
 * len: rows lengths, 1..window): logits into ws->logits (rows × vocab),
 * activations kept for the backward pass.  FERRY_ERR_NOMEM, FERRY_ERR_ARG
 * for a token or length out of range.  Each row's logits depend on that
 * row only (never on the others or on rows). */
int rl_forward(const rl_policy *p, const uint8_t *ctx, const uint32_t *len, size_t rows,
               rl_work *ws);

/* Backward pass after rl_forward of the same rows: reads dL/dlogits from
 * ws->logits (overwritten by the caller) and ADDS dL/dparams to grad
 * (p->nparams floats, laid out as p->w). */
int rl_backward(const rl_policy *p, const uint8_t *ctx, const uint32_t *len, size_t rows,
                rl_work *ws, float *grad);

#endif /* RL_POLICY_H */
