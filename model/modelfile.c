/*
 * modelfile.c - a model's weights as safetensors: one F32 tensor per layer
 * parameter (layers.{i}.weight [out, in], layers.{i}.bias [out]) in layout
 * order, with metadata format=pt, freshet.layers and freshet.loss, so that
 * PyTorch, numpy or Hugging Face readers load it as is.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

#define MAX_META 16

/*
 * Fills tensors[2 * L] (names in names[][32]) pointing into w, and the
 * metadata list: format, freshet.layers, freshet.loss, then extra.
 */
static size_t describe(const model_t *m, const float *w, fr_st_tensor_t *tensors, char (*names)[32],
                       char *layers, size_t layers_size)
{
    size_t nt = 0;
    for (int l = 0; l < m->nlayers; l++) {
        snprintf(names[nt], sizeof(names[nt]), "layers.%d.weight", l);
        tensors[nt] = (fr_st_tensor_t){.name = names[nt], .dtype = "F32", .ndim = 2};
        tensors[nt].shape[0] = m->dims[l + 1];
        tensors[nt].shape[1] = m->dims[l];
        tensors[nt].data = w + m->w_off[l];
        tensors[nt].nbytes = (size_t)m->dims[l + 1] * (size_t)m->dims[l] * sizeof(float);
        nt++;
        snprintf(names[nt], sizeof(names[nt]), "layers.%d.bias", l);
        tensors[nt] = (fr_st_tensor_t){.name = names[nt], .dtype = "F32", .ndim = 1};
        tensors[nt].shape[0] = m->dims[l + 1];
        tensors[nt].data = w + m->b_off[l];
        tensors[nt].nbytes = (size_t)m->dims[l + 1] * sizeof(float);
        nt++;
    }
    model_layers(m, layers, layers_size);
    return nt;
}

static size_t describe_meta(const model_t *m, const char *layers, const fr_st_kv_t *extra,
                            size_t nextra, fr_st_kv_t *meta)
{
    size_t nm = 0;
    meta[nm++] = (fr_st_kv_t){"format", "pt"};
    meta[nm++] = (fr_st_kv_t){"freshet.layers", layers};
    meta[nm++] = (fr_st_kv_t){"freshet.loss", model_loss_name(m->loss)};
    for (size_t i = 0; i < nextra && nm < MAX_META; i++)
        meta[nm++] = extra[i];
    return nm;
}

/* Everything a model file holds, described for the safetensors codec. */
typedef struct model_desc {
    fr_st_tensor_t tensors[2 * MODEL_MAX_LAYERS];
    char names[2 * MODEL_MAX_LAYERS][32];
    char layers[16 * (MODEL_MAX_LAYERS + 1)];
    fr_st_kv_t meta[MAX_META];
    size_t nt, nm;
} model_desc_t;

static void describe_model(model_desc_t *d, const model_t *m, const float *w,
                           const fr_st_kv_t *extra, size_t nextra)
{
    d->nt = describe(m, w, d->tensors, d->names, d->layers, sizeof(d->layers));
    d->nm = describe_meta(m, d->layers, extra, nextra, d->meta);
}

fr_err_t model_encode(const model_t *m, const float *w, const fr_st_kv_t *extra, size_t nextra,
                      uint8_t **out, size_t *len, char *errstr, size_t size)
{
    model_desc_t d;
    describe_model(&d, m, w, extra, nextra);
    return fr_st_encode(d.tensors, d.nt, d.meta, d.nm, out, len, errstr, size);
}

fr_err_t model_save(const char *path, const model_t *m, const float *w, const fr_st_kv_t *extra,
                    size_t nextra, char *errstr, size_t size)
{
    model_desc_t d;
    describe_model(&d, m, w, extra, nextra);
    return fr_st_write_file(path, d.tensors, d.nt, d.meta, d.nm, errstr, size);
}

/*
 * Layer list from the tensor shapes of a file without freshet.layers:
 * layers.0.weight [d1, d0], layers.1.weight [d2, d1], ...
 */
static fr_err_t infer_layers(const fr_st_file_t *st, char *buf, size_t bufsize, char *errstr,
                             size_t size)
{
    size_t off = 0;
    for (int l = 0; l <= MODEL_MAX_LAYERS; l++) {
        char name[32];
        snprintf(name, sizeof(name), "layers.%d.weight", l);
        const fr_st_tensor_t *t = fr_st_find(st, name);
        if (t == NULL) {
            if (l == 0)
                return fr_errorf(FR_ERR_PARSE, errstr, size,
                                 "model file: no tensor layers.0.weight and no freshet.layers");
            return FR_OK;
        }
        if (t->ndim != 2)
            return fr_errorf(FR_ERR_PARSE, errstr, size, "model file: %s is not a matrix", name);
        int n = l == 0 ? snprintf(buf + off, bufsize - off, "%lld-%lld", (long long)t->shape[1],
                                  (long long)t->shape[0])
                       : snprintf(buf + off, bufsize - off, "-%lld", (long long)t->shape[0]);
        if (n < 0 || (size_t)n >= bufsize - off)
            return fr_errorf(FR_ERR_PARSE, errstr, size, "model file: too many layers");
        off += (size_t)n;
    }
    return FR_OK;
}

/* Checks one tensor's dtype and shape and copies it into dst. */
static fr_err_t take_tensor(const fr_st_file_t *st, const char *name, int64_t rows, int64_t cols,
                            float *dst, char *errstr, size_t size)
{
    const fr_st_tensor_t *t = fr_st_find(st, name);
    if (t == NULL)
        return fr_errorf(FR_ERR_PARSE, errstr, size, "model file: missing tensor %s", name);
    if (strcmp(t->dtype, "F32") != 0)
        return fr_errorf(FR_ERR_PARSE, errstr, size, "model file: %s has dtype %s, expected F32",
                         name, t->dtype);
    int want_ndim = cols > 0 ? 2 : 1;
    if (t->ndim != want_ndim || t->shape[0] != rows || (cols > 0 && t->shape[1] != cols)) {
        if (cols > 0)
            return fr_errorf(FR_ERR_PARSE, errstr, size,
                             "model file: %s has the wrong shape, expected [%lld, %lld]", name,
                             (long long)rows, (long long)cols);
        return fr_errorf(FR_ERR_PARSE, errstr, size,
                         "model file: %s has the wrong shape, expected [%lld]", name,
                         (long long)rows);
    }
    memcpy(dst, t->data, t->nbytes);
    for (size_t i = 0; i < t->nbytes / sizeof(float); i++) {
        if (!isfinite(dst[i]))
            return fr_errorf(FR_ERR_NONFINITE, errstr, size,
                             "model file: %s has a non-finite value at index %zu", name, i);
    }
    return FR_OK;
}

fr_err_t model_load(const char *path, const model_loss_t *loss_hint, model_t *m, float **w,
                    char *errstr, size_t size)
{
    char layers[16 * (MODEL_MAX_LAYERS + 1)];
    fr_err_t err;
    *w = NULL;
    fr_st_file_t *st = fr_st_read_file(path, errstr, size);
    if (st == NULL)
        return FR_ERR_PARSE;
    const char *meta_layers = fr_st_meta(st, "freshet.layers");
    const char *meta_loss = fr_st_meta(st, "freshet.loss");
    model_loss_t loss;
    if (meta_loss != NULL) {
        if (model_loss_parse(meta_loss, &loss) != FR_OK) {
            err = fr_errorf(FR_ERR_PARSE, errstr, size, "%s: unknown freshet.loss '%s'", path,
                            meta_loss);
            goto err;
        }
    } else if (loss_hint != NULL) {
        loss = *loss_hint;
    } else {
        err = fr_errorf(FR_ERR_PARSE, errstr, size,
                        "%s: no freshet.loss in the metadata; say which loss (--loss)", path);
        goto err;
    }
    if (meta_layers != NULL) {
        snprintf(layers, sizeof(layers), "%s", meta_layers);
    } else if ((err = infer_layers(st, layers, sizeof(layers), errstr, size)) != FR_OK) {
        goto err;
    }
    if ((err = model_init(m, layers, loss, errstr, size)) != FR_OK)
        goto err;
    if (fr_st_count(st) != 2 * (size_t)m->nlayers) {
        err = fr_errorf(FR_ERR_PARSE, errstr, size, "%s: %zu tensors, a %s model has %d", path,
                        fr_st_count(st), layers, 2 * m->nlayers);
        goto err;
    }
    *w = malloc(m->nparams * sizeof(float));
    if (*w == NULL) {
        err = fr_errorf(FR_ERR_NOMEM, errstr, size, "%s: out of memory", path);
        goto err;
    }
    for (int l = 0; l < m->nlayers; l++) {
        char name[32];
        snprintf(name, sizeof(name), "layers.%d.weight", l);
        err = take_tensor(st, name, m->dims[l + 1], m->dims[l], *w + m->w_off[l], errstr, size);
        if (err != FR_OK)
            goto err;
        snprintf(name, sizeof(name), "layers.%d.bias", l);
        err = take_tensor(st, name, m->dims[l + 1], 0, *w + m->b_off[l], errstr, size);
        if (err != FR_OK)
            goto err;
    }
    fr_st_destroy(st);
    return FR_OK;
err:
    free(*w);
    *w = NULL;
    fr_st_destroy(st);
    return err;
}
