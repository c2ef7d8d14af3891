/* Whole-file helpers: atomic write (aside, fsync, rename) and bounded read. */

#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

void ferry__fsync_dir_of(const char *path)
{
    char *copy = strdup(path);
    if (!copy) return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(copy);
}

int ferry__write_file_atomic(const char *path, const void *const *parts, const size_t *sizes, size_t nparts)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return ferry__fail(FERRY_ERR_ARG, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ferry__fail(FERRY_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    for (size_t i = 0; i < nparts; i++)
        if (write_all(fd, parts[i], sizes[i])) goto fail;
    if (fsync(fd)) goto fail;
    if (close(fd)) { fd = -1; goto fail; }
    fd = -1;
    if (rename(tmp, path)) goto fail;
    ferry__fsync_dir_of(path);
    return FERRY_OK;
fail:;
    int e = errno;
    if (fd >= 0) close(fd);
    unlink(tmp);
    return ferry__fail(FERRY_ERR_IO, "%s: cannot write: %s", path, strerror(e));
}

int ferry__read_file(const char *path, size_t max, uint8_t **data, size_t *size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ferry__fail(errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO,
                                   "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return ferry__fail(FERRY_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return ferry__fail(FERRY_ERR_LIMIT, "%s: %lld bytes exceeds the limit of %zu", path, (long long)st.st_size, max);
    }
    size_t n = (size_t)st.st_size, got = 0;
    uint8_t *b = ferry__malloc(n + 1);
    if (!b) { close(fd); return FERRY_ERR_NOMEM; }
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            free(b);
            close(fd);
            return ferry__fail(FERRY_ERR_IO, "%s: read failed: %s", path, r ? strerror(e) : "file shrank");
        }
        got += (size_t)r;
    }
    close(fd);
    b[n] = 0;
    *data = b;
    *size = n;
    return FERRY_OK;
}

int ferry_file_write(const char *path, const void *data, size_t size)
{
    if (!path || (size && !data)) return ferry__fail(FERRY_ERR_ARG, "ferry_file_write: NULL argument");
    const void *parts[1] = {data};
    return ferry__write_file_atomic(path, parts, &size, 1);
}

int ferry_file_read(const char *path, size_t max, void **data, size_t *size)
{
    if (!path || !data || !size) return ferry__fail(FERRY_ERR_ARG, "ferry_file_read: NULL argument");
    uint8_t *d;
    int rc = ferry__read_file(path, max, &d, size);
    if (!rc) *data = d;
    return rc;
}
