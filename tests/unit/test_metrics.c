/*
 * test_metrics.c - the metrics registry: the exact Prometheus text, escaping,
 * number formatting, name validation and concurrent updates.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/common.h"

/* Renders reg and asserts the whole text, and that *len matches it. */
static void assert_render(fr_metrics_t *reg, const char *expected)
{
    size_t len = 12345;
    char *text = fr_metrics_render(reg, &len);
    assert_non_null(text);
    assert_string_equal(text, expected);
    assert_int_equal(len, strlen(expected));
    free(text);
}

static void test_metrics_render_counter_gauge_and_histogram_exactly(void **state)
{
    (void)state;
    fr_metrics_t *reg = fr_metrics_new();
    assert_non_null(reg);

    const char *const rej_labels[] = {"model", "reason"};
    fr_metric_t *rej = fr_metrics_counter(reg, "freshet_records_rejected_total",
                                          "Records rejected, by reason.", 2, rej_labels);
    assert_non_null(rej);
    fr_metric_t *lr = fr_metrics_gauge(reg, "freshet_lr_eff", "Effective learning rate.", 0, NULL);
    assert_non_null(lr);
    const double bounds[] = {0.5, 1, 2.5};
    const char *const worker[] = {"worker"};
    fr_metric_t *stal = fr_metrics_histogram(
        reg, "freshet_staleness_versions", "Staleness of applied gradients.", 3, bounds, 1, worker);
    assert_non_null(stal);
    const char *const topic[] = {"topic"};
    fr_metric_t *lag = fr_metrics_gauge(reg, "freshet_consumergroup_lag", "Lag.", 1, topic);
    assert_non_null(lag);
    fr_metric_t *total = fr_metrics_counter(reg, "freshet_samples_total", "Samples.", 0, NULL);
    assert_non_null(total);

    const char *const bad_csv[] = {"mnist", "bad_csv"};
    const char *const nan[] = {"mnist", "nan"};
    fr_series_add(fr_metric_series(rej, bad_csv), 3);
    fr_series_t *s_nan = fr_metric_series(rej, nan);
    fr_series_add(s_nan, 1);
    fr_series_add(s_nan, 0.5);
    fr_series_set(fr_metric_series(lr, NULL), 0.05);
    const char *const w0[] = {"0"};
    fr_series_t *h = fr_metric_series(stal, w0);
    const double obs[] = {0.25, 1, 1, 3, 0.5};
    for (size_t i = 0; i < 5; i++)
        fr_series_observe(h, obs[i]);

    assert_render(reg, "# HELP freshet_records_rejected_total Records rejected, by reason.\n"
                       "# TYPE freshet_records_rejected_total counter\n"
                       "freshet_records_rejected_total{model=\"mnist\",reason=\"bad_csv\"} 3\n"
                       "freshet_records_rejected_total{model=\"mnist\",reason=\"nan\"} 1.5\n"
                       "# HELP freshet_lr_eff Effective learning rate.\n"
                       "# TYPE freshet_lr_eff gauge\n"
                       "freshet_lr_eff 0.05\n"
                       "# HELP freshet_staleness_versions Staleness of applied gradients.\n"
                       "# TYPE freshet_staleness_versions histogram\n"
                       "freshet_staleness_versions_bucket{worker=\"0\",le=\"0.5\"} 2\n"
                       "freshet_staleness_versions_bucket{worker=\"0\",le=\"1\"} 4\n"
                       "freshet_staleness_versions_bucket{worker=\"0\",le=\"2.5\"} 4\n"
                       "freshet_staleness_versions_bucket{worker=\"0\",le=\"+Inf\"} 5\n"
                       "freshet_staleness_versions_sum{worker=\"0\"} 5.75\n"
                       "freshet_staleness_versions_count{worker=\"0\"} 5\n"
                       "# HELP freshet_consumergroup_lag Lag.\n"
                       "# TYPE freshet_consumergroup_lag gauge\n"
                       "# HELP freshet_samples_total Samples.\n"
                       "# TYPE freshet_samples_total counter\n"
                       "freshet_samples_total 0\n");
    fr_metrics_destroy(reg);
}

static void test_metrics_render_unlabelled_histogram_with_only_le(void **state)
{
    (void)state;
    fr_metrics_t *reg = fr_metrics_new();
    assert_non_null(reg);
    const double bounds[] = {1e-07, 0.25};
    fr_metric_t *m = fr_metrics_histogram(reg, "freshness_seconds", "", 2, bounds, 0, NULL);
    assert_non_null(m);
    fr_series_observe(fr_metric_series(m, NULL), 0.1);
    fr_metric_t *e = fr_metrics_histogram(reg, "no_bounds", "h", 0, NULL, 0, NULL);
    assert_non_null(e);
    fr_series_observe(fr_metric_series(e, NULL), -2);
    assert_render(reg, "# HELP freshness_seconds \n"
                       "# TYPE freshness_seconds histogram\n"
                       "freshness_seconds_bucket{le=\"1e-07\"} 0\n"
                       "freshness_seconds_bucket{le=\"0.25\"} 1\n"
                       "freshness_seconds_bucket{le=\"+Inf\"} 1\n"
                       "freshness_seconds_sum 0.1\n"
                       "freshness_seconds_count 1\n"
                       "# HELP no_bounds h\n"
                       "# TYPE no_bounds histogram\n"
                       "no_bounds_bucket{le=\"+Inf\"} 1\n"
                       "no_bounds_sum -2\n"
                       "no_bounds_count 1\n");
    fr_metrics_destroy(reg);
}

static void test_metrics_escape_help_and_label_values(void **state)
{
    (void)state;
    fr_metrics_t *reg = fr_metrics_new();
    assert_non_null(reg);
    const char *const labels[] = {"path"};
    fr_metric_t *m =
        fr_metrics_counter(reg, "escapes_total", "back\\slash \"quoted\"\nnext line", 1, labels);
    assert_non_null(m);
    const char *const value[] = {"C:\\dir \"x\"\ny \xC3\xA9"};
    fr_series_add(fr_metric_series(m, value), 2);
    assert_render(reg, "# HELP escapes_total back\\\\slash \"quoted\"\\nnext line\n"
                       "# TYPE escapes_total counter\n"
                       "escapes_total{path=\"C:\\\\dir \\\"x\\\"\\ny \xC3\xA9\"} 2\n");
    fr_metrics_destroy(reg);
}

static void test_metrics_format_numbers_as_prometheus_reads_them(void **state)
{
    (void)state;
    static const struct {
        double v;
        const char *text;
    } cases[] = {
        {0.0, "0"},
        {-0.0, "0"},
        {3, "3"},
        {-3, "-3"},
        {1234567, "1234567"},
        {1e15, "1000000000000000"},
        {9007199254740991.0, "9007199254740991"},
        {1e20, "1e+20"},
        {0.1, "0.1"},
        {1e-07, "1e-07"},
        {0.1 + 0.2, "0.30000000000000004"},
        {1.0 / 3.0, "0.3333333333333333"},
        {123.456, "123.456"},
        {-2.5, "-2.5"},
        {HUGE_VAL, "+Inf"},
        {-HUGE_VAL, "-Inf"},
        {NAN, "NaN"},
    };
    fr_metrics_t *reg = fr_metrics_new();
    assert_non_null(reg);
    fr_metric_t *g = fr_metrics_gauge(reg, "g", "x", 0, NULL);
    assert_non_null(g);
    fr_series_t *s = fr_metric_series(g, NULL);
    assert_non_null(s);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char expected[128];
        snprintf(expected, sizeof(expected), "# HELP g x\n# TYPE g gauge\ng %s\n", cases[i].text);
        fr_series_set(s, cases[i].v);
        assert_render(reg, expected);
    }
    fr_metrics_destroy(reg);
}

static void test_metrics_histogram_bucket_edges_and_nan(void **state)
{
    (void)state;
    fr_metrics_t *reg = fr_metrics_new();
    assert_non_null(reg);
    const double bounds[] = {1, 2, 4};
    fr_metric_t *m = fr_metrics_histogram(reg, "h", "x", 3, bounds, 0, NULL);
    assert_non_null(m);
    fr_series_t *s = fr_metric_series(m, NULL);
    /* A value equal to a bound counts in that bound's bucket (le). */
    const double obs[] = {1, 2, 4, 4.5, -1, HUGE_VAL};
    for (size_t i = 0; i < 6; i++)
        fr_series_observe(s, obs[i]);
    assert_render(reg, "# HELP h x\n# TYPE h histogram\n"
                       "h_bucket{le=\"1\"} 2\n"
                       "h_bucket{le=\"2\"} 3\n"
                       "h_bucket{le=\"4\"} 4\n"
                       "h_bucket{le=\"+Inf\"} 6\n"
                       "h_sum +Inf\n"
                       "h_count 6\n");
    fr_series_observe(s, NAN);
    assert_true(fr_series_value(s) == 7.0);
    assert_render(reg, "# HELP h x\n# TYPE h histogram\n"
                       "h_bucket{le=\"1\"} 2\n"
                       "h_bucket{le=\"2\"} 3\n"
                       "h_bucket{le=\"4\"} 4\n"
                       "h_bucket{le=\"+Inf\"} 7\n"
                       "h_sum NaN\n"
                       "h_count 7\n");
    fr_metrics_destroy(reg);
}

static void test_metrics_counters_ignore_decrements_and_sets(void **state)
{
    (void)state;
    fr_metrics_t *reg = fr_metrics_new();
    assert_non_null(reg);
    fr_series_t *c = fr_metric_series(fr_metrics_counter(reg, "c_total", "c", 0, NULL), NULL);
    fr_series_t *g = fr_metric_series(fr_metrics_gauge(reg, "g", "g", 0, NULL), NULL);
    assert_non_null(c);
    assert_non_null(g);
    fr_series_add(c, 2);
    fr_series_add(c, -1);
    fr_series_add(c, NAN);
    fr_series_set(c, 100);
    fr_series_observe(c, 5);
    assert_true(fr_series_value(c) == 2.0);
    fr_series_set(g, 10);
    fr_series_add(g, -2.5);
    fr_series_observe(g, 5);
    assert_true(fr_series_value(g) == 7.5);
    /* NULL series (a failed registration) are ignored. */
    fr_series_add(NULL, 1);
    fr_series_set(NULL, 1);
    fr_series_observe(NULL, 1);
    assert_true(fr_series_value(NULL) == 0.0);
    assert_null(fr_metric_series(NULL, NULL));
    fr_metrics_destroy(reg);
}

static void test_metrics_series_are_found_again_by_label_values(void **state)
{
    (void)state;
    fr_metrics_t *reg = fr_metrics_new();
    assert_non_null(reg);
    const char *const labels[] = {"topic", "partition"};
    fr_metric_t *m = fr_metrics_gauge(reg, "lag", "x", 2, labels);
    const char *const a[] = {"t", "0"};
    const char *const a2[] = {"t", "0"};
    const char *const b[] = {"t", "1"};
    fr_series_t *sa = fr_metric_series(m, a);
    assert_non_null(sa);
    assert_ptr_equal(fr_metric_series(m, a2), sa);
    assert_ptr_not_equal(fr_metric_series(m, b), sa);
    /* A zero-label family has exactly one series. */
    fr_metric_t *z = fr_metrics_gauge(reg, "z", "x", 0, NULL);
    assert_ptr_equal(fr_metric_series(z, NULL), fr_metric_series(z, NULL));
    fr_metrics_destroy(reg);
}

static void test_metrics_reregistering_returns_the_same_family_or_null(void **state)
{
    (void)state;
    fr_metrics_t *reg = fr_metrics_new();
    assert_non_null(reg);
    const char *const ab[] = {"a", "b"};
    const char *const ba[] = {"b", "a"};
    const double bounds[] = {1, 2};
    const double other[] = {1, 3};
    fr_metric_t *c = fr_metrics_counter(reg, "x_total", "x", 2, ab);
    assert_non_null(c);
    assert_ptr_equal(fr_metrics_counter(reg, "x_total", "other help", 2, ab), c);
    assert_null(fr_metrics_gauge(reg, "x_total", "x", 2, ab));
    assert_null(fr_metrics_counter(reg, "x_total", "x", 2, ba));
    assert_null(fr_metrics_counter(reg, "x_total", "x", 1, ab));
    fr_metric_t *h = fr_metrics_histogram(reg, "h", "x", 2, bounds, 0, NULL);
    assert_non_null(h);
    assert_ptr_equal(fr_metrics_histogram(reg, "h", "x", 2, bounds, 0, NULL), h);
    assert_null(fr_metrics_histogram(reg, "h", "x", 2, other, 0, NULL));
    assert_null(fr_metrics_histogram(reg, "h", "x", 1, bounds, 0, NULL));
    /* Only the first registration is rendered. */
    assert_render(reg, "# HELP x_total x\n# TYPE x_total counter\n"
                       "# HELP h x\n# TYPE h histogram\n"
                       "h_bucket{le=\"1\"} 0\nh_bucket{le=\"2\"} 0\nh_bucket{le=\"+Inf\"} 0\n"
                       "h_sum 0\nh_count 0\n");
    fr_metrics_destroy(reg);
}

static void test_metrics_reject_invalid_names_labels_and_bounds(void **state)
{
    (void)state;
    fr_metrics_t *reg = fr_metrics_new();
    assert_non_null(reg);
    static const char *const bad_names[] = {"", "1abc", "a-b", "a b", "a.b", "caf\xC3\xA9"};
    for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++)
        assert_null(fr_metrics_counter(reg, bad_names[i], "x", 0, NULL));
    assert_null(fr_metrics_counter(reg, NULL, "x", 0, NULL));
    assert_non_null(fr_metrics_counter(reg, "ns:sub_total", "x", 0, NULL));
    assert_non_null(fr_metrics_counter(reg, "_x9", "x", 0, NULL));

    static const char *const bad_labels[] = {"", "1a", "a:b", "__reserved", "a-b"};
    for (size_t i = 0; i < sizeof(bad_labels) / sizeof(bad_labels[0]); i++) {
        const char *const labels[] = {bad_labels[i]};
        assert_null(fr_metrics_gauge(reg, "g1", "x", 1, labels));
    }
    const char *const ok[] = {"_a", "b9", "c", "d", "e"};
    assert_non_null(fr_metrics_gauge(reg, "g4", "x", 4, ok));
    assert_null(fr_metrics_gauge(reg, "g5", "x", 5, ok));
    assert_null(fr_metrics_gauge(reg, "g0", "x", 1, NULL));
    const char *const dup[] = {"a", "a"};
    assert_null(fr_metrics_gauge(reg, "gd", "x", 2, dup));
    const char *const le[] = {"le"};
    assert_non_null(fr_metrics_gauge(reg, "gle", "x", 1, le));
    const double b[] = {1, 2};
    assert_null(fr_metrics_histogram(reg, "hle", "x", 2, b, 1, le));

    const double unsorted[] = {1, 1};
    const double with_inf[] = {1, HUGE_VAL};
    const double with_nan[] = {NAN, 1};
    assert_null(fr_metrics_histogram(reg, "h1", "x", 2, unsorted, 0, NULL));
    assert_null(fr_metrics_histogram(reg, "h2", "x", 2, with_inf, 0, NULL));
    assert_null(fr_metrics_histogram(reg, "h3", "x", 2, with_nan, 0, NULL));
    assert_null(fr_metrics_histogram(reg, "h4", "x", 2, NULL, 0, NULL));
    assert_null(fr_metrics_counter(NULL, "ok", "x", 0, NULL));
    fr_metrics_destroy(reg);
}

static void test_metrics_empty_registry_renders_empty_text(void **state)
{
    (void)state;
    fr_metrics_t *reg = fr_metrics_new();
    assert_non_null(reg);
    assert_render(reg, "");
    char *text = fr_metrics_render(reg, NULL);
    assert_non_null(text);
    free(text);
    fr_metrics_destroy(reg);
    fr_metrics_destroy(NULL);
}

#define NTHREADS 4
#define NADDS    100000

typedef struct worker_arg {
    fr_metric_t *counter, *gauge, *hist;
    fr_metrics_t *reg;
    int id;
} worker_arg_t;

/* Updates the shared series; every 10000 iterations it also creates a
 * series of its own and (thread 0) renders, so that series creation and
 * rendering race with the updates. */
static void *add_worker(void *p)
{
    worker_arg_t *arg = p;
    const char *const shared[] = {"shared"};
    fr_series_t *c = fr_metric_series(arg->counter, shared);
    fr_series_t *g = fr_metric_series(arg->gauge, NULL);
    fr_series_t *h = fr_metric_series(arg->hist, NULL);
    for (int i = 0; i < NADDS; i++) {
        fr_series_add(c, 1);
        fr_series_add(g, 0.5);
        fr_series_observe(h, (double)(i % 4));
        if (i % 10000 == 0) {
            char own[16];
            snprintf(own, sizeof(own), "w%d-%d", arg->id, i);
            const char *const values[] = {own};
            fr_series_add(fr_metric_series(arg->counter, values), 1);
            if (arg->id == 0)
                free(fr_metrics_render(arg->reg, NULL));
        }
    }
    return NULL;
}

static void test_metrics_concurrent_updates_give_the_exact_total(void **state)
{
    (void)state;
    fr_metrics_t *reg = fr_metrics_new();
    assert_non_null(reg);
    const char *const labels[] = {"who"};
    const double bounds[] = {0.5, 1.5};
    worker_arg_t args[NTHREADS];
    pthread_t threads[NTHREADS];
    fr_metric_t *counter = fr_metrics_counter(reg, "adds_total", "x", 1, labels);
    fr_metric_t *gauge = fr_metrics_gauge(reg, "halves", "x", 0, NULL);
    fr_metric_t *hist = fr_metrics_histogram(reg, "obs", "x", 2, bounds, 0, NULL);
    assert_non_null(counter);
    assert_non_null(gauge);
    assert_non_null(hist);
    for (int t = 0; t < NTHREADS; t++) {
        args[t] = (worker_arg_t){counter, gauge, hist, reg, t};
        assert_int_equal(pthread_create(&threads[t], NULL, add_worker, &args[t]), 0);
    }
    for (int t = 0; t < NTHREADS; t++)
        pthread_join(threads[t], NULL);

    const char *const shared[] = {"shared"};
    assert_true(fr_series_value(fr_metric_series(counter, shared)) == NTHREADS * NADDS);
    assert_true(fr_series_value(fr_metric_series(gauge, NULL)) == NTHREADS * NADDS * 0.5);
    assert_true(fr_series_value(fr_metric_series(hist, NULL)) == NTHREADS * NADDS);
    char *text = fr_metrics_render(reg, NULL);
    assert_non_null(text);
    /* values 0,1,2,3 a quarter each: le 0.5 holds 0s, le 1.5 adds 1s. */
    assert_non_null(strstr(text, "obs_bucket{le=\"0.5\"} 100000\n"
                                 "obs_bucket{le=\"1.5\"} 200000\n"
                                 "obs_bucket{le=\"+Inf\"} 400000\n"
                                 "obs_sum 600000\n"
                                 "obs_count 400000\n"));
    assert_non_null(strstr(text, "adds_total{who=\"shared\"} 400000\n"));
    assert_non_null(strstr(text, "adds_total{who=\"w3-90000\"} 1\n"));
    free(text);
    fr_metrics_destroy(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_render_counter_gauge_and_histogram_exactly),
        cmocka_unit_test(test_metrics_render_unlabelled_histogram_with_only_le),
        cmocka_unit_test(test_metrics_escape_help_and_label_values),
        cmocka_unit_test(test_metrics_format_numbers_as_prometheus_reads_them),
        cmocka_unit_test(test_metrics_histogram_bucket_edges_and_nan),
        cmocka_unit_test(test_metrics_counters_ignore_decrements_and_sets),
        cmocka_unit_test(test_metrics_series_are_found_again_by_label_values),
        cmocka_unit_test(test_metrics_reregistering_returns_the_same_family_or_null),
        cmocka_unit_test(test_metrics_reject_invalid_names_labels_and_bounds),
        cmocka_unit_test(test_metrics_empty_registry_renders_empty_text),
        cmocka_unit_test(test_metrics_concurrent_updates_give_the_exact_total),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
