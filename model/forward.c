/*
 * forward.c - a dense model's predictions from its weights
 * (docs/design.md "Predictions"): the forward pass of the layout in
 * model.h, ReLU between layers, then the loss's link (softmax, sigmoid or
 * none). Plain C, no BLAS: serve's inference workers call it on a few
 * requests' samples at once, where one weight row is reused across the
 * batch while it is in cache.
 */
#include <math.h>
#include <string.h>

#include "model/model.h"

size_t model_forward_scratch(const model_t *m, size_t n)
{
    size_t widest = 0;
    for (int l = 1; l < m->nlayers; l++) /* the hidden layers' activations */
        if ((size_t)m->dims[l] > widest)
            widest = (size_t)m->dims[l];
    return 2 * n * widest;
}

/* <a, b> over len floats, in 8 lanes: a fixed order the compiler
 * vectorises, the same answer at every call. */
static float dot(const float *a, const float *b, size_t len)
{
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t k = 0;
    for (; k + 8 <= len; k += 8)
        for (int j = 0; j < 8; j++)
            lane[j] += a[k + j] * b[k + j];
    float s =
        ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
    for (; k < len; k++)
        s += a[k] * b[k];
    return s;
}

/* out[i][o] = W[o] . in[i] + b[o] for n samples; relu clamps at 0. Each
 * weight row is read once for the whole batch. */
static void layer(const float *W, const float *b, size_t nin, size_t nout, const float *in,
                  size_t n, float *out, int relu)
{
    for (size_t o = 0; o < nout; o++) {
        const float *row = W + o * nin;
        for (size_t i = 0; i < n; i++) {
            float z = dot(row, in + i * nin, nin) + b[o];
            out[i * nout + o] = relu && !(z > 0.0f) ? 0.0f : z;
        }
    }
}

void model_forward(const model_t *m, const float *w, const float *x, size_t n, float *out,
                   float *scratch)
{
    size_t widest = model_forward_scratch(m, 1) / 2; /* 0: no hidden layer, no scratch */
    float *buf[2] = {scratch, widest > 0 ? scratch + n * widest : scratch};
    const float *in = x;
    for (int l = 0; l < m->nlayers; l++) {
        int last = l == m->nlayers - 1;
        float *dst = last ? out : buf[l & 1];
        layer(w + m->w_off[l], w + m->b_off[l], (size_t)m->dims[l], (size_t)m->dims[l + 1], in, n,
              dst, !last);
        in = dst;
    }
    size_t K = (size_t)m->dims[m->nlayers];
    for (size_t i = 0; i < n; i++) {
        float *z = out + i * K;
        if (m->loss == MODEL_LOSS_SOFTMAX) { /* shifted by the largest: no overflow */
            float top = z[0];
            for (size_t c = 1; c < K; c++)
                top = z[c] > top ? z[c] : top;
            double sum = 0.0;
            for (size_t c = 0; c < K; c++)
                sum += (z[c] = expf(z[c] - top));
            for (size_t c = 0; c < K; c++)
                z[c] = (float)(z[c] / sum);
        } else if (m->loss == MODEL_LOSS_LOGISTIC) { /* exp of a non-positive number only */
            float e = expf(-fabsf(z[0]));
            z[0] = z[0] >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
        }
    }
}
