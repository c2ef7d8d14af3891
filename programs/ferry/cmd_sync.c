/* Shared parts of the sync commands: store options, progress, errors. */
#include "cmd_sync.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

#ifdef FERRY_NO_NET
static int no_net(const char *cmd)
{
    fprintf(stderr, "ferry %s: this build has no store layer (built with NO_NET=1)\n", cmd);
    return 1;
}
int cmd_publish(int argc, char **argv) { (void)argc, (void)argv; return no_net("publish"); }
int cmd_pull(int argc, char **argv) { (void)argc, (void)argv; return no_net("pull"); }
int cmd_log(int argc, char **argv) { (void)argc, (void)argv; return no_net("log"); }
int cmd_gc(int argc, char **argv) { (void)argc, (void)argv; return no_net("gc"); }
int cmd_compact(int argc, char **argv) { (void)argc, (void)argv; return no_net("compact"); }
int cmd_keygen(int argc, char **argv) { (void)argc, (void)argv; return no_net("keygen"); }
#else

const char sync_common_help[] =
    "STORE is a URL: file:///abs/dir or a plain path, s3://BUCKET[/PREFIX],\n"
    "http(s)://HOST/PATH (read-only).  S3 credentials come from AWS_ACCESS_KEY_ID,\n"
    "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN); see docs/STORE.md.\n\n"
    "  --run RUN          the run (a key prefix in the store; required)\n"
    "  --endpoint URL     S3 endpoint (default $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, AWS)\n"
    "  --region R         S3 signing region (default $AWS_REGION or us-east-1)\n"
    "  --deadline S       per store call, retries included (default 300)\n"
    "  --connect-timeout S  per connection attempt (default 10)\n"
    "  --rate BYTES       cap each transfer at BYTES per second\n"
    "  --part-size BYTES  multipart upload part size (default 64 MiB)\n"
    "  --cas-verify       read HEAD back after each swap (stores without conditional writes)\n"
    "  --sign-key PATH    sign what is written with this private key (ferry keygen);\n"
    "                     its public half is trusted too, as a publisher key\n"
    "  --trust-key PATH   trust this PUBLISHER public key (the trainer's; repeatable):\n"
    "                     every record read must be signed by a trusted publisher key,\n"
    "                     every object match its signed SHA-256.  Never an island's\n"
    "                     batch key: an island key verifies its batches only\n"
    "  --run-id ID        the run id (16 hex digits, `ferry log`) HEAD must carry: a\n"
    "                     version of another run put under RUN is refused (exit 3)\n"
    "  --progress         progress lines \"progress DONE TOTAL\" on stderr\n"
    "  --no-progress      no progress bar (default: a bar when stderr is a terminal)\n"
    "  --json             one JSON object on stdout\n"
    "  -q, --quiet        nothing on stdout on success\n\n"
    "Exit status: 0 success, 1 failure, 2 usage, 3 another publisher, HEAD moved\n"
    "backwards or gone, or a version of another run id, 4 version not there (yet, or any more) or nothing new in time,\n"
    "5 store unreachable past the deadline, 6 objects failed verification, 7 a record\n"
    "unsigned or wrongly signed (with --trust-key / --sign-key), or a key file unusable.";

void sync_common_init(sync_common *c)
{
    memset(c, 0, sizeof *c);
    c->progress = -1;
}

bool sync_parse_u64(const char *s, uint64_t *out) { return cli_parse_u64(s, INT64_MAX, out); }

static bool parse_seconds(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0) || v > 86400.0 * 30) return false;
    *out = v;
    return true;
}

int sync_common_opt(const char *cmd, int argc, char **argv, int *i, sync_common *c)
{
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    double sec;
    uint64_t n;
    if (!strcmp(a, "--json")) c->json = true;
    else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) c->quiet = true;
    else if (!strcmp(a, "--progress")) c->progress = 1;
    else if (!strcmp(a, "--no-progress")) c->progress = 0;
    else if (!strcmp(a, "--cas-verify")) c->so.cas_mode = FERRY_STORE_CAS_VERIFY;
    else if (!strcmp(a, "--sign-key") || !strcmp(a, "--trust-key")) {
        if (!v) return cli_usage_error(cmd, "%s needs a key file", a);
        if (a[2] == 's') c->sign_key = v;
        else if (c->ntrust == SYNC_MAX_TRUST) return cli_usage_error(cmd, "--trust-key given more than %d times", SYNC_MAX_TRUST);
        else c->trust[c->ntrust++] = v;
        (*i)++;
    } else if (!strcmp(a, "--run-id")) {
        if (!v) return cli_usage_error(cmd, "--run-id needs 16 hex digits");
        c->run_id = v;
        (*i)++;
    } else if (!strcmp(a, "--run") || !strcmp(a, "--endpoint") || !strcmp(a, "--region")) {
        if (!v) return cli_usage_error(cmd, "%s needs a value", a);
        if (a[2] == 'r' && a[3] == 'u') c->run = v;
        else if (a[2] == 'e') c->so.endpoint = v;
        else c->so.region = v;
        (*i)++;
    } else if (!strcmp(a, "--deadline") || !strcmp(a, "--connect-timeout")) {
        if (!v || !parse_seconds(v, &sec) || sec <= 0) return cli_usage_error(cmd, "%s needs seconds", a);
        if (a[2] == 'd') c->so.deadline_ms = (uint64_t)(sec * 1000.0 + 0.5) ? (uint64_t)(sec * 1000.0 + 0.5) : 1;
        else c->so.connect_timeout_ms = (uint32_t)(sec * 1000.0 + 0.5) ? (uint32_t)(sec * 1000.0 + 0.5) : 1;
        (*i)++;
    } else if (!strcmp(a, "--rate") || !strcmp(a, "--part-size")) {
        if (!v || !sync_parse_u64(v, &n) || !n) return cli_usage_error(cmd, "%s needs a positive byte count", a);
        if (a[2] == 'r') c->so.max_bytes_per_s = n;
        else c->so.part_size = n;
        (*i)++;
    } else return 0;
    return 1;
}

bool sync_common_pos(sync_common *c, const char *arg)
{
    if (c->store_url) return false;
    c->store_url = arg;
    return true;
}

int sync_common_check(const char *cmd, const sync_common *c)
{
    if (!c->store_url) return cli_usage_error(cmd, "expects STORE");
    if (!c->run) return cli_usage_error(cmd, "missing --run RUN");
    return 0;
}

/* ---- progress ---- */

static int g_progress_mode;
static double g_last;
static bool g_bar_open;

void sync_progress_end(void)
{
    if (g_bar_open) fputc('\n', stderr);
    g_bar_open = false;
}

static int on_progress(void *user, uint64_t done, uint64_t total)
{
    (void)user;
    if (g_progress_mode == 1) {
        fprintf(stderr, "progress %llu %llu\n", (unsigned long long)done, (unsigned long long)total);
        return 0;
    }
    /* a bar for long transfers only, redrawn at most 10 times a second */
    double now = cli_now();
    if (total < (1u << 20) || (now - g_last < 0.1 && done < total)) return 0;
    g_last = now;
    int w = 30, fill = (int)((double)w * (double)done / (double)total);
    char bar[31];
    for (int k = 0; k < w; k++) bar[k] = k < fill ? '#' : '.';
    bar[w] = 0;
    fprintf(stderr, "\r[%s] %5.1f%% %.1f/%.1f MiB", bar, 100.0 * (double)done / (double)total, (double)done / 1048576.0,
            (double)total / 1048576.0);
    g_bar_open = done < total;
    if (done >= total) fputc('\n', stderr);
    return 0;
}

static ferry_keys *g_keys;
static void free_keys(void) { ferry_keys_free(g_keys); }

/* Whether a key file holds a private key (a PEM "... PRIVATE KEY" block).
 * The library trusts one's public half, as documented, but a private key
 * passed where a public one belongs is usually a mistake that also copies
 * the secret to every reader's machine: warn (issue 27). */
static bool holds_private_key(const char *path)
{
    char head[128] = "";
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* never waits on a FIFO */
    if (fd < 0) return false;                  /* the ring's load reports it */
    struct stat st;
    ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? read(fd, head, sizeof head - 1) : -1;
    close(fd);
    if (n <= 0) return false;
    head[n] = 0;
    char *nl = strchr(head, '\n');
    if (nl) *nl = 0;
    return !strncmp(head, "-----BEGIN ", 11) && strstr(head, "PRIVATE KEY-----");
}

static int load_keys(const char *cmd, sync_common *c)
{
    if (!c->sign_key && !c->ntrust) return 0;
    if (!g_keys) {
        int rc = ferry_keys_create(&g_keys);
        if (rc) return sync_fail(cmd, rc, "key ring");
        atexit(free_keys);
        if (c->sign_key && (rc = ferry_keys_set_signer(g_keys, c->sign_key, NULL))) return sync_fail(cmd, rc, c->sign_key);
        for (int i = 0; i < c->ntrust; i++) {
            /* The ring's load first: it refuses a FIFO or device without
             * blocking, so the warning below only ever reads a regular file. */
            if ((rc = ferry_keys_trust(g_keys, c->trust[i], FERRY_KEY_PUBLISHER, NULL))) return sync_fail(cmd, rc, c->trust[i]);
            if (holds_private_key(c->trust[i]))
                fprintf(stderr, "%s %s: warning: --trust-key %s is a PRIVATE key: only its public half is "
                                "trusted; give readers the .pub file and keep the .key on the trainer\n",
                        cli_program, cmd, c->trust[i]);
        }
    }
    c->keys = g_keys;
    return 0;
}

/* Opens the store: 0, a key ring's exit code (reported), or minus the
 * library's status (not reported yet). */
static int open_store(const char *cmd, sync_common *c, int create, ferry_store **out)
{
    int ks = load_keys(cmd, c);
    if (ks) return ks;
    g_progress_mode = c->progress < 0 ? (isatty(2) ? 2 : 0) : c->progress;
    if (g_progress_mode) c->so.progress = on_progress;
    c->so.create = create;
    return -ferry_store_open(c->store_url, &c->so, out);
}

int sync_open_store(const char *cmd, sync_common *c, int create, ferry_store **out)
{
    int r = open_store(cmd, c, create, out);
    return r < 0 ? sync_fail(cmd, -r, c->store_url) : r;
}

int sync_open_store_wait(const char *cmd, sync_common *c, double interval_s, double idle_s, ferry_store **out)
{
    double t0 = cli_now();
    for (bool said = false;; said = true) {
        int r = open_store(cmd, c, 0, out);
        if (r != -FERRY_ERR_STORE_NOT_FOUND) return r < 0 ? sync_fail(cmd, -r, c->store_url) : r;
        double waited = cli_now() - t0;
        if (idle_s > 0 && waited >= idle_s) {
            fprintf(stderr, "%s %s: %s: no such store after %.1f s of waiting\n", cli_program, cmd, c->store_url, waited);
            return SYNC_EXIT_NOT_YET;
        }
        if (!said && !c->quiet)
            fprintf(stderr, "%s %s: %s does not exist yet: waiting for it (--idle-timeout bounds the wait)\n", cli_program, cmd,
                    c->store_url);
        cli_sleep_s(interval_s);
    }
}

int sync_fail(const char *cmd, int rc, const char *what)
{
    sync_progress_end();
    cli_fail(cmd, rc, what);
    switch (rc) {
    case FERRY_ERR_SYNC_CONFLICT:
    case FERRY_ERR_SYNC_FOREIGN:
    case FERRY_ERR_SYNC_BACKWARDS: return SYNC_EXIT_CONFLICT;
    case FERRY_ERR_SYNC_NOT_YET:
    case FERRY_ERR_SYNC_GONE:
    case FERRY_ERR_SYNC_TIMEOUT: return SYNC_EXIT_NOT_YET;
    case FERRY_ERR_STORE_TIMEOUT:
    case FERRY_ERR_STORE_NET: return SYNC_EXIT_STORE;
    case FERRY_ERR_SYNC_CORRUPT:
    case FERRY_ERR_SYNC_MANIFEST:
    case FERRY_ERR_SHARD_INDEX:
    case FERRY_ERR_SYNC_NO_PATH: return SYNC_EXIT_CORRUPT;
    case FERRY_ERR_SIG_MISSING:
    case FERRY_ERR_SIG_MALFORMED:
    case FERRY_ERR_SIG_UNTRUSTED:
    case FERRY_ERR_SIG_INVALID:
    case FERRY_ERR_SIG_DIGEST:
    case FERRY_ERR_SIG_KEY: return SYNC_EXIT_SIGNATURE;
    default: return SYNC_EXIT_FAIL;
    }
}
#endif
