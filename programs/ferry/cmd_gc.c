/* ferry gc: retention. */
#include "cmd_sync.h"

#ifndef FERRY_NO_NET
#include <stdio.h>
#include <string.h>

#include "util.h"

static void gc_help(void)
{
    printf("usage: ferry gc STORE --run RUN --keep N [--dry-run] [--grace S] [--verbose] [--json]\n\n"
           "Deletes the objects of RUN that no retained version needs.  With HEAD at\n"
           "version H, the retained set is every version from A to H, A being the anchor\n"
           "that version max(1, H-N+1) chains back to: the last N versions and all a\n"
           "reader needs to reach them.  Kept as well: the compacted deltas that end in\n"
           "the retained set, anything above HEAD (a publish in flight), unreferenced\n"
           "objects younger than the grace period (a compaction in flight, a crashed or\n"
           "losing publisher's leftovers), and keys that are not the protocol's.  The\n"
           "version HEAD names is never deleted.\n\n"
           "  --keep N     versions to keep (>= 1)\n"
           "  --dry-run    say what would go, delete nothing\n"
           "  --grace S    age before unreferenced objects go (default 3600; 0 = at once)\n"
           "  --verbose    one line per object: delete/keep, size, key, reason\n\n%s\n",
           sync_common_help);
}

typedef struct gc_print {
    bool verbose, json;
    bool first;
} gc_print;

static void on_object(void *user, const char *key, uint64_t bytes, int action, const char *why)
{
    gc_print *p = user;
    if (p->json) {
        if (!action) return;
        printf("%s", p->first ? "" : ", ");
        json_str(stdout, key);
        p->first = false;
        return;
    }
    if (p->verbose || action) printf("%s %12llu %s (%s)\n", action ? "delete" : "keep  ", (unsigned long long)bytes, key, why);
}

int cmd_gc(int argc, char **argv)
{
    sync_common c;
    sync_common_init(&c);
    ferry_gc_options go = {0};
    bool verbose = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) { gc_help(); return 0; }
        int r = sync_common_opt("gc", argc, argv, &i, &c);
        if (r == 2) return 2;
        if (r) continue;
        if (!strcmp(a, "--dry-run")) go.dry_run = 1;
        else if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) verbose = true;
        else if (!strcmp(a, "--keep") || !strcmp(a, "--grace")) {
            uint64_t n;
            if (++i == argc || !sync_parse_u64(argv[i], &n) || (a[2] == 'k' && !n))
                return cli_usage_error("gc", "%s needs a number%s", a, a[2] == 'k' ? " >= 1" : " of seconds");
            if (a[2] == 'k') go.keep = n;
            else go.grace_s = n ? (int64_t)n : -1;
        } else if (a[0] == '-' && a[1]) return cli_usage_error("gc", "unknown option '%s'", a);
        else if (!sync_common_pos(&c, a)) return cli_usage_error("gc", "unexpected argument '%s'", a);
    }
    int st = sync_common_check("gc", &c);
    if (st) return st;
    if (!go.keep) return cli_usage_error("gc", "missing --keep N");
    ferry_store *store = NULL;
    int ret = sync_open_store("gc", &c, 0, &store);
    if (ret) return ret;
    gc_print pr = {verbose, c.json, true};
    if (!c.quiet) {
        go.on_object = on_object;
        go.user = &pr;
    }
    if (c.json && !c.quiet) printf("{\"deleted_keys\": [");
    ferry_gc_report rep;
    go.keys = c.keys;
    int rc = ferry_gc(store, c.run, &go, &rep);
    if (c.json && !c.quiet) {
        printf("], \"dry_run\": %s, \"head\": %llu, \"oldest_retained\": %llu, \"objects_deleted\": %llu, \"bytes_deleted\": %llu, "
               "\"objects_kept\": %llu, \"bytes_kept\": %llu, \"compactions_dropped\": %llu, \"ok\": %s}\n",
               go.dry_run ? "true" : "false", (unsigned long long)rep.head, (unsigned long long)rep.oldest_retained,
               (unsigned long long)rep.objects_deleted, (unsigned long long)rep.bytes_deleted, (unsigned long long)rep.objects_kept,
               (unsigned long long)rep.bytes_kept, (unsigned long long)rep.compactions_dropped, rc ? "false" : "true");
    }
    if (rc) ret = sync_fail("gc", rc, c.run);
    else if (!c.json && !c.quiet)
        printf("%s: HEAD %llu, retained %llu..%llu; %s %llu objects (%llu bytes), kept %llu (%llu bytes)\n", c.run,
               (unsigned long long)rep.head, (unsigned long long)rep.oldest_retained, (unsigned long long)rep.head,
               go.dry_run ? "would delete" : "deleted", (unsigned long long)rep.objects_deleted,
               (unsigned long long)rep.bytes_deleted, (unsigned long long)rep.objects_kept, (unsigned long long)rep.bytes_kept);
    ferry_store_free(store);
    return ret;
}
#endif
