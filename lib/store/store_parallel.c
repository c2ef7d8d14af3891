/* Downloads that fill long links: one object fetched as parallel ranged
 * GETs into a local file, resumable across processes (docs/STORE.md,
 * "Parallel and resumable downloads").
 *
 * Why: one TCP stream over a link with tens of ms of round trip and some
 * loss stays far below the link's bandwidth; several streams fill it.  And
 * a large anchor cut at 90% by a restart should not start over.
 *
 * The object is cut into chunks.  Workers take the next chunk that is not
 * done, read it with a ranged GET (each request retried within the
 * store's deadline) and pwrite it at its offset into PATH.part.  A state
 * file PATH.part.state records the object's size and etag and which chunks
 * are done; a later call for the same object (same size and etag) skips
 * them.  At the end the object's etag is read again: if it changed during
 * the transfer the parts may mix two versions, so everything is discarded
 * and the call fails (FERRY_ERR_STORE_CONFLICT).  Then fsync, rename to
 * PATH, fsync of the directory: as ferry_store_get_file, nothing is ever
 * left at PATH but a complete object. */
#include "store_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define PAR_DEFAULT_CHUNK (8ull << 20)
#define PAR_MAX_THREADS 64
#define PAR_MAX_CHUNKS (1u << 20)

typedef struct par {
    ferry_store *s;
    const char *key;
    int fd;
    uint64_t size, chunk;
    uint32_t nchunks;
    char *done;              /* '0' / '1' per chunk */
    const char *state_path;
    char etag[FERRY_STORE_ETAG_MAX];
    pthread_mutex_t mu;
    uint32_t next;
    int rc;                  /* first failure */
    char msg[600];
    ferry__group group;      /* progress summed over the chunks; stop on the first failure */
} par;

/* "ferry-part-1 SIZE CHUNK ETAG\n" then one '0'/'1' per chunk. */
static void state_save(par *p)
{
    char head[256];
    int n = snprintf(head, sizeof head, "ferry-part-1 %llu %llu %s\n", (unsigned long long)p->size,
                     (unsigned long long)p->chunk, p->etag);
    const void *parts[2] = {head, p->done};
    size_t sizes[2] = {(size_t)n, p->nchunks};
    if (ferry__write_file_atomic(p->state_path, parts, sizes, 2)) ferry__clear_error(); /* only costs the resume */
}

/* Marks the chunks a previous call finished for this very object. */
static void state_load(par *p)
{
    uint8_t *d = NULL;
    size_t n = 0;
    if (ferry__read_file(p->state_path, 4096 + (size_t)p->nchunks, &d, &n)) {
        ferry__clear_error();
        return;
    }
    char want[256];
    int w = snprintf(want, sizeof want, "ferry-part-1 %llu %llu %s\n", (unsigned long long)p->size,
                     (unsigned long long)p->chunk, p->etag);
    if (p->etag[0] && n == (size_t)w + p->nchunks && !memcmp(d, want, (size_t)w))
        for (uint32_t i = 0; i < p->nchunks; i++) p->done[i] = d[w + i] == '1' ? '1' : '0';
    free(d);
}

/* A process killed while it saved the state leaves STATE.tmp.PID behind
 * (ferry__write_file_atomic's staging file): removed once done. */
static void remove_stale(const char *state)
{
    char pat[4200];
    glob_t g;
    snprintf(pat, sizeof pat, "%s.tmp.*", state);
    if (glob(pat, GLOB_NOSORT, NULL, &g)) return;
    for (size_t i = 0; i < g.gl_pathc; i++) unlink(g.gl_pathv[i]);
    globfree(&g);
}

static void fail_once(par *p, int rc)
{
    pthread_mutex_lock(&p->mu);
    if (!p->rc) {
        p->rc = rc;
        snprintf(p->msg, sizeof p->msg, "%s", ferry_last_error());
        atomic_store(&p->group.stop, 1); /* the chunks in flight end now */
    }
    pthread_mutex_unlock(&p->mu);
}

static void *worker(void *arg)
{
    par *p = arg;
    uint8_t *buf = malloc((size_t)p->chunk);
    if (!buf) {
        fail_once(p, ferry__fail(FERRY_ERR_NOMEM, "%s: no memory for a %llu-byte chunk", p->key, (unsigned long long)p->chunk));
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->next < p->nchunks && p->done[p->next] == '1') p->next++;
        uint32_t c = p->next < p->nchunks && !p->rc ? p->next++ : UINT32_MAX;
        pthread_mutex_unlock(&p->mu);
        if (c == UINT32_MAX) break;
        uint64_t off = (uint64_t)c * p->chunk;
        size_t len = (size_t)(p->size - off < p->chunk ? p->size - off : p->chunk), got = 0;
        int rc = ferry__get_range_group(p->s, p->key, off, len, buf, &got, &p->group);
        if (!rc && got != len)
            rc = ferry__fail(FERRY_ERR_STORE_CORRUPT, "%s: chunk at %llu: %zu bytes, want %zu (the object shrank?)", p->key,
                             (unsigned long long)off, got, len);
        for (size_t w = 0; !rc && w < len;) {
            ssize_t k = pwrite(p->fd, buf + w, len - w, (off_t)(off + w));
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) rc = ferry__fail(FERRY_ERR_IO, "%s: write: %s", p->state_path, strerror(errno));
            else w += (size_t)k;
        }
        if (rc) {
            fail_once(p, rc);
            break;
        }
        pthread_mutex_lock(&p->mu);
        p->done[c] = '1';
        state_save(p);
        pthread_mutex_unlock(&p->mu);
    }
    free(buf);
    return NULL;
}

static int run_workers(par *p, unsigned threads)
{
    pthread_t t[PAR_MAX_THREADS];
    unsigned started = 0;
    for (; started < threads; started++)
        if (pthread_create(&t[started], NULL, worker, p)) break;
    if (!started) worker(p);
    for (unsigned i = 0; i < started; i++) pthread_join(t[i], NULL);
    if (p->rc) return ferry__fail(p->rc, "%s", p->msg);
    return FERRY_OK;
}

/* Opens PATH.part for writing, locked (flock, released by the kernel when
 * the process dies): a second download into the same PATH (two processes
 * resuming the same object) must not truncate or mix this one's file.
 * O_NOFOLLOW: a link planted at PATH.part must not redirect the write.  The
 * lock is taken on the file still named PATH.part (not one that another
 * download finished and renamed while we waited). */
static int open_locked(const char *part, int *fd)
{
    int rc = ferry__output_check(part); /* a device or FIFO there is never opened */
    if (rc) {
        *fd = -1;
        return rc;
    }
    *fd = open(part, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (*fd < 0) return ferry__fail(FERRY_ERR_IO, "%s: cannot open: %s", part, strerror(errno));
    struct stat a, b;
    if (flock(*fd, LOCK_EX | LOCK_NB))
        rc = errno == EWOULDBLOCK ? ferry__fail(FERRY_ERR_STORE_CONFLICT, "%s: another download into this file is in progress", part)
                                  : ferry__fail(FERRY_ERR_IO, "%s: flock: %s", part, strerror(errno));
    else if (fstat(*fd, &a) || lstat(part, &b) || a.st_ino != b.st_ino || a.st_dev != b.st_dev)
        rc = ferry__fail(FERRY_ERR_STORE_CONFLICT, "%s: another download replaced this file meanwhile", part);
    if (rc) {
        close(*fd);
        *fd = -1;
    }
    return rc;
}

int ferry_store_get_file_parallel(ferry_store *s, const char *key, const char *path,
                                  const ferry_store_transfer_options *opts, ferry_store_stat *st)
{
    if (!s || !key || !path) return ferry__fail(FERRY_ERR_ARG, "ferry_store_get_file_parallel: NULL argument");
    ferry_store_transfer_options o = opts ? *opts : (ferry_store_transfer_options){0};
    uint64_t chunk = o.chunk_size ? o.chunk_size : PAR_DEFAULT_CHUNK;
    unsigned threads = o.concurrency ? o.concurrency : 4;
    if (threads > PAR_MAX_THREADS) threads = PAR_MAX_THREADS;
    if (chunk < 4096 || chunk > ((uint64_t)1 << 30))
        return ferry__fail(FERRY_ERR_ARG, "ferry_store_get_file_parallel: chunk_size %llu is outside 4 KiB..1 GiB",
                           (unsigned long long)chunk);
    ferry_store_stat first;
    int rc = ferry__output_check(path); /* a device at PATH: refused before any download */
    if (!rc) rc = ferry_store_head(s, key, &first);
    if (rc) return rc;
    /* small objects, one stream asked for without resume, or an object
       without an etag (nothing would prove that the chunks are of one
       object): the plain download */
    if (o.max_size && first.size > o.max_size)
        return ferry__fail(FERRY_ERR_LIMIT, "%s: object of %llu bytes exceeds the limit of %llu", key,
                           (unsigned long long)first.size, (unsigned long long)o.max_size);
    if (first.size <= chunk || (threads == 1 && !o.resume) || !first.etag[0])
        return ferry_store_get_file_max(s, key, path, o.max_size, st);
    uint64_t nch = (first.size + chunk - 1) / chunk;
    if (nch > PAR_MAX_CHUNKS)
        return ferry__fail(FERRY_ERR_LIMIT, "%s: %llu bytes in chunks of %llu is more than %u chunks", key,
                           (unsigned long long)first.size, (unsigned long long)chunk, PAR_MAX_CHUNKS);
    size_t plen = strlen(path);
    char *part = malloc(plen + 16), *state = malloc(plen + 16);
    par p = {.s = s, .key = key, .fd = -1, .size = first.size, .chunk = chunk, .nchunks = (uint32_t)nch};
    p.done = malloc((size_t)nch);
    if (!part || !state || !p.done) {
        free(part), free(state), free(p.done);
        return ferry__fail(FERRY_ERR_NOMEM, "%s: no memory", key);
    }
    snprintf(part, plen + 16, "%s.part", path);
    snprintf(state, plen + 16, "%s.part.state", path);
    p.state_path = state;
    memcpy(p.etag, first.etag, sizeof p.etag);
    memset(p.done, '0', (size_t)nch);
    pthread_mutex_init(&p.mu, NULL);
    pthread_mutex_init(&p.group.mu, NULL);
    atomic_init(&p.group.stop, 0);
    p.group.total = first.size;
    bool locked = false;
    rc = open_locked(part, &p.fd);
    if (!rc) {
        locked = true;
        if (o.resume) state_load(&p);
        for (uint32_t i = 0; i < p.nchunks; i++) /* progress starts at what is already there */
            if (p.done[i] == '1') p.group.done += i + 1 < p.nchunks ? chunk : first.size - (uint64_t)i * chunk;
        /* without a prior state the part file starts empty: no stale bytes */
        bool resumed = p.group.done != 0;
        if ((!resumed && ftruncate(p.fd, 0)) || ftruncate(p.fd, (off_t)first.size))
            rc = ferry__fail(FERRY_ERR_IO, "%s: truncate: %s", part, strerror(errno));
    }
    if (!rc && o.resume) state_save(&p);
    if (!rc) rc = run_workers(&p, threads);
    ferry_store_stat last;
    if (!rc && !(rc = ferry_store_head(s, key, &last)) && (last.size != first.size || strcmp(last.etag, first.etag))) {
        rc = ferry__fail(FERRY_ERR_STORE_CONFLICT, "%s: the object changed during the download (etag %s -> %s): discarded", key,
                         first.etag, last.etag);
        memset(p.done, '0', (size_t)nch);
        unlink(state);
        unlink(part);
    }
    if (!rc && fsync(p.fd)) rc = ferry__fail(FERRY_ERR_IO, "%s: fsync: %s", part, strerror(errno));
    /* renamed while still locked: no other process can take the lock on
     * this file and then find it at PATH */
    if (!rc) rc = ferry__rename_output(part, path);
    if (!rc) {
        unlink(state);
        remove_stale(state);
        ferry__fsync_dir_of(path);
        if (st) *st = first;
    } else if (!o.resume && locked) {
        unlink(part);
        unlink(state);
    }
    if (p.fd >= 0) close(p.fd);
    pthread_mutex_destroy(&p.mu);
    pthread_mutex_destroy(&p.group.mu);
    free(p.done);
    free(part);
    free(state);
    return rc;
}
