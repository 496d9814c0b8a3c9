/*
 * test_consumer_offsets.c - the consumer's side of the exactly-once effect,
 * end to end: rule 3 (the gap rule), replays, a consumer group whose
 * member is killed with SIGKILL, and the store reads of the once-a-second
 * tick (one batch for every partition). The dev broker (a separate "freshet
 * broker" process), a real redis-server, the real applier in a thread
 * (audit mode), and the test as the trainer that takes batches, pushes
 * their gradients and reports them done. For the group test this program
 * runs itself as the member processes ("--worker", see worker_main).
 *
 * Records are f32 samples of 3 features whose label is their offset, so
 * every sample says where it came from. Gradients are zeros: the weights
 * do not matter here, the offsets and the audit do.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "harness.h"
#include "ingest/ingest.h"
#include "psstore/psstore.h"

#define D       3
#define NPARAMS (D + 1) /* layers "3-1" */
#define MAXOFF  256
#define WAIT_MS 40000

static harness_broker_t broker;
static harness_redis_t redis;
static char tmp_dir[256];
static char errstr[512];

static const char *const test_props[][2] = {
    {"session.timeout.ms", "6000"},
    {"heartbeat.interval.ms", "500"},
};

/* ------------------------------------------------------------------------
 * Helpers.
 * ---------------------------------------------------------------------- */

/* Produces n records with labels first..first+n-1 to a partition. */
static void produce_to(const char *topic, int32_t partition, int first, int n)
{
    ingest_producer_t *p = ingest_producer_new(broker.bootstrap, NULL, 0, errstr, sizeof(errstr));
    assert_non_null(p);
    for (int k = first; k < first + n; k++) {
        float v[D + 1] = {(float)k, (float)k * 0.5f, -(float)k, 1.0f};
        assert_int_equal(
            ingest_producer_send(p, topic, partition, NULL, 0, v, sizeof(v), NULL, NULL), FR_OK);
    }
    uint64_t delivered = 0, failed = 0;
    assert_int_equal(ingest_producer_flush(p, 10000, &delivered, &failed), FR_OK);
    assert_int_equal(delivered, (uint64_t)n);
    ingest_producer_destroy(p);
}

static void produce(const char *topic, int first, int n)
{
    produce_to(topic, 0, first, n);
}

static void create_model(const char *model)
{
    psstore_conn_t *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    assert_non_null(c);
    float w[NPARAMS] = {0.1f, 0.2f, 0.3f, 0.0f};
    psstore_model_spec_t spec = {"3-1", "mse", NPARAMS, 1, NULL};
    assert_int_equal(psstore_model_create(c, model, &spec, w, 1), FR_OK);
    psstore_conn_destroy(c);
}

static void applier_start(harness_applier_t *t, const char *model)
{
    psstore_applier_conf_t conf;
    psstore_applier_conf_init(&conf);
    conf.url = redis.url;
    conf.model = model;
    conf.lease_ms = 2000;
    conf.audit = 1;
    assert_int_equal(harness_applier_start(t, &conf), 0);
}

/* A started consumer; NULL with errstr. */
static ingest_consumer_t *consumer_new(const char *bootstrap, const char *url, const char *topic,
                                       const char *model, int batch, int gap_ms, int whole_topic)
{
    ingest_consumer_conf_t conf = {
        .bootstrap = bootstrap,
        .props = test_props,
        .nprops = 2,
        .topic = topic,
        .redis_url = url,
        .model = model,
        .schema = {.features = D, .label = INGEST_LABEL_REAL},
        .format = INGEST_FORMAT_F32,
        .batch = batch,
        .queue = 8,
        .linger_ms = 100,
        .gap_timeout_ms = gap_ms,
        .whole_topic = whole_topic,
    };
    ingest_consumer_t *c = ingest_consumer_new(&conf, errstr, sizeof(errstr));
    if (c != NULL && ingest_consumer_start(c) != FR_OK) {
        snprintf(errstr, sizeof(errstr), "consumer did not start");
        ingest_consumer_destroy(c);
        return NULL;
    }
    return c;
}

static ingest_consumer_t *consumer_start(const char *topic, const char *model, int batch,
                                         int gap_ms)
{
    ingest_consumer_t *c =
        consumer_new(broker.bootstrap, redis.url, topic, model, batch, gap_ms, 0);
    if (c == NULL)
        fail_msg("consumer: %s", errstr);
    return c;
}

/* The test's trainer: what it was given and a client to push with. */
typedef struct trainer {
    const char *model;
    psstore_client_t *cl;
    int seen[MAXOFF];      /* times each offset arrived as a sample */
    int64_t gen[MAXOFF];   /* the generation of its last delivery */
    int64_t first_from[8]; /* per generation, the lowest position it covered */
} trainer_t;

/* 0, or -1 with errstr. */
static int trainer_open(trainer_t *t, const char *url, const char *model)
{
    memset(t, 0, sizeof(*t));
    t->model = model;
    t->cl = psstore_client_new(url, model, NPARAMS, 1000, errstr, sizeof(errstr));
    for (int g = 0; g < 8; g++)
        t->first_from[g] = -1;
    return t->cl != NULL ? 0 : -1;
}

/* A trainer of model on the test's Redis; free with trainer_free(). */
static trainer_t *trainer_new(const char *model)
{
    trainer_t *t = malloc(sizeof(*t));
    assert_non_null(t);
    if (trainer_open(t, redis.url, model) != 0)
        fail_msg("client: %s", errstr);
    return t;
}

static void trainer_free(trainer_t *t)
{
    psstore_client_destroy(t->cl);
    free(t);
}

/* Records a batch's samples and pushes its gradient (as worker); the
 * stream id of the entry goes to id[64]. No cmocka assertion: the member
 * processes run it too. */
static fr_err_t push_batch_epoch(trainer_t *t, const ingest_batch_t *b, const char *worker,
                                 char *id, uint64_t wrong_epoch);

static fr_err_t push_batch(trainer_t *t, const ingest_batch_t *b, const char *worker, char *id)
{
    return push_batch_epoch(t, b, worker, id, 0);
}

/* push_batch, the gradient stamped with wrong_epoch when it is not 0 (the
 * applier drops it as computed on another epoch). */
static fr_err_t push_batch_epoch(trainer_t *t, const ingest_batch_t *b, const char *worker,
                                 char *id, uint64_t wrong_epoch)
{
    float w[NPARAMS], g[NPARAMS] = {0};
    uint64_t epoch = 0;
    int64_t version = -1;
    int changed;
    psstore_range_t ranges[16];
    fr_err_t err = psstore_pull(t->cl, w, &epoch, &version, &changed);
    if (wrong_epoch != 0)
        epoch = wrong_epoch;
    if (err != FR_OK || b->nranges > 16)
        return err != FR_OK ? err : FR_ERR_RANGE;
    for (size_t i = 0; i < b->nranges; i++) {
        ranges[i] = (psstore_range_t){b->ranges[i].topic, b->ranges[i].partition, b->ranges[i].from,
                                      b->ranges[i].to};
        int64_t gen = b->generation < 8 ? b->generation : 7;
        if (t->first_from[gen] < 0 || b->ranges[i].from < t->first_from[gen])
            t->first_from[gen] = b->ranges[i].from;
    }
    for (size_t s = 0; s < b->n; s++) {
        int k = (int)b->y[s];
        if (k >= 0 && k < MAXOFF) {
            t->seen[k]++;
            t->gen[k] = b->generation;
        }
    }
    psstore_grad_t msg = {.epoch = epoch,
                          .version = version,
                          .generation = b->generation,
                          .worker = worker,
                          .n = (int64_t)b->n,
                          .loss_sum = 0,
                          .reason = b->n == 0 ? b->reason : NULL,
                          .ranges = ranges,
                          .nranges = b->nranges,
                          .g = b->n > 0 ? g : NULL,
                          .len = b->n > 0 ? NPARAMS : 0};
    if ((err = psstore_push(t->cl, &msg, 5000)) == FR_OK)
        snprintf(id, 64, "%s", psstore_client_last_id(t->cl));
    return err;
}

/* Takes one batch (up to wait_ms) and trains on it; 0 when none came. */
static int train_one(trainer_t *t, ingest_consumer_t *c, int wait_ms)
{
    ingest_batch_t *b = ingest_consumer_next(c, wait_ms);
    if (b == NULL)
        return 0;
    char id[64];
    assert_int_equal(push_batch(t, b, "test/1/0", id), FR_OK);
    ingest_consumer_done(c, b, id);
    ingest_batch_destroy(b);
    return 1;
}

/* The store's offsets text of topic/0 ("(nil)" when absent). */
static void offsets_text(const char *model, const char *topic, char *out, size_t size)
{
    assert_int_equal(
        harness_redis_query(&redis, out, size, "HGET freshet:{%s}:offsets %s/0", model, topic), 0);
}

/* Trains until the store's offsets of topic/0 read `want`; fails after
 * WAIT_MS. */
static void train_until(trainer_t *t, ingest_consumer_t *c, const char *topic, const char *want)
{
    char out[128] = "";
    for (int64_t start = (int64_t)(fr_clock_mono_ns() / 1000000u);
         (int64_t)(fr_clock_mono_ns() / 1000000u) - start < WAIT_MS;) {
        train_one(t, c, 100);
        offsets_text(t->model, topic, out, sizeof(out));
        if (strcmp(out, want) == 0)
            return;
    }
    fail_msg("offsets of %s/0 are '%s', expected '%s'", topic, out, want);
}

/* Runs freshet with args (NULL-terminated), its output going to log: its
 * exit status, -1 when it did not exit within 30 s. */
#define run_freshet(log, ...) harness_command(log, 30000, FRESHET_BIN, __VA_ARGS__)

/* Asserts that every position [0, n) of topic/0 was marked exactly once
 * under generation-free accounting: the audit's applied intervals. */
static void assert_marked_once(const char *model, const char *topic, int n, int expect_from,
                               int expect_count)
{
    int seen[MAXOFF];
    assert_true(harness_audit_count(&redis, model, topic, 0, NULL, seen, n) > 0);
    for (int pos = 0; pos < n; pos++) {
        int want = pos >= expect_from ? expect_count : 1;
        if (seen[pos] != want)
            fail_msg("%s/0 position %d marked %d times, expected %d", topic, pos, seen[pos], want);
    }
}

/* ------------------------------------------------------------------------
 * Rule 3: the gap rule.
 * ---------------------------------------------------------------------- */

/*
 * The end of a gap test of 40 records in batches of ten whose second batch
 * was read again: offsets 10-19 arrived twice, the others once; then the
 * consumer and the applier stop (its stats into *as), 4 batches applied,
 * and every position marked once. Frees t.
 */
static void read_again_once(trainer_t *t, ingest_consumer_t *c, harness_applier_t *ap,
                            const char *model, const char *topic, psstore_applier_stats_t *as)
{
    for (int k = 0; k < 40; k++) {
        int want = k >= 10 && k < 20 ? 2 : 1;
        if (t->seen[k] != want)
            fail_msg("offset %d arrived %d times, expected %d", k, t->seen[k], want);
    }
    ingest_consumer_destroy(c);
    harness_applier_stop(ap, as);
    assert_int_equal(as->applied, 4);
    assert_marked_once(model, topic, 40, 40, 1);
    trainer_free(t);
}

/*
 * Four batches of ten: the gradient of the second is lost from the stream
 * (a write Redis lost) and the fourth is abandoned by its trainer. The
 * watermark sticks at 10 with [20, 30) applied above it; after gap_timeout
 * the consumer reads again from 10, skipping [20, 30), and every position
 * ends applied exactly once.
 */
static void test_gap_rule_reads_lost_batches_again(void **state)
{
    (void)state;
    const char *model = "gap", *topic = "gap1";
    create_model(model);
    produce(topic, 0, 40);
    trainer_t *t = trainer_new(model);
    ingest_consumer_t *c = consumer_start(topic, model, 10, 1500);
    char ids[4][64];
    for (int k = 0; k < 4; k++) {
        ingest_batch_t *b = ingest_consumer_next(c, WAIT_MS);
        assert_non_null(b);
        assert_int_equal(b->n, 10);
        assert_int_equal(b->ranges[0].from, 10 * k);
        if (k == 3) {
            ingest_consumer_done(c, b, NULL); /* abandoned */
        } else {
            assert_int_equal(push_batch(t, b, "test/1/0", ids[k]), FR_OK);
            ingest_consumer_done(c, b, ids[k]);
        }
        ingest_batch_destroy(b);
    }
    char out[128];
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "XDEL freshet:{%s}:grads %s", model, ids[1]),
        0);
    assert_string_equal(out, "1");
    harness_applier_t ap;
    applier_start(&ap, model);
    /* before gap_timeout nothing is read again */
    assert_null(ingest_consumer_next(c, 700));
    offsets_text(model, topic, out, sizeof(out));
    assert_string_equal(out, "10;20-30");
    train_until(t, c, topic, "40");
    ingest_consumer_stats_t st;
    ingest_consumer_stats(c, &st);
    assert_true(st.gap_seeks >= 1);
    /* [10, 20) was pushed, lost and read again; [30, 40) was first
     * abandoned (never pushed), then read again */
    psstore_applier_stats_t as;
    read_again_once(t, c, &ap, model, topic, &as);
    assert_int_equal(as.dropped[PSSTORE_DROPPED_DUPLICATE], 0);
}

/*
 * A gradient the applier drops (here: stamped with another epoch, as after
 * a Redis restart) leaves its positions unmarked and its entry gone from
 * the stream. The consumer that pushed it sees that at two ticks in a row
 * and reads the positions again within seconds, not after gap_timeout
 * (60 s here): every position ends applied once, the dropped batch's
 * samples twice seen.
 */
static void test_a_dropped_gradient_is_read_again_before_gap_timeout(void **state)
{
    (void)state;
    const char *model = "gdrop", *topic = "gdrop1";
    create_model(model);
    produce(topic, 0, 40);
    trainer_t *t = trainer_new(model);
    ingest_consumer_t *c = consumer_start(topic, model, 10, 60000);
    harness_applier_t ap;
    applier_start(&ap, model);
    for (int k = 0; k < 4; k++) {
        ingest_batch_t *b = ingest_consumer_next(c, WAIT_MS);
        assert_non_null(b);
        assert_int_equal(b->ranges[0].from, 10 * k);
        char id[64];
        assert_int_equal(push_batch_epoch(t, b, "test/1/0", id, k == 1 ? 12345 : 0), FR_OK);
        ingest_consumer_done(c, b, id);
        ingest_batch_destroy(b);
    }
    uint64_t t0 = fr_clock_mono_ns();
    train_until(t, c, topic, "40");
    double took = (double)(fr_clock_mono_ns() - t0) / 1e9;
    fr_log(FR_LOG_INFO, "the dropped batch was read again and applied in %.1f s", took);
    assert_true(took < 30); /* gap_timeout is 60 s: only the drop's evidence explains it */
    ingest_consumer_stats_t st;
    ingest_consumer_stats(c, &st);
    assert_int_equal(st.gap_seeks, 1);
    psstore_applier_stats_t as;
    read_again_once(t, c, &ap, model, topic, &as);
    assert_int_equal(as.dropped[PSSTORE_DROPPED_EPOCH], 1);
}

/* ------------------------------------------------------------------------
 * Replay.
 * ---------------------------------------------------------------------- */

/* A dry run changes nothing; --execute re-delivers from offset 10 under
 * generation 1, and the store ends at "30@1". */
static void test_replay_to_offset_redelivers_from_the_target(void **state)
{
    (void)state;
    const char *model = "rpo", *topic = "rpo1";
    create_model(model);
    produce(topic, 0, 30);
    trainer_t *t = trainer_new(model);
    harness_applier_t ap;
    applier_start(&ap, model);
    ingest_consumer_t *c = consumer_start(topic, model, 10, 0);
    train_until(t, c, topic, "30");
    char log[300], out[128];
    snprintf(log, sizeof(log), "%s/replay-offset.log", tmp_dir);
    assert_int_equal(run_freshet(log, "replay", "--redis", redis.url, "--model", model,
                                 "--to-offset", "0:10", NULL),
                     0);
    assert_true(harness_file_contains(log, "dry run: nothing changed"));
    assert_true(harness_file_contains(log, "offset 10"));
    for (int i = 0; i < 3; i++)
        assert_int_equal(train_one(t, c, 500), 0); /* nothing comes */
    offsets_text(model, topic, out, sizeof(out));
    assert_string_equal(out, "30");
    assert_int_equal(run_freshet(log, "replay", "--redis", redis.url, "--model", model,
                                 "--to-offset", "0:10", "--execute", NULL),
                     0);
    assert_true(harness_file_contains(log, "replay generation 1 published"));
    train_until(t, c, topic, "30@1");
    for (int k = 0; k < 30; k++) {
        int want = k >= 10 ? 2 : 1;
        if (t->seen[k] != want)
            fail_msg("offset %d arrived %d times, expected %d", k, t->seen[k], want);
        assert_int_equal(t->gen[k], k >= 10 ? 1 : 0);
    }
    assert_int_equal(t->first_from[1], 10);
    ingest_consumer_stats_t st;
    ingest_consumer_stats(c, &st);
    assert_int_equal(st.rewinds, 1);
    ingest_consumer_destroy(c);
    harness_applier_stop(&ap, NULL);
    /* [10, 30) marked twice: before the replay and after it */
    assert_marked_once(model, topic, 30, 10, 2);
    trainer_free(t);
}

/* Formats unix ms as ISO 8601 UTC with milliseconds. */
static void iso8601(int64_t ms, char *buf, size_t size)
{
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    char base[32];
    strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, size, "%s.%03dZ", base, (int)(ms % 1000));
}

/* A datetime target: the dev broker answers -1 to offsets_for_times, so
 * the dry run's resolution and the consumer's both search the records'
 * timestamps, and both find offset 20, the first record produced after
 * the chosen instant. */
static void test_replay_to_datetime_redelivers_from_the_first_later_record(void **state)
{
    (void)state;
    const char *model = "rpd", *topic = "rpd1";
    create_model(model);
    produce(topic, 0, 20);
    harness_sleep_ms(1100);
    int64_t mid = fr_clock_unix_ms();
    harness_sleep_ms(1100);
    produce(topic, 20, 15);
    trainer_t *t = trainer_new(model);
    harness_applier_t ap;
    applier_start(&ap, model);
    ingest_consumer_t *c = consumer_start(topic, model, 10, 0);
    train_until(t, c, topic, "35");
    char when[64], log[300], out[128];
    iso8601(mid, when, sizeof(when));
    snprintf(log, sizeof(log), "%s/replay-datetime.log", tmp_dir);
    assert_int_equal(run_freshet(log, "replay", "--redis", redis.url, "--model", model,
                                 "--to-datetime", when, "--bootstrap", broker.bootstrap, "--topic",
                                 topic, NULL),
                     0);
    /* the resolved plan: partition 0, watermark 35, log 0..35, target 20 */
    char row[128];
    snprintf(row, sizeof(row), "%-24s %9d %12d %12d %12d  %d", topic, 0, 35, 0, 35, 20);
    if (!harness_file_contains(log, row))
        fail_msg("the plan in %s lacks the row '%s'", log, row);
    offsets_text(model, topic, out, sizeof(out));
    assert_string_equal(out, "35");
    assert_int_equal(run_freshet(log, "replay", "--redis", redis.url, "--model", model,
                                 "--to-datetime", when, "--execute", NULL),
                     0);
    train_until(t, c, topic, "35@1");
    for (int k = 0; k < 35; k++) {
        int want = k >= 20 ? 2 : 1;
        if (t->seen[k] != want)
            fail_msg("offset %d arrived %d times, expected %d", k, t->seen[k], want);
    }
    assert_int_equal(t->first_from[1], 20);
    ingest_consumer_destroy(c);
    harness_applier_stop(&ap, NULL);
    assert_marked_once(model, topic, 35, 20, 2);
    trainer_free(t);
}

/* Bad verbs and arguments are refused with exit status 2 and change
 * nothing; a model that does not exist is an error too. */
static void test_replay_refuses_bad_requests(void **state)
{
    (void)state;
    const char *model = "rpbad";
    create_model(model);
    char log[300], out[128];
    snprintf(log, sizeof(log), "%s/replay-bad.log", tmp_dir);
    assert_int_equal(run_freshet(log, "replay", "--redis", redis.url, "--model", model, NULL), 2);
    assert_int_equal(run_freshet(log, "replay", "--redis", redis.url, "--model", model,
                                 "--to-earliest", "--to-latest", NULL),
                     2);
    assert_int_equal(run_freshet(log, "replay", "--redis", redis.url, "--model", model,
                                 "--to-offset", "0:x", "--execute", NULL),
                     2);
    assert_int_equal(run_freshet(log, "replay", "--redis", redis.url, "--model", model,
                                 "--to-datetime", "yesterday", "--execute", NULL),
                     2);
    assert_int_equal(run_freshet(log, "replay", "--redis", redis.url, "--model", "nosuch",
                                 "--to-earliest", "--execute", NULL),
                     2);
    assert_int_equal(
        harness_redis_query(&redis, out, sizeof(out), "XLEN freshet:{%s}:requests", model), 0);
    assert_string_equal(out, "0");
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                         "HGET freshet:{%s}:meta replay_generation", model),
                     0);
    assert_string_equal(out, "(nil)");
}

/* ------------------------------------------------------------------------
 * A consumer group member killed with SIGKILL.
 * ---------------------------------------------------------------------- */

static volatile sig_atomic_t worker_stop;

static void on_term(int sig)
{
    (void)sig;
    worker_stop = 1;
}

/*
 * A member process: "--worker BOOTSTRAP REDIS_URL TOPIC MODEL DELAY_MS"
 * consumes TOPIC for MODEL in batches of 5 and trains each (waiting
 * DELAY_MS first, a slow trainer) until SIGTERM; it prints "pushed" after
 * its first gradient. Exit status 0, or 1 on a setup failure.
 */
static int worker_main(int argc, char **argv)
{
    if (argc != 7)
        return 1;
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    trainer_t *t = malloc(sizeof(*t));
    ingest_consumer_t *c = consumer_new(argv[2], argv[3], argv[4], argv[5], 5, 2000, 0);
    if (t == NULL || c == NULL || trainer_open(t, argv[3], argv[5]) != 0) {
        fprintf(stderr, "worker: %s\n", errstr);
        return 1;
    }
    char worker[64], id[64];
    snprintf(worker, sizeof(worker), "test/%d/0", (int)getpid());
    int delay_ms = atoi(argv[6]), pushed = 0;
    while (!worker_stop) {
        ingest_batch_t *b = ingest_consumer_next(c, 200);
        if (b == NULL)
            continue;
        harness_sleep_ms(delay_ms);
        fr_err_t err = push_batch(t, b, worker, id);
        if (err != FR_OK)
            fprintf(stderr, "worker: push: %s\n", psstore_client_error(t->cl));
        ingest_consumer_done(c, b, err == FR_OK ? id : NULL);
        ingest_batch_destroy(b);
        if (err == FR_OK && !pushed++) {
            printf("pushed\n");
            fflush(stdout);
        }
    }
    ingest_consumer_destroy(c);
    trainer_free(t);
    return 0;
}

/* The sum of the watermarks of topic/0..nparts-1 (absent: 0). */
static int64_t watermarks_sum(const char *model, const char *topic, int nparts)
{
    int64_t sum = 0;
    for (int p = 0; p < nparts; p++) {
        char out[128];
        assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                             "HGET freshet:{%s}:offsets %s/%d", model, topic, p),
                         0);
        sum += strcmp(out, "(nil)") == 0 ? 0 : strtoll(out, NULL, 10);
    }
    return sum;
}

/*
 * Two member processes split four partitions; the slow one is killed with
 * SIGKILL while its partitions still hold records. The other takes them
 * over after the session timeout, starts each at the store's watermark
 * (skipping what the dead one's gradients applied), and every position of
 * every partition ends applied exactly once (audit mode).
 */
static void test_a_killed_member_is_replaced_without_gap_or_duplicate(void **state)
{
    (void)state;
    enum { NPARTS = 4, PER = 150 };
    const char *model = "kill", *topic = "kill1";
    create_model(model);
    for (int p = 0; p < NPARTS; p++)
        produce_to(topic, p, 0, PER);
    harness_applier_t ap;
    applier_start(&ap, model);
    char log_a[300], log_b[300];
    snprintf(log_a, sizeof(log_a), "%s/member-a.log", tmp_dir);
    snprintf(log_b, sizeof(log_b), "%s/member-b.log", tmp_dir);
    char *argv_a[] = {"/proc/self/exe",
                      "--worker",
                      broker.bootstrap,
                      redis.url,
                      (char *)topic,
                      (char *)model,
                      "150",
                      NULL};
    char *argv_b[] = {"/proc/self/exe",
                      "--worker",
                      broker.bootstrap,
                      redis.url,
                      (char *)topic,
                      (char *)model,
                      "10",
                      NULL};
    pid_t a = harness_spawn(argv_a, log_a);
    pid_t b = harness_spawn(argv_b, log_b);
    assert_true(a > 0 && b > 0);
    int waited = 0;
    while (waited < WAIT_MS &&
           !(harness_file_contains(log_a, "pushed") && harness_file_contains(log_b, "pushed"))) {
        harness_sleep_ms(50);
        waited += 50;
    }
    if (waited >= WAIT_MS)
        fail_msg("the two members did not both train within %d ms (%s, %s)", WAIT_MS, log_a, log_b);
    assert_int_equal(kill(a, SIGKILL), 0);
    assert_true(harness_wait(a, 5000) != -1);
    int64_t at_kill = watermarks_sum(model, topic, NPARTS);
    assert_true(at_kill < NPARTS * PER); /* the dead member left work behind */
    for (waited = 0; waited < WAIT_MS && watermarks_sum(model, topic, NPARTS) < NPARTS * PER;
         waited += 100)
        harness_sleep_ms(100);
    assert_int_equal(watermarks_sum(model, topic, NPARTS), NPARTS * PER);
    assert_int_equal(kill(b, SIGTERM), 0);
    int status = harness_wait(b, 15000);
    assert_true(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    psstore_applier_stats_t as;
    harness_applier_stop(&ap, &as);
    int seen[PER];
    for (int p = 0; p < NPARTS; p++) {
        assert_true(harness_audit_count(&redis, model, topic, p, "applied", seen, PER) > 0);
        for (int pos = 0; pos < PER; pos++)
            if (seen[pos] != 1)
                fail_msg("%s/%d position %d applied %d times", topic, p, pos, seen[pos]);
    }
    assert_int_equal(as.dropped[PSSTORE_DROPPED_EPOCH], 0);
    fr_log(FR_LOG_INFO,
           "takeover: %lld of %d positions applied at the kill, %llu gradients "
           "applied, %llu duplicates dropped",
           (long long)at_kill, NPARTS * PER, (unsigned long long)as.applied,
           (unsigned long long)as.dropped[PSSTORE_DROPPED_DUPLICATE]);
}

/* ------------------------------------------------------------------------
 * The store tick's reads.
 * ---------------------------------------------------------------------- */

/* psstore_offsets_read_many of parts[n] gives each partition what
 * psstore_offsets_read gives it (both into offsets initialised at -1, so
 * that a partition the store never saw, left untouched, compares too). */
static void expect_many_as_each(psstore_conn_t *c, const char *model, const char *topic,
                                const int32_t *parts, size_t n)
{
    psstore_partition_offsets_t *many = calloc(n, sizeof(*many)), one;
    int *found = calloc(n, sizeof(*found)), found_one = -1;
    assert_true(many != NULL && found != NULL);
    for (size_t i = 0; i < n; i++)
        psstore_poff_init(&many[i], -1);
    assert_int_equal(psstore_offsets_read_many(c, model, topic, parts, n, many, found), FR_OK);
    for (size_t i = 0; i < n; i++) {
        const psstore_partition_offsets_t *m = &many[i];
        psstore_poff_init(&one, -1);
        assert_int_equal(psstore_offsets_read(c, model, topic, parts[i], &one, &found_one), FR_OK);
        int same = found[i] == found_one && m->watermark == one.watermark &&
                   m->generation == one.generation && m->alone_to == one.alone_to &&
                   m->nspans == one.nspans;
        for (size_t k = 0; same && k < one.nspans; k++)
            same = m->spans[k].from == one.spans[k].from && m->spans[k].to == one.spans[k].to;
        if (!same)
            fail_msg("%s %s/%d: read with others: found %d, %" PRId64 " (%zu intervals) @%" PRId64
                     " alone to %" PRId64 "; alone: found %d, %" PRId64 " (%zu) @%" PRId64
                     " alone to %" PRId64,
                     model, topic, parts[i], found[i], m->watermark, m->nspans, m->generation,
                     m->alone_to, found_one, one.watermark, one.nspans, one.generation,
                     one.alone_to);
        psstore_poff_fini(&one);
        psstore_poff_fini(&many[i]);
    }
    free(many);
    free(found);
}

/*
 * psstore_offsets_read_many, the tick's read, gives each partition what
 * psstore_offsets_read gives it: for a model of one shard over 600
 * partitions (two HMGETs, of 512 fields and 88), some never seen, some
 * with applied intervals or a generation; for a model of three shards
 * that hold different positions, generations and partitions (the lowest
 * watermark with that shard's intervals, the oldest generation,
 * alone_to); for a partition asked twice. A value that does not parse
 * fails the read, naming its partition, as it fails the partition's own.
 */
static void test_offsets_read_many_gives_each_partition_what_its_own_read_gives(void **state)
{
    (void)state;
    enum { NPARTS = 600 };
    const char *topic = "many1";
    create_model("many");
    psstore_conn_t *c = psstore_conn_new(redis.url, 2000, errstr, sizeof(errstr));
    assert_non_null(c);
    static char cmd[NPARTS * 32];
    int len = snprintf(cmd, sizeof(cmd), "HSET freshet:{many}:offsets");
    for (int p = 0; p < NPARTS; p += 3) /* a third seen, alike or not */
        len += snprintf(cmd + len, sizeof(cmd) - (size_t)len,
                        p % 2 ? " %s/%d %d" : " %s/%d %d;%d-%d@%d", topic, p, p, p + 2, p + 5,
                        p % 4 + 1);
    char out[256];
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out), cmd), 0);
    int32_t parts[NPARTS];
    for (int i = 0; i < NPARTS; i++)
        parts[i] = NPARTS - 1 - i; /* in no particular order */
    expect_many_as_each(c, "many", topic, parts, NPARTS);

    /* shard 1 has the lowest watermark of many1/0 and shard 2 the oldest
     * generation; many1/1 only shards 0 and 2 saw, many1/2 only shard 1 */
    float w[67] = {0};
    psstore_model_spec_t spec = {"4-8-3", "softmax", 67, 3, NULL};
    assert_int_equal(psstore_model_create(c, "manysh", &spec, w, 1), FR_OK);
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                         "HSET freshet:{manysh/s0}:offsets many1/0 10;12-14@3 "
                                         "many1/1 4"),
                     0);
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                         "HSET freshet:{manysh/s1}:offsets many1/0 8;9-11@3 "
                                         "many1/2 7;9-10"),
                     0);
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                         "HSET freshet:{manysh/s2}:offsets many1/0 15@2 "
                                         "many1/1 4"),
                     0);
    const int32_t sharded[] = {0, 1, 2, 3, 0};
    expect_many_as_each(c, "manysh", topic, sharded, 5);
    psstore_partition_offsets_t po[2];
    int found[2];
    psstore_poff_init(&po[0], 0);
    psstore_poff_init(&po[1], 0);
    assert_int_equal(psstore_offsets_read_many(c, "manysh", topic, sharded, 2, po, found), FR_OK);
    assert_true(found[0] && po[0].watermark == 8 && po[0].nspans == 1 && po[0].generation == 2);
    assert_int_equal(po[0].alone_to, 15); /* shard 2's end: the shards differ */
    /* shard 1 applied nothing of many1/1: it starts at 0, batched alone to 4 */
    assert_true(found[1] && po[1].watermark == 0 && po[1].alone_to == 4);

    /* errors: a value that does not parse, a bad partition; none asked */
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out),
                                         "HSET freshet:{many}:offsets many1/700 garbage"),
                     0);
    const int32_t bad[] = {3, 700}, negative[] = {3, -1};
    assert_int_equal(psstore_offsets_read_many(c, "many", topic, bad, 2, po, found), FR_ERR_PARSE);
    assert_non_null(strstr(psstore_conn_error(c), "many1/700"));
    assert_int_equal(psstore_offsets_read_many(c, "many", topic, negative, 2, po, found),
                     FR_ERR_INVAL);
    assert_int_equal(psstore_offsets_read_many(c, "many", topic, bad, 0, po, found), FR_OK);
    psstore_poff_fini(&po[0]);
    psstore_poff_fini(&po[1]);
    psstore_conn_destroy(c);
}

/*
 * The store tick reads every owned partition's offsets in a fixed number
 * of commands whatever their number. A consumer of the whole topic of 48
 * partitions, without applier or trainer: its poll thread is Redis's only
 * client. Over 4 s of ticks (one a second) Redis answers a few HMGETs a
 * tick (the published replay's two, the shard count, the offsets) and no
 * HGET; reading the partitions one after the other cost an HMGET and an
 * HGET each, 96 round trips a tick during which the poll thread does not
 * poll Kafka (bench/README.md "A distant store").
 */
static void test_a_tick_reads_the_offsets_of_48_partitions_in_a_few_commands(void **state)
{
    (void)state;
    enum { NPARTS = 48 };
    const char *model = "tick", *topic = "tick48";
    create_model(model);
    ingest_consumer_t *c =
        consumer_new(broker.bootstrap, redis.url, topic, model, 10, -1 /* no gap rule */, 1);
    if (c == NULL)
        fail_msg("consumer: %s", errstr);
    ingest_consumer_stats_t st = {0};
    for (int waited = 0; waited < WAIT_MS && st.assigned < NPARTS; waited += 100) {
        harness_sleep_ms(100);
        ingest_consumer_stats(c, &st);
    }
    assert_int_equal(st.assigned, NPARTS);
    harness_sleep_ms(1500); /* the assignment's reads are over */
    char out[64];
    assert_int_equal(harness_redis_query(&redis, out, sizeof(out), "CONFIG RESETSTAT"), 0);
    uint64_t t0 = fr_clock_mono_ns();
    harness_sleep_ms(4000);
    int64_t hmget = harness_redis_calls(&redis, "hmget"),
            hget = harness_redis_calls(&redis, "hget");
    int64_t ticks = (int64_t)((fr_clock_mono_ns() - t0) / 1000000000u) + 1; /* at most */
    ingest_consumer_destroy(c);
    fr_log(FR_LOG_INFO,
           "ticks over %d partitions: %" PRId64 " HMGET, %" PRId64 " HGET in %" PRId64
           " ticks at most",
           NPARTS, hmget, hget, ticks);
    assert_true(hmget >= 3);                /* a tick ran */
    assert_true(hmget + hget < 10 * ticks); /* not 2 * NPARTS a tick */
}

/* ------------------------------------------------------------------------
 * Setup: a private folder, redis-server and the broker.
 * ---------------------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    return harness_stack_start(
        tmp_dir, "replay", &redis, &broker, FRESHET_BIN,
        "--topic gap1:1 --topic gdrop1:1 --topic rpo1:1 --topic rpd1:1 --topic kill1:4 "
        "--topic tick48:48");
}

static int teardown(void **state)
{
    (void)state;
    return harness_stack_stop(tmp_dir, &redis, &broker);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--worker") == 0)
        return worker_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_refuses_bad_requests),
        cmocka_unit_test(test_gap_rule_reads_lost_batches_again),
        cmocka_unit_test(test_a_dropped_gradient_is_read_again_before_gap_timeout),
        cmocka_unit_test(test_replay_to_offset_redelivers_from_the_target),
        cmocka_unit_test(test_replay_to_datetime_redelivers_from_the_first_later_record),
        cmocka_unit_test(test_a_killed_member_is_replaced_without_gap_or_duplicate),
        cmocka_unit_test(test_offsets_read_many_gives_each_partition_what_its_own_read_gives),
        cmocka_unit_test(test_a_tick_reads_the_offsets_of_48_partitions_in_a_few_commands),
    };
    /* TEST_FILTER=pattern runs the matching tests only (while debugging) */
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
