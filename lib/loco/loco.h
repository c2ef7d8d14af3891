/* Internal helpers of lib/loco shared by the gate, the payload codec and
 * the MPI exchange.  Not part of the public API. */
#ifndef FERRY_LOCO_INTERNAL_H
#define FERRY_LOCO_INTERNAL_H

/* Only exchange.c (compiled with mpicc) sees the MPI part of the public
 * header; the gate, codec and outer step build with any C compiler. */
#if !defined(FERRY_LOCO_MPI_SOURCE) && !defined(FERRY_LOCO_NO_MPI)
#define FERRY_LOCO_NO_MPI
#endif
#include "common.h"
#include "ferry_loco.h"

#define FERRY_LOCO_MAGIC "FLOC"
#define FERRY_LOCO_FORMAT 1
#define FERRY_LOCO_KIND_SPARSE 1
/* A LEB128 varint of a 64-bit gap takes at most 10 bytes; with the 4 value
 * bytes that bounds an entry's raw size, hence raw_len <= 14·count. */
#define FERRY_LOCO_VARINT_MAX 10
#define FERRY_LOCO_ENTRY_MAX (FERRY_LOCO_VARINT_MAX + 4)

/* Makes room for cap entries (contents kept up to s->count). */
int ferry__loco_sparse_reserve(ferry_loco_sparse *s, uint64_t cap);

/* Header field offsets (ferry_loco.h, "PAYLOAD FORMAT"). */
enum {
    LOCO_OFF_MAGIC = 0, LOCO_OFF_VERSION = 4, LOCO_OFF_KIND = 5, LOCO_OFF_RES16 = 6,
    LOCO_OFF_ROUND = 8, LOCO_OFF_RANK = 16, LOCO_OFF_RES32 = 20, LOCO_OFF_N = 24,
    LOCO_OFF_COUNT = 32, LOCO_OFF_RAW = 40, LOCO_OFF_BODY = 48, LOCO_OFF_SUM = 56
};

/* XXH3-64 of the header's first 56 bytes followed by the stored body. */
uint64_t ferry__loco_checksum(const uint8_t *hdr, const uint8_t *body, size_t body_len);

#endif
