/*
 * trainer.h - the public header of the trainer module: the compute
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

/* Writes to path (size bytes) the CUDA module a "cuda" backend would load
 * and returns 1, or returns 0 when there is none to load (no CUDA backend
 * built, or its module not found: path is then "", or the unreadable file
 * $FRESHET_CUDA_MODULE names). The module is looked for beside the
 * program, in the installed library folder relative to the program's
 * (lib/freshet/ beside bin/), then in the build tree. Loads nothing. */
int trainer_cuda_module(char *path, size_t size);

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
 * The worker pool's settings (poolconf.c): pure, so in every build; the
 * pool itself is trainer/pool.h.
 * ---------------------------------------------------------------------- */
/* Parses "[trainer] slowdown" ("<worker>:<factor>[:<seconds>],...", worker
 * in [0, n), factor >= 1, seconds > 0: slowed for the run's first seconds
 * only) into factors[n] (1 for the others) and seconds[n] (0: the whole
 * run; seconds may be NULL). FR_ERR_INVAL with errstr. */
fr_err_t trainer_slowdown_parse_timed(const char *text, int n, double *factors, double *seconds,
                                      char *errstr, size_t size);
/* The same without the durations. */
fr_err_t trainer_slowdown_parse(const char *text, int n, double *factors, char *errstr,
                                size_t size);
/* Parses "[trainer] devices" ("0,0,1"; empty: every worker on device 0)
 * into devices[n]; a shorter list repeats. FR_ERR_INVAL with errstr. */
fr_err_t trainer_devices_parse(const char *text, int n, int *devices, char *errstr, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_TRAINER_H */
