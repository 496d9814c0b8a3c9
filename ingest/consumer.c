/*
 * consumer.c - the Kafka consumer: a consumer-group member that decodes
 * records into batches and queues them toward the trainers, starting every
 * assigned partition at the store's watermark (docs/design.md "Data flow",
 * "Offsets").
 *
 * This file holds the consumer's configuration and life cycle, the poll
 * thread, the rebalance callbacks and what happens to each message. Its
 * queue, lent list and backpressure are in consumer_queue.c; where a
 * partition starts, the once-a-second store tick (commits, lag, the gap
 * rule, replays) in consumer_store.c; the struct they share in
 * consumer_int.h.
 *
 * One poll thread per consumer does everything that touches librdkafka's
 * consumer handle: rd_kafka_consumer_poll, the rebalance callback (which
 * librdkafka runs inside rd_kafka_consumer_poll and rd_kafka_consumer_close
 * on this thread), the batcher, dead letters, pause/resume, and the Kafka
 * commits of the store's watermark. It owns its own store connection. The
 * owner's threads only take batches from the queue (mutex + condvar) and
 * read the atomic counters.
 *
 * Backpressure: when the queue holds `queue` batches the poll thread waits
 * up to PAUSE_AFTER_MS for room, then pauses the assignment; messages
 * librdkafka had already fetched may still arrive while paused and are
 * queued beyond the capacity rather than dropped (a paused consumer keeps
 * polling, so the group keeps it). The partitions resume once the queue
 * drains below half its capacity.
 *
 * Fetch wakeups: with librdkafka below 2.1 the poll thread wakes the
 * fetcher that librdkafka's own prefetch limit stopped (see "Fetch
 * wakeups" below).
 *
 * Decoding ahead: on a backlog the poll thread takes several records at
 * once and decodes them with helper threads before it hands them to the
 * batcher in order (consumer_decode.c; the rebalance callback drains such
 * a window first).
 */
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "ingest/consumer_int.h"
#include "ingest/ingest.h"
#include "ingest/ingest_int.h"
#include "psstore/psstore.h"

#define POLL_MS         100   /* one poll waits at most this long       */
#define COMMIT_EVERY_MS 1000  /* the store's watermarks go to Kafka     */
#define WHOLE_CHECK_MS  10000 /* whole topic: look for new partitions   */
#define DLQ_FLUSH_MS    5000  /* dead letters still queued at destroy    */
#define DLQ_HEADER      "freshet.reason"
#define GAP_TIMEOUT_MS  10000      /* [psstore] gap_timeout's default          */
#define WAKE_TIMEOUT_MS 1000       /* a fetch wakeup's ListOffsets round trip, at most */
#define RDK_2_1         0x020100ff /* rd_kafka_version() of librdkafka 2.1.0 */
#define FETCH_MAX_BYTES "2097152"  /* 2 MiB, see consumer_conf            */

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

/* Observes how long the open batch filled, if one was open. */
static void fill_done(ingest_consumer_t *c, int64_t *open_since)
{
    if (*open_since >= 0 && c->m_fill != NULL)
        fr_series_observe(c->m_fill, (double)(now_ms() - *open_since) / 1000.0);
    *open_since = -1;
}

/* The consumer's Redis connection gives up reconnecting once it stops. */
int ingest_consumer_stopping(void *arg)
{
    return atomic_load(&((ingest_consumer_t *)arg)->stop) != 0;
}

/* ------------------------------------------------------------------------
 * The assignment (poll thread).
 * ---------------------------------------------------------------------- */

/* Pauses (pause = 1) or resumes one assigned partition. Poll thread. */
void ingest_consumer_pause_one(ingest_consumer_t *c, int32_t partition, int pause)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    if (l == NULL)
        return;
    rd_kafka_topic_partition_list_add(l, c->topic, partition);
    rd_kafka_resp_err_t kerr =
        pause ? rd_kafka_pause_partitions(c->rk, l) : rd_kafka_resume_partitions(c->rk, l);
    if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR)
        fr_log(FR_LOG_WARN, "ingest: %s %s/%" PRId32 ": %s", pause ? "pause" : "resume", c->topic,
               partition, rd_kafka_err2str(kerr));
    rd_kafka_topic_partition_list_destroy(l);
}

/* Pauses (pause = 1) or resumes the whole assignment (a partition waiting
 * for its rewind stays paused). Poll thread. */
void ingest_consumer_set_paused(ingest_consumer_t *c, int pause)
{
    if (c->assigned != NULL && c->assigned->cnt > 0) {
        rd_kafka_resp_err_t kerr = pause ? rd_kafka_pause_partitions(c->rk, c->assigned)
                                         : rd_kafka_resume_partitions(c->rk, c->assigned);
        if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR)
            fr_log(FR_LOG_WARN, "ingest: %s: %s", pause ? "pause" : "resume",
                   rd_kafka_err2str(kerr));
    }
    if (!pause)
        for (int i = 0; i < c->nowned; i++)
            if (c->owned[i].rewinding)
                ingest_consumer_pause_one(c, c->owned[i].partition, 1);
    if (pause && !c->paused)
        atomic_fetch_add(&c->pauses, 1);
    c->paused = pause;
    int n = pause && c->assigned != NULL ? c->assigned->cnt : 0;
    atomic_store(&c->npaused, n);
    if (c->m_paused != NULL)
        fr_series_set(c->m_paused, n);
}

/* Rebuilds the per-partition bookkeeping after the assignment changed. */
static void owned_rebuild(ingest_consumer_t *c)
{
    int n = c->assigned != NULL ? c->assigned->cnt : 0;
    owned_t *old = c->owned;
    owned_t *now = n > 0 ? calloc((size_t)n, sizeof(*now)) : NULL;
    for (int i = 0; i < n && now != NULL; i++) {
        const rd_kafka_topic_partition_t *tp = &c->assigned->elems[i];
        now[i].partition = tp->partition;
        now[i].committed = -1;
        now[i].watermark = -1;
        now[i].since = now_ms();
        now[i].dropped_at = -1;
        /* keep the bookkeeping of partitions that stay (cooperative) */
        for (int j = 0; j < c->nowned; j++) {
            if (old[j].partition == tp->partition) {
                now[i] = old[j];
                now[i].lag = NULL;
            }
        }
        if (c->m_lag != NULL) {
            char pbuf[16];
            snprintf(pbuf, sizeof(pbuf), "%" PRId32, tp->partition);
            const char *labels[2] = {tp->topic, pbuf};
            now[i].lag = fr_metric_series(c->m_lag, labels);
        }
    }
    free(old);
    c->owned = now;
    c->nowned = now != NULL ? n : 0;
    atomic_store(&c->nassigned, n);
}

/*
 * The assignment half of the rebalance callback: every new partition
 * starts where partition_start decides, passed in the list given to
 * rd_kafka_assign (eager) or rd_kafka_incremental_assign (cooperative).
 *
 * librdkafka keeps a partition's pause flag across a rebalance. A
 * partition paused by backpressure and revoked keeps it, and the resume
 * that follows once the queue drains finds nothing assigned to resume:
 * assigned again, it would never be fetched. So the new partitions are
 * resumed first (a partition librdkafka never saw, or not paused, is left
 * as it is), and paused again below when the consumer is paused now.
 */
static int on_assign(ingest_consumer_t *c, rd_kafka_topic_partition_list_t *parts, int coop)
{
    for (int i = 0; i < parts->cnt; i++) {
        rd_kafka_topic_partition_t *tp = &parts->elems[i];
        int64_t start = ingest_consumer_partition_start(c, tp->topic, tp->partition);
        /* stopping before the store answered: read nothing of it */
        tp->offset = start >= 0 ? start : RD_KAFKA_OFFSET_END;
    }
    rd_kafka_resume_partitions(c->rk, parts); /* per-partition errors: not paused, unknown */
    for (int i = 0; i < parts->cnt; i++)
        parts->elems[i].err = RD_KAFKA_RESP_ERR_NO_ERROR;
    rd_kafka_error_t *error = NULL;
    rd_kafka_resp_err_t kerr = RD_KAFKA_RESP_ERR_NO_ERROR;
    if (coop)
        error = rd_kafka_incremental_assign(c->rk, parts);
    else
        kerr = rd_kafka_assign(c->rk, parts);
    int failed = error != NULL || kerr != RD_KAFKA_RESP_ERR_NO_ERROR;
    if (error != NULL) {
        fr_log(FR_LOG_ERROR, "ingest: assign: %s", rd_kafka_error_string(error));
        rd_kafka_error_destroy(error);
    } else if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fr_log(FR_LOG_ERROR, "ingest: assign: %s", rd_kafka_err2str(kerr));
    }
    if (!coop && c->assigned != NULL) {
        rd_kafka_topic_partition_list_destroy(c->assigned);
        c->assigned = NULL;
    }
    if (c->assigned == NULL)
        c->assigned = rd_kafka_topic_partition_list_new(parts->cnt > 0 ? parts->cnt : 1);
    for (int i = 0; i < parts->cnt && c->assigned != NULL; i++)
        rd_kafka_topic_partition_list_add(c->assigned, parts->elems[i].topic,
                                          parts->elems[i].partition);
    owned_rebuild(c);
    if (c->paused)
        ingest_consumer_set_paused(c, 1);
    return failed ? -1 : 0;
}

/*
 * The revocation half: the revoked partitions' part of the open batch is
 * flushed into the queue (its positions are still theirs to report), then
 * they are unassigned.
 */
static void on_revoke(ingest_consumer_t *c, rd_kafka_topic_partition_list_t *parts, int coop)
{
    for (int i = 0; i < parts->cnt; i++) {
        ingest_batch_t *flushed = NULL;
        rd_kafka_topic_partition_t *tp = &parts->elems[i];
        fr_err_t err = ingest_batcher_revoke(c->bt, tp->topic, tp->partition, &flushed);
        if (err != FR_OK)
            fr_log(FR_LOG_ERROR, "ingest: revoke of %s/%" PRId32 ": %s", tp->topic, tp->partition,
                   fr_strerror(err));
        ingest_consumer_queue_push(c, flushed);
    }
    if (coop) {
        rd_kafka_error_t *error = rd_kafka_incremental_unassign(c->rk, parts);
        if (error != NULL) {
            fr_log(FR_LOG_ERROR, "ingest: unassign: %s", rd_kafka_error_string(error));
            rd_kafka_error_destroy(error);
        }
        for (int i = 0; i < parts->cnt && c->assigned != NULL; i++)
            rd_kafka_topic_partition_list_del(c->assigned, parts->elems[i].topic,
                                              parts->elems[i].partition);
    } else {
        rd_kafka_assign(c->rk, NULL);
        if (c->assigned != NULL)
            rd_kafka_topic_partition_list_destroy(c->assigned);
        c->assigned = NULL;
    }
    owned_rebuild(c);
    atomic_store(&c->npaused, c->paused && c->assigned != NULL ? c->assigned->cnt : 0);
}

/*
 * librdkafka's rebalance callback. Runs on the poll thread, inside
 * rd_kafka_consumer_poll or rd_kafka_consumer_close.
 */
static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    ingest_consumer_t *c = opaque;
    c->rebalances++;
    atomic_fetch_add(&c->rebalance_drained, c->nwin);
    ingest_consumer_window_drain(c); /* the records polled before this event */
    int coop = strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        (void)on_assign(c, parts, coop); /* logged; the group assigns again */
    } else if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
        on_revoke(c, parts, coop);
    } else {
        fr_log(FR_LOG_WARN, "ingest: rebalance failed: %s", rd_kafka_err2str(err));
        on_revoke(c, parts, coop);
    }
}

/*
 * librdkafka's offset commit callback. Runs on the poll thread, inside
 * rd_kafka_consumer_poll. A failed commit is tried again at the next tick.
 */
void ingest_consumer_commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                               rd_kafka_topic_partition_list_t *offsets, void *opaque)
{
    (void)rk;
    ingest_consumer_t *c = opaque;
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR || err == RD_KAFKA_RESP_ERR__NO_OFFSET)
        return;
    /* a commit that meets a rebalance is expected; the next owner commits */
    int expected = err == RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS ||
                   err == RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION ||
                   err == RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID;
    fr_log(expected ? FR_LOG_INFO : FR_LOG_WARN, "ingest: kafka commit failed: %s (retrying)",
           rd_kafka_err2str(err));
    for (int i = 0; offsets != NULL && i < offsets->cnt; i++)
        for (int j = 0; j < c->nowned; j++)
            if (c->owned[j].partition == offsets->elems[i].partition)
                c->owned[j].committed = -1;
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
 * Restarts the fetch of a partition that librdkafka stopped (an
 * out-of-range fetch under auto.offset.reset = error leaves it in a state
 * where seeks fail with "Erroneous state", librdkafka issue #2961): the
 * partition leaves the assignment and comes back at offset. Poll thread.
 */
static void refetch(ingest_consumer_t *c, const char *topic, int32_t partition, int64_t offset)
{
    rd_kafka_error_t *error = NULL;
    rd_kafka_resp_err_t kerr = RD_KAFKA_RESP_ERR_NO_ERROR;
    rd_kafka_topic_partition_list_t *l = NULL;
    if (strcmp(rd_kafka_rebalance_protocol(c->rk), "COOPERATIVE") == 0) {
        if ((l = rd_kafka_topic_partition_list_new(1)) == NULL)
            return;
        rd_kafka_topic_partition_list_add(l, topic, partition)->offset = offset;
        error = rd_kafka_incremental_unassign(c->rk, l);
        if (error == NULL)
            error = rd_kafka_incremental_assign(c->rk, l);
    } else {
        /* eager: the whole assignment again, every other partition at the
         * position after the last record the batcher took (what librdkafka
         * had fetched beyond is fetched again), pauses restored */
        if (c->assigned == NULL || (l = rd_kafka_topic_partition_list_copy(c->assigned)) == NULL)
            return;
        for (int i = 0; i < l->cnt; i++) {
            int64_t next, end;
            if (l->elems[i].partition == partition)
                l->elems[i].offset = offset;
            else if (ingest_batcher_position(c->bt, l->elems[i].topic, l->elems[i].partition, &next,
                                             &end) == FR_OK)
                l->elems[i].offset = end;
        }
        kerr = rd_kafka_assign(c->rk, l);
        if (kerr == RD_KAFKA_RESP_ERR_NO_ERROR && c->paused)
            ingest_consumer_set_paused(c, 1);
        for (int i = 0; kerr == RD_KAFKA_RESP_ERR_NO_ERROR && i < c->nowned; i++)
            if (c->owned[i].rewinding)
                ingest_consumer_pause_one(c, c->owned[i].partition, 1);
    }
    if (error != NULL || kerr != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fr_log(FR_LOG_WARN, "ingest: restarting %s/%" PRId32 " at %" PRId64 ": %s", topic,
               partition, offset,
               error != NULL ? rd_kafka_error_string(error) : rd_kafka_err2str(kerr));
        rd_kafka_error_destroy(error);
    }
    rd_kafka_topic_partition_list_destroy(l);
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
    refetch(c, topic, partition, lo > end ? lo : end);
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
static void fetch_wake_init(ingest_consumer_t *c)
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
 * The whole topic without a group (docs/design.md "The whole topic without
 * a group"): assigns every partition of the topic as a group's first
 * assignment would, at the store's watermarks; partitions added to the
 * topic since are assigned incrementally (librdkafka allows it without a
 * group), the others left as they are. Poll thread. 0 once assigned (or
 * nothing new), -1 while the metadata or the assignment failed (tried
 * again).
 */
static int assign_whole_topic(ingest_consumer_t *c, int timeout_ms)
{
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(c->rk, c->topic, NULL);
    if (rkt == NULL)
        return -1;
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err = rd_kafka_metadata(c->rk, 0, rkt, &md, timeout_ms);
    int n = -1;
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 &&
        md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR)
        n = md->topics[0].partition_cnt;
    else
        fr_log(FR_LOG_WARN, "ingest: metadata of %s: %s", c->topic,
               err != RD_KAFKA_RESP_ERR_NO_ERROR ? rd_kafka_err2str(err)
               : md->topic_cnt == 1              ? rd_kafka_err2str(md->topics[0].err)
                                                 : "no such topic");
    if (md != NULL)
        rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    if (n < 1)
        return -1;
    if (n <= c->whole_parts)
        return 0;
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(n - c->whole_parts);
    if (parts == NULL)
        return -1;
    for (int p = c->whole_parts; p < n; p++)
        rd_kafka_topic_partition_list_add(parts, c->topic, p);
    int rc = on_assign(c, parts, c->whole_parts > 0);
    rd_kafka_topic_partition_list_destroy(parts);
    if (rc != 0)
        return -1;
    fr_log(FR_LOG_INFO, "ingest: %s: assigned partitions %d-%d (%s, no consumer group)", c->topic,
           c->whole_parts, n - 1, c->whole_parts == 0 ? "the whole topic" : "the topic grew");
    c->whole_parts = n;
    return 0;
}

/*
 * The poll thread: polls (which also runs the rebalance and commit
 * callbacks), batches, flushes a partial batch linger_ms after its first
 * record, applies backpressure and commits the store's watermarks every
 * COMMIT_EVERY_MS. On stop it flushes the open batch, leaves the group
 * (revoking on this thread) and marks the queue finished.
 */
static void *poll_main(void *arg)
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
    while (c->whole_topic && !atomic_load(&c->stop) && assign_whole_topic(c, 1000) != 0) {
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
            assign_whole_topic(c, 200);
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
         * (librdkafka 2.1 and later; "Fetch wakeups" above for older ones) */
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
    rd_kafka_conf_set_rebalance_cb(kc, rebalance_cb);
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
    fetch_wake_init(c);
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
    if (pthread_create(&c->thread, NULL, poll_main, c) != 0) {
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
