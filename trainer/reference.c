/*
 * reference.c - the double-precision plain-loop forward and backward pass:
 * the yardstick every backend is checked against. Written for clarity, not
 * speed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/trainer.h"

/*
 * Per-sample loss of logits z[c] against label yi, and (when dz is not
 * NULL) its derivative with respect to z, scaled by scale.
 */
static double ref_loss(const model_t *m, const double *z, double yi, double *dz, double scale)
{
    int c = m->dims[m->nlayers];
    if (m->loss == MODEL_LOSS_SOFTMAX) {
        double mx = z[0], sum = 0.0;
        for (int j = 1; j < c; j++)
            mx = z[j] > mx ? z[j] : mx;
        for (int j = 0; j < c; j++)
            sum += exp(z[j] - mx);
        double lse = mx + log(sum);
        int label = (int)yi;
        if (dz != NULL) {
            for (int j = 0; j < c; j++)
                dz[j] = (exp(z[j] - lse) - (j == label ? 1.0 : 0.0)) * scale;
        }
        return lse - z[label];
    }
    if (m->loss == MODEL_LOSS_LOGISTIC) {
        double v = z[0];
        if (dz != NULL)
            dz[0] = (1.0 / (1.0 + exp(-v)) - yi) * scale;
        return (v > 0 ? v : 0) - v * yi + log1p(exp(-fabs(v)));
    }
    if (dz != NULL)
        dz[0] = 2.0 * (z[0] - yi) * scale;
    return (z[0] - yi) * (z[0] - yi);
}

fr_err_t trainer_reference_gradient(const model_t *m, double *grad, double *loss_sum,
                                    const double *w, const double *x, const double *y, int n)
{
    int L = m->nlayers;
    size_t total = 0;
    for (int l = 0; l <= L; l++)
        total += (size_t)m->dims[l];
    /* act holds every layer's activations of one sample; dact its gradient */
    double *act = calloc(2 * total, sizeof(double));
    if (act == NULL)
        return FR_ERR_NOMEM;
    double *dact = act + total;
    size_t off[MODEL_MAX_LAYERS + 2];
    off[0] = 0;
    for (int l = 0; l <= L; l++)
        off[l + 1] = off[l] + (size_t)m->dims[l];

    for (int i = 0; m->loss == MODEL_LOSS_SOFTMAX && i < n; i++) {
        if (!(y[i] >= 0.0 && y[i] < (double)m->dims[L])) {
            free(act);
            return FR_ERR_RANGE;
        }
    }
    memset(grad, 0, m->nparams * sizeof(double));
    *loss_sum = 0.0;
    for (int i = 0; i < n; i++) {
        memcpy(act, x + (size_t)i * m->dims[0], (size_t)m->dims[0] * sizeof(double));
        for (int l = 0; l < L; l++) {
            int in = m->dims[l], out = m->dims[l + 1];
            const double *W = w + m->w_off[l], *b = w + m->b_off[l];
            for (int o = 0; o < out; o++) {
                double s = b[o];
                for (int k = 0; k < in; k++)
                    s += W[(size_t)o * in + k] * act[off[l] + k];
                act[off[l + 1] + o] = (l + 1 < L && s <= 0.0) ? 0.0 : s;
            }
        }
        *loss_sum += ref_loss(m, act + off[L], y[i], dact + off[L], 1.0 / n);
        for (int l = L - 1; l >= 0; l--) {
            int in = m->dims[l], out = m->dims[l + 1];
            const double *W = w + m->w_off[l];
            double *gW = grad + m->w_off[l], *gb = grad + m->b_off[l];
            for (int k = 0; k < in; k++)
                dact[off[l] + k] = 0.0;
            for (int o = 0; o < out; o++) {
                double d = dact[off[l + 1] + o];
                gb[o] += d;
                for (int k = 0; k < in; k++) {
                    gW[(size_t)o * in + k] += d * act[off[l] + k];
                    dact[off[l] + k] += d * W[(size_t)o * in + k];
                }
            }
            if (l > 0) {
                for (int k = 0; k < in; k++)
                    if (act[off[l] + k] <= 0.0)
                        dact[off[l] + k] = 0.0;
            }
        }
    }
    free(act);
    return FR_OK;
}
