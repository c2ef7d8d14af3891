/* ferry_apply_stream_*: the in-place apply of a patch that arrives piece
 * by piece (a download), so that decoding overlaps the transfer.
 *
 * The caller's thread copies each piece into one buffer of the size the
 * header declares and feeds the trailer's checksum (and, when asked, the
 * object's SHA-256); as soon as header and table are complete the base is
 * checked and `threads` workers start, each taking the next chunk (or
 * tensor carried whole) of the patch as soon as its last byte arrived,
 * decoding it and writing it into the model with undo, exactly as
 * ferry_apply_inplace's first pass does (decode.c).  At the end the
 * trailer, the digest and every hash are checked as in the buffered apply;
 * any failure, an abort, or a stream that ends early puts every word back.
 * The buffer is kept to the end: a chunk beyond the undo budget is decoded
 * again to be written once everything verified. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#ifndef FERRY_NO_NET
#include <openssl/evp.h>
#endif
#include "decode_impl.h"

#define STREAM_MAX_DEFAULT ((uint64_t)1 << 30)

typedef struct stream_worker {
    struct ferry_apply_stream *st;
    int id;
} stream_worker;

struct ferry_apply_stream {
    ferry_model *m;
    ferry_apply_options ao;
    uint8_t vouched[16];
    bool keep, cached;
    uint64_t max_size;
    /* the bytes */
    uint8_t hdr[PATCH_HEADER_SIZE];
    size_t hdr_have;
    uint8_t *buf;            /* size bytes once the header arrived */
    uint64_t size, have;     /* declared, copied */
    uint32_t zsize;
    uint64_t fed;            /* every byte fed (also those drained after a failure) */
    XXH3_state_t *xx;        /* the trailer's checksum, of bytes [0, size - 16) */
#ifndef FERRY_NO_NET
    EVP_MD_CTX *sha;
#endif
    bool has_sha;
    uint8_t want_sha[32];
    /* the apply */
    dec d;
    bool table;              /* parsed, set up, prepared: workers running */
    ferry__codec_undo *rec;  /* keep mode: the record's arrays */
    int failed;              /* the failure, the model rolled back */
    bool draining;           /* failed on the object's bytes, with a digest to check */
    char msg[1024];          /* the failure's message */
    /* the workers (under mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    stream_worker *wk;
    pthread_t *tid;
    int nthreads;
    uint64_t avail;          /* bytes the workers may read */
    uint64_t need;           /* what a waiting worker needs */
    size_t next_entry, next_chunk;
    bool fed_all, stop;
    int err;                 /* the first worker failure */
};

/* The failure rc (message in this thread) of a chunk or entry job, kept
 * for the caller's thread.  Under mu. */
static void set_err(ferry_apply_stream *st, int rc)
{
    if (st->err) return;
    st->err = rc;
    snprintf(st->msg, sizeof st->msg, "%s", ferry_last_error());
    pthread_cond_broadcast(&st->cv);
}

enum { JOB_NONE, JOB_CHUNK, JOB_WHOLE };

/* The next job whose bytes arrived, waiting for them; JOB_NONE when there
 * is none left, or on a failure.  Under mu. */
static int next_job(ferry_apply_stream *st, size_t *idx)
{
    dec *d = &st->d;
    for (;;) {
        if (st->err || st->stop) return JOB_NONE;
        uint64_t want;
        if (st->next_chunk < d->nch) {
            const chunk_ref *c = &d->ch[st->next_chunk];
            if ((want = c->off + c->len) <= st->avail) {
                *idx = st->next_chunk++;
                return JOB_CHUNK;
            }
        } else if (st->next_entry == d->t.n) {
            return JOB_NONE;
        } else {
            const patch_entry *e = &d->t.e[st->next_entry];
            if (e->kind == PK_SPARSE) {
                if ((want = e->payload_off + 4 * patch_chunks(e)) <= st->avail) {
                    int rc = ferry__codec_dec_index_entry(d, st->next_entry++);
                    if (rc) set_err(st, rc);
                    continue;
                }
            } else if (e->kind == PK_WHOLE) {
                if ((want = e->payload_off + e->payload_size) <= st->avail) {
                    *idx = st->next_entry++;
                    return JOB_WHOLE;
                }
            } else {
                st->next_entry++;
                continue;
            }
        }
        if (st->fed_all) return JOB_NONE; /* no more bytes are coming */
        st->need = want;
        pthread_cond_wait(&st->cv, &st->mu);
    }
}

static void *worker(void *arg)
{
    stream_worker *k = arg;
    ferry_apply_stream *st = k->st;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        size_t j;
        int kind = next_job(st, &j);
        if (kind == JOB_NONE) break;
        pthread_mutex_unlock(&st->mu);
        int rc = kind == JOB_CHUNK ? ferry__codec_dec_chunk_job(&st->d, j, k->id) : ferry__codec_dec_whole_job(&st->d, j, k->id);
        pthread_mutex_lock(&st->mu);
        if (rc) set_err(st, rc);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

/* Ends the workers: at once (stop), or when every job is done (the whole
 * patch arrived). */
static void join_workers(ferry_apply_stream *st, bool stop)
{
    if (!st->nthreads) return;
    pthread_mutex_lock(&st->mu);
    st->fed_all = true;
    if (stop) st->stop = true;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    for (int i = 0; i < st->nthreads; i++) pthread_join(st->tid[i], NULL);
    st->nthreads = 0;
}

/* Failures of the object's bytes (those a digest check may show to be a
 * replaced object), as opposed to those of this process or model. */
static bool object_error(int rc)
{
    return (rc >= FERRY_ERR_PATCH_MAGIC && rc <= FERRY_ERR_PATCH_CHECKSUM) || rc == FERRY_ERR_BASE_MISMATCH ||
           rc == FERRY_ERR_TARGET_MISMATCH || rc == FERRY_ERR_LIMIT;
}

/* Fails the stream with rc (its message set in this thread): the workers
 * stop and the model is put back.  Returns rc. */
static int fail(ferry_apply_stream *st, int rc)
{
    if (st->failed) return rc;
    /* the workers first: one failing now would write msg too (set_err) */
    join_workers(st, true);
    snprintf(st->msg, sizeof st->msg, "%s", ferry_last_error());
    if (st->table) ferry__codec_dec_inplace_finish(&st->d, st->m, rc, NULL, &st->rec);
    ferry__codec_undo_free(st->rec);
    st->rec = NULL;
    st->failed = rc;
    st->draining = st->has_sha && object_error(rc);
    return ferry__fail(rc, "%s", st->msg);
}

static int refail(const ferry_apply_stream *st) { return ferry__fail(st->failed, "%s", st->msg); }

/* fail() from a feed: a stream that drains (a digest to check) takes the
 * rest of the object, so that end() can tell a replaced object (its
 * SHA-256) from a damaged one whichever chunk failed first; the caller
 * sees the failure at end(). */
static int feed_fail(ferry_apply_stream *st, int rc)
{
    rc = fail(st, rc);
    return st->draining ? FERRY_OK : rc;
}

int ferry__codec_apply_stream_begin(ferry_model *model, const ferry_apply_options *opts, const ferry_apply_stream_options *so,
                                    bool keep, ferry_apply_stream **out)
{
    if (!model || !out) return ferry__fail(FERRY_ERR_ARG, "ferry_apply_stream_begin: NULL argument");
    *out = NULL;
#ifdef FERRY_NO_NET
    if (so && so->sha256) return ferry__fail(FERRY_ERR_UNSUPPORTED, "ferry_apply_stream_begin: SHA-256 needs a build with libcrypto");
#endif
    ferry_apply_stream *st = ferry__calloc(1, sizeof *st);
    if (!st) return FERRY_ERR_NOMEM;
    st->m = model;
    if (opts) st->ao = *opts;
    if (opts && opts->base_hash) {
        memcpy(st->vouched, opts->base_hash, 16);
        st->ao.base_hash = st->vouched;
    }
    st->keep = keep;
    st->max_size = so && so->max_size ? so->max_size : STREAM_MAX_DEFAULT;
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    int rc = FERRY_OK;
    if (!(st->xx = XXH3_createState())) rc = FERRY_ERR_NOMEM;
    else XXH3_128bits_reset(st->xx);
#ifndef FERRY_NO_NET
    if (!rc && so && so->sha256) {
        st->has_sha = true;
        memcpy(st->want_sha, so->sha256, 32);
        if (!(st->sha = EVP_MD_CTX_new()) || !EVP_DigestInit_ex(st->sha, EVP_sha256(), NULL))
            rc = ferry__fail(FERRY_ERR_NOMEM, "ferry_apply_stream_begin: SHA-256 context");
    }
#endif
    if (rc) {
        ferry_apply_stream_abort(st);
        return rc;
    }
    *out = st;
    return FERRY_OK;
}

int ferry_apply_stream_begin(ferry_model *model, const ferry_apply_options *opts, const ferry_apply_stream_options *so,
                             ferry_apply_stream **out)
{
    return ferry__codec_apply_stream_begin(model, opts, so, false, out);
}

/* The header is complete: checked, and the buffer allocated. */
static int on_header(ferry_apply_stream *st)
{
    int rc = ferry__codec_patch_header(st->hdr, &st->size, &st->zsize);
    if (rc) return rc;
    if (st->size > st->max_size)
        return ferry__fail(FERRY_ERR_LIMIT, "patch stream: the header declares %llu bytes, over the bound of %llu",
                           (unsigned long long)st->size, (unsigned long long)st->max_size);
    if (st->size > SIZE_MAX || !(st->buf = ferry__malloc((size_t)st->size))) return FERRY_ERR_NOMEM;
    memcpy(st->buf, st->hdr, PATCH_HEADER_SIZE);
    st->have = PATCH_HEADER_SIZE;
    XXH3_128bits_update(st->xx, st->hdr, PATCH_HEADER_SIZE);
    return FERRY_OK;
}

/* Header and table are complete: the base is checked, the undo log made
 * ready and the workers started. */
static int on_table(ferry_apply_stream *st)
{
    dec *d = &st->d;
    memset(d, 0, sizeof *d);
    d->patch = st->buf;
    st->cached = ferry__codec_dec_cached(st->m, &st->ao);
    int rc = ferry__codec_patch_table_parse_at(st->buf, st->size, &d->t);
    if (!rc) rc = ferry__codec_dec_setup(d, st->m, &st->ao);
    if (!rc) rc = ferry__codec_dec_inplace_prepare(d, st->m, &st->ao, st->size, st->cached, st->keep ? &st->rec : NULL);
    if (rc) return rc;
    st->table = true;
    st->avail = st->have;
    if (!(st->tid = ferry__calloc((size_t)d->threads, sizeof *st->tid)) ||
        !(st->wk = ferry__calloc((size_t)d->threads, sizeof *st->wk)))
        return FERRY_ERR_NOMEM;
    for (int i = 0; i < d->threads; i++) {
        st->wk[i] = (stream_worker){st, i};
        if (pthread_create(&st->tid[i], NULL, worker, &st->wk[i])) {
            if (!i) return ferry__fail(FERRY_ERR_NOMEM, "patch stream: cannot start a worker thread");
            break; /* fewer workers: slower, the same result */
        }
        st->nthreads = i + 1;
    }
    return FERRY_OK;
}

static void sha_update(ferry_apply_stream *st, const void *p, size_t n)
{
#ifndef FERRY_NO_NET
    if (st->has_sha && n) EVP_DigestUpdate(st->sha, p, n);
#else
    (void)st, (void)p, (void)n;
#endif
}

int ferry_apply_stream_feed(ferry_apply_stream *st, const void *bytes, size_t n)
{
    if (!st || (!bytes && n)) return ferry__fail(FERRY_ERR_ARG, "ferry_apply_stream_feed: NULL argument");
    if (st->failed && !st->draining) return refail(st);
    if (n > UINT64_MAX - st->fed) return ferry__fail(FERRY_ERR_LIMIT, "ferry_apply_stream_feed: too many bytes");
    sha_update(st, bytes, n);
    st->fed += n;
    if (st->failed) return FERRY_OK; /* draining: only the digest, for end */
    const uint8_t *p = bytes;
    int rc = FERRY_OK;
    if (st->hdr_have < PATCH_HEADER_SIZE && n) {
        size_t take = PATCH_HEADER_SIZE - st->hdr_have < n ? PATCH_HEADER_SIZE - st->hdr_have : n;
        memcpy(st->hdr + st->hdr_have, p, take);
        st->hdr_have += take;
        p += take;
        n -= take;
        if (st->hdr_have == PATCH_HEADER_SIZE && (rc = on_header(st))) return feed_fail(st, rc);
    }
    if (n) {
        if (n > st->size - st->have)
            return feed_fail(st, ferry__fail(FERRY_ERR_PATCH_CORRUPT, "patch stream: more than the %llu bytes its header declares",
                                        (unsigned long long)st->size));
        memcpy(st->buf + st->have, p, n);
        uint64_t body_end = st->size - PATCH_TRAILER_SIZE;
        if (st->have < body_end) XXH3_128bits_update(st->xx, p, (size_t)(body_end - st->have < n ? body_end - st->have : n));
        st->have += n;
    }
    if (!st->table && st->hdr_have == PATCH_HEADER_SIZE && st->have >= PATCH_HEADER_SIZE + (uint64_t)st->zsize &&
        (rc = on_table(st)))
        return feed_fail(st, rc);
    if (!st->table) return FERRY_OK;
    pthread_mutex_lock(&st->mu);
    st->avail = st->have;
    if (st->avail >= st->need) pthread_cond_broadcast(&st->cv);
    rc = st->err;
    pthread_mutex_unlock(&st->mu);
    if (rc) return feed_fail(st, ferry__fail(rc, "%s", st->msg));
    return FERRY_OK;
}

int ferry_apply_stream_hashes(const ferry_apply_stream *st, uint8_t base[16], uint8_t target[16])
{
    if (!st || st->hdr_have < PATCH_HEADER_SIZE || memcmp(st->hdr, PATCH_MAGIC, 8)) return FERRY_ERR_PATCH_TRUNCATED;
    if (base) memcpy(base, st->hdr + 16, 16);
    if (target) memcpy(target, st->hdr + 32, 16);
    return FERRY_OK;
}

static void stream_free(ferry_apply_stream *st)
{
    ferry__codec_dec_end(&st->d);
    ferry__codec_undo_free(st->rec);
    free(st->buf);
    free(st->tid);
    free(st->wk);
    if (st->xx) XXH3_freeState(st->xx);
#ifndef FERRY_NO_NET
    EVP_MD_CTX_free(st->sha);
#endif
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
    free(st);
}

/* Whether the bytes fed have the SHA-256 asked for (true without one). */
static bool sha_ok(ferry_apply_stream *st)
{
#ifndef FERRY_NO_NET
    if (!st->has_sha) return true;
    uint8_t d[32];
    unsigned len = 0;
    return EVP_DigestFinal_ex(st->sha, d, &len) && len == 32 && !memcmp(d, st->want_sha, 32);
#else
    (void)st;
    return true;
#endif
}

int ferry__codec_apply_stream_end(ferry_apply_stream *st, ferry__codec_undo **record)
{
    if (record) *record = NULL;
    if (!st) return ferry__fail(FERRY_ERR_ARG, "ferry_apply_stream_end: NULL stream");
    int rc = FERRY_OK;
    bool complete = st->buf && st->have == st->size;
    if (!st->failed && !complete) {
        rc = fail(st, ferry__fail(FERRY_ERR_PATCH_TRUNCATED, "patch stream ended after %llu of %llu bytes",
                                  (unsigned long long)st->fed, (unsigned long long)(st->buf ? st->size : PATCH_HEADER_SIZE)));
    } else if (!st->failed) {
        /* every byte is here: the workers finish what is left */
        join_workers(st, false);
        if ((rc = st->err)) rc = ferry__fail(rc, "%s", st->msg);
        else if (st->next_entry != st->d.t.n || st->next_chunk != st->d.nch)
            rc = ferry__fail(FERRY_ERR_INTERNAL, "patch stream: entry %zu of %zu, chunk %zu of %zu left", st->next_entry,
                             st->d.t.n, st->next_chunk, st->d.nch);
        if (rc) fail(st, rc);
    }
    if (!sha_ok(st) && (!st->failed || st->draining)) {
        /* a replaced object, whatever else it caused (the model is put back) */
        const char *then = st->failed ? st->msg : "";
        if (!st->failed) fail(st, FERRY_ERR_SIG_DIGEST);
        rc = ferry__fail(FERRY_ERR_SIG_DIGEST, "patch stream: its SHA-256 is not the one expected (replaced)%s%s", then[0] ? "; " : "",
                         then);
    } else if (st->failed) {
        rc = refail(st);
    } else {
        XXH128_canonical_t want;
        XXH128_canonicalFromHash(&want, XXH3_128bits_digest(st->xx));
        if (memcmp(&want, st->buf + st->size - PATCH_TRAILER_SIZE, 16))
            rc = fail(st, ferry__fail(FERRY_ERR_PATCH_CHECKSUM, "patch checksum (XXH3-128 trailer) does not match its bytes"));
        else
            rc = ferry__codec_dec_inplace_finish(&st->d, st->m, FERRY_OK, st->keep ? record : NULL, &st->rec);
    }
    stream_free(st);
    return rc;
}

int ferry_apply_stream_end(ferry_apply_stream *st)
{
    ferry__codec_undo *rec = NULL;
    int rc = ferry__codec_apply_stream_end(st, &rec);
    ferry__codec_undo_free(rec);
    return rc;
}

void ferry_apply_stream_abort(ferry_apply_stream *st)
{
    if (!st) return;
    if (!st->failed) {
        join_workers(st, true);
        if (st->table) ferry__codec_dec_inplace_finish(&st->d, st->m, FERRY_ERR_STORE_CANCELED, NULL, &st->rec);
    }
    stream_free(st);
}
