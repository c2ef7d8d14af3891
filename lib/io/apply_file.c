/* ferry_apply_file: a verified apply streamed into a .safetensors file.
 * The layout (header, tensor offsets) is known from the patch before any
 * data exists, so workers write their pieces in place with pwrite; the file
 * becomes visible at its path only after the codec verified everything. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "codec/apply_sink.h"
#include "io.h"

typedef struct file_sink {
    int fd;
    const char *path;
    uint64_t *off;      /* absolute file offset of each result tensor's data */
    uint8_t **buf;      /* per worker, one piece */
    int threads;
} file_sink;

static int fs_begin(void *ctx, const ferry_model *layout, int threads)
{
    file_sink *f = ctx;
    char *hdr = NULL;
    size_t hlen;
    int rc = ferry__st_header(layout, &hdr, &hlen);
    if (rc) return rc;
    size_t n = ferry_model_count(layout);
    f->off = ferry__malloc((n + 1) * sizeof *f->off);
    f->buf = ferry__calloc((size_t)threads, sizeof *f->buf);
    f->threads = threads;
    if (!f->off || !f->buf) rc = FERRY_ERR_NOMEM;
    for (int w = 0; !rc && w < threads; w++)
        if (!(f->buf[w] = ferry__malloc(FERRY_HASH_BLOCK))) rc = FERRY_ERR_NOMEM;
    uint64_t at = 8 + hlen;
    for (size_t i = 0; !rc && i < n; i++) {
        f->off[i] = at;
        at += ferry_model_tensor(layout, i)->nbytes;
    }
    if (!rc) f->off[n] = at; /* the end of the last tensor */
    uint8_t len[8];
    ferry__put64(len, hlen);
    if (!rc && (pwrite(f->fd, len, 8, 0) != 8 || pwrite(f->fd, hdr, hlen, 8) != (ssize_t)hlen || ftruncate(f->fd, (off_t)at)))
        rc = ferry__fail(FERRY_ERR_IO, "%s: cannot write: %s", f->path, strerror(errno));
    free(hdr);
    return rc;
}

static uint8_t *fs_piece(void *ctx, size_t i, uint64_t off, size_t len, int w)
{
    (void)i, (void)off, (void)len;
    return ((file_sink *)ctx)->buf[w];
}

/* Writeback is started on each finished window of a tensor, so that the
 * disk works while the codec decodes and the final fsync finds little
 * left (before, the whole result was still dirty at the fsync). */
#define WB_WINDOW ((uint64_t)8 << 20)

static int fs_done(void *ctx, size_t i, uint64_t off, size_t len, int w)
{
    file_sink *f = ctx;
    const uint8_t *p = f->buf[w];
    uint64_t at = f->off[i] + off, end = off + len, tensor = f->off[i + 1] - f->off[i];
    while (len) {
        ssize_t n = pwrite(f->fd, p, len, (off_t)at);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return ferry__fail(FERRY_ERR_IO, "%s: cannot write: %s", f->path, n ? strerror(errno) : "no progress");
        p += n;
        at += (uint64_t)n;
        len -= (size_t)n;
    }
#ifdef SYNC_FILE_RANGE_WRITE
    if (end % WB_WINDOW == 0 || end == tensor) { /* advisory: the fsync at the end is what makes it durable */
        uint64_t from = end - ((end - 1) % WB_WINDOW + 1);
        (void)sync_file_range(f->fd, (off_t)(f->off[i] + from), (off_t)(end - from), SYNC_FILE_RANGE_WRITE);
    }
#else
    (void)end, (void)tensor;
#endif
    return FERRY_OK;
}

int ferry_apply_file(const ferry_model *base, const void *patch, size_t size, const ferry_apply_options *opts,
                     const char *path)
{
    if (!base || !patch || !path) return ferry__fail(FERRY_ERR_ARG, "ferry_apply_file: NULL argument");
    char tmp[4200];
    file_sink f = {.path = tmp};
    f.fd = ferry__tmp_create(path, 1, tmp, sizeof tmp);
    if (f.fd < 0) return -f.fd;
    ferry__sink sk = {&f, fs_begin, fs_piece, fs_done};
    int rc = ferry__apply_to(base, patch, size, opts, &sk);
    for (int w = 0; f.buf && w < f.threads; w++) free(f.buf[w]);
    free(f.buf);
    free(f.off);
    return ferry__tmp_commit(f.fd, tmp, path, rc);
}
