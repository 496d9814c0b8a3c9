/*
 * buf.c - a growable buffer: the metrics exposition, serve's JSON, the
 * safetensors writer's header and the applier's stream entries are all
 * written into one. An allocation failure is kept in the buffer, so a
 * writer appends without checking and checks once, when it takes the text.
 *
 * Threads: a buffer has one writer; nothing here is shared.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

#define FR_BUF_FIRST_CAP 256

void fr_buf_fini(fr_buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

void fr_buf_reset(fr_buf_t *b)
{
    b->len = 0;
    b->failed = 0;
    if (b->p != NULL)
        b->p[0] = '\0';
}

int fr_buf_reserve(fr_buf_t *b, size_t n)
{
    if (b->failed)
        return -1;
    if (b->len + n + 1 <= b->cap)
        return 0;
    /* the first allocation holds FR_BUF_FIRST_CAP bytes at least */
    size_t need = b->len + n + 1;
    if (FR_GROW(b->p, b->cap, need > FR_BUF_FIRST_CAP ? need : FR_BUF_FIRST_CAP) != FR_OK) {
        b->failed = 1;
        return -1;
    }
    return 0;
}

void fr_buf_add(fr_buf_t *b, const char *s, size_t len)
{
    if (fr_buf_reserve(b, len) != 0)
        return;
    memcpy(b->p + b->len, s, len);
    b->len += len;
    b->p[b->len] = '\0';
}

void fr_buf_puts(fr_buf_t *b, const char *s)
{
    fr_buf_add(b, s, strlen(s));
}

void fr_buf_printf(fr_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || fr_buf_reserve(b, (size_t)n) != 0)
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

char *fr_buf_take(fr_buf_t *b, size_t *len)
{
    if (b->failed || fr_buf_reserve(b, 0) != 0) {
        fr_buf_fini(b);
        return NULL;
    }
    b->p[b->len] = '\0'; /* an empty buffer's first allocation */
    char *p = b->p;
    if (len != NULL)
        *len = b->len;
    memset(b, 0, sizeof(*b));
    return p;
}
