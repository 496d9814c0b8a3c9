/*
 * consumer_queue.c - the consumer's batch queue, its lent list and
 * backpressure (docs/design.md "Data flow").
 *
 * The poll thread appends batches (ingest_consumer_queue_push); the
 * owner's threads take them (ingest_consumer_next), which records each one
 * as lent until the trainer reports it done (ingest_consumer_done) and its
 * gradient has left the grads stream. The lent list is what the gap rule
 * asks (ingest_consumer_outstanding) before it reads a stuck watermark
 * again, and the store tick prunes it (ingest_consumer_lent_prune).
 *
 * Threads: the queue and the lent list are guarded by qlock; qcond wakes a
 * taker, qroom wakes the poll thread waiting for room.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ingest/consumer_int.h"

#define PAUSE_AFTER_MS 500 /* a full queue waits this long before pausing */
#define GAP_IDS_MAX    16  /* stream entries checked per gap decision  */

void ingest_consumer_queue_push(ingest_consumer_t *c, ingest_batch_t *batch)
{
    if (batch == NULL)
        return;
    qnode_t *node = malloc(sizeof(*node));
    if (node == NULL) {
        fr_log(FR_LOG_ERROR, "ingest: out of memory queueing a batch; dropped");
        ingest_batch_destroy(batch);
        return;
    }
    node->next = NULL;
    node->batch = batch;
    pthread_mutex_lock(&c->qlock);
    FR_ASSERT((c->qhead == NULL) == (c->qlen == 0));
    batch->seq = ++c->seq;
    if (c->qtail != NULL)
        c->qtail->next = node;
    else
        c->qhead = node;
    c->qtail = node;
    c->qlen++;
    pthread_cond_signal(&c->qcond);
    pthread_mutex_unlock(&c->qlock);
    atomic_fetch_add(&c->batches, 1);
}

static size_t queue_len(ingest_consumer_t *c)
{
    pthread_mutex_lock(&c->qlock);
    size_t n = c->qlen;
    pthread_mutex_unlock(&c->qlock);
    return n;
}

/*
 * Records a batch handed to a trainer as outstanding (caller holds qlock).
 * Out of memory it goes unrecorded, which costs at most a needless seek
 * back of the gap rule (rule 1 then drops the second copy).
 */
static void lend(ingest_consumer_t *c, const ingest_batch_t *batch)
{
    if (FR_GROW(c->lent, c->caplent, c->nlent + 1) != FR_OK)
        return;
    FR_ASSERT(c->nlent < c->caplent);
    lent_t *l = &c->lent[c->nlent];
    /* a deep copy: the trainer destroys the batch, topics included */
    l->ranges = psstore_ranges_dup(batch->ranges, batch->nranges);
    if (batch->nranges > 0 && l->ranges == NULL)
        return;
    l->nranges = batch->nranges;
    l->seq = batch->seq;
    l->id[0] = '\0';
    c->nlent++;
}

/* Removes lent entry i (caller holds qlock). */
static void lent_remove(ingest_consumer_t *c, size_t i)
{
    FR_ASSERT(i < c->nlent && c->nlent <= c->caplent);
    free(c->lent[i].ranges);
    c->lent[i] = c->lent[--c->nlent];
}

void ingest_consumer_done(ingest_consumer_t *c, const ingest_batch_t *batch, const char *stream_id)
{
    if (c == NULL || batch == NULL)
        return;
    pthread_mutex_lock(&c->qlock);
    for (size_t i = 0; i < c->nlent; i++) {
        if (c->lent[i].seq != batch->seq)
            continue;
        if (stream_id != NULL && stream_id[0] != '\0')
            snprintf(c->lent[i].id, sizeof(c->lent[i].id), "%s", stream_id);
        else
            lent_remove(c, i);
        break;
    }
    pthread_mutex_unlock(&c->qlock);
}

ingest_batch_t *ingest_consumer_next(ingest_consumer_t *c, int timeout_ms)
{
    struct timespec until;
    fr_clock_deadline(&until, timeout_ms);
    pthread_mutex_lock(&c->qlock);
    while (c->qhead == NULL && !c->finished && timeout_ms > 0) {
        if (pthread_cond_timedwait(&c->qcond, &c->qlock, &until) != 0)
            break;
    }
    qnode_t *node = c->qhead;
    if (node != NULL) {
        FR_ASSERT(c->qlen > 0);
        c->qhead = node->next;
        if (c->qhead == NULL)
            c->qtail = NULL;
        c->qlen--;
        FR_ASSERT((c->qhead == NULL) == (c->qlen == 0));
        lend(c, node->batch);
        pthread_cond_signal(&c->qroom);
    }
    pthread_mutex_unlock(&c->qlock);
    if (node == NULL)
        return NULL;
    ingest_batch_t *batch = node->batch;
    free(node);
    return batch;
}

void ingest_consumer_queue_fini(ingest_consumer_t *c)
{
    for (qnode_t *node = c->qhead, *next; node != NULL; node = next) {
        next = node->next;
        ingest_batch_destroy(node->batch);
        free(node);
    }
    c->qhead = c->qtail = NULL;
    c->qlen = 0;
    pthread_mutex_lock(&c->qlock);
    while (c->nlent > 0)
        lent_remove(c, c->nlent - 1);
    pthread_mutex_unlock(&c->qlock);
    free(c->lent);
    c->lent = NULL;
    c->caplent = 0;
}

/* Nonzero when one of ranges[n] holds position pos of the partition. */
static int ranges_hold(const ingest_range_t *ranges, size_t n, const char *topic, int32_t partition,
                       int64_t pos)
{
    for (size_t i = 0; i < n; i++)
        if (ranges[i].partition == partition && ranges[i].from <= pos && pos < ranges[i].to &&
            strcmp(ranges[i].topic, topic) == 0)
            return 1;
    return 0;
}

const char *ingest_consumer_outstanding(ingest_consumer_t *c, int32_t partition, int64_t pos,
                                        int *dropped)
{
    if (dropped != NULL)
        *dropped = 0;
    int64_t next, end, skipped = 0;
    if (ingest_batcher_position(c->bt, c->topic, partition, &next, &end) != FR_OK ||
        ingest_batcher_skipped(c->bt, c->topic, partition, &skipped) != FR_OK)
        return "a partition the batcher does not hold";
    /* nothing read past pos yet: nothing to read again. Records past pos
     * skipped as applied count as read: with a sharded model the skip list
     * was one shard's (docs/design.md "Shards"), and another may lack them */
    if (end <= pos && skipped <= pos)
        return "nothing read past it yet";
    if (next <= pos && pos < end)
        return "the open batch";
    char ids[GAP_IDS_MAX][64];
    int nids = 0;
    const char *held = NULL;
    pthread_mutex_lock(&c->qlock);
    for (const qnode_t *q = c->qhead; q != NULL && held == NULL; q = q->next)
        if (ranges_hold(q->batch->ranges, q->batch->nranges, c->topic, partition, pos))
            held = "a queued batch";
    for (size_t i = 0; i < c->nlent && held == NULL; i++) {
        const lent_t *l = &c->lent[i];
        if (!ranges_hold(l->ranges, l->nranges, c->topic, partition, pos))
            continue;
        if (l->id[0] == '\0')
            held = "a batch a trainer computes";
        else if (nids == GAP_IDS_MAX)
            held = "more lent batches than one check reads";
        else
            memcpy(ids[nids++], l->id, sizeof(l->id));
    }
    pthread_mutex_unlock(&c->qlock);
    for (int i = 0; i < nids && held == NULL; i++) {
        int waiting = 1;
        if (psstore_grad_waiting(c->ps, c->model, ids[i], &waiting) != FR_OK)
            held = "a store error";
        else if (waiting)
            held = "a gradient in the grads stream";
        else if (dropped != NULL)
            *dropped = 1;
    }
    return held;
}

void ingest_consumer_lent_prune(ingest_consumer_t *c)
{
    pthread_mutex_lock(&c->qlock);
    for (size_t i = 0; i < c->nlent;) {
        const lent_t *l = &c->lent[i];
        int live = 0;
        for (size_t r = 0; r < l->nranges && !live; r++) {
            for (int j = 0; j < c->nowned; j++) {
                const owned_t *o = &c->owned[j];
                if (o->partition == l->ranges[r].partition &&
                    strcmp(l->ranges[r].topic, c->topic) == 0)
                    live = o->watermark < 0 || l->ranges[r].to > o->watermark;
            }
        }
        if (live)
            i++;
        else
            lent_remove(c, i);
    }
    pthread_mutex_unlock(&c->qlock);
}

/*
 * Backpressure. A full queue first waits up to PAUSE_AFTER_MS for a trainer
 * to take a batch: pausing makes librdkafka drop what it had prefetched for
 * the partitions and fetch it again on resume, which costs far more than a
 * short wait (librdkafka keeps prefetching within queued.max.messages.kbytes
 * meanwhile, and its heartbeats run on its own threads). A queue still full
 * then pauses the assignment, and polling goes on; it resumes once the
 * queue drained below half its capacity. Poll thread.
 */
void ingest_consumer_backpressure(ingest_consumer_t *c)
{
    size_t n = queue_len(c);
    if (!c->paused && n >= c->qcap) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += (long)PAUSE_AFTER_MS * 1000000L;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_mutex_lock(&c->qlock);
        while (c->qlen >= c->qcap && !atomic_load(&c->stop))
            if (pthread_cond_timedwait(&c->qroom, &c->qlock, &until) != 0)
                break;
        n = c->qlen;
        pthread_mutex_unlock(&c->qlock);
        if (n >= c->qcap)
            ingest_consumer_set_paused(c, 1);
    } else if (c->paused && n * 2 < c->qcap) {
        ingest_consumer_set_paused(c, 0);
    }
}
