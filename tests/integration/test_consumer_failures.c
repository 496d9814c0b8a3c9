/*
 * test_consumer_failures.c - the Kafka consumer under failures, against the
 * dev broker (a separate "freshet broker" process) and a real redis-server:
 * a broker outage (SIGUSR1, then SIGUSR2) loses nothing; an oversize record
 * is rejected as oversize and its position still covered; a restart after
 * applied intervals above the watermark skips them and resumes where the
 * store says.
 *
 * Records are samples of 3 features whose label is g = partition * 10000 +
 * offset, so every sample says where it came from; its features are a
 * function of g and are checked exactly. The test plays the applier: a
 * batch is applied when none of its positions was applied before (rule 1),
 * else dropped whole as a duplicate; with `store` set it also writes the
 * watermark and applied intervals into the store as the real applier would,
 * so a consumer that is reassigned after an outage starts where the model
 * is.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "harness.h"
#include "ingest/ingest.h"

#define D        3
#define MAXPART  2
#define MAXOFF   1000
#define WAIT_MS  60000
#define BIG_PROP "20000000"

/*
 * The oversize record. The issue asks for 10 MB, but the dev broker keeps
 * at most 5 MiB per partition and drops the oldest record sets beyond that
 * (docs/operations.md "The dev broker's limits"): a 10 MB record is accepted and
 * vanishes at once. 4 MiB is the largest round size it keeps next to a few
 * small records, four times the consumer's 1 MiB csv limit.
 */
#define OVERSIZE (4u * 1024u * 1024u)

static harness_broker_t broker;
static harness_redis_t redis;
static char tmp_dir[256];

/* The dev broker's group timing; a short reconnect backoff so that the
 * consumer is back within its session timeout after an outage. */
static const char *const base_props[][2] = {
    {"session.timeout.ms", "6000"},
    {"heartbeat.interval.ms", "500"},
    {"reconnect.backoff.max.ms", "500"},
};

/* The same, with the limits raised for the oversize record. */
/* no fetch.max.bytes: the consumer raises its 2 MiB default to
 * message.max.bytes (librdkafka refuses a smaller one), so the 4 MiB
 * record below is fetched whole */
static const char *const big_props[][2] = {
    {"session.timeout.ms", "6000"},
    {"heartbeat.interval.ms", "500"},
    {"message.max.bytes", BIG_PROP},
    {"max.partition.fetch.bytes", BIG_PROP},
};

/* ------------------------------------------------------------------------
 * Records.
 * ---------------------------------------------------------------------- */

static void features_of(int64_t g, float *x)
{
    x[0] = (float)g * 0.5f;
    x[1] = -(float)g;
    x[2] = (float)g / 7.0f;
}

/* The record of (partition, offset) in format: its length in buf (cap). */
static size_t make_record(ingest_format_t format, int32_t partition, int64_t offset, char *buf,
                          size_t cap)
{
    float x[D];
    int64_t g = (int64_t)partition * 10000 + offset;
    features_of(g, x);
    size_t len = ingest_encode(format, x, D, (float)g, buf, cap);
    assert_true(len > 0);
    return len;
}

/*
 * Produces n records to one partition of topic with kcat, each from its own
 * file (kcat sends a file as one message), in order, so the k-th record
 * gets offset first + k. The record at offset `oversize` (-1: none) is a
 * csv record padded with leading zeros on its label to OVERSIZE bytes: it
 * would decode to the right sample if it were not too long.
 */
static void produce(const char *topic, int32_t partition, int64_t first, size_t n,
                    ingest_format_t format, int64_t oversize)
{
    size_t cap = 512 + n * 300;
    char *cmd = malloc(cap);
    assert_non_null(cmd);
    size_t len =
        (size_t)snprintf(cmd, cap, "kcat -P -b %s -t %s -p %d%s", broker.bootstrap, topic,
                         (int)partition, oversize >= 0 ? " -X message.max.bytes=" BIG_PROP : "");
    for (size_t k = 0; k < n; k++) {
        char path[300], rec[128];
        int64_t off = first + (int64_t)k;
        snprintf(path, sizeof(path), "%s/%s-%d-%lld.rec", tmp_dir, topic, (int)partition,
                 (long long)off);
        size_t rlen = make_record(format, partition, off, rec, sizeof(rec));
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        if (off == oversize) {
            for (size_t i = rlen; i < OVERSIZE; i++)
                assert_int_not_equal(fputc('0', f), EOF);
        }
        assert_int_equal(fwrite(rec, 1, rlen, f), rlen);
        assert_int_equal(fclose(f), 0);
        len += (size_t)snprintf(cmd + len, cap - len, " %s", path);
    }
    if (system(cmd) != 0)
        fail_msg("kcat failed: %.200s", cmd);
    free(cmd);
}

/* ------------------------------------------------------------------------
 * The test's applier.
 * ---------------------------------------------------------------------- */

typedef struct applier {
    const char *topic, *model;
    int nparts;
    int store;                          /* write the offsets into the store   */
    char applied[MAXPART][MAXOFF];      /* positions covered by applied batches */
    int seen[MAXPART][MAXOFF];          /* times each offset was an applied sample */
    int64_t ranges[MAXPART][MAXOFF][2]; /* applied ranges, in order           */
    size_t nranges[MAXPART];
    int64_t last[MAXPART];    /* last applied sample offset, -1: none */
    int64_t covered[MAXPART]; /* the highest applied range end        */
    size_t batches, duplicates, samples;
} applier_t;

static applier_t *applier_new(const char *topic, const char *model, int nparts, int store)
{
    applier_t *ap = calloc(1, sizeof(*ap));
    assert_non_null(ap);
    ap->topic = topic;
    ap->model = model;
    ap->nparts = nparts;
    ap->store = store;
    for (int p = 0; p < MAXPART; p++)
        ap->last[p] = -1;
    return ap;
}

/* Writes partition p's offsets in the store's text form: the watermark,
 * then ';' and the applied intervals above it, comma-separated. */
static void store_write(const applier_t *ap, int32_t p)
{
    char text[4096], out[256];
    int64_t w = 0;
    while (w < MAXOFF && ap->applied[p][w])
        w++;
    size_t n = (size_t)snprintf(text, sizeof(text), "%lld", (long long)w);
    int first = 1;
    for (int64_t o = w; o < MAXOFF; o++) {
        if (!ap->applied[p][o] || (o > 0 && ap->applied[p][o - 1]))
            continue;
        int64_t e = o;
        while (e < MAXOFF && ap->applied[p][e])
            e++;
        n += (size_t)snprintf(text + n, sizeof(text) - n, "%c%lld-%lld", first ? ';' : ',',
                              (long long)o, (long long)e);
        assert_true(n < sizeof(text));
        first = 0;
    }
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                         "HSET freshet:{%s}:offsets %s/%d %s", ap->model, ap->topic,
                                         (int)p, text),
                     0);
}

/* Checks one batch against the encoding, then applies it, or drops it
 * whole when any of its positions was applied already (rule 1). */
static void apply_batch(applier_t *ap, const ingest_batch_t *b, size_t batch)
{
    assert_true(b->n <= batch);
    assert_true(b->nranges > 0);
    if (b->n == 0)
        assert_true(b->reason[0] != '\0');
    int dup = 0;
    for (size_t r = 0; r < b->nranges; r++) {
        const ingest_range_t *rg = &b->ranges[r];
        assert_string_equal(rg->topic, ap->topic);
        assert_true(rg->partition >= 0 && rg->partition < ap->nparts);
        assert_true(rg->from >= 0 && rg->from < rg->to && rg->to <= MAXOFF);
        for (int64_t o = rg->from; o < rg->to; o++)
            dup |= ap->applied[rg->partition][o];
    }
    for (size_t i = 0; i < b->n; i++) {
        float y = b->y[i], x[D];
        int64_t g = (int64_t)y;
        assert_true((float)g == y);
        int32_t p = (int32_t)(g / 10000);
        int64_t o = g % 10000;
        assert_true(p >= 0 && p < ap->nparts && o < MAXOFF);
        features_of(g, x);
        assert_memory_equal(&b->x[i * D], x, sizeof(x));
        int inside = 0;
        for (size_t r = 0; r < b->nranges; r++)
            inside |= b->ranges[r].partition == p && o >= b->ranges[r].from && o < b->ranges[r].to;
        if (!inside)
            fail_msg("sample %d/%lld outside its batch's ranges", (int)p, (long long)o);
    }
    if (dup) {
        ap->duplicates++;
        return;
    }
    ap->batches++;
    for (size_t r = 0; r < b->nranges; r++) {
        const ingest_range_t *rg = &b->ranges[r];
        int32_t p = rg->partition;
        memset(&ap->applied[p][rg->from], 1, (size_t)(rg->to - rg->from));
        ap->ranges[p][ap->nranges[p]][0] = rg->from;
        ap->ranges[p][ap->nranges[p]][1] = rg->to;
        ap->nranges[p]++;
        if (rg->to > ap->covered[p])
            ap->covered[p] = rg->to;
    }
    for (size_t i = 0; i < b->n; i++) {
        int64_t g = (int64_t)b->y[i];
        int32_t p = (int32_t)(g / 10000);
        int64_t o = g % 10000;
        if (o <= ap->last[p])
            fail_msg("partition %d: sample %lld applied after %lld", (int)p, (long long)o,
                     (long long)ap->last[p]);
        ap->last[p] = o;
        ap->seen[p][o]++;
        ap->samples++;
    }
    if (ap->store)
        for (size_t r = 0; r < b->nranges; r++)
            store_write(ap, b->ranges[r].partition);
}

/* Takes one batch (waiting up to wait_ms) and applies it; 1 when there was one. */
static int apply_next(ingest_consumer_t *c, applier_t *ap, size_t batch, int wait_ms)
{
    ingest_batch_t *b = ingest_consumer_next(c, wait_ms);
    if (b == NULL)
        return 0;
    apply_batch(ap, b, batch);
    ingest_batch_destroy(b);
    return 1;
}

/* Applies batches until every partition p is covered up to end[p]. */
static void apply_until(ingest_consumer_t *c, applier_t *ap, const int64_t *end, size_t batch)
{
    int64_t deadline = fr_clock_unix_ms() + WAIT_MS;
    for (;;) {
        int done = 1;
        for (int p = 0; p < ap->nparts; p++)
            done &= ap->covered[p] >= end[p];
        if (done)
            return;
        if (fr_clock_unix_ms() > deadline) {
            for (int p = 0; p < ap->nparts; p++)
                fprintf(stderr, "partition %d covered to %lld of %lld\n", p,
                        (long long)ap->covered[p], (long long)end[p]);
            fail_msg("timed out waiting for batches");
        }
        apply_next(c, ap, batch, 200);
    }
}

/*
 * Checks partition p: its applied ranges are contiguous from `from` to `end`
 * in order, the only hole being [gap_from, gap_to) (none when equal), and
 * its samples are exactly [from, end) minus the hole and minus `missing`
 * (-1: none), each once.
 */
static void check_partition(const applier_t *ap, int32_t p, int64_t from, int64_t end,
                            int64_t gap_from, int64_t gap_to, int64_t missing)
{
    int64_t at = from;
    assert_true(ap->nranges[p] > 0);
    for (size_t r = 0; r < ap->nranges[p]; r++) {
        int64_t a = ap->ranges[p][r][0], b = ap->ranges[p][r][1];
        if (a != at && !(at == gap_from && a == gap_to))
            fail_msg("partition %d: range %zu is [%lld,%lld), expected to start at %lld", (int)p, r,
                     (long long)a, (long long)b, (long long)at);
        if (gap_from < gap_to && a < gap_to && b > gap_from)
            fail_msg("partition %d: range [%lld,%lld) covers the applied [%lld,%lld)", (int)p,
                     (long long)a, (long long)b, (long long)gap_from, (long long)gap_to);
        at = b;
    }
    assert_int_equal(at, end);
    for (int64_t o = 0; o < MAXOFF; o++) {
        int want = o >= from && o < end && !(o >= gap_from && o < gap_to) && o != missing;
        if (ap->seen[p][o] != want)
            fail_msg("partition %d offset %lld seen %d times", (int)p, (long long)o,
                     ap->seen[p][o]);
    }
}

static ingest_consumer_t *consumer_new(const char *topic, const char *model, ingest_format_t format,
                                       const char *const (*props)[2], size_t nprops, int batch,
                                       int queue)
{
    char errstr[512];
    ingest_consumer_conf_t conf = {
        .bootstrap = broker.bootstrap,
        .props = props,
        .nprops = nprops,
        .topic = topic,
        .redis_url = redis.url,
        .model = model,
        .schema = {.features = D, .label = INGEST_LABEL_REAL},
        .format = format,
        .batch = batch,
        .queue = queue,
        .linger_ms = 200,
    };
    ingest_consumer_t *c = ingest_consumer_new(&conf, errstr, sizeof(errstr));
    if (c == NULL)
        fail_msg("ingest_consumer_new: %s", errstr);
    assert_int_equal(ingest_consumer_start(c), FR_OK);
    return c;
}

/* ------------------------------------------------------------------------
 * Tests.
 * ---------------------------------------------------------------------- */

/* All brokers go down for 3 s while the consumer is half way through two
 * partitions; once they are back every record is applied exactly once,
 * and records produced after the outage arrive too. */
static void test_consumption_resumes_after_a_broker_outage_and_nothing_is_lost(void **state)
{
    (void)state;
    enum { PER = 100, MORE = 50, BATCH = 8 };
    produce("f1", 0, 0, PER, INGEST_FORMAT_F32, -1);
    produce("f1", 1, 0, PER, INGEST_FORMAT_F32, -1);
    /* a small queue keeps the consumer paused behind the applier, so the
     * outage comes in the middle of the stream */
    ingest_consumer_t *c = consumer_new("f1", "mf1", INGEST_FORMAT_F32, base_props,
                                        sizeof(base_props) / sizeof(base_props[0]), BATCH, 2);
    applier_t *ap = applier_new("f1", "mf1", 2, 1);

    int64_t deadline = fr_clock_unix_ms() + WAIT_MS;
    while (ap->samples < PER) {
        if (fr_clock_unix_ms() > deadline)
            fail_msg("only %zu samples before the outage", ap->samples);
        apply_next(c, ap, BATCH, 200);
    }

    /* the outage: keep taking batches all along */
    assert_int_equal(kill(broker.pid, SIGUSR1), 0);
    int64_t up_at = fr_clock_unix_ms() + 3000;
    while (fr_clock_unix_ms() < up_at)
        apply_next(c, ap, BATCH, 200);
    assert_int_equal(kill(broker.pid, SIGUSR2), 0);

    int64_t end[2] = {PER, PER};
    apply_until(c, ap, end, BATCH);

    /* the broker takes new records again, and they arrive */
    produce("f1", 0, PER, MORE, INGEST_FORMAT_F32, -1);
    produce("f1", 1, PER, MORE, INGEST_FORMAT_F32, -1);
    end[0] = end[1] = PER + MORE;
    apply_until(c, ap, end, BATCH);
    /* a little longer: nothing beyond the log end, no late duplicate applied */
    for (int i = 0; i < 5; i++)
        apply_next(c, ap, BATCH, 200);

    for (int p = 0; p < 2; p++)
        check_partition(ap, p, 0, PER + MORE, 0, 0, -1);
    ingest_consumer_stats_t st;
    ingest_consumer_stats(c, &st);
    for (int r = 1; r < INGEST_REJECT_COUNT; r++)
        assert_int_equal(st.rejected[r], 0);
    assert_true(st.consumed >= 2 * (PER + MORE));
    if (ap->duplicates > 0 || st.consumed > 2 * (PER + MORE))
        fprintf(stderr, "outage: %zu duplicate batch(es) dropped, %llu records consumed\n",
                ap->duplicates, (unsigned long long)st.consumed);
    ingest_consumer_destroy(c);
    free(ap);
}

/* A record longer than the csv limit (1 MiB), with Kafka's size limits
 * raised so that it reaches the consumer, is rejected as oversize; the
 * good records around it all arrive and the ranges cover its position. */
static void test_an_oversize_record_is_rejected_and_its_position_still_covered(void **state)
{
    (void)state;
    enum { PER0 = 50, PER1 = 11, BIG_AT = 5, BATCH = 8 };
    produce("o2", 0, 0, PER0, INGEST_FORMAT_CSV, -1);
    produce("o2", 1, 0, PER1, INGEST_FORMAT_CSV, BIG_AT);
    ingest_consumer_t *c = consumer_new("o2", "mo2", INGEST_FORMAT_CSV, big_props,
                                        sizeof(big_props) / sizeof(big_props[0]), BATCH, 64);
    applier_t *ap = applier_new("o2", "mo2", 2, 0);
    int64_t end[2] = {PER0, PER1};
    apply_until(c, ap, end, BATCH);
    check_partition(ap, 0, 0, PER0, 0, 0, -1);
    check_partition(ap, 1, 0, PER1, 0, 0, BIG_AT);
    assert_int_equal(ap->duplicates, 0);
    ingest_consumer_stats_t st;
    ingest_consumer_stats(c, &st);
    assert_int_equal(st.consumed, PER0 + PER1);
    assert_int_equal(st.rejected[INGEST_REJECT_OVERSIZE], 1);
    for (int r = 1; r < INGEST_REJECT_COUNT; r++)
        if (r != INGEST_REJECT_OVERSIZE)
            assert_int_equal(st.rejected[r], 0);
    ingest_consumer_destroy(c);
    free(ap);
}

/* The store says 50 with [60,70) applied: the consumer starts at 50 and
 * never delivers 60..69; restarted in the same group after the store
 * moved to 80, it resumes at 80. */
static void test_a_restart_skips_applied_intervals_and_resumes_at_the_store_watermark(void **state)
{
    (void)state;
    enum { PER = 100, BATCH = 8 };
    char out[256];
    produce("r3", 0, 0, PER, INGEST_FORMAT_F32, -1);
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "HSET freshet:{mr3}:offsets r3/0 50;60-70"),
        0);
    ingest_consumer_t *c = consumer_new("r3", "mr3", INGEST_FORMAT_F32, base_props,
                                        sizeof(base_props) / sizeof(base_props[0]), BATCH, 64);
    applier_t *ap = applier_new("r3", "mr3", 1, 0);
    int64_t end[1] = {PER};
    apply_until(c, ap, end, BATCH);
    assert_int_equal(ap->ranges[0][0][0], 50);
    check_partition(ap, 0, 50, PER, 60, 70, -1);
    assert_int_equal(ap->duplicates, 0);
    ingest_consumer_destroy(c);
    free(ap);

    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "HSET freshet:{mr3}:offsets r3/0 80"), 0);
    c = consumer_new("r3", "mr3", INGEST_FORMAT_F32, base_props,
                     sizeof(base_props) / sizeof(base_props[0]), BATCH, 64);
    ap = applier_new("r3", "mr3", 1, 0);
    apply_until(c, ap, end, BATCH);
    assert_int_equal(ap->ranges[0][0][0], 80);
    check_partition(ap, 0, 80, PER, 0, 0, -1);
    assert_int_equal(ap->duplicates, 0);
    ingest_consumer_destroy(c);
    free(ap);
}

/* ------------------------------------------------------------------------
 * Setup: a private folder, redis-server and the broker.
 * ---------------------------------------------------------------------- */

/* Produces records [first, first + n) of one partition as libsvm padded
 * with trailing blanks to `pad` bytes each (they decode to the same
 * samples), through the producer API, in order. */
static void produce_padded(const char *topic, int32_t partition, int64_t first, size_t n,
                           size_t pad)
{
    char errstr[512];
    ingest_producer_t *pr = ingest_producer_new(broker.bootstrap, NULL, 0, errstr, sizeof(errstr));
    if (pr == NULL)
        fail_msg("%s", errstr);
    char *buf = malloc(pad);
    assert_non_null(buf);
    for (size_t k = 0; k < n; k++) {
        char rec[128];
        size_t len =
            make_record(INGEST_FORMAT_LIBSVM, partition, first + (int64_t)k, rec, sizeof(rec));
        assert_true(len < pad);
        memcpy(buf, rec, len);
        memset(buf + len, ' ', pad - len);
        assert_int_equal(ingest_producer_send(pr, topic, partition, NULL, 0, buf, pad, NULL, NULL),
                         FR_OK);
    }
    uint64_t delivered = 0, failed = 0;
    assert_int_equal(ingest_producer_flush(pr, 20000, &delivered, &failed), FR_OK);
    assert_int_equal(delivered, (uint64_t)n);
    ingest_producer_destroy(pr);
    free(buf);
}

/*
 * A consumer that falls behind retention: it has read 40 of the first 60
 * records (64 KB each) and stops taking batches; 120 more records push the
 * dev broker's 5 MiB window past where it stands. When it resumes, the
 * records retention deleted unread are covered by one n = 0 batch of reason
 * "retention" and the rest arrive: every position of [0, 180) is covered
 * exactly once, and nothing stalls (librdkafka alone would loop resetting
 * to a stale log start).
 */
static void test_a_consumer_behind_retention_covers_the_lost_records_and_goes_on(void **state)
{
    (void)state;
    enum { PAD = 64 * 1024, FIRST = 60, MORE = 120, BATCH = 4 };
    const char *topic = "ret1";
    produce_padded(topic, 0, 0, FIRST, PAD);
    applier_t *ap = applier_new(topic, "ret", 1, 0);
    static const char *const props[][2] = {
        {"session.timeout.ms", "6000"},
        {"heartbeat.interval.ms", "500"},
        {"message.max.bytes", "300000"},
        {"fetch.max.bytes", "300000"}, /* a few records per fetch: it stays behind */
        {"max.partition.fetch.bytes", "300000"},
        {"queued.max.messages.kbytes", "300"},
    };
    ingest_consumer_t *c = consumer_new(topic, "ret", INGEST_FORMAT_LIBSVM, props,
                                        sizeof(props) / sizeof(props[0]), BATCH, 2);
    int64_t end[1] = {40};
    apply_until(c, ap, end, BATCH);
    produce_padded(topic, 0, FIRST, MORE, PAD);
    end[0] = FIRST + MORE;
    apply_until(c, ap, end, BATCH);
    ingest_consumer_stats_t st;
    ingest_consumer_stats(c, &st);
    int64_t lost = 0;
    for (int64_t o = 0; o < FIRST + MORE; o++) {
        assert_true(ap->applied[0][o]);
        assert_true(ap->seen[0][o] <= 1);
        lost += ap->seen[0][o] == 0;
    }
    fr_log(FR_LOG_INFO, "retention: %llu skip(s), %lld of %d records deleted before they were read",
           (unsigned long long)st.retention_skips, (long long)lost, FIRST + MORE);
    assert_true(st.retention_skips >= 1);
    assert_true(lost > 0 && lost < FIRST + MORE - 40);
    for (size_t r = 0; r < INGEST_REJECT_COUNT; r++)
        assert_int_equal(st.rejected[r], 0);
    assert_int_equal(ap->duplicates, 0);
    ingest_consumer_destroy(c);
    free(ap);
}

static int setup(void **state)
{
    (void)state;
    return harness_stack_start(tmp_dir, "consumer-failures", &redis, &broker, FRESHET_BIN,
                               "--topic f1:2 --topic o2:2 --topic r3:1 --topic ret1:1");
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
        cmocka_unit_test(test_a_restart_skips_applied_intervals_and_resumes_at_the_store_watermark),
        cmocka_unit_test(test_an_oversize_record_is_rejected_and_its_position_still_covered),
        cmocka_unit_test(test_consumption_resumes_after_a_broker_outage_and_nothing_is_lost),
        cmocka_unit_test(test_a_consumer_behind_retention_covers_the_lost_records_and_goes_on),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
