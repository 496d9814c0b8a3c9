/*
 * bench_applier.c - the applier's throughput against raw Redis in the same
 * run. For each size it measures:
 *   baseline  hiredis SET then GET of one blob of the model's size, in a
 *             loop: 2 x size bytes per round trip pair;
 *   applier   gradients queued in the grads stream beforehand, then timed
 *             while one applier drains them: each update reads a gradient
 *             (size bytes) and commits the weights (size bytes) in its own
 *             transaction (commit_ms = 0, sgd), the same 2 x size bytes.
 * Prints updates/s, MB/s and the ratio of the applier's byte rate to the
 * baseline's, for S = 1, 2 and 4 shards (docs/design.md "Shards"): S
 * appliers, each on its own thread, each committing its slice; an update
 * counts once every shard applied it, and "vs S=1" is its rate against
 * one shard's in the same run. Starts its own redis-server on a free port; with --cluster
 * also a Redis Cluster (3 masters, 1 replica each) and measures the same
 * through a cluster connection, the baseline on the model's master.
 *
 * usage: bench_applier [SECONDS [--cluster]]   (default 3 s per measurement)
 */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/integration/harness.h"
#include "psstore/psstore.h"

static double seconds_since(uint64_t t0)
{
    return (double)(fr_clock_mono_ns() - t0) * 1e-9;
}

/* SET+GET round trips of a size-byte blob at key for about secs seconds. */
static double baseline(const harness_redis_t *r, const char *key, size_t size, double secs)
{
    redisContext *c = redisConnect("127.0.0.1", r->port);
    char *blob = malloc(size);
    memset(blob, 7, size);
    long n = 0;
    uint64_t t0 = fr_clock_mono_ns();
    /* a fresh redis-server first-touches the memory of every new blob
     * (about 11 us a page here): warm it with the largest size's blobs, as
     * a long-running server is, before timing anything */
    static int warmed_port;
    if (warmed_port != r->port) {
        size_t big = 2000000 * sizeof(float);
        char *w = calloc(1, big);
        for (int i = 0; i < 30; i++) {
            freeReplyObject(redisCommand(c, "SET %s %b", key, w, big));
            freeReplyObject(redisCommand(c, "GET %s", key));
        }
        free(w);
        warmed_port = r->port;
    }
    t0 = fr_clock_mono_ns();
    do {
        freeReplyObject(redisCommand(c, "SET %s %b", key, blob, size));
        redisReply *rep = redisCommand(c, "GET %s", key);
        if (rep == NULL || rep->type != REDIS_REPLY_STRING || rep->len != size) {
            fprintf(stderr, "bench_applier: baseline GET failed\n");
            exit(1);
        }
        freeReplyObject(rep);
        n++;
    } while (seconds_since(t0) < secs);
    freeReplyObject(redisCommand(c, "DEL %s", key));
    double rate = (double)n / seconds_since(t0);
    free(blob);
    redisFree(c);
    return rate;
}

/* One shard's applier, draining on a thread of its own. */
typedef struct drain {
    psstore_applier_t *a;
    int count;
    uint64_t t0;
    double secs;     /* until it had applied count */
    int64_t version; /* reached */
    pthread_t tid;
} drain_t;

static void *drain_main(void *arg)
{
    drain_t *d = arg;
    psstore_applier_stats_t st;
    do {
        psstore_applier_poll(d->a, 100);
        psstore_applier_stats(d->a, &st);
    } while (st.version < d->count && seconds_since(d->t0) < 300);
    d->secs = seconds_since(d->t0);
    d->version = st.version;
    atomic_int stop = 1;
    psstore_applier_run(d->a, &stop); /* releases the lease: the model is replaced next */
    return NULL;
}

/* Updates per second of S appliers (one per shard, each on its own
 * thread) draining count queued gradients of a model of `layers`: an
 * update is done once every shard applied it. */
static double applier(const char *url, const char *layers, size_t nparams, int S, int count)
{
    char errstr[512], name[32];
    snprintf(name, sizeof(name), "bench%zu", nparams);
    psstore_conn_t *c = psstore_conn_new(url, 5000, errstr, sizeof(errstr));
    float *w = calloc(nparams, sizeof(float)), *g = malloc(nparams * sizeof(float));
    for (size_t i = 0; i < nparams; i++)
        g[i] = 1e-3f * (float)(i % 13);
    psstore_model_spec_t spec = {layers, "mse", nparams, S, NULL};
    if (c == NULL || psstore_model_create(c, name, &spec, w, 1) != FR_OK) {
        fprintf(stderr, "bench_applier: %s\n", c ? psstore_conn_error(c) : errstr);
        exit(1);
    }
    psstore_client_t *cl =
        psstore_client_new(url, name, nparams, count + 1, errstr, sizeof(errstr));
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed;
    if (cl == NULL || psstore_pull(cl, w, &epoch, &version, &changed) != FR_OK) {
        fprintf(stderr, "bench_applier: %s\n", cl ? psstore_client_error(cl) : errstr);
        exit(1);
    }
    for (int k = 0; k < count; k++) {
        psstore_range_t range = {"bench", 0, k, k + 1};
        psstore_grad_t msg = {.epoch = epoch,
                              .version = 0,
                              .worker = "bench/1/0",
                              .n = 1,
                              .loss_sum = 1,
                              .ranges = &range,
                              .nranges = 1,
                              .g = g,
                              .len = nparams};
        if (psstore_push(cl, &msg, 10000) != FR_OK) {
            fprintf(stderr, "bench_applier: %s\n", psstore_client_error(cl));
            exit(1);
        }
    }
    psstore_applier_conf_t conf;
    psstore_applier_conf_init(&conf);
    conf.url = url;
    conf.model = name;
    conf.ctl.lr = 1e-3;
    conf.snapshot_every = 0;
    conf.snapshot_seconds = 0;
    drain_t d[PSSTORE_SHARDS_MAX];
    for (int k = 0; k < S; k++) {
        conf.shard = k;
        d[k] = (drain_t){.count = count};
        if ((d[k].a = psstore_applier_new(&conf, errstr, sizeof(errstr))) == NULL) {
            fprintf(stderr, "bench_applier: %s\n", errstr);
            exit(1);
        }
        psstore_applier_poll(d[k].a, 1); /* takes the lease and loads the state */
    }
    uint64_t t0 = fr_clock_mono_ns();
    for (int k = 0; k < S; k++) {
        d[k].t0 = t0;
        pthread_create(&d[k].tid, NULL, drain_main, &d[k]);
    }
    double secs = 0;
    for (int k = 0; k < S; k++) {
        pthread_join(d[k].tid, NULL);
        if (d[k].version != count) {
            fprintf(stderr, "bench_applier: shard %d applied %lld of %d\n", k,
                    (long long)d[k].version, count);
            exit(1);
        }
        secs = d[k].secs > secs ? d[k].secs : secs;
        psstore_applier_destroy(d[k].a);
    }
    psstore_client_destroy(cl);
    psstore_model_delete(c, name);
    psstore_conn_destroy(c);
    free(w);
    free(g);
    return (double)count / secs;
}

/* One row per size and shard count: raw SET+GET of the whole model on the
 * server that holds it (shard 0's, on a cluster) against S appliers,
 * through url. */
static void measure(const char *what, const char *url, const harness_cluster_t *cl,
                    const harness_redis_t *single, double secs)
{
    /* 1000-200 and 1000-2000: 200,200 and 2,002,000 floats, 200 and 2000 rows */
    static const char *const layers[] = {"1000-200", "1000-2000"};
    static const size_t sizes[] = {200200, 2002000};
    static const int shards[] = {1, 2, 4};
    for (size_t i = 0; i < 2; i++) {
        size_t bytes = sizes[i] * sizeof(float);
        char key[64];
        snprintf(key, sizeof(key), "freshet:{bench%zu}:blob", sizes[i]);
        const harness_redis_t *r = single;
        if (cl != NULL) {
            int owner = harness_cluster_owner(cl, key);
            if (owner < 0) {
                fprintf(stderr, "bench_applier: no master serves %s\n", key);
                exit(1);
            }
            r = &cl->node[owner];
        }
        double base = baseline(r, key, bytes, secs), one = 0;
        for (size_t j = 0; j < sizeof(shards) / sizeof(shards[0]); j++) {
            int count = (int)(base * secs * 0.8) + 10;
            double upd = applier(url, layers[i], sizes[i], shards[j], count);
            if (shards[j] == 1)
                one = upd;
            double base_mb = base * 2.0 * (double)bytes / 1e6,
                   upd_mb = upd * 2.0 * (double)bytes / 1e6;
            printf("  %-8s %-10zu %2d %14.1f %12.0f %14.1f %12.0f %7.2f %7.2f\n", what, sizes[i],
                   shards[j], base, base_mb, upd, upd_mb, upd_mb / base_mb, upd / one);
        }
    }
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 3.0;
    int with_cluster = argc > 2 && strcmp(argv[2], "--cluster") == 0;
    harness_redis_t r;
    if (harness_redis_start(&r, NULL) != 0)
        return 1;
    printf("bench_applier: S appliers (one per shard, a thread each), sgd, commit per update, "
           "redis-server on loopback\n");
    printf("  %-8s %-10s %2s %14s %12s %14s %12s %7s %7s\n", "redis", "params", "S",
           "SET+GET pairs/s", "MB/s", "applier upd/s", "MB/s", "ratio", "vs S=1");
    measure("single", r.url, NULL, &r, secs);
    harness_redis_stop(&r);
    if (with_cluster) {
        /* 3 masters with a replica each: the applier's commits are
         * replicated, the baseline's writes too */
        harness_cluster_t cl;
        if (harness_cluster_start(&cl, 3, 1) != 0)
            return 1;
        measure("cluster", cl.url, &cl, NULL, secs);
        harness_cluster_stop(&cl);
    }
    return 0;
}
