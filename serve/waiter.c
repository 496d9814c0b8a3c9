/*
 * waiter.c - the clients waiting on a model (docs/design.md "Snapshots and
 * publishing"): long-polls for other weights, first reads of a model not
 * followed yet, dashboards for newer stats. A waiter costs a timer and a
 * list entry, no thread; the connection's close callback drops it at once
 * when its client hangs up.
 *
 * Threads: the loop only; a model's waiters list is the loop's own, the
 * model's published fields are read under s->lock.
 */
#include <stdlib.h>
#include <string.h>

#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "serve/http_int.h"

/* Takes w out of its model's list. */
static void waiter_unlink(sv_waiter_t *w)
{
    /* w is in w->m's list (a waiter unlinked twice, or linked into another
     * model's list, would cut that list) */
    FR_ASSERT(w->prev != NULL ? w->prev->next == w : w->m->waiters == w);
    FR_ASSERT(w->next == NULL || w->next->prev == w);
    FR_ASSERT(w->s->waiting > 0);
    if (w->prev != NULL)
        w->prev->next = w->next;
    else
        w->m->waiters = w->next;
    if (w->next != NULL)
        w->next->prev = w->prev;
    w->prev = w->next = NULL;
    w->s->waiting--;
    fr_series_set(w->s->m_waiting, (double)w->s->waiting);
}

static void waiter_free(sv_waiter_t *w)
{
    if (w->timer != NULL)
        event_free(w->timer);
    if (w->hup != NULL)
        event_free(w->hup);
    free(w);
}

/* Stops watching the connection and forgets the waiter; the caller answers
 * w->req next. */
static void waiter_finish(sv_waiter_t *w)
{
    waiter_unlink(w);
    if (w->evcon != NULL)
        evhttp_connection_set_closecb(w->evcon, NULL, NULL);
}

/* The client hung up (or the server is closing the connection). */
static void waiter_closed(struct evhttp_connection *evcon, void *arg)
{
    sv_waiter_t *w = arg;
    waiter_unlink(w);
    /* a request detached from its dead connection is ours to free; one
     * still queued on it is freed by libevent */
    if (evhttp_request_get_connection(w->req) == NULL)
        evhttp_request_free(w->req);
    waiter_free(w);
}

/* Nonzero when w's wait is over. Under s->lock. */
static int waiter_due(const sv_waiter_t *w, const sv_model_t *m)
{
    const sv_view_t *cur = m->cur;
    switch (w->kind) {
    case SV_W_POLL:
        return cur != NULL &&
               (cur->version != w->version || (!w->any_epoch && cur->epoch != w->epoch));
    case SV_W_FRESH:
        if (!m->present || m->error[0] != '\0')
            return 1; /* answered with the reason */
        /* the version known at the request, or anything read since */
        return cur != NULL &&
               (w->version < 0 || (cur->epoch == w->epoch && cur->version >= w->version) ||
                cur->epoch != w->had_epoch || cur->version != w->had_version);
    case SV_W_STATS: return m->stats != NULL && m->stats_seq != w->stats_seq;
    }
    return 1;
}

static void answer_waiter(sv_waiter_t *w, int timed_out)
{
    struct serve *s = w->s;
    sv_model_t *m = w->m;
    struct evhttp_request *req = w->req;
    pthread_mutex_lock(&s->lock);
    sv_view_t *cur = sv_view_ref(m->cur);
    char error[256];
    snprintf(error, sizeof(error), "%s", m->error);
    pthread_mutex_unlock(&s->lock);
    enum sv_fmt f = w->fmt;
    enum sv_wkind kind = w->kind;
    int64_t after = w->after;
    int64_t left_ms = (int64_t)w->wait_ms - (int64_t)((fr_clock_mono_ns() - w->t0_ns) / 1000000);
    waiter_finish(w);
    waiter_free(w);
    if (kind == SV_W_STATS) {
        sv_view_unref(cur);
        sv_send_stats(s, req, m);
        return;
    }
    if (cur == NULL) {
        sv_send_error(s, req, 503, "weights of model '%s' not available yet%s%s", m->name,
                      error[0] ? ": " : "", error);
        return;
    }
    if (timed_out && kind == SV_W_POLL) {
        /* nothing newer within wait: 304 with the current ETag */
        struct evkeyvalq *h = evhttp_request_get_output_headers(req);
        evhttp_add_header(h, "ETag", cur->etag);
        evhttp_add_header(h, "Cache-Control", "no-cache");
        char num[32];
        snprintf(num, sizeof(num), "%lld", (long long)cur->version);
        evhttp_add_header(h, "X-Freshet-Version", num);
        sv_view_unref(cur);
        sv_send_not_modified(s, req);
        return;
    }
    if (kind == SV_W_FRESH) {
        /* fresh weights now: a long-poll goes on waiting for the rest of
         * its wait when they are still the version it has */
        sv_send_weights(s, req, m, cur, f, after, left_ms > 0 ? (int)left_ms : 0);
        return;
    }
    sv_send_view(s, req, m, cur, f);
}

static void waiter_timeout(evutil_socket_t fd, short what, void *arg)
{
    answer_waiter(arg, 1);
}

/* evhttp reads nothing from a connection while its request is pending, so
 * it would notice a hang-up only when it writes the answer: the socket is
 * watched for the peer's close (EPOLLRDHUP) and the connection freed at
 * once, which runs waiter_closed. */
static void waiter_hup(evutil_socket_t fd, short what, void *arg)
{
    sv_waiter_t *w = arg;
    evhttp_connection_free(w->evcon);
}

sv_waiter_t *sv_waiter_add(struct serve *s, struct evhttp_request *req, sv_model_t *m,
                           enum sv_fmt f, enum sv_wkind kind, uint64_t epoch, int64_t version,
                           int any_epoch, int wait_ms)
{
    sv_waiter_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return NULL;
    w->s = s;
    w->m = m;
    w->req = req;
    w->fmt = f;
    w->kind = kind;
    w->epoch = epoch;
    w->version = version;
    w->any_epoch = any_epoch;
    w->after = -1;
    w->timer = evtimer_new(s->base, waiter_timeout, w);
    struct timeval tv = {wait_ms / 1000, (wait_ms % 1000) * 1000};
    if (w->timer == NULL || evtimer_add(w->timer, &tv) != 0) {
        waiter_free(w);
        return NULL;
    }
    w->evcon = evhttp_request_get_connection(req);
    if (w->evcon != NULL) {
        struct bufferevent *bev = evhttp_connection_get_bufferevent(w->evcon);
        evutil_socket_t fd = bev != NULL ? bufferevent_getfd(bev) : -1;
        if (fd >= 0 && (event_base_get_features(s->base) & EV_FEATURE_EARLY_CLOSE)) {
            w->hup = event_new(s->base, fd, EV_CLOSED, waiter_hup, w);
            if (w->hup == NULL || event_add(w->hup, NULL) != 0) {
                waiter_free(w);
                return NULL;
            }
        }
        evhttp_connection_set_closecb(w->evcon, waiter_closed, w);
    }
    FR_ASSERT(m->waiters == NULL || m->waiters->prev == NULL);
    w->next = m->waiters;
    if (m->waiters != NULL)
        m->waiters->prev = w;
    m->waiters = w;
    s->waiting++;
    fr_series_set(s->m_waiting, (double)s->waiting);
    return w;
}

void sv_waiter_wake(struct serve *s)
{
    pthread_mutex_lock(&s->lock);
    size_t n = s->nmodels;
    pthread_mutex_unlock(&s->lock);
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&s->lock);
        sv_model_t *m = s->models[i];
        uint64_t seq = m->seq;
        pthread_mutex_unlock(&s->lock);
        if (seq == m->seen_seq)
            continue;
        m->seen_seq = seq;
        for (sv_waiter_t *w = m->waiters, *next; w != NULL; w = next) {
            next = w->next; /* answering unlinks w only */
            pthread_mutex_lock(&s->lock);
            int due = waiter_due(w, m);
            pthread_mutex_unlock(&s->lock);
            if (due)
                answer_waiter(w, 0);
        }
    }
}

void sv_waiter_close_all(struct serve *s, sv_model_t *m)
{
    while (m->waiters != NULL) {
        sv_waiter_t *w = m->waiters;
        struct evhttp_request *req = w->req;
        waiter_finish(w);
        waiter_free(w);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
        sv_send_error(s, req, 503, "server shutting down");
    }
}
