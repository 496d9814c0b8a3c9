/*
 * offsets_read.c - the offsets the store keeps of each partition, read for
 * ingest (docs/design.md "Offsets"): where a partition starts and which
 * intervals above it to skip; for a sharded model, the shard with the
 * lowest watermark and where the shards differ. The interval arithmetic is
 * psstore/positions/.
 *
 * Threads: as the connection they are given (one thread at a time).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/store/store_int.h"

/*
 * HGET offsets "<topic>/<partition>" (retried once on a broken connection:
 * a read), parsed into po. A value that does not parse is FR_ERR_PARSE
 * naming the partition: the store is the source of truth and guessing
 * would skip or repeat records.
 */
static fr_err_t offsets_one(psstore_conn_t *c, const char *model, const char *topic,
                            int32_t partition, psstore_partition_offsets_t *po, int *found);

/* The position after the last one po applied. */
static int64_t poff_end(const psstore_partition_offsets_t *po)
{
    return po->nspans > 0 ? po->spans[po->nspans - 1].to : po->watermark;
}

/* Nonzero when a and b applied the same positions. */
static int poff_same_positions(const psstore_partition_offsets_t *a,
                               const psstore_partition_offsets_t *b)
{
    if (a->watermark != b->watermark || a->nspans != b->nspans)
        return 0;
    for (size_t i = 0; i < a->nspans; i++)
        if (a->spans[i].from != b->spans[i].from || a->spans[i].to != b->spans[i].to)
            return 0;
    return 1;
}
/*
 * A sharded model (docs/design.md "Shards"): a position counts as applied
 * when every shard applied it, so a partition starts at the lowest
 * watermark over the shards, and the intervals to skip above it are those
 * of the shard with that watermark (the first such shard): a batch read
 * again is then made only of positions that shard lacks, so that shard
 * applies it whatever the others hold, and every re-read makes progress.
 * (Skipping what every shard applied instead would let a batch overlap
 * each shard's applied positions in part, and every shard drop it.) A
 * shard that never saw the partition has applied nothing of it; *found
 * when any shard saw it. The generation is the oldest of the shards': a
 * replay's rewrite that some shard has not executed (a request that
 * reached only some shards, a write lost in a fail-over) is then sent
 * again by its consumer, and the shards that have it ignore it; meanwhile
 * they drop the batches of the older generation, read again once every
 * shard is at the newer one. Where the shards applied different positions,
 * po->alone_to is the end of the furthest: each partition's re-read then
 * skips another shard's intervals, so a batch mixing two partitions could
 * hold positions that every shard applied in part (the consumer batches
 * them apart, ingest_batcher_alone).
 */
fr_err_t psstore_offsets_read(psstore_conn_t *c, const char *model, const char *topic,
                              int32_t partition, psstore_partition_offsets_t *po, int *found)
{
    fr_err_t err;
    if ((err = ps_check_name(c, model)) != FR_OK)
        return err;
    if (topic == NULL || topic[0] == '\0' || strlen(topic) > 249 || partition < 0)
        return ps_fail(c, FR_ERR_INVAL, "psstore: bad topic or partition");
    int S = 1;
    if ((err = ps_model_shards(c, model, &S)) != FR_OK)
        return err;
    if (S == 1)
        return offsets_one(c, model, topic, partition, po, found);
    *found = 0;
    int64_t generation = INT64_MAX, top = 0;
    int differ = 0;
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX];
        int f = 0;
        psstore_partition_offsets_t sh;
        psstore_poff_init(&sh, 0);
        ps_shard_tag(tag, model, k, S);
        err = offsets_one(c, tag, topic, partition, &sh, &f);
        generation = sh.generation < generation ? sh.generation : generation;
        if (err == FR_OK && k > 0 && !poff_same_positions(&sh, po))
            differ = 1;
        if (err == FR_OK && poff_end(&sh) > top)
            top = poff_end(&sh);
        if (err == FR_OK && (k == 0 || sh.watermark < po->watermark)) {
            psstore_partition_offsets_t keep = *po; /* the lowest so far: swap in sh */
            *po = sh;
            sh = keep;
        }
        psstore_poff_fini(&sh);
        if (err != FR_OK)
            return err;
        *found |= f;
    }
    po->generation = generation; /* a rewrite some shard lacks is sent again */
    po->alone_to = differ ? top : 0;
    return FR_OK;
}

static fr_err_t offsets_one(psstore_conn_t *c, const char *model, const char *topic,
                            int32_t partition, psstore_partition_offsets_t *po, int *found)
{
    fr_err_t err;
    char ep[300], key[PS_KEY_MAX], field[PSSTORE_KEY_MAX], why[256];
    ps_endpoint(c, ep, sizeof(ep));
    ps_key(key, model, "offsets");
    psstore_key_format(field, sizeof(field), topic, partition);
    *found = 0;
    redisReply *r = ps_cmd(c, 1, &err, "HGET %s %s", key, field);
    if (r == NULL)
        return err;
    if (r->type == REDIS_REPLY_STRING) {
        err = psstore_poff_parse(po, r->str, r->len, why, sizeof(why));
        if (err != FR_OK)
            ps_fail(c, err, "redis %s: model '%s', %s: %s", ep, model, field, why);
        else
            *found = 1;
    } else if (r->type != REDIS_REPLY_NIL) {
        err = ps_fail(c, FR_ERR_REDIS, "redis %s: unexpected reply to HGET %s", ep, key);
    }
    freeReplyObject(r);
    return err;
}

/* Orders "topic/partition" keys by topic, then partition number. */
static int offsets_key_cmp(const void *a, const void *b)
{
    return psstore_key_cmp(*(const char *const *)a, *(const char *const *)b);
}

static fr_err_t offsets_keys_one(psstore_conn_t *c, const char *model, char ***keys, size_t *n);

/* A sharded model: the union of its shards' partitions, sorted, once each. */
fr_err_t psstore_offsets_keys(psstore_conn_t *c, const char *model, char ***keys, size_t *n)
{
    fr_err_t err;
    *keys = NULL;
    *n = 0;
    if ((err = ps_check_name(c, model)) != FR_OK)
        return err;
    int S = 1;
    if ((err = ps_model_shards(c, model, &S)) != FR_OK)
        return err;
    if (S == 1)
        return offsets_keys_one(c, model, keys, n);
    char **all = NULL;
    size_t nall = 0;
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX], **part = NULL;
        size_t np = 0;
        ps_shard_tag(tag, model, k, S);
        if ((err = offsets_keys_one(c, tag, &part, &np)) != FR_OK)
            break;
        char **grown = realloc(all, (nall + np + 1) * sizeof(*all));
        if (grown == NULL) {
            for (size_t i = 0; i < np; i++)
                free(part[i]);
            free(part);
            err = ps_fail(c, FR_ERR_NOMEM, "psstore: out of memory");
            break;
        }
        all = grown;
        memcpy(all + nall, part, np * sizeof(*part));
        nall += np;
        free(part);
    }
    if (err != FR_OK) {
        for (size_t i = 0; i < nall; i++)
            free(all[i]);
        free(all);
        return err;
    }
    if (nall > 1)
        qsort(all, nall, sizeof(*all), offsets_key_cmp);
    size_t out = 0;
    for (size_t i = 0; i < nall; i++) {
        if (out > 0 && strcmp(all[out - 1], all[i]) == 0)
            free(all[i]);
        else
            all[out++] = all[i];
    }
    *keys = all;
    *n = out;
    return FR_OK;
}

static fr_err_t offsets_keys_one(psstore_conn_t *c, const char *model, char ***keys, size_t *n)
{
    fr_err_t err;
    char key[PS_KEY_MAX];
    *keys = NULL;
    *n = 0;
    ps_key(key, model, "offsets");
    redisReply *r = ps_cmd(c, 1, &err, "HKEYS %s", key);
    if (r == NULL)
        return err;
    size_t count = r->type == REDIS_REPLY_ARRAY ? r->elements : 0;
    char **out = count > 0 ? calloc(count, sizeof(*out)) : NULL;
    if (count > 0 && out == NULL) {
        freeReplyObject(r);
        return ps_fail(c, FR_ERR_NOMEM, "psstore: out of memory");
    }
    for (size_t i = 0; i < count; i++) {
        const redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_STRING || (out[*n] = strndup(e->str, e->len)) == NULL)
            continue;
        (*n)++;
    }
    freeReplyObject(r);
    qsort(out, *n, sizeof(*out), offsets_key_cmp);
    *keys = out;
    return FR_OK;
}
