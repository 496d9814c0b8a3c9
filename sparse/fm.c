/*
 * fm.c - the sparse model's shape, hashing, batches with their distinct
 * rows, and the factorization machine's loss and gradient
 * (docs/design.md "Sparse models").
 *
 * The pairwise term uses Rendle's identity: sum_{i<j} <v_i, v_j> x_i x_j =
 * 1/2 sum_d ((sum_i v_id x_i)^2 - sum_i v_id^2 x_i^2), so a sample costs
 * O(n * D) instead of O(n^2 * D); its gradient in v_id is
 * x_i (S_d - v_id x_i) with S_d = sum_j v_jd x_j.
 *
 * The dense tower (docs/design.md "The dense tower") is a small MLP over
 * the fields' embeddings, run one sample at a time: its weights are laid
 * out input-major, so that the forward pass and the weight gradient are
 * axpy loops the compiler vectorises without reordering any sum.
 */
#include <assert.h>
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

/* tower:H1-H2...: the widths into spec; 0, or -1 when malformed. */
static int parse_tower(const char **p, sparse_spec_t *spec)
{
    spec->ntower = 0;
    for (;;) {
        long long h = parse_count(p);
        if (h < 1 || h > SPARSE_TOWER_WIDTH || spec->ntower == SPARSE_TOWER_MAX)
            return -1;
        spec->tower[spec->ntower++] = (int)h;
        if (**p != '-')
            return 0;
        (*p)++;
    }
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
    sparse_spec_t s = {.fields = -1, .bits = -1, .dim = 0, .ntower = 0, .classes = 0};
    int tower_bad = 0;
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
        else if (klen == 5 && strncmp(p, "tower", 5) == 0)
            tower_bad = parse_tower(&v, &s) != 0;
        else if (klen == 7 && strncmp(p, "classes", 7) == 0)
            s.classes = (int)parse_count(&v);
        else
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "sparse: unknown key '%.*s' in '%s' (fields, buckets, dim, tower, "
                             "classes)",
                             (int)klen, p, text);
        if (tower_bad)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "sparse: tower must be 1 to %d hidden widths of 1..%d joined by '-' "
                             "in '%s'",
                             SPARSE_TOWER_MAX, SPARSE_TOWER_WIDTH, text);
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
    if (s.ntower > 0 && s.dim == 0)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "sparse: a tower runs over the embeddings: it needs dim 1 or more in '%s'",
                         text);
    if (s.classes != 0 && (s.classes < 2 || s.classes > SPARSE_CLASSES_MAX))
        return fr_errorf(FR_ERR_INVAL, errstr, size, "sparse: classes must be 2..%d in '%s'",
                         SPARSE_CLASSES_MAX, text);
    if (sparse_tower_len(&s) > SPARSE_TOWER_PARAMS)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "sparse: the tower has %zu parameters, at most %d (its gradient travels "
                         "with every batch) in '%s'",
                         sparse_tower_len(&s), SPARSE_TOWER_PARAMS, text);
    if (s.classes != 0 && s.dim > 0 && s.ntower == 0)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "sparse: a softmax model's embeddings need a tower (the FM's pairs are "
                         "the same for every class, and a softmax cancels them) in '%s'",
                         text);
    *spec = s;
    return FR_OK;
}

int sparse_spec_format(const sparse_spec_t *spec, char *buf, size_t size)
{
    int n =
        snprintf(buf, size, "fields:%d,buckets:2^%d,dim:%d", spec->fields, spec->bits, spec->dim);
    for (int l = 0; l < spec->ntower && n >= 0; l++) {
        size_t at = (size_t)n < size ? (size_t)n : size;
        int more = snprintf(buf + at, size - at, "%s%d", l == 0 ? ",tower:" : "-", spec->tower[l]);
        n = more < 0 ? more : n + more;
    }
    if (spec->classes > 0 && n >= 0) {
        size_t at = (size_t)n < size ? (size_t)n : size;
        int more = snprintf(buf + at, size - at, ",classes:%d", spec->classes);
        n = more < 0 ? more : n + more;
    }
    return n;
}

/* ------------------------------------------------------------------------
 * The dense tower
 * ---------------------------------------------------------------------- */

/* Layer l's input and output widths (l = 0 .. ntower; the last has an
 * output a class, or one). */
static void layer_dims(const sparse_spec_t *spec, int l, size_t *in, size_t *out)
{
    *in = l == 0 ? (size_t)spec->fields * (size_t)spec->dim : (size_t)spec->tower[l - 1];
    *out = l == spec->ntower ? (size_t)sparse_outputs(spec) : (size_t)spec->tower[l];
}

size_t sparse_tower_len(const sparse_spec_t *spec)
{
    size_t n = 0;
    for (int l = 0; spec->ntower > 0 && l <= spec->ntower; l++) {
        size_t in, out;
        layer_dims(spec, l, &in, &out);
        n += in * out + out;
    }
    return n;
}

void sparse_dense_init(const sparse_spec_t *spec, uint64_t seed, float *dense)
{
    const size_t K = (size_t)sparse_outputs(spec);
    memset(dense, 0, K * sizeof(float)); /* the biases */
    float *t = dense + K;
    uint64_t h = sparse_mix64(seed ^ 0x746f776572ull); /* "tower": apart from the rows' streams */
    for (int l = 0; spec->ntower > 0 && l <= spec->ntower; l++) {
        size_t in, out;
        layer_dims(spec, l, &in, &out);
        const double a = sqrt(6.0 / (double)(in + out));
        for (size_t i = 0; i < in * out; i++) {
            h = sparse_mix64(h);
            double u = (double)(h >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) */
            t[i] = (float)((2 * u - 1) * a);
        }
        memset(t + in * out, 0, out * sizeof(float));
        t += in * out + out;
    }
    FR_ASSERT((size_t)(t - dense) == sparse_dense_len(spec)); /* layer_dims and tower_len agree */
}

/* Scratch of one sample's pass through the tower: the activations of
 * every layer's input (the first the embeddings), then its gradients. */
#define PASS_LEN (SPARSE_FIELDS_MAX * SPARSE_DIM_MAX + SPARSE_TOWER_MAX * SPARSE_TOWER_WIDTH)
typedef struct tower_pass {
    float act[PASS_LEN];
    float del[PASS_LEN];
} tower_pass_t;

/* Floats of act (and del) one pass uses: every layer's input, the first
 * the F * D embeddings. At most PASS_LEN for a spec sparse_spec_parse
 * accepted. */
static size_t pass_len(const sparse_spec_t *spec)
{
    size_t n = 0;
    for (int l = 0; l <= spec->ntower; l++) {
        size_t in, out;
        layer_dims(spec, l, &in, &out);
        n += in;
    }
    return n;
}

/* The tower on t->act's first F * D floats (the embeddings): its outputs
 * added to y[sparse_outputs], every layer's input activation left in
 * t->act. */
static void tower_forward(const sparse_spec_t *spec, const float *tw, tower_pass_t *t, double *y)
{
    float *x = t->act;
    for (int l = 0; l <= spec->ntower; l++) {
        size_t in, out;
        layer_dims(spec, l, &in, &out);
        const float *W = tw, *bias = tw + in * out;
        float *z = x + in; /* the next layer's input */
        if (l == spec->ntower) {
            for (size_t o = 0; o < out; o++) {
                double s = bias[o];
                for (size_t i = 0; i < in; i++)
                    s += (double)x[i] * W[i * out + o];
                y[o] += s;
            }
        } else {
            memcpy(z, bias, out * sizeof(float));
            for (size_t i = 0; i < in; i++) {
                const float xi = x[i];
                if (xi == 0.0f)
                    continue;
                const float *Wi = W + i * out;
                for (size_t o = 0; o < out; o++)
                    z[o] += xi * Wi[o];
            }
            for (size_t o = 0; o < out; o++)
                z[o] = z[o] > 0.0f ? z[o] : 0.0f; /* ReLU */
        }
        tw += in * out + out;
        x = z;
    }
}

/* Back through the tower from its outputs' gradient g[sparse_outputs]:
 * adds the parameters' gradients into gt and leaves dL/d(embeddings) in
 * t->del's first F * D floats. */
static void tower_backward(const sparse_spec_t *spec, const float *tw, float *gt, const float *g,
                           tower_pass_t *t)
{
    size_t off[SPARSE_TOWER_MAX + 2], poff[SPARSE_TOWER_MAX + 2];
    off[0] = poff[0] = 0;
    for (int l = 0; l <= spec->ntower; l++) {
        size_t in, out;
        layer_dims(spec, l, &in, &out);
        off[l + 1] = off[l] + in;
        poff[l + 1] = poff[l] + in * out + out;
    }
    assert(off[spec->ntower + 1] <= PASS_LEN); /* sparse_fm_grad checked it once a batch */
    for (int l = spec->ntower; l >= 0; l--) {
        size_t in, out;
        layer_dims(spec, l, &in, &out);
        const float *W = tw + poff[l], *x = t->act + off[l];
        const float *dz = l == spec->ntower ? g : t->del + off[l + 1];
        float *gW = gt + poff[l], *gb = gW + in * out, *dx = t->del + off[l];
        for (size_t o = 0; o < out; o++)
            gb[o] += dz[o];
        for (size_t i = 0; i < in; i++) {
            const float xi = x[i];
            if (l > 0 && !(xi > 0.0f)) { /* the ReLU that made x was off: nothing flows */
                dx[i] = 0.0f;
                continue;
            }
            const float *Wi = W + i * out;
            float *gWi = gW + i * out;
            for (size_t o = 0; o < out; o++)
                gWi[o] += xi * dz[o];
            /* dx[i] = <W_i, dz> in 8 lanes, a fixed order the compiler vectorises */
            float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            size_t o = 0;
            for (; o + 8 <= out; o += 8)
                for (int j = 0; j < 8; j++)
                    lane[j] += Wi[o + j] * dz[o + j];
            float s = ((lane[0] + lane[4]) + (lane[1] + lane[5])) +
                      ((lane[2] + lane[6]) + (lane[3] + lane[7]));
            for (; o < out; o++)
                s += Wi[o] * dz[o];
            dx[i] = s;
        }
    }
}

uint32_t sparse_hash(int field, const void *value, size_t len, int bits)
{
    assert(bits >= 1 && bits <= 63); /* per feature: the layouts check it once a record */
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
    FR_ASSERT((b->table_cap & (b->table_cap - 1)) == 0); /* the probes mask with table_cap - 1 */
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
    /* rows[] holds cap * SPARSE_FIELDS_MAX and the table stays half empty,
     * so that a probe ends: n < cap samples of at most that many rows each */
    FR_ASSERT(b->nrows + (size_t)s->n <= b->table_cap / 2 &&
              b->nrows + (size_t)s->n <= b->cap * SPARSE_FIELDS_MAX);
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
                      const float *dense, float *grad, float *gdense, float *p)
{
    const int K = sparse_outputs(spec), D = spec->dim;
    const size_t rl = sparse_row_len(spec), FD = (size_t)spec->fields * (size_t)D;
    /* the stack arrays below and the tower's scratch hold any parsed spec */
    FR_ASSERT(K >= 1 && K <= SPARSE_CLASSES_MAX && D >= 0 && D <= SPARSE_DIM_MAX);
    FR_ASSERT(spec->fields >= 1 && spec->fields <= SPARSE_FIELDS_MAX);
    FR_ASSERT(spec->ntower >= 0 && spec->ntower <= SPARSE_TOWER_MAX);
    FR_ASSERT(spec->ntower == 0 || pass_len(spec) <= PASS_LEN); /* 5 layers, once a batch */
    memset(grad, 0, b->nrows * rl * sizeof(*grad));
    memset(gdense, 0, sparse_dense_len(spec) * sizeof(*gdense));
    double loss = 0, gb[SPARSE_CLASSES_MAX], score[SPARSE_CLASSES_MAX];
    float sum[SPARSE_DIM_MAX], g[SPARSE_CLASSES_MAX];
    static _Thread_local tower_pass_t t; /* 64 KB: not on a worker's stack */
    for (int c = 0; c < K; c++)
        gb[c] = 0;
    for (size_t i = 0; i < b->n; i++) {
        const sparse_sample_t *s = &b->samples[i];
        const uint32_t *slot = b->slot + i * SPARSE_FIELDS_MAX;
        FR_ASSERT(s->n >= 0 && s->n <= SPARSE_FIELDS_MAX); /* sparse_batch_add kept it so */
        double sq = 0;
        for (int c = 0; c < K; c++)
            score[c] = dense[c];
        for (int d = 0; d < D; d++)
            sum[d] = 0;
        for (int k = 0; k < s->n; k++) {
            assert(slot[k] < b->nrows); /* an index into rows, set by row_index */
            const float *w = params + slot[k] * rl;
            const float x = s->val[k];
            for (int c = 0; c < K; c++)
                score[c] += (double)w[c] * x;
            for (int d = 0; d < D; d++) {
                float vx = w[K + d] * x;
                sum[d] += vx;
                sq += (double)vx * vx;
            }
        }
        if (K == 1) { /* the FM's pairs; a softmax would cancel them */
            double pair = 0;
            for (int d = 0; d < D; d++)
                pair += (double)sum[d] * sum[d];
            score[0] += 0.5 * (pair - sq);
        }
        if (spec->ntower > 0) { /* the fields' embeddings through the tower */
            memset(t.act, 0, FD * sizeof(float));
            for (int k = 0; k < s->n; k++) {
                const float *v = params + slot[k] * rl + K;
                float *e = t.act + (size_t)(s->field[k] % spec->fields) * (size_t)D;
                for (int d = 0; d < D; d++)
                    e[d] += v[d] * s->val[k];
            }
            tower_forward(spec, dense + K, &t, score);
        }
        if (K == 1) {
            double prob = 1.0 / (1.0 + exp(-score[0]));
            if (p != NULL)
                p[i] = (float)prob;
            loss += logistic_loss(score[0], s->label);
            g[0] = (float)(prob - s->label); /* dL/dscore */
        } else { /* -log p_y = logsumexp(score) - score_y; dL/dscore_c = p_c - [c = y] */
            /* 0 .. K - 1: the layouts and the workers refuse any other */
            int y = s->label >= 0 && s->label < (float)K ? (int)s->label : 0;
            double top = score[0], z = 0;
            for (int c = 1; c < K; c++)
                top = score[c] > top ? score[c] : top;
            for (int c = 0; c < K; c++)
                z += exp(score[c] - top);
            double lse = top + log(z);
            loss += lse - score[y];
            for (int c = 0; c < K; c++)
                g[c] = (float)(exp(score[c] - lse) - (c == y));
            if (p != NULL)
                p[i] = (float)exp(score[y] - lse);
        }
        for (int c = 0; c < K; c++)
            gb[c] += g[c];
        for (int k = 0; k < s->n; k++) {
            const float *w = params + slot[k] * rl;
            float *gw = grad + slot[k] * rl;
            const float x = s->val[k];
            for (int c = 0; c < K; c++)
                gw[c] += g[c] * x;
            for (int d = 0; d < D && K == 1; d++)
                gw[1 + d] += g[0] * x * (sum[d] - w[1 + d] * x);
        }
        if (spec->ntower > 0) {
            tower_backward(spec, dense + K, gdense + K, g, &t);
            for (int k = 0; k < s->n; k++) {
                float *gv = grad + slot[k] * rl + K;
                const float *de = t.del + (size_t)(s->field[k] % spec->fields) * (size_t)D;
                for (int d = 0; d < D; d++)
                    gv[d] += de[d] * s->val[k];
            }
        }
    }
    for (int c = 0; c < K; c++)
        gdense[c] = (float)gb[c];
    return loss;
}

double sparse_fm_reference(const sparse_spec_t *spec, const sparse_sample_t *s,
                           const double *params, const double *dense, double *score)
{
    const int K = sparse_outputs(spec);
    const size_t rl = sparse_row_len(spec);
    FR_ASSERT(s->n >= 0 && s->n <= SPARSE_FIELDS_MAX);
    for (int c = 0; c < K; c++)
        score[c] = dense[c];
    for (int i = 0; i < s->n; i++) {
        for (int c = 0; c < K; c++)
            score[c] += params[i * rl + c] * s->val[i];
        for (int j = i + 1; j < s->n && K == 1; j++) {
            double dot = 0;
            for (int d = 0; d < spec->dim; d++)
                dot += params[i * rl + 1 + d] * params[j * rl + 1 + d];
            score[0] += dot * s->val[i] * s->val[j];
        }
    }
    if (spec->ntower == 0)
        return score[0];
    /* the tower by its definition: y = W_L relu(... relu(W_1 e + b_1) ...) + b_L */
    double x[SPARSE_FIELDS_MAX * SPARSE_DIM_MAX], z[SPARSE_FIELDS_MAX * SPARSE_DIM_MAX];
    size_t width = (size_t)spec->fields * (size_t)spec->dim;
    FR_ASSERT(spec->fields >= 1 && width <= sizeof(x) / sizeof(x[0]));
    memset(x, 0, width * sizeof(double));
    for (int i = 0; i < s->n; i++)
        for (int d = 0; d < spec->dim; d++)
            x[(s->field[i] % spec->fields) * spec->dim + d] += params[i * rl + K + d] * s->val[i];
    const double *tw = dense + K;
    for (int l = 0; l <= spec->ntower; l++) {
        size_t in, out;
        layer_dims(spec, l, &in, &out);
        FR_ASSERT(in <= sizeof(x) / sizeof(x[0]) && out <= sizeof(z) / sizeof(z[0]));
        for (size_t o = 0; o < out; o++) {
            double acc = tw[in * out + o];
            for (size_t i = 0; i < in; i++)
                acc += tw[i * out + o] * x[i];
            z[o] = l < spec->ntower && acc < 0 ? 0 : acc;
        }
        memcpy(x, z, out * sizeof(double));
        tw += in * out + out;
    }
    for (int c = 0; c < K; c++)
        score[c] += x[c];
    return score[0];
}
