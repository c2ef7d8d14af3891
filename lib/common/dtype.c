/* The safetensors dtypes: names and element sizes in bits. */
#include "common.h"

static const struct { const char *name; unsigned bits; } k_dtypes[FERRY_DTYPE_COUNT] = {
    [FERRY_BOOL] = {"BOOL", 8},       [FERRY_U8] = {"U8", 8},
    [FERRY_I8] = {"I8", 8},           [FERRY_F8_E5M2] = {"F8_E5M2", 8},
    [FERRY_F8_E4M3] = {"F8_E4M3", 8}, [FERRY_F8_E8M0] = {"F8_E8M0", 8},
    [FERRY_I16] = {"I16", 16},        [FERRY_U16] = {"U16", 16},
    [FERRY_F16] = {"F16", 16},        [FERRY_BF16] = {"BF16", 16},
    [FERRY_I32] = {"I32", 32},        [FERRY_U32] = {"U32", 32},
    [FERRY_F32] = {"F32", 32},        [FERRY_F64] = {"F64", 64},
    [FERRY_I64] = {"I64", 64},        [FERRY_U64] = {"U64", 64},
    [FERRY_C64] = {"C64", 64},        [FERRY_F4] = {"F4", 4},
    [FERRY_F6_E2M3] = {"F6_E2M3", 6}, [FERRY_F6_E3M2] = {"F6_E3M2", 6},
};

const char *ferry_dtype_name(ferry_dtype dt)
{
    return (unsigned)dt < FERRY_DTYPE_COUNT ? k_dtypes[dt].name : NULL;
}

unsigned ferry_dtype_bits(ferry_dtype dt)
{
    return (unsigned)dt < FERRY_DTYPE_COUNT ? k_dtypes[dt].bits : 0;
}

int ferry_dtype_parse(const char *name, ferry_dtype *out)
{
    for (int i = 0; i < FERRY_DTYPE_COUNT; i++)
        if (name && strcmp(name, k_dtypes[i].name) == 0) {
            *out = (ferry_dtype)i;
            return FERRY_OK;
        }
    return ferry__fail(FERRY_ERR_ST_DTYPE, "unknown dtype '%s'", name ? name : "(null)");
}
