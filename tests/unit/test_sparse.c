/*
 * test_sparse.c - sparse models: the shape, hashing, batches, the FM's
 * gradient against its O(n^2 D) definition and finite differences, the
 * per-row optimizers against hand computations, the Criteo and libsvm
 * layouts, and the synthetic stream (its determinism, click rate, floor,
 * drift, and that a model learns it).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sparse/prog.h"
#include "sparse/sparse.h"
#include "sparse/synth.h"
#include "trainer/schema_sparse.h"

/* ------------------------------------------------------------------------
 * The shape and hashing
 * ---------------------------------------------------------------------- */

static void test_spec_is_parsed_and_bad_ones_refused(void **state)
{
    (void)state;
    sparse_spec_t s;
    char err[256], text[64];
    assert_int_equal(sparse_spec_parse("fields:39,buckets:2^22,dim:8", &s, err, sizeof(err)),
                     FR_OK);
    assert_int_equal(s.fields, 39);
    assert_int_equal(s.bits, 22);
    assert_int_equal(s.dim, 8);
    sparse_spec_format(&s, text, sizeof(text));
    assert_string_equal(text, "fields:39,buckets:2^22,dim:8");
    assert_int_equal(s.ntower, 0);
    assert_int_equal(sparse_tower_len(&s), 0);
    assert_int_equal(sparse_dense_len(&s), 1); /* the bias alone */
    assert_int_equal(sparse_spec_parse("buckets:1048576,fields:26", &s, err, sizeof(err)), FR_OK);
    assert_int_equal(s.bits, 20);
    assert_int_equal(s.dim, 0); /* hashed logistic regression */
    assert_int_equal(
        sparse_spec_parse("fields:26,buckets:2^22,dim:8,tower:64-32", &s, err, sizeof(err)), FR_OK);
    assert_int_equal(s.ntower, 2);
    assert_int_equal(s.tower[0], 64);
    assert_int_equal(s.tower[1], 32);
    /* 208 x 64 + 64, 64 x 32 + 32, 32 x 1 + 1 */
    assert_int_equal(sparse_tower_len(&s), 208 * 64 + 64 + 64 * 32 + 32 + 32 + 1);
    sparse_spec_format(&s, text, sizeof(text));
    assert_string_equal(text, "fields:26,buckets:2^22,dim:8,tower:64-32");
    static const char *const bad[] = {
        "fields:39",                      /* no buckets */
        "fields:0,buckets:2^20",          /* no fields */
        "fields:65,buckets:2^20",         /* too many */
        "fields:3,buckets:1000",          /* not a power of two */
        "fields:3,buckets:2^31",          /* too many rows */
        "fields:3,buckets:2^3",           /* too few */
        "fields:3,buckets:2^20,dim:65",   /* too wide */
        "fields:3,buckets:2^20,depth:2",  /* unknown key */
        "fields:3x,buckets:2^20",         /* junk */
        "fields:3,buckets:2^20,",         /* trailing comma */
        "fields:4294967335,buckets:2^20", /* 39 after a cast to int */
        "fields:3,buckets:2^20,dim:4294967304",
        "fields:3,buckets:2^20,tower:8",               /* a tower needs embeddings */
        "fields:3,buckets:2^20,dim:2,tower:",          /* no widths */
        "fields:3,buckets:2^20,dim:2,tower:0",         /* an empty layer */
        "fields:3,buckets:2^20,dim:2,tower:1025",      /* too wide */
        "fields:3,buckets:2^20,dim:2,tower:4-4-4-4-4", /* too deep */
        "fields:3,buckets:2^20,dim:2,tower:4--4",
        "fields:3,buckets:2^20,classes:1",         /* a softmax has 2 classes at least */
        "fields:64,buckets:2^20,dim:64,tower:256", /* 4096 x 256: a tower too big to push */
        "fields:3,buckets:2^20,classes:257",       /* too many */
        "fields:3,buckets:2^20,dim:2,classes:3",   /* embeddings with no tower: pairs cancel */
        "",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        if (sparse_spec_parse(bad[i], &s, err, sizeof(err)) != FR_ERR_INVAL)
            fail_msg("'%s' was accepted", bad[i]);
        assert_non_null(strstr(err, "sparse:"));
    }
}

static void test_hash_is_xxh64_seeded_by_field(void **state)
{
    (void)state;
    /* XXH64("abc", seed 0) = 0x44bc2cf5ad770999 (xxHash's published vector) */
    assert_int_equal(sparse_hash(0, "abc", 3, 20), 0x44bc2cf5ad770999ull >> 44);
    assert_int_equal(sparse_hash(0, "abc", 3, 30), 0x44bc2cf5ad770999ull >> 34);
    /* another field, another row (for this value, at 2^30) */
    assert_int_not_equal(sparse_hash(1, "abc", 3, 30), sparse_hash(0, "abc", 3, 30));
    for (int i = 0; i < 1000; i++) {
        char v[16];
        int n = snprintf(v, sizeof(v), "%x", i * 7919);
        assert_true(sparse_hash(i % 5, v, (size_t)n, 10) < 1024u);
    }
}

/* ------------------------------------------------------------------------
 * Batches and the FM
 * ---------------------------------------------------------------------- */

static sparse_sample_t sample_of(float label, int n, const uint32_t *rows, const float *vals)
{
    sparse_sample_t s = {.label = label, .n = n};
    for (int k = 0; k < n; k++) {
        s.row[k] = rows[k];
        s.val[k] = vals[k];
    }
    return s;
}

static void test_a_batch_pulls_each_row_once(void **state)
{
    (void)state;
    sparse_batch_t *b = sparse_batch_new(4);
    assert_non_null(b);
    const uint32_t r1[] = {7, 3, 7, 900}, r2[] = {3, 11};
    const float v[] = {1, 1, 1, 1};
    sparse_sample_t s1 = sample_of(1, 4, r1, v), s2 = sample_of(0, 2, r2, v);
    for (int round = 0; round < 2; round++) { /* cleared and reused alike */
        sparse_batch_clear(b);
        assert_int_equal(sparse_batch_add(b, &s1), FR_OK);
        assert_int_equal(sparse_batch_add(b, &s2), FR_OK);
        assert_int_equal(b->n, 2);
        assert_int_equal(b->nrows, 4); /* 7, 3, 900, 11 */
        const uint32_t want[] = {7, 3, 900, 11};
        for (int i = 0; i < 4; i++)
            assert_int_equal(b->rows[i], want[i]);
        const uint32_t slot1[] = {0, 1, 0, 2}, slot2[] = {1, 3};
        for (int k = 0; k < 4; k++)
            assert_int_equal(b->slot[k], slot1[k]);
        for (int k = 0; k < 2; k++)
            assert_int_equal(b->slot[SPARSE_FIELDS_MAX + k], slot2[k]);
    }
    assert_int_equal(sparse_batch_add(b, &s1), FR_OK);
    assert_int_equal(sparse_batch_add(b, &s1), FR_OK);
    assert_int_equal(sparse_batch_add(b, &s1), FR_ERR_RANGE); /* full at 4 */
    s1.n = SPARSE_FIELDS_MAX + 1;
    sparse_batch_clear(b);
    assert_int_equal(sparse_batch_add(b, &s1), FR_ERR_INVAL);
    sparse_batch_destroy(b);
}

/* Sample i of b's loss by the reference, on rows' parameters and the
 * dense part (biases, tower) in double; its predicted probability (of a
 * click, or of its own class) into *p. */
static double reference_sample(const sparse_spec_t *spec, const sparse_batch_t *b, size_t i,
                               const double *rowp, const double *dense, double *p)
{
    const size_t rl = sparse_row_len(spec);
    const int K = sparse_outputs(spec);
    const sparse_sample_t *s = &b->samples[i];
    double per[SPARSE_FIELDS_MAX * 16], score[SPARSE_CLASSES_MAX];
    assert_true(rl <= 16);
    for (int k = 0; k < s->n; k++)
        memcpy(per + k * rl, rowp + b->slot[i * SPARSE_FIELDS_MAX + k] * rl, rl * sizeof(double));
    sparse_fm_reference(spec, s, per, dense, score);
    if (K == 1) {
        *p = 1 / (1 + exp(-score[0]));
        return log1p(exp(score[0])) - s->label * score[0];
    }
    double z = 0; /* the softmax by its definition: -log(e^s_y / sum_c e^s_c) */
    for (int c = 0; c < K; c++)
        z += exp(score[c]);
    *p = exp(score[(int)s->label]) / z;
    return -log(*p);
}

/* The summed loss of b by the reference. */
static double reference_loss(const sparse_spec_t *spec, const sparse_batch_t *b, const double *rowp,
                             const double *dense)
{
    double loss = 0, p;
    for (size_t i = 0; i < b->n; i++)
        loss += reference_sample(spec, b, i, rowp, dense, &p);
    return loss;
}

/* grad[n], the gradient in x[n] (rowp or densep), against central
 * differences of reference_loss: to 1e-4, relative above 1. */
static void check_differences(const sparse_spec_t *spec, const sparse_batch_t *b, double *rowp,
                              double *densep, double *x, const float *grad, size_t n,
                              const char *what)
{
    const double eps = 1e-4;
    for (size_t j = 0; j < n; j++) {
        double keep = x[j];
        x[j] = keep + eps;
        double up = reference_loss(spec, b, rowp, densep);
        x[j] = keep - eps;
        double down = reference_loss(spec, b, rowp, densep);
        x[j] = keep;
        double fd = (up - down) / (2 * eps);
        if (fabs(grad[j] - fd) > 1e-4 * fmax(1.0, fabs(fd)))
            fail_msg("dim %d, tower %d: %s %zu of %zu: gradient %.7f, differences %.7f", spec->dim,
                     spec->ntower, what, j, n, grad[j], fd);
    }
}

/* The FM's gradient, with repeated rows within and across samples and
 * non-unit values, against central differences of the O(n^2 D) loss;
 * with a tower of hidden widths tower[ntower], several features in one
 * field and a field beyond F (folded), the tower's gradient too; with
 * classes > 0, a softmax's over that many classes. */
static void check_fm_gradient(int dim, int ntower, const int *tower, int classes)
{
    sparse_spec_t spec = {
        .fields = 8, .bits = 10, .dim = dim, .ntower = ntower, .classes = classes};
    for (int l = 0; l < ntower; l++)
        spec.tower[l] = tower[l];
    const size_t rl = sparse_row_len(&spec), nd = sparse_dense_len(&spec);
    sparse_batch_t *b = sparse_batch_new(8);
    assert_non_null(b);
    uint64_t h = 12345;
    for (int i = 0; i < 8; i++) {
        uint32_t rows[6];
        float vals[6];
        int n = 2 + i % 5;
        for (int k = 0; k < n; k++) {
            h = h * 6364136223846793005ull + 1442695040888963407ull;
            rows[k] = (uint32_t)(h >> 60); /* 16 rows: many repeats */
            vals[k] = k % 3 == 2 ? 0.5f + 0.25f * (float)k : 1.0f;
        }
        sparse_sample_t s = sample_of((float)(i % (classes > 0 ? classes : 2)), n, rows, vals);
        for (int k = 0; k < n; k++) /* fields 0..2, two features in some; 9 folds onto 1 */
            s.field[k] = (uint8_t)(k == 4 ? 9 : (k * 5) % 3);
        assert_int_equal(sparse_batch_add(b, &s), FR_OK);
    }
    float *params = calloc(b->nrows * rl, sizeof(float)), *grad = calloc(b->nrows * rl, 4);
    double *rowp = calloc(b->nrows * rl, sizeof(double));
    float *dense = calloc(nd, sizeof(float)), *gdense = calloc(nd, sizeof(float));
    double *densep = calloc(nd, sizeof(double));
    assert_true(params != NULL && grad != NULL && rowp != NULL && dense != NULL && gdense != NULL &&
                densep != NULL);
    for (size_t j = 0; j < b->nrows * rl; j++) {
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        params[j] = (float)((double)(h >> 40) / (double)(1 << 24) - 0.5) * 0.8f;
        rowp[j] = params[j];
    }
    sparse_dense_init(&spec, 5, dense);
    for (size_t j = 0; j < nd; j++) { /* biases off zero, so that every path is exercised */
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        dense[j] += (float)((double)(h >> 40) / (double)(1 << 24) - 0.5) * 0.2f;
    }
    for (size_t j = 0; j < nd; j++)
        densep[j] = dense[j];
    float p[8];
    double loss = sparse_fm_grad(&spec, b, params, dense, grad, gdense, p);
    assert_float_equal(loss, reference_loss(&spec, b, rowp, densep), 1e-4);
    for (size_t i = 0; i < b->n; i++) { /* the probabilities, one by one */
        double want;
        reference_sample(&spec, b, i, rowp, densep, &want);
        assert_float_equal(p[i], want, 1e-5);
    }
    check_differences(&spec, b, rowp, densep, rowp, grad, b->nrows * rl, "row parameter");
    /* the bias, then every tower parameter */
    check_differences(&spec, b, rowp, densep, densep, gdense, nd, "dense parameter");
    free(params);
    free(grad);
    free(rowp);
    free(dense);
    free(gdense);
    free(densep);
    sparse_batch_destroy(b);
}

static void test_fm_gradient_matches_finite_differences(void **state)
{
    (void)state;
    check_fm_gradient(4, 0, NULL, 0);
    check_fm_gradient(0, 0, NULL, 0); /* hashed logistic regression: g_w = sum (p - y) x */
    static const int one[] = {5}, two[] = {6, 3};
    check_fm_gradient(4, 1, one, 0); /* a tower over the 8 fields' embeddings */
    check_fm_gradient(3, 2, two, 0);
    static const int wide[] = {16, 9}; /* W dz in 8 lanes, and a tail */
    check_fm_gradient(2, 2, wide, 0);
    check_fm_gradient(2, 2, wide, 3);
    check_fm_gradient(0, 0, NULL, 3); /* hashed multinomial regression: g_wc = (p_c - [c = y]) x */
    check_fm_gradient(3, 1, one, 4);  /* a softmax over a tower's 4 outputs */
    check_fm_gradient(2, 2, two, 2);
}

/* ------------------------------------------------------------------------
 * Optimizers
 * ---------------------------------------------------------------------- */

static void test_adagrad_row_matches_torch_by_hand(void **state)
{
    (void)state;
    sparse_spec_t spec = {.fields = 1, .bits = 4, .dim = 1};
    sparse_optim_t o;
    sparse_optim_defaults(&o, SPARSE_OPTIM_ADAGRAD);
    o.lr = 0.1f;
    assert_int_equal(sparse_state_len(&spec, &o), 2);
    float w[2] = {0.5f, -0.25f}, st[2] = {0, 0};
    const float g1[2] = {0.2f, 0.0f}, g2[2] = {-0.1f, NAN};
    sparse_row_step(&spec, &o, w, st, g1);
    assert_float_equal(w[0], 0.4f, 1e-6); /* 0.5 - 0.1 * 0.2 / sqrt(0.04) */
    assert_float_equal(w[1], -0.25f, 0);  /* zero gradient: unchanged */
    sparse_row_step(&spec, &o, w, st, g2);
    assert_float_equal(w[0], 0.4447214f, 1e-6); /* + 0.1 * 0.1 / sqrt(0.05) */
    assert_float_equal(st[0], 0.05f, 1e-7);
    assert_float_equal(w[1], -0.25f, 0); /* a NaN coordinate is left alone */
    assert_float_equal(st[1], 0.0f, 0);
}

/* A softmax row over 3 classes (D = 2): each linear weight takes its own
 * FTRL step, state (z, n) pairs first, then the embedding's Adagrad sums;
 * the biases each their FTRL step, then the tower... here none. */
static void test_a_softmax_row_steps_each_class_by_hand(void **state)
{
    (void)state;
    sparse_spec_t spec = {.fields = 2, .bits = 8, .dim = 2, .classes = 3};
    char err[200];
    assert_int_equal(sparse_row_len(&spec), 5);
    sparse_optim_t o;
    sparse_optim_defaults(&o, SPARSE_OPTIM_FTRL); /* alpha 0.1, beta 1, l1 0, l2 0; lr 0.02 */
    assert_int_equal(sparse_state_len(&spec, &o), 8);
    float param[5] = {0, 0, 0, 0.1f, -0.1f}, st[8] = {0};
    const float g[5] = {0.5f, -1.0f, 0.0f, 0.2f, 0.4f};
    sparse_row_step(&spec, &o, param, st, g);
    /* z = g, n = g^2 from a zero state: w = -g alpha / (beta + |g|) */
    assert_float_equal(param[0], -0.05 / 1.5, 1e-7);
    assert_float_equal(param[1], 0.1 / 2.0, 1e-7);
    assert_float_equal(param[2], 0, 0);
    /* Adagrad's first step is lr sign(g) */
    assert_float_equal(param[3], 0.08, 1e-7);
    assert_float_equal(param[4], -0.12, 1e-7);
    const float want_state[8] = {0.5f, 0.25f, -1.0f, 1.0f, 0, 0, 0.04f, 0.16f};
    for (int i = 0; i < 8; i++)
        assert_float_equal(st[i], want_state[i], 1e-7);
    /* the dense part: 3 biases, each an FTRL step on its own (z, n) */
    assert_int_equal(sparse_dense_len(&spec), 3);
    assert_int_equal(sparse_dense_state_len(&spec), 6);
    float dense[3] = {0, 0, 0}, dst[6] = {0}, gd[3] = {1.0f, 0.0f, -0.5f};
    sparse_dense_step(&spec, &o, dense, dst, gd);
    assert_float_equal(dense[0], -0.1 / 2.0, 1e-7);
    assert_float_equal(dense[1], 0, 0);
    assert_float_equal(dense[2], 0.05 / 1.5, 1e-7);
    /* the shape: a tower's last layer has a unit a class */
    assert_int_equal(
        sparse_spec_parse("fields:26,buckets:2^20,dim:8,tower:64,classes:5", &spec, err, 200),
        FR_OK);
    assert_int_equal(spec.classes, 5);
    assert_int_equal(sparse_tower_len(&spec), 208 * 64 + 64 + 64 * 5 + 5);
    assert_int_equal(sparse_dense_len(&spec), 5 + sparse_tower_len(&spec));
    char text[96];
    sparse_spec_format(&spec, text, sizeof(text));
    assert_string_equal(text, "fields:26,buckets:2^20,dim:8,tower:64,classes:5");
    assert_int_equal(sparse_spec_parse("fields:26,buckets:2^20,classes:3", &spec, err, 200),
                     FR_OK); /* hashed multinomial regression */
    assert_int_equal(sparse_row_len(&spec), 3);
}

static void test_ftrl_row_matches_mcmahan_by_hand(void **state)
{
    (void)state;
    sparse_spec_t spec = {.fields = 1, .bits = 4, .dim = 0};
    sparse_optim_t o;
    sparse_optim_defaults(&o, SPARSE_OPTIM_FTRL);
    o.alpha = 0.1f;
    o.beta = 1.0f;
    o.l1 = 0.5f;
    o.l2 = 0.1f;
    assert_int_equal(sparse_state_len(&spec, &o), 2);
    float w = 0, st[2] = {0, 0};
    /* z, n, w after each gradient, from Algorithm 1 of McMahan et al. 2013 */
    const float g[] = {2.0f, -1.0f, 0.5f, 0.01f};
    const double want[][3] = {{2.0, 4.0, -0.0498339},
                              {1.1176418, 5.0, -0.0190274},
                              {1.6281487, 5.25, -0.0341730},
                              {1.6381562, 5.2501, -0.0344759}};
    for (int i = 0; i < 4; i++) {
        sparse_row_step(&spec, &o, &w, st, &g[i]);
        assert_float_equal(st[0], want[i][0], 1e-5);
        assert_float_equal(st[1], want[i][1], 1e-5);
        assert_float_equal(w, want[i][2], 1e-6);
    }
    /* |z| within l1: the weight is exactly 0 */
    float w2 = 0, st2[2] = {0, 0};
    const float small = 0.3f;
    sparse_row_step(&spec, &o, &w2, st2, &small);
    assert_float_equal(st2[0], 0.3f, 1e-7);
    assert_true(w2 == 0.0f);
    /* a finite gradient whose square overflows float: the step is not
     * taken, and the state stays finite */
    float w3 = 0.25f, st3[2] = {1.0f, 4.0f};
    const float huge = 1e20f;
    sparse_row_step(&spec, &o, &w3, st3, &huge);
    assert_float_equal(w3, 0.25f, 0);
    assert_float_equal(st3[0], 1.0f, 0);
    assert_float_equal(st3[1], 4.0f, 0);
    sparse_row_step(&spec, &o, &w3, st3, &g[0]);
    assert_true(isfinite(w3) && isfinite(st3[0]) && isfinite(st3[1]));
    /* the bias: no regularization */
    float b = 0, bst[2] = {0, 0};
    sparse_bias_step(&o, &b, bst, 2.0f);
    assert_float_equal(b, -2.0 / ((1.0 + 2.0) / 0.1), 1e-6);
}

static void test_rows_start_at_a_value_of_seed_and_row_alone(void **state)
{
    (void)state;
    sparse_spec_t spec = {.fields = 1, .bits = 20, .dim = 8};
    sparse_optim_t o;
    sparse_optim_defaults(&o, SPARSE_OPTIM_FTRL);
    o.seed = 42;
    o.init_std = 0.05f;
    float p1[9], p2[9], s1[10], s2[10];
    sparse_row_init(&spec, &o, 77, p1, s1);
    sparse_row_init(&spec, &o, 77, p2, s2);
    assert_memory_equal(p1, p2, sizeof(p1));
    assert_float_equal(p1[0], 0, 0);
    for (int k = 0; k < 10; k++)
        assert_float_equal(s1[k], 0, 0);
    sparse_row_init(&spec, &o, 78, p2, s2);
    assert_memory_not_equal(p1 + 1, p2 + 1, 8 * sizeof(float));
    double sum = 0, sq = 0;
    for (uint32_t r = 0; r < 10000; r++) {
        sparse_row_init(&spec, &o, r, p1, s1);
        for (int d = 1; d <= 8; d++) {
            sum += p1[d];
            sq += (double)p1[d] * p1[d];
        }
    }
    double mean = sum / 80000, sd = sqrt(sq / 80000 - mean * mean);
    assert_true(fabs(mean) < 0.002);
    assert_float_equal(sd, 0.05, 0.05 * 0.03);
}

/* ------------------------------------------------------------------------
 * Progressive validation
 * ---------------------------------------------------------------------- */

static void test_auc_and_windows_of_progressive_validation(void **state)
{
    (void)state;
    uint32_t idx[6];
    const float p[] = {0.1f, 0.4f, 0.35f, 0.8f}, y[] = {0, 0, 1, 1};
    assert_float_equal(sparse_auc(p, y, idx, 4), 0.75, 1e-12); /* 3 of 4 pairs ordered */
    const float pt[] = {0.5f, 0.5f, 0.2f, 0.9f}, yt[] = {0, 1, 0, 1};
    /* pairs (pos, neg): (0.5, 0.5) half, (0.5, 0.2) 1, (0.9, 0.5) 1, (0.9, 0.2) 1 */
    assert_float_equal(sparse_auc(pt, yt, idx, 4), 3.5 / 4, 1e-12);
    const float ones[] = {1, 1, 1};
    assert_true(isnan(sparse_auc(p, ones, idx, 3)));
    const float pn[] = {0.2f, NAN, 0.7f}, yn[] = {0, 1, 1};
    assert_true(isnan(sparse_auc(pn, yn, idx, 3))); /* no order: NaN, and no endless loop */

    sparse_prog_t *pv = sparse_prog_new(4);
    assert_non_null(pv);
    sparse_prog_window_t w = {0};
    for (int i = 0; i < 3; i++)
        assert_int_equal(sparse_prog_add(pv, p[i], y[i], &w), 0);
    assert_int_equal(sparse_prog_add(pv, p[3], y[3], &w), 1);
    assert_int_equal(w.index, 0);
    assert_int_equal(w.n, 4);
    double want = (-log(0.9) - log(0.6) - log(0.35) - log(0.8)) / 4;
    assert_float_equal(w.logloss, want, 1e-6);
    assert_float_equal(w.auc, 0.75, 1e-12);
    assert_float_equal(w.ctr, 0.5, 0);
    assert_true(isnan(w.floor));                           /* no planted probabilities */
    assert_int_equal(sparse_prog_add(pv, 0.0f, 1, &w), 0); /* clamped at 1e-7 */
    sparse_prog_open(pv, &w);
    assert_int_equal(w.index, 1);
    assert_int_equal(w.n, 1);
    assert_float_equal(w.logloss, -log(1e-7), 1e-4);
    int64_t n;
    assert_float_equal(sparse_prog_mean(pv, &n), (4 * want - log(1e-7)) / 5, 1e-5);
    assert_int_equal(n, 5);
    sparse_prog_destroy(pv);

    /* the floor: the mean binary entropy of the planted probabilities, when
     * every record of the window carried one */
    pv = sparse_prog_new(2);
    assert_non_null(pv);
    assert_int_equal(sparse_prog_add_planted(pv, 0.5f, 1, 0.25f, &w), 0);
    assert_int_equal(sparse_prog_add_planted(pv, 0.5f, 0, 0.5f, &w), 1);
    double h25 = -(0.25 * log(0.25) + 0.75 * log(0.75)), h50 = log(2.0);
    assert_float_equal(w.floor, (h25 + h50) / 2, 1e-7);
    assert_float_equal(w.logloss, log(2.0), 1e-6);
    assert_int_equal(sparse_prog_add_planted(pv, 0.5f, 1, 0.25f, &w), 0);
    assert_int_equal(sparse_prog_add_planted(pv, 0.5f, 1, NAN, &w), 1); /* one unknown */
    assert_true(isnan(w.floor));
    assert_int_equal(sparse_prog_add_planted(pv, 0.5f, 1, 0.0f, &w), 0); /* entropy 0 */
    assert_int_equal(sparse_prog_add_planted(pv, 0.5f, 1, 1.0f, &w), 1);
    assert_float_equal(w.floor, 0, 0);
    sparse_prog_destroy(pv);
}

/* ------------------------------------------------------------------------
 * Layouts
 * ---------------------------------------------------------------------- */

static void test_criteo_lines_are_hashed_and_bad_ones_refused(void **state)
{
    (void)state;
    sparse_spec_t spec = {.fields = 39, .bits = 22, .dim = 0};
    char line[1024];
    /* label, 13 integers (the 2nd empty, the 5th 1000), 26 categoricals
     * (the 3rd empty) */
    int n = snprintf(line, sizeof(line), "1\t5\t\t2\t0\t1000\t-1\t7\t8\t9\t10\t11\t12\t13");
    for (int k = 0; k < 26; k++)
        n += snprintf(line + n, sizeof(line) - (size_t)n, k == 2 ? "\t" : "\t%08x",
                      0x68fd1e64u + (unsigned)k);
    n += snprintf(line + n, sizeof(line) - (size_t)n, "\n");
    sparse_sample_t s;
    const char *why = NULL;
    assert_int_equal(sparse_parse_criteo(&spec, line, (size_t)n, &s, &why), FR_OK);
    assert_float_equal(s.label, 1, 0);
    assert_int_equal(s.n, 12 + 25);
    long long bucket = 3 + (long long)(log(1000.0) * log(1000.0)); /* 50 */
    assert_int_equal(bucket, 50);
    /* integers hash as their bucket's 8 bytes little-endian: the bucket is the id */
    assert_int_equal(sparse_id_row(4, 50, 22), sparse_hash(4, (const unsigned char[8]){50}, 8, 22));
    const unsigned char b50[8] = {50, 0, 0, 0, 0, 0, 0, 0}, b5[8] = {5, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(3 + (long long)(log(5.0) * log(5.0)), 5);
    assert_int_equal(s.row[3], sparse_hash(4, b50, 8, 22));
    assert_int_equal(s.row[0], sparse_hash(0, b5, 8, 22));
    char hex[9];
    snprintf(hex, sizeof(hex), "%08x", 0x68fd1e64u + 3u);
    /* a categorical: the row of its text's id, after the empty one */
    assert_int_equal(s.row[12 + 2], sparse_id_row(13 + 3, sparse_value_id(hex, 8), 22));
    for (int k = 0; k < s.n; k++)
        assert_float_equal(s.val[k], 1, 0);

    struct {
        const char *line, *why;
    } bad[] = {
        {"1\t1\t2", "columns"},
        {"2\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t",
         "label"},
        {"1\t12a\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t",
         "integer"},
        {"0\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t",
         "columns"},
        {"", "columns"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why = NULL;
        assert_int_equal(sparse_parse_criteo(&spec, bad[i].line, strlen(bad[i].line), &s, &why),
                         FR_ERR_PARSE);
        assert_string_equal(why, bad[i].why);
    }
    /* all 39 features empty: a valid record without features */
    const char *empty =
        "0\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t";
    assert_int_equal(sparse_parse_criteo(&spec, empty, strlen(empty), &s, &why), FR_OK);
    assert_int_equal(s.n, 0);
    spec.fields = 26;
    assert_int_equal(sparse_parse_criteo(&spec, line, (size_t)n, &s, &why), FR_ERR_PARSE);
    assert_string_equal(why, "fields");
}

/* The binary record carries ids: the same rows as the Criteo line it was
 * made from, in 2 + 9n bytes; malformed ones are refused. */
static void test_binary_records_give_the_rows_of_their_criteo_line(void **state)
{
    (void)state;
    sparse_spec_t spec = {.fields = 39, .bits = 20, .dim = 0};
    char err[256], line[512];
    sparse_synth_t *g = sparse_synth_new(3, 0, 1000, err, sizeof(err));
    assert_non_null(g);
    uint8_t rec[SPARSE_BINARY_MAX];
    for (int i = 0; i < 200; i++) {
        size_t n = sparse_synth_next(g, line, sizeof(line), NULL);
        sparse_ids_t ids;
        sparse_sample_t a, b;
        assert_int_equal(sparse_criteo_ids(line, n, &ids, NULL), FR_OK);
        size_t len = sparse_encode_binary(&ids, rec, sizeof(rec));
        assert_int_equal(len, 2 + 9 * (size_t)ids.n);
        assert_int_equal(sparse_parse_criteo(&spec, line, n, &a, NULL), FR_OK);
        assert_int_equal(sparse_parse_binary(&spec, rec, len, &b, NULL), FR_OK);
        assert_float_equal(a.label, b.label, 0);
        assert_int_equal(a.n, b.n);
        assert_memory_equal(a.row, b.row, (size_t)a.n * sizeof(a.row[0]));
    }
    sparse_synth_destroy(g);
    /* label 1, two features: field 13 id 0x0102030405060708, field 0 id 50 */
    const uint8_t two[] = {1, 2, 13, 8, 7, 6, 5, 4, 3, 2, 1, 0, 50, 0, 0, 0, 0, 0, 0, 0};
    sparse_sample_t s;
    const char *why = NULL;
    assert_int_equal(sparse_parse_binary(&spec, two, sizeof(two), &s, &why), FR_OK);
    assert_int_equal(s.n, 2);
    assert_int_equal(s.row[0], sparse_id_row(13, 0x0102030405060708ull, 20));
    assert_int_equal(s.row[1], sparse_id_row(0, 50, 20));
    uint8_t bad[sizeof(two)];
    struct {
        size_t off, len;
        uint8_t byte;
        const char *why;
    } cases[] = {
        {0, 1, 0, "length"},               /* one byte */
        {1, sizeof(two), 3, "length"},     /* says 3 features, holds 2 */
        {0, sizeof(two), 2, "label"},      /* label 2 */
        {2, sizeof(two), 64, "field"},     /* field 64 */
        {0, sizeof(two) - 1, 1, "length"}, /* a byte short */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(bad, two, sizeof(two));
        bad[cases[i].off] = cases[i].byte;
        why = NULL;
        assert_int_equal(sparse_parse_binary(&spec, bad, cases[i].len, &s, &why), FR_ERR_PARSE);
        assert_string_equal(why, cases[i].why);
    }
    spec.fields = 1;
    assert_int_equal(sparse_parse_binary(&spec, two, sizeof(two), &s, &why), FR_ERR_PARSE);
    assert_string_equal(why, "features");
    sparse_ids_t big = {.label = 0.5f, .n = 1};
    assert_int_equal(sparse_encode_binary(&big, rec, sizeof(rec)), 0); /* not a 0/1 label */
    big.label = 1;
    assert_int_equal(sparse_encode_binary(&big, rec, 10), 0); /* 11 bytes needed */
}

/*
 * Records of every layout pass through ingest's batcher by the schema's
 * decode hook: each batch row unpacks to exactly the sample the layout's
 * parser gives (rows, values, label), binary and Criteo records of one
 * value alike, and a malformed record is counted under its reason and
 * covered by the batch, as for dense records. The binary batcher takes
 * each record's planted probability as its aux value (the freshet-p
 * header): it unpacks with the sample; the other has none (NaN).
 */
static void test_sparse_records_pass_through_the_batcher_packed(void **state)
{
    (void)state;
    enum { N = 300, B = 64 };
    trainer_sparse_decoder_t dec = {.spec = {.fields = 39, .bits = 20, .dim = 4},
                                    .layout = SPARSE_LAYOUT_CRITEO};
    trainer_sparse_decoder_t bin = dec;
    bin.layout = SPARSE_LAYOUT_BINARY;
    ingest_schema_t schema = {.features = SPARSE_PACKED(39),
                              .label = INGEST_LABEL_BINARY,
                              .decode = trainer_sparse_decode,
                              .decode_arg = &dec};
    ingest_schema_t schema_bin = schema;
    schema_bin.decode_arg = &bin;
    schema_bin.aux = SPARSE_PLANTED_SLOT(39);
    char err[256], line[512];
    ingest_batcher_t *bt = ingest_batcher_new(&schema, INGEST_FORMAT_CSV, B, err, sizeof(err));
    ingest_batcher_t *bb = ingest_batcher_new(&schema_bin, INGEST_FORMAT_F32, B, err, sizeof(err));
    assert_non_null(bt);
    assert_non_null(bb);
    ingest_batch_t *flushed = NULL;
    assert_int_equal(ingest_batcher_seek(bt, "t", 0, 0, NULL, 0, 0, &flushed), FR_OK);
    assert_int_equal(ingest_batcher_seek(bb, "t", 0, 0, NULL, 0, 0, &flushed), FR_OK);
    sparse_synth_t *g = sparse_synth_new(5, 0, 1000, err, sizeof(err));
    assert_non_null(g);
    static sparse_sample_t want[N];
    static double planted[N];
    ingest_batch_t *got[2][N / B + 2];
    size_t ngot[2] = {0, 0};
    for (int i = 0; i < N; i++) {
        size_t len = sparse_synth_next(g, line, sizeof(line), &planted[i]);
        if (i == 7)
            line[0] = '2', len = strlen(line); /* label 2: refused */
        ingest_reject_t why = INGEST_OK;
        ingest_batch_t *full = NULL;
        assert_int_equal(ingest_batcher_add(bt, "t", 0, i, 0, line, len, &why, &full), FR_OK);
        assert_int_equal(why, i == 7 ? INGEST_REJECT_LABEL_RANGE : INGEST_OK);
        if (full != NULL)
            got[0][ngot[0]++] = full;
        if (i == 7)
            continue;
        assert_int_equal(sparse_parse_criteo(&dec.spec, line, len, &want[i], NULL), FR_OK);
        sparse_ids_t ids;
        uint8_t rec[SPARSE_BINARY_MAX];
        assert_int_equal(sparse_criteo_ids(line, len, &ids, NULL), FR_OK);
        size_t blen = sparse_encode_binary(&ids, rec, sizeof(rec));
        assert_int_equal(
            ingest_batcher_add_aux(bb, "t", 0, i, 0, rec, blen, (float)planted[i], &why, &full),
            FR_OK);
        assert_int_equal(why, INGEST_OK);
        if (full != NULL)
            got[1][ngot[1]++] = full;
    }
    got[0][ngot[0]++] = ingest_batcher_flush(bt);
    got[1][ngot[1]++] = ingest_batcher_flush(bb);
    for (int l = 0; l < 2; l++) {
        int i = 0, covered = 0;
        for (size_t k = 0; k < ngot[l]; k++) {
            const ingest_batch_t *b = got[l][k];
            assert_int_equal(b->features, SPARSE_PACKED(39));
            assert_int_equal(b->nranges, 1);
            covered += (int)(b->ranges[0].to - b->ranges[0].from);
            for (size_t j = 0; j < b->n; j++, i++) {
                i += i == 7; /* the refused record */
                sparse_sample_t s;
                assert_int_equal(sparse_unpack(b->x + j * (size_t)b->features, 39, 20, b->y[j], &s),
                                 FR_OK);
                assert_float_equal(s.label, want[i].label, 0);
                assert_int_equal(s.n, want[i].n);
                assert_memory_equal(s.row, want[i].row, (size_t)s.n * sizeof(s.row[0]));
                assert_memory_equal(s.val, want[i].val, (size_t)s.n * sizeof(s.val[0]));
                assert_memory_equal(s.field, want[i].field, (size_t)s.n); /* the tower's slots */
                if (l == 1)
                    assert_float_equal(s.planted, (float)planted[i], 0);
                else
                    assert_true(isnan(s.planted));
            }
            ingest_batch_destroy(got[l][k]);
        }
        assert_int_equal(i, N);
        assert_int_equal(covered, N); /* the refused record's position too */
    }
    /* an aux slot outside the row is refused */
    schema_bin.aux = SPARSE_PACKED(39);
    assert_null(ingest_batcher_new(&schema_bin, INGEST_FORMAT_F32, B, err, sizeof(err)));
    assert_non_null(strstr(err, "aux slot"));
    /* a packed row that is no sample: a count above F, a row beyond 2^B */
    float x[SPARSE_PACKED(39)];
    sparse_sample_t s;
    sparse_pack(&want[0], 39, x);
    assert_int_equal(sparse_unpack(x, 39, 20, 0, &s), FR_OK);
    assert_int_equal(sparse_unpack(x, 39, 4, 0, &s), FR_ERR_PARSE);
    x[0] = 40;
    assert_int_equal(sparse_unpack(x, 39, 20, 0, &s), FR_ERR_PARSE);
    x[0] = 1.5f;
    assert_int_equal(sparse_unpack(x, 39, 20, 0, &s), FR_ERR_PARSE);
    /* a field that is no field: below 0, 64 or more, not a whole number, NaN */
    const float bad_field[] = {-1.0f, 64.0f, 2.5f, NAN};
    for (size_t i = 0; i < sizeof(bad_field) / sizeof(bad_field[0]); i++) {
        sparse_pack(&want[0], 39, x);
        assert_true(want[0].n > 0);
        x[1 + 2 * 39] = bad_field[i];
        assert_int_equal(sparse_unpack(x, 39, 20, 0, &s), FR_ERR_PARSE);
    }
    sparse_layout_t layout;
    assert_int_equal(sparse_layout_parse("binary", &layout), FR_OK);
    assert_int_equal(layout, SPARSE_LAYOUT_BINARY);
    assert_int_equal(sparse_layout_parse("csv", &layout), FR_ERR_INVAL);
    sparse_synth_destroy(g);
    ingest_batcher_destroy(bt);
    ingest_batcher_destroy(bb);
}

static void test_libsvm_lines_are_hashed_and_bad_ones_refused(void **state)
{
    (void)state;
    sparse_spec_t spec = {.fields = 3, .bits = 16, .dim = 0};
    sparse_sample_t s;
    const char *why = NULL, *line = "-1 user=42:1  12:0.5\r\n";
    assert_int_equal(sparse_parse_libsvm(&spec, line, strlen(line), &s, &why), FR_OK);
    assert_float_equal(s.label, 0, 0);
    assert_int_equal(s.n, 2);
    assert_int_equal(s.row[0], sparse_id_row(0, sparse_value_id("user=42", 7), 16));
    assert_int_equal(s.row[1], sparse_id_row(0, sparse_value_id("12", 2), 16));
    assert_float_equal(s.val[1], 0.5, 0);
    const char *tiny = "1 a:1e-40 b:-1e9";
    assert_int_equal(sparse_parse_libsvm(&spec, tiny, strlen(tiny), &s, &why), FR_OK);
    assert_true(fabsf(s.val[0]) < 1e-38f); /* an underflow is a value near 0 */
    assert_float_equal(s.val[1], -1e9, 0);
    assert_int_equal(sparse_parse_libsvm(&spec, "+1", 2, &s, &why), FR_OK);
    assert_float_equal(s.label, 1, 0);
    assert_int_equal(s.n, 0);
    struct {
        const char *line, *why;
    } bad[] = {
        {"", "label"},        {"2 a:1", "label"},
        {"x a:1", "label"},   {"1 a", "index"},
        {"1 :1", "index"},    {"1 a:x", "value"},
        {"1 a:nan", "value"}, {"1 a:1 b:1 c:1 d:1", "features"},
        {"1 a:2e9", "value"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why = NULL;
        assert_int_equal(sparse_parse_libsvm(&spec, bad[i].line, strlen(bad[i].line), &s, &why),
                         FR_ERR_PARSE);
        assert_string_equal(why, bad[i].why);
    }
    /* a softmax over 3 classes: the label is a class, 0, 1 or 2 */
    spec.classes = 3;
    assert_int_equal(sparse_parse_libsvm(&spec, "2 a:1", 5, &s, &why), FR_OK);
    assert_float_equal(s.label, 2, 0);
    assert_int_equal(sparse_parse_libsvm(&spec, "0 a:1", 5, &s, &why), FR_OK);
    assert_float_equal(s.label, 0, 0);
    static const char *const no_class[] = {"3 a:1", "-1 a:1", "1.5 a:1", "+3 a:1", "nan a:1"};
    for (size_t i = 0; i < sizeof(no_class) / sizeof(no_class[0]); i++) {
        why = NULL;
        if (sparse_parse_libsvm(&spec, no_class[i], strlen(no_class[i]), &s, &why) != FR_ERR_PARSE)
            fail_msg("'%s' was accepted by a model of 3 classes", no_class[i]);
        assert_string_equal(why, "label");
    }
    /* and a binary record's byte 0 */
    const uint8_t rec2[2] = {2, 0}, rec3[2] = {3, 0};
    assert_int_equal(sparse_parse_binary(&spec, rec2, 2, &s, &why), FR_OK);
    assert_float_equal(s.label, 2, 0);
    assert_int_equal(sparse_parse_binary(&spec, rec3, 2, &s, &why), FR_ERR_PARSE);
    assert_string_equal(why, "label");
    spec.classes = 0;
    assert_int_equal(sparse_parse_binary(&spec, rec2, 2, &s, &why), FR_ERR_PARSE);
}

/* ------------------------------------------------------------------------
 * The synthetic stream
 * ---------------------------------------------------------------------- */

static void test_synthetic_stream_is_seeded_criteo_with_a_floor(void **state)
{
    (void)state;
    char err[256];
    sparse_synth_t *a = sparse_synth_new(7, 0, 10000, err, sizeof(err));
    sparse_synth_t *b = sparse_synth_new(7, 0, 10000, err, sizeof(err));
    sparse_synth_t *c = sparse_synth_new(8, 0, 10000, err, sizeof(err));
    sparse_synth_t *d = sparse_synth_new(7, 0.2, 10000, err, sizeof(err));
    assert_true(a != NULL && b != NULL && c != NULL && d != NULL);
    assert_null(sparse_synth_new(7, -0.1, 10000, err, sizeof(err)));
    assert_null(sparse_synth_new(7, 0, 0, err, sizeof(err)));
    sparse_spec_t spec = {.fields = 39, .bits = 20, .dim = 0};
    char la[512], lb[512], lc[512], ld[512];
    int same_c = 0, same_d_before = 0, same_d_after = 0;
    double psum = 0;
    for (int i = 0; i < 30000; i++) {
        double p;
        size_t na = sparse_synth_next(a, la, sizeof(la), &p);
        size_t nb = sparse_synth_next(b, lb, sizeof(lb), NULL);
        sparse_synth_next(c, lc, sizeof(lc), NULL);
        sparse_synth_next(d, ld, sizeof(ld), NULL);
        assert_true(p > 0 && p < 1);
        psum += p;
        assert_int_equal(na, nb);
        assert_memory_equal(la, lb, na); /* same seed, same stream */
        same_c += strcmp(la, lc) == 0;
        if (i < 10000)
            same_d_before += strcmp(la, ld) == 0;
        else
            same_d_after += strcmp(la, ld) == 0;
        sparse_sample_t s;
        const char *why = "";
        if (sparse_parse_criteo(&spec, la, na, &s, &why) != FR_OK)
            fail_msg("record %d refused (%s): %s", i, why, la);
        assert_true(s.n >= 26 && s.n <= 39);
    }
    assert_int_equal(same_c, 0);
    assert_int_equal(same_d_before, 10000); /* drift starts after the first window */
    assert_true(same_d_after < 100);
    sparse_synth_floor_t f;
    sparse_synth_floor(a, &f);
    assert_int_equal(f.window, 2);
    assert_float_equal(f.ctr, 0.03, 0.006);
    assert_float_equal(psum / 30000, 0.03, 0.004);
    double h = -(f.ctr * log(f.ctr) + (1 - f.ctr) * log1p(-f.ctr));
    /* the planted model explains a real part of the clicks */
    assert_true(f.overall > 0.3 * h && f.overall < 0.9 * h);
    assert_true(isfinite(f.last) && isfinite(f.current));
    sparse_synth_destroy(a);
    sparse_synth_destroy(b);
    sparse_synth_destroy(c);
    sparse_synth_destroy(d);
}

/*
 * Hashed LR and an FM (D = 8) trained online, FTRL on the linear weights
 * and Adagrad (lr 0.02) on the embeddings, on 400,128 synthetic records
 * in batches of 256: the progressive logloss of the last 100,000 closes
 * over a third of the gap from the constant predictor to the Bayes floor,
 * the FM more of it than LR, and neither passes the floor.
 */
static double learn(int dim, float lr, double *floor_out, double *base_out)
{
    enum { B = 256, N = 1563 * B, TAIL = 100000 }; /* whole batches: 400,128 records */
    sparse_spec_t spec = {.fields = 39, .bits = 18, .dim = dim};
    sparse_optim_t o;
    sparse_optim_defaults(&o, SPARSE_OPTIM_FTRL);
    o.lr = lr;
    const size_t rows = (size_t)1 << spec.bits, rl = sparse_row_len(&spec),
                 sl = sparse_state_len(&spec, &o);
    float *table = malloc(rows * rl * sizeof(float)), *st = calloc(rows * sl, sizeof(float));
    float *params = malloc(B * SPARSE_FIELDS_MAX * rl * sizeof(float));
    float *grad = malloc(B * SPARSE_FIELDS_MAX * rl * sizeof(float));
    assert_true(table != NULL && st != NULL && params != NULL && grad != NULL);
    for (uint32_t r = 0; r < rows; r++)
        sparse_row_init(&spec, &o, r, table + r * rl, st + r * sl);
    char err[256], line[512];
    sparse_synth_t *g = sparse_synth_new(11, 0, N, err, sizeof(err));
    sparse_batch_t *b = sparse_batch_new(B);
    float bias = 0, bst[2] = {0, 0}, p[B], gbias;
    assert_int_equal(sparse_dense_len(&spec), 1);
    double tail = 0;
    for (int i = 0; i < N; i += B) {
        sparse_batch_clear(b);
        for (int k = 0; k < B; k++) {
            size_t n = sparse_synth_next(g, line, sizeof(line), NULL);
            sparse_sample_t s;
            assert_int_equal(sparse_parse_criteo(&spec, line, n, &s, NULL), FR_OK);
            assert_int_equal(sparse_batch_add(b, &s), FR_OK);
        }
        for (size_t r = 0; r < b->nrows; r++) /* pull */
            memcpy(params + r * rl, table + (size_t)b->rows[r] * rl, rl * sizeof(float));
        sparse_fm_grad(&spec, b, params, &bias, grad, &gbias, p);
        for (int k = 0; k < B; k++)
            if (i + k >= N - TAIL)
                tail += sparse_logloss(p[k], b->samples[k].label);
        for (size_t r = 0; r < b->nrows; r++) /* push and apply */
            sparse_row_step(&spec, &o, table + (size_t)b->rows[r] * rl,
                            st + (size_t)b->rows[r] * sl, grad + r * rl);
        sparse_bias_step(&o, &bias, bst, gbias);
    }
    sparse_synth_floor_t f;
    sparse_synth_floor(g, &f);
    *floor_out = f.overall;
    *base_out = -(f.ctr * log(f.ctr) + (1 - f.ctr) * log1p(-f.ctr));
    sparse_batch_destroy(b);
    sparse_synth_destroy(g);
    free(table);
    free(st);
    free(params);
    free(grad);
    return tail / TAIL;
}

static void test_a_model_learns_the_planted_stream(void **state)
{
    (void)state;
    double floor, base;
    double lr = learn(0, 0.02f, &floor, &base);
    double fm = learn(8, 0.02f, &floor, &base);
    fprintf(stderr, "constant %.5f, lr %.5f, fm %.5f, floor %.5f\n", base, lr, fm, floor);
    assert_true(lr < base - 0.35 * (base - floor));
    assert_true(fm < lr);
    assert_true(fm > floor); /* nothing beats the floor */
}

/* A normal from h (Box-Muller on two of its uniforms). */
static double normal_of(uint64_t h)
{
    uint64_t a = sparse_mix64(h), b = sparse_mix64(a);
    double u = ((double)(a >> 11) + 0.5) / 9007199254740992.0;
    double v = (double)(b >> 11) / 9007199254740992.0;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/*
 * A softmax model trained online (progressive validation) on records of 6
 * fields of 200 values each, whose classes (4) are drawn from a planted
 * multinomial regression (weights N(0, 0.8) per field, value and class):
 * over the last 30,000 of 150,016 records its logloss closes most of the
 * gap from the classes' marginal entropy to the Bayes floor (the mean
 * entropy of the planted probabilities). Hashed multinomial regression
 * (D = 0) and embeddings through a tower (D = 4, tower:16) alike.
 */
static double learn_softmax(const char *text, double *floor_out, double *base_out)
{
    enum { B = 256, N = 586 * B, TAIL = 30000, F = 6, V = 200, C = 4 };
    sparse_spec_t spec;
    char err[256];
    assert_int_equal(sparse_spec_parse(text, &spec, err, sizeof(err)), FR_OK);
    assert_int_equal(spec.classes, C);
    sparse_optim_t o;
    sparse_optim_defaults(&o, SPARSE_OPTIM_FTRL);
    o.lr = 0.05f;
    const size_t rows = (size_t)1 << spec.bits, rl = sparse_row_len(&spec),
                 sl = sparse_state_len(&spec, &o), nd = sparse_dense_len(&spec);
    float *table = malloc(rows * rl * sizeof(float)), *st = calloc(rows * sl, sizeof(float));
    float *params = malloc(B * SPARSE_FIELDS_MAX * rl * sizeof(float));
    float *grad = malloc(B * SPARSE_FIELDS_MAX * rl * sizeof(float));
    float *dense = malloc(nd * sizeof(float)), *gdense = malloc(nd * sizeof(float));
    float *dst = calloc(sparse_dense_state_len(&spec), sizeof(float));
    assert_true(table != NULL && st != NULL && params != NULL && grad != NULL && dense != NULL &&
                gdense != NULL && dst != NULL);
    for (uint32_t r = 0; r < rows; r++)
        sparse_row_init(&spec, &o, r, table + r * rl, st + r * sl);
    sparse_dense_init(&spec, 3, dense);
    sparse_batch_t *b = sparse_batch_new(B);
    float p[B];
    double tail = 0, floor = 0, counts[C] = {0};
    uint64_t h = 99;
    for (int i = 0; i < N; i += B) {
        sparse_batch_clear(b);
        for (int k = 0; k < B; k++) {
            sparse_sample_t s = {.n = F, .planted = NAN};
            double z[C] = {0}, zs = 0;
            for (int f = 0; f < F; f++) {
                h = sparse_mix64(h);
                uint64_t v = h % V;
                s.row[f] = sparse_id_row(f, v, spec.bits);
                s.val[f] = 1;
                s.field[f] = (uint8_t)f;
                for (int c = 0; c < C; c++)
                    z[c] += 0.8 * normal_of(((uint64_t)f << 40) ^ (v << 8) ^ (uint64_t)c);
            }
            for (int c = 0; c < C; c++)
                zs += (z[c] = exp(z[c]));
            h = sparse_mix64(h);
            double u = (double)(h >> 11) / 9007199254740992.0 * zs, acc = 0;
            int y = C - 1;
            for (int c = 0; c < C; c++)
                if (u < (acc += z[c])) {
                    y = c;
                    break;
                }
            s.label = (float)y;
            if (i + k >= N - TAIL) {
                for (int c = 0; c < C; c++)
                    floor -= z[c] / zs * log(z[c] / zs);
                counts[y]++;
            }
            assert_int_equal(sparse_batch_add(b, &s), FR_OK);
        }
        for (size_t r = 0; r < b->nrows; r++)
            memcpy(params + r * rl, table + (size_t)b->rows[r] * rl, rl * sizeof(float));
        sparse_fm_grad(&spec, b, params, dense, grad, gdense, p);
        for (int k = 0; k < B; k++)
            if (i + k >= N - TAIL)
                tail += sparse_logloss(p[k], 1.0); /* p is the true class's */
        for (size_t r = 0; r < b->nrows; r++)
            sparse_row_step(&spec, &o, table + (size_t)b->rows[r] * rl,
                            st + (size_t)b->rows[r] * sl, grad + r * rl);
        sparse_dense_step(&spec, &o, dense, dst, gdense);
    }
    *floor_out = floor / TAIL;
    *base_out = 0;
    for (int c = 0; c < C; c++)
        *base_out -= counts[c] / TAIL * log(counts[c] / TAIL);
    sparse_batch_destroy(b);
    free(table);
    free(st);
    free(params);
    free(grad);
    free(dense);
    free(gdense);
    free(dst);
    return tail / TAIL;
}

static void test_a_softmax_model_learns_a_planted_multinomial(void **state)
{
    (void)state;
    double floor, base;
    double lr = learn_softmax("fields:6,buckets:2^14,classes:4", &floor, &base);
    double tw = learn_softmax("fields:6,buckets:2^14,dim:4,tower:16,classes:4", &floor, &base);
    printf("marginal entropy %.5f, multinomial %.5f, tower %.5f, floor %.5f\n", base, lr, tw,
           floor);
    assert_true(lr > floor - 0.01); /* no learner beats the floor by more than noise */
    assert_true(lr < base - 0.75 * (base - floor));
    assert_true(tw < base - 0.75 * (base - floor));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_is_parsed_and_bad_ones_refused),
        cmocka_unit_test(test_hash_is_xxh64_seeded_by_field),
        cmocka_unit_test(test_a_batch_pulls_each_row_once),
        cmocka_unit_test(test_fm_gradient_matches_finite_differences),
        cmocka_unit_test(test_adagrad_row_matches_torch_by_hand),
        cmocka_unit_test(test_ftrl_row_matches_mcmahan_by_hand),
        cmocka_unit_test(test_a_softmax_row_steps_each_class_by_hand),
        cmocka_unit_test(test_rows_start_at_a_value_of_seed_and_row_alone),
        cmocka_unit_test(test_auc_and_windows_of_progressive_validation),
        cmocka_unit_test(test_criteo_lines_are_hashed_and_bad_ones_refused),
        cmocka_unit_test(test_libsvm_lines_are_hashed_and_bad_ones_refused),
        cmocka_unit_test(test_binary_records_give_the_rows_of_their_criteo_line),
        cmocka_unit_test(test_sparse_records_pass_through_the_batcher_packed),
        cmocka_unit_test(test_synthetic_stream_is_seeded_criteo_with_a_floor),
        cmocka_unit_test(test_a_model_learns_the_planted_stream),
        cmocka_unit_test(test_a_softmax_model_learns_a_planted_multinomial),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
