/*
 * broker.c - the dev broker: librdkafka's mock cluster, in this process.
 *
 * The mock cluster runs its own thread and listens on ephemeral loopback
 * ports; it only needs an rd_kafka_t handle to log through, so we make an
 * idle producer handle that never connects anywhere. The limits of the mock
 * (memory only, 5 MiB a partition, no timestamp lookup, ...) are listed in
 * docs/operations.md "The dev broker's limits" and in `freshet broker --help`.
 *
 * Threads: a broker belongs to one thread (the one that created it); the
 * mock cluster's own thread serves the clients.
 */
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ingest/ingest.h"

#define BROKER_MAX 16

struct ingest_broker {
    rd_kafka_t *rk;                   /* the idle handle the cluster logs through */
    rd_kafka_mock_cluster_t *cluster; /* destroyed before rk                      */
    int nbrokers;                     /* broker ids are 1..nbrokers               */
};

/*
 * librdkafka's log callback. Runs on librdkafka's threads (the mock
 * cluster's among them): it only hands the line to fr_log, which writes it
 * to stderr with one write(2).
 */
static void broker_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    (void)rk;
    fr_log_level_t l = level <= 3 ? FR_LOG_ERROR : level <= 4 ? FR_LOG_WARN : FR_LOG_DEBUG;
    fr_log(l, "broker: %s: %s", fac, buf);
}

/*
 * Starts nbrokers mock brokers on loopback (see ingest.h). Returns NULL with
 * errstr when nbrokers is out of range or librdkafka cannot create the
 * handle or the cluster.
 */
ingest_broker_t *ingest_broker_new(int nbrokers, char *errstr, size_t size)
{
    char kerr[512];
    if (nbrokers < 1 || nbrokers > BROKER_MAX) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "broker: %d brokers; 1..%d are allowed", nbrokers,
                  BROKER_MAX);
        return NULL;
    }
    ingest_broker_t *b = calloc(1, sizeof(*b));
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (b == NULL || conf == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "broker: out of memory");
        goto err;
    }
    rd_kafka_conf_set_log_cb(conf, broker_log_cb);
    b->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, kerr, sizeof(kerr));
    if (b->rk == NULL) {
        fr_errorf(FR_ERR_KAFKA, errstr, size, "broker: %s", kerr);
        goto err;
    }
    conf = NULL; /* owned by rk now */
    b->cluster = rd_kafka_mock_cluster_new(b->rk, nbrokers);
    if (b->cluster == NULL) {
        fr_errorf(FR_ERR_KAFKA, errstr, size, "broker: could not start %d mock brokers", nbrokers);
        goto err;
    }
    b->nbrokers = nbrokers;
    return b;
err:
    if (conf != NULL)
        rd_kafka_conf_destroy(conf);
    ingest_broker_destroy(b);
    return NULL;
}

/* Stops the cluster (its clients see the connections close), then the
 * handle. NULL is a no-op. */
void ingest_broker_destroy(ingest_broker_t *b)
{
    if (b == NULL)
        return;
    if (b->cluster != NULL)
        rd_kafka_mock_cluster_destroy(b->cluster);
    if (b->rk != NULL)
        rd_kafka_destroy(b->rk);
    free(b);
}

/* Creates topic with partitions partitions, replication factor 1. */
fr_err_t ingest_broker_topic(ingest_broker_t *b, const char *topic, int partitions, char *errstr,
                             size_t size)
{
    if (b == NULL || topic == NULL || topic[0] == '\0' || strlen(topic) > INGEST_TOPIC_MAX ||
        partitions < 1)
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "broker: a topic needs a name of 1..%d bytes and at least 1 partition",
                         INGEST_TOPIC_MAX);
    rd_kafka_resp_err_t err = rd_kafka_mock_topic_create(b->cluster, topic, partitions, 1);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
        return fr_errorf(FR_ERR_KAFKA, errstr, size, "broker: topic %s: %s", topic,
                         rd_kafka_err2str(err));
    return FR_OK;
}

const char *ingest_broker_bootstraps(const ingest_broker_t *b)
{
    return b != NULL ? rd_kafka_mock_cluster_bootstraps(b->cluster) : "";
}

/*
 * Takes every broker down (their connections close and new ones are
 * dropped) or brings them back. Returns FR_ERR_KAFKA when the cluster
 * refuses one; the others are still switched.
 */
fr_err_t ingest_broker_set_up(ingest_broker_t *b, int up)
{
    fr_err_t rc = FR_OK;
    if (b == NULL)
        return FR_ERR_INVAL;
    for (int32_t id = 1; id <= b->nbrokers; id++) {
        rd_kafka_resp_err_t err = up ? rd_kafka_mock_broker_set_up(b->cluster, id)
                                     : rd_kafka_mock_broker_set_down(b->cluster, id);
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
            rc = FR_ERR_KAFKA;
    }
    return rc;
}
