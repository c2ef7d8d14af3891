/* ferry mirror: follow a run from an upstream store into a nearer one. */
#include "cmd_sync.h"

#ifndef FERRY_NO_NET
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util.h"

static void mirror_help(void)
{
    printf("usage: ferry mirror SRC DST --run RUN [--follow [--for S] [--until-version N] [--poll-ms N]]\n"
           "                    [--keep N [--grace S]] [--tmp-dir DIR] [--concurrency N] [--chunk-size BYTES]\n\n"
           "Copies RUN's new versions from the store SRC into the store DST, byte for byte\n"
           "(manifests, deltas, full objects, and HEAD last, by compare-and-swap), so that\n"
           "the islands of one datacenter pull from DST and each version crosses the long\n"
           "link once.  Each object is verified against its manifest before the manifest\n"
           "is written to DST, and DST's HEAD moves only when the whole version is there:\n"
           "a mirror killed mid-copy never exposes a half version.  A DST that is empty,\n"
           "far behind or on another lineage starts at the anchor of SRC's HEAD.  DST may\n"
           "itself be the SRC of another mirror.  See docs/MIRROR.md.\n\n"
           "  --follow           keep copying as SRC's HEAD moves (polls SRC's HEAD)\n"
           "  --for S            stop following after S seconds (default 86400)\n"
           "  --until-version N  stop following once DST holds version N\n"
           "  --poll-ms N        HEAD polling interval while following (default 200)\n"
           "  --keep N           after each copy, GC DST keeping N versions (ferry gc's rule)\n"
           "  --grace S          that GC's grace for unreferenced objects (default 3600)\n"
           "  --tmp-dir DIR      where full objects are staged while verified (a download\n"
           "                     cut by a failure or a kill resumes from there)\n"
           "  --concurrency N    parallel ranged GETs per full object (default 4)\n"
           "  --chunk-size BYTES their size (default 8 MiB)\n\n"
           "The store options below apply to both stores (--rate caps each transfer).\n\n%s\n",
           sync_common_help);
}

static void report(const sync_common *c, const ferry_mirror_info *in, int rc)
{
    if (c->quiet) return;
    if (c->json) {
        printf("{\"from_version\": %llu, \"to_version\": %llu, \"src_version\": %llu, \"first_copied\": %llu, "
               "\"versions_copied\": %u, \"objects_copied\": %u, \"objects_reused\": %u, \"bytes_copied\": %llu, "
               "\"gc_deleted\": %llu, \"compactions_copied\": %u, \"index_copied\": %u, \"seconds\": %.3f, \"ok\": %s}\n",
               (unsigned long long)in->from_version, (unsigned long long)in->to_version, (unsigned long long)in->src_version,
               (unsigned long long)in->first_copied, in->versions_copied, in->objects_copied, in->objects_reused,
               (unsigned long long)in->bytes_copied, (unsigned long long)in->gc_deleted, in->compactions_copied, in->index_copied,
               in->seconds, rc ? "false" : "true");
    } else if (!rc && in->versions_copied) {
        printf("%s: %llu -> %llu (versions %llu..%llu: %u objects copied, %u reused, %llu bytes from the upstream) in %.3f s\n",
               c->run, (unsigned long long)in->from_version, (unsigned long long)in->to_version,
               (unsigned long long)in->first_copied, (unsigned long long)in->to_version, in->objects_copied, in->objects_reused,
               (unsigned long long)in->bytes_copied, in->seconds);
    } else if (!rc) {
        printf("%s: up to date at version %llu\n", c->run, (unsigned long long)in->to_version);
    }
    if (!c->json && !rc && in->index_copied)
        printf("%s: compaction index copied (%u compacted deltas)\n", c->run, in->compactions_copied);
    fflush(stdout);
}

/* Failures a later attempt may not meet: the upstream or the link down, an
 * object that did not verify (DST stays as it was). */
static bool transient(int rc)
{
    return rc == FERRY_ERR_SYNC_NOT_YET || rc == FERRY_ERR_SYNC_CORRUPT || rc == FERRY_ERR_SYNC_MANIFEST || rc == FERRY_ERR_SHARD_INDEX ||
           (rc >= FERRY_ERR_SIG_MISSING && rc <= FERRY_ERR_SIG_DIGEST) || /* forged upstream: may be repaired */
           (rc >= FERRY_ERR_STORE_NOT_FOUND && rc <= FERRY_ERR_STORE_CORRUPT && rc != FERRY_ERR_STORE_READONLY &&
            rc != FERRY_ERR_STORE_AUTH);
}

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { (void)sig, g_stop = 1; }


int cmd_mirror(int argc, char **argv)
{
    sync_common c;
    sync_common_init(&c);
    ferry_mirror_options mo = {0};
    const char *dst_url = NULL;
    bool follow = false;
    uint64_t for_s = 86400, until = 0, poll_ms = 200;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) { mirror_help(); return 0; }
        int r = sync_common_opt("mirror", argc, argv, &i, &c);
        if (r == 2) return 2;
        if (r) continue;
        uint64_t n;
        if (!strcmp(a, "--follow")) follow = true;
        else if (!strcmp(a, "--tmp-dir")) {
            if (++i == argc) return cli_usage_error("mirror", "--tmp-dir needs a directory");
            mo.tmp_dir = argv[i];
        } else if (!strcmp(a, "--concurrency") || !strcmp(a, "--chunk-size")) {
            if (++i == argc || !sync_parse_u64(argv[i], &n) || !n || (a[2] == 'c' && a[3] == 'o' && n > 64))
                return cli_usage_error("mirror", "%s needs a number%s", a, a[3] == 'o' ? " in 1..64" : " of bytes");
            if (a[3] == 'o') mo.concurrency = (unsigned)n;
            else mo.chunk_size = n;
        } else if (!strcmp(a, "--for") || !strcmp(a, "--until-version") || !strcmp(a, "--poll-ms") || !strcmp(a, "--keep") ||
                   !strcmp(a, "--grace")) {
            if (++i == argc || !sync_parse_u64(argv[i], &n)) return cli_usage_error("mirror", "%s needs a number", a);
            if (!strcmp(a, "--for")) for_s = n;
            else if (!strcmp(a, "--until-version")) until = n;
            else if (!strcmp(a, "--poll-ms")) poll_ms = n ? n : 1;
            else if (!strcmp(a, "--keep")) mo.keep = n;
            else mo.grace_s = n ? (int64_t)n : -1;
        } else if (a[0] == '-' && a[1]) return cli_usage_error("mirror", "unknown option '%s'", a);
        else if (sync_common_pos(&c, a)) continue;
        else if (!dst_url) dst_url = a;
        else return cli_usage_error("mirror", "unexpected argument '%s'", a);
    }
    int st = sync_common_check("mirror", &c);
    if (st) return st;
    if (!dst_url) return cli_usage_error("mirror", "missing DST (ferry mirror SRC DST --run RUN)");
    ferry_store *src = NULL, *dst = NULL;
    int ret = sync_open_store("mirror", &c, 0, &src);
    if (ret) return ret;
    const char *src_url = c.store_url;
    c.store_url = dst_url;
    ret = sync_open_store("mirror", &c, 1, &dst);
    c.store_url = src_url;
    if (ret) {
        ferry_store_free(src);
        return ret;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    char head_key[FERRY_SYNC_RUN_MAX + 8], seen[FERRY_STORE_ETAG_MAX] = "";
    char index_key[FERRY_SYNC_RUN_MAX + 20], seen_index[FERRY_STORE_ETAG_MAX] = "";
    snprintf(head_key, sizeof head_key, "%s/HEAD", c.run);
    snprintf(index_key, sizeof index_key, "%s/compactions.json", c.run);
    double t_end = cli_now() + (double)for_s;
    mo.keys = c.keys;
    ferry_mirror_info info;
    int rc;
    for (;;) {
        rc = ferry_mirror_once(src, dst, c.run, &mo, &info);
        if (!follow || !rc) report(&c, &info, rc);
        else if (!c.quiet) fprintf(stderr, "ferry mirror: %s (retrying)\n", ferry_last_error());
        if (!follow) break;
        if (rc && !transient(rc)) break;
        /* to_version is DST's HEAD even when the pass failed after it
           (on the compaction index): the version asked for is served */
        if ((until && info.to_version >= until) || g_stop) {
            rc = FERRY_OK;
            break;
        }
        /* wait for SRC's HEAD to change (a HEAD request: no body) */
        for (;;) {
            if (g_stop || cli_now() >= t_end) break;
            cli_sleep_s((double)poll_ms / 1e3);
            ferry_store_stat ss;
            if (ferry_store_head(src, head_key, &ss)) continue;
            if (rc || !ss.etag[0] || strcmp(ss.etag, seen)) {
                snprintf(seen, sizeof seen, "%s", ss.etag);
                break;
            }
            /* a compaction adds no version: its index is watched too */
            if (!ferry_store_head(src, index_key, &ss) && strcmp(ss.etag, seen_index)) {
                snprintf(seen_index, sizeof seen_index, "%s", ss.etag);
                break;
            }
        }
        if (g_stop || cli_now() >= t_end) {
            if (until && !g_stop) {
                fprintf(stderr, "ferry mirror: %s: version %llu not reached within %llu s\n", c.run, (unsigned long long)until,
                        (unsigned long long)for_s);
                ret = SYNC_EXIT_NOT_YET;
            }
            rc = FERRY_OK;
            break;
        }
    }
    if (rc) ret = sync_fail("mirror", rc, c.run);
    ferry_store_free(dst);
    ferry_store_free(src);
    return ret;
}
#endif
