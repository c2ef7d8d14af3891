/* FP8 block quantization of part of a tensor (lib/common/fp8.c): the
 * slab of rows a sharded trainer rank owns (lib/shard) is quantized with
 * the same code as a whole tensor (include/ferry_quant.h). */
#ifndef FERRY_COMMON_QUANT_H
#define FERRY_COMMON_QUANT_H

#include "ferry.h"

/* Codes and block scales of a row-major slab of `rows` x `cols` BF16 words
 * (or FP32 values taken as their BF16 cast: dtype F32) whose first row is
 * row `row0` of tensor `name` (named, with the absolute row, in errors).
 * row0 must be a multiple of 128, so that the slab's 128 x 128 blocks are
 * the tensor's.  codes: rows x cols E4M3FN; scale: ceil(rows/128) x
 * ceil(cols/128); prev: those blocks' previous scales (sticky) or NULL;
 * *kept counts the blocks that kept theirs.  FERRY_ERR_ARG for a
 * non-finite weight, FERRY_ERR_NOMEM. */
int ferry__quantize_rows(const char *name, ferry_dtype dtype, const void *data, uint64_t row0, uint64_t rows, uint64_t cols,
                         const float *prev, uint8_t *codes, float *scale, uint64_t *kept);

#endif
