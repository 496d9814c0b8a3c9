/*
 * worker_modes.c - a worker's part in the training modes (docs/design.md
 * "Training modes"): its heartbeat into the members hash, mode auto's
 * phase, ssp's clock and wait for the slowest, the round modes' wait for
 * the group's round to close, and the idle flag.
 *
 * Threads: the worker's own.
 */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trainer/worker_int.h"

/* Writes the worker's members entry (a heartbeat). A failure is logged at
 * debug level only (the pull and push report the outage); the next beat
 * tries again. */
void trainer_worker_beat(worker_t *wk)
{
    wk->me.beat++;
    wk->beat_ns = fr_clock_mono_ns();
    if (psstore_member_beat(wk->cl, &wk->me) != FR_OK)
        fr_log(FR_LOG_DEBUG, "worker %s: heartbeat: %s", wk->id, psstore_client_error(wk->cl));
    /* mode auto through Redis: the phase is read with each beat */
    if (wk->pool->mode == PSSTORE_MODE_AUTO && !psstore_local_open(wk->pool->local) &&
        psstore_phase_read(wk->cl, &wk->phase) != FR_OK)
        fr_log(FR_LOG_DEBUG, "worker %s: phase: %s", wk->id, psstore_client_error(wk->cl));
}

/* Mode auto: the applier's phase, from the channel when it is open (each
 * step), else as the last beat read it from meta. */
static psstore_phase_t phase_now(worker_t *wk)
{
    psstore_phase_t ph;
    if (wk->pool->local != NULL && psstore_local_phase(wk->pool->local, &ph) == FR_OK)
        wk->phase = ph;
    return wk->phase;
}

void trainer_worker_beat_due(worker_t *wk)
{
    if (fr_clock_mono_ns() - wk->beat_ns >= BEAT_NS)
        trainer_worker_beat(wk);
}

/* The smallest (or, with want_max, the largest) clock among the other
 * live, non-idle members (members the applier has not removed), or -1 when
 * there is none. */
static int64_t peers_clock(worker_t *wk, int want_max)
{
    size_t n = 0;
    if (psstore_members_read(wk->cl, &wk->peers, &n, &wk->cap_peers) != FR_OK)
        return -1;
    int64_t best = -1;
    for (size_t i = 0; i < n; i++) {
        const psstore_member_t *m = &wk->peers[i];
        if (m->idle || strcmp(m->id, wk->id) == 0)
            continue;
        if (best < 0 || (want_max ? m->clock > best : m->clock < best))
            best = m->clock;
    }
    return best;
}

static int64_t slowest_clock(worker_t *wk)
{
    return peers_clock(wk, 0);
}

/* ssp: a newcomer, or a worker back from idle, starts at the current
 * minimum, or it would hold every other worker back while it catches up. */
void trainer_worker_ssp_join(worker_t *wk)
{
    int64_t min = slowest_clock(wk);
    if (min > wk->me.clock)
        wk->me.clock = min;
}

static void sleep_poll(void)
{
    struct timespec ts = {0, (long)POLL_NS};
    nanosleep(&ts, NULL);
}

/* ssp: waits while this worker's clock is more than the bound ahead of the
 * slowest live, non-idle member. */
void trainer_worker_ssp_wait(worker_t *wk)
{
    trainer_pool_t *p = wk->pool;
    uint64_t t0 = fr_clock_mono_ns();
    while (!atomic_load(&p->stop)) {
        if (p->mode == PSSTORE_MODE_AUTO && phase_now(wk) != PSSTORE_PHASE_SSP)
            break; /* auto left its ssp phase meanwhile */
        int64_t min = slowest_clock(wk);
        if (min < 0 || wk->me.clock - min <= p->ssp_bound)
            break;
        trainer_worker_beat_due(wk);
        sleep_poll();
    }
    atomic_fetch_add(&p->wait_ns, fr_clock_mono_ns() - t0);
}

/*
 * Whether this step keeps ssp's bound: always in mode ssp, in mode auto
 * while the applier's phase is ssp. Entering that phase a worker moves its
 * clock up to the fastest member's: the clocks counted every push of the
 * async phase, and ssp bounds the lead from now on, not a backlog.
 */
int trainer_worker_ssp_step(worker_t *wk)
{
    trainer_pool_t *p = wk->pool;
    if (p->mode == PSSTORE_MODE_SSP)
        return 1;
    if (p->mode != PSSTORE_MODE_AUTO)
        return 0;
    int ssp = phase_now(wk) == PSSTORE_PHASE_SSP;
    if (ssp && !wk->in_ssp) {
        int64_t max = peers_clock(wk, 1);
        if (max > wk->me.clock)
            wk->me.clock = max;
        trainer_worker_beat(wk);
    }
    wk->in_ssp = ssp;
    return ssp;
}

/* Round modes: the group's round count, from the in-process channel while
 * it is open (*local set), from Redis otherwise. */
fr_err_t trainer_worker_round_read(worker_t *wk, int64_t *round, int *local)
{
    trainer_pool_t *p = wk->pool;
    *local = p->local != NULL && psstore_local_round(p->local, wk->me.group, round) == FR_OK;
    return *local ? FR_OK : psstore_round_read(wk->cl, wk->me.group, round);
}

/* Round modes: waits until the group's round count passes `round` (the
 * round this worker's gradient joined closed), at most round_wait_ms, on
 * the source the count was read from. */
void trainer_worker_round_wait(worker_t *wk, int64_t round, int local)
{
    trainer_pool_t *p = wk->pool;
    uint64_t t0 = fr_clock_mono_ns();
    uint64_t limit = (uint64_t)p->round_wait_ms * 1000000ull;
    /* in steps, so that a stop is seen within NEXT_WAIT_MS */
    while (local && !atomic_load(&p->stop) && fr_clock_mono_ns() - t0 < limit) {
        fr_err_t err = psstore_local_round_wait(p->local, wk->me.group, round, NEXT_WAIT_MS);
        trainer_worker_beat_due(wk);
        if (err != FR_ERR_TIMEOUT)
            break;
    }
    /* Redis: blocks on the store's streams, ROUND_BLOCK_MS at a time */
    while (!local && !atomic_load(&p->stop) && fr_clock_mono_ns() - t0 < limit) {
        int64_t now = round;
        if (psstore_round_wait(wk->cl, wk->me.group, round, ROUND_BLOCK_MS, &now) != FR_OK ||
            now > round)
            break;
        trainer_worker_beat_due(wk);
    }
    atomic_fetch_add(&p->wait_ns, fr_clock_mono_ns() - t0);
}

/* Tracks whether the worker waits for data: idle after idle_ms without a
 * batch (rounds and ssp stop counting on it); b is what the queue gave. */
void trainer_worker_track_idle(worker_t *wk, const ingest_batch_t *b)
{
    trainer_pool_t *p = wk->pool;
    uint64_t now = fr_clock_mono_ns();
    if (b == NULL) {
        if (wk->want_ns == 0)
            wk->want_ns = now;
        if (!wk->me.idle && now - wk->want_ns >= (uint64_t)p->idle_ms * 1000000ull) {
            wk->me.idle = 1;
            trainer_worker_beat(wk);
        }
        return;
    }
    wk->want_ns = 0;
    if (wk->me.idle) {
        wk->me.idle = 0;
        if (p->mode == PSSTORE_MODE_SSP)
            trainer_worker_ssp_join(wk);
        trainer_worker_beat(wk);
    }
}
