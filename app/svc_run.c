/*
 * svc_run.c - the trainer roles: "freshet train" (the Kafka consumer and
 * the workers: run several, on any machines, in one consumer group) and
 * "freshet run" (the same plus the applier, in one process: the
 * single-machine default). docs/design.md "Data flow", "Training modes".
 *
 * Every [trainer] mode runs here: async and adaptive (a worker never
 * waits), sync, backup and groups (a worker waits for its round to close)
 * and ssp (a worker waits while it is too far ahead of the slowest).
 *
 * Shutdown on SIGINT or SIGTERM: the consumer stops (its open batch is
 * queued, its partitions revoked, the group left), each worker finishes
 * the batch in hand (batches still queued are abandoned: the next owner
 * reads them again from the store's watermark), the applier commits what
 * it holds and releases the lease; exit 0.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "app/app.h"
#include "ingest/ingest.h"
#include "psstore/psstore.h"
#include "trainer/pool.h"
#include "trainer/trainer.h"

#define PROGRESS_NS     5000000000ull /* a progress line this often */
#define TICK_MS         50            /* the main loop's pace: holdout looks this often */
#define SAMPLES_TICK_MS 10            /* --samples checks the applier this often */
#define START_WAIT_MS   5000          /* the consumer waits this long at most for the lease */
#define STORE_WAIT_MS   2000
#define ROLE_SPARSE     1000 /* role_open: [model] sparse, run by svc_run_sparse.c */
#define STOP_WATCHDOG_S 20   /* a stop that takes longer exits unclean (app_stop_watchdog) */

static void usage_common(FILE *out, const char *cmd, const char *what, const char *extra)
{
    fprintf(out,
            "usage: freshet %s --config F [--set section.key=value ...]%s\n"
            "\n"
            "%s\n"
            "Samples come from [ingest] topic (librdkafka properties in [kafka], with\n"
            "bootstrap.servers), decoded as [ingest] format into batches of [ingest]\n"
            "batch; [trainer] workers threads on [trainer] backend each pull the weights\n"
            "when the store moved, compute the gradient and push it to [redis] url with\n"
            "the batch's offsets. A model missing from the store is created from [model];\n"
            "one with other layers or loss is refused. [eval] data evaluates the model\n"
            "every [eval] every versions. [trainer] mode: async, adaptive, sync, backup,\n"
            "groups, ssp or auto (docs/design.md \"Training modes\").\n"
            "A progress line every 5 s; SIGINT or SIGTERM stops it cleanly (exit 0).\n"
            "\n"
            "  --config F           INI configuration (deploy/freshet.conf.example)\n"
            "  --set S.K=V          override one key (repeatable)\n"
            "%s"
            "  -h, --help           this text\n",
            cmd, extra[0] != '\0' ? " [--samples N] [--summary F]" : "", what, extra);
}

static void run_usage(FILE *out)
{
    usage_common(out, "run",
                 "Trains model [model] name from Kafka in one process: the consumer, the\n"
                 "workers and the applier (the single writer of the model; see freshet ps).",
                 "  --samples N          the applier takes no gradient past N applied samples,\n"
                 "                       and the run stops (as on SIGTERM) once the versions\n"
                 "                       stream counts them (0: never)\n"
                 "  --summary F          at exit write a JSON summary to F: the workers' samples,\n"
                 "                       batches, failed, pulls and times (ns); the applier's\n"
                 "                       applied, dropped by reason, rounds, version, commits\n"
                 "                       and their time\n");
}

static void train_usage(FILE *out)
{
    usage_common(out, "train",
                 "The trainer role: the consumer and the workers, without the applier (run\n"
                 "freshet ps, or freshet run, somewhere). Several processes share the topic's\n"
                 "partitions through the consumer group freshet.<model>.",
                 "");
}

/* The holdout set of [eval] and what evaluating it needs. */
typedef struct holdout {
    ingest_dataset_t ds;
    trainer_backend_t *be;
    float *w;
    int64_t every, last; /* versions between evaluations; the last one done */
    double accuracy, loss;
    fr_series_t *m_acc, *m_loss;
} holdout_t;

/* Loads [eval] data when set; returns 0 or an exit status. */
static int holdout_open(const char *cmd, const fr_config_t *cfg, const model_t *m,
                        fr_metrics_t *metrics, holdout_t *h)
{
    memset(h, 0, sizeof(*h));
    h->last = -1;
    const char *data = fr_config_get(cfg, "eval", "data");
    h->every = fr_config_get_int(cfg, "eval", "every");
    if (data[0] == '\0' || h->every == 0)
        return 0;
    ingest_format_t format;
    ingest_schema_t schema;
    if (ingest_format_parse(fr_config_get(cfg, "eval", "format"), &format) != FR_OK)
        return app_usage_error(cmd, "[eval] format: csv, libsvm, f32 or idx");
    trainer_model_schema(m, &schema);
    const char *labels = fr_config_get(cfg, "eval", "labels");
    int rc = app_load_dataset(cmd, "[eval] labels", &h->ds, &schema, format, data,
                              labels[0] != '\0' ? labels : NULL);
    if (rc != 0)
        return rc;
    char errstr[512];
    h->be = trainer_backend_new(fr_config_get(cfg, "trainer", "backend"), m, 1024, 0, errstr,
                                sizeof(errstr));
    h->w = malloc(m->nparams * sizeof(float));
    if (h->be == NULL || h->w == NULL) {
        fprintf(stderr, "freshet %s: [eval]: %s\n", cmd, h->be ? "out of memory" : errstr);
        return APP_EXIT_FAILURE;
    }
    if (metrics != NULL) {
        fr_metric_t *acc =
            fr_metrics_gauge(metrics, "freshet_holdout_accuracy",
                             "Accuracy of the current model on [eval] data.", 0, NULL);
        fr_metric_t *loss =
            fr_metrics_gauge(metrics, "freshet_holdout_loss",
                             "Mean loss of the current model on [eval] data.", 0, NULL);
        h->m_acc = acc != NULL ? fr_metric_series(acc, NULL) : NULL;
        h->m_loss = loss != NULL ? fr_metric_series(loss, NULL) : NULL;
    }
    fr_log(FR_LOG_INFO, "%s: holdout of %zu samples from %s every %lld versions", cmd, h->ds.n,
           data, (long long)h->every);
    return 0;
}

/* Evaluates the store's model when it moved [eval] every versions. */
static void holdout_tick(const char *cmd, holdout_t *h, psstore_conn_t *c, const char *model,
                         size_t nparams)
{
    if (h->be == NULL || c == NULL)
        return;
    uint64_t epoch;
    int64_t version;
    if (psstore_model_version(c, model, &version) != FR_OK ||
        (h->last >= 0 && version < h->last + h->every) ||
        psstore_model_weights(c, model, h->w, nparams, &epoch, &version) != FR_OK)
        return;
    double loss_sum = 0;
    int64_t correct = 0;
    if (trainer_backend_load(h->be, h->w) != FR_OK ||
        trainer_backend_evaluate(h->be, &loss_sum, &correct, h->ds.x, h->ds.y, h->ds.n) != FR_OK) {
        fr_log(FR_LOG_WARN, "%s: holdout: %s", cmd, trainer_backend_error(h->be));
        return;
    }
    h->last = version;
    h->loss = loss_sum / (double)h->ds.n;
    h->accuracy = (double)correct / (double)h->ds.n;
    if (h->m_acc != NULL)
        fr_series_set(h->m_acc, h->accuracy);
    if (h->m_loss != NULL)
        fr_series_set(h->m_loss, h->loss);
    fr_log(FR_LOG_INFO, "%s: holdout at version %lld: accuracy %.4f, loss %.4f", cmd,
           (long long)version, h->accuracy, h->loss);
    /* for dashboards of any process: the evals stream */
    if (psstore_eval_report(c, model, version, h->accuracy, h->loss) != FR_OK)
        fr_log(FR_LOG_WARN, "%s: holdout: %s", cmd, psstore_conn_error(c));
}

static void holdout_close(holdout_t *h)
{
    ingest_dataset_fini(&h->ds);
    trainer_backend_destroy(h->be);
    free(h->w);
}

typedef struct applier_thread {
    pthread_t tid;
    int running;
    psstore_applier_t *a;
    atomic_int stop; /* set by the main thread, read by the applier's */
} applier_thread_t;

static void *applier_main(void *arg)
{
    applier_thread_t *t = arg;
    fr_thread_name("fr-applier");
    psstore_applier_run(t->a, &t->stop);
    return NULL;
}

ingest_consumer_t *app_consumer_open(const char *cmd, const fr_config_t *cfg,
                                     const ingest_schema_t *schema, ingest_format_t format,
                                     const char *(*props)[2], fr_metrics_t *metrics)
{
    char errstr[512];
    size_t nprops = fr_config_kafka_count(cfg);
    if (nprops > APP_MAX_PROPS) {
        app_usage_error(cmd, "more than %d [kafka] properties", APP_MAX_PROPS);
        return NULL;
    }
    for (size_t i = 0; i < nprops; i++)
        fr_config_kafka_at(cfg, i, &props[i][0], &props[i][1]);
    ingest_consumer_conf_t conf = {
        .props = (const char *const(*)[2])props,
        .nprops = nprops,
        .topic = fr_config_get(cfg, "ingest", "topic"),
        .redis_url = fr_config_get(cfg, "redis", "url"),
        .model = fr_config_get(cfg, "model", "name"),
        .batch = (int)fr_config_get_int(cfg, "ingest", "batch"),
        .queue = (int)fr_config_get_int(cfg, "ingest", "queue"),
        .linger_ms = (int)fr_config_get_int(cfg, "ingest", "linger_ms"),
        .start_latest = strcmp(fr_config_get(cfg, "ingest", "start"), "latest") == 0,
        .whole_topic = strcmp(fr_config_get(cfg, "ingest", "assignment"), "all") == 0 ||
                       (strcmp(fr_config_get(cfg, "ingest", "assignment"), "auto") == 0 &&
                        strcmp(cmd, "run") == 0),
        .dead_letter_topic = fr_config_get(cfg, "ingest", "dead_letter_topic"),
        .gap_timeout_ms = (int)ceil(fr_config_get_double(cfg, "psstore", "gap_timeout") * 1000),
        .decode_threads = (int)fr_config_get_int(cfg, "ingest", "decode_threads"),
        .metrics = metrics,
        .schema = *schema,
        .format = format,
    };
    ingest_consumer_t *c = ingest_consumer_new(&conf, errstr, sizeof(errstr));
    if (c == NULL)
        fprintf(stderr, "freshet %s: %s\n", cmd, errstr);
    return c;
}

/* The consumer of a dense model's records; NULL after printing why. */
static ingest_consumer_t *consumer_open(const char *cmd, const fr_config_t *cfg, const model_t *m,
                                        const char *(*props)[2], fr_metrics_t *metrics)
{
    ingest_schema_t schema;
    ingest_format_t format;
    trainer_model_schema(m, &schema);
    schema.max_abs = (float)fr_config_get_double(cfg, "ingest", "max_abs_feature");
    int64_t features = fr_config_get_int(cfg, "ingest", "features");
    if (features != 0 && features != schema.features) {
        app_usage_error(cmd, "[ingest] features is %lld but the model's input is %d",
                        (long long)features, schema.features);
        return NULL;
    }
    if (ingest_format_parse(fr_config_get(cfg, "ingest", "format"), &format) != FR_OK) {
        app_usage_error(cmd, "[ingest] format: csv, libsvm or f32 (criteo and binary are for a "
                             "[model] sparse)");
        return NULL;
    }
    return app_consumer_open(cmd, cfg, &schema, format, props, metrics);
}

/* The workers of [trainer]; NULL after printing why. */
static trainer_pool_t *pool_open(const char *cmd, const fr_config_t *cfg, const model_t *m,
                                 ingest_consumer_t *source, psstore_local_t *local,
                                 fr_metrics_t *metrics)
{
    char errstr[512];
    int workers = (int)fr_config_get_int(cfg, "trainer", "workers");
    double *slowdown = calloc((size_t)workers, sizeof(double));
    double *slow_s = calloc((size_t)workers, sizeof(double));
    int *devices = calloc((size_t)workers, sizeof(int));
    trainer_pool_t *pool = NULL;
    if (slowdown == NULL || slow_s == NULL || devices == NULL) {
        fprintf(stderr, "freshet %s: out of memory\n", cmd);
    } else if (trainer_slowdown_parse_timed(fr_config_get(cfg, "trainer", "slowdown"), workers,
                                            slowdown, slow_s, errstr, sizeof(errstr)) != FR_OK ||
               trainer_devices_parse(fr_config_get(cfg, "trainer", "devices"), workers, devices,
                                     errstr, sizeof(errstr)) != FR_OK) {
        app_usage_error(cmd, "%s", errstr);
    } else {
        trainer_pool_conf_t conf = {
            .redis_url = fr_config_get(cfg, "redis", "url"),
            .model = fr_config_get(cfg, "model", "name"),
            .m = m,
            .backend = fr_config_get(cfg, "trainer", "backend"),
            .devices = devices,
            .workers = workers,
            .max_batch = (int)fr_config_get_int(cfg, "ingest", "batch"),
            .max_pending = fr_config_get_int(cfg, "psstore", "max_pending"),
            .slowdown = slowdown,
            .slowdown_s = slow_s,
            .source = source,
            .metrics = metrics,
            .local = local,
            .groups = (int)fr_config_get_int(cfg, "trainer", "groups"),
            .ssp_bound = fr_config_get_int(cfg, "trainer", "ssp_bound"),
            .idle_ms = fr_config_get_int(cfg, "trainer", "idle_ms"),
            .in_flight = (int)fr_config_get_int(cfg, "trainer", "in_flight"),
            /* a worker whose gradient missed its round (dropped, or the
             * applier gone) waits no longer than a round can stay open */
            .round_wait_ms =
                (int64_t)(fr_config_get_double(cfg, "trainer", "round_timeout") * 1000) + 1000,
        };
        psstore_mode_parse(fr_config_get(cfg, "trainer", "mode"), &conf.mode);
        if ((pool = trainer_pool_new(&conf, errstr, sizeof(errstr))) == NULL)
            fprintf(stderr, "freshet %s: %s\n", cmd, errstr);
    }
    free(slow_s);
    free(slowdown);
    free(devices);
    return pool;
}

/* One progress line: the interval's samples/s and loss, the store. */
static void progress(const char *cmd, trainer_pool_t *pool, trainer_pool_stats_t *prev,
                     ingest_consumer_t *src, psstore_applier_t *a, const holdout_t *h,
                     double seconds)
{
    trainer_pool_stats_t st;
    ingest_consumer_stats_t cs;
    trainer_pool_stats(pool, &st);
    ingest_consumer_stats(src, &cs);
    uint64_t n = st.samples - prev->samples, nb = st.batches - prev->batches;
    double step_ms = nb > 0 ? (double)(st.compute_ns - prev->compute_ns) * 1e-6 / (double)nb : 0;
    double push_ms = nb > 0 ? (double)(st.push_ns - prev->push_ns) * 1e-6 / (double)nb : 0;
    double loss = n > 0 ? (st.loss_sum - prev->loss_sum) / (double)n : NAN;
    char store[256] = "", eval[96] = "";
    if (a != NULL) {
        psstore_applier_stats_t as;
        psstore_applier_stats(a, &as);
        uint64_t dropped = 0;
        for (int d = 0; d < PSSTORE_NDROP; d++)
            dropped += as.dropped[d];
        snprintf(store, sizeof(store),
                 ", applier %s at version %lld, staleness p50 %lld p99 %lld, lr_eff %.4g, "
                 "applied %llu, dropped %llu, freshness p50 %lld ms p99 %lld ms",
                 as.active ? "active" : "standby", (long long)as.version, (long long)as.tau_p50,
                 (long long)as.tau_p99, as.lr_eff, (unsigned long long)as.applied,
                 (unsigned long long)dropped, (long long)as.fresh_p50_ms,
                 (long long)as.fresh_p99_ms);
    }
    if (h->last >= 0)
        snprintf(eval, sizeof(eval), ", holdout accuracy %.4f (v%lld)", h->accuracy,
                 (long long)h->last);
    fr_log(FR_LOG_INFO,
           "%s: %.0f samples/s, train loss %.4f, computed on version %lld, step %.1f ms, "
           "push %.1f ms, %d partition(s)%s, lag %lld, rejected %llu, failed %llu%s%s",
           cmd, (double)n / seconds, loss, (long long)st.version, step_ms, push_ms, cs.assigned,
           cs.paused ? " (paused)" : "", (long long)cs.lag,
           (unsigned long long)(cs.rejected[1] + cs.rejected[2] + cs.rejected[3] + cs.rejected[4] +
                                cs.rejected[5] + cs.rejected[6]),
           (unsigned long long)st.failed, store, eval);
    *prev = st;
}

/* What one trainer role holds: filled by role_open, released by
 * role_close whatever was reached. */
typedef struct role {
    const char *cmd;
    fr_config_t *cfg;
    fr_metrics_t *metrics;
    const char *(*props)[2];
    ingest_consumer_t *src;
    trainer_pool_t *pool;
    psstore_conn_t *store;
    applier_thread_t at[PSSTORE_SHARDS_MAX]; /* one applier per shard (docs/design.md "Shards") */
    int nat;
    serve_t *http;
    psstore_local_t *local;
    holdout_t h;
    model_t m;
    int64_t samples_limit; /* run --samples: stop at this many applied (0: never) */
    const char *summary;   /* run --summary: the JSON summary's file, or NULL     */
} role_t;

/* Checks [trainer] mode against [psstore] max_pending and builds the model
 * of [model]. Returns 0 or an exit status. */
static int role_model(role_t *r, int64_t *workers, int64_t *max_pending)
{
    char errstr[512];
    model_loss_t loss;
    const char *mode = fr_config_get(r->cfg, "trainer", "mode");
    psstore_mode_t pmode = PSSTORE_MODE_ASYNC;
    psstore_mode_parse(mode, &pmode);
    *workers = fr_config_get_int(r->cfg, "trainer", "workers");
    *max_pending = fr_config_get_int(r->cfg, "psstore", "max_pending");
    if (psstore_mode_rounds(pmode) && *max_pending < 2 * *workers) {
        /* docs/design.md "Training modes": a round holds its entries in the stream until it
         * closes, so a smaller bound deadlocks on the round's own pushes */
        return app_usage_error(r->cmd,
                               "[psstore] max_pending (%lld) must be at least twice [trainer] "
                               "workers (%lld) in mode %s",
                               (long long)*max_pending, (long long)*workers, mode);
    }
    if (model_loss_parse(fr_config_get(r->cfg, "model", "loss"), &loss) != FR_OK ||
        model_init(&r->m, fr_config_get(r->cfg, "model", "layers"), loss, errstr, sizeof(errstr)) !=
            FR_OK)
        return app_usage_error(r->cmd, "[model]: %s", errstr);
    return 0;
}

/* freshet run's applier, on its own thread once started, and the
 * co-located fast path to it. Returns 0 or an exit status. */
static int role_open_applier(role_t *r, int64_t workers, int64_t max_pending)
{
    char errstr[512];
    psstore_applier_conf_t conf;
    int rc = app_applier_conf(r->cmd, r->cfg, r->metrics, &conf);
    if (rc != 0)
        return rc;
    /* --samples: the applier stops taking gradients at the limit, so a
     * run applies N samples and at most one batch (or round) more */
    conf.sample_limit = r->samples_limit;
    psstore_conn_t *c = psstore_conn_new(fr_config_get(r->cfg, "redis", "url"), STORE_WAIT_MS,
                                         errstr, sizeof(errstr));
    psstore_model_info_t info;
    if (c == NULL || psstore_model_info(c, conf.model, &info) != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", r->cmd, c != NULL ? psstore_conn_error(c) : errstr);
        psstore_conn_destroy(c);
        return APP_EXIT_USAGE;
    }
    psstore_conn_destroy(c);
    /* a sharded model: one applier per shard, each on its own thread */
    for (r->nat = 0; r->nat < info.shards; r->nat++) {
        conf.shard = r->nat;
        if ((r->at[r->nat].a = psstore_applier_new(&conf, errstr, sizeof(errstr))) == NULL) {
            fprintf(stderr, "freshet %s: %s\n", r->cmd, errstr);
            return APP_EXIT_USAGE;
        }
    }
    /* the co-located fast path: with [trainer] in_flight = 1 a worker
     * has one gradient queued at most; two slots each serve in_flight 0 */
    int64_t slots = 2 * workers < max_pending ? 2 * workers : max_pending;
    r->local = info.shards > 1
                   ? psstore_local_new_shards(info.bounds, info.shards, (size_t)slots, errstr,
                                              sizeof(errstr))
                   : psstore_local_new(r->m.nparams, (size_t)slots, errstr, sizeof(errstr));
    if (r->local == NULL) {
        fprintf(stderr, "freshet %s: %s\n", r->cmd, errstr);
        return APP_EXIT_FAILURE;
    }
    for (int k = 0; k < r->nat; k++)
        psstore_applier_set_local(r->at[k].a, r->local);
    return 0;
}

/* freshet run's HTTP server of [serve], not started yet. Returns 0 or an
 * exit status. */
static int role_open_http(role_t *r)
{
    char errstr[512];
    /* docs/design.md "Data flow": freshet run is ingest + trainers + applier + serve */
    serve_conf_t sconf;
    int rc = app_serve_conf(r->cmd, r->cfg, r->metrics, &sconf);
    if (rc != 0)
        return rc;
    if ((r->http = serve_new(&sconf, errstr, sizeof(errstr))) == NULL) {
        fprintf(stderr,
                "freshet %s: %s (set [serve] listen to another address, or empty "
                "for no HTTP)\n",
                r->cmd, errstr);
        return APP_EXIT_USAGE;
    }
    return 0;
}

/* Everything the role needs, in the order it needs it; nothing runs yet.
 * Returns 0, -1 after printing --help, or an exit status. */
static int role_open(role_t *r, int with_applier, void (*usage)(FILE *), int argc, char **argv)
{
    char errstr[512];
    int64_t workers, max_pending;
    int rc = app_load_config(r->cmd, r->cfg, argc, argv, usage);
    if (rc == 0 && fr_config_get(r->cfg, "model", "sparse")[0] != '\0')
        return ROLE_SPARSE; /* svc_run_sparse.c */
    if (rc != 0 || (rc = role_model(r, &workers, &max_pending)) != 0 ||
        (rc = app_ensure_model(r->cmd, r->cfg)) != 0 ||
        (rc = holdout_open(r->cmd, r->cfg, &r->m, r->metrics, &r->h)) != 0)
        return rc;
    if (with_applier && (rc = role_open_applier(r, workers, max_pending)) != 0)
        return rc;
    if (with_applier && fr_config_get(r->cfg, "serve", "listen")[0] != '\0' &&
        (rc = role_open_http(r)) != 0)
        return rc;
    if ((r->src = consumer_open(r->cmd, r->cfg, &r->m, r->props, r->metrics)) == NULL ||
        (r->pool = pool_open(r->cmd, r->cfg, &r->m, r->src, r->local, r->metrics)) == NULL)
        return APP_EXIT_USAGE;
    r->store = psstore_conn_new(fr_config_get(r->cfg, "redis", "url"), STORE_WAIT_MS, errstr,
                                sizeof(errstr));
    return 0;
}

/* Starts the applier thread, the HTTP server, the consumer and the
 * workers; on a failure sets app_stop (what started runs until the role
 * closes). Returns 0 or APP_EXIT_FAILURE. */
static int role_start(role_t *r)
{
    char errstr[512];
    int rc = 0;
    app_stop_on_signals(1);
    int appliers_up = 1;
    for (int k = 0; k < r->nat; k++) {
        r->at[k].running = pthread_create(&r->at[k].tid, NULL, applier_main, &r->at[k]) == 0;
        appliers_up &= r->at[k].running;
    }
    if (r->http != NULL && serve_start(r->http, errstr, sizeof(errstr)) != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", r->cmd, errstr);
        atomic_store(&app_stop, 1);
        rc = APP_EXIT_FAILURE;
    }
    /* the first batches wait for the appliers' first attempt at the lease
     * (a few ms; at most START_WAIT_MS): a gradient computed before the
     * in-process channel opens goes through the stream, which the applier
     * reads every 10 ms, so gradients pushed after it through the channel
     * would be applied first (docs/design.md "The co-located fast path") */
    uint64_t t0 = fr_clock_mono_ns();
    for (int k = 0; appliers_up && k < r->nat && !atomic_load(&app_stop);) {
        if (psstore_applier_tried(r->at[k].a)) {
            k++;
            continue;
        }
        if (fr_clock_mono_ns() - t0 > START_WAIT_MS * 1000000ull) {
            fr_log(FR_LOG_WARN,
                   "%s: the applier of shard %d has not ended its first attempt at the lease "
                   "within %d ms; the consumer starts (its first gradients may go through Redis)",
                   r->cmd, k, START_WAIT_MS);
            break;
        }
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    if (!appliers_up || ingest_consumer_start(r->src) != FR_OK ||
        trainer_pool_start(r->pool) != FR_OK) {
        fprintf(stderr, "freshet %s: could not start\n", r->cmd);
        atomic_store(&app_stop, 1);
        rc = APP_EXIT_FAILURE;
    }
    fr_log(FR_LOG_INFO, "%s: model %s, mode %s, %lld worker(s), topic %s", r->cmd,
           fr_config_get(r->cfg, "model", "name"), fr_config_get(r->cfg, "trainer", "mode"),
           (long long)fr_config_get_int(r->cfg, "trainer", "workers"),
           fr_config_get(r->cfg, "ingest", "topic"));
    return rc;
}

/* The appliers' counters: shard 0's, with the version the sum of the
 * shards' (the model's version) and the samples the least of theirs (a
 * sample counts once every shard applied it). Zeros without an applier. */
static void role_applier_stats(const role_t *r, psstore_applier_stats_t *as)
{
    memset(as, 0, sizeof(*as));
    for (int k = 0; k < r->nat; k++) {
        psstore_applier_stats_t sh;
        psstore_applier_stats(r->at[k].a, &sh);
        if (k == 0) {
            *as = sh;
            continue;
        }
        as->version += sh.version;
        as->commits += sh.commits;
        as->commit_ns += sh.commit_ns;
        as->fenced += sh.fenced;
        as->samples = sh.samples < as->samples ? sh.samples : as->samples;
    }
}

/* run --samples: whether the applier has applied the limit (it takes no
 * gradient past it, and commits what it holds when halted); logs it once. */
static int samples_reached(const role_t *r)
{
    psstore_applier_stats_t as;
    if (r->samples_limit <= 0 || r->nat == 0)
        return 0;
    for (int k = 0; k < r->nat; k++) /* a sample is applied once every shard applied it */
        if (psstore_applier_samples(r->at[k].a) < r->samples_limit)
            return 0;
    role_applier_stats(r, &as);
    fr_log(FR_LOG_INFO, "%s: %lld samples applied (--samples %lld) at version %lld", r->cmd,
           (long long)as.samples, (long long)r->samples_limit, (long long)as.version);
    return 1;
}

/* The main thread until SIGINT or SIGTERM, or --samples (checked every
 * SAMPLES_TICK_MS): the holdout every TICK_MS and a progress line every
 * PROGRESS_NS. */
static void role_loop(role_t *r)
{
    trainer_pool_stats_t prev = {0};
    uint64_t last = fr_clock_mono_ns(), tick = last;
    long step_ms = r->samples_limit > 0 ? SAMPLES_TICK_MS : TICK_MS;
    while (!atomic_load(&app_stop)) {
        struct timespec ts = {0, step_ms * 1000000L};
        nanosleep(&ts, NULL);
        if (samples_reached(r)) {
            atomic_store(&app_stop, 1);
            break;
        }
        uint64_t now = fr_clock_mono_ns();
        if (now - tick < TICK_MS * 1000000ull)
            continue;
        tick = now;
        holdout_tick(r->cmd, &r->h, r->store, fr_config_get(r->cfg, "model", "name"), r->m.nparams);
        if (now - last >= PROGRESS_NS) {
            progress(r->cmd, r->pool, &prev, r->src, r->at[0].a, &r->h,
                     (double)(now - last) * 1e-9);
            last = now;
        }
    }
    fr_log(FR_LOG_INFO, "%s: stopping", r->cmd);
    app_stop_watchdog(r->cmd, STOP_WATCHDOG_S);
}

/* Stops what runs, HTTP first, then the consumer, the workers and the
 * applier (which commits what it holds); their counters stay readable. */
static void role_halt(role_t *r)
{
    app_stop_stage("the HTTP server");
    serve_destroy(r->http);
    r->http = NULL;
    app_stop_stage("the consumer (its last commit, closing the Kafka client)");
    ingest_consumer_stop(r->src);
    app_stop_stage("the workers (the batch in hand)");
    trainer_pool_stop(r->pool);
    app_stop_stage("the applier (its last commit)");
    for (int k = 0; k < r->nat; k++)
        atomic_store(&r->at[k].stop, 1);
    for (int k = 0; k < r->nat; k++) {
        if (r->at[k].running) {
            pthread_join(r->at[k].tid, NULL);
            r->at[k].running = 0;
        }
    }
}

/* Stops and frees what role_open made, HTTP first, the config last. */
static void role_close(role_t *r)
{
    role_halt(r);
    trainer_pool_destroy(r->pool);
    app_stop_stage("the Kafka client (rd_kafka_destroy)");
    ingest_consumer_destroy(r->src);
    for (int k = 0; k < r->nat; k++)
        psstore_applier_destroy(r->at[k].a);
    psstore_local_destroy(r->local);
    psstore_conn_destroy(r->store);
    holdout_close(&r->h);
    free(r->props);
    fr_metrics_destroy(r->metrics);
    fr_config_destroy(r->cfg);
}

/* run --summary: the workers' and the applier's counters as one JSON
 * object (keys unique, for app_json_find_num). Returns 0 or
 * APP_EXIT_FAILURE after printing why. */
static int summary_write(const role_t *r)
{
    trainer_pool_stats_t st = {0};
    psstore_applier_stats_t as = {0};
    trainer_pool_stats(r->pool, &st);
    role_applier_stats(r, &as);
    FILE *f = fopen(r->summary, "w");
    if (f == NULL) {
        fprintf(stderr, "freshet %s: --summary %s: %s\n", r->cmd, r->summary, strerror(errno));
        return APP_EXIT_FAILURE;
    }
    fputs("{\"model\":", f);
    app_json_str(f, fr_config_get(r->cfg, "model", "name"));
    fputs(",\"mode\":", f);
    app_json_str(f, fr_config_get(r->cfg, "trainer", "mode"));
    fprintf(f,
            ",\"workers\":%lld,\"samples_limit\":%lld,\"stopped_by\":\"%s\","
            "\"applied_samples\":%lld,\"trainer\":{\"samples\":%llu,\"batches\":%llu,"
            "\"failed\":%llu,\"pulls\":%llu,\"compute_ns\":%llu,\"push_ns\":%llu,\"wait_ns\":%llu,"
            "\"pull_ns\":%llu,\"starved_ns\":%llu,\"idle_ns\":%llu},",
            (long long)fr_config_get_int(r->cfg, "trainer", "workers"), (long long)r->samples_limit,
            r->samples_limit > 0 && as.samples >= r->samples_limit ? "samples" : "signal",
            (long long)as.samples, (unsigned long long)st.samples, (unsigned long long)st.batches,
            (unsigned long long)st.failed, (unsigned long long)st.pulls,
            (unsigned long long)st.compute_ns, (unsigned long long)st.push_ns,
            (unsigned long long)st.wait_ns, (unsigned long long)st.pull_ns,
            (unsigned long long)st.starved_ns, (unsigned long long)st.idle_ns);
    fprintf(f,
            "\"applier\":{\"applied\":%llu,\"rounds\":%llu,\"version\":%lld,\"commits\":%llu,"
            "\"commit_ns\":%llu,\"fenced\":%llu,\"dropped\":{",
            (unsigned long long)as.applied, (unsigned long long)as.rounds, (long long)as.version,
            (unsigned long long)as.commits, (unsigned long long)as.commit_ns,
            (unsigned long long)as.fenced);
    for (int d = 0; d < PSSTORE_NDROP; d++)
        fprintf(f, "%s\"%s\":%llu", d ? "," : "", psstore_drop_name((psstore_drop_t)d),
                (unsigned long long)as.dropped[d]);
    fputs("}}}\n", f);
    if (fclose(f) != 0) {
        fprintf(stderr, "freshet %s: --summary %s: %s\n", r->cmd, r->summary, strerror(errno));
        return APP_EXIT_FAILURE;
    }
    return 0;
}

/* Takes run's own options (--samples N, --summary F, also as --opt=value)
 * out of argv into r, leaving the --config and --set ones in argv (argc
 * updated) for app_load_config. Returns 0 or an exit status. */
static int run_opts_take(role_t *r, int *argc, char **argv)
{
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i], *v = NULL;
        int samples = strncmp(a, "--samples", 9) == 0 && (a[9] == '\0' || a[9] == '=');
        int summary = strncmp(a, "--summary", 9) == 0 && (a[9] == '\0' || a[9] == '=');
        if (!samples && !summary) {
            argv[out++] = argv[i];
            /* the value of --config or --set is never an option of ours */
            if ((strcmp(a, "--config") == 0 || strcmp(a, "--set") == 0) && i + 1 < *argc)
                argv[out++] = argv[++i];
            continue;
        }
        if (a[9] == '=')
            v = a + 10;
        else if (i + 1 < *argc)
            v = argv[++i];
        else
            return app_usage_error(r->cmd, "%s needs a value", a);
        long long n;
        if (summary)
            r->summary = v;
        else if (app_parse_long(r->cmd, "--samples", v, 0, INT64_MAX, &n) != 0)
            return APP_EXIT_USAGE;
        else
            r->samples_limit = n;
    }
    argv[out] = NULL;
    *argc = out;
    return 0;
}

/* freshet run (with_applier) and freshet train. */
static int run_role(const char *cmd, int with_applier, void (*usage)(FILE *), int argc, char **argv)
{
    role_t r = {.cmd = cmd, .h = {.last = -1}};
    if (with_applier) {
        int rc = run_opts_take(&r, &argc, argv);
        if (rc != 0)
            return rc;
    }
    r.cfg = fr_config_new();
    r.metrics = fr_metrics_new();
    r.props = calloc(APP_MAX_PROPS, sizeof(*r.props));
    if (r.cfg == NULL || r.metrics == NULL || r.props == NULL) {
        fr_config_destroy(r.cfg);
        fr_metrics_destroy(r.metrics);
        free(r.props);
        return APP_EXIT_FAILURE;
    }
    int rc = role_open(&r, with_applier, usage, argc, argv);
    if (rc == ROLE_SPARSE)
        rc = with_applier && r.summary != NULL
                 ? app_usage_error(cmd, "--summary is for dense models; a sparse run logs its "
                                        "figures")
                 : app_run_sparse(cmd, r.cfg, r.metrics, r.props, r.samples_limit,
                                  with_applier ? APP_SPARSE_APPLIER | APP_SPARSE_WORKERS
                                               : APP_SPARSE_WORKERS,
                                  NULL);
    else if (rc == 0) {
        rc = role_start(&r);
        role_loop(&r);
        role_halt(&r);
        if (r.summary != NULL && summary_write(&r) != 0 && rc == 0)
            rc = APP_EXIT_FAILURE;
    }
    role_close(&r);
    return rc < 0 ? 0 : rc;
}

int app_cmd_run(int argc, char **argv)
{
    return run_role("run", 1, run_usage, argc, argv);
}

int app_cmd_train(int argc, char **argv)
{
    return run_role("train", 0, train_usage, argc, argv);
}
