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
 * This file holds construction, the metrics and the stats; deciding a
 * gradient (applier_decide.c), the loop (applier_loop.c), the transaction,
 * the rounds, the operator requests and the lease are in the applier_*.c
 * files beside it (applier_int.h lists them).
 *
 * Thread: an applier belongs to one thread; psstore_applier_stats() may be
 * called from any thread.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "psstore/applier/applier_sparse.h"

/* ---- small helpers -------------------------------------------------------- */

/* Appends "field\0value\0" to b. */
int ps_buf_kv(fr_buf_t *b, const char *field, const char *fmt, ...)
{
    char val[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(val, sizeof(val), fmt, ap);
    va_end(ap);
    fr_buf_add(b, field, strlen(field) + 1);
    fr_buf_add(b, val, strlen(val) + 1);
    return b->failed ? -1 : 0;
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
        ps_buf_kv(&a->drops, "reason", "%s", psstore_drop_name(d));
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
        const char *v[] = {a->model, psstore_drop_name(d)};
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
    conf->commit_ms = 0; /* not [psstore]'s 10 or 5: see applier.h */
    conf->versions_keep = fr_config_default_int("psstore", "versions_keep");
    conf->snapshot_every = fr_config_default_int("psstore", "snapshot_every");
    conf->snapshot_seconds = fr_config_default_double("psstore", "snapshot_seconds");
    conf->snapshot_retain = fr_config_default_int("psstore", "snapshot_retain");
    conf->audit = fr_config_default_bool("psstore", "audit");
    conf->npushers = 1; /* not [trainer] workers: see applier.h */
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

void psstore_applier_set_local(psstore_applier_t *a, psstore_local_t *l)
{
    if (a->local != NULL)
        ps_local_set_helper(a->local, NULL, NULL);
    a->local = ps_local_shard(l, a->shard); /* a sharded channel: this shard's */
    if (a->local != NULL)
        ps_local_set_helper(a->local, ps_applier_help_step, a);
}

/* Forgets what the next commit would have written besides the weights:
 * the consumed ids, the stream entries, the epoch and offsets resets, the
 * executed request and the replay to publish. */
void ps_applier_forget_pending(psstore_applier_t *a)
{
    fr_buf_reset(&a->versions);
    fr_buf_reset(&a->drops);
    fr_buf_reset(&a->audit);
    a->weights_dirty = 0;
    ps_sparse_committed(a->sp);
    ps_applier_forget_own(a);
}

void ps_applier_forget_own(psstore_applier_t *a)
{
    fr_buf_reset(&a->ids);
    a->nids = 0;
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
    uint64_t unwritten = ps_sparse_unwritten(a->sp);
    if (unwritten > 0)
        fr_log(FR_LOG_WARN,
               "applier %s: %llu gradients decided in process were not written; their records "
               "are read again",
               a->model, (unsigned long long)unwritten);
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
    fr_buf_fini(&a->ids);
    fr_buf_fini(&a->versions);
    fr_buf_fini(&a->drops);
    fr_buf_fini(&a->audit);
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
