/*
 * shards.c - where a model's flat vector is cut into shards
 * (docs/design.md "Shards"), and the text forms of the cut and of a shard
 * list ("0-3"). Redis-free: part of the store's core.
 *
 * A cut falls where a row of a weight matrix starts, or where a bias
 * vector starts or ends, so that no row of W_l is split between two
 * shards: a shard then holds whole output units' fan-in, which is what a
 * future per-shard compute (or a sparse table's rows) needs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/positions/positions.h"

/* The cut points strictly between 0 and nparams, increasing, into a
 * malloc'ed array; their number into *n. NULL when the layers do not hold
 * nparams floats (or out of memory: *n is then SIZE_MAX). */
static size_t *cut_points(const int *dims, int ndims, size_t nparams, size_t *n)
{
    size_t cap = 0, off = 0;
    for (int l = 0; l + 1 < ndims; l++)
        cap += (size_t)dims[l + 1] + 2;
    size_t *cand = malloc((cap + 1) * sizeof(*cand));
    *n = 0;
    if (cand == NULL) {
        *n = SIZE_MAX;
        return NULL;
    }
    for (int l = 0; l + 1 < ndims; l++) {
        size_t in = (size_t)dims[l], out = (size_t)dims[l + 1];
        for (size_t r = 0; r < out; r++, off += in) /* the rows of W_l */
            cand[(*n)++] = off;
        cand[(*n)++] = off; /* b_l starts */
        off += out;
    }
    if (off != nparams) {
        free(cand);
        *n = 0;
        return NULL;
    }
    /* drop 0 and duplicates (a row start equals the previous bias end) */
    size_t k = 0;
    for (size_t i = 0; i < *n; i++) {
        if (cand[i] > 0 && cand[i] < nparams && (k == 0 || cand[k - 1] != cand[i]))
            cand[k++] = cand[i];
    }
    *n = k;
    return cand;
}

fr_err_t psstore_shard_bounds(const char *layers, size_t nparams, int S, size_t *bounds,
                              char *errstr, size_t size)
{
    if (S < 1 || S > PSSTORE_SHARDS_MAX)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "shards: %d is outside 1..%d", S,
                         PSSTORE_SHARDS_MAX);
    int dims[FR_LAYERS_MAX], ndims = 0;
    if (fr_layers_parse(layers, dims, &ndims, errstr, size) != FR_OK)
        return FR_ERR_INVAL;
    size_t ncand = 0;
    size_t *cand = cut_points(dims, ndims, nparams, &ncand);
    if (cand == NULL && ncand == SIZE_MAX)
        return fr_errorf(FR_ERR_NOMEM, errstr, size, "shards: out of memory");
    if (cand == NULL)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "shards: layers %s do not hold %zu parameters",
                         layers, nparams);
    if (ncand < (size_t)(S - 1)) {
        free(cand);
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "shards: layers %s have %zu cut points between rows, fewer than the "
                         "%d that %d shards need",
                         layers, ncand, S - 1, S);
    }
    bounds[0] = 0;
    bounds[S] = nparams;
    size_t next = 0; /* the first candidate the next cut may take */
    for (int k = 1; k < S; k++) {
        double target = (double)nparams * k / S;
        size_t last = ncand - (size_t)(S - k); /* leave one candidate per later cut */
        size_t best = next;
        for (size_t i = next; i <= last; i++) {
            double d = (double)cand[i] - target, db = (double)cand[best] - target;
            if ((d < 0 ? -d : d) < (db < 0 ? -db : db))
                best = i;
            if (cand[i] > target)
                break; /* increasing: later ones are farther */
        }
        bounds[k] = cand[best];
        next = best + 1;
    }
    free(cand);
    return FR_OK;
}

/* Parses a decimal number of s[*i..len) into *v, advancing *i; -1 when
 * there is none or it overflows. */
static int parse_num(const char *s, size_t len, size_t *i, unsigned long long *v)
{
    size_t start = *i;
    *v = 0;
    while (*i < len && s[*i] >= '0' && s[*i] <= '9') {
        if (*v > (~0ull - 9) / 10)
            return -1;
        *v = *v * 10 + (unsigned long long)(s[*i] - '0');
        (*i)++;
    }
    return *i > start ? 0 : -1;
}

fr_err_t psstore_shard_bounds_parse(const char *text, size_t len, size_t *bounds, int *S)
{
    size_t i = 0;
    int n = 0;
    while (i <= len) {
        unsigned long long v;
        if (n > PSSTORE_SHARDS_MAX || parse_num(text, len, &i, &v) != 0)
            return FR_ERR_PARSE;
        if ((n == 0 && v != 0) || (n > 0 && v <= bounds[n - 1]))
            return FR_ERR_PARSE;
        bounds[n++] = (size_t)v;
        if (i == len)
            break;
        if (text[i++] != ',')
            return FR_ERR_PARSE;
    }
    if (n < 2)
        return FR_ERR_PARSE;
    *S = n - 1;
    return FR_OK;
}

int psstore_shard_bounds_format(char *buf, size_t size, const size_t *bounds, int S)
{
    size_t len = 0;
    if (size > 0)
        buf[0] = '\0';
    for (int k = 0; k <= S; k++) {
        int w = snprintf(len < size ? buf + len : NULL, len < size ? size - len : 0, "%s%zu",
                         k ? "," : "", bounds[k]);
        len += (size_t)w;
    }
    return (int)len;
}

fr_err_t psstore_shard_list_parse(const char *text, int S, uint64_t *mask, char *errstr,
                                  size_t size)
{
    int limit = S > 0 ? S : PSSTORE_SHARDS_MAX;
    size_t len = text != NULL ? strlen(text) : 0, i = 0;
    *mask = 0;
    while (len > 0 && i <= len) {
        unsigned long long a, b;
        if (parse_num(text, len, &i, &a) != 0)
            break;
        b = a;
        if (i < len && text[i] == '-') {
            i++;
            if (parse_num(text, len, &i, &b) != 0)
                break;
        }
        if (a > b || b >= (unsigned long long)limit)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "shards '%s': %llu-%llu is not within 0-%d", text, a, b, limit - 1);
        for (unsigned long long k = a; k <= b; k++)
            *mask |= 1ull << k;
        if (i == len)
            return FR_OK;
        if (text[i++] != ',')
            break;
    }
    *mask = 0;
    return fr_errorf(FR_ERR_INVAL, errstr, size,
                     "shards '%s': expected a list such as 0-3 or 0,2 (shards 0..%d)",
                     text ? text : "", limit - 1);
}
