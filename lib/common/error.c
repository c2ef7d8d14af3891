/* Status codes, thread-local detailed messages, allocation helpers. */
#include "common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define MSG_CAP 1024
static _Thread_local char g_msg[MSG_CAP];

const char *ferry_strerror(int code)
{
    switch (code) {
    case FERRY_OK: return "ok";
    case FERRY_ERR_NOMEM: return "out of memory";
    case FERRY_ERR_ARG: return "invalid argument";
    case FERRY_ERR_IO: return "I/O error";
    case FERRY_ERR_UNSUPPORTED: return "unsupported";
    case FERRY_ERR_NOT_FOUND: return "not found";
    case FERRY_ERR_LIMIT: return "size limit exceeded";
    case FERRY_ERR_ST_TRUNCATED: return "safetensors: truncated file";
    case FERRY_ERR_ST_HEADER_SIZE: return "safetensors: invalid header length";
    case FERRY_ERR_ST_JSON: return "safetensors: malformed JSON header";
    case FERRY_ERR_ST_DTYPE: return "safetensors: invalid dtype";
    case FERRY_ERR_ST_SHAPE: return "safetensors: invalid shape";
    case FERRY_ERR_ST_OFFSETS: return "safetensors: invalid data offsets";
    case FERRY_ERR_ST_SIZE: return "safetensors: tensor size mismatch";
    case FERRY_ERR_ST_TRAILING: return "safetensors: trailing bytes";
    case FERRY_ERR_ST_METADATA: return "safetensors: invalid __metadata__";
    case FERRY_ERR_ST_DUPLICATE: return "safetensors: duplicate tensor name";
    case FERRY_ERR_ST_INDEX: return "safetensors: invalid sharded index";
    case FERRY_ERR_PATCH_MAGIC: return "patch: bad magic (not a ferry patch)";
    case FERRY_ERR_PATCH_VERSION: return "patch: unsupported format version";
    case FERRY_ERR_PATCH_TRUNCATED: return "patch: truncated";
    case FERRY_ERR_PATCH_CORRUPT: return "patch: corrupt";
    case FERRY_ERR_PATCH_CHECKSUM: return "patch: checksum mismatch";
    case FERRY_ERR_BASE_MISMATCH: return "patch: base model mismatch";
    case FERRY_ERR_TARGET_MISMATCH: return "patch: result does not match target hash";
    case FERRY_ERR_SHAPE_MISMATCH: return "patch: structure change not allowed in place";
    /* The outer layers' codes (store, sync, dock, loco) are named here too,
     * so that one table covers every code a caller can see. */
    /* store (include/ferry_store.h; numbers, as this file sees only ferry.h) */
    case 60: return "store: malformed or unsupported URL";
    case 61: return "store: invalid key";
    case 62: return "store: no such object";
    case 63: return "store: compare-and-swap conflict";
    case 64: return "store: authentication failed";
    case 65: return "store: deadline passed";
    case 66: return "store: unexpected HTTP status";
    case 67: return "store: network error";
    case 68: return "store: read-only store";
    case 69: return "store: corrupt or malformed answer";
    case 70: return "store: range past the end of the object";
    case 71: return "store: canceled";
    /* sync (include/ferry_sync.h) */
    case 80: return "sync: another publisher moved HEAD";
    case 81: return "sync: malformed or inconsistent manifest";
    case 82: return "sync: object does not match its manifest";
    case 83: return "sync: version not published yet";
    case 84: return "sync: version no longer retained";
    case 85: return "sync: no verified path to the version";
    case 86: return "sync: model structure differs";
    case 87: return "sync: HEAD moved backwards";
    case 88: return "sync: no new version in time";
    case 89: return "sync: invalid run name";
    /* dock (include/ferry_dock.h) */
    case 100: return "dock: bad magic (not a dock batch)";
    case 101: return "dock: unsupported batch format";
    case 102: return "dock: truncated batch";
    case 103: return "dock: hostile or inconsistent payload length";
    case 104: return "dock: batch header field out of range";
    case 105: return "dock: batch checksum mismatch";
    case 106: return "dock: batch of another run";
    case 107: return "dock: not a batch key";
    case 108: return "dock: batch header disagrees with its key";
    case 109: return "dock: batch from a future policy version";
    case 110: return "dock: malformed cursor";
    case 111: return "dock: trainer version went backwards";
    case 112: return "dock: cursor contended by another consumer";
    case 113: return "dock: batch unsigned, wrongly signed or by a key not enrolled";
    case 114: return "dock: replayed batch (island and sequence already taken)";
    /* loco (include/ferry_loco.h) */
    case 120: return "loco: bad magic (not a loco payload)";
    case 121: return "loco: unsupported payload version or kind";
    case 122: return "loco: truncated payload";
    case 123: return "loco: corrupt payload";
    case 124: return "loco: payload checksum mismatch";
    case 125: return "loco: index out of range";
    case 126: return "loco: more entries than weights";
    case 127: return "loco: non-finite value";
    case 128: return "loco: payload for a model of another size";
    case 129: return "loco: payload of another round or rank";
    case 130: return "loco: trailing bytes after the payload";
    case 131: return "loco: MPI call failed";
    case 132: return "loco: ranks hold different weights";
    case 133: return "loco: another rank failed";
    case 134: return "loco: call not valid in this mode";
    /* signatures (include/ferry_sign.h) */
    case 140: return "signature: unsigned, and signatures are required";
    case 141: return "signature: trailer cut short or garbled";
    case 142: return "signature: signed by a key that is not trusted";
    case 143: return "signature: does not verify (forged or altered)";
    case 144: return "signature: object does not match its signed digest";
    case 145: return "signature: key file unreadable, malformed or unsafe";
    /* shard (include/ferry_shard.h) */
    case 160: return "shard: parts overlap, leave a gap, repeat or changed layout";
    case 161: return "shard: token or part record of another run, version or publish";
    case 162: return "shard: rank missing, repeated, out of range or rank count changed";
    case 163: return "shard: region outside its tensor or naming none";
    case 164: return "shard: sharded call on a single-rank run (or the reverse)";
    default: return "unknown error";
    }
}

const char *ferry_last_error(void) { return g_msg; }
const char *ferry_version(void) { return FERRY_VERSION_STRING; }
void ferry_free(void *p) { free(p); }
void ferry__clear_error(void) { g_msg[0] = 0; }

int ferry__fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, MSG_CAP, fmt, ap);
    va_end(ap);
    return code;
}

int ferry__context(int code, const char *fmt, ...)
{
    char prefix[MSG_CAP], old[MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, MSG_CAP);
    snprintf(g_msg, MSG_CAP, "%.400s: %.600s", prefix, old[0] ? old : ferry_strerror(code));
    return code;
}

void *ferry__malloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) ferry__fail(FERRY_ERR_NOMEM, "cannot allocate %zu bytes", n);
    return p;
}

void *ferry__calloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) ferry__fail(FERRY_ERR_NOMEM, "cannot allocate %zu x %zu bytes", n, size);
    return p;
}

void *ferry__realloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) ferry__fail(FERRY_ERR_NOMEM, "cannot allocate %zu bytes", n);
    return q;
}

char *ferry__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = ferry__malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

int ferry__buf_reserve(ferry_buf *b, size_t extra)
{
    size_t need;
    if (__builtin_add_overflow(b->size, extra, &need)) return ferry__fail(FERRY_ERR_NOMEM, "buffer size overflow");
    if (need <= b->cap) return FERRY_OK;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) { cap = need; break; }
        cap *= 2;
    }
    uint8_t *d = ferry__realloc(b->data, cap);
    if (!d) return FERRY_ERR_NOMEM;
    b->data = d;
    b->cap = cap;
    return FERRY_OK;
}

int ferry__buf_append(ferry_buf *b, const void *p, size_t n)
{
    int rc = ferry__buf_reserve(b, n);
    if (rc) return rc;
    if (n) memcpy(b->data + b->size, p, n);
    b->size += n;
    return FERRY_OK;
}

void ferry__buf_release(ferry_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->size = b->cap = 0;
}
