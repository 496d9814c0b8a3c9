/*
 * test_model_lifecycle.c - a model's life in a real redis-server, through
 * the C API and through the freshet binary: the key layout of docs/design.md
 * "Redis layout" byte for byte, refusals (existing model, bad names, bad
 * URLs, an unreachable or evicting Redis), show/list/delete, AUTH, SELECT,
 * unix sockets, reconnection, offsets read from hand-written values, and a
 * weights read that never tears under a concurrent writer.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "harness.h"
#include "model/model.h"
#include "psstore/psstore.h"

/* The shared server of most tests; each test uses its own model names. */
static harness_redis_t R;
/* Servers of single tests, static so that the group teardown stops them
 * even when a failed assertion left a test early. */
static harness_redis_t R_lru, R_auth, R_restart;
static char tmpdir[256];

/* ------------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------- */
static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A connection for checks of our own, on database db (SELECTed). */
static redisContext *raw_connect(int port, int db)
{
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c == NULL || c->err)
        fail_msg("raw connect to %d: %s", port, c ? c->errstr : "out of memory");
    if (db != 0) {
        redisReply *r = redisCommand(c, "SELECT %d", db);
        assert_non_null(r);
        freeReplyObject(r);
    }
    return c;
}

/* A command on a raw connection; fails the test on a transport error. */
static redisReply *raw(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (r == NULL)
        fail_msg("raw command: %s", c->errstr);
    return r;
}

/* harness_redis_query on R; fails the test on a connection error. */
static const char *q(const char *fmt, ...)
{
    static char out[8192];
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    /* the command text holds no format directives of its own */
    if (harness_redis_query(&R, out, sizeof(out), cmd) != 0)
        fail_msg("query '%s' failed", cmd);
    return out;
}

/* The weights a model of layers/loss gets from model_params_init(seed);
 * caller frees. */
static float *seeded_weights(const char *layers, model_loss_t loss, uint64_t seed, model_t *m)
{
    char errstr[256];
    if (model_init(m, layers, loss, errstr, sizeof(errstr)) != FR_OK)
        fail_msg("%s", errstr);
    float *w = malloc(m->nparams * sizeof(float));
    assert_non_null(w);
    model_params_init(m, w, seed);
    return w;
}

/* A connection through the API; fails the test when it cannot connect. */
static psstore_conn_t *conn(const char *url)
{
    char errstr[512];
    psstore_conn_t *c = psstore_conn_new(url, 2000, errstr, sizeof(errstr));
    if (c == NULL)
        fail_msg("psstore_conn_new: %s", errstr);
    return c;
}

/* Creates model name through the API with seeded weights. */
static void api_create(psstore_conn_t *c, const char *name, const char *layers, uint64_t seed,
                       int force)
{
    model_t m;
    float *w = seeded_weights(layers, MODEL_LOSS_SOFTMAX, seed, &m);
    psstore_model_spec_t spec = {layers, "softmax", m.nparams, 1, NULL};
    fr_err_t err = psstore_model_create(c, name, &spec, w, force);
    if (err != FR_OK)
        fail_msg("create %s: %s", name, psstore_conn_error(c));
    free(w);
}

/* Checks that key holds exactly the n floats of want, byte for byte. */
static void expect_weights(redisContext *rc, const char *model, const float *want, size_t n)
{
    redisReply *r = raw(rc, "GET freshet:{%s}:w:0", model);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    assert_int_equal(r->len, n * sizeof(float));
    assert_memory_equal(r->str, want, n * sizeof(float));
    freeReplyObject(r);
}

/* The whole file as a string (caller frees); "" when missing. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *s = calloc(1, 65536);
    assert_non_null(s);
    if (f != NULL) {
        size_t n = fread(s, 1, 65535, f);
        s[n] = '\0';
        fclose(f);
    }
    return s;
}

/*
 * Runs "freshet model ARGS..." (NULL-terminated) with its output in a fresh
 * log file, within timeout_ms. Returns the exit status; *out (when given)
 * receives the output, caller frees. Fails the test on a timeout or a
 * signal.
 */
static int freshet(char **out, int timeout_ms, ...)
{
    static int seq;
    char log[512];
    snprintf(log, sizeof(log), "%s/freshet-%d.log", tmpdir, seq++);
    unlink(log);
    char *argv[32];
    int argc = 0;
    argv[argc++] = FRESHET_BIN;
    argv[argc++] = "model";
    va_list ap;
    va_start(ap, timeout_ms);
    for (char *a; argc < 31 && (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    int status = harness_run(argv, log, timeout_ms);
    if (status == -1) {
        fail_msg("freshet model %s did not finish within %d ms", argc > 2 ? argv[2] : "",
                 timeout_ms);
    }
    char *text = slurp(log);
    if (strstr(text, "unknown command 'model'") != NULL)
        fail_msg("%s has no 'model' command: register app_cmd_model in app/main.c", FRESHET_BIN);
    if (!WIFEXITED(status))
        fail_msg("freshet model %s died: status %d\n%s", argc > 2 ? argv[2] : "", status, text);
    if (out != NULL)
        *out = text;
    else
        free(text);
    return WEXITSTATUS(status);
}

/* Fails unless haystack contains needle, showing both. */
static void expect_contains(const char *haystack, const char *needle)
{
    if (strstr(haystack, needle) == NULL)
        fail_msg("expected '%s' in:\n%s", needle, haystack);
}

/* ------------------------------------------------------------------------
 * Fixtures
 * ---------------------------------------------------------------------- */
static int group_setup(void **state)
{
    (void)state;
    if (harness_tmpdir(tmpdir, "model") != 0)
        return -1;
    return harness_redis_start(&R, NULL);
}

static int group_teardown(void **state)
{
    (void)state;
    harness_redis_stop(&R);
    harness_redis_stop(&R_lru);
    harness_redis_stop(&R_auth);
    harness_redis_stop(&R_restart);
    return harness_rmdir(tmpdir);
}

/* ------------------------------------------------------------------------
 * Through the API
 * ---------------------------------------------------------------------- */
static void test_create_lays_out_every_key_as_designed(void **state)
{
    (void)state;
    psstore_conn_t *c = conn(R.url);
    model_t m;
    float *w = seeded_weights("4-8-3", MODEL_LOSS_SOFTMAX, 42, &m);
    psstore_model_spec_t spec = {"4-8-3", "softmax", m.nparams, 1, NULL};
    int64_t before = (int64_t)time(NULL) * 1000;
    assert_int_equal(psstore_model_create(c, "lay", &spec, w, 0), FR_OK);

    assert_string_equal(q("TYPE freshet:{lay}:meta"), "hash");
    assert_string_equal(q("HGET freshet:{lay}:meta layers"), "4-8-3");
    assert_string_equal(q("HGET freshet:{lay}:meta loss"), "softmax");
    assert_string_equal(q("HGET freshet:{lay}:meta shards"), "1");
    char epoch[32];
    snprintf(epoch, sizeof(epoch), "%s", q("HGET freshet:{lay}:meta epoch"));
    assert_true(strlen(epoch) > 0 && strspn(epoch, "0123456789") == strlen(epoch));
    assert_true(strtoull(epoch, NULL, 10) != 0);
    int64_t created = strtoll(q("HGET freshet:{lay}:meta created"), NULL, 10);
    assert_true(created >= before - 1000 && created <= before + 60000);
    char run_id[64];
    snprintf(run_id, sizeof(run_id), "%s", q("HGET freshet:{lay}:meta redis_run_id"));
    assert_int_equal(strlen(run_id), 40);
    expect_contains(q("INFO server"), run_id);
    assert_string_equal(q("GET freshet:{lay}:ver"), "0");
    char len[32];
    snprintf(len, sizeof(len), "%zu", 4 * m.nparams);
    assert_string_equal(q("STRLEN freshet:{lay}:w:0"), len);
    assert_string_equal(q("EXISTS freshet:{lay}:opt:0"), "1");
    assert_string_equal(q("STRLEN freshet:{lay}:opt:0"), "0");
    /* nothing else: meta, ver, w:0, opt:0 */
    redisContext *rc = raw_connect(R.port, 0);
    redisReply *keys = raw(rc, "KEYS freshet:{lay}:*");
    assert_int_equal(keys->elements, 4);
    freeReplyObject(keys);
    expect_weights(rc, "lay", w, m.nparams);
    redisFree(rc);

    /* two creations draw two epochs */
    assert_int_equal(psstore_model_create(c, "lay", &spec, w, 1), FR_OK);
    assert_string_not_equal(q("HGET freshet:{lay}:meta epoch"), epoch);
    free(w);
    psstore_conn_destroy(c);
}

static void test_create_refuses_an_existing_model_unless_forced(void **state)
{
    (void)state;
    psstore_conn_t *c = conn(R.url);
    api_create(c, "dup", "3-4-2", 1, 0);
    char epoch[32];
    snprintf(epoch, sizeof(epoch), "%s", q("HGET freshet:{dup}:meta epoch"));

    model_t m;
    float *w = seeded_weights("5-2", MODEL_LOSS_SOFTMAX, 2, &m);
    psstore_model_spec_t spec = {"5-2", "softmax", m.nparams, 1, NULL};
    assert_int_equal(psstore_model_create(c, "dup", &spec, w, 0), FR_ERR_EXISTS);
    expect_contains(psstore_conn_error(c), "model 'dup' already exists");
    assert_string_equal(q("HGET freshet:{dup}:meta epoch"), epoch); /* untouched */
    assert_string_equal(q("HGET freshet:{dup}:meta layers"), "3-4-2");

    /* leftovers of the old model's life: all gone after --force */
    q("HSET freshet:{dup}:offsets t/0 100");
    q("HSET freshet:{dup}:snap:7 weights x");
    q("ZADD freshet:{dup}:snaps 1 7");
    q("XADD freshet:{dup}:versions * v 1");
    q("SET freshet:{dup}:w:1 x");
    q("SET freshet:{dup}:ver 12");
    assert_int_equal(psstore_model_create(c, "dup", &spec, w, 1), FR_OK);
    assert_string_equal(q("HGET freshet:{dup}:meta layers"), "5-2");
    assert_string_not_equal(q("HGET freshet:{dup}:meta epoch"), epoch);
    assert_string_equal(q("GET freshet:{dup}:ver"), "0");
    assert_string_equal(q("EXISTS freshet:{dup}:offsets freshet:{dup}:snap:7 freshet:{dup}:snaps "
                          "freshet:{dup}:versions freshet:{dup}:w:1"),
                        "0");
    redisContext *rc = raw_connect(R.port, 0);
    expect_weights(rc, "dup", w, m.nparams);
    redisFree(rc);

    /* a running applier (its lease) keeps the model from being replaced */
    q("SET freshet:{dup}:lease token PX 60000");
    assert_int_equal(psstore_model_create(c, "dup", &spec, w, 1), FR_ERR_STATE);
    expect_contains(psstore_conn_error(c), "lease");
    assert_int_equal(psstore_model_delete(c, "dup"), FR_ERR_STATE);
    q("DEL freshet:{dup}:lease");
    assert_int_equal(psstore_model_delete(c, "dup"), FR_OK);
    free(w);
    psstore_conn_destroy(c);
}

static void test_create_and_delete_refuse_bad_names(void **state)
{
    (void)state;
    psstore_conn_t *c = conn(R.url);
    char long_name[80];
    memset(long_name, 'a', 65);
    long_name[65] = '\0';
    const char *bad[] = {"a b", "{x}", long_name, "", "a/b", "x*", "caf\xc3\xa9", "a\nb"};
    float w[6] = {0};
    psstore_model_spec_t spec = {"2-2", "softmax", 6, 1, NULL};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char errstr[256] = "";
        assert_int_equal(psstore_model_name_check(bad[i], errstr, sizeof(errstr)), FR_ERR_INVAL);
        expect_contains(errstr, "[A-Za-z0-9._-]{1,64}");
        assert_int_equal(psstore_model_create(c, bad[i], &spec, w, 0), FR_ERR_INVAL);
        assert_int_equal(psstore_model_delete(c, bad[i]), FR_ERR_INVAL);
    }
    assert_int_equal(psstore_model_name_check(NULL, NULL, 0), FR_ERR_INVAL);
    long_name[64] = '\0'; /* 64 is allowed */
    assert_int_equal(psstore_model_name_check(long_name, NULL, 0), FR_OK);
    assert_int_equal(psstore_model_name_check("A-z_0.9", NULL, 0), FR_OK);
    psstore_conn_destroy(c);
}

static void test_info_list_and_delete(void **state)
{
    (void)state;
    /* database 5 of the shared server: this test owns it */
    char url[400];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/5", R.port);
    psstore_conn_t *c = conn(url);
    redisContext *rc = raw_connect(R.port, 5);
    freeReplyObject(raw(rc, "SET unrelated 1"));
    api_create(c, "b-model", "2-3-2", 1, 0);
    api_create(c, "a.model", "2-3-2", 2, 0);
    api_create(c, "c_model", "2-3-2", 3, 0);
    freeReplyObject(raw(rc, "HSET freshet:notamodel:meta x 1")); /* no braces: not a model */
    int64_t version = -1;
    assert_int_equal(psstore_model_version(c, "b-model", &version), FR_OK);
    assert_int_equal(version, 0);
    freeReplyObject(raw(rc, "SET freshet:{b-model}:ver 41"));
    assert_int_equal(psstore_model_version(c, "b-model", &version), FR_OK);
    assert_int_equal(version, 41);
    freeReplyObject(raw(rc, "SET freshet:{b-model}:ver 0"));
    assert_int_equal(psstore_model_version(c, "nosuch", &version), FR_ERR_NOTFOUND);
    char **names;
    size_t n;
    assert_int_equal(psstore_model_list(c, &names, &n), FR_OK);
    assert_int_equal(n, 3);
    assert_string_equal(names[0], "a.model");
    assert_string_equal(names[1], "b-model");
    assert_string_equal(names[2], "c_model");
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    /* nothing leaked into database 0 */
    assert_string_equal(q("EXISTS freshet:{a.model}:meta"), "0");

    psstore_model_info_t info;
    freeReplyObject(raw(rc, "ZADD freshet:{b-model}:snaps 1000 10 2000 20 1500 15"));
    freeReplyObject(raw(rc, "HSET freshet:{b-model}:meta stopped %s", "diverged: 6% non-finite"));
    freeReplyObject(raw(rc, "SET freshet:{b-model}:ver 20"));
    assert_int_equal(psstore_model_info(c, "b-model", &info), FR_OK);
    assert_string_equal(info.name, "b-model");
    assert_string_equal(info.layers, "2-3-2");
    assert_string_equal(info.loss, "softmax");
    assert_int_equal(info.version, 20);
    assert_int_equal(info.shards, 1);
    assert_int_equal(info.bytes, 4 * (2 * 3 + 3 + 3 * 2 + 2));
    assert_true(info.created_ms > 0);
    redisReply *r = raw(rc, "HGET freshet:{b-model}:meta epoch");
    char epoch[32];
    snprintf(epoch, sizeof(epoch), "%" PRIu64, info.epoch);
    assert_string_equal(r->str, epoch);
    freeReplyObject(r);
    assert_string_equal(info.stopped, "diverged: 6% non-finite");
    assert_int_equal(info.nsnaps, 3);
    assert_int_equal(info.snaps[0], 10);
    assert_int_equal(info.snaps[1], 15);
    assert_int_equal(info.snaps[2], 20);
    /* at most the newest 64 snapshots */
    for (int v = 100; v < 200; v++)
        freeReplyObject(raw(rc, "ZADD freshet:{c_model}:snaps %d %d", 10000 + v, v));
    assert_int_equal(psstore_model_info(c, "c_model", &info), FR_OK);
    assert_int_equal(info.nsnaps, 64);
    assert_int_equal(info.snaps[0], 136);
    assert_int_equal(info.snaps[63], 199);
    assert_string_equal(info.stopped, "");
    assert_int_equal(psstore_model_info(c, "nope", &info), FR_ERR_NOTFOUND);
    expect_contains(psstore_conn_error(c), "no model 'nope'");

    /* delete removes every key, snapshots and streams included */
    freeReplyObject(raw(rc, "HSET freshet:{b-model}:snap:10 weights x"));
    freeReplyObject(raw(rc, "XADD freshet:{b-model}:grads * n 1"));
    freeReplyObject(raw(rc, "HSET freshet:{b-model}:offsets t/0 5"));
    for (int i = 0; i < 600; i++) /* more keys than one UNLINK takes */
        freeReplyObject(raw(rc, "SET freshet:{b-model}:snap:%d x", 1000 + i));
    assert_int_equal(psstore_model_delete(c, "b-model"), FR_OK);
    r = raw(rc, "KEYS freshet:{b-model}:*");
    assert_int_equal(r->elements, 0);
    freeReplyObject(r);
    assert_int_equal(psstore_model_delete(c, "b-model"), FR_ERR_NOTFOUND);
    assert_int_equal(psstore_model_delete(c, "a.model"), FR_OK);
    assert_int_equal(psstore_model_delete(c, "c_model"), FR_OK);
    assert_int_equal(psstore_model_list(c, &names, &n), FR_OK);
    assert_int_equal(n, 0);
    free(names);
    r = raw(rc, "DBSIZE");
    assert_int_equal(r->integer, 2); /* unrelated, freshet:notamodel:meta */
    freeReplyObject(r);
    freeReplyObject(raw(rc, "FLUSHDB"));
    redisFree(rc);
    psstore_conn_destroy(c);
}

static void test_offsets_read_parses_hand_written_values(void **state)
{
    (void)state;
    psstore_conn_t *c = conn(R.url);
    q("HSET freshet:{offs}:offsets clicks/0 100;120-130,140-150");
    q("HSET freshet:{offs}:offsets clicks/1 7");
    q("HSET freshet:{offs}:offsets clicks/3 garbage");
    q("HSET freshet:{offs}:offsets clicks/4 10;5-8");
    psstore_partition_offsets_t po;
    psstore_poff_init(&po, -1);
    int found = -1;
    assert_int_equal(psstore_offsets_read(c, "offs", "clicks", 0, &po, &found), FR_OK);
    assert_int_equal(found, 1);
    assert_int_equal(po.watermark, 100);
    assert_int_equal(po.nspans, 2);
    assert_int_equal(po.spans[0].from, 120);
    assert_int_equal(po.spans[0].to, 130);
    assert_int_equal(po.spans[1].from, 140);
    assert_int_equal(po.spans[1].to, 150);
    assert_true(psstore_poff_overlaps(&po, 125, 126));
    assert_false(psstore_poff_overlaps(&po, 130, 140));
    assert_int_equal(psstore_offsets_read(c, "offs", "clicks", 1, &po, &found), FR_OK);
    assert_int_equal(found, 1);
    assert_int_equal(po.watermark, 7);
    assert_int_equal(po.nspans, 0);
    /* never seen: po untouched */
    assert_int_equal(psstore_offsets_read(c, "offs", "clicks", 2, &po, &found), FR_OK);
    assert_int_equal(found, 0);
    assert_int_equal(po.watermark, 7);
    assert_int_equal(psstore_offsets_read(c, "offs", "other", 0, &po, &found), FR_OK);
    assert_int_equal(found, 0);
    /* malformed values are errors naming the partition */
    assert_int_equal(psstore_offsets_read(c, "offs", "clicks", 3, &po, &found), FR_ERR_PARSE);
    expect_contains(psstore_conn_error(c), "clicks/3");
    assert_int_equal(psstore_offsets_read(c, "offs", "clicks", 4, &po, &found), FR_ERR_PARSE);
    assert_int_equal(psstore_offsets_read(c, "no model", "clicks", 0, &po, &found), FR_ERR_INVAL);
    assert_int_equal(psstore_offsets_read(c, "offs", "clicks", -1, &po, &found), FR_ERR_INVAL);
    psstore_poff_fini(&po);
    q("DEL freshet:{offs}:offsets");
    psstore_conn_destroy(c);
}

/* The writer of the torn-read test: version k with every float equal to k,
 * written in one MULTI/EXEC, as fast as it can until told to stop. */
typedef struct writer {
    int port;
    size_t n;
    atomic_int stop;
    atomic_int writes;
} writer_t;

static void *writer_main(void *arg)
{
    writer_t *wr = arg;
    redisContext *rc = redisConnect("127.0.0.1", wr->port);
    float *w = malloc(wr->n * sizeof(float));
    if (rc == NULL || rc->err || w == NULL)
        return NULL;
    for (int k = 1; !wr->stop; k++) {
        for (size_t i = 0; i < wr->n; i++)
            w[i] = (float)k;
        redisAppendCommand(rc, "MULTI");
        redisAppendCommand(rc, "SET freshet:{torn}:w:0 %b", w, wr->n * sizeof(float));
        redisAppendCommand(rc, "SET freshet:{torn}:ver %d", k);
        redisAppendCommand(rc, "EXEC");
        for (int i = 0; i < 4; i++) {
            void *r = NULL;
            if (redisGetReply(rc, &r) != REDIS_OK)
                goto out;
            freeReplyObject(r);
        }
        wr->writes = k;
    }
out:
    free(w);
    redisFree(rc);
    return NULL;
}

static void test_weights_read_is_one_consistent_transaction(void **state)
{
    (void)state;
    psstore_conn_t *c = conn(R.url);
    api_create(c, "torn", "64-64-10", 5, 1);
    model_t m;
    float *want = seeded_weights("64-64-10", MODEL_LOSS_SOFTMAX, 5, &m);
    float *w = malloc(m.nparams * sizeof(float));
    uint64_t epoch = 0;
    int64_t version = -1;
    assert_int_equal(psstore_model_weights(c, "torn", w, m.nparams, &epoch, &version), FR_OK);
    assert_memory_equal(w, want, m.nparams * sizeof(float));
    assert_int_equal(version, 0);
    char e[32];
    snprintf(e, sizeof(e), "%" PRIu64, epoch);
    assert_string_equal(q("HGET freshet:{torn}:meta epoch"), e);
    assert_int_equal(psstore_model_weights(c, "torn", w, m.nparams - 1, &epoch, &version),
                     FR_ERR_RANGE);
    expect_contains(psstore_conn_error(c), "bytes of weights");
    assert_int_equal(psstore_model_weights(c, "absent", w, m.nparams, &epoch, &version),
                     FR_ERR_NOTFOUND);

    writer_t wr = {.port = R.port, .n = m.nparams};
    atomic_init(&wr.stop, 0);
    atomic_init(&wr.writes, 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, writer_main, &wr), 0);
    int reads = 0, distinct = 0;
    int64_t last = -1;
    uint64_t end = now_ms() + 1500;
    while (now_ms() < end || reads < 50) {
        assert_int_equal(psstore_model_weights(c, "torn", w, m.nparams, &epoch, &version), FR_OK);
        reads++;
        if (version == 0)
            continue; /* the writer has not started yet */
        for (size_t i = 0; i < m.nparams; i++) {
            if (w[i] != (float)version)
                fail_msg("torn read: version %lld with w[%zu] = %g", (long long)version, i,
                         (double)w[i]);
        }
        distinct += version != last;
        last = version;
    }
    wr.stop = 1;
    pthread_join(th, NULL);
    assert_true(wr.writes > 10);
    assert_true(distinct > 2);
    free(w);
    free(want);
    psstore_conn_destroy(c);
}

/* ------------------------------------------------------------------------
 * Connections: policy, AUTH, SELECT, unix sockets, reconnects
 * ---------------------------------------------------------------------- */
static void test_policy_check_refuses_an_evicting_redis(void **state)
{
    (void)state;
    psstore_conn_t *c = conn(R.url);
    assert_int_equal(psstore_conn_check_policy(c), FR_OK); /* noeviction, the default */
    psstore_conn_destroy(c);

    assert_int_equal(harness_redis_start(&R_lru, "--maxmemory-policy allkeys-lru"), 0);
    c = conn(R_lru.url);
    assert_int_equal(psstore_conn_check_policy(c), FR_ERR_UNSUPPORTED);
    char want[200];
    snprintf(want, sizeof(want),
             "redis 127.0.0.1:%d: maxmemory-policy allkeys-lru evicts keys; freshet needs "
             "noeviction (losing offsets would re-apply a topic)",
             R_lru.port);
    assert_string_equal(psstore_conn_error(c), want);
    psstore_conn_destroy(c);
    /* the command refuses to create a model there */
    char *out;
    assert_int_equal(freshet(&out, 10000, "create", "--redis", R_lru.url, "--name", "m", "--layers",
                             "2-2", NULL),
                     2);
    expect_contains(out, "maxmemory-policy allkeys-lru evicts keys");
    free(out);
    assert_int_equal(harness_redis_query(&R_lru, want, sizeof(want), "DBSIZE"), 0);
    assert_string_equal(want, "0");
    harness_redis_stop(&R_lru);

    assert_int_equal(harness_redis_start(&R_lru, "--maxmemory-policy volatile-ttl"), 0);
    c = conn(R_lru.url);
    assert_int_equal(psstore_conn_check_policy(c), FR_ERR_UNSUPPORTED);
    expect_contains(psstore_conn_error(c), "volatile-ttl evicts keys");
    psstore_conn_destroy(c);
    harness_redis_stop(&R_lru);

    /* CONFIG renamed away: a warning, and the check passes */
    assert_int_equal(harness_redis_start(&R_lru, "--rename-command CONFIG hidden-config-xyz"), 0);
    c = conn(R_lru.url);
    assert_int_equal(psstore_conn_check_policy(c), FR_OK);
    assert_int_equal(psstore_conn_check_policy(c), FR_OK); /* the connection is still usable */
    psstore_conn_destroy(c);
    harness_redis_stop(&R_lru);
}

static void test_auth_select_and_unix_sockets(void **state)
{
    (void)state;
    char sock[300], args[700], url[600], errstr[512];
    snprintf(sock, sizeof(sock), "%s/redis.sock", tmpdir);
    snprintf(args, sizeof(args),
             "--requirepass p@ss:w/rd --user alice on >alicepw ~* &* +@all --unixsocket %s "
             "--unixsocketperm 700",
             sock);
    assert_int_equal(harness_redis_start(&R_auth, args), 0);

    /* no password: the first command fails with the server's word */
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", R_auth.port);
    assert_null(psstore_conn_new(url, 2000, errstr, sizeof(errstr)));
    expect_contains(errstr, "NOAUTH");
    /* a wrong password is refused and never shown */
    snprintf(url, sizeof(url), "redis://:wrongpw1@127.0.0.1:%d", R_auth.port);
    assert_null(psstore_conn_new(url, 2000, errstr, sizeof(errstr)));
    expect_contains(errstr, "AUTH failed");
    char ep[64];
    snprintf(ep, sizeof(ep), "redis 127.0.0.1:%d:", R_auth.port);
    expect_contains(errstr, ep);
    assert_null(strstr(errstr, "wrongpw1"));
    /* the default user's password, percent-encoded, and database 3 */
    snprintf(url, sizeof(url), "redis://:p%%40ss%%3Aw%%2Frd@127.0.0.1:%d/3", R_auth.port);
    psstore_conn_t *c = conn(url);
    api_create(c, "authed", "2-2", 1, 0);
    psstore_conn_destroy(c);
    /* an ACL user, on the unix socket, database 3 */
    snprintf(url, sizeof(url), "unix://alice:alicepw@%s?db=3", sock);
    c = conn(url);
    psstore_model_info_t info;
    assert_int_equal(psstore_model_info(c, "authed", &info), FR_OK);
    assert_string_equal(info.layers, "2-2");
    psstore_conn_destroy(c);
    /* database 0 holds nothing */
    snprintf(url, sizeof(url), "unix://alice:alicepw@%s", sock);
    c = conn(url);
    assert_int_equal(psstore_model_info(c, "authed", &info), FR_ERR_NOTFOUND);
    psstore_conn_destroy(c);
    /* the command line, with the URL from the environment */
    snprintf(url, sizeof(url), "unix://alice:alicepw@%s?db=3", sock);
    setenv("FRESHET_REDIS_URL", url, 1);
    char *out;
    assert_int_equal(freshet(&out, 10000, "list", NULL), 0);
    assert_string_equal(out, "authed\n");
    free(out);
    unsetenv("FRESHET_REDIS_URL");
    /* a database that does not exist */
    snprintf(url, sizeof(url), "redis://alice:alicepw@127.0.0.1:%d/99", R_auth.port);
    assert_null(psstore_conn_new(url, 2000, errstr, sizeof(errstr)));
    expect_contains(errstr, "SELECT failed");
    harness_redis_stop(&R_auth);
}

static void test_commands_reconnect_after_a_redis_restart(void **state)
{
    (void)state;
    assert_int_equal(harness_redis_start(&R_restart, NULL), 0);
    char errstr[512];
    psstore_conn_t *c = psstore_conn_new(R_restart.url, 300, errstr, sizeof(errstr));
    assert_non_null(c);
    api_create(c, "phoenix", "2-2", 1, 0);
    harness_redis_kill(&R_restart, SIGKILL);
    /* down: an error naming the endpoint, within the timeout */
    char **names;
    size_t n;
    uint64_t t0 = now_ms();
    assert_int_equal(psstore_model_list(c, &names, &n), FR_ERR_REDIS);
    assert_true(now_ms() - t0 < 2000);
    char ep[64];
    snprintf(ep, sizeof(ep), "redis 127.0.0.1:%d: ", R_restart.port);
    expect_contains(psstore_conn_error(c), ep);
    /* up again (empty: no persistence): the same connection object works */
    assert_int_equal(harness_redis_restart(&R_restart), 0);
    assert_int_equal(psstore_model_list(c, &names, &n), FR_OK);
    assert_int_equal(n, 0);
    free(names);
    api_create(c, "phoenix", "2-2", 1, 0);
    /* a restart between two commands: a retried read reconnects by itself */
    harness_redis_kill(&R_restart, SIGKILL);
    assert_int_equal(harness_redis_restart(&R_restart), 0);
    psstore_model_info_t info;
    assert_int_equal(psstore_model_info(c, "phoenix", &info), FR_ERR_NOTFOUND);
    psstore_conn_destroy(c);
    harness_redis_stop(&R_restart);
}

/* ------------------------------------------------------------------------
 * Through the freshet binary
 * ---------------------------------------------------------------------- */
static void test_cli_create_show_and_refusals(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(freshet(&out, 10000, "create", "--redis", R.url, "--name", "cli1", "--layers",
                             "6-5-3", "--seed", "7", NULL),
                     0);
    expect_contains(out, "cli1");
    free(out);
    model_t m;
    float *w = seeded_weights("6-5-3", MODEL_LOSS_SOFTMAX, 7, &m);
    redisContext *rc = raw_connect(R.port, 0);
    expect_weights(rc, "cli1", w, m.nparams);
    assert_string_equal(q("HGET freshet:{cli1}:meta layers"), "6-5-3");
    assert_string_equal(q("HGET freshet:{cli1}:meta loss"), "softmax");
    assert_string_equal(q("GET freshet:{cli1}:ver"), "0");
    char epoch[32];
    snprintf(epoch, sizeof(epoch), "%s", q("HGET freshet:{cli1}:meta epoch"));

    /* again: refused, exit 2, nothing changed */
    assert_int_equal(
        freshet(&out, 10000, "create", "--redis", R.url, "--name", "cli1", "--layers", "6-2", NULL),
        2);
    expect_contains(out, "model 'cli1' already exists");
    expect_contains(out, "--force");
    free(out);
    assert_string_equal(q("HGET freshet:{cli1}:meta epoch"), epoch);

    /* --force replaces it; the default seed is 42; --loss logistic */
    assert_int_equal(freshet(&out, 10000, "create", "--redis", R.url, "--name", "cli1", "--layers",
                             "6-1", "--loss", "logistic", "--force", NULL),
                     0);
    free(out);
    free(w);
    model_t m2;
    w = seeded_weights("6-1", MODEL_LOSS_LOGISTIC, 42, &m2);
    expect_weights(rc, "cli1", w, m2.nparams);
    assert_string_equal(q("HGET freshet:{cli1}:meta loss"), "logistic");
    assert_string_not_equal(q("HGET freshet:{cli1}:meta epoch"), epoch);
    snprintf(epoch, sizeof(epoch), "%s", q("HGET freshet:{cli1}:meta epoch"));

    /* show: one JSON object */
    q("ZADD freshet:{cli1}:snaps 5 3 6 9");
    assert_int_equal(freshet(&out, 10000, "show", "--redis", R.url, "--name", "cli1", NULL), 0);
    char want[256];
    /* one line holding one object */
    assert_true(out[0] == '{' && out[strlen(out) - 2] == '}');
    assert_ptr_equal(strchr(out, '\n'), out + strlen(out) - 1);
    expect_contains(out, "\"name\":\"cli1\"");
    expect_contains(out, "\"layers\":\"6-1\"");
    expect_contains(out, "\"loss\":\"logistic\"");
    snprintf(want, sizeof(want), "\"epoch\":\"%s\"", epoch);
    expect_contains(out, want);
    expect_contains(out, "\"version\":0");
    expect_contains(out, "\"shards\":1");
    snprintf(want, sizeof(want), "\"bytes\":%zu", 4 * m2.nparams);
    expect_contains(out, want);
    expect_contains(out, "\"created_ms\":");
    expect_contains(out, "\"snapshots\":[3,9]");
    snprintf(want, sizeof(want), "\"redis\":\"127.0.0.1:%d\"}", R.port);
    expect_contains(out, want); /* one Redis: no slot */
    assert_null(strstr(out, "stopped"));
    free(out);
    q("HSET freshet:{cli1}:meta stopped non-finite\"gradients\"");
    assert_int_equal(freshet(&out, 10000, "show", "--redis", R.url, "--name", "cli1", NULL), 0);
    expect_contains(out, "\"stopped\":\"non-finite\\\"gradients\\\"\"");
    free(out);
    assert_int_equal(freshet(&out, 10000, "show", "--redis", R.url, "--name", "absent", NULL), 2);
    expect_contains(out, "no model 'absent'");
    free(out);

    /* delete needs --yes */
    assert_int_equal(freshet(&out, 10000, "delete", "--redis", R.url, "--name", "cli1", NULL), 2);
    expect_contains(out, "--yes");
    free(out);
    assert_string_equal(q("EXISTS freshet:{cli1}:meta"), "1");
    assert_int_equal(
        freshet(&out, 10000, "delete", "--redis", R.url, "--name", "cli1", "--yes", NULL), 0);
    free(out);
    assert_string_equal(q("EXISTS freshet:{cli1}:meta freshet:{cli1}:snaps"), "0");
    free(w);
    redisFree(rc);
}

static void test_cli_create_from_an_init_file(void **state)
{
    (void)state;
    model_t m;
    float *w = seeded_weights("3-4-2", MODEL_LOSS_SOFTMAX, 99, &m);
    for (size_t i = 0; i < m.nparams; i++)
        w[i] = (float)i * 0.25f - 1.0f; /* biases too: nothing like a fresh init */
    char path[400], errstr[256];
    snprintf(path, sizeof(path), "%s/init.safetensors", tmpdir);
    assert_int_equal(model_save(path, &m, w, NULL, 0, errstr, sizeof(errstr)), FR_OK);
    char *out;
    assert_int_equal(freshet(&out, 10000, "create", "--redis", R.url, "--name", "fromfile",
                             "--init", path, NULL),
                     0);
    free(out);
    redisContext *rc = raw_connect(R.port, 0);
    expect_weights(rc, "fromfile", w, m.nparams);
    redisFree(rc);
    assert_string_equal(q("HGET freshet:{fromfile}:meta layers"), "3-4-2");
    assert_string_equal(q("HGET freshet:{fromfile}:meta loss"), "softmax");
    /* export writes them back bit for bit, with the version */
    char back[400];
    snprintf(back, sizeof(back), "%s/export.safetensors", tmpdir);
    assert_int_equal(
        freshet(&out, 10000, "export", "--redis", R.url, "--name", "fromfile", "--out", back, NULL),
        0);
    expect_contains(out, "version 0 of epoch");
    free(out);
    model_t mb;
    float *wb = NULL;
    assert_int_equal(model_load(back, NULL, &mb, &wb, errstr, sizeof(errstr)), FR_OK);
    assert_true(model_equal(&m, &mb));
    assert_memory_equal(wb, w, m.nparams * sizeof(float));
    free(wb);
    assert_int_equal(
        freshet(&out, 10000, "export", "--redis", R.url, "--name", "nosuch", "--out", back, NULL),
        2);
    free(out);
    assert_int_equal(freshet(&out, 10000, "export", "--redis", R.url, "--name", "fromfile", NULL),
                     2);
    expect_contains(out, "--out W is required");
    free(out);
    /* --layers must match the file, as must --loss; --seed has no place */
    assert_int_equal(freshet(&out, 10000, "create", "--redis", R.url, "--name", "ff2", "--init",
                             path, "--layers", "3-5-2", NULL),
                     2);
    expect_contains(out, "3-4-2");
    free(out);
    assert_int_equal(freshet(&out, 10000, "create", "--redis", R.url, "--name", "ff2", "--init",
                             path, "--loss", "mse", NULL),
                     2);
    free(out);
    assert_int_equal(freshet(&out, 10000, "create", "--redis", R.url, "--name", "ff2", "--init",
                             path, "--seed", "3", NULL),
                     2);
    free(out);
    assert_int_equal(freshet(&out, 10000, "create", "--redis", R.url, "--name", "ff2", "--init",
                             path, "--layers", "3-4-2", "--loss", "softmax", NULL),
                     0);
    free(out);
    assert_string_equal(q("EXISTS freshet:{ff2}:meta"), "1");
    /* a missing file and bad layers are usage errors */
    assert_int_equal(freshet(&out, 10000, "create", "--redis", R.url, "--name", "ff3", "--init",
                             "/nonexistent.safetensors", NULL),
                     2);
    free(out);
    assert_int_equal(
        freshet(&out, 10000, "create", "--redis", R.url, "--name", "ff3", "--layers", "3-x", NULL),
        2);
    expect_contains(out, "--layers");
    free(out);
    assert_int_equal(freshet(&out, 10000, "create", "--redis", R.url, "--name", "ff3", NULL), 2);
    free(out);
    assert_string_equal(q("EXISTS freshet:{ff3}:meta"), "0");
    q("DEL freshet:{fromfile}:meta freshet:{fromfile}:ver freshet:{fromfile}:w:0 "
      "freshet:{fromfile}:opt:0 freshet:{ff2}:meta freshet:{ff2}:ver freshet:{ff2}:w:0 "
      "freshet:{ff2}:opt:0");
    free(w);
}

static void test_cli_list_and_delete_restore_the_database(void **state)
{
    (void)state;
    char url[400];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/7", R.port);
    redisContext *rc = raw_connect(R.port, 7);
    freeReplyObject(raw(rc, "SET someone-elses-key 1"));
    redisReply *r = raw(rc, "DBSIZE");
    long long before = r->integer;
    freeReplyObject(r);
    char *out;
    const char *names[] = {"zeta", "alpha", "Mid.1"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(freshet(&out, 10000, "create", "--redis", url, "--name", names[i],
                                 "--layers", "2-2", NULL),
                         0);
        free(out);
    }
    assert_int_equal(freshet(&out, 10000, "list", "--redis", url, NULL), 0);
    assert_string_equal(out, "Mid.1\nalpha\nzeta\n"); /* byte order */
    free(out);
    freeReplyObject(raw(rc, "HSET freshet:{alpha}:offsets t/0 10;12-13"));
    freeReplyObject(raw(rc, "HSET freshet:{alpha}:snap:4 weights x"));
    for (int i = 0; i < 3; i++) {
        assert_int_equal(
            freshet(&out, 10000, "delete", "--redis", url, "--name", names[i], "--yes", NULL), 0);
        free(out);
    }
    r = raw(rc, "DBSIZE");
    assert_int_equal(r->integer, before);
    freeReplyObject(r);
    assert_int_equal(freshet(&out, 10000, "list", "--redis", url, NULL), 0);
    assert_string_equal(out, "");
    free(out);
    assert_int_equal(
        freshet(&out, 10000, "delete", "--redis", url, "--name", "alpha", "--yes", NULL), 2);
    expect_contains(out, "no model 'alpha'");
    free(out);
    freeReplyObject(raw(rc, "FLUSHDB"));
    redisFree(rc);
}

typedef struct applier_thread {
    pthread_t tid;
    psstore_applier_t *a;
    atomic_int stop;
} applier_thread_t;

static void *applier_main(void *arg)
{
    applier_thread_t *t = arg;
    psstore_applier_run(t->a, &t->stop);
    return NULL;
}

/* A model with a running applier is deleted by that applier, on request. */
static void test_cli_delete_asks_a_running_applier(void **state)
{
    (void)state;
    psstore_conn_t *c = conn(R.url);
    api_create(c, "served", "2-2", 1, 0);
    psstore_applier_conf_t conf;
    psstore_applier_conf_init(&conf);
    conf.url = R.url;
    conf.model = "served";
    conf.lease_ms = 1000;
    char errstr[512];
    static applier_thread_t t;
    memset(&t, 0, sizeof(t));
    atomic_init(&t.stop, 0);
    t.a = psstore_applier_new(&conf, errstr, sizeof(errstr));
    if (t.a == NULL)
        fail_msg("applier: %s", errstr);
    assert_int_equal(pthread_create(&t.tid, NULL, applier_main, &t), 0);
    int held = 0;
    for (int waited = 0; !held && waited < 5000; waited += 10) {
        assert_int_equal(psstore_lease_held(c, "served", &held), FR_OK);
        harness_sleep_ms(10);
    }
    assert_true(held);
    assert_int_equal(psstore_model_delete(c, "served"), FR_ERR_STATE);
    char *out;
    int rc = freshet(&out, 15000, "delete", "--redis", R.url, "--name", "served", "--yes", NULL);
    atomic_store(&t.stop, 1);
    pthread_join(t.tid, NULL);
    psstore_applier_destroy(t.a);
    if (rc != 0)
        fail_msg("exit %d:\n%s", rc, out);
    expect_contains(out, "by its running applier");
    free(out);
    assert_string_equal(q("EXISTS freshet:{served}:meta freshet:{served}:ver freshet:{served}:w:0 "
                          "freshet:{served}:requests"),
                        "0");
    psstore_conn_destroy(c);
}

static void test_cli_refuses_bad_names(void **state)
{
    (void)state;
    char long_name[80];
    memset(long_name, 'n', 65);
    long_name[65] = '\0';
    const char *bad[] = {"a b", "{x}", long_name, ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *out;
        assert_int_equal(freshet(&out, 10000, "create", "--redis", R.url, "--name", bad[i],
                                 "--layers", "2-2", NULL),
                         2);
        expect_contains(out, "model name");
        free(out);
        assert_int_equal(freshet(&out, 10000, "show", "--redis", R.url, "--name", bad[i], NULL), 2);
        free(out);
        assert_int_equal(
            freshet(&out, 10000, "delete", "--redis", R.url, "--name", bad[i], "--yes", NULL), 2);
        free(out);
    }
    assert_string_equal(q("KEYS *{x}*"), "");
}

static void test_cli_bad_urls_and_unreachable_redis_fail_fast(void **state)
{
    (void)state;
    int held, port = harness_closed_port(&held); /* no other process can listen there meanwhile */
    assert_true(port > 0);
    char dead[200], dead_pw[200], ep[64];
    snprintf(dead, sizeof(dead), "redis://127.0.0.1:%d/0", port);
    snprintf(dead_pw, sizeof(dead_pw), "redis://admin:hunter2@127.0.0.1:%d/0", port);
    snprintf(ep, sizeof(ep), "redis 127.0.0.1:%d: Connection refused", port);
    struct {
        const char *url, *needle;
    } cases[] = {
        {"http://x", "unsupported scheme 'http'"},
        {"rediss://:hunter2@127.0.0.1:6380/0", "TLS proxy"},
        {dead, ep},
        {dead_pw, ep},
        {"redis://127.0.0.1:99999", "1..65535"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *url = cases[i].url;
        for (int v = 0; v < 4; v++) {
            char *out;
            uint64_t t0 = now_ms();
            int rc;
            if (v == 0)
                rc = freshet(&out, 3000, "list", "--redis", url, NULL);
            else if (v == 1)
                rc = freshet(&out, 3000, "show", "--redis", url, "--name", "m", NULL);
            else if (v == 2)
                rc = freshet(&out, 3000, "delete", "--redis", url, "--name", "m", "--yes", NULL);
            else
                rc = freshet(&out, 3000, "create", "--redis", url, "--name", "m", "--layers", "2-2",
                             NULL);
            assert_int_equal(rc, 2);
            assert_true(now_ms() - t0 < 3000);
            expect_contains(out, cases[i].needle);
            if (strstr(out, "hunter2") != NULL)
                fail_msg("the password was printed:\n%s", out);
            /* one line of error */
            assert_ptr_equal(strchr(out, '\n'), out + strlen(out) - 1);
            free(out);
        }
    }
    /* the environment's URL is the default */
    setenv("FRESHET_REDIS_URL", dead, 1);
    char *out;
    assert_int_equal(freshet(&out, 3000, "list", NULL), 2);
    expect_contains(out, ep);
    free(out);
    unsetenv("FRESHET_REDIS_URL");
    close(held);
}

static void test_cli_help_and_usage_errors(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(freshet(&out, 5000, "--help", NULL), 0);
    expect_contains(out, "create");
    expect_contains(out, "delete");
    free(out);
    const char *verbs[] = {"create", "show", "list", "delete"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(freshet(&out, 5000, verbs[i], "--help", NULL), 0);
        expect_contains(out, "usage: freshet model ");
        expect_contains(out, "--redis URL");
        free(out);
    }
    assert_int_equal(freshet(&out, 5000, NULL), 2);
    free(out);
    assert_int_equal(freshet(&out, 5000, "rename", NULL), 2);
    expect_contains(out, "unknown verb 'rename'");
    free(out);
    assert_int_equal(freshet(&out, 5000, "list", "--name", "x", NULL), 2);
    free(out);
    assert_int_equal(freshet(&out, 5000, "show", "--redis", R.url, NULL), 2);
    expect_contains(out, "--name");
    free(out);
    assert_int_equal(freshet(&out, 5000, "create", "--name", "x", "--layers", "2-2", "--seed", "-1",
                             "--redis", R.url, NULL),
                     2);
    free(out);
    assert_int_equal(freshet(&out, 5000, "create", "--name", "x", "--layers", "2-2", "--loss",
                             "hinge", "--redis", R.url, NULL),
                     2);
    free(out);
    assert_string_equal(q("EXISTS freshet:{x}:meta"), "0");
}

/* ------------------------------------------------------------------------
 * Sharded models (docs/design.md "Shards")
 * ---------------------------------------------------------------------- */

/* The number of keys matching pattern in the database of rc. */
static size_t count_keys(redisContext *rc, const char *pattern)
{
    redisReply *r = raw(rc, "KEYS %s", pattern);
    size_t n = r->elements;
    freeReplyObject(r);
    return n;
}

/* Create lays out each shard under its own tag with its slice; info, list,
 * weights, offsets, requests, leases and delete see the model whole. */
static void test_sharded_model_layout_reads_and_delete(void **state)
{
    (void)state;
    char url[400];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/6", R.port);
    psstore_conn_t *c = conn(url);
    redisContext *rc = raw_connect(R.port, 6);
    model_t m;
    float *w = seeded_weights("4-8-3", MODEL_LOSS_SOFTMAX, 5, &m); /* 67 floats */
    psstore_model_spec_t spec = {"4-8-3", "softmax", m.nparams, 3, NULL};
    assert_int_equal(psstore_model_create(c, "sh", &spec, w, 0), FR_OK);
    /* meta of the model, and each shard's keys under {sh/s<k>} */
    redisReply *r = raw(rc, "HMGET freshet:{sh}:meta shards bounds layers");
    assert_string_equal(r->element[0]->str, "3");
    assert_string_equal(r->element[1]->str, "0,24,48,67"); /* row starts nearest thirds */
    assert_string_equal(r->element[2]->str, "4-8-3");
    freeReplyObject(r);
    const size_t b[] = {0, 24, 48, 67};
    for (int k = 0; k < 3; k++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "sh/s%d", k);
        expect_weights(rc, tag, w + b[k], b[k + 1] - b[k]);
        r = raw(rc, "HMGET freshet:{%s}:meta lo hi epoch", tag);
        assert_int_equal(atoi(r->element[0]->str), (int)b[k]);
        assert_int_equal(atoi(r->element[1]->str), (int)b[k + 1]);
        assert_int_equal(r->element[2]->type, REDIS_REPLY_STRING);
        freeReplyObject(r);
    }
    assert_int_equal(count_keys(rc, "freshet:{sh}:w:0"), 0);
    char **names;
    size_t n;
    assert_int_equal(psstore_model_list(c, &names, &n), FR_OK);
    assert_int_equal(n, 1); /* the shards' metas are not models */
    assert_string_equal(names[0], "sh");
    free(names[0]);
    free(names);

    /* info and version add up the shards'; the weights come back whole */
    freeReplyObject(raw(rc, "SET freshet:{sh/s0}:ver 5"));
    freeReplyObject(raw(rc, "SET freshet:{sh/s1}:ver 7"));
    freeReplyObject(raw(rc, "SET freshet:{sh/s2}:ver 9"));
    psstore_model_info_t info;
    assert_int_equal(psstore_model_info(c, "sh", &info), FR_OK);
    assert_int_equal(info.shards, 3);
    assert_int_equal(info.version, 21);
    assert_int_equal(info.shard_versions[1], 7);
    assert_memory_equal(info.bounds, b, sizeof(b));
    assert_int_equal(info.bytes, 67 * sizeof(float));
    int64_t version = 0;
    assert_int_equal(psstore_model_version(c, "sh", &version), FR_OK);
    assert_int_equal(version, 21);
    float back[67];
    uint64_t epoch = 0;
    char *offs = NULL;
    /* offsets: t/0 seen by every shard, t/1 by shard 1 only */
    freeReplyObject(raw(rc, "HSET freshet:{sh/s0}:offsets t/0 10;12-14@3"));
    freeReplyObject(raw(rc, "HSET freshet:{sh/s1}:offsets t/0 8;9-11@3 t/1 4"));
    freeReplyObject(raw(rc, "HSET freshet:{sh/s2}:offsets t/0 15@2"));
    assert_int_equal(psstore_model_weights_offsets(c, "sh", back, 67, &epoch, &version, &offs),
                     FR_OK);
    assert_memory_equal(back, w, sizeof(back));
    assert_int_equal(version, 21);
    assert_string_equal(offs, "t/0=8,t/1=0"); /* the lowest watermark of each partition */
    free(offs);
    assert_int_equal(psstore_model_weights(c, "sh", back, 66, &epoch, &version), FR_ERR_RANGE);
    /* the consumer starts at the lowest watermark and skips that shard's
     * intervals, with the oldest generation (shard 2 has not executed the
     * rewrite of generation 3: it is sent again) */
    psstore_partition_offsets_t po;
    int found = 0;
    psstore_poff_init(&po, 0);
    assert_int_equal(psstore_offsets_read(c, "sh", "t", 0, &po, &found), FR_OK);
    assert_int_equal(found, 1);
    assert_int_equal(po.watermark, 8);
    assert_int_equal(po.nspans, 1);
    assert_true(po.spans[0].from == 9 && po.spans[0].to == 11);
    assert_int_equal(po.generation, 2);
    assert_int_equal(psstore_offsets_read(c, "sh", "t", 1, &po, &found), FR_OK);
    assert_int_equal(found, 1);
    assert_int_equal(po.watermark, 0); /* shards 0 and 2 applied nothing of t/1 */
    assert_int_equal(po.nspans, 0);
    psstore_poff_fini(&po);
    char **keys;
    assert_int_equal(psstore_offsets_keys(c, "sh", &keys, &n), FR_OK);
    assert_int_equal(n, 2);
    assert_string_equal(keys[0], "t/0");
    assert_string_equal(keys[1], "t/1");
    free(keys[0]);
    free(keys[1]);
    free(keys);

    /* a request reaches every shard under one token, and waits for all */
    char id[64];
    assert_int_equal(psstore_request_delete(c, "sh", id), FR_OK);
    assert_true(strncmp(id, "t:3:", 4) == 0); /* the shards and the token */
    for (int k = 0; k < 3; k++) {
        r = raw(rc, "XRANGE freshet:{sh/s%d}:requests - +", k);
        assert_int_equal(r->elements, 1);
        const redisReply *kv = r->element[0]->element[1];
        int has_token = 0;
        for (size_t f = 0; f + 1 < kv->elements; f += 2)
            has_token |= strcmp(kv->element[f]->str, "token") == 0 &&
                         strcmp(kv->element[f + 1]->str, id + 4) == 0;
        assert_true(has_token);
        freeReplyObject(r);
    }
    assert_int_equal(psstore_request_wait(c, "sh", id, 60), FR_ERR_TIMEOUT);
    freeReplyObject(raw(rc, "DEL freshet:{sh/s0}:requests freshet:{sh/s2}:requests"));
    assert_int_equal(psstore_request_wait(c, "sh", id, 60), FR_ERR_TIMEOUT); /* shard 1 */
    freeReplyObject(raw(rc, "DEL freshet:{sh/s1}:requests"));
    assert_int_equal(psstore_request_wait(c, "sh", id, 60), FR_OK);
    /* rollback needs every shard to hold the snapshot */
    assert_int_equal(psstore_request_rollback(c, "sh", 3, id), FR_ERR_NOTFOUND);
    expect_contains(psstore_conn_error(c), "shard 0 retains no snapshot 3");

    /* a lease held on any shard: held, and delete and replace are refused */
    int held = 0;
    assert_int_equal(psstore_lease_held(c, "sh", &held), FR_OK);
    assert_int_equal(held, 0);
    freeReplyObject(raw(rc, "SET freshet:{sh/s2}:lease someone PX 60000"));
    assert_int_equal(psstore_lease_held(c, "sh", &held), FR_OK);
    assert_int_equal(held, 1);
    assert_int_equal(psstore_model_delete(c, "sh"), FR_ERR_STATE);
    expect_contains(psstore_conn_error(c), "shard 2 of 3");
    spec.shards = 2;
    assert_int_equal(psstore_model_create(c, "sh", &spec, w, 1), FR_ERR_STATE);
    freeReplyObject(raw(rc, "DEL freshet:{sh/s2}:lease"));

    /* replacing: 3 shards by 2 (no key of shard 2 is left), then by 1 */
    assert_int_equal(psstore_model_create(c, "sh", &spec, w, 0), FR_ERR_EXISTS);
    assert_int_equal(psstore_model_create(c, "sh", &spec, w, 1), FR_OK);
    assert_int_equal(count_keys(rc, "freshet:{sh/s2}:*"), 0);
    assert_int_equal(psstore_model_info(c, "sh", &info), FR_OK);
    assert_int_equal(info.shards, 2);
    assert_int_equal(info.version, 0);
    spec.shards = 1;
    assert_int_equal(psstore_model_create(c, "sh", &spec, w, 1), FR_OK);
    assert_int_equal(count_keys(rc, "freshet:{sh/s*"), 0);
    expect_weights(rc, "sh", w, 67);
    spec.shards = 4;
    assert_int_equal(psstore_model_create(c, "sh", &spec, w, 1), FR_OK);
    assert_int_equal(psstore_model_delete(c, "sh"), FR_OK);
    r = raw(rc, "DBSIZE");
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
    /* a cut the layers cannot give */
    spec.shards = 64;
    assert_int_equal(psstore_model_create(c, "sh", &spec, w, 0), FR_ERR_INVAL);
    expect_contains(psstore_conn_error(c), "cut points");
    free(w);
    redisFree(rc);
    psstore_conn_destroy(c);
}

/* Pushes gradient k (seeded) of positions [k, k + 1) through cl. */
static void push_one(psstore_client_t *cl, size_t n, int k, float poison)
{
    float g[67];
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed = 0;
    float w[67];
    assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
    harness_gradient(g, n, 100 + (uint64_t)k);
    g[0] = g[0] * poison;
    assert_int_equal(harness_push_range(cl, g, n, 0, k, k + 1, epoch, version, 5000), FR_OK);
}

/* Waits until the model's version reaches at. */
static void wait_model_version(psstore_conn_t *c, const char *model, int64_t at)
{
    int64_t v = -1;
    for (int waited = 0; waited < 20000 && v < at; waited += 10) {
        assert_int_equal(psstore_model_version(c, model, &v), FR_OK);
        harness_sleep_ms(10);
    }
    assert_true(v >= at);
}

/* The snapshot ids shard k retains, oldest first, into ids; their count. */
static size_t shard_snaps(redisContext *rc, const char *model, int k, int64_t *ids, size_t max)
{
    redisReply *r = raw(rc, "ZRANGE freshet:{%s/s%d}:snaps 0 -1", model, k);
    size_t n = 0;
    for (size_t i = 0; i < r->elements && n < max; i++)
        ids[n++] = strtoll(r->element[i]->str, NULL, 10);
    freeReplyObject(r);
    return n;
}

/* Two shards' appliers: a non-finite gradient is dropped by both (one
 * slice of it is finite); snapshots are taken by shard 0 and followed by
 * shard 1 under the same ids; a rollback restores both from one id. */
static void test_sharded_appliers_decide_snapshot_and_roll_back_alike(void **state)
{
    (void)state;
    char url[400], errstr[512];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/7", R.port);
    psstore_conn_t *c = conn(url);
    redisContext *rc = raw_connect(R.port, 7);
    model_t m;
    float *w = seeded_weights("4-8-3", MODEL_LOSS_SOFTMAX, 6, &m);
    psstore_model_spec_t spec = {"4-8-3", "softmax", m.nparams, 2, NULL}; /* 0..32, 32..67 */
    assert_int_equal(psstore_model_create(c, "sn", &spec, w, 0), FR_OK);
    psstore_applier_conf_t conf;
    psstore_applier_conf_init(&conf);
    conf.url = url;
    conf.model = "sn";
    conf.snapshot_every = 3;
    conf.snapshot_seconds = 0;
    conf.audit = 1;
    harness_applier_t ap[2];
    for (int k = 0; k < 2; k++) {
        conf.shard = k;
        assert_int_equal(harness_applier_start(&ap[k], &conf), 0);
    }
    conf.shard = 2; /* not a shard of it */
    assert_null(psstore_applier_new(&conf, errstr, sizeof(errstr)));
    expect_contains(errstr, "has 2 shards; shard 2 is not one of them");
    psstore_client_t *cl = psstore_client_new(url, "sn", m.nparams, 64, errstr, sizeof(errstr));
    assert_non_null(cl);
    for (int k = 0; k < 4; k++)
        push_one(cl, m.nparams, k, 1.0f);
    /* NaN in shard 0's slice: shard 1's slice is finite, and dropped all the same */
    push_one(cl, m.nparams, 4, NAN);
    for (int k = 5; k < 10; k++)
        push_one(cl, m.nparams, k, 1.0f);
    wait_model_version(c, "sn", 2 * 9);
    redisReply *r = raw(rc, "XRANGE freshet:{sn/s1}:drops - +");
    assert_int_equal(r->elements, 1);
    const redisReply *kv = r->element[0]->element[1];
    int nonfinite = 0;
    for (size_t f = 0; f + 1 < kv->elements; f += 2)
        nonfinite |= strcmp(kv->element[f]->str, "reason") == 0 &&
                     strcmp(kv->element[f + 1]->str, "nonfinite") == 0;
    assert_true(nonfinite);
    freeReplyObject(r);
    /* shard 0 took snapshots at its versions 3, 6, 9; shard 1 follows */
    int64_t ids0[16], ids1[16];
    size_t n0 = shard_snaps(rc, "sn", 0, ids0, 16), n1 = 0;
    for (int waited = 0; waited < 10000; waited += 10) {
        if ((n1 = shard_snaps(rc, "sn", 1, ids1, 16)) == n0)
            break;
        harness_sleep_ms(10);
    }
    assert_int_equal(n0, 3);
    assert_int_equal(ids0[0], 3);
    assert_int_equal(ids0[2], 9);
    assert_int_equal(n1, n0);
    assert_memory_equal(ids1, ids0, n0 * sizeof(int64_t));
    float snap6[67], now[67];
    uint64_t epoch = 0;
    int64_t version = 0;
    assert_int_equal(psstore_snapshot_weights(c, "sn", 6, snap6, m.nparams, &epoch), FR_OK);
    /* what the snapshot serves: each shard's served average of its slice */
    r = raw(rc, "HGET freshet:{sn/s1}:snap:6 avg");
    assert_int_equal(r->len, 35 * sizeof(float));
    assert_memory_equal(r->str, snap6 + 32, r->len);
    freeReplyObject(r);
    /* rollback to 6: both shards restored, each under a new epoch */
    psstore_model_info_t before, after;
    assert_int_equal(psstore_model_info(c, "sn", &before), FR_OK);
    char id[64];
    assert_int_equal(psstore_request_rollback(c, "sn", 6, id), FR_OK);
    assert_int_equal(psstore_request_wait(c, "sn", id, 10000), FR_OK);
    assert_int_equal(psstore_model_info(c, "sn", &after), FR_OK);
    assert_int_equal(after.shard_versions[0], before.shard_versions[0] + 1);
    assert_int_equal(after.shard_versions[1], before.shard_versions[1] + 1);
    assert_true(after.epoch != before.epoch);
    assert_int_equal(psstore_model_weights(c, "sn", now, m.nparams, &epoch, &version), FR_OK);
    assert_memory_equal(now, snap6, sizeof(now));
    /* each shard's offsets are its own part's (each part was taken at that
     * shard's next commit: shard 0's at position 6, the other's wherever
     * shard 1 stood when the request reached it, perhaps before it had
     * applied any gradient: then the part has no offsets, and neither has
     * the shard after the rollback) */
    for (int k = 0; k < 2; k++) {
        r = raw(rc, "HGET freshet:{sn/s%d}:offsets t/0", k);
        redisReply *sr = raw(rc, "HGET freshet:{sn/s%d}:snap:6 offsets", k);
        char want[64] = "";
        if (r->type == REDIS_REPLY_STRING)
            snprintf(want, sizeof(want), "t/0=%s\n", r->str);
        else
            assert_int_equal(k, 1);
        assert_string_equal(sr->str, want);
        if (k == 0)
            assert_string_equal(r->str, "7"); /* gradients 0..6, 4 dropped: version 6 */
        freeReplyObject(sr);
        freeReplyObject(r);
    }
    /* an id one shard lacks is refused before anything is asked */
    freeReplyObject(raw(rc, "DEL freshet:{sn/s1}:snap:3"));
    assert_int_equal(psstore_request_rollback(c, "sn", 3, id), FR_ERR_NOTFOUND);
    expect_contains(psstore_conn_error(c), "shard 1 retains no snapshot 3");
    psstore_client_destroy(cl);
    /* delete with shard 0's applier running and shard 1's stopped: the
     * applier deletes its part, the command the other's, and the last one
     * the model's own keys */
    harness_applier_stop(&ap[1], NULL);
    char *out = NULL;
    assert_int_equal(freshet(&out, 20000, "delete", "--name", "sn", "--yes", "--redis", url, NULL),
                     0);
    expect_contains(out, "deleted model sn (by its running applier)");
    free(out);
    harness_applier_stop(&ap[0], NULL);
    r = raw(rc, "DBSIZE");
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
    free(w);
    redisFree(rc);
    psstore_conn_destroy(c);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_lays_out_every_key_as_designed),
        cmocka_unit_test(test_create_refuses_an_existing_model_unless_forced),
        cmocka_unit_test(test_create_and_delete_refuse_bad_names),
        cmocka_unit_test(test_info_list_and_delete),
        cmocka_unit_test(test_offsets_read_parses_hand_written_values),
        cmocka_unit_test(test_weights_read_is_one_consistent_transaction),
        cmocka_unit_test(test_policy_check_refuses_an_evicting_redis),
        cmocka_unit_test(test_auth_select_and_unix_sockets),
        cmocka_unit_test(test_commands_reconnect_after_a_redis_restart),
        cmocka_unit_test(test_cli_create_show_and_refusals),
        cmocka_unit_test(test_cli_create_from_an_init_file),
        cmocka_unit_test(test_cli_list_and_delete_restore_the_database),
        cmocka_unit_test(test_cli_delete_asks_a_running_applier),
        cmocka_unit_test(test_cli_refuses_bad_names),
        cmocka_unit_test(test_cli_bad_urls_and_unreachable_redis_fail_fast),
        cmocka_unit_test(test_cli_help_and_usage_errors),
        cmocka_unit_test(test_sharded_model_layout_reads_and_delete),
        cmocka_unit_test(test_sharded_appliers_decide_snapshot_and_roll_back_alike),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
