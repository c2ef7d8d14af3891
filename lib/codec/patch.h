/* The patch container, format versions 1 to 3 (docs/FORMAT.md is normative). */
#ifndef FERRY_PATCH_H
#define FERRY_PATCH_H
#include "common.h"

#define PATCH_MAGIC "FERRYPAT"
/* Version 2 is version 1 plus chunk codec 3, version 3 adds chunk codec 4;
 * ferry writes the lowest version whose codecs the patch uses (so a patch
 * without codec-4 chunks stays readable by older readers, and older
 * readers refuse one with them: FERRY_ERR_PATCH_VERSION). */
#define PATCH_VERSION 1
#define PATCH_VERSION_MAX 3
#define PATCH_HEADER_SIZE 64
#define PATCH_TRAILER_SIZE 16
/* The decompressed table is bounded so a hostile size cannot make the
 * decoder allocate more than this. */
#define PATCH_TABLE_MAX (64u << 20)

enum { PK_SPARSE = 0, PK_WHOLE = 1, PK_REMOVED = 2, PK_SAME = 3 };
enum { WHOLE_RAW = 0, WHOLE_ZSTD = 1 };

typedef struct patch_entry {
    char *name;
    uint8_t kind;
    ferry_dtype dtype;
    uint32_t ndim;
    uint64_t shape[FERRY_MAX_DIMS];
    uint64_t nelem, nbytes;
    uint64_t nwords;       /* coded words: nbytes * 8 / W of the sparse dtype */
    uint8_t hash[16];      /* target tensor hash */
    uint8_t chunk_log2;    /* SPARSE */
    uint64_t changed;      /* SPARSE */
    uint8_t codec;         /* WHOLE */
    uint64_t payload_off;  /* from the start of the patch */
    uint64_t payload_size;
} patch_entry;

typedef struct patch_table {
    uint8_t base_hash[16], target_hash[16];
    uint32_t version;
    size_t nmeta;
    char **meta_key, **meta_val;
    size_t n;
    patch_entry *e;
} patch_table;

/* Validates header, trailer checksum and table; fills *t (released with
 * ferry__codec_patch_table_release).  Every field is checked; payload bounds are
 * checked against the patch size. */
int ferry__codec_patch_table_parse(const uint8_t *p, size_t size, patch_table *t);
void ferry__codec_patch_table_release(patch_table *t);
/* For a patch that arrives piece by piece (lib/codec/stream.c): the
 * header's checks that need no other byte (magic, version, flags, sizes),
 * giving the declared patch size and the compressed table's size; then
 * the table, from p holding at least the header and the table (size: the
 * declared size), without the trailer's checksum (the caller checks it
 * when the rest has arrived). */
int ferry__codec_patch_header(const uint8_t *p, uint64_t *declared, uint32_t *zsize);
int ferry__codec_patch_table_parse_at(const uint8_t *p, uint64_t size, patch_table *t);

/* Number of chunks of a SPARSE entry, and the chunk element count. */
static inline uint64_t patch_chunks(const patch_entry *e) { return (e->nwords + ((uint64_t)1 << e->chunk_log2) - 1) >> e->chunk_log2; }
#endif
