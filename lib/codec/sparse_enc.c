/* Sparse chunk encoder: scan the chunk, then code it with the adaptive
 * binary coder (few changes) or static rANS (many changes; codec 3 with
 * vector-friendly interleaving for the most). */
#include <math.h>
#include <stdlib.h>
#include "model.h"
#include "sparse.h"

/* Below this many changes the static tables of rANS cost more than the
 * adaptive coder's learning (measured on ../shared/data, docs/FORMAT.md). */
#ifndef SP_RANS_MIN_CHANGES
#define SP_RANS_MIN_CHANGES 32768
#endif
/* From this many changes, codec 3: the same coding with 32 interleaved
 * states per stream, which the decoder runs in vector lanes.  Its 252 more
 * header bytes are under 1% of such a chunk (+0.13% and +0.19% on the two
 * golden pairs of tests/golden/real.txt that it changed), and codec 2's
 * scalar symbol decoding had been a tenth of an in-place apply of a 1 GB
 * model whose attention matrices (one chunk each) held 32768..131072
 * changes: so every rANS chunk is codec 3, and codec 2 is only read. */
#ifndef SP_RANS32_MIN_CHANGES
#define SP_RANS32_MIN_CHANGES 32768
#endif
/* In a tensor of several chunks, codec 3 from this many: the last chunk
 * is often a small remainder (a 12.8M-word matrix is 3 chunks and 0.06),
 * whose tables cost little next to the tensor's other chunks, and the
 * adaptive coder decodes ~10x slower. */
#ifndef SP_RANS32_MIN_PART
#define SP_RANS32_MIN_PART 8192
#endif

void ferry__codec_models_reset(sp_models *m) { rc_probs_init(&m->meta.un[0], sizeof *m / sizeof(rc_prob)); }

void ferry__codec_coder_release(sp_coder *c) { ferry__codec_scratch_release(&c->s); }

static void put_delta(rc_enc *e, const sp_dtype *t, sp_models *m, uint32_t dc, uint64_t x, uint64_t y)
{
    unsigned neg;
    uint64_t mag = sp_delta(t, x, y, &neg);
    rc_encode(e, &m->sign[dc][sp_sign(t, x)], neg);
    sp_num_put(e, &m->mag[dc], mag - 1);
}

int ferry__codec_adaptive_encode(const sp_dtype *t, uint32_t top, const uint64_t *est, sp_scratch *s, size_t k,
                       sp_models *m, ferry_buf *out)
{
    /* the AVX-512 scan's lazy result has no order, old and val arrays yet */
    FERRY_ASSERT(!s->lazy && s->start[SP_NCLASS] == k);
    rc_enc e;
    rc_enc_init(&e, out);
    ferry__codec_models_reset(m);
    uint32_t nact = 0, nclass = sp_nclass(t);
    for (uint32_t c = 0; c < nclass; c++) nact += s->start[c + 1] > s->start[c];
    sp_num_put(&e, &m->meta, nact);
    uint32_t prev_c = 0;
    bool first = true;
    for (uint32_t c = 0; c < nclass; c++) {
        uint32_t lo = s->start[c], hi = s->start[c + 1];
        if (lo == hi) continue;
        sp_num_put(&e, &m->meta, first ? c : c - prev_c - 1);
        sp_num_put(&e, &m->meta, hi - lo - 1);
        first = false;
        prev_c = c;
        sp_num *g = &m->gap[c];
        sp_geo geo = {0};
        if (est) sp_geo_init(&geo, hi - lo, sp_counted_population(est[c], hi - lo));
        uint32_t last = 0;
        for (uint32_t j = lo; j < hi; j++) {
            uint32_t r = s->order[j], v = j == lo ? r : r - last - 1;
            if (est) sp_geo_put(&e, &geo, v);
            else sp_num_put(&e, g, v);
            last = r;
        }
    }
    for (size_t j = 0; j < k; j++) {
        uint64_t x = s->old[j];
        put_delta(&e, t, m, sp_dclass(t, top, x), x, s->val[j]);
    }
    return rc_enc_finish(&e);
}

/* Scans the chunk piece by piece, hashing each piece of the target while it
 * is in cache (block digests into bh). */
static int scan_and_hash(const sp_dtype *t, uint32_t top, const uint8_t *a, const sp_src *b, size_t n, sp_coder *c,
                         size_t *k, uint8_t (*bh)[16])
{
    sp_scan_state st = {{0}, 0, 0};
    ferry__blockhash h;
    ferry__bh_begin(&h, bh);
    for (size_t lo = 0; lo < n; lo += SP_SCAN_PIECE) {
        size_t hi = n - lo < SP_SCAN_PIECE ? n : lo + SP_SCAN_PIECE;
        const uint8_t *piece;
        if (b->f32_to_bf16) {
            ferry_f32_to_bf16_n(c->cast, (const float *)(const void *)(b->p + 4 * lo), hi - lo);
            piece = (const uint8_t *)c->cast;
        } else {
            piece = b->p + lo * t->W / 8;
        }
        int rc = ferry__codec_scan_range(t, top, a, piece, lo, hi, &c->s, &st);
        if (rc) return rc;
        ferry__bh_feed(&h, piece, (hi - lo) * t->W / 8);
    }
    ferry__bh_end(&h);
    FERRY_ASSERT(st.k <= n);
    int rc = ferry__codec_scan_group(&c->s, &st);
    if (rc) return rc;
    *k = st.k;
    return FERRY_OK;
}

int ferry__codec_encode_chunk(const sp_dtype *t, const uint8_t *a, const sp_src *b, size_t n, bool part, sp_coder *c,
                    ferry_buf *out, uint64_t *changed, uint8_t (*bh)[16])
{
    return ferry__codec_encode_chunk_as(part ? SP_CHOOSE_PART : 0, t, a, b, n, c, out, changed, bh);
}

/* Estimated bits of the positions of the chunk's changes with class origin
 * top: sum over classes of n H(k/n), with n from the sample
 * (ferry__codec_sample_classes) and k from the changed words' exponents. */
static double positions_cost(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n, const uint32_t *kexp)
{
    uint64_t est[SP_NCLASS], kc[SP_NCLASS] = {0};
    ferry__codec_sample_classes(t, top, a, n, est);
    for (uint32_t e = 0; e <= t->exp_mask; e++) {
        int32_t d = (int32_t)top - (int32_t)e;
        kc[d <= 0 ? 0 : d >= SP_NCLASS - 1 ? SP_NCLASS - 1 : d] += kexp[e];
    }
    double bits = 0;
    for (int c = 0; c < SP_NCLASS; c++) {
        if (!kc[c]) continue;
        double nn = (double)sp_counted_population(est[c], kc[c]), p = (double)kc[c] / nn;
        bits += nn * -(p * log2(p) + (1 - p) * log2(1 - p)) + 16; /* + the class's count */
    }
    return bits;
}

/* For a sparse chunk, the class origin that codes its positions in the
 * fewest bits: the default one (99% of the words below) lumps the smallest
 * weights, which flip the most, into the last class; at low change rates a
 * lower origin, which spreads them out, is often better (it is written in
 * the chunk, so any choice decodes).  s holds the scan at `top`. */
static uint32_t sparse_top(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n, const sp_scratch *s, size_t k)
{
    if (!t->exp_mask || t->exp_mask > 0xFF) return top;
    uint32_t kexp[256] = {0};
    for (size_t j = 0; j < k; j++) kexp[(s->old[j] >> t->exp_shift) & t->exp_mask]++;
    uint32_t best = top;
    double best_bits = positions_cost(t, top, a, n, kexp);
    for (uint32_t sh = 1; sh < SP_NCLASS && sh <= top; sh++) {
        double b = positions_cost(t, top - sh, a, n, kexp);
        if (b < best_bits) { best_bits = b; best = top - sh; }
    }
    return best;
}

/* Codec 4, or codec 1 where that is smaller (a class whose sampled size is
 * far from the truth can make codec 4 the larger), into out. */
static int encode_counted(const sp_dtype *t, uint32_t top, const uint8_t *a, size_t n, sp_coder *c, size_t k,
                          size_t head_at, ferry_buf *out)
{
    uint64_t est[SP_NCLASS];
    ferry__codec_sample_classes(t, top, a, n, est);
    size_t at = out->size;
    int rc = ferry__codec_adaptive_encode(t, top, est, &c->s, k, &c->m, out);
    if (rc) return rc;
    ferry_buf alt = {0};
    rc = ferry__codec_adaptive_encode(t, top, NULL, &c->s, k, &c->m, &alt);
    if (!rc && alt.size < out->size - at) {
        out->data[head_at] = SP_CODEC_ADAPTIVE;
        out->size = at;
        rc = ferry__buf_append(out, alt.data, alt.size);
    }
    ferry__buf_release(&alt);
    return rc;
}

int ferry__codec_encode_chunk_as(unsigned codec, const sp_dtype *t, const uint8_t *a, const sp_src *b, size_t n, sp_coder *c,
                       ferry_buf *out, uint64_t *changed, uint8_t (*bh)[16])
{
    /* positions inside a chunk fit in 32 bits (sparse.h) */
    FERRY_ASSERT(n > 0 && n <= (size_t)1 << SP_CHUNK_LOG2_MAX);
    uint32_t top = ferry__codec_choose_top(t, a, n);
    FERRY_ASSERT(top <= t->exp_mask);
    size_t k;
    int rc = scan_and_hash(t, top, a, b, n, c, &k, bh);
    if (rc) return rc;
    *changed = k;
    uint8_t head[2] = {SP_CODEC_EMPTY, (uint8_t)top};
    if (k == 0) return ferry__buf_append(out, head, 1);
    size_t min32 = codec == SP_CHOOSE_PART ? SP_RANS32_MIN_PART : SP_RANS32_MIN_CHANGES;
    head[0] = k >= min32 ? SP_CODEC_RANS32 : k >= SP_RANS_MIN_CHANGES ? SP_CODEC_RANS : SP_CODEC_COUNTED;
    if (codec && codec != SP_CHOOSE_PART) head[0] = (uint8_t)codec;
    if (head[0] == SP_CODEC_COUNTED || head[0] == SP_CODEC_ADAPTIVE) {
        ferry__codec_scan_unlazy(&c->s, k);
        uint32_t top2 = sparse_top(t, top, a, n, &c->s, k);
        if (top2 != top) {
            top = top2;
            head[1] = (uint8_t)top;
            if ((rc = scan_and_hash(t, top, a, b, n, c, &k, bh))) return rc;
            FERRY_ASSERT(k == *changed); /* another origin moves classes, not changes */
            ferry__codec_scan_unlazy(&c->s, k);
        }
    }
    /* top fits a byte for every dtype but F64, whose 11-bit exponent
     * takes a second byte */
    size_t head_at = out->size;
    if ((rc = ferry__buf_append(out, head, 2))) return rc;
    if (t->exp_mask > 0xFF && (rc = ferry__buf_append(out, &(uint8_t){(uint8_t)(top >> 8)}, 1))) return rc;
    if (head[0] == SP_CODEC_COUNTED && codec == SP_CODEC_COUNTED) { /* forced: no fallback */
        uint64_t est[SP_NCLASS];
        ferry__codec_sample_classes(t, top, a, n, est);
        return ferry__codec_adaptive_encode(t, top, est, &c->s, k, &c->m, out);
    }
    if (head[0] == SP_CODEC_COUNTED) return encode_counted(t, top, a, n, c, k, head_at, out);
    if (head[0] != SP_CODEC_ADAPTIVE) return ferry__codec_rans_encode(t, top, head[0], &c->s, k, out);
    return ferry__codec_adaptive_encode(t, top, NULL, &c->s, k, &c->m, out);
}
