/*
 * resolver.c - replay resolution against Kafka: the log bounds of a
 * partition, the partitions of a topic, and the offset a replay request
 * means for one partition (docs/design.md "Replay").
 *
 * A resolver owns one librdkafka consumer handle that belongs to no group:
 * it never subscribes, never assigns, never commits. librdkafka 2.0 refuses
 * rd_kafka_assign() without a group.id ("Local: Unknown group"), so the
 * record probes of the timestamp search use the simple (legacy) consumer
 * API instead, rd_kafka_consume_start/consume/consume_stop on one
 * partition, which needs none; a group.id among the caller's properties is
 * dropped for the same reason.
 *
 * Log bounds: rd_kafka_offsets_for_times with the timestamps -2 (log
 * start) and -1 (log end), not rd_kafka_query_watermark_offsets, which in
 * the librdkafka of Debian 12 (2.0.2; fixed in 2.3.0, issue #2588) waits
 * forever while the partition's broker is down, whatever its timeout.
 * Every librdkafka call gets what is left of the caller's timeout_ms.
 *
 * Timestamps: rd_kafka_offsets_for_times answers first. Where it answers
 * -1 (or fails) while the partition holds records, which is what the dev
 * broker (librdkafka's mock cluster) always does and what a real broker
 * does when every record is older than the time asked, the resolver
 * binary-searches the records themselves. That search assumes timestamps
 * never decrease along a partition, as they do with LogAppendTime and with
 * CreateTime from producers whose clocks agree; where they do not, it
 * returns some record at or after the time asked, not necessarily the
 * first (Kafka's own time index makes the same assumption).
 *
 * Threads: one thread at a time per resolver. librdkafka's log callback
 * runs on librdkafka's threads and only hands the line to fr_log.
 */
#include <inttypes.h>
#include <limits.h>
#include <librdkafka/rdkafka.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "ingest/ingest.h"
#include "ingest/ingest_int.h"

#define METADATA_TIMEOUT_MS 5000 /* ingest_resolver_partitions' wait   */
#define PROBE_POLL_MS       100  /* one rd_kafka_consume wait at most  */

struct ingest_resolver {
    rd_kafka_t *rk;
    char error[512]; /* why the last call failed, "" after a success */
};

/*
 * librdkafka's log callback. Runs on librdkafka's internal threads: it only
 * hands the line to fr_log, which writes it with one write(2).
 */
static void resolver_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    (void)rk;
    fr_log_level_t l = level <= 3 ? FR_LOG_ERROR : level <= 4 ? FR_LOG_WARN : FR_LOG_DEBUG;
    fr_log(l, "kafka resolver: %s: %s", fac, buf);
}

/* Formats the resolver's error text and returns err, like fr_errorf. */
static fr_err_t FR_PRINTF(3, 4) fail(ingest_resolver_t *rs, fr_err_t err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rs->error, sizeof(rs->error), fmt, ap);
    va_end(ap);
    return err;
}

static int64_t mono_ms(void)
{
    return (int64_t)(fr_clock_mono_ns() / 1000000u);
}

/* Milliseconds left until deadline (a mono_ms() time), 0 when passed. */
static int left_ms(int64_t deadline)
{
    int64_t left = deadline - mono_ms();
    return left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
}

/*
 * A resolver of bootstrap (may be NULL when props name bootstrap.servers)
 * with props applied in order after it, as for the producer, except
 * group.id, which is dropped (the resolver belongs to no group). Then, over
 * whatever props said: enable.auto.commit and enable.auto.offset.store
 * false (it never commits), enable.partition.eof true (a probe past the
 * last record must end), auto.offset.reset earliest (a probe below the log
 * start reads the first record there is) and fetch.wait.max.ms 10 (a probe
 * should not wait for more data). Returns NULL with errstr naming the
 * property librdkafka refused. Caller frees with ingest_resolver_destroy().
 */
ingest_resolver_t *ingest_resolver_new(const char *bootstrap, const char *const (*props)[2],
                                       size_t nprops, char *errstr, size_t size)
{
    static const char *const forced[][2] = {
        {"enable.auto.commit", "false"},  {"enable.auto.offset.store", "false"},
        {"enable.partition.eof", "true"}, {"auto.offset.reset", "earliest"},
        {"fetch.wait.max.ms", "10"},
    };
    char kerr[512];
    ingest_resolver_t *rs = calloc(1, sizeof(*rs));
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rs == NULL || conf == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "resolver: out of memory");
        goto err;
    }
    if (bootstrap != NULL && rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, kerr,
                                               sizeof(kerr)) != RD_KAFKA_CONF_OK) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "kafka property bootstrap.servers: %s", kerr);
        goto err;
    }
    for (size_t i = 0; i < nprops; i++) {
        if (strcmp(props[i][0], "group.id") == 0)
            continue;
        if (rd_kafka_conf_set(conf, props[i][0], props[i][1], kerr, sizeof(kerr)) !=
            RD_KAFKA_CONF_OK) {
            fr_errorf(FR_ERR_INVAL, errstr, size, "kafka property %s: %s", props[i][0], kerr);
            goto err;
        }
    }
    for (size_t i = 0; i < sizeof(forced) / sizeof(forced[0]); i++) {
        if (rd_kafka_conf_set(conf, forced[i][0], forced[i][1], kerr, sizeof(kerr)) !=
            RD_KAFKA_CONF_OK) {
            fr_errorf(FR_ERR_INVAL, errstr, size, "kafka property %s: %s", forced[i][0], kerr);
            goto err;
        }
    }
    rd_kafka_conf_set_log_cb(conf, resolver_log_cb);
    rs->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, kerr, sizeof(kerr));
    if (rs->rk == NULL) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "resolver: %s", kerr);
        goto err;
    }
    return rs;
err:
    if (conf != NULL)
        rd_kafka_conf_destroy(conf);
    free(rs);
    return NULL;
}

/* Destroys the handle (nothing to commit or leave). NULL is a no-op. */
void ingest_resolver_destroy(ingest_resolver_t *rs)
{
    if (rs == NULL)
        return;
    rd_kafka_destroy(rs->rk);
    free(rs);
}

/* Why the last call on rs failed ("" after a success, or for NULL).
 * Borrowed until the next call on rs. */
const char *ingest_resolver_error(const ingest_resolver_t *rs)
{
    return rs != NULL ? rs->error : "";
}

static int cmp_int32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/*
 * The partitions of topic, ascending, from the metadata of every topic of
 * the cluster, waiting up to 5 s for it. Asking for the one topic by name
 * would create it on a broker that creates topics on first use (the dev
 * broker does so whatever allow.auto.create.topics says), and a lookup must
 * not create what it looks for. Returns FR_OK with *parts (caller frees
 * with free()) and *n; FR_ERR_NOTFOUND when the cluster has no such topic;
 * FR_ERR_KAFKA when the metadata cannot be had; FR_ERR_NOMEM.
 */
fr_err_t ingest_resolver_partitions(ingest_resolver_t *rs, const char *topic, int32_t **parts,
                                    size_t *n)
{
    if (rs == NULL)
        return FR_ERR_INVAL;
    rs->error[0] = '\0';
    if (topic == NULL || parts == NULL || n == NULL)
        return fail(rs, FR_ERR_INVAL, "resolver: no topic");
    *parts = NULL;
    *n = 0;
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t kerr = rd_kafka_metadata(rs->rk, 1, NULL, &md, METADATA_TIMEOUT_MS);
    if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR)
        return fail(rs, FR_ERR_KAFKA, "metadata of %s: %s", topic, rd_kafka_err2str(kerr));
    fr_err_t err = FR_OK;
    const struct rd_kafka_metadata_topic *t = NULL;
    for (int i = 0; i < md->topic_cnt && t == NULL; i++) {
        if (strcmp(md->topics[i].topic, topic) == 0)
            t = &md->topics[i];
    }
    if (t == NULL || t->err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
        (t->err == RD_KAFKA_RESP_ERR_NO_ERROR && t->partition_cnt < 1)) {
        err = fail(rs, FR_ERR_NOTFOUND, "topic %s does not exist", topic);
    } else if (t->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        err = fail(rs, FR_ERR_KAFKA, "metadata of %s: %s", topic, rd_kafka_err2str(t->err));
    } else if ((*parts = malloc((size_t)t->partition_cnt * sizeof(**parts))) == NULL) {
        err = fail(rs, FR_ERR_NOMEM, "resolver: out of memory");
    } else {
        for (int i = 0; i < t->partition_cnt; i++)
            (*parts)[i] = t->partitions[i].id;
        qsort(*parts, (size_t)t->partition_cnt, sizeof(**parts), cmp_int32);
        *n = (size_t)t->partition_cnt;
    }
    rd_kafka_metadata_destroy(md);
    return err;
}

/*
 * Reads the first record of rkt/partition at or after offset: *found 1
 * with its offset *at and timestamp *ts_ms (-1 when it has none), or
 * *found 0 when the partition ends before one (offsets may have holes:
 * transaction markers, compaction). Partition-level errors are retried
 * until the deadline, since librdkafka retries them too. Returns FR_OK or
 * FR_ERR_KAFKA with the resolver's error.
 */
static fr_err_t probe(ingest_resolver_t *rs, rd_kafka_topic_t *rkt, int32_t partition,
                      int64_t offset, int64_t deadline, int *found, int64_t *at, int64_t *ts_ms)
{
    const char *topic = rd_kafka_topic_name(rkt);
    char last[256] = "";
    if (rd_kafka_consume_start(rkt, partition, offset) == -1)
        return fail(rs, FR_ERR_KAFKA, "reading %s/%" PRId32 " at %" PRId64 ": %s", topic, partition,
                    offset, rd_kafka_err2str(rd_kafka_last_error()));
    fr_err_t err = FR_ERR_KAFKA;
    for (int left; (left = left_ms(deadline)) > 0;) {
        rd_kafka_message_t *msg =
            rd_kafka_consume(rkt, partition, left < PROBE_POLL_MS ? left : PROBE_POLL_MS);
        if (msg == NULL)
            continue;
        if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
            rd_kafka_timestamp_type_t type;
            *found = 1;
            *at = msg->offset;
            *ts_ms = rd_kafka_message_timestamp(msg, &type);
            if (type == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE)
                *ts_ms = -1;
            err = FR_OK;
        } else if (msg->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            *found = 0;
            err = FR_OK;
        } else {
            snprintf(last, sizeof(last), ": %s", rd_kafka_err2str(msg->err));
        }
        rd_kafka_message_destroy(msg);
        if (err == FR_OK)
            break;
    }
    rd_kafka_consume_stop(rkt, partition);
    if (err != FR_OK)
        fail(rs, err, "reading %s/%" PRId32 " at %" PRId64 ": timed out%s", topic, partition,
             offset, last);
    return err;
}

/*
 * The offset of the first record of topic/partition whose timestamp is
 * >= at_ms, or hi when there is none, by binary search over [lo, hi) on
 * the records themselves (timestamps assumed non-decreasing: see the top
 * of this file). Invariants: every record below a is older than at_ms;
 * no record in [c, cand) needs a look (there is none, or cand is already
 * the first young one); cand is the best answer known (hi: none yet). The
 * first probe reads the last record, so a time after all of them costs one
 * probe. Returns FR_OK with *target, or FR_ERR_KAFKA.
 */
static fr_err_t search_time(ingest_resolver_t *rs, const char *topic, int32_t partition,
                            int64_t at_ms, int64_t lo, int64_t hi, int64_t deadline,
                            int64_t *target)
{
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rs->rk, topic, NULL);
    if (rkt == NULL)
        return fail(rs, FR_ERR_KAFKA, "topic %s: %s", topic,
                    rd_kafka_err2str(rd_kafka_last_error()));
    int64_t a = lo, c = hi, cand = hi, mid = hi - 1;
    int probes = 0;
    fr_err_t err = FR_OK;
    while (a < c) {
        int found = 0;
        int64_t at = 0, ts = -1;
        err = probe(rs, rkt, partition, mid, deadline, &found, &at, &ts);
        if (err != FR_OK)
            break;
        probes++;
        if (!found || at >= c) { /* nothing in [mid, c) */
            c = mid;
        } else if (ts >= at_ms) { /* the first record at or after mid is young */
            cand = at;
            c = mid;
        } else {                           /* everything up to `at` is older */
            a = (at > mid ? at : mid) + 1; /* at < mid never happens; still progress */
        }
        mid = a + (c - a) / 2;
    }
    rd_kafka_topic_destroy(rkt);
    if (err == FR_OK) {
        fr_log(FR_LOG_DEBUG,
               "resolver: %s/%" PRId32 " at %" PRId64 " ms: offset %" PRId64 " after %d probes",
               topic, partition, at_ms, cand, probes);
        *target = cand;
    }
    return err;
}

int ingest_list_offset(rd_kafka_t *rk, const char *topic, int32_t partition, int64_t ts,
                       int timeout_ms, int64_t *offset)
{
    rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);
    if (list == NULL)
        return RD_KAFKA_RESP_ERR__FAIL;
    rd_kafka_topic_partition_list_add(list, topic, partition)->offset = ts;
    rd_kafka_resp_err_t kerr = rd_kafka_offsets_for_times(rk, list, timeout_ms);
    if (kerr == RD_KAFKA_RESP_ERR_NO_ERROR)
        kerr = list->elems[0].err;
    *offset = list->elems[0].offset;
    rd_kafka_topic_partition_list_destroy(list);
    return kerr;
}

/*
 * ingest_list_offset with the resolver's deadline and error text. Returns
 * FR_OK with *offset (-1 where the broker has no answer for a time),
 * FR_ERR_NOTFOUND for an unknown topic or partition, else FR_ERR_KAFKA.
 */
static fr_err_t list_offset(ingest_resolver_t *rs, const char *topic, int32_t partition, int64_t ts,
                            int64_t deadline, int64_t *offset)
{
    rd_kafka_resp_err_t kerr = (rd_kafka_resp_err_t)ingest_list_offset(rs->rk, topic, partition, ts,
                                                                       left_ms(deadline), offset);
    const char *what = ts == -2 ? "log start" : ts == -1 ? "log end" : "offset by time";
    switch (kerr) {
    case RD_KAFKA_RESP_ERR_NO_ERROR: return FR_OK;
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
        return fail(rs, FR_ERR_NOTFOUND, "%s of %s/%" PRId32 ": %s", what, topic, partition,
                    rd_kafka_err2str(kerr));
    default:
        return fail(rs, FR_ERR_KAFKA, "%s of %s/%" PRId32 ": %s", what, topic, partition,
                    rd_kafka_err2str(kerr));
    }
}

/*
 * The DATETIME target of topic/partition with log bounds [lo, hi): the
 * broker's rd_kafka_offsets_for_times answer when it is an offset, else
 * search_time. A time at or before 1970 is the log start without asking:
 * every record is at or after it, and ListOffsets would read -1 and -2
 * as "latest" and "earliest". A failed question is not fatal unless time
 * ran out: the records themselves still tell.
 */
static fr_err_t resolve_time(ingest_resolver_t *rs, const char *topic, int32_t partition,
                             int64_t at_ms, int64_t lo, int64_t hi, int64_t deadline,
                             int64_t *target)
{
    if (lo >= hi || at_ms <= 0) {
        *target = lo;
        return FR_OK;
    }
    int64_t offset = -1;
    fr_err_t err = list_offset(rs, topic, partition, at_ms, deadline, &offset);
    if (err == FR_OK && offset >= 0) {
        *target = offset;
        return FR_OK;
    }
    if (left_ms(deadline) == 0)
        return err != FR_OK ? FR_ERR_KAFKA
                            : fail(rs, FR_ERR_KAFKA, "offset by time of %s/%" PRId32 ": timed out",
                                   topic, partition);
    fr_log(FR_LOG_DEBUG,
           "resolver: offsets_for_times(%s/%" PRId32 ", %" PRId64 ") answered %s;"
           " searching the records",
           topic, partition, at_ms, err != FR_OK ? rs->error : "-1");
    rs->error[0] = '\0';
    return search_time(rs, topic, partition, at_ms, lo, hi, deadline, target);
}

/* a + b, saturated to the int64_t range. */
static int64_t add_sat(int64_t a, int64_t b)
{
    if (b > 0 && a > INT64_MAX - b)
        return INT64_MAX;
    if (b < 0 && a < INT64_MIN - b)
        return INT64_MIN;
    return a + b;
}

/*
 * Resolves r for topic/partition (see ingest.h) within timeout_ms for the
 * whole call. target, lo and hi may not be NULL and are written only on
 * success. The log bounds come from rd_kafka_offsets_for_times (see
 * list_offset for why not rd_kafka_query_watermark_offsets). Returns
 * FR_OK; FR_ERR_INVAL when r does not apply to the partition or an
 * argument is bad; FR_ERR_NOTFOUND when the cluster says the topic or
 * partition does not exist; FR_ERR_KAFKA when Kafka does not answer in
 * time or fails. The error text is in ingest_resolver_error().
 */
fr_err_t ingest_resolver_target(ingest_resolver_t *rs, const psstore_replay_t *r, const char *topic,
                                int32_t partition, int64_t watermark, int timeout_ms,
                                int64_t *target, int64_t *lo, int64_t *hi)
{
    if (rs == NULL)
        return FR_ERR_INVAL;
    rs->error[0] = '\0';
    if (r == NULL || topic == NULL || target == NULL || lo == NULL || hi == NULL || timeout_ms < 0)
        return fail(rs, FR_ERR_INVAL, "resolver: bad arguments");
    int64_t listed = 0;
    if (!psstore_replay_applies(r, topic, partition, &listed))
        return fail(rs, FR_ERR_INVAL, "replay%s%.*s does not move %s/%" PRId32,
                    r->topic[0] != '\0' ? " of topic " : "",
                    (int)strnlen(r->topic, sizeof(r->topic)), r->topic, topic, partition);
    int64_t deadline = mono_ms() + timeout_ms;

    int64_t l = -1, h = -1, t = -1;
    fr_err_t err = list_offset(rs, topic, partition, -2, deadline, &l);
    if (err == FR_OK)
        err = list_offset(rs, topic, partition, -1, deadline, &h);
    if (err != FR_OK)
        return err;
    if (l < 0 || h < l)
        return fail(rs, FR_ERR_KAFKA, "log bounds of %s/%" PRId32 ": [%" PRId64 ", %" PRId64 ")",
                    topic, partition, l, h);

    switch (r->kind) {
    case PSSTORE_REPLAY_EARLIEST: t = l; break;
    case PSSTORE_REPLAY_LATEST: t = h; break;
    case PSSTORE_REPLAY_OFFSET: t = listed; break;
    case PSSTORE_REPLAY_SHIFT: t = add_sat(watermark >= 0 ? watermark : l, r->shift); break;
    case PSSTORE_REPLAY_DATETIME:
        err = resolve_time(rs, topic, partition, r->at_ms, l, h, deadline, &t);
        if (err != FR_OK)
            return err;
        break;
    default: return fail(rs, FR_ERR_INVAL, "replay: unknown kind %d", (int)r->kind);
    }
    *target = t < l ? l : t > h ? h : t;
    *lo = l;
    *hi = h;
    return FR_OK;
}
