/*
 * backend.c - backend registry and the thin wrapper every caller uses. The
 * CUDA backend is a module, libfreshet_cuda.so (cuda/cuda.cmake), loaded
 * the first time a backend needs it: linked into the program, cuBLAS's
 * constructors cost every command about 0.35 s of CPU and 100 MB at start,
 * GPU or not (docs/design.md "The CUDA module"). FRESHET_HAVE_CUDA, set
 * when it is built, is the one #ifdef of the build.
 */
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef FRESHET_HAVE_CUDA
#include <dlfcn.h>
#include <pthread.h>
#endif

#include "model/model.h"
#include "trainer/trainer_int.h"

struct trainer_backend {
    const trainer_backend_ops_t *ops;
    void *state;
    int max_batch;
    size_t features; /* dims[0]: floats per sample */
    char errstr[256];
};

#define CUDA_MODULE "libfreshet_cuda.so"

const char *trainer_backends_built(void)
{
#ifdef FRESHET_HAVE_CUDA
    return "cpu cuda";
#else
    return "cpu";
#endif
}

#ifdef FRESHET_HAVE_CUDA
/* path = the folder of the running program + "/" + rel; 0 when it does not
 * fit or /proc/self/exe cannot be read */
static int beside_program(char *path, size_t size, const char *rel)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return 0;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash == NULL)
        return 0;
    *slash = '\0';
    int len = snprintf(path, size, "%s/%s", exe, rel);
    return len > 0 && (size_t)len < size;
}

/* 1 when path names a readable file, which path then names without "..". */
static int readable(char *path, size_t size)
{
    char real[PATH_MAX];
    if (access(path, R_OK) != 0)
        return 0;
    if (realpath(path, real) != NULL && strlen(real) < size)
        memcpy(path, real, strlen(real) + 1);
    return 1;
}
#endif

int trainer_cuda_module(char *path, size_t size)
{
    if (size > 0)
        path[0] = '\0';
#ifdef FRESHET_HAVE_CUDA
    const char *env = getenv("FRESHET_CUDA_MODULE");
    if (env != NULL && env[0] != '\0') {
        snprintf(path, size, "%s", env);
        return readable(path, size); /* absolute: dlopen would search a bare name */
    }
    if (beside_program(path, size, CUDA_MODULE) && readable(path, size))
        return 1;
    if (beside_program(path, size, FRESHET_CUDA_MODULE_REL) && readable(path, size))
        return 1;
    /* the build tree's module, for the programs inside it only (the tests
     * in build/tests/): an installed program never picks up a stale one */
    char dir[PATH_MAX];
    size_t nb = strlen(FRESHET_CUDA_BUILD_DIR);
    if (beside_program(dir, sizeof(dir), "") && strncmp(dir, FRESHET_CUDA_BUILD_DIR, nb) == 0 &&
        dir[nb] == '/') {
        snprintf(path, size, "%s", FRESHET_CUDA_MODULE_BUILT);
        if (readable(path, size))
            return 1;
    }
    path[0] = '\0';
#endif
    return 0;
}

#ifdef FRESHET_HAVE_CUDA
static pthread_mutex_t cuda_lock = PTHREAD_MUTEX_INITIALIZER;
static const trainer_backend_ops_t *cuda_ops; /* once loaded: never unloaded */

/* The CUDA backend from its module, loaded once; NULL with errstr when it
 * cannot be (not found, not loadable, from another build). A failure is
 * not remembered: the next call tries again. */
static const trainer_backend_ops_t *cuda_backend(char *errstr, size_t size)
{
    pthread_mutex_lock(&cuda_lock);
    const trainer_backend_ops_t *ops = cuda_ops;
    char path[PATH_MAX];
    if (ops != NULL) {
        /* loaded before */
    } else if (!trainer_cuda_module(path, sizeof(path)) && path[0] != '\0') {
        fr_errorf(FR_ERR_UNSUPPORTED, errstr, size,
                  "backend cuda: FRESHET_CUDA_MODULE names %s, which cannot be read", path);
    } else if (path[0] == '\0') {
        fr_errorf(FR_ERR_UNSUPPORTED, errstr, size,
                  "backend cuda: its module %s is not installed (looked beside the program, in "
                  "%s relative to it and in %s; FRESHET_CUDA_MODULE may name it)",
                  CUDA_MODULE, FRESHET_CUDA_MODULE_REL, FRESHET_CUDA_MODULE_BUILT);
    } else {
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        const trainer_backend_module_t *mod = h != NULL ? dlsym(h, "fcuda_module") : NULL;
        if (h == NULL) {
            fr_errorf(FR_ERR_UNSUPPORTED, errstr, size, "backend cuda: cannot load %s: %s", path,
                      dlerror());
        } else if (mod == NULL) {
            fr_errorf(FR_ERR_UNSUPPORTED, errstr, size,
                      "backend cuda: %s is no freshet CUDA module (%s)", path, dlerror());
            dlclose(h);
        } else if (mod->abi != TRAINER_BACKEND_ABI ||
                   mod->ops_size != sizeof(trainer_backend_ops_t) ||
                   mod->model_size != sizeof(model_t)) {
            fr_errorf(FR_ERR_UNSUPPORTED, errstr, size,
                      "backend cuda: %s is from another build of freshet (interface %d, this "
                      "program's %d)",
                      path, mod->abi, TRAINER_BACKEND_ABI);
            dlclose(h);
        } else {
            ops = cuda_ops = mod->ops;
            fr_log(FR_LOG_DEBUG, "trainer: CUDA backend loaded from %s", path);
        }
    }
    pthread_mutex_unlock(&cuda_lock);
    return ops;
}

/* A device node of NVIDIA's driver (or WSL's GPU node): without one no CUDA
 * device can be present, so "auto" does not load the module to ask. */
static int gpu_device_node(void)
{
    return access("/dev/nvidiactl", F_OK) == 0 || access("/dev/dxg", F_OK) == 0;
}
#endif

/*
 * Resolves "auto" to cuda when that backend is built and sees a device,
 * else cpu, logging the fallback once per process.
 */
static const trainer_backend_ops_t *resolve(const char *name, char *errstr, size_t size)
{
    if (strcmp(name, "auto") == 0) {
        static atomic_int fallback_logged;
        const char *why = "this build has no CUDA backend";
#ifdef FRESHET_HAVE_CUDA
        char err[512];
        const trainer_backend_ops_t *cuda = NULL;
        why = "no CUDA device present";
        if (gpu_device_node()) {
            cuda = cuda_backend(err, sizeof(err));
            if (cuda == NULL)
                why = err;
        }
        if (cuda != NULL && cuda->available())
            return cuda;
#endif
        if (atomic_exchange(&fallback_logged, 1) == 0)
            fr_log(FR_LOG_INFO, "trainer: backend auto: %s, using cpu", why);
        return &trainer_cpu_ops;
    }
    const trainer_backend_ops_t *ops = NULL;
    if (strcmp(name, "cpu") == 0) {
        ops = &trainer_cpu_ops;
    } else if (strcmp(name, "cuda") == 0) {
#ifdef FRESHET_HAVE_CUDA
        if ((ops = cuda_backend(errstr, size)) == NULL)
            return NULL;
#else
        fr_errorf(FR_ERR_UNSUPPORTED, errstr, size,
                  "backend cuda: this build has no CUDA backend (built: %s)",
                  trainer_backends_built());
        return NULL;
#endif
    } else {
        fr_errorf(FR_ERR_INVAL, errstr, size, "unknown backend '%s' (expected auto, cpu or cuda)",
                  name);
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
