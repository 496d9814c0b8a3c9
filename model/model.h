/*
 * model.h - the one public header of the model module: what a model is,
 * independent of who trains or serves it. The layer spec and loss, the
 * flat parameter layout, seeded initialisation, the loss names, and model
 * files (safetensors). Needs common/ only, so the trainer, the store's
 * users, serve and the command share one description.
 *
 * Parameter layout (docs/design.md "Model and backends"): one contiguous float32
 * vector; for each layer l = 0..nlayers-1, W_l row-major [dims[l+1] x
 * dims[l]] then b_l [dims[l+1]]. ReLU between layers, none after the last.
 *
 * Threads: a model_t is immutable once initialised and may be shared; the
 * functions are reentrant.
 */
#ifndef FRESHET_MODEL_H
#define FRESHET_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MODEL_MAX_LAYERS (FR_LAYERS_MAX - 1) /* weight layers; dims has one more */
#define MODEL_MAX_WIDTH  FR_WIDTH_MAX        /* widest layer                    */
#define MODEL_MAX_PARAMS (1u << 30)          /* floats in the parameter vector       */

typedef enum model_loss {
    MODEL_LOSS_SOFTMAX = 0,  /* cross-entropy over dims[L] >= 2 classes      */
    MODEL_LOSS_LOGISTIC = 1, /* binary cross-entropy with logits, 1 output   */
    MODEL_LOSS_MSE = 2,      /* mean squared error, 1 output                 */
} model_loss_t;

fr_err_t model_loss_parse(const char *name, model_loss_t *loss);
const char *model_loss_name(model_loss_t loss);

typedef struct model model_t;

struct model {
    int nlayers;                    /* weight layers L >= 1          */
    int dims[MODEL_MAX_LAYERS + 1]; /* dims[0] inputs .. dims[L] outputs */
    model_loss_t loss;
    size_t nparams;                 /* floats in the flat vector     */
    size_t w_off[MODEL_MAX_LAYERS]; /* offset of W_l                 */
    size_t b_off[MODEL_MAX_LAYERS]; /* offset of b_l                 */
};

/* Parses a layer list such as "784-256-10" and checks it against the loss
 * (softmax needs >= 2 outputs; logistic and mse exactly 1). */
fr_err_t model_init(model_t *m, const char *layers, model_loss_t loss, char *errstr, size_t size);
/* Writes "784-256-10" into buf (always NUL-terminated). */
void model_layers(const model_t *m, char *buf, size_t size);
/* Nonzero when a and b have the same layers and loss. */
int model_equal(const model_t *a, const model_t *b);

/* Seeded He-uniform initialisation: W_l ~ U(-sqrt(6/dims[l]), +sqrt(6/dims[l]))
 * drawn in layout order from fr_rng seeded with seed, b_l = 0. The same seed
 * gives the same weights everywhere. */
void model_params_init(const model_t *m, float *w, uint64_t seed);

/* ------------------------------------------------------------------------
 * Predictions (forward.c): ReLU between layers, then the loss's link.
 * ---------------------------------------------------------------------- */
/* Floats of scratch model_forward needs for n samples. */
size_t model_forward_scratch(const model_t *m, size_t n);
/* The predictions for n samples x [n x dims[0]] (row-major) under weights
 * w, into out [n x dims[L]]: the class probabilities (softmax), the
 * probability of class 1 (logistic) or the score (mse). */
void model_forward(const model_t *m, const float *w, const float *x, size_t n, float *out,
                   float *scratch);

/* ------------------------------------------------------------------------
 * Model files: safetensors with tensors layers.{i}.weight [out, in] and
 * layers.{i}.bias [out] (F32) and metadata format=pt, freshet.layers,
 * freshet.loss, plus the extra pairs given.
 * ---------------------------------------------------------------------- */
/* Encodes w into a safetensors image; *out is malloc'ed, caller frees. */
fr_err_t model_encode(const model_t *m, const float *w, const fr_st_kv_t *extra, size_t nextra,
                      uint8_t **out, size_t *len, char *errstr, size_t size);
fr_err_t model_save(const char *path, const model_t *m, const float *w, const fr_st_kv_t *extra,
                    size_t nextra, char *errstr, size_t size);

/* Reads a model file. The layers come from freshet.layers or, in a file
 * without it (written by PyTorch, say), from the tensor shapes; the loss
 * from freshet.loss, else from *loss_hint (NULL: the file must say). Every
 * tensor must be F32 with the shape of the layout, and no other tensor may
 * be present. On success *w is malloc'ed [m->nparams], caller frees. */
fr_err_t model_load(const char *path, const model_loss_t *loss_hint, model_t *m, float **w,
                    char *errstr, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_MODEL_H */
