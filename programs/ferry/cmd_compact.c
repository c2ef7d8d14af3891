/* ferry compact: one delta for a range of versions. */
#include "cmd_sync.h"

#ifndef FERRY_NO_NET
#include <stdio.h>
#include <string.h>

#include "ferry_shard.h"
#include "util.h"

static void compact_help(void)
{
    printf("usage: ferry compact STORE --run RUN [--from A] [--to B] [--level N] [--threads N] [--json]\n\n"
           "Squashes the deltas from version A to version B into one delta (both models\n"
           "are rebuilt and verified through the subscriber path, then diffed), stores it\n"
           "beside the versions and lists it in RUN/compactions.json.  Subscribers at A\n"
           "(or that reach A cheaply) use it when it is their smallest path.  It changes\n"
           "no version and can run beside a publisher.\n\n"
           "A sharded run (published by ferry-shard-mpi, ferry_shard_*) is compacted per\n"
           "trainer rank: each rank's tiles of A and B are pulled and verified, and one\n"
           "object per rank codes B's tiles against A's (RUN/c/A-B-ID-rRANK.patch, with\n"
           "its tile index); islands at A use it when it costs less than the chain.\n"
           "Its --json adds \"sharded\": true, world, tiles, anchor_bytes (the newest\n"
           "anchor's objects at or below B), read_bytes and id.\n\n"
           "  --from A     first version (default: the newest anchor below B)\n"
           "  --to B       last version (default: HEAD)\n"
           "  --level N    zstd level for whole tensors or tiles (default 3)\n"
           "  --threads N  codec threads (default 1)\n\n%s\n",
           sync_common_help);
}

int cmd_compact(int argc, char **argv)
{
    sync_common c;
    sync_common_init(&c);
    ferry_compact_options co = {0};
    long num;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) { compact_help(); return 0; }
        int r = sync_common_opt("compact", argc, argv, &i, &c);
        if (r == 2) return 2;
        if (r) continue;
        if (!strcmp(a, "--from") || !strcmp(a, "--to")) {
            uint64_t *dst = a[2] == 'f' ? &co.from : &co.to;
            if (++i == argc || !sync_parse_u64(argv[i], dst) || !*dst) return cli_usage_error("compact", "%s needs a version >= 1", a);
        } else if (!strcmp(a, "--level") || !strcmp(a, "--threads")) {
            if (++i == argc || !cli_parse_int(argv[i], 1, a[2] == 'l' ? 19 : 256, &num))
                return cli_usage_error("compact", "%s needs a number in range", a);
            if (a[2] == 'l') co.level = (int)num;
            else co.threads = (int)num;
        } else if (a[0] == '-' && a[1]) return cli_usage_error("compact", "unknown option '%s'", a);
        else if (!sync_common_pos(&c, a)) return cli_usage_error("compact", "unexpected argument '%s'", a);
    }
    int st = sync_common_check("compact", &c);
    if (st) return st;
    if (co.from && co.to && co.from >= co.to) return cli_usage_error("compact", "--from must be below --to");
    ferry_store *store = NULL;
    int ret = sync_open_store("compact", &c, 0, &store);
    if (ret) return ret;
    ferry_compaction_info ci;
    ferry_shard_compact_info si;
    co.keys = c.keys;
    /* a sharded run (HEAD's manifest is a ferry-manifest-2) is compacted
       per rank; a single-rank one answers SHARD_KIND at its first manifest */
    int rc = ferry_shard_compact(store, c.run, &co, &si);
    bool sharded = rc != FERRY_ERR_SHARD_KIND;
    if (!sharded) {
        rc = ferry_compact(store, c.run, &co, &ci);
    }
    sync_progress_end();
    if (rc) ret = sync_fail("compact", rc, c.run);
    else if (c.json && sharded) {
        printf("{\"run\": ");
        json_str(stdout, c.run);
        printf(", \"sharded\": true, \"from\": %llu, \"to\": %llu, \"bytes\": %llu, \"chain_bytes\": %llu, \"anchor_bytes\": %llu, "
               "\"world\": %u, \"tiles\": %llu, \"read_bytes\": %llu, \"id\": \"%s\", \"key\": ",
               (unsigned long long)si.from, (unsigned long long)si.to, (unsigned long long)si.bytes, (unsigned long long)si.chain_bytes,
               (unsigned long long)si.anchor_bytes, si.world, (unsigned long long)si.tiles, (unsigned long long)si.read_bytes, si.id);
        json_str(stdout, si.key);
        printf("}\n");
    } else if (c.json) {
        printf("{\"run\": ");
        json_str(stdout, c.run);
        printf(", \"from\": %llu, \"to\": %llu, \"bytes\": %llu, \"chain_bytes\": %llu, \"key\": ", (unsigned long long)ci.from,
               (unsigned long long)ci.to, (unsigned long long)ci.bytes, (unsigned long long)ci.chain_bytes);
        json_str(stdout, ci.key);
        printf("}\n");
    } else if (!c.quiet && sharded) {
        printf("%s: compacted %llu..%llu into %u rank objects, %llu bytes (the deltas they replace: %llu bytes; the anchor: %llu "
               "bytes)\n", c.run, (unsigned long long)si.from, (unsigned long long)si.to, si.world, (unsigned long long)si.bytes,
               (unsigned long long)si.chain_bytes, (unsigned long long)si.anchor_bytes);
    } else if (!c.quiet) {
        printf("%s: compacted %llu..%llu into %llu bytes (the deltas it replaces: %llu bytes)\n", c.run, (unsigned long long)ci.from,
               (unsigned long long)ci.to, (unsigned long long)ci.bytes, (unsigned long long)ci.chain_bytes);
    }
    ferry_store_free(store);
    return ret;
}
#endif
