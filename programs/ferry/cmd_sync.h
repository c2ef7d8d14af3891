/* The versioned-distribution commands (publish, pull, log, gc, compact) and
 * what they share: STORE and --run, the store's options, progress, exit
 * statuses.  A core-only build (NO_NET=1) keeps the commands, which then
 * say the layer is not built. */
#ifndef FERRY_CLI_SYNC_H
#define FERRY_CLI_SYNC_H
#include <stdbool.h>
#include <stdint.h>

int cmd_publish(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_log(int argc, char **argv);
int cmd_gc(int argc, char **argv);
int cmd_compact(int argc, char **argv);
int cmd_keygen(int argc, char **argv); /* cmd_keygen.c */
int cmd_mirror(int argc, char **argv);  /* cmd_mirror.c (not in NO_NET builds) */
int cmd_head_repair(int argc, char **argv); /* cmd_head_repair.c (not in NO_NET builds) */

#ifndef FERRY_NO_NET
#include "ferry_sync.h"

/* Exit statuses of the sync commands (besides 0 and 2 = usage). */
enum {
    SYNC_EXIT_FAIL = 1,     /* any other failure */
    SYNC_EXIT_CONFLICT = 3, /* another publisher, HEAD moved backwards */
    SYNC_EXIT_NOT_YET = 4,  /* version not there (yet, or any more); follow timed out */
    SYNC_EXIT_STORE = 5,    /* the store did not answer in time (deadline), network */
    SYNC_EXIT_CORRUPT = 6,  /* objects or manifests failed verification */
    SYNC_EXIT_SIGNATURE = 7,/* a record unsigned, wrongly signed, or a key file unusable */
};

#define SYNC_MAX_TRUST 64     /* --trust-key given at most this many times */

typedef struct sync_common {
    const char *store_url, *run;
    ferry_store_options so;
    bool json, quiet;
    int progress;          /* -1 auto (a bar when stderr is a terminal), 0 off, 1 lines */
    const char *sign_key;  /* --sign-key PATH */
    const char *run_id;    /* --run-id ID (checked by the library) */
    const char *trust[SYNC_MAX_TRUST]; /* --trust-key PATH ... */
    int ntrust;
    const ferry_keys *keys;/* built by sync_open_store when either is given */
} sync_common;

/* The options every sync command takes; sets defaults first. */
void sync_common_init(sync_common *c);
/* Consumes a common option at argv[*i] (advancing *i past its value):
 * 1 if it was one, 0 if not, 2 after printing a usage error. */
int sync_common_opt(const char *cmd, int argc, char **argv, int *i, sync_common *c);
/* Takes a positional argument as STORE if none yet: true if taken. */
bool sync_common_pos(sync_common *c, const char *arg);
/* Checks that STORE and --run were given: 0, or 2 after a usage error. */
int sync_common_check(const char *cmd, const sync_common *c);
/* Loads the keys given (c->keys, freed at exit), then opens the store
 * with the options and the progress display; exit status (0 = ok). */
int sync_open_store(const char *cmd, sync_common *c, int create, ferry_store **out);
/* As sync_open_store (never creating), waiting while the store does not
 * exist yet (an island started before its trainer: --follow), polling
 * every interval_s, for at most idle_s seconds when idle_s > 0 (then
 * SYNC_EXIT_NOT_YET). */
int sync_open_store_wait(const char *cmd, sync_common *c, double interval_s, double idle_s, ferry_store **out);
/* Prints "ferry CMD: what: message" on one line and returns the exit status. */
int sync_fail(const char *cmd, int rc, const char *what);
/* Parses a version or count (decimal, 0..2^63-1). */
bool sync_parse_u64(const char *s, uint64_t *out);
/* Ends a progress bar line, if one is drawn. */
void sync_progress_end(void);
/* The text of the common options, for --help. */
extern const char sync_common_help[];
#endif
#endif
