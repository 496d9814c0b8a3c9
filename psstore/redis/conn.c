/*
 * conn.c - the parameter store's connection to Redis: connect with AUTH and
 * SELECT (the URL parsed by url.c), commands with reconnection and backoff,
 * routing by slot on a Redis Cluster, pipelines. What it asks of the
 * servers themselves (run_id, eviction policy) is in server.c.
 *
 * Every error message names the endpoint ("redis 127.0.0.1:6390: Connection
 * refused") and never the password: nothing here prints a URL, only the
 * host and port (or the socket path) taken from it.
 *
 * Threads: a psstore_conn_t belongs to one thread, as a hiredis context
 * does.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "psstore/redis/redis_int.h"

/* The timeout when psstore_conn_new is given none. */
#define CONN_DEFAULT_TIMEOUT_MS 5000
/* The first pause of the reconnection backoff; it doubles each try. */
#define CONN_BACKOFF_FIRST_MS 10

/* ------------------------------------------------------------------------
 * Errors
 * ---------------------------------------------------------------------- */
fr_err_t ps_fail(psstore_conn_t *c, fr_err_t err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errstr, sizeof(c->errstr), fmt, ap);
    va_end(ap);
    return err;
}

/* A reply of the wrong shape: FR_ERR_REDIS naming the command. */
fr_err_t ps_unexpected(psstore_conn_t *c, const char *cmd)
{
    char ep[300];
    ps_endpoint(c, ep, sizeof(ep));
    return ps_fail(c, FR_ERR_REDIS, "redis %s: unexpected reply to %s", ep, cmd);
}

const char *psstore_conn_error(const psstore_conn_t *c)
{
    return c != NULL ? c->errstr : "redis: no connection";
}

/*
 * Records a broken connection: fills c->errstr with the endpoint and
 * hiredis's reason (a timeout said as one), frees the context so that the
 * next command reconnects, and returns FR_ERR_REDIS. saved_errno is errno
 * right after the failing call.
 */
static fr_err_t conn_broken(psstore_conn_t *c, int saved_errno)
{
    char ep[300];
    ps_endpoint(c, ep, sizeof(ep));
    if (c->ctx == NULL)
        return ps_fail(c, FR_ERR_REDIS, "redis %s: not connected", ep);
    if (c->ctx->err == REDIS_ERR_IO && (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK))
        ps_fail(c, FR_ERR_REDIS, "redis %s: no answer within %d ms", ep, c->timeout_ms);
    else
        ps_fail(c, FR_ERR_REDIS, "redis %s: %s", ep,
                c->ctx->errstr[0] ? c->ctx->errstr : "connection lost");
    redisFree(c->ctx);
    c->ctx = NULL;
    c->pending = c->ndefer; /* sent commands are lost; held ones were not sent */
    c->watching = 0;
    c->broken = 1;
    if (c->cl != NULL)
        c->cl->stale = 1; /* the node may be gone: a fail-over moves its slots */
    return FR_ERR_REDIS;
}

/*
 * Turns a reply into the caller's result: an error reply is freed and
 * becomes NULL with FR_ERR_REDIS and the server's message (a cluster
 * redirection explained as such); anything else is returned as is.
 */
static redisReply *check_reply(psstore_conn_t *c, redisReply *reply, fr_err_t *err)
{
    if (reply->type != REDIS_REPLY_ERROR) {
        *err = FR_OK;
        return reply;
    }
    char ep[300];
    ps_endpoint(c, ep, sizeof(ep));
    if (c->cl == NULL &&
        (strncmp(reply->str, "MOVED ", 6) == 0 || strncmp(reply->str, "ASK ", 4) == 0))
        ps_fail(c, FR_ERR_REDIS,
                "redis %s: the key lives on another Redis Cluster node (%.200s), yet this "
                "node said it was no cluster when freshet connected",
                ep, reply->str);
    else
        ps_fail(c, FR_ERR_REDIS, "redis %s: %.400s", ep, reply->str);
    freeReplyObject(reply);
    *err = FR_ERR_REDIS;
    return NULL;
}

/* ------------------------------------------------------------------------
 * Connecting
 * ---------------------------------------------------------------------- */

/*
 * hiredis writes with write(2): a peer that closed the socket would kill the
 * process with SIGPIPE instead of returning EPIPE. Where the program left
 * SIGPIPE at its default, it is ignored once, process-wide; a program that
 * installed its own handler keeps it.
 */
static void ignore_sigpipe(void)
{
    struct sigaction sa;
    if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL) {
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = SIG_IGN;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGPIPE, &sa, NULL);
    }
}

/*
 * Sends one handshake command on the fresh context. A reply error is fatal
 * (wrong password, no such database) except LOADING, which passes once
 * Redis has read its data. Returns FR_OK or FR_ERR_REDIS with c->errstr.
 */
static fr_err_t handshake_cmd(psstore_conn_t *c, int *fatal, const char *what, int argc,
                              const char **argv)
{
    redisReply *r = redisCommandArgv(c->ctx, argc, argv, NULL);
    if (r == NULL)
        return conn_broken(c, errno);
    fr_err_t err = FR_OK;
    if (r->type == REDIS_REPLY_ERROR) {
        char ep[300];
        ps_endpoint(c, ep, sizeof(ep));
        *fatal = strncmp(r->str, "LOADING", 7) != 0;
        err = ps_fail(c, FR_ERR_REDIS, "redis %s: %s failed: %.300s", ep, what, r->str);
        redisFree(c->ctx);
        c->ctx = NULL;
    }
    freeReplyObject(r);
    return err;
}

/*
 * One connection attempt: connect within the timeout, set the command
 * timeout and TCP keep-alive, then AUTH and SELECT as the URL says (or PING,
 * so that an attempt always proves a Redis answers). On failure c->ctx is
 * NULL, c->errstr says why and *fatal is set when retrying cannot help.
 */
static fr_err_t conn_open(psstore_conn_t *c, int *fatal)
{
    char ep[300];
    ps_endpoint(c, ep, sizeof(ep));
    *fatal = 0;
    if (c->ctx != NULL) {
        redisFree(c->ctx);
        c->ctx = NULL;
    }
    struct timeval tv = {c->timeout_ms / 1000, (c->timeout_ms % 1000) * 1000};
    c->pending = c->ndefer;
    c->watching = 0;
    if (c->cl != NULL)
        c->ctx = redisConnectWithTimeout(c->cl->nodes[c->cl->cur].host,
                                         c->cl->nodes[c->cl->cur].port, tv);
    else
        c->ctx = c->url.unix_socket ? redisConnectUnixWithTimeout(c->url.path, tv)
                                    : redisConnectWithTimeout(c->url.host, c->url.port, tv);
    if (c->ctx == NULL)
        return ps_fail(c, FR_ERR_REDIS, "redis %s: out of memory", ep);
    if (c->ctx->err)
        return conn_broken(c, errno);
    /* keep the reader's buffer between replies: big weights replies would
     * otherwise reallocate (and first-touch) it every time */
    c->ctx->reader->maxbuf = 0;
    if (redisSetTimeout(c->ctx, tv) != REDIS_OK ||
        (!c->url.unix_socket && redisEnableKeepAlive(c->ctx) != REDIS_OK))
        return conn_broken(c, errno);

    fr_err_t err = FR_OK;
    if (c->url.user[0] != '\0') {
        const char *argv[] = {"AUTH", c->url.user, c->url.pass};
        err = handshake_cmd(c, fatal, "AUTH", 3, argv);
    } else if (c->url.pass[0] != '\0') {
        const char *argv[] = {"AUTH", c->url.pass};
        err = handshake_cmd(c, fatal, "AUTH", 2, argv);
    }
    if (err == FR_OK && c->url.db != 0) {
        char db[16];
        snprintf(db, sizeof(db), "%d", c->url.db);
        const char *argv[] = {"SELECT", db};
        err = handshake_cmd(c, fatal, "SELECT", 2, argv);
    } else if (err == FR_OK && c->url.user[0] == '\0' && c->url.pass[0] == '\0') {
        const char *argv[] = {"PING"};
        err = handshake_cmd(c, fatal, "PING", 1, argv);
    }
    return err;
}

/* ------------------------------------------------------------------------
 * Redis Cluster: which node a command goes to (docs/design.md "Redis
 * Cluster"). c->ctx is always the current node's context; the others wait
 * in their ps_node_t.
 * ---------------------------------------------------------------------- */

/* The longest pause between tries while a cluster fails over or migrates. */
#define CLUSTER_BACKOFF_MAX_MS 500
/* Redirections one command follows before giving up (a map in flux). */
#define CLUSTER_REDIRECTS_MAX 16

/* The next pause of a cluster backoff: doubled, at most
 * CLUSTER_BACKOFF_MAX_MS. */
static long next_delay(long ms)
{
    return ms * 2 > CLUSTER_BACKOFF_MAX_MS ? CLUSTER_BACKOFF_MAX_MS : ms * 2;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Makes node the current one: its context (maybe NULL) becomes c->ctx. */
static void cl_switch(psstore_conn_t *c, int node)
{
    ps_cluster_t *cl = c->cl;
    if (node == cl->cur)
        return;
    if (cl->cur >= 0)
        cl->nodes[cl->cur].ctx = c->ctx;
    c->ctx = cl->nodes[node].ctx;
    cl->nodes[node].ctx = NULL;
    cl->cur = node;
    c->pending = c->ndefer;
}

/*
 * Reads the slot map with CLUSTER SLOTS from the first node that answers
 * (the seeds are among the nodes known). Returns FR_OK or FR_ERR_REDIS.
 */
static fr_err_t cl_refresh(psstore_conn_t *c)
{
    ps_cluster_t *cl = c->cl;
    int order[PS_NODES_MAX], n = 0;
    /* nodes with an open connection first (a dead host may take a whole
     * connect timeout), then the masters of the map, then every other */
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < (int)cl->nnodes; i++) {
            int seen = 0;
            for (int j = 0; j < n && !seen; j++)
                seen = order[j] == i;
            int open = i == cl->cur ? c->ctx != NULL : cl->nodes[i].ctx != NULL, master = 0;
            for (int s = 0; s < PS_SLOTS && !master && pass == 1; s++)
                master = cl->slot_node[s] == i;
            if (!seen && (pass == 2 || (pass == 0 && open) || (pass == 1 && master)))
                order[n++] = i;
        }
    }
    /* at most one timeout for the whole search, however many nodes are
     * down; a failure on another node than the current one is no break of
     * the current connection (c->broken) */
    uint64_t deadline = fr_clock_mono_ns() + (uint64_t)c->timeout_ms * 1000000u;
    int home = cl->cur, home_broken = c->broken;
    for (int i = 0; i < n && (i == 0 || fr_clock_mono_ns() < deadline); i++) {
        cl_switch(c, order[i]);
        int fatal = 0;
        redisReply *r = NULL;
        if ((c->ctx == NULL || c->ctx->err) && conn_open(c, &fatal) != FR_OK)
            r = NULL;
        else if ((r = redisCommand(c->ctx, "CLUSTER SLOTS")) == NULL)
            conn_broken(c, errno);
        int covered = -1;
        if (r != NULL) {
            char asked[sizeof(cl->nodes[0].host)]; /* loading may move cl->nodes */
            memcpy(asked, cl->nodes[cl->cur].host, sizeof(asked));
            covered = ps_cluster_load_slots(cl, r, asked);
            freeReplyObject(r);
        }
        if (order[i] == home)
            home_broken = c->broken;
        c->broken = home_broken;
        if (covered > 0)
            return FR_OK;
    }
    return FR_ERR_REDIS; /* c->errstr: the last node's reason */
}

/*
 * Makes c->ctx the context of the node for a command: that of slot when
 * slot >= 0 (which keyless commands then follow), else the pinned node,
 * else that of the last slot. Reads the map again when it is stale or the
 * slot has no node. A pipeline in progress never changes node.
 */
static fr_err_t cl_route(psstore_conn_t *c, int slot)
{
    ps_cluster_t *cl = c->cl;
    if (slot >= 0)
        cl->slot = slot;
    if (c->watching && c->ctx != NULL)
        return FR_OK; /* a WATCH holds this connection: a slot that moved meanwhile
                         answers MOVED, which drops it */
    int node = cl->cur;
    if (slot < 0 && cl->pinned >= 0) {
        node = cl->pinned;
    } else if (cl->slot >= 0) {
        if ((cl->stale || cl->slot_node[cl->slot] < 0) && c->pending == c->ndefer) {
            int keep = cl->cur;
            if (cl_refresh(c) != FR_OK)
                cl_switch(c, keep);
        }
        node = cl->slot_node[cl->slot];
        if (node < 0)
            return ps_fail(c, FR_ERR_REDIS, "redis cluster: no node serves slot %d", cl->slot);
    }
    if (node == cl->cur)
        return FR_OK;
    if (c->pending > c->ndefer && c->ctx != NULL)
        return ps_fail(c, FR_ERR_INVAL,
                       "redis cluster: one pipeline would span two nodes (slot %d)", cl->slot);
    cl_switch(c, node);
    if (c->broken && c->ctx != NULL && !c->ctx->err) {
        /* the connection broke and the slot is now served by another node
         * whose connection was open already: that is a reconnect too (a
         * fail-over may have lost writes), for whoever built state */
        c->reconnects++;
        c->broken = 0;
    }
    return FR_OK;
}

/* The kinds of error reply a cluster answers while its map changes. */
enum cl_answer { CL_FINAL, CL_MOVED, CL_ASK, CL_WAIT };

static enum cl_answer cl_classify(const psstore_conn_t *c, const redisReply *r)
{
    if (c->cl == NULL || r->type != REDIS_REPLY_ERROR)
        return CL_FINAL;
    if (strncmp(r->str, "MOVED ", 6) == 0)
        return CL_MOVED;
    if (strncmp(r->str, "ASK ", 4) == 0)
        return CL_ASK;
    if (strncmp(r->str, "TRYAGAIN", 8) == 0 || strncmp(r->str, "CLUSTERDOWN", 11) == 0)
        return CL_WAIT;
    return CL_FINAL;
}

/*
 * Drops the connection after a redirection met where it cannot be
 * followed (in a pipeline, or a command that must not be repeated on
 * another connection): callers see a broken connection, which they handle.
 */
static fr_err_t cl_drop(psstore_conn_t *c, const redisReply *r)
{
    char ep[300];
    ps_endpoint(c, ep, sizeof(ep));
    ps_fail(c, FR_ERR_REDIS, "redis %s: %.200s (the cluster's map changed)", ep, r->str);
    ps_pipeline_discard(c);
    c->cl->stale = 1;
    return FR_ERR_REDIS;
}

/*
 * Follows a MOVED or ASK reply r: the node it names becomes known, and for
 * MOVED its slot's owner. Returns the node's index, or -1.
 */
static int cl_redirect_node(psstore_conn_t *c, const redisReply *r)
{
    int ask, slot, port;
    char host[256];
    if (ps_cluster_redirect(r->str, r->len, &ask, &slot, host, sizeof(host), &port) != 0)
        return -1;
    int node = ps_cluster_node(c->cl, host, strlen(host), port);
    if (node >= 0 && !ask) {
        c->cl->slot_node[slot] = (int16_t)node;
        c->cl->stale = 1; /* other slots moved too, most likely */
    }
    return node;
}

/* ------------------------------------------------------------------------
 * Reconnecting
 * ---------------------------------------------------------------------- */

/* The owner's stop (psstore_conn_set_cancel): no more waiting. */
static int cancelled(const psstore_conn_t *c)
{
    return c->cancel != NULL && c->cancel(c->cancel_arg);
}

/*
 * Reconnects, retrying after 10, 20, 40 ... ms while the next try still
 * starts within timeout_ms of the first; in a cluster each retry reads the
 * map again, so a fail-over's new master is found. A connection that had
 * broken counts in c->reconnects and is logged. Returns FR_OK or
 * FR_ERR_REDIS with the last reason in c->errstr.
 */
static fr_err_t conn_reconnect(psstore_conn_t *c)
{
    uint64_t deadline = fr_clock_mono_ns() + (uint64_t)c->timeout_ms * 1000000u;
    long delay_ms = CONN_BACKOFF_FIRST_MS;
    for (int attempt = 0;; attempt++) {
        int fatal = 0;
        fr_err_t err = FR_OK;
        if (c->cl != NULL) {
            if (attempt > 0)
                c->cl->stale = 1;
            err = cl_route(c, -1);
        }
        if (err == FR_OK && (c->ctx == NULL || c->ctx->err))
            err = conn_open(c, &fatal);
        if (err == FR_OK) {
            if (c->broken) {
                char ep[300];
                ps_endpoint(c, ep, sizeof(ep));
                fr_log(FR_LOG_INFO, "psstore: reconnected to redis %s", ep);
                c->reconnects++;
                c->broken = 0;
            }
            return FR_OK;
        }
        if (fatal || fr_clock_mono_ns() + (uint64_t)delay_ms * 1000000u > deadline || cancelled(c))
            return err;
        sleep_ms(delay_ms);
        delay_ms = c->cl != NULL ? next_delay(delay_ms) : delay_ms * 2;
    }
}

/*
 * Asks the connected node for its slot map: a Redis Cluster node answers
 * with one, any other Redis with an error. Makes c a cluster connection
 * when it is one (the node it is connected to becomes the current node).
 * Returns FR_OK (either way), or an error when the URL names several hosts
 * of what is no cluster. (A database other than 0 fails earlier: a
 * cluster node refuses SELECT.)
 */
static fr_err_t detect_cluster(psstore_conn_t *c, const char *host, int port)
{
    char ep[300];
    ps_endpoint(c, ep, sizeof(ep));
    redisReply *r = redisCommand(c->ctx, "CLUSTER SLOTS");
    if (r == NULL)
        return conn_broken(c, errno);
    int is_cluster = r->type == REDIS_REPLY_ARRAY;
    fr_err_t err = FR_OK;
    if (!is_cluster && c->url.nseeds > 1)
        err = ps_fail(c, FR_ERR_INVAL,
                      "redis %s: the URL names %d hosts, but this Redis is no cluster (%.200s)", ep,
                      c->url.nseeds, r->type == REDIS_REPLY_ERROR ? r->str : "");
    if (err != FR_OK || !is_cluster) {
        freeReplyObject(r);
        return err;
    }
    if ((c->cl = ps_cluster_new()) == NULL) {
        freeReplyObject(r);
        return ps_fail(c, FR_ERR_NOMEM, "redis: out of memory");
    }
    c->cl->pinned = -1;
    for (int i = 0; i < c->url.nseeds; i++)
        ps_cluster_node(c->cl, c->url.seeds[i].host, strlen(c->url.seeds[i].host),
                        c->url.seeds[i].port);
    c->cl->cur = ps_cluster_node(c->cl, host, strlen(host), port);
    if (ps_cluster_load_slots(c->cl, r, host) <= 0) {
        freeReplyObject(r);
        return ps_fail(c, FR_ERR_REDIS, "redis %s: the cluster serves no slot yet", ep);
    }
    freeReplyObject(r);
    return FR_OK;
}

/*
 * Parses url and connects once, without backoff, so that a command line
 * pointed at a dead Redis fails at once; later commands reconnect with
 * backoff. Of several hosts (a cluster's seeds) the first that answers is
 * used. timeout_ms <= 0 means CONN_DEFAULT_TIMEOUT_MS. NULL with errstr
 * (naming the endpoint, never the password) on failure.
 */
psstore_conn_t *psstore_conn_new(const char *url, int timeout_ms, char *errstr, size_t size)
{
    static pthread_once_t sigpipe_once = PTHREAD_ONCE_INIT;
    pthread_once(&sigpipe_once, ignore_sigpipe);

    psstore_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "redis: out of memory");
        return NULL;
    }
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : CONN_DEFAULT_TIMEOUT_MS;
    int fatal = 0;
    fr_err_t err = psstore_url_parse(url, &c->url, c->errstr, sizeof(c->errstr));
    for (int i = 0; err == FR_OK; i++) {
        if (i > 0) { /* the next seed */
            snprintf(c->url.host, sizeof(c->url.host), "%s", c->url.seeds[i].host);
            c->url.port = c->url.seeds[i].port;
        }
        err = conn_open(c, &fatal);
        if (err == FR_OK || fatal || i + 1 >= c->url.nseeds)
            break;
        err = FR_OK; /* try the next */
    }
    if (err == FR_OK && !c->url.unix_socket)
        err = detect_cluster(c, c->url.host, c->url.port);
    if (err != FR_OK) {
        fr_errorf(FR_ERR_REDIS, errstr, size, "%s", c->errstr);
        psstore_conn_destroy(c);
        return NULL;
    }
    return c;
}

void psstore_conn_destroy(psstore_conn_t *c)
{
    if (c == NULL)
        return;
    redisFree(c->ctx);
    ps_cluster_free(c->cl);
    free(c->defer);
    explicit_bzero(&c->url, sizeof(c->url)); /* the password */
    free(c);
}

/* ------------------------------------------------------------------------
 * Commands
 * ---------------------------------------------------------------------- */

/* Follows WATCH, EXEC, DISCARD and UNWATCH (the command name, name[len])
 * in c->watching. */
static void note_watch(psstore_conn_t *c, const char *name, size_t len)
{
    if (len == 5 && strncasecmp(name, "WATCH", 5) == 0)
        c->watching = 1;
    else if ((len == 4 && strncasecmp(name, "EXEC", 4) == 0) ||
             (len == 7 &&
              (strncasecmp(name, "DISCARD", 7) == 0 || strncasecmp(name, "UNWATCH", 7) == 0)))
        c->watching = 0;
}

/* note_watch for a formatted command ("*N\r\n$L\r\nNAME\r\n..."). */
static void note_watch_resp(psstore_conn_t *c, const char *cmd, size_t len)
{
    const char *p = memchr(cmd, '\n', len);
    if (p == NULL || (size_t)(p + 1 - cmd) >= len || p[1] != '$')
        return;
    size_t n = (size_t)strtoul(p + 2, NULL, 10);
    const char *name = memchr(p + 1, '\n', len - (size_t)(p + 1 - cmd));
    if (name != NULL && (size_t)(name + 1 - cmd) + n <= len)
        note_watch(c, name + 1, n);
}

/*
 * Sends "ASKING" and the command to the current node and reads both
 * replies, or the command alone when asking is 0. Returns the command's
 * reply, or NULL when the connection failed (errno as it left it).
 */
static redisReply *send_and_read(psstore_conn_t *c, int asking, const char *cmd, size_t len)
{
    void *reply = NULL;
    if (asking && redisAppendCommand(c->ctx, "ASKING") != REDIS_OK)
        return NULL;
    if (redisAppendFormattedCommand(c->ctx, cmd, len) != REDIS_OK)
        return NULL;
    if (asking) {
        if (redisGetReply(c->ctx, &reply) != REDIS_OK || reply == NULL)
            return NULL;
        freeReplyObject(reply); /* +OK; an error would show in the command's reply */
        reply = NULL;
    }
    if (redisGetReply(c->ctx, &reply) != REDIS_OK)
        return NULL;
    return reply;
}

/*
 * Sends a formatted command and reads its reply. A missing or broken
 * context is reconnected first; a command that fails on the wire is sent
 * again once after a reconnect when retry is set. In a cluster the command
 * goes to its key's node, and when retry is set MOVED and ASK are followed
 * and TRYAGAIN and CLUSTERDOWN retried with backoff within the timeout (the
 * command did not run); without retry any of them drops the connection
 * (a WATCH would not follow the command elsewhere). Returns the reply
 * (caller frees) or NULL with *err and c->errstr.
 */
static redisReply *run_formatted(psstore_conn_t *c, int retry, const char *cmd, size_t len,
                                 fr_err_t *err)
{
    int slot = c->cl != NULL ? ps_resp_slot(cmd, len) : -1;
    uint64_t deadline = fr_clock_mono_ns() + (uint64_t)c->timeout_ms * 1000000u;
    long delay_ms = CONN_BACKOFF_FIRST_MS;
    int asking = 0, redirects = 0;
    for (int sent = 0;;) {
        if (c->cl != NULL && !asking && (*err = cl_route(c, slot)) != FR_OK) {
            if (*err != FR_ERR_REDIS ||
                fr_clock_mono_ns() + (uint64_t)delay_ms * 1000000u > deadline || cancelled(c))
                return NULL;
            c->cl->stale = 1;
            sleep_ms(delay_ms);
            delay_ms = next_delay(delay_ms);
            continue;
        }
        if ((c->ctx == NULL || c->ctx->err) && (*err = conn_reconnect(c)) != FR_OK)
            return NULL;
        int from = c->cl != NULL ? c->cl->cur : -1;
        redisReply *reply = send_and_read(c, asking, cmd, len);
        asking = 0;
        if (reply == NULL) {
            *err = conn_broken(c, errno);
            if (!retry || sent++ > 0)
                return NULL;
            continue;
        }
        enum cl_answer kind = cl_classify(c, reply);
        if (kind == CL_FINAL) {
            if (c->cl != NULL)
                note_watch_resp(c, cmd, len);
            return check_reply(c, reply, err);
        }
        if (!retry) {
            /* the caller's context (a WATCH) lives on this connection:
             * another try might go to another node without it */
            *err = cl_drop(c, reply);
            freeReplyObject(reply);
            return NULL;
        }
        if (kind == CL_WAIT) {
            c->cl->stale = 1;
            if (fr_clock_mono_ns() + (uint64_t)delay_ms * 1000000u > deadline || cancelled(c))
                return check_reply(c, reply, err);
            freeReplyObject(reply);
            sleep_ms(delay_ms);
            delay_ms = next_delay(delay_ms);
            continue;
        }
        int node = cl_redirect_node(c, reply);
        if (node < 0 || ++redirects > CLUSTER_REDIRECTS_MAX)
            return check_reply(c, reply, err);
        freeReplyObject(reply);
        c->watching = 0; /* a command that may be repeated is in no WATCH */
        if (kind == CL_ASK) {
            /* this command only: the map still names the old node, so the
             * target is opened here, not through routing */
            cl_switch(c, node);
            int fatal = 0;
            if ((c->ctx == NULL || c->ctx->err) && (*err = conn_open(c, &fatal)) != FR_OK)
                return NULL;
            asking = 1;
        } else if (node != from) {
            /* the slot's data now lives elsewhere: whoever built state on
             * this connection reloads it, as after a reconnect */
            c->reconnects++;
        }
    }
}

/*
 * See redis_int.h. The command is formatted once, so a retry sends the
 * same bytes; hiredis would format (and copy) it the same way itself.
 */
redisReply *ps_cmd_argv(psstore_conn_t *c, int retry, int argc, const char **argv,
                        const size_t *lens, fr_err_t *err)
{
    fr_err_t local;
    if (err == NULL)
        err = &local;
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, argc, argv, lens);
    if (len < 0) {
        *err = ps_fail(c, FR_ERR_NOMEM, "redis: out of memory formatting a command");
        return NULL;
    }
    redisReply *reply = run_formatted(c, retry, cmd, (size_t)len, err);
    redisFreeCommand(cmd);
    return reply;
}

redisReply *ps_cmd(psstore_conn_t *c, int retry, fr_err_t *err, const char *fmt, ...)
{
    fr_err_t local;
    if (err == NULL)
        err = &local;
    char *cmd = NULL;
    va_list ap;
    va_start(ap, fmt);
    int len = redisvFormatCommand(&cmd, fmt, ap);
    va_end(ap);
    if (len < 0) {
        *err = ps_fail(c, FR_ERR_NOMEM, "redis: out of memory formatting a command");
        return NULL;
    }
    redisReply *reply = run_formatted(c, retry, cmd, (size_t)len, err);
    redisFreeCommand(cmd);
    return reply;
}

/*
 * Holds a keyless command that opens a cluster pipeline (MULTI, before the
 * WATCHed or written keys): the node is not known yet.
 */
static fr_err_t defer_command(psstore_conn_t *c, int argc, const char **argv, const size_t *lens)
{
    char *cmd = NULL;
    int len = redisFormatCommandArgv(&cmd, argc, argv, lens);
    if (len < 0)
        return ps_fail(c, FR_ERR_NOMEM, "redis: out of memory formatting a command");
    if (FR_GROW(c->defer, c->defer_cap, c->defer_len + (size_t)len) != FR_OK) {
        redisFreeCommand(cmd);
        return ps_fail(c, FR_ERR_NOMEM, "redis: out of memory queueing a command");
    }
    memcpy(c->defer + c->defer_len, cmd, (size_t)len);
    c->defer_len += (size_t)len;
    redisFreeCommand(cmd);
    c->ndefer++;
    c->pending++;
    return FR_OK;
}

/*
 * Readies c->ctx for the pipeline's next command (slot: its key's, or -1):
 * routes it, (re)connects, and sends along the commands held back until a
 * key named the node.
 */
static fr_err_t pipeline_ready(psstore_conn_t *c, int slot)
{
    fr_err_t err;
    if (c->cl != NULL && (err = cl_route(c, slot)) != FR_OK)
        return err;
    if ((c->ctx == NULL || c->ctx->err) && (err = conn_reconnect(c)) != FR_OK)
        return err;
    if (c->ndefer > 0) {
        if (redisAppendFormattedCommand(c->ctx, c->defer, c->defer_len) != REDIS_OK)
            return ps_fail(c, FR_ERR_NOMEM, "redis: out of memory queueing a command");
        c->defer_len = c->ndefer = 0;
    }
    return FR_OK;
}

/*
 * Queues one command. Nothing is sent until ps_pipeline_read, so a missing
 * context is (re)connected here, before the first command of a pipeline;
 * in a cluster the first command's key chooses the node, and a later one
 * whose key lives on another node is refused. The caller reads exactly
 * one reply per appended command, also after an error reply (the
 * connection stays in step); after a broken connection every further read
 * fails at once.
 */
/* pipeline_ready, discarding what a cluster connection held back (MULTI)
 * when it fails: it must not go out later on its own. */
static fr_err_t ready_or_discard(psstore_conn_t *c, int slot)
{
    fr_err_t err = pipeline_ready(c, slot);
    if (err != FR_OK && c->cl != NULL) {
        char why[sizeof(c->errstr)];
        memcpy(why, c->errstr, sizeof(why));
        ps_pipeline_discard(c);
        memcpy(c->errstr, why, sizeof(why));
    }
    return err;
}

fr_err_t ps_pipeline_append_formatted(psstore_conn_t *c, const char *key, size_t klen,
                                      const char *cmd, size_t len)
{
    fr_err_t err = ready_or_discard(c, c->cl != NULL ? psstore_key_slot(key, klen) : -1);
    if (err != FR_OK)
        return err;
    if (redisAppendFormattedCommand(c->ctx, cmd, len) != REDIS_OK)
        return ps_fail(c, FR_ERR_NOMEM, "redis: out of memory queueing a command");
    c->pending++;
    return FR_OK;
}

fr_err_t ps_pipeline_append(psstore_conn_t *c, int argc, const char **argv, const size_t *lens)
{
    fr_err_t err;
    int slot = c->cl != NULL ? ps_argv_slot(argc, argv, lens) : -1;
    if (c->cl != NULL && slot < 0 && c->pending == c->ndefer)
        return defer_command(c, argc, argv, lens);
    if ((err = ready_or_discard(c, slot)) != FR_OK)
        return err;
    if (redisAppendCommandArgv(c->ctx, argc, argv, lens) != REDIS_OK)
        return ps_fail(c, FR_ERR_NOMEM, "redis: out of memory queueing a command");
    c->pending++;
    if (c->cl != NULL)
        note_watch(c, argv[0], lens ? lens[0] : strlen(argv[0]));
    return FR_OK;
}

fr_err_t ps_pipeline_flush(psstore_conn_t *c)
{
    if (c->ndefer > 0 || c->ctx == NULL || c->ctx->err)
        return FR_OK; /* nothing to send yet, or ps_pipeline_read reports the break */
    int done = 0;
    while (!done) {
        if (redisBufferWrite(c->ctx, &done) != REDIS_OK)
            return FR_OK; /* c->ctx->err is set: the first read reports it */
    }
    return FR_OK;
}

void ps_pipeline_discard(psstore_conn_t *c)
{
    redisFree(c->ctx);
    c->ctx = NULL;
    c->pending = 0;
    c->defer_len = c->ndefer = 0;
    c->watching = 0;
    c->broken = 1;
}

/*
 * Reads the next reply of a pipeline: as ps_cmd_argv's result, but never
 * reconnecting (the pipeline's commands would be lost). A transport failure
 * leaves c->ctx NULL, which is how callers tell it from an error reply:
 * both are FR_ERR_REDIS. In a cluster, a redirection or TRYAGAIN or
 * CLUSTERDOWN inside a pipeline drops the connection the same way (a
 * transaction met by one is aborted by Redis, EXECABORT): the caller
 * starts over and the next command finds the node.
 */
redisReply *ps_pipeline_read(psstore_conn_t *c, fr_err_t *err)
{
    fr_err_t local;
    if (err == NULL)
        err = &local;
    if (c->ndefer > 0 && (*err = pipeline_ready(c, -1)) != FR_OK) {
        /* a pipeline of keyless commands only (to the last key's node)
         * that cannot be sent: it is over */
        c->pending = c->defer_len = c->ndefer = 0;
        return NULL;
    }
    if (c->ctx == NULL || c->ctx->err) {
        *err = FR_ERR_REDIS; /* c->errstr holds why the pipeline broke */
        return NULL;
    }
    void *reply = NULL;
    if (redisGetReply(c->ctx, &reply) != REDIS_OK || reply == NULL) {
        *err = conn_broken(c, errno);
        return NULL;
    }
    if (c->pending > 0)
        c->pending--;
    if (cl_classify(c, reply) != CL_FINAL) {
        *err = cl_drop(c, reply);
        freeReplyObject(reply);
        return NULL;
    }
    return check_reply(c, reply, err);
}

/*
 * Reads the replies of n queued commands and returns the last one (EXEC's)
 * or NULL with *err. Every reply is read even after an error reply, so the
 * connection stays in step; the first error is the one reported (a queued
 * command's error, rather than the EXECABORT that follows it).
 */
redisReply *ps_pipeline_finish(psstore_conn_t *c, size_t n, fr_err_t *err)
{
    char first_msg[sizeof(c->errstr)];
    fr_err_t first = FR_OK;
    redisReply *last = NULL;
    for (size_t i = 0; i < n; i++) {
        fr_err_t e;
        redisReply *r = ps_pipeline_read(c, &e);
        if (r == NULL) {
            if (first == FR_OK) {
                first = e;
                memcpy(first_msg, c->errstr, sizeof(first_msg));
            }
            if (c->ctx == NULL)
                break; /* the connection broke: no more replies will come */
            continue;
        }
        if (i == n - 1)
            last = r;
        else
            freeReplyObject(r);
    }
    if (first != FR_OK) {
        memcpy(c->errstr, first_msg, sizeof(c->errstr));
        freeReplyObject(last);
        *err = first;
        return NULL;
    }
    *err = FR_OK;
    return last;
}

/* ------------------------------------------------------------------------
 * Routing keyless commands
 * ---------------------------------------------------------------------- */
void ps_conn_route_key(psstore_conn_t *c, const char *key)
{
    if (c->cl != NULL)
        c->cl->slot = psstore_key_slot(key, strlen(key));
}

int ps_conn_masters(psstore_conn_t *c, int *nodes, int max)
{
    if (c->cl == NULL) {
        nodes[0] = -1; /* the one Redis */
        return 1;
    }
    if (c->cl->stale && c->pending == c->ndefer) {
        int keep = c->cl->cur;
        if (cl_refresh(c) != FR_OK)
            cl_switch(c, keep);
    }
    return ps_cluster_masters(c->cl, nodes, max);
}

void ps_conn_pin(psstore_conn_t *c, int node)
{
    if (c->cl != NULL)
        c->cl->pinned = node;
}
