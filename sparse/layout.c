/*
 * layout.c - the sparse record layouts: Criteo display-ads lines, libsvm
 * lines and the binary record, hashed into rows (docs/design.md "Sparse
 * models"). Every layout turns a value into a 64-bit id (a categorical's
 * text by xxHash64, an integer's bucket as it is) and the id into a row
 * (sparse_id_row), so a value has one row whichever layout carries it.
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

/* A Criteo line has a feature a column at most: its ids fit a record. */
_Static_assert(SPARSE_CRITEO_FIELDS <= SPARSE_FIELDS_MAX, "a Criteo line's features fit");

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

fr_err_t sparse_criteo_ids(const char *line, size_t len, sparse_ids_t *r, const char **reason)
{
    len = chomp(line, len);
    const char *p = line, *end = line + len;
    r->n = 0;
    for (int col = 0; col <= SPARSE_CRITEO_FIELDS; col++) {
        const char *tab = memchr(p, '\t', (size_t)(end - p));
        const char *stop = tab != NULL ? tab : end;
        if ((tab == NULL) != (col == SPARSE_CRITEO_FIELDS))
            return refuse(reason, "columns"); /* too few, or too many */
        size_t flen = (size_t)(stop - p);
        if (col == 0) {
            if (flen != 1 || (p[0] != '0' && p[0] != '1'))
                return refuse(reason, "label");
            r->label = (float)(p[0] - '0');
        } else if (flen > 0 && col <= SPARSE_CRITEO_INTS) {
            long long v;
            if (parse_int(p, flen, &v) != 0)
                return refuse(reason, "integer");
            r->field[r->n] = (uint8_t)(col - 1);
            r->id[r->n++] = (uint64_t)int_bucket(v);
        } else if (flen > 0) {
            r->field[r->n] = (uint8_t)(col - 1);
            r->id[r->n++] = sparse_value_id(p, flen);
        }
        p = stop + 1;
    }
    return FR_OK;
}

/* Hashes ids r into the rows of sample s. */
static void ids_rows(const sparse_spec_t *spec, const sparse_ids_t *r, sparse_sample_t *s)
{
    /* the callers bounded n; bits comes from a parsed spec (the hash
     * shifts by 64 - bits) */
    FR_ASSERT(r->n >= 0 && r->n <= SPARSE_FIELDS_MAX);
    FR_ASSERT(spec->bits >= SPARSE_BITS_MIN && spec->bits <= SPARSE_BITS_MAX);
    s->label = r->label;
    s->n = r->n;
    for (int k = 0; k < r->n; k++) {
        s->row[k] = sparse_id_row(r->field[k], r->id[k], spec->bits);
        s->val[k] = 1;
        s->field[k] = r->field[k];
    }
}

fr_err_t sparse_parse_criteo(const sparse_spec_t *spec, const char *line, size_t len,
                             sparse_sample_t *s, const char **reason)
{
    if (spec->fields < SPARSE_CRITEO_FIELDS)
        return refuse(reason, "fields");
    sparse_ids_t r;
    fr_err_t err = sparse_criteo_ids(line, len, &r, reason);
    if (err == FR_OK)
        ids_rows(spec, &r, s);
    return err;
}

size_t sparse_encode_binary(const sparse_ids_t *r, uint8_t *out, size_t cap)
{
    if (r->n < 0 || r->n > SPARSE_FIELDS_MAX || cap < 2 + 9 * (size_t)r->n ||
        (r->label != 0 && r->label != 1))
        return 0;
    out[0] = (uint8_t)r->label;
    out[1] = (uint8_t)r->n;
    uint8_t *q = out + 2;
    for (int k = 0; k < r->n; k++) {
        *q++ = r->field[k];
        for (int i = 0; i < 8; i++)
            *q++ = (uint8_t)(r->id[k] >> (8 * i));
    }
    FR_ASSERT((size_t)(q - out) == 2 + 9 * (size_t)r->n); /* within cap, checked above */
    return (size_t)(q - out);
}

fr_err_t sparse_parse_binary(const sparse_spec_t *spec, const uint8_t *rec, size_t len,
                             sparse_sample_t *s, const char **reason)
{
    if (len < 2 || len != 2 + 9 * (size_t)rec[1])
        return refuse(reason, "length");
    if (rec[0] > (spec->classes > 0 ? spec->classes - 1 : 1)) /* a class, or a click */
        return refuse(reason, "label");
    if (rec[1] > spec->fields || rec[1] > SPARSE_FIELDS_MAX)
        return refuse(reason, "features");
    sparse_ids_t r = {.label = rec[0], .n = rec[1]};
    const uint8_t *q = rec + 2;
    for (int k = 0; k < r.n; k++, q += 9) {
        if (q[0] >= SPARSE_FIELDS_MAX)
            return refuse(reason, "field");
        r.field[k] = q[0];
        r.id[k] = 0;
        for (int i = 7; i >= 0; i--)
            r.id[k] = (r.id[k] << 8) | q[1 + i];
    }
    ids_rows(spec, &r, s);
    return FR_OK;
}

fr_err_t sparse_parse_libsvm(const sparse_spec_t *spec, const char *line, size_t len,
                             sparse_sample_t *s, const char **reason)
{
    FR_ASSERT(spec->bits >= SPARSE_BITS_MIN && spec->bits <= SPARSE_BITS_MAX);
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
            if (parse_float(tok, tlen, &y) != 0)
                return refuse(reason, "label");
            if (spec->classes > 0) { /* a class: an integer 0 .. C - 1 */
                if (!(y >= 0 && y < (float)spec->classes) || y != floorf(y))
                    return refuse(reason, "label");
                s->label = y;
            } else {
                if (y != 0 && y != 1 && y != -1)
                    return refuse(reason, "label");
                s->label = y > 0 ? 1.0f : 0.0f;
            }
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
        s->row[s->n] = sparse_id_row(0, sparse_value_id(tok, (size_t)(colon - tok)), spec->bits);
        s->field[s->n] = 0;
        s->val[s->n++] = v;
    }
    if (first)
        return refuse(reason, "label");
    return FR_OK;
}
