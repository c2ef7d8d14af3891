/* ferry publish: one checkpoint as the next version of a run. */
#include "cmd_sync.h"

#ifndef FERRY_NO_NET
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry_quant.h"
#include "util.h"

static void publish_help(void)
{
    printf("usage: ferry publish STORE --run RUN CKPT [--anchor-every K] [--anchor] [--cast-bf16]\n"
           "                     [--publisher-id ID] [--cache PATH] [--new-run] [--verify] [--level N]\n"
           "                     [--threads N] [--concurrency N] [--quantize SCHEME] [--json] [-q]\n\n"
           "Publishes checkpoint CKPT (a .safetensors file or a sharded checkpoint) as the\n"
           "next version of RUN: the delta from the version HEAD names (and, every K\n"
           "versions, the full model as an anchor), then the version's manifest, then HEAD\n"
           "by compare-and-swap.  The previous version's model is fetched from the store\n"
           "(or taken from --cache when it holds it) so that the delta is against the\n"
           "exact bits subscribers hold.  Fails with exit status 3, uploading nothing, if\n"
           "another publisher moved HEAD since.  Prints version, kind and bytes.\n\n"
           "  --anchor-every K   a full anchor when K versions passed since the last (default 10)\n"
           "  --anchor           make this version an anchor\n"
           "  --cast-bf16        publish FP32 tensors as their BF16 cast (FP32 masters)\n"
           "  --quantize SCHEME  publish the FP8 checkpoint (`ferry quantize`): fp8-block128, or\n"
           "                     fp8-block128-sticky (block scales kept from the previous\n"
           "                     version while they fit); a run keeps its scheme\n"
           "  --publisher-id ID  named in HEAD, manifests and conflict errors\n"
           "                     (default HOST:PID:RANDOM)\n"
           "  --cache PATH       keep the published model at PATH (with PATH.ferry.json) so the\n"
           "                     next publish need not download it; its state pins the run id\n"
           "  --new-run          HEAD is gone but RUN/v/ (or --cache) holds versions: start the\n"
           "                     run anew at version 1 with a new run id.  Without it that\n"
           "                     publish is refused (exit 3): restore HEAD with\n"
           "                     `ferry head-repair` instead of restarting the run by accident\n"
           "  --verify           apply the new delta to the previous model and check it first\n"
           "  --level N          zstd level for whole tensors (default 3)\n"
           "  --threads N        codec threads (default 1)\n"
           "  --concurrency N    s3://: parts of a multipart upload sent at once, 1..64\n"
           "                     (default 4; --rate caps each)\n\n%s\n",
           sync_common_help);
}

int cmd_publish(int argc, char **argv)
{
    sync_common c;
    sync_common_init(&c);
    ferry_publisher_options po = {0};
    const char *ckpt = NULL;
    unsigned flags = 0;
    long num;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) { publish_help(); return 0; }
        int r = sync_common_opt("publish", argc, argv, &i, &c);
        if (r == 2) return 2;
        if (r) continue;
        if (!strcmp(a, "--anchor")) flags |= FERRY_PUBLISH_ANCHOR;
        else if (!strcmp(a, "--cast-bf16")) po.cast_bf16 = 1;
        else if (!strcmp(a, "--verify")) po.verify = 1;
        else if (!strcmp(a, "--new-run")) po.new_run = 1;
        else if (!strcmp(a, "--quantize")) {
            ferry_quant q;
            if (++i == argc) return cli_usage_error("publish", "--quantize needs a scheme");
            if (ferry_quant_parse(argv[i], &q)) return cli_usage_error("publish", "--quantize: %s", ferry_last_error());
            po.quantize = (int)q;
        }
        else if (!strcmp(a, "--publisher-id") || !strcmp(a, "--cache")) {
            if (++i == argc) return cli_usage_error("publish", "%s needs a value", a);
            if (a[2] == 'p') po.publisher_id = argv[i];
            else po.cache_path = argv[i];
        } else if (!strcmp(a, "--concurrency")) {
            if (++i == argc || !cli_parse_int(argv[i], 1, 64, &num)) return cli_usage_error("publish", "--concurrency needs 1..64");
            c.so.upload_concurrency = (unsigned)num;
        } else if (!strcmp(a, "--anchor-every") || !strcmp(a, "--level") || !strcmp(a, "--threads")) {
            long lo = 1, hi = a[2] == 'l' ? 19 : a[2] == 't' ? 256 : 1000000000L;
            if (++i == argc || !cli_parse_int(argv[i], lo, hi, &num)) return cli_usage_error("publish", "%s needs a number in %ld..%ld", a, lo, hi);
            if (a[2] == 'a') po.anchor_every = (uint32_t)num;
            else if (a[2] == 'l') po.level = (int)num;
            else po.threads = (int)num;
        } else if (a[0] == '-' && a[1]) return cli_usage_error("publish", "unknown option '%s'", a);
        else if (sync_common_pos(&c, a)) continue;
        else if (!ckpt) ckpt = a;
        else return cli_usage_error("publish", "unexpected argument '%s'", a);
    }
    int st = sync_common_check("publish", &c);
    if (st) return st;
    if (!ckpt) return cli_usage_error("publish", "expects a checkpoint CKPT");

    ferry_model *m = NULL;
    ferry_store *store = NULL;
    ferry_publisher *pub = NULL;
    int rc, ret;
    if ((rc = ferry_model_open(ckpt, &m))) return cli_fail("publish", rc, ckpt);
    if ((ret = sync_open_store("publish", &c, 1, &store))) goto out;
    po.keys = c.keys;
    po.run_id = c.run_id;
    if ((rc = ferry_publisher_open(store, c.run, &po, &pub))) {
        ret = sync_fail("publish", rc, c.run);
        goto out;
    }
    ferry_publish_info info;
    if ((rc = ferry_publish_ex(pub, m, flags, &info))) {
        ret = sync_fail("publish", rc, ckpt);
        goto out;
    }
    sync_progress_end();
    char h[33];
    hex16(h, info.model_hash);
    const char *kind = info.kind == FERRY_SYNC_ANCHOR ? "anchor" : "delta";
    if (c.json) {
        printf("{\"run\": ");
        json_str(stdout, c.run);
        printf(", \"version\": %llu, \"kind\": \"%s\", \"id\": \"%s\", \"run_id\": \"%s\", \"delta_bytes\": %llu, \"full_bytes\": %llu, "
               "\"bytes\": %llu, \"model_bytes\": %llu, \"model_hash\": \"%s\", \"seconds\": %.3f}\n",
               (unsigned long long)info.version, kind, info.id, ferry_publisher_run_id(pub), (unsigned long long)info.delta_bytes,
               (unsigned long long)info.full_bytes, (unsigned long long)(info.delta_bytes + info.full_bytes),
               (unsigned long long)info.model_bytes, h, info.seconds);
    } else if (!c.quiet) {
        printf("%s: version %llu (%s): %llu bytes uploaded", c.run, (unsigned long long)info.version, kind,
               (unsigned long long)(info.delta_bytes + info.full_bytes));
        if (info.kind == FERRY_SYNC_ANCHOR && info.delta_bytes)
            printf(" (full %llu, delta %llu)", (unsigned long long)info.full_bytes, (unsigned long long)info.delta_bytes);
        printf(" for %llu tensor bytes, in %.2f s\n", (unsigned long long)info.model_bytes, info.seconds);
    }
    ret = 0;
out:
    ferry_publisher_free(pub);
    ferry_store_free(store);
    ferry_model_free(m);
    return ret;
}
#endif
