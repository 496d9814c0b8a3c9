/*
 * pool.c - requests answered off the loop (docs/design.md "Predictions"):
 * the queue between the loop and a pool of threads, the client's hang-up
 * watched while its job waits, the answers handed back and sent. The rows
 * reader (rows_sparse.c) and the inference workers (infer.c) are two such pools.
 *
 * Threads: sv_pool_submit, sv_pool_drain, the done event and the hang-up
 * callbacks run on the loop; sv_pool_take and sv_pool_finish on a pool's
 * threads; the lists are under p->lock.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "serve/http_int.h"

/* ---- answers, on a pool's thread -------------------------------------------------- */

void sv_job_answer(sv_job_t *j, int code, const char *type, char *body, size_t len)
{
    free(j->body);
    j->code = code;
    j->type = type;
    j->body = body;
    j->len = len;
}

void sv_job_error(sv_job_t *j, int code, const char *fmt, ...)
{
    fr_buf_t b = {0};
    va_list ap;
    va_start(ap, fmt);
    sv_json_error(&b, fmt, ap);
    va_end(ap);
    if (b.failed)
        fr_buf_fini(&b);
    sv_job_answer(j, code, "application/json", b.failed ? NULL : b.p, b.failed ? 0 : b.len);
    j->version[0] = j->epoch[0] = '\0';
}

/* ---- the queue, on a pool's thread -------------------------------------------------- */

size_t sv_pool_take(sv_pool_t *p, sv_job_t **jobs, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&p->lock);
    while (n == 0) {
        while (p->queue == NULL && !atomic_load(&p->s->stop))
            pthread_cond_wait(&p->wake, &p->lock);
        if (atomic_load(&p->s->stop))
            break; /* stop answers what is still queued */
        while (p->queue != NULL && n < max) {
            sv_job_t *j = p->queue;
            FR_ASSERT(p->queued > 0 && j->pool == p);
            p->queue = j->next;
            p->queued--;
            if (j->gone) { /* a client that hung up costs no work */
                j->next = p->done;
                p->done = j;
                event_active(p->done_ev, EV_READ, 0);
            } else {
                jobs[n++] = j;
                p->inflight++;
            }
        }
    }
    pthread_mutex_unlock(&p->lock);
    return n;
}

void sv_pool_requeue(sv_pool_t *p, sv_job_t **jobs, size_t n, int pause)
{
    pthread_mutex_lock(&p->lock);
    sv_job_t **tail = &p->queue; /* behind those that came meanwhile */
    while (*tail != NULL)
        tail = &(*tail)->next;
    for (size_t i = 0; i < n; i++) {
        jobs[i]->next = NULL;
        *tail = jobs[i];
        tail = &jobs[i]->next;
    }
    FR_ASSERT(p->inflight >= n); /* jobs this pool's threads took */
    p->queued += n;
    p->inflight -= n;
    pthread_mutex_unlock(&p->lock);
    if (pause) {
        struct timespec ts = {0, SV_POOL_PAUSE_NS};
        nanosleep(&ts, NULL);
    }
}

void sv_pool_finish(sv_pool_t *p, sv_job_t **jobs, size_t n)
{
    pthread_mutex_lock(&p->lock);
    for (size_t i = 0; i < n; i++) {
        jobs[i]->next = p->done;
        p->done = jobs[i];
    }
    FR_ASSERT(p->inflight >= n); /* jobs this pool's threads took */
    p->inflight -= n;
    event_active(p->done_ev, EV_READ, 0);
    pthread_mutex_unlock(&p->lock);
}

/* ---- jobs, on the loop --------------------------------------------------------------- */

static void job_free(sv_job_t *j)
{
    if (j->hup != NULL)
        event_free(j->hup);
    if (j->fini != NULL)
        j->fini(j);
    free(j->body);
    free(j);
}

/* The client hung up (or the server closes the connection): the answer
 * will be dropped. */
static void job_closed(struct evhttp_connection *evcon, void *arg)
{
    sv_job_t *j = arg;
    (void)evcon;
    /* a request detached from its dead connection is ours to free; one
     * still queued on it is freed by libevent */
    if (j->req != NULL && evhttp_request_get_connection(j->req) == NULL)
        evhttp_request_free(j->req);
    j->req = NULL;
    j->evcon = NULL;
    if (j->hup != NULL) {
        event_free(j->hup);
        j->hup = NULL;
    }
    pthread_mutex_lock(&j->pool->lock);
    j->gone = 1;
    pthread_mutex_unlock(&j->pool->lock);
}

/* evhttp reads nothing from a connection while its request is pending, so
 * a hang-up shows only as the socket's close (EPOLLRDHUP): the connection
 * is freed at once, which runs job_closed. */
static void job_hup(evutil_socket_t fd, short what, void *arg)
{
    sv_job_t *j = arg;
    (void)fd;
    (void)what;
    evhttp_connection_free(j->evcon);
}

/* Sends j's answer (when its client is still there) and frees it. */
static void job_send(struct serve *s, sv_job_t *j)
{
    if (j->hup != NULL) {
        event_free(j->hup);
        j->hup = NULL;
    }
    if (j->evcon != NULL)
        evhttp_connection_set_closecb(j->evcon, NULL, NULL);
    if (j->req != NULL && j->then != NULL) {
        j->then(j, j->req);
    } else if (j->req != NULL) {
        struct evkeyvalq *h = evhttp_request_get_output_headers(j->req);
        if (j->version[0] != '\0') {
            evhttp_add_header(h, "X-Freshet-Version", j->version);
            evhttp_add_header(h, "X-Freshet-Epoch", j->epoch);
        }
        if (j->body != NULL) {
            evhttp_add_header(h, "Cache-Control", "no-store");
            sv_send_text(s, j->req, j->code, j->type, j->body, j->len);
        } else {
            sv_send_error(s, j->req, 500, "out of memory"); /* no-store too */
        }
    }
    job_free(j);
}

static void on_done(evutil_socket_t fd, short what, void *arg)
{
    sv_pool_t *p = arg;
    (void)fd;
    (void)what;
    pthread_mutex_lock(&p->lock);
    sv_job_t *done = p->done;
    p->done = NULL;
    pthread_mutex_unlock(&p->lock);
    while (done != NULL) {
        sv_job_t *j = done;
        done = j->next;
        job_send(p->s, j);
    }
}

void sv_pool_submit(sv_pool_t *p, struct evhttp_request *req, sv_job_t *j)
{
    struct serve *s = p->s;
    pthread_mutex_lock(&p->lock);
    size_t queued = p->queued;
    pthread_mutex_unlock(&p->lock);
    if (atomic_load(&s->stop) || queued >= p->queue_max || p->nthreads == 0) {
        job_free(j);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
        if (atomic_load(&s->stop))
            sv_send_error(s, req, 503, "server shutting down");
        else
            sv_send_error(s, req, 503, "too many %s requests waiting (%zu); try again", p->what,
                          queued);
        return;
    }
    FR_ASSERT(j->pool == NULL && j->next == NULL); /* a new job, in no list yet */
    j->pool = p;
    j->req = req;
    j->evcon = evhttp_request_get_connection(req);
    if (j->evcon != NULL) {
        struct bufferevent *bev = evhttp_connection_get_bufferevent(j->evcon);
        evutil_socket_t fd = bev != NULL ? bufferevent_getfd(bev) : -1;
        if (fd >= 0 && (event_base_get_features(s->base) & EV_FEATURE_EARLY_CLOSE) &&
            (j->hup = event_new(s->base, fd, EV_CLOSED, job_hup, j)) != NULL &&
            event_add(j->hup, NULL) != 0) {
            event_free(j->hup);
            j->hup = NULL; /* unwatched: a hang-up is seen when the answer is written */
        }
        evhttp_connection_set_closecb(j->evcon, job_closed, j);
    }
    pthread_mutex_lock(&p->lock);
    sv_job_t **tail = &p->queue; /* first come, first served */
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = j;
    p->queued++;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
}

size_t sv_pool_drain(sv_pool_t *p)
{
    if (!p->ready)
        return 0;
    pthread_mutex_lock(&p->lock);
    sv_job_t *queued = p->queue;
    p->queue = NULL;
    p->queued = 0;
    pthread_mutex_unlock(&p->lock);
    while (queued != NULL) {
        sv_job_t *j = queued;
        queued = j->next;
        sv_job_error(j, 503, "server shutting down");
        if (j->req != NULL)
            evhttp_add_header(evhttp_request_get_output_headers(j->req), "Connection", "close");
        job_send(p->s, j);
    }
    on_done(-1, 0, p); /* the answers the threads finished */
    pthread_mutex_lock(&p->lock);
    size_t held = p->inflight;
    pthread_mutex_unlock(&p->lock);
    return held;
}

/* ---- lifecycle --------------------------------------------------------------------- */

int sv_pool_init(sv_pool_t *p, struct serve *s, const char *what, size_t queue_max)
{
    memset(p, 0, sizeof(*p));
    p->s = s;
    p->what = what;
    p->queue_max = queue_max;
    if ((p->done_ev = event_new(s->base, -1, 0, on_done, p)) == NULL)
        return -1;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->ready = 1;
    return 0;
}

int sv_pool_start(sv_pool_t *p, size_t n, void *(*main)(void *))
{
    for (size_t i = 0; i < n && i < SV_POOL_THREADS_MAX; i++) {
        if (pthread_create(&p->threads[i], NULL, main, p->s) != 0)
            return -1; /* the caller stops those started */
        p->nthreads++;
    }
    return 0;
}

void sv_pool_join(sv_pool_t *p)
{
    if (!p->ready)
        return;
    pthread_mutex_lock(&p->lock);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (size_t i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    p->nthreads = 0;
}

void sv_pool_fini(sv_pool_t *p)
{
    if (!p->ready)
        return;
    sv_job_t *lists[2] = {p->queue, p->done};
    p->queue = p->done = NULL;
    for (int k = 0; k < 2; k++)
        while (lists[k] != NULL) {
            sv_job_t *j = lists[k];
            lists[k] = j->next;
            job_free(j);
        }
    event_free(p->done_ev);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    p->ready = 0;
}
