/*
 * send.c - the answers of the loop: every response goes out through
 * sv_send_*, which counts it in the metrics by route and status; the
 * weights go out as references to the view the follower encoded (no copy),
 * their JSON form made once per view.
 *
 * Threads: the loop only.
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "serve/http_int.h"

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

void sv_send_not_modified(struct serve *s, struct evhttp_request *req)
{
    count(s, req, 304, 0);
    evhttp_send_reply(req, 304, "Not Modified", NULL);
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
        sv_send_not_modified(s, req);
        return;
    }
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        sv_view_unref(v);
        sv_send_error(s, req, 500, "out of memory");
        return;
    }
    /* the payload lies inside the image: a wrong offset would send
     * whatever memory follows it */
    FR_ASSERT(v->raw_off <= v->st_len && v->raw_len <= v->st_len - v->raw_off);
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
