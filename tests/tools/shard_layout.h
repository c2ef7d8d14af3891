/* Engine layouts of an island group, as regions of ferry_shard_region
 * (shared by tests/unit/test_shard.c and tests/tools/shard_island.c):
 *  - rows:  every tensor split along dim 0 into M ranges (column-parallel);
 *  - cols:  every 2-D tensor split along its columns (row-parallel), 1-D
 *           tensors along their elements;
 *  - fused: what vLLM / SGLang hold: o_proj and down_proj split by columns,
 *           every other tensor by rows (q/k/v -> qkv and gate/up -> gate_up
 *           are each the concatenation of the rank's row ranges), and the
 *           embeddings and output head (embed_tokens, lm_head: rows are the
 *           vocabulary) vocabulary-parallel in chunks padded to 64 rows as
 *           vLLM pads vocabularies.
 * Every tensor is split, so a rank's share is about 1/M of the version. */
#ifndef FERRY_TEST_SHARD_LAYOUT_H
#define FERRY_TEST_SHARD_LAYOUT_H
#include <stdbool.h>
#include <string.h>

#include "ferry_shard.h"

enum { L_ROWS, L_COLS, L_FUSED };

static inline int shard_layout_parse(const char *s)
{
    return !strcmp(s, "rows") ? L_ROWS : !strcmp(s, "cols") ? L_COLS : !strcmp(s, "fused") ? L_FUSED : -1;
}

/* The regions of island rank m of M in layout L, one per tensor of model. */
static inline size_t shard_layout(const ferry_model *model, int L, int m, int M, ferry_shard_region *out)
{
    size_t n = 0;
    for (size_t i = 0; i < ferry_model_count(model); i++) {
        const ferry_tensor *t = ferry_model_tensor(model, i);
        uint64_t rows = t->ndim ? t->shape[0] : 1, cols = t->ndim && rows ? t->nelem / rows : 1;
        bool by_cols = L == L_COLS && cols > 1;
        if (L == L_FUSED) by_cols = cols > 1 && (strstr(t->name, "o_proj") || strstr(t->name, "down_proj"));
        uint64_t len = by_cols ? cols : rows;
        uint64_t a = len * (uint64_t)m / (uint64_t)M, b = len * (uint64_t)(m + 1) / (uint64_t)M;
        if (L == L_FUSED && !by_cols && (strstr(t->name, "embed_tokens") || strstr(t->name, "lm_head"))) {
            uint64_t chunk = (rows + (uint64_t)M * 64 - 1) / ((uint64_t)M * 64) * 64;
            a = chunk * (uint64_t)m;
            b = a + chunk < rows ? a + chunk : rows;
        }
        if (by_cols) out[n++] = (ferry_shard_region){t->name, 0, 0, a, b};
        else out[n++] = (ferry_shard_region){t->name, a, b, 0, 0};
    }
    return n;
}

/* Region r of a (held) buffer equals the slice of model's tensor. */
static inline bool shard_slice_equal(const ferry_model *model, const ferry_shard_region *r, const void *buf, uint64_t rows,
                                     uint64_t cols)
{
    const ferry_tensor *t = ferry_model_find(model, r->name);
    if (!t || t->dtype != FERRY_BF16) return false;
    uint64_t trows = t->ndim ? t->shape[0] : 1, tc = t->ndim && trows ? t->nelem / trows : 1;
    for (uint64_t y = 0; y < rows; y++)
        if (memcmp((const uint8_t *)buf + y * cols * 2, (const uint8_t *)t->data + ((r->row_begin + y) * tc + r->col_begin) * 2,
                   cols * 2))
            return false;
    return true;
}
#endif
