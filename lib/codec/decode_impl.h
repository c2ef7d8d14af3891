/* The decoder's state, shared by decode.c (ferry_apply, ferry_apply_inplace)
 * and stream.c (ferry_apply_stream_*: the same in-place apply, fed piece by
 * piece).  Internal to lib/codec. */
#ifndef FERRY_CODEC_DECODE_IMPL_H
#define FERRY_CODEC_DECODE_IMPL_H
#include "model.h"
#include "patch.h"
#include "sparse.h"
#include "undo.h"

typedef struct chunk_ref {
    size_t entry;
    uint64_t lo, n;          /* first word, words */
    uint64_t off, len;       /* bytes in the patch */
} chunk_ref;

/* In place, a chunk written during verification keeps what it overwrote,
 * so that a failure anywhere can put the base back exactly.  Positions are
 * kept as their low 16 bits, with the index of the first change of each
 * window of 2^16 words: 2 + W/8 bytes per change (4 for BF16), not 4 + W/8. */
#define UNDO_WIN_LOG2 16
typedef struct undo {
    uint32_t *first;         /* nwin + 1 entries; NULL: the chunk was not written (deferred) */
    uint16_t *lo;
    uint8_t *old;
    size_t k, nwin;
    void *own;               /* the chunk's own buffer when the log was full (keep mode) */
} undo;

typedef struct dec {
    const uint8_t *patch;
    patch_table t;
    const ferry_model *base;
    int threads;
    uint8_t (*bh)[16];       /* base tensor hashes */
    long *bi;                /* entry -> base tensor index, or -1 */
    uint8_t (*th)[16];       /* result tensor hashes, per entry */
    uint8_t (**blocks)[16];  /* result block digests, per SPARSE entry */
    bool vouched;            /* base hash given by the caller: bh unknown */
    uint8_t (**leaf)[16];    /* in place: the base's cached leaf digests, per SPARSE entry, or NULL */
    size_t *li;              /* entry -> index among the result's tensors */
    uint8_t **whole;         /* in place: verified WHOLE tensors, per entry */
    uint64_t *got;           /* changes decoded per entry (atomic adds) */
    chunk_ref *ch;
    size_t nch;              /* chunks indexed so far (all of them once indexed) */
    size_t nch_cap;          /* chunks of every SPARSE entry, from the table */
    size_t *ent_first;       /* entry -> first chunk */
    sp_coder *coder;         /* per worker */
    uint8_t **tmp;           /* per worker: one scan piece (in-place hashing) */
    struct undo *undo;       /* in place: per chunk */
    uint8_t *arena;          /* in place: the undo log */
    uint64_t arena_used, arena_size; /* bytes handed out (atomic adds), held */
    size_t arena_map;        /* bytes of its mapping (arena_put), or 0: malloc'd */
    bool keep;               /* in place, for an undo record: no chunk is deferred */
} dec;

/* After the table is parsed into d->t (d->patch set): checks the base
 * (hashed, or vouched by opts->base_hash) and matches it to the table, and
 * sizes the chunk list (d->nch_cap; nothing indexed yet). */
int ferry__codec_dec_setup(dec *d, const ferry_model *base, const ferry_apply_options *opts);
/* Indexes the chunks of entry j (SPARSE; its chunk size table, the first
 * 4 x chunks bytes of its payload, must be in d->patch). */
int ferry__codec_dec_index_entry(dec *d, size_t j);
/* Whether an in-place apply may use the model's kept leaf digests (and
 * drops them when the vouched hash is another). */
bool ferry__codec_dec_cached(ferry_model *base, const ferry_apply_options *opts);
/* In place, before the first chunk: the checks (structure, writable) and
 * the undo log for a patch of patch_size bytes; rec (keep mode, may be
 * NULL) receives the record's arrays. */
int ferry__codec_dec_inplace_prepare(dec *d, ferry_model *base, const ferry_apply_options *opts, uint64_t patch_size,
                                     bool cached, ferry__codec_undo **rec);
/* In place: chunk j decoded and written with undo (or hashed and deferred). */
int ferry__codec_dec_chunk_job(void *d, size_t j, int w);
/* In place: WHOLE entry j decoded and verified into a buffer of its own. */
int ferry__codec_dec_whole_job(dec *d, size_t j, int w);
/* In place, after every chunk job (rc: their status, or an earlier
 * failure): the remaining checks, then on success the deferred writes, the
 * whole tensors and the digest cache, on failure the roll back.  keep:
 * where the record goes on success (rec moved there), or NULL. */
int ferry__codec_dec_inplace_finish(dec *d, ferry_model *base, int rc, ferry__codec_undo **keep, ferry__codec_undo **rec);
/* Releases everything d holds (d may be partly set up, or zeroed). */
void ferry__codec_dec_end(dec *d);
#endif
