/*
 * psstore_int.h - private declarations shared by the parameter store's
 * sources. Only psstore/ includes hiredis; nothing here leaves the module.
 */
#ifndef FRESHET_PSSTORE_INT_H
#define FRESHET_PSSTORE_INT_H

#include <hiredis/hiredis.h>

#include "psstore/psstore.h"

/* ------------------------------------------------------------------------
 * Connection (conn.c). One psstore_conn_t per thread, as hiredis wants.
 * ---------------------------------------------------------------------- */
/* ------------------------------------------------------------------------
 * Redis Cluster (cluster.c): slots, the slot map, redirections. conn.c
 * routes with it (docs/design.md "Redis Cluster").
 * ---------------------------------------------------------------------- */
#define PS_SLOTS     16384
#define PS_NODES_MAX 1024

typedef struct ps_node {
    char host[256];
    int port;
    redisContext *ctx; /* kept open between commands; NULL for the current
                          node, whose context is psstore_conn.ctx       */
} ps_node_t;

typedef struct ps_cluster {
    ps_node_t *nodes; /* every node ever named: seeds, map, redirections */
    size_t nnodes, cap;
    int16_t *slot_node; /* [PS_SLOTS]: index into nodes, -1 when unknown */
    int cur;            /* the node psstore_conn.ctx is connected to     */
    int slot;           /* the slot keyless commands follow (MULTI, EXEC,
                           SCAN, INFO): the last key's, or -1            */
    int pinned;         /* >= 0: keyless commands go to this node        */
    int stale;          /* a redirection said the map is out of date     */
} ps_cluster_t;

ps_cluster_t *ps_cluster_new(void);
void ps_cluster_free(ps_cluster_t *cl);
/* The index of node host:port, added when new; -1 when it cannot be. */
int ps_cluster_node(ps_cluster_t *cl, const char *host, size_t hostlen, int port);
/* Replaces the slot map with a CLUSTER SLOTS reply (asked_host stands for
 * an empty address). Returns the number of slots covered, or -1 when the
 * reply is not one (the map is then unchanged). */
int ps_cluster_load_slots(ps_cluster_t *cl, const redisReply *r, const char *asked_host);
/* Parses "MOVED <slot> <host>:<port>" or "ASK ..." (*ask set for ASK);
 * 0, or -1 when msg is neither. */
int ps_cluster_redirect(const char *msg, size_t len, int *ask, int *slot, char *host,
                        size_t hostsize, int *port);
/* The nodes that serve at least one slot, into out[max]; their number. */
int ps_cluster_masters(const ps_cluster_t *cl, int *out, int max);
/* The slot of a command's key (its first argument after the name that
 * starts with "freshet:"), or -1 when it has none (MULTI, EXEC, SCAN,
 * INFO...). From argv (lens NULL: C strings) or a formatted command. */
int ps_argv_slot(int argc, const char **argv, const size_t *lens);
int ps_resp_slot(const char *cmd, size_t len);

/* ------------------------------------------------------------------------
 * Connection (conn.c). One psstore_conn_t per thread, as hiredis wants.
 * To a single Redis, or to a Redis Cluster (cl not NULL): then every
 * command goes to the node serving its key's slot, keyless ones to the
 * node of the last key (or the pinned node).
 * ---------------------------------------------------------------------- */
struct psstore_conn {
    redisContext *ctx; /* NULL while disconnected                       */
    ps_cluster_t *cl;  /* NULL: a single Redis                          */
    size_t pending;    /* pipelined commands whose reply is not read    */
    char *defer;       /* a cluster pipeline's leading keyless commands
                          (MULTI...), formatted, held until a key says
                          which node the pipeline goes to               */
    size_t defer_len, defer_cap, ndefer;
    int watching; /* a WATCH was sent and no EXEC, DISCARD or UNWATCH
                     since: the connection must not change node */
    int broken;   /* the connection broke (or was dropped): the next
                     connect counts in reconnects                  */
    psstore_url_t url;
    int timeout_ms;           /* connect and command timeout                    */
    unsigned reconnects;      /* successful reconnects: state built on this
                                 connection must be reloaded after one       */
    char errstr[512];         /* the last error, also returned through errstr   */
    psstore_cancel_fn cancel; /* set: its owner is stopping, so a reconnect
                                 tries once, without backoff                */
    void *cancel_arg;
};

/*
 * Runs one command given as argv/lens (binary safe). On a connection error
 * it reconnects (with backoff, within the timeout) and retries once when
 * retry is set: only for commands that are safe to repeat. Returns the
 * reply (caller frees with freeReplyObject) or NULL with *err set and
 * c->errstr filled; a Redis error reply is returned as NULL with
 * FR_ERR_REDIS and the server's message in c->errstr.
 */
redisReply *ps_cmd_argv(psstore_conn_t *c, int retry, int argc, const char **argv,
                        const size_t *lens, fr_err_t *err);

/* printf-style variant of ps_cmd_argv (hiredis format: %s, %b, %lld). */
redisReply *ps_cmd(psstore_conn_t *c, int retry, fr_err_t *err, const char *fmt, ...);

/* Appends a command to the pipeline (redisAppendCommandArgv); the replies
 * are read with ps_pipeline_read in order, once per appended command, also
 * after an error reply. After a transport failure c->ctx is NULL: that is
 * how to tell it from an error reply (both are FR_ERR_REDIS). */
fr_err_t ps_pipeline_append(psstore_conn_t *c, int argc, const char **argv, const size_t *lens);
redisReply *ps_pipeline_read(psstore_conn_t *c, fr_err_t *err);
/* Sends what the pipeline holds now, without waiting for a reply, so that
 * the round trips of several connections overlap (a sharded pull checks
 * every shard at once). A failure is reported by the next read. */
fr_err_t ps_pipeline_flush(psstore_conn_t *c);
/* Abandons a pipeline whose replies will not be read: closes the
 * connection, so that no appended command is ever sent (the next command
 * reconnects). */
void ps_pipeline_discard(psstore_conn_t *c);

/* Writes how errors name the Redis of c: "host:port", "[v6]:port" or the
 * socket path (never a password). */
void ps_endpoint(const psstore_conn_t *c, char *buf, size_t size);

/* Fills c->errstr and returns err. */
fr_err_t ps_fail(psstore_conn_t *c, fr_err_t err, const char *fmt, ...) FR_PRINTF(3, 4);

/* Copies a bulk string reply into buf[size] (truncating); "" for any other
 * reply or NULL (model.c). */
void ps_reply_copy(char *buf, size_t size, const redisReply *r);
/* The id of the newest entry of the stream at key ("0-0" when none or no
 * stream) into id[PSSTORE_STREAM_ID_MAX] (status.c). */
fr_err_t ps_stream_last_id(psstore_conn_t *c, const char *key, char *id);

/* The run_id (INFO server) of the server that holds key, into buf[41]. */
fr_err_t ps_server_run_id(psstore_conn_t *c, const char *key, char *buf, size_t size);

/* Sends keyless commands (SCAN, CONFIG) to the node serving key's slot
 * (a no-op on a single Redis). */
void ps_conn_route_key(psstore_conn_t *c, const char *key);
/* The nodes serving slots into nodes[max] (the map read again when
 * stale), and their number; a single Redis is one node, -1. ps_conn_pin
 * sends keyless commands to one of them until ps_conn_pin(c, -1). */
int ps_conn_masters(psstore_conn_t *c, int *nodes, int max);
void ps_conn_pin(psstore_conn_t *c, int node);

/* ------------------------------------------------------------------------
 * Sparse rows (rows.c), shared by the worker's pull and the applier.
 * ---------------------------------------------------------------------- */
#define PS_ROWS_CHUNK 512 /* fields per HMGET or HSET */

/* The hash field of a row: its 4 bytes little-endian. */
void ps_row_field(uint32_t row, unsigned char f[4]);
/* Appends HMGET key for the n fields (4 bytes each), PS_ROWS_CHUNK a
 * command, to c's pipeline; counts the commands in *queued. */
fr_err_t ps_rows_queue(psstore_conn_t *c, const char *key, const unsigned char *fields, size_t n,
                       size_t *queued);
/* The row of a rows hash field (its 4 bytes, little-endian). */
uint32_t ps_field_row(const char *f);
/* Copies the first keep floats of each of an HMGET reply's n values of
 * len floats into out[n][keep]; found[i] (may be NULL) says which were
 * there (absent ones are left as they were). FR_ERR_PARSE for a value of
 * another size. */
fr_err_t ps_rows_take(psstore_conn_t *c, const redisReply *r, size_t len, size_t keep, float *out,
                      uint8_t *found, size_t n);

/* ------------------------------------------------------------------------
 * Keys (keys.c): every key of model m shares the hash tag {m}.
 * ---------------------------------------------------------------------- */
#define PS_KEY_MAX 128
/* Writes "freshet:{m}:<suffix>" into key[PS_KEY_MAX]. */
void ps_key(char *key, const char *model, const char *suffix);
/* "freshet:{m}:w:<k>", "opt:<k>", "snap:<v>" */
void ps_key_shard(char *key, const char *model, const char *what, long long k);

/* Shards (docs/design.md "Shards"): the keys of shard k of a model of S > 1
 * shards carry the tag "m/s<k>" ('/' is not allowed in model names, so no
 * model's tag is a shard's); S = 1 keeps the model's own tag. Every
 * per-shard key (ver, w:0, opt:0, offsets, grads, lease, versions, snaps,
 * snap:<v>, audit, rounds, drops, requests and a meta of the shard's own)
 * is ps_key(tag, ...), so one shard's transaction stays in one slot. */
#define PS_TAG_MAX 80
void ps_shard_tag(char *tag, const char *model, int k, int S);
/* The model's shards and their bounds, from its meta (fields shards and
 * bounds): *S = 1 (bounds untouched) for a model of one shard.
 * FR_ERR_NOTFOUND without meta, FR_ERR_PARSE for bounds that do not
 * parse. */
fr_err_t ps_model_layout(psstore_conn_t *c, const char *model, int *S, size_t *bounds);
/* The model's shard count alone: 1 for a model of one shard, and also when
 * the model has no meta (the caller then acts on one-shard keys, which do
 * not exist either, and reports the absence its own way). */
fr_err_t ps_model_shards(psstore_conn_t *c, const char *model, int *S);
/* The tag status reads go to: the model's for S = 1, shard 0's otherwise
 * (its versions, drops and snapshots stand for the model's). */
fr_err_t ps_read_tag(psstore_conn_t *c, const char *model, char *tag);

/* ------------------------------------------------------------------------
 * Every key of a model (model.c), for create --force, delete and the
 * applier's delete request.
 * ---------------------------------------------------------------------- */
typedef struct ps_keylist {
    char **keys;
    size_t n, cap;
} ps_keylist_t;

void ps_keylist_fini(ps_keylist_t *kl);
/* The model's fixed keys (whether they exist or not) and whatever SCAN
 * finds under its hash tag (snapshots, shards), without retrying a lost
 * connection (callers WATCH next). */
fr_err_t ps_model_keys(psstore_conn_t *c, const char *name, ps_keylist_t *kl);
/* Unlinks every key under tag (its fixed keys and what SCAN finds),
 * outside any transaction: a shard's, or a sharded model's own keys. */
fr_err_t ps_unlink_tag(psstore_conn_t *c, const char *tag);
/* Pipelines UNLINK of every key of kl in batches; adds the commands queued
 * to *queued. */
fr_err_t ps_queue_unlink(psstore_conn_t *c, const ps_keylist_t *kl, size_t *queued);

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
 * Membership entries (members.c).
 * ---------------------------------------------------------------------- */
/* Writes m's value ("<backend> <group> <clock> <idle> <beat>") into buf;
 * its length, or -1 when it does not fit. */
int ps_member_format(const psstore_member_t *m, char *buf, size_t size);
/* Parses one entry; 0, or -1 when it is not one. */
int ps_member_parse(const char *id, size_t idlen, const char *val, size_t vlen,
                    psstore_member_t *m);
/* HGETALL of a members hash into *members (grown, *cap its capacity). */
fr_err_t ps_members_read(psstore_conn_t *c, const char *key, psstore_member_t **members, size_t *n,
                         size_t *cap);

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
void ps_local_set_helper(psstore_local_t *l, int (*fn)(void *), void *arg);

#endif
