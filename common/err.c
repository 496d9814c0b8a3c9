/*
 * err.c - error codes and their descriptions, and the end of a failed
 * internal invariant (FR_ASSERT).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/common.h"

const char *fr_strerror(fr_err_t err)
{
    switch (err) {
    case FR_OK: return "success";
    case FR_ERR_INVAL: return "invalid argument";
    case FR_ERR_NOMEM: return "out of memory";
    case FR_ERR_IO: return "I/O error";
    case FR_ERR_PARSE: return "malformed input";
    case FR_ERR_RANGE: return "value out of range";
    case FR_ERR_NOTFOUND: return "not found";
    case FR_ERR_EXISTS: return "already exists";
    case FR_ERR_NONFINITE: return "non-finite value";
    case FR_ERR_UNSUPPORTED: return "not supported";
    case FR_ERR_BACKEND: return "compute backend error";
    case FR_ERR_REDIS: return "Redis error";
    case FR_ERR_KAFKA: return "Kafka error";
    case FR_ERR_TIMEOUT: return "timed out";
    case FR_ERR_STATE: return "invalid state";
    case FR_ERR_AGAIN: return "busy, try again";
    }
    return "unknown error";
}

fr_err_t fr_errorf(fr_err_t err, char *errstr, size_t size, const char *fmt, ...)
{
    if (errstr != NULL && size > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errstr, size, fmt, ap);
        va_end(ap);
    }
    return err;
}

FR_NORETURN void fr_assert_fail(const char *cond, const char *file, int line)
{
    /* straight to stderr: the logger may be what broke */
    fprintf(stderr, "freshet: internal invariant failed at %s:%d: %s\n", file, line, cond);
    fflush(stderr);
    abort();
}
