/* A small, strict XML scanner and the parsers of S3's answers
 * (ListObjectsV2 pages, InitiateMultipartUpload, CompleteMultipartUpload,
 * errors).
 *
 * The scanner handles what S3 and its imitations send: a declaration,
 * elements with attributes, text with the five named entities and numeric
 * references, comments, CDATA.  It refuses DOCTYPE (so no entity expansion),
 * unbalanced or mismatched tags, nesting deeper than XML_DEPTH and a second
 * root.  It never allocates: text is decoded into caller buffers of fixed
 * size, and a field that does not fit is an error, not a truncation. */

#include "store_impl.h"

#include <stdio.h>

#define XML_DEPTH 32
#define TEXT_CAP 8192

enum { T_EOF, T_START, T_END, T_TEXT, T_ERR };

typedef struct xml {
    const char *start, *p, *end;
    int depth;
    int pending_end;     /* a self-closing tag still owes its END */
    int root_done;
    const char *names[XML_DEPTH];
    size_t lens[XML_DEPTH];
    char err[96];
} xml;

typedef struct tok {
    int type;
    const char *s;       /* name (START/END) or raw text */
    size_t n;
    int cdata;           /* text taken verbatim */
} tok;

static int is_name_start(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c == ':'; }
static int is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.'; }
static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

static int xerr(xml *x, tok *t, const char *why)
{
    if (!x->err[0]) snprintf(x->err, sizeof x->err, "%s at byte %zu", why, (size_t)(x->p - x->start));
    t->type = T_ERR;
    return T_ERR;
}

static const char *find(const char *p, const char *end, const char *pat)
{
    size_t n = strlen(pat);
    for (; (size_t)(end - p) >= n; p++)
        if (!memcmp(p, pat, n)) return p;
    return NULL;
}

static int next(xml *x, tok *t)
{
    memset(t, 0, sizeof *t);
    if (x->pending_end) {
        x->pending_end = 0;
        x->depth--;
        t->type = T_END;
        t->s = x->names[x->depth];
        t->n = x->lens[x->depth];
        if (!x->depth) x->root_done = 1;
        return T_END;
    }
    for (;;) {
        if (x->p >= x->end) {
            if (x->depth) return xerr(x, t, "document ends inside an element");
            if (!x->root_done) return xerr(x, t, "no root element");
            return t->type = T_EOF;
        }
        const char *p = x->p;
        if (*p != '<') {
            const char *q = memchr(p, '<', (size_t)(x->end - p));
            if (!q) q = x->end;
            x->p = q;
            if (!x->depth) {
                for (const char *c = p; c < q; c++)
                    if (!is_space(*c)) return xerr(x, t, "text outside the root element");
                continue;
            }
            t->type = T_TEXT;
            t->s = p;
            t->n = (size_t)(q - p);
            return T_TEXT;
        }
        size_t left = (size_t)(x->end - p);
        if (left >= 2 && p[1] == '?') {
            const char *q = find(p + 2, x->end, "?>");
            if (!q) return xerr(x, t, "unterminated processing instruction");
            x->p = q + 2;
            continue;
        }
        if (left >= 4 && !memcmp(p, "<!--", 4)) {
            const char *q = find(p + 4, x->end, "-->");
            if (!q) return xerr(x, t, "unterminated comment");
            x->p = q + 3;
            continue;
        }
        if (left >= 9 && !memcmp(p, "<![CDATA[", 9)) {
            if (!x->depth) return xerr(x, t, "CDATA outside the root element");
            const char *q = find(p + 9, x->end, "]]>");
            if (!q) return xerr(x, t, "unterminated CDATA");
            x->p = q + 3;
            t->type = T_TEXT;
            t->s = p + 9;
            t->n = (size_t)(q - p - 9);
            t->cdata = 1;
            return T_TEXT;
        }
        if (left >= 2 && p[1] == '!') return xerr(x, t, "DOCTYPE or unknown declaration");
        if (left >= 2 && p[1] == '/') {
            const char *q = p + 2;
            const char *name = q;
            while (q < x->end && is_name_char(*q)) q++;
            size_t nl = (size_t)(q - name);
            while (q < x->end && is_space(*q)) q++;
            if (q >= x->end || *q != '>' || !nl) return xerr(x, t, "malformed end tag");
            if (!x->depth || x->lens[x->depth - 1] != nl || memcmp(x->names[x->depth - 1], name, nl))
                return xerr(x, t, "mismatched end tag");
            x->depth--;
            if (!x->depth) x->root_done = 1;
            x->p = q + 1;
            t->type = T_END;
            t->s = name;
            t->n = nl;
            return T_END;
        }
        /* start tag */
        const char *q = p + 1;
        if (q >= x->end || !is_name_start(*q)) return xerr(x, t, "malformed tag");
        const char *name = q;
        while (q < x->end && is_name_char(*q)) q++;
        size_t nl = (size_t)(q - name);
        for (;;) { /* attributes are skipped, but must be well-formed */
            while (q < x->end && is_space(*q)) q++;
            if (q >= x->end) return xerr(x, t, "unterminated tag");
            if (*q == '>' || *q == '/') break;
            if (!is_name_start(*q)) return xerr(x, t, "malformed attribute");
            while (q < x->end && is_name_char(*q)) q++;
            while (q < x->end && is_space(*q)) q++;
            if (q >= x->end || *q != '=') return xerr(x, t, "attribute without value");
            q++;
            while (q < x->end && is_space(*q)) q++;
            if (q >= x->end || (*q != '"' && *q != '\'')) return xerr(x, t, "unquoted attribute");
            const char *close = memchr(q + 1, *q, (size_t)(x->end - q - 1));
            if (!close) return xerr(x, t, "unterminated attribute");
            q = close + 1;
        }
        int self = *q == '/';
        if (self && (q + 1 >= x->end || q[1] != '>')) return xerr(x, t, "malformed empty tag");
        if (x->root_done) return xerr(x, t, "second root element");
        if (x->depth >= XML_DEPTH) return xerr(x, t, "elements nested too deep");
        x->names[x->depth] = name;
        x->lens[x->depth] = nl;
        x->depth++;
        x->pending_end = self;
        x->p = q + (self ? 2 : 1);
        t->type = T_START;
        t->s = name;
        t->n = nl;
        return T_START;
    }
}

static int name_is(const tok *t, const char *name) { return t->n == strlen(name) && !memcmp(t->s, name, t->n); }

static int put_utf8(char *out, size_t cap, size_t *len, uint32_t cp)
{
    char b[4];
    size_t n;
    if (cp < 0x80) { b[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { b[0] = (char)(0xC0 | cp >> 6); b[1] = (char)(0x80 | (cp & 63)); n = 2; }
    else if (cp < 0x10000) {
        b[0] = (char)(0xE0 | cp >> 12); b[1] = (char)(0x80 | ((cp >> 6) & 63)); b[2] = (char)(0x80 | (cp & 63)); n = 3;
    } else {
        b[0] = (char)(0xF0 | cp >> 18); b[1] = (char)(0x80 | ((cp >> 12) & 63));
        b[2] = (char)(0x80 | ((cp >> 6) & 63)); b[3] = (char)(0x80 | (cp & 63)); n = 4;
    }
    if (*len + n >= cap) return -1;
    memcpy(out + *len, b, n);
    *len += n;
    out[*len] = 0;
    return 0;
}

/* Appends decoded text to out (NUL-kept); -1 if malformed or too long. */
static int decode(const tok *t, char *out, size_t cap, size_t *len)
{
    const char *p = t->s, *end = t->s + t->n;
    if (t->cdata) {
        if (*len + t->n >= cap) return -1;
        memcpy(out + *len, p, t->n);
        *len += t->n;
        out[*len] = 0;
        return 0;
    }
    while (p < end) {
        if (*p != '&') {
            if (*len + 1 >= cap) return -1;
            out[(*len)++] = *p++;
            out[*len] = 0;
            continue;
        }
        const char *semi = memchr(p, ';', (size_t)(end - p));
        if (!semi || semi - p > 12) return -1;
        size_t n = (size_t)(semi - p - 1);
        const char *e = p + 1;
        uint32_t cp;
        if (n == 2 && !memcmp(e, "lt", 2)) cp = '<';
        else if (n == 2 && !memcmp(e, "gt", 2)) cp = '>';
        else if (n == 3 && !memcmp(e, "amp", 3)) cp = '&';
        else if (n == 4 && !memcmp(e, "quot", 4)) cp = '"';
        else if (n == 4 && !memcmp(e, "apos", 4)) cp = '\'';
        else if (n >= 2 && e[0] == '#') {
            int hexa = e[1] == 'x' || e[1] == 'X';
            size_t i = hexa ? 2 : 1;
            if (i >= n) return -1;
            cp = 0;
            for (; i < n; i++) {
                char c = e[i];
                unsigned d;
                if (c >= '0' && c <= '9') d = (unsigned)(c - '0');
                else if (hexa && c >= 'a' && c <= 'f') d = (unsigned)(c - 'a' + 10);
                else if (hexa && c >= 'A' && c <= 'F') d = (unsigned)(c - 'A' + 10);
                else return -1;
                cp = cp * (hexa ? 16u : 10u) + d;
                if (cp > 0x10FFFF) return -1;
            }
            if (cp == 0 || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
        } else {
            return -1;
        }
        if (put_utf8(out, cap, len, cp)) return -1;
        p = semi + 1;
    }
    return 0;
}

static int corrupt(const char *what, const xml *x)
{
    return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed %s: %s", what, x->err[0] ? x->err : "bad structure");
}

/* ---------------------------------------------------------------------
 * ListObjectsV2
 * ------------------------------------------------------------------- */

enum { F_NONE, F_KEY, F_SIZE, F_ETAG, F_MTIME, F_TRUNC, F_TOKEN };

int ferry__s3_parse_list(const char *doc, size_t n, ferry__s3_page *page,
                         int (*each)(void *ctx, const ferry__s3_entry *e), void *ctx)
{
    xml x = {.start = doc, .p = doc, .end = doc + n};
    tok t;
    char text[TEXT_CAP];
    size_t tl = 0;
    int field = F_NONE, in_contents = 0, seen_trunc = 0, seen_token = 0;
    unsigned seen = 0; /* bits of F_* seen in this <Contents> */
    ferry__s3_entry e;
    memset(page, 0, sizeof *page);
    int first = 1;
    for (;;) {
        int ty = next(&x, &t);
        if (ty == T_ERR) return corrupt("listing", &x);
        if (ty == T_EOF) break;
        if (first) {
            if (ty != T_START || !name_is(&t, "ListBucketResult"))
                return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed listing: root is not ListBucketResult");
            first = 0;
            continue;
        }
        if (ty == T_START) {
            if (field != F_NONE) return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed listing: element inside a field");
            int f = F_NONE;
            if (x.depth == 2 && name_is(&t, "Contents")) {
                in_contents = 1;
                seen = 0;
                memset(&e, 0, sizeof e);
            } else if (x.depth == 2 && name_is(&t, "IsTruncated")) {
                f = F_TRUNC;
            } else if (x.depth == 2 && name_is(&t, "NextContinuationToken")) {
                f = F_TOKEN;
            } else if (x.depth == 3 && in_contents) {
                if (name_is(&t, "Key")) f = F_KEY;
                else if (name_is(&t, "Size")) f = F_SIZE;
                else if (name_is(&t, "ETag")) f = F_ETAG;
                else if (name_is(&t, "LastModified")) f = F_MTIME;
            }
            if (f != F_NONE) {
                if (f <= F_MTIME && (seen & (1u << f)))
                    return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed listing: a field repeats in <Contents>");
                if ((f == F_TRUNC && seen_trunc++) || (f == F_TOKEN && seen_token++))
                    return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed listing: a page field repeats");
                field = f;
                tl = 0;
                text[0] = 0;
            }
            continue;
        }
        if (ty == T_TEXT) {
            if (field != F_NONE && decode(&t, text, sizeof text, &tl))
                return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed listing: bad or overlong text");
            continue;
        }
        /* T_END */
        if (field != F_NONE) {
            switch (field) {
            case F_KEY:
                if (!tl || tl >= sizeof e.key || strlen(text) != tl)
                    return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed listing: empty or overlong Key");
                memcpy(e.key, text, tl + 1);
                e.key_len = tl;
                break;
            case F_SIZE:
                if (ferry__parse_u64(text, tl, &e.st.size))
                    return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed listing: Size '%.40s' is not a number", text);
                break;
            case F_ETAG:
                if (ferry__etag_clean(text, tl, e.st.etag))
                    return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed listing: bad ETag");
                break;
            case F_MTIME: {
                int64_t m = ferry__parse_iso8601(text, tl);
                e.st.mtime = m > 0 ? m : 0; /* lenient: an odd date is not worth failing a listing */
                break;
            }
            case F_TRUNC:
                if (!strcmp(text, "true")) page->truncated = 1;
                else if (strcmp(text, "false"))
                    return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed listing: IsTruncated '%.20s'", text);
                break;
            case F_TOKEN:
                if (!tl || tl >= sizeof page->next_token)
                    return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed listing: empty or overlong continuation token");
                for (size_t i = 0; i < tl; i++)
                    if ((unsigned char)text[i] <= 0x20 || (unsigned char)text[i] >= 0x7f)
                        return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed listing: continuation token has byte 0x%02x",
                                           (unsigned char)text[i]);
                memcpy(page->next_token, text, tl + 1);
                break;
            }
            if (field <= F_MTIME) seen |= 1u << field;
            field = F_NONE;
            continue;
        }
        if (in_contents && x.depth == 1) { /* </Contents> */
            in_contents = 0;
            if (!(seen & (1u << F_KEY)) || !(seen & (1u << F_SIZE)))
                return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed listing: <Contents> without Key or Size");
            int rc = each(ctx, &e);
            if (rc) return rc;
        }
    }
    if (page->truncated && !page->next_token[0])
        return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed listing: truncated page without NextContinuationToken");
    return FERRY_OK;
}

/* ---------------------------------------------------------------------
 * Single fields
 * ------------------------------------------------------------------- */

int ferry__xml_root(const char *doc, size_t n, char *out, size_t cap)
{
    xml x = {.start = doc, .p = doc, .end = doc + n};
    tok t;
    int ty = next(&x, &t);
    if (ty != T_START) return corrupt("XML answer", &x);
    if (t.n >= cap) return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed XML answer: root name too long");
    memcpy(out, t.s, t.n);
    out[t.n] = 0;
    return FERRY_OK;
}

int ferry__xml_child_text(const char *doc, size_t n, const char *root, const char *name, char *out, size_t cap)
{
    xml x = {.start = doc, .p = doc, .end = doc + n};
    tok t;
    size_t len = 0;
    int first = 1, in = 0, in_depth = 0;
    out[0] = 0;
    for (;;) {
        int ty = next(&x, &t);
        if (ty == T_ERR) return corrupt("XML answer", &x);
        if (ty == T_EOF) break;
        if (first) {
            if (ty != T_START || !name_is(&t, root)) return FERRY_ERR_NOT_FOUND;
            first = 0;
            continue;
        }
        if (ty == T_START && !in && x.depth == 2 && name_is(&t, name)) {
            in = 1;
            in_depth = x.depth;
        } else if (ty == T_TEXT && in) {
            if (decode(&t, out, cap, &len))
                return ferry__fail(FERRY_ERR_STORE_CORRUPT, "malformed XML answer: bad or overlong <%s>", name);
        } else if (ty == T_END && in && x.depth == in_depth - 1) {
            return FERRY_OK;
        }
    }
    return FERRY_ERR_NOT_FOUND;
}
