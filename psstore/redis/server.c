/*
 * server.c - what a connection asks of the servers rather than of a key:
 * the run_id of the server holding a key (a restart may have lost writes)
 * and the eviction-policy check of docs/design.md "Failure model".
 *
 * Threads: as the connection (one thread at a time).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "psstore/redis/redis_int.h"

/* ------------------------------------------------------------------------
 * Server facts
 * ---------------------------------------------------------------------- */
/* The run_id line of INFO server (40 hex digits), into buf[size]. */
fr_err_t ps_server_run_id(psstore_conn_t *c, const char *key, char *buf, size_t size)
{
    fr_err_t err;
    ps_conn_route_key(c, key);
    redisReply *r = ps_cmd(c, 1, &err, "INFO server");
    if (r == NULL)
        return err;
    const char *p = NULL;
    if (r->type == REDIS_REPLY_STRING) {
        for (p = r->str; p != NULL; p = strchr(p, '\n')) {
            p += *p == '\n';
            if (strncmp(p, "run_id:", 7) == 0)
                break;
        }
    }
    if (p == NULL) {
        char ep[300];
        ps_endpoint(c, ep, sizeof(ep));
        freeReplyObject(r);
        return ps_fail(c, FR_ERR_REDIS, "redis %s: INFO server has no run_id", ep);
    }
    p += 7;
    size_t n = strcspn(p, "\r\n");
    if (n >= size)
        n = size - 1;
    memcpy(buf, p, n);
    buf[n] = '\0';
    freeReplyObject(r);
    return FR_OK;
}

/* The maxmemory-policy check of one node (the current one). */
static fr_err_t check_policy_node(psstore_conn_t *c)
{
    static atomic_int warned;
    fr_err_t err;
    redisReply *r = ps_cmd(c, 1, &err, "CONFIG GET maxmemory-policy");
    char ep[300];
    ps_endpoint(c, ep, sizeof(ep));
    if (r == NULL && c->ctx == NULL)
        return err; /* the connection failed: c->errstr says why */
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
        r->element[1]->type != REDIS_REPLY_STRING) {
        if (atomic_exchange(&warned, 1) == 0)
            fr_log(FR_LOG_WARN,
                   "psstore: redis %s: cannot read maxmemory-policy (%s); make sure it is "
                   "noeviction, or evicted offsets would re-apply a topic",
                   ep, r == NULL ? c->errstr : "unexpected reply");
        freeReplyObject(r);
        return FR_OK;
    }
    err = FR_OK;
    if (strcmp(r->element[1]->str, "noeviction") != 0)
        err = ps_fail(c, FR_ERR_UNSUPPORTED,
                      "redis %s: maxmemory-policy %.64s evicts keys; freshet needs noeviction "
                      "(losing offsets would re-apply a topic)",
                      ep, r->element[1]->str);
    freeReplyObject(r);
    return err;
}

/*
 * docs/design.md "Failure model": losing the offsets hash to eviction would re-apply
 * a whole topic, so only noeviction is accepted (the volatile-* policies
 * evict too, starting with the lease); in a cluster on every master. Where
 * CONFIG is refused (disabled, renamed, or not permitted to this ACL user)
 * the policy cannot be known: a warning, once per process, and FR_OK.
 */
fr_err_t psstore_conn_check_policy(psstore_conn_t *c)
{
    int nodes[PS_NODES_MAX];
    int n = ps_conn_masters(c, nodes, PS_NODES_MAX);
    fr_err_t err = FR_OK;
    for (int i = 0; i < n && err == FR_OK; i++) {
        ps_conn_pin(c, nodes[i]);
        err = check_policy_node(c);
    }
    ps_conn_pin(c, -1);
    return err;
}

void psstore_conn_set_cancel(psstore_conn_t *c, psstore_cancel_fn fn, void *arg)
{
    c->cancel = fn;
    c->cancel_arg = arg;
}

int psstore_conn_is_cluster(const psstore_conn_t *c)
{
    return c->cl != NULL;
}
