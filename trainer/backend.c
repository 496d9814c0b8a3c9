/*
 * backend.c - backend registry and the thin wrapper every caller uses. The
 * CUDA backend registers here, the one #ifdef of the build.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/trainer_int.h"

#ifdef FRESHET_HAVE_CUDA
extern const trainer_backend_ops_t fcuda_backend_ops;
#endif

static const trainer_backend_ops_t *const backends[] = {
    &trainer_cpu_ops,
#ifdef FRESHET_HAVE_CUDA
    &fcuda_backend_ops,
#endif
};
#define NBACKENDS (sizeof(backends) / sizeof(backends[0]))

struct trainer_backend {
    const trainer_backend_ops_t *ops;
    void *state;
    int max_batch;
    size_t features; /* dims[0]: floats per sample */
    char errstr[256];
};

static const trainer_backend_ops_t *find_backend(const char *name)
{
    for (size_t i = 0; i < NBACKENDS; i++)
        if (strcmp(backends[i]->name, name) == 0)
            return backends[i];
    return NULL;
}

const char *trainer_backends_built(void)
{
#ifdef FRESHET_HAVE_CUDA
    return "cpu cuda";
#else
    return "cpu";
#endif
}

/*
 * Resolves "auto" to cuda when that backend is built and sees a device,
 * else cpu, logging the fallback once per process.
 */
static const trainer_backend_ops_t *resolve(const char *name, char *errstr, size_t size)
{
    static atomic_int fallback_logged;
    if (strcmp(name, "auto") == 0) {
        const trainer_backend_ops_t *cuda = find_backend("cuda");
        if (cuda != NULL && cuda->available())
            return cuda;
        if (atomic_exchange(&fallback_logged, 1) == 0)
            fr_log(FR_LOG_INFO, "trainer: backend auto: %s, using cpu",
                   cuda ? "no CUDA device present" : "this build has no CUDA backend");
        return &trainer_cpu_ops;
    }
    const trainer_backend_ops_t *ops = find_backend(name);
    if (ops == NULL) {
        if (strcmp(name, "cuda") == 0)
            fr_errorf(FR_ERR_UNSUPPORTED, errstr, size,
                      "backend cuda: this build has no CUDA backend (built: %s)",
                      trainer_backends_built());
        else
            fr_errorf(FR_ERR_INVAL, errstr, size,
                      "unknown backend '%s' (expected auto, cpu or cuda)", name);
        return NULL;
    }
    if (!ops->available()) {
        fr_errorf(FR_ERR_UNSUPPORTED, errstr, size, "backend %s: no device present", name);
        return NULL;
    }
    return ops;
}

trainer_backend_t *trainer_backend_new(const char *name, const model_t *m, int max_batch,
                                       int device, char *errstr, size_t size)
{
    const trainer_backend_ops_t *ops = resolve(name, errstr, size);
    if (ops == NULL)
        return NULL;
    trainer_backend_t *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "backend: out of memory");
        return NULL;
    }
    b->ops = ops;
    b->max_batch = max_batch;
    b->features = (size_t)m->dims[0];
    if (ops->create(&b->state, m, max_batch, device, errstr, size) != FR_OK) {
        free(b);
        return NULL;
    }
    return b;
}

void trainer_backend_destroy(trainer_backend_t *b)
{
    if (b == NULL)
        return;
    b->ops->destroy(b->state);
    free(b);
}

const char *trainer_backend_name(const trainer_backend_t *b)
{
    return b->ops->name;
}

const char *trainer_backend_error(const trainer_backend_t *b)
{
    return b->errstr;
}

fr_err_t trainer_backend_load(trainer_backend_t *b, const float *w)
{
    return b->ops->load(b->state, w, b->errstr, sizeof(b->errstr));
}

fr_err_t trainer_backend_gradient(trainer_backend_t *b, float *grad, double *loss_sum,
                                  const float *x, const float *y, int n)
{
    return b->ops->gradient(b->state, grad, loss_sum, x, y, n, b->errstr, sizeof(b->errstr));
}

fr_err_t trainer_backend_evaluate(trainer_backend_t *b, double *loss_sum, int64_t *correct,
                                  const float *x, const float *y, size_t n)
{
    *loss_sum = 0.0;
    *correct = 0;
    for (size_t i = 0; i < n; i += (size_t)b->max_batch) {
        int chunk = n - i < (size_t)b->max_batch ? (int)(n - i) : b->max_batch;
        double loss = 0.0;
        int64_t right = 0;
        fr_err_t err = b->ops->evaluate(b->state, &loss, &right, x + i * b->features, y + i, chunk,
                                        b->errstr, sizeof(b->errstr));
        if (err != FR_OK)
            return err;
        *loss_sum += loss;
        *correct += right;
    }
    return FR_OK;
}
