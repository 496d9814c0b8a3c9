/*
 * applier_sparse.h - the rows of a sparse model that its applier holds
 * (applier_sparse.c; docs/design.md "Sparse models"): the table the
 * process's workers read, admission by a count sketch, eviction after a
 * ttl, and the marks that bound the changes stream's history. Private to
 * the applier.
 */
#ifndef FRESHET_PSSTORE_APPLIER_SPARSE_H
#define FRESHET_PSSTORE_APPLIER_SPARSE_H

#include <pthread.h>
#include <stdatomic.h>

#include "psstore/applier/applier_int.h"

#define PS_MARKS            256   /* (time, version) marks: the changes stream's window */
#define PS_DELTA_MS_DEFAULT 60000 /* [sparse] delta_seconds' default */
/* The window not yet written (docs/design.md "The store written behind"):
 * its commit starts early at PS_WINDOW_ROWS dirty rows or PS_WINDOW_GRADS
 * gradients, and in-process steps wait at four times either (one commit
 * in flight, the next window full: Redis is behind) */
#define PS_WINDOW_ROWS  65536
#define PS_WINDOW_GRADS 64
#define PS_PRELOAD_MAX  ((int64_t)1 << 24) /* rows a load reads whole at most */

/* A sparse model's rows held by its applier (applier_sparse.c). */
struct ps_sparse {
    /* freshet run's workers read the table (psstore_applier_rows): the
     * applier changes it only under the write lock, and reads it without */
    pthread_rwlock_t rw;
    int ready; /* the table, bias and version are the lease holder's */
    /* the table holds every row the store holds (a new model, or all of
     * them read at the load): a row it lacks is absent, never read */
    int complete;
    /* in-process steps (psstore_applier_sparse_step): the applier's poll
     * holds `step` except while it waits (on `wake`, or for Redis);
     * `window` gradients were decided since the last commit was queued
     * (its rows: ndirty) */
    int inproc;
    atomic_int accepting; /* ready and complete: a step may try the lock */
    pthread_mutex_t step;
    pthread_cond_t wake;
    size_t window;
    /* in-process decisions (under step): all of them, those a queued commit
     * carries and those a commit wrote; a state dropped with some not
     * written counts in `lost`, which the workers watch
     * (psstore_applier_sparse_lost) */
    uint64_t decided, queued_upto, committed_upto;
    atomic_ullong lost;
    pthread_mutex_t dmu;
    pthread_cond_t dcv;
    uint64_t dec_ms, dec_seq; /* the newest grads entry decided (dmu) */
    sparse_spec_t spec;
    sparse_optim_t optim;
    size_t rowlen, statelen; /* floats a row, and of its optimizer state */
    size_t vlen;             /* rowlen + statelen: a slot's value, as stored */
    uint32_t *keys;          /* [cap] open addressing: row + 1, 0 empty  */
    uint32_t *slot_of;       /* [cap] its slot                           */
    size_t cap;              /* a power of two, at least twice nslots    */
    uint32_t *rows;          /* [capslots] the row of each slot          */
    float *vals;             /* [capslots][vlen]: parameters, then state  */
    uint32_t *dirty;         /* [capslots] changed since the last commit: its
                                place in dirty_list + 1; 0 when clean        */
    uint32_t *dirty_list;    /* those slots                              */
    size_t ndirty, nslots, capslots;
    uint32_t *miss; /* scratch: the rows of a gradient the table lacks ...  */
    size_t nmiss, capmiss;
    float *loaded; /* ... their values in the store, [nmiss][vlen] ...     */
    size_t caploaded;
    uint8_t *got; /* ... and whether the store has them                   */
    size_t capgot;
    unsigned char *fields; /* scratch: their hash fields */
    size_t capfields;
    float *grad; /* scratch: one row's gradient, aligned */
    size_t capgrad;
    /* admission (conf min_count > 1): a count-min sketch of the gradients
     * that named each row the store lacks; NULL when every row is admitted */
    uint8_t *sketch; /* [PS_SKETCH_ROWS][PS_SKETCH_WIDTH], saturating */
    int min_count;
    /* eviction: a sweep of the rows hash (HSCAN) deletes rows not stepped
     * for ttl_ms; the changes stream: one entry a commit, its rows and
     * tombstones, kept delta_ms */
    int64_t ttl_ms, delta_ms;
    int64_t *touched;  /* [capslots] monotonic ms of its last step */
    int64_t load_ms;   /* rows not held were not stepped since        */
    char cursor[32];   /* the sweep's HSCAN cursor                    */
    int sweeping;      /* a sweep is under way                         */
    uint64_t sweep_ns; /* its last step, or the end of the last sweep */
    uint32_t *evict;   /* rows evicted since the last commit          */
    size_t nevict, capevict;
    unsigned char *blob; /* commit scratch: an entry's rows, then its tombstones */
    size_t capblob;
    int64_t entry_version;                       /* the changes stream's newest entry's id       */
    int64_t floor;                               /* meta's delta_floor                           */
    int64_t floor_next;                          /* ... once the commit that writes it succeeds  */
    int reset_changes;                           /* the stream is ahead of the version: delete it */
    int entry_queued;                            /* the commit under way adds an entry            */
    int64_t mark_ms[PS_MARKS], mark_v[PS_MARKS]; /* (time, version) of commits */
    size_t nmarks;
};
#define PS_SKETCH_ROWS  4
#define PS_SKETCH_BITS  16
#define PS_SKETCH_WIDTH ((size_t)1 << PS_SKETCH_BITS)

/* ---- applier_sparse.c ---------------------------------------------------- */
ps_sparse_t *ps_sparse_new(const psstore_sparse_conf_t *conf);
void ps_sparse_free(ps_sparse_t *sp);
/* Forgets every row held (a fresh load, a lost lease). */
void ps_sparse_clear(ps_sparse_t *sp);
/* The in-process decisions that no commit wrote, which a dropped state
 * loses: counted once in sp->lost (their positions are read again), and
 * returned. */
uint64_t ps_sparse_unwritten(ps_sparse_t *sp);
/* Whether g is a packed sparse gradient of this model: 1, with its m rows;
 * 0 malformed (size, a row beyond the table); -1 well formed but not
 * finite. */
int ps_sparse_shape(const psstore_applier_t *a, const psstore_grad_t *g, size_t *m);
/* Steps the m rows of g (reading those not held yet) and the bias. */
fr_err_t ps_sparse_apply(psstore_applier_t *a, const psstore_grad_t *g, size_t m);
/* The dirty rows were queued in a commit: the next commit writes what
 * changes from now on. */
void ps_sparse_committed(ps_sparse_t *sp);
/* The table becomes readable by the process's workers (the state is
 * loaded and the lease held), or stops being (before the state goes). */
void ps_sparse_ready(ps_sparse_t *sp, int ready);
/* The grads entry id was decided (applied or dropped). */
void ps_sparse_decided(ps_sparse_t *sp, const char *id);
/* After taking the lease: the changes stream's newest entry and meta's
 * delta_floor; the eviction clock starts. */
fr_err_t ps_sparse_load(psstore_applier_t *a);
/* One step of the eviction sweep when one is due (after a commit, nothing
 * dirty): rows not stepped for ttl leave the table, for the next commit to
 * delete. */
fr_err_t ps_sparse_sweep(psstore_applier_t *a);
/* Whether the table holds row (applier_commit.c: an evicted row a gradient
 * brought back is not deleted). */
int ps_sparse_holds(const ps_sparse_t *sp, uint32_t row);
/* Whether the changes stream holds entries older than delta_ms to trim:
 * an idle applier commits for them too (the stream must not stay at its
 * size when training stops). */
int ps_sparse_trim_due(const ps_sparse_t *sp);
/* The newest version committed at least age_ms ago by the marks, or -1. */
int64_t ps_sparse_version_before(const ps_sparse_t *sp, int64_t age_ms);
/* After a commit of version succeeded (entry: it added a changes stream
 * entry): the stream's state and the time marks. */
void ps_sparse_commit_done(psstore_applier_t *a, int64_t version, int entry);
/* The step lock of in-process steps (no-ops without them). */
void ps_sparse_step_enter(ps_sparse_t *sp);
void ps_sparse_step_leave(ps_sparse_t *sp);
/* The read phase of a poll with in-process steps: the stream's entries
 * (without blocking), then the wait, the step lock let go, until the
 * window is due (commit_ms, or full). */
fr_err_t ps_sparse_window_wait(psstore_applier_t *a, int block_ms);

#endif
