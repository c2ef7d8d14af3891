/* ferry — command-line tool.  Uses only the public API (include/ferry*.h). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cmd_sync.h"

int cmd_shard_pull(int argc, char **argv); /* cmd_shard.c */

static const struct { const char *name; int (*fn)(int, char **); const char *help; } k_cmds[] = {
    {"diff", cmd_diff, "encode the patch that turns OLD into NEW"},
    {"apply", cmd_apply, "apply a patch to a base checkpoint"},
    {"inspect", cmd_inspect, "show what a patch holds"},
    {"stats", cmd_stats, "change statistics between two checkpoints"},
    {"quantize", cmd_quantize, "a BF16 checkpoint as its FP8 (128x128 block-scaled) checkpoint"},
#ifndef FERRY_NO_NET
    {"publish", cmd_publish, "publish a checkpoint as the next version of a run"},
    {"pull", cmd_pull, "bring a local checkpoint to a version of a run (or follow it)"},
    {"log", cmd_log, "list a run's versions, kinds, bases, sizes and times"},
    {"gc", cmd_gc, "delete what no retained version of a run needs"},
    {"compact", cmd_compact, "squash a range of a run's deltas into one"},
    {"keygen", cmd_keygen, "make an Ed25519 key pair for signed runs and batches"},
    {"head-repair", cmd_head_repair, "rewrite a deleted or forged HEAD to the newest version that verifies"},
    {"mirror", cmd_mirror, "follow a run from an upstream store into a nearer one"},
    {"shard-pull", cmd_shard_pull, "an island rank's slices of a sharded run (ranged GETs)"},
#endif
};

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry COMMAND [OPTIONS] ...\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        fprintf(f, "  %-10s %s\n", k_cmds[i].name, k_cmds[i].help);
    fprintf(f, "\n'ferry COMMAND --help' describes each command.  ferry %s\n", ferry_version());
}

int main(int argc, char **argv)
{
    if (argc < 2) { usage(stderr); return 2; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) { usage(stdout); return 0; }
    if (!strcmp(argv[1], "--version")) { printf("ferry %s\n", ferry_version()); return 0; }
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        if (!strcmp(argv[1], k_cmds[i].name)) return k_cmds[i].fn(argc - 1, argv + 1);
    /* the RL demo is an example now (examples/rl/demo), not a command */
    if (!strcmp(argv[1], "demo") || !strcmp(argv[1], "island")) {
        fprintf(stderr, "ferry: the demo moved to ferry-demo (examples/rl/demo; `make` builds build/ferry-demo)\n");
        return 2;
    }
    fprintf(stderr, "ferry: unknown command '%s' (try 'ferry --help')\n", argv[1]);
    return 2;
}
