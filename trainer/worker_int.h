/*
 * worker_int.h - what the worker loop's files share (worker.c, the loop and
 * the pool; worker_modes.c, membership, rounds and ssp; worker_poison.c,
 * the isolation of a poisoned batch's samples): a worker's and the pool's
 * state. Private to fr_worker.
 *
 * Threads: a worker_t belongs to its thread; the pool's counters are
 * atomics.
 */
#ifndef FRESHET_TRAINER_WORKER_INT_H
#define FRESHET_TRAINER_WORKER_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "psstore/store/status.h"
#include "psstore/update/update.h"
#include "trainer/pool.h"
#include "trainer/trainer.h"

#define NEXT_WAIT_MS   200           /* one wait for a batch, then a look at stop */
#define PUSH_WAIT_MS   5000          /* backpressure: a push waits this long      */
#define BEAT_NS        1000000000ull /* heartbeat period                    */
#define POLL_NS        1000000ull    /* a waiting worker looks again after  */
#define ROUND_BLOCK_MS 100           /* one blocking wait for a round, then a look at stop */
#define IN_FLIGHT_MAX  16            /* [trainer] in_flight's upper bound       */

/* A gradient pushed and not yet known to be applied: a channel ticket, or
 * the stream id of a push through Redis. */
typedef struct flight {
    uint64_t ticket; /* 0: a stream push */
    char id[PSSTORE_STREAM_ID_MAX];
} flight_t;

typedef struct worker {
    trainer_pool_t *pool;
    int index;
    char id[96]; /* "<host>/<pid>/<n>" */
    pthread_t thread;
    trainer_backend_t *be;
    psstore_client_t *cl;
    double slowdown;
    uint64_t slow_until_ns; /* the slowdown ends then (0: never) */
    float *w, *g;           /* [nparams]: the local copy and the gradient */
    const float *held;      /* the channel's weights, held (psstore_local_hold) */
    uint64_t epoch;
    int64_t version;         /* -1 before the first pull */
    psstore_member_t me;     /* this worker's members entry              */
    uint64_t beat_ns;        /* when it last heartbeat                   */
    uint64_t want_ns;        /* since when it waits for data (0: has some) */
    uint64_t waited_ns;      /* its waits for data since its last batch  */
    psstore_member_t *peers; /* members read buffer (ssp)                */
    size_t cap_peers;
    flight_t flights[IN_FLIGHT_MAX]; /* FIFO of pushes not yet applied  */
    int nflights, flight_head;
    psstore_phase_t phase; /* mode auto: the applier's, as last read */
    int in_ssp;            /* mode auto: this worker keeps ssp's bound */
    /* per-sample isolation (trainer_worker_isolate_nonfinite): the kept samples and one
     * sample's gradient, allocated at the first poisoned batch */
    float *iso_x, *iso_y, *iso_g;
    size_t iso_cap;
    size_t *iso_drop;         /* [iso_drop_cap]: the samples it dropped */
    psstore_range_t *iso_pos; /* [iso_drop_cap]: their positions (quarantine) */
    size_t iso_drop_cap;
    size_t kept; /* samples of the last batch that went into its gradient */
} worker_t;

struct trainer_pool {
    model_t m;
    ingest_consumer_t *source;
    worker_t *workers;
    int nworkers;
    int started;
    atomic_int stop;
    atomic_uint_least64_t samples, batches, pulls, failed, compute_ns, push_ns, wait_ns, pull_ns,
        starved_ns, idle_ns;
    psstore_mode_t mode;
    int64_t ssp_bound, idle_ms, round_wait_ms;
    int in_flight;
    psstore_local_t *local;
    atomic_int_least64_t version;
    atomic_uint_least64_t epoch;
    pthread_mutex_t lock; /* guards loss_sum */
    double loss_sum;
    fr_series_t *m_samples, *m_failed, *m_step, *m_starved, *m_poison;
    atomic_uint_least64_t poisoned;
};

/* ---- worker_modes.c: membership and the modes' waits (docs/design.md
 * "Training modes") ---------------------------------------------------- */
/* Writes the worker's members entry (a heartbeat); beat_due does when a
 * period passed. Failures are logged at debug level; the next one tries. */
void trainer_worker_beat(worker_t *wk);
void trainer_worker_beat_due(worker_t *wk);
/* ssp: join at the slowest live member's clock; wait while this worker is
 * more than ssp_bound ahead; whether this step keeps ssp's bound. */
void trainer_worker_ssp_join(worker_t *wk);
void trainer_worker_ssp_wait(worker_t *wk);
int trainer_worker_ssp_step(worker_t *wk);
/* Round modes: the group's closed rounds (from the channel when *local),
 * and the wait until the count passes round, at most round_wait_ms. */
fr_err_t trainer_worker_round_read(worker_t *wk, int64_t *round, int *local);
void trainer_worker_round_wait(worker_t *wk, int64_t round, int local);
/* Tracks whether the worker waits for data (b: what the queue gave). */
void trainer_worker_track_idle(worker_t *wk, const ingest_batch_t *b);

/* ---- worker_poison.c: a non-finite batch's samples, one by one
 * (docs/design.md "Poison in a batch") ---------------------------------- */
/* Whether the loss and every gradient entry are finite. */
int trainer_worker_finite_all(const float *g, size_t n, double loss);
/* trainer_worker_isolate_nonfinite's outcomes besides a count of samples kept. */
enum { ISO_ERROR = -1, ISO_DIVERGED = -2 };
/* Recomputes b's gradient without the samples whose own gradient is not
 * finite and quarantines their positions: the samples kept, or
 * ISO_DIVERGED or ISO_ERROR (worker_poison.c says when). */
int64_t trainer_worker_isolate_nonfinite(worker_t *wk, const ingest_batch_t *b, double *loss);

#endif
