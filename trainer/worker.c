/*
 * worker.c - the trainers' worker loop (docs/design.md "Data flow"): W threads,
 * each with its own backend, store client and buffers, allocated once.
 * A worker takes a batch from the consumer's queue, pulls the weights when
 * the store holds another (epoch, version) than its local copy (one round
 * trip otherwise), computes the gradient of the batch-mean loss, pushes it
 * with the (epoch, version) it was computed on, the batch's replay
 * generation and its position intervals, and reports the batch done to the
 * consumer with the stream id of the push (rule 3 needs to know what is
 * outstanding). An n = 0 batch is pushed as positions only. Before a pull
 * a worker waits until no more than [trainer] in_flight - 1 of its pushes
 * are undecided (docs/design.md "Staleness and the controller"): the queue
 * before the applier is the staleness, so it is never let grow.
 *
 * Membership (docs/design.md "Training modes"): each worker heartbeats once a
 * second into the members hash (backend, group, SSP clock, idle flag) and
 * leaves it on a clean stop. Modes async and adaptive need nothing more of
 * a worker. In sync, backup and groups a worker reads its group's round
 * count before it pulls, and after pushing waits until that count moves
 * (the applier closed the round), at most round_wait_ms: in freshet run on
 * the in-process channel, otherwise blocked on the store's streams
 * (psstore_round_wait), never polling. In ssp a worker
 * does not start a step while its clock (gradients pushed) is more than
 * ssp_bound ahead of the slowest live, non-idle member; a newcomer, or a
 * worker back from idle, starts at the current minimum. A straggler factor
 * f makes a worker sleep (f - 1) times its compute time after each
 * gradient (experiments only).
 *
 * This file holds the loop and the pool; a worker's part in the modes is
 * worker_modes.c, the isolation of a poisoned batch worker_poison.c.
 *
 * Threads: one per worker; the counters are atomics read by
 * trainer_pool_stats from any thread.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "trainer/worker_int.h"

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Notes a push that is in flight (a ticket of the channel, or a stream id).
 * Round modes bound it already (a worker waits for its round to close) and
 * are not tracked. */
static void flight_add(worker_t *wk, uint64_t ticket, const char *id)
{
    trainer_pool_t *p = wk->pool;
    if (p->in_flight < 1 || psstore_mode_rounds(p->mode))
        return;
    if (wk->nflights == IN_FLIGHT_MAX) { /* cannot happen: in_flight <= max */
        wk->flight_head = (wk->flight_head + 1) % IN_FLIGHT_MAX;
        wk->nflights--;
    }
    flight_t *f = &wk->flights[(wk->flight_head + wk->nflights) % IN_FLIGHT_MAX];
    f->ticket = ticket;
    snprintf(f->id, sizeof(f->id), "%s", id != NULL ? id : "");
    wk->nflights++;
}

/*
 * Whether the worker decides its next gradient itself when the applier is
 * free (psstore_local_push_help), when the push reaches the in-flight bound,
 * so that it would wait (flights_wait) before its next pull anyway: 1 for the
 * pool's one worker; 2, only while the applier's thread waits for Redis
 * (psstore_local_push_help_away), for a pool of several. Always helping with
 * two workers on 2 cores gained no rate and widened the staleness (p99 2 to
 * 5-6 versions): a worker whose steps no longer wait for the applier's turn
 * runs ahead of one that lost its core; during a round trip the applier's
 * thread decides nothing, and a pusher that waited for it waited for Redis
 * (docs/design.md "The co-located fast path").
 */
static int decides_own(const worker_t *wk)
{
    const trainer_pool_t *p = wk->pool;
    if (p->in_flight < 1 || psstore_mode_rounds(p->mode) || wk->nflights + 1 < p->in_flight)
        return 0;
    return p->nworkers == 1 ? 1 : 2;
}

/*
 * The in-flight bound (docs/design.md "Staleness and the controller"):
 * before it pulls, a worker with in_flight gradients pushed and not yet
 * applied waits until the oldest is (on the channel: in the published
 * weights; through Redis: committed). Its next gradient is then computed
 * on weights that hold all but in_flight - 1 of its own, and the queue
 * before the applier never holds more than in_flight per worker: the
 * staleness that is left comes from the other workers' concurrency. A
 * wait ends after PUSH_WAIT_MS whatever happened (a lost gradient is read
 * again by the gap rule), or at a stop.
 */
static void flights_wait(worker_t *wk)
{
    trainer_pool_t *p = wk->pool;
    if (wk->nflights < p->in_flight || wk->nflights == 0)
        return;
    flight_t *f = &wk->flights[wk->flight_head];
    uint64_t t0 = fr_clock_mono_ns();
    uint64_t limit = (uint64_t)PUSH_WAIT_MS * 1000000ull;
    while (!atomic_load(&p->stop) && fr_clock_mono_ns() - t0 < limit) {
        if (f->ticket > 0) {
            fr_err_t err = p->local != NULL
                               ? psstore_local_wait_applied(p->local, f->ticket, NEXT_WAIT_MS)
                               : FR_OK;
            if (err == FR_ERR_STATE) /* the channel closed: the gradient is lost */
                ingest_consumer_lost(p->source);
            if (err != FR_ERR_TIMEOUT)
                break;
        } else {
            int applied = 0;
            if (psstore_applied_wait(wk->cl, f->id, ROUND_BLOCK_MS, &applied) != FR_OK || applied)
                break;
        }
        trainer_worker_beat_due(wk);
    }
    wk->flight_head = (wk->flight_head + 1) % IN_FLIGHT_MAX;
    wk->nflights--;
    atomic_fetch_add(&p->wait_ns, fr_clock_mono_ns() - t0);
}

/*
 * Takes the weights from the in-process channel while this process's
 * applier holds the lease (docs/design.md "The co-located fast path"): a
 * sharded model's (at) each shard's slice, copied; else the channel's
 * weights, held and computed on in place (no copy). Whether it did; *changed
 * says whether they differ from the last ones.
 */
static int pull_local(worker_t *wk, psstore_shard_at_t *at, int *changed)
{
    trainer_pool_t *p = wk->pool;
    int local = 0;
    if (p->local != NULL && at != NULL) { /* each shard's slice, copied */
        local = psstore_local_pull_at(p->local, wk->w, at, changed) == FR_OK;
        if (local) {
            wk->epoch = at->epoch;
            wk->version = at->version;
        }
    } else if (p->local != NULL) { /* computed on in place: no copy */
        local = psstore_local_hold(p->local, &wk->held, &wk->epoch, &wk->version, changed) == FR_OK;
    }
    return local;
}

/*
 * The pull phase: waits for the in-flight bound, then brings the weights to
 * the store's (epoch, version), from the channel (*local set) or from Redis,
 * and loads them into the backend when they changed. *at receives a sharded
 * model's shards. Returns FR_OK, or the error after logging it.
 */
static fr_err_t batch_pull(worker_t *wk, psstore_shard_at_t **at, int *local)
{
    trainer_pool_t *p = wk->pool;
    fr_err_t err;
    /* an n = 0 batch needs the store's epoch too, or the applier drops it
     * (reason "epoch") without marking its positions */
    int changed = 0;
    flights_wait(wk);
    uint64_t tp = fr_clock_mono_ns();
    *at = psstore_client_at(wk->cl); /* a sharded model's shards */
    *local = pull_local(wk, *at, &changed);
    if (!*local && wk->held != NULL) {
        /* back to the worker's own copy, which holds some older version:
         * read it whole */
        psstore_local_unhold(p->local, wk->held);
        wk->held = NULL;
        wk->version = -1;
    }
    if (!*local &&
        (err = psstore_pull(wk->cl, wk->w, &wk->epoch, &wk->version, &changed)) != FR_OK) {
        fr_log(FR_LOG_WARN, "worker %s: pull: %s", wk->id, psstore_client_error(wk->cl));
        return err;
    }
    if (changed) {
        atomic_fetch_add(&p->pulls, 1);
        if ((err = trainer_backend_load(wk->be, wk->held != NULL ? wk->held : wk->w)) != FR_OK) {
            fr_log(FR_LOG_ERROR, "worker %s: %s", wk->id, trainer_backend_error(wk->be));
            return err;
        }
    }
    atomic_fetch_add(&p->pull_ns, fr_clock_mono_ns() - tp);
    return FR_OK;
}

/*
 * The compute phase: the gradient of the batch-mean loss into wk->g and
 * *loss, timed (compute_ns, the step histogram); then a straggler sleeps
 * its slowdown. Returns FR_OK, or the backend's error after logging it.
 */
static fr_err_t batch_gradient(worker_t *wk, const ingest_batch_t *b, double *loss)
{
    trainer_pool_t *p = wk->pool;
    uint64_t t0 = fr_clock_mono_ns();
    fr_err_t err = trainer_backend_gradient(wk->be, wk->g, loss, b->x, b->y, (int)b->n);
    if (err != FR_OK) {
        fr_log(FR_LOG_ERROR, "worker %s: %s", wk->id, trainer_backend_error(wk->be));
        return err;
    }
    uint64_t spent = fr_clock_mono_ns() - t0;
    atomic_fetch_add(&p->compute_ns, spent);
    if (p->m_step != NULL)
        fr_series_observe(p->m_step, (double)spent * 1e-9);
    if (wk->slowdown > 1.0 && (wk->slow_until_ns == 0 || fr_clock_mono_ns() < wk->slow_until_ns))
        sleep_ns((uint64_t)((wk->slowdown - 1.0) * (double)spent));
    return FR_OK;
}

/*
 * What per-sample isolation's outcome kept (trainer_worker_isolate_nonfinite: a count of
 * samples, or ISO_DIVERGED) makes of the message of a batch of n: the
 * samples kept, none (positions only, reason "poison"), or a gradient that
 * carries the divergence.
 */
static void batch_kept(worker_t *wk, size_t n, int64_t kept, double *loss, psstore_grad_t *msg)
{
    if (kept >= 0 && kept < (int64_t)n) {
        wk->kept = (size_t)kept; /* poison isolated: the rest is learned */
        msg->n = kept;
        msg->loss_sum = *loss;
    }
    if (kept == 0) { /* all poison: the positions are covered, nothing learned */
        msg->reason = "poison";
        msg->g = NULL;
        msg->len = 0;
        msg->loss_sum = 0;
        *loss = 0;
    }
    if (kept == ISO_DIVERGED) {
        /* the model diverged on this batch: the message cannot carry
         * the loss, so the gradient carries the news, and the applier
         * drops it as non-finite (counted, positions marked) and its
         * divergence guard stops the model instead of the batch being
         * read again forever */
        wk->g[0] = NAN;
        msg->loss_sum = 0;
        *loss = 0;
    }
}

/*
 * The message of a computed batch: its gradient, loss, sum of squares and
 * timestamps, after per-sample isolation (docs/design.md "Poison in a
 * batch") when the gradient is not finite. Returns FR_OK, or
 * FR_ERR_BACKEND when the isolation failed (logged): the batch is then
 * abandoned and read again.
 */
static fr_err_t batch_message(worker_t *wk, const ingest_batch_t *b, double *loss,
                              psstore_grad_t *msg)
{
    trainer_pool_t *p = wk->pool;
    msg->g = wk->g;
    msg->len = p->m.nparams;
    msg->loss_sum = *loss;
    if (b->min_ts_ms > 0 && b->max_ts_ms >= b->min_ts_ms) {
        msg->ts_min_ms = b->min_ts_ms; /* for the applier's freshness figures */
        msg->ts_max_ms = b->max_ts_ms;
    }
    /* one pass, while the gradient is in this core's cache: its sum of
     * squares, which the applier takes instead of a pass of its own,
     * and, finite, the proof that every entry is (psstore/update/update.h) */
    double sq = psstore_sum_squares(wk->g, p->m.nparams);
    int finite =
        isfinite(*loss) && (isfinite(sq) || trainer_worker_finite_all(wk->g, p->m.nparams, *loss));
    int64_t kept = finite ? (int64_t)b->n : trainer_worker_isolate_nonfinite(wk, b, loss);
    if (kept > 0 && kept < (int64_t)b->n) /* the gradient of the samples kept */
        sq = psstore_sum_squares(wk->g, p->m.nparams);
    msg->sq_known = kept > 0;
    msg->sq = sq;
    if (kept == ISO_ERROR)
        return FR_ERR_BACKEND; /* abandoned: read again */
    batch_kept(wk, b->n, kept, loss, msg);
    return FR_OK;
}

/*
 * Pushes msg into the in-process channel: copied for an n = 0 batch, else
 * swapped for a free buffer, or decided by this worker itself when the
 * applier is free (decides_own). Notes a gradient in flight. Returns the
 * push's error (logged at debug level).
 */
static fr_err_t push_local(worker_t *wk, const psstore_grad_t *msg)
{
    trainer_pool_t *p = wk->pool;
    uint64_t ticket = 0;
    fr_err_t err;
    int own = msg->n > 0 ? decides_own(wk) : 0;
    if (msg->n == 0)
        err = psstore_local_push(p->local, msg, PUSH_WAIT_MS, &ticket);
    else if (own == 1)
        /* it will wait for this gradient (or an older one) before its
         * next pull: it decides it itself when the applier is free */
        err = psstore_local_push_help(p->local, msg, &wk->g, PUSH_WAIT_MS, &ticket);
    else if (own == 2) /* ... or while the applier waits for Redis */
        err = psstore_local_push_help_away(p->local, msg, &wk->g, PUSH_WAIT_MS, &ticket);
    else
        err = psstore_local_push_swap(p->local, msg, &wk->g, PUSH_WAIT_MS, &ticket);
    if (err != FR_OK)
        fr_log(FR_LOG_DEBUG, "worker %s: in-process push: %s", wk->id, fr_strerror(err));
    else if (msg->n > 0)
        flight_add(wk, ticket, NULL);
    return err;
}

/*
 * The push phase: msg goes back the way its weights came (local: the
 * channel), else through Redis, where *id receives the push's stream id.
 * Returns the push's error, logged.
 */
static fr_err_t batch_push(worker_t *wk, const psstore_grad_t *msg, int local, const char **id)
{
    trainer_pool_t *p = wk->pool;
    fr_err_t err;
    uint64_t t1 = fr_clock_mono_ns();
    *id = NULL;
    if (local) {
        /* weights of the channel may be newer than Redis's: a gradient on
         * them goes back the same way, or is abandoned (read again) */
        err = push_local(wk, msg);
    } else {
        err = psstore_push(wk->cl, msg, PUSH_WAIT_MS);
        if (err != FR_OK)
            fr_log(FR_LOG_WARN, "worker %s: push: %s", wk->id, psstore_client_error(wk->cl));
        *id = psstore_client_last_id(wk->cl);
        if (err == FR_OK && msg->n > 0)
            flight_add(wk, 0, *id);
    }
    atomic_fetch_add(&p->push_ns, fr_clock_mono_ns() - t1);
    return err;
}

/*
 * Computes and pushes one batch: pull, compute (with poison isolation),
 * push. Returns FR_OK, or the error after logging it (the caller reports
 * the batch abandoned: the gap rule reads it again).
 */
static fr_err_t train_batch(worker_t *wk, const ingest_batch_t *b, double *loss, const char **id)
{
    psstore_grad_t msg = {.generation = b->generation,
                          .worker = wk->id,
                          .n = (int64_t)b->n,
                          .reason = b->n == 0 ? b->reason : NULL,
                          .ranges = b->ranges, /* one range type: no copy */
                          .nranges = b->nranges};
    psstore_shard_at_t *at = NULL;
    int local = 0;
    fr_err_t err;
    *loss = 0;
    wk->kept = b->n;
    if ((err = batch_pull(wk, &at, &local)) != FR_OK)
        return err;
    if (b->n > 0 && ((err = batch_gradient(wk, b, loss)) != FR_OK ||
                     (err = batch_message(wk, b, loss, &msg)) != FR_OK))
        return err;
    msg.epoch = wk->epoch;
    msg.version = wk->version < 0 ? 0 : wk->version;
    msg.at = at; /* a sharded model: each shard's (epoch, version) */
    return batch_push(wk, &msg, local, id);
}

static int pool_stopping(void *arg)
{
    return atomic_load(&((trainer_pool_t *)arg)->stop) != 0;
}

static void *worker_main(void *arg)
{
    worker_t *wk = arg;
    trainer_pool_t *p = wk->pool;
    char name[16];
    snprintf(name, sizeof(name), "fr-worker%d", wk->index);
    fr_thread_name(name);
    psstore_client_set_cancel(wk->cl, pool_stopping, p);
    int rounds = psstore_mode_rounds(p->mode);
    int fed = 0; /* a batch came (the first beat was trainer_pool_start's) */
    while (!atomic_load(&p->stop)) {
        trainer_worker_beat_due(wk);
        uint64_t tq = fr_clock_mono_ns();
        ingest_batch_t *b = ingest_consumer_next(p->source, NEXT_WAIT_MS);
        if (fed) { /* the wait for the group's first assignment is no starving */
            uint64_t waited = fr_clock_mono_ns() - tq;
            wk->waited_ns += waited;
            if (p->m_starved != NULL)
                fr_series_add(p->m_starved, (double)waited * 1e-9);
            /* a wait that a batch ends was starving; one that none ends
             * (a finite topic's end, until the stop) was idle */
            if (b != NULL) {
                atomic_fetch_add(&p->starved_ns, wk->waited_ns);
                wk->waited_ns = 0;
            }
        }
        fed |= b != NULL;
        trainer_worker_track_idle(wk, b);
        if (b == NULL)
            continue;
        int ssp = b->n > 0 && trainer_worker_ssp_step(wk);
        if (ssp)
            trainer_worker_ssp_wait(wk);
        /* the round count is read before the pull: a round that closes in
         * between only means the wait below ends at once */
        int64_t round = -1;
        int local_round = 0;
        if (b->n > 0 && rounds && trainer_worker_round_read(wk, &round, &local_round) != FR_OK)
            round = -1;
        double loss = 0;
        const char *id = NULL;
        fr_err_t err = train_batch(wk, b, &loss, &id);
        /* a gradient handed over in process has no stream id: it is
         * applied within the commit window, or lost with this process */
        ingest_consumer_done(p->source, b, err == FR_OK ? id : NULL);
        if (err == FR_OK && b->n > 0) {
            wk->me.clock++;
            if (ssp || rounds)
                trainer_worker_beat(wk); /* ssp: the others wait on this clock */
            if (round >= 0)
                trainer_worker_round_wait(wk, round, local_round);
        }
        if (err == FR_OK) {
            atomic_fetch_add(&p->samples, wk->kept);
            atomic_fetch_add(&p->batches, 1);
            if (wk->version >= atomic_load(&p->version)) {
                atomic_store(&p->version, wk->version);
                atomic_store(&p->epoch, wk->epoch);
            }
            pthread_mutex_lock(&p->lock);
            p->loss_sum += loss;
            pthread_mutex_unlock(&p->lock);
            if (p->m_samples != NULL)
                fr_series_add(p->m_samples, (double)wk->kept);
        } else {
            atomic_fetch_add(&p->failed, 1);
            ingest_consumer_lost(p->source); /* read again soon, not in gap_timeout */
            if (p->m_failed != NULL)
                fr_series_add(p->m_failed, 1);
        }
        ingest_batch_destroy(b);
    }
    atomic_fetch_add(&p->idle_ns, wk->waited_ns);
    wk->waited_ns = 0;
    psstore_member_leave(wk->cl, wk->id);
    psstore_local_unhold(p->local, wk->held); /* the channel may outlive the pool */
    wk->held = NULL;
    return NULL;
}

static void metrics_init(trainer_pool_t *p, fr_metrics_t *reg)
{
    static const double step_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01,
                                         0.025,  0.05,  0.1,    0.25,  1};
    if (reg == NULL)
        return;
    fr_metric_t *m = fr_metrics_counter(reg, "freshet_trainer_samples_total",
                                        "Samples whose gradients the workers pushed.", 0, NULL);
    p->m_samples = m != NULL ? fr_metric_series(m, NULL) : NULL;
    m = fr_metrics_counter(reg, "freshet_trainer_batches_failed_total",
                           "Batches abandoned because a pull, compute or push failed.", 0, NULL);
    p->m_failed = m != NULL ? fr_metric_series(m, NULL) : NULL;
    m = fr_metrics_counter(reg, "freshet_trainer_samples_poisoned_total",
                           "Samples dropped alone because their loss or gradient was not finite; "
                           "the rest of their batch was learned.",
                           0, NULL);
    p->m_poison = m != NULL ? fr_metric_series(m, NULL) : NULL;
    m = fr_metrics_histogram(reg, "freshet_trainer_step_seconds",
                             "Forward and backward pass of one batch.",
                             sizeof(step_bounds) / sizeof(step_bounds[0]), step_bounds, 0, NULL);
    p->m_step = m != NULL ? fr_metric_series(m, NULL) : NULL;
    m = fr_metrics_counter(reg, "freshet_trainer_data_wait_seconds_total",
                           "Time the workers waited for a batch from the consumer (after the "
                           "first): data arriving slower than they compute.",
                           0, NULL);
    p->m_starved = m != NULL ? fr_metric_series(m, NULL) : NULL;
}

trainer_pool_t *trainer_pool_new(const trainer_pool_conf_t *conf, char *errstr, size_t size)
{
    if (conf == NULL || conf->m == NULL || conf->source == NULL || conf->workers < 1 ||
        conf->max_batch < 1) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "trainer: bad pool configuration");
        return NULL;
    }
    trainer_pool_t *p = calloc(1, sizeof(*p));
    if (p == NULL || (p->workers = calloc((size_t)conf->workers, sizeof(worker_t))) == NULL) {
        free(p);
        fr_errorf(FR_ERR_NOMEM, errstr, size, "trainer: out of memory");
        return NULL;
    }
    p->m = *conf->m;
    p->source = conf->source;
    p->nworkers = conf->workers;
    p->mode = conf->mode;
    p->local = conf->local;
    p->ssp_bound = conf->ssp_bound;
    p->idle_ms = conf->idle_ms > 0 ? conf->idle_ms : 2000;
    p->round_wait_ms = conf->round_wait_ms > 0 ? conf->round_wait_ms : 6000;
    p->in_flight = conf->in_flight < IN_FLIGHT_MAX ? conf->in_flight : IN_FLIGHT_MAX;
    pthread_mutex_init(&p->lock, NULL);
    atomic_init(&p->version, -1);
    char host[64] = "host";
    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    for (int i = 0; i < conf->workers; i++) {
        worker_t *wk = &p->workers[i];
        wk->pool = p;
        wk->index = i;
        wk->version = -1;
        wk->slowdown = conf->slowdown != NULL ? conf->slowdown[i] : 1.0;
        if (conf->slowdown_s != NULL && conf->slowdown_s[i] > 0)
            wk->slow_until_ns = fr_clock_mono_ns() + (uint64_t)(conf->slowdown_s[i] * 1e9);
        snprintf(wk->id, sizeof(wk->id), "%s/%d/%d", host, (int)getpid(), i);
        snprintf(wk->me.id, sizeof(wk->me.id), "%s", wk->id);
        wk->me.group = conf->mode == PSSTORE_MODE_GROUPS && conf->groups > 1 ? i % conf->groups : 0;
        char why[512];
        wk->be =
            trainer_backend_new(conf->backend, &p->m, conf->max_batch,
                                conf->devices != NULL ? conf->devices[i] : 0, why, sizeof(why));
        if (wk->be == NULL) {
            fr_errorf(FR_ERR_INVAL, errstr, size, "worker %d: %s", i, why);
            goto err;
        }
        snprintf(wk->me.backend, sizeof(wk->me.backend), "%s", trainer_backend_name(wk->be));
        wk->cl = psstore_client_new(conf->redis_url, conf->model, p->m.nparams, conf->max_pending,
                                    why, sizeof(why));
        if (wk->cl == NULL) {
            fr_errorf(FR_ERR_REDIS, errstr, size, "worker %d: %s", i, why);
            goto err;
        }
        wk->w = malloc(p->m.nparams * sizeof(float));
        wk->g = malloc(p->m.nparams * sizeof(float));
        if (wk->w == NULL || wk->g == NULL) {
            fr_errorf(FR_ERR_NOMEM, errstr, size, "trainer: out of memory");
            goto err;
        }
        fr_mem_touch(wk->w, p->m.nparams * sizeof(float));
        fr_mem_touch(wk->g, p->m.nparams * sizeof(float));
    }
    metrics_init(p, conf->metrics);
    fr_log(FR_LOG_INFO, "trainer: %d worker(s) on %s, model %s", p->nworkers,
           trainer_backend_name(p->workers[0].be), conf->model);
    return p;
err:
    trainer_pool_destroy(p);
    return NULL;
}

fr_err_t trainer_pool_start(trainer_pool_t *p)
{
    if (p->started)
        return FR_ERR_STATE;
    /* every worker is a member before any trains: in ssp a worker that
     * started first would otherwise run ahead of a sibling whose thread
     * had not yet written its entry (the bound counts live members) */
    for (int i = 0; i < p->nworkers; i++) {
        if (p->mode == PSSTORE_MODE_SSP)
            trainer_worker_ssp_join(&p->workers[i]);
        trainer_worker_beat(&p->workers[i]);
    }
    for (int i = 0; i < p->nworkers; i++) {
        if (pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]) != 0) {
            atomic_store(&p->stop, 1);
            for (int j = 0; j < i; j++)
                pthread_join(p->workers[j].thread, NULL);
            return FR_ERR_NOMEM;
        }
    }
    p->started = 1;
    return FR_OK;
}

void trainer_pool_stop(trainer_pool_t *p)
{
    if (p == NULL || !p->started)
        return;
    atomic_store(&p->stop, 1);
    for (int i = 0; i < p->nworkers; i++)
        pthread_join(p->workers[i].thread, NULL);
    p->started = 0;
}

void trainer_pool_destroy(trainer_pool_t *p)
{
    if (p == NULL)
        return;
    trainer_pool_stop(p);
    for (int i = 0; i < p->nworkers; i++) {
        worker_t *wk = &p->workers[i];
        trainer_backend_destroy(wk->be);
        psstore_client_destroy(wk->cl);
        free(wk->w);
        free(wk->g);
        free(wk->peers);
        free(wk->iso_x);
        free(wk->iso_y);
        free(wk->iso_g);
        free(wk->iso_drop);
        free(wk->iso_pos);
    }
    free(p->workers);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void trainer_pool_stats(trainer_pool_t *p, trainer_pool_stats_t *st)
{
    memset(st, 0, sizeof(*st));
    st->samples = atomic_load(&p->samples);
    st->poisoned = atomic_load(&p->poisoned);
    st->batches = atomic_load(&p->batches);
    st->pulls = atomic_load(&p->pulls);
    st->failed = atomic_load(&p->failed);
    st->compute_ns = atomic_load(&p->compute_ns);
    st->push_ns = atomic_load(&p->push_ns);
    st->wait_ns = atomic_load(&p->wait_ns);
    st->pull_ns = atomic_load(&p->pull_ns);
    st->starved_ns = atomic_load(&p->starved_ns);
    st->idle_ns = atomic_load(&p->idle_ns);
    st->version = atomic_load(&p->version);
    st->epoch = atomic_load(&p->epoch);
    pthread_mutex_lock(&p->lock);
    st->loss_sum = p->loss_sum;
    pthread_mutex_unlock(&p->lock);
}
