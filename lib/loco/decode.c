/* Payload decoder.  Every field is hostile until checked: lengths are
 * bounded by the caller's n before anything is allocated, the checksum is
 * verified before zstd sees the body, and the decoded streams must account
 * for every byte (format in ferry_loco.h). */
#include <math.h>
#include <stdlib.h>
#include <zstd.h>

#include "loco.h"

static int parse_header(const uint8_t *p, size_t size, ferry_loco_header *hdr)
{
    if (size < FERRY_LOCO_HEADER_SIZE)
        return ferry__fail(FERRY_ERR_LOCO_TRUNCATED, "loco payload: %zu bytes, header needs %d", size,
                           FERRY_LOCO_HEADER_SIZE);
    if (memcmp(p + LOCO_OFF_MAGIC, FERRY_LOCO_MAGIC, 4))
        return ferry__fail(FERRY_ERR_LOCO_MAGIC, "loco payload: bad magic %02x%02x%02x%02x", p[0],
                           p[1], p[2], p[3]);
    if (p[LOCO_OFF_VERSION] != FERRY_LOCO_FORMAT ||
        (p[LOCO_OFF_KIND] != FERRY_LOCO_KIND_SPARSE && p[LOCO_OFF_KIND] != FERRY_LOCO_KIND_CELL))
        return ferry__fail(FERRY_ERR_LOCO_VERSION, "loco payload: format %u kind %u (this build reads %d, kinds %d and %d)",
                           p[LOCO_OFF_VERSION], p[LOCO_OFF_KIND], FERRY_LOCO_FORMAT,
                           FERRY_LOCO_KIND_SPARSE, FERRY_LOCO_KIND_CELL);
    if (ferry__le16(p + LOCO_OFF_RES16) || ferry__le32(p + LOCO_OFF_RES32))
        return ferry__fail(FERRY_ERR_LOCO_CORRUPT, "loco payload: reserved header field not 0");
    hdr->round = ferry__le64(p + LOCO_OFF_ROUND);
    hdr->rank = ferry__le32(p + LOCO_OFF_RANK);
    hdr->n = ferry__le64(p + LOCO_OFF_N);
    hdr->count = ferry__le64(p + LOCO_OFF_COUNT);
    hdr->values = p[LOCO_OFF_KIND] == FERRY_LOCO_KIND_CELL ? FERRY_LOCO_VALUES_CELL : FERRY_LOCO_VALUES_FP32;
    return FERRY_OK;
}

int ferry_loco_peek(const void *payload, size_t size, ferry_loco_header *hdr)
{
    if (!hdr || (size && !payload)) return ferry__fail(FERRY_ERR_ARG, "loco peek: NULL argument");
    return parse_header(payload, size, hdr);
}

/* Reads one minimal LEB128 varint of at most 64 bits from [*p, end);
 * what names the stream ("gap", "value") in messages. */
static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v, uint64_t k, const char *what)
{
    uint64_t x = 0;
    for (unsigned shift = 0;; shift += 7) {
        if (*p == end)
            return ferry__fail(FERRY_ERR_LOCO_CORRUPT, "loco payload: %s %llu runs past its stream", what,
                               (unsigned long long)k);
        uint8_t b = *(*p)++;
        /* the 10th byte may only carry the 64th bit */
        if (shift == 63 && b > 1)
            return ferry__fail(FERRY_ERR_LOCO_CORRUPT, "loco payload: %s %llu overflows 64 bits", what,
                               (unsigned long long)k);
        x |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            /* a final 0 byte after others is a non-minimal encoding: one
             * value, one spelling, so a payload's bytes are canonical */
            if (b == 0 && shift)
                return ferry__fail(FERRY_ERR_LOCO_CORRUPT, "loco payload: %s %llu is not minimally encoded",
                                   what, (unsigned long long)k);
            *v = x;
            return FERRY_OK;
        }
    }
}

/* Kind 2's values: zigzag varints k, value k·c_i against base. */
static int decode_cells(const uint8_t *p, const uint8_t *end, const float *base, uint64_t count,
                        ferry_loco_sparse *out)
{
    for (uint64_t k = 0; k < count; k++) {
        uint64_t z = 0;
        int rc = get_varint(&p, end, &z, k, "value");
        if (rc) return rc;
        /* z = 0 is k = 0, never sent; the bound keeps k·c_i exact */
        if (z == 0 || z > 2 * (uint64_t)FERRY_LOCO_CELL_KMAX)
            return ferry__fail(FERRY_ERR_LOCO_CORRUPT, "loco payload: entry %llu (index %llu): cell multiple code %llu out of range",
                               (unsigned long long)k, (unsigned long long)out->idx[k], (unsigned long long)z);
        int64_t c = (z & 1) ? -(int64_t)((z + 1) >> 1) : (int64_t)(z >> 1);
        float f = ferry__loco_cell_value(c, base[out->idx[k]]);
        if (!isfinite(f))
            return ferry__fail(FERRY_ERR_LOCO_VALUE, "loco payload: entry %llu (index %llu): %lld cells of global weight %g overflow",
                               (unsigned long long)k, (unsigned long long)out->idx[k], (long long)c,
                               (double)base[out->idx[k]]);
        out->val[k] = f;
    }
    if (p != end)
        return ferry__fail(FERRY_ERR_LOCO_CORRUPT, "loco payload: %zu bytes left in the value stream",
                           (size_t)(end - p));
    return FERRY_OK;
}

/* The gaps, then the values: FP32 byte planes (base NULL) or cells. */
static int decode_body(const uint8_t *raw, size_t raw_len, uint64_t n, uint64_t count,
                       const float *base, ferry_loco_sparse *out)
{
    /* FP32: the gaps are what the 4·count value bytes leave (caller checked
     * raw_len >= 5·count); cells: the gap stream ends where count varints
     * do, and the values take the rest */
    const uint8_t *p = raw, *end = base ? raw + raw_len : raw + (raw_len - (size_t)count * 4);
    uint64_t next = 0; /* smallest index the next entry may take */
    for (uint64_t k = 0; k < count; k++) {
        uint64_t gap = 0;
        int rc = get_varint(&p, end, &gap, k, "gap");
        if (rc) return rc;
        uint64_t idx;
        if (!ferry__add_u64(next, gap, &idx) || idx >= n)
            return ferry__fail(FERRY_ERR_LOCO_INDEX, "loco payload: entry %llu: index past n = %llu",
                               (unsigned long long)k, (unsigned long long)n);
        out->idx[k] = idx;
        next = idx + 1;
    }
    if (base) return decode_cells(p, raw + raw_len, base, count, out);
    if (p != end)
        return ferry__fail(FERRY_ERR_LOCO_CORRUPT, "loco payload: %zu bytes left in the gap stream",
                           (size_t)(end - p));
    const uint8_t *planes = end;
    for (uint64_t k = 0; k < count; k++) {
        uint32_t u = 0;
        for (int b = 0; b < 4; b++) u |= (uint32_t)planes[(uint64_t)b * count + k] << (8 * (3 - b));
        float f;
        memcpy(&f, &u, 4);
        if (!isfinite(f))
            return ferry__fail(FERRY_ERR_LOCO_VALUE, "loco payload: entry %llu (index %llu): value bits %08x not finite",
                               (unsigned long long)k, (unsigned long long)out->idx[k], u);
        out->val[k] = f;
    }
    return FERRY_OK;
}

static int decode(const uint8_t *p, size_t size, uint64_t n, const float *base,
                  ferry_loco_header *hdr, ferry_loco_sparse *out)
{
    int rc = parse_header(p, size, hdr);
    if (rc) return rc;
    int cells = hdr->values == FERRY_LOCO_VALUES_CELL;
    if (cells && !base)
        return ferry__fail(FERRY_ERR_ARG, "loco payload: cell-coded values, no global weights to decode them against");
    if (hdr->n != n)
        return ferry__fail(FERRY_ERR_LOCO_SIZE, "loco payload: for %llu weights, this model has %llu",
                           (unsigned long long)hdr->n, (unsigned long long)n);
    if (hdr->count > n)
        return ferry__fail(FERRY_ERR_LOCO_COUNT, "loco payload: %llu entries for %llu weights",
                           (unsigned long long)hdr->count, (unsigned long long)n);
    uint64_t count = hdr->count;
    uint64_t raw_len = ferry__le64(p + LOCO_OFF_RAW), body_len = ferry__le64(p + LOCO_OFF_BODY);
    /* count <= n <= 2^40, so these products do not overflow. */
    if (count == 0 ? (raw_len || body_len)
                   : (raw_len < count * (cells ? 2 : 5) || raw_len > count * FERRY_LOCO_ENTRY_MAX || !body_len))
        return ferry__fail(FERRY_ERR_LOCO_CORRUPT, "loco payload: raw length %llu, body %llu for %llu entries",
                           (unsigned long long)raw_len, (unsigned long long)body_len,
                           (unsigned long long)count);
    size_t avail = size - FERRY_LOCO_HEADER_SIZE;
    if (body_len > avail)
        return ferry__fail(FERRY_ERR_LOCO_TRUNCATED, "loco payload: body of %llu bytes, %zu present",
                           (unsigned long long)body_len, avail);
    if (body_len < avail)
        return ferry__fail(FERRY_ERR_LOCO_TRAILING, "loco payload: %zu bytes after the body",
                           avail - (size_t)body_len);
    const uint8_t *body = p + FERRY_LOCO_HEADER_SIZE;
    uint64_t want = ferry__le64(p + LOCO_OFF_SUM), got = ferry__loco_checksum(p, body, (size_t)body_len);
    if (want != got)
        return ferry__fail(FERRY_ERR_LOCO_CHECKSUM, "loco payload: checksum %016llx, header says %016llx",
                           (unsigned long long)got, (unsigned long long)want);
    if (!count) return FERRY_OK;

    /* The frame must hold exactly raw_len bytes and be exactly body_len long. */
    unsigned long long fcs = ZSTD_getFrameContentSize(body, (size_t)body_len);
    size_t fsz = ZSTD_findFrameCompressedSize(body, (size_t)body_len);
    if (fcs != raw_len || ZSTD_isError(fsz) || fsz != body_len)
        return ferry__fail(FERRY_ERR_LOCO_CORRUPT, "loco payload: zstd frame does not hold the declared %llu bytes",
                           (unsigned long long)raw_len);
    if ((rc = ferry__loco_sparse_reserve(out, count))) return rc;
    uint8_t *raw = ferry__malloc((size_t)raw_len);
    if (!raw) return FERRY_ERR_NOMEM;
    size_t dn = ZSTD_decompress(raw, (size_t)raw_len, body, (size_t)body_len);
    if (ZSTD_isError(dn) || dn != raw_len) {
        free(raw);
        return ferry__fail(FERRY_ERR_LOCO_CORRUPT, "loco payload: zstd: %s",
                           ZSTD_isError(dn) ? ZSTD_getErrorName(dn) : "short frame");
    }
    rc = decode_body(raw, (size_t)raw_len, n, count, cells ? base : NULL, out);
    free(raw);
    return rc;
}

int ferry_loco_decode(const void *payload, size_t size, uint64_t n, ferry_loco_header *hdr,
                      ferry_loco_sparse *out)
{
    return ferry_loco_decode_with(payload, size, n, NULL, hdr, out);
}

int ferry_loco_decode_with(const void *payload, size_t size, uint64_t n, const float *base,
                           ferry_loco_header *hdr, ferry_loco_sparse *out)
{
    if (!hdr || !out || (size && !payload)) return ferry__fail(FERRY_ERR_ARG, "loco decode: NULL argument");
    out->count = 0;
    if (n > FERRY_LOCO_MAX_N)
        return ferry__fail(FERRY_ERR_LIMIT, "loco decode: n %llu > %llu", (unsigned long long)n,
                           (unsigned long long)FERRY_LOCO_MAX_N);
    int rc = decode(payload, size, n, base, hdr, out);
    if (!rc) out->count = hdr->count;
    return rc;
}
