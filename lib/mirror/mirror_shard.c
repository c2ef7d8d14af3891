/* Sharded versions of a mirrored run (docs/MIRROR.md, "Sharded runs"):
 * each rank's object (RUN/v/V-ID-rNNNNNN.patch, and .anchor on anchor
 * versions) is downloaded to a local file (parallel ranged GETs,
 * resumable), and every byte of it verified before the manifest-2 that
 * names it is written: the object is exactly its tiles' patches end to
 * end (no byte that no tile accounts for), and each tile patch has the
 * SHA-256 the manifest gives (signed with the manifest on a signed run),
 * a valid checksum, and the manifest's base and target hashes.  A sharded
 * compaction's rank objects are copied the same way, read as the delta
 * objects of its view of its target version (ferry__shard_comp_view): each
 * verified against its index and the root the compaction index gives. */
#include "mirror_impl.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Where one tile patch of the object lies (off: its offset, copied so
 * that sorting needs no context). */
typedef struct span {
    uint64_t off;
    const sh_part *p;
    const sh_tile *t;
} span;

static int cmp_span(const void *a, const void *b)
{
    uint64_t x = ((const span *)a)->off, y = ((const span *)b)->off;
    return x < y ? -1 : x > y;
}

/* The tiles of rank r in object `kind`, sorted by offset. */
static int spans_of(const sh_doc *m, uint32_t r, int kind, span **out, size_t *count)
{
    size_t n = 0;
    for (size_t i = 0; i < m->nparts; i++)
        if (m->parts[i].rank == r) n += m->parts[i].ntiles;
    span *s = ferry__calloc(n ? n : 1, sizeof *s);
    if (!s) return FERRY_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < m->nparts; i++)
        for (size_t j = 0; m->parts[i].rank == r && j < m->parts[i].ntiles; j++)
            if (m->parts[i].tiles[j].loc[kind].size)
                s[k++] = (span){m->parts[i].tiles[j].loc[kind].off, &m->parts[i], &m->parts[i].tiles[j]};
    qsort(s, k, sizeof *s, cmp_span);
    *out = s;
    *count = k;
    return FERRY_OK;
}

/* Every byte of the mapped object d (n bytes) belongs to exactly one tile,
 * and each tile verifies. */
static int verify_object(const char *key, const sh_doc *m, uint32_t r, int kind, const uint8_t *d, uint64_t n)
{
    if (m->index_form) return ferry__shard_object_check(key, m, r, kind, d, n); /* its index, against the signed root */
    span *s;
    size_t k;
    int rc = spans_of(m, r, kind, &s, &k);
    if (rc) return rc;
    uint64_t at = 0;
    for (size_t i = 0; i < k && !rc; i++) {
        const sh_tile *t = s[i].t;
        const sh_loc *l = &t->loc[kind];
        char what[FERRY_STORE_KEY_MAX], hex[65];
        snprintf(what, sizeof what, ": tile [%llu:%llu, %llu:%llu] of '%s'", (unsigned long long)t->r0, (unsigned long long)t->r1,
                 (unsigned long long)t->c0, (unsigned long long)t->c1, s[i].p->name);
        if (l->off != at || l->size > n - at) {
            rc = ferry__fail(FERRY_ERR_SYNC_MANIFEST, "%s%s: at offset %llu, %llu bytes; the tiles before it end at %llu (object %llu bytes)",
                             key, what, (unsigned long long)l->off, (unsigned long long)l->size, (unsigned long long)at,
                             (unsigned long long)n);
            break;
        }
        uint8_t dg[32];
        if ((rc = ferry__sha256(d + at, (size_t)l->size, dg))) break;
        ferry__hex(hex, dg, 32);
        if (strcmp(hex, l->sha))
            rc = ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s%s: SHA-256 does not match the manifest", key, what);
        else if (m->tile_codec == SH_TC_PATCH) /* ferry-tile-1 payloads: the signed SHA-256 is their check */
            rc = ferry__mirror_check_patch(key, what, d + at, (size_t)l->size, kind == SH_DELTA ? t->base : NULL, t->target);
        at += l->size;
    }
    if (!rc && at != n)
        rc = ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: %llu bytes, its tiles account for %llu (bytes no tile names)", key,
                         (unsigned long long)n, (unsigned long long)at);
    free(s);
    return rc;
}

/* Maps the downloaded file and verifies it. */
static int verify_file(const char *key, const char *path, const sh_doc *m, uint32_t r, int kind, uint64_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ferry__fail(FERRY_ERR_IO, "%s: cannot open the staged copy %s", key, path);
    void *d = mmap(NULL, (size_t)n, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (d == MAP_FAILED) return ferry__fail(FERRY_ERR_IO, "%s: cannot map the staged copy %s", key, path);
    int rc = verify_object(key, m, r, kind, d, n);
    munmap(d, (size_t)n);
    return rc;
}

/* Rank r's object of kind of m (a version's, or a compaction's when m is
 * its view); *copied counts a copy. */
static int copy_object(mirror *mr, const sh_doc *m, uint32_t r, int kind, uint32_t *copied)
{
    uint64_t bytes = m->obj_bytes[2 * r + (uint32_t)kind];
    if (!bytes) return FERRY_OK;
    char key[FS_KEY_CAP];
    ferry__shard_doc_object_key(key, mr->run, m, r, kind);
    if (ferry__mirror_in_dst(mr, key, bytes)) {
        mr->info->objects_reused++;
        return FERRY_OK;
    }
    /* named by the version's (or compaction's) id, rank and kind: a pass
       after a killed one resumes the download */
    char path[4096];
    snprintf(path, sizeof path, "%s/ferry-mirror.%s-r%06u.%s", ferry__sync_tmp_dir(mr->o->tmp_dir), m->comp_id[0] ? m->comp_id : m->id,
             (unsigned)r, kind == SH_DELTA ? "patch" : "anchor");
    ferry_store_transfer_options to = {.concurrency = mr->o->concurrency, .chunk_size = mr->o->chunk_size, .resume = 1};
    ferry_store_stat ss;
    int rc = ferry_store_get_file_parallel(mr->src, key, path, &to, &ss);
    if (rc) return rc;
    mr->cnt.bytes += ss.size;
    mr->cnt.objects++;
    if (ss.size != bytes)
        rc = ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: %llu bytes, its manifest says %llu (truncated or replaced)", key,
                         (unsigned long long)ss.size, (unsigned long long)bytes);
    else
        rc = verify_file(key, path, m, r, kind, bytes);
    if (!rc) rc = ferry_store_put_file(mr->dst, key, path, NULL);
    unlink(path);
    if (!rc) (*copied)++;
    return rc;
}

int ferry__mirror_copy_shard(mirror *mr, const sh_doc *m, const void *text, size_t n)
{
    int rc = FERRY_OK;
    for (uint32_t r = 0; r < m->world && !rc; r++) {
        rc = copy_object(mr, m, r, SH_DELTA, &mr->info->objects_copied);
        if (!rc) rc = copy_object(mr, m, r, SH_ANCHOR, &mr->info->objects_copied);
    }
    if (rc) return rc;
    char key[FS_KEY_CAP];
    if (m->index_form) { /* the layout record it names, checked against its digest */
        ferry__shard_key_layout(key, mr->run, m->layout_sha);
        void *d = NULL;
        size_t ln = 0;
        uint8_t sha[32];
        if (!(rc = ferry_store_get_max(mr->src, key, SH_MANIFEST_MAX, &d, &ln, NULL)) && !(rc = ferry__sha256(d, ln, sha))) {
            mr->cnt.bytes += ln;
            if (memcmp(sha, m->layout_sha, 32)) rc = ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: its SHA-256 is not the manifest's", key);
            else rc = ferry_store_put(mr->dst, key, d, ln, NULL);
        }
        ferry_free(d);
        if (rc) return rc;
    }
    ferry__sync_key_version(key, mr->run, m->version, m->id, FS_OBJ_MANIFEST);
    return ferry_store_put(mr->dst, key, text, n, NULL);
}

int ferry__mirror_copy_comp(mirror *mr, const sh_doc *cm)
{
    int rc = FERRY_OK;
    for (uint32_t r = 0; r < cm->world && !rc; r++) rc = copy_object(mr, cm, r, SH_DELTA, &mr->info->compactions_copied);
    return rc;
}
