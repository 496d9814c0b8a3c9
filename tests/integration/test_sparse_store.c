/*
 * test_sparse_store.c - a sparse model in a real redis-server
 * (docs/design.md "Sparse models", "Serving sparse models"): rows pulled
 * by a worker, row gradients applied by the applier with the per-row
 * optimizer, exactly once by the positions, rows read back from Redis by a
 * new applier, malformed and non-finite gradients dropped, admission, and
 * the rows, deltas, tombstones of evicted rows and table pages that serve
 * answers over HTTP.
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
#include <sys/wait.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>

#include <cmocka.h>

#include "harness.h"
#include "psstore/psstore.h"
#include "psstore/applier/applier_int.h" /* ps_applier_commit_wait_for_test */
#include "serve/serve.h"

#define DIM  2
#define ROWL (1 + DIM)
#define BITS 14 /* rows r and r + 8192 share a home slot in the applier's first table */

/* meta's sparse, as freshet run writes it: serve initialises absent rows by it */
#define SPARSE_META "fields:3,buckets:2^14,dim:2;optimizer:ftrl;seed:5;init_std:0.01"

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

/* The configuration of model's applier: the test's table and optimizer. */
static void applier_conf(psstore_applier_conf_t *conf, const char *model, int min_count,
                         int64_t ttl_ms, int64_t delta_ms)
{
    psstore_applier_conf_init(conf);
    conf->url = redis.url;
    conf->model = model;
    conf->lease_ms = 1000;
    conf->audit = 1;
    conf->sparse.enabled = 1;
    conf->sparse.spec = spec;
    conf->sparse.optim = optim();
    conf->sparse.min_count = min_count;
    conf->sparse.ttl_ms = ttl_ms;
    conf->sparse.delta_ms = delta_ms;
}

static void start(harness_applier_t *t, const char *model, int min_count, int64_t ttl_ms,
                  int64_t delta_ms)
{
    psstore_applier_conf_t conf;
    applier_conf(&conf, model, min_count, ttl_ms, delta_ms);
    assert_int_equal(harness_applier_start(t, &conf), 0);
}

/* Creates sparse model (bias 0, no rows), starts its applier with
 * min_count, ttl_ms and delta_ms into *t, and returns a pushing client; *c
 * is a connection for the test's own reads. */
static psstore_client_t *open_model(const char *model, int min_count, int64_t ttl_ms,
                                    int64_t delta_ms, harness_applier_t *t, psstore_conn_t **c)
{
    *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    assert_non_null(*c);
    const float bias0 = 0;
    psstore_model_spec_t ms = {"sparse", "logistic", 1, 1, SPARSE_META};
    assert_int_equal(psstore_model_create(*c, model, &ms, &bias0, 0), FR_OK);
    start(t, model, min_count, ttl_ms, delta_ms);
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
    assert_true(psstore_sparse_grad_len(m, 1 + DIM, 1) <= 64);
    psstore_sparse_pack(rows, m, grads, 1 + DIM, &gbias, 1, packed);
    assert_int_equal(harness_push_range(cl, packed, psstore_sparse_grad_len(m, 1 + DIM, 1), 0, from,
                                        to, epoch, version, 5000),
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
    fail_msg("the store holds version %s, not %lld (applier at %lld, %llu dropped)", out,
             (long long)v, (long long)st.version,
             (unsigned long long)(st.dropped[0] + st.dropped[1] + st.dropped[2] + st.dropped[3]));
}

/* Pulls rows[n] and checks them, the bias and the version against e. */
static void check_pull(psstore_conn_t *c, const char *model, const expect_t *e,
                       const uint32_t *rows, size_t n, int64_t version, uint64_t *epoch)
{
    float params[16][ROWL], bias = -1;
    uint8_t found[16];
    const sparse_optim_t o = optim();
    int64_t v = -1;
    assert_int_equal(psstore_rows_pull(c, model, &spec, &o, rows, n, &params[0][0], found, &bias,
                                       NULL, epoch, &v),
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
    psstore_client_t *cl = open_model(model, 1, 0, 0, &t, &c);
    psstore_model_info_t info;
    assert_int_equal(psstore_model_info(c, model, &info), FR_OK);
    assert_string_equal(info.sparse, SPARSE_META);
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
    /* more rows than the table (2^14): no batch's, and memory it must not take */
    size_t big = ((size_t)1 << BITS) + 1, blen = psstore_sparse_grad_len(big, 1 + DIM, 1);
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
    start(&t, model, 1, 0, 0);
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
    psstore_client_t *cl = open_model(model, 3, 0, 0, &t, &c);
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

/* ---- serving ----------------------------------------------------------------- */

static char tmp_dir[256];

/* A server of this test's store on a free port, once it reached the store;
 * *port its port. */
static serve_t *serve_open(fr_metrics_t *metrics, int *port)
{
    serve_conf_t conf;
    serve_conf_init(&conf);
    conf.listen = "127.0.0.1:0";
    conf.redis_url = redis.url;
    conf.model = "";
    conf.metrics = metrics;
    serve_t *srv = serve_new(&conf, errstr, sizeof(errstr));
    assert_non_null(srv);
    assert_int_equal(serve_start(srv, errstr, sizeof(errstr)), FR_OK);
    *port = serve_port(srv);
    /* ready once the follower reached the store (no default model) */
    harness_resp_t r;
    harness_await_code(*port, tmp_dir, &r, "/readyz", 200, 250, 20);
    assert_int_equal(r.code, 200);
    harness_resp_free(&r);
    return srv;
}

/* GETs path and parses the safetensors answer, expecting 200. */
static fr_st_file_t *get_st(int port, const char *path)
{
    harness_resp_t r;
    harness_http(port, tmp_dir, &r, "", path);
    if (r.code != 200)
        fail_msg("GET %s: %d %s", path, r.code, r.body);
    fr_st_file_t *st = fr_st_parse((const uint8_t *)r.body, r.len, errstr, sizeof(errstr));
    if (st == NULL)
        fail_msg("GET %s: %s", path, errstr);
    harness_resp_free(&r);
    return st;
}

/* GETs path and expects code with needle in the body. */
static void get_code(int port, const char *path, int code, const char *needle)
{
    harness_resp_t r;
    harness_http(port, tmp_dir, &r, "", path);
    harness_expect(&r, code, needle);
    harness_resp_free(&r);
}

static int64_t st_int(const fr_st_file_t *st, const char *key)
{
    const char *v = fr_st_meta(st, key);
    assert_non_null(v);
    return strtoll(v, NULL, 10);
}

/* The U32 tensor name of st, its length in *n. */
static const uint32_t *st_u32(const fr_st_file_t *st, const char *name, size_t *n)
{
    const fr_st_tensor_t *t = fr_st_find(st, name);
    assert_non_null(t);
    assert_string_equal(t->dtype, "U32");
    *n = t->nbytes / 4;
    return t->data;
}

/* Checks a delta or a table page: the rows present are want[nwant] (in any
 * order) with e's values, the tombstones gone[ngone] (any order). */
static void expect_rows(const fr_st_file_t *st, const expect_t *e, const uint32_t *want,
                        size_t nwant, const uint32_t *gone, size_t ngone)
{
    size_t n, g = 0;
    const uint32_t *ids = st_u32(st, "ids", &n);
    const fr_st_tensor_t *rows = fr_st_find(st, "rows");
    assert_non_null(rows);
    assert_int_equal(n, nwant);
    assert_int_equal(rows->nbytes, n * ROWL * 4);
    const float *v = rows->data;
    uint8_t seen[8] = {0}; /* each wanted row once */
    assert_true(nwant <= 8 && ngone <= 8);
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        while (k < nwant && ids[i] != want[k])
            k++;
        if (k == nwant || seen[k]++)
            fail_msg("row %u is not expected (or came twice)", ids[i]);
        for (int j = 0; j < ROWL; j++)
            assert_float_equal(v[i * ROWL + j], e->param[ids[i]][j], 1e-6);
    }
    const uint32_t *tomb = fr_st_find(st, "tombstones") ? st_u32(st, "tombstones", &g) : NULL;
    assert_int_equal(g, ngone);
    memset(seen, 0, sizeof(seen));
    for (size_t i = 0; i < g; i++) {
        size_t k = 0;
        while (k < ngone && tomb[i] != gone[k])
            k++;
        if (k == ngone || seen[k]++)
            fail_msg("tombstone %u is not expected (or came twice)", tomb[i]);
    }
    const fr_st_tensor_t *bias = fr_st_find(st, "bias");
    assert_non_null(bias);
    assert_float_equal(*(const float *)bias->data, e->bias, 1e-6);
}

/*
 * The rows routes read Redis on serve's reader thread, not on the loop:
 * with redis-server stopped (SIGSTOP), a /rows request waits while /livez
 * is answered; once Redis runs again (SIGCONT) the waiting request gets
 * its rows. Clients that hang up with their request queued are dropped:
 * not answered, not counted (ASan watches the jobs' memory).
 */
/* serve's count of the rows requests it answered 200. */
static long rows_answered(fr_metrics_t *metrics)
{
    char *text = fr_metrics_render(metrics, NULL);
    assert_non_null(text);
    const char *key = "freshet_http_requests_total{route=\"rows\",code=\"200\"} ";
    const char *at = strstr(text, key);
    long n = at != NULL ? strtol(at + strlen(key), NULL, 10) : 0;
    free(text);
    return n;
}

static void reads_leave_the_loop_free(int port, fr_metrics_t *metrics)
{
    long answered = rows_answered(metrics);
    char url[128], log[300], out[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v2/models/sp3/rows?ids=9", port);
    snprintf(log, sizeof(log), "%s/curl.log", tmp_dir);
    assert_int_equal(kill(redis.pid, SIGSTOP), 0);
    char *argv[] = {"curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url, NULL};
    pid_t pid = harness_spawn(argv, log);
    assert_true(pid > 0);
    for (int i = 0; i < 5; i++) { /* hang up with the request queued */
        char req[160];
        snprintf(req, sizeof(req),
                 "GET /v2/models/sp3/rows?ids=%d HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", i);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        assert_true(write(fd, req, strlen(req)) == (ssize_t)strlen(req));
        close(fd);
    }
    harness_sleep_ms(300);
    get_code(port, "/livez", 200, "\"live\":true");
    assert_int_equal(harness_wait(pid, 200), -1); /* /rows still waits for Redis */
    assert_int_equal(kill(redis.pid, SIGCONT), 0);
    int status = harness_wait(pid, 10000);
    assert_true(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    assert_non_null(fgets(out, sizeof(out), f));
    fclose(f);
    assert_string_equal(out, "200");
    get_code(port, "/v2/models/sp3/rows?ids=9", 200, NULL);
    /* the curl and the last request; the five that hung up were dropped */
    assert_int_equal(rows_answered(metrics), answered + 2);
}

/*
 * Serving (docs/design.md "Serving sparse models"), with min_count 2 and a
 * ttl of 2.5 s: a cold start reads the table, each delta names exactly the
 * rows admitted and changed since its version with their values, /rows
 * gives stored rows and the initial value of the others, and once no
 * gradient touched the rows for the ttl they are deleted from the store and
 * seen as tombstones in the next delta. Bad requests get 400, a dense
 * model's rows 400, an epoch of another lineage 410.
 */
static void test_rows_deltas_and_tombstones_are_served(void **state)
{
    (void)state;
    const char *model = "sp3";
    psstore_conn_t *c;
    harness_applier_t t;
    psstore_client_t *cl = open_model(model, 2, 2500, 0, &t, &c);
    fr_metrics_t *metrics = fr_metrics_new();
    int port;
    serve_t *srv = serve_open(metrics, &port);
    static expect_t e;
    memset(&e, 0, sizeof(e));
    const sparse_optim_t o = optim();
    char path[256];

    /* a cold start: the table is empty at version 0 */
    fr_st_file_t *st = get_st(port, "/v2/models/sp3/table");
    uint64_t epoch = (uint64_t)strtoull(fr_st_meta(st, "freshet.epoch"), NULL, 10);
    assert_int_equal(st_int(st, "freshet.version"), 0);
    assert_string_equal(fr_st_meta(st, "freshet.cursor"), "0");
    assert_string_equal(fr_st_meta(st, "freshet.sparse"), "fields:3,buckets:2^14,dim:2");
    expect_rows(st, &e, NULL, 0, NULL, 0);
    fr_st_destroy(st);

    /* rows 5 and 1023 named once, 9 twice: only 9 is admitted, at its second */
    const uint32_t r1[] = {5, 9}, r2[] = {9, 1023};
    const float g1[] = {0.5f, -0.1f, 0.2f, -0.25f, 0.3f, 0.05f};
    const float g2[] = {0.1f, 0.2f, -0.3f, -0.6f, 0.0f, 0.7f};
    push(cl, r1, 2, g1, 0.4f, 0, 16, epoch, 0);
    sparse_bias_step(&o, &e.bias, e.bias_state, 0.4f);
    push(cl, r2, 2, g2, -0.2f, 16, 32, epoch, 1);
    expect_step(&e, &o, r2, 1, g2, -0.2f); /* row 9 alone (1023 not admitted) */
    wait_for(&t, model, 2, 0);
    const uint32_t only9[] = {9};
    st = get_st(port, "/v2/models/sp3/delta?since=0");
    expect_rows(st, &e, only9, 1, NULL, 0);
    assert_int_equal(st_int(st, "freshet.version"), 2);
    assert_string_equal(fr_st_meta(st, "freshet.more"), "false");
    assert_true(st_int(st, "freshet.time_ms") > 0);
    fr_st_destroy(st);
    st = get_st(port, "/v2/models/sp3/delta?since=2"); /* nothing new */
    expect_rows(st, &e, NULL, 0, NULL, 0);
    assert_int_equal(st_int(st, "freshet.version"), 2);
    fr_st_destroy(st);

    /* /rows: the stored row, and the initial value of the others */
    st = get_st(port, "/v2/models/sp3/rows?ids=5,9,1023");
    size_t n;
    const uint32_t *stored = st_u32(st, "stored", &n);
    assert_int_equal(n, 3);
    assert_int_equal(stored[0], 0);
    assert_int_equal(stored[1], 1);
    assert_int_equal(stored[2], 0);
    const float *v = fr_st_find(st, "rows")->data;
    float init[ROWL], state0[2 + DIM];
    sparse_row_init(&spec, &o, 5, init, state0);
    for (int k = 0; k < ROWL; k++) {
        assert_float_equal(v[k], init[k], 0);
        assert_float_equal(v[ROWL + k], e.param[9][k], 1e-6);
    }
    assert_int_equal(st_int(st, "freshet.version"), 2);
    fr_st_destroy(st);

    /* row 5's second naming admits it, 9 steps again, 11 is named once
     * (5 and 9 stepped together go stale together) */
    const uint32_t r3[] = {5, 9, 11};
    const float g3[] = {-0.2f, 0.1f, 0.1f, 0.3f, -0.3f, 0.2f, 0.1f, 0.1f, 0.1f};
    push(cl, r3, 3, g3, 0.1f, 32, 48, epoch, 2);
    expect_step(&e, &o, r3, 2, g3, 0.1f);
    wait_for(&t, model, 3, 0);
    const uint32_t both[] = {5, 9};
    st = get_st(port, "/v2/models/sp3/delta?since=2");
    expect_rows(st, &e, both, 2, NULL, 0);
    assert_int_equal(st_int(st, "freshet.version"), 3);
    fr_st_destroy(st);
    snprintf(path, sizeof(path), "/v2/models/sp3/table?count=100");
    st = get_st(port, path);
    expect_rows(st, &e, both, 2, NULL, 0);
    assert_int_equal(st_int(st, "freshet.version"), 3);
    fr_st_destroy(st);

    /* no gradient for the ttl: both rows are evicted, one new version */
    wait_for(&t, model, 4, 0);
    char out[64];
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out), "HLEN freshet:{%s}:rows", model),
                     0);
    assert_string_equal(out, "0");
    st = get_st(port, "/v2/models/sp3/delta?since=3");
    expect_rows(st, &e, NULL, 0, both, 2);
    assert_int_equal(st_int(st, "freshet.version"), 4);
    fr_st_destroy(st);
    st = get_st(port, "/v2/models/sp3/delta?since=0"); /* from nothing: both gone */
    expect_rows(st, &e, NULL, 0, both, 2);
    fr_st_destroy(st);
    st = get_st(port, "/v2/models/sp3/rows?ids=9");
    stored = st_u32(st, "stored", &n);
    assert_int_equal(stored[0], 0);
    fr_st_destroy(st);
    psstore_applier_stats_t ast;
    psstore_applier_stats(t.a, &ast);
    assert_int_equal(ast.evicted, 2);

    /* bad requests */
    get_code(port, "/v2/models/sp3/rows", 400, "ids is required");
    get_code(port, "/v2/models/sp3/rows?ids=1,x", 400, "not a list of row numbers");
    get_code(port, "/v2/models/sp3/rows?ids=16384", 400, "beyond the table");
    get_code(port, "/v2/models/sp3/delta", 400, "since is required");
    get_code(port, "/v2/models/sp3/delta?since=-1", 400, "since is required");
    get_code(port, "/v2/models/sp3/delta?since=0&max_rows=0", 400, "max_rows");
    get_code(port, "/v2/models/sp3/table?cursor=abc", 400, "cursor");
    get_code(port, "/v2/models/sp3/rows?ids=1&format=xml", 400, "format");
    get_code(port, "/v2/models/nosuch/rows?ids=1", 404, "no model");
    snprintf(path, sizeof(path), "/v2/models/sp3/delta?since=3&epoch=%llu",
             (unsigned long long)epoch + 1);
    get_code(port, path, 410, "reload");
    get_code(port, "/v2/models/sp3/delta?since=5000", 410, "newer than the model's (4)");
    const float w3[3] = {0};
    psstore_model_spec_t dense = {"2-1", "logistic", 3, 1, NULL};
    assert_int_equal(psstore_model_create(c, "dense1", &dense, w3, 0), FR_OK);
    get_code(port, "/v2/models/dense1/rows?ids=1", 400, "dense model");
    /* JSON, for people */
    get_code(port, "/v2/models/sp3/delta?since=3&format=json", 200, "\"tombstones\":[");
    reads_leave_the_loop_free(port, metrics);

    serve_destroy(srv);
    fr_metrics_destroy(metrics);
    harness_applier_stop(&t, NULL);
    psstore_client_destroy(cl);
    psstore_conn_destroy(c);
}

/* A sparse model in training and served: its applier, a client that
 * pushes, a connection, a server on a free port, the model's epoch. */
typedef struct served {
    psstore_conn_t *c;
    harness_applier_t t;
    psstore_client_t *cl;
    fr_metrics_t *metrics;
    serve_t *srv;
    int port;
    uint64_t epoch;
} served_t;

static void served_open(served_t *m, const char *model, int min_count)
{
    char path[128];
    m->cl = open_model(model, min_count, 0, 0, &m->t, &m->c);
    m->metrics = fr_metrics_new();
    m->srv = serve_open(m->metrics, &m->port);
    snprintf(path, sizeof(path), "/v2/models/%s/table", model);
    fr_st_file_t *st = get_st(m->port, path);
    m->epoch = (uint64_t)strtoull(fr_st_meta(st, "freshet.epoch"), NULL, 10);
    fr_st_destroy(st);
}

static void served_close(served_t *m)
{
    serve_destroy(m->srv);
    fr_metrics_destroy(m->metrics);
    harness_applier_stop(&m->t, NULL);
    psstore_client_destroy(m->cl);
    psstore_conn_destroy(m->c);
}

static void post_json(int port, harness_resp_t *r, const char *path, const char *body)
{
    harness_post_json(port, tmp_dir, r, path, body, "");
}

/*
 * Predictions of a sparse model: records as the topic carries them (libsvm
 * lines here), scored on the rows the store holds (and the initial value of
 * the others), to 1e-6 of the model's definition computed here: bias +
 * sum w_i x_i + sum_{i<j} <v_i, v_j> x_i x_j, through the sigmoid.
 */
static void test_sparse_predictions_score_the_rows_held(void **state)
{
    (void)state;
    served_t sm;
    served_open(&sm, "spi", 1);
    int port = sm.port;
    static expect_t e;
    memset(&e, 0, sizeof(e));
    const sparse_optim_t o = optim();

    static const char *const lines[] = {"0 alpha:1 beta:0.5 gamma:2", "1 beta:1 delta:-1.5",
                                        "0 epsilon:1"};
    sparse_sample_t smp[3];
    for (int i = 0; i < 3; i++) {
        const char *why = NULL;
        assert_int_equal(sparse_parse_libsvm(&spec, lines[i], strlen(lines[i]), &smp[i], &why),
                         FR_OK);
    }
    /* the rows of the first two records learn; epsilon's stays unseen */
    uint32_t rows[8];
    size_t m = 0;
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < smp[i].n; k++) {
            size_t x = 0;
            while (x < m && rows[x] != smp[i].row[k])
                x++;
            if (x == m)
                rows[m++] = smp[i].row[k];
        }
    float g[8 * ROWL];
    for (size_t i = 0; i < m * ROWL; i++)
        g[i] = 0.3f * (float)(i % 5) - 0.5f;
    push(sm.cl, rows, m, g, 0.4f, 0, 16, sm.epoch, 0);
    expect_step(&e, &o, rows, m, g, 0.4f);
    wait_for(&sm.t, "spi", 1, 0);

    char body[1024];
    snprintf(body, sizeof(body),
             "{\"id\":\"s1\",\"parameters\":{\"layout\":\"libsvm\"},\"inputs\":[{\"name\":"
             "\"records\",\"shape\":[3],\"datatype\":\"BYTES\",\"data\":[\"%s\",\"%s\",\"%s\"]}]}",
             lines[0], lines[1], lines[2]);
    harness_resp_t r;
    post_json(port, &r, "/v2/models/spi/infer", body);
    harness_expect(&r, 200, "\"model_version\":\"1\"");
    harness_expect(&r, 200, "\"id\":\"s1\"");
    harness_expect(&r, 200, "\"name\":\"probability\",\"datatype\":\"FP32\",\"shape\":[3,1]");
    harness_expect_header(&r, "X-Freshet-Version", "1");
    const char *p = strstr(r.body, "\"data\":[");
    assert_non_null(p);
    p += 8;
    for (int i = 0; i < 3; i++) {
        double score = e.bias, w[SPARSE_FIELDS_MAX][ROWL];
        for (int k = 0; k < smp[i].n; k++) {
            uint32_t row = smp[i].row[k];
            float init[ROWL], st0[2 + DIM];
            if (!e.touched[row])
                sparse_row_init(&spec, &o, row, init, st0);
            for (int d = 0; d < ROWL; d++)
                w[k][d] = e.touched[row] ? e.param[row][d] : init[d];
            score += w[k][0] * smp[i].val[k];
        }
        for (int a = 0; a < smp[i].n; a++)
            for (int b = a + 1; b < smp[i].n; b++)
                for (int d = 1; d < ROWL; d++)
                    score += w[a][d] * w[b][d] * smp[i].val[a] * smp[i].val[b];
        char *end;
        double got = strtod(p, &end);
        assert_true(end != p);
        p = end + 1;
        if (fabs(got - 1.0 / (1.0 + exp(-score))) > 1e-6)
            fail_msg("record %d: probability %.9g, by hand %.9g", i, got,
                     1.0 / (1.0 + exp(-score)));
    }
    harness_resp_free(&r);

    /* what is refused, and why */
    static const char *const bad[][2] = {
        {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3]}]}",
         "a sparse model takes"},
        /* criteo by default: 3 fields cannot hold a Criteo line */
        {"{\"inputs\":[{\"name\":\"records\",\"shape\":[1],\"datatype\":\"BYTES\",\"data\":"
         "[\"0 a:1\"]}]}",
         "not a criteo record"},
        {"{\"parameters\":{\"layout\":\"libsvm\"},\"inputs\":[{\"name\":\"records\",\"shape\":"
         "[2],\"datatype\":\"BYTES\",\"data\":[\"0 a:1\",\"x y\"]}]}",
         "data[1]: not a libsvm record"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        post_json(port, &r, "/v2/models/spi/infer", bad[i][0]);
        harness_expect(&r, 400, bad[i][1]);
        harness_resp_free(&r);
    }
    served_close(&sm);
}

/*
 * The changes stream keeps delta_ms of history: past it, entries are
 * trimmed, meta's delta_floor rises, and a delta since an older version is
 * refused with 410 (the client reloads the table), while one since the
 * floor is answered.
 */
static void test_a_delta_older_than_the_window_is_refused(void **state)
{
    (void)state;
    const char *model = "sp4";
    psstore_conn_t *c;
    harness_applier_t t;
    psstore_client_t *cl = open_model(model, 1, 0, 1000, &t, &c);
    fr_metrics_t *metrics = fr_metrics_new();
    int port;
    serve_t *srv = serve_open(metrics, &port);
    static expect_t e;
    memset(&e, 0, sizeof(e));
    const sparse_optim_t o = optim();
    uint64_t epoch = 0;
    const uint32_t r7[] = {7};
    check_pull(c, model, &e, r7, 1, 0, &epoch);
    const float g[] = {0.5f, -0.25f, 0.125f};
    push(cl, r7, 1, g, 0.1f, 0, 16, epoch, 0);
    expect_step(&e, &o, r7, 1, g, 0.1f);
    wait_for(&t, model, 1, 0);
    fr_st_file_t *st = get_st(port, "/v2/models/sp4/delta?since=0");
    const uint32_t only7[] = {7};
    expect_rows(st, &e, only7, 1, NULL, 0);
    fr_st_destroy(st);
    harness_sleep_ms(3000); /* the first commit is more than a window old */
    const uint32_t r8[] = {8};
    push(cl, r8, 1, g, 0.1f, 16, 32, epoch, 1);
    expect_step(&e, &o, r8, 1, g, 0.1f);
    wait_for(&t, model, 2, 0);
    char out[64];
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:meta delta_floor", model),
        0);
    assert_true(strtoll(out, NULL, 10) >= 1);
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "XLEN freshet:{%s}:changes", model), 0);
    assert_string_equal(out, "1");
    get_code(port, "/v2/models/sp4/delta?since=0", 410, "reload /v2/models/sp4/table");
    const uint32_t only8[] = {8};
    st = get_st(port, "/v2/models/sp4/delta?since=1");
    expect_rows(st, &e, only8, 1, NULL, 0);
    assert_int_equal(st_int(st, "freshet.version"), 2);
    fr_st_destroy(st);
    serve_destroy(srv);
    fr_metrics_destroy(metrics);
    harness_applier_stop(&t, NULL);
    psstore_client_destroy(cl);
    psstore_conn_destroy(c);
}

/* Pushes rows [lo, hi) with gradient g on every coordinate and bias
 * gradient g over positions [from, to) of t/0, and steps e alike. */
static void push_span(psstore_client_t *cl, expect_t *e, uint32_t lo, uint32_t hi, float g,
                      int64_t from, int64_t to, uint64_t epoch, int64_t version)
{
    const sparse_optim_t o = optim();
    size_t m = hi - lo;
    uint32_t *rows = malloc(m * sizeof(*rows));
    float *grads = malloc(m * ROWL * sizeof(float)),
          *packed = malloc(psstore_sparse_grad_len(m, 1 + DIM, 1) * sizeof(float));
    assert_true(rows != NULL && grads != NULL && packed != NULL);
    for (size_t i = 0; i < m; i++) {
        rows[i] = lo + (uint32_t)i;
        for (int k = 0; k < ROWL; k++)
            grads[i * ROWL + k] = g * (float)(1 + k);
    }
    psstore_sparse_pack(rows, m, grads, 1 + DIM, &g, 1, packed);
    assert_int_equal(harness_push_range(cl, packed, psstore_sparse_grad_len(m, 1 + DIM, 1), 0, from,
                                        to, epoch, version, 5000),
                     FR_OK);
    expect_step(e, &o, rows, m, grads, g);
    free(rows);
    free(grads);
    free(packed);
}

/*
 * Eviction from the middle of the applier's table: rows 0..299 and
 * 8192..8491, each pair sharing a home slot (a probe chain of two), all
 * stepped once; then 8192..8491 keep being stepped while 0..299 go stale
 * and are evicted: removed from the table with backward shifts (each
 * chain's second row moves into its home), the last slots moved into the
 * freed ones. Afterwards every row steps from the right value: the
 * evicted ones from their initial value again, the others from theirs.
 */
static void test_eviction_keeps_the_table_whole(void **state)
{
    (void)state;
    const char *model = "sp5";
    psstore_conn_t *c;
    harness_applier_t t;
    psstore_client_t *cl = open_model(model, 1, 3000, 0, &t, &c);
    static expect_t e;
    memset(&e, 0, sizeof(e));
    uint64_t epoch = 0;
    const uint32_t r0[] = {0};
    check_pull(c, model, &e, r0, 1, 0, &epoch);
    int64_t pos = 0;
    uint64_t pushed = 0;
    psstore_applier_stats_t st;
    char out[64] = "";
    /* A gradient's version only says how stale it is: 0 will do. */
    for (int i = 0; i < 100; i++) { /* 0..299 evicted after about 3.5 s; 10 s at most */
        if (i == 0)
            push_span(cl, &e, 0, 300, 0.1f, pos, pos + 8, epoch, 0);
        push_span(cl, &e, 8192, 8492, i == 0 ? 0.1f : -0.05f, pos + 8, pos + 16, epoch, 0);
        pos += 16;
        pushed += i == 0 ? 2 : 1;
        for (int k = 0; k < 200; k++) {
            psstore_applier_stats(t.a, &st);
            if (st.applied == pushed)
                break;
            harness_sleep_ms(10);
        }
        assert_int_equal(st.applied, pushed);
        assert_int_equal(
            harness_redis_query(&redis, out, sizeof(out), "HLEN freshet:{%s}:rows", model), 0);
        if (strcmp(out, "300") == 0 && st.evicted == 300)
            break;
        harness_sleep_ms(100);
    }
    assert_string_equal(out, "300");
    for (uint32_t r = 0; r < 300; r++) /* evicted: the next step starts from the initial value */
        e.touched[r] = 0;
    push_span(cl, &e, 0, 300, 0.2f, pos, pos + 8, epoch, 0);
    push_span(cl, &e, 8192, 8492, 0.2f, pos + 8, pos + 16, epoch, 0);
    for (int k = 0; k < 500 && strcmp(out, "600") != 0; k++) {
        harness_sleep_ms(10);
        assert_int_equal(
            harness_redis_query(&redis, out, sizeof(out), "HLEN freshet:{%s}:rows", model), 0);
    }
    assert_string_equal(out, "600");
    for (int k = 0; k < 500; k++) { /* both gradients committed */
        psstore_applier_stats(t.a, &st);
        if (st.applied == pushed + 2)
            break;
        harness_sleep_ms(10);
    }
    harness_sleep_ms(100);
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out), "GET freshet:{%s}:ver", model),
                     0);
    uint32_t rows[16];
    for (uint32_t at = 0; at < 600; at += 16) {
        for (uint32_t i = 0; i < 16; i++) {
            uint32_t j = at + i < 600 ? at + i : 0;
            rows[i] = j < 300 ? j : 8192 + (j - 300);
        }
        check_pull(c, model, &e, rows, 16, strtoll(out, NULL, 10), &epoch);
    }
    harness_applier_stop(&t, &st);
    assert_int_equal(st.evicted, 300);
    psstore_client_destroy(cl);
    psstore_conn_destroy(c);
}

/* An in-process step of row `row` (gradient g in every coordinate) over
 * position pos of t/0, by a co-located worker's call. */
static void step_row(psstore_applier_t *a, uint32_t row, float g, int64_t pos)
{
    float params[ROWL], grads[ROWL], bias = 0, packed[16], gbias = 0;
    uint8_t found;
    uint64_t epoch = 0;
    int64_t version = 0;
    int complete = 0;
    assert_int_equal(
        psstore_applier_rows(a, &row, 1, params, &found, &bias, NULL, &epoch, &version, &complete),
        FR_OK);
    assert_true(complete);
    for (int i = 0; i < ROWL; i++)
        grads[i] = g;
    psstore_sparse_pack(&row, 1, grads, ROWL, &gbias, 1, packed);
    psstore_range_t range = {"t", 0, pos, pos + 1};
    psstore_grad_t msg = {.epoch = epoch,
                          .version = version,
                          .worker = "h/1/0",
                          .n = 1,
                          .loss_sum = 1,
                          .ranges = &range,
                          .nranges = 1,
                          .g = packed,
                          .len = psstore_sparse_grad_len(1, ROWL, 1)};
    assert_int_equal(psstore_applier_sparse_step(a, &msg), FR_OK);
}

typedef struct during_commit {
    psstore_applier_t *a;
    int calls;
} during_commit_t;

/* While the commit that writes row 2 waits for Redis, a worker steps it
 * again: the step goes with the next commit. Once. */
static void step_during_commit(void *arg)
{
    during_commit_t *d = arg;
    if (d->calls++ == 0)
        step_row(d->a, 2, 0.3f, 2);
}

/*
 * An eviction moves the table's last slot into the evicted row's: when
 * that last row was stepped after the commit was queued (here during its
 * EXEC), its place in the list of rows to write moves with it. Row 1 goes
 * stale, row 2 (the last slot) is stepped during a commit, the sweep
 * evicts row 1 and moves row 2 into its slot; every later step of row 2
 * must still reach the store. Before the fix the moved row stayed marked
 * written-to-be and was never written again.
 */
static void test_an_eviction_keeps_the_moved_rows_updates(void **state)
{
    (void)state;
    const char *model = "sp6";
    psstore_conn_t *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    assert_non_null(c);
    const float bias0 = 0;
    psstore_model_spec_t ms = {"sparse", "logistic", 1, 1, SPARSE_META};
    assert_int_equal(psstore_model_create(c, model, &ms, &bias0, 0), FR_OK);
    psstore_applier_conf_t conf;
    applier_conf(&conf, model, 1, 300, 0);
    conf.lease_ms = 5000;
    conf.commit_ms = 10;
    conf.audit = 0;
    conf.sparse.inproc = 1;
    psstore_applier_t *a = psstore_applier_new(&conf, errstr, sizeof(errstr));
    assert_non_null(a);
    assert_int_equal(psstore_applier_poll(a, 10), FR_OK); /* the lease, the table (empty) */
    assert_true(psstore_applier_sparse_accepting(a));
    step_row(a, 1, 0.1f, 0);
    assert_int_equal(psstore_applier_poll(a, 10), FR_OK);
    harness_sleep_ms(400);   /* row 1 goes stale */
    step_row(a, 2, 0.2f, 1); /* a new row: the last slot */
    during_commit_t d = {a, 0};
    ps_applier_commit_wait_for_test(a, step_during_commit, &d);
    char out[64] = "";
    for (int i = 0; i < 100; i++) { /* commits row 2, steps it again, evicts row 1 */
        assert_int_equal(psstore_applier_poll(a, 10), FR_OK);
        const char field1[4] = {1, 0, 0, 0}; /* row 1, 4 bytes little-endian */
        assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                             "HEXISTS freshet:{%s}:rows %b", model, field1,
                                             (size_t)4),
                         0);
        if (d.calls > 0 && strcmp(out, "0") == 0)
            break;
    }
    assert_true(d.calls > 0);
    assert_string_equal(out, "0"); /* row 1 evicted */
    ps_applier_commit_wait_for_test(a, NULL, NULL);
    step_row(a, 2, 0.4f, 3); /* after the move */
    for (int i = 0; i < 5; i++)
        assert_int_equal(psstore_applier_poll(a, 10), FR_OK);
    /* the store's row 2 is the table's, bit for bit */
    uint32_t row = 2;
    float table[ROWL], stored[ROWL], bias = 0;
    uint8_t found = 0;
    uint64_t epoch = 0;
    int64_t version = 0;
    assert_int_equal(
        psstore_applier_rows(a, &row, 1, table, &found, &bias, NULL, &epoch, &version, NULL),
        FR_OK);
    assert_true(found);
    const sparse_optim_t o = optim();
    assert_int_equal(psstore_rows_pull(c, model, &spec, &o, &row, 1, stored, &found, &bias, NULL,
                                       &epoch, &version),
                     FR_OK);
    assert_true(found);
    assert_memory_equal(stored, table, sizeof(table));
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:offsets t/0", model), 0);
    assert_int_equal(strtoll(out, NULL, 10), 4); /* every step's position written */
    psstore_applier_destroy(a);
    psstore_conn_destroy(c);
}

static int setup(void **state)
{
    (void)state;
    if (harness_tmpdir(tmp_dir, "sparse_store") != 0)
        return -1;
    return harness_redis_start(&redis, "");
}

static int teardown(void **state)
{
    (void)state;
    harness_redis_stop(&redis);
    harness_rmdir(tmp_dir);
    return 0;
}

int main(void)
{
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_are_applied_once_and_read_back_by_a_new_applier),
        cmocka_unit_test(test_a_row_is_admitted_at_its_min_count_th_gradient),
        cmocka_unit_test(test_rows_deltas_and_tombstones_are_served),
        cmocka_unit_test(test_sparse_predictions_score_the_rows_held),
        cmocka_unit_test(test_a_delta_older_than_the_window_is_refused),
        cmocka_unit_test(test_eviction_keeps_the_table_whole),
        cmocka_unit_test(test_an_eviction_keeps_the_moved_rows_updates),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
