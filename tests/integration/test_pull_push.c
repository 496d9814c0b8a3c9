/*
 * test_pull_push.c - the trainer-facing client (psstore/grads/client.c) against a
 * real redis-server started by the harness: pulls see exactly what the
 * store holds and are never torn, pushes append entries that decode back
 * exactly, backpressure waits and times out, and client_new explains a
 * missing model, a wrong size and an unreachable Redis.
 *
 * Other writers are raw hiredis connections, independent of psstore.
 */
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "psstore/grads/grads_int.h"

static harness_redis_t redis;

static int group_setup(void **state)
{
    (void)state;
    return harness_redis_start(&redis, NULL);
}

static int group_teardown(void **state)
{
    (void)state;
    harness_redis_stop(&redis);
    return 0;
}

/* A raw hiredis connection to the test's Redis (fails the test if not). */
static redisContext *raw_connect(void)
{
    struct timeval tv = {5, 0};
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", redis.port, tv);
    if (rc == NULL || rc->err)
        fail_msg("raw connect to port %d: %s", redis.port, rc ? rc->errstr : "no memory");
    return rc;
}

/* Runs a raw command that must not fail; returns the reply (caller frees). */
static redisReply *raw(redisContext *rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(rc, fmt, ap);
    va_end(ap);
    if (r == NULL || r->type == REDIS_REPLY_ERROR)
        fail_msg("raw '%s': %s", fmt, r ? r->str : rc->errstr);
    return r;
}

static long long raw_int(redisContext *rc, const char *fmt, const char *key)
{
    redisReply *r = raw(rc, fmt, key);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

/* Creates model name (layers/nparams as given) with weights w, replacing
 * any model of that name. */
static void model_make(const char *name, const char *layers, size_t nparams, const float *w)
{
    char errstr[512] = "";
    psstore_conn_t *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    if (c == NULL)
        fail_msg("psstore_conn_new: %s", errstr);
    psstore_model_spec_t spec = {.layers = layers, .loss = "softmax", .nparams = nparams};
    if (psstore_model_create(c, name, &spec, w, 1) != FR_OK)
        fail_msg("psstore_model_create: %s", psstore_conn_error(c));
    psstore_conn_destroy(c);
}

/* The epoch the store holds for model name, read independently. */
static uint64_t store_epoch(const char *name)
{
    char out[64];
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:meta epoch", name), 0);
    char *end;
    uint64_t e = strtoull(out, &end, 10);
    if (end == out || *end != '\0')
        fail_msg("meta epoch of %s is '%s'", name, out);
    return e;
}

static psstore_client_t *client_make(const char *name, size_t nparams, int64_t max_pending)
{
    char errstr[512] = "";
    psstore_client_t *cl =
        psstore_client_new(redis.url, name, nparams, max_pending, errstr, sizeof(errstr));
    if (cl == NULL)
        fail_msg("psstore_client_new: %s", errstr);
    return cl;
}

static double ms_since(uint64_t t0)
{
    return (double)(fr_clock_mono_ns() - t0) / 1e6;
}

/* "4-3" with bias: 15 parameters. */
#define SMALL_LAYERS "4-3"
#define SMALL_N      15

static void small_weights(float *w, float base)
{
    for (size_t i = 0; i < SMALL_N; i++)
        w[i] = base + (float)i * 0.5f - 3.0f;
}

/* ------------------------------------------------------------------------
 * Pull
 * ---------------------------------------------------------------------- */
static void test_pull_returns_the_created_weights_then_says_unchanged(void **state)
{
    (void)state;
    float w0[SMALL_N], w[SMALL_N];
    small_weights(w0, 0.25f);
    model_make("pull1", SMALL_LAYERS, SMALL_N, w0);
    psstore_client_t *cl = client_make("pull1", SMALL_N, 8);
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed = -1;
    memset(w, 0, sizeof(w));
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    assert_int_equal(changed, 1);
    assert_memory_equal(w, w0, sizeof(w0));
    assert_true(version == 0);
    assert_true(epoch == store_epoch("pull1"));
    assert_true(epoch != 0);
    assert_int_equal(psstore_client_bytes(cl), sizeof(w0));

    memset(w, 0, sizeof(w));
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    assert_int_equal(changed, 0);
    assert_true(version == 0);
    assert_float_equal(w[0], 0.0f, 0.0f); /* untouched */
    assert_int_equal(psstore_client_bytes(cl), sizeof(w0));
    psstore_client_destroy(cl);
}

static void test_pull_sees_an_external_update_of_version_or_epoch(void **state)
{
    (void)state;
    float w0[SMALL_N], w1[SMALL_N], w[SMALL_N];
    small_weights(w0, 0.0f);
    small_weights(w1, 100.0f);
    model_make("pull2", SMALL_LAYERS, SMALL_N, w0);
    psstore_client_t *cl = client_make("pull2", SMALL_N, 8);
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    uint64_t epoch0 = epoch;

    redisContext *rc = raw_connect();
    freeReplyObject(raw(rc, "MULTI"));
    freeReplyObject(raw(rc, "SET freshet:{pull2}:ver 7"));
    freeReplyObject(raw(rc, "SET freshet:{pull2}:w:0 %b", w1, sizeof(w1)));
    freeReplyObject(raw(rc, "EXEC"));
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    assert_int_equal(changed, 1);
    assert_true(version == 7);
    assert_true(epoch == epoch0);
    assert_memory_equal(w, w1, sizeof(w1));

    /* a new epoch at the same version is a change too */
    freeReplyObject(
        raw(rc, "HSET freshet:{pull2}:meta epoch %llu", (unsigned long long)(epoch0 ^ 0x5555)));
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    assert_int_equal(changed, 1);
    assert_true(epoch == (epoch0 ^ 0x5555));
    assert_true(version == 7);

    /* weights of another size are FR_ERR_RANGE, and nothing changes */
    freeReplyObject(raw(rc, "MULTI"));
    freeReplyObject(raw(rc, "SET freshet:{pull2}:ver 8"));
    freeReplyObject(raw(rc, "SET freshet:{pull2}:w:0 %b", w1, sizeof(w1) - 4));
    freeReplyObject(raw(rc, "EXEC"));
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_ERR_RANGE);
    assert_int_equal(changed, 0);
    assert_true(version == 7);
    assert_non_null(strstr(psstore_client_error(cl), "has 14 parameters"));

    /* a deleted model is FR_ERR_NOTFOUND */
    freeReplyObject(raw(rc, "DEL freshet:{pull2}:meta freshet:{pull2}:ver freshet:{pull2}:w:0"));
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_ERR_NOTFOUND);
    assert_non_null(strstr(psstore_client_error(cl), "model 'pull2' does not exist"));
    redisFree(rc);
    psstore_client_destroy(cl);
}

/* The torn-read check: a writer rewrites w:0 (filled with v) and ver = v
 * together, MULTI/EXEC, while the reader pulls. */
#define TORN_N      2410 /* 64-32-10 */
#define TORN_WRITES 2000

static volatile int torn_done;

static void *torn_writer(void *arg)
{
    (void)arg;
    struct timeval tv = {5, 0};
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", redis.port, tv);
    if (rc == NULL || rc->err) {
        torn_done = -1;
        return NULL;
    }
    static float w[TORN_N];
    for (int v = 1; v <= TORN_WRITES; v++) {
        for (size_t i = 0; i < TORN_N; i++)
            w[i] = (float)v;
        redisAppendCommand(rc, "MULTI");
        redisAppendCommand(rc, "SET freshet:{torn}:w:0 %b", w, sizeof(w));
        redisAppendCommand(rc, "SET freshet:{torn}:ver %d", v);
        redisAppendCommand(rc, "EXEC");
        for (int k = 0; k < 4; k++) {
            void *r = NULL;
            if (redisGetReply(rc, &r) != REDIS_OK) {
                torn_done = -1;
                redisFree(rc);
                return NULL;
            }
            freeReplyObject(r);
        }
    }
    redisFree(rc);
    __atomic_store_n(&torn_done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void test_pull_is_never_torn_by_a_concurrent_writer(void **state)
{
    (void)state;
    static float w[TORN_N];
    memset(w, 0, sizeof(w));
    model_make("torn", "64-32-10", TORN_N, w);
    psstore_client_t *cl = client_make("torn", TORN_N, 8);
    torn_done = 0;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, torn_writer, NULL), 0);
    uint64_t epoch = 0;
    int64_t version = -1, last = -1;
    long pulls = 0, changes = 0;
    for (;;) {
        int done = __atomic_load_n(&torn_done, __ATOMIC_SEQ_CST);
        int changed;
        fr_err_t err = psstore_pull(cl, w, &epoch, &version, &changed);
        if (err != FR_OK)
            fail_msg("pull %ld: %s", pulls, psstore_client_error(cl));
        pulls++;
        if (changed) {
            changes++;
            assert_true(version >= last);
            for (size_t i = 0; i < TORN_N; i++)
                if (w[i] != (float)version)
                    fail_msg("torn read: version %" PRId64 " but w[%zu] = %g", version, i,
                             (double)w[i]);
            last = version;
        }
        if (done)
            break;
    }
    pthread_join(th, NULL);
    assert_int_equal(torn_done, 1);
    assert_true(version == TORN_WRITES); /* the last pull saw the last write */
    assert_true(changes >= 2);
    print_message("torn: %ld pulls, %ld saw a new version\n", pulls, changes);
    psstore_client_destroy(cl);
}

/* ------------------------------------------------------------------------
 * Push
 * ---------------------------------------------------------------------- */

/* Reads every entry of the grads stream of model name and decodes entry
 * i into m (nparams floats); returns the number of entries. */
static size_t read_entry(redisContext *rc, const char *name, size_t i, size_t nparams,
                         ps_grad_msg_t *m)
{
    redisReply *r = raw(rc, "XRANGE freshet:{%s}:grads - +", name);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    size_t count = r->elements;
    if (i < count) {
        redisReply *kv = r->element[i]->element[1];
        size_t nf = kv->elements / 2;
        const char *f[32], *v[32];
        size_t fl[32], vl[32];
        assert_true(nf <= 32);
        for (size_t k = 0; k < nf; k++) {
            f[k] = kv->element[2 * k]->str;
            fl[k] = kv->element[2 * k]->len;
            v[k] = kv->element[2 * k + 1]->str;
            vl[k] = kv->element[2 * k + 1]->len;
        }
        char why[256];
        if (ps_grad_decode(m, nf, f, fl, v, vl, nparams, why, sizeof(why)) != FR_OK)
            fail_msg("entry %zu does not decode: %s", i, why);
        /* the payload points into the reply: keep a copy of what we check */
        static float g[SMALL_N];
        if (m->g.len > 0) {
            assert_true(m->g.len <= SMALL_N);
            memcpy(g, m->g.g, m->g.len * sizeof(float));
            m->g.g = g;
        }
    }
    freeReplyObject(r);
    return count;
}

static void test_push_appends_an_entry_that_decodes_back_exactly(void **state)
{
    (void)state;
    float w0[SMALL_N], g[SMALL_N];
    small_weights(w0, 0.0f);
    for (size_t i = 0; i < SMALL_N; i++)
        g[i] = (float)i * -0.125f + 1e-7f;
    model_make("push1", SMALL_LAYERS, SMALL_N, w0);
    psstore_client_t *cl = client_make("push1", SMALL_N, 8);
    psstore_range_t ranges[] = {{"events", 0, 10, 42}, {"events", 3, 0, 32}};
    psstore_grad_t grad = {.epoch = store_epoch("push1"),
                           .version = 0,
                           .generation = 2,
                           .worker = "testhost/4242/1",
                           .n = 64,
                           .loss_sum = 44.36141910552979,
                           .ranges = ranges,
                           .nranges = 2,
                           .g = g,
                           .len = SMALL_N};
    assert_int_equal(psstore_push(cl, &grad, 1000), FR_OK);
    assert_int_equal(psstore_client_bytes(cl), sizeof(g));

    psstore_range_t empty_range = {"events", 1, 5, 9};
    psstore_grad_t empty = {.epoch = grad.epoch,
                            .version = 0,
                            .worker = "testhost/4242/1",
                            .n = 0,
                            .reason = "decode",
                            .ranges = &empty_range,
                            .nranges = 1};
    assert_int_equal(psstore_push(cl, &empty, 1000), FR_OK);
    assert_int_equal(psstore_client_bytes(cl), sizeof(g));

    redisContext *rc = raw_connect();
    ps_grad_msg_t m = {0};
    assert_int_equal(read_entry(rc, "push1", 0, SMALL_N, &m), 2);
    assert_true(m.g.epoch == grad.epoch);
    assert_true(m.g.version == 0 && m.g.generation == 2 && m.g.n == 64);
    assert_string_equal(m.g.worker, grad.worker);
    assert_memory_equal(&m.g.loss_sum, &grad.loss_sum, sizeof(double));
    assert_null(m.g.reason);
    assert_int_equal(m.g.nranges, 2);
    for (size_t i = 0; i < 2; i++) {
        assert_string_equal(m.g.ranges[i].topic, ranges[i].topic);
        assert_int_equal(m.g.ranges[i].partition, ranges[i].partition);
        assert_true(m.g.ranges[i].from == ranges[i].from && m.g.ranges[i].to == ranges[i].to);
    }
    assert_int_equal(m.g.len, SMALL_N);
    assert_memory_equal(m.g.g, g, sizeof(g));

    assert_int_equal(read_entry(rc, "push1", 1, SMALL_N, &m), 2);
    assert_true(m.g.n == 0);
    assert_string_equal(m.g.reason, "decode");
    assert_int_equal(m.g.len, 0);
    assert_int_equal(m.g.nranges, 1);
    assert_true(m.g.ranges[0].partition == 1 && m.g.ranges[0].from == 5);

    /* a gradient of the wrong size is refused before anything is sent */
    grad.len = SMALL_N - 1;
    assert_int_equal(psstore_push(cl, &grad, 1000), FR_ERR_INVAL);
    assert_non_null(strstr(psstore_client_error(cl), "gradient of 14 floats"));
    grad.len = SMALL_N;
    grad.reason = "oops"; /* a reason with samples */
    assert_int_equal(psstore_push(cl, &grad, 1000), FR_ERR_INVAL);
    assert_int_equal(raw_int(rc, "XLEN %s", "freshet:{push1}:grads"), 2);

    ps_grad_msg_fini(&m);
    redisFree(rc);
    psstore_client_destroy(cl);
}

static psstore_grad_t small_grad(const char *name, const float *g, const psstore_range_t *r)
{
    psstore_grad_t grad = {.epoch = store_epoch(name),
                           .worker = "bp/1/0",
                           .n = 8,
                           .loss_sum = 1.0,
                           .ranges = r,
                           .nranges = 1,
                           .g = g,
                           .len = SMALL_N};
    return grad;
}

static void test_push_times_out_while_max_pending_entries_wait(void **state)
{
    (void)state;
    float w0[SMALL_N] = {0}, g[SMALL_N] = {0};
    model_make("bp1", SMALL_LAYERS, SMALL_N, w0);
    psstore_client_t *cl = client_make("bp1", SMALL_N, 3);
    redisContext *rc = raw_connect();
    for (int i = 0; i < 3; i++)
        freeReplyObject(raw(rc, "XADD freshet:{bp1}:grads * x %d", i));
    psstore_range_t r = {"t", 0, 0, 8};
    psstore_grad_t grad = small_grad("bp1", g, &r);
    uint64_t t0 = fr_clock_mono_ns();
    assert_int_equal(psstore_push(cl, &grad, 300), FR_ERR_TIMEOUT);
    double took = ms_since(t0);
    print_message("a push with timeout 300 ms gave up after %.0f ms\n", took);
    assert_true(took >= 300.0);
    /* it gives up after about its timeout (300 ms and one check, 20 ms at
     * most): 10 times that only a push that waited on regardless exceeds,
     * however slow the machine */
    assert_true(took < 3000.0);
    const char *err = psstore_client_error(cl);
    if (strstr(err, "3 gradients waiting (max_pending 3) for ") == NULL ||
        strstr(err, "is an applier running?") == NULL)
        fail_msg("error reads '%s'", err);
    assert_int_equal(raw_int(rc, "XLEN %s", "freshet:{bp1}:grads"), 3);
    assert_int_equal(psstore_client_bytes(cl), 0);
    redisFree(rc);
    psstore_client_destroy(cl);
}

/* What xdel_once_waiting did: when it deleted an entry (fr_clock_mono_ns
 * just before the XDEL; 0 if it did not), and the XLEN checks it saw. */
typedef struct xdel_run {
    atomic_int pushed; /* set by the test once its push returned */
    uint64_t deleted_at;
    long long xlen_checks;
    char error[128];
} xdel_run_t;

/* The XLEN calls Redis has answered (INFO commandstats), or -1. */
static long long xlen_calls(redisContext *rc)
{
    redisReply *r = redisCommand(rc, "INFO commandstats");
    long long n = -1;
    if (r != NULL && r->type == REDIS_REPLY_STRING) {
        const char *p = strstr(r->str, "cmdstat_xlen:calls=");
        n = p != NULL ? strtoll(p + strlen("cmdstat_xlen:calls="), NULL, 10) : 0;
    }
    freeReplyObject(r);
    return n;
}

/*
 * Waits until the push is waiting for room, that is until Redis has
 * answered two more XLEN checks of the full stream than when this thread
 * began (the push checks it every 20 ms at most while it waits), then
 * deletes the oldest entry of freshet:{bp2}:grads, as an applier would.
 */
static void *xdel_once_waiting(void *arg)
{
    xdel_run_t *run = arg;
    struct timeval tv = {5, 0};
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", redis.port, tv);
    if (rc == NULL || rc->err) {
        snprintf(run->error, sizeof(run->error), "cannot connect to redis");
        redisFree(rc);
        return NULL;
    }
    long long first = xlen_calls(rc), now = first;
    for (int i = 0; i < 2000 && now >= 0 && now < first + 2; i++) {
        harness_sleep_ms(5);
        now = xlen_calls(rc);
    }
    run->xlen_checks = now - first;
    if (now < first + 2)
        snprintf(run->error, sizeof(run->error), "the push made %lld XLEN checks in 10 s",
                 now - first);
    else if (atomic_load(&run->pushed))
        snprintf(run->error, sizeof(run->error), "the push returned with the stream full");
    redisReply *r =
        run->error[0] == '\0' ? redisCommand(rc, "XRANGE freshet:{bp2}:grads - + COUNT 1") : NULL;
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 1) {
        run->deleted_at = fr_clock_mono_ns();
        redisReply *d =
            redisCommand(rc, "XDEL freshet:{bp2}:grads %s", r->element[0]->element[0]->str);
        if (d == NULL || d->type != REDIS_REPLY_INTEGER || d->integer != 1)
            run->deleted_at = 0;
        freeReplyObject(d);
    }
    freeReplyObject(r);
    redisFree(rc);
    return NULL;
}

/*
 * A push into a stream that holds max_pending entries waits, and proceeds
 * once the applier took one: it returns after the entry was deleted, not
 * before (an ordering, not a time), and soon after. Its timeout is 30 s, so
 * that the wait is never cut short by a slow machine; it checks every 20
 * ms at most, and a push that returned 3 s after the deletion (150 checks)
 * stopped checking.
 */
static void test_push_proceeds_once_an_entry_is_applied(void **state)
{
    (void)state;
    float w0[SMALL_N] = {0}, g[SMALL_N] = {0};
    model_make("bp2", SMALL_LAYERS, SMALL_N, w0);
    psstore_client_t *cl = client_make("bp2", SMALL_N, 3);
    redisContext *rc = raw_connect();
    for (int i = 0; i < 3; i++)
        freeReplyObject(raw(rc, "XADD freshet:{bp2}:grads * x %d", i));
    static xdel_run_t run;
    memset(&run, 0, sizeof(run));
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, xdel_once_waiting, &run), 0);
    psstore_range_t r = {"t", 0, 0, 8};
    psstore_grad_t grad = small_grad("bp2", g, &r);
    fr_err_t err = psstore_push(cl, &grad, 30000);
    uint64_t done = fr_clock_mono_ns();
    atomic_store(&run.pushed, 1);
    pthread_join(th, NULL);
    if (err != FR_OK)
        fail_msg("push: %s", psstore_client_error(cl));
    if (run.error[0] != '\0' || run.deleted_at == 0)
        fail_msg("the deleting thread: %s", run.error[0] ? run.error : "no entry deleted");
    double after = (double)((int64_t)done - (int64_t)run.deleted_at) * 1e-6;
    print_message("the push waited through %lld XLEN checks and returned %.1f ms after the "
                  "deletion\n",
                  run.xlen_checks, after);
    if (done < run.deleted_at)
        fail_msg("the push returned %.1f ms before an entry was deleted", -after);
    assert_true(after < 3000.0);
    assert_int_equal(raw_int(rc, "XLEN %s", "freshet:{bp2}:grads"), 3);
    assert_int_equal(psstore_client_bytes(cl), sizeof(g));
    redisFree(rc);
    psstore_client_destroy(cl);
}

/* ------------------------------------------------------------------------
 * client_new errors
 * ---------------------------------------------------------------------- */
static void test_client_new_explains_a_missing_model(void **state)
{
    (void)state;
    char errstr[512] = "", want[128];
    assert_null(psstore_client_new(redis.url, "nosuch", 10, 8, errstr, sizeof(errstr)));
    snprintf(want, sizeof(want), "model 'nosuch' does not exist in redis 127.0.0.1:%d", redis.port);
    if (strstr(errstr, want) == NULL)
        fail_msg("errstr '%s', expected '%s'", errstr, want);
}

static void test_client_new_explains_a_wrong_size(void **state)
{
    (void)state;
    float w0[SMALL_N] = {0};
    model_make("size1", SMALL_LAYERS, SMALL_N, w0);
    char errstr[512] = "";
    assert_null(psstore_client_new(redis.url, "size1", 2 * SMALL_N, 8, errstr, sizeof(errstr)));
    if (strstr(errstr, "model 'size1' has 15 parameters in the store, this worker expects 30") ==
        NULL)
        fail_msg("errstr '%s'", errstr);
}

static void test_client_new_explains_an_unreachable_redis(void **state)
{
    (void)state;
    int held;
    int port = harness_closed_port(&held); /* no other process can listen there meanwhile */
    assert_true(port > 0);
    char url[64], errstr[512] = "", want[64];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/0", port);
    uint64_t t0 = fr_clock_mono_ns();
    assert_null(psstore_client_new(url, "any", 10, 8, errstr, sizeof(errstr)));
    assert_true(ms_since(t0) < 3000.0);
    snprintf(want, sizeof(want), "127.0.0.1:%d", port);
    if (strstr(errstr, want) == NULL)
        fail_msg("errstr '%s' does not name %s", errstr, want);
    print_message("unreachable: %s\n", errstr);
    close(held);
}

static void test_client_new_refuses_bad_arguments(void **state)
{
    (void)state;
    char errstr[512] = "";
    assert_null(psstore_client_new(redis.url, "bad{name}", 10, 8, errstr, sizeof(errstr)));
    assert_true(errstr[0] != '\0');
    errstr[0] = '\0';
    assert_null(psstore_client_new(redis.url, "ok", 0, 8, errstr, sizeof(errstr)));
    assert_true(errstr[0] != '\0');
    errstr[0] = '\0';
    assert_null(psstore_client_new(redis.url, "ok", 10, 0, errstr, sizeof(errstr)));
    assert_true(errstr[0] != '\0');
    psstore_client_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pull_returns_the_created_weights_then_says_unchanged),
        cmocka_unit_test(test_pull_sees_an_external_update_of_version_or_epoch),
        cmocka_unit_test(test_pull_is_never_torn_by_a_concurrent_writer),
        cmocka_unit_test(test_push_appends_an_entry_that_decodes_back_exactly),
        cmocka_unit_test(test_push_times_out_while_max_pending_entries_wait),
        cmocka_unit_test(test_push_proceeds_once_an_entry_is_applied),
        cmocka_unit_test(test_client_new_explains_a_missing_model),
        cmocka_unit_test(test_client_new_explains_a_wrong_size),
        cmocka_unit_test(test_client_new_explains_an_unreachable_redis),
        cmocka_unit_test(test_client_new_refuses_bad_arguments),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
