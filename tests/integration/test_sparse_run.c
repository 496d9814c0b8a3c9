/*
 * test_sparse_run.c - freshet run of a sparse model end to end
 * (docs/design.md "Sparse models"): the dev broker (a separate process), a
 * real redis-server, and freshet produce, fit-sparse and run as child
 * processes. With one worker whose in-flight bound makes every gradient
 * fresh, the stream path computes exactly what fit-sparse computes over
 * the same records in the same batches, so the rows and the bias it
 * leaves in Redis must be fit-sparse's table, to float rounding; and the
 * audit must show every position applied once.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "common/common.h"
#include "harness.h"
#include "sparse/sparse.h"

#define SPEC    "fields:39,buckets:2^16,dim:4"
#define TOWER   "fields:39,buckets:2^16,dim:4,tower:16" /* SPEC with a dense tower */
#define SOFTMAX TOWER ",classes:2" /* and a softmax over the clicks' two classes */
#define N       10240 /* 40 batches of 256: one partition under the dev broker's 5 MiB */
#define WAIT_MS 120000

static harness_broker_t broker;
static harness_redis_t redis;
static char tmp_dir[256];

/* DIR/name into out[300]. */
static void path(char *out, const char *name)
{
    snprintf(out, 300, "%s/%s", tmp_dir, name);
}

/*
 * The run's progressive windows (the evals stream, which the dashboard
 * draws) are fit-sparse's: the same records scored by the same table in
 * the same batches, each before the model learned from it. N / 2048 = 5
 * windows, their logloss and AUC as fit-sparse printed them (%.5f, %.4f).
 */
static void progressive_windows_equal_fit_sparse(void)
{
    char fit[300];
    path(fit, "fit-sx1.log");
    FILE *f = fopen(fit, "r");
    assert_non_null(f);
    double loss[8], auc[8];
    int nfit = 0;
    char line[512];
    while (fgets(line, sizeof(line), f) != NULL && nfit < 8) {
        long long k;
        size_t n;
        if (sscanf(line, "window %lld: %zu records, logloss %lf, auc %lf", &k, &n, &loss[nfit],
                   &auc[nfit]) == 4)
            nfit++;
    }
    fclose(f);
    assert_int_equal(nfit, N / 2048);
    redisContext *c = redisConnect("127.0.0.1", redis.port);
    assert_true(c != NULL && c->err == 0);
    redisReply *r = redisCommand(c, "XRANGE freshet:{spr}:evals - +");
    assert_true(r != NULL && r->type == REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, (size_t)nfit);
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *kv = r->element[i]->element[1];
        double l = NAN, a = NAN;
        long long n = 0;
        for (size_t j = 0; j + 1 < kv->elements; j += 2) {
            const char *k = kv->element[j]->str, *v = kv->element[j + 1]->str;
            if (strcmp(k, "loss") == 0)
                l = strtod(v, NULL);
            else if (strcmp(k, "auc") == 0)
                a = strtod(v, NULL);
            else if (strcmp(k, "n") == 0)
                n = strtoll(v, NULL, 10);
        }
        assert_int_equal(n, 2048);
        assert_float_equal(l, loss[i], 0.6e-5);
        assert_float_equal(a, auc[i], 0.6e-4);
    }
    freeReplyObject(r);
    redisFree(c);
}

/* GET path of serve on port as safetensors (200, or the test fails). */
static fr_st_file_t *get_st(int port, const char *url)
{
    char errstr[256];
    harness_resp_t resp;
    harness_http(port, tmp_dir, &resp, "", url);
    if (resp.code != 200)
        fail_msg("GET %s: %d %s", url, resp.code, resp.body);
    fr_st_file_t *st = fr_st_parse((const uint8_t *)resp.body, resp.len, errstr, sizeof(errstr));
    if (st == NULL)
        fail_msg("GET %s: %s", url, errstr);
    harness_resp_free(&resp);
    return st;
}

/* GET url of serve on port answers code, its body holding needle. */
static void get_code(int port, const char *url, int code, const char *needle)
{
    harness_resp_t resp;
    harness_http(port, tmp_dir, &resp, "", url);
    harness_expect(&resp, code, needle);
    harness_resp_free(&resp);
}

/* The table fit-sparse and the runs of the test running use: SPEC, or
 * TOWER where a test says so. */
static const char *table_spec = SPEC;

/* The table of table_spec (FTRL, seed 42, as every run here). */
static void table_of(sparse_spec_t *spec, sparse_optim_t *optim)
{
    char errstr[256];
    if (sparse_spec_parse(table_spec, spec, errstr, sizeof(errstr)) != FR_OK)
        fail_msg("%s", errstr);
    sparse_optim_defaults(optim, SPARSE_OPTIM_FTRL);
    optim->seed = 42;
}

/* After a test that set table_spec, passed or failed: SPEC again. */
static int spec_reset(void **state)
{
    (void)state;
    table_spec = SPEC;
    return 0;
}

/* Floats of a row of table_spec (K + D). */
static size_t rowl(void)
{
    sparse_spec_t spec;
    sparse_optim_t optim;
    table_of(&spec, &optim);
    return sparse_row_len(&spec);
}

/* The store's w:0 of shard 0 (the bias, then the tower): set by
 * served_table_equals_store for served_rows. */
static const redisReply *served_w0;

/* Marks the rows of answer st (its ids and rows tensors) in seen, each
 * checked bit for bit against the store's value; the count of rows new to
 * seen. Its tower (none without one) is the store's, bit for bit. */
static size_t served_rows(const fr_st_file_t *st, const char **stored, uint8_t *seen)
{
    sparse_spec_t spec;
    sparse_optim_t optim;
    table_of(&spec, &optim);
    size_t K = (size_t)sparse_outputs(&spec);
    const fr_st_tensor_t *tower = fr_st_find(st, "tower"), *bias = fr_st_find(st, "bias");
    assert_non_null(bias); /* the biases, and the tower after them */
    assert_int_equal(bias->nbytes, 4 * K);
    assert_memory_equal(bias->data, served_w0->str, 4 * K);
    if ((size_t)served_w0->len == 4 * K) {
        assert_null(tower);
    } else {
        assert_non_null(tower);
        assert_int_equal(tower->nbytes, served_w0->len - 4 * K);
        assert_memory_equal(tower->data, served_w0->str + 4 * K, tower->nbytes);
    }
    const fr_st_tensor_t *ids = fr_st_find(st, "ids"), *rows = fr_st_find(st, "rows");
    assert_true(ids != NULL && rows != NULL);
    size_t n = ids->nbytes / 4, fresh = 0;
    const size_t ROWL = rowl();
    assert_int_equal(rows->nbytes, n * ROWL * 4);
    for (size_t i = 0; i < n; i++) {
        uint32_t row = ((const uint32_t *)ids->data)[i];
        assert_true(row < (1u << 16));
        if (stored[row] == NULL)
            fail_msg("row %u served, not in the store", row);
        assert_memory_equal((const float *)rows->data + i * ROWL, stored[row],
                            ROWL * sizeof(float));
        fresh += seen[row] == 0; /* HSCAN may give a row twice, never miss one */
        seen[row] = 1;
    }
    return fresh;
}

/*
 * freshet serve on the store a run of model (S shards) left (docs/design.md
 * "Serving sparse models"): ready (a sparse model has no weights to load);
 * its table read a page at a time, and its deltas from nothing read until
 * no more is waiting, each hold exactly the store's rows, each once, with
 * the store's parameters bit for bit; the delta ends at the version the
 * table's first page gave, as its next (the shards' versions); /rows gives
 * stored rows and, for rows never written, their initial values.
 */
static void served_table_equals_store(redisContext *c, const char *conf, const char *model, int S)
{
    char lp[300];
    path(lp, "serve.log");
    long from = harness_file_size(lp); /* the log of each call goes on from the last */
    /* port 0: the kernel picks a free one as serve binds it, and serve logs
     * it (a port picked free beforehand could be taken in between) */
    char *argv[] = {
        FRESHET_BIN, "serve", "--config", (char *)conf, "--set", "serve.listen=127.0.0.1:0", NULL};
    pid_t pid = harness_spawn(argv, lp);
    assert_true(pid > 0);
    int port = harness_log_port(lp, from, 30000);
    assert_true(port > 0);
    harness_resp_t resp;
    harness_await_code(port, tmp_dir, &resp, "/readyz", 200, 250, 20);
    assert_int_equal(resp.code, 200);
    harness_resp_free(&resp);
    const char **stored = calloc(1u << 16, sizeof(*stored)); /* row -> its value */
    assert_non_null(stored);
    redisReply *r[S];
    size_t nstored = 0;
    for (int k = 0; k < S; k++) {
        if (S == 1)
            r[k] = redisCommand(c, "HGETALL freshet:{%s}:rows", model);
        else
            r[k] = redisCommand(c, "HGETALL freshet:{%s/s%d}:rows", model, k);
        assert_true(r[k] != NULL && r[k]->type == REDIS_REPLY_ARRAY);
        for (size_t i = 0; i + 1 < r[k]->elements; i += 2) {
            const unsigned char *kb = (const unsigned char *)r[k]->element[i]->str;
            stored[kb[0] | (uint32_t)kb[1] << 8 | (uint32_t)kb[2] << 16 | (uint32_t)kb[3] << 24] =
                r[k]->element[i + 1]->str;
        }
        nstored += r[k]->elements / 2;
    }
    redisReply *w0 = S == 1 ? redisCommand(c, "GET freshet:{%s}:w:0", model)
                            : redisCommand(c, "GET freshet:{%s/s0}:w:0", model);
    assert_true(w0 != NULL && w0->type == REDIS_REPLY_STRING);
    served_w0 = w0;
    uint8_t *seen = calloc(1u << 16, 1);
    assert_non_null(seen);
    size_t distinct = 0, pages = 0;
    char cursor[64] = "0", url[512], first[256] = "";
    do {
        snprintf(url, sizeof(url), "/v2/models/%s/table?count=1000&cursor=%s", model, cursor);
        fr_st_file_t *st = get_st(port, url);
        distinct += served_rows(st, stored, seen);
        if (pages++ == 0)
            snprintf(first, sizeof(first), "%s", fr_st_meta(st, "freshet.next"));
        snprintf(cursor, sizeof(cursor), "%s", fr_st_meta(st, "freshet.cursor"));
        fr_st_destroy(st);
    } while (strcmp(cursor, "0") != 0);
    assert_int_equal(distinct, nstored);
    /* no training since: a delta from nothing ends where the table began */
    memset(seen, 0, 1u << 16);
    distinct = 0;
    char since[256] = "0", more[8];
    do {
        snprintf(url, sizeof(url), "/v2/models/%s/delta?since=%s&max_rows=4000", model, since);
        fr_st_file_t *st = get_st(port, url);
        distinct += served_rows(st, stored, seen);
        assert_int_equal(fr_st_find(st, "tombstones")->nbytes, 0);
        snprintf(since, sizeof(since), "%s", fr_st_meta(st, "freshet.next"));
        snprintf(more, sizeof(more), "%s", fr_st_meta(st, "freshet.more"));
        fr_st_destroy(st);
    } while (strcmp(more, "true") == 0);
    assert_int_equal(distinct, nstored);
    assert_string_equal(since, first);
    assert_int_equal(strchr(since, '.') != NULL, S > 1);
    /* positions of another history: a since beyond the first shard's
     * version, one of another shard count, a cursor of another shard count
     * (410: reload the table); a since that is no list of versions (400) */
    char bad[300];
    snprintf(bad, sizeof(bad), "/v2/models/%s/delta?since=9999999%s", model, S > 1 ? ".0" : "");
    get_code(port, bad, 410, S > 1 ? "on shard 0 is newer" : "is newer than the model's");
    snprintf(bad, sizeof(bad), "/v2/models/%s/delta?since=%s", model, S > 1 ? "5" : "5.5");
    get_code(port, bad, 410, S > 1 ? "since names 1 shard" : "since names 2 shards");
    snprintf(bad, sizeof(bad), "/v2/models/%s/delta?since=1..2", model);
    get_code(port, bad, 400, "is not the next a table page or delta gave");
    snprintf(bad, sizeof(bad), "/v2/models/%s/table?cursor=%s", model, S > 1 ? "17" : "0.17");
    get_code(port, bad, 410, "read its table again from cursor 0");
    /* the epoch a page gave is the model's: the delta from its next is empty */
    snprintf(url, sizeof(url), "/v2/models/%s/table?count=1", model);
    fr_st_file_t *head = get_st(port, url);
    snprintf(bad, sizeof(bad), "/v2/models/%s/delta?since=%s&epoch=%s", model,
             fr_st_meta(head, "freshet.next"), fr_st_meta(head, "freshet.epoch"));
    fr_st_file_t *empty = get_st(port, bad);
    assert_int_equal(fr_st_find(empty, "ids")->nbytes, 0);
    assert_string_equal(fr_st_meta(empty, "freshet.next"), fr_st_meta(head, "freshet.next"));
    fr_st_destroy(empty);
    snprintf(bad, sizeof(bad), "/v2/models/%s/delta?since=%s&epoch=1", model,
             fr_st_meta(head, "freshet.next"));
    get_code(port, bad, 410, "epoch 1 is not the model's");
    fr_st_destroy(head);
    /* a stored row of each shard and a row never written, by id */
    uint32_t ids[3] = {0, 0, 0};
    int have = 0;
    for (uint32_t row = 0; row < (1u << 16) && have < 3; row++) {
        if (have < 2 && stored[row] != NULL && (int)(row % (uint32_t)S) == have % S)
            ids[have++] = row;
        else if (have == 2 && stored[row] == NULL)
            ids[have++] = row;
    }
    assert_int_equal(have, 3);
    snprintf(url, sizeof(url), "/v2/models/%s/rows?ids=%u,%u,%u", model, ids[0], ids[1], ids[2]);
    fr_st_file_t *st = get_st(port, url);
    const fr_st_tensor_t *flags = fr_st_find(st, "stored"), *rows = fr_st_find(st, "rows");
    assert_true(flags != NULL && rows != NULL && flags->nbytes == 12);
    const size_t ROWL = rowl();
    for (int i = 0; i < 3; i++) {
        assert_int_equal(((const uint32_t *)flags->data)[i], i < 2);
        if (i < 2)
            assert_memory_equal((const float *)rows->data + i * ROWL, stored[ids[i]],
                                ROWL * sizeof(float));
        else /* never written: linear weight 0, a seeded embedding */
            assert_float_equal(((const float *)rows->data)[i * ROWL], 0, 0);
    }
    fr_st_destroy(st);
    free(seen);
    free(stored);
    for (int k = 0; k < S; k++)
        freeReplyObject(r[k]);
    freeReplyObject(w0);
    served_w0 = NULL;
    kill(pid, SIGTERM);
    int status = harness_wait(pid, 10000);
    assert_true(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fr_log(FR_LOG_INFO, "served %zu rows of %d shard(s): table in %zu pages, deltas to %s", nstored,
           S, pages, since);
}

/*
 * The rows model left in the store are fit-sparse's table (the file
 * table), bit for bit, and so is its bias; every row the store lacks has
 * in that table its initial value (fit-sparse never stepped it: the run
 * lost no row); with conf, freshet serve of that configuration serves the
 * same table. A model of S > 1 shards: shard k holds the rows r % S == k,
 * shard 0's w:0 is the bias, the others' 0.
 */
static void store_equals_fit_shards(const char *model, int S, const char *table, const char *conf)
{
    char errstr[256];
    sparse_spec_t spec;
    sparse_optim_t optim;
    table_of(&spec, &optim);
    const size_t ROWL = sparse_row_len(&spec), STATEL = sparse_state_len(&spec, &optim);
    const size_t K = (size_t)sparse_outputs(&spec);
    fr_st_file_t *st = fr_st_read_file(table, errstr, sizeof(errstr));
    if (st == NULL)
        fail_msg("%s", errstr);
    const fr_st_tensor_t *rows = fr_st_find(st, "rows"), *bias = fr_st_find(st, "bias");
    assert_non_null(rows);
    assert_non_null(bias);
    assert_int_equal(rows->shape[0], 1 << 16);
    assert_int_equal(rows->shape[1], ROWL);

    redisContext *c = redisConnect("127.0.0.1", redis.port);
    assert_true(c != NULL && c->err == 0);
    size_t nrows = 0;
    uint8_t *held = calloc(1u << 16, 1);
    assert_non_null(held);
    char tag[S][80];
    for (int k = 0; k < S; k++)
        if (S == 1)
            snprintf(tag[k], sizeof(tag[k]), "%s", model);
        else
            snprintf(tag[k], sizeof(tag[k]), "%s/s%d", model, k);
    for (int sh = 0; sh < S; sh++) {
        redisReply *r = redisCommand(c, "HGETALL freshet:{%s}:rows", tag[sh]);
        assert_true(r != NULL && r->type == REDIS_REPLY_ARRAY);
        nrows += r->elements / 2;
        for (size_t i = 0; i + 1 < r->elements; i += 2) {
            const redisReply *k = r->element[i], *v = r->element[i + 1];
            assert_int_equal(k->len, 4);
            assert_int_equal(v->len, (ROWL + STATEL) * sizeof(float)); /* parameters, state */
            const unsigned char *kb = (const unsigned char *)k->str;
            uint32_t row =
                kb[0] | (uint32_t)kb[1] << 8 | (uint32_t)kb[2] << 16 | (uint32_t)kb[3] << 24;
            assert_true(row < (1u << 16));
            assert_int_equal(row % (uint32_t)S, sh);
            held[row] = 1;
            float got[16], want[16];
            assert_true(ROWL <= 16);
            memcpy(got, v->str, ROWL * sizeof(float));
            memcpy(want, (const float *)rows->data + (size_t)row * ROWL, ROWL * sizeof(float));
            for (size_t j = 0; j < ROWL; j++)
                if (memcmp(&got[j], &want[j], sizeof(float)) != 0)
                    fail_msg("row %u [%zu]: store %.9g, fit-sparse %.9g", row, j, got[j], want[j]);
        }
        freeReplyObject(r);
    }
    size_t untouched = 0;
    for (uint32_t row = 0; row < (1u << 16); row++) {
        float init[16], state[32];
        assert_true(STATEL <= 32);
        if (held[row])
            continue;
        sparse_row_init(&spec, &optim, row, init, state);
        if (memcmp(init, (const float *)rows->data + (size_t)row * ROWL, ROWL * sizeof(float)) != 0)
            fail_msg("row %u: fit-sparse stepped it, the store lacks it", row);
        untouched++;
    }
    free(held);
    if (conf != NULL)
        served_table_equals_store(c, conf, model, S);
    float b = 0;
    const fr_st_tensor_t *tower = fr_st_find(st, "tower");
    size_t ntower = sparse_tower_len(&spec);
    assert_int_equal(tower != NULL ? tower->nbytes : 0, ntower * 4);
    assert_int_equal(bias->nbytes, K * 4);
    for (int sh = 0; sh < S; sh++) { /* shard 0's w:0 the biases and the tower, the others' 0 */
        redisReply *r = redisCommand(c, "GET freshet:{%s}:w:0", tag[sh]);
        assert_true(r != NULL && r->type == REDIS_REPLY_STRING);
        assert_int_equal(r->len, sh == 0 ? 4 * (K + ntower) : 4);
        float x;
        memcpy(&x, r->str, 4);
        if (sh == 0)
            assert_memory_equal(r->str, bias->data, K * 4);
        else
            assert_float_equal(x, 0, 0);
        if (sh == 0 && ntower > 0)
            assert_memory_equal(r->str + 4 * K, tower->data, ntower * 4);
        b = sh == 0 ? x : b;
        freeReplyObject(r);
    }
    redisFree(c);
    fr_st_destroy(st);
    fr_log(FR_LOG_INFO,
           "%zu rows in the store are fit-sparse's bit for bit, the %zu others their initial "
           "values in both; bias %.6f",
           nrows, untouched, b);
    assert_true(nrows > 1000);
}

static void store_equals_fit(const char *model, const char *table, const char *conf)
{
    store_equals_fit_shards(model, 1, table, conf);
}

/* Runs freshet with the arguments (NULL-terminated), logging to DIR/log;
 * fails the test, showing the log, unless it exits 0. */
static void freshet_ok(const char *log, ...)
{
    char *argv[32] = {FRESHET_BIN};
    int argc = 1;
    va_list ap;
    va_start(ap, log);
    for (char *a; argc < 31 && (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    char lp[300];
    path(lp, log);
    int status = harness_run(argv, lp, WAIT_MS);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char cmd[400];
        snprintf(cmd, sizeof(cmd), "tail -30 '%s' >&2", lp);
        if (system(cmd) != 0)
            fprintf(stderr, "(no log)\n");
        fail_msg("freshet %s failed (status %d)", argv[1], status);
    }
}

/*
 * N synthetic click records (seed 4) into records[300] (DIR/ctr-<topic>.bin,
 * binary records, each after its length) and fit-sparse over them in
 * batches of 256 (windows of 2048): its table into table[300]
 * (DIR/fit-<topic>.safetensors), its log in DIR/fit-<topic>.log.
 */
static void fit_records(const char *topic, char *records, char *table)
{
    char name[40], limit[16];
    snprintf(name, sizeof(name), "ctr-%s.bin", topic);
    path(records, name);
    snprintf(name, sizeof(name), "fit-%s.safetensors", topic);
    path(table, name);
    snprintf(limit, sizeof(limit), "%d", N);
    freshet_ok("synth.log", "produce", "--synthetic", "ctr", "--seed", "4", "--encode", "binary",
               "--out", records, "--limit", limit, NULL);
    snprintf(name, sizeof(name), "fit-%s.log", topic);
    freshet_ok(name, "fit-sparse", "--sparse", table_spec, "--data", records, "--format", "binary",
               "--batch", "256", "--seed", "42", "--window", "2048", "--out", table, NULL);
}

/* fit_records, and the records sent to topic. */
static void records_and_fit(const char *topic, char *table)
{
    char records[300];
    fit_records(topic, records, table);
    freshet_ok("produce.log", "produce", "--data", records, "--format", "binary", "--encode",
               "binary", "--bootstrap", broker.bootstrap, "--topic", topic, NULL);
}

/*
 * The configuration of a run that fit-sparse's table checks: model on
 * topic, batches of 256 that only a full batch closes, one worker that
 * waits for its last gradient, audit on; extra is appended ("" or more
 * lines of [psstore] or [sparse]).
 */
static void write_fit_conf(const char *conf, const char *model, const char *topic,
                           const char *extra)
{
    FILE *f = fopen(conf, "w");
    assert_non_null(f);
    fprintf(f,
            "[model]\nname = %s\nsparse = %s\nseed = 42\n"
            "[kafka]\nbootstrap.servers = %s\nsession.timeout.ms = 6000\n"
            "heartbeat.interval.ms = 500\n"
            "[ingest]\ntopic = %s\nformat = binary\nbatch = 256\nlinger_ms = 600000\n"
            "[redis]\nurl = %s\n[serve]\nlisten =\n"
            "[trainer]\nworkers = 1\nin_flight = 1\n[psstore]\naudit = true\n%s",
            model, table_spec, broker.bootstrap, topic, redis.url, extra);
    assert_int_equal(fclose(f), 0);
}

static void test_one_worker_run_leaves_fit_sparses_table_and_applies_each_record_once(void **state)
{
    (void)state;
    char table[300], conf[300], limit[16];
    path(conf, "run.conf");
    snprintf(limit, sizeof(limit), "%d", N);
    records_and_fit("sx1", table);

    write_fit_conf(conf, "spr", "sx1", "[sparse]\nwindow = 2048\n");
    freshet_ok("run.log", "run", "--config", conf, "--samples", limit, NULL);
    progressive_windows_equal_fit_sparse();

    store_equals_fit("spr", table, conf);

    /* the rows' layout is the model's: a run whose optimizer (the size of a
     * row's state) or seed (absent rows' values) differs is refused */
    char lp[300];
    path(lp, "refused.log");
    assert_int_equal(harness_command(lp, WAIT_MS, FRESHET_BIN, "run", "--config", conf, "--set",
                                     "sparse.optimizer=adagrad", NULL),
                     2);
    assert_true(harness_file_contains(lp, "optimizer:ftrl;seed:42;init_std:0.01; the "
                                          "configuration says sparse " SPEC ";optimizer:adagrad"));
    assert_int_equal(harness_command(lp, WAIT_MS, FRESHET_BIN, "run", "--config", conf, "--set",
                                     "model.seed=7", NULL),
                     2);

    int seen[N];
    assert_true(harness_audit_count(&redis, "spr", "sx1", 0, "applied", seen, N) == N / 256);
    for (int p = 0; p < N; p++)
        if (seen[p] != 1)
            fail_msg("position %d applied %d times", p, seen[p]);
}

/* The tag of shard k of model's S shards into tag[80] (the model at S = 1). */
static void shard_tag(char *tag, const char *model, int k, int S)
{
    if (S == 1)
        snprintf(tag, 80, "%s", model);
    else
        snprintf(tag, 80, "%s/s%d", model, k);
}

/* The sum of the store's watermarks of topic/0 and topic/1 (a partition's:
 * the least over the S shards), and its version (the sum of the shards'). */
static int64_t watermarks_of(const char *model, int S, const char *topic, int64_t *version)
{
    int64_t sum = 0;
    char out[64], tag[80];
    *version = 0;
    for (int p = 0; p < 2; p++) {
        int64_t least = INT64_MAX;
        for (int k = 0; k < S; k++) {
            shard_tag(tag, model, k, S);
            assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                                 "HGET freshet:{%s}:offsets %s/%d", tag, topic, p),
                             0);
            int64_t w = strcmp(out, "(nil)") == 0 ? 0 : strtoll(out, NULL, 10);
            least = w < least ? w : least;
        }
        sum += least;
    }
    for (int k = 0; k < S; k++) {
        shard_tag(tag, model, k, S);
        assert_int_equal(harness_redis_query(&redis, out, sizeof(out), "GET freshet:{%s}:ver", tag),
                         0);
        *version += strtoll(out, NULL, 10);
    }
    return sum;
}

static int64_t watermarks(const char *model, const char *topic, int64_t *version)
{
    return watermarks_of(model, 1, topic, version);
}

/* Sends n records of the synthetic stream of seed to topic, round robin,
 * as binary records made from its Criteo lines (DIR/<topic>.txt). */
static void preload(const char *topic, const char *seed, int n)
{
    char records[300], name[32], limit[16];
    snprintf(name, sizeof(name), "%s.txt", topic);
    path(records, name);
    snprintf(limit, sizeof(limit), "%d", n);
    freshet_ok("synth.log", "produce", "--synthetic", "ctr", "--seed", seed, "--out", records,
               "--limit", limit, NULL);
    freshet_ok("produce.log", "produce", "--data", records, "--format", "criteo", "--encode",
               "binary", "--bootstrap", broker.bootstrap, "--topic", topic, "--partitions-by",
               "roundrobin", NULL);
}

/* A run of model on topic: 2 workers, batches of 64, audit on, a lease of
 * 1 s and a gap timeout of 3 s (the tests' failures are found fast). */
static void write_conf(const char *conf, const char *model, const char *topic)
{
    FILE *f = fopen(conf, "w");
    assert_non_null(f);
    fprintf(f,
            "[model]\nname = %s\nsparse = " SPEC "\n"
            "[kafka]\nbootstrap.servers = %s\nsession.timeout.ms = 6000\n"
            "heartbeat.interval.ms = 500\n"
            "[ingest]\ntopic = %s\nformat = binary\nbatch = 64\n"
            "[redis]\nurl = %s\n[serve]\nlisten =\n"
            "[trainer]\nworkers = 2\n[psstore]\naudit = true\nlease_ms = 1000\ngap_timeout = 3\n",
            model, broker.bootstrap, topic, redis.url);
    assert_int_equal(fclose(f), 0);
}

/* Asserts that every position [0, per) of topic/0 and topic/1 was applied
 * exactly once by each of model's S shards. */
static void assert_once_of(const char *model, int S, const char *topic, int per)
{
    int *seen = calloc((size_t)per, sizeof(int));
    assert_non_null(seen);
    for (int k = 0; k < S; k++) {
        char tag[80];
        shard_tag(tag, model, k, S);
        for (int p = 0; p < 2; p++) {
            assert_true(harness_audit_count(&redis, tag, topic, p, NULL, seen, per) > 0);
            for (int x = 0; x < per; x++)
                if (seen[x] != 1)
                    fail_msg("%s: %s/%d position %d applied %d times", tag, topic, p, x, seen[x]);
        }
    }
    free(seen);
}

static void assert_once(const char *model, const char *topic, int per)
{
    assert_once_of(model, 1, topic, per);
}

/*
 * Exactly once across a SIGKILL: two workers train from two partitions;
 * the run is killed while it trains and started again. Every position
 * of both partitions ends applied exactly once (the audit is written in
 * the commit that writes the rows and the offsets, so what the kill lost
 * was never recorded, and is read and applied again).
 */
static void killed_run_applies_every_record_once(const char *model, int S, const char *topic,
                                                 const char *seed)
{
    enum { PER = 8000 };
    char conf[300], log[300], name[32];
    snprintf(name, sizeof(name), "kill-%.12s.conf", model);
    path(conf, name);
    preload(topic, seed, 2 * PER);
    write_conf(conf, model, topic);
    FILE *f = fopen(conf, "a"); /* still in [psstore] */
    assert_non_null(f);
    fprintf(f, "shards = %d\n", S);
    assert_int_equal(fclose(f), 0);
    char *argv[] = {FRESHET_BIN, "run", "--config", conf, NULL};
    snprintf(name, sizeof(name), "kill1-%.12s.log", model);
    path(log, name);
    pid_t pid = harness_spawn(argv, log);
    assert_true(pid > 0);
    int64_t version = 0, at_kill = 0, v_kill = 0;
    for (int i = 0; i < 600 && version < 40 * S; i++) {
        harness_sleep_ms(50);
        watermarks_of(model, S, topic, &version);
    }
    assert_true(version >= 40 * S);
    at_kill = watermarks_of(model, S, topic, &v_kill);
    assert_int_equal(kill(pid, SIGKILL), 0);
    harness_wait(pid, 5000);
    snprintf(name, sizeof(name), "kill2-%.12s.log", model);
    path(log, name);
    pid = harness_spawn(argv, log);
    assert_true(pid > 0);
    for (int i = 0; i < WAIT_MS / 100 && watermarks_of(model, S, topic, &version) < 2 * PER; i++)
        harness_sleep_ms(100);
    assert_int_equal(watermarks_of(model, S, topic, &version), 2 * PER);
    assert_int_equal(kill(pid, SIGTERM), 0);
    int status = harness_wait(pid, 20000);
    assert_true(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_once_of(model, S, topic, PER);
    fr_log(FR_LOG_INFO,
           "%d shard(s): killed at version %lld with %lld of %d positions committed; each "
           "applied once on every shard, version %lld at the end",
           S, (long long)v_kill, (long long)at_kill, 2 * PER, (long long)version);
}

static void test_a_killed_sparse_run_applies_every_record_once(void **state)
{
    (void)state;
    killed_run_applies_every_record_once("spk", 1, "sx2", "6");
}

/* The same at 2 shards: each shard's applier commits its rows with its
 * own offsets, and each applies every position once. */
static void test_a_killed_run_of_two_shards_applies_every_record_once_on_each(void **state)
{
    (void)state;
    killed_run_applies_every_record_once("spk2", 2, "sx6", "7");
}

/* Sends records [from, to) of the binary records file (each after its
 * length, 4 bytes LE) to topic, through a file of that part. */
static void produce_part(const char *records, const char *topic, int from, int to)
{
    char part[300], name[40];
    snprintf(name, sizeof(name), "part-%s-%d.bin", topic, from);
    path(part, name);
    FILE *in = fopen(records, "rb"), *out = fopen(part, "wb");
    assert_true(in != NULL && out != NULL);
    unsigned char len[4], buf[4096];
    for (int k = 0; k < to && fread(len, 1, 4, in) == 4; k++) {
        size_t n = len[0] | (size_t)len[1] << 8 | (size_t)len[2] << 16 | (size_t)len[3] << 24;
        assert_true(n <= sizeof(buf));
        assert_int_equal(fread(buf, 1, n, in), n);
        if (k >= from) {
            assert_int_equal(fwrite(len, 1, 4, out), 4);
            assert_int_equal(fwrite(buf, 1, n, out), n);
        }
    }
    fclose(in);
    assert_int_equal(fclose(out), 0);
    freshet_ok("produce.log", "produce", "--data", part, "--format", "binary", "--encode", "binary",
               "--bootstrap", broker.bootstrap, "--topic", topic, NULL);
}

/* Waits until the store's watermark of topic (one partition) is at, or
 * fails. */
static void await_watermark(const char *model, const char *topic, int64_t at)
{
    int64_t version = 0;
    for (int i = 0; i < WAIT_MS / 50 && watermarks(model, topic, &version) < at; i++)
        harness_sleep_ms(50);
    assert_int_equal(watermarks(model, topic, &version), at);
}

/*
 * Exactly once from the weights across a SIGKILL at each point of a
 * window's life in the store written behind (docs/design.md "The store
 * written behind"): one worker trains fit-sparse's records, produced in
 * three parts, and is killed (1) idle after its last window was written;
 * (2) with the second part applied to its table in memory, its window not
 * yet closed ([psstore] commit_ms 39 s: the progress lines, every 5 s, say
 * what was decided long before), after a SIGTERM whose last commit Redis
 * (stopped) has not answered; then it trains the rest (its lease, 120 s,
 * made to lapse at once: PEXPIRE, as the clock would).
 * The rows the store holds end as fit-sparse's table bit for bit: a record
 * lost or applied twice would move the rows it names (one batch of 256
 * sent twice fails it).
 */
static void test_a_run_killed_in_its_windows_leaves_fit_sparses_table(void **state)
{
    (void)state;
    enum { PART1 = 10 * 256, PART2 = 24 * 256 };
    char records[300], table[300], conf[300], log[300];
    fit_records("sx10", records, table);
    path(conf, "killfit.conf");
    write_fit_conf(conf, "spkf", "sx10", "lease_ms = 1000\n[sparse]\nwindow = 2048\n");
    char *argv[] = {FRESHET_BIN, "run", "--config", conf, NULL};
    char *held[] = {FRESHET_BIN, "run",
                    "--config",  conf,
                    "--set",     "psstore.commit_ms=39000",
                    "--set",     "psstore.lease_ms=120000",
                    NULL};

    produce_part(records, "sx10", 0, PART1);
    path(log, "killfit1.log");
    pid_t pid = harness_spawn(argv, log);
    assert_true(pid > 0);
    await_watermark("spkf", "sx10", PART1);
    harness_sleep_ms(200);
    assert_int_equal(kill(pid, SIGKILL), 0); /* (1) idle, its windows written */
    harness_wait(pid, 5000);

    path(log, "killfit2.log");
    pid = harness_spawn(held, log);
    assert_true(pid > 0);
    if (harness_await_file(log, "sx10/0 starts at 2560", 1, 60000) != 0) {
        char cmd[400];
        snprintf(cmd, sizeof(cmd), "tail -20 '%s' >&2", log);
        if (system(cmd) != 0)
            fprintf(stderr, "(no log)\n");
        fail_msg("the run did not start at the first part's end");
    }
    produce_part(records, "sx10", PART1, PART2);
    /* its progress line (every 5 s) counts the part's gradients decided */
    long decided = -1;
    for (int i = 0; i < 200 && decided < (PART2 - PART1) / 256; i++) {
        harness_sleep_ms(100);
        decided = harness_progress_applied(log, 0);
    }
    assert_int_equal(decided, (PART2 - PART1) / 256);
    int64_t version = 0;
    assert_int_equal(watermarks("spkf", "sx10", &version), PART1); /* nothing written */
    kill(redis.pid, SIGSTOP);
    int sent = kill(pid, SIGTERM); /* its last commit, to a stopped Redis */
    harness_sleep_ms(500);
    int killed = kill(pid, SIGKILL); /* (2) */
    harness_wait(pid, 5000);
    kill(redis.pid, SIGCONT); /* before any check: the next tests need Redis */
    assert_int_equal(sent, 0);
    assert_int_equal(killed, 0);
    harness_sleep_ms(200);
    int64_t at_kill = watermarks("spkf", "sx10", &version);
    char out[64];
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "PEXPIRE freshet:{spkf}:lease 1"), 0);

    path(log, "killfit3.log");
    pid = harness_spawn(argv, log);
    assert_true(pid > 0);
    produce_part(records, "sx10", PART2, N);
    await_watermark("spkf", "sx10", N);
    assert_int_equal(kill(pid, SIGTERM), 0);
    int status = harness_wait(pid, 20000);
    assert_true(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fr_log(FR_LOG_INFO,
           "killed idle at %d records, then with %ld gradients decided in memory and %lld of %d "
           "records committed once Redis answered again",
           PART1, decided, (long long)at_kill, PART2);
    store_equals_fit("spkf", table, NULL);
    int seen[N];
    assert_true(harness_audit_count(&redis, "spkf", "sx10", 0, "applied", seen, N) > 0);
    for (int p = 0; p < N; p++)
        if (seen[p] != 1)
            fail_msg("position %d applied %d times", p, seen[p]);
}

/*
 * Two runs of one model sharing the topic through the consumer group
 * ([ingest] assignment = group; a run alone takes the whole topic): one
 * applier holds the lease, the other is a standby whose workers read and
 * wait through the store (their process's applier decides nothing). Both
 * train their share of the partitions, and every position is applied once;
 * a standby's workers that waited on their own applier would spend 5 s a
 * batch and miss the deadline.
 */
static void test_two_sparse_runs_share_the_topic_and_apply_each_record_once(void **state)
{
    (void)state;
    enum { PER = 6000 };
    char conf[300], log[2][300];
    path(conf, "two.conf");
    preload("sx3", "8", 2 * PER);
    write_conf(conf, "sp2", "sx3");
    char *argv[] = {FRESHET_BIN, "run", "--config", conf, "--set", "ingest.assignment=group", NULL};
    pid_t pid[2];
    for (int k = 0; k < 2; k++) {
        char name[32];
        snprintf(name, sizeof(name), "two%d.log", k);
        path(log[k], name);
        pid[k] = harness_spawn(argv, log[k]);
        assert_true(pid[k] > 0);
    }
    int64_t version = 0;
    for (int i = 0; i < WAIT_MS / 100 && watermarks("sp2", "sx3", &version) < 2 * PER; i++)
        harness_sleep_ms(100);
    assert_int_equal(watermarks("sp2", "sx3", &version), 2 * PER);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(kill(pid[k], SIGTERM), 0);
        int status = harness_wait(pid[k], 20000);
        assert_true(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    assert_once("sp2", "sx3", PER);
    /* both trained: the versions stream names each applied gradient's worker,
     * <host>/<pid>/<n> */
    int pushed[2] = {0, 0};
    redisContext *c = redisConnect("127.0.0.1", redis.port);
    assert_true(c != NULL && c->err == 0);
    redisReply *r = redisCommand(c, "XRANGE freshet:{sp2}:versions - +");
    assert_true(r != NULL && r->type == REDIS_REPLY_ARRAY);
    for (size_t e = 0; e < r->elements; e++) {
        const redisReply *kv = r->element[e]->element[1];
        for (size_t f = 0; f + 1 < kv->elements; f += 2)
            for (int k = 0; k < 2; k++) {
                char mark[32];
                snprintf(mark, sizeof(mark), "/%d/", (int)pid[k]);
                if (strcmp(kv->element[f]->str, "worker") == 0 &&
                    strstr(kv->element[f + 1]->str, mark) != NULL)
                    pushed[k]++;
            }
    }
    freeReplyObject(r);
    redisFree(c);
    fr_log(FR_LOG_INFO,
           "two runs applied every position of %d once, version %lld; their gradients: %d and %d",
           2 * PER, (long long)version, pushed[0], pushed[1]);
    assert_true(pushed[0] > 0 && pushed[1] > 0);
}

/*
 * freshet ps and freshet train apart (the applier in one process, the
 * consumer and a worker in another, through Redis; the worker waits for
 * each gradient's commit): the store ends with fit-sparse's table over the
 * same records in the same batches, every record applied once.
 */
static void apart_leave_fit_sparses_table(const char *model, int S, const char *topic)
{
    char table[300], conf[300], lps[2][300], ltr[300], name[32];
    snprintf(name, sizeof(name), "split-%.12s.conf", model);
    path(conf, name);
    snprintf(name, sizeof(name), "train-%.12s.log", model);
    path(ltr, name);
    records_and_fit(topic, table);
    write_fit_conf(conf, model, topic, S > 1 ? "shards = 2\n" : "");
    /* at 2 shards an applier process each (ps --shards k) */
    pid_t ps[2] = {0, 0};
    for (int k = 0; k < S; k++) {
        char list[16];
        snprintf(list, sizeof(list), "%d", k);
        snprintf(name, sizeof(name), "ps%d-%.12s.log", k, model);
        path(lps[k], name);
        char *one[] = {FRESHET_BIN, "ps", "--config", conf, NULL};
        char *some[] = {FRESHET_BIN, "ps", "--config", conf, "--shards", list, NULL};
        ps[k] = harness_spawn(S > 1 ? some : one, lps[k]);
        assert_true(ps[k] > 0);
    }
    char *train_argv[] = {FRESHET_BIN, "train", "--config", conf, NULL};
    pid_t train = harness_spawn(train_argv, ltr);
    assert_true(train > 0);
    int64_t version = 0, applied = 0;
    for (int i = 0; i < 1200 && applied < N; i++) { /* 60 s at most */
        harness_sleep_ms(50);
        applied = watermarks_of(model, S, topic, &version);
    }
    if (applied != N) { /* what the processes said */
        char cmd[1000];
        snprintf(cmd, sizeof(cmd), "tail -n 15 '%s' '%s' %s%s%s >&2", ltr, lps[0], S > 1 ? "'" : "",
                 S > 1 ? lps[1] : "", S > 1 ? "'" : "");
        if (system(cmd) != 0)
            fprintf(stderr, "(no logs)\n");
    }
    assert_int_equal(applied, N);
    kill(train, SIGTERM);
    int st = harness_wait(train, 20000);
    assert_true(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_true(harness_file_contains(ltr, "its appliers run in freshet ps"));
    for (int k = 0; k < S; k++) {
        kill(ps[k], SIGTERM);
        st = harness_wait(ps[k], 20000);
        assert_true(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
        char says[64];
        snprintf(says, sizeof(says), "1 applier(s) of sparse model %s", model);
        assert_true(harness_file_contains(lps[k], says));
    }
    store_equals_fit_shards(model, S, table, NULL);
    for (int k = 0; k < S; k++) {
        char tag[80];
        shard_tag(tag, model, k, S);
        int seen[N];
        assert_true(harness_audit_count(&redis, tag, topic, 0, "applied", seen, N) == N / 256);
        for (int p = 0; p < N; p++)
            if (seen[p] != 1)
                fail_msg("%s: position %d applied %d times", tag, p, seen[p]);
    }
}

static void test_ps_and_train_apart_leave_fit_sparses_table(void **state)
{
    (void)state;
    apart_leave_fit_sparses_table("spl", 1, "sx9");
}

/* The same at 2 shards, each shard's applier in a freshet ps of its own
 * (--shards 0, --shards 1): the workers pull every shard's rows from the
 * store, both shards' transactions in flight at once. The model is a
 * softmax over the clicks' two classes with a tower (docs/design.md "The
 * dense tower"): two linear weights a row, two biases with the tower in
 * shard 0's w:0, pulled from the store. */
static void test_two_shards_apart_in_three_processes_leave_fit_sparses_table(void **state)
{
    (void)state;
    table_spec = SOFTMAX;
    apart_leave_fit_sparses_table("spl2", 2, "sx7");
}

/*
 * A model of 2 shards (docs/design.md "Sparse models on shards") with a
 * dense tower (docs/design.md "The dense tower"): one worker pushes each
 * shard the gradient of its rows, and shard 0 the dense part's, each
 * shard's applier steps them, and the two shards together hold
 * fit-sparse's table, bias and tower over the same records in the same
 * batches, each row on its shard; every position applied once on each
 * shard; serve's table and deltas carry the tower.
 */
static void test_two_shards_hold_fit_sparses_table_and_apply_each_record_once(void **state)
{
    (void)state;
    table_spec = TOWER;
    char table[300], conf[300], limit[16];
    path(conf, "shards.conf");
    snprintf(limit, sizeof(limit), "%d", N);
    records_and_fit("sx5", table);
    write_fit_conf(conf, "sps", "sx5", "shards = 2\n");
    freshet_ok("shards.log", "run", "--config", conf, "--samples", limit, NULL);
    store_equals_fit_shards("sps", 2, table, conf);
    for (int k = 0; k < 2; k++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "sps/s%d", k);
        int seen[N];
        assert_true(harness_audit_count(&redis, tag, "sx5", 0, "applied", seen, N) == N / 256);
        for (int p = 0; p < N; p++)
            if (seen[p] != 1)
                fail_msg("shard %d: position %d applied %d times", k, p, seen[p]);
    }
}

/*
 * The synthetic stream sent straight to Kafka carries each record's
 * planted click probability (its freshet-p header): a run's progressive
 * windows get their Bayes floor, and over the whole windows it is the
 * floor freshet produce printed for the same records.
 */
static void test_progressive_windows_carry_the_generators_floor(void **state)
{
    (void)state;
    char conf[300], log[300], limit[16];
    path(conf, "floor.conf");
    path(log, "produce-floor.log");
    snprintf(limit, sizeof(limit), "%d", 4096);
    freshet_ok("produce-floor.log", "produce", "--synthetic", "ctr", "--seed", "5", "--limit",
               limit, "--encode", "binary", "--bootstrap", broker.bootstrap, "--topic", "sx8",
               NULL);
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    char line[512];
    double floor = NAN;
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *at = strstr(line, "Bayes-optimal logloss ");
        if (strncmp(line, "synthetic ctr: 4096 records", 27) == 0 && at != NULL)
            floor = strtod(at + strlen("Bayes-optimal logloss "), NULL);
    }
    fclose(f);
    assert_true(floor > 0.05 && floor < 0.3);
    write_conf(conf, "spf", "sx8");
    f = fopen(conf, "a");
    assert_non_null(f);
    fprintf(f, "[sparse]\nwindow = 2048\n");
    assert_int_equal(fclose(f), 0);
    freshet_ok("run-floor.log", "run", "--config", conf, "--samples", limit, NULL);
    redisContext *c = redisConnect("127.0.0.1", redis.port);
    assert_true(c != NULL && c->err == 0);
    redisReply *r = redisCommand(c, "XRANGE freshet:{spf}:evals - +");
    assert_true(r != NULL && r->type == REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, 2);
    double sum = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *kv = r->element[i]->element[1];
        double fl = NAN;
        for (size_t j = 0; j + 1 < kv->elements; j += 2)
            if (strcmp(kv->element[j]->str, "floor") == 0)
                fl = strtod(kv->element[j + 1]->str, NULL);
        assert_true(fl > 0.05 && fl < 0.3);
        sum += fl;
    }
    assert_float_equal(sum / 2, floor, 0.6e-5); /* produce prints %.5f */
    freeReplyObject(r);
    redisFree(c);
}

static int setup(void **state)
{
    (void)state;
    return harness_stack_start(
        tmp_dir, "sparse", &redis, &broker, FRESHET_BIN,
        "--topic sx1:1 --topic sx2:2 --topic sx3:2 --topic sx5:1 --topic sx6:2 --topic sx7:1 "
        "--topic sx8:2 "
        "--topic sx9:1 --topic sx10:1");
}

static int teardown(void **state)
{
    (void)state;
    return harness_stack_stop(tmp_dir, &redis, &broker);
}

int main(void)
{
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_worker_run_leaves_fit_sparses_table_and_applies_each_record_once),
        cmocka_unit_test(test_a_killed_sparse_run_applies_every_record_once),
        cmocka_unit_test(test_a_killed_run_of_two_shards_applies_every_record_once_on_each),
        cmocka_unit_test(test_a_run_killed_in_its_windows_leaves_fit_sparses_table),
        cmocka_unit_test_teardown(test_two_shards_hold_fit_sparses_table_and_apply_each_record_once,
                                  spec_reset),
        cmocka_unit_test(test_two_sparse_runs_share_the_topic_and_apply_each_record_once),
        cmocka_unit_test(test_ps_and_train_apart_leave_fit_sparses_table),
        cmocka_unit_test_teardown(test_two_shards_apart_in_three_processes_leave_fit_sparses_table,
                                  spec_reset),
        cmocka_unit_test(test_progressive_windows_carry_the_generators_floor),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
