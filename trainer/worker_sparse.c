/*
 * worker_sparse.c - the workers of a sparse model (pool_sparse.h;
 * docs/design.md "Sparse models").
 *
 * Per batch: unpack its samples (sparse_unpack), list their distinct rows
 * (sparse_batch_add), pull those rows, the dense part (the bias and the
 * tower) and the (epoch, version) they are at in one transaction (psstore_rows_pull; a row the
 * store does not hold starts at sparse_row_init's value, which every process computes alike), score
 * every sample before learning from it (the progressive logloss), and push the rows' summed
 * gradients packed with their rows (psstore_sparse_pack). An n = 0 batch (positions only) is pushed
 * with the store's epoch, so that its positions are marked.
 *
 * A model of S shards (docs/design.md "Sparse models on shards"): the
 * batch's rows are grouped by shard (row % S, in batch order within a
 * shard), each shard's are pulled from its applier or in a transaction
 * of its own (all shards' sent before any is read), and every shard is
 * pushed the gradient of its rows with its own (epoch, version), the dense
 * part's on shard 0's, even a shard none of whose rows the batch holds: a
 * position counts as applied once every shard applied it.
 */
#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sparse/prog.h"
#include "trainer/pool_sparse.h"

#define NEXT_WAIT_MS 100
#define PUSH_WAIT_MS 5000
#define BLOCK_MS     100 /* one blocking wait for the last gradient, then a look at stop */
#define CLOSED_MAX   16  /* progressive windows a batch reports at most */

typedef struct sworker {
    struct trainer_sparse *pool;
    int index;
    char id[128];
    pthread_t tid;
    int running;
    psstore_client_t *cl; /* pushes and pulls (a client per shard within, each with
                             the connection of its shard's node) */
    sparse_batch_t *b;
    float *params, *grad, *packed, *state, *p;
    float *dense, *gdense; /* the dense part pulled (bias, tower), its gradient */
    uint8_t *found;
    /* the batch's rows grouped by shard: shard k's are order[off[k] ..
     * off[k + 1]) (indices into the batch's rows), srows their rows */
    uint32_t *order, *srows;
    size_t off[PSSTORE_SHARDS_MAX + 1];
    float *sparams; /* pulled, in that order */
    uint8_t *sfound;
    uint32_t *miss_at; /* a shard's rows its applier does not hold: their index */
    uint32_t *miss_rows;
    float *miss_params;
    uint8_t *miss_found;
    size_t miss_off[PSSTORE_SHARDS_MAX + 1];
    /* the stream id of each shard's last gradient not known applied ("": none) */
    char flight[PSSTORE_SHARDS_MAX][64];
    const char *done_id; /* the batch's last stream entry (NULL: none went there) */
    uint64_t lost_seen;  /* the appliers' lost windows, summed, as last seen */
} sworker_t;

struct trainer_sparse {
    trainer_sparse_conf_t conf;
    char url[512], model[65];
    int S;
    sworker_t *w;
    atomic_int stop;
    atomic_ullong backpressure_waits; /* 1 ms naps at a full window (Redis behind) */
    atomic_ullong in_process;         /* shards' gradients decided in a worker's thread */
    int started;
    pthread_mutex_t lock; /* guards st and pv */
    trainer_sparse_stats_t st;
    sparse_prog_t *pv; /* progressive validation over every worker's records */
};

static void worker_free(sworker_t *wk)
{
    psstore_client_destroy(wk->cl);
    sparse_batch_destroy(wk->b);
    free(wk->params);
    free(wk->grad);
    free(wk->dense);
    free(wk->gdense);
    free(wk->packed);
    free(wk->state);
    free(wk->p);
    free(wk->found);
    free(wk->order);
    free(wk->srows);
    free(wk->sparams);
    free(wk->sfound);
    free(wk->miss_rows);
    free(wk->miss_at);
    free(wk->miss_params);
    free(wk->miss_found);
}

/* The batch's samples into wk->b; FR_ERR_PARSE when a row is no packed
 * sample (not what the consumer's decoder wrote). */
static fr_err_t unpack(sworker_t *wk, const ingest_batch_t *b)
{
    const trainer_sparse_conf_t *conf = &wk->pool->conf;
    sparse_batch_clear(wk->b);
    for (size_t i = 0; i < b->n; i++) {
        sparse_sample_t s;
        if (sparse_unpack(b->x + i * (size_t)b->features, conf->spec.fields, conf->spec.bits,
                          b->y[i], &s) != FR_OK ||
            (conf->spec.classes > 0 && /* a class the table has (the decoder checked it) */
             !(s.label >= 0 && s.label < (float)conf->spec.classes && s.label == (int)s.label)) ||
            sparse_batch_add(wk->b, &s) != FR_OK)
            return FR_ERR_PARSE;
    }
    return FR_OK;
}

/*
 * The in-flight bound (docs/design.md "Staleness and the controller"), as
 * dense workers keep it: before it pulls, a worker waits until its last
 * gradient was applied (committed), so its next one is computed on rows
 * that hold it, and the queue before the applier holds at most one
 * gradient per worker. Per-row optimizers take no account of staleness:
 * without the bound, a queue of 64 gradients made 2 workers 43 versions
 * stale and the progressive logloss 6.5 instead of 0.14. A wait ends
 * after PUSH_WAIT_MS whatever happened, or at a stop.
 */
static void flight_wait(sworker_t *wk)
{
    uint64_t t0 = fr_clock_mono_ns();
    for (int k = 0; k < wk->pool->S; k++) {
        if (wk->flight[k][0] == '\0')
            continue;
        psstore_applier_t *a = wk->pool->conf.appliers[k];
        psstore_client_t *cl = psstore_client_shard(wk->cl, k);
        while (!atomic_load(&wk->pool->stop) &&
               fr_clock_mono_ns() - t0 < (uint64_t)PUSH_WAIT_MS * 1000000ull) {
            int done = 0;
            fr_err_t err = a != NULL
                               ? psstore_applier_decided_wait(a, wk->flight[k], BLOCK_MS, &done)
                               : FR_ERR_STATE;
            if (err == FR_ERR_STATE) /* no applier here, or not the lease holder */
                err = psstore_applied_wait(cl, wk->flight[k], BLOCK_MS, &done);
            if (err != FR_OK || done)
                break;
        }
        wk->flight[k][0] = '\0';
    }
}

/* The connection of shard k's client: its pulls share it with its pushes. */
static psstore_conn_t *shard_conn(sworker_t *wk, int k)
{
    return psstore_client_conn(psstore_client_shard(wk->cl, k));
}

/*
 * The rows of the batch, the dense part (into wk->dense) and each shard's
 * (epoch, version), in
 * shard order (sparams, sfound), then in the batch's (params, found): in
 * freshet run from the shard's applier's table (current, committed or not)
 * and the rows it does not hold from the store (they are as the store has
 * them: the applier is the only writer and has not touched them);
 * elsewhere, or while the applier holds no lease, all from the store. The
 * store's reads of every shard are sent before any is read.
 */
static fr_err_t pull(sworker_t *wk, size_t nrows, uint64_t *epochs, int64_t *versions)
{
    size_t K = (size_t)sparse_outputs(&wk->pool->conf.spec);
    float *bias = wk->dense, *tower = wk->dense + K; /* shard 0's: the others' are 0 */
    const trainer_sparse_conf_t *conf = &wk->pool->conf;
    const char *model = wk->pool->model;
    int S = wk->pool->S;
    size_t rowlen = sparse_row_len(&conf->spec), queued[PSSTORE_SHARDS_MAX] = {0};
    int local[PSSTORE_SHARDS_MAX]; /* the shard's applier answered */
    int complete = 0;              /* ... and its table holds every stored row */
    fr_err_t err = FR_OK;
    float scratch[SPARSE_CLASSES_MAX]; /* a bias past shard 0 */
    wk->miss_off[0] = 0;
    for (int k = 0; k < S; k++) {
        size_t lo = wk->off[k], m = wk->off[k + 1] - lo, nm = 0, mo = wk->miss_off[k];
        psstore_applier_t *a = conf->appliers[k];
        local[k] = a != NULL && psstore_applier_rows(a, wk->srows + lo, m,
                                                     wk->sparams + lo * rowlen, wk->sfound + lo,
                                                     k == 0 ? bias : scratch, k == 0 ? tower : NULL,
                                                     &epochs[k], &versions[k], &complete) == FR_OK;
        if (local[k]) { /* with a complete table, a row it lacks is absent: no read */
            for (size_t i = 0; i < m && !complete; i++)
                if (!wk->sfound[lo + i]) {
                    wk->miss_rows[mo + nm] = wk->srows[lo + i];
                    wk->miss_at[mo + nm++] = (uint32_t)(lo + i);
                }
        } else { /* all of the shard's rows from the store */
            for (size_t i = 0; i < m; i++) {
                wk->miss_rows[mo + nm] = wk->srows[lo + i];
                wk->miss_at[mo + nm++] = (uint32_t)(lo + i);
            }
        }
        wk->miss_off[k + 1] = mo + nm;
        FR_ASSERT(mo + nm <= wk->off[k + 1]); /* a shard misses at most its own rows */
        if ((!local[k] || nm > 0) && err == FR_OK &&
            (err = psstore_rows_pull_send(shard_conn(wk, k), model, k, S, wk->miss_rows + mo, nm,
                                          &queued[k])) != FR_OK)
            fr_log(FR_LOG_WARN, "worker %s: pull of shard %d: %s", wk->id, k,
                   psstore_conn_error(shard_conn(wk, k)));
    }
    for (int k = 0; k < S; k++) {
        size_t mo = wk->miss_off[k], nm = wk->miss_off[k + 1] - mo;
        if (queued[k] == 0)
            continue;
        uint64_t e;
        int64_t v;
        /* the store's biases and tower only where the applier's were not
         * taken (the store's may be older) */
        int store = k == 0 && !local[k];
        fr_err_t e2 =
            psstore_rows_pull_recv(shard_conn(wk, k), model, &conf->spec, &conf->optim, nm,
                                   queued[k], wk->miss_params + mo * rowlen, wk->miss_found + mo,
                                   store ? bias : scratch, store ? tower : NULL, &e, &v);
        if (e2 != FR_OK) {
            if (err == FR_OK)
                fr_log(FR_LOG_WARN, "worker %s: pull of shard %d: %s", wk->id, k,
                       psstore_conn_error(shard_conn(wk, k)));
            err = e2;
            continue;
        }
        if (!local[k]) { /* the store's state of the shard */
            epochs[k] = e;
            versions[k] = v;
        }
        for (size_t j = 0; j < nm; j++) {
            size_t at = wk->miss_at[mo + j];
            assert(at >= wk->off[k] && at < wk->off[k + 1]); /* a row of this shard */
            wk->sfound[at] = wk->miss_found[mo + j];
            if (wk->miss_found[mo + j])
                memcpy(wk->sparams + at * rowlen, wk->miss_params + (mo + j) * rowlen,
                       rowlen * sizeof(float));
        }
    }
    if (err != FR_OK)
        return err;
    for (size_t j = 0; j < nrows; j++) { /* back into the batch's order */
        size_t i = wk->order[j];
        assert(i < nrows); /* psstore_sparse_group's permutation */
        wk->found[i] = wk->sfound[j];
        if (wk->sfound[j])
            memcpy(wk->params + i * rowlen, wk->sparams + j * rowlen, rowlen * sizeof(float));
    }
    return FR_OK;
}

/*
 * Each shard's part of a batch's gradient: decided in this thread by the
 * shard's applier when it runs in this process and takes it
 * (psstore_applier_sparse_step; docs/design.md "The store written
 * behind"), else through the shard's grads stream. A full window (Redis
 * behind) is waited out here: the consumer's queue fills and pauses the
 * partitions. wk->done_id: the last stream entry, NULL when none went
 * there. A failure leaves the shards that took theirs holding it: they
 * drop it as a duplicate when the gap rule reads the batch again.
 */
static fr_err_t push(sworker_t *wk, const psstore_grad_t *parts, int flight)
{
    trainer_sparse_t *p = wk->pool;
    int S = p->S, streamed[PSSTORE_SHARDS_MAX], nstreamed = 0, in_process = 1;
    wk->done_id = NULL;
    /* every shard in process, or every shard through its stream: the gap
     * rule looks the batch up in the last shard's stream */
    for (int k = 0; k < S && in_process; k++)
        in_process =
            p->conf.appliers[k] != NULL && psstore_applier_sparse_accepting(p->conf.appliers[k]);
    for (int k = 0; k < S; k++) {
        psstore_applier_t *a = p->conf.appliers[k];
        fr_err_t err = in_process ? psstore_applier_sparse_step(a, &parts[k]) : FR_ERR_STATE;
        for (uint64_t t0 = fr_clock_mono_ns(); err == FR_ERR_AGAIN;) {
            if (atomic_load(&p->stop) ||
                fr_clock_mono_ns() - t0 > (uint64_t)PUSH_WAIT_MS * 1000000ull) {
                fr_log(FR_LOG_WARN, "worker %s: shard %d's window stayed full for %d ms", wk->id, k,
                       PUSH_WAIT_MS);
                return FR_ERR_TIMEOUT;
            }
            struct timespec nap = {0, 1000000L};
            nanosleep(&nap, NULL);
            atomic_fetch_add(&p->backpressure_waits, 1);
            err = psstore_applier_sparse_step(a, &parts[k]);
        }
        if (err != FR_OK && err != FR_ERR_STATE) {
            fr_log(FR_LOG_WARN, "worker %s: shard %d's step: %s", wk->id, k, fr_strerror(err));
            return err;
        }
        streamed[k] = err == FR_ERR_STATE;
        nstreamed += streamed[k];
        if (!streamed[k])
            atomic_fetch_add(&p->in_process, 1);
    }
    fr_err_t err = FR_OK;
    if (nstreamed == S) { /* every shard's push in flight at once */
        err = psstore_push_each(wk->cl, parts, S, PUSH_WAIT_MS);
    } else {
        for (int k = 0; k < S && err == FR_OK; k++)
            if (streamed[k])
                err = psstore_push(psstore_client_shard(wk->cl, k), &parts[k], PUSH_WAIT_MS);
    }
    if (err != FR_OK) {
        fr_log(FR_LOG_WARN, "worker %s: push: %s", wk->id, psstore_client_error(wk->cl));
        return err;
    }
    for (int k = 0; k < S; k++) {
        if (!streamed[k])
            continue;
        const char *id = psstore_client_last_id(psstore_client_shard(wk->cl, k));
        if (p->conf.in_flight > 0 && flight)
            snprintf(wk->flight[k], sizeof(wk->flight[k]), "%s", id);
        wk->done_id = id;
    }
    return FR_OK;
}

/* Pulls, computes and pushes one batch. FR_OK, or the error after logging
 * it (the batch is then abandoned and read again by the gap rule). */
static fr_err_t train_batch(sworker_t *wk, const ingest_batch_t *b, double *loss)
{
    const trainer_sparse_conf_t *conf = &wk->pool->conf;
    int S = wk->pool->S;
    psstore_grad_t msg = {.generation = b->generation,
                          .worker = wk->id,
                          .n = (int64_t)b->n,
                          .reason = b->n == 0 ? b->reason : NULL,
                          .ranges = b->ranges,
                          .nranges = b->nranges};
    *loss = 0;
    fr_err_t err = b->n > 0 ? unpack(wk, b) : FR_OK;
    if (err != FR_OK) {
        fr_log(FR_LOG_ERROR, "worker %s: a batch row is no packed sparse sample", wk->id);
        return err;
    }
    size_t nrows = b->n > 0 ? wk->b->nrows : 0, rowlen = sparse_row_len(&conf->spec);
    /* the buffers hold max_batch * fields rows (+ 1): unpack kept each
     * sample within fields and the batch within max_batch */
    FR_ASSERT(nrows <= (size_t)conf->max_batch * (size_t)conf->spec.fields);
    psstore_sparse_group(wk->b->rows, nrows, wk->pool->S, wk->order, wk->srows, wk->off);
    FR_ASSERT(wk->off[0] == 0 && wk->off[S] == nrows); /* the shards cover the rows once */
    uint64_t t0 = fr_clock_mono_ns();
    flight_wait(wk);
    uint64_t t1 = fr_clock_mono_ns();
    uint64_t epochs[PSSTORE_SHARDS_MAX];
    int64_t versions[PSSTORE_SHARDS_MAX], version = 0;
    size_t ndense = sparse_dense_len(&conf->spec);
    if ((err = pull(wk, nrows, epochs, versions)) != FR_OK)
        return err;
    for (int k = 0; k < S; k++)
        version += versions[k]; /* the model's version: the sum of its shards' */
    uint64_t t2 = fr_clock_mono_ns();
    int diverged = 0;
    if (b->n > 0) {
        for (size_t i = 0; i < nrows; i++)
            if (!wk->found[i])
                sparse_row_init(&conf->spec, &conf->optim, wk->b->rows[i], wk->params + i * rowlen,
                                wk->state);
        *loss =
            sparse_fm_grad(&conf->spec, wk->b, wk->params, wk->dense, wk->grad, wk->gdense, wk->p);
        /* each shard's rows, their gradients in shard order (sparams is
         * free again), and the dense part's on shard 0's */
        for (size_t j = 0; j < nrows; j++)
            memcpy(wk->sparams + j * rowlen, wk->grad + (size_t)wk->order[j] * rowlen,
                   rowlen * sizeof(float));
        msg.loss_sum = *loss;
        /* decided once on the whole gradient, as dense shards decide: a
         * score that overflowed can leave the loss finite and some rows'
         * gradients not, and every shard must then drop its part */
        diverged = !isfinite(*loss);
        for (size_t i = 0; i < nrows * rowlen && !diverged; i++)
            diverged = !isfinite(wk->grad[i]);
        for (size_t i = 0; i < ndense && !diverged; i++)
            diverged = !isfinite(wk->gdense[i]);
        if (diverged) { /* every shard drops it as non-finite: positions marked */
            msg.loss_sum = 0;
            *loss = 0;
        }
        if (b->min_ts_ms > 0 && b->max_ts_ms >= b->min_ts_ms) {
            msg.ts_min_ms = b->min_ts_ms;
            msg.ts_max_ms = b->max_ts_ms;
        }
    }
    uint64_t t3 = fr_clock_mono_ns();
    float *out = wk->packed;
    static const float zero = 0; /* the dense part of a shard past 0: a float held at 0 */
    psstore_grad_t parts[PSSTORE_SHARDS_MAX];
    for (int k = 0; k < S; k++) {
        size_t lo = wk->off[k], m = wk->off[k + 1] - lo;
        parts[k] = msg;
        parts[k].epoch = epochs[k];
        parts[k].version = versions[k];
        if (b->n > 0) {
            size_t nd = k == 0 ? ndense : 1;
            psstore_sparse_pack(wk->srows + lo, m, wk->sparams + lo * rowlen, rowlen,
                                k == 0 ? wk->gdense : &zero, nd, out);
            parts[k].g = out;
            parts[k].len = psstore_sparse_grad_len(m, rowlen, nd);
            if (diverged)
                out[parts[k].len - 1] = NAN;
            out += parts[k].len;
        }
    }
    /* packed holds every row's gradient, shard 0's dense part, a float a shard past it */
    FR_ASSERT((size_t)(out - wk->packed) <=
              psstore_sparse_grad_len((size_t)conf->max_batch * (size_t)conf->spec.fields, rowlen,
                                      ndense + (size_t)S));
    if ((err = push(wk, parts, b->n > 0)) != FR_OK)
        return err;
    pthread_mutex_lock(&wk->pool->lock);
    sparse_prog_window_t w, closed[CLOSED_MAX];
    size_t nclosed = 0;
    for (size_t i = 0; msg.loss_sum > 0 && i < b->n; i++) { /* a diverged batch is not scored */
        /* a softmax's p is its own class's: scored as a positive */
        float y = conf->spec.classes > 0 ? 1.0f : wk->b->samples[i].label;
        if (sparse_prog_add_planted(wk->pool->pv, wk->p[i], y, wk->b->samples[i].planted, &w)) {
            if (isnan(w.floor))
                fr_log(FR_LOG_INFO,
                       "sparse: window %lld: %zu records, progressive logloss %.5f, auc %.4f, "
                       "ctr %.4f",
                       (long long)w.index, w.n, w.logloss, w.auc, w.ctr);
            else
                fr_log(FR_LOG_INFO,
                       "sparse: window %lld: %zu records, progressive logloss %.5f, auc %.4f, "
                       "ctr %.4f, Bayes floor %.5f",
                       (long long)w.index, w.n, w.logloss, w.auc, w.ctr, w.floor);
            if (nclosed == CLOSED_MAX) { /* windows far smaller than a batch: the last ones */
                memmove(closed, closed + 1, (CLOSED_MAX - 1) * sizeof(closed[0]));
                nclosed--;
            }
            closed[nclosed++] = w;
        }
    }
    wk->pool->st.wait_ns += t1 - t0;
    wk->pool->st.pull_ns += t2 - t1;
    wk->pool->st.compute_ns += t3 - t2;
    wk->pool->st.push_ns += fr_clock_mono_ns() - t3;
    wk->pool->st.rows += nrows;
    if (version > wk->pool->st.version)
        wk->pool->st.version = version;
    pthread_mutex_unlock(&wk->pool->lock);
    /* the windows for the dashboard (the evals stream, as holdouts of dense
     * models); outside the lock, and a failure costs only the point */
    for (size_t k = 0; k < nclosed; k++)
        if (psstore_eval_report_progressive(psstore_client_conn(wk->cl), wk->pool->model, version,
                                            closed[k].logloss, closed[k].auc, closed[k].floor,
                                            closed[k].n) != FR_OK)
            fr_log(FR_LOG_WARN, "worker %s: progressive window not reported: %s", wk->id,
                   psstore_conn_error(psstore_client_conn(wk->cl)));
    return FR_OK;
}

static int pool_stopping(void *arg)
{
    return atomic_load(&((trainer_sparse_t *)arg)->stop);
}

static void *worker_main(void *arg)
{
    sworker_t *wk = arg;
    trainer_sparse_t *p = wk->pool;
    char name[16];
    snprintf(name, sizeof(name), "fr-sparse%d", wk->index);
    fr_thread_name(name);
    psstore_client_set_cancel(wk->cl, pool_stopping, p);
    while (!atomic_load(&p->stop)) {
        /* an applier here dropped gradients decided in process before a
         * commit wrote them (a lost lease, a failed commit): their records
         * are read again within a second, not after gap_timeout */
        uint64_t lost = 0;
        for (int k = 0; k < p->S; k++)
            lost += psstore_applier_sparse_lost(p->conf.appliers[k]);
        if (lost != wk->lost_seen) {
            wk->lost_seen = lost;
            ingest_consumer_lost(p->conf.source);
        }
        ingest_batch_t *b = ingest_consumer_next(p->conf.source, NEXT_WAIT_MS);
        if (b == NULL)
            continue;
        double loss = 0;
        fr_err_t err = train_batch(wk, b, &loss);
        /* the id the consumer's gap rule looks up: the last entry streamed,
         * none when every shard decided it in process */
        ingest_consumer_done(p->conf.source, b, err == FR_OK ? wk->done_id : NULL);
        pthread_mutex_lock(&p->lock);
        if (err == FR_OK) {
            p->st.samples += b->n;
            p->st.batches++;
            p->st.loss_sum += loss;
        } else {
            p->st.failed++;
            ingest_consumer_lost(p->conf.source); /* read again soon, not in gap_timeout */
        }
        pthread_mutex_unlock(&p->lock);
        ingest_batch_destroy(b);
    }
    return NULL;
}

trainer_sparse_t *trainer_sparse_new(const trainer_sparse_conf_t *conf, char *errstr, size_t size)
{
    if (conf->workers < 1 || conf->workers > 64) {
        fr_errorf(FR_ERR_INVAL, errstr, size,
                  "[trainer] workers: a sparse model runs 1 to 64 workers, not %d", conf->workers);
        return NULL;
    }
    if (conf->max_batch < 1 || conf->source == NULL || conf->spec.fields < 1 ||
        conf->spec.fields > SPARSE_FIELDS_MAX) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "sparse workers: bad configuration");
        return NULL;
    }
    trainer_sparse_t *p = calloc(1, sizeof(*p));
    if (p == NULL || (p->w = calloc((size_t)conf->workers, sizeof(*p->w))) == NULL) {
        free(p);
        fr_errorf(FR_ERR_NOMEM, errstr, size, "sparse workers: out of memory");
        return NULL;
    }
    p->conf = *conf;
    p->S = conf->shards > 0 ? conf->shards : 1;
    if (p->S > PSSTORE_SHARDS_MAX) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "sparse workers: %d shards (at most %d)", p->S,
                  PSSTORE_SHARDS_MAX);
        free(p->w);
        free(p);
        return NULL;
    }
    snprintf(p->url, sizeof(p->url), "%s", conf->redis_url);
    snprintf(p->model, sizeof(p->model), "%s", conf->model);
    p->conf.redis_url = p->url;
    p->conf.model = p->model;
    pthread_mutex_init(&p->lock, NULL);
    atomic_init(&p->stop, 0);
    atomic_init(&p->backpressure_waits, 0);
    atomic_init(&p->in_process, 0);
    if ((p->pv = sparse_prog_new(conf->window > 0 ? conf->window : 100000)) == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "sparse workers: out of memory");
        goto err;
    }
    if (conf->spec.classes > 0)
        sparse_prog_multiclass(p->pv);
    char host[64] = "host";
    gethostname(host, sizeof(host) - 1);
    size_t rows = (size_t)conf->max_batch * (size_t)conf->spec.fields;
    size_t rowlen = sparse_row_len(&conf->spec);
    for (int i = 0; i < conf->workers; i++) {
        sworker_t *wk = &p->w[i];
        wk->pool = p;
        wk->index = i;
        snprintf(wk->id, sizeof(wk->id), "%.60s/%d/%d", host, (int)getpid(), i);
        wk->b = sparse_batch_new((size_t)conf->max_batch);
        wk->params = malloc(rows * rowlen * sizeof(float));
        wk->grad = malloc(rows * rowlen * sizeof(float));
        /* each shard's gradient adds its dense part: shard 0's, a float each past it */
        size_t ndense = sparse_dense_len(&conf->spec);
        wk->packed =
            malloc(psstore_sparse_grad_len(rows, rowlen, ndense + (size_t)p->S) * sizeof(float));
        wk->dense = calloc(ndense, sizeof(float));
        wk->gdense = malloc(ndense * sizeof(float));
        wk->state = malloc((sparse_state_len(&conf->spec, &conf->optim) + 1) * sizeof(float));
        wk->found = malloc(rows + 1);
        wk->p = malloc((size_t)conf->max_batch * sizeof(float));
        wk->order = malloc((rows + 1) * sizeof(uint32_t));
        wk->srows = malloc((rows + 1) * sizeof(uint32_t));
        wk->sparams = malloc((rows + 1) * rowlen * sizeof(float));
        wk->sfound = malloc(rows + 1);
        wk->miss_rows = malloc((rows + 1) * sizeof(uint32_t));
        wk->miss_at = malloc((rows + 1) * sizeof(uint32_t));
        wk->miss_params = malloc((rows + 1) * rowlen * sizeof(float));
        wk->miss_found = malloc(rows + 1);
        if (wk->b == NULL || wk->params == NULL || wk->grad == NULL || wk->packed == NULL ||
            wk->state == NULL || wk->p == NULL || wk->dense == NULL || wk->gdense == NULL ||
            wk->found == NULL || wk->order == NULL || wk->srows == NULL || wk->sparams == NULL ||
            wk->sfound == NULL || wk->miss_rows == NULL || wk->miss_at == NULL ||
            wk->miss_params == NULL || wk->miss_found == NULL) {
            fr_errorf(FR_ERR_NOMEM, errstr, size, "sparse workers: out of memory");
            goto err;
        }
        /* the model's w: the dense part on shard 0, a float a shard past it */
        wk->cl = psstore_client_new(p->url, p->model, ndense + (size_t)p->S - 1, conf->max_pending,
                                    errstr, size);
        if (wk->cl == NULL)
            goto err;
        if (psstore_client_shard(wk->cl, p->S - 1) == NULL ||
            psstore_client_shard(wk->cl, p->S) != NULL) { /* created again meanwhile */
            fr_errorf(FR_ERR_STATE, errstr, size,
                      "sparse workers: model '%s' no longer has %d shard(s)", p->model, p->S);
            goto err;
        }
        psstore_client_any_length(wk->cl);
    }
    return p;
err:
    trainer_sparse_destroy(p);
    return NULL;
}

fr_err_t trainer_sparse_start(trainer_sparse_t *p)
{
    if (p->started)
        return FR_ERR_STATE;
    p->started = 1;
    for (int i = 0; i < p->conf.workers; i++) {
        if (pthread_create(&p->w[i].tid, NULL, worker_main, &p->w[i]) != 0) {
            trainer_sparse_stop(p);
            return FR_ERR_NOMEM;
        }
        p->w[i].running = 1;
    }
    return FR_OK;
}

void trainer_sparse_stop(trainer_sparse_t *p)
{
    if (p == NULL)
        return;
    atomic_store(&p->stop, 1);
    for (int i = 0; i < p->conf.workers; i++) {
        if (p->w[i].running) {
            pthread_join(p->w[i].tid, NULL);
            p->w[i].running = 0;
        }
    }
}

void trainer_sparse_stats(trainer_sparse_t *p, trainer_sparse_stats_t *st)
{
    pthread_mutex_lock(&p->lock);
    *st = p->st;
    pthread_mutex_unlock(&p->lock);
    st->in_process = atomic_load(&p->in_process);
    st->backpressure_waits = atomic_load(&p->backpressure_waits);
}

void trainer_sparse_destroy(trainer_sparse_t *p)
{
    if (p == NULL)
        return;
    trainer_sparse_stop(p);
    for (int i = 0; i < p->conf.workers; i++)
        worker_free(&p->w[i]);
    free(p->w);
    sparse_prog_destroy(p->pv);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
