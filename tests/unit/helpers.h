/* What the unit test programs share beyond check.h, written once:
 *   tmpdir_make(buf, n, name)  a scratch directory $TMPDIR/NAME.XXXXXX
 *                              (/tmp when TMPDIR is unset or empty)
 *   rm_rf(path)                removes it and everything under it
 *   UNDER_ASAN                 defined when built with AddressSanitizer
 *   ramp_model(fill)           (with check.h included first) a one-tensor
 *                              model: BF16 "w" of 4096 words, fill plus a
 *                              ramp on every 7th word
 *   model_copy(m)              (check.h first) a writable copy of a model
 *   models_same(a, b)          (check.h first) the same tensors bit for bit
 *   open_step(set, step)       (check.h first) DATA/set/step-NNN.safetensors
 *   each_real_pair(stride, fn, ctx)  (check.h first) fn(a, b, i, ctx) on
 *                              the consecutive steps i, i + 1 of rl-a (0..8)
 *                              and rl-b (0..4), i stepping by stride; skips
 *                              the case without the data
 *   NOT_BUILT_MAIN(why)        the whole program of a test whose subject
 *                              this build leaves out (make NO_NET=1): it
 *                              prints why and one skipped case, e.g.
 *     #ifdef FERRY_NO_NET
 *     #include "helpers.h"
 *     NOT_BUILT_MAIN("sync layer not built (NO_NET=1)")
 *     #else
 *     ... the tests ...
 *     #endif
 * (tests/unit/sync_fixture.h builds the sync-layer tests' file:// fixture
 * on these.) */
#ifndef FERRY_TESTS_HELPERS_H
#define FERRY_TESTS_HELPERS_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Makes the directory $TMPDIR/NAME.XXXXXX (mkdtemp) into buf; 0 on
 * success, else prints why and returns 1. */
static inline int tmpdir_make(char *buf, size_t n, const char *name)
{
    const char *t = getenv("TMPDIR");
    int len = snprintf(buf, n, "%s/%s.XXXXXX", t && *t ? t : "/tmp", name);
    if (len < 0 || (size_t)len >= n) {
        fprintf(stderr, "scratch directory name too long: %s/%s\n", t && *t ? t : "/tmp", name);
        return 1;
    }
    if (mkdtemp(buf)) return 0;
    perror("mkdtemp");
    return 1;
}

/* Removes path and everything under it (a scratch directory). */
static inline void rm_rf(const char *path)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", path);
}

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

#ifdef FERRY_CHECK_H
#include <stdint.h>
/* A model of one BF16 tensor "w" [4096]: word i is fill, plus i when i is
 * a multiple of 7.  The library copies the words (FERRY_ADD_COPY). */
static inline ferry_model *ramp_model(uint16_t fill)
{
    static uint16_t w[4096];
    for (size_t i = 0; i < 4096; i++) w[i] = (uint16_t)(fill + (i % 7 == 0 ? i : 0));
    ferry_model *m = NULL;
    uint64_t shape[1] = {4096};
    CHECK_OK(ferry_model_create(&m));
    CHECK_OK(ferry_model_add(m, "w", FERRY_BF16, 1, shape, w, sizeof w, FERRY_ADD_COPY));
    return m;
}

/* A writable copy of src: its tensors and metadata owned (NULL on failure). */
static inline ferry_model *model_copy(const ferry_model *src)
{
    ferry_model *m = NULL;
    if (ferry_model_create(&m)) return NULL;
    for (size_t i = 0; i < ferry_model_count(src); i++) {
        const ferry_tensor *t = ferry_model_tensor(src, i);
        if (ferry_model_add(m, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, FERRY_ADD_COPY)) {
            ferry_model_free(m);
            return NULL;
        }
    }
    for (size_t i = 0; i < ferry_model_metadata_count(src); i++) {
        const char *k, *v;
        ferry_model_metadata(src, i, &k, &v);
        if (ferry_model_set_metadata(m, k, v)) {
            ferry_model_free(m);
            return NULL;
        }
    }
    return m;
}

/* The same tensors, names and bytes, bit for bit and in the same order. */
static inline bool models_same(const ferry_model *a, const ferry_model *b)
{
    if (ferry_model_count(a) != ferry_model_count(b)) return false;
    for (size_t i = 0; i < ferry_model_count(a); i++) {
        const ferry_tensor *x = ferry_model_tensor(a, i), *y = ferry_model_tensor(b, i);
        if (x->nbytes != y->nbytes || strcmp(x->name, y->name) || memcmp(x->data, y->data, x->nbytes)) return false;
    }
    return true;
}

/* The shared checkpoint SET/step-NNN.safetensors (data_path), opened; a
 * failure is a failed check and NULL. */
static inline ferry_model *open_step(const char *set, int step)
{
    char rel[64], path[512];
    snprintf(rel, sizeof rel, "%s/step-%03d.safetensors", set, step);
    ferry_model *m = NULL;
    CHECK_OK(ferry_model_open(data_path(path, sizeof path, rel), &m));
    return m;
}

/* The real consecutive pairs of the shared data, the loop written once
 * (test_codec, test_stream): fn sees both steps opened, or is not called
 * when one fails to open (a failed check already). */
#define each_real_pair(stride, fn, ctx)                                                         \
    do {                                                                                        \
        SKIP_UNLESS_DATA("rl-a/step-008.safetensors");                                          \
        SKIP_UNLESS_DATA("rl-b/step-004.safetensors");                                          \
        const struct { const char *set; int last; } sets_[] = {{"rl-a", 8}, {"rl-b", 4}};       \
        for (int s_ = 0; s_ < 2; s_++)                                                          \
            for (int i_ = 0; i_ < sets_[s_].last; i_ += (stride)) {                             \
                ferry_model *a_ = open_step(sets_[s_].set, i_), *b_ = open_step(sets_[s_].set, i_ + 1); \
                if (a_ && b_) fn(a_, b_, i_, ctx);                                              \
                ferry_model_free(a_);                                                           \
                ferry_model_free(b_);                                                           \
            }                                                                                   \
    } while (0)
#endif

#define NOT_BUILT_MAIN(why)                                                             \
    int main(void)                                                                      \
    {                                                                                   \
        puts(why);                                                                      \
        puts("0 passed, 0 failed, 1 skipped");                                          \
        return 0;                                                                       \
    }

#endif
