/* Payload encoder (format in ferry_loco.h, "PAYLOAD FORMAT"). */
#include <math.h>
#include <stdlib.h>
#include "xxh.h"
#include <zstd.h>

#include "loco.h"

uint64_t ferry__loco_checksum(const uint8_t *hdr, const uint8_t *body, size_t body_len)
{
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, hdr, LOCO_OFF_SUM);
    if (body_len) XXH3_64bits_update(&st, body, body_len);
    return XXH3_64bits_digest(&st);
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t k = 0;
    while (v >= 0x80) {
        p[k++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[k++] = (uint8_t)v;
    return k;
}

/* Checks the caller's entries: the decoder would reject anything else, and
 * a payload every peer refuses is worse than an error here. */
static int check_entries(const ferry_loco_header *hdr, const ferry_loco_sparse *sp, const float *base)
{
    if (hdr->n > FERRY_LOCO_MAX_N)
        return ferry__fail(FERRY_ERR_ARG, "loco encode: n %llu > %llu", (unsigned long long)hdr->n,
                           (unsigned long long)FERRY_LOCO_MAX_N);
    if (sp->count != hdr->count || sp->count > hdr->n)
        return ferry__fail(FERRY_ERR_ARG, "loco encode: count %llu (header %llu) for n %llu",
                           (unsigned long long)sp->count, (unsigned long long)hdr->count,
                           (unsigned long long)hdr->n);
    for (uint64_t k = 0; k < sp->count; k++) {
        if (sp->idx[k] >= hdr->n || (k && sp->idx[k] <= sp->idx[k - 1]))
            return ferry__fail(FERRY_ERR_ARG,
                               "loco encode: entry %llu: index %llu out of range or not ascending",
                               (unsigned long long)k, (unsigned long long)sp->idx[k]);
        if (!isfinite(sp->val[k]))
            return ferry__fail(FERRY_ERR_ARG, "loco encode: entry %llu (index %llu): value %g",
                               (unsigned long long)k, (unsigned long long)sp->idx[k],
                               (double)sp->val[k]);
        int64_t c;
        if (base && !ferry__loco_cell_of(sp->val[k], base[sp->idx[k]], &c))
            return ferry__fail(FERRY_ERR_ARG,
                               "loco encode: entry %llu (index %llu): value %a is not a cell multiple "
                               "of global weight %a",
                               (unsigned long long)k, (unsigned long long)sp->idx[k],
                               (double)sp->val[k], (double)base[sp->idx[k]]);
    }
    return FERRY_OK;
}

/* Kind 2's value stream: zigzag varints of the cell multiples. */
static size_t put_cells(uint8_t *p, const ferry_loco_sparse *sp, const float *base)
{
    size_t g = 0;
    for (uint64_t k = 0; k < sp->count; k++) {
        int64_t c = 0;
        ferry__loco_cell_of(sp->val[k], base[sp->idx[k]], &c); /* checked */
        g += put_varint(p + g, c < 0 ? ((uint64_t)(-c) << 1) - 1 : (uint64_t)c << 1);
    }
    return g;
}

int ferry_loco_encode(const ferry_loco_header *hdr, const ferry_loco_sparse *sp, int level,
                      void **out, size_t *size)
{
    return ferry_loco_encode_with(hdr, sp, NULL, level, out, size);
}

int ferry_loco_encode_with(const ferry_loco_header *hdr, const ferry_loco_sparse *sp, const float *base,
                           int level, void **out, size_t *size)
{
    if (!hdr || !sp || !out || !size || (sp->count && (!sp->idx || !sp->val)))
        return ferry__fail(FERRY_ERR_ARG, "loco encode: NULL argument");
    *out = NULL;
    *size = 0;
    if (level < 0 || level > 19)
        return ferry__fail(FERRY_ERR_ARG, "loco encode: zstd level %d not in 0..19", level);
    int cells = hdr->values == FERRY_LOCO_VALUES_CELL;
    if (!cells && hdr->values != FERRY_LOCO_VALUES_FP32)
        return ferry__fail(FERRY_ERR_ARG, "loco encode: value coding %d", hdr->values);
    if (cells && hdr->n && !base)
        return ferry__fail(FERRY_ERR_ARG, "loco encode: cell-coded values need the global weights");
    int rc = check_entries(hdr, sp, cells ? base : NULL);
    if (rc) return rc;
    uint64_t count = sp->count;
    /* count <= n <= 2^40 bounds raw to 14 TiB: no overflow in 64 bits. */
    size_t raw_cap = (size_t)count * FERRY_LOCO_ENTRY_MAX;
    uint8_t *raw = count ? ferry__malloc(raw_cap) : NULL;
    if (count && !raw) return FERRY_ERR_NOMEM;
    size_t g = 0;
    uint64_t prev = 0;
    for (uint64_t k = 0; k < count; k++) {
        /* gap from idx_{-1} = -1: idx_0 itself, then idx_k − idx_{k−1} − 1 */
        uint64_t gap = k ? sp->idx[k] - prev - 1 : sp->idx[0];
        g += put_varint(raw + g, gap);
        prev = sp->idx[k];
    }
    size_t raw_len;
    if (cells) {
        raw_len = g + put_cells(raw + g, sp, base);
    } else {
        /* Byte planes, most significant first: sign and exponent bytes of
         * similar-sized values repeat, and zstd sees them as runs. */
        uint8_t *planes = raw + g;
        for (uint64_t k = 0; k < count; k++) {
            uint32_t u;
            memcpy(&u, &sp->val[k], 4);
            for (int b = 0; b < 4; b++) planes[(uint64_t)b * count + k] = (uint8_t)(u >> (8 * (3 - b)));
        }
        raw_len = g + (size_t)count * 4;
    }

    size_t body_cap = count ? ZSTD_compressBound(raw_len) : 0;
    uint8_t *buf = ferry__malloc(FERRY_LOCO_HEADER_SIZE + body_cap);
    if (!buf) {
        free(raw);
        return FERRY_ERR_NOMEM;
    }
    size_t body_len = 0;
    if (count) {
        body_len = ZSTD_compress(buf + FERRY_LOCO_HEADER_SIZE, body_cap, raw, raw_len,
                                 level ? level : 1);
        free(raw);
        if (ZSTD_isError(body_len)) {
            free(buf);
            return ferry__fail(FERRY_ERR_NOMEM, "loco encode: zstd: %s", ZSTD_getErrorName(body_len));
        }
    }
    memset(buf, 0, FERRY_LOCO_HEADER_SIZE);
    memcpy(buf + LOCO_OFF_MAGIC, FERRY_LOCO_MAGIC, 4);
    buf[LOCO_OFF_VERSION] = FERRY_LOCO_FORMAT;
    buf[LOCO_OFF_KIND] = cells ? FERRY_LOCO_KIND_CELL : FERRY_LOCO_KIND_SPARSE;
    ferry__put64(buf + LOCO_OFF_ROUND, hdr->round);
    ferry__put32(buf + LOCO_OFF_RANK, hdr->rank);
    ferry__put64(buf + LOCO_OFF_N, hdr->n);
    ferry__put64(buf + LOCO_OFF_COUNT, count);
    ferry__put64(buf + LOCO_OFF_RAW, raw_len);
    ferry__put64(buf + LOCO_OFF_BODY, body_len);
    ferry__put64(buf + LOCO_OFF_SUM,
                 ferry__loco_checksum(buf, buf + FERRY_LOCO_HEADER_SIZE, body_len));
    *out = buf;
    *size = FERRY_LOCO_HEADER_SIZE + body_len;
    return FERRY_OK;
}
