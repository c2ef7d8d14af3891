/* Signatures and digests shared by lib/sync (HEAD, manifests, the
 * compaction index, object digests) and lib/dock (batches): the small
 * internal API over include/ferry_sign.h.  The bytes are specified in
 * docs/PROTOCOL.md "Signatures".
 *
 * A signed text record is its body followed by one trailer line:
 *
 *     BODY "\n#ferry-sig-1 " KEYID(16 hex) " " SIGNATURE(128 hex) "\n"
 *
 * and the Ed25519 signature is over SHA-256("ferry-sig-1" 0 DOMAIN 0 BODY).
 * The body is whatever the record's own format is (JSON today, a sharded
 * manifest tomorrow): signing never looks inside it. */
#ifndef FERRY_SYNC_SIG_H
#define FERRY_SYNC_SIG_H

#include "common.h"
#include "ferry_sign.h"

#define FS_SIG_LEN 64                        /* Ed25519 signature */
#define FS_KEYID_LEN 8                       /* bytes of a key id */
#define FS_SIG_RAW (FS_KEYID_LEN + FS_SIG_LEN) /* key id + signature, binary form */
#define FS_SIG_TRAILER (14 + 16 + 1 + 128 + 1) /* text trailer line, newline before it included */

/* Domains: what a signature is for, so one signed text is never accepted
 * as another kind of thing. */
#define FS_DOM_RECORD "ferry-record"         /* HEAD, manifests, the compaction index */
#define FS_DOM_BATCH "ferry-batch"           /* trajectory batches */
#define FS_DOM_CURSOR "ferry-cursor"         /* the dock's replay cursor */

/* Key roles (include/ferry_sign.h).  Every verification names the one role
 * whose keys may have signed:
 *   FERRY_KEY_PUBLISHER  version records (HEAD, manifests of either format,
 *                        the compaction index) and the dock cursor: what
 *                        the trainer writes.  ferry__sign_verify_publisher.
 *   island id I >= 0     island I's trajectory batches, nothing else.
 *                        ferry__sign_verify_island.
 * A key enrolled for an island never verifies a record or a cursor, and a
 * publisher key never verifies a batch (FERRY_ERR_SIG_UNTRUSTED, naming the
 * role the key does have).  A ring whose signer is an island's
 * (ferry_keys_set_island_signer) signs batches only: ferry__sign_bytes and
 * ferry__sign_seal refuse any other domain with FERRY_ERR_ARG. */

/* Readers enforce signatures whenever a ring is given (k != NULL), even an
 * empty one: an empty ring fails every verification with FERRY_ERR_ARG
 * (ferry__sign_ring_check) instead of reading as "no keys". */
bool ferry__sign_keys_enforce(const ferry_keys *k);
/* FERRY_ERR_ARG naming who when k is a ring with no key at all; FERRY_OK
 * for NULL (no ring: unsigned allowed) or a ring with keys.  Handles that
 * take a ring call it when opened. */
int ferry__sign_ring_check(const ferry_keys *k, const char *who);
/* Number of keys enrolled in role (FERRY_KEY_PUBLISHER or an island id). */
size_t ferry__sign_role_keys(const ferry_keys *k, int64_t role);

/* SHA-256 of a file, streamed (*size = its bytes); of a buffer:
 * ferry__sha256 (lib/common/util.h). */
int ferry__sign_sha256_file(const char *path, uint8_t out[32], uint64_t *size);

/* Signs (domain, data) with the ring's signing key: raw = key id + signature. */
int ferry__sign_bytes(const ferry_keys *k, const char *domain, const void *data, size_t n, uint8_t raw[FS_SIG_RAW]);
/* Verifies raw over (domain, data) against the keys enrolled in role
 * (FERRY_KEY_PUBLISHER, or an island id >= 0: that island's keys only).
 * name names the object in errors.  FERRY_ERR_SIG_UNTRUSTED, _INVALID;
 * FERRY_ERR_ARG for an empty ring.  Prefer the two wrappers below. */
int ferry__sign_verify(const ferry_keys *k, const char *domain, const char *name, const void *data, size_t n,
                  const uint8_t raw[FS_SIG_RAW], int64_t role);
/* Records of versions and the dock cursor: publisher keys only. */
static inline int ferry__sign_verify_publisher(const ferry_keys *k, const char *domain, const char *name, const void *data, size_t n,
                                               const uint8_t raw[FS_SIG_RAW])
{
    return ferry__sign_verify(k, domain, name, data, n, raw, FERRY_KEY_PUBLISHER);
}
/* A batch of island `island`: keys enrolled for that island only. */
static inline int ferry__sign_verify_island(const ferry_keys *k, const char *domain, const char *name, const void *data, size_t n,
                                            const uint8_t raw[FS_SIG_RAW], uint32_t island)
{
    return ferry__sign_verify(k, domain, name, data, n, raw, (int64_t)island);
}

/* body (n bytes) + trailer: a new NUL-terminated text (free()). */
int ferry__sign_seal(const ferry_keys *k, const char *domain, const char *body, size_t n, char **out);
/* Splits a record into body and trailer.  With an enforcing ring the
 * trailer must be present and verify against a PUBLISHER key
 * (FERRY_ERR_SIG_*; island keys never verify a record); without one the
 * trailer, if any, is only stripped (a garbled one is still
 * FERRY_ERR_SIG_MALFORMED, so a cut record is never parsed as a whole
 * one).  *body_len = bytes of the body; *is_signed = a trailer was there. */
int ferry__sign_open(const ferry_keys *k, const char *domain, const char *name, const void *text, size_t n,
                size_t *body_len, bool *is_signed);

/* Signature failures are failures of the object they name. */
static inline bool fs_sig_error(int rc) { return rc >= FERRY_ERR_SIG_MISSING && rc <= FERRY_ERR_SIG_DIGEST; }

#endif
