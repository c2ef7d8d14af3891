/* libFuzzer target for the sparse chunk codecs, differential across kernel
 * levels: the vectorised decoders (AVX-512, AVX2) must answer exactly as
 * the portable one on every input, valid or hostile.
 *
 * The input's first 12 bytes pick a chunk: dtype (BF16, F16, I16, F32),
 * codec (adaptive, rANS, rANS in 32 lanes, counted gaps), the number of words, how many
 * change and how far, and a seed; base and target words are made from the
 * seed.  The chunk is encoded with that codec, then:
 *   - decoded at every level (FERRY_NO_SIMD = 0, avx512, 1): each must give
 *     exactly the target's changed positions and words;
 *   - damaged by the rest of the input, taken as (offset, xor) byte pairs,
 *     and decoded again at every level: the result code, the message and,
 *     on success, the positions and words must be the same at every level.
 * A broken rule aborts, so libFuzzer records the input.  Seeds:
 * tests/fuzz/corpus/chunk; run, from the repository root after `make fuzz`:
 *   mkdir -p /tmp/fzc && ./build-fuzz/fuzz_chunk -max_total_time=600 /tmp/fzc tests/fuzz/corpus/chunk
 * (`make test` replays the corpus). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/sparse.h"

static const char *const levels[] = {"0", "avx512", "1"};

static uint64_t next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct result {
    int rc;
    size_t k;
    char msg[256];
    uint32_t *pos;
    uint64_t *val;
} result;

static void decode(const sp_dtype *t, const uint8_t *a, size_t n, const uint8_t *src, size_t len, const char *level,
                   result *r)
{
    static sp_coder c; /* reused: the decoders must not depend on stale scratch */
    setenv("FERRY_NO_SIMD", level, 1);
    r->k = 0;
    r->rc = ferry__codec_decode_chunk(t, a, n, src, len, 3, &c, &r->k);
    snprintf(r->msg, sizeof r->msg, "%s", r->rc ? ferry_last_error() : "");
    if (r->rc) return;
    r->pos = malloc(r->k * 4 + 1);
    r->val = malloc(r->k * 8 + 1);
    if (!r->pos || !r->val) abort();
    memcpy(r->pos, c.s.pos, r->k * 4);
    memcpy(r->val, c.s.val, r->k * 8);
}

static void release(result *r)
{
    free(r->pos);
    free(r->val);
    memset(r, 0, sizeof *r);
}

static void same(const result *x, const result *y, const char *what)
{
    if (x->rc != y->rc || strcmp(x->msg, y->msg) ||
        (!x->rc && (x->k != y->k || memcmp(x->pos, y->pos, x->k * 4) || memcmp(x->val, y->val, x->k * 8)))) {
        fprintf(stderr, "fuzz_chunk: %s: levels differ: rc %d '%s' k %zu vs rc %d '%s' k %zu\n", what, x->rc, x->msg, x->k,
                y->rc, y->msg, y->k);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 12) return 0;
    static const ferry_dtype dts[] = {FERRY_BF16, FERRY_F16, FERRY_I16, FERRY_F32};
    sp_dtype t = sp_dtype_of(dts[data[0] & 3]);
    unsigned codec = 1 + (data[0] >> 2) % 4;
    size_t n = 1 + ((size_t)data[1] | (size_t)(data[2] & 0x0F) << 8) * 4; /* 1..16381 words */
    unsigned density = data[3];                                          /* changes: density / 256 */
    unsigned spread = data[4] & 15;                                      /* deltas up to 2^spread */
    uint64_t seed = 0;
    memcpy(&seed, data + 4, 8);
    size_t bytes = n * t.W / 8;
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) abort();
    for (size_t i = 0; i < n; i++) {
        /* weights around 2^-6 with random signs and mantissas, and the odd
         * special or outlier */
        uint64_t r = next(&seed), x;
        if (t.W == 16) x = (r & 0x80FF) | (uint64_t)(((r >> 16) % 12) + 110 - (t.exp_mask == 0x1F ? 104 : 0)) << t.exp_shift;
        else x = (r & 0x807FFFFF) | (uint64_t)(((r >> 32) % 12) + 110) << 23;
        if ((r >> 40) % 509 == 0) x = r; /* any bits at all */
        sp_store(a, i, t.W, x & sp_wmask(t.W));
        uint64_t y = x;
        if (((r >> 48) & 0xFF) < density) y = x + 1 + (next(&seed) & (((uint64_t)1 << spread) - 1)) * ((r >> 56) & 1 ? 1 : -1);
        sp_store(b, i, t.W, y & sp_wmask(t.W));
    }
    static sp_coder enc;
    ferry_buf out = {0};
    uint8_t bh[64][16];
    uint64_t changed = 0;
    sp_src src = {b, 0};
    if (ferry__codec_encode_chunk_as(codec, &t, a, &src, n, &enc, &out, &changed, bh)) abort();

    /* every level decodes the chunk to exactly the target's changes */
    result want = {0}, got = {0};
    for (int l = 0; l < 3; l++) {
        decode(&t, a, n, out.data, out.size, levels[l], &got);
        if (got.rc || got.k != changed) {
            fprintf(stderr, "fuzz_chunk: level %s: a valid chunk gives rc %d '%s', %zu changes of %llu\n", levels[l], got.rc,
                    got.msg, got.k, (unsigned long long)changed);
            abort();
        }
        for (size_t j = 0; j < got.k; j++)
            if (sp_load(a, got.pos[j], t.W) == sp_load(b, got.pos[j], t.W) || got.val[j] != sp_load(b, got.pos[j], t.W) ||
                (j && got.pos[j] <= got.pos[j - 1])) {
                fprintf(stderr, "fuzz_chunk: level %s: change %zu decodes wrong\n", levels[l], j);
                abort();
            }
        release(&got);
    }

    /* damaged: every level answers the same */
    if (size > 12 && out.size > 0) {
        for (size_t i = 12; i + 1 < size; i += 2) out.data[((size_t)data[i] * 257 + i) % out.size] ^= data[i + 1];
        for (int l = 0; l < 3; l++) {
            decode(&t, a, n, out.data, out.size, levels[l], l ? &got : &want);
            if (l) {
                same(&want, &got, "damaged chunk");
                release(&got);
            }
        }
        release(&want);
    }
    unsetenv("FERRY_NO_SIMD");
    free(out.data);
    free(a);
    free(b);
    return 0;
}
