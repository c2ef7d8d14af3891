#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "parallel.h"

typedef struct pool {
    ferry__job_fn fn;
    void *ctx;
    size_t njobs;
    atomic_size_t next;
    atomic_int rc;
    char msg[1024]; /* the failing job's ferry_last_error(), carried to the caller's thread */
    pthread_mutex_t lock;
} pool;

typedef struct worker_arg {
    pool *p;
    int id;
} worker_arg;

static void *run(void *arg)
{
    worker_arg *w = arg;
    pool *p = w->p;
    for (;;) {
        if (atomic_load(&p->rc)) break;
        size_t j = atomic_fetch_add(&p->next, 1);
        if (j >= p->njobs) break;
        int rc = p->fn(p->ctx, j, w->id);
        if (rc) {
            int zero = 0;
            if (atomic_compare_exchange_strong(&p->rc, &zero, rc)) {
                pthread_mutex_lock(&p->lock);
                snprintf(p->msg, sizeof p->msg, "%s", ferry_last_error());
                pthread_mutex_unlock(&p->lock);
            }
            break;
        }
    }
    return NULL;
}

int ferry__threads(int requested) { return requested <= 1 ? 1 : requested > 256 ? 256 : requested; }

int ferry__parallel(int threads, size_t njobs, ferry__job_fn fn, void *ctx)
{
    threads = ferry__threads(threads);
    if ((size_t)threads > njobs) threads = njobs ? (int)njobs : 1;
    if (threads == 1) {
        for (size_t j = 0; j < njobs; j++) {
            int rc = fn(ctx, j, 0);
            if (rc) return rc;
        }
        return FERRY_OK;
    }
    pool p = {.fn = fn, .ctx = ctx, .njobs = njobs};
    atomic_init(&p.next, 0);
    atomic_init(&p.rc, 0);
    pthread_mutex_init(&p.lock, NULL);
    pthread_t tid[256];
    worker_arg args[256];
    int started = 0;
    for (int i = 1; i < threads; i++) {
        args[i] = (worker_arg){&p, i};
        if (pthread_create(&tid[i], NULL, run, &args[i])) break;
        started = i;
    }
    args[0] = (worker_arg){&p, 0};
    run(&args[0]);
    for (int i = 1; i <= started; i++) pthread_join(tid[i], NULL);
    pthread_mutex_destroy(&p.lock);
    int rc = atomic_load(&p.rc);
    if (rc) ferry__fail(rc, "%s", p.msg);
    return rc;
}
