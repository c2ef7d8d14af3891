/* What ferry shard-pull (cmd_shard.c) and ferry pull of a sharded run
 * (cmd_pull.c) share: an island whose slices live in one .safetensors file
 * with its state beside it (cmd_shard_local.c, docs/SHARDING.md "Islands
 * that follow"). */
#ifndef FERRY_CLI_SHARD_H
#define FERRY_CLI_SHARD_H
#ifndef FERRY_NO_NET
#include "cmd_sync.h"
#include "ferry_shard_state.h"

typedef struct shard_out {
    const char *cmd;              /* "shard-pull" or "pull": messages and output style */
    const char *path;             /* the file; NULL: pull once, write nothing (shard-pull without --out) */
    bool whole;                   /* whole tensors under their names and shapes (ferry pull); else one
                                     2-D tensor per slice named NAME@R0:R1,C0:C1 */
    const ferry_shard_region *rg; /* the regions, n of them */
    size_t n;
    const ferry_shard_tensor *tensors; /* whole: the tensor of each region (its shape) */
    int mode;                     /* FERRY_SYNC_LATEST, _MIN, _EXACT */
    uint64_t version;
    bool follow;
    uint64_t until;               /* --follow: stop once holding this version (0: never) */
    double idle_s, interval_s;    /* --idle-timeout (0: none), --interval */
    const char *const *fallback;  /* URLs of the stores added, for messages */
} shard_out;

/* Pulls (once, or following HEAD) into o->path, starting from the version
 * the file and its state hold; exit status. */
int shard_out_run(const sync_common *c, ferry_shard_subscriber *s, const shard_out *o);
/* PATH.ferry.json is a shard-pull state (ferry pull then goes the sharded way at once). */
bool shard_state_is_ours(const char *path);
/* The errors ferry pull --follow waits out (cmd_pull.c). */
bool pull_transient(int rc);
#endif
#endif
