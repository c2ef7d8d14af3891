/* libFuzzer target for the safetensors reader.
 *
 * Parses the input from memory (ferry__st_parse_buffer: the same code the
 * mmap path runs), then checks the contract on untrusted input:
 *   - failure leaves no model and a non-empty message;
 *   - success yields tensors whose bytes lie inside the input and tile the
 *     data section, and hashing them (which reads every byte) stays in
 *     bounds under ASan.
 * A broken contract aborts, so libFuzzer records the input. */
#include <stdint.h>
#include <stdlib.h>

#include "io/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void require(int ok)
{
    if (!ok) abort();
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
    uint8_t h[16];
    require(ferry_model_hash(m, h) == FERRY_OK);
    ferry_model_free(m);
    return 0;
}
