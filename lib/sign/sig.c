/* Ed25519 key rings, signatures and SHA-256 digests through OpenSSL's
 * libcrypto EVP interface (no crypto is written here: only framing).
 * Public API: include/ferry_sign.h; internal: sig.h; bytes:
 * docs/PROTOCOL.md "Signatures". */
#include "sig.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#define MAX_TRUSTED 4096
#define KEY_FILE_MAX (64u << 10)

/* One enrolment: a key in one role.  The same key may be enrolled more
 * than once, in different roles; each enrolment is looked up on its own. */
typedef struct fs_key {
    EVP_PKEY *pk;
    uint8_t id[FS_KEYID_LEN];
    int64_t role; /* FERRY_KEY_PUBLISHER, or the island id whose batches it signs */
} fs_key;

struct ferry_keys {
    EVP_PKEY *signer;
    uint8_t signer_id[FS_KEYID_LEN];
    int64_t signer_role; /* FERRY_KEY_PUBLISHER, or an island id (batches only) */
    fs_key *trusted;
    size_t n, cap;
};

static const char k_tag[] = "ferry-sig-1";

/* OpenSSL's reason for the last failure, and its queue emptied. */
static const char *ossl_why(char *buf, size_t cap)
{
    unsigned long e = ERR_get_error();
    if (e) ERR_error_string_n(e, buf, cap);
    else snprintf(buf, cap, "no detail");
    ERR_clear_error();
    return buf;
}

/* A ring given is enforced even when it holds no key: an empty ring
 * (a trust list that matched nothing) must never read as "no keys". */
bool ferry__sign_keys_enforce(const ferry_keys *k) { return k != NULL; }

int ferry__sign_ring_check(const ferry_keys *k, const char *who)
{
    if (k && !k->n)
        return ferry__fail(FERRY_ERR_ARG, "%s: the key ring holds no key (no signing key, no trusted key: a trust list that "
                           "matched nothing?); pass no ring to read unsigned runs", who);
    return FERRY_OK;
}

size_t ferry__sign_role_keys(const ferry_keys *k, int64_t role)
{
    size_t c = 0;
    for (size_t i = 0; k && i < k->n; i++) c += k->trusted[i].role == role;
    return c;
}
size_t ferry_keys_trusted(const ferry_keys *k) { return k ? k->n : 0; }
size_t ferry_keys_publishers(const ferry_keys *k) { return ferry__sign_role_keys(k, FERRY_KEY_PUBLISHER); }
int ferry_keys_can_sign(const ferry_keys *k) { return k && k->signer ? 1 : 0; }

/* ---- digests ---- */

int ferry__sign_sha256_file(const char *path, uint8_t out[32], uint64_t *size)
{
    int fd = ferry__open_input(path, NULL); /* a FIFO would block the open */
    if (fd < 0) return -fd;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    size_t cap = 1u << 20;
    uint8_t *buf = ferry__malloc(cap);
    int rc = FERRY_OK;
    uint64_t total = 0;
    if (!c || !buf || !EVP_DigestInit_ex(c, EVP_sha256(), NULL)) rc = ferry__fail(FERRY_ERR_NOMEM, "SHA-256 of %s", path);
    while (!rc) {
        ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) rc = ferry__fail(FERRY_ERR_IO, "%s: read: %s", path, strerror(errno));
        else if (r == 0) break;
        else if (!EVP_DigestUpdate(c, buf, (size_t)r)) rc = ferry__fail(FERRY_ERR_NOMEM, "SHA-256 of %s", path);
        else total += (uint64_t)r;
    }
    unsigned len = 0;
    if (!rc && (!EVP_DigestFinal_ex(c, out, &len) || len != 32)) rc = ferry__fail(FERRY_ERR_NOMEM, "SHA-256 of %s", path);
    if (rc) ERR_clear_error();
    EVP_MD_CTX_free(c);
    free(buf);
    close(fd);
    if (size) *size = total;
    return rc;
}

/* ---- keys ---- */

static int key_id(EVP_PKEY *pk, uint8_t id[FS_KEYID_LEN], const char *path)
{
    uint8_t raw[32], d[32];
    size_t len = sizeof raw;
    if (EVP_PKEY_get_raw_public_key(pk, raw, &len) != 1 || len != 32)
        return ferry__fail(FERRY_ERR_SIG_KEY, "%s: cannot read the raw Ed25519 public key", path);
    int rc = ferry__sha256(raw, 32, d);
    if (!rc) memcpy(id, d, FS_KEYID_LEN);
    return rc;
}

static void id_out(char *out, const uint8_t id[FS_KEYID_LEN])
{
    if (out) ferry__hex(out, id, FS_KEYID_LEN);
}

/* Never prompts for a passphrase: an encrypted key is an error. */
static int no_pass(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return -1;
}

/* Reads a PEM key file: the private key if want_private, else the public
 * key (from a public key file, or the public half of a private one). */
static int load_key(const char *path, bool want_private, EVP_PKEY **out)
{
    *out = NULL;
    if (!path) return ferry__fail(FERRY_ERR_ARG, "key file: NULL path");
    struct stat sb;
    if (stat(path, &sb)) return ferry__fail(FERRY_ERR_SIG_KEY, "%s: %s", path, strerror(errno));
    uint8_t *data = NULL;
    size_t n = 0;
    int rc = ferry__read_file(path, KEY_FILE_MAX, &data, &n);
    if (rc) return ferry__context(FERRY_ERR_SIG_KEY, "key file %s", path);
    bool is_private = n && memmem(data, n, "PRIVATE KEY-----", 16) != NULL;
    if (want_private && !is_private) {
        free(data);
        return ferry__fail(FERRY_ERR_SIG_KEY, "%s: not a private key file (want \"BEGIN PRIVATE KEY\")", path);
    }
    if (is_private && (sb.st_mode & 077)) {
        free(data);
        return ferry__fail(FERRY_ERR_SIG_KEY, "%s: a private key readable by group or others (mode %03o): chmod 600 it",
                           path, (unsigned)(sb.st_mode & 0777));
    }
    BIO *b = BIO_new_mem_buf(data, (int)n);
    EVP_PKEY *pk = NULL;
    if (b) pk = is_private ? PEM_read_bio_PrivateKey(b, NULL, no_pass, NULL) : PEM_read_bio_PUBKEY(b, NULL, no_pass, NULL);
    BIO_free(b);
    OPENSSL_cleanse(data, n);
    free(data);
    char w[160];
    if (!pk) return ferry__fail(FERRY_ERR_SIG_KEY, "%s: not a PEM %s key: %s", path, is_private ? "private" : "public", ossl_why(w, sizeof w));
    if (EVP_PKEY_get_id(pk) != EVP_PKEY_ED25519) {
        EVP_PKEY_free(pk);
        return ferry__fail(FERRY_ERR_SIG_KEY, "%s: not an Ed25519 key", path);
    }
    *out = pk;
    return FERRY_OK;
}

int ferry_keys_create(ferry_keys **out)
{
    if (!out) return ferry__fail(FERRY_ERR_ARG, "ferry_keys_create: NULL argument");
    *out = ferry__calloc(1, sizeof **out);
    return *out ? FERRY_OK : FERRY_ERR_NOMEM;
}

void ferry_keys_free(ferry_keys *k)
{
    if (!k) return;
    EVP_PKEY_free(k->signer);
    for (size_t i = 0; i < k->n; i++) EVP_PKEY_free(k->trusted[i].pk);
    free(k->trusted);
    free(k);
}

static int add_trusted(ferry_keys *k, EVP_PKEY *pk, const uint8_t id[FS_KEYID_LEN], int64_t role)
{
    if (k->n == MAX_TRUSTED) return ferry__fail(FERRY_ERR_LIMIT, "key ring: more than %d trusted keys", MAX_TRUSTED);
    if (ferry__grow((void **)&k->trusted, &k->cap, k->n + 1, sizeof *k->trusted)) return FERRY_ERR_NOMEM;
    if (!EVP_PKEY_up_ref(pk)) return ferry__fail(FERRY_ERR_NOMEM, "key ring: EVP_PKEY_up_ref");
    fs_key *t = &k->trusted[k->n++];
    t->pk = pk;
    memcpy(t->id, id, FS_KEYID_LEN);
    t->role = role;
    return FERRY_OK;
}

static int check_role(const char *path, int64_t role)
{
    if (role < FERRY_KEY_PUBLISHER || role > (int64_t)UINT32_MAX)
        return ferry__fail(FERRY_ERR_ARG, "%s: island %lld out of range (FERRY_KEY_PUBLISHER = -1, or an island id 0..2^32-1)",
                           path ? path : "(null)", (long long)role);
    return FERRY_OK;
}

static int set_signer(ferry_keys *k, const char *path, int64_t role, char key_id_out[FERRY_KEY_ID_LEN + 1])
{
    if (!k) return ferry__fail(FERRY_ERR_ARG, "ferry_keys_set_signer: NULL ring");
    if (k->signer) return ferry__fail(FERRY_ERR_ARG, "%s: the key ring already has a signing key", path ? path : "(null)");
    int rc = check_role(path, role);
    if (rc) return rc;
    EVP_PKEY *pk;
    rc = load_key(path, true, &pk);
    uint8_t id[FS_KEYID_LEN];
    if (!rc) rc = key_id(pk, id, path);
    if (!rc) rc = add_trusted(k, pk, id, role); /* its own public half, in its own role */
    if (rc) {
        EVP_PKEY_free(pk);
        return rc;
    }
    k->signer = pk;
    k->signer_role = role;
    memcpy(k->signer_id, id, FS_KEYID_LEN);
    id_out(key_id_out, id);
    return FERRY_OK;
}

int ferry_keys_set_signer(ferry_keys *k, const char *path, char key_id_out[FERRY_KEY_ID_LEN + 1])
{
    return set_signer(k, path, FERRY_KEY_PUBLISHER, key_id_out);
}

int ferry_keys_set_island_signer(ferry_keys *k, const char *path, int64_t island, char key_id_out[FERRY_KEY_ID_LEN + 1])
{
    if (island < 0) return ferry__fail(FERRY_ERR_ARG, "%s: an island signer needs an island id >= 0", path ? path : "(null)");
    return set_signer(k, path, island, key_id_out);
}

int ferry_keys_trust(ferry_keys *k, const char *path, int64_t island, char key_id_out[FERRY_KEY_ID_LEN + 1])
{
    if (!k) return ferry__fail(FERRY_ERR_ARG, "ferry_keys_trust: NULL ring");
    int rc = check_role(path, island);
    if (rc) return rc;
    EVP_PKEY *pk;
    rc = load_key(path, false, &pk);
    uint8_t id[FS_KEYID_LEN];
    if (!rc) rc = key_id(pk, id, path);
    if (!rc) rc = add_trusted(k, pk, id, island);
    EVP_PKEY_free(pk); /* the ring holds its own reference */
    if (!rc) id_out(key_id_out, id);
    return rc;
}

/* Writes a new file with O_EXCL at mode; removes it on failure. */
static int write_new(const char *path, const void *data, size_t n, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) return ferry__fail(FERRY_ERR_IO, "%s: %s", path, strerror(errno));
    const uint8_t *p = data;
    size_t left = n;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        p += w, left -= (size_t)w;
    }
    int rc = left || fsync(fd) ? ferry__fail(FERRY_ERR_IO, "%s: write: %s", path, strerror(errno)) : FERRY_OK;
    if (close(fd) && !rc) rc = ferry__fail(FERRY_ERR_IO, "%s: close: %s", path, strerror(errno));
    if (rc) unlink(path);
    return rc;
}

static int pem_to(EVP_PKEY *pk, bool private_part, const char *path, mode_t mode)
{
    BIO *b = BIO_new(BIO_s_mem());
    int ok = b && (private_part ? PEM_write_bio_PrivateKey(b, pk, NULL, NULL, 0, NULL, NULL) : PEM_write_bio_PUBKEY(b, pk));
    char *data = NULL;
    long n = ok ? BIO_get_mem_data(b, &data) : 0;
    int rc;
    if (!ok || n <= 0) {
        char w[160];
        rc = ferry__fail(FERRY_ERR_NOMEM, "%s: PEM encoding: %s", path, ossl_why(w, sizeof w));
    } else {
        rc = write_new(path, data, (size_t)n, mode);
    }
    BIO_free_all(b); /* a memory BIO clears nothing: acceptable, the process owns the key anyway */
    return rc;
}

int ferry_keygen(const char *prefix, char key_id_out[FERRY_KEY_ID_LEN + 1])
{
    if (!prefix || !*prefix) return ferry__fail(FERRY_ERR_ARG, "ferry_keygen: empty prefix");
    char kp[4096], pp[4096];
    if ((size_t)snprintf(kp, sizeof kp, "%s.key", prefix) >= sizeof kp || (size_t)snprintf(pp, sizeof pp, "%s.pub", prefix) >= sizeof pp)
        return ferry__fail(FERRY_ERR_ARG, "ferry_keygen: prefix too long");
    EVP_PKEY *pk = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    if (!pk) {
        char w[160];
        return ferry__fail(FERRY_ERR_SIG_KEY, "Ed25519 key generation: %s", ossl_why(w, sizeof w));
    }
    uint8_t id[FS_KEYID_LEN];
    int rc = key_id(pk, id, kp);
    if (!rc) rc = pem_to(pk, true, kp, 0600);
    if (!rc && (rc = pem_to(pk, false, pp, 0644))) unlink(kp);
    EVP_PKEY_free(pk);
    if (!rc) id_out(key_id_out, id);
    return rc;
}

/* ---- signing ---- */

/* What Ed25519 signs: SHA-256("ferry-sig-1" 0 domain 0 data). */
static int message(const char *domain, const void *data, size_t n, uint8_t out[32])
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned len = 0;
    int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) && EVP_DigestUpdate(c, k_tag, sizeof k_tag) &&
             EVP_DigestUpdate(c, domain, strlen(domain) + 1) && (!n || EVP_DigestUpdate(c, data, n)) &&
             EVP_DigestFinal_ex(c, out, &len) && len == 32;
    EVP_MD_CTX_free(c);
    if (!ok) {
        ERR_clear_error();
        return ferry__fail(FERRY_ERR_NOMEM, "SHA-256 of a signed message");
    }
    return FERRY_OK;
}

int ferry__sign_bytes(const ferry_keys *k, const char *domain, const void *data, size_t n, uint8_t raw[FS_SIG_RAW])
{
    if (!k || !k->signer) return ferry__fail(FERRY_ERR_ARG, "signing without a signing key");
    /* an island's key signs its batches and nothing else: never a version
     * record nor a cursor, which only publisher keys may sign */
    if (k->signer_role != FERRY_KEY_PUBLISHER && strcmp(domain, FS_DOM_BATCH))
        return ferry__fail(FERRY_ERR_ARG, "the signing key is island %lld's (batches only): it may not sign a %s record",
                           (long long)k->signer_role, domain);
    uint8_t m[32];
    int rc = message(domain, data, n, m);
    if (rc) return rc;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    size_t len = FS_SIG_LEN;
    int ok = c && EVP_DigestSignInit(c, NULL, NULL, NULL, k->signer) == 1 &&
             EVP_DigestSign(c, raw + FS_KEYID_LEN, &len, m, sizeof m) == 1 && len == FS_SIG_LEN;
    EVP_MD_CTX_free(c);
    if (!ok) {
        char w[160];
        return ferry__fail(FERRY_ERR_SIG_KEY, "Ed25519 signing: %s", ossl_why(w, sizeof w));
    }
    memcpy(raw, k->signer_id, FS_KEYID_LEN);
    return FERRY_OK;
}

/* What role a key id has in the ring, for an error message. */
static void roles_of(const ferry_keys *k, const uint8_t *id, char *out, size_t cap)
{
    out[0] = 0;
    size_t at = 0;
    for (size_t i = 0; k && i < k->n && at < cap; i++) {
        if (memcmp(k->trusted[i].id, id, FS_KEYID_LEN)) continue;
        int w = k->trusted[i].role == FERRY_KEY_PUBLISHER
                    ? snprintf(out + at, cap - at, "%sa publisher key", at ? ", " : "")
                    : snprintf(out + at, cap - at, "%sisland %lld's batch key", at ? ", " : "", (long long)k->trusted[i].role);
        if (w < 0) break;
        at += (size_t)w;
    }
}

int ferry__sign_verify(const ferry_keys *k, const char *domain, const char *name, const void *data, size_t n,
                  const uint8_t raw[FS_SIG_RAW], int64_t role)
{
    int rc = ferry__sign_ring_check(k, name);
    if (rc) return rc;
    char hid[2 * FS_KEYID_LEN + 1];
    ferry__hex(hid, raw, FS_KEYID_LEN);
    /* the key must be enrolled in exactly the role asked for: a publisher
     * key signs versions (and cursors), an island's key that island's
     * batches; neither stands in for the other */
    const fs_key *t = NULL;
    for (size_t i = 0; k && i < k->n && !t; i++)
        if (!memcmp(k->trusted[i].id, raw, FS_KEYID_LEN) && k->trusted[i].role == role) t = &k->trusted[i];
    if (!t) {
        char has[160];
        roles_of(k, raw, has, sizeof has);
        const char *why = has[0] ? has : "not a trusted key";
        if (role != FERRY_KEY_PUBLISHER)
            return ferry__fail(FERRY_ERR_SIG_UNTRUSTED, "%s: signed by key %s, which is not enrolled for island %lld (%s)", name, hid,
                               (long long)role, why);
        return ferry__fail(FERRY_ERR_SIG_UNTRUSTED, "%s: signed by key %s, which is not enrolled as a publisher (%s): refused",
                           name, hid, why);
    }
    uint8_t m[32];
    rc = message(domain, data, n, m);
    if (rc) return rc;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    int ok = c && EVP_DigestVerifyInit(c, NULL, NULL, NULL, t->pk) == 1 &&
             EVP_DigestVerify(c, raw + FS_KEYID_LEN, FS_SIG_LEN, m, sizeof m) == 1;
    EVP_MD_CTX_free(c);
    ERR_clear_error();
    if (!ok) return ferry__fail(FERRY_ERR_SIG_INVALID, "%s: the signature of key %s does not verify (forged or altered)", name, hid);
    return FERRY_OK;
}

/* ---- text records ---- */

static const char k_lead[] = "\n#ferry-sig-1 "; /* 14 bytes */

int ferry__sign_seal(const ferry_keys *k, const char *domain, const char *body, size_t n, char **out)
{
    *out = NULL;
    uint8_t raw[FS_SIG_RAW];
    int rc = ferry__sign_bytes(k, domain, body, n, raw);
    if (rc) return rc;
    char *t = ferry__malloc(n + FS_SIG_TRAILER + 1);
    if (!t) return FERRY_ERR_NOMEM;
    memcpy(t, body, n);
    char *p = t + n;
    memcpy(p, k_lead, 14);
    ferry__hex(p + 14, raw, FS_KEYID_LEN);
    p[30] = ' ';
    ferry__hex(p + 31, raw + FS_KEYID_LEN, FS_SIG_LEN);
    p[159] = '\n';
    p[160] = 0;
    *out = t;
    return FERRY_OK;
}

int ferry__sign_open(const ferry_keys *k, const char *domain, const char *name, const void *text, size_t n, size_t *body_len,
                bool *is_signed)
{
    const char *s = text;
    *body_len = n;
    *is_signed = false;
    int rc = ferry__sign_ring_check(k, name);
    if (rc) return rc;
    /* the last "\n#ferry-sig-" in the text starts the trailer, whole or cut */
    const char *lead = NULL;
    size_t from = n > FS_SIG_TRAILER + 64 ? n - FS_SIG_TRAILER - 64 : 0;
    for (const char *p = s + from; (p = memmem(p, n - (size_t)(p - s), "\n#ferry-sig-", 12)); p++) lead = p;
    if (!lead) {
        if (ferry__sign_keys_enforce(k)) return ferry__fail(FERRY_ERR_SIG_MISSING, "%s: unsigned, and this reader trusts only signed records", name);
        return FERRY_OK;
    }
    size_t at = (size_t)(lead - s);
    uint8_t raw[FS_SIG_RAW];
    if (n - at != FS_SIG_TRAILER || memcmp(lead, k_lead, 14) || !ferry__unhex(raw, lead + 14, FS_KEYID_LEN) || lead[30] != ' ' ||
        !ferry__unhex(raw + FS_KEYID_LEN, lead + 31, FS_SIG_LEN) || lead[159] != '\n')
        return ferry__fail(FERRY_ERR_SIG_MALFORMED, "%s: the signature trailer is cut short or garbled (%zu bytes, want %d)", name,
                           n - at, FS_SIG_TRAILER);
    *body_len = at;
    *is_signed = true;
    if (!ferry__sign_keys_enforce(k)) return FERRY_OK;
    return ferry__sign_verify(k, domain, name, s, at, raw, FERRY_KEY_PUBLISHER); /* records: publishers only */
}
