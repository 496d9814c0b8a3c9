/*
 * fm.c - the sparse model's shape, hashing, batches with their distinct
 * rows, and the factorization machine's loss and gradient
 * (docs/design.md "Sparse models").
 *
 * The pairwise term uses Rendle's identity: sum_{i<j} <v_i, v_j> x_i x_j =
 * 1/2 sum_d ((sum_i v_id x_i)^2 - sum_i v_id^2 x_i^2), so a sample costs
 * O(n * D) instead of O(n^2 * D); its gradient in v_id is
 * x_i (S_d - v_id x_i) with S_d = sum_j v_jd x_j.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "sparse/sparse.h"

#define LOGLOSS_EPS 1e-7                 /* scikit-learn's log_loss clamp */
#define COUNT_MAX   ((long long)1 << 30) /* any larger count in a spec is refused */

/* ------------------------------------------------------------------------
 * The shape
 * ---------------------------------------------------------------------- */

/* Parses the decimal integer at *p up to a ',' or the end; -1 when none. */
static long long parse_count(const char **p)
{
    char *end;
    if (**p < '0' || **p > '9')
        return -1;
    errno = 0;
    long long v = strtoll(*p, &end, 10);
    *p = end;
    return errno == 0 && v <= COUNT_MAX ? v : -1;
}

/* buckets:2^B or buckets:N, N a power of two. */
static int parse_bits(const char **p)
{
    long long v = parse_count(p);
    if (v == 2 && **p == '^') {
        (*p)++;
        long long b = parse_count(p);
        return b >= 0 && b <= 62 ? (int)b : -1;
    }
    if (v < 1 || (v & (v - 1)) != 0)
        return -1;
    int b = 0;
    while ((1ll << b) < v)
        b++;
    return b;
}

fr_err_t sparse_spec_parse(const char *text, sparse_spec_t *spec, char *errstr, size_t size)
{
    if (text == NULL || spec == NULL)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "sparse: no specification");
    sparse_spec_t s = {.fields = -1, .bits = -1, .dim = 0};
    const char *p = text;
    while (*p != '\0') {
        const char *colon = strchr(p, ':');
        if (colon == NULL)
            break;
        size_t klen = (size_t)(colon - p);
        const char *v = colon + 1;
        if (klen == 6 && strncmp(p, "fields", 6) == 0)
            s.fields = (int)parse_count(&v);
        else if (klen == 7 && strncmp(p, "buckets", 7) == 0)
            s.bits = parse_bits(&v);
        else if (klen == 3 && strncmp(p, "dim", 3) == 0)
            s.dim = (int)parse_count(&v);
        else
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "sparse: unknown key '%.*s' in '%s' (fields, buckets, dim)", (int)klen,
                             p, text);
        if (*v != ',' && *v != '\0')
            return fr_errorf(FR_ERR_INVAL, errstr, size, "sparse: bad value of '%.*s' in '%s'",
                             (int)klen, p, text);
        p = *v == ',' ? v + 1 : v;
        if (*v == ',' && *p == '\0')
            p = v; /* a trailing comma */
    }
    if (*p != '\0')
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "sparse: '%s' is not fields:F,buckets:2^B,dim:D", text);
    if (s.fields < 1 || s.fields > SPARSE_FIELDS_MAX)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "sparse: fields must be 1..%d in '%s'",
                         SPARSE_FIELDS_MAX, text);
    if (s.bits < SPARSE_BITS_MIN || s.bits > SPARSE_BITS_MAX)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "sparse: buckets must be 2^%d..2^%d (a power of two) in '%s'",
                         SPARSE_BITS_MIN, SPARSE_BITS_MAX, text);
    if (s.dim < 0 || s.dim > SPARSE_DIM_MAX)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "sparse: dim must be 0..%d in '%s'",
                         SPARSE_DIM_MAX, text);
    *spec = s;
    return FR_OK;
}

int sparse_spec_format(const sparse_spec_t *spec, char *buf, size_t size)
{
    return snprintf(buf, size, "fields:%d,buckets:2^%d,dim:%d", spec->fields, spec->bits,
                    spec->dim);
}

uint32_t sparse_hash(int field, const void *value, size_t len, int bits)
{
    uint64_t h = XXH64(value, len, (uint64_t)field);
    return (uint32_t)(h >> (64 - bits)); /* the high bits: the best mixed */
}

uint64_t sparse_value_id(const void *text, size_t len)
{
    return XXH64(text, len, 0);
}

uint32_t sparse_id_row(int field, uint64_t id, int bits)
{
    unsigned char le[8]; /* the same row on any host */
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(id >> (8 * i));
    return sparse_hash(field, le, sizeof(le), bits);
}

/* ------------------------------------------------------------------------
 * Batches
 * ---------------------------------------------------------------------- */

sparse_batch_t *sparse_batch_new(size_t cap)
{
    sparse_batch_t *b = calloc(1, sizeof(*b));
    if (b == NULL || cap == 0)
        goto fail;
    b->cap = cap;
    /* the table stays at most half full */
    b->table_cap = 16;
    while (b->table_cap < 2 * cap * SPARSE_FIELDS_MAX)
        b->table_cap *= 2;
    b->samples = malloc(cap * sizeof(*b->samples));
    b->rows = malloc(cap * SPARSE_FIELDS_MAX * sizeof(*b->rows));
    b->slot = malloc(cap * SPARSE_FIELDS_MAX * sizeof(*b->slot));
    b->table = calloc(b->table_cap, sizeof(*b->table));
    b->table_idx = malloc(b->table_cap * sizeof(*b->table_idx));
    if (b->samples == NULL || b->rows == NULL || b->slot == NULL || b->table == NULL ||
        b->table_idx == NULL)
        goto fail;
    return b;
fail:
    sparse_batch_destroy(b);
    return NULL;
}

void sparse_batch_destroy(sparse_batch_t *b)
{
    if (b == NULL)
        return;
    free(b->samples);
    free(b->rows);
    free(b->slot);
    free(b->table);
    free(b->table_idx);
    free(b);
}

void sparse_batch_clear(sparse_batch_t *b)
{
    /* only the used entries are cleared: the rows say where they are */
    size_t mask = b->table_cap - 1;
    for (size_t r = 0; r < b->nrows; r++) {
        size_t h = ((size_t)b->rows[r] * 0x9E3779B97F4A7C15ull) & mask;
        while (b->table[h] != 0) {
            b->table[h] = 0;
            h = (h + 1) & mask;
        }
    }
    b->n = 0;
    b->nrows = 0;
}

/* The index of row in b->rows, added when new. */
static uint32_t row_index(sparse_batch_t *b, uint32_t row)
{
    size_t mask = b->table_cap - 1;
    size_t h = ((size_t)row * 0x9E3779B97F4A7C15ull) & mask;
    while (b->table[h] != 0) {
        if (b->table[h] == row + 1)
            return b->table_idx[h];
        h = (h + 1) & mask;
    }
    b->table[h] = row + 1;
    b->table_idx[h] = (uint32_t)b->nrows;
    b->rows[b->nrows] = row;
    return (uint32_t)b->nrows++;
}

fr_err_t sparse_batch_add(sparse_batch_t *b, const sparse_sample_t *s)
{
    if (s->n < 0 || s->n > SPARSE_FIELDS_MAX)
        return FR_ERR_INVAL;
    if (b->n == b->cap)
        return FR_ERR_RANGE;
    b->samples[b->n] = *s;
    uint32_t *slot = b->slot + b->n * SPARSE_FIELDS_MAX;
    for (int k = 0; k < s->n; k++)
        slot[k] = row_index(b, s->row[k]);
    b->n++;
    return FR_OK;
}

/* ------------------------------------------------------------------------
 * Loss and gradient
 * ---------------------------------------------------------------------- */

double sparse_logloss(double p, double y)
{
    if (p < LOGLOSS_EPS)
        p = LOGLOSS_EPS;
    if (p > 1 - LOGLOSS_EPS)
        p = 1 - LOGLOSS_EPS;
    return y > 0.5 ? -log(p) : -log1p(-p);
}

/* log(1 + e^s) - y s, without overflow. */
static double logistic_loss(double s, double y)
{
    double softplus = s > 0 ? s + log1p(exp(-s)) : log1p(exp(s));
    return softplus - y * s;
}

double sparse_fm_grad(const sparse_spec_t *spec, const sparse_batch_t *b, const float *params,
                      float bias, float *grad, float *gbias, float *p)
{
    const size_t rl = sparse_row_len(spec);
    const int D = spec->dim;
    memset(grad, 0, b->nrows * rl * sizeof(*grad));
    double loss = 0, gb = 0;
    float sum[SPARSE_DIM_MAX];
    for (size_t i = 0; i < b->n; i++) {
        const sparse_sample_t *s = &b->samples[i];
        const uint32_t *slot = b->slot + i * SPARSE_FIELDS_MAX;
        double score = bias, sq = 0;
        for (int d = 0; d < D; d++)
            sum[d] = 0;
        for (int k = 0; k < s->n; k++) {
            const float *w = params + slot[k] * rl;
            const float x = s->val[k];
            score += (double)w[0] * x;
            for (int d = 0; d < D; d++) {
                float vx = w[1 + d] * x;
                sum[d] += vx;
                sq += (double)vx * vx;
            }
        }
        double pair = 0;
        for (int d = 0; d < D; d++)
            pair += (double)sum[d] * sum[d];
        score += 0.5 * (pair - sq);
        double prob = 1.0 / (1.0 + exp(-score));
        if (p != NULL)
            p[i] = (float)prob;
        loss += logistic_loss(score, s->label);
        const float g = (float)(prob - s->label); /* dL/dscore */
        gb += g;
        for (int k = 0; k < s->n; k++) {
            const float *w = params + slot[k] * rl;
            float *gw = grad + slot[k] * rl;
            const float x = s->val[k];
            gw[0] += g * x;
            for (int d = 0; d < D; d++)
                gw[1 + d] += g * x * (sum[d] - w[1 + d] * x);
        }
    }
    *gbias = (float)gb;
    return loss;
}

double sparse_fm_reference(const sparse_spec_t *spec, const sparse_sample_t *s,
                           const double *params, double bias)
{
    const size_t rl = sparse_row_len(spec);
    double score = bias;
    for (int i = 0; i < s->n; i++) {
        score += params[i * rl] * s->val[i];
        for (int j = i + 1; j < s->n; j++) {
            double dot = 0;
            for (int d = 0; d < spec->dim; d++)
                dot += params[i * rl + 1 + d] * params[j * rl + 1 + d];
            score += dot * s->val[i] * s->val[j];
        }
    }
    return score;
}
