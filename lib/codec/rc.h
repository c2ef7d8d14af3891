/* Binary adaptive range coder (the carry-less-with-cache scheme of LZMA),
 * used by the sparse tensor codec.  Probabilities are 12-bit estimates of
 * P(bit == 0), adapted after each bit with a shift of RC_SHIFT.
 *
 * Decoder safety: reading past the end of the input yields zero bytes and
 * sets `overrun`; callers treat overrun as a corrupt stream.  Every decoded
 * value is range-checked by the caller, so garbage input only ever produces
 * an error. */
#ifndef FERRY_RC_H
#define FERRY_RC_H
#include "common.h"

#define RC_BITS 12
#define RC_ONE (1u << RC_BITS)
#ifndef RC_SHIFT
#define RC_SHIFT 4
#endif
#define RC_TOP (1u << 24)
#define RC_INIT (RC_ONE / 2)

typedef uint16_t rc_prob;

typedef struct rc_enc {
    uint64_t low;
    uint32_t range;
    uint8_t cache;
    uint64_t cache_size;
    ferry_buf *out;
    int err;
} rc_enc;

static inline void rc_enc_init(rc_enc *e, ferry_buf *out)
{
    e->low = 0;
    e->range = 0xFFFFFFFFu;
    e->cache = 0;
    e->cache_size = 1;
    e->out = out;
    e->err = 0;
}

static inline void rc_put_byte(rc_enc *e, uint8_t b)
{
    if (FERRY_UNLIKELY(e->out->size == e->out->cap) && ferry__buf_reserve(e->out, 1)) {
        e->err = FERRY_ERR_NOMEM;
        return;
    }
    e->out->data[e->out->size++] = b;
}

static inline void rc_shift_low(rc_enc *e)
{
    if ((uint32_t)e->low < 0xFF000000u || (e->low >> 32) != 0) {
        uint8_t carry = (uint8_t)(e->low >> 32);
        uint8_t t = e->cache;
        do {
            rc_put_byte(e, (uint8_t)(t + carry));
            t = 0xFF;
        } while (--e->cache_size != 0);
        e->cache = (uint8_t)(e->low >> 24);
    }
    e->cache_size++;
    e->low = (e->low & 0x00FFFFFFu) << 8;
}

static inline void rc_encode(rc_enc *e, rc_prob *p, unsigned bit)
{
    uint32_t bound = (e->range >> RC_BITS) * *p;
    if (!bit) {
        e->range = bound;
        *p = (rc_prob)(*p + ((RC_ONE - *p) >> RC_SHIFT));
    } else {
        e->low += bound;
        e->range -= bound;
        *p = (rc_prob)(*p - (*p >> RC_SHIFT));
    }
    while (e->range < RC_TOP) {
        e->range <<= 8;
        rc_shift_low(e);
    }
}

/* Equiprobable bits, most significant first (n <= 32). */
static inline void rc_encode_direct(rc_enc *e, uint32_t v, unsigned n)
{
    while (n--) {
        e->range >>= 1;
        if ((v >> n) & 1) e->low += e->range;
        while (e->range < RC_TOP) {
            e->range <<= 8;
            rc_shift_low(e);
        }
    }
}

static inline int rc_enc_finish(rc_enc *e)
{
    for (int i = 0; i < 5; i++) rc_shift_low(e);
    return e->err;
}

typedef struct rc_dec {
    const uint8_t *p, *end;
    uint32_t range, code;
    int overrun;
} rc_dec;

static inline uint8_t rc_next(rc_dec *d)
{
    if (FERRY_LIKELY(d->p < d->end)) return *d->p++;
    d->overrun = 1;
    return 0;
}

static inline void rc_dec_init(rc_dec *d, const uint8_t *p, size_t n)
{
    d->p = p;
    d->end = p + n;
    d->range = 0xFFFFFFFFu;
    d->code = 0;
    d->overrun = 0;
    for (int i = 0; i < 5; i++) d->code = (d->code << 8) | rc_next(d);
}

static inline unsigned rc_decode(rc_dec *d, rc_prob *p)
{
    uint32_t bound = (d->range >> RC_BITS) * *p;
    unsigned bit;
    if (d->code < bound) {
        d->range = bound;
        *p = (rc_prob)(*p + ((RC_ONE - *p) >> RC_SHIFT));
        bit = 0;
    } else {
        d->code -= bound;
        d->range -= bound;
        *p = (rc_prob)(*p - (*p >> RC_SHIFT));
        bit = 1;
    }
    while (d->range < RC_TOP) {
        d->range <<= 8;
        d->code = (d->code << 8) | rc_next(d);
    }
    return bit;
}

static inline uint32_t rc_decode_direct(rc_dec *d, unsigned n)
{
    uint32_t v = 0;
    while (n--) {
        d->range >>= 1;
        uint32_t b = d->code >= d->range;
        if (b) d->code -= d->range;
        v = (v << 1) | b;
        while (d->range < RC_TOP) {
            d->range <<= 8;
            d->code = (d->code << 8) | rc_next(d);
        }
    }
    return v;
}

static inline void rc_probs_init(rc_prob *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = RC_INIT;
}
#endif
