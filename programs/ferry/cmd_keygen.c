/* ferry keygen: a new Ed25519 key pair for signed runs and batches
 * (include/ferry_sign.h, docs/SECURITY.md). */
#include "cmd_sync.h"

#ifndef FERRY_NO_NET
#include <stdio.h>
#include <string.h>

#include "util.h"

static void keygen_help(void)
{
    printf("usage: ferry keygen -o NAME [--json]\n\n"
           "Makes a new Ed25519 key pair: NAME.key (the private key, PEM, mode 0600) and\n"
           "NAME.pub (the public key, PEM).  Neither file may exist.  Prints the key id\n"
           "(the first 8 bytes of SHA-256 of the raw public key, in hex).\n\n"
           "The trainer signs with its private key (ferry publish --sign-key NAME.key);\n"
           "islands and other readers trust its public key (ferry pull --trust-key\n"
           "NAME.pub).  Each island signs its trajectory batches with a key of its own.\n"
           "See docs/SECURITY.md.\n");
}

int cmd_keygen(int argc, char **argv)
{
    const char *name = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) { keygen_help(); return 0; }
        if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "-o") || !strcmp(a, "--out")) {
            if (++i == argc) return cli_usage_error("keygen", "%s needs a name", a);
            name = argv[i];
        } else return cli_usage_error("keygen", "unexpected argument '%s'", a);
    }
    if (!name) return cli_usage_error("keygen", "missing -o NAME");
    char id[FERRY_KEY_ID_LEN + 1];
    int rc = ferry_keygen(name, id);
    if (rc) return sync_fail("keygen", rc, name);
    if (json) printf("{\"key_id\": \"%s\", \"private\": \"%s.key\", \"public\": \"%s.pub\"}\n", id, name, name);
    else printf("key %s: private %s.key (keep it secret), public %s.pub\n", id, name, name);
    return 0;
}
#endif
