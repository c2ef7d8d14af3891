/*
 * ferry_sign.h — Ed25519 keys for signed versions (include/ferry_sync.h)
 * and signed trajectory batches (include/ferry_dock.h).
 *
 * docs/SECURITY.md is the long form (threat model, what is protected and
 * what is not, how to run with keys); docs/PROTOCOL.md "Signatures" gives
 * the bytes.  In short: the trainer signs HEAD, every manifest and the
 * compaction index with its private key, and each manifest carries the
 * SHA-256 and size of every object it references; islands sign their
 * batches with their own keys.  A reader given trusted public keys refuses
 * anything unsigned or wrongly signed before it parses it, and checks every
 * object it fetches against its signed digest.  A reader given no trusted
 * key reads signed and unsigned runs alike without checking signatures.
 *
 * Keys are OpenSSL PEM files: the private key PKCS#8 ("BEGIN PRIVATE
 * KEY"), created 0600 and refused when group or others may read it; the
 * public key SubjectPublicKeyInfo ("BEGIN PUBLIC KEY").  A key's id is the
 * first 8 bytes of SHA-256 of its 32-byte raw public key, in hex.
 * Crypto is OpenSSL's libcrypto (EVP); nothing is written by hand.
 */
#ifndef FERRY_SIGN_H
#define FERRY_SIGN_H

#include "ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Errors 140..159 (FERRY_ERR_SIG_*): listed, with their
 * messages and meanings, in ferry_errors.h (included through ferry.h).
 * ====================================================================== */

#define FERRY_KEY_ID_LEN 16 /* hex digits of a key id */

/* Makes a new Ed25519 key pair: PREFIX.key (private, mode 0600) and
 * PREFIX.pub (public).  Neither file may exist (O_EXCL); on failure
 * neither is left.  key_id (may be NULL) receives the key's id. */
FERRY_API int ferry_keygen(const char *prefix, char key_id[FERRY_KEY_ID_LEN + 1]);

/* A key ring: at most one signing (private) key and any number of trusted
 * public keys.  Read-only once built: one ring may serve many handles and
 * threads.  Free with ferry_keys_free (NULL ok). */
typedef struct ferry_keys ferry_keys;
FERRY_API int ferry_keys_create(ferry_keys **out);
FERRY_API void ferry_keys_free(ferry_keys *k);

/* Loads the signing key (a private key file).  Its public half is trusted
 * as well, so a publisher verifies what it wrote before.  key_id may be
 * NULL.  FERRY_ERR_SIG_KEY, FERRY_ERR_ARG if a signing key is already set. */
FERRY_API int ferry_keys_set_signer(ferry_keys *k, const char *private_key_path, char key_id[FERRY_KEY_ID_LEN + 1]);

/* Trusts a public key (a .pub file; a private key file is accepted too and
 * only its public half used).  island >= 0 enrolls it for that island id
 * only (the dock admits a batch of island I only when signed by a key
 * enrolled for I); island = -1 trusts it for versions and for any island.
 * FERRY_ERR_SIG_KEY, FERRY_ERR_LIMIT past 4096 keys. */
FERRY_API int ferry_keys_trust(ferry_keys *k, const char *public_key_path, int64_t island,
                               char key_id[FERRY_KEY_ID_LEN + 1]);

/* Number of trusted keys (the signer's included).  Readers enforce
 * signatures when it is above 0. */
FERRY_API size_t ferry_keys_trusted(const ferry_keys *k);
/* 1 if a signing key is set. */
FERRY_API int ferry_keys_can_sign(const ferry_keys *k);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_SIGN_H */
