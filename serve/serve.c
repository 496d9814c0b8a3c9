/*
 * serve.c - the server's lifecycle: the configuration checked, the loop,
 * the listener (with TLS) and the metrics set up; the loop, follower and
 * pool threads started; at stop, every waiting client and queued job
 * answered before the loop ends (docs/design.md "Snapshots and
 * publishing").
 *
 * The loop (one event_base) runs dispatch.c, send.c, waiter.c, conn.c and
 * the routes; every read is answered from what the follower (follow.c)
 * published, encoded once: a request costs no Redis read and no copy of
 * the weights (evbuffer_add_reference). Only replay and rollback talk to
 * Redis from the loop: an operator's rare request, on its own connection
 * with a short timeout.
 */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "serve/http_int.h"

#define MAX_HEADERS    16384
#define CHARTJS_MAX    (8u << 20)
#define ROWS_QUEUE_MAX 1024 /* rows requests waiting for the reader at most */
#define STOP_JOBS_MS   2000 /* stop waits this long for the jobs threads hold */

void serve_conf_init(serve_conf_t *conf)
{
    memset(conf, 0, sizeof(*conf));
    conf->listen = "127.0.0.1:8080";
    conf->redis_url = "redis://127.0.0.1:6379/0";
    conf->model = "";
    conf->token = "";
    conf->refresh_ms = 20;
    conf->tls_cert = "";
    conf->tls_key = "";
    conf->chartjs = "/usr/share/javascript/chart.js/chart.min.js";
    conf->max_body = 1024 * 1024;
    conf->header_timeout_s = 10;
    conf->infer = 1;
    conf->infer_threads = 2;
    conf->infer_queue = 256;
    conf->allowed_hosts = "";
    conf->max_models = 64;
}

int sv_store_up(struct serve *s, char *why)
{
    pthread_mutex_lock(&s->lock);
    int up = s->store_up;
    snprintf(why, 256, "%s", s->store_error[0] ? s->store_error : "not connected yet");
    pthread_mutex_unlock(&s->lock);
    return up;
}

/* The follower published: the waiters whose wait is over are answered. */
static void on_notify(evutil_socket_t fd, short what, void *arg)
{
    struct serve *s = arg;
    (void)fd;
    (void)what;
    sv_waiter_wake(s);
}

void sv_notify(struct serve *s)
{
    if (s->notify != NULL)
        event_active(s->notify, EV_READ, 0);
}

/* ",name,name,": the Host names answered ("" any). */
static char *hosts_list(const char *allowed, const char *listen_host)
{
    fr_buf_t b = {0};
    if (strcmp(allowed, "*") == 0 ||
        (allowed[0] == '\0' && (listen_host[0] == '\0' || strcmp(listen_host, "0.0.0.0") == 0 ||
                                strcmp(listen_host, "::") == 0)))
        return strdup(""); /* every address listened on: any name reaches it */
    if (allowed[0] == '\0')
        fr_buf_printf(&b, ",localhost,127.0.0.1,::1,%s,", listen_host);
    else
        fr_buf_printf(&b, ",%s,", allowed);
    if (b.failed)
        return NULL;
    char *w = b.p;
    for (const char *r = b.p; *r; r++) /* lower case, no spaces */
        if (*r != ' ')
            *w++ = (char)tolower((unsigned char)*r);
    *w = '\0';
    return b.p;
}

/* ---- lifecycle -------------------------------------------------------------------- */

static int tls_setup(struct serve *s, char *errstr, size_t size)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL) {
        fr_errorf(FR_ERR_IO, errstr, size, "serve: TLS: cannot create a context");
        return -1;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    if (SSL_CTX_use_certificate_chain_file(ctx, s->tls_cert) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, s->tls_key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
        char e[256];
        ERR_error_string_n(ERR_get_error(), e, sizeof(e));
        fr_errorf(FR_ERR_INVAL, errstr, size, "serve: TLS: [serve] tls_cert %s / tls_key %s: %s",
                  s->tls_cert, s->tls_key, e);
        SSL_CTX_free(ctx);
        return -1;
    }
    s->ssl_ctx = ctx;
    return 0;
}

/* Splits "host:port" / "[v6]:port" into host[256] and *port. */
static int parse_listen(const char *listen, char *host, int *port)
{
    const char *colon;
    if (listen[0] == '[') {
        const char *end = strchr(listen, ']');
        if (end == NULL || end[1] != ':' || end - listen - 1 >= 256)
            return -1;
        memcpy(host, listen + 1, (size_t)(end - listen - 1));
        host[end - listen - 1] = '\0';
        colon = end + 1;
    } else {
        colon = strrchr(listen, ':');
        if (colon == NULL || colon == listen || colon - listen >= 256)
            return -1;
        memcpy(host, listen, (size_t)(colon - listen));
        host[colon - listen] = '\0';
    }
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end != '\0' || p < 0 || p > 65535)
        return -1;
    *port = (int)p;
    return 0;
}

static char *dup_or_empty(const char *s)
{
    return strdup(s != NULL ? s : "");
}

static void read_chartjs(struct serve *s)
{
    if (s->chartjs[0] == '\0')
        return;
    FILE *f = fopen(s->chartjs, "rb");
    if (f == NULL) {
        fr_log(FR_LOG_WARN,
               "serve: %s: %s: the dashboard draws no charts (Debian: apt-get "
               "install libjs-chart.js)",
               s->chartjs, strerror(errno));
        return;
    }
    char *buf = malloc(CHARTJS_MAX);
    size_t n = buf != NULL ? fread(buf, 1, CHARTJS_MAX, f) : 0;
    fclose(f);
    if (buf == NULL || n == 0 || n == CHARTJS_MAX) {
        free(buf);
        fr_log(FR_LOG_WARN, "serve: %s: unreadable or too large", s->chartjs);
        return;
    }
    s->chartjs_data = buf;
    s->chartjs_len = n;
}

/* At stop: answers the jobs the pools queued or finished, and looks again
 * every 10 ms while their threads hold some (for STOP_JOBS_MS at most);
 * then lets the answers go out and ends the loop. */
static void on_stop_wait(evutil_socket_t fd, short what, void *arg)
{
    struct serve *s = arg;
    size_t held = sv_pool_drain(&s->rows) + sv_pool_drain(&s->infer);
    if (held > 0 && fr_clock_mono_ns() < s->stop_deadline_ns) {
        struct timeval again = {0, 10000};
        event_add(s->stop_wait, &again);
        return;
    }
    struct timeval tv = {0, 100000};
    event_base_loopexit(s->base, &tv);
}

static void on_stop(evutil_socket_t fd, short what, void *arg)
{
    struct serve *s = arg;
    /* every waiting client gets an answer before the loop ends (models are
     * only ever appended: the first n stay valid) */
    pthread_mutex_lock(&s->lock);
    size_t n = s->nmodels;
    pthread_mutex_unlock(&s->lock);
    for (size_t i = 0; i < n; i++)
        sv_waiter_close_all(s, s->models[i]);
    s->stop_deadline_ns = fr_clock_mono_ns() + STOP_JOBS_MS * 1000000ull;
    on_stop_wait(-1, 0, s);
}

/* Registers serve's metrics in s->conf.metrics; -1 (errstr filled) when
 * the registry refuses one. */
static int register_metrics(struct serve *s, char *errstr, size_t size)
{
    static const char *const route_code[] = {"route", "code"}, *const route[] = {"route"},
                             *const model[] = {"model"}, *const model_by[] = {"model", "by"};
    fr_metrics_t *reg = s->conf.metrics;
    s->m_requests =
        fr_metrics_counter(reg, "freshet_http_requests_total",
                           "HTTP requests answered, by route and status", 2, route_code);
    s->m_bytes = fr_metrics_counter(reg, "freshet_http_response_bytes_total",
                                    "HTTP response body bytes, by route", 1, route);
    s->m_waiting = fr_metric_series(fr_metrics_gauge(reg, "freshet_http_longpoll_waiting",
                                                     "Long-poll clients waiting", 0, NULL),
                                    NULL);
    s->m_store_up = fr_metric_series(
        fr_metrics_gauge(reg, "freshet_serve_store_up",
                         "1 while serve's last read of the store succeeded", 0, NULL),
        NULL);
    s->m_version = fr_metrics_gauge(reg, "freshet_serve_model_version",
                                    "Version of the weights serve publishes", 1, model);
    s->m_published = fr_metrics_gauge(reg, "freshet_model_published_timestamp_seconds",
                                      "Unix time of the newest retained snapshot", 1, model);
    s->m_loads = fr_metrics_counter(reg, "freshet_serve_weights_reads_total",
                                    "Weights read from the store by serve", 1, model);
    s->m_json = fr_metrics_counter(reg, "freshet_serve_json_encodes_total",
                                   "Weights encoded as JSON, by the follower or for a request "
                                   "(on the HTTP loop)",
                                   2, model_by);
    s->m_predictions =
        fr_metrics_counter(reg, "freshet_serve_predictions_total",
                           "Samples predicted by POST /v2/models/{m}/infer", 1, model);
    s->m_refused = fr_metric_series(
        fr_metrics_counter(reg, "freshet_http_refused_total",
                           "Requests refused before any route: malformed headers (400) or a Host "
                           "not in [serve] allowed_hosts (403)",
                           0, NULL),
        NULL);
    s->m_accept_errors = fr_metric_series(
        fr_metrics_counter(reg, "freshet_http_accept_errors_total",
                           "accept() failures (no descriptor left, say; each pauses the "
                           "listener) and TLS connections closed without a session",
                           0, NULL),
        NULL);
    s->m_conns = fr_metric_series(
        fr_metrics_gauge(reg, "freshet_http_connections", "HTTP connections open now", 0, NULL),
        NULL);
    s->m_capped = fr_metric_series(
        fr_metrics_counter(reg, "freshet_http_connection_cap_total",
                           "Times the connections open reached [serve] max_connections and "
                           "accepting paused",
                           0, NULL),
        NULL);
    s->m_infer_batches = fr_metrics_counter(
        reg, "freshet_serve_infer_batches_total",
        "Forward passes run for predictions (requests that queued together share one)", 1, model);
    if (s->m_requests == NULL || s->m_bytes == NULL || s->m_waiting == NULL ||
        s->m_store_up == NULL || s->m_version == NULL || s->m_published == NULL ||
        s->m_loads == NULL || s->m_json == NULL || s->m_predictions == NULL ||
        s->m_infer_batches == NULL || s->m_refused == NULL || s->m_accept_errors == NULL ||
        s->m_conns == NULL || s->m_capped == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "serve: cannot register metrics");
        return -1;
    }
    return 0;
}

serve_t *serve_new(const serve_conf_t *conf, char *errstr, size_t size)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, (void (*)(void))evthread_use_pthreads);
    if (conf->metrics == NULL) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "serve: a metrics registry is required");
        return NULL;
    }
    if (conf->refresh_ms < 0 || conf->max_body < 1024 || conf->max_models < 1 ||
        conf->infer_threads < 1 || conf->infer_threads > SV_POOL_THREADS_MAX ||
        conf->infer_queue < 1 || conf->header_timeout_s < 1 ||
        conf->header_timeout_s > SV_CONN_TIMEOUT_S) {
        fr_errorf(FR_ERR_INVAL, errstr, size,
                  "serve: refresh_ms >= 0, max_body >= 1024, max_models >= 1, infer_threads "
                  "1..%d, infer_queue >= 1 and header_timeout 1..%d",
                  SV_POOL_THREADS_MAX, SV_CONN_TIMEOUT_S);
        return NULL;
    }
    if ((conf->tls_cert[0] != '\0') != (conf->tls_key[0] != '\0')) {
        fr_errorf(FR_ERR_INVAL, errstr, size,
                  "serve: [serve] tls_cert and tls_key go together (both or neither)");
        return NULL;
    }
    if (conf->model[0] != '\0' && psstore_model_name_check(conf->model, errstr, size) != FR_OK)
        return NULL;
    char host[256];
    int port;
    if (parse_listen(conf->listen, host, &port) != 0) {
        fr_errorf(FR_ERR_INVAL, errstr, size,
                  "serve: [serve] listen '%s': expected host:port or [v6]:port", conf->listen);
        return NULL;
    }
    psstore_url_t url;
    if (psstore_url_parse(conf->redis_url, &url, errstr, size) != FR_OK)
        return NULL;
    struct serve *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "serve: out of memory");
        return NULL;
    }
    s->conf = *conf;
    s->listen = dup_or_empty(conf->listen);
    s->redis_url = dup_or_empty(conf->redis_url);
    s->model = dup_or_empty(conf->model);
    s->token = dup_or_empty(conf->token);
    s->tls_cert = dup_or_empty(conf->tls_cert);
    s->tls_key = dup_or_empty(conf->tls_key);
    s->chartjs = dup_or_empty(conf->chartjs);
    s->hosts = hosts_list(conf->allowed_hosts != NULL ? conf->allowed_hosts : "", host);
    s->models = calloc((size_t)conf->max_models, sizeof(*s->models));
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    atomic_init(&s->stop, 0);
    s->base = event_base_new();
    s->http = s->base != NULL ? evhttp_new(s->base) : NULL;
    if (s->listen == NULL || s->redis_url == NULL || s->model == NULL || s->token == NULL ||
        s->tls_cert == NULL || s->tls_key == NULL || s->chartjs == NULL || s->models == NULL ||
        s->hosts == NULL || s->http == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "serve: out of memory");
        serve_destroy(s);
        return NULL;
    }
    evhttp_set_gencb(s->http, sv_dispatch, s);
    evhttp_set_max_body_size(s->http, (ev_ssize_t)conf->max_body);
    evhttp_set_max_headers_size(s->http, MAX_HEADERS);
    /* slowloris: a connection that does not finish its first request in
     * header_timeout is closed; sv_dispatch then allows a long-poll's wait */
    evhttp_set_timeout(s->http, conf->header_timeout_s);
    if (sv_conn_init(s, conf->max_connections) != 0) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "serve: out of memory");
        serve_destroy(s);
        return NULL;
    }
    evhttp_set_allowed_methods(s->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
                                            EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                            EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
    evhttp_set_default_content_type(s->http, "application/json");
    if (s->tls_cert[0] != '\0' && tls_setup(s, errstr, size) != 0) {
        serve_destroy(s);
        return NULL;
    }
    s->bound = evhttp_bind_socket_with_handle(s->http, host, (ev_uint16_t)port);
    if (s->bound == NULL) {
        fr_errorf(FR_ERR_IO, errstr, size, "serve: cannot listen on %s: %s", conf->listen,
                  strerror(errno));
        serve_destroy(s);
        return NULL;
    }
    sv_conn_listen(s);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(evhttp_bound_socket_get_fd(s->bound), (struct sockaddr *)&ss, &sl) == 0)
        s->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                           : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    s->notify = event_new(s->base, -1, 0, on_notify, s);
    s->stop_ev = event_new(s->base, -1, 0, on_stop, s);
    s->stop_wait = evtimer_new(s->base, on_stop_wait, s);
    if (s->notify == NULL || s->stop_ev == NULL || s->stop_wait == NULL ||
        sv_pool_init(&s->rows, s, "rows", ROWS_QUEUE_MAX) != 0 ||
        sv_pool_init(&s->infer, s, "infer", (size_t)conf->infer_queue) != 0) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "serve: out of memory");
        serve_destroy(s);
        return NULL;
    }

    if (register_metrics(s, errstr, size) != 0) {
        serve_destroy(s);
        return NULL;
    }
    read_chartjs(s);
    return s;
}

int serve_port(const serve_t *s)
{
    return s->port;
}

static void *loop_main(void *arg)
{
    struct serve *s = arg;
    fr_thread_name("fr-http");
    event_base_dispatch(s->base);
    return NULL;
}

fr_err_t serve_start(serve_t *s, char *errstr, size_t size)
{
    if (s->started)
        return FR_OK;
    if (pthread_create(&s->follow_thread, NULL, sv_follow_main, s) != 0)
        return fr_errorf(FR_ERR_NOMEM, errstr, size, "serve: cannot start a thread");
    if (sv_pool_start(&s->rows, 1, sv_rows_main) != 0 ||
        (s->conf.infer &&
         sv_pool_start(&s->infer, (size_t)s->conf.infer_threads, sv_infer_main) != 0) ||
        pthread_create(&s->loop_thread, NULL, loop_main, s) != 0) {
        pthread_mutex_lock(&s->lock);
        atomic_store(&s->stop, 1);
        pthread_cond_broadcast(&s->wake);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->follow_thread, NULL);
        sv_pool_join(&s->rows);
        sv_pool_join(&s->infer);
        atomic_store(&s->stop, 0); /* nothing runs: a later start may try again */
        return fr_errorf(FR_ERR_NOMEM, errstr, size, "serve: cannot start a thread");
    }
    s->started = 1;
    fr_log(FR_LOG_INFO, "serve: listening on %s%s (port %d)%s", s->listen,
           s->tls_cert[0] ? " with TLS" : "", s->port,
           s->token[0] ? "" : "; no token: replay and rollback are refused");
    return FR_OK;
}

void serve_stop(serve_t *s)
{
    if (s == NULL || !s->started)
        return;
    pthread_mutex_lock(&s->lock);
    atomic_store(&s->stop, 1);
    pthread_cond_broadcast(&s->wake);
    pthread_mutex_unlock(&s->lock);
    event_active(s->stop_ev, EV_READ, 0);
    pthread_join(s->loop_thread, NULL);
    pthread_join(s->follow_thread, NULL);
    sv_pool_join(&s->rows);
    sv_pool_join(&s->infer);
    s->started = 0;
}

void serve_destroy(serve_t *s)
{
    if (s == NULL)
        return;
    serve_stop(s);
    sv_conn_unlisten(s); /* before evhttp_free frees the listener */
    s->closing = 1;      /* evhttp_free frees the listener before the connections */
    if (s->http != NULL)
        evhttp_free(s->http); /* closes connections: waiters' and jobs' close callbacks run */
    sv_conn_fini(s);          /* the connections' sockets close */
    sv_pool_fini(&s->rows);
    sv_pool_fini(&s->infer);
    if (s->notify != NULL)
        event_free(s->notify);
    if (s->stop_ev != NULL)
        event_free(s->stop_ev);
    if (s->stop_wait != NULL)
        event_free(s->stop_wait);
    if (s->base != NULL)
        event_base_free(s->base);
    if (s->ssl_ctx != NULL)
        SSL_CTX_free(s->ssl_ctx);
    psstore_conn_destroy(s->op_conn);
    for (size_t i = 0; i < s->nmodels; i++) {
        sv_model_t *m = s->models[i];
        sv_view_unref(m->cur);
        for (size_t j = 0; j < m->nsnaps; j++)
            sv_view_unref(m->snaps[j]);
        sv_blob_unref(m->stats);
        sv_blob_unref(m->meta);
        free(m);
    }
    for (size_t i = 0; i < s->nnames; i++)
        free(s->names[i]);
    free(s->names);
    free(s->models);
    free(s->chartjs_data);
    free(s->listen);
    free(s->redis_url);
    free(s->model);
    free(s->token);
    free(s->tls_cert);
    free(s->tls_key);
    free(s->chartjs);
    free(s->hosts);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->wake);
    free(s);
}
