/*
 * test_consumer.c - the Kafka consumer against the dev broker (a separate
 * "freshet broker" process) and a real redis-server: records produced by
 * kcat arrive exactly once, in partition order, with position ranges that
 * cover every offset; bad records are counted and dead-lettered; partitions
 * start where the store says and skip its applied intervals; Kafka's
 * committed offsets follow the store's watermark; a full queue pauses the
 * partitions without losing anything.
 *
 * Records are f32 samples of 3 features whose label is g = partition *
 * 10000 + offset, so every sample says where it came from; its features
 * are a function of g and are checked exactly. Two tests write the same
 * samples as csv and decode them ahead, on helper threads.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <librdkafka/rdkafka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "harness.h"
#include "ingest/consumer_int.h" /* ingest_consumer_hold_for_test */
#include "ingest/ingest.h"

#define D        3
#define MAXPART  4
#define MAXOFF   1000
#define WAIT_MS  60000
#define REC_SIZE (4 * (D + 1))
#define REC_CAP  128 /* a record's bytes at most, csv included */

static harness_broker_t broker;
static harness_redis_t redis;
/* how records are written and read: f32, decoded on the poll thread,
 * unless a csv test says otherwise for its duration */
static ingest_format_t rec_format = INGEST_FORMAT_F32;
static int decode_threads = 0;
/* the next consumer's ingest_consumer_hold_for_test offset in partition 0
 * (-1: none) */
static int64_t hold_at = -1;
static char tmp_dir[256];

/* The consumer properties every test uses (the dev broker's group timing). */
static const char *const test_props[][2] = {
    {"session.timeout.ms", "6000"},
    {"heartbeat.interval.ms", "500"},
};

/* ------------------------------------------------------------------------
 * Records.
 * ---------------------------------------------------------------------- */

typedef enum kind { GOOD, GARBAGE, SHORT, NAN_FEATURE, POISON } kind_t;

static void features_of(int64_t g, float *x)
{
    x[0] = (float)g * 0.5f;
    x[1] = -(float)g;
    x[2] = (float)g / 7.0f;
}

/* Writes the record of kind for (partition, offset) into buf; its length. */
static size_t make_record(kind_t kind, int32_t partition, int64_t offset, char *buf)
{
    float v[D + 1];
    int64_t g = (int64_t)partition * 10000 + offset;
    v[0] = (float)g;
    features_of(g, v + 1);
    if (rec_format == INGEST_FORMAT_CSV) { /* "label,x0,x1,x2" */
        switch (kind) {
        case GARBAGE: memcpy(buf, "garbage!!", 9); return 9; /* bad_number */
        case SHORT: return ingest_encode(INGEST_FORMAT_CSV, v + 1, D - 1, v[0], buf, REC_CAP);
        case NAN_FEATURE: v[2] = NAN; break;
        case POISON: v[1] = v[2] = v[3] = 3e38f; break;
        case GOOD: break;
        }
        return ingest_encode(INGEST_FORMAT_CSV, v + 1, D, v[0], buf, REC_CAP);
    }
    switch (kind) {
    case GARBAGE: memcpy(buf, "garbage!!", 9); return 9;
    case SHORT: memcpy(buf, v, 4 * D); return 4 * D;
    case NAN_FEATURE: v[2] = NAN; break;
    case POISON: v[1] = v[2] = v[3] = 3e38f; break; /* finite: it overflows a gradient */
    case GOOD: break;
    }
    memcpy(buf, v, sizeof(v));
    return sizeof(v);
}

/*
 * Produces kinds[n] records to one partition of topic with kcat, each from
 * its own file (kcat sends a file as one message), in order, so the k-th
 * record gets offset first + k.
 */
static void produce(const char *topic, int32_t partition, int64_t first, const kind_t *kinds,
                    size_t n)
{
    size_t cap = 256 + n * 300;
    char *cmd = malloc(cap);
    assert_non_null(cmd);
    size_t len = (size_t)snprintf(cmd, cap, "kcat -P -b %s -t %s -p %d", broker.bootstrap, topic,
                                  (int)partition);
    for (size_t k = 0; k < n; k++) {
        char path[300], rec[REC_CAP];
        snprintf(path, sizeof(path), "%s/%s-%d-%zu.rec", tmp_dir, topic, (int)partition, k);
        size_t rlen = make_record(kinds[k], partition, first + (int64_t)k, rec);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(rec, 1, rlen, f), rlen);
        assert_int_equal(fclose(f), 0);
        len += (size_t)snprintf(cmd + len, cap - len, " %s", path);
    }
    if (system(cmd) != 0)
        fail_msg("kcat failed: %.200s", cmd);
    free(cmd);
}

/* Produces n good records to a partition. */
static void produce_good(const char *topic, int32_t partition, size_t n)
{
    kind_t *kinds = calloc(n, sizeof(*kinds));
    assert_non_null(kinds);
    produce(topic, partition, 0, kinds, n);
    free(kinds);
}

/* ------------------------------------------------------------------------
 * Collecting batches.
 * ---------------------------------------------------------------------- */

typedef struct collected {
    int nparts;
    const char *topic;
    int64_t ranges[MAXPART][MAXOFF][2]; /* per partition, in delivery order */
    size_t nranges[MAXPART];
    int seen[MAXPART][MAXOFF]; /* times each offset was a sample */
    int64_t last[MAXPART];     /* last sample offset, -1: none */
    int64_t covered[MAXPART];  /* the highest range end */
    size_t batches, empty;
    char first_reason[MAXPART][32]; /* reason of the first n = 0 batch per partition */
    /* where a partition restarts when it is assigned again (the store's
     * watermark; -1: never): a member that held it at an earlier
     * rebalance of the same join may have queued its records already */
    int64_t restart_at[MAXPART];
    /* an earlier watermark of the partition (-1: none): a member may still
     * hold batches queued at a rebalance before the last one, which start
     * there */
    int64_t restart_also[MAXPART];
    int restarts[MAXPART];
} collected_t;

static collected_t *collected_new(const char *topic, int nparts)
{
    collected_t *col = calloc(1, sizeof(*col));
    assert_non_null(col);
    col->topic = topic;
    col->nparts = nparts;
    for (int p = 0; p < MAXPART; p++) {
        col->last[p] = -1;
        col->restart_at[p] = -1;
        col->restart_also[p] = -1;
    }
    return col;
}

/* Forgets what partition p delivered: it starts again at the watermark,
 * and the earlier delivery is what the applier drops as duplicates. */
static void collected_restart(collected_t *col, int32_t p)
{
    col->nranges[p] = 0;
    col->covered[p] = 0;
    col->last[p] = -1;
    memset(col->seen[p], 0, sizeof(col->seen[p]));
    col->restarts[p]++;
}

/* Checks one batch against the encoding and records its ranges. */
static void collect_batch(collected_t *col, const ingest_batch_t *b, size_t batch)
{
    assert_true(b->n <= batch);
    assert_true(b->nranges > 0);
    col->batches++;
    for (size_t r = 0; r < b->nranges; r++) {
        const ingest_range_t *rg = &b->ranges[r];
        assert_string_equal(rg->topic, col->topic);
        assert_true(rg->partition >= 0 && rg->partition < col->nparts);
        assert_true(rg->from < rg->to && rg->to <= MAXOFF);
        if ((rg->from == col->restart_at[rg->partition] ||
             rg->from == col->restart_also[rg->partition]) &&
            col->covered[rg->partition] > rg->from)
            collected_restart(col, rg->partition);
        size_t *nr = &col->nranges[rg->partition];
        assert_true(*nr < MAXOFF);
        col->ranges[rg->partition][*nr][0] = rg->from;
        col->ranges[rg->partition][*nr][1] = rg->to;
        (*nr)++;
        if (rg->to > col->covered[rg->partition])
            col->covered[rg->partition] = rg->to;
        if (b->n == 0 && col->first_reason[rg->partition][0] == '\0')
            snprintf(col->first_reason[rg->partition], 32, "%s", b->reason);
    }
    if (b->n == 0) {
        col->empty++;
        assert_true(b->reason[0] != '\0');
    }
    for (size_t i = 0; i < b->n; i++) {
        float y = b->y[i], x[D];
        int64_t g = (int64_t)y;
        assert_true((float)g == y);
        int32_t p = (int32_t)(g / 10000);
        int64_t o = g % 10000;
        assert_true(p >= 0 && p < col->nparts && o < MAXOFF);
        features_of(g, x);
        assert_memory_equal(&b->x[i * D], x, sizeof(x));
        /* inside one of the batch's ranges of its partition */
        int inside = 0;
        for (size_t r = 0; r < b->nranges; r++)
            inside |= b->ranges[r].partition == p && o >= b->ranges[r].from && o < b->ranges[r].to;
        if (!inside)
            fail_msg("sample %d/%lld outside its batch's ranges", (int)p, (long long)o);
        if (o <= col->last[p])
            fail_msg("partition %d: sample %lld after %lld", (int)p, (long long)o,
                     (long long)col->last[p]);
        col->last[p] = o;
        col->seen[p][o]++;
    }
}

/* Takes batches from any of cs[ncs] until every partition p is covered up
 * to end[p]. */
static void collect_from(ingest_consumer_t **cs, int ncs, collected_t *col, const int64_t *end,
                         size_t batch)
{
    int64_t deadline = fr_clock_unix_ms() + WAIT_MS;
    for (;;) {
        int done = 1;
        for (int p = 0; p < col->nparts; p++)
            done &= col->covered[p] >= end[p];
        if (done)
            return;
        if (fr_clock_unix_ms() > deadline) {
            for (int p = 0; p < col->nparts; p++)
                fprintf(stderr, "partition %d covered to %lld of %lld\n", p,
                        (long long)col->covered[p], (long long)end[p]);
            fail_msg("timed out waiting for batches");
        }
        for (int k = 0; k < ncs; k++) {
            ingest_batch_t *b = ingest_consumer_next(cs[k], 500 / ncs);
            if (b != NULL) {
                collect_batch(col, b, batch);
                ingest_batch_destroy(b);
            }
        }
    }
}

static void collect_until(ingest_consumer_t *c, collected_t *col, const int64_t *end, size_t batch)
{
    collect_from(&c, 1, col, end, batch);
}

/*
 * Checks a partition's ranges: contiguous from `from` to `end` in delivery
 * order, no overlap, the only hole being [gap_from, gap_to) (none when
 * gap_from == gap_to).
 */
static void check_ranges(const collected_t *col, int32_t p, int64_t from, int64_t end,
                         int64_t gap_from, int64_t gap_to)
{
    int64_t at = from;
    assert_true(col->nranges[p] > 0);
    for (size_t r = 0; r < col->nranges[p]; r++) {
        int64_t a = col->ranges[p][r][0], b = col->ranges[p][r][1];
        if (a != at && !(at == gap_from && a == gap_to))
            fail_msg("partition %d: range %zu is [%lld,%lld), expected to start at %lld", (int)p, r,
                     (long long)a, (long long)b, (long long)at);
        at = b;
    }
    assert_int_equal(at, end);
}

/* Collects from c until partitions 0..nparts-1 of topic are covered to
 * per, then checks that each came in contiguous ranges from 0, that every
 * good record (kinds[p * per + o] == GOOD) was a sample exactly once and
 * no other was, and that all nparts x per records were consumed; *st
 * receives the consumer's counters. The collection, for the caller to
 * free. */
static collected_t *collect_checked(ingest_consumer_t *c, const char *topic, int nparts, int per,
                                    const kind_t *kinds, ingest_consumer_stats_t *st)
{
    collected_t *col = collected_new(topic, nparts);
    int64_t end[MAXPART];
    for (int p = 0; p < nparts; p++)
        end[p] = per;
    collect_until(c, col, end, 16);
    for (int p = 0; p < nparts; p++) {
        check_ranges(col, p, 0, per, 0, 0);
        for (int o = 0; o < per; o++)
            if (col->seen[p][o] != (kinds[p * per + o] == GOOD))
                fail_msg("partition %d offset %d seen %d times", p, o, col->seen[p][o]);
    }
    ingest_consumer_stats(c, st);
    assert_int_equal(st->consumed, (uint64_t)nparts * (uint64_t)per);
    return col;
}

/* A started consumer of librdkafka properties props[nprops]. */
static ingest_consumer_t *consumer_new_props(const char *topic, const char *model, int batch,
                                             int queue, int start_latest, const char *dlt,
                                             fr_metrics_t *reg, const char *const (*props)[2],
                                             size_t nprops)
{
    char errstr[512];
    ingest_consumer_conf_t conf = {
        .bootstrap = broker.bootstrap,
        .props = props,
        .nprops = nprops,
        .topic = topic,
        .redis_url = redis.url,
        .model = model,
        .schema = {.features = D, .label = INGEST_LABEL_REAL, .max_abs = 1e6f},
        .format = rec_format,
        .decode_threads = decode_threads,
        .batch = batch,
        .queue = queue,
        .linger_ms = 200,
        .start_latest = start_latest,
        .dead_letter_topic = dlt,
        .metrics = reg,
    };
    ingest_consumer_t *c = ingest_consumer_new(&conf, errstr, sizeof(errstr));
    if (c == NULL)
        fail_msg("ingest_consumer_new: %s", errstr);
    if (hold_at >= 0)
        ingest_consumer_hold_for_test(c, 0, hold_at);
    assert_int_equal(ingest_consumer_start(c), FR_OK);
    return c;
}

/* A started consumer of the tests' properties. */
static ingest_consumer_t *consumer_new(const char *topic, const char *model, int batch, int queue,
                                       int start_latest, const char *dlt, fr_metrics_t *reg)
{
    return consumer_new_props(topic, model, batch, queue, start_latest, dlt, reg, test_props,
                              sizeof(test_props) / sizeof(test_props[0]));
}

/* ------------------------------------------------------------------------
 * Tests.
 * ---------------------------------------------------------------------- */

/* 300 records over 3 partitions, some of them bad. */
static void test_records_arrive_once_in_order_and_bad_ones_are_dead_lettered(void **state)
{
    (void)state;
    enum { PER = 100 };
    kind_t kinds[3][PER] = {{GOOD}};
    /* bad records in the middle and at the very end of partitions */
    kinds[0][10] = GARBAGE;
    kinds[0][11] = SHORT;
    kinds[1][50] = NAN_FEATURE;
    kinds[1][PER - 1] = GARBAGE;
    kinds[2][0] = SHORT;
    kinds[2][PER - 1] = NAN_FEATURE;
    kinds[0][40] = POISON;
    kinds[2][50] = POISON;
    for (int p = 0; p < 3; p++)
        produce("c1", p, 0, kinds[p], PER);

    fr_metrics_t *reg = fr_metrics_new();
    assert_non_null(reg);
    ingest_consumer_t *c = consumer_new("c1", "m1", 16, 8, 0, "c1dlq", reg);
    ingest_consumer_stats_t st;
    collected_t *col = collect_checked(c, "c1", 3, PER, &kinds[0][0], &st);
    assert_int_equal(st.rejected[INGEST_REJECT_FEATURE_COUNT], 4);
    assert_int_equal(st.rejected[INGEST_REJECT_NONFINITE], 2);
    assert_int_equal(st.rejected[INGEST_REJECT_MAGNITUDE], 2);
    assert_int_equal(st.dead_letters, 8);
    assert_int_equal(st.fetch_wakeups, 0); /* the queue never came near librdkafka's limits */
    char *text = fr_metrics_render(reg, NULL);
    assert_non_null(text);
    assert_non_null(strstr(text, "freshet_ingest_records_consumed_total{topic=\"c1\"} 300"));
    assert_non_null(
        strstr(text, "freshet_ingest_records_rejected_total{topic=\"c1\",reason=\"nonfinite\"} 2"));
    assert_non_null(
        strstr(text, "freshet_ingest_records_rejected_total{topic=\"c1\",reason=\"magnitude\"} 2"));
    free(text);
    ingest_consumer_destroy(c); /* flushes the dead letters */
    fr_metrics_destroy(reg);
    free(col);

    /* the dead letters, read back by kcat: reason header and payload size */
    char cmd[1024], line[256];
    snprintf(cmd, sizeof(cmd),
             "kcat -C -b %s -t c1dlq -e -o beginning -q -f '%%h %%S\\n' | sort | uniq -c",
             broker.bootstrap);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    int garbage = 0, shortrec = 0, nan = 0, poison = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        int count = atoi(line);
        if (strstr(line, "freshet.reason=feature_count 9") != NULL)
            garbage += count;
        else if (strstr(line, "freshet.reason=feature_count 12") != NULL)
            shortrec += count;
        else if (strstr(line, "freshet.reason=nonfinite 16") != NULL)
            nan += count;
        else if (strstr(line, "freshet.reason=magnitude 16") != NULL)
            poison += count;
        else
            fail_msg("unexpected dead letter: %s", line);
    }
    assert_int_equal(pclose(f), 0);
    assert_int_equal(garbage, 2);
    assert_int_equal(shortrec, 2);
    assert_int_equal(nan, 2);
    assert_int_equal(poison, 2);
}

/*
 * csv records over 3 partitions, some bad, decoded ahead by 3 helpers:
 * every good sample arrives once with its exact values, in contiguous
 * ranges, and every bad one is counted under its own reason, as when the
 * poll thread decodes alone.
 */
static void test_csv_records_decoded_ahead_arrive_once_with_exact_values(void **state)
{
    (void)state;
    enum { PER = 300 };
    static kind_t kinds[3][PER];
    for (int p = 0; p < 3; p++)
        for (int o = 0; o < PER; o++)
            kinds[p][o] = (o * 7 + p) % 53 == 0   ? GARBAGE
                          : (o * 5 + p) % 61 == 0 ? SHORT
                          : (o * 3 + p) % 67 == 0 ? NAN_FEATURE
                          : (o + p) % 71 == 0     ? POISON
                                                  : GOOD;
    int want[INGEST_REJECT_COUNT] = {0};
    static const ingest_reject_t reason_of[] = {[GARBAGE] = INGEST_REJECT_BAD_NUMBER,
                                                [SHORT] = INGEST_REJECT_FEATURE_COUNT,
                                                [NAN_FEATURE] = INGEST_REJECT_NONFINITE,
                                                [POISON] = INGEST_REJECT_MAGNITUDE};
    for (int p = 0; p < 3; p++) {
        for (int o = 0; o < PER; o++)
            if (kinds[p][o] != GOOD)
                want[reason_of[kinds[p][o]]]++;
        produce("d1", p, 0, kinds[p], PER);
    }
    ingest_consumer_t *c = consumer_new("d1", "md1", 16, 64, 0, NULL, NULL);
    ingest_consumer_stats_t st;
    collected_t *col = collect_checked(c, "d1", 3, PER, &kinds[0][0], &st);
    for (int r = 1; r < INGEST_REJECT_COUNT; r++)
        if ((int)st.rejected[r] != want[r])
            fail_msg("%s: %d rejected, expected %d", ingest_reject_name((ingest_reject_t)r),
                     (int)st.rejected[r], want[r]);
    assert_true(want[INGEST_REJECT_BAD_NUMBER] > 0 && want[INGEST_REJECT_MAGNITUDE] > 0);
    /* the backlog was there before the consumer: most records came in
     * windows, whose slices the 3 helpers decode 3 of 4 */
    fprintf(stderr, "decoded by the helpers: %llu of %d records\n",
            (unsigned long long)st.decoded_ahead, 3 * PER);
    assert_true(st.decoded_ahead > PER);
    assert_true(st.decoded_ahead <= 3 * PER);
    ingest_consumer_destroy(c);
    free(col);
}

/* The store says where to start and what was applied above that. */
static void test_partition_starts_at_the_store_watermark_and_skips_applied_intervals(void **state)
{
    (void)state;
    char out[256];
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "HSET freshet:{m2}:offsets c2/0 100;120-130"),
        0);
    produce_good("c2", 0, 200);
    ingest_consumer_t *c = consumer_new("c2", "m2", 16, 8, 0, NULL, NULL);
    collected_t *col = collected_new("c2", 1);
    int64_t end[1] = {200};
    collect_until(c, col, end, 16);
    assert_int_equal(col->ranges[0][0][0], 100);
    check_ranges(col, 0, 100, 200, 120, 130);
    for (int o = 0; o < 200; o++) {
        int want = o >= 100 && !(o >= 120 && o < 130);
        if (col->seen[0][o] != want)
            fail_msg("offset %d seen %d times", o, col->seen[0][o]);
    }
    ingest_consumer_destroy(c);
    free(col);
}

/* The committed offset of partition 0 of topic for group, from a handle
 * that is not a group member. */
static int64_t committed_offset(const char *group, const char *topic)
{
    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    assert_int_equal(
        rd_kafka_conf_set(conf, "bootstrap.servers", broker.bootstrap, errstr, sizeof(errstr)),
        RD_KAFKA_CONF_OK);
    assert_int_equal(rd_kafka_conf_set(conf, "group.id", group, errstr, sizeof(errstr)),
                     RD_KAFKA_CONF_OK);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    assert_non_null(rk);
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(parts, topic, 0);
    int64_t off = -1;
    if (rd_kafka_committed(rk, parts, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR &&
        parts->elems[0].err == RD_KAFKA_RESP_ERR_NO_ERROR)
        off = parts->elems[0].offset;
    rd_kafka_topic_partition_list_destroy(parts);
    rd_kafka_destroy(rk);
    return off;
}

/* start = latest covers the log with a "start" batch; Kafka's committed
 * offset then follows the store's watermark, and the lag gauge with it. */
static void test_kafka_commits_follow_the_store_watermark(void **state)
{
    (void)state;
    produce_good("c3", 0, 200);
    fr_metrics_t *reg = fr_metrics_new();
    assert_non_null(reg);
    ingest_consumer_t *c = consumer_new("c3", "m3", 16, 8, 1, NULL, reg);
    ingest_batch_t *b = NULL;
    for (int i = 0; i < WAIT_MS / 500 && b == NULL; i++)
        b = ingest_consumer_next(c, 500);
    assert_non_null(b);
    assert_int_equal(b->n, 0);
    assert_string_equal(b->reason, "start");
    assert_int_equal(b->nranges, 1);
    assert_int_equal(b->ranges[0].from, 0);
    assert_int_equal(b->ranges[0].to, 200);
    ingest_batch_destroy(b);

    char out[256];
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "HSET freshet:{m3}:offsets c3/0 150"), 0);
    int64_t off = -1;
    for (int i = 0; i < 30 && off != 150; i++) {
        harness_sleep_ms(500);
        off = committed_offset("freshet.m3", "c3");
    }
    assert_int_equal(off, 150);
    /* the lag gauge: log end 200 minus the watermark */
    int lag_ok = 0;
    for (int i = 0; i < 20 && !lag_ok; i++) {
        char *text = fr_metrics_render(reg, NULL);
        assert_non_null(text);
        lag_ok =
            strstr(text, "freshet_kafka_consumergroup_lag{topic=\"c3\",partition=\"0\"} 50\n") !=
            NULL;
        if (!lag_ok && i == 19)
            fprintf(stderr, "%s", text);
        free(text);
        harness_sleep_ms(500);
    }
    assert_true(lag_ok);
    ingest_consumer_stats_t st;
    ingest_consumer_stats(c, &st);
    assert_int_equal(st.lag, 50); /* the same, summed over the assignment */
    ingest_consumer_destroy(c);
    fr_metrics_destroy(reg);
}

/* Checks that partition p of col holds exactly the samples [from, end)
 * minus [gap_from, gap_to), with contiguous ranges. */
static void check_partition(const collected_t *col, int32_t p, int64_t from, int64_t end,
                            int64_t gap_from, int64_t gap_to)
{
    check_ranges(col, p, from, end, gap_from, gap_to);
    for (int64_t o = 0; o < end; o++) {
        int want = o >= from && !(o >= gap_from && o < gap_to);
        if (col->seen[p][o] != want)
            fail_msg("partition %d offset %lld seen %d times", (int)p, (long long)o,
                     col->seen[p][o]);
    }
}

/* Waits until the consumer has want partitions paused. */
static void wait_paused(ingest_consumer_t *c, int want)
{
    ingest_consumer_stats_t st;
    for (int i = 0; i < WAIT_MS / 100; i++) {
        ingest_consumer_stats(c, &st);
        if (st.paused == want)
            return;
        harness_sleep_ms(100);
    }
    fail_msg("%d partitions paused, expected %d", st.paused, want);
}

/* A queue of one batch that nobody drains pauses the partitions; draining
 * resumes them and every record still arrives once. */
static void test_full_queue_pauses_partitions_and_loses_nothing(void **state)
{
    (void)state;
    /* each resume waits for the fetch in flight (fetch.wait.max.ms, 500 ms
     * on an idle log), and a queue of one resumes every batch: keep it short */
    enum { PER = 40 };
    produce_good("c4", 0, PER);
    produce_good("c4", 1, PER);
    ingest_consumer_t *c = consumer_new("c4", "m4", 4, 1, 0, NULL, NULL);
    wait_paused(c, 2);
    ingest_consumer_stats_t st;
    /* paused, still polling: nothing more is taken while nobody drains */
    harness_sleep_ms(1000);
    ingest_consumer_stats(c, &st);
    uint64_t consumed = st.consumed;
    harness_sleep_ms(1500);
    ingest_consumer_stats(c, &st);
    assert_int_equal(st.paused, 2);
    assert_int_equal(st.consumed, consumed);
    assert_true(consumed < 2 * PER);

    collected_t *col = collected_new("c4", 2);
    int64_t end[2] = {PER, PER};
    collect_until(c, col, end, 4);
    for (int p = 0; p < 2; p++)
        check_partition(col, p, 0, PER, 0, 0);
    ingest_consumer_stats(c, &st);
    assert_true(st.pauses >= 1); /* while drained, a full queue waits for room first */
    free(col);
    ingest_consumer_destroy(c);
}

/*
 * A backlog beyond librdkafka's prefetch limit (queued.min.messages 20
 * here, 1,200 records): librdkafka below 2.1 stops fetching at the limit
 * and looks again only when its broker thread next wakes, up to a second
 * later, so the poll thread wakes it once it has drained the queue
 * (consumer_poll.c "Fetch wakeups"). Every record still arrives once, and the
 * wakeups are counted; the first test, whose queue never nears a limit,
 * counts none.
 */
static void test_a_backlog_beyond_the_prefetch_limit_wakes_the_fetcher(void **state)
{
    (void)state;
    enum { PER = 600 };
    static const char *const props[][2] = {
        {"session.timeout.ms", "6000"},
        {"heartbeat.interval.ms", "500"},
        {"queued.min.messages", "20"},
    };
    produce_good("c7", 0, PER);
    produce_good("c7", 1, PER);
    ingest_consumer_t *c = consumer_new_props("c7", "m7", 16, 1000, 0, NULL, NULL, props, 3);
    collected_t *col = collected_new("c7", 2);
    int64_t end[2] = {PER, PER};
    collect_until(c, col, end, 16);
    for (int p = 0; p < 2; p++)
        check_partition(col, p, 0, PER, 0, 0);
    ingest_consumer_stats_t st;
    ingest_consumer_stats(c, &st);
    assert_int_equal(st.consumed, 2 * PER);
    fr_log(FR_LOG_INFO, "%llu fetch wakeup(s)", (unsigned long long)st.fetch_wakeups);
    if (rd_kafka_version() < 0x020100ff)
        assert_true(st.fetch_wakeups >= 1);
    else
        assert_int_equal(st.fetch_wakeups, 0); /* fetch.queue.backoff.ms does it there */
    free(col);
    ingest_consumer_destroy(c);
}

/* Waits until consumer c has `want` partitions assigned. */
static void wait_assigned(ingest_consumer_t *c, int want)
{
    ingest_consumer_stats_t st;
    for (int i = 0; i < WAIT_MS / 100; i++) {
        ingest_consumer_stats(c, &st);
        if (st.assigned == want)
            return;
        harness_sleep_ms(100);
    }
    fail_msg("assigned %d partitions, expected %d", st.assigned, want);
}

/* Two consumers in one group split the partitions; each starts its share
 * at the store's watermark read at that rebalance; when one leaves, the
 * other takes its partition back from the watermark. */
static void group_members_split(const char *topic, const char *model)
{
    enum { PER = 100 };
    char out[256];
    produce_good(topic, 0, PER);
    produce_good(topic, 1, PER);
    ingest_consumer_t *a = consumer_new(topic, model, 16, 64, 0, NULL, NULL);
    collected_t *col = collected_new(topic, 2);
    int64_t end[2] = {PER, PER};
    collect_until(a, col, end, 16);
    check_partition(col, 0, 0, PER, 0, 0);
    check_partition(col, 1, 0, PER, 0, 0);
    free(col);

    /* nothing was applied; pretend part was, then a second member joins */
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                         "HSET freshet:{%s}:offsets %s/0 60;70-80 %s/1 90", model,
                                         topic, topic),
                     0);
    assert_string_equal(out, "2");
    ingest_consumer_t *b = consumer_new(topic, model, 16, 64, 0, NULL, NULL);
    wait_assigned(b, 1);
    wait_assigned(a, 1);
    ingest_consumer_t *both[2] = {a, b};
    col = collected_new(topic, 2);
    /* the broker may rebalance twice for one join (a holds partition 0
     * at the first, and again at the second): a partition delivered
     * again starts at the store's watermark once more */
    col->restart_at[0] = 60;
    col->restart_at[1] = 90;
    collect_from(both, 2, col, end, 16);
    check_partition(col, 0, 60, PER, 70, 80);
    check_partition(col, 1, 90, PER, 0, 0);
    if (col->restarts[0] + col->restarts[1] > 0)
        fprintf(stderr, "restarts after b joined: partition 0 %d, partition 1 %d\n",
                col->restarts[0], col->restarts[1]);
    free(col);

    /* b leaves: a gets both again, from the store once more */
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                         "HSET freshet:{%s}:offsets %s/1 95", model, topic),
                     0);
    assert_string_equal(out, "0"); /* an update */
    ingest_consumer_destroy(b);
    wait_assigned(a, 2);
    col = collected_new(topic, 2);
    col->restart_at[0] = 60;
    col->restart_at[1] = 95;
    /* a may still hold partition 1 from 90, queued at one of the join's
     * rebalances (twice, in one CI run); those batches come before the
     * delivery from 95, which starts the partition over */
    col->restart_also[1] = 90;
    collect_until(a, col, end, 16);
    check_partition(col, 0, 60, PER, 70, 80);
    check_partition(col, 1, 95, PER, 0, 0);
    free(col);
    ingest_consumer_stats_t st;
    ingest_consumer_stats(a, &st);
    if (decode_threads > 0) /* the backlog came in windows, mostly decoded by the helpers */
        assert_true(st.decoded_ahead > PER);
    else
        assert_int_equal(st.decoded_ahead, 0);
    ingest_consumer_destroy(a);
}

static void test_group_members_split_partitions_and_restart_from_the_store(void **state)
{
    (void)state;
    group_members_split("c5", "m5");
}

/* The same with csv records decoded ahead by three helpers each. The
 * backlog is read before each join, so these rebalances are not made to
 * find a window held; test_a_rebalance_hands_on_the_window_it_finds_held
 * makes one. */
static void test_members_decoding_ahead_split_partitions_and_restart_from_the_store(void **state)
{
    (void)state;
    group_members_split("d2", "md2");
}

/*
 * The moment the rebalance drain is for, made certain: a member holds a
 * window of csv records decoded ahead (the partition's last ones, with
 * nothing queued behind) when the group rebalances, and keeps it until the
 * callback runs (ingest_consumer_hold_for_test). The callback hands the
 * window to the batcher before the revocation, which flushes it: the
 * member's batches cover the partition once, contiguous to its end. A
 * record handed on after the revocation would be refused (its partition is
 * no longer assigned) and missing from them.
 */
static void test_a_rebalance_hands_on_the_window_it_finds_held(void **state)
{
    (void)state;
    enum { PER = 100 };
    const char *topic = "d3", *model = "md3";
    char out[64];
    produce_good(topic, 0, PER);
    hold_at = PER - 1;
    ingest_consumer_t *a = consumer_new(topic, model, 16, 64, 0, NULL, NULL);
    hold_at = -1;
    collected_t *col = collected_new(topic, 1);
    /* a window holds at most DECODE_WINDOW records: those before it came
     * in full batches */
    int64_t before[1] = {(PER - DECODE_WINDOW) / 16 * 16};
    collect_until(a, col, before, 16);
    assert_true(col->covered[0] < PER);
    /* a holds the window before b joins: a rebalance any sooner could
     * come between two windows */
    for (int waited = 0; ingest_consumer_holds_for_test(a) == 0; waited += 10) {
        if (waited > WAIT_MS)
            fail_msg("the consumer never held its last window");
        harness_sleep_ms(10);
    }
    /* whoever gets the partition next starts past its end */
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                         "HSET freshet:{%s}:offsets %s/0 %d", model, topic, PER),
                     0);
    ingest_consumer_t *b = consumer_new(topic, model, 16, 64, 0, NULL, NULL);
    int64_t end[1] = {PER};
    collect_until(a, col, end, 16);
    check_ranges(col, 0, 0, PER, 0, 0);
    for (int o = 0; o < PER; o++)
        if (col->seen[0][o] != 1)
            fail_msg("offset %d seen %d times", o, col->seen[0][o]);
    ingest_consumer_stats_t st;
    ingest_consumer_stats(a, &st);
    /* the callback found the window holding the last record at least */
    assert_true(st.rebalance_drained >= 1 && st.rebalance_drained <= DECODE_WINDOW);
    fprintf(stderr, "records held at the rebalance: %llu\n",
            (unsigned long long)st.rebalance_drained);
    free(col);
    ingest_consumer_destroy(b);
    ingest_consumer_destroy(a);
}

/*
 * librdkafka keeps a partition's pause across a rebalance. A consumer
 * paused by a full queue whose partitions are revoked, and whose queue
 * drains before they are assigned again, must still fetch them: the
 * resume found nothing assigned to resume, so the assignment clears the
 * pause itself. Every record arrives, from the store's position.
 */
static void test_a_partition_paused_at_its_revocation_is_fetched_when_assigned_again(void **state)
{
    (void)state;
    enum { PER = 40 };
    produce_good("c8", 0, PER);
    produce_good("c8", 1, PER);
    ingest_consumer_t *a = consumer_new("c8", "m8", 4, 1, 0, NULL, NULL);
    wait_paused(a, 2);
    ingest_consumer_stats_t st;
    /* b joins: the group revokes a's partitions, paused, and assigns them
     * again seconds later; meanwhile a's queue drains, which resumes a */
    ingest_consumer_t *b = consumer_new("c8", "m8", 4, 64, 0, NULL, NULL);
    wait_assigned(a, 0);
    collected_t *col = collected_new("c8", 2);
    for (ingest_batch_t *batch; (batch = ingest_consumer_next(a, 300)) != NULL;) {
        collect_batch(col, batch, 4);
        ingest_batch_destroy(batch);
    }
    /* the case at hand needs the drain to end before the assignment (the
     * dev broker takes seconds to rebalance); were it otherwise, the test
     * still checks that every record arrives */
    ingest_consumer_stats(a, &st);
    if (st.assigned != 0)
        fprintf(stderr, "note: a was assigned again before its queue drained\n");
    wait_assigned(a, 1);
    wait_assigned(b, 1);
    /* nothing was applied: both partitions start again at 0 */
    col->restart_at[0] = col->restart_at[1] = 0;
    ingest_consumer_t *both[2] = {a, b};
    int64_t end[2] = {PER, PER};
    collect_from(both, 2, col, end, 4);
    for (int p = 0; p < 2; p++)
        check_partition(col, p, 0, PER, 0, 0);
    free(col);
    ingest_consumer_destroy(b);
    ingest_consumer_destroy(a);
}

/* Bad configuration is refused with a message, before anything starts. */
static void test_bad_configuration_is_refused(void **state)
{
    (void)state;
    char errstr[512];
    ingest_consumer_conf_t conf = {
        .bootstrap = broker.bootstrap,
        .topic = "c1",
        .redis_url = redis.url,
        .model = "bad{name}",
        .schema = {.features = D, .label = INGEST_LABEL_REAL},
        .format = INGEST_FORMAT_F32,
        .batch = 16,
        .queue = 4,
        .linger_ms = 200,
    };
    assert_null(ingest_consumer_new(&conf, errstr, sizeof(errstr)));
    conf.model = "ok";
    const char *const bad[][2] = {{"no.such.property", "1"}};
    conf.props = bad;
    conf.nprops = 1;
    assert_null(ingest_consumer_new(&conf, errstr, sizeof(errstr)));
    assert_non_null(strstr(errstr, "no.such.property"));
    conf.nprops = 0;
    conf.batch = 0;
    assert_null(ingest_consumer_new(&conf, errstr, sizeof(errstr)));
    conf.batch = 16;
    conf.decode_threads = 17;
    assert_null(ingest_consumer_new(&conf, errstr, sizeof(errstr)));
    assert_string_equal(errstr, "ingest: decode_threads is at most 16");
    conf.decode_threads = 0;
    ingest_consumer_t *c = ingest_consumer_new(&conf, errstr, sizeof(errstr));
    assert_non_null(c);
    assert_null(ingest_consumer_next(c, 0));
    ingest_consumer_destroy(c); /* never started */
}

/* ------------------------------------------------------------------------
 * Setup: a private folder, redis-server and the broker.
 * ---------------------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    return harness_stack_start(tmp_dir, "consumer", &redis, &broker, FRESHET_BIN,
                               "--topic c1:3 --topic c1dlq:1 --topic c2:1 --topic c3:1 "
                               "--topic c4:2 --topic c5:2 --topic c8:2 --topic d1:3 --topic d2:2 "
                               "--topic d3:1");
}

/* The csv tests' setup and teardown: csv records, 3 decode helpers, and
 * back to f32 decoded on the poll thread whatever the test's outcome. */
static int csv_ahead(void **state)
{
    (void)state;
    rec_format = INGEST_FORMAT_CSV;
    decode_threads = 3;
    return 0;
}

static int f32_alone(void **state)
{
    (void)state;
    rec_format = INGEST_FORMAT_F32;
    decode_threads = 0;
    hold_at = -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return harness_stack_stop(tmp_dir, &redis, &broker);
}

int main(void)
{
    /* TEST_FILTER=pattern runs the matching tests only (while debugging) */
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_configuration_is_refused),
        cmocka_unit_test(test_records_arrive_once_in_order_and_bad_ones_are_dead_lettered),
        cmocka_unit_test(test_partition_starts_at_the_store_watermark_and_skips_applied_intervals),
        cmocka_unit_test(test_kafka_commits_follow_the_store_watermark),
        cmocka_unit_test(test_full_queue_pauses_partitions_and_loses_nothing),
        cmocka_unit_test(test_a_backlog_beyond_the_prefetch_limit_wakes_the_fetcher),
        cmocka_unit_test(test_group_members_split_partitions_and_restart_from_the_store),
        cmocka_unit_test(test_a_partition_paused_at_its_revocation_is_fetched_when_assigned_again),
        cmocka_unit_test_setup_teardown(
            test_csv_records_decoded_ahead_arrive_once_with_exact_values, csv_ahead, f32_alone),
        cmocka_unit_test_setup_teardown(
            test_members_decoding_ahead_split_partitions_and_restart_from_the_store, csv_ahead,
            f32_alone),
        cmocka_unit_test_setup_teardown(test_a_rebalance_hands_on_the_window_it_finds_held,
                                        csv_ahead, f32_alone),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
