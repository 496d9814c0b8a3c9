/*
 * quarantine.c - the positions trainers found poisonous (docs/design.md
 * "Poison in a batch"): a sample whose own loss or gradient was not finite
 * is dropped by its worker and its position added here, so that a re-read
 * of its partition (a rollback, a replay, the gap rule) rejects the record
 * instead of learning it under other weights.
 *
 * One set per model, freshet:{m}:quarantine, of "topic/partition/offset"
 * members: SADD is atomic and idempotent, so workers of several processes
 * add to it without coordination. It is bounded (PS_QUARANTINE_MAX
 * members): poison is rare, and a stream where it is not is better stopped
 * by the divergence guard than remembered here.
 *
 * Threads: as the connection or client they are given.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/store/store_int.h"

#define PS_QUARANTINE_MAX 100000
/* a member's room: "topic/partition/offset" */
#define MEMBER_MAX (PSSTORE_TOPIC_MAX + 48)

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

fr_err_t psstore_quarantine_add(psstore_conn_t *c, const char *model, const psstore_range_t *pos,
                                size_t n)
{
    if (c == NULL || model == NULL || (pos == NULL && n > 0))
        return FR_ERR_INVAL;
    size_t members = 0;
    for (size_t i = 0; i < n; i++) {
        if (pos[i].topic == NULL || pos[i].to < pos[i].from || pos[i].from < 0)
            return FR_ERR_INVAL;
        if (pos[i].to - pos[i].from > PS_QUARANTINE_MAX - (int64_t)members)
            return ps_fail(c, FR_ERR_RANGE, "quarantine: over %d positions at once",
                           PS_QUARANTINE_MAX);
        members += (size_t)(pos[i].to - pos[i].from);
    }
    if (members == 0)
        return FR_OK;
    char key[PS_KEY_MAX];
    ps_key(key, model, "quarantine");
    fr_err_t err;
    redisReply *r = ps_cmd(c, 1, &err, "SCARD %s", key);
    if (r == NULL)
        return err;
    long long have = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    freeReplyObject(r);
    if (have + (long long)members > PS_QUARANTINE_MAX)
        return ps_fail(c, FR_ERR_RANGE, "the quarantine of model '%s' is full (%lld positions)",
                       model, have);
    /* one SADD of every member: argv, then the members' text */
    const char **argv = malloc((members + 2) * sizeof(*argv));
    size_t *lens = malloc((members + 2) * sizeof(*lens));
    char *text = malloc(members * MEMBER_MAX);
    if (argv == NULL || lens == NULL || text == NULL) {
        free(argv);
        free(lens);
        free(text);
        return ps_fail(c, FR_ERR_NOMEM, "out of memory quarantining %zu positions", members);
    }
    argv[0] = "SADD";
    argv[1] = key;
    size_t k = 2;
    for (size_t i = 0; i < n; i++)
        for (int64_t off = pos[i].from; off < pos[i].to; off++, k++) {
            char *m = text + (k - 2) * MEMBER_MAX;
            int len = snprintf(m, MEMBER_MAX, "%s/%" PRId32 "/%" PRId64, pos[i].topic,
                               pos[i].partition, off);
            argv[k] = m;
            lens[k] = len < MEMBER_MAX ? (size_t)len : MEMBER_MAX - 1;
        }
    lens[0] = 4;
    lens[1] = strlen(key);
    r = ps_cmd_argv(c, 1, (int)k, argv, lens, &err);
    freeReplyObject(r);
    free(argv);
    free(lens);
    free(text);
    return r == NULL ? err : FR_OK;
}

fr_err_t psstore_quarantine_read(psstore_conn_t *c, const char *model, const char *topic,
                                 int32_t partition, int64_t from, int64_t **offsets, size_t *n)
{
    *offsets = NULL;
    *n = 0;
    if (strlen(topic) > PSSTORE_TOPIC_MAX)
        return ps_fail(c, FR_ERR_INVAL, "quarantine: topic name too long");
    char key[PS_KEY_MAX], prefix[MEMBER_MAX], pattern[MEMBER_MAX + 1];
    ps_key(key, model, "quarantine");
    int plen = snprintf(prefix, sizeof(prefix), "%s/%" PRId32 "/", topic, partition);
    snprintf(pattern, sizeof(pattern), "%s*", prefix); /* topic names hold no glob characters */
    int64_t *out = NULL;
    size_t k = 0, cap = 0;
    char cursor[32] = "0";
    fr_err_t err = FR_OK;
    do {
        const char *argv[] = {"SSCAN", key, cursor, "MATCH", pattern, "COUNT", "1000"};
        redisReply *r = ps_cmd_argv(c, 1, 7, argv, NULL, &err);
        if (r == NULL)
            break;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(r);
            err = ps_fail(c, FR_ERR_REDIS, "redis: SSCAN %s: unexpected reply", key);
            break;
        }
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
        const redisReply *page = r->element[1];
        for (size_t i = 0; i < page->elements && err == FR_OK; i++) {
            const redisReply *e = page->element[i];
            if (e->type != REDIS_REPLY_STRING || e->len <= (size_t)plen ||
                memcmp(e->str, prefix, (size_t)plen) != 0)
                continue;
            char *end;
            long long off = strtoll(e->str + plen, &end, 10);
            if (end == e->str + plen || *end != '\0' || off < from)
                continue; /* not a position, or below the start: nothing to reject */
            if (FR_GROW(out, cap, k + 1) != FR_OK) {
                err = ps_fail(c, FR_ERR_NOMEM, "out of memory reading %s", key);
                break;
            }
            out[k++] = off;
        }
        freeReplyObject(r);
    } while (err == FR_OK && strcmp(cursor, "0") != 0);
    if (err != FR_OK || k == 0) {
        free(out);
        return err;
    }
    qsort(out, k, sizeof(*out), cmp_i64);
    *offsets = out;
    *n = k;
    return FR_OK;
}
