/* The sparse tensor codec shared by encoder and decoder: word access,
 * value classes, order keys and the context models.  docs/FORMAT.md,
 * "Sparse payload", is the normative description.
 *
 * A tensor is a sequence of W-bit words (W = 8, 16, 32 or 64; sub-byte
 * dtypes are coded as bytes).  Each element has a *class*, computed from its
 * BASE word, that both ends know: the exponent field for float dtypes, else
 * 0.  Elements of one class flip at similar rates (the BF16 rounding cell
 * is proportional to |w|), so positions are coded per class as gaps between
 * changed elements counted among that class's elements only, and deltas are
 * coded with the class as context. */
#ifndef FERRY_SPARSE_H
#define FERRY_SPARSE_H
#include "common.h"
#include "bf16.h"
#include "rc.h"

/* Chunk size: each chunk of a tensor is coded independently (parallel
 * decode, bounded memory).  Positions inside a chunk fit in 32 bits. */
#define SP_CHUNK_LOG2_MIN 10
#define SP_CHUNK_LOG2_MAX 28
#define SP_CHUNK_LOG2_DEFAULT 22

typedef struct sp_dtype {
    unsigned W;          /* word bits: 8, 16, 32, 64 */
    unsigned cls_shift;  /* class = (word >> cls_shift) & cls_mask */
    uint32_t cls_mask;   /* 0: a single class */
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

static inline uint64_t sp_key(const sp_dtype *t, uint64_t u)
{
    if (t->is_float) return ferry__fkey(u, t->W);
    if (t->is_signed) return u ^ ((uint64_t)1 << (t->W - 1));
    return u;
}
static inline uint64_t sp_key_inv(const sp_dtype *t, uint64_t k)
{
    if (t->is_float) return ferry__fkey_inv(k, t->W);
    if (t->is_signed) return k ^ ((uint64_t)1 << (t->W - 1));
    return k;
}
static inline uint32_t sp_class(const sp_dtype *t, uint64_t u) { return (uint32_t)(u >> t->cls_shift) & t->cls_mask; }
static inline unsigned sp_sign(const sp_dtype *t, uint64_t u) { return (unsigned)(u >> (t->W - 1)) & 1u; }

/* Adaptive Elias-gamma model for unsigned integers v < 2^64 - 1: x = v + 1
 * has bit length L+1; L is sent in unary (context per step), then the top
 * SP_MANT_CTX bits below the leading one with context (L, bit index), then
 * the rest as equiprobable bits. */
#ifndef SP_MANT_CTX
#define SP_MANT_CTX 3
#endif
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

/* Delta magnitudes: |d| - 1 in unary over SP_MAG_UNARY steps with context
 * (class, step), then an escape coded with a shared sp_num. */
#define SP_MAG_UNARY 4
typedef struct sp_dctx {
    rc_prob sign[2];            /* by the base word's sign bit */
    rc_prob mag[SP_MAG_UNARY];
} sp_dctx;

/* Everything one chunk's coder needs; sized for the dtype's class count. */
typedef struct sp_models {
    sp_num meta;      /* active class count, class id gaps, per-class counts */
    sp_num esc;       /* large delta magnitudes */
    sp_num *gap;      /* per class (allocated for all classes, initialised lazily) */
    sp_dctx *dctx;    /* per class */
    uint32_t nclass;
} sp_models;

int sp_models_alloc(sp_models *m, const sp_dtype *t);
void sp_models_reset(sp_models *m);
void sp_models_release(sp_models *m);

/* Encodes one chunk of n elements (a = base, b = target words) and appends
 * the range-coded bytes to out; *changed receives the number of changed
 * elements.  Scratch arrays are reused across calls through *scratch. */
typedef struct sp_scratch {
    uint32_t *pos, *loc, *cls, *order;
    size_t cap;
    uint32_t *cnt, *start; /* per class */
    size_t ncls_cap;
} sp_scratch;
void sp_scratch_release(sp_scratch *s);

int sp_encode_chunk(const sp_dtype *t, const uint8_t *a, const uint8_t *b, size_t n,
                    sp_models *m, sp_scratch *s, ferry_buf *out, uint64_t *changed);

/* Decodes one chunk: on success *k changes at positions pos[0..k) (strictly
 * increasing, < n) with new words val[0..k).  The arrays are owned by *s
 * and valid until the next call.  Any inconsistency is PATCH_CORRUPT. */
typedef struct sp_dscratch {
    uint32_t *pos, *loc;
    uint64_t *val;
    size_t cap;
    uint32_t *ptr, *end, *cnt, *act; /* per class */
    size_t ncls_cap;
} sp_dscratch;
void sp_dscratch_release(sp_dscratch *s);

int sp_decode_chunk(const sp_dtype *t, const uint8_t *a, size_t n, const uint8_t *src, size_t srclen,
                    sp_models *m, sp_dscratch *s, size_t *k);
#endif
