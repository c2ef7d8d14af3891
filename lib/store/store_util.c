/* Small helpers of the store layer: jitter, URI encoding, etags, number
 * and date parsing, UTF-8 validation. */

#include "store_impl.h"

#include <errno.h>
#include <stdio.h>
#include <unistd.h>

/* xorshift64*, one state per thread, seeded from ferry__random_bytes:
 * jitter must differ between processes that failed at the same instant. */
static _Thread_local uint64_t g_rng;

uint64_t ferry__rand_below(uint64_t n)
{
    if (!g_rng) {
        uint64_t seed = 0;
        ferry__random_bytes(&seed, sizeof seed);
        g_rng = seed | 1u;
    }
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    uint64_t r = g_rng * 0x2545F4914F6CDD1Dull;
    return n ? r % n : 0;
}

int ferry__uri_encode(ferry_buf *b, const char *s, size_t n, int keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                   c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/');
        char esc[3] = {'%', hex[c >> 4], hex[c & 15]};
        int rc = keep ? ferry__buf_append(b, &c, 1) : ferry__buf_append(b, esc, 3);
        if (rc) return rc;
    }
    return FERRY_OK;
}

int ferry__etag_clean(const char *in, size_t n, char out[FERRY_STORE_ETAG_MAX])
{
    /* Trim blanks, then one pair of quotes ("W/" kept as a prefix). */
    while (n && (in[0] == ' ' || in[0] == '\t')) { in++; n--; }
    while (n && (in[n - 1] == ' ' || in[n - 1] == '\t' || in[n - 1] == '\r' || in[n - 1] == '\n')) n--;
    char tmp[FERRY_STORE_ETAG_MAX];
    size_t k = 0;
    if (n >= 2 && in[0] == 'W' && in[1] == '/') {
        tmp[k++] = 'W';
        tmp[k++] = '/';
        in += 2;
        n -= 2;
    }
    if (n >= 2 && in[0] == '"' && in[n - 1] == '"') {
        in++;
        n -= 2;
    }
    if (n == 0 || n + k >= FERRY_STORE_ETAG_MAX) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        if (c <= 0x20 || c >= 0x7f || c == '"') return -1;
        tmp[k++] = (char)c;
    }
    tmp[k] = 0;
    memcpy(out, tmp, k + 1);
    return 0;
}

int ferry__parse_u64(const char *s, size_t n, uint64_t *out)
{
    if (n == 0 || n > 20) return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, (uint64_t)(s[i] - '0'), &v))
            return -1;
    }
    *out = v;
    return 0;
}

static int digits(const char *s, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

int64_t ferry__parse_iso8601(const char *s, size_t n)
{
    /* YYYY-MM-DDTHH:MM:SS[.fff...]Z */
    int Y, M, D, h, m, sec;
    if (n < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':') return -1;
    if (digits(s, 4, &Y) || digits(s + 5, 2, &M) || digits(s + 8, 2, &D) || digits(s + 11, 2, &h) ||
        digits(s + 14, 2, &m) || digits(s + 17, 2, &sec))
        return -1;
    size_t i = 19;
    if (s[i] == '.') {
        i++;
        size_t f = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == f) return -1;
    }
    if (i + 1 != n || s[i] != 'Z') return -1;
    if (Y < 1970 || M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || sec > 60) return -1;
    /* Days from civil (Howard Hinnant's algorithm): no timegm, no TZ. */
    int y = Y - (M <= 2);
    int era = y / 400;
    int yoe = y - era * 400;
    int doy = (153 * (M + (M > 2 ? -3 : 9)) + 2) / 5 + D - 1;
    int doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    int64_t days = (int64_t)era * 146097 + doe - 719468;
    return days * 86400 + h * 3600 + m * 60 + sec;
}


int ferry__utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        unsigned need;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) { need = 1; cp = c & 0x1F; min = 0x80; }
        else if (c >= 0xE0 && c <= 0xEF) { need = 2; cp = c & 0x0F; min = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { need = 3; cp = c & 0x07; min = 0x10000; }
        else return 0;
        if (n - i <= need) return 0;
        for (unsigned k = 1; k <= need; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += need + 1;
    }
    return 1;
}

int ferry__sink_write(ferry__sink *k, const void *p, size_t n)
{
    if (n > k->max - k->written) return FERRY_ERR_LIMIT;
    if (k->buf) {
        int rc = ferry__buf_append(k->buf, p, n);
        if (rc) return rc;
    } else if (k->fn) {
        int rc = n ? k->fn(k->fn_ctx, p, n) : FERRY_OK;
        if (rc) return rc;
    } else if (k->fixed) {
        if (n > k->fixed_cap - k->written) return FERRY_ERR_LIMIT;
        memcpy(k->fixed + k->written, p, n);
    } else {
        const uint8_t *b = p;
        size_t left = n;
        while (left) {
            ssize_t w = write(k->fd, b, left > (1u << 30) ? (1u << 30) : left);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return ferry__fail(FERRY_ERR_IO, "write of the download: %s", w ? strerror(errno) : "no progress");
            b += w;
            left -= (size_t)w;
        }
    }
    k->written += n;
    return FERRY_OK;
}

int ferry__sink_reset(ferry__sink *k)
{
    if (k->fn && k->written)
        return ferry__fail(FERRY_ERR_STORE_NET, "a streamed download cannot start over after %llu bytes were handed on "
                           "(the object changed, or the server cannot resume)", (unsigned long long)k->written);
    k->written = 0;
    if (k->buf) k->buf->size = 0;
    if (!k->buf && !k->fixed && !k->fn && k->fd >= 0) {
        if (ftruncate(k->fd, 0) || lseek(k->fd, 0, SEEK_SET) < 0)
            return ferry__fail(FERRY_ERR_IO, "truncate of the download: %s", strerror(errno));
    }
    return FERRY_OK;
}
