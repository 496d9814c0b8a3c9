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
 * a read), parsed into po (offsets_take).
 */
static fr_err_t offsets_one(psstore_conn_t *c, const char *model, const char *topic,
                            int32_t partition, psstore_partition_offsets_t *po, int *found);

/*
 * One partition's value in an offsets hash (the reply v to cmd of key
 * holding field) into po: *found = 1 and po replaced for a string, *found
 * = 0 and po untouched for nil. A value that does not parse is
 * FR_ERR_PARSE naming the partition: the store is the source of truth and
 * guessing would skip or repeat records.
 */
static fr_err_t offsets_take(psstore_conn_t *c, const char *model, const char *cmd, const char *key,
                             const char *field, const redisReply *v,
                             psstore_partition_offsets_t *po, int *found)
{
    char ep[300], why[256];
    fr_err_t err = FR_OK;
    *found = 0;
    if (v->type == REDIS_REPLY_STRING) {
        err = psstore_poff_parse(po, v->str, v->len, why, sizeof(why));
        if (err != FR_OK) {
            ps_endpoint(c, ep, sizeof(ep));
            ps_fail(c, err, "redis %s: model '%s', %s: %s", ep, model, field, why);
        } else {
            *found = 1;
        }
    } else if (v->type != REDIS_REPLY_NIL) {
        ps_endpoint(c, ep, sizeof(ep));
        err = ps_fail(c, FR_ERR_REDIS, "redis %s: unexpected reply to %s %s", ep, cmd, key);
    }
    return err;
}

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
 * shard that never saw the partition has applied nothing of it; found
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
 *
 * shard_fold_t gathers that over the shards of one partition, which are
 * folded in in order (shard 0 first): the one reading partition by
 * partition and the one reading many at once share it.
 */
typedef struct shard_fold {
    int k;              /* shards folded in so far                */
    int found;          /* some shard saw the partition           */
    int differ;         /* two shards applied different positions */
    int64_t generation; /* the oldest so far                      */
    int64_t top;        /* the end of the furthest so far         */
} shard_fold_t;

static void fold_init(shard_fold_t *f)
{
    *f = (shard_fold_t){.generation = INT64_MAX};
}

/* Folds shard f->k's offsets sh (*sh then holds what the caller frees). */
static void fold_shard(shard_fold_t *f, psstore_partition_offsets_t *po,
                       psstore_partition_offsets_t *sh, int found)
{
    f->generation = sh->generation < f->generation ? sh->generation : f->generation;
    if (f->k > 0 && !poff_same_positions(sh, po))
        f->differ = 1;
    if (poff_end(sh) > f->top)
        f->top = poff_end(sh);
    if (f->k == 0 || sh->watermark < po->watermark) {
        psstore_partition_offsets_t keep = *po; /* the lowest so far: swap in sh */
        *po = *sh;
        *sh = keep;
    }
    f->found |= found;
    f->k++;
}

static void fold_end(const shard_fold_t *f, psstore_partition_offsets_t *po, int *found)
{
    po->generation = f->generation; /* a rewrite some shard lacks is sent again */
    po->alone_to = f->differ ? f->top : 0;
    *found = f->found;
}

/* The model name, the topic and partitions[n] as the offsets reads take
 * them. */
static fr_err_t offsets_args(psstore_conn_t *c, const char *model, const char *topic,
                             const int32_t *partitions, size_t n)
{
    fr_err_t err;
    if ((err = ps_check_name(c, model)) != FR_OK)
        return err;
    if (topic == NULL || topic[0] == '\0' || strlen(topic) > 249)
        return ps_fail(c, FR_ERR_INVAL, "psstore: bad topic or partition");
    for (size_t i = 0; i < n; i++)
        if (partitions[i] < 0)
            return ps_fail(c, FR_ERR_INVAL, "psstore: bad topic or partition");
    return FR_OK;
}

/* The model's shard count, then each shard's field: a round trip each. */
fr_err_t psstore_offsets_read(psstore_conn_t *c, const char *model, const char *topic,
                              int32_t partition, psstore_partition_offsets_t *po, int *found)
{
    fr_err_t err;
    if ((err = offsets_args(c, model, topic, &partition, 1)) != FR_OK)
        return err;
    int S = 1;
    if ((err = ps_model_shards(c, model, &S)) != FR_OK)
        return err;
    if (S == 1)
        return offsets_one(c, model, topic, partition, po, found);
    *found = 0;
    shard_fold_t f;
    fold_init(&f);
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX];
        int fk = 0;
        psstore_partition_offsets_t sh;
        psstore_poff_init(&sh, 0);
        ps_shard_tag(tag, model, k, S);
        err = offsets_one(c, tag, topic, partition, &sh, &fk);
        if (err == FR_OK)
            fold_shard(&f, po, &sh, fk);
        psstore_poff_fini(&sh);
        if (err != FR_OK)
            return err;
    }
    fold_end(&f, po, found);
    return FR_OK;
}

static fr_err_t offsets_one(psstore_conn_t *c, const char *model, const char *topic,
                            int32_t partition, psstore_partition_offsets_t *po, int *found)
{
    fr_err_t err;
    char key[PS_KEY_MAX], field[PSSTORE_KEY_MAX];
    ps_key(key, model, "offsets");
    psstore_key_format(field, sizeof(field), topic, partition);
    *found = 0;
    redisReply *r = ps_cmd(c, 1, &err, "HGET %s %s", key, field);
    if (r == NULL)
        return err;
    err = offsets_take(c, model, "HGET", key, field, r, po, found);
    freeReplyObject(r);
    return err;
}

/* ------------------------------------------------------------------------
 * Many partitions at once (the consumer's store tick): the shard count,
 * then one HMGET of every partition's field a shard, whatever the number
 * of partitions (up to FIELDS_CHUNK of them a command).
 * ---------------------------------------------------------------------- */
#define FIELDS_CHUNK 512 /* fields per HMGET */

/* A read of n partitions: the fields, the commands' arguments (refilled
 * for each command: hiredis copies them) and the replies. Command j is
 * shard j / chunks's HMGET of the fields [at, at + len) of chunk j %
 * chunks (many_argv). */
typedef struct many {
    const char *model;
    int S;                           /* shards                     */
    size_t n, chunks;                /* chunks: commands a shard   */
    char (*fields)[PSSTORE_KEY_MAX]; /* [n] "topic/partition"      */
    size_t *flens;                   /* [n]                        */
    const char **argv;               /* [2 + min(n, FIELDS_CHUNK)] */
    size_t *lens;                    /* [2 + min(n, FIELDS_CHUNK)] */
    redisReply **rs;                 /* [S * chunks]               */
} many_t;

/* Fills m->argv and m->lens with command j, its shard's tag in tag and
 * key in key; its first field's index in *at; its argc. */
static int many_argv(many_t *m, size_t j, char *tag, char *key, size_t *at)
{
    size_t len;
    ps_shard_tag(tag, m->model, (int)(j / m->chunks), m->S);
    ps_key(key, tag, "offsets");
    *at = (j % m->chunks) * FIELDS_CHUNK;
    len = m->n - *at < FIELDS_CHUNK ? m->n - *at : FIELDS_CHUNK;
    FR_ASSERT(*at < m->n && j < (size_t)m->S * m->chunks);
    m->argv[0] = "HMGET";
    m->lens[0] = 5;
    m->argv[1] = key;
    m->lens[1] = strlen(key);
    for (size_t i = 0; i < len; i++) {
        m->argv[2 + i] = m->fields[*at + i];
        m->lens[2 + i] = m->flens[*at + i];
    }
    return (int)len + 2;
}

/* Reads the replies of q pipelined commands into rs[q] (NULL where one
 * failed, and after a broken connection). FR_OK or the first error, whose
 * message is left in c->errstr; every reply is read even after an error
 * reply, so the connection stays in step. */
static fr_err_t many_replies(psstore_conn_t *c, redisReply **rs, size_t q)
{
    char first_msg[sizeof(c->errstr)];
    fr_err_t first = FR_OK;
    for (size_t j = 0; j < q; j++) {
        fr_err_t e;
        if ((rs[j] = ps_pipeline_read(c, &e)) != NULL)
            continue;
        if (first == FR_OK) {
            first = e;
            memcpy(first_msg, c->errstr, sizeof(first_msg));
        }
        if (c->ctx == NULL)
            break; /* the connection broke: no more replies will come */
    }
    if (first != FR_OK)
        memcpy(c->errstr, first_msg, sizeof(c->errstr));
    return first;
}

static void many_drop_replies(many_t *m)
{
    for (size_t j = 0; j < (size_t)m->S * m->chunks; j++) {
        freeReplyObject(m->rs[j]);
        m->rs[j] = NULL;
    }
}

/*
 * Runs the S * chunks HMGETs into m->rs. To a single Redis they go in one
 * pipeline, one round trip, run again once when the connection broke on
 * the way (they only read). A Redis Cluster keeps a pipeline on one node
 * and the shards' keys may live on several, so there each command goes on
 * its own (following MOVED and ASK, retried as ps_cmd_argv does): a round
 * trip a shard. FR_OK or the first error, its message in c->errstr.
 */
static fr_err_t many_run(psstore_conn_t *c, many_t *m)
{
    size_t q = (size_t)m->S * m->chunks, at;
    char tag[PS_TAG_MAX], key[PS_KEY_MAX];
    fr_err_t err = FR_OK;
    if (c->cl != NULL) {
        for (size_t j = 0; j < q && err == FR_OK; j++) {
            int argc = many_argv(m, j, tag, key, &at);
            m->rs[j] = ps_cmd_argv(c, 1, argc, m->argv, m->lens, &err);
        }
        return err;
    }
    for (int attempt = 0;; attempt++) {
        err = FR_OK;
        for (size_t j = 0; j < q && err == FR_OK; j++) {
            int argc = many_argv(m, j, tag, key, &at);
            err = ps_pipeline_append(c, argc, m->argv, m->lens);
        }
        if (err != FR_OK) {
            ps_pipeline_discard(c);
            return err;
        }
        err = many_replies(c, m->rs, q);
        if (err == FR_OK || c->ctx != NULL || attempt == 1)
            return err;
        many_drop_replies(m);
    }
}

/*
 * The replies into po[n] and found[n], each as psstore_offsets_read gives
 * it: the replies come shard after shard, so each partition's shards are
 * folded in in order. FR_OK, FR_ERR_PARSE (a value that does not parse),
 * FR_ERR_REDIS (a reply of the wrong shape) or FR_ERR_NOMEM.
 */
static fr_err_t many_take(psstore_conn_t *c, many_t *m, psstore_partition_offsets_t *po, int *found)
{
    shard_fold_t *folds = NULL;
    if (m->S > 1 && (folds = malloc(m->n * sizeof(*folds))) == NULL)
        return ps_fail(c, FR_ERR_NOMEM, "psstore: out of memory");
    for (size_t i = 0; folds != NULL && i < m->n; i++)
        fold_init(&folds[i]);
    fr_err_t err = FR_OK;
    for (size_t j = 0; j < (size_t)m->S * m->chunks && err == FR_OK; j++) {
        char tag[PS_TAG_MAX], key[PS_KEY_MAX], ep[300];
        size_t at, len = (size_t)many_argv(m, j, tag, key, &at) - 2;
        const redisReply *r = m->rs[j];
        if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != len) {
            ps_endpoint(c, ep, sizeof(ep));
            err = ps_fail(c, FR_ERR_REDIS, "redis %s: unexpected reply to HMGET %s", ep, key);
        }
        for (size_t e = 0; e < len && err == FR_OK; e++) {
            size_t i = at + e;
            if (folds == NULL) {
                err = offsets_take(c, m->model, "HMGET", key, m->fields[i], r->element[e], &po[i],
                                   &found[i]);
                continue;
            }
            int fk = 0;
            psstore_partition_offsets_t sh;
            psstore_poff_init(&sh, 0);
            err = offsets_take(c, tag, "HMGET", key, m->fields[i], r->element[e], &sh, &fk);
            if (err == FR_OK)
                fold_shard(&folds[i], &po[i], &sh, fk);
            psstore_poff_fini(&sh);
        }
    }
    for (size_t i = 0; folds != NULL && err == FR_OK && i < m->n; i++) {
        FR_ASSERT(folds[i].k == m->S);
        fold_end(&folds[i], &po[i], &found[i]);
    }
    free(folds);
    return err;
}

fr_err_t psstore_offsets_read_many(psstore_conn_t *c, const char *model, const char *topic,
                                   const int32_t *partitions, size_t n,
                                   psstore_partition_offsets_t *po, int *found)
{
    fr_err_t err;
    if ((err = offsets_args(c, model, topic, partitions, n)) != FR_OK)
        return err;
    for (size_t i = 0; i < n; i++)
        found[i] = 0;
    if (n == 0)
        return FR_OK;
    int S = 1;
    if ((err = ps_model_shards(c, model, &S)) != FR_OK)
        return err;
    many_t m = {.model = model, .S = S, .n = n, .chunks = (n + FIELDS_CHUNK - 1) / FIELDS_CHUNK};
    size_t width = 2 + (n < FIELDS_CHUNK ? n : FIELDS_CHUNK);
    m.fields = malloc(n * sizeof(*m.fields));
    m.flens = malloc(n * sizeof(*m.flens));
    m.argv = malloc(width * sizeof(*m.argv));
    m.lens = malloc(width * sizeof(*m.lens));
    m.rs = calloc((size_t)S * m.chunks, sizeof(*m.rs));
    if (m.fields == NULL || m.flens == NULL || m.argv == NULL || m.lens == NULL || m.rs == NULL) {
        err = ps_fail(c, FR_ERR_NOMEM, "psstore: out of memory");
    } else {
        for (size_t i = 0; i < n; i++)
            m.flens[i] =
                (size_t)psstore_key_format(m.fields[i], sizeof(m.fields[i]), topic, partitions[i]);
        if ((err = many_run(c, &m)) == FR_OK)
            err = many_take(c, &m, po, found);
        many_drop_replies(&m);
    }
    free(m.fields);
    free(m.flens);
    free(m.argv);
    free(m.lens);
    free(m.rs);
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
