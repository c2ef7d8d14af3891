/* An in-place apply that keeps what it overwrote after it succeeded, so
 * that a caller applying several patches in a row (the sync layer's route:
 * compacted delta, then a chain) can put the model back to where it was
 * before the first one when a later one fails.  Sparse patches change few
 * words: the record is those words' old values (the same undo log
 * ferry_apply_inplace_ex keeps while it verifies), plus the old bytes of
 * every tensor the patch carries whole. */
#ifndef FERRY_CODEC_UNDO_H
#define FERRY_CODEC_UNDO_H
#include "model.h"

typedef struct ferry__codec_undo ferry__codec_undo;

/* ferry_apply_inplace_ex; on FERRY_OK, *record (when not NULL) receives the
 * record of every word and whole tensor it wrote.  Unlike
 * ferry_apply_inplace_ex with a small undo_limit it never defers writing a
 * chunk: each chunk's old words are kept (in the undo log, or in a buffer
 * of the chunk's own when the log is full).  On failure base is as it was
 * and *record is NULL. */
int ferry__codec_apply_inplace_undo(ferry_model *base, const void *patch, size_t size, const ferry_apply_options *opts,
                                    ferry__codec_undo **record);
/* ferry_apply_stream_begin / _end (lib/codec/stream.c) with the record of
 * ferry__codec_apply_inplace_undo: begun with keep, a successful end hands
 * it to *record (when record is not NULL; else it is dropped). */
int ferry__codec_apply_stream_begin(ferry_model *model, const ferry_apply_options *opts, const ferry_apply_stream_options *so,
                                    bool keep, ferry_apply_stream **out);
int ferry__codec_apply_stream_end(ferry_apply_stream *st, ferry__codec_undo **record);
/* Writes the old words and bytes back.  Records must be reverted newest
 * first, into the same buffers (the model must not have been reallocated). */
void ferry__codec_undo_revert(const ferry__codec_undo *u);
void ferry__codec_undo_free(ferry__codec_undo *u);
/* Visits the words a record overwrote (the sync layer's change lists):
 * fn(ctx, at, W, hi, lo, k) for each run of changed words of one chunk
 * sharing a window: the W-bit words at + (hi + lo[i]) * W / 8, i < k,
 * ascending; fn(ctx, at, 0, nbytes, NULL, 0) for each tensor carried
 * whole (nbytes bytes at `at`). */
typedef void (*ferry__codec_undo_fn)(void *ctx, const uint8_t *at, unsigned W, uint64_t hi, const uint16_t *lo, size_t k);
void ferry__codec_undo_visit(const ferry__codec_undo *u, ferry__codec_undo_fn fn, void *ctx);
#endif
