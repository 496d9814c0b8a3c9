/*
 * http.c - the libevent loop of serve: listening (with TLS), connections,
 * the bearer token, dispatch to the routes (routes.c), the answers with
 * their metrics, and the waiting clients: long-poll and first reads
 * (docs/design.md "Snapshots and publishing").
 *
 * Every read is answered from what the follower published (shared,
 * encoded once): a request costs no Redis read and no copy of the weights
 * (evbuffer_add_reference). A long-poll client costs a timer and a list
 * entry, no thread; the connection's close callback drops it at once when
 * it hangs up. Only replay and rollback talk to Redis from the loop: an
 * operator's rare request, on its own connection with a short timeout.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "serve/serve_int.h"

#define CONN_TIMEOUT_S (SERVE_MAX_WAIT_S + 30)
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

void sv_notify(struct serve *s)
{
    if (s->notify != NULL)
        event_active(s->notify, EV_READ, 0);
}

/* ---- responses ----------------------------------------------------------- */

static const char *route_name(const char *path)
{
    if (strncmp(path, "/v2/models", 10) == 0) {
        if (strstr(path, "/versions/") != NULL)
            return "snapshot";
        const char *last = strrchr(path, '/');
        if (strcmp(last, "/weights") == 0)
            return "weights";
        if (strcmp(last, "/stats") == 0)
            return "stats";
        if (strcmp(last, "/replay") == 0)
            return "replay";
        if (strcmp(last, "/rollback") == 0)
            return "rollback";
        if (strcmp(last, "/ready") == 0)
            return "ready";
        if (strcmp(last, "/infer") == 0)
            return "infer";
        if (strcmp(last, "/rows") == 0 || strcmp(last, "/delta") == 0 ||
            strcmp(last, "/table") == 0)
            return last + 1; /* a sparse model's */
        return "models";
    }
    if (strncmp(path, "/dashboard", 10) == 0)
        return "dashboard";
    if (strcmp(path, "/metrics") == 0)
        return "metrics";
    if (strncmp(path, "/v2/health", 10) == 0 || strcmp(path, "/livez") == 0 ||
        strcmp(path, "/readyz") == 0 || strcmp(path, "/healthz") == 0)
        return "health";
    return "other";
}

static void count(struct serve *s, struct evhttp_request *req, int code, size_t bytes)
{
    const char *uri = evhttp_request_get_uri(req);
    char path[256];
    size_t n = strcspn(uri != NULL ? uri : "", "?");
    snprintf(path, sizeof(path), "%.*s", (int)(n < sizeof(path) ? n : sizeof(path) - 1),
             uri != NULL ? uri : "");
    char code_s[8];
    snprintf(code_s, sizeof(code_s), "%d", code);
    const char *route = route_name(path);
    const char *lv[] = {route, code_s};
    fr_series_add(fr_metric_series(s->m_requests, lv), 1);
    const char *bv[] = {route};
    fr_series_add(fr_metric_series(s->m_bytes, bv), (double)bytes);
}

static const char *reason_phrase(int code)
{
    switch (code) {
    case 200: return "OK";
    case 202: return "Accepted";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
    }
}

void sv_send_buf(struct serve *s, struct evhttp_request *req, int code, const char *type,
                 struct evbuffer *body)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    if (type != NULL)
        evhttp_add_header(h, "Content-Type", type);
    size_t bytes = body != NULL ? evbuffer_get_length(body) : 0;
    if (evhttp_request_get_command(req) == EVHTTP_REQ_HEAD) {
        /* evhttp would write the body after the headers of a HEAD answer */
        char len[32];
        snprintf(len, sizeof(len), "%zu", bytes);
        evhttp_add_header(h, "Content-Length", len);
        count(s, req, code, 0);
        evhttp_send_reply(req, code, reason_phrase(code), NULL);
        return;
    }
    count(s, req, code, bytes);
    evhttp_send_reply(req, code, reason_phrase(code), body);
}

void sv_send_text(struct serve *s, struct evhttp_request *req, int code, const char *type,
                  const char *text, size_t len)
{
    struct evbuffer *b = evbuffer_new();
    if (b != NULL)
        evbuffer_add(b, text, len);
    sv_send_buf(s, req, code, type, b);
    if (b != NULL)
        evbuffer_free(b);
}

void sv_send_error(struct serve *s, struct evhttp_request *req, int code, const char *fmt, ...)
{
    fr_buf_t b = {0};
    va_list ap;
    va_start(ap, fmt);
    sv_json_error(&b, fmt, ap);
    va_end(ap);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Cache-Control", "no-store");
    sv_send_text(s, req, code, "application/json", b.p ? b.p : "{}", b.p ? b.len : 2);
    fr_buf_fini(&b);
}

static void blob_done(const void *data, size_t len, void *arg)
{
    sv_blob_unref(arg);
}

static void view_done(const void *data, size_t len, void *arg)
{
    sv_view_unref(arg);
}

void sv_send_blob(struct serve *s, struct evhttp_request *req, int code, const char *type,
                  sv_blob_t *blob)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL || evbuffer_add_reference(b, blob->data, blob->len, blob_done, blob) != 0) {
        sv_blob_unref(blob);
        if (b != NULL)
            evbuffer_free(b);
        sv_send_error(s, req, 500, "out of memory");
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Cache-Control", "no-cache");
    sv_send_buf(s, req, code, type, b);
    evbuffer_free(b);
}

/* ---- the JSON form of weights, made once per view ---------------------------- */

/* The JSON of v, made here (the loop) unless the follower made it before
 * publishing v; clients asking for JSON make the follower encode the next
 * versions. */
static sv_blob_t *view_json(struct serve *s, sv_model_t *m, sv_view_t *v)
{
    const char *lv[] = {m->name, "request"};
    pthread_mutex_lock(&s->lock);
    m->json_wanted_ms = fr_clock_unix_ms();
    pthread_mutex_unlock(&s->lock);
    if (v->json != NULL)
        return sv_blob_ref(v->json);
    sv_blob_t *blob = sv_weights_json(m->name, v);
    if (blob == NULL)
        return NULL;
    fr_series_add(fr_metric_series(s->m_json, lv), 1);
    v->json = blob;
    return sv_blob_ref(blob);
}

/* Answers req with view v in format f (v's reference is taken). Under no
 * lock. layers/loss name the model for the JSON form and the headers. */
void sv_send_view(struct serve *s, struct evhttp_request *req, sv_model_t *m, sv_view_t *v,
                  enum sv_fmt f)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    char num[32];
    evhttp_add_header(h, "ETag", v->etag);
    snprintf(num, sizeof(num), "%lld", (long long)v->version);
    evhttp_add_header(h, "X-Freshet-Version", num);
    snprintf(num, sizeof(num), "%llu", (unsigned long long)v->epoch);
    evhttp_add_header(h, "X-Freshet-Epoch", num);
    if (v->shard_versions[0] != '\0') /* a sharded model: the version is their sum */
        evhttp_add_header(h, "X-Freshet-Shard-Versions", v->shard_versions);
    evhttp_add_header(h, "X-Freshet-Layers", v->layers);
    /* latest moves; a snapshot's URL has no epoch, so a recreated model may
     * reuse it: both are revalidated with the ETag, which has the epoch */
    evhttp_add_header(h, "Cache-Control", "no-cache");
    const char *inm = evhttp_find_header(evhttp_request_get_input_headers(req), "If-None-Match");
    if (inm != NULL && (strcmp(inm, v->etag) == 0 || strcmp(inm, "*") == 0)) {
        sv_view_unref(v);
        count(s, req, 304, 0);
        evhttp_send_reply(req, 304, "Not Modified", NULL);
        return;
    }
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        sv_view_unref(v);
        sv_send_error(s, req, 500, "out of memory");
        return;
    }
    int rc;
    const char *type = "application/octet-stream";
    if (f == SV_FMT_JSON) {
        sv_blob_t *j = view_json(s, m, v);
        sv_view_unref(v);
        if (j == NULL) {
            evbuffer_free(b);
            sv_send_error(s, req, 500, "encoding the weights as JSON failed");
            return;
        }
        rc = evbuffer_add_reference(b, j->data, j->len, blob_done, j);
        if (rc != 0)
            sv_blob_unref(j);
        type = "application/json";
    } else {
        char disp[160];
        snprintf(disp, sizeof(disp), "attachment; filename=\"%s-v%lld.%s\"", m->name,
                 (long long)v->version, f == SV_FMT_RAW ? "f32" : "safetensors");
        evhttp_add_header(h, "Content-Disposition", disp);
        if (f == SV_FMT_RAW) {
            evhttp_add_header(h, "X-Freshet-Dtype", "float32-le");
            rc = evbuffer_add_reference(b, v->st + v->raw_off, v->raw_len, view_done, v);
        } else {
            rc = evbuffer_add_reference(b, v->st, v->st_len, view_done, v);
        }
        if (rc != 0)
            sv_view_unref(v);
    }
    if (rc != 0) {
        evbuffer_free(b);
        sv_send_error(s, req, 500, "out of memory");
        return;
    }
    sv_send_buf(s, req, 200, type, b);
    evbuffer_free(b);
}

/* ---- waiters (long-poll and first reads) ----------------------------------- */

static void waiter_unlink(sv_waiter_t *w)
{
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
        count(s, req, 304, 0);
        evhttp_send_reply(req, 304, "Not Modified", NULL);
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
    w->next = m->waiters;
    if (m->waiters != NULL)
        m->waiters->prev = w;
    m->waiters = w;
    s->waiting++;
    fr_series_set(s->m_waiting, (double)s->waiting);
    return w;
}

/* The follower published: answers the waiters whose wait is over. */
static void on_notify(evutil_socket_t fd, short what, void *arg)
{
    struct serve *s = arg;
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

/* ---- request helpers -------------------------------------------------------- */

/* Constant-time comparison of the request's bearer token with ours. */
static int authorized(struct serve *s, struct evhttp_request *req)
{
    if (s->token[0] == '\0')
        return 0;
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    if (h == NULL || strncasecmp(h, "Bearer ", 7) != 0)
        return 0;
    const char *given = h + 7;
    size_t a = strlen(given), b = strlen(s->token);
    unsigned diff = (unsigned)(a != b);
    for (size_t i = 0; i < b; i++)
        diff |= (unsigned char)s->token[i] ^ (unsigned char)(i < a ? given[i] : 0);
    return diff == 0;
}

static void deny(struct serve *s, struct evhttp_request *req)
{
    if (s->token[0] == '\0') {
        sv_send_error(s, req, 403,
                      "no token configured: set [serve] token or FRESHET_TOKEN to allow this");
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate",
                      "Bearer realm=\"freshet\"");
    sv_send_error(s, req, 401, "missing or wrong bearer token");
}

/* The request's query string's parameters; -1 when it is malformed. A
 * POST's body is read by its route, once the token was checked
 * (sv_body_params). */
static int read_params(struct evhttp_request *req, struct evkeyvalq *params)
{
    TAILQ_INIT(params);
    const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(req);
    const char *q = u != NULL ? evhttp_uri_get_query(u) : NULL;
    if (q != NULL && evhttp_parse_query_str(q, params) != 0)
        return -1;
    return 0;
}

/* Splits "/v2/models/{m}[/rest]" into name[65] and rest; -1 when the
 * name is bad (too long or with characters names cannot have). */
static int split_model(const char *path, char *name, const char **rest)
{
    const char *p = path + strlen("/v2/models/");
    size_t n = strcspn(p, "/");
    if (n == 0 || n > 64)
        return -1;
    memcpy(name, p, n);
    name[n] = '\0';
    if (psstore_model_name_check(name, NULL, 0) != FR_OK)
        return -1;
    *rest = p + n;
    return 0;
}

static void method_not_allowed(struct serve *s, struct evhttp_request *req, const char *allow)
{
    evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", allow);
    sv_send_error(s, req, 405, "method not allowed here (allowed: %s)", allow);
}

/* Dispatches "/v2/models/{m}[/rest]" (path decoded, trailing slash cut). */
static void on_model_request(struct serve *s, struct evhttp_request *req, const char *path, int get,
                             int post, struct evkeyvalq *params)
{
    char name[65];
    const char *rest;
    if (split_model(path, name, &rest) != 0) {
        sv_send_error(s, req, 404, "no such model: names match [A-Za-z0-9._-]{1,64}");
        return;
    }
    char vtext[32], why[256];
    int code;
    if (strcmp(rest, "/replay") == 0 || strcmp(rest, "/rollback") == 0) {
        if (!post)
            method_not_allowed(s, req, "POST");
        else if (!authorized(s, req)) /* before the body is even read */
            deny(s, req);
        else if (sv_body_params(req, params, &code, why, sizeof(why)) != 0)
            sv_send_error(s, req, code, "%s", why);
        else if (rest[2] == 'e')
            sv_route_replay(s, req, name, params);
        else
            sv_route_rollback(s, req, name, params);
        return;
    }
    if (strcmp(rest, "/infer") == 0) { /* a read, though a POST */
        if (!post)
            method_not_allowed(s, req, "POST");
        else if (s->conf.protect_reads && !authorized(s, req))
            deny(s, req);
        else
            sv_route_infer(s, req, name, params);
        return;
    }
    if (!get) {
        method_not_allowed(s, req, "GET, HEAD");
        return;
    }
    if (rest[0] == '\0')
        sv_route_model(s, req, name);
    else if (strcmp(rest, "/ready") == 0)
        sv_route_model_ready(s, req, name);
    else if (strcmp(rest, "/weights") == 0)
        sv_route_weights(s, req, name, params);
    else if (strcmp(rest, "/stats") == 0)
        sv_route_stats(s, req, name);
    else if (strcmp(rest, "/rows") == 0)
        sv_route_rows(s, req, name, params);
    else if (strcmp(rest, "/delta") == 0)
        sv_route_delta(s, req, name, params);
    else if (strcmp(rest, "/table") == 0)
        sv_route_table(s, req, name, params);
    else if (sscanf(rest, "/versions/%31[^/]", vtext) == 1 &&
             strlen(rest) == strlen("/versions/") + strlen(vtext) + strlen("/weights") &&
             strcmp(rest + strlen("/versions/") + strlen(vtext), "/weights") == 0)
        sv_route_snapshot(s, req, name, vtext, params);
    else
        sv_send_error(s, req, 404, "no route %s", path);
}

/* RFC 9110's token characters: a header name has no others (no space
 * before its colon). */
static int token_char(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* Headers a handler must never see (RFC 9112 6.3, 5.1): a name that is
 * no token, more than one Content-Length or Host, Content-Length beside
 * Transfer-Encoding. libevent framed the body by the first length it
 * found, so the connection is closed after the 400: nothing smuggled
 * behind it is read. NULL, or why. */
static const char *bad_headers(struct evhttp_request *req)
{
    int lengths = 0, hosts = 0, chunked = 0;
    struct evkeyval *h;
    TAILQ_FOREACH(h, evhttp_request_get_input_headers(req), next)
    {
        for (const unsigned char *p = (const unsigned char *)h->key; *p; p++)
            if (!token_char(*p))
                return "a header name holds a character no name may have (a space before the "
                       "colon?)";
        lengths += strcasecmp(h->key, "Content-Length") == 0;
        hosts += strcasecmp(h->key, "Host") == 0;
        chunked += strcasecmp(h->key, "Transfer-Encoding") == 0;
    }
    if (lengths > 1)
        return "more than one Content-Length";
    if (hosts > 1)
        return "more than one Host";
    if (lengths > 0 && chunked > 0)
        return "both Content-Length and Transfer-Encoding";
    return NULL;
}

/* Whether the request's Host (its port cut) is one serve answers: a page
 * that rebinds a name of its own to 127.0.0.1 reads nothing. */
static int host_allowed(struct serve *s, struct evhttp_request *req)
{
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Host");
    if (s->hosts[0] == '\0' || h == NULL) /* any; HTTP/1.0 sends none */
        return 1;
    char name[260];
    size_t n;
    if (h[0] == '[') {
        const char *end = strchr(h, ']');
        n = end != NULL ? (size_t)(end - h - 1) : 0;
        h++;
    } else {
        const char *colon = strchr(h, ':');
        n = colon != NULL ? (size_t)(colon - h) : strlen(h);
    }
    if (n == 0 || n > 253)
        return 0;
    snprintf(name, sizeof(name), ",%.*s,", (int)n, h);
    for (char *p = name; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    return strstr(s->hosts, name) != NULL;
}

#define CONN_DOOMED 2 /* conn_seen: plain text on a TLS port, to close */

/* A request arrived whole on the connection of bev: the sweep's first-
 * request deadline no longer applies to it. Loop thread. */
static void conn_seen(struct serve *s, const struct bufferevent *bev)
{
    for (int i = s->open_conns - 1; i >= 0; i--)
        if (s->conns[i] == bev) {
            if (s->conn_seen[i] != CONN_DOOMED)
                s->conn_seen[i] = 1;
            return;
        }
}

static void on_request(struct evhttp_request *req, void *arg)
{
    struct serve *s = arg;
    /* a request arrived whole: the connection may now wait as long as a
     * long-poll (and stay open between requests as long) */
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    /* plain text on a TLS port (conn_bev could not make a session): no
     * answer, no action; the sweep closes it */
    if (s->ssl_ctx != NULL && evcon != NULL &&
        bufferevent_openssl_get_ssl(evhttp_connection_get_bufferevent(evcon)) == NULL)
        return;
    if (evcon != NULL) {
        evhttp_connection_set_timeout(evcon, CONN_TIMEOUT_S);
        conn_seen(s, evhttp_connection_get_bufferevent(evcon));
    }
    /* every answer, the errors and the deferred ones too */
    evhttp_add_header(evhttp_request_get_output_headers(req), "X-Content-Type-Options", "nosniff");
    const char *bad = bad_headers(req);
    if (bad != NULL) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
        fr_series_add(s->m_refused, 1);
        sv_send_error(s, req, 400, "malformed request: %s", bad);
        return;
    }
    if (!host_allowed(s, req)) {
        fr_series_add(s->m_refused, 1);
        sv_send_error(s, req, 403,
                      "Host not allowed here: add it to [serve] allowed_hosts (a page that "
                      "rebinds its name to this address must not read it)");
        return;
    }
    if (atomic_load(&s->stop)) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
        sv_send_error(s, req, 503, "server shutting down");
        return;
    }
    const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(req);
    const char *raw = u != NULL ? evhttp_uri_get_path(u) : NULL;
    if (raw == NULL || raw[0] != '/') {
        sv_send_error(s, req, 400, "bad request target");
        return;
    }
    size_t decoded = 0;
    char *path = evhttp_uridecode(raw, 0, &decoded);
    if (path == NULL || strlen(path) != decoded) { /* a %00 would cut the path short */
        free(path);
        sv_send_error(s, req, 400, "bad request target");
        return;
    }
    size_t plen = strlen(path);
    while (plen > 1 && path[plen - 1] == '/' && strcmp(path, "/dashboard/") != 0)
        path[--plen] = '\0';
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    int get = cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD, post = cmd == EVHTTP_REQ_POST;
    struct evkeyvalq params;
    if (read_params(req, &params) != 0) {
        evhttp_clear_headers(&params);
        free(path);
        sv_send_error(s, req, 400, "malformed query string");
        return;
    }

    int health = strcmp(path, "/livez") == 0 || strcmp(path, "/readyz") == 0 ||
                 strcmp(path, "/healthz") == 0 || strncmp(path, "/v2/health/", 11) == 0;
    if (health) {
        if (!get)
            method_not_allowed(s, req, "GET, HEAD");
        else if (strcmp(path, "/livez") == 0 || strcmp(path, "/v2/health/live") == 0)
            sv_send_text(s, req, 200, "application/json", "{\"live\":true}\n", 14);
        else if (strcmp(path, "/readyz") == 0 || strcmp(path, "/healthz") == 0 ||
                 strcmp(path, "/v2/health/ready") == 0)
            sv_route_ready(s, req);
        else
            sv_send_error(s, req, 404, "no route %s", path);
        goto out;
    }
    int dashboard = strcmp(path, "/dashboard") == 0 || strncmp(path, "/dashboard/", 11) == 0;
    if (dashboard) { /* the page and Chart.js are static: its data needs the token */
        if (!get)
            method_not_allowed(s, req, "GET, HEAD");
        else
            sv_route_dashboard(s, req, path);
        goto out;
    }
    if (s->conf.protect_reads && get && !authorized(s, req)) {
        deny(s, req);
        goto out;
    }
    if (strcmp(path, "/metrics") == 0) {
        if (!get)
            method_not_allowed(s, req, "GET, HEAD");
        else
            sv_route_metrics(s, req);
        goto out;
    }
    if (strcmp(path, "/v2/models") == 0) {
        if (!get)
            method_not_allowed(s, req, "GET, HEAD");
        else
            sv_route_models(s, req);
        goto out;
    }
    if (strncmp(path, "/v2/models/", 11) == 0) {
        on_model_request(s, req, path, get, post, &params);
        goto out;
    }
    if (strcmp(path, "/") == 0 && get) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Location", "/dashboard");
        sv_send_text(s, req, 302, "text/plain", "see /dashboard\n", 15);
        goto out;
    }
    sv_send_error(s, req, 404, "no route %s", path);
out:
    evhttp_clear_headers(&params);
    free(path);
}

/* ---- accept() failures --------------------------------------------------------- */

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
    for (int i = 0; i < s->open_conns; i++) {
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
                              (!s->conn_seen[i] && now - s->conn_since[i] > deadline)))
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
 * output frozen), on_request ignores it and the sweep closes it. Untracked
 * (beyond conns_cap) it waits for libevent's timeout; should even this
 * allocation fail, libevent makes a plain one, whose requests on_request
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
    bufferevent_incref(bev);
    s->conn_since[s->open_conns] = fr_clock_mono_ns();
    s->conn_seen[s->open_conns] = doomed ? CONN_DOOMED : 0;
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
        while (s->models[i]->waiters != NULL) {
            sv_waiter_t *w = s->models[i]->waiters;
            struct evhttp_request *req = w->req;
            waiter_finish(w);
            waiter_free(w);
            evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
            sv_send_error(s, req, 503, "server shutting down");
        }
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
        conf->header_timeout_s > CONN_TIMEOUT_S) {
        fr_errorf(FR_ERR_INVAL, errstr, size,
                  "serve: refresh_ms >= 0, max_body >= 1024, max_models >= 1, infer_threads "
                  "1..%d, infer_queue >= 1 and header_timeout 1..%d",
                  SV_POOL_THREADS_MAX, CONN_TIMEOUT_S);
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
    evhttp_set_gencb(s->http, on_request, s);
    evhttp_set_max_body_size(s->http, (ev_ssize_t)conf->max_body);
    evhttp_set_max_headers_size(s->http, MAX_HEADERS);
    /* slowloris: a connection that does not finish its first request in
     * header_timeout is closed; on_request then allows a long-poll's wait */
    evhttp_set_timeout(s->http, conf->header_timeout_s);
    s->max_conns = conn_cap(conf->max_connections);
    s->conns_cap = s->max_conns + 64; /* accepts already under way when the cap closes */
    s->conns = calloc((size_t)s->conns_cap, sizeof(*s->conns));
    s->conn_since = calloc((size_t)s->conns_cap, sizeof(*s->conn_since));
    s->conn_seen = calloc((size_t)s->conns_cap, sizeof(*s->conn_seen));
    if (s->conns == NULL || s->conn_since == NULL || s->conn_seen == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "serve: out of memory");
        serve_destroy(s);
        return NULL;
    }
    evhttp_set_bevcb(s->http, conn_bev, s);
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
    listener_register(s, 1);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(evhttp_bound_socket_get_fd(s->bound), (struct sockaddr *)&ss, &sl) == 0)
        s->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                           : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    s->notify = event_new(s->base, -1, 0, on_notify, s);
    s->stop_ev = event_new(s->base, -1, 0, on_stop, s);
    s->stop_wait = evtimer_new(s->base, on_stop_wait, s);
    s->accept_again = evtimer_new(s->base, on_accept_again, s);
    s->accept_pause_ms = ACCEPT_PAUSE_MIN_MS;
    s->sweep = event_new(s->base, -1, EV_PERSIST, conn_sweep, s);
    struct timeval sweep_tv = {0, CONN_SWEEP_MS * 1000};
    if (s->sweep == NULL || event_add(s->sweep, &sweep_tv) != 0) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "serve: out of memory");
        serve_destroy(s);
        return NULL;
    }
    if (s->notify == NULL || s->stop_ev == NULL || s->stop_wait == NULL ||
        s->accept_again == NULL || sv_pool_init(&s->rows, s, "rows", ROWS_QUEUE_MAX) != 0 ||
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
    listener_register(s, 0); /* before evhttp_free frees the listener */
    s->closing = 1;          /* evhttp_free frees the listener before the connections */
    if (s->http != NULL)
        evhttp_free(s->http); /* closes connections: waiters' and jobs' close callbacks run */
    for (int i = 0; i < s->open_conns; i++)
        bufferevent_decref(s->conns[i]); /* their sockets close */
    s->open_conns = 0;
    free(s->conns);
    free(s->conn_since);
    free(s->conn_seen);
    if (s->sweep != NULL)
        event_free(s->sweep);
    sv_pool_fini(&s->rows);
    sv_pool_fini(&s->infer);
    if (s->notify != NULL)
        event_free(s->notify);
    if (s->stop_ev != NULL)
        event_free(s->stop_ev);
    if (s->stop_wait != NULL)
        event_free(s->stop_wait);
    if (s->accept_again != NULL)
        event_free(s->accept_again);
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
