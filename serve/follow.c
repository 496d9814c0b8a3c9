/*
 * follow.c - the follower thread: it keeps each wanted model's latest
 * weights, retained snapshots, metadata and stats encoded in memory, so
 * that the loop answers every client without touching Redis.
 *
 * It blocks on the versions streams of the followed models (XREAD BLOCK),
 * reads new weights at most once per (epoch, version) and at most every
 * refresh_ms, and rebuilds the stats of a model once a second while a
 * dashboard asks for them. Nothing here writes the store. What it keeps
 * is read and encoded by the weights cache (cache.c) and the stats
 * (stats.c); this file is the thread's loop and its connection.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/serve_int.h"

#define FOLLOW_BLOCK_MS   100  /* longest XREAD BLOCK: new requests, stop  */
#define FOLLOW_TIMEOUT_MS 2000 /* Redis connect and command timeout         */
#define MODELS_EVERY_MS   2000 /* re-reading the list of models             */
#define CHECK_EVERY_MS    1000 /* reading info even without a stream entry  */
#define STATS_EVERY_MS    1000 /* rebuilding wanted stats                   */

static uint64_t ms_since(uint64_t ns)
{
    return (fr_clock_mono_ns() - ns) / 1000000u;
}

sv_model_t *sv_model_get(struct serve *s, const char *name, int create)
{
    for (size_t i = 0; i < s->nmodels; i++)
        if (strcmp(s->models[i]->name, name) == 0)
            return s->models[i];
    if (!create || s->nmodels >= (size_t)s->conf.max_models ||
        psstore_model_name_check(name, NULL, 0) != FR_OK)
        return NULL;
    sv_model_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    snprintf(m->name, sizeof(m->name), "%s", name);
    snprintf(m->last_id, sizeof(m->last_id), "0-0");
    m->pending = 1;
    s->models[s->nmodels++] = m;
    return m;
}

/* ---- the thread ----------------------------------------------------------- */

static void set_store(struct serve *s, int up, const char *why)
{
    pthread_mutex_lock(&s->lock);
    int changed = s->store_up != up;
    s->store_up = up;
    snprintf(s->store_error, sizeof(s->store_error), "%s", up ? "" : why);
    pthread_mutex_unlock(&s->lock);
    fr_series_set(s->m_store_up, up);
    if (changed) {
        if (up)
            fr_log(FR_LOG_INFO, "serve: store reachable");
        else
            fr_log(FR_LOG_WARN, "serve: store unreachable: %s", why);
        sv_notify(s);
    }
}

/* Sleeps up to ms, cut short by stop. */
static void nap(struct serve *s, int ms)
{
    struct timespec ts;
    fr_clock_deadline(&ts, ms);
    pthread_mutex_lock(&s->lock);
    if (!atomic_load(&s->stop))
        pthread_cond_timedwait(&s->wake, &s->lock, &ts);
    pthread_mutex_unlock(&s->lock);
}

static fr_err_t read_models(struct serve *s, psstore_conn_t *c)
{
    char **names;
    size_t n;
    fr_err_t err = psstore_model_list(c, &names, &n);
    if (err != FR_OK)
        return err;
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->nnames; i++)
        free(s->names[i]);
    free(s->names);
    s->names = names;
    s->nnames = n;
    s->models_ms = fr_clock_unix_ms();
    /* the default model is always followed; others once asked for */
    if (s->model[0] != '\0')
        sv_model_get(s, s->model, 1);
    pthread_mutex_unlock(&s->lock);
    return FR_OK;
}

/* The follower thread's own state: its connection and scratch. */
typedef struct follower {
    psstore_conn_t *c;
    float *w;
    size_t wcap;
    sv_stats_scratch_t scratch;
    uint64_t models_ns, check_ns;
    const char **names;                 /* [max_models]: the streams to block on */
    char (*ids)[PSSTORE_STREAM_ID_MAX]; /* [max_models]: their last ids */
    int *moved;                         /* [max_models]: which of them moved */
    sv_model_t **ms;                    /* [max_models]: the models of this turn */
} follower_t;

/*
 * One model's turn: its info and weights when due (all: the once-a-second
 * look at every model), its metadata when it changed and its stats while
 * a dashboard asks. Lowers *next_ms to when its pending weights are due.
 * Returns FR_ERR_REDIS-class errors or FR_ERR_NOMEM.
 */
static fr_err_t follow_model(struct serve *s, follower_t *f, sv_model_t *m, int all, int *changed,
                             int *next_ms)
{
    fr_err_t err = FR_OK;
    pthread_mutex_lock(&s->lock);
    int64_t now = fr_clock_unix_ms();
    int wanted = now - m->wanted_ms < SV_WANTED_MS;
    m->watched = wanted || now - m->stats_wanted_ms < SV_STATS_WANTED_MS;
    /* a client now waits for weights not kept current so far */
    int behind = m->present && wanted && m->cur != NULL &&
                 (m->cur->epoch != m->info.epoch || m->cur->version != m->info.version);
    pthread_mutex_unlock(&s->lock);
    /* a model no client asks for is looked at once a second only:
     * freshet run without HTTP clients costs the store next to
     * nothing */
    if (all || (m->pending && m->watched) || behind)
        err = sv_cache_refresh(s, f->c, m, &f->w, &f->wcap, changed);
    if (err == FR_OK && m->pending) {
        int64_t left = s->conf.refresh_ms - (int64_t)ms_since(m->loaded_ns);
        if (left < *next_ms)
            *next_ms = left < 1 ? 1 : (int)left;
    }
    pthread_mutex_lock(&s->lock);
    int stats_wanted = m->present && fr_clock_unix_ms() - m->stats_wanted_ms < SV_STATS_WANTED_MS;
    if (m->present && (m->meta == NULL || m->meta_seq != m->seq)) {
        sv_cache_meta(m);
        m->meta_seq = m->seq;
    }
    pthread_mutex_unlock(&s->lock);
    if (err == FR_OK && stats_wanted &&
        (m->stats_ns == 0 || ms_since(m->stats_ns) >= STATS_EVERY_MS)) {
        err = sv_stats_build(s, f->c, m, &f->scratch);
        m->stats_ns = fr_clock_mono_ns();
        *changed = 1;
    }
    return err;
}

/*
 * Blocks up to next_ms on the versions streams of the watched models among
 * f->ms[n] (napping when there is none) and marks those that moved
 * pending. Returns FR_ERR_REDIS-class errors.
 */
static fr_err_t follow_wait(struct serve *s, follower_t *f, size_t n, int next_ms)
{
    fr_err_t err;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        sv_model_t *m = f->ms[i];
        if (!m->present || !m->watched) {
            snprintf(m->last_id, sizeof(m->last_id), "0-0"); /* newest when back */
            continue;
        }
        if (strcmp(m->last_id, "0-0") == 0 &&
            (err = psstore_versions_last_id(f->c, m->name, m->last_id)) != FR_OK)
            return err;
        f->names[k] = m->name;
        memcpy(f->ids[k], m->last_id, PSSTORE_STREAM_ID_MAX);
        f->ms[k++] = m;
    }
    if (k == 0) {
        nap(s, next_ms);
        return FR_OK;
    }
    if ((err = psstore_versions_wait(f->c, f->names, k, f->ids, next_ms, f->moved)) != FR_OK)
        return err;
    for (size_t i = 0; i < k; i++) {
        memcpy(f->ms[i]->last_id, f->ids[i], PSSTORE_STREAM_ID_MAX);
        if (f->moved[i])
            f->ms[i]->pending = 1;
    }
    return FR_OK;
}

/* One turn of the follower on a connected store: the list of models when
 * due, each model, then the wait for the next turn. Returns
 * FR_ERR_REDIS-class errors or FR_ERR_NOMEM. */
static fr_err_t follow_turn(struct serve *s, follower_t *f)
{
    fr_err_t err = FR_OK;
    if (f->models_ns == 0 || ms_since(f->models_ns) >= MODELS_EVERY_MS) {
        if ((err = read_models(s, f->c)) != FR_OK)
            return err;
        f->models_ns = fr_clock_mono_ns();
    }
    /* the models to look at this turn */
    pthread_mutex_lock(&s->lock);
    size_t n = s->nmodels;
    memcpy(f->ms, s->models, n * sizeof(*f->ms));
    pthread_mutex_unlock(&s->lock);
    int all = f->check_ns == 0 || ms_since(f->check_ns) >= CHECK_EVERY_MS, changed = 0;
    if (all)
        f->check_ns = fr_clock_mono_ns();
    int next_ms = FOLLOW_BLOCK_MS;
    for (size_t i = 0; i < n && err == FR_OK; i++)
        err = follow_model(s, f, f->ms[i], all, &changed, &next_ms);
    if (err != FR_OK)
        return err;
    set_store(s, 1, "");
    if (changed)
        sv_notify(s);
    /* block on the versions streams of the models clients ask for */
    return follow_wait(s, f, n, next_ms);
}

void *sv_follow_main(void *arg)
{
    struct serve *s = arg;
    fr_thread_name("fr-follow");
    follower_t f = {0};
    f.names = calloc((size_t)s->conf.max_models, sizeof(*f.names));
    f.ids = calloc((size_t)s->conf.max_models, sizeof(*f.ids));
    f.moved = calloc((size_t)s->conf.max_models, sizeof(*f.moved));
    f.ms = calloc((size_t)s->conf.max_models, sizeof(*f.ms));
    if (f.names == NULL || f.ids == NULL || f.moved == NULL || f.ms == NULL) {
        fr_log(FR_LOG_ERROR, "serve: out of memory");
        goto out;
    }
    while (!atomic_load(&s->stop)) {
        char errstr[256];
        if (f.c == NULL) {
            f.c = psstore_conn_new(s->redis_url, FOLLOW_TIMEOUT_MS, errstr, sizeof(errstr));
            if (f.c == NULL) {
                set_store(s, 0, errstr);
                nap(s, 500);
                continue;
            }
            f.models_ns = f.check_ns = 0;
        }
        fr_err_t err = follow_turn(s, &f);
        if (err == FR_OK)
            continue;
        if (err == FR_ERR_NOMEM) {
            set_store(s, 0, "out of memory");
            nap(s, 500);
            continue;
        }
        set_store(s, 0, psstore_conn_error(f.c));
        psstore_conn_destroy(f.c);
        f.c = NULL;
        nap(s, 500);
    }
out:
    psstore_conn_destroy(f.c);
    free(f.w);
    sv_stats_scratch_fini(&f.scratch);
    free(f.names);
    free(f.ids);
    free(f.moved);
    free(f.ms);
    return NULL;
}
