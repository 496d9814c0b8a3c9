/*
 * trainer.h - the one public header of the trainer module: the compute
 * backends, a double-precision reference implementation used to check
 * them, and the pure parts of the worker pool's configuration. The model
 * itself (layers, layout, initialisation, model files) is model/model.h,
 * included here for the trainer's users; the worker pool is
 * trainer/pool.h.
 *
 * Threads: a backend instance belongs to one thread.
 */
#ifndef FRESHET_TRAINER_H
#define FRESHET_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "ingest/ingest.h"
#include "psstore/psstore.h"
#include "model/model.h"
#include "trainer/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The record schema of the model's input: features, label rule, classes
 * (schema.c: the bridge between the model and ingest's decoder). */
void trainer_model_schema(const model_t *m, ingest_schema_t *schema);

/* ------------------------------------------------------------------------
 * Backends (see backend.h for the operations).
 * ---------------------------------------------------------------------- */
typedef struct trainer_backend trainer_backend_t;

/* Creates a backend by name: "cpu", "cuda", or "auto" (cuda when a device
 * is present, cpu otherwise; the fallback is logged once per process).
 * NULL with errstr when the name is unknown, the backend is not built or
 * has no device, or creation fails. Caller frees with
 * trainer_backend_destroy(). */
trainer_backend_t *trainer_backend_new(const char *name, const model_t *m, int max_batch,
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
fr_err_t trainer_reference_gradient(const model_t *m, double *grad, double *loss_sum,
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
    const model_t *m;          /* its layers and loss (copied)           */
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
