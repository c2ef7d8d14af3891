/* Issue 23 item 15: an unsigned manifest-2 made of many tiny JSON values
 * (anyone who can write the store can put one there) cost about 20 times
 * its size before it was refused, because it was parsed whole first (a
 * 200 MB one: 4.1 GB and 47 s).  Here 24 MB manifests put their bulk in
 * each place a reader walks (a member of the top level, a part's members,
 * a part's tiles, the object list, the part list), and are read by both
 * readers (lib/shard's parser, which islands and mirrors use, and lib/sync's
 * links reader, which GC and the run log use) in a child process whose
 * address space allows the text plus 96 MiB (a DOM would need 480 MB):
 * each must be refused for what it is, by name, not run out of memory.
 * (Under ASan, which reserves terabytes of address space, the limit is not
 * set; the refusals are still checked.) */
#ifdef FERRY_NO_NET
#include "helpers.h"
NOT_BUILT_MAIN("sync layer not built (NO_NET=1)")
#else
#include <stdint.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "helpers.h" /* UNDER_ASAN */
#include "shard/shard_impl.h"
#include "sync/json_split.h"

#define BULK ((size_t)24 << 20)

static const char k_head[] =
    "{\"format\":\"ferry-manifest-2\",\"run\":\"r\",\"version\":1,\"id\":\"4965074c2fb01950\",\"kind\":\"anchor\","
    "\"prev\":null,\"anchor\":{\"version\":1,\"id\":\"4965074c2fb01950\"},\"world\":1,\"tile_words\":65536,"
    "\"model_hash\":\"9a17421a3321007976d49c3ee0d7e943\",\"model_bytes\":1,\"created_unix\":1,\"anchor_every\":10,"
    "\"publisher\":\"x\"";

/* head + pre + BULK bytes of "0," (the last comma dropped) + post. */
static char *craft(const char *pre, const char *post, size_t *n)
{
    size_t a = strlen(k_head), b = strlen(pre), c = strlen(post);
    char *t = malloc(a + b + BULK + c + 1);
    if (!t) return NULL;
    memcpy(t, k_head, a);
    memcpy(t + a, pre, b);
    for (size_t i = 0; i < BULK; i += 2) memcpy(t + a + b + i, "0,", 2);
    size_t m = a + b + BULK - 1; /* over the last comma */
    memcpy(t + m, post, c + 1);
    *n = m + c;
    return t;
}

/* Reads t with both readers in a child under the address-space limit:
 * each must fail with SYNC_MANIFEST and a message containing its want, or
 * (want NULL) read it: the links reader does not look into tiles. */
static int read_bounded(const char *t, size_t n, const char *want, const char *want_links)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
#ifndef UNDER_ASAN
        long pages = 0, page = sysconf(_SC_PAGESIZE);
        FILE *f = fopen("/proc/self/statm", "r");
        if (!f || fscanf(f, "%ld", &pages) != 1) _exit(11);
        fclose(f);
        rlim_t lim = (rlim_t)(pages * page) + (rlim_t)n + (96u << 20);
        struct rlimit rl = {lim, lim};
        if (setrlimit(RLIMIT_AS, &rl)) _exit(12);
#endif
        sh_doc d;
        int rc = ferry__shard_manifest_parse("r", "r/v/m.json", t, n, &d);
        if (rc != FERRY_ERR_SYNC_MANIFEST || !strstr(ferry_last_error(), want)) {
            fprintf(stderr, "  shard parser: %d %s\n", rc, ferry_last_error());
            _exit(13);
        }
        fs_manifest m;
        rc = ferry__sync_manifest_links_parse("r", "r/v/m.json", t, n, &m);
        if (want_links ? rc != FERRY_ERR_SYNC_MANIFEST || !strstr(ferry_last_error(), want_links) : rc != 0) {
            fprintf(stderr, "  links reader: %d %s\n", rc, ferry_last_error());
            _exit(14);
        }
        _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

static void check_case(const char *pre, const char *post, const char *want, const char *want_links)
{
    size_t n = 0;
    char *t = craft(pre, post, &n);
    CHECK(t != NULL);
    if (!t) return;
    int rc = read_bounded(t, n, want, want_links);
    if (rc) fprintf(stderr, "  case %.40s...: child status %d\n", pre, rc);
    CHECK(rc == 0);
    free(t);
}

/* 24 MB of a member nobody reads. */
static void t_junk_member(void) { check_case(",\"objects\":[],\"parts\":[],\"junk\":[", "]}", "take more than", "take more than"); }

/* 24 MB inside one part (its shape). */
static void t_junk_in_part(void) { check_case(",\"objects\":[],\"parts\":[{\"name\":\"w\",\"shape\":[", "]}]}", "a part", "a part"); }

/* 24 MB of tiles, not one per grid cell (one part of a 1x1 grid). */
static void t_junk_tiles(void)
{
    check_case(",\"objects\":[],\"parts\":[{\"name\":\"w\",\"dtype\":\"BF16\",\"shape\":[4,4],\"rows\":[0,4],\"rank\":0,"
               "\"row_cuts\":[0,4],\"col_cuts\":[0,4],\"tiles\":[",
               "]}]}", "one entry per grid cell", NULL);
}

/* 24 MB as the object list and as the part list: the first element is
 * not what the list holds. */
static void t_junk_lists(void)
{
    check_case(",\"parts\":[],\"objects\":[", "]}", "'objects'", "'objects'");
    check_case(",\"objects\":[],\"parts\":[", "]}", "a part", "a part");
}

/* The split itself: members found wherever they are, duplicates refused,
 * malformed text refused. */
static void t_split(void)
{
    static const char *const big[] = {"tiles", NULL};
    fs_span sp[1];
    json_t *rest = NULL;
    char why[300];
    const char *ok = " {\"tiles\" : [ {\"a\":1} , [2] ,\"x\"], \"n\\u0061me\":\"w\",\"c\":[1,2.5e3,-0,true,null,{}]} ";
    CHECK(!ferry__sync_json_split(ok, strlen(ok), big, sp, 1024, &rest, why, sizeof why));
    CHECK(rest && !strcmp(json_string_value(json_object_get(rest, "name")), "w") && json_array_size(json_object_get(rest, "c")) == 6);
    json_decref(rest);
    size_t pos = 0, k = 0;
    fs_span el;
    const char *a = ok + sp[0].off;
    int r;
    while ((r = ferry__sync_json_next(a, sp[0].len, &pos, &el)) == 1) k++;
    CHECK(r == 0 && k == 3);
    const char *bad[] = {
        "{\"tiles\":[],\"tiles\":[]}", "{\"a\":1,\"a\":2}", "{\"a\":1,}", "{\"a\":01}", "{\"a\":\"\\x\"}", "{\"a\":[1,]}",
        "{\"a\":1} x", "{\"tiles\":{}}", "{\"a\":tru}", "[1]", "{\"a\":\"\t\"}", "{\"a\":1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rest = NULL;
        int rc = ferry__sync_json_split(bad[i], strlen(bad[i]), big, sp, 1024, &rest, why, sizeof why);
        if (!rc) fprintf(stderr, "  accepted: %s\n", bad[i]);
        CHECK(rc == -1 && !rest);
    }
    const char *badarr[] = {"[1,]", "[1 2]", "[", "[1", "[,1]"};
    for (size_t i = 0; i < sizeof badarr / sizeof *badarr; i++) {
        pos = 0;
        while ((r = ferry__sync_json_next(badarr[i], strlen(badarr[i]), &pos, &el)) == 1) {}
        CHECK(r == -1);
    }
}

int main(void)
{
    RUN(t_split);
    RUN(t_junk_member);
    RUN(t_junk_in_part);
    RUN(t_junk_tiles);
    RUN(t_junk_lists);
    return CHECK_SUMMARY();
}
#endif
