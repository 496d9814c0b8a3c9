/*
 * svc_ps.c - "freshet ps": the applier role. Holds the model's lease (or
 * stands by for it), applies gradients from the grads stream, and keeps
 * snapshots, until SIGINT or SIGTERM.
 */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "app/app.h"
#include "model/model.h"
#include "psstore/psstore.h"

#define CMD "ps"

static void ps_usage(FILE *out)
{
    fprintf(out, "usage: freshet ps --config F [--set section.key=value ...]\n"
                 "\n"
                 "Runs the applier of [model] name: the single writer of the model in Redis. It\n"
                 "takes the lease when free (or stands by until it is), applies gradients from\n"
                 "the grads stream under the [controller] settings, commits weights, version\n"
                 "and offsets in one transaction each, keeps snapshots ([psstore]), and exits 0\n"
                 "on SIGINT or SIGTERM after committing what it holds. A model missing from the\n"
                 "store is created from [model] (layers, loss, seed, init).\n"
                 "\n"
                 "\n"
                 "A sharded model ([psstore] shards, model create --shards) has an applier per\n"
                 "shard, each the fenced writer of its shard; this process runs the shards of\n"
                 "--shards (all by default) on a thread each, so shards can be spread over\n"
                 "processes and machines (ps --shards 0-1 here, ps --shards 2-3 there).\n"
                 "\n"
                 "  --config F           INI configuration (deploy/freshet.conf.example)\n"
                 "  --set S.K=V          override one key (repeatable)\n"
                 "  --shards LIST        the shards to run, e.g. 0-1 or 0,2 (default all)\n"
                 "  -h, --help           this text\n");
}

/* Takes "--shards LIST" (or --shards=LIST) out of argv into *list. */
static void shards_opt_take(int *argc, char **argv, const char **list)
{
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--shards") == 0 && i + 1 < *argc) {
            *list = argv[++i];
            continue;
        }
        if (strncmp(argv[i], "--shards=", 9) == 0) {
            *list = argv[i] + 9;
            continue;
        }
        argv[out++] = argv[i];
    }
    *argc = out;
    argv[out] = NULL;
}

typedef struct shard_thread {
    pthread_t tid;
    int running;
    psstore_applier_t *a;
} shard_thread_t;

static void *shard_main(void *arg)
{
    shard_thread_t *t = arg;
    fr_thread_name("fr-applier");
    psstore_applier_run(t->a, &app_stop); /* commits and releases its lease at the stop */
    return NULL;
}

/*
 * A sharded model's appliers (docs/design.md "Shards"): one per listed shard,
 * each on its own thread until SIGINT or SIGTERM, with a line per shard
 * every 5 s. Returns 0 or an exit status.
 */
static int run_shards(psstore_applier_conf_t *conf, int S, uint64_t mask)
{
    char errstr[512];
    shard_thread_t t[PSSTORE_SHARDS_MAX] = {0};
    int rc = 0;
    app_stop_on_signals(0);
    for (int k = 0; k < S && rc == 0; k++) {
        if (!(mask & (1ull << k)))
            continue;
        conf->shard = k;
        if ((t[k].a = psstore_applier_new(conf, errstr, sizeof(errstr))) == NULL) {
            fprintf(stderr, "freshet %s: shard %d: %s\n", CMD, k, errstr);
            rc = APP_EXIT_USAGE;
        } else {
            t[k].running = pthread_create(&t[k].tid, NULL, shard_main, &t[k]) == 0;
            if (!t[k].running)
                rc = APP_EXIT_FAILURE;
        }
    }
    if (rc != 0)
        atomic_store(&app_stop, 1);
    else
        fr_log(FR_LOG_INFO, "ps: appliers of model '%s', shards %s of %d", conf->model,
               mask == (S == 64 ? ~0ull : (1ull << S) - 1) ? "all" : "listed", S);
    uint64_t last = fr_clock_mono_ns();
    while (!atomic_load(&app_stop)) {
        struct timespec ts = {0, 200000000L};
        nanosleep(&ts, NULL);
        uint64_t now = fr_clock_mono_ns();
        if (now - last < 5000000000ull)
            continue;
        last = now;
        for (int k = 0; k < S; k++) {
            if (t[k].a == NULL)
                continue;
            psstore_applier_stats_t st;
            psstore_applier_stats(t[k].a, &st);
            fr_log(FR_LOG_INFO, "ps: shard %d %s version %lld, applied %llu, fenced %llu%s%s", k,
                   st.active ? "active" : "standby", (long long)st.version,
                   (unsigned long long)st.applied, (unsigned long long)st.fenced,
                   st.stopped[0] ? ", stopped: " : "", st.stopped);
        }
    }
    fr_log(FR_LOG_INFO, "ps: stopping");
    app_stop_stage("the appliers (their last commits)");
    app_stop_watchdog("ps", 20);
    for (int k = 0; k < S; k++) {
        if (t[k].running)
            pthread_join(t[k].tid, NULL);
        psstore_applier_destroy(t[k].a);
    }
    return rc;
}

int app_cmd_ps(int argc, char **argv)
{
    fr_config_t *cfg = fr_config_new();
    if (cfg == NULL)
        return APP_EXIT_FAILURE;
    char errstr[512];
    const char *shards = NULL;
    shards_opt_take(&argc, argv, &shards);
    int rc = app_load_config(CMD, cfg, argc, argv, ps_usage);
    psstore_applier_t *a = NULL;
    fr_metrics_t *metrics = fr_metrics_new();
    if (rc == 0 && fr_config_get(cfg, "model", "sparse")[0] != '\0') {
        /* a sparse model's applier (docs/design.md "Sparse models") */
        rc = app_run_sparse(CMD, cfg, metrics, NULL, 0, APP_SPARSE_APPLIER, shards);
        goto out;
    }
    if (rc != 0 || (rc = app_ensure_model(CMD, cfg)) != 0)
        goto out;
    psstore_applier_conf_t conf;
    if ((rc = app_applier_conf(CMD, cfg, metrics, &conf)) != 0)
        goto out;
    psstore_conn_t *c = psstore_conn_new(conf.url, 2000, errstr, sizeof(errstr));
    psstore_model_info_t info;
    if (c == NULL || psstore_model_info(c, conf.model, &info) != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", CMD, c != NULL ? psstore_conn_error(c) : errstr);
        psstore_conn_destroy(c);
        rc = APP_EXIT_USAGE;
        goto out;
    }
    psstore_conn_destroy(c);
    uint64_t mask = info.shards >= 64 ? ~0ull : (1ull << info.shards) - 1;
    if (shards != NULL &&
        psstore_shard_list_parse(shards, info.shards, &mask, errstr, sizeof(errstr)) != FR_OK) {
        rc = app_usage_error(CMD, "--%s (model '%s' has %d)", errstr, conf.model, info.shards);
        goto out;
    }
    if (info.shards > 1) {
        rc = run_shards(&conf, info.shards, mask);
        goto out;
    }
    a = psstore_applier_new(&conf, errstr, sizeof(errstr));
    if (a == NULL) {
        fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
        rc = APP_EXIT_USAGE;
        goto out;
    }
    app_stop_on_signals(0);
    fr_log(FR_LOG_INFO, "ps: applier of model '%s'", conf.model); /* the URL may hold a password */
    uint64_t last = fr_clock_mono_ns();
    psstore_applier_stats_t prev = {0};
    while (!atomic_load(&app_stop)) {
        fr_err_t err = psstore_applier_poll(a, 200);
        if (err != FR_OK) {
            fr_log(FR_LOG_WARN, "ps: %s", psstore_applier_error(a));
            struct timespec ts = {0, 200000000L};
            nanosleep(&ts, NULL);
        }
        uint64_t now = fr_clock_mono_ns();
        if (now - last >= 5000000000ull) {
            psstore_applier_stats_t s;
            psstore_applier_stats(a, &s);
            uint64_t dropped = 0;
            for (int d = 0; d < PSSTORE_NDROP; d++)
                dropped += s.dropped[d];
            fr_log(FR_LOG_INFO,
                   "ps: %s version %lld, %.0f updates/s, applied %llu, dropped %llu, "
                   "fenced %llu%s%s",
                   s.active ? "active" : "standby", (long long)s.version,
                   (double)(s.applied - prev.applied) / ((double)(now - last) * 1e-9),
                   (unsigned long long)s.applied, (unsigned long long)dropped,
                   (unsigned long long)s.fenced, s.stopped[0] ? ", stopped: " : "", s.stopped);
            prev = s;
            last = now;
        }
    }
    fr_log(FR_LOG_INFO, "ps: stopping");
    app_stop_stage("the applier (its last commit)");
    app_stop_watchdog("ps", 20);
    psstore_applier_run(a, &app_stop); /* commits and releases the lease */
out:
    psstore_applier_destroy(a);
    fr_metrics_destroy(metrics);
    fr_config_destroy(cfg);
    return rc < 0 ? 0 : rc;
}
