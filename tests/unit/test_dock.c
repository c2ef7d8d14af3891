/* Trajectory dock (include/ferry_dock.h).
 *
 *   test_dock            every case on a fresh file:// store in a temporary
 *                        directory (also the wire-format and cursor cases,
 *                        which need no store)
 *   test_dock URL        the store cases against URL (tests/scripts/dock_s3.sh
 *                        runs them on s3rver); credentials and endpoint come
 *                        from the environment, as for any s3:// store
 *
 * Every case uses its own run id, so cases never see each other's objects.
 * Every loop is bounded in count and in time. */
#ifdef FERRY_NO_NET /* a core-only build (make NO_NET=1) has no dock */
#include "helpers.h"
NOT_BUILT_MAIN("dock not built (NO_NET=1)")
#else
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "check.h"
#include "helpers.h"
#include "dock/dock_impl.h" /* cursor internals, for the codec cases */
#include "ferry_dock.h"

static char g_url[600];
static char g_root[256];
static ferry_store_options g_sopts;
static int g_remote;
static int g_case;
static char g_run[FERRY_DOCK_RUN_MAX + 1];

static const char *new_run(const char *tag)
{
    snprintf(g_run, sizeof g_run, "%s-%d-%d", tag, (int)getpid(), ++g_case);
    return g_run;
}

static void msleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static ferry_store *st_open(void)
{
    ferry_store *s = NULL;
    int rc = ferry_store_open(g_url, &g_sopts, &s);
    if (rc) fprintf(stderr, "store open %s: %s\n", g_url, ferry_last_error());
    return s;
}

/* A consumer with the grace period off unless asked (file:// has none; on
 * s3:// the cases that write corrupt objects want an answer at once). */
static ferry_dock *open_role(ferry_store *s, const char *run, int role, const ferry_dock_options *base)
{
    ferry_dock_options o = {0};
    if (base) o = *base;
    o.role = role;
    if (!base) o.corrupt_grace_ms = -1;
    ferry_dock *d = NULL;
    int rc = ferry_dock_open(s, run, &o, &d);
    if (rc) fprintf(stderr, "dock open %s: %s\n", run, ferry_last_error());
    return d;
}
#define PRODUCER(s, run) open_role(s, run, FERRY_DOCK_PRODUCER, NULL)
#define CONSUMER(s, run) open_role(s, run, FERRY_DOCK_CONSUMER, NULL)

/* Payloads say who made them, so a test can check what it got back. */
static size_t make_payload(uint8_t *buf, size_t cap, uint32_t island, uint64_t seq, uint64_t version)
{
    size_t n = 24 + (size_t)((seq * 131 + island * 17 + version) % 200);
    if (n > cap) n = cap;
    uint8_t head[24];
    ferry__put64(head, island);
    ferry__put64(head + 8, seq);
    ferry__put64(head + 16, version);
    memcpy(buf, head, n < 24 ? n : 24);
    for (size_t i = 24; i < n; i++) buf[i] = (uint8_t)(i * 7 + seq + island);
    return n;
}

static int put_batch(ferry_dock *d, uint32_t island, uint64_t version, uint64_t seq)
{
    uint8_t p[256];
    size_t n = make_payload(p, sizeof p, island, seq, version);
    return ferry_dock_put(d, island, version, seq, p, n);
}

static int batch_ok(const ferry_dock_batch *b, const char *run)
{
    uint8_t p[256];
    size_t n = make_payload(p, sizeof p, b->island, b->seq, b->version);
    return b->size == n && !memcmp(b->payload, p, n) && !strcmp(b->run, run);
}

static size_t count_prefix(ferry_store *s, const char *prefix)
{
    ferry_store_listing *l = NULL;
    if (ferry_store_list(s, prefix, &l)) {
        fprintf(stderr, "list %s: %s\n", prefix, ferry_last_error());
        return (size_t)-1;
    }
    size_t n = l->count;
    ferry_store_listing_free(l);
    return n;
}

static size_t count_traj(ferry_store *s, const char *run)
{
    char p[FERRY_DOCK_KEY_MAX];
    snprintf(p, sizeof p, "%s/traj/", run);
    return count_prefix(s, p);
}

/* ---- event recorder ---------------------------------------------------- */
#define MAX_EV 8192
typedef struct rec_ev {
    int kind, code;
    uint64_t version, seq, count;
    uint32_t island;
} rec_ev;
typedef struct recorder {
    rec_ev ev[MAX_EV];
    size_t n;
} recorder;

static void on_event(void *user, const ferry_dock_event *e)
{
    recorder *r = user;
    if (r->n < MAX_EV) r->ev[r->n++] = (rec_ev){e->kind, e->code, e->version, e->seq, e->count, e->island};
}

static size_t count_ev(const recorder *r, int kind, int code)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n; i++)
        if (r->ev[i].kind == kind && (code < 0 || r->ev[i].code == code)) n++;
    return n;
}

static ferry_dock *consumer_rec(ferry_store *s, const char *run, recorder *r, ferry_dock_options *o)
{
    ferry_dock_options x = {0};
    if (o) x = *o;
    else x.corrupt_grace_ms = -1;
    x.on_event = on_event;
    x.event_user = r;
    return open_role(s, run, FERRY_DOCK_CONSUMER, &x);
}

static const ferry_dock_policy k_seq = {FERRY_DOCK_SEQUENTIAL, 0};
static ferry_dock_policy async_s(uint64_t s) { return (ferry_dock_policy){FERRY_DOCK_ASYNC, s}; }

/* ======================================================================
 * Wire format (no store)
 * ====================================================================== */
static void test_keys(void)
{
    char k[FERRY_DOCK_KEY_MAX];
    CHECK_OK(ferry_dock_key("run-1", 42, 3, 7, k));
    CHECK(!strcmp(k, "run-1/traj/v00000000000000000042/i0000000003-s00000000000000000007"));
    CHECK_OK(ferry_store_key_check(k));
    uint64_t v, s;
    uint32_t i;
    CHECK_OK(ferry_dock_key_parse("run-1", k, &v, &i, &s));
    CHECK(v == 42 && i == 3 && s == 7);
    CHECK_OK(ferry_dock_key("r", UINT64_MAX, UINT32_MAX, UINT64_MAX, k));
    CHECK_OK(ferry_dock_key_parse("r", k, &v, &i, &s));
    CHECK(v == UINT64_MAX && i == UINT32_MAX && s == UINT64_MAX);
    /* the longest key fits the documented buffer and is a valid store key */
    char run[FERRY_DOCK_RUN_MAX + 1];
    memset(run, 'x', FERRY_DOCK_RUN_MAX);
    run[FERRY_DOCK_RUN_MAX] = 0;
    CHECK_OK(ferry_dock_key(run, UINT64_MAX, UINT32_MAX, UINT64_MAX, k));
    CHECK(strlen(k) < FERRY_DOCK_KEY_MAX);
    CHECK_OK(ferry_store_key_check(k));
    static const char *bad[] = {
        "run-1/traj/v0000000000000000042/i0000000003-s00000000000000000007",   /* 19 digits */
        "run-1/traj/v00000000000000000042/i0000000003-s00000000000000000007/", /* trailing */
        "run-1/traj/v00000000000000000042/i0000000003-s0000000000000000000x",
        "run-1/traj/v99999999999999999999/i0000000003-s00000000000000000007",  /* > u64 */
        "run-1/traj/v00000000000000000042/i4294967296-s00000000000000000007",  /* > u32 */
        "run-2/traj/v00000000000000000042/i0000000003-s00000000000000000007",  /* other run */
        "run-1/traj/v00000000000000000042/i0000000003_s00000000000000000007",
        "run-1/traj/v00000000000000000042",
        "run-1/traj/junk",
        "",
    };
    for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) CHECK_RC(ferry_dock_key_parse("run-1", bad[j], &v, &i, &s), FERRY_ERR_DOCK_KEY);
    /* run ids */
    CHECK_OK(ferry_dock_run_check("a.b_c-9"));
    CHECK_RC(ferry_dock_run_check(""), FERRY_ERR_ARG);
    CHECK_RC(ferry_dock_run_check(".hidden"), FERRY_ERR_ARG);
    CHECK_RC(ferry_dock_run_check("a/b"), FERRY_ERR_ARG);
    CHECK_RC(ferry_dock_run_check("a b"), FERRY_ERR_ARG);
    CHECK_RC(ferry_dock_run_check(NULL), FERRY_ERR_ARG);
    char longrun[FERRY_DOCK_RUN_MAX + 2];
    memset(longrun, 'y', sizeof longrun - 1);
    longrun[sizeof longrun - 1] = 0;
    CHECK_RC(ferry_dock_run_check(longrun), FERRY_ERR_ARG);
    CHECK_RC(ferry_dock_key(".x", 1, 1, 1, k), FERRY_ERR_ARG);
}

static void test_wire_roundtrip(void)
{
    uint8_t p[256];
    for (size_t len = 0; len < 200; len += 37) {
        for (size_t i = 0; i < len; i++) p[i] = (uint8_t)(i ^ len);
        void *obj = NULL;
        size_t size = 0;
        CHECK_OK(ferry_dock_encode("wire", 9, 4, 123, 1700000000000ull, p, len, &obj, &size));
        CHECK(size == FERRY_DOCK_HEADER_SIZE + len);
        CHECK(obj && !memcmp(obj, "FDCK", 4));
        ferry_dock_header h;
        CHECK_OK(ferry_dock_decode(obj, size, 0, "wire", &h));
        CHECK(h.version == 9 && h.island == 4 && h.seq == 123 && h.put_time_ms == 1700000000000ull);
        CHECK(h.size == len && (!len || !memcmp(h.payload, p, len)) && !strcmp(h.run, "wire"));
        CHECK_OK(ferry_dock_decode(obj, size, 0, NULL, &h)); /* any run */
        CHECK_RC(ferry_dock_decode(obj, size, 0, "other", &h), FERRY_ERR_DOCK_RUN);
        ferry_free(obj);
    }
    void *obj = NULL;
    size_t size = 0;
    CHECK_RC(ferry_dock_encode("wire", 1, 1, 1, 0, NULL, 5, &obj, &size), FERRY_ERR_ARG);
    CHECK_RC(ferry_dock_encode("bad/run", 1, 1, 1, 0, p, 5, &obj, &size), FERRY_ERR_ARG);
    CHECK(obj == NULL);
}

/* Re-checksums a damaged header so that the damage, not the checksum, is
 * what the decoder meets. */
static void reseal(uint8_t *b, size_t size)
{
    uint64_t plen = ferry__le64(b + 40);
    size_t n = size - FERRY_DOCK_HEADER_SIZE < plen ? size - FERRY_DOCK_HEADER_SIZE : (size_t)plen;
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, b, 112);
    XXH3_128bits_update(&st, b + FERRY_DOCK_HEADER_SIZE, n);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    memcpy(b + 112, c.digest, 16);
}

/* One damaged copy of a valid object per rejection reason: (object, size). */
typedef struct damaged {
    const char *what;
    int code;
    uint8_t *b;
    size_t size;
} damaged;

static size_t make_damaged(const char *run, uint64_t version, uint32_t island, uint64_t seq, damaged *out)
{
    uint8_t p[100];
    for (int i = 0; i < 100; i++) p[i] = (uint8_t)(i * 3);
    void *obj = NULL;
    size_t size = 0, n = 0;
    if (ferry_dock_encode(run, version, island, seq, 5, p, sizeof p, &obj, &size)) return 0;
#define DAMAGE(name, want, sz)                                         \
    do {                                                               \
        out[n].what = name, out[n].code = want, out[n].size = sz;     \
        out[n].b = malloc(size + 64);                                  \
        memset(out[n].b, 0, size + 64);                                \
        memcpy(out[n].b, obj, size);                                   \
    } while (0)
    DAMAGE("bad magic", FERRY_ERR_DOCK_MAGIC, size); out[n].b[1] ^= 0x20; n++;
    DAMAGE("empty object", FERRY_ERR_DOCK_TRUNCATED, 0); n++;
    DAMAGE("half a header", FERRY_ERR_DOCK_TRUNCATED, 60); n++;
    DAMAGE("format 2", FERRY_ERR_DOCK_FORMAT, size); ferry__put16(out[n].b + 4, 2); reseal(out[n].b, size); n++;
    DAMAGE("header length 64", FERRY_ERR_DOCK_FORMAT, size); ferry__put16(out[n].b + 6, 64); reseal(out[n].b, size); n++;
    DAMAGE("payload cut short", FERRY_ERR_DOCK_TRUNCATED, size - 10); n++;
    DAMAGE("trailing bytes", FERRY_ERR_DOCK_LENGTH, size + 7); n++;
    DAMAGE("hostile length 2^63", FERRY_ERR_DOCK_LENGTH, size); ferry__put64(out[n].b + 40, 1ull << 63); reseal(out[n].b, size); n++;
    DAMAGE("hostile length 2^64-1", FERRY_ERR_DOCK_LENGTH, size); ferry__put64(out[n].b + 40, UINT64_MAX); reseal(out[n].b, size); n++;
    DAMAGE("run id length 0", FERRY_ERR_DOCK_HEADER, size); ferry__put16(out[n].b + 28, 0); reseal(out[n].b, size); n++;
    DAMAGE("run id length 65", FERRY_ERR_DOCK_HEADER, size); ferry__put16(out[n].b + 28, 65); reseal(out[n].b, size); n++;
    DAMAGE("run id with '/'", FERRY_ERR_DOCK_HEADER, size); out[n].b[48] = '/'; reseal(out[n].b, size); n++;
    DAMAGE("junk after the run id", FERRY_ERR_DOCK_HEADER, size); out[n].b[111] = 'z'; reseal(out[n].b, size); n++;
    DAMAGE("reserved flag bit set", FERRY_ERR_DOCK_HEADER, size); ferry__put16(out[n].b + 30, 2); reseal(out[n].b, size); n++;
    DAMAGE("payload bit flipped", FERRY_ERR_DOCK_CHECKSUM, size); out[n].b[size - 1] ^= 1; n++;
    DAMAGE("version bit flipped", FERRY_ERR_DOCK_CHECKSUM, size); out[n].b[8] ^= 0x80; n++;
    DAMAGE("checksum bit flipped", FERRY_ERR_DOCK_CHECKSUM, size); out[n].b[120] ^= 4; n++;
    DAMAGE("run id byte flipped", FERRY_ERR_DOCK_CHECKSUM, size); out[n].b[48] ^= 1; n++;
#undef DAMAGE
    ferry_free(obj);
    return n;
}

static void test_wire_hostile(void)
{
    damaged dm[32];
    size_t n = make_damaged("wire", 3, 2, 1, dm);
    CHECK(n >= 18);
    for (size_t i = 0; i < n; i++) {
        ferry_dock_header h;
        int rc = ferry_dock_decode(dm[i].b, dm[i].size, 0, "wire", &h);
        if (rc != dm[i].code) fprintf(stderr, "  %s: got %d (%s), want %d\n", dm[i].what, rc, ferry_last_error(), dm[i].code);
        CHECK(rc == dm[i].code);
        CHECK(*ferry_last_error());
        free(dm[i].b);
    }
    /* a payload over a caller's bound */
    uint8_t p[100] = {0};
    void *obj = NULL;
    size_t size = 0;
    ferry_dock_header h;
    CHECK_OK(ferry_dock_encode("wire", 1, 1, 1, 0, p, sizeof p, &obj, &size));
    CHECK_RC(ferry_dock_decode(obj, size, 99, "wire", &h), FERRY_ERR_DOCK_LENGTH);
    CHECK_OK(ferry_dock_decode(obj, size, 100, "wire", &h));
    CHECK_RC(ferry_dock_decode(NULL, 5, 0, "wire", &h), FERRY_ERR_ARG);
    CHECK_RC(ferry_dock_decode(NULL, 0, 0, "wire", &h), FERRY_ERR_DOCK_TRUNCATED);
    /* bounded mutation fuzz: random damage never crashes, never passes as
     * a different batch, and always earns a dock code */
    uint8_t *m = malloc(size + 16);
    uint32_t x = 12345;
    int bad_code = 0, passed = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(m, obj, size);
        size_t ms = size;
        int edits = 1 + it % 4;
        for (int e = 0; e < edits; e++) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            switch (x % 4) {
            case 0: m[(x >> 8) % ms] ^= (uint8_t)(1u << ((x >> 4) % 8)); break;
            case 1: m[(x >> 8) % ms] = (uint8_t)(x >> 24); break;
            case 2: ms = (x >> 8) % (size + 1); if (!ms) ms = 1; break;
            default: if (ms < size + 16) m[ms++] = (uint8_t)x; break;
            }
        }
        int rc = ferry_dock_decode(m, ms, 0, "wire", &h);
        if (!rc) {
            /* only an undamaged copy may pass */
            if (ms != size || memcmp(m, obj, size)) passed++;
        } else if (rc < FERRY_ERR_DOCK_MAGIC || rc > FERRY_ERR_DOCK_RUN) {
            bad_code++;
        }
    }
    CHECK(passed == 0 && bad_code == 0);
    free(m);
    ferry_free(obj);
}

/* ======================================================================
 * The cursor's ranges and codec (internals, no store)
 * ====================================================================== */
static void test_cursor_ranges(void)
{
    dk_state st = {0};
    int fresh;
    uint64_t glo, gn;
    /* in order: one range */
    for (uint64_t s = 100; s < 200; s++) {
        CHECK_OK(ferry__dock_state_mark(&st, 7, s, &fresh, &glo, &gn));
        CHECK(fresh && gn == 0);
    }
    CHECK(st.n_islands == 1 && st.islands[0].n == 1);
    CHECK(ferry__dock_state_has(&st, 7, 100) && ferry__dock_state_has(&st, 7, 199) && !ferry__dock_state_has(&st, 7, 99) && !ferry__dock_state_has(&st, 7, 200));
    CHECK_OK(ferry__dock_state_mark(&st, 7, 150, &fresh, &glo, &gn));
    CHECK(!fresh);
    /* out of order: holes close up */
    CHECK_OK(ferry__dock_state_mark(&st, 9, 5, &fresh, &glo, &gn));
    CHECK_OK(ferry__dock_state_mark(&st, 9, 3, &fresh, &glo, &gn));
    CHECK_OK(ferry__dock_state_mark(&st, 9, 1, &fresh, &glo, &gn));
    CHECK(st.islands[1].n == 3);
    CHECK_OK(ferry__dock_state_mark(&st, 9, 4, &fresh, &glo, &gn));
    CHECK_OK(ferry__dock_state_mark(&st, 9, 2, &fresh, &glo, &gn));
    CHECK(st.islands[1].n == 1 && st.islands[1].r[0].lo == 1 && st.islands[1].r[0].hi == 5);
    CHECK(!ferry__dock_state_has(&st, 9, 0) && ferry__dock_state_has(&st, 9, 3));
    /* the extremes */
    CHECK_OK(ferry__dock_state_mark(&st, UINT32_MAX, UINT64_MAX, &fresh, &glo, &gn));
    CHECK_OK(ferry__dock_state_mark(&st, UINT32_MAX, 0, &fresh, &glo, &gn));
    CHECK(ferry__dock_state_has(&st, UINT32_MAX, UINT64_MAX) && ferry__dock_state_has(&st, UINT32_MAX, 0) && !ferry__dock_state_has(&st, UINT32_MAX, 1));
    /* more holes than ranges: the narrowest is given up and reported */
    uint64_t gaps = 0;
    for (uint64_t k = 0; k < FERRY_DOCK_MAX_RANGES + 10; k++) {
        CHECK_OK(ferry__dock_state_mark(&st, 11, k * 3 + (k > 20), &fresh, &glo, &gn));
        gaps += gn;
    }
    CHECK(st.islands[2].n == FERRY_DOCK_MAX_RANGES);
    CHECK(gaps > 0);
    uint64_t mx;
    CHECK(ferry__dock_state_max_seq(&st, 11, &mx) && mx == (FERRY_DOCK_MAX_RANGES + 9) * 3 + 1);
    CHECK(!ferry__dock_state_max_seq(&st, 12, &mx));

    /* codec round trip */
    st.counters[DK_C_ADMITTED] = 17;
    st.counters[DK_C_HIST0 + 3] = 5;
    st.top_tv = 99;
    ferry_buf b = {0};
    CHECK_OK(ferry__dock_cursor_encode(&st, "cur", 0x1234, NULL, &b));
    dk_state back;
    const uint8_t *sig;
    CHECK_OK(ferry__dock_cursor_decode(b.data, b.size, "cur", &back, &sig));
    CHECK(back.n_islands == st.n_islands && back.top_tv == 99 && back.counters[DK_C_ADMITTED] == 17 &&
          back.counters[DK_C_HIST0 + 3] == 5);
    for (size_t i = 0; i < st.n_islands && i < back.n_islands; i++)
        CHECK(st.islands[i].id == back.islands[i].id && st.islands[i].n == back.islands[i].n &&
              !memcmp(st.islands[i].r, back.islands[i].r, st.islands[i].n * sizeof st.islands[i].r[0]));
    ferry__dock_state_release(&back);
    CHECK_RC(ferry__dock_cursor_decode(b.data, b.size, "other", &back, &sig), FERRY_ERR_DOCK_CURSOR);

    /* hostile cursors: every cut, every flipped byte, and well-sealed lies */
    for (size_t cut = 0; cut < b.size; cut += 1 + cut / 8) CHECK_RC(ferry__dock_cursor_decode(b.data, cut, "cur", &back, &sig), FERRY_ERR_DOCK_CURSOR);
    uint8_t *m = malloc(b.size);
    for (size_t i = 0; i < b.size; i += 3) {
        memcpy(m, b.data, b.size);
        m[i] ^= 0x41;
        CHECK_RC(ferry__dock_cursor_decode(m, b.size, "cur", &back, &sig), FERRY_ERR_DOCK_CURSOR);
    }
    struct { size_t off; uint32_t v; } lies[] = {
        {100, 1000000},         /* island count the bytes cannot hold */
        {100, (uint32_t)st.n_islands - 1}, /* bytes left over */
        {96, 7},                /* counter count */
        {104 + DK_C_COUNT * 8 + 4, 0},     /* island with no range */
        {104 + DK_C_COUNT * 8 + 4, 1000},  /* ranges past the end */
        {104 + DK_C_COUNT * 8, 9},         /* islands out of order (7 then 9 then 9) */
    };
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        memcpy(m, b.data, b.size);
        ferry__put32(m + lies[i].off, lies[i].v);
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits(m, b.size - 16));
        memcpy(m + b.size - 16, c.digest, 16);
        int rc = ferry__dock_cursor_decode(m, b.size, "cur", &back, &sig);
        if (rc != FERRY_ERR_DOCK_CURSOR) fprintf(stderr, "  lie %zu: rc %d\n", i, rc);
        CHECK(rc == FERRY_ERR_DOCK_CURSOR);
    }
    /* overlapping ranges, sealed */
    memcpy(m, b.data, b.size);
    size_t r0 = 104 + DK_C_COUNT * 8 + 8 + 16 + 8; /* island 9's first range (island 7 has one) */
    ferry__put64(m + r0, 0);
    ferry__put64(m + r0 + 8, 200);
    ferry__put32(m + r0 - 4, 2); /* claim two ranges: the second is the next island's header bytes */
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(m, b.size - 16));
    memcpy(m + b.size - 16, c.digest, 16);
    CHECK_RC(ferry__dock_cursor_decode(m, b.size, "cur", &back, &sig), FERRY_ERR_DOCK_CURSOR);
    free(m);
    ferry__buf_release(&b);
    ferry__dock_state_release(&st);
}

/* ======================================================================
 * Against a store
 * ====================================================================== */
static void test_roundtrip(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("rt");
    ferry_dock *prod = PRODUCER(s, run), *cons = CONSUMER(s, run);
    CHECK(prod && cons);
    CHECK_OK(ferry_dock_put(prod, 1, 0, 0, "", 0)); /* empty payload */
    CHECK_OK(put_batch(prod, 1, 0, 1));
    CHECK_OK(put_batch(prod, 2, 0, 0));
    CHECK(count_traj(s, run) == 3);
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    ferry_dock_policy p = async_s(0);
    CHECK_OK(ferry_dock_take(cons, &p, 0, 10, 0, &b, &n));
    CHECK(n == 3);
    int seen_empty = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK(b[i].version == 0 && b[i].staleness == 0 && !strcmp(b[i].run, run) && b[i].put_time_ms > 0);
        if (b[i].size == 0) seen_empty++;
        else CHECK(batch_ok(&b[i], run));
    }
    CHECK(seen_empty == 1);
    /* key order: island 1 seq 0, island 1 seq 1, island 2 seq 0 */
    CHECK(n == 3 && b[0].island == 1 && b[0].seq == 0 && b[1].seq == 1 && b[2].island == 2);
    ferry_dock_batches_free(b, n);
    CHECK(count_traj(s, run) == 0); /* consumed batches are gone */
    char ck[200];
    snprintf(ck, sizeof ck, "%s/dock/cursor", run);
    ferry_store_stat st;
    CHECK_OK(ferry_store_head(s, ck, &st));
    ferry_dock_stats ds;
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.admitted == 3 && ds.staleness_hist[0] == 3 && ds.dropped_stale == 0 && ds.duplicates == 0);
    CHECK(ds.cursor_writes >= 1 && ds.lists >= 1);
    ferry_dock_get_stats(prod, &ds);
    uint8_t tmp[256];
    size_t bytes = 3 * FERRY_DOCK_HEADER_SIZE + make_payload(tmp, sizeof tmp, 1, 1, 0) + make_payload(tmp, sizeof tmp, 2, 0, 0);
    CHECK(ds.puts == 3 && ds.put_bytes == bytes);
    /* nothing left: a non-blocking take returns nothing, a blocking one waits */
    CHECK_OK(ferry_dock_take(cons, &p, 0, 10, 0, &b, &n));
    CHECK(n == 0 && b == NULL);
    double t0 = now_s();
    CHECK_OK(ferry_dock_take(cons, &p, 0, 10, 150, &b, &n));
    double dt = now_s() - t0;
    CHECK(n == 0 && dt >= 0.14 && dt < 5);
    ferry_dock_free(prod);
    ferry_dock_free(cons);
    ferry_store_free(s);
}

/* A blocking take returns as soon as max_batches arrive, however they trickle in. */
static void test_blocking_take(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("block");
    ferry_dock *cons = CONSUMER(s, run);
    pid_t pid = fork();
    if (pid == 0) {
        ferry_store *cs = st_open();
        ferry_dock *prod = PRODUCER(cs, run);
        int bad = 0;
        for (int i = 0; i < 5; i++) {
            msleep(40);
            bad |= put_batch(prod, 4, 2, (uint64_t)i);
        }
        ferry_dock_free(prod);
        ferry_store_free(cs);
        _exit(bad ? 1 : 0);
    }
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    ferry_dock_policy p = async_s(1);
    double t0 = now_s();
    CHECK_OK(ferry_dock_take(cons, &p, 2, 5, 20000, &b, &n));
    double dt = now_s() - t0;
    CHECK(n == 5 && dt < 15);
    for (size_t i = 0; i < n; i++) CHECK(b[i].seq == i && batch_ok(&b[i], run));
    ferry_dock_batches_free(b, n);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ferry_dock_free(cons);
    ferry_store_free(s);
}

static void test_sequential(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("seq");
    recorder *r = calloc(1, sizeof *r);
    ferry_dock *prod = PRODUCER(s, run), *cons = consumer_rec(s, run, r, NULL);
    uint64_t seq[3] = {0};
    for (uint64_t v = 1; v <= 3; v++)
        for (uint32_t isl = 0; isl < 3; isl++)
            for (int k = 0; k < 2; k++) CHECK_OK(put_batch(prod, isl, v, seq[isl]++));
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    /* exact version 2: its six batches; version 1 is stale (dropped),
     * version 3 is left for later */
    CHECK_OK(ferry_dock_take(cons, &k_seq, 2, 100, 0, &b, &n));
    CHECK(n == 6);
    for (size_t i = 0; i < n; i++) CHECK(b[i].version == 2 && b[i].staleness == 0 && batch_ok(&b[i], run));
    ferry_dock_batches_free(b, n);
    ferry_dock_stats ds;
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.admitted == 6 && ds.dropped_stale == 6);
    CHECK(count_ev(r, FERRY_DOCK_EV_DROPPED, 0) == 6);
    for (size_t i = 0; i < r->n; i++) CHECK(r->ev[i].version == 1);
    CHECK(count_traj(s, run) == 6); /* version 3 waits */
    /* a straggler of version 2 arrives after the trainer moved to 3 */
    CHECK_OK(ferry_dock_take(cons, &k_seq, 3, 3, 0, &b, &n));
    CHECK(n == 3);
    for (size_t i = 0; i < n; i++) CHECK(b[i].version == 3);
    ferry_dock_batches_free(b, n);
    CHECK_OK(put_batch(prod, 1, 2, seq[1]++));
    CHECK_OK(ferry_dock_take(cons, &k_seq, 3, 100, 0, &b, &n));
    CHECK(n == 3); /* the rest of version 3, not the straggler (not listed) */
    ferry_dock_batches_free(b, n);
    CHECK(count_traj(s, run) == 1);
    CHECK_OK(ferry_dock_sweep(cons, &k_seq, 3)); /* the sweep finds it */
    CHECK(count_traj(s, run) == 0);
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.admitted == 12 && ds.dropped_stale == 7 && ds.rejected_future == 0);
    ferry_dock_free(prod);
    ferry_dock_free(cons);
    ferry_store_free(s);
    free(r);
}

/* Async with staleness S over a moving trainer: no admitted batch is older
 * than S, every other one is counted as dropped, and the two add up. */
static void test_async_staleness(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("async");
    recorder *r = calloc(1, sizeof *r);
    ferry_dock_options o = {.corrupt_grace_ms = -1, .sweep_every = 3};
    ferry_dock *prod = PRODUCER(s, run), *cons = consumer_rec(s, run, r, &o);
    const uint64_t S = 2;
    ferry_dock_policy p = async_s(S);
    /* a backlog of versions 0..9, then a take at 9 */
    uint64_t put = 0, seq = 0, stale_put = 0;
    for (uint64_t v = 0; v <= 9; v++)
        for (int k = 0; k < 2; k++, put++) {
            CHECK_OK(put_batch(prod, 5, v, seq++));
            if (9 - v > S) stale_put++;
        }
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    CHECK_OK(ferry_dock_take(cons, &p, 9, 100, 0, &b, &n));
    CHECK(n == (S + 1) * 2);
    for (size_t i = 0; i < n; i++) CHECK(b[i].staleness <= S && b[i].version >= 9 - S && batch_ok(&b[i], run));
    ferry_dock_batches_free(b, n);
    ferry_dock_stats ds;
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.dropped_stale == stale_put && ds.admitted == n);
    CHECK(count_traj(s, run) == 0);

    /* a moving trainer; islands lag by 0..5 versions */
    uint64_t admitted = ds.admitted, lagged = 0;
    uint32_t x = 7;
    for (uint64_t tv = 10; tv < 40; tv++) {
        for (int k = 0; k < 4; k++) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            uint64_t lag = x % 6;
            CHECK_OK(put_batch(prod, 6 + (uint32_t)(x % 3), tv - lag, seq++));
            put++;
            if (lag > S) lagged++;
        }
        CHECK_OK(ferry_dock_take(cons, &p, tv, 3, 0, &b, &n)); /* fewer than put: a backlog builds */
        for (size_t i = 0; i < n; i++) {
            CHECK(b[i].staleness <= S && tv - b[i].version == b[i].staleness);
            CHECK(batch_ok(&b[i], run));
        }
        admitted += n;
        ferry_dock_batches_free(b, n);
    }
    /* drain at the last version, then sweep */
    for (int k = 0; k < 10; k++) {
        CHECK_OK(ferry_dock_take(cons, &p, 39, 100, 0, &b, &n));
        admitted += n;
        ferry_dock_batches_free(b, n);
    }
    CHECK_OK(ferry_dock_sweep(cons, &p, 39));
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.admitted == admitted);
    CHECK(ds.admitted + ds.dropped_stale == put);
    CHECK(ds.dropped_stale >= stale_put + lagged); /* the backlog ages too */
    CHECK(count_ev(r, FERRY_DOCK_EV_DROPPED, 0) == ds.dropped_stale);
    uint64_t h = 0;
    for (int i = 0; i < FERRY_DOCK_HIST; i++) {
        h += ds.staleness_hist[i];
        if ((uint64_t)i > S) CHECK(ds.staleness_hist[i] == 0);
    }
    CHECK(h == ds.admitted);
    CHECK(ds.duplicates == 0 && ds.rejected_corrupt == 0);
    CHECK(count_traj(s, run) == 0);
    ferry_dock_free(prod);
    ferry_dock_free(cons);
    ferry_store_free(s);
    free(r);
}

/* A window wider than 16 versions is read with one listing. */
static void test_wide_window(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("wide");
    ferry_dock *prod = PRODUCER(s, run), *cons = CONSUMER(s, run);
    for (uint64_t v = 0; v < 40; v++) CHECK_OK(put_batch(prod, 1, v, v));
    ferry_dock_policy p = async_s(100);
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    CHECK_OK(ferry_dock_take(cons, &p, 40, 100, 0, &b, &n)); /* first take: a sweep */
    CHECK(n == 40);
    ferry_dock_batches_free(b, n);
    for (uint64_t v = 40; v < 50; v++) CHECK_OK(put_batch(prod, 1, v, v));
    ferry_dock_stats before, after;
    ferry_dock_get_stats(cons, &before);
    CHECK_OK(ferry_dock_take(cons, &p, 50, 100, 0, &b, &n));
    ferry_dock_get_stats(cons, &after);
    CHECK(n == 10 && after.lists - before.lists == 1);
    ferry_dock_batches_free(b, n);
    /* a narrow window lists one prefix per admissible version, plus those
     * that left the window since the last take (here 49..51) */
    ferry_dock_policy p1 = async_s(1);
    CHECK_OK(ferry_dock_take(cons, &p1, 50, 100, 0, &b, &n));
    CHECK(n == 0);
    ferry_dock_get_stats(cons, &before);
    CHECK_OK(ferry_dock_take(cons, &p1, 51, 100, 0, &b, &n));
    ferry_dock_get_stats(cons, &after);
    CHECK(n == 0 && after.lists - before.lists == 3);
    ferry_dock_free(prod);
    ferry_dock_free(cons);
    ferry_store_free(s);
}

static void test_future(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("future");
    recorder *r = calloc(1, sizeof *r);
    ferry_dock *prod = PRODUCER(s, run), *cons = consumer_rec(s, run, r, NULL);
    CHECK_OK(put_batch(prod, 1, 5, 0));
    CHECK_OK(put_batch(prod, 1, 10, 1)); /* from the future */
    ferry_dock_policy p = async_s(3);
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    CHECK_OK(ferry_dock_take(cons, &p, 5, 10, 0, &b, &n)); /* the first take sweeps */
    CHECK(n == 1 && b[0].version == 5);
    ferry_dock_batches_free(b, n);
    ferry_dock_stats ds;
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.rejected_future == 1 && ds.rejected_by_code[FERRY_ERR_DOCK_FUTURE - 100] == 1);
    CHECK(count_ev(r, FERRY_DOCK_EV_REJECTED, FERRY_ERR_DOCK_FUTURE) == 1);
    CHECK(count_traj(s, run) == 0);
    char q[300];
    snprintf(q, sizeof q, "%s/quarantine/future/v00000000000000000010/i0000000001-s00000000000000000001", run);
    void *data = NULL;
    size_t size = 0;
    CHECK_OK(ferry_store_get(s, q, &data, &size, NULL)); /* evidence kept, intact */
    ferry_dock_header h;
    CHECK_OK(ferry_dock_decode(data, size, 0, run, &h));
    CHECK(h.version == 10);
    ferry_free(data);
    ferry_dock_free(prod);
    ferry_dock_free(cons);
    ferry_store_free(s);
    free(r);
}

static void test_duplicates(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("dup");
    recorder *r = calloc(1, sizeof *r);
    ferry_dock *prod = PRODUCER(s, run), *cons = consumer_rec(s, run, r, NULL);
    ferry_dock_policy p0 = async_s(0), p = async_s(4);
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    /* the same (island, seq) put twice before a take: one object */
    CHECK_OK(put_batch(prod, 1, 1, 5));
    CHECK_OK(put_batch(prod, 1, 1, 5));
    /* and under two versions (an island that re-synced, then re-put):
     * the admissible copy is consumed, the stale one is its duplicate */
    CHECK_OK(put_batch(prod, 1, 1, 6));
    CHECK_OK(put_batch(prod, 1, 2, 6));
    CHECK_OK(put_batch(prod, 1, 2, 7));
    CHECK_OK(ferry_dock_take(cons, &p0, 2, 10, 0, &b, &n));
    CHECK(n == 2 && b[0].seq == 6 && b[0].version == 2 && b[1].seq == 7);
    ferry_dock_batches_free(b, n);
    ferry_dock_stats ds;
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.admitted == 2 && ds.dropped_stale == 1 && ds.duplicates == 1);
    CHECK(count_ev(r, FERRY_DOCK_EV_DUPLICATE, 0) == 1 && count_ev(r, FERRY_DOCK_EV_DROPPED, 0) == 1);
    CHECK(count_traj(s, run) == 0);
    /* re-puts after consumption (or drop): duplicates, deleted unread */
    CHECK_OK(put_batch(prod, 1, 1, 5));
    CHECK_OK(put_batch(prod, 1, 2, 5));
    CHECK_OK(put_batch(prod, 1, 2, 6));
    CHECK_OK(put_batch(prod, 1, 2, 8)); /* new */
    CHECK_OK(ferry_dock_take(cons, &p, 2, 10, 0, &b, &n));
    CHECK(n == 1 && b[0].seq == 8);
    ferry_dock_batches_free(b, n);
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.admitted == 3 && ds.duplicates == 4);
    CHECK(count_traj(s, run) == 0);
    ferry_dock_free(cons);

    /* a restarted trainer (new handle, cursor from the store): the island
     * re-puts everything it ever sent; nothing comes back twice */
    for (uint64_t q = 5; q <= 8; q++) CHECK_OK(put_batch(prod, 1, 2, q));
    CHECK_OK(put_batch(prod, 1, 3, 9));
    r->n = 0;
    cons = consumer_rec(s, run, r, NULL);
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.admitted == 3 && ds.duplicates == 4); /* counters survive the restart */
    CHECK_OK(ferry_dock_take(cons, &p, 3, 10, 0, &b, &n));
    CHECK(n == 1 && b[0].seq == 9);
    ferry_dock_batches_free(b, n);
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.admitted == 4 && ds.duplicates == 8 && count_ev(r, FERRY_DOCK_EV_DUPLICATE, 0) == 4);
    CHECK(count_traj(s, run) == 0);

    /* two consumers: the second holds a stale cursor, reads a batch the
     * first already consumed (re-put, as if its delete had not happened
     * yet), loses the CAS, re-reads the cursor and does not return it */
    ferry_dock *c2 = CONSUMER(s, run);
    CHECK_OK(put_batch(prod, 1, 3, 10));
    CHECK_OK(ferry_dock_take(cons, &p, 3, 10, 0, &b, &n));
    CHECK(n == 1 && b[0].seq == 10);
    ferry_dock_batches_free(b, n);
    CHECK_OK(put_batch(prod, 1, 3, 10));
    CHECK_OK(put_batch(prod, 1, 3, 11));
    CHECK_OK(ferry_dock_take(c2, &p, 3, 10, 0, &b, &n));
    CHECK(n == 1 && b[0].seq == 11);
    ferry_dock_batches_free(b, n);
    ferry_dock_get_stats(c2, &ds);
    CHECK(ds.cursor_conflicts >= 1 && ds.admitted == 6);
    CHECK(count_traj(s, run) == 0);
    ferry_dock_free(c2);
    ferry_dock_free(prod);
    ferry_dock_free(cons);
    ferry_store_free(s);
    free(r);
}

/* Every kind of damage under a valid key, a foreign run's batch under our
 * key, a misplaced batch, a junk name, an oversized object: each rejected
 * with its code, counted, quarantined (or deleted), never returned. */
static void test_corrupt(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("corrupt");
    recorder *r = calloc(1, sizeof *r);
    ferry_dock_options o = {.corrupt_grace_ms = -1, .max_payload = 1000};
    ferry_dock *prod = PRODUCER(s, run), *cons = consumer_rec(s, run, r, &o);
    damaged dm[32];
    size_t nd = make_damaged(run, 4, 2, 0, dm);
    char key[FERRY_DOCK_KEY_MAX];
    uint64_t want[FERRY_ERR_DOCK_FUTURE - 99] = {0};
    for (size_t i = 0; i < nd; i++) {
        CHECK_OK(ferry_dock_key(run, 4, 2, i, key));
        /* the damaged copies were made for seq 0: put them where they say
         * they belong unless the key is the point */
        CHECK_OK(ferry_store_put(s, key, dm[i].b, dm[i].size, NULL));
        want[dm[i].code - 100]++;
        free(dm[i].b);
    }
    uint64_t seq = nd;
    /* an intact batch of another run, under our key */
    void *obj;
    size_t size;
    uint8_t p[64] = {1, 2, 3};
    CHECK_OK(ferry_dock_encode("someone-else", 4, 2, seq, 0, p, sizeof p, &obj, &size));
    CHECK_OK(ferry_dock_key(run, 4, 2, seq++, key));
    CHECK_OK(ferry_store_put(s, key, obj, size, NULL));
    ferry_free(obj);
    want[FERRY_ERR_DOCK_RUN - 100]++;
    /* an intact batch of ours whose header names another seq */
    CHECK_OK(ferry_dock_encode(run, 4, 2, 999, 0, p, sizeof p, &obj, &size));
    CHECK_OK(ferry_dock_key(run, 4, 2, seq++, key));
    CHECK_OK(ferry_store_put(s, key, obj, size, NULL));
    want[FERRY_ERR_DOCK_MISPLACED - 100]++;
    /* ... and one under another version's key */
    CHECK_OK(ferry_dock_key(run, 3, 2, 999, key));
    CHECK_OK(ferry_store_put(s, key, obj, size, NULL));
    ferry_free(obj);
    want[FERRY_ERR_DOCK_MISPLACED - 100]++;
    /* names that are not batch keys */
    char junk[300];
    snprintf(junk, sizeof junk, "%s/traj/v00000000000000000004/notes.txt", run);
    CHECK_OK(ferry_store_put(s, junk, "hello", 5, NULL));
    snprintf(junk, sizeof junk, "%s/traj/stray", run);
    CHECK_OK(ferry_store_put(s, junk, "x", 1, NULL));
    want[FERRY_ERR_DOCK_KEY - 100] += 2;
    /* an object too large to read (payload bound 1000 here) */
    uint8_t *big = calloc(1, 5000);
    memcpy(big, "FDCK", 4);
    CHECK_OK(ferry_dock_key(run, 4, 2, seq++, key));
    CHECK_OK(ferry_store_put(s, key, big, 5000, NULL));
    free(big);
    want[FERRY_ERR_DOCK_LENGTH - 100]++;
    /* a good batch among them */
    CHECK_OK(put_batch(prod, 2, 4, seq));
    uint64_t total = 0;
    for (int i = 0; i < 10; i++) total += want[i];

    ferry_dock_batch *b = NULL;
    size_t n = 0;
    ferry_dock_policy pol = async_s(1);
    CHECK_OK(ferry_dock_take(cons, &pol, 4, 10, 0, &b, &n));
    CHECK(n == 1 && b[0].seq == seq && batch_ok(&b[0], run));
    ferry_dock_batches_free(b, n);
    ferry_dock_stats ds;
    ferry_dock_get_stats(cons, &ds);
    for (int i = 0; i < 10; i++) {
        if (ds.rejected_by_code[i] != want[i] || count_ev(r, FERRY_DOCK_EV_REJECTED, 100 + i) != want[i])
            fprintf(stderr, "  code %d: counted %" PRIu64 ", events %zu, want %" PRIu64 "\n", 100 + i,
                    ds.rejected_by_code[i], count_ev(r, FERRY_DOCK_EV_REJECTED, 100 + i), want[i]);
        CHECK(ds.rejected_by_code[i] == want[i]);
        CHECK(count_ev(r, FERRY_DOCK_EV_REJECTED, 100 + i) == want[i]);
    }
    CHECK(ds.rejected_run == 1 && ds.rejected_future == 0 && ds.rejected_corrupt == total - 1);
    CHECK(ds.admitted == 1);
    CHECK(count_traj(s, run) == 0);
    char qp[200];
    snprintf(qp, sizeof qp, "%s/quarantine/", run);
    CHECK(count_prefix(s, qp) == total - 1); /* all but the unreadable one */
    snprintf(qp, sizeof qp, "%s/quarantine/checksum/", run);
    CHECK(count_prefix(s, qp) == want[FERRY_ERR_DOCK_CHECKSUM - 100]);
    snprintf(qp, sizeof qp, "%s/quarantine/key/", run);
    CHECK(count_prefix(s, qp) == 2);
    /* with delete_rejected nothing is kept */
    ferry_dock_free(cons);
    o.delete_rejected = 1;
    cons = consumer_rec(s, run, r, &o);
    CHECK_OK(ferry_dock_key(run, 4, 3, 0, key));
    CHECK_OK(ferry_store_put(s, key, "FDCK", 4, NULL));
    CHECK_OK(ferry_dock_take(cons, &pol, 4, 10, 0, &b, &n));
    CHECK(n == 0);
    snprintf(qp, sizeof qp, "%s/quarantine/truncated/", run);
    CHECK(count_prefix(s, qp) == want[FERRY_ERR_DOCK_TRUNCATED - 100]);
    CHECK(count_traj(s, run) == 0);
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.rejected_by_code[FERRY_ERR_DOCK_TRUNCATED - 100] == want[FERRY_ERR_DOCK_TRUNCATED - 100] + 1);
    ferry_dock_free(prod);
    ferry_dock_free(cons);
    ferry_store_free(s);
    free(r);
}

/* The grace period: an object that looks corrupt is left alone until it
 * has looked the same for grace_ms; one that gets fixed is admitted. */
static void test_grace(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("grace");
    ferry_dock_options o = {.corrupt_grace_ms = 300};
    recorder *r = calloc(1, sizeof *r);
    ferry_dock *prod = PRODUCER(s, run), *cons = consumer_rec(s, run, r, &o);
    char k1[FERRY_DOCK_KEY_MAX], k2[FERRY_DOCK_KEY_MAX];
    CHECK_OK(ferry_dock_key(run, 1, 1, 0, k1));
    CHECK_OK(ferry_dock_key(run, 1, 1, 1, k2));
    CHECK_OK(ferry_store_put(s, k1, "FDCK-half-written", 17, NULL));
    CHECK_OK(ferry_store_put(s, k2, "FDCK-half-written", 17, NULL));
    ferry_dock_policy p = async_s(0);
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    CHECK_OK(ferry_dock_take(cons, &p, 1, 10, 0, &b, &n));
    CHECK(n == 0 && count_traj(s, run) == 2);
    ferry_dock_stats ds;
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.deferred == 2 && ds.rejected_corrupt == 0);
    CHECK_OK(put_batch(prod, 1, 1, 1)); /* the write completes */
    msleep(350);
    CHECK_OK(ferry_dock_take(cons, &p, 1, 10, 0, &b, &n));
    CHECK(n == 1 && b[0].seq == 1);
    ferry_dock_batches_free(b, n);
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.rejected_by_code[FERRY_ERR_DOCK_TRUNCATED - 100] == 1 && ds.admitted == 1);
    CHECK(count_traj(s, run) == 0);
    ferry_dock_free(prod);
    ferry_dock_free(cons);
    ferry_store_free(s);
    free(r);
}

static void test_other_run(void)
{
    ferry_store *s = st_open();
    char a[FERRY_DOCK_RUN_MAX + 1], bname[FERRY_DOCK_RUN_MAX + 1];
    snprintf(a, sizeof a, "%s", new_run("runa"));
    snprintf(bname, sizeof bname, "%s", new_run("runb"));
    ferry_dock *pa = PRODUCER(s, a), *pb = PRODUCER(s, bname), *ca = CONSUMER(s, a);
    for (uint64_t q = 0; q < 4; q++) {
        CHECK_OK(put_batch(pa, 1, 1, q));
        CHECK_OK(put_batch(pb, 1, 1, q));
    }
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    ferry_dock_policy p = async_s(0);
    CHECK_OK(ferry_dock_take(ca, &p, 1, 100, 0, &b, &n));
    CHECK(n == 4);
    for (size_t i = 0; i < n; i++) CHECK(!strcmp(b[i].run, a) && batch_ok(&b[i], a));
    ferry_dock_batches_free(b, n);
    CHECK(count_traj(s, a) == 0 && count_traj(s, bname) == 4); /* the other run is untouched */
    ferry_dock_stats ds;
    ferry_dock_get_stats(ca, &ds);
    CHECK(ds.rejected_run == 0 && ds.admitted == 4);
    /* a cursor of run B copied over run A's is refused */
    ferry_dock *cb = CONSUMER(s, bname);
    CHECK_OK(ferry_dock_take(cb, &p, 1, 1, 0, &b, &n));
    ferry_dock_batches_free(b, n);
    char ka[200], kb[200];
    snprintf(ka, sizeof ka, "%s/dock/cursor", a);
    snprintf(kb, sizeof kb, "%s/dock/cursor", bname);
    void *data;
    size_t size;
    CHECK_OK(ferry_store_get(s, kb, &data, &size, NULL));
    CHECK_OK(ferry_store_put(s, ka, data, size, NULL));
    ferry_free(data);
    ferry_dock *bad = NULL;
    ferry_dock_options o = {.role = FERRY_DOCK_CONSUMER};
    CHECK_RC(ferry_dock_open(s, a, &o, &bad), FERRY_ERR_DOCK_CURSOR);
    CHECK(bad == NULL);
    CHECK_OK(ferry_store_put(s, ka, "garbage", 7, NULL));
    CHECK_RC(ferry_dock_open(s, a, &o, &bad), FERRY_ERR_DOCK_CURSOR);
    uint64_t next;
    CHECK_RC(ferry_dock_resume_seq(pa, 1, &next), FERRY_ERR_DOCK_CURSOR);
    ferry_dock_free(pa);
    ferry_dock_free(pb);
    ferry_dock_free(ca);
    ferry_dock_free(cb);
    ferry_store_free(s);
}

static void test_resume_seq(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("resume");
    ferry_dock *prod = PRODUCER(s, run), *cons = CONSUMER(s, run);
    uint64_t next = 99;
    CHECK_OK(ferry_dock_resume_seq(prod, 3, &next));
    CHECK(next == 0);
    for (uint64_t q = 0; q < 5; q++) CHECK_OK(put_batch(prod, 3, 1, q));
    CHECK_OK(put_batch(prod, 4, 1, 70));
    CHECK_OK(ferry_dock_resume_seq(prod, 3, &next));
    CHECK(next == 5); /* from the listing */
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    ferry_dock_policy p = async_s(0);
    CHECK_OK(ferry_dock_take(cons, &p, 1, 100, 0, &b, &n));
    CHECK(n == 6);
    ferry_dock_batches_free(b, n);
    CHECK(count_traj(s, run) == 0);
    CHECK_OK(ferry_dock_resume_seq(prod, 3, &next));
    CHECK(next == 5); /* from the cursor */
    CHECK_OK(ferry_dock_resume_seq(prod, 4, &next));
    CHECK(next == 71);
    CHECK_OK(ferry_dock_resume_seq(cons, 5, &next));
    CHECK(next == 0);
    ferry_dock_free(prod);
    ferry_dock_free(cons);
    ferry_store_free(s);
}

/* ---- keys (issue 23: the signed cursor, resume_seq) --------------------- */
static char g_keydir[256];

/* KEYDIR/NAME.key and .pub, made once per process. */
static const char *key_path(const char *name, const char *ext)
{
    static char path[4][600];
    static int slot;
    char *p = path[slot++ & 3];
    snprintf(p, sizeof path[0], "%s/%s.%s", g_keydir, name, ext);
    if (access(p, F_OK)) {
        char prefix[600];
        snprintf(prefix, sizeof prefix, "%s/%s", g_keydir, name);
        if (ferry_keygen(prefix, NULL)) fprintf(stderr, "keygen %s: %s\n", prefix, ferry_last_error());
    }
    return p;
}

/* The trainer's ring: its signing key (a publisher), islands 0 and 1's keys
 * enrolled for their batches. */
static ferry_keys *trainer_ring(const char *signer)
{
    ferry_keys *k = NULL;
    int rc = ferry_keys_create(&k);
    if (!rc) rc = ferry_keys_set_signer(k, key_path(signer, "key"), NULL);
    for (int64_t i = 0; !rc && i < 2; i++) rc = ferry_keys_trust(k, key_path(i ? "island1" : "island0", "pub"), i, NULL);
    if (rc) fprintf(stderr, "trainer ring: %s\n", ferry_last_error());
    return k;
}

/* Island i's ring: its own key signs its batches; the trainer's key is
 * trusted as the publisher (for versions, and for the cursor). */
static ferry_keys *island_ring(int64_t i)
{
    ferry_keys *k = NULL;
    int rc = ferry_keys_create(&k);
    if (!rc) rc = ferry_keys_set_island_signer(k, key_path(i ? "island1" : "island0", "key"), i, NULL);
    if (!rc) rc = ferry_keys_trust(k, key_path("trainer", "pub"), FERRY_KEY_PUBLISHER, NULL);
    if (rc) fprintf(stderr, "island ring: %s\n", ferry_last_error());
    return k;
}

static ferry_dock *open_keyed(ferry_store *s, const char *run, int role, const ferry_keys *k, uint64_t resume_commits, int *rc)
{
    ferry_dock_options o = {.role = role, .keys = k, .corrupt_grace_ms = -1, .resume_commits = resume_commits};
    ferry_dock *d = NULL;
    *rc = ferry_dock_open(s, run, &o, &d);
    return d;
}

static uint8_t *get_obj(ferry_store *s, const char *key, size_t *n)
{
    void *data = NULL;
    *n = 0;
    if (ferry_store_get(s, key, &data, n, NULL)) fprintf(stderr, "get %s: %s\n", key, ferry_last_error());
    return data;
}

/* Deletes what a case planted under RUN/traj/ (dock_s3.sh checks that the
 * cases leave no batch behind). */
static void clear_traj(ferry_store *s, const char *run)
{
    char p[FERRY_DOCK_KEY_MAX];
    snprintf(p, sizeof p, "%s/traj/", run);
    ferry_store_listing *l = NULL;
    CHECK_OK(ferry_store_list(s, p, &l));
    for (size_t i = 0; l && i < l->count; i++) CHECK_OK(ferry_store_delete(s, l->entries[i].key));
    ferry_store_listing_free(l);
}

static size_t take_n(ferry_dock *c, uint64_t tv, int *rc)
{
    ferry_dock_policy p = async_s(4);
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    *rc = ferry_dock_take(c, &p, tv, 100, 0, &b, &n);
    ferry_dock_batches_free(b, n);
    return n;
}

/* A forged state: island 0's seqs 0..hi resolved, trainer version top. */
static void forge_cursor(ferry_store *s, const char *run, uint64_t hi, uint64_t top, uint64_t commits, const ferry_keys *signer)
{
    dk_state st = {0};
    int fresh;
    uint64_t gl, gn;
    ferry__dock_state_mark(&st, 0, 0, &fresh, &gl, &gn);
    st.islands[0].r[0].hi = hi;
    st.top_tv = top;
    st.commits = commits;
    ferry_buf b = {0};
    char key[FERRY_DOCK_KEY_MAX];
    snprintf(key, sizeof key, "%s/dock/cursor", run);
    CHECK_OK(ferry__dock_cursor_encode(&st, run, 7, signer, &b));
    CHECK_OK(ferry_store_put(s, key, b.data, b.size, NULL));
    ferry__buf_release(&b);
    ferry__dock_state_release(&st);
}

/* Issue 23 item 8, the store writer's attacks on the cursor: with the
 * trainer's key the cursor is signed; a forged one (unsigned, or signed by
 * a key the trainer does not trust) is refused, never believed; a cursor
 * the handle held that disappears or goes back to an older signed copy is
 * FERRY_ERR_DOCK_ROLLBACK, never a silent reset (which re-admitted
 * replays and zeroed the counters); a restarted trainer that says how far
 * its cursor had come (resume_commits) refuses an older one or none. */
static void test_cursor_attacks(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("cursig");
    char ckey[FERRY_DOCK_KEY_MAX];
    snprintf(ckey, sizeof ckey, "%s/dock/cursor", run);
    ferry_keys *tk = trainer_ring("trainer"), *ik = island_ring(0), *mal = trainer_ring("mallory");
    int rc;
    ferry_dock *isl = open_keyed(s, run, FERRY_DOCK_PRODUCER, ik, 0, &rc), *c = open_keyed(s, run, FERRY_DOCK_CONSUMER, tk, 0, &rc);
    CHECK(isl && c);
    if (!isl || !c) goto out;
    for (uint64_t q = 0; q < 3; q++) CHECK_OK(put_batch(isl, 0, 1, q));
    CHECK(take_n(c, 1, &rc) == 3 && rc == 0);
    /* the cursor is signed: format 2, the signature last */
    size_t n1;
    uint8_t *v1 = get_obj(s, ckey, &n1);
    CHECK(v1 && n1 > 72 && ferry__le16(v1 + 4) == 2);
    ferry_dock_stats ds;
    ferry_dock_get_stats(c, &ds);
    uint64_t commits1 = ds.cursor_commits;
    CHECK(commits1 >= 1 && ds.admitted == 3);

    /* deleted under a live handle: the island's seq 0 put back (a replay)
     * and a new seq 3; the take fails loudly and admits neither */
    CHECK_OK(ferry_store_delete(s, ckey));
    CHECK_OK(put_batch(isl, 0, 1, 0));
    CHECK_OK(put_batch(isl, 0, 1, 3));
    CHECK(take_n(c, 1, &rc) == 0);
    CHECK(rc == FERRY_ERR_DOCK_ROLLBACK && strstr(ferry_last_error(), "is gone"));
    ferry_dock_get_stats(c, &ds);
    CHECK(ds.admitted == 3 && ds.cursor_commits == commits1); /* the counters were not reset */
    /* a fresh trainer told how far the cursor had come refuses to start over */
    ferry_dock *c2 = open_keyed(s, run, FERRY_DOCK_CONSUMER, tk, commits1, &rc);
    CHECK(rc == FERRY_ERR_DOCK_ROLLBACK && c2 == NULL);
    /* put back, the handle goes on: the replay is refused, seq 3 taken */
    CHECK_OK(ferry_store_put(s, ckey, v1, n1, NULL));
    CHECK(take_n(c, 1, &rc) == 1 && rc == 0);
    ferry_dock_get_stats(c, &ds);
    CHECK(ds.admitted == 4 && ds.rejected_replay == 1 && ds.cursor_commits > commits1);
    uint64_t commits2 = ds.cursor_commits;

    /* an older signed copy put back: the live handle and a trainer that
     * says how far it had come both refuse it */
    CHECK_OK(ferry_store_put(s, ckey, v1, n1, NULL));
    CHECK_OK(put_batch(isl, 0, 1, 3)); /* the replay the old copy would let in */
    CHECK(take_n(c, 1, &rc) == 0);
    CHECK(rc == FERRY_ERR_DOCK_ROLLBACK && strstr(ferry_last_error(), "older copy"));
    c2 = open_keyed(s, run, FERRY_DOCK_CONSUMER, tk, commits2, &rc);
    CHECK(rc == FERRY_ERR_DOCK_ROLLBACK && c2 == NULL);
    /* (without that history a fresh handle cannot tell: docs/DOCK.md) */
    c2 = open_keyed(s, run, FERRY_DOCK_CONSUMER, tk, 0, &rc);
    CHECK(rc == 0 && c2 != NULL);
    ferry_dock_free(c2);

    /* forged: seqs 0..10^6 "taken" (honest new batches would be deleted as
     * duplicates) and trainer version 10^9 (every take REGRESSED), written
     * unsigned, then signed by a key the trainer does not trust */
    forge_cursor(s, run, 1000000, 1000000000, commits2 + 5, NULL);
    c2 = open_keyed(s, run, FERRY_DOCK_CONSUMER, tk, 0, &rc);
    CHECK(rc == FERRY_ERR_DOCK_CURSOR && c2 == NULL && strstr(ferry_last_error(), "unsigned"));
    CHECK(take_n(c, 1, &rc) == 0 && rc == FERRY_ERR_DOCK_CURSOR); /* the live handle re-reads it at its CAS */
    forge_cursor(s, run, 1000000, 1000000000, commits2 + 5, mal);
    c2 = open_keyed(s, run, FERRY_DOCK_CONSUMER, tk, 0, &rc);
    CHECK(rc == FERRY_ERR_DOCK_CURSOR && c2 == NULL && strstr(ferry_last_error(), "not enrolled as a publisher"));
    /* the island does not believe them either: resume_seq is its own */
    uint64_t next = 0;
    CHECK_OK(ferry_dock_resume_seq(isl, 0, &next));
    CHECK(next == 4); /* seq 3 (the replay) is still listed; forged 10^6 ignored */
    /* a consumer whose ring holds an island's signing key cannot sign a cursor */
    c2 = open_keyed(s, run, FERRY_DOCK_CONSUMER, ik, 0, &rc);
    CHECK(rc == FERRY_ERR_ARG && c2 == NULL);
    /* the trainer's own signed cursor is what the island believes */
    CHECK_OK(ferry_store_put(s, ckey, v1, n1, NULL));
    {
        char k3[FERRY_DOCK_KEY_MAX];
        ferry_dock_key(run, 1, 0, 3, k3);
        CHECK_OK(ferry_store_delete(s, k3));
    }
    CHECK_OK(ferry_dock_resume_seq(isl, 0, &next));
    CHECK(next == 3); /* from the signed cursor (0..2) */
    ferry_free(v1);
    clear_traj(s, run);
out:
    ferry_dock_free(isl);
    ferry_dock_free(c);
    ferry_keys_free(tk);
    ferry_keys_free(ik);
    ferry_keys_free(mal);
    ferry_store_free(s);
}

/* Issue 23 item 9: object names are anyone's.  Objects merely named as
 * island 0's batches at the top of the seq space, or holding another
 * island's signed batch, or a well-formed unsigned one, do not move the
 * island's resume point, let alone stop it ("has used every sequence
 * number"); a flood of them past max_scan reads is an error naming why. */
static void test_resume_seq_junk(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("resjunk");
    ferry_dock *prod = PRODUCER(s, run);
    for (uint64_t q = 0; q < 6; q++) CHECK_OK(put_batch(prod, 0, 1, q));
    char key[FERRY_DOCK_KEY_MAX];
    CHECK_OK(ferry_dock_key(run, 1, 0, UINT64_MAX, key));
    CHECK_OK(ferry_store_put(s, key, "junk", 4, NULL));
    CHECK_OK(ferry_dock_key(run, 7, 0, 1000, key));
    CHECK_OK(ferry_store_put(s, key, "more junk", 9, NULL));
    uint64_t next = 0;
    CHECK_OK(ferry_dock_resume_seq(prod, 0, &next));
    CHECK(next == 6);
    /* a misplaced batch (island 1's seq 9 put under island 0's key) */
    {
        void *obj = NULL;
        size_t sz = 0;
        CHECK_OK(ferry_dock_encode(run, 1, 1, 9, 0, "x", 1, &obj, &sz));
        CHECK_OK(ferry_dock_key(run, 1, 0, 9, key));
        CHECK_OK(ferry_store_put(s, key, obj, sz, NULL));
        ferry_free(obj);
    }
    CHECK_OK(ferry_dock_resume_seq(prod, 0, &next));
    CHECK(next == 6);

    /* with keys: a well-formed unsigned batch at the top, and one signed by
     * island 1's key, both named as island 0's, count for nothing */
    ferry_keys *ik0 = island_ring(0), *ik1 = island_ring(1);
    int rc;
    ferry_dock *p0 = open_keyed(s, run, FERRY_DOCK_PRODUCER, ik0, 0, &rc), *p1 = open_keyed(s, run, FERRY_DOCK_PRODUCER, ik1, 0, &rc);
    CHECK(p0 && p1);
    if (p0 && p1) {
        CHECK_OK(put_batch(p0, 0, 2, 10));                    /* island 0's own, signed */
        CHECK_OK(put_batch(prod, 0, 2, UINT64_MAX - 1));       /* unsigned forgery */
        CHECK_OK(put_batch(p1, 0, 2, UINT64_MAX - 2));         /* island 1's key as island 0 */
        CHECK_OK(ferry_dock_resume_seq(p0, 0, &next));
        CHECK(next == 11);
        /* without a ring nothing is checked but the bytes: the unsigned
         * forgery counts there (docs/SECURITY.md: no keys, no protection) */
        CHECK_OK(ferry_dock_resume_seq(prod, 0, &next));
        CHECK(next == UINT64_MAX);
    }
    ferry_dock_free(p0);
    ferry_dock_free(p1);
    ferry_keys_free(ik0);
    ferry_keys_free(ik1);

    /* bounded: max_scan junk objects above the island's batches */
    ferry_dock_options o = {.role = FERRY_DOCK_PRODUCER, .max_scan = 4};
    ferry_dock *small = NULL;
    CHECK_OK(ferry_dock_open(s, run, &o, &small));
    for (uint64_t q = 0; q < 4; q++) {
        CHECK_OK(ferry_dock_key(run, 3, 5, 100 + q, key));
        CHECK_OK(ferry_store_put(s, key, "junk", 4, NULL));
    }
    CHECK_OK(put_batch(prod, 5, 3, 50));
    if (small) {
        CHECK_RC(ferry_dock_resume_seq(small, 5, &next), FERRY_ERR_LIMIT);
        CHECK(strstr(ferry_last_error(), "junk") != NULL);
        ferry_dock_stats ds;
        ferry_dock_get_stats(small, &ds);
        CHECK(ds.gets == 4);
    }
    CHECK_OK(ferry_dock_resume_seq(prod, 5, &next)); /* the default budget reads past them */
    CHECK(next == 51);
    clear_traj(s, run);
    ferry_dock_free(small);
    ferry_dock_free(prod);
    ferry_store_free(s);
}

/* Stale-version names are anyone's too: a store writer who plants objects
 * named as island 0's seqs 100..139 under a version below the window must
 * not make the trainer mark those seqs dropped (without keys they are
 * deleted unread; with enrolled keys only the island's own signed batch is
 * dropped), or the island's real batches 100.. would later be refused as
 * replays. */
static void test_stale_names(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("stale");
    ferry_keys *tk = trainer_ring("trainer"), *ik = island_ring(0);
    int rc;
    ferry_dock *isl = open_keyed(s, run, FERRY_DOCK_PRODUCER, ik, 0, &rc), *c = open_keyed(s, run, FERRY_DOCK_CONSUMER, tk, 0, &rc);
    CHECK(isl && c);
    if (!isl || !c) goto out;
    ferry_dock *forger = PRODUCER(s, run);
    char key[FERRY_DOCK_KEY_MAX];
    for (uint64_t q = 100; q < 140; q++) {
        if (q % 2) {
            CHECK_OK(put_batch(forger, 0, 1, q)); /* well-formed, unsigned */
        } else {
            CHECK_OK(ferry_dock_key(run, 1, 0, q, key));
            CHECK_OK(ferry_store_put(s, key, "junk", 4, NULL));
        }
    }
    CHECK_OK(put_batch(isl, 0, 2, 7)); /* the island's own stale batch: dropped */
    /* window 6..10; island 0's share of a pass's reads is 32 */
    CHECK(take_n(c, 10, &rc) == 0 && rc == 0);
    CHECK(take_n(c, 10, &rc) == 0 && rc == 0);
    ferry_dock_stats ds;
    ferry_dock_get_stats(c, &ds);
    CHECK(ds.dropped_stale == 1 && ds.rejected_signature == 20 && ds.rejected_corrupt == 20);
    CHECK(count_traj(s, run) == 0);
    /* the island's real batches 100..139 go in */
    for (uint64_t q = 100; q < 140; q++) CHECK_OK(put_batch(isl, 0, 10, q));
    CHECK(take_n(c, 10, &rc) == 40 && rc == 0);
    ferry_dock_get_stats(c, &ds);
    CHECK(ds.admitted == 40 && ds.rejected_replay == 0 && ds.duplicates == 0);
    /* names of an island no key is enrolled for: nothing there can verify,
     * so nothing is read (nor copied to the quarantine) */
    ferry_dock_stats before = ds;
    for (uint64_t q = 0; q < 50; q++) CHECK_OK(put_batch(forger, 5, 10, q));
    CHECK(take_n(c, 10, &rc) == 0 && rc == 0);
    ferry_dock_get_stats(c, &ds);
    CHECK(ds.gets == before.gets && ds.rejected_signature == before.rejected_signature + 50 && ds.quarantined == before.quarantined);
    CHECK(count_traj(s, run) == 0);
    ferry_dock_free(forger);
out:
    ferry_dock_free(isl);
    ferry_dock_free(c);
    ferry_keys_free(tk);
    ferry_keys_free(ik);
    ferry_store_free(s);
}

/* Issue 23 item 10: a store writer plants N corrupt-looking objects under
 * island 7's name, ahead of island 9's batches in key order, for a
 * consumer with a grace period (as on s3://, whose puts may be seen
 * mid-write).  Every pass still takes island 9's batch (island 7 may spend
 * only its share of the pass's reads: max_scan / 8 = 32), reads at most
 * that share besides it, and reads each planted object once: a listing
 * that shows it unchanged leaves it unread while its grace period lasts.
 * Before, each pass read 256 of them again and took no batch. */
static void test_junk_reads(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("junk");
    enum { N = 300, PASSES = 12 };
    ferry_dock_options o = {.corrupt_grace_ms = 600000};
    ferry_dock *prod = PRODUCER(s, run), *cons = open_role(s, run, FERRY_DOCK_CONSUMER, &o);
    char key[FERRY_DOCK_KEY_MAX];
    for (uint64_t q = 0; q < N; q++) {
        CHECK_OK(ferry_dock_key(run, 1, 7, q, key));
        CHECK_OK(ferry_store_put(s, key, "FDCK-junk", 9, NULL));
    }
    ferry_dock_policy p = async_s(0);
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    ferry_dock_stats ds, prev = {0};
    for (int pass = 0; pass < PASSES; pass++) {
        CHECK_OK(put_batch(prod, 9, 1, (uint64_t)pass));
        CHECK_OK(ferry_dock_take(cons, &p, 1, 10, 0, &b, &n));
        CHECK(n == 1 && b && b[0].island == 9);
        ferry_dock_batches_free(b, n);
        ferry_dock_get_stats(cons, &ds);
        if (ds.gets - prev.gets > 33) fprintf(stderr, "  pass %d: %" PRIu64 " reads\n", pass, ds.gets - prev.gets);
        CHECK(ds.gets - prev.gets <= 33 && ds.listed - prev.listed >= N);
        if (pass < PASSES - 1) prev = ds;
    }
    CHECK(ds.gets == N + PASSES && ds.deferred == N);          /* each planted object read once */
    CHECK(ds.gets - prev.gets == 1 && ds.junk_skipped - prev.junk_skipped == N); /* the last pass read none */
    /* one of them rewritten: read (and deferred) again, the rest not */
    CHECK_OK(ferry_dock_key(run, 1, 7, 5, key));
    CHECK_OK(ferry_store_put(s, key, "FDCK-other-junk", 15, NULL));
    prev = ds;
    CHECK_OK(ferry_dock_take(cons, &p, 1, 10, 0, &b, &n));
    ferry_dock_get_stats(cons, &ds);
    CHECK(n == 0 && ds.gets - prev.gets == 1 && ds.junk_skipped - prev.junk_skipped == N - 1);
    CHECK(ds.rejected_corrupt == 0 && count_traj(s, run) == N);
    clear_traj(s, run);
    ferry_dock_free(prod);
    ferry_dock_free(cons);

    /* junk names under a consumer that deletes what it rejects: deleted
     * unread (a copy for the quarantine is the only reason to read one) */
    run = new_run("junkdel");
    ferry_dock_options od = {.corrupt_grace_ms = -1, .delete_rejected = 1, .max_scan = 1000};
    prod = PRODUCER(s, run);
    cons = open_role(s, run, FERRY_DOCK_CONSUMER, &od);
    for (int q = 0; q < N; q++) {
        snprintf(key, sizeof key, "%s/traj/v%020d/junk-%04d", run, 1, q);
        CHECK_OK(ferry_store_put(s, key, "junk", 4, NULL));
    }
    CHECK_OK(put_batch(prod, 3, 1, 0));
    CHECK_OK(ferry_dock_take(cons, &p, 1, 10, 0, &b, &n));
    CHECK(n == 1);
    ferry_dock_batches_free(b, n);
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.gets == 1 && ds.rejected_by_code[FERRY_ERR_DOCK_KEY - 100] == N && ds.quarantined == 0);
    CHECK(count_traj(s, run) == 0);
    ferry_dock_free(prod);
    ferry_dock_free(cons);
    ferry_store_free(s);
}

static void test_regress(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("regress");
    ferry_dock *cons = CONSUMER(s, run);
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    ferry_dock_policy p = async_s(1);
    CHECK_OK(ferry_dock_take(cons, &p, 5, 1, 0, &b, &n));
    CHECK_OK(ferry_dock_take(cons, &p, 5, 1, 0, &b, &n)); /* the same version again is fine */
    CHECK_RC(ferry_dock_take(cons, &p, 4, 1, 0, &b, &n), FERRY_ERR_DOCK_REGRESSED);
    ferry_dock_free(cons);
    cons = CONSUMER(s, run); /* remembered across a restart */
    CHECK_RC(ferry_dock_take(cons, &p, 3, 1, 0, &b, &n), FERRY_ERR_DOCK_REGRESSED);
    CHECK_RC(ferry_dock_sweep(cons, &p, 3), FERRY_ERR_DOCK_REGRESSED);
    ferry_dock_free(cons);
    ferry_dock_options o = {.role = FERRY_DOCK_CONSUMER, .allow_version_regress = 1, .corrupt_grace_ms = -1};
    CHECK_OK(ferry_dock_open(s, run, &o, &cons));
    CHECK_OK(ferry_dock_take(cons, &p, 3, 1, 0, &b, &n));
    ferry_dock_free(cons);
    ferry_store_free(s);
}

/* Bounded work: one pass touches at most max_scan objects besides those it
 * admits; the rest is left for later passes. */
static void test_budget(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("budget");
    ferry_dock_options o = {.corrupt_grace_ms = -1, .max_scan = 4};
    recorder *r = calloc(1, sizeof *r);
    ferry_dock *prod = PRODUCER(s, run), *cons = consumer_rec(s, run, r, &o);
    for (uint64_t q = 0; q < 20; q++) CHECK_OK(put_batch(prod, 1, 0, q)); /* will be stale */
    for (uint64_t q = 20; q < 23; q++) CHECK_OK(put_batch(prod, 1, 10, q));
    ferry_dock_policy p = async_s(0);
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    CHECK_OK(ferry_dock_take(cons, &p, 10, 100, 0, &b, &n));
    CHECK(n == 3); /* admitted ones do not count against the budget */
    ferry_dock_batches_free(b, n);
    ferry_dock_stats ds;
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.dropped_stale == 4 && ds.gets == 3);
    int takes = 0;
    while (ds.dropped_stale < 20 && takes < 20) {
        CHECK_OK(ferry_dock_take(cons, &p, 10, 100, 0, &b, &n));
        ferry_dock_batches_free(b, n);
        ferry_dock_get_stats(cons, &ds);
        takes++;
    }
    CHECK(ds.dropped_stale == 20 && takes == 4);
    CHECK(count_traj(s, run) == 0);

    /* a flood of corrupt objects ahead of two good ones in key order: each
     * pass rejects max_scan of them, and the good ones come through once
     * the flood is cleared */
    ferry_dock_free(cons);
    o.delete_rejected = 1;
    cons = consumer_rec(s, run, r, &o);
    char key[FERRY_DOCK_KEY_MAX];
    for (uint64_t q = 100; q < 200; q++) {
        CHECK_OK(ferry_dock_key(run, 10, 9, q, key));
        CHECK_OK(ferry_store_put(s, key, "FDCK", 4, NULL));
    }
    CHECK_OK(put_batch(prod, 9, 10, 200));
    CHECK_OK(put_batch(prod, 9, 10, 201));
    size_t got = 0;
    takes = 0;
    double t0 = now_s();
    while (got < 2 && takes < 40) {
        CHECK_OK(ferry_dock_take(cons, &p, 10, 2, 0, &b, &n));
        for (size_t i = 0; i < n; i++) CHECK(b[i].island == 9 && b[i].seq >= 200 && batch_ok(&b[i], run));
        ferry_dock_batches_free(b, n);
        ferry_dock_stats cur;
        ferry_dock_get_stats(cons, &cur);
        if (takes == 0) CHECK(cur.rejected_corrupt == 4 && n == 0);
        got += n;
        takes++;
    }
    ferry_dock_get_stats(cons, &ds);
    CHECK(got == 2 && ds.rejected_by_code[FERRY_ERR_DOCK_TRUNCATED - 100] == 100 && takes == 26);
    CHECK(count_traj(s, run) == 0 && now_s() - t0 < 60);
    ferry_dock_free(prod);
    ferry_dock_free(cons);
    ferry_store_free(s);
    free(r);
}

/* An island with holes in its numbering: the cursor keeps at most
 * FERRY_DOCK_MAX_RANGES ranges and reports what it gives up. */
static void test_gaps(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("gaps");
    recorder *r = calloc(1, sizeof *r);
    ferry_dock *prod = PRODUCER(s, run), *cons = consumer_rec(s, run, r, NULL);
    const int N = FERRY_DOCK_MAX_RANGES + 8;
    for (int k = 0; k < N; k++) CHECK_OK(put_batch(prod, 2, 1, (uint64_t)k * 2));
    ferry_dock_policy p = async_s(0);
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    CHECK_OK(ferry_dock_take(cons, &p, 1, 1000, 0, &b, &n));
    CHECK(n == (size_t)N);
    ferry_dock_batches_free(b, n);
    ferry_dock_stats ds;
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.gaps == 8 && count_ev(r, FERRY_DOCK_EV_GAP, 0) == 8);
    /* a seq in a hole that was kept is still welcome; one in a given-up
     * hole reads as a duplicate (the documented, safe side) */
    CHECK_OK(put_batch(prod, 2, 1, (uint64_t)(N - 1) * 2 - 1));
    CHECK_OK(put_batch(prod, 2, 1, 1));
    CHECK_OK(ferry_dock_take(cons, &p, 1, 1000, 0, &b, &n));
    CHECK(n == 1 && n && b[0].seq == (uint64_t)(N - 1) * 2 - 1);
    ferry_dock_batches_free(b, n);
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.duplicates == 1);
    ferry_dock_free(prod);
    ferry_dock_free(cons);
    ferry_store_free(s);
    free(r);
}

static void test_args(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("args");
    ferry_dock *d = NULL;
    CHECK_RC(ferry_dock_open(NULL, run, NULL, &d), FERRY_ERR_ARG);
    CHECK_RC(ferry_dock_open(s, "bad run", NULL, &d), FERRY_ERR_ARG);
    CHECK_RC(ferry_dock_open(s, run, NULL, NULL), FERRY_ERR_ARG);
    ferry_dock_options o = {.role = 7};
    CHECK_RC(ferry_dock_open(s, run, &o, &d), FERRY_ERR_ARG);
    CHECK(d == NULL);
    ferry_dock_free(NULL);
    o.role = FERRY_DOCK_PRODUCER;
    o.max_payload = 10;
    CHECK_OK(ferry_dock_open(s, run, &o, &d));
    CHECK_RC(ferry_dock_put(d, 1, 1, 1, "0123456789A", 11), FERRY_ERR_LIMIT);
    CHECK_RC(ferry_dock_put(d, 1, 1, 1, NULL, 1), FERRY_ERR_ARG);
    CHECK_RC(ferry_dock_put(NULL, 1, 1, 1, "x", 1), FERRY_ERR_ARG);
    ferry_dock_batch *b = (ferry_dock_batch *)1;
    size_t n = 5;
    ferry_dock_policy p = async_s(1);
    CHECK_RC(ferry_dock_take(d, &p, 1, 1, 0, &b, &n), FERRY_ERR_ARG); /* a producer */
    CHECK(b == NULL && n == 0);
    ferry_dock_free(d);
    d = CONSUMER(s, run);
    ferry_dock_policy bad = {9, 0};
    CHECK_RC(ferry_dock_take(d, &bad, 1, 1, 0, &b, &n), FERRY_ERR_ARG);
    CHECK_RC(ferry_dock_take(d, NULL, 1, 1, 0, &b, &n), FERRY_ERR_ARG);
    CHECK_RC(ferry_dock_take(d, &p, UINT64_MAX, 1, 0, &b, &n), FERRY_ERR_ARG);
    CHECK_RC(ferry_dock_take(d, &p, 1, 1, 0, NULL, &n), FERRY_ERR_ARG);
    CHECK_RC(ferry_dock_sweep(NULL, &p, 1), FERRY_ERR_ARG);
    CHECK_OK(ferry_dock_take(d, &p, 1, 0, 0, &b, &n)); /* housekeeping only */
    CHECK(n == 0);
    ferry_dock_batches_free(NULL, 0);
    ferry_dock_stats ds;
    ferry_dock_get_stats(NULL, &ds);
    CHECK(ds.admitted == 0);
    CHECK(!strcmp(ferry_strerror(FERRY_ERR_DOCK_CHECKSUM), "dock: batch checksum mismatch"));
    for (int c = 100; c <= 112; c++) CHECK(strcmp(ferry_strerror(c), "unknown error"));
    ferry_dock_free(d);
    ferry_store_free(s);
}

/* ======================================================================
 * Several island processes put concurrently (with re-puts) while the
 * trainer takes and moves its version; afterwards every (island, seq) is
 * accounted for exactly once: admitted or dropped, never both, never twice.
 * ====================================================================== */
#define ISLANDS 4
#define PER_ISLAND 40
#define S_MAX 2

static uint64_t read_version(const char *path)
{
    void *d = NULL;
    size_t n = 0;
    uint64_t v = 0;
    if (!ferry_file_read(path, 64, &d, &n) && n) v = strtoull((const char *)d, NULL, 10);
    ferry_free(d);
    return v;
}

static void write_version(const char *path, uint64_t v)
{
    char b[32];
    int n = snprintf(b, sizeof b, "%" PRIu64, v);
    if (ferry_file_write(path, b, (size_t)n)) fprintf(stderr, "version file: %s\n", ferry_last_error());
}

static int island_main(const char *run, uint32_t island, const char *vfile)
{
    ferry_store *s = st_open();
    if (!s) return 2;
    ferry_dock *d = PRODUCER(s, run);
    if (!d) return 3;
    uint32_t x = 0x9E3779B9u ^ island * 2654435761u;
    int fails = 0;
    for (uint64_t q = 0; q < PER_ISLAND; q++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        uint64_t v = read_version(vfile);
        /* island 3 lags: it holds a version up to 4 behind */
        if (island == 3 && v > 0) v -= (x >> 3) % 5 < v ? (x >> 3) % 5 : v;
        if (put_batch(d, island, v, q)) fails++;
        if (x % 7 == 0 && put_batch(d, island, v, q)) fails++;      /* a re-put after a "crash" */
        if (q > 3 && x % 11 == 0 && put_batch(d, island, v, q - 3)) fails++; /* a late re-put */
        msleep((int)(x % 15));
    }
    ferry_dock_free(d);
    ferry_store_free(s);
    return fails ? 1 : 0;
}

/* Failures a trainer rides out by taking again: s3rver, for one, answers a
 * listing that races a put with an empty ETag (FERRY_ERR_STORE_CORRUPT),
 * and crashes when a delete removes a directory a put is about to write
 * into (dock_s3.sh restarts it; the store's retries bridge the gap). */
static bool store_glitch(int rc)
{
    return rc == FERRY_ERR_STORE_CORRUPT || rc == FERRY_ERR_STORE_HTTP || rc == FERRY_ERR_STORE_NET ||
           rc == FERRY_ERR_STORE_TIMEOUT;
}

static void test_concurrent_islands(void)
{
    ferry_store *s = st_open();
    const char *run = new_run("islands");
    char vfile[300];
    snprintf(vfile, sizeof vfile, "%s/version-%d", g_root[0] ? g_root : "/tmp", (int)getpid());
    write_version(vfile, 0);
    recorder *r = calloc(1, sizeof *r);
    ferry_dock_options o = {.sweep_every = 4}; /* default grace: s3rver shows writes mid-way */
    ferry_dock *cons = consumer_rec(s, run, r, &o);
    pid_t pids[ISLANDS];
    for (uint32_t i = 0; i < ISLANDS; i++) {
        pids[i] = fork();
        if (pids[i] == 0) _exit(island_main(run, i, vfile));
    }
    static uint8_t admitted[ISLANDS][PER_ISLAND];
    memset(admitted, 0, sizeof admitted);
    ferry_dock_policy p = async_s(S_MAX);
    uint64_t tv = 0;
    int alive = ISLANDS, bad_status = 0, twice = 0, too_old = 0, bad_payload = 0;
    double t0 = now_s();
    size_t got = 0;
    int glitches = 0;
    for (int it = 0; it < 5000 && now_s() - t0 < 90; it++) {
        ferry_dock_batch *b = NULL;
        size_t n = 0;
        int rc = ferry_dock_take(cons, &p, tv, 6, 30, &b, &n);
        if (rc && store_glitch(rc)) glitches++;
        else CHECK_OK(rc);
        for (size_t i = 0; i < n; i++) {
            if (b[i].island >= ISLANDS || b[i].seq >= PER_ISLAND || !batch_ok(&b[i], run)) { bad_payload++; continue; }
            if (admitted[b[i].island][b[i].seq]++) twice++;
            if (b[i].staleness > S_MAX || tv - b[i].version != b[i].staleness) too_old++;
        }
        got += n;
        ferry_dock_batches_free(b, n);
        if (it % 3 == 2) write_version(vfile, ++tv); /* the trainer publishes */
        for (int i = 0; i < ISLANDS; i++) {
            int st;
            if (pids[i] > 0 && waitpid(pids[i], &st, WNOHANG) == pids[i]) {
                pids[i] = -1;
                alive--;
                if (!WIFEXITED(st) || WEXITSTATUS(st)) bad_status++;
            }
        }
        if (!alive && rc == 0 && n == 0 && count_traj(s, run) == 0) break;
        if (!alive && n == 0) {
            rc = ferry_dock_sweep(cons, &p, tv);
            if (rc && store_glitch(rc)) glitches++;
            else CHECK_OK(rc);
        }
    }
    for (int i = 0; i < ISLANDS; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
            bad_status++;
        }
    int rc = FERRY_OK;
    for (int k = 0; k < 20 && (rc = ferry_dock_sweep(cons, &p, tv)) && store_glitch(rc); k++) glitches++;
    CHECK_OK(rc);
    CHECK(bad_status == 0 && twice == 0 && too_old == 0 && bad_payload == 0);
    /* exactly once: admitted xor dropped, for every (island, seq) */
    static uint8_t dropped[ISLANDS][PER_ISLAND];
    memset(dropped, 0, sizeof dropped);
    int dropped_twice = 0, missing = 0, both = 0;
    for (size_t i = 0; i < r->n; i++)
        if (r->ev[i].kind == FERRY_DOCK_EV_DROPPED && r->ev[i].island < ISLANDS && r->ev[i].seq < PER_ISLAND)
            if (dropped[r->ev[i].island][r->ev[i].seq]++) dropped_twice++;
    for (int i = 0; i < ISLANDS; i++)
        for (int q = 0; q < PER_ISLAND; q++) {
            if (!admitted[i][q] && !dropped[i][q]) missing++;
            if (admitted[i][q] && dropped[i][q]) both++;
        }
    ferry_dock_stats ds;
    ferry_dock_get_stats(cons, &ds);
    printf("    islands: %d x %d batches, %zu admitted, %" PRIu64 " dropped, %" PRIu64 " duplicates, %" PRIu64
           " rejected, %" PRIu64 " deferred, %d store glitches, final version %" PRIu64 ", %.1f s\n",
           ISLANDS, PER_ISLAND, got, ds.dropped_stale, ds.duplicates, ds.rejected_corrupt + ds.rejected_run + ds.rejected_future,
           ds.deferred, glitches, tv, now_s() - t0);
    if (!g_remote) CHECK(glitches == 0); /* only a remote server may stumble */
    if (missing || both || dropped_twice)
        fprintf(stderr, "  missing %d, both %d, dropped twice %d\n", missing, both, dropped_twice);
    CHECK(missing == 0 && both == 0 && dropped_twice == 0);
    CHECK(ds.admitted == got && ds.admitted + ds.dropped_stale == ISLANDS * PER_ISLAND);
    CHECK(ds.rejected_corrupt == 0 && ds.rejected_run == 0 && ds.rejected_future == 0);
    CHECK(count_traj(s, run) == 0);
    /* late re-puts of batches long consumed or dropped (how many of the
     * islands' own re-puts met a consumed batch depends on timing) */
    ferry_dock *late = PRODUCER(s, run);
    uint64_t dups = ds.duplicates;
    for (uint32_t i = 0; i < ISLANDS; i++) CHECK_OK(put_batch(late, i, tv, i));
    ferry_dock_batch *b = NULL;
    size_t n = 0;
    for (int k = 0; k < 20 && (rc = ferry_dock_take(cons, &p, tv, 10, 0, &b, &n)) && store_glitch(rc); k++) glitches++;
    CHECK_OK(rc);
    CHECK(n == 0);
    ferry_dock_batches_free(b, n);
    ferry_dock_get_stats(cons, &ds);
    CHECK(ds.duplicates == dups + ISLANDS && ds.admitted == got);
    CHECK(count_traj(s, run) == 0);
    ferry_dock_free(late);
    unlink(vfile);
    ferry_dock_free(cons);
    ferry_store_free(s);
    free(r);
}

int main(int argc, char **argv)
{
    g_sopts.create = 1;
    if (tmpdir_make(g_keydir, sizeof g_keydir, "ferry-dock-keys")) return 1;
    if (argc > 1 && argv[1]) { /* check.h took its own options out of argv */
        g_remote = 1;
        snprintf(g_url, sizeof g_url, "%s", argv[1]);
        g_sopts.deadline_ms = 20000;
        g_sopts.retry_base_ms = 50;
        /* s3rver pages with continuation tokens: exercise them */
        g_sopts.list_page_size = 7;
    } else {
        if (tmpdir_make(g_root, sizeof g_root, "ferry-dock-test")) return 1;
        snprintf(g_url, sizeof g_url, "file://%s/store", g_root);
        RUN(test_keys);
        RUN(test_wire_roundtrip);
        RUN(test_wire_hostile);
        RUN(test_cursor_ranges);
    }
    RUN(test_roundtrip);
    RUN(test_blocking_take);
    RUN(test_sequential);
    RUN(test_async_staleness);
    RUN(test_wide_window);
    RUN(test_future);
    RUN(test_duplicates);
    RUN(test_corrupt);
    RUN(test_grace);
    RUN(test_other_run);
    RUN(test_resume_seq);
    RUN(test_resume_seq_junk);
    RUN(test_cursor_attacks);
    RUN(test_stale_names);
    RUN(test_junk_reads);
    RUN(test_regress);
    RUN(test_budget);
    RUN(test_gaps);
    RUN(test_args);
    RUN(test_concurrent_islands);
    if (!g_remote) rm_rf(g_root);
    rm_rf(g_keydir);
    return CHECK_SUMMARY();
}
#endif
