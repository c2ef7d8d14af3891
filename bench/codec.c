/*
 * bench/codec — patch sizes and speeds of ferry against the peer formats,
 * the order-0 entropy bound and two generic binary-delta tools, for every
 * consecutive checkpoint pair of the data sets (or the pairs given).
 *
 * Read top to bottom:
 *   1. options and the list of pairs;
 *   2. one pair: open both models, build the pair view;
 *   3. ferry (ferry_diff / ferry_apply / ferry_apply_inplace, one thread,
 *      timed, target hash checked);
 *   4. the seven peers (encode, decode in place, compare with NEW; one
 *      thread, timed like ferry);
 *   5. the order-0 bound; 6. zstd --patch-from and xdelta3;
 *   7. the tables, the summary and the JSON file.
 * Any failure (a missing file, a peer that does not round-trip, an apply
 * whose hash is not NEW's) prints one line on stderr and makes the exit
 * status 1; the remaining pairs are still measured.
 */
#include <dirent.h>
#include <getopt.h>
#include <sys/stat.h>

#include "baselines.h"
#include "bench_util.h"
#include "entropy.h"
#include "peers.h"
#include "scatter.h"

/* =====================================================================
 * 1. Options and pairs
 * ===================================================================== */

static const char usage[] =
    "usage: codec [options] [OLD NEW ...]\n"
    "\n"
    "Measures, for each checkpoint pair OLD -> NEW (.safetensors, same tensors):\n"
    "  ferry    patch size of ferry_diff (default options, one thread), encode,\n"
    "           apply and in-place apply time (median of --reps runs); the applied\n"
    "           model's hash must be NEW's\n"
    "  trl pulse skyrl slime prime vllm verl\n"
    "           the seven peer formats (our implementations, DESIGN.md), each\n"
    "           encoded and decoded in place back to NEW exactly (median of --reps)\n"
    "  order0   order-0 entropy bound: sum over tensors of n*H(k/n) + k*H(delta)\n"
    "  zstd     zstd -19 --patch-from=OLD NEW  (generic baseline)\n"
    "  xdelta3  xdelta3 -e -s OLD NEW           (generic baseline)\n"
    "\n"
    "Without OLD NEW arguments, every consecutive pair step-NNN -> step-MMM of\n"
    "every data set (subdirectory) of the data directory is measured.\n"
    "\n"
    "options:\n"
    "  --data DIR       data directory (default $FERRY_DATA, else ../shared/data)\n"
    "  --pairs LIST     only these pairs: comma-separated SET or SET:A-B (pairs\n"
    "                   whose steps lie in A..B), e.g. rl-b:0-1,rl-a\n"
    "  --reps N         timing repetitions for ferry and the peers (default 5)\n"
    "  --no-generic     skip the zstd and xdelta3 baselines\n"
    "  --json PATH      also write the results as JSON\n"
    "  --keep DIR       keep every patch as DIR/SET_OLD-NEW.FORMAT (to inspect them)\n"
    "  --corrupt PEER   test of the checks: flip one bit in the middle of that peer's\n"
    "                   patches before decoding; the run must then fail\n"
    "  -h, --help       this text\n"
    "\n"
    "Exit status 0 when every pair was measured and every patch verified, else 1.\n";

#define BENCH_MAX_REPS 1000

typedef struct pair_spec {
    char *label;          /* "rl-a:000->001", or the two paths' basenames */
    char *oldp, *newp;
    long old_step, new_step; /* -1 when the names carry no step number */
} pair_spec;

typedef struct options {
    const char *data;
    const char *pairs;
    const char *json;
    int reps;
    int generic;
} options;

/* Step number of ".../step-NNN.safetensors", or -1. */
static long step_number(const char *path)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    if (strncmp(b, "step-", 5)) return -1;
    char *end;
    long v = strtol(b + 5, &end, 10);
    return (end != b + 5 && strcmp(end, ".safetensors") == 0) ? v : -1;
}

static char *path_join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 2);
    if (!s) { fprintf(stderr, "codec: out of memory\n"); exit(1); }
    memcpy(s, a, la);
    s[la] = '/';
    memcpy(s + la + 1, b, lb + 1);
    return s;
}

static char *xstrdup(const char *s)
{
    char *d = strdup(s);
    if (!d) { fprintf(stderr, "codec: out of memory\n"); exit(1); }
    return d;
}

typedef struct pair_list { pair_spec *v; size_t n, cap; } pair_list;

static void pairs_push(pair_list *l, pair_spec p)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        if (!l->v) { fprintf(stderr, "codec: out of memory\n"); exit(1); }
    }
    l->v[l->n++] = p;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Does --pairs select set `set`, steps a -> b?  (NULL list: everything.) */
static int spec_selects(const char *list, const char *set, long a, long b)
{
    if (!list) return 1;
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        char item[512];
        snprintf(item, sizeof item, "%.*s", (int)(len < sizeof item ? len : sizeof item - 1), p);
        char *colon = strchr(item, ':');
        long lo = 0, hi = 0x7fffffff;
        if (colon) {
            *colon = 0;
            if (sscanf(colon + 1, "%ld-%ld", &lo, &hi) != 2) lo = hi = -2; /* malformed: matches nothing */
        }
        if (strcmp(item, set) == 0 && a >= lo && b <= hi) return 1;
        p += len;
        if (*p == ',') p++;
    }
    return 0;
}

/* Every consecutive step pair of every data set under dir. */
static int discover_pairs(const char *dir, const char *sel, pair_list *out)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "codec: cannot open data directory %s: %s\n", dir, strerror(errno));
        return -1;
    }
    char **sets = NULL;
    size_t nsets = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char *sub = path_join(dir, de->d_name);
        struct stat st;
        if (stat(sub, &st) == 0 && S_ISDIR(st.st_mode)) {
            sets = realloc(sets, (nsets + 1) * sizeof *sets);
            if (!sets) { fprintf(stderr, "codec: out of memory\n"); exit(1); }
            sets[nsets++] = xstrdup(de->d_name);
        }
        free(sub);
    }
    closedir(d);
    qsort(sets, nsets, sizeof *sets, cmp_str);
    for (size_t s = 0; s < nsets; s++) {
        char *sub = path_join(dir, sets[s]);
        DIR *sd = opendir(sub);
        char **steps = NULL;
        size_t nst = 0;
        while (sd && (de = readdir(sd))) {
            if (step_number(de->d_name) < 0) continue;
            steps = realloc(steps, (nst + 1) * sizeof *steps);
            if (!steps) { fprintf(stderr, "codec: out of memory\n"); exit(1); }
            steps[nst++] = xstrdup(de->d_name);
        }
        if (sd) closedir(sd);
        qsort(steps, nst, sizeof *steps, cmp_str); /* zero-padded: name order is step order */
        for (size_t i = 0; i + 1 < nst; i++) {
            long a = step_number(steps[i]), b = step_number(steps[i + 1]);
            if (!spec_selects(sel, sets[s], a, b)) continue;
            pair_spec p = {0};
            char label[600];
            snprintf(label, sizeof label, "%s:%03ld->%03ld", sets[s], a, b);
            p.label = xstrdup(label);
            p.oldp = path_join(sub, steps[i]);
            p.newp = path_join(sub, steps[i + 1]);
            p.old_step = a;
            p.new_step = b;
            pairs_push(out, p);
        }
        for (size_t i = 0; i < nst; i++) free(steps[i]);
        free(steps);
        free(sub);
        free(sets[s]);
    }
    free(sets);
    return 0;
}

/* Label of an explicit file pair: "SET:NNN->MMM" for two step files of one
 * directory (as discovered pairs are named), else "STEM->STEM" (the file
 * names without .safetensors). */
static char *file_pair_label(const char *a, const char *b, long sa, long sb)
{
    char label[600];
    const char *ba = strrchr(a, '/'), *bb = strrchr(b, '/');
    ba = ba ? ba + 1 : a;
    bb = bb ? bb + 1 : b;
    char *da = xstrdup(a), *db = xstrdup(b);
    da[ba - a] = 0;
    db[bb - b] = 0;
    if (sa >= 0 && sb >= 0 && strcmp(da, db) == 0) {
        size_t l = strlen(da);
        while (l > 0 && da[l - 1] == '/') da[--l] = 0;
        const char *set = strrchr(da, '/');
        set = set ? set + 1 : (*da ? da : ".");
        snprintf(label, sizeof label, "%s:%03ld->%03ld", set, sa, sb);
    } else {
        int la = (int)strlen(ba), lb = (int)strlen(bb);
        if (la > 12 && strcmp(ba + la - 12, ".safetensors") == 0) la -= 12;
        if (lb > 12 && strcmp(bb + lb - 12, ".safetensors") == 0) lb -= 12;
        snprintf(label, sizeof label, "%.*s->%.*s", la, ba, lb, bb);
    }
    free(da);
    free(db);
    return xstrdup(label);
}

/* =====================================================================
 * Scratch directory (TRL patch file, baseline patches), removed at exit.
 * ===================================================================== */
static char g_tmpdir[4096];

static void tmpdir_cleanup(void)
{
    if (!g_tmpdir[0]) return;
    DIR *d = opendir(g_tmpdir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char *p = path_join(g_tmpdir, de->d_name);
        unlink(p);
        free(p);
    }
    if (d) closedir(d);
    rmdir(g_tmpdir);
    g_tmpdir[0] = 0;
}

static int tmpdir_create(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(g_tmpdir, sizeof g_tmpdir, "%s/ferry-bench-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g_tmpdir)) {
        fprintf(stderr, "codec: cannot create a scratch directory in %s: %s\n",
                base && *base ? base : "/tmp", strerror(errno));
        g_tmpdir[0] = 0;
        return -1;
    }
    atexit(tmpdir_cleanup);
    return 0;
}

/* --keep: writes one patch to g_keep_dir/LABEL.FORMAT, LABEL made file-safe. */
static const char *g_keep_dir;
static const char *g_corrupt; /* --corrupt: the peer whose patches get a flipped bit */

static void keep_patch(const char *label, const char *format, const void *p, size_t n)
{
    if (!g_keep_dir) return;
    char name[700], path[4096];
    size_t j = 0;
    for (const char *c = label; *c && j + 1 < sizeof name; c++) {
        if (*c == '>' && j > 0 && name[j - 1] == '-') continue; /* "->" becomes "-" */
        name[j++] = (*c == ':' || *c == '/') ? '_' : *c;
    }
    name[j] = 0;
    int w = snprintf(path, sizeof path, "%s/%s.%s", g_keep_dir, name, format);
    FILE *f = (w > 0 && (size_t)w < sizeof path) ? fopen(path, "wb") : NULL;
    if (!f || fwrite(p, 1, n, f) != n) fprintf(stderr, "codec: cannot write %s (--keep)\n", path);
    if (f) fclose(f);
}

/* =====================================================================
 * 2. One pair: models and the pair view
 * ===================================================================== */

/* Results of one pair; sizes are 0 and *_ok 0 for what failed. */
typedef struct pair_result {
    uint64_t model_bytes;      /* NEW's tensor bytes */
    uint64_t nwords, changed;  /* words (BF16 elements) and changed ones */
    int ferry_ok;
    uint64_t ferry_size;
    double ferry_enc_s, ferry_app_s; /* medians */
    double ferry_enc_min_s, ferry_app_min_s; /* fastest runs (less hit by a busy machine) */
    double ferry_inp_s;        /* in place (ferry_apply_inplace_ex, one thread), median */
    double ferry_inp2_s;       /* the same with two threads */
    double scatter_s, scatter2_s; /* raw scatter of the same changes (bench/scatter.h), one and two threads */
    uint64_t ferry_table;      /* bytes of the patch outside the tensor payloads (header, table, trailer) */
    int peer_ok[PEER_COUNT];
    uint64_t peer_size[PEER_COUNT];
    double peer_enc_s[PEER_COUNT], peer_dec_s[PEER_COUNT];
    order0_result o0;
    int o0_ok;
    int zstd_ok, xdelta_ok;
    baseline_result zstd, xdelta;
} pair_result;

/* Builds the pair view of two models with the same tensors (names, dtypes,
 * shapes).  t->old / t->cur borrow the models' data. */
static int pair_view(const ferry_model *a, const ferry_model *b, bench_pair *p, bench_err *err)
{
    size_t n = ferry_model_count(b);
    if (ferry_model_count(a) != n)
        return bench_fail(err, "OLD has %zu tensors, NEW %zu: the peer formats need the same tensors",
                          ferry_model_count(a), n);
    p->t = calloc(n ? n : 1, sizeof *p->t);
    if (!p->t) return bench_fail(err, "out of memory");
    p->count = n;
    for (size_t i = 0; i < n; i++) {
        const ferry_tensor *x = ferry_model_tensor(a, i), *y = ferry_model_tensor(b, i);
        if (strcmp(x->name, y->name) || x->dtype != y->dtype || x->ndim != y->ndim ||
            memcmp(x->shape, y->shape, x->ndim * sizeof *x->shape))
            return bench_fail(err, "tensor '%s' differs in name, dtype or shape between OLD and NEW",
                              y->name);
        bench_tensor *t = &p->t[i];
        t->name = y->name;
        t->dtype = y->dtype;
        t->ndim = y->ndim;
        t->shape = y->shape;
        t->nbytes = y->nbytes;
        t->width = bench_word_width(y->dtype);
        t->nwords = y->nbytes / t->width;
        t->old = x->data;
        t->cur = y->data;
    }
    return 0;
}

/* =====================================================================
 * 3. ferry
 * ===================================================================== */
static int run_ferry(const char *label, const ferry_model *a, const ferry_model *b, int reps, pair_result *r,
                     bench_err *err)
{
    uint8_t want[16], got[16];
    if (ferry_model_hash(b, want)) return bench_fail(err, "ferry_model_hash(NEW): %s", ferry_last_error());
    double *te = calloc((size_t)reps, sizeof *te), *ta = calloc((size_t)reps, sizeof *ta),
           *ti = calloc((size_t)reps, sizeof *ti);
    void *patch = NULL;
    size_t size = 0;
    int rc = (!te || !ta || !ti) ? bench_fail(err, "out of memory") : 0;
    for (int i = 0; i < reps && !rc; i++) {
        void *p;
        size_t n;
        double t0 = bench_now();
        int frc = ferry_diff(a, b, NULL, &p, &n);
        te[i] = bench_now() - t0;
        if (frc) {
            rc = bench_fail(err, "ferry_diff: %s: %s", ferry_strerror(frc), ferry_last_error());
        } else if (!patch) {
            patch = p;
            size = n;
        } else {
            if (n != size || memcmp(p, patch, n))
                rc = bench_fail(err, "ferry_diff is not deterministic (%zu then %zu bytes)", size, n);
            ferry_free(p);
        }
    }
    for (int i = 0; i < reps && !rc; i++) {
        ferry_model *m = NULL;
        double t0 = bench_now();
        int frc = ferry_apply(a, patch, size, &m);
        ta[i] = bench_now() - t0;
        if (frc) {
            rc = bench_fail(err, "ferry_apply: %s: %s", ferry_strerror(frc), ferry_last_error());
        } else if (ferry_model_hash(m, got) || memcmp(got, want, 16)) {
            rc = bench_fail(err, "ferry_apply: the applied model's hash is not NEW's");
        }
        ferry_model_free(m);
    }
    /* In place, into an owned copy of OLD (made and reset outside the timing);
     * the caller vouches for the base hash, as a receiver that verified its
     * last apply does, and as the peers' decoders do not check one at all. */
    ferry_model *c = NULL;
    uint8_t ha[16];
    if (!rc && (ferry_model_hash(a, ha) || bench_model_copy(a, &c)))
        rc = bench_fail(err, "copy of OLD: %s", ferry_last_error());
    /* Interleaved in each rep, into the same copy put back to OLD between
     * them: ferry in place with one and two threads, and the raw scatter of
     * the same changes (int32 indices + words, bench/scatter.h) with one and
     * two, the least work that makes NEW from OLD in place. */
    bench_scatter sc = {0};
    double *t2 = calloc((size_t)reps, sizeof *t2), *s1 = calloc((size_t)reps, sizeof *s1), *s2 = calloc((size_t)reps, sizeof *s2);
    if (!rc && (!t2 || !s1 || !s2)) rc = bench_fail(err, "out of memory");
    /* no scatter (its columns left out) for models whose tensors differ */
    int have_sc = !rc && bench_scatter_make(a, b, &sc) == 0;
    for (int i = 0; i < reps && !rc; i++) {
        for (int th = 1; th <= 2 && !rc; th++) {
            if (i || th > 1) bench_model_reset(c, a);
            double t0 = bench_now();
            int frc = ferry_apply_inplace_ex(c, patch, size, &(ferry_apply_options){.threads = th, .base_hash = ha});
            (th == 1 ? ti : t2)[i] = bench_now() - t0;
            if (frc) rc = bench_fail(err, "ferry_apply_inplace: %s: %s", ferry_strerror(frc), ferry_last_error());
            else if (ferry_model_hash(c, got) || memcmp(got, want, 16))
                rc = bench_fail(err, "ferry_apply_inplace: the model's hash is not NEW's");
            if (rc || !have_sc) continue;
            bench_model_reset(c, a);
            t0 = bench_now();
            int src = bench_scatter_run(&sc, c, th);
            (th == 1 ? s1 : s2)[i] = bench_now() - t0;
            if (src || ferry_model_hash(c, got) || memcmp(got, want, 16)) rc = bench_fail(err, "raw scatter: the model's hash is not NEW's");
        }
    }
    bench_scatter_free(&sc);
    ferry_model_free(c);
    if (!rc) {
        r->ferry_inp_s = bench_median(ti, (size_t)reps);
        r->ferry_inp2_s = bench_median(t2, (size_t)reps);
        r->scatter_s = have_sc ? bench_median(s1, (size_t)reps) : 0;
        r->scatter2_s = have_sc ? bench_median(s2, (size_t)reps) : 0;
    }
    free(t2);
    free(s1);
    free(s2);
    ferry_patch_info *pi = NULL;
    if (!rc && ferry_patch_inspect(patch, size, &pi) == 0) {
        uint64_t payload = 0;
        for (size_t i = 0; i < ferry_patch_info_count(pi); i++) payload += ferry_patch_info_tensor(pi, i)->bytes;
        r->ferry_table = size - payload;
    }
    ferry_patch_info_free(pi);
    if (!rc) {
        r->ferry_ok = 1;
        r->ferry_size = size;
        r->ferry_enc_s = bench_median(te, (size_t)reps); /* sorts: [0] is the fastest */
        r->ferry_app_s = bench_median(ta, (size_t)reps);
        r->ferry_enc_min_s = te[0];
        r->ferry_app_min_s = ta[0];
        keep_patch(label, "ferry", patch, size);
    }
    ferry_free(patch);
    free(te);
    free(ta);
    free(ti);
    return rc;
}

/* =====================================================================
 * 4. Peers: encode, decode from OLD alone, compare with NEW
 * ===================================================================== */
static int run_peer(const char *label, const peer_format *pf, const peer_ctx *ctx, const bench_pair *pair,
                    const bench_pair *base, uint8_t *const *out, int reps, pair_result *r, size_t k,
                    bench_err *err)
{
    bench_buf patch = {0};
    double te[BENCH_MAX_REPS], td[BENCH_MAX_REPS];
    int rc = 0;
    for (int i = 0; i < reps && !rc; i++) {
        bench_buf_free(&patch);
        double t0 = bench_now();
        rc = pf->encode(ctx, pair, &patch, err);
        te[i] = bench_now() - t0;
    }
    if (rc) { bench_buf_free(&patch); return -1; }
    r->peer_enc_s[k] = bench_median(te, (size_t)reps);
    if (g_corrupt && strcmp(g_corrupt, pf->name) == 0 && patch.size) patch.data[patch.size / 2] ^= 1;
    for (int i = 0; i < reps && !rc; i++) { /* in place into a copy of OLD, reset outside the timing */
        for (size_t j = 0; j < base->count; j++) memcpy(out[j], base->t[j].old, (size_t)base->t[j].nbytes);
        double t0 = bench_now();
        rc = pf->decode(ctx, base, patch.data, patch.size, out, err);
        td[i] = bench_now() - t0;
    }
    if (!rc) r->peer_dec_s[k] = bench_median(td, (size_t)reps);
    for (size_t i = 0; i < pair->count && !rc; i++) {
        const bench_tensor *t = &pair->t[i];
        if (memcmp(out[i], t->cur, (size_t)t->nbytes) == 0) continue;
        uint64_t w = 0;
        while (memcmp(out[i] + w * t->width, t->cur + w * t->width, t->width) == 0) w++;
        rc = bench_fail(err, "decoded tensor '%s' differs from NEW at word %" PRIu64, t->name, w);
    }
    if (!rc) {
        r->peer_ok[k] = 1;
        r->peer_size[k] = patch.size;
        keep_patch(label, pf->name, patch.data, patch.size);
    }
    bench_buf_free(&patch);
    return rc;
}

/* =====================================================================
 * One pair, all measurements.  Returns the number of failures.  Each
 * failure prints its own line at once; one status line per pair follows
 * ("codec: rl-b:000->001: ferry ok trl ok ... xdelta3 ok").
 * ===================================================================== */
static void status_add(char *st, size_t cap, const char *name, int ok)
{
    size_t l = strlen(st);
    snprintf(st + l, cap - l, " %s %s", name, ok ? "ok" : "FAILED");
}

static int measure_pair(const pair_spec *ps, const options *o, pair_result *r)
{
    int failures = 0;
    bench_err err = {{0}};
    memset(r, 0, sizeof *r);
    ferry_model *a = NULL, *b = NULL;
    int frc = ferry_model_open(ps->oldp, &a);
    if (!frc) frc = ferry_model_open(ps->newp, &b);
    if (frc) {
        fprintf(stderr, "codec: %s: cannot open: %s\n", ps->label, ferry_last_error());
        ferry_model_free(a);
        return 1;
    }
    r->model_bytes = ferry_model_nbytes(b);
    char st[256] = "";

    /* ferry first: it handles any pair, the peers only same-structure ones. */
    if (run_ferry(ps->label, a, b, o->reps, r, &err)) {
        fprintf(stderr, "codec: %s: ferry: %s\n", ps->label, err.msg);
        failures++;
    }
    status_add(st, sizeof st, "ferry", r->ferry_ok);

    bench_pair pair = {0}, base = {0};
    uint8_t **out = NULL;
    if (pair_view(a, b, &pair, &err)) {
        fprintf(stderr, "codec: %s: %s\n", ps->label, err.msg);
        failures++;
        goto done;
    }
    pair.version = ps->new_step >= 0 ? ps->new_step : 1;
    pair.base_version = ps->old_step >= 0 ? ps->old_step : 0;
    base = pair;
    base.t = malloc((pair.count ? pair.count : 1) * sizeof *base.t);
    out = calloc(pair.count ? pair.count : 1, sizeof *out);
    if (!base.t || !out) { fprintf(stderr, "codec: out of memory\n"); exit(1); }
    for (size_t i = 0; i < pair.count; i++) {
        base.t[i] = pair.t[i];
        base.t[i].cur = NULL; /* decoders see OLD and the patch only */
        out[i] = malloc(pair.t[i].nbytes ? (size_t)pair.t[i].nbytes : 1);
        if (!out[i]) { fprintf(stderr, "codec: out of memory\n"); exit(1); }
    }

    peer_ctx ctx = {g_tmpdir};
    for (size_t k = 0; k < PEER_COUNT; k++) {
        if (run_peer(ps->label, &peer_formats[k], &ctx, &pair, &base, out, o->reps, r, k, &err)) {
            fprintf(stderr, "codec: %s: %s: round-trip failed: %s\n", ps->label, peer_formats[k].name, err.msg);
            failures++;
        }
        status_add(st, sizeof st, peer_formats[k].name, r->peer_ok[k]);
    }

    if (order0_compute(&pair, &r->o0, &err)) {
        fprintf(stderr, "codec: %s: order0: %s\n", ps->label, err.msg);
        failures++;
    } else {
        r->o0_ok = 1;
        r->nwords = r->o0.n;
        r->changed = r->o0.k;
    }

    if (o->generic) {
        uint8_t *want = NULL;
        size_t wn = 0;
        if (bench_read_file(ps->newp, &want, &wn, &err)) {
            fprintf(stderr, "codec: %s: %s\n", ps->label, err.msg);
            failures += 2;
            goto done;
        }
        if (baseline_zstd(ps->oldp, ps->newp, want, wn, g_tmpdir, &r->zstd, &err)) {
            fprintf(stderr, "codec: %s: zstd: %s\n", ps->label, err.msg);
            failures++;
        } else {
            r->zstd_ok = 1;
        }
        status_add(st, sizeof st, "zstd", r->zstd_ok);
        if (baseline_xdelta3(ps->oldp, ps->newp, want, wn, g_tmpdir, &r->xdelta, &err)) {
            fprintf(stderr, "codec: %s: xdelta3: %s\n", ps->label, err.msg);
            failures++;
        } else {
            r->xdelta_ok = 1;
        }
        status_add(st, sizeof st, "xdelta3", r->xdelta_ok);
        free(want);
    }

done:
    fprintf(stderr, "codec: %s:%s\n", ps->label, st);
    for (size_t i = 0; out && i < pair.count; i++) free(out[i]);
    free(out);
    free(base.t);
    free(pair.t);
    ferry_model_free(a);
    ferry_model_free(b);
    return failures;
}

/* =====================================================================
 * 7. Reporting
 * ===================================================================== */

/* Smallest of the four peers that round-tripped; -1 if none. */
static int best_peer(const pair_result *r)
{
    int best = -1;
    for (int k = 0; k < PEER_COUNT; k++)
        if (r->peer_ok[k] && (best < 0 || r->peer_size[k] < r->peer_size[best])) best = k;
    return best;
}

static double order0_bytes(const pair_result *r) { return r->o0.bits / 8; }

static void print_size(uint64_t v, int ok)
{
    if (ok) printf(" %10" PRIu64, v);
    else printf(" %10s", "FAIL");
}

/* Fastest peer at encode (enc = 1) or at in-place decode; -1 if none. */
static int fastest_peer(const pair_result *r, int enc)
{
    int best = -1;
    for (int k = 0; k < PEER_COUNT; k++) {
        const double *v = enc ? r->peer_enc_s : r->peer_dec_s;
        if (r->peer_ok[k] && (best < 0 || v[k] < v[best])) best = k;
    }
    return best;
}

/* Link speeds of the end-to-end table, Gbit/s. */
#define E2E_LINKS 4
static const double e2e_gbits[E2E_LINKS] = {0.1, 1, 10, 100};

/* Seconds to ship size bytes over a link of g Gbit/s, then decode. */
static double e2e_s(uint64_t size, double decode_s, double g) { return (double)size * 8 / (g * 1e9) + decode_s; }

static void print_speed(const pair_spec *ps, const pair_result *res, size_t n, const options *o, int lw)
{
    printf("\nSeconds, one thread, median of %d runs: encode (enc) and in-place decode (dec: ferry_apply_inplace;\n"
           "each peer's decoder scattering into a copy of OLD); ferry's apply into new memory in 'apply'\n\n", o->reps);
    printf("%-*s %4s %9s", lw, "pair", "", "ferry");
    for (int k = 0; k < PEER_COUNT; k++) printf(" %9s", peer_formats[k].name);
    printf(" %9s | %14s %14s\n", "apply", "ferry/fastest", "(peer)");
    for (size_t i = 0; i < n; i++) {
        const pair_result *r = &res[i];
        for (int enc = 1; enc >= 0; enc--) {
            printf("%-*s %4s %9.4f", lw, enc ? ps[i].label : "", enc ? "enc" : "dec",
                   enc ? r->ferry_enc_s : r->ferry_inp_s);
            for (int k = 0; k < PEER_COUNT; k++) printf(" %9.4f", enc ? r->peer_enc_s[k] : r->peer_dec_s[k]);
            int f = fastest_peer(r, enc);
            double mine = enc ? r->ferry_enc_s : r->ferry_inp_s, theirs = f < 0 ? 0 : enc ? r->peer_enc_s[f] : r->peer_dec_s[f];
            if (enc) printf(" %9.4f |", r->ferry_app_s);
            else printf(" %9s |", "");
            if (r->ferry_ok && f >= 0 && theirs > 0) printf(" %14.3f %14s\n", mine / theirs, peer_formats[f].name);
            else printf(" %14s %14s\n", "-", "-");
        }
    }
    printf("\nIn place against the raw scatter of the same changes (int32 indices + words, bench/scatter.h), seconds,\n"
           "median of %d runs interleaved; ferry/scatter with as many threads each; 2t/1t: one thread's seconds over two's\n\n",
           o->reps);
    printf("%-*s %9s %9s %9s %9s | %14s %14s %9s %9s\n", lw, "pair", "ferry 1t", "scatter", "ferry 2t", "scatter", "ferry/scat 1t",
           "ferry/scat 2t", "ferry 2t/1t", "scat");
    for (size_t i = 0; i < n; i++) {
        const pair_result *r = &res[i];
        if (!r->ferry_ok || r->scatter_s <= 0 || r->scatter2_s <= 0 || r->ferry_inp2_s <= 0) continue;
        printf("%-*s %9.4f %9.4f %9.4f %9.4f | %14.2f %14.2f %9.2f %9.2f\n", lw, ps[i].label, r->ferry_inp_s, r->scatter_s,
               r->ferry_inp2_s, r->scatter2_s, r->ferry_inp_s / r->scatter_s, r->ferry_inp2_s / r->scatter2_s,
               r->ferry_inp_s / r->ferry_inp2_s, r->scatter_s / r->scatter2_s);
    }
    printf("\nEnd to end, seconds = bytes / link + in-place decode (one thread); lowest marked *; ferry/low: ferry's\n"
           "seconds over the lowest peer's\n\n");
    printf("%-*s %9s %9s", lw, "pair", "Gbit/s", "ferry");
    for (int k = 0; k < PEER_COUNT; k++) printf(" %9s", peer_formats[k].name);
    printf(" %9s\n", "ferry/low");
    for (size_t i = 0; i < n; i++) {
        const pair_result *r = &res[i];
        for (int g = 0; g < E2E_LINKS; g++) {
            double v[PEER_COUNT + 1];
            int ok[PEER_COUNT + 1], low = -1;
            v[0] = e2e_s(r->ferry_size, r->ferry_inp_s, e2e_gbits[g]);
            ok[0] = r->ferry_ok;
            for (int k = 0; k < PEER_COUNT; k++) {
                v[k + 1] = e2e_s(r->peer_size[k], r->peer_dec_s[k], e2e_gbits[g]);
                ok[k + 1] = r->peer_ok[k];
            }
            for (int k = 0; k <= PEER_COUNT; k++) if (ok[k] && (low < 0 || v[k] < v[low])) low = k;
            printf("%-*s %9g", lw, g ? "" : ps[i].label, e2e_gbits[g]);
            for (int k = 0; k <= PEER_COUNT; k++) {
                if (ok[k]) printf(" %8.4f%c", v[k], k == low ? '*' : ' ');
                else printf(" %9s", "FAIL");
            }
            int lp = -1; /* the lowest peer */
            for (int k = 1; k <= PEER_COUNT; k++) if (ok[k] && (lp < 0 || v[k] < v[lp])) lp = k;
            if (ok[0] && lp > 0 && v[lp] > 0) printf(" %9.3f\n", v[0] / v[lp]);
            else printf(" %9s\n", "-");
        }
    }
}

static void print_tables(const pair_spec *ps, const pair_result *res, size_t n, const options *o)
{
    int lw = 13;
    for (size_t i = 0; i < n; i++) if ((int)strlen(ps[i].label) > lw) lw = (int)strlen(ps[i].label);

    printf("Patch sizes in bytes (ferry: ferry_diff default options; peers: our implementations,\n"
           "each decoded back to NEW; order0: per-tensor order-0 bound; zstd/xdelta3: generic\n"
           "baselines on the raw files, not peers)\n\n");
    printf("%-*s %10s %8s %10s", lw, "pair", "model", "changed", "ferry");
    for (int k = 0; k < PEER_COUNT; k++) printf(" %10s", peer_formats[k].name);
    printf(" %10s |%10s %10s\n", "order0", "zstd-19", "xdelta3");
    for (size_t i = 0; i < n; i++) {
        const pair_result *r = &res[i];
        printf("%-*s %10" PRIu64, lw, ps[i].label, r->model_bytes);
        if (r->o0_ok && r->nwords) printf(" %7.*f%%", r->changed * 100 < r->nwords ? 4 : 3,
                                          100.0 * (double)r->changed / (double)r->nwords);
        else printf(" %8s", "-");
        print_size(r->ferry_size, r->ferry_ok);
        for (int k = 0; k < PEER_COUNT; k++) print_size(r->peer_size[k], r->peer_ok[k]);
        print_size((uint64_t)(order0_bytes(r) + 0.5), r->o0_ok);
        printf(" |");
        if (o->generic) {
            print_size(r->zstd.size, r->zstd_ok);
            print_size(r->xdelta.size, r->xdelta_ok);
        } else {
            printf(" %10s %10s", "-", "-");
        }
        printf("\n");
    }

    printf("\nRatios and ferry speed (GB/s = NEW's tensor bytes / median seconds of %d runs)\n\n", o->reps);
    printf("%-*s %10s %10s %12s %12s %10s %10s %8s %12s\n", lw, "pair", "best_peer", "ferry/peer", "ferry/order0",
           "pooled/o0", "enc_GB/s", "apply_GB/s", "table", "payload/peer");
    for (size_t i = 0; i < n; i++) {
        const pair_result *r = &res[i];
        int bp = best_peer(r);
        printf("%-*s %10s", lw, ps[i].label, bp >= 0 ? peer_formats[bp].name : "-");
        if (r->ferry_ok && bp >= 0) printf(" %10.4f", (double)r->ferry_size / (double)r->peer_size[bp]);
        else printf(" %10s", "-");
        if (r->ferry_ok && r->o0_ok && r->o0.bits > 0) printf(" %12.4f", (double)r->ferry_size / order0_bytes(r));
        else printf(" %12s", "-");
        if (r->o0_ok && r->o0.bits > 0) printf(" %12.4f", r->o0.pooled_bits / r->o0.bits);
        else printf(" %12s", "-");
        if (r->ferry_ok && r->ferry_enc_s > 0 && r->ferry_app_s > 0)
            printf(" %10.3f %10.3f", (double)r->model_bytes / r->ferry_enc_s / 1e9,
                   (double)r->model_bytes / r->ferry_app_s / 1e9);
        else printf(" %10s %10s", "-", "-");
        if (r->ferry_ok && bp >= 0)
            printf(" %8" PRIu64 " %12.4f\n", r->ferry_table,
                   (double)(r->ferry_size - r->ferry_table) / (double)r->peer_size[bp]);
        else printf(" %8s %12s\n", "-", "-");
    }
    print_speed(ps, res, n, o, lw);
}

typedef struct summary {
    double max_peer_ratio, max_o0_ratio;
    size_t max_peer_at, max_o0_at;
    int have_peer, have_o0;
    double enc_gbs, app_gbs;   /* all pairs: total bytes / total median seconds */
    double enc_best_gbs, app_best_gbs; /* the same with the fastest runs */
} summary;

static summary summarize(const pair_result *res, size_t n)
{
    summary s = {0};
    double bytes = 0, te = 0, ta = 0, be = 0, ba = 0;
    for (size_t i = 0; i < n; i++) {
        const pair_result *r = &res[i];
        if (!r->ferry_ok) continue;
        int bp = best_peer(r);
        if (bp >= 0) {
            double q = (double)r->ferry_size / (double)r->peer_size[bp];
            if (!s.have_peer || q > s.max_peer_ratio) { s.max_peer_ratio = q; s.max_peer_at = i; }
            s.have_peer = 1;
        }
        if (r->o0_ok && r->o0.bits > 0) {
            double q = (double)r->ferry_size / order0_bytes(r);
            if (!s.have_o0 || q > s.max_o0_ratio) { s.max_o0_ratio = q; s.max_o0_at = i; }
            s.have_o0 = 1;
        }
        bytes += (double)r->model_bytes;
        te += r->ferry_enc_s;
        ta += r->ferry_app_s;
        be += r->ferry_enc_min_s;
        ba += r->ferry_app_min_s;
    }
    s.enc_best_gbs = be > 0 ? bytes / be / 1e9 : 0;
    s.app_best_gbs = ba > 0 ? bytes / ba / 1e9 : 0;
    s.enc_gbs = te > 0 ? bytes / te / 1e9 : 0;
    s.app_gbs = ta > 0 ? bytes / ta / 1e9 : 0;
    return s;
}

static void print_summary(const pair_spec *ps, const summary *s, const options *o)
{
    printf("\nSummary\n");
    if (s->have_peer)
        printf("  max ferry/min-peer   %.4f  (%s)\n", s->max_peer_ratio, ps[s->max_peer_at].label);
    if (s->have_o0)
        printf("  max ferry/order0     %.4f  (%s)\n", s->max_o0_ratio, ps[s->max_o0_at].label);
    printf("  ferry encode         %.3f GB/s   apply %.3f GB/s  (BF16 model bytes / median of %d runs, all pairs)\n",
           s->enc_gbs, s->app_gbs, o->reps);
    printf("  ferry fastest runs   %.3f GB/s   apply %.3f GB/s  (the same with each pair's fastest run)\n",
           s->enc_best_gbs, s->app_best_gbs);
    if (o->generic)
        printf("  generic baselines    zstd -%d --patch-from (level %d, no --long: it did not help), "
               "xdelta3 -e -s (defaults)\n", BASELINE_ZSTD_LEVEL, BASELINE_ZSTD_LEVEL);
}

static json_t *json_size(uint64_t v, int ok)
{
    return ok ? json_integer((json_int_t)v) : json_null();
}

static int write_json(const char *path, const pair_spec *ps, const pair_result *res, size_t n,
                      const summary *s, const options *o)
{
    json_t *root = json_object(), *arr = json_array();
    json_object_set_new(root, "bench", json_string("codec"));
    json_object_set_new(root, "ferry_version", json_string(ferry_version()));
    json_object_set_new(root, "reps", json_integer(o->reps));
    json_object_set_new(root, "units", json_string("bytes; seconds; GB/s = 1e9 bytes of NEW's tensors per second"));
    json_object_set_new(root, "zstd_cli", json_string(o->generic ? "zstd -19 --patch-from=OLD NEW" : "skipped"));
    json_object_set_new(root, "zstd_level", json_integer(BASELINE_ZSTD_LEVEL));
    json_object_set_new(root, "xdelta3_cli", json_string(o->generic ? "xdelta3 -e -s OLD NEW" : "skipped"));
    for (size_t i = 0; i < n; i++) {
        const pair_result *r = &res[i];
        json_t *p = json_object(), *peers = json_object(), *gen = json_object(), *o0 = json_object();
        json_object_set_new(p, "pair", json_string(ps[i].label));
        json_object_set_new(p, "old", json_string(ps[i].oldp));
        json_object_set_new(p, "new", json_string(ps[i].newp));
        json_object_set_new(p, "model_bytes", json_integer((json_int_t)r->model_bytes));
        json_object_set_new(p, "words", json_integer((json_int_t)r->nwords));
        json_object_set_new(p, "changed", json_integer((json_int_t)r->changed));
        json_t *f = json_object();
        json_object_set_new(f, "ok", json_boolean(r->ferry_ok));
        json_object_set_new(f, "bytes", json_size(r->ferry_size, r->ferry_ok));
        json_object_set_new(f, "encode_s", json_real(r->ferry_enc_s));
        json_object_set_new(f, "inplace_s", json_real(r->ferry_inp_s));
        json_object_set_new(f, "inplace2_s", json_real(r->ferry_inp2_s));
        json_object_set_new(f, "scatter_s", json_real(r->scatter_s));
        json_object_set_new(f, "scatter2_s", json_real(r->scatter2_s));
        json_object_set_new(f, "table_bytes", json_integer((json_int_t)r->ferry_table));
        json_object_set_new(f, "apply_s", json_real(r->ferry_app_s));
        json_object_set_new(f, "encode_min_s", json_real(r->ferry_enc_min_s));
        json_object_set_new(f, "apply_min_s", json_real(r->ferry_app_min_s));
        json_object_set_new(f, "encode_gbs", json_real(r->ferry_enc_s > 0 ? (double)r->model_bytes / r->ferry_enc_s / 1e9 : 0));
        json_object_set_new(f, "apply_gbs", json_real(r->ferry_app_s > 0 ? (double)r->model_bytes / r->ferry_app_s / 1e9 : 0));
        json_object_set_new(p, "ferry", f);
        for (int k = 0; k < PEER_COUNT; k++) {
            json_t *q = json_object();
            json_object_set_new(q, "ok", json_boolean(r->peer_ok[k]));
            json_object_set_new(q, "bytes", json_size(r->peer_size[k], r->peer_ok[k]));
            json_object_set_new(q, "encode_s", json_real(r->peer_enc_s[k]));
            json_object_set_new(q, "decode_s", json_real(r->peer_dec_s[k]));
            json_object_set_new(peers, peer_formats[k].name, q);
        }
        json_object_set_new(p, "peers", peers);
        int bp = best_peer(r);
        json_object_set_new(p, "best_peer", bp >= 0 ? json_string(peer_formats[bp].name) : json_null());
        json_object_set_new(o0, "bits", json_real(r->o0.bits));
        json_object_set_new(o0, "bytes", json_real(r->o0.bits / 8));
        json_object_set_new(o0, "mask_bits", json_real(r->o0.mask_bits));
        json_object_set_new(o0, "delta_bits", json_real(r->o0.delta_bits));
        json_object_set_new(o0, "pooled_bytes", json_real(r->o0.pooled_bits / 8));
        json_object_set_new(o0, "distinct_deltas", json_integer((json_int_t)r->o0.distinct));
        json_object_set_new(p, "order0", r->o0_ok ? o0 : (json_decref(o0), json_null()));
        if (o->generic) {
            json_object_set_new(gen, "zstd", json_size(r->zstd.size, r->zstd_ok));
            json_object_set_new(gen, "zstd_encode_s", json_real(r->zstd.encode_s));
            json_object_set_new(gen, "xdelta3", json_size(r->xdelta.size, r->xdelta_ok));
            json_object_set_new(gen, "xdelta3_encode_s", json_real(r->xdelta.encode_s));
        }
        json_object_set_new(p, "generic", gen);
        json_object_set_new(p, "ferry_over_min_peer",
                            r->ferry_ok && bp >= 0 ? json_real((double)r->ferry_size / (double)r->peer_size[bp]) : json_null());
        json_object_set_new(p, "ferry_over_order0",
                            r->ferry_ok && r->o0_ok && r->o0.bits > 0 ? json_real((double)r->ferry_size / order0_bytes(r)) : json_null());
        json_array_append_new(arr, p);
    }
    json_object_set_new(root, "pairs", arr);
    json_t *sm = json_object();
    json_object_set_new(sm, "max_ferry_over_min_peer", s->have_peer ? json_real(s->max_peer_ratio) : json_null());
    json_object_set_new(sm, "max_ferry_over_min_peer_pair", s->have_peer ? json_string(ps[s->max_peer_at].label) : json_null());
    json_object_set_new(sm, "max_ferry_over_order0", s->have_o0 ? json_real(s->max_o0_ratio) : json_null());
    json_object_set_new(sm, "max_ferry_over_order0_pair", s->have_o0 ? json_string(ps[s->max_o0_at].label) : json_null());
    json_object_set_new(sm, "encode_gbs", json_real(s->enc_gbs));
    json_object_set_new(sm, "apply_gbs", json_real(s->app_gbs));
    json_object_set_new(sm, "encode_fastest_gbs", json_real(s->enc_best_gbs));
    json_object_set_new(sm, "apply_fastest_gbs", json_real(s->app_best_gbs));
    json_object_set_new(root, "summary", sm);
    int rc = json_dump_file(root, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(root);
    if (rc) fprintf(stderr, "codec: cannot write %s\n", path);
    return rc ? -1 : 0;
}

/* =====================================================================
 * main
 * ===================================================================== */
int main(int argc, char **argv)
{
    options o = {0};
    o.reps = 5;
    o.generic = 1;
    o.data = getenv("FERRY_DATA");
    if (!o.data || !*o.data) o.data = "../shared/data";
    static const struct option lopts[] = {
        {"data", required_argument, NULL, 'd'}, {"pairs", required_argument, NULL, 'p'},
        {"reps", required_argument, NULL, 'r'}, {"json", required_argument, NULL, 'j'},
        {"no-generic", no_argument, NULL, 'G'}, {"keep", required_argument, NULL, 'k'},
        {"corrupt", required_argument, NULL, 'c'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", lopts, NULL)) != -1) {
        switch (c) {
        case 'd': o.data = optarg; break;
        case 'p': o.pairs = optarg; break;
        case 'j': o.json = optarg; break;
        case 'G': o.generic = 0; break;
        case 'k': g_keep_dir = optarg; break;
        case 'c': g_corrupt = optarg; break;
        case 'r': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v < 1 || v > BENCH_MAX_REPS) {
                fprintf(stderr, "codec: --reps wants an integer in 1..%d, not '%s'\n", BENCH_MAX_REPS, optarg);
                return 1;
            }
            o.reps = (int)v;
            break;
        }
        case 'h': fputs(usage, stdout); return 0;
        default: fputs(usage, stderr); return 1;
        }
    }
    if ((argc - optind) % 2) {
        fprintf(stderr, "codec: file arguments come in OLD NEW pairs (got %d)\n", argc - optind);
        return 1;
    }

    pair_list pl = {0};
    if (optind < argc) {
        for (int i = optind; i < argc; i += 2) {
            for (int j = 0; j < 2; j++) {
                if (access(argv[i + j], R_OK)) {
                    fprintf(stderr, "codec: cannot read %s: %s\n", argv[i + j], strerror(errno));
                    return 1;
                }
            }
            pair_spec p = {0};
            p.oldp = xstrdup(argv[i]);
            p.newp = xstrdup(argv[i + 1]);
            p.old_step = step_number(argv[i]);
            p.new_step = step_number(argv[i + 1]);
            p.label = file_pair_label(p.oldp, p.newp, p.old_step, p.new_step);
            pairs_push(&pl, p);
        }
    } else if (discover_pairs(o.data, o.pairs, &pl)) {
        return 1;
    }
    if (pl.n == 0) {
        fprintf(stderr, "codec: no checkpoint pairs found in %s%s%s\n", o.data,
                o.pairs ? " matching --pairs " : "", o.pairs ? o.pairs : "");
        return 1;
    }
    if (tmpdir_create()) return 1;

    pair_result *res = calloc(pl.n, sizeof *res);
    if (!res) { fprintf(stderr, "codec: out of memory\n"); return 1; }
    int failures = 0;
    for (size_t i = 0; i < pl.n; i++) failures += measure_pair(&pl.v[i], &o, &res[i]);

    print_tables(pl.v, res, pl.n, &o);
    summary s = summarize(res, pl.n);
    print_summary(pl.v, &s, &o);
    if (o.json && write_json(o.json, pl.v, res, pl.n, &s, &o)) failures++;
    if (failures) fprintf(stderr, "codec: %d failure(s); see the lines above\n", failures);

    for (size_t i = 0; i < pl.n; i++) { free(pl.v[i].label); free(pl.v[i].oldp); free(pl.v[i].newp); }
    free(pl.v);
    free(res);
    return failures ? 1 : 0;
}
