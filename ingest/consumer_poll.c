/*
 * consumer_poll.c - the consumer's poll thread (docs/design.md "Data
 * flow"): polls, hands each message to the batcher (here, or through a
 * decode window, consumer_decode.c), counts and dead-letters rejected
 * records, flushes a partial batch linger_ms after its first record,
 * applies backpressure, runs the store tick every COMMIT_EVERY_MS, skips
 * what retention deleted, and wakes librdkafka's fetchers below 2.1.
 *
 * Threads: everything here runs on the poll thread, which owns the store
 * connection it opens (c->ps) and the batcher; ingest_consumer_stop joins
 * it.
 */
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "ingest/consumer_int.h"
#include "ingest/ingest.h"
#include "ingest/ingest_int.h"

#define POLL_MS         100   /* one poll waits at most this long       */
#define COMMIT_EVERY_MS 1000  /* the store's watermarks go to Kafka     */
#define WHOLE_CHECK_MS  10000 /* whole topic: look for new partitions   */
#define DLQ_HEADER      "freshet.reason"
#define WAKE_TIMEOUT_MS 1000 /* a fetch wakeup's ListOffsets round trip, at most */

/* Observes how long the open batch filled, if one was open. */
static void fill_done(ingest_consumer_t *c, int64_t *open_since)
{
    if (*open_since >= 0 && c->m_fill != NULL)
        fr_series_observe(c->m_fill, (double)(now_ms() - *open_since) / 1000.0);
    *open_since = -1;
}

/* ------------------------------------------------------------------------
 * The poll thread.
 * ---------------------------------------------------------------------- */

/* Counts a rejected record and sends it to the dead-letter topic. */
static void reject(ingest_consumer_t *c, const rd_kafka_message_t *m, ingest_reject_t why)
{
    atomic_fetch_add(&c->rejected[why], 1);
    if (c->m_rejected[why] != NULL)
        fr_series_add(c->m_rejected[why], 1);
    if (c->dlq == NULL)
        return;
    fr_err_t err = ingest_producer_send(c->dlq, c->dlt, -1, m->key, m->key_len, m->payload, m->len,
                                        DLQ_HEADER, ingest_reject_name(why));
    if (err == FR_OK)
        atomic_fetch_add(&c->dead_letters, 1);
    else
        fr_log(FR_LOG_WARN, "ingest: dead letter to %s: %s", c->dlt, ingest_producer_error(c->dlq));
}

/*
 * The fetch position of a partition fell below its log start: retention
 * deleted records before they were read (the consumer fell behind, or a
 * broker trims fast, as the dev broker's 5 MiB window does). librdkafka
 * reports it (auto.offset.reset = error) instead of resetting to a log
 * start it may have cached stale, which loops without delivering. The
 * records lost are covered by an n = 0 batch of reason "retention", and
 * the partition continues at the log start as Kafka tells it now.
 * Poll thread.
 */
static void retention_skip(ingest_consumer_t *c, const char *topic, int32_t partition)
{
    int64_t lo = 0, next = 0, end = 0;
    rd_kafka_resp_err_t kerr =
        ingest_list_offset(c->rk, topic, partition, -2, QUERY_TIMEOUT_MS, &lo);
    if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR ||
        ingest_batcher_position(c->bt, topic, partition, &next, &end) != FR_OK) {
        fr_log(FR_LOG_WARN, "ingest: %s/%" PRId32 " is out of range and its log start unknown (%s)",
               topic, partition, rd_kafka_err2str(kerr));
        return; /* the next fetch reports it again */
    }
    if (ingest_batcher_holds(c->bt, topic, partition)) {
        ingest_consumer_queue_push(c, ingest_batcher_flush(c->bt));
        ingest_batcher_position(c->bt, topic, partition, &next, &end);
    }
    int64_t hi = 0;
    if (lo <= end &&
        ingest_list_offset(c->rk, topic, partition, -1, QUERY_TIMEOUT_MS, &hi) ==
            RD_KAFKA_RESP_ERR_NO_ERROR &&
        end > hi && now_ms() - c->beyond_logged_ms >= 30000) {
        /* not retention: the store stands past the log end (the topic was
         * recreated or truncated); fetching goes on from there, and
         * freshet replay can move the store's offsets */
        c->beyond_logged_ms = now_ms();
        fr_log(FR_LOG_ERROR,
               "ingest: %s/%" PRId32 ": the position %" PRId64 " lies beyond the log end %" PRId64
               " (topic recreated or truncated?); 'freshet replay --to-earliest' moves the "
               "store's offsets",
               topic, partition, end, hi);
    }
    if (lo > end) {
        fr_log(FR_LOG_WARN,
               "ingest: %s/%" PRId32 ": retention deleted [%" PRId64 ", %" PRId64
               ") before it was read; marked dropped (reason retention)",
               topic, partition, end, lo);
        ingest_consumer_queue_push(c,
                                   ingest_batcher_cover(c->bt, topic, partition, lo, "retention"));
        atomic_fetch_add(&c->retention_skips, 1);
        if (c->m_retention != NULL)
            fr_series_add(c->m_retention, 1);
    }
    ingest_consumer_refetch(c, topic, partition, lo > end ? lo : end);
}

/* The record's aux value when the schema takes one: its freshet-p header
 * as a float (a sparse model's planted probability), NAN when it has none
 * or it does not parse. */
static float aux_value(const ingest_consumer_t *c, const rd_kafka_message_t *m)
{
    rd_kafka_headers_t *hdrs;
    const void *v;
    size_t len;
    if (c->aux <= 0 || rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR ||
        rd_kafka_header_get_last(hdrs, INGEST_AUX_HEADER, &v, &len) != RD_KAFKA_RESP_ERR_NO_ERROR ||
        v == NULL || len == 0 || len > 31)
        return NAN;
    char text[32], *end;
    memcpy(text, v, len);
    text[len] = '\0';
    float x = strtof(text, &end);
    return *end == '\0' && isfinite(x) ? x : NAN;
}

void ingest_consumer_on_message(ingest_consumer_t *c, const rd_kafka_message_t *m,
                                const ingest_decoded_t *pre)
{
    int64_t *open_since = &c->open_since;
    int *dirty = &c->dirty;
    if (m->err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET && m->rkt != NULL) {
        retention_skip(c, rd_kafka_topic_name(m->rkt), m->partition);
        return;
    }
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
            fr_log(FR_LOG_WARN, "ingest: kafka: %s", rd_kafka_message_errstr(m));
        return;
    }
    const char *topic = rd_kafka_topic_name(m->rkt);
    ingest_reject_t why = INGEST_OK;
    ingest_batch_t *full = NULL;
    atomic_fetch_add(&c->consumed, 1);
    if (c->m_consumed != NULL)
        fr_series_add(c->m_consumed, 1);
    c->avg_len = c->avg_len > 0 ? 0.99 * c->avg_len + 0.01 * (double)m->len : (double)m->len;
    int64_t ts = rd_kafka_message_timestamp(m, NULL);
    fr_err_t err = pre != NULL
                       ? ingest_batcher_add_decoded(c->bt, topic, m->partition, m->offset, ts, pre,
                                                    aux_value(c, m), &why, &full)
                       : ingest_batcher_add_aux(c->bt, topic, m->partition, m->offset, ts,
                                                m->payload, m->len, aux_value(c, m), &why, &full);
    if (err != FR_OK) {
        /* FR_ERR_STATE: a partition assigned while stopping, never seeked */
        fr_log(err == FR_ERR_STATE ? FR_LOG_DEBUG : FR_LOG_ERROR,
               "ingest: record %s/%" PRId32 "@%" PRId64 ": %s", topic, m->partition, m->offset,
               fr_strerror(err));
        return;
    }
    if (why != INGEST_OK)
        reject(c, m, why);
    if (*open_since < 0)
        *open_since = now_ms();
    *dirty = 1;
    if (full != NULL) {
        fill_done(c, open_since);
        ingest_consumer_queue_push(c, full);
        *dirty = 0;
        /* a batch closed before this record (ingest_batcher_alone): the
         * record opens the next one, which lingers as any other */
        if (ingest_batcher_holds(c->bt, topic, m->partition)) {
            *open_since = now_ms();
            *dirty = 1;
        }
    }
}

/* ------------------------------------------------------------------------
 * Fetch wakeups.
 *
 * librdkafka stops fetching a partition while the consumer queue holds
 * queued.min.messages records or queued.max.messages.kbytes of them, and
 * below 2.1 decides again only when the broker thread next wakes: up to a
 * second later when nothing else happens on that broker. A backlog read
 * faster than it is trained fills the queue, the poll thread drains it in
 * a fraction of that second and the workers starve for the rest: at 192
 * partitions, half the run's time (bench/README.md "Where the time goes").
 * 2.1 and later back off fetch.queue.backoff.ms instead, which
 * consumer_conf sets low. Below 2.1 the poll thread wakes the fetchers
 * itself once the queue, having come within half a limit, has drained to
 * a quarter of its high-water mark: a ListOffsets request for the log ends
 * of the assignment (rd_kafka_offsets_for_times) goes through every
 * leader's broker thread, which decides its partitions again on its way.
 * A queue that never nears a limit (a consumer that keeps up) wakes
 * nothing.
 * ---------------------------------------------------------------------- */

/* Reads the limits and takes the consumer queue. Before the poll thread. */
void ingest_consumer_fetch_wake_init(ingest_consumer_t *c)
{
    char v[32];
    size_t n = sizeof(v);
    const rd_kafka_conf_t *kc = rd_kafka_conf(c->rk);
    c->q_min_msgs = 100000; /* librdkafka's defaults, should a get fail */
    c->q_max_bytes = 65536.0 * 1024.0;
    if (rd_kafka_conf_get(kc, "queued.min.messages", v, &n) == RD_KAFKA_CONF_OK)
        c->q_min_msgs = strtoll(v, NULL, 10);
    n = sizeof(v);
    if (rd_kafka_conf_get(kc, "queued.max.messages.kbytes", v, &n) == RD_KAFKA_CONF_OK)
        c->q_max_bytes = strtod(v, NULL) * 1024.0;
    c->cq = rd_kafka_queue_get_consumer(c->rk);
    c->wake = rd_kafka_version() < RDK_2_1 && c->cq != NULL;
}

/* After each poll: wakes the fetchers when the queue came near a limit
 * and has drained to a quarter of that. Poll thread. */
static void fetch_wake_check(ingest_consumer_t *c)
{
    if (!c->wake || c->assigned == NULL || c->assigned->cnt == 0)
        return;
    size_t q = rd_kafka_queue_length(c->cq);
    if (q > c->q_high) {
        c->q_high = q;
        return;
    }
    int near = 2 * (int64_t)c->q_high >= c->q_min_msgs ||
               2.0 * (double)c->q_high * c->avg_len >= c->q_max_bytes;
    if (!near || 4 * q > c->q_high)
        return;
    c->q_high = q;
    rd_kafka_topic_partition_list_t *ends = rd_kafka_topic_partition_list_copy(c->assigned);
    if (ends == NULL)
        return;
    for (int i = 0; i < ends->cnt; i++)
        ends->elems[i].offset = RD_KAFKA_OFFSET_END; /* as a timestamp: the log end */
    rd_kafka_resp_err_t kerr = rd_kafka_offsets_for_times(c->rk, ends, WAKE_TIMEOUT_MS);
    rd_kafka_topic_partition_list_destroy(ends);
    if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR)
        fr_log(FR_LOG_DEBUG, "ingest: fetch wakeup: %s", rd_kafka_err2str(kerr));
    atomic_fetch_add(&c->fetch_wakeups, 1);
    if (c->m_wakeups != NULL)
        fr_series_add(c->m_wakeups, 1);
}

/*
 * The poll thread: polls (which also runs the rebalance and commit
 * callbacks), batches, flushes a partial batch linger_ms after its first
 * record, applies backpressure and commits the store's watermarks every
 * COMMIT_EVERY_MS. On stop it flushes the open batch, leaves the group
 * (revoking on this thread) and marks the queue finished.
 */
void *ingest_consumer_poll_main(void *arg)
{
    ingest_consumer_t *c = arg;
    int64_t next_commit = now_ms() + COMMIT_EVERY_MS;
    fr_thread_name("fr-consume");
    char errstr[256];
    c->ps = psstore_conn_new(c->redis_url, STORE_TIMEOUT_MS, errstr, sizeof(errstr));
    if (c->ps == NULL)
        fr_log(FR_LOG_WARN, "ingest: %s (retrying at assignment)", errstr);
    else
        psstore_conn_set_cancel(c->ps, ingest_consumer_stopping, c);
    while (c->whole_topic && !atomic_load(&c->stop) &&
           ingest_consumer_assign_whole_topic(c, 1000) != 0) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, POLL_MS); /* errors, logs */
        if (m != NULL)
            rd_kafka_message_destroy(m);
    }
    int64_t next_whole = now_ms() + WHOLE_CHECK_MS;
    while (!atomic_load(&c->stop)) {
        int wait_ms = POLL_MS;
        if (c->dirty) { /* wake when the open batch is due */
            int64_t left = c->open_since + c->linger_ms - now_ms();
            wait_ms = left <= 0 ? 0 : left < POLL_MS ? (int)left : POLL_MS;
        }
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, wait_ms);
        if (m != NULL && c->ndecoders > 0 && m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
            ingest_consumer_window_take(c, m); /* with what queues behind it */
        } else if (m != NULL) {
            ingest_consumer_on_message(c, m, NULL);
            rd_kafka_message_destroy(m);
        }
        fetch_wake_check(c);
        int64_t t = now_ms();
        /* linger_ms counts from the open batch's first record, as Kafka's
         * producer counts it: a steady trickle cannot hold a sample longer */
        if (c->dirty && t - c->open_since >= c->linger_ms) {
            fill_done(c, &c->open_since);
            ingest_consumer_queue_push(c, ingest_batcher_flush(c->bt));
            c->dirty = 0;
        }
        ingest_consumer_backpressure(c);
        if (t >= next_commit) {
            ingest_consumer_store_tick(c, 0);
            next_commit = t + COMMIT_EVERY_MS;
        }
        if (c->whole_topic && t >= next_whole) {
            /* briefly: the poll thread also flushes and pushes back */
            ingest_consumer_assign_whole_topic(c, 200);
            next_whole = t + WHOLE_CHECK_MS;
        }
    }
    ingest_consumer_queue_push(c, ingest_batcher_flush(c->bt));
    ingest_consumer_store_tick(c, 1);
    /* the whole topic was assigned by hand: no group revokes it at the
     * close, and a partition left assigned (paused, say) kept
     * rd_kafka_destroy waiting for its fetcher forever */
    if (c->whole_topic)
        rd_kafka_assign(c->rk, NULL);
    rd_kafka_resp_err_t kerr = rd_kafka_consumer_close(c->rk); /* revokes on this thread */
    if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR)
        fr_log(FR_LOG_WARN, "ingest: consumer close: %s", rd_kafka_err2str(kerr));
    psstore_conn_destroy(c->ps);
    c->ps = NULL;
    pthread_mutex_lock(&c->qlock);
    c->finished = 1;
    pthread_cond_broadcast(&c->qcond);
    pthread_mutex_unlock(&c->qlock);
    return NULL;
}
