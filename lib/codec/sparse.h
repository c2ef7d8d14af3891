/* The sparse tensor codec shared by encoder and decoder: word access,
 * value classes, order keys, the scan/walk that relate positions to
 * class-local ranks, and the context models.  docs/FORMAT.md, "Sparse
 * payload", is the normative description.
 *
 * A tensor is a sequence of W-bit words (W = 8, 16, 32 or 64; sub-byte
 * dtypes are coded as bytes).  Each word has a *class* computed from its
 * BASE value, which both ends know: for float dtypes one of 8 buckets of the
 * exponent counted down from a per-chunk origin `top`, else 0.  Words of one
 * class flip at similar rates (the BF16 rounding cell is proportional to
 * |w|), so positions are coded per class, as gaps between the *ranks* of
 * changed words among that class's words; deltas use the class as context. */
#ifndef FERRY_SPARSE_H
#define FERRY_SPARSE_H
#include "common.h"
#include "bf16.h"
#include "rc.h"

/* Chunk size: each chunk of a tensor is coded independently (parallel
 * coding, bounded memory).  Positions inside a chunk fit in 32 bits.  A
 * chunk of 2^22 words of at least one byte covers whole 4 MiB hash leaves
 * (FERRY_HASH_BLOCK), so the workers decoding two chunks never share a
 * leaf digest: smaller chunks are refused (ferry always wrote 2^22). */
#define SP_CHUNK_LOG2_MIN 22
#define SP_CHUNK_LOG2_MAX 28
#define SP_CHUNK_LOG2_DEFAULT 22
#define SP_NCLASS 8   /* exponent buckets of float dtypes (positions) */
#define SP_NDCLASS 16 /* exponent buckets of float dtypes (deltas) */

/* Chunk codecs (first byte of a chunk). */
enum { SP_CODEC_EMPTY = 0, SP_CODEC_ADAPTIVE = 1, SP_CODEC_RANS = 2, SP_CODEC_RANS32 = 3, SP_CODEC_COUNTED = 4 };
#define SP_CODEC_MAX SP_CODEC_COUNTED
/* The first patch format version whose chunks may use a codec. */
static inline unsigned sp_codec_version(unsigned codec)
{
    return codec == SP_CODEC_COUNTED ? 3 : codec == SP_CODEC_RANS32 ? 2 : 1;
}

typedef struct sp_dtype {
    unsigned W;          /* word bits: 8, 16, 32, 64 */
    unsigned exp_shift;  /* exponent = (word >> exp_shift) & exp_mask */
    uint32_t exp_mask;   /* 0: no exponent, a single class */
    int is_float;        /* order key: sign-magnitude total order */
    int is_signed;       /* order key: two's complement (flip the sign bit) */
} sp_dtype;

static inline sp_dtype sp_dtype_of(ferry_dtype dt)
{
    switch (dt) {
    case FERRY_BF16: return (sp_dtype){16, 7, 0xFF, 1, 0};
    case FERRY_F16: return (sp_dtype){16, 10, 0x1F, 1, 0};
    case FERRY_F32: return (sp_dtype){32, 23, 0xFF, 1, 0};
    case FERRY_F64: return (sp_dtype){64, 52, 0x7FF, 1, 0};
    case FERRY_F8_E4M3: return (sp_dtype){8, 3, 0xF, 1, 0};
    case FERRY_F8_E5M2: return (sp_dtype){8, 2, 0x1F, 1, 0};
    case FERRY_I8: return (sp_dtype){8, 0, 0, 0, 1};
    case FERRY_I16: return (sp_dtype){16, 0, 0, 0, 1};
    case FERRY_I32: return (sp_dtype){32, 0, 0, 0, 1};
    case FERRY_I64: return (sp_dtype){64, 0, 0, 0, 1};
    case FERRY_U16: return (sp_dtype){16, 0, 0, 0, 0};
    case FERRY_U32: return (sp_dtype){32, 0, 0, 0, 0};
    case FERRY_U64: case FERRY_C64: return (sp_dtype){64, 0, 0, 0, 0};
    default: return (sp_dtype){8, 0, 0, 0, 0}; /* bytes: BOOL, U8, F8_E8M0, F4, F6 */
    }
}

static inline uint32_t sp_nclass(const sp_dtype *t) { return t->exp_mask ? SP_NCLASS : 1; }
static inline uint64_t sp_wmask(unsigned W) { return W == 64 ? ~(uint64_t)0 : ((uint64_t)1 << W) - 1; }

static inline uint64_t sp_load(const uint8_t *p, size_t i, unsigned W)
{
    switch (W) {
    case 8: return p[i];
    case 16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return v; }
    case 32: { uint32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    default: { uint64_t v; memcpy(&v, p + 8 * i, 8); return v; }
    }
}
/* Words are stored in the host order: ferry targets little-endian hosts,
 * which is what safetensors data is. */
static inline void sp_store(uint8_t *p, size_t i, unsigned W, uint64_t v)
{
    switch (W) {
    case 8: p[i] = (uint8_t)v; break;
    case 16: { uint16_t x = (uint16_t)v; memcpy(p + 2 * i, &x, 2); break; }
    case 32: { uint32_t x = (uint32_t)v; memcpy(p + 4 * i, &x, 4); break; }
    default: memcpy(p + 8 * i, &v, 8); break;
    }
}

static inline __attribute__((always_inline)) uint64_t sp_key(const sp_dtype *t, uint64_t u)
{
    if (t->is_float) return ferry__fkey(u, t->W);
    if (t->is_signed) return u ^ ((uint64_t)1 << (t->W - 1));
    return u;
}
static inline __attribute__((always_inline)) uint64_t sp_key_inv(const sp_dtype *t, uint64_t k)
{
    if (t->is_float) return ferry__fkey_inv(k, t->W);
    if (t->is_signed) return k ^ ((uint64_t)1 << (t->W - 1));
    return k;
}
static inline unsigned sp_sign(const sp_dtype *t, uint64_t u) { return (unsigned)(u >> (t->W - 1)) & 1u; }

/* Class of a base word: bucket min(7, max(0, top - exponent)). */
static inline uint32_t sp_class(const sp_dtype *t, uint32_t top, uint64_t u)
{
    if (!t->exp_mask) return 0;
    int32_t d = (int32_t)top - (int32_t)((u >> t->exp_shift) & t->exp_mask);
    return d <= 0 ? 0 : d >= SP_NCLASS - 1 ? SP_NCLASS - 1 : (uint32_t)d;
}

/* Delta class: min(15, max(0, top - exponent)).  Deltas scale with the
 * rounding cell (a weight half as large moves twice as many ULPs for the
 * same step), so they need finer buckets than positions. */
static inline uint32_t sp_dclass(const sp_dtype *t, uint32_t top, uint64_t u)
{
    if (!t->exp_mask) return 0;
    int32_t d = (int32_t)top - (int32_t)((u >> t->exp_shift) & t->exp_mask);
    return d <= 0 ? 0 : d >= SP_NDCLASS - 1 ? SP_NDCLASS - 1 : (uint32_t)d;
}

/* Where the target words come from: the target tensor itself, or FP32
 * masters cast to BF16 on the fly (the FP32 gate). */
typedef struct sp_src {
    const uint8_t *p;
    int f32_to_bf16;
} sp_src;

/* Per-thread scratch of the coders; grows as needed, reused across chunks. */
typedef struct sp_scratch {
    uint32_t *pos, *cls, *rank; /* per change, in position order */
    uint32_t *order;            /* ranks grouped by class (encoder) */
    uint64_t *val;              /* new words, per change */
    uint64_t *old;              /* base words, per change (encoder) */
    uint32_t *word;             /* per change: base word (decoder's AVX-512 walk, have_words), or base | new << 16 (AVX-512 scan) */
    int have_words;
    uint8_t *lut;               /* rANS decoder: slot -> symbol, per table */
    uint32_t *lut32;            /* rANS vector decoder: fused tables */
    uint8_t *syms;              /* rANS: (table, symbol) pairs (encoder); tables, then symbols (decoder) */
    uint8_t *rbm;               /* decoder walk: wanted ranks as bitmaps, per class */
    uint64_t *ebm;              /* AVX-512 encoder scan: changed ranks as bitmaps, SP_NCLASS x ebm_words */
    uint64_t ebm_bits[SP_NCLASS]; /* ... each ebm_bits[c] bits long */
    int lazy;                   /* the AVX-512 scan's result is still in ebm and word: see ferry__codec_scan_group */
    size_t cap, rbm_cap, ebm_words;
    uint32_t start[SP_NCLASS + 1]; /* class c's changes: order[start[c] .. start[c+1]) */
} sp_scratch;
int ferry__codec_scratch_fit(sp_scratch *s, size_t need);
void ferry__codec_scratch_release(sp_scratch *s);

/* Chooses the bucket origin of a chunk from a sample of its base words: the
 * exponent below which 99% of the sampled words lie. */
uint32_t ferry__codec_choose_top(const sp_dtype *t, const uint8_t *a, size_t n);

/* Encoder scan, in pieces: ferry__codec_scan_range records the changed words among
 * words [lo, hi) of the chunk (a: the chunk's base words; b: the target
 * words of [lo, hi) only) with their classes, ranks, old and new words, in
 * position order (s->pos, s->cls, s->rank, s->old, s->val); ferry__codec_scan_group
 * then groups the ranks by class (s->order, s->start).  Scanning in
 * cache-sized pieces lets the caller hash each piece of the target while it
 * is hot.  (The AVX-512 scan keeps each class's changes as a bitmap in rank
 * space instead, and the 16-bit words as 32-bit ones; ferry__codec_scan_group turns
 * them into the same arrays.) */
typedef struct sp_scan_state {
    uint32_t cnt[SP_NCLASS];
    size_t k;
    int bm; /* 0 until the first piece; 1: per-class bitmaps (AVX-512); 2: per-change ranks */
} sp_scan_state;
int ferry__codec_scan_range(const sp_dtype *t, uint32_t top, const uint8_t *a, const uint8_t *b, size_t lo, size_t hi,
                  sp_scratch *s, sp_scan_state *st);
int ferry__codec_scan_group(sp_scratch *s, const sp_scan_state *st);
/* After the AVX-512 scan, ferry__codec_scan_group only counts (s->start) and sets
 * s->lazy: the ranks are still bitmaps and the old and new words pairs in
 * s->word.  The rANS encoder reads them so; ferry__codec_scan_unlazy makes s->order,
 * s->old and s->val for other readers. */
void ferry__codec_scan_unlazy(sp_scratch *s, size_t k);
#define SP_SCAN_PIECE ((size_t)1 << 15) /* words; divides every hash block */

/* Decoder walk: given the k ranks grouped by class (s->order, s->start; each
 * class's ranks strictly increasing), finds their positions by walking the
 * base words; fills s->pos in position order.  Fails if a rank lies beyond
 * its class's population. */
int ferry__codec_walk(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n, sp_scratch *s, size_t k);
/* dst[i] = the low 16 bits of src[i], for i < n (positions and base words
 * into the in-place undo log). */
void ferry__codec_narrow16(uint16_t *dst, const uint32_t *src, size_t n);
/* The wanted ranks of each class as a bitmap in rank space (bit r of bm[c]),
 * lim[c] bytes long and followed by 16 zero bytes, in s->rbm. */
int ferry__codec_walk_bitmaps(sp_scratch *s, const uint8_t *bm[SP_NCLASS], uint64_t lim[SP_NCLASS]);

/* Signed delta of a change as a magnitude 1..2^(W-1) and a sign. */
static inline __attribute__((always_inline)) uint64_t sp_delta(const sp_dtype *t, uint64_t x, uint64_t y, unsigned *neg)
{
    uint64_t d = (sp_key(t, y) - sp_key(t, x)) & sp_wmask(t->W);
    *neg = d >= ((uint64_t)1 << (t->W - 1));
    return *neg ? ((~d + 1) & sp_wmask(t->W)) : d;
}
/* Inverse; false if the magnitude is out of range for W. */
static inline __attribute__((always_inline)) bool sp_undelta(const sp_dtype *t, uint64_t x, unsigned neg, uint64_t mag, uint64_t *y)
{
    uint64_t half = (uint64_t)1 << (t->W - 1);
    if (mag == 0 || mag > half || (!neg && mag == half)) return false;
    uint64_t delta = neg ? (~mag + 1) : mag;
    *y = sp_key_inv(t, (sp_key(t, x) + delta) & sp_wmask(t->W));
    return true;
}

/* ---- adaptive binary coding (small chunks) ---- */

/* Adaptive Elias-gamma model for unsigned integers v < 2^64 - 1: x = v + 1
 * has bit length L+1; L is sent in unary (context per step), then the top
 * SP_MANT_CTX bits below the leading one with context (L, bit index), then
 * the rest as equiprobable bits. */
#define SP_MANT_CTX 3
typedef struct sp_num {
    rc_prob un[65];
    rc_prob mant[64][SP_MANT_CTX];
} sp_num;

static inline void sp_num_init(sp_num *m) { rc_probs_init(&m->un[0], sizeof *m / sizeof(rc_prob)); }

static inline void sp_num_put(rc_enc *e, sp_num *m, uint64_t v)
{
    uint64_t x = v + 1;
    unsigned L = 63u - (unsigned)__builtin_clzll(x);
    for (unsigned i = 0; i < L; i++) rc_encode(e, &m->un[i], 1);
    rc_encode(e, &m->un[L], 0);
    unsigned j = 0;
    for (; j < L && j < SP_MANT_CTX; j++) rc_encode(e, &m->mant[L][j], (unsigned)(x >> (L - 1 - j)) & 1u);
    unsigned rest = L - j;
    while (rest) {
        unsigned n = rest > 16 ? 16 : rest;
        rest -= n;
        rc_encode_direct(e, (uint32_t)(x >> rest) & ((1u << n) - 1), n);
    }
}

/* Returns false on a malformed value (length over 63 bits). */
static inline bool sp_num_get(rc_dec *d, sp_num *m, uint64_t *v)
{
    unsigned L = 0;
    while (rc_decode(d, &m->un[L])) {
        if (++L > 63) return false;
    }
    uint64_t x = 1;
    unsigned j = 0;
    for (; j < L && j < SP_MANT_CTX; j++) x = (x << 1) | rc_decode(d, &m->mant[L][j]);
    unsigned rest = L - j;
    while (rest) {
        unsigned n = rest > 16 ? 16 : rest;
        rest -= n;
        x = (x << n) | rc_decode_direct(d, n);
    }
    if (x == 0) return false; /* only reachable with L = 63 overflow tricks */
    *v = x - 1;
    return true;
}

/* ---- codec 4: rank gaps of a known rate ----
 *
 * A class with k changes among about n words has gaps close to geometric
 * with p = k/n; codec 4 codes them with that distribution, fixed, instead of
 * learning one (the learning is what costs in a sparse chunk, where a class
 * has a few dozen changes).  Both ends estimate n from the same sample of
 * base words as `top` (ferry__codec_sample_classes), so it costs no bytes.  All
 * arithmetic is on integers: encoder and decoder must agree to the bit on
 * every probability, whatever their libm.
 *
 * A gap g = b * 2^r + rest, with r the smallest with q^(2^r) <= 1/2
 * (q = 1 - p): b in unary, each step with P(another) = q^(2^r); then the r
 * bits of rest, most significant first, the one at level s (splitting 2^s
 * values in halves) with P(lower half) = 1 / (1 + q^(2^(s-1))).  That is
 * the geometric distribution exactly, up to 16-bit probabilities. */
typedef struct sp_geo {
    unsigned r;
    uint16_t more;        /* P(unary bit 0 = stop), 1/65536 */
    uint16_t half[33];    /* half[s]: P(bit 0) at level s = 1..r */
} sp_geo;

static inline uint16_t sp_geo_prob(uint64_t p16)
{
    return (uint16_t)(p16 < 32 ? 32 : p16 > RC_ONE - 32 ? RC_ONE - 32 : p16);
}

/* k changes among about n words (0 < k < n < 2^32). */
static inline void sp_geo_init(sp_geo *g, uint64_t k, uint64_t n)
{
    uint64_t Q[34];
    Q[0] = ((n - k) << 32) / n; /* q in Q32 (< 2^32 as k >= 1) */
    unsigned r = 0;
    while (Q[r] >= ((uint64_t)1 << 31) && r < 32) {
        Q[r + 1] = (Q[r] * Q[r]) >> 32;
        r++;
    }
    g->r = r;
    g->more = sp_geo_prob((((uint64_t)1 << 32) - Q[r]) >> 16);
    for (unsigned s = 1; s <= r; s++) g->half[s] = sp_geo_prob(((uint64_t)1 << 48) / (((uint64_t)1 << 32) + Q[s - 1]));
}

static inline void sp_geo_put(rc_enc *e, const sp_geo *g, uint64_t v)
{
    for (uint64_t b = v >> g->r; b; b--) rc_encode(e, &(rc_prob){g->more, 0}, 1);
    rc_encode(e, &(rc_prob){g->more, 0}, 0);
    for (unsigned s = g->r; s >= 1; s--) rc_encode(e, &(rc_prob){g->half[s], 0}, (unsigned)(v >> (s - 1)) & 1u);
}

/* False when the gap would reach max or beyond. */
static inline bool sp_geo_get(rc_dec *d, const sp_geo *g, uint64_t max, uint64_t *v)
{
    uint64_t b = 0;
    while (rc_decode_p(d, g->more)) /* fixed probabilities: nothing to update */
        if (++b > (max >> g->r) || d->overrun) return false;
    uint64_t x = b << g->r;
    for (unsigned s = g->r; s >= 1; s--) x |= (uint64_t)rc_decode_p(d, g->half[s]) << (s - 1);
    *v = x;
    return x < max;
}

/* The population codec 4 assumes for a class of k changes and estimated
 * size est: at least 2k, so that a class the sample undercounts is coded as
 * dense (p <= 1/2), never as all-changed. */
static inline uint64_t sp_counted_population(uint64_t est, uint64_t k) { return est > 2 * k ? est : 2 * k; }

/* Estimated words per class of a chunk, from the sample that ferry__codec_choose_top
 * reads (every max(1, n/4096)-th word): est[c] = ceil((hits + 1/2) * n /
 * samples), so that a class the sample misses still gets a small count. */
void ferry__codec_sample_classes(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n, uint64_t est[SP_NCLASS]);

/* Deltas: the sign with context (delta class, sign of the base word), then
 * the magnitude - 1 with the delta class's own integer model. */
typedef struct sp_models {
    sp_num meta;                 /* active class count, class id gaps, per-class counts */
    sp_num gap[SP_NCLASS];
    sp_num mag[SP_NDCLASS];
    rc_prob sign[SP_NDCLASS][2];
} sp_models;
void ferry__codec_models_reset(sp_models *m);

/* Codec 1, or codec 4 when est (the estimated class populations) is not
 * NULL: the same stream but for the rank gaps. */
int ferry__codec_adaptive_encode(const sp_dtype *t, uint32_t top, const uint64_t *est, sp_scratch *s, size_t k,
                       sp_models *m, ferry_buf *out);
/* Fills s->order/s->start (ranks), walks, then s->val; *k changes. */
int ferry__codec_adaptive_decode(const sp_dtype *t, uint32_t top, const uint64_t *est, const uint8_t *a, size_t n,
                       const uint8_t *src, size_t len, sp_scratch *s, sp_models *m, size_t *k);

/* ---- static rANS coding (large chunks): codec 2 or 3 ---- */
int ferry__codec_rans_encode(const sp_dtype *t, uint32_t top, unsigned codec, sp_scratch *s, size_t k, ferry_buf *out);
int ferry__codec_rans_decode(const sp_dtype *t, uint32_t top, unsigned codec, const uint8_t *a, size_t n, const uint8_t *src, size_t len,
                   sp_scratch *s, size_t *k);

/* ---- chunks ---- */

/* Per-thread coder state. */
typedef struct sp_coder {
    sp_scratch s;
    sp_models m;
    uint16_t cast[SP_SCAN_PIECE]; /* one piece of FP32 masters cast to BF16 */
} sp_coder;
void ferry__codec_coder_release(sp_coder *c);

/* Encodes one chunk of n words (base a, target b) and appends it to out;
 * *changed receives the number of changed words, and bh[] the hash digests
 * of the target's blocks in the chunk (the chunk starts on a block).  part:
 * the tensor has more than one chunk (the codec is chosen by the number of
 * changes, with a lower bar for codec 3 in such tensors). */
int ferry__codec_encode_chunk(const sp_dtype *t, const uint8_t *a, const sp_src *b, size_t n, bool part, sp_coder *c,
                    ferry_buf *out, uint64_t *changed, uint8_t (*bh)[16]);
/* The same with the codec (1..3) forced instead of chosen (0: chosen as
 * for a single-chunk tensor, SP_CHOOSE_PART as for a part), for tests and
 * fuzzing of every codec on any chunk. */
#define SP_CHOOSE_PART 0x100
int ferry__codec_encode_chunk_as(unsigned codec, const sp_dtype *t, const uint8_t *a, const sp_src *b, size_t n, sp_coder *c,
                       ferry_buf *out, uint64_t *changed, uint8_t (*bh)[16]);

/* Decodes one chunk: on success *k changes at c->s.pos[0..k) (strictly
 * increasing, < n) with new words c->s.val[0..k), valid until the next call.
 * `version` is the patch's format version (codecs it does not have are
 * corrupt).
 * Any inconsistency is FERRY_ERR_PATCH_CORRUPT. */
int ferry__codec_decode_chunk(const sp_dtype *t, const uint8_t *a, size_t n, const uint8_t *src, size_t len, unsigned version,
                    sp_coder *c, size_t *k);

int ferry__codec_corrupt(const char *what);
#endif
