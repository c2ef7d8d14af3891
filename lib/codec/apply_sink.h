/* Where an apply writes its result: ferry_apply_ex gives every tensor a
 * new buffer; ferry_apply_file (lib/io) streams it into a file.  The codec
 * verifies the same way for both, and the caller keeps the result only when
 * ferry__apply_to returns FERRY_OK. */
#ifndef FERRY_APPLY_SINK_H
#define FERRY_APPLY_SINK_H
#include "model.h"

typedef struct ferry__sink {
    void *ctx;
    /* Called once, before any piece, with the target's layout (tensors in
     * name order with nbytes but no data, and the metadata). */
    int (*begin)(void *ctx, const ferry_model *layout, int threads);
    /* A buffer for bytes [off, off + len) of result tensor i (len <= 4 MiB),
     * filled by worker w, which calls done when the bytes are in place.
     * Pieces of one tensor may be filled by several workers at once. */
    uint8_t *(*piece)(void *ctx, size_t i, uint64_t off, size_t len, int w);
    int (*done)(void *ctx, size_t i, uint64_t off, size_t len, int w);
} ferry__sink;

/* ferry_apply_ex's work, with the result going to sk.  On failure the sink
 * may hold part of a result, which the caller must discard. */
int ferry__apply_to(const ferry_model *base, const void *patch, size_t size, const ferry_apply_options *opts,
                    const ferry__sink *sk);
#endif
