/* ferry pull: keep a local checkpoint at a version of a run (once, or
 * following HEAD). */
#include "cmd_sync.h"
#include "cmd_shard.h"

#ifndef FERRY_NO_NET
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util.h"

static void pull_help(void)
{
    printf("usage: ferry pull STORE --run RUN --to PATH [--min-version N | --exact-version N]\n"
           "                  [--follow [--interval S] [--until-version N] [--idle-timeout S]]\n"
           "                  [--check] [--no-compactions] [--threads N] [--concurrency N]\n"
           "                  [--chunk-size BYTES] [--json] [-q]\n\n"
           "Brings the checkpoint PATH (a .safetensors file; its version is recorded in\n"
           "PATH.ferry.json) to the latest version of RUN, or to at least / exactly version\n"
           "N, by the cheapest verified path: the deltas from the version it holds, a\n"
           "compacted delta, or an anchor plus deltas.  Every object is checked against its\n"
           "manifest and every step's base and target hashes; PATH is replaced by an\n"
           "atomic rename only with a complete, verified version, and is left as it was on\n"
           "any failure.  Corrupt objects are reported and another path is taken.  An\n"
           "existing PATH must be a regular file: a device, FIFO, directory or symbolic\n"
           "link is refused, never replaced.\n\n"
           "A sharded run (published by build/ferry-shard-mpi) is pulled the same way into\n"
           "one file holding the whole model: an island of one rank fetching every tile\n"
           "with ranged GETs, its state in PATH.ferry.json as ferry shard-pull --out keeps\n"
           "it (docs/SHARDING.md); --check, --no-compactions, --concurrency and\n"
           "--chunk-size do not apply there.\n\n"
           "  --min-version N     nothing to do if PATH holds N or later, else the latest\n"
           "                      (exit 4 if HEAD is below N)\n"
           "  --exact-version N   exactly N (older than PATH's version is allowed)\n"
           "  --follow            keep PATH at the latest version as versions appear (a store\n"
           "                      or run that does not exist yet is waited for)\n"
           "  --interval S        how often --follow polls HEAD (default 1)\n"
           "  --until-version N   --follow: stop once PATH holds N or later\n"
           "  --idle-timeout S    --follow: stop (exit 4) when no new version came for S seconds\n"
           "  --check             change nothing: say which version PATH holds, checked\n"
           "                      against the run's manifests (exit 1 if none)\n"
           "  --no-compactions    ignore compacted deltas\n"
           "  --fallback URL      another store holding the same run (a mirror's upstream),\n"
           "                      tried in order when STORE is down, behind or corrupt\n"
           "                      (repeatable; docs/MIRROR.md)\n"
           "  --threads N         codec threads (default 1)\n"
           "  --concurrency N     parallel ranged GETs per anchor download, 1..64 (default 4;\n"
           "                      --rate caps each); an anchor download cut short (a failure,\n"
           "                      a killed pull) is kept as PATH.ferry-download.ID.part and\n"
           "                      continued by the next pull\n"
           "  --chunk-size BYTES  bytes per ranged GET, 4096..1 GiB (default 8 MiB)\n\n%s\n",
           sync_common_help);
}

static void print_sync(const sync_common *c, const char *path, const ferry_sync_info *in)
{
    if (c->quiet) return;
    if (c->json) {
        printf("{\"path\": ");
        json_str(stdout, path);
        printf(", \"run\": ");
        json_str(stdout, c->run);
        printf(", \"from_version\": %llu, \"version\": %llu, \"head\": %llu, \"route\": ", (unsigned long long)in->from_version,
               (unsigned long long)in->to_version, (unsigned long long)in->head_version);
        json_str(stdout, in->path);
        printf(", \"bytes_fetched\": %llu, \"planned_bytes\": %llu, \"steps\": %u, \"rejected\": %u}\n",
               (unsigned long long)in->bytes_fetched, (unsigned long long)in->planned_bytes, in->steps, in->rejected);
    } else if (in->from_version == in->to_version && !in->steps) {
        printf("%s: version %llu (up to date)\n", path, (unsigned long long)in->to_version);
    } else {
        printf("%s: version %llu (from %llu by %s; %llu bytes fetched", path, (unsigned long long)in->to_version,
               (unsigned long long)in->from_version, in->path, (unsigned long long)in->bytes_fetched);
        if (in->rejected) printf("; %u object%s rejected", in->rejected, in->rejected > 1 ? "s" : "");
        printf(")\n");
    }
    fflush(stdout);
}

/* --check: the version PATH holds, confirmed against the run's manifests. */
static int check_local(const sync_common *c, ferry_store *st, ferry_subscriber *sub, const char *path)
{
    uint64_t v = ferry_subscriber_version(sub);
    uint8_t h[16];
    if (!v || ferry_subscriber_hash(sub, h)) {
        fprintf(stderr, "ferry pull: %s holds no recorded version of run %s\n", path, c->run);
        return 1;
    }
    ferry_run_log *log = NULL;
    int rc = ferry_run_log_read_keys(st, c->run, 0, c->keys, &log);
    if (rc) return sync_fail("pull", rc, c->run);
    int found = 0;
    for (size_t i = 0; i < log->count; i++)
        if (log->versions[i].version == v) found = memcmp(log->versions[i].model_hash, h, 16) ? -1 : 1;
    uint64_t head = log->head;
    ferry_run_log_free(log);
    char hx[33];
    hex16(hx, h);
    if (found != 1) {
        fprintf(stderr, "ferry pull: %s: version %llu %s\n", path, (unsigned long long)v,
                found ? "has another model hash in the store" : "is no longer in the store (cannot confirm it)");
        return found ? SYNC_EXIT_CORRUPT : SYNC_EXIT_NOT_YET;
    }
    if (c->json) {
        printf("{\"path\": ");
        json_str(stdout, path);
        printf(", \"version\": %llu, \"model_hash\": \"%s\", \"head\": %llu, \"verified\": true}\n", (unsigned long long)v, hx,
               (unsigned long long)head);
    } else if (!c->quiet) {
        printf("%s: version %llu of run %s (model hash %s; HEAD is %llu)\n", path, (unsigned long long)v, c->run, hx,
               (unsigned long long)head);
    }
    return 0;
}

/* Errors worth waiting out while following: the store, or a version
 * without a path yet (a later anchor may give one), or a bad HEAD or
 * manifest (oversize, malformed, unsigned where keys are trusted, or not
 * a regular file in a file:// store: STORE_CORRUPT), which whoever can
 * write the store can put there and must not stop an island for good. */
bool pull_transient(int rc)
{
    return rc == FERRY_ERR_STORE_TIMEOUT || rc == FERRY_ERR_STORE_NET || rc == FERRY_ERR_STORE_HTTP ||
           rc == FERRY_ERR_SYNC_NO_PATH || rc == FERRY_ERR_SYNC_NOT_YET || rc == FERRY_ERR_STORE_CORRUPT ||
           rc == FERRY_ERR_SYNC_MANIFEST ||
           /* a HEAD rolled back, or forged, is reported and waited out: the
              file keeps its version and follows again once HEAD is valid */
           rc == FERRY_ERR_SYNC_BACKWARDS || (rc >= FERRY_ERR_SIG_MISSING && rc <= FERRY_ERR_SIG_DIGEST);
}

/* A sharded run (ferry-manifest-2) refused by the single-rank reader (as
 * not its format, or as larger than its bound on a manifest): pulled as a
 * whole-model island instead (pull_sharded).  Asked only after that
 * refusal: HEAD's manifest read as a sharded one.  When it is not one, the
 * reader's error is given back as it was (*saved, printed by
 * fail_saved). */
static bool is_sharded(int rc, ferry_store *store, const sync_common *c, char *saved, size_t cap)
{
    saved[0] = 0;
    if (rc != FERRY_ERR_SYNC_MANIFEST) return false;
    snprintf(saved, cap, "%s", ferry_last_error());
    ferry_shard_tensor_list *l = NULL;
    if (ferry_shard_tensors(store, c->run, c->keys, &l)) return false;
    ferry_shard_tensor_list_free(l);
    return true;
}

static int fail_saved(int rc, const char *what, const char *saved)
{
    sync_progress_end();
    fprintf(stderr, "ferry pull: %s: %s (%s)\n", what, saved[0] ? saved : ferry_strerror(rc), ferry_strerror(rc));
    return rc == FERRY_ERR_SYNC_MANIFEST ? SYNC_EXIT_CORRUPT : SYNC_EXIT_FAIL;
}

/* The tensors of a whole-model PATH that a sharded pull wrote (its state
 * says so): the next call takes them from PATH instead of reading HEAD's
 * manifest once more (the run's tensors are fixed; a PATH that is not what
 * its state recorded is refused by shard_out_run). */
/* Frees a list tensors_of_path made (this program's allocations, not the
 * library's: ferry_shard_tensor_list_free is for the lists it returns). */
static void path_list_free(ferry_shard_tensor_list *l)
{
    if (!l) return;
    for (size_t i = 0; i < l->count; i++) free(l->tensors[i].name);
    free(l->tensors);
    free(l);
}

static ferry_shard_tensor_list *tensors_of_path(const char *path)
{
    ferry_model *m = NULL;
    if (!shard_state_is_ours(path) || ferry_model_open(path, &m)) return NULL;
    ferry_shard_tensor_list *l = calloc(1, sizeof *l);
    size_t n = ferry_model_count(m);
    if (l && !(l->tensors = calloc(n + 1, sizeof *l->tensors))) {
        free(l);
        l = NULL;
    }
    for (size_t i = 0; l && i < n; i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        ferry_shard_tensor *x = &l->tensors[l->count];
        if (t->ndim > FERRY_MAX_DIMS || !(x->name = strdup(t->name))) break;
        x->dtype = t->dtype;
        x->ndim = t->ndim;
        memcpy(x->shape, t->shape, t->ndim * sizeof *t->shape);
        l->count++;
    }
    if (l && l->count != n) { /* short of memory: the manifest's list instead */
        path_list_free(l);
        l = NULL;
    }
    ferry_model_free(m);
    return l;
}

/* ferry pull of a sharded run into one file: an island of one rank whose
 * regions are every tensor whole (M = 1), its state beside PATH as
 * ferry shard-pull --out keeps it (cmd_shard_local.c). */
static int pull_sharded(sync_common *c, ferry_store *store, ferry_store *const *fbs, int nfb, const char *const *fallback,
                        shard_out *o, int threads)
{
    ferry_shard_tensor_list *l = tensors_of_path(o->path);
    ferry_shard_subscriber *s = NULL;
    ferry_shard_region *rg = NULL;
    bool mine = l != NULL;
    int rc = mine ? 0 : ferry_shard_tensors(store, c->run, c->keys, &l), ret = 0;
    if (!rc && !(rg = calloc(l->count + 1, sizeof *rg))) rc = FERRY_ERR_NOMEM;
    for (size_t i = 0; !rc && i < l->count; i++) rg[i].name = l->tensors[i].name;
    ferry_shard_sub_options so = {.threads = threads, .keys = c->keys};
    so.poll_interval_ms = (uint32_t)(o->interval_s * 1000.0 + 0.5) ? (uint32_t)(o->interval_s * 1000.0 + 0.5) : 1;
    if (!rc) rc = ferry_shard_subscriber_open(store, c->run, rg, l->count, &so, &s);
    for (int k = 0; k < nfb && !rc; k++) rc = ferry_shard_subscriber_add_store(s, fbs[k]);
    if (rc) ret = sync_fail("pull", rc, o->path);
    else {
        o->cmd = "pull";
        o->whole = true;
        o->rg = rg;
        o->n = l->count;
        o->tensors = l->tensors;
        o->fallback = fallback;
        ret = shard_out_run(c, s, o);
    }
    ferry_shard_subscriber_free(s);
    free(rg);
    if (mine) path_list_free(l);
    else ferry_shard_tensor_list_free(l);
    return ret;
}


/* Syncs, then waits for HEAD to move (the library polls it at the
 * subscriber's interval and returns as soon as a newer version shows).
 * Killing the process at any point is safe: PATH only ever changes by an
 * atomic rename to a verified version. */
static int follow(const sync_common *c, ferry_store *store, ferry_subscriber *sub, const char *path, int mode, uint64_t ver,
                  uint64_t until, double idle_s, double interval_s, bool *sharded)
{
    char saved[1024];
    double last_new = cli_now();
    uint64_t errors = 0;
    for (bool first = true;; first = false) {
        ferry_sync_info in;
        uint64_t before = ferry_subscriber_version(sub);
        int rc = ferry_subscriber_sync(sub, mode, ver, &in);
        sync_progress_end();
        if (first && (*sharded = is_sharded(rc, store, c, saved, sizeof saved))) return 0;
        if (!rc) {
            errors = 0;
            if (ferry_subscriber_version(sub) != before || in.steps) {
                print_sync(c, path, &in);
                last_new = cli_now();
            }
            mode = FERRY_SYNC_LATEST;
        } else if (pull_transient(rc)) {
            if (rc != FERRY_ERR_SYNC_NOT_YET) fprintf(stderr, "ferry pull: %s (retrying)\n", first && saved[0] ? saved : ferry_last_error());
            if (++errors > 1000) return sync_fail("pull", rc, path);
        } else {
            return sync_fail("pull", rc, path);
        }
        if (until && ferry_subscriber_version(sub) >= until) return 0;
        double waited = cli_now() - last_new;
        if (idle_s > 0 && waited >= idle_s) {
            fprintf(stderr, "ferry pull: no new version for %.1f s (holding version %llu)\n", idle_s,
                    (unsigned long long)ferry_subscriber_version(sub));
            return SYNC_EXIT_NOT_YET;
        }
        double span = 10 * interval_s;
        if (idle_s > 0 && idle_s - waited < span) span = idle_s - waited;
        uint64_t head;
        rc = ferry_subscriber_wait(sub, ferry_subscriber_version(sub), (uint64_t)(span * 1000.0) + 1, &head);
        if (rc && rc != FERRY_ERR_SYNC_TIMEOUT && !pull_transient(rc)) return sync_fail("pull", rc, path);
        if (rc && rc != FERRY_ERR_SYNC_TIMEOUT) {
            fprintf(stderr, "ferry pull: %s (retrying)\n", ferry_last_error());
            if (++errors > 1000) return sync_fail("pull", rc, path);
            cli_sleep_s(interval_s); /* the store failed at once: do not spin */
        }
    }
}

int cmd_pull(int argc, char **argv)
{
    sync_common c;
    sync_common_init(&c);
    ferry_subscriber_options so = {0};
    const char *to = NULL;
    int mode = FERRY_SYNC_LATEST, modes = 0;
    uint64_t ver = 0, until = 0;
    bool fol = false, check = false;
    double interval = 1.0, idle = 0;
    long num;
    const char *fallback[FERRY_SYNC_STORES_MAX];
    ferry_store *fb_store[FERRY_SYNC_STORES_MAX] = {0};
    int nfb = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) { pull_help(); return 0; }
        int r = sync_common_opt("pull", argc, argv, &i, &c);
        if (r == 2) return 2;
        if (r) continue;
        if (!strcmp(a, "--follow")) fol = true;
        else if (!strcmp(a, "--check")) check = true;
        else if (!strcmp(a, "--no-compactions")) so.no_compactions = 1;
        else if (!strcmp(a, "--fallback")) {
            if (++i == argc || nfb + 1 >= FERRY_SYNC_STORES_MAX)
                return cli_usage_error("pull", "--fallback needs a store URL (at most %d)", FERRY_SYNC_STORES_MAX - 1);
            fallback[nfb++] = argv[i];
        }
        else if (!strcmp(a, "--to")) {
            if (++i == argc) return cli_usage_error("pull", "--to needs a path");
            to = argv[i];
        } else if (!strcmp(a, "--min-version") || !strcmp(a, "--exact-version") || !strcmp(a, "--until-version")) {
            uint64_t *dst = a[2] == 'u' ? &until : &ver;
            if (++i == argc || !sync_parse_u64(argv[i], dst) || !*dst) return cli_usage_error("pull", "%s needs a version >= 1", a);
            if (a[2] != 'u') {
                mode = a[2] == 'm' ? FERRY_SYNC_MIN : FERRY_SYNC_EXACT;
                modes++;
            }
        } else if (!strcmp(a, "--interval") || !strcmp(a, "--idle-timeout")) {
            char *end;
            double s = ++i < argc ? strtod(argv[i], &end) : -1;
            if (i == argc || *end || !(s > 0) || s > 86400) return cli_usage_error("pull", "%s needs seconds", a);
            if (a[2] == 'i' && a[3] == 'n') interval = s;
            else idle = s;
        } else if (!strcmp(a, "--threads")) {
            if (++i == argc || !cli_parse_int(argv[i], 1, 256, &num)) return cli_usage_error("pull", "--threads needs 1..256");
            so.threads = (int)num;
        } else if (!strcmp(a, "--concurrency")) {
            if (++i == argc || !cli_parse_int(argv[i], 1, 64, &num)) return cli_usage_error("pull", "--concurrency needs 1..64");
            so.concurrency = (unsigned)num;
        } else if (!strcmp(a, "--chunk-size")) {
            if (++i == argc || !sync_parse_u64(argv[i], &so.chunk_size) || so.chunk_size < 4096 || so.chunk_size > (1u << 30))
                return cli_usage_error("pull", "--chunk-size needs 4096..1073741824 bytes");
        } else if (a[0] == '-' && a[1]) return cli_usage_error("pull", "unknown option '%s'", a);
        else if (!sync_common_pos(&c, a)) return cli_usage_error("pull", "unexpected argument '%s'", a);
    }
    int st = sync_common_check("pull", &c);
    if (st) return st;
    if (!to) return cli_usage_error("pull", "missing --to PATH");
    if (modes > 1) return cli_usage_error("pull", "give --min-version or --exact-version, not both");
    if (fol && mode == FERRY_SYNC_EXACT) return cli_usage_error("pull", "--follow keeps the latest version: not with --exact-version");
    if (!fol && (until || idle > 0)) return cli_usage_error("pull", "--until-version and --idle-timeout go with --follow");
    if (check && (fol || modes)) return cli_usage_error("pull", "--check changes nothing: no version options or --follow");
    so.path = to;
    so.poll_interval_ms = (uint32_t)(interval * 1000.0 + 0.5) ? (uint32_t)(interval * 1000.0 + 0.5) : 1;

    ferry_store *store = NULL;
    ferry_subscriber *sub = NULL;
    int rc, ret;
    /* following: the store may not exist yet (an island started before its trainer) */
    if ((ret = fol ? sync_open_store_wait("pull", &c, interval, idle, &store) : sync_open_store("pull", &c, 0, &store))) return ret;
    so.keys = c.keys;
    so.run_id = c.run_id;
    if ((rc = ferry_subscriber_open(store, c.run, &so, &sub))) {
        ret = sync_fail("pull", rc, to);
        goto out;
    }
    for (int k = 0; k < nfb; k++) {
        const char *url = c.store_url;
        c.store_url = fallback[k];
        ret = sync_open_store("pull", &c, 0, &fb_store[k]);
        c.store_url = url;
        if (ret) goto out;
        if ((rc = ferry_subscriber_add_store(sub, fb_store[k]))) {
            ret = sync_fail("pull", rc, fallback[k]);
            goto out;
        }
    }
    shard_out sho = {.path = to, .mode = mode, .version = ver, .follow = fol, .until = until, .idle_s = idle, .interval_s = interval};
    bool sharded = !check && shard_state_is_ours(to);
    if (sharded) ret = pull_sharded(&c, store, fb_store, nfb, fallback, &sho, so.threads);
    else if (check) ret = check_local(&c, store, sub, to);
    else if (fol) {
        ret = follow(&c, store, sub, to, mode, ver, until, idle, interval, &sharded);
        if (sharded) ret = pull_sharded(&c, store, fb_store, nfb, fallback, &sho, so.threads);
    } else {
        ferry_sync_info in;
        rc = ferry_subscriber_sync(sub, mode, ver, &in);
        sync_progress_end();
        char saved[1024];
        if (is_sharded(rc, store, &c, saved, sizeof saved)) ret = pull_sharded(&c, store, fb_store, nfb, fallback, &sho, so.threads);
        else if (saved[0]) ret = fail_saved(rc, to, saved);
        else if (rc) ret = sync_fail("pull", rc, to);
        else {
            print_sync(&c, to, &in);
            unsigned used = ferry_subscriber_store_used(sub);
            if (used && !c.quiet) fprintf(stderr, "ferry pull: served by the fallback %s\n", fallback[used - 1]);
            unsigned again = ferry_subscriber_objects_refetched(sub);
            if (again && !c.quiet)
                fprintf(stderr, "ferry pull: %u object%s served by the fallback (%s's cop%s refused)\n", again, again > 1 ? "s" : "",
                        used ? fallback[used - 1] : c.store_url, again > 1 ? "ies were" : "y was");
            if (in.rejected && !c.quiet) {
                ferry_subscriber_stats ss;
                ferry_subscriber_get_stats(sub, &ss);
                fprintf(stderr, "ferry pull: rejected: %s\n", ss.last_rejection);
            }
            ret = 0;
        }
    }
out:
    ferry_subscriber_free(sub);
    for (int k = 0; k < nfb; k++) ferry_store_free(fb_store[k]);
    ferry_store_free(store);
    return ret;
}
#endif
