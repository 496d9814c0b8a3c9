/*
 * cpu.c - the CPU backend: OpenBLAS sgemm for the layer products, plain
 * loops (which the compiler vectorises) for bias, ReLU and the losses.
 *
 * Per batch of n samples (shapes in comments are row-major):
 *   forward   z_l = a_{l-1} W_l^T + b_l        a_{l-1} [n x in], W_l [out x in]
 *             a_l = relu(z_l) for hidden layers; the last z is the logits
 *   loss      delta_L = d(mean loss)/d logits   [n x out_L]
 *   backward  dW_l = delta_l^T a_{l-1}          [out x in]
 *             db_l = column sums of delta_l     [out]
 *             delta_{l-1} = (delta_l W_l) * (a_{l-1} > 0), skipped for l = 0
 * The input gradient of the first layer is never computed: nothing needs it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/trainer_int.h"

typedef struct cpu_state {
    const model_t *m;
    int max_batch;
    const float *w;                   /* borrowed, see load()         */
    float *act[MODEL_MAX_LAYERS + 1]; /* act[l] [max_batch x dims[l]], l >= 1 */
    float *delta[2];                  /* ping-pong [max_batch x widest] */
    float *block;                     /* the one allocation behind them */
} cpu_state_t;

static int cpu_available(void)
{
    return 1;
}

/*
 * Allocates every buffer in one block and touches it once, so that no page
 * is first touched on the hot path.
 */
static fr_err_t cpu_create(void **state, const model_t *m, int max_batch, int device, char *errstr,
                           size_t size)
{
    if (max_batch < 1)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "cpu: max batch must be >= 1");
    cpu_state_t *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return fr_errorf(FR_ERR_NOMEM, errstr, size, "cpu: out of memory");
    /* deltas are [n x dims[l]] for l >= 1: the input gradient is never formed */
    size_t widest = 0, total = 0;
    for (int l = 1; l <= m->nlayers; l++) {
        total += (size_t)max_batch * (size_t)m->dims[l];
        if ((size_t)m->dims[l] > widest)
            widest = (size_t)m->dims[l];
    }
    total += 2 * (size_t)max_batch * widest;
    st->block = malloc(total * sizeof(float));
    if (st->block == NULL) {
        free(st);
        return fr_errorf(FR_ERR_NOMEM, errstr, size, "cpu: cannot allocate %zu floats", total);
    }
    fr_mem_touch(st->block, total * sizeof(float));
    float *p = st->block;
    for (int l = 1; l <= m->nlayers; l++) {
        st->act[l] = p;
        p += (size_t)max_batch * (size_t)m->dims[l];
    }
    st->delta[0] = p;
    st->delta[1] = p + (size_t)max_batch * widest;
    st->m = m;
    st->max_batch = max_batch;
    trainer_blas_single_thread();
    *state = st;
    return FR_OK;
}

static void cpu_destroy(void *state)
{
    cpu_state_t *st = state;
    if (st == NULL)
        return;
    free(st->block);
    free(st);
}

static fr_err_t cpu_load(void *state, const float *w, char *errstr, size_t size)
{
    ((cpu_state_t *)state)->w = w;
    return FR_OK;
}

/* z[n x out] += b (each row), then ReLU in place when relu is set. */
static void bias_relu(float *restrict z, const float *restrict b, int n, int out, int relu)
{
    for (int i = 0; i < n; i++) {
        float *restrict row = z + (size_t)i * out;
        if (relu) {
            for (int j = 0; j < out; j++) {
                float v = row[j] + b[j];
                row[j] = v < 0.0f ? 0.0f : v; /* NaN stays NaN, -0 and 0 give 0 gradient */
            }
        } else {
            for (int j = 0; j < out; j++)
                row[j] += b[j];
        }
    }
}

/* Forward pass of n samples; returns the logits [n x dims[L]]. */
static float *forward(cpu_state_t *st, const float *x, int n)
{
    const model_t *m = st->m;
    const float *in = x;
    for (int l = 0; l < m->nlayers; l++) {
        int k = m->dims[l], out = m->dims[l + 1];
        float *z = st->act[l + 1];
        trainer_sgemm(0, 1, n, out, k, 1.0f, in, k, st->w + m->w_off[l], k, 0.0f, z, out);
        bias_relu(z, st->w + m->b_off[l], n, out, l + 1 < m->nlayers);
        in = z;
    }
    return st->act[m->nlayers];
}

/*
 * The loss of the logits z [n x c] against y [n], PyTorch's conventions.
 * When delta is non-NULL it receives d(mean loss)/dz. Stores the summed
 * loss in *loss_sum; *correct counts right answers (classification losses
 * only). Returns the index of the first sample whose class label is not in
 * [0, c) (callers validate labels, so this is defence only), or -1.
 */
static int output_loss(const model_t *m, const float *z, const float *y, int n, float *delta,
                       double *loss_sum, int64_t *correct)
{
    int c = m->dims[m->nlayers];
    float inv_n = 1.0f / (float)n;
    double loss = 0.0;
    int64_t right = 0;
    for (int i = 0; i < n; i++) {
        const float *zi = z + (size_t)i * c;
        float yi = y[i];
        if (m->loss == MODEL_LOSS_SOFTMAX) {
            if (!(yi >= 0.0f && yi < (float)c))
                return i;
            int label = (int)yi, arg = 0;
            float mx = zi[0];
            for (int j = 1; j < c; j++) {
                if (zi[j] > mx) {
                    mx = zi[j];
                    arg = j;
                }
            }
            /* the exponentials go to delta's row when there is one */
            float *e = delta != NULL ? delta + (size_t)i * c : NULL, sum = 0.0f;
            for (int j = 0; j < c; j++) {
                float ej = expf(zi[j] - mx);
                sum += ej;
                if (e != NULL)
                    e[j] = ej;
            }
            float lse = mx + logf(sum);
            loss += (double)(lse - zi[label]);
            right += arg == label;
            if (e != NULL) {
                float scale = inv_n / sum;
                for (int j = 0; j < c; j++)
                    e[j] *= scale;
                e[label] -= inv_n;
            }
        } else if (m->loss == MODEL_LOSS_LOGISTIC) {
            float v = zi[0];
            loss += (double)(fmaxf(v, 0.0f) - v * yi + log1pf(expf(-fabsf(v))));
            right += (v > 0.0f) == (yi >= 0.5f);
            if (delta != NULL) {
                float sig = v >= 0.0f ? 1.0f / (1.0f + expf(-v)) : expf(v) / (1.0f + expf(v));
                delta[i] = (sig - yi) * inv_n;
            }
        } else {
            float d = zi[0] - yi;
            loss += (double)(d * d);
            if (delta != NULL)
                delta[i] = 2.0f * d * inv_n;
        }
    }
    if (correct != NULL)
        *correct = right;
    *loss_sum = loss;
    return -1;
}

/* db[out] = column sums of d [n x out]. */
static void column_sums(float *restrict db, const float *restrict d, int n, int out)
{
    memset(db, 0, (size_t)out * sizeof(float));
    for (int i = 0; i < n; i++) {
        const float *restrict row = d + (size_t)i * out;
        for (int j = 0; j < out; j++)
            db[j] += row[j];
    }
}

/* d[i] = 0 where the layer's activation a[i] is 0 (ReLU' = 0 at 0); a NaN
 * activation keeps its gradient, so NaN propagates as in PyTorch. */
static void relu_mask(float *restrict d, const float *restrict a, size_t count)
{
    for (size_t i = 0; i < count; i++)
        d[i] = a[i] <= 0.0f ? 0.0f : d[i];
}

/*
 * The checks every batch needs, the forward pass and the loss: *loss_sum,
 * *correct (when non-NULL) and, when delta is non-NULL, d(mean loss)/d
 * logits into it.
 */
static fr_err_t forward_loss(cpu_state_t *st, double *loss_sum, int64_t *correct, float *delta,
                             const float *x, const float *y, int n, char *errstr, size_t size)
{
    if (n < 1 || n > st->max_batch)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "cpu: batch of %d outside 1..%d", n,
                         st->max_batch);
    if (st->w == NULL)
        return fr_errorf(FR_ERR_STATE, errstr, size, "cpu: no weights loaded");
    const float *logits = forward(st, x, n);
    int bad = output_loss(st->m, logits, y, n, delta, loss_sum, correct);
    if (bad >= 0)
        return fr_errorf(FR_ERR_RANGE, errstr, size, "cpu: label %g of sample %d is not a class",
                         (double)y[bad], bad);
    return FR_OK;
}

static fr_err_t cpu_gradient(void *state, float *grad, double *loss_sum, const float *x,
                             const float *y, int n, char *errstr, size_t size)
{
    cpu_state_t *st = state;
    const model_t *m = st->m;
    float *d = st->delta[0];
    fr_err_t err = forward_loss(st, loss_sum, NULL, d, x, y, n, errstr, size);
    if (err != FR_OK)
        return err;
    int cur = 0;
    for (int l = m->nlayers - 1; l >= 0; l--) {
        int k = m->dims[l], out = m->dims[l + 1];
        const float *a_in = l > 0 ? st->act[l] : x;
        trainer_sgemm(1, 0, out, k, n, 1.0f, d, out, a_in, k, 0.0f, grad + m->w_off[l], k);
        column_sums(grad + m->b_off[l], d, n, out);
        if (l == 0)
            break;
        float *dn = st->delta[cur ^ 1];
        trainer_sgemm(0, 0, n, k, out, 1.0f, d, out, st->w + m->w_off[l], k, 0.0f, dn, k);
        relu_mask(dn, st->act[l], (size_t)n * (size_t)k);
        d = dn;
        cur ^= 1;
    }
    return FR_OK;
}

static fr_err_t cpu_evaluate(void *state, double *loss_sum, int64_t *correct, const float *x,
                             const float *y, int n, char *errstr, size_t size)
{
    return forward_loss(state, loss_sum, correct, NULL, x, y, n, errstr, size);
}

const trainer_backend_ops_t trainer_cpu_ops = {
    .name = "cpu",
    .available = cpu_available,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .load = cpu_load,
    .gradient = cpu_gradient,
    .evaluate = cpu_evaluate,
};
