/* ferry shard-pull: one island rank's slices of a sharded run
 * (include/ferry_shard.h).  The publishing side runs under MPI:
 * build/ferry-shard-mpi (programs/ferry/cmd_shard_mpi.c). */
#include "cmd_sync.h"
#include "cmd_shard.h"

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
           "                        [--follow [--interval S] [--until-version N] [--idle-timeout S]]\n"
           "                        [--fallback URL ...] [--threads N] [--json] [-q]\n\n"
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
           "                      per slice named as its SPEC with the bounds filled in;\n"
           "                      the version it holds is recorded in PATH.ferry.json and\n"
           "                      the next call with the same slices starts from it (only\n"
           "                      the deltas are fetched; slices on tile edges, else it\n"
           "                      pulls from scratch).  PATH is replaced by an atomic\n"
           "                      rename only with a complete, verified version, and is\n"
           "                      left as it was on any failure; beside an existing PATH,\n"
           "                      a state file that does not parse, names another run or\n"
           "                      other slices, or that PATH no longer matches is an\n"
           "                      error (exit 1; remove both to start over)\n"
           "  --follow            keep the slices (and PATH) at the latest version as\n"
           "                      versions appear\n"
           "  --interval S        how often --follow polls HEAD (default 1)\n"
           "  --until-version N   --follow: stop once holding N or later\n"
           "  --idle-timeout S    --follow: stop (exit 4) when no new version came for S seconds\n"
           "  --fallback URL      another store holding the same run (a mirror's upstream),\n"
           "                      tried in order when the previous one is down, behind or\n"
           "                      serves what does not verify (repeatable; docs/MIRROR.md)\n"
           "  --threads N         codec threads (default 1)\n\n%s\n",
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

int cmd_shard_pull(int argc, char **argv)
{
    const char *cmd = "shard-pull";
    sync_common c;
    sync_common_init(&c);
    ferry_shard_region rg[256];
    size_t n = 0;
    shard_out o = {.cmd = cmd, .mode = FERRY_SYNC_LATEST, .interval_s = 1.0};
    int modes = 0;
    long num;
    const char *fb[FERRY_SYNC_STORES_MAX];
    ferry_store *fbs[FERRY_SYNC_STORES_MAX] = {0};
    int nfb = 0;
    ferry_shard_sub_options so = {0};
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
        } else if (!strcmp(a, "--min-version") || !strcmp(a, "--exact-version") || !strcmp(a, "--until-version")) {
            uint64_t *dst = a[2] == 'u' ? &o.until : &o.version;
            if (++i == argc || !sync_parse_u64(argv[i], dst) || !*dst) return cli_usage_error(cmd, "%s needs a version >= 1", a);
            if (a[2] != 'u') {
                o.mode = a[2] == 'm' ? FERRY_SYNC_MIN : FERRY_SYNC_EXACT;
                modes++;
            }
        } else if (!strcmp(a, "--follow")) {
            o.follow = true;
        } else if (!strcmp(a, "--interval") || !strcmp(a, "--idle-timeout")) {
            char *end;
            double sec = ++i < argc ? strtod(argv[i], &end) : -1;
            if (i == argc || *end || !(sec > 0) || sec > 86400) return cli_usage_error(cmd, "%s needs seconds", a);
            if (a[3] == 'n') o.interval_s = sec;
            else o.idle_s = sec;
        } else if (!strcmp(a, "--threads")) {
            if (++i == argc || !cli_parse_int(argv[i], 1, 256, &num)) return cli_usage_error(cmd, "--threads needs 1..256");
            so.threads = (int)num;
        } else if (!strcmp(a, "--out")) {
            if (++i == argc) return cli_usage_error(cmd, "--out needs a path");
            o.path = argv[i];
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
    if (modes > 1) return cli_usage_error(cmd, "give --min-version or --exact-version, not both");
    if (o.follow && o.mode == FERRY_SYNC_EXACT) return cli_usage_error(cmd, "--follow keeps the latest version: not with --exact-version");
    if (!o.follow && (o.until || o.idle_s > 0)) return cli_usage_error(cmd, "--until-version and --idle-timeout go with --follow");
    o.rg = rg;
    o.n = n;
    o.fallback = fb;
    ferry_store *store = NULL;
    int ret = sync_open_store(cmd, &c, 0, &store);
    if (ret) return ret;
    ferry_shard_subscriber *s = NULL;
    so.keys = c.keys; /* --trust-key: HEAD and manifests must verify */
    so.poll_interval_ms = (uint32_t)(o.interval_s * 1000.0 + 0.5) ? (uint32_t)(o.interval_s * 1000.0 + 0.5) : 1;
    int rc = ferry_shard_subscriber_open(store, c.run, rg, n, &so, &s);
    for (int k = 0; k < nfb && !rc && !ret; k++) { /* the store list, in order (docs/MIRROR.md) */
        const char *url = c.store_url;
        c.store_url = fb[k];
        ret = sync_open_store(cmd, &c, 0, &fbs[k]);
        c.store_url = url;
        if (!ret) rc = ferry_shard_subscriber_add_store(s, fbs[k]);
    }
    if (!ret && rc) ret = sync_fail(cmd, rc, c.run); /* (a store that did not open is reported already) */
    else if (!ret) ret = shard_out_run(&c, s, &o);
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
