/* Static-model rANS for large chunks: interleaved 32-bit states with
 * 16-bit renormalisation and 12-bit probabilities, per-context frequency
 * tables sent with the chunk, and a side stream of raw bits.
 *
 * Decoder safety: reads past the end return zeros and set `overrun`; a
 * table whose frequencies do not sum to RANS_M is rejected; at the end every
 * state must be back at its initial value and every byte consumed. */
#ifndef FERRY_RANS_H
#define FERRY_RANS_H
#include "common.h"
#include "bf16.h"

#define RANS_BITS 12
#define RANS_M (1u << RANS_BITS)
#define RANS_L (1u << 15) /* states live in [RANS_L, 2^31): exact reciprocal division */

#define GAP_NSYM 72    /* gaps < 16 as themselves, then (bit length, next bit) pairs */
#define DELTA_NSYM 128 /* magnitude 1, 2, 3, then (bit length, next bit) pairs */
#define DELTA_NCTX 16  /* delta class */
#define RANS_MAXSYM 128

typedef struct rans_table {
    uint16_t freq[RANS_MAXSYM], start[RANS_MAXSYM];
    uint8_t nsym;
} rans_table;

/* ---- raw bits, LSB-first within little-endian bytes ---- */
typedef struct bitr {
    const uint8_t *p, *end;
    uint64_t acc; /* n unread bits, LSB first */
    unsigned n;
    int overrun;
} bitr;

/* nbits <= 32.  Past the end it reads zeros and sets overrun. */
static inline __attribute__((always_inline)) uint64_t bitr_get(bitr *r, unsigned nbits)
{
    if (r->n < nbits) {
        if (FERRY_LIKELY(r->end - r->p >= 4)) {
            r->acc |= (uint64_t)ferry__le32(r->p) << r->n;
            r->p += 4;
            r->n += 32;
        } else {
            while (r->n < nbits) {
                if (r->p < r->end) r->acc |= (uint64_t)*r->p++ << r->n;
                else r->overrun = 1;
                r->n += 8;
            }
        }
    }
    uint64_t v = r->acc & ((1ull << nbits) - 1);
    r->acc >>= nbits;
    r->n -= nbits;
    return v;
}

static inline __attribute__((always_inline)) uint64_t bitr_get64(bitr *r, unsigned nbits)
{
    if (nbits <= 32) return bitr_get(r, nbits);
    uint64_t lo = bitr_get(r, 32);
    return lo | bitr_get(r, nbits - 32) << 32;
}

/* Bits read so far from a stream that starts at `start`; and moving the
 * reader to bit `pos` of it (pos within the stream), for vector code that
 * reads the same bits. */
static inline uint64_t bitr_tell(const bitr *r, const uint8_t *start) { return (uint64_t)(r->p - start) * 8 - r->n; }
static inline void bitr_seek(bitr *r, const uint8_t *start, uint64_t pos)
{
    r->p = start + pos / 8;
    r->acc = 0;
    r->n = 0;
    if (pos % 8) {
        r->acc = *r->p++ >> (pos % 8);
        r->n = 8 - (unsigned)(pos % 8);
    }
}

/* True when every byte was read and the unread bits are padding. */
static inline bool bitr_done(const bitr *r) { return r->p == r->end && r->n < 8 && !r->overrun; }

/* ---- symbol mapping ---- */
static inline unsigned gap_sym(uint64_t g, uint64_t *raw, unsigned *nraw)
{
    if (g < 16) { *nraw = 0; return (unsigned)g; }
    uint64_t x = g + 1;
    unsigned L = 63u - (unsigned)__builtin_clzll(x); /* >= 4 */
    *nraw = L - 1;
    *raw = x & ((1ull << (L - 1)) - 1);
    return 16 + 2 * (L - 4) + (unsigned)((x >> (L - 1)) & 1);
}

/* Delta magnitude symbol (1..2^63): 0, 1, 2 for 1, 2, 3; then for
 * x = mag >= 4 of bit length L + 1, 3 + 2 (L - 2) + the bit below the
 * leading one, and the L - 1 lower bits raw.  The sign is a raw bit (deltas
 * are symmetric to within a few percent). */
static inline unsigned delta_sym(uint64_t mag, uint64_t *raw, unsigned *nraw)
{
    if (mag <= 3) { *nraw = 0; return (unsigned)mag - 1; }
    unsigned L = 63u - (unsigned)__builtin_clzll(mag); /* >= 2 */
    *nraw = L - 1;
    *raw = mag & ((1ull << (L - 1)) - 1);
    return 3 + 2 * (L - 2) + (unsigned)((mag >> (L - 1)) & 1);
}

/* ---- tables ---- */
int ferry__codec_rans_table_build(rans_table *t, const uint32_t *count, unsigned nsym);
int ferry__codec_rans_table_write(const rans_table *t, ferry_buf *out);
/* Parses one table (alphabet of at most max_nsym symbols) from *p. */
int ferry__codec_rans_table_read(rans_table *t, const uint8_t **p, const uint8_t *end, unsigned max_nsym);
/* Decoding tables: slot -> symbol (RANS_M bytes), and symbol -> frequency |
 * start << 16 (RANS_MAXSYM words). */
void ferry__codec_rans_table_dtab(const rans_table *t, uint8_t *lut, uint32_t *fs);
/* The vector decoder's table: per slot, symbol | (frequency - 1) << 8 |
 * (slot - start) << 20 (RANS_M words). */
void ferry__codec_rans32_fused_table(const rans_table *t, uint32_t *out);

/* ---- coder ---- */

/* Encoder view of one symbol: division by the frequency done as a multiply
 * by a rounded-up reciprocal, exact for states below 2^31 (Alverson). */
typedef struct rans_esym {
    uint32_t x_max, rcp, bias;
    uint16_t cmpl;
    uint8_t shift;
} rans_esym;

static inline void rans_esym_init(rans_esym *e, uint32_t start, uint32_t freq)
{
    e->x_max = ((RANS_L >> RANS_BITS) << 16) * freq;
    e->cmpl = (uint16_t)(RANS_M - freq);
    if (freq < 2) {
        e->rcp = ~0u;
        e->shift = 0;
        e->bias = start + RANS_M - 1;
    } else {
        uint32_t sh = 0;
        while (freq > (1u << sh)) sh++;
        e->rcp = (uint32_t)(((1ull << (sh + 31)) + freq - 1) / freq);
        e->shift = (uint8_t)(sh - 1);
        e->bias = start;
    }
}

/* Branch-free renormalisation (whether a state emits is data, a branch on
 * it mispredicts): the low word is always stored below *out, which moves
 * only when it is kept; so *out - 1 must be writable. */
static inline void rans_put(uint32_t *x, uint16_t **out, const rans_esym *e)
{
    uint32_t v = *x, big = v >= e->x_max;
    (*out)[-1] = (uint16_t)v;
    *out -= big;
    v = big ? v >> 16 : v;
    uint32_t q = (uint32_t)(((uint64_t)v * e->rcp) >> 32) >> e->shift;
    *x = v + e->bias + q * e->cmpl;
}

/* A decoder over one rANS stream of nstates interleaved states: symbol i
 * of the stream uses state i mod nstates (codec 2: one stream, 2 states;
 * codec 3: a gap stream and a delta stream, RANS3_NSTATE states each). */
#define RANS3_NSTATE 32
typedef struct rans_dec {
    const uint8_t *p, *end;
    uint32_t x[RANS3_NSTATE];
    unsigned i, mask; /* the next symbol's state; nstates - 1 */
    int overrun;
} rans_dec;

/* Opens the stream at *p: u32 len (4 * nstates + the words' bytes), the
 * initial states, then 16-bit words; *p moves past it. */
int ferry__codec_rans_dec_open(rans_dec *d, const uint8_t **p, const uint8_t *end, unsigned nstates);
/* True when the stream ended exactly: every state back at RANS_L, every
 * word read. */
bool ferry__codec_rans_dec_done(const rans_dec *d);

static inline uint16_t rans_read16(rans_dec *d)
{
    if (d->end - d->p >= 2) {
        uint16_t v = (uint16_t)(d->p[0] | d->p[1] << 8);
        d->p += 2;
        return v;
    }
    d->overrun = 1;
    return 0;
}

/* One decoding step with the next state.  The renormalisation is
 * branch-free while two bytes remain (it reads them and keeps them only if
 * needed). */
static inline __attribute__((always_inline)) unsigned rans_dget(rans_dec *d, const uint8_t *lut, const uint32_t *fs)
{
    uint32_t x = d->x[d->i], slot = x & (RANS_M - 1);
    unsigned sym = lut[slot];
    uint32_t e = fs[sym];
    x = (e & 0xFFFF) * (x >> RANS_BITS) + slot - (e >> 16);
    if (FERRY_LIKELY(d->end - d->p >= 2)) {
        uint32_t need = x < RANS_L, w = (uint32_t)d->p[0] | (uint32_t)d->p[1] << 8;
        x = need ? x << 16 | w : x;
        d->p += 2 * need;
    } else if (x < RANS_L) {
        x = (x << 16) | rans_read16(d);
    }
    d->x[d->i] = x;
    d->i = (d->i + 1) & d->mask;
    return sym;
}

/* Encoder: codes symbols (table, symbol) pairs syms[2 lo .. 2 hi) as one
 * stream of nstates states (backwards, so that the decoder reads forwards)
 * and appends it to out in the layout ferry__codec_rans_dec_open reads. */
int ferry__codec_rans_emit(const uint8_t *syms, size_t lo, size_t hi, unsigned nstates, const rans_esym (*es)[RANS_MAXSYM],
              ferry_buf *out);

#if FERRY_HAVE_X86_SIMD
/* AVX-512: decodes symbols j = 0, 32, 64, ... of a codec-3 stream at its
 * start (symbol j with the fused table tab[j] of lut32) in groups of 32
 * while 64 bytes of words remain; returns how many it decoded.  The caller
 * decodes the rest with rans_dget. */
size_t ferry__codec_rans32_syms_avx512(rans_dec *d, const uint32_t *lut32, const uint8_t *tab, uint8_t *sym, size_t n);
/* The same with AVX2 (CPUs without AVX-512). */
size_t ferry__codec_rans32_syms_avx2(rans_dec *d, const uint32_t *lut32, const uint8_t *tab, uint8_t *sym, size_t n);
/* AVX-512: rans_put for symbols [lo, hi) of a 32-state stream, hi - lo a
 * multiple of 32 and lo at state 0, backwards from states x[] and output
 * position p; returns the new p.  The same words and states as the scalar
 * loop. */
uint16_t *ferry__codec_rans32_emit_avx512(const uint8_t *syms, size_t lo, size_t hi, const rans_esym (*es)[RANS_MAXSYM], uint16_t *p,
                             uint32_t *x);

/* AVX-512 versions of the loops after symbol decoding (any rANS codec),
 * for whole groups of 16 symbols: each returns how many symbols it
 * finished (the caller finishes the rest with the portable loop, which
 * gives the same result), or sets *bad where the portable loop would fail
 * with the error named below.  Raw bits are read from raw[0..rawlen) from
 * bit *bp, which advances.
 *
 * Gaps of one class (n: chunk words, at most 2^27): ranks into order[],
 * *r the last rank (UINT64_MAX before the class's first); bad: "gap past
 * the end of the chunk". */
size_t ferry__codec_rans_gaps_avx512(const uint8_t *sym, size_t cnt, uint64_t n, const uint8_t *raw, size_t rawlen, uint64_t *bp,
                        uint64_t *r, uint32_t *order, int *bad);
/* The same with AVX2, 8 at a time. */
size_t ferry__codec_rans_gaps_avx2(const uint8_t *sym, size_t cnt, uint64_t n, const uint8_t *raw, size_t rawlen, uint64_t *bp,
                      uint64_t *r, uint32_t *order, int *bad);
/* Delta tables of k changes of a 16-bit float dtype (exp_shift, exp_mask)
 * whose base words are word[] (the walk's sp_scratch.word): 8 +
 * each one's delta class into tab[]; bad: a class whose bit in `have` is
 * clear ("delta context without a table"). */
size_t ferry__codec_rans_dtabs16_avx512(unsigned exp_shift, uint32_t exp_mask, uint32_t top, const uint32_t *word, size_t k,
                           uint32_t have, uint8_t *tab, int *bad);
/* Encoder: the delta symbols of k changes of a 16-bit float dtype from the
 * AVX-512 scan's old | new << 16 pairs; (table, symbol) pairs into syms[],
 * the sign and raw bits of changes 4q..4q+3 as one field of qbits[q] bits
 * into quads[q]; returns how many it did. */
size_t ferry__codec_rans_delta_syms16_avx512(const uint32_t *pairs, size_t k, uint32_t top, unsigned exp_shift, uint32_t exp_mask,
                                uint8_t *syms, uint64_t *quads, uint8_t *qbits);
/* The new words of those k changes into val[]; bad: "delta out of range". */
size_t ferry__codec_rans_deltas16_avx512(const uint32_t *word, const uint8_t *sym, size_t k,
                            const uint8_t *raw, size_t rawlen, uint64_t *bp, uint64_t *val, int *bad);
/* The same two with AVX2, 8 at a time. */
size_t ferry__codec_rans_dtabs16_avx2(unsigned exp_shift, uint32_t exp_mask, uint32_t top, const uint32_t *word, size_t k,
                         uint32_t have, uint8_t *tab, int *bad);
size_t ferry__codec_rans_deltas16_avx2(const uint32_t *word, const uint8_t *sym, size_t k, const uint8_t *raw, size_t rawlen,
                          uint64_t *bp, uint64_t *val, int *bad);
#endif
#endif
