/*
 * trainer.h - the one public header of the trainer module: the model spec
 * and its flat parameter layout, seeded initialisation, model files
 * (safetensors), the compute backends and a double-precision reference
 * implementation used to check them.
 *
 * Parameter layout (docs/design.md "Model and backends"): one contiguous float32
 * vector; for each layer l = 0..nlayers-1, W_l row-major [dims[l+1] x
 * dims[l]] then b_l [dims[l+1]]. ReLU between layers, none after the last.
 *
 * Threads: a trainer_model_t is immutable once initialised and may be shared;
 * a backend instance belongs to one thread.
 */
#ifndef FRESHET_TRAINER_H
#define FRESHET_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "ingest/ingest.h"
#include "psstore/psstore.h"
#include "trainer/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TRAINER_MAX_LAYERS (FR_LAYERS_MAX - 1) /* weight layers; dims has one more */
#define TRAINER_MAX_WIDTH  FR_WIDTH_MAX        /* widest layer                    */
#define TRAINER_MAX_PARAMS (1u << 30)          /* floats in the parameter vector       */

typedef enum trainer_loss {
    TRAINER_LOSS_SOFTMAX = 0,  /* cross-entropy over dims[L] >= 2 classes      */
    TRAINER_LOSS_LOGISTIC = 1, /* binary cross-entropy with logits, 1 output   */
    TRAINER_LOSS_MSE = 2,      /* mean squared error, 1 output                 */
} trainer_loss_t;

fr_err_t trainer_loss_parse(const char *name, trainer_loss_t *loss);
const char *trainer_loss_name(trainer_loss_t loss);

struct trainer_model {
    int nlayers;                      /* weight layers L >= 1          */
    int dims[TRAINER_MAX_LAYERS + 1]; /* dims[0] inputs .. dims[L] outputs */
    trainer_loss_t loss;
    size_t nparams;                   /* floats in the flat vector     */
    size_t w_off[TRAINER_MAX_LAYERS]; /* offset of W_l                 */
    size_t b_off[TRAINER_MAX_LAYERS]; /* offset of b_l                 */
};

/* Parses a layer list such as "784-256-10" and checks it against the loss
 * (softmax needs >= 2 outputs; logistic and mse exactly 1). */
fr_err_t trainer_model_init(trainer_model_t *m, const char *layers, trainer_loss_t loss,
                            char *errstr, size_t size);
/* Writes "784-256-10" into buf (always NUL-terminated). */
void trainer_model_layers(const trainer_model_t *m, char *buf, size_t size);
/* Nonzero when a and b have the same layers and loss. */
int trainer_model_equal(const trainer_model_t *a, const trainer_model_t *b);
/* The record schema of the model's input: features, label rule, classes. */
void trainer_model_schema(const trainer_model_t *m, ingest_schema_t *schema);

/* Seeded He-uniform initialisation: W_l ~ U(-sqrt(6/dims[l]), +sqrt(6/dims[l]))
 * drawn in layout order from fr_rng seeded with seed, b_l = 0. The same seed
 * gives the same weights everywhere. */
void trainer_params_init(const trainer_model_t *m, float *w, uint64_t seed);

/* ------------------------------------------------------------------------
 * Model files: safetensors with tensors layers.{i}.weight [out, in] and
 * layers.{i}.bias [out] (F32) and metadata format=pt, freshet.layers,
 * freshet.loss, plus the extra pairs given.
 * ---------------------------------------------------------------------- */
/* Encodes w into a safetensors image; *out is malloc'ed, caller frees. */
fr_err_t trainer_model_encode(const trainer_model_t *m, const float *w, const fr_st_kv_t *extra,
                              size_t nextra, uint8_t **out, size_t *len, char *errstr, size_t size);
fr_err_t trainer_model_save(const char *path, const trainer_model_t *m, const float *w,
                            const fr_st_kv_t *extra, size_t nextra, char *errstr, size_t size);

/* Reads a model file. The layers come from freshet.layers or, in a file
 * without it (written by PyTorch, say), from the tensor shapes; the loss
 * from freshet.loss, else from *loss_hint (NULL: the file must say). Every
 * tensor must be F32 with the shape of the layout, and no other tensor may
 * be present. On success *w is malloc'ed [m->nparams], caller frees. */
fr_err_t trainer_model_load(const char *path, const trainer_loss_t *loss_hint, trainer_model_t *m,
                            float **w, char *errstr, size_t size);

/* ------------------------------------------------------------------------
 * Backends (see backend.h for the operations).
 * ---------------------------------------------------------------------- */
typedef struct trainer_backend trainer_backend_t;

/* Creates a backend by name: "cpu", "cuda", or "auto" (cuda when a device
 * is present, cpu otherwise; the fallback is logged once per process).
 * NULL with errstr when the name is unknown, the backend is not built or
 * has no device, or creation fails. Caller frees with
 * trainer_backend_destroy(). */
trainer_backend_t *trainer_backend_new(const char *name, const trainer_model_t *m, int max_batch,
                                       int device, char *errstr, size_t size);
void trainer_backend_destroy(trainer_backend_t *b);
const char *trainer_backend_name(const trainer_backend_t *b);
/* The names of the backends this build has, e.g. "cpu" or "cpu cuda". */
const char *trainer_backends_built(void);

/* See trainer_backend_ops_t. Errors are also kept in trainer_backend_error(). */
fr_err_t trainer_backend_load(trainer_backend_t *b, const float *w);
fr_err_t trainer_backend_gradient(trainer_backend_t *b, float *grad, double *loss_sum,
                                  const float *x, const float *y, int n);
/* Evaluates any number of samples, in chunks of the backend's max batch. */
fr_err_t trainer_backend_evaluate(trainer_backend_t *b, double *loss_sum, int64_t *correct,
                                  const float *x, const float *y, size_t n);
const char *trainer_backend_error(const trainer_backend_t *b);

/* ------------------------------------------------------------------------
 * Double-precision plain-loop reference of the forward and backward pass,
 * the yardstick for every backend (tests, parity checks). grad[nparams] =
 * d(mean loss)/dw; returns the summed loss in *loss_sum. Allocates its own
 * scratch; FR_ERR_NOMEM on failure, FR_ERR_RANGE for a softmax label that is
 * not a class.
 * ---------------------------------------------------------------------- */
fr_err_t trainer_reference_gradient(const trainer_model_t *m, double *grad, double *loss_sum,
                                    const double *w, const double *x, const double *y, int n);

/* ------------------------------------------------------------------------
 * Workers (worker.c; needs the services, so not in FRESHET_CORE_ONLY
 * builds): W threads, each with its own backend and store client, that
 * take batches from a consumer, pull the weights when the store moved,
 * compute the gradient and push it with the version read and the batch's
 * positions (docs/design.md "Data flow"). Every worker heartbeats into the
 * members hash. Modes async and adaptive: a worker never waits for
 * another; sync, backup, groups: after a push it waits until its group's
 * round closes; ssp: it does not start a step while its clock is more than
 * ssp_bound ahead of the slowest live, non-idle member.
 * ---------------------------------------------------------------------- */
typedef struct trainer_pool trainer_pool_t;

typedef struct trainer_pool_conf {
    const char *redis_url;
    const char *model;         /* the model's name in the store          */
    const trainer_model_t *m;  /* its layers and loss (copied)           */
    const char *backend;       /* auto | cpu | cuda                      */
    const int *devices;        /* [workers] CUDA device each, NULL: 0    */
    int workers;               /* >= 1                                   */
    int max_batch;             /* the consumer's batch size              */
    int64_t max_pending;       /* [psstore] max_pending                  */
    const double *slowdown;    /* [workers] factors >= 1, NULL: none     */
    ingest_consumer_t *source; /* borrowed; batches come from here       */
    fr_metrics_t *metrics;     /* may be NULL                            */
    psstore_mode_t mode;       /* [trainer] mode (async by default)      */
    int groups;                /* mode groups: worker i is in i % groups */
    int64_t ssp_bound;         /* mode ssp: clocks ahead of the slowest  */
    int64_t idle_ms;           /* waiting this long for data: idle       */
    int64_t round_wait_ms;     /* longest wait for a round to close      */
    psstore_local_t *local;    /* freshet run's in-process channel, or NULL */
} trainer_pool_conf_t;

typedef struct trainer_pool_stats {
    uint64_t samples;    /* samples whose gradients were pushed                 */
    uint64_t batches;    /* batches pushed (n = 0 ones included)                */
    uint64_t pulls;      /* weight pulls that brought a new version             */
    uint64_t failed;     /* batches abandoned (push or compute failed)          */
    double loss_sum;     /* summed training loss of the pushed samples          */
    uint64_t compute_ns; /* summed forward and backward time of the workers */
    uint64_t push_ns;    /* summed push time (backpressure waits included) */
    uint64_t wait_ns;    /* summed waits for rounds (round modes) and clocks (ssp) */
    int64_t version;     /* the newest version a worker computed on             */
    uint64_t epoch;      /* ... and its epoch                                   */
} trainer_pool_stats_t;

/* Creates the workers' backends and store clients (NULL with errstr when a
 * backend or Redis fails; the model must exist with m's size). */
trainer_pool_t *trainer_pool_new(const trainer_pool_conf_t *conf, char *errstr, size_t size);
/* Starts the worker threads; FR_ERR_STATE when started already. */
fr_err_t trainer_pool_start(trainer_pool_t *p);
/* Stops taking batches, lets each worker finish the batch in hand, joins
 * them. Idempotent. */
void trainer_pool_stop(trainer_pool_t *p);
void trainer_pool_destroy(trainer_pool_t *p);
/* Counters summed over the workers; any thread. */
void trainer_pool_stats(trainer_pool_t *p, trainer_pool_stats_t *st);
/* The pure parts (poolconf.c, in every build). Parses "[trainer]
 * slowdown" ("<worker>:<factor>,...", worker in [0, n),
 * factor >= 1) into factors[n] (1 for the others). FR_ERR_INVAL with
 * errstr. */
fr_err_t trainer_slowdown_parse(const char *text, int n, double *factors, char *errstr,
                                size_t size);
/* Parses "[trainer] devices" ("0,0,1"; empty: every worker on device 0)
 * into devices[n]; a shorter list repeats. FR_ERR_INVAL with errstr. */
fr_err_t trainer_devices_parse(const char *text, int n, int *devices, char *errstr, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_TRAINER_H */
