/* store_tool — a small command-line front end of ferry_store.h, for the
 * test scripts (and for poking at a store by hand).
 *
 *   store_tool [options] URL COMMAND [ARGS]
 *
 * Commands:
 *   put KEY FILE|-          write FILE (or stdin); prints the etag
 *   putfile KEY FILE        the same through ferry_store_put_file
 *   get KEY FILE|-          read into FILE (or stdout)
 *   getif KEY ETAG FILE|-   ferry_store_get_if_changed: prints "unchanged",
 *                           or "changed NEWETAG" and writes FILE
 *   getfile KEY FILE        the same through ferry_store_get_file
 *   pgetfile KEY FILE       the same through ferry_store_get_file_parallel
 *                           (--conc, --chunk, --resume)
 *   range KEY OFFSET LEN    bytes to stdout
 *   head KEY                prints "SIZE ETAG MTIME"
 *   ls [PREFIX]             prints "KEY SIZE ETAG" lines
 *   rm KEY
 *   cas KEY EXPECTED|- FILE compare-and-swap ("-": must be absent); prints the etag
 *   probe KEY               prints "atomic" or "not-atomic"
 *   incr KEY N              N times: read the decimal counter under KEY and
 *                           compare-and-swap it to the next value, retrying
 *                           on conflict; prints "conflicts C"
 *   selftest PREFIX         the store scenario (tests/unit/store_scenario.h)
 *                           under PREFIX; ends with "N passed, N failed"
 *
 * Options: --endpoint URL --region R --access-key K --secret-key S
 *   --session-token T --anonymous --unsigned-payload --part-size N
 *   --deadline-ms N --connect-ms N --stall-ms N --max-attempts N
 *   --retry-base-ms N --rate BYTES_PER_S --list-page N --max-size N
 *   --cas-verify --create --progress (prints "progress DONE TOTAL" to stderr)
 *   --upload-conc N (parts in flight) --conc N --chunk N --resume (pgetfile)
 *   --large N (selftest: size of the large object; default 3.5 x part size)
 *
 * Exit status: 0, or the ferry error code (60 = FERRY_ERR_STORE_URL ...),
 * after "error CODE (name): message" on stderr. */
#ifdef FERRY_NO_NET /* a core-only build (make NO_NET=1) has no store layer */
#include <stdio.h>
int main(void)
{
    puts("store layer not built (NO_NET=1)");
    puts("0 passed, 0 failed");
    return 77;
}
#else
#include "../unit/store_scenario.h"

#include <errno.h>
#include <inttypes.h>

static int fail(int rc)
{
    fprintf(stderr, "error %d (%s): %s\n", rc, ferry_strerror(rc), ferry_last_error());
    return rc > 0 && rc < 256 ? rc : 1;
}

static int read_input(const char *path, uint8_t **data, size_t *n)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return 1;
    }
    size_t cap = 1 << 16, len = 0;
    uint8_t *b = malloc(cap);
    for (;;) {
        if (len == cap) b = realloc(b, cap *= 2);
        size_t r = fread(b + len, 1, cap - len, f);
        if (!r) break;
        len += r;
    }
    if (f != stdin) fclose(f);
    *data = b;
    *n = len;
    return 0;
}

static int write_output(const char *path, const void *d, size_t n)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "wb") : stdout;
    if (!f || fwrite(d, 1, n, f) != n) {
        fprintf(stderr, "%s: cannot write\n", path);
        return 1;
    }
    if (f != stdout) fclose(f);
    else fflush(stdout);
    return 0;
}

static int print_progress(void *user, uint64_t done, uint64_t total)
{
    (void)user;
    fprintf(stderr, "progress %" PRIu64 " %" PRIu64 "\n", done, total);
    return 0;
}

static uint64_t g_large;

static int selftest(const char *url, const ferry_store_options *o, const char *prefix)
{
    sc_url = url;
    sc_opts = *o;
    snprintf(sc_base, sizeof sc_base, "%s", prefix);
    RUN(sc_roundtrip);
    RUN(sc_missing);
    RUN(sc_range);
    RUN(sc_list);
    RUN(sc_cas);
    RUN(sc_hostile_keys);
    RUN(sc_limit);
    RUN(sc_args);
    uint64_t part = o->part_size ? o->part_size : (64u << 20);
    uint64_t n = g_large ? g_large : part * 3 + part / 2;
    printf("large object: %" PRIu64 " bytes, part size %" PRIu64 "\n", n, part);
    sc_large_n((size_t)n);
    if (check_case_failed) { check_failed++; fprintf(stderr, "FAIL sc_large\n"); }
    else { check_passed++; printf("ok   sc_large\n"); }
    return CHECK_SUMMARY();
}

int main(int argc, char **argv)
{
    ferry_store_options o = {0};
    ferry_store_transfer_options to = {0};
    int i = 1;
    for (; i < argc && !strncmp(argv[i], "--", 2); i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define STR(name, field) if (!strcmp(a, name) && v) { o.field = v; i++; continue; }
#define NUM(name, field) if (!strcmp(a, name) && v) { o.field = strtoull(v, NULL, 10); i++; continue; }
        STR("--endpoint", endpoint)
        STR("--region", region)
        STR("--access-key", access_key)
        STR("--secret-key", secret_key)
        STR("--session-token", session_token)
        STR("--ca-file", ca_file)
        NUM("--part-size", part_size)
        NUM("--deadline-ms", deadline_ms)
        NUM("--connect-ms", connect_timeout_ms)
        NUM("--stall-ms", stall_timeout_ms)
        NUM("--max-attempts", max_attempts)
        NUM("--retry-base-ms", retry_base_ms)
        NUM("--rate", max_bytes_per_s)
        NUM("--list-page", list_page_size)
        NUM("--max-size", max_object_size)
        NUM("--upload-conc", upload_concurrency)
        if (!strcmp(a, "--conc") && v) { to.concurrency = (unsigned)strtoul(v, NULL, 10); i++; continue; }
        if (!strcmp(a, "--chunk") && v) { to.chunk_size = strtoull(v, NULL, 10); i++; continue; }
        if (!strcmp(a, "--resume")) { to.resume = 1; continue; }
        if (!strcmp(a, "--large") && v) { g_large = strtoull(v, NULL, 10); i++; continue; }
        if (!strcmp(a, "--anonymous")) { o.anonymous = 1; continue; }
        if (!strcmp(a, "--unsigned-payload")) { o.unsigned_payload = 1; continue; }
        if (!strcmp(a, "--cas-verify")) { o.cas_mode = FERRY_STORE_CAS_VERIFY; continue; }
        if (!strcmp(a, "--create")) { o.create = 1; continue; }
        if (!strcmp(a, "--progress")) { o.progress = print_progress; continue; }
        fprintf(stderr, "unknown option %s\n", a);
        return 2;
    }
    if (argc - i < 2) {
        fprintf(stderr, "usage: store_tool [options] URL COMMAND [ARGS] (see the source)\n");
        return 2;
    }
    const char *url = argv[i], *cmd = argv[i + 1];
    char **args = argv + i + 2;
    int nargs = argc - i - 2;
    if (!strcmp(cmd, "selftest") && nargs == 1) return selftest(url, &o, args[0]);

    ferry_store *s = NULL;
    int rc = ferry_store_open(url, &o, &s);
    if (rc) return fail(rc);
    char etag[FERRY_STORE_ETAG_MAX] = "";
    int ret = 0;
    if ((!strcmp(cmd, "put") || !strcmp(cmd, "cas")) && nargs == (cmd[0] == 'p' ? 2 : 3)) {
        uint8_t *d;
        size_t n;
        if (read_input(args[nargs - 1], &d, &n)) return 1;
        if (cmd[0] == 'p') rc = ferry_store_put(s, args[0], d, n, etag);
        else rc = ferry_store_cas(s, args[0], strcmp(args[1], "-") ? args[1] : NULL, d, n, etag);
        free(d);
        if (!rc) printf("%s\n", etag);
    } else if (!strcmp(cmd, "putfile") && nargs == 2) {
        rc = ferry_store_put_file(s, args[0], args[1], etag);
        if (!rc) printf("%s\n", etag);
    } else if (!strcmp(cmd, "get") && nargs == 2) {
        void *d;
        size_t n;
        rc = ferry_store_get(s, args[0], &d, &n, NULL);
        if (!rc) {
            ret = write_output(args[1], d, n);
            ferry_free(d);
        }
    } else if (!strcmp(cmd, "getif") && nargs == 3) {
        void *d;
        size_t n;
        int same;
        ferry_store_stat st;
        rc = ferry_store_get_if_changed(s, args[0], args[1], 0, &d, &n, &same, &st);
        if (!rc && same) {
            printf("unchanged\n");
        } else if (!rc) {
            printf("changed %s\n", st.etag[0] ? st.etag : "-");
            fflush(stdout);
            ret = write_output(args[2], d, n);
            ferry_free(d);
        }
    } else if (!strcmp(cmd, "getfile") && nargs == 2) {
        rc = ferry_store_get_file(s, args[0], args[1], NULL);
    } else if (!strcmp(cmd, "pgetfile") && nargs == 2) {
        rc = ferry_store_get_file_parallel(s, args[0], args[1], &to, NULL);
    } else if (!strcmp(cmd, "range") && nargs == 3) {
        size_t len = strtoull(args[2], NULL, 10), got = 0;
        void *b = malloc(len ? len : 1);
        rc = ferry_store_get_range(s, args[0], strtoull(args[1], NULL, 10), len, b, &got);
        if (!rc) ret = write_output("-", b, got);
        free(b);
    } else if (!strcmp(cmd, "head") && nargs == 1) {
        ferry_store_stat st;
        rc = ferry_store_head(s, args[0], &st);
        if (!rc) printf("%" PRIu64 " %s %" PRId64 "\n", st.size, st.etag[0] ? st.etag : "-", st.mtime);
    } else if (!strcmp(cmd, "ls") && nargs <= 1) {
        ferry_store_listing *l;
        rc = ferry_store_list(s, nargs ? args[0] : "", &l);
        for (size_t k = 0; !rc && k < l->count; k++)
            printf("%s %" PRIu64 " %s\n", l->entries[k].key, l->entries[k].stat.size,
                   l->entries[k].stat.etag[0] ? l->entries[k].stat.etag : "-");
        if (!rc) ferry_store_listing_free(l);
    } else if (!strcmp(cmd, "rm") && nargs == 1) {
        rc = ferry_store_delete(s, args[0]);
    } else if (!strcmp(cmd, "incr") && nargs == 2) {
        long todo = strtol(args[1], NULL, 10), conflicts = 0;
        for (long k = 0; k < todo && !rc; k++) {
            for (int tries = 0;; tries++) {
                void *d = NULL;
                size_t n = 0;
                ferry_store_stat st;
                rc = ferry_store_get(s, args[0], &d, &n, &st);
                long v = rc ? 0 : strtol(d, NULL, 10);
                ferry_free(d);
                if (rc && rc != FERRY_ERR_STORE_NOT_FOUND) break;
                char next[32];
                snprintf(next, sizeof next, "%ld", v + 1);
                rc = ferry_store_cas(s, args[0], rc ? NULL : st.etag, next, strlen(next), NULL);
                if (rc != FERRY_ERR_STORE_CONFLICT || tries >= 1000) break;
                conflicts++;
            }
        }
        if (!rc) printf("conflicts %ld\n", conflicts);
    } else if (!strcmp(cmd, "probe") && nargs == 1) {
        int atomic = 0;
        rc = ferry_store_probe_cas(s, args[0], &atomic);
        if (!rc) printf("%s\n", atomic ? "atomic" : "not-atomic");
    } else {
        fprintf(stderr, "unknown command or wrong arguments: %s\n", cmd);
        ret = 2;
    }
    ferry_store_free(s);
    if (rc) return fail(rc);
    return ret;
}
#endif /* FERRY_NO_NET */
