/* Splitting a large JSON record into small parsed pieces (json_split.h).
 * The scanner follows RFC 8259's grammar for the structure, strings and
 * numbers; it allocates nothing and recurses at most JSON_DEPTH deep
 * (records nest four levels). */
#include "json_split.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define JSON_DEPTH 32

static int say(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int say(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return -1;
}

static void skip_ws(const char *t, size_t n, size_t *p)
{
    while (*p < n && (t[*p] == ' ' || t[*p] == '\t' || t[*p] == '\n' || t[*p] == '\r')) (*p)++;
}

static bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static int scan_string(const char *t, size_t n, size_t *p)
{
    size_t i = *p + 1;
    while (i < n) {
        unsigned char c = (unsigned char)t[i];
        if (c == '"') {
            *p = i + 1;
            return 0;
        }
        if (c < 0x20) return -1;
        if (c != '\\') {
            i++;
            continue;
        }
        if (i + 1 >= n) return -1;
        char e = t[i + 1];
        if (e == 'u') {
            if (n - i < 6 || !is_hex(t[i + 2]) || !is_hex(t[i + 3]) || !is_hex(t[i + 4]) || !is_hex(t[i + 5])) return -1;
            i += 6;
        } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
            i += 2;
        } else {
            return -1;
        }
    }
    return -1;
}

static int scan_number(const char *t, size_t n, size_t *p)
{
    size_t i = *p;
    if (i < n && t[i] == '-') i++;
    if (i >= n || !is_digit(t[i])) return -1;
    if (t[i] == '0') i++;
    else
        while (i < n && is_digit(t[i])) i++;
    if (i < n && t[i] == '.') {
        if (++i >= n || !is_digit(t[i])) return -1;
        while (i < n && is_digit(t[i])) i++;
    }
    if (i < n && (t[i] == 'e' || t[i] == 'E')) {
        if (++i < n && (t[i] == '+' || t[i] == '-')) i++;
        if (i >= n || !is_digit(t[i])) return -1;
        while (i < n && is_digit(t[i])) i++;
    }
    *p = i;
    return 0;
}

static int scan_value(const char *t, size_t n, size_t *p, int depth);

/* An object or array from its opening bracket. */
static int scan_container(const char *t, size_t n, size_t *p, int depth)
{
    char close = t[*p] == '{' ? '}' : ']';
    bool object = close == '}';
    if (depth > JSON_DEPTH) return -1;
    (*p)++;
    skip_ws(t, n, p);
    if (*p < n && t[*p] == close) {
        (*p)++;
        return 0;
    }
    for (;;) {
        if (object) {
            if (*p >= n || t[*p] != '"' || scan_string(t, n, p)) return -1;
            skip_ws(t, n, p);
            if (*p >= n || t[*p] != ':') return -1;
            (*p)++;
            skip_ws(t, n, p);
        }
        if (scan_value(t, n, p, depth + 1)) return -1;
        skip_ws(t, n, p);
        if (*p >= n) return -1;
        if (t[*p] == close) {
            (*p)++;
            return 0;
        }
        if (t[*p] != ',') return -1;
        (*p)++;
        skip_ws(t, n, p);
    }
}

static int scan_value(const char *t, size_t n, size_t *p, int depth)
{
    if (*p >= n) return -1;
    switch (t[*p]) {
    case '{':
    case '[': return scan_container(t, n, p, depth);
    case '"': return scan_string(t, n, p);
    case 't':
    case 'f':
    case 'n': {
        const char *w = t[*p] == 't' ? "true" : t[*p] == 'f' ? "false" : "null";
        size_t k = strlen(w);
        if (n - *p < k || memcmp(t + *p, w, k)) return -1;
        *p += k;
        return 0;
    }
    default: return scan_number(t, n, p);
    }
}

json_t *ferry__sync_json_load(const char *t, size_t n, size_t cap, char *why, size_t why_cap)
{
    if (n > cap) {
        say(why, why_cap, "a value of %zu bytes, over the bound of %zu", n, cap);
        return NULL;
    }
    json_error_t e;
    json_t *v = json_loadb(t, n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &e);
    if (!v) say(why, why_cap, "not valid JSON (%s)", e.text);
    return v;
}

int ferry__sync_json_split(const char *t, size_t n, const char *const *big, fs_span *spans, size_t cap, json_t **rest,
                           char *why, size_t why_cap)
{
    *rest = NULL;
    size_t nb = 0;
    while (big && big[nb]) spans[nb++] = (fs_span){0, 0};
    size_t p = 0, used = 0;
    skip_ws(t, n, &p);
    if (p >= n || t[p] != '{') return say(why, why_cap, "not valid JSON (not an object)");
    json_t *obj = json_object();
    if (!obj) return say(why, why_cap, "out of memory");
    p++;
    skip_ws(t, n, &p);
    bool empty = p < n && t[p] == '}';
    if (empty) p++;
    while (!empty) {
        size_t ks = p;
        if (p >= n || t[p] != '"' || scan_string(t, n, &p)) goto bad;
        size_t ke = p;
        skip_ws(t, n, &p);
        if (p >= n || t[p] != ':') goto bad;
        p++;
        skip_ws(t, n, &p);
        size_t vs = p;
        if (scan_value(t, n, &p, 1)) goto bad;
        json_error_t e;
        json_t *k = json_loadb(t + ks, ke - ks, JSON_DECODE_ANY, &e);
        const char *name = json_string_value(k);
        if (!name || strlen(name) != json_string_length(k)) {
            json_decref(k);
            json_decref(obj);
            return say(why, why_cap, "not valid JSON (a member name at byte %zu)", ks);
        }
        size_t bi = 0;
        while (bi < nb && strcmp(name, big[bi])) bi++;
        int rc = 0;
        if (bi < nb) {
            if (spans[bi].len) rc = say(why, why_cap, "member '%s' given twice", name);
            else if (t[vs] != '[') rc = say(why, why_cap, "member '%s' is not an array", name);
            else spans[bi] = (fs_span){vs, p - vs};
        } else if (json_object_get(obj, name)) {
            rc = say(why, why_cap, "member '%.100s' given twice", name);
        } else if (p - vs > cap - used) {
            rc = say(why, why_cap, "its members other than the lists take more than %zu bytes", cap);
        } else {
            used += p - vs;
            json_t *v = ferry__sync_json_load(t + vs, p - vs, cap, why, why_cap);
            if (!v || json_object_set_new(obj, name, v)) rc = -1;
        }
        json_decref(k);
        if (rc) {
            json_decref(obj);
            return rc;
        }
        skip_ws(t, n, &p);
        if (p < n && t[p] == ',') {
            p++;
            skip_ws(t, n, &p);
            continue;
        }
        if (p < n && t[p] == '}') {
            p++;
            break;
        }
        goto bad;
    }
    skip_ws(t, n, &p);
    if (p != n) {
        json_decref(obj);
        return say(why, why_cap, "not valid JSON (bytes after the object, at byte %zu)", p);
    }
    *rest = obj;
    return 0;
bad:
    json_decref(obj);
    return say(why, why_cap, "not valid JSON (at byte %zu)", p);
}

int ferry__sync_json_next(const char *t, size_t n, size_t *pos, fs_span *el)
{
    size_t p = *pos;
    if (p == (size_t)-1) return 0;
    if (!p) { /* the opening bracket */
        skip_ws(t, n, &p);
        if (p >= n || t[p] != '[') return -1;
        p++;
        skip_ws(t, n, &p);
        if (p < n && t[p] == ']') {
            *pos = (size_t)-1;
            return 0;
        }
    } else { /* after an element */
        skip_ws(t, n, &p);
        if (p >= n) return -1;
        if (t[p] == ']') {
            *pos = (size_t)-1;
            return 0;
        }
        if (t[p] != ',') return -1;
        p++;
        skip_ws(t, n, &p);
    }
    size_t s = p;
    if (scan_value(t, n, &p, 1)) return -1;
    *el = (fs_span){s, p - s};
    *pos = p;
    return 1;
}
