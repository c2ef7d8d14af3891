/*
 * ferry_shard_state.h — island ranks that keep their slices between
 * processes (docs/SHARDING.md, "Islands that follow").
 *
 * A handle of include/ferry_shard.h holds its tiles in memory: a new
 * process starts from nothing and pulls the anchor.  An island that keeps
 * what it pulled (a file, as `ferry shard-pull --out` does) gives it back
 * to a new handle with ferry_shard_subscriber_resume, after which a pull
 * fetches only the deltas from that version.  Conventions of ferry.h.
 */
#ifndef FERRY_SHARD_STATE_H
#define FERRY_SHARD_STATE_H

#include "ferry_shard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The id of the version the regions hold (FERRY_SYNC_ID_LEN hex digits;
 * "" when none), to be kept with the data. */
FERRY_API void ferry_shard_subscriber_held_id(const ferry_shard_subscriber *s, char id[FERRY_SYNC_ID_LEN + 1]);

/* Gives a handle that holds nothing (just opened) its regions as they were
 * at (version, id): data[i] holds region i row-major, sizes[i] bytes (as
 * ferry_shard_region_copy wrote it).  Reads the version's manifest (signed
 * where the handle trusts keys), checks the regions against it, rebuilds
 * every tile they cover and checks each against the manifest's target
 * hash; only then does the handle hold them, and the next ferry_shard_pull
 * fetches the deltas from that version (as if this handle had pulled it).
 * Returns FERRY_ERR_SYNC_GONE (that version's manifest is no longer in the
 * store: pull from scratch), FERRY_ERR_SHARD_REGION (a region outside its
 * tensor; or a covering tile reaches outside the regions: the data do not
 * hold the whole tile, so only regions on tile edges can be resumed),
 * FERRY_ERR_SYNC_CORRUPT (a tile does not hash to the version's: the data
 * are not that version's), FERRY_ERR_ARG (the handle holds a version
 * already, a size that is not the region's, version 0, a malformed id),
 * manifest, signature and store errors.  On failure the handle holds
 * nothing, as before.  *manifest_bytes (may be NULL) gets the bytes read
 * (the version's manifest), on failure too. */
FERRY_API int ferry_shard_subscriber_resume(ferry_shard_subscriber *s, uint64_t version, const char *id,
                                            const void *const *data, const size_t *sizes, uint64_t *manifest_bytes);

/* The tensors of a sharded run (those of HEAD's manifest; the part layout,
 * hence the tensors, is fixed for the run). */
typedef struct ferry_shard_tensor {
    char *name;
    ferry_dtype dtype;
    uint32_t ndim;
    uint64_t shape[FERRY_MAX_DIMS];
} ferry_shard_tensor;

typedef struct ferry_shard_tensor_list {
    uint64_t version;           /* HEAD's version when read */
    size_t count;
    ferry_shard_tensor *tensors;/* in name order */
} ferry_shard_tensor_list;

/* Reads HEAD and its manifest (both must verify with trusted keys, when
 * keys is not NULL and trusts any) and lists the run's tensors.  Returns
 * FERRY_ERR_SYNC_NOT_YET (no HEAD), FERRY_ERR_SHARD_KIND (a single-rank
 * run), manifest, signature and store errors. */
FERRY_API int ferry_shard_tensors(ferry_store *store, const char *run, const ferry_keys *keys, ferry_shard_tensor_list **out);
FERRY_API void ferry_shard_tensor_list_free(ferry_shard_tensor_list *l);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_SHARD_STATE_H */
