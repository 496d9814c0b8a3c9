/*
 * serve.h - the one public header of the HTTP service (docs/design.md
 * "Snapshots and publishing"): model metadata in the Open Inference
 * Protocol shape, the latest weights (safetensors, raw float32, JSON) with
 * ETag and long-poll, retained snapshots, the dashboard and its stats,
 * /metrics, health, and the replay and rollback requests.
 *
 * A server runs two threads: the libevent loop, which answers every client
 * from shared, already encoded buffers and never waits on Redis for a read,
 * and a follower, which follows the models' versions streams and reads new
 * weights at most once per (epoch, version) and at most every refresh_ms.
 * serve never writes the store's state: replay and rollback are requests
 * for the applier.
 *
 * Threads: serve_new, serve_start, serve_stop and serve_destroy from one
 * thread; serve_port from any.
 */
#ifndef FRESHET_SERVE_H
#define FRESHET_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SERVE_MAX_WAIT_S 30 /* the longest long-poll a client may ask for */

typedef struct serve_conf {
    const char *listen;    /* "host:port" or "[v6]:port"; port 0 picks a free one */
    const char *redis_url; /* the store                                          */
    const char *model;     /* the default model: dashboard, readiness ("" none)  */
    const char *token;     /* bearer token for replay/rollback ("" refuses them) */
    int protect_reads;     /* the token is needed for reads too (not health)     */
    int64_t refresh_ms;    /* weights are read at most this often per model      */
    const char *tls_cert;  /* PEM certificate and key: HTTPS ("" plain HTTP)     */
    const char *tls_key;
    const char *chartjs;       /* Chart.js (UMD) served at /dashboard/chart.min.js   */
    size_t max_body;           /* request body cap in bytes                          */
    int header_timeout_s;      /* a new connection's first request (headers and body) must
                                  arrive within this; then idle up to SERVE_MAX_WAIT_S + 30 */
    int max_connections;       /* connections open at most (then accept waits); 0: half the
                                  descriptor limit (RLIMIT_NOFILE), at least 16 */
    int infer;                 /* POST /v2/models/{m}/infer answered                 */
    int infer_threads;         /* threads computing predictions (1..16)              */
    int infer_queue;           /* predictions waiting at most (then 503)             */
    const char *allowed_hosts; /* Host header values answered, comma-separated;
                                  "*" any; "" loopback names and the listen
                                  host (any when it listens on every address) */
    int max_models;            /* models followed at most                            */
    fr_metrics_t *metrics;     /* rendered at /metrics, serve's own added (required) */
} serve_conf_t;

/* [serve]'s defaults: 127.0.0.1:8080, refresh 20 ms, 1 MiB bodies, 64
 * models, predictions on 2 threads with 256 waiting, Chart.js from
 * Debian's libjs-chart.js. */
void serve_conf_init(serve_conf_t *conf);

typedef struct serve serve_t;

/* Checks conf, loads the TLS certificate and binds the listening socket, so
 * that a bad address or a port in use is reported here. Starts nothing.
 * NULL with errstr on failure. Caller frees with serve_destroy(). */
serve_t *serve_new(const serve_conf_t *conf, char *errstr, size_t size);
/* The port bound (the one picked when conf->listen asked for 0). */
int serve_port(const serve_t *s);
/* Starts the loop and follower threads. */
fr_err_t serve_start(serve_t *s, char *errstr, size_t size);
/* Answers every waiting client (503), stops both threads and closes the
 * socket. Idempotent. */
void serve_stop(serve_t *s);
void serve_destroy(serve_t *s);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_SERVE_H */
