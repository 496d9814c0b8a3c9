/*
 * local.c - the co-located fast path (docs/design.md "The co-located fast path"): when
 * the applier runs in the same process as the workers (freshet run),
 * gradients and weights pass in memory instead of through Redis.
 *
 * The applier publishes its weights here after it applies, and takes the
 * queued gradients in FIFO order; Redis still receives every committed
 * version, its weights and offsets, so what readers see and the exactly-
 * once effect are unchanged: a gradient lost here (the applier lost its
 * lease, or the process died) never had its positions recorded, and the
 * gap rule reads them again from Kafka.
 *
 * The channel is open only while the applier holds the lease with its
 * state loaded; otherwise workers use the Redis path (another process's
 * applier may hold the lease).
 *
 * Threads: every function may be called from any thread; one mutex guards
 * everything. Gradients are copied in, or with psstore_local_push_swap (the
 * workers' way) trade buffers with the slot. Weights are snapshots: the
 * applier copies each version into a buffer nobody holds, outside the
 * lock, and makes it current; a worker holds the current one and computes
 * on it in place (psstore_local_hold) or copies it out (psstore_local_pull).
 * A buffer is written again only once nobody holds it, so a holder reads a
 * version that never changes under it (docs/design.md "The co-located fast
 * path").
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "psstore/grads/grads_int.h"

typedef struct slot {
    float *g; /* [n] */
    psstore_range_t *ranges;
    size_t cap_ranges;
    char *topics;
    size_t cap_topics;
    char worker[256];
    char reason[64];
    psstore_grad_t msg; /* points into the above */
} slot_t;

struct psstore_local {
    pthread_mutex_t lock;
    pthread_cond_t room; /* a slot was freed, or the channel closed */
    pthread_cond_t work; /* a gradient was queued                   */
    size_t n;
    int open;
    float *w; /* [n]: the applier's weights at (epoch, version): snap[cur] */
    /* weight snapshots: snap[cur] is published, refs[k] workers hold snap[k],
     * and the applier is writing snap[writing] (SIZE_MAX: none); grown when
     * every other one is held, so at most holders + 2 */
    float **snap;
    int *refs;
    size_t nsnap, cur, writing;
    uint64_t epoch;
    int64_t version;
    slot_t *slots;
    size_t nslots, head, count, taken; /* FIFO: [head, head + count); the
                                          first `taken` are the applier's */
    uint64_t pushed, pulls;
    /* in-flight accounting (docs/design.md "Staleness and the controller"):
     * the i-th push (its ticket, i = pushed after it) has been taken off
     * the queue when consumed >= i, and its effect is in the published
     * weights when done >= i */
    uint64_t consumed, done;
    uint64_t lost_lo, lost_hi; /* the last close lost tickets (lo, hi] */
    psstore_phase_t phase;     /* mode auto's, as the applier set it     */
    /* rounds closed per group since the channel opened (round modes),
     * published with the weights they produced */
    int64_t rounds[PS_LOCAL_GROUPS];
    pthread_cond_t moved; /* weights or rounds were published, or it closed */
    /* a sharded model (docs/design.md "Shards"): a channel per shard, each
     * attached to its shard's applier; this one only fans out. A push's
     * ticket here maps to its tickets on the shards (ring). */
    int nsub;
    psstore_local_t *sub[PSSTORE_SHARDS_MAX];
    size_t bounds[PSSTORE_SHARDS_MAX + 1];
    uint64_t (*ring)[PSSTORE_SHARDS_MAX]; /* [LOCAL_RING] */
    /* a pusher deciding its own gradient (psstore_local_push_help): the
     * attached applier holds `step` while it runs a step of its own and
     * lets go only while it waits for work or between polls; `helper`
     * (set with `step` held) is its take-and-publish step, `helping`
     * nonzero while a pusher holds `step` */
    pthread_mutex_t step;
    int (*helper)(void *);
    void *helper_arg;
    atomic_int helping;
    /* the applier let go of `step` for a round trip to Redis (ps_local_step_away):
     * a pusher of a pool of several steps in only then (psstore_local_push_help_away) */
    atomic_int away;
};

#define LOCAL_RING  4096 /* pushes whose shard tickets are remembered */
#define HELP_ALWAYS 1    /* push_swapped: the pusher steps in whenever it can ... */
#define HELP_AWAY   2    /* ... or only while the applier waits for Redis */

/* Appends a touched snapshot buffer; returns its index, or SIZE_MAX when
 * out of memory. */
static size_t snap_add(psstore_local_t *l)
{
    float **snap = realloc(l->snap, (l->nsnap + 1) * sizeof(*snap));
    if (snap == NULL)
        return SIZE_MAX;
    l->snap = snap;
    int *refs = realloc(l->refs, (l->nsnap + 1) * sizeof(*refs));
    if (refs == NULL)
        return SIZE_MAX;
    l->refs = refs;
    if ((snap[l->nsnap] = malloc(l->n * sizeof(float))) == NULL)
        return SIZE_MAX;
    fr_mem_touch(snap[l->nsnap], l->n * sizeof(float));
    refs[l->nsnap] = 0;
    return l->nsnap++;
}

/* A snapshot nobody holds, other than the current one (under the lock),
 * grown when there is none; SIZE_MAX when out of memory. */
static size_t snap_free(psstore_local_t *l)
{
    for (size_t k = 0; k < l->nsnap; k++)
        if (k != l->cur && k != l->writing && l->refs[k] == 0)
            return k;
    return snap_add(l);
}

/* One holder fewer for snapshot w (under the lock; NULL: none). */
static void snap_release(psstore_local_t *l, const float *w)
{
    for (size_t k = 0; w != NULL && k < l->nsnap; k++)
        if (l->snap[k] == w) {
            l->refs[k]--;
            return;
        }
}

psstore_local_t *psstore_local_new(size_t nparams, size_t slots, char *errstr, size_t size)
{
    if (nparams == 0 || slots == 0) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "local path: nparams and slots must be >= 1");
        return NULL;
    }
    psstore_local_t *l = calloc(1, sizeof(*l));
    if (l == NULL || (l->slots = calloc(slots, sizeof(slot_t))) == NULL) {
        if (l != NULL)
            free(l->slots);
        free(l);
        fr_errorf(FR_ERR_NOMEM, errstr, size, "local path: out of memory");
        return NULL;
    }
    l->n = nparams;
    l->nslots = slots;
    l->writing = SIZE_MAX;
    /* the published snapshot and one to write the next version into */
    if (snap_add(l) == SIZE_MAX || snap_add(l) == SIZE_MAX) {
        psstore_local_destroy(l);
        fr_errorf(FR_ERR_NOMEM, errstr, size, "local path: out of memory");
        return NULL;
    }
    l->w = l->snap[0];
    for (size_t i = 0; i < slots; i++) {
        if ((l->slots[i].g = malloc(nparams * sizeof(float))) == NULL) {
            psstore_local_destroy(l);
            fr_errorf(FR_ERR_NOMEM, errstr, size, "local path: out of memory");
            return NULL;
        }
        fr_mem_touch(l->slots[i].g, nparams * sizeof(float));
    }
    pthread_mutex_init(&l->lock, NULL);
    pthread_mutex_init(&l->step, NULL);
    pthread_cond_init(&l->room, NULL);
    pthread_cond_init(&l->work, NULL);
    pthread_cond_init(&l->moved, NULL);
    return l;
}

psstore_local_t *psstore_local_new_shards(const size_t *bounds, int S, size_t slots, char *errstr,
                                          size_t size)
{
    if (S < 2 || S > PSSTORE_SHARDS_MAX)
        return psstore_local_new(S == 1 ? bounds[1] : 0, slots, errstr, size);
    psstore_local_t *l = calloc(1, sizeof(*l));
    if (l == NULL || (l->ring = calloc(LOCAL_RING, sizeof(*l->ring))) == NULL) {
        free(l);
        fr_errorf(FR_ERR_NOMEM, errstr, size, "local path: out of memory");
        return NULL;
    }
    pthread_mutex_init(&l->lock, NULL);
    pthread_mutex_init(&l->step, NULL);
    pthread_cond_init(&l->room, NULL);
    pthread_cond_init(&l->work, NULL);
    pthread_cond_init(&l->moved, NULL);
    l->n = bounds[S];
    memcpy(l->bounds, bounds, (size_t)(S + 1) * sizeof(*bounds));
    for (int k = 0; k < S; k++) {
        if ((l->sub[k] = psstore_local_new(bounds[k + 1] - bounds[k], slots, errstr, size)) ==
            NULL) {
            psstore_local_destroy(l);
            return NULL;
        }
        l->nsub = k + 1;
    }
    return l;
}

psstore_local_t *ps_local_shard(psstore_local_t *l, int shard)
{
    if (l == NULL || l->nsub == 0)
        return l;
    return shard >= 0 && shard < l->nsub ? l->sub[shard] : NULL;
}

void psstore_local_destroy(psstore_local_t *l)
{
    if (l == NULL)
        return;
    for (int k = 0; k < l->nsub; k++)
        psstore_local_destroy(l->sub[k]);
    free(l->ring);
    for (size_t i = 0; i < l->nslots; i++) {
        free(l->slots[i].g);
        free(l->slots[i].ranges);
        free(l->slots[i].topics);
    }
    free(l->slots);
    for (size_t k = 0; k < l->nsnap; k++)
        free(l->snap[k]);
    free(l->snap);
    free(l->refs);
    pthread_mutex_destroy(&l->lock);
    pthread_mutex_destroy(&l->step);
    pthread_cond_destroy(&l->room);
    pthread_cond_destroy(&l->work);
    pthread_cond_destroy(&l->moved);
    free(l);
}

int psstore_local_open(psstore_local_t *l)
{
    if (l == NULL)
        return 0;
    if (l->nsub > 0) {
        for (int k = 0; k < l->nsub; k++)
            if (!psstore_local_open(l->sub[k]))
                return 0;
        return 1;
    }
    pthread_mutex_lock(&l->lock);
    int open = l->open;
    pthread_mutex_unlock(&l->lock);
    return open;
}

fr_err_t psstore_local_pull_at(psstore_local_t *l, float *w, psstore_shard_at_t *at, int *changed)
{
    if (l->nsub == 0 || at == NULL || at->n != l->nsub)
        return FR_ERR_INVAL;
    *changed = 0;
    uint64_t esum = 0;
    int64_t vsum = 0;
    for (int k = 0; k < l->nsub; k++) {
        int ch = 0;
        fr_err_t err =
            psstore_local_pull(l->sub[k], w + l->bounds[k], &at->epochs[k], &at->versions[k], &ch);
        if (err != FR_OK) {
            at->torn |= *changed; /* the slices copied so far: loaded at the next pull */
            return err;
        }
        *changed |= ch;
        esum += at->epochs[k];
        vsum += at->versions[k];
    }
    at->epoch = esum;
    at->version = vsum;
    *changed |= at->torn;
    at->torn = 0;
    return FR_OK;
}

/* Takes the lock of an unsharded channel that is open (FR_OK, the lock
 * held); FR_ERR_INVAL when sharded (psstore_local_pull_at), FR_ERR_STATE when
 * closed. */
static fr_err_t lock_open(psstore_local_t *l)
{
    if (l->nsub > 0)
        return FR_ERR_INVAL;
    pthread_mutex_lock(&l->lock);
    if (!l->open) {
        pthread_mutex_unlock(&l->lock);
        return FR_ERR_STATE;
    }
    return FR_OK;
}

fr_err_t psstore_local_pull(psstore_local_t *l, float *w, uint64_t *epoch, int64_t *version,
                            int *changed)
{
    fr_err_t err = lock_open(l);
    if (err != FR_OK)
        return err;
    *changed = l->epoch != *epoch || l->version != *version;
    if (*changed) {
        memcpy(w, l->w, l->n * sizeof(float));
        *epoch = l->epoch;
        *version = l->version;
        l->pulls++;
    }
    pthread_mutex_unlock(&l->lock);
    return FR_OK;
}

fr_err_t psstore_local_hold(psstore_local_t *l, const float **w, uint64_t *epoch, int64_t *version,
                            int *changed)
{
    fr_err_t err = lock_open(l);
    if (err != FR_OK)
        return err;
    *changed = *w != l->w || l->epoch != *epoch || l->version != *version;
    if (*changed) {
        snap_release(l, *w);
        l->refs[l->cur]++;
        *w = l->w;
        *epoch = l->epoch;
        *version = l->version;
        l->pulls++;
    }
    pthread_mutex_unlock(&l->lock);
    return FR_OK;
}

void psstore_local_unhold(psstore_local_t *l, const float *w)
{
    if (l == NULL || w == NULL)
        return;
    pthread_mutex_lock(&l->lock);
    snap_release(l, w);
    pthread_mutex_unlock(&l->lock);
}

/* Copies g's ranges and strings into slot s (under the lock), and its
 * gradient, or with buf (== g->g) swaps the buffers instead. */
static fr_err_t slot_fill(psstore_local_t *l, slot_t *s, const psstore_grad_t *g, float **buf)
{
    if (ps_ranges_copy(g->ranges, g->nranges, &s->ranges, &s->cap_ranges, &s->topics,
                       &s->cap_topics) != FR_OK)
        return FR_ERR_NOMEM;
    snprintf(s->worker, sizeof(s->worker), "%s", g->worker ? g->worker : "");
    snprintf(s->reason, sizeof(s->reason), "%s", g->reason ? g->reason : "");
    s->msg = *g;
    s->msg.worker = s->worker;
    s->msg.reason = g->reason ? s->reason : NULL;
    s->msg.ranges = s->ranges;
    s->msg.at = NULL;
    s->msg.g = NULL;
    s->msg.len = 0;
    if (g->n > 0) {
        if (buf != NULL) {
            float *mine = s->g;
            s->g = *buf;
            *buf = mine;
        } else {
            memcpy(s->g, g->g, l->n * sizeof(float));
        }
        s->msg.g = s->g;
        s->msg.len = l->n;
    }
    return FR_OK;
}

static fr_err_t push(psstore_local_t *l, const psstore_grad_t *g, float **buf, int timeout_ms,
                     uint64_t *ticket, int wake)
{
    if (g->n > 0 && (g->g == NULL || g->len != l->n))
        return FR_ERR_INVAL;
    if (buf != NULL && g->n > 0 && g->g != *buf)
        return FR_ERR_INVAL;
    struct timespec until;
    fr_clock_deadline(&until, timeout_ms);
    pthread_mutex_lock(&l->lock);
    while (l->open && l->count == l->nslots) {
        if (pthread_cond_timedwait(&l->room, &l->lock, &until) != 0 && l->count == l->nslots) {
            pthread_mutex_unlock(&l->lock);
            return FR_ERR_TIMEOUT;
        }
    }
    if (!l->open) {
        pthread_mutex_unlock(&l->lock);
        return FR_ERR_STATE;
    }
    slot_t *s = &l->slots[(l->head + l->count) % l->nslots];
    fr_err_t err = slot_fill(l, s, g, g->n > 0 ? buf : NULL);
    if (err == FR_OK) {
        l->count++;
        l->pushed++;
        if (ticket != NULL)
            *ticket = l->pushed;
        if (wake)
            pthread_cond_signal(&l->work);
    }
    pthread_mutex_unlock(&l->lock);
    return err;
}

/*
 * A sharded channel: each shard's channel gets a copy of its slice, with
 * that shard's (epoch, version) from g->at and the whole gradient's norm.
 * The ticket returned stands for the shards' tickets (ring). A shard that
 * refuses leaves the earlier ones holding their slices: the gap rule reads
 * the batch again and those shards drop it as a duplicate.
 */
static void help_shards(psstore_local_t *l, int k, int only_away);

static fr_err_t push_shards(psstore_local_t *l, const psstore_grad_t *g, int timeout_ms,
                            uint64_t *ticket, int wake)
{
    if (g->at == NULL || g->at->n != l->nsub || (g->n > 0 && (g->g == NULL || g->len != l->n)))
        return FR_ERR_INVAL;
    double norm = ps_grad_norm(g);
    uint64_t tickets[PSSTORE_SHARDS_MAX];
    for (int k = 0; k < l->nsub; k++) {
        psstore_grad_t slice;
        ps_grad_slice(g, g->at, k, norm, &slice);
        fr_err_t err = push(l->sub[k], &slice, NULL, timeout_ms, &tickets[k], wake);
        if (err != FR_OK && !wake)
            help_shards(l, k, 1); /* the slices queued so far are not left unannounced */
        if (err != FR_OK)
            return err;
    }
    pthread_mutex_lock(&l->lock);
    uint64_t t = ++l->pushed;
    memcpy(l->ring[t % LOCAL_RING], tickets, (size_t)l->nsub * sizeof(tickets[0]));
    pthread_mutex_unlock(&l->lock);
    if (ticket != NULL)
        *ticket = t;
    return FR_OK;
}

fr_err_t psstore_local_push(psstore_local_t *l, const psstore_grad_t *g, int timeout_ms,
                            uint64_t *ticket)
{
    if (l->nsub > 0)
        return push_shards(l, g, timeout_ms, ticket, 1);
    return push(l, g, NULL, timeout_ms, ticket, 1);
}

static void help_one_or_shards(psstore_local_t *l, int only_away);

/* A swapped push (psstore_local_push_swap); with help, the pusher then
 * steps in for the applier (psstore_local_push_help) instead of waking it. */
static fr_err_t push_swapped(psstore_local_t *l, const psstore_grad_t *g, float **buf,
                             int timeout_ms, uint64_t *ticket, int help)
{
    if (buf == NULL || *buf == NULL)
        return FR_ERR_INVAL;
    fr_err_t err = l->nsub > 0 /* slices are copied: *buf stays the caller's */
                       ? push_shards(l, g, timeout_ms, ticket, !help)
                       : push(l, g, buf, timeout_ms, ticket, !help);
    if (err == FR_OK && help)
        help_one_or_shards(l, help == HELP_AWAY);
    return err;
}

fr_err_t psstore_local_push_swap(psstore_local_t *l, const psstore_grad_t *g, float **buf,
                                 int timeout_ms, uint64_t *ticket)
{
    return push_swapped(l, g, buf, timeout_ms, ticket, 0);
}

/*
 * One channel's help: with the applier between steps (`step` free, or held
 * by another pusher, which lets go within a step), its take-and-publish
 * step runs in this thread. Whatever is still queued afterwards (the
 * applier was busy, or it is not taking gradients) wakes the applier.
 */
static int help_one(psstore_local_t *l, int only_away)
{
    int n = 0, held = 0;
    if (!only_away || atomic_load(&l->away))
        held = pthread_mutex_trylock(&l->step) == 0;
    if (!held && !only_away && atomic_load(&l->helping)) {
        pthread_mutex_lock(&l->step);
        held = 1;
    }
    if (held) {
        atomic_store(&l->helping, 1);
        if (l->helper != NULL)
            n = l->helper(l->helper_arg);
        atomic_store(&l->helping, 0);
        pthread_mutex_unlock(&l->step);
    }
    pthread_mutex_lock(&l->lock);
    if (l->count > 0)
        pthread_cond_signal(&l->work);
    pthread_mutex_unlock(&l->lock);
    return n;
}

/* help_one on the first k shards of a sharded channel. */
static void help_shards(psstore_local_t *l, int k, int only_away)
{
    for (int i = 0; i < k; i++)
        help_one(l->sub[i], only_away);
}

/* help_one on l, or on each shard of a sharded l. */
static void help_one_or_shards(psstore_local_t *l, int only_away)
{
    if (l->nsub > 0)
        help_shards(l, l->nsub, only_away);
    else
        help_one(l, only_away);
}

fr_err_t psstore_local_push_help(psstore_local_t *l, const psstore_grad_t *g, float **buf,
                                 int timeout_ms, uint64_t *ticket)
{
    return push_swapped(l, g, buf, timeout_ms, ticket, HELP_ALWAYS);
}

fr_err_t psstore_local_push_help_away(psstore_local_t *l, const psstore_grad_t *g, float **buf,
                                      int timeout_ms, uint64_t *ticket)
{
    return push_swapped(l, g, buf, timeout_ms, ticket, HELP_AWAY);
}

/* ---- the applier's side (grads_int.h) ---------------------------------------- */

void ps_local_open(psstore_local_t *l, const float *w, uint64_t epoch, int64_t version)
{
    pthread_mutex_lock(&l->lock);
    size_t k = snap_free(l);
    if (k == SIZE_MAX) { /* out of memory: the channel stays closed (workers use Redis) */
        pthread_mutex_unlock(&l->lock);
        return;
    }
    memcpy(l->snap[k], w, l->n * sizeof(float));
    l->cur = k;
    l->w = l->snap[k];
    l->epoch = epoch;
    l->version = version;
    memset(l->rounds, 0, sizeof(l->rounds));
    l->open = 1;
    pthread_mutex_unlock(&l->lock);
}

/* Closes the channel (under the lock): queued gradients are lost, their
 * positions never recorded, and every waiter wakes. */
static void close_locked(psstore_local_t *l)
{
    l->open = 0;
    l->head = (l->head + l->count) % l->nslots;
    l->consumed += l->count;
    l->lost_lo = l->done; /* taken or queued, and not published */
    l->lost_hi = l->consumed;
    l->done = l->consumed; /* nobody waits for what is lost */
    l->count = l->taken = 0;
    pthread_cond_broadcast(&l->room);
    pthread_cond_broadcast(&l->moved);
}

void ps_local_close(psstore_local_t *l)
{
    pthread_mutex_lock(&l->lock);
    close_locked(l);
    pthread_mutex_unlock(&l->lock);
}

void ps_local_publish(psstore_local_t *l, const float *w, uint64_t epoch, int64_t version,
                      const int64_t *rounds)
{
    pthread_mutex_lock(&l->lock);
    if (l->open && (l->epoch != epoch || l->version != version)) {
        size_t k = snap_free(l);
        if (k == SIZE_MAX) {
            /* out of memory: the workers cannot see this version, so they
             * go through Redis, which the next commit brings up to it */
            close_locked(l);
        } else {
            l->writing = k; /* nobody can hold it: it is not current */
            pthread_mutex_unlock(&l->lock);
            memcpy(l->snap[k], w, l->n * sizeof(float));
            pthread_mutex_lock(&l->lock);
            l->writing = SIZE_MAX;
            l->cur = k;
            l->w = l->snap[k];
            l->epoch = epoch;
            l->version = version;
        }
    }
    if (l->open && rounds != NULL)
        memcpy(l->rounds, rounds, sizeof(l->rounds));
    /* every gradient taken so far is decided: applied ones are in these
     * weights, dropped ones never will be */
    l->done = l->consumed;
    pthread_cond_broadcast(&l->moved);
    pthread_mutex_unlock(&l->lock);
}

fr_err_t psstore_local_round(psstore_local_t *l, int group, int64_t *round)
{
    if (group < 0 || group >= PS_LOCAL_GROUPS)
        return FR_ERR_INVAL;
    if (l->nsub > 0) { /* rounds close per shard: the least of them */
        int64_t least = INT64_MAX;
        for (int k = 0; k < l->nsub; k++) {
            int64_t r = 0;
            fr_err_t err = psstore_local_round(l->sub[k], group, &r);
            if (err != FR_OK)
                return err;
            least = r < least ? r : least;
        }
        *round = least;
        return FR_OK;
    }
    pthread_mutex_lock(&l->lock);
    int open = l->open;
    *round = l->rounds[group];
    pthread_mutex_unlock(&l->lock);
    return open ? FR_OK : FR_ERR_STATE;
}

fr_err_t psstore_local_round_wait(psstore_local_t *l, int group, int64_t round, int timeout_ms)
{
    if (group < 0 || group >= PS_LOCAL_GROUPS)
        return FR_ERR_INVAL;
    if (l->nsub > 0) { /* every shard past round; one timeout for all */
        uint64_t t0 = fr_clock_mono_ns();
        for (int k = 0; k < l->nsub; k++) {
            int left = timeout_ms - (int)((fr_clock_mono_ns() - t0) / 1000000u);
            fr_err_t err = psstore_local_round_wait(l->sub[k], group, round, left > 0 ? left : 0);
            if (err != FR_OK)
                return err;
        }
        return FR_OK;
    }
    struct timespec until;
    fr_clock_deadline(&until, timeout_ms);
    fr_err_t err = FR_OK;
    pthread_mutex_lock(&l->lock);
    while (l->open && l->rounds[group] <= round) {
        if (pthread_cond_timedwait(&l->moved, &l->lock, &until) != 0) {
            err = l->rounds[group] > round ? FR_OK : FR_ERR_TIMEOUT;
            break;
        }
    }
    if (!l->open)
        err = FR_ERR_STATE;
    pthread_mutex_unlock(&l->lock);
    return err;
}

fr_err_t psstore_local_wait_applied(psstore_local_t *l, uint64_t ticket, int timeout_ms)
{
    if (l->nsub > 0) { /* decided on every shard */
        uint64_t tickets[PSSTORE_SHARDS_MAX];
        pthread_mutex_lock(&l->lock);
        int known = ticket <= l->pushed && l->pushed - ticket < LOCAL_RING;
        memcpy(tickets, l->ring[ticket % LOCAL_RING], (size_t)l->nsub * sizeof(tickets[0]));
        pthread_mutex_unlock(&l->lock);
        if (!known)
            return FR_OK; /* long decided, or never pushed here */
        uint64_t t0 = fr_clock_mono_ns();
        for (int k = 0; k < l->nsub; k++) {
            int left = timeout_ms - (int)((fr_clock_mono_ns() - t0) / 1000000u);
            fr_err_t err = psstore_local_wait_applied(l->sub[k], tickets[k], left > 0 ? left : 0);
            if (err != FR_OK)
                return err;
        }
        return FR_OK;
    }
    struct timespec until;
    fr_clock_deadline(&until, timeout_ms);
    fr_err_t err = FR_OK;
    pthread_mutex_lock(&l->lock);
    while (l->open && l->done < ticket) {
        if (pthread_cond_timedwait(&l->moved, &l->lock, &until) != 0) {
            err = l->done >= ticket ? FR_OK : FR_ERR_TIMEOUT;
            break;
        }
    }
    if (ticket > l->lost_lo && ticket <= l->lost_hi)
        err = FR_ERR_STATE;
    pthread_mutex_unlock(&l->lock);
    return err;
}

void ps_local_set_phase(psstore_local_t *l, psstore_phase_t phase)
{
    pthread_mutex_lock(&l->lock);
    l->phase = phase;
    pthread_mutex_unlock(&l->lock);
}

fr_err_t psstore_local_phase(psstore_local_t *l, psstore_phase_t *phase)
{
    if (l->nsub > 0)
        l = l->sub[0]; /* every shard runs the same mode; shard 0's phase */
    pthread_mutex_lock(&l->lock);
    int open = l->open;
    *phase = l->phase;
    pthread_mutex_unlock(&l->lock);
    return open ? FR_OK : FR_ERR_STATE;
}

size_t ps_local_take(psstore_local_t *l, const psstore_grad_t **out, size_t max, int wait_ms)
{
    pthread_mutex_lock(&l->lock);
    if (l->count == 0 && wait_ms > 0 && l->open) {
        /* pushers may step in while the applier waits; `step` is taken
         * before `lock`, never after it */
        pthread_mutex_unlock(&l->step);
        struct timespec until;
        fr_clock_deadline(&until, wait_ms);
        pthread_cond_timedwait(&l->work, &l->lock, &until);
        pthread_mutex_unlock(&l->lock);
        pthread_mutex_lock(&l->step);
        pthread_mutex_lock(&l->lock);
    }
    size_t k = l->count < max ? l->count : max;
    for (size_t i = 0; i < k; i++)
        out[i] = &l->slots[(l->head + i) % l->nslots].msg;
    l->taken = k;
    pthread_mutex_unlock(&l->lock);
    return k;
}

void ps_local_step_enter(psstore_local_t *l)
{
    pthread_mutex_lock(&l->step);
}

void ps_local_step_leave(psstore_local_t *l)
{
    pthread_mutex_unlock(&l->step);
}

void ps_local_step_away(psstore_local_t *l)
{
    atomic_store(&l->away, 1);
    pthread_mutex_unlock(&l->step);
}

void ps_local_step_back(psstore_local_t *l)
{
    pthread_mutex_lock(&l->step);
    atomic_store(&l->away, 0);
}

void ps_local_set_helper(psstore_local_t *l, int (*fn)(void *), void *arg)
{
    pthread_mutex_lock(&l->step);
    l->helper = fn;
    l->helper_arg = arg;
    pthread_mutex_unlock(&l->step);
}

void ps_local_release(psstore_local_t *l)
{
    pthread_mutex_lock(&l->lock);
    l->head = (l->head + l->taken) % l->nslots;
    l->count -= l->taken;
    l->consumed += l->taken;
    l->taken = 0;
    pthread_cond_broadcast(&l->room);
    pthread_mutex_unlock(&l->lock);
}
