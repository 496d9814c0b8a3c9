/*
 * backend.h - the compute backend interface: the only compute API of
 * freshet. A backend turns a batch into the gradient of the batch-mean loss
 * with respect to the flat parameter vector, and evaluates loss and
 * accuracy. The CPU backend (OpenBLAS) is always built; the CUDA backend
 * (cuda/) registers itself here where the build has it.
 *
 * Shapes: x is row-major [n x dims[0]], y is [n] (class index as a float
 * for softmax, 0..1 for logistic, the target for mse), grad and w are
 * [nparams] in the layout of model/model.h.
 *
 * Threads: a backend instance belongs to one thread (one worker). Distinct
 * instances may run concurrently.
 */
#ifndef FRESHET_TRAINER_BACKEND_H
#define FRESHET_TRAINER_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The operations a backend implements. Every function returns FR_OK or an
 * error and then fills errstr (size bytes) with a one-line reason. */
typedef struct trainer_backend_ops {
    const char *name; /* "cpu", "cuda" */

    /* Nonzero when the backend can run here (a device is present). */
    int (*available)(void);

    /* Creates the state for model m (borrowed for the life of the state),
     * batches of at most max_batch samples, on device (ignored by cpu).
     * All buffers are allocated here, once. */
    fr_err_t (*create)(void **state, const model_t *m, int max_batch, int device, char *errstr,
                       size_t size);
    void (*destroy)(void *state);

    /* Makes w[nparams] the weights of the following calls. A backend may
     * keep the pointer (the CPU backend reads w in place), so w must stay
     * valid until the next load or destroy; after changing w, call load
     * again (a device backend copies it then). */
    fr_err_t (*load)(void *state, const float *w, char *errstr, size_t size);

    /* grad[nparams] = d(mean loss over the n samples)/dw; *loss_sum = the sum
     * of the n per-sample losses. 1 <= n <= max_batch. */
    fr_err_t (*gradient)(void *state, float *grad, double *loss_sum, const float *x, const float *y,
                         int n, char *errstr, size_t size);

    /* *loss_sum = sum of per-sample losses; *correct = samples classified
     * right (softmax: argmax == label; logistic: (logit > 0) == (label >=
     * 0.5); mse: 0). 1 <= n <= max_batch. */
    fr_err_t (*evaluate)(void *state, double *loss_sum, int64_t *correct, const float *x,
                         const float *y, int n, char *errstr, size_t size);
} trainer_backend_ops_t;

/* The CPU backend, always present. */
extern const trainer_backend_ops_t trainer_cpu_ops;

/*
 * What the CUDA module (libfreshet_cuda.so, cuda/cuda.cmake) exports as
 * fcuda_module: trainer/backend.c refuses a module whose interface differs
 * from the program's (a module from another build). Raise
 * TRAINER_BACKEND_ABI with any change to the operations' meaning.
 */
#define TRAINER_BACKEND_ABI 1
typedef struct trainer_backend_module {
    int abi;                          /* TRAINER_BACKEND_ABI            */
    size_t ops_size;                  /* sizeof(trainer_backend_ops_t)  */
    size_t model_size;                /* sizeof(model_t)                */
    const trainer_backend_ops_t *ops; /* the backend                    */
} trainer_backend_module_t;

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_TRAINER_BACKEND_H */
