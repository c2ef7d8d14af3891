/* ferry diff / apply / inspect. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "util.h"

#define PATCH_READ_MAX ((size_t)1 << 40)

/* Parsed command line shared by the patch commands. */
typedef struct args {
    const char *pos[3];
    int npos;
    const char *out;
    bool json, quiet, cast;
    long level, threads;
    bool has_max_out;
    unsigned long long max_out; /* apply --max-output */
} args;

/* Returns -1 when parsing succeeded, else the exit status to return. */
static int parse(const char *cmd, int argc, char **argv, args *a, int want_pos, bool takes_out, void (*help)(void))
{
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (cli_is_help(s)) { help(); return 0; }
        if (takes_out && (!strcmp(s, "-o") || !strcmp(s, "--output"))) {
            if (++i == argc) return cli_usage_error(cmd, "%s needs a path", s);
            a->out = argv[i];
        } else if (!strcmp(s, "--json")) a->json = true;
        else if (!strcmp(s, "-q") || !strcmp(s, "--quiet")) a->quiet = true;
        else if (!strcmp(s, "--cast-bf16")) a->cast = true;
        else if (!strcmp(s, "--level") || !strcmp(s, "--threads")) {
            long *dst = s[2] == 'l' ? &a->level : &a->threads;
            if (++i == argc || !cli_parse_int(argv[i], s[2] == 'l' ? 1 : 0, s[2] == 'l' ? 19 : 256, dst))
                return cli_usage_error(cmd, "%s needs a number in range", s);
        } else if (!strcmp(cmd, "apply") && !strcmp(s, "--max-output")) {
            char *end = NULL;
            if (++i == argc || argv[i][0] < '0' || argv[i][0] > '9' ||
                ((a->max_out = strtoull(argv[i], &end, 10)), *end) || a->max_out == ULLONG_MAX)
                return cli_usage_error(cmd, "%s needs a number of bytes", s);
            a->has_max_out = true;
        } else if (s[0] == '-' && s[1]) return cli_usage_error(cmd, "unknown option '%s'", s);
        else if (a->npos == want_pos) return cli_usage_error(cmd, "unexpected argument '%s'", s);
        else a->pos[a->npos++] = s;
    }
    if (a->npos != want_pos) return cli_usage_error(cmd, "expects %d argument%s", want_pos, want_pos > 1 ? "s" : "");
    if (takes_out && !a->out) return cli_usage_error(cmd, "missing -o OUTPUT");
    return -1;
}

static void diff_help(void)
{
    puts("usage: ferry diff OLD NEW -o PATCH [--cast-bf16] [--threads N] [--level N] [--json] [-q]\n\n"
         "Encodes the lossless patch that turns checkpoint OLD into NEW.  OLD and NEW\n"
         "are .safetensors files or directories of a sharded checkpoint\n"
         "(model.safetensors.index.json).  The patch carries both models' hashes,\n"
         "so 'ferry apply' refuses any other base and proves its result.\n\n"
         "  -o PATCH      output file (written aside and renamed: never partial; an\n"
         "                existing PATCH that is not a regular file is refused)\n"
         "  --cast-bf16   NEW holds FP32 master weights: gate them against OLD as\n"
         "                their BF16 cast (bit-identical to PyTorch's), on the fly\n"
         "  --threads N   worker threads (default 1)\n"
         "  --level N     zstd level for tensors carried whole, 1..19 (default 3)\n"
         "  --json        print a JSON summary on stdout\n"
         "  -q            print nothing on success");
}

int cmd_diff(int argc, char **argv)
{
    args a;
    int st = parse("diff", argc, argv, &a, 2, true, diff_help);
    if (st >= 0) return st;
    ferry_model *m0 = NULL, *m1 = NULL;
    void *patch = NULL;
    size_t size = 0;
    int rc, ret = 1;
    if ((rc = ferry_model_open(a.pos[0], &m0))) { cli_fail("diff", rc, a.pos[0]); goto out; }
    if ((rc = ferry_model_open(a.pos[1], &m1))) { cli_fail("diff", rc, a.pos[1]); goto out; }
    ferry_diff_options o = {.level = (int)a.level, .threads = (int)a.threads, .cast_bf16 = a.cast};
    double t0 = cli_now();
    if ((rc = ferry_diff(m0, m1, &o, &patch, &size))) { cli_fail("diff", rc, "encoding"); goto out; }
    double ms = (cli_now() - t0) * 1e3;
    if ((rc = ferry_file_write(a.out, patch, size))) { cli_fail("diff", rc, a.out); goto out; }
    ferry_patch_info *pi = NULL;
    uint64_t full = 0; /* the target's bytes (BF16 when cast) */
    if (!ferry_patch_inspect(patch, size, &pi))
        for (size_t i = 0; i < ferry_patch_info_count(pi); i++) {
            const ferry_patch_tensor_info *t = ferry_patch_info_tensor(pi, i);
            if (t->kind != FERRY_PT_REMOVED) full += t->nelem * ferry_dtype_bits(t->dtype) / 8;
        }
    ferry_patch_info_free(pi);
    if (a.json)
        printf("{\"patch\": \"%s\", \"patch_bytes\": %zu, \"target_bytes\": %llu, \"ratio\": %.6f, \"encode_ms\": %.3f, "
               "\"peak_rss_kib\": %ld}\n",
               a.out, size, (unsigned long long)full, full ? (double)size / (double)full : 0.0, ms, cli_peak_rss_kib());
    else if (!a.quiet)
        printf("%s: %zu bytes (%.3f%% of %llu tensor bytes), encoded in %.1f ms\n", a.out, size,
               full ? 100.0 * (double)size / (double)full : 0.0, (unsigned long long)full, ms);
    ret = 0;
out:
    ferry_free(patch);
    ferry_model_free(m0);
    ferry_model_free(m1);
    return ret;
}

static void apply_help(void)
{
    puts("usage: ferry apply BASE PATCH -o OUT [--threads N] [--max-output BYTES] [--json] [-q]\n\n"
         "Applies PATCH to checkpoint BASE and writes the result to OUT as one\n"
         ".safetensors file holding exactly the target's tensors (names, dtypes,\n"
         "shapes, bits) and __metadata__.  Refuses a BASE whose hash is not the\n"
         "patch's base hash; streams the result into a new OUT.tmp.PID.RANDOM with bounded\n"
         "memory, verifies every tensor and the whole model against the target\n"
         "hashes, and only then renames it to OUT.  An existing OUT must be a regular\n"
         "file: a device, FIFO, directory or symbolic link is refused, never replaced.\n\n"
         "  --threads N   worker threads (default 1)\n"
         "  --max-output BYTES  refuse (before writing anything) a patch whose\n"
         "                target model has more tensor bytes than this (a tiny\n"
         "                patch can declare any size); default 4 x BASE's\n"
         "                tensor bytes, at least 1 GiB; 0 = no bound");
}

int cmd_apply(int argc, char **argv)
{
    args a;
    int st = parse("apply", argc, argv, &a, 2, true, apply_help);
    if (st >= 0) return st;
    ferry_model *base = NULL;
    void *patch = NULL;
    size_t size = 0;
    int rc, ret = 1;
    if ((rc = ferry_model_open(a.pos[0], &base))) { cli_fail("apply", rc, a.pos[0]); goto done; }
    if ((rc = ferry_file_read(a.pos[1], PATCH_READ_MAX, &patch, &size))) { cli_fail("apply", rc, a.pos[1]); goto done; }
    double t0 = cli_now();
    uint64_t bn = ferry_model_nbytes(base), dflt = bn > (UINT64_MAX >> 3) ? UINT64_MAX : 4 * bn;
    ferry_apply_options o = {.threads = (int)a.threads,
                             .max_output_bytes = a.has_max_out ? a.max_out : dflt > (1ull << 30) ? dflt : 1ull << 30};
    if ((rc = ferry_apply_file(base, patch, size, &o, a.out))) { cli_fail("apply", rc, a.pos[1]); goto done; }
    double ms = (cli_now() - t0) * 1e3;
    if (a.json)
        printf("{\"output\": \"%s\", \"apply_ms\": %.3f, \"verified\": true, \"peak_rss_kib\": %ld}\n", a.out, ms,
               cli_peak_rss_kib());
    else if (!a.quiet) printf("%s: verified against the target hash, applied in %.1f ms\n", a.out, ms);
    ret = 0;
done:
    ferry_free(patch);
    ferry_model_free(base);
    return ret;
}

static void inspect_help(void)
{
    puts("usage: ferry inspect PATCH [--json]\n\n"
         "Validates PATCH's header, checksum and tensor table and prints, per tensor,\n"
         "how it is carried (sparse, whole, removed, same), elements, changed\n"
         "elements, density and bytes; then totals and the base and target hashes.");
}

static const char *kind_name(int k)
{
    static const char *n[] = {"sparse", "whole", "removed", "same"};
    return k >= 0 && k < 4 ? n[k] : "?";
}

int cmd_inspect(int argc, char **argv)
{
    args a;
    int st = parse("inspect", argc, argv, &a, 1, false, inspect_help);
    if (st >= 0) return st;
    void *patch = NULL;
    size_t size = 0;
    ferry_patch_info *pi = NULL;
    int rc;
    if ((rc = ferry_file_read(a.pos[0], PATCH_READ_MAX, &patch, &size)) || (rc = ferry_patch_inspect(patch, size, &pi))) {
        ferry_free(patch);
        return cli_fail("inspect", rc, a.pos[0]);
    }
    uint8_t hb[16], ht[16];
    char sb[33], stg[33];
    ferry_patch_info_hashes(pi, hb, ht);
    hex16(sb, hb);
    hex16(stg, ht);
    uint64_t nel = 0, chg = 0, tb = 0;
    size_t n = ferry_patch_info_count(pi);
    if (a.json) printf("{\"format\": %u, \"bytes\": %zu, \"base_hash\": \"%s\", \"target_hash\": \"%s\", \"tensors\": [", ferry_patch_info_format(pi), size, sb, stg);
    else printf("%-48s %-8s %-6s %12s %12s %9s %10s\n", "tensor", "kind", "dtype", "elements", "changed", "density", "bytes");
    for (size_t i = 0; i < n; i++) {
        const ferry_patch_tensor_info *t = ferry_patch_info_tensor(pi, i);
        double dens = t->nelem ? (double)t->changed / (double)t->nelem : 0.0;
        nel += t->kind == FERRY_PT_REMOVED ? 0 : t->nelem;
        chg += t->changed;
        tb += t->bytes;
        const char *dt = t->kind == FERRY_PT_REMOVED ? "-" : ferry_dtype_name(t->dtype);
        if (a.json) {
            printf("%s{\"name\": ", i ? ", " : "");
            json_str(stdout, t->name);
            printf(", \"kind\": \"%s\", \"dtype\": \"%s\", \"elements\": %llu, \"changed\": %llu, \"density\": %.6g, \"bytes\": %llu}",
                   kind_name(t->kind), dt, (unsigned long long)t->nelem, (unsigned long long)t->changed, dens, (unsigned long long)t->bytes);
        } else {
            printf("%-48s %-8s %-6s %12llu %12llu %8.4f%% %10llu\n", t->name, kind_name(t->kind), dt, (unsigned long long)t->nelem,
                   (unsigned long long)t->changed, 100 * dens, (unsigned long long)t->bytes);
        }
    }
    double dens = nel ? (double)chg / (double)nel : 0.0;
    if (a.json)
        printf("], \"totals\": {\"tensors\": %zu, \"elements\": %llu, \"changed\": %llu, \"density\": %.6g, \"payload_bytes\": %llu, \"overhead_bytes\": %llu}}\n",
               n, (unsigned long long)nel, (unsigned long long)chg, dens, (unsigned long long)tb, (unsigned long long)(size - tb));
    else
        printf("total: %zu tensors, %llu elements, %llu changed (%.4f%%), %zu bytes (%llu payload + %llu table/header)\n"
               "format %u, base %s, target %s\n",
               n, (unsigned long long)nel, (unsigned long long)chg, 100 * dens, size, (unsigned long long)tb,
               (unsigned long long)(size - tb), ferry_patch_info_format(pi), sb, stg);
    ferry_patch_info_free(pi);
    ferry_free(patch);
    return 0;
}
