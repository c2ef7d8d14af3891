/* File mode's local state: PATH (a .safetensors checkpoint) and
 * PATH.ferry.json, which records the version PATH holds.
 *
 * Two files cannot be replaced together atomically, so the state file
 * names both the old and the new version around the rename of PATH
 * ("current" and "pending"), and the version PATH holds is decided by its
 * model hash when it is opened: a crash before, during or after the rename
 * leaves PATH complete (ferry_model_save renames a fully written file) and
 * its hash equal to one of the two.  A PATH whose hash matches neither is
 * treated as holding no version; it is never trusted on its name alone. */
#include "sync_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <jansson.h>
#include <stdlib.h>
#include <unistd.h>

int ferry__sync_local_state_path(const char *path, char *out, size_t cap)
{
    if ((size_t)snprintf(out, cap, "%s.ferry.json", path) >= cap) return ferry__fail(FERRY_ERR_ARG, "%s: path too long", path);
    return FERRY_OK;
}

static json_t *state_json(const fs_state *s)
{
    if (!s || !s->version) return json_null();
    char h[33];
    ferry__hex(h, s->hash, 16);
    json_t *o = json_pack("{s:I,s:s,s:s,s:I}", "version", (json_int_t)s->version, "id", s->id, "model_hash", h,
                          "delta_bytes_cum", (json_int_t)s->cum);
    /* the run id pins the island to its run: a version of another run
       (another store's, a restarted run) is refused after a restart too */
    if (o && s->run_id[0] && json_object_set_new(o, "run_id", json_string(s->run_id))) {
        json_decref(o);
        o = NULL;
    }
    return o;
}

static bool state_parse(json_t *o, fs_state *s)
{
    memset(s, 0, sizeof *s);
    if (json_is_null(o) || !o) return true;
    json_t *v = json_object_get(o, "version"), *c = json_object_get(o, "delta_bytes_cum");
    const char *id = json_string_value(json_object_get(o, "id"));
    const char *h = json_string_value(json_object_get(o, "model_hash"));
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || !json_is_integer(c) || json_integer_value(c) < 0 || !id ||
        strlen(id) != FERRY_SYNC_ID_LEN || !ferry__sync_id_valid(id) || !h || !ferry__sync_unhex(h, s->hash))
        return false;
    json_t *r = json_object_get(o, "run_id");
    const char *rid = json_string_value(r);
    if (r && (!rid || strlen(rid) != FERRY_SYNC_ID_LEN || !ferry__sync_id_valid(rid))) return false;
    s->version = (uint64_t)json_integer_value(v);
    s->cum = (uint64_t)json_integer_value(c);
    memcpy(s->id, id, FS_ID_CAP);
    if (rid) memcpy(s->run_id, rid, FS_ID_CAP);
    return true;
}

static int write_state(const char *path, const char *run, const fs_state *cur, const fs_state *pending)
{
    char sp[4096];
    int rc = ferry__sync_local_state_path(path, sp, sizeof sp);
    if (rc) return rc;
    json_t *root = json_pack("{s:s,s:s,s:o,s:o}", "format", "ferry-local-1", "run", run, "current", state_json(cur),
                             "pending", state_json(pending));
    char *text = root ? json_dumps(root, JSON_INDENT(1)) : NULL;
    json_decref(root);
    if (!text) return ferry__fail(FERRY_ERR_NOMEM, "%s: cannot serialise the local state", sp);
    rc = ferry_file_write(sp, text, strlen(text));
    free(text);
    return rc;
}

/* Whether process pid has ended: kill() still finds a zombie (ended, not
 * yet reaped: `timeout -s KILL` kills itself with its child, which then
 * waits for init, or forever in a container whose PID 1 never reaps), so a
 * process found is also asked whether /proc says it is one. */
static bool process_gone(long pid)
{
    if (kill((pid_t)pid, 0) != 0) return errno == ESRCH; /* EPERM: someone else's, alive */
    char p[64], buf[512];
    snprintf(p, sizeof p, "/proc/%ld/stat", pid);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = 0;
    const char *r = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold anything but the last ')' */
    return r && r[1] == ' ' && (r[2] == 'Z' || r[2] == 'X');
}

/* A process killed while it wrote PATH leaves PATH.tmp.PID.RANDOM (ferry_model_save),
 * PATH.ferry.json.tmp.PID.RANDOM (the state file) or PATH.ferry-anchor.PID.ID (a
 * staged anchor) beside it.  They are never
 * read; those of processes that no longer exist are removed here.
 * downloads: remove instead the anchor downloads PATH.ferry-download.ID*
 * (kept across processes to be resumed) of every anchor but keep_id. */
static void remove_stale(const char *path, bool downloads, const char *keep_id)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    const char *base = slash ? slash + 1 : path;
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    size_t bn = strlen(base);
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        const char *n = e->d_name, *rest;
        if (strncmp(n, base, bn)) continue;
        if (downloads) {
            if (strncmp(n + bn, ".ferry-download.", 16)) continue;
            rest = n + bn + 16;
            size_t kl = keep_id ? strlen(keep_id) : 0;
            if (kl && !strncmp(rest, keep_id, kl) && (!rest[kl] || rest[kl] == '.')) continue;
        } else {
            if (!strncmp(n + bn, ".tmp.", 5)) rest = n + bn + 5;
            else if (!strncmp(n + bn, ".ferry.json.tmp.", 16)) rest = n + bn + 16;
            else if (!strncmp(n + bn, ".ferry-anchor.", 14)) rest = n + bn + 14;
            else continue;
            char *end;
            long pid = strtol(rest, &end, 10);
            if (end == rest || pid <= 0 || (*end && *end != '.')) continue;
            if (!process_gone(pid)) continue; /* alive (or not ours to judge) */
        }
        char full[8300];
        snprintf(full, sizeof full, "%s/%s", dir, n);
        unlink(full);
    }
    closedir(d);
}

void ferry__sync_local_drop_downloads(const char *path, const char *keep_id) { remove_stale(path, true, keep_id); }

void ferry_sync_local_clean(const char *path)
{
    if (path) remove_stale(path, false, NULL);
}

int ferry__sync_local_open(const char *path, const char *run, ferry_model **model, fs_state *st)
{
    memset(st, 0, sizeof *st);
    *model = NULL;
    char sp[4096];
    int rc = ferry__sync_local_state_path(path, sp, sizeof sp);
    /* PATH or its state file a device, FIFO, link...: refused before any
       download (and before anything is written or removed beside it) */
    if (rc || (rc = ferry__output_check(path)) || (rc = ferry__output_check(sp))) return rc;
    remove_stale(path, false, NULL);
    ferry_model *m = NULL;
    rc = ferry_model_open(path, &m);
    if (rc) {
        /* Missing or not a valid checkpoint: nothing usable is held; the
         * next sync writes a complete version over it. */
        ferry__clear_error();
        return FERRY_OK;
    }
    void *text = NULL;
    size_t n = 0;
    fs_state cur = {0}, pend = {0};
    bool have = false;
    if (!ferry_file_read(sp, FS_JSON_MAX, &text, &n)) {
        json_error_t err;
        json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &err);
        const char *fmt = json_string_value(json_object_get(root, "format"));
        const char *r = json_string_value(json_object_get(root, "run"));
        have = fmt && !strcmp(fmt, "ferry-local-1") && r && !strcmp(r, run) &&
               state_parse(json_object_get(root, "current"), &cur) && state_parse(json_object_get(root, "pending"), &pend);
        json_decref(root);
        ferry_free(text);
    }
    ferry__clear_error();
    if (have && (cur.version || pend.version)) {
        uint8_t h[16];
        if ((rc = ferry_model_hash(m, h))) {
            ferry_model_free(m);
            return rc;
        }
        if (cur.version && !memcmp(h, cur.hash, 16)) *st = cur;
        else if (pend.version && !memcmp(h, pend.hash, 16)) *st = pend;
    }
    if (!st->version) {
        ferry_model_free(m);
        return FERRY_OK;
    }
    *model = m;
    return FERRY_OK;
}

void ferry__sync_local_peek(const char *path, const char *run, fs_state *st)
{
    memset(st, 0, sizeof *st);
    char sp[4096];
    void *text = NULL;
    size_t n = 0;
    if (ferry__sync_local_state_path(path, sp, sizeof sp) || ferry_file_read(sp, FS_JSON_MAX, &text, &n)) {
        ferry__clear_error();
        return;
    }
    json_error_t err;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &err);
    ferry_free(text);
    const char *fmt = json_string_value(json_object_get(root, "format"));
    const char *r = json_string_value(json_object_get(root, "run"));
    fs_state cur, pend;
    if (fmt && !strcmp(fmt, "ferry-local-1") && r && !strcmp(r, run) && state_parse(json_object_get(root, "current"), &cur) &&
        state_parse(json_object_get(root, "pending"), &pend))
        *st = cur.version ? cur : pend;
    json_decref(root);
}

int ferry__sync_local_commit(const char *path, const char *run, const ferry_model *model, const char *staged_file,
                    const fs_state *from, const fs_state *to)
{
    int rc = write_state(path, run, from, to);
    if (rc) return rc;
    if (staged_file) {
        /* The staged anchor was fsynced by the store's get_file. */
        if ((rc = ferry__rename_output(staged_file, path))) return rc;
        if ((rc = ferry__fsync_dir_of(path))) return rc;
    } else if ((rc = ferry_model_save(model, path))) {
        return rc;
    }
    if ((rc = write_state(path, run, to, NULL))) return rc;
    ferry__sync_local_drop_downloads(path, NULL); /* an anchor download cut short is of an older version */
    return FERRY_OK;
}
