/*
 * log.c - leveled logging to stderr, one write(2) per line so that lines
 * from several threads never interleave.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"

static atomic_int log_level = -1; /* -1: not yet read from FRESHET_LOG */

static const char *const level_names[] = {"error", "warn", "info", "debug"};

fr_err_t fr_log_level_parse(const char *name, fr_log_level_t *level)
{
    for (int i = 0; i <= FR_LOG_DEBUG; i++) {
        if (strcmp(name, level_names[i]) == 0) {
            *level = (fr_log_level_t)i;
            return FR_OK;
        }
    }
    return FR_ERR_INVAL;
}

fr_log_level_t fr_log_level(void)
{
    int level = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (level >= 0)
        return (fr_log_level_t)level;
    fr_log_level_t parsed = FR_LOG_INFO;
    const char *env = getenv("FRESHET_LOG");
    if (env != NULL && fr_log_level_parse(env, &parsed) != FR_OK)
        parsed = FR_LOG_INFO;
    atomic_store(&log_level, (int)parsed);
    return parsed;
}

void fr_log_set_level(fr_log_level_t level)
{
    atomic_store(&log_level, (int)level);
}

void fr_log_write(fr_log_level_t level, const char *fmt, ...)
{
    static const char *const tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    char line[2048];
    struct timespec ts;
    struct tm tm;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int off = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ",
                       tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                       tm.tm_sec, ts.tv_nsec / 1000000, tags[level <= FR_LOG_DEBUG ? level : 0]);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line + off, sizeof(line) - (size_t)off - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)off + (n < 0 ? 0 : (size_t)n);
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2; /* truncated: keep the newline */
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w; /* nothing sensible to do when stderr is gone */
}
