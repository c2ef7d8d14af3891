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

/* Readers enforce signatures (the ring trusts at least one key). */
bool ferry__sign_keys_enforce(const ferry_keys *k);

/* SHA-256 of a file, streamed (*size = its bytes); of a buffer:
 * ferry__sha256 (lib/common/util.h). */
int ferry__sign_sha256_file(const char *path, uint8_t out[32], uint64_t *size);

/* Signs (domain, data) with the ring's signing key: raw = key id + signature. */
int ferry__sign_bytes(const ferry_keys *k, const char *domain, const void *data, size_t n, uint8_t raw[FS_SIG_RAW]);
/* Verifies raw over (domain, data) against the trusted keys; island >= 0
 * asks for a key enrolled for that island (or for any).  name names the
 * object in errors.  FERRY_ERR_SIG_UNTRUSTED, _INVALID. */
int ferry__sign_verify(const ferry_keys *k, const char *domain, const char *name, const void *data, size_t n,
                  const uint8_t raw[FS_SIG_RAW], int64_t island);

/* body (n bytes) + trailer: a new NUL-terminated text (free()). */
int ferry__sign_seal(const ferry_keys *k, const char *domain, const char *body, size_t n, char **out);
/* Splits a record into body and trailer.  With an enforcing ring the
 * trailer must be present and verify (FERRY_ERR_SIG_*); without one the
 * trailer, if any, is only stripped (a garbled one is still
 * FERRY_ERR_SIG_MALFORMED, so a cut record is never parsed as a whole
 * one).  *body_len = bytes of the body; *is_signed = a trailer was there. */
int ferry__sign_open(const ferry_keys *k, const char *domain, const char *name, const void *text, size_t n,
                size_t *body_len, bool *is_signed);

/* Signature failures are failures of the object they name. */
static inline bool fs_sig_error(int rc) { return rc >= FERRY_ERR_SIG_MISSING && rc <= FERRY_ERR_SIG_DIGEST; }

#endif
