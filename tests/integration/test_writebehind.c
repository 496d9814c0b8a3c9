/*
 * test_writebehind.c - a sparse model's store written behind
 * (docs/design.md "The store written behind"): freshet run's workers
 * decide their gradients on the applier's table in memory and the applier
 * writes each window to Redis with the positions it covers. The dev
 * broker (a separate process), a real redis-server stopped with SIGSTOP to
 * play a Redis that is behind, and freshet produce and run as child
 * processes. What is checked: no gradient goes through the grads stream; a
 * Redis that stops answering holds the workers at a bounded window instead
 * of growing a queue; a SIGKILL at each point of a window's life (applied,
 * being written, written) loses nothing and doubles nothing (the audit,
 * written in the commit that writes the rows and offsets); a restart reads
 * the table whole.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "common/common.h"
#include "harness.h"

#define SPEC "fields:39,buckets:2^16,dim:4"
#define PER  8000 /* records a partition: 2 partitions, batches of 32 */
#define WARM 1000 /* ... of which the first, before Redis stops */
/* The version and the changes stream's newest entry, read at once. */
#define WINDOW_SCRIPT                                                                              \
    "return {redis.call('GET', KEYS[1]), redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)}"
#define WAIT_MS 120000

static harness_broker_t broker;
static harness_redis_t redis;
static char tmp_dir[256];

/* DIR/name into out[300]. */
static void path(char *out, const char *name)
{
    snprintf(out, 300, "%s/%s", tmp_dir, name);
}

/* Runs freshet with the arguments (NULL-terminated), logging to DIR/log;
 * fails the test unless it exits 0. */
static void freshet_ok(const char *log, ...)
{
    char *argv[32] = {FRESHET_BIN};
    int argc = 1;
    va_list ap;
    va_start(ap, log);
    for (char *a; argc < 31 && (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    char lp[300];
    path(lp, log);
    int status = harness_run(argv, lp, WAIT_MS);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("freshet %s failed (status %d), log %s", argv[1], status, lp);
}

/* n synthetic click records of seed sent to topic round robin (its two
 * partitions), as binary records. */
static void send(const char *topic, const char *seed, int n)
{
    char txt[300], name[32], limit[16];
    snprintf(name, sizeof(name), "%s-%s.txt", topic, seed);
    path(txt, name);
    snprintf(limit, sizeof(limit), "%d", n);
    freshet_ok("synth.log", "produce", "--synthetic", "ctr", "--seed", seed, "--out", txt,
               "--limit", limit, NULL);
    freshet_ok("produce.log", "produce", "--data", txt, "--format", "criteo", "--encode", "binary",
               "--bootstrap", broker.bootstrap, "--topic", topic, "--partitions-by", "roundrobin",
               NULL);
}

static void records(const char *topic, const char *seed)
{
    send(topic, seed, 2 * PER);
}

/* A run of model on topic: 2 workers, batches of 32 (500 gradients, more
 * than a full window's 4 * 64), audit on, a lease of
 * 1 s and a gap timeout of 3 s. */
static void write_conf(const char *conf, const char *model, const char *topic)
{
    FILE *f = fopen(conf, "w");
    assert_non_null(f);
    fprintf(f,
            "[model]\nname = %s\nsparse = " SPEC "\n"
            "[kafka]\nbootstrap.servers = %s\nsession.timeout.ms = 6000\n"
            "heartbeat.interval.ms = 500\n"
            "[ingest]\ntopic = %s\nformat = binary\nbatch = 32\n"
            "[redis]\nurl = %s\n[serve]\nlisten =\n"
            "[trainer]\nworkers = 2\n[psstore]\naudit = true\nlease_ms = 1000\ngap_timeout = 3\n",
            model, broker.bootstrap, topic, redis.url);
    assert_int_equal(fclose(f), 0);
}

/* The committed watermarks of topic's two partitions, summed, and the
 * committed version into *version. */
static int64_t watermarks(const char *model, const char *topic, int64_t *version)
{
    int64_t sum = 0;
    char out[64];
    for (int p = 0; p < 2; p++) {
        assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                             "HGET freshet:{%s}:offsets %s/%d", model, topic, p),
                         0);
        sum += strcmp(out, "(nil)") == 0 ? 0 : strtoll(out, NULL, 10);
    }
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out), "GET freshet:{%s}:ver", model),
                     0);
    *version = strtoll(out, NULL, 10);
    return sum;
}

/* Every position [0, PER) of topic/0 and topic/1 applied exactly once. */
static void assert_once(const char *model, const char *topic)
{
    int *seen = calloc(PER, sizeof(int));
    assert_non_null(seen);
    for (int p = 0; p < 2; p++) {
        assert_true(harness_audit_count(&redis, model, topic, p, NULL, seen, PER) > 0);
        for (int x = 0; x < PER; x++)
            if (seen[x] != 1)
                fail_msg("%s/%d position %d applied %d times", topic, p, x, seen[x]);
    }
    free(seen);
}

/* The run's resident memory in KiB (VmRSS), or -1. */
static long rss_kib(pid_t pid)
{
    char file[64], line[256];
    snprintf(file, sizeof(file), "/proc/%d/status", (int)pid);
    FILE *f = fopen(file, "r");
    long kib = -1;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, "VmRSS:", 6) == 0)
            kib = strtol(line + 6, NULL, 10);
    if (f != NULL)
        fclose(f);
    return kib;
}

/* Starts run on conf (log DIR/log) and waits until version `at` is
 * committed; returns its pid. */
static pid_t run_until(const char *conf, const char *log, const char *model, const char *topic,
                       int64_t at)
{
    char lp[300];
    path(lp, log);
    char *argv[] = {FRESHET_BIN, "run", "--config", (char *)conf, NULL};
    pid_t pid = harness_spawn(argv, lp);
    assert_true(pid > 0);
    int64_t version = 0;
    for (int i = 0; i < WAIT_MS / 50 && version < at; i++) {
        harness_sleep_ms(50);
        watermarks(model, topic, &version);
    }
    assert_true(version >= at);
    return pid;
}

/* Starts run again on conf and waits until every record is committed, then
 * stops it; its log DIR/log. */
static void run_to_the_end(const char *conf, const char *log, const char *model, const char *topic)
{
    pid_t pid = run_until(conf, log, model, topic, 1);
    int64_t version = 0;
    for (int i = 0; i < WAIT_MS / 100 && watermarks(model, topic, &version) < 2 * PER; i++)
        harness_sleep_ms(100);
    assert_int_equal(watermarks(model, topic, &version), 2 * PER);
    assert_int_equal(kill(pid, SIGTERM), 0);
    int status = harness_wait(pid, 20000);
    assert_true(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/*
 * Every gradient of a run is decided in its worker's thread: the grads
 * stream never holds an entry; and the restart reads the table whole.
 */
static void test_gradients_never_touch_the_grads_stream(void **state)
{
    (void)state;
    char conf[300];
    path(conf, "wb1.conf");
    records("wb1", "11");
    write_conf(conf, "wb1", "wb1");
    /* while it trains, a reader sees whole windows only: the version and the
     * changes stream's last entry (its id the version of the commit that
     * wrote it) are read in one script, and always agree */
    pid_t pid = run_until(conf, "wb1-run.log", "wb1", "wb1", 1);
    int64_t version = 0;
    int reads = 0;
    while (watermarks("wb1", "wb1", &version) < 2 * PER && reads < 100000) {
        char out[256], want[40];
        assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                             "EVAL %s 2 freshet:{wb1}:ver freshet:{wb1}:changes",
                                             WINDOW_SCRIPT),
                         0);
        long long ver = strtoll(out, NULL, 10);
        const char *id = strchr(out, '\n');
        snprintf(want, sizeof(want), "\n%lld-0\n", ver);
        if (ver > 0 && (id == NULL || strncmp(id, want, strlen(want)) != 0))
            fail_msg("a reader saw version %lld with the changes stream at %s", ver,
                     id != NULL ? id + 1 : "(none)");
        reads++;
    }
    assert_true(reads > 0);
    assert_int_equal(kill(pid, SIGTERM), 0);
    int status = harness_wait(pid, 20000);
    assert_true(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    fr_log(FR_LOG_INFO, "%d reads of a training model, each a whole window", reads);
    /* the stream exists (the model's creation makes it), and nothing was
     * ever added to it but at the edges */
    char info[1024];
    assert_int_equal(
        harness_redis_query(&redis, info, sizeof(info), "XINFO STREAM freshet:{wb1}:grads"), 0);
    const char *added = strstr(info, "entries-added\n");
    assert_non_null(added);
    /* a gradient goes through the stream only while the applier cannot
     * take it in process (before its first load, at a stop): under ASan one
     * of the 500 did */
    long streamed = strtol(added + strlen("entries-added\n"), NULL, 10);
    fr_log(FR_LOG_INFO, "%ld of %d gradients through the grads stream", streamed, 2 * PER / 32);
    assert_true(streamed <= 2);
    char lp[300];
    path(lp, "wb1-run.log");
    assert_true(harness_file_contains(lp, "decided in process"));
    /* [psstore] commit_ms -1: a sparse model's own, 5 ms */
    assert_true(harness_file_contains(lp, "committing every 5 ms"));
    assert_once("wb1", "wb1");
}

/*
 * Redis stops answering (SIGSTOP) while the run trains: the window not yet
 * written fills, the workers wait (the progress line counts their waits),
 * the run's memory stays bounded, and once Redis answers again every
 * record is applied exactly once. Then a SIGKILL while a window is being
 * written (Redis stopped again under a commit in flight): the restart
 * reads the table whole and applies the rest once.
 */
static void test_a_stopped_redis_holds_the_window_and_loses_nothing(void **state)
{
    (void)state;
    char conf[300], lp[300];
    path(conf, "wb2.conf");
    send("wb2", "12", 2 * WARM);
    write_conf(conf, "wb2", "wb2");
    pid_t pid = run_until(conf, "wb2-run1.log", "wb2", "wb2", 2 * WARM / 32);
    long before = rss_kib(pid);
    path(lp, "wb2-run1.log");
    long from = harness_file_size(lp);
    kill(redis.pid, SIGSTOP);
    send("wb2", "22", 2 * (PER - WARM)); /* the broker takes them; Redis is stopped */
    /* while Redis is stopped the stream is held back: the workers wait at a
     * full window (at most 4 x 64 gradients not yet written) or the
     * consumer waits on its store tick; never are all 500 batches decided
     * with nothing written. The progress lines (every 5 s) over 8 s say how
     * many the applier decided. */
    harness_sleep_ms(8000);
    long decided = harness_progress_applied(lp, from);
    long during = rss_kib(pid);
    kill(redis.pid, SIGCONT);
    fr_log(FR_LOG_INFO, "%ld gradients decided while Redis was stopped (of %d)", decided,
           2 * PER / 32);
    assert_true(decided >= 0); /* a progress line came */
    /* the warm batches, a full window (4 x 64) and the window of the commit
     * in flight when Redis stopped (10 ms of steps, a few gradients) */
    assert_true(decided < 2 * WARM / 32 + 4 * 64 + 64);
    fr_log(FR_LOG_INFO, "run's RSS %ld KiB before Redis stopped, %ld KiB while it was", before,
           during);
    assert_true(before > 0 && during > 0 && during - before < 64 * 1024);
    int64_t version = 0;
    for (int i = 0; i < WAIT_MS / 100 && watermarks("wb2", "wb2", &version) < PER; i++)
        harness_sleep_ms(100);
    assert_true(watermarks("wb2", "wb2", &version) >= PER);

    /* killed while its window is being written */
    kill(redis.pid, SIGSTOP);
    harness_sleep_ms(300);
    assert_int_equal(kill(pid, SIGKILL), 0);
    kill(redis.pid, SIGCONT);
    harness_wait(pid, 5000);
    run_to_the_end(conf, "wb2-run2.log", "wb2", "wb2");
    path(lp, "wb2-run2.log");
    assert_true(harness_file_contains(lp, "rows read into memory"));
    assert_once("wb2", "wb2");
}

/*
 * A SIGKILL right after a window was written (the run idle at the end of
 * the records, its last commit done): the restart finds every position
 * applied, reads the table whole and applies nothing again. While idle,
 * the applier still trims the changes stream to delta_seconds.
 */
static void test_killed_after_its_window_was_written(void **state)
{
    (void)state;
    char conf[300], lp[300], out[64];
    path(conf, "wb3.conf");
    records("wb3", "13");
    write_conf(conf, "wb3", "wb3");
    FILE *f = fopen(conf, "a");
    assert_non_null(f);
    fprintf(f, "[sparse]\ndelta_seconds = 1\n");
    assert_int_equal(fclose(f), 0);
    pid_t pid = run_until(conf, "wb3-run1.log", "wb3", "wb3", 1);
    int64_t version = 0;
    for (int i = 0; i < WAIT_MS / 100 && watermarks("wb3", "wb3", &version) < 2 * PER; i++)
        harness_sleep_ms(100);
    assert_int_equal(watermarks("wb3", "wb3", &version), 2 * PER);
    /* idle, the changes stream is trimmed to its delta_seconds all the same */
    long len = -1;
    for (int i = 0; i < 100 && len != 0; i++) {
        harness_sleep_ms(100);
        assert_int_equal(
            harness_redis_query(&redis, out, sizeof(out), "XLEN freshet:{wb3}:changes"), 0);
        len = strtol(out, NULL, 10);
    }
    assert_int_equal(len, 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    harness_wait(pid, 5000);
    int64_t at_kill = version;
    run_to_the_end(conf, "wb3-run2.log", "wb3", "wb3");
    watermarks("wb3", "wb3", &version);
    assert_int_equal(version, at_kill); /* nothing applied again */
    path(lp, "wb3-run2.log");
    assert_true(harness_file_contains(lp, "rows read into memory"));
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out), "HLEN freshet:{wb3}:rows"), 0);
    assert_true(strtol(out, NULL, 10) > 1000);
    assert_once("wb3", "wb3");
}

/*
 * A run stopped past its lease (SIGSTOP) while records stream in, its
 * window holding up to 300 ms of decisions ([psstore] commit_ms): when it
 * goes on, the applier finds its lease gone and drops the window with them.
 * Those records are read again within seconds, not after gap_timeout (60 s
 * here): the workers see the applier's lost window and tell the consumer
 * (ingest_consumer_lost). Each position is applied once.
 */
static void test_a_window_lost_with_the_lease_is_read_again_at_once(void **state)
{
    (void)state;
    enum { TOTAL = 12000 };
    char conf[300], lp[300], plog[300];
    path(conf, "wb4.conf");
    write_conf(conf, "wb4", "wb4");
    path(lp, "wb4-run.log");
    path(plog, "wb4-produce.log");
    char *run[] = {FRESHET_BIN, "run",
                   "--config",  conf,
                   "--set",     "psstore.gap_timeout=60",
                   "--set",     "psstore.commit_ms=300",
                   NULL};
    pid_t pid = harness_spawn(run, lp);
    assert_true(pid > 0);
    assert_int_equal(harness_await_file(lp, "wb4/1 starts at", 1, WAIT_MS), 0);
    char *produce[] = {
        FRESHET_BIN,   "produce",        "--synthetic", "ctr",  "--seed",          "14",
        "--encode",    "binary",         "--rate",      "2000", "--limit",         "12000",
        "--bootstrap", broker.bootstrap, "--topic",     "wb4",  "--partitions-by", "roundrobin",
        NULL};
    pid_t prod = harness_spawn(produce, plog);
    assert_true(prod > 0);
    int64_t version = 0;
    for (int i = 0; i < WAIT_MS / 20 && watermarks("wb4", "wb4", &version) < 2000; i++)
        harness_sleep_ms(20);
    harness_sleep_ms(150); /* half a window after a commit (which moved the watermark) */
    assert_int_equal(kill(pid, SIGSTOP), 0);
    harness_sleep_ms(2500); /* past lease_ms, 1 s */
    assert_int_equal(kill(pid, SIGCONT), 0);
    uint64_t t0 = fr_clock_mono_ns();
    int status = harness_wait(prod, WAIT_MS);
    assert_true(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    while (watermarks("wb4", "wb4", &version) < TOTAL &&
           fr_clock_mono_ns() - t0 < 40ull * 1000000000ull)
        harness_sleep_ms(50);
    double s = (double)(fr_clock_mono_ns() - t0) * 1e-9;
    fr_log(FR_LOG_INFO, "every record committed %.1f s after the SIGCONT (the stream lasts 6 s)",
           s);
    assert_int_equal(watermarks("wb4", "wb4", &version), TOTAL);
    assert_true(s < 20); /* gap_timeout would have been 60 s */
    assert_true(harness_file_contains(lp, "were not written; their records are read again"));
    assert_int_equal(kill(pid, SIGTERM), 0);
    status = harness_wait(pid, 20000);
    assert_true(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    int *seen = calloc(TOTAL, sizeof(int));
    assert_non_null(seen);
    for (int p = 0; p < 2; p++) {
        assert_true(harness_audit_count(&redis, "wb4", "wb4", p, NULL, seen, TOTAL / 2) > 0);
        for (int x = 0; x < TOTAL / 2; x++)
            if (seen[x] != 1)
                fail_msg("wb4/%d position %d applied %d times", p, x, seen[x]);
    }
    free(seen);
}

static int setup(void **state)
{
    (void)state;
    return harness_stack_start(tmp_dir, "writebehind", &redis, &broker, FRESHET_BIN,
                               "--topic wb1:2 --topic wb2:2 --topic wb3:2 --topic wb4:2");
}

static int teardown(void **state)
{
    (void)state;
    return harness_stack_stop(tmp_dir, &redis, &broker);
}

int main(void)
{
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradients_never_touch_the_grads_stream),
        cmocka_unit_test(test_a_stopped_redis_holds_the_window_and_loses_nothing),
        cmocka_unit_test(test_killed_after_its_window_was_written),
        cmocka_unit_test(test_a_window_lost_with_the_lease_is_read_again_at_once),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
