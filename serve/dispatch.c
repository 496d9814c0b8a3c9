/*
 * dispatch.c - what the loop does with a request before any route: the
 * headers no handler may see, the allowed Host names, the bearer token,
 * the path and query decoded, and the route it goes to (routes.c,
 * rows_sparse.c, infer.c).
 *
 * Threads: the loop only.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>

#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "serve/http_int.h"

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

void sv_dispatch(struct evhttp_request *req, void *arg)
{
    struct serve *s = arg;
    /* a request arrived whole: the connection may now wait as long as a
     * long-poll (and stay open between requests as long) */
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    /* plain text on a TLS port (conn.c could not make a session): no
     * answer, no action; the sweep closes it */
    if (s->ssl_ctx != NULL && evcon != NULL &&
        bufferevent_openssl_get_ssl(evhttp_connection_get_bufferevent(evcon)) == NULL)
        return;
    if (evcon != NULL) {
        evhttp_connection_set_timeout(evcon, SV_CONN_TIMEOUT_S);
        sv_conn_seen(s, evhttp_connection_get_bufferevent(evcon));
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
