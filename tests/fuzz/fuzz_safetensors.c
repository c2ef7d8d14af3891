/* libFuzzer target for the safetensors reader (and, on what it accepts, the
 * writer).
 *
 * Parses the input from memory (ferry__st_parse_buffer: the same code the
 * mmap path runs), then checks the contract on untrusted input:
 *   - failure leaves no model and a non-empty message;
 *   - success yields tensors whose bytes lie inside the input, and hashing
 *     them (which reads every byte) stays in bounds under ASan;
 *   - whatever was accepted can be written again (the header
 *     ferry_model_save writes, plus the data in name order) and that image
 *     parses back to the same model hash.
 * A broken contract aborts, so libFuzzer records the input.
 * Dictionary: tests/fuzz/fuzz_safetensors.dict. */
#include <stdint.h>
#include <stdlib.h>

#include "io/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void require(int ok)
{
    if (!ok) abort();
}

/* The image ferry_model_save would write for m, in memory (no fsync). */
static uint8_t *serialize(const ferry_model *m, size_t *size)
{
    char *hdr = NULL;
    size_t hlen = 0;
    require(ferry__st_header(m, &hdr, &hlen) == FERRY_OK);
    size_t n = 8 + hlen + (size_t)ferry_model_nbytes(m);
    uint8_t *img = malloc(n);
    require(img != NULL);
    ferry__put64(img, hlen);
    memcpy(img + 8, hdr, hlen);
    size_t at = 8 + hlen;
    for (size_t i = 0; i < ferry_model_count(m); i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        if (t->nbytes) memcpy(img + at, t->data, (size_t)t->nbytes);
        at += (size_t)t->nbytes;
    }
    free(hdr);
    *size = n;
    return img;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ferry_model *m = NULL;
    int rc = ferry__st_parse_buffer(data, size, "fuzz", &m);
    if (rc) {
        require(m == NULL && ferry_last_error()[0] != 0);
        return 0;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < ferry_model_count(m); i++) {
        const ferry_tensor *t = ferry_model_tensor(m, i);
        const uint8_t *p = t->data;
        require(t->nbytes <= size && (!t->nbytes || (p >= data && p + t->nbytes <= data + size)));
        total += t->nbytes;
    }
    require(total + 8 <= size);
    uint8_t h[16], h2[16];
    require(ferry_model_hash(m, h) == FERRY_OK);

    size_t n2 = 0;
    uint8_t *img = serialize(m, &n2);
    ferry_model *m2 = NULL;
    require(ferry__st_parse_buffer(img, n2, "fuzz-rewritten", &m2) == FERRY_OK);
    require(ferry_model_hash(m2, h2) == FERRY_OK && memcmp(h, h2, 16) == 0);
    ferry_model_free(m2);
    free(img);
    ferry_model_free(m);
    return 0;
}
