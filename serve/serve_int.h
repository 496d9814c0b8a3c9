/*
 * serve_int.h - private declarations shared by serve's sources. Only
 * serve/ includes event2/.
 */
#ifndef FRESHET_SERVE_INT_H
#define FRESHET_SERVE_INT_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>

#include "psstore/store/rows_sparse.h"
#include "psstore/store/status.h"
#include "psstore/store/store.h"
#include "serve/serve.h"

/* ------------------------------------------------------------------------
 * The JSON pieces serve writes into common's text buffer (fr_buf_t;
 * strings by fr_json_str) (json.c).
 * ---------------------------------------------------------------------- */
/* An error answer's body, {"error": "<fmt formatted>"} and a newline. */
void sv_json_error(fr_buf_t *b, const char *fmt, va_list ap);
/* A JSON number, or null when v is not finite. */
void sv_json_num(fr_buf_t *b, double v);
/* A float as a JSON number (null when not finite): 9 significant digits,
 * trailing zeros dropped, as printf's %g lays them out; strtof reads back
 * the same float. */
void sv_json_f32(fr_buf_t *b, float x);
#define SV_F32_TEXT_MAX 24
/* The same text into out (NUL-terminated); its length. */
size_t sv_f32_text(float x, char out[SV_F32_TEXT_MAX]);

/* ------------------------------------------------------------------------
 * Shared immutable bytes: encoded weights, stats and metadata JSON. The
 * loop takes a reference per response and drops it when the bytes have
 * been written; the follower drops its own when it replaces them.
 * ---------------------------------------------------------------------- */
typedef struct sv_blob {
    atomic_int refs;
    size_t len;
    char *data;
} sv_blob_t;

/* A blob owning data (malloc'ed), with one reference. NULL if out of memory
 * (data is then freed). */
sv_blob_t *sv_blob_new(char *data, size_t len);
sv_blob_t *sv_blob_ref(sv_blob_t *b);
void sv_blob_unref(sv_blob_t *b);

/* One (epoch, version) of a model's weights, encoded once. */
typedef struct sv_view {
    atomic_int refs;
    uint64_t epoch;
    int64_t version;
    int64_t time_ms; /* when it was read (snapshots: when taken) */
    char etag[64];   /* "\"<epoch>-v<version>\"" */
    char *st;        /* the safetensors image                    */
    size_t st_len;
    size_t raw_off; /* the float32 payload inside st: st + raw_off */
    size_t raw_len;
    sv_blob_t *json;  /* the JSON form: made by the follower before publishing when
                         clients asked for JSON lately, else by the loop on first
                         use (then loop only) */
    char *offsets;    /* "topic/partition=watermark,..." of these weights ("" unknown) */
    char layers[256]; /* the model these weights are of ("784-256-10") */
    char loss[16];
    char shard_versions[PSSTORE_SHARDS_MAX * 21]; /* a sharded model: "5,7,9" (its
                                                     shards' versions); "" else */
} sv_view_t;

sv_view_t *sv_view_ref(sv_view_t *v);
void sv_view_unref(sv_view_t *v);
/* The JSON form of v's weights (json.c): model name, epoch, version,
 * layers, loss and each tensor's shape and data; NULL on a bad view or no
 * memory. */
sv_blob_t *sv_weights_json(const char *model, const sv_view_t *v);
/* The same with each float written by put (bench/bench_json.c compares
 * writers). */
typedef void (*sv_f32_writer_t)(fr_buf_t *b, float x);
sv_blob_t *sv_weights_json_by(const char *model, const sv_view_t *v, sv_f32_writer_t put);

/* ------------------------------------------------------------------------
 * Requests answered off the loop (pool.c): the loop checks a request and
 * queues it as a job; a pool's threads take jobs, compute their answers
 * and hand them back; the loop sends them. A client that hangs up
 * meanwhile is forgotten (its job costs no work and its answer is
 * dropped); stop answers the jobs still queued with 503.
 * ---------------------------------------------------------------------- */
#define SV_POOL_THREADS_MAX 16

struct serve;
struct evhttp_request;
struct evhttp_connection;
struct event;

typedef struct sv_job sv_job_t;
typedef struct sv_pool sv_pool_t;

/* The head of every job; a kind's job embeds it first. */
struct sv_job {
    sv_job_t *next;
    sv_pool_t *pool;
    struct evhttp_request *req; /* NULL once the client hung up */
    struct evhttp_connection *evcon;
    struct event *hup;         /* the client's close, watched while the job waits */
    int gone;                  /* the client hung up (under pool->lock) */
    void (*fini)(sv_job_t *j); /* frees what the kind added, not j (NULL: nothing) */
    /* set by a thread instead of an answer: the loop passes the request on
     * (to another pool) by calling it, and frees j */
    void (*then)(sv_job_t *j, struct evhttp_request *req);
    /* the answer */
    int code;
    const char *type;
    char *body; /* malloc'ed */
    size_t len;
    char version[24], epoch[24]; /* X-Freshet-Version and -Epoch ("" none) */
};

struct sv_pool {
    struct serve *s;
    const char *what; /* "rows", "infer": in a full queue's 503 */
    size_t queue_max;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    sv_job_t *queue; /* for the threads, oldest first  */
    size_t queued;   /* ... how many                   */
    sv_job_t *done;  /* for the loop to send           */
    size_t inflight; /* taken by a thread, not handed back yet */
    struct event *done_ev;
    size_t nthreads;
    pthread_t threads[SV_POOL_THREADS_MAX];
    int ready; /* initialised */
};

/* Sets p up on s's loop; -1 when out of memory. */
int sv_pool_init(sv_pool_t *p, struct serve *s, const char *what, size_t queue_max);
/* Starts n threads running main(s); -1 when one cannot start (those
 * started run until s->stop and sv_pool_join). */
int sv_pool_start(sv_pool_t *p, size_t n, void *(*main)(void *));
/* Wakes the threads to see s->stop and joins them. */
void sv_pool_join(sv_pool_t *p);
/* On the loop, at stop: answers the queued jobs with 503 and sends the
 * finished ones; the jobs the threads still hold. */
size_t sv_pool_drain(sv_pool_t *p);
/* Frees the jobs left and p's own, once every thread has stopped and the
 * connections are closed. */
void sv_pool_fini(sv_pool_t *p);
/* Queues j (calloc'ed by the route, its kind's fields set) for req, or
 * answers 503 and frees j when serve stops or the queue is full; the
 * client's hang-up is watched. On the loop. */
void sv_pool_submit(sv_pool_t *p, struct evhttp_request *req, sv_job_t *j);
/* A thread's next jobs, up to max, oldest first, with the lock released;
 * blocks while there are none. 0 when serve stops. Jobs whose clients
 * hung up are not returned (they go straight back to the loop). */
size_t sv_pool_take(sv_pool_t *p, sv_job_t **jobs, size_t max);
/* Puts n jobs a thread took but cannot answer yet back at the queue's
 * tail (a client that hung up meanwhile is then dropped as usual); with
 * pause, the thread then sleeps SV_POOL_PAUSE_NS (it had nothing else to
 * do). */
#define SV_POOL_PAUSE_NS 2000000
void sv_pool_requeue(sv_pool_t *p, sv_job_t **jobs, size_t n, int pause);
/* Hands n finished jobs back to the loop. */
void sv_pool_finish(sv_pool_t *p, sv_job_t **jobs, size_t n);
/* A job's answer: 200-type answers take body (malloc'ed); an error is
 * {"error": "..."} with code. */
void sv_job_answer(sv_job_t *j, int code, const char *type, char *body, size_t len);
void sv_job_error(sv_job_t *j, int code, const char *fmt, ...) FR_PRINTF(3, 4);

/* ------------------------------------------------------------------------
 * A model followed by the server. The follower writes the fields under
 * s->lock; the loop reads them under it and owns the waiters.
 * ---------------------------------------------------------------------- */
#define SV_MAX_SNAPS 64
#define SV_WANTED_MS                                                                               \
    600000                       /* a model's weights are kept current this long                   \
                                    after a request for them                */
#define SV_STATS_WANTED_MS 30000 /* ... and its stats                       */

typedef struct sv_waiter sv_waiter_t;

typedef struct sv_model {
    char name[65];
    /* follower's own */
    char last_id[PSSTORE_STREAM_ID_MAX];
    uint64_t loaded_ns; /* monotonic time of the last weights read     */
    uint64_t stats_ns;  /* ... of the last stats                       */
    int pending;        /* the store moved since the last read         */
    uint64_t meta_seq;  /* seq the metadata was built at               */
    int watched;        /* clients asked for its weights or stats lately */
    /* shared, under s->lock */
    int present;             /* the store has the model                     */
    int64_t wanted_ms;       /* a client asked for its weights (unix ms)    */
    int64_t stats_wanted_ms; /* ... for its stats                           */
    int64_t json_wanted_ms;  /* ... for its weights as JSON                 */
    psstore_model_info_t info;
    char error[256]; /* why its weights cannot be read ("" none)    */
    sv_view_t *cur;  /* the latest weights, NULL before the first   */
    size_t nsnaps;
    sv_view_t *snaps[SV_MAX_SNAPS]; /* retained snapshots of cur's epoch, read while
                                       its weights are wanted                 */
    size_t nlisted;                 /* the retained snapshots, oldest first, read
                                       with the model's info whatever is wanted */
    psstore_snapshot_info_t listed[SV_MAX_SNAPS];
    size_t nunserved; /* listed ones not served: another epoch's, or unreadable */
    int64_t unserved[SV_MAX_SNAPS];
    int64_t published_ms; /* the newest snapshot's time, 0 when none      */
    sv_blob_t *stats;     /* the stats JSON                              */
    uint64_t stats_seq;   /* bumped by every stats build                 */
    sv_blob_t *meta;      /* the metadata JSON                           */
    uint64_t seq;         /* bumped by every change (loop: wake waiters) */
    /* loop's own */
    uint64_t seen_seq;
    sv_waiter_t *waiters;
} sv_model_t;

/* Follows the store for s (follow.c). */
struct serve;
void *sv_follow_main(void *arg);

/* The weights cache (cache.c), on the follower. sv_cache_refresh reads
 * m's info and, when its (epoch, version) moved and refresh_ms has passed
 * since the last read, its weights (into *w, grown to the model's size)
 * and any retained snapshot not held yet, and publishes them; *changed
 * set when m changed. Returns FR_ERR_REDIS-class errors or FR_ERR_NOMEM; a
 * model that cannot be read or encoded is noted in m->error. */
fr_err_t sv_cache_refresh(struct serve *s, psstore_conn_t *c, sv_model_t *m, float **w,
                          size_t *wcap, int *changed);
/* m's metadata JSON (Open Inference Protocol shape) into m->meta, kept
 * when out of memory. Under s->lock. */
void sv_cache_meta(sv_model_t *m);
/* Whether version is listed for m but not served (another epoch's
 * snapshot, or unreadable). Under s->lock. */
int sv_cache_snapshot_unserved(const sv_model_t *m, int64_t version);

/* The dashboard's stats (stats.c), on the follower: the streams read into
 * scratch kept between builds (zeroed at first; freed by
 * sv_stats_scratch_fini), the JSON published as m->stats. */
typedef struct sv_stats_scratch {
    psstore_version_entry_t *ver;
    psstore_drop_entry_t *drops;
    psstore_eval_entry_t *evals;
    psstore_member_t *members;
    size_t members_cap;
    psstore_partition_status_t *parts;
    size_t parts_cap;
    int64_t *taus;
    size_t nver, ndrops, nevals, nmem, nparts; /* what the last read filled */
} sv_stats_scratch_t;
/* Builds the stats JSON of m (docs/http.md "Stats" lists its fields).
 * Returns FR_ERR_REDIS-class errors or FR_ERR_NOMEM. */
fr_err_t sv_stats_build(struct serve *s, psstore_conn_t *c, sv_model_t *m, sv_stats_scratch_t *x);
void sv_stats_scratch_fini(sv_stats_scratch_t *x);
/* The model named name, created (not yet present) when new and wanted;
 * NULL when there are too many. Under s->lock. */
sv_model_t *sv_model_get(struct serve *s, const char *name, int create);

struct serve {
    serve_conf_t conf;
    char *listen, *redis_url, *model, *token, *tls_cert, *tls_key, *chartjs;
    char *hosts;                /* the allowed Host names, ",a,b,": "" any (dispatch.c) */
    struct event *accept_again; /* the listener paused after accept() failed */
    int accept_pause_ms;
    uint64_t accept_error_ns;   /* the last failure */
    int accept_paused;          /* the pause after a failure is on (loop thread) */
    int max_conns, open_conns;  /* the connection cap and the connections open (loop thread) */
    struct bufferevent **conns; /* the open connections' bufferevents, a reference held */
    uint64_t *conn_since;       /* when conns[i] was accepted (monotonic ns) */
    unsigned char *conn_seen;   /* conns[i] completed a request (CONN_DOOMED: to close) */
    int conns_cap;
    struct event *sweep;    /* finds the connections evhttp let go of */
    int closing;            /* serve_destroy frees the server: no listener to touch */
    uint64_t capped_log_ns; /* the cap was last logged then */
    uint64_t tls_log_ns;    /* a TLS session failure was last logged then */
    int port;
    struct event_base *base;
    struct evhttp *http;
    struct evhttp_bound_socket *bound;
    void *ssl_ctx;           /* SSL_CTX, when TLS                        */
    struct event *notify;    /* the follower published something         */
    struct event *stop_ev;   /* serve_stop asked the loop to finish      */
    struct event *stop_wait; /* ... and waits for the jobs threads hold */
    uint64_t stop_deadline_ns;
    pthread_t loop_thread, follow_thread;
    int started;
    atomic_int stop;
    pthread_mutex_t lock; /* guards models and the fields marked shared */
    pthread_cond_t wake;  /* the follower's sleep, cut short by stop    */
    sv_model_t **models;
    size_t nmodels;
    int store_up; /* the last store operation succeeded         */
    char store_error[256];
    int64_t models_ms; /* when the list of models was last read      */
    char **names;      /* the store's models at that time (sorted)   */
    size_t nnames;
    char *chartjs_data; /* Chart.js, read once at start             */
    size_t chartjs_len;
    void *op_conn;   /* psstore_conn_t for requests, loop thread   */
    sv_pool_t rows;  /* sparse models' rows and predictions (rows_sparse.c, infer_sparse.c) */
    sv_pool_t infer; /* predictions (infer.c); no threads when [serve] infer is off */
    size_t waiting;  /* long-poll clients now                      */
    /* metrics */
    fr_metric_t *m_requests, *m_bytes;
    fr_series_t *m_waiting, *m_store_up;
    fr_metric_t *m_version, *m_published, *m_loads, *m_json;
    fr_metric_t *m_predictions, *m_infer_batches;
    fr_series_t *m_refused, *m_accept_errors, *m_conns, *m_capped;
};

/* Wakes the loop to look at what the follower published (any thread). */
void sv_notify(struct serve *s);
/* Whether the store answered the follower's last read; why not into
 * why[256] (any thread). */
int sv_store_up(struct serve *s, char *why);

#endif
