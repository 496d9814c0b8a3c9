/*
 * conn.c - the connections of the loop and its listener: accept()
 * failures paused instead of retried at once, the connection cap, the
 * sweep that finds the connections evhttp let go of and closes the slow
 * ones, and the TLS session of each connection.
 *
 * Threads: the loop only; the registry of listeners (which server a
 * listener's error callback is about) is under its own lock.
 */
#include <stdlib.h>
#include <sys/resource.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "serve/http_int.h"

/* The states of a tracked connection (s->conn_seen[i]): accepted, then
 * seen once a request arrived whole; doomed (plain text on a TLS port, to
 * close) from its accept on, and for good. */
enum { CONN_NEW = 0, CONN_SEEN = 1, CONN_DOOMED = 2 };

void sv_conn_seen(struct serve *s, const struct bufferevent *bev)
{
    for (int i = s->open_conns - 1; i >= 0; i--)
        if (s->conns[i] == bev) {
            FR_ASSERT(s->conn_seen[i] <= CONN_DOOMED);
            if (s->conn_seen[i] != CONN_DOOMED)
                s->conn_seen[i] = CONN_SEEN;
            return;
        }
}

/*
 * When accept() fails (no descriptor left: EMFILE, ENFILE; no memory), the
 * listening socket stays readable and libevent would call accept() again at
 * once, forever. The listener is paused instead, for 10 ms doubling to 1 s
 * while the failures go on, each pause logged once with the failures it
 * counted; connections already open keep being served, and their closing
 * frees the descriptors the next accept() needs.
 */
#define ACCEPT_PAUSE_MIN_MS 10
#define ACCEPT_PAUSE_MAX_MS 1000

static pthread_mutex_t listeners_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    struct evconnlistener *lev;
    struct serve *s;
} listeners[256]; /* which server a listener's error callback is about */

/* Accepts while neither a pause after a failure nor the connection cap
 * holds the listener back. Loop thread. */
static void listener_update(struct serve *s)
{
    if (s->closing || s->bound == NULL)
        return;
    struct evconnlistener *lev = evhttp_bound_socket_get_listener(s->bound);
    if (s->accept_paused || s->open_conns >= s->max_conns)
        evconnlistener_disable(lev);
    else
        evconnlistener_enable(lev);
}

static void on_accept_again(evutil_socket_t fd, short what, void *arg)
{
    struct serve *s = arg;
    (void)fd;
    (void)what;
    s->accept_paused = 0;
    listener_update(s);
}

static void on_accept_error(struct evconnlistener *lev, void *ctx)
{
    int err = EVUTIL_SOCKET_ERROR();
    struct serve *s = NULL;
    (void)ctx;
    pthread_mutex_lock(&listeners_lock);
    for (size_t i = 0; i < sizeof(listeners) / sizeof(listeners[0]) && s == NULL; i++)
        if (listeners[i].lev == lev)
            s = listeners[i].s;
    pthread_mutex_unlock(&listeners_lock);
    if (s == NULL)
        return;
    fr_series_add(s->m_accept_errors, 1);
    s->accept_paused = 1;
    evconnlistener_disable(lev);
    uint64_t now = fr_clock_mono_ns();
    if (now - s->accept_error_ns > 2 * (uint64_t)ACCEPT_PAUSE_MAX_MS * 1000000u)
        s->accept_pause_ms = ACCEPT_PAUSE_MIN_MS; /* a new spell of failures */
    s->accept_error_ns = now;
    int pause = s->accept_pause_ms;
    s->accept_pause_ms = pause * 2 > ACCEPT_PAUSE_MAX_MS ? ACCEPT_PAUSE_MAX_MS : pause * 2;
    if (pause == ACCEPT_PAUSE_MIN_MS) /* once a spell */
        fr_log(FR_LOG_WARN,
               "serve: accept() failed: %s; not accepting for %d ms (then up to %d ms a "
               "time while it fails; freshet_http_accept_errors_total counts them)",
               evutil_socket_error_to_string(err), pause, ACCEPT_PAUSE_MAX_MS);
    struct timeval tv = {pause / 1000, (pause % 1000) * 1000};
    event_add(s->accept_again, &tv);
}

/* Adds s's listener to the registry (add), or removes s from it. A
 * listener left out (the registry full) keeps libevent's own handling. */
static void listener_register(struct serve *s, int add)
{
    struct evconnlistener *lev = add ? evhttp_bound_socket_get_listener(s->bound) : NULL;
    int added = 0;
    pthread_mutex_lock(&listeners_lock);
    for (size_t i = 0; i < sizeof(listeners) / sizeof(listeners[0]) && !added; i++)
        if (add ? listeners[i].lev == NULL : listeners[i].s == s) {
            listeners[i].lev = lev;
            listeners[i].s = add ? s : NULL;
            added = add;
        }
    pthread_mutex_unlock(&listeners_lock);
    if (added)
        evconnlistener_set_error_cb(lev, on_accept_error);
    else if (add)
        fr_log(FR_LOG_WARN,
               "serve: more than %zu servers in this process: accept() failures are "
               "not paused for this one",
               sizeof(listeners) / sizeof(listeners[0]));
}

/*
 * The connection cap ([serve] max_connections). libevent 2.1 reports no
 * connection's end (a connection can close before its first request), so
 * serve makes every accepted connection's bufferevent itself (evhttp's
 * bevcb) and holds a reference to it: when evhttp lets go of a connection
 * (bufferevent_free) its callbacks are cleared, and a sweep every
 * CONN_SWEEP_MS finds those, drops the reference (which closes the socket)
 * and counts the connections still open. At the cap the listener stops
 * accepting (new connections wait in the kernel's backlog, taking no
 * descriptor) until the sweep finds one closed, so that descriptors remain
 * for Redis, Kafka and files. The sweep also closes a connection that has
 * not completed its first request header_timeout after it was accepted:
 * libevent's timeouts count inactivity, which a client sending a byte now
 * and then never reaches (slowloris).
 */
#define CONN_SWEEP_MS 100

static void conn_sweep(evutil_socket_t fd, short what, void *arg)
{
    struct serve *s = arg;
    (void)fd;
    (void)what;
    int kept = 0;
    uint64_t now = fr_clock_mono_ns();
    uint64_t deadline = (uint64_t)s->conf.header_timeout_s * 1000000000u;
    FR_ASSERT(s->open_conns >= 0 && s->open_conns <= s->conns_cap);
    for (int i = 0; i < s->open_conns; i++) {
        FR_ASSERT(s->conn_seen[i] <= CONN_DOOMED);
        /* evhttp sets a connection's callbacks as it takes the
         * bufferevent from conn_bev, before the loop runs again, and
         * bufferevent_free clears them: none set, evhttp let go of it */
        bufferevent_event_cb eventcb = NULL;
        void *evcon = NULL;
        bufferevent_getcb(s->conns[i], NULL, NULL, &eventcb, &evcon);
        if (eventcb == NULL) {
            bufferevent_decref(s->conns[i]); /* now it goes, its socket closed */
            continue;
        }
        if (evcon != NULL && (s->conn_seen[i] == CONN_DOOMED ||
                              (s->conn_seen[i] == CONN_NEW && now - s->conn_since[i] > deadline)))
            evhttp_connection_free(evcon); /* too slow, or doomed: the next sweep lets it go */
        s->conn_since[kept] = s->conn_since[i];
        s->conn_seen[kept] = s->conn_seen[i];
        s->conns[kept++] = s->conns[i];
    }
    int was_capped = s->open_conns >= s->max_conns;
    s->open_conns = kept;
    fr_series_set(s->m_conns, kept);
    if (was_capped && kept < s->max_conns)
        listener_update(s);
}

/* A TLS session could not be made for a connection (no memory): evhttp
 * would take a plain one instead, so what it gets writes nothing (its
 * output frozen), sv_dispatch ignores it and the sweep closes it. Untracked
 * (beyond conns_cap) it waits for libevent's timeout; should even this
 * allocation fail, libevent makes a plain one, whose requests sv_dispatch
 * still ignores. */
static struct bufferevent *doomed_bev(struct serve *s, struct event_base *base)
{
    fr_series_add(s->m_accept_errors, 1);
    uint64_t now = fr_clock_mono_ns();
    if (s->tls_log_ns == 0 || now - s->tls_log_ns > 60 * (uint64_t)1000000000u) {
        s->tls_log_ns = now;
        const char *why = ERR_reason_error_string(ERR_get_error());
        fr_log(FR_LOG_WARN,
               "serve: TLS: cannot create a session (%s): closing the connection "
               "(freshet_http_accept_errors_total counts these)",
               why != NULL ? why : "out of memory");
    }
    ERR_clear_error(); /* (what the log line did not take) */
    struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (bev != NULL)
        evbuffer_freeze(bufferevent_get_output(bev), 0);
    return bev;
}

static struct bufferevent *conn_bev(struct event_base *base, void *arg)
{
    struct serve *s = arg;
    struct bufferevent *bev = NULL;
    int doomed = 0;
    if (s->ssl_ctx != NULL) {
        SSL *ssl = SSL_new(s->ssl_ctx);
        if (ssl != NULL)
            bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                 BEV_OPT_CLOSE_ON_FREE);
        if (bev == NULL) { /* (libevent frees ssl or not by version: kept) */
            bev = doomed_bev(s, base);
            doomed = 1;
        }
    } else {
        bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    }
    if (bev == NULL || s->open_conns >= s->conns_cap)
        return bev; /* the array is sized to the cap plus a margin: untracked */
    FR_ASSERT(s->open_conns >= 0);
    bufferevent_incref(bev);
    s->conn_since[s->open_conns] = fr_clock_mono_ns();
    s->conn_seen[s->open_conns] = doomed ? CONN_DOOMED : CONN_NEW;
    s->conns[s->open_conns++] = bev;
    fr_series_set(s->m_conns, s->open_conns);
    if (s->open_conns >= s->max_conns) {
        fr_series_add(s->m_capped, 1);
        uint64_t now = fr_clock_mono_ns();
        if (s->capped_log_ns == 0 || now - s->capped_log_ns > 60 * (uint64_t)1000000000u) {
            s->capped_log_ns = now;
            fr_log(FR_LOG_WARN,
                   "serve: %d connections open, [serve] max_connections: not accepting more "
                   "until one closes (freshet_http_connection_cap_total counts these)",
                   s->open_conns);
        }
        listener_update(s);
    }
    return bev;
}

/* [serve] max_connections, or its default: half the descriptors this
 * process may open, at least 16. */
static int conn_cap(int configured)
{
    if (configured > 0)
        return configured;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return 4096;
    rlim_t half = rl.rlim_cur / 2;
    return half < 16 ? 16 : half > 1000000 ? 1000000 : (int)half;
}

int sv_conn_init(struct serve *s, int max_connections)
{
    s->max_conns = conn_cap(max_connections);
    s->conns_cap = s->max_conns + 64; /* accepts already under way when the cap closes */
    s->conns = calloc((size_t)s->conns_cap, sizeof(*s->conns));
    s->conn_since = calloc((size_t)s->conns_cap, sizeof(*s->conn_since));
    s->conn_seen = calloc((size_t)s->conns_cap, sizeof(*s->conn_seen));
    if (s->conns == NULL || s->conn_since == NULL || s->conn_seen == NULL)
        return -1;
    evhttp_set_bevcb(s->http, conn_bev, s);
    s->accept_again = evtimer_new(s->base, on_accept_again, s);
    s->accept_pause_ms = ACCEPT_PAUSE_MIN_MS;
    s->sweep = event_new(s->base, -1, EV_PERSIST, conn_sweep, s);
    struct timeval sweep_tv = {0, CONN_SWEEP_MS * 1000};
    if (s->accept_again == NULL || s->sweep == NULL || event_add(s->sweep, &sweep_tv) != 0)
        return -1;
    return 0;
}

void sv_conn_listen(struct serve *s)
{
    listener_register(s, 1);
}

void sv_conn_unlisten(struct serve *s)
{
    listener_register(s, 0);
}

void sv_conn_fini(struct serve *s)
{
    for (int i = 0; i < s->open_conns; i++)
        bufferevent_decref(s->conns[i]); /* their sockets close */
    s->open_conns = 0;
    free(s->conns);
    free(s->conn_since);
    free(s->conn_seen);
    s->conns = NULL;
    s->conn_since = NULL;
    s->conn_seen = NULL;
    if (s->sweep != NULL)
        event_free(s->sweep);
    if (s->accept_again != NULL)
        event_free(s->accept_again);
    s->sweep = s->accept_again = NULL;
}
