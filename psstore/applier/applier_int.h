/*
 * applier_int.h - what the applier's sources share: its state and the
 * functions one of them defines for the others. Only psstore/applier/
 * includes it. The applier: docs/design.md "One writer and fencing".
 *
 *   applier.c           construction, the metrics, the stats
 *   applier_decide.c    deciding one gradient (positions, the controller)
 *   applier_loop.c      the loop: lease, requests, reads, commits
 *   applier_commit.c    the MULTI/EXEC transaction of a commit
 *   applier_rounds.c    membership and the rounds of the round modes
 *   applier_requests.c  operator requests: rollback, rewind, replay, delete
 *   applier_lease.c     the lease, loading the state, fencing, the
 *                       divergence guard
 *   applier_auto.c      mode auto's phases
 *   applier_sparse.c    a sparse model's rows (applier_sparse.h)
 *
 * Thread: every function here runs on the applier's thread.
 */
#ifndef FRESHET_PSSTORE_APPLIER_INT_H
#define FRESHET_PSSTORE_APPLIER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "psstore/applier/applier.h"
#include "psstore/grads/grads_int.h"

#define TAU_RING      256 /* applied gradients the staleness percentiles cover */
#define FRESH_RING    512 /* freshness samples (two per applied batch) kept    */
#define GROUP         "appliers"
#define GUARD_WINDOW  100 /* divergence guard: last 100 gradients    */
#define GUARD_MAX_BAD 5   /* more than 5% non-finite stops the model */
#define MAX_SNAPS     1024
#define MAX_GROUPS    256      /* worker groups a round-mode applier keeps rounds for */
#define LOCAL_ID      SIZE_MAX /* cur_id of a gradient from the in-process channel */

/* One partition's offsets as the applier holds them. */
typedef struct part {
    char key[272]; /* "<topic>/<partition>", the offsets hash field */
    psstore_partition_offsets_t po;
    int dirty; /* changed since the last commit */
} part_t;

/* A member as the applier last read it, and when its beat last changed
 * (on the applier's clock: no two machines' clocks are compared). */
typedef struct seen {
    psstore_member_t m;
    uint64_t changed_ns;
} seen_t;

/* A gradient held in an open round: what marking, auditing and
 * acknowledging it at the close needs (its values are in the round's sum). */
typedef struct held {
    char id[64];
    char worker[256];
    int64_t version, generation, n;
    double loss_sum;
    int64_t ts_min_ms, ts_max_ms;
    psstore_range_t *ranges; /* topics point into topics */
    size_t nranges, cap_ranges;
    char *topics;
    size_t cap_topics;
} held_t;

/* The open round of one group (docs/design.md "Training modes"). */
typedef struct round {
    int open;
    int64_t version;       /* the store's version when it opened          */
    uint64_t opened_ns;    /* when its first gradient arrived             */
    char (*expected)[256]; /* live, non-idle members of the group at open */
    uint8_t *arrived;
    size_t nexpected, narrived, cap_expected;
    held_t *held;
    size_t nheld, cap_held;
    double *sum; /* [n]: sample-weighted sum of the held gradients */
    int64_t nsamples, min_version;
    double loss_sum;
} round_t;

/* Mode auto (applier_auto.c): a worker's gradients in the current window. */
#define AUTO_MAX_WORKERS 256
#define AUTO_INDEX       512 /* slots of the id index: a power of two, twice the workers */
#define AUTO_MAX_TAUS    4096
typedef struct auto_worker {
    char id[128];
    uint32_t arrivals; /* gradients received this window        */
    double tau_sum;    /* their summed staleness at arrival      */
    int absent;        /* windows in a row without one           */
    int straggler;     /* judged a straggler at the last window  */
} auto_worker_t;

typedef struct auto_state {
    psstore_phase_t phase;
    uint64_t window_ns; /* the current window began           */
    auto_worker_t workers[AUTO_MAX_WORKERS];
    int nworkers;
    int16_t index[AUTO_INDEX];   /* by id hash, linear probing: 1 + a workers[] entry, 0 free */
    int64_t taus[AUTO_MAX_TAUS]; /* applied this window, stragglers' aside */
    size_t ntaus;
    int calm;          /* windows in a row that called for another phase */
    uint64_t switches; /* since this applier started        */
    int shown;         /* meta holds the current phase      */
    fr_series_t *m_switch[PSSTORE_NPHASE][PSSTORE_NPHASE];
} auto_state_t;

/* A sparse model's rows held by its applier (applier_sparse.h). */
typedef struct ps_sparse ps_sparse_t;

struct psstore_applier {
    psstore_applier_conf_t conf;
    auto_state_t au;         /* mode auto */
    _Atomic int64_t samples; /* applied by this applier (conf.sample_limit) */
    char url[512];
    char model[PS_TAG_MAX]; /* the tag of its keys: the model's name, or
                               "<model>/s<k>" for shard k of a sharded one */
    char name[65];          /* the model's name                        */
    int shard, nshards;     /* shard k of S (0 of 1 unsharded)           */
    char token[160];        /* lease token and consumer name: host/pid/random/scope */
    char k_lease[PS_KEY_MAX], k_meta[PS_KEY_MAX], k_ver[PS_KEY_MAX], k_w[PS_KEY_MAX];
    char k_opt[PS_KEY_MAX], k_off[PS_KEY_MAX], k_grads[PS_KEY_MAX], k_versions[PS_KEY_MAX];
    char k_drops[PS_KEY_MAX];
    char k_audit[PS_KEY_MAX], k_snaps[PS_KEY_MAX], k_pub[PS_KEY_MAX], k_req[PS_KEY_MAX];
    char k_members[PS_KEY_MAX], k_rounds[PS_KEY_MAX], k_avg[PS_KEY_MAX];
    psstore_conn_t *c;
    psstore_local_t *local; /* the in-process channel of freshet run, or NULL */
    ps_sparse_t *sp;        /* a sparse model's rows; NULL for a dense one    */
    uint64_t stream_ns;     /* with it: when the stream was last read ...    */
    int stream_busy;        /* ... and whether that read found entries       */
    /* the channel's gradients taken so far, by this thread or by pushers
     * stepping in (psstore_local_push_help), and the first error such a
     * pusher's step met, for this thread to act on (FR_OK: none) */
    uint64_t local_taken, local_seen; /* ... and by the last read phase's end */
    fr_err_t help_err;
    /* a pusher's step is running (it must not touch the connection: a
     * commit may be waiting for its replies), and the divergence guard's
     * stop it decided, written by this thread at its next step */
    int in_help, stop_write_due;
    /* the first poll's attempt at the lease has ended (psstore_applier_tried) */
    atomic_int tried;
    /* tests (ps_applier_commit_wait_for_test): called while a commit that
     * let go of the step lock waits for Redis */
    void (*commit_wait_fn)(void *);
    void *commit_wait_arg;

    /* state, valid while active */
    int active;
    int read_own_pending;  /* after taking over: drain our PEL first */
    char pending_from[64]; /* ... from after this id                   */
    unsigned reconnects;   /* c->reconnects when the state was loaded  */
    uint64_t claim_ns;     /* last sweep for entries stuck elsewhere   */
    uint64_t epoch;
    int64_t version, committed;
    size_t n, opt_len;
    float *w, *opt, *g;
    float *avg;       /* the served average of w (docs/design.md "The served
                         average"); NULL when off, and for a sparse model */
    int64_t avg_seen; /* samples averaged so far (psstore_average_weight) */
    int avg_stale;    /* no average kept, and avg:0 may hold an old one
                         (after a load or a rollback): the next commit
                         that writes the weights deletes it */
    psstore_ctl_t *ctl;
    part_t *parts;
    size_t nparts, cap_parts;
    uint64_t renew_ns;        /* when the lease was last extended */
    int64_t snaps[MAX_SNAPS]; /* retained snapshot versions, oldest first */
    size_t nsnaps;
    int64_t snap_version;
    uint64_t snap_ns;
    int64_t snap_req; /* shards 1..S-1: shard 0's snapshot id to take at the
                         next commit (a "snapshot" request); 0 none      */
    double last_loss; /* mean loss of the last applied gradient */

    /* pending for the next commit */
    int new_epoch;           /* write meta.epoch (rollback)          */
    int offsets_reset;       /* DEL offsets before writing them all  */
    char req_id[64];         /* a request executed by this commit    */
    int64_t replay_gen;      /* > 0: publish this replay in meta ... */
    const char *replay_spec; /* ... with this text (the request's) */
    const char *replay_when; /* ... requested at (unix ms text)    */
    fr_buf_t ids;            /* stream ids, NUL separated */
    size_t nids;
    fr_buf_t versions; /* versions entries: "field\0value\0..." per entry, \1 between */
    fr_buf_t drops;    /* drops entries, the same way                   */
    fr_buf_t audit;
    int weights_dirty;

    /* membership and rounds */
    seen_t *seen;
    size_t nseen, cap_seen;
    psstore_member_t *mbuf; /* read buffer of the members hash */
    size_t cap_mbuf;
    uint64_t members_ns; /* when the members were last read */
    round_t rounds[MAX_GROUPS];
    int64_t closed[MAX_GROUPS];       /* rounds closed since the last commit */
    int64_t local_rounds[MAX_GROUPS]; /* ... since the in-process channel opened */
    size_t cur_id;                    /* offset in ids of the entry being decided */
    float *cur_g;                     /* its gradient, writable in place (a slot of
                                         the in-process channel), or NULL: copy it */

    /* divergence guard */
    uint8_t guard[GUARD_WINDOW];
    int guard_pos, guard_fill, guard_bad;
    char stopped[256];

    ps_grad_msg_t msg;
    pthread_mutex_t lock; /* guards stats */
    psstore_applier_stats_t stats;

    fr_series_t *m_applied, *m_dropped[PSSTORE_NDROP], *m_stale, *m_lr, *m_version, *m_loss,
        *m_bytes, *m_latency, *m_commit_latency, *m_commits, *m_fenced, *m_summed;
    fr_series_t *m_unreplicated; /* commits short of wait_replicas replicas */
    fr_series_t *m_evicted;      /* a sparse model's rows evicted after ttl  */
    fr_series_t *m_stopped;      /* 1 while the divergence guard stops it    */
    fr_series_t *m_takeovers;    /* times this applier took the lease        */
    fr_series_t *m_updated;      /* unix time of its last new version        */
    fr_metric_t *m_epoch;        /* freshet_model_epoch_info{model,epoch} 1 */
    char shown_epoch[32];        /* the epoch that metric shows as current */
    int64_t taus[TAU_RING];      /* staleness of the last applied gradients (lock) */
    uint64_t ntaus;
    /* freshness: Kafka timestamps of the samples applied since the last
     * commit (oldest, newest per batch), and after it, the milliseconds
     * from those timestamps to the commit that made them visible (lock) */
    int64_t *ts_pending;
    size_t nts_pending, cap_ts_pending;
    int64_t fresh[FRESH_RING];
    uint64_t nfresh;
    fr_series_t *m_fresh;
};

/* ---- applier.c ---------------------------------------------------------------- */

/* Appends len bytes of p to b (common/buf.c): 0, or -1 when an allocation
 * failed, which b keeps (b->failed) until fr_buf_reset. */
static inline int ps_buf_add(fr_buf_t *b, const void *p, size_t len)
{
    fr_buf_add(b, p, len);
    return b->failed ? -1 : 0;
}
/* Appends "field\0value\0" to b (value formatted, truncated to 511 bytes). */
int ps_buf_kv(fr_buf_t *b, const char *field, const char *fmt, ...) FR_PRINTF(3, 4);
/* Publishes active, epoch, version and stopped to the stats and metrics. */
void ps_applier_stats_update(psstore_applier_t *a);
/* Counts a drop of reason d and, when g is known, records it for the
 * drops stream (written with the next commit). */
void ps_applier_count_drop(psstore_applier_t *a, psstore_drop_t d, const psstore_grad_t *g);
/* Forgets everything held in memory (lease lost, stop, or a fresh load). */
void ps_applier_drop_state(psstore_applier_t *a);
/* Forgets what the next commit would write besides weights and offsets
 * (after a commit, or with the whole state). */
void ps_applier_forget_pending(psstore_applier_t *a);
/* The part of it only the applier's thread adds to (the consumed ids, a
 * sparse model's rows, the epoch and offsets resets, the request and the
 * replay); a pusher's step adds to the rest (versions, drops, audit,
 * weights), which a commit forgets as it sends them. */
void ps_applier_forget_own(psstore_applier_t *a);
/* The offsets of topic/partition, added (watermark 0) when create is set;
 * NULL when absent, or out of memory. */
part_t *ps_applier_find_part(psstore_applier_t *a, const char *topic, int32_t partition,
                             int create);
/* Audits g with outcome and marks its positions. */
fr_err_t ps_applier_decide_mark(psstore_applier_t *a, const psstore_grad_t *g, const char *outcome);
/* Notes an applied batch's Kafka timestamps for the freshness figures. */
void ps_applier_note_ts(psstore_applier_t *a, int64_t ts_min, int64_t ts_max);
/* Records the versions-stream entry of the update just applied. */
void ps_applier_version_entry(psstore_applier_t *a, const psstore_grad_t *g,
                              const psstore_decision_t *d);

/* ---- applier_decide.c, applier_loop.c ------------------------------------------ */

/* Decides one decoded gradient and applies it in memory (applier_decide.c)
 * in the order of docs/design.md "Offsets": epoch, duplicates, then the
 * controller. */
fr_err_t ps_applier_decide(psstore_applier_t *a, const psstore_grad_t *g);
/* Decodes the grads stream entry and decides it (applier_decide.c). */
fr_err_t ps_applier_take_entry(psstore_applier_t *a, const redisReply *entry);
/* The step a pusher runs in its own thread (psstore_local_push_help),
 * with the step lock held; arg is the applier (applier_loop.c). */
int ps_applier_help_step(void *arg);

/* ---- applier_commit.c ---------------------------------------------------------- */

/* Commits everything applied or dropped since the last commit in one
 * transaction guarded by WATCH lease; a lost lease is not an error. */
fr_err_t ps_applier_commit(psstore_applier_t *a);
/* As ps_applier_commit, letting go of the channel's step lock while it
 * waits for Redis's replies, so that a pusher may take its step meanwhile
 * (the read phase's commit; not a request's, which must write nothing
 * else). */
fr_err_t ps_applier_commit_letting_go(psstore_applier_t *a);
/* One read of the grads stream without blocking, its entries decided. */
fr_err_t ps_applier_read_stream_once(psstore_applier_t *a, int *nread);
/* Lets go of the step lock around a round trip to Redis in a poll, and
 * takes it back, when pushers may step in (a dense model on a channel,
 * docs/design.md "The co-located fast path"; a sparse model's in-process
 * steps, "The store written behind"): the caller reads or writes no state
 * a pusher's step touches in between. */
void ps_applier_step_pause(psstore_applier_t *a);
void ps_applier_step_resume(psstore_applier_t *a);
/* Tests only: fn(arg) runs in the applier's thread each time such a commit
 * has let go of the step lock, before it reads Redis's replies: what a
 * pusher's step would do meanwhile, made deterministic (NULL: none). */
void ps_applier_commit_wait_for_test(psstore_applier_t *a, void (*fn)(void *), void *arg);

/* ---- applier_rounds.c ---------------------------------------------------------- */

/* Reads the members hash and removes members silent for member_timeout. */
fr_err_t ps_applier_refresh_members(psstore_applier_t *a);
/* The pushers the delay and adaptive policies count on: the live, non-idle
 * members last read, or conf.npushers ([trainer] workers) before any is
 * known. */
int ps_applier_pushers(const psstore_applier_t *a);
/* Whether the applier takes gradients: not stopped by the divergence guard
 * and below its sample limit. */
int ps_applier_reading(const psstore_applier_t *a);
/* After an update of n samples (a->w moved): the served average follows. */
void ps_applier_average(psstore_applier_t *a, int64_t n);
/* Starts the served average from stored, a reply holding a stored one
 * (avg:0 or a snapshot's field; its horizon counts as full), or from a->w
 * when stored is not a string of a->n floats. Allocates it when the model
 * has one (a dense model, [controller] average > 0); a requests-only
 * applier keeps the stored one as it is, and none without it. */
fr_err_t ps_applier_average_start(psstore_applier_t *a, const redisReply *stored);

/* applier_lease.c: sets up to two meta fields when this applier still
 * holds the lease (*done = 1); f2 may be NULL. */
fr_err_t ps_applier_meta_set(psstore_applier_t *a, int *done, const char *f1, const char *v1,
                             const char *f2, const char *v2);

/* applier_auto.c, mode auto (docs/design.md "Mode auto"): the state and
 * the switch counters; notes g's arrival and says whether it is a
 * backup's stale gradient to drop; notes an applied gradient's staleness;
 * decides the phase once a window and publishes it. */
void ps_auto_init(psstore_applier_t *a);
int ps_auto_backup_drop(psstore_applier_t *a, const psstore_grad_t *g);
void ps_auto_note_tau(psstore_applier_t *a, const char *worker, int64_t tau);
fr_err_t ps_auto_tick(psstore_applier_t *a);
/* Nonzero when a round closed since the last commit or is ready to. */
int ps_applier_rounds_waiting(const psstore_applier_t *a);
/* Closes every ready round (with all set: every one holding a gradient). */
fr_err_t ps_applier_rounds_close(psstore_applier_t *a, int all);
/* Nonzero when stream entry id[len] is held in an open round. */
int ps_applier_is_held(const psstore_applier_t *a, const char *id, size_t len);
/* Nonzero when a position of g is covered by a gradient an open round holds. */
int ps_applier_overlaps_held(const psstore_applier_t *a, const psstore_grad_t *g);
/* The round modes' part of deciding a gradient with samples. */
fr_err_t ps_applier_round_take(psstore_applier_t *a, const psstore_grad_t *g);

/* ---- applier_requests.c -------------------------------------------------------- */

/* Executes the requests waiting in freshet:{m}:requests, oldest first. */
fr_err_t ps_applier_run_requests(psstore_applier_t *a);

/* ---- applier_lease.c ----------------------------------------------------------- */

/* A reply's string (or integer) as a NUL-terminated copy in out[size]. */
void ps_reply_str(const redisReply *r, char *out, size_t size);
/* "<boot id>.<pid namespace inode>" of this process ("" when unknown): the
 * last part of its lease token. */
void ps_applier_scope(char *out, size_t size);
/* Takes the lease when it is free, or held by a dead process of this
 * machine, and loads the state behind it. */
fr_err_t ps_applier_try_acquire(psstore_applier_t *a);
/* Claims the entries pending on other consumers for min_idle_ms or more. */
fr_err_t ps_applier_claim_pending(psstore_applier_t *a, long long min_idle_ms);
/* Extends the lease when a third of it has passed without a commit. */
fr_err_t ps_applier_renew(psstore_applier_t *a);
/* The lease was lost (when: where it was noticed): back to standby. */
void ps_applier_fenced(psstore_applier_t *a, const char *when);
/* WATCH lease and GET it; *ours = 0 (UNWATCH sent) when it is not ours. */
fr_err_t ps_applier_watch_lease(psstore_applier_t *a, int *ours);
/* Writes meta.stopped = reason under the lease (the divergence guard). */
void ps_applier_stop_model(psstore_applier_t *a, const char *reason);
/* Writes the stop a pusher's step decided, if any (the applier's thread). */
void ps_applier_stop_write(psstore_applier_t *a);
/* Records one gradient in the divergence guard's window (bad: non-finite);
 * stops the model when too many of the window were. */
void ps_applier_guard_record(psstore_applier_t *a, int bad);

#endif
