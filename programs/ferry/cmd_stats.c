/* ferry stats: how two checkpoints differ, without writing a patch. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "util.h"

static void stats_help(void)
{
    puts("usage: ferry stats OLD NEW [--json]\n\n"
         "Per tensor: elements, changed elements and their share; totals; and the\n"
         "histogram of change deltas in units in the last place (ULP, measured on\n"
         "the sign-magnitude order of the bit patterns: -4..+4, and |d| > 4).\n"
         "Tensors added, re-typed or re-shaped count as wholly changed.");
}

static void hist_json(const uint64_t *h, uint64_t far)
{
    printf("{");
    for (int j = 0; j < FERRY_ULP_BINS; j++) printf("%s\"%d\": %llu", j ? ", " : "", j - 4, (unsigned long long)h[j]);
    printf(", \"far\": %llu}", (unsigned long long)far);
}

/* Whether path starts with a patch's magic (docs/FORMAT.md: ASCII
 * "FERRYPAT"): asked only after it failed to open as a checkpoint, so that
 * a patch given to stats is named as one instead of as a checkpoint with
 * a bad header length. */
static bool is_patch(const char *path)
{
    char m[8];
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    bool yes = fread(m, 1, sizeof m, f) == sizeof m && !memcmp(m, "FERRYPAT", sizeof m);
    fclose(f);
    return yes;
}

static int open_checkpoint(const char *path, ferry_model **out)
{
    int rc = ferry_model_open(path, out);
    if (rc && is_patch(path)) {
        fprintf(stderr, "%s stats: %s: this is a patch, not a checkpoint: use %s inspect %s "
                        "(stats compares two .safetensors checkpoints)\n", cli_program, path, cli_program, path);
        return 1;
    }
    return rc ? cli_fail("stats", rc, path) : 0;
}

int cmd_stats(int argc, char **argv)
{
    const char *pos[2];
    int npos = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) { stats_help(); return 0; }
        if (!strcmp(argv[i], "--json")) json = true;
        else if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error("stats", "unknown option '%s'", argv[i]);
        else if (npos == 2) return cli_usage_error("stats", "unexpected argument '%s'", argv[i]);
        else pos[npos++] = argv[i];
    }
    if (npos != 2) return cli_usage_error("stats", "expects OLD and NEW");
    ferry_model *a = NULL, *b = NULL;
    ferry_stats s;
    int rc;
    if ((rc = open_checkpoint(pos[0], &a))) return rc;
    if ((rc = open_checkpoint(pos[1], &b))) { ferry_model_free(a); return rc; }
    if ((rc = ferry_stats_compute(a, b, &s))) { ferry_model_free(a); ferry_model_free(b); return cli_fail("stats", rc, "comparing"); }
    double share = s.nelem ? (double)s.changed / (double)s.nelem : 0.0;
    if (json) {
        printf("{\"elements\": %llu, \"changed\": %llu, \"changed_fraction\": %.6g, \"ulp_hist\": ", (unsigned long long)s.nelem,
               (unsigned long long)s.changed, share);
        hist_json(s.ulp_hist, s.ulp_far);
        printf(", \"tensors\": [");
        for (size_t i = 0; i < s.count; i++) {
            const ferry_tensor_stats *t = &s.tensors[i];
            printf("%s{\"name\": ", i ? ", " : "");
            json_str(stdout, t->name);
            printf(", \"dtype\": \"%s\", \"elements\": %llu, \"changed\": %llu, \"changed_fraction\": %.6g, \"comparable\": %s, \"ulp_hist\": ",
                   ferry_dtype_name(t->dtype), (unsigned long long)t->nelem, (unsigned long long)t->changed,
                   t->nelem ? (double)t->changed / (double)t->nelem : 0.0, t->comparable ? "true" : "false");
            hist_json(t->ulp_hist, t->ulp_far);
            printf("}");
        }
        printf("]}\n");
    } else {
        printf("%-48s %-6s %12s %12s %9s\n", "tensor", "dtype", "elements", "changed", "changed%");
        for (size_t i = 0; i < s.count; i++) {
            const ferry_tensor_stats *t = &s.tensors[i];
            printf("%-48s %-6s %12llu %12llu %8.4f%%%s\n", t->name, ferry_dtype_name(t->dtype), (unsigned long long)t->nelem,
                   (unsigned long long)t->changed, t->nelem ? 100.0 * (double)t->changed / (double)t->nelem : 0.0,
                   t->comparable ? "" : "  (new/re-shaped)");
        }
        printf("total: %llu elements, %llu changed (%.4f%%)\nULP deltas:", (unsigned long long)s.nelem, (unsigned long long)s.changed, 100 * share);
        uint64_t cmp = s.ulp_far;
        for (int j = 0; j < FERRY_ULP_BINS; j++) cmp += s.ulp_hist[j];
        for (int j = 0; j < FERRY_ULP_BINS; j++)
            if (j != 4) printf(" %+d:%.2f%%", j - 4, cmp ? 100.0 * (double)s.ulp_hist[j] / (double)cmp : 0.0);
        printf(" |d|>4:%.2f%%\n", cmp ? 100.0 * (double)s.ulp_far / (double)cmp : 0.0);
    }
    ferry_stats_release(&s);
    ferry_model_free(a);
    ferry_model_free(b);
    return 0;
}
