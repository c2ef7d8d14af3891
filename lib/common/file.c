/* Whole-file helpers: atomic write (aside, fsync, rename) and bounded read.
 *
 * Special files (docs/SECURITY.md, "Special files"): an output PATH that
 * exists and is not a regular file (a device such as /dev/null, a FIFO, a
 * socket, a directory, or a symbolic link) is refused before anything is
 * written beside it, and checked again right before the rename: renaming a
 * new file over /dev/null as root replaced the device node.  An input that
 * is not a regular file is refused without blocking: a FIFO is never
 * opened, and every input is opened with O_NONBLOCK so one swapped in
 * between the check and the open cannot hang it either. */

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

const char *ferry__file_kind(unsigned mode)
{
    switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
    default: return "not a regular file";
    }
}

int ferry__output_check(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb)) {
        if (errno == ENOENT) return FERRY_OK;
        return ferry__fail(FERRY_ERR_IO, "%s: cannot stat the output: %s", path, strerror(errno));
    }
    if (S_ISREG(sb.st_mode)) return FERRY_OK;
    /* A link is refused too: the rename would replace the link, not write
     * its target, which is rarely what was meant (give the target). */
    return ferry__fail(FERRY_ERR_IO,
                       "%s: the output exists and is %s, not a regular file: refused (ferry replaces an output by "
                       "renaming a new file over it, which must never replace a device, FIFO, socket, directory or link)",
                       path, ferry__file_kind(sb.st_mode));
}

int ferry__rename_output(const char *from, const char *path)
{
    int rc = ferry__output_check(path);
    if (rc) return rc;
    if (rename(from, path)) return ferry__fail(FERRY_ERR_IO, "%s: cannot rename %s over it: %s", path, from, strerror(errno));
    return FERRY_OK;
}

int ferry__open_input(const char *path, struct stat *st)
{
    struct stat sb;
    if (stat(path, &sb))
        return -ferry__fail(errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO, "%s: cannot open: %s", path,
                            strerror(errno));
    int fd = -1;
    if (S_ISREG(sb.st_mode) && (fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)) < 0)
        return -ferry__fail(errno == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO, "%s: cannot open: %s", path,
                            strerror(errno));
    if (fd >= 0 && fstat(fd, &sb)) {
        int e = errno;
        close(fd);
        return -ferry__fail(FERRY_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        if (fd >= 0) close(fd);
        return -ferry__fail(FERRY_ERR_IO, "%s: is %s, not a regular file: refused", path, ferry__file_kind(sb.st_mode));
    }
    /* reads of a regular file ignore O_NONBLOCK; cleared all the same so
     * the descriptor is an ordinary one */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (st) *st = sb;
    return fd;
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
    int rc = ferry__output_check(path); /* nothing is created beside a device */
    if (rc) return -rc;
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
    if (!rc) rc = ferry__rename_output(tmp, path);
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
    struct stat st;
    int fd = ferry__open_input(path, &st);
    if (fd < 0) return -fd;
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
