/* file:// backend: a directory tree on a local or shared file system.
 *
 * Invariants:
 *  - an object is a regular file at ROOT/KEY; it only ever appears there
 *    by rename(2) of a complete, fsynced temporary file, so readers see the
 *    old or the new object, never a part;
 *  - what no put writes is not an object: a symbolic link (anywhere on
 *    the way down from the root, never followed: it could lead out of the
 *    root) or a FIFO, device or socket at a key's place is reported as
 *    FERRY_ERR_STORE_CORRUPT (this store is bad; a store list moves on to
 *    the next) and is never opened, so a planted FIFO cannot block a
 *    reader; listings skip them;
 *  - temporary files (".ferry-tmp.*") and the CAS lock (".ferry-cas.lock")
 *    use a name prefix that no valid key segment can have, so they are
 *    never listed, read or overwritten through the API;
 *  - etags: objects up to 1 MiB (pointers, manifests) get the XXH3-128 of
 *    their content — exact, so a compare-and-swap can never mistake one
 *    content for another; larger objects get size, mtime (ns) and inode,
 *    which needs no read of gigabytes for a head or a listing.
 */

#include "store_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include "xxh.h"

#define PATH_CAP 4096
#define CHUNK (8u << 20)
#define LOCK_NAME ".ferry-cas.lock"
#define TMP_PREFIX ".ferry-tmp."

static int obj_path(const ferry_store *s, const char *key, char out[PATH_CAP])
{
    /* store.c checks every key before a backend sees it: no "..", no
     * leading '/', so the path stays under the root */
    FERRY_ASSERT(ferry_store_key_check(key) == FERRY_OK);
    if (snprintf(out, PATH_CAP, "%s/%s", s->root, key) >= PATH_CAP)
        return ferry__fail(FERRY_ERR_STORE_KEY, "%s/%s: path too long", s->url, key);
    return FERRY_OK;
}

static int io_fail(const ferry_store *s, const char *key, const char *op, int e)
{
    int code = e == ENOENT ? FERRY_ERR_STORE_NOT_FOUND
             : (e == ENOTDIR || e == EISDIR || e == ENAMETOOLONG) ? FERRY_ERR_STORE_KEY
             : e == ELOOP ? FERRY_ERR_STORE_CORRUPT /* planted in the store: see the header */
                          : FERRY_ERR_IO;
    const char *why = e == ENOENT ? "no such object"
                    : e == ENOTDIR ? "a prefix of the key is an object (a file store cannot hold both 'a' and 'a/b')"
                    : e == EISDIR ? "the key is a directory prefix of other keys"
                    : e == ELOOP ? "a symbolic link in the store (never followed: it could lead out of the root)"
                                  : strerror(e);
    return ferry__fail(code, "%s/%s: %s: %s", s->url, key, op, why);
}

static void hash_hex(const XXH128_hash_t *h, char out[FERRY_STORE_ETAG_MAX])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, *h);
    ferry__hex(out, c.digest, sizeof c.digest);
}

static void stat_etag(const struct stat *st, char out[FERRY_STORE_ETAG_MAX])
{
    snprintf(out, FERRY_STORE_ETAG_MAX, "m%llx-%llx.%lx-%llx", (unsigned long long)st->st_size,
             (unsigned long long)st->st_mtim.tv_sec, (long)st->st_mtim.tv_nsec, (unsigned long long)st->st_ino);
}

static void fill_stat(const struct stat *st, ferry_store_stat *out)
{
    out->size = (uint64_t)st->st_size;
    out->mtime = (int64_t)st->st_mtim.tv_sec;
}

static int progress(ferry_store *s, uint64_t done, uint64_t total)
{
    if (s->progress && s->progress(s->progress_user, done, total))
        return ferry__fail(FERRY_ERR_STORE_CANCELED, "%s: canceled by the progress callback", s->url);
    return FERRY_OK;
}

/* Reads [off, off + n) of fd into sink (or only hashes it when sink is
 * NULL), feeding the hash state if given.  A file that ends early is
 * corrupt: objects are replaced by rename, never truncated in place. */
static int read_into(ferry_store *s, const char *key, int fd, uint64_t off, uint64_t n, ferry__sink *sink,
                     XXH3_state_t *h)
{
    uint8_t *chunk = ferry__malloc(n < CHUNK ? (size_t)n + 1 : CHUNK);
    if (!chunk) return FERRY_ERR_NOMEM;
    uint64_t done = 0;
    int rc = FERRY_OK;
    while (done < n) {
        size_t want = n - done < CHUNK ? (size_t)(n - done) : CHUNK;
        ssize_t r = pread(fd, chunk, want, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { rc = io_fail(s, key, "read", errno); break; }
        if (r == 0) {
            rc = ferry__fail(FERRY_ERR_STORE_CORRUPT, "%s/%s: short read: %llu of %llu bytes (truncated in place?)",
                             s->url, key, (unsigned long long)done, (unsigned long long)n);
            break;
        }
        if (h) XXH3_128bits_update(h, chunk, (size_t)r);
        if (sink && (rc = ferry__sink_write(sink, chunk, (size_t)r))) {
            /* (a function target's own LIMIT keeps its message) */
            if (rc == FERRY_ERR_LIMIT && (!sink->fn || (uint64_t)r > sink->max - sink->written))
                ferry__fail(rc, "%s/%s: object exceeds %llu bytes", s->url, key, (unsigned long long)sink->max);
            break;
        }
        done += (uint64_t)r;
        if (n > CHUNK && (rc = progress(s, done, n))) break;
    }
    free(chunk);
    return rc;
}

/* Etag of an open object: content hash up to FERRY__FILE_HASH_MAX. */
static int fd_etag(ferry_store *s, const char *key, int fd, const struct stat *st, char out[FERRY_STORE_ETAG_MAX])
{
    if ((uint64_t)st->st_size > FERRY__FILE_HASH_MAX) {
        stat_etag(st, out);
        return FERRY_OK;
    }
    XXH3_state_t *h = XXH3_createState();
    if (!h) return ferry__fail(FERRY_ERR_NOMEM, "cannot allocate a hash state");
    XXH3_128bits_reset(h);
    int rc = read_into(s, key, fd, 0, (uint64_t)st->st_size, NULL, h);
    if (!rc) {
        XXH128_hash_t d = XXH3_128bits_digest(h);
        hash_hex(&d, out);
    }
    XXH3_freeState(h);
    return rc;
}

/* Opens the directory holding key, walking down from the root one segment
 * at a time with O_NOFOLLOW: a symbolic link planted inside the store (to
 * "/", say) is never followed, so no key reads or deletes anything outside
 * the root.  *last points at the key's last segment.  Returns the
 * directory's descriptor, or minus an error (the message names the key). */
static int open_parent(ferry_store *s, const char *key, const char **last)
{
    int dfd = open(s->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return -io_fail(s, key, "open the root", errno);
    const char *seg = key;
    for (const char *slash; (slash = strchr(seg, '/')); seg = slash + 1) {
        char name[256]; /* key segments are at most 255 bytes */
        memcpy(name, seg, (size_t)(slash - seg));
        name[slash - seg] = 0;
        int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        struct stat sb; /* Linux says ENOTDIR for a link with O_DIRECTORY */
        if (sub < 0 && e == ENOTDIR && !fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) && S_ISLNK(sb.st_mode)) e = ELOOP;
        close(dfd);
        if (sub < 0) return -io_fail(s, key, "open", e);
        dfd = sub;
    }
    *last = seg;
    return dfd;
}

/* What stands at a key's place and is not an object (see the header):
 * a directory is a prefix of other keys (no such object); the rest is
 * planted. */
static int not_object(ferry_store *s, const char *key, unsigned mode)
{
    if (S_ISDIR(mode)) return io_fail(s, key, "open", ENOENT);
    if (S_ISLNK(mode)) return io_fail(s, key, "open", ELOOP);
    return ferry__fail(FERRY_ERR_STORE_CORRUPT, "%s/%s: is %s, not an object (a regular file): refused, never opened",
                       s->url, key, ferry__file_kind(mode));
}

/* Opens an existing object for reading; directories, symbolic links,
 * FIFOs, devices and sockets are not objects.  The entry is checked
 * before the open (a FIFO is never opened: the open would block until a
 * writer came; a device's open can have effects), and the open has
 * O_NONBLOCK and is checked again, for one swapped in meanwhile.  A
 * regular file's reads ignore O_NONBLOCK. */
static int open_obj(ferry_store *s, const char *key, int *fd_out, struct stat *st)
{
    const char *last;
    int dfd = open_parent(s, key, &last);
    if (dfd < 0) return -dfd;
    if (fstatat(dfd, last, st, AT_SYMLINK_NOFOLLOW)) {
        int e = errno;
        close(dfd);
        return io_fail(s, key, "stat", e);
    }
    if (!S_ISREG(st->st_mode)) {
        close(dfd);
        return not_object(s, key, st->st_mode);
    }
    int fd = openat(dfd, last, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    int oe = errno;
    close(dfd);
    if (fd < 0) return oe == EISDIR ? io_fail(s, key, "open", ENOENT) : io_fail(s, key, "open", oe);
    if (fstat(fd, st)) {
        int e = errno;
        close(fd);
        return io_fail(s, key, "fstat", e);
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return not_object(s, key, st->st_mode);
    }
    *fd_out = fd;
    return FERRY_OK;
}

/* ---------------------------------------------------------------------
 * Writes
 * ------------------------------------------------------------------- */

static int mkdirs(ferry_store *s, const char *key)
{
    char path[PATH_CAP];
    int rc = obj_path(s, key, path);
    if (rc) return rc;
    size_t rl = strlen(s->root);
    for (char *p = path + rl + 1; (p = strchr(p, '/')); p++) {
        *p = 0;
        if (mkdir(path, 0755) == 0) {
            /* a new directory is durable once its parent's entry is */
            if ((rc = ferry__fsync_dir_of(path))) return ferry__context(rc, "%s/%s: mkdir", s->url, key);
        } else if (errno != EEXIST) {
            int e = errno;
            return io_fail(s, key, "mkdir", e);
        } else {
            struct stat sb; /* an existing directory, not a link to one elsewhere */
            if (lstat(path, &sb)) return io_fail(s, key, "lstat", errno);
            if (!S_ISDIR(sb.st_mode)) return io_fail(s, key, "mkdir", S_ISLNK(sb.st_mode) ? ELOOP : ENOTDIR);
        }
        *p = '/';
    }
    return FERRY_OK;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n > CHUNK ? CHUNK : n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static atomic_uint g_tmp_counter;

/* The whole put: temporary file next to the target, fsync, rename, fsync of
 * the directory.  Caller holds the CAS lock when called from cas.  Bytes
 * from a file descriptor are copied CHUNK at a time. */
static int file_put(ferry_store *s, const char *key, const ferry__src *src, uint64_t size, char *etag)
{
    char path[PATH_CAP], tmp[PATH_CAP];
    int rc = obj_path(s, key, path);
    if (!rc) rc = mkdirs(s, key);
    if (rc) return rc;
    const char *slash = strrchr(path, '/');
    int dl = (int)(slash - path);
    if (snprintf(tmp, sizeof tmp, "%.*s/" TMP_PREFIX "%ld.%u.%llu", dl, path, (long)getpid(),
                 atomic_fetch_add(&g_tmp_counter, 1u), (unsigned long long)ferry__rand_below(1ull << 40)) >=
        (int)sizeof tmp)
        return ferry__fail(FERRY_ERR_STORE_KEY, "%s/%s: path too long", s->url, key);
    XXH3_state_t *h = size <= FERRY__FILE_HASH_MAX ? XXH3_createState() : NULL;
    uint8_t *chunk = src->mem ? NULL : ferry__malloc(size < CHUNK ? (size_t)size + 1 : CHUNK);
    if ((size <= FERRY__FILE_HASH_MAX && !h) || (!src->mem && !chunk)) {
        XXH3_freeState(h);
        free(chunk);
        return ferry__fail(FERRY_ERR_NOMEM, "%s/%s: put: cannot allocate a hash state or a copy buffer", s->url, key);
    }
    if (h) XXH3_128bits_reset(h);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        XXH3_freeState(h);
        free(chunk);
        return io_fail(s, key, "create temporary file", errno);
    }
    uint64_t done = 0;
    while (done < size) {
        size_t n = size - done < CHUNK ? (size_t)(size - done) : CHUNK;
        const uint8_t *p = src->mem ? src->mem + done : chunk;
        if (!src->mem && (rc = ferry__src_read(src, done, chunk, n, s->url))) {
            ferry__context(rc, "%s/%s: put", s->url, key);
            goto fail;
        }
        if (write_all(fd, p, n)) { rc = io_fail(s, key, "write", errno); goto fail; }
        if (h) XXH3_128bits_update(h, p, n);
        done += n;
        if (size > CHUNK && (rc = progress(s, done, size))) goto fail;
    }
    if (fsync(fd)) { rc = io_fail(s, key, "fsync", errno); goto fail; }
    struct stat st;
    if (fstat(fd, &st)) { rc = io_fail(s, key, "fstat", errno); goto fail; }
    if (h) {
        XXH128_hash_t d = XXH3_128bits_digest(h);
        hash_hex(&d, etag);
    } else {
        stat_etag(&st, etag); /* rename keeps inode and mtime */
    }
    if (close(fd)) { fd = -1; rc = io_fail(s, key, "close", errno); goto fail; }
    fd = -1;
    if (rename(tmp, path)) { rc = io_fail(s, key, "rename", errno); goto fail; }
    XXH3_freeState(h);
    free(chunk);
    /* makes the rename durable: an error here means the object may vanish
     * at a crash, so the put is not reported done */
    if ((rc = ferry__fsync_dir_of(path))) return ferry__context(rc, "%s/%s: put", s->url, key);
    return FERRY_OK;
fail:
    XXH3_freeState(h);
    free(chunk);
    if (fd >= 0) close(fd);
    unlink(tmp);
    return rc;
}

/* ---------------------------------------------------------------------
 * Reads
 * ------------------------------------------------------------------- */

static int file_get(ferry_store *s, const char *key, ferry__sink *sink, ferry_store_stat *st)
{
    int fd;
    struct stat sb;
    int rc = open_obj(s, key, &fd, &sb);
    if (rc) return rc;
    if ((uint64_t)sb.st_size > sink->max) {
        close(fd);
        return ferry__fail(FERRY_ERR_LIMIT, "%s/%s: object of %lld bytes exceeds the limit of %llu", s->url, key,
                           (long long)sb.st_size, (unsigned long long)sink->max);
    }
    if (sink->buf && (rc = ferry__buf_reserve(sink->buf, (size_t)sb.st_size + 1))) {
        close(fd);
        return rc;
    }
    XXH3_state_t *h = NULL;
    if ((uint64_t)sb.st_size <= FERRY__FILE_HASH_MAX) {
        if (!(h = XXH3_createState())) {
            close(fd);
            return ferry__fail(FERRY_ERR_NOMEM, "cannot allocate a hash state");
        }
        XXH3_128bits_reset(h);
    }
    rc = read_into(s, key, fd, 0, (uint64_t)sb.st_size, sink, h);
    close(fd);
    if (!rc) {
        fill_stat(&sb, st);
        if (h) {
            XXH128_hash_t d = XXH3_128bits_digest(h);
            hash_hex(&d, st->etag);
        } else {
            stat_etag(&sb, st->etag);
        }
    }
    if (h) XXH3_freeState(h);
    return rc;
}

static int file_get_range(ferry_store *s, const char *key, uint64_t off, size_t len, void *buf, size_t *got,
                          ferry__group *g)
{
    (void)g; /* local reads report no progress */
    int fd;
    struct stat sb;
    int rc = open_obj(s, key, &fd, &sb);
    if (rc) return rc;
    uint64_t size = (uint64_t)sb.st_size;
    if (off > size) {
        close(fd);
        return ferry__fail(FERRY_ERR_STORE_RANGE, "%s/%s: offset %llu is past the end (%llu bytes)", s->url, key,
                           (unsigned long long)off, (unsigned long long)size);
    }
    uint64_t n = size - off < len ? size - off : len;
    ferry__sink sink = {.fixed = buf, .fixed_cap = len, .fd = -1, .max = len};
    rc = read_into(s, key, fd, off, n, &sink, NULL);
    close(fd);
    if (!rc) *got = (size_t)n;
    return rc;
}

static int file_head(ferry_store *s, const char *key, ferry_store_stat *st)
{
    int fd;
    struct stat sb;
    int rc = open_obj(s, key, &fd, &sb);
    if (rc) return rc;
    fill_stat(&sb, st);
    rc = fd_etag(s, key, fd, &sb, st->etag);
    close(fd);
    return rc;
}

/* ---------------------------------------------------------------------
 * Listing: a walk of the tree under the prefix's directory part.  Names
 * that are not valid keys (including our temporary files) and symbolic
 * links are skipped; depth is bounded by the key length.
 * ------------------------------------------------------------------- */

typedef struct walk {
    ferry_store *s;
    const char *prefix;
    size_t plen;
    ferry_store_listing *out;
    size_t cap;
} walk;

/* Walks the directory open as dfd (taken over and closed), whose path
 * relative to the root is rel[0..rlen) (empty or ending in '/'). */
static int walk_dir(walk *w, int dfd, char *rel, size_t rlen)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return ferry__fail(FERRY_ERR_IO, "%s: cannot list '%s': %s", w->s->url, rel, strerror(errno));
    }
    int rc = FERRY_OK;
    struct dirent *e;
    while (!rc && (errno = 0, e = readdir(d))) {
        const char *name = e->d_name;
        if (!strcmp(name, ".") || !strcmp(name, "..") || !strncmp(name, ".ferry-", 7)) continue;
        size_t nl = strlen(name);
        if (rlen + nl + 1 > FERRY_STORE_KEY_MAX) continue; /* could not be a key */
        memcpy(rel + rlen, name, nl + 1);
        /* Prune: the path so far must agree with the prefix on their common length. */
        size_t cmp = rlen + nl < w->plen ? rlen + nl : w->plen;
        if (memcmp(rel, w->prefix, cmp)) continue;
        struct stat st;
        if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW)) {
            if (errno == ENOENT) continue; /* deleted meanwhile */
            rc = ferry__fail(FERRY_ERR_IO, "%s: stat of '%s': %s", w->s->url, rel, strerror(errno));
            break;
        }
        if (S_ISDIR(st.st_mode)) {
            int sub = openat(dirfd(d), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) {
                if (errno == ENOENT) continue;
                rc = ferry__fail(FERRY_ERR_IO, "%s: open of '%s': %s", w->s->url, rel, strerror(errno));
                break;
            }
            rel[rlen + nl] = '/';
            rel[rlen + nl + 1] = 0;
            rc = walk_dir(w, sub, rel, rlen + nl + 1);
        } else if (S_ISREG(st.st_mode) && rlen + nl >= w->plen) {
            if (ferry_store_key_check(rel)) continue; /* not a key: skipped, see the header */
            /* O_NONBLOCK: a FIFO swapped in after the fstatat must not block */
            int fd = openat(dirfd(d), name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
            if (fd < 0) {
                if (errno == ENOENT || errno == ELOOP) continue; /* deleted or replaced by a link meanwhile */
                rc = ferry__fail(FERRY_ERR_IO, "%s: open of '%s': %s", w->s->url, rel, strerror(errno));
                break;
            }
            struct stat st2;
            if (fstat(fd, &st2)) st2 = st; /* the file opened may be newer than the entry */
            if (!S_ISREG(st2.st_mode)) { /* replaced by a FIFO, device... meanwhile: not an object */
                close(fd);
                continue;
            }
            ferry_store_stat info = {0};
            fill_stat(&st2, &info);
            rc = fd_etag(w->s, rel, fd, &st2, info.etag);
            close(fd);
            if (!rc) rc = ferry__listing_add(w->out, &w->cap, w->s->max_list, rel, &info);
        }
    }
    if (!rc && errno && !e) rc = ferry__fail(FERRY_ERR_IO, "%s: readdir: %s", w->s->url, strerror(errno));
    closedir(d);
    rel[rlen] = 0;
    return rc;
}

static int file_list(ferry_store *s, const char *prefix, ferry_store_listing *out)
{
    char rel[FERRY_STORE_KEY_MAX + 2];
    walk w = {.s = s, .prefix = prefix, .plen = strlen(prefix), .out = out};
    /* Start at the deepest directory the prefix names completely (its
     * segments were checked: no "..", so it stays under the root). */
    const char *slash = strrchr(prefix, '/');
    size_t start = slash ? (size_t)(slash - prefix) + 1 : 0;
    FERRY_ASSERT(start <= FERRY_STORE_KEY_MAX); /* ferry__prefix_check bounded it */
    memcpy(rel, prefix, start);
    rel[start] = 0;
    /* Walked down from the root one segment at a time with O_NOFOLLOW, as
     * for a key: a prefix directory that is a symbolic link (RUN/traj ->
     * /usr/share) is not part of the store, so nothing is listed under it,
     * as the walk skips links below (review of issue 23). */
    const char *last;
    int dfd = open_parent(s, rel, &last);
    if (dfd < 0) {
        int rc = -dfd;
        if (rc != FERRY_ERR_STORE_NOT_FOUND && rc != FERRY_ERR_STORE_KEY && rc != FERRY_ERR_STORE_CORRUPT) return rc;
        ferry__clear_error(); /* absent, an object, or a link: nothing under this prefix */
        return FERRY_OK;
    }
    return walk_dir(&w, dfd, rel, start);
}

static int file_del(ferry_store *s, const char *key)
{
    const char *last;
    int dfd = open_parent(s, key, &last);
    if (dfd < 0) {
        if (-dfd != FERRY_ERR_STORE_NOT_FOUND) return -dfd;
        ferry__clear_error(); /* deletes are idempotent */
        return FERRY_OK;
    }
    int rc = FERRY_OK;
    if (unlinkat(dfd, last, 0) && errno != ENOENT && errno != EISDIR && errno != ENOTDIR) rc = io_fail(s, key, "unlink", errno);
    close(dfd);
    return rc;
}

/* ---------------------------------------------------------------------
 * Compare-and-swap under flock(2).  The lock belongs to the open file
 * description, so the kernel drops it when the holder exits or is killed:
 * a crashed writer can never leave the store locked.  Separate opens in
 * one process exclude each other too (threads are safe).
 * ------------------------------------------------------------------- */

static int lock_store(ferry_store *s, const char *key, int *fd_out)
{
    char path[PATH_CAP];
    if (snprintf(path, sizeof path, "%s/" LOCK_NAME, s->root) >= (int)sizeof path)
        return ferry__fail(FERRY_ERR_STORE_KEY, "%s: root path too long", s->url);
    /* O_NONBLOCK: a FIFO planted as the lock must not block the open */
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0)
        return ferry__fail(errno == ELOOP ? FERRY_ERR_STORE_CORRUPT : FERRY_ERR_IO, "%s: cannot open the lock %s: %s",
                           s->url, path, errno == ELOOP ? "a symbolic link in the store" : strerror(errno));
    struct stat lst;
    if (fstat(fd, &lst) || !S_ISREG(lst.st_mode)) {
        close(fd);
        return ferry__fail(FERRY_ERR_STORE_CORRUPT, "%s: the lock %s is not a regular file: refused", s->url, path);
    }
    uint64_t deadline = ferry__deadline(s), wait = 1;
    while (flock(fd, LOCK_EX | LOCK_NB)) {
        if (errno != EWOULDBLOCK && errno != EINTR) {
            int e = errno;
            close(fd);
            return ferry__fail(FERRY_ERR_IO, "%s: flock of %s: %s", s->url, path, strerror(e));
        }
        uint64_t now = ferry__mono_ms();
        if (now >= deadline) {
            close(fd);
            return ferry__fail(FERRY_ERR_STORE_TIMEOUT,
                               "%s/%s: cas: deadline of %.1f s passed waiting for the lock %s (held by a live process)",
                               s->url, key, (double)s->deadline_ms / 1000.0, path);
        }
        ferry__sleep_ms(wait < deadline - now ? wait : deadline - now);
        if (wait < 50) wait *= 2;
    }
    *fd_out = fd;
    return FERRY_OK;
}

static int file_cas(ferry_store *s, const char *key, const char *expected, const void *data, size_t size,
                    char *etag)
{
    int lfd;
    int rc = lock_store(s, key, &lfd);
    if (rc) return rc;
    int fd;
    struct stat sb;
    char cur[FERRY_STORE_ETAG_MAX] = "";
    rc = open_obj(s, key, &fd, &sb);
    if (!rc) {
        rc = fd_etag(s, key, fd, &sb, cur);
        close(fd);
        if (!rc && !expected)
            rc = ferry__fail(FERRY_ERR_STORE_CONFLICT, "%s/%s: cas: the object exists (etag %s), expected none",
                             s->url, key, cur);
        else if (!rc && strcmp(cur, expected))
            rc = ferry__fail(FERRY_ERR_STORE_CONFLICT, "%s/%s: cas: current etag %s, expected %s", s->url, key, cur,
                             expected);
    } else if (rc == FERRY_ERR_STORE_NOT_FOUND) {
        rc = expected ? ferry__fail(FERRY_ERR_STORE_CONFLICT, "%s/%s: cas: the object is absent, expected etag %s",
                                    s->url, key, expected)
                      : FERRY_OK;
    }
    ferry__src src = ferry__src_mem(data);
    if (!rc) rc = file_put(s, key, &src, size, etag);
    close(lfd); /* releases the lock */
    return rc;
}

static int file_probe_cas(ferry_store *s, const char *key, int *atomic)
{
    (void)s;
    (void)key;
    *atomic = 1;
    return FERRY_OK;
}

const ferry__backend ferry__file_backend = {
    .put = file_put,
    .get = file_get,
    .get_range = file_get_range,
    .head = file_head,
    .list = file_list,
    .del = file_del,
    .cas = file_cas,
    .probe_cas = file_probe_cas,
    .release = NULL,
};

/* ---------------------------------------------------------------------
 * Open
 * ------------------------------------------------------------------- */

static int mkdir_p(char *path)
{
    for (char *p = path + 1; (p = strchr(p, '/')); p++) {
        *p = 0;
        int r = mkdir(path, 0755);
        *p = '/';
        if (r && errno != EEXIST) return -1;
    }
    return mkdir(path, 0755) && errno != EEXIST ? -1 : 0;
}

int ferry__file_init(ferry_store *s, const char *path, int create)
{
    s->be = &ferry__file_backend;
    s->kind = FERRY_STORE_FILE;
    if (!*path) return ferry__fail(FERRY_ERR_STORE_URL, "empty store path");
    char abs[PATH_CAP];
    if (path[0] == '/') {
        if (snprintf(abs, sizeof abs, "%s", path) >= (int)sizeof abs)
            return ferry__fail(FERRY_ERR_STORE_URL, "store path too long");
    } else {
        char cwd[PATH_CAP];
        if (!getcwd(cwd, sizeof cwd)) return ferry__fail(FERRY_ERR_IO, "getcwd: %s", strerror(errno));
        if (snprintf(abs, sizeof abs, "%s/%s", cwd, path) >= (int)sizeof abs)
            return ferry__fail(FERRY_ERR_STORE_URL, "store path too long");
    }
    for (const char *p = abs; *p; p++)
        if ((unsigned char)*p < 0x20) return ferry__fail(FERRY_ERR_STORE_URL, "store path has a control character");
    struct stat st;
    if (stat(abs, &st)) {
        if (errno != ENOENT) return ferry__fail(FERRY_ERR_IO, "%s: %s", abs, strerror(errno));
        if (!create)
            return ferry__fail(FERRY_ERR_STORE_NOT_FOUND, "%s: no such directory (set the create option to make it)",
                               abs);
        if (mkdir_p(abs)) return ferry__fail(FERRY_ERR_IO, "%s: cannot create: %s", abs, strerror(errno));
        if (stat(abs, &st)) return ferry__fail(FERRY_ERR_IO, "%s: %s", abs, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) return ferry__fail(FERRY_ERR_IO, "%s: not a directory", abs);
    char *real = realpath(abs, NULL);
    if (!real) return ferry__fail(FERRY_ERR_IO, "%s: realpath: %s", abs, strerror(errno));
    if (!strcmp(real, "/")) real[0] = 0; /* root "/" : paths become "/key" */
    s->root = real;
    size_t n = strlen(real) + 8;
    s->url = ferry__malloc(n + 1);
    if (!s->url) return FERRY_ERR_NOMEM;
    snprintf(s->url, n + 1, "file://%s%s", real, real[0] ? "" : "/");
    return FERRY_OK;
}
