/* Reading a large JSON record (a manifest-2 lists every tile of a version)
 * without building it whole: a DOM parser spends about 20 times the text
 * on small values, so 200 MB of "0," cost 4 GB before any field was
 * looked at (issue 23 item 15).  Here the text is only scanned (syntax
 * checked, nothing allocated); the small members are parsed as usual and
 * the large arrays are walked one element at a time, each element parsed
 * alone and bounded.  What is parsed is parsed by jansson: the scanner only
 * finds where values begin and end. */
#ifndef FERRY_SYNC_JSON_SPLIT_H
#define FERRY_SYNC_JSON_SPLIT_H

#include <jansson.h>
#include <stddef.h>

/* The bounds of the pieces of a manifest-2 or part record (lib/shard
 * parses them, lib/sync reads their links): the members other than the
 * lists, one part without its tiles (two cut lists of at most 4096), one
 * tile or object entry. */
#define FS_M2_TOP_MAX ((size_t)64 << 10)
#define FS_M2_PART_MAX ((size_t)256 << 10)
#define FS_M2_ELEM_MAX ((size_t)4 << 10)

/* A value's place in the text (len 0: absent). */
typedef struct fs_span {
    size_t off, len;
} fs_span;

/* Splits the JSON object text t[0, n): the members named in big (a NULL-
 * terminated list; their values must be arrays) are only located
 * (spans[i], offsets into t); every other member is parsed into *rest, a
 * new object, their values at most cap bytes of text in all.  The whole
 * text is checked to be one JSON object; duplicate names are refused.
 * Returns 0, or -1 with why (a sentence) filled. */
int ferry__sync_json_split(const char *t, size_t n, const char *const *big, fs_span *spans, size_t cap, json_t **rest,
                           char *why, size_t why_cap);

/* Walks the JSON array text t[0, n) (a span split found): *pos starts at
 * 0; each call gives the next element's span (offsets into t) and returns
 * 1, then 0 at the end; -1 when the array is malformed. */
int ferry__sync_json_next(const char *t, size_t n, size_t *pos, fs_span *el);

/* One element (or any value) of at most cap bytes, parsed: NULL (why
 * filled) if longer or not valid JSON. */
json_t *ferry__sync_json_load(const char *t, size_t n, size_t cap, char *why, size_t why_cap);

#endif
