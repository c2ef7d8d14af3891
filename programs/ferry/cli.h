/* Subcommands of the ferry CLI: each takes (argc, argv) with argv[0] the
 * command name and returns the process exit status. */
#ifndef FERRY_CLI_H
#define FERRY_CLI_H
#include "ferry.h"
int cmd_diff(int argc, char **argv);
int cmd_apply(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_stats(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
#endif
