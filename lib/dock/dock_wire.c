/* The batch object: run ids, keys and the 128-byte header (docs/DOCK.md,
 * "Header").  No I/O here, so the decoder can be tested and fuzzed alone.
 *
 * Header (little-endian):
 *     0   4  magic "FDCK"
 *     4   2  format version (1)
 *     6   2  header length (128)
 *     8   8  policy version
 *    16   8  sequence number
 *    24   4  island id
 *    28   2  run id length, 1..64
 *    30   2  flags: bit 0 = signed, others 0
 *    32   8  put time, ms since the epoch (producer's clock)
 *    40   8  payload length
 *    48  64  run id, zero-padded
 *   112  16  XXH3-128 of bytes 0..111 then the payload (canonical, big-endian)
 *   128      payload
 *   then, when signed, 72 bytes: the signing key's id (8) and its Ed25519
 *   signature (64) over bytes 0..127 and the payload, in the domain
 *   "ferry-batch" (lib/sign/sig.h)
 */
#include "dock_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include "xxh.h"
#include "sign/sig.h"

#define OFF_VERSION 8
#define OFF_SEQ 16
#define OFF_ISLAND 24
#define OFF_RUNLEN 28
#define OFF_FLAGS 30
#define OFF_TIME 32
#define OFF_PLEN 40
#define OFF_RUN 48
#define OFF_SUM 112

static const char k_magic[4] = {'F', 'D', 'C', 'K'};

static bool run_char_ok(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

/* A run id is one key segment that no backend treats specially: no '/',
 * no leading '.' (so never ".", ".." or the file backend's ".ferry-"). */
int ferry_dock_run_check(const char *run)
{
    if (!run) return ferry__fail(FERRY_ERR_ARG, "dock: run id is NULL");
    size_t n = strlen(run);
    if (n == 0 || n > FERRY_DOCK_RUN_MAX)
        return ferry__fail(FERRY_ERR_ARG, "dock: run id must be 1..%d bytes (got %zu)", FERRY_DOCK_RUN_MAX, n);
    if (run[0] == '.') return ferry__fail(FERRY_ERR_ARG, "dock: run id '%s' starts with '.'", run);
    for (size_t i = 0; i < n; i++)
        if (!run_char_ok((unsigned char)run[i]))
            return ferry__fail(FERRY_ERR_ARG, "dock: run id '%.64s': byte 0x%02x at %zu is not [A-Za-z0-9._-]",
                               run, (unsigned char)run[i], i);
    return FERRY_OK;
}

int ferry_dock_key(const char *run, uint64_t version, uint32_t island, uint64_t seq,
                   char buf[FERRY_DOCK_KEY_MAX])
{
    if (!buf) return ferry__fail(FERRY_ERR_ARG, "dock: key buffer is NULL");
    buf[0] = 0;
    int rc = ferry_dock_run_check(run);
    if (rc) return rc;
    snprintf(buf, FERRY_DOCK_KEY_MAX, "%s/traj/v%020" PRIu64 "/i%010" PRIu32 "-s%020" PRIu64, run,
             version, island, seq);
    return FERRY_OK;
}

void ferry__dock_traj_prefix(const char *run, char buf[FERRY_DOCK_KEY_MAX])
{
    snprintf(buf, FERRY_DOCK_KEY_MAX, "%s/traj/", run);
}

void ferry__dock_version_prefix(const char *run, uint64_t version, char buf[FERRY_DOCK_KEY_MAX])
{
    snprintf(buf, FERRY_DOCK_KEY_MAX, "%s/traj/v%020" PRIu64 "/", run, version);
}

/* Exactly `width` decimal digits whose value fits in max. */
static bool take_digits(const char **p, int width, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    const char *s = *p;
    for (int i = 0; i < width; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (max - d) / 10) return false;
        v = v * 10 + d;
    }
    *p = s + width;
    *out = v;
    return true;
}

static bool take_lit(const char **p, const char *lit)
{
    size_t n = strlen(lit);
    if (strncmp(*p, lit, n)) return false;
    *p += n;
    return true;
}

int ferry_dock_key_parse(const char *run, const char *key, uint64_t *version, uint32_t *island,
                         uint64_t *seq)
{
    int rc = ferry_dock_run_check(run);
    if (rc) return rc;
    if (!key) return ferry__fail(FERRY_ERR_ARG, "dock: key is NULL");
    const char *p = key;
    uint64_t v, i, s;
    if (!take_lit(&p, run) || !take_lit(&p, "/traj/v") || !take_digits(&p, 20, UINT64_MAX, &v) ||
        !take_lit(&p, "/i") || !take_digits(&p, 10, UINT32_MAX, &i) || !take_lit(&p, "-s") ||
        !take_digits(&p, 20, UINT64_MAX, &s) || *p)
        return ferry__fail(FERRY_ERR_DOCK_KEY, "%.300s: not a batch key of run '%s' (want %s/traj/v<20 digits>/i<10 digits>-s<20 digits>)",
                           key, run, run);
    if (version) *version = v;
    if (island) *island = (uint32_t)i;
    if (seq) *seq = s;
    return FERRY_OK;
}

static void checksum(const uint8_t *hdr, const void *payload, size_t len, uint8_t out[16])
{
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, hdr, OFF_SUM);
    if (len) XXH3_128bits_update(&st, payload, len);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    memcpy(out, c.digest, 16);
}

int ferry_dock_encode(const char *run, uint64_t version, uint32_t island, uint64_t seq,
                      uint64_t put_time_ms, const void *payload, size_t len, void **out,
                      size_t *out_size)
{
    return ferry__dock_encode(run, version, island, seq, put_time_ms, payload, len, NULL, out, out_size);
}

int ferry__dock_batch_verify(const ferry_keys *k, const char *key, const void *data, const ferry_dock_header *h)
{
    if (!ferry__sign_keys_enforce(k)) return FERRY_OK;
    if (!h->signature)
        return ferry__fail(FERRY_ERR_DOCK_SIGNATURE, "%s: unsigned batch, and this handle admits only enrolled islands' signed ones", key);
    if (ferry__sign_verify_island(k, FS_DOM_BATCH, key, data, FERRY_DOCK_HEADER_SIZE + (size_t)h->size, h->signature, h->island))
        return ferry__context(FERRY_ERR_DOCK_SIGNATURE, "island %" PRIu32 " seq %" PRIu64, h->island, h->seq);
    return FERRY_OK;
}

int ferry__dock_encode(const char *run, uint64_t version, uint32_t island, uint64_t seq, uint64_t put_time_ms,
              const void *payload, size_t len, const ferry_keys *keys, void **out, size_t *out_size)
{
    if (!out || !out_size) return ferry__fail(FERRY_ERR_ARG, "dock: encode: NULL output");
    *out = NULL;
    *out_size = 0;
    int rc = ferry_dock_run_check(run);
    if (rc) return rc;
    if (!payload && len) return ferry__fail(FERRY_ERR_ARG, "dock: encode: NULL payload of %zu bytes", len);
    size_t sig = ferry_keys_can_sign(keys) ? FERRY_DOCK_SIG_SIZE : 0;
    if (len > SIZE_MAX - FERRY_DOCK_HEADER_SIZE - FERRY_DOCK_SIG_SIZE)
        return ferry__fail(FERRY_ERR_LIMIT, "dock: encode: payload of %zu bytes", len);
    uint8_t *b = ferry__malloc(FERRY_DOCK_HEADER_SIZE + len + sig);
    if (!b) return FERRY_ERR_NOMEM;
    memset(b, 0, FERRY_DOCK_HEADER_SIZE);
    memcpy(b, k_magic, 4);
    ferry__put16(b + 4, FERRY_DOCK_FORMAT);
    ferry__put16(b + 6, FERRY_DOCK_HEADER_SIZE);
    ferry__put64(b + OFF_VERSION, version);
    ferry__put64(b + OFF_SEQ, seq);
    ferry__put32(b + OFF_ISLAND, island);
    size_t rl = strlen(run);
    ferry__put16(b + OFF_RUNLEN, (uint16_t)rl);
    ferry__put16(b + OFF_FLAGS, sig ? DK_FLAG_SIGNED : 0);
    ferry__put64(b + OFF_TIME, put_time_ms);
    ferry__put64(b + OFF_PLEN, (uint64_t)len);
    memcpy(b + OFF_RUN, run, rl);
    if (len) memcpy(b + FERRY_DOCK_HEADER_SIZE, payload, len);
    checksum(b, b + FERRY_DOCK_HEADER_SIZE, len, b + OFF_SUM);
    if (sig && (rc = ferry__sign_bytes(keys, FS_DOM_BATCH, b, FERRY_DOCK_HEADER_SIZE + len, b + FERRY_DOCK_HEADER_SIZE + len))) {
        ferry_free(b);
        return rc;
    }
    *out = b;
    *out_size = FERRY_DOCK_HEADER_SIZE + len + sig;
    return FERRY_OK;
}

/* The order of the checks decides which code a damaged object earns; it
 * goes from "what is this?" to "is it intact?" to "is it ours?", so that a
 * flipped bit in the run id reads as CHECKSUM, not as another run. */
int ferry_dock_decode(const void *data, size_t size, uint64_t max_payload, const char *run,
                      ferry_dock_header *h)
{
    if (!h || (!data && size)) return ferry__fail(FERRY_ERR_ARG, "dock: decode: NULL argument");
    memset(h, 0, sizeof *h);
    if (!max_payload) max_payload = DK_DEFAULT_MAX_PAYLOAD;
    const uint8_t *b = data;
    if (size && memcmp(b, k_magic, size < 4 ? size : 4))
        return ferry__fail(FERRY_ERR_DOCK_MAGIC, "magic is not \"FDCK\": not a dock batch");
    if (size < FERRY_DOCK_HEADER_SIZE)
        return ferry__fail(FERRY_ERR_DOCK_TRUNCATED, "%zu bytes, shorter than the %d-byte header", size,
                           FERRY_DOCK_HEADER_SIZE);
    unsigned fmt = ferry__le16(b + 4), hlen = ferry__le16(b + 6);
    if (fmt != FERRY_DOCK_FORMAT || hlen != FERRY_DOCK_HEADER_SIZE)
        return ferry__fail(FERRY_ERR_DOCK_FORMAT, "format %u with header length %u (this build reads format %d, length %d)",
                           fmt, hlen, FERRY_DOCK_FORMAT, FERRY_DOCK_HEADER_SIZE);
    uint64_t plen = ferry__le64(b + OFF_PLEN);
    if (plen > max_payload)
        return ferry__fail(FERRY_ERR_DOCK_LENGTH, "payload length %" PRIu64 " over the bound of %" PRIu64,
                           plen, max_payload);
    unsigned flags = ferry__le16(b + OFF_FLAGS);
    uint64_t body = size - FERRY_DOCK_HEADER_SIZE, extra = flags == DK_FLAG_SIGNED ? FERRY_DOCK_SIG_SIZE : 0;
    if (body < plen + extra)
        return ferry__fail(FERRY_ERR_DOCK_TRUNCATED, "payload length %" PRIu64 "%s but only %" PRIu64 " bytes follow the header",
                           plen, extra ? " and a signature" : "", body);
    if (body > plen + extra)
        return ferry__fail(FERRY_ERR_DOCK_LENGTH, "%" PRIu64 " bytes after the %" PRIu64 "-byte payload%s",
                           body - plen - extra, plen, extra ? " and its signature" : "");
    unsigned rl = ferry__le16(b + OFF_RUNLEN);
    if (rl < 1 || rl > FERRY_DOCK_RUN_MAX)
        return ferry__fail(FERRY_ERR_DOCK_HEADER, "run id length %u (want 1..%d)", rl, FERRY_DOCK_RUN_MAX);
    if (flags & ~DK_FLAG_SIGNED) return ferry__fail(FERRY_ERR_DOCK_HEADER, "flags 0x%04x (only bit 0, signed, is defined)", flags);
    for (unsigned i = 0; i < FERRY_DOCK_RUN_MAX; i++) {
        unsigned char c = b[OFF_RUN + i];
        if (i < rl ? !run_char_ok(c) || (i == 0 && c == '.') : c != 0)
            return ferry__fail(FERRY_ERR_DOCK_HEADER, "run id byte %u is 0x%02x", i, c);
    }
    uint8_t sum[16];
    checksum(b, b + FERRY_DOCK_HEADER_SIZE, (size_t)plen, sum);
    if (memcmp(sum, b + OFF_SUM, 16))
        return ferry__fail(FERRY_ERR_DOCK_CHECKSUM, "XXH3-128 of header and payload does not match");
    memcpy(h->run, b + OFF_RUN, rl);
    h->run[rl] = 0;
    h->version = ferry__le64(b + OFF_VERSION);
    h->seq = ferry__le64(b + OFF_SEQ);
    h->island = ferry__le32(b + OFF_ISLAND);
    h->put_time_ms = ferry__le64(b + OFF_TIME);
    h->payload = b + FERRY_DOCK_HEADER_SIZE;
    h->size = plen;
    h->signature = extra ? b + FERRY_DOCK_HEADER_SIZE + plen : NULL;
    if (run && strcmp(run, h->run))
        return ferry__fail(FERRY_ERR_DOCK_RUN, "batch of run '%s', not of '%.64s'", h->run, run);
    return FERRY_OK;
}

const char *ferry__dock_reason_name(int code)
{
    switch (code) {
    case FERRY_ERR_DOCK_MAGIC: return "magic";
    case FERRY_ERR_DOCK_FORMAT: return "format";
    case FERRY_ERR_DOCK_TRUNCATED: return "truncated";
    case FERRY_ERR_DOCK_LENGTH: return "length";
    case FERRY_ERR_DOCK_HEADER: return "header";
    case FERRY_ERR_DOCK_CHECKSUM: return "checksum";
    case FERRY_ERR_DOCK_RUN: return "run";
    case FERRY_ERR_DOCK_KEY: return "key";
    case FERRY_ERR_DOCK_MISPLACED: return "misplaced";
    case FERRY_ERR_DOCK_FUTURE: return "future";
    case FERRY_ERR_DOCK_SIGNATURE: return "signature";
    case FERRY_ERR_DOCK_REPLAY: return "replay";
    default: return "other";
    }
}
