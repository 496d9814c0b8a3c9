/*
 * log.c - leveled logging to stderr, one write(2) per line so that lines
 * from several threads never interleave. Warnings and errors are rate
 * limited per call site (their format string): at most LOG_BURST lines a
 * site in LOG_WINDOW_NS; the next line after a window that dropped some
 * says how many, so a fault that repeats fast (a failing accept(), a
 * store down) costs a few lines a second, not a disk.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"

static atomic_int log_level = -1; /* -1: not yet read from FRESHET_LOG */

#define LOG_BURST     10
#define LOG_WINDOW_NS 1000000000ull
#define LOG_SITES     128 /* call sites tracked at once (a hash of the format) */

static pthread_mutex_t sites_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const char *fmt;
    uint64_t window_ns; /* when its window began */
    unsigned lines;     /* written in the window */
    unsigned dropped;   /* dropped since the last line written */
} sites[LOG_SITES];

/* Whether a line of fmt may be written now; *dropped receives the lines
 * of fmt dropped since its last one (to say so). A site's slot is one of
 * LOG_PROBE from its hash: its own, else a free one, else the one idle the
 * longest (whose count is then lost, never given to another site). */
#define LOG_PROBE 4
static int site_allows(const char *fmt, unsigned *dropped)
{
    size_t h = (size_t)(((uintptr_t)fmt >> 3) * 0x9E3779B97F4A7C15ull >> 57);
    int ok;
    pthread_mutex_lock(&sites_lock);
    uint64_t now = fr_clock_mono_ns(); /* under the lock: windows only move forward */
    size_t i = h % LOG_SITES, pick = LOG_SITES;
    for (size_t k = 0; k < LOG_PROBE && pick == LOG_SITES; k++)
        if (sites[(h + k) % LOG_SITES].fmt == fmt)
            pick = (h + k) % LOG_SITES;
    for (size_t k = 0; k < LOG_PROBE && pick == LOG_SITES; k++)
        if (sites[(h + k) % LOG_SITES].fmt == NULL)
            pick = (h + k) % LOG_SITES;
    if (pick == LOG_SITES) {
        pick = i;
        for (size_t k = 1; k < LOG_PROBE; k++)
            if (sites[(h + k) % LOG_SITES].window_ns < sites[pick].window_ns)
                pick = (h + k) % LOG_SITES;
    }
    if (sites[pick].fmt != fmt) {
        sites[pick].fmt = fmt;
        sites[pick].dropped = 0;
        sites[pick].window_ns = now;
        sites[pick].lines = 0;
    } else if (now - sites[pick].window_ns >= LOG_WINDOW_NS) {
        sites[pick].window_ns = now;
        sites[pick].lines = 0;
    }
    ok = sites[pick].lines < LOG_BURST;
    if (ok) {
        sites[pick].lines++;
        *dropped = sites[pick].dropped;
        sites[pick].dropped = 0;
    } else {
        sites[pick].dropped++;
    }
    pthread_mutex_unlock(&sites_lock);
    return ok;
}

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
    unsigned dropped = 0;
    if (level <= FR_LOG_WARN && !site_allows(fmt, &dropped))
        return;

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
    if (dropped > 0 && len < sizeof(line) - 2)
        len += (size_t)snprintf(line + len, sizeof(line) - 1 - len,
                                " (%u more like this dropped: at most %d a second)", dropped,
                                LOG_BURST);
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2; /* truncated: keep the newline */
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w; /* nothing sensible to do when stderr is gone */
}
