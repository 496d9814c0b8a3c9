/*
 * consumer_decode.c - decoding ahead: a backlog's records decoded by the
 * poll thread and helper threads together (docs/design.md "Decoding ahead").
 *
 * A csv record of 784 features takes about 10 us to decode, a raw read of
 * it well under 5: on a backlog the poll thread, decoding alone, is the
 * consumer's limit. So when a record arrives and others are already queued
 * behind it, the poll thread takes up to DECODE_WINDOW of them at once (a
 * poll with no wait each), cuts the window into one slice per thread, and
 * decodes its own slice while the helpers decode theirs into rows of their
 * own. Then it hands the messages to the batcher one by one, in Kafka's
 * order, each with its decoded row (ingest_batcher_add_decoded), so every
 * rule of the batcher (redeliveries, skips, quarantine, batch boundaries,
 * rejections and their dead letters) runs exactly as before, on the poll
 * thread. A record the batcher then ignores (a redelivery) was decoded for
 * nothing, which costs time, never correctness.
 *
 * The one event that can come between two records of a window and touch
 * the batcher is a rebalance: librdkafka runs its callback inside the poll
 * that looks ahead (the offset commit callback may run there too; it only
 * marks a partition's commit to be sent again). The rebalance callback
 * first drains the window (ingest_consumer_window_drain), so the records
 * polled before the event reach the batcher before the revocation or the
 * new start, as they would one at a time. An error event (end of
 * partition, an offset out of range) ends a window and is handled last,
 * in its turn.
 *
 * A lone record (a live stream, or nothing queued behind it) is decoded by
 * the poll thread with no hand-off. f32 records never come here: their
 * decode is a copy (decoders_for in consumer.c).
 */
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "ingest/consumer_int.h"
#include "ingest/ingest.h"

struct decode_pool {
    ingest_consumer_t *c;
    pthread_t *threads; /* [n] */
    int n, started;
    pthread_mutex_t lock;
    pthread_cond_t job;  /* a new window, or stop */
    pthread_cond_t done; /* pending reached 0      */
    uint64_t gen;        /* numbers windows        */
    int pending;         /* helpers not done with the current window */
    int stop;
};

typedef struct helper_arg {
    struct decode_pool *pool;
    int index; /* 1..n: its slice; the poll thread decodes slice 0 */
} helper_arg_t;

/* Decodes the window's slice k of parts (messages [nwin k / parts,
 * nwin (k + 1) / parts)) into its rows. Error events are left alone. A
 * helper's slice (k > 0) counts its records in decoded_ahead. */
static void decode_slice(ingest_consumer_t *c, int k, int parts)
{
    FR_ASSERT(k >= 0 && k < parts && c->nwin <= DECODE_WINDOW); /* rows of win_x */
    size_t from = c->nwin * (size_t)k / (size_t)parts;
    size_t to = c->nwin * (size_t)(k + 1) / (size_t)parts;
    uint64_t records = 0;
    for (size_t i = from; i < to; i++) {
        const rd_kafka_message_t *m = c->win[i];
        if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR)
            continue;
        c->win_why[i] =
            ingest_batcher_decode(c->bt, m->payload, m->len, c->win_x + i * c->win_d, &c->win_y[i]);
        records++;
    }
    if (k > 0 && records > 0)
        atomic_fetch_add(&c->decoded_ahead, records);
}

static void *helper_main(void *arg)
{
    helper_arg_t *h = arg;
    struct decode_pool *pool = h->pool;
    uint64_t seen = 0;
    fr_thread_name("fr-decode");
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (!pool->stop && pool->gen == seen)
            pthread_cond_wait(&pool->job, &pool->lock);
        if (pool->stop)
            break;
        seen = pool->gen;
        pthread_mutex_unlock(&pool->lock);
        /* the window stays put until every helper has reported (below) */
        decode_slice(pool->c, h->index, pool->n + 1);
        pthread_mutex_lock(&pool->lock);
        if (--pool->pending == 0)
            pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->lock);
    free(h);
    return NULL;
}

fr_err_t ingest_consumer_decode_start(ingest_consumer_t *c, int n)
{
    if (n <= 0 || c->pool != NULL)
        return FR_ERR_INVAL;
    size_t d = c->win_d;
    c->win = calloc(DECODE_WINDOW, sizeof(*c->win));
    c->win_x = malloc(DECODE_WINDOW * d * sizeof(float));
    c->win_y = malloc(DECODE_WINDOW * sizeof(float));
    c->win_why = malloc(DECODE_WINDOW * sizeof(*c->win_why));
    struct decode_pool *pool = calloc(1, sizeof(*pool));
    if (pool != NULL)
        pool->threads = calloc((size_t)n, sizeof(*pool->threads));
    if (c->win == NULL || c->win_x == NULL || c->win_y == NULL || c->win_why == NULL ||
        pool == NULL || pool->threads == NULL) {
        if (pool != NULL)
            free(pool->threads);
        free(pool);
        ingest_consumer_decode_stop(c);
        return FR_ERR_NOMEM;
    }
    pool->c = c;
    pool->n = n;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->job, NULL);
    pthread_cond_init(&pool->done, NULL);
    c->pool = pool;
    for (int i = 0; i < n; i++) {
        helper_arg_t *h = malloc(sizeof(*h));
        if (h != NULL) {
            h->pool = pool;
            h->index = i + 1;
        }
        if (h == NULL || pthread_create(&pool->threads[i], NULL, helper_main, h) != 0) {
            free(h);
            ingest_consumer_decode_stop(c);
            return FR_ERR_NOMEM;
        }
        pool->started++;
    }
    return FR_OK;
}

void ingest_consumer_decode_stop(ingest_consumer_t *c)
{
    struct decode_pool *pool = c->pool;
    if (pool != NULL) {
        pthread_mutex_lock(&pool->lock);
        pool->stop = 1;
        pthread_cond_broadcast(&pool->job);
        pthread_mutex_unlock(&pool->lock);
        for (int i = 0; i < pool->started; i++)
            pthread_join(pool->threads[i], NULL);
        pthread_cond_destroy(&pool->job);
        pthread_cond_destroy(&pool->done);
        pthread_mutex_destroy(&pool->lock);
        free(pool->threads);
        free(pool);
        c->pool = NULL;
    }
    for (size_t i = 0; c->win != NULL && i < c->nwin; i++)
        rd_kafka_message_destroy(c->win[i]);
    c->nwin = 0;
    free(c->win);
    free(c->win_x);
    free(c->win_y);
    free(c->win_why);
    c->win = NULL;
    c->win_x = c->win_y = NULL;
    c->win_why = NULL;
}

/* Decodes the whole window: slice 0 here, the others on the helpers. */
static void decode_window(ingest_consumer_t *c)
{
    struct decode_pool *pool = c->pool;
    pthread_mutex_lock(&pool->lock);
    pool->gen++;
    pool->pending = pool->n;
    pthread_cond_broadcast(&pool->job);
    pthread_mutex_unlock(&pool->lock);
    decode_slice(c, 0, pool->n + 1);
    pthread_mutex_lock(&pool->lock);
    while (pool->pending > 0)
        pthread_cond_wait(&pool->done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}

void ingest_consumer_window_drain(ingest_consumer_t *c)
{
    if (c->nwin == 0)
        return;
    /* nothing below polls, so no callback re-enters while it runs */
    size_t n = c->nwin;
    FR_ASSERT(n <= DECODE_WINDOW);
    if (n == 1) {
        ingest_consumer_on_message(c, c->win[0], NULL);
    } else {
        decode_window(c);
        for (size_t i = 0; i < n; i++) {
            const rd_kafka_message_t *m = c->win[i];
            if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) { /* an event: nothing was decoded */
                ingest_consumer_on_message(c, m, NULL);
                continue;
            }
            ingest_decoded_t pre = {c->win_x + i * c->win_d, c->win_y[i], c->win_why[i]};
            ingest_consumer_on_message(c, m, &pre);
        }
    }
    for (size_t i = 0; i < n; i++)
        rd_kafka_message_destroy(c->win[i]);
    c->nwin = 0;
}

void ingest_consumer_hold_for_test(ingest_consumer_t *c, int32_t partition, int64_t offset)
{
    c->hold_partition = partition;
    c->hold_offset = offset;
}

/* Whether the window holds the record ingest_consumer_hold_for_test named. */
static int holds_the_mark(const ingest_consumer_t *c)
{
    for (size_t i = 0; i < c->nwin; i++)
        if (c->win[i]->err == RD_KAFKA_RESP_ERR_NO_ERROR &&
            c->win[i]->partition == c->hold_partition && c->win[i]->offset >= c->hold_offset)
            return 1;
    return 0;
}

int ingest_consumer_holds_for_test(ingest_consumer_t *c)
{
    return atomic_load(&c->holds);
}

/* Whether ingest_consumer_hold_for_test's hold is due now. */
static int hold_due(const ingest_consumer_t *c)
{
    return c->hold_offset >= 0 && holds_the_mark(c);
}

/* ingest_consumer_hold_for_test's wait: polls until a rebalance callback
 * has run (it drains the window) or a message comes. */
static rd_kafka_message_t *hold_for_rebalance(ingest_consumer_t *c)
{
    uint64_t seen = c->rebalances;
    c->hold_offset = -1; /* once */
    atomic_fetch_add(&c->holds, 1);
    for (int waited = 0; c->rebalances == seen && waited < HOLD_MAX_MS && !atomic_load(&c->stop);
         waited += 10) {
        rd_kafka_message_t *next = rd_kafka_consumer_poll(c->rk, 10);
        if (next != NULL)
            return next;
    }
    return NULL;
}

void ingest_consumer_window_take(ingest_consumer_t *c, rd_kafka_message_t *m)
{
    FR_ASSERT(c->nwin == 0); /* every take ends with a drain */
    c->win[c->nwin++] = m;
    while (c->nwin < DECODE_WINDOW) {
        /* may run the rebalance callback, which drains what is held */
        rd_kafka_message_t *next = rd_kafka_consumer_poll(c->rk, 0);
        if (next == NULL && hold_due(c))
            next = hold_for_rebalance(c);
        if (next == NULL)
            break;
        c->win[c->nwin++] = next;
        if (next->err != RD_KAFKA_RESP_ERR_NO_ERROR)
            break; /* an event ends the window; it is handled in its turn */
    }
    if (c->nwin == DECODE_WINDOW && hold_due(c) && c->cq != NULL &&
        rd_kafka_queue_length(c->cq) == 0) {
        /* tests: the marked record filled the window */
        rd_kafka_message_t *next = hold_for_rebalance(c);
        ingest_consumer_window_drain(c);
        FR_ASSERT(c->nwin == 0);
        if (next != NULL)
            c->win[c->nwin++] = next;
    }
    ingest_consumer_window_drain(c);
}
