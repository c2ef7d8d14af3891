/* Small helpers shared by the CLI's commands. */
#ifndef FERRY_CLI_UTIL_H
#define FERRY_CLI_UTIL_H
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "ferry.h"

/* The program the messages below name: "ferry"; ferry-demo, which links
 * these helpers, names itself.  An empty CMD leaves the command out. */
extern const char *cli_program;
/* Prints "ferry CMD: what: <ferry_last_error or strerror>" and returns 1. */
int cli_fail(const char *cmd, int rc, const char *what);
/* Prints "ferry CMD: message" (printf-style) and returns 2 (usage errors). */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool cli_is_help(const char *arg);
/* Parses a non-negative integer option value; false if malformed. */
bool cli_parse_int(const char *s, long lo, long hi, long *out);
/* Parses decimal digits only (no sign, no space) as a value <= hi. */
bool cli_parse_u64(const char *s, uint64_t hi, uint64_t *out);
/* Writes s as a JSON string literal (quoted, escaped). */
void json_str(FILE *f, const char *s);
void hex16(char out[33], const uint8_t h[16]);
double cli_now(void);
/* Sleeps s seconds (a signal may cut it short). */
void cli_sleep_s(double s);
/* Peak resident memory of this process image in KiB (VmHWM), or -1. */
long cli_peak_rss_kib(void);
#endif
