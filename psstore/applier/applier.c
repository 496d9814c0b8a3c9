/*
 * applier.c - the single writer of a model (docs/design.md "One writer and fencing").
 *
 * The applier holds the lease (SET NX PX, renewed by every commit and by a
 * compare-and-expire script when idle), reads gradients from the grads
 * stream through the consumer group "appliers", decides each one (epoch,
 * duplicate positions, then the controller), applies it to its in-memory
 * copy of the weights, and commits weights, optimizer state, version,
 * offsets, versions and audit entries and the XACK/XDEL of the consumed
 * entries in ONE transaction guarded by WATCH lease. A nil EXEC means the
 * lease was lost: everything in memory is dropped and the applier returns
 * to standby, so a stalled applier that wakes up can never overwrite its
 * successor.
 *
 * This file holds construction, the stats, deciding one gradient and the
 * loop; the transaction, the rounds, the operator requests and the lease
 * are in the applier_*.c files beside it (applier_int.h lists them).
 *
 * Thread: an applier belongs to one thread; psstore_applier_stats() may be
 * called from any thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "psstore/applier/applier_int.h"

#define READ_COUNT        64         /* entries per XREADGROUP, at most ...       */
#define READ_BYTES        (16 << 20) /* ... and about this many payload bytes   */
#define SPARSE_GRAD_GUESS 16384      /* floats of a sparse gradient, for that estimate */
#define MEMBERS_MS        500        /* how often the applier reads the members hash     */
#define LOCAL_WAIT_MS     10         /* longest wait on the in-process channel per look  */
#define STREAM_NAP_NS     1000000u   /* a commit window's nap between empty stream reads */

static const char *const drop_names[] = {"epoch",     "replay",    "duplicate",
                                         "malformed", "nonfinite", "staleness",
                                         "empty",     "stopped",   "backup"};

const char *psstore_drop_name(psstore_drop_t d)
{
    return (unsigned)d < sizeof(drop_names) / sizeof(drop_names[0]) ? drop_names[d] : "unknown";
}

/* ---- small helpers -------------------------------------------------------- */

int ps_buf_add(buf_t *b, const void *p, size_t len)
{
    if (b->len + len > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + len)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (np == NULL)
            return -1;
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, len);
    b->len += len;
    return 0;
}

/* Appends "field\0value\0" to b. */
int ps_buf_kv(buf_t *b, const char *field, const char *fmt, ...)
{
    char val[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(val, sizeof(val), fmt, ap);
    va_end(ap);
    return ps_buf_add(b, field, strlen(field) + 1) || ps_buf_add(b, val, strlen(val) + 1);
}

void ps_applier_stats_update(psstore_applier_t *a)
{
    char *shown = a->shown_epoch;
    if (a->m_epoch != NULL && a->active) {
        char epoch[32];
        snprintf(epoch, sizeof(epoch), "%llu", (unsigned long long)a->epoch);
        if (strcmp(epoch, shown) != 0) {
            if (shown[0] != '\0') {
                const char *old[] = {a->model, shown};
                fr_series_set(fr_metric_series(a->m_epoch, old), 0);
            }
            const char *now[] = {a->model, epoch};
            fr_series_set(fr_metric_series(a->m_epoch, now), 1);
            snprintf(a->shown_epoch, sizeof(a->shown_epoch), "%s", epoch);
        }
    }
    if (a->m_stopped != NULL && a->active)
        fr_series_set(a->m_stopped, a->stopped[0] != '\0');
    pthread_mutex_lock(&a->lock);
    a->stats.active = a->active;
    a->stats.epoch = a->epoch;
    a->stats.version = a->committed;
    snprintf(a->stats.stopped, sizeof(a->stats.stopped), "%s", a->stopped);
    pthread_mutex_unlock(&a->lock);
}

/* Counts a drop and, when the gradient is known, records it for the drops
 * stream (written with the next commit). */
void ps_applier_count_drop(psstore_applier_t *a, psstore_drop_t d, const psstore_grad_t *g)
{
    if (g != NULL) {
        if (a->drops.len > 0)
            ps_buf_add(&a->drops, "\1", 1);
        ps_buf_kv(&a->drops, "worker", "%s", g->worker != NULL ? g->worker : "");
        ps_buf_kv(&a->drops, "reason", "%s", drop_names[d]);
        ps_buf_kv(&a->drops, "n", "%lld", (long long)g->n);
        ps_buf_kv(&a->drops, "t", "%lld", (long long)fr_clock_unix_ms());
    }
    pthread_mutex_lock(&a->lock);
    a->stats.dropped[d]++;
    pthread_mutex_unlock(&a->lock);
    fr_series_add(a->m_dropped[d], 1);
}

/* ---- metrics ---------------------------------------------------------------- */

static void register_metrics(psstore_applier_t *a)
{
    fr_metrics_t *reg = a->conf.metrics;
    if (reg == NULL)
        return;
    const char *model_l[] = {"model"}, *reason_l[] = {"model", "reason"};
    const char *mv[] = {a->model};
    static const double stale_bounds[] = {0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128};
    static const double lat_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                        0.01,   0.025,   0.05,   0.1,   0.25,   1};
    a->m_applied = fr_metric_series(
        fr_metrics_counter(reg, "freshet_gradients_applied_total", "Gradients applied", 1, model_l),
        mv);
    fr_metric_t *dropped = fr_metrics_counter(reg, "freshet_gradients_dropped_total",
                                              "Gradients not applied, by reason", 2, reason_l);
    for (int d = 0; d < PSSTORE_NDROP; d++) {
        const char *v[] = {a->model, drop_names[d]};
        a->m_dropped[d] = fr_metric_series(dropped, v);
    }
    a->m_stale = fr_metric_series(fr_metrics_histogram(reg, "freshet_gradient_staleness_versions",
                                                       "Staleness tau of applied gradients", 13,
                                                       stale_bounds, 1, model_l),
                                  mv);
    a->m_lr =
        fr_metric_series(fr_metrics_gauge(reg, "freshet_lr_eff",
                                          "Effective learning rate of the last update", 1, model_l),
                         mv);
    a->m_version = fr_metric_series(
        fr_metrics_gauge(reg, "freshet_model_version", "Committed model version", 1, model_l), mv);
    a->m_loss =
        fr_metric_series(fr_metrics_gauge(reg, "freshet_train_loss",
                                          "Mean loss of the last applied batch", 1, model_l),
                         mv);
    a->m_bytes = fr_metric_series(
        fr_metrics_counter(reg, "freshet_applier_redis_bytes_total",
                           "Payload bytes the applier moved to and from Redis", 1, model_l),
        mv);
    a->m_latency =
        fr_metric_series(fr_metrics_histogram(reg, "freshet_apply_latency_seconds",
                                              "Time to decide and apply one gradient in memory", 12,
                                              lat_bounds, 1, model_l),
                         mv);
    a->m_commit_latency = fr_metric_series(
        fr_metrics_histogram(reg, "freshet_commit_latency_seconds",
                             "Time of one commit transaction, from the lease check to the reply "
                             "(the applier applies nothing meanwhile)",
                             12, lat_bounds, 1, model_l),
        mv);
    a->m_summed = fr_metric_series(
        fr_metrics_counter(reg, "freshet_gradients_summed_by_worker_total",
                           "Gradients decided on the sum of squares their worker sent with "
                           "them (in-process), without a pass of the applier's own",
                           1, model_l),
        mv);
    static const double fresh_bounds[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    a->m_fresh = fr_metric_series(
        fr_metrics_histogram(reg, "freshet_sample_freshness_seconds",
                             "From a sample's Kafka timestamp to the commit of the version that "
                             "holds it (oldest and newest sample of each applied batch)",
                             12, fresh_bounds, 1, model_l),
        mv);
    a->m_commits = fr_metric_series(fr_metrics_counter(reg, "freshet_applier_commits_total",
                                                       "Transactions committed", 1, model_l),
                                    mv);
    const char *epoch_l[] = {"model", "epoch"};
    a->m_epoch = fr_metrics_gauge(reg, "freshet_model_epoch_info",
                                  "The model's current epoch (a random 64-bit lineage id) as a "
                                  "label; 1 for the current one, 0 for earlier ones",
                                  2, epoch_l);
    a->m_fenced = fr_metric_series(
        fr_metrics_counter(reg, "freshet_applier_fenced_total",
                           "Transactions refused because the lease was lost", 1, model_l),
        mv);
    a->m_unreplicated = fr_metric_series(
        fr_metrics_counter(reg, "freshet_applier_commits_unreplicated_total",
                           "Commits that fewer than [redis] wait_replicas replicas acknowledged "
                           "within wait_timeout_ms",
                           1, model_l),
        mv);
    a->m_evicted = fr_metric_series(
        fr_metrics_counter(reg, "freshet_sparse_rows_evicted_total",
                           "A sparse model's rows deleted after [sparse] ttl_seconds without a "
                           "step, each published as a tombstone",
                           1, model_l),
        mv);
    a->m_stopped = fr_metric_series(
        fr_metrics_gauge(reg, "freshet_model_stopped",
                         "1 while the divergence guard stops the model (until a rollback), "
                         "as this applier last saw it",
                         1, model_l),
        mv);
    a->m_updated = fr_metric_series(
        fr_metrics_gauge(reg, "freshet_model_updated_timestamp_seconds",
                         "Unix time this applier last committed a new version (or took the "
                         "lease)",
                         1, model_l),
        mv);
    a->m_takeovers = fr_metric_series(
        fr_metrics_counter(reg, "freshet_applier_lease_takeovers_total",
                           "Times this applier took the model's lease and became its writer", 1,
                           model_l),
        mv);
}

/* ---- construction -------------------------------------------------------------- */

void psstore_applier_conf_init(psstore_applier_conf_t *conf)
{
    memset(conf, 0, sizeof(*conf));
    psstore_ctl_conf_init(&conf->ctl);
    conf->lease_ms = fr_config_default_int("psstore", "lease_ms");
    conf->commit_ms = 0; /* not [psstore]'s 20: see psstore.h */
    conf->versions_keep = fr_config_default_int("psstore", "versions_keep");
    conf->snapshot_every = fr_config_default_int("psstore", "snapshot_every");
    conf->snapshot_seconds = fr_config_default_double("psstore", "snapshot_seconds");
    conf->snapshot_retain = fr_config_default_int("psstore", "snapshot_retain");
    conf->audit = fr_config_default_bool("psstore", "audit");
    conf->npushers = 1; /* not [trainer] workers: see psstore.h */
    /* the schema's name parses; were it not to, the zeroed mode is async */
    psstore_mode_parse(fr_config_default("trainer", "mode"), &conf->mode);
    conf->backups = (int)fr_config_default_int("trainer", "backups");
    conf->sync_lr_linear = strcmp(fr_config_default("trainer", "sync_lr_scale"), "linear") == 0;
    conf->member_timeout_ms =
        (int64_t)(fr_config_default_double("trainer", "member_timeout") * 1000);
    conf->round_timeout_ms = (int64_t)(fr_config_default_double("trainer", "round_timeout") * 1000);
    conf->wait_replicas = (int)fr_config_default_int("redis", "wait_replicas");
    conf->wait_timeout_ms = fr_config_default_int("redis", "wait_timeout_ms");
}

psstore_applier_t *psstore_applier_new(const psstore_applier_conf_t *conf, char *errstr,
                                       size_t size)
{
    if (psstore_model_name_check(conf->model, errstr, size) != FR_OK)
        return NULL;
    if (conf->lease_ms < 100 || conf->snapshot_retain < 1 || conf->versions_keep < 1) {
        fr_errorf(FR_ERR_INVAL, errstr, size,
                  "applier: lease_ms >= 100, snapshot_retain >= 1, versions_keep >= 1");
        return NULL;
    }
    if (conf->member_timeout_ms < 1 || conf->round_timeout_ms < 1 || conf->backups < 0) {
        fr_errorf(FR_ERR_INVAL, errstr, size,
                  "applier: member_timeout and round_timeout must be positive, backups >= 0");
        return NULL;
    }
    if (conf->commit_ms < 0 || conf->commit_ms * 3 >= conf->lease_ms) {
        fr_errorf(FR_ERR_INVAL, errstr, size,
                  "applier: commit_ms (%lld) must stay below a third of lease_ms (%lld), or the "
                  "lease lapses between commits",
                  (long long)conf->commit_ms, (long long)conf->lease_ms);
        return NULL;
    }
    psstore_applier_t *a = calloc(1, sizeof(*a));
    if (a == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "applier: out of memory");
        return NULL;
    }
    a->conf = *conf;
    snprintf(a->url, sizeof(a->url), "%s", conf->url);
    snprintf(a->name, sizeof(a->name), "%s", conf->model);
    snprintf(a->model, sizeof(a->model), "%s", conf->model);
    a->conf.url = a->url;
    a->conf.model = a->name;
    pthread_mutex_init(&a->lock, NULL);
    if (conf->sparse.enabled && (a->sp = ps_sparse_new(&conf->sparse)) == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "applier: out of memory");
        pthread_mutex_destroy(&a->lock);
        free(a);
        return NULL;
    }
    char host[64] = "host";
    gethostname(host, sizeof(host) - 1);
    char scope[64];
    ps_applier_scope(scope, sizeof(scope));
    snprintf(a->token, sizeof(a->token), "%.60s/%d/%016llx/%s", host, (int)getpid(),
             (unsigned long long)fr_random_u64(), scope);
    a->c = psstore_conn_new(a->url, 5000, errstr, size);
    if (a->c == NULL)
        goto err;
    if (psstore_conn_check_policy(a->c) != FR_OK) {
        fr_errorf(FR_ERR_UNSUPPORTED, errstr, size, "%s", psstore_conn_error(a->c));
        goto err;
    }
    /* the model's layout only: a shard's applier needs no other shard's node */
    size_t bounds[PSSTORE_SHARDS_MAX + 1];
    int S = 1;
    fr_err_t e = ps_model_layout(a->c, a->name, &S, bounds);
    if (e != FR_OK) {
        fr_errorf(e, errstr, size, "%s", psstore_conn_error(a->c));
        goto err;
    }
    a->nshards = S;
    if (S > 1) {
        if (conf->shard < 0 || conf->shard >= S) {
            fr_errorf(FR_ERR_INVAL, errstr, size,
                      "applier: model '%s' has %d shards; shard %d is not one of them", a->name, S,
                      conf->shard);
            goto err;
        }
        a->shard = conf->shard;
        ps_shard_tag(a->model, a->name, a->shard, S);
    }
    ps_key(a->k_lease, a->model, "lease");
    ps_key(a->k_meta, a->model, "meta");
    ps_key(a->k_ver, a->model, "ver");
    ps_key_shard(a->k_w, a->model, "w", 0);
    ps_key_shard(a->k_opt, a->model, "opt", 0);
    ps_key_shard(a->k_avg, a->model, "avg", 0);
    ps_key(a->k_off, a->model, "offsets");
    ps_key(a->k_grads, a->model, "grads");
    ps_key(a->k_versions, a->model, "versions");
    ps_key(a->k_drops, a->model, "drops");
    ps_key(a->k_audit, a->model, "audit");
    ps_key(a->k_snaps, a->model, "snaps");
    ps_key(a->k_pub, a->model, "published");
    ps_key(a->k_req, a->model, "requests");
    ps_key(a->k_members, a->name, "members"); /* the model's: one membership */
    ps_key(a->k_rounds, a->model, "rounds");
    register_metrics(a);
    ps_auto_init(a);
    ps_applier_stats_update(a);
    return a;
err:
    psstore_applier_destroy(a);
    return NULL;
}

static int help_step(void *arg);

void psstore_applier_set_local(psstore_applier_t *a, psstore_local_t *l)
{
    if (a->local != NULL)
        ps_local_set_helper(a->local, NULL, NULL);
    a->local = ps_local_shard(l, a->shard); /* a sharded channel: this shard's */
    if (a->local != NULL)
        ps_local_set_helper(a->local, help_step, a);
}

/* Forgets what the next commit would have written besides the weights:
 * the consumed ids, the stream entries, the epoch and offsets resets, the
 * executed request and the replay to publish. */
void ps_applier_forget_pending(psstore_applier_t *a)
{
    a->versions.len = a->drops.len = a->audit.len = 0;
    a->weights_dirty = 0;
    ps_applier_forget_own(a);
}

void ps_applier_forget_own(psstore_applier_t *a)
{
    a->ids.len = 0;
    a->nids = 0;
    ps_sparse_committed(a->sp);
    a->new_epoch = a->offsets_reset = 0;
    a->req_id[0] = '\0';
    a->replay_gen = 0;
}

/* Forgets everything held in memory (lease lost, stop, or a fresh load). */
void ps_applier_drop_state(psstore_applier_t *a)
{
    ps_sparse_ready(a->sp, 0); /* before w goes: the workers read the bias */
    if (a->local != NULL)
        ps_local_close(a->local);
    a->active = 0;
    a->read_own_pending = 0;
    free(a->w);
    free(a->opt);
    free(a->g);
    free(a->avg);
    a->w = a->opt = a->g = a->avg = NULL;
    psstore_ctl_destroy(a->ctl);
    a->ctl = NULL;
    for (size_t i = 0; i < a->nparts; i++)
        psstore_poff_fini(&a->parts[i].po);
    a->nparts = 0;
    ps_applier_forget_pending(a);
    ps_sparse_clear(a->sp); /* rows are read again from the store */
    a->guard_pos = a->guard_fill = a->guard_bad = 0;
    a->au.shown = 0; /* the next holder writes its phase */
    a->nsnaps = 0;
    a->snap_req = 0; /* the request is still in the stream: read again */
    a->nts_pending = 0;
    a->stop_write_due = 0; /* the next holder's guard decides again */
    /* held gradients stay pending in the stream: the reload reads them again */
    for (int g = 0; g < MAX_GROUPS; g++) {
        a->rounds[g].open = 0;
        a->rounds[g].nheld = 0;
        a->closed[g] = 0;
    }
    ps_applier_stats_update(a);
}

void psstore_applier_destroy(psstore_applier_t *a)
{
    if (a == NULL)
        return;
    if (a->local != NULL) /* no pusher steps in from here on */
        ps_local_set_helper(a->local, NULL, NULL);
    ps_applier_drop_state(a);
    for (int g = 0; g < MAX_GROUPS; g++) {
        round_t *r = &a->rounds[g];
        for (size_t i = 0; i < r->cap_held; i++) {
            free(r->held[i].ranges);
            free(r->held[i].topics);
        }
        free(r->held);
        free(r->expected);
        free(r->arrived);
        free(r->sum);
    }
    free(a->seen);
    free(a->mbuf);
    free(a->ts_pending);
    free(a->parts);
    free(a->ids.p);
    free(a->versions.p);
    free(a->drops.p);
    free(a->audit.p);
    ps_grad_msg_fini(&a->msg);
    ps_sparse_free(a->sp);
    psstore_conn_destroy(a->c);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

const char *psstore_applier_error(const psstore_applier_t *a)
{
    return psstore_conn_error(a->c);
}

static int cmp_i64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* Copies the last min(*count, cap) values of ring under the lock into tmp,
 * and gives their median and 99th percentile (-1 and -1 when none). */
static void ring_percentiles(psstore_applier_t *a, const int64_t *ring, const uint64_t *count,
                             size_t cap, int64_t *tmp, int64_t *p50, int64_t *p99)
{
    pthread_mutex_lock(&a->lock);
    size_t n = *count < cap ? (size_t)*count : cap;
    memcpy(tmp, ring, n * sizeof(*tmp));
    pthread_mutex_unlock(&a->lock);
    *p50 = *p99 = -1;
    if (n > 0) {
        qsort(tmp, n, sizeof(*tmp), cmp_i64);
        *p50 = tmp[(n - 1) / 2];
        *p99 = tmp[(n - 1) * 99 / 100];
    }
}

int64_t psstore_applier_samples(psstore_applier_t *a)
{
    return atomic_load(&a->samples);
}

void psstore_applier_stats(psstore_applier_t *a, psstore_applier_stats_t *stats)
{
    int64_t taus[TAU_RING], fresh[FRESH_RING];
    pthread_mutex_lock(&a->lock);
    *stats = a->stats;
    pthread_mutex_unlock(&a->lock);
    stats->samples = atomic_load(&a->samples);
    ring_percentiles(a, a->taus, &a->ntaus, TAU_RING, taus, &stats->tau_p50, &stats->tau_p99);
    ring_percentiles(a, a->fresh, &a->nfresh, FRESH_RING, fresh, &stats->fresh_p50_ms,
                     &stats->fresh_p99_ms);
}

/* ---- offsets ------------------------------------------------------------------ */

part_t *ps_applier_find_part(psstore_applier_t *a, const char *topic, int32_t partition, int create)
{
    char key[272];
    psstore_key_format(key, sizeof(key), topic, partition);
    for (size_t i = 0; i < a->nparts; i++)
        if (strcmp(a->parts[i].key, key) == 0)
            return &a->parts[i];
    if (!create)
        return NULL;
    if (a->nparts == a->cap_parts) {
        size_t cap = a->cap_parts ? 2 * a->cap_parts : 16;
        part_t *np = realloc(a->parts, cap * sizeof(*np));
        if (np == NULL)
            return NULL;
        a->parts = np;
        a->cap_parts = cap;
    }
    part_t *p = &a->parts[a->nparts++];
    memset(p, 0, sizeof(*p));
    snprintf(p->key, sizeof(p->key), "%s", key);
    /* a partition the store has never seen has watermark 0; a consumer
     * that starts it higher covers [0, start) with an n = 0 batch, so the
     * watermark never jumps over positions that may still arrive */
    psstore_poff_init(&p->po, 0);
    return p;
}

/* Nonzero when the gradient's batch was read before a replay rewrote one of
 * its partitions: its positions are read again under the new generation. */
static int is_older_generation(psstore_applier_t *a, const psstore_grad_t *g)
{
    for (size_t i = 0; i < g->nranges; i++) {
        part_t *p = ps_applier_find_part(a, g->ranges[i].topic, g->ranges[i].partition, 0);
        if (p != NULL && g->generation < p->po.generation)
            return 1;
    }
    return 0;
}

/* Rule 1: nonzero when any position of the gradient was already applied. */
static int is_duplicate(psstore_applier_t *a, const psstore_grad_t *g)
{
    for (size_t i = 0; i < g->nranges; i++) {
        const psstore_range_t *r = &g->ranges[i];
        part_t *p = ps_applier_find_part(a, r->topic, r->partition, 0);
        if (p != NULL && psstore_poff_overlaps(&p->po, r->from, r->to))
            return 1;
        /* two ranges of one gradient overlapping each other are a duplicate too */
        for (size_t j = 0; j < i; j++) {
            const psstore_range_t *q = &g->ranges[j];
            if (q->partition == r->partition && strcmp(q->topic, r->topic) == 0 &&
                q->from < r->to && r->from < q->to)
                return 1;
        }
    }
    return 0;
}

static fr_err_t mark_ranges(psstore_applier_t *a, const psstore_grad_t *g)
{
    for (size_t i = 0; i < g->nranges; i++) {
        const psstore_range_t *r = &g->ranges[i];
        part_t *p = ps_applier_find_part(a, r->topic, r->partition, 1);
        if (p == NULL)
            return FR_ERR_NOMEM;
        fr_err_t err = psstore_poff_mark(&p->po, r->from, r->to);
        if (err != FR_OK)
            return err;
        p->dirty = 1;
    }
    return FR_OK;
}

/* Appends audit entries for g's ranges with outcome (audit mode only). */
static void audit(psstore_applier_t *a, const psstore_grad_t *g, const char *outcome)
{
    if (!a->conf.audit)
        return;
    for (size_t i = 0; i < g->nranges; i++) {
        const psstore_range_t *r = &g->ranges[i];
        if (a->audit.len > 0)
            ps_buf_add(&a->audit, "\1", 1);
        ps_buf_kv(&a->audit, "topic", "%s", r->topic);
        ps_buf_kv(&a->audit, "partition", "%d", (int)r->partition);
        ps_buf_kv(&a->audit, "first", "%lld", (long long)r->from);
        ps_buf_kv(&a->audit, "last", "%lld", (long long)r->to - 1);
        ps_buf_kv(&a->audit, "version", "%lld", (long long)a->version);
        /* a rollback's re-application is in another epoch, a replay's in a
         * newer generation: neither is a double apply */
        ps_buf_kv(&a->audit, "epoch", "%llu", (unsigned long long)a->epoch);
        ps_buf_kv(&a->audit, "generation", "%lld", (long long)g->generation);
        ps_buf_kv(&a->audit, "outcome", "%s", outcome);
        ps_buf_kv(&a->audit, "worker", "%s", g->worker);
    }
}

/* ---- deciding one gradient -------------------------------------------------------- */

/* Notes the Kafka timestamps of an applied batch for the freshness
 * figures, measured when the commit makes its version visible. */
void ps_applier_note_ts(psstore_applier_t *a, int64_t ts_min, int64_t ts_max)
{
    if (ts_max <= 0)
        return;
    if (a->nts_pending + 2 > a->cap_ts_pending) {
        size_t cap = a->cap_ts_pending ? 2 * a->cap_ts_pending : 256;
        int64_t *grown = realloc(a->ts_pending, cap * sizeof(*grown));
        if (grown == NULL)
            return; /* a figure, not state: skip the sample */
        a->ts_pending = grown;
        a->cap_ts_pending = cap;
    }
    a->ts_pending[a->nts_pending++] = ts_min;
    a->ts_pending[a->nts_pending++] = ts_max;
}

/* Records the versions-stream entry of the update just applied. */
void ps_applier_version_entry(psstore_applier_t *a, const psstore_grad_t *g,
                              const psstore_decision_t *d)
{
    if (a->versions.len > 0)
        ps_buf_add(&a->versions, "\1", 1);
    ps_buf_kv(&a->versions, "version", "%lld", (long long)a->version);
    ps_buf_kv(&a->versions, "epoch", "%llu", (unsigned long long)a->epoch);
    ps_buf_kv(&a->versions, "tau", "%lld", (long long)d->tau);
    ps_buf_kv(&a->versions, "lr_eff", "%.9g", d->lr_eff);
    ps_buf_kv(&a->versions, "loss", "%.9g", g->loss_sum / (double)g->n);
    ps_buf_kv(&a->versions, "n", "%lld", (long long)g->n);
    ps_buf_kv(&a->versions, "worker", "%s", g->worker);
    ps_buf_kv(&a->versions, "t", "%lld", (long long)fr_clock_unix_ms());
    if (g->ts_min_ms > 0) /* the batch's oldest and newest Kafka timestamps */
        ps_buf_kv(&a->versions, "ts", "%lld:%lld", (long long)g->ts_min_ms,
                  (long long)g->ts_max_ms);
}
/* Audits g with outcome and marks its positions (applied or dropped by a
 * named rule: either way its samples were seen). */
fr_err_t ps_applier_decide_mark(psstore_applier_t *a, const psstore_grad_t *g, const char *outcome)
{
    audit(a, g, outcome);
    return mark_ranges(a, g);
}

/*
 * Decides and applies one decoded gradient in memory. The order is
 * docs/design.md "Offsets": epoch, rule 1 (duplicates mark nothing), then the
 * controller; a gradient the controller drops still marks its positions
 * (its samples were seen and dropped by a named rule).
 */
static fr_err_t applied(psstore_applier_t *a, const psstore_grad_t *g, const psstore_decision_t *d,
                        uint64_t t0);

/*
 * A sparse model's gradient (applier_sparse.c): a malformed one is dropped
 * as such, a non-finite one as non-finite (and counted by the divergence
 * guard); else its rows and the bias are stepped by the per-row optimizer,
 * which needs no staleness scaling of its own (its rates fall per
 * coordinate as updates accumulate).
 */
static fr_err_t decide_sparse(psstore_applier_t *a, const psstore_grad_t *g, uint64_t t0)
{
    size_t m = 0;
    int shape = ps_sparse_shape(a, g, &m);
    ps_applier_guard_record(a, shape < 0);
    if (!a->active) /* the guard stopped the model: the state is gone, the entry stays */
        return FR_OK;
    if (shape <= 0) {
        psstore_drop_t why = shape < 0 ? PSSTORE_DROPPED_NONFINITE : PSSTORE_DROPPED_MALFORMED;
        ps_applier_count_drop(a, why, g);
        audit(a, g, psstore_drop_name(why));
        return mark_ranges(a, g);
    }
    psstore_decision_t d = {.outcome = PSSTORE_APPLY,
                            .tau = a->version - g->version,
                            .scale = 1,
                            .lr_eff = a->sp->optim.lr};
    fr_err_t err = ps_sparse_apply(a, g, m); /* moves the version, under the table's lock */
    if (err != FR_OK)
        return err;
    return applied(a, g, &d, t0);
}

static fr_err_t decide(psstore_applier_t *a, const psstore_grad_t *g)
{
    if (g->epoch != a->epoch) {
        fr_log(FR_LOG_DEBUG, "applier %s: dropped a gradient of epoch %llu (now %llu)", a->model,
               (unsigned long long)g->epoch, (unsigned long long)a->epoch);
        ps_applier_count_drop(a, PSSTORE_DROPPED_EPOCH, g);
        return FR_OK;
    }
    if (is_older_generation(a, g)) {
        ps_applier_count_drop(a, PSSTORE_DROPPED_REPLAY, g);
        audit(a, g, "replay");
        return FR_OK;
    }
    if (is_duplicate(a, g) || ps_applier_overlaps_held(a, g)) {
        ps_applier_count_drop(a, PSSTORE_DROPPED_DUPLICATE, g);
        audit(a, g, "duplicate");
        return FR_OK;
    }
    if (g->n == 0) {
        ps_applier_count_drop(a, PSSTORE_DROPPED_EMPTY, g);
        audit(a, g, g->reason ? g->reason : "empty");
        return mark_ranges(a, g);
    }
    if (psstore_mode_rounds(a->conf.mode) && !isfinite(g->norm)) {
        /* a slice of a non-finite gradient, finite on this shard: every
         * shard drops it, as the unsharded round would its whole */
        ps_applier_guard_record(a, 1);
        ps_applier_count_drop(a, PSSTORE_DROPPED_NONFINITE, g);
        audit(a, g, psstore_drop_name(PSSTORE_DROPPED_NONFINITE));
        return mark_ranges(a, g);
    }
    if (psstore_mode_rounds(a->conf.mode))
        return ps_applier_round_take(a, g);
    if (ps_auto_backup_drop(a, g)) { /* mode auto's backup phase */
        ps_applier_count_drop(a, PSSTORE_DROPPED_BACKUP, g);
        audit(a, g, psstore_drop_name(PSSTORE_DROPPED_BACKUP));
        return mark_ranges(a, g);
    }
    uint64_t t0 = fr_clock_mono_ns();
    if (a->sp != NULL)
        return decide_sparse(a, g, t0);
    float *gw = a->cur_g; /* the controller works in place */
    if (gw == NULL) {
        gw = a->g;
        memcpy(gw, g->g, a->n * sizeof(float));
    }
    psstore_decision_t d;
    /* an in-process gradient comes with its sum of squares, taken by its
     * worker while the gradient was in that core's cache: no cold pass
     * here before the step (docs/design.md "The co-located fast path") */
    int summed = g->sq_known && g->norm == 0;
    psstore_outcome_t out =
        summed ? psstore_ctl_prepare_sq(a->ctl, gw, a->version, g->version, a->w,
                                        ps_applier_pushers(a), g->sq, &d)
               : psstore_ctl_prepare_whole(a->ctl, gw, a->version, g->version, a->w,
                                           ps_applier_pushers(a), g->norm, &d);
    if (summed)
        fr_series_add(a->m_summed, 1);
    ps_applier_guard_record(a, out == PSSTORE_DROP_NONFINITE);
    if (out != PSSTORE_APPLY) {
        psstore_drop_t why =
            out == PSSTORE_DROP_NONFINITE ? PSSTORE_DROPPED_NONFINITE : PSSTORE_DROPPED_STALENESS;
        ps_applier_count_drop(a, why, g);
        audit(a, g, psstore_drop_name(why));
        return mark_ranges(a, g);
    }
    psstore_ctl_apply(a->ctl, a->w, a->opt, gw, &d);
    a->version++;
    psstore_ctl_record(a->ctl, a->version, a->w);
    ps_applier_average(a, g->n);
    return applied(a, g, &d, t0);
}

/* The bookkeeping of an applied gradient (a->version already moved): the
 * version entry, audit, stats, metrics, and its positions marked. */
static fr_err_t applied(psstore_applier_t *a, const psstore_grad_t *g, const psstore_decision_t *d,
                        uint64_t t0)
{
    a->weights_dirty = 1;
    a->last_loss = g->loss_sum / (double)g->n;
    ps_applier_note_ts(a, g->ts_min_ms, g->ts_max_ms);
    audit(a, g, "applied");
    ps_applier_version_entry(a, g, d);
    ps_auto_note_tau(a, g->worker, d->tau);
    a->samples += g->n;
    pthread_mutex_lock(&a->lock);
    a->stats.applied++;
    a->stats.lr_eff = d->lr_eff;
    a->taus[a->ntaus++ % TAU_RING] = d->tau;
    pthread_mutex_unlock(&a->lock);
    fr_series_add(a->m_applied, 1);
    fr_series_observe(a->m_stale, (double)d->tau);
    fr_series_set(a->m_lr, d->lr_eff);
    fr_series_set(a->m_loss, a->last_loss);
    fr_series_observe(a->m_latency, (double)(fr_clock_mono_ns() - t0) * 1e-9);
    return mark_ranges(a, g);
}

void ps_applier_average(psstore_applier_t *a, int64_t n)
{
    if (a->avg == NULL)
        return;
    a->avg_seen += n;
    double wt = psstore_average_weight(a->conf.ctl.average, a->avg_seen, n);
    psstore_average_step(a->avg, a->w, a->n, (float)wt);
}

fr_err_t ps_applier_average_start(psstore_applier_t *a, const redisReply *stored)
{
    const void *avg =
        stored != NULL && stored->type == REDIS_REPLY_STRING && stored->len == a->n * sizeof(float)
            ? stored->str
            : NULL;
    /* a requests-only applier applies no update: it keeps the average it is
     * given, so that a rollback it executes serves what the snapshot served */
    int keep = a->sp == NULL && (a->conf.requests_only ? avg != NULL : a->conf.ctl.average > 0);
    if (!keep) {
        free(a->avg);
        a->avg = NULL;
        a->avg_stale = a->sp == NULL;
        return FR_OK;
    }
    if (a->avg == NULL && (a->avg = malloc(a->n * sizeof(float))) == NULL)
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
    memcpy(a->avg, avg != NULL ? avg : a->w, a->n * sizeof(float));
    a->avg_seen = avg != NULL ? a->conf.ctl.average * 10 : 0;
    return FR_OK;
}

int ps_applier_reading(const psstore_applier_t *a)
{
    return a->stopped[0] == '\0' &&
           (a->conf.sample_limit <= 0 || a->samples < a->conf.sample_limit);
}

static fr_err_t take_entry_(psstore_applier_t *a, const redisReply *entry);

/* Decodes one stream entry [id, [f, v, ...]] and decides it; a sparse
 * model's workers in this process learn that it was (psstore_applier_decided_wait). */
static fr_err_t take_entry(psstore_applier_t *a, const redisReply *entry)
{
    fr_err_t err = take_entry_(a, entry);
    if (a->sp != NULL && err == FR_OK && entry->type == REDIS_REPLY_ARRAY && entry->elements >= 2 &&
        entry->element[0]->type == REDIS_REPLY_STRING)
        ps_sparse_decided(a->sp, entry->element[0]->str);
    return err;
}

static fr_err_t take_entry_(psstore_applier_t *a, const redisReply *entry)
{
    if (entry->type != REDIS_REPLY_ARRAY || entry->elements < 2 ||
        entry->element[0]->type != REDIS_REPLY_STRING)
        return FR_OK;
    const redisReply *id = entry->element[0], *kv = entry->element[1];
    if (ps_applier_is_held(a, id->str, id->len))
        return FR_OK;
    a->cur_id = a->ids.len;
    if (ps_buf_add(&a->ids, id->str, id->len) || ps_buf_add(&a->ids, "", 1))
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
    a->nids++;
    if (kv->type != REDIS_REPLY_ARRAY) /* deleted meanwhile: only acknowledge */
        return FR_OK;
    size_t nf = kv->elements / 2;
    const char *fields[32], *vals[32];
    size_t flens[32], vlens[32];
    char why[256] = "too many fields";
    fr_err_t err = FR_ERR_PARSE;
    if (nf <= 32 && kv->elements % 2 == 0) {
        for (size_t i = 0; i < nf; i++) {
            fields[i] = kv->element[2 * i]->str;
            flens[i] = kv->element[2 * i]->len;
            vals[i] = kv->element[2 * i + 1]->str;
            vlens[i] = kv->element[2 * i + 1]->len;
        }
        /* a sparse gradient's length is its batch's rows: checked by decide */
        err = ps_grad_decode(&a->msg, nf, fields, flens, vals, vlens, a->sp ? 0 : a->n, why,
                             sizeof(why));
    }
    if (err != FR_OK) {
        fr_log(FR_LOG_WARN, "applier %s: malformed gradient %.*s: %s", a->model, (int)id->len,
               id->str, why);
        ps_applier_count_drop(a, PSSTORE_DROPPED_MALFORMED, NULL);
        return FR_OK;
    }
    pthread_mutex_lock(&a->lock);
    a->stats.bytes += a->msg.payload_bytes;
    pthread_mutex_unlock(&a->lock);
    fr_series_add(a->m_bytes, (double)a->msg.payload_bytes);
    return decide(a, &a->msg.g);
}

/* ---- the loop ------------------------------------------------------------------------ */

/*
 * Reads up to READ_COUNT entries (our own pending ones first after a
 * takeover) and takes them, committing after each when commit_ms is 0.
 * Returns the number read through *nread.
 */
static fr_err_t read_and_apply(psstore_applier_t *a, int block_ms, int *nread)
{
    fr_err_t err;
    char count[16], block[16];
    size_t per_read = READ_BYTES / ((a->sp ? SPARSE_GRAD_GUESS : a->n) * sizeof(float) + 1);
    snprintf(count, sizeof(count), "%d",
             per_read < 1            ? 1
             : per_read > READ_COUNT ? READ_COUNT
                                     : (int)per_read);
    snprintf(block, sizeof(block), "%d", block_ms);
    const char *argv[12];
    int argc = 0;
    argv[argc++] = "XREADGROUP";
    argv[argc++] = "GROUP";
    argv[argc++] = GROUP;
    argv[argc++] = a->token;
    argv[argc++] = "COUNT";
    argv[argc++] = count;
    if (!a->read_own_pending && block_ms > 0) {
        argv[argc++] = "BLOCK";
        argv[argc++] = block;
    }
    argv[argc++] = "STREAMS";
    argv[argc++] = a->k_grads;
    argv[argc++] = a->read_own_pending ? a->pending_from : ">";
    size_t lens[12];
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    ps_applier_step_pause(a); /* pushers may step in during the round trip */
    redisReply *r = ps_cmd_argv(a->c, 1, argc, argv, lens, &err);
    ps_applier_step_resume(a);
    *nread = 0;
    if (r == NULL)
        return err;
    const redisReply *entries = NULL;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
        r->element[0]->type == REDIS_REPLY_ARRAY && r->element[0]->elements == 2)
        entries = r->element[0]->element[1];
    size_t n = entries && entries->type == REDIS_REPLY_ARRAY ? entries->elements : 0;
    if (a->read_own_pending && n == 0)
        a->read_own_pending = 0;
    if (a->read_own_pending && n > 0) {
        /* the next read continues after these: they stay pending until the
         * commit, so reading from "0" again would return them again */
        const redisReply *last = entries->element[n - 1];
        if (last->type == REDIS_REPLY_ARRAY && last->elements >= 1)
            ps_reply_str(last->element[0], a->pending_from, sizeof(a->pending_from));
    }
    for (size_t i = 0; i < n && a->active && ps_applier_reading(a); i++) {
        if ((err = take_entry(a, entries->element[i])) != FR_OK)
            break;
        if (a->conf.commit_ms == 0 && (err = ps_applier_commit(a)) != FR_OK)
            break;
    }
    *nread = (int)n;
    freeReplyObject(r);
    return err;
}

/* Decides the gradients queued on the in-process channel (waiting up to
 * wait_ms for the first). */
static fr_err_t take_local(psstore_applier_t *a, int wait_ms, int *n)
{
    const psstore_grad_t *gs[READ_COUNT];
    size_t k = ps_local_take(a->local, gs, READ_COUNT, wait_ms);
    fr_err_t err = FR_OK;
    for (size_t i = 0; i < k && a->active && ps_applier_reading(a); i++) {
        a->cur_id = LOCAL_ID;
        /* the slot's buffer is the channel's, ours until the release */
        a->cur_g = (float *)gs[i]->g;
        err = decide(a, gs[i]);
        a->cur_g = NULL;
        if (err != FR_OK)
            break;
    }
    ps_local_release(a->local);
    a->local_taken += k;
    *n = (int)k;
    return err;
}

/*
 * The step a pusher runs in its own thread (psstore_local_push_help), the
 * step lock held: what is queued is taken, decided and published, as this
 * thread's loop would. A dense model's only, while the lease is held and
 * gradients are read; an error is left for this thread's loop, which
 * reloads the state as after its own.
 */
static int help_step(void *arg)
{
    psstore_applier_t *a = arg;
    if (!a->active || !ps_applier_reading(a) || a->sp != NULL || a->help_err != FR_OK)
        return 0;
    int n = 0;
    int64_t before = a->version;
    a->in_help = 1; /* no Redis from here: a commit may be waiting on it */
    fr_err_t err = take_local(a, 0, &n);
    a->in_help = 0;
    if (err != FR_OK)
        a->help_err = err;
    else if (a->active && (a->version != before || n > 0))
        ps_local_publish(a->local, a->w, a->epoch, a->version, a->local_rounds);
    return n;
}

/*
 * The read phase of a poll with the in-process channel attached: gradients
 * from it and (without blocking) from the stream, for commit_ms, or until
 * the first arrivals when commit_ms is 0 (waiting up to block_ms, in steps
 * of LOCAL_WAIT_MS, so stream entries wait no longer than that); the
 * weights are published to the workers after each step that applied.
 */
static fr_err_t read_local_and_stream(psstore_applier_t *a, int block_ms)
{
    uint64_t start = fr_clock_mono_ns();
    uint64_t window = (uint64_t)a->conf.commit_ms * 1000000ull;
    /* pushers' steps count too, those since the last read phase included */
    uint64_t taken = a->local_seen;
    int total = (int)(a->local_taken - taken), streamed = 0;
    for (;;) {
        uint64_t elapsed = fr_clock_mono_ns() - start;
        int wait_ms = 0;
        if (elapsed < window)
            wait_ms = (int)((window - elapsed) / 1000000ull) + 1;
        else if (total == 0 && elapsed < (uint64_t)block_ms * 1000000ull)
            wait_ms = block_ms - (int)(elapsed / 1000000ull);
        if (wait_ms > LOCAL_WAIT_MS)
            wait_ms = LOCAL_WAIT_MS;
        int nlocal = 0, nstream = 0;
        int64_t before = a->version;
        fr_err_t err = take_local(a, wait_ms, &nlocal);
        if (err == FR_OK && a->help_err != FR_OK) { /* a pusher's step failed */
            err = a->help_err;
            a->help_err = FR_OK;
        }
        if (err == FR_OK)
            ps_applier_stop_write(a); /* a pusher's step stopped the model */
        /* published at once, also after drops: a worker waiting for its
         * gradient to be decided (the in-flight bound) wakes on it, and
         * should not wait for the stream's round trip below */
        if (err == FR_OK && a->active && (a->version != before || nlocal > 0))
            ps_local_publish(a->local, a->w, a->epoch, a->version, a->local_rounds);
        /* the stream (trainers of other processes) is read every
         * LOCAL_WAIT_MS, and at once again while it delivers */
        uint64_t now = fr_clock_mono_ns();
        before = a->version;
        if (err == FR_OK && a->active &&
            (a->stream_busy || now - a->stream_ns >= LOCAL_WAIT_MS * 1000000ull)) {
            a->stream_ns = now;
            err = read_and_apply(a, 0, &nstream);
            a->stream_busy = nstream > 0;
        }
        if (err != FR_OK || !a->active)
            return err;
        if (a->version != before)
            ps_local_publish(a->local, a->w, a->epoch, a->version, a->local_rounds);
        streamed += nstream;
        total = (int)(a->local_taken - taken) + streamed;
        elapsed = fr_clock_mono_ns() - start;
        if (elapsed >= window && (total > 0 || elapsed >= (uint64_t)block_ms * 1000000ull)) {
            a->local_seen = a->local_taken;
            /* a pusher's step that failed during the stream read: its half
             * decision must not be committed (the poll reloads) */
            err = a->help_err;
            a->help_err = FR_OK;
            return err;
        }
    }
}

/*
 * The read phase of a poll without the in-process channel. The first read
 * waits up to block_ms for a gradient. The rest of the commit window reads
 * without blocking and naps here between empty reads: Redis ends a short
 * BLOCK only at its next hz tick (100 ms by default), and a lull is the
 * usual case in the round modes, whose workers wait for the close. A closed
 * or ready round ends the window at once, and so does an empty read when
 * the pushers bound their gradients in flight (commit_drained): each waits
 * for this commit before its next pull, so nothing more is coming.
 */
static fr_err_t read_stream(psstore_applier_t *a, int block_ms)
{
    uint64_t start = fr_clock_mono_ns();
    uint64_t window = (uint64_t)a->conf.commit_ms * 1000000ull;
    int nread;
    fr_err_t err = read_and_apply(a, block_ms, &nread);
    if (err != FR_OK)
        return err;
    while (a->active && nread > 0 && window > 0 && !ps_applier_rounds_waiting(a)) {
        uint64_t elapsed = fr_clock_mono_ns() - start;
        if (elapsed >= window)
            break;
        int more;
        if ((err = read_and_apply(a, 0, &more)) != FR_OK)
            return err;
        if (more == 0 && a->conf.commit_drained)
            break;
        if (more == 0) {
            uint64_t nap = window - elapsed < STREAM_NAP_NS ? window - elapsed : STREAM_NAP_NS;
            struct timespec ts = {0, (long)nap};
            nanosleep(&ts, NULL);
        }
    }
    return FR_OK;
}

static fr_err_t poll_(psstore_applier_t *a, int block_ms)
{
    fr_err_t err = FR_OK;
    if (!a->active) {
        err = ps_applier_try_acquire(a);
        atomic_store(&a->tried, 1);
        if (err != FR_OK)
            return err;
        if (!a->active) {
            /* a standby: look again soon, the lease may expire any moment */
            struct timespec ts = {0, (long)(block_ms < 100 ? block_ms : 100) * 1000000L};
            nanosleep(&ts, NULL);
            return FR_OK;
        }
    }
    ps_applier_stop_write(a);   /* a pusher's step between polls stopped the model */
    if (a->help_err != FR_OK) { /* ... or failed: reload before anything commits */
        err = a->help_err;
        a->help_err = FR_OK;
        goto out;
    }
    if (a->c->reconnects != a->reconnects) {
        /* The connection was re-established under us: Redis may have
         * restarted (losing writes), so reload and let the run_id check
         * decide whether a new epoch starts. */
        fr_log(FR_LOG_WARN, "applier %s: reconnected to Redis; reloading its state", a->model);
        ps_applier_drop_state(a);
        return ps_applier_try_acquire(a);
    }
    if ((err = ps_applier_renew(a)) != FR_OK || !a->active)
        goto out;
    if (fr_clock_mono_ns() - a->claim_ns > (uint64_t)a->conf.lease_ms * 1000000ull) {
        /* entries a stale applier claimed after losing the lease sit idle
         * in its consumer: take those idle longer than a lease */
        a->claim_ns = fr_clock_mono_ns();
        if ((err = ps_applier_claim_pending(a, (long long)a->conf.lease_ms)) != FR_OK)
            goto out;
    }
    if ((err = ps_applier_run_requests(a)) != FR_OK || !a->active)
        goto out;
    if (a->conf.requests_only)
        return FR_OK;
    if (!ps_applier_reading(a)) {
        struct timespec ts = {0, (long)(block_ms < 500 ? block_ms : 500) * 1000000L};
        nanosleep(&ts, NULL);
        return FR_OK;
    }
    err = a->local != NULL ? read_local_and_stream(a, block_ms) : read_stream(a, block_ms);
    if (err != FR_OK)
        goto out;
    /* members: removed after member_timeout in every mode; rounds close on
     * a departure or at round_timeout */
    if (a->active && fr_clock_mono_ns() - a->members_ns > MEMBERS_MS * 1000000ull &&
        (err = ps_applier_refresh_members(a)) != FR_OK)
        goto out;
    if (a->active && psstore_mode_rounds(a->conf.mode) &&
        (err = ps_applier_rounds_close(a, 0)) != FR_OK)
        goto out;
    if (a->active && (err = ps_auto_tick(a)) != FR_OK)
        goto out;
    if (a->active)
        err = ps_applier_commit_letting_go(a);
    if (err == FR_OK && a->active && a->sp != NULL)
        err = ps_sparse_sweep(a); /* rows it evicts go with the next commit */
    if (err == FR_OK && a->active && a->local != NULL)
        ps_local_publish(a->local, a->w, a->epoch, a->version, a->local_rounds);
out:
    if (err != FR_OK && a->active) {
        /* unknown whether the last transaction landed: reload from Redis */
        fr_log(FR_LOG_WARN, "applier %s: %s; reloading state", a->model, psstore_conn_error(a->c));
        ps_applier_drop_state(a);
    }
    return err;
}

/*
 * Removes this applier's consumer from the group when it holds no pending
 * entry, so consumers of stopped appliers do not pile up. One with pending
 * entries stays: deleting it would orphan them (the next takeover claims
 * them instead).
 */
static void forget_consumer(psstore_applier_t *a)
{
    fr_err_t err;
    redisReply *r = ps_cmd(a->c, 0, &err, "XPENDING %s %s - + 1 %s", a->k_grads, GROUP, a->token);
    int idle = r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 0;
    freeReplyObject(r);
    if (idle)
        freeReplyObject(
            ps_cmd(a->c, 0, &err, "XGROUP DELCONSUMER %s %s %s", a->k_grads, GROUP, a->token));
}

/* The connection's cancel test: the run's stop flag (an atomic_int). */
static int stop_set(void *arg)
{
    return atomic_load((const atomic_int *)arg) != 0;
}

int psstore_applier_tried(psstore_applier_t *a)
{
    return atomic_load(&a->tried);
}

void ps_applier_step_pause(psstore_applier_t *a)
{
    if (a->local != NULL && a->sp == NULL)
        ps_local_step_leave(a->local);
}

void ps_applier_step_resume(psstore_applier_t *a)
{
    if (a->local != NULL && a->sp == NULL)
        ps_local_step_enter(a->local);
}

/* A poll holds the channel's step lock: pushers step in only between
 * polls, while it waits for gradients (ps_local_take) and during the
 * round trips that let go of it (ps_applier_step_pause). */
fr_err_t psstore_applier_poll(psstore_applier_t *a, int block_ms)
{
    if (a->local != NULL)
        ps_local_step_enter(a->local);
    fr_err_t err = poll_(a, block_ms);
    if (a->local != NULL)
        ps_local_step_leave(a->local);
    return err;
}

fr_err_t psstore_applier_run(psstore_applier_t *a, const atomic_int *stop)
{
    /* with Redis gone, a stop does not wait out reconnect backoffs: the
     * last commit and the lease release fail at once (the lease expires,
     * unapplied work is read again) */
    psstore_conn_set_cancel(a->c, stop_set, (void *)(uintptr_t)stop);
    int backoff = 10;
    while (!atomic_load(stop)) {
        fr_err_t err = psstore_applier_poll(a, 200);
        if (err == FR_OK) {
            backoff = 10;
            continue;
        }
        fr_log(FR_LOG_WARN, "applier %s: %s (retrying in %d ms)", a->model,
               psstore_conn_error(a->c), backoff);
        struct timespec ts = {backoff / 1000, (long)(backoff % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        backoff = backoff < 2000 ? backoff * 2 : 2000;
    }
    if (a->local != NULL)
        ps_local_step_enter(a->local);
    ps_applier_stop_write(a); /* a stop a pusher's last step decided */
    if (a->active) {
        ps_applier_commit(a);
        fr_err_t err;
        static const char *script =
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) "
            "else return 0 end";
        freeReplyObject(ps_cmd(a->c, 0, &err, "EVAL %s 1 %s %s", script, a->k_lease, a->token));
        ps_applier_drop_state(a);
    }
    if (a->local != NULL)
        ps_local_step_leave(a->local);
    forget_consumer(a);
    return FR_OK;
}
