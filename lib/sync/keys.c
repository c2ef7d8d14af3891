/* Object keys of a run, random ids, the wall clock.  Every key of the
 * protocol is built here and parsed back here (for GC), so the layout of
 * docs/PROTOCOL.md "Objects" lives in one place. */
#include "sync_impl.h"

#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int ferry_sync_run_check(const char *run)
{
    if (!run || !*run) return ferry__fail(FERRY_ERR_SYNC_RUN, "run name is empty");
    size_t n = strlen(run);
    if (n > FERRY_SYNC_RUN_MAX) return ferry__fail(FERRY_ERR_SYNC_RUN, "run name is longer than %d bytes", FERRY_SYNC_RUN_MAX);
    bool seg_start = true;
    for (size_t i = 0; i < n; i++) {
        char c = run[i];
        if (c == '/') {
            if (seg_start) return ferry__fail(FERRY_ERR_SYNC_RUN, "run name '%s': empty segment", run);
            seg_start = true;
            continue;
        }
        if (seg_start && c == '.') return ferry__fail(FERRY_ERR_SYNC_RUN, "run name '%s': a segment starts with '.'", run);
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
        if (!ok) return ferry__fail(FERRY_ERR_SYNC_RUN, "run name '%s': character 0x%02x is not one of [A-Za-z0-9._-/]", run, (unsigned char)c);
        seg_start = false;
    }
    if (seg_start) return ferry__fail(FERRY_ERR_SYNC_RUN, "run name '%s' ends with '/'", run);
    return FERRY_OK;
}

void ferry__sync_key_head(char out[FS_KEY_CAP], const char *run) { snprintf(out, FS_KEY_CAP, "%s/HEAD", run); }
void ferry__sync_key_index(char out[FS_KEY_CAP], const char *run) { snprintf(out, FS_KEY_CAP, "%s/compactions.json", run); }

static const char *const k_ext[] = {".json", ".safetensors", ".patch"};

/* Versions are written with 20 digits so that listings sort by version. */
void ferry__sync_key_version(char out[FS_KEY_CAP], const char *run, uint64_t version, const char *id, int obj)
{
    snprintf(out, FS_KEY_CAP, "%s/v/%020llu-%s%s", run, (unsigned long long)version, id, k_ext[obj]);
}

void ferry__sync_key_compact(char out[FS_KEY_CAP], const char *run, uint64_t from, uint64_t to, const char *id)
{
    snprintf(out, FS_KEY_CAP, "%s/c/%020llu-%020llu-%s.patch", run, (unsigned long long)from, (unsigned long long)to, id);
}

void ferry__sync_key_compact_rank(char out[FS_KEY_CAP], const char *run, uint64_t from, uint64_t to, const char *id, uint32_t rank)
{
    snprintf(out, FS_KEY_CAP, "%s/c/%020llu-%020llu-%s-r%06u.patch", run, (unsigned long long)from, (unsigned long long)to, id, rank);
}

bool ferry__sync_id_valid(const char *s)
{
    for (int i = 0; i < FERRY_SYNC_ID_LEN; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return s[FERRY_SYNC_ID_LEN] == 0;
}

/* Reads exactly 20 decimal digits. */
static bool parse_ver(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    for (int i = 0; i < 20; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        if (v > (UINT64_MAX - (uint64_t)(s[i] - '0')) / 10) return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return true;
}

static bool parse_id(const char *s, char out[FS_ID_CAP])
{
    memcpy(out, s, FERRY_SYNC_ID_LEN);
    out[FERRY_SYNC_ID_LEN] = 0;
    return ferry__sync_id_valid(out);
}

void ferry__sync_key_parse(const char *run, const char *key, fs_key_info *out)
{
    memset(out, 0, sizeof *out);
    out->kind = FS_KEY_OTHER;
    size_t rn = strlen(run);
    if (strncmp(key, run, rn) || key[rn] != '/') return;
    const char *k = key + rn + 1;
    if (!strcmp(k, "HEAD")) { out->kind = FS_KEY_HEAD; return; }
    if (!strcmp(k, "compactions.json")) { out->kind = FS_KEY_INDEX; return; }
    if (!strncmp(k, "v/", 2)) {
        k += 2;
        if (strlen(k) < 20 + 1 + FERRY_SYNC_ID_LEN || k[20] != '-') return;
        if (!parse_ver(k, &out->version) || !parse_id(k + 21, out->id)) return;
        const char *ext = k + 21 + FERRY_SYNC_ID_LEN;
        for (int i = 0; i < 3; i++)
            if (!strcmp(ext, k_ext[i])) { out->kind = i; return; }
        /* a sharded version's rank object: -rNNNNNN.patch / .anchor */
        if (ext[0] == '-' && ext[1] == 'r' && strspn(ext + 2, "0123456789") == 6 &&
            (!strcmp(ext + 8, ".patch") || !strcmp(ext + 8, ".anchor")))
            out->kind = FS_KEY_SHARD;
        return;
    }
    if (!strncmp(k, "c/", 2)) {
        k += 2;
        size_t kn = strlen(k);
        if (kn < 20 + 1 + 20 + 1 + FERRY_SYNC_ID_LEN + 6 || k[20] != '-' || k[41] != '-') return;
        if (!parse_ver(k, &out->version) || !parse_ver(k + 21, &out->to) || !parse_id(k + 42, out->id)) return;
        const char *ext = k + 42 + FERRY_SYNC_ID_LEN;
        /* a sharded compaction's rank object: -rNNNNNN.patch */
        if (ext[0] == '-' && ext[1] == 'r' && strspn(ext + 2, "0123456789") == 6) ext += 8;
        if (strcmp(ext, ".patch")) return;
        out->kind = FS_KEY_COMPACT;
    }
}

void ferry__sync_new_id(char out[FS_ID_CAP])
{
    uint8_t r[FERRY_SYNC_ID_LEN / 2];
    ferry__random_bytes(r, sizeof r);
    ferry__hex(out, r, sizeof r);
}

bool ferry__sync_unhex(const char *s, uint8_t out[16]) { return ferry__unhex(out, s, 16) && !s[32]; }

int64_t ferry__sync_now(void) { return (int64_t)time(NULL); }

void ferry__sync_default_publisher(char out[FERRY_SYNC_PUBLISHER_MAX])
{
    char host[64] = "host", id[FS_ID_CAP] = "0";
    if (gethostname(host, sizeof host - 1)) snprintf(host, sizeof host, "host");
    host[sizeof host - 1] = 0;
    for (char *p = host; *p; p++)
        if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e || *p == '"' || *p == '\\') *p = '_';
    ferry__sync_new_id(id);
    snprintf(out, FERRY_SYNC_PUBLISHER_MAX, "%s:%ld:%.8s", host, (long)getpid(), id);
}

/* Printable ASCII without quotes or backslashes, so that the id reads the
 * same in JSON, logs and error messages. */
bool ferry__sync_publisher_valid(const char *s)
{
    size_t n = strlen(s);
    if (!n || n >= FERRY_SYNC_PUBLISHER_MAX) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e || s[i] == '"' || s[i] == '\\') return false;
    return true;
}

const char *ferry__sync_tmp_dir(const char *opt)
{
    if (opt && *opt) return opt;
    const char *t = getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

bool ferry__sync_object_error(int rc)
{
    switch (rc) {
    case FERRY_ERR_SYNC_CORRUPT:
    case FERRY_ERR_SYNC_MANIFEST:
    case FERRY_ERR_SHARD_INDEX: /* a sharded object's tile index */
    case FERRY_ERR_STORE_NOT_FOUND:
    case FERRY_ERR_STORE_CORRUPT:
    case FERRY_ERR_LIMIT:
    case FERRY_ERR_BASE_MISMATCH:
    case FERRY_ERR_TARGET_MISMATCH:
        return true;
    case FERRY_ERR_SIG_MISSING:  /* a manifest or object on a path that a */
    case FERRY_ERR_SIG_MALFORMED:/* reader with keys cannot trust: another */
    case FERRY_ERR_SIG_UNTRUSTED:/* path may avoid it */
    case FERRY_ERR_SIG_INVALID:
    case FERRY_ERR_SIG_DIGEST:
        return true;
    default:
        /* every safetensors and patch format error */
        return (rc >= FERRY_ERR_ST_TRUNCATED && rc <= FERRY_ERR_ST_INDEX) ||
               (rc >= FERRY_ERR_PATCH_MAGIC && rc <= FERRY_ERR_PATCH_CHECKSUM);
    }
}
