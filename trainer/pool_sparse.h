/*
 * pool_sparse.h - the workers of a sparse model (worker_sparse.c, library
 * fr_worker; docs/design.md "Sparse models"): W threads that take batches
 * of packed sparse samples from a consumer, pull only the rows of each
 * batch from the store, compute the factorization machine's loss and
 * gradient, and push the rows' gradients. Like the dense pool it needs
 * Kafka and Redis, so it is not part of FRESHET_CORE_ONLY builds.
 *
 * Threads: one per worker; the owner calls new, start, stop and destroy;
 * trainer_sparse_stats may be called from any thread.
 */
#ifndef FRESHET_TRAINER_POOL_SPARSE_H
#define FRESHET_TRAINER_POOL_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "ingest/ingest.h"
#include "psstore/applier/applier.h"
#include "sparse/sparse.h"

typedef struct trainer_sparse_conf {
    const char *redis_url;
    const char *model;
    sparse_spec_t spec;
    sparse_optim_t optim; /* its seed and init_std give rows never written */
    int workers;          /* 1..64 */
    int max_batch;        /* samples a batch, at most ([ingest] batch)     */
    int64_t max_pending;  /* gradients waiting in the stream, at most      */
    size_t window;        /* records per progressive-validation window (logged) */
    int in_flight;        /* > 0: a worker pulls once its last gradient was
                             applied ([trainer] in_flight; 0: no bound)     */
    ingest_consumer_t *source;
    int shards; /* the model's shards (1..PSSTORE_SHARDS_MAX; 0 counts as 1):
                   shard k holds the rows r with r % shards == k */
    psstore_applier_t *appliers[PSSTORE_SHARDS_MAX]; /* freshet run: shard k's applier in
                                   this process, whose rows the workers read
                                   (rows it does not hold come from the
                                   store); NULL: the store */
} trainer_sparse_conf_t;

typedef struct trainer_sparse_stats {
    uint64_t samples, batches; /* pushed                                      */
    uint64_t failed;           /* batches abandoned (read again by the gap rule) */
    uint64_t rows;             /* rows pulled                                  */
    double loss_sum;           /* progressive logloss summed over the samples  */
    uint64_t wait_ns, pull_ns, compute_ns, push_ns; /* summed over the batches: the
                                  in-flight wait, the pull, the FM, the push   */
    int64_t version;             /* the newest version a gradient was computed on */
    uint64_t in_process;         /* shards' gradients decided in the worker's thread */
    uint64_t backpressure_waits; /* 1 ms waits at a full window (Redis behind) */
} trainer_sparse_stats_t;

typedef struct trainer_sparse trainer_sparse_t;

/* The workers of conf (strings are copied), connected, not started; NULL
 * with errstr. */
trainer_sparse_t *trainer_sparse_new(const trainer_sparse_conf_t *conf, char *errstr, size_t size);
/* Starts the threads; FR_ERR_STATE when started already. */
fr_err_t trainer_sparse_start(trainer_sparse_t *p);
/* Stops and joins the threads (each finishes its batch). Idempotent. */
void trainer_sparse_stop(trainer_sparse_t *p);
void trainer_sparse_stats(trainer_sparse_t *p, trainer_sparse_stats_t *st);
/* Stops and frees. NULL is a no-op. */
void trainer_sparse_destroy(trainer_sparse_t *p);

#endif
