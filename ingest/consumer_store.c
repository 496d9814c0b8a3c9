/*
 * consumer_store.c - the consumer's store bookkeeping: where an assigned
 * partition starts, and the once-a-second store tick (docs/design.md
 * "Offsets", "Replay").
 *
 * A partition starts at the store's watermark with the store's applied
 * intervals above it as the batcher's skip list (rule 2), or at the log
 * start or end for a partition the store never saw.
 *
 * Once a second (ingest_consumer_store_tick) the poll thread reads every
 * assigned partition's offsets from the store, all in one batch (a fixed
 * number of round trips whatever the partitions), and
 * - commits an advanced watermark to Kafka and sets the lag gauge;
 * - applies rule 3: a watermark that has not advanced for gap_timeout, at
 *   a position no outstanding batch holds (queued, lent to a trainer and
 *   not yet reported done, or pushed and still in the grads stream), is
 *   read again: the partition is seeked back to it with the store's
 *   applied intervals as the skip list;
 * - resolves a replay the applier published (psstore_replay_current) for
 *   every partition whose store generation is older: the targets are
 *   resolved against Kafka (ingest_resolver_target) and sent as one rewind
 *   request; the partitions are paused and dropped from the batcher until
 *   the applier has executed it, then restart where the store now says.
 *
 * Threads: everything here runs on the poll thread, which owns the store
 * connection (c->ps) and the assignment's bookkeeping (c->owned).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ingest/consumer_int.h"
#include "ingest/ingest_int.h"

#define RETRY_MS         500   /* pause between tries at assignment time */
#define HELD_WARN_GAPS   10    /* gap timeouts a held watermark may stand */
#define HELD_WARN_MS     30000 /* between two warnings of one partition   */
#define LOG_END_QUERY_MS 1000  /* a log end asked of the broker, at most  */
#define LOST_GAP_MS      1000  /* the gap rule's wait after a lost batch  */

/* ------------------------------------------------------------------------
 * Where a partition starts.
 * ---------------------------------------------------------------------- */

/*
 * Reads a partition's offsets from the store, retrying every RETRY_MS while
 * Redis fails and the consumer is not stopping (a partition must not start
 * anywhere but where the store says). FR_OK with *found, or the last error
 * once stopping.
 */
static fr_err_t store_read(ingest_consumer_t *c, const char *topic, int32_t partition,
                           psstore_partition_offsets_t *po, int *found)
{
    int warned = 0;
    for (;;) {
        fr_err_t err = FR_ERR_REDIS;
        if (c->ps == NULL) {
            char errstr[256];
            c->ps = psstore_conn_new(c->redis_url, STORE_TIMEOUT_MS, errstr, sizeof(errstr));
            if (c->ps != NULL)
                psstore_conn_set_cancel(c->ps, ingest_consumer_stopping, c);
            if (c->ps == NULL && !warned++)
                fr_log(FR_LOG_WARN, "ingest: %s (retrying)", errstr);
        }
        if (c->ps != NULL) {
            err = psstore_offsets_read(c->ps, c->model, topic, partition, po, found);
            if (err == FR_OK)
                return FR_OK;
            if (!warned++)
                fr_log(FR_LOG_WARN, "ingest: offsets of %s/%" PRId32 ": %s (retrying)", topic,
                       partition, psstore_conn_error(c->ps));
        }
        if (atomic_load(&c->stop))
            return err;
        sleep_ms(RETRY_MS);
    }
}

/* The log start and end of a partition, retrying while Kafka fails and the
 * consumer is not stopping. */
static fr_err_t log_bounds(ingest_consumer_t *c, const char *topic, int32_t partition, int64_t *lo,
                           int64_t *hi)
{
    for (int tries = 0;; tries++) {
        rd_kafka_resp_err_t kerr =
            ingest_list_offset(c->rk, topic, partition, -2, QUERY_TIMEOUT_MS, lo);
        if (kerr == RD_KAFKA_RESP_ERR_NO_ERROR)
            kerr = ingest_list_offset(c->rk, topic, partition, -1, QUERY_TIMEOUT_MS, hi);
        if (kerr == RD_KAFKA_RESP_ERR_NO_ERROR)
            return FR_OK;
        if (tries == 0)
            fr_log(FR_LOG_WARN, "ingest: log bounds of %s/%" PRId32 ": %s (retrying)", topic,
                   partition, rd_kafka_err2str(kerr));
        if (atomic_load(&c->stop))
            return FR_ERR_KAFKA;
        sleep_ms(RETRY_MS);
    }
}

/* The store's quarantine of the partition from pos on, given to the
 * batcher just seeked (docs/design.md "Poison in a batch"). Without it the
 * partition still starts: a record still poisonous is dropped again by the
 * worker that meets it. */
static void quarantine_load(ingest_consumer_t *c, const char *topic, int32_t partition, int64_t pos)
{
    int64_t *q = NULL;
    size_t nq = 0;
    fr_err_t err = c->ps != NULL
                       ? psstore_quarantine_read(c->ps, c->model, topic, partition, pos, &q, &nq)
                       : FR_ERR_REDIS;
    if (err == FR_OK && nq > 0)
        err = ingest_batcher_quarantine(c->bt, topic, partition, q, nq);
    if (err != FR_OK)
        fr_log(FR_LOG_WARN, "ingest: quarantine of %s/%" PRId32 ": %s (starting without it)", topic,
               partition,
               c->ps != NULL && err == FR_ERR_REDIS ? psstore_conn_error(c->ps) : fr_strerror(err));
    else if (nq > 0)
        fr_log(FR_LOG_INFO,
               "ingest: %s/%" PRId32 ": %zu quarantined position(s) from %" PRId64
               " on are rejected",
               topic, partition, nq, pos);
    free(q);
}

/*
 * Decides where one newly assigned partition starts and seeks the batcher
 * there: the store's watermark with its applied intervals as the skip list
 * (rule 2), or for a partition the store never saw the log start or end,
 * with [0, start) covered by an n = 0 batch of reason "start"; a watermark
 * below the log start (retention) is covered with reason "retention".
 * Returns the Kafka offset to assign, or -1 when stopping before it knew.
 */
int64_t ingest_consumer_partition_start(ingest_consumer_t *c, const char *topic, int32_t partition)
{
    psstore_partition_offsets_t po;
    int found = 0;
    int64_t lo = 0, hi = 0, start;
    psstore_poff_init(&po, 0);
    if (store_read(c, topic, partition, &po, &found) != FR_OK ||
        log_bounds(c, topic, partition, &lo, &hi) != FR_OK) {
        psstore_poff_fini(&po);
        return -1;
    }
    const char *reason = NULL;
    int64_t seek_at = found ? po.watermark : 0;
    start = found ? po.watermark : (c->start_latest ? hi : lo);
    if (!found && start > 0)
        reason = "start";
    else if (found && lo > start) {
        reason = "retention";
        start = lo;
    }
    /* the skip list of rule 2: the applied intervals above the watermark */
    int64_t(*skip)[2] = NULL;
    size_t nskip = found ? po.nspans : 0;
    fr_err_t err = FR_ERR_NOMEM;
    ingest_batch_t *flushed = NULL;
    if (nskip > 0 && (skip = malloc(nskip * sizeof(*skip))) != NULL) {
        for (size_t i = 0; i < nskip; i++) {
            skip[i][0] = po.spans[i].from;
            skip[i][1] = po.spans[i].to;
        }
    }
    /* without its skip list the partition is not seeked at all (rule 2):
     * its records are ignored until its next assignment */
    if (nskip == 0 || skip != NULL)
        err = ingest_batcher_seek(c->bt, topic, partition, seek_at, (const int64_t(*)[2])skip,
                                  nskip, found ? po.generation : 0, &flushed);
    /* a sharded model's positions some shard applied and another did not
     * are batched apart from other partitions' (docs/design.md "Shards") */
    if (err == FR_OK && found && po.alone_to > seek_at &&
        ingest_batcher_alone(c->bt, topic, partition, po.alone_to) != FR_OK)
        fr_log(FR_LOG_ERROR, "ingest: %s/%" PRId32 ": cannot batch it alone below %" PRId64, topic,
               partition, po.alone_to); /* unreachable: just seeked, holding nothing */
    if (err != FR_OK)
        fr_log(FR_LOG_ERROR, "ingest: seek of %s/%" PRId32 " to %" PRId64 ": %s", topic, partition,
               seek_at, fr_strerror(err));
    else
        quarantine_load(c, topic, partition, seek_at);
    ingest_consumer_queue_push(c, flushed);
    if (err == FR_OK && reason != NULL && start > seek_at)
        ingest_consumer_queue_push(c, ingest_batcher_cover(c->bt, topic, partition, start, reason));
    fr_log(FR_LOG_INFO,
           "ingest: %s/%" PRId32 " starts at %" PRId64 " (%s, %zu applied interval(s) above)",
           topic, partition, start, found ? "store" : (c->start_latest ? "latest" : "earliest"),
           found ? po.nspans : (size_t)0);
    free(skip);
    psstore_poff_fini(&po);
    return start;
}

/* ------------------------------------------------------------------------
 * Restarts and replays.
 * ---------------------------------------------------------------------- */

/* Seeks the consumer's fetch position of a partition (librdkafka drops
 * what it had fetched beyond). Poll thread. */
static void seek_kafka(ingest_consumer_t *c, int32_t partition, int64_t offset)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    if (l == NULL)
        return;
    rd_kafka_topic_partition_list_add(l, c->topic, partition)->offset = offset;
    rd_kafka_error_t *error = rd_kafka_seek_partitions(c->rk, l, QUERY_TIMEOUT_MS);
    if (error != NULL) {
        fr_log(FR_LOG_WARN, "ingest: seek of %s/%" PRId32 " to %" PRId64 ": %s", c->topic,
               partition, offset, rd_kafka_error_string(error));
        rd_kafka_error_destroy(error);
    } else if (l->elems[0].err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fr_log(FR_LOG_WARN, "ingest: seek of %s/%" PRId32 " to %" PRId64 ": %s", c->topic,
               partition, offset, rd_kafka_err2str(l->elems[0].err));
    }
    rd_kafka_topic_partition_list_destroy(l);
}

/* Starts a partition again where the store says (partition_start) and
 * moves the Kafka fetch position there. Poll thread. */
static void restart(ingest_consumer_t *c, owned_t *o)
{
    int64_t start = ingest_consumer_partition_start(c, c->topic, o->partition);
    if (start >= 0)
        seek_kafka(c, o->partition, start);
    o->since = now_ms();
}

/*
 * Reads the replay the applier last published and parses it when it is
 * new. A replay that does not parse is logged once and ignored (its
 * generation still counts as seen). Poll thread.
 */
static void replay_read(ingest_consumer_t *c)
{
    int64_t gen = 0;
    if (psstore_replay_current(c->ps, c->model, &gen, c->spec, PSSTORE_REPLAY_SPEC_MAX, NULL) !=
            FR_OK ||
        gen <= c->replay_gen)
        return;
    char errstr[256];
    c->replay_gen = gen;
    c->replay_ok = c->spec[0] != '\0' && psstore_replay_parse(c->replay, c->spec, strlen(c->spec),
                                                              errstr, sizeof(errstr)) == FR_OK;
    if (c->spec[0] != '\0' && !c->replay_ok)
        fr_log(FR_LOG_ERROR, "ingest: replay generation %" PRId64 " ignored: %s", gen, errstr);
}

/*
 * Resolves the published replay for one partition whose store generation
 * is older (rule: the owner resolves, docs/design.md "Replay"): FR_OK with
 * *target, or *target = -1 when the replay does not move this partition.
 * FR_ERR_KAFKA when Kafka did not answer (tried again at the next tick).
 */
static fr_err_t replay_target(ingest_consumer_t *c, int32_t partition, int64_t watermark,
                              int64_t *target)
{
    char errstr[512];
    *target = -1;
    if (!psstore_replay_applies(c->replay, c->topic, partition, NULL))
        return FR_OK;
    if (c->rs == NULL &&
        (c->rs = ingest_resolver_new(c->bootstrap, (const char *const(*)[2])c->props, c->nprops,
                                     errstr, sizeof(errstr))) == NULL) {
        fr_log(FR_LOG_ERROR, "ingest: replay: %s", errstr);
        return FR_ERR_KAFKA;
    }
    int64_t lo, hi;
    fr_err_t err = ingest_resolver_target(c->rs, c->replay, c->topic, partition, watermark,
                                          QUERY_TIMEOUT_MS, target, &lo, &hi);
    if (err != FR_OK)
        fr_log(FR_LOG_WARN,
               "ingest: replay generation %" PRId64 " of %s/%" PRId32 ": %s (retrying)",
               c->replay_gen, c->topic, partition, ingest_resolver_error(c->rs));
    return err;
}

/*
 * Sends the rewrites of ntargets resolved partitions in one rewind request
 * and holds those partitions (paused, out of the batcher: what was read of
 * them is flushed under the old generation, which the applier drops) until
 * the applier has executed it. Poll thread.
 */
static void replay_submit(ingest_consumer_t *c, const psstore_rewind_t *targets, size_t ntargets)
{
    if (psstore_request_rewind(c->ps, c->model, c->replay_gen, targets, ntargets, c->rewind_id) !=
        FR_OK) {
        fr_log(FR_LOG_WARN, "ingest: replay generation %" PRId64 ": %s (retrying)", c->replay_gen,
               psstore_conn_error(c->ps));
        c->rewind_id[0] = '\0';
        for (size_t i = 0; i < ntargets; i++)
            for (int j = 0; j < c->nowned; j++)
                if (c->owned[j].partition == targets[i].partition)
                    c->owned[j].replay_seen = 0;
        return;
    }
    for (size_t i = 0; i < ntargets; i++) {
        for (int j = 0; j < c->nowned; j++) {
            owned_t *o = &c->owned[j];
            if (o->partition != targets[i].partition)
                continue;
            ingest_batch_t *flushed = NULL;
            if (ingest_batcher_revoke(c->bt, c->topic, o->partition, &flushed) == FR_OK)
                ingest_consumer_queue_push(c, flushed);
            ingest_consumer_pause_one(c, o->partition, 1);
            o->rewinding = 1;
            fr_log(FR_LOG_INFO,
                   "ingest: replay generation %" PRId64 " rewinds %s/%" PRId32 " to %" PRId64,
                   c->replay_gen, c->topic, o->partition, targets[i].target);
        }
    }
}

/* ------------------------------------------------------------------------
 * The store tick. ingest_consumer_store_tick does seven jobs, one function
 * each, in this order: notice an executed rewind (rewind_executed), read
 * the published replay (replay_read), restart the rewound partitions
 * (rewind_finish), read every partition's offsets in one batch
 * (tick_offsets), then per partition (tick_partition) resolve its replay
 * target (tick_replay), note its log end and lag and its advanced
 * watermark (tick_logend, tick_commit) and apply the gap rule (gap_rule);
 * tick_send then sends what the partitions gathered.
 * ---------------------------------------------------------------------- */

/* What one tick gathers over the assigned partitions and sends at its end. */
typedef struct tick {
    int final;                                /* at stop: commits only       */
    int64_t now;                              /* monotonic ms, once per tick */
    int64_t lag;                              /* summed over the partitions  */
    rd_kafka_topic_partition_list_t *commits; /* watermarks that advanced    */
    psstore_rewind_t *targets;                /* [ntargets] replay rewrites  */
    psstore_logend_t *ends;                   /* [nends] for the lag of serve */
    size_t ntargets, nends, cap;              /* ntargets, nends <= cap      */
    int64_t *w, *gen;                         /* [cap] by owned: the store's  */
    int *found;                               /* watermark, generation, seen */
} tick_t;

/* Nonzero when the applier has executed our rewind request (which is then
 * forgotten). */
static int rewind_executed(ingest_consumer_t *c)
{
    if (c->rewind_id[0] == '\0' || psstore_request_wait(c->ps, c->model, c->rewind_id, 0) != FR_OK)
        return 0;
    c->rewind_id[0] = '\0';
    return 1;
}

/* A partition whose rewind the applier executed starts again where the
 * store now says, and resumes unless the whole assignment is paused. */
static void rewind_finish(ingest_consumer_t *c, owned_t *o)
{
    o->rewinding = 0;
    restart(c, o);
    if (!c->paused)
        ingest_consumer_pause_one(c, o->partition, 0);
    atomic_fetch_add(&c->rewinds, 1);
    if (c->m_rewinds != NULL)
        fr_series_add(c->m_rewinds, 1);
}

/*
 * Reads every owned partition's watermark and generation from the store
 * into tk->w, tk->gen and tk->found (indexed as c->owned), in one batch: a
 * fixed number of round trips whatever the number of partitions, during
 * which the poll thread does not poll Kafka (docs/design.md "Offsets").
 * FR_OK, or the store's error or FR_ERR_NOMEM (logged at debug level).
 */
static fr_err_t tick_offsets(ingest_consumer_t *c, tick_t *tk)
{
    size_t n = (size_t)c->nowned;
    if (n == 0) /* nothing owned: nothing to read */
        return FR_OK;
    int32_t *parts = malloc(n * sizeof(*parts));
    psstore_partition_offsets_t *po = malloc(n * sizeof(*po));
    fr_err_t err = FR_ERR_NOMEM;
    FR_ASSERT(n <= tk->cap);
    if (parts != NULL && po != NULL) {
        for (size_t i = 0; i < n; i++) {
            parts[i] = c->owned[i].partition;
            psstore_poff_init(&po[i], 0);
        }
        err = psstore_offsets_read_many(c->ps, c->model, c->topic, parts, n, po, tk->found);
        for (size_t i = 0; i < n; i++) {
            tk->w[i] = po[i].watermark;
            tk->gen[i] = po[i].generation;
            psstore_poff_fini(&po[i]);
        }
    }
    if (err != FR_OK)
        fr_log(FR_LOG_DEBUG, "ingest: %s",
               err == FR_ERR_NOMEM ? fr_strerror(err) : psstore_conn_error(c->ps));
    free(parts);
    free(po);
    return err;
}

/* A replay newer than the partition's generation (gen): its target,
 * resolved against the watermark w (-1: none in the store), joins the
 * tick's rewind request. Kafka not answering leaves it for the next tick. */
static void tick_replay(ingest_consumer_t *c, owned_t *o, int64_t w, int64_t gen, tick_t *tk)
{
    if (tk->final || !c->replay_ok || c->rewind_id[0] != '\0' || o->rewinding ||
        c->replay_gen <= gen || c->replay_gen <= o->replay_seen)
        return;
    int64_t target;
    if (replay_target(c, o->partition, w, &target) != FR_OK)
        return;
    o->replay_seen = c->replay_gen;
    if (target >= 0) {
        FR_ASSERT(tk->ntargets < tk->cap);
        tk->targets[tk->ntargets++] = (psstore_rewind_t){c->topic, o->partition, target};
    }
}

/* The partition's log end as librdkafka last saw it: its lag behind the
 * store's watermark w goes to the gauges, the log end to the store. */
static void tick_logend(ingest_consumer_t *c, const owned_t *o, int64_t w, tick_t *tk)
{
    int64_t lo, hi;
    if (rd_kafka_get_watermark_offsets(c->rk, c->topic, o->partition, &lo, &hi) !=
            RD_KAFKA_RESP_ERR_NO_ERROR ||
        hi < 0)
        return;
    FR_ASSERT(tk->nends < tk->cap);
    tk->ends[tk->nends++] = (psstore_logend_t){c->topic, o->partition, hi, w};
    tk->lag += hi > w ? hi - w : 0;
    if (o->lag != NULL)
        fr_series_set(o->lag, (double)(hi > w ? hi - w : 0));
}

/* A watermark w above the one last committed joins the tick's commit. */
static void tick_commit(ingest_consumer_t *c, owned_t *o, int64_t w, tick_t *tk)
{
    if (w <= o->committed)
        return;
    rd_kafka_topic_partition_list_add(tk->commits, c->topic, o->partition)->offset = w;
    o->committed = w;
}

/* The partition's log end: librdkafka's cached one, which only its
 * fetches update, else asked of the broker (a partition never fetched
 * has none cached); -1 when unknown. */
static int64_t log_end(ingest_consumer_t *c, int32_t partition)
{
    int64_t lo, hi;
    if (rd_kafka_get_watermark_offsets(c->rk, c->topic, partition, &lo, &hi) ==
            RD_KAFKA_RESP_ERR_NO_ERROR &&
        hi >= 0)
        return hi;
    return ingest_list_offset(c->rk, c->topic, partition, -1, LOG_END_QUERY_MS, &hi) ==
                   RD_KAFKA_RESP_ERR_NO_ERROR
               ? hi
               : -1;
}

void ingest_consumer_lost(ingest_consumer_t *c)
{
    if (c != NULL)
        atomic_store(&c->lost_ms, (long long)now_ms());
}

/* Rule 3: a watermark w stuck for gap_timeout (LOST_GAP_MS for a while
 * after a trainer reported a lost batch) that no outstanding batch
 * holds is read again from the store's position. One stuck and held for
 * HELD_WARN_GAPS gap timeouts is warned of, with what holds it, once per
 * HELD_WARN_MS: a trainer that stopped taking batches shows here. */
static void gap_rule(ingest_consumer_t *c, owned_t *o, int64_t w, const tick_t *tk)
{
    if (w != o->watermark) {
        o->watermark = w;
        o->since = tk->now;
        return;
    }
    /* a batch reported lost: its positions come back sooner */
    int64_t limit = c->gap_ms, lost = atomic_load(&c->lost_ms);
    if (lost > 0 && tk->now - lost < c->gap_ms && limit > LOST_GAP_MS)
        limit = LOST_GAP_MS;
    if (tk->final || c->gap_ms <= 0 || tk->now - o->since < LOST_GAP_MS)
        return;
    int dropped = 0;
    const char *held = ingest_consumer_outstanding(c, o->partition, w, &dropped);
    if (tk->now - o->since < limit) {
        /* sooner too when a gradient this consumer pushed for w left the
         * stream without marking it (it was dropped): seen at two ticks in a
         * row at the same watermark, lest a commit between the watermark's
         * read and the stream's look pass for a drop */
        int again = held == NULL && dropped && o->dropped_at == w;
        o->dropped_at = held == NULL && dropped ? w : -1;
        if (!again)
            return;
    }
    if (held != NULL) {
        if (tk->now - o->since >= (int64_t)HELD_WARN_GAPS * c->gap_ms &&
            tk->now - o->held_warned >= HELD_WARN_MS && log_end(c, o->partition) > w) {
            o->held_warned = tk->now;
            fr_log(FR_LOG_WARN,
                   "ingest: %s/%" PRId32 ": watermark %" PRId64 " stuck for %" PRId64
                   " ms with %" PRId64 " record(s) after it, held by %s",
                   c->topic, o->partition, w, tk->now - o->since, log_end(c, o->partition) - w,
                   held);
        }
        return;
    }
    fr_log(FR_LOG_INFO,
           "ingest: %s/%" PRId32 ": watermark %" PRId64 " stuck for %" PRId64
           " ms and held by no outstanding batch%s: reading again from it",
           c->topic, o->partition, w, tk->now - o->since,
           tk->now - o->since < limit ? " (its gradient was dropped)" : "");
    o->dropped_at = -1;
    restart(c, o);
    atomic_fetch_add(&c->gap_seeks, 1);
    if (c->m_gap != NULL)
        fr_series_add(c->m_gap, 1);
}

/* The end of a tick: the summed lag, the log ends (for the lag shown by
 * processes without Kafka, serve), the rewind request and the commit. */
static void tick_send(ingest_consumer_t *c, tick_t *tk)
{
    atomic_store(&c->lag, tk->lag);
    if (tk->nends > 0 && !tk->final &&
        psstore_logend_report(c->ps, c->model, tk->ends, tk->nends) != FR_OK)
        fr_log(FR_LOG_DEBUG, "ingest: %s", psstore_conn_error(c->ps));
    if (tk->ntargets > 0)
        replay_submit(c, tk->targets, tk->ntargets);
    if (tk->commits != NULL && tk->commits->cnt > 0) {
        rd_kafka_resp_err_t kerr = rd_kafka_commit(c->rk, tk->commits, 1);
        if (kerr != RD_KAFKA_RESP_ERR_NO_ERROR)
            ingest_consumer_commit_cb(c->rk, kerr, tk->commits, c);
    }
}

/*
 * librdkafka's offset commit callback. Runs on the poll thread, inside
 * rd_kafka_consumer_poll. A failed commit is tried again at the next tick.
 */
void ingest_consumer_commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                               rd_kafka_topic_partition_list_t *offsets, void *opaque)
{
    (void)rk;
    ingest_consumer_t *c = opaque;
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR || err == RD_KAFKA_RESP_ERR__NO_OFFSET)
        return;
    /* a commit that meets a rebalance is expected; the next owner commits */
    int expected = err == RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS ||
                   err == RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION ||
                   err == RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID;
    fr_log(expected ? FR_LOG_INFO : FR_LOG_WARN, "ingest: kafka commit failed: %s (retrying)",
           rd_kafka_err2str(err));
    for (int i = 0; offsets != NULL && i < offsets->cnt; i++)
        for (int j = 0; j < c->nowned; j++)
            if (c->owned[j].partition == offsets->elems[i].partition)
                c->owned[j].committed = -1;
}

/* One partition's part of the tick, given the store's watermark w and
 * generation gen of it (found: the store saw it). */
static void tick_partition(ingest_consumer_t *c, owned_t *o, int64_t w, int64_t gen, int found,
                           tick_t *tk)
{
    tick_replay(c, o, found ? w : -1, gen, tk);
    if (o->rewinding)
        return;
    if (found) {
        tick_logend(c, o, w, tk);
        tick_commit(c, o, w, tk);
    } else {
        w = 0; /* nothing marked yet: a lost first batch must be seen too */
    }
    gap_rule(c, o, w, tk);
}

/*
 * Every COMMIT_EVERY_MS: reads every assigned partition's offsets from the
 * store (in one batch), commits watermarks that advanced to Kafka (async),
 * updates the lag gauges, applies the gap rule and carries replays forward
 * (see the top of this file); the final tick, at stop, only commits. A
 * Redis error ends this tick before any partition's part. Poll thread.
 */
void ingest_consumer_store_tick(ingest_consumer_t *c, int final)
{
    if (c->nowned == 0 || c->ps == NULL)
        return;
    int rewound = rewind_executed(c);
    if (c->rewind_id[0] == '\0' && !final)
        replay_read(c);
    /* before the read, so that it sees where they start again (each
     * restart reads its own partition's offsets, as an assignment does) */
    for (int i = 0; rewound && i < c->nowned; i++)
        if (c->owned[i].rewinding)
            rewind_finish(c, &c->owned[i]);
    tick_t tk = {.final = final, .cap = (size_t)c->nowned};
    tk.commits = rd_kafka_topic_partition_list_new(c->nowned);
    tk.targets = calloc(tk.cap, sizeof(*tk.targets));
    tk.ends = calloc(tk.cap, sizeof(*tk.ends));
    tk.w = calloc(tk.cap, sizeof(*tk.w));
    tk.gen = calloc(tk.cap, sizeof(*tk.gen));
    tk.found = calloc(tk.cap, sizeof(*tk.found));
    tk.now = now_ms();
    if (tk.commits != NULL && tk.targets != NULL && tk.ends != NULL && tk.w != NULL &&
        tk.gen != NULL && tk.found != NULL && tick_offsets(c, &tk) == FR_OK)
        for (int i = 0; i < c->nowned; i++)
            tick_partition(c, &c->owned[i], tk.w[i], tk.gen[i], tk.found[i], &tk);
    tick_send(c, &tk);
    free(tk.ends);
    if (tk.commits != NULL)
        rd_kafka_topic_partition_list_destroy(tk.commits);
    free(tk.targets);
    free(tk.w);
    free(tk.gen);
    free(tk.found);
    ingest_consumer_lent_prune(c);
}
