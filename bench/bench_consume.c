/*
 * bench_consume.c - the Kafka consumer's decode + batch throughput against a
 * raw librdkafka consume loop over the same messages in the same run.
 *
 * Starts its own redis-server (the consumer reads the store's offsets) and
 * an in-process dev broker (librdkafka's mock cluster), then for f32 and csv
 * records of 784 features (softmax, 10 classes):
 *   produce   the records once with ingest_producer into a topic of
 *             PARTITIONS partitions, each kept under ~4 MiB so that the
 *             mock cluster (at most 5 MiB a partition) keeps them all, and
 *             checks every partition's log runs from 0 to its count;
 *   baseline  a raw librdkafka consumer assigned every partition at offset
 *             0, the log start checked above (assign, not subscribe: no
 *             group join; an explicit offset, as freshet's assignment
 *             has, rather than BEGINNING's lookup) polls until
 *             it has every message, touching each payload;
 *   freshet   an ingest_consumer (group join, store offsets, batch 64)
 *             decodes them into batches, taken by ingest_consumer_next.
 * Both are timed from their first message (batch) to their last, so the
 * join and assignment are excluded. Every sample carries its record number
 * as feature 0, so each is checked: seen once, label and last feature
 * exact, and every feature of the first batch exact; counts must match.
 * A third workload, csv-int, has integer features 0..255 ("37"); the csv
 * one has 9-digit fractions ("%.9g"). For the csv workloads each round
 * also runs freshet's consumer with decode_threads 0 ("alone": the poll
 * thread decodes every record itself), alternating which of the two goes
 * first, so decoding ahead is measured against decoding alone in the same
 * run. Prints records/s, MB/s of payload, freshet's ratio to raw and, for
 * csv, to alone (the median round's rates, the median of the rounds'
 * ratios, with every round's ratios above the table). Exits 1 when a
 * check fails.
 *
 * usage: [DECODE_THREADS=N] bench_consume [ROUNDS]   (default 3; the median is printed)
 *        DECODE_THREADS is the consumer's [ingest] decode_threads (default -1,
 *        freshet's default: 1 helper on 2 or more cores; 0: none)
 */
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../tests/integration/harness.h"
#include "bench_records.h"
#include "common/common.h"
#include "ingest/ingest.h"

#define FEATURES    BENCH_FEATURES
#define PARTITIONS  48
#define MAX_PER     1000               /* records a partition at most      */
#define PART_BUDGET (4u * 1024 * 1024) /* payload bytes a partition at most */
#define BATCH       64
#define WAIT_S      60.0
#define MAX_ROUNDS  9
#define NLOADS      3

static int decode_threads = -1; /* [ingest] decode_threads; DECODE_THREADS, -1: the default */

static const char *const group_props[][2] = {
    {"session.timeout.ms", "6000"},
    {"heartbeat.interval.ms", "500"},
};

typedef struct run {
    double rate;  /* records per second */
    double mbps;  /* payload MB per second */
    double wall;  /* seconds timed */
    double cores; /* CPU time of this process (broker included) over wall */
} run_t;

typedef struct workload {
    ingest_format_t format;
    int ints;         /* features 1.. are integers 0..255 rather than [0, 1) */
    const char *name; /* in the table */
    const char *topic;
    int per_part;   /* records per partition */
    size_t n;       /* records in all */
    uint64_t bytes; /* payload bytes in all */
    size_t max_len; /* the longest record */
} workload_t;

static const char *bootstrap;
static harness_redis_t redis;
static int failed;

static void die(const char *what)
{
    fprintf(stderr, "bench_consume: %s\n", what);
    exit(1);
}

static double now_s(void)
{
    return (double)fr_clock_mono_ns() * 1e-9;
}

/* CPU seconds of this process: every thread, the dev broker's included. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t encode(ingest_format_t format, int ints, uint64_t id, char *buf, size_t cap)
{
    float x[FEATURES];
    for (int j = 0; j < FEATURES; j++)
        x[j] = bench_feature(ints, id, j);
    return ingest_encode(format, x, FEATURES, bench_label(id), buf, cap);
}

/* ------------------------------------------------------------------------
 * Producing.
 * ---------------------------------------------------------------------- */

/*
 * Sizes the workload (records per partition: a multiple of 8, so that the
 * total is a multiple of the batch and no linger ends the run), creates its
 * topic and produces it: partition p holds records p * per_part .. in order.
 */
static void produce(ingest_broker_t *broker, workload_t *w)
{
    char errstr[512];
    static char buf[64 * 1024];
    size_t sample = 0;
    for (uint64_t id = 0; id < 64; id++)
        sample += encode(w->format, w->ints, id * 997, buf, sizeof(buf));
    double est = (double)sample / 64.0 * 1.05;
    int per = (int)((double)PART_BUDGET / est) / 8 * 8;
    w->per_part = per < MAX_PER ? per : MAX_PER;
    w->n = (size_t)w->per_part * PARTITIONS;
    w->bytes = 0;
    w->max_len = 0;
    if (ingest_broker_topic(broker, w->topic, PARTITIONS, errstr, sizeof(errstr)) != FR_OK)
        die(errstr);
    static const char *const props[][2] = {{"linger.ms", "5"}, {"batch.size", "1000000"}};
    ingest_producer_t *p = ingest_producer_new(bootstrap, props, 2, errstr, sizeof(errstr));
    if (p == NULL)
        die(errstr);
    for (int part = 0; part < PARTITIONS; part++) {
        uint64_t part_bytes = 0;
        for (int k = 0; k < w->per_part; k++) {
            uint64_t id = (uint64_t)part * (uint64_t)w->per_part + (uint64_t)k;
            size_t len = encode(w->format, w->ints, id, buf, sizeof(buf));
            if (len == 0)
                die("encode failed");
            if (ingest_producer_send(p, w->topic, part, NULL, 0, buf, len, NULL, NULL) != FR_OK)
                die(ingest_producer_error(p));
            part_bytes += len;
            if (len > w->max_len)
                w->max_len = len;
        }
        if (part_bytes > PART_BUDGET + PART_BUDGET / 8)
            die("a partition outgrew its budget");
        w->bytes += part_bytes;
    }
    uint64_t delivered = 0, fails = 0;
    if (ingest_producer_flush(p, 60000, &delivered, &fails) != FR_OK || delivered != w->n ||
        fails != 0) {
        fprintf(stderr, "bench_consume: %s: delivered %llu of %zu, %llu failed: %s\n", w->topic,
                (unsigned long long)delivered, w->n, (unsigned long long)fails,
                ingest_producer_error(p));
        exit(1);
    }
    ingest_producer_destroy(p);
}

/* ------------------------------------------------------------------------
 * The baseline: raw librdkafka.
 * ---------------------------------------------------------------------- */

static rd_kafka_t *raw_new(const char *group)
{
    char kerr[512];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    if (rd_kafka_conf_set(kc, "bootstrap.servers", bootstrap, kerr, sizeof(kerr)) ||
        rd_kafka_conf_set(kc, "group.id", group, kerr, sizeof(kerr)) ||
        rd_kafka_conf_set(kc, "auto.offset.reset", "earliest", kerr, sizeof(kerr)) ||
        rd_kafka_conf_set(kc, "enable.auto.commit", "false", kerr, sizeof(kerr)) ||
        /* the fetch settings freshet's consumer uses (ingest/consumer.c):
         * librdkafka's 50 MiB fetches made the baseline, not freshet, the
         * slow side */
        rd_kafka_conf_set(kc, "fetch.max.bytes", "2097152", kerr, sizeof(kerr)) ||
        rd_kafka_conf_set(kc, "fetch.wait.max.ms", "5", kerr, sizeof(kerr)))
        die(kerr);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, kerr, sizeof(kerr));
    if (rk == NULL)
        die(kerr);
    rd_kafka_poll_set_consumer(rk);
    return rk;
}

/* Every partition's log must run from 0 to per_part: nothing was dropped. */
static void check_logs(const workload_t *w)
{
    rd_kafka_t *rk = raw_new("bench-watermarks");
    for (int p = 0; p < PARTITIONS; p++) {
        int64_t lo = -1, hi = -1;
        rd_kafka_resp_err_t kerr =
            rd_kafka_query_watermark_offsets(rk, w->topic, p, &lo, &hi, 10000);
        if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR || lo != 0 || hi != w->per_part) {
            fprintf(stderr, "bench_consume: %s/%d holds [%lld, %lld), want [0, %d): %s\n", w->topic,
                    p, (long long)lo, (long long)hi, w->per_part, rd_kafka_err2str(kerr));
            exit(1);
        }
    }
    rd_kafka_destroy(rk);
}

static run_t raw_run(const workload_t *w, int round)
{
    char group[64];
    snprintf(group, sizeof(group), "bench-raw-%s-%d-%d", w->topic, (int)getpid(), round);
    rd_kafka_t *rk = raw_new(group);
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(PARTITIONS);
    for (int p = 0; p < PARTITIONS; p++)
        rd_kafka_topic_partition_list_add(parts, w->topic, p)->offset = 0;
    if (rd_kafka_assign(rk, parts) != RD_KAFKA_RESP_ERR_NO_ERROR)
        die("assign failed");
    rd_kafka_topic_partition_list_destroy(parts);

    size_t count = 0, per[PARTITIONS] = {0};
    uint64_t bytes = 0, touch = 0;
    double t_first = 0, t_last = 0, c_first = 0, c_last = 0, deadline = now_s() + WAIT_S;
    while (count < w->n && now_s() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 500);
        if (m == NULL)
            continue;
        if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                fprintf(stderr, "bench_consume: raw: %s\n", rd_kafka_message_errstr(m));
            rd_kafka_message_destroy(m);
            continue;
        }
        double t = now_s(), c = cpu_s();
        if (count == 0) {
            t_first = t;
            c_first = c;
        }
        t_last = t;
        c_last = c;
        count++;
        bytes += m->len;
        if (m->len > 0)
            touch += (uint64_t)((const unsigned char *)m->payload)[0] +
                     ((const unsigned char *)m->payload)[m->len - 1];
        if (m->partition >= 0 && m->partition < PARTITIONS)
            per[m->partition]++;
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);

    int bad = count != w->n || bytes != w->bytes || touch == 0;
    for (int p = 0; p < PARTITIONS; p++)
        bad |= per[p] != (size_t)w->per_part;
    if (bad) {
        fprintf(stderr, "bench_consume: raw %s: %zu of %zu records, %llu of %llu bytes\n", w->topic,
                count, w->n, (unsigned long long)bytes, (unsigned long long)w->bytes);
        failed = 1;
    }
    run_t r = {0};
    r.wall = t_last - t_first;
    if (r.wall > 0) {
        /* the first message only starts the clock */
        r.rate = (double)(count - 1) / r.wall;
        r.mbps = r.rate * ((double)w->bytes / (double)w->n) / 1e6;
        r.cores = (c_last - c_first) / r.wall;
    }
    return r;
}

/* ------------------------------------------------------------------------
 * freshet: ingest_consumer.
 * ---------------------------------------------------------------------- */

/* Checks one batch's samples (each record number seen once, label and
 * last feature exact; every feature when full); -1 on a mismatch. */
static int check_batch(const workload_t *w, const ingest_batch_t *b, unsigned char *seen, int full)
{
    if (b->features != FEATURES)
        return -1;
    for (size_t i = 0; i < b->n; i++) {
        const float *x = b->x + i * FEATURES;
        float f = x[0];
        if (!(f >= 0.0f && f < (float)w->n) || f != floorf(f))
            return -1;
        uint64_t id = (uint64_t)f;
        if (seen[id]++ != 0 || b->y[i] != bench_label(id) ||
            x[FEATURES - 1] != bench_feature(w->ints, id, FEATURES - 1))
            return -1;
        for (int j = 1; full && j < FEATURES; j++)
            if (x[j] != bench_feature(w->ints, id, j))
                return -1;
    }
    return 0;
}

static run_t freshet_run(const workload_t *w, int round, int threads)
{
    char errstr[512], group[80], model[64];
    snprintf(group, sizeof(group), "bench-freshet-%s-%d-%d-%d", w->topic, (int)getpid(), round,
             threads + 1);
    snprintf(model, sizeof(model), "bench%s%d%d-%d", ingest_format_name(w->format), w->ints, round,
             threads + 1);
    ingest_consumer_conf_t conf = {
        .bootstrap = bootstrap,
        .props = group_props,
        .nprops = sizeof(group_props) / sizeof(group_props[0]),
        .topic = w->topic,
        .group_id = group,
        .redis_url = redis.url,
        .model = model,
        .schema = {.features = FEATURES, .label = INGEST_LABEL_CLASS, .classes = BENCH_CLASSES},
        .format = w->format,
        .batch = BATCH,
        .queue = 4096,
        .linger_ms = 50,
        .decode_threads = threads,
    };
    ingest_consumer_t *c = ingest_consumer_new(&conf, errstr, sizeof(errstr));
    if (c == NULL)
        die(errstr);
    unsigned char *seen = calloc(w->n, 1);
    if (seen == NULL)
        die("out of memory");
    if (ingest_consumer_start(c) != FR_OK)
        die("consumer start failed");

    size_t samples = 0, first_n = 0, empty = 0, batches = 0;
    int bad = 0;
    double t_first = 0, t_last = 0, c_first = 0, c_last = 0, deadline = now_s() + WAIT_S;
    while (samples < w->n && now_s() < deadline) {
        ingest_batch_t *b = ingest_consumer_next(c, 1000);
        if (b == NULL)
            continue;
        if (b->n == 0) {
            empty++;
            ingest_batch_destroy(b);
            continue;
        }
        double t = now_s(), cpu = cpu_s();
        if (batches == 0) {
            t_first = t;
            c_first = cpu;
            first_n = b->n;
        }
        t_last = t;
        c_last = cpu;
        if (check_batch(w, b, seen, batches == 0) != 0 && !bad++)
            fprintf(stderr, "bench_consume: freshet %s: a sample does not match its record\n",
                    w->topic);
        batches++;
        samples += b->n;
        ingest_batch_destroy(b);
    }
    ingest_consumer_stats_t st;
    ingest_consumer_stats(c, &st);
    ingest_consumer_destroy(c);
    free(seen);

    uint64_t rejected = 0;
    for (int r = 0; r < INGEST_REJECT_COUNT; r++)
        rejected += st.rejected[r];
    if (bad || samples != w->n || rejected != 0 || st.consumed != w->n) {
        fprintf(
            stderr, "bench_consume: freshet %s: %zu of %zu samples, %llu consumed, %llu rejected\n",
            w->topic, samples, w->n, (unsigned long long)st.consumed, (unsigned long long)rejected);
        failed = 1;
    }
    if (round == 0 && threads == decode_threads) /* the measured consumer's, once */
        printf(" [freshet: %zu batches, %zu empty, %llu pauses, %llu fetch wakeups, %d partitions, "
               "%llu decoded by helpers]",
               batches, empty, (unsigned long long)st.pauses, (unsigned long long)st.fetch_wakeups,
               st.assigned, (unsigned long long)st.decoded_ahead);
    run_t r = {0};
    r.wall = t_last - t_first;
    if (r.wall > 0) {
        /* the first batch only starts the clock */
        r.rate = (double)(samples - first_n) / r.wall;
        r.mbps = r.rate * ((double)w->bytes / (double)w->n) / 1e6;
        r.cores = (c_last - c_first) / r.wall;
    }
    return r;
}

/* ------------------------------------------------------------------------
 * Main.
 * ---------------------------------------------------------------------- */

static int cmp_run(const void *a, const void *b)
{
    double x = ((const run_t *)a)->rate, y = ((const run_t *)b)->rate;
    return (x > y) - (x < y);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of n ratios (sorted in place). */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return v[n / 2];
}

int main(int argc, char **argv)
{
    fr_mem_keep(); /* as freshet's main does */
    int rounds = argc > 1 ? atoi(argv[1]) : 3;
    const char *dt = getenv("DECODE_THREADS");
    decode_threads = dt != NULL && dt[0] != '\0' ? atoi(dt) : -1;
    if (rounds < 1 || rounds > MAX_ROUNDS)
        die("ROUNDS must be 1..9");
    fr_log_set_level(FR_LOG_WARN);
    char errstr[512];
    if (harness_redis_start(&redis, NULL) != 0)
        return 1;
    ingest_broker_t *broker = ingest_broker_new(1, errstr, sizeof(errstr));
    if (broker == NULL)
        die(errstr);
    bootstrap = ingest_broker_bootstraps(broker);

    workload_t loads[NLOADS] = {
        {.format = INGEST_FORMAT_F32, .name = "f32", .topic = "bench-f32"},
        {.format = INGEST_FORMAT_CSV, .name = "csv", .topic = "bench-csv"},
        {.format = INGEST_FORMAT_CSV, .ints = 1, .name = "csv-int", .topic = "bench-csv-int"}};
    run_t raw[NLOADS][MAX_ROUNDS], fr[NLOADS][MAX_ROUNDS], alone[NLOADS][MAX_ROUNDS];
    double to_raw[NLOADS][MAX_ROUNDS], to_alone[NLOADS][MAX_ROUNDS];
    printf("bench_consume: %d features, batch %d, %d partitions, in-process mock broker, "
           "median of %d round(s), decode_threads %d%s\n",
           FEATURES, BATCH, PARTITIONS, rounds, decode_threads,
           decode_threads < 0 ? " (the default)" : "");
    for (int i = 0; i < NLOADS; i++) {
        double t0 = now_s();
        produce(broker, &loads[i]);
        check_logs(&loads[i]);
        printf("  (%s: produced %zu records, %.1f MB, in %.1f s)\n", loads[i].topic, loads[i].n,
               (double)loads[i].bytes / 1e6, now_s() - t0);
        fflush(stdout);
        /* alternate, so that drift hits all alike */
        int text = loads[i].format != INGEST_FORMAT_F32;
        printf("  (%s ratio by round, to raw%s:", loads[i].name, text ? " / to alone" : "");
        for (int k = 0; k < rounds; k++) {
            raw[i][k] = raw_run(&loads[i], k);
            if (text && k % 2 == 1)
                alone[i][k] = freshet_run(&loads[i], k, 0);
            fr[i][k] = freshet_run(&loads[i], k, decode_threads);
            if (text && k % 2 == 0)
                alone[i][k] = freshet_run(&loads[i], k, 0);
            to_raw[i][k] = raw[i][k].rate > 0 ? fr[i][k].rate / raw[i][k].rate : 0.0;
            printf(" %.2f", to_raw[i][k]);
            if (text) {
                to_alone[i][k] = alone[i][k].rate > 0 ? fr[i][k].rate / alone[i][k].rate : 0.0;
                printf(" / %.2f", to_alone[i][k]);
            }
            fflush(stdout);
        }
        printf(")\n");
        qsort(raw[i], (size_t)rounds, sizeof(run_t), cmp_run);
        qsort(fr[i], (size_t)rounds, sizeof(run_t), cmp_run);
        if (text)
            qsort(alone[i], (size_t)rounds, sizeof(run_t), cmp_run);
    }

    printf("  %-7s %8s %8s %14s %9s %6s %14s %9s %6s %7s %12s %8s\n", "format", "records", "bytes",
           "raw rec/s", "MB/s", "cores", "freshet rec/s", "MB/s", "cores", "ratio", "alone rec/s",
           "/alone");
    for (int i = 0; i < NLOADS; i++) {
        const workload_t *w = &loads[i];
        const run_t *r = &raw[i][rounds / 2], *f = &fr[i][rounds / 2];
        double rec_bytes = (double)w->bytes / (double)w->n;
        printf("  %-7s %8zu %8.0f %14.0f %9.1f %6.2f %14.0f %9.1f %6.2f %7.2f", w->name, w->n,
               rec_bytes, r->rate, r->mbps, r->cores, f->rate, f->mbps, f->cores,
               median(to_raw[i], rounds));
        if (w->format != INGEST_FORMAT_F32)
            printf(" %12.0f %8.2f\n", alone[i][rounds / 2].rate, median(to_alone[i], rounds));
        else
            printf(" %12s %8s\n", "-", "-");
    }
    ingest_broker_destroy(broker);
    harness_redis_stop(&redis);
    if (failed) {
        fprintf(stderr, "bench_consume: validation failed; figures refused\n");
        return 1;
    }
    return 0;
}
