/*
 * applier.h - the applier, the single writer of a model or of one shard
 * (fr_applier; docs/design.md "One writer and fencing"): it holds the
 * lease, executes requests, applies gradients through the controller
 * (psstore/update/) and commits the weights, offsets and versions in one
 * transaction.
 *
 * Threads: an applier belongs to one thread; the calls that others may
 * make say so.
 */
#ifndef FRESHET_PSSTORE_APPLIER_H
#define FRESHET_PSSTORE_APPLIER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "psstore/grads/grads.h"
#include "psstore/store/rows_sparse.h"
#include "psstore/store/status.h"
#include "psstore/update/update.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * The in-process fast path of a sparse model (applier_sparse.c): freshet
 * run's workers read the rows its applier holds and decide their own
 * gradients on them; the applier writes each window behind.
 * ---------------------------------------------------------------------- */
typedef struct psstore_applier psstore_applier_t;

/* Copies the rows among rows[n] that applier a holds into params[n][1 + D]
 * (found[i] = 1; rows it does not hold are untouched, found[i] = 0: the
 * store has their value, or, with *complete set, the table holds every row
 * the store holds and such a row is absent: sparse_row_init's), the biases into
 * bias[sparse_outputs] (one float past shard 0), the tower's parameters into
 * tower[sparse_tower_len] (may be NULL; shard 0's applier only), and the
 * epoch and version they are at, which may be newer than the store's.
 * FR_ERR_STATE while a holds no lease (read the store instead),
 * FR_ERR_INVAL for a dense model. Thread-safe. */
fr_err_t psstore_applier_rows(psstore_applier_t *a, const uint32_t *rows, size_t n, float *params,
                              uint8_t *found, float *bias, float *tower, uint64_t *epoch,
                              int64_t *version, int *complete);
/* Decides gradient g of a co-located worker in the caller's thread
 * (docs/design.md "The store written behind"): the applier's own decision
 * (epoch, replay, duplicates, the guard, the per-row step) under its step
 * lock, which its thread lets go of while it waits; the next commit
 * writes it with its positions. FR_OK: decided (applied or dropped);
 * FR_ERR_AGAIN: the window not yet written is full (Redis is behind:
 * wait, then try again); FR_ERR_STATE: not here (no lease, the table not
 * whole, the model stopped or not reading): push g through the stream.
 * Another error: g may be half applied; the applier reloads, and g's
 * positions are read again. Thread-safe. */
fr_err_t psstore_applier_sparse_step(psstore_applier_t *a, const psstore_grad_t *g);
/* Whether psstore_applier_sparse_step may take a gradient now (the lease
 * held, the table loaded whole); a hint, which the step checks again under
 * its lock. Thread-safe. */
int psstore_applier_sparse_accepting(psstore_applier_t *a);
/* How many times the applier dropped its state (a lost lease, a failed
 * commit) with gradients decided in process that no commit wrote: when
 * it grows, their positions are gone from the store's future and are read
 * again by the gap rule (ingest_consumer_lost shortens its wait). Thread-safe. */
uint64_t psstore_applier_sparse_lost(psstore_applier_t *a);
/* Waits up to timeout_ms until applier a decided the grads entry id
 * (applied or dropped; committed or not): *decided. FR_ERR_STATE while a
 * holds no lease (another process's applier decides: psstore_applied_wait
 * asks the store). Thread-safe. */
fr_err_t psstore_applier_decided_wait(psstore_applier_t *a, const char *id, int timeout_ms,
                                      int *decided);

/* ------------------------------------------------------------------------
 * The applier: the single writer of a model (docs/design.md "One writer and fencing").
 * Belongs to one thread; psstore_applier_stats may be called from others.
 * ---------------------------------------------------------------------- */
/* A sparse model's applier (docs/design.md "Sparse models"): the table's
 * shape and the per-row optimizer. */
typedef struct psstore_sparse_conf {
    int enabled; /* 0: a dense model */
    sparse_spec_t spec;
    sparse_optim_t optim;
    int min_count;    /* admission: a row the store lacks is created at its
                         min_count-th gradient, counted in a sketch (1..255;
                         0 or 1: at its first) */
    int64_t ttl_ms;   /* eviction: a row not stepped for this long is deleted
                         and published as a tombstone (0: never) */
    int64_t delta_ms; /* the changes stream keeps this much history: a
                         delta since an older version is refused (> 0) */
    int inproc;       /* co-located workers decide their own gradients
                         (psstore_applier_sparse_step; freshet run) */
} psstore_sparse_conf_t;

/* [psstore] commit_ms when left at -1: a dense model's commit writes the
 * whole model, a sparse model's only the rows its window changed. */
#define PSSTORE_COMMIT_MS_DENSE  10
#define PSSTORE_COMMIT_MS_SPARSE 5

typedef struct psstore_applier_conf {
    const char *url;
    const char *model;
    int shard; /* a sharded model: the shard this applier writes (0..S-1;
                  docs/design.md "Shards"); ignored for a model of one */
    psstore_ctl_conf_t ctl;
    int64_t lease_ms;             /* lease time-to-live                        */
    int64_t commit_ms;            /* group commit window; 0 = every gradient   */
    int64_t versions_keep;        /* MAXLEN ~ of the versions stream           */
    int64_t snapshot_every;       /* versions between snapshots; 0 = never     */
    double snapshot_seconds;      /* seconds between snapshots; 0 = never      */
    int64_t snapshot_retain;      /* snapshots kept                            */
    int audit;                    /* append applied/dropped intervals to audit */
    int64_t sample_limit;         /* stop reading gradients once this many samples
                                     were applied (0: never; freshet run --samples) */
    int commit_drained;           /* end a commit window as soon as the stream has
                                     nothing to read: its pushers wait for the
                                     commit ([trainer] in_flight > 0)          */
    int npushers;                 /* concurrent pushers for the delay policy   */
    psstore_mode_t mode;          /* rounds in sync, backup and groups         */
    int backups;                  /* mode backup: a round closes at members - backups */
    int sync_lr_linear;           /* rounds: lr times the gradients averaged   */
    int64_t member_timeout_ms;    /* silence before a member is removed      */
    int64_t round_timeout_ms;     /* a round closes with whoever arrived      */
    int wait_replicas;            /* WAIT for this many replicas after each commit
                                     ([redis] wait_replicas; 0: none)          */
    int64_t wait_timeout_ms;      /* ... for at most this long                 */
    int requests_only;            /* execute requests only, leave gradients waiting
                                     (the CLI acting while no applier runs)      */
    psstore_sparse_conf_t sparse; /* a sparse model's table and optimizer      */
    fr_metrics_t *metrics;        /* where to export metrics; may be NULL      */
} psstore_applier_conf_t;

/* The defaults of [psstore], [controller] and the round settings of [trainer]
 * (docs/operations.md "Configuration"), read from the config schema
 * (fr_config_default), except commit_ms 0 and npushers 1: a library caller
 * commits every gradient and pushes from one thread unless it says otherwise. */
void psstore_applier_conf_init(psstore_applier_conf_t *conf);
/* An applier of conf->model (strings are copied). It connects, checks the
 * eviction policy and the model, and starts as a standby. NULL with errstr
 * on failure. Caller frees with psstore_applier_destroy(). */
psstore_applier_t *psstore_applier_new(const psstore_applier_conf_t *conf, char *errstr,
                                       size_t size);
void psstore_applier_destroy(psstore_applier_t *a);
/* Attaches the in-process channel (before the applier's first poll; l must
 * outlive it): the applier opens it whenever it holds the lease, takes its
 * gradients before the stream's, and publishes its weights there. */
void psstore_applier_set_local(psstore_applier_t *a, psstore_local_t *l);

/* One turn: takes or renews the lease (a standby returns FR_OK at once when
 * another applier holds it), executes requests, reads up to a batch of
 * gradients (blocking at most block_ms), applies and commits them. Losing
 * the lease (a nil EXEC) drops the in-memory state and returns to standby.
 * Errors are Redis errors; bad gradients are counted, not errors. */
fr_err_t psstore_applier_poll(psstore_applier_t *a, int block_ms);

/* Nonzero once the first poll's attempt at the lease has ended: the lease
 * taken (and the in-process channel opened), held by another applier, or
 * failed. Any thread. freshet run starts its consumer after it, so that
 * the first gradients go through the channel (docs/design.md "The
 * co-located fast path"). */
int psstore_applier_tried(psstore_applier_t *a);

/* Polls until *stop is nonzero, retrying with backoff on Redis errors;
 * commits what it holds and releases the lease before returning. *stop is
 * set from another thread (or a signal handler): it is read with
 * atomic_load, and stop must outlive the call. */
fr_err_t psstore_applier_run(psstore_applier_t *a, const atomic_int *stop);

typedef struct psstore_applier_stats {
    int active; /* holds the lease                           */
    uint64_t epoch;
    int64_t version;
    uint64_t applied;                /* gradients applied                         */
    int64_t samples;                 /* samples applied (what conf.sample_limit counts) */
    uint64_t rounds;                 /* rounds closed (sync, backup, groups)      */
    uint64_t dropped[PSSTORE_NDROP]; /* by psstore_drop_t              */
    uint64_t commits;                /* transactions that wrote weights           */
    uint64_t commit_ns;              /* their time, from the lease's WATCH to EXEC's
                                        reply (the applier applies nothing meanwhile) */
    uint64_t fenced;                 /* transactions refused: lease lost          */
    uint64_t unreplicated;           /* commits fewer than wait_replicas replicas
                                        acknowledged within wait_timeout_ms       */
    uint64_t bytes;                  /* payload bytes read and written            */
    uint64_t evicted;                /* a sparse model's rows deleted after its ttl */
    char stopped[256];               /* divergence guard reason, "" if running    */
    double lr_eff;                   /* of the last applied gradient              */
    int64_t tau_p50;                 /* staleness percentiles over the last 256   */
    int64_t tau_p99;                 /* applied gradients; -1 before any          */
    int64_t fresh_p50_ms;            /* freshness: ms from a sample's Kafka timestamp to the
                                        commit of the version holding it, over the oldest
                                        and newest sample of the last 256 applied batches;
                                        -1 before any */
    int64_t fresh_p99_ms;
} psstore_applier_stats_t;

void psstore_applier_stats(psstore_applier_t *a, psstore_applier_stats_t *stats);
/* stats.samples alone, without the lock and the percentiles: cheap enough
 * to poll every few milliseconds (freshet run --samples). Any thread. */
int64_t psstore_applier_samples(psstore_applier_t *a);

/* The last Redis error of the applier's connection (one line). */
const char *psstore_applier_error(const psstore_applier_t *a);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_PSSTORE_APPLIER_H */
