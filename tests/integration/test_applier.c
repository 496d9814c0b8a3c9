/*
 * test_applier.c - the applier against a real redis-server: concurrent
 * pushers, duplicates, malformed messages, a Redis restart with AOF, a
 * killed applier and a stalled (fenced) one.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "common/common.h"
#include "harness.h"
#include "psstore/psstore.h"

#define NPARAMS 1000
#define LR      0.01

static harness_redis_t redis;
static char errstr[512];

/* ---- helpers ------------------------------------------------------------------ */

/* Gradient number k: deterministic values in [-0.5, 0.5). */
static void gradient_k(float *g, int k)
{
    harness_gradient(g, NPARAMS, 1000 + (uint64_t)k);
}

static void initial_weights(float *w)
{
    for (int i = 0; i < NPARAMS; i++)
        w[i] = 0.001f * (float)(i % 97);
}

static void create_model(const char *name)
{
    float w[NPARAMS];
    initial_weights(w);
    assert_int_equal(harness_model_create(&redis, name, "999-1", "mse", w, NPARAMS), 0);
}

/* Reads the model's training weights, epoch and version. */
static void read_model(const char *name, float *w, uint64_t *epoch, int64_t *version)
{
    assert_int_equal(harness_model_weights_of(&redis, name, 1, w, NPARAMS, epoch, version), 0);
}

static int64_t query_int(const char *fmt, ...)
{
    char out[4096];
    va_list ap;
    va_start(ap, fmt);
    char cmd[1024];
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out), cmd), 0); /* no % in keys */
    return strtoll(out, NULL, 10);
}

/* Pushes gradient k covering [from, to) of t/partition on (epoch, version). */
static void push_k(psstore_client_t *cl, int k, int32_t partition, int64_t from, int64_t to,
                   uint64_t epoch, int64_t version)
{
    float g[NPARAMS];
    gradient_k(g, k);
    assert_int_equal(harness_push_range(cl, g, NPARAMS, partition, from, to, epoch, version, 10000),
                     FR_OK);
}

/* Expected weights after applying gradients ks[0..count) with sgd, lr LR. */
static void expected_weights(float *w, const int *ks, int count)
{
    double acc[NPARAMS];
    float g[NPARAMS];
    initial_weights(w);
    for (int i = 0; i < NPARAMS; i++)
        acc[i] = w[i];
    for (int j = 0; j < count; j++) {
        gradient_k(g, ks[j]);
        for (int i = 0; i < NPARAMS; i++)
            acc[i] -= (double)(float)LR * g[i];
    }
    for (int i = 0; i < NPARAMS; i++)
        w[i] = (float)acc[i];
}

static void assert_weights_near(const float *got, const float *want, float tol)
{
    for (int i = 0; i < NPARAMS; i++) {
        if (fabsf(got[i] - want[i]) > tol)
            fail_msg("w[%d] = %.7g, expected %.7g", i, got[i], want[i]);
    }
}

typedef harness_applier_t applier_thread_t;

static fr_metrics_t *metrics; /* shared by the in-process appliers */

/* An applier of model in a thread; average >= 0 sets [controller] average. */
static void applier_start_averaging(applier_thread_t *t, const char *model, int audit,
                                    int64_t average)
{
    psstore_applier_conf_t conf;
    psstore_applier_conf_init(&conf);
    conf.url = redis.url;
    conf.model = model;
    conf.ctl.lr = LR;
    if (average >= 0)
        conf.ctl.average = average;
    conf.lease_ms = 1000;
    conf.audit = audit;
    conf.snapshot_every = 50;
    conf.snapshot_retain = 3;
    conf.metrics = metrics;
    assert_int_equal(harness_applier_start(t, &conf), 0);
}

static void applier_start(applier_thread_t *t, const char *model, int audit)
{
    applier_start_averaging(t, model, audit, -1);
}

static void applier_stop(applier_thread_t *t, psstore_applier_stats_t *stats)
{
    harness_applier_stop(t, stats);
}

/* Waits until the model's version reaches v and the grads stream is empty. */
static void wait_applied(const char *model, int64_t v, int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms; waited += 20) {
        if (query_int("GET freshet:{%s}:ver", model) >= v &&
            query_int("XLEN freshet:{%s}:grads", model) == 0)
            return;
        harness_sleep_ms(20);
    }
    fail_msg("version %lld and an empty stream not reached in %d ms (version %lld, %lld waiting)",
             (long long)v, timeout_ms, (long long)query_int("GET freshet:{%s}:ver", model),
             (long long)query_int("XLEN freshet:{%s}:grads", model));
}

static psstore_client_t *client(const char *model)
{
    psstore_client_t *cl =
        psstore_client_new(redis.url, model, NPARAMS, 100000, errstr, sizeof(errstr));
    if (cl == NULL)
        fail_msg("client: %s", errstr);
    return cl;
}

/* ---- concurrency ---------------------------------------------------------------- */

typedef struct pusher {
    pthread_t tid;
    int index;
    const char *model;
} pusher_t;

#define PUSHERS    4
#define PER_PUSHER 200

static void *pusher_main(void *arg)
{
    pusher_t *p = arg;
    psstore_client_t *cl = client(p->model);
    float w[NPARAMS];
    uint64_t epoch = 0;
    int64_t version = -1;
    for (int j = 0; j < PER_PUSHER; j++) {
        int changed;
        assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
        push_k(cl, p->index * PER_PUSHER + j, p->index, j, j + 1, epoch, version);
    }
    psstore_client_destroy(cl);
    return NULL;
}

static void test_concurrent_pushers_sum_exactly(void **state)
{
    const char *model = "concurrent";
    create_model(model);
    applier_thread_t at;
    applier_start(&at, model, 0);
    pusher_t p[PUSHERS];
    for (int i = 0; i < PUSHERS; i++) {
        p[i] = (pusher_t){.index = i, .model = model};
        assert_int_equal(pthread_create(&p[i].tid, NULL, pusher_main, &p[i]), 0);
    }
    for (int i = 0; i < PUSHERS; i++)
        pthread_join(p[i].tid, NULL);
    wait_applied(model, PUSHERS * PER_PUSHER, 60000);
    psstore_applier_stats_t st;
    applier_stop(&at, &st);
    assert_int_equal(st.applied, PUSHERS * PER_PUSHER);
    /* a cleanly stopped applier leaves no consumer behind in the group */
    char groups[512];
    harness_redis_query(&redis, groups, sizeof(groups), "XINFO GROUPS freshet:{%s}:grads", model);
    assert_non_null(strstr(groups, "consumers\n0\n"));

    int ks[PUSHERS * PER_PUSHER];
    for (int k = 0; k < PUSHERS * PER_PUSHER; k++)
        ks[k] = k;
    float want[NPARAMS], got[NPARAMS];
    uint64_t epoch;
    int64_t version;
    expected_weights(want, ks, PUSHERS * PER_PUSHER);
    read_model(model, got, &epoch, &version);
    assert_int_equal(version, PUSHERS * PER_PUSHER);
    assert_weights_near(got, want, 1e-4f);

    /* the versions stream: versions 1..800 in order, 0 <= tau <= v - 1 */
    redisContext *c = redisConnect("127.0.0.1", redis.port);
    redisReply *r = redisCommand(c, "XRANGE freshet:{%s}:versions - +", model);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, PUSHERS * PER_PUSHER);
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *kv = r->element[i]->element[1];
        long long v = -1, tau = -1;
        double lr = 0;
        for (size_t f = 0; f + 1 < kv->elements; f += 2) {
            if (strcmp(kv->element[f]->str, "version") == 0)
                v = atoll(kv->element[f + 1]->str);
            else if (strcmp(kv->element[f]->str, "tau") == 0)
                tau = atoll(kv->element[f + 1]->str);
            else if (strcmp(kv->element[f]->str, "lr_eff") == 0)
                lr = atof(kv->element[f + 1]->str);
        }
        assert_int_equal(v, (long long)i + 1);
        assert_true(tau >= 0 && tau <= v - 1);
        assert_true(fabs(lr - LR) < 1e-12);
    }
    freeReplyObject(r);
    /* the metrics say the same */
    char *text = fr_metrics_render(metrics, NULL);
    assert_non_null(strstr(text, "freshet_gradients_applied_total{model=\"concurrent\"} 800\n"));
    assert_non_null(strstr(text, "freshet_model_version{model=\"concurrent\"} 800\n"));
    assert_non_null(
        strstr(text, "freshet_gradient_staleness_versions_count{model=\"concurrent\"} 800\n"));
    assert_non_null(strstr(text, "freshet_lr_eff{model=\"concurrent\"} 0.01\n"));
    char epoch_line[128];
    snprintf(epoch_line, sizeof(epoch_line),
             "freshet_model_epoch_info{model=\"concurrent\",epoch=\"%llu\"} 1\n",
             (unsigned long long)epoch);
    assert_non_null(strstr(text, epoch_line));
    free(text);
    /* every partition's watermark is 200: all positions applied once */
    for (int i = 0; i < PUSHERS; i++) {
        r = redisCommand(c, "HGET freshet:{%s}:offsets t/%d", model, i);
        assert_int_equal(r->type, REDIS_REPLY_STRING);
        assert_string_equal(r->str, "200");
        freeReplyObject(r);
    }
    redisFree(c);
}

/* ---- duplicates and malformed messages ------------------------------------------- */

static void test_duplicates_are_dropped_whole_and_mark_nothing(void **state)
{
    const char *model = "dups";
    create_model(model);
    psstore_client_t *cl = client(model);
    float w[NPARAMS];
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    push_k(cl, 1, 0, 0, 10, epoch, 0);
    push_k(cl, 2, 0, 0, 10, epoch, 0);  /* the same positions again */
    push_k(cl, 3, 0, 5, 15, epoch, 0);  /* overlaps the applied [0, 10) */
    push_k(cl, 4, 0, 10, 20, epoch, 0); /* new positions: applied */
    /* positions 20..24 failed to decode: an n = 0 batch marks them dropped */
    psstore_range_t dropped = {"t", 0, 20, 25};
    psstore_grad_t empty = {
        .epoch = epoch, .worker = "test/1/0", .reason = "decode", .ranges = &dropped, .nranges = 1};
    assert_int_equal(psstore_push(cl, &empty, 1000), FR_OK);
    applier_thread_t at;
    applier_start(&at, model, 1);
    wait_applied(model, 2, 10000);
    harness_sleep_ms(100);
    psstore_applier_stats_t st;
    applier_stop(&at, &st);
    assert_int_equal(st.applied, 2);
    assert_int_equal(st.dropped[PSSTORE_DROPPED_DUPLICATE], 2);
    assert_int_equal(st.dropped[PSSTORE_DROPPED_EMPTY], 1);
    assert_int_equal(query_int("GET freshet:{%s}:ver", model), 2);
    char out[256];
    harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:offsets t/0", model);
    assert_string_equal(out, "25");
    int ks[] = {1, 4};
    float want[NPARAMS], got[NPARAMS];
    expected_weights(want, ks, 2);
    read_model(model, got, &epoch, &version);
    assert_weights_near(got, want, 1e-6f);
    /* audit: 2 applied entries, 2 duplicates and the dropped batch */
    assert_int_equal(query_int("XLEN freshet:{%s}:audit", model), 5);
    psstore_client_destroy(cl);
}

static void test_malformed_messages_are_counted_acknowledged_not_applied(void **state)
{
    const char *model = "malformed";
    create_model(model);
    psstore_client_t *cl = client(model);
    float w[NPARAMS];
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    redisContext *c = redisConnect("127.0.0.1", redis.port);
    char ep[32];
    snprintf(ep, sizeof(ep), "%llu", (unsigned long long)epoch);
    float g[NPARAMS] = {0};
    /* a payload one float short */
    freeReplyObject(redisCommand(c,
                                 "XADD freshet:{%s}:grads * epoch %s ver 0 gen 0 worker x n 1 "
                                 "loss 1 ranges t:0:0:1 g %b",
                                 model, ep, g, (size_t)(NPARAMS - 1) * 4));
    /* an unknown field */
    freeReplyObject(redisCommand(c,
                                 "XADD freshet:{%s}:grads * epoch %s ver 0 gen 0 worker x n 1 "
                                 "loss 1 ranges t:0:0:1 g %b color blue",
                                 model, ep, g, (size_t)NPARAMS * 4));
    /* a NaN in the gradient */
    g[7] = NAN;
    freeReplyObject(redisCommand(c,
                                 "XADD freshet:{%s}:grads * epoch %s ver 0 gen 0 worker x n 1 "
                                 "loss 1 ranges t:0:0:1 g %b",
                                 model, ep, g, (size_t)NPARAMS * 4));
    redisFree(c);
    push_k(cl, 5, 0, 1, 2, epoch, 0); /* and a good one after them */
    applier_thread_t at;
    applier_start(&at, model, 0);
    wait_applied(model, 1, 10000);
    psstore_applier_stats_t st;
    applier_stop(&at, &st);
    assert_int_equal(st.dropped[PSSTORE_DROPPED_MALFORMED], 2);
    assert_int_equal(st.dropped[PSSTORE_DROPPED_NONFINITE], 1);
    assert_int_equal(st.applied, 1);
    assert_int_equal(query_int("XLEN freshet:{%s}:grads", model), 0);
    assert_int_equal(query_int("XPENDING freshet:{%s}:grads appliers", model), 0);
    int ks[] = {5};
    float want[NPARAMS], got[NPARAMS];
    expected_weights(want, ks, 1);
    read_model(model, got, &epoch, &version);
    assert_int_equal(version, 1);
    assert_weights_near(got, want, 1e-6f);
    /* the NaN gradient's position 0 was dropped by a named rule: marked */
    char out[64];
    harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:offsets t/0", model);
    assert_string_equal(out, "2");
    psstore_client_destroy(cl);
}

/* ---- failures ------------------------------------------------------------------ */

/* Writes a config for `freshet ps` on model and returns its path. */
static const char *ps_config(const char *model, char *path, size_t size)
{
    snprintf(path, size, "%s/%s.conf", redis.dir, model);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "[model]\nname = %s\nlayers = 999-1\nloss = mse\n[redis]\nurl = %s\n"
            "[controller]\nlr = %g\n[psstore]\nlease_ms = 1000\naudit = true\n"
            "snapshot_every = 0\n",
            model, redis.url, LR);
    fclose(f);
    return path;
}

static pid_t spawn_ps(const char *conf, const char *log)
{
    char *argv[] = {FRESHET_BIN, "ps", "--config", (char *)conf, NULL};
    pid_t pid = harness_spawn(argv, log);
    assert_true(pid > 0);
    return pid;
}

/* Audit entries with outcome "applied" per position of t/0: each exactly once. */
static void assert_audit_applied_once(const char *model, int positions)
{
    int *seen = calloc((size_t)positions, sizeof(int));
    assert_non_null(seen);
    assert_true(harness_audit_count(&redis, model, NULL, 0, "applied", seen, positions) >= 0);
    for (int p = 0; p < positions; p++) {
        if (seen[p] != 1)
            fail_msg("position %d applied %d times", p, seen[p]);
    }
    free(seen);
}

static void test_killed_applier_is_replaced_and_applies_everything_once(void **state)
{
    const char *model = "crash";
    char conf[300], log1[300], log2[300];
    create_model(model);
    ps_config(model, conf, sizeof(conf));
    snprintf(log1, sizeof(log1), "%s/crash-ps1.log", redis.dir);
    snprintf(log2, sizeof(log2), "%s/crash-ps2.log", redis.dir);
    pid_t ps1 = spawn_ps(conf, log1);
    psstore_client_t *cl = client(model);
    float w[NPARAMS];
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    const int total = 300;
    int ks[300];
    for (int k = 0; k < total; k++) {
        push_k(cl, k, 0, k, k + 1, epoch, version);
        ks[k] = k;
        if (k == 150) {
            /* kill it mid-stream, whatever it holds uncommitted */
            for (int waited = 0; query_int("GET freshet:{%s}:ver", model) < 50; waited += 5) {
                if (waited > 20000)
                    fail_msg("the first applier applied nothing in 20 s; see %s", log1);
                harness_sleep_ms(5);
            }
            kill(ps1, SIGKILL);
            harness_wait(ps1, 5000);
        }
    }
    pid_t ps2 = spawn_ps(conf, log2);
    wait_applied(model, total, 30000);
    kill(ps2, SIGTERM);
    assert_true(harness_wait(ps2, 10000) == 0);
    float want[NPARAMS], got[NPARAMS];
    expected_weights(want, ks, total);
    read_model(model, got, &epoch, &version);
    assert_int_equal(version, total);
    assert_weights_near(got, want, 1e-4f);
    assert_audit_applied_once(model, total);
    assert_true(harness_file_contains(log2, "holding the lease"));
    psstore_client_destroy(cl);
}

/* This process's lease scope as docs/design.md "One writer and fencing"
 * states it: the boot id's 32 hex digits, '.', the pid namespace's inode
 * (read here independently of the applier). */
static void lease_scope(char *out, size_t size)
{
    char boot[64] = "", ns[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    assert_non_null(f);
    assert_non_null(fgets(boot, sizeof(boot), f));
    fclose(f);
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
    assert_true(n > 0);
    ns[n] = '\0';
    unsigned long long ino = 0;
    assert_int_equal(sscanf(ns, "pid:[%llu]", &ino), 1);
    char hex[40];
    size_t n_hex = 0;
    for (const char *r = boot; *r != '\0' && *r != '\n' && n_hex + 1 < sizeof(hex); r++)
        if (*r != '-')
            hex[n_hex++] = *r;
    hex[n_hex] = '\0';
    assert_int_equal(n_hex, 32);
    snprintf(out, size, "%s.%llu", hex, ino);
}

/* Whether a standby applier of model takes a lease held (60 s left) by
 * holder, polling for up to 1 s. */
static int takes_lease_of(const char *model, const char *holder)
{
    char cmd[512], out[256], mine[64];
    snprintf(cmd, sizeof(cmd), "SET freshet:{%s}:lease %s PX 60000", model, holder);
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out), cmd), 0);
    psstore_applier_conf_t conf;
    psstore_applier_conf_init(&conf);
    conf.url = redis.url;
    conf.model = model;
    conf.lease_ms = 60000;
    psstore_applier_t *a = psstore_applier_new(&conf, errstr, sizeof(errstr));
    assert_non_null(a);
    char host[64] = "host";
    gethostname(host, sizeof(host) - 1);
    snprintf(mine, sizeof(mine), "%.60s/%d/", host, (int)getpid());
    int taken = 0;
    for (int i = 0; i < 20 && !taken; i++) {
        assert_int_equal(psstore_applier_poll(a, 50), FR_OK);
        snprintf(cmd, sizeof(cmd), "GET freshet:{%s}:lease", model);
        assert_int_equal(harness_redis_query(&redis, out, sizeof(out), cmd), 0);
        taken = strncmp(out, mine, strlen(mine)) == 0;
    }
    psstore_applier_destroy(a); /* releases what it took */
    return taken;
}

/*
 * A restarted applier on the same machine takes a crashed holder's lease
 * at once instead of waiting out its 60 s: the holder's token names this
 * host and scope and a pid that no longer exists. A live pid, another
 * host or another scope (a container with its own pids) is waited for.
 */
static void test_a_dead_local_holders_lease_is_taken_at_once(void **state)
{
    (void)state;
    const char *model = "deadlease";
    create_model(model);
    pid_t dead = fork();
    if (dead == 0)
        _exit(0);
    assert_true(dead > 0);
    assert_int_equal(waitpid(dead, NULL, 0), dead);
    char host[64] = "host", scope[80], token[256];
    gethostname(host, sizeof(host) - 1);
    lease_scope(scope, sizeof(scope));

    snprintf(token, sizeof(token), "%.60s/%d/0123456789abcdef/%s", host, (int)getppid(), scope);
    assert_false(takes_lease_of(model, token)); /* alive */
    snprintf(token, sizeof(token), "elsewhere/%d/0123456789abcdef/%s", (int)dead, scope);
    assert_false(takes_lease_of(model, token)); /* another machine */
    snprintf(token, sizeof(token), "%.60s/%d/0123456789abcdef/%.32s.1", host, (int)dead, scope);
    assert_false(takes_lease_of(model, token)); /* another pid namespace */
    snprintf(token, sizeof(token), "%.60s/%d/0123456789abcdef", host, (int)dead);
    assert_false(takes_lease_of(model, token)); /* an older token: no scope */
    snprintf(token, sizeof(token), "%.60s/%d/0123456789abcdef/%s", host, (int)dead, scope);
    assert_true(takes_lease_of(model, token)); /* dead, here: taken */
}

static void test_stalled_applier_is_fenced_and_changes_nothing(void **state)
{
    const char *model = "fence";
    char conf[300], log1[300], log2[300];
    create_model(model);
    ps_config(model, conf, sizeof(conf));
    snprintf(log1, sizeof(log1), "%s/fence-ps1.log", redis.dir);
    snprintf(log2, sizeof(log2), "%s/fence-ps2.log", redis.dir);
    pid_t ps1 = spawn_ps(conf, log1);
    while (!harness_file_contains(log1, "holding the lease"))
        harness_sleep_ms(10);
    pid_t ps2 = spawn_ps(conf, log2); /* the standby */
    psstore_client_t *cl = client(model);
    float w[NPARAMS];
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    int ks[200];
    for (int k = 0; k < 100; k++) {
        push_k(cl, k, 0, k, k + 1, epoch, version);
        ks[k] = k;
    }
    wait_applied(model, 100, 10000);
    kill(ps1, SIGSTOP); /* stalled past its 1 s lease */
    harness_sleep_ms(2500);
    for (int k = 100; k < 200; k++) {
        push_k(cl, k, 0, k, k + 1, epoch, version);
        ks[k] = k;
    }
    wait_applied(model, 200, 10000);
    assert_true(harness_file_contains(log2, "holding the lease"));
    kill(ps1, SIGCONT); /* wakes up believing it holds the lease */
    harness_sleep_ms(1500);
    assert_true(harness_file_contains(log1, "lease lost"));
    float want[NPARAMS], got[NPARAMS];
    expected_weights(want, ks, 200);
    read_model(model, got, &epoch, &version);
    assert_int_equal(version, 200);
    assert_weights_near(got, want, 1e-4f);
    assert_audit_applied_once(model, 200);
    kill(ps1, SIGTERM);
    kill(ps2, SIGTERM);
    assert_true(harness_wait(ps1, 10000) == 0);
    assert_true(harness_wait(ps2, 10000) == 0);
    psstore_client_destroy(cl);
}

/*
 * Waits until redis-server has written to its AOF every command it has
 * answered (INFO persistence: aof_buffer_length 0), so that a SIGKILL
 * loses none of them: what is written is in the kernel's page cache, which
 * outlives the process. With appendfsync everysec, Redis writes the buffer
 * before it replies, except while a background fsync is still running
 * (a busy disk): then it holds the write back for up to 2 s, replies
 * anyway, and a fixed wait of 1.2 s was not enough.
 */
static void await_aof_written(void)
{
    char out[8192];
    for (int waited = 0; waited < 20000; waited += 10) {
        assert_int_equal(harness_redis_query(&redis, out, sizeof(out), "INFO persistence"), 0);
        const char *p = strstr(out, "aof_buffer_length:");
        if (p == NULL)
            fail_msg("INFO persistence has no aof_buffer_length (is the AOF on?)");
        if (strtoll(p + strlen("aof_buffer_length:"), NULL, 10) == 0)
            return;
        harness_sleep_ms(10);
    }
    fail_msg("redis-server did not write its AOF buffer in 20 s");
}

static void test_redis_restart_starts_a_new_epoch_and_drops_old_gradients(void **state)
{
    const char *model = "restart";
    create_model(model);
    psstore_client_t *cl = client(model);
    float w[NPARAMS];
    uint64_t epoch1 = 0, epoch2 = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_pull(cl, w, &epoch1, &version, &changed), FR_OK);
    applier_thread_t at;
    applier_start(&at, model, 0);
    int ks[60];
    for (int k = 0; k < 50; k++) {
        push_k(cl, k, 0, k, k + 1, epoch1, 0);
        ks[k] = k;
    }
    wait_applied(model, 50, 10000);
    applier_stop(&at, NULL);
    /* gradients of the old epoch wait in the stream across the restart */
    for (int k = 50; k < 55; k++)
        push_k(cl, 100 + k, 0, k, k + 1, epoch1, 50);
    psstore_client_destroy(cl);
    await_aof_written(); /* the old epoch's gradients survive the kill */
    harness_redis_kill(&redis, SIGKILL);
    assert_int_equal(harness_redis_restart(&redis), 0);

    applier_start(&at, model, 0);
    cl = client(model);
    float before[NPARAMS];
    expected_weights(before, ks, 50);
    for (int waited = 0; query_int("XLEN freshet:{%s}:grads", model) > 0 && waited < 10000;
         waited += 20)
        harness_sleep_ms(20);
    assert_int_equal(psstore_pull(cl, w, &epoch2, &version, &changed), FR_OK);
    assert_true(epoch2 != epoch1);
    assert_int_equal(version, 50);
    assert_weights_near(w, before, 1e-4f);
    char out[64];
    harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:offsets t/0", model);
    assert_string_equal(out, "50"); /* the old epoch's gradients marked nothing */
    /* the same positions under the new epoch are applied */
    for (int k = 50; k < 55; k++) {
        push_k(cl, k, 0, k, k + 1, epoch2, 50);
        ks[k] = k;
    }
    wait_applied(model, 55, 10000);
    psstore_applier_stats_t st;
    applier_stop(&at, &st);
    assert_int_equal(st.dropped[PSSTORE_DROPPED_EPOCH], 5);
    float want[NPARAMS];
    expected_weights(want, ks, 55);
    read_model(model, w, &epoch2, &version);
    assert_weights_near(w, want, 1e-4f);
    psstore_client_destroy(cl);
}

static void test_snapshots_are_kept_and_trimmed(void **state)
{
    const char *model = "snaps";
    create_model(model);
    psstore_client_t *cl = client(model);
    applier_thread_t at;
    applier_start(&at, model, 0); /* snapshot_every 50, retain 3 */
    float w[NPARAMS];
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    for (int k = 0; k < 220; k++)
        push_k(cl, k, 0, k, k + 1, epoch, 0);
    wait_applied(model, 220, 20000);
    applier_stop(&at, NULL);
    char out[256];
    harness_redis_query(&redis, out, sizeof(out), "ZRANGE freshet:{%s}:snaps 0 -1", model);
    assert_string_equal(out, "100\n150\n200");
    assert_int_equal(query_int("EXISTS freshet:{%s}:snap:50", model), 0);
    harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:snap:200 offsets", model);
    assert_string_equal(out, "t/0=200\n");
    assert_int_equal(query_int("HSTRLEN freshet:{%s}:snap:200 weights", model), 4 * NPARAMS);
    psstore_client_destroy(cl);
}

static void test_rollback_restores_a_snapshot_under_a_new_epoch(void **state)
{
    const char *model = "rollback";
    create_model(model);
    psstore_client_t *cl = client(model);
    applier_thread_t at;
    applier_start(&at, model, 0); /* snapshot_every 50 */
    float w[NPARAMS];
    uint64_t epoch = 0, epoch2 = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    int ks[60];
    for (int k = 0; k < 120; k++) {
        push_k(cl, k, 0, k, k + 1, epoch, 0);
        if (k < 50)
            ks[k] = k;
    }
    wait_applied(model, 120, 20000);
    psstore_conn_t *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    char id[64];
    assert_int_equal(psstore_request_rollback(c, model, 50, id), FR_OK);
    assert_int_equal(psstore_request_wait(c, model, id, 10000), FR_OK);
    assert_int_equal(psstore_pull(cl, w, &epoch2, &version, &changed), FR_OK);
    assert_true(epoch2 != epoch);
    assert_int_equal(version, 121);
    float want[NPARAMS];
    expected_weights(want, ks, 50);
    assert_weights_near(w, want, 1e-4f);
    char out[64];
    harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:offsets t/0", model);
    assert_string_equal(out, "50");
    /* training continues from the snapshot's offsets under the new epoch */
    for (int k = 50; k < 60; k++) {
        push_k(cl, k, 0, k, k + 1, epoch2, 121);
        ks[k] = k;
    }
    wait_applied(model, 131, 10000);
    expected_weights(want, ks, 60);
    read_model(model, w, &epoch2, &version);
    assert_weights_near(w, want, 1e-4f);
    /* a rollback to a snapshot that is not retained changes nothing */
    assert_int_equal(psstore_request_rollback(c, model, 7, id), FR_OK);
    assert_int_equal(psstore_request_wait(c, model, id, 10000), FR_OK);
    assert_int_equal(query_int("GET freshet:{%s}:ver", model), 131);
    applier_stop(&at, NULL);
    psstore_conn_destroy(c);
    psstore_client_destroy(cl);
}

/* The served weights and the training weights of model, of one version. */
static void read_both(const char *model, float *served, float *training, int64_t *version)
{
    uint64_t epoch;
    int64_t v;
    assert_int_equal(harness_model_weights(&redis, model, served, NPARAMS, &epoch, version), 0);
    assert_int_equal(harness_model_weights_of(&redis, model, 1, training, NPARAMS, &epoch, &v), 0);
    assert_int_equal(v, *version);
}

/* The average's rule in double: avg += a (w - avg), a = 1 - exp(-n / h),
 * h = min(horizon, seen / 10) (docs/design.md "The served average"). */
static void average_by_hand(double *avg, const double *w, double horizon, double seen, double n)
{
    double h = fmin(horizon, seen / 10);
    double a = h > 0 ? 1 - exp(-n / h) : 1;
    for (int i = 0; i < NPARAMS; i++)
        avg[i] += a * (w[i] - avg[i]);
}

static void assert_near_double(const float *got, const double *want, float tol)
{
    for (int i = 0; i < NPARAMS; i++) {
        if (fabs((double)got[i] - want[i]) > tol)
            fail_msg("w[%d] = %.7g, expected %.7g", i, got[i], want[i]);
    }
}

/*
 * The served average against a hand computation: 60 updates of 1-3 samples
 * (horizon 3 samples, so the first 30 average the last tenth and the rest
 * the horizon), then a new applier that continues from the stored average,
 * a snapshot and a rollback that serve theirs, and an applier with
 * average = 0 that makes the readers serve the training weights again.
 */
static void test_the_served_average_follows_every_update(void **state)
{
    const char *model = "average";
    const double horizon = 3;
    create_model(model);
    psstore_client_t *cl = client(model);
    applier_thread_t at;
    applier_start_averaging(&at, model, 0, (int64_t)horizon);
    float w0[NPARAMS], g[NPARAMS], served[NPARAMS], training[NPARAMS];
    double w[NPARAMS], avg[NPARAMS], w50[NPARAMS], avg50[NPARAMS];
    initial_weights(w0);
    for (int i = 0; i < NPARAMS; i++)
        w[i] = avg[i] = w0[i];
    uint64_t epoch = 0;
    int64_t version = -1, pos = 0;
    double seen = 0;
    int changed;
    assert_int_equal(psstore_pull(cl, served, &epoch, &version, &changed), FR_OK);
    for (int k = 0; k < 60; k++) {
        int n = 1 + k % 3;
        push_k(cl, k, 0, pos, pos + n, epoch, k);
        pos += n;
        gradient_k(g, k);
        for (int i = 0; i < NPARAMS; i++)
            w[i] -= (double)(float)LR * g[i];
        seen += n;
        average_by_hand(avg, w, horizon, seen, n);
        if (k == 49) {
            memcpy(w50, w, sizeof(w));
            memcpy(avg50, avg, sizeof(avg));
        }
        if (k == 5) { /* 12 samples seen: h = 1.2, the last tenth */
            wait_applied(model, 6, 10000);
            read_both(model, served, training, &version);
            assert_near_double(served, avg, 1e-4f);
        }
    }
    wait_applied(model, 60, 20000);
    read_both(model, served, training, &version);
    assert_int_equal(version, 60);
    assert_near_double(training, w, 1e-4f);
    assert_near_double(served, avg, 1e-4f);
    double apart = 0;
    for (int i = 0; i < NPARAMS; i++)
        apart = fmax(apart, fabs((double)served[i] - (double)training[i]));
    assert_true(apart > 1e-3); /* they are different vectors */
    /* snapshot 50 keeps both; serve's read of it is the average */
    assert_int_equal(query_int("HSTRLEN freshet:{%s}:snap:50 avg", model), 4 * NPARAMS);
    psstore_conn_t *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    uint64_t sep;
    assert_int_equal(psstore_snapshot_weights(c, model, 50, served, NPARAMS, &sep), FR_OK);
    assert_near_double(served, avg50, 1e-4f);

    /* a new applier continues from the stored average, its horizon full */
    applier_stop(&at, NULL);
    applier_start_averaging(&at, model, 0, (int64_t)horizon);
    push_k(cl, 60, 0, pos, pos + 1, epoch, 60);
    pos++;
    gradient_k(g, 60);
    for (int i = 0; i < NPARAMS; i++)
        w[i] -= (double)(float)LR * g[i];
    average_by_hand(avg, w, horizon, 10 * horizon + 1, 1);
    wait_applied(model, 61, 10000);
    read_both(model, served, training, &version);
    assert_near_double(training, w, 1e-4f);
    assert_near_double(served, avg, 1e-4f);

    /* a rollback serves the snapshot's average and trains from its weights */
    char id[64];
    assert_int_equal(psstore_request_rollback(c, model, 50, id), FR_OK);
    assert_int_equal(psstore_request_wait(c, model, id, 10000), FR_OK);
    read_both(model, served, training, &version);
    assert_int_equal(version, 62);
    assert_near_double(training, w50, 1e-4f);
    assert_near_double(served, avg50, 1e-4f);

    /* average = 0: the next commit deletes avg:0 and the training weights are served */
    applier_stop(&at, NULL);
    applier_start_averaging(&at, model, 0, 0);
    uint64_t epoch2;
    assert_int_equal(psstore_pull(cl, served, &epoch2, &version, &changed), FR_OK);
    push_k(cl, 61, 0, pos, pos + 1, epoch2, 62);
    wait_applied(model, 63, 10000);
    assert_int_equal(query_int("EXISTS freshet:{%s}:avg:0", model), 0);
    read_both(model, served, training, &version);
    assert_memory_equal(served, training, sizeof(served));
    applier_stop(&at, NULL);
    psstore_conn_destroy(c);
    psstore_client_destroy(cl);
}

/* With no applier running, the CLI path executes a request with an applier
 * that handles requests only: waiting gradients stay where they are. */
static void test_requests_only_applier_executes_requests_and_leaves_gradients(void **state)
{
    const char *model = "reqonly";
    create_model(model);
    psstore_client_t *cl = client(model);
    float w[NPARAMS];
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    push_k(cl, 1, 0, 0, 1, epoch, 0);
    psstore_conn_t *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    char id[64];
    int held = 1;
    assert_int_equal(psstore_lease_held(c, model, &held), FR_OK);
    assert_int_equal(held, 0);
    psstore_applier_conf_t conf;
    psstore_applier_conf_init(&conf);
    conf.url = redis.url;
    conf.model = model;
    conf.requests_only = 1;
    psstore_applier_t *a = psstore_applier_new(&conf, errstr, sizeof(errstr));
    assert_non_null(a);
    /* a request is executed; the waiting gradient is left alone */
    assert_int_equal(psstore_request_rollback(c, model, 3, id), FR_OK);
    assert_int_equal(psstore_applier_poll(a, 10), FR_OK);
    assert_int_equal(psstore_request_wait(c, model, id, 1000), FR_OK);
    assert_int_equal(query_int("XLEN freshet:{%s}:grads", model), 1);
    assert_int_equal(query_int("GET freshet:{%s}:ver", model), 0);
    /* a deletion removes every key */
    assert_int_equal(psstore_request_delete(c, model, id), FR_OK);
    assert_int_equal(psstore_applier_poll(a, 10), FR_OK);
    psstore_applier_destroy(a);
    assert_int_equal(psstore_request_wait(c, model, id, 1000), FR_OK);
    assert_int_equal(query_int("EXISTS freshet:{%s}:meta", model), 0);
    assert_int_equal(query_int("EXISTS freshet:{%s}:grads", model), 0);
    assert_int_equal(query_int("EXISTS freshet:{%s}:lease", model), 0);
    psstore_conn_destroy(c);
    psstore_client_destroy(cl);
}

/* freshet model rollback with no applier running takes the lease itself,
 * executes the rollback and nothing else, and releases the lease. */
static void test_cli_rollback_without_applier(void **state)
{
    const char *model = "clirollback";
    create_model(model);
    psstore_client_t *cl = client(model);
    applier_thread_t at;
    applier_start(&at, model, 0); /* snapshot_every 50 */
    float w[NPARAMS];
    uint64_t epoch = 0, epoch2 = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    for (int k = 0; k < 60; k++)
        push_k(cl, k, 0, k, k + 1, epoch, 0);
    wait_applied(model, 60, 20000);
    applier_stop(&at, NULL);
    push_k(cl, 99, 0, 60, 61, epoch, 60); /* waits: no applier */
    psstore_conn_t *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    float snap_served[NPARAMS], served[NPARAMS], training[NPARAMS];
    uint64_t sep;
    assert_int_equal(psstore_snapshot_weights(c, model, 50, snap_served, NPARAMS, &sep), FR_OK);
    char log[300];
    snprintf(log, sizeof(log), "%s/cli-rollback.log", redis.dir);
    char *bad[] = {FRESHET_BIN, "model",       "rollback",  "--redis", redis.url,
                   "--name",    (char *)model, "--version", "7",       NULL};
    assert_int_equal(WEXITSTATUS(harness_run(bad, log, 10000)), 2);
    assert_true(harness_file_contains(log, "retains no snapshot of version 7"));
    char *argv[] = {FRESHET_BIN, "model",       "rollback",  "--redis", redis.url,
                    "--name",    (char *)model, "--version", "50",      NULL};
    assert_int_equal(harness_run(argv, log, 10000), 0);
    assert_true(harness_file_contains(log, "now version 61 of epoch"));
    assert_int_equal(psstore_pull(cl, w, &epoch2, &version, &changed), FR_OK);
    assert_true(epoch2 != epoch);
    assert_int_equal(version, 61);
    int ks[50];
    for (int k = 0; k < 50; k++)
        ks[k] = k;
    float want[NPARAMS];
    expected_weights(want, ks, 50);
    assert_weights_near(w, want, 1e-4f);
    /* the model serves what snapshot 50 served: its average, not its weights */
    read_both(model, served, training, &version);
    assert_memory_equal(served, snap_served, sizeof(served));
    assert_memory_equal(training, w, sizeof(training));
    assert_true(memcmp(served, training, sizeof(served)) != 0);
    assert_int_equal(query_int("XLEN freshet:{%s}:grads", model), 1); /* left alone */
    assert_int_equal(query_int("EXISTS freshet:{%s}:lease", model), 0);
    psstore_conn_destroy(c);
    psstore_client_destroy(cl);
}

/* A replay rewrites a partition's offsets under a new generation: batches
 * read before it are dropped (reason replay, marking nothing), the records
 * read again are applied. */
static void test_replay_rewind_drops_older_generations(void **state)
{
    const char *model = "replay";
    create_model(model);
    psstore_client_t *cl = client(model);
    float w[NPARAMS];
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    push_k(cl, 1, 0, 0, 10, epoch, 0);
    push_k(cl, 2, 1, 0, 10, epoch, 0); /* partition 1: not rewound */
    applier_thread_t at;
    applier_start(&at, model, 1);
    wait_applied(model, 2, 10000);
    psstore_conn_t *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    psstore_rewind_t target = {"t", 0, 5};
    char id[64];
    assert_int_equal(psstore_request_rewind(c, model, 1, &target, 1, id), FR_OK);
    assert_int_equal(psstore_request_wait(c, model, id, 10000), FR_OK);
    char out[64];
    harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:offsets t/0", model);
    assert_string_equal(out, "5@1");
    /* a generation-0 batch of t/0 read before the replay: dropped */
    push_k(cl, 3, 0, 10, 20, epoch, 2);
    /* the replayed records, generation 1: applied */
    float g[NPARAMS];
    gradient_k(g, 4);
    psstore_range_t range = {"t", 0, 5, 10};
    psstore_grad_t msg = {.epoch = epoch,
                          .version = 2,
                          .generation = 1,
                          .worker = "test/1/0",
                          .n = 5,
                          .loss_sum = 1,
                          .ranges = &range,
                          .nranges = 1,
                          .g = g,
                          .len = NPARAMS};
    assert_int_equal(psstore_push(cl, &msg, 1000), FR_OK);
    /* partition 1 was not rewritten: generation 0 still applies there */
    push_k(cl, 5, 1, 10, 20, epoch, 2);
    wait_applied(model, 4, 10000);
    psstore_applier_stats_t st;
    applier_stop(&at, &st);
    assert_int_equal(st.dropped[PSSTORE_DROPPED_REPLAY], 1);
    harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:offsets t/0", model);
    assert_string_equal(out, "10@1");
    harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:offsets t/1", model);
    assert_string_equal(out, "20");
    int ks[] = {1, 2, 4, 5};
    float want[NPARAMS];
    expected_weights(want, ks, 4);
    read_model(model, w, &epoch, &version);
    assert_weights_near(w, want, 1e-5f);
    /* the audit tells the replay's re-application from a double apply: t/0's
     * positions 5-9 applied in generation 0, then again in generation 1,
     * both in the model's one epoch */
    char text[4096] = "", want_epoch[32];
    snprintf(want_epoch, sizeof(want_epoch), "%llu", (unsigned long long)epoch);
    redisContext *rc = redisConnect("127.0.0.1", redis.port);
    redisReply *r = redisCommand(rc, "XRANGE freshet:{%s}:audit - +", model);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *kv = r->element[i]->element[1];
        const char *f[8] = {0};
        static const char *const names[] = {"topic", "partition",  "first",  "last",
                                            "epoch", "generation", "outcome"};
        for (size_t k = 0; k + 1 < kv->elements; k += 2)
            for (int n = 0; n < 7; n++)
                if (strcmp(kv->element[k]->str, names[n]) == 0)
                    f[n] = kv->element[k + 1]->str;
        for (int n = 0; n < 7; n++)
            assert_non_null(f[n]);
        assert_string_equal(f[4], want_epoch);
        size_t len = strlen(text);
        snprintf(text + len, sizeof(text) - len, "%s/%s %s-%s g%s %s\n", f[0], f[1], f[2], f[3],
                 f[5], f[6]);
    }
    freeReplyObject(r);
    redisFree(rc);
    assert_string_equal(text, "t/0 0-9 g0 applied\n"
                              "t/1 0-9 g0 applied\n"
                              "t/0 10-19 g0 replay\n"
                              "t/0 5-9 g1 applied\n"
                              "t/1 10-19 g0 applied\n");
    psstore_conn_destroy(c);
    psstore_client_destroy(cl);
}

/* Group commit after a takeover: the entries a dead applier left pending
 * are read once each, applied once, and committed together. */
static void test_group_commit_drains_a_dead_appliers_entries_once(void **state)
{
    const char *model = "groupcommit";
    create_model(model);
    psstore_client_t *cl = client(model);
    float w[NPARAMS];
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    int ks[20];
    for (int k = 0; k < 20; k++) {
        push_k(cl, k, 0, k, k + 1, epoch, 0);
        ks[k] = k;
    }
    /* a "dead" applier read them all and never acknowledged */
    char out[256];
    harness_redis_query(&redis, out, sizeof(out),
                        "XGROUP CREATE freshet:{%s}:grads appliers 0 MKSTREAM", model);
    harness_redis_query(&redis, out, sizeof(out),
                        "XREADGROUP GROUP appliers dead COUNT 100 STREAMS freshet:{%s}:grads >",
                        model);
    assert_int_equal(query_int("XLEN freshet:{%s}:grads", model), 20);
    psstore_applier_conf_t conf;
    psstore_applier_conf_init(&conf);
    conf.url = redis.url;
    conf.model = model;
    conf.ctl.lr = LR;
    conf.lease_ms = 1000;
    conf.commit_ms = 300;
    applier_thread_t at;
    uint64_t t0 = fr_clock_mono_ns();
    assert_int_equal(harness_applier_start(&at, &conf), 0);
    wait_applied(model, 20, 10000);
    psstore_applier_stats_t st;
    applier_stop(&at, &st);
    uint64_t wall = fr_clock_mono_ns() - t0;
    assert_int_equal(st.applied, 20);
    assert_int_equal(st.dropped[PSSTORE_DROPPED_DUPLICATE], 0);
    assert_true(st.commits >= 1 && st.commits < 20); /* grouped */
    /* each commit's time (two round trips at least) is counted, within the run's */
    if (st.commit_ns < st.commits * 5000 || st.commit_ns > wall)
        fail_msg("%llu commits took %llu ns in a run of %llu", (unsigned long long)st.commits,
                 (unsigned long long)st.commit_ns, (unsigned long long)wall);
    /* all computed on version 0 and applied in turn: staleness 0..19 */
    assert_int_equal(st.tau_p50, 9);
    assert_int_equal(st.tau_p99, 18);
    assert_true(fabs(st.lr_eff - LR) < 1e-12);
    assert_int_equal(query_int("XPENDING freshet:{%s}:grads appliers", model), 0);
    float want[NPARAMS];
    expected_weights(want, ks, 20);
    read_model(model, w, &epoch, &version);
    assert_weights_near(w, want, 1e-5f);
    psstore_client_destroy(cl);
}

/* Redis restarts under a running applier: the applier notices the
 * reconnect, reloads what survived and starts a new epoch. */
static void test_redis_restart_under_a_running_applier_starts_a_new_epoch(void **state)
{
    const char *model = "liverestart";
    create_model(model);
    psstore_client_t *cl = client(model);
    float w[NPARAMS];
    uint64_t epoch1 = 0, epoch2 = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_pull(cl, w, &epoch1, &version, &changed), FR_OK);
    applier_thread_t at;
    applier_start(&at, model, 0);
    for (int k = 0; k < 30; k++)
        push_k(cl, k, 0, k, k + 1, epoch1, 0);
    wait_applied(model, 30, 10000);
    psstore_client_destroy(cl);
    await_aof_written(); /* the 30 versions survive the kill */
    harness_redis_kill(&redis, SIGKILL);
    assert_int_equal(harness_redis_restart(&redis), 0);
    int64_t v = -1;
    for (int waited = 0; waited < 10000; waited += 50) {
        harness_sleep_ms(50);
        char out[64];
        harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:meta epoch", model);
        epoch2 = strtoull(out, NULL, 10);
        if (epoch2 != epoch1 && epoch2 != 0)
            break;
    }
    assert_true(epoch2 != epoch1 && epoch2 != 0);
    psstore_applier_stats_t st;
    applier_stop(&at, &st);
    assert_int_equal(st.epoch, epoch2);
    v = query_int("GET freshet:{%s}:ver", model);
    assert_int_equal(v, 30);
}

/* More than 5 of the last 100 gradients non-finite: the divergence guard
 * stops the model, says why, and applies nothing more. */
static void test_divergence_guard_stops_the_model(void **state)
{
    const char *model = "diverge";
    create_model(model);
    psstore_client_t *cl = client(model);
    float w[NPARAMS], g[NPARAMS];
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed;
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    for (int k = 0; k < 20; k++)
        push_k(cl, k, 0, k, k + 1, epoch, 0);
    gradient_k(g, 0);
    g[3] = INFINITY;
    for (int k = 20; k < 26; k++) { /* 6 non-finite of 26 */
        assert_int_equal(harness_push_range(cl, g, NPARAMS, 0, k, k + 1, epoch, 0, 1000), FR_OK);
    }
    for (int k = 26; k < 30; k++)
        push_k(cl, k, 0, k, k + 1, epoch, 0);
    applier_thread_t at;
    applier_start(&at, model, 0);
    char out[256] = "";
    for (int waited = 0; waited < 10000 && out[0] == '\0'; waited += 20) {
        harness_sleep_ms(20);
        harness_redis_query(&redis, out, sizeof(out), "HGET freshet:{%s}:meta stopped", model);
        if (strcmp(out, "(nil)") == 0)
            out[0] = '\0';
    }
    harness_sleep_ms(300);
    psstore_applier_stats_t st;
    applier_stop(&at, &st);
    assert_string_equal(out, "6 of the last 26 gradients were non-finite");
    assert_string_equal(st.stopped, out);
    assert_int_equal(st.applied, 20);
    assert_int_equal(query_int("GET freshet:{%s}:ver", model), 20);
    /* the metrics an alert reads (deploy/prometheus/freshet.rules.yml):
     * stopped, the applier's one takeover, its last new version just now */
    char *text = fr_metrics_render(metrics, NULL);
    assert_non_null(strstr(text, "\nfreshet_model_stopped{model=\"diverge\"} 1\n"));
    assert_non_null(strstr(text, "\nfreshet_applier_lease_takeovers_total{model=\"diverge\"} 1\n"));
    const char *upd = strstr(text, "\nfreshet_model_updated_timestamp_seconds{model=\"diverge\"} ");
    assert_non_null(upd);
    double t =
        strtod(upd + strlen("\nfreshet_model_updated_timestamp_seconds{model=\"diverge\"} "), NULL);
    assert_true(fabs(t - (double)fr_clock_unix_ms() * 1e-3) < 30.0);
    free(text);
    /* the good gradients after the stop wait, unapplied */
    assert_true(query_int("XLEN freshet:{%s}:grads", model) >= 4);
    /* a rollback (to the snapshot of version 0 kept here by hand) lifts it */
    psstore_conn_t *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    initial_weights(w);
    redisContext *rc = redisConnect("127.0.0.1", redis.port);
    freeReplyObject(redisCommand(rc, "HSET freshet:{%s}:snap:0 weights %b opt %b offsets %b", model,
                                 w, sizeof(w), "", (size_t)0, "", (size_t)0));
    redisFree(rc);
    char id[64];
    assert_int_equal(psstore_request_rollback(c, model, 0, id), FR_OK);
    applier_start(&at, model, 0);
    assert_int_equal(psstore_request_wait(c, model, id, 10000), FR_OK);
    applier_stop(&at, &st);
    assert_string_equal(st.stopped, "");
    assert_int_equal(query_int("HEXISTS freshet:{%s}:meta stopped", model), 0);
    text = fr_metrics_render(metrics, NULL); /* lifted; a second takeover */
    assert_non_null(strstr(text, "\nfreshet_model_stopped{model=\"diverge\"} 0\n"));
    assert_non_null(strstr(text, "\nfreshet_applier_lease_takeovers_total{model=\"diverge\"} 2\n"));
    free(text);
    psstore_conn_destroy(c);
    psstore_client_destroy(cl);
}

static int setup(void **state)
{
    metrics = fr_metrics_new();
    return harness_redis_start(&redis, "--appendonly yes --appendfsync everysec");
}

static int teardown(void **state)
{
    fr_metrics_destroy(metrics);
    harness_redis_stop(&redis);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_pushers_sum_exactly),
        cmocka_unit_test(test_duplicates_are_dropped_whole_and_mark_nothing),
        cmocka_unit_test(test_malformed_messages_are_counted_acknowledged_not_applied),
        cmocka_unit_test(test_snapshots_are_kept_and_trimmed),
        cmocka_unit_test(test_rollback_restores_a_snapshot_under_a_new_epoch),
        cmocka_unit_test(test_the_served_average_follows_every_update),
        cmocka_unit_test(test_requests_only_applier_executes_requests_and_leaves_gradients),
        cmocka_unit_test(test_cli_rollback_without_applier),
        cmocka_unit_test(test_divergence_guard_stops_the_model),
        cmocka_unit_test(test_replay_rewind_drops_older_generations),
        cmocka_unit_test(test_group_commit_drains_a_dead_appliers_entries_once),
        cmocka_unit_test(test_redis_restart_under_a_running_applier_starts_a_new_epoch),
        cmocka_unit_test(test_killed_applier_is_replaced_and_applies_everything_once),
        cmocka_unit_test(test_a_dead_local_holders_lease_is_taken_at_once),
        cmocka_unit_test(test_stalled_applier_is_fenced_and_changes_nothing),
        cmocka_unit_test(test_redis_restart_starts_a_new_epoch_and_drops_old_gradients),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
