/* A minimal fork-join helper: runs fn(ctx, job, worker) for every job in
 * [0, njobs) on up to `threads` threads (the caller's included).  Jobs are
 * handed out in index order from an atomic counter, so callers list big
 * jobs first.  The first failing job's status is returned; after a failure
 * no new job starts.  worker is in [0, threads), for per-thread scratch. */
#ifndef FERRY_PARALLEL_H
#define FERRY_PARALLEL_H
#include <stddef.h>

typedef int (*ferry__job_fn)(void *ctx, size_t job, int worker);
int ferry__parallel(int threads, size_t njobs, ferry__job_fn fn, void *ctx);
/* threads option -> a usable count: 0 means 1, capped at 256. */
int ferry__threads(int requested);
#endif
