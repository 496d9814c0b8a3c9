/*
 * test_resolver.c - replay resolution (ingest/resolver.c) against the dev
 * broker: partitions from metadata, the log bounds, every verb on a
 * partition with records and on an empty one, DATETIME through the
 * timestamp search (the dev broker answers -1 to offsets_for_times, which
 * a test here checks with plain librdkafka), and the whole-call timeout
 * with the brokers down.
 *
 * One broker process serves every test: topic rt with 2 partitions, of
 * which partition 0 gets 50 records, then (after a 1.1 s pause whose end
 * is recorded as mid_ms) 30 more, and partition 1 stays empty. Expected
 * DATETIME offsets are also computed from the record timestamps as kcat
 * reads them, independently of the resolver. Topic ts holds 100 records
 * whose timestamps the test chose (ties and gaps), for a search checked
 * against a linear scan.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "harness.h"
#include "ingest/ingest.h"

#define TOPIC      "rt"
#define NFIRST     50
#define NSECOND    30
#define NREC       (NFIRST + NSECOND)
#define TIMEOUT_MS 10000
#define TS_TOPIC   "ts" /* records with chosen timestamps: TS_BASE + 10 * (i / 3) */
#define TS_NREC    100
#define TS_BASE    1700000000000LL

static harness_broker_t broker;
static ingest_resolver_t *rs;
static int64_t start_ms, mid_ms, end_ms; /* wall clock: before, between, after */
static int64_t ts[NREC];                 /* record timestamps as kcat reads them */

/* ------------------------------------------------------------------------
 * Helpers.
 * ---------------------------------------------------------------------- */

/* A request on the heap (~16 KiB) from a verb, failing the test on error. */
static psstore_replay_t *replay(const char *verb, const char *arg)
{
    char err[256];
    psstore_replay_t *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    if (psstore_replay_from_verb(r, verb, arg, fr_clock_unix_ms(), err, sizeof(err)) != FR_OK)
        fail_msg("%s %s: %s", verb, arg != NULL ? arg : "", err);
    return r;
}

/* A DATETIME request for at_ms. */
static psstore_replay_t *replay_at(int64_t at_ms)
{
    psstore_replay_t *r = replay("to-earliest", NULL);
    r->kind = PSSTORE_REPLAY_DATETIME;
    r->at_ms = at_ms;
    return r;
}

/* Resolves r for TOPIC/partition and checks the target and the bounds. */
static void expect_target(const psstore_replay_t *r, int32_t partition, int64_t watermark,
                          int64_t want, int64_t want_lo, int64_t want_hi, int line)
{
    int64_t target = -99, lo = -99, hi = -99;
    fr_err_t err =
        ingest_resolver_target(rs, r, TOPIC, partition, watermark, TIMEOUT_MS, &target, &lo, &hi);
    if (err != FR_OK)
        fail_msg("line %d: %s (%s)", line, fr_strerror(err), ingest_resolver_error(rs));
    if (target != want || lo != want_lo || hi != want_hi)
        fail_msg("line %d: target %lld in [%lld, %lld], expected %lld in [%lld, %lld]", line,
                 (long long)target, (long long)lo, (long long)hi, (long long)want,
                 (long long)want_lo, (long long)want_hi);
    assert_string_equal(ingest_resolver_error(rs), "");
}
#define EXPECT_P0(r, wm, want) expect_target((r), 0, (wm), (want), 0, NREC, __LINE__)
#define EXPECT_P1(r, wm)       expect_target((r), 1, (wm), 0, 0, 0, __LINE__)

/* The offset of the first record of partition 0 with timestamp >= at_ms,
 * from kcat's timestamps, or NREC. */
static int64_t first_at_or_after(int64_t at_ms)
{
    for (int i = 0; i < NREC; i++) {
        if (ts[i] >= at_ms)
            return i;
    }
    return NREC;
}

/* Reads the timestamps of partition 0 with kcat into ts[]. */
static int read_timestamps(void)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "kcat -C -b %s -t %s -p 0 -e -o beginning -q -f '%%o %%T\\n'",
             broker.bootstrap, TOPIC);
    FILE *f = popen(cmd, "r");
    if (f == NULL)
        return -1;
    int n = 0;
    long long off, t;
    while (fscanf(f, "%lld %lld", &off, &t) == 2) {
        if (off != n || n >= NREC)
            break;
        ts[n++] = t;
    }
    return pclose(f) == 0 && n == NREC ? 0 : -1;
}

/* ------------------------------------------------------------------------
 * The tests. The first two must run before anything names their topics:
 * the dev broker creates a topic that a request names.
 * ---------------------------------------------------------------------- */

static void test_resolver_unknown_topic_is_not_found(void **state)
{
    (void)state;
    int32_t *parts = (int32_t *)1;
    size_t n = 7;
    assert_int_equal(ingest_resolver_partitions(rs, "no.such.topic", &parts, &n), FR_ERR_NOTFOUND);
    assert_null(parts);
    assert_int_equal(n, 0);
    assert_non_null(strstr(ingest_resolver_error(rs), "no.such.topic"));
    /* and looking did not create it */
    assert_int_equal(ingest_resolver_partitions(rs, "no.such.topic", &parts, &n), FR_ERR_NOTFOUND);
}

static void test_resolver_lists_partitions_in_order(void **state)
{
    (void)state;
    int32_t *parts = NULL;
    size_t n = 0;
    uint64_t t0 = fr_clock_mono_ns();
    assert_int_equal(ingest_resolver_partitions(rs, TOPIC, &parts, &n), FR_OK);
    print_message("partitions from metadata took %.1f ms\n",
                  (double)(fr_clock_mono_ns() - t0) / 1e6);
    assert_int_equal(n, 2);
    assert_int_equal(parts[0], 0);
    assert_int_equal(parts[1], 1);
    assert_string_equal(ingest_resolver_error(rs), "");
    free(parts);
}

/* Documents the fact the timestamp search exists for: the dev broker
 * answers -1 to offsets_for_times even for a time before every record,
 * where a real broker answers 0. Plain librdkafka, not the resolver. */
static void test_dev_broker_answers_minus_one_to_offsets_for_times(void **state)
{
    (void)state;
    char kerr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    assert_int_equal(
        rd_kafka_conf_set(conf, "bootstrap.servers", broker.bootstrap, kerr, sizeof(kerr)),
        RD_KAFKA_CONF_OK);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, kerr, sizeof(kerr));
    assert_non_null(rk);
    rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(list, TOPIC, 0)->offset = start_ms - 60000;
    assert_int_equal(rd_kafka_offsets_for_times(rk, list, TIMEOUT_MS), RD_KAFKA_RESP_ERR_NO_ERROR);
    assert_int_equal(list->elems[0].err, RD_KAFKA_RESP_ERR_NO_ERROR);
    assert_int_equal(list->elems[0].offset, -1);
    rd_kafka_topic_partition_list_destroy(list);
    rd_kafka_destroy(rk);
}

static void test_resolver_earliest_and_latest_are_the_log_bounds(void **state)
{
    (void)state;
    psstore_replay_t *r = replay("to-earliest", NULL);
    EXPECT_P0(r, -1, 0);
    EXPECT_P0(r, 33, 0);
    free(r);
    r = replay("to-latest", NULL);
    EXPECT_P0(r, -1, NREC);
    strcpy(r->topic, TOPIC); /* naming the topic changes nothing */
    EXPECT_P0(r, 12, NREC);
    free(r);
}

static void test_resolver_offset_is_clamped_to_the_log(void **state)
{
    (void)state;
    psstore_replay_t *r = replay("to-offset", "0:17");
    EXPECT_P0(r, -1, 17);
    free(r);
    r = replay("to-offset", "1:3,0:500");
    EXPECT_P0(r, 5, NREC);
    free(r);
    r = replay("to-offset", "0:0");
    EXPECT_P0(r, 40, 0);
    free(r);
}

static void test_resolver_shift_counts_from_the_watermark(void **state)
{
    (void)state;
    psstore_replay_t *r = replay("shift-by", "-20");
    EXPECT_P0(r, 10, 0);  /* 10 - 20, clamped to the log start */
    EXPECT_P0(r, 70, 50); /* 70 - 20 */
    free(r);
    r = replay("shift-by", "5");
    EXPECT_P0(r, 10, 15);
    EXPECT_P0(r, -1, 5);    /* never seen: counts from the log start */
    EXPECT_P0(r, 78, NREC); /* clamped to the log end */
    free(r);
    r = replay("shift-by", "9223372036854775807");
    EXPECT_P0(r, 10, NREC); /* saturates, then clamps */
    free(r);
    r = replay("shift-by", "-9223372036854775808");
    EXPECT_P0(r, 10, 0);
    free(r);
}

static void test_resolver_datetime_finds_the_first_record_at_or_after(void **state)
{
    (void)state;
    psstore_replay_t *r = replay_at(mid_ms);
    uint64_t t0 = fr_clock_mono_ns();
    EXPECT_P0(r, -1, NFIRST);
    double took = (double)(fr_clock_mono_ns() - t0) / 1e6;
    print_message("DATETIME resolution by search over %d records took %.1f ms\n", NREC, took);
    assert_true(first_at_or_after(mid_ms) == NFIRST); /* kcat agrees */

    /* every distinct timestamp, and one millisecond past it, against kcat's
     * view of the records */
    for (int i = 0; i < NREC; i++) {
        if (i > 0 && ts[i] == ts[i - 1])
            continue;
        r->at_ms = ts[i];
        EXPECT_P0(r, -1, first_at_or_after(ts[i]));
        r->at_ms = ts[i] + 1;
        EXPECT_P0(r, -1, first_at_or_after(ts[i] + 1));
    }

    /* through the verb and the stored text, as the consumer will see it */
    char text[64], iso[64];
    time_t secs = (time_t)(mid_ms / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    snprintf(iso, sizeof(iso), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(mid_ms % 1000));
    free(r);
    r = replay("to-datetime", iso);
    assert_true(r->at_ms == mid_ms);
    assert_int_equal(psstore_replay_format(r, text, sizeof(text)), FR_OK);
    assert_int_equal(psstore_replay_parse(r, text, strlen(text), NULL, 0), FR_OK);
    EXPECT_P0(r, 3, NFIRST);
    free(r);
}

static void test_resolver_datetime_before_everything_is_the_log_start(void **state)
{
    (void)state;
    psstore_replay_t *r = replay_at(start_ms - 60000);
    EXPECT_P0(r, -1, 0);
    r->at_ms = ts[0];
    EXPECT_P0(r, -1, 0);
    free(r);
    r = replay("to-datetime", "1969-12-31T23:59:59.999Z"); /* -1 ms: never sent as a sentinel */
    EXPECT_P0(r, 25, 0);
    free(r);
    r = replay("by-duration", "P365D");
    EXPECT_P0(r, 25, 0);
    free(r);
}

static void test_resolver_datetime_in_the_future_is_the_log_end(void **state)
{
    (void)state;
    psstore_replay_t *r = replay_at(end_ms + 3600 * 1000);
    EXPECT_P0(r, -1, NREC);
    r->at_ms = ts[NREC - 1] + 1;
    EXPECT_P0(r, -1, NREC);
    r->at_ms = ts[NREC - 1];
    EXPECT_P0(r, -1, first_at_or_after(ts[NREC - 1]));
    free(r);
}

static void test_resolver_empty_partition_resolves_to_0_for_every_verb(void **state)
{
    (void)state;
    psstore_replay_t *r = replay("to-earliest", NULL);
    EXPECT_P1(r, -1);
    free(r);
    r = replay("to-latest", NULL);
    EXPECT_P1(r, -1);
    free(r);
    r = replay("to-offset", "1:5");
    EXPECT_P1(r, -1);
    free(r);
    r = replay("shift-by", "5");
    EXPECT_P1(r, -1);
    EXPECT_P1(r, 3);
    free(r);
    r = replay("shift-by", "-5");
    EXPECT_P1(r, 3);
    free(r);
    r = replay_at(mid_ms);
    EXPECT_P1(r, -1);
    r->at_ms = end_ms + 3600 * 1000;
    EXPECT_P1(r, -1);
    free(r);
}

static void test_resolver_refuses_a_replay_that_does_not_move_the_partition(void **state)
{
    (void)state;
    int64_t target = -99, lo = -99, hi = -99;
    psstore_replay_t *r = replay("to-earliest", NULL);
    strcpy(r->topic, "other");
    assert_int_equal(ingest_resolver_target(rs, r, TOPIC, 0, -1, TIMEOUT_MS, &target, &lo, &hi),
                     FR_ERR_INVAL);
    assert_non_null(strstr(ingest_resolver_error(rs), "other"));
    assert_true(target == -99 && lo == -99 && hi == -99);
    free(r);
    r = replay("to-offset", "1:3");
    assert_int_equal(ingest_resolver_target(rs, r, TOPIC, 0, -1, TIMEOUT_MS, &target, &lo, &hi),
                     FR_ERR_INVAL);
    free(r);
    /* a partition the topic does not have */
    r = replay("to-latest", NULL);
    assert_int_equal(ingest_resolver_target(rs, r, TOPIC, 9, -1, TIMEOUT_MS, &target, &lo, &hi),
                     FR_ERR_NOTFOUND);
    assert_int_equal(ingest_resolver_target(rs, NULL, TOPIC, 0, -1, TIMEOUT_MS, &target, &lo, &hi),
                     FR_ERR_INVAL);
    free(r);
}

/* The timestamp of record i of TS_TOPIC: ties of three, 10 ms apart. */
static int64_t ts_of(int i)
{
    return TS_BASE + 10 * (i / 3);
}

/* On TS_TOPIC, every time from before the first record to after the last,
 * at each record's stamp, one before and one after, gives what a linear
 * scan of the stamps gives. */
static void test_resolver_datetime_search_matches_a_linear_scan(void **state)
{
    (void)state;
    psstore_replay_t *r = replay_at(0);
    for (int64_t at = TS_BASE - 1; at <= ts_of(TS_NREC - 1) + 1; at++) {
        if (at % 10 != 9 && at % 10 != 0 && at % 10 != 1)
            continue;
        int64_t want = TS_NREC, target = -99, lo, hi;
        for (int i = 0; i < TS_NREC && want == TS_NREC; i++) {
            if (ts_of(i) >= at)
                want = i;
        }
        r->at_ms = at;
        fr_err_t err =
            ingest_resolver_target(rs, r, TS_TOPIC, 0, -1, TIMEOUT_MS, &target, &lo, &hi);
        if (err != FR_OK || target != want || lo != 0 || hi != TS_NREC)
            fail_msg("at %lld: %s, target %lld in [%lld, %lld], expected %lld (%s)", (long long)at,
                     fr_strerror(err), (long long)target, (long long)lo, (long long)hi,
                     (long long)want, ingest_resolver_error(rs));
    }
    free(r);
}

/* Last but one: with the brokers down a DATETIME resolution fails with
 * FR_ERR_KAFKA once timeout_ms has passed for the whole call, not per
 * request: not before 1 s, and not 10 s later (10 times the timeout,
 * which a resolution that waits on a broker that is down, as
 * rd_kafka_query_watermark_offsets does, exceeds, and no slow machine). */
static void test_resolver_gives_up_after_timeout_ms_with_brokers_down(void **state)
{
    (void)state;
    int64_t target = -99, lo = -99, hi = -99;
    psstore_replay_t *r = replay_at(mid_ms);
    int downs = harness_file_count(broker.log, "brokers down");
    assert_int_equal(kill(broker.pid, SIGUSR1), 0);
    /* the broker takes them down in its own time (it sees the signal
     * within 50 ms, unless the machine is busy) and says so */
    if (harness_await_file(broker.log, "brokers down", downs + 1, 10000) != 0)
        fail_msg("the broker did not take its brokers down in 10 s (see %s)", broker.log);
    uint64_t t0 = fr_clock_mono_ns();
    fr_err_t err = ingest_resolver_target(rs, r, TOPIC, 0, -1, 1000, &target, &lo, &hi);
    double took = (double)(fr_clock_mono_ns() - t0) / 1e6;
    assert_int_equal(kill(broker.pid, SIGUSR2), 0);
    print_message("with the brokers down: %s after %.0f ms (%s)\n", fr_strerror(err), took,
                  ingest_resolver_error(rs));
    assert_int_equal(err, FR_ERR_KAFKA);
    assert_true(ingest_resolver_error(rs)[0] != '\0');
    assert_true(took >= 900 && took < 10000);
    assert_true(target == -99 && lo == -99 && hi == -99); /* untouched on failure */

    /* and it recovers once they are back */
    for (int i = 0; i < 100; i++) {
        if (ingest_resolver_target(rs, r, TOPIC, 0, -1, 1000, &target, &lo, &hi) == FR_OK)
            break;
        harness_sleep_ms(100);
    }
    EXPECT_P0(r, -1, NFIRST);
    free(r);
}

/* Last: bad properties are refused by name; group.id is dropped. */
static void test_resolver_new_refuses_bad_properties(void **state)
{
    (void)state;
    char err[256] = "";
    const char *const bad[][2] = {{"no.such.property", "1"}};
    assert_null(ingest_resolver_new(broker.bootstrap, bad, 1, err, sizeof(err)));
    assert_non_null(strstr(err, "no.such.property"));
    /* a group.id among the properties is dropped, not an error */
    const char *const grp[][2] = {{"group.id", "freshet.model"}, {"fetch.wait.max.ms", "500"}};
    ingest_resolver_t *other = ingest_resolver_new(broker.bootstrap, grp, 2, err, sizeof(err));
    assert_non_null(other);
    psstore_replay_t *r = replay_at(mid_ms);
    int64_t target, lo, hi;
    assert_int_equal(ingest_resolver_target(other, r, TOPIC, 0, -1, TIMEOUT_MS, &target, &lo, &hi),
                     FR_OK);
    assert_true(target == NFIRST);
    free(r);
    ingest_resolver_destroy(other);
    ingest_resolver_destroy(NULL);
}

/* ------------------------------------------------------------------------
 * Setup: the broker, the records, the resolver.
 * ---------------------------------------------------------------------- */

/* Produces n records "rec <i>" to TOPIC/0 and waits until all are in. */
static int produce(ingest_producer_t *p, int first, int n)
{
    char value[32];
    for (int i = first; i < first + n; i++) {
        int len = snprintf(value, sizeof(value), "rec %d", i);
        if (ingest_producer_send(p, TOPIC, 0, NULL, 0, value, (size_t)len, NULL, NULL) != FR_OK)
            return -1;
    }
    uint64_t delivered = 0, failed = 0;
    if (ingest_producer_flush(p, TIMEOUT_MS, &delivered, &failed) != FR_OK ||
        delivered != (uint64_t)(first + n) || failed != 0) {
        fprintf(stderr, "produce: %llu delivered, %llu failed: %s\n", (unsigned long long)delivered,
                (unsigned long long)failed, ingest_producer_error(p));
        return -1;
    }
    return 0;
}

/* Produces TS_NREC records with the timestamps ts_of(i) to TS_TOPIC/0 with
 * plain librdkafka (ingest_producer_send stamps the produce time). */
static int produce_stamped(void)
{
    char kerr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", broker.bootstrap, kerr, sizeof(kerr)) !=
        RD_KAFKA_CONF_OK) {
        rd_kafka_conf_destroy(conf);
        return -1;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, kerr, sizeof(kerr));
    if (rk == NULL) {
        rd_kafka_conf_destroy(conf);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < TS_NREC && rc == 0; i++) {
        char value[16];
        int len = snprintf(value, sizeof(value), "%d", i);
        if (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(TS_TOPIC), RD_KAFKA_V_PARTITION(0),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                              RD_KAFKA_V_VALUE(value, (size_t)len), RD_KAFKA_V_TIMESTAMP(ts_of(i)),
                              RD_KAFKA_V_END) != 0)
            rc = -1;
    }
    if (rd_kafka_flush(rk, TIMEOUT_MS) != RD_KAFKA_RESP_ERR_NO_ERROR || rd_kafka_outq_len(rk) != 0)
        rc = -1;
    rd_kafka_destroy(rk);
    return rc;
}

static int setup(void **state)
{
    (void)state;
    char err[512];
    if (harness_broker_start(&broker, FRESHET_BIN, "--topic " TOPIC ":2 --topic " TS_TOPIC ":1") !=
        0)
        return -1;
    if (produce_stamped() != 0) {
        fprintf(stderr, "setup: could not produce to %s\n", TS_TOPIC);
        return -1;
    }
    ingest_producer_t *p = ingest_producer_new(broker.bootstrap, NULL, 0, err, sizeof(err));
    if (p == NULL) {
        fprintf(stderr, "producer: %s\n", err);
        return -1;
    }
    start_ms = fr_clock_unix_ms();
    int rc = produce(p, 0, NFIRST);
    harness_sleep_ms(1100);
    mid_ms = fr_clock_unix_ms();
    if (rc == 0)
        rc = produce(p, NFIRST, NSECOND);
    end_ms = fr_clock_unix_ms();
    ingest_producer_destroy(p);
    if (rc != 0 || read_timestamps() != 0) {
        fprintf(stderr, "setup: could not produce or read back the records\n");
        return -1;
    }
    rs = ingest_resolver_new(broker.bootstrap, NULL, 0, err, sizeof(err));
    if (rs == NULL) {
        fprintf(stderr, "resolver: %s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    ingest_resolver_destroy(rs);
    rs = NULL;
    if (broker.pid > 0)
        harness_broker_stop(&broker);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resolver_unknown_topic_is_not_found),
        cmocka_unit_test(test_resolver_lists_partitions_in_order),
        cmocka_unit_test(test_dev_broker_answers_minus_one_to_offsets_for_times),
        cmocka_unit_test(test_resolver_earliest_and_latest_are_the_log_bounds),
        cmocka_unit_test(test_resolver_offset_is_clamped_to_the_log),
        cmocka_unit_test(test_resolver_shift_counts_from_the_watermark),
        cmocka_unit_test(test_resolver_datetime_finds_the_first_record_at_or_after),
        cmocka_unit_test(test_resolver_datetime_before_everything_is_the_log_start),
        cmocka_unit_test(test_resolver_datetime_in_the_future_is_the_log_end),
        cmocka_unit_test(test_resolver_empty_partition_resolves_to_0_for_every_verb),
        cmocka_unit_test(test_resolver_datetime_search_matches_a_linear_scan),
        cmocka_unit_test(test_resolver_refuses_a_replay_that_does_not_move_the_partition),
        cmocka_unit_test(test_resolver_gives_up_after_timeout_ms_with_brokers_down),
        cmocka_unit_test(test_resolver_new_refuses_bad_properties),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
