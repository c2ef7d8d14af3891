/*
 * ferry-demo — the decoupled RL run on one machine (docs/DEMO.md): an
 * example built on ferry, kept apart from the ferry CLI.
 *
 *   ferry-demo [options]          the trainer, which starts everything else
 *   ferry-demo island ...         one rollout island (hidden; the trainer
 *                                 runs it)
 *   ferry-demo mirror ...         `ferry mirror`, the --mirror child (hidden)
 *
 * The trainer starts its children from this very binary (/proc/self/exe),
 * so a demo needs nothing installed beside it.
 */
#include <string.h>

#include "cmd_sync.h"
#include "demo.h"
#include "util.h"

int main(int argc, char **argv)
{
    cli_program = "ferry-demo";
    if (argc > 1 && !strcmp(argv[1], "island")) return cmd_island(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "mirror")) {
        cli_program = "ferry"; /* its messages are ferry mirror's */
        return cmd_mirror(argc - 1, argv + 1);
    }
    return cmd_demo(argc, argv);
}
