/* The consumer's record: which (island, seq) are resolved (admitted or
 * dropped), the run's counters, and the highest trainer version used; and
 * its on-store form, the cursor object RUN/dock/cursor (docs/DOCK.md,
 * "Cursor").  No I/O here.
 *
 * Why ranges rather than one high-water mark per island: take admits in
 * key order, which is version order, and a policy may leave a lower seq of
 * a newer version for later (sequential mode) or admit a newer version's
 * seq before an older straggler arrives.  A high-water mark would turn such
 * a late seq into a "duplicate" and lose it; a set of ranges records exactly
 * what was resolved and stays one range per island in the usual case.
 *
 * Cursor object (little-endian):
 *     0   4  magic "FDCU"
 *     4   2  format: 1 unsigned, 2 signed (the signature follows the checksum)
 *     6   2  run id length
 *     8  64  run id, zero-padded
 *    72   8  writer nonce (random per handle)
 *    80   8  commits
 *    88   8  top: highest trainer version committed + 1 (0 = none)
 *    96   4  counter count C (DK_C_COUNT)
 *   100   4  island count N (<= FERRY_DOCK_MAX_ISLANDS)
 *   104  8C  counters
 *            N x { u32 island id, u32 n (1..FERRY_DOCK_MAX_RANGES),
 *                  n x { u64 lo, u64 hi } }  ids ascending, ranges ascending,
 *                  disjoint and not adjacent
 *         16  XXH3-128 of every byte before (canonical)
 *   format 2 only:
 *         72  signing key id (8) and Ed25519 signature over every byte
 *             before, in the domain "ferry-cursor" (lib/sign/sig.h): the
 *             consumer's signing key, a publisher's (the trainer's)
 *
 * Why signed: the cursor is the run's record of what was consumed.  A store
 * writer who could rewrite it would re-admit replays (ranges removed),
 * make honest new batches count as duplicates (ranges added) or fail every
 * take (a higher trainer version).  The checksum only catches damage. */
#include "dock_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include "xxh.h"
#include "sign/sig.h"

#define CUR_FIXED 104u
#define CUR_SUM 16u
#define CUR_FORMAT_PLAIN 1u
#define CUR_FORMAT_SIGNED 2u
static const char k_cmagic[4] = {'F', 'D', 'C', 'U'};

void ferry__dock_state_release(dk_state *s)
{
    if (!s) return;
    free(s->islands);
    memset(s, 0, sizeof *s);
}

int ferry__dock_state_clone(const dk_state *src, dk_state *dst)
{
    *dst = *src;
    dst->islands = NULL;
    dst->cap = src->n_islands;
    if (src->n_islands) {
        dst->islands = ferry__malloc(src->n_islands * sizeof *dst->islands);
        if (!dst->islands) {
            memset(dst, 0, sizeof *dst);
            return FERRY_ERR_NOMEM;
        }
        memcpy(dst->islands, src->islands, src->n_islands * sizeof *dst->islands);
    }
    return FERRY_OK;
}

/* Index of island id, or of where it would go (*found = false). */
static size_t find_island(const dk_state *s, uint32_t id, bool *found)
{
    size_t lo = 0, hi = s->n_islands;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->islands[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    *found = lo < s->n_islands && s->islands[lo].id == id;
    return lo;
}

/* First range whose hi >= seq (n if none). */
static uint32_t find_range(const dk_island *is, uint64_t seq)
{
    uint32_t lo = 0, hi = is->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (is->r[mid].hi < seq) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

bool ferry__dock_state_has(const dk_state *s, uint32_t island, uint64_t seq)
{
    bool found;
    size_t i = find_island(s, island, &found);
    if (!found) return false;
    const dk_island *is = &s->islands[i];
    uint32_t j = find_range(is, seq);
    return j < is->n && is->r[j].lo <= seq;
}

bool ferry__dock_state_max_seq(const dk_state *s, uint32_t island, uint64_t *seq)
{
    bool found;
    size_t i = find_island(s, island, &found);
    if (!found || !s->islands[i].n) return false;
    *seq = s->islands[i].r[s->islands[i].n - 1].hi;
    return true;
}

bool ferry__dock_state_covers(const dk_state *now, const dk_state *held, char *why, size_t cap)
{
    if (now->top_tv < held->top_tv) {
        snprintf(why, cap, "its highest trainer version went down (%" PRIu64 " after %" PRIu64 ")", now->top_tv, held->top_tv);
        return false;
    }
    for (size_t i = 0; i < DK_C_COUNT; i++)
        if (now->counters[i] < held->counters[i]) {
            snprintf(why, cap, "its counter %zu went down (%" PRIu64 " after %" PRIu64 ")", i, now->counters[i], held->counters[i]);
            return false;
        }
    for (size_t i = 0; i < held->n_islands; i++) {
        const dk_island *h = &held->islands[i];
        bool found;
        size_t k = find_island(now, h->id, &found);
        for (uint32_t j = 0; j < h->n; j++) {
            uint32_t r = found ? find_range(&now->islands[k], h->r[j].lo) : 0;
            if (!found || r == now->islands[k].n || now->islands[k].r[r].lo > h->r[j].lo ||
                now->islands[k].r[r].hi < h->r[j].hi) {
                snprintf(why, cap, "it lost island %" PRIu32 "'s seqs %" PRIu64 "..%" PRIu64 ", which were taken or dropped", h->id,
                         h->r[j].lo, h->r[j].hi);
                return false;
            }
        }
    }
    return true;
}

int ferry__dock_state_mark(dk_state *s, uint32_t island, uint64_t seq, int *fresh, uint64_t *gap_lo,
                  uint64_t *gap_n)
{
    *fresh = 0;
    *gap_lo = *gap_n = 0;
    bool found;
    size_t i = find_island(s, island, &found);
    if (!found) {
        if (s->n_islands >= FERRY_DOCK_MAX_ISLANDS)
            return ferry__fail(FERRY_ERR_LIMIT, "dock: more than %d distinct islands in one run (island %" PRIu32 ")",
                               FERRY_DOCK_MAX_ISLANDS, island);
        if (ferry__grow((void **)&s->islands, &s->cap, s->n_islands + 1, sizeof *s->islands)) return FERRY_ERR_NOMEM;
        memmove(&s->islands[i + 1], &s->islands[i], (s->n_islands - i) * sizeof *s->islands);
        s->n_islands++;
        s->islands[i].id = island;
        s->islands[i].n = 1;
        s->islands[i].r[0] = (dk_range){seq, seq};
        *fresh = 1;
        return FERRY_OK;
    }
    dk_island *is = &s->islands[i];
    uint32_t j = find_range(is, seq);
    if (j < is->n && is->r[j].lo <= seq) return FERRY_OK; /* already resolved */
    *fresh = 1;
    /* seq lies strictly between r[j-1].hi and r[j].lo: extend a neighbour
     * when adjacent (overflow-safe: seq > r[j-1].hi and seq < r[j].lo). */
    bool left = j > 0 && is->r[j - 1].hi + 1 == seq;
    bool right = j < is->n && seq + 1 == is->r[j].lo;
    if (left && right) {
        is->r[j - 1].hi = is->r[j].hi;
        memmove(&is->r[j], &is->r[j + 1], (is->n - j - 1) * sizeof is->r[0]);
        is->n--;
        return FERRY_OK;
    }
    if (left) { is->r[j - 1].hi = seq; return FERRY_OK; }
    if (right) { is->r[j].lo = seq; return FERRY_OK; }
    dk_range tmp[FERRY_DOCK_MAX_RANGES + 1];
    memcpy(tmp, is->r, j * sizeof tmp[0]);
    tmp[j] = (dk_range){seq, seq};
    memcpy(&tmp[j + 1], &is->r[j], (is->n - j) * sizeof tmp[0]);
    uint32_t n = is->n + 1;
    if (n > FERRY_DOCK_MAX_RANGES) {
        /* Out of room: give up the narrowest hole.  Its seqs count as
         * resolved from now on (a late batch there reads as a duplicate),
         * which is the safe side of at-most-once; the caller reports it. */
        uint32_t best = 0;
        uint64_t best_gap = UINT64_MAX;
        for (uint32_t k = 0; k + 1 < n; k++) {
            uint64_t g = tmp[k + 1].lo - tmp[k].hi - 1;
            if (g < best_gap) best_gap = g, best = k;
        }
        *gap_lo = tmp[best].hi + 1;
        *gap_n = best_gap;
        tmp[best].hi = tmp[best + 1].hi;
        memmove(&tmp[best + 1], &tmp[best + 2], (n - best - 2) * sizeof tmp[0]);
        n--;
    }
    memcpy(is->r, tmp, n * sizeof tmp[0]);
    is->n = n;
    return FERRY_OK;
}

int ferry__dock_cursor_encode(const dk_state *s, const char *run, uint64_t nonce, const ferry_keys *k, ferry_buf *out)
{
    bool sign = ferry_keys_can_sign(k);
    uint8_t fixed[CUR_FIXED];
    memset(fixed, 0, sizeof fixed);
    memcpy(fixed, k_cmagic, 4);
    ferry__put16(fixed + 4, sign ? CUR_FORMAT_SIGNED : CUR_FORMAT_PLAIN);
    size_t rl = strlen(run);
    ferry__put16(fixed + 6, (uint16_t)rl);
    memcpy(fixed + 8, run, rl);
    ferry__put64(fixed + 72, nonce);
    ferry__put64(fixed + 80, s->commits);
    ferry__put64(fixed + 88, s->top_tv);
    ferry__put32(fixed + 96, DK_C_COUNT);
    ferry__put32(fixed + 100, (uint32_t)s->n_islands);
    out->size = 0;
    int rc = ferry__buf_append(out, fixed, sizeof fixed);
    for (size_t i = 0; !rc && i < DK_C_COUNT; i++) {
        uint8_t v[8];
        ferry__put64(v, s->counters[i]);
        rc = ferry__buf_append(out, v, 8);
    }
    for (size_t i = 0; !rc && i < s->n_islands; i++) {
        const dk_island *is = &s->islands[i];
        uint8_t h[8];
        ferry__put32(h, is->id);
        ferry__put32(h + 4, is->n);
        rc = ferry__buf_append(out, h, 8);
        for (uint32_t j = 0; !rc && j < is->n; j++) {
            uint8_t r[16];
            ferry__put64(r, is->r[j].lo);
            ferry__put64(r + 8, is->r[j].hi);
            rc = ferry__buf_append(out, r, 16);
        }
    }
    if (rc) return rc;
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(out->data, out->size));
    rc = ferry__buf_append(out, c.digest, 16);
    if (rc || !sign) return rc;
    uint8_t raw[FS_SIG_RAW];
    rc = ferry__sign_bytes(k, FS_DOM_CURSOR, out->data, out->size, raw);
    if (rc) return ferry__context(rc, "dock '%s': signing the cursor", run);
    return ferry__buf_append(out, raw, sizeof raw);
}

/* The message is formatted before the state is released: its arguments
 * may point into the state. */
#define BAD(...) (ferry__fail(FERRY_ERR_DOCK_CURSOR, __VA_ARGS__), ferry__dock_state_release(out), FERRY_ERR_DOCK_CURSOR)

/* Hostile-input rules: the checksum is verified before any count is
 * believed, and every count is checked against the bytes left before
 * anything is allocated. */
int ferry__dock_cursor_decode(const void *data, size_t size, const char *run, dk_state *out, const uint8_t **sig)
{
    memset(out, 0, sizeof *out);
    *sig = NULL;
    const uint8_t *b = data;
    if (size < CUR_FIXED + CUR_SUM) return BAD("cursor of %zu bytes, shorter than its fixed part", size);
    if (memcmp(b, k_cmagic, 4)) return BAD("cursor magic is not \"FDCU\"");
    /* the format says where the checksum is: last, or before the signature */
    unsigned format = ferry__le16(b + 4);
    if (format != CUR_FORMAT_PLAIN && format != CUR_FORMAT_SIGNED)
        return BAD("cursor format %u (this build reads %u and %u)", format, CUR_FORMAT_PLAIN, CUR_FORMAT_SIGNED);
    size_t tail = format == CUR_FORMAT_SIGNED ? FS_SIG_RAW : 0;
    if (size < CUR_FIXED + CUR_SUM + tail) return BAD("signed cursor of %zu bytes, shorter than its fixed part and signature", size);
    size -= tail; /* from here on, size ends at the checksum */
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(b, size - CUR_SUM));
    if (memcmp(c.digest, b + size - CUR_SUM, CUR_SUM)) return BAD("cursor checksum does not match");
    unsigned rl = ferry__le16(b + 6);
    if (rl < 1 || rl > FERRY_DOCK_RUN_MAX) return BAD("cursor run id length %u", rl);
    for (unsigned i = rl; i < FERRY_DOCK_RUN_MAX; i++)
        if (b[8 + i]) return BAD("cursor run id padding byte %u is not zero", i);
    if (strlen(run) != rl || memcmp(b + 8, run, rl))
        return BAD("cursor of run '%.*s', not of '%s'", (int)rl, (const char *)(b + 8), run);
    /* a cursor from before the signature counters reads with them at 0 */
    uint32_t nc = ferry__le32(b + 96);
    if (nc != DK_C_COUNT && nc != DK_C_COUNT_V1) return BAD("cursor has %" PRIu32 " counters, want %d", nc, DK_C_COUNT);
    uint32_t ni = ferry__le32(b + 100);
    if (ni > FERRY_DOCK_MAX_ISLANDS) return BAD("cursor names %" PRIu32 " islands (at most %d)", ni, FERRY_DOCK_MAX_ISLANDS);
    size_t end = size - CUR_SUM, pos = CUR_FIXED;
    if (end - pos < (size_t)nc * 8) return BAD("cursor truncated in its counters");
    /* Each island takes at least 8 + 16 bytes: reject a count the bytes
     * cannot hold before allocating for it. */
    if ((end - pos - (size_t)nc * 8) / 24 < ni) return BAD("cursor names %" PRIu32 " islands but is too short for them", ni);
    out->commits = ferry__le64(b + 80);
    out->top_tv = ferry__le64(b + 88);
    for (size_t i = 0; i < nc; i++, pos += 8) out->counters[i] = ferry__le64(b + pos);
    if (ni) {
        out->islands = ferry__calloc(ni, sizeof *out->islands);
        if (!out->islands) return FERRY_ERR_NOMEM;
        out->cap = ni;
    }
    for (uint32_t i = 0; i < ni; i++) {
        if (end - pos < 8) return BAD("cursor truncated at island %" PRIu32, i);
        dk_island *is = &out->islands[i];
        is->id = ferry__le32(b + pos);
        is->n = ferry__le32(b + pos + 4);
        pos += 8;
        if (i && is->id <= out->islands[i - 1].id) return BAD("cursor islands not in ascending order at %" PRIu32, i);
        if (is->n < 1 || is->n > FERRY_DOCK_MAX_RANGES) return BAD("cursor island %" PRIu32 ": %" PRIu32 " ranges", is->id, is->n);
        if ((end - pos) / 16 < is->n) return BAD("cursor truncated in island %" PRIu32 "'s ranges", is->id);
        for (uint32_t j = 0; j < is->n; j++, pos += 16) {
            is->r[j].lo = ferry__le64(b + pos);
            is->r[j].hi = ferry__le64(b + pos + 8);
            if (is->r[j].lo > is->r[j].hi) return BAD("cursor island %" PRIu32 ": range %" PRIu32 " has lo > hi", is->id, j);
            /* disjoint and not adjacent (they would have been merged) */
            if (j && (is->r[j - 1].hi == UINT64_MAX || is->r[j].lo <= is->r[j - 1].hi + 1))
                return BAD("cursor island %" PRIu32 ": ranges %" PRIu32 " and %" PRIu32 " overlap, touch or are unsorted", is->id, j - 1, j);
        }
        out->n_islands = i + 1;
    }
    if (pos != end) return BAD("cursor has %zu bytes after its last island", end - pos);
    if (tail) *sig = b + size;
    return FERRY_OK;
}
