/* ferry head-repair: the owner's recovery of a deleted, forged or rolled
 * back HEAD (ferry_head_repair, docs/SECURITY.md "Recovering HEAD"). */
#include "cmd_sync.h"

#ifndef FERRY_NO_NET
#include <stdio.h>
#include <string.h>

#include "util.h"

static void head_repair_help(void)
{
    printf("usage: ferry head-repair STORE --run RUN --sign-key KEY [--trust-key PUB]... [--run-id ID]\n"
           "                         [--dry-run] [--json] [-q]\n\n"
           "Rewrites HEAD to the newest version of RUN that verifies, after HEAD was\n"
           "deleted, forged (a keyed `ferry publish` or `pull` exits 7 on it) or rolled\n"
           "back.  Every manifest under RUN/v/ is verified against the publisher keys\n"
           "(--sign-key's public half, and each --trust-key); a version is a candidate\n"
           "when the manifests down to its anchor verify and link and the anchor's full\n"
           "object and each delta above it are in the store with their signed sizes.\n"
           "HEAD is then signed with --sign-key and written by compare-and-swap against\n"
           "the HEAD read (exit 3 if it changed meanwhile).  A HEAD that verifies and\n"
           "already names that version is left alone; one naming a newer version that\n"
           "is no longer complete is not moved back (exit 3: publish a new version).\n"
           "The objects' bytes are not read here: the publisher that resumes next, and\n"
           "every island, check each against its signed SHA-256.  Prints the version.\n\n"
           "  --run-id ID  only versions of this run id (`ferry log` shows it); needed\n"
           "               when versions of several run ids verify (exit 3)\n"
           "  --dry-run    say which version HEAD would name; write nothing\n\n%s\n",
           sync_common_help);
}

static const char *k_state[] = {"absent", "verified", "refused"};

int cmd_head_repair(int argc, char **argv)
{
    sync_common c;
    sync_common_init(&c);
    ferry_head_repair_options ro = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) { head_repair_help(); return 0; }
        int r = sync_common_opt("head-repair", argc, argv, &i, &c);
        if (r == 2) return 2;
        if (r) continue;
        if (!strcmp(a, "--dry-run")) ro.dry_run = 1;
        else if (a[0] == '-' && a[1]) return cli_usage_error("head-repair", "unknown option '%s'", a);
        else if (!sync_common_pos(&c, a)) return cli_usage_error("head-repair", "unexpected argument '%s'", a);
    }
    int st = sync_common_check("head-repair", &c);
    if (st) return st;
    if (!c.sign_key) return cli_usage_error("head-repair", "needs --sign-key (the publisher's private key: the new HEAD is signed)");
    ferry_store *store = NULL;
    int ret = sync_open_store("head-repair", &c, 0, &store);
    if (ret) return ret;
    ro.keys = c.keys;
    ro.run_id = c.run_id;
    ferry_head_repair_info info;
    int rc = ferry_head_repair(store, c.run, &ro, &info);
    sync_progress_end();
    if (rc) ret = sync_fail("head-repair", rc, c.run);
    else if (c.json) {
        printf("{\"run\": ");
        json_str(stdout, c.run);
        printf(", \"version\": %llu, \"id\": \"%s\", \"run_id\": \"%s\", \"written\": %s, \"dry_run\": %s, \"head_before\": \"%s\", "
               "\"head_before_version\": %llu, \"head_error\": ",
               (unsigned long long)info.version, info.id, info.run_id, info.written ? "true" : "false", ro.dry_run ? "true" : "false",
               k_state[info.head_state], (unsigned long long)info.head_before);
        json_str(stdout, info.head_error);
        printf(", \"manifests\": %llu, \"refused\": %llu, \"last_refusal\": ", (unsigned long long)info.manifests,
               (unsigned long long)info.refused);
        json_str(stdout, info.last_refusal);
        printf("}\n");
    } else if (!c.quiet) {
        if (info.head_state == 2) printf("%s: HEAD did not verify: %s\n", c.run, info.head_error);
        else if (!info.head_state) printf("%s: HEAD was absent\n", c.run);
        printf("%s: HEAD %s version %llu (id %s, run id %s)%s\n", c.run,
               info.written ? "now names" : ro.dry_run ? "would name" : "already names", (unsigned long long)info.version, info.id,
               info.run_id[0] ? info.run_id : "none", info.refused ? "; some manifests were refused, see --json" : "");
    }
    ferry_store_free(store);
    return ret;
}
#endif
