/*
 * optim.c - per-row optimizers of the sparse table (docs/design.md
 * "Sparse models").
 *
 * Adagrad is torch.optim.Adagrad with its defaults: acc += g^2;
 * w -= lr * g / (sqrt(acc) + 1e-10).
 *
 * FTRL-Proximal is McMahan et al. 2013, Algorithm 1, per coordinate:
 * sigma = (sqrt(n + g^2) - sqrt(n)) / alpha; z += g - sigma * w;
 * n += g^2; w = 0 when |z| <= l1, else
 * -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2). It runs on the
 * linear weights (where its L1 gives sparse models) and the bias, without
 * regularization there; the embeddings use Adagrad, because FTRL's weight
 * of a zero state is 0, and an FM whose embeddings are all 0 has a zero
 * gradient in them and never leaves it.
 *
 * A step whose gradient is not finite, or that would overflow the state,
 * is not taken (that coordinate keeps its value).
 *
 * A row never written starts at a value computed from (seed, row) alone,
 * so that a worker that pulls a missing row and the applier that creates
 * it agree without storing it first.
 */
#include <math.h>
#include <string.h>

#include "sparse/sparse.h"

#define ADAGRAD_EPS 1e-10f

void sparse_optim_defaults(sparse_optim_t *o, sparse_optim_kind_t kind)
{
    *o = (sparse_optim_t){.kind = kind,
                          .lr = 0.02f,
                          .alpha = 0.1f,
                          .beta = 1.0f,
                          .l1 = 0.0f,
                          .l2 = 0.0f,
                          .init_std = 0.01f,
                          .seed = 0};
}

fr_err_t sparse_optim_parse(const char *name, sparse_optim_kind_t *kind)
{
    if (name == NULL)
        return FR_ERR_INVAL;
    if (strcmp(name, "adagrad") == 0)
        *kind = SPARSE_OPTIM_ADAGRAD;
    else if (strcmp(name, "ftrl") == 0)
        *kind = SPARSE_OPTIM_FTRL;
    else
        return FR_ERR_INVAL;
    return FR_OK;
}

const char *sparse_optim_name(sparse_optim_kind_t kind)
{
    return kind == SPARSE_OPTIM_FTRL ? "ftrl" : "adagrad";
}

size_t sparse_state_len(const sparse_spec_t *spec, const sparse_optim_t *o)
{
    return (o->kind == SPARSE_OPTIM_FTRL ? 2 : 1) * (size_t)sparse_outputs(spec) +
           (size_t)spec->dim;
}

uint64_t sparse_mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void sparse_row_init(const sparse_spec_t *spec, const sparse_optim_t *o, uint32_t row, float *param,
                     float *state)
{
    const int K = sparse_outputs(spec);
    for (int c = 0; c < K; c++)
        param[c] = 0;
    /* uniform on [-a, a] has standard deviation a / sqrt(3) */
    const double a = (double)o->init_std * sqrt(3.0);
    uint64_t h = sparse_mix64(sparse_mix64(o->seed) + row);
    for (int d = 0; d < spec->dim; d++) {
        h = sparse_mix64(h);
        double u = (double)(h >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) */
        param[K + d] = (float)((2 * u - 1) * a);
    }
    memset(state, 0, sparse_state_len(spec, o) * sizeof(*state));
}

/* One Adagrad step of one coordinate. */
static void adagrad(float *w, float *acc, float g, float lr)
{
    float acc1 = *acc + g * g;
    if (!isfinite(g) || !isfinite(acc1))
        return; /* a step that would leave the state infinite is not taken */
    *acc = acc1;
    *w -= lr * g / (sqrtf(acc1) + ADAGRAD_EPS);
}

/* One FTRL-Proximal step of one coordinate (state z, n). */
static void ftrl(float *w, float *z, float *n, float g, float alpha, float beta, float l1, float l2)
{
    if (!isfinite(g))
        return;
    double n1 = (double)*n + (double)g * g;
    double sigma = (sqrt(n1) - sqrt((double)*n)) / alpha;
    double z1 = (double)*z + g - sigma * *w;
    if (!isfinite((float)n1) || !isfinite((float)z1))
        return; /* the state would overflow float: the step is not taken */
    *z = (float)z1;
    *n = (float)n1;
    if (fabs(z1) <= l1)
        *w = 0;
    else
        *w = (float)(-(z1 - (z1 > 0 ? l1 : -l1)) / ((beta + sqrt(n1)) / alpha + l2));
}

void sparse_row_step(const sparse_spec_t *spec, const sparse_optim_t *o, float *param, float *state,
                     const float *grad)
{
    const int K = sparse_outputs(spec);
    float *acc = state; /* acc[K + d]: the embedding's */
    for (int c = 0; c < K; c++) {
        if (o->kind == SPARSE_OPTIM_FTRL)
            ftrl(&param[c], &state[2 * c], &state[2 * c + 1], grad[c], o->alpha, o->beta, o->l1,
                 o->l2);
        else
            adagrad(&param[c], &acc[c], grad[c], o->lr);
    }
    if (o->kind == SPARSE_OPTIM_FTRL)
        acc = state + K; /* past the K (z, n) pairs */
    /* the embedding's sums end the state: sparse_state_len's layout */
    FR_ASSERT((size_t)(acc - state) + (size_t)K + (size_t)spec->dim == sparse_state_len(spec, o));
    for (int d = 0; d < spec->dim; d++)
        adagrad(&param[K + d], &acc[K + d], grad[K + d], o->lr);
}

void sparse_bias_step(const sparse_optim_t *o, float *bias, float *state, float g)
{
    if (o->kind == SPARSE_OPTIM_FTRL)
        ftrl(bias, &state[0], &state[1], g, o->alpha, o->beta, 0, 0);
    else
        adagrad(bias, &state[0], g, o->lr);
}

void sparse_dense_step(const sparse_spec_t *spec, const sparse_optim_t *o, float *dense,
                       float *state, const float *gdense)
{
    const size_t K = (size_t)sparse_outputs(spec), n = sparse_tower_len(spec);
    FR_ASSERT(2 * K + n == sparse_dense_state_len(spec)); /* 2 a bias, then the tower's sums */
    for (size_t c = 0; c < K; c++)
        sparse_bias_step(o, &dense[c], state + 2 * c, gdense[c]);
    for (size_t i = 0; i < n; i++) /* Adagrad, as the embeddings under either kind */
        adagrad(&dense[K + i], &state[2 * K + i], gdense[K + i], o->lr);
}
