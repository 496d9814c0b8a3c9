/*
 * layout.c - the sparse record layouts: Criteo display-ads lines and
 * libsvm lines, hashed into rows (docs/design.md "Sparse models").
 *
 * A malformed record is refused with a reason and leaves *s unspecified;
 * nothing here reads past len or needs a terminating NUL.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sparse/sparse.h"

#define NUM_MAX 64 /* an integer or value field longer than this is malformed */

static fr_err_t refuse(const char **reason, const char *why)
{
    if (reason != NULL)
        *reason = why;
    return FR_ERR_PARSE;
}

/* The length of line[len] without a trailing "\n" or "\r\n". */
static size_t chomp(const char *line, size_t len)
{
    if (len > 0 && line[len - 1] == '\n')
        len--;
    if (len > 0 && line[len - 1] == '\r')
        len--;
    return len;
}

/* text[len] as a NUL-terminated string in buf[NUM_MAX + 1], or NULL when
 * empty or too long for a number. */
static const char *number_text(const char *text, size_t len, char *buf)
{
    if (len == 0 || len > NUM_MAX)
        return NULL;
    memcpy(buf, text, len);
    buf[len] = '\0';
    errno = 0;
    return buf;
}

/* Parses text[len] as a whole decimal integer; 0 on success. */
static int parse_int(const char *text, size_t len, long long *v)
{
    char buf[NUM_MAX + 1], *end;
    const char *num = number_text(text, len, buf);
    if (num == NULL)
        return -1;
    *v = strtoll(num, &end, 10);
    return errno == 0 && *end == '\0' ? 0 : -1;
}

/* Parses text[len] as a whole finite float; 0 on success. */
static int parse_float(const char *text, size_t len, float *v)
{
    char buf[NUM_MAX + 1], *end;
    const char *num = number_text(text, len, buf);
    if (num == NULL)
        return -1;
    *v = strtof(num, &end);
    if (*end != '\0' || !isfinite(*v) || fabsf(*v) > SPARSE_VALUE_MAX)
        return -1;
    return errno == 0 || fabsf(*v) < 1 ? 0 : -1; /* an underflow is a value near 0 */
}

/* Criteo's integer bucketing, after the 2014 winning solution's
 * floor(ln(v)^2): values up to 2 as they are (negatives included), larger
 * ones 3 + floor(ln(v)^2), the 3 keeping the two ranges apart. */
static long long int_bucket(long long v)
{
    if (v <= 2)
        return v;
    double l = log((double)v);
    return 3 + (long long)(l * l);
}

fr_err_t sparse_parse_criteo(const sparse_spec_t *spec, const char *line, size_t len,
                             sparse_sample_t *s, const char **reason)
{
    if (spec->fields < SPARSE_CRITEO_FIELDS)
        return refuse(reason, "fields");
    len = chomp(line, len);
    const char *p = line, *end = line + len;
    s->n = 0;
    for (int col = 0; col <= SPARSE_CRITEO_FIELDS; col++) {
        const char *tab = memchr(p, '\t', (size_t)(end - p));
        const char *stop = tab != NULL ? tab : end;
        if ((tab == NULL) != (col == SPARSE_CRITEO_FIELDS))
            return refuse(reason, "columns"); /* too few, or too many */
        size_t flen = (size_t)(stop - p);
        if (col == 0) {
            if (flen != 1 || (p[0] != '0' && p[0] != '1'))
                return refuse(reason, "label");
            s->label = (float)(p[0] - '0');
        } else if (flen > 0 && col <= SPARSE_CRITEO_INTS) {
            long long v;
            if (parse_int(p, flen, &v) != 0)
                return refuse(reason, "integer");
            /* the bucket's 8 bytes little-endian: the same row on any host */
            uint64_t bucket = (uint64_t)int_bucket(v);
            unsigned char le[8];
            for (int i = 0; i < 8; i++)
                le[i] = (unsigned char)(bucket >> (8 * i));
            s->row[s->n] = sparse_hash(col - 1, le, sizeof(le), spec->bits);
            s->val[s->n++] = 1;
        } else if (flen > 0) {
            s->row[s->n] = sparse_hash(col - 1, p, flen, spec->bits);
            s->val[s->n++] = 1;
        }
        p = stop + 1;
    }
    return FR_OK;
}

fr_err_t sparse_parse_libsvm(const sparse_spec_t *spec, const char *line, size_t len,
                             sparse_sample_t *s, const char **reason)
{
    len = chomp(line, len);
    const char *p = line, *end = line + len;
    s->n = 0;
    int first = 1;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        if (p == end)
            break;
        const char *tok = p;
        while (p < end && *p != ' ' && *p != '\t')
            p++;
        size_t tlen = (size_t)(p - tok);
        if (first) {
            float y;
            if (parse_float(tok, tlen, &y) != 0 || (y != 0 && y != 1 && y != -1))
                return refuse(reason, "label");
            s->label = y > 0 ? 1.0f : 0.0f;
            first = 0;
            continue;
        }
        const char *colon = memchr(tok, ':', tlen);
        if (colon == NULL || colon == tok)
            return refuse(reason, "index");
        float v;
        if (parse_float(colon + 1, (size_t)(tok + tlen - colon - 1), &v) != 0)
            return refuse(reason, "value");
        if (s->n == spec->fields || s->n == SPARSE_FIELDS_MAX)
            return refuse(reason, "features");
        s->row[s->n] = sparse_hash(0, tok, (size_t)(colon - tok), spec->bits);
        s->val[s->n++] = v;
    }
    if (first)
        return refuse(reason, "label");
    return FR_OK;
}
