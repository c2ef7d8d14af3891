/* Compacted deltas of a mirrored run (docs/MIRROR.md, "Compacted deltas").
 * SRC's compaction index is copied byte for byte, like every record, so a
 * signed index stays signed; before it is written, every compacted delta
 * it names whose target version DST holds is copied and verified (size,
 * SHA-256 when given, patch checksum, base and target hashes against the
 * entry, target hash against DST's manifest of that version).  Entries
 * whose target DST does not hold (below what was mirrored, or dropped by
 * DST's GC) are left without their object: an island that tries one meets
 * a clean NOT_FOUND and takes another path, as after the origin's GC.
 * A sharded compaction's rank objects are copied likewise (mirror_shard.c),
 * each checked against its tile index and the root the entry gives. */
#include "mirror_impl.h"

/* Copies the compacted delta of entry c if DST holds its target version;
 * *copied / *reused count what happened. */
static int copy_entry(mirror *mr, const fs_compaction *c)
{
    fs_manifest to;
    int rc = ferry__sync_manifest_read(mr->dst, mr->run, mr->o->keys, c->to, c->to_id, NULL, &to);
    if (rc == FERRY_ERR_STORE_NOT_FOUND) { /* not mirrored (or gone): no object either */
        ferry__clear_error();
        return FERRY_OK;
    }
    if (rc) return rc;
    char key[FS_KEY_CAP];
    ferry__sync_key_compact(key, mr->run, c->from, c->to, c->id);
    if (memcmp(to.model_hash, c->target_hash, 16))
        return ferry__fail(FERRY_ERR_SYNC_CORRUPT, "%s: the index gives a target hash that is not version %llu's", key,
                           (unsigned long long)c->to);
    return ferry__mirror_copy_patch(mr, key, c->bytes, c->has_sha, c->sha, c->base_hash, c->target_hash,
                             &mr->info->compactions_copied);
}

/* Copies the rank objects of sharded entry c (its c->world objects obj[])
 * if DST holds its target version, checked against DST's manifest of it
 * (ferry__shard_comp_check) and each verified as a rank object of the
 * index form (its tile index against the entry's root, each tile against
 * its leaf).  The entry needs no SHA-256: the signed index binds each
 * object by its root. */
static int copy_sharded(mirror *mr, const fs_compaction *c, const fs_cobj *obj)
{
    sh_doc to = {0}, cm = {0};
    fs_count cnt = {0};
    int rc = ferry__shard_manifest_read_lc(mr->dst, mr->run, mr->o->keys, c->to, c->to_id, &cnt, NULL, &to);
    if (rc == FERRY_ERR_STORE_NOT_FOUND) { /* not mirrored (or gone): no objects either */
        ferry__clear_error();
        return FERRY_OK;
    }
    if (!rc) rc = ferry__shard_comp_check(mr->run, &to, c, obj);
    if (!rc) rc = ferry__shard_comp_view(&to, c, obj, &cm);
    if (!rc) rc = ferry__mirror_copy_comp(mr, &cm);
    ferry__shard_comp_view_release(&cm);
    ferry__shard_doc_release(&to);
    return rc;
}

/* Every object of entry c (obj[]: its rank objects when sharded) is in DST
 * with the size the entry gives. */
static bool entry_in_dst(mirror *mr, const fs_compaction *c, const fs_cobj *obj)
{
    char key[FS_KEY_CAP];
    if (!c->world) {
        ferry__sync_key_compact(key, mr->run, c->from, c->to, c->id);
        return ferry__mirror_in_dst(mr, key, c->bytes);
    }
    for (uint32_t r = 0; r < c->world; r++) {
        ferry__sync_key_compact_rank(key, mr->run, c->from, c->to, c->id, r);
        if (!ferry__mirror_in_dst(mr, key, obj[r].bytes)) return false;
    }
    return true;
}

/* Writes the index's bytes to DST by compare-and-swap against the etag
 * read (etag "" = DST had none); another mirror process that wrote the
 * same bytes meanwhile is success. */
static int swap_index(mirror *mr, const char *key, const void *text, size_t n, const char *etag)
{
    int rc = ferry_store_cas(mr->dst, key, etag[0] ? etag : NULL, text, n, NULL);
    if (rc != FERRY_ERR_STORE_CONFLICT) return rc;
    ferry__clear_error();
    void *now = NULL;
    size_t nn = 0;
    rc = ferry_store_get_max(mr->dst, key, FS_JSON_MAX, &now, &nn, NULL);
    bool same = !rc && nn == n && !memcmp(now, text, n);
    ferry_free(now);
    if (same) return FERRY_OK;
    ferry__clear_error();
    return ferry__fail(FERRY_ERR_SYNC_CONFLICT, "%s: changed in %s during the copy (another writer): not replaced", key,
                       ferry_store_url(mr->dst));
}

int ferry__mirror_compactions(mirror *mr)
{
    char key[FS_KEY_CAP];
    ferry__sync_key_index(key, mr->run);
    void *text = NULL, *have = NULL;
    size_t n = 0, body = 0, nh = 0;
    int rc = ferry__mirror_get_record(mr, key, FS_JSON_MAX, &text, &n, &body);
    if (rc == FERRY_ERR_STORE_NOT_FOUND) { /* never compacted */
        ferry__clear_error();
        return FERRY_OK;
    }
    if (rc) return rc;
    ferry_store_stat ds = {0};
    rc = ferry_store_get_max(mr->dst, key, FS_JSON_MAX, &have, &nh, &ds);
    if (rc == FERRY_ERR_STORE_NOT_FOUND || rc == FERRY_ERR_LIMIT) { /* none, or not a record: replaced */
        ferry__clear_error();
        if (rc == FERRY_ERR_STORE_NOT_FOUND) ds.etag[0] = 0;
        rc = FERRY_OK;
    }
    bool same = !rc && have && nh == n && !memcmp(have, text, n);
    ferry_free(have);
    fs_index ix = {0};
    if (rc || (rc = ferry__sync_index_parse(mr->run, key, text, body, &ix))) goto out;
    /* DST's index the same bytes: only the objects it lacks (copied with
       the index before DST held their target, or by a mirror older than
       sharded compactions); the index is left as it is */
    for (size_t i = 0; i < ix.n && !rc; i++) {
        if (same && entry_in_dst(mr, &ix.c[i], ix.obj + ix.c[i].obj0)) continue;
        if (ix.c[i].world)
            rc = copy_sharded(mr, &ix.c[i], ix.obj + ix.c[i].obj0);
        else if (ferry__sign_keys_enforce(mr->o->keys) && !ix.c[i].has_sha)
            rc = ferry__fail(FERRY_ERR_SIG_DIGEST, "%s: entry %zu gives no SHA-256", key, i);
        else
            rc = copy_entry(mr, &ix.c[i]);
    }
    if (!rc && !same) rc = swap_index(mr, key, text, n, ds.etag);
    if (!rc && !same) mr->info->index_copied = 1;
out:
    ferry__sync_index_release(&ix);
    ferry_free(text);
    return rc;
}
