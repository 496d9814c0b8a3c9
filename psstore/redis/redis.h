/*
 * redis.h - the parameter store's connection to Redis (fr_redis): URLs, a
 * connection to one Redis or to a Redis Cluster (routing by slot, following
 * MOVED and ASK; docs/design.md "Redis Cluster"). No hiredis type appears
 * here: psstore/redis/redis_int.h holds the commands and pipelines that the
 * other folders of psstore/ use.
 *
 * Threads: a connection belongs to one thread.
 */
#ifndef FRESHET_PSSTORE_REDIS_H
#define FRESHET_PSSTORE_REDIS_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Connection. A connection belongs to one thread.
 * ---------------------------------------------------------------------- */
#define PSSTORE_URL_SEEDS_MAX 16

typedef struct psstore_url {
    int unix_socket; /* 1 for unix:///path                              */
    char host[256];  /* the first host (seeds[0])                       */
    int port;        /* default 6379                                    */
    int nseeds;      /* hosts listed, 1..PSSTORE_URL_SEEDS_MAX (TCP):
                        more than one names a Redis Cluster            */
    struct {
        char host[256];
        int port;
    } seeds[PSSTORE_URL_SEEDS_MAX];
    char path[256]; /* unix socket path                                */
    int db;         /* default 0                                       */
    char user[128]; /* ACL user (may be empty)                         */
    char pass[256]; /* password (may be empty)                         */
} psstore_url_t;

/* Parses redis://[user:pass@]host[:port][,host[:port]...][/db] and
 * unix:///path[?db=N]. rediss:// is refused (hiredis 0.14 has no TLS: use
 * a TLS proxy). */
fr_err_t psstore_url_parse(const char *url, psstore_url_t *u, char *errstr, size_t size);

/* Redis Cluster's key slot (0..16383): CRC16 (XMODEM) of the key's hash
 * tag, the text between its first '{' and the next '}' when not empty,
 * else of the whole key. */
int psstore_key_slot(const char *key, size_t len);
uint16_t psstore_crc16(const void *p, size_t n);

typedef struct psstore_conn psstore_conn_t;

/* Connects (AUTH and SELECT as the URL says) with timeout_ms for the
 * connect and every command. NULL with errstr ("redis 127.0.0.1:6379:
 * Connection refused") when Redis cannot be reached. Caller frees with
 * psstore_conn_destroy(). A URL that names a Redis Cluster node (or
 * several hosts) gives a cluster connection: commands go to the node of
 * their key's slot, following MOVED and ASK and riding out a fail-over
 * (docs/design.md "Redis Cluster"). */
psstore_conn_t *psstore_conn_new(const char *url, int timeout_ms, char *errstr, size_t size);
void psstore_conn_destroy(psstore_conn_t *c);
/* Nonzero when c talks to a Redis Cluster. */
int psstore_conn_is_cluster(const psstore_conn_t *c);
/* The last error of this connection. */
const char *psstore_conn_error(const psstore_conn_t *c);
/* Refuses (FR_ERR_UNSUPPORTED) a Redis whose maxmemory-policy evicts keys;
 * warns once and succeeds where CONFIG is disabled. */
fr_err_t psstore_conn_check_policy(psstore_conn_t *c);
/* Stopping without waiting on a dead Redis: while fn(arg) returns nonzero
 * (its owner is stopping), a broken connection is tried once more and
 * not retried with backoff, so a command fails at once instead of after
 * the connection's timeout. Commands on a live connection are unaffected. */
typedef int (*psstore_cancel_fn)(void *arg);
void psstore_conn_set_cancel(psstore_conn_t *c, psstore_cancel_fn fn, void *arg);

#ifdef __cplusplus
}
#endif

#endif /* FRESHET_PSSTORE_REDIS_H */
