/* The store layer's parsers and checks, without any server: the XML
 * scanner and ListObjectsV2 parser (valid pages, hostile documents, a
 * bounded mutation fuzz), URL and option parsing, credentials from the
 * environment, URI encoding, etags, dates, numbers, UTF-8. */
#ifdef FERRY_NO_NET /* a core-only build (make NO_NET=1) has no store layer */
#include "helpers.h"
NOT_BUILT_MAIN("store layer not built (NO_NET=1)")
#else
#include <stdlib.h>

#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ferry_store.h"
#include "store/store_impl.h"

/* ---------------------------------------------------------------------
 * ListObjectsV2
 * ------------------------------------------------------------------- */

typedef struct got {
    int n;
    ferry__s3_entry e[8];
} got;

static int collect(void *ctx, const ferry__s3_entry *e)
{
    got *g = ctx;
    if (g->n < 8) g->e[g->n] = *e;
    g->n++;
    return 0;
}

static const char *PAGE =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    "<!-- a comment -->\n"
    "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
    "<Name>bkt</Name><Prefix/><KeyCount>3</KeyCount><MaxKeys>3</MaxKeys>"
    "<IsTruncated>true</IsTruncated><NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>"
    "<Contents><Key>p/a &amp; b &lt;c&gt; &quot;d&quot; &apos;e&apos; &#65;&#x42;&#xe9;</Key>"
    "<LastModified>2013-05-24T00:00:00.000Z</LastModified><ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag>"
    "<Size>4</Size><Owner><ID>x</ID><DisplayName>y</DisplayName></Owner><StorageClass>STANDARD</StorageClass></Contents>\n"
    "  <Contents>\n    <Key><![CDATA[p/cdata<&>]]></Key>\n    <Size>0</Size>\n  </Contents>"
    "<Contents><ETag>\"multi-3\"</ETag><Size>18446744073709551615</Size><Key>p/z</Key></Contents>"
    "</ListBucketResult>";

static void test_list_valid(void)
{
    got g = {0};
    ferry__s3_page page;
    CHECK_OK(ferry__s3_parse_list(PAGE, strlen(PAGE), &page, collect, &g));
    CHECK(g.n == 3);
    CHECK(page.truncated == 1);
    CHECK(!strcmp(page.next_token, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="));
    CHECK(!strcmp(g.e[0].key, "p/a & b <c> \"d\" 'e' AB\xc3\xa9"));
    CHECK(g.e[0].st.size == 4);
    CHECK(!strcmp(g.e[0].st.etag, "9b2cf535f27731c974343645a3985328"));
    CHECK(g.e[0].st.mtime == 1369353600);
    CHECK(!strcmp(g.e[1].key, "p/cdata<&>") && g.e[1].st.size == 0 && g.e[1].st.etag[0] == 0);
    CHECK(!strcmp(g.e[2].key, "p/z") && g.e[2].st.size == UINT64_MAX && !strcmp(g.e[2].st.etag, "multi-3"));
    const char *last = "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>";
    g.n = 0;
    CHECK_OK(ferry__s3_parse_list(last, strlen(last), &page, collect, &g));
    CHECK(g.n == 0 && page.truncated == 0);
    const char *empty = "<ListBucketResult/>";
    CHECK_OK(ferry__s3_parse_list(empty, strlen(empty), &page, collect, &g));
}

static void test_list_hostile(void)
{
    static char deep[2000], longkey[5000], longtok[5000];
    strcpy(deep, "<ListBucketResult>");
    for (int i = 0; i < 40; i++) strcat(deep, "<a>");
    strcpy(longkey, "<ListBucketResult><Contents><Key>");
    memset(longkey + strlen(longkey), 'k', 3000);
    strcat(longkey, "</Key><Size>1</Size></Contents></ListBucketResult>");
    strcpy(longtok, "<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>");
    memset(longtok + strlen(longtok), 't', 4200);
    strcat(longtok, "</NextContinuationToken></ListBucketResult>");
    const char *bad[] = {
        "",
        "   ",
        "not xml",
        "<Other/>",
        "<ListBucketResult>",
        "<ListBucketResult></ListBucketResultX>",
        "<ListBucketResult><Contents></ListBucketResult>",
        "<ListBucketResult></ListBucketResult><ListBucketResult/>",
        "<ListBucketResult/>trailing",
        "<!DOCTYPE x [<!ENTITY a \"b\">]><ListBucketResult/>",
        "<ListBucketResult><Contents><Key>k</Key></Contents></ListBucketResult>",       /* no Size */
        "<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>",     /* no Key */
        "<ListBucketResult><Contents><Key></Key><Size>1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k</Key><Key>j</Key><Size>1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k</Key><Size>1e3</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k</Key><Size>18446744073709551616</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k</Key><Size> 1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k&#0;x</Key><Size>1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k&#xD800;</Key><Size>1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k&#x110000;</Key><Size>1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k&unknown;</Key><Size>1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k&amp</Key><Size>1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k<b/></Key><Size>1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k</Key><Size>1</Size><ETag>\"a b\"</ETag></Contents></ListBucketResult>",
        "<ListBucketResult><IsTruncated>yes</IsTruncated></ListBucketResult>",
        "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
        "<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>a b</NextContinuationToken></ListBucketResult>",
        "<ListBucketResult><IsTruncated>false</IsTruncated><IsTruncated>true</IsTruncated></ListBucketResult>",
        "<ListBucketResult a=b/>",
        "<ListBucketResult a=\"b/>",
        "<ListBucketResult><![CDATA[x</ListBucketResult>",
        "<ListBucketResult><!-- x </ListBucketResult>",
        "<ListBucketResult><?pi </ListBucketResult>",
        "<ListBucketResult></ >",
        "<ListBucketResult><1a/></ListBucketResult>",
        deep,
        longkey,
        longtok,
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        got g = {0};
        ferry__s3_page page;
        int rc = ferry__s3_parse_list(bad[i], strlen(bad[i]), &page, collect, &g);
        if (rc != FERRY_ERR_STORE_CORRUPT) fprintf(stderr, "hostile listing %zu: rc %d\n", i, rc);
        CHECK(rc == FERRY_ERR_STORE_CORRUPT);
    }
    /* A NUL byte inside the document (not an entity) */
    const char nul[] = "<ListBucketResult><Contents><Key>a\0b</Key><Size>1</Size></Contents></ListBucketResult>";
    got g = {0};
    ferry__s3_page page;
    CHECK_RC(ferry__s3_parse_list(nul, sizeof nul - 1, &page, collect, &g), FERRY_ERR_STORE_CORRUPT);
}

/* Random damage to a valid page: any result but a crash or a read out of
 * bounds (run under ASan in CI) is acceptable; bounded in count. */
static void test_list_mutations(void)
{
    size_t n = strlen(PAGE);
    char *buf = malloc(n + 64);
    uint32_t x = 12345;
    int ok = 0, corrupt = 0;
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(buf, PAGE, n);
        size_t len = n;
        int edits = 1 + (int)(x % 4);
        for (int k = 0; k < edits; k++) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            size_t pos = x % len;
            switch ((x >> 8) % 4) {
            case 0: buf[pos] = (char)(x >> 16); break;           /* overwrite */
            case 1: len = pos; break;                              /* truncate */
            case 2: buf[pos] = "<>&;/\"'=!?[]"[(x >> 16) % 12]; break;
            case 3: memmove(buf + pos, buf + pos + 1, len - pos - 1); len--; break; /* delete */
            }
            if (!len) break;
        }
        /* the parser must only read buf[0..len): copy into an exact-size block */
        char *exact = malloc(len ? len : 1);
        memcpy(exact, buf, len);
        got g = {0};
        ferry__s3_page page;
        int rc = ferry__s3_parse_list(exact, len, &page, collect, &g);
        if (rc == 0) ok++;
        else if (rc == FERRY_ERR_STORE_CORRUPT) corrupt++;
        else CHECK(rc == 0 || rc == FERRY_ERR_STORE_CORRUPT);
        free(exact);
    }
    free(buf);
    CHECK(ok > 0 && corrupt > 0);
}

static void test_xml_fields(void)
{
    const char *err = "<?xml version=\"1.0\"?><Error><Code>SignatureDoesNotMatch</Code>"
                      "<Message>The request signature &amp; so on</Message><Nested><Code>no</Code></Nested></Error>";
    char out[64];
    CHECK_OK(ferry__xml_child_text(err, strlen(err), "Error", "Code", out, sizeof out));
    CHECK(!strcmp(out, "SignatureDoesNotMatch"));
    CHECK_OK(ferry__xml_child_text(err, strlen(err), "Error", "Message", out, sizeof out));
    CHECK(!strcmp(out, "The request signature & so on"));
    CHECK_RC(ferry__xml_child_text(err, strlen(err), "Error", "Missing", out, sizeof out), FERRY_ERR_NOT_FOUND);
    CHECK_RC(ferry__xml_child_text(err, strlen(err), "Other", "Code", out, sizeof out), FERRY_ERR_NOT_FOUND);
    char tiny[8];
    CHECK_RC(ferry__xml_child_text(err, strlen(err), "Error", "Code", tiny, sizeof tiny), FERRY_ERR_STORE_CORRUPT);
    CHECK_RC(ferry__xml_child_text("<Error><Code>x", 14, "Error", "Code", out, sizeof out), FERRY_ERR_STORE_CORRUPT);
    CHECK_OK(ferry__xml_root(err, strlen(err), out, sizeof out));
    CHECK(!strcmp(out, "Error"));
    CHECK_RC(ferry__xml_root("", 0, out, sizeof out), FERRY_ERR_STORE_CORRUPT);
    const char *init = "<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key>"
                       "<UploadId>VXBsb2FkIElE+/=</UploadId></InitiateMultipartUploadResult>";
    CHECK_OK(ferry__xml_child_text(init, strlen(init), "InitiateMultipartUploadResult", "UploadId", out, sizeof out));
    CHECK(!strcmp(out, "VXBsb2FkIElE+/="));
}

/* ---------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------- */

static void test_uri_encode(void)
{
    ferry_buf b = {0};
    const char *s = "a b/\xc3\xbc~-_.+%&=?#A9";
    CHECK_OK(ferry__uri_encode(&b, s, strlen(s), 1));
    CHECK_OK(ferry__buf_append(&b, "", 1));
    CHECK(!strcmp((char *)b.data, "a%20b/%C3%BC~-_.%2B%25%26%3D%3F%23A9"));
    b.size = 0;
    CHECK_OK(ferry__uri_encode(&b, "x/y", 3, 0));
    CHECK_OK(ferry__buf_append(&b, "", 1));
    CHECK(!strcmp((char *)b.data, "x%2Fy"));
    ferry__buf_release(&b);
}

static void test_etag_clean(void)
{
    char out[FERRY_STORE_ETAG_MAX];
    CHECK(ferry__etag_clean("\"abc\"", 5, out) == 0 && !strcmp(out, "abc"));
    CHECK(ferry__etag_clean(" \"d41d-3\" \r\n", 12, out) == 0 && !strcmp(out, "d41d-3"));
    CHECK(ferry__etag_clean("W/\"x1\"", 6, out) == 0 && !strcmp(out, "W/x1"));
    CHECK(ferry__etag_clean("plain", 5, out) == 0 && !strcmp(out, "plain"));
    CHECK(ferry__etag_clean("\"\"", 2, out) == -1);
    CHECK(ferry__etag_clean("", 0, out) == -1);
    CHECK(ferry__etag_clean("\"a b\"", 5, out) == -1);
    CHECK(ferry__etag_clean("a\"b", 3, out) == -1);
    CHECK(ferry__etag_clean("\xc3\xa9", 2, out) == -1);
    char longtag[200];
    memset(longtag, 'e', sizeof longtag);
    CHECK(ferry__etag_clean(longtag, sizeof longtag, out) == -1);
    CHECK(ferry__etag_clean(longtag, FERRY_STORE_ETAG_MAX - 1, out) == 0);
}

static void test_numbers_dates(void)
{
    uint64_t v;
    CHECK(ferry__parse_u64("18446744073709551615", 20, &v) == 0 && v == UINT64_MAX);
    CHECK(ferry__parse_u64("18446744073709551616", 20, &v) == -1);
    CHECK(ferry__parse_u64("0", 1, &v) == 0 && v == 0);
    CHECK(ferry__parse_u64("", 0, &v) == -1);
    CHECK(ferry__parse_u64("12a", 3, &v) == -1);
    CHECK(ferry__parse_u64("+1", 2, &v) == -1);
    CHECK(ferry__parse_iso8601("2013-05-24T00:00:00.000Z", 24) == 1369353600);
    CHECK(ferry__parse_iso8601("1970-01-01T00:00:00Z", 20) == 0);
    CHECK(ferry__parse_iso8601("2000-03-01T12:34:56Z", 20) == 951914096);
    CHECK(ferry__parse_iso8601("2024-02-29T23:59:59.123456Z", 27) == 1709251199);
    CHECK(ferry__parse_iso8601("2013-05-24 00:00:00Z", 20) == -1);
    CHECK(ferry__parse_iso8601("2013-13-24T00:00:00Z", 20) == -1);
    CHECK(ferry__parse_iso8601("2013-05-24T00:00:00.Z", 21) == -1);
    CHECK(ferry__parse_iso8601("2013-05-24T00:00:00+01:00", 25) == -1);
    CHECK(ferry__parse_iso8601("x", 1) == -1);
}

static void test_utf8(void)
{
    CHECK(ferry__utf8_valid("plain/ascii", 11));
    CHECK(ferry__utf8_valid("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9));
    CHECK(!ferry__utf8_valid("\xc3", 1));
    CHECK(!ferry__utf8_valid("\xc0\x80", 2));         /* overlong NUL */
    CHECK(!ferry__utf8_valid("\xe0\x80\xaf", 3));     /* overlong '/' */
    CHECK(!ferry__utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
    CHECK(!ferry__utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    CHECK(!ferry__utf8_valid("\x80", 1));
    CHECK(!ferry__utf8_valid("\xff", 1));
}

static void test_prefix_rules(void)
{
    CHECK_OK(ferry__prefix_check(""));
    CHECK_OK(ferry__prefix_check("v1/"));
    CHECK_OK(ferry__prefix_check("v1/.."));       /* a partial last segment: may begin "..x" */
    CHECK_OK(ferry__prefix_check("v1/.ferry-t")); /* never used as a path; listings skip those */
    CHECK_RC(ferry__prefix_check("../"), FERRY_ERR_STORE_KEY);
    CHECK_RC(ferry__prefix_check("a//"), FERRY_ERR_STORE_KEY);
    CHECK_RC(ferry__prefix_check("/a"), FERRY_ERR_STORE_KEY);
    CHECK_RC(ferry__prefix_check("a/./b"), FERRY_ERR_STORE_KEY);
    CHECK_RC(ferry__prefix_check("a\nb"), FERRY_ERR_STORE_KEY);
}

static void test_listing_finish(void)
{
    ferry_store st = {.url = "s3://x"};
    ferry_store_listing l = {0};
    size_t cap = 0;
    ferry_store_stat s0 = {0};
    CHECK_OK(ferry__listing_add(&l, &cap, 10, "b", &s0));
    CHECK_OK(ferry__listing_add(&l, &cap, 10, "a", &s0));
    CHECK_OK(ferry__listing_finish(&st, &l));
    CHECK(!strcmp(l.entries[0].key, "a"));
    CHECK_OK(ferry__listing_add(&l, &cap, 10, "a", &s0));
    CHECK_RC(ferry__listing_finish(&st, &l), FERRY_ERR_STORE_CORRUPT);
    CHECK_RC(ferry__listing_add(&l, &cap, 3, "c", &s0), FERRY_ERR_LIMIT);
    ferry__listing_clear(&l);
}

/* ---------------------------------------------------------------------
 * URLs, options, environment (no request is sent by open)
 * ------------------------------------------------------------------- */

static void clear_env(void)
{
    const char *vars[] = {"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                          "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

static void test_s3_urls(void)
{
    clear_env();
    ferry_store *s = NULL;
    CHECK_OK(ferry_store_open("s3://my-bucket/some/prefix/", NULL, &s));
    CHECK(s && ferry_store_kind(s) == FERRY_STORE_S3);
    if (s) {
        CHECK(!strcmp(ferry_store_url(s), "s3://my-bucket/some/prefix"));
        CHECK(!strcmp(s->prefix, "some/prefix/"));
        CHECK(!strcmp(s->base, "https://s3.us-east-1.amazonaws.com/my-bucket"));
        CHECK(!strcmp(s->sigv4_param, "aws:amz:us-east-1:s3"));
        CHECK(s->userpwd == NULL); /* no credentials: anonymous */
    }
    ferry_store_free(s);
    CHECK_OK(ferry_store_open("s3://bkt", NULL, &s));
    CHECK(s && !strcmp(s->prefix, "") && !strcmp(ferry_store_url(s), "s3://bkt"));
    ferry_store_free(s);

    setenv("AWS_DEFAULT_REGION", "ap-south-1", 1);
    setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9/", 1);
    setenv("AWS_ACCESS_KEY_ID", "AKENV", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "SECENV", 1);
    setenv("AWS_SESSION_TOKEN", "TOKENV", 1);
    CHECK_OK(ferry_store_open("s3://bkt/p", NULL, &s));
    if (s) {
        CHECK(!strcmp(s->region, "ap-south-1"));
        CHECK(!strcmp(s->base, "http://127.0.0.1:9/bkt"));
        CHECK(s->userpwd && !strcmp(s->userpwd, "AKENV:SECENV"));
        CHECK(s->token_header && !strcmp(s->token_header, "x-amz-security-token: TOKENV"));
    }
    ferry_store_free(s);
    setenv("AWS_REGION", "eu-north-1", 1); /* wins over AWS_DEFAULT_REGION */
    setenv("AWS_ENDPOINT_URL_S3", "http://s3.local:1", 1);
    ferry_store_options o = {.region = "us-west-2", .access_key = "AKOPT", .secret_key = "SECOPT"};
    CHECK_OK(ferry_store_open("s3://bkt", &o, &s));
    if (s) {
        CHECK(!strcmp(s->region, "us-west-2"));
        CHECK(!strcmp(s->base, "http://s3.local:1/bkt"));
        CHECK(!strcmp(s->userpwd, "AKOPT:SECOPT"));
        CHECK(s->token_header == NULL); /* an env token is not mixed with option keys */
    }
    ferry_store_free(s);
    CHECK_OK(ferry_store_open("s3://bkt", NULL, &s));
    CHECK(s && !strcmp(s->region, "eu-north-1"));
    ferry_store_free(s);
    ferry_store_options anon = {.anonymous = 1};
    CHECK_OK(ferry_store_open("s3://bkt", &anon, &s));
    CHECK(s && s->userpwd == NULL);
    ferry_store_free(s);
    clear_env();

    const char *bad[] = {"s3://", "s3://ab", "s3://b@d", "s3://bkt/../x", "s3://bkt/a//b", "s3://bkt/a\x01",
                         "s3://bkt/.ferry-x/y"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        s = (ferry_store *)1;
        CHECK_RC(ferry_store_open(bad[i], NULL, &s), FERRY_ERR_STORE_URL);
        CHECK(s == NULL);
    }
    ferry_store_options e1 = {.endpoint = "ftp://x"};
    CHECK_RC(ferry_store_open("s3://bkt", &e1, &s), FERRY_ERR_STORE_URL);
    ferry_store_options e2 = {.endpoint = "http://h/?x=1"};
    CHECK_RC(ferry_store_open("s3://bkt", &e2, &s), FERRY_ERR_STORE_URL);
    ferry_store_options e3 = {.region = "us east"};
    CHECK_RC(ferry_store_open("s3://bkt", &e3, &s), FERRY_ERR_STORE_URL);
    ferry_store_options k1 = {.access_key = "AK"};
    CHECK_RC(ferry_store_open("s3://bkt", &k1, &s), FERRY_ERR_STORE_AUTH);
    ferry_store_options k2 = {.access_key = "A:K", .secret_key = "S"};
    CHECK_RC(ferry_store_open("s3://bkt", &k2, &s), FERRY_ERR_STORE_AUTH);
    ferry_store_options p1 = {.list_page_size = 1001};
    CHECK_RC(ferry_store_open("s3://bkt", &p1, &s), FERRY_ERR_STORE_URL);
    ferry_store_options p2 = {.part_size = (5ull << 30) + 1};
    CHECK_RC(ferry_store_open("s3://bkt", &p2, &s), FERRY_ERR_STORE_URL);
    ferry_store_options p3 = {.cas_mode = 9};
    CHECK_RC(ferry_store_open("s3://bkt", &p3, &s), FERRY_ERR_STORE_URL);
}

static void test_http_urls(void)
{
    ferry_store *s = NULL;
    CHECK_OK(ferry_store_open("https://cdn.example.com/models/run1///", NULL, &s));
    CHECK(s && ferry_store_kind(s) == FERRY_STORE_HTTP);
    CHECK(s && !strcmp(s->base, "https://cdn.example.com/models/run1"));
    ferry_store_free(s);
    CHECK_RC(ferry_store_open("http://", NULL, &s), FERRY_ERR_STORE_URL);
    CHECK_RC(ferry_store_open("https://h/x?y=1", NULL, &s), FERRY_ERR_STORE_URL);
    CHECK_RC(ferry_store_open("https://h/x y", NULL, &s), FERRY_ERR_STORE_URL);
    CHECK_RC(ferry_store_open("gopher://h/", NULL, &s), FERRY_ERR_STORE_URL);
}

/* A session token sent to an S3 endpoint over plain http is said once on
 * stderr (review of issue 16: it went silently); https and loopback
 * endpoints are quiet.  In a child process, whose stderr goes to a file:
 * the warning is once per process. */
static void test_token_over_http_warns(void)
{
    char path[200];
    snprintf(path, sizeof path, "%s/ferry-token-warn.%ld", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (long)getpid());
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        clear_env();
        if (!freopen(path, "w", stderr)) _exit(2);
        const char *eps[] = {"https://s3.example.com", "http://127.0.0.1:9", "http://localhost:9", "http://s3.example.com:9000",
                             "http://s3.example.com:9000"};
        for (int i = 0; i < 5; i++) {
            ferry_store_options o = {.endpoint = eps[i], .access_key = "AK", .secret_key = "SK", .session_token = "TOK"};
            ferry_store *st = NULL;
            if (ferry_store_open("s3://bkt", &o, &st)) _exit(3);
            ferry_store_free(st);
            fprintf(stderr, "after %d\n", i);
        }
        ferry_store_options o = {.endpoint = "http://s3.example.com", .access_key = "AK", .secret_key = "SK"};
        ferry_store *st = NULL;
        if (ferry_store_open("s3://other", &o, &st)) _exit(3);
        ferry_store_free(st);
        fflush(stderr);
        _exit(0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    void *d = NULL;
    size_t n = 0;
    CHECK_OK(ferry_file_read(path, 1 << 16, &d, &n));
    const char *t = d ? d : "";
    const char *w = strstr(t, "session token is sent over plain http to http://s3.example.com:9000");
    CHECK(w != NULL);
    CHECK(w && strstr(t, "after 2") < w && strstr(w, "after 3") != NULL); /* at the first http non-loopback open */
    const char *first = strstr(t, "ferry: warning");
    CHECK(first && !strstr(first + 1, "ferry: warning")); /* once */
    ferry_free(d);
    unlink(path);
}

int main(void)
{
    RUN(test_token_over_http_warns);
    RUN(test_list_valid);
    RUN(test_list_hostile);
    RUN(test_list_mutations);
    RUN(test_xml_fields);
    RUN(test_uri_encode);
    RUN(test_etag_clean);
    RUN(test_numbers_dates);
    RUN(test_utf8);
    RUN(test_prefix_rules);
    RUN(test_listing_finish);
    RUN(test_s3_urls);
    RUN(test_http_urls);
    return CHECK_SUMMARY();
}
#endif /* FERRY_NO_NET */
