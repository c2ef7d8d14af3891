#include "util.h"

#include <string.h>

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <time.h>

const char *cli_program = "ferry";

int cli_fail(const char *cmd, int rc, const char *what)
{
    const char *detail = ferry_last_error();
    fprintf(stderr, "%s%s%s: %s: %s (%s)\n", cli_program, *cmd ? " " : "", cmd, what, detail[0] ? detail : ferry_strerror(rc),
            ferry_strerror(rc));
    return 1;
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    const char *sep = *cmd ? " " : "";
    fprintf(stderr, "%s%s%s: ", cli_program, sep, cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (try '%s%s%s --help')\n", cli_program, sep, cmd);
    return 2;
}

bool cli_is_help(const char *arg) { return !strcmp(arg, "--help") || !strcmp(arg, "-h"); }

bool cli_parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_u64(const char *s, uint64_t hi, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9') return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > hi) return false;
    *out = v;
    return true;
}

void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

void hex16(char out[33], const uint8_t h[16])
{
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", h[i]);
}

double cli_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void cli_sleep_s(double s)
{
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

long cli_peak_rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb;
}
