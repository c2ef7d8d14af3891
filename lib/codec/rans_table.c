/* rANS frequency tables: normalisation, serialisation, parsing. */
#include "rans.h"

int ferry__codec_rans_table_build(rans_table *t, const uint32_t *count, unsigned nsym)
{
    uint64_t total = 0;
    unsigned last = 0;
    for (unsigned s = 0; s < nsym; s++) {
        total += count[s];
        if (count[s]) last = s + 1;
    }
    memset(t, 0, sizeof *t);
    t->nsym = (uint8_t)last;
    if (!total) return FERRY_OK;
    int32_t sum = 0;
    unsigned big = 0;
    for (unsigned s = 0; s < last; s++) {
        if (!count[s]) continue;
        uint64_t f = (uint64_t)count[s] * RANS_M / total;
        t->freq[s] = (uint16_t)(f ? f : 1);
        sum += t->freq[s];
        if (t->freq[s] > t->freq[big]) big = s;
    }
    /* Give the rounding remainder to the most frequent symbol; when rounding
     * up small counts overshot, take it back from the largest ones. */
    if (sum <= (int32_t)RANS_M) t->freq[big] = (uint16_t)(t->freq[big] + (RANS_M - (uint32_t)sum));
    else
        while (sum > (int32_t)RANS_M) {
            unsigned m = 0;
            for (unsigned s = 0; s < last; s++)
                if (t->freq[s] > t->freq[m]) m = s;
            t->freq[m]--;
            sum--;
        }
    uint32_t c = 0;
    for (unsigned s = 0; s < last; s++) {
        t->start[s] = (uint16_t)c;
        c += t->freq[s];
    }
    return FERRY_OK;
}

/* u8 nsym, then nsym frequencies as LEB128 (1 or 2 bytes each). */
int ferry__codec_rans_table_write(const rans_table *t, ferry_buf *out)
{
    uint8_t tmp[1 + 2 * RANS_MAXSYM];
    size_t n = 0;
    tmp[n++] = t->nsym;
    for (unsigned s = 0; s < t->nsym; s++) {
        uint16_t f = t->freq[s];
        if (f < 0x80) tmp[n++] = (uint8_t)f;
        else {
            tmp[n++] = (uint8_t)(0x80 | (f & 0x7F));
            tmp[n++] = (uint8_t)(f >> 7);
        }
    }
    return ferry__buf_append(out, tmp, n);
}

int ferry__codec_rans_table_read(rans_table *t, const uint8_t **pp, const uint8_t *end, unsigned max_nsym)
{
    const uint8_t *p = *pp;
    memset(t, 0, sizeof *t);
    if (p >= end) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "sparse chunk: truncated frequency table");
    t->nsym = *p++;
    if (t->nsym == 0 || t->nsym > max_nsym) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "sparse chunk: table of %u symbols", t->nsym);
    uint32_t c = 0;
    for (unsigned s = 0; s < t->nsym; s++) {
        if (p >= end) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "sparse chunk: truncated frequency table");
        uint32_t f = *p++;
        if (f & 0x80) {
            if (p >= end) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "sparse chunk: truncated frequency table");
            f = (f & 0x7F) | (uint32_t)*p++ << 7;
        }
        if (f > RANS_M) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "sparse chunk: frequency %u too large", f);
        t->freq[s] = (uint16_t)f;
        t->start[s] = (uint16_t)(c > 0xFFFF ? 0 : c);
        c += f;
        if (c > RANS_M) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "sparse chunk: frequencies exceed %u", RANS_M);
    }
    if (c != RANS_M) return ferry__fail(FERRY_ERR_PATCH_CORRUPT, "sparse chunk: frequencies sum to %u, not %u", c, RANS_M);
    *pp = p;
    return FERRY_OK;
}

void ferry__codec_rans_table_dtab(const rans_table *t, uint8_t *lut, uint32_t *fs)
{
    for (unsigned s = 0; s < t->nsym; s++) {
        memset(lut + t->start[s], (int)s, t->freq[s]);
        fs[s] = t->freq[s] | (uint32_t)t->start[s] << 16;
    }
}

void ferry__codec_rans32_fused_table(const rans_table *t, uint32_t *out)
{
    for (unsigned s = 0; s < t->nsym; s++)
        for (uint32_t j = 0; j < t->freq[s]; j++) out[t->start[s] + j] = s | (uint32_t)(t->freq[s] - 1) << 8 | j << 20;
}
