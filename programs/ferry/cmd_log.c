/* ferry log: the versions of a run still in the store, and its compacted
 * deltas. */
#include "cmd_sync.h"

#ifndef FERRY_NO_NET
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util.h"

static void log_help(void)
{
    printf("usage: ferry log STORE --run RUN [--last N] [--json]\n\n"
           "Lists the versions of RUN reachable from HEAD that the store still holds\n"
           "(oldest first): version, kind (anchor or delta), base version, anchor it\n"
           "chains back to, delta and full-object bytes, creation time, publisher and\n"
           "model hash; then the compacted deltas (a sharded run's: the count of its\n"
           "rank objects, one per trainer rank, and their keys; --json: \"objects\" and\n"
           "the key of rank 0's).  With --trust-key every record\n"
           "listed (HEAD, the manifests, the compaction index) must verify, else\n"
           "nothing is listed and the exit status is 7.\n\n"
           "  --last N    only the N newest versions\n\n%s\n",
           sync_common_help);
}

int cmd_log(int argc, char **argv)
{
    sync_common c;
    sync_common_init(&c);
    uint64_t last = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) { log_help(); return 0; }
        int r = sync_common_opt("log", argc, argv, &i, &c);
        if (r == 2) return 2;
        if (r) continue;
        if (!strcmp(a, "--last")) {
            if (++i == argc || !sync_parse_u64(argv[i], &last) || !last) return cli_usage_error("log", "--last needs a count >= 1");
        } else if (a[0] == '-' && a[1]) return cli_usage_error("log", "unknown option '%s'", a);
        else if (!sync_common_pos(&c, a)) return cli_usage_error("log", "unexpected argument '%s'", a);
    }
    int st = sync_common_check("log", &c);
    if (st) return st;
    ferry_store *store = NULL;
    int ret = sync_open_store("log", &c, 0, &store);
    if (ret) return ret;
    ferry_run_log *log = NULL;
    int rc = ferry_run_log_read_keys(store, c.run, last, c.keys, &log);
    if (rc) {
        ret = sync_fail("log", rc, c.run);
        ferry_store_free(store);
        return ret;
    }
    if (c.json) {
        printf("{\"run\": ");
        json_str(stdout, c.run);
        printf(", \"head\": %llu, \"verified\": %s, \"head_publisher\": ", (unsigned long long)log->head,
               log->verified ? "true" : "false");
        json_str(stdout, log->head_publisher);
        printf(", \"run_id\": \"%s\", \"versions\": [", log->run_id);
    } else {
        printf("run %s: HEAD is version %llu (published by %s, run id %s)%s\n", c.run, (unsigned long long)log->head,
               log->head_publisher, log->run_id[0] ? log->run_id : "none", log->verified ? "; HEAD, manifests and index signed by a trusted key" : "");
        printf("%8s %-6s %6s %6s %12s %12s %-20s %-32s %s\n", "version", "kind", "base", "anchor", "delta_bytes", "full_bytes",
               "created (UTC)", "model hash", "publisher");
    }
    for (size_t i = 0; i < log->count; i++) {
        const ferry_version_info *v = &log->versions[i];
        char h[33], t[32];
        hex16(h, v->model_hash);
        time_t tt = (time_t)v->created;
        struct tm tm;
        if (!gmtime_r(&tt, &tm) || !strftime(t, sizeof t, "%Y-%m-%dT%H:%M:%SZ", &tm)) snprintf(t, sizeof t, "?");
        const char *kind = v->kind == FERRY_SYNC_ANCHOR ? "anchor" : "delta";
        if (c.json) {
            printf("%s{\"version\": %llu, \"kind\": \"%s\", \"base\": %llu, \"anchor\": %llu, \"delta_bytes\": %llu, "
                   "\"full_bytes\": %llu, \"model_bytes\": %llu, \"created\": \"%s\", \"created_unix\": %lld, \"model_hash\": \"%s\", "
                   "\"id\": \"%s\", \"publisher\": ",
                   i ? ", " : "", (unsigned long long)v->version, kind, (unsigned long long)v->base_version,
                   (unsigned long long)v->anchor_version, (unsigned long long)v->delta_bytes, (unsigned long long)v->full_bytes,
                   (unsigned long long)v->model_bytes, t, (long long)v->created, h, v->id);
            json_str(stdout, v->publisher);
            printf("}");
        } else {
            printf("%8llu %-6s %6llu %6llu %12llu %12llu %-20s %-32s %s\n", (unsigned long long)v->version, kind,
                   (unsigned long long)v->base_version, (unsigned long long)v->anchor_version, (unsigned long long)v->delta_bytes,
                   (unsigned long long)v->full_bytes, t, h, v->publisher);
        }
    }
    if (c.json) printf("], \"compactions\": [");
    else if (log->ncompactions) printf("compacted deltas:\n");
    for (size_t i = 0; i < log->ncompactions; i++) {
        const ferry_compaction_info *k = &log->compactions[i];
        if (c.json) {
            printf("%s{\"from\": %llu, \"to\": %llu, \"bytes\": %llu, \"chain_bytes\": %llu, \"key\": ", i ? ", " : "",
                   (unsigned long long)k->from, (unsigned long long)k->to, (unsigned long long)k->bytes,
                   (unsigned long long)k->chain_bytes);
            json_str(stdout, k->key);
            if (k->objects) printf(", \"sharded\": true, \"objects\": %u", k->objects);
            printf("}");
        } else if (k->objects) { /* key: rank 0's object */
            printf("  %llu..%llu: %llu bytes in %u rank objects (the deltas they replace: %llu)  %.*s-r000000..r%06u.patch\n",
                   (unsigned long long)k->from, (unsigned long long)k->to, (unsigned long long)k->bytes, k->objects,
                   (unsigned long long)k->chain_bytes, (int)(strlen(k->key) - strlen("-r000000.patch")), k->key, k->objects - 1);
        } else {
            printf("  %llu..%llu: %llu bytes (the deltas it replaces: %llu)  %s\n", (unsigned long long)k->from,
                   (unsigned long long)k->to, (unsigned long long)k->bytes, (unsigned long long)k->chain_bytes, k->key);
        }
    }
    if (c.json) printf("]}\n");
    ferry_run_log_free(log);
    ferry_store_free(store);
    return 0;
}
#endif
