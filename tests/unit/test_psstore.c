/*
 * test_psstore.c - unit tests of the parameter store's update math: the
 * optimizers against hand-computed values and (where Debian's python3-torch
 * is installed) against PyTorch itself, and every step of the controller.
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

#include "psstore/update/update.h"

#define RTOL 1e-6

/* |actual - expected| <= rtol * |expected| (plus a hair for exact zeros). */
static void assert_close_tol(double actual, double expected, double rtol, const char *what,
                             int line)
{
    double tol = rtol * fabs(expected) + 1e-12;
    if (!(fabs(actual - expected) <= tol))
        fail_msg("line %d: %s: got %.9g, expected %.9g (rtol %g)", line, what, actual, expected,
                 rtol);
}
#define assert_close(a, e) assert_close_tol((a), (e), RTOL, #a, __LINE__)

/* A controller from conf for n parameters; fails the test on error. */
static psstore_ctl_t *ctl_make(const psstore_ctl_conf_t *conf, size_t n)
{
    char errstr[256] = "";
    psstore_ctl_t *ctl = psstore_ctl_new(conf, n, errstr, sizeof(errstr));
    if (ctl == NULL)
        fail_msg("psstore_ctl_new: %s", errstr);
    return ctl;
}

/* Prepares a 1-element gradient of 1 at staleness tau from version 100. */
static psstore_decision_t prepare_tau(psstore_ctl_t *ctl, int64_t tau, int npushers)
{
    float g = 1.0f;
    psstore_decision_t d;
    psstore_ctl_prepare(ctl, &g, 100 + tau, 100, NULL, npushers, &d);
    return d;
}

/* ------------------------------------------------------------------------
 * Optimizers
 * ---------------------------------------------------------------------- */
static void test_optimizer_names_parse_and_round_trip(void **state)
{
    (void)state;
    const char *names[] = {"sgd", "momentum", "adagrad"};
    for (int i = 0; i < 3; i++) {
        psstore_optim_t optim;
        assert_int_equal(psstore_optim_parse(names[i], &optim), FR_OK);
        assert_int_equal(optim, i);
        assert_string_equal(psstore_optim_name(optim), names[i]);
    }
    psstore_optim_t optim = PSSTORE_OPTIM_ADAGRAD;
    assert_int_equal(psstore_optim_parse("adam", &optim), FR_ERR_INVAL);
    assert_int_equal(psstore_optim_parse("SGD", &optim), FR_ERR_INVAL);
    assert_int_equal(psstore_optim_parse(NULL, &optim), FR_ERR_INVAL);
    assert_int_equal(optim, PSSTORE_OPTIM_ADAGRAD);
    assert_string_equal(psstore_optim_name((psstore_optim_t)42), "unknown");
}

static void test_optimizer_state_is_empty_for_sgd_and_n_floats_otherwise(void **state)
{
    (void)state;
    assert_int_equal(psstore_optim_state_len(PSSTORE_OPTIM_SGD, 10), 0);
    assert_int_equal(psstore_optim_state_len(PSSTORE_OPTIM_MOMENTUM, 10), 10);
    assert_int_equal(psstore_optim_state_len(PSSTORE_OPTIM_ADAGRAD, 10), 10);
}

static void test_sgd_subtracts_lr_times_gradient(void **state)
{
    (void)state;
    float w[3] = {1.0f, -2.0f, 0.5f};
    const float g[3] = {0.3f, -0.7f, 2.5f};
    psstore_optim_step(PSSTORE_OPTIM_SGD, w, NULL, g, 3, 0.1f, 0.9f);
    assert_close(w[0], 1.0 - 0.1 * 0.3);
    assert_close(w[1], -2.0 + 0.1 * 0.7);
    assert_close(w[2], 0.5 - 0.1 * 2.5);
}

static void test_momentum_matches_torch_sgd_three_steps(void **state)
{
    (void)state;
    const double w0[3] = {1.0, -2.0, 0.5};
    const float g[3][3] = {{0.3f, -0.7f, 2.5f}, {-0.1f, 0.4f, 1.5f}, {0.6f, 0.2f, -1.0f}};
    const double lr = 0.1, mu = 0.9;
    float w[3], buf[3] = {0};
    double ew[3], ebuf[3] = {0};

    for (int j = 0; j < 3; j++) {
        w[j] = (float)w0[j];
        ew[j] = w0[j];
    }
    for (int t = 0; t < 3; t++) {
        psstore_optim_step(PSSTORE_OPTIM_MOMENTUM, w, buf, g[t], 3, (float)lr, (float)mu);
        for (int j = 0; j < 3; j++) {
            /* torch: buf = g on the first step, then mu * buf + g */
            ebuf[j] = t == 0 ? g[t][j] : mu * ebuf[j] + g[t][j];
            ew[j] -= lr * ebuf[j];
        }
    }
    for (int j = 0; j < 3; j++) {
        assert_close(buf[j], ebuf[j]);
        assert_close(w[j], ew[j]);
    }
}

static void test_adagrad_matches_torch_adagrad_two_steps(void **state)
{
    (void)state;
    const double w0[3] = {1.0, -2.0, 0.5};
    const float g[2][3] = {{0.3f, -0.7f, 2.5f}, {-0.1f, 0.4f, 1.5f}};
    const double lr = 0.1;
    float w[3], sum[3] = {0};
    double ew[3], esum[3] = {0};

    for (int j = 0; j < 3; j++) {
        w[j] = (float)w0[j];
        ew[j] = w0[j];
    }
    for (int t = 0; t < 2; t++) {
        psstore_optim_step(PSSTORE_OPTIM_ADAGRAD, w, sum, g[t], 3, (float)lr, 0.9f);
        for (int j = 0; j < 3; j++) {
            esum[j] += (double)g[t][j] * g[t][j];
            ew[j] -= lr * g[t][j] / (sqrt(esum[j]) + 1e-10);
        }
    }
    for (int j = 0; j < 3; j++) {
        assert_close(sum[j], esum[j]);
        assert_close(w[j], ew[j]);
    }
}

/* The PyTorch side of test_optimizers_match_pytorch: SGD(momentum=0.9) and
 * Adagrad, 3 steps each on the same vectors, one line of weights per
 * optimizer. All values are dyadic, so both sides start from identical
 * floats. */
static const char torch_script[] =
    "import torch\n"
    "w0 = [0.5, -1.25, 2.0, 0.0, 3.5]\n"
    "gs = [[0.25, -0.5, 0.125, 1.5, -2.0],\n"
    "      [-0.75, 0.0625, 0.5, -1.0, 0.25],\n"
    "      [1.0, -0.375, -0.25, 0.5, 0.75]]\n"
    "for name in ('momentum', 'adagrad'):\n"
    "    p = torch.tensor(w0, dtype=torch.float32, requires_grad=True)\n"
    "    if name == 'momentum':\n"
    "        opt = torch.optim.SGD([p], lr=0.125, momentum=0.9)\n"
    "    else:\n"
    "        opt = torch.optim.Adagrad([p], lr=0.125)\n"
    "    for g in gs:\n"
    "        p.grad = torch.tensor(g, dtype=torch.float32)\n"
    "        opt.step()\n"
    "    print(' '.join('%.9g' % v for v in p.detach().tolist()))\n";

static void test_optimizers_match_pytorch(void **state)
{
    (void)state;
    /* PyTorch is the reference the test is about: its absence is a failure
     * (deploy/setup.sh installs it) */
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
        fail_msg("/usr/bin/python3 cannot import torch (Debian: apt-get install python3-torch)");
    char path[] = "/tmp/test_psstore_torch_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(torch_script, 1, sizeof(torch_script) - 1, f),
                     sizeof(torch_script) - 1);
    assert_int_equal(fclose(f), 0);

    char cmd[128];
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s 2>/dev/null", path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    double ref[2][5];
    int got = 0;
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 5; j++)
            got += fscanf(p, "%lf", &ref[k][j]);
    int rc = pclose(p);
    unlink(path);
    assert_int_equal(rc, 0);
    assert_int_equal(got, 10);

    const float w0[5] = {0.5f, -1.25f, 2.0f, 0.0f, 3.5f};
    const float gs[3][5] = {{0.25f, -0.5f, 0.125f, 1.5f, -2.0f},
                            {-0.75f, 0.0625f, 0.5f, -1.0f, 0.25f},
                            {1.0f, -0.375f, -0.25f, 0.5f, 0.75f}};
    const psstore_optim_t optims[2] = {PSSTORE_OPTIM_MOMENTUM, PSSTORE_OPTIM_ADAGRAD};
    for (int k = 0; k < 2; k++) {
        float w[5], st[5] = {0};
        memcpy(w, w0, sizeof(w));
        for (int t = 0; t < 3; t++)
            psstore_optim_step(optims[k], w, st, gs[t], 5, 0.125f, 0.9f);
        for (int j = 0; j < 5; j++) {
            if (!(fabs(w[j] - ref[k][j]) <= 1e-6 * fmax(1.0, fabs(ref[k][j]))))
                fail_msg("%s w[%d]: freshet %.9g, torch %.9g", psstore_optim_name(optims[k]), j,
                         w[j], ref[k][j]);
        }
    }
}

/* ------------------------------------------------------------------------
 * Controller: configuration and names
 * ---------------------------------------------------------------------- */
/*
 * The served average's rule against a hand computation: the new weights'
 * share is 1 - exp(-n / h), h = min(horizon, seen / 10); the first update
 * (h = n / 10) takes almost all of it, and an update of no samples none.
 */
static void test_the_served_average_weighs_the_last_tenth_up_to_the_horizon(void **state)
{
    (void)state;
    assert_true(psstore_average_weight(6400, 0, 0) == 0);
    assert_true(psstore_average_weight(6400, 64, 0) == 0);
    assert_true(psstore_average_weight(6400, 0, 64) == 1); /* nothing seen yet: h = 0 */
    assert_float_equal(psstore_average_weight(6400, 64, 64), 1 - exp(-10.0), 1e-12);
    /* seen 6400: h = 640 */
    assert_float_equal(psstore_average_weight(6400, 6400, 64), 1 - exp(-0.1), 1e-12);
    /* seen past 10 horizons: h = 6400 */
    assert_float_equal(psstore_average_weight(6400, 64000, 64), 1 - exp(-0.01), 1e-12);
    assert_float_equal(psstore_average_weight(6400, 1000000, 512), 1 - exp(-0.08), 1e-12);
    /* a round of 512 samples counts as eight batches of 64 would, to first order */
    double one = psstore_average_weight(6400, 1000000, 64);
    assert_float_equal(1 - pow(1 - one, 8), psstore_average_weight(6400, 1000000, 512), 1e-12);

    /* three updates of 64 samples (horizon 6400) on three weights, by hand */
    float avg[3] = {1, 2, 3}, w[3][3] = {{2, 2, 2}, {0, 4, -1}, {1, 1, 1}};
    double want[3] = {1, 2, 3};
    int64_t seen = 0;
    for (int t = 0; t < 3; t++) {
        seen += 64;
        double a = 1 - exp(-64.0 / fmin(6400.0, seen / 10.0));
        for (int i = 0; i < 3; i++)
            want[i] += a * (w[t][i] - want[i]);
        psstore_average_step(avg, w[t], 3, (float)psstore_average_weight(6400, seen, 64));
    }
    for (int i = 0; i < 3; i++)
        assert_float_equal(avg[i], want[i], 1e-5);
}

static void test_policy_and_outcome_names_round_trip(void **state)
{
    (void)state;
    const char *names[] = {"constant", "inverse", "delay", "adaptive"};
    for (int i = 0; i < 4; i++) {
        psstore_policy_t policy;
        assert_int_equal(psstore_policy_parse(names[i], &policy), FR_OK);
        assert_int_equal(policy, i);
        assert_string_equal(psstore_policy_name(policy), names[i]);
    }
    psstore_policy_t policy;
    assert_int_equal(psstore_policy_parse("linear", &policy), FR_ERR_INVAL);
    assert_int_equal(psstore_policy_parse(NULL, &policy), FR_ERR_INVAL);
    assert_string_equal(psstore_outcome_name(PSSTORE_APPLY), "applied");
    assert_string_equal(psstore_outcome_name(PSSTORE_DROP_NONFINITE), "nonfinite");
    assert_string_equal(psstore_outcome_name(PSSTORE_DROP_STALENESS), "staleness");
}

static void test_conf_defaults_are_those_of_the_design(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    memset(&conf, 0xab, sizeof(conf));
    psstore_ctl_conf_init(&conf);
    assert_true(conf.lr == 0.05);
    assert_int_equal(conf.policy, PSSTORE_POLICY_CONSTANT);
    assert_int_equal(conf.warmup, 0);
    assert_int_equal(conf.max_staleness, 0);
    assert_true(conf.clip_norm == 0.0);
    assert_true(conf.dc_lambda == 0.0);
    assert_int_equal(conf.dc_adaptive, 0);
    assert_true(conf.dc_momentum == 0.95);
    assert_int_equal(conf.dc_ring, 8);
    assert_int_equal(conf.optim, PSSTORE_OPTIM_SGD);
    assert_true(conf.momentum == 0.9);
    assert_int_equal(conf.average, 6400);
}

/* Expects psstore_ctl_new to refuse conf with an errstr containing want. */
static void expect_refused(const psstore_ctl_conf_t *conf, size_t n, const char *want)
{
    char errstr[256] = "";
    psstore_ctl_t *ctl = psstore_ctl_new(conf, n, errstr, sizeof(errstr));
    if (ctl != NULL) {
        psstore_ctl_destroy(ctl);
        fail_msg("accepted a conf that should fail with \"%s\"", want);
    }
    if (strstr(errstr, want) == NULL)
        fail_msg("errstr \"%s\" does not contain \"%s\"", errstr, want);
}

static void test_new_refuses_bad_conf_naming_the_field(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
#define REFUSE(field, value, want)                                                                 \
    do {                                                                                           \
        psstore_ctl_conf_init(&conf);                                                              \
        conf.field = (value);                                                                      \
        expect_refused(&conf, 4, (want));                                                          \
    } while (0)
    REFUSE(lr, -1, "controller: lr must be > 0, got -1");
    REFUSE(lr, 0, "lr must be > 0");
    REFUSE(lr, NAN, "lr must be > 0");
    REFUSE(lr, INFINITY, "lr must be > 0");
    REFUSE(momentum, 1.0, "momentum must be in [0, 1)");
    REFUSE(momentum, -0.1, "momentum must be in [0, 1)");
    REFUSE(dc_momentum, 1.0, "dc_momentum must be in [0, 1)");
    REFUSE(max_staleness, -1, "max_staleness must be >= 0");
    REFUSE(warmup, -5, "warmup must be >= 0, got -5");
    REFUSE(clip_norm, -1, "clip_norm must be >= 0");
    REFUSE(dc_lambda, -0.5, "dc_lambda must be >= 0");
    REFUSE(average, -1, "average must be >= 0, got -1");
    REFUSE(policy, (psstore_policy_t)9, "policy must be");
    REFUSE(optim, (psstore_optim_t)9, "optim must be");
#undef REFUSE
    psstore_ctl_conf_init(&conf);
    conf.dc_lambda = 0.04;
    conf.dc_ring = 0;
    expect_refused(&conf, 4, "dc_ring must be >= 1");
    conf.dc_lambda = 0;
    psstore_ctl_destroy(ctl_make(&conf, 4)); /* the ring is only needed with dc */
    psstore_ctl_conf_init(&conf);
    expect_refused(&conf, 0, "n must be >= 1");
    assert_null(psstore_ctl_new(NULL, 4, NULL, 0));
}

static void test_destroy_of_null_is_a_noop(void **state)
{
    (void)state;
    psstore_ctl_destroy(NULL);
}

/* ------------------------------------------------------------------------
 * Controller: steps 1-3
 * ---------------------------------------------------------------------- */
static void test_nonfinite_gradients_are_dropped_untouched(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.clip_norm = 0.1; /* would scale g if it were reached */
    psstore_ctl_t *ctl = ctl_make(&conf, 3);
    const float bad[3] = {NAN, INFINITY, -INFINITY};

    for (int k = 0; k < 3; k++) {
        float g[3] = {3.0f, 4.0f, 5.0f}, before[3];
        g[k] = bad[k];
        memcpy(before, g, sizeof(g));
        psstore_decision_t d;
        assert_int_equal(psstore_ctl_prepare(ctl, g, 7, 5, NULL, 1, &d), PSSTORE_DROP_NONFINITE);
        assert_int_equal(d.outcome, PSSTORE_DROP_NONFINITE);
        assert_int_equal(d.tau, 2);
        assert_int_equal(d.clipped, 0);
        assert_true(d.lr_eff == 0.0);
        assert_memory_equal(g, before, sizeof(g));
    }
    psstore_ctl_stats_t st;
    psstore_ctl_stats(ctl, &st);
    assert_int_equal(st.dropped_nonfinite, 3);
    assert_int_equal(st.applied, 0);
    assert_int_equal(st.clipped, 0);
    psstore_ctl_destroy(ctl);
}

/* A shard's slice: rejection and clipping follow the whole gradient's norm. */
static void test_a_slice_is_clipped_and_rejected_by_the_whole_norm(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.clip_norm = 2.0;
    psstore_ctl_t *ctl = ctl_make(&conf, 2);
    psstore_decision_t d;
    float g[2] = {0.6f, 0.8f}; /* its own norm 1 <= 2, the whole's 8: scaled by 1/4 */
    assert_int_equal(psstore_ctl_prepare_whole(ctl, g, 0, 0, NULL, 1, 8.0, &d), PSSTORE_APPLY);
    assert_close(d.norm, 8.0);
    assert_int_equal(d.clipped, 1);
    assert_close(g[0], 0.15);
    assert_close(g[1], 0.2);
    float h[2] = {3.0f, 4.0f}; /* own norm 5 > 2, the whole's 1.5: untouched */
    assert_int_equal(psstore_ctl_prepare_whole(ctl, h, 0, 0, NULL, 1, 1.5, &d), PSSTORE_APPLY);
    assert_int_equal(d.clipped, 0);
    assert_true(h[0] == 3.0f && h[1] == 4.0f);
    float f[2] = {1.0f, 1.0f}; /* finite here, NaN elsewhere: dropped untouched */
    assert_int_equal(psstore_ctl_prepare_whole(ctl, f, 3, 1, NULL, 1, NAN, &d),
                     PSSTORE_DROP_NONFINITE);
    assert_int_equal(d.tau, 2);
    assert_true(f[0] == 1.0f && f[1] == 1.0f);
    float z[2] = {3.0f, 4.0f}; /* 0: the slice's own norm, as psstore_ctl_prepare */
    assert_int_equal(psstore_ctl_prepare_whole(ctl, z, 0, 0, NULL, 1, 0, &d), PSSTORE_APPLY);
    assert_close(d.norm, 5.0);
    assert_int_equal(d.clipped, 1);
    psstore_ctl_destroy(ctl);
}

/*
 * psstore_sum_squares is exactly its documented order (psstore/update/update.h):
 * lane k of 16 sums the float squares of entries i + k of each block of
 * 4096 in order, then the block's tail in double, then the 16 lanes in
 * order, and the blocks in double. Bit for bit, over lengths around the
 * lanes and blocks and random values (a worker's sum and an applier's must
 * agree, and a faster loop must not change a decision).
 */
static double sum_squares_reference(const float *g, size_t n)
{
    double total = 0;
    for (size_t b = 0; b < n; b += 4096) {
        size_t end = n - b > 4096 ? b + 4096 : n, full = b + (end - b) / 16 * 16;
        float lane[16] = {0};
        for (size_t i = b; i < full; i++) {
            float sq = g[i] * g[i];
            lane[(i - b) % 16] += sq;
        }
        double block = 0;
        for (size_t i = full; i < end; i++)
            block += (double)g[i] * (double)g[i];
        for (int k = 0; k < 16; k++)
            block += lane[k];
        total += block;
    }
    return total;
}

static void test_sum_squares_is_its_documented_order_bit_for_bit(void **state)
{
    (void)state;
    enum { CAP = 3 * 4096 + 40 };
    static float g[CAP];
    uint64_t x = 20261203;
    int checked = 0;
    for (size_t n = 0; n <= CAP; n += n < 40 ? 1 : (n < 4096 + 40 && n > 4096 - 40 ? 1 : 97)) {
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            /* magnitudes from 1e-3 to 1e3, both signs */
            g[i] =
                (float)((double)(int32_t)(x >> 32) / 2147483648.0 * pow(10.0, (double)(x % 7) - 3));
        }
        double want = sum_squares_reference(g, n), got = psstore_sum_squares(g, n);
        if (memcmp(&want, &got, sizeof(want)) != 0)
            fail_msg("n = %zu: %a, expected %a", n, got, want);
        checked++;
    }
    assert_true(checked > 150);
}

/*
 * psstore_ctl_prepare_sq with psstore_sum_squares of the same floats takes
 * the decision psstore_ctl_prepare takes (outcome, norm and scale to the
 * bit, the same clipped floats), on gradients below and above the clip
 * norm, stale ones, a NaN and an entry whose square overflows a float;
 * and the sum itself is the double-precision sum to 1e-6.
 */
static void test_a_known_sum_of_squares_decides_as_the_pass_would(void **state)
{
    (void)state;
    enum { N = 10001 }; /* blocks of 4096 and a tail of lanes */
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.clip_norm = 15.0;
    psstore_ctl_t *pass = ctl_make(&conf, N), *known = ctl_make(&conf, N);
    static float a[N], b[N];
    uint64_t seed = 7;
    for (int k = 0; k < 6; k++) {
        double ref = 0;
        for (int i = 0; i < N; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            a[i] = (float)((double)(seed >> 40) / (double)(1u << 24) - 0.5) * (float)(k + 1) * 0.2f;
            ref += (double)a[i] * a[i];
        }
        double sq = psstore_sum_squares(a, N);
        assert_true(fabs(sq - ref) <= 1e-6 * ref);
        if (k == 4)
            a[N - 1] = NAN;
        if (k == 5)
            a[17] = 2e19f; /* finite; its square is not a float */
        sq = psstore_sum_squares(a, N);
        assert_true(k < 4 ? isfinite(sq) : !isfinite(sq));
        memcpy(b, a, sizeof(a));
        psstore_decision_t d1, d2;
        psstore_outcome_t o1 = psstore_ctl_prepare(pass, a, 10 + k, 10, NULL, 2, &d1);
        psstore_outcome_t o2 = psstore_ctl_prepare_sq(known, b, 10 + k, 10, NULL, 2, sq, &d2);
        assert_int_equal(o1, o2);
        assert_int_equal(o1, k < 4 ? PSSTORE_APPLY : PSSTORE_DROP_NONFINITE);
        assert_memory_equal(&d1, &d2, sizeof(d1));
        assert_memory_equal(a, b, sizeof(a));
        if (k == 0)
            assert_int_equal(d1.clipped, 0); /* norm about 5.8 */
        if (k == 3)
            assert_int_equal(d1.clipped, 1); /* norm about 23 */
    }
    psstore_ctl_destroy(pass);
    psstore_ctl_destroy(known);
}

static void test_clipping_scales_only_gradients_with_norm_above_c(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.clip_norm = 2.0;
    psstore_ctl_t *ctl = ctl_make(&conf, 2);
    psstore_decision_t d;

    float g[2] = {3.0f, 4.0f}; /* norm 5 > 2: scaled by 2/5 */
    assert_int_equal(psstore_ctl_prepare(ctl, g, 0, 0, NULL, 1, &d), PSSTORE_APPLY);
    assert_close(d.norm, 5.0);
    assert_int_equal(d.clipped, 1);
    assert_close(g[0], 1.2);
    assert_close(g[1], 1.6);

    float h[2] = {0.6f, -0.8f}; /* norm 1 <= 2: untouched */
    assert_int_equal(psstore_ctl_prepare(ctl, h, 0, 0, NULL, 1, &d), PSSTORE_APPLY);
    assert_close(d.norm, 1.0);
    assert_int_equal(d.clipped, 0);
    assert_true(h[0] == 0.6f && h[1] == -0.8f);

    float e[2] = {0.0f, 2.0f}; /* norm exactly c: untouched */
    psstore_ctl_prepare(ctl, e, 0, 0, NULL, 1, &d);
    assert_int_equal(d.clipped, 0);
    assert_true(e[1] == 2.0f);

    psstore_ctl_stats_t st;
    psstore_ctl_stats(ctl, &st);
    assert_int_equal(st.clipped, 1);
    psstore_ctl_destroy(ctl);

    conf.clip_norm = 0; /* off: nothing is clipped, the norm is still reported */
    ctl = ctl_make(&conf, 2);
    float big[2] = {300.0f, 400.0f};
    psstore_ctl_prepare(ctl, big, 0, 0, NULL, 1, &d);
    assert_close(d.norm, 500.0);
    assert_int_equal(d.clipped, 0);
    assert_true(big[0] == 300.0f);
    psstore_ctl_destroy(ctl);
}

static void test_norm_and_finiteness_cover_every_element_of_odd_sizes(void **state)
{
    (void)state;
    enum { N = 21 };
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.clip_norm = 1.0;
    psstore_ctl_t *ctl = ctl_make(&conf, N);
    float g[N], g0[N];
    double sq = 0;
    for (int i = 0; i < N; i++) {
        g0[i] = (float)(i % 5) * 0.5f - 0.75f;
        sq += (double)g0[i] * g0[i];
    }
    psstore_decision_t d;
    memcpy(g, g0, sizeof(g));
    assert_int_equal(psstore_ctl_prepare(ctl, g, 0, 0, NULL, 1, &d), PSSTORE_APPLY);
    assert_close(d.norm, sqrt(sq));
    for (int i = 0; i < N; i++)
        assert_close(g[i], g0[i] / sqrt(sq));
    /* a NaN in the vectorizable body, then one in the tail */
    const int at[2] = {5, N - 1};
    for (int k = 0; k < 2; k++) {
        memcpy(g, g0, sizeof(g));
        g[at[k]] = NAN;
        assert_int_equal(psstore_ctl_prepare(ctl, g, 0, 0, NULL, 1, &d), PSSTORE_DROP_NONFINITE);
    }
    psstore_ctl_destroy(ctl);
}

static void test_max_staleness_drops_tau_above_and_applies_tau_at_the_bound(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.max_staleness = 4;
    psstore_ctl_t *ctl = ctl_make(&conf, 1);

    psstore_decision_t d = prepare_tau(ctl, 4, 1);
    assert_int_equal(d.outcome, PSSTORE_APPLY);
    assert_int_equal(d.tau, 4);
    d = prepare_tau(ctl, 5, 1);
    assert_int_equal(d.outcome, PSSTORE_DROP_STALENESS);
    assert_int_equal(d.tau, 5);
    assert_true(d.lr_eff == 0.0);

    psstore_ctl_stats_t st;
    psstore_ctl_stats(ctl, &st);
    assert_int_equal(st.applied, 1);
    assert_int_equal(st.dropped_staleness, 1);
    psstore_ctl_destroy(ctl);

    conf.max_staleness = 0; /* unbounded */
    ctl = ctl_make(&conf, 1);
    assert_int_equal(prepare_tau(ctl, 1000000, 1).outcome, PSSTORE_APPLY);
    psstore_ctl_destroy(ctl);
}

static void test_negative_staleness_is_treated_as_fresh(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.policy = PSSTORE_POLICY_INVERSE;
    conf.max_staleness = 1;
    psstore_ctl_t *ctl = ctl_make(&conf, 1);
    psstore_decision_t d = prepare_tau(ctl, -3, 1);
    assert_int_equal(d.outcome, PSSTORE_APPLY);
    assert_int_equal(d.tau, 0);
    assert_close(d.lr_eff, 0.05);
    /* absurd versions saturate instead of overflowing */
    float g = 1.0f;
    psstore_ctl_prepare(ctl, &g, INT64_MAX, INT64_MIN, NULL, 1, &d);
    assert_int_equal(d.outcome, PSSTORE_DROP_STALENESS);
    assert_true(d.tau == INT64_MAX);
    psstore_ctl_destroy(ctl);
}

/* ------------------------------------------------------------------------
 * Controller: policies and warm-up
 * ---------------------------------------------------------------------- */
static void test_constant_policy_keeps_the_base_rate_at_any_staleness(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.lr = 0.2;
    psstore_ctl_t *ctl = ctl_make(&conf, 1);
    const int64_t taus[] = {0, 1, 7, 1000};
    for (size_t i = 0; i < 4; i++) {
        psstore_decision_t d = prepare_tau(ctl, taus[i], 3);
        assert_close(d.scale, 1.0);
        assert_close(d.lr_eff, 0.2);
        assert_int_equal(d.tau, taus[i]);
    }
    psstore_ctl_destroy(ctl);
}

static void test_inverse_policy_divides_the_rate_by_staleness(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.lr = 0.2;
    conf.policy = PSSTORE_POLICY_INVERSE;
    psstore_ctl_t *ctl = ctl_make(&conf, 1);
    const int64_t taus[] = {0, 1, 2, 4, 10};
    const double scales[] = {1.0, 1.0, 0.5, 0.25, 0.1};
    for (size_t i = 0; i < 5; i++) {
        for (int np = 1; np <= 8; np *= 2) {
            psstore_decision_t d = prepare_tau(ctl, taus[i], np);
            assert_close(d.scale, scales[i]);
            assert_close(d.lr_eff, 0.2 * scales[i]);
        }
    }
    psstore_ctl_destroy(ctl);
}

static void test_delay_policy_damps_only_staleness_beyond_the_pushers(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.lr = 0.2;
    conf.policy = PSSTORE_POLICY_DELAY;
    psstore_ctl_t *ctl = ctl_make(&conf, 1);

    const int64_t taus[] = {0, 2, 4, 8, 16};
    const double scales[] = {1.0, 1.0, 1.0, 0.5, 0.25};
    for (size_t i = 0; i < 5; i++) {
        psstore_decision_t d = prepare_tau(ctl, taus[i], 4);
        assert_close(d.n_eff, 4.0);
        assert_close(d.scale, scales[i]);
        assert_close(d.lr_eff, 0.2 * scales[i]);
    }
    /* one pusher: as inverse; no pusher (a caller bug): n = 1, never 0/0 */
    psstore_decision_t d = prepare_tau(ctl, 3, 1);
    assert_close(d.lr_eff, 0.2 / 3);
    d = prepare_tau(ctl, 0, 0);
    assert_close(d.n_eff, 1.0);
    assert_close(d.lr_eff, 0.2);
    d = prepare_tau(ctl, 2, 0);
    assert_close(d.lr_eff, 0.1);
    psstore_ctl_destroy(ctl);
}

static psstore_ctl_t *adaptive_ctl(void)
{
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.lr = 0.2;
    conf.policy = PSSTORE_POLICY_ADAPTIVE;
    conf.max_staleness = 50;
    return ctl_make(&conf, 1);
}

static void test_adaptive_policy_uses_pushers_before_100_samples_then_the_median(void **state)
{
    (void)state;
    psstore_ctl_t *ctl = adaptive_ctl();
    psstore_decision_t d;
    for (int i = 0; i < 100; i++) {
        d = prepare_tau(ctl, 3, 7);
        assert_close(d.n_eff, 7.0);
        assert_close(d.lr_eff, 0.2); /* tau 3 <= n 7 */
        /* drops never enter the window */
        assert_int_equal(prepare_tau(ctl, 51, 7).outcome, PSSTORE_DROP_STALENESS);
    }
    /* 100 applied taus of 3: n = p50 + 1 = 4, whatever the pusher count */
    d = prepare_tau(ctl, 8, 7);
    assert_close(d.n_eff, 4.0);
    assert_close(d.scale, 0.5);
    assert_close(d.lr_eff, 0.1);
    /* ... and never more than the pushers: with one pusher a tau of 2 is
     * a queue's, damped as the delay policy damps it (1 / 2) */
    d = prepare_tau(ctl, 2, 1);
    assert_close(d.n_eff, 1.0);
    assert_close(d.lr_eff, 0.1);
    d = prepare_tau(ctl, 2, 3);
    assert_close(d.n_eff, 3.0);
    assert_close(d.lr_eff, 0.2);
    psstore_ctl_destroy(ctl);

    /* all fresh: p50 0 gives n 1, never 0/0 */
    ctl = adaptive_ctl();
    for (int i = 0; i < 100; i++)
        prepare_tau(ctl, 0, 5);
    d = prepare_tau(ctl, 0, 5);
    assert_close(d.n_eff, 1.0);
    assert_close(d.lr_eff, 0.2);
    d = prepare_tau(ctl, 4, 5);
    assert_close(d.lr_eff, 0.05);
    psstore_ctl_destroy(ctl);
}

/*
 * The adaptive rule by hand: n = min(p50(tau) + 1, pushers), s = n /
 * max(n, tau). A queue makes the typical staleness 7 with 4 pushers: the
 * median (7) would keep the full rate for it, the cap damps it to 4 / 7;
 * what concurrency explains (tau 3 with 4 pushers) keeps the full rate.
 */
static void test_adaptive_damps_a_queues_typical_staleness(void **state)
{
    (void)state;
    psstore_ctl_t *ctl = adaptive_ctl();
    for (int i = 0; i < 100; i++)
        prepare_tau(ctl, 7, 4);
    psstore_decision_t d = prepare_tau(ctl, 7, 4);
    assert_close(d.n_eff, 4.0);
    assert_close(d.scale, 4.0 / 7.0);
    assert_close(d.lr_eff, 0.2 * 4.0 / 7.0);
    d = prepare_tau(ctl, 3, 4);
    assert_close(d.scale, 1.0);
    /* with 16 pushers the median is below the cap: n = 8 */
    d = prepare_tau(ctl, 12, 16);
    assert_close(d.n_eff, 8.0);
    assert_close(d.lr_eff, 0.2 * 8.0 / 12.0);
    psstore_ctl_destroy(ctl);
}

static void test_adaptive_median_is_the_lower_median(void **state)
{
    (void)state;
    psstore_ctl_t *ctl = adaptive_ctl();
    for (int i = 0; i < 50; i++) {
        prepare_tau(ctl, 5, 100);
        prepare_tau(ctl, 1, 100);
    }
    /* sorted: 50 ones then 50 fives; index (100 - 1) / 2 = 49 is a one */
    assert_close(prepare_tau(ctl, 5, 100).n_eff, 2.0);
    /* now 101 samples, index 50 is a five */
    assert_close(prepare_tau(ctl, 0, 100).n_eff, 6.0);
    psstore_ctl_destroy(ctl);
}

static void test_adaptive_window_slides_over_the_last_1000_gradients(void **state)
{
    (void)state;
    psstore_ctl_t *ctl = adaptive_ctl();
    for (int i = 0; i < 1000; i++)
        prepare_tau(ctl, 3, 100);
    for (int i = 0; i < 500; i++) {
        psstore_decision_t d = prepare_tau(ctl, 9, 100);
        assert_close(d.n_eff, 4.0);
    }
    /* window: 500 threes, 500 nines; index 499 is still a three */
    assert_close(prepare_tau(ctl, 9, 100).n_eff, 4.0);
    /* window: 499 threes, 501 nines; index 499 is a nine */
    assert_close(prepare_tau(ctl, 9, 100).n_eff, 10.0);
    for (int i = 0; i < 1000; i++)
        prepare_tau(ctl, 2000000, 100); /* beyond max_staleness 50: dropped */
    assert_close(prepare_tau(ctl, 9, 100).n_eff, 10.0);
    psstore_ctl_destroy(ctl);
}

static void test_adaptive_window_clips_huge_staleness(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.policy = PSSTORE_POLICY_ADAPTIVE;
    psstore_ctl_t *ctl = ctl_make(&conf, 1);
    for (int i = 0; i < 100; i++)
        prepare_tau(ctl, INT64_C(1) << 40, 1 << 20);
    psstore_decision_t d = prepare_tau(ctl, 0, 1 << 20);
    assert_close(d.n_eff, 65536.0);
    assert_close(d.scale, 1.0);
    psstore_ctl_destroy(ctl);
}

static void test_reset_clears_the_adaptive_window(void **state)
{
    (void)state;
    psstore_ctl_t *ctl = adaptive_ctl();
    for (int i = 0; i < 300; i++)
        prepare_tau(ctl, 3, 1);
    assert_close(prepare_tau(ctl, 3, 6).n_eff, 4.0);
    psstore_ctl_reset(ctl);
    for (int i = 0; i < 100; i++)
        assert_close(prepare_tau(ctl, 9, 6).n_eff, 6.0);
    /* the median (9) + 1 is above the 6 pushers: capped at 6 */
    assert_close(prepare_tau(ctl, 9, 6).n_eff, 6.0);
    assert_close(prepare_tau(ctl, 9, 16).n_eff, 10.0);
    psstore_ctl_destroy(ctl);
}

static void test_warmup_raises_the_rate_linearly_over_warmup_versions(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.lr = 0.1;
    conf.warmup = 10;
    conf.policy = PSSTORE_POLICY_INVERSE;
    psstore_ctl_t *ctl = ctl_make(&conf, 1);
    const int64_t versions[] = {0, 4, 9, 10, 500};
    const double want[] = {0.01, 0.05, 0.1, 0.1, 0.1};
    for (size_t i = 0; i < 5; i++) {
        float g = 1.0f;
        psstore_decision_t d;
        psstore_ctl_prepare(ctl, &g, versions[i], versions[i], NULL, 1, &d);
        assert_close(d.lr_eff, want[i]);
    }
    /* warm-up and policy multiply: version 4 (factor 0.5), tau 2 */
    float g = 1.0f;
    psstore_decision_t d;
    psstore_ctl_prepare(ctl, &g, 4, 2, NULL, 1, &d);
    assert_close(d.scale, 0.5);
    assert_close(d.lr_eff, 0.1 * 0.5 * 0.5);
    psstore_ctl_destroy(ctl);
}

/* ------------------------------------------------------------------------
 * Controller: delay compensation
 * ---------------------------------------------------------------------- */
static void test_constant_dc_matches_the_hand_computed_gradient(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.dc_lambda = 0.5;
    conf.dc_ring = 4;
    psstore_ctl_t *ctl = ctl_make(&conf, 3);
    const float w_v[3] = {1.0f, 1.0f, 1.0f};
    const float w_mid[3] = {9.0f, 9.0f, 9.0f};
    const float w_now[3] = {1.3f, 0.6f, 2.0f};
    const float g0[3] = {1.1f, -2.0f, 0.5f};
    float g[3];

    psstore_ctl_record(ctl, 3, w_v);
    psstore_ctl_record(ctl, 4, w_mid);
    psstore_ctl_record(ctl, 5, w_now);
    memcpy(g, g0, sizeof(g));
    psstore_decision_t d;
    assert_int_equal(psstore_ctl_prepare(ctl, g, 5, 3, w_now, 1, &d), PSSTORE_APPLY);
    assert_int_equal(d.tau, 2);
    assert_int_equal(d.dc, 1);
    for (int j = 0; j < 3; j++) {
        double e = g0[j] + 0.5 * (double)g0[j] * g0[j] * ((double)w_now[j] - w_v[j]);
        assert_close(g[j], e);
    }
    /* tau 0: nothing to compensate */
    memcpy(g, g0, sizeof(g));
    psstore_ctl_prepare(ctl, g, 5, 5, w_now, 1, &d);
    assert_int_equal(d.dc, 0);
    assert_memory_equal(g, g0, sizeof(g));

    psstore_ctl_stats_t st;
    psstore_ctl_stats(ctl, &st);
    assert_int_equal(st.dc_applied, 1);
    assert_int_equal(st.dc_missed, 0);
    psstore_ctl_destroy(ctl);
}

static void test_adaptive_dc_tracks_the_mean_square_and_its_lambda(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.dc_lambda = 2.0;
    conf.dc_adaptive = 1;
    conf.dc_momentum = 0.75;
    conf.dc_ring = 2;
    psstore_ctl_t *ctl = ctl_make(&conf, 3);
    const float w0[3] = {1.0f, 1.0f, 1.0f};
    const float w1[3] = {2.0f, 0.0f, 1.5f}; /* w1 - w0 = (1, -1, 0.5) */
    const float g1[3] = {1.0f, -2.0f, 0.5f};
    const float g2[3] = {0.5f, 1.5f, -1.0f};
    double ms[3] = {0};
    float g[3];
    psstore_decision_t d;

    /* gradient 1 at tau 0: the mean square moves, g does not */
    psstore_ctl_record(ctl, 0, w0);
    memcpy(g, g1, sizeof(g));
    psstore_ctl_prepare(ctl, g, 0, 0, w0, 1, &d);
    assert_int_equal(d.dc, 0);
    assert_memory_equal(g, g1, sizeof(g));
    for (int j = 0; j < 3; j++)
        ms[j] = 0.25 * g1[j] * g1[j];

    /* gradient 2 on version 0 at version 1: ms, then lambda, then g' */
    psstore_ctl_record(ctl, 1, w1);
    memcpy(g, g2, sizeof(g));
    psstore_ctl_prepare(ctl, g, 1, 0, w1, 1, &d);
    assert_int_equal(d.dc, 1);
    for (int j = 0; j < 3; j++) {
        ms[j] = 0.75 * ms[j] + 0.25 * g2[j] * g2[j];
        double lambda = 2.0 / sqrt(ms[j] + 1e-7);
        double diff = (double)w1[j] - w0[j];
        double e = g2[j] + lambda * g2[j] * g2[j] * diff;
        assert_close(g[j], e);
        /* recover lambda and ms from g' to check them on their own */
        double got_lambda = ((double)g[j] - g2[j]) / ((double)g2[j] * g2[j] * diff);
        assert_close_tol(got_lambda, lambda, 1e-5, "lambda", __LINE__);
        double got_ms = (2.0 / got_lambda) * (2.0 / got_lambda) - 1e-7;
        assert_close_tol(got_ms, ms[j], 1e-5, "ms", __LINE__);
    }

    /* reset forgets ms: the same gradient 2 now sees ms = 0.25 * g2 * g2 */
    psstore_ctl_reset(ctl);
    psstore_ctl_record(ctl, 0, w0);
    psstore_ctl_record(ctl, 1, w1);
    memcpy(g, g2, sizeof(g));
    psstore_ctl_prepare(ctl, g, 1, 0, w1, 1, &d);
    for (int j = 0; j < 3; j++) {
        double lambda = 2.0 / sqrt(0.25 * g2[j] * g2[j] + 1e-7);
        assert_close(g[j], g2[j] + lambda * g2[j] * g2[j] * ((double)w1[j] - w0[j]));
    }
    psstore_ctl_destroy(ctl);
}

static void test_dc_is_skipped_and_counted_when_the_version_left_the_ring(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.dc_lambda = 0.5;
    conf.dc_ring = 4;
    psstore_ctl_t *ctl = ctl_make(&conf, 2);
    float w[2];
    for (int v = 0; v < 10; v++) {
        w[0] = (float)v;
        w[1] = (float)-v;
        psstore_ctl_record(ctl, v, w);
    }
    const float g0[2] = {1.0f, 2.0f};
    float g[2];
    psstore_decision_t d;

    memcpy(g, g0, sizeof(g));
    assert_int_equal(psstore_ctl_prepare(ctl, g, 9, 2, w, 1, &d), PSSTORE_APPLY);
    assert_int_equal(d.dc, -1);
    assert_memory_equal(g, g0, sizeof(g));

    /* version 6 is the oldest kept: w_now - w_6 = (3, -3) */
    memcpy(g, g0, sizeof(g));
    psstore_ctl_prepare(ctl, g, 9, 6, w, 1, &d);
    assert_int_equal(d.dc, 1);
    assert_close(g[0], 1.0 + 0.5 * 1.0 * 3.0);
    assert_close(g[1], 2.0 + 0.5 * 4.0 * -3.0);

    /* after a reset nothing is in the ring */
    psstore_ctl_reset(ctl);
    memcpy(g, g0, sizeof(g));
    psstore_ctl_prepare(ctl, g, 9, 8, w, 1, &d);
    assert_int_equal(d.dc, -1);

    psstore_ctl_stats_t st;
    psstore_ctl_stats(ctl, &st);
    assert_int_equal(st.dc_missed, 2);
    assert_int_equal(st.dc_applied, 1);
    assert_int_equal(st.applied, 3);
    psstore_ctl_destroy(ctl);
}

static void test_recording_a_version_again_replaces_its_weights(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.dc_lambda = 1.0;
    conf.dc_ring = 3;
    psstore_ctl_t *ctl = ctl_make(&conf, 1);
    const float a = 5.0f, b = 2.0f, now = 3.0f;
    psstore_ctl_record(ctl, 1, &a);
    psstore_ctl_record(ctl, 1, &b); /* replaces a: no stale copy is left behind */
    float g = 1.0f;
    psstore_decision_t d;
    psstore_ctl_prepare(ctl, &g, 3, 1, &now, 1, &d);
    assert_int_equal(d.dc, 1);
    assert_close(g, 1.0 + 1.0 * (3.0 - 2.0));
    psstore_ctl_destroy(ctl);
}

/* ------------------------------------------------------------------------
 * Controller: counters and the optimizer step
 * ---------------------------------------------------------------------- */
static void test_stats_count_every_outcome(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    conf.clip_norm = 1.0;
    conf.max_staleness = 2;
    conf.dc_lambda = 0.1;
    conf.dc_ring = 2;
    psstore_ctl_t *ctl = ctl_make(&conf, 1);
    const float w = 0.0f;
    psstore_ctl_record(ctl, 10, &w);
    psstore_decision_t d;
    float g;

    g = 0.5f; /* applied, tau 0 */
    psstore_ctl_prepare(ctl, &g, 10, 10, &w, 1, &d);
    g = 4.0f; /* clipped, applied, compensated */
    psstore_ctl_prepare(ctl, &g, 11, 10, &w, 1, &d);
    g = 4.0f; /* clipped, applied, v left the ring */
    psstore_ctl_prepare(ctl, &g, 11, 9, &w, 1, &d);
    g = 4.0f; /* clipped, then dropped for staleness */
    psstore_ctl_prepare(ctl, &g, 13, 10, &w, 1, &d);
    assert_int_equal(d.clipped, 1);
    g = NAN; /* dropped non-finite */
    psstore_ctl_prepare(ctl, &g, 10, 10, &w, 1, &d);

    psstore_ctl_stats_t st;
    psstore_ctl_stats(ctl, &st);
    assert_int_equal(st.applied, 3);
    assert_int_equal(st.dropped_nonfinite, 1);
    assert_int_equal(st.dropped_staleness, 1);
    assert_int_equal(st.clipped, 3);
    assert_int_equal(st.dc_applied, 1);
    assert_int_equal(st.dc_missed, 1);

    psstore_ctl_reset(ctl); /* counters count since creation */
    psstore_ctl_stats(ctl, &st);
    assert_int_equal(st.applied, 3);
    psstore_ctl_destroy(ctl);
}

static void test_apply_after_prepare_steps_the_optimizer_with_lr_eff(void **state)
{
    (void)state;
    const psstore_optim_t optims[3] = {PSSTORE_OPTIM_SGD, PSSTORE_OPTIM_MOMENTUM,
                                       PSSTORE_OPTIM_ADAGRAD};
    for (int k = 0; k < 3; k++) {
        psstore_ctl_conf_t conf;
        psstore_ctl_conf_init(&conf);
        conf.lr = 0.3;
        conf.policy = PSSTORE_POLICY_DELAY;
        conf.warmup = 8;
        conf.optim = optims[k];
        conf.momentum = 0.8;
        psstore_ctl_t *ctl = ctl_make(&conf, 4);
        float w[4] = {1.0f, -1.0f, 0.25f, 3.0f}, w_ref[4];
        float st[4] = {0}, st_ref[4] = {0};
        memcpy(w_ref, w, sizeof(w));

        for (int t = 0; t < 3; t++) {
            float g[4] = {0.5f, -0.25f + (float)t, 2.0f, -1.5f};
            psstore_decision_t d;
            /* version 3 + t read on 3 + t - 6: tau 6 with 2 pushers */
            assert_int_equal(psstore_ctl_prepare(ctl, g, 3 + t, t - 3, NULL, 2, &d), PSSTORE_APPLY);
            assert_close(d.lr_eff, 0.3 * (4.0 + t) / 8.0 * (2.0 / 6.0));
            psstore_ctl_apply(ctl, w, st, g, &d);
            psstore_optim_step(optims[k], w_ref, st_ref, g, 4, (float)d.lr_eff, 0.8f);
            assert_memory_equal(w, w_ref, sizeof(w));
            assert_memory_equal(st, st_ref, sizeof(st));
        }
        assert_true(w[0] != 1.0f);
        psstore_ctl_destroy(ctl);
    }
}

static void test_apply_of_a_dropped_gradient_leaves_the_weights(void **state)
{
    (void)state;
    psstore_ctl_conf_t conf;
    psstore_ctl_conf_init(&conf);
    psstore_ctl_t *ctl = ctl_make(&conf, 2);
    float g[2] = {NAN, 1.0f}, w[2] = {1.0f, 2.0f};
    psstore_decision_t d;
    assert_int_equal(psstore_ctl_prepare(ctl, g, 0, 0, NULL, 1, &d), PSSTORE_DROP_NONFINITE);
    psstore_ctl_apply(ctl, w, NULL, g, &d);
    assert_true(w[0] == 1.0f && w[1] == 2.0f);
    psstore_ctl_destroy(ctl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimizer_names_parse_and_round_trip),
        cmocka_unit_test(test_optimizer_state_is_empty_for_sgd_and_n_floats_otherwise),
        cmocka_unit_test(test_sgd_subtracts_lr_times_gradient),
        cmocka_unit_test(test_momentum_matches_torch_sgd_three_steps),
        cmocka_unit_test(test_adagrad_matches_torch_adagrad_two_steps),
        cmocka_unit_test(test_optimizers_match_pytorch),
        cmocka_unit_test(test_the_served_average_weighs_the_last_tenth_up_to_the_horizon),
        cmocka_unit_test(test_policy_and_outcome_names_round_trip),
        cmocka_unit_test(test_conf_defaults_are_those_of_the_design),
        cmocka_unit_test(test_new_refuses_bad_conf_naming_the_field),
        cmocka_unit_test(test_destroy_of_null_is_a_noop),
        cmocka_unit_test(test_nonfinite_gradients_are_dropped_untouched),
        cmocka_unit_test(test_a_known_sum_of_squares_decides_as_the_pass_would),
        cmocka_unit_test(test_sum_squares_is_its_documented_order_bit_for_bit),
        cmocka_unit_test(test_clipping_scales_only_gradients_with_norm_above_c),
        cmocka_unit_test(test_a_slice_is_clipped_and_rejected_by_the_whole_norm),
        cmocka_unit_test(test_norm_and_finiteness_cover_every_element_of_odd_sizes),
        cmocka_unit_test(test_max_staleness_drops_tau_above_and_applies_tau_at_the_bound),
        cmocka_unit_test(test_negative_staleness_is_treated_as_fresh),
        cmocka_unit_test(test_constant_policy_keeps_the_base_rate_at_any_staleness),
        cmocka_unit_test(test_inverse_policy_divides_the_rate_by_staleness),
        cmocka_unit_test(test_delay_policy_damps_only_staleness_beyond_the_pushers),
        cmocka_unit_test(test_adaptive_policy_uses_pushers_before_100_samples_then_the_median),
        cmocka_unit_test(test_adaptive_damps_a_queues_typical_staleness),
        cmocka_unit_test(test_adaptive_median_is_the_lower_median),
        cmocka_unit_test(test_adaptive_window_slides_over_the_last_1000_gradients),
        cmocka_unit_test(test_adaptive_window_clips_huge_staleness),
        cmocka_unit_test(test_reset_clears_the_adaptive_window),
        cmocka_unit_test(test_warmup_raises_the_rate_linearly_over_warmup_versions),
        cmocka_unit_test(test_constant_dc_matches_the_hand_computed_gradient),
        cmocka_unit_test(test_adaptive_dc_tracks_the_mean_square_and_its_lambda),
        cmocka_unit_test(test_dc_is_skipped_and_counted_when_the_version_left_the_ring),
        cmocka_unit_test(test_recording_a_version_again_replaces_its_weights),
        cmocka_unit_test(test_stats_count_every_outcome),
        cmocka_unit_test(test_apply_after_prepare_steps_the_optimizer_with_lr_eff),
        cmocka_unit_test(test_apply_of_a_dropped_gradient_leaves_the_weights),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
