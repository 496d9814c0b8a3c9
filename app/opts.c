/*
 * opts.c - the option helpers every freshet command shares: one getopt_long
 * pass with the answers all commands give alike (--help, a missing value, an
 * unknown option, a leftover operand), strict number parsing, the usage
 * error, and the default Redis URL.
 *
 * Threads: main thread only (getopt_long keeps global state).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"

int app_usage_error(const char *cmd, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "freshet %s: %s\nTry 'freshet %s --help'.\n", cmd, msg, cmd);
    return APP_EXIT_USAGE;
}

int app_parse_long(const char *cmd, const char *opt, const char *s, long long min, long long max,
                   long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
        return app_usage_error(cmd, "%s expects an integer in %lld..%lld, got '%s'", opt, min, max,
                               s);
    *out = v;
    return 0;
}

int app_parse_double(const char *cmd, const char *opt, const char *s, double min, double max,
                     double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < min || v > max)
        return app_usage_error(cmd, "%s expects a number in [%g, %g], got '%s'", opt, min, max, s);
    *out = v;
    return 0;
}

void app_opts_begin(void)
{
    opterr = 0; /* our messages, not getopt's */
    optind = 1;
}

int app_opts_next(const char *cmd, int argc, char **argv, const char *shortopts,
                  const struct option *longopts, int *idx, void (*usage)(FILE *), int *rc)
{
    int c = getopt_long(argc, argv, shortopts, longopts, idx);
    switch (c) {
    case 'h':
        usage(stdout);
        *rc = -1;
        return -1;
    case ':': *rc = app_usage_error(cmd, "%s needs a value", argv[optind - 1]); return -1;
    case '?': *rc = app_usage_error(cmd, "unknown option '%s'", argv[optind - 1]); return -1;
    default: return c;
    }
}

int app_opts_end(const char *cmd, int argc, char **argv, int rc)
{
    if (rc == 0 && optind < argc)
        rc = app_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
    return rc;
}

const char *app_redis_url_default(void)
{
    const char *env = getenv("FRESHET_REDIS_URL");
    return env != NULL && env[0] != '\0' ? env : APP_REDIS_URL_DEFAULT;
}
