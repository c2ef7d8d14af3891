/* Whole-file helpers: atomic write (aside, fsync, rename) and bounded read. */

#include "common.h"

#include <errno.h>
#include <fcntl.h>
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

int ferry__fsync_dir_of(const char *path)
{
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) return ferry__fail(FERRY_ERR_ARG, "%s: path too long", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ferry__fail(FERRY_ERR_IO, "%s: cannot open its directory %s: %s", path, dir, strerror(errno));
    /* EINVAL: a file system that cannot sync directories (nothing to wait for) */
    int rc = fsync(fd) && errno != EINVAL ? ferry__fail(FERRY_ERR_IO, "%s: fsync of its directory %s: %s", path, dir, strerror(errno))
                                          : FERRY_OK;
    close(fd);
    return rc;
}

/* Random bits for temporary names (not secret: O_EXCL is what guards). */
static uint64_t tmp_suffix(void)
{
    uint64_t r;
    ferry__random_bytes(&r, sizeof r);
    return r;
}

int ferry__tmp_create(const char *path, int rw, char *tmp, size_t cap)
{
    for (int attempt = 0; attempt < 16; attempt++) {
        if (snprintf(tmp, cap, "%s.tmp.%ld.%016llx", path, (long)getpid(), (unsigned long long)tmp_suffix()) >= (int)cap)
            return ferry__fail(FERRY_ERR_ARG, "%s: path too long", path);
        int fd = open(tmp, (rw ? O_RDWR : O_WRONLY) | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0) return fd;
        if (errno != EEXIST) return -ferry__fail(FERRY_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    return -ferry__fail(FERRY_ERR_IO, "%s: 16 temporary names beside it were all taken", path);
}

int ferry__tmp_commit(int fd, const char *tmp, const char *path, int rc)
{
    if (!rc && fsync(fd)) rc = ferry__fail(FERRY_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
    if (close(fd) && !rc) rc = ferry__fail(FERRY_ERR_IO, "%s: close: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path)) rc = ferry__fail(FERRY_ERR_IO, "%s: cannot rename into place: %s", path, strerror(errno));
    if (rc) {
        unlink(tmp);
        return rc;
    }
    return ferry__fsync_dir_of(path);
}

int ferry__write_file_atomic(const char *path, const void *const *parts, const size_t *sizes, size_t nparts)
{
    char tmp[4200];
    int fd = ferry__tmp_create(path, 0, tmp, sizeof tmp);
    if (fd < 0) return -fd;
    int rc = FERRY_OK;
    for (size_t i = 0; !rc && i < nparts; i++)
        if (write_all(fd, parts[i], sizes[i])) rc = ferry__fail(FERRY_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno));
    return ferry__tmp_commit(fd, tmp, path, rc);
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
