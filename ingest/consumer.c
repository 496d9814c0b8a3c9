/*
 * consumer.c - the Kafka consumer: a consumer-group member that decodes
 * records into batches and queues them toward the trainers, starting every
 * assigned partition at the store's watermark (docs/design.md "Data flow",
 * "Offsets").
 *
 * This file holds the consumer's configuration and life cycle: the
 * librdkafka settings, the metrics, new, start, stop, destroy and the
 * counters. The rest lives beside it, each file one concern, sharing the
 * struct of consumer_int.h: the poll thread and what happens to each
 * message (consumer_poll.c), the rebalance callbacks and the assignment
 * (consumer_assign.c), decoding ahead (consumer_decode.c), the queue, lent
 * list and backpressure (consumer_queue.c), where a partition starts and
 * the once-a-second store tick: commits, lag, the gap rule, replays
 * (consumer_store.c).
 *
 * Threads: one poll thread per consumer does everything that touches
 * librdkafka's consumer handle: rd_kafka_consumer_poll, the rebalance
 * callback (which librdkafka runs inside rd_kafka_consumer_poll and
 * rd_kafka_consumer_close on this thread), the batcher, dead letters,
 * pause/resume, and the Kafka commits of the store's watermark. It owns
 * its own store connection. The owner's threads only take batches from the
 * queue (mutex + condvar) and read the atomic counters; new, start, stop
 * and destroy are the owner's.
 */
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "ingest/consumer_int.h"
#include "ingest/ingest.h"
#include "ingest/ingest_int.h"

#define DLQ_FLUSH_MS    5000      /* dead letters still queued at destroy    */
#define GAP_TIMEOUT_MS  10000     /* [psstore] gap_timeout's default          */
#define FETCH_MAX_BYTES "2097152" /* 2 MiB, see consumer_conf            */

/*
 * librdkafka's log callback. Runs on librdkafka's internal threads: it only
 * hands the line to fr_log, which writes it with one write(2).
 */
static void consumer_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    (void)rk;
    fr_log_level_t l = level <= 3 ? FR_LOG_ERROR : level <= 4 ? FR_LOG_WARN : FR_LOG_DEBUG;
    fr_log(l, "kafka consumer: %s: %s", fac, buf);
}

/* The consumer's Redis connection gives up reconnecting once it stops. */
int ingest_consumer_stopping(void *arg)
{
    return atomic_load(&((ingest_consumer_t *)arg)->stop) != 0;
}

/* ------------------------------------------------------------------------
 * Life cycle.
 * ---------------------------------------------------------------------- */

/* Sets one librdkafka property, filling errstr on refusal. */
static fr_err_t conf_set(rd_kafka_conf_t *conf, const char *key, const char *value, char *errstr,
                         size_t size)
{
    char kerr[512];
    if (rd_kafka_conf_set(conf, key, value, kerr, sizeof(kerr)) == RD_KAFKA_CONF_OK)
        return FR_OK;
    return fr_errorf(FR_ERR_INVAL, errstr, size, "kafka property %s: %s", key, kerr);
}

/* Raises property `key` to the value of `floor` when it is below it:
 * librdkafka refuses a fetch.max.bytes below message.max.bytes and a
 * reconnect.backoff.max.ms below reconnect.backoff.ms, so a caller who
 * raised the latter (large records, a slower backoff) gets freshet's
 * default of the former raised with it. */
static fr_err_t at_least(rd_kafka_conf_t *kc, const char *key, const char *floor, char *errstr,
                         size_t size)
{
    char have[32], low[32];
    size_t hl = sizeof(have), ll = sizeof(low);
    if (rd_kafka_conf_get(kc, key, have, &hl) != RD_KAFKA_CONF_OK ||
        rd_kafka_conf_get(kc, floor, low, &ll) != RD_KAFKA_CONF_OK ||
        strtoll(have, NULL, 10) >= strtoll(low, NULL, 10))
        return FR_OK;
    return conf_set(kc, key, low, errstr, size);
}

/* The consumer's librdkafka configuration, in this order: bootstrap, the
 * defaults (group.id, auto.offset.reset error, fetch.wait.max.ms 5,
 * fetch.max.bytes 2 MiB, fetch.queue.backoff.ms 10 from librdkafka 2.1), the
 * caller's properties verbatim, then the two settings the
 * exactly-once effect depends on. NULL with errstr. */
static rd_kafka_conf_t *consumer_conf(ingest_consumer_t *c, const ingest_consumer_conf_t *conf,
                                      char *errstr, size_t size)
{
    char group[128];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    if (kc == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "ingest: out of memory");
        return NULL;
    }
    if (conf->group_id != NULL && conf->group_id[0] != '\0')
        snprintf(group, sizeof(group), "%s", conf->group_id);
    else
        snprintf(group, sizeof(group), "freshet.%s", conf->model);
    if ((conf->bootstrap != NULL &&
         conf_set(kc, "bootstrap.servers", conf->bootstrap, errstr, size) != FR_OK) ||
        conf_set(kc, "group.id", group, errstr, size) != FR_OK ||
        /* every assignment names its offset; this only decides what an
         * out-of-range fetch does: report it (retention_skip) */
        conf_set(kc, "auto.offset.reset", "error", errstr, size) != FR_OK ||
        /* freshness: a fetch that finds nothing new waits this long
         * before it answers (the dev broker waits it out even when records
         * arrive meanwhile), which a sample arriving then waits too;
         * librdkafka's 500 ms would dominate freshness, 20 still showed
         * in its p99 (bench/README.md "Where the time goes"); [kafka]
         * may set it back */
        conf_set(kc, "fetch.wait.max.ms", "5", errstr, size) != FR_OK ||
        /* throughput: a fetch response is one allocation of up to
         * fetch.max.bytes (librdkafka's default 50 MiB); above the
         * allocator's 32 MiB mmap ceiling every response is mapped fresh
         * and each of its pages faulted in (~11 us a page here), and a
         * response that fits the caches is decoded while hot: raw
         * consumption ran 5x faster at 2 MiB than at 50 MiB
         * (bench/README.md "Where the time goes"); [kafka] may set it
         * back, and it is raised to message.max.bytes below */
        conf_set(kc, "fetch.max.bytes", FETCH_MAX_BYTES, errstr, size) != FR_OK ||
        /* recovery: a broker back after an outage is tried again within a
         * second (librdkafka backs off up to 10 s; the chaos suite measured
         * 8 s of training lost after a 3 s outage) */
        conf_set(kc, "reconnect.backoff.max.ms", "1000", errstr, size) != FR_OK ||
        /* a fetcher stopped by the prefetch limit looks again this soon
         * (librdkafka 2.1 and later; consumer_poll.c "Fetch wakeups" for older ones) */
        (rd_kafka_version() >= RDK_2_1 &&
         conf_set(kc, "fetch.queue.backoff.ms", "10", errstr, size) != FR_OK))
        goto err;
    for (size_t i = 0; i < conf->nprops; i++)
        if (conf_set(kc, conf->props[i][0], conf->props[i][1], errstr, size) != FR_OK)
            goto err;
    if (at_least(kc, "fetch.max.bytes", "message.max.bytes", errstr, size) != FR_OK ||
        at_least(kc, "reconnect.backoff.max.ms", "reconnect.backoff.ms", errstr, size) != FR_OK)
        goto err;
    if (conf_set(kc, "enable.auto.offset.store", "false", errstr, size) != FR_OK ||
        conf_set(kc, "enable.auto.commit", "false", errstr, size) != FR_OK)
        goto err;
    rd_kafka_conf_set_opaque(kc, c);
    rd_kafka_conf_set_rebalance_cb(kc, ingest_consumer_rebalance_cb);
    rd_kafka_conf_set_offset_commit_cb(kc, ingest_consumer_commit_cb);
    rd_kafka_conf_set_log_cb(kc, consumer_log_cb);
    return kc;
err:
    rd_kafka_conf_destroy(kc);
    return NULL;
}

/* The consumer's series of counter name, labelled by its topic (NULL when
 * the registry refuses it). */
static fr_series_t *topic_counter(ingest_consumer_t *c, const char *name, const char *help)
{
    static const char *const topic_label[] = {"topic"};
    const char *tv[1] = {c->topic};
    fr_metric_t *m = fr_metrics_counter(c->metrics, name, help, 1, topic_label);
    return m != NULL ? fr_metric_series(m, tv) : NULL;
}

/* Registers the consumer's metrics when a registry was given. */
static void metrics_init(ingest_consumer_t *c)
{
    static const double fill_bounds[] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
    static const char *const topic_label[] = {"topic"};
    static const char *const reason_label[] = {"topic", "reason"};
    static const char *const lag_labels[] = {"topic", "partition"};
    fr_metrics_t *reg = c->metrics;
    if (reg == NULL)
        return;
    const char *tv[1] = {c->topic};
    c->m_consumed =
        topic_counter(c, "freshet_ingest_records_consumed_total", "Records received from Kafka.");
    fr_metric_t *rej =
        fr_metrics_counter(reg, "freshet_ingest_records_rejected_total",
                           "Records rejected, by reason: not decoded, out of range, or a "
                           "quarantined position read again.",
                           2, reason_label);
    for (int r = 1; r < INGEST_REJECT_COUNT && rej != NULL; r++) {
        const char *rv[2] = {c->topic, ingest_reject_name((ingest_reject_t)r)};
        c->m_rejected[r] = fr_metric_series(rej, rv);
    }
    fr_metric_t *paused =
        fr_metrics_gauge(reg, "freshet_ingest_partitions_paused",
                         "Partitions paused because the batch queue is full.", 1, topic_label);
    c->m_paused = paused != NULL ? fr_metric_series(paused, tv) : NULL;
    fr_metric_t *fill = fr_metrics_histogram(
        reg, "freshet_ingest_batch_fill_seconds", "Time from a batch's first record to its flush.",
        sizeof(fill_bounds) / sizeof(fill_bounds[0]), fill_bounds, 1, topic_label);
    c->m_fill = fill != NULL ? fr_metric_series(fill, tv) : NULL;
    c->m_gap = topic_counter(
        c, "freshet_ingest_gap_seeks_total",
        "Seeks back to a watermark stuck for gap_timeout that no outstanding batch held (rule 3).");
    c->m_retention = topic_counter(
        c, "freshet_ingest_retention_skips_total",
        "Fetches below the log start: records retention deleted before they were read, "
        "marked dropped (reason retention).");
    c->m_wakeups = topic_counter(
        c, "freshet_ingest_fetch_wakeups_total",
        "Times the poll thread woke a fetcher that librdkafka's prefetch limit had stopped "
        "(librdkafka below 2.1).");
    c->m_rewinds = topic_counter(c, "freshet_ingest_replay_rewinds_total",
                                 "Partitions rewound by replay requests.");
    c->m_lag =
        fr_metrics_gauge(reg, "freshet_kafka_consumergroup_lag",
                         "Records between the log end and the store's watermark.", 2, lag_labels);
}

/* Checks the parts of conf that librdkafka does not. */
static fr_err_t conf_check(const ingest_consumer_conf_t *conf, char *errstr, size_t size)
{
    psstore_url_t u;
    if (conf == NULL || conf->topic == NULL || conf->topic[0] == '\0' ||
        strlen(conf->topic) > INGEST_TOPIC_MAX)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "ingest: a topic is required");
    if (conf->model == NULL || psstore_model_name_check(conf->model, errstr, size) != FR_OK)
        return conf->model == NULL ? fr_errorf(FR_ERR_INVAL, errstr, size, "ingest: no model")
                                   : FR_ERR_INVAL;
    if (conf->redis_url == NULL || psstore_url_parse(conf->redis_url, &u, errstr, size) != FR_OK)
        return conf->redis_url == NULL
                   ? fr_errorf(FR_ERR_INVAL, errstr, size, "ingest: no redis url")
                   : FR_ERR_INVAL;
    if (conf->format == INGEST_FORMAT_IDX)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "ingest: idx is a file format only");
    if (conf->batch <= 0 || conf->queue <= 0 || conf->linger_ms < 0)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "ingest: batch and queue must be > 0 and linger_ms >= 0");
    if (conf->decode_threads > DECODE_THREADS_MAX)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "ingest: decode_threads is at most %d",
                         DECODE_THREADS_MAX);
    if (conf->nprops > 0 && conf->props == NULL)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "ingest: nprops without props");
    return FR_OK;
}

/* The decode helpers a consumer starts: none for f32 (a copy is not worth
 * a hand-off); conf's count, or when it is negative 1 where the process
 * may run on 2 or more cores, else none. */
static int decoders_for(const ingest_consumer_conf_t *conf)
{
    if (conf->format == INGEST_FORMAT_F32 && conf->schema.decode == NULL)
        return 0;
    if (conf->decode_threads >= 0)
        return conf->decode_threads;
    return fr_cpu_count() >= 2 ? 1 : 0;
}

static char *dup_or_null(const char *s)
{
    return s != NULL && s[0] != '\0' ? strdup(s) : NULL;
}

ingest_consumer_t *ingest_consumer_new(const ingest_consumer_conf_t *conf, char *errstr,
                                       size_t size)
{
    if (conf_check(conf, errstr, size) != FR_OK)
        return NULL;
    ingest_consumer_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "ingest: out of memory");
        return NULL;
    }
    pthread_mutex_init(&c->qlock, NULL);
    pthread_cond_init(&c->qcond, NULL);
    pthread_cond_init(&c->qroom, NULL);
    atomic_init(&c->stop, 0);
    c->topic = strdup(conf->topic);
    c->model = strdup(conf->model);
    c->redis_url = strdup(conf->redis_url);
    c->dlt = dup_or_null(conf->dead_letter_topic);
    c->bootstrap = dup_or_null(conf->bootstrap);
    c->linger_ms = conf->linger_ms;
    c->open_since = -1;
    c->hold_partition = -1;
    c->hold_offset = -1;
    c->ndecoders = decoders_for(conf);
    c->win_d = (size_t)conf->schema.features;
    c->gap_ms = conf->gap_timeout_ms == 0  ? GAP_TIMEOUT_MS
                : conf->gap_timeout_ms < 0 ? 0
                                           : conf->gap_timeout_ms;
    c->start_latest = conf->start_latest != 0;
    c->whole_topic = conf->whole_topic != 0;
    c->qcap = (size_t)conf->queue;
    c->metrics = conf->metrics;
    c->replay = malloc(sizeof(*c->replay));
    c->spec = malloc(PSSTORE_REPLAY_SPEC_MAX);
    c->props = conf->nprops > 0 ? calloc(conf->nprops, sizeof(*c->props)) : NULL;
    int props_ok = conf->nprops == 0 || c->props != NULL;
    for (size_t i = 0; props_ok && i < conf->nprops; i++) {
        c->nprops++;
        c->props[i][0] = strdup(conf->props[i][0]);
        c->props[i][1] = strdup(conf->props[i][1]);
        props_ok = c->props[i][0] != NULL && c->props[i][1] != NULL;
    }
    if (c->topic == NULL || c->model == NULL || c->redis_url == NULL || c->replay == NULL ||
        c->spec == NULL || !props_ok ||
        (conf->bootstrap != NULL && conf->bootstrap[0] != '\0' && c->bootstrap == NULL) ||
        (conf->dead_letter_topic != NULL && conf->dead_letter_topic[0] != '\0' && c->dlt == NULL)) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "ingest: out of memory");
        goto err;
    }
    if ((c->bt = ingest_batcher_new(&conf->schema, conf->format, conf->batch, errstr, size)) ==
        NULL)
        goto err;
    c->aux = conf->schema.aux;
    if (c->dlt != NULL && (c->dlq = ingest_producer_new(conf->bootstrap, conf->props, conf->nprops,
                                                        errstr, size)) == NULL)
        goto err;
    rd_kafka_conf_t *kc = consumer_conf(c, conf, errstr, size);
    if (kc == NULL)
        goto err;
    char kerr[512];
    if ((c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, kerr, sizeof(kerr))) == NULL) {
        rd_kafka_conf_destroy(kc);
        fr_errorf(FR_ERR_KAFKA, errstr, size, "ingest: %s", kerr);
        goto err;
    }
    rd_kafka_poll_set_consumer(c->rk);
    ingest_consumer_fetch_wake_init(c);
    metrics_init(c);
    return c;
err:
    ingest_consumer_destroy(c);
    return NULL;
}

fr_err_t ingest_consumer_start(ingest_consumer_t *c)
{
    if (c->started)
        return FR_ERR_STATE;
    rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
    if (topics == NULL)
        return FR_ERR_NOMEM;
    rd_kafka_topic_partition_list_add(topics, c->topic, RD_KAFKA_PARTITION_UA);
    /* the whole topic: the poll thread assigns it, nothing to join */
    rd_kafka_resp_err_t kerr =
        c->whole_topic ? RD_KAFKA_RESP_ERR_NO_ERROR : rd_kafka_subscribe(c->rk, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fr_log(FR_LOG_ERROR, "ingest: subscribe to %s: %s", c->topic, rd_kafka_err2str(kerr));
        return FR_ERR_KAFKA;
    }
    if (c->ndecoders > 0 && ingest_consumer_decode_start(c, c->ndecoders) != FR_OK) {
        rd_kafka_unsubscribe(c->rk);
        return FR_ERR_NOMEM;
    }
    if (pthread_create(&c->thread, NULL, ingest_consumer_poll_main, c) != 0) {
        ingest_consumer_decode_stop(c);
        rd_kafka_unsubscribe(c->rk);
        return FR_ERR_NOMEM;
    }
    c->started = 1;
    return FR_OK;
}

void ingest_consumer_stop(ingest_consumer_t *c)
{
    if (c == NULL)
        return;
    if (c->started && !c->joined) {
        atomic_store(&c->stop, 1);
        pthread_mutex_lock(&c->qlock);
        pthread_cond_broadcast(&c->qroom);
        pthread_mutex_unlock(&c->qlock);
        pthread_join(c->thread, NULL);
        c->joined = 1;
        ingest_consumer_decode_stop(c);
    }
    pthread_mutex_lock(&c->qlock);
    c->finished = 1;
    pthread_cond_broadcast(&c->qcond);
    pthread_mutex_unlock(&c->qlock);
}

void ingest_consumer_destroy(ingest_consumer_t *c)
{
    if (c == NULL)
        return;
    ingest_consumer_stop(c);
    if (c->cq != NULL)
        rd_kafka_queue_destroy(c->cq);
    /* before rd_kafka_destroy: librdkafka caches partition references in
     * a list it was handed (pause, resume), and waits for them forever
     * (librdkafka issue 3796; the chaos suite's runs hung here after
     * backpressure had paused partitions) */
    if (c->assigned != NULL)
        rd_kafka_topic_partition_list_destroy(c->assigned);
    c->assigned = NULL;
    if (c->rk != NULL) {
        if (!c->started)
            rd_kafka_consumer_close(c->rk);
        /* a started consumer has closed already, within its bound */
        rd_kafka_destroy_flags(c->rk, c->started ? RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE : 0);
    }
    ingest_consumer_queue_fini(c);
    if (c->dlq != NULL) {
        uint64_t delivered, failed;
        if (ingest_producer_flush(c->dlq, DLQ_FLUSH_MS, &delivered, &failed) != FR_OK)
            fr_log(FR_LOG_WARN, "ingest: dead letters not all delivered: %s",
                   ingest_producer_error(c->dlq));
        ingest_producer_destroy(c->dlq);
    }
    ingest_batcher_destroy(c->bt);
    if (c->rs != NULL)
        ingest_resolver_destroy(c->rs);
    for (size_t i = 0; i < c->nprops; i++) {
        free(c->props[i][0]);
        free(c->props[i][1]);
    }
    free(c->props);
    free(c->bootstrap);
    free(c->replay);
    free(c->spec);
    free(c->owned);
    free(c->topic);
    free(c->model);
    free(c->redis_url);
    free(c->dlt);
    pthread_cond_destroy(&c->qcond);
    pthread_cond_destroy(&c->qroom);
    pthread_mutex_destroy(&c->qlock);
    free(c);
}

void ingest_consumer_stats(ingest_consumer_t *c, ingest_consumer_stats_t *st)
{
    memset(st, 0, sizeof(*st));
    st->consumed = atomic_load(&c->consumed);
    for (int r = 0; r < INGEST_REJECT_COUNT; r++)
        st->rejected[r] = atomic_load(&c->rejected[r]);
    st->batches = atomic_load(&c->batches);
    st->dead_letters = atomic_load(&c->dead_letters);
    st->pauses = atomic_load(&c->pauses);
    st->gap_seeks = atomic_load(&c->gap_seeks);
    st->retention_skips = atomic_load(&c->retention_skips);
    st->fetch_wakeups = atomic_load(&c->fetch_wakeups);
    st->decoded_ahead = atomic_load(&c->decoded_ahead);
    st->rebalance_drained = atomic_load(&c->rebalance_drained);
    st->rewinds = atomic_load(&c->rewinds);
    st->paused = atomic_load(&c->npaused);
    st->assigned = atomic_load(&c->nassigned);
    st->lag = atomic_load(&c->lag);
}
