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
#define FERRY_LOCO_KIND_SPARSE 1 /* FP32 values as byte planes */
#define FERRY_LOCO_KIND_CELL 2   /* values as zigzag varints of cell multiples */
/* A LEB128 varint of a 64-bit gap takes at most 10 bytes; with the 4 value
 * bytes that bounds an entry's raw size, hence raw_len <= 14·count. */
#define FERRY_LOCO_VARINT_MAX 10
#define FERRY_LOCO_ENTRY_MAX (FERRY_LOCO_VARINT_MAX + 4)

/* The cell code (cell.c; ferry_loco.h, "VALUE CODING").  A value k·2^x
 * with x = ferry__loco_cell_exp(base), 1 <= |k| <= KMAX. */
#define FERRY_LOCO_CELL_EMIN (-32)
#define FERRY_LOCO_CELL_KMAX ((1 << 24) - 1)
int ferry__loco_cell_exp(float base);
float ferry__loco_cell_value(int64_t k, float base);
/* nearest k (ties to even), clamped to ±KMAX; 0 for NaN */
int64_t ferry__loco_cell_quantize(float s, float base);
/* 1 and *k if v is k·unit with 1 <= |k| <= KMAX, else 0 */
int ferry__loco_cell_of(float v, float base, int64_t *k);

/* The gate behind ferry_loco_gate and ferry_loco_gate_update: the
 * increment is update[i] if update is not NULL, else global[i] − local[i]. */
int ferry__loco_gate(const float *global, const float *local, const float *update, float *residual,
                     uint64_t n, int values, ferry_loco_sparse *out);

/* Tests only (tests/mpi/test_loco_mpi.c): when set, sees and may damage
 * (or realloc) this rank's encoded payload before it is sent, so that the
 * receivers' refusal of bad payloads can be tested over real MPI. */
extern void (*ferry__loco_tamper)(unsigned char **payload, size_t *size);

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
