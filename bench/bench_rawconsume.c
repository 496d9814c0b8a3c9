/*
 * bench_rawconsume.c - the physical limit of consuming a topic: a raw
 * librdkafka consumer reads every partition of TOPIC from its log start to
 * its end, as fast as it can, reading every cache line of every payload
 * (freshet's decoder reads them all), and prints what it read. It is the
 * consume side of `min(W x fit, raw consume)` that bench/run_vs_fit.sh
 * measures against the same broker and topic as the run, in the same run.
 *
 * The consumer is configured as freshet's is (fetch.wait.max.ms 5,
 * fetch.max.bytes 2 MiB, the same --set properties): the figure is what librdkafka itself delivers
 * under freshet's settings, with nothing of freshet's on top. Partitions
 * are assigned at their log start (no group join), and the clock runs
 * from the first message to the last.
 *
 * usage: bench_rawconsume --bootstrap HOST:PORT --topic T [--set KEY=VALUE]...
 * prints: records N bytes B seconds S records_per_s R mb_per_s M
 * Exits 1 when the topic cannot be read to its end within 120 s.
 */
#include <librdkafka/rdkafka.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WAIT_S     120.0
#define MAX_SETS   32
#define QUERY_MS   10000
#define CACHE_LINE 64

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_rawconsume: %s\n", what);
    exit(1);
}

static void usage(FILE *out)
{
    fputs("usage: bench_rawconsume --bootstrap HOST:PORT --topic T [--set KEY=VALUE]...\n", out);
}

static void conf_set(rd_kafka_conf_t *kc, const char *key, const char *value)
{
    char kerr[512];
    if (rd_kafka_conf_set(kc, key, value, kerr, sizeof(kerr)) != RD_KAFKA_CONF_OK)
        die(kerr);
}

int main(int argc, char **argv)
{
    const char *bootstrap = NULL, *topic = NULL, *sets[MAX_SETS];
    int nsets = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            usage(stderr);
            return 2;
        }
        if (strcmp(argv[i], "--bootstrap") == 0)
            bootstrap = argv[++i];
        else if (strcmp(argv[i], "--topic") == 0)
            topic = argv[++i];
        else if (strcmp(argv[i], "--set") == 0 && nsets < MAX_SETS)
            sets[nsets++] = argv[++i];
        else {
            usage(stderr);
            return 2;
        }
    }
    if (bootstrap == NULL || topic == NULL) {
        usage(stderr);
        return 2;
    }

    char kerr[512];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    conf_set(kc, "bootstrap.servers", bootstrap);
    conf_set(kc, "group.id", "bench-rawconsume");
    conf_set(kc, "enable.auto.commit", "false");
    conf_set(kc, "fetch.wait.max.ms", "5"); /* as freshet's consumer */
    conf_set(kc, "fetch.max.bytes", "2097152");
    for (int i = 0; i < nsets; i++) {
        char kv[512];
        snprintf(kv, sizeof(kv), "%s", sets[i]);
        char *eq = strchr(kv, '=');
        if (eq == NULL)
            die("--set wants KEY=VALUE");
        *eq = '\0';
        conf_set(kc, kv, eq + 1);
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, kerr, sizeof(kerr));
    if (rk == NULL)
        die(kerr);
    rd_kafka_poll_set_consumer(rk);

    /* the partitions and their logs */
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    const struct rd_kafka_metadata *md = NULL;
    if (rkt == NULL || rd_kafka_metadata(rk, 0, rkt, &md, QUERY_MS) != RD_KAFKA_RESP_ERR_NO_ERROR ||
        md->topic_cnt != 1 || md->topics[0].partition_cnt <= 0)
        die("no metadata for the topic");
    int nparts = md->topics[0].partition_cnt;
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(nparts);
    int64_t want = 0;
    for (int p = 0; p < nparts; p++) {
        int32_t id = md->topics[0].partitions[p].id;
        int64_t lo = 0, hi = 0;
        if (rd_kafka_query_watermark_offsets(rk, topic, id, &lo, &hi, QUERY_MS) !=
            RD_KAFKA_RESP_ERR_NO_ERROR)
            die("watermarks unknown");
        want += hi - lo;
        rd_kafka_topic_partition_list_add(parts, topic, id)->offset = lo;
    }
    rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    if (rd_kafka_assign(rk, parts) != RD_KAFKA_RESP_ERR_NO_ERROR)
        die("assign failed");
    rd_kafka_topic_partition_list_destroy(parts);

    int64_t count = 0;
    uint64_t bytes = 0, touch = 0;
    double t_first = 0, t_last = 0, deadline = now_s() + WAIT_S;
    while (count < want && now_s() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 500);
        if (m == NULL)
            continue;
        if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
            double t = now_s();
            if (count == 0)
                t_first = t;
            t_last = t;
            count++;
            bytes += m->len;
            const unsigned char *q = m->payload;
            for (size_t i = 0; i < m->len; i += CACHE_LINE)
                touch += q[i];
        } else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            fprintf(stderr, "bench_rawconsume: %s\n", rd_kafka_message_errstr(m));
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    if (count < want || t_last <= t_first) {
        fprintf(stderr, "bench_rawconsume: read %lld of %lld records\n", (long long)count,
                (long long)want);
        return 1;
    }
    double s = t_last - t_first;
    printf("records %lld bytes %llu seconds %.3f records_per_s %.0f mb_per_s %.1f (touch %llu)\n",
           (long long)count, (unsigned long long)bytes, s, (double)count / s,
           (double)bytes / s / 1e6, (unsigned long long)(touch & 0xff));
    return 0;
}
