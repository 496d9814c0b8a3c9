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
 * Thread: an applier belongs to one thread; psstore_applier_stats() may be
 * called from any thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "psstore/psstore_int.h"

#define TAU_RING      256 /* applied gradients the staleness percentiles cover */
#define FRESH_RING    512 /* freshness samples (two per applied batch) kept    */
#define GROUP         "appliers"
#define READ_COUNT    64         /* entries per XREADGROUP, at most ...       */
#define READ_BYTES    (16 << 20) /* ... and about this many payload bytes   */
#define GUARD_WINDOW  100        /* divergence guard: last 100 gradients    */
#define GUARD_MAX_BAD 5          /* more than 5% non-finite stops the model */
#define MAX_SNAPS     1024
#define MAX_GROUPS    256      /* worker groups a round-mode applier keeps rounds for */
#define MEMBERS_MS    500      /* how often the applier reads the members hash        */
#define LOCAL_WAIT_MS 10       /* longest wait on the in-process channel per look     */
#define STREAM_NAP_NS 1000000u /* a commit window's nap between empty stream reads    */
#define LOCAL_ID      SIZE_MAX /* cur_id of a gradient from the in-process channel */

static const char *const drop_names[] = {"epoch",     "replay",    "duplicate",
                                         "malformed", "nonfinite", "staleness",
                                         "empty",     "stopped",   "backup"};

const char *psstore_drop_name(psstore_drop_t d)
{
    return (unsigned)d < sizeof(drop_names) / sizeof(drop_names[0]) ? drop_names[d] : "unknown";
}

/* One partition's offsets as the applier holds them. */
typedef struct part {
    char key[272]; /* "<topic>/<partition>", the offsets hash field */
    psstore_partition_offsets_t po;
    int dirty; /* changed since the last commit */
} part_t;

/* A member as the applier last read it, and when its beat last changed
 * (on the applier's clock: no two machines' clocks are compared). */
typedef struct seen {
    psstore_member_t m;
    uint64_t changed_ns;
} seen_t;

/* A gradient held in an open round: what marking, auditing and
 * acknowledging it at the close needs (its values are in the round's sum). */
typedef struct held {
    char id[64];
    char worker[256];
    int64_t version, generation, n;
    double loss_sum;
    int64_t ts_min_ms, ts_max_ms;
    psstore_range_t *ranges; /* topics point into topics */
    size_t nranges, cap_ranges;
    char *topics;
    size_t cap_topics;
} held_t;

/* The open round of one group (docs/design.md "Training modes"). */
typedef struct round {
    int open;
    int64_t version;       /* the store's version when it opened          */
    uint64_t opened_ns;    /* when its first gradient arrived             */
    char (*expected)[256]; /* live, non-idle members of the group at open */
    uint8_t *arrived;
    size_t nexpected, narrived, cap_expected;
    held_t *held;
    size_t nheld, cap_held;
    double *sum; /* [n]: sample-weighted sum of the held gradients */
    int64_t nsamples, min_version;
    double loss_sum;
} round_t;

/* A growable byte buffer, kept between commits. */
typedef struct buf {
    char *p;
    size_t len, cap;
} buf_t;

struct psstore_applier {
    psstore_applier_conf_t conf;
    char url[512], model[65];
    char token[96]; /* lease token and consumer name */
    char k_lease[PS_KEY_MAX], k_meta[PS_KEY_MAX], k_ver[PS_KEY_MAX], k_w[PS_KEY_MAX];
    char k_opt[PS_KEY_MAX], k_off[PS_KEY_MAX], k_grads[PS_KEY_MAX], k_versions[PS_KEY_MAX];
    char k_drops[PS_KEY_MAX];
    char k_audit[PS_KEY_MAX], k_snaps[PS_KEY_MAX], k_pub[PS_KEY_MAX], k_req[PS_KEY_MAX];
    char k_members[PS_KEY_MAX], k_rounds[PS_KEY_MAX];
    psstore_conn_t *c;
    psstore_local_t *local; /* the in-process channel of freshet run, or NULL */
    uint64_t stream_ns;     /* with it: when the stream was last read ...    */
    int stream_busy;        /* ... and whether that read found entries       */

    /* state, valid while active */
    int active;
    int read_own_pending;  /* after taking over: drain our PEL first */
    char pending_from[64]; /* ... from after this id                   */
    unsigned reconnects;   /* c->reconnects when the state was loaded  */
    uint64_t claim_ns;     /* last sweep for entries stuck elsewhere   */
    uint64_t epoch;
    int64_t version, committed;
    size_t n, opt_len;
    float *w, *opt, *g;
    psstore_ctl_t *ctl;
    part_t *parts;
    size_t nparts, cap_parts;
    uint64_t renew_ns;        /* when the lease was last extended */
    int64_t snaps[MAX_SNAPS]; /* retained snapshot versions, oldest first */
    size_t nsnaps;
    int64_t snap_version;
    uint64_t snap_ns;
    double last_loss; /* mean loss of the last applied gradient */

    /* pending for the next commit */
    int new_epoch;           /* write meta.epoch (rollback)          */
    int offsets_reset;       /* DEL offsets before writing them all  */
    char req_id[64];         /* a request executed by this commit    */
    int64_t replay_gen;      /* > 0: publish this replay in meta ... */
    const char *replay_spec; /* ... with this text (the request's) */
    const char *replay_when; /* ... requested at (unix ms text)    */
    buf_t ids;               /* stream ids, NUL separated */
    size_t nids;
    buf_t versions; /* versions entries: "field\0value\0..." per entry, \1 between */
    buf_t drops;    /* drops entries, the same way                   */
    buf_t audit;
    int weights_dirty;

    /* membership and rounds */
    seen_t *seen;
    size_t nseen, cap_seen;
    psstore_member_t *mbuf; /* read buffer of the members hash */
    size_t cap_mbuf;
    uint64_t members_ns; /* when the members were last read */
    round_t rounds[MAX_GROUPS];
    int64_t closed[MAX_GROUPS];       /* rounds closed since the last commit */
    int64_t local_rounds[MAX_GROUPS]; /* ... since the in-process channel opened */
    size_t cur_id;                    /* offset in ids of the entry being decided */
    float *cur_g;                     /* its gradient, writable in place (a slot of
                                         the in-process channel), or NULL: copy it */

    /* divergence guard */
    uint8_t guard[GUARD_WINDOW];
    int guard_pos, guard_fill, guard_bad;
    char stopped[256];

    ps_grad_msg_t msg;
    pthread_mutex_t lock; /* guards stats */
    psstore_applier_stats_t stats;

    fr_series_t *m_applied, *m_dropped[PSSTORE_NDROP], *m_stale, *m_lr, *m_version, *m_loss,
        *m_bytes, *m_latency, *m_commits, *m_fenced;
    fr_metric_t *m_epoch;   /* freshet_model_epoch_info{model,epoch} 1 */
    char shown_epoch[32];   /* the epoch that metric shows as current */
    int64_t taus[TAU_RING]; /* staleness of the last applied gradients (lock) */
    uint64_t ntaus;
    /* freshness: Kafka timestamps of the samples applied since the last
     * commit (oldest, newest per batch), and after it, the milliseconds
     * from those timestamps to the commit that made them visible (lock) */
    int64_t *ts_pending;
    size_t nts_pending, cap_ts_pending;
    int64_t fresh[FRESH_RING];
    uint64_t nfresh;
    fr_series_t *m_fresh;
};

/* ---- small helpers -------------------------------------------------------- */

static int buf_add(buf_t *b, const void *p, size_t len)
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
static int buf_kv(buf_t *b, const char *field, const char *fmt, ...) FR_PRINTF(3, 4);
static int buf_kv(buf_t *b, const char *field, const char *fmt, ...)
{
    char val[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(val, sizeof(val), fmt, ap);
    va_end(ap);
    return buf_add(b, field, strlen(field) + 1) || buf_add(b, val, strlen(val) + 1);
}

static uint64_t random_u64(void)
{
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &v, sizeof(v)) != (ssize_t)sizeof(v))
            v = 0;
        close(fd);
    }
    if (v == 0)
        v = fr_clock_mono_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ull;
    return v;
}

static void stats_update(psstore_applier_t *a)
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
    pthread_mutex_lock(&a->lock);
    a->stats.active = a->active;
    a->stats.epoch = a->epoch;
    a->stats.version = a->committed;
    snprintf(a->stats.stopped, sizeof(a->stats.stopped), "%s", a->stopped);
    pthread_mutex_unlock(&a->lock);
}

/* Counts a drop and, when the gradient is known, records it for the drops
 * stream (written with the next commit). */
static void count_drop(psstore_applier_t *a, psstore_drop_t d, const psstore_grad_t *g)
{
    if (g != NULL) {
        if (a->drops.len > 0)
            buf_add(&a->drops, "\1", 1);
        buf_kv(&a->drops, "worker", "%s", g->worker != NULL ? g->worker : "");
        buf_kv(&a->drops, "reason", "%s", drop_names[d]);
        buf_kv(&a->drops, "n", "%lld", (long long)g->n);
        buf_kv(&a->drops, "t", "%lld", (long long)fr_clock_unix_ms());
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
}

/* ---- construction -------------------------------------------------------------- */

void psstore_applier_conf_init(psstore_applier_conf_t *conf)
{
    memset(conf, 0, sizeof(*conf));
    psstore_ctl_conf_init(&conf->ctl);
    conf->lease_ms = 5000;
    conf->commit_ms = 0;
    conf->versions_keep = 10000;
    conf->snapshot_every = 100;
    conf->snapshot_seconds = 60;
    conf->snapshot_retain = 10;
    conf->npushers = 1;
    conf->mode = PSSTORE_MODE_ASYNC;
    conf->member_timeout_ms = 10000;
    conf->round_timeout_ms = 5000;
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
    snprintf(a->model, sizeof(a->model), "%s", conf->model);
    a->conf.url = a->url;
    a->conf.model = a->model;
    pthread_mutex_init(&a->lock, NULL);
    char host[64] = "host";
    gethostname(host, sizeof(host) - 1);
    snprintf(a->token, sizeof(a->token), "%.60s/%d/%016llx", host, (int)getpid(),
             (unsigned long long)random_u64());
    ps_key(a->k_lease, a->model, "lease");
    ps_key(a->k_meta, a->model, "meta");
    ps_key(a->k_ver, a->model, "ver");
    ps_key_shard(a->k_w, a->model, "w", 0);
    ps_key_shard(a->k_opt, a->model, "opt", 0);
    ps_key(a->k_off, a->model, "offsets");
    ps_key(a->k_grads, a->model, "grads");
    ps_key(a->k_versions, a->model, "versions");
    ps_key(a->k_drops, a->model, "drops");
    ps_key(a->k_audit, a->model, "audit");
    ps_key(a->k_snaps, a->model, "snaps");
    ps_key(a->k_pub, a->model, "published");
    ps_key(a->k_req, a->model, "requests");
    ps_key(a->k_members, a->model, "members");
    ps_key(a->k_rounds, a->model, "rounds");
    register_metrics(a);

    a->c = psstore_conn_new(a->url, 5000, errstr, size);
    if (a->c == NULL)
        goto err;
    if (psstore_conn_check_policy(a->c) != FR_OK) {
        fr_errorf(FR_ERR_UNSUPPORTED, errstr, size, "%s", psstore_conn_error(a->c));
        goto err;
    }
    psstore_model_info_t info;
    fr_err_t e = psstore_model_info(a->c, a->model, &info);
    if (e != FR_OK) {
        fr_errorf(e, errstr, size, "%s", psstore_conn_error(a->c));
        goto err;
    }
    stats_update(a);
    return a;
err:
    psstore_applier_destroy(a);
    return NULL;
}

/* Forgets everything held in memory (lease lost, stop, or a fresh load). */
static void drop_state(psstore_applier_t *a)
{
    if (a->local != NULL)
        ps_local_close(a->local);
    a->active = 0;
    a->read_own_pending = 0;
    free(a->w);
    free(a->opt);
    free(a->g);
    a->w = a->opt = a->g = NULL;
    psstore_ctl_destroy(a->ctl);
    a->ctl = NULL;
    for (size_t i = 0; i < a->nparts; i++)
        psstore_poff_fini(&a->parts[i].po);
    a->nparts = 0;
    a->ids.len = a->versions.len = a->drops.len = a->audit.len = 0;
    a->nids = 0;
    a->weights_dirty = 0;
    a->new_epoch = a->offsets_reset = 0;
    a->req_id[0] = '\0';
    a->replay_gen = 0;
    a->guard_pos = a->guard_fill = a->guard_bad = 0;
    a->nsnaps = 0;
    a->nts_pending = 0;
    /* held gradients stay pending in the stream: the reload reads them again */
    for (int g = 0; g < MAX_GROUPS; g++) {
        a->rounds[g].open = 0;
        a->rounds[g].nheld = 0;
        a->closed[g] = 0;
    }
    stats_update(a);
}

void psstore_applier_destroy(psstore_applier_t *a)
{
    if (a == NULL)
        return;
    drop_state(a);
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

void psstore_applier_stats(psstore_applier_t *a, psstore_applier_stats_t *stats)
{
    int64_t taus[TAU_RING];
    pthread_mutex_lock(&a->lock);
    *stats = a->stats;
    size_t n = a->ntaus < TAU_RING ? (size_t)a->ntaus : TAU_RING;
    memcpy(taus, a->taus, n * sizeof(*taus));
    pthread_mutex_unlock(&a->lock);
    stats->tau_p50 = stats->tau_p99 = -1;
    if (n > 0) {
        qsort(taus, n, sizeof(*taus), cmp_i64);
        stats->tau_p50 = taus[(n - 1) / 2];
        stats->tau_p99 = taus[(n - 1) * 99 / 100];
    }
    int64_t fresh[FRESH_RING];
    pthread_mutex_lock(&a->lock);
    size_t nf = a->nfresh < FRESH_RING ? (size_t)a->nfresh : FRESH_RING;
    memcpy(fresh, a->fresh, nf * sizeof(*fresh));
    pthread_mutex_unlock(&a->lock);
    stats->fresh_p50_ms = stats->fresh_p99_ms = -1;
    if (nf > 0) {
        qsort(fresh, nf, sizeof(*fresh), cmp_i64);
        stats->fresh_p50_ms = fresh[(nf - 1) / 2];
        stats->fresh_p99_ms = fresh[(nf - 1) * 99 / 100];
    }
}

/* ---- offsets ------------------------------------------------------------------ */

static part_t *find_part(psstore_applier_t *a, const char *topic, int32_t partition, int create)
{
    char key[272];
    snprintf(key, sizeof(key), "%s/%d", topic, (int)partition);
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
        part_t *p = find_part(a, g->ranges[i].topic, g->ranges[i].partition, 0);
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
        part_t *p = find_part(a, r->topic, r->partition, 0);
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
        part_t *p = find_part(a, r->topic, r->partition, 1);
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
            buf_add(&a->audit, "\1", 1);
        buf_kv(&a->audit, "topic", "%s", r->topic);
        buf_kv(&a->audit, "partition", "%d", (int)r->partition);
        buf_kv(&a->audit, "first", "%lld", (long long)r->from);
        buf_kv(&a->audit, "last", "%lld", (long long)r->to - 1);
        buf_kv(&a->audit, "version", "%lld", (long long)a->version);
        buf_kv(&a->audit, "outcome", "%s", outcome);
        buf_kv(&a->audit, "worker", "%s", g->worker);
    }
}

/* ---- the lease and the state behind it ---------------------------------------- */

static fr_err_t guarded_meta_set(psstore_applier_t *a, int *done, const char *f1, const char *v1,
                                 const char *f2, const char *v2);

/* A reply's string as a NUL-terminated copy in out (truncated to size). */
static void reply_str(const redisReply *r, char *out, size_t size)
{
    out[0] = '\0';
    if (r != NULL && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS))
        snprintf(out, size, "%.*s", (int)r->len, r->str);
    else if (r != NULL && r->type == REDIS_REPLY_INTEGER)
        snprintf(out, size, "%lld", r->integer);
}

/*
 * Loads weights, optimizer state, version, offsets and snapshots from Redis
 * after taking the lease. Starts a new epoch when Redis restarted since the
 * model's epoch was set (its run_id changed): acknowledged writes may have
 * been lost, so a version number may be reissued.
 */
static fr_err_t load_state(psstore_applier_t *a)
{
    fr_err_t err;
    char run_id[64], meta_run[64] = "", epoch_s[32] = "", stopped[256] = "";
    if ((err = ps_server_run_id(a->c, run_id, sizeof(run_id))) != FR_OK)
        return err;
    redisReply *r = ps_cmd(a->c, 1, &err, "HMGET %s epoch redis_run_id stopped", a->k_meta);
    if (r == NULL)
        return err;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 3) {
        reply_str(r->element[0], epoch_s, sizeof(epoch_s));
        reply_str(r->element[1], meta_run, sizeof(meta_run));
        reply_str(r->element[2], stopped, sizeof(stopped));
    }
    freeReplyObject(r);
    if (epoch_s[0] == '\0')
        return ps_fail(a->c, FR_ERR_NOTFOUND, "model '%s' does not exist", a->model);
    a->epoch = strtoull(epoch_s, NULL, 10);
    snprintf(a->stopped, sizeof(a->stopped), "%s", stopped);

    r = ps_cmd(a->c, 1, &err, "GET %s", a->k_w);
    if (r == NULL)
        return err;
    if (r->type != REDIS_REPLY_STRING || r->len == 0 || r->len % 4 != 0) {
        freeReplyObject(r);
        return ps_fail(a->c, FR_ERR_PARSE, "model '%s': weights missing or not float32", a->model);
    }
    a->n = r->len / 4;
    a->opt_len = psstore_optim_state_len(a->conf.ctl.optim, a->n);
    if (a->conf.requests_only)
        a->opt_len = a->n; /* kept verbatim from snapshots: room for any optimizer */
    a->w = malloc(a->n * sizeof(float));
    a->g = malloc(a->n * sizeof(float));
    a->opt = calloc(a->opt_len ? a->opt_len : 1, sizeof(float));
    if (a->w == NULL || a->g == NULL || a->opt == NULL) {
        freeReplyObject(r);
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
    }
    memcpy(a->w, r->str, r->len);
    freeReplyObject(r);

    r = ps_cmd(a->c, 1, &err, "GET %s", a->k_opt);
    if (r == NULL)
        return err;
    if (r->type == REDIS_REPLY_STRING && r->len == a->opt_len * sizeof(float))
        memcpy(a->opt, r->str, r->len);
    else if (r->type == REDIS_REPLY_STRING && r->len != 0)
        fr_log(FR_LOG_WARN, "applier %s: optimizer state of %zu bytes does not fit %s; zeroed",
               a->model, (size_t)r->len, psstore_optim_name(a->conf.ctl.optim));
    freeReplyObject(r);

    r = ps_cmd(a->c, 1, &err, "GET %s", a->k_ver);
    if (r == NULL)
        return err;
    char ver[32];
    reply_str(r, ver, sizeof(ver));
    freeReplyObject(r);
    a->version = a->committed = strtoll(ver, NULL, 10);

    r = ps_cmd(a->c, 1, &err, "HGETALL %s", a->k_off);
    if (r == NULL)
        return err;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2) {
        part_t *p = NULL;
        char key[272];
        reply_str(r->element[i], key, sizeof(key));
        char *slash = strrchr(key, '/');
        if (slash != NULL) {
            *slash = '\0';
            p = find_part(a, key, (int32_t)atoi(slash + 1), 1);
        }
        char why[128];
        if (p == NULL || psstore_poff_parse(&p->po, r->element[i + 1]->str, r->element[i + 1]->len,
                                            why, sizeof(why)) != FR_OK) {
            freeReplyObject(r);
            return ps_fail(a->c, FR_ERR_PARSE, "model '%s': bad offsets entry '%s'", a->model, key);
        }
    }
    freeReplyObject(r);

    r = ps_cmd(a->c, 1, &err, "ZRANGE %s 0 -1", a->k_snaps);
    if (r == NULL)
        return err;
    a->nsnaps = 0;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements && i < MAX_SNAPS; i++)
        a->snaps[a->nsnaps++] = strtoll(r->element[i]->str, NULL, 10);
    freeReplyObject(r);
    a->snap_version = a->nsnaps ? a->snaps[a->nsnaps - 1] : a->version;
    a->snap_ns = fr_clock_mono_ns();

    char errstr[256];
    a->ctl = psstore_ctl_new(&a->conf.ctl, a->n, errstr, sizeof(errstr));
    if (a->ctl == NULL)
        return ps_fail(a->c, FR_ERR_INVAL, "%s", errstr);
    psstore_ctl_record(a->ctl, a->version, a->w);

    /* the group sees every entry ever pushed: created at id 0 */
    r = ps_cmd(a->c, 1, &err, "XGROUP CREATE %s %s 0 MKSTREAM", a->k_grads, GROUP);
    if (r == NULL && strstr(psstore_conn_error(a->c), "BUSYGROUP") == NULL)
        return err;
    freeReplyObject(r);

    /* the mode this applier runs, for operators (serve's metadata) */
    int shown = 0;
    if ((err = guarded_meta_set(a, &shown, "mode", psstore_mode_name(a->conf.mode), NULL, NULL)) !=
        FR_OK)
        return err;
    if (strcmp(run_id, meta_run) != 0) {
        /* Redis restarted (or the model came from elsewhere): a new epoch */
        uint64_t epoch = random_u64();
        char epoch_s2[32];
        int done = 0;
        snprintf(epoch_s2, sizeof(epoch_s2), "%llu", (unsigned long long)epoch);
        if ((err = guarded_meta_set(a, &done, "epoch", epoch_s2, "redis_run_id", run_id)) != FR_OK)
            return err;
        if (!done)
            return ps_fail(a->c, FR_ERR_STATE, "model '%s': lease lost while taking over",
                           a->model);
        fr_log(FR_LOG_WARN,
               "applier %s: Redis run_id changed (restart?): new epoch %llu at version %lld",
               a->model, (unsigned long long)epoch, (long long)a->version);
        a->epoch = epoch;
        psstore_ctl_reset(a->ctl);
        psstore_ctl_record(a->ctl, a->version, a->w);
    }
    return FR_OK;
}

/*
 * Claims every entry pending on other consumers of the group (a dead or
 * stalled applier's) so this applier applies them; rule 1 discards any whose
 * positions were applied already.
 */
static fr_err_t claim_pending(psstore_applier_t *a, long long min_idle_ms)
{
    char start[64] = "0-0";
    for (int rounds = 0; rounds < 10000; rounds++) {
        fr_err_t err;
        redisReply *r = ps_cmd(a->c, 0, &err, "XAUTOCLAIM %s %s %s %lld %s COUNT 1000 JUSTID",
                               a->k_grads, GROUP, a->token, min_idle_ms, start);
        if (r == NULL)
            return err;
        if (r->type != REDIS_REPLY_ARRAY || r->elements < 2) {
            freeReplyObject(r);
            return FR_OK;
        }
        reply_str(r->element[0], start, sizeof(start));
        freeReplyObject(r);
        if (strcmp(start, "0-0") == 0)
            return FR_OK;
    }
    return FR_OK;
}

/* Takes the lease when it is free and loads the state behind it. */
static fr_err_t try_acquire(psstore_applier_t *a)
{
    fr_err_t err;
    redisReply *r = ps_cmd(a->c, 1, &err, "EXISTS %s", a->k_meta);
    if (r == NULL)
        return err;
    int exists = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    if (!exists)
        return FR_OK; /* deleted (or not yet created): nothing to hold */
    r = ps_cmd(a->c, 0, &err, "SET %s %s NX PX %lld", a->k_lease, a->token,
               (long long)a->conf.lease_ms);
    if (r == NULL)
        return err;
    int got = r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (!got) {
        /* still ours after an error made us drop the state? then reload */
        r = ps_cmd(a->c, 1, &err, "GET %s", a->k_lease);
        if (r == NULL)
            return err;
        got = r->type == REDIS_REPLY_STRING && strcmp(r->str, a->token) == 0;
        freeReplyObject(r);
        if (!got)
            return FR_OK;
    }
    a->active = 1;
    a->renew_ns = fr_clock_mono_ns();
    if ((err = load_state(a)) != FR_OK || (err = claim_pending(a, 0)) != FR_OK) {
        fr_log(FR_LOG_ERROR, "applier %s: taking over failed: %s", a->model,
               psstore_conn_error(a->c));
        drop_state(a);
        return err;
    }
    a->read_own_pending = 1;
    snprintf(a->pending_from, sizeof(a->pending_from), "0");
    a->reconnects = a->c->reconnects;
    a->claim_ns = fr_clock_mono_ns();
    fr_log(FR_LOG_INFO, "applier %s: holding the lease (%s) at version %lld of epoch %llu",
           a->model, a->token, (long long)a->version, (unsigned long long)a->epoch);
    if (a->local != NULL && a->stopped[0] == '\0') {
        memset(a->local_rounds, 0, sizeof(a->local_rounds));
        ps_local_open(a->local, a->w, a->epoch, a->version);
    }
    stats_update(a);
    return FR_OK;
}

void psstore_applier_set_local(psstore_applier_t *a, psstore_local_t *l)
{
    a->local = l;
}

/* The lease was lost: forget everything and go back to standby. */
static void fenced(psstore_applier_t *a, const char *when)
{
    fr_log(FR_LOG_WARN,
           "applier %s: lease lost (%s): discarding %zu uncommitted gradients, standing by",
           a->model, when, a->nids);
    pthread_mutex_lock(&a->lock);
    a->stats.fenced++;
    pthread_mutex_unlock(&a->lock);
    fr_series_add(a->m_fenced, 1);
    drop_state(a);
}

/* Extends the lease when a third of it has passed without a commit. */
static fr_err_t renew(psstore_applier_t *a)
{
    static const char *script = "if redis.call('GET', KEYS[1]) == ARGV[1] then "
                                "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";
    uint64_t now = fr_clock_mono_ns();
    if ((now - a->renew_ns) < (uint64_t)a->conf.lease_ms * 1000000ull / 3)
        return FR_OK;
    fr_err_t err;
    redisReply *r = ps_cmd(a->c, 1, &err, "EVAL %s 1 %s %s %lld", script, a->k_lease, a->token,
                           (long long)a->conf.lease_ms);
    if (r == NULL)
        return err;
    int ok = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    if (!ok)
        fenced(a, "renewal");
    else
        a->renew_ns = now;
    return FR_OK;
}

/* ---- commit --------------------------------------------------------------------- */

/* An argv under construction for one command of the transaction. */
typedef struct cmd {
    const char **argv;
    size_t *lens;
    int argc, cap;
} cmd_t;

static int cmd_add(cmd_t *c, const char *p, size_t len)
{
    if (c->argc == c->cap) {
        int cap = c->cap ? 2 * c->cap : 32;
        const char **av = realloc(c->argv, (size_t)cap * sizeof(*av));
        size_t *lv = realloc(c->lens, (size_t)cap * sizeof(*lv));
        if (av != NULL)
            c->argv = av;
        if (lv != NULL)
            c->lens = lv;
        if (av == NULL || lv == NULL)
            return -1;
        c->cap = cap;
    }
    c->argv[c->argc] = p;
    c->lens[c->argc++] = len;
    return 0;
}

static int cmd_adds(cmd_t *c, const char *s)
{
    return cmd_add(c, s, strlen(s));
}

/* Sends c and resets it; counts the command for the reply read-back. */
static fr_err_t cmd_send(psstore_applier_t *a, cmd_t *c, int *queued)
{
    fr_err_t err = ps_pipeline_append(a->c, c->argc, c->argv, c->lens);
    c->argc = 0;
    if (err == FR_OK)
        (*queued)++;
    return err;
}

/* Queues XADD key [MAXLEN ~ keep] * f v ... for every entry in b. */
static fr_err_t queue_entries(psstore_applier_t *a, cmd_t *c, const char *key, buf_t *b,
                              long long keep, int *queued)
{
    char keep_s[32];
    snprintf(keep_s, sizeof(keep_s), "%lld", keep);
    size_t pos = 0;
    while (pos < b->len) {
        cmd_adds(c, "XADD");
        cmd_adds(c, key);
        if (keep > 0) {
            cmd_adds(c, "MAXLEN");
            cmd_adds(c, "~");
            cmd_adds(c, keep_s);
        }
        cmd_adds(c, "*");
        while (pos < b->len && b->p[pos] != '\1') {
            size_t len = strlen(b->p + pos);
            cmd_add(c, b->p + pos, len);
            pos += len + 1;
        }
        pos++; /* the \1 between entries */
        fr_err_t err = cmd_send(a, c, queued);
        if (err != FR_OK)
            return err;
    }
    return FR_OK;
}

/* Nonzero when a snapshot is due with this commit. */
static int snapshot_due(const psstore_applier_t *a)
{
    if (!a->weights_dirty || a->version <= a->snap_version)
        return 0;
    if (a->conf.snapshot_every > 0 && a->version - a->snap_version >= a->conf.snapshot_every)
        return 1;
    return a->conf.snapshot_seconds > 0 &&
           (double)(fr_clock_mono_ns() - a->snap_ns) * 1e-9 >= a->conf.snapshot_seconds;
}

/* "key=value\n" for every partition: the offsets of a snapshot. */
static fr_err_t offsets_text(psstore_applier_t *a, buf_t *out)
{
    out->len = 0;
    for (size_t i = 0; i < a->nparts; i++) {
        char *text;
        size_t len;
        if (psstore_poff_format(&a->parts[i].po, &text, &len) != FR_OK)
            return FR_ERR_NOMEM;
        int bad = buf_add(out, a->parts[i].key, strlen(a->parts[i].key)) || buf_add(out, "=", 1) ||
                  buf_add(out, text, len) || buf_add(out, "\n", 1);
        free(text);
        if (bad)
            return FR_ERR_NOMEM;
    }
    return FR_OK;
}

/* Queues the snapshot of the current version and the trimming of old ones. */
static fr_err_t queue_snapshot(psstore_applier_t *a, cmd_t *c, buf_t *offs, int *queued,
                               char (*nums)[32])
{
    char snap_key[PS_KEY_MAX];
    ps_key_shard(snap_key, a->model, "snap", a->version);
    fr_err_t err = offsets_text(a, offs);
    if (err != FR_OK)
        return err;
    snprintf(nums[0], 32, "%llu", (unsigned long long)a->epoch);
    snprintf(nums[1], 32, "%lld", (long long)a->version);
    snprintf(nums[2], 32, "%lld", (long long)fr_clock_unix_ms());
    snprintf(nums[3], 32, "%.9g", a->last_loss);
    cmd_adds(c, "HSET");
    cmd_adds(c, snap_key);
    cmd_adds(c, "weights");
    cmd_add(c, (const char *)a->w, a->n * sizeof(float));
    cmd_adds(c, "opt");
    cmd_add(c, (const char *)a->opt, a->opt_len * sizeof(float));
    cmd_adds(c, "offsets");
    cmd_add(c, offs->p ? offs->p : "", offs->len);
    cmd_adds(c, "epoch");
    cmd_adds(c, nums[0]);
    cmd_adds(c, "version");
    cmd_adds(c, nums[1]);
    cmd_adds(c, "time");
    cmd_adds(c, nums[2]);
    cmd_adds(c, "loss");
    cmd_adds(c, nums[3]);
    if ((err = cmd_send(a, c, queued)) != FR_OK)
        return err;
    cmd_adds(c, "ZADD");
    cmd_adds(c, a->k_snaps);
    cmd_adds(c, nums[2]);
    cmd_adds(c, nums[1]);
    if ((err = cmd_send(a, c, queued)) != FR_OK)
        return err;
    size_t excess = a->nsnaps + 1 > (size_t)a->conf.snapshot_retain
                        ? a->nsnaps + 1 - (size_t)a->conf.snapshot_retain
                        : 0;
    for (size_t i = 0; i < excess && i < 8; i++) {
        char old_key[PS_KEY_MAX];
        ps_key_shard(old_key, a->model, "snap", a->snaps[i]);
        snprintf(nums[4 + i], 32, "%lld", (long long)a->snaps[i]);
        cmd_adds(c, "DEL");
        cmd_adds(c, old_key);
        if ((err = cmd_send(a, c, queued)) != FR_OK)
            return err;
        cmd_adds(c, "ZREM");
        cmd_adds(c, a->k_snaps);
        cmd_adds(c, nums[4 + i]);
        if ((err = cmd_send(a, c, queued)) != FR_OK)
            return err;
    }
    snprintf(nums[12], 32, "%llu-v%lld", (unsigned long long)a->epoch, (long long)a->version);
    cmd_adds(c, "PUBLISH");
    cmd_adds(c, a->k_pub);
    cmd_adds(c, nums[12]);
    return cmd_send(a, c, queued);
}

/* After a committed snapshot: the in-memory list follows the store's. */
static void snapshot_done(psstore_applier_t *a)
{
    size_t excess = a->nsnaps + 1 > (size_t)a->conf.snapshot_retain
                        ? a->nsnaps + 1 - (size_t)a->conf.snapshot_retain
                        : 0;
    if (excess > 8)
        excess = 8;
    memmove(a->snaps, a->snaps + excess, (a->nsnaps - excess) * sizeof(int64_t));
    a->nsnaps -= excess;
    if (a->nsnaps < MAX_SNAPS)
        a->snaps[a->nsnaps++] = a->version;
    a->snap_version = a->version;
    a->snap_ns = fr_clock_mono_ns();
}

/* Nonzero when every weight is finite: an OR over the exponent bits, which
 * the compiler vectorises (a float sum chain would not). */
static int weights_finite(const psstore_applier_t *a)
{
    const uint32_t *bits = (const uint32_t *)a->w;
    uint32_t bad = 0;
    for (size_t i = 0; i < a->n; i++)
        bad |= (uint32_t)((bits[i] & 0x7f800000u) == 0x7f800000u);
    return bad == 0;
}

/*
 * HSET meta field value [field value] only while this applier holds the
 * lease (a Lua script checks the token), so a stalled applier that lost the
 * lease cannot change its successor's epoch or stop its model. Returns
 * FR_OK with *done = 0 when the lease is someone else's.
 */
static fr_err_t guarded_meta_set(psstore_applier_t *a, int *done, const char *f1, const char *v1,
                                 const char *f2, const char *v2)
{
    static const char *script = "if redis.call('GET', KEYS[1]) == ARGV[1] then "
                                "redis.call('HSET', KEYS[2], unpack(ARGV, 2)) return 1 end "
                                "return 0";
    const char *argv[] = {"EVAL", script, "2", a->k_lease, a->k_meta, a->token, f1, v1, f2, v2};
    fr_err_t err;
    redisReply *r = ps_cmd_argv(a->c, 0, f2 ? 10 : 8, argv, NULL, &err);
    if (r == NULL)
        return err;
    *done = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    return FR_OK;
}

/* Writes meta.stopped = reason under the lease (the divergence guard). */
static void stop_model(psstore_applier_t *a, const char *reason)
{
    snprintf(a->stopped, sizeof(a->stopped), "%s", reason);
    fr_log(FR_LOG_ERROR, "applier %s: divergence guard: %s; applying stopped", a->model, reason);
    if (a->local != NULL)
        ps_local_close(a->local); /* workers wait on the stream's bound */
    int done = 0;
    if (guarded_meta_set(a, &done, "stopped", reason, NULL, NULL) == FR_OK && !done)
        fenced(a, "stopping the model");
    stats_update(a);
}

/*
 * WATCH lease and GET it in one pipelined round trip: from here on a change
 * of lease fails EXEC. *ours = 0 (and UNWATCH sent) when another applier
 * holds it. A lost connection is an error: a reconnect would drop the WATCH.
 */
static fr_err_t watch_lease(psstore_applier_t *a, int *ours)
{
    const char *watch[] = {"WATCH", a->k_lease}, *get[] = {"GET", a->k_lease};
    fr_err_t err = ps_pipeline_append(a->c, 2, watch, NULL);
    if (err == FR_OK)
        err = ps_pipeline_append(a->c, 2, get, NULL);
    if (err != FR_OK)
        return err;
    fr_err_t e1, e2;
    redisReply *w = ps_pipeline_read(a->c, &e1);
    redisReply *r = a->c->ctx != NULL ? ps_pipeline_read(a->c, &e2) : NULL;
    *ours =
        w != NULL && r != NULL && r->type == REDIS_REPLY_STRING && strcmp(r->str, a->token) == 0;
    freeReplyObject(w);
    freeReplyObject(r);
    if (a->c->ctx == NULL)
        return FR_ERR_REDIS;
    if (!*ours)
        freeReplyObject(ps_cmd(a->c, 0, &err, "UNWATCH"));
    return FR_OK;
}

/*
 * Commits everything applied or dropped since the last commit in one
 * transaction guarded by WATCH lease. A refused transaction (the lease
 * changed hands) drops the in-memory state; that is not an error.
 */
static fr_err_t commit(psstore_applier_t *a)
{
    int dirty_parts = 0;
    for (size_t i = 0; i < a->nparts; i++)
        dirty_parts += a->parts[i].dirty;
    if (a->nids == 0 && !a->weights_dirty && dirty_parts == 0 && a->audit.len == 0 &&
        a->req_id[0] == '\0')
        return FR_OK;
    if (a->weights_dirty && !weights_finite(a)) {
        char reason[128];
        snprintf(reason, sizeof(reason), "weights went non-finite at version %lld",
                 (long long)a->version);
        drop_state(a); /* nothing of it is written */
        stop_model(a, reason);
        return FR_OK;
    }
    fr_err_t err;
    int queued = 0;
    cmd_t c = {0};
    buf_t offs = {0};
    char **offtext = calloc(a->nparts ? a->nparts : 1, sizeof(char *));
    size_t *offlen = calloc(a->nparts ? a->nparts : 1, sizeof(size_t));
    char nums[16][32], lease_ms[32];
    int snap = snapshot_due(a);
    if (offtext == NULL || offlen == NULL) {
        err = ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
        goto out;
    }

    int ours;
    redisReply *r;
    if ((err = watch_lease(a, &ours)) != FR_OK)
        goto out;
    if (!ours) {
        fenced(a, "before commit");
        goto out;
    }

    cmd_adds(&c, "MULTI");
    if ((err = cmd_send(a, &c, &queued)) != FR_OK)
        goto out;
    if (a->weights_dirty) {
        cmd_adds(&c, "SET");
        cmd_adds(&c, a->k_w);
        cmd_add(&c, (const char *)a->w, a->n * sizeof(float));
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
        if (a->opt_len > 0) {
            cmd_adds(&c, "SET");
            cmd_adds(&c, a->k_opt);
            cmd_add(&c, (const char *)a->opt, a->opt_len * sizeof(float));
            if ((err = cmd_send(a, &c, &queued)) != FR_OK)
                goto out;
        }
        snprintf(nums[15], 32, "%lld", (long long)a->version);
        cmd_adds(&c, "SET");
        cmd_adds(&c, a->k_ver);
        cmd_adds(&c, nums[15]);
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
    }
    if (a->new_epoch) {
        /* a new lineage (rollback) also lifts the divergence guard's stop */
        snprintf(nums[14], 32, "%llu", (unsigned long long)a->epoch);
        cmd_adds(&c, "HSET");
        cmd_adds(&c, a->k_meta);
        cmd_adds(&c, "epoch");
        cmd_adds(&c, nums[14]);
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
        cmd_adds(&c, "HDEL");
        cmd_adds(&c, a->k_meta);
        cmd_adds(&c, "stopped");
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
    }
    if (a->offsets_reset) {
        cmd_adds(&c, "DEL");
        cmd_adds(&c, a->k_off);
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
    }
    if (a->req_id[0] != '\0') {
        cmd_adds(&c, "XDEL");
        cmd_adds(&c, a->k_req);
        cmd_adds(&c, a->req_id);
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
    }
    if (a->replay_gen > 0) {
        snprintf(nums[13], 32, "%lld", (long long)a->replay_gen);
        cmd_adds(&c, "HSET");
        cmd_adds(&c, a->k_meta);
        cmd_adds(&c, "replay_generation");
        cmd_adds(&c, nums[13]);
        cmd_adds(&c, "replay");
        cmd_adds(&c, a->replay_spec);
        cmd_adds(&c, "replay_requested");
        cmd_adds(&c, a->replay_when);
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
    }
    if (dirty_parts > 0) {
        cmd_adds(&c, "HSET");
        cmd_adds(&c, a->k_off);
        for (size_t i = 0; i < a->nparts; i++) {
            if (!a->parts[i].dirty)
                continue;
            if (psstore_poff_format(&a->parts[i].po, &offtext[i], &offlen[i]) != FR_OK) {
                err = ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
                goto out;
            }
            cmd_adds(&c, a->parts[i].key);
            cmd_add(&c, offtext[i], offlen[i]);
        }
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
    }
    if ((err = queue_entries(a, &c, a->k_versions, &a->versions, a->conf.versions_keep, &queued)) !=
            FR_OK ||
        (err = queue_entries(a, &c, a->k_drops, &a->drops, a->conf.versions_keep, &queued)) !=
            FR_OK ||
        (err = queue_entries(a, &c, a->k_audit, &a->audit, 0, &queued)) != FR_OK)
        goto out;
    if (snap && (err = queue_snapshot(a, &c, &offs, &queued, nums)) != FR_OK)
        goto out;
    for (int g = 0; g < MAX_GROUPS; g++) {
        if (a->closed[g] == 0)
            continue;
        char field[16], by[32];
        snprintf(field, sizeof(field), "%d", g);
        snprintf(by, sizeof(by), "%lld", (long long)a->closed[g]);
        cmd_adds(&c, "HINCRBY");
        cmd_adds(&c, a->k_rounds);
        cmd_adds(&c, field);
        cmd_adds(&c, by);
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
    }
    if (a->nids > 0) {
        for (int pass = 0; pass < 2; pass++) {
            cmd_adds(&c, pass == 0 ? "XACK" : "XDEL");
            cmd_adds(&c, a->k_grads);
            if (pass == 0)
                cmd_adds(&c, GROUP);
            for (size_t pos = 0; pos < a->ids.len; pos += strlen(a->ids.p + pos) + 1)
                cmd_adds(&c, a->ids.p + pos);
            if ((err = cmd_send(a, &c, &queued)) != FR_OK)
                goto out;
        }
    }
    snprintf(lease_ms, sizeof(lease_ms), "%lld", (long long)a->conf.lease_ms);
    cmd_adds(&c, "PEXPIRE");
    cmd_adds(&c, a->k_lease);
    cmd_adds(&c, lease_ms);
    if ((err = cmd_send(a, &c, &queued)) != FR_OK)
        goto out;
    cmd_adds(&c, "EXEC");
    if ((err = cmd_send(a, &c, &queued)) != FR_OK)
        goto out;

    /* MULTI's OK and each QUEUED, then EXEC's array (nil: the lease moved) */
    redisReply *exec = NULL;
    for (int i = 0; i < queued; i++) {
        r = ps_pipeline_read(a->c, &err);
        if (r == NULL && a->c->ctx == NULL)
            goto out; /* connection lost: unknown whether EXEC ran; poll reloads */
        if (i == queued - 1)
            exec = r;
        else
            freeReplyObject(r);
    }
    if (exec == NULL && a->c->ctx != NULL && err == FR_ERR_REDIS) {
        /* EXECABORT and the like: Redis refused the transaction (not the
         * lease); nothing was written, so reload and report the reason */
        fr_log(FR_LOG_ERROR, "applier %s: commit refused: %s", a->model, psstore_conn_error(a->c));
        drop_state(a);
        goto out;
    }
    if (exec == NULL || exec->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(exec);
        fenced(a, "at EXEC");
        err = FR_OK;
        goto out;
    }
    for (size_t i = 0; i < exec->elements; i++) {
        if (exec->element[i]->type == REDIS_REPLY_ERROR) {
            /* a command inside failed (Redis does not roll back): the store
             * may be inconsistent; stop and say so rather than go on */
            char reason[256];
            snprintf(reason, sizeof(reason), "a commit failed inside its transaction: %.200s",
                     exec->element[i]->str);
            freeReplyObject(exec);
            drop_state(a);
            stop_model(a, reason);
            err = FR_ERR_REDIS;
            goto out;
        }
    }
    freeReplyObject(exec);
    uint64_t payload = a->weights_dirty ? (a->n + a->opt_len) * sizeof(float) : 0;
    if (snap)
        payload += (a->n + a->opt_len) * sizeof(float);
    pthread_mutex_lock(&a->lock);
    a->stats.commits++;
    a->stats.bytes += payload;
    pthread_mutex_unlock(&a->lock);
    fr_series_add(a->m_commits, 1);
    fr_series_add(a->m_bytes, (double)payload);
    if (snap)
        snapshot_done(a);
    for (size_t i = 0; i < a->nparts; i++)
        a->parts[i].dirty = 0;
    a->committed = a->version;
    a->renew_ns = fr_clock_mono_ns();
    a->ids.len = a->versions.len = a->drops.len = a->audit.len = 0;
    a->nids = 0;
    a->weights_dirty = 0;
    a->new_epoch = a->offsets_reset = 0;
    a->req_id[0] = '\0';
    a->replay_gen = 0;
    memset(a->closed, 0, sizeof(a->closed));
    if (a->nts_pending > 0) {
        int64_t now = fr_clock_unix_ms();
        pthread_mutex_lock(&a->lock);
        for (size_t i = 0; i < a->nts_pending; i++)
            a->fresh[a->nfresh++ % FRESH_RING] = now - a->ts_pending[i];
        pthread_mutex_unlock(&a->lock);
        for (size_t i = 0; i < a->nts_pending; i++)
            fr_series_observe(a->m_fresh, (double)(now - a->ts_pending[i]) * 1e-3);
        a->nts_pending = 0;
    }
    fr_series_set(a->m_version, (double)a->committed);
    stats_update(a);
    err = FR_OK;
out:
    for (size_t i = 0; offtext != NULL && i < a->nparts; i++)
        free(offtext[i]);
    free(offtext);
    free(offlen);
    free(offs.p);
    free(c.argv);
    free(c.lens);
    return err;
}

/* ---- deciding one gradient -------------------------------------------------------- */

static void guard_record(psstore_applier_t *a, int bad)
{
    if (a->guard_fill == GUARD_WINDOW)
        a->guard_bad -= a->guard[a->guard_pos];
    else
        a->guard_fill++;
    a->guard[a->guard_pos] = (uint8_t)bad;
    a->guard_bad += bad;
    a->guard_pos = (a->guard_pos + 1) % GUARD_WINDOW;
    if (a->guard_bad * 100 > GUARD_MAX_BAD * GUARD_WINDOW && a->stopped[0] == '\0') {
        char reason[128];
        snprintf(reason, sizeof(reason), "%d of the last %d gradients were non-finite",
                 a->guard_bad, a->guard_fill);
        stop_model(a, reason);
    }
}

/* Notes the Kafka timestamps of an applied batch for the freshness
 * figures, measured when the commit makes its version visible. */
static void note_ts(psstore_applier_t *a, int64_t ts_min, int64_t ts_max)
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
static void version_entry(psstore_applier_t *a, const psstore_grad_t *g,
                          const psstore_decision_t *d)
{
    if (a->versions.len > 0)
        buf_add(&a->versions, "\1", 1);
    buf_kv(&a->versions, "version", "%lld", (long long)a->version);
    buf_kv(&a->versions, "epoch", "%llu", (unsigned long long)a->epoch);
    buf_kv(&a->versions, "tau", "%lld", (long long)d->tau);
    buf_kv(&a->versions, "lr_eff", "%.9g", d->lr_eff);
    buf_kv(&a->versions, "loss", "%.9g", g->loss_sum / (double)g->n);
    buf_kv(&a->versions, "n", "%lld", (long long)g->n);
    buf_kv(&a->versions, "worker", "%s", g->worker);
    buf_kv(&a->versions, "t", "%lld", (long long)fr_clock_unix_ms());
    if (g->ts_min_ms > 0) /* the batch's oldest and newest Kafka timestamps */
        buf_kv(&a->versions, "ts", "%lld:%lld", (long long)g->ts_min_ms, (long long)g->ts_max_ms);
}

/* ---- membership and rounds (docs/design.md "Training modes") ------------------------------ */

static int member_live(const psstore_applier_t *a, const seen_t *s, uint64_t now)
{
    return now - s->changed_ns <= (uint64_t)a->conf.member_timeout_ms * 1000000ull;
}

static const seen_t *find_seen(const psstore_applier_t *a, const char *id)
{
    for (size_t i = 0; i < a->nseen; i++)
        if (strcmp(a->seen[i].m.id, id) == 0)
            return &a->seen[i];
    return NULL;
}

static void round_forget_member(psstore_applier_t *a, const char *id);

/*
 * Reads the members hash. A member whose beat has not changed for
 * member_timeout is removed (only if its entry is still the one seen, so a
 * beat that lands meanwhile keeps it) and no open round waits for it.
 */
static fr_err_t refresh_members(psstore_applier_t *a)
{
    size_t n = 0;
    fr_err_t err = ps_members_read(a->c, a->k_members, &a->mbuf, &n, &a->cap_mbuf);
    if (err != FR_OK)
        return err;
    uint64_t now = fr_clock_mono_ns();
    a->members_ns = now;
    if (n > a->cap_seen) {
        seen_t *grown = realloc(a->seen, n * sizeof(*grown));
        if (grown == NULL)
            return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
        a->seen = grown;
        a->cap_seen = n;
    }
    /* carry each member's last change over; the list is small */
    uint64_t *since = calloc(n ? n : 1, sizeof(*since));
    if (since == NULL)
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
    for (size_t i = 0; i < n; i++) {
        const seen_t *old = find_seen(a, a->mbuf[i].id);
        since[i] = old != NULL && old->m.beat == a->mbuf[i].beat ? old->changed_ns : now;
    }
    for (size_t i = 0; i < n; i++)
        a->seen[i] = (seen_t){a->mbuf[i], since[i]};
    a->nseen = n;
    free(since);
    static const char *script = "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then "
                                "return redis.call('HDEL', KEYS[1], ARGV[1]) else return 0 end";
    for (size_t i = 0; i < a->nseen;) {
        seen_t *sn = &a->seen[i];
        if (member_live(a, sn, now)) {
            i++;
            continue;
        }
        char val[128];
        ps_member_format(&sn->m, val, sizeof(val));
        redisReply *r =
            ps_cmd(a->c, 1, &err, "EVAL %s 1 %s %s %s", script, a->k_members, sn->m.id, val);
        if (r == NULL)
            return err;
        freeReplyObject(r);
        fr_log(FR_LOG_INFO, "applier %s: member %s silent for %.1f s: removed", a->model, sn->m.id,
               (double)(now - sn->changed_ns) * 1e-9);
        char id[256];
        snprintf(id, sizeof(id), "%s", sn->m.id);
        a->seen[i] = a->seen[--a->nseen];
        round_forget_member(a, id);
    }
    return FR_OK;
}

/* The group of a gradient's worker: its members entry's (read again when
 * it is not known yet), 0 for a worker that has none. */
static int worker_group(psstore_applier_t *a, const char *worker)
{
    const seen_t *s = find_seen(a, worker);
    if (s == NULL && fr_clock_mono_ns() - a->members_ns > 100000000ull &&
        refresh_members(a) == FR_OK)
        s = find_seen(a, worker);
    int g = s != NULL ? s->m.group : 0;
    return g >= 0 && g < MAX_GROUPS ? g : 0;
}

/* Opens group g's round: it expects the group's live, non-idle members. */
static fr_err_t round_open(psstore_applier_t *a, int g)
{
    round_t *r = &a->rounds[g];
    if (fr_clock_mono_ns() - a->members_ns > 100000000ull) {
        fr_err_t err = refresh_members(a);
        if (err != FR_OK)
            return err;
    }
    if (r->sum == NULL) {
        if ((r->sum = malloc(a->n * sizeof(double))) == NULL)
            return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
        fr_mem_touch(r->sum, a->n * sizeof(double));
    }
    if (a->nseen > r->cap_expected) {
        char(*e)[256] = realloc(r->expected, a->nseen * sizeof(*e));
        uint8_t *ar = e != NULL ? realloc(r->arrived, a->nseen) : NULL;
        if (e != NULL)
            r->expected = e;
        if (ar == NULL)
            return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
        r->arrived = ar;
        r->cap_expected = a->nseen;
    }
    uint64_t now = fr_clock_mono_ns();
    r->nexpected = r->narrived = r->nheld = 0;
    for (size_t i = 0; i < a->nseen; i++) {
        const seen_t *sn = &a->seen[i];
        if (sn->m.group == g && !sn->m.idle && member_live(a, sn, now)) {
            snprintf(r->expected[r->nexpected], 256, "%s", sn->m.id);
            r->arrived[r->nexpected++] = 0;
        }
    }
    memset(r->sum, 0, a->n * sizeof(double));
    r->nsamples = 0;
    r->loss_sum = 0;
    r->min_version = INT64_MAX;
    r->version = a->version;
    r->opened_ns = now;
    r->open = 1;
    return FR_OK;
}

/* A round closes once every expected member (backup: all but `backups`
 * of them) arrived, or round_timeout after its first gradient. */
static int round_ready(const psstore_applier_t *a, const round_t *r, int *timed_out)
{
    *timed_out = 0;
    if (!r->open || r->nheld == 0)
        return 0;
    size_t need = r->nexpected;
    if (a->conf.mode == PSSTORE_MODE_BACKUP)
        need = r->nexpected > (size_t)a->conf.backups ? r->nexpected - (size_t)a->conf.backups : 1;
    if (r->narrived >= need)
        return 1;
    *timed_out =
        fr_clock_mono_ns() - r->opened_ns >= (uint64_t)a->conf.round_timeout_ms * 1000000ull;
    return *timed_out;
}

static fr_err_t decide_mark(psstore_applier_t *a, const psstore_grad_t *g, const char *outcome);

/* Rebuilds a held gradient as the psstore_grad_t marking and auditing take. */
static psstore_grad_t held_grad(const held_t *h)
{
    return (psstore_grad_t){.version = h->version,
                            .generation = h->generation,
                            .worker = h->worker,
                            .n = h->n,
                            .loss_sum = h->loss_sum,
                            .ranges = h->ranges,
                            .nranges = h->nranges};
}

/*
 * Closes group g's round: the sample-weighted average of its gradients goes
 * through the controller (staleness from the oldest version among them) as
 * one update; each gradient's positions are marked and its entry
 * acknowledged by the commit that writes the update.
 */
static fr_err_t round_close(psstore_applier_t *a, int g)
{
    round_t *r = &a->rounds[g];
    int64_t before = a->version;
    for (size_t j = 0; j < a->n; j++)
        a->g[j] = (float)(r->sum[j] / (double)r->nsamples);
    psstore_decision_t d;
    psstore_outcome_t out =
        psstore_ctl_prepare(a->ctl, a->g, a->version, r->min_version, a->w, (int)r->nheld, &d);
    const char *outcome = "applied";
    if (out == PSSTORE_APPLY) {
        if (a->conf.sync_lr_linear)
            d.lr_eff *= (double)r->nheld;
        psstore_ctl_apply(a->ctl, a->w, a->opt, a->g, &d);
        a->version++;
        psstore_ctl_record(a->ctl, a->version, a->w);
        a->weights_dirty = 1;
        a->last_loss = r->loss_sum / (double)r->nsamples;
        char worker[32];
        snprintf(worker, sizeof(worker), "group %d", g);
        psstore_grad_t sum = {.worker = worker, .n = r->nsamples, .loss_sum = r->loss_sum};
        for (size_t i = 0; i < r->nheld; i++) {
            if (r->held[i].ts_min_ms <= 0)
                continue;
            if (sum.ts_min_ms == 0 || r->held[i].ts_min_ms < sum.ts_min_ms)
                sum.ts_min_ms = r->held[i].ts_min_ms;
            if (r->held[i].ts_max_ms > sum.ts_max_ms)
                sum.ts_max_ms = r->held[i].ts_max_ms;
        }
        version_entry(a, &sum, &d);
        buf_kv(&a->versions, "k", "%zu", r->nheld);
        pthread_mutex_lock(&a->lock);
        a->stats.applied += r->nheld;
        a->stats.rounds++;
        a->stats.lr_eff = d.lr_eff;
        for (size_t i = 0; i < r->nheld; i++)
            a->taus[a->ntaus++ % TAU_RING] = before - r->held[i].version;
        pthread_mutex_unlock(&a->lock);
        for (size_t i = 0; i < r->nheld; i++)
            note_ts(a, r->held[i].ts_min_ms, r->held[i].ts_max_ms);
        fr_series_add(a->m_applied, (double)r->nheld);
        fr_series_observe(a->m_stale, (double)d.tau);
        fr_series_set(a->m_lr, d.lr_eff);
        fr_series_set(a->m_loss, a->last_loss);
    } else {
        psstore_drop_t why =
            out == PSSTORE_DROP_NONFINITE ? PSSTORE_DROPPED_NONFINITE : PSSTORE_DROPPED_STALENESS;
        outcome = psstore_drop_name(why);
        for (size_t i = 0; i < r->nheld; i++) {
            psstore_grad_t hg = held_grad(&r->held[i]);
            count_drop(a, why, &hg);
        }
    }
    fr_err_t err = FR_OK;
    for (size_t i = 0; i < r->nheld && err == FR_OK; i++) {
        psstore_grad_t hg = held_grad(&r->held[i]);
        err = decide_mark(a, &hg, outcome);
        if (r->held[i].id[0] == '\0')
            continue;
        if (err == FR_OK && (buf_add(&a->ids, r->held[i].id, strlen(r->held[i].id) + 1) != 0))
            err = ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
        a->nids++;
    }
    r->open = 0;
    r->nheld = 0;
    a->closed[g]++;
    a->local_rounds[g]++;
    return err;
}

/* Nonzero when a round closed since the last commit or is ready to: its
 * workers wait for the commit. */
static int rounds_waiting(const psstore_applier_t *a)
{
    if (!psstore_mode_rounds(a->conf.mode))
        return 0;
    for (int g = 0; g < MAX_GROUPS; g++) {
        int timed_out;
        if (a->closed[g] > 0 || round_ready(a, &a->rounds[g], &timed_out))
            return 1;
    }
    return 0;
}

/* Closes every round that is ready (or, with all set, every one holding a
 * gradient: before a request rewrites offsets or weights). */
static fr_err_t rounds_close(psstore_applier_t *a, int all)
{
    for (int g = 0; g < MAX_GROUPS; g++) {
        round_t *r = &a->rounds[g];
        int timed_out;
        if (!r->open || r->nheld == 0 || !(all || round_ready(a, r, &timed_out)))
            continue;
        if (!all && timed_out)
            fr_log(FR_LOG_INFO,
                   "applier %s: round of group %d closed after %lld ms with %zu of %zu members",
                   a->model, g, (long long)a->conf.round_timeout_ms, r->narrived, r->nexpected);
        fr_err_t err = round_close(a, g);
        if (err != FR_OK)
            return err;
    }
    return FR_OK;
}

/* A member left: no round waits for it any more. */
static void round_forget_member(psstore_applier_t *a, const char *id)
{
    for (int g = 0; g < MAX_GROUPS; g++) {
        round_t *r = &a->rounds[g];
        for (size_t i = 0; r->open && i < r->nexpected; i++) {
            if (strcmp(r->expected[i], id) != 0 || r->arrived[i])
                continue;
            r->nexpected--;
            memcpy(r->expected[i], r->expected[r->nexpected], 256);
            r->arrived[i] = r->arrived[r->nexpected];
            break;
        }
    }
}

/* Nonzero when stream entry id is held in an open round already (our own
 * pending entries are read again after a claim). */
static int is_held(const psstore_applier_t *a, const char *id, size_t len)
{
    for (int g = 0; g < MAX_GROUPS; g++) {
        const round_t *r = &a->rounds[g];
        for (size_t i = 0; r->open && i < r->nheld; i++)
            if (strlen(r->held[i].id) == len && memcmp(r->held[i].id, id, len) == 0)
                return 1;
    }
    return 0;
}

/* Rule 1 inside the open rounds: a position some held gradient covers. */
static int overlaps_held(const psstore_applier_t *a, const psstore_grad_t *g)
{
    for (int k = 0; k < MAX_GROUPS; k++) {
        const round_t *r = &a->rounds[k];
        for (size_t h = 0; r->open && h < r->nheld; h++) {
            const held_t *hd = &r->held[h];
            for (size_t i = 0; i < g->nranges; i++)
                for (size_t j = 0; j < hd->nranges; j++)
                    if (g->ranges[i].partition == hd->ranges[j].partition &&
                        g->ranges[i].from < hd->ranges[j].to &&
                        hd->ranges[j].from < g->ranges[i].to &&
                        strcmp(g->ranges[i].topic, hd->ranges[j].topic) == 0)
                        return 1;
        }
    }
    return 0;
}

/* Adds g (its values gw, checked and clipped) to its group's round. */
static fr_err_t round_hold(psstore_applier_t *a, round_t *r, const psstore_grad_t *g,
                           const float *gw)
{
    if (r->nheld == r->cap_held) {
        size_t cap = r->cap_held ? 2 * r->cap_held : 8;
        held_t *grown = realloc(r->held, cap * sizeof(*grown));
        if (grown == NULL)
            return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
        memset(grown + r->cap_held, 0, (cap - r->cap_held) * sizeof(*grown));
        r->held = grown;
        r->cap_held = cap;
    }
    held_t *h = &r->held[r->nheld];
    if (ps_ranges_copy(g->ranges, g->nranges, &h->ranges, &h->cap_ranges, &h->topics,
                       &h->cap_topics) != FR_OK)
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
    h->nranges = g->nranges;
    /* the entry is acknowledged by the commit that closes the round, not
     * by the next one: it leaves ids (it is the last there) */
    h->id[0] = '\0'; /* a gradient of the in-process channel has none */
    if (a->cur_id != LOCAL_ID) {
        snprintf(h->id, sizeof(h->id), "%s", a->ids.p + a->cur_id);
        a->ids.len = a->cur_id;
        a->nids--;
    }
    snprintf(h->worker, sizeof(h->worker), "%s", g->worker);
    h->version = g->version;
    h->generation = g->generation;
    h->n = g->n;
    h->loss_sum = g->loss_sum;
    h->ts_min_ms = g->ts_min_ms;
    h->ts_max_ms = g->ts_max_ms;
    r->nheld++;
    if (r->nheld == 1)
        r->opened_ns = fr_clock_mono_ns();
    double n = (double)g->n;
    for (size_t j = 0; j < a->n; j++)
        r->sum[j] += n * (double)gw[j];
    r->nsamples += g->n;
    r->loss_sum += g->loss_sum;
    if (g->version < r->min_version)
        r->min_version = g->version;
    for (size_t i = 0; i < r->nexpected; i++) {
        if (!r->arrived[i] && strcmp(r->expected[i], g->worker) == 0) {
            r->arrived[i] = 1;
            r->narrived++;
            break;
        }
    }
    return FR_OK;
}

/*
 * The round modes' part of deciding a gradient with samples (epoch, replay
 * and rule 1 passed): non-finite ones are refused, the rest clipped and
 * held in the round of the worker's group; in mode backup one computed
 * before the round's version is late and dropped (reason "backup").
 */
static fr_err_t round_take(psstore_applier_t *a, const psstore_grad_t *g)
{
    float *gw = a->cur_g;
    if (gw == NULL) {
        gw = a->g;
        memcpy(gw, g->g, a->n * sizeof(float));
    }
    double norm2 = 0;
    int finite = 1;
    for (size_t j = 0; j < a->n; j++) {
        if (!isfinite(gw[j]))
            finite = 0;
        norm2 += (double)gw[j] * gw[j];
    }
    guard_record(a, !finite);
    if (!finite) {
        count_drop(a, PSSTORE_DROPPED_NONFINITE, g);
        return decide_mark(a, g, "nonfinite");
    }
    double c = a->conf.ctl.clip_norm;
    if (c > 0 && sqrt(norm2) > c) {
        float scale = (float)(c / sqrt(norm2));
        for (size_t j = 0; j < a->n; j++)
            gw[j] *= scale;
    }
    int grp = worker_group(a, g->worker);
    round_t *r = &a->rounds[grp];
    fr_err_t err;
    if (!r->open && (err = round_open(a, grp)) != FR_OK)
        return err;
    if (a->conf.mode == PSSTORE_MODE_BACKUP && g->version < r->version) {
        count_drop(a, PSSTORE_DROPPED_BACKUP, g);
        return decide_mark(a, g, "backup");
    }
    if ((err = round_hold(a, r, g, gw)) != FR_OK)
        return err;
    int timed_out;
    return round_ready(a, r, &timed_out) ? round_close(a, grp) : FR_OK;
}

/* Audits g with outcome and marks its positions (applied or dropped by a
 * named rule: either way its samples were seen). */
static fr_err_t decide_mark(psstore_applier_t *a, const psstore_grad_t *g, const char *outcome)
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
static fr_err_t decide(psstore_applier_t *a, const psstore_grad_t *g)
{
    if (g->epoch != a->epoch) {
        fr_log(FR_LOG_DEBUG, "applier %s: dropped a gradient of epoch %llu (now %llu)", a->model,
               (unsigned long long)g->epoch, (unsigned long long)a->epoch);
        count_drop(a, PSSTORE_DROPPED_EPOCH, g);
        return FR_OK;
    }
    if (is_older_generation(a, g)) {
        count_drop(a, PSSTORE_DROPPED_REPLAY, g);
        audit(a, g, "replay");
        return FR_OK;
    }
    if (is_duplicate(a, g) || overlaps_held(a, g)) {
        count_drop(a, PSSTORE_DROPPED_DUPLICATE, g);
        audit(a, g, "duplicate");
        return FR_OK;
    }
    if (g->n == 0) {
        count_drop(a, PSSTORE_DROPPED_EMPTY, g);
        audit(a, g, g->reason ? g->reason : "empty");
        return mark_ranges(a, g);
    }
    if (psstore_mode_rounds(a->conf.mode))
        return round_take(a, g);
    uint64_t t0 = fr_clock_mono_ns();
    float *gw = a->cur_g; /* the controller works in place */
    if (gw == NULL) {
        gw = a->g;
        memcpy(gw, g->g, a->n * sizeof(float));
    }
    psstore_decision_t d;
    psstore_outcome_t out = psstore_ctl_prepare(a->ctl, gw, a->version, g->version, a->w,
                                                a->conf.npushers > 0 ? a->conf.npushers : 1, &d);
    guard_record(a, out == PSSTORE_DROP_NONFINITE);
    if (out != PSSTORE_APPLY) {
        psstore_drop_t why =
            out == PSSTORE_DROP_NONFINITE ? PSSTORE_DROPPED_NONFINITE : PSSTORE_DROPPED_STALENESS;
        count_drop(a, why, g);
        audit(a, g, psstore_drop_name(why));
        return mark_ranges(a, g);
    }
    psstore_ctl_apply(a->ctl, a->w, a->opt, gw, &d);
    a->version++;
    psstore_ctl_record(a->ctl, a->version, a->w);
    a->weights_dirty = 1;
    a->last_loss = g->loss_sum / (double)g->n;
    note_ts(a, g->ts_min_ms, g->ts_max_ms);
    audit(a, g, "applied");
    version_entry(a, g, &d);
    pthread_mutex_lock(&a->lock);
    a->stats.applied++;
    a->stats.lr_eff = d.lr_eff;
    a->taus[a->ntaus++ % TAU_RING] = d.tau;
    pthread_mutex_unlock(&a->lock);
    fr_series_add(a->m_applied, 1);
    fr_series_observe(a->m_stale, (double)d.tau);
    fr_series_set(a->m_lr, d.lr_eff);
    fr_series_set(a->m_loss, a->last_loss);
    fr_series_observe(a->m_latency, (double)(fr_clock_mono_ns() - t0) * 1e-9);
    return mark_ranges(a, g);
}

/* Decodes one stream entry [id, [f, v, ...]] and decides it. */
static fr_err_t take_entry(psstore_applier_t *a, const redisReply *entry)
{
    if (entry->type != REDIS_REPLY_ARRAY || entry->elements < 2 ||
        entry->element[0]->type != REDIS_REPLY_STRING)
        return FR_OK;
    const redisReply *id = entry->element[0], *kv = entry->element[1];
    if (is_held(a, id->str, id->len))
        return FR_OK;
    a->cur_id = a->ids.len;
    if (buf_add(&a->ids, id->str, id->len) || buf_add(&a->ids, "", 1))
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
        err = ps_grad_decode(&a->msg, nf, fields, flens, vals, vlens, a->n, why, sizeof(why));
    }
    if (err != FR_OK) {
        fr_log(FR_LOG_WARN, "applier %s: malformed gradient %.*s: %s", a->model, (int)id->len,
               id->str, why);
        count_drop(a, PSSTORE_DROPPED_MALFORMED, NULL);
        return FR_OK;
    }
    pthread_mutex_lock(&a->lock);
    a->stats.bytes += a->msg.payload_bytes;
    pthread_mutex_unlock(&a->lock);
    fr_series_add(a->m_bytes, (double)a->msg.payload_bytes);
    return decide(a, &a->msg.g);
}

/* ---- operator requests ------------------------------------------------------------- */

/*
 * Parses a snapshot's offsets text ("topic/partition=value\n"...). With
 * apply set, replaces every partition's offsets with it; without, only
 * checks it, so a bad snapshot is refused before anything is touched.
 */
static fr_err_t snapshot_offsets(psstore_applier_t *a, const char *text, size_t len, int apply)
{
    if (apply) {
        for (size_t i = 0; i < a->nparts; i++)
            psstore_poff_fini(&a->parts[i].po);
        a->nparts = 0;
    }
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = nl ? nl : end;
        const char *eq = memchr(p, '=', (size_t)(line_end - p));
        char key[272], why[128];
        if (eq == NULL || (size_t)(eq - p) >= sizeof(key))
            return FR_ERR_PARSE;
        snprintf(key, sizeof(key), "%.*s", (int)(eq - p), p);
        char *slash = strrchr(key, '/');
        if (slash == NULL)
            return FR_ERR_PARSE;
        *slash = '\0';
        psstore_partition_offsets_t check;
        psstore_poff_init(&check, 0);
        fr_err_t err =
            psstore_poff_parse(&check, eq + 1, (size_t)(line_end - eq - 1), why, sizeof(why));
        if (err == FR_OK && apply) {
            part_t *part = find_part(a, key, (int32_t)atoi(slash + 1), 1);
            if (part == NULL) {
                err = FR_ERR_NOMEM;
            } else {
                psstore_poff_fini(&part->po);
                part->po = check; /* takes it over */
                part->dirty = 1;
                psstore_poff_init(&check, 0);
            }
        }
        psstore_poff_fini(&check);
        if (err != FR_OK)
            return err;
        p = nl ? nl + 1 : end;
    }
    return FR_OK;
}

/*
 * Restores retained snapshot v as version current + 1 of a new epoch, with
 * its weights, optimizer state and offsets, in one transaction that also
 * deletes the request. A snapshot that is not retained leaves everything
 * as it is (the request is deleted and the failure logged).
 */
static fr_err_t rollback(psstore_applier_t *a, int64_t v, const char *req_id)
{
    fr_err_t err = rounds_close(a, 1);
    if (err == FR_OK)
        err = commit(a); /* what was applied before the request */
    if (err != FR_OK || !a->active)
        return err;
    char key[PS_KEY_MAX];
    ps_key_shard(key, a->model, "snap", v);
    redisReply *r = ps_cmd(a->c, 1, &err, "HMGET %s weights opt offsets", key);
    if (r == NULL)
        return err;
    int ok = r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
             r->element[0]->type == REDIS_REPLY_STRING &&
             r->element[0]->len == a->n * sizeof(float);
    const redisReply *offs = ok ? r->element[2] : NULL;
    int offs_ok = ok && (offs->type != REDIS_REPLY_STRING ||
                         snapshot_offsets(a, offs->str, offs->len, 0) == FR_OK);
    if (!ok || !offs_ok) {
        freeReplyObject(r);
        fr_log(FR_LOG_ERROR, "applier %s: rollback to %lld: %s", a->model, (long long)v,
               ok ? "the snapshot's offsets are malformed" : "no such retained snapshot");
        snprintf(a->req_id, sizeof(a->req_id), "%s", req_id);
        return commit(a); /* deletes the request, changes nothing else */
    }
    memcpy(a->w, r->element[0]->str, a->n * sizeof(float));
    memset(a->opt, 0, a->opt_len * sizeof(float));
    if (r->element[1]->type == REDIS_REPLY_STRING &&
        r->element[1]->len == a->opt_len * sizeof(float))
        memcpy(a->opt, r->element[1]->str, r->element[1]->len);
    err = offs->type == REDIS_REPLY_STRING ? snapshot_offsets(a, offs->str, offs->len, 1)
                                           : snapshot_offsets(a, "", 0, 1);
    freeReplyObject(r);
    if (err != FR_OK) {
        drop_state(a); /* out of memory half way: reload from Redis */
        return ps_fail(a->c, err, "rollback to %lld: out of memory", (long long)v);
    }
    a->epoch = random_u64();
    a->version++;
    a->new_epoch = a->offsets_reset = a->weights_dirty = 1;
    a->stopped[0] = '\0';
    a->guard_pos = a->guard_fill = a->guard_bad = 0;
    snprintf(a->req_id, sizeof(a->req_id), "%s", req_id);
    psstore_ctl_reset(a->ctl);
    psstore_ctl_record(a->ctl, a->version, a->w);
    if (a->versions.len > 0)
        buf_add(&a->versions, "\1", 1);
    buf_kv(&a->versions, "version", "%lld", (long long)a->version);
    buf_kv(&a->versions, "epoch", "%llu", (unsigned long long)a->epoch);
    buf_kv(&a->versions, "rollback_from", "%lld", (long long)v);
    buf_kv(&a->versions, "t", "%lld", (long long)fr_clock_unix_ms());
    fr_log(FR_LOG_INFO, "applier %s: rolled back to snapshot %lld as version %lld of epoch %llu",
           a->model, (long long)v, (long long)a->version, (unsigned long long)a->epoch);
    a->snap_version = a->version; /* the restored weights are a snapshot already */
    /* the restored offsets carry the generations of their time: a published
     * replay is withdrawn (its generation stays) so that no consumer
     * resolves it again on top of them */
    int64_t replay_gen = 0;
    if (psstore_replay_current(a->c, a->model, &replay_gen, NULL, 0, NULL) == FR_OK &&
        replay_gen > 0) {
        a->replay_gen = replay_gen;
        a->replay_spec = "";
        a->replay_when = "0";
    }
    return commit(a);
}

/*
 * A replay's rewrite: for each "topic/partition=target" the watermark moves
 * to target, every applied interval is cleared and the generation recorded,
 * in one transaction with the request's deletion.
 */
static fr_err_t rewind_offsets(psstore_applier_t *a, int64_t generation, const char *targets,
                               const char *req_id)
{
    fr_err_t err = rounds_close(a, 1);
    if (err == FR_OK)
        err = commit(a);
    if (err != FR_OK || !a->active)
        return err;
    for (const char *p = targets; *p != '\0';) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *next = comma ? comma + 1 : p + len;
        char item[300];
        snprintf(item, sizeof(item), "%.*s", (int)len, p);
        p = next;
        char *eq = strrchr(item, '='), *slash = strrchr(item, '/'), *tail = NULL;
        long long target = eq ? strtoll(eq + 1, &tail, 10) : -1;
        if (eq == NULL || slash == NULL || slash > eq || *tail != '\0' || target < 0) {
            fr_log(FR_LOG_WARN, "applier %s: bad rewind target '%s' ignored", a->model, item);
            continue;
        }
        *eq = *slash = '\0';
        part_t *part = find_part(a, item, (int32_t)atoi(slash + 1), 1);
        if (part == NULL)
            return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
        if (generation <= part->po.generation) {
            fr_log(FR_LOG_WARN,
                   "applier %s: rewind of %s/%s with generation %lld ignored: the partition "
                   "is at generation %lld already (another owner rewrote it first)",
                   a->model, item, slash + 1, (long long)generation,
                   (long long)part->po.generation);
            continue;
        }
        psstore_poff_rewind(&part->po, target);
        part->po.generation = generation;
        part->dirty = 1;
        fr_log(FR_LOG_INFO, "applier %s: replay generation %lld rewinds %s/%s to %lld", a->model,
               (long long)generation, item, slash + 1, target);
    }
    snprintf(a->req_id, sizeof(a->req_id), "%s", req_id);
    return commit(a);
}

/*
 * An operator's replay: published in meta under the next replay
 * generation, with the request's text, in one transaction with the
 * request's deletion. The consumers owning the partitions resolve it and
 * send the rewrites (rewind_offsets).
 */
static fr_err_t publish_replay(psstore_applier_t *a, const char *spec, const char *requested,
                               const char *req_id)
{
    fr_err_t err = rounds_close(a, 1);
    if (err == FR_OK)
        err = commit(a);
    if (err != FR_OK || !a->active)
        return err;
    int64_t generation = 0;
    if ((err = psstore_replay_current(a->c, a->model, &generation, NULL, 0, NULL)) != FR_OK)
        return err;
    a->replay_gen = generation + 1;
    a->replay_spec = spec;
    a->replay_when = requested;
    snprintf(a->req_id, sizeof(a->req_id), "%s", req_id);
    err = commit(a);
    if (err == FR_OK)
        fr_log(FR_LOG_INFO, "applier %s: replay generation %lld published: %s", a->model,
               (long long)generation + 1, spec);
    a->replay_gen = 0; /* the texts belong to the request's reply */
    return err;
}

/* Deletes every key of the model (the lease too) under the lease. */
static fr_err_t delete_model(psstore_applier_t *a)
{
    ps_keylist_t kl = {0};
    fr_err_t err = ps_model_keys(a->c, a->model, &kl);
    int ours = 0;
    if (err != FR_OK || (err = watch_lease(a, &ours)) != FR_OK || !ours) {
        ps_keylist_fini(&kl);
        if (err == FR_OK)
            fenced(a, "before delete");
        return err;
    }
    const char *multi[] = {"MULTI"}, *exec_cmd[] = {"EXEC"};
    size_t queued = 0;
    if ((err = ps_pipeline_append(a->c, 1, multi, NULL)) == FR_OK)
        queued++;
    if (err == FR_OK)
        err = ps_queue_unlink(a->c, &kl, &queued);
    if (err == FR_OK && (err = ps_pipeline_append(a->c, 1, exec_cmd, NULL)) == FR_OK)
        queued++;
    ps_keylist_fini(&kl);
    redisReply *exec = NULL;
    for (size_t i = 0; i < queued && a->c->ctx != NULL; i++) {
        fr_err_t rerr;
        redisReply *r = ps_pipeline_read(a->c, &rerr); /* every reply, error replies too */
        if (i == queued - 1)
            exec = r;
        else
            freeReplyObject(r);
    }
    if (err != FR_OK || a->c->ctx == NULL) {
        freeReplyObject(exec);
        drop_state(a); /* unknown whether EXEC ran: reload */
        return err != FR_OK ? err : FR_ERR_REDIS;
    }
    int done = exec != NULL && exec->type == REDIS_REPLY_ARRAY;
    freeReplyObject(exec);
    if (!done) {
        fenced(a, "at delete");
        return FR_OK;
    }
    fr_log(FR_LOG_WARN, "applier %s: model deleted on request", a->model);
    drop_state(a);
    return FR_OK;
}

/* Executes the requests waiting in freshet:{m}:requests, oldest first. */
static fr_err_t run_requests(psstore_applier_t *a)
{
    fr_err_t err;
    redisReply *r = ps_cmd(a->c, 1, &err, "XRANGE %s - + COUNT 16", a->k_req);
    if (r == NULL)
        return err;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements && a->active; i++) {
        const redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
            e->element[1]->type != REDIS_REPLY_ARRAY)
            continue;
        char id[64], type[32] = "", version[32] = "", generation[32] = "", requested[32] = "";
        const char *targets = "", *spec = "";
        reply_str(e->element[0], id, sizeof(id));
        const redisReply *kv = e->element[1];
        for (size_t f = 0; f + 1 < kv->elements; f += 2) {
            if (strcmp(kv->element[f]->str, "type") == 0)
                reply_str(kv->element[f + 1], type, sizeof(type));
            else if (strcmp(kv->element[f]->str, "version") == 0)
                reply_str(kv->element[f + 1], version, sizeof(version));
            else if (strcmp(kv->element[f]->str, "generation") == 0)
                reply_str(kv->element[f + 1], generation, sizeof(generation));
            else if (strcmp(kv->element[f]->str, "targets") == 0 &&
                     kv->element[f + 1]->type == REDIS_REPLY_STRING)
                targets = kv->element[f + 1]->str;
            else if (strcmp(kv->element[f]->str, "spec") == 0 &&
                     kv->element[f + 1]->type == REDIS_REPLY_STRING)
                spec = kv->element[f + 1]->str;
            else if (strcmp(kv->element[f]->str, "requested") == 0)
                reply_str(kv->element[f + 1], requested, sizeof(requested));
        }
        if (strcmp(type, "rollback") == 0 && version[0] != '\0') {
            err = rollback(a, strtoll(version, NULL, 10), id);
        } else if (strcmp(type, "rewind") == 0 && generation[0] != '\0') {
            err = rewind_offsets(a, strtoll(generation, NULL, 10), targets, id);
        } else if (strcmp(type, "replay") == 0 && spec[0] != '\0') {
            err = publish_replay(a, spec, requested[0] != '\0' ? requested : "0", id);
        } else if (strcmp(type, "delete") == 0) {
            err = delete_model(a);
        } else {
            fr_log(FR_LOG_WARN, "applier %s: unknown request '%s' (%s) deleted", a->model, type,
                   id);
            snprintf(a->req_id, sizeof(a->req_id), "%s", id);
            err = commit(a);
        }
        if (err != FR_OK)
            break;
    }
    freeReplyObject(r);
    return err;
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
    size_t per_read = READ_BYTES / (a->n * sizeof(float) + 1);
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
    redisReply *r = ps_cmd_argv(a->c, 1, argc, argv, lens, &err);
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
            reply_str(last->element[0], a->pending_from, sizeof(a->pending_from));
    }
    for (size_t i = 0; i < n && a->active && a->stopped[0] == '\0'; i++) {
        if ((err = take_entry(a, entries->element[i])) != FR_OK)
            break;
        if (a->conf.commit_ms == 0 && (err = commit(a)) != FR_OK)
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
    for (size_t i = 0; i < k && a->active && a->stopped[0] == '\0'; i++) {
        a->cur_id = LOCAL_ID;
        /* the slot's buffer is the channel's, ours until the release */
        a->cur_g = (float *)gs[i]->g;
        err = decide(a, gs[i]);
        a->cur_g = NULL;
        if (err != FR_OK)
            break;
    }
    ps_local_release(a->local);
    *n = (int)k;
    return err;
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
    int total = 0;
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
        /* the stream (trainers of other processes) is read every
         * LOCAL_WAIT_MS, and at once again while it delivers */
        uint64_t now = fr_clock_mono_ns();
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
        total += nlocal + nstream;
        elapsed = fr_clock_mono_ns() - start;
        if (elapsed >= window && (total > 0 || elapsed >= (uint64_t)block_ms * 1000000ull))
            return FR_OK;
    }
}

fr_err_t psstore_applier_poll(psstore_applier_t *a, int block_ms)
{
    fr_err_t err = FR_OK;
    if (!a->active) {
        if ((err = try_acquire(a)) != FR_OK)
            return err;
        if (!a->active) {
            /* a standby: look again soon, the lease may expire any moment */
            struct timespec ts = {0, (long)(block_ms < 100 ? block_ms : 100) * 1000000L};
            nanosleep(&ts, NULL);
            return FR_OK;
        }
    }
    if (a->c->reconnects != a->reconnects) {
        /* The connection was re-established under us: Redis may have
         * restarted (losing writes), so reload and let the run_id check
         * decide whether a new epoch starts. */
        fr_log(FR_LOG_WARN, "applier %s: reconnected to Redis; reloading its state", a->model);
        drop_state(a);
        return try_acquire(a);
    }
    if ((err = renew(a)) != FR_OK || !a->active)
        goto out;
    if (fr_clock_mono_ns() - a->claim_ns > (uint64_t)a->conf.lease_ms * 1000000ull) {
        /* entries a stale applier claimed after losing the lease sit idle
         * in its consumer: take those idle longer than a lease */
        a->claim_ns = fr_clock_mono_ns();
        if ((err = claim_pending(a, (long long)a->conf.lease_ms)) != FR_OK)
            goto out;
    }
    if ((err = run_requests(a)) != FR_OK || !a->active)
        goto out;
    if (a->conf.requests_only)
        return FR_OK;
    if (a->stopped[0] != '\0') {
        struct timespec ts = {0, (long)(block_ms < 500 ? block_ms : 500) * 1000000L};
        nanosleep(&ts, NULL);
        return FR_OK;
    }
    uint64_t start = fr_clock_mono_ns();
    int nread;
    if (a->local != NULL) {
        if ((err = read_local_and_stream(a, block_ms)) != FR_OK)
            goto out;
    } else {
        /* the first read waits up to block_ms for a gradient. The rest of
         * the commit window reads without blocking and naps here between
         * empty reads: Redis ends a short BLOCK only at its next hz tick
         * (100 ms by default), and a lull is the usual case in the round
         * modes, whose workers wait for the close. A closed or ready round
         * ends the window at once. */
        uint64_t window = (uint64_t)a->conf.commit_ms * 1000000ull;
        if ((err = read_and_apply(a, block_ms, &nread)) != FR_OK)
            goto out;
        while (a->active && nread > 0 && window > 0 && !rounds_waiting(a)) {
            uint64_t elapsed = fr_clock_mono_ns() - start;
            if (elapsed >= window)
                break;
            int more;
            if ((err = read_and_apply(a, 0, &more)) != FR_OK)
                goto out;
            if (more == 0) {
                uint64_t nap = window - elapsed < STREAM_NAP_NS ? window - elapsed : STREAM_NAP_NS;
                struct timespec ts = {0, (long)nap};
                nanosleep(&ts, NULL);
            }
        }
    }
    /* members: removed after member_timeout in every mode; rounds close on
     * a departure or at round_timeout */
    if (a->active && fr_clock_mono_ns() - a->members_ns > MEMBERS_MS * 1000000ull &&
        (err = refresh_members(a)) != FR_OK)
        goto out;
    if (a->active && psstore_mode_rounds(a->conf.mode) && (err = rounds_close(a, 0)) != FR_OK)
        goto out;
    if (a->active)
        err = commit(a);
    if (err == FR_OK && a->active && a->local != NULL)
        ps_local_publish(a->local, a->w, a->epoch, a->version, a->local_rounds);
out:
    if (err != FR_OK && a->active) {
        /* unknown whether the last transaction landed: reload from Redis */
        fr_log(FR_LOG_WARN, "applier %s: %s; reloading state", a->model, psstore_conn_error(a->c));
        drop_state(a);
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

static int stop_set(void *arg)
{
    return *(const volatile int *)arg != 0;
}

fr_err_t psstore_applier_run(psstore_applier_t *a, const volatile int *stop)
{
    /* with Redis gone, a stop does not wait out reconnect backoffs: the
     * last commit and the lease release fail at once (the lease expires,
     * unapplied work is read again) */
    psstore_conn_set_cancel(a->c, stop_set, (void *)(uintptr_t)stop);
    int backoff = 10;
    while (!*stop) {
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
    if (a->active) {
        commit(a);
        fr_err_t err;
        static const char *script =
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) "
            "else return 0 end";
        freeReplyObject(ps_cmd(a->c, 0, &err, "EVAL %s 1 %s %s", script, a->k_lease, a->token));
        drop_state(a);
    }
    forget_consumer(a);
    return FR_OK;
}
