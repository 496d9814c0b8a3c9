/*
 * sparse_worker.c - the workers of a sparse model (sparse_pool.h;
 * docs/design.md "Sparse models").
 *
 * Per batch: unpack its samples (sparse_unpack), list their distinct rows
 * (sparse_batch_add), pull those rows, the bias and the (epoch, version)
 * they are at in one transaction (psstore_rows_pull; a row the store does
 * not hold starts at sparse_row_init's value, which every process
 * computes alike), score every sample before learning from it (the
 * progressive logloss), and push the rows' summed gradients packed with
 * their rows (psstore_sparse_pack). An n = 0 batch (positions only) is
 * pushed with the store's epoch, so that its positions are marked.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainer/sparse_pool.h"

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
    psstore_client_t *cl; /* pushes          */
    psstore_conn_t *c;    /* pulls           */
    sparse_batch_t *b;
    float *params, *grad, *packed, *state, *p;
    uint8_t *found;
    uint32_t *miss_rows, *miss_at; /* rows the applier does not hold, and their index */
    float *miss_params;
    uint8_t *miss_found;
    char flight[64]; /* the stream id of its last gradient not known applied ("": none) */
} sworker_t;

struct trainer_sparse {
    trainer_sparse_conf_t conf;
    char url[512], model[65];
    sworker_t *w;
    atomic_int stop;
    int started;
    pthread_mutex_t lock; /* guards st and pv */
    trainer_sparse_stats_t st;
    sparse_prog_t *pv; /* progressive validation over every worker's records */
};

static void worker_free(sworker_t *wk)
{
    psstore_client_destroy(wk->cl);
    psstore_conn_destroy(wk->c);
    sparse_batch_destroy(wk->b);
    free(wk->params);
    free(wk->grad);
    free(wk->packed);
    free(wk->state);
    free(wk->p);
    free(wk->found);
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
    if (wk->flight[0] == '\0')
        return;
    uint64_t t0 = fr_clock_mono_ns();
    psstore_applier_t *a = wk->pool->conf.applier;
    while (!atomic_load(&wk->pool->stop) &&
           fr_clock_mono_ns() - t0 < (uint64_t)PUSH_WAIT_MS * 1000000ull) {
        int done = 0;
        fr_err_t err =
            a != NULL ? psstore_applier_decided_wait(a, wk->flight, BLOCK_MS, &done) : FR_ERR_STATE;
        if (err == FR_ERR_STATE) /* no applier here, or not the lease holder */
            err = psstore_applied_wait(wk->cl, wk->flight, BLOCK_MS, &done);
        if (err != FR_OK || done)
            break;
    }
    wk->flight[0] = '\0';
}

/*
 * The rows of the batch, the bias and (epoch, version): in freshet run from
 * the applier's table (current, committed or not) and the rows it does not
 * hold from the store (they are as the store has them: the applier is the
 * only writer and has not touched them); elsewhere, or while the applier
 * holds no lease, all from the store.
 */
static fr_err_t pull(sworker_t *wk, size_t nrows, float *bias, uint64_t *epoch, int64_t *version)
{
    const trainer_sparse_conf_t *conf = &wk->pool->conf;
    const uint32_t *rows = wk->b->rows;
    if (conf->applier == NULL || psstore_applier_rows(conf->applier, rows, nrows, wk->params,
                                                      wk->found, bias, epoch, version) != FR_OK)
        return psstore_rows_pull(wk->c, wk->pool->model, &conf->spec, &conf->optim, rows, nrows,
                                 wk->params, wk->found, bias, epoch, version);
    size_t k = 0, rowlen = sparse_row_len(&conf->spec);
    for (size_t i = 0; i < nrows; i++)
        if (!wk->found[i]) {
            wk->miss_rows[k] = rows[i];
            wk->miss_at[k++] = (uint32_t)i;
        }
    if (k == 0)
        return FR_OK;
    float b2;
    uint64_t e2;
    int64_t v2;
    fr_err_t err =
        psstore_rows_pull(wk->c, wk->pool->model, &conf->spec, &conf->optim, wk->miss_rows, k,
                          wk->miss_params, wk->miss_found, &b2, &e2, &v2);
    for (size_t j = 0; err == FR_OK && j < k; j++) {
        wk->found[wk->miss_at[j]] = wk->miss_found[j];
        if (wk->miss_found[j])
            memcpy(wk->params + (size_t)wk->miss_at[j] * rowlen, wk->miss_params + j * rowlen,
                   rowlen * sizeof(float));
    }
    return err;
}

/* Pulls, computes and pushes one batch. FR_OK, or the error after logging
 * it (the batch is then abandoned and read again by the gap rule). */
static fr_err_t train_batch(sworker_t *wk, const ingest_batch_t *b, double *loss, const char **id)
{
    const trainer_sparse_conf_t *conf = &wk->pool->conf;
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
    uint64_t t0 = fr_clock_mono_ns();
    flight_wait(wk);
    uint64_t t1 = fr_clock_mono_ns();
    float bias = 0;
    uint64_t epoch = 0;
    int64_t version = 0;
    err = pull(wk, nrows, &bias, &epoch, &version);
    if (err != FR_OK) {
        fr_log(FR_LOG_WARN, "worker %s: pull: %s", wk->id, psstore_conn_error(wk->c));
        return err;
    }
    uint64_t t2 = fr_clock_mono_ns();
    if (b->n > 0) {
        for (size_t i = 0; i < nrows; i++)
            if (!wk->found[i])
                sparse_row_init(&conf->spec, &conf->optim, wk->b->rows[i], wk->params + i * rowlen,
                                wk->state);
        float gbias = 0;
        *loss = sparse_fm_grad(&conf->spec, wk->b, wk->params, bias, wk->grad, &gbias, wk->p);
        psstore_sparse_pack(wk->b->rows, nrows, wk->grad, conf->spec.dim, gbias, wk->packed);
        msg.g = wk->packed;
        msg.len = psstore_sparse_grad_len(nrows, conf->spec.dim);
        msg.loss_sum = *loss;
        if (!isfinite(*loss)) { /* the applier drops it as non-finite: positions marked */
            wk->packed[msg.len - 1] = NAN;
            msg.loss_sum = 0;
            *loss = 0;
        }
        if (b->min_ts_ms > 0 && b->max_ts_ms >= b->min_ts_ms) {
            msg.ts_min_ms = b->min_ts_ms;
            msg.ts_max_ms = b->max_ts_ms;
        }
    }
    msg.epoch = epoch;
    msg.version = version;
    uint64_t t3 = fr_clock_mono_ns();
    err = psstore_push(wk->cl, &msg, PUSH_WAIT_MS);
    if (err != FR_OK) {
        fr_log(FR_LOG_WARN, "worker %s: push: %s", wk->id, psstore_client_error(wk->cl));
        return err;
    }
    *id = psstore_client_last_id(wk->cl);
    if (conf->in_flight > 0 && b->n > 0)
        snprintf(wk->flight, sizeof(wk->flight), "%s", *id);
    pthread_mutex_lock(&wk->pool->lock);
    sparse_prog_window_t w, closed[CLOSED_MAX];
    size_t nclosed = 0;
    for (size_t i = 0; msg.loss_sum > 0 && i < b->n; i++) { /* a diverged batch is not scored */
        if (sparse_prog_add_planted(wk->pool->pv, wk->p[i], wk->b->samples[i].label,
                                    wk->b->samples[i].planted, &w)) {
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
        if (psstore_eval_report_progressive(wk->c, wk->pool->model, version, closed[k].logloss,
                                            closed[k].auc, closed[k].floor, closed[k].n) != FR_OK)
            fr_log(FR_LOG_WARN, "worker %s: progressive window not reported: %s", wk->id,
                   psstore_conn_error(wk->c));
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
        ingest_batch_t *b = ingest_consumer_next(p->conf.source, NEXT_WAIT_MS);
        if (b == NULL)
            continue;
        double loss = 0;
        const char *id = NULL;
        fr_err_t err = train_batch(wk, b, &loss, &id);
        ingest_consumer_done(p->conf.source, b, err == FR_OK ? id : NULL);
        pthread_mutex_lock(&p->lock);
        if (err == FR_OK) {
            p->st.samples += b->n;
            p->st.batches++;
            p->st.loss_sum += loss;
        } else {
            p->st.failed++;
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
    snprintf(p->url, sizeof(p->url), "%s", conf->redis_url);
    snprintf(p->model, sizeof(p->model), "%s", conf->model);
    p->conf.redis_url = p->url;
    p->conf.model = p->model;
    pthread_mutex_init(&p->lock, NULL);
    atomic_init(&p->stop, 0);
    if ((p->pv = sparse_prog_new(conf->window > 0 ? conf->window : 100000)) == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "sparse workers: out of memory");
        goto err;
    }
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
        wk->packed = malloc(psstore_sparse_grad_len(rows, conf->spec.dim) * sizeof(float));
        wk->state = malloc((sparse_state_len(&conf->spec, &conf->optim) + 1) * sizeof(float));
        wk->found = malloc(rows + 1);
        wk->p = malloc((size_t)conf->max_batch * sizeof(float));
        wk->miss_rows = malloc((rows + 1) * sizeof(uint32_t));
        wk->miss_at = malloc((rows + 1) * sizeof(uint32_t));
        wk->miss_params = malloc((rows + 1) * rowlen * sizeof(float));
        wk->miss_found = malloc(rows + 1);
        if (wk->b == NULL || wk->params == NULL || wk->grad == NULL || wk->packed == NULL ||
            wk->state == NULL || wk->p == NULL || wk->found == NULL || wk->miss_rows == NULL ||
            wk->miss_at == NULL || wk->miss_params == NULL || wk->miss_found == NULL) {
            fr_errorf(FR_ERR_NOMEM, errstr, size, "sparse workers: out of memory");
            goto err;
        }
        wk->c = psstore_conn_new(p->url, 5000, errstr, size);
        if (wk->c == NULL)
            goto err;
        wk->cl = psstore_client_new(p->url, p->model, 1, conf->max_pending, errstr, size);
        if (wk->cl == NULL)
            goto err;
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
