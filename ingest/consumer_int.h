/*
 * consumer_int.h - private declarations shared by the consumer's sources:
 * consumer.c (configuration and life cycle), consumer_poll.c (the poll
 * thread and what happens to each message), consumer_assign.c (the
 * rebalance callbacks and the assignment), consumer_decode.c (decoding
 * ahead), consumer_queue.c (the batch queue, the lent list and
 * backpressure) and consumer_store.c (where a partition starts, the
 * once-a-second store tick, the gap rule and replays).
 *
 * Not part of the public API. It is separate from ingest_int.h because it
 * includes librdkafka and pthread, and ingest_int.h is also read by the
 * compute core's sources (fr_ingest_core), which build without librdkafka.
 * The functions below carry the ingest_consumer_ prefix like the public
 * ones; they are the only non-static functions of these files, and each
 * says which thread calls it and which lock it needs.
 */
#ifndef FRESHET_CONSUMER_INT_H
#define FRESHET_CONSUMER_INT_H

#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "common/common.h"
#include "ingest/ingest.h"
#include "psstore/grads/grads.h"
#include "psstore/store/status.h"

#define STORE_TIMEOUT_MS   5000  /* Redis connect and command timeout      */
#define DECODE_WINDOW      32    /* messages held at once to decode ahead */
#define HOLD_MAX_MS        60000 /* ingest_consumer_hold_for_test's longest wait */
#define DECODE_THREADS_MAX 16    /* decode helpers a consumer may start   */
#define QUERY_TIMEOUT_MS   5000  /* a ListOffsets question or a seek       */

#define RDK_2_1 0x020100ff /* rd_kafka_version() of librdkafka 2.1.0 */

typedef struct qnode {
    struct qnode *next;
    ingest_batch_t *batch;
} qnode_t;

/* Per assigned partition, the poll thread's bookkeeping. */
typedef struct owned {
    int32_t partition;
    int64_t committed;   /* the last watermark committed to Kafka, -1: none   */
    int64_t watermark;   /* the store's at the last tick, -1: not read yet     */
    int64_t since;       /* when it last changed (monotonic ms)                */
    int64_t replay_seen; /* the newest replay generation considered here       */
    int rewinding;       /* paused until the applier executes our rewind       */
    int64_t held_warned; /* when a long-held watermark was last warned of (ms)  */
    int64_t dropped_at;  /* the watermark a dropped gradient was last seen at (-1) */
    fr_series_t *lag;    /* freshet_kafka_consumergroup_lag{topic,partition}   */
} owned_t;

/* A batch handed to a trainer, until it is done and its stream entry gone. */
typedef struct lent {
    uint64_t seq;
    ingest_range_t *ranges; /* a copy of the batch's */
    size_t nranges;
    char id[64]; /* "" while computing, else the gradient's stream id */
} lent_t;

struct ingest_consumer {
    /* configuration (copies) */
    char *topic, *model, *redis_url, *dlt, *bootstrap;
    char *(*props)[2]; /* [nprops] key, value: for the resolver */
    size_t nprops;
    int linger_ms, start_latest, gap_ms;
    atomic_llong lost_ms; /* when a trainer last reported a lost batch (0: never) */
    int aux;              /* the schema's aux slot: records' freshet-p headers are read */
    size_t qcap;

    rd_kafka_t *rk;
    ingest_batcher_t *bt;   /* poll thread only once started */
    ingest_producer_t *dlq; /* NULL without a dead-letter topic */
    psstore_conn_t *ps;     /* poll thread only */
    ingest_resolver_t *rs;  /* poll thread only; made at the first replay */
    pthread_t thread;
    int started, joined; /* the owner's thread only */
    int whole_topic;     /* assigns every partition itself, no group membership */
    int whole_parts;     /* partitions assigned so far that way (poll thread) */
    atomic_int stop;     /* set by the owner, read by the poll thread */

    /* the assignment: poll thread only */
    rd_kafka_topic_partition_list_t *assigned; /* offsets unused */
    owned_t *owned;                            /* [nowned] */
    int nowned;
    int paused;
    uint64_t rebalances; /* rebalance callbacks run so far */

    /* fetch wakeups (consumer_poll.c "Fetch wakeups"): poll thread only */
    int wake;             /* librdkafka below 2.1: the poll thread wakes its fetcher */
    rd_kafka_queue_t *cq; /* the consumer queue, whose length is sampled */
    size_t q_high;        /* its longest since the last wakeup          */
    int64_t q_min_msgs;   /* librdkafka's queued.min.messages             */
    double q_max_bytes;   /* its queued.max.messages.kbytes, in bytes     */
    double avg_len;       /* a record's mean payload, as consumed         */

    /* the open batch: when its first record came (-1: none open), and
     * whether one is open; poll thread only */
    int64_t open_since;
    int dirty;

    /* decoding ahead (consumer_decode.c): the poll thread's, the helpers
     * read the window's payloads and write their slices of win_x/y/why */
    int ndecoders;            /* helper threads (0: none, no window)      */
    struct decode_pool *pool; /* the helpers                             */
    rd_kafka_message_t **win; /* [DECODE_WINDOW] messages held, in order  */
    size_t nwin;              /* how many                                */
    float *win_x, *win_y;     /* [DECODE_WINDOW][D], [DECODE_WINDOW]      */
    ingest_reject_t *win_why; /* [DECODE_WINDOW]                          */
    size_t win_d;             /* D, the schema's features                */
    /* tests (ingest_consumer_hold_for_test): a window holding this
     * partition's record at hold_offset or past it, with nothing queued
     * behind, waits for the next rebalance; -1: never */
    int32_t hold_partition;
    int64_t hold_offset;
    atomic_int holds; /* such waits begun */

    /* replays: poll thread only */
    int64_t replay_gen;       /* generation of the replay below, 0: none seen   */
    int replay_ok;            /* it parsed and has a target                     */
    psstore_replay_t *replay; /* the published replay, parsed                   */
    char *spec;               /* [PSSTORE_REPLAY_SPEC_MAX] its text, reused     */
    char rewind_id[64];       /* our rewind request waiting for the applier     */

    /* the queue, under qlock: qlen counts the nodes from qhead to qtail
     * (qhead == NULL exactly when qlen == 0); batch seq numbers rise */
    pthread_mutex_t qlock;
    pthread_cond_t qcond;
    pthread_cond_t qroom; /* a batch was taken: the poll thread may go on */
    qnode_t *qhead, *qtail;
    size_t qlen;
    int finished;          /* the poll thread has exited */
    uint64_t seq;          /* numbers batches as they are queued */
    lent_t *lent;          /* [nlent] batches taken and not yet known applied */
    size_t nlent, caplent; /* nlent <= caplent */

    /* counters */
    atomic_uint_least64_t consumed, batches, dead_letters, pauses, gap_seeks, rewinds,
        retention_skips, fetch_wakeups, decoded_ahead, rebalance_drained;
    int64_t beyond_logged_ms; /* last "beyond the log end" error (poll thread) */
    atomic_uint_least64_t rejected[INGEST_REJECT_COUNT];
    atomic_int npaused, nassigned;
    atomic_int_least64_t lag; /* summed over the assigned partitions, last tick */

    /* metrics (NULL without a registry) */
    fr_metrics_t *metrics;
    fr_metric_t *m_lag;
    fr_series_t *m_consumed, *m_paused, *m_fill, *m_gap, *m_rewinds, *m_retention, *m_wakeups;
    fr_series_t *m_rejected[INGEST_REJECT_COUNT];
};

/* The monotonic clock in ms. */
static inline int64_t now_ms(void)
{
    return (int64_t)(fr_clock_mono_ns() / 1000000u);
}

static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------------
 * consumer.c
 * ---------------------------------------------------------------------- */

/* The cancel test of the consumer's Redis connection (arg is the
 * consumer): nonzero once it stops, so reconnecting gives up. Any thread. */
int ingest_consumer_stopping(void *arg);

/* ------------------------------------------------------------------------
 * consumer_poll.c
 * ---------------------------------------------------------------------- */

/*
 * The poll thread's body (arg is the consumer): polls, which also runs the
 * rebalance and commit callbacks, batches, flushes, applies backpressure
 * and ticks; on stop flushes, leaves the group and marks the queue
 * finished. Started by ingest_consumer_start.
 */
void *ingest_consumer_poll_main(void *arg);

/*
 * One message, in Kafka's order: an error or end-of-partition event, or a
 * record for the batcher, decoded here or (pre not NULL) ahead by
 * consumer_decode.c. The message is borrowed. Poll thread.
 */
void ingest_consumer_on_message(ingest_consumer_t *c, const rd_kafka_message_t *m,
                                const ingest_decoded_t *pre);

/* Reads librdkafka's prefetch limits and takes the consumer queue, for the
 * fetch wakeups below librdkafka 2.1. Owner's thread, in ingest_consumer_new. */
void ingest_consumer_fetch_wake_init(ingest_consumer_t *c);

/* ------------------------------------------------------------------------
 * consumer_assign.c
 * ---------------------------------------------------------------------- */

/* librdkafka's rebalance callback (opaque is the consumer). Runs on the
 * poll thread, inside rd_kafka_consumer_poll or rd_kafka_consumer_close. */
void ingest_consumer_rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                                  rd_kafka_topic_partition_list_t *parts, void *opaque);

/* Pauses (pause = 1) or resumes one assigned partition. Poll thread. */
void ingest_consumer_pause_one(ingest_consumer_t *c, int32_t partition, int pause);

/* Pauses (pause = 1) or resumes the whole assignment (a partition waiting
 * for its rewind stays paused). Poll thread. */
void ingest_consumer_set_paused(ingest_consumer_t *c, int pause);

/* Restarts the fetch of a partition librdkafka stopped, at offset: it
 * leaves the assignment and comes back. Poll thread. */
void ingest_consumer_refetch(ingest_consumer_t *c, const char *topic, int32_t partition,
                             int64_t offset);

/* The whole topic without a group: assigns the partitions not assigned
 * yet, waiting up to timeout_ms for the metadata. 0 once assigned (or
 * nothing new), -1 when it failed (try again). Poll thread. */
int ingest_consumer_assign_whole_topic(ingest_consumer_t *c, int timeout_ms);

/* ------------------------------------------------------------------------
 * consumer_decode.c
 * ---------------------------------------------------------------------- */

/*
 * Allocates the window and starts n helper threads (n > 0). FR_ERR_NOMEM,
 * with nothing left started. Owner's thread, before the poll thread.
 */
fr_err_t ingest_consumer_decode_start(ingest_consumer_t *c, int n);

/* Stops and joins the helpers and frees the window (empty by then). Owner's
 * thread, after the poll thread has exited; safe when never started. */
void ingest_consumer_decode_stop(ingest_consumer_t *c);

/*
 * Takes record m (ownership) and what else is queued behind it, up to
 * DECODE_WINDOW messages; decodes them in parallel and hands each to
 * ingest_consumer_on_message in order, then destroys them. Poll thread.
 */
void ingest_consumer_window_take(ingest_consumer_t *c, rd_kafka_message_t *m);

/*
 * Decodes and hands on the messages held so far, in order. The rebalance
 * callback calls it first, so that no record of a partition is handed to
 * the batcher after the partition's revocation or new start. Poll thread.
 */
void ingest_consumer_window_drain(ingest_consumer_t *c);

/*
 * Tests only: the moment the rebalance drain exists for, made certain. Once
 * the poll thread's window holds partition's record at offset or past it
 * and nothing is queued behind, it keeps the window and polls on until a
 * rebalance callback has run (at most HOLD_MAX_MS), so that the callback
 * finds the window held. Once; before ingest_consumer_start. Only records
 * decoded ahead are windowed: without decode helpers, or for f32 records,
 * nothing is held.
 */
void ingest_consumer_hold_for_test(ingest_consumer_t *c, int32_t partition, int64_t offset);

/* Tests only: how many such holds have begun (0 or 1). Any thread. */
int ingest_consumer_holds_for_test(ingest_consumer_t *c);

/* ------------------------------------------------------------------------
 * consumer_queue.c
 * ---------------------------------------------------------------------- */

/*
 * Appends a batch (NULL is ignored) and wakes a waiter. Poll thread; takes
 * qlock. Takes ownership; when out of memory the batch is destroyed and
 * logged, which loses nothing: its positions were never recorded, so the
 * gap rule (or a restart) reads them again.
 */
void ingest_consumer_queue_push(ingest_consumer_t *c, ingest_batch_t *batch);

/* Frees the batches still queued and the lent list. Owner's thread, once
 * the poll thread has exited (ingest_consumer_destroy). */
void ingest_consumer_queue_fini(ingest_consumer_t *c);

/*
 * Rule 3's test: why position pos of the partition is outstanding, or
 * NULL when it is not. It is when nothing was read past it yet, or it
 * belongs to an outstanding batch: the open one, a queued one, one a
 * trainer computes, or one whose gradient still waits in the grads
 * stream. A Redis error counts as outstanding (decide at the next tick).
 * *dropped (may be NULL) is set when a batch this consumer lent, holding
 * pos, was pushed and its entry is gone from the stream: the applier
 * consumed it without marking pos, so it dropped it (a new epoch, a replay,
 * staleness). Poll thread; takes qlock.
 */
const char *ingest_consumer_outstanding(ingest_consumer_t *c, int32_t partition, int64_t pos,
                                        int *dropped);

/* Forgets lent batches whose positions in this consumer's partitions are
 * all below the store's watermarks now (applied, dropped or re-read), and
 * those of partitions it no longer owns. Poll thread; takes qlock. */
void ingest_consumer_lent_prune(ingest_consumer_t *c);

/* Backpressure: pauses the assignment when the queue stays full, resumes
 * it once the queue drained (see consumer_queue.c). Poll thread. */
void ingest_consumer_backpressure(ingest_consumer_t *c);

/* ------------------------------------------------------------------------
 * consumer_store.c
 * ---------------------------------------------------------------------- */

/*
 * Decides where one newly assigned partition starts and seeks the batcher
 * there (rule 2, see consumer_store.c). Returns the Kafka offset to assign,
 * or -1 when stopping before it knew. Poll thread.
 */
int64_t ingest_consumer_partition_start(ingest_consumer_t *c, const char *topic, int32_t partition);

/*
 * Every COMMIT_EVERY_MS: the store's watermarks to Kafka, the lag gauges,
 * the gap rule and replays (see consumer_store.c); the final tick, at
 * stop, only commits. Poll thread.
 */
void ingest_consumer_store_tick(ingest_consumer_t *c, int final);

/*
 * librdkafka's offset commit callback, also called by the store tick when
 * a commit fails at once. Runs on the poll thread, inside
 * rd_kafka_consumer_poll. A failed commit is tried again at the next tick.
 */
void ingest_consumer_commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                               rd_kafka_topic_partition_list_t *offsets, void *opaque);

#endif /* FRESHET_CONSUMER_INT_H */
