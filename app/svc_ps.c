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

/* Loads --config and --set into cfg; returns 0 or an exit status. */
int app_load_config(const char *cmd, fr_config_t *cfg, int argc, char **argv, void (*usage)(FILE *))
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"set", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    char errstr[512];
    int c, rc = 0;
    app_opts_begin();
    while (rc == 0 &&
           (c = app_opts_next(cmd, argc, argv, ":h", longopts, NULL, usage, &rc)) != -1) {
        switch (c) {
        case 'c':
            if (fr_config_load_file(cfg, optarg, errstr, sizeof(errstr)) != FR_OK) {
                fprintf(stderr, "freshet %s: %s\n", cmd, errstr);
                return APP_EXIT_USAGE;
            }
            break;
        case 's':
            if (fr_config_set(cfg, optarg, errstr, sizeof(errstr)) != FR_OK) {
                fprintf(stderr, "freshet %s: %s\n", cmd, errstr);
                return APP_EXIT_USAGE;
            }
            break;
        }
    }
    if ((rc = app_opts_end(cmd, argc, argv, rc)) != 0)
        return rc;
    if (fr_config_apply_env(cfg, errstr, sizeof(errstr)) != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", cmd, errstr);
        return APP_EXIT_USAGE;
    }
    return 0;
}

/* The controller settings of [controller]. Returns 0 or an exit status. */
int app_controller_conf(const char *cmd, const fr_config_t *cfg, psstore_ctl_conf_t *ctl)
{
    psstore_ctl_conf_init(ctl);
    ctl->lr = fr_config_get_double(cfg, "controller", "lr");
    ctl->warmup = fr_config_get_int(cfg, "controller", "warmup");
    ctl->max_staleness = fr_config_get_int(cfg, "controller", "max_staleness");
    ctl->clip_norm = fr_config_get_double(cfg, "controller", "clip_norm");
    ctl->dc_lambda = fr_config_get_double(cfg, "controller", "dc_lambda");
    ctl->dc_adaptive = fr_config_get_bool(cfg, "controller", "dc_adaptive");
    ctl->dc_ring = (int)fr_config_get_int(cfg, "controller", "dc_ring");
    ctl->momentum = fr_config_get_double(cfg, "controller", "momentum");
    ctl->average = fr_config_get_int(cfg, "controller", "average");
    if (psstore_policy_parse(fr_config_get(cfg, "controller", "policy"), &ctl->policy) != FR_OK ||
        psstore_optim_parse(fr_config_get(cfg, "controller", "optimizer"), &ctl->optim) != FR_OK)
        return app_usage_error(cmd, "bad [controller] policy or optimizer");
    const char *mode = fr_config_get(cfg, "trainer", "mode");
    if (strcmp(mode, "adaptive") == 0 || strcmp(mode, "auto") == 0)
        ctl->policy = PSSTORE_POLICY_ADAPTIVE;
    return 0;
}

int app_applier_conf(const char *cmd, const fr_config_t *cfg, fr_metrics_t *metrics,
                     psstore_applier_conf_t *conf)
{
    psstore_applier_conf_init(conf);
    int rc = app_controller_conf(cmd, cfg, &conf->ctl);
    conf->url = fr_config_get(cfg, "redis", "url");
    conf->model = fr_config_get(cfg, "model", "name");
    conf->lease_ms = fr_config_get_int(cfg, "psstore", "lease_ms");
    conf->commit_ms = fr_config_get_int(cfg, "psstore", "commit_ms");
    conf->versions_keep = fr_config_get_int(cfg, "psstore", "versions_keep");
    conf->snapshot_every = fr_config_get_int(cfg, "psstore", "snapshot_every");
    conf->snapshot_seconds = fr_config_get_double(cfg, "psstore", "snapshot_seconds");
    conf->snapshot_retain = fr_config_get_int(cfg, "psstore", "snapshot_retain");
    conf->audit = fr_config_get_bool(cfg, "psstore", "audit");
    conf->wait_replicas = (int)fr_config_get_int(cfg, "redis", "wait_replicas");
    conf->wait_timeout_ms = fr_config_get_int(cfg, "redis", "wait_timeout_ms");
    conf->npushers = (int)fr_config_get_int(cfg, "trainer", "workers");
    if (psstore_mode_parse(fr_config_get(cfg, "trainer", "mode"), &conf->mode) != FR_OK)
        rc = app_usage_error(cmd, "bad [trainer] mode");
    conf->backups = (int)fr_config_get_int(cfg, "trainer", "backups");
    conf->commit_drained =
        fr_config_get_int(cfg, "trainer", "in_flight") > 0 && !psstore_mode_rounds(conf->mode);
    conf->sync_lr_linear = strcmp(fr_config_get(cfg, "trainer", "sync_lr_scale"), "linear") == 0;
    conf->member_timeout_ms =
        (int64_t)(fr_config_get_double(cfg, "trainer", "member_timeout") * 1000);
    conf->round_timeout_ms =
        (int64_t)(fr_config_get_double(cfg, "trainer", "round_timeout") * 1000);
    if (conf->member_timeout_ms < 1 || conf->round_timeout_ms < 1)
        rc = app_usage_error(cmd, "[trainer] member_timeout and round_timeout must be at least "
                                  "a millisecond");
    conf->metrics = metrics;
    return rc;
}

/*
 * Creates the model from [model] when the store has none; refuses one with
 * other layers or loss. Returns 0 or an exit status.
 */
int app_ensure_model(const char *cmd, const fr_config_t *cfg)
{
    char errstr[512];
    const char *url = fr_config_get(cfg, "redis", "url");
    const char *name = fr_config_get(cfg, "model", "name");
    model_t m;
    model_loss_t loss;
    if (fr_config_get(cfg, "model", "sparse")[0] != '\0')
        return app_usage_error(cmd, "[model] sparse: a sparse model is not a dense "
                                    "model");
    if (model_loss_parse(fr_config_get(cfg, "model", "loss"), &loss) != FR_OK ||
        model_init(&m, fr_config_get(cfg, "model", "layers"), loss, errstr, sizeof(errstr)) !=
            FR_OK)
        return app_usage_error(cmd, "[model]: %s", errstr);
    psstore_conn_t *c = psstore_conn_new(url, 2000, errstr, sizeof(errstr));
    if (c == NULL) {
        fprintf(stderr, "freshet %s: %s\n", cmd, errstr);
        return APP_EXIT_USAGE;
    }
    int rc = 0;
    psstore_model_info_t info;
    fr_err_t err = psstore_model_info(c, name, &info);
    char layers[256];
    model_layers(&m, layers, sizeof(layers));
    if (err == FR_OK) {
        if (strcmp(info.layers, layers) != 0 || strcmp(info.loss, model_loss_name(loss)) != 0)
            rc = app_usage_error(cmd,
                                 "model '%s' in the store is %s %s, the configuration says %s %s",
                                 name, info.layers, info.loss, layers, model_loss_name(loss));
    } else if (err == FR_ERR_NOTFOUND) {
        float *w = NULL;
        const char *init = fr_config_get(cfg, "model", "init");
        if (init[0] != '\0') {
            model_t fm;
            if (model_load(init, &loss, &fm, &w, errstr, sizeof(errstr)) != FR_OK ||
                !model_equal(&fm, &m)) {
                rc = app_usage_error(cmd, "[model] init %s: %s", init,
                                     w ? "holds another model" : errstr);
            }
        } else if ((w = malloc(m.nparams * sizeof(float))) != NULL) {
            model_params_init(&m, w, (uint64_t)fr_config_get_int(cfg, "model", "seed"));
        }
        if (rc == 0 && w != NULL) {
            psstore_model_spec_t spec = {layers, model_loss_name(loss), m.nparams,
                                         (int)fr_config_get_int(cfg, "psstore", "shards"), NULL};
            if (psstore_model_create(c, name, &spec, w, 0) != FR_OK &&
                psstore_model_info(c, name, &info) != FR_OK) {
                fprintf(stderr, "freshet %s: %s\n", cmd, psstore_conn_error(c));
                rc = APP_EXIT_FAILURE;
            } else {
                fr_log(FR_LOG_INFO, "%s: created model '%s' (%s %s, %zu parameters, %d shards)",
                       cmd, name, layers, model_loss_name(loss), m.nparams, spec.shards);
            }
        }
        free(w);
    } else {
        fprintf(stderr, "freshet %s: %s\n", cmd, psstore_conn_error(c));
        rc = APP_EXIT_USAGE;
    }
    psstore_conn_destroy(c);
    return rc;
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
