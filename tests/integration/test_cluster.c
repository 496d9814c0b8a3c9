/*
 * test_cluster.c - the parameter store on a real Redis Cluster: 3 masters
 * and 3 replicas (redis-server --cluster-enabled, joined by redis-cli
 * --cluster create) started by the harness, and the dev broker.
 *
 * The connection routes every command to the master of its key's slot
 * (docs/design.md "Redis Cluster"): the slots must be Redis's own, models
 * spread over the masters must all be found, a half-migrated slot must be
 * read through ASK, [redis] wait_replicas must count the commits no
 * replica acknowledged, and `freshet run` must apply every Kafka position
 * exactly once through a master's SIGKILL (its replica takes over) and
 * through a migration of the model's slot while it trains.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "harness.h"
#include "ingest/ingest.h"
#include "psstore/psstore.h"

#define D       3
#define WAIT_MS 120000
#define NPARTS  4
#define PER     2500 /* records a partition */

static harness_cluster_t cluster;
static harness_broker_t broker;
static char tmp_dir[256];
static char errstr[512];

static psstore_conn_t *conn_to(const char *url)
{
    psstore_conn_t *c = psstore_conn_new(url, 5000, errstr, sizeof(errstr));
    if (c == NULL)
        fail_msg("%s", errstr);
    return c;
}

/* A running master other than node `not`, or -1. */
static int other_master(int not_node)
{
    return harness_cluster_other_master(&cluster, not_node);
}

/* ------------------------------------------------------------------------
 * The connection
 * ---------------------------------------------------------------------- */

/* psstore_key_slot against CLUSTER KEYSLOT for keys with and without hash
 * tags, the empty tag and nested braces among them. */
static void test_slots_agree_with_redis(void **state)
{
    (void)state;
    const char *forms[] = {
        "freshet:{m%d}:meta", "plain%d", "{}x%d", "a{b%d}c{d}", "x{%d", "}%d{", "{{%d}}",
        "freshet:{m}:w:%d"};
    for (size_t f = 0; f < sizeof(forms) / sizeof(forms[0]); f++) {
        for (int i = 0; i < 40; i++) {
            char key[64], out[64];
            snprintf(key, sizeof(key), forms[f], i);
            assert_int_equal(
                harness_redis_query(&cluster.node[0], out, sizeof(out), "CLUSTER KEYSLOT %s", key),
                0);
            if (psstore_key_slot(key, strlen(key)) != atoi(out))
                fail_msg("slot of '%s': %d, redis says %s", key, psstore_key_slot(key, strlen(key)),
                         out);
        }
    }
}

/*
 * Through a connection seeded with one node only, models land on the
 * master of their slot (checked on that server), all of them are listed
 * although they live on three masters, and their weights read back.
 */
static void test_models_spread_over_the_masters_and_are_all_found(void **state)
{
    (void)state;
    enum { MODELS = 12, N = 13 };
    char seed[64];
    snprintf(seed, sizeof(seed), "redis://127.0.0.1:%d", cluster.node[cluster.n - 1].port);
    psstore_conn_t *c = conn_to(seed);
    assert_int_equal(psstore_conn_is_cluster(c), 1);
    int on_master[HARNESS_CLUSTER_MAX] = {0};
    for (int m = 0; m < MODELS; m++) {
        char name[32], key[96], out[64];
        snprintf(name, sizeof(name), "spread%d", m);
        float w[N];
        harness_gradient(w, N, 100 + (uint64_t)m);
        psstore_model_spec_t spec = {"3-3-1", "mse", N, 1, NULL};
        if (psstore_model_create(c, name, &spec, w, 1) != FR_OK)
            fail_msg("create %s: %s", name, psstore_conn_error(c));
        snprintf(key, sizeof(key), "freshet:{%s}:meta", name);
        int owner = harness_cluster_owner(&cluster, key);
        assert_true(owner >= 0);
        assert_int_equal(
            harness_redis_query(&cluster.node[owner], out, sizeof(out), "EXISTS %s", key), 0);
        assert_string_equal(out, "1");
        on_master[owner]++;
        float back[N];
        uint64_t epoch;
        int64_t version;
        assert_int_equal(psstore_model_weights(c, name, back, N, &epoch, &version), FR_OK);
        assert_memory_equal(back, w, sizeof(w));
        assert_int_equal(version, 0);
        /* where it lives, as model show says it */
        psstore_model_info_t info;
        assert_int_equal(psstore_model_info(c, name, &info), FR_OK);
        char node[64];
        snprintf(node, sizeof(node), "127.0.0.1:%d", cluster.node[owner].port);
        assert_string_equal(info.node, node);
        assert_int_equal(
            harness_redis_query(&cluster.node[0], out, sizeof(out), "CLUSTER KEYSLOT %s", key), 0);
        assert_int_equal(info.slot, atoi(out));
    }
    int masters = 0;
    for (int i = 0; i < cluster.n; i++)
        masters += on_master[i] > 0;
    assert_true(masters >= 2); /* 12 names over 3 masters: never all on one */
    char **names;
    size_t n;
    assert_int_equal(psstore_model_list(c, &names, &n), FR_OK);
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        found += strncmp(names[i], "spread", 6) == 0;
        free(names[i]);
    }
    free(names);
    assert_int_equal(found, MODELS);
    psstore_conn_destroy(c);
}

/*
 * A slot half-way through a migration: the offsets hash already moved to
 * the target, the rest still on the source. A read of the offsets is
 * answered ASK by the source and followed; once the slot is the target's,
 * the same connection follows MOVED. Nothing is read wrong either way.
 */
static void test_reads_follow_ask_and_moved_during_a_migration(void **state)
{
    (void)state;
    const char *model = "migr";
    psstore_conn_t *c = conn_to(cluster.url);
    float w[4] = {1, 2, 3, 4};
    psstore_model_spec_t spec = {"3-1", "mse", 4, 1, NULL};
    assert_int_equal(psstore_model_create(c, model, &spec, w, 1), FR_OK);
    char meta[64], offsets[64], out[256], src_id[41], dst_id[41], cmd[200];
    snprintf(meta, sizeof(meta), "freshet:{%s}:meta", model);
    snprintf(offsets, sizeof(offsets), "freshet:{%s}:offsets", model);
    int from = harness_cluster_owner(&cluster, meta), to = other_master(from);
    assert_true(from >= 0 && to >= 0);
    assert_int_equal(harness_redis_query(&cluster.node[from], out, sizeof(out),
                                         "HSET %s t/0 17 t/1 5;8-9", offsets),
                     0);
    assert_int_equal(harness_cluster_node_id(&cluster, from, src_id), 0);
    assert_int_equal(harness_cluster_node_id(&cluster, to, dst_id), 0);
    int slot = psstore_key_slot(meta, strlen(meta));
    snprintf(cmd, sizeof(cmd), "CLUSTER SETSLOT %d IMPORTING %s", slot, src_id);
    harness_redis_query(&cluster.node[to], out, sizeof(out), cmd);
    assert_string_equal(out, "OK");
    snprintf(cmd, sizeof(cmd), "CLUSTER SETSLOT %d MIGRATING %s", slot, dst_id);
    harness_redis_query(&cluster.node[from], out, sizeof(out), cmd);
    assert_string_equal(out, "OK");
    snprintf(cmd, sizeof(cmd), "MIGRATE 127.0.0.1 %d %s 0 5000", cluster.node[to].port, offsets);
    harness_redis_query(&cluster.node[from], out, sizeof(out), cmd);
    assert_string_equal(out, "OK");

    psstore_partition_offsets_t po;
    int found = 0;
    psstore_poff_init(&po, 0);
    assert_int_equal(psstore_offsets_read(c, model, "t", 1, &po, &found), FR_OK); /* ASK */
    assert_int_equal(found, 1);
    assert_int_equal(po.watermark, 5);
    assert_int_equal(po.nspans, 1);
    assert_int_equal(po.spans[0].from, 8);
    assert_int_equal(po.spans[0].to, 9);
    /* so does the read of many partitions (the consumer's tick), a command a shard */
    const int32_t parts[] = {1, 0};
    psstore_partition_offsets_t many[2];
    int found_many[2];
    psstore_poff_init(&many[0], 0);
    psstore_poff_init(&many[1], 0);
    assert_int_equal(psstore_offsets_read_many(c, model, "t", parts, 2, many, found_many), FR_OK);
    assert_true(found_many[0] && many[0].watermark == 5 && many[0].nspans == 1);
    assert_true(found_many[1] && many[1].watermark == 17 && many[1].nspans == 0);
    psstore_poff_fini(&many[0]);
    psstore_poff_fini(&many[1]);
    /* a transaction over the half-moved slot is refused (ASK inside
     * MULTI aborts it) and reported as a broken connection: callers retry */
    psstore_model_info_t info;
    assert_int_equal(psstore_model_info(c, model, &info), FR_ERR_REDIS);
    assert_non_null(strstr(psstore_conn_error(c), "the cluster's map changed"));

    assert_int_equal(harness_cluster_migrate(&cluster, meta, to, 0), 0);
    assert_int_equal(psstore_offsets_read(c, model, "t", 0, &po, &found), FR_OK); /* MOVED */
    assert_int_equal(found, 1);
    assert_int_equal(po.watermark, 17);
    float back[4];
    uint64_t epoch;
    int64_t version;
    assert_int_equal(psstore_model_weights(c, model, back, 4, &epoch, &version), FR_OK);
    assert_memory_equal(back, w, sizeof(w));
    assert_int_equal(psstore_model_info(c, model, &info), FR_OK);
    assert_int_equal(info.bytes, sizeof(w));
    psstore_poff_fini(&po);
    psstore_conn_destroy(c);
}

/* A URL naming several hosts of what is no cluster is refused, naming
 * the host; so is a database other than 0 on a cluster (by Redis). Of
 * several seeds the first that answers is used. */
static void test_a_cluster_url_is_checked(void **state)
{
    (void)state;
    harness_redis_t single;
    assert_int_equal(harness_redis_start(&single, NULL), 0);
    char url[200];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d,127.0.0.1:%d", single.port,
             cluster.node[0].port);
    assert_null(psstore_conn_new(url, 2000, errstr, sizeof(errstr)));
    assert_non_null(strstr(errstr, "this Redis is no cluster"));
    psstore_conn_t *c = conn_to(single.url);
    assert_int_equal(psstore_conn_is_cluster(c), 0);
    psstore_conn_destroy(c);
    /* a seed that is down: the next one answers */
    int held, down = harness_closed_port(&held); /* no other process can listen there meanwhile */
    assert_true(down > 0);
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d,127.0.0.1:%d", down, cluster.node[1].port);
    c = conn_to(url);
    assert_int_equal(psstore_conn_is_cluster(c), 1);
    psstore_conn_destroy(c);
    close(held);
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/2", cluster.node[0].port);
    assert_null(psstore_conn_new(url, 2000, errstr, sizeof(errstr)));
    assert_non_null(strstr(errstr, "SELECT is not allowed in cluster mode"));
    harness_redis_stop(&single);
}

/* Pushes gradients k in [from, to) of model (positions k of t/0) and
 * waits until the applier a has applied them all. */
static void push_and_apply(psstore_client_t *cl, psstore_applier_t *a, int from, int to)
{
    float w[4], g[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed;
    for (int k = from; k < to; k++) {
        assert_int_equal(psstore_pull(cl, w, &epoch, &version, &changed), FR_OK);
        assert_int_equal(harness_push_range(cl, g, 4, 0, k, k + 1, epoch, version, 10000), FR_OK);
    }
    psstore_applier_stats_t st;
    for (int waited = 0; waited < 20000; waited += 10) {
        psstore_applier_stats(a, &st);
        if (st.version >= to)
            return;
        harness_sleep_ms(10);
    }
    fail_msg("the applier reached version %lld, not %d", (long long)st.version, to);
}

/*
 * [redis] wait_replicas = 1: with the replica of the model's master up,
 * every commit reaches it; with the replica stopped, every commit waits
 * wait_timeout_ms and is counted unreplicated, one for one.
 */
static void test_wait_replicas_counts_commits_no_replica_holds(void **state)
{
    (void)state;
    const char *model = "waitr";
    psstore_conn_t *c = conn_to(cluster.url);
    float w[4] = {0};
    psstore_model_spec_t spec = {"3-1", "mse", 4, 1, NULL};
    assert_int_equal(psstore_model_create(c, model, &spec, w, 1), FR_OK);
    psstore_conn_destroy(c);
    char meta[64], role[256];
    snprintf(meta, sizeof(meta), "freshet:{%s}:meta", model);
    int master = harness_cluster_owner(&cluster, meta), replica = -1;
    for (int i = 0; i < cluster.n && replica < 0; i++) {
        char want[64];
        snprintf(want, sizeof(want), "slave\n127.0.0.1\n%d\n", cluster.node[master].port);
        if (harness_redis_query(&cluster.node[i], role, sizeof(role), "ROLE") == 0 &&
            strncmp(role, want, strlen(want)) == 0)
            replica = i;
    }
    assert_true(master >= 0 && replica >= 0);

    psstore_applier_conf_t conf;
    psstore_applier_conf_init(&conf);
    conf.url = cluster.url;
    conf.model = model;
    conf.wait_replicas = 1;
    conf.wait_timeout_ms = 1000; /* a replica that is up acknowledges in ms, even here */
    harness_applier_t ap;
    assert_int_equal(harness_applier_start(&ap, &conf), 0);
    psstore_client_t *cl = psstore_client_new(cluster.url, model, 4, 16, errstr, sizeof(errstr));
    assert_non_null(cl);
    push_and_apply(cl, ap.a, 0, 5);
    psstore_applier_stats_t st;
    psstore_applier_stats(ap.a, &st);
    assert_true(st.commits >= 5);
    assert_int_equal(st.unreplicated, 0);

    assert_int_equal(kill(cluster.node[replica].pid, SIGSTOP), 0);
    uint64_t commits_before = st.commits;
    push_and_apply(cl, ap.a, 5, 8);
    psstore_applier_stats(ap.a, &st);
    assert_int_equal(kill(cluster.node[replica].pid, SIGCONT), 0);
    assert_true(st.commits - commits_before >= 3);
    assert_int_equal(st.unreplicated, st.commits - commits_before);
    psstore_client_destroy(cl);
    harness_applier_stop(&ap, NULL);
    assert_int_equal(harness_cluster_wait_ok(&cluster, meta, 30000), 0);
}

/* ------------------------------------------------------------------------
 * freshet run on the cluster
 * ---------------------------------------------------------------------- */

/* Sample k: y = 0.5 x0 - 0.3 x1 + 0.2 x2 + 0.1, x uniform in [-1, 1]^3. */
static void produce(const char *topic, int n)
{
    ingest_producer_t *p = ingest_producer_new(broker.bootstrap, NULL, 0, errstr, sizeof(errstr));
    assert_non_null(p);
    for (int k = 0; k < n; k++) {
        fr_rng_t rng;
        fr_rng_seed(&rng, 9000 + (uint64_t)k);
        float v[D + 1];
        for (int i = 0; i < D; i++)
            v[1 + i] = (float)(2.0 * fr_rng_uniform(&rng) - 1.0);
        v[0] = 0.5f * v[1] - 0.3f * v[2] + 0.2f * v[3] + 0.1f;
        assert_int_equal(
            ingest_producer_send(p, topic, k % NPARTS, NULL, 0, v, sizeof(v), NULL, NULL), FR_OK);
    }
    uint64_t delivered = 0, failed = 0;
    assert_int_equal(ingest_producer_flush(p, 10000, &delivered, &failed), FR_OK);
    assert_int_equal(delivered, (uint64_t)n);
    ingest_producer_destroy(p);
}

/* Starts `freshet ROLE` (run, train or ps) of model on topic, against
 * the cluster, creating the model with `shards` shards when it is missing;
 * opt (or NULL) is one more argument ("--shards=0-1") and names the log,
 * whose path goes into log[300]. */
static pid_t spawn_role_with(const char *model, const char *topic, const char *role, int shards,
                             const char *opt, char *log)
{
    char conf[300], part[310];
    snprintf(conf, sizeof(conf), "%s/%s.conf", tmp_dir, model);
    snprintf(part, sizeof(part), "%s.part", conf);
    snprintf(log, 300, "%s/%s-%s%s.log", tmp_dir, model, role, opt != NULL ? opt + 9 : "");
    /* Written aside and renamed into place: a process of the same model
     * spawned before may still be reading the file, and must find it whole
     * (truncated, it read the default Redis URL). */
    FILE *f = fopen(part, "w");
    assert_non_null(f);
    fprintf(f,
            "[model]\nname = %s\nlayers = 3-64-1\nloss = mse\n"
            "[kafka]\nbootstrap.servers = %s\nsession.timeout.ms = 6000\n"
            "heartbeat.interval.ms = 500\n"
            "[ingest]\ntopic = %s\nformat = f32\nbatch = 16\nlinger_ms = 100\n"
            "[redis]\nurl = %s\n"
            "[serve]\nlisten = 127.0.0.1:0\n"
            "[trainer]\nworkers = 3\nmode = async\nbackend = cpu\nslowdown = 0:20,1:20,2:20\n"
            "[controller]\nlr = 0.02\n"
            "[psstore]\nlease_ms = 2000\ngap_timeout = 3\nmax_pending = 6\naudit = true\n"
            "shards = %d\n",
            model, broker.bootstrap, topic, cluster.url, shards);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(rename(part, conf), 0);
    char *argv[] = {FRESHET_BIN, (char *)role, "--config", conf, (char *)opt, NULL};
    pid_t pid = harness_spawn(argv, log);
    assert_true(pid > 0);
    return pid;
}

static pid_t spawn_role(const char *model, const char *topic, const char *role, char *log)
{
    return spawn_role_with(model, topic, role, 1, NULL, log);
}

/* The key "freshet:{model}:<suffix>" into key[96]. */
static void model_key(char *key, const char *model, const char *suffix)
{
    snprintf(key, 96, "freshet:{%.64s}:%.16s", model, suffix);
}

/* The sum of the watermarks of topic/0..NPARTS-1 on the model's master
 * (-1 while no master serves it). */
static int64_t watermarks_sum(const char *model, const char *topic)
{
    char key[96];
    model_key(key, model, "offsets");
    int owner = harness_cluster_owner(&cluster, key);
    if (owner < 0)
        return -1;
    int64_t sum = 0;
    for (int p = 0; p < NPARTS; p++) {
        char out[128];
        if (harness_redis_query(&cluster.node[owner], out, sizeof(out), "HGET %s %s/%d", key, topic,
                                p) != 0)
            return -1;
        sum += strcmp(out, "(nil)") == 0 ? 0 : strtoll(out, NULL, 10);
    }
    return sum;
}

/* The model's version on its master (-1 while it has none, or no master
 * serves it: a missing key is not version 0, the model is not created). */
static int64_t store_version(const char *model)
{
    char key[96], out[64];
    model_key(key, model, "ver");
    int owner = harness_cluster_owner(&cluster, key);
    if (owner < 0 ||
        harness_redis_query(&cluster.node[owner], out, sizeof(out), "GET %s", key) != 0 ||
        strcmp(out, "(nil)") == 0)
        return -1;
    return strtoll(out, NULL, 10);
}

/* Fails the test with the end of the run's log, and of the other logs of
 * its model ("<model>-<role>...log" beside it). */
static void fail_with_log(const char *log, const char *what)
{
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "tail -c 3000 '%s' >&2", log);
    if (system(cmd) != 0)
        fprintf(stderr, "(no log at %s)\n", log);
    const char *base = strrchr(log, '/'), *dash = strchr(base != NULL ? base : log, '-');
    if (dash != NULL) { /* each log's events, then its last periodic lines */
        snprintf(cmd, sizeof(cmd),
                 "for f in %.*s-*.log; do echo \"== $f\"; grep -v ' samples/s, \\| version [0-9]*, "
                 "applied ' \"$f\" | tail -n 25; tail -n 2 \"$f\"; done >&2",
                 (int)(dash - log), log);
        if (system(cmd) != 0)
            fprintf(stderr, "(no other logs)\n");
    }
    if (getenv("KEEP_LOGS") != NULL) { /* KEEP_LOGS=dir: every log kept there (debugging) */
        snprintf(cmd, sizeof(cmd), "mkdir -p '%s' && cp %s/*.log '%s'/", getenv("KEEP_LOGS"),
                 tmp_dir, getenv("KEEP_LOGS"));
        if (system(cmd) != 0)
            fprintf(stderr, "(logs not kept)\n");
    }
    fail_msg("%s", what);
}

/* The model's epoch (meta.epoch on its master) into out[32]; "" when no
 * master serves it. */
static void store_epoch(const char *model, char *out)
{
    char key[96];
    model_key(key, model, "meta");
    int owner = harness_cluster_owner(&cluster, key);
    out[0] = '\0';
    if (owner >= 0)
        harness_redis_query(&cluster.node[owner], out, 32, "HGET %s epoch", key);
}

/* Fails unless the model's epoch now differs from `before` (both read). */
static void assert_new_epoch(const char *model, const char *before)
{
    char now[32];
    store_epoch(model, now);
    assert_true(before[0] != '\0' && now[0] != '\0');
    assert_string_not_equal(before, now);
}

/* SIGKILLs the master serving key and waits until a replica serves it;
 * returns the killed node. */
static int kill_master(const char *key)
{
    int victim = harness_cluster_owner(&cluster, key);
    assert_true(victim >= 0);
    harness_redis_kill(&cluster.node[victim], SIGKILL);
    assert_int_equal(harness_cluster_wait_ok(&cluster, key, 30000), 0);
    int promoted = harness_cluster_owner(&cluster, key);
    assert_true(promoted >= 0 && promoted != victim);
    return victim;
}

/* Restarts a killed master: it comes back as a replica of the promoted
 * one, and the cluster is whole again for the next test. */
static void revive(int node, const char *key)
{
    if (harness_cluster_revive(&cluster, node, key) != 0)
        fail_msg("node %d did not rejoin as a replica", node);
}

/* Shard k's tag of a model of S shards ("m/s<k>"; the model for S = 1). */
static void shard_tag(char *tag, const char *model, int k, int S)
{
    if (S <= 1)
        snprintf(tag, 80, "%s", model);
    else
        snprintf(tag, 80, "%s/s%d", model, k);
}

/* The model's version: the sum of its shards' (-1 while one is unserved). */
static int64_t model_version(const char *model, int S)
{
    int64_t sum = 0;
    for (int k = 0; k < S; k++) {
        char tag[80];
        shard_tag(tag, model, k, S);
        int64_t v = store_version(tag);
        if (v < 0)
            return -1;
        sum += v;
    }
    return sum;
}

/* The least over the shards of the sum of their watermarks: every position
 * below is applied on every shard. */
static int64_t shards_watermarks(const char *model, int S, const char *topic)
{
    int64_t least = INT64_MAX;
    for (int k = 0; k < S; k++) {
        char tag[80];
        shard_tag(tag, model, k, S);
        int64_t w = watermarks_sum(tag, topic);
        least = w < least ? w : least;
    }
    return least;
}

static void wait_shards_version(const char *model, int S, int64_t at, const char *log)
{
    for (int waited = 0; waited < WAIT_MS && model_version(model, S) < at; waited += 20)
        harness_sleep_ms(20);
    if (model_version(model, S) < at)
        fail_with_log(log, "the run did not reach its version");
}

static void wait_version(const char *model, int64_t at, const char *log)
{
    wait_shards_version(model, 1, at, log);
}

/* The HTTP port freshet run logged, or 0. */
static int logged_port(const char *log)
{
    static const char marker[] = "serve: listening on 127.0.0.1:0 (port ";
    int port = 0;
    FILE *f = fopen(log, "r");
    char line[512];
    while (f != NULL && port == 0 && fgets(line, sizeof(line), f) != NULL) {
        const char *p = strstr(line, marker);
        if (p != NULL)
            port = atoi(p + strlen(marker));
    }
    if (f != NULL)
        fclose(f);
    return port;
}

/* The run's HTTP service serves the store's version and weights (read
 * through a cluster connection), byte for byte, once it caught up. */
static void check_served(const char *model, int S, const char *log)
{
    enum { NP = 3 * 64 + 64 + 64 + 1 };
    int port = logged_port(log);
    if (port <= 0)
        fail_with_log(log, "freshet run logged no HTTP port");
    char path[128];
    snprintf(path, sizeof(path), "/v2/models/%s/weights?format=raw", model);
    psstore_conn_t *c = conn_to(cluster.url);
    for (int tries = 0; tries < 100; tries++) {
        static float want[NP];
        uint64_t epoch;
        int64_t version;
        assert_int_equal(psstore_model_weights(c, model, want, NP, &epoch, &version), FR_OK);
        harness_resp_t r;
        harness_http(port, tmp_dir, &r, "-f --max-time 5", path);
        const char *v = strstr(r.headers, "X-Freshet-Version: ");
        int same = r.exit_status == 0 && v != NULL && strtoll(v + 19, NULL, 10) == version &&
                   r.len == sizeof(want) && memcmp(r.body, want, sizeof(want)) == 0;
        /* a sharded model: each shard's version, adding up to the model's */
        const char *sv = strstr(r.headers, "X-Freshet-Shard-Versions: ");
        if (same && S > 1) {
            int64_t sum = 0;
            int count = 0;
            for (const char *p = sv != NULL ? sv + 26 : NULL; p != NULL; count++) {
                sum += strtoll(p, (char **)&p, 10);
                p = *p == ',' ? p + 1 : NULL;
            }
            assert_non_null(sv);
            assert_int_equal(count, S);
            assert_int_equal(sum, version);
        }
        if (same && S == 1)
            assert_null(sv);
        harness_resp_free(&r);
        if (same) {
            psstore_conn_destroy(c);
            return;
        }
        harness_sleep_ms(100);
    }
    psstore_conn_destroy(c);
    fail_with_log(log, "freshet run never served the store's version");
}

/* Waits until every record is marked, checks that a lone `freshet run`
 * serves the store's weights, stops the processes pids[npids] (SIGTERM,
 * exit 0), and checks that the audit on the model's master marks every
 * position exactly once; log is the one shown on failure. */
static void finish_and_audit_shards(const pid_t *pids, int npids, const char *model, int S,
                                    const char *topic, const char *log)
{
    int waited = 0;
    while (waited < WAIT_MS && shards_watermarks(model, S, topic) < NPARTS * PER) {
        harness_sleep_ms(100);
        waited += 100;
    }
    if (shards_watermarks(model, S, topic) < NPARTS * PER) {
        for (int k = 0; k < S; k++) { /* each shard's offsets and queues, for the report */
            char tag[80], key[160], out[2048];
            shard_tag(tag, model, k, S);
            model_key(key, tag, "offsets");
            int owner = harness_cluster_owner(&cluster, key);
            for (int p = 0; owner >= 0 && p < NPARTS; p++) {
                harness_redis_query(&cluster.node[owner], out, sizeof(out), "HGET %s %s/%d", key,
                                    topic, p);
                fprintf(stderr, "shard %d %s/%d: %s\n", k, topic, p, out);
            }
            model_key(key, tag, "grads");
            if (owner >= 0 &&
                harness_redis_query(&cluster.node[owner], out, sizeof(out), "XLEN %s", key) == 0)
                fprintf(stderr, "shard %d grads waiting: %s\n", k, out);
        }
        fail_with_log(log, "the watermarks did not reach the log ends");
    }
    if (npids == 1)
        check_served(model, S, log); /* freshet run: its HTTP service */
    for (int i = 0; i < npids; i++) {
        assert_int_equal(kill(pids[i], SIGTERM), 0);
        int status = harness_wait(pids[i], 20000);
        if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            char cmd[400];
            snprintf(cmd, sizeof(cmd), "tail -n 5 %s/%s-*.log >&2", tmp_dir, model);
            if (system(cmd) != 0)
                fprintf(stderr, "(no logs)\n");
            fail_msg("process %d of %d did not exit 0 on SIGTERM (status %d, see %s)", i + 1, npids,
                     status, log);
        }
    }
    for (int k = 0; k < S; k++) { /* exactly once on every shard */
        char key[96], tag[80];
        shard_tag(tag, model, k, S);
        model_key(key, tag, "audit");
        int owner = harness_cluster_owner(&cluster, key);
        assert_true(owner >= 0);
        static int seen[PER];
        for (int p = 0; p < NPARTS; p++) {
            assert_true(harness_audit_count(&cluster.node[owner], tag, topic, p, NULL, seen, PER) >
                        0);
            for (int pos = 0; pos < PER; pos++)
                if (seen[pos] != 1)
                    fail_msg("shard %d: %s/%d position %d marked %d times (see %s)", k, topic, p,
                             pos, seen[pos], log);
        }
    }
}

static void finish_and_audit(const pid_t *pids, int npids, const char *model, const char *topic,
                             const char *log)
{
    finish_and_audit_shards(pids, npids, model, 1, topic, log);
}

/* Fills the topic, starts `freshet run` and returns once it has applied
 * 40 gradients: the model's meta key into key[96], its log path into log. */
static pid_t start_run(const char *model, const char *topic, char *log, char *key)
{
    produce(topic, NPARTS * PER);
    pid_t pid = spawn_role(model, topic, "run", log);
    wait_version(model, 40, log);
    model_key(key, model, "meta");
    return pid;
}

/*
 * SIGKILL of the master that serves the model while `freshet run` trains:
 * its replica is promoted (cluster-node-timeout 2 s), the connections
 * find it through CLUSTER SLOTS, the applier reloads (a new epoch: the
 * replica may lack acknowledged writes) and the gap rule re-reads what was
 * lost. Every position ends applied exactly once.
 */
static void test_run_survives_the_kill_of_its_master(void **state)
{
    (void)state;
    const char *model = "ckill", *topic = "ck1";
    char log[300], key[96];
    pid_t pid = start_run(model, topic, log, key);
    int64_t at_kill = store_version(model);
    char epoch[32];
    store_epoch(model, epoch);
    int victim = kill_master(key);
    finish_and_audit(&pid, 1, model, topic, log);
    /* the applier reloaded from the promoted replica under a new epoch */
    assert_new_epoch(model, epoch);
    fr_log(FR_LOG_INFO,
           "master %d killed at version %lld; replica %d promoted; every position of "
           "%d applied once",
           victim, (long long)at_kill, harness_cluster_owner(&cluster, key), NPARTS * PER);
    revive(victim, key);
}

/*
 * The same kill with the roles apart: `freshet ps` (the applier, reading
 * the grads stream) and `freshet train` (consumer and workers pushing to
 * it) in two processes. The stream, its consumer group and the pending
 * entries live on the killed master too; the new master has what its
 * replica had, and the gap rule re-reads the rest.
 */
static void test_train_and_ps_survive_the_kill_of_their_master(void **state)
{
    (void)state;
    const char *model = "ctp", *topic = "ct1";
    produce(topic, NPARTS * PER);
    char ps_log[300], train_log[300], key[96];
    pid_t pids[2];
    pids[1] = spawn_role(model, topic, "ps", ps_log);
    pids[0] = spawn_role(model, topic, "train", train_log);
    wait_version(model, 40, ps_log);
    model_key(key, model, "meta");
    int64_t at_kill = store_version(model);
    int victim = kill_master(key);
    finish_and_audit(pids, 2, model, topic, ps_log);
    fr_log(FR_LOG_INFO,
           "train + ps: master %d killed at version %lld; every position of %d "
           "applied once",
           victim, (long long)at_kill, NPARTS * PER);
    revive(victim, key);
}

/* The model's slot migrates key by key to another master while `freshet
 * run` trains: ASK, TRYAGAIN and MOVED are met and followed; every
 * position ends applied exactly once. */
static void test_run_survives_a_migration_of_its_slot(void **state)
{
    (void)state;
    const char *model = "cmig", *topic = "cm1";
    char log[300], key[96];
    pid_t pid = start_run(model, topic, log, key);
    int from = harness_cluster_owner(&cluster, key), to = other_master(from);
    assert_true(from >= 0 && to >= 0);
    int64_t at = store_version(model);
    char epoch[32];
    store_epoch(model, epoch);
    assert_int_equal(harness_cluster_migrate(&cluster, key, to, 20), 0);
    finish_and_audit(&pid, 1, model, topic, log);
    /* a migration too reads as "the serving Redis changed": a new epoch */
    assert_new_epoch(model, epoch);
    fr_log(FR_LOG_INFO,
           "slot of %s moved from node %d to %d at version %lld; every position of "
           "%d applied once",
           model, from, to, (long long)at, NPARTS * PER);
}

/* ------------------------------------------------------------------------
 * A sharded model on the cluster (docs/design.md "Shards")
 * ---------------------------------------------------------------------- */
#define SHARDS 4

/* The mean squared error of the store's model (3-64-1, ReLU) on the
 * topic's samples: shards assembled by psstore_model_weights. */
static double store_mse(const char *model)
{
    enum { H = 64, NP = 3 * H + H + H + 1 };
    static float w[NP];
    psstore_conn_t *c = conn_to(cluster.url);
    uint64_t epoch;
    int64_t version;
    assert_int_equal(psstore_model_weights(c, model, w, NP, &epoch, &version), FR_OK);
    psstore_conn_destroy(c);
    const float *w1 = w, *b1 = w + 3 * H, *w2 = b1 + H, *b2 = w2 + H;
    double sum = 0;
    for (int k = 0; k < 2000; k++) {
        fr_rng_t rng;
        fr_rng_seed(&rng, 9000 + (uint64_t)k);
        double x[D];
        for (int i = 0; i < D; i++)
            x[i] = (float)(2.0 * fr_rng_uniform(&rng) - 1.0);
        double y = 0.5 * x[0] - 0.3 * x[1] + 0.2 * x[2] + 0.1, out = b2[0];
        for (int j = 0; j < H; j++) {
            double h = b1[j] + w1[3 * j] * x[0] + w1[3 * j + 1] * x[1] + w1[3 * j + 2] * x[2];
            out += h > 0 ? w2[j] * h : 0;
        }
        sum += (out - y) * (out - y);
    }
    return sum / 2000;
}

/* The epoch of each shard into epochs[S][32]. */
static void shard_epochs(const char *model, int S, char (*epochs)[32])
{
    for (int k = 0; k < S; k++) {
        char tag[80];
        shard_tag(tag, model, k, S);
        store_epoch(tag, epochs[k]);
    }
}

/*
 * `freshet run` of a model of four shards on the cluster: the shards spread
 * over the masters, one applier thread each. A master is SIGKILLed while it
 * trains: the shards it served start new epochs on the promoted replica
 * and get their lost range again through the gap rule, while the others
 * keep theirs. The run learns, serves the assembled weights, and every
 * position ends applied exactly once on every shard.
 */
static void test_sharded_run_survives_the_kill_of_a_master(void **state)
{
    (void)state;
    const char *model = "cshard", *topic = "cs1";
    char log[300], key[96], tag[80];
    produce(topic, NPARTS * PER);
    pid_t pid = spawn_role_with(model, topic, "run", SHARDS, NULL, log);
    wait_shards_version(model, SHARDS, 40 * SHARDS, log);
    psstore_conn_t *c = conn_to(cluster.url);
    psstore_model_info_t info;
    assert_int_equal(psstore_model_info(c, model, &info), FR_OK);
    psstore_conn_destroy(c);
    assert_int_equal(info.shards, SHARDS);
    /* 3-64-1 cut at rows, balanced by bytes: 0, 81, 159, 256, 321 */
    const size_t want[] = {0, 81, 159, 256, 321};
    assert_memory_equal(info.bounds, want, sizeof(want));
    int owners[SHARDS], masters_used = 0;
    for (int k = 0; k < SHARDS; k++) {
        shard_tag(tag, model, k, SHARDS);
        model_key(key, tag, "meta");
        owners[k] = harness_cluster_owner(&cluster, key);
        int seen_before = 0;
        for (int j = 0; j < k; j++)
            seen_before |= owners[j] == owners[k];
        masters_used += !seen_before;
    }
    assert_true(masters_used >= 2); /* the shards' tags spread over the masters */
    char before[SHARDS][32], after[SHARDS][32];
    shard_epochs(model, SHARDS, before);
    shard_tag(tag, model, 1, SHARDS);
    model_key(key, tag, "meta");
    int victim = kill_master(key);
    finish_and_audit_shards(&pid, 1, model, SHARDS, topic, log);
    shard_epochs(model, SHARDS, after);
    for (int k = 0; k < SHARDS; k++) {
        /* a new epoch exactly where the killed master served the shard */
        if (owners[k] == victim)
            assert_string_not_equal(before[k], after[k]);
        else
            assert_string_equal(before[k], after[k]);
    }
    double mse = store_mse(model);
    fr_log(FR_LOG_INFO,
           "4 shards on %d masters: master %d killed; every position of %d applied once on every "
           "shard; mse %.5f",
           masters_used, victim, NPARTS * PER, mse);
    assert_true(mse < 0.01);
    revive(victim, key);
}

/*
 * The slot of one shard of four migrates key by key to another master while
 * `freshet run` trains: that shard meets ASK, TRYAGAIN and MOVED, reloads
 * from the new master under a new epoch of its own, and the others go on
 * untouched. Every position ends applied exactly once on every shard.
 */
static void test_sharded_run_survives_a_migration_of_a_shard_slot(void **state)
{
    (void)state;
    const char *model = "cshm", *topic = "cq1";
    char log[300], key[96], tag[80];
    produce(topic, NPARTS * PER);
    pid_t pid = spawn_role_with(model, topic, "run", SHARDS, NULL, log);
    wait_shards_version(model, SHARDS, 40 * SHARDS, log);
    shard_tag(tag, model, 2, SHARDS);
    model_key(key, tag, "meta");
    int from = harness_cluster_owner(&cluster, key), to = other_master(from);
    assert_true(from >= 0 && to >= 0);
    int owners[SHARDS];
    for (int k = 0; k < SHARDS; k++) {
        char t[80], kk[96];
        shard_tag(t, model, k, SHARDS);
        model_key(kk, t, "meta");
        owners[k] = harness_cluster_owner(&cluster, kk);
    }
    char before[SHARDS][32], after[SHARDS][32];
    shard_epochs(model, SHARDS, before);
    assert_int_equal(harness_cluster_migrate(&cluster, key, to, 20), 0);
    finish_and_audit_shards(&pid, 1, model, SHARDS, topic, log);
    shard_epochs(model, SHARDS, after);
    assert_string_not_equal(before[2], after[2]); /* the shard that moved */
    for (int k = 0; k < SHARDS; k++)
        if (owners[k] != from) /* a shard on another master was not touched */
            assert_string_equal(before[k], after[k]);
    fr_log(FR_LOG_INFO,
           "slot of shard 2 moved from node %d to %d; every position of %d applied once on every "
           "shard; mse %.5f",
           from, to, NPARTS * PER, store_mse(model));
    assert_true(store_mse(model) < 0.01);
}

/*
 * The shards' appliers in two `freshet ps` processes (--shards 0-1 and
 * --shards 2-3) fed by two `freshet train`: the first ps is SIGKILLed while
 * they train, and a new one for shards 0-1 takes their leases over when
 * they lapse. Every position ends applied exactly once on every shard.
 */
static void test_ps_shards_in_two_processes_survive_a_kill(void **state)
{
    (void)state;
    const char *model = "cps", *topic = "cp1";
    char logs[5][300];
    produce(topic, NPARTS * PER);
    pid_t ps_a = spawn_role_with(model, topic, "ps", SHARDS, "--shards=0-1", logs[0]);
    wait_shards_version(model, SHARDS, 0, logs[0]); /* created */
    pid_t ps_b = spawn_role_with(model, topic, "ps", SHARDS, "--shards=2-3", logs[1]);
    pid_t t1 = spawn_role_with(model, topic, "train", SHARDS, NULL, logs[2]);
    pid_t t2 = spawn_role_with(model, topic, "train", SHARDS, "--set=ingest.batch=16", logs[3]);
    wait_shards_version(model, SHARDS, 40 * SHARDS, logs[0]);
    int64_t at_kill = model_version(model, SHARDS);
    assert_int_equal(kill(ps_a, SIGKILL), 0);
    harness_wait(ps_a, 5000);
    pid_t ps_c = spawn_role_with(model, topic, "ps", SHARDS, "--shards=0-1", logs[4]);
    pid_t pids[] = {t1, t2, ps_b, ps_c};
    finish_and_audit_shards(pids, 4, model, SHARDS, topic, logs[4]);
    fr_log(FR_LOG_INFO,
           "ps --shards 0-1 killed at version %lld and replaced; every position of %d applied "
           "once on every shard; mse %.5f",
           (long long)at_kill, NPARTS * PER, store_mse(model));
    assert_true(store_mse(model) < 0.01);
}

static int setup(void **state)
{
    (void)state;
    if (harness_tmpdir(tmp_dir, "cluster") != 0 || harness_cluster_start(&cluster, 3, 1) != 0)
        return -1;
    return harness_broker_start(&broker, FRESHET_BIN,
                                "--topic ck1:4 --topic cm1:4 --topic ct1:4 --topic cs1:4 "
                                "--topic cp1:4 --topic cq1:4");
}

static int teardown(void **state)
{
    (void)state;
    if (broker.pid > 0)
        harness_broker_stop(&broker);
    harness_cluster_stop(&cluster);
    harness_kill_children();
    return harness_rmdir(tmp_dir);
}

int main(void)
{
    /* TEST_FILTER=pattern runs the matching tests only (while debugging) */
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slots_agree_with_redis),
        cmocka_unit_test(test_models_spread_over_the_masters_and_are_all_found),
        cmocka_unit_test(test_reads_follow_ask_and_moved_during_a_migration),
        cmocka_unit_test(test_a_cluster_url_is_checked),
        cmocka_unit_test(test_wait_replicas_counts_commits_no_replica_holds),
        cmocka_unit_test(test_run_survives_the_kill_of_its_master),
        cmocka_unit_test(test_run_survives_a_migration_of_its_slot),
        cmocka_unit_test(test_train_and_ps_survive_the_kill_of_their_master),
        cmocka_unit_test(test_sharded_run_survives_the_kill_of_a_master),
        cmocka_unit_test(test_sharded_run_survives_a_migration_of_a_shard_slot),
        cmocka_unit_test(test_ps_shards_in_two_processes_survive_a_kill),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
