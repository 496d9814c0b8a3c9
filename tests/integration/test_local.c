/*
 * test_local.c - the co-located fast path (psstore/grads/local.c) with a real
 * applier on a real redis-server: the channel opens with the lease,
 * gradients queued in memory are applied and committed to Redis exactly as
 * streamed ones would be, the stream of other processes is still read, a
 * pusher decides its own gradient when the applier is free, a
 * full channel pushes back, and a closed one refuses and loses nothing
 * that was recorded.
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

#include "harness.h"
#include "psstore/psstore.h"
#include "psstore/applier/applier_int.h" /* ps_applier_commit_wait_for_test */
#include "psstore/grads/grads_int.h"     /* ps_local_step_enter: an applier inside a step */

#define NPARAMS 300
#define LR      0.1

static harness_redis_t redis;
static char errstr[512];

static void gradient_k(float *g, int k)
{
    harness_gradient(g, NPARAMS, 900 + (uint64_t)k);
}

static void initial_weights(float *w)
{
    for (int i = 0; i < NPARAMS; i++)
        w[i] = 0.01f * (float)(i % 31);
}

static void create_model(const char *name)
{
    float w[NPARAMS];
    initial_weights(w);
    assert_int_equal(harness_model_create(&redis, name, "299-1", "mse", w, NPARAMS), 0);
}

/* An applier of model on channel l at learning rate lr, clipping at
 * clip_norm (0: off); the constant policy, no staleness bound. */
static psstore_applier_t *applier_lr(const char *model, psstore_local_t *l, double lr,
                                     double clip_norm)
{
    psstore_applier_conf_t conf;
    psstore_applier_conf_init(&conf);
    conf.url = redis.url;
    conf.model = model;
    conf.ctl.lr = lr;
    conf.ctl.policy = PSSTORE_POLICY_CONSTANT; /* the schema's defaults, which the */
    conf.ctl.max_staleness = 0;                /* tests' exact weights rely on     */
    conf.ctl.clip_norm = clip_norm;
    conf.lease_ms = 1000;
    conf.audit = 1;
    psstore_applier_t *a = psstore_applier_new(&conf, errstr, sizeof(errstr));
    if (a == NULL)
        fail_msg("%s", errstr);
    psstore_applier_set_local(a, l);
    return a;
}

static psstore_applier_t *applier_clipping(const char *model, psstore_local_t *l, double clip_norm)
{
    return applier_lr(model, l, LR, clip_norm);
}

static psstore_applier_t *applier(const char *model, psstore_local_t *l)
{
    return applier_clipping(model, l, 0);
}

/* Gradient k of n samples at [from, from + n) of t/0 on (epoch, version). */
static psstore_grad_t grad(float *g, psstore_range_t *range, int k, int64_t from, int64_t n,
                           uint64_t epoch, int64_t version)
{
    gradient_k(g, k);
    *range = (psstore_range_t){"t", 0, from, from + n};
    return (psstore_grad_t){.epoch = epoch,
                            .version = version,
                            .worker = "h/1/0",
                            .n = n,
                            .loss_sum = (double)n,
                            .ranges = range,
                            .nranges = 1,
                            .g = g,
                            .len = NPARAMS};
}

static int64_t query_int(const char *fmt, const char *model)
{
    char out[256];
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out), fmt, model), 0);
    return strcmp(out, "(nil)") == 0 ? -1 : strtoll(out, NULL, 10);
}

/* The model's training weights. */
static void store_weights(const char *model, float *w, uint64_t *epoch, int64_t *version)
{
    assert_int_equal(harness_model_weights_of(&redis, model, 1, w, NPARAMS, epoch, version), 0);
}

/* w0 - lr * sum of gradients ks (sgd, applied one after the other). */
static void expected(float *w, const int *ks, int count)
{
    float g[NPARAMS];
    initial_weights(w);
    for (int j = 0; j < count; j++) {
        gradient_k(g, ks[j]);
        for (int i = 0; i < NPARAMS; i++)
            w[i] -= (float)LR * g[i];
    }
}

static void assert_near(const float *got, const float *want)
{
    for (int i = 0; i < NPARAMS; i++)
        if (fabsf(got[i] - want[i]) > 1e-6f)
            fail_msg("w[%d] = %.8g, expected %.8g", i, got[i], want[i]);
}

/* The store holds the model at version with weights want. */
static void assert_store_at(const char *model, int64_t version, const float *want)
{
    float w[NPARAMS];
    uint64_t e;
    int64_t v;
    store_weights(model, w, &e, &v);
    assert_int_equal(v, version);
    assert_near(w, want);
}

/* A new model, a channel of `slots` slots and its applier (clipping at
 * clip_norm; 0: off), polled once so that it holds the lease and the
 * channel is open. */
static psstore_local_t *channel_open_clipping(const char *model, size_t slots, double clip_norm,
                                              psstore_applier_t **a)
{
    create_model(model);
    psstore_local_t *l = psstore_local_new(NPARAMS, slots, errstr, sizeof(errstr));
    assert_non_null(l);
    *a = applier_clipping(model, l, clip_norm);
    assert_int_equal(psstore_applier_poll(*a, 20), FR_OK);
    return l;
}

static psstore_local_t *channel_open(const char *model, size_t slots, psstore_applier_t **a)
{
    return channel_open_clipping(model, slots, 0, a);
}

static void test_gradients_in_memory_are_applied_and_committed(void **state)
{
    (void)state;
    const char *model = "local";
    create_model(model);
    psstore_local_t *l = psstore_local_new(NPARAMS, 4, errstr, sizeof(errstr));
    assert_non_null(l);
    float w[NPARAMS], g[NPARAMS], want[NPARAMS];
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed = 0;
    psstore_range_t range;
    /* closed until an applier holds the lease */
    assert_false(psstore_local_open(l));
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_ERR_STATE);
    psstore_grad_t msg = grad(g, &range, 1, 0, 4, 0, 0);
    assert_int_equal(psstore_local_push(l, &msg, 100, NULL), FR_ERR_STATE);

    psstore_applier_t *a = applier(model, l);
    assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    assert_true(psstore_local_open(l));
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_OK);
    assert_true(changed);
    assert_int_equal(version, 0);
    initial_weights(want);
    assert_near(w, want);
    uint64_t store_epoch;
    int64_t store_version;
    store_weights(model, want, &store_epoch, &store_version);
    assert_true(epoch == store_epoch);

    msg = grad(g, &range, 1, 0, 4, epoch, 0);
    uint64_t t1 = 0, t2 = 0;
    assert_int_equal(psstore_local_push(l, &msg, 100, &t1), FR_OK);
    msg = grad(g, &range, 2, 4, 4, epoch, 0);
    assert_int_equal(psstore_local_push(l, &msg, 100, &t2), FR_OK);
    assert_true(t2 == t1 + 1);
    /* the in-flight bound: a push is not done before the applier decided
     * it and published the weights holding it */
    assert_int_equal(psstore_local_wait_applied(l, t1, 30), FR_ERR_TIMEOUT);
    for (int i = 0; i < 5 && query_int("GET freshet:{%s}:ver", model) < 2; i++)
        assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    assert_int_equal(psstore_local_wait_applied(l, t2, 30), FR_OK);
    int ks[] = {1, 2};
    expected(want, ks, 2);
    store_weights(model, w, &store_epoch, &store_version);
    assert_int_equal(store_version, 2);
    assert_near(w, want);
    assert_int_equal(query_int("HGET freshet:{%s}:offsets t/0", model), 8);
    assert_int_equal(query_int("XLEN freshet:{%s}:grads", model), 0);
    /* the workers see the new weights through the channel */
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_OK);
    assert_true(changed);
    assert_int_equal(version, 2);
    assert_near(w, want);
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_OK);
    assert_false(changed);

    /* a trainer of another process still goes through the stream */
    psstore_client_t *cl = psstore_client_new(redis.url, model, NPARAMS, 8, errstr, sizeof(errstr));
    assert_non_null(cl);
    msg = grad(g, &range, 3, 8, 4, epoch, 2);
    msg.worker = "other/2/0";
    assert_int_equal(psstore_push(cl, &msg, 1000), FR_OK);
    for (int i = 0; i < 10 && query_int("GET freshet:{%s}:ver", model) < 3; i++)
        assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    assert_int_equal(query_int("GET freshet:{%s}:ver", model), 3);
    assert_int_equal(query_int("HGET freshet:{%s}:offsets t/0", model), 12);
    psstore_client_destroy(cl);

    /* the lease lost (here: the applier gone): the channel closes, a queued
     * gradient is dropped unrecorded and pushes are refused */
    msg = grad(g, &range, 4, 12, 4, epoch, 3);
    uint64_t t4 = 0;
    assert_int_equal(psstore_local_push(l, &msg, 100, &t4), FR_OK);
    psstore_applier_destroy(a);
    assert_false(psstore_local_open(l));
    /* a waiter of a lost gradient is told at once, not after its timeout */
    assert_int_equal(psstore_local_wait_applied(l, t4, 5000), FR_ERR_STATE);
    assert_int_equal(psstore_local_push(l, &msg, 100, NULL), FR_ERR_STATE);
    assert_int_equal(query_int("GET freshet:{%s}:ver", model), 3);
    assert_int_equal(query_int("HGET freshet:{%s}:offsets t/0", model), 12);
    psstore_local_destroy(l);
}

/* A swapped push hands the worker's buffer to the channel: the worker
 * gets a different buffer back, may write it at once, and what the
 * applier applies is still the gradient as pushed. */
static void test_a_swapped_push_trades_buffers_and_applies_what_was_pushed(void **state)
{
    (void)state;
    const char *model = "local-swap";
    psstore_applier_t *a = NULL;
    psstore_local_t *l = channel_open(model, 4, &a);
    float w[NPARAMS], want[NPARAMS], other[NPARAMS];
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed = 0;
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_OK);

    float *buf = malloc(NPARAMS * sizeof(float));
    assert_non_null(buf);
    psstore_range_t range;
    psstore_grad_t msg = grad(buf, &range, 1, 0, 4, epoch, 0);
    /* the gradient must be the buffer offered */
    msg.g = other;
    assert_int_equal(psstore_local_push_swap(l, &msg, &buf, 100, NULL), FR_ERR_INVAL);
    msg.g = buf;
    float *pushed = buf;
    uint64_t t1 = 0, t2 = 0;
    assert_int_equal(psstore_local_push_swap(l, &msg, &buf, 100, &t1), FR_OK);
    assert_ptr_not_equal(buf, pushed);
    /* the next gradient is written into the buffer we got back before the
     * applier ran: the queued one must not change */
    msg = grad(buf, &range, 2, 4, 4, epoch, 0);
    assert_int_equal(psstore_local_push_swap(l, &msg, &buf, 100, &t2), FR_OK);
    for (int i = 0; i < NPARAMS; i++)
        buf[i] = 1e6f; /* scribbles over the buffer returned by the second push */
    for (int i = 0; i < 5 && query_int("GET freshet:{%s}:ver", model) < 2; i++)
        assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    assert_int_equal(psstore_local_wait_applied(l, t2, 1000), FR_OK);
    int ks[] = {1, 2};
    expected(want, ks, 2);
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_OK);
    assert_int_equal(version, 2);
    assert_near(w, want);
    psstore_applier_destroy(a);
    psstore_local_destroy(l);
    free(buf);
}

/*
 * A pusher about to wait for its gradient decides it itself when the
 * applier is between steps (psstore_local_push_help): here no applier
 * thread runs at all, yet the gradient is applied and published when the
 * push returns, and the applier's next poll commits it without waiting
 * out its block. With the applier inside a step (its step lock held) the
 * gradient is left to it: not decided at the return, applied by the
 * applier's next poll, and in the same order.
 */
static void test_a_pusher_decides_its_gradient_when_the_applier_is_free(void **state)
{
    (void)state;
    const char *model = "local-help";
    float *buf = malloc(NPARAMS * sizeof(float)), w[NPARAMS], want[NPARAMS];
    assert_non_null(buf);
    psstore_applier_t *a = NULL;
    psstore_local_t *l = channel_open(model, 4, &a);
    uint64_t epoch = 0, t1 = 0, t2 = 0;
    int64_t version = -1;
    int changed = 0;
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_OK);
    psstore_range_t range;
    psstore_grad_t msg = grad(buf, &range, 1, 0, 4, epoch, 0);
    assert_int_equal(psstore_local_push_help(l, &msg, &buf, 100, &t1), FR_OK);
    /* decided before any poll: done now, in the weights a pull returns */
    assert_int_equal(psstore_local_wait_applied(l, t1, 0), FR_OK);
    int k1[] = {1};
    expected(want, k1, 1);
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_OK);
    assert_int_equal(version, 1);
    assert_near(w, want);
    assert_int_equal(query_int("GET freshet:{%s}:ver", model), 0); /* not committed yet */
    /* the poll counts it as its window's work: it commits at once instead
     * of waiting its 5 s block for a gradient of its own */
    uint64_t t0 = fr_clock_mono_ns();
    assert_int_equal(psstore_applier_poll(a, 5000), FR_OK);
    double spent = (double)(fr_clock_mono_ns() - t0) * 1e-9;
    if (spent >= 2.5)
        fail_msg("the poll took %.2f s to commit a gradient decided before it", spent);
    assert_int_equal(query_int("GET freshet:{%s}:ver", model), 1);
    assert_int_equal(query_int("HGET freshet:{%s}:offsets t/0", model), 4);

    /* the applier inside a step: the pusher leaves the gradient to it */
    ps_local_step_enter(l);
    msg = grad(buf, &range, 2, 4, 4, epoch, 1);
    assert_int_equal(psstore_local_push_help(l, &msg, &buf, 100, &t2), FR_OK);
    assert_int_equal(psstore_local_wait_applied(l, t2, 0), FR_ERR_TIMEOUT);
    ps_local_step_leave(l);
    for (int i = 0; i < 5 && query_int("GET freshet:{%s}:ver", model) < 2; i++)
        assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    assert_int_equal(psstore_local_wait_applied(l, t2, 0), FR_OK);
    int k12[] = {1, 2};
    expected(want, k12, 2);
    assert_store_at(model, 2, want);
    assert_int_equal(query_int("HGET freshet:{%s}:offsets t/0", model), 8);
    psstore_applier_destroy(a);
    psstore_local_destroy(l);
    free(buf);
}

/*
 * A pusher of a pool of several (psstore_local_push_help_away) steps in
 * only while the applier waits for Redis: with no applier thread and the
 * step lock free, its gradient is left to the applier (not decided at the
 * return); with the applier away in a round trip (ps_local_step_away) it
 * is decided when the push returns; and once the applier is back
 * (ps_local_step_back) it is left to the applier again.
 */
static void test_a_pusher_of_several_steps_in_only_while_the_applier_waits(void **state)
{
    (void)state;
    const char *model = "local-away";
    float *buf = malloc(NPARAMS * sizeof(float)), w[NPARAMS], want[NPARAMS];
    assert_non_null(buf);
    psstore_applier_t *a = NULL;
    psstore_local_t *l = channel_open(model, 4, &a);
    uint64_t epoch = 0, t1 = 0, t2 = 0, t3 = 0;
    int64_t version = -1;
    int changed = 0;
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_OK);
    psstore_range_t range;
    psstore_grad_t msg = grad(buf, &range, 1, 0, 4, epoch, 0);
    /* the applier between steps, not away: left to it */
    assert_int_equal(psstore_local_push_help_away(l, &msg, &buf, 100, &t1), FR_OK);
    assert_int_equal(psstore_local_wait_applied(l, t1, 0), FR_ERR_TIMEOUT);
    for (int i = 0; i < 5 && query_int("GET freshet:{%s}:ver", model) < 1; i++)
        assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    assert_int_equal(psstore_local_wait_applied(l, t1, 0), FR_OK);
    /* the applier away in a round trip: the pusher decides it */
    ps_local_step_enter(l);
    ps_local_step_away(l);
    msg = grad(buf, &range, 2, 4, 4, epoch, 1);
    assert_int_equal(psstore_local_push_help_away(l, &msg, &buf, 100, &t2), FR_OK);
    assert_int_equal(psstore_local_wait_applied(l, t2, 0), FR_OK);
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_OK);
    assert_int_equal(version, 2);
    /* back: left to the applier */
    ps_local_step_back(l);
    msg = grad(buf, &range, 3, 8, 4, epoch, 2);
    assert_int_equal(psstore_local_push_help_away(l, &msg, &buf, 100, &t3), FR_OK);
    assert_int_equal(psstore_local_wait_applied(l, t3, 0), FR_ERR_TIMEOUT);
    ps_local_step_leave(l);
    for (int i = 0; i < 5 && query_int("GET freshet:{%s}:ver", model) < 3; i++)
        assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    assert_int_equal(psstore_local_wait_applied(l, t3, 0), FR_OK);
    int k[] = {1, 2, 3};
    expected(want, k, 3);
    assert_store_at(model, 3, want);
    assert_int_equal(query_int("HGET freshet:{%s}:offsets t/0", model), 12);
    psstore_applier_destroy(a);
    psstore_local_destroy(l);
    free(buf);
}

/* What a pusher does while a commit waits for Redis (the commit's test hook). */
typedef struct wait_push {
    psstore_local_t *l;
    float *buf;
    uint64_t epoch, ticket;
    int calls, decided;
} wait_push_t;

static void push_during_commit(void *p)
{
    wait_push_t *wp = p;
    if (wp->calls++ > 0)
        return; /* the first commit only */
    psstore_range_t range;
    psstore_grad_t msg = grad(wp->buf, &range, 2, 4, 4, wp->epoch, 1);
    if (psstore_local_push_help(wp->l, &msg, &wp->buf, 100, &wp->ticket) == FR_OK)
        wp->decided = psstore_local_wait_applied(wp->l, wp->ticket, 0) == FR_OK;
}

/* The ids in the model's snapshot list, "1,2" style. */
static void snapshot_ids(const char *model, char *out, size_t size)
{
    assert_int_equal(
        harness_redis_query(&redis, out, size, "ZRANGE freshet:{%s}:snaps 0 -1", model), 0);
    for (char *p = out; *p != '\0'; p++)
        if (*p == '\n')
            *p = ',';
}

/*
 * The read phase's commit waits for Redis without the step lock, so a
 * pusher's step taken meanwhile is decided at once. The commit carries the
 * state as it was when queued: the gradient decided meanwhile (its weights,
 * version entry and offsets) is the next commit's, not forgotten by this
 * one, and the snapshot it took (one every version, one kept) is recorded
 * under the version it holds, so that the next one replaces it.
 */
static void test_a_pusher_steps_in_while_a_commit_waits(void **state)
{
    (void)state;
    const char *model = "local-commit-wait";
    wait_push_t wp = {.buf = malloc(NPARAMS * sizeof(float))};
    assert_non_null(wp.buf);
    create_model(model);
    wp.l = psstore_local_new(NPARAMS, 4, errstr, sizeof(errstr));
    assert_non_null(wp.l);
    psstore_applier_conf_t conf;
    psstore_applier_conf_init(&conf);
    conf.url = redis.url;
    conf.model = model;
    conf.ctl.lr = LR;
    conf.ctl.policy = PSSTORE_POLICY_CONSTANT;
    conf.ctl.max_staleness = 0;
    conf.snapshot_every = 1;
    conf.snapshot_retain = 1;
    psstore_applier_t *a = psstore_applier_new(&conf, errstr, sizeof(errstr));
    if (a == NULL)
        fail_msg("%s", errstr);
    psstore_applier_set_local(a, wp.l);
    assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    float w[NPARAMS], want[NPARAMS];
    int64_t version = -1;
    int changed = 0;
    assert_int_equal(psstore_local_pull(wp.l, w, &wp.epoch, &version, &changed), FR_OK);
    psstore_range_t range;
    psstore_grad_t msg = grad(wp.buf, &range, 1, 0, 4, wp.epoch, 0);
    uint64_t t1 = 0;
    assert_int_equal(psstore_local_push_help(wp.l, &msg, &wp.buf, 100, &t1), FR_OK);
    ps_applier_commit_wait_for_test(a, push_during_commit, &wp);
    assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    assert_int_equal(wp.calls, 1);
    assert_true(wp.decided); /* while the commit of version 1 was in flight */
    int k1[] = {1}, k12[] = {1, 2};
    expected(want, k1, 1);
    assert_store_at(model, 1, want);
    assert_int_equal(query_int("HGET freshet:{%s}:offsets t/0", model), 4);
    assert_int_equal(query_int("XLEN freshet:{%s}:versions", model), 1);
    char ids[128];
    snapshot_ids(model, ids, sizeof(ids));
    assert_string_equal(ids, "1");
    assert_int_equal(psstore_local_pull(wp.l, w, &wp.epoch, &version, &changed), FR_OK);
    assert_int_equal(version, 2);
    /* the next commit writes what the first left */
    assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    expected(want, k12, 2);
    assert_store_at(model, 2, want);
    assert_int_equal(query_int("HGET freshet:{%s}:offsets t/0", model), 8);
    assert_int_equal(query_int("XLEN freshet:{%s}:versions", model), 2);
    snapshot_ids(model, ids, sizeof(ids));
    assert_string_equal(ids, "2");
    assert_int_equal(query_int("EXISTS freshet:{%s}:snap:1", model), 0);
    assert_int_equal(query_int("EXISTS freshet:{%s}:snap:2", model), 1);
    psstore_applier_destroy(a);
    psstore_local_destroy(wp.l);
    free(wp.buf);
}

/*
 * The divergence guard tripped in a pusher's step stops the model at once
 * (the channel closes, nothing more is applied) but leaves the Redis write
 * of meta.stopped to the applier's thread, whose connection a commit may
 * be using meanwhile: written at the applier's next poll.
 */
static void test_a_stop_decided_in_a_pushers_step_is_written_by_the_applier(void **state)
{
    (void)state;
    const char *model = "local-help-stop";
    float *buf = malloc(NPARAMS * sizeof(float)), w[NPARAMS];
    assert_non_null(buf);
    psstore_applier_t *a = NULL;
    psstore_local_t *l = channel_open(model, 4, &a);
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed = 0;
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_OK);
    /* the guard stops the model at more than 5 non-finite of 100 */
    for (int k = 0; k < 6; k++) {
        psstore_range_t range;
        psstore_grad_t msg = grad(buf, &range, k, 4 * k, 4, epoch, 0);
        buf[7] = NAN;
        assert_int_equal(psstore_local_push_help(l, &msg, &buf, 100, NULL), FR_OK);
    }
    assert_false(psstore_local_open(l));
    char out[256];
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:meta stopped", model), 0);
    assert_string_equal(out, "(nil)");
    assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:meta stopped", model), 0);
    assert_non_null(strstr(out, "6 of the last 6 gradients were non-finite"));
    assert_int_equal(query_int("GET freshet:{%s}:ver", model), 0);
    psstore_applier_destroy(a);
    psstore_local_destroy(l);
    free(buf);
}

/*
 * Weights held in place (psstore_local_hold, the workers' way) never change
 * under their holder: the applier writes each version into a buffer nobody
 * holds. Two holders keep versions 0 and 1 while the applier publishes up
 * to 21; a third holds each version as it comes, and lets it go by
 * holding the next one or (every other time) by unholding it. The channel
 * then uses holders + 2 buffers, no more (the versions it showed the third
 * came from 4), and a new hold sees the newest weights.
 */
static void test_held_weights_stay_put_while_the_applier_moves_on(void **state)
{
    (void)state;
    enum { K = 21 };
    const char *model = "local-hold";
    psstore_applier_t *a = NULL;
    psstore_local_t *l = channel_open(model, 4, &a);
    const float *h1 = NULL, *h2 = NULL, *h3 = NULL, *seen[K + 1];
    uint64_t e1 = 0, e2 = 0, e3 = 0;
    int64_t v1 = -1, v2 = -1, v3 = -1;
    int changed = 0, ks[K];
    size_t nseen = 0;
    float w0[NPARAMS], w1[NPARAMS], want[NPARAMS], g[NPARAMS];
    assert_int_equal(psstore_local_hold(l, &h1, &e1, &v1, &changed), FR_OK);
    assert_true(changed);
    assert_int_equal(v1, 0);
    initial_weights(w0);
    assert_near(h1, w0);
    assert_int_equal(psstore_local_hold(l, &h1, &e1, &v1, &changed), FR_OK);
    assert_false(changed);
    for (int k = 1; k <= K; k++) {
        ks[k - 1] = k;
        psstore_range_t range;
        psstore_grad_t msg = grad(g, &range, k, 4 * (k - 1), 4, e1, k - 1);
        uint64_t t = 0;
        assert_int_equal(psstore_local_push(l, &msg, 100, &t), FR_OK);
        for (int i = 0; i < 20 && psstore_local_wait_applied(l, t, 1) != FR_OK; i++)
            assert_int_equal(psstore_applier_poll(a, 5), FR_OK);
        assert_int_equal(psstore_local_wait_applied(l, t, 1000), FR_OK);
        if (k == 1) {
            assert_int_equal(psstore_local_hold(l, &h2, &e2, &v2, &changed), FR_OK);
            assert_int_equal(v2, 1);
            expected(w1, ks, 1);
        }
        assert_int_equal(psstore_local_hold(l, &h3, &e3, &v3, &changed), FR_OK);
        assert_true(changed);
        assert_int_equal(v3, k);
        expected(want, ks, k);
        assert_near(h3, want);
        size_t j = 0;
        while (j < nseen && seen[j] != h3)
            j++;
        if (j == nseen)
            seen[nseen++] = h3;
        if (k % 2 == 0) { /* and otherwise the next hold lets it go */
            psstore_local_unhold(l, h3);
            h3 = NULL;
        }
        /* the held versions, unchanged */
        assert_near(h1, w0);
        assert_near(h2, w1);
    }
    if (nseen > 4)
        fail_msg("versions 1-%d came from %zu buffers; 2 holders need 4 at most", K, nseen);
    assert_int_equal(psstore_local_hold(l, &h1, &e1, &v1, &changed), FR_OK);
    assert_true(changed);
    assert_int_equal(v1, K);
    assert_near(h1, want);
    float copy[NPARAMS];
    uint64_t ec = 0;
    int64_t vc = -1;
    assert_int_equal(psstore_local_pull(l, copy, &ec, &vc, &changed), FR_OK);
    assert_int_equal(vc, K);
    assert_memory_equal(copy, h1, sizeof(copy));
    psstore_local_unhold(l, h1);
    psstore_local_unhold(l, h2);
    psstore_local_unhold(l, h3);
    psstore_applier_destroy(a);
    psstore_local_destroy(l);
}

/*
 * An in-process gradient carries its worker's sum of squares (sq_known),
 * and the applier decides on it without a pass of its own: with clipping
 * at half the smaller norm, gradient 1 pushed with its true sum is scaled
 * by c / |g1|; gradient 2 pushed with a sum 100 times too small is applied
 * whole, as that sum says. Without sq_known the applier would have clipped
 * it: the figures show which sum was used.
 */
static void test_an_in_process_gradient_is_decided_on_its_sum_of_squares(void **state)
{
    (void)state;
    const char *model = "local-sq";
    float g1[NPARAMS], g2[NPARAMS];
    gradient_k(g1, 1);
    gradient_k(g2, 2);
    double sq1 = psstore_sum_squares(g1, NPARAMS), sq2 = psstore_sum_squares(g2, NPARAMS);
    double c = 0.5 * sqrt(sq1 < sq2 ? sq1 : sq2);
    psstore_applier_t *a = NULL;
    psstore_local_t *l = channel_open_clipping(model, 4, c, &a);
    float w[NPARAMS], want[NPARAMS];
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed = 0;
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_OK);

    psstore_range_t r1, r2;
    psstore_grad_t m1 = grad(g1, &r1, 1, 0, 4, epoch, 0);
    m1.sq_known = 1;
    m1.sq = sq1;
    uint64_t t = 0;
    assert_int_equal(psstore_local_push(l, &m1, 100, &t), FR_OK);
    psstore_grad_t m2 = grad(g2, &r2, 2, 4, 4, epoch, 1);
    m2.sq_known = 1;
    m2.sq = sq2 / 100;
    assert_int_equal(psstore_local_push(l, &m2, 100, &t), FR_OK);
    for (int i = 0; i < 5 && query_int("GET freshet:{%s}:ver", model) < 2; i++)
        assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    assert_int_equal(psstore_local_wait_applied(l, t, 1000), FR_OK);
    initial_weights(want);
    float s1 = (float)(c / sqrt(sq1));
    gradient_k(g1, 1);
    gradient_k(g2, 2);
    for (int i = 0; i < NPARAMS; i++) {
        want[i] -= (float)LR * (g1[i] * s1);
        want[i] -= (float)LR * g2[i];
    }
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_OK);
    assert_int_equal(version, 2);
    assert_near(w, want);
    psstore_applier_destroy(a);
    psstore_local_destroy(l);
}

static void test_a_full_channel_pushes_back(void **state)
{
    (void)state;
    const char *model = "full";
    psstore_applier_t *a = NULL;
    psstore_local_t *l = channel_open(model, 2, &a);
    float w[NPARAMS], g[NPARAMS];
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_OK);
    psstore_range_t range;
    psstore_grad_t msg = grad(g, &range, 5, 0, 2, epoch, 0);
    assert_int_equal(psstore_local_push(l, &msg, 100, NULL), FR_OK);
    msg = grad(g, &range, 6, 2, 2, epoch, 0);
    assert_int_equal(psstore_local_push(l, &msg, 100, NULL), FR_OK);
    msg = grad(g, &range, 7, 4, 2, epoch, 0);
    uint64_t t0 = fr_clock_mono_ns();
    assert_int_equal(psstore_local_push(l, &msg, 150, NULL), FR_ERR_TIMEOUT);
    assert_true(fr_clock_mono_ns() - t0 >= 140000000ull);
    /* the applier frees the slots: the third goes in and all three apply */
    assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    assert_int_equal(psstore_local_push(l, &msg, 100, NULL), FR_OK);
    for (int i = 0; i < 5 && query_int("GET freshet:{%s}:ver", model) < 3; i++)
        assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    int ks[] = {5, 6, 7};
    float want[NPARAMS];
    expected(want, ks, 3);
    assert_store_at(model, 3, want);
    psstore_applier_destroy(a);
    psstore_local_destroy(l);
}

/* In a round mode the channel publishes each group's closed rounds with
 * the weights they produced, and a worker can wait on them. */
static void test_rounds_are_published_with_their_weights(void **state)
{
    (void)state;
    const char *model = "lround";
    create_model(model);
    psstore_client_t *cl = psstore_client_new(redis.url, model, NPARAMS, 8, errstr, sizeof(errstr));
    assert_non_null(cl);
    psstore_member_t m = {.beat = 1};
    snprintf(m.backend, sizeof(m.backend), "cpu");
    snprintf(m.id, sizeof(m.id), "h/1/0");
    assert_int_equal(psstore_member_beat(cl, &m), FR_OK);
    snprintf(m.id, sizeof(m.id), "h/1/1");
    assert_int_equal(psstore_member_beat(cl, &m), FR_OK);
    psstore_local_t *l = psstore_local_new(NPARAMS, 4, errstr, sizeof(errstr));
    assert_non_null(l);
    psstore_applier_conf_t conf;
    psstore_applier_conf_init(&conf);
    conf.url = redis.url;
    conf.model = model;
    conf.ctl.lr = LR;
    conf.mode = PSSTORE_MODE_SYNC;
    conf.round_timeout_ms = 60000;
    psstore_applier_t *a = psstore_applier_new(&conf, errstr, sizeof(errstr));
    assert_non_null(a);
    psstore_applier_set_local(a, l);
    assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    int64_t round = -1;
    assert_int_equal(psstore_local_round(l, 0, &round), FR_OK);
    assert_int_equal(round, 0);
    float w[NPARAMS], g[NPARAMS];
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_OK);
    psstore_range_t range;
    psstore_grad_t msg = grad(g, &range, 8, 0, 2, epoch, 0);
    assert_int_equal(psstore_local_push(l, &msg, 100, NULL), FR_OK);
    assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    assert_int_equal(psstore_local_round_wait(l, 0, 0, 100), FR_ERR_TIMEOUT);
    msg = grad(g, &range, 9, 2, 2, epoch, 0);
    msg.worker = "h/1/1";
    assert_int_equal(psstore_local_push(l, &msg, 100, NULL), FR_OK);
    assert_int_equal(psstore_applier_poll(a, 20), FR_OK);
    assert_int_equal(psstore_local_round_wait(l, 0, 0, 1000), FR_OK);
    assert_int_equal(psstore_local_round(l, 0, &round), FR_OK);
    assert_int_equal(round, 1);
    /* the weights published with the round are its average's */
    assert_int_equal(psstore_local_pull(l, w, &epoch, &version, &changed), FR_OK);
    assert_int_equal(version, 1);
    float g8[NPARAMS], g9[NPARAMS], want[NPARAMS];
    gradient_k(g8, 8);
    gradient_k(g9, 9);
    initial_weights(want);
    for (int i = 0; i < NPARAMS; i++)
        want[i] = (float)((double)want[i] -
                          LR * (double)(float)(((double)g8[i] * 2 + (double)g9[i] * 2) / 4));
    assert_near(w, want);
    assert_int_equal(query_int("HGET freshet:{%s}:rounds 0", model), 1);
    psstore_applier_destroy(a);
    assert_int_equal(psstore_local_round_wait(l, 0, 1, 100), FR_ERR_STATE);
    psstore_local_destroy(l);
    psstore_client_destroy(cl);
}

/* ---- workers and a live applier, concurrently ----------------------------- */

enum { STRESS_W = 4, STRESS_R = 300 };

typedef struct stress {
    psstore_local_t *l;
    int stop; /* set (atomically) once the workers are done */
    psstore_applier_t *a;
    fr_err_t poll_err;
} stress_t;

typedef struct stress_worker {
    stress_t *st;
    int id;
    long long sum;         /* the c of every gradient it pushed */
    const float *seen[64]; /* the distinct snapshots it held */
    size_t nseen;
    long long holds, pulls; /* pulls: the puller's copies */
    char fail[256];
} stress_worker_t;

static void *stress_applier(void *p)
{
    stress_t *st = p;
    while (!__atomic_load_n(&st->stop, __ATOMIC_ACQUIRE) && st->poll_err == FR_OK)
        st->poll_err = psstore_applier_poll(st->a, 2);
    return NULL;
}

/* Adds p to set[0..*n) unless it is there already (and cap allows). */
static void add_once(const float **set, size_t *n, size_t cap, const float *p)
{
    size_t j = 0;
    while (j < *n && set[j] != p)
        j++;
    if (j == *n && *n < cap)
        set[(*n)++] = p;
}

/* Whether every weight equals w[0] (a version is uniform: see below). */
static int uniform(const float *w)
{
    for (int i = 1; i < NPARAMS; i++)
        if (w[i] != w[0])
            return 0;
    return 1;
}

/* A worker's loop: hold, check, push c / 64 everywhere, wait for it to be
 * applied, check the held weights again. */
static void *stress_worker(void *p)
{
    stress_worker_t *sw = p;
    psstore_local_t *l = sw->st->l;
    float *buf = malloc(NPARAMS * sizeof(float)), copy[NPARAMS];
    const float *h = NULL;
    uint64_t e = 0;
    int64_t v = -1, last = -1;
    int changed = 0;
    char id[32];
    snprintf(id, sizeof(id), "h/1/%d", sw->id);
    for (int r = 0; r < STRESS_R && buf != NULL && sw->fail[0] == '\0'; r++) {
        fr_err_t err = psstore_local_hold(l, &h, &e, &v, &changed);
        if (err != FR_OK) {
            snprintf(sw->fail, sizeof(sw->fail), "hold %d: %s", r, fr_strerror(err));
            break;
        }
        sw->holds++;
        /* its previous gradient was applied before this hold: a newer version */
        if (v <= last)
            snprintf(sw->fail, sizeof(sw->fail), "hold %d: version %lld after %lld", r,
                     (long long)v, (long long)last);
        else if (!uniform(h))
            snprintf(sw->fail, sizeof(sw->fail), "hold %d: version %lld is torn", r, (long long)v);
        last = v;
        memcpy(copy, h, sizeof(copy));
        add_once(sw->seen, &sw->nseen, 64, h);
        int c = 1 + (sw->id * 5 + r) % 8;
        for (int i = 0; i < NPARAMS; i++)
            buf[i] = (float)c / 64;
        psstore_range_t range = {"t", sw->id, 4 * (int64_t)r, 4 * (int64_t)r + 4};
        psstore_grad_t g = {.epoch = e,
                            .version = v,
                            .worker = id,
                            .n = 4,
                            .loss_sum = 4,
                            .ranges = &range,
                            .nranges = 1,
                            .g = buf,
                            .len = NPARAMS};
        uint64_t t = 0;
        /* odd workers decide their own gradients when the applier is free
         * (psstore_local_push_help, freshet run's way), even ones leave
         * them to the applier's thread */
        if ((err = sw->id % 2 ? psstore_local_push_help(l, &g, &buf, 2000, &t)
                              : psstore_local_push_swap(l, &g, &buf, 2000, &t)) != FR_OK ||
            (err = psstore_local_wait_applied(l, t, 5000)) != FR_OK) {
            snprintf(sw->fail, sizeof(sw->fail), "push %d: %s", r, fr_strerror(err));
            break;
        }
        sw->sum += c;
        /* the applier moved on; what this worker holds did not */
        if (memcmp(copy, h, sizeof(copy)) != 0)
            snprintf(sw->fail, sizeof(sw->fail), "version %lld changed under its holder",
                     (long long)v);
    }
    psstore_local_unhold(l, h);
    free(buf);
    return NULL;
}

/* A reader that copies every version out (psstore_local_pull) while the
 * workers run: each copy whole, versions never going back. */
static void *stress_puller(void *p)
{
    stress_worker_t *sw = p;
    float w[NPARAMS];
    uint64_t e = 0;
    int64_t v = -1, last = -1;
    int changed = 0;
    while (!__atomic_load_n(&sw->st->stop, __ATOMIC_ACQUIRE) && sw->fail[0] == '\0') {
        if (psstore_local_pull(sw->st->l, w, &e, &v, &changed) != FR_OK || !changed)
            continue;
        sw->pulls++;
        if (v < last || !uniform(w))
            snprintf(sw->fail, sizeof(sw->fail), "copy of version %lld (after %lld): %s",
                     (long long)v, (long long)last, v < last ? "went back" : "torn");
        last = v;
    }
    return NULL;
}

/*
 * The channel as freshet run drives it, under contention: 4 worker threads
 * hold the current weights, push a gradient (trading buffers; two of them
 * deciding it themselves when the applier is free), wait for it
 * to be applied and hold again, 300 times each, while the applier polls on
 * its own thread and a fifth thread copies every version out. Weights
 * start at 0 and gradient k is c_k / 64 in every component, applied at lr
 * 1/8, so every version is uniform and exact (multiples of 1/512, far
 * inside a float's 24 bits, the same whatever the order): a snapshot
 * written while read shows as non-uniform. Each worker's holds move
 * forward (its own gradient is in the next), what it holds never changes
 * under it while the applier moves on, at most W + 2 buffers serve every
 * version, and the store ends at version 1,200 with every weight at
 * -(sum of c) / 512 exactly.
 */
static void test_workers_and_a_live_applier_share_the_channel(void **state)
{
    (void)state;
    const char *model = "local-stress";
    float w[NPARAMS] = {0};
    assert_int_equal(harness_model_create(&redis, model, "299-1", "mse", w, NPARAMS), 0);
    psstore_local_t *l = psstore_local_new(NPARAMS, 2 * STRESS_W, errstr, sizeof(errstr));
    assert_non_null(l);
    stress_t st = {.l = l, .a = applier_lr(model, l, 0.125, 0)};
    assert_int_equal(psstore_applier_poll(st.a, 20), FR_OK);
    assert_true(psstore_local_open(l));

    stress_worker_t sw[STRESS_W + 1];
    memset(sw, 0, sizeof(sw));
    pthread_t applier_thread, th[STRESS_W + 1];
    assert_int_equal(pthread_create(&applier_thread, NULL, stress_applier, &st), 0);
    for (int k = 0; k <= STRESS_W; k++) {
        sw[k].st = &st;
        sw[k].id = k;
        assert_int_equal(
            pthread_create(&th[k], NULL, k < STRESS_W ? stress_worker : stress_puller, &sw[k]), 0);
    }
    for (int k = 0; k < STRESS_W; k++)
        pthread_join(th[k], NULL);
    __atomic_store_n(&st.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th[STRESS_W], NULL);
    pthread_join(applier_thread, NULL);
    assert_int_equal(st.poll_err, FR_OK);

    long long sum = 0;
    const float *bufs[64 * STRESS_W];
    size_t nbufs = 0;
    for (int k = 0; k <= STRESS_W; k++) {
        if (sw[k].fail[0] != '\0')
            fail_msg("%s %d: %s", k < STRESS_W ? "worker" : "puller", k, sw[k].fail);
        sum += sw[k].sum;
        for (size_t i = 0; i < sw[k].nseen; i++)
            add_once(bufs, &nbufs, 64 * STRESS_W, sw[k].seen[i]);
    }
    for (int k = 0; k < STRESS_W; k++)
        assert_int_equal(sw[k].holds, STRESS_R);
    assert_true(sw[STRESS_W].pulls > 0);
    if (nbufs > STRESS_W + 2)
        fail_msg("%zu buffers served the versions; %d holders need %d at most", nbufs, STRESS_W,
                 STRESS_W + 2);
    /* committed: every gradient, in Redis */
    for (int i = 0; i < 10 && query_int("GET freshet:{%s}:ver", model) < STRESS_W * STRESS_R; i++)
        assert_int_equal(psstore_applier_poll(st.a, 20), FR_OK);
    uint64_t epoch;
    int64_t version;
    store_weights(model, w, &epoch, &version);
    assert_int_equal(version, STRESS_W * STRESS_R);
    for (int i = 0; i < NPARAMS; i++)
        if (w[i] != (float)(-sum) / 512)
            fail_msg("w[%d] = %.9g, expected %.9g", i, w[i], (double)(-sum) / 512);
    for (int k = 0; k < STRESS_W; k++) { /* and each worker's positions */
        char fmt[64];
        snprintf(fmt, sizeof(fmt), "HGET freshet:{%%s}:offsets t/%d", k);
        assert_int_equal(query_int(fmt, model), 4 * STRESS_R);
    }
    psstore_applier_destroy(st.a);
    psstore_local_destroy(l);
}

static int setup(void **state)
{
    (void)state;
    return harness_redis_start(&redis, NULL);
}

static int teardown(void **state)
{
    (void)state;
    harness_redis_stop(&redis);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradients_in_memory_are_applied_and_committed),
        cmocka_unit_test(test_a_swapped_push_trades_buffers_and_applies_what_was_pushed),
        cmocka_unit_test(test_a_pusher_decides_its_gradient_when_the_applier_is_free),
        cmocka_unit_test(test_a_pusher_of_several_steps_in_only_while_the_applier_waits),
        cmocka_unit_test(test_a_pusher_steps_in_while_a_commit_waits),
        cmocka_unit_test(test_a_stop_decided_in_a_pushers_step_is_written_by_the_applier),
        cmocka_unit_test(test_held_weights_stay_put_while_the_applier_moves_on),
        cmocka_unit_test(test_an_in_process_gradient_is_decided_on_its_sum_of_squares),
        cmocka_unit_test(test_a_full_channel_pushes_back),
        cmocka_unit_test(test_rounds_are_published_with_their_weights),
        cmocka_unit_test(test_workers_and_a_live_applier_share_the_channel),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
