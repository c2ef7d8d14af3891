/* ferry quantize: a BF16 checkpoint as the FP8 checkpoint ferry publishes
 * under --quantize (include/ferry_quant.h). */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ferry_quant.h"
#include "util.h"

static void quantize_help(void)
{
    puts("usage: ferry quantize IN OUT [--scheme fp8-block128] [--prev PREV] [--cast-bf16] [--json]\n\n"
         "Writes IN's FP8 version to OUT (one .safetensors file, written aside and\n"
         "renamed): every BF16 2-D tensor with both dims >= 128 whose name has\n"
         "neither 'embed' nor 'lm_head' becomes NAME (F8_E4M3) + NAME_scale_inv\n"
         "(F32, one scale per 128x128 block); the rest is copied (docs/FORMAT.md,\n"
         "\"FP8 block quantization\").\n\n"
         "  --scheme S    fp8-block128 (default), fp8-block128-sticky (keeps PREV's\n"
         "                block scales while they fit: differs from an engine's own\n"
         "                quantization), none\n"
         "  --prev PREV   the previous version's FP8 checkpoint (sticky scales)\n"
         "  --cast-bf16   FP32 tensors are taken as their BF16 cast (FP32 masters)\n"
         "  --json        one JSON object: tensors, blocks, scales kept, bytes");
}

int cmd_quantize(int argc, char **argv)
{
    const char *pos[2], *scheme = "fp8-block128", *prev_path = NULL;
    int npos = 0, cast = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) { quantize_help(); return 0; }
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--cast-bf16")) cast = 1;
        else if (!strcmp(argv[i], "--scheme") || !strcmp(argv[i], "--prev")) {
            if (i + 1 == argc) return cli_usage_error("quantize", "%s needs a value", argv[i]);
            if (!strcmp(argv[i], "--scheme")) scheme = argv[++i];
            else prev_path = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error("quantize", "unknown option '%s'", argv[i]);
        else if (npos == 2) return cli_usage_error("quantize", "unexpected argument '%s'", argv[i]);
        else pos[npos++] = argv[i];
    }
    if (npos != 2) return cli_usage_error("quantize", "expects IN and OUT");
    ferry_quant q;
    int rc = ferry_quant_parse(scheme, &q);
    if (rc) return cli_usage_error("quantize", "--scheme: %s", ferry_last_error());
    ferry_model *in = NULL, *prev = NULL, *out = NULL;
    ferry_quant_stats st;
    if ((rc = ferry_model_open(pos[0], &in))) return cli_fail("quantize", rc, pos[0]);
    if (prev_path && (rc = ferry_model_open(prev_path, &prev))) {
        ferry_model_free(in);
        return cli_fail("quantize", rc, prev_path);
    }
    double t0 = cli_now();
    rc = ferry_quantize(in, q, cast, prev, &out, &st);
    double secs = cli_now() - t0;
    if (!rc) rc = ferry_model_save(out, pos[1]);
    int ret = rc ? cli_fail("quantize", rc, pos[1]) : 0;
    if (!rc && json)
        printf("{\"scheme\": \"%s\", \"tensors\": %llu, \"blocks\": %llu, \"scales_kept\": %llu, \"in_bytes\": %llu, "
               "\"out_bytes\": %llu, \"seconds\": %.6f}\n",
               scheme, (unsigned long long)st.tensors, (unsigned long long)st.blocks, (unsigned long long)st.scales_kept,
               (unsigned long long)ferry_model_nbytes(in), (unsigned long long)ferry_model_nbytes(out), secs);
    else if (!rc)
        printf("%s: %llu tensors in %llu blocks (%llu scales kept), %llu -> %llu bytes, %.3f s\n", scheme,
               (unsigned long long)st.tensors, (unsigned long long)st.blocks, (unsigned long long)st.scales_kept,
               (unsigned long long)ferry_model_nbytes(in), (unsigned long long)ferry_model_nbytes(out), secs);
    ferry_model_free(out);
    ferry_model_free(prev);
    ferry_model_free(in);
    return ret;
}
