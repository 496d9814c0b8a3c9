/*
 * test_compare.c - the arithmetic of freshet compare (app/compare_stats.c)
 * against hand computations: nearest-rank quantiles, mean and sample
 * standard deviation, the first crossing of a target, curves read between
 * their points, the aggregates of a mode over its seeds, and the verdict on
 * mode auto's promise (app/compare_verdict.c).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "app/compare.h"

static void test_quantiles_take_the_nearest_rank(void **state)
{
    (void)state;
    double v[] = {7, 1, 3, 9, 5, 2, 8, 4, 6, 10}; /* 1..10 */
    assert_true(cmp_quantile(v, 10, 0.50) == 5);  /* ceil(5) = 5th */
    assert_true(cmp_quantile(v, 10, 0.99) == 10); /* ceil(9.9) = 10th */
    assert_true(cmp_quantile(v, 10, 0.0) == 1);
    double one[] = {4};
    assert_true(cmp_quantile(one, 1, 0.99) == 4);
    assert_true(isnan(cmp_quantile(v, 0, 0.5)));
}

static void test_mean_and_sample_sd_skip_nan(void **state)
{
    (void)state;
    double v[] = {2, 4, NAN, 4, 4, 5, 5, 7, 9}; /* mean 5, sum of squares 32 over 8 values */
    double mean, sd;
    size_t k;
    cmp_mean_sd(v, 9, &mean, &sd, &k);
    assert_int_equal(k, 8);
    assert_true(fabs(mean - 5.0) < 1e-12);
    assert_true(fabs(sd - sqrt(32.0 / 7.0)) < 1e-12);
    double one[] = {0.8};
    cmp_mean_sd(one, 1, &mean, &sd, &k);
    assert_true(mean == 0.8 && sd == 0.0);
    double none[] = {NAN};
    cmp_mean_sd(none, 1, &mean, &sd, &k);
    assert_int_equal(k, 0);
    assert_true(isnan(mean) && isnan(sd));
}

static cmp_point_t pts[] = {
    {0, 0.0, 0, 0.10, 2.3},
    {10, 1.0, 640, 0.60, 1.0},
    {20, 2.0, 1280, 0.55, 1.1}, /* a dip: the crossing is the first point, not the last */
    {30, 4.0, 1920, 0.80, 0.6},
};

static void test_first_crossing_is_the_first_point_at_or_above(void **state)
{
    (void)state;
    cmp_curve_t c = {pts, 4};
    double t, s;
    assert_int_equal(cmp_first_crossing(&c, 0.55, &t, &s), 0);
    assert_true(t == 1.0 && s == 640);
    assert_int_equal(cmp_first_crossing(&c, 0.80, &t, &s), 0); /* equal counts */
    assert_true(t == 4.0 && s == 1920);
    assert_int_equal(cmp_first_crossing(&c, 0.81, &t, &s), -1);
    assert_true(isnan(t) && isnan(s));
}

static void test_curve_is_linear_between_points(void **state)
{
    (void)state;
    cmp_curve_t c = {pts, 4};
    assert_true(fabs(cmp_curve_at(&c, 0, 0.5) - 0.35) < 1e-12);   /* time */
    assert_true(fabs(cmp_curve_at(&c, 0, 3.0) - 0.675) < 1e-12);  /* 0.55 + 0.5 x 0.25 */
    assert_true(fabs(cmp_curve_at(&c, 1, 1600) - 0.675) < 1e-12); /* samples */
    assert_true(cmp_curve_at(&c, 1, 1920) == 0.80);
    assert_true(isnan(cmp_curve_at(&c, 0, 4.5))); /* after the end */
}

static void run_set(cmp_run_t *r, const char *mode, int workers, double acc, double sps, double t)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->mode, sizeof(r->mode), "%s", mode);
    r->workers = workers;
    r->ok = 1;
    r->accuracy = acc;
    r->samples_per_s = sps;
    r->target_t_s = t;
    r->target_samples = isnan(t) ? NAN : 1000;
    r->waits_s = r->rounds = r->tau_p50 = r->tau_p99 = r->lr_eff_mean = 0;
}

static void test_aggregates_over_seeds_and_speedup(void **state)
{
    (void)state;
    cmp_run_t runs[5];
    run_set(&runs[0], "async", 2, 0.80, 1000, 2.0);
    run_set(&runs[1], "async", 2, 0.82, 3000, 4.0);
    run_set(&runs[2], "sync", 2, 0.84, 1000, NAN); /* never reached */
    run_set(&runs[3], "sync", 2, 0.86, 1000, 5.0);
    run_set(&runs[4], "sync", 2, 0.0, 0, NAN);
    runs[4].ok = 0; /* failed: left out of every mean */
    snprintf(runs[4].error, sizeof(runs[4].error), "boom");
    cmp_grid_t g = {.runs = runs, .nruns = 5, .target = 0.5};
    assert_int_equal(cmp_aggregate(&g), 0);
    assert_int_equal(g.naggs, 2);
    const cmp_agg_t *as = &g.aggs[0], *sy = &g.aggs[1];
    assert_string_equal(as->mode, "async");
    assert_true(fabs(as->acc_mean - 0.81) < 1e-12);
    assert_true(fabs(as->acc_sd - sqrt(2 * 0.01 * 0.01)) < 1e-12);
    assert_true(fabs(as->t_target_mean - 3.0) < 1e-12);
    assert_int_equal(as->reached, 2);
    assert_int_equal(sy->runs, 3);
    assert_int_equal(sy->ok, 2);
    assert_int_equal(sy->reached, 1);
    assert_true(fabs(sy->t_target_mean - 5.0) < 1e-12); /* over the run that reached */
    assert_string_equal(sy->error, "boom");
    /* the baseline is async at the smallest workers: 2000 samples/s */
    assert_string_equal(g.baseline_mode, "async");
    assert_true(fabs(as->speedup - 1.0) < 1e-12);
    assert_true(fabs(sy->speedup - 0.5) < 1e-12);
    assert_true(fabs(cmp_default_target(&g, 0.98) - 0.98 * 0.85) < 1e-12);
    free(g.aggs);
}

/* The verdict's line on auto for runs[n] (one cell): its status and text. */
static void auto_verdict(cmp_run_t *runs, size_t n, char *status, char *text)
{
    cmp_grid_t g = {.runs = runs, .nruns = n, .target = 0.5};
    cmp_verdict_t *v = malloc(sizeof(*v));
    assert_non_null(v);
    assert_int_equal(cmp_aggregate(&g), 0);
    cmp_verdict(&g, v);
    status[0] = text[0] = '\0';
    for (size_t i = 0; i < v->n; i++)
        if (strncmp(v->lines[i].question, "auto:", 5) == 0) {
            strcpy(status, v->lines[i].status);
            strcpy(text, v->lines[i].text);
        }
    free(v);
    free(g.aggs);
}

static void test_auto_is_judged_on_half_a_point_and_1_2x_the_fastest(void **state)
{
    (void)state;
    char status[24], text[1024];
    cmp_run_t runs[4];
    /* 0.3 points below adaptive, 2.3 s against 2.0 (1.15x): held */
    run_set(&runs[0], "adaptive", 4, 0.840, 1000, 2.0);
    run_set(&runs[1], "adaptive", 4, 0.840, 1000, 2.0);
    run_set(&runs[2], "auto", 4, 0.837, 1000, 2.3);
    run_set(&runs[3], "auto", 4, 0.837, 1000, 2.3);
    auto_verdict(runs, 4, status, text);
    assert_string_equal(status, "held");
    assert_non_null(strstr(text, "4w: held"));
    /* 2.5 s is 1.25x the fastest: did not hold, however accurate */
    runs[2].target_t_s = runs[3].target_t_s = 2.5;
    runs[2].accuracy = runs[3].accuracy = 0.845;
    auto_verdict(runs, 4, status, text);
    assert_string_equal(status, "did not hold");
    /* one auto run short of a target adaptive reached every time */
    runs[2].target_t_s = 2.0;
    runs[3].target_t_s = NAN;
    auto_verdict(runs, 4, status, text);
    assert_string_equal(status, "did not hold");
    /* in time, 1.5 points below with a seed sd of 0.7: decisively less accurate */
    runs[2].target_t_s = runs[3].target_t_s = 2.0;
    runs[2].accuracy = 0.820;
    runs[3].accuracy = 0.830;
    auto_verdict(runs, 4, status, text);
    assert_string_equal(status, "did not hold");
    /* 1.5 points below with a seed sd of 2.1 points: within noise */
    runs[2].accuracy = 0.810;
    runs[3].accuracy = 0.840;
    auto_verdict(runs, 4, status, text);
    assert_non_null(strstr(text, "4w: within noise"));
    /* no mode reached the target every time: accuracy alone decides */
    for (int i = 0; i < 4; i++)
        runs[i].target_t_s = NAN;
    runs[0].target_t_s = 2.0; /* adaptive reached it once of twice */
    runs[2].accuracy = runs[3].accuracy = 0.836;
    auto_verdict(runs, 4, status, text);
    assert_string_equal(status, "held");
    runs[2].accuracy = runs[3].accuracy = 0.830;
    auto_verdict(runs, 4, status, text);
    assert_string_equal(status, "did not hold");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantiles_take_the_nearest_rank),
        cmocka_unit_test(test_mean_and_sample_sd_skip_nan),
        cmocka_unit_test(test_first_crossing_is_the_first_point_at_or_above),
        cmocka_unit_test(test_curve_is_linear_between_points),
        cmocka_unit_test(test_aggregates_over_seeds_and_speedup),
        cmocka_unit_test(test_auto_is_judged_on_half_a_point_and_1_2x_the_fastest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
