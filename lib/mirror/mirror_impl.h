/* Internal interface of the mirror (docs/MIRROR.md): the state of one
 * pass and the checks shared by its three parts — single-rank versions
 * (mirror.c), the compaction index and compacted deltas
 * (mirror_compact.c), sharded versions (mirror_shard.c). */
#ifndef FERRY_MIRROR_IMPL_H
#define FERRY_MIRROR_IMPL_H

#include "shard/shard_impl.h"

typedef struct mirror {
    ferry_store *src, *dst;
    const char *run;
    const ferry_mirror_options *o;
    ferry_mirror_info *info;
    fs_count cnt;
} mirror;

/* A protocol record of SRC (HEAD, manifest, index) as bytes, at most max
 * of them (bounded in the GET); *body = the bytes before its signature
 * trailer, which is verified when the keys trust any key (else only split
 * off).  The whole text is what DST receives. */
int ferry__mirror_get_record(mirror *mr, const char *key, size_t max, void **text, size_t *n, size_t *body);

/* The object is already in DST with the size its manifest gives: a copy
 * interrupted after that put.  DST only ever receives verified objects
 * under keys that carry a random id, so the size check is enough. */
bool ferry__mirror_in_dst(mirror *mr, const char *key, uint64_t bytes);

/* A patch as a record says it is: header, table and trailer checksum
 * parse, its target hash is `target` and, unless base is NULL, its base
 * hash is `base`.  FERRY_ERR_SYNC_CORRUPT naming key and what. */
int ferry__mirror_check_patch(const char *key, const char *what, const void *d, size_t n, const uint8_t *base, const uint8_t target[16]);

/* Copies the patch object under key (bytes, optional signed SHA-256) from
 * SRC to DST unless it is already there (counted in objects_reused):
 * fetched bounded and digest-checked, checked by ferry__mirror_check_patch
 * against base and target, then put.  *copied counts a copy. */
int ferry__mirror_copy_patch(mirror *mr, const char *key, uint64_t bytes, bool has_sha, const uint8_t *sha, const uint8_t *base,
                      const uint8_t target[16], uint32_t *copied);

/* Copies the compacted deltas whose target version DST holds (each
 * verified), then SRC's compaction index, verbatim, unless DST's is
 * already the same bytes. */
int ferry__mirror_compactions(mirror *mr);

/* Copies the per-rank objects of a sharded version (each tile verified
 * against the manifest), then the manifest's bytes. */
int ferry__mirror_copy_shard(mirror *mr, const sh_doc *m, const void *text, size_t n);

/* Copies the rank objects of a sharded compaction, cm its view of its
 * target version (ferry__shard_comp_view), each verified like a version's
 * rank object of the index form (its tile index against the root the
 * compaction index gives, each tile against its leaf); counted in
 * compactions_copied. */
int ferry__mirror_copy_comp(mirror *mr, const sh_doc *cm);

#endif
