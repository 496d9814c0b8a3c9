/*
 * grads.h - gradients on their way to the applier (fr_grads): the message
 * of the grads stream and the worker's client that pulls weights and pushes
 * gradients between processes (docs/design.md "Redis layout"), the
 * worker's side of membership and rounds, and the in-process channel that
 * freshet run uses instead of the stream (docs/design.md "The co-located
 * fast path").
 *
 * Threads: a client belongs to one thread; the channel's functions say
 * which threads may call them.
 */
#ifndef FRESHET_PSSTORE_GRADS_H
#define FRESHET_PSSTORE_GRADS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "psstore/positions/positions.h"
#include "psstore/store/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Gradients between processes (the freshet:{m}:grads stream).
 * ---------------------------------------------------------------------- */
typedef struct psstore_grad {
    uint64_t epoch;     /* epoch of the weights it was computed on      */
    int64_t version;    /* version of those weights                     */
    int64_t generation; /* replay generation of the batch               */
    const char *worker; /* "<host>/<pid>/<n>"                           */
    int64_t n;          /* samples; 0 = positions dropped with reason   */
    double loss_sum;    /* sum of per-sample losses                     */
    const char *reason; /* n = 0: why ("decode", "retention"); else NULL */
    const psstore_range_t *ranges;
    size_t nranges;
    const float *g;                    /* gradient of the batch-mean loss, len floats  */
    size_t len;                        /* 0 when n = 0                                 */
    int64_t ts_min_ms, ts_max_ms;      /* Kafka timestamps of its oldest and newest
                                          samples (unix ms); 0 when unknown    */
    double norm;                       /* a shard's slice: the L2 norm of the whole gradient
                                          (NaN when it was not finite), so that every shard
                                          clips and rejects alike; 0: the slice's own norm   */
    const struct psstore_shard_at *at; /* a sharded model: the (epoch, version)
                                          of each shard it was computed on
                                          (psstore_client_at); NULL: the
                                          client's last pull, or epoch and
                                          version for one shard            */
    int sq_known;                      /* in-process pushes (psstore_local) only: sq is
                                          psstore_sum_squares(g, len), so the applier
                                          makes no pass of its own over g before its
                                          step. Never sent to Redis; a slice drops it */
    double sq;
} psstore_grad_t;

/* A sharded model as a worker holds it (docs/design.md "Shards"): the
 * (epoch, version) of each shard its weights were pulled at, and the
 * model's (epoch, version) they add up to (sums: the version changes
 * whenever a shard's does, and equals the shard's at S = 1). */
typedef struct psstore_shard_at {
    int n; /* shards; 0 for a model of one shard */
    uint64_t epoch;
    int64_t version;
    uint64_t epochs[PSSTORE_SHARDS_MAX];
    int64_t versions[PSSTORE_SHARDS_MAX];
    size_t bounds[PSSTORE_SHARDS_MAX + 1]; /* shard k: [bounds[k], bounds[k + 1]) */
    int torn;                              /* a pull failed after copying some slices: the next pull
                                              reports a change, so the backend loads them */
} psstore_shard_at_t;

/* The trainer-facing client of one worker thread. */
typedef struct psstore_client psstore_client_t;

/* A client of model name with nparams parameters; max_pending bounds the
 * gradients waiting in the stream (docs/design.md "Staleness and the controller"). NULL with
 * errstr when Redis is unreachable or the model does not exist or has
 * another size. Caller frees with psstore_client_destroy(). */
psstore_client_t *psstore_client_new(const char *url, const char *model, size_t nparams,
                                     int64_t max_pending, char *errstr, size_t size);
void psstore_client_destroy(psstore_client_t *cl);
const char *psstore_client_error(const psstore_client_t *cl);
/* psstore_conn_set_cancel for the client's connection. */
void psstore_client_set_cancel(psstore_client_t *cl, psstore_cancel_fn fn, void *arg);

/* Pulls the weights when the store holds another (epoch, version) than
 * (*epoch, *version): fills w[nparams], updates both and sets *changed.
 * One round trip when nothing changed; the weights, epoch and version are
 * read in one transaction, never a torn mix. */
fr_err_t psstore_pull(psstore_client_t *cl, float *w, uint64_t *epoch, int64_t *version,
                      int *changed);

/* A sharded model: each shard's (epoch, version) of the weights the last
 * pull left in the caller's buffer (psstore_pull and psstore_local_pull_at
 * keep it), for the gradient's `at`; NULL for a model of one shard. */
psstore_shard_at_t *psstore_client_at(psstore_client_t *cl);

/* Appends g to the grads stream, first waiting while more than max_pending
 * entries wait to be applied (up to timeout_ms; FR_ERR_TIMEOUT after). */
fr_err_t psstore_push(psstore_client_t *cl, const psstore_grad_t *g, int timeout_ms);
/* A sparse model's client (psstore/store/rows_sparse.h): its gradients pack
 * a batch's rows, so their length varies; the applier checks each one. */
void psstore_client_any_length(psstore_client_t *cl);
/* Pushes parts[k] to shard k's grads stream, k < n (the model's shards:
 * a sparse model's worker pushes each shard the gradient of its rows, with
 * that shard's epoch and version), each as psstore_push would, but every
 * shard's room check and then every XADD in flight at once: n shards in
 * two round trips' time. A failure leaves the shards that added theirs
 * holding it (the gap rule reads the batch again; they drop it as a
 * duplicate). psstore_client_last_id(cl) is then the last shard's entry,
 * psstore_client_last_id(psstore_client_shard(cl, k)) shard k's. */
fr_err_t psstore_push_each(psstore_client_t *cl, const psstore_grad_t *parts, int n,
                           int timeout_ms);
/* Shard k's own client (cl itself for a model of one shard; NULL for no
 * such shard): a sparse model's worker pushes each shard the gradient of
 * that shard's rows, and waits on each shard's entry. It belongs to cl. */
psstore_client_t *psstore_client_shard(psstore_client_t *cl, int k);
/* The connection of client cl (of its shard's node), for the reads a
 * worker makes besides pulls and pushes (a sparse model's rows): one
 * connection a shard serves both. It belongs to cl and its thread. */
psstore_conn_t *psstore_client_conn(psstore_client_t *cl);
/* psstore_quarantine_add on the client's model (the model's own tag, its
 * shards' too). */
fr_err_t psstore_client_quarantine(psstore_client_t *cl, const psstore_range_t *pos, size_t n);

/* The stream id of the last gradient this client pushed ("" before any). */
const char *psstore_client_last_id(const psstore_client_t *cl);
/* *waiting = 1 while gradient id (psstore_client_last_id) is still in the
 * grads stream, waiting for the applier; it leaves once applied or dropped. */
fr_err_t psstore_grad_waiting(psstore_conn_t *c, const char *model, const char *id, int *waiting);

/* Bytes this client moved to and from Redis (payloads). */
uint64_t psstore_client_bytes(const psstore_client_t *cl);

/* ------------------------------------------------------------------------
 * Membership and rounds, the worker's side (docs/design.md "Training
 * modes"). Workers heartbeat into freshet:{m}:members; in the round modes
 * (sync, backup, groups) the applier counts each group's closed rounds in
 * freshet:{m}:rounds, which workers wait on.
 * ---------------------------------------------------------------------- */
/* Writes m as the worker's entry (a heartbeat; the caller increments beat). */
fr_err_t psstore_member_beat(psstore_client_t *cl, const psstore_member_t *m);
/* Removes the worker's entry (a clean stop). */
fr_err_t psstore_member_leave(psstore_client_t *cl, const char *id);
/* Reads every entry into *members (grown as needed, *cap its capacity;
 * caller frees); entries that do not parse are skipped. */
fr_err_t psstore_members_read(psstore_client_t *cl, psstore_member_t **members, size_t *n,
                              size_t *cap);
/* The number of rounds the applier has closed for group (0 before any). */
fr_err_t psstore_round_read(psstore_client_t *cl, int group, int64_t *round);
/* Reads the count into *now and, while it is not past round, waits up to
 * block_ms (1..1000) for the applier's next transaction that closes a
 * round or publishes a version (XREAD BLOCK on the versions and drops
 * streams), then reads it again: no polling. The caller loops until *now
 * passes round or its own limit. */
fr_err_t psstore_round_wait(psstore_client_t *cl, int group, int64_t round, int block_ms,
                            int64_t *now);
/* The in-flight bound on the stream path (docs/design.md "Staleness and the
 * controller"): *applied = 1 once the applier has decided the pushed entry
 * `id` (applied or dropped, and committed: the entry left the grads
 * stream), else after blocking up to block_ms on the versions and drops
 * streams *applied = 0 and the caller looks again. */
fr_err_t psstore_applied_wait(psstore_client_t *cl, const char *id, int block_ms, int *applied);
/* Mode auto: the phase the applier holding the lease wrote into meta
 * (async when none). */
fr_err_t psstore_phase_read(psstore_client_t *cl, psstore_phase_t *phase);

/* ------------------------------------------------------------------------
 * The co-located fast path (docs/design.md "The co-located fast path"): in freshet run
 * the workers and the applier share a process, and gradients and weights
 * pass in memory. The channel is open while the applier attached to it
 * (psstore_applier_set_local) holds the lease; workers use the Redis path
 * otherwise. Any thread.
 * ---------------------------------------------------------------------- */
typedef struct psstore_local psstore_local_t;

/* A channel for nparams-float models with `slots` queued gradients at
 * most (the backpressure bound of the in-memory path). */
psstore_local_t *psstore_local_new(size_t nparams, size_t slots, char *errstr, size_t size);
/* A channel for a sharded model (docs/design.md "Shards"): one channel per
 * shard of bounds[S + 1], each attached to its shard's applier (S = 1: as
 * psstore_local_new). Pushes fan the slices out with each shard's
 * (epoch, version) from the gradient's `at`; pulls go through
 * psstore_local_pull_at; rounds and the in-flight wait cover every shard. */
psstore_local_t *psstore_local_new_shards(const size_t *bounds, int S, size_t slots, char *errstr,
                                          size_t size);
void psstore_local_destroy(psstore_local_t *l);
/* Nonzero while the attached applier holds the lease and takes gradients. */
int psstore_local_open(psstore_local_t *l);
/* As psstore_pull, from the applier's memory; FR_ERR_STATE when closed. */
fr_err_t psstore_local_pull(psstore_local_t *l, float *w, uint64_t *epoch, int64_t *version,
                            int *changed);
/* As psstore_local_pull without the copy: *w (NULL at first, then what
 * the last call gave) points at the applier's current weights, which the
 * caller holds, unchanged, until its next call or psstore_local_unhold.
 * When they moved since *w, *epoch and *version, the old ones are let go
 * and *changed is set. Each caller holds one version at most; a holder
 * costs the channel a model-sized buffer while the applier moves on. Not
 * for a sharded channel (FR_ERR_INVAL); FR_ERR_STATE when closed, and *w is
 * then still held. */
fr_err_t psstore_local_hold(psstore_local_t *l, const float **w, uint64_t *epoch, int64_t *version,
                            int *changed);
/* Lets go of weights w that psstore_local_hold gave (NULL: nothing). */
void psstore_local_unhold(psstore_local_t *l, const float *w);
/* A sharded channel: as psstore_local_pull, each shard's slice when that
 * shard moved since at (FR_ERR_STATE when any shard's channel is closed;
 * the slices pulled so far stay consistent with at). */
fr_err_t psstore_local_pull_at(psstore_local_t *l, float *w, psstore_shard_at_t *at, int *changed);
/* Queues a copy of g for the applier, waiting up to timeout_ms for a free
 * slot (FR_ERR_TIMEOUT); FR_ERR_STATE when the channel is closed (or
 * closes meanwhile): the caller abandons the batch, which the gap rule
 * reads again. *ticket (when not NULL) receives the push's ticket for
 * psstore_local_wait_applied. */
fr_err_t psstore_local_push(psstore_local_t *l, const psstore_grad_t *g, int timeout_ms,
                            uint64_t *ticket);
/* As psstore_local_push, without copying the gradient: g->g must be *buf, a
 * malloc'ed buffer of nparams floats, and on FR_OK the slot keeps it while
 * *buf receives the slot's previous buffer (same size, already touched) for
 * the caller's next gradient. Any other result leaves *buf as it was. The
 * caller frees whatever *buf holds at the end, as the channel frees its
 * slots'. It saves a copy of the model (813 KB for 784-256-10) per push. */
fr_err_t psstore_local_push_swap(psstore_local_t *l, const psstore_grad_t *g, float **buf,
                                 int timeout_ms, uint64_t *ticket);
/* As psstore_local_push_swap, for a pusher that is about to wait for the
 * gradient (psstore_local_wait_applied, the in-flight bound): when the
 * applier is between steps, its step (take what is queued, decide,
 * publish) runs in the calling thread instead of waking the applier's
 * thread and then being woken by it, two thread switches that cost more
 * than the step on a loaded machine (docs/design.md "The co-located fast
 * path"). When the applier is inside a step of its own (a stream read, a
 * commit being built; not while a commit waits for Redis) or not taking
 * gradients, the gradient is left to it and it is woken. */
fr_err_t psstore_local_push_help(psstore_local_t *l, const psstore_grad_t *g, float **buf,
                                 int timeout_ms, uint64_t *ticket);
/* As psstore_local_push_help, stepping in only while the applier's thread
 * waits for Redis (a commit's EXEC, a stream or requests read), when it
 * could take no gradient anyway: for a pool of several workers, whose
 * gradients the applier's thread otherwise decides (docs/design.md "The
 * co-located fast path"). */
fr_err_t psstore_local_push_help_away(psstore_local_t *l, const psstore_grad_t *g, float **buf,
                                      int timeout_ms, uint64_t *ticket);
/* Waits until the push of `ticket` has been decided by the applier and,
 * when applied, is in the weights psstore_local_pull returns (the
 * in-flight bound, docs/design.md "Staleness and the controller"): FR_OK,
 * FR_ERR_TIMEOUT after timeout_ms, FR_ERR_STATE when the channel closed
 * first (the gradient was lost). */
fr_err_t psstore_local_wait_applied(psstore_local_t *l, uint64_t ticket, int timeout_ms);
/* Mode auto: the phase the attached applier runs (FR_ERR_STATE when the
 * channel is closed; *phase is then the last one set). */
fr_err_t psstore_local_phase(psstore_local_t *l, psstore_phase_t *phase);
/* Round modes: the rounds group closed since the channel opened (as
 * psstore_round_read counts them in Redis), published together with the
 * weights they produced; and a wait until that count passes round
 * (FR_ERR_TIMEOUT after timeout_ms, FR_ERR_STATE when closed). Groups
 * below PS_LOCAL_GROUPS. */
#define PS_LOCAL_GROUPS 256
fr_err_t psstore_local_round(psstore_local_t *l, int group, int64_t *round);
fr_err_t psstore_local_round_wait(psstore_local_t *l, int group, int64_t round, int timeout_ms);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_PSSTORE_GRADS_H */
