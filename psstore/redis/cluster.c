/*
 * cluster.c - what the parameter store knows of a Redis Cluster: the slot
 * of a key (CRC16 of its hash tag), the key of a command, the slot map
 * read from CLUSTER SLOTS and the redirections MOVED and ASK. conn.c routes
 * commands with it; docs/design.md "Redis Cluster" says how.
 *
 * hiredis 0.14 has no cluster support and Debian packages no cluster
 * client, so this is ours, and small: freshet's keys of one model (of one
 * shard) share a hash tag, so a transaction never spans slots, and a
 * command's key is the first argument that starts with "freshet:".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "psstore/redis/redis_int.h"

/* The key prefix of every freshet key (keys.c). */
#define KEY_PREFIX     "freshet:"
#define KEY_PREFIX_LEN 8

/*
 * CRC16-CCITT as Redis Cluster uses it (XMODEM: polynomial 0x1021, initial
 * value 0, no reflection; "123456789" gives 0x31c3), bit by bit: keys are
 * short and a table would be the only state of this file.
 */
static uint16_t crc16(const unsigned char *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

uint16_t psstore_crc16(const void *p, size_t n)
{
    return crc16(p, n);
}

/* The slot of a key: only the text between the first '{' and the first '}'
 * after it counts, when that text is not empty (Redis Cluster's hash tag). */
int psstore_key_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open != NULL) {
        size_t from = (size_t)(open - key) + 1;
        const char *close = memchr(open + 1, '}', len - from);
        if (close != NULL && close > open + 1)
            return crc16((const unsigned char *)open + 1, (size_t)(close - open - 1)) &
                   (PS_SLOTS - 1);
    }
    return crc16((const unsigned char *)key, len) & (PS_SLOTS - 1);
}

/* SCAN's MATCH pattern starts with "freshet:" but is no key: SCAN is sent
 * to the node its caller chose. */
static int keyless(const char *name, size_t len)
{
    return len == 4 && strncasecmp(name, "SCAN", 4) == 0;
}

int ps_argv_slot(int argc, const char **argv, const size_t *lens)
{
    if (argc < 2 || keyless(argv[0], lens ? lens[0] : strlen(argv[0])))
        return -1;
    for (int i = 1; i < argc; i++) {
        size_t n = lens ? lens[i] : strlen(argv[i]);
        if (n > KEY_PREFIX_LEN && memcmp(argv[i], KEY_PREFIX, KEY_PREFIX_LEN) == 0)
            return psstore_key_slot(argv[i], n);
    }
    return -1;
}

/* Reads "<c><decimal>\r\n" at *p (before end) into *v; 0 or -1. */
static int resp_number(const char **p, const char *end, char c, size_t *v)
{
    const char *s = *p;
    if (s >= end || *s != c)
        return -1;
    size_t x = 0;
    for (s++; s < end && *s >= '0' && *s <= '9'; s++)
        x = x * 10 + (size_t)(*s - '0');
    if (end - s < 2 || s[0] != '\r' || s[1] != '\n')
        return -1;
    *p = s + 2;
    *v = x;
    return 0;
}

int ps_resp_slot(const char *cmd, size_t len)
{
    const char *p = cmd, *end = cmd + len;
    size_t argc;
    if (resp_number(&p, end, '*', &argc) != 0)
        return -1;
    for (size_t i = 0; i < argc; i++) {
        size_t n;
        if (resp_number(&p, end, '$', &n) != 0 || (size_t)(end - p) < n + 2)
            return -1;
        if (i == 0 && keyless(p, n))
            return -1;
        if (i > 0 && n > KEY_PREFIX_LEN && memcmp(p, KEY_PREFIX, KEY_PREFIX_LEN) == 0)
            return psstore_key_slot(p, n);
        p += n + 2;
    }
    return -1;
}

/* ------------------------------------------------------------------------
 * Nodes and the slot map
 * ---------------------------------------------------------------------- */
ps_cluster_t *ps_cluster_new(void)
{
    ps_cluster_t *cl = calloc(1, sizeof(*cl));
    if (cl == NULL)
        return NULL;
    cl->slot_node = malloc(PS_SLOTS * sizeof(*cl->slot_node));
    if (cl->slot_node == NULL) {
        free(cl);
        return NULL;
    }
    for (int s = 0; s < PS_SLOTS; s++)
        cl->slot_node[s] = -1;
    cl->slot = -1;
    return cl;
}

void ps_cluster_free(ps_cluster_t *cl)
{
    if (cl == NULL)
        return;
    for (size_t i = 0; i < cl->nnodes; i++)
        redisFree(cl->nodes[i].ctx);
    free(cl->nodes);
    free(cl->slot_node);
    free(cl);
}

int ps_cluster_node(ps_cluster_t *cl, const char *host, size_t hostlen, int port)
{
    if (hostlen == 0 || hostlen >= sizeof(cl->nodes[0].host) || port <= 0 || port > 65535)
        return -1;
    for (size_t i = 0; i < cl->nnodes; i++) {
        if (cl->nodes[i].port == port && strlen(cl->nodes[i].host) == hostlen &&
            memcmp(cl->nodes[i].host, host, hostlen) == 0)
            return (int)i;
    }
    if (cl->nnodes == PS_NODES_MAX)
        return -1;
    if (FR_GROW(cl->nodes, cl->cap, cl->nnodes + 1) != FR_OK)
        return -1;
    ps_node_t *nd = &cl->nodes[cl->nnodes];
    memset(nd, 0, sizeof(*nd));
    memcpy(nd->host, host, hostlen);
    nd->port = port;
    return (int)cl->nnodes++;
}

/* slots_node's answer for a node whose address the cluster does not know */
#define UNKNOWN_ENDPOINT (-2)

/*
 * Reads one node of a CLUSTER SLOTS range: [endpoint, port, id, ...]. An
 * empty endpoint means the node that answered (asked_host); "?" or nil, an
 * endpoint the cluster does not know (cluster-preferred-endpoint-type):
 * UNKNOWN_ENDPOINT. -1 when it is no node entry.
 */
static int slots_node(ps_cluster_t *cl, const redisReply *e, const char *asked_host)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 ||
        e->element[1]->type != REDIS_REPLY_INTEGER)
        return -1;
    const redisReply *ip = e->element[0];
    if (ip->type == REDIS_REPLY_NIL ||
        (ip->type == REDIS_REPLY_STRING && ip->len == 1 && ip->str[0] == '?'))
        return UNKNOWN_ENDPOINT;
    if (ip->type != REDIS_REPLY_STRING)
        return -1;
    if (ip->len == 0)
        return ps_cluster_node(cl, asked_host, strlen(asked_host), (int)e->element[1]->integer);
    return ps_cluster_node(cl, ip->str, ip->len, (int)e->element[1]->integer);
}

int ps_cluster_load_slots(ps_cluster_t *cl, const redisReply *r, const char *asked_host)
{
    if (r->type != REDIS_REPLY_ARRAY)
        return -1;
    int16_t *map = malloc(PS_SLOTS * sizeof(*map));
    if (map == NULL)
        return -1;
    for (int s = 0; s < PS_SLOTS; s++)
        map[s] = -1;
    int covered = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *range = r->element[i];
        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
            range->element[0]->type != REDIS_REPLY_INTEGER ||
            range->element[1]->type != REDIS_REPLY_INTEGER) {
            free(map);
            return -1;
        }
        long long from = range->element[0]->integer, to = range->element[1]->integer;
        int node = slots_node(cl, range->element[2], asked_host);
        if (from < 0 || to >= PS_SLOTS || from > to || node == -1) {
            free(map);
            return -1;
        }
        if (node == UNKNOWN_ENDPOINT)
            continue; /* its slots stay without a node: routing to them fails */
        for (long long s = from; s <= to; s++)
            map[s] = (int16_t)node;
        covered += (int)(to - from + 1);
    }
    memcpy(cl->slot_node, map, PS_SLOTS * sizeof(*map));
    free(map);
    cl->stale = 0;
    return covered;
}

int ps_cluster_redirect(const char *msg, size_t len, int *ask, int *slot, char *host,
                        size_t hostsize, int *port)
{
    char buf[320];
    if (len >= sizeof(buf))
        return -1;
    memcpy(buf, msg, len);
    buf[len] = '\0';
    char *p;
    if (strncmp(buf, "MOVED ", 6) == 0) {
        *ask = 0;
        p = buf + 6;
    } else if (strncmp(buf, "ASK ", 4) == 0) {
        *ask = 1;
        p = buf + 4;
    } else {
        return -1;
    }
    char *end;
    long s = strtol(p, &end, 10);
    if (end == p || *end != ' ' || s < 0 || s >= PS_SLOTS)
        return -1;
    p = end + 1;
    char *colon = strrchr(p, ':'); /* an IPv6 address holds colons too */
    if (colon == NULL || (size_t)(colon - p) >= hostsize)
        return -1;
    long pt = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end != '\0' || pt <= 0 || pt > 65535)
        return -1;
    memcpy(host, p, (size_t)(colon - p));
    host[colon - p] = '\0';
    *slot = (int)s;
    *port = (int)pt;
    return 0;
}

int ps_cluster_masters(const ps_cluster_t *cl, int *out, int max)
{
    int n = 0;
    for (size_t i = 0; i < cl->nnodes && n < max; i++) {
        for (int s = 0; s < PS_SLOTS; s++) {
            if (cl->slot_node[s] == (int)i) {
                out[n++] = (int)i;
                break;
            }
        }
    }
    return n;
}
