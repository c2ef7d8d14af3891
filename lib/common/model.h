/* Internal layout of ferry_model, shared by lib/common (build, hash),
 * lib/io (safetensors) and lib/codec (apply). */
#ifndef FERRY_MODEL_H
#define FERRY_MODEL_H
#include "common.h"

typedef struct ferry__entry {
    ferry_tensor t;   /* public view; name and shape point into this entry */
    void *owned;      /* data owned by the model (freed with it), or NULL */
    bool writable;    /* data may be written (owned, or borrowed caller memory) */
    /* Digest cache (docs/FORMAT.md, "Verification on apply"): the tensor
     * hash and, when known, the 4 MiB leaf (block) digests of data as the
     * last verified ferry_apply_inplace left it.  Dropped when the memory
     * is handed out writable (ferry_model_data_mut) or an undo record is
     * reverted into it. */
    bool hash_ok;
    uint8_t hash[16];
    uint8_t (*leaf)[16];
} ferry__entry;

typedef struct ferry__meta { char *key, *value; } ferry__meta;
typedef struct ferry__mapping { void *addr; size_t len; } ferry__mapping;

struct ferry_model {
    ferry__entry **e;          /* sorted by name (strcmp) */
    size_t n, cap;
    ferry__meta *meta;         /* sorted by key */
    size_t nmeta, capmeta;
    ferry__mapping *maps;      /* mmaps released with the model */
    size_t nmaps;
};

/* Element count and byte size of a shape, overflow-checked; returns false
 * on overflow or when a sub-byte dtype does not fill whole bytes. */
bool ferry__tensor_size(ferry_dtype dt, uint32_t ndim, const uint64_t *shape,
                        uint64_t *nelem, uint64_t *nbytes);
/* Adds with an explicit writability (io uses it for read-only mmaps). */
int ferry__model_add(ferry_model *m, const char *name, ferry_dtype dt, uint32_t ndim,
                     const uint64_t *shape, const void *data, uint64_t nbytes,
                     bool copy, bool writable);
/* Every tensor's hash into th[] (m's order), on up to `threads` threads. */
int ferry__hash_tensors_mt(const ferry_model *m, int threads, uint8_t (*th)[16]);
/* Model hash from per-tensor hashes th[] (in m's tensor order) and m's
 * metadata. */
int ferry__model_hash_tensors(const ferry_model *m, const uint8_t (*th)[16], uint8_t out[16]);
/* Adds a tensor whose buffer (from malloc) the model takes over; on failure
 * the buffer is freed. */
int ferry__model_add_owned(ferry_model *m, const char *name, ferry_dtype dt, uint32_t ndim,
                           const uint64_t *shape, void *buf, uint64_t nbytes);
/* Adds a tensor's name, dtype and shape without data (data NULL): a layout
 * for writing a file header before the data exists; never hashed or read. */
int ferry__model_add_layout(ferry_model *m, const char *name, ferry_dtype dt, uint32_t ndim,
                            const uint64_t *shape, uint64_t nbytes);
int ferry__model_add_mapping(ferry_model *m, void *addr, size_t len);
/* Drops tensor i's digest cache (every tensor's when i >= m->n). */
void ferry__model_cache_drop(ferry_model *m, size_t i);
/* Index of name in the sorted array, or -(insertion point)-1. */
long ferry__model_lookup(const ferry_model *m, const char *name);


/* Hash pieces (definitions in docs/FORMAT.md, "Hashes"). */
#include "xxh.h"
/* Tensor hashes are made of the digests of FERRY_HASH_BLOCK-byte blocks
 * (docs/FORMAT.md, "Hashes"). */
#define FERRY_HASH_BLOCK ((uint64_t)1 << 22)
static inline uint64_t ferry__hash_nblocks(uint64_t nbytes) { return (nbytes + FERRY_HASH_BLOCK - 1) / FERRY_HASH_BLOCK; }
void ferry__tensor_hash_begin(XXH3_state_t *st, const char *name, ferry_dtype dt, uint32_t ndim,
                              const uint64_t *shape, uint64_t nbytes);
void ferry__hash_digest(XXH3_state_t *st, uint8_t out[16]);
void ferry__block_hash(const void *data, size_t n, uint8_t out[16]);
/* Block digests of a byte stream fed in pieces that never straddle a block
 * boundary (pieces divide FERRY_HASH_BLOCK): each full block's digest, and
 * at the end the last partial one's, go to out[0], out[1], ... */
typedef struct ferry__blockhash {
    XXH3_state_t st;
    uint64_t in_block;
    uint8_t (*out)[16];
} ferry__blockhash;
void ferry__bh_begin(ferry__blockhash *h, uint8_t (*out)[16]);
void ferry__bh_feed(ferry__blockhash *h, const void *p, size_t n);
void ferry__bh_end(ferry__blockhash *h);
/* The tensor hash from its block digests (ferry__hash_nblocks(nbytes) of them). */
void ferry__tensor_hash_blocks(const char *name, ferry_dtype dt, uint32_t ndim, const uint64_t *shape, uint64_t nbytes,
                               const uint8_t (*blocks)[16], uint8_t out[16]);
void ferry__tensor_hash_parts(const char *name, ferry_dtype dt, uint32_t ndim, const uint64_t *shape,
                              const void *data, uint64_t nbytes, uint8_t out[16]);
/* Model hash from per-tensor hashes in name order and metadata entries in
 * key order. */
void ferry__model_hash_from(const uint8_t (*th)[16], size_t n, size_t nmeta, const char *const *keys,
                            const char *const *vals, uint8_t out[16]);
#endif
