/* ferry_patch_inspect: the patch's table, validated, without a base. */
#include <stdlib.h>
#include "patch.h"

struct ferry_patch_info {
    patch_table t;
    ferry_patch_tensor_info *ti;
};

int ferry_patch_inspect(const void *patch, size_t size, ferry_patch_info **out)
{
    if (!patch || !out) return ferry__fail(FERRY_ERR_ARG, "ferry_patch_inspect: NULL argument");
    *out = NULL;
    ferry_patch_info *pi = ferry__calloc(1, sizeof *pi);
    if (!pi) return FERRY_ERR_NOMEM;
    int rc = ferry__codec_patch_table_parse(patch, size, &pi->t);
    if (rc) {
        free(pi);
        return rc;
    }
    pi->ti = ferry__calloc(pi->t.n, sizeof *pi->ti);
    if (!pi->ti) {
        ferry_patch_info_free(pi);
        return FERRY_ERR_NOMEM;
    }
    static const int kind[] = {[PK_SPARSE] = FERRY_PT_SPARSE, [PK_WHOLE] = FERRY_PT_WHOLE,
                               [PK_REMOVED] = FERRY_PT_REMOVED, [PK_SAME] = FERRY_PT_SAME};
    for (size_t i = 0; i < pi->t.n; i++) {
        const patch_entry *e = &pi->t.e[i];
        pi->ti[i] = (ferry_patch_tensor_info){.name = e->name, .dtype = e->dtype, .nelem = e->nelem,
                                              .changed = e->kind == PK_SAME ? 0 : e->changed,
                                              .bytes = e->payload_size, .kind = kind[e->kind]};
    }
    *out = pi;
    return FERRY_OK;
}

void ferry_patch_info_free(ferry_patch_info *pi)
{
    if (!pi) return;
    ferry__codec_patch_table_release(&pi->t);
    free(pi->ti);
    free(pi);
}

unsigned ferry_patch_info_format(const ferry_patch_info *pi) { return pi ? pi->t.version : 0; }

void ferry_patch_info_hashes(const ferry_patch_info *pi, uint8_t base[16], uint8_t target[16])
{
    if (base) memcpy(base, pi->t.base_hash, 16);
    if (target) memcpy(target, pi->t.target_hash, 16);
}

size_t ferry_patch_info_count(const ferry_patch_info *pi) { return pi ? pi->t.n : 0; }

const ferry_patch_tensor_info *ferry_patch_info_tensor(const ferry_patch_info *pi, size_t i)
{
    return pi && i < pi->t.n ? &pi->ti[i] : NULL;
}
