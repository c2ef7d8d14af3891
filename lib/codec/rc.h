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

#define RC_BITS 16
#define RC_ONE (1u << RC_BITS)
#define RC_LIMIT 255
#define RC_TOP (1u << 24)
#define RC_INIT (RC_ONE / 2)

/* P(0) in 1/65536 units and the number of bits seen (saturating): the
 * estimate moves by 1/(n+2) of the distance at first (close to a frequency
 * count, which is what a stationary source wants) and by 1/(RC_LIMIT+2)
 * once n saturates (so it still tracks drift). */
typedef struct rc_prob { uint16_t p; uint16_t n; } rc_prob;

/* 65536 / (n + 2) for n = 0..RC_LIMIT. */
static const uint16_t rc_recip[RC_LIMIT + 1] = {
    32768, 21845, 16384, 13107, 10922, 9362, 8192, 7281, 6553, 5957, 5461, 5041, 4681, 4369, 4096, 3855,
    3640, 3449, 3276, 3120, 2978, 2849, 2730, 2621, 2520, 2427, 2340, 2259, 2184, 2114, 2048, 1985,
    1927, 1872, 1820, 1771, 1724, 1680, 1638, 1598, 1560, 1524, 1489, 1456, 1424, 1394, 1365, 1337,
    1310, 1285, 1260, 1236, 1213, 1191, 1170, 1149, 1129, 1110, 1092, 1074, 1057, 1040, 1024, 1008,
    992, 978, 963, 949, 936, 923, 910, 897, 885, 873, 862, 851, 840, 829, 819, 809,
    799, 789, 780, 771, 762, 753, 744, 736, 728, 720, 712, 704, 697, 689, 682, 675,
    668, 661, 655, 648, 642, 636, 630, 624, 618, 612, 606, 601, 595, 590, 585, 579,
    574, 569, 564, 560, 555, 550, 546, 541, 537, 532, 528, 524, 520, 516, 512, 508,
    504, 500, 496, 492, 489, 485, 481, 478, 474, 471, 468, 464, 461, 458, 455, 451,
    448, 445, 442, 439, 436, 434, 431, 428, 425, 422, 420, 417, 414, 412, 409, 407,
    404, 402, 399, 397, 394, 392, 390, 387, 385, 383, 381, 378, 376, 374, 372, 370,
    368, 366, 364, 362, 360, 358, 356, 354, 352, 350, 348, 346, 344, 343, 341, 339,
    337, 336, 334, 332, 330, 329, 327, 326, 324, 322, 321, 319, 318, 316, 315, 313,
    312, 310, 309, 307, 306, 304, 303, 302, 300, 299, 297, 296, 295, 293, 292, 291,
    289, 288, 287, 286, 284, 283, 282, 281, 280, 278, 277, 276, 275, 274, 273, 271,
    270, 269, 268, 267, 266, 265, 264, 263, 262, 261, 260, 259, 258, 257, 256, 255,};

static inline void rc_update(rc_prob *pr, unsigned bit)
{
    int32_t target = bit ? 0 : (int32_t)RC_ONE;
    int32_t p = pr->p + (int32_t)(((int64_t)(target - pr->p) * rc_recip[pr->n]) >> 16);
    if (p < 32) p = 32;
    if (p > (int32_t)RC_ONE - 32) p = (int32_t)RC_ONE - 32;
    pr->p = (uint16_t)p;
    if (pr->n < RC_LIMIT) pr->n++;
}

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
    uint32_t bound = (e->range >> RC_BITS) * p->p;
    if (!bit) {
        e->range = bound;
    } else {
        e->low += bound;
        e->range -= bound;
    }
    rc_update(p, bit);
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

/* Renormalisation after a decoded bit: the range is then at least 2^13
 * (bound >= (2^24 >> 16) * 32, range - bound >= range * 32 / 65536), so
 * two bytes at most bring it back to 2^24 or more. */
static inline void rc_dec_norm(rc_dec *d)
{
    if (d->range < RC_TOP) {
        d->range <<= 8;
        d->code = (d->code << 8) | rc_next(d);
        if (d->range < RC_TOP) {
            d->range <<= 8;
            d->code = (d->code << 8) | rc_next(d);
        }
    }
}

/* One bit with P(0) = p16 / 65536, without a data-dependent branch (the
 * adaptive models' bits are close to even as often as not). */
static inline unsigned rc_decode_p(rc_dec *d, uint32_t p16)
{
    uint32_t bound = (d->range >> RC_BITS) * p16;
    unsigned bit = d->code >= bound;
    uint32_t m = 0u - (uint32_t)bit;
    d->code -= bound & m;
    d->range = bound + ((d->range - 2 * bound) & m); /* bit ? range - bound : bound */
    rc_dec_norm(d);
    return bit;
}

static inline unsigned rc_decode(rc_dec *d, rc_prob *p)
{
    unsigned bit = rc_decode_p(d, p->p);
    rc_update(p, bit);
    return bit;
}

static inline uint32_t rc_decode_direct(rc_dec *d, unsigned n)
{
    uint32_t v = 0;
    while (n--) {
        d->range >>= 1;
        uint32_t b = d->code >= d->range;
        d->code -= d->range & (0u - b);
        v = (v << 1) | b;
        if (d->range < RC_TOP) { /* the halved range is at least 2^23 */
            d->range <<= 8;
            d->code = (d->code << 8) | rc_next(d);
        }
    }
    return v;
}

static inline void rc_probs_init(rc_prob *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = (rc_prob){RC_INIT, 0};
}
#endif
