/*
 * test_rounds.c - the round modes of the applier (sync, backup, groups)
 * against a real redis-server. The test plays the workers through the
 * public client API (heartbeats into the members hash, pushes into the
 * grads stream) and drives the applier with psstore_applier_poll in this
 * thread, so every assertion is about one known round.
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

#define NPARAMS 500
#define LR      0.05

static harness_redis_t redis;
static char errstr[512];

/* Gradient number k: deterministic values in [-0.5, 0.5). */
static void gradient_k(float *g, int k)
{
    harness_gradient(g, NPARAMS, 500 + (uint64_t)k);
}

static void initial_weights(float *w)
{
    for (int i = 0; i < NPARAMS; i++)
        w[i] = 0.002f * (float)(i % 53) - 0.05f;
}

static void create_model(const char *name)
{
    float w[NPARAMS];
    initial_weights(w);
    assert_int_equal(harness_model_create(&redis, name, "499-1", "mse", w, NPARAMS), 0);
}

static psstore_client_t *client(const char *model)
{
    psstore_client_t *cl =
        psstore_client_new(redis.url, model, NPARAMS, 64, errstr, sizeof(errstr));
    if (cl == NULL)
        fail_msg("%s", errstr);
    return cl;
}

/* Heartbeats worker id of group into the members hash (beat must grow). */
static void beat(psstore_client_t *cl, const char *id, int group, uint64_t beat)
{
    psstore_member_t m = {.group = group, .beat = beat};
    snprintf(m.id, sizeof(m.id), "%s", id);
    snprintf(m.backend, sizeof(m.backend), "cpu");
    assert_int_equal(psstore_member_beat(cl, &m), FR_OK);
}

/* The store's epoch, as a worker learns it with its pull. */
static uint64_t store_epoch(psstore_client_t *cl)
{
    uint64_t epoch = 0;
    int64_t v = -1;
    float w[NPARAMS];
    int changed;
    assert_int_equal(psstore_pull(cl, w, &epoch, &v, &changed), FR_OK);
    return epoch;
}

/* Pushes gradient k of worker id, n samples at positions [from, from + n)
 * of partition 0 of topic "t", computed on version of epoch. */
static void push_epoch(psstore_client_t *cl, const char *id, int k, int64_t from, int64_t n,
                       int64_t version, uint64_t epoch)
{
    float g[NPARAMS];
    gradient_k(g, k);
    psstore_range_t range = {"t", 0, from, from + n};
    psstore_grad_t msg = {.epoch = epoch,
                          .version = version,
                          .worker = id,
                          .n = n,
                          .loss_sum = (double)n,
                          .ranges = &range,
                          .nranges = 1,
                          .g = g,
                          .len = NPARAMS};
    assert_int_equal(psstore_push(cl, &msg, 5000), FR_OK);
}

/* push_epoch on the epoch a pull reads first. */
static void push(psstore_client_t *cl, const char *id, int k, int64_t from, int64_t n,
                 int64_t version)
{
    push_epoch(cl, id, k, from, n, version, store_epoch(cl));
}

/* The applier of model in a round mode; commit_ms 0 (one commit per
 * update) unless given. */
static psstore_applier_t *applier_commit(const char *model, psstore_mode_t mode, int backups,
                                         int64_t member_timeout_ms, int64_t round_timeout_ms,
                                         int linear, int64_t commit_ms)
{
    psstore_applier_conf_t conf;
    psstore_applier_conf_init(&conf);
    conf.url = redis.url;
    conf.model = model;
    conf.ctl.lr = LR;
    conf.lease_ms = 1000;
    conf.audit = 1;
    conf.mode = mode;
    conf.backups = backups;
    conf.member_timeout_ms = member_timeout_ms;
    conf.round_timeout_ms = round_timeout_ms;
    conf.sync_lr_linear = linear;
    conf.commit_ms = commit_ms;
    psstore_applier_t *a = psstore_applier_new(&conf, errstr, sizeof(errstr));
    if (a == NULL)
        fail_msg("%s", errstr);
    return a;
}

static psstore_applier_t *applier(const char *model, psstore_mode_t mode, int backups,
                                  int64_t member_timeout_ms, int64_t round_timeout_ms, int linear)
{
    return applier_commit(model, mode, backups, member_timeout_ms, round_timeout_ms, linear, 0);
}

/* Polls the applier a few times (each blocks at most 50 ms). */
static void polls(psstore_applier_t *a, int n)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(psstore_applier_poll(a, 50), FR_OK);
}

static int64_t query_int(const char *fmt, const char *model, const char *arg)
{
    char out[256];
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out), fmt, model, arg), 0);
    return strcmp(out, "(nil)") == 0 ? -1 : strtoll(out, NULL, 10);
}

/* Polls the applier until the store's value (query_int's fmt, model and
 * arg) reaches want, up to 200 polls (10 s of nothing to read): what a
 * fixed number of polls assumed of the machine's speed. The caller then
 * asserts the exact values. */
static void polls_until(psstore_applier_t *a, const char *fmt, const char *model, const char *arg,
                        int64_t want)
{
    for (int i = 0; i < 200 && query_int(fmt, model, arg) < want; i++)
        polls(a, 1);
}

/* The model's training weights. */
static void read_weights(const char *model, float *w, int64_t *version)
{
    uint64_t epoch;
    assert_int_equal(harness_model_weights_of(&redis, model, 1, w, NPARAMS, &epoch, version), 0);
}

/* w0 - lr * scale * (sum_i n_i g_{k_i}) / (sum_i n_i), to compare with. */
static void expected_average(float *w, const int *ks, const int64_t *ns, int count, double scale)
{
    float g[NPARAMS];
    double acc[NPARAMS] = {0};
    double total = 0;
    for (int j = 0; j < count; j++) {
        gradient_k(g, ks[j]);
        for (int i = 0; i < NPARAMS; i++)
            acc[i] += (double)ns[j] * g[i];
        total += (double)ns[j];
    }
    initial_weights(w);
    for (int i = 0; i < NPARAMS; i++)
        w[i] = (float)((double)w[i] - LR * scale * (double)(float)(acc[i] / total));
}

static void assert_weights_near(const float *got, const float *want)
{
    for (int i = 0; i < NPARAMS; i++)
        if (fabsf(got[i] - want[i]) > 1e-6f + 1e-5f * fabsf(want[i]))
            fail_msg("w[%d] = %.8g, expected %.8g", i, got[i], want[i]);
}

/* The model is at version 1: one round averaged gradients k1 (n1 samples)
 * and k2 (n2), at scale 1. */
static void expect_first_round(const char *model, int k1, int64_t n1, int k2, int64_t n2)
{
    float w[NPARAMS], want[NPARAMS];
    int64_t version;
    read_weights(model, w, &version);
    assert_int_equal(version, 1);
    int ks[] = {k1, k2};
    int64_t ns[] = {n1, n2};
    expected_average(want, ks, ns, 2, 1.0);
    assert_weights_near(w, want);
}

/*
 * sync: the round at version 0 waits for both members, then applies the
 * sample-weighted average of their gradients once (one version); until
 * then nothing is marked and both entries wait in the stream.
 */
static void sync_round(int linear)
{
    const char *model = linear ? "sync-linear" : "sync";
    create_model(model);
    psstore_client_t *a1 = client(model), *a2 = client(model);
    beat(a1, "h/1/0", 0, 1);
    beat(a2, "h/1/1", 0, 1);
    psstore_applier_t *a = applier(model, PSSTORE_MODE_SYNC, 0, 10000, 60000, linear);
    polls(a, 2);
    push(a1, "h/1/0", 1, 0, 3, 0);
    polls(a, 3);
    assert_int_equal(query_int("GET freshet:{%s}:ver", model, ""), 0);
    assert_int_equal(query_int("XLEN freshet:{%s}:grads", model, ""), 1);
    assert_int_equal(query_int("HGET freshet:{%s}:offsets %s", model, "t/0"), -1);
    push(a2, "h/1/1", 2, 3, 5, 0);
    polls_until(a, "GET freshet:{%s}:ver", model, "", 1);
    float w[NPARAMS], want[NPARAMS];
    int64_t version;
    read_weights(model, w, &version);
    assert_int_equal(version, 1);
    int ks[] = {1, 2};
    int64_t ns[] = {3, 5};
    expected_average(want, ks, ns, 2, linear ? 2.0 : 1.0);
    assert_weights_near(w, want);
    assert_int_equal(query_int("HGET freshet:{%s}:rounds %s", model, "0"), 1);
    assert_int_equal(query_int("XLEN freshet:{%s}:grads", model, ""), 0);
    assert_int_equal(query_int("HGET freshet:{%s}:offsets %s", model, "t/0"), 8);
    char out[512];
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                         "XREVRANGE freshet:{%s}:versions + - COUNT 1", model),
                     0);
    assert_non_null(strstr(out, "\nk\n2"));
    assert_non_null(strstr(out, "\nn\n8\n"));
    psstore_applier_stats_t st;
    psstore_applier_stats(a, &st);
    assert_int_equal(st.rounds, 1);
    assert_int_equal(st.applied, 2);
    psstore_applier_destroy(a);
    psstore_client_destroy(a1);
    psstore_client_destroy(a2);
}

static void test_sync_applies_one_weighted_average_per_round(void **state)
{
    (void)state;
    sync_round(0);
}

static void test_sync_lr_scale_linear_moves_as_far_as_the_gradients_averaged(void **state)
{
    (void)state;
    sync_round(1);
}

/*
 * backup with 3 members and 1 backup: the round closes at the first 2
 * gradients; the third, computed on the version the round started from,
 * arrives late and is dropped with reason "backup": its positions are
 * marked (seen, dropped by a named rule) and the weights do not move.
 */
static void test_backup_closes_at_k_and_drops_the_late_one(void **state)
{
    (void)state;
    const char *model = "backup";
    create_model(model);
    psstore_client_t *c = client(model);
    beat(c, "h/2/0", 0, 1);
    beat(c, "h/2/1", 0, 1);
    beat(c, "h/2/2", 0, 1);
    psstore_applier_t *a = applier(model, PSSTORE_MODE_BACKUP, 1, 10000, 60000, 0);
    polls(a, 2);
    push(c, "h/2/0", 3, 0, 4, 0);
    push(c, "h/2/1", 4, 4, 4, 0);
    polls_until(a, "GET freshet:{%s}:ver", model, "", 1);
    float w[NPARAMS], want[NPARAMS];
    int64_t version;
    read_weights(model, w, &version);
    assert_int_equal(version, 1);
    push(c, "h/2/2", 5, 8, 4, 0);
    polls_until(a, "HGET freshet:{%s}:offsets %s", model, "t/0", 12); /* the late one's */
    float after[NPARAMS];
    read_weights(model, after, &version);
    assert_int_equal(version, 1);
    int ks[] = {3, 4};
    int64_t ns[] = {4, 4};
    expected_average(want, ks, ns, 2, 1.0);
    assert_weights_near(after, want);
    assert_int_equal(query_int("HGET freshet:{%s}:offsets %s", model, "t/0"), 12);
    int seen[32];
    assert_int_equal(harness_audit_count(&redis, model, "t", 0, "backup", seen, 32), 1);
    for (int i = 0; i < 12; i++)
        assert_int_equal(seen[i], i >= 8);
    assert_int_equal(harness_audit_count(&redis, model, "t", 0, "applied", seen, 32), 2);
    psstore_applier_stats_t st;
    psstore_applier_stats(a, &st);
    assert_int_equal(st.dropped[PSSTORE_DROPPED_BACKUP], 1);
    psstore_applier_destroy(a);
    psstore_client_destroy(c);
}

/*
 * groups: group 1's only member closes its own round at once while group
 * 0's round still waits for its second member; each group's round count
 * moves on its own.
 */
static void test_groups_close_their_rounds_independently(void **state)
{
    (void)state;
    const char *model = "groups";
    create_model(model);
    psstore_client_t *c = client(model);
    beat(c, "h/3/0", 0, 1);
    beat(c, "h/3/1", 1, 1);
    beat(c, "h/3/2", 0, 1);
    psstore_applier_t *a = applier(model, PSSTORE_MODE_GROUPS, 0, 10000, 60000, 0);
    polls(a, 2);
    push(c, "h/3/0", 6, 0, 2, 0);
    push(c, "h/3/1", 7, 2, 2, 0);
    polls_until(a, "GET freshet:{%s}:ver", model, "", 1);
    assert_int_equal(query_int("GET freshet:{%s}:ver", model, ""), 1);
    assert_int_equal(query_int("HGET freshet:{%s}:rounds %s", model, "1"), 1);
    assert_int_equal(query_int("HGET freshet:{%s}:rounds %s", model, "0"), -1);
    push(c, "h/3/2", 8, 4, 6, 1);
    polls_until(a, "GET freshet:{%s}:ver", model, "", 2);
    assert_int_equal(query_int("GET freshet:{%s}:ver", model, ""), 2);
    assert_int_equal(query_int("HGET freshet:{%s}:rounds %s", model, "0"), 1);
    assert_int_equal(query_int("HGET freshet:{%s}:offsets %s", model, "t/0"), 10);
    psstore_applier_destroy(a);
    psstore_client_destroy(c);
}

/*
 * A member that stops heartbeating in the middle of a sync round (killed)
 * holds the round no longer than member_timeout: it is removed from the
 * members hash and the round closes with the one that arrived.
 *
 * The applier times a member from the first poll that sees its beat, so
 * the close comes at least member_timeout (1.5 s) after the applier was
 * made, however slow the machine. The upper bound is 10 times that: far
 * below the round_timeout of 60 s the round would otherwise wait for, so
 * that only a member that was never dropped fails it.
 */
static void test_a_silent_member_stalls_a_round_at_most_member_timeout(void **state)
{
    (void)state;
    const char *model = "silent";
    create_model(model);
    psstore_client_t *c = client(model);
    beat(c, "h/4/0", 0, 1);
    beat(c, "h/4/1", 0, 1);
    uint64_t t0 = fr_clock_mono_ns();
    psstore_applier_t *a = applier(model, PSSTORE_MODE_SYNC, 0, 1500, 60000, 0);
    polls(a, 2);
    push(c, "h/4/0", 9, 0, 4, 0);
    uint64_t beat_no = 2;
    double closed_after = -1;
    while ((double)(fr_clock_mono_ns() - t0) * 1e-9 < 15.0) {
        polls(a, 1);
        beat(c, "h/4/0", 0, beat_no++); /* the live one keeps beating */
        if (query_int("GET freshet:{%s}:ver", model, "") == 1) {
            closed_after = (double)(fr_clock_mono_ns() - t0) * 1e-9;
            break;
        }
    }
    fr_log(FR_LOG_INFO, "round closed %.2f s after the applier started", closed_after);
    if (closed_after < 0)
        fail_msg("the round did not close within 15 s (member_timeout 1.5 s)");
    assert_true(closed_after >= 1.5); /* it did wait for the member ... */
    assert_int_equal(query_int("HEXISTS freshet:{%s}:members %s", model, "h/4/1"), 0);
    assert_int_equal(query_int("HEXISTS freshet:{%s}:members %s", model, "h/4/0"), 1);
    psstore_applier_destroy(a);
    psstore_client_destroy(c);
}

/* A live member that does not push holds a round until round_timeout. */
static void test_round_timeout_closes_with_whoever_arrived(void **state)
{
    (void)state;
    const char *model = "rtimeout";
    create_model(model);
    psstore_client_t *c = client(model);
    beat(c, "h/5/0", 0, 1);
    beat(c, "h/5/1", 0, 1);
    psstore_applier_t *a = applier(model, PSSTORE_MODE_SYNC, 0, 60000, 800, 0);
    polls(a, 2);
    push(c, "h/5/0", 10, 0, 4, 0);
    /* the round's clock starts when the applier reads its first gradient,
     * after the push returned: it may not close sooner than 0.8 s after
     * that, and closes within 10 times that (only a round that never
     * closes fails the bound) */
    uint64_t t0 = fr_clock_mono_ns();
    double closed_after = -1;
    while (closed_after < 0 && fr_clock_mono_ns() - t0 < 8000000000ull) {
        polls(a, 1);
        if (query_int("GET freshet:{%s}:ver", model, "") != 0)
            closed_after = (double)(fr_clock_mono_ns() - t0) * 1e-9;
    }
    fr_log(FR_LOG_INFO, "round closed %.2f s after the push (round_timeout 0.8 s)", closed_after);
    if (closed_after < 0)
        fail_msg("the round did not close within 8 s (round_timeout 0.8 s)");
    assert_true(closed_after >= 0.8);
    assert_int_equal(query_int("GET freshet:{%s}:ver", model, ""), 1);
    float w[NPARAMS], want[NPARAMS];
    int64_t version;
    read_weights(model, w, &version);
    int ks[] = {10};
    int64_t ns[] = {4};
    expected_average(want, ks, ns, 1, 1.0);
    assert_weights_near(w, want);
    psstore_applier_destroy(a);
    psstore_client_destroy(c);
}

/*
 * Exactly once across an applier crash: a gradient held in an open round
 * is not acknowledged, so the applier that takes over reads it again and
 * the round closes with both gradients, each position marked once.
 */
static void test_a_held_gradient_survives_an_applier_crash(void **state)
{
    (void)state;
    const char *model = "crash";
    create_model(model);
    psstore_client_t *c = client(model);
    beat(c, "h/6/0", 0, 1);
    beat(c, "h/6/1", 0, 1);
    psstore_applier_t *a = applier(model, PSSTORE_MODE_SYNC, 0, 60000, 60000, 0);
    polls(a, 2);
    push(c, "h/6/0", 11, 0, 5, 0);
    polls(a, 3);
    assert_int_equal(query_int("XLEN freshet:{%s}:grads", model, ""), 1);
    psstore_applier_destroy(a); /* a crash: the lease is left to expire */
    push(c, "h/6/1", 12, 5, 3, 0);
    psstore_applier_t *b = applier(model, PSSTORE_MODE_SYNC, 0, 60000, 60000, 0);
    uint64_t t0 = fr_clock_mono_ns();
    while (query_int("GET freshet:{%s}:ver", model, "") == 0 &&
           fr_clock_mono_ns() - t0 < 8000000000ull) {
        polls(b, 1);
        beat(c, "h/6/0", 0, 2 + (fr_clock_mono_ns() - t0) / 100000000ull);
        beat(c, "h/6/1", 0, 2 + (fr_clock_mono_ns() - t0) / 100000000ull);
    }
    expect_first_round(model, 11, 5, 12, 3);
    assert_int_equal(query_int("HGET freshet:{%s}:offsets %s", model, "t/0"), 8);
    int seen[32];
    assert_int_equal(harness_audit_count(&redis, model, "t", 0, "applied", seen, 32), 2);
    for (int i = 0; i < 8; i++)
        assert_int_equal(seen[i], 1);
    assert_int_equal(query_int("XLEN freshet:{%s}:grads", model, ""), 0);
    psstore_applier_destroy(b);
    psstore_client_destroy(c);
}

/* Rule 1 inside a round: a gradient overlapping one the round holds is a
 * duplicate and marks nothing. */
static void test_an_overlap_with_a_held_gradient_is_a_duplicate(void **state)
{
    (void)state;
    const char *model = "dup";
    create_model(model);
    psstore_client_t *c = client(model);
    beat(c, "h/7/0", 0, 1);
    beat(c, "h/7/1", 0, 1);
    psstore_applier_t *a = applier(model, PSSTORE_MODE_SYNC, 0, 60000, 60000, 0);
    polls(a, 2);
    push(c, "h/7/0", 13, 0, 10, 0);
    push(c, "h/7/0", 14, 5, 10, 0);
    psstore_applier_stats_t st;
    for (int i = 0; i < 200; i++) { /* until the applier read both */
        polls(a, 1);
        psstore_applier_stats(a, &st);
        if (st.dropped[PSSTORE_DROPPED_DUPLICATE] >= 1)
            break;
    }
    assert_int_equal(st.dropped[PSSTORE_DROPPED_DUPLICATE], 1);
    push(c, "h/7/1", 15, 10, 10, 0);
    polls_until(a, "GET freshet:{%s}:ver", model, "", 1);
    assert_int_equal(query_int("GET freshet:{%s}:ver", model, ""), 1);
    assert_int_equal(query_int("HGET freshet:{%s}:offsets %s", model, "t/0"), 20);
    float w[NPARAMS], want[NPARAMS];
    int64_t version;
    read_weights(model, w, &version);
    int ks[] = {13, 15};
    int64_t ns[] = {10, 10};
    expected_average(want, ks, ns, 2, 1.0);
    assert_weights_near(w, want);
    psstore_applier_destroy(a);
    psstore_client_destroy(c);
}

static void test_member_entries_parse_and_bad_ones_are_skipped(void **state)
{
    (void)state;
    const char *model = "members";
    create_model(model);
    psstore_client_t *c = client(model);
    psstore_member_t m = {.group = 3, .clock = 41, .idle = 1, .beat = 7};
    snprintf(m.id, sizeof(m.id), "host/9/2");
    snprintf(m.backend, sizeof(m.backend), "cuda");
    assert_int_equal(psstore_member_beat(c, &m), FR_OK);
    char out[64];
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "HSET freshet:{%s}:members bad 1x", model),
        0);
    psstore_member_t *ms = NULL;
    size_t n = 0, cap = 0;
    assert_int_equal(psstore_members_read(c, &ms, &n, &cap), FR_OK);
    assert_int_equal(n, 1);
    assert_string_equal(ms[0].id, "host/9/2");
    assert_string_equal(ms[0].backend, "cuda");
    assert_int_equal(ms[0].group, 3);
    assert_int_equal(ms[0].clock, 41);
    assert_int_equal(ms[0].idle, 1);
    assert_int_equal(ms[0].beat, 7);
    assert_int_equal(psstore_member_leave(c, "host/9/2"), FR_OK);
    assert_int_equal(psstore_members_read(c, &ms, &n, &cap), FR_OK);
    assert_int_equal(n, 0);
    int64_t round = -1;
    assert_int_equal(psstore_round_read(c, 0, &round), FR_OK);
    assert_int_equal(round, 0);
    free(ms);
    psstore_client_destroy(c);
    psstore_mode_t mode;
    assert_int_equal(psstore_mode_parse("backup", &mode), FR_OK);
    assert_int_equal(mode, PSSTORE_MODE_BACKUP);
    assert_true(psstore_mode_rounds(PSSTORE_MODE_GROUPS));
    assert_false(psstore_mode_rounds(PSSTORE_MODE_SSP));
    assert_int_equal(psstore_mode_parse("lockstep", &mode), FR_ERR_INVAL);
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

/*
 * freshet ps (gradients from the stream, group commits of commit_ms): a
 * poll that read a round's gradients reads on only for the rest of the
 * commit window, then closes the round and commits; it does not block for
 * its whole block_ms on a stream the round's workers have stopped feeding
 * (they wait for the close). That wait cost every sync round of freshet
 * train + ps the ps loop's 200 ms.
 *
 * The poll blocks for at most 4 s (the applier's connection gives a reply
 * 5 s): one that waited on the stream takes all 4. One that closes the
 * round takes the commit window and a few round trips, 20-30 ms; the bound
 * of 2 s is 70 times that, so that only the wait fails it, however loaded
 * the machine.
 */
static void test_a_poll_closes_a_round_within_the_commit_window(void **state)
{
    (void)state;
    enum { BLOCK_MS = 4000 };
    const char *model = "rcommit";
    create_model(model);
    psstore_client_t *a1 = client(model), *a2 = client(model);
    beat(a1, "h/1/0", 0, 1);
    beat(a2, "h/1/1", 0, 1);
    psstore_applier_t *a = applier_commit(model, PSSTORE_MODE_SYNC, 0, 10000, 60000, 0, 20);
    polls(a, 2);
    push(a1, "h/1/0", 1, 0, 3, 0);
    push(a2, "h/1/1", 2, 3, 5, 0);
    uint64_t t0 = fr_clock_mono_ns();
    assert_int_equal(psstore_applier_poll(a, BLOCK_MS), FR_OK);
    double secs = (double)(fr_clock_mono_ns() - t0) * 1e-9;
    expect_first_round(model, 1, 3, 2, 5);
    fprintf(stderr, "one poll (block %d ms, commit_ms 20) closed the round in %.3f s\n", BLOCK_MS,
            secs);
    if (secs >= BLOCK_MS / 2 * 1e-3)
        fail_msg("the poll took %.3f s of its %d ms block: it blocked on the stream after the "
                 "round's gradients",
                 secs, BLOCK_MS);
    psstore_applier_destroy(a);
    psstore_client_destroy(a1);
    psstore_client_destroy(a2);
}

typedef struct round_waiter {
    psstore_client_t *cl;
    int64_t round, now;
    int block_ms;
    fr_err_t err;
    uint64_t t0; /* when the wait began (fr_clock_mono_ns) */
    double secs;
} round_waiter_t;

static void *round_waiter_main(void *arg)
{
    round_waiter_t *rw = arg;
    rw->t0 = fr_clock_mono_ns();
    rw->err = psstore_round_wait(rw->cl, 0, rw->round, rw->block_ms, &rw->now);
    rw->secs = (double)(fr_clock_mono_ns() - rw->t0) * 1e-9;
    return NULL;
}

/* The integer after "name:" in the answer to an INFO command (-1 if none). */
static int64_t info_int(const char *section, const char *name)
{
    static char out[1 << 16];
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out), "INFO %s", section), 0);
    char needle[96];
    snprintf(needle, sizeof(needle), "%s:", name);
    const char *p = strstr(out, needle);
    return p != NULL ? strtoll(p + strlen(needle), NULL, 10) : -1;
}

/* The XREAD calls Redis has answered (INFO commandstats; 0 before any). */
static int64_t xread_calls(void)
{
    static char out[1 << 16];
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out), "INFO commandstats"), 0);
    const char *p = strstr(out, "cmdstat_xread:calls=");
    return p != NULL ? strtoll(p + strlen("cmdstat_xread:calls="), NULL, 10) : 0;
}

/*
 * A worker of another process waits for its round through the store
 * (psstore_round_wait): with nothing happening it blocks for its whole
 * block_ms and reads the same count (no busy answer); when the applier
 * closes the round meanwhile it returns at once with the new count; with
 * the round already closed it does not block.
 *
 * "At once" is judged by Redis, not by a clock: Redis answers an XREAD
 * blocked on a stream in the same turn of its loop as the command that adds
 * to that stream, so right after the transaction that closed the round no
 * client may still be blocked (INFO clients). A wait that the close did not
 * wake is still blocked then. That says something only while the wait's
 * block time (1 s, the most it may ask) has not run out: an attempt where
 * the close came later than that proves nothing, and is made again.
 */
static void test_round_wait_blocks_until_the_round_closes(void **state)
{
    (void)state;
    enum { TRIES = 10 };
    const char *model = "rwait";
    create_model(model);
    psstore_client_t *a1 = client(model);
    beat(a1, "h/1/0", 0, 1);
    psstore_applier_t *a = applier(model, PSSTORE_MODE_SYNC, 0, 10000, 60000, 0);
    polls(a, 2);
    round_waiter_t rw = {.cl = client(model), .round = 0, .block_ms = 400};
    round_waiter_main(&rw);
    assert_int_equal(rw.err, FR_OK);
    assert_int_equal(rw.now, 0);
    if (rw.secs < 0.35)
        fail_msg("nothing closed, yet the wait returned after %.3f s of 0.4", rw.secs);
    /* the sole member's gradient closes round r while the waiter blocks
     * (its epoch read beforehand: between the block and the check, only
     * the push, the closing poll and the reads of the count) */
    uint64_t epoch = store_epoch(a1);
    int64_t r = 0;
    for (int attempt = 1;; attempt++, r++) {
        rw.round = r;
        rw.block_ms = 1000;
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, round_waiter_main, &rw), 0);
        int64_t blocked = 0;
        for (int i = 0; i < 1000 && (blocked = info_int("clients", "blocked_clients")) < 1; i++)
            harness_sleep_ms(5);
        if (blocked != 1)
            fail_msg("the wait for round %lld never blocked in Redis (blocked_clients %lld)",
                     (long long)r, (long long)blocked);
        push_epoch(a1, "h/1/0", 1 + (int)r, 3 * r, 3, r, epoch);
        uint64_t t_push = fr_clock_mono_ns();
        for (int i = 0; i < 200 && query_int("HGET freshet:{%s}:rounds %s", model, "0") <= r; i++)
            polls(a, 1);
        int64_t after = info_int("clients", "blocked_clients");
        uint64_t t_after = fr_clock_mono_ns();
        assert_int_equal(pthread_join(t, NULL), 0);
        assert_int_equal(query_int("HGET freshet:{%s}:rounds %s", model, "0"), r + 1);
        assert_int_equal(rw.err, FR_OK);
        double span = (double)(t_after - rw.t0) * 1e-9;
        fprintf(stderr,
                "round wait %d: returned %.3f s after it began with count %lld; round closed "
                "and checked %.3f s after the push; %lld client(s) blocked then\n",
                attempt, rw.secs, (long long)rw.now, (double)(t_after - t_push) * 1e-9,
                (long long)after);
        if (span < rw.block_ms * 1e-3) { /* its block time had not run out: conclusive */
            if (after != 0)
                fail_msg("the round closed, yet the wait still blocked: the close did not wake "
                         "it (it returned after %.3f s)",
                         rw.secs);
            assert_int_equal(rw.now, r + 1);
            break;
        }
        /* its block ran out before the close, or about when it came: the
         * count it read is the old one or the new one */
        assert_true(rw.now == r || rw.now == r + 1);
        if (attempt == TRIES)
            fail_msg("in %d tries the round never closed within the wait's 1 s block (the "
                     "last %.3f s after the wait began): the machine is too slow to tell",
                     TRIES, span);
    }
    /* round r is closed: the wait reads the count and does not block (no
     * XREAD at all) */
    int64_t xreads = xread_calls();
    rw.round = r;
    round_waiter_main(&rw);
    assert_int_equal(rw.err, FR_OK);
    assert_int_equal(rw.now, r + 1);
    assert_int_equal(xread_calls(), xreads);
    psstore_applier_destroy(a);
    psstore_client_destroy(rw.cl);
    psstore_client_destroy(a1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_applies_one_weighted_average_per_round),
        cmocka_unit_test(test_sync_lr_scale_linear_moves_as_far_as_the_gradients_averaged),
        cmocka_unit_test(test_backup_closes_at_k_and_drops_the_late_one),
        cmocka_unit_test(test_groups_close_their_rounds_independently),
        cmocka_unit_test(test_a_silent_member_stalls_a_round_at_most_member_timeout),
        cmocka_unit_test(test_round_timeout_closes_with_whoever_arrived),
        cmocka_unit_test(test_a_held_gradient_survives_an_applier_crash),
        cmocka_unit_test(test_an_overlap_with_a_held_gradient_is_a_duplicate),
        cmocka_unit_test(test_member_entries_parse_and_bad_ones_are_skipped),
        cmocka_unit_test(test_round_wait_blocks_until_the_round_closes),
        cmocka_unit_test(test_a_poll_closes_a_round_within_the_commit_window),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
