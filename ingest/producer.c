/*
 * producer.c - a thin producer over librdkafka for freshet produce and the
 * dead-letter topics: properties passed verbatim, payloads copied, and the
 * delivery reports counted.
 *
 * Threads: thread-safe as librdkafka's producer is. Delivery reports are
 * served by whichever thread calls send or flush (they poll), so the
 * counters are atomic and the error text is guarded by a mutex.
 */
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ingest/ingest.h"
#include "ingest/ingest_int.h"

struct ingest_producer {
    rd_kafka_t *rk;
    atomic_uint_least64_t delivered, failed;
    pthread_mutex_t lock; /* guards error */
    char error[512];      /* the first delivery failure, or the last send/flush error */
};

/* Stores an error text for ingest_producer_error(). Any thread. */
static void set_error(ingest_producer_t *p, int only_first, const char *fmt, const char *a,
                      const char *b)
{
    pthread_mutex_lock(&p->lock);
    if (!only_first || p->error[0] == '\0')
        snprintf(p->error, sizeof(p->error), fmt, a, b);
    pthread_mutex_unlock(&p->lock);
}

/*
 * The delivery report callback. Runs on the thread that calls
 * rd_kafka_poll() or rd_kafka_flush(): ingest_producer_send or
 * ingest_producer_flush, on any application thread. Counts the message and
 * keeps the first failure's reason.
 */
static void dr_msg_cb(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
    (void)rk;
    ingest_producer_t *p = opaque;
    if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        atomic_fetch_add(&p->delivered, 1);
        return;
    }
    atomic_fetch_add(&p->failed, 1);
    set_error(p, 1, "delivery to %s failed: %s", rd_kafka_topic_name(msg->rkt),
              rd_kafka_err2str(msg->err));
}

/*
 * librdkafka's log callback. Runs on librdkafka's internal threads: it only
 * hands the line to fr_log, which writes it to stderr with one write(2).
 */
static void producer_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    (void)rk;
    fr_log_level_t l = level <= 3 ? FR_LOG_ERROR : level <= 4 ? FR_LOG_WARN : FR_LOG_DEBUG;
    fr_log(l, "kafka: %s: %s", fac, buf);
}

/*
 * A producer of bootstrap (may be NULL when props name bootstrap.servers)
 * with props applied in order after it, so that a later one overrides an
 * earlier one as kcat's -X does. Returns NULL with errstr naming the
 * property librdkafka refused. Caller frees with ingest_producer_destroy().
 */
ingest_producer_t *ingest_producer_new(const char *bootstrap, const char *const (*props)[2],
                                       size_t nprops, char *errstr, size_t size)
{
    char kerr[512];
    ingest_producer_t *p = calloc(1, sizeof(*p));
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (p == NULL || conf == NULL) {
        if (conf != NULL)
            rd_kafka_conf_destroy(conf);
        free(p);
        fr_errorf(FR_ERR_NOMEM, errstr, size, "producer: out of memory");
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    atomic_init(&p->delivered, 0);
    atomic_init(&p->failed, 0);
    if (bootstrap != NULL && rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, kerr,
                                               sizeof(kerr)) != RD_KAFKA_CONF_OK) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "kafka property bootstrap.servers: %s", kerr);
        goto err;
    }
    for (size_t i = 0; i < nprops; i++) {
        if (rd_kafka_conf_set(conf, props[i][0], props[i][1], kerr, sizeof(kerr)) !=
            RD_KAFKA_CONF_OK) {
            fr_errorf(FR_ERR_INVAL, errstr, size, "kafka property %s: %s", props[i][0], kerr);
            goto err;
        }
    }
    rd_kafka_conf_set_opaque(conf, p);
    rd_kafka_conf_set_dr_msg_cb(conf, dr_msg_cb);
    rd_kafka_conf_set_log_cb(conf, producer_log_cb);
    p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, kerr, sizeof(kerr));
    if (p->rk == NULL) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "producer: %s", kerr);
        goto err;
    }
    return p;
err:
    rd_kafka_conf_destroy(conf);
    pthread_mutex_destroy(&p->lock);
    free(p);
    return NULL;
}

/* Destroys the handle without waiting for messages still queued (flush
 * first to keep them). NULL is a no-op. */
void ingest_producer_destroy(ingest_producer_t *p)
{
    if (p == NULL)
        return;
    rd_kafka_destroy(p->rk);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* One rd_kafka_producev() call, with or without a header. */
static rd_kafka_resp_err_t produce_once(ingest_producer_t *p, const char *topic, int32_t partition,
                                        const void *key, size_t klen, const void *value,
                                        size_t vlen, const char *header_name,
                                        const char *header_value)
{
    if (header_name == NULL)
        return rd_kafka_producev(p->rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
                                 RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                 RD_KAFKA_V_KEY(key, klen), RD_KAFKA_V_VALUE((void *)value, vlen),
                                 RD_KAFKA_V_END);
    /* the macro casts its arguments without parentheses: pass plain names */
    ssize_t hlen = header_value != NULL ? (ssize_t)strlen(header_value) : 0;
    return rd_kafka_producev(p->rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
                             RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY(key, klen),
                             RD_KAFKA_V_VALUE((void *)value, vlen),
                             RD_KAFKA_V_HEADER(header_name, header_value, hlen), RD_KAFKA_V_END);
}

/*
 * Queues one message (see ingest.h). While librdkafka's local queue is full
 * it serves delivery reports for 10 ms and retries, so it blocks as long as
 * the brokers are slower than the caller; the wait ends at the latest when
 * queued messages time out (message.timeout.ms). Returns FR_ERR_KAFKA for
 * any other refusal (unknown partition, message too large), with the reason
 * in ingest_producer_error().
 */
fr_err_t ingest_producer_send(ingest_producer_t *p, const char *topic, int32_t partition,
                              const void *key, size_t klen, const void *value, size_t vlen,
                              const char *header_name, const char *header_value)
{
    if (p == NULL || topic == NULL)
        return FR_ERR_INVAL;
    for (;;) {
        rd_kafka_resp_err_t err =
            produce_once(p, topic, partition, key, klen, value, vlen, header_name, header_value);
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
            break;
        if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            set_error(p, 0, "produce to %s: %s", topic, rd_kafka_err2str(err));
            return FR_ERR_KAFKA;
        }
        rd_kafka_poll(p->rk, 10);
    }
    rd_kafka_poll(p->rk, 0); /* serve delivery reports as we go */
    return FR_OK;
}

/*
 * Waits up to timeout_ms (-1: until done) for every queued message to be
 * delivered or to fail, serving the delivery reports. *delivered and
 * *failed (either may be NULL) receive the totals since the producer was
 * made. Returns FR_OK when nothing is left in flight (failures included:
 * see *failed), FR_ERR_TIMEOUT when some messages are still queued.
 */
fr_err_t ingest_producer_flush(ingest_producer_t *p, int timeout_ms, uint64_t *delivered,
                               uint64_t *failed)
{
    if (p == NULL)
        return FR_ERR_INVAL;
    rd_kafka_resp_err_t err = rd_kafka_flush(p->rk, timeout_ms);
    if (delivered != NULL)
        *delivered = atomic_load(&p->delivered);
    if (failed != NULL)
        *failed = atomic_load(&p->failed);
    /* no error text for a timeout: it would hide the delivery failure */
    return err == RD_KAFKA_RESP_ERR__TIMED_OUT ? FR_ERR_TIMEOUT : FR_OK;
}

/* The first delivery failure or the last send/flush error ("" when none).
 * Borrowed until the next call on p; read it from one thread. */
const char *ingest_producer_error(const ingest_producer_t *p)
{
    return p != NULL ? p->error : "";
}

/*
 * The partition count of topic as the cluster's metadata says, waiting up
 * to timeout_ms for it. Returns it (> 0), or a negative fr_err_t:
 * FR_ERR_NOTFOUND for a topic the cluster does not know, FR_ERR_KAFKA or
 * FR_ERR_TIMEOUT when the metadata cannot be had.
 */
int ingest_producer_partitions(ingest_producer_t *p, const char *topic, int timeout_ms)
{
    if (p == NULL || topic == NULL)
        return FR_ERR_INVAL;
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(p->rk, topic, NULL);
    if (rkt == NULL)
        return FR_ERR_INVAL;
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err = rd_kafka_metadata(p->rk, 0, rkt, &md, timeout_ms);
    int rc;
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        set_error(p, 0, "metadata of %s: %s", topic, rd_kafka_err2str(err));
        rc = err == RD_KAFKA_RESP_ERR__TIMED_OUT ? FR_ERR_TIMEOUT : FR_ERR_KAFKA;
    } else if (md->topic_cnt != 1 || md->topics[0].err != RD_KAFKA_RESP_ERR_NO_ERROR ||
               md->topics[0].partition_cnt < 1) {
        set_error(p, 0, "metadata of %s: %s", topic,
                  md->topic_cnt == 1 && md->topics[0].err != RD_KAFKA_RESP_ERR_NO_ERROR
                      ? rd_kafka_err2str(md->topics[0].err)
                      : "no partitions");
        rc = FR_ERR_NOTFOUND;
    } else {
        rc = md->topics[0].partition_cnt;
    }
    if (md != NULL)
        rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    return rc;
}
