/*
 * test_sparse_store.c - a sparse model in a real redis-server
 * (docs/design.md "Sparse models"): rows pulled by a worker, row
 * gradients applied by the applier with the per-row optimizer, exactly
 * once by the positions, rows read back from Redis by a new applier, and
 * malformed and non-finite gradients dropped.
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
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "psstore/psstore.h"

#define DIM  2
#define ROWL (1 + DIM)
#define BITS 10

static harness_redis_t redis;
static char errstr[512];
static const sparse_spec_t spec = {.fields = 3, .bits = BITS, .dim = DIM};

static sparse_optim_t optim(void)
{
    sparse_optim_t o;
    sparse_optim_defaults(&o, SPARSE_OPTIM_FTRL);
    o.seed = 5;
    return o;
}

/* The rows the test expects: what the optimizer makes of them by hand. */
typedef struct expect {
    float param[1 << BITS][ROWL], state[1 << BITS][2 + DIM];
    uint8_t touched[1 << BITS];
    float bias, bias_state[2];
} expect_t;

static void expect_step(expect_t *e, const sparse_optim_t *o, const uint32_t *rows, size_t m,
                        const float *grads, float gbias)
{
    for (size_t i = 0; i < m; i++) {
        uint32_t r = rows[i];
        if (!e->touched[r]) {
            sparse_row_init(&spec, o, r, e->param[r], e->state[r]);
            e->touched[r] = 1;
        }
        sparse_row_step(&spec, o, e->param[r], e->state[r], grads + i * ROWL);
    }
    sparse_bias_step(o, &e->bias, e->bias_state, gbias);
}

static void start(harness_applier_t *t, const char *model, int min_count)
{
    psstore_applier_conf_t conf;
    psstore_applier_conf_init(&conf);
    conf.url = redis.url;
    conf.model = model;
    conf.lease_ms = 1000;
    conf.audit = 1;
    conf.sparse.enabled = 1;
    conf.sparse.spec = spec;
    conf.sparse.optim = optim();
    conf.sparse.min_count = min_count;
    assert_int_equal(harness_applier_start(t, &conf), 0);
}

/* Creates sparse model (bias 0, no rows), starts its applier with
 * min_count into *t, and returns a pushing client; *c is a connection
 * for the test's own reads. */
static psstore_client_t *open_model(const char *model, int min_count, harness_applier_t *t,
                                    psstore_conn_t **c)
{
    *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    assert_non_null(*c);
    const float bias0 = 0;
    psstore_model_spec_t ms = {"sparse", "logistic", 1, 1, "fields:3,buckets:2^10,dim:2"};
    assert_int_equal(psstore_model_create(*c, model, &ms, &bias0, 0), FR_OK);
    start(t, model, min_count);
    psstore_client_t *cl = psstore_client_new(redis.url, model, 1, 64, errstr, sizeof(errstr));
    assert_non_null(cl);
    psstore_client_any_length(cl);
    return cl;
}

/* Pushes rows[m] with their gradients over positions [from, to) of t/0. */
static void push(psstore_client_t *cl, const uint32_t *rows, size_t m, const float *grads,
                 float gbias, int64_t from, int64_t to, uint64_t epoch, int64_t version)
{
    float packed[64];
    assert_true(psstore_sparse_grad_len(m, DIM) <= 64);
    psstore_sparse_pack(rows, m, grads, DIM, gbias, packed);
    assert_int_equal(harness_push_range(cl, packed, psstore_sparse_grad_len(m, DIM), 0, from, to,
                                        epoch, version, 5000),
                     FR_OK);
}

/* Waits until the applier dropped `drops` gradients in all and the store
 * holds version v. */
static void wait_for(harness_applier_t *t, const char *model, int64_t v, uint64_t drops)
{
    psstore_applier_stats_t st;
    char out[64] = "";
    for (int i = 0; i < 500; i++) {
        psstore_applier_stats(t->a, &st);
        uint64_t d = 0;
        for (int k = 0; k < PSSTORE_NDROP; k++)
            d += st.dropped[k];
        assert_int_equal(
            harness_redis_query(&redis, out, sizeof(out), "GET freshet:{%s}:ver", model), 0);
        if (d == drops && strtoll(out, NULL, 10) == v)
            return;
        harness_sleep_ms(10);
    }
    fail_msg("the store holds version %s, not %lld (applier at %lld)", out, (long long)v,
             (long long)st.version);
}

/* Pulls rows[n] and checks them, the bias and the version against e. */
static void check_pull(psstore_conn_t *c, const char *model, const expect_t *e,
                       const uint32_t *rows, size_t n, int64_t version, uint64_t *epoch)
{
    float params[16][ROWL], bias = -1;
    uint8_t found[16];
    const sparse_optim_t o = optim();
    int64_t v = -1;
    assert_int_equal(
        psstore_rows_pull(c, model, &spec, &o, rows, n, &params[0][0], found, &bias, epoch, &v),
        FR_OK);
    assert_int_equal(v, version);
    assert_float_equal(bias, e->bias, 1e-6);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(found[i], e->touched[rows[i]]);
        for (int k = 0; found[i] && k < ROWL; k++)
            assert_float_equal(params[i][k], e->param[rows[i]][k], 1e-6);
    }
}

static void test_rows_are_applied_once_and_read_back_by_a_new_applier(void **state)
{
    (void)state;
    const char *model = "sp1";
    static expect_t e;
    memset(&e, 0, sizeof(e));
    const sparse_optim_t o = optim();
    psstore_conn_t *c;
    harness_applier_t t;
    psstore_client_t *cl = open_model(model, 1, &t, &c);
    psstore_model_info_t info;
    assert_int_equal(psstore_model_info(c, model, &info), FR_OK);
    assert_string_equal(info.sparse, "fields:3,buckets:2^10,dim:2");
    uint64_t epoch = 0;
    const uint32_t all[] = {5, 9, 11, 1023};
    check_pull(c, model, &e, all, 4, 0, &epoch); /* nothing written: none found */

    const uint32_t r1[] = {5, 9};
    const float g1[] = {0.5f, -0.1f, 0.2f, -0.25f, 0.3f, 0.05f};
    push(cl, r1, 2, g1, 0.4f, 0, 16, epoch, 0);
    expect_step(&e, &o, r1, 2, g1, 0.4f);
    wait_for(&t, model, 1, 0);
    check_pull(c, model, &e, all, 4, 1, &epoch);

    push(cl, r1, 2, g1, 0.4f, 8, 20, epoch, 1); /* overlaps [0, 16): a duplicate */
    wait_for(&t, model, 1, 1);
    const uint32_t r2[] = {9, 1023};
    const float g2[] = {0.1f, 0.2f, -0.3f, -0.6f, 0.0f, 0.7f};
    push(cl, r2, 2, g2, -0.2f, 16, 32, epoch, 1);
    expect_step(&e, &o, r2, 2, g2, -0.2f);
    wait_for(&t, model, 2, 1);
    check_pull(c, model, &e, all, 4, 2, &epoch);

    /* malformed (a length that is no whole row) and non-finite: dropped,
     * their positions marked all the same */
    float bad[4] = {0, 1, 2, 3};
    assert_int_equal(harness_push_range(cl, bad, 4, 0, 32, 40, epoch, 2, 5000), FR_OK);
    float nan_g[] = {0.1f, NAN, 0.1f};
    push(cl, r2, 1, nan_g, 0, 40, 48, epoch, 2);
    wait_for(&t, model, 2, 3);
    /* more rows than the table (2^10): no batch's, and memory it must not take */
    size_t big = ((size_t)1 << BITS) + 1, blen = psstore_sparse_grad_len(big, DIM);
    float *huge = calloc(blen, sizeof(float));
    assert_non_null(huge);
    assert_int_equal(harness_push_range(cl, huge, blen, 1, 0, 8, epoch, 2, 5000), FR_OK);
    free(huge);
    wait_for(&t, model, 2, 4);
    psstore_applier_stats_t st;
    harness_applier_stop(&t, &st);
    assert_int_equal(st.dropped[PSSTORE_DROPPED_DUPLICATE], 1);
    assert_int_equal(st.dropped[PSSTORE_DROPPED_MALFORMED], 2);
    assert_int_equal(st.dropped[PSSTORE_DROPPED_NONFINITE], 1);

    /* a new applier reads the rows it steps from the store */
    start(&t, model, 1);
    const uint32_t r3[] = {5, 11};
    const float g3[] = {-0.2f, 0.1f, 0.1f, 0.3f, -0.3f, 0.2f};
    push(cl, r3, 2, g3, 0.1f, 48, 64, epoch, 2);
    expect_step(&e, &o, r3, 2, g3, 0.1f);
    wait_for(&t, model, 3, 0);
    check_pull(c, model, &e, all, 4, 3, &epoch);
    harness_applier_stop(&t, NULL);

    /* every position once: applied [0,32) and [48,64), dropped [32,48) */
    int seen[64];
    assert_true(harness_audit_count(&redis, model, "t", 0, "applied", seen, 64) == 3);
    for (int p = 0; p < 64; p++)
        assert_int_equal(seen[p], p < 32 || p >= 48);
    char out[64];
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out), "HLEN freshet:{%s}:rows", model),
                     0);
    assert_string_equal(out, "4"); /* rows 5, 9, 11, 1023, each with its state */
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:offsets t/0", model), 0);
    assert_string_equal(out, "64");
    psstore_client_destroy(cl);
    psstore_conn_destroy(c);
}

/*
 * Admission: with min_count 3 a row the store lacks is created by the
 * third gradient that names it, stepped from its initial value by that
 * gradient alone; the first two leave it absent (and its value initial).
 */
static void test_a_row_is_admitted_at_its_min_count_th_gradient(void **state)
{
    (void)state;
    const char *model = "sp2";
    psstore_conn_t *c;
    harness_applier_t t;
    psstore_client_t *cl = open_model(model, 3, &t, &c);
    static expect_t e;
    memset(&e, 0, sizeof(e));
    const sparse_optim_t o = optim();
    uint64_t epoch = 0;
    const uint32_t r7[] = {7};
    check_pull(c, model, &e, r7, 1, 0, &epoch);
    const float g[] = {0.5f, -0.25f, 0.125f};
    char out[64];
    for (int k = 0; k < 3; k++) {
        push(cl, r7, 1, g, 0.1f, 16 * k, 16 * (k + 1), epoch, k);
        if (k < 2) /* the bias learns; row 7 is not admitted yet */
            sparse_bias_step(&o, &e.bias, e.bias_state, 0.1f);
        else
            expect_step(&e, &o, r7, 1, g, 0.1f);
        wait_for(&t, model, k + 1, 0);
        assert_int_equal(
            harness_redis_query(&redis, out, sizeof(out), "HLEN freshet:{%s}:rows", model), 0);
        assert_string_equal(out, k < 2 ? "0" : "1");
        check_pull(c, model, &e, r7, 1, k + 1, &epoch);
    }
    harness_applier_stop(&t, NULL);
    psstore_client_destroy(cl);
    psstore_conn_destroy(c);
}

static int setup(void **state)
{
    (void)state;
    return harness_redis_start(&redis, "");
}

static int teardown(void **state)
{
    (void)state;
    harness_redis_stop(&redis);
    return 0;
}

int main(void)
{
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_are_applied_once_and_read_back_by_a_new_applier),
        cmocka_unit_test(test_a_row_is_admitted_at_its_min_count_th_gradient),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
