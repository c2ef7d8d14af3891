/* Internal helpers shared by every layer: error reporting, checked
 * arithmetic, little-endian access.  Not part of the public API. */
#ifndef FERRY_COMMON_H
#define FERRY_COMMON_H

#include "ferry.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define FERRY_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define FERRY_LIKELY(x) __builtin_expect(!!(x), 1)
#define FERRY_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define FERRY_PRINTF(a, b)
#define FERRY_LIKELY(x) (x)
#define FERRY_UNLIKELY(x) (x)
#endif

/* Records a detailed message for ferry_last_error() and returns code, so
 * that failure sites read `return ferry__fail(FERRY_ERR_X, "...", ...);`. */
int ferry__fail(int code, const char *fmt, ...) FERRY_PRINTF(2, 3);
/* Prefixes the current message with "prefix: " (adds context on the way up)
 * and returns code unchanged. */
int ferry__context(int code, const char *fmt, ...) FERRY_PRINTF(2, 3);
void ferry__clear_error(void);

/* Allocation that records FERRY_ERR_NOMEM context on failure (returns NULL). */
void *ferry__malloc(size_t n);
void *ferry__calloc(size_t n, size_t size);
void *ferry__realloc(void *p, size_t n);
char *ferry__strdup(const char *s);

/* Overflow-checked arithmetic: return false on overflow. */
static inline bool ferry__add_u64(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_add_overflow(a, b, r); }
static inline bool ferry__mul_u64(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_mul_overflow(a, b, r); }

/* Little-endian loads and stores (the formats are little-endian on disk;
 * these compile to plain moves on x86). */
static inline uint16_t ferry__le16(const void *p) { const uint8_t *b = p; return (uint16_t)(b[0] | b[1] << 8); }
static inline uint32_t ferry__le32(const void *p) { const uint8_t *b = p; return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24; }
static inline uint64_t ferry__le64(const void *p) { return (uint64_t)ferry__le32(p) | (uint64_t)ferry__le32((const uint8_t *)p + 4) << 32; }
static inline void ferry__put16(void *p, uint16_t v) { uint8_t *b = p; b[0] = (uint8_t)v; b[1] = (uint8_t)(v >> 8); }
static inline void ferry__put32(void *p, uint32_t v) { uint8_t *b = p; for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i)); }
static inline void ferry__put64(void *p, uint64_t v) { ferry__put32(p, (uint32_t)v); ferry__put32((uint8_t *)p + 4, (uint32_t)(v >> 32)); }

/* A growable byte buffer for encoders. */
typedef struct ferry_buf {
    uint8_t *data;
    size_t size, cap;
} ferry_buf;
int ferry__buf_reserve(ferry_buf *b, size_t extra);
int ferry__buf_append(ferry_buf *b, const void *p, size_t n);
void ferry__buf_release(ferry_buf *b);

/* A bounds-checked reader for decoders: every take fails with
 * FERRY_ERR_PATCH_TRUNCATED-style errors instead of reading past the end. */
typedef struct ferry_rd {
    const uint8_t *p, *end;
} ferry_rd;
static inline size_t ferry__rd_left(const ferry_rd *r) { return (size_t)(r->end - r->p); }

/* Writes the whole buffer to path atomically (a temporary file beside it,
 * fsync, rename, fsync of the directory).  On failure nothing is left at
 * path or aside. */
int ferry__write_file_atomic(const char *path, const void *const *parts,
                             const size_t *sizes, size_t nparts);
/* fsync of the directory holding path (makes a rename durable); 0 or
 * FERRY_ERR_IO with a message. */
int ferry__fsync_dir_of(const char *path);
/* Creates a new temporary file beside path, PATH.tmp.PID.RANDOM, with
 * O_CREAT | O_EXCL | O_NOFOLLOW: a name planted in advance (a symbolic link
 * to /etc/passwd, say) is never opened through; another random name is
 * tried, 16 at most.  rw: O_RDWR, else O_WRONLY.  The name goes to tmp
 * (cap bytes).  Returns the descriptor, or minus a FERRY_ERR_* code. */
int ferry__tmp_create(const char *path, int rw, char *tmp, size_t cap);
/* Finishes a temporary file of ferry__tmp_create: with rc 0, fsync, close,
 * rename over path and fsync of the directory (each error checked); with rc
 * nonzero (the writer failed) or on any error, closes and removes tmp.
 * Returns rc or the first error. */
int ferry__tmp_commit(int fd, const char *tmp, const char *path, int rc);
/* Outputs and inputs that are not regular files (lib/common/file.c):
 * ferry__output_check refuses an existing PATH that is not a regular file
 * (device, FIFO, socket, directory, symbolic link) with FERRY_ERR_IO naming
 * it; ferry__tmp_create and ferry__tmp_commit call it, and every other
 * rename onto an output goes through ferry__rename_output (check, then
 * rename).  ferry__open_input opens an existing regular file to read
 * (links followed) without ever blocking on a FIFO; returns the descriptor
 * and its stat, or minus a FERRY_ERR_* code.  ferry__file_kind names a
 * st_mode's type ("a FIFO"). */
int ferry__output_check(const char *path);
int ferry__rename_output(const char *from, const char *path);
struct stat;
int ferry__open_input(const char *path, struct stat *st);
const char *ferry__file_kind(unsigned mode);
/* Reads a whole file into a new buffer (bounded by max bytes). */
int ferry__read_file(const char *path, size_t max, uint8_t **data, size_t *size);

/* Clock, sleep, hex, random bytes, array growth, SHA-256, FERRY_ASSERT. */
#include "util.h"

#endif
