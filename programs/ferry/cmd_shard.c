/* ferry shard-pull: one island rank's slices of a sharded run
 * (include/ferry_shard.h).  The publishing side runs under MPI:
 * build/ferry-shard-mpi (programs/ferry/cmd_shard_mpi.c). */
#include "cmd_sync.h"

int cmd_shard_pull(int argc, char **argv);

#ifndef FERRY_NO_NET
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry_shard.h"
#include "util.h"

static void shard_pull_help(void)
{
    printf("usage: ferry shard-pull STORE --run RUN --slice SPEC [--slice SPEC ...]\n"
           "                        [--min-version N | --exact-version N] [--out PATH]\n"
           "                        [--fallback URL ...] [--json] [-q]\n\n"
           "Pulls the slices one island rank holds from a sharded run (published by\n"
           "build/ferry-shard-mpi or ferry_shard_publish_mpi): reads HEAD and the\n"
           "manifests, fetches with ranged GETs only the tiles that cover the slices,\n"
           "checks each tile's SHA-256 and its base and target hashes, and prints what\n"
           "was fetched (bytes, requests, the share of the versions' objects).\n\n"
           "  --slice SPEC        NAME, NAME@R0:R1 or NAME@R0:R1,C0:C1: rows and columns of\n"
           "                      the tensor's 2-D view (rows = dim 0, cols = the rest);\n"
           "                      an empty bound is the tensor's edge (NAME@:,0:96)\n"
           "  --min-version N     at least version N (exit 4 if HEAD is below N)\n"
           "  --exact-version N   exactly version N\n"
           "  --out PATH          write the slices to a .safetensors file, one 2-D tensor\n"
           "                      per slice named as its SPEC with the bounds filled in\n"
           "  --fallback URL      another store holding the same run (a mirror's upstream),\n"
           "                      tried in order when the previous one is down, behind or\n"
           "                      serves what does not verify (repeatable; docs/MIRROR.md)\n\n%s\n",
           sync_common_help);
}

/* "A:B" into [a, b) with empty = 0 (the edge). */
static bool parse_range(const char *s, size_t n, uint64_t *a, uint64_t *b)
{
    char buf[64];
    if (n >= sizeof buf) return false;
    memcpy(buf, s, n);
    buf[n] = 0;
    char *colon = strchr(buf, ':');
    if (!colon) return false;
    *colon = 0;
    *a = *b = 0;
    return (!*buf || cli_parse_u64(buf, INT64_MAX, a)) && (!colon[1] || cli_parse_u64(colon + 1, INT64_MAX, b));
}

static bool parse_slice(char *spec, ferry_shard_region *r)
{
    memset(r, 0, sizeof *r);
    char *at = strrchr(spec, '@');
    r->name = spec;
    if (!at) return *spec != 0;
    *at = 0;
    const char *rows = at + 1, *comma = strchr(rows, ',');
    if (!*spec) return false;
    if (!parse_range(rows, comma ? (size_t)(comma - rows) : strlen(rows), &r->row_begin, &r->row_end)) return false;
    return !comma || parse_range(comma + 1, strlen(comma + 1), &r->col_begin, &r->col_end);
}

static int write_out(const char *cmd, ferry_shard_subscriber *s, const ferry_shard_region *rg, size_t n, const char *path)
{
    ferry_model *m = NULL;
    int rc = ferry_model_create(&m);
    for (size_t i = 0; i < n && !rc; i++) {
        ferry_dtype dt;
        uint64_t rows, cols, nb;
        if ((rc = ferry_shard_region_shape(s, i, &dt, &rows, &cols, &nb))) break;
        void *buf = malloc(nb ? nb : 1);
        if (!buf) {
            rc = FERRY_ERR_NOMEM;
            break;
        }
        char name[FERRY_MAX_NAME + 128];
        snprintf(name, sizeof name, "%s@%llu:%llu,%llu:%llu", rg[i].name, (unsigned long long)rg[i].row_begin,
                 (unsigned long long)(rg[i].row_begin + rows), (unsigned long long)rg[i].col_begin,
                 (unsigned long long)(rg[i].col_begin + cols));
        uint64_t shape[2] = {rows, cols};
        if (!(rc = ferry_shard_region_copy(s, i, buf, nb))) rc = ferry_model_add(m, name, dt, 2, shape, buf, nb, FERRY_ADD_COPY);
        free(buf);
    }
    if (!rc) rc = ferry_model_save(m, path);
    ferry_model_free(m);
    return rc ? sync_fail(cmd, rc, path) : 0;
}

int cmd_shard_pull(int argc, char **argv)
{
    const char *cmd = "shard-pull";
    sync_common c;
    sync_common_init(&c);
    ferry_shard_region rg[256];
    size_t n = 0;
    int mode = FERRY_SYNC_LATEST;
    uint64_t version = 0;
    const char *out = NULL, *fb[FERRY_SYNC_STORES_MAX];
    ferry_store *fbs[FERRY_SYNC_STORES_MAX] = {0};
    int nfb = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) {
            shard_pull_help();
            return 0;
        }
        int r = sync_common_opt(cmd, argc, argv, &i, &c);
        if (r == 2) return 2;
        if (r) continue;
        if (!strcmp(a, "--slice")) {
            if (++i == argc || n == sizeof rg / sizeof rg[0] || !parse_slice(argv[i], &rg[n]))
                return cli_usage_error(cmd, "--slice needs NAME, NAME@R0:R1 or NAME@R0:R1,C0:C1 (at most 256 slices)");
            n++;
        } else if (!strcmp(a, "--min-version") || !strcmp(a, "--exact-version")) {
            if (++i == argc || !sync_parse_u64(argv[i], &version) || !version) return cli_usage_error(cmd, "%s needs a version >= 1", a);
            mode = a[2] == 'm' ? FERRY_SYNC_MIN : FERRY_SYNC_EXACT;
        } else if (!strcmp(a, "--out")) {
            if (++i == argc) return cli_usage_error(cmd, "--out needs a path");
            out = argv[i];
        } else if (!strcmp(a, "--fallback")) {
            if (++i == argc || nfb + 1 >= FERRY_SYNC_STORES_MAX)
                return cli_usage_error(cmd, "--fallback needs a store URL (at most %d)", FERRY_SYNC_STORES_MAX - 1);
            fb[nfb++] = argv[i];
        } else if (a[0] == '-' && a[1]) return cli_usage_error(cmd, "unknown option '%s'", a);
        else if (!sync_common_pos(&c, a)) return cli_usage_error(cmd, "unexpected argument '%s'", a);
    }
    int st = sync_common_check(cmd, &c);
    if (st) return st;
    if (!n) return cli_usage_error(cmd, "expects at least one --slice");
    ferry_store *store = NULL;
    int ret = sync_open_store(cmd, &c, 0, &store);
    if (ret) return ret;
    ferry_shard_subscriber *s = NULL;
    ferry_shard_pull_info info;
    ferry_shard_sub_options so = {.keys = c.keys}; /* --trust-key: HEAD and manifests must verify */
    int rc = ferry_shard_subscriber_open(store, c.run, rg, n, &so, &s);
    for (int k = 0; k < nfb && !rc && !ret; k++) { /* the store list, in order (docs/MIRROR.md) */
        const char *url = c.store_url;
        c.store_url = fb[k];
        ret = sync_open_store(cmd, &c, 0, &fbs[k]);
        c.store_url = url;
        if (!ret) rc = ferry_shard_subscriber_add_store(s, fbs[k]);
    }
    if (!rc && !ret) rc = ferry_shard_pull(s, mode, version, &info);
    if (!ret && rc) ret = sync_fail(cmd, rc, c.run); /* (a store that did not open is reported already) */
    else if (out) ret = write_out(cmd, s, rg, n, out);
    if (!ret && c.json) {
        printf("{\"run\": ");
        json_str(stdout, c.run);
        printf(", \"from_version\": %llu, \"version\": %llu, \"head\": %llu, \"path\": \"%s\", \"bytes_fetched\": %llu, "
               "\"object_bytes\": %llu, \"manifest_bytes\": %llu, \"version_bytes\": %llu, \"requests\": %llu, \"tiles\": %llu}\n",
               (unsigned long long)info.from_version, (unsigned long long)info.to_version, (unsigned long long)info.head_version,
               info.path, (unsigned long long)info.bytes_fetched, (unsigned long long)info.object_bytes,
               (unsigned long long)info.manifest_bytes, (unsigned long long)info.version_bytes, (unsigned long long)info.requests,
               (unsigned long long)info.tiles);
    }
    unsigned used = !ret && s ? ferry_shard_subscriber_store_used(s) : 0;
    if (used && !c.quiet) fprintf(stderr, "ferry shard-pull: served by the fallback %s\n", fb[used - 1]);
    if (!ret && !c.json && !c.quiet) {
        printf("run %s: version %llu (%s): %llu tile bytes in %llu ranged GETs (%.1f%% of the versions' %llu), %llu manifest bytes\n",
               c.run, (unsigned long long)info.to_version, info.path, (unsigned long long)info.object_bytes,
               (unsigned long long)info.requests,
               info.version_bytes ? 100.0 * (double)info.object_bytes / (double)info.version_bytes : 0.0,
               (unsigned long long)info.version_bytes, (unsigned long long)info.manifest_bytes);
    }
    ferry_shard_subscriber_free(s);
    for (int k = 0; k < nfb; k++) ferry_store_free(fbs[k]);
    ferry_store_free(store);
    return ret;
}
#else
#include "util.h"
int cmd_shard_pull(int argc, char **argv)
{
    (void)argc, (void)argv;
    return cli_usage_error("shard-pull", "this build has no store layer (NO_NET=1)");
}
#endif
