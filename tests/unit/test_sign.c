/* Signed versions and batches (include/ferry_sign.h): the forged-store
 * suite.  An attacker with write access to a file:// store (and nothing
 * else) replaces a delta, an anchor, a manifest; rolls HEAD back; freezes
 * it at 2^63-1; moves records between runs; cuts a signature; signs with
 * its own key; serves an unsigned run; forges and replays trajectory
 * batches.  Each is refused with its own error, nothing of it is applied
 * or admitted, and the reader recovers once the store is repaired.  Also:
 * key files (0600, O_EXCL, refused when readable by others), a reader
 * without keys reading a signed run, a publisher refusing to resume from
 * a HEAD it cannot verify. */
#ifdef FERRY_NO_NET /* a core-only build (make NO_NET=1) has no sync layer */
#include "helpers.h"
NOT_BUILT_MAIN("sync layer not built (NO_NET=1)")
#else
#include <inttypes.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "check.h"
#include "dock/dock_impl.h" /* DK_CURSOR_MAX_BYTES */
#include "ferry_dock.h"
#include "ferry_sign.h"
#include "ferry_sync.h"
#include "sign/sig.h"
#include "sync_fixture.h"

static ferry_store *new_store(void)
{
    char dir[512];
    return fixture_store(dir);
}

/* A key pair under the test root: NAME.key / NAME.pub. */
static void keypair(const char *name, char priv[512], char pub[512])
{
    char prefix[400];
    snprintf(prefix, sizeof prefix, "%s/%s", g_root, name);
    snprintf(priv, 512, "%s.key", prefix);
    snprintf(pub, 512, "%s.pub", prefix);
    if (access(priv, F_OK) && ferry_keygen(prefix, NULL)) fprintf(stderr, "keygen: %s\n", ferry_last_error());
}

static ferry_keys *signer_ring(const char *name)
{
    char priv[512], pub[512];
    keypair(name, priv, pub);
    ferry_keys *k = NULL;
    ferry_keys_create(&k);
    if (ferry_keys_set_signer(k, priv, NULL)) fprintf(stderr, "signer: %s\n", ferry_last_error());
    return k;
}

static ferry_keys *trust_ring(const char *name)
{
    char priv[512], pub[512];
    keypair(name, priv, pub);
    ferry_keys *k = NULL;
    ferry_keys_create(&k);
    if (ferry_keys_trust(k, pub, -1, NULL)) fprintf(stderr, "trust: %s\n", ferry_last_error());
    return k;
}

/* A 128 KB BF16 model; version v differs from v-1 in about 1/16 of its words. */
#define NW (256 * 256)
static ferry_model *model_of(uint64_t v, uint16_t evil)
{
    static uint16_t w[NW];
    for (uint32_t i = 0; i < NW; i++) {
        uint16_t x = (uint16_t)(0x3c00 + (i * 2654435761u >> 20));
        for (uint64_t k = 1; k <= v; k++)
            if (((i * 40503u + (uint32_t)k * 977u) & 15) == 0) x = (uint16_t)(x + 1);
        w[i] = (uint16_t)(x ^ evil);
    }
    ferry_model *m = NULL;
    ferry_model_create(&m);
    const uint64_t shape[2] = {256, 256};
    ferry_model_add(m, "w", FERRY_BF16, 2, shape, w, sizeof w, FERRY_ADD_COPY);
    return m;
}

static void hash_of(uint64_t v, uint16_t evil, uint8_t h[16])
{
    ferry_model *m = model_of(v, evil);
    if (ferry_model_hash(m, h)) memset(h, 0, 16);
    ferry_model_free(m);
}

/* Publishes versions 1..n of run with keys (NULL = unsigned), K = 3. */
static int publish(ferry_store *st, const char *run, const ferry_keys *keys, uint64_t from, uint64_t n)
{
    ferry_publisher_options o = {.anchor_every = 3, .publisher_id = "trainer", .keys = keys};
    ferry_publisher *p = NULL;
    int rc = ferry_publisher_open(st, run, &o, &p);
    for (uint64_t v = from; !rc && v <= n; v++) {
        ferry_model *m = model_of(v, 0);
        rc = ferry_publish(p, m, NULL);
        ferry_model_free(m);
    }
    if (rc) fprintf(stderr, "publish: %s\n", ferry_last_error());
    ferry_publisher_free(p);
    return rc;
}

static ferry_subscriber *sub_open(ferry_store *st, const char *run, const ferry_keys *keys)
{
    ferry_subscriber_options o = {.keys = keys, .max_attempts = 4};
    ferry_subscriber *s = NULL;
    if (ferry_subscriber_open(st, run, &o, &s)) fprintf(stderr, "sub: %s\n", ferry_last_error());
    return s;
}

/* The subscriber holds exactly version v of the honest sequence. */
static bool holds(ferry_subscriber *s, uint64_t v)
{
    uint8_t want[16], h[16], mh[16];
    hash_of(v, 0, want);
    const ferry_model *m = ferry_subscriber_model(s);
    return ferry_subscriber_version(s) == v && !ferry_subscriber_hash(s, h) && !memcmp(h, want, 16) && m &&
           !ferry_model_hash(m, mh) && !memcmp(mh, want, 16);
}

/* Store access as the attacker has it: whole objects, by key. */
static void *get(ferry_store *st, const char *key, size_t *n)
{
    void *d = NULL;
    if (ferry_store_get(st, key, &d, n, NULL)) {
        fprintf(stderr, "get %s: %s\n", key, ferry_last_error());
        *n = 0;
    }
    return d;
}

static void put(ferry_store *st, const char *key, const void *d, size_t n)
{
    if (ferry_store_put(st, key, d, n, NULL)) fprintf(stderr, "put %s: %s\n", key, ferry_last_error());
}

/* Key of version v's object (ext "json", "patch", "safetensors"). */
static void vkey(ferry_store *st, const char *run, uint64_t v, const char *ext, char out[512])
{
    ferry_run_log *log = NULL;
    out[0] = 0;
    if (ferry_run_log_read(st, run, 0, &log)) return;
    for (size_t i = 0; i < log->count; i++)
        if (log->versions[i].version == v) snprintf(out, 512, "%s/v/%020" PRIu64 "-%s.%s", run, v, log->versions[i].id, ext);
    ferry_run_log_free(log);
}

static bool last_rejection_has(ferry_subscriber *s, const char *what)
{
    ferry_subscriber_stats ss;
    ferry_subscriber_get_stats(s, &ss);
    if (!strstr(ss.last_rejection, what)) fprintf(stderr, "last rejection: %s\n", ss.last_rejection);
    return strstr(ss.last_rejection, what) != NULL;
}

/* ---- keys ---- */

static void test_key_files(void)
{
    char prefix[400], priv[512], pub[512];
    snprintf(prefix, sizeof prefix, "%s/kf", g_root);
    char id[FERRY_KEY_ID_LEN + 1], id2[FERRY_KEY_ID_LEN + 1], id3[FERRY_KEY_ID_LEN + 1];
    CHECK_OK(ferry_keygen(prefix, id));
    CHECK(strlen(id) == FERRY_KEY_ID_LEN);
    snprintf(priv, sizeof priv, "%s.key", prefix);
    snprintf(pub, sizeof pub, "%s.pub", prefix);
    struct stat sb;
    CHECK(!stat(priv, &sb) && (sb.st_mode & 0777) == 0600);
    CHECK_RC(ferry_keygen(prefix, NULL), FERRY_ERR_IO); /* O_EXCL: never overwrites a key */
    ferry_keys *k = NULL;
    CHECK_OK(ferry_keys_create(&k));
    CHECK_OK(ferry_keys_set_signer(k, priv, id2));
    CHECK(!strcmp(id, id2));
    CHECK_OK(ferry_keys_trust(k, pub, 3, id3));
    CHECK(!strcmp(id, id3));
    CHECK(ferry_keys_trusted(k) == 2 && ferry_keys_can_sign(k));
    CHECK_RC(ferry_keys_set_signer(k, priv, NULL), FERRY_ERR_ARG);
    CHECK_RC(ferry_keys_set_signer(k, pub, NULL), FERRY_ERR_ARG);
    ferry_keys_free(k);
    k = NULL;
    ferry_keys_create(&k);
    CHECK_RC(ferry_keys_set_signer(k, pub, NULL), FERRY_ERR_SIG_KEY);    /* not a private key */
    chmod(priv, 0644);
    CHECK_RC(ferry_keys_set_signer(k, priv, NULL), FERRY_ERR_SIG_KEY);   /* readable by others */
    CHECK(strstr(ferry_last_error(), "chmod 600") != NULL);
    chmod(priv, 0600);
    char junk[512];
    snprintf(junk, sizeof junk, "%s/junk.pub", g_root);
    ferry_file_write(junk, "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", 56);
    CHECK_RC(ferry_keys_trust(k, junk, -1, NULL), FERRY_ERR_SIG_KEY);
    CHECK_RC(ferry_keys_trust(k, "/nonexistent/x.pub", -1, NULL), FERRY_ERR_SIG_KEY);
    CHECK(ferry_keys_trusted(k) == 0 && !ferry_keys_can_sign(k));
    ferry_keys_free(k);
    ferry_keys_free(NULL);
}

/* ---- signed versions ---- */

static void test_signed_run_reads(void)
{
    ferry_store *st = new_store();
    ferry_keys *tk = signer_ring("trainer"), *rk = trust_ring("trainer");
    CHECK_OK(publish(st, "run", tk, 1, 5));
    /* HEAD ends with the signature trailer; manifests give SHA-256s */
    size_t n;
    char *head = get(st, "run/HEAD", &n), mkey[512];
    CHECK(head && n > 160 && !memcmp(head + n - 160, "\n#ferry-sig-1 ", 14));
    ferry_free(head);
    vkey(st, "run", 5, "json", mkey);
    char *man = get(st, mkey, &n);
    CHECK(man && memmem(man, n, "\"sha256\"", 8));
    ferry_free(man);
    ferry_subscriber *s = sub_open(st, "run", rk);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 5));
    ferry_subscriber_free(s);
    /* a reader without keys reads the signed run too (nothing enforced) */
    s = sub_open(st, "run", NULL);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 4, NULL));
    CHECK(holds(s, 4));
    ferry_subscriber_free(s);
    /* a compaction signed by the trainer is used by a reader with keys */
    ferry_compact_options co = {.from = 1, .to = 5, .keys = tk};
    CHECK_OK(ferry_compact(st, "run", &co, NULL));
    s = sub_open(st, "run", rk);
    ferry_sync_info in;
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &in));
    CHECK(holds(s, 5) && in.rejected == 0);
    ferry_subscriber_free(s);
    /* the publisher resumes from its own signed HEAD; GC with keys */
    CHECK_OK(publish(st, "run", tk, 6, 7));
    ferry_gc_options go = {.keep = 2, .grace_s = -1, .keys = tk};
    ferry_gc_report rep;
    CHECK_OK(ferry_gc(st, "run", &go, &rep));
    s = sub_open(st, "run", rk);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 7));
    ferry_subscriber_free(s);
    ferry_keys_free(tk);
    ferry_keys_free(rk);
    ferry_store_free(st);
}

/* A delta replaced by the attacker's (a real patch from version 2 to a
 * model of its choice: base and target hashes "recomputed"), then an anchor
 * replaced by another model: SHA-256 against the signed manifest. */
static void test_forged_objects(void)
{
    ferry_store *st = new_store();
    ferry_keys *tk = signer_ring("trainer"), *rk = trust_ring("trainer");
    CHECK_OK(publish(st, "run", tk, 1, 3)); /* anchors 1; deltas 2, 3 */
    ferry_subscriber *s = sub_open(st, "run", rk);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_EXACT, 2, NULL));
    char dkey[512];
    vkey(st, "run", 3, "patch", dkey);
    size_t n0;
    void *orig = get(st, dkey, &n0);
    ferry_model *a = model_of(2, 0), *evil = model_of(3, 0x5);
    void *forged = NULL;
    size_t fn = 0;
    CHECK_OK(ferry_diff(a, evil, NULL, &forged, &fn));
    put(st, dkey, forged, fn);
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_NO_PATH);
    CHECK(last_rejection_has(s, "signed manifest"));
    CHECK(holds(s, 2)); /* nothing applied */
    /* the same forgery read without keys: the hashes the attacker wrote
     * into its patch pass, so only the manifest's target stops it here */
    put(st, dkey, orig, n0); /* repaired */
    ferry_subscriber_free(s);
    s = sub_open(st, "run", rk);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 3));
    ferry_subscriber_free(s);

    /* an anchor replaced: refused, and the reader goes through the anchor
     * before it (and never holds the attacker's model) */
    CHECK_OK(publish(st, "run", tk, 4, 4)); /* 4 is an anchor (K = 3) */
    char fkey[512];
    vkey(st, "run", 4, "safetensors", fkey);
    CHECK(fkey[0] != 0);
    size_t an;
    void *anchor = get(st, fkey, &an);
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s/evil.safetensors", g_root);
    ferry_model *e4 = model_of(4, 0x3);
    CHECK_OK(ferry_model_save(e4, tmp));
    CHECK_OK(ferry_store_put_file(st, fkey, tmp, NULL));
    s = sub_open(st, "run", rk);
    ferry_sync_info in;
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &in));
    CHECK(holds(s, 4) && in.rejected == 1);
    CHECK(last_rejection_has(s, "SHA-256") || last_rejection_has(s, "signed manifest"));
    ferry_subscriber_free(s);
    put(st, fkey, anchor, an);
    ferry_free(anchor);
    ferry_free(orig);
    ferry_free(forged);
    ferry_model_free(a);
    ferry_model_free(evil);
    ferry_model_free(e4);
    ferry_keys_free(tk);
    ferry_keys_free(rk);
    ferry_store_free(st);
}

/* Manifest and HEAD records rewritten: body changed under the old
 * signature, signature cut, HEAD frozen at 2^63-1, HEAD rolled back to an
 * older signed one, records of another run. */
static void test_forged_records(void)
{
    ferry_store *st = new_store();
    ferry_keys *tk = signer_ring("trainer"), *rk = trust_ring("trainer");
    CHECK_OK(publish(st, "run", tk, 1, 2));
    size_t n;
    char *head2 = get(st, "run/HEAD", &n);
    size_t n2 = n;
    ferry_subscriber *s = sub_open(st, "run", rk);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK_OK(publish(st, "run", tk, 3, 3));
    char *head3 = get(st, "run/HEAD", &n);
    size_t n3 = n;

    /* a manifest's body altered (its size, say), the signature kept: that
       of version 2, which a fresh island reads from the store (HEAD carries
       only the manifest of its own version, under HEAD's signature) */
    ferry_subscriber *s0 = sub_open(st, "run", rk);
    char mkey[512];
    vkey(st, "run", 2, "json", mkey);
    char *man = get(st, mkey, &n);
    char *forged = malloc(n + 1);
    memcpy(forged, man, n);
    char *b = memmem(forged, n, "\"model_bytes\": 1", 16);
    CHECK(b != NULL);
    if (b) b[15] = '2';
    put(st, mkey, forged, n);
    CHECK_RC(ferry_subscriber_sync(s0, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_NO_PATH); /* the only path needs it */
    CHECK(ferry_subscriber_version(s0) == 0 && strstr(ferry_last_error(), mkey) && strstr(ferry_last_error(), "does not verify"));
    ferry_subscriber_free(s0);
    ferry_run_log *log = NULL;
    CHECK_RC(ferry_run_log_read_keys(st, "run", 0, rk, &log), FERRY_ERR_SIG_INVALID);
    CHECK(log == NULL && strstr(ferry_last_error(), mkey) != NULL);
    /* the manifest without its signature */
    put(st, mkey, man, n - 160);
    s0 = sub_open(st, "run", rk);
    CHECK_RC(ferry_subscriber_sync(s0, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_NO_PATH);
    CHECK(ferry_subscriber_version(s0) == 0 && strstr(ferry_last_error(), mkey) && strstr(ferry_last_error(), "unsigned"));
    ferry_subscriber_free(s0);
    put(st, mkey, man, n);
    CHECK_OK(ferry_run_log_read_keys(st, "run", 0, rk, &log));
    CHECK(log && log->count == 3 && log->verified);
    ferry_run_log_free(log);
    ferry_free(man);
    free(forged);

    /* HEAD's signature cut short */
    put(st, "run/HEAD", head3, n3 - 10);
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SIG_MALFORMED);
    CHECK(holds(s, 2));

    /* HEAD frozen at 2^63-1 (the attacker cannot sign it) */
    char frozen[16384]; /* HEAD carries its manifest's record: a few KB */
    CHECK(n3 + 64 < sizeof frozen);
    int fl = snprintf(frozen, sizeof frozen, "%.*s", (int)(n3 - 160), head3);
    char *v = strstr(frozen, "\"version\": 3");
    CHECK(v != NULL);
    if (v) {
        char tail[16384];
        snprintf(tail, sizeof tail, "%s", v + 12);
        fl = snprintf(v, sizeof frozen - (size_t)(v - frozen), "\"version\": 9223372036854775807%s", tail) + (int)(v - frozen);
    }
    put(st, "run/HEAD", frozen, (size_t)fl);
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SIG_MISSING);
    CHECK((size_t)fl + 160 <= sizeof frozen);
    if ((size_t)fl + 160 <= sizeof frozen) memcpy(frozen + fl, head3 + n3 - 160, 160); /* with the real HEAD's signature */
    put(st, "run/HEAD", frozen, (size_t)fl + 160);
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SIG_INVALID);
    CHECK(holds(s, 2));
    /* repaired: the same handle follows again (it was not wedged) */
    put(st, "run/HEAD", head3, n3);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 3));

    /* HEAD rolled back to the older, validly signed, version 2 */
    put(st, "run/HEAD", head2, n2);
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_BACKWARDS);
    CHECK(holds(s, 3));
    /* and a publisher with the key does not chain onto what it cannot verify */
    put(st, "run/HEAD", frozen, (size_t)fl + 160);
    ferry_publisher_options po = {.keys = tk};
    ferry_publisher *p = NULL;
    CHECK_RC(ferry_publisher_open(st, "run", &po, &p), FERRY_ERR_SIG_INVALID);
    CHECK(p == NULL);
    put(st, "run/HEAD", head3, n3);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 3));

    /* records moved from another run signed by the same key */
    CHECK_OK(publish(st, "other", tk, 1, 4));
    char *oh = get(st, "other/HEAD", &n);
    put(st, "run/HEAD", oh, n);
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_MANIFEST);
    CHECK(strstr(ferry_last_error(), "another run") != NULL);
    CHECK(holds(s, 3));
    put(st, "run/HEAD", head3, n3);
    ferry_free(oh);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    ferry_subscriber_free(s);
    ferry_free(head2);
    ferry_free(head3);
    ferry_keys_free(tk);
    ferry_keys_free(rk);
    ferry_store_free(st);
}

/* A run signed with a key the reader does not trust, and an unsigned run. */
static void test_wrong_key_and_unsigned(void)
{
    ferry_store *st = new_store();
    ferry_keys *mallory = signer_ring("mallory"), *rk = trust_ring("trainer");
    CHECK_OK(publish(st, "m", mallory, 1, 2));
    CHECK_OK(publish(st, "u", NULL, 1, 2));
    ferry_subscriber *s = sub_open(st, "m", rk);
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SIG_UNTRUSTED);
    CHECK(ferry_subscriber_version(s) == 0);
    ferry_subscriber_free(s);
    s = sub_open(st, "u", rk);
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SIG_MISSING);
    CHECK(ferry_subscriber_version(s) == 0);
    ferry_subscriber_free(s);
    /* the unsigned run is still read by a reader without keys */
    s = sub_open(st, "u", NULL);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 2));
    ferry_subscriber_free(s);
    /* the run log refuses to list either with the trainer's key */
    ferry_run_log *log = NULL;
    CHECK_RC(ferry_run_log_read_keys(st, "m", 0, rk, &log), FERRY_ERR_SIG_UNTRUSTED);
    CHECK(log == NULL);
    CHECK_RC(ferry_run_log_read_keys(st, "u", 0, rk, &log), FERRY_ERR_SIG_MISSING);
    CHECK(log == NULL);
    CHECK_OK(ferry_run_log_read_keys(st, "u", 0, NULL, &log));
    CHECK(log && log->count == 2 && !log->verified);
    ferry_run_log_free(log);
    /* the trainer's publisher refuses to resume mallory's run */
    ferry_keys *tk = signer_ring("trainer");
    ferry_publisher_options po = {.keys = tk};
    ferry_publisher *p = NULL;
    CHECK_RC(ferry_publisher_open(st, "m", &po, &p), FERRY_ERR_SIG_UNTRUSTED);
    CHECK_RC(ferry_publisher_open(st, "u", &po, &p), FERRY_ERR_SIG_MISSING);
    ferry_keys_free(tk);
    ferry_keys_free(mallory);
    ferry_keys_free(rk);
    ferry_store_free(st);
}

/* Key roles (issue 23 item 1).  The trainer's ring holds its own signer and
 * island 0's key enrolled for island 0's batches — the ring SECURITY.md
 * describes.  Island 0 (its key, and write access to the store, which it
 * needs to put batches) publishes a version 4 of its own on top of the
 * trainer's 3, signed with its key.  The trainer's subscriber refuses it,
 * its publisher does not resume on it, ferry_compact signs no index entry
 * to it, and an island that trusts only the trainer refuses it too.  An
 * island's batch key never verifies a record, a publisher key never a
 * batch, and a ring whose signer is an island's cannot sign a record. */
static void test_island_key_is_no_publisher(void)
{
    ferry_store *st = new_store();
    char tpriv[512], tpub[512], ipriv[512], ipub[512];
    keypair("trainer", tpriv, tpub);
    keypair("island0", ipriv, ipub);
    ferry_keys *tk = NULL, *forger = NULL, *rk = trust_ring("trainer");
    ferry_keys_create(&tk);
    CHECK_OK(ferry_keys_set_signer(tk, tpriv, NULL));
    CHECK_OK(ferry_keys_trust(tk, ipub, 0, NULL));
    CHECK(ferry_keys_trusted(tk) == 2 && ferry_keys_publishers(tk) == 1);
    CHECK_OK(publish(st, "run", tk, 1, 3));
    ferry_subscriber *s = sub_open(st, "run", tk);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 3));
    size_t n3;
    char *head3 = get(st, "run/HEAD", &n3);

    /* the island: its key signs, it trusts the trainer's to resume */
    ferry_keys_create(&forger);
    CHECK_OK(ferry_keys_set_signer(forger, ipriv, NULL));
    CHECK_OK(ferry_keys_trust(forger, tpub, FERRY_KEY_PUBLISHER, NULL));
    ferry_publisher_options fo = {.anchor_every = 3, .publisher_id = "island0", .keys = forger};
    ferry_publisher *fp = NULL;
    CHECK_OK(ferry_publisher_open(st, "run", &fo, &fp));
    ferry_model *evil = model_of(4, 0x11);
    CHECK_OK(ferry_publish(fp, evil, NULL));
    ferry_publisher_free(fp);

    /* the trainer's own subscriber: refused, nothing applied */
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SIG_UNTRUSTED);
    CHECK(strstr(ferry_last_error(), "not enrolled as a publisher") && strstr(ferry_last_error(), "island 0"));
    CHECK(holds(s, 3));
    ferry_subscriber_free(s);
    s = sub_open(st, "run", tk); /* a fresh one takes nothing either */
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SIG_UNTRUSTED);
    CHECK(ferry_subscriber_version(s) == 0);
    ferry_subscriber_free(s);
    /* the trainer's publisher does not resume on it */
    ferry_publisher_options po = {.anchor_every = 3, .publisher_id = "trainer", .keys = tk};
    ferry_publisher *p = NULL;
    CHECK_RC(ferry_publisher_open(st, "run", &po, &p), FERRY_ERR_SIG_UNTRUSTED);
    CHECK(p == NULL);
    /* compaction signs no index entry to the forged version */
    ferry_compact_options co = {.from = 1, .keys = tk};
    CHECK_RC(ferry_compact(st, "run", &co, NULL), FERRY_ERR_SIG_UNTRUSTED);
    size_t n;
    void *ix = NULL;
    CHECK_RC(ferry_store_get(st, "run/compactions.json", &ix, &n, NULL), FERRY_ERR_STORE_NOT_FOUND);
    ferry_free(ix);
    /* the run log, and an island trusting only the trainer */
    ferry_run_log *log = NULL;
    CHECK_RC(ferry_run_log_read_keys(st, "run", 0, tk, &log), FERRY_ERR_SIG_UNTRUSTED);
    s = sub_open(st, "run", rk);
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SIG_UNTRUSTED);
    CHECK(ferry_subscriber_version(s) == 0);
    /* HEAD restored: the same handle follows, the trainer resumes */
    put(st, "run/HEAD", head3, n3);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 3));
    ferry_subscriber_free(s);
    CHECK_OK(publish(st, "run", tk, 4, 4));
    s = sub_open(st, "run", rk);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 4));
    ferry_subscriber_free(s);

    /* the roles at the signature level */
    const char body[] = "{\"format\": \"ferry-head-1\"}";
    uint8_t tsig[FS_SIG_RAW], isig[FS_SIG_RAW];
    CHECK_OK(ferry__sign_bytes(tk, FS_DOM_BATCH, body, sizeof body, tsig));     /* trainer key over a batch */
    CHECK_OK(ferry__sign_bytes(forger, FS_DOM_RECORD, body, sizeof body, isig)); /* island key over a record */
    CHECK_RC(ferry__sign_verify_island(tk, FS_DOM_BATCH, "b", body, sizeof body, tsig, 0), FERRY_ERR_SIG_UNTRUSTED);
    CHECK(strstr(ferry_last_error(), "a publisher key") != NULL);
    CHECK_RC(ferry__sign_verify_publisher(tk, FS_DOM_RECORD, "r", body, sizeof body, isig), FERRY_ERR_SIG_UNTRUSTED);
    CHECK_RC(ferry__sign_verify_island(tk, FS_DOM_RECORD, "r", body, sizeof body, isig, 1), FERRY_ERR_SIG_UNTRUSTED);
    CHECK_OK(ferry__sign_verify_island(tk, FS_DOM_RECORD, "r", body, sizeof body, isig, 0));
    /* island 0's ring built as SECURITY.md says: it signs batches only */
    ferry_keys *ik = NULL;
    ferry_keys_create(&ik);
    CHECK_OK(ferry_keys_set_island_signer(ik, ipriv, 0, NULL));
    CHECK_OK(ferry_keys_trust(ik, tpub, FERRY_KEY_PUBLISHER, NULL));
    CHECK(ferry_keys_trusted(ik) == 2 && ferry_keys_publishers(ik) == 1 && ferry_keys_can_sign(ik));
    CHECK_OK(ferry__sign_bytes(ik, FS_DOM_BATCH, body, sizeof body, isig));
    CHECK_OK(ferry__sign_verify_island(tk, FS_DOM_BATCH, "b", body, sizeof body, isig, 0));
    char *sealed = NULL;
    CHECK_RC(ferry__sign_seal(ik, FS_DOM_RECORD, body, strlen(body), &sealed), FERRY_ERR_ARG);
    CHECK_RC(ferry__sign_bytes(ik, FS_DOM_CURSOR, body, sizeof body, isig), FERRY_ERR_ARG);
    CHECK(sealed == NULL);
    fo.keys = ik;
    ferry_store *st2 = new_store();
    CHECK_OK(ferry_publisher_open(st2, "run", &fo, &fp));
    CHECK_RC(ferry_publish(fp, evil, NULL), FERRY_ERR_ARG);
    ferry_publisher_free(fp);
    CHECK_RC(ferry_store_get(st2, "run/HEAD", &ix, &n, NULL), FERRY_ERR_STORE_NOT_FOUND);
    CHECK_RC(ferry_keys_set_island_signer(ik, ipriv, -1, NULL), FERRY_ERR_ARG);
    CHECK_RC(ferry_keys_trust(ik, ipub, -2, NULL), FERRY_ERR_ARG);
    ferry_store_free(st2);
    ferry_keys_free(ik);
    ferry_model_free(evil);
    ferry_free(head3);
    ferry_keys_free(tk);
    ferry_keys_free(forger);
    ferry_keys_free(rk);
    ferry_store_free(st);
}

/* A ring given with no key at all (a trust glob that matched nothing) is
 * an error wherever a ring is taken, never "unsigned allowed" (item 13). */
static void test_empty_ring(void)
{
    ferry_store *st = new_store();
    CHECK_OK(publish(st, "u", NULL, 1, 2)); /* an unsigned run */
    ferry_keys *empty = NULL;
    CHECK_OK(ferry_keys_create(&empty));
    CHECK(ferry_keys_trusted(empty) == 0 && ferry_keys_publishers(empty) == 0);
    ferry_subscriber_options so = {.keys = empty};
    ferry_subscriber *s = NULL;
    CHECK_RC(ferry_subscriber_open(st, "u", &so, &s), FERRY_ERR_ARG);
    CHECK(s == NULL && strstr(ferry_last_error(), "holds no key") != NULL);
    ferry_publisher_options po = {.keys = empty};
    ferry_publisher *p = NULL;
    CHECK_RC(ferry_publisher_open(st, "new", &po, &p), FERRY_ERR_ARG); /* would publish unsigned */
    CHECK(p == NULL);
    ferry_run_log *log = NULL;
    CHECK_RC(ferry_run_log_read_keys(st, "u", 0, empty, &log), FERRY_ERR_ARG);
    ferry_compact_options co = {.from = 1, .keys = empty};
    CHECK_RC(ferry_compact(st, "u", &co, NULL), FERRY_ERR_ARG);
    ferry_dock_options dopt = {.role = FERRY_DOCK_CONSUMER, .keys = empty};
    ferry_dock *d = NULL;
    CHECK_RC(ferry_dock_open(st, "rl", &dopt, &d), FERRY_ERR_ARG);
    CHECK(d == NULL);
    /* the record layer itself fails closed */
    size_t bl;
    bool sig;
    CHECK_RC(ferry__sign_open(empty, FS_DOM_RECORD, "u/HEAD", "{}", 2, &bl, &sig), FERRY_ERR_ARG);
    ferry_keys_free(empty);
    ferry_store_free(st);
}

/* ---- run identity (issue 23 item 3) ---- */

/* Every object of src under prefix put into dst, as a store writer would. */
static void copy_prefix(ferry_store *src, ferry_store *dst, const char *prefix)
{
    ferry_store_listing *l = NULL;
    if (ferry_store_list(src, prefix, &l)) return;
    for (size_t i = 0; i < l->count; i++) {
        size_t n;
        void *d = get(src, l->entries[i].key, &n);
        if (d) put(dst, l->entries[i].key, d, n);
        ferry_free(d);
    }
    ferry_store_listing_free(l);
}

static int g_pub_rc; /* pub_open's status */

static ferry_publisher *pub_open(ferry_store *st, const char *run, const ferry_keys *k, const char *cache, const char *run_id)
{
    ferry_publisher_options o = {.anchor_every = 3, .publisher_id = "trainer", .keys = k, .cache_path = cache, .run_id = run_id};
    ferry_publisher *p = NULL;
    g_pub_rc = ferry_publisher_open(st, run, &o, &p);
    return p;
}

/* A signed version of run "r" from another store (same key, its own run
 * id) copied over this store's "r": the islands that hold this run's
 * versions refuse it by run id (in memory, and after a restart from PATH's
 * state), as does a fresh island told the run id; the trainer does not
 * publish on top of it (an open publisher is fenced, a restarted one is
 * pinned by its cache or by the run id it is given).  The other run's
 * compaction index costs only shortcuts.  HEAD restored: all go on. */
static void test_run_identity(void)
{
    ferry_store *a = new_store(), *b = new_store();
    ferry_keys *tk = signer_ring("trainer"), *rk = trust_ring("trainer");
    char cache[512], path[512];
    snprintf(cache, sizeof cache, "%s/trainer-cache.safetensors", g_root);
    snprintf(path, sizeof path, "%s/island.safetensors", g_root);
    ferry_publisher *p = pub_open(a, "r", tk, cache, NULL);
    CHECK(p != NULL && ferry_publisher_run_id(p)[0] == 0);
    for (uint64_t v = 1; p && v <= 3; v++) {
        ferry_model *m = model_of(v, 0);
        CHECK_OK(ferry_publish(p, m, NULL));
        ferry_model_free(m);
    }
    char rid[FERRY_SYNC_ID_LEN + 1] = "";
    if (p) snprintf(rid, sizeof rid, "%s", ferry_publisher_run_id(p));
    CHECK(strlen(rid) == FERRY_SYNC_ID_LEN);
    /* carried, signed, by HEAD, the manifests and the run log */
    size_t n;
    char *head3 = get(a, "r/HEAD", &n), mkey[512];
    size_t n3 = n;
    char want[64];
    snprintf(want, sizeof want, "\"run_id\": \"%s\"", rid);
    CHECK(head3 && memmem(head3, n, want, strlen(want)));
    vkey(a, "r", 1, "json", mkey);
    char *man = get(a, mkey, &n);
    CHECK(man && memmem(man, n, want, strlen(want)));
    ferry_free(man);
    ferry_run_log *log = NULL;
    CHECK_OK(ferry_run_log_read_keys(a, "r", 0, rk, &log));
    CHECK(log && !strcmp(log->run_id, rid));
    ferry_run_log_free(log);
    /* islands: one in memory, one in file mode */
    ferry_subscriber *s = sub_open(a, "r", rk), *fs = NULL;
    ferry_subscriber_options fo = {.keys = rk, .path = path};
    CHECK_OK(ferry_subscriber_open(a, "r", &fo, &fs));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK_OK(ferry_subscriber_sync(fs, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 3) && !strcmp(ferry_subscriber_run_id(s), rid) && !strcmp(ferry_subscriber_run_id(fs), rid));
    /* the other store's run "r": same key, same name, five versions of
     * other weights, its own run id; copied over this store's "r" */
    ferry_publisher *pb = pub_open(b, "r", tk, NULL, NULL);
    for (uint64_t v = 1; pb && v <= 5; v++) {
        ferry_model *m = model_of(v, 0x21);
        CHECK_OK(ferry_publish(pb, m, NULL));
        ferry_model_free(m);
    }
    char other[FERRY_SYNC_ID_LEN + 1] = "";
    if (pb) snprintf(other, sizeof other, "%s", ferry_publisher_run_id(pb));
    CHECK(strlen(other) == FERRY_SYNC_ID_LEN && strcmp(other, rid));
    ferry_publisher_free(pb);
    ferry_compact_options co = {.from = 1, .keys = tk};
    CHECK_OK(ferry_compact(b, "r", &co, NULL));
    copy_prefix(b, a, "r/");
    /* islands that hold run rid: refused, both ids named, nothing applied */
    CHECK_RC(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_FOREIGN);
    CHECK(strstr(ferry_last_error(), rid) && strstr(ferry_last_error(), other));
    CHECK(holds(s, 3));
    CHECK_RC(ferry_subscriber_sync(fs, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_FOREIGN);
    ferry_subscriber_free(fs);
    fs = NULL;
    CHECK_OK(ferry_subscriber_open(a, "r", &fo, &fs)); /* restarted: PATH's state pins the run */
    CHECK(!strcmp(ferry_subscriber_run_id(fs), rid) && ferry_subscriber_version(fs) == 3);
    CHECK_RC(ferry_subscriber_sync(fs, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_FOREIGN);
    CHECK(ferry_subscriber_version(fs) == 3);
    ferry_subscriber_options ro = {.keys = rk, .run_id = rid};
    ferry_subscriber *fresh = NULL;
    CHECK_OK(ferry_subscriber_open(a, "r", &ro, &fresh)); /* a new island told the run id */
    CHECK_RC(ferry_subscriber_sync(fresh, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_FOREIGN);
    CHECK(ferry_subscriber_version(fresh) == 0);
    ferry_subscriber_free(fresh);
    ro.run_id = "not-hex";
    CHECK_RC(ferry_subscriber_open(a, "r", &ro, &fresh), FERRY_ERR_ARG);
    /* the trainer: the open handle is fenced, a restarted one pinned */
    ferry_model *m4 = model_of(4, 0);
    CHECK_RC(ferry_publish(p, m4, NULL), FERRY_ERR_SYNC_CONFLICT);
    ferry_publisher_free(p);
    CHECK(pub_open(a, "r", tk, cache, NULL) == NULL && g_pub_rc == FERRY_ERR_SYNC_FOREIGN);
    CHECK(strstr(ferry_last_error(), rid) && strstr(ferry_last_error(), other) && strstr(ferry_last_error(), "cache"));
    CHECK(pub_open(a, "r", tk, NULL, rid) == NULL && g_pub_rc == FERRY_ERR_SYNC_FOREIGN);
    CHECK(pub_open(a, "r", tk, NULL, "xyz") == NULL && g_pub_rc == FERRY_ERR_ARG);
    /* this store's HEAD back, the other run's index left in place: the
     * islands go on by the chain (the index is another run's) */
    put(a, "r/HEAD", head3, n3);
    ferry_subscriber_free(s);
    s = sub_open(a, "r", rk);
    ferry_sync_info in;
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, &in));
    CHECK(holds(s, 3));
    p = pub_open(a, "r", tk, cache, NULL);
    CHECK(p != NULL && p && !strcmp(ferry_publisher_run_id(p), rid));
    if (p) CHECK_OK(ferry_publish(p, m4, NULL));
    ferry_publisher_free(p);
    ferry_subscriber *s1 = NULL;
    ferry_subscriber_options o1 = {.keys = rk, .max_attempts = 4};
    CHECK_OK(ferry_subscriber_open(a, "r", &o1, &s1));
    CHECK_OK(ferry_subscriber_sync(s1, FERRY_SYNC_EXACT, 1, NULL));
    ferry_subscriber_stats s0, ss;
    ferry_subscriber_get_stats(s1, &s0);
    CHECK_OK(ferry_subscriber_sync(s1, FERRY_SYNC_LATEST, 0, &in)); /* 1 -> 4: the foreign index is no shortcut */
    ferry_subscriber_get_stats(s1, &ss);
    CHECK(holds(s1, 4) && ss.rejected == s0.rejected + 1);
    CHECK(last_rejection_has(s1, "compaction index"));
    ferry_subscriber_free(s1);
    CHECK_OK(ferry_subscriber_sync(fs, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(ferry_subscriber_version(fs) == 4);
    /* ferry_compact makes the index this run's again */
    co.from = 2;
    CHECK_OK(ferry_compact(a, "r", &co, NULL));
    char *ix = get(a, "r/compactions.json", &n);
    CHECK(ix && memmem(ix, n, want, strlen(want)) && !memmem(ix, n, other, strlen(other)));
    ferry_free(ix);
    ferry_model_free(m4);
    ferry_subscriber_free(s);
    ferry_subscriber_free(fs);
    ferry_free(head3);
    ferry_keys_free(tk);
    ferry_keys_free(rk);
    ferry_store_free(a);
    ferry_store_free(b);
}

/* Records written before run ids (no "run_id"): read by a reader with no
 * run id pinned; refused by one pinned to a run id; a publisher resuming
 * such a run gives it a run id at its next version. */
static void test_run_identity_legacy(void)
{
    ferry_store *st = new_store();
    CHECK_OK(publish(st, "old", NULL, 1, 2)); /* unsigned: its records can be rewritten as an old publisher wrote them */
    ferry_store_listing *l = NULL;
    CHECK_OK(ferry_store_list(st, "old/", &l));
    for (size_t i = 0; l && i < l->count; i++) {
        const char *k = l->entries[i].key;
        if (!strstr(k, ".json") && !strstr(k, "HEAD")) continue;
        size_t n;
        const char pat[] = ",\n \"run_id\": \"";
        size_t cut = sizeof pat - 1 + FERRY_SYNC_ID_LEN + 1; /* through the closing quote */
        char *t = get(st, k, &n), *r = t ? memmem(t, n, pat, sizeof pat - 1) : NULL;
        CHECK(r != NULL);
        if (r) {
            memmove(r, r + cut, n - (size_t)(r - t) - cut);
            put(st, k, t, n - cut);
        }
        ferry_free(t);
    }
    ferry_store_listing_free(l);
    ferry_subscriber *s = sub_open(st, "old", NULL);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 2) && ferry_subscriber_run_id(s)[0] == 0);
    ferry_subscriber_options po = {.run_id = "0123456789abcdef"};
    ferry_subscriber *pinned = NULL;
    CHECK_OK(ferry_subscriber_open(st, "old", &po, &pinned));
    CHECK_RC(ferry_subscriber_sync(pinned, FERRY_SYNC_LATEST, 0, NULL), FERRY_ERR_SYNC_FOREIGN);
    CHECK(strstr(ferry_last_error(), "written before run ids") != NULL);
    ferry_subscriber_free(pinned);
    CHECK_OK(publish(st, "old", NULL, 3, 3));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 3) && strlen(ferry_subscriber_run_id(s)) == FERRY_SYNC_ID_LEN);
    ferry_subscriber_free(s);
    ferry_store_free(st);
}

/* HEAD deleted (issue 23 item 11): the trainer refuses to make a new
 * version 1 over the versions left (RUN/v/, its cache), unless told the run
 * starts anew.  The owner's recovery, ferry_head_repair, rewrites HEAD to
 * the newest complete version that verifies — after a deletion, a forgery
 * (an island key's HEAD), a rollback — and the trainer resumes on it; it
 * never moves a verifying HEAD back, skips versions whose objects are
 * gone, and asks which run when another run's signed versions were copied
 * in. */
static void test_head_deleted_and_repair(void)
{
    ferry_store *st = new_store();
    ferry_keys *tk = signer_ring("trainer"), *rk = trust_ring("trainer"), *ik = signer_ring("island0");
    char cache[512];
    snprintf(cache, sizeof cache, "%s/repair-cache.safetensors", g_root);
    ferry_publisher *p = pub_open(st, "r", tk, cache, NULL);
    for (uint64_t v = 1; p && v <= 4; v++) { /* anchors 1 and 4 (K = 3) */
        ferry_model *m = model_of(v, 0);
        CHECK_OK(ferry_publish(p, m, NULL));
        ferry_model_free(m);
    }
    char rid[FERRY_SYNC_ID_LEN + 1] = "";
    if (p) snprintf(rid, sizeof rid, "%s", ferry_publisher_run_id(p));
    ferry_publisher_free(p);
    size_t n;
    char *head4 = get(st, "r/HEAD", &n);
    size_t n4 = n;
    ferry_subscriber *s = sub_open(st, "r", rk);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 4));

    /* HEAD deleted: no silent version 1, with or without the cache */
    CHECK_OK(ferry_store_delete(st, "r/HEAD"));
    CHECK(pub_open(st, "r", tk, cache, NULL) == NULL && g_pub_rc == FERRY_ERR_SYNC_BACKWARDS);
    CHECK(strstr(ferry_last_error(), "head-repair") && strstr(ferry_last_error(), "up to version 4"));
    CHECK(pub_open(st, "r", tk, NULL, NULL) == NULL && g_pub_rc == FERRY_ERR_SYNC_BACKWARDS);
    ferry_store *empty = new_store(); /* only the cache knows: still refused */
    CHECK(pub_open(empty, "r", tk, cache, NULL) == NULL && g_pub_rc == FERRY_ERR_SYNC_BACKWARDS);
    CHECK(strstr(ferry_last_error(), "cache") != NULL);
    ferry_store_free(empty);
    ferry_store_stat hst;
    CHECK_RC(ferry_store_head(st, "r/HEAD", &hst), FERRY_ERR_STORE_NOT_FOUND); /* nothing was written */

    /* the owner's recovery: a dry run, then HEAD back at 4, signed */
    ferry_head_repair_options ro = {.keys = tk, .dry_run = 1};
    ferry_head_repair_info ri;
    CHECK_OK(ferry_head_repair(st, "r", &ro, &ri));
    CHECK(ri.version == 4 && !ri.written && ri.head_state == 0 && !strcmp(ri.run_id, rid) && ri.manifests == 4);
    ro.dry_run = 0;
    CHECK_RC(ferry_head_repair(st, "r", &(ferry_head_repair_options){.keys = rk}, &ri), FERRY_ERR_ARG); /* cannot sign */
    CHECK_OK(ferry_head_repair(st, "r", &ro, &ri));
    CHECK(ri.version == 4 && ri.written == 1);
    p = pub_open(st, "r", tk, cache, NULL);
    CHECK(p != NULL && ferry_publisher_version(p) == 4);
    ferry_model *m5 = model_of(5, 0);
    if (p) CHECK_OK(ferry_publish(p, m5, NULL));
    ferry_publisher_free(p);
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 5));
    char *head5 = get(st, "r/HEAD", &n);
    size_t n5 = n;
    /* nothing to do on a HEAD that verifies and names the newest */
    CHECK_OK(ferry_head_repair(st, "r", &ro, &ri));
    CHECK(ri.version == 5 && !ri.written && ri.head_state == 1);

    /* a forged HEAD (island 0's key): the keyed trainer refuses it ... */
    ferry_publisher_options fo = {.publisher_id = "island0"};
    ferry_keys *forger = NULL;
    char tpriv[512], tpub[512];
    keypair("trainer", tpriv, tpub);
    ferry_keys_create(&forger);
    char ipriv[512], ipub[512];
    keypair("island0", ipriv, ipub);
    CHECK_OK(ferry_keys_set_signer(forger, ipriv, NULL));
    CHECK_OK(ferry_keys_trust(forger, tpub, FERRY_KEY_PUBLISHER, NULL));
    fo.keys = forger;
    ferry_publisher *fp = NULL;
    CHECK_OK(ferry_publisher_open(st, "r", &fo, &fp));
    ferry_model *evil = model_of(6, 0x9);
    CHECK_OK(ferry_publish(fp, evil, NULL));
    ferry_publisher_free(fp);
    CHECK(pub_open(st, "r", tk, cache, NULL) == NULL && g_pub_rc == FERRY_ERR_SIG_UNTRUSTED);
    /* ... the repair puts HEAD back at 5 (the forged 6 does not verify) */
    CHECK_OK(ferry_head_repair(st, "r", &ro, &ri));
    CHECK(ri.version == 5 && ri.written && ri.head_state == 2 && ri.refused == 1 && strstr(ri.head_error, "not enrolled as a publisher"));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 5));
    /* a HEAD rolled back to 4 (validly signed): forward to 5 */
    put(st, "r/HEAD", head4, n4);
    CHECK_OK(ferry_head_repair(st, "r", &ro, &ri));
    CHECK(ri.version == 5 && ri.written && ri.head_state == 1 && ri.head_before == 4);
    /* version 5's delta deleted: HEAD (verifying, at 5) is not moved back;
     * HEAD deleted too: the newest complete version, 4, is chosen */
    char dkey[512];
    vkey(st, "r", 5, "patch", dkey);
    size_t dn;
    void *delta5 = get(st, dkey, &dn);
    CHECK_OK(ferry_store_delete(st, dkey));
    CHECK_RC(ferry_head_repair(st, "r", &ro, &ri), FERRY_ERR_SYNC_BACKWARDS);
    CHECK(strstr(ferry_last_error(), "no longer complete") != NULL);
    CHECK_OK(ferry_store_delete(st, "r/HEAD"));
    ro.dry_run = 1;
    CHECK_OK(ferry_head_repair(st, "r", &ro, &ri));
    CHECK(ri.version == 4 && strstr(ri.last_refusal, "delta is missing"));
    ro.dry_run = 0;
    put(st, dkey, delta5, dn);
    put(st, "r/HEAD", head5, n5);
    /* another run's signed versions (same key, its own run id, higher
     * versions) copied in: the repair asks which run; told, it takes ours */
    ferry_store *other = new_store();
    ferry_publisher *po = pub_open(other, "r", tk, NULL, NULL);
    for (uint64_t v = 1; po && v <= 7; v++) {
        ferry_model *m = model_of(v, 0x33);
        CHECK_OK(ferry_publish(po, m, NULL));
        ferry_model_free(m);
    }
    ferry_publisher_free(po);
    copy_prefix(other, st, "r/");
    CHECK_RC(ferry_head_repair(st, "r", &ro, &ri), FERRY_ERR_SYNC_FOREIGN);
    CHECK(strstr(ferry_last_error(), rid) != NULL && strstr(ferry_last_error(), "--run-id") != NULL);
    ro.run_id = rid;
    CHECK_OK(ferry_head_repair(st, "r", &ro, &ri));
    CHECK(ri.version == 5 && ri.written && ri.head_state == 2 && !strcmp(ri.run_id, rid));
    CHECK_OK(ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL));
    CHECK(holds(s, 5));
    p = pub_open(st, "r", tk, cache, NULL);
    CHECK(p != NULL && ferry_publisher_version(p) == 5);
    ferry_publisher_free(p);
    /* the run started anew on purpose: version 1, a new run id; the island
     * pinned to the old run refuses it */
    CHECK_OK(ferry_store_delete(st, "r/HEAD"));
    ferry_publisher_options no = {.keys = tk, .new_run = 1, .cache_path = cache};
    CHECK_OK(ferry_publisher_open(st, "r", &no, &p));
    ferry_model *m1 = model_of(1, 0x44);
    uint64_t v1 = 0;
    CHECK_OK(ferry_publish(p, m1, &v1));
    CHECK(v1 == 1 && strlen(ferry_publisher_run_id(p)) == FERRY_SYNC_ID_LEN && strcmp(ferry_publisher_run_id(p), rid));
    ferry_publisher_free(p);
    int rc = ferry_subscriber_sync(s, FERRY_SYNC_LATEST, 0, NULL);
    CHECK(rc == FERRY_ERR_SYNC_BACKWARDS || rc == FERRY_ERR_SYNC_FOREIGN);
    CHECK(holds(s, 5));
    ferry_model_free(m1);
    ferry_free(delta5);
    ferry_store_free(other);
    ferry_model_free(evil);
    ferry_model_free(m5);
    ferry_free(head4);
    ferry_free(head5);
    ferry_subscriber_free(s);
    ferry_keys_free(forger);
    ferry_keys_free(tk);
    ferry_keys_free(rk);
    ferry_keys_free(ik);
    ferry_store_free(st);
}

/* ---- signed batches ---- */

static ferry_dock *dock_open(ferry_store *st, int role, const ferry_keys *k)
{
    ferry_dock_options o = {.role = role, .keys = k, .corrupt_grace_ms = -1};
    ferry_dock *d = NULL;
    if (ferry_dock_open(st, "rl", &o, &d)) fprintf(stderr, "dock: %s\n", ferry_last_error());
    return d;
}

static int take_all(ferry_dock *c, uint64_t tv, size_t *n)
{
    ferry_dock_policy pol = {FERRY_DOCK_ASYNC, 4};
    ferry_dock_batch *b = NULL;
    int rc = ferry_dock_take(c, &pol, tv, 100, 0, &b, n);
    ferry_dock_batches_free(b, *n);
    return rc;
}

/* The XXH3-128 the header carries, recomputed as a forger would. */
static void reseal_checksum(uint8_t *b, size_t plen)
{
    XXH3_state_t *st = XXH3_createState();
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, b, 112);
    XXH3_128bits_update(st, b + FERRY_DOCK_HEADER_SIZE, plen);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
    XXH3_freeState(st);
    memcpy(b + 112, c.digest, 16);
}

static size_t count_keys(ferry_store *st, const char *prefix)
{
    ferry_store_listing *l = NULL;
    if (ferry_store_list(st, prefix, &l)) return 0;
    size_t n = l->count;
    ferry_store_listing_free(l);
    return n;
}

static void test_signed_batches(void)
{
    ferry_store *st = new_store();
    ferry_keys *i0 = signer_ring("island0"), *i1 = signer_ring("island1"), *mal = signer_ring("mallory");
    char priv[512], pub0[512], pub1[512];
    keypair("island0", priv, pub0);
    keypair("island1", priv, pub1);
    ferry_keys *enrolled = NULL;
    ferry_keys_create(&enrolled);
    CHECK_OK(ferry_keys_trust(enrolled, pub0, 0, NULL));
    CHECK_OK(ferry_keys_trust(enrolled, pub1, 1, NULL));
    ferry_dock *p0 = dock_open(st, FERRY_DOCK_PRODUCER, i0), *p1 = dock_open(st, FERRY_DOCK_PRODUCER, i1),
               *pm = dock_open(st, FERRY_DOCK_PRODUCER, mal), *pu = dock_open(st, FERRY_DOCK_PRODUCER, NULL),
               *c = dock_open(st, FERRY_DOCK_CONSUMER, enrolled);
    const char good[] = "trajectories of island 0";
    CHECK_OK(ferry_dock_put(p0, 0, 1, 0, good, sizeof good));   /* admitted */
    CHECK_OK(ferry_dock_put(p1, 1, 1, 0, good, sizeof good));   /* admitted */
    CHECK_OK(ferry_dock_put(p0, 1, 1, 1, good, sizeof good));   /* island 0's key signing as island 1 */
    CHECK_OK(ferry_dock_put(pu, 0, 1, 1, good, sizeof good));   /* unsigned */
    CHECK_OK(ferry_dock_put(pm, 0, 1, 2, good, sizeof good));   /* a key nobody enrolled */
    /* island 0's batch with the payload changed, checksum recomputed */
    char key[FERRY_DOCK_KEY_MAX];
    ferry_dock_key("rl", 1, 0, 3, key);
    CHECK_OK(ferry_dock_put(p0, 0, 1, 3, good, sizeof good));
    size_t n;
    uint8_t *b = get(st, key, &n);
    CHECK(n == FERRY_DOCK_HEADER_SIZE + sizeof good + FERRY_DOCK_SIG_SIZE);
    if (n > FERRY_DOCK_HEADER_SIZE) {
        b[FERRY_DOCK_HEADER_SIZE] ^= 1;
        reseal_checksum(b, sizeof good);
        put(st, key, b, n);
        ferry_dock_header h;
        CHECK_OK(ferry_dock_decode(b, n, 0, "rl", &h)); /* intact as far as XXH3 can tell */
        CHECK(h.signature != NULL);
    }
    size_t got = 0;
    CHECK_OK(take_all(c, 1, &got));
    CHECK(got == 2);
    ferry_dock_stats ds;
    ferry_dock_get_stats(c, &ds);
    CHECK(ds.admitted == 2 && ds.rejected_signature == 4 && ds.rejected_replay == 0);
    CHECK(count_keys(st, "rl/quarantine/signature/") == 4);
    /* replay: island 0's admitted batch put back, byte for byte */
    CHECK_OK(ferry_dock_put(p0, 0, 1, 0, good, sizeof good));
    CHECK_OK(take_all(c, 2, &got));
    CHECK(got == 0);
    ferry_dock_get_stats(c, &ds);
    CHECK(ds.admitted == 2 && ds.rejected_replay == 1 && ds.duplicates == 0);
    CHECK(count_keys(st, "rl/quarantine/replay/") == 1);
    /* the forgeries burnt no sequence number: island 0's own seq 1..3 go in */
    for (uint64_t q = 1; q <= 3; q++) CHECK_OK(ferry_dock_put(p0, 0, 2, q, good, sizeof good));
    CHECK_OK(take_all(c, 2, &got));
    CHECK(got == 3);
    /* the counts survive a restart of the consumer (they are in the cursor) */
    ferry_dock_free(c);
    c = dock_open(st, FERRY_DOCK_CONSUMER, enrolled);
    ferry_dock_get_stats(c, &ds);
    CHECK(ds.admitted == 5 && ds.rejected_signature == 4 && ds.rejected_replay == 1);
    /* a consumer without keys takes signed and unsigned batches alike */
    ferry_dock_free(c);
    ferry_store *st2 = new_store();
    ferry_dock *q0 = dock_open(st2, FERRY_DOCK_PRODUCER, i0), *qu = dock_open(st2, FERRY_DOCK_PRODUCER, NULL),
               *c2 = dock_open(st2, FERRY_DOCK_CONSUMER, NULL);
    CHECK_OK(ferry_dock_put(q0, 0, 1, 0, good, sizeof good));
    CHECK_OK(ferry_dock_put(qu, 1, 1, 0, good, sizeof good));
    CHECK_OK(take_all(c2, 1, &got));
    CHECK(got == 2);
    ferry_dock_free(q0);
    ferry_dock_free(qu);
    ferry_dock_free(c2);
    ferry_store_free(st2);
    ferry_free(b);
    ferry_dock_free(p0);
    ferry_dock_free(p1);
    ferry_dock_free(pm);
    ferry_dock_free(pu);
    ferry_keys_free(i0);
    ferry_keys_free(i1);
    ferry_keys_free(mal);
    ferry_keys_free(enrolled);
    ferry_store_free(st);
}

/* The dock's reads are bounded by what a valid object can be: a signed
 * batch whose payload is exactly max_payload is admitted (its 72-byte
 * signature is not held against the bound), and a cursor larger than any
 * valid cursor is refused without being read in full. */
static void test_dock_bounds(void)
{
    ferry_store *st = new_store();
    ferry_keys *i0 = signer_ring("island0");
    char priv[512], pub0[512];
    keypair("island0", priv, pub0);
    ferry_keys *enrolled = NULL;
    ferry_keys_create(&enrolled);
    CHECK_OK(ferry_keys_trust(enrolled, pub0, 0, NULL));
    ferry_dock_options po = {.role = FERRY_DOCK_PRODUCER, .keys = i0, .max_payload = 256};
    ferry_dock_options co = {.role = FERRY_DOCK_CONSUMER, .keys = enrolled, .corrupt_grace_ms = -1, .max_payload = 256};
    ferry_dock *p = NULL, *c = NULL;
    CHECK_OK(ferry_dock_open(st, "rl", &po, &p));
    CHECK_OK(ferry_dock_open(st, "rl", &co, &c));
    uint8_t full[256];
    memset(full, 7, sizeof full);
    CHECK_OK(ferry_dock_put(p, 0, 1, 0, full, sizeof full));
    size_t n = 0;
    CHECK_OK(take_all(c, 1, &n));
    CHECK(n == 1);
    ferry_dock_free(c);
    /* a planted cursor one byte over the largest valid one */
    size_t big = DK_CURSOR_MAX_BYTES + 1;
    uint8_t *junk = calloc(1, big);
    memcpy(junk, "FDCU", 4);
    ferry_store_listing *l = NULL;
    CHECK_OK(ferry_store_list(st, "rl/", &l));
    const char *ckey = NULL;
    for (size_t i = 0; l && i < l->count; i++)
        if (strstr(l->entries[i].key, "cursor")) ckey = l->entries[i].key;
    CHECK(ckey != NULL);
    if (ckey) {
        CHECK_OK(ferry_store_put(st, ckey, junk, big, NULL));
        c = NULL;
        CHECK_RC(ferry_dock_open(st, "rl", &co, &c), FERRY_ERR_LIMIT);
        ferry_dock_free(c);
    }
    ferry_store_listing_free(l);
    free(junk);
    ferry_dock_free(p);
    ferry_keys_free(i0);
    ferry_keys_free(enrolled);
    ferry_store_free(st);
}

/* The trailer parser on hostile bytes: a sealed record cut at every
 * length, every byte of it flipped, junk appended: a reader with keys
 * accepts none of them; one without keys never takes a cut trailer for a
 * signature (it hands the text as it is to the record's parser). */
static void test_hostile_trailers(void)
{
    ferry_keys *tk = signer_ring("trainer"), *rk = trust_ring("trainer");
    const char body[] = "{\"format\": \"ferry-head-1\", \"run\": \"r\"}";
    char *sealed = NULL;
    CHECK_OK(ferry__sign_seal(tk, FS_DOM_RECORD, body, strlen(body), &sealed));
    size_t n = sealed ? strlen(sealed) : 0, bl;
    bool sig;
    CHECK(n == strlen(body) + FS_SIG_TRAILER);
    CHECK_OK(ferry__sign_open(rk, FS_DOM_RECORD, "HEAD", sealed, n, &bl, &sig));
    CHECK(bl == strlen(body) && sig);
    CHECK_RC(ferry__sign_open(rk, FS_DOM_BATCH, "HEAD", sealed, n, &bl, &sig), FERRY_ERR_SIG_INVALID); /* another domain */
    char *buf = malloc(n + 64);
    int accepted = 0, unkeyed_misread = 0;
    for (size_t cut = 0; cut < n; cut++) { /* every prefix */
        if (!ferry__sign_open(rk, FS_DOM_RECORD, "HEAD", sealed, cut, &bl, &sig)) accepted++;
        ferry__clear_error();
        /* without keys: never a cut trailer taken for a whole one (what is
           returned is the text as it is, for the parser to judge) */
        if (!ferry__sign_open(NULL, FS_DOM_RECORD, "HEAD", sealed, cut, &bl, &sig) && (sig || bl != cut)) unkeyed_misread++;
    }
    for (size_t i = 0; i < n; i++) /* every byte flipped */
        for (int bit = 0; bit < 8; bit += 3) {
            memcpy(buf, sealed, n);
            buf[i] ^= (char)(1 << bit);
            if (!ferry__sign_open(rk, FS_DOM_RECORD, "HEAD", buf, n, &bl, &sig)) accepted++;
        }
    memcpy(buf, sealed, n); /* junk after the trailer */
    memcpy(buf + n, "\n#ferry-sig-1 x", 16);
    if (!ferry__sign_open(rk, FS_DOM_RECORD, "HEAD", buf, n + 16, &bl, &sig)) accepted++;
    CHECK_RC(ferry__sign_open(NULL, FS_DOM_RECORD, "HEAD", buf, n + 16, &bl, &sig), FERRY_ERR_SIG_MALFORMED);
    CHECK(accepted == 0);
    CHECK(unkeyed_misread == 0);
    free(buf);
    free(sealed);
    ferry_keys_free(tk);
    ferry_keys_free(rk);
}

int main(void)
{
    if (fixture_root("sign")) return 1;
    RUN(test_key_files);
    RUN(test_hostile_trailers);
    RUN(test_signed_run_reads);
    RUN(test_forged_objects);
    RUN(test_forged_records);
    RUN(test_wrong_key_and_unsigned);
    RUN(test_island_key_is_no_publisher);
    RUN(test_empty_ring);
    RUN(test_run_identity);
    RUN(test_run_identity_legacy);
    RUN(test_head_deleted_and_repair);
    RUN(test_signed_batches);
    RUN(test_dock_bounds);
    rm_rf(g_root);
    return CHECK_SUMMARY();
}
#endif
