/*
 * http_int.h - private declarations of serve's HTTP loop: the answers, the
 * waiting clients, dispatch, the connections and the routes. Only
 * serve/ includes event2/.
 */
#ifndef FRESHET_SERVE_HTTP_INT_H
#define FRESHET_SERVE_HTTP_INT_H

#include "serve/serve_int.h"

/* A connection may wait this long: a long-poll's longest wait and a margin. */
#define SV_CONN_TIMEOUT_S (SERVE_MAX_WAIT_S + 30)

/* ------------------------------------------------------------------------
 * The HTTP loop: its answers (send.c), waiters (waiter.c), dispatch
 * (dispatch.c), connections (conn.c) and the routes it dispatches to
 * (routes.c, rows_sparse.c, infer.c). All of it runs on the loop thread.
 * ---------------------------------------------------------------------- */
struct evhttp_request;
struct evhttp_connection;
struct evbuffer;
struct evkeyvalq;
struct event;
struct bufferevent;

/* The forms of a model's weights. */
enum sv_fmt { SV_FMT_SAFETENSORS, SV_FMT_RAW, SV_FMT_JSON };

/* What a waiting client waits for. */
enum sv_wkind {
    SV_W_POLL,  /* long-poll: weights other than (epoch, version)            */
    SV_W_FRESH, /* weights at least (epoch, version) (any when version < 0):
                   the model was not followed, or not read yet              */
    SV_W_STATS, /* stats newer than stats_seq                                */
};

/* A client waiting on a model, in m->waiters; the loop's own. */
struct sv_waiter {
    sv_waiter_t *prev, *next;
    struct serve *s;
    sv_model_t *m;
    struct evhttp_request *req;
    struct evhttp_connection *evcon;
    struct event *timer;
    struct event *hup; /* the client closed its end while waiting */
    enum sv_fmt fmt;
    enum sv_wkind kind;
    uint64_t epoch; /* the client has (epoch, version) ...          */
    int64_t version;
    int any_epoch;      /* ... or version in whatever epoch is current  */
    uint64_t had_epoch; /* SV_W_FRESH: the weights held at the request  */
    int64_t had_version;
    int64_t after; /* SV_W_FRESH: the request's after_version (or -1) */
    int wait_ms;   /* ... and its wait, counted from t0_ns         */
    uint64_t t0_ns;
    uint64_t stats_seq; /* SV_W_STATS: the stats seen */
};

/* Answers (send.c). Each counts the answer in the metrics; type may be
 * NULL; body is borrowed (NULL: an empty body). */
void sv_send_buf(struct serve *s, struct evhttp_request *req, int code, const char *type,
                 struct evbuffer *body);
void sv_send_text(struct serve *s, struct evhttp_request *req, int code, const char *type,
                  const char *text, size_t len);
/* {"error": "..."} with code. */
void sv_send_error(struct serve *s, struct evhttp_request *req, int code, const char *fmt, ...)
    FR_PRINTF(4, 5);
/* A shared JSON document, referenced, not copied. Takes the reference. */
void sv_send_blob(struct serve *s, struct evhttp_request *req, int code, const char *type,
                  sv_blob_t *blob);
/* Answers req with view v in format f (v's reference is taken), or 304 when
 * the client's If-None-Match has it. Under no lock. */
void sv_send_view(struct serve *s, struct evhttp_request *req, sv_model_t *m, sv_view_t *v,
                  enum sv_fmt f);
/* 304 Not Modified, no body; the caller added the headers. */
void sv_send_not_modified(struct serve *s, struct evhttp_request *req);

/* Makes req wait on m, first in m->waiters (waiter.c), answered when its
 * wait is over (sv_waiter_wake) or after wait_ms; the caller fills the fields of its kind.
 * NULL when out of memory (req is then still the caller's to answer). */
sv_waiter_t *sv_waiter_add(struct serve *s, struct evhttp_request *req, sv_model_t *m,
                           enum sv_fmt f, enum sv_wkind kind, uint64_t epoch, int64_t version,
                           int any_epoch, int wait_ms);
/* The follower published: answers the waiters whose wait is over. */
void sv_waiter_wake(struct serve *s);
/* At stop: answers every client waiting on m with 503, its connection to
 * be closed. */
void sv_waiter_close_all(struct serve *s, sv_model_t *m);

/* evhttp's request callback (dispatch.c): checks the request's headers,
 * Host, token and path, and hands it to its route; arg is the server. */
void sv_dispatch(struct evhttp_request *req, void *arg);

/* The connections (conn.c): the cap (max_connections, 0: half the
 * descriptors this process may open), the sweep and the accept() pause
 * set up on s->http and s->base; -1 when out of memory (sv_conn_fini
 * frees what was made). */
int sv_conn_init(struct serve *s, int max_connections);
/* The bound listener's accept() failures paused (sv_conn_listen, once
 * bound), or no longer (sv_conn_unlisten, before evhttp_free). */
void sv_conn_listen(struct serve *s);
void sv_conn_unlisten(struct serve *s);
/* Drops the references to the connections (their sockets close) and frees
 * the rest, once evhttp_free closed the connections. */
void sv_conn_fini(struct serve *s);
/* A request arrived whole on the connection of bev: the sweep's
 * first-request deadline no longer applies to it. */
void sv_conn_seen(struct serve *s, const struct bufferevent *bev);

/* The model a request names (routes.c): NULL after answering 404 or 503.
 * Marks its weights (or stats, when stats) wanted; *was_followed (when
 * not NULL): whether they were wanted lately, so kept current. */
sv_model_t *sv_find_model(struct serve *s, struct evhttp_request *req, const char *name, int stats,
                          int *was_followed);
/* The model a request names (sv_find_model) and the latest weights the
 * request may use (routes.c): cur, a
 * reference, unless stale (nothing held yet, or a model not followed
 * lately whose weights moved since): then the request waits for the
 * follower's read of (known_epoch, known_version), the view it held being
 * (had_epoch, had_version; -1: none). sparse: a sparse model's. */
typedef struct sv_latest {
    sv_view_t *cur;
    int stale, sparse;
    uint64_t known_epoch, had_epoch;
    int64_t known_version, had_version;
} sv_latest_t;
sv_model_t *sv_find_latest(struct serve *s, struct evhttp_request *req, const char *name,
                           sv_latest_t *l);
/* Routes (routes.c): each answers req, or hands it to a waiter. name is a
 * checked model name; params are the query and form parameters. */
void sv_route_models(struct serve *s, struct evhttp_request *req);
void sv_route_model(struct serve *s, struct evhttp_request *req, const char *name);
void sv_route_model_ready(struct serve *s, struct evhttp_request *req, const char *name);
void sv_route_weights(struct serve *s, struct evhttp_request *req, const char *name,
                      struct evkeyvalq *params);
void sv_route_snapshot(struct serve *s, struct evhttp_request *req, const char *name,
                       const char *vtext, struct evkeyvalq *params);
void sv_route_stats(struct serve *s, struct evhttp_request *req, const char *name);
/* A POST's body (body.c), a form or a JSON object, added to params; read
 * only once the request is authorized. 0, or -1 with *code (400, 415 or
 * 503) and why. */
int sv_body_params(struct evhttp_request *req, struct evkeyvalq *params, int *code, char *why,
                   size_t size);
void sv_route_replay(struct serve *s, struct evhttp_request *req, const char *name,
                     struct evkeyvalq *params);
void sv_route_rollback(struct serve *s, struct evhttp_request *req, const char *name,
                       struct evkeyvalq *params);
/* A sparse model's rows (rows_sparse.c): by id, the delta since a
 * version, the table a page at a time. */
void sv_route_rows(struct serve *s, struct evhttp_request *req, const char *name,
                   struct evkeyvalq *params);
void sv_route_delta(struct serve *s, struct evhttp_request *req, const char *name,
                    struct evkeyvalq *params);
void sv_route_table(struct serve *s, struct evhttp_request *req, const char *name,
                    struct evkeyvalq *params);
/* The rows reader's thread (rows_sparse.c): one job at a time on its own
 * connection to the store. */
void *sv_rows_main(void *arg);
/* A sparse model's predictions (infer_sparse.c): body (malloc'ed, taken),
 * records as the topic carries them, scored on the rows reader. */
void sv_infer_sparse_submit(struct serve *s, struct evhttp_request *req, const char *name,
                            char *body, size_t len);
/* Predictions (infer.c): the request checked and queued on the loop, the
 * body parsed and the model run by the inference workers. */
void sv_route_infer(struct serve *s, struct evhttp_request *req, const char *name,
                    struct evkeyvalq *params);
void *sv_infer_main(void *arg);
void sv_route_metrics(struct serve *s, struct evhttp_request *req);
void sv_route_ready(struct serve *s, struct evhttp_request *req);
void sv_route_dashboard(struct serve *s, struct evhttp_request *req, const char *path);
/* The stats of m as the follower last built them, or a 503 saying why. */
void sv_send_stats(struct serve *s, struct evhttp_request *req, sv_model_t *m);
/* Answers a weights request with cur (whose reference it takes), or, for a
 * long-poll (after >= 0) whose client has cur's version, waits up to
 * wait_ms for another. */
void sv_send_weights(struct serve *s, struct evhttp_request *req, sv_model_t *m, sv_view_t *cur,
                     enum sv_fmt f, int64_t after, int wait_ms);

/* ------------------------------------------------------------------------
 * The rows reader's jobs (rows_sparse.c): a sparse model's rows, deltas,
 * table pages and predictions (infer_sparse.c), queued on the loop and
 * read from the store on the reader thread (a pool of one, pool.c).
 * ---------------------------------------------------------------------- */
#define SV_ROWS_MAX 16384 /* rows one answer reads, records one prediction scores, at most */

/* What a reader's job asks for. */
enum sv_rows_kind { SV_ROWS_JOB_ROWS, SV_ROWS_JOB_DELTA, SV_ROWS_JOB_TABLE, SV_ROWS_JOB_INFER };

/* One request for the reader: what the loop parsed (the answer is in
 * the head). */
typedef struct sv_rows_job {
    sv_job_t job;
    enum sv_rows_kind kind;
    int json;
    char name[65];
    uint32_t *ids; /* rows: the ids asked */
    size_t nids;
    char since[PSSTORE_SHARDS_MAX * 21]; /* delta: a version, or "v0.v1..." of S shards */
    int64_t max_rows;                    /* delta */
    char epoch[24];                      /* delta: "" when not given */
    char cursor[48];                     /* table */
    int64_t count;
    char *body; /* infer: the request's JSON, NUL-terminated */
    size_t blen;
} sv_rows_job_t;

/* On the loop: a new job of kind for model name, its own to free once
 * queued; NULL after answering 500. */
sv_rows_job_t *sv_rows_job_new(struct serve *s, struct evhttp_request *req, const char *name,
                               enum sv_rows_kind kind, int json);
/* On the reader: the latest value of rows ids[n] on the reader's
 * connection *c, in the order asked (a row the store lacks has its
 * initial value; stored[i] says which), shard 0's biases and tower; 0,
 * or -1 after setting j's error. */
int sv_rows_read(sv_rows_job_t *j, psstore_conn_t **c, const sparse_spec_t *spec,
                 const sparse_optim_t *optim, int S, const uint32_t *ids, size_t n, float *params,
                 uint32_t *stored, float *bias, float *tower, psstore_rows_page_t *at);
/* On the reader: j's predictions (infer_sparse.c), answered or j's error
 * set. */
void sv_infer_sparse_run(sv_rows_job_t *j, psstore_conn_t **c, const sparse_spec_t *spec,
                         const sparse_optim_t *optim, int S);

#endif
