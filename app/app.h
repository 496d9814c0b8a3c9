/*
 * app.h - private declarations of the freshet command: one function per
 * subcommand, and the option helpers they share.
 *
 * Exit statuses: 0 success, 1 a failure while working (backend, I/O after
 * start), 2 bad arguments, bad configuration or unreadable input files.
 */
#ifndef FRESHET_APP_H
#define FRESHET_APP_H

#include <stddef.h>

#include "common/common.h"
#include "ingest/ingest.h"

#define APP_EXIT_FAILURE 1
#define APP_EXIT_USAGE   2

int app_cmd_fit(int argc, char **argv);
int app_cmd_eval(int argc, char **argv);

/* Prints "freshet CMD: message" and a hint to --help on stderr; returns
 * APP_EXIT_USAGE. */
int app_usage_error(const char *cmd, const char *fmt, ...) FR_PRINTF(2, 3);

/* Strict number parsing of an option value: the whole string, in range.
 * On error prints the usage error and returns APP_EXIT_USAGE, else 0. */
int app_parse_long(const char *cmd, const char *opt, const char *s, long long min, long long max,
                   long long *out);
int app_parse_double(const char *cmd, const char *opt, const char *s, double min, double max,
                     double *out);

/* Loads a data file for the model's schema and reports what was skipped
 * (one warning line per reject reason). Returns 0, or prints the error and
 * returns APP_EXIT_USAGE. */
int app_load_dataset(const char *cmd, ingest_dataset_t *ds, const ingest_schema_t *schema,
                     ingest_format_t format, const char *data, const char *labels);

#endif
