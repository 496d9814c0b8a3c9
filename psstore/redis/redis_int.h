/*
 * redis_int.h - the connection's insides and its commands, for the folders
 * of psstore/ only (store, grads, applier): the only header with hiredis's
 * types, which nothing outside psstore/ sees (psstore/redis/redis.h is the
 * public face).
 */
#ifndef FRESHET_PSSTORE_REDIS_INT_H
#define FRESHET_PSSTORE_REDIS_INT_H

#include <hiredis/hiredis.h>

#include "psstore/redis/redis.h"

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
/* As ps_pipeline_append, for a command already in RESP (cmd[len]) whose
 * key is key[klen] (it routes the command in a cluster): a caller that
 * writes many arguments of fixed shape formats them faster than hiredis. */
fr_err_t ps_pipeline_append_formatted(psstore_conn_t *c, const char *key, size_t klen,
                                      const char *cmd, size_t len);
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

/* A reply of the wrong shape: FR_ERR_REDIS naming the command. */
fr_err_t ps_unexpected(psstore_conn_t *c, const char *cmd);
/* Reads the replies of n queued commands and returns the last one (EXEC's)
 * or NULL with *err; every reply is read even after an error reply, and
 * the first error is the one reported. */
redisReply *ps_pipeline_finish(psstore_conn_t *c, size_t n, fr_err_t *err);

/* Fills c->errstr and returns err. */
fr_err_t ps_fail(psstore_conn_t *c, fr_err_t err, const char *fmt, ...) FR_PRINTF(3, 4);

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

#endif
