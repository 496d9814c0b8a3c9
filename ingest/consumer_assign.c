/*
 * consumer_assign.c - the consumer's assignment (docs/design.md "Offsets"):
 * the rebalance callback's two halves, the per-partition bookkeeping
 * (c->owned) they rebuild, pause and resume, a partition's fetch restarted
 * at an offset, and the whole topic assigned without a group.
 *
 * Each new partition starts where the store says
 * (ingest_consumer_partition_start, consumer_store.c); a revoked one has
 * its part of the open batch flushed into the queue first.
 *
 * Threads: everything here runs on the poll thread; librdkafka runs the
 * rebalance callback there, inside rd_kafka_consumer_poll and
 * rd_kafka_consumer_close.
 */
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "ingest/consumer_int.h"
#include "ingest/ingest.h"

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
void ingest_consumer_rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
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
 * Restarts the fetch of a partition that librdkafka stopped (an
 * out-of-range fetch under auto.offset.reset = error leaves it in a state
 * where seeks fail with "Erroneous state", librdkafka issue #2961): the
 * partition leaves the assignment and comes back at offset. Poll thread.
 */
void ingest_consumer_refetch(ingest_consumer_t *c, const char *topic, int32_t partition,
                             int64_t offset)
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
 * The whole topic without a group (docs/design.md "The whole topic without
 * a group"): assigns every partition of the topic as a group's first
 * assignment would, at the store's watermarks; partitions added to the
 * topic since are assigned incrementally (librdkafka allows it without a
 * group), the others left as they are. Poll thread. 0 once assigned (or
 * nothing new), -1 while the metadata or the assignment failed (tried
 * again).
 */
int ingest_consumer_assign_whole_topic(ingest_consumer_t *c, int timeout_ms)
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
