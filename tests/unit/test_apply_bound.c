/* A tiny patch can declare a model of any size (a new tensor of zeros
 * compresses to nothing): ferry_apply_options.max_output_bytes bounds the
 * target before anything is allocated or written (review of issue 16).
 * Here a 4 KiB-element base and a patch adding a 32 MiB tensor of zeros:
 * the patch is a few KiB; with a bound below the target, ferry_apply_ex
 * and ferry_apply_file fail with FERRY_ERR_LIMIT, allocate nothing large
 * and leave nothing at the output path; with the bound at the target's
 * exact size they succeed. */
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static ferry_model *base_model(int with_big)
{
    static uint16_t w[4096];
    for (size_t i = 0; i < 4096; i++) w[i] = (uint16_t)(0x3C00 + i % 97);
    ferry_model *m = NULL;
    uint64_t shape[1] = {4096};
    CHECK_OK(ferry_model_create(&m));
    CHECK_OK(ferry_model_add(m, "w", FERRY_BF16, 1, shape, w, sizeof w, FERRY_ADD_COPY));
    if (with_big) {
        static uint16_t z[16u << 20]; /* BF16 zeros: 32 MiB */
        uint64_t big[1] = {16u << 20};
        CHECK_OK(ferry_model_add(m, "zeros", FERRY_BF16, 1, big, z, sizeof z, FERRY_ADD_BORROW));
    }
    return m;
}

static void test_output_bound(void)
{
    ferry_model *a = base_model(0), *b = base_model(1);
    void *patch = NULL;
    size_t n = 0;
    CHECK_OK(ferry_diff(a, b, NULL, &patch, &n));
    uint64_t target = ferry_model_nbytes(b);
    ferry_model_free(b);
    CHECK(n < (64u << 10)); /* a tiny patch, a 32 MiB model */

    ferry_apply_options o = {.max_output_bytes = target - 1};
    ferry_model *out = NULL;
    CHECK_RC(ferry_apply_ex(a, patch, n, &o, &out), FERRY_ERR_LIMIT);
    CHECK(out == NULL && strstr(ferry_last_error(), "max_output_bytes"));

    char path[200];
    snprintf(path, sizeof path, "%s/ferry-apply-bound.%ld.safetensors", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (long)getpid());
    CHECK_RC(ferry_apply_file(a, patch, n, &o, path), FERRY_ERR_LIMIT);
    CHECK(access(path, F_OK) != 0);

    o.max_output_bytes = target;
    CHECK_OK(ferry_apply_file(a, patch, n, &o, path));
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (uint64_t)sb.st_size > target);
    unlink(path);
    ferry_free(patch);
    ferry_model_free(a);
}

int main(void)
{
    RUN(test_output_bound);
    return CHECK_SUMMARY();
}
