/* Status codes, thread-local detailed messages, allocation helpers. */
#include "common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define MSG_CAP 1024
static _Thread_local char g_msg[MSG_CAP];

/* Every code's message comes from the one list in include/ferry_errors.h,
 * so no layer's codes can be missing here. */
#define STRERROR_CASE(name, num, msg) case name: return msg;
const char *ferry_strerror(int code)
{
    switch (code) {
    case FERRY_OK: return "ok";
    FERRY_ERRORS(STRERROR_CASE)
    default: return "unknown error";
    }
}
#undef STRERROR_CASE

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
