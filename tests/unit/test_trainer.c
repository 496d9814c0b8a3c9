/*
 * test_trainer.c - the model spec, the parameter layout, initialisation,
 * model files, and the CPU backend's gradients against central finite
 * differences of the double-precision reference.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "trainer/trainer.h"
#include "trainer/trainer_int.h"

static char errstr[512];

/* ---- model spec and layout -------------------------------------------- */

static void test_model_parses_layers_and_lays_out_parameters(void **state)
{
    model_t m;
    assert_int_equal(model_init(&m, "784-256-10", MODEL_LOSS_SOFTMAX, errstr, sizeof(errstr)),
                     FR_OK);
    assert_int_equal(m.nlayers, 2);
    assert_int_equal(m.dims[0], 784);
    assert_int_equal(m.dims[2], 10);
    assert_int_equal(m.w_off[0], 0);
    assert_int_equal(m.b_off[0], 256 * 784);
    assert_int_equal(m.w_off[1], 256 * 784 + 256);
    assert_int_equal(m.b_off[1], 256 * 784 + 256 + 10 * 256);
    assert_int_equal(m.nparams, 203530);
    char buf[64];
    model_layers(&m, buf, sizeof(buf));
    assert_string_equal(buf, "784-256-10");
}

static void test_model_rejects_bad_layer_lists(void **state)
{
    static const char *const bad[] = {"",
                                      "784",
                                      "784-",
                                      "-10",
                                      "784--10",
                                      "784-0-10",
                                      "784-a-10",
                                      "784 -10",
                                      "784-2000000",
                                      "1-2-3-4-5-6-7-8-9-10-11-12-13-14-15-16-17"};
    model_t m;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(model_init(&m, bad[i], MODEL_LOSS_SOFTMAX, errstr, sizeof(errstr)),
                         FR_ERR_INVAL);
        assert_non_null(strstr(errstr, "model:"));
        model_t zero;
        memset(&zero, 0, sizeof(zero));
        assert_memory_equal(&m, &zero, sizeof(m));
    }
}

static void test_model_checks_output_width_against_loss(void **state)
{
    model_t m;
    assert_int_equal(model_init(&m, "5-1", MODEL_LOSS_SOFTMAX, errstr, sizeof(errstr)),
                     FR_ERR_INVAL);
    assert_non_null(strstr(errstr, "at least 2 outputs"));
    assert_int_equal(model_init(&m, "5-2", MODEL_LOSS_LOGISTIC, errstr, sizeof(errstr)),
                     FR_ERR_INVAL);
    assert_non_null(strstr(errstr, "exactly 1 output"));
    assert_int_equal(model_init(&m, "5-3-1", MODEL_LOSS_MSE, errstr, sizeof(errstr)), FR_OK);
    ingest_schema_t s;
    trainer_model_schema(&m, &s);
    assert_int_equal(s.features, 5);
    assert_int_equal(s.label, INGEST_LABEL_REAL);
}

static void test_init_is_seeded_he_uniform_with_zero_bias(void **state)
{
    model_t m;
    assert_int_equal(model_init(&m, "50-30-4", MODEL_LOSS_SOFTMAX, errstr, sizeof(errstr)), FR_OK);
    float *a = malloc(m.nparams * sizeof(float)), *b = malloc(m.nparams * sizeof(float));
    model_params_init(&m, a, 7);
    model_params_init(&m, b, 7);
    assert_memory_equal(a, b, m.nparams * sizeof(float));
    model_params_init(&m, b, 8);
    assert_memory_not_equal(a, b, m.nparams * sizeof(float));
    for (int l = 0; l < m.nlayers; l++) {
        float bound = sqrtf(6.0f / (float)m.dims[l]), maxabs = 0;
        for (size_t i = 0; i < (size_t)m.dims[l + 1] * m.dims[l]; i++) {
            float v = fabsf(a[m.w_off[l] + i]);
            assert_true(v <= bound);
            maxabs = v > maxabs ? v : maxabs;
        }
        assert_true(maxabs > 0.9f * bound); /* really uniform over the whole range */
        for (int i = 0; i < m.dims[l + 1]; i++)
            assert_true(a[m.b_off[l] + i] == 0.0f);
    }
    free(a);
    free(b);
}

/* ---- sgemm ---------------------------------------------------------------- */

static void test_sgemm_matches_plain_loops_for_every_transpose(void **state)
{
    fr_rng_t rng;
    fr_rng_seed(&rng, 3);
    int M = 13, N = 7, K = 29;
    float A[29 * 13], B[29 * 7], C1[13 * 7], C2[13 * 7];
    for (int i = 0; i < 29 * 13; i++)
        A[i] = (float)(fr_rng_uniform(&rng) - 0.5);
    for (int i = 0; i < 29 * 7; i++)
        B[i] = (float)(fr_rng_uniform(&rng) - 0.5);
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            int lda = ta ? M : K, ldb = tb ? K : N;
            for (int i = 0; i < M * N; i++)
                C1[i] = C2[i] = (float)i * 0.01f;
            trainer_sgemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 2.0f, C1, N);
            trainer_sgemm_ref(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 2.0f, C2, N);
            for (int i = 0; i < M * N; i++)
                assert_true(fabsf(C1[i] - C2[i]) <= 1e-5f + 1e-5f * fabsf(C2[i]));
        }
    }
}

/* ---- gradients ---------------------------------------------------------- */

/* Random weights, inputs and labels valid for the loss. */
static void random_problem(const model_t *m, int n, uint64_t seed, double *w, double *x, double *y)
{
    fr_rng_t rng;
    fr_rng_seed(&rng, seed);
    for (size_t i = 0; i < m->nparams; i++)
        w[i] = fr_rng_uniform(&rng) - 0.5;
    for (size_t i = 0; i < (size_t)n * m->dims[0]; i++)
        x[i] = 2.0 * fr_rng_uniform(&rng) - 1.0;
    for (int i = 0; i < n; i++) {
        if (m->loss == MODEL_LOSS_SOFTMAX)
            y[i] = (double)fr_rng_below(&rng, (uint64_t)m->dims[m->nlayers]);
        else if (m->loss == MODEL_LOSS_LOGISTIC)
            y[i] = (double)fr_rng_below(&rng, 2);
        else
            y[i] = 3.0 * fr_rng_uniform(&rng) - 1.5;
    }
}

/*
 * Checks, for one model and batch size:
 *  1. the reference gradient against central differences of the reference
 *     loss, in double precision (h = 1e-6);
 *  2. the CPU backend's float gradient and loss against the reference.
 */
static void check_gradient(const char *layers, model_loss_t loss, int n, uint64_t seed)
{
    model_t m;
    assert_int_equal(model_init(&m, layers, loss, errstr, sizeof(errstr)), FR_OK);
    size_t P = m.nparams, X = (size_t)n * m.dims[0];
    double *w = malloc(P * sizeof(double)), *g = malloc(P * sizeof(double));
    double *x = malloc(X * sizeof(double)), *y = malloc((size_t)n * sizeof(double));
    float *wf = malloc(P * sizeof(float)), *gf = malloc(P * sizeof(float));
    float *xf = malloc(X * sizeof(float)), *yf = malloc((size_t)n * sizeof(float));
    random_problem(&m, n, seed, w, x, y);
    /* round the problem to float first, so both sides see the same numbers */
    for (size_t i = 0; i < P; i++)
        w[i] = wf[i] = (float)w[i];
    for (size_t i = 0; i < X; i++)
        x[i] = xf[i] = (float)x[i];
    for (int i = 0; i < n; i++)
        y[i] = yf[i] = (float)y[i];

    double loss_ref = 0;
    assert_int_equal(trainer_reference_gradient(&m, g, &loss_ref, w, x, y, n), FR_OK);
    double *gtmp = malloc(P * sizeof(double));
    const double h = 1e-6;
    for (size_t i = 0; i < P; i++) {
        double keep = w[i], lp, lm;
        w[i] = keep + h;
        trainer_reference_gradient(&m, gtmp, &lp, w, x, y, n);
        w[i] = keep - h;
        trainer_reference_gradient(&m, gtmp, &lm, w, x, y, n);
        w[i] = keep;
        double fd = (lp - lm) / (2 * h) / n;
        if (fabs(g[i] - fd) > 1e-6 + 1e-5 * fabs(fd)) {
            fail_msg("%s %s n=%d: d/dw[%zu] reference %.10g, finite difference %.10g", layers,
                     model_loss_name(loss), n, i, g[i], fd);
        }
    }

    trainer_backend_t *b = trainer_backend_new("cpu", &m, n + 3, 0, errstr, sizeof(errstr));
    assert_non_null(b);
    assert_int_equal(trainer_backend_load(b, wf), FR_OK);
    double loss_cpu = 0;
    assert_int_equal(trainer_backend_gradient(b, gf, &loss_cpu, xf, yf, n), FR_OK);
    assert_true(fabs(loss_cpu - loss_ref) <= 1e-4 * fabs(loss_ref) + 1e-5);
    for (size_t i = 0; i < P; i++) {
        if (fabs(gf[i] - g[i]) > 1e-5 + 1e-4 * fabs(g[i]))
            fail_msg("%s %s n=%d: cpu d/dw[%zu] = %.8g, reference %.8g", layers,
                     model_loss_name(loss), n, i, gf[i], g[i]);
    }
    trainer_backend_destroy(b);
    free(w);
    free(g);
    free(gtmp);
    free(x);
    free(y);
    free(wf);
    free(gf);
    free(xf);
    free(yf);
}

static void test_softmax_gradients_match_finite_differences(void **state)
{
    check_gradient("7-5-3", MODEL_LOSS_SOFTMAX, 9, 1);
    check_gradient("7-5-3", MODEL_LOSS_SOFTMAX, 1, 2);
    check_gradient("11-4", MODEL_LOSS_SOFTMAX, 5, 3);     /* no hidden layer */
    check_gradient("6-9-5-4", MODEL_LOSS_SOFTMAX, 13, 4); /* two hidden layers */
}

static void test_logistic_gradients_match_finite_differences(void **state)
{
    check_gradient("7-5-1", MODEL_LOSS_LOGISTIC, 9, 5);
    check_gradient("7-5-1", MODEL_LOSS_LOGISTIC, 1, 6);
    check_gradient("13-1", MODEL_LOSS_LOGISTIC, 6, 7);
    check_gradient("3-8-7-1", MODEL_LOSS_LOGISTIC, 11, 8);
}

static void test_mse_gradients_match_finite_differences(void **state)
{
    check_gradient("7-5-1", MODEL_LOSS_MSE, 9, 9);
    check_gradient("7-5-1", MODEL_LOSS_MSE, 1, 10);
    check_gradient("4-1", MODEL_LOSS_MSE, 3, 11);
    check_gradient("5-6-3-1", MODEL_LOSS_MSE, 17, 12);
}

/* A hand-computed softmax cross-entropy: logits (1, 2, 3), label 2. */
static void test_softmax_loss_and_accuracy_match_hand_computation(void **state)
{
    model_t m;
    assert_int_equal(model_init(&m, "3-3", MODEL_LOSS_SOFTMAX, errstr, sizeof(errstr)), FR_OK);
    /* identity weights, zero bias: logits = inputs */
    float w[12] = {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0};
    float x[6] = {1, 2, 3, 3, 2, 1}, y[2] = {2, 2};
    trainer_backend_t *b = trainer_backend_new("cpu", &m, 2, 0, errstr, sizeof(errstr));
    assert_non_null(b);
    assert_int_equal(trainer_backend_load(b, w), FR_OK);
    double loss;
    int64_t right;
    assert_int_equal(trainer_backend_evaluate(b, &loss, &right, x, y, 2), FR_OK);
    double lse = log(exp(1) + exp(2) + exp(3));
    assert_true(fabs(loss - ((lse - 3) + (lse - 1))) < 1e-5);
    assert_int_equal(right, 1);
    /* the gradient of the bias is the mean of softmax - onehot */
    float g[12];
    assert_int_equal(trainer_backend_gradient(b, g, &loss, x, y, 2), FR_OK);
    double p1 = exp(1 - lse), p3 = exp(3 - lse);
    assert_true(fabs(g[9] - (p1 + p3) / 2) < 1e-6);
    assert_true(fabs(g[11] - ((p3 - 1) + (p1 - 1)) / 2) < 1e-6);
    trainer_backend_destroy(b);
}

static void test_backend_rejects_bad_batches_and_labels(void **state)
{
    model_t m;
    assert_int_equal(model_init(&m, "2-3", MODEL_LOSS_SOFTMAX, errstr, sizeof(errstr)), FR_OK);
    float w[9] = {0}, g[9], x[4] = {1, 2, 3, 4}, y[2] = {0, 3};
    trainer_backend_t *b = trainer_backend_new("cpu", &m, 2, 0, errstr, sizeof(errstr));
    assert_non_null(b);
    double loss;
    assert_int_equal(trainer_backend_gradient(b, g, &loss, x, y, 1), FR_ERR_STATE);
    assert_int_equal(trainer_backend_load(b, w), FR_OK);
    assert_int_equal(trainer_backend_gradient(b, g, &loss, x, y, 3), FR_ERR_INVAL);
    assert_int_equal(trainer_backend_gradient(b, g, &loss, x, y, 0), FR_ERR_INVAL);
    assert_int_equal(trainer_backend_gradient(b, g, &loss, x, y, 2), FR_ERR_RANGE);
    assert_non_null(strstr(trainer_backend_error(b), "label 3"));
    trainer_backend_destroy(b);
    trainer_backend_destroy(NULL);
}

static void test_backend_names_are_checked(void **state)
{
    model_t m;
    assert_int_equal(model_init(&m, "2-3", MODEL_LOSS_SOFTMAX, errstr, sizeof(errstr)), FR_OK);
    assert_null(trainer_backend_new("tpu", &m, 2, 0, errstr, sizeof(errstr)));
    assert_non_null(strstr(errstr, "unknown backend 'tpu'"));
    trainer_backend_t *b = trainer_backend_new("auto", &m, 2, 0, errstr, sizeof(errstr));
    assert_non_null(b);
    if (strstr(trainer_backends_built(), "cuda") == NULL) {
        assert_string_equal(trainer_backend_name(b), "cpu");
        assert_null(trainer_backend_new("cuda", &m, 2, 0, errstr, sizeof(errstr)));
        assert_non_null(strstr(errstr, "no CUDA backend"));
    }
    trainer_backend_destroy(b);
}

/* Nonzero when a file whose path contains name is mapped into this process. */
static int mapped(const char *name)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof(line), f) != NULL)
        found = strstr(line, name) != NULL;
    fclose(f);
    return found;
}

/*
 * The CUDA backend is a module loaded when a backend needs it: "auto" on a
 * machine without NVIDIA's device node loads nothing (no cuBLAS mapped),
 * "cuda" loads it (then fails only for want of a device), and a module
 * that is missing or from another build is refused with its path.
 */
static void test_the_cuda_module_loads_only_when_asked(void **state)
{
    char path[4096];
    model_t m;
    assert_int_equal(model_init(&m, "2-3", MODEL_LOSS_SOFTMAX, errstr, sizeof(errstr)), FR_OK);
    if (strstr(trainer_backends_built(), "cuda") == NULL) {
        /* a build without nvcc: no module to look for, and "cuda" refused
         * as not built (the rest of the test is for builds with the module) */
        assert_int_equal(trainer_cuda_module(path, sizeof(path)), 0);
        assert_string_equal(path, "");
        assert_null(trainer_backend_new("cuda", &m, 2, 0, errstr, sizeof(errstr)));
        assert_non_null(strstr(errstr, "backend cuda: this build has no CUDA backend"));
        return;
    }
    assert_int_equal(trainer_cuda_module(path, sizeof(path)), 1);
    assert_non_null(strstr(path, "/libfreshet_cuda.so"));
    int node = access("/dev/nvidiactl", F_OK) == 0 || access("/dev/dxg", F_OK) == 0;
    if (!node)
        assert_false(mapped("libfreshet_cuda.so"));
    trainer_backend_t *b = trainer_backend_new("auto", &m, 2, 0, errstr, sizeof(errstr));
    assert_non_null(b);
    trainer_backend_destroy(b);
    if (!node) {
        assert_false(mapped("libfreshet_cuda.so"));
        assert_false(mapped("libcublas"));
    }

    /* the loader keeps the first module it loads: on a machine with the
     * device node "auto" loaded it already, and the refusals need a process
     * that has not */
    if (!node) {
        setenv("FRESHET_CUDA_MODULE", "/nonexistent/libfreshet_cuda.so", 1);
        assert_int_equal(trainer_cuda_module(path, sizeof(path)), 0);
        assert_string_equal(path, "/nonexistent/libfreshet_cuda.so");
        assert_null(trainer_backend_new("cuda", &m, 2, 0, errstr, sizeof(errstr)));
        assert_non_null(
            strstr(errstr, "FRESHET_CUDA_MODULE names /nonexistent/libfreshet_cuda.so"));
#ifdef FRESHET_OTHER_MODULE
        setenv("FRESHET_CUDA_MODULE", FRESHET_OTHER_MODULE, 1);
        assert_null(trainer_backend_new("cuda", &m, 2, 0, errstr, sizeof(errstr)));
        assert_non_null(strstr(errstr, "is from another build of freshet (interface 2, this "
                                       "program's 1)"));
#endif
        unsetenv("FRESHET_CUDA_MODULE");
    }

    b = trainer_backend_new("cuda", &m, 2, 0, errstr, sizeof(errstr));
    assert_true(mapped("libfreshet_cuda.so"));
    assert_true(mapped("libcublas"));
    if (b == NULL) /* a machine without a GPU: the module loaded, no device */
        assert_string_equal(errstr, "backend cuda: no device present");
    else
        assert_string_equal(trainer_backend_name(b), "cuda");
    trainer_backend_destroy(b);
}

/* ReLU' is 0 at 0: with zero first-layer weights and biases every hidden
 * unit sits exactly at 0, so nothing flows back to the first layer. */
static void test_relu_gradient_is_zero_at_zero(void **state)
{
    model_t m;
    assert_int_equal(model_init(&m, "3-4-2", MODEL_LOSS_SOFTMAX, errstr, sizeof(errstr)), FR_OK);
    float w[26] = {0}, g[26], x[6] = {1, 2, 3, -1, -2, -3}, y[2] = {0, 1};
    for (int i = 0; i < 8; i++)
        w[m.w_off[1] + i] = 0.5f * (float)(i + 1);
    trainer_backend_t *b = trainer_backend_new("cpu", &m, 2, 0, errstr, sizeof(errstr));
    assert_non_null(b);
    assert_int_equal(trainer_backend_load(b, w), FR_OK);
    double loss;
    assert_int_equal(trainer_backend_gradient(b, g, &loss, x, y, 2), FR_OK);
    for (int i = 0; i < 16; i++)
        assert_true(g[i] == 0.0f);                 /* W0 and b0 */
    assert_true(fabs(loss - 2 * log(2.0)) < 1e-6); /* logits all 0 */
    trainer_backend_destroy(b);
}

/* A NaN weight gives a NaN loss and NaN gradients, as in PyTorch, so the
 * controller and the divergence checks see it. */
static void test_nan_weights_propagate_to_loss_and_gradient(void **state)
{
    model_t m;
    assert_int_equal(model_init(&m, "2-3-2", MODEL_LOSS_SOFTMAX, errstr, sizeof(errstr)), FR_OK);
    float w[17], g[17], x[2] = {1, 1}, y[1] = {1};
    for (int i = 0; i < 17; i++)
        w[i] = 0.1f * (float)(i % 5) + 0.05f;
    w[0] = NAN;
    trainer_backend_t *b = trainer_backend_new("cpu", &m, 1, 0, errstr, sizeof(errstr));
    assert_int_equal(trainer_backend_load(b, w), FR_OK);
    double loss;
    assert_int_equal(trainer_backend_gradient(b, g, &loss, x, y, 1), FR_OK);
    assert_true(isnan(loss));
    int nonfinite = 0;
    for (int i = 0; i < 17; i++)
        nonfinite += !isfinite(g[i]);
    assert_true(nonfinite > 0);
    trainer_backend_destroy(b);
}

/* Evaluating more samples than the backend's batch goes chunk by chunk and
 * gives the one-batch answer. */
static void test_evaluate_in_chunks_matches_one_batch(void **state)
{
    model_t m;
    assert_int_equal(model_init(&m, "5-4-3", MODEL_LOSS_SOFTMAX, errstr, sizeof(errstr)), FR_OK);
    float *w = malloc(m.nparams * sizeof(float)), x[50], y[10];
    model_params_init(&m, w, 9);
    fr_rng_t rng;
    fr_rng_seed(&rng, 9);
    for (int i = 0; i < 50; i++)
        x[i] = (float)fr_rng_uniform(&rng);
    for (int i = 0; i < 10; i++)
        y[i] = (float)(i % 3);
    trainer_backend_t *small = trainer_backend_new("cpu", &m, 3, 0, errstr, sizeof(errstr));
    trainer_backend_t *big = trainer_backend_new("cpu", &m, 10, 0, errstr, sizeof(errstr));
    trainer_backend_load(small, w);
    trainer_backend_load(big, w);
    double l1, l2;
    int64_t c1, c2;
    assert_int_equal(trainer_backend_evaluate(small, &l1, &c1, x, y, 10), FR_OK);
    assert_int_equal(trainer_backend_evaluate(big, &l2, &c2, x, y, 10), FR_OK);
    assert_true(fabs(l1 - l2) < 1e-5);
    assert_int_equal(c1, c2);
    trainer_backend_destroy(small);
    trainer_backend_destroy(big);
    free(w);
}

/* ---- model files ---------------------------------------------------------- */

static void test_model_file_round_trips_weights_and_metadata(void **state)
{
    model_t m, back;
    assert_int_equal(model_init(&m, "6-4-3", MODEL_LOSS_SOFTMAX, errstr, sizeof(errstr)), FR_OK);
    float *w = malloc(m.nparams * sizeof(float)), *w2 = NULL;
    model_params_init(&m, w, 5);
    for (int i = 0; i < 4; i++)
        w[m.b_off[0] + i] = 0.25f * (float)i;
    const char *path = FRESHET_BINARY_DIR "/test_trainer_model.safetensors";
    fr_st_kv_t extra[] = {{"freshet.version", "17"}};
    assert_int_equal(model_save(path, &m, w, extra, 1, errstr, sizeof(errstr)), FR_OK);
    assert_int_equal(model_load(path, NULL, &back, &w2, errstr, sizeof(errstr)), FR_OK);
    assert_true(model_equal(&m, &back));
    assert_memory_equal(w, w2, m.nparams * sizeof(float));
    fr_st_file_t *st = fr_st_read_file(path, errstr, sizeof(errstr));
    assert_non_null(st);
    assert_string_equal(fr_st_meta(st, "format"), "pt");
    assert_string_equal(fr_st_meta(st, "freshet.layers"), "6-4-3");
    assert_string_equal(fr_st_meta(st, "freshet.loss"), "softmax");
    assert_string_equal(fr_st_meta(st, "freshet.version"), "17");
    const fr_st_tensor_t *t = fr_st_find(st, "layers.1.weight");
    assert_non_null(t);
    assert_int_equal(t->shape[0], 3);
    assert_int_equal(t->shape[1], 4);
    fr_st_destroy(st);
    free(w);
    free(w2);
}

/* A file as PyTorch would write it: no freshet metadata, loss from a hint. */
static void test_model_file_without_metadata_takes_layers_from_shapes(void **state)
{
    float w1[6] = {1, 2, 3, 4, 5, 6}, b1[2] = {7, 8}, w2[2] = {9, 10}, b2[1] = {11};
    fr_st_tensor_t t[4] = {
        {.name = "layers.0.weight",
         .dtype = "F32",
         .ndim = 2,
         .shape = {2, 3},
         .data = w1,
         .nbytes = sizeof(w1)},
        {.name = "layers.0.bias",
         .dtype = "F32",
         .ndim = 1,
         .shape = {2},
         .data = b1,
         .nbytes = sizeof(b1)},
        {.name = "layers.1.weight",
         .dtype = "F32",
         .ndim = 2,
         .shape = {1, 2},
         .data = w2,
         .nbytes = sizeof(w2)},
        {.name = "layers.1.bias",
         .dtype = "F32",
         .ndim = 1,
         .shape = {1},
         .data = b2,
         .nbytes = sizeof(b2)},
    };
    const char *path = FRESHET_BINARY_DIR "/test_trainer_torch.safetensors";
    assert_int_equal(fr_st_write_file(path, t, 4, NULL, 0, errstr, sizeof(errstr)), FR_OK);
    model_t m;
    float *w = NULL;
    assert_int_equal(model_load(path, NULL, &m, &w, errstr, sizeof(errstr)), FR_ERR_PARSE);
    assert_non_null(strstr(errstr, "no freshet.loss"));
    model_loss_t hint = MODEL_LOSS_MSE;
    assert_int_equal(model_load(path, &hint, &m, &w, errstr, sizeof(errstr)), FR_OK);
    char layers[64];
    model_layers(&m, layers, sizeof(layers));
    assert_string_equal(layers, "3-2-1");
    float expect[11] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    assert_memory_equal(w, expect, sizeof(expect));
    free(w);
}

static void test_model_file_rejects_wrong_shapes_dtypes_and_values(void **state)
{
    const char *path = FRESHET_BINARY_DIR "/test_trainer_bad.safetensors";
    float w1[6] = {0}, b1[3] = {0};
    fr_st_kv_t meta[] = {{"freshet.layers", "3-2"}, {"freshet.loss", "softmax"}};
    model_t m;
    float *w = NULL;
    /* weight stored as [3, 2] where [2, 3] is due */
    fr_st_tensor_t t[2] = {
        {.name = "layers.0.weight",
         .dtype = "F32",
         .ndim = 2,
         .shape = {3, 2},
         .data = w1,
         .nbytes = sizeof(w1)},
        {.name = "layers.0.bias", .dtype = "F32", .ndim = 1, .shape = {2}, .data = b1, .nbytes = 8},
    };
    assert_int_equal(fr_st_write_file(path, t, 2, meta, 2, errstr, sizeof(errstr)), FR_OK);
    assert_int_equal(model_load(path, NULL, &m, &w, errstr, sizeof(errstr)), FR_ERR_PARSE);
    assert_non_null(strstr(errstr, "layers.0.weight has the wrong shape"));
    assert_null(w);
    /* a missing bias */
    t[0].shape[0] = 2;
    t[0].shape[1] = 3;
    assert_int_equal(fr_st_write_file(path, t, 1, meta, 2, errstr, sizeof(errstr)), FR_OK);
    assert_int_equal(model_load(path, NULL, &m, &w, errstr, sizeof(errstr)), FR_ERR_PARSE);
    assert_non_null(strstr(errstr, "1 tensors"));
    /* an F64 bias where F32 is due */
    double b64[2] = {0, 0};
    fr_st_tensor_t t64[2] = {t[0],
                             {.name = "layers.0.bias",
                              .dtype = "F64",
                              .ndim = 1,
                              .shape = {2},
                              .data = b64,
                              .nbytes = sizeof(b64)}};
    uint8_t *img;
    size_t len;
    /* the writer emits F32 only: build the F64 file by hand from an F32 one */
    assert_int_equal(fr_st_encode(t64, 1, meta, 2, &img, &len, errstr, sizeof(errstr)), FR_OK);
    free(img);
    FILE *f = fopen(path, "wb");
    const char *hdr = "{\"__metadata__\":{\"freshet.layers\":\"3-2\",\"freshet.loss\":"
                      "\"softmax\"},\"layers.0.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                      "\"data_offsets\":[0,24]},\"layers.0.bias\":{\"dtype\":\"F64\","
                      "\"shape\":[2],\"data_offsets\":[24,40]}}";
    uint64_t hlen = strlen(hdr);
    fwrite(&hlen, 8, 1, f);
    fwrite(hdr, 1, hlen, f);
    fwrite(w1, 4, 6, f);
    fwrite(b64, 8, 2, f);
    fclose(f);
    assert_int_equal(model_load(path, NULL, &m, &w, errstr, sizeof(errstr)), FR_ERR_PARSE);
    assert_non_null(strstr(errstr, "dtype F64, expected F32"));
    /* a NaN weight */
    w1[4] = NAN;
    assert_int_equal(fr_st_write_file(path, t, 2, meta, 2, errstr, sizeof(errstr)), FR_OK);
    assert_int_equal(model_load(path, NULL, &m, &w, errstr, sizeof(errstr)), FR_ERR_NONFINITE);
    assert_non_null(strstr(errstr, "non-finite"));
    assert_null(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_parses_layers_and_lays_out_parameters),
        cmocka_unit_test(test_model_rejects_bad_layer_lists),
        cmocka_unit_test(test_model_checks_output_width_against_loss),
        cmocka_unit_test(test_init_is_seeded_he_uniform_with_zero_bias),
        cmocka_unit_test(test_sgemm_matches_plain_loops_for_every_transpose),
        cmocka_unit_test(test_softmax_gradients_match_finite_differences),
        cmocka_unit_test(test_logistic_gradients_match_finite_differences),
        cmocka_unit_test(test_mse_gradients_match_finite_differences),
        cmocka_unit_test(test_softmax_loss_and_accuracy_match_hand_computation),
        cmocka_unit_test(test_backend_rejects_bad_batches_and_labels),
        cmocka_unit_test(test_relu_gradient_is_zero_at_zero),
        cmocka_unit_test(test_nan_weights_propagate_to_loss_and_gradient),
        cmocka_unit_test(test_evaluate_in_chunks_matches_one_batch),
        cmocka_unit_test(test_backend_names_are_checked),
        cmocka_unit_test(test_the_cuda_module_loads_only_when_asked),
        cmocka_unit_test(test_model_file_round_trips_weights_and_metadata),
        cmocka_unit_test(test_model_file_without_metadata_takes_layers_from_shapes),
        cmocka_unit_test(test_model_file_rejects_wrong_shapes_dtypes_and_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
