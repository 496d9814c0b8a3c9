/*
 * bench_step.c - one training step of the CPU backend (gradient + sgd
 * update) against its floor measured in the same run: the bare sgemm calls
 * of the same shapes. The ratio says how much the step costs beyond the
 * matrix products it cannot avoid.
 *
 * Then THREADS (2) threads of one process step at once, each on its own
 * weights and backend as freshet run's workers do, and their sum is
 * compared with one thread.
 *
 * usage: [THREADS=N] bench_step [LAYERS] [BATCH] [SECONDS]   (default 784-256-10 64 2)
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/update/update.h"
#include "trainer/trainer.h"
#include "trainer/trainer_int.h"

/* Runs fn until seconds pass; returns calls per second. */
static double rate(void (*fn)(void *), void *arg, double seconds)
{
    for (int i = 0; i < 5; i++)
        fn(arg); /* warm caches and pages */
    uint64_t t0 = fr_clock_mono_ns(), t;
    long calls = 0;
    do {
        fn(arg);
        calls++;
        t = fr_clock_mono_ns();
    } while ((double)(t - t0) * 1e-9 < seconds);
    return (double)calls / ((double)(t - t0) * 1e-9);
}

typedef struct bench {
    model_t m;
    trainer_backend_t *b;
    float *w, *g, *x, *y, *scratch;
    int batch;
} bench_t;

static void step(void *arg)
{
    bench_t *s = arg;
    double loss;
    if (trainer_backend_gradient(s->b, s->g, &loss, s->x, s->y, s->batch) != FR_OK) {
        fprintf(stderr, "bench_step: %s\n", trainer_backend_error(s->b));
        exit(1);
    }
    psstore_optim_step(PSSTORE_OPTIM_SGD, s->w, NULL, s->g, s->m.nparams, 1e-3f, 0.0f);
}

/* The products a step needs: forward per layer, dW per layer, dX for l > 0. */
static void gemms(void *arg)
{
    bench_t *s = arg;
    const model_t *m = &s->m;
    for (int l = 0; l < m->nlayers; l++) {
        int k = m->dims[l], out = m->dims[l + 1];
        trainer_sgemm(0, 1, s->batch, out, k, 1.0f, s->x, k, s->w + m->w_off[l], k, 0.0f,
                      s->scratch, out);
        trainer_sgemm(1, 0, out, k, s->batch, 1.0f, s->scratch, out, s->x, k, 0.0f,
                      s->g + m->w_off[l], k);
        if (l > 0)
            trainer_sgemm(0, 0, s->batch, k, out, 1.0f, s->scratch, out, s->w + m->w_off[l], k,
                          0.0f, s->scratch + (size_t)s->batch * out, k);
    }
}

/* The backend's gradient against the double-precision reference. */
static int check_gradient(bench_t *s)
{
    size_t P = s->m.nparams, X = (size_t)s->batch * s->m.dims[0];
    double *wd = malloc(P * sizeof(double)), *gd = malloc(P * sizeof(double));
    double *xd = malloc(X * sizeof(double)), *yd = malloc((size_t)s->batch * sizeof(double));
    double loss_ref, loss;
    for (size_t i = 0; i < P; i++)
        wd[i] = s->w[i];
    for (size_t i = 0; i < X; i++)
        xd[i] = s->x[i];
    for (int i = 0; i < s->batch; i++)
        yd[i] = s->y[i];
    trainer_reference_gradient(&s->m, gd, &loss_ref, wd, xd, yd, s->batch);
    trainer_backend_gradient(s->b, s->g, &loss, s->x, s->y, s->batch);
    int bad = 0;
    for (size_t i = 0; i < P && !bad; i++)
        bad = fabs(s->g[i] - gd[i]) > 1e-4 + 1e-3 * fabs(gd[i]);
    if (bad || fabs(loss - loss_ref) > 1e-3 * fabs(loss_ref))
        fprintf(stderr, "bench_step: the gradient does not match the reference\n");
    free(wd);
    free(gd);
    free(xd);
    free(yd);
    return bad;
}

/* One thread of the in-process scaling run: its own bench, stepping for
 * `seconds`; the rate comes back in *rate. */
typedef struct worker_arg {
    bench_t *s;
    double seconds, rate, cpu_ms;
} worker_arg_t;

static void *worker(void *arg)
{
    worker_arg_t *a = arg;
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    a->rate = rate(step, a->s, a->seconds);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    double cpu = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9;
    a->cpu_ms = cpu * 1e3 / (a->rate * a->seconds + 5);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *layers = argc > 1 ? argv[1] : "784-256-10";
    bench_t s = {.batch = argc > 2 ? atoi(argv[2]) : 64};
    double seconds = argc > 3 ? atof(argv[3]) : 2.0;
    char errstr[256];
    if (s.batch < 1 ||
        model_init(&s.m, layers, MODEL_LOSS_SOFTMAX, errstr, sizeof(errstr)) != FR_OK) {
        fprintf(stderr, "usage: bench_step [LAYERS] [BATCH] [SECONDS]\n");
        return 2;
    }
    int widest = 0;
    for (int l = 0; l <= s.m.nlayers; l++)
        widest = s.m.dims[l] > widest ? s.m.dims[l] : widest;
    s.w = malloc(s.m.nparams * sizeof(float));
    s.g = malloc(s.m.nparams * sizeof(float));
    s.x = malloc((size_t)s.batch * widest * sizeof(float));
    s.y = malloc((size_t)s.batch * sizeof(float));
    s.scratch = calloc(2 * (size_t)s.batch * widest, sizeof(float));
    fr_rng_t rng;
    fr_rng_seed(&rng, 1);
    for (size_t i = 0; i < (size_t)s.batch * widest; i++)
        s.x[i] = (float)fr_rng_uniform(&rng);
    for (int i = 0; i < s.batch; i++)
        s.y[i] = (float)fr_rng_below(&rng, (uint64_t)s.m.dims[s.m.nlayers]);
    model_params_init(&s.m, s.w, 1);
    s.b = trainer_backend_new("cpu", &s.m, s.batch, 0, errstr, sizeof(errstr));
    if (s.b == NULL || trainer_backend_load(s.b, s.w) != FR_OK) {
        fprintf(stderr, "bench_step: %s\n", errstr);
        return 1;
    }
    /* validate before timing: the step's gradient against the reference */
    if (check_gradient(&s) != 0)
        return 1;
    double floor_rate = rate(gemms, &s, seconds);
    double step_rate = rate(step, &s, seconds);
    printf("bench_step: %s, batch %d, cpu backend, 1 BLAS thread\n", layers, s.batch);
    printf("  sgemm floor       %10.0f samples/s\n", floor_rate * s.batch);
    printf("  training step     %10.0f samples/s\n", step_rate * s.batch);
    printf("  step / floor      %10.2f (1.00 = nothing beyond the matrix products)\n",
           step_rate / floor_rate);
    /* W threads of one process stepping at once, each on its own weights
     * and backend, as freshet run's workers do: do they scale? */
    int nthreads = getenv("THREADS") != NULL ? atoi(getenv("THREADS")) : 2;
    if (nthreads > 1 && nthreads <= 16) {
        bench_t copies[16];
        worker_arg_t args[16];
        pthread_t tids[16];
        for (int t = 0; t < nthreads; t++) {
            copies[t] = s;
            copies[t].w = malloc(s.m.nparams * sizeof(float));
            copies[t].g = malloc(s.m.nparams * sizeof(float));
            copies[t].scratch = calloc(2 * (size_t)s.batch * widest, sizeof(float));
            memcpy(copies[t].w, s.w, s.m.nparams * sizeof(float));
            copies[t].b = trainer_backend_new("cpu", &s.m, s.batch, 0, errstr, sizeof(errstr));
            if (copies[t].b == NULL || trainer_backend_load(copies[t].b, copies[t].w) != FR_OK)
                return 1;
            args[t] = (worker_arg_t){.s = &copies[t], .seconds = seconds};
        }
        for (int t = 0; t < nthreads; t++)
            pthread_create(&tids[t], NULL, worker, &args[t]);
        double total = 0;
        for (int t = 0; t < nthreads; t++) {
            pthread_join(tids[t], NULL);
            total += args[t].rate * s.batch;
            printf("  thread %d of %d     %10.0f samples/s, %.2f ms CPU a step\n", t, nthreads,
                   args[t].rate * s.batch, args[t].cpu_ms);
            trainer_backend_destroy(copies[t].b);
            free(copies[t].w);
            free(copies[t].g);
            free(copies[t].scratch);
        }
        printf("  %d threads          %10.0f samples/s, %.2f x one thread\n", nthreads, total,
               total / (step_rate * s.batch));
    }
    trainer_backend_destroy(s.b);
    free(s.w);
    free(s.g);
    free(s.x);
    free(s.y);
    free(s.scratch);
    return 0;
}
