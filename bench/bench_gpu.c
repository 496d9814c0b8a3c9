/*
 * bench_gpu.c - training steps per second of a backend, as freshet's
 * workers take them: W threads, each with its own backend instance (its
 * own CUDA stream and cuBLAS handle, all on device 0 for cuda), each
 * computing the gradient of a batch from host samples to a host gradient,
 * over and over, for S seconds. Prints one line:
 *   "bench_gpu: LAYERS batch B workers W backend NAME: STEPS steps/s SAMPLES samples/s"
 * Random weights and data (seeded); the first step of each worker (buffer
 * set-up, graph capture) is not timed.
 *
 * usage: bench_gpu LAYERS BATCH WORKERS SECONDS [BACKEND]   (BACKEND cuda by default)
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "trainer/trainer.h"

typedef struct worker {
    pthread_t tid;
    const model_t *m;
    const char *backend;
    int batch, id;
    double seconds;
    long steps;
    int failed;
} worker_t;

static atomic_int ready, go;

static void *worker_main(void *arg)
{
    worker_t *wk = arg;
    const model_t *m = wk->m;
    char errstr[256];
    size_t nx = (size_t)wk->batch * (size_t)m->dims[0];
    float *w = malloc(m->nparams * sizeof(float)), *g = malloc(m->nparams * sizeof(float));
    float *x = malloc(nx * sizeof(float)), *y = malloc((size_t)wk->batch * sizeof(float));
    trainer_backend_t *b =
        trainer_backend_new(wk->backend, m, wk->batch, 0, errstr, sizeof(errstr));
    if (w == NULL || g == NULL || x == NULL || y == NULL || b == NULL) {
        fprintf(stderr, "bench_gpu: worker %d: %s\n", wk->id, b == NULL ? errstr : "no memory");
        wk->failed = 1;
        atomic_fetch_add(&ready, 1);
        goto out;
    }
    fr_rng_t rng;
    fr_rng_seed(&rng, 7 + (uint64_t)wk->id);
    model_params_init(m, w, 42);
    for (size_t i = 0; i < nx; i++)
        x[i] = (float)fr_rng_uniform(&rng);
    for (int i = 0; i < wk->batch; i++)
        y[i] = (float)fr_rng_below(&rng, (uint64_t)m->dims[m->nlayers]);
    double loss;
    if (trainer_backend_load(b, w) != FR_OK ||
        trainer_backend_gradient(b, g, &loss, x, y, wk->batch) != FR_OK) {
        fprintf(stderr, "bench_gpu: worker %d: %s\n", wk->id, trainer_backend_error(b));
        wk->failed = 1;
        atomic_fetch_add(&ready, 1);
        goto out;
    }
    atomic_fetch_add(&ready, 1);
    while (!atomic_load(&go))
        ;
    uint64_t t0 = fr_clock_mono_ns(), end = t0 + (uint64_t)(wk->seconds * 1e9);
    while (fr_clock_mono_ns() < end) {
        if (trainer_backend_gradient(b, g, &loss, x, y, wk->batch) != FR_OK) {
            fprintf(stderr, "bench_gpu: worker %d: %s\n", wk->id, trainer_backend_error(b));
            wk->failed = 1;
            break;
        }
        wk->steps++;
    }
out:
    trainer_backend_destroy(b);
    free(w);
    free(g);
    free(x);
    free(y);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: bench_gpu LAYERS BATCH WORKERS SECONDS [BACKEND]\n");
        return 2;
    }
    const char *layers = argv[1], *backend = argc > 5 ? argv[5] : "cuda";
    int batch = atoi(argv[2]), workers = atoi(argv[3]);
    double seconds = atof(argv[4]);
    char errstr[256];
    model_t m;
    if (batch < 1 || workers < 1 || workers > 64 || seconds <= 0 ||
        model_init(&m, layers, MODEL_LOSS_SOFTMAX, errstr, sizeof(errstr)) != FR_OK) {
        fprintf(stderr, "bench_gpu: bad arguments (%s)\n", errstr);
        return 2;
    }
    worker_t *wk = calloc((size_t)workers, sizeof(*wk));
    for (int i = 0; i < workers; i++) {
        wk[i] =
            (worker_t){.m = &m, .backend = backend, .batch = batch, .id = i, .seconds = seconds};
        pthread_create(&wk[i].tid, NULL, worker_main, &wk[i]);
    }
    while (atomic_load(&ready) < workers)
        ;
    atomic_store(&go, 1);
    long steps = 0;
    int failed = 0;
    for (int i = 0; i < workers; i++) {
        pthread_join(wk[i].tid, NULL);
        steps += wk[i].steps;
        failed |= wk[i].failed;
    }
    free(wk);
    if (failed)
        return 1;
    printf("bench_gpu: %s batch %d workers %d backend %s: %.1f steps/s %.0f samples/s\n", layers,
           batch, workers, backend, (double)steps / seconds, (double)steps * batch / seconds);
    return 0;
}
