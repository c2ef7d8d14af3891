/*
 * ferry_sign.h — Ed25519 keys for signed versions (include/ferry_sync.h)
 * and signed trajectory batches (include/ferry_dock.h).
 *
 * docs/SECURITY.md is the long form (threat model, what is protected and
 * what is not, how to run with keys); docs/PROTOCOL.md "Signatures" gives
 * the bytes.  In short: the trainer signs HEAD, every manifest and the
 * compaction index with its private key, and each manifest carries the
 * SHA-256 and size of every object it references; islands sign their
 * batches with their own keys.  A reader given a key ring refuses anything
 * unsigned or wrongly signed before it parses it, and checks every object
 * it fetches against its signed digest.  A reader given no ring (NULL)
 * reads signed and unsigned runs alike without checking signatures; a ring
 * with no key in it is an error (FERRY_ERR_ARG), never "no keys".
 *
 * Every trusted key has one role, and verifies only what that role signs:
 *   publisher (FERRY_KEY_PUBLISHER): version records — HEAD, manifests
 *     (single-rank and sharded), the compaction index — and the dock's
 *     replay cursor.  The trainer's key.
 *   island I (an id >= 0): island I's trajectory batches, nothing else.
 * An island's key never verifies a version, however the ring was built:
 * an island that holds its own key cannot make the trainer (or another
 * island) take weights it signed.  How to build each ring:
 *   trainer:  ferry_keys_set_signer(trainer.key)          (publisher)
 *             ferry_keys_trust(island_I.pub, I) per island (batches of I)
 *   island I: ferry_keys_trust(trainer.pub, FERRY_KEY_PUBLISHER)
 *             ferry_keys_set_island_signer(island_I.key, I) to sign its
 *             batches (this ring then cannot sign a version record)
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
 * public keys, each in one role.  Read-only once built: one ring may serve
 * many handles and threads.  Free with ferry_keys_free (NULL ok). */
typedef struct ferry_keys ferry_keys;
FERRY_API int ferry_keys_create(ferry_keys **out);
FERRY_API void ferry_keys_free(ferry_keys *k);

/* The role of a publisher key (the trainer's): see the top of this file. */
#define FERRY_KEY_PUBLISHER (-1)

/* Loads the signing key (a private key file) as a PUBLISHER key: it signs
 * version records (and the dock cursor, and batches if asked).  Its public
 * half is trusted as a publisher as well, so a publisher verifies what it
 * wrote before.  key_id may be NULL.  FERRY_ERR_SIG_KEY, FERRY_ERR_ARG if a
 * signing key is already set. */
FERRY_API int ferry_keys_set_signer(ferry_keys *k, const char *private_key_path, char key_id[FERRY_KEY_ID_LEN + 1]);

/* Loads the signing key of island `island` (>= 0): it signs that island's
 * trajectory batches only; signing a version record or a cursor with this
 * ring is FERRY_ERR_ARG.  Its public half is enrolled for that island only
 * (never as a publisher).  Errors as ferry_keys_set_signer. */
FERRY_API int ferry_keys_set_island_signer(ferry_keys *k, const char *private_key_path, int64_t island,
                                           char key_id[FERRY_KEY_ID_LEN + 1]);

/* Trusts a public key (a .pub file; a private key file is accepted too and
 * only its public half used) in one role: island = FERRY_KEY_PUBLISHER (-1)
 * enrolls a publisher, whose signatures are taken on version records and
 * the dock cursor and on nothing else; island >= 0 enrolls island
 * `island`'s key, whose signatures are taken on that island's batches and
 * on nothing else.  A key may be enrolled in several roles by calling this
 * once per role.  FERRY_ERR_SIG_KEY, FERRY_ERR_ARG (island below -1 or past
 * 2^32-1), FERRY_ERR_LIMIT past 4096 keys. */
FERRY_API int ferry_keys_trust(ferry_keys *k, const char *public_key_path, int64_t island,
                               char key_id[FERRY_KEY_ID_LEN + 1]);

/* Number of trusted keys, all roles (the signer's included). */
FERRY_API size_t ferry_keys_trusted(const ferry_keys *k);
/* Number of keys enrolled as publishers (the publisher signer's included):
 * a ring that reads versions needs at least one. */
FERRY_API size_t ferry_keys_publishers(const ferry_keys *k);
/* 1 if a signing key is set. */
FERRY_API int ferry_keys_can_sign(const ferry_keys *k);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_SIGN_H */
