/*
 * json.c - a growable text buffer with the JSON pieces serve writes, and
 * the reference-counted buffers responses are answered from.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_int.h"

void sv_buf_fini(sv_buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

static int grow(sv_buf_t *b, size_t more)
{
    if (b->failed)
        return -1;
    if (b->len + more + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (p == NULL) {
        b->failed = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void sv_add(sv_buf_t *b, const char *s, size_t len)
{
    if (grow(b, len) != 0)
        return;
    memcpy(b->p + b->len, s, len);
    b->len += len;
    b->p[b->len] = '\0';
}

void sv_puts(sv_buf_t *b, const char *s)
{
    sv_add(b, s, strlen(s));
}

void sv_printf(sv_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || grow(b, (size_t)n) != 0)
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void sv_json_str(sv_buf_t *b, const char *s)
{
    sv_add(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char esc[2] = {'\\', (char)*p};
            sv_add(b, esc, 2);
        } else if (*p < 0x20 || *p == 0x7f) {
            sv_printf(b, "\\u%04x", *p);
        } else {
            sv_add(b, (const char *)p, 1);
        }
    }
    sv_add(b, "\"", 1);
}

void sv_json_num(sv_buf_t *b, double v)
{
    if (!isfinite(v))
        sv_puts(b, "null");
    else if (v == floor(v) && fabs(v) < 9e15)
        sv_printf(b, "%.0f", v);
    else
        sv_printf(b, "%.9g", v);
}

char *sv_take(sv_buf_t *b, size_t *len)
{
    if (b->failed || grow(b, 0) != 0) {
        sv_buf_fini(b);
        return NULL;
    }
    char *p = b->p;
    *len = b->len;
    memset(b, 0, sizeof(*b));
    return p;
}

sv_blob_t *sv_blob_new(char *data, size_t len)
{
    sv_blob_t *b = malloc(sizeof(*b));
    if (b == NULL) {
        free(data);
        return NULL;
    }
    atomic_init(&b->refs, 1);
    b->data = data;
    b->len = len;
    return b;
}

sv_blob_t *sv_blob_ref(sv_blob_t *b)
{
    if (b != NULL)
        atomic_fetch_add(&b->refs, 1);
    return b;
}

void sv_blob_unref(sv_blob_t *b)
{
    if (b != NULL && atomic_fetch_sub(&b->refs, 1) == 1) {
        free(b->data);
        free(b);
    }
}

sv_view_t *sv_view_ref(sv_view_t *v)
{
    if (v != NULL)
        atomic_fetch_add(&v->refs, 1);
    return v;
}

void sv_view_unref(sv_view_t *v)
{
    if (v != NULL && atomic_fetch_sub(&v->refs, 1) == 1) {
        free(v->st);
        free(v->offsets);
        sv_blob_unref(v->json);
        free(v);
    }
}
