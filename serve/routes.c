/*
 * routes.c - the answers of serve's routes: the models and their metadata,
 * the weights (latest, long-poll and retained snapshots), stats, health,
 * metrics, the dashboard, and the replay and rollback requests
 * (docs/design.md "Snapshots and publishing"). dispatch.c dispatches to them.
 *
 * Threads: the loop thread only. Each sv_route_* answers its request
 * itself (the error too, where it finds it), or hands it to a waiter.
 * Only replay and rollback talk to Redis from the loop: an operator's
 * rare request, on its own connection with a short timeout.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "serve/http_int.h"

#define OP_TIMEOUT_MS 1000 /* Redis timeout of replay and rollback     */
#define FRESH_WAIT_MS 5000 /* a model's weights or stats being read */

extern const unsigned char serve_dashboard_html[];
extern const size_t serve_dashboard_html_len;

/* Parses a non-negative decimal into *v; -1 when it is not one. */
static int parse_i64(const char *text, int64_t *v)
{
    if (text == NULL || *text == '\0' || *text == '-' || *text == '+')
        return -1;
    char *end;
    errno = 0;
    long long x = strtoll(text, &end, 10);
    if (errno != 0 || *end != '\0' || x < 0)
        return -1;
    *v = x;
    return 0;
}

sv_model_t *sv_find_model(struct serve *s, struct evhttp_request *req, const char *name, int stats,
                          int *was_followed)
{
    pthread_mutex_lock(&s->lock);
    int listed = 0;
    for (size_t i = 0; i < s->nnames && !listed; i++)
        listed = strcmp(s->names[i], name) == 0;
    sv_model_t *m = sv_model_get(s, name, listed);
    int known = s->models_ms > 0, up = s->store_up;
    char why[256];
    snprintf(why, sizeof(why), "%s", s->store_error);
    if (m != NULL) {
        int64_t now = fr_clock_unix_ms();
        int64_t *mark = stats ? &m->stats_wanted_ms : &m->wanted_ms;
        if (was_followed != NULL)
            *was_followed = now - *mark < (stats ? SV_STATS_WANTED_MS : SV_WANTED_MS);
        *mark = now;
    }
    int have = m != NULL && (m->present || m->cur != NULL);
    pthread_mutex_unlock(&s->lock);
    if (m != NULL && (have || listed))
        return m;
    if (!known && !up) {
        sv_send_error(s, req, 503, "store unreachable: %s", why[0] ? why : "not connected yet");
        return NULL;
    }
    if (listed) { /* too many models followed */
        sv_send_error(s, req, 503, "serving at most %d models", s->conf.max_models);
        return NULL;
    }
    sv_send_error(s, req, 404, "no model '%s'", name);
    return NULL;
}

void sv_route_models(struct serve *s, struct evhttp_request *req)
{
    pthread_mutex_lock(&s->lock);
    int known = s->models_ms > 0;
    fr_buf_t b = {0};
    fr_buf_puts(&b, "{\"models\":[");
    for (size_t i = 0; i < s->nnames; i++) {
        fr_buf_puts(&b, i ? "," : "");
        fr_json_str(&b, s->names[i]);
    }
    fr_buf_puts(&b, "],\"default\":");
    if (s->model[0] != '\0')
        fr_json_str(&b, s->model);
    else if (s->nnames > 0)
        fr_json_str(&b, s->names[0]);
    else
        fr_buf_puts(&b, "null");
    fr_buf_puts(&b, "}\n");
    char why[256];
    snprintf(why, sizeof(why), "%s", s->store_error);
    pthread_mutex_unlock(&s->lock);
    if (!known) {
        fr_buf_fini(&b);
        sv_send_error(s, req, 503, "store unreachable: %s", why[0] ? why : "not connected yet");
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Cache-Control", "no-cache");
    sv_send_text(s, req, 200, "application/json", b.p, b.len);
    fr_buf_fini(&b);
}

void sv_route_model(struct serve *s, struct evhttp_request *req, const char *name)
{
    sv_model_t *m = sv_find_model(s, req, name, 0, NULL);
    if (m == NULL)
        return;
    pthread_mutex_lock(&s->lock);
    sv_blob_t *meta = m->present ? sv_blob_ref(m->meta) : NULL;
    pthread_mutex_unlock(&s->lock);
    if (meta == NULL) {
        sv_send_error(s, req, 503, "metadata of model '%s' not read yet", name);
        return;
    }
    sv_send_blob(s, req, 200, "application/json", meta);
}

void sv_route_model_ready(struct serve *s, struct evhttp_request *req, const char *name)
{
    sv_model_t *m = sv_find_model(s, req, name, 0, NULL);
    if (m == NULL)
        return;
    pthread_mutex_lock(&s->lock);
    /* a sparse model has no weights to load: its rows are read per request */
    int sparse = m->present && m->info.sparse[0] != '\0';
    int have = m->cur != NULL || sparse;
    char stopped[256];
    snprintf(stopped, sizeof(stopped), "%s", m->info.stopped);
    int64_t version = m->cur != NULL ? m->cur->version : sparse ? m->info.version : -1;
    pthread_mutex_unlock(&s->lock);
    if (!have) {
        sv_send_error(s, req, 503, "model '%s' has no weights loaded yet", name);
        return;
    }
    if (stopped[0] != '\0') {
        sv_send_error(s, req, 503, "model '%s' stopped by the divergence guard: %s", name, stopped);
        return;
    }
    char body[160];
    int n = snprintf(body, sizeof(body), "{\"name\":\"%s\",\"ready\":true,\"version\":%lld}\n",
                     name, (long long)version);
    sv_send_text(s, req, 200, "application/json", body, (size_t)n);
}

static int parse_fmt(const char *text, enum sv_fmt *f)
{
    if (text == NULL || strcmp(text, "safetensors") == 0)
        *f = SV_FMT_SAFETENSORS;
    else if (strcmp(text, "raw") == 0 || strcmp(text, "f32") == 0)
        *f = SV_FMT_RAW;
    else if (strcmp(text, "json") == 0)
        *f = SV_FMT_JSON;
    else
        return -1;
    return 0;
}

/* Parses an ETag "\"<epoch>-v<version>\"" (quotes optional). */
static int parse_etag(const char *t, uint64_t *epoch, int64_t *version)
{
    unsigned long long e;
    long long v;
    char tail;
    if (t == NULL)
        return -1;
    if (*t == 'W' && t[1] == '/')
        t += 2;
    if (sscanf(t, "\"%llu-v%lld\"%c", &e, &v, &tail) == 2 ||
        sscanf(t, "%llu-v%lld%c", &e, &v, &tail) == 2) {
        *epoch = e;
        *version = v;
        return 0;
    }
    return -1;
}

void sv_route_weights(struct serve *s, struct evhttp_request *req, const char *name,
                      struct evkeyvalq *params)
{
    enum sv_fmt f;
    if (parse_fmt(evhttp_find_header(params, "format"), &f) != 0) {
        sv_send_error(s, req, 400, "format must be safetensors, raw or json");
        return;
    }
    const char *after_s = evhttp_find_header(params, "after_version");
    const char *wait_s = evhttp_find_header(params, "wait");
    int64_t after = -1, wait = 0;
    if (after_s != NULL && parse_i64(after_s, &after) != 0) {
        sv_send_error(s, req, 400, "after_version must be a version number (>= 0)");
        return;
    }
    if (wait_s != NULL && (parse_i64(wait_s, &wait) != 0 || wait > SERVE_MAX_WAIT_S)) {
        sv_send_error(s, req, 400, "wait must be whole seconds from 0 to %d", SERVE_MAX_WAIT_S);
        return;
    }
    if (wait > 0 && after < 0) {
        sv_send_error(s, req, 400, "wait needs after_version");
        return;
    }
    sv_latest_t l;
    sv_model_t *m = sv_find_latest(s, req, name, &l);
    if (m == NULL)
        return;
    if (l.stale) { /* the follower reads the newest now, and the request waits for them */
        int64_t want = l.had_version < 0 ? -1 : l.known_version;
        sv_waiter_t *w =
            sv_waiter_add(s, req, m, f, SV_W_FRESH, l.known_epoch, want, 1, FRESH_WAIT_MS);
        if (w == NULL) {
            sv_send_error(s, req, 500, "out of memory");
            return;
        }
        w->had_epoch = l.had_epoch;
        w->had_version = l.had_version;
        w->after = after;
        w->wait_ms = (int)wait * 1000;
        w->t0_ns = fr_clock_mono_ns();
        pthread_cond_broadcast(&s->wake);
        return;
    }
    sv_send_weights(s, req, m, l.cur, f, after, (int)wait * 1000);
}

sv_model_t *sv_find_latest(struct serve *s, struct evhttp_request *req, const char *name,
                           sv_latest_t *l)
{
    int followed = 0;
    sv_model_t *m = sv_find_model(s, req, name, 0, &followed);
    if (m == NULL)
        return NULL;
    pthread_mutex_lock(&s->lock);
    sv_view_t *cur = sv_view_ref(m->cur);
    l->known_epoch = m->info.epoch;
    l->known_version = m->present ? m->info.version : -1;
    l->sparse = m->present && m->info.sparse[0] != '\0';
    pthread_mutex_unlock(&s->lock);
    l->had_epoch = cur != NULL ? cur->epoch : 0;
    l->had_version = cur != NULL ? cur->version : -1;
    /* the weights of a model nobody asked for lately are not kept current */
    l->stale = cur == NULL ||
               (!followed && (cur->epoch != l->known_epoch || cur->version < l->known_version));
    if (l->stale)
        sv_view_unref(cur);
    l->cur = l->stale ? NULL : cur;
    return m;
}

/* Answers a weights request with cur (whose reference it takes), or, for a
 * long-poll (after >= 0) whose client has cur's version, waits up to
 * wait_ms for another. */
void sv_send_weights(struct serve *s, struct evhttp_request *req, sv_model_t *m, sv_view_t *cur,
                     enum sv_fmt f, int64_t after, int wait_ms)
{
    if (after >= 0) {
        uint64_t epoch = cur->epoch;
        int64_t inm_version;
        int any_epoch = 1;
        const char *inm =
            evhttp_find_header(evhttp_request_get_input_headers(req), "If-None-Match");
        if (parse_etag(inm, &epoch, &inm_version) == 0)
            any_epoch = 0;
        int newer = cur->version != after || (!any_epoch && cur->epoch != epoch);
        if (!newer) {
            sv_view_unref(cur);
            if (sv_waiter_add(s, req, m, f, SV_W_POLL, epoch, after, any_epoch, wait_ms) == NULL)
                sv_send_error(s, req, 500, "out of memory");
            return;
        }
        /* a newer one exists: answer it whatever If-None-Match says */
        evhttp_remove_header(evhttp_request_get_input_headers(req), "If-None-Match");
    }
    sv_send_view(s, req, m, cur, f);
}

void sv_route_snapshot(struct serve *s, struct evhttp_request *req, const char *name,
                       const char *vtext, struct evkeyvalq *params)
{
    enum sv_fmt f;
    int64_t version;
    if (parse_fmt(evhttp_find_header(params, "format"), &f) != 0) {
        sv_send_error(s, req, 400, "format must be safetensors, raw or json");
        return;
    }
    if (parse_i64(vtext, &version) != 0) {
        sv_send_error(s, req, 400, "bad version '%s'", vtext);
        return;
    }
    sv_model_t *m = sv_find_model(s, req, name, 0, NULL);
    if (m == NULL)
        return;
    pthread_mutex_lock(&s->lock);
    sv_view_t *v = NULL;
    int listed = 0;
    for (size_t i = 0; i < m->nsnaps && v == NULL; i++)
        if (m->snaps[i]->version == version)
            v = sv_view_ref(m->snaps[i]);
    for (size_t i = 0; i < m->nlisted && !listed; i++)
        listed = m->listed[i].version == version && !sv_cache_snapshot_unserved(m, version);
    pthread_mutex_unlock(&s->lock);
    if (v == NULL && listed) { /* retained, not read here yet: asking made it wanted */
        pthread_cond_broadcast(&s->wake);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
        sv_send_error(s, req, 503, "model '%s': snapshot %lld is being read; try again", name,
                      (long long)version);
        return;
    }
    if (v == NULL) {
        sv_send_error(s, req, 404, "model '%s' retains no snapshot of version %lld in this epoch",
                      name, (long long)version);
        return;
    }
    sv_send_view(s, req, m, v, f);
}

/* The stats of m as the follower last built them, or a 503 saying why. */
void sv_send_stats(struct serve *s, struct evhttp_request *req, sv_model_t *m)
{
    pthread_mutex_lock(&s->lock);
    int up = s->store_up;
    char why[256];
    snprintf(why, sizeof(why), "%s", s->store_error);
    sv_blob_t *stats = sv_blob_ref(m->stats);
    pthread_mutex_unlock(&s->lock);
    if (!up) {
        sv_blob_unref(stats);
        sv_send_error(s, req, 503, "store unreachable: %s", why);
        return;
    }
    if (stats == NULL) {
        sv_send_error(s, req, 503, "stats of model '%s' are not read yet", m->name);
        return;
    }
    sv_send_blob(s, req, 200, "application/json", stats);
}

void sv_route_stats(struct serve *s, struct evhttp_request *req, const char *name)
{
    int followed = 0;
    sv_model_t *m = sv_find_model(s, req, name, 1, &followed);
    if (m == NULL)
        return;
    /* stats are built while someone asks for them: the first request (or
     * the first after a pause) waits for a fresh build */
    pthread_mutex_lock(&s->lock);
    uint64_t seq = m->stats_seq;
    int up = s->store_up, have = m->stats != NULL;
    pthread_mutex_unlock(&s->lock);
    if ((followed && have) || !up) {
        sv_send_stats(s, req, m); /* (503 while the store is unreachable) */
        return;
    }
    sv_waiter_t *w = sv_waiter_add(s, req, m, SV_FMT_JSON, SV_W_STATS, 0, 0, 1, FRESH_WAIT_MS);
    if (w == NULL) {
        sv_send_error(s, req, 500, "out of memory");
        return;
    }
    w->stats_seq = seq;
    pthread_cond_broadcast(&s->wake);
}

/* The loop's own connection for operator requests. */
static psstore_conn_t *op_conn(struct serve *s, struct evhttp_request *req)
{
    char why[256];
    if (!sv_store_up(s, why)) {
        sv_send_error(s, req, 503, "store unreachable: %s", why);
        return NULL;
    }
    if (s->op_conn == NULL) {
        char errstr[256];
        s->op_conn = psstore_conn_new(s->redis_url, OP_TIMEOUT_MS, errstr, sizeof(errstr));
        if (s->op_conn == NULL) {
            sv_send_error(s, req, 503, "store unreachable: %s", errstr);
            return NULL;
        }
    }
    return s->op_conn;
}

static void op_failed(struct serve *s, struct evhttp_request *req)
{
    sv_send_error(s, req, 503, "store: %s", psstore_conn_error(s->op_conn));
    psstore_conn_destroy(s->op_conn);
    s->op_conn = NULL;
}

static int parse_bool(const char *t, int *v)
{
    if (t == NULL || strcmp(t, "false") == 0 || strcmp(t, "0") == 0 || strcmp(t, "") == 0)
        *v = 0;
    else if (strcmp(t, "true") == 0 || strcmp(t, "1") == 0 || strcmp(t, "on") == 0)
        *v = 1;
    else
        return -1;
    return 0;
}

void sv_route_replay(struct serve *s, struct evhttp_request *req, const char *name,
                     struct evkeyvalq *params)
{
    const char *verb = evhttp_find_header(params, "verb");
    const char *arg = evhttp_find_header(params, "arg");
    const char *topic = evhttp_find_header(params, "topic");
    int execute;
    if (parse_bool(evhttp_find_header(params, "execute"), &execute) != 0) {
        sv_send_error(s, req, 400, "execute must be true or false");
        return;
    }
    if (verb == NULL) {
        sv_send_error(s, req, 400,
                      "verb is required: to-earliest, to-latest, to-offset, to-datetime, "
                      "by-duration or shift-by");
        return;
    }
    if (arg != NULL && arg[0] == '\0')
        arg = NULL;
    psstore_replay_t *r = calloc(1, sizeof(*r));
    char spec[PSSTORE_REPLAY_SPEC_MAX], errstr[256];
    if (r == NULL) {
        sv_send_error(s, req, 500, "out of memory");
        return;
    }
    if (psstore_replay_from_verb(r, verb, arg, fr_clock_unix_ms(), errstr, sizeof(errstr)) !=
        FR_OK) {
        free(r);
        sv_send_error(s, req, 400, "%s", errstr);
        return;
    }
    if (topic != NULL && topic[0] != '\0') {
        if (strlen(topic) >= sizeof(r->topic)) {
            free(r);
            sv_send_error(s, req, 400, "topic too long");
            return;
        }
        snprintf(r->topic, sizeof(r->topic), "%s", topic);
    }
    if (psstore_replay_format(r, spec, sizeof(spec)) != FR_OK) {
        free(r);
        sv_send_error(s, req, 400, "not a valid replay request (topic or values out of range)");
        return;
    }
    if (sv_find_model(s, req, name, 0, NULL) == NULL) {
        free(r);
        return;
    }
    psstore_conn_t *c = op_conn(s, req);
    if (c == NULL) {
        free(r);
        return;
    }
    fr_buf_t b = {0};
    fr_buf_puts(&b, "{\"model\":");
    fr_json_str(&b, name);
    fr_buf_puts(&b, ",\"request\":");
    fr_json_str(&b, spec);
    if (!execute) {
        /* the plan: each partition the store knows, its watermark and target */
        psstore_partition_status_t *parts = NULL;
        size_t n = 0, cap = 0;
        if (psstore_partitions_read(c, name, &parts, &n, &cap) != FR_OK) {
            free(r);
            free(parts);
            fr_buf_fini(&b);
            op_failed(s, req);
            return;
        }
        fr_buf_puts(&b, ",\"dry_run\":true,\"plan\":[");
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (!psstore_replay_applies(r, parts[i].topic, parts[i].partition, NULL))
                continue;
            char target[160];
            psstore_replay_describe(r, parts[i].partition, target, sizeof(target));
            fr_buf_puts(&b, k++ ? ",{\"topic\":" : "{\"topic\":");
            fr_json_str(&b, parts[i].topic);
            fr_buf_printf(&b, ",\"partition\":%d,\"watermark\":%lld,\"log_end\":",
                          (int)parts[i].partition, (long long)parts[i].watermark);
            if (parts[i].log_end >= 0)
                fr_buf_printf(&b, "%lld", (long long)parts[i].log_end);
            else
                fr_buf_puts(&b, "null");
            fr_buf_puts(&b, ",\"target\":");
            fr_json_str(&b, target);
            fr_buf_puts(&b, "}");
        }
        fr_buf_puts(&b, "],\"note\":\"dry run: nothing changed (execute=true stores the request; "
                        "the owning consumers resolve the targets against Kafka)\"}\n");
        free(parts);
        free(r);
        sv_send_text(s, req, 200, "application/json", b.p, b.len);
        fr_buf_fini(&b);
        return;
    }
    free(r);
    char id[64];
    if (psstore_request_replay(c, name, spec, id) != FR_OK) {
        fr_buf_fini(&b);
        op_failed(s, req);
        return;
    }
    fr_log(FR_LOG_INFO, "serve: replay of model '%s' requested over HTTP: %s (request %s)", name,
           spec, id);
    fr_buf_puts(&b, ",\"dry_run\":false,\"request_id\":");
    fr_json_str(&b, id);
    fr_buf_puts(&b, ",\"note\":\"stored: the applier publishes it under the next replay "
                    "generation\"}\n");
    sv_send_text(s, req, 202, "application/json", b.p, b.len);
    fr_buf_fini(&b);
}

void sv_route_rollback(struct serve *s, struct evhttp_request *req, const char *name,
                       struct evkeyvalq *params)
{
    int64_t version;
    if (parse_i64(evhttp_find_header(params, "version"), &version) != 0) {
        sv_send_error(s, req, 400, "version (a retained snapshot's version) is required");
        return;
    }
    if (sv_find_model(s, req, name, 0, NULL) == NULL)
        return;
    psstore_conn_t *c = op_conn(s, req);
    if (c == NULL)
        return;
    psstore_snapshot_info_t list[SV_MAX_SNAPS];
    size_t n;
    if (psstore_snapshots_list(c, name, list, SV_MAX_SNAPS, &n) != FR_OK) {
        op_failed(s, req);
        return;
    }
    int retained = 0;
    for (size_t i = 0; i < n && !retained; i++)
        retained = list[i].version == version;
    if (!retained) {
        sv_send_error(s, req, 404, "model '%s' retains no snapshot of version %lld", name,
                      (long long)version);
        return;
    }
    char id[64];
    if (psstore_request_rollback(c, name, version, id) != FR_OK) {
        op_failed(s, req);
        return;
    }
    fr_log(FR_LOG_INFO,
           "serve: rollback of model '%s' to snapshot %lld requested over HTTP "
           "(request %s)",
           name, (long long)version, id);
    char body[256];
    int len = snprintf(body, sizeof(body),
                       "{\"model\":\"%s\",\"version\":%lld,\"request_id\":\"%s\",\"note\":"
                       "\"stored: the applier restores it as a new version of a new epoch\"}\n",
                       name, (long long)version, id);
    sv_send_text(s, req, 202, "application/json", body, (size_t)len);
}

void sv_route_metrics(struct serve *s, struct evhttp_request *req)
{
    size_t len;
    char *text = fr_metrics_render(s->conf.metrics, &len);
    if (text == NULL) {
        sv_send_error(s, req, 500, "out of memory");
        return;
    }
    sv_send_text(s, req, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
    free(text);
}

/* /readyz: the store answers and the default model is served and running. */
void sv_route_ready(struct serve *s, struct evhttp_request *req)
{
    pthread_mutex_lock(&s->lock);
    char why[400] = "";
    if (!s->store_up) {
        snprintf(why, sizeof(why), "store unreachable: %s",
                 s->store_error[0] ? s->store_error : "not connected yet");
    } else if (s->model[0] != '\0') {
        sv_model_t *m = sv_model_get(s, s->model, 0);
        if (m == NULL || !m->present)
            snprintf(why, sizeof(why), "no model '%s' in the store", s->model);
        else if (m->info.stopped[0] != '\0')
            snprintf(why, sizeof(why), "model '%s' stopped by the divergence guard: %s", s->model,
                     m->info.stopped);
        else if (m->cur == NULL && m->info.sparse[0] == '\0')
            snprintf(why, sizeof(why), "model '%s': weights not loaded yet%s%s", s->model,
                     m->error[0] ? ": " : "", m->error);
    }
    pthread_mutex_unlock(&s->lock);
    if (why[0] != '\0') {
        sv_send_error(s, req, 503, "%s", why);
        return;
    }
    sv_send_text(s, req, 200, "application/json", "{\"ready\":true}\n", 15);
}

void sv_route_dashboard(struct serve *s, struct evhttp_request *req, const char *path)
{
    if (strcmp(path, "/dashboard/chart.min.js") == 0) {
        if (s->chartjs_data == NULL) {
            sv_send_error(s, req, 404,
                          "Chart.js not found at %s (Debian: apt-get install "
                          "libjs-chart.js)",
                          s->chartjs);
            return;
        }
        evhttp_add_header(evhttp_request_get_output_headers(req), "Cache-Control",
                          "public, max-age=86400");
        struct evbuffer *b = evbuffer_new();
        if (b != NULL)
            evbuffer_add_reference(b, s->chartjs_data, s->chartjs_len, NULL, NULL);
        sv_send_buf(s, req, 200, "text/javascript; charset=utf-8", b);
        if (b != NULL)
            evbuffer_free(b);
        return;
    }
    if (strcmp(path, "/dashboard") != 0 && strcmp(path, "/dashboard/") != 0) {
        sv_send_error(s, req, 404, "no such page");
        return;
    }
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evhttp_add_header(h, "Content-Security-Policy",
                      "default-src 'self'; script-src 'self' 'unsafe-inline'; "
                      "style-src 'self' 'unsafe-inline'; img-src 'self' data:");
    struct evbuffer *b = evbuffer_new();
    if (b != NULL)
        evbuffer_add_reference(b, serve_dashboard_html, serve_dashboard_html_len, NULL, NULL);
    sv_send_buf(s, req, 200, "text/html; charset=utf-8", b);
    if (b != NULL)
        evbuffer_free(b);
}
