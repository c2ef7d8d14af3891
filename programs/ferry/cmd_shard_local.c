/* An island whose slices live in one .safetensors file, PATH, with its
 * state beside it, PATH.ferry.json (format "ferry-shard-local-1"): the
 * run, the slices, and the version PATH holds with its id and the model
 * hash of PATH as written.  The next call gives the slices back to the
 * library (ferry_shard_subscriber_resume, which checks every tile against
 * the version's manifest) and fetches only the deltas from there.
 *
 * As ferry pull's local state (lib/sync/local.c): two files cannot be
 * replaced together, so the state names the old and the new version
 * ("current" and "pending") around the rename of PATH, and the version
 * PATH holds is decided by its model hash.  PATH is written aside and
 * renamed (ferry_model_save); a failed or interrupted pull leaves PATH and
 * its state as they were.  Beside an existing PATH, a state file that
 * does not parse, names another run or other slices, or whose versions
 * PATH matches neither is an error (nothing is overwritten): it is never
 * guessed around.  Without PATH the state describes nothing and is
 * written anew. */
#include "cmd_shard.h"

#ifndef FERRY_NO_NET
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

#define STATE_FORMAT "ferry-shard-local-1"
#define STATE_MAX ((size_t)64 << 20)

typedef struct held {
    uint64_t version;
    char id[FERRY_SYNC_ID_LEN + 1];
    uint8_t hash[16];
} held;

static void note(const shard_out *o, const sync_common *c, const char *fmt, const char *a)
{
    if (c->quiet) return;
    fprintf(stderr, "ferry %s: ", o->cmd);
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
}

static int fail_msg(const shard_out *o, int status, const char *fmt, const char *a, const char *b)
{
    sync_progress_end();
    fprintf(stderr, "ferry %s: ", o->cmd);
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return status;
}

/* ---- the output tensors ---- */

static void out_name(char *buf, size_t cap, const shard_out *o, size_t i, uint64_t rows, uint64_t cols)
{
    const ferry_shard_region *r = &o->rg[i];
    if (o->whole) snprintf(buf, cap, "%s", r->name);
    else
        snprintf(buf, cap, "%s@%llu:%llu,%llu:%llu", r->name, (unsigned long long)r->row_begin, (unsigned long long)(r->row_begin + rows),
                 (unsigned long long)r->col_begin, (unsigned long long)(r->col_begin + cols));
}

/* ---- the state file ---- */

static void state_path(char *buf, size_t cap, const char *path) { snprintf(buf, cap, "%s.ferry.json", path); }

static json_t *held_json(const held *h)
{
    if (!h || !h->version) return json_null();
    char hx[33];
    hex16(hx, h->hash);
    return json_pack("{s:I,s:s,s:s}", "version", (json_int_t)h->version, "id", h->id, "hash", hx);
}

static bool hex_byte(const char *s, uint8_t *out)
{
    unsigned v = 0;
    for (int k = 0; k < 2; k++) {
        char ch = s[k];
        v <<= 4;
        if (ch >= '0' && ch <= '9') v |= (unsigned)(ch - '0');
        else if (ch >= 'a' && ch <= 'f') v |= (unsigned)(ch - 'a' + 10);
        else return false;
    }
    *out = (uint8_t)v;
    return true;
}

static bool held_parse(json_t *o, held *h)
{
    memset(h, 0, sizeof *h);
    if (json_is_null(o)) return true;
    json_t *v = json_object_get(o, "version");
    const char *id = json_string_value(json_object_get(o, "id")), *hx = json_string_value(json_object_get(o, "hash"));
    if (!json_is_object(o) || !json_is_integer(v) || json_integer_value(v) < 1 || !id || !*id || strlen(id) > FERRY_SYNC_ID_LEN || !hx ||
        strlen(hx) != 32)
        return false;
    for (int k = 0; k < 16; k++)
        if (!hex_byte(hx + 2 * k, &h->hash[k])) return false;
    h->version = (uint64_t)json_integer_value(v);
    snprintf(h->id, sizeof h->id, "%s", id);
    return true;
}

/* The slices as given (an edge is 0), so that the next call with the same
 * options matches whatever the tensor's size. */
static json_t *slices_json(const shard_out *o)
{
    json_t *a = json_array();
    for (size_t i = 0; i < o->n && a; i++) {
        const ferry_shard_region *r = &o->rg[i];
        json_array_append_new(a, json_pack("{s:s,s:[I,I],s:[I,I]}", "tensor", r->name, "rows", (json_int_t)r->row_begin,
                                           (json_int_t)r->row_end, "cols", (json_int_t)r->col_begin, (json_int_t)r->col_end));
    }
    return a;
}

static bool slices_match(const shard_out *o, json_t *a)
{
    if (!json_is_array(a) || json_array_size(a) != o->n) return false;
    for (size_t i = 0; i < o->n; i++) {
        json_t *e = json_array_get(a, i), *rows = json_object_get(e, "rows"), *cols = json_object_get(e, "cols");
        const char *t = json_string_value(json_object_get(e, "tensor"));
        const ferry_shard_region *r = &o->rg[i];
        if (!t || strcmp(t, r->name) || json_array_size(rows) != 2 || json_array_size(cols) != 2) return false;
        json_t *v[4] = {json_array_get(rows, 0), json_array_get(rows, 1), json_array_get(cols, 0), json_array_get(cols, 1)};
        uint64_t want[4] = {r->row_begin, r->row_end, r->col_begin, r->col_end};
        for (int k = 0; k < 4; k++)
            if (!json_is_integer(v[k]) || (uint64_t)json_integer_value(v[k]) != want[k]) return false;
    }
    return true;
}

static int fsync_dir(const char *path)
{
    char *dup = strdup(path);
    if (!dup) return -1;
    int fd = open(dirname(dup), O_RDONLY | O_DIRECTORY);
    free(dup);
    if (fd < 0) return -1;
    int r = fsync(fd);
    close(fd);
    return r;
}

bool shard_state_is_ours(const char *path)
{
    char sp[4200];
    state_path(sp, sizeof sp, path);
    struct stat st;
    if (lstat(sp, &st) || !S_ISREG(st.st_mode)) return false;
    void *text = NULL;
    size_t n = 0;
    if (ferry_file_read(sp, STATE_MAX, &text, &n)) return false;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, NULL);
    ferry_free(text);
    const char *fmt = json_string_value(json_object_get(root, "format"));
    bool ours = fmt && !strcmp(fmt, STATE_FORMAT);
    json_decref(root);
    return ours;
}

/* Writes the state aside (PATH.ferry.json.tmp.PID), fsyncs it and renames it. */
static int state_write(const shard_out *o, const sync_common *c, const held *cur, const held *pending)
{
    char sp[4200], tmp[4300];
    state_path(sp, sizeof sp, o->path);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", sp, (long)getpid());
    json_t *root = json_pack("{s:s,s:s,s:b,s:o,s:o,s:o}", "format", STATE_FORMAT, "run", c->run, "whole", o->whole, "slices",
                             slices_json(o), "current", held_json(cur), "pending", held_json(pending));
    char *text = root ? json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text) return fail_msg(o, SYNC_EXIT_FAIL, "%s: cannot serialise the state%s", sp, "");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
    size_t n = strlen(text), done = 0;
    int err = fd < 0 ? errno : 0;
    while (!err && done < n) {
        ssize_t w = write(fd, text + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) err = w < 0 ? errno : EIO;
        else done += (size_t)w;
    }
    if (!err && fsync(fd)) err = errno;
    if (fd >= 0 && close(fd) && !err) err = errno;
    free(text);
    if (!err && rename(tmp, sp)) err = errno;
    if (!err) fsync_dir(sp);
    if (err) {
        unlink(tmp);
        return fail_msg(o, SYNC_EXIT_FAIL, "%s: cannot write the state: %s", sp, strerror(err));
    }
    return 0;
}

/* An existing PATH (or its state) must be a regular file: a device,
 * FIFO, directory or symbolic link is refused, never replaced. */
static int check_regular(const shard_out *o, const char *p, bool *exists)
{
    struct stat st;
    *exists = false;
    if (lstat(p, &st)) {
        if (errno == ENOENT) return 0;
        return fail_msg(o, SYNC_EXIT_FAIL, "%s: %s", p, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) return fail_msg(o, SYNC_EXIT_FAIL, "%s: %s", p, "not a regular file (refused, left as it is)");
    *exists = true;
    return 0;
}

/* Reads PATH and its state: *m (PATH opened) and *h (the version it holds)
 * when both are there and agree; neither when PATH or the state is absent. */
static int state_load(const shard_out *o, const sync_common *c, ferry_model **m, held *h)
{
    char sp[4200];
    state_path(sp, sizeof sp, o->path);
    *m = NULL;
    memset(h, 0, sizeof *h);
    bool have_path, have_state;
    int st = check_regular(o, o->path, &have_path);
    if (!st) st = check_regular(o, sp, &have_state);
    if (st) return st;
    ferry_sync_local_clean(o->path); /* what killed writers left beside PATH */
    /* a PATH without state is replaced by a complete version; a state
       without PATH describes nothing (PATH removed): written anew */
    if (!have_state || !have_path) return 0;
    void *text = NULL;
    size_t n = 0;
    int rc = ferry_file_read(sp, STATE_MAX, &text, &n);
    if (rc) return fail_msg(o, SYNC_EXIT_FAIL, "%s: cannot read the state: %s", sp, ferry_last_error());
    json_error_t err;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &err);
    ferry_free(text);
    const char *fmt = json_string_value(json_object_get(root, "format"));
    const char *run = json_string_value(json_object_get(root, "run"));
    held cur, pend;
    const char *bad = NULL;
    char why[300];
    if (!root) {
        snprintf(why, sizeof why, "not valid JSON (line %d: %s)", err.line, err.text);
        bad = why;
    } else if (fmt && !strcmp(fmt, "ferry-local-1")) bad = "the state of a single-rank ferry pull, not of a sharded run";
    else if (!fmt || strcmp(fmt, STATE_FORMAT)) bad = "not a " STATE_FORMAT " state";
    else if (!run || !json_is_boolean(json_object_get(root, "whole")))
        bad = "malformed (run, whole)";
    else if (strcmp(run, c->run)) {
        snprintf(why, sizeof why, "the state of run '%.200s', not '%.60s'", run, c->run);
        bad = why;
    } else if (json_is_true(json_object_get(root, "whole")) != o->whole || !slices_match(o, json_object_get(root, "slices")))
        bad = o->whole ? "holds slices, not the whole model" : "holds other slices than the --slice options given";
    else if (!held_parse(json_object_get(root, "current"), &cur) || !held_parse(json_object_get(root, "pending"), &pend))
        bad = "malformed version record (current, pending)";
    json_decref(root);
    if (bad) return fail_msg(o, SYNC_EXIT_FAIL, "%s: %s: remove it (and the file beside it) to pull from scratch", sp, bad);
    if (!cur.version && !pend.version) return 0;
    if ((rc = ferry_model_open(o->path, m)))
        return fail_msg(o, SYNC_EXIT_FAIL, "%s: its state says it holds a version, but it does not open: %s", o->path, ferry_last_error());
    uint8_t hash[16];
    if ((rc = ferry_model_hash(*m, hash))) {
        ferry_model_free(*m);
        *m = NULL;
        return sync_fail(o->cmd, rc, o->path);
    }
    if (cur.version && !memcmp(hash, cur.hash, 16)) *h = cur;
    else if (pend.version && !memcmp(hash, pend.hash, 16)) *h = pend;
    else {
        ferry_model_free(*m);
        *m = NULL;
        return fail_msg(o, SYNC_EXIT_FAIL, "%s: matches neither version its state %s records (changed since?): remove both to pull from "
                        "scratch", o->path, sp);
    }
    return 0;
}

/* Gives the handle the slices PATH holds; 0 when resumed or when a cold
 * pull is the way (a version gone, slices off the tile edges), else an
 * exit status. */
static int resume(const shard_out *o, const sync_common *c, ferry_shard_subscriber *s, const ferry_model *m, const held *h,
                  uint64_t *bytes)
{
    const void **data = calloc(o->n + 1, sizeof *data);
    size_t *sizes = calloc(o->n + 1, sizeof *sizes);
    int ret = 0;
    if (!data || !sizes) ret = fail_msg(o, SYNC_EXIT_FAIL, "%s%s: out of memory", o->path, "");
    for (size_t i = 0; i < o->n && !ret; i++) {
        const ferry_shard_region *r = &o->rg[i];
        const ferry_tensor *t = NULL;
        if (o->whole) {
            t = ferry_model_find(m, r->name);
        } else { /* NAME@R0:R1,C0:C1, its bounds as written */
            size_t ln = strlen(r->name);
            for (size_t k = 0; k < ferry_model_count(m) && !t; k++) {
                const ferry_tensor *x = ferry_model_tensor(m, k);
                char want[FERRY_MAX_NAME + 128];
                if (x->ndim != 2 || strncmp(x->name, r->name, ln) || x->name[ln] != '@') continue;
                out_name(want, sizeof want, o, i, x->shape[0], x->shape[1]);
                if (!strcmp(want, x->name)) t = x;
            }
        }
        if (!t) {
            ret = fail_msg(o, SYNC_EXIT_FAIL, "%s: holds no tensor for slice '%s' (changed since its state was written?)", o->path, r->name);
            break;
        }
        data[i] = t->data;
        sizes[i] = (size_t)t->nbytes;
    }
    if (!ret) {
        int rc = ferry_shard_subscriber_resume(s, h->version, h->id, data, sizes, bytes);
        if (rc == FERRY_ERR_SYNC_GONE || rc == FERRY_ERR_SHARD_REGION || rc == FERRY_ERR_ARG) {
            note(o, c, "%s: pulling from scratch", ferry_last_error());
        } else if (rc) {
            ret = sync_fail(o->cmd, rc, o->path);
        }
    }
    free(data);
    free(sizes);
    return ret;
}

/* ---- writing PATH ---- */

/* Writes the slices as held to PATH (aside, then renamed), with the
 * state around it; *h becomes the version written. */
static int write_out(const shard_out *o, const sync_common *c, ferry_shard_subscriber *s, held *h)
{
    ferry_model *m = NULL;
    void **bufs = calloc(o->n + 1, sizeof *bufs);
    int rc = bufs ? ferry_model_create(&m) : FERRY_ERR_NOMEM;
    for (size_t i = 0; i < o->n && !rc; i++) {
        ferry_dtype dt;
        uint64_t rows, cols, nb;
        if ((rc = ferry_shard_region_shape(s, i, &dt, &rows, &cols, &nb))) break;
        if (!(bufs[i] = malloc(nb ? nb : 1))) {
            rc = FERRY_ERR_NOMEM;
            break;
        }
        char name[FERRY_MAX_NAME + 128];
        out_name(name, sizeof name, o, i, rows, cols);
        uint64_t shape2[2] = {rows, cols};
        const uint64_t *shape = o->whole ? o->tensors[i].shape : shape2;
        uint32_t ndim = o->whole ? o->tensors[i].ndim : 2;
        if (!(rc = ferry_shard_region_copy(s, i, bufs[i], nb))) rc = ferry_model_add(m, name, dt, ndim, shape, bufs[i], nb, FERRY_ADD_BORROW);
    }
    held nw = {0};
    int ret = 0;
    if (!rc) rc = ferry_model_hash(m, nw.hash);
    if (rc) ret = sync_fail(o->cmd, rc, o->path);
    if (!ret) {
        nw.version = ferry_shard_subscriber_version(s);
        ferry_shard_subscriber_held_id(s, nw.id);
        ret = state_write(o, c, h, &nw);
    }
    if (!ret) {
        if ((rc = ferry_model_save(m, o->path))) {
            ret = sync_fail(o->cmd, rc, o->path);
            state_write(o, c, h, NULL); /* back to what PATH holds */
        } else if (!(ret = state_write(o, c, &nw, NULL))) {
            *h = nw;
        }
    }
    ferry_model_free(m);
    for (size_t i = 0; bufs && i < o->n; i++) free(bufs[i]);
    free(bufs);
    return ret;
}

/* ---- reporting ---- */

static void print_pull(const shard_out *o, const sync_common *c, const ferry_shard_pull_info *in, unsigned used)
{
    if (used && !c->quiet && o->fallback) fprintf(stderr, "ferry %s: served by the fallback %s\n", o->cmd, o->fallback[used - 1]);
    if (c->json) {
        /* ferry pull's keys (path = the file, route) for a whole model;
           shard-pull's (path = the route, out = the file) for slices */
        printf("{");
        if (o->path) {
            printf("\"%s\": ", o->whole ? "path" : "out");
            json_str(stdout, o->path);
            printf(", ");
        }
        printf("\"run\": ");
        json_str(stdout, c->run);
        printf(", \"from_version\": %llu, \"version\": %llu, \"head\": %llu, \"%s\": ", (unsigned long long)in->from_version,
               (unsigned long long)in->to_version, (unsigned long long)in->head_version, o->whole ? "route" : "path");
        json_str(stdout, in->path);
        printf(", \"bytes_fetched\": %llu, \"object_bytes\": %llu, \"manifest_bytes\": %llu, \"version_bytes\": %llu, "
               "\"requests\": %llu, \"tiles\": %llu%s}\n",
               (unsigned long long)in->bytes_fetched, (unsigned long long)in->object_bytes, (unsigned long long)in->manifest_bytes,
               (unsigned long long)in->version_bytes, (unsigned long long)in->requests, (unsigned long long)in->tiles,
               o->whole ? ", \"sharded\": true" : "");
    } else if (!c->quiet) {
        const char *who = o->path ? o->path : "";
        if (in->from_version == in->to_version && !in->tiles)
            printf("%s%srun %s: version %llu (up to date; %llu manifest bytes)\n", who, *who ? ": " : "", c->run,
                   (unsigned long long)in->to_version, (unsigned long long)in->manifest_bytes);
        else
            printf("%s%srun %s: version %llu (from %llu by %s): %llu tile bytes in %llu ranged GETs (%.1f%% of the versions' %llu), "
                   "%llu manifest bytes\n",
                   who, *who ? ": " : "", c->run, (unsigned long long)in->to_version, (unsigned long long)in->from_version, in->path,
                   (unsigned long long)in->object_bytes, (unsigned long long)in->requests,
                   in->version_bytes ? 100.0 * (double)in->object_bytes / (double)in->version_bytes : 0.0,
                   (unsigned long long)in->version_bytes, (unsigned long long)in->manifest_bytes);
    }
    fflush(stdout);
}


/* ---- the pull ---- */

int shard_out_run(const sync_common *c, ferry_shard_subscriber *s, const shard_out *o)
{
    held h = {0};
    int ret = 0;
    uint64_t resume_bytes = 0; /* the held version's manifest, counted with the first pull */
    if (o->path) {
        ferry_model *m = NULL;
        if ((ret = state_load(o, c, &m, &h))) return ret;
        if (m) ret = resume(o, c, s, m, &h, &resume_bytes);
        ferry_model_free(m);
        if (ret) return ret;
        if (!ferry_shard_subscriber_version(s)) h.version = 0; /* not resumed: PATH's version is only what it holds */
    }
    int mode = o->mode;
    uint64_t ver = o->version;
    double last_new = cli_now();
    uint64_t errors = 0;
    for (;;) {
        ferry_shard_pull_info in;
        int rc = ferry_shard_pull(s, mode, ver, &in);
        sync_progress_end();
        in.bytes_fetched += resume_bytes; /* until a pull is reported */
        in.manifest_bytes += resume_bytes;
        uint64_t now_v = ferry_shard_subscriber_version(s);
        if (!rc) {
            errors = 0;
            bool moved = !o->path ? in.to_version != in.from_version || in.tiles : now_v != h.version;
            if (o->path && moved && (ret = write_out(o, c, s, &h))) return ret;
            if (moved || !o->follow) {
                print_pull(o, c, &in, ferry_shard_subscriber_store_used(s));
                resume_bytes = 0;
            }
            if (moved) last_new = cli_now();
            mode = FERRY_SYNC_LATEST;
        } else if (o->follow && pull_transient(rc)) {
            if (rc != FERRY_ERR_SYNC_NOT_YET) fprintf(stderr, "ferry %s: %s (retrying)\n", o->cmd, ferry_last_error());
            if (++errors > 1000) return sync_fail(o->cmd, rc, o->path ? o->path : c->run);
        } else {
            return sync_fail(o->cmd, rc, o->path ? o->path : c->run);
        }
        if (!o->follow) return 0;
        now_v = ferry_shard_subscriber_version(s);
        if (o->until && now_v >= o->until) return 0;
        double waited = cli_now() - last_new;
        if (o->idle_s > 0 && waited >= o->idle_s) {
            fprintf(stderr, "ferry %s: no new version for %.1f s (holding version %llu)\n", o->cmd, o->idle_s, (unsigned long long)now_v);
            return SYNC_EXIT_NOT_YET;
        }
        double span = 10 * o->interval_s;
        if (o->idle_s > 0 && o->idle_s - waited < span) span = o->idle_s - waited;
        uint64_t head;
        rc = ferry_shard_wait(s, now_v, (uint64_t)(span * 1000.0) + 1, &head);
        if (rc && rc != FERRY_ERR_SYNC_TIMEOUT && !pull_transient(rc)) return sync_fail(o->cmd, rc, o->path ? o->path : c->run);
        if (rc && rc != FERRY_ERR_SYNC_TIMEOUT) {
            fprintf(stderr, "ferry %s: %s (retrying)\n", o->cmd, ferry_last_error());
            if (++errors > 1000) return sync_fail(o->cmd, rc, o->path ? o->path : c->run);
            cli_sleep_s(o->interval_s); /* the store failed at once: do not spin */
        }
    }
}
#endif
