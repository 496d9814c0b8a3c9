/*
 * fit.c - "freshet fit": offline training from a file, for warm starts and
 * reference runs. Mini-batch training with the optimizers of the parameter
 * store, on one backend, one BLAS thread.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/app.h"
#include "psstore/update/update.h"
#include "trainer/trainer.h"

#define CMD "fit"

static void fit_usage(FILE *out)
{
    fprintf(out,
            "usage: freshet fit --layers L --data FILE --format F --out W.safetensors [options]\n"
            "\n"
            "Trains a model offline from a file and writes its weights as safetensors.\n"
            "One progress line per epoch: mean training loss and samples/s (and the\n"
            "holdout loss and accuracy with --test-data).\n"
            "\n"
            "  --layers L           layer widths, e.g. 784-256-10 (from --init when omitted)\n"
            "  --loss X             softmax | logistic | mse            (default softmax)\n"
            "  --data FILE          training data (.gz is decompressed)\n"
            "  --labels FILE        labels file (idx format only)\n"
            "  --format F           csv | libsvm | f32 | idx\n"
            "  --features D         input width; must equal the first layer width\n"
            "  --epochs E           passes over the data                (default 1)\n"
            "  --batch B            samples per step; a final partial batch is a\n"
            "                       smaller step                          (default 64)\n"
            "  --lr X               learning rate                       (default 0.05)\n"
            "  --optimizer O        sgd | momentum | adagrad            (default sgd)\n"
            "  --momentum M         momentum of --optimizer momentum    (default 0.9)\n"
            "  --seed S             seed of the initial weights and the shuffle (default 42)\n"
            "  --init W             start from these weights (safetensors)\n"
            "  --no-shuffle         use records in file order every epoch\n"
            "  --backend B          auto | cpu | cuda                   (default auto)\n"
            "  --test-data FILE     holdout set evaluated after every epoch\n"
            "  --test-labels FILE   its labels (idx format only)\n"
            "  --out W              where to write the weights (safetensors)\n"
            "  -h, --help           this text\n"
            "\n"
            "Exit status: 0 done, 1 training failed (diverged, backend error), 2 bad\n"
            "arguments or unreadable files.\n");
}

typedef struct fit_opts {
    const char *layers, *loss, *data, *labels, *format, *init, *out, *backend;
    const char *test_data, *test_labels;
    int loss_given; /* --loss was on the command line */
    long long features, epochs, batch, seed;
    double lr, momentum;
    psstore_optim_t optim;
    int shuffle;
} fit_opts_t;

static int parse_opts(fit_opts_t *o, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"layers", required_argument, NULL, 'L'},
        {"loss", required_argument, NULL, 'l'},
        {"data", required_argument, NULL, 'd'},
        {"labels", required_argument, NULL, 'y'},
        {"format", required_argument, NULL, 'f'},
        {"features", required_argument, NULL, 'D'},
        {"epochs", required_argument, NULL, 'e'},
        {"batch", required_argument, NULL, 'b'},
        {"lr", required_argument, NULL, 'r'},
        {"optimizer", required_argument, NULL, 'o'},
        {"momentum", required_argument, NULL, 'm'},
        {"seed", required_argument, NULL, 's'},
        {"init", required_argument, NULL, 'i'},
        {"no-shuffle", no_argument, NULL, 'N'},
        {"backend", required_argument, NULL, 'B'},
        {"test-data", required_argument, NULL, 't'},
        {"test-labels", required_argument, NULL, 'T'},
        {"out", required_argument, NULL, 'O'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (fit_opts_t){.loss = "softmax",
                      .backend = "auto",
                      .epochs = 1,
                      .batch = 64,
                      .seed = 42,
                      .lr = 0.05,
                      .momentum = 0.9,
                      .shuffle = 1};
    int c, rc = 0;
    app_opts_begin();
    while (rc == 0 &&
           (c = app_opts_next(CMD, argc, argv, ":h", longopts, NULL, fit_usage, &rc)) != -1) {
        switch (c) {
        case 'L': o->layers = optarg; break;
        case 'l':
            o->loss = optarg;
            o->loss_given = 1;
            break;
        case 'd': o->data = optarg; break;
        case 'y': o->labels = optarg; break;
        case 'f': o->format = optarg; break;
        case 'D': rc = app_parse_long(CMD, "--features", optarg, 1, 1 << 20, &o->features); break;
        case 'e': rc = app_parse_long(CMD, "--epochs", optarg, 1, 1000000, &o->epochs); break;
        case 'b': rc = app_parse_long(CMD, "--batch", optarg, 1, 65536, &o->batch); break;
        case 'r': rc = app_parse_double(CMD, "--lr", optarg, 1e-30, 1e6, &o->lr); break;
        case 'm':
            rc = app_parse_double(CMD, "--momentum", optarg, 0, 0.999999, &o->momentum);
            break;
        case 's': rc = app_parse_long(CMD, "--seed", optarg, 0, INT64_MAX, &o->seed); break;
        case 'o':
            if (psstore_optim_parse(optarg, &o->optim) != FR_OK)
                rc = app_usage_error(CMD, "--optimizer must be sgd, momentum or adagrad, got '%s'",
                                     optarg);
            break;
        case 'i': o->init = optarg; break;
        case 'N': o->shuffle = 0; break;
        case 'B': o->backend = optarg; break;
        case 't': o->test_data = optarg; break;
        case 'T': o->test_labels = optarg; break;
        case 'O': o->out = optarg; break;
        }
    }
    if ((rc = app_opts_end(CMD, argc, argv, rc)) != 0)
        return rc;
    if (o->data == NULL)
        return app_usage_error(CMD, "--data FILE is required");
    if (o->format == NULL)
        return app_usage_error(CMD, "--format is required (csv, libsvm, f32 or idx)");
    if (o->out == NULL)
        return app_usage_error(CMD, "--out W.safetensors is required");
    if (o->layers == NULL && o->init == NULL)
        return app_usage_error(CMD, "--layers L is required (or --init W to take them from)");
    return 0;
}

/*
 * Builds the model from --layers/--loss and the initial weights: from --init
 * (which must describe the same model) or seeded He-uniform. Returns 0 or an
 * exit status.
 */
static int initial_model(const fit_opts_t *o, model_t *m, float **w)
{
    char errstr[512];
    model_loss_t loss;
    if (model_loss_parse(o->loss, &loss) != FR_OK)
        return app_usage_error(CMD, "--loss must be softmax, logistic or mse, got '%s'", o->loss);
    /* with --init and no --loss, the file's loss decides what --layers may be */
    int check_layers = o->layers != NULL && (o->init == NULL || o->loss_given);
    if (check_layers && model_init(m, o->layers, loss, errstr, sizeof(errstr)))
        return app_usage_error(CMD, "--layers: %s", errstr);
    if (o->init != NULL) {
        model_t fm;
        if (model_load(o->init, o->loss_given ? &loss : NULL, &fm, w, errstr, sizeof(errstr)) !=
            FR_OK) {
            fprintf(stderr, "freshet %s: --init %s\n", CMD, errstr);
            return APP_EXIT_USAGE;
        }
        char want[256] = "", have[256];
        model_layers(&fm, have, sizeof(have));
        if (o->layers != NULL)
            snprintf(want, sizeof(want), "%s", o->layers);
        int layers_differ = o->layers != NULL && strcmp(want, have) != 0;
        if (layers_differ || (o->loss_given && fm.loss != loss)) {
            free(*w);
            *w = NULL;
            return app_usage_error(CMD, "--init %s holds a %s %s model, not %s %s", o->init, have,
                                   model_loss_name(fm.loss), layers_differ ? want : have,
                                   model_loss_name(o->loss_given ? loss : fm.loss));
        }
        *m = fm;
        return 0;
    }
    *w = malloc(m->nparams * sizeof(float));
    if (*w == NULL) {
        fprintf(stderr, "freshet %s: out of memory\n", CMD);
        return APP_EXIT_FAILURE;
    }
    model_params_init(m, *w, (uint64_t)o->seed);
    return 0;
}

typedef struct fit_run {
    const fit_opts_t *o;
    const model_t *m;
    trainer_backend_t *b;
    const ingest_dataset_t *train, *test;
    float *w, *grad, *state, *xb, *yb;
    uint32_t *order;
    fr_rng_t shuffle_rng;
    uint64_t steps;
} fit_run_t;

/*
 * One pass over the training set. Returns 0 and the mean training loss, or
 * an exit status after printing why.
 */
static int run_epoch(fit_run_t *r, double *mean_loss)
{
    const ingest_dataset_t *ds = r->train;
    size_t D = (size_t)ds->features, B = (size_t)r->o->batch;
    double loss_total = 0.0;
    if (r->o->shuffle)
        fr_rng_shuffle(&r->shuffle_rng, r->order, ds->n);
    for (size_t start = 0; start < ds->n; start += B) {
        size_t n = ds->n - start < B ? ds->n - start : B;
        const float *x = ds->x + start * D, *y = ds->y + start;
        if (r->o->shuffle) {
            for (size_t i = 0; i < n; i++) {
                uint32_t k = r->order[start + i];
                memcpy(r->xb + i * D, ds->x + (size_t)k * D, D * sizeof(float));
                r->yb[i] = ds->y[k];
            }
            x = r->xb;
            y = r->yb;
        }
        double loss = 0.0;
        if (trainer_backend_gradient(r->b, r->grad, &loss, x, y, (int)n) != FR_OK) {
            fprintf(stderr, "freshet %s: %s\n", CMD, trainer_backend_error(r->b));
            return APP_EXIT_FAILURE;
        }
        if (!isfinite(loss)) {
            fprintf(stderr, "freshet %s: training diverged at step %llu (loss %g); lower --lr\n",
                    CMD, (unsigned long long)r->steps + 1, loss);
            return APP_EXIT_FAILURE;
        }
        psstore_optim_step(r->o->optim, r->w, r->state, r->grad, r->m->nparams, (float)r->o->lr,
                           (float)r->o->momentum);
        /* the CPU backend reads w in place; others copy it in */
        if (trainer_backend_load(r->b, r->w) != FR_OK) {
            fprintf(stderr, "freshet %s: %s\n", CMD, trainer_backend_error(r->b));
            return APP_EXIT_FAILURE;
        }
        loss_total += loss;
        r->steps++;
    }
    *mean_loss = loss_total / (double)ds->n;
    return 0;
}

/*
 * Fails early when --out cannot be written (its directory is missing or
 * read-only), rather than after hours of training. Returns 0 or an exit
 * status.
 */
static int check_out_path(const char *out)
{
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", out);
    char *slash = strrchr(dir, '/');
    if (slash == NULL)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    if (access(dir, W_OK) != 0) {
        fprintf(stderr, "freshet %s: --out %s: cannot write into %s: %s\n", CMD, out, dir,
                strerror(errno));
        return APP_EXIT_USAGE;
    }
    return 0;
}

/* Allocates the run's buffers once, for every epoch. */
static int prepare_run(fit_run_t *r)
{
    size_t D = (size_t)r->train->features, B = (size_t)r->o->batch;
    size_t state_len = psstore_optim_state_len(r->o->optim, r->m->nparams);
    int shuffle = r->o->shuffle;
    r->grad = malloc(r->m->nparams * sizeof(float));
    r->state = calloc(state_len ? state_len : 1, sizeof(float));
    r->xb = shuffle ? malloc(B * D * sizeof(float)) : NULL;
    r->yb = shuffle ? malloc(B * sizeof(float)) : NULL;
    r->order = shuffle ? malloc(r->train->n * sizeof(uint32_t)) : NULL;
    if (!r->grad || !r->state || (shuffle && (!r->xb || !r->yb || !r->order))) {
        fprintf(stderr, "freshet %s: out of memory\n", CMD);
        return APP_EXIT_FAILURE;
    }
    fr_mem_touch(r->grad, r->m->nparams * sizeof(float));
    fr_mem_touch(r->state, (state_len ? state_len : 1) * sizeof(float));
    if (shuffle) {
        fr_mem_touch(r->xb, B * D * sizeof(float));
        for (size_t i = 0; i < r->train->n; i++)
            r->order[i] = (uint32_t)i;
    }
    /* a stream of its own, so the shuffle does not depend on the init */
    fr_rng_seed(&r->shuffle_rng, (uint64_t)r->o->seed ^ 0x5f3759df9e3779b9ull);
    return 0;
}

static int train(fit_run_t *r)
{
    int rc = prepare_run(r);
    if (rc != 0)
        return rc;
    if (trainer_backend_load(r->b, r->w) != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", CMD, trainer_backend_error(r->b));
        return APP_EXIT_FAILURE;
    }
    for (long long e = 1; e <= r->o->epochs; e++) {
        uint64_t t0 = fr_clock_mono_ns();
        double mean_loss = 0.0;
        if ((rc = run_epoch(r, &mean_loss)) != 0)
            return rc;
        double secs = (double)(fr_clock_mono_ns() - t0) * 1e-9;
        printf("epoch %lld/%lld  loss %.6f  samples/s %.0f  (%.2f s)", e, r->o->epochs, mean_loss,
               (double)r->train->n / secs, secs);
        if (r->test != NULL) {
            double loss = 0.0;
            int64_t right = 0;
            if (trainer_backend_evaluate(r->b, &loss, &right, r->test->x, r->test->y, r->test->n) !=
                FR_OK) {
                fprintf(stderr, "\nfreshet %s: %s\n", CMD, trainer_backend_error(r->b));
                return APP_EXIT_FAILURE;
            }
            printf("  test_loss %.6f", loss / (double)r->test->n);
            if (r->m->loss != MODEL_LOSS_MSE)
                printf("  test_accuracy %.4f", (double)right / (double)r->test->n);
        }
        printf("\n");
        fflush(stdout);
    }
    return 0;
}

int app_cmd_fit(int argc, char **argv)
{
    fit_opts_t o;
    model_t m;
    ingest_dataset_t train_ds = {0}, test_ds = {0};
    fit_run_t r = {.o = &o, .m = &m};
    char errstr[512];
    int rc = parse_opts(&o, argc, argv);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    ingest_format_t format;
    if (ingest_format_parse(o.format, &format) != FR_OK)
        return app_usage_error(CMD, "--format must be csv, libsvm, f32 or idx, got '%s'", o.format);
    if ((rc = initial_model(&o, &m, &r.w)) != 0)
        goto out;
    if (o.features != 0 && o.features != m.dims[0]) {
        rc = app_usage_error(CMD, "--features %lld differs from the model's input width %d",
                             o.features, m.dims[0]);
        goto out;
    }
    ingest_schema_t schema;
    trainer_model_schema(&m, &schema);
    if ((rc = app_load_dataset(CMD, "--labels", &train_ds, &schema, format, o.data, o.labels)) != 0)
        goto out;
    if (o.test_data != NULL && (rc = app_load_dataset(CMD, "--test-labels", &test_ds, &schema,
                                                      format, o.test_data, o.test_labels)) != 0)
        goto out;
    r.train = &train_ds;
    r.test = o.test_data ? &test_ds : NULL;
    if (train_ds.n > UINT32_MAX) {
        rc = app_usage_error(CMD, "%s holds %zu samples; at most %u fit in one run", o.data,
                             train_ds.n, UINT32_MAX);
        goto out;
    }
    /* buffers as big as the data needs: a step, or an evaluation chunk */
    if ((size_t)o.batch > train_ds.n)
        o.batch = (long long)train_ds.n;
    size_t chunk = r.test ? (test_ds.n < 1024 ? test_ds.n : 1024) : 0;
    int max_batch = (int)((size_t)o.batch > chunk ? (size_t)o.batch : chunk);
    r.b = trainer_backend_new(o.backend, &m, max_batch, 0, errstr, sizeof(errstr));
    if (r.b == NULL) {
        fprintf(stderr, "freshet %s: --backend %s: %s\n", CMD, o.backend, errstr);
        rc = strstr(errstr, "allocate") ? APP_EXIT_FAILURE : APP_EXIT_USAGE;
        goto out;
    }
    if ((rc = check_out_path(o.out)) != 0)
        goto out;
    if ((rc = train(&r)) != 0)
        goto out;
    char steps[32];
    snprintf(steps, sizeof(steps), "%llu", (unsigned long long)r.steps);
    fr_st_kv_t extra[] = {{"freshet.version", steps}};
    if (model_save(o.out, &m, r.w, extra, 1, errstr, sizeof(errstr)) != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
        rc = APP_EXIT_FAILURE;
        goto out;
    }
    printf("wrote %s (%zu parameters, %llu steps)\n", o.out, m.nparams,
           (unsigned long long)r.steps);
out:
    trainer_backend_destroy(r.b);
    ingest_dataset_fini(&train_ds);
    ingest_dataset_fini(&test_ds);
    free(r.w);
    free(r.grad);
    free(r.state);
    free(r.xb);
    free(r.yb);
    free(r.order);
    return rc;
}
