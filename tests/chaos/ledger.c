/*
 * ledger.c - the chaos suite's ledger (ledger.h): the stream of the ledger
 * model, its initial weights, and the check that reads the topic with a
 * consumer of its own (librdkafka's, not freshet's ingest) and hands it,
 * with the weights read from Redis, to ledger.py.
 */
#include "ledger.h"

#include <hiredis/hiredis.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

#define PYTHON     "/usr/bin/python3"
#define LEDGER_PY  FRESHET_SOURCE_DIR "/tests/chaos/ledger.py"
#define MAX_PARTS  16
#define RECORD_LEN (sizeof(float) * (1 + LEDGER_FEATURES))

void ledger_record(int64_t k, float v[1 + LEDGER_FEATURES])
{
    fr_rng_t rng;
    fr_rng_seed(&rng, 9000 + (uint64_t)k);
    v[0] = 1.0f;
    for (int i = 1; i <= LEDGER_FEATURES; i++)
        v[i] = (float)fr_rng_below(&rng, 3) - 1.0f;
}

int ledger_init(const char *path, const char *log)
{
    char features[16];
    snprintf(features, sizeof(features), "%d", LEDGER_FEATURES);
    char *argv[] = {PYTHON, LEDGER_PY, "init", (char *)path, features, NULL};
    return harness_run(argv, log, 30000) == 0 ? 0 : -1;
}

/* The topic as read so far: a legacy consumer per partition, started once
 * at the beginning; the values go to DIR/ledger.topic, the records that must
 * train counted as they arrive. */
static struct {
    rd_kafka_t *rk;
    rd_kafka_topic_t *rkt;
    int nparts;
    int64_t next[MAX_PARTS];
    FILE *out;
    int64_t records, valid;
} rd;

/* The rule of [ingest]'s checks at their defaults, which ledger.py applies
 * again on its own: every value finite, every feature within 1e6, label 1. */
static int must_train(const float *v)
{
    for (int i = 0; i <= LEDGER_FEATURES; i++)
        if (!isfinite(v[i]) || (i > 0 && fabsf(v[i]) > 1e6f))
            return 0;
    return v[0] == 1.0f;
}

static int reader_open(const char *bootstrap, const char *topic, int nparts, const char *dir)
{
    char errstr[256], path[320];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, errstr, sizeof(errstr)) !=
            RD_KAFKA_CONF_OK ||
        (rd.rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr))) == NULL) {
        rd_kafka_conf_destroy(conf);
        fprintf(stderr, "ledger: cannot make a consumer: %s\n", errstr);
        return -1;
    }
    rd.rkt = rd_kafka_topic_new(rd.rk, topic, NULL);
    rd.nparts = nparts;
    for (int p = 0; p < nparts; p++)
        if (rd_kafka_consume_start(rd.rkt, p, RD_KAFKA_OFFSET_BEGINNING) != 0) {
            fprintf(stderr, "ledger: cannot read %s/%d: %s\n", topic, p,
                    rd_kafka_err2str(rd_kafka_last_error()));
            return -1;
        }
    snprintf(path, sizeof(path), "%s/ledger.topic", dir);
    rd.out = fopen(path, "wb");
    return rd.out != NULL ? 0 : -1;
}

/* Reads every partition to its end now; 0, or -1 (said why). */
static int reader_catch_up(const char *topic, int timeout_ms)
{
    uint64_t t0 = fr_clock_mono_ns();
    for (int p = 0; p < rd.nparts; p++) {
        int64_t lo, hi;
        rd_kafka_resp_err_t err =
            rd_kafka_query_watermark_offsets(rd.rk, topic, p, &lo, &hi, timeout_ms);
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            fprintf(stderr, "ledger: the end of %s/%d: %s\n", topic, p, rd_kafka_err2str(err));
            return -1;
        }
        if (rd.next[p] == 0 && lo > 0) {
            fprintf(stderr,
                    "ledger: %s/%d starts at %lld: the broker dropped records the ledger "
                    "needs\n",
                    topic, p, (long long)lo);
            return -1;
        }
        while (rd.next[p] < hi) {
            if (fr_clock_mono_ns() - t0 > (uint64_t)timeout_ms * 1000000u) {
                fprintf(stderr, "ledger: %s/%d read to %lld of %lld in %d ms\n", topic, p,
                        (long long)rd.next[p], (long long)hi, timeout_ms);
                return -1;
            }
            rd_kafka_message_t *m[256];
            ssize_t n = rd_kafka_consume_batch(rd.rkt, p, 100, m, 256);
            for (ssize_t i = 0; i < n; i++) {
                if (m[i]->err == RD_KAFKA_RESP_ERR_NO_ERROR && m[i]->offset == rd.next[p]) {
                    if (m[i]->len != RECORD_LEN) {
                        fprintf(stderr, "ledger: %s/%d@%lld holds %zu bytes, not %zu\n", topic, p,
                                (long long)m[i]->offset, m[i]->len, RECORD_LEN);
                        rd_kafka_message_destroy(m[i]);
                        return -1;
                    }
                    float v[1 + LEDGER_FEATURES];
                    memcpy(v, m[i]->payload, RECORD_LEN);
                    fwrite(v, RECORD_LEN, 1, rd.out);
                    rd.records++;
                    rd.valid += must_train(v);
                    rd.next[p]++;
                }
                rd_kafka_message_destroy(m[i]);
            }
        }
    }
    return fflush(rd.out) == 0 ? 0 : -1;
}

/* The store's w:0 (float32 w then b) into w; 0, or -1 while it cannot be
 * read. */
static int store_weights(const harness_redis_t *node, const char *model, float *w)
{
    redisContext *c = node != NULL ? redisConnect("127.0.0.1", node->port) : NULL;
    int rc = -1;
    if (c != NULL && !c->err) {
        redisReply *r = redisCommand(c, "GET freshet:{%s}:w:0", model);
        if (r != NULL && r->type == REDIS_REPLY_STRING && r->len == RECORD_LEN) {
            memcpy(w, r->str, RECORD_LEN);
            rc = 0;
        }
        if (r != NULL)
            freeReplyObject(r);
    }
    if (c != NULL)
        redisFree(c);
    return rc;
}

int ledger_check(const char *bootstrap, const char *topic, int nparts, const char *model,
                 const harness_redis_t *(*node)(void), const char *dir, int wait_ms)
{
    if (rd.rk == NULL && reader_open(bootstrap, topic, nparts, dir) != 0)
        return -1;
    if (reader_catch_up(topic, wait_ms) != 0)
        return -1;
    /* the bias counts the records applied: wait for all of them (more is
     * a failure ledger.py reports at once) */
    float w[1 + LEDGER_FEATURES];
    int64_t applied = -1;
    uint64_t t0 = fr_clock_mono_ns();
    for (;;) {
        if (store_weights(node(), model, w) == 0)
            applied = (int64_t)llround(((double)w[LEDGER_FEATURES] - LEDGER_B0) * 1024.0);
        if (applied >= rd.valid || fr_clock_mono_ns() - t0 > (uint64_t)wait_ms * 1000000u)
            break;
        harness_sleep_ms(20);
    }
    if (applied < 0) {
        fprintf(stderr, "ledger: the store's weights cannot be read\n");
        return -1;
    }
    char wpath[320], tpath[320], log[320], features[16];
    snprintf(wpath, sizeof(wpath), "%s/ledger.weights", dir);
    snprintf(tpath, sizeof(tpath), "%s/ledger.topic", dir);
    snprintf(log, sizeof(log), "%s/ledger.log", dir);
    snprintf(features, sizeof(features), "%d", LEDGER_FEATURES);
    FILE *f = fopen(wpath, "wb");
    if (f == NULL || fwrite(w, RECORD_LEN, 1, f) != 1 || fclose(f) != 0)
        return -1;
    char *argv[] = {PYTHON, LEDGER_PY, "check", tpath, wpath, features, NULL};
    remove(log); /* the harness appends */
    int status = harness_run(argv, log, 60000);
    size_t len;
    char *said = harness_read_file(log, &len);
    if (said != NULL)
        fputs(said, stdout);
    free(said);
    fflush(stdout);
    return status == 0 ? 0 : -1;
}

void ledger_fini(void)
{
    if (rd.rkt != NULL) {
        for (int p = 0; p < rd.nparts; p++)
            rd_kafka_consume_stop(rd.rkt, p);
        rd_kafka_topic_destroy(rd.rkt);
    }
    if (rd.rk != NULL)
        rd_kafka_destroy(rd.rk);
    if (rd.out != NULL)
        fclose(rd.out);
    memset(&rd, 0, sizeof(rd));
}
