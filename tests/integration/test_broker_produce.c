/*
 * test_broker_produce.c - "freshet broker" and "freshet produce" against
 * each other and against independent clients: kcat (producer and consumer)
 * and a plain librdkafka consumer written here.
 *
 * One broker process serves every test (topics t1..t11, see setup); data
 * files and logs go to a private temporary folder. Records are checked
 * value for value with ingest_decode against the floats the data file was
 * written from.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <librdkafka/rdkafka.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "harness.h"
#include "ingest/ingest.h"

#define NREC 25
#define D    3

static harness_broker_t broker;
static char tmp_dir[256];
static char data_csv[300];
static float xs[NREC][D], ys[NREC]; /* what data_csv holds */

/* ------------------------------------------------------------------------
 * Helpers.
 * ---------------------------------------------------------------------- */

/* Runs FRESHET_BIN with args (a NULL-terminated list) for up to timeout_ms;
 * its exit status, or -1 (killed) when it did not exit in time. */
#define run_freshet(log, timeout_ms, ...) harness_command(log, timeout_ms, FRESHET_BIN, __VA_ARGS__)

/*
 * Runs a shell command and returns everything it wrote on stdout (binary
 * safe) in a malloc'ed buffer the caller frees, NUL-terminated, its length
 * in *len. Fails the test when the command exits non-zero.
 */
static char *capture(size_t *len, const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (;;) {
        if (n + 1 == cap) {
            buf = realloc(buf, cap *= 2);
            assert_non_null(buf);
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        if (got == 0)
            break;
        n += got;
    }
    buf[n] = '\0';
    int status = pclose(f);
    if (status != 0)
        fail_msg("'%s' failed (status %d)", cmd, status);
    *len = n;
    return buf;
}

/* The log file path of a test step, in the private folder. */
static void log_path(char *out, size_t size, const char *name)
{
    snprintf(out, size, "%s/%s.log", tmp_dir, name);
}

/* Prints a log (for a failing assertion's context). */
static void dump(const char *path)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "echo '--- %s'; cat '%s' >&2", path, path);
    if (system(cmd) != 0)
        fprintf(stderr, "(no log)\n");
}

/* Decodes one record and checks it is sample i of the data file, exactly. */
static void check_record(ingest_format_t format, const void *rec, size_t len, size_t i)
{
    ingest_schema_t s = {.features = D, .label = INGEST_LABEL_REAL};
    float x[D], y;
    assert_true(i < NREC);
    ingest_reject_t r = ingest_decode(&s, format, rec, len, x, &y);
    if (r != INGEST_OK)
        fail_msg("record of sample %zu rejected: %s", i, ingest_reject_name(r));
    assert_memory_equal(&y, &ys[i], sizeof(float));
    assert_memory_equal(x, xs[i], sizeof(x));
}

/* The records per partition of topic, counted from kcat's "%p" lines. */
static size_t count_partitions(const char *topic, size_t *per, int nparts)
{
    size_t len, total = 0;
    char *out = capture(&len, "kcat -C -b %s -t %s -e -o beginning -q -f '%%p:%%o:%%S\\n'",
                        broker.bootstrap, topic);
    memset(per, 0, (size_t)nparts * sizeof(*per));
    for (char *line = strtok(out, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        int p = atoi(line);
        assert_true(p >= 0 && p < nparts);
        per[p]++;
        total++;
    }
    free(out);
    return total;
}

/*
 * Consumes every record of a text topic with kcat as "key value" lines and
 * checks each against the data file's sample named by its key; returns the
 * count.
 */
static size_t check_text_topic(const char *topic, ingest_format_t format)
{
    size_t len, n = 0;
    char *out = capture(&len, "kcat -C -b %s -t %s -e -o beginning -q -f '%%k %%s\\n'",
                        broker.bootstrap, topic);
    char *save = NULL;
    for (char *line = strtok_r(out, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        char *sp = strchr(line, ' ');
        assert_non_null(sp);
        *sp = '\0';
        check_record(format, sp + 1, strlen(sp + 1), (size_t)atoi(line));
        n++;
    }
    free(out);
    return n;
}

/* ------------------------------------------------------------------------
 * Tests.
 * ---------------------------------------------------------------------- */

/* (a) f32 records, round robin over 4 partitions, read back by kcat. */
static void test_produce_f32_round_robin_is_read_back_exactly_by_kcat(void **state)
{
    char log[400];
    log_path(log, sizeof(log), "produce_f32");
    int rc = run_freshet(log, 30000, "produce", "--bootstrap", broker.bootstrap, "--topic", "t1",
                         "--data", data_csv, "--format", "csv", "--features", "3", "--encode",
                         "f32", "--partitions-by", "roundrobin", "-X", "linger.ms=5", NULL);
    if (rc != 0)
        dump(log);
    assert_int_equal(rc, 0);
    assert_true(harness_file_contains(log, "produced 25 records to t1 (0 failed)"));

    size_t per[4];
    assert_int_equal(count_partitions("t1", per, 4), NREC);
    for (int p = 0; p < 4; p++) {
        assert_int_equal(per[p], p == 0 ? 7 : 6);
        /* the payloads of one partition, concatenated in offset order */
        size_t len;
        char *out = capture(&len, "kcat -C -b %s -t t1 -p %d -e -o beginning -q -f '%%s'",
                            broker.bootstrap, p);
        size_t rec = 4 * (D + 1);
        assert_int_equal(len, per[p] * rec);
        for (size_t k = 0; k < per[p]; k++)
            check_record(INGEST_FORMAT_F32, out + k * rec, rec, (size_t)p + 4 * k);
        free(out);
    }
}

/*
 * (a') --partitions-by sticky: no key, and librdkafka's sticky partitioner
 * keeps one partition for sticky.partitioning.linger.ms (a minute here).
 * Until it knows the partitions' leaders (a few ms after the metadata) it
 * picks again for each record, so the records are paced at 25/s and only
 * those sent after 400 ms (samples 10..24) must share one partition. Every
 * sample arrives once, keyless (kcat's %K prints -1), exactly, and each
 * partition holds its samples in file order.
 */
static void test_produce_sticky_sends_keyless_runs_to_one_partition(void **state)
{
    (void)state;
    char log[400];
    log_path(log, sizeof(log), "produce_sticky");
    int rc = run_freshet(log, 30000, "produce", "--bootstrap", broker.bootstrap, "--topic", "t11",
                         "--data", data_csv, "--format", "csv", "--features", "3", "--encode",
                         "f32", "--rate", "25", "--partitions-by", "sticky", "-X",
                         "sticky.partitioning.linger.ms=60000", NULL);
    if (rc != 0)
        dump(log);
    assert_int_equal(rc, 0);
    assert_true(harness_file_contains(log, "produced 25 records to t11 (0 failed)"));

    size_t per[4];
    assert_int_equal(count_partitions("t11", per, 4), NREC);
    int seen[NREC] = {0}, late = -1;
    size_t rec = 4 * (D + 1);
    ingest_schema_t sch = {.features = D, .label = INGEST_LABEL_REAL};
    for (int p = 0; p < 4; p++) {
        size_t len;
        char *keys = capture(&len, "kcat -C -b %s -t t11 -p %d -e -o beginning -q -f '%%K,'",
                             broker.bootstrap, p);
        assert_int_equal(len, 3 * per[p]);
        for (size_t k = 0; k < per[p]; k++)
            assert_memory_equal(keys + 3 * k, "-1,", 3);
        free(keys);
        char *out = capture(&len, "kcat -C -b %s -t t11 -p %d -e -o beginning -q -f '%%s'",
                            broker.bootstrap, p);
        assert_int_equal(len, per[p] * rec);
        int last = -1;
        for (size_t k = 0; k < per[p]; k++) {
            float x[D], y;
            assert_int_equal(ingest_decode(&sch, INGEST_FORMAT_F32, out + k * rec, rec, x, &y),
                             INGEST_OK);
            int i = (int)lrintf(x[0] * 3.0f); /* sample i has x0 = i / 3 */
            assert_true(i > last && i < NREC);
            check_record(INGEST_FORMAT_F32, out + k * rec, rec, (size_t)i);
            seen[i]++;
            last = i;
            if (i >= 10) {
                assert_true(late == -1 || late == p);
                late = p;
            }
        }
        free(out);
    }
    for (int i = 0; i < NREC; i++)
        assert_int_equal(seen[i], 1);
}

/*
 * Reads every record of partition 0 of topic from the beginning with a
 * plain librdkafka consumer (assign, no group commits) until the end of
 * the partition; returns them as "value\n" lines in a malloc'ed string.
 */
static char *consume_all(const char *topic)
{
    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    assert_int_equal(
        rd_kafka_conf_set(conf, "bootstrap.servers", broker.bootstrap, errstr, sizeof(errstr)),
        RD_KAFKA_CONF_OK);
    assert_int_equal(rd_kafka_conf_set(conf, "group.id", "test", errstr, sizeof(errstr)),
                     RD_KAFKA_CONF_OK);
    assert_int_equal(rd_kafka_conf_set(conf, "enable.auto.commit", "false", errstr, sizeof(errstr)),
                     RD_KAFKA_CONF_OK);
    assert_int_equal(
        rd_kafka_conf_set(conf, "enable.partition.eof", "true", errstr, sizeof(errstr)),
        RD_KAFKA_CONF_OK);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    assert_non_null(rk);
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(parts, topic, 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    assert_int_equal(rd_kafka_assign(rk, parts), RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_topic_partition_list_destroy(parts);
    size_t cap = 4096, n = 0;
    char *out = calloc(1, cap);
    assert_non_null(out);
    uint64_t deadline = fr_clock_mono_ns() + 20000000000ull;
    for (int eof = 0; !eof;) {
        assert_true(fr_clock_mono_ns() < deadline);
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
        if (m == NULL)
            continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            eof = 1;
        } else {
            assert_int_equal(m->err, RD_KAFKA_RESP_ERR_NO_ERROR);
            assert_true(n + m->len + 2 < cap);
            memcpy(out + n, m->payload, m->len);
            n += m->len;
            out[n++] = '\n';
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return out;
}

/* (b) kcat as an independent producer; a librdkafka consumer reads back. */
static void test_kcat_produced_records_are_consumed_intact(void **state)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "printf '1,0.5,2,3\\n0,-1.25,0,7\\n1,1e-3,4,5\\n' | kcat -P -b %s -t t2 -p 0",
             broker.bootstrap);
    assert_int_equal(system(cmd), 0);
    char *out = consume_all("t2");
    assert_string_equal(out, "1,0.5,2,3\n0,-1.25,0,7\n1,1e-3,4,5\n");
    ingest_schema_t s = {.features = D, .label = INGEST_LABEL_CLASS, .classes = 2};
    float x[D], y;
    char *line = strtok(out, "\n");
    assert_int_equal(ingest_decode(&s, INGEST_FORMAT_CSV, line, strlen(line), x, &y), INGEST_OK);
    assert_true(y == 1.0f && x[0] == 0.5f && x[1] == 2.0f && x[2] == 3.0f);
    free(out);
}

/* (c) csv and libsvm records, partitioned by key, decoded by their key. */
static void test_produce_csv_and_libsvm_round_trip_exactly(void **state)
{
    const char *topic[2] = {"t3", "t4"}, *encode[2] = {"csv", "libsvm"};
    const ingest_format_t format[2] = {INGEST_FORMAT_CSV, INGEST_FORMAT_LIBSVM};
    for (int k = 0; k < 2; k++) {
        char log[400];
        log_path(log, sizeof(log), encode[k]);
        int rc = run_freshet(log, 30000, "produce", "--bootstrap", broker.bootstrap, "--topic",
                             topic[k], "--data", data_csv, "--format", "csv", "--features", "3",
                             "--encode", encode[k], "-X", "linger.ms=5", NULL);
        if (rc != 0)
            dump(log);
        assert_int_equal(rc, 0);
        assert_int_equal(check_text_topic(topic[k], format[k]), NREC);
    }
}

/* (d) brokers down (SIGUSR1) when produce starts, back up (SIGUSR2) later. */
static void test_produce_waits_for_brokers_that_come_back(void **state)
{
    char log[400];
    log_path(log, sizeof(log), "outage");
    assert_int_equal(kill(broker.pid, SIGUSR1), 0);
    harness_sleep_ms(300);
    char *argv[] = {FRESHET_BIN,   "produce",
                    "--bootstrap", broker.bootstrap,
                    "--topic",     "t5",
                    "--data",      data_csv,
                    "--format",    "csv",
                    "--features",  "3",
                    "--encode",    "f32",
                    "-X",          "linger.ms=5",
                    "-X",          "reconnect.backoff.max.ms=200",
                    NULL};
    pid_t pid = harness_spawn(argv, log);
    assert_true(pid > 0);
    harness_sleep_ms(1000);
    assert_int_equal(harness_wait(pid, 0), -1); /* still waiting for the brokers */
    assert_int_equal(kill(broker.pid, SIGUSR2), 0);
    int status = harness_wait(pid, 30000);
    if (status == -1) {
        kill(pid, SIGKILL);
        harness_wait(pid, 5000);
    }
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        dump(log);
    assert_true(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_true(harness_file_contains(log, "produced 25 records to t5 (0 failed)"));
    assert_true(harness_file_contains(broker.log, "brokers down"));
    assert_true(harness_file_contains(broker.log, "brokers up"));
    size_t per[1];
    assert_int_equal(count_partitions("t5", per, 1), NREC);
}

/* (e) nothing listening: every record fails within message.timeout.ms. */
static void test_produce_to_nothing_fails_within_the_message_timeout(void **state)
{
    char log[400], bootstrap[64];
    log_path(log, sizeof(log), "nothing");
    int held, port = harness_closed_port(&held); /* no other process can listen there meanwhile */
    assert_true(port > 0);
    snprintf(bootstrap, sizeof(bootstrap), "127.0.0.1:%d", port);
    uint64_t t0 = fr_clock_mono_ns();
    int rc = run_freshet(log, 15000, "produce", "--bootstrap", bootstrap, "--topic", "t1", "--data",
                         data_csv, "--format", "csv", "--features", "3", "--encode", "csv", "-X",
                         "message.timeout.ms=2000", NULL);
    double secs = (double)(fr_clock_mono_ns() - t0) * 1e-9;
    if (rc != 1)
        dump(log);
    assert_int_equal(rc, 1);
    assert_true(secs < 8.0); /* 2 s, plus librdkafka's 1 s timeout scan, plus start */
    assert_true(harness_file_contains(log, "produced 0 records to t1 (25 failed)"));
    close(held);
}

/* Bad arguments and a bad property are exit status 2, naming the problem. */
static void test_produce_rejects_bad_arguments_with_status_2(void **state)
{
    char log[400];
    log_path(log, sizeof(log), "badargs");
    assert_int_equal(run_freshet(log, 10000, "produce", "--bootstrap", broker.bootstrap, "--topic",
                                 "t1", "--data", data_csv, "--format", "csv", "--features", "3",
                                 "--encode", "idx", NULL),
                     2);
    assert_int_equal(run_freshet(log, 10000, "produce", "--bootstrap", broker.bootstrap, "--topic",
                                 "t1", "--data", data_csv, "--format", "csv", "--features", "3",
                                 "--encode", "csv", "-X", "no.such.prop=1", NULL),
                     2);
    assert_true(harness_file_contains(log, "no.such.prop"));
    assert_int_equal(run_freshet(log, 10000, "produce", "--bootstrap", broker.bootstrap, "--topic",
                                 "t1", "--data", "/nonexistent.csv", "--format", "csv",
                                 "--features", "3", "--encode", "csv", NULL),
                     2);
}

/* --limit and --loop: 60 records from a 25-record file, at --rate. */
static void test_produce_loops_until_the_limit(void **state)
{
    char log[400];
    log_path(log, sizeof(log), "loop");
    uint64_t t0 = fr_clock_mono_ns();
    int rc =
        run_freshet(log, 30000, "produce", "--bootstrap", broker.bootstrap, "--topic", "t6",
                    "--data", data_csv, "--format", "csv", "--features", "3", "--encode", "csv",
                    "--loop", "--limit", "60", "--rate", "200", "-X", "linger.ms=5", NULL);
    double secs = (double)(fr_clock_mono_ns() - t0) * 1e-9;
    if (rc != 0)
        dump(log);
    assert_int_equal(rc, 0);
    assert_true(secs >= 0.25); /* 60 records at 200/s take 0.3 s */
    assert_true(harness_file_contains(log, "produced 60 records to t6 (0 failed)"));
    assert_int_equal(check_text_topic("t6", INGEST_FORMAT_CSV), 60);
}

/* The synthetic click stream to a topic: every record, keyed by its index,
 * is the line the same seed writes to a file, round robin over 2 partitions. */
static void test_produce_synthetic_ctr_sends_the_seeded_stream(void **state)
{
    (void)state;
    char log[400], log2[400], file[400];
    log_path(log, sizeof(log), "ctr");
    log_path(log2, sizeof(log2), "ctr-file");
    snprintf(file, sizeof(file), "%s/ctr.txt", tmp_dir);
    int rc = run_freshet(log, 30000, "produce", "--synthetic", "ctr", "--seed", "9", "--bootstrap",
                         broker.bootstrap, "--topic", "t8", "--limit", "300", "--partitions-by",
                         "roundrobin", NULL);
    if (rc != 0)
        dump(log);
    assert_int_equal(rc, 0);
    assert_true(harness_file_contains(log, "produced 300 records to t8 (0 failed)"));
    assert_true(harness_file_contains(log, "synthetic ctr: 300 records, click rate"));
    assert_int_equal(run_freshet(log2, 30000, "produce", "--synthetic", "ctr", "--seed", "9",
                                 "--out", file, "--limit", "300", NULL),
                     0);
    size_t per[2];
    assert_int_equal(count_partitions("t8", per, 2), 300);
    assert_int_equal(per[0], 150);
    size_t flen, len, n = 0;
    char *lines = capture(&flen, "cat '%s'", file);
    char *out =
        capture(&len, "kcat -C -b %s -t t8 -e -o beginning -q -f '%%k %%s\\n'", broker.bootstrap);
    char *want[300], *save = NULL;
    for (char *l = strtok_r(lines, "\n", &save); l != NULL && n < 300;
         l = strtok_r(NULL, "\n", &save))
        want[n++] = l;
    assert_int_equal(n, 300);
    size_t got = 0;
    save = NULL;
    for (char *l = strtok_r(out, "\n", &save); l != NULL; l = strtok_r(NULL, "\n", &save)) {
        char *sp = strchr(l, ' ');
        assert_non_null(sp);
        *sp = '\0';
        int i = atoi(l);
        assert_true(i >= 0 && i < 300);
        assert_string_equal(sp + 1, want[i]);
        got++;
    }
    assert_int_equal(got, 300);
    free(lines);
    free(out);
}

/*
 * The records of topic as kcat gives them, "%k:%S:%s" one after the other
 * (binary values may hold any byte): for each, the key (a decimal index
 * below n) and the value, checked against want[key]; returns how many.
 */
static size_t check_topic_values(const char *topic, char *const *want, const size_t *want_len,
                                 size_t n)
{
    size_t len, got = 0;
    char *out = capture(&len, "kcat -C -b %s -t %s -e -o beginning -q -D '' -f '%%k:%%S:%%s'",
                        broker.bootstrap, topic);
    for (size_t at = 0; at < len; got++) {
        char *end;
        unsigned long key = strtoul(out + at, &end, 10);
        assert_true(*end == ':' && key < n);
        unsigned long vlen = strtoul(end + 1, &end, 10);
        assert_true(*end == ':');
        at = (size_t)(end + 1 - out);
        assert_true(at + vlen <= len);
        assert_int_equal(vlen, want_len[key]);
        assert_memory_equal(out + at, want[key], vlen);
        at += vlen;
    }
    free(out);
    return got;
}

/*
 * A Criteo file to a topic as binary records, and a binary file as it
 * is: every good record arrives, keyed by its index in the file, as the
 * binary record the synthetic stream writes for the same line; a line
 * that does not parse is skipped and named.
 */
static void test_produce_sends_sparse_files_as_binary_records(void **state)
{
    (void)state;
    enum { N = 200 };
    char log[400], text[400], bin[400];
    log_path(log, sizeof(log), "sparse-files");
    snprintf(text, sizeof(text), "%s/ctr11.txt", tmp_dir);
    snprintf(bin, sizeof(bin), "%s/ctr11.bin", tmp_dir);
    assert_int_equal(run_freshet(log, 30000, "produce", "--synthetic", "ctr", "--seed", "11",
                                 "--out", text, "--limit", "200", NULL),
                     0);
    assert_int_equal(run_freshet(log, 30000, "produce", "--synthetic", "ctr", "--seed", "11",
                                 "--encode", "binary", "--out", bin, "--limit", "200", NULL),
                     0);
    FILE *f = fopen(text, "a");
    assert_non_null(f);
    fputs("1\t2\n", f); /* record 201: too few columns */
    assert_int_equal(fclose(f), 0);
    static char *want[N];
    size_t want_len[N];
    char err[256];
    ingest_file_t *in = ingest_file_open(bin, 1024, err, sizeof(err));
    assert_non_null(in);
    for (int i = 0; i < N; i++) {
        const void *rec;
        assert_int_equal(ingest_file_framed(in, &rec, &want_len[i], err, sizeof(err)), FR_OK);
        want[i] = malloc(want_len[i]);
        memcpy(want[i], rec, want_len[i]);
    }
    ingest_file_close(in);

    const char *runs[][3] = {{text, "criteo", "t9"}, {bin, "binary", "t10"}};
    for (int k = 0; k < 2; k++) {
        int rc = run_freshet(log, 30000, "produce", "--data", runs[k][0], "--format", runs[k][1],
                             "--encode", "binary", "--bootstrap", broker.bootstrap, "--topic",
                             runs[k][2], "--partitions-by", "roundrobin", NULL);
        if (rc != 0)
            dump(log);
        assert_int_equal(rc, 0);
        char line[64];
        snprintf(line, sizeof(line), "produced 200 records to %s (0 failed)", runs[k][2]);
        assert_true(harness_file_contains(log, line));
        assert_int_equal(check_topic_values(runs[k][2], want, want_len, N), N);
    }
    assert_true(harness_file_contains(log, "1 record(s) skipped (the first, record 201: columns)"));
    for (int i = 0; i < N; i++)
        free(want[i]);
}

/* A file of raw bytes, for the idx test. */
static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* idx without --features: 5 images of 2x3 pixels are records of 6 features
 * (f32: 4 * (6 + 1) = 28 bytes), pixel / 255 and the label; a --features
 * that disagrees with the header is exit status 2. */
static void test_produce_idx_takes_the_features_from_the_images_header(void **state)
{
    enum { N = 5, ROWS = 2, COLS = 3, DI = ROWS * COLS };
    unsigned char img[16 + N * DI], lab[8 + N];
    const unsigned char img_hdr[16] = {0, 0, 8, 3, 0, 0, 0, N, 0, 0, 0, ROWS, 0, 0, 0, COLS};
    const unsigned char lab_hdr[8] = {0, 0, 8, 1, 0, 0, 0, N};
    memcpy(img, img_hdr, sizeof(img_hdr));
    memcpy(lab, lab_hdr, sizeof(lab_hdr));
    for (int i = 0; i < N * DI; i++)
        img[16 + i] = (unsigned char)(i * 37 % 256);
    for (int i = 0; i < N; i++)
        lab[8 + i] = (unsigned char)(i % 3);
    char img_path[320], lab_path[320], log[400];
    snprintf(img_path, sizeof(img_path), "%s/images.idx", tmp_dir);
    snprintf(lab_path, sizeof(lab_path), "%s/labels.idx", tmp_dir);
    write_file(img_path, img, sizeof(img));
    write_file(lab_path, lab, sizeof(lab));

    log_path(log, sizeof(log), "idx_features");
    assert_int_equal(run_freshet(log, 10000, "produce", "--bootstrap", broker.bootstrap, "--topic",
                                 "t7", "--data", img_path, "--labels", lab_path, "--format", "idx",
                                 "--encode", "f32", "--features", "7", NULL),
                     2);
    assert_true(harness_file_contains(log, "whose images are 6 features"));

    log_path(log, sizeof(log), "idx");
    int rc = run_freshet(log, 30000, "produce", "--bootstrap", broker.bootstrap, "--topic", "t7",
                         "--data", img_path, "--labels", lab_path, "--format", "idx", "--encode",
                         "f32", NULL);
    if (rc != 0)
        dump(log);
    assert_int_equal(rc, 0);
    assert_true(harness_file_contains(log, "produced 5 records to t7 (0 failed)"));

    /* one partition, so offset order is file order */
    size_t len, rec = 4 * (DI + 1);
    char *out =
        capture(&len, "kcat -C -b %s -t t7 -p 0 -e -o beginning -q -f '%%s'", broker.bootstrap);
    assert_int_equal(len, N * rec);
    ingest_schema_t s = {.features = DI, .label = INGEST_LABEL_REAL};
    for (int i = 0; i < N; i++) {
        float x[DI], y;
        assert_int_equal(ingest_decode(&s, INGEST_FORMAT_F32, out + (size_t)i * rec, rec, x, &y),
                         INGEST_OK);
        assert_true(y == (float)(i % 3));
        for (int j = 0; j < DI; j++)
            assert_true(x[j] == (float)img[16 + i * DI + j] / 255.0f);
    }
    free(out);
}

/* (f) --help states the dev broker's limits. */
static void test_broker_help_states_its_limits(void **state)
{
    char log[400];
    log_path(log, sizeof(log), "help");
    assert_int_equal(run_freshet(log, 10000, "broker", "--help", NULL), 0);
    assert_true(harness_file_contains(log, "5 MiB"));
    assert_true(harness_file_contains(log, "timestamp"));
    assert_true(harness_file_contains(log, "never for production") ||
                harness_file_contains(log, "NEVER FOR PRODUCTION"));
}

/* Last: SIGTERM stops the broker with exit status 0. */
static void test_broker_exits_0_on_sigterm(void **state)
{
    int status = harness_broker_stop(&broker);
    assert_true(status != -1 && WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* ------------------------------------------------------------------------
 * Setup: the data file and the broker.
 * ---------------------------------------------------------------------- */

static int setup(void **state)
{
    if (harness_tmpdir(tmp_dir, "produce") != 0)
        return -1;
    snprintf(data_csv, sizeof(data_csv), "%s/data.csv", tmp_dir);
    FILE *f = fopen(data_csv, "w");
    if (f == NULL)
        return -1;
    for (int i = 0; i < NREC; i++) {
        /* values that need all 9 digits, some zeros (sparse libsvm) and -0 */
        ys[i] = (float)(i % 7) * 0.1f - 0.3f;
        xs[i][0] = (float)i / 3.0f;
        xs[i][1] = i % 3 == 0 ? 0.0f : (float)(i * i) * -1.0e-5f;
        xs[i][2] = i == 4 ? -0.0f : 1.0f / (float)(i + 1) + 1e6f * (float)(i % 2);
        fprintf(f, "%.9g,%.9g,%.9g,%.9g\n", (double)ys[i], (double)xs[i][0], (double)xs[i][1],
                (double)xs[i][2]);
    }
    if (fclose(f) != 0)
        return -1;
    return harness_broker_start(&broker, FRESHET_BIN,
                                "--topic t1:4 --topic t2:1 --topic t3:2 --topic t4:2 "
                                "--topic t5:1 --topic t6:3 --topic t7:1 --topic t8:2 --topic t9:2 "
                                "--topic t10:2 --topic t11:4");
}

static int teardown(void **state)
{
    if (broker.pid > 0)
        harness_broker_stop(&broker);
    return harness_rmdir(tmp_dir);
}

int main(void)
{
    /* TEST_FILTER=pattern runs the matching tests only (while debugging) */
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_produce_f32_round_robin_is_read_back_exactly_by_kcat),
        cmocka_unit_test(test_produce_sticky_sends_keyless_runs_to_one_partition),
        cmocka_unit_test(test_kcat_produced_records_are_consumed_intact),
        cmocka_unit_test(test_produce_csv_and_libsvm_round_trip_exactly),
        cmocka_unit_test(test_produce_waits_for_brokers_that_come_back),
        cmocka_unit_test(test_produce_to_nothing_fails_within_the_message_timeout),
        cmocka_unit_test(test_produce_rejects_bad_arguments_with_status_2),
        cmocka_unit_test(test_produce_loops_until_the_limit),
        cmocka_unit_test(test_produce_synthetic_ctr_sends_the_seeded_stream),
        cmocka_unit_test(test_produce_sends_sparse_files_as_binary_records),
        cmocka_unit_test(test_produce_idx_takes_the_features_from_the_images_header),
        cmocka_unit_test(test_broker_help_states_its_limits),
        cmocka_unit_test(test_broker_exits_0_on_sigterm),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
