/*
 * svc_run_sparse.c - freshet run for a sparse model ([model] sparse;
 * docs/design.md "Sparse models"): the consumer decodes Criteo, libsvm or
 * binary records into packed sparse samples, the sparse workers pull each
 * batch's rows and push the rows' gradients to the grads stream, and the
 * model's applier applies them with the per-row optimizer and commits the
 * rows with the offsets (exactly once, as for dense models). The
 * in-process channel of dense runs is not used: a gradient carries only
 * its batch's rows, so the stream is the path. [serve] listen serves the
 * rows, deltas and table pages (docs/design.md "Serving sparse models");
 * no holdout for sparse models yet.
 *
 * A model of S shards ([psstore] shards when it is created; docs/design.md
 * "Sparse models on shards") has an applier per shard: freshet run starts
 * all of them on threads of their own, freshet ps those of --shards.
 *
 * Shutdown as dense runs: SIGINT or SIGTERM stops the consumer, the
 * workers finish their batch, the appliers commit and release their
 * leases.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "app/app.h"
#include "ingest/ingest.h"
#include "psstore/psstore.h"
#include "serve/serve.h"
#include "sparse/sparse.h"
#include "trainer/pool_sparse.h"
#include "trainer/schema_sparse.h"

#define TICK_MS     10            /* --samples checks the applier this often */
#define PROGRESS_NS 5000000000ull /* a progress line this often             */

typedef struct sparse_run sparse_run_t;

typedef struct shard_applier {
    sparse_run_t *r;
    psstore_applier_t *a; /* NULL: not run here */
    pthread_t tid;
    int running;
} shard_applier_t;

struct sparse_run {
    const char *cmd;
    const fr_config_t *cfg;
    trainer_sparse_decoder_t dec;
    sparse_optim_t optim;
    int S;         /* the model's shards */
    uint64_t mask; /* the shards whose applier runs here (freshet ps --shards) */
    shard_applier_t ap[PSSTORE_SHARDS_MAX];
    int nappliers; /* appliers run here */
    atomic_int applier_stop;
    ingest_consumer_t *src;
    trainer_sparse_t *pool;
    serve_t *http; /* [serve] listen: rows, deltas and table pages; NULL without */
    int parts;     /* APP_SPARSE_APPLIER and/or APP_SPARSE_WORKERS */
};

static void *applier_main(void *arg)
{
    shard_applier_t *t = arg;
    fr_thread_name("fr-applier");
    psstore_applier_run(t->a, &t->r->applier_stop);
    return NULL;
}

/* The appliers' stats added up: the version, counts and evictions summed
 * over the shards, staleness and freshness the worst shard's; active when
 * every one run here holds its lease. */
static void appliers_stats(sparse_run_t *r, psstore_applier_stats_t *as)
{
    memset(as, 0, sizeof(*as));
    as->active = 1;
    as->fresh_p50_ms = as->fresh_p99_ms = -1; /* none yet */
    for (int k = 0; k < r->S; k++) {
        if (r->ap[k].a == NULL)
            continue;
        psstore_applier_stats_t st;
        psstore_applier_stats(r->ap[k].a, &st);
        as->active &= st.active;
        as->version += st.version;
        as->applied += st.applied;
        as->evicted += st.evicted;
        for (int d = 0; d < PSSTORE_NDROP; d++)
            as->dropped[d] += st.dropped[d];
        as->tau_p50 = st.tau_p50 > as->tau_p50 ? st.tau_p50 : as->tau_p50;
        as->tau_p99 = st.tau_p99 > as->tau_p99 ? st.tau_p99 : as->tau_p99;
        as->fresh_p50_ms = st.fresh_p50_ms > as->fresh_p50_ms ? st.fresh_p50_ms : as->fresh_p50_ms;
        as->fresh_p99_ms = st.fresh_p99_ms > as->fresh_p99_ms ? st.fresh_p99_ms : as->fresh_p99_ms;
        if (as->stopped[0] == '\0' && st.stopped[0] != '\0')
            snprintf(as->stopped, sizeof(as->stopped), "shard %d: %.200s", k, st.stopped);
    }
}

/* The samples every applier run here applied (the least of theirs). */
static int64_t appliers_samples(sparse_run_t *r)
{
    int64_t least = -1;
    for (int k = 0; k < r->S; k++)
        if (r->ap[k].a != NULL) {
            int64_t n = psstore_applier_samples(r->ap[k].a);
            least = least < 0 || n < least ? n : least;
        }
    return least < 0 ? 0 : least;
}

/* The table, the layout and the optimizer of the configuration. Returns 0
 * or an exit status. */
static int read_conf(sparse_run_t *r)
{
    char errstr[256];
    const fr_config_t *cfg = r->cfg;
    if (sparse_spec_parse(fr_config_get(cfg, "model", "sparse"), &r->dec.spec, errstr,
                          sizeof(errstr)) != FR_OK)
        return app_usage_error(r->cmd, "[model] sparse: %s", errstr);
    const char *format = fr_config_get(cfg, "ingest", "format");
    if (!(r->parts & APP_SPARSE_WORKERS)) /* freshet ps reads no records */
        r->dec.layout = SPARSE_LAYOUT_BINARY;
    else if (sparse_layout_parse(format, &r->dec.layout) != FR_OK)
        return app_usage_error(r->cmd,
                               "[ingest] format: a sparse model reads criteo, libsvm or binary "
                               "records, not %s",
                               format);
    if (r->dec.layout == SPARSE_LAYOUT_CRITEO && r->dec.spec.fields < SPARSE_CRITEO_FIELDS)
        return app_usage_error(r->cmd,
                               "[ingest] format criteo needs [model] sparse fields:%d or "
                               "more",
                               SPARSE_CRITEO_FIELDS);
    if (strcmp(fr_config_get(cfg, "trainer", "mode"), "async") != 0)
        return app_usage_error(r->cmd, "a sparse model trains in [trainer] mode async for now");
    sparse_optim_kind_t kind;
    sparse_optim_parse(fr_config_get(cfg, "sparse", "optimizer"), &kind); /* an enum key */
    sparse_optim_defaults(&r->optim, kind);
    r->optim.lr = (float)fr_config_get_double(cfg, "sparse", "lr");
    r->optim.alpha = (float)fr_config_get_double(cfg, "sparse", "alpha");
    r->optim.beta = (float)fr_config_get_double(cfg, "sparse", "beta");
    r->optim.l1 = (float)fr_config_get_double(cfg, "sparse", "l1");
    r->optim.l2 = (float)fr_config_get_double(cfg, "sparse", "l2");
    r->optim.seed = (uint64_t)fr_config_get_int(cfg, "model", "seed");
    return 0;
}

/*
 * Creates the model when the store has none (bias 0, rows at their
 * initial values); refuses a model of another kind, table or row layout.
 * Meta's `sparse` names the table and what fixes a stored row's size and
 * an absent row's value: the optimizer (its state's size), the seed and
 * the initial spread, so that a run or standby configured otherwise cannot
 * read rows of another size or initialise absent rows differently from
 * the applier (learning rates may change between runs).
 */
static int ensure_model(sparse_run_t *r)
{
    char errstr[512], table[64], spec[160];
    const char *url = fr_config_get(r->cfg, "redis", "url");
    const char *name = fr_config_get(r->cfg, "model", "name");
    sparse_spec_format(&r->dec.spec, table, sizeof(table));
    snprintf(spec, sizeof(spec), "%s;optimizer:%s;seed:%llu;init_std:%g", table,
             sparse_optim_name(r->optim.kind), (unsigned long long)r->optim.seed,
             (double)r->optim.init_std);
    psstore_conn_t *c = psstore_conn_new(url, 2000, errstr, sizeof(errstr));
    if (c == NULL) {
        fprintf(stderr, "freshet %s: %s\n", r->cmd, errstr);
        return APP_EXIT_USAGE;
    }
    int rc = 0;
    psstore_model_info_t info;
    fr_err_t err = psstore_model_info(c, name, &info);
    if (err == FR_OK && strcmp(info.sparse, spec) != 0) {
        rc = app_usage_error(r->cmd,
                             "model '%s' in the store is %s%s; the configuration says "
                             "sparse %s",
                             name, info.sparse[0] ? "sparse " : "",
                             info.sparse[0] ? info.sparse : info.layers, spec);
    } else if (err == FR_ERR_NOTFOUND) {
        /* shard 0's w is the dense part (the bias 0, the tower at its
         * initial values), each other shard's one float held at 0 */
        int S = (int)fr_config_get_int(r->cfg, "psstore", "shards");
        size_t nd = sparse_dense_len(&r->dec.spec), n = nd + (size_t)S - 1;
        float *w = calloc(n, sizeof(float));
        psstore_model_spec_t ms = {"sparse", "logistic", n, S, spec};
        if (w == NULL) {
            fprintf(stderr, "freshet %s: out of memory\n", r->cmd);
            rc = APP_EXIT_FAILURE;
        } else {
            sparse_dense_init(&r->dec.spec, r->optim.seed, w);
            if (psstore_model_create(c, name, &ms, w, 0) != FR_OK &&
                psstore_model_info(c, name, &info) != FR_OK) /* another process created it: fine */
                rc = app_usage_error(r->cmd, "%s", psstore_conn_error(c));
            else if (psstore_model_info(c, name, &info) != FR_OK)
                rc = app_usage_error(r->cmd, "%s", psstore_conn_error(c));
        }
        free(w);
    } else if (err != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", r->cmd, psstore_conn_error(c));
        rc = APP_EXIT_USAGE;
    }
    psstore_conn_destroy(c);
    if (rc == 0) /* the store's shards, whatever [psstore] shards says now */
        r->S = info.shards > 1 ? info.shards : 1;
    return rc;
}

/* Shard k's applier, not started. */
static int open_applier(sparse_run_t *r, int k, fr_metrics_t *metrics, int64_t samples_limit)
{
    char errstr[512];
    psstore_applier_conf_t conf;
    int rc = app_applier_conf(r->cmd, r->cfg, metrics, &conf);
    if (rc != 0)
        return rc;
    conf.sample_limit = samples_limit;
    /* freshet run's workers read the applier's table and wait for its
     * decisions, not commits: commits group the window's gradients
     * ([psstore] commit_ms). freshet train's workers wait for the commit
     * (in_flight, in their own configuration), so freshet ps commits as
     * soon as the stream is drained */
    conf.commit_drained = !(r->parts & APP_SPARSE_WORKERS);
    conf.sparse.enabled = 1;
    /* the workers of this process decide their own gradients on the
     * applier's table, and the applier writes each window behind
     * (docs/design.md "The store written behind") */
    conf.sparse.inproc = (r->parts & APP_SPARSE_WORKERS) != 0;
    conf.sparse.min_count = (int)fr_config_get_int(r->cfg, "sparse", "min_count");
    conf.sparse.ttl_ms = fr_config_get_int(r->cfg, "sparse", "ttl_seconds") * 1000;
    conf.sparse.delta_ms = fr_config_get_int(r->cfg, "sparse", "delta_seconds") * 1000;
    conf.sparse.spec = r->dec.spec;
    conf.sparse.optim = r->optim;
    conf.shard = k;
    if ((r->ap[k].a = psstore_applier_new(&conf, errstr, sizeof(errstr))) == NULL) {
        if (r->S > 1)
            fprintf(stderr, "freshet %s: shard %d: %s\n", r->cmd, k, errstr);
        else
            fprintf(stderr, "freshet %s: %s\n", r->cmd, errstr);
        return APP_EXIT_USAGE;
    }
    r->ap[k].r = r;
    r->nappliers++;
    return 0;
}

/* The parts of r: the applier, the consumer and the workers, not
 * started. */
static int open_all(sparse_run_t *r, fr_metrics_t *metrics, const char *(*props)[2],
                    int64_t samples_limit)
{
    char errstr[512];
    for (int k = 0; k < r->S && (r->parts & APP_SPARSE_APPLIER); k++) {
        int rc = r->mask >> k & 1 ? open_applier(r, k, metrics, samples_limit) : 0;
        if (rc != 0)
            return rc;
    }
    if (!(r->parts & APP_SPARSE_WORKERS))
        return 0;
    ingest_schema_t schema = {.features = SPARSE_PACKED(r->dec.spec.fields),
                              .aux = SPARSE_PLANTED_SLOT(r->dec.spec.fields),
                              .label = INGEST_LABEL_BINARY,
                              .decode = trainer_sparse_decode,
                              .decode_arg = &r->dec};
    if ((r->src = app_consumer_open(r->cmd, r->cfg, &schema, INGEST_FORMAT_CSV, props, metrics)) ==
        NULL)
        return APP_EXIT_USAGE;
    trainer_sparse_conf_t wc = {
        .redis_url = fr_config_get(r->cfg, "redis", "url"),
        .model = fr_config_get(r->cfg, "model", "name"),
        .spec = r->dec.spec,
        .optim = r->optim,
        .workers = (int)fr_config_get_int(r->cfg, "trainer", "workers"),
        .max_batch = (int)fr_config_get_int(r->cfg, "ingest", "batch"),
        .max_pending = fr_config_get_int(r->cfg, "psstore", "max_pending"),
        .in_flight = (int)fr_config_get_int(r->cfg, "trainer", "in_flight"),
        .window = (size_t)fr_config_get_int(r->cfg, "sparse", "window"),
        .source = r->src,
        .shards = r->S,
    };
    for (int k = 0; k < r->S; k++)
        wc.appliers[k] = r->ap[k].a;
    if ((r->pool = trainer_sparse_new(&wc, errstr, sizeof(errstr))) == NULL) {
        fprintf(stderr, "freshet %s: %s\n", r->cmd, errstr);
        return APP_EXIT_USAGE;
    }
    return 0;
}

/* One progress line: the interval's samples/s and progressive logloss,
 * rows pulled, the applier. */
static void progress(sparse_run_t *r, trainer_sparse_stats_t *prev, psstore_applier_stats_t *aprev,
                     double seconds)
{
    trainer_sparse_stats_t st = {0};
    ingest_consumer_stats_t cs = {0};
    psstore_applier_stats_t as = {0};
    if (r->nappliers > 0)
        appliers_stats(r, &as);
    if (r->pool == NULL) { /* freshet ps */
        uint64_t dropped = 0;
        for (int d = 0; d < PSSTORE_NDROP; d++)
            dropped += as.dropped[d];
        fr_log(FR_LOG_INFO,
               "%s: %s version %lld, %.0f updates/s, applied %llu, dropped %llu, evicted %llu, "
               "staleness p50 %lld p99 %lld%s%s",
               r->cmd, as.active ? "active" : "standby", (long long)as.version,
               (double)(as.applied - aprev->applied) / seconds, (unsigned long long)as.applied,
               (unsigned long long)dropped, (unsigned long long)as.evicted, (long long)as.tau_p50,
               (long long)as.tau_p99, as.stopped[0] ? ", stopped: " : "", as.stopped);
        *aprev = as;
        return;
    }
    trainer_sparse_stats(r->pool, &st);
    ingest_consumer_stats(r->src, &cs);
    uint64_t n = st.samples - prev->samples, nb = st.batches - prev->batches, dropped = 0;
    double per = nb > 0 ? 1e-6 / (double)nb : 0; /* ns summed -> ms a batch */
    for (int d = 0; d < PSSTORE_NDROP; d++)
        dropped += as.dropped[d];
    char applier[256] = "; the applier runs in freshet ps";
    if (r->nappliers > 0)
        snprintf(applier, sizeof(applier),
                 ", %s %s at version %lld, applied %llu, dropped %llu, staleness p50 %lld "
                 "p99 %lld, freshness p50 %lld ms p99 %lld ms",
                 r->nappliers > 1 ? "appliers" : "applier", as.active ? "active" : "standby",
                 (long long)as.version, (unsigned long long)as.applied, (unsigned long long)dropped,
                 (long long)as.tau_p50, (long long)as.tau_p99, (long long)as.fresh_p50_ms,
                 (long long)as.fresh_p99_ms);
    fr_log(FR_LOG_INFO,
           "%s: %.0f samples/s, progressive logloss %.5f, %.0f rows/s, a batch: wait %.1f ms, "
           "pull %.1f ms, compute %.1f ms, push %.1f ms; computed on version %lld, "
           "%d partition(s), lag %lld, failed %llu, decided in process %llu, window full %llu%s",
           r->cmd, (double)n / seconds, n > 0 ? (st.loss_sum - prev->loss_sum) / (double)n : 0.0,
           (double)(st.rows - prev->rows) / seconds, (double)(st.wait_ns - prev->wait_ns) * per,
           (double)(st.pull_ns - prev->pull_ns) * per,
           (double)(st.compute_ns - prev->compute_ns) * per,
           (double)(st.push_ns - prev->push_ns) * per, (long long)st.version, cs.assigned,
           (long long)cs.lag, (unsigned long long)st.failed, (unsigned long long)st.in_process,
           (unsigned long long)st.backpressure_waits, applier);
    *prev = st;
    *aprev = as;
}

int app_run_sparse(const char *cmd, const fr_config_t *cfg, fr_metrics_t *metrics,
                   const char *(*props)[2], int64_t samples_limit, int parts, const char *shards)
{
    sparse_run_t r = {.cmd = cmd, .cfg = cfg, .parts = parts, .S = 1};
    atomic_init(&r.applier_stop, 0);
    int rc = read_conf(&r);
    if (rc == 0)
        rc = ensure_model(&r);
    char errstr[512];
    r.mask = r.S >= 64 ? ~0ull : (1ull << r.S) - 1;
    if (rc == 0 && shards != NULL &&
        psstore_shard_list_parse(shards, r.S, &r.mask, errstr, sizeof(errstr)) != FR_OK)
        rc = app_usage_error(cmd, "--%s (model '%s' has %d)", errstr,
                             fr_config_get(cfg, "model", "name"), r.S);
    if (rc == 0)
        rc = open_all(&r, metrics, props, samples_limit);
    if (rc == 0 && parts == (APP_SPARSE_APPLIER | APP_SPARSE_WORKERS) &&
        fr_config_get(cfg, "serve", "listen")[0] != '\0') {
        /* rows, deltas and table pages (docs/design.md "Serving sparse models") */
        serve_conf_t sconf;
        rc = app_serve_conf(cmd, cfg, metrics, &sconf);
        if (rc == 0 && (r.http = serve_new(&sconf, errstr, sizeof(errstr))) == NULL) {
            fprintf(stderr,
                    "freshet %s: %s (set [serve] listen to another address, or empty for no "
                    "HTTP)\n",
                    cmd, errstr);
            rc = APP_EXIT_USAGE;
        }
    }
    if (rc == 0) {
        app_stop_on_signals(1);
        int started = 1;
        for (int k = 0; k < r.S; k++) {
            shard_applier_t *t = &r.ap[k];
            t->running = t->a != NULL && pthread_create(&t->tid, NULL, applier_main, t) == 0;
            started &= t->a == NULL || t->running;
        }
        if (!started || (r.src != NULL && ingest_consumer_start(r.src) != FR_OK) ||
            (r.pool != NULL && trainer_sparse_start(r.pool) != FR_OK)) {
            fprintf(stderr, "freshet %s: could not start\n", cmd);
            atomic_store(&app_stop, 1);
            rc = APP_EXIT_FAILURE;
        }
        if (r.http != NULL && serve_start(r.http, errstr, sizeof(errstr)) != FR_OK) {
            fprintf(stderr, "freshet %s: %s\n", cmd, errstr);
            atomic_store(&app_stop, 1);
            rc = APP_EXIT_FAILURE;
        }
        char spec[64];
        sparse_spec_format(&r.dec.spec, spec, sizeof(spec));
        if (r.pool != NULL)
            fr_log(FR_LOG_INFO,
                   "%s: sparse model %s (%s, %s, %d shard%s), %lld worker(s), topic %s%s", cmd,
                   fr_config_get(cfg, "model", "name"), spec, sparse_optim_name(r.optim.kind), r.S,
                   r.S == 1 ? "" : "s", (long long)fr_config_get_int(cfg, "trainer", "workers"),
                   fr_config_get(cfg, "ingest", "topic"),
                   r.nappliers == 0 ? "; its appliers run in freshet ps" : "");
        else
            fr_log(FR_LOG_INFO, "%s: %d applier(s) of sparse model %s (%s, %s, %d shard%s)", cmd,
                   r.nappliers, fr_config_get(cfg, "model", "name"), spec,
                   sparse_optim_name(r.optim.kind), r.S, r.S == 1 ? "" : "s");
        trainer_sparse_stats_t prev = {0};
        psstore_applier_stats_t aprev = {0};
        uint64_t last = fr_clock_mono_ns();
        while (!atomic_load(&app_stop)) {
            struct timespec ts = {0, TICK_MS * 1000000L};
            nanosleep(&ts, NULL);
            if (samples_limit > 0 && r.nappliers > 0 && appliers_samples(&r) >= samples_limit) {
                fr_log(FR_LOG_INFO, "%s: %lld samples applied (--samples %lld)", cmd,
                       (long long)appliers_samples(&r), (long long)samples_limit);
                break;
            }
            uint64_t now = fr_clock_mono_ns();
            if (now - last >= PROGRESS_NS) {
                progress(&r, &prev, &aprev, (double)(now - last) * 1e-9);
                last = now;
            }
        }
        progress(&r, &prev, &aprev,
                 (double)(fr_clock_mono_ns() - last) * 1e-9); /* the last stretch */
        fr_log(FR_LOG_INFO, "%s: stopping", cmd);
        app_stop_watchdog(cmd, 20);
    }
    app_stop_stage("the HTTP server");
    if (r.http != NULL)
        serve_stop(r.http);
    app_stop_stage("the consumer (its last commit, closing the Kafka client)");
    ingest_consumer_stop(r.src);
    app_stop_stage("the workers (the batch in hand)");
    trainer_sparse_stop(r.pool);
    app_stop_stage("the appliers (their last commits)");
    atomic_store(&r.applier_stop, 1);
    for (int k = 0; k < r.S; k++)
        if (r.ap[k].running)
            pthread_join(r.ap[k].tid, NULL);
    trainer_sparse_destroy(r.pool);
    app_stop_stage("the Kafka client (rd_kafka_destroy)");
    ingest_consumer_destroy(r.src);
    for (int k = 0; k < r.S; k++)
        psstore_applier_destroy(r.ap[k].a);
    serve_destroy(r.http);
    return rc;
}
