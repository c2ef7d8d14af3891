/* The error list (include/ferry_errors.h): every code has its own number,
 * the list is in number order, and ferry_strerror() returns each code's
 * message from the list — non-empty — and "unknown error" for numbers the
 * list does not hold. */
#include "check.h"

#include "ferry_errors.h"

typedef struct { const char *name; int num; const char *msg; } entry;

#define ENTRY(name, num, msg) { #name, num, msg },
static const entry g_list[] = { FERRY_ERRORS(ENTRY) };
#undef ENTRY
#define N_CODES (sizeof g_list / sizeof g_list[0])

/* The enum and the list agree: each name's value is its listed number. */
#define SAME_VALUE(name, num, msg) CHECK((int)(name) == (num));

static void t_distinct_numbers(void)
{
    CHECK(N_CODES >= 88); /* codes are never removed: 88 when the list was made */
    for (size_t i = 0; i < N_CODES; i++) {
        CHECK(g_list[i].num > 0); /* 0 is FERRY_OK, outside the list */
        for (size_t j = i + 1; j < N_CODES; j++) {
            if (g_list[i].num == g_list[j].num) {
                fprintf(stderr, "%s and %s share %d\n", g_list[i].name, g_list[j].name, g_list[i].num);
                CHECK(0);
            }
            if (!strcmp(g_list[i].name, g_list[j].name)) {
                fprintf(stderr, "%s listed twice\n", g_list[i].name);
                CHECK(0);
            }
        }
    }
}

static void t_number_order(void)
{
    for (size_t i = 1; i < N_CODES; i++)
        if (g_list[i].num <= g_list[i - 1].num) {
            fprintf(stderr, "%s (%d) after %s (%d)\n", g_list[i].name, g_list[i].num,
                    g_list[i - 1].name, g_list[i - 1].num);
            CHECK(0);
        }
}

static void t_enum_values(void) { FERRY_ERRORS(SAME_VALUE) }

static void t_names(void)
{
    for (size_t i = 0; i < N_CODES; i++)
        CHECK(!strncmp(g_list[i].name, "FERRY_ERR_", 10) && g_list[i].name[10]);
}

static void t_strerror_messages(void)
{
    for (size_t i = 0; i < N_CODES; i++) {
        const char *m = ferry_strerror(g_list[i].num);
        CHECK(m != NULL && g_list[i].msg[0] != 0);
        if (m && strcmp(m, g_list[i].msg)) {
            fprintf(stderr, "ferry_strerror(%d) = \"%s\", list says \"%s\"\n", g_list[i].num, m, g_list[i].msg);
            CHECK(0);
        }
        CHECK(m && strcmp(m, "unknown error") != 0);
    }
    CHECK(!strcmp(ferry_strerror(FERRY_OK), "ok"));
}

static int listed(int num)
{
    for (size_t i = 0; i < N_CODES; i++)
        if (g_list[i].num == num) return 1;
    return 0;
}

/* Numbers between and beyond the codes, and negative ones.  The ones
 * between are the number after each run of codes (a gap inside an area, or
 * an area's end), found from the list: a code added there moves the probe
 * instead of turning it into a listed code. */
static void t_unknown_codes(void)
{
    int gaps = 0;
    for (size_t i = 0; i < N_CODES; i++) {
        int n = g_list[i].num + 1;
        if (listed(n)) continue;
        gaps++;
        if (strcmp(ferry_strerror(n), "unknown error")) {
            fprintf(stderr, "ferry_strerror(%d) = \"%s\", not in the list\n", n, ferry_strerror(n));
            CHECK(0);
        }
    }
    CHECK(gaps >= 9); /* at least one per area */
    int beyond[] = { -1, -60, 1000, 1 << 30 };
    for (size_t k = 0; k < sizeof beyond / sizeof beyond[0]; k++) {
        CHECK(!listed(beyond[k]));
        CHECK(!strcmp(ferry_strerror(beyond[k]), "unknown error"));
    }
}

/* A few codes by name, with the messages callers and scripts have seen since
 * they were added: the list must keep them word for word. */
static void t_stable_examples(void)
{
    CHECK(FERRY_ERR_NOMEM == 1 && FERRY_ERR_LIMIT == 6);
    CHECK(FERRY_ERR_ST_INDEX == 20 && FERRY_ERR_SHAPE_MISMATCH == 47);
    CHECK(FERRY_ERR_STORE_URL == 60 && FERRY_ERR_STORE_CANCELED == 71);
    CHECK(FERRY_ERR_SYNC_CONFLICT == 80 && FERRY_ERR_SYNC_RUN == 89);
    CHECK(FERRY_ERR_DOCK_MAGIC == 100 && FERRY_ERR_DOCK_REPLAY == 114);
    CHECK(FERRY_ERR_LOCO_MAGIC == 120 && FERRY_ERR_LOCO_MODE == 134);
    CHECK(FERRY_ERR_SIG_MISSING == 140 && FERRY_ERR_SIG_KEY == 145);
    CHECK(FERRY_ERR_SHARD_PARTS == 160 && FERRY_ERR_SHARD_KIND == 164);
    CHECK(!strcmp(ferry_strerror(FERRY_ERR_STORE_NOT_FOUND), "store: no such object"));
    CHECK(!strcmp(ferry_strerror(FERRY_ERR_BASE_MISMATCH), "patch: base model mismatch"));
    CHECK(!strcmp(ferry_strerror(FERRY_ERR_SHARD_KIND),
                  "shard: sharded call on a single-rank run (or the reverse)"));
}

int main(void)
{
    RUN(t_distinct_numbers);
    RUN(t_number_order);
    RUN(t_enum_values);
    RUN(t_names);
    RUN(t_strerror_messages);
    RUN(t_unknown_codes);
    RUN(t_stable_examples);
    return CHECK_SUMMARY();
}
