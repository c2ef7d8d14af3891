/*
 * ferry_loco.h — trainer <-> trainer synchronisation: sparse pseudo-gradients
 * with a BF16-visibility gate and FP32 error feedback (PULSELoCo), and the
 * dense baselines DiLoCo and DDP, over MPI.
 *
 * THE ALGORITHM.  R trainers ("ranks") share global FP32 weights θ_g.  Each
 * round, every rank starts from θ_g, takes H local optimizer steps of its
 * own (the caller does them) and ends at θ_local.  Then:
 *
 *   δ = θ_g − θ_local                      pseudo-gradient (FP32, per rank)
 *   s = e + δ                              e: this rank's residual (FP32)
 *   gate_i  ⇔  bf16(θ_g,i − s_i) ≠ bf16(θ_g,i)
 *   send (i, s_i) for gated i, e_i ← 0;   e_i ← s_i for the others
 *
 * i.e. a rank sends exactly the entries whose accumulated update would
 * change the BF16 weights a rollout engine sees, and carries the rest,
 * exactly, in the error-feedback residual e until they do.  bf16() is
 * ferry_f32_to_bf16 (PyTorch's rounding), compared bit for bit.  Every rank
 * decodes every payload, sums them in rank order 0..R-1 into a dense FP32
 * buffer (a fixed order, so the sum is bit-identical on every rank),
 * divides by R, and applies the outer optimizer to θ_g with that mean as
 * its gradient:
 *
 *   b ← μ·b + g;   θ_g ← θ_g − η·(g + μ·b)   (Nesterov; η 0.7, μ 0.9 default)
 *   θ_g ← θ_g − η·b                          (without Nesterov)
 *
 * (PyTorch's SGD with momentum, no dampening).  That is the gate "sent"
 * (FERRY_LOCO_GATE_SENT, the original PULSELoCo).  Its weakness: the gate
 * tests s as it is sent, while the outer step moves θ_g by η(1+μ)·s at
 * once and η/(1−μ)·s in all (1.33× and 7× at the defaults), so an entry
 * waits in e for rounds after DiLoCo would have moved it visibly.
 *
 * THE OUTER GATE (FERRY_LOCO_GATE_OUTER, the default).  The outer step is
 * linear in its gradient, and the gradient is the mean of the ranks'
 * pseudo-gradients, so DiLoCo's update of θ_g is the mean over ranks of
 * per-rank updates u_r = η(δ_r + μ·b_r), b_r ← μ·b_r + δ_r (Nesterov; η·b_r
 * without), each computable by its rank alone.  Each rank therefore keeps
 * its own momentum b_r, applies the outer step to its own δ to get u_r, and
 * gates that:
 *
 *   s = e + u_r;   q = code(s)             (q = s for FP32 values)
 *   gate_i  ⇔  q_i ≠ 0 and bf16(θ_g,i − q_i) ≠ bf16(θ_g,i)
 *   send (i, q_i) for gated i, e_i ← s_i − q_i;  e_i ← s_i for the others
 *   θ_g ← θ_g − mean_r(sent_r)             (no global momentum)
 *
 * i.e. an entry is sent exactly when the outer optimizer's update,
 * accumulated, would change the BF16 weight, and θ_g differs from
 * DiLoCo's by the pending residuals alone (up to FP32 rounding), never by
 * a momentum the held-back entries missed.  With outer lr 1 and momentum
 * 0, u_r = δ_r and both gates give the same bits.  Every rank's b_r and e
 * are its own; θ_g is the same on every rank, checked as below.
 *
 * VALUE CODING.  FERRY_LOCO_VALUES_FP32 sends s exactly.
 * FERRY_LOCO_VALUES_CELL (the default) sends q = k·c_i, k the integer
 * nearest s/c_i (ties to even), c_i = 2^(max(E(θ_g,i), −32) − 7) the BF16
 * cell of the global weight θ_g,i (E: its binary exponent), |k| <= 2^24 −
 * 1; the rounding error s − q (exact in FP32: |s − q| <= c_i/2 <= |q|/2)
 * stays in e, so nothing is lost over rounds.  An entry thus goes out once
 * its accumulated update reaches half a cell, as a whole number of cells
 * (and a whole cell always changes the BF16 weight).  Every rank holds
 * θ_g, so the payload carries only k (a zigzag varint, almost always ±1)
 * and the receiver rebuilds the exact FP32 q.  (s beyond (2^24 − 1)·c_i,
 * 2^16 times the weight itself, is clamped; its remainder stays in e with
 * FP32 rounding.)  Every rank then hashes θ_g
 * (XXH3-128 of the FP32 array), the hashes are gathered, and any
 * disagreement fails the round on every rank with FERRY_ERR_LOCO_DIVERGED,
 * naming the round and the ranks.  The caller resets its local weights to
 * the new θ_g (ferry_loco_sync copies them into its buffer).
 *
 * Baselines in the same object: FERRY_LOCO_DILOCO sends δ dense (4 bytes
 * per weight, no gate, no residual) through the same fixed-order mean and
 * outer optimizer; FERRY_LOCO_DDP has no outer step: the caller averages
 * its gradient every step with ferry_loco_mean (deterministic, dense) and
 * checks agreement with ferry_loco_check.
 *
 * Why a deterministic mean rather than MPI_Allreduce: MPI_SUM on floats
 * may combine partial sums in an order that depends on the algorithm the
 * library picks (and on the rank), so ranks can end up with weights that
 * differ in the last bit and drift apart.  Gathering the contributions and
 * adding them in rank order costs R× the receive volume of a ring
 * all-reduce but makes bit-identity a property of the code, not of the MPI
 * build.
 *
 * BYTES.  "Bytes sent" is what a rank contributes per round: its payload
 * (PULSELoCo), 4·n (DiLoCo) or 4·n per ferry_loco_mean call (DDP).  With a
 * gather-based exchange each rank also receives the others' payloads; the
 * ratio between modes is the same either way.
 *
 * PAYLOAD FORMAT (little-endian; one per rank per round):
 *   off size
 *     0    4  magic "FLOC"
 *     4    1  format version, 1
 *     5    1  kind, 1 = sparse FP32, 2 = sparse cell-coded
 *     6    2  reserved, 0
 *     8    8  round
 *    16    4  rank
 *    20    4  reserved, 0
 *    24    8  n: dense length (weights)
 *    32    8  count: entries, <= n
 *    40    8  raw_len: bytes of the body before compression
 *    48    8  body_len: bytes of the body as stored (== payload size − 64)
 *    56    8  checksum: XXH3-64 of bytes 0..55 followed by the stored body
 *    64       body: one zstd frame of raw_len bytes (absent when count = 0):
 *               count LEB128 varints, gap_k = idx_k − idx_{k−1} − 1
 *               (idx_{−1} = −1; minimal encodings only), then the FP32
 *               bit patterns of the count values as four byte planes
 *               (every value's byte 3, then byte 2, byte 1, byte 0), which
 *               lets zstd find the redundancy of signs and exponents.
 *               Kind 2: the count gaps, then count zigzag LEB128 varints
 *               of k (value k·c_i, see VALUE CODING; 1 <= |k| <= 2^24−1,
 *               minimal encodings only); decoding needs θ_g.
 * Indices are therefore strictly ascending; values are exact.
 *
 * Conventions: those of ferry.h (status codes, ferry_last_error(), free
 * accepts NULL).  The payload decoder treats its input as hostile: every
 * length is checked against the caller's n before any allocation (so memory
 * is bounded by the model size, never by a declared field), the checksum is
 * verified before decompression, and any inconsistency yields one of the
 * codes below, never a crash.
 *
 * Building: the MPI-free part (gate, payload codec, outer step) is declared
 * always; the MPI part needs <mpi.h> and is declared unless
 * FERRY_LOCO_NO_MPI is defined before this header.  Link build/libferry_loco.a
 * (built with mpicc) before build/libferry.a.
 */
#ifndef FERRY_LOCO_H
#define FERRY_LOCO_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

#ifndef FERRY_LOCO_NO_MPI
#include <mpi.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Errors 120..139 (FERRY_ERR_LOCO_*): listed, with their
 * messages and meanings, in ferry_errors.h (included through ferry.h).
 * ====================================================================== */

#define FERRY_LOCO_HEADER_SIZE 64
#define FERRY_LOCO_MAX_N ((uint64_t)1 << 40) /* weights per model */

/* ======================================================================
 * Sparse vectors (the gate's output and the decoder's).
 * ====================================================================== */
typedef struct ferry_loco_sparse {
    uint64_t count; /* entries */
    uint64_t *idx;  /* count strictly ascending indices */
    float *val;     /* count exact FP32 values */
    uint64_t cap;   /* allocated entries (grown by the library) */
} ferry_loco_sparse;

/* Frees the arrays and zeroes *s; s may be NULL or zeroed. */
FERRY_API void ferry_loco_sparse_release(ferry_loco_sparse *s);

/* ======================================================================
 * The gate with error feedback (no MPI).
 * ====================================================================== */

/* For i in 0..n-1: s = residual[i] + (global[i] − local[i]) in FP32;
 * entries with ferry_f32_to_bf16(global[i] − s) != ferry_f32_to_bf16(global[i])
 * are appended to out (out->count is reset first) and their residual is set
 * to 0; the others get residual[i] = s.  FERRY_ERR_LOCO_VALUE if a gated s
 * is not finite (a diverged local run), FERRY_ERR_LIMIT if n >
 * FERRY_LOCO_MAX_N, FERRY_ERR_NOMEM: on error residual is unchanged. */
FERRY_API int ferry_loco_gate(const float *global, const float *local, float *residual,
                              uint64_t n, ferry_loco_sparse *out);

/* Value codings of sent entries (VALUE CODING above). */
enum { FERRY_LOCO_VALUES_FP32 = 0, FERRY_LOCO_VALUES_CELL = 1 };

/* The gate on a given per-rank update (the outer gate's second step): s =
 * residual[i] + update[i]; q = s (FP32) or its cell code against global[i]
 * (CELL); entries with q != 0 and bf16(global[i] − q) != bf16(global[i])
 * are appended to out with value q (out->count reset first) and their
 * residual becomes s − q; the others get residual[i] = s.  Errors as
 * ferry_loco_gate (FERRY_ERR_ARG for an unknown coding); on error residual
 * is unchanged. */
FERRY_API int ferry_loco_gate_update(const float *global, const float *update, float *residual,
                                     uint64_t n, int values, ferry_loco_sparse *out);

/* ======================================================================
 * Payload codec (no MPI).
 * ====================================================================== */
typedef struct ferry_loco_header {
    uint64_t round;
    uint32_t rank;
    uint64_t n;     /* dense length */
    uint64_t count; /* entries */
    int values;     /* FERRY_LOCO_VALUES_FP32 (kind 1) or _CELL (kind 2) */
} ferry_loco_header;

/* Encodes hdr and the entries of sp (sp->count must equal hdr->count;
 * indices strictly ascending and < hdr->n; values finite) into a new
 * buffer (*out, *size), released with ferry_free.  level: zstd level
 * 1..19 (0 = 1).  FERRY_ERR_ARG for entries that break those rules. */
FERRY_API int ferry_loco_encode(const ferry_loco_header *hdr, const ferry_loco_sparse *sp,
                                int level, void **out, size_t *size);

/* ferry_loco_encode for either coding: hdr->values CELL needs base (the
 * n global weights the values were coded against; ignored for FP32), and
 * every value must be an exact cell multiple k·c_i with 1 <= |k| <=
 * 2^24−1 (FERRY_ERR_ARG otherwise: what is sent is coded losslessly or
 * refused).  ferry_loco_encode(...) is this with base NULL. */
FERRY_API int ferry_loco_encode_with(const ferry_loco_header *hdr, const ferry_loco_sparse *sp,
                                     const float *base, int level, void **out, size_t *size);

/* Reads only the 64-byte header (no checksum check): for routing.
 * FERRY_ERR_LOCO_TRUNCATED / _MAGIC / _VERSION / _CORRUPT. */
FERRY_API int ferry_loco_peek(const void *payload, size_t size, ferry_loco_header *hdr);

/* Decodes a payload for a model of n weights into *out (grown as needed;
 * reuse it across calls) and *hdr.  Validates in this order: header
 * (MAGIC, VERSION, CORRUPT for reserved fields), n (SIZE), count (COUNT),
 * lengths (TRUNCATED, TRAILING, CORRUPT), checksum (CHECKSUM), the zstd
 * frame (CORRUPT), the gaps (CORRUPT, INDEX) and the values (VALUE).
 * Allocates at most ~(12 + 14)·count bytes with count <= n.  On error
 * out->count is 0. */
FERRY_API int ferry_loco_decode(const void *payload, size_t size, uint64_t n,
                                ferry_loco_header *hdr, ferry_loco_sparse *out);

/* ferry_loco_decode for either kind: a kind-2 (cell-coded) payload needs
 * base, the n global weights it was coded against (FERRY_ERR_ARG without);
 * its k must be minimal varints with 1 <= |k| <= 2^24−1 (CORRUPT) and
 * k·c_i finite (VALUE).  ferry_loco_decode(...) is this with base NULL. */
FERRY_API int ferry_loco_decode_with(const void *payload, size_t size, uint64_t n, const float *base,
                                     ferry_loco_header *hdr, ferry_loco_sparse *out);

/* ======================================================================
 * Outer optimizer (no MPI).
 * ====================================================================== */
typedef struct ferry_loco_outer {
    float lr;       /* η, default 0.7 */
    float momentum; /* μ, default 0.9; 0 = plain SGD */
    int nesterov;   /* default 1 */
} ferry_loco_outer;

FERRY_API ferry_loco_outer ferry_loco_outer_default(void);

/* One SGD step on n weights: buf ← μ·buf + grad, then
 * w ← w − η·(grad + μ·buf) (Nesterov) or w ← w − η·buf.  buf starts at 0.
 * Plain FP32 arithmetic in a fixed order: bit-identical wherever the same
 * binary runs it on the same inputs. */
FERRY_API void ferry_loco_outer_step(const ferry_loco_outer *cfg, float *w, float *buf,
                                     const float *grad, uint64_t n);

/* The same step's update without applying it: upd[i] = η·d_i (what
 * ferry_loco_outer_step would subtract from w[i]), buf advanced alike.
 * upd may be grad (in place).  The outer gate's per-rank update. */
FERRY_API void ferry_loco_outer_update(const ferry_loco_outer *cfg, float *buf, const float *grad,
                                       float *upd, uint64_t n);

/* XXH3-128 of n FP32 weights as bytes (canonical big-endian digest): the
 * value ranks compare.  Host byte order (little-endian on every machine
 * this targets). */
FERRY_API void ferry_loco_hash(const float *w, uint64_t n, uint8_t out[16]);

/* ======================================================================
 * Exchange over MPI.
 * ====================================================================== */
typedef enum ferry_loco_mode {
    FERRY_LOCO_PULSE = 0,  /* sparse gated pseudo-gradient + error feedback */
    FERRY_LOCO_DILOCO = 1, /* dense FP32 pseudo-gradient */
    FERRY_LOCO_DDP = 2     /* dense gradient mean every step, no outer step */
} ferry_loco_mode;

/* PULSE's gates (THE OUTER GATE above).  0 is the original, so that a
 * zeroed config keeps its meaning; ferry_loco_config_default() picks OUTER. */
enum { FERRY_LOCO_GATE_SENT = 0, FERRY_LOCO_GATE_OUTER = 1 };

typedef struct ferry_loco_config {
    ferry_loco_mode mode;
    ferry_loco_outer outer; /* PULSE and DILOCO */
    int level;              /* zstd level of PULSE payloads, 1..19 (0 = 1) */
    int gate;               /* PULSE: FERRY_LOCO_GATE_SENT or _OUTER */
    int values;             /* PULSE: FERRY_LOCO_VALUES_FP32 or _CELL */
} ferry_loco_config;

/* mode PULSE, outer ferry_loco_outer_default(), level 1, gate OUTER,
 * values CELL. */
FERRY_API ferry_loco_config ferry_loco_config_default(void);

/* What one round did, identical on every rank except the *_rank fields. */
typedef struct ferry_loco_stats {
    uint64_t round;          /* the round just completed (0-based) */
    uint64_t n;              /* weights */
    int nranks;
    uint64_t bytes_rank;     /* bytes this rank sent */
    uint64_t bytes_all;      /* Σ over ranks of bytes sent */
    uint64_t gated_rank;     /* entries this rank sent (n for dense modes) */
    uint64_t gated_all;      /* Σ over ranks */
    double gated_fraction;   /* gated_all / (n · nranks) */
    double residual_l1;      /* Σ|e| over this rank's residual (PULSE) */
    uint8_t hash[16];        /* ferry_loco_hash of the new global weights */
} ferry_loco_stats;

#ifndef FERRY_LOCO_NO_MPI
typedef struct ferry_loco ferry_loco;

/* Collective over comm (duplicated: the object's traffic never mixes with
 * the caller's; MPI errors on it are returned as FERRY_ERR_LOCO_MPI rather
 * than aborting).  n: 1..INT_MAX/4 weights (dense collectives count in
 * ints), else FERRY_ERR_LIMIT.  Copies the n initial global weights, which
 * must be bit-identical on every rank (checked: FERRY_ERR_LOCO_DIVERGED); n and
 * cfg->mode must agree too (FERRY_ERR_ARG).  The outer settings are not
 * compared under the gate "sent" and in DiLoCo: ranks configured
 * differently diverge, and the first sync says so.  Gate and values are
 * compared, and under the outer gate the outer settings too (each rank
 * applies its own there, so a mismatch would not show as divergence):
 * FERRY_ERR_ARG on every rank.  Residual and momentum start at 0. */
FERRY_API int ferry_loco_create(MPI_Comm comm, const float *init, uint64_t n,
                                const ferry_loco_config *cfg, ferry_loco **out);
/* Collective (MPI_Comm_free of the duplicated communicator).  Accepts NULL. */
FERRY_API void ferry_loco_free(ferry_loco *s);

FERRY_API int ferry_loco_rank(const ferry_loco *s);
FERRY_API int ferry_loco_size(const ferry_loco *s);
/* The global weights θ_g (n floats), valid until the next sync. */
FERRY_API const float *ferry_loco_global(const ferry_loco *s);
/* Rounds completed. */
FERRY_API uint64_t ferry_loco_round(const ferry_loco *s);

/* Collective; PULSE and DILOCO only (else FERRY_ERR_LOCO_MODE).  local
 * holds this rank's weights after its H local steps; on success it holds
 * the new global weights, bit-identical on every rank, and *st (may be
 * NULL) describes the round.  Every rank returns the same status: a
 * failure on one rank (its gate, an MPI call) is exchanged first and the
 * others return FERRY_ERR_LOCO_PEER naming it; a payload that fails to
 * decode fails everywhere with the decoder's code, naming its rank.  On
 * error local is untouched, the round does not advance, and the global
 * weights, momentum and residual are unchanged, except after
 * FERRY_ERR_LOCO_DIVERGED: then the global weights and momentum hold this
 * rank's (disagreeing) result, for inspection; the run cannot go on.
 * Limits: the round's payloads together must fit in 2 GiB (MPI's int
 * counts; FERRY_ERR_LIMIT on every rank otherwise). */
FERRY_API int ferry_loco_sync(ferry_loco *s, float *local, ferry_loco_stats *st);

/* Collective; any mode.  Replaces vec (n floats) by the mean of every
 * rank's vec, summed in rank order then divided by the rank count:
 * bit-identical on every rank.  DDP's gradient all-reduce.  *bytes (may be
 * NULL) gets the bytes this rank sent (4·n). */
FERRY_API int ferry_loco_mean(ferry_loco *s, float *vec, uint64_t *bytes);

/* Collective; any mode.  Gathers ferry_loco_hash(w) of every rank and
 * fails with FERRY_ERR_LOCO_DIVERGED on all ranks if they differ, with a
 * message naming `round` and the ranks that differ from rank 0.  hash
 * (may be NULL) gets this rank's hash. */
FERRY_API int ferry_loco_check(ferry_loco *s, const float *w, uint64_t round, uint8_t hash[16]);

#endif /* FERRY_LOCO_NO_MPI */

#ifdef __cplusplus
}
#endif
#endif /* FERRY_LOCO_H */
