/*
 * ferry.h — lossless sparse BF16 policy patches for decoupled RL.
 *
 * This header is the reference manual of the ferry core: errors, dtypes,
 * models (named tensors read from safetensors or built in memory), the patch
 * codec (diff / apply / inspect) and change statistics.  The core needs only
 * libzstd, libxxhash and libjansson; the store, sync, dock and loco layers
 * have headers of their own.
 *
 * Conventions (zstd-style):
 *  - every function that can fail returns an int status: 0 (FERRY_OK) or a
 *    stable FERRY_ERR_* code; ferry_strerror() names the code and
 *    ferry_last_error() gives the detailed message of the last failure on the
 *    calling thread (it names the file, object, tensor and field);
 *  - handles are opaque, made by *_create / *_open and released by *_free,
 *    which accepts NULL;
 *  - every byte that comes from a file, a store or a peer is validated before
 *    use: lengths are overflow-checked and allocations bounded by the input
 *    size, so a hostile input yields an error, never a crash;
 *  - outputs are never half-written: files are written aside, flushed and
 *    renamed; in-place apply verifies the whole result before touching the
 *    caller's memory.
 */
#ifndef FERRY_H
#define FERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && __GNUC__ >= 4
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 1
#define FERRY_VERSION_PATCH 0
#define FERRY_VERSION_STRING "0.1.0"

/* ======================================================================
 * Errors.  Every status code of every layer (FERRY_OK, FERRY_ERR_*), with
 * its number, message and meaning, is listed in ferry_errors.h, which also
 * maps the number ranges to the layers.  Codes are stable: new ones are
 * appended, none is renumbered.
 * ====================================================================== */
#include "ferry_errors.h"

/* Short, static description of a status code ("unknown error" if none). */
FERRY_API const char *ferry_strerror(int code);

/* Detailed message of the last failure on this thread, naming the object and
 * field ("rl-a/step-001.safetensors: tensor 'w': data_offsets end 12 > 10").
 * Empty string if nothing failed yet.  Valid until the next ferry call. */
FERRY_API const char *ferry_last_error(void);

/* Library version as "MAJOR.MINOR.PATCH". */
FERRY_API const char *ferry_version(void);

/* Release memory the library allocated for the caller (patch buffers,
 * JSON strings).  Accepts NULL. */
FERRY_API void ferry_free(void *p);

/* Writes size bytes to path atomically: a temporary file beside it, fsync,
 * rename, fsync of the directory.  On failure nothing is left at path
 * (an existing file there is kept) and no temporary file remains. */
FERRY_API int ferry_file_write(const char *path, const void *data, size_t size);
/* Reads a whole regular file into a new buffer (release with ferry_free);
 * FERRY_ERR_LIMIT if it is larger than max bytes. */
FERRY_API int ferry_file_read(const char *path, size_t max, void **data, size_t *size);

/* ======================================================================
 * BF16.  Matches PyTorch's float32 -> bfloat16 cast bit for bit: round to
 * nearest even, every NaN becomes 0x7FC0 (sign dropped, as PyTorch does).
 * ====================================================================== */
FERRY_API uint16_t ferry_f32_to_bf16(float f);
FERRY_API float ferry_bf16_to_f32(uint16_t h);
/* Casts n values; src and dst may not overlap. */
FERRY_API void ferry_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n);

/* ======================================================================
 * Dtypes: every dtype of the safetensors format.
 * ====================================================================== */
typedef enum ferry_dtype {
    FERRY_BOOL = 0, FERRY_U8, FERRY_I8, FERRY_F8_E5M2, FERRY_F8_E4M3,
    FERRY_F8_E8M0, FERRY_I16, FERRY_U16, FERRY_F16, FERRY_BF16, FERRY_I32,
    FERRY_U32, FERRY_F32, FERRY_F64, FERRY_I64, FERRY_U64, FERRY_C64,
    FERRY_F4, FERRY_F6_E2M3, FERRY_F6_E3M2,
    FERRY_DTYPE_COUNT
} ferry_dtype;

/* safetensors name ("BF16"), or NULL for an out-of-range value. */
FERRY_API const char *ferry_dtype_name(ferry_dtype dt);
/* Parses a safetensors dtype name; FERRY_ERR_ST_DTYPE if unknown. */
FERRY_API int ferry_dtype_parse(const char *name, ferry_dtype *out);
/* Size of one element in bits (4 for F4, 6 for F6_*, 16 for BF16). */
FERRY_API unsigned ferry_dtype_bits(ferry_dtype dt);

/* ======================================================================
 * Models: an ordered set of named tensors plus string metadata.
 *
 * Tensors are kept sorted by name (bytewise), which is also the order of
 * the model hash.  Data is either borrowed (mmap of a file, or a caller
 * buffer that must outlive the model) or owned (copied in).
 * ====================================================================== */
typedef struct ferry_model ferry_model;

#define FERRY_MAX_DIMS 32
#define FERRY_MAX_NAME 4096

typedef struct ferry_tensor {
    const char *name;        /* NUL-terminated, owned by the model */
    ferry_dtype dtype;
    uint32_t ndim;
    const uint64_t *shape;   /* ndim entries, owned by the model */
    uint64_t nelem;          /* product of shape (1 for ndim == 0) */
    uint64_t nbytes;         /* nelem x bits / 8 */
    const void *data;        /* nbytes bytes */
} ferry_tensor;

/* An empty model. */
FERRY_API int ferry_model_create(ferry_model **out);

/* Opens a .safetensors file, or a directory / .index.json of a sharded
 * checkpoint, read-only through mmap.  Enforces every rule of the
 * safetensors reference implementation; on failure returns the specific
 * FERRY_ERR_ST_* code and names file, tensor and field. */
FERRY_API int ferry_model_open(const char *path, ferry_model **out);

FERRY_API void ferry_model_free(ferry_model *m);

/* Flags for ferry_model_add. */
#define FERRY_ADD_COPY 0u      /* copy the data into the model */
#define FERRY_ADD_BORROW 1u    /* keep the pointer; caller keeps it alive */

/* Adds a tensor.  nbytes must equal elements x dtype bits / 8 (rounded up
 * for sub-byte dtypes); name must be new, non-empty, without NUL, at most
 * FERRY_MAX_NAME bytes; ndim <= FERRY_MAX_DIMS. */
FERRY_API int ferry_model_add(ferry_model *m, const char *name, ferry_dtype dt,
                              uint32_t ndim, const uint64_t *shape,
                              const void *data, uint64_t nbytes, unsigned flags);

/* Sets (or replaces) one metadata entry (the safetensors __metadata__). */
FERRY_API int ferry_model_set_metadata(ferry_model *m, const char *key, const char *value);

FERRY_API size_t ferry_model_count(const ferry_model *m);
/* Tensor i in name order; the struct stays valid while the model lives. */
FERRY_API const ferry_tensor *ferry_model_tensor(const ferry_model *m, size_t i);
/* Tensor by name, or NULL. */
FERRY_API const ferry_tensor *ferry_model_find(const ferry_model *m, const char *name);
/* Writable data of tensor i: owned copies, or borrowed buffers that were
 * added as writable (FERRY_ADD_BORROW of caller memory); NULL for mmapped
 * files. */
FERRY_API void *ferry_model_data_mut(ferry_model *m, size_t i);

FERRY_API size_t ferry_model_metadata_count(const ferry_model *m);
/* Metadata entry i in key order. */
FERRY_API int ferry_model_metadata(const ferry_model *m, size_t i,
                                   const char **key, const char **value);
FERRY_API const char *ferry_model_metadata_get(const ferry_model *m, const char *key);

/* Total bytes of tensor data. */
FERRY_API uint64_t ferry_model_nbytes(const ferry_model *m);

/* Writes a single .safetensors file (tensors in name order, header padded
 * with spaces to a multiple of 8), atomically: a new PATH.tmp.PID.RANDOM
 * (O_EXCL | O_NOFOLLOW), fsync, rename, fsync of the directory.
 * On failure nothing is left at path. */
FERRY_API int ferry_model_save(const ferry_model *m, const char *path);

/* Model hash: XXH3-128 over the canonical description of every tensor in
 * name order and the metadata (docs/FORMAT.md, "Model hash").  16 bytes,
 * big-endian digest as XXH128_canonical_t. */
FERRY_API int ferry_model_hash(const ferry_model *m, uint8_t out[16]);
/* Per-tensor hash: XXH3-128 of the tensor's description and bytes. */
FERRY_API void ferry_tensor_hash(const ferry_tensor *t, uint8_t out[16]);

/* ======================================================================
 * Patches: turn model A into model B exactly.
 * ====================================================================== */
typedef struct ferry_diff_options {
    int level;      /* zstd level for tensors carried whole, 1..19 (0 = 3) */
    int threads;    /* worker threads, 0 = 1 */
    int cast_bf16;  /* FP32 master gate: every F32 tensor of B is taken as its
                       BF16 cast (ferry_f32_to_bf16, bit-identical to PyTorch),
                       computed on the fly; the target model holds BF16 */
    const uint8_t *base_hash; /* optional: A's model hash, when the caller
                       knows it (the target of its previous diff); saves a
                       pass over A.  A wrong value makes a patch that every
                       apply refuses. */
} ferry_diff_options;

typedef struct ferry_apply_options {
    int threads;    /* worker threads, 0 = 1 */
    const uint8_t *base_hash; /* optional: the caller vouches that base hashes
                       to this (it is the verified result of its last apply):
                       the base is then not hashed again, and its tensors
                       carried unchanged are taken as they are.  The result
                       of the patch is still verified in full. */
    uint64_t undo_limit; /* ferry_apply_inplace only: bytes of undo log it may
                       keep (2 + word size per changed word, 4 for BF16)
                       so that it decodes each chunk once, writing while it
                       verifies and putting
                       the base back on failure; chunks beyond the limit are
                       verified first and decoded again to be written.  0 =
                       64 MiB + the smaller of 16 x the patch size and a
                       quarter of the model; 1 = no undo log: nothing
                       is written before everything verified (for a base that
                       others read while it is patched). */
    uint64_t max_output_bytes; /* ferry_apply, ferry_apply_ex, ferry_apply_file:
                       bound on the target model's tensor bytes, checked
                       from the patch's table before any output is
                       allocated or written (a tiny patch can declare a
                       model of any size); over it: FERRY_ERR_LIMIT.
                       0 = no bound.  The sync layer passes the manifest's
                       model size; `ferry apply` has --max-output. */
} ferry_apply_options;

/* Encodes the patch A -> B into a new buffer (*patch, *size), released with
 * ferry_free().  opts may be NULL.  The patch names A's and B's model
 * hashes and every tensor's target hash. */
FERRY_API int ferry_diff(const ferry_model *a, const ferry_model *b,
                         const ferry_diff_options *opts, void **patch, size_t *size);

/* Applies a patch to base, producing a new model that owns its data.
 * Fails with FERRY_ERR_BASE_MISMATCH before any work if base's hash is not
 * the patch's base hash, and with FERRY_ERR_TARGET_MISMATCH if the result
 * does not hash to the declared target.  Never returns a partial model. */
FERRY_API int ferry_apply(const ferry_model *base, const void *patch, size_t size,
                          ferry_model **out);
/* ferry_apply with options (NULL = defaults). */
FERRY_API int ferry_apply_ex(const ferry_model *base, const void *patch, size_t size,
                             const ferry_apply_options *opts, ferry_model **out);

/* Applies a patch to base and writes the result to path as one .safetensors
 * file (as ferry_model_save would), streaming: memory stays bounded (a few
 * MiB per thread) whatever the model's size.  The file is written aside
 * (a new path.tmp.PID.RANDOM, O_EXCL | O_NOFOLLOW), every tensor and the
 * model are verified against the patch's target hashes, and only then is
 * it renamed over path; on any failure nothing is left behind and an
 * existing file at path is kept. */
FERRY_API int ferry_apply_file(const ferry_model *base, const void *patch, size_t size,
                               const ferry_apply_options *opts, const char *path);

/* Applies a patch into base's own writable memory (same names, dtypes and
 * shapes before and after, no metadata change; else FERRY_ERR_SHAPE_MISMATCH).
 * Every tensor and the model are verified (per-tensor and model hashes)
 * before it returns OK; on any error base holds exactly its old bits again.
 * To decode once, it writes the changed elements while it verifies, keeping
 * the words it overwrote in an undo log (bounded by opts->undo_limit) and
 * putting them back if verification fails; chunks beyond the limit are
 * verified first and only then decoded again and written (undo_limit 1:
 * every chunk, so that concurrent readers never see an unverified word). */
FERRY_API int ferry_apply_inplace(ferry_model *base, const void *patch, size_t size);
FERRY_API int ferry_apply_inplace_ex(ferry_model *base, const void *patch, size_t size,
                                     const ferry_apply_options *opts);

/* Streamed in-place apply: a patch applied while it arrives (a download),
 * so that decoding overlaps the transfer and the model is fresh about when
 * the last byte is in, not a whole decode later.
 *
 *   ferry_apply_stream *st;
 *   ferry_apply_stream_begin(model, &opts, &sopts, &st);
 *   while (bytes arrive) if (ferry_apply_stream_feed(st, p, n)) break;
 *   rc = ferry_apply_stream_end(st);       (or ferry_apply_stream_abort(st))
 *
 * The same apply as ferry_apply_inplace_ex (same checks, same result, same
 * options: threads, base_hash, undo_limit), fed in pieces of any size, 1
 * byte included.  As soon as header and table arrived, the base is
 * checked (before a word is written) and `threads` worker threads start;
 * each chunk of the patch (and each tensor carried whole) is decoded and
 * written into the model, keeping what it overwrote, as soon as its last
 * byte arrived.  end checks the trailer's checksum, the digest below and
 * every tensor's and the model's hash and returns FERRY_OK only with the
 * model at the target; on any failure (a corrupt byte anywhere, a stream
 * that ends early or goes on past the declared size, a wrong digest) and
 * after ferry_apply_stream_abort the model holds exactly its old bits
 * again.  The patch's bytes are kept in memory to the end (the size its
 * header declares, at most sopts->max_size).  Until end or abort returns,
 * the model must not be read or written by anyone else (its words change
 * under the workers).
 *
 * Errors are reported where they are found: feed fails as soon as a check
 * fails (a corrupt chunk, a wrong base), so that the caller can stop the
 * transfer; the model is then already put back, and end (or abort) must
 * still be called to release the stream.  A corrupt byte may thus show as
 * FERRY_ERR_PATCH_CORRUPT where ferry_apply_inplace, which checks the
 * trailer first, reports FERRY_ERR_PATCH_CHECKSUM.
 * With sopts->sha256 (the digest a signed manifest gives the object): a
 * failure caused by the object's bytes does not fail feed; the stream
 * takes the rest only to hash it, and end reports FERRY_ERR_SIG_DIGEST when
 * the bytes are not the signed ones (a replaced object, as a buffered
 * download checked before parsing would), else the failure itself.
 * FERRY_ERR_UNSUPPORTED in a build without libcrypto (NO_NET). */
typedef struct ferry_apply_stream ferry_apply_stream;
typedef struct ferry_apply_stream_options {
    uint64_t max_size;      /* bound on the patch size its header declares
                               (the buffer the stream allocates); over it:
                               FERRY_ERR_LIMIT.  0 = 1 GiB */
    const uint8_t *sha256;  /* optional: the SHA-256 of the whole object,
                               computed as it arrives, checked by end
                               (FERRY_ERR_SIG_DIGEST) */
} ferry_apply_stream_options;

/* opts and sopts may be NULL (defaults); both are copied. */
FERRY_API int ferry_apply_stream_begin(ferry_model *model, const ferry_apply_options *opts,
                                       const ferry_apply_stream_options *sopts, ferry_apply_stream **out);
/* Hands over the next n bytes of the patch (any n, 0 included). */
FERRY_API int ferry_apply_stream_feed(ferry_apply_stream *st, const void *bytes, size_t n);
/* The base and target model hashes the patch's header names, once its
 * first 64 bytes arrived (else FERRY_ERR_PATCH_TRUNCATED, no message): a
 * caller may check that the patch is the version it asked for before it
 * feeds more. */
FERRY_API int ferry_apply_stream_hashes(const ferry_apply_stream *st, uint8_t base[16], uint8_t target[16]);
/* The last byte was fed: verifies and finishes (see above); releases st. */
FERRY_API int ferry_apply_stream_end(ferry_apply_stream *st);
/* Stops: the model is put back; releases st (NULL is a no-op). */
FERRY_API void ferry_apply_stream_abort(ferry_apply_stream *st);

/* What a patch holds, without a base. */
typedef struct ferry_patch_tensor_info {
    const char *name;
    ferry_dtype dtype;
    uint64_t nelem;
    uint64_t changed;      /* elements whose bits change (nelem if carried whole) */
    uint64_t bytes;        /* bytes this tensor takes in the patch */
    int kind;              /* FERRY_PT_* */
} ferry_patch_tensor_info;

enum { FERRY_PT_SPARSE = 0, FERRY_PT_WHOLE = 1, FERRY_PT_REMOVED = 2, FERRY_PT_SAME = 3 };

typedef struct ferry_patch_info ferry_patch_info;
/* Parses and validates the patch header and tensor table (not the coded
 * streams); *out is released with ferry_patch_info_free. */
FERRY_API int ferry_patch_inspect(const void *patch, size_t size, ferry_patch_info **out);
FERRY_API void ferry_patch_info_free(ferry_patch_info *info);
/* The patch's format version: 1, or 2 when it holds chunks of the codec
 * that decoders run in vector lanes (docs/FORMAT.md); this build reads both
 * and writes 2 only when a chunk needs it. */
FERRY_API unsigned ferry_patch_info_format(const ferry_patch_info *info);
FERRY_API void ferry_patch_info_hashes(const ferry_patch_info *info, uint8_t base[16], uint8_t target[16]);
FERRY_API size_t ferry_patch_info_count(const ferry_patch_info *info);
FERRY_API const ferry_patch_tensor_info *ferry_patch_info_tensor(const ferry_patch_info *info, size_t i);

/* ======================================================================
 * Change statistics between two models, without writing a patch.
 * ====================================================================== */
#define FERRY_ULP_BINS 9 /* deltas -4..+4 as bins 0..8; |d| > 4 counted apart */

typedef struct ferry_tensor_stats {
    const char *name;       /* borrowed from model b */
    ferry_dtype dtype;
    uint64_t nelem;
    uint64_t changed;       /* elements whose bits differ */
    uint64_t ulp_hist[FERRY_ULP_BINS];
    uint64_t ulp_far;       /* |delta| > 4 (in sign-magnitude integer order) */
    int comparable;         /* 0 if added/removed/re-typed/re-shaped */
} ferry_tensor_stats;

typedef struct ferry_stats {
    size_t count;
    ferry_tensor_stats *tensors; /* count entries, b's tensors in name order */
    uint64_t nelem, changed;
    uint64_t ulp_hist[FERRY_ULP_BINS];
    uint64_t ulp_far;
} ferry_stats;

FERRY_API int ferry_stats_compute(const ferry_model *a, const ferry_model *b, ferry_stats *out);
FERRY_API void ferry_stats_release(ferry_stats *s);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_H */
