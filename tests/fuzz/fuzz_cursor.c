/* libFuzzer target for the dock's cursor decoder (ferry__dock_cursor_decode): the
 * consumer's cursor object RUN/dock/cursor is read back from the store,
 * which anyone with write access to the bucket can replace.
 * Each input is decoded twice: as it is, and with its 16-byte checksum
 * recomputed (the last 16 bytes, or those before the 72-byte signature of
 * a format-2 cursor), so that the fuzzer gets past the checksum.  The
 * signature itself is not checked here (the decoder only finds it; the
 * handle verifies it, tests/unit/test_dock.c).
 * Contract: a refusal is FERRY_ERR_DOCK_CURSOR (or NOMEM) with a message and
 * no state left allocated; an accepted cursor has islands in ascending order
 * with 1..FERRY_DOCK_MAX_RANGES sorted, disjoint ranges each, a signature
 * exactly when it is of format 2 (its last 72 bytes), and encoding it again
 * gives the same bytes (for a signed one, the bytes before the signature,
 * with format 2; the same state, for a cursor of the format before the
 * signature counters).  A broken rule aborts.  Run id "r".
 * Seeds: tests/fuzz/corpus/cursor (tests/golden-errors/batch/make.py);
 * after `make fuzz`:
 *   mkdir -p /tmp/fzu && ./build-fuzz/fuzz_cursor -max_total_time=600 /tmp/fzu tests/fuzz/corpus/cursor */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dock/dock_impl.h"
#include "xxh.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void require(int ok)
{
    if (!ok) abort();
}

/* The XXH3-128 of a cursor whose signature (if any) takes `tail` bytes. */
static void reseal(uint8_t *b, size_t size, size_t tail)
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(b, size - tail - 16));
    memcpy(b + size - tail - 16, c.digest, 16);
}

static void check(const uint8_t *data, size_t size)
{
    dk_state s;
    const uint8_t *sig;
    int rc = ferry__dock_cursor_decode(data, size, "r", &s, &sig);
    if (rc) {
        require((rc == FERRY_ERR_DOCK_CURSOR || rc == FERRY_ERR_NOMEM) && ferry_last_error()[0]);
        require(s.islands == NULL && s.n_islands == 0);
        return;
    }
    for (size_t i = 0; i < s.n_islands; i++) {
        const dk_island *is = &s.islands[i];
        require(!i || is->id > s.islands[i - 1].id);
        require(is->n >= 1 && is->n <= FERRY_DOCK_MAX_RANGES);
        for (uint32_t j = 0; j < is->n; j++) {
            require(is->r[j].lo <= is->r[j].hi);
            require(!j || is->r[j].lo > is->r[j - 1].hi + 1);
        }
    }
    bool is_signed = ferry__le16(data + 4) == 2;
    require(is_signed ? sig == data + size - 72 : sig == NULL);
    size_t body = is_signed ? size - 72 : size;
    ferry_buf out = {0};
    uint64_t nonce = ferry__le64(data + 72);
    require(ferry__dock_cursor_encode(&s, "r", nonce, NULL, &out) == FERRY_OK);
    if (is_signed) { /* the unsigned encoding, marked format 2 */
        ferry__put16(out.data + 4, 2);
        reseal(out.data, out.size, 0);
    }
    /* a cursor of the current format comes back byte for byte; one of the
     * format before the signature counters comes back as the same state */
    if (ferry__le32(data + 96) == DK_C_COUNT) require(out.size == body && !memcmp(out.data, data, body));
    ferry__put16(out.data + 4, 1);
    reseal(out.data, out.size, 0);
    dk_state t;
    const uint8_t *sig2;
    require(ferry__dock_cursor_decode(out.data, out.size, "r", &t, &sig2) == FERRY_OK && sig2 == NULL);
    require(t.commits == s.commits && t.top_tv == s.top_tv && !memcmp(t.counters, s.counters, sizeof s.counters));
    require(t.n_islands == s.n_islands && (!s.n_islands || !memcmp(t.islands, s.islands, s.n_islands * sizeof *s.islands)));
    ferry__dock_state_release(&t);
    ferry__buf_release(&out);
    ferry__dock_state_release(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check(data, size);
    size_t tail = size >= 6 && ferry__le16(data + 4) == 2 ? 72 : 0;
    if (size < 16 + tail) return 0;
    uint8_t *fixed = malloc(size);
    require(fixed != NULL);
    memcpy(fixed, data, size);
    reseal(fixed, size, tail);
    check(fixed, size);
    free(fixed);
    return 0;
}
