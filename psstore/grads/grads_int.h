/*
 * grads_int.h - the gradient transport's private declarations, for
 * psstore/grads/ and the applier: the grads stream's message codec and the
 * applier's side of the in-process channel.
 */
#ifndef FRESHET_PSSTORE_GRADS_INT_H
#define FRESHET_PSSTORE_GRADS_INT_H

#include "psstore/grads/grads.h"
#include "psstore/store/store_int.h"
#include "psstore/update/update.h"

/* ------------------------------------------------------------------------
 * Gradient messages (msg.c): one entry of the grads stream. Fields:
 *   epoch   decimal uint64            ver     decimal int64 (version read)
 *   gen     decimal int64             worker  text, 1..255 bytes
 *   n       decimal int64 >= 0        loss    "%.17g", finite
 *   reason  text, only when n = 0     ranges  "topic:partition:from:to,..."
 *   ts      "min:max", optional: Kafka timestamps (unix ms) of the batch's
 *           oldest and newest samples, 0 < min <= max
 *   g       float32 little endian, exactly 4 * nparams bytes when n > 0,
 *           absent or empty when n = 0
 * Any other field, a missing field or a bad value makes it malformed.
 * ---------------------------------------------------------------------- */
#define PS_GRAD_MAX_ARGS 24

/* XADD arguments of one message, built by ps_grad_encode; argv/lens point
 * into the message (g payload, strings) and into text (owned). */
typedef struct ps_grad_args {
    int argc;
    const char *argv[PS_GRAD_MAX_ARGS];
    size_t lens[PS_GRAD_MAX_ARGS];
    char *text;      /* numbers and the ranges text; free with ps_grad_args_fini */
    size_t text_cap; /* kept between calls to avoid reallocations */
} ps_grad_args_t;

/* Builds "XADD <key> * field value ..." for g into args (reusing its text
 * buffer). FR_ERR_INVAL when g is inconsistent (n > 0 without payload, a
 * topic with ':' or ',', from >= to, a bad worker). */
fr_err_t ps_grad_encode(ps_grad_args_t *args, const char *key, const psstore_grad_t *g);
void ps_grad_args_fini(ps_grad_args_t *args);

/* A decoded message. g.g points into the value given for "g" (not copied,
 * maybe unaligned: copy before use); everything else is owned here. */
typedef struct ps_grad_msg {
    psstore_grad_t g;
    char worker[256];
    char reason[64];
    psstore_range_t *ranges; /* g.ranges; topics point into topics */
    char *topics;
    size_t cap_ranges, cap_topics;
    const void *payload; /* == g.g */
    size_t payload_bytes;
} ps_grad_msg_t;

/* Decodes the nfields field/value pairs of one entry, expecting nparams
 * floats of payload (0: any positive number of them, a sparse model's). FR_ERR_PARSE with why
 * ("unknown field 'x'", "payload of 12 bytes, expected 16", ...) when malformed. m may be reused
 * across calls; release with ps_grad_msg_fini. */
fr_err_t ps_grad_decode(ps_grad_msg_t *m, size_t nfields, const char *const *fields,
                        const size_t *flens, const char *const *vals, const size_t *vlens,
                        size_t nparams, char *why, size_t whysize);
void ps_grad_msg_fini(ps_grad_msg_t *m);
/* A sharded model: the L2 norm of g's whole gradient (NaN when it is not
 * finite; 0 for an n = 0 batch), and shard k's slice of g with that
 * shard's (epoch, version) from at and the whole norm. The slice points
 * into g. */
double ps_grad_norm(const psstore_grad_t *g);
void ps_grad_slice(const psstore_grad_t *g, const psstore_shard_at_t *at, int k, double norm,
                   psstore_grad_t *slice);
/* Copies ranges[n] into *dst (grown, *cap its capacity) and their topics
 * into *topics (grown, *tcap): the copies point into *topics. FR_ERR_NOMEM
 * leaves what was there. */
fr_err_t ps_ranges_copy(const psstore_range_t *ranges, size_t n, psstore_range_t **dst, size_t *cap,
                        char **topics, size_t *tcap);

/* ------------------------------------------------------------------------
 * The applier's side of the in-process channel (local.c).
 * ---------------------------------------------------------------------- */
/* The channel of shard `shard` of a sharded channel (l itself when l is
 * not sharded; NULL for a shard it does not have). */
psstore_local_t *ps_local_shard(psstore_local_t *l, int shard);
/* Opens the channel with the weights at (epoch, version). */
void ps_local_open(psstore_local_t *l, const float *w, uint64_t epoch, int64_t version);
/* Closes it; queued gradients are dropped (never recorded: read again). */
void ps_local_close(psstore_local_t *l);
/* Publishes the weights at (epoch, version) when they moved, and the
 * rounds closed per group (rounds[PS_LOCAL_GROUPS], or NULL) with them. */
/* Mode auto: the phase workers on the channel follow. */
void ps_local_set_phase(psstore_local_t *l, psstore_phase_t phase);
void ps_local_publish(psstore_local_t *l, const float *w, uint64_t epoch, int64_t version,
                      const int64_t *rounds);
/* Takes up to max queued gradients in FIFO order into out (waiting up to
 * wait_ms for the first); they stay valid until ps_local_release. A wait
 * needs the step lock held (ps_local_step_enter), and lets go of it while
 * it waits. */
size_t ps_local_take(psstore_local_t *l, const psstore_grad_t **out, size_t max, int wait_ms);
void ps_local_release(psstore_local_t *l);
/* The step lock (docs/design.md "The co-located fast path", pushers that
 * decide their own gradient): the attached applier holds it while it runs
 * a step, and psstore_local_push_help runs fn(arg), the applier's
 * take-and-publish step, in the pusher's thread with it held. fn returns
 * the gradients it took; NULL: no helping (set before the applier goes). */
void ps_local_step_enter(psstore_local_t *l);
void ps_local_step_leave(psstore_local_t *l);
/* As ps_local_step_leave and ps_local_step_enter around a round trip to
 * Redis: meanwhile pushers of psstore_local_push_help_away step in too. */
void ps_local_step_away(psstore_local_t *l);
void ps_local_step_back(psstore_local_t *l);
void ps_local_set_helper(psstore_local_t *l, int (*fn)(void *), void *arg);

#endif
