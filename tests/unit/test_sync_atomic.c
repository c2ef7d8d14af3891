/* Second security review (issue 23), the attacks on what an island holds
 * and on the writers' compare-and-swap, each a regression test:
 *  - item 2: a memory-mode route of several steps whose last object is bad
 *    leaves the caller's buffers bit-identical to what they held before the
 *    sync (not the intermediate version the earlier steps reached), and the
 *    subscriber says so;
 *  - item 4: a HEAD put back to an older (validly written) version is
 *    refused by a memory-mode island restarted with the version it held,
 *    by one that carries the floor of a previous handle over, and by a
 *    sharded island with one store;
 *  - item 14: six well-formed compaction index entries whose objects are
 *    absent cost one attempt, not all of them: the chain is taken;
 *  - the one compare-and-swap loop: retries with a growing wait, HEAD put
 *    back under a sharded commit reported as BACKWARDS, another version as
 *    CONFLICT, the same for GC and compaction through the index helper.
 * Records are edited as a store writer would: with the library's own
 * serialisers, or by putting back bytes read earlier. */
#ifdef FERRY_NO_NET
#include "helpers.h"
NOT_BUILT_MAIN("sync layer not built (NO_NET=1)")
#else
#include <stdint.h>
#include <unistd.h>

#include "check.h"
#include "ferry_shard.h"
#include "sync/sync_impl.h"
#include "sync_fixture.h"

#define NW (1u << 16) /* words of "w": a few change per version */
#define NB 512u       /* words of "b": every one changes (carried whole) */

static void fill_v(uint16_t *w, uint16_t *b, int v)
{
    for (size_t i = 0; i < NW; i++) w[i] = (uint16_t)(0x3C00 + (i * 2654435761u >> 20) % 512);
    for (int k = 1; k <= v; k++)
        for (int j = 0; j < 60; j++) w[(size_t)(k * 977 + j * 131) % NW] ^= (uint16_t)(k + 1);
    for (size_t i = 0; i < NB; i++) b[i] = (uint16_t)(0x3C00 + (uint32_t)v * 37u + (uint32_t)i * 3u);
}

/* A model over the buffers w, b (borrowed: the caller's own memory). */
static ferry_model *borrow(uint16_t *w, uint16_t *b)
{
    ferry_model *m = NULL;
    uint64_t sw[1] = {NW}, sb[1] = {NB};
    if (ferry_model_create(&m) || ferry_model_add(m, "b", FERRY_BF16, 1, sb, b, NB * 2, FERRY_ADD_BORROW) ||
        ferry_model_add(m, "w", FERRY_BF16, 1, sw, w, NW * 2, FERRY_ADD_BORROW)) {
        ferry_model_free(m);
        return NULL;
    }
    return m;
}

static uint16_t g_w[NW], g_b[NB];

static int publish_range(ferry_store *st, const char *run, int from, int to)
{
    ferry_publisher *pub = NULL;
    ferry_publisher_options po = {.anchor_every = 100};
    int rc = ferry_publisher_open(st, run, &po, &pub);
    for (int v = from; !rc && v <= to; v++) {
        fill_v(g_w, g_b, v);
        ferry_model *m = borrow(g_w, g_b);
        uint64_t got = 0;
        rc = m ? ferry_publish(pub, m, &got) : FERRY_ERR_NOMEM;
        if (!rc && got != (uint64_t)v) rc = FERRY_ERR_INTERNAL;
        ferry_model_free(m);
    }
    if (rc) fprintf(stderr, "publish: %s\n", ferry_last_error());
    ferry_publisher_free(pub);
    return rc;
}

static bool holds_v(const uint16_t *w, const uint16_t *b, int v)
{
    static uint16_t ew[NW], eb[NB];
    fill_v(ew, eb, v);
    return !memcmp(w, ew, sizeof ew) && !memcmp(b, eb, sizeof eb);
}

static void hash_v(int v, uint8_t out[16])
{
    static uint16_t w[NW], b[NB];
    fill_v(w, b, v);
    ferry_model *m = borrow(w, b);
    if (!m || ferry_model_hash(m, out)) memset(out, 0, 16);
    ferry_model_free(m);
}

/* The key of version v's object of kind obj (FS_OBJ_*), found from HEAD. */
static int version_key(ferry_store *st, const char *run, uint64_t v, int obj, char key[FS_KEY_CAP])
{
    fs_head h;
    fs_manifest m;
    int rc = ferry__sync_head_read(st, run, NULL, NULL, &h, NULL);
    if (!rc) rc = ferry__sync_find_manifest(st, run, NULL, &h, v, NULL, &m);
    if (!rc) ferry__sync_key_version(key, run, v, m.id, obj);
    return rc;
}

/* Flips one byte in the middle of an object (same size: only its
 * contents tell). */
static int flip(ferry_store *st, const char *key)
{
    void *d = NULL;
    size_t n = 0;
    int rc = ferry_store_get(st, key, &d, &n, NULL);
    if (!rc) {
        ((uint8_t *)d)[n / 2] ^= 0x40;
        rc = ferry_store_put(st, key, d, n, NULL);
    }
    ferry_free(d);
    return rc;
}

static int get_bytes(ferry_store *st, const char *key, void **d, size_t *n) { return ferry_store_get(st, key, d, n, NULL); }

/* ---- item 2: the whole route or nothing ---------------------------------- */

/* Versions 1..5, a compacted delta 1..3, the island at 1 in memory mode;
 * version 5's delta is bad.  Every path to 5 needs it: the first attempt
 * applies the compacted delta and delta 4 in place before delta 5 fails,
 * and then no path is left.  The buffers must be version 1 again, bit for
 * bit ("b", carried whole by every delta, included), and the subscriber
 * must say 1.  Once the delta is whole again the same handle gets to 5. */
static void t_route_undone(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    CHECK_OK(publish_range(st, "r", 1, 5));
    ferry_compact_options co = {.from = 1, .to = 3};
    ferry_compaction_info ci;
    CHECK_OK(ferry_compact(st, "r", &co, &ci));

    static uint16_t w[NW], b[NB], w0[NW], b0[NB];
    memset(w, 0, sizeof w);
    memset(b, 0, sizeof b);
    ferry_model *mine = borrow(w, b);
    ferry_subscriber_options so = {.model = mine};
    ferry_subscriber *s = NULL;
    CHECK_OK(ferry_subscriber_open(st, "r", &so, &s));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 1, NULL));
    CHECK(ferry_subscriber_version(s) == 1 && holds_v(w, b, 1));
    memcpy(w0, w, sizeof w);
    memcpy(b0, b, sizeof b);

    char k5[FS_KEY_CAP];
    CHECK_OK(version_key(st, "r", 5, FS_OBJ_DELTA, k5));
    void *good = NULL;
    size_t ngood = 0;
    CHECK_OK(get_bytes(st, k5, &good, &ngood));
    CHECK_OK(flip(st, k5));

    ferry_subscriber_stats before, after;
    ferry_subscriber_get_stats(s, &before);
    ferry_sync_info info;
    int rc = ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info);
    CHECK(rc == FERRY_ERR_SYNC_NO_PATH);
    ferry_subscriber_get_stats(s, &after);
    /* steps were applied in place before the failure ... */
    CHECK(after.steps - before.steps >= 2);
    CHECK(strstr(after.last_rejection, k5) != NULL);
    /* ... and undone: the buffers are what they were, and said to be */
    CHECK(!memcmp(w, w0, sizeof w) && !memcmp(b, b0, sizeof b));
    CHECK(ferry_subscriber_version(s) == 1 && info.to_version == 1);
    uint8_t h1[16], hs[16], hm[16];
    hash_v(1, h1);
    CHECK_OK(ferry_subscriber_hash(s, hs));
    CHECK_OK(ferry_model_hash(mine, hm));
    CHECK(!memcmp(hs, h1, 16) && !memcmp(hm, h1, 16));

    /* whole again (a handle remembers what it rejected: a new one): the
       buffers are believed to be version 1, and go on from there */
    ferry_subscriber_free(s);
    CHECK_OK(ferry_store_put(st, k5, good, ngood, NULL));
    ferry_subscriber_options so1 = {.model = mine, .model_version = 1};
    CHECK_OK(ferry_subscriber_open(st, "r", &so1, &s));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
    CHECK(ferry_subscriber_version(s) == 5 && holds_v(w, b, 5) && !strstr(info.path, "anchor"));
    ferry_free(good);
    ferry_subscriber_free(s);
    ferry_model_free(mine);
    ferry_store_free(st);
}

/* The same with the failure on the last step of a chain only (no
 * compaction): chain 2..5 from 2, delta 5 bad, nothing else to try. */
static void t_chain_undone(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    CHECK_OK(publish_range(st, "c", 1, 5));
    static uint16_t w[NW], b[NB];
    fill_v(w, b, 2);
    ferry_model *mine = borrow(w, b);
    ferry_subscriber_options so = {.model = mine, .model_version = 2, .no_compactions = 1};
    ferry_subscriber *s = NULL;
    CHECK_OK(ferry_subscriber_open(st, "c", &so, &s));
    char k5[FS_KEY_CAP];
    CHECK_OK(version_key(st, "c", 5, FS_OBJ_DELTA, k5));
    CHECK_OK(flip(st, k5));
    CHECK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL) != 0);
    CHECK(holds_v(w, b, 2) && ferry_subscriber_version(s) == 2);
    ferry_subscriber_free(s);
    ferry_model_free(mine);
    ferry_store_free(st);
}

/* ---- item 4: no way back --------------------------------------------------- */

/* Versions 1..5; HEAD's bytes at 3 kept and put back after 5 (a store
 * writer, or a restored backup: still a valid, published HEAD). */
static void t_restart_floor(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    CHECK_OK(publish_range(st, "f", 1, 3));
    void *head3 = NULL;
    size_t n3 = 0;
    CHECK_OK(get_bytes(st, "f/HEAD", &head3, &n3));
    CHECK_OK(publish_range(st, "f", 4, 5));

    /* an island at 5 ... */
    static uint16_t w[NW], b[NB];
    ferry_model *mine = borrow(w, b);
    ferry_subscriber_options so = {.model = mine};
    ferry_subscriber *a = NULL;
    CHECK_OK(ferry_subscriber_open(st, "f", &so, &a));
    CHECK_OK(ferry_subscriber_sync(a, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(ferry_subscriber_version(a) == 5 && ferry_subscriber_min_head(a, 0) == 5);
    CHECK_OK(ferry_store_put(st, "f/HEAD", head3, n3, NULL));

    /* ... restarted, saying it holds 5: refused, untouched */
    ferry_subscriber_options so5 = {.model = mine, .model_version = 5};
    ferry_subscriber *r = NULL;
    CHECK_OK(ferry_subscriber_open(st, "f", &so5, &r));
    CHECK(ferry_subscriber_min_head(r, 0) == 5);
    CHECK_RC(ferry_subscriber_sync(r, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_BACKWARDS);
    CHECK(holds_v(w, b, 5));
    ferry_subscriber_free(r);

    /* ... with new buffers (nothing to claim), carrying the old handle's
       floor over: refused, the new buffers untouched */
    static uint16_t w2[NW], b2[NB];
    memset(w2, 0x11, sizeof w2);
    memset(b2, 0x11, sizeof b2);
    ferry_model *fresh = borrow(w2, b2);
    ferry_subscriber_options sof = {.model = fresh};
    ferry_subscriber *c = NULL;
    CHECK_OK(ferry_subscriber_open(st, "f", &sof, &c));
    CHECK(ferry_subscriber_min_head(c, ferry_subscriber_min_head(a, 0)) == 5);
    CHECK_RC(ferry_subscriber_sync(c, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_BACKWARDS);
    CHECK(ferry_subscriber_version(c) == 0 && w2[0] == 0x1111 && b2[NB - 1] == 0x1111);
    /* the old handle refuses too (it always did) */
    CHECK_RC(ferry_subscriber_sync(a, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_BACKWARDS);
    CHECK(holds_v(w, b, 5) && ferry_subscriber_version(a) == 5);
    /* a fresh island that never held anything takes HEAD as it is */
    ferry_subscriber_free(c);
    CHECK_OK(ferry_subscriber_open(st, "f", &sof, &c));
    CHECK_OK(ferry_subscriber_sync(c, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(ferry_subscriber_version(c) == 3 && holds_v(w2, b2, 3));
    ferry_subscriber_free(c);
    ferry_model_free(fresh);
    ferry_subscriber_free(a);
    ferry_model_free(mine);
    ferry_free(head3);
    ferry_store_free(st);
}

/* ---- sharded: one rank publishes, one island pulls the whole tensor ---- */

#define SR 128u
#define SC 256u

static uint16_t g_t[SR * SC];

static void fill_t(int v)
{
    for (size_t i = 0; i < SR * SC; i++) g_t[i] = (uint16_t)(0x3C00 + (i * 40503u >> 7) % 256);
    for (int k = 1; k <= v; k++)
        for (int j = 0; j < 40; j++) g_t[(size_t)(k * 331 + j * 97) % (SR * SC)] ^= (uint16_t)(k + 3);
}

static int shard_publish(ferry_shard_publisher *p, int v, bool put_back_head, ferry_store *st, const char *run,
                         const void *old_head, size_t nold)
{
    fill_t(v);
    uint64_t shape[2] = {SR, SC};
    ferry_shard_part part = {"t", FERRY_BF16, 2, shape, 0, SR, g_t};
    char *tok = NULL, *rec = NULL;
    size_t tn = 0, rn = 0;
    int rc = ferry_shard_begin(p, 0, &tok, &tn);
    if (!rc) rc = ferry_shard_put(p, tok, tn, &part, 1, &rec, &rn);
    if (!rc && put_back_head) {
        char key[FS_KEY_CAP];
        ferry__sync_key_head(key, run);
        rc = ferry_store_put(st, key, old_head, nold, NULL);
    }
    const char *recs[1] = {rec};
    if (!rc) rc = ferry_shard_commit(p, tok, tn, recs, &rn, 1, NULL);
    int f = ferry_shard_finish(p, rc == 0);
    if (!rc) rc = f;
    ferry_free(tok);
    ferry_free(rec);
    return rc;
}

static bool region_is(ferry_shard_subscriber *s, int v)
{
    static uint16_t got[SR * SC];
    fill_t(v);
    return !ferry_shard_region_copy(s, 0, got, sizeof got) && !memcmp(got, g_t, sizeof got);
}

/* A sharded island with one store at 4 whose HEAD is put back to 2:
 * BACKWARDS, the island keeps 4 (it used to pull 2 through its anchor).
 * The publisher, whose HEAD is put back between begin and commit, is told
 * BACKWARDS (it used to report every refused swap as CONFLICT), and a HEAD
 * of another version is CONFLICT. */
static void t_shard_no_way_back(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    ferry_shard_options o = {.rank = 0, .world = 1, .min_tile_words = 4096, .anchor_every = 100, .publisher_id = "atomic"};
    ferry_shard_publisher *p = NULL;
    CHECK_OK(ferry_shard_publisher_open(st, "s", &o, &p));
    void *head2 = NULL;
    size_t n2 = 0;
    for (int v = 1; v <= 4; v++) {
        CHECK_OK(shard_publish(p, v, false, NULL, NULL, NULL, 0));
        if (v == 2) CHECK_OK(get_bytes(st, "s/HEAD", &head2, &n2));
    }
    ferry_shard_region rg = {"t", 0, SR, 0, SC};
    ferry_shard_subscriber *is = NULL;
    CHECK_OK(ferry_shard_subscriber_open(st, "s", &rg, 1, NULL, &is));
    CHECK_OK(ferry_shard_pull(is, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(ferry_shard_subscriber_version(is) == 4 && region_is(is, 4));

    void *head4 = NULL;
    size_t n4 = 0;
    CHECK_OK(get_bytes(st, "s/HEAD", &head4, &n4));
    CHECK_OK(ferry_store_put(st, "s/HEAD", head2, n2, NULL));
    CHECK_RC(ferry_shard_pull(is, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_BACKWARDS);
    CHECK(ferry_shard_subscriber_version(is) == 4 && region_is(is, 4));
    CHECK_RC(ferry_shard_pull(is, FERRY_SYNC_MIN, 2, NULL), FERRY_ERR_SYNC_BACKWARDS);
    CHECK(ferry_shard_subscriber_version(is) == 4 && region_is(is, 4));

    /* the publisher: HEAD put back to 2 while it publishes 5 */
    CHECK_OK(ferry_store_put(st, "s/HEAD", head4, n4, NULL));
    CHECK_RC(shard_publish(p, 5, true, st, "s", head2, n2), FERRY_ERR_SYNC_BACKWARDS);
    CHECK(strstr(ferry_last_error(), "went back to version 2") != NULL);
    /* HEAD at another version 4 (another publisher) while it publishes 5 */
    CHECK_OK(ferry_store_put(st, "s/HEAD", head4, n4, NULL));
    fs_head h;
    CHECK_OK(ferry__sync_head_parse("s", "s/HEAD", head4, n4, &h));
    char other_id[FS_ID_CAP], mk[FS_KEY_CAP];
    ferry__sync_new_id(other_id);
    memcpy(h.id, other_id, FS_ID_CAP);
    ferry__sync_key_version(mk, "s", h.version, h.id, FS_OBJ_MANIFEST);
    char *other = ferry__sync_head_json("s", &h, mk);
    CHECK(other != NULL);
    CHECK_RC(shard_publish(p, 5, true, st, "s", other, other ? strlen(other) : 0), FERRY_ERR_SYNC_CONFLICT);
    free(other);
    /* put back as it was: publishing goes on, and the island follows */
    CHECK_OK(ferry_store_put(st, "s/HEAD", head4, n4, NULL));
    CHECK_OK(shard_publish(p, 5, false, NULL, NULL, NULL, 0));
    CHECK_OK(ferry_shard_pull(is, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(ferry_shard_subscriber_version(is) == 5 && region_is(is, 5));

    ferry_free(head2);
    ferry_free(head4);
    ferry_shard_subscriber_free(is);
    ferry_shard_publisher_free(p);
    ferry_store_free(st);
}

/* ---- item 14: bogus shortcuts ----------------------------------------------- */

/* Six well-formed index entries (ids, hashes, tiny sizes: the cheapest
 * paths on paper) whose objects do not exist, in an unsigned run whose
 * chain is whole: the island takes the chain after the first shortcut
 * fails (it used to spend its four attempts on them: NO_PATH). */
static void t_bogus_compactions(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    CHECK_OK(publish_range(st, "x", 1, 6));
    fs_head h;
    CHECK_OK(ferry__sync_head_read(st, "x", NULL, NULL, &h, NULL));
    fs_compaction c[6];
    memset(c, 0, sizeof c);
    for (int i = 0; i < 6; i++) {
        fs_manifest from, to;
        uint64_t f = 1 + (uint64_t)(i % 2), t = 6 - (uint64_t)(i / 2) % 2;
        CHECK_OK(ferry__sync_find_manifest(st, "x", NULL, &h, f, NULL, &from));
        CHECK_OK(ferry__sync_find_manifest(st, "x", NULL, &h, t, NULL, &to));
        c[i].from = f;
        c[i].to = t;
        memcpy(c[i].from_id, from.id, FS_ID_CAP);
        memcpy(c[i].to_id, to.id, FS_ID_CAP);
        ferry__sync_new_id(c[i].id);
        c[i].bytes = 64;
        memcpy(c[i].base_hash, from.model_hash, 16);
        memcpy(c[i].target_hash, to.model_hash, 16);
        c[i].from_cum = from.cum;
        c[i].to_cum = to.cum;
        c[i].created = 1;
    }
    fs_index ix = {.c = c, .n = 6};
    char *text = ferry__sync_index_json("x", &ix);
    CHECK(text != NULL);
    char key[FS_KEY_CAP];
    ferry__sync_key_index(key, "x");
    CHECK_OK(ferry_store_put(st, key, text, text ? strlen(text) : 0, NULL));
    free(text);

    static uint16_t w[NW], b[NB];
    fill_v(w, b, 1);
    ferry_model *mine = borrow(w, b);
    ferry_subscriber_options so = {.model = mine, .model_version = 1};
    ferry_subscriber *s = NULL;
    CHECK_OK(ferry_subscriber_open(st, "x", &so, &s));
    ferry_sync_info info;
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &info));
    CHECK(ferry_subscriber_version(s) == 6 && holds_v(w, b, 6));
    CHECK(info.rejected == 1 && strstr(info.path, "chain") != NULL);
    ferry_subscriber_free(s);
    ferry_model_free(mine);
    ferry_store_free(st);
}

/* ---- the compare-and-swap loop ---------------------------------------------- */

static int g_calls, g_fail_first;
static int conflict_then_ok(void *ctx)
{
    (void)ctx;
    return ++g_calls <= g_fail_first ? FERRY_ERR_STORE_CONFLICT : FERRY_OK;
}

static int bad_edit(void *ctx, fs_index *ix, bool *write)
{
    (void)ix;
    *write = true;
    (*(int *)ctx)++;
    return FERRY_ERR_SYNC_MANIFEST; /* not a conflict: no retry */
}

/* Refused swaps are retried with waits of 20, 40, 80 ... ms; a refusal that
 * lasts ends with STORE_CONFLICT after 10 attempts; any other answer ends
 * the loop at once. */
static void t_cas_retry(void)
{
    g_calls = 0;
    g_fail_first = 3;
    uint64_t t0 = ferry__mono_ms();
    CHECK_OK(ferry__sync_cas_retry(conflict_then_ok, NULL, "k"));
    uint64_t el = ferry__mono_ms() - t0;
    CHECK(g_calls == 4 && el >= 140);
    g_calls = 0;
    g_fail_first = 1000;
    CHECK_RC(ferry__sync_cas_retry(conflict_then_ok, NULL, "some/key"), FERRY_ERR_STORE_CONFLICT);
    CHECK(g_calls == 10 && strstr(ferry_last_error(), "some/key") != NULL);

    char dir[512];
    ferry_store *st = fixture_store(dir);
    CHECK_OK(publish_range(st, "i", 1, 1));
    int edits = 0;
    CHECK_RC(ferry__sync_index_update(st, "i", NULL, bad_edit, &edits), FERRY_ERR_SYNC_MANIFEST);
    CHECK(edits == 1);
    ferry_store_free(st);
}

/* The single-rank publisher's HEAD swap through the same helper: HEAD put
 * back to an older version is BACKWARDS, another version CONFLICT; HEAD
 * as it was goes on. */
static void t_head_move(void)
{
    char dir[512];
    ferry_store *st = fixture_store(dir);
    CHECK_OK(publish_range(st, "m", 1, 3));
    fs_head h3, h2;
    char etag[FERRY_STORE_ETAG_MAX];
    CHECK_OK(ferry__sync_head_read(st, "m", NULL, NULL, &h3, etag));
    fs_manifest m2;
    CHECK_OK(ferry__sync_find_manifest(st, "m", NULL, &h3, 2, NULL, &m2));
    fs_ref from = {3, ""};
    memcpy(from.id, h3.id, FS_ID_CAP);
    fs_head nh = h3;
    nh.version = 4;
    ferry__sync_new_id(nh.id);

    /* HEAD back at 2 */
    h2 = h3;
    h2.version = 2;
    memcpy(h2.id, m2.id, FS_ID_CAP);
    memcpy(h2.model_hash, m2.model_hash, 16);
    char mk[FS_KEY_CAP];
    ferry__sync_key_version(mk, "m", 2, h2.id, FS_OBJ_MANIFEST);
    char *t2 = ferry__sync_head_json("m", &h2, mk);
    CHECK_OK(ferry_store_put(st, "m/HEAD", t2, strlen(t2), NULL));
    char e[FERRY_STORE_ETAG_MAX];
    memcpy(e, etag, sizeof e);
    CHECK_RC(ferry__sync_head_move(st, "m", NULL, &nh, &from, "me", e), FERRY_ERR_SYNC_BACKWARDS);
    CHECK(strstr(ferry_last_error(), "went back to version 2") != NULL);
    free(t2);
    /* another version 3 */
    fs_head o3 = h3;
    ferry__sync_new_id(o3.id);
    ferry__sync_key_version(mk, "m", 3, o3.id, FS_OBJ_MANIFEST);
    char *t3 = ferry__sync_head_json("m", &o3, mk);
    CHECK_OK(ferry_store_put(st, "m/HEAD", t3, strlen(t3), NULL));
    memcpy(e, etag, sizeof e);
    CHECK_RC(ferry__sync_head_move(st, "m", NULL, &nh, &from, "me", e), FERRY_ERR_SYNC_CONFLICT);
    free(t3);
    /* HEAD at 3 as it was, under a new etag (written again): the swap is
       retried against it and lands */
    ferry__sync_key_version(mk, "m", 3, h3.id, FS_OBJ_MANIFEST);
    char *t3b = ferry__sync_head_json("m", &h3, mk);
    CHECK_OK(ferry_store_put(st, "m/HEAD", t3b, strlen(t3b), NULL));
    free(t3b);
    memcpy(e, etag, sizeof e);
    CHECK_OK(ferry__sync_head_move(st, "m", NULL, &nh, &from, "me", e));
    fs_head now;
    CHECK_OK(ferry__sync_head_read(st, "m", NULL, NULL, &now, NULL));
    CHECK(now.version == 4 && !strcmp(now.id, nh.id));
    ferry_store_free(st);
}

int main(void)
{
    if (fixture_root("atomic")) return 1;
    RUN(t_route_undone);
    RUN(t_chain_undone);
    RUN(t_restart_floor);
    RUN(t_shard_no_way_back);
    RUN(t_bogus_compactions);
    RUN(t_cas_retry);
    RUN(t_head_move);
    rm_rf(g_root);
    return CHECK_SUMMARY();
}
#endif
