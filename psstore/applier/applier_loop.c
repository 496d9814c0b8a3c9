/*
 * applier_loop.c - the applier's loop: each poll takes or renews the lease,
 * runs requests, reads gradients from the in-process channel and the grads
 * stream, decides them (applier_decide.c) and commits a window
 * (applier_commit.c); a pusher may run a step in its own thread while it
 * holds the step lock (docs/design.md "The co-located fast path").
 *
 * Thread: the applier's; a helping pusher's, with the step lock held.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "psstore/applier/applier_sparse.h"

/* What a failed poll says: the connection's error, or err's own where a
 * worker's step failed without touching the connection (it logged why). */
static const char *failure(psstore_applier_t *a, fr_err_t err)
{
    const char *why = psstore_conn_error(a->c);
    return why != NULL && why[0] != '\0' ? why : fr_strerror(err);
}

#define READ_COUNT        64         /* entries per XREADGROUP, at most ...       */
#define READ_BYTES        (16 << 20) /* ... and about this many payload bytes   */
#define SPARSE_GRAD_GUESS 16384      /* floats of a sparse gradient, for that estimate */
#define MEMBERS_MS        500        /* how often the applier reads the members hash     */
#define LOCAL_WAIT_MS     10         /* longest wait on the in-process channel per look  */
#define STREAM_NAP_NS     1000000u   /* a commit window's nap between empty stream reads */

/* ---- the loop ------------------------------------------------------------------------ */

/*
 * Reads up to READ_COUNT entries (our own pending ones first after a
 * takeover) and takes them, committing after each when commit_ms is 0.
 * Returns the number read through *nread.
 */
static fr_err_t read_and_apply(psstore_applier_t *a, int block_ms, int *nread)
{
    fr_err_t err;
    char count[16], block[16];
    size_t per_read = READ_BYTES / ((a->sp ? SPARSE_GRAD_GUESS : a->n) * sizeof(float) + 1);
    snprintf(count, sizeof(count), "%d",
             per_read < 1            ? 1
             : per_read > READ_COUNT ? READ_COUNT
                                     : (int)per_read);
    snprintf(block, sizeof(block), "%d", block_ms);
    const char *argv[12];
    int argc = 0;
    argv[argc++] = "XREADGROUP";
    argv[argc++] = "GROUP";
    argv[argc++] = GROUP;
    argv[argc++] = a->token;
    argv[argc++] = "COUNT";
    argv[argc++] = count;
    if (!a->read_own_pending && block_ms > 0) {
        argv[argc++] = "BLOCK";
        argv[argc++] = block;
    }
    argv[argc++] = "STREAMS";
    argv[argc++] = a->k_grads;
    argv[argc++] = a->read_own_pending ? a->pending_from : ">";
    size_t lens[12];
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    ps_applier_step_pause(a); /* pushers may step in during the round trip */
    redisReply *r = ps_cmd_argv(a->c, 1, argc, argv, lens, &err);
    ps_applier_step_resume(a);
    *nread = 0;
    if (r == NULL)
        return err;
    const redisReply *entries = NULL;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
        r->element[0]->type == REDIS_REPLY_ARRAY && r->element[0]->elements == 2)
        entries = r->element[0]->element[1];
    size_t n = entries && entries->type == REDIS_REPLY_ARRAY ? entries->elements : 0;
    if (a->read_own_pending && n == 0)
        a->read_own_pending = 0;
    if (a->read_own_pending && n > 0) {
        /* the next read continues after these: they stay pending until the
         * commit, so reading from "0" again would return them again */
        const redisReply *last = entries->element[n - 1];
        if (last->type == REDIS_REPLY_ARRAY && last->elements >= 1)
            ps_reply_str(last->element[0], a->pending_from, sizeof(a->pending_from));
    }
    for (size_t i = 0; i < n && a->active && ps_applier_reading(a); i++) {
        if ((err = ps_applier_take_entry(a, entries->element[i])) != FR_OK)
            break;
        if (a->conf.commit_ms == 0 && (err = ps_applier_commit(a)) != FR_OK)
            break;
    }
    *nread = (int)n;
    freeReplyObject(r);
    return err;
}

/* Decides the gradients queued on the in-process channel (waiting up to
 * wait_ms for the first). */
static fr_err_t take_local(psstore_applier_t *a, int wait_ms, int *n)
{
    const psstore_grad_t *gs[READ_COUNT];
    size_t k = ps_local_take(a->local, gs, READ_COUNT, wait_ms);
    fr_err_t err = FR_OK;
    for (size_t i = 0; i < k && a->active && ps_applier_reading(a); i++) {
        a->cur_id = LOCAL_ID;
        /* the slot's buffer is the channel's, ours until the release */
        a->cur_g = (float *)gs[i]->g;
        err = ps_applier_decide(a, gs[i]);
        a->cur_g = NULL;
        if (err != FR_OK)
            break;
    }
    ps_local_release(a->local);
    a->local_taken += k;
    *n = (int)k;
    return err;
}

/*
 * The step a pusher runs in its own thread (psstore_local_push_help), the
 * step lock held: what is queued is taken, decided and published, as this
 * thread's loop would. A dense model's only, while the lease is held and
 * gradients are read; an error is left for this thread's loop, which
 * reloads the state as after its own.
 */
int ps_applier_help_step(void *arg)
{
    psstore_applier_t *a = arg;
    if (!a->active || !ps_applier_reading(a) || a->sp != NULL || a->help_err != FR_OK)
        return 0;
    int n = 0;
    int64_t before = a->version;
    a->in_help = 1; /* no Redis from here: a commit may be waiting on it */
    fr_err_t err = take_local(a, 0, &n);
    a->in_help = 0;
    if (err != FR_OK)
        a->help_err = err;
    else if (a->active && (a->version != before || n > 0))
        ps_local_publish(a->local, a->w, a->epoch, a->version, a->local_rounds);
    return n;
}

/*
 * The read phase of a poll with the in-process channel attached: gradients
 * from it and (without blocking) from the stream, for commit_ms, or until
 * the first arrivals when commit_ms is 0 (waiting up to block_ms, in steps
 * of LOCAL_WAIT_MS, so stream entries wait no longer than that); the
 * weights are published to the workers after each step that applied.
 */
static fr_err_t read_local_and_stream(psstore_applier_t *a, int block_ms)
{
    uint64_t start = fr_clock_mono_ns();
    uint64_t window = (uint64_t)a->conf.commit_ms * 1000000ull;
    /* pushers' steps count too, those since the last read phase included */
    uint64_t taken = a->local_seen;
    int total = (int)(a->local_taken - taken), streamed = 0;
    for (;;) {
        uint64_t elapsed = fr_clock_mono_ns() - start;
        int wait_ms = 0;
        if (elapsed < window)
            wait_ms = (int)((window - elapsed) / 1000000ull) + 1;
        else if (total == 0 && elapsed < (uint64_t)block_ms * 1000000ull)
            wait_ms = block_ms - (int)(elapsed / 1000000ull);
        if (wait_ms > LOCAL_WAIT_MS)
            wait_ms = LOCAL_WAIT_MS;
        int nlocal = 0, nstream = 0;
        int64_t before = a->version;
        fr_err_t err = take_local(a, wait_ms, &nlocal);
        if (err == FR_OK && a->help_err != FR_OK) { /* a pusher's step failed */
            err = a->help_err;
            a->help_err = FR_OK;
        }
        if (err == FR_OK)
            ps_applier_stop_write(a); /* a pusher's step stopped the model */
        /* published at once, also after drops: a worker waiting for its
         * gradient to be decided (the in-flight bound) wakes on it, and
         * should not wait for the stream's round trip below */
        if (err == FR_OK && a->active && (a->version != before || nlocal > 0))
            ps_local_publish(a->local, a->w, a->epoch, a->version, a->local_rounds);
        /* the stream (trainers of other processes) is read every
         * LOCAL_WAIT_MS, and at once again while it delivers */
        uint64_t now = fr_clock_mono_ns();
        before = a->version;
        if (err == FR_OK && a->active &&
            (a->stream_busy || now - a->stream_ns >= LOCAL_WAIT_MS * 1000000ull)) {
            a->stream_ns = now;
            err = read_and_apply(a, 0, &nstream);
            a->stream_busy = nstream > 0;
        }
        if (err != FR_OK || !a->active)
            return err;
        if (a->version != before)
            ps_local_publish(a->local, a->w, a->epoch, a->version, a->local_rounds);
        streamed += nstream;
        total = (int)(a->local_taken - taken) + streamed;
        elapsed = fr_clock_mono_ns() - start;
        if (elapsed >= window && (total > 0 || elapsed >= (uint64_t)block_ms * 1000000ull)) {
            a->local_seen = a->local_taken;
            /* a pusher's step that failed during the stream read: its half
             * decision must not be committed (the poll reloads) */
            err = a->help_err;
            a->help_err = FR_OK;
            return err;
        }
    }
}

/*
 * The read phase of a poll without the in-process channel. The first read
 * waits up to block_ms for a gradient. The rest of the commit window reads
 * without blocking and naps here between empty reads: Redis ends a short
 * BLOCK only at its next hz tick (100 ms by default), and a lull is the
 * usual case in the round modes, whose workers wait for the close. A closed
 * or ready round ends the window at once, and so does an empty read when
 * the pushers bound their gradients in flight (commit_drained): each waits
 * for this commit before its next pull, so nothing more is coming.
 */
static fr_err_t read_stream(psstore_applier_t *a, int block_ms)
{
    uint64_t start = fr_clock_mono_ns();
    uint64_t window = (uint64_t)a->conf.commit_ms * 1000000ull;
    int nread;
    fr_err_t err = read_and_apply(a, block_ms, &nread);
    if (err != FR_OK)
        return err;
    while (a->active && nread > 0 && window > 0 && !ps_applier_rounds_waiting(a)) {
        uint64_t elapsed = fr_clock_mono_ns() - start;
        if (elapsed >= window)
            break;
        int more;
        if ((err = read_and_apply(a, 0, &more)) != FR_OK)
            return err;
        if (more == 0 && a->conf.commit_drained)
            break;
        if (more == 0) {
            uint64_t nap = window - elapsed < STREAM_NAP_NS ? window - elapsed : STREAM_NAP_NS;
            struct timespec ts = {0, (long)nap};
            nanosleep(&ts, NULL);
        }
    }
    return FR_OK;
}

static fr_err_t poll_(psstore_applier_t *a, int block_ms)
{
    fr_err_t err = FR_OK;
    if (!a->active) {
        err = ps_applier_try_acquire(a);
        atomic_store(&a->tried, 1);
        if (err != FR_OK)
            return err;
        if (!a->active) {
            /* a standby: look again soon, the lease may expire any moment */
            struct timespec ts = {0, (long)(block_ms < 100 ? block_ms : 100) * 1000000L};
            ps_applier_step_pause(a); /* pushers are not kept waiting on a standby */
            nanosleep(&ts, NULL);
            ps_applier_step_resume(a);
            return FR_OK;
        }
    }
    ps_applier_stop_write(a);   /* a pusher's step between polls stopped the model */
    if (a->help_err != FR_OK) { /* ... or failed: reload before anything commits */
        err = a->help_err;
        a->help_err = FR_OK;
        goto out;
    }
    if (a->c->reconnects != a->reconnects) {
        /* The connection was re-established under us: Redis may have
         * restarted (losing writes), so reload and let the run_id check
         * decide whether a new epoch starts. */
        fr_log(FR_LOG_WARN, "applier %s: reconnected to Redis; reloading its state", a->model);
        ps_applier_drop_state(a);
        return ps_applier_try_acquire(a);
    }
    if ((err = ps_applier_renew(a)) != FR_OK || !a->active)
        goto out;
    if (fr_clock_mono_ns() - a->claim_ns > (uint64_t)a->conf.lease_ms * 1000000ull) {
        /* entries a stale applier claimed after losing the lease sit idle
         * in its consumer: take those idle longer than a lease */
        a->claim_ns = fr_clock_mono_ns();
        if ((err = ps_applier_claim_pending(a, (long long)a->conf.lease_ms)) != FR_OK)
            goto out;
    }
    if ((err = ps_applier_run_requests(a)) != FR_OK || !a->active)
        goto out;
    if (a->conf.requests_only)
        return FR_OK;
    if (!ps_applier_reading(a)) {
        struct timespec ts = {0, (long)(block_ms < 500 ? block_ms : 500) * 1000000L};
        ps_applier_step_pause(a); /* a pusher finds it not reading without waiting */
        nanosleep(&ts, NULL);
        ps_applier_step_resume(a);
        return FR_OK;
    }
    if (a->local != NULL)
        err = read_local_and_stream(a, block_ms);
    else if (a->sp != NULL && a->sp->inproc)
        err = ps_sparse_window_wait(a, block_ms);
    else
        err = read_stream(a, block_ms);
    if (err != FR_OK)
        goto out;
    /* members: removed after member_timeout in every mode; rounds close on
     * a departure or at round_timeout */
    if (a->active && fr_clock_mono_ns() - a->members_ns > MEMBERS_MS * 1000000ull &&
        (err = ps_applier_refresh_members(a)) != FR_OK)
        goto out;
    if (a->active && psstore_mode_rounds(a->conf.mode) &&
        (err = ps_applier_rounds_close(a, 0)) != FR_OK)
        goto out;
    if (a->active && (err = ps_auto_tick(a)) != FR_OK)
        goto out;
    if (a->active)
        err = ps_applier_commit_letting_go(a);
    if (err == FR_OK && a->active && a->sp != NULL)
        err = ps_sparse_sweep(a); /* rows it evicts go with the next commit */
    if (err == FR_OK && a->active && a->local != NULL)
        ps_local_publish(a->local, a->w, a->epoch, a->version, a->local_rounds);
out:
    if (err != FR_OK && a->active) {
        /* unknown whether the last transaction landed: reload from Redis */
        fr_log(FR_LOG_WARN, "applier %s: %s; reloading state", a->model, failure(a, err));
        ps_applier_drop_state(a);
    }
    return err;
}

/*
 * Removes this applier's consumer from the group when it holds no pending
 * entry, so consumers of stopped appliers do not pile up. One with pending
 * entries stays: deleting it would orphan them (the next takeover claims
 * them instead).
 */
static void forget_consumer(psstore_applier_t *a)
{
    fr_err_t err;
    redisReply *r = ps_cmd(a->c, 0, &err, "XPENDING %s %s - + 1 %s", a->k_grads, GROUP, a->token);
    int idle = r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 0;
    freeReplyObject(r);
    if (idle)
        freeReplyObject(
            ps_cmd(a->c, 0, &err, "XGROUP DELCONSUMER %s %s %s", a->k_grads, GROUP, a->token));
}

/* The connection's cancel test: the run's stop flag (an atomic_int). */
static int stop_set(void *arg)
{
    return atomic_load((const atomic_int *)arg) != 0;
}

int psstore_applier_tried(psstore_applier_t *a)
{
    return atomic_load(&a->tried);
}

fr_err_t ps_applier_read_stream_once(psstore_applier_t *a, int *nread)
{
    return read_and_apply(a, 0, nread);
}

/* The step lock: the dense channel's, or a sparse model's in-process
 * steps' (applier_sparse.c). */
static void step_enter(psstore_applier_t *a)
{
    if (a->local != NULL)
        ps_local_step_enter(a->local);
    ps_sparse_step_enter(a->sp);
}

static void step_leave(psstore_applier_t *a)
{
    ps_sparse_step_leave(a->sp);
    if (a->local != NULL)
        ps_local_step_leave(a->local);
}

void ps_applier_step_pause(psstore_applier_t *a)
{
    if (a->local != NULL && a->sp == NULL)
        ps_local_step_away(a->local);
    ps_sparse_step_leave(a->sp);
}

void ps_applier_step_resume(psstore_applier_t *a)
{
    if (a->local != NULL && a->sp == NULL)
        ps_local_step_back(a->local);
    ps_sparse_step_enter(a->sp);
}

/* A poll holds the step lock: pushers step in only between polls, while
 * it waits for gradients (ps_local_take, ps_sparse_window_wait) and during
 * the round trips that let go of it (ps_applier_step_pause). */
fr_err_t psstore_applier_poll(psstore_applier_t *a, int block_ms)
{
    step_enter(a);
    fr_err_t err = poll_(a, block_ms);
    step_leave(a);
    return err;
}

fr_err_t psstore_applier_run(psstore_applier_t *a, const atomic_int *stop)
{
    /* with Redis gone, a stop does not wait out reconnect backoffs: the
     * last commit and the lease release fail at once (the lease expires,
     * unapplied work is read again) */
    psstore_conn_set_cancel(a->c, stop_set, (void *)(uintptr_t)stop);
    int backoff = 10;
    while (!atomic_load(stop)) {
        fr_err_t err = psstore_applier_poll(a, 200);
        if (err == FR_OK) {
            backoff = 10;
            continue;
        }
        fr_log(FR_LOG_WARN, "applier %s: %s (retrying in %d ms)", a->model, failure(a, err),
               backoff);
        struct timespec ts = {backoff / 1000, (long)(backoff % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        backoff = backoff < 2000 ? backoff * 2 : 2000;
    }
    step_enter(a);
    ps_applier_stop_write(a); /* a stop a pusher's last step decided */
    if (a->active) {
        ps_applier_commit(a);
        fr_err_t err;
        static const char *script =
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) "
            "else return 0 end";
        freeReplyObject(ps_cmd(a->c, 0, &err, "EVAL %s 1 %s %s", script, a->k_lease, a->token));
        ps_applier_drop_state(a);
    }
    step_leave(a);
    forget_consumer(a);
    return FR_OK;
}
