/*
 * harness_cluster.c - a real Redis Cluster for the integration tests:
 * redis-server --cluster-enabled yes on free loopback ports, joined with
 * redis-cli --cluster create, stopped by PID; and the operations a test
 * does to it (who serves a key, a slot migration key by key).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* A node's answer to cmd (split on spaces; "%s" in it is arg, one
 * argument), or "" when it cannot be reached. */
static void query(const harness_cluster_t *cl, int i, char *out, size_t size, const char *cmd,
                  const char *arg)
{
    out[0] = '\0';
    if (cl->node[i].pid <= 0 || harness_redis_query(&cl->node[i], out, size, cmd, arg) != 0)
        out[0] = '\0';
}

int harness_cluster_start(harness_cluster_t *cl, int masters, int replicas)
{
    memset(cl, 0, sizeof(*cl));
    cl->n = masters * (1 + replicas);
    if (masters < 3 || cl->n > HARNESS_CLUSTER_MAX) {
        fprintf(stderr, "harness: a cluster needs 3..%d nodes\n", HARNESS_CLUSTER_MAX);
        return -1;
    }
    char create[2048], log[300];
    int off = snprintf(create, sizeof(create), "redis-cli --cluster create");
    size_t uoff = (size_t)snprintf(cl->url, sizeof(cl->url), "redis://");
    for (int i = 0; i < cl->n; i++) {
        /* the bus port is not port + 10000, which may pass 65535; like the
         * client port it may be taken between harness_free_port and the
         * node's bind, and then the node exits: another bus port, a few
         * times (harness_redis_start retries the client port itself) */
        int started = -1;
        for (int attempt = 0; attempt < 5 && started != 0; attempt++) {
            char args[200];
            snprintf(args, sizeof(args),
                     "--cluster-enabled yes --cluster-config-file nodes.conf "
                     "--cluster-node-timeout 2000 --cluster-port %d --appendonly no "
                     "--repl-diskless-sync-delay 0",
                     harness_free_port());
            started = harness_redis_start(&cl->node[i], args);
            if (started != 0)
                harness_redis_stop(&cl->node[i]); /* its folder: the next try makes one */
        }
        if (started != 0) {
            harness_cluster_stop(cl);
            return -1;
        }
        off +=
            snprintf(create + off, sizeof(create) - (size_t)off, " 127.0.0.1:%d", cl->node[i].port);
        uoff += (size_t)snprintf(cl->url + uoff, sizeof(cl->url) - uoff, "%s127.0.0.1:%d",
                                 i ? "," : "", cl->node[i].port);
    }
    snprintf(create + off, sizeof(create) - (size_t)off,
             " --cluster-replicas %d --cluster-yes > %s/create.log 2>&1", replicas,
             cl->node[0].dir);
    snprintf(log, sizeof(log), "%s/create.log", cl->node[0].dir);
    if (system(create) != 0) {
        fprintf(stderr, "harness: redis-cli --cluster create failed; see %s\n", log);
        harness_cluster_stop(cl);
        return -1;
    }
    if (harness_cluster_wait_ok(cl, "freshet:{harness}:x", 20000) != 0) {
        fprintf(stderr, "harness: the cluster did not reach cluster_state:ok\n");
        harness_cluster_stop(cl);
        return -1;
    }
    return 0;
}

void harness_cluster_stop(harness_cluster_t *cl)
{
    for (int i = 0; i < cl->n; i++)
        harness_redis_stop(&cl->node[i]);
}

int harness_cluster_owner(const harness_cluster_t *cl, const char *key)
{
    for (int i = 0; i < cl->n; i++) {
        char out[256], role[4096];
        query(cl, i, out, sizeof(out), "EXISTS %s", key);
        query(cl, i, role, sizeof(role), "ROLE", NULL);
        if (out[0] >= '0' && out[0] <= '9' && strncmp(role, "master", 6) == 0)
            return i;
    }
    return -1;
}

int harness_cluster_node_id(const harness_cluster_t *cl, int i, char *id)
{
    char out[128];
    query(cl, i, out, sizeof(out), "CLUSTER MYID", NULL);
    if (strlen(out) != 40)
        return -1;
    memcpy(id, out, 41);
    return 0;
}

int harness_cluster_wait_ok(const harness_cluster_t *cl, const char *key, int timeout_ms)
{
    for (int waited = 0; waited <= timeout_ms; waited += 100) {
        int ok = harness_cluster_owner(cl, key) >= 0;
        for (int i = 0; i < cl->n && ok; i++) {
            char out[4096];
            if (cl->node[i].pid <= 0)
                continue;
            query(cl, i, out, sizeof(out), "CLUSTER INFO", NULL);
            ok = strstr(out, "cluster_state:ok") != NULL;
            /* a replica that has not synced once would never take over */
            query(cl, i, out, sizeof(out), "INFO replication", NULL);
            if (ok && strstr(out, "role:slave") != NULL)
                ok = strstr(out, "master_link_status:up") != NULL;
        }
        if (ok)
            return 0;
        harness_sleep_ms(100);
    }
    /* why: every running node's view, and the end of its log */
    for (int i = 0; i < cl->n; i++) {
        char out[4096], cmd[400];
        if (cl->node[i].pid <= 0)
            continue;
        query(cl, i, out, sizeof(out), "CLUSTER NODES", NULL);
        fprintf(stderr, "harness: node %d (port %d) sees:\n%s\n", i, cl->node[i].port, out);
        snprintf(cmd, sizeof(cmd), "tail -n 15 '%s/redis.log' >&2", cl->node[i].dir);
        if (system(cmd) != 0)
            fprintf(stderr, "harness: no log in %s\n", cl->node[i].dir);
    }
    return -1;
}

int harness_cluster_migrate(const harness_cluster_t *cl, const char *key, int to, int pause_ms)
{
    int from = harness_cluster_owner(cl, key);
    char out[8192], src_id[41], dst_id[41];
    if (from < 0 || from == to || harness_cluster_node_id(cl, from, src_id) != 0 ||
        harness_cluster_node_id(cl, to, dst_id) != 0)
        return -1;
    query(cl, from, out, sizeof(out), "CLUSTER KEYSLOT %s", key);
    int slot = atoi(out);
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "CLUSTER SETSLOT %d IMPORTING %s", slot, src_id);
    query(cl, to, out, sizeof(out), cmd, NULL);
    if (strcmp(out, "OK") != 0)
        return -1;
    snprintf(cmd, sizeof(cmd), "CLUSTER SETSLOT %d MIGRATING %s", slot, dst_id);
    query(cl, from, out, sizeof(out), cmd, NULL);
    if (strcmp(out, "OK") != 0)
        return -1;
    for (int rounds = 0; rounds < 10000; rounds++) {
        snprintf(cmd, sizeof(cmd), "CLUSTER GETKEYSINSLOT %d 1", slot);
        query(cl, from, out, sizeof(out), cmd, NULL);
        if (out[0] == '\0')
            break; /* no key left on the source */
        char migrate[300], res[256];
        snprintf(migrate, sizeof(migrate), "MIGRATE 127.0.0.1 %d %%s 0 5000", cl->node[to].port);
        query(cl, from, res, sizeof(res), migrate, out);
        if (strcmp(res, "OK") != 0 && strcmp(res, "NOKEY") != 0) {
            fprintf(stderr, "harness: MIGRATE %s: %s\n", out, res);
            return -1;
        }
        harness_sleep_ms(pause_ms);
    }
    snprintf(cmd, sizeof(cmd), "CLUSTER SETSLOT %d NODE %s", slot, dst_id);
    query(cl, to, out, sizeof(out), cmd, NULL);
    query(cl, from, out, sizeof(out), cmd, NULL);
    for (int i = 0; i < cl->n; i++) {
        if (i != to && i != from)
            query(cl, i, out, sizeof(out), cmd, NULL);
    }
    return harness_cluster_owner(cl, key) == to ? 0 : -1;
}

int harness_cluster_other_master(const harness_cluster_t *cl, int not_node)
{
    for (int i = 0; i < cl->n; i++) {
        char role[64];
        if (i != not_node && cl->node[i].pid > 0 &&
            harness_redis_query(&cl->node[i], role, sizeof(role), "ROLE") == 0 &&
            strncmp(role, "master", 6) == 0)
            return i;
    }
    return -1;
}

int harness_cluster_revive(harness_cluster_t *cl, int node, const char *key)
{
    if (harness_redis_restart(&cl->node[node]) != 0 || harness_cluster_wait_ok(cl, key, 30000) != 0)
        return -1;
    for (int waited = 0; waited < 30000; waited += 100) {
        char out[4096];
        if (harness_redis_query(&cl->node[node], out, sizeof(out), "INFO replication") == 0 &&
            strstr(out, "role:slave") != NULL && strstr(out, "master_link_status:up") != NULL)
            return 0;
        harness_sleep_ms(100);
    }
    fprintf(stderr, "harness: node %d did not rejoin as a replica\n", node);
    return -1;
}
