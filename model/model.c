/*
 * model.c - the model spec, its flat parameter layout, seeded
 * initialisation and the loss names. Pure: common/ only.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static const char *const loss_names[] = {"softmax", "logistic", "mse"};

fr_err_t model_loss_parse(const char *name, model_loss_t *loss)
{
    for (int i = 0; i < 3; i++) {
        if (strcmp(name, loss_names[i]) == 0) {
            *loss = (model_loss_t)i;
            return FR_OK;
        }
    }
    return FR_ERR_INVAL;
}

const char *model_loss_name(model_loss_t loss)
{
    return (unsigned)loss < 3 ? loss_names[loss] : "unknown";
}

/*
 * Parses "784-256-10" into dims[], checks every width and the output width
 * against the loss, and computes the layout offsets. On error m is left
 * zeroed and errstr says which part of the list is wrong.
 */
static fr_err_t model_init_layout(model_t *m, const char *layers, model_loss_t loss, char *errstr,
                                  size_t size);

fr_err_t model_init(model_t *m, const char *layers, model_loss_t loss, char *errstr, size_t size)
{
    fr_err_t err = model_init_layout(m, layers, loss, errstr, size);
    if (err != FR_OK)
        memset(m, 0, sizeof(*m));
    return err;
}

static fr_err_t model_init_layout(model_t *m, const char *layers, model_loss_t loss, char *errstr,
                                  size_t size)
{
    memset(m, 0, sizeof(*m));
    if ((unsigned)loss > MODEL_LOSS_MSE)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "model: unknown loss %d", (int)loss);
    int ndims;
    fr_err_t err = fr_layers_parse(layers, m->dims, &ndims, errstr, size);
    if (err != FR_OK)
        return err;
    int out = m->dims[ndims - 1];
    if (loss == MODEL_LOSS_SOFTMAX && out < 2)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "model: softmax needs at least 2 outputs, '%s' has %d", layers, out);
    if (loss != MODEL_LOSS_SOFTMAX && out != 1)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "model: %s needs exactly 1 output, '%s' has %d", model_loss_name(loss),
                         layers, out);
    m->nlayers = ndims - 1;
    m->loss = loss;
    size_t off = 0;
    for (int l = 0; l < m->nlayers; l++) {
        m->w_off[l] = off;
        off += (size_t)m->dims[l + 1] * (size_t)m->dims[l];
        m->b_off[l] = off;
        off += (size_t)m->dims[l + 1];
        if (off > MODEL_MAX_PARAMS) {
            return fr_errorf(FR_ERR_INVAL, errstr, size, "model: '%s' has more than %u parameters",
                             layers, MODEL_MAX_PARAMS);
        }
    }
    m->nparams = off;
    return FR_OK;
}

void model_layers(const model_t *m, char *buf, size_t size)
{
    size_t off = 0;
    if (size == 0)
        return;
    buf[0] = '\0';
    for (int i = 0; i <= m->nlayers && off < size; i++) {
        int n = snprintf(buf + off, size - off, i ? "-%d" : "%d", m->dims[i]);
        if (n < 0)
            break;
        off += (size_t)n;
    }
}

int model_equal(const model_t *a, const model_t *b)
{
    if (a->nlayers != b->nlayers || a->loss != b->loss)
        return 0;
    for (int i = 0; i <= a->nlayers; i++)
        if (a->dims[i] != b->dims[i])
            return 0;
    return 1;
}

/*
 * He-uniform weights (bound sqrt(6 / fan_in), suited to ReLU) and zero
 * biases, drawn in layout order so that the result depends on the seed and
 * the layer list only.
 */
void model_params_init(const model_t *m, float *w, uint64_t seed)
{
    fr_rng_t rng;
    fr_rng_seed(&rng, seed);
    for (int l = 0; l < m->nlayers; l++) {
        double bound = sqrt(6.0 / (double)m->dims[l]);
        size_t nw = (size_t)m->dims[l + 1] * (size_t)m->dims[l];
        float *W = w + m->w_off[l];
        for (size_t i = 0; i < nw; i++)
            W[i] = (float)((2.0 * fr_rng_uniform(&rng) - 1.0) * bound);
        memset(w + m->b_off[l], 0, (size_t)m->dims[l + 1] * sizeof(float));
    }
}
