/* The consumer's memory of objects it judged and left in place (a
 * corrupt-looking object in its grace period): key, etag and size, so that
 * a later listing that shows the object unchanged needs no read of it.
 * Without it every pass read every such object again: a store writer who
 * planted 20 000 of them made each pass read (and on file://, hash) them
 * all (issue 23 item 10).
 *
 * Open addressing over hashes of the key and the etag, seeded per handle
 * so that nobody can make two keys collide on purpose; a collision would
 * only make an object be read once more or once less in its grace period.
 * Bounded: when half the slots are used the table is emptied, and the
 * objects it held are read once more. */
#include "dock_impl.h"

#include <stdlib.h>
#include "xxh.h"

static uint64_t key_hash(const dk_memo *m, const char *key)
{
    uint64_t h = XXH3_64bits_withSeed(key, strlen(key), m->seed);
    return h ? h : 1; /* 0 marks an empty slot */
}

static uint64_t etag_hash(const dk_memo *m, const ferry_store_stat *st)
{
    return XXH3_64bits_withSeed(st->etag, strlen(st->etag), m->seed ^ st->size);
}

void ferry__dock_memo_release(dk_memo *m)
{
    free(m->slot);
    m->slot = NULL;
    m->used = 0;
}

/* The slot of key (h), or the empty one where it would go. */
static dk_seen *slot_of(const dk_memo *m, uint64_t h)
{
    for (size_t i = (size_t)h & (DK_MEMO_SLOTS - 1);; i = (i + 1) & (DK_MEMO_SLOTS - 1))
        if (!m->slot[i].key_h || m->slot[i].key_h == h) return &m->slot[i];
}

dk_seen *ferry__dock_memo_get(const dk_memo *m, const char *key)
{
    if (!m->slot) return NULL;
    dk_seen *s = slot_of(m, key_hash(m, key));
    return s->key_h ? s : NULL;
}

dk_seen *ferry__dock_memo_put(dk_memo *m, const char *key, const ferry_store_stat *st, uint64_t now_ms)
{
    if (!m->slot && !(m->slot = ferry__calloc(DK_MEMO_SLOTS, sizeof *m->slot))) return NULL;
    uint64_t h = key_hash(m, key);
    dk_seen *s = slot_of(m, h);
    if (!s->key_h) {
        if (m->used == DK_MEMO_SLOTS / 2) { /* full: forget everything */
            memset(m->slot, 0, DK_MEMO_SLOTS * sizeof *m->slot);
            m->used = 0;
            s = slot_of(m, h);
        }
        m->used++;
        s->key_h = h;
    }
    s->etag_h = etag_hash(m, st);
    s->size = st->size;
    s->first_ms = now_ms;
    return s;
}

bool ferry__dock_memo_same(const dk_memo *m, const dk_seen *s, const ferry_store_stat *st)
{
    return s->size == st->size && s->etag_h == etag_hash(m, st);
}
