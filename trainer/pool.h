/*
 * pool.h - the trainer's worker pool (worker.c, library fr_worker): what
 * the trainer exports to the services of app/. It needs the services
 * (Kafka through ingest, Redis through psstore), so it is not part of
 * FRESHET_CORE_ONLY builds; the pure settings parsers of the pool are in
 * trainer/trainer.h.
 *
 * Threads: one per worker; the pool's owner calls trainer_pool_new,
 * _start, _stop and _destroy; trainer_pool_stats may be called from any
 * thread.
 */
#ifndef FRESHET_TRAINER_POOL_H
#define FRESHET_TRAINER_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "ingest/ingest.h"
#include "model/model.h"
#include "psstore/grads/grads.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Workers: W threads, each with its own backend and store client, that
 * take batches from a consumer, pull the weights when the store moved,
 * compute the gradient and push it with the version read and the batch's
 * positions (docs/design.md "Data flow"). Every worker heartbeats into the
 * members hash. Modes async and adaptive: a worker never waits for
 * another; sync, backup, groups: after a push it waits until its group's
 * round closes; ssp: it does not start a step while its clock is more than
 * ssp_bound ahead of the slowest live, non-idle member.
 * ---------------------------------------------------------------------- */
typedef struct trainer_pool trainer_pool_t;

typedef struct trainer_pool_conf {
    const char *redis_url;
    const char *model;         /* the model's name in the store          */
    const model_t *m;          /* its layers and loss (copied)           */
    const char *backend;       /* auto | cpu | cuda                      */
    const int *devices;        /* [workers] CUDA device each, NULL: 0    */
    int workers;               /* >= 1                                   */
    int max_batch;             /* the consumer's batch size              */
    int64_t max_pending;       /* [psstore] max_pending                  */
    const double *slowdown;    /* [workers] factors >= 1, NULL: none     */
    const double *slowdown_s;  /* [workers] seconds the factor lasts from
                                  the start (0: always), NULL: always    */
    ingest_consumer_t *source; /* borrowed; batches come from here       */
    fr_metrics_t *metrics;     /* may be NULL                            */
    psstore_mode_t mode;       /* [trainer] mode (async by default)      */
    int groups;                /* mode groups: worker i is in i % groups */
    int64_t ssp_bound;         /* mode ssp: clocks ahead of the slowest  */
    int64_t idle_ms;           /* waiting this long for data: idle       */
    int64_t round_wait_ms;     /* longest wait for a round to close      */
    int in_flight;             /* [trainer] in_flight: gradients a worker
                                  may have pushed and not yet applied before
                                  it pulls again (0: no bound)           */
    psstore_local_t *local;    /* freshet run's in-process channel, or NULL */
} trainer_pool_conf_t;

typedef struct trainer_pool_stats {
    uint64_t samples;    /* samples whose gradients were pushed                 */
    uint64_t batches;    /* batches pushed (n = 0 ones included)                */
    uint64_t pulls;      /* weight pulls that brought a new version             */
    uint64_t failed;     /* batches abandoned (push or compute failed)          */
    uint64_t poisoned;   /* samples dropped alone: non-finite loss or gradient  */
    double loss_sum;     /* summed training loss of the pushed samples          */
    uint64_t compute_ns; /* summed forward and backward time of the workers */
    uint64_t push_ns;    /* summed push time (backpressure waits, and the
                            applier's steps a lone worker ran for its
                            own gradients, psstore_local_push_help) */
    uint64_t wait_ns;    /* summed waits for rounds (round modes), clocks (ssp)
                            and the in-flight bound                           */
    uint64_t pull_ns;    /* summed weight pulls (and loads into the backend)   */
    uint64_t starved_ns; /* summed waits for a batch from the consumer after
                            the first, each counted once the batch came: data
                            arriving slower than the workers compute           */
    uint64_t idle_ns;    /* summed waits after each worker's last batch, until
                            it stops (after a finite topic's end, say); a lull
                            that a batch ends counts as starving, and a
                            worker's waits before its first batch in neither */
    int64_t version;     /* the newest version a worker computed on             */
    uint64_t epoch;      /* ... and its epoch                                   */
} trainer_pool_stats_t;

/* Creates the workers' backends and store clients (NULL with errstr when a
 * backend or Redis fails; the model must exist with m's size). */
trainer_pool_t *trainer_pool_new(const trainer_pool_conf_t *conf, char *errstr, size_t size);
/* Starts the worker threads; FR_ERR_STATE when started already. */
fr_err_t trainer_pool_start(trainer_pool_t *p);
/* Stops taking batches, lets each worker finish the batch in hand, joins
 * them. Idempotent. */
void trainer_pool_stop(trainer_pool_t *p);
void trainer_pool_destroy(trainer_pool_t *p);
/* Counters summed over the workers; any thread. */
void trainer_pool_stats(trainer_pool_t *p, trainer_pool_stats_t *st);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_TRAINER_POOL_H */
