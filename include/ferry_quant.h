/* ferry_quant.h — FP8 versions of a BF16 policy (docs/FORMAT.md, "FP8
 * block quantization").
 *
 * A trainer holds BF16 (or FP32 masters cast to BF16); rollout engines may
 * serve FP8.  ferry quantizes each version's BF16 weights exactly as
 * defined below and publishes the FP8 checkpoint as the version's model, so
 * an FP8 island holds bit for bit what an engine would compute from the
 * full BF16 checkpoint, shipped as sparse patches of FP8 words (an Adam step
 * that moves a BF16 word rarely moves its FP8 code).
 *
 * The quantizer (fp8-block128), the layout of DeepSeek-V3, Kimi-K2 and the
 * Qwen3-FP8 checkpoints (weight_block_size [128, 128]):
 *   - which tensors: every BF16 tensor with ndim == 2, both dims >= 128,
 *     whose name contains neither "embed" nor "lm_head"; the others are
 *     kept as they are;
 *   - per 128 x 128 block of the tensor (rows = dim 0; edge blocks partial):
 *     s = float32(max |w|) / 448 in FP32 (one rounding), s = 1 when every
 *     w of the block is zero; q = E4M3FN(float32(w) / s) (the division in
 *     FP32, then round to nearest even, saturated to +-448);
 *   - stored as NAME (F8_E4M3, the tensor's shape) and NAME_scale_inv (F32,
 *     [ceil(rows / 128), ceil(cols / 128)], the multiplier: w ~ q * s);
 *   - the model's metadata gains "ferry.quantize" = the scheme's name.
 * E4M3FN as OCP defines it: bias 7, no infinities, S.1111.111 is NaN,
 * largest 448, subnormal step 2^-9, the sign kept on zero.  A block holding
 * a NaN or an infinity is refused (FERRY_ERR_ARG naming tensor and index):
 * no finite scale exists for it.
 *
 * fp8-block128-sticky: a block keeps the scale it had in the previous
 * version (prev) while its new max |w| fits it (<= 448 s) and is above half
 * of what it could hold (> 224 s); else it gets a fresh one.  Fewer scale
 * changes and fewer code changes between versions; NOT what an engine's own
 * quantizer would compute from the BF16 checkpoint (the codes of a block
 * whose scale stayed differ from a fresh quantization's).
 */
#ifndef FERRY_QUANT_H
#define FERRY_QUANT_H

#include "ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ferry_quant {
    FERRY_QUANT_NONE = 0,              /* the BF16 model as it is */
    FERRY_QUANT_FP8_BLOCK128 = 1,      /* "fp8-block128" */
    FERRY_QUANT_FP8_BLOCK128_STICKY = 2 /* "fp8-block128-sticky" */
} ferry_quant;

#define FERRY_QUANT_BLOCK 128
#define FERRY_QUANT_SCALE_SUFFIX "_scale_inv"
#define FERRY_QUANT_METADATA_KEY "ferry.quantize"

/* "none", "fp8-block128", "fp8-block128-sticky"; NULL for other values. */
FERRY_API const char *ferry_quant_name(ferry_quant q);
/* Parses a scheme name; FERRY_ERR_ARG (naming it) if unknown. */
FERRY_API int ferry_quant_parse(const char *name, ferry_quant *out);

/* Whether the scheme quantizes this tensor (dtype, shape and name rules
 * above); FP32 tensors count as their BF16 cast when cast_bf16 is set. */
FERRY_API int ferry_quant_eligible(const ferry_tensor *t, int cast_bf16);

/* E4M3FN of an FP32 value: round to nearest even, saturated to +-448, NaN
 * to 0x7F (sign kept). */
FERRY_API uint8_t ferry_f32_to_e4m3(float x);
/* The value of an E4M3FN code (NaN for S.1111.111). */
FERRY_API float ferry_e4m3_to_f32(uint8_t q);

typedef struct ferry_quant_stats {
    uint64_t tensors;          /* tensors quantized */
    uint64_t blocks;           /* 128 x 128 blocks */
    uint64_t scales_kept;      /* sticky: blocks that kept prev's scale */
} ferry_quant_stats;

/* Quantizes model m under q into a new model *out that owns its data:
 * eligible tensors become NAME (F8_E4M3) + NAME_scale_inv (F32), the
 * others are copied (FP32 tensors cast to BF16 when cast_bf16 is set, as
 * the publisher's FP32 gate does).  prev: the previous version's quantized
 * model (sticky scales; NULL or any model without a block's scale = fresh
 * scales).  stats may be NULL.  FERRY_QUANT_NONE copies m.  Errors:
 * FERRY_ERR_ARG (a non-finite weight; a NAME_scale_inv that already exists
 * in m), FERRY_ERR_NOMEM; *out is NULL on failure. */
FERRY_API int ferry_quantize(const ferry_model *m, ferry_quant q, int cast_bf16, const ferry_model *prev,
                             ferry_model **out, ferry_quant_stats *stats);

/* Dequantizes one FP8 tensor with its scales into FP32 (q * s per block):
 * codes is rows x cols E4M3FN, scale_inv ceil(rows/128) x ceil(cols/128)
 * F32, out rows x cols.  For tests and engines without FP8 kernels. */
FERRY_API void ferry_dequantize_fp8(const uint8_t *codes, const float *scale_inv, uint64_t rows, uint64_t cols,
                                    float *out);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_QUANT_H */
