/*
 * model_read.c - what readers see of a model (docs/design.md "Redis
 * layout"): its info, the list of models, and a consistent read of the
 * weights (served or training) with their epoch, version and watermarks,
 * each in one read-only transaction, never a torn mix of versions.
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
 * Parses a reply holding a decimal integer (a bulk string or an integer
 * reply). Returns 0, or -1 for nil, another type or trailing text.
 */
static int reply_int64(const redisReply *r, int64_t *v)
{
    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_INTEGER) {
        *v = r->integer;
        return 0;
    }
    if (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS)
        return -1;
    char *end;
    errno = 0;
    long long x = strtoll(r->str, &end, 10);
    if (errno != 0 || end == r->str || *end != '\0')
        return -1;
    *v = x;
    return 0;
}

/* As reply_int64 for an unsigned 64-bit decimal (the epoch). */
static int reply_uint64(const redisReply *r, uint64_t *v)
{
    if (r == NULL || r->type != REDIS_REPLY_STRING || r->str[0] < '0' || r->str[0] > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(r->str, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *v = x;
    return 0;
}

/* ------------------------------------------------------------------------
 * Reading
 * ---------------------------------------------------------------------- */

/*
 * Runs the read-only transaction "MULTI, cmds..., EXEC" and returns EXEC's
 * reply (an array of ncmds replies; caller frees) or NULL with err. Being
 * read-only it is run again once when the connection broke on the way.
 */
static redisReply *read_tx(psstore_conn_t *c, int ncmds, const int *argcs,
                           const char *const *const *argvs, fr_err_t *err)
{
    const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"};
    for (int attempt = 0; attempt < 2; attempt++) {
        size_t queued = 0;
        *err = ps_pipeline_append(c, 1, multi, NULL);
        for (int i = 0; *err == FR_OK && i < ncmds; i++)
            *err = ps_pipeline_append(c, argcs[i], (const char **)argvs[i], NULL);
        if (*err == FR_OK)
            *err = ps_pipeline_append(c, 1, exec, NULL);
        if (*err != FR_OK) {
            ps_pipeline_discard(c);
            return NULL;
        }
        queued = (size_t)ncmds + 2;
        redisReply *r = ps_pipeline_finish(c, queued, err);
        if (r != NULL && (r->type != REDIS_REPLY_ARRAY || r->elements != (size_t)ncmds)) {
            freeReplyObject(r);
            *err = ps_unexpected(c, "EXEC");
            return NULL;
        }
        if (r != NULL || c->ctx != NULL)
            return r;
    }
    return NULL;
}

void ps_reply_copy(char *buf, size_t size, const redisReply *r)
{
    size_t n = 0;
    if (r != NULL && r->type == REDIS_REPLY_STRING) {
        n = r->len < size - 1 ? r->len : size - 1;
        memcpy(buf, r->str, n);
    }
    buf[n] = '\0';
}

static int cmp_int64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Fills info from the fields of an HGETALL meta reply (field, value, ...). */
static void info_from_meta(psstore_model_info_t *info, const redisReply *meta)
{
    for (size_t i = 0; i + 1 < meta->elements; i += 2) {
        const redisReply *f = meta->element[i], *v = meta->element[i + 1];
        int64_t x;
        if (f->type != REDIS_REPLY_STRING)
            continue;
        if (strcmp(f->str, "layers") == 0)
            ps_reply_copy(info->layers, sizeof(info->layers), v);
        else if (strcmp(f->str, "loss") == 0)
            ps_reply_copy(info->loss, sizeof(info->loss), v);
        else if (strcmp(f->str, "sparse") == 0)
            ps_reply_copy(info->sparse, sizeof(info->sparse), v);
        else if (strcmp(f->str, "stopped") == 0)
            ps_reply_copy(info->stopped, sizeof(info->stopped), v);
        else if (strcmp(f->str, "mode") == 0)
            ps_reply_copy(info->mode, sizeof(info->mode), v);
        else if (strcmp(f->str, "phase") == 0)
            ps_reply_copy(info->phase, sizeof(info->phase), v);
        else if (strcmp(f->str, "mode_switches") == 0 && reply_int64(v, &x) == 0)
            info->mode_switches = x;
        else if (strcmp(f->str, "epoch") == 0)
            reply_uint64(v, &info->epoch);
        else if (strcmp(f->str, "shards") == 0 && reply_int64(v, &x) == 0 && x > 0 && x < 1 << 20)
            info->shards = (int)x;
        else if (strcmp(f->str, "created") == 0 && reply_int64(v, &x) == 0)
            info->created_ms = x;
    }
}

/*
 * Reads meta, ver, the size of w:0 and the newest 64 retained snapshots in
 * one transaction. snaps maps each version (member) to the unix ms it was
 * taken (score), so score order is version order; the versions are sorted
 * all the same. FR_ERR_NOTFOUND without meta.
 */
static fr_err_t info_one(psstore_conn_t *c, const char *name, psstore_model_info_t *info)
{
    fr_err_t err;
    char ep[300], meta[PS_KEY_MAX], ver[PS_KEY_MAX], wkey[PS_KEY_MAX], snaps[PS_KEY_MAX];
    ps_endpoint(c, ep, sizeof(ep));
    ps_key(meta, name, "meta");
    ps_key(ver, name, "ver");
    ps_key_shard(wkey, name, "w", 0);
    ps_key(snaps, name, "snaps");
    const char *hgetall[] = {"HGETALL", meta}, *get[] = {"GET", ver}, *strlen_[] = {"STRLEN", wkey};
    const char *zrange[] = {"ZRANGE", snaps, "-64", "-1"};
    const int argcs[] = {2, 2, 2, 4};
    const char *const *argvs[] = {hgetall, get, strlen_, zrange};
    redisReply *r = read_tx(c, 4, argcs, argvs, &err);
    if (r == NULL)
        return err;
    ps_endpoint(c, ep, sizeof(ep)); /* on a cluster, the model's master */
    const redisReply *m = r->element[0], *v = r->element[1], *len = r->element[2],
                     *sn = r->element[3];
    int64_t version = 0, bytes = 0;
    psstore_model_info_t probe = {.shards = 1};
    if (m->type == REDIS_REPLY_ARRAY)
        info_from_meta(&probe, m);
    if (m->type != REDIS_REPLY_ARRAY || m->elements == 0) {
        err = ps_fail(c, FR_ERR_NOTFOUND, "redis %s: no model '%s'", ep, name);
    } else if (probe.shards == 1 &&
               (reply_int64(v, &version) != 0 || reply_int64(len, &bytes) != 0)) {
        err = ps_fail(c, FR_ERR_PARSE, "redis %s: model '%s' has no valid ver", ep, name);
    } else {
        memset(info, 0, sizeof(*info));
        snprintf(info->name, sizeof(info->name), "%s", name);
        info->shards = 1;
        info_from_meta(info, m);
        info->version = version;
        info->bytes = (size_t)bytes;
        for (size_t i = 0; sn->type == REDIS_REPLY_ARRAY && i < sn->elements && i < 64; i++) {
            if (reply_int64(sn->element[i], &info->snaps[info->nsnaps]) == 0)
                info->nsnaps++;
        }
        qsort(info->snaps, info->nsnaps, sizeof(info->snaps[0]), cmp_int64);
        snprintf(info->node, sizeof(info->node), "%s", ep);
        info->slot = psstore_conn_is_cluster(c) ? psstore_key_slot(meta, strlen(meta)) : -1;
    }
    freeReplyObject(r);
    return err;
}

/*
 * A sharded model's info adds up its shards' (docs/design.md "Shards"):
 * the version and epoch are the sums of theirs (the version then changes
 * whenever a shard's does), bytes the whole vector's; the mode, phase and
 * snapshots are shard 0's (snapshots are coordinated: every shard takes
 * shard 0's), the guard's reason the first stopped shard's.
 */
fr_err_t psstore_model_info(psstore_conn_t *c, const char *name, psstore_model_info_t *info)
{
    fr_err_t err;
    if ((err = ps_check_name(c, name)) != FR_OK || (err = info_one(c, name, info)) != FR_OK)
        return err;
    info->shard_versions[0] = info->version;
    info->bounds[0] = 0;
    info->bounds[1] = info->bytes / sizeof(float);
    if (info->shards <= 1)
        return FR_OK;
    int S = 1;
    if ((err = ps_model_layout(c, name, &S, info->bounds)) != FR_OK)
        return err;
    info->shards = S;
    info->epoch = 0;
    info->version = 0;
    info->bytes = 0;
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX];
        psstore_model_info_t sh;
        ps_shard_tag(tag, name, k, S);
        if ((err = info_one(c, tag, &sh)) != FR_OK)
            return ps_fail(c, err, "model '%s', shard %d: %s", name, k, psstore_conn_error(c));
        info->epoch += sh.epoch;
        info->version += sh.version;
        info->shard_versions[k] = sh.version;
        info->bytes += sh.bytes;
        if (info->stopped[0] == '\0' && sh.stopped[0] != '\0')
            snprintf(info->stopped, sizeof(info->stopped), "shard %d: %.200s", k, sh.stopped);
        if (k == 0) {
            memcpy(info->mode, sh.mode, sizeof(info->mode));
            memcpy(info->phase, sh.phase, sizeof(info->phase));
            info->mode_switches = sh.mode_switches;
            info->nsnaps = sh.nsnaps;
            memcpy(info->snaps, sh.snaps, sizeof(info->snaps));
        }
    }
    return FR_OK;
}

/* Reads the weights, their epoch and version in one transaction (see
 * store.h); the only copy is from hiredis's reply into w. */
/* "topic/partition=watermark,..." of an HGETALL offsets reply (malloc'ed,
 * "" when empty); NULL when out of memory. */
static char *watermarks_text(const redisReply *o)
{
    size_t np = o->type == REDIS_REPLY_ARRAY ? o->elements / 2 : 0, len = 0;
    char *text = malloc(np * 300 + 1);
    if (text == NULL)
        return NULL;
    text[0] = '\0';
    for (size_t i = 0; i < np; i++) {
        const redisReply *k = o->element[2 * i], *val = o->element[2 * i + 1];
        psstore_partition_offsets_t po;
        psstore_poff_init(&po, 0);
        if (k->type == REDIS_REPLY_STRING && val->type == REDIS_REPLY_STRING && k->len < 270 &&
            psstore_poff_parse(&po, val->str, val->len, NULL, 0) == FR_OK)
            len += (size_t)snprintf(text + len, 300, "%s%.*s=%lld", len ? "," : "", (int)k->len,
                                    k->str, (long long)po.watermark);
        psstore_poff_fini(&po);
    }
    return text;
}

/* The served weights (or with training set the training weights), epoch
 * and version in one transaction; with offsets != NULL also the watermark
 * of every partition, as "topic/partition=watermark,...". */
static fr_err_t read_one(psstore_conn_t *c, const char *name, int training, float *w, size_t n,
                         uint64_t *epoch, int64_t *version, char **offsets)
{
    fr_err_t err;
    char ep[300], meta[PS_KEY_MAX], ver[PS_KEY_MAX], wkey[PS_KEY_MAX], avg[PS_KEY_MAX];
    char off[PS_KEY_MAX];
    if (offsets != NULL)
        *offsets = NULL;
    ps_endpoint(c, ep, sizeof(ep));
    ps_key(meta, name, "meta");
    ps_key(ver, name, "ver");
    ps_key_shard(wkey, name, "w", 0);
    ps_key_shard(avg, name, "avg", 0);
    ps_key(off, name, "offsets");
    /* the served weights: the average when the applier keeps one (and it
     * is as long as the weights), else the weights; one of them crosses */
    static const char served[] = "local a = redis.call('GET', KEYS[1]) "
                                 "if a and #a == redis.call('STRLEN', KEYS[2]) then return a end "
                                 "return redis.call('GET', KEYS[2])";
    const char *hget[] = {"HGET", meta, "epoch"}, *get_ver[] = {"GET", ver},
               *get_w[] = {"GET", wkey}, *get_served[] = {"EVAL", served, "2", avg, wkey},
               *get_off[] = {"HGETALL", off};
    const int argcs[] = {3, 2, training ? 2 : 5, 2};
    const char *const *argvs[] = {hget, get_ver, training ? get_w : get_served, get_off};
    redisReply *r = read_tx(c, offsets != NULL ? 4 : 3, argcs, argvs, &err);
    if (r == NULL)
        return err;
    const redisReply *e = r->element[0], *v = r->element[1], *wr = r->element[2];
    uint64_t ep64;
    int64_t version64;
    char *text = NULL;
    if (e->type == REDIS_REPLY_NIL || wr->type != REDIS_REPLY_STRING) {
        err = ps_fail(c, FR_ERR_NOTFOUND, "redis %s: no model '%s'", ep, name);
    } else if (reply_uint64(e, &ep64) != 0 || reply_int64(v, &version64) != 0) {
        err = ps_fail(c, FR_ERR_PARSE, "redis %s: model '%s' has a bad epoch or ver", ep, name);
    } else if (wr->len != n * sizeof(float)) {
        err = ps_fail(c, FR_ERR_RANGE,
                      "redis %s: model '%s' holds %zu bytes of weights, expected %zu (%zu floats)",
                      ep, name, wr->len, n * sizeof(float), n);
    } else if (offsets != NULL && (text = watermarks_text(r->element[3])) == NULL) {
        err = ps_fail(c, FR_ERR_NOMEM, "out of memory");
    } else {
        memcpy(w, wr->str, wr->len);
        if (epoch != NULL)
            *epoch = ep64;
        if (version != NULL)
            *version = version64;
        if (offsets != NULL)
            *offsets = text;
    }
    freeReplyObject(r);
    return err;
}

/* Folds one shard's "t/p=w,..." into *merged, the lowest watermark of each
 * partition over the shards so far (a partition a shard lacks counts 0:
 * none of its positions is applied on that shard). first: merged is the
 * first shard's list. NULL when out of memory (merged is then freed). */
static char *watermarks_min(char *merged, const char *shard, int first)
{
    if (first)
        return strdup(shard);
    size_t cap = strlen(merged) + strlen(shard) + 2, len = 0;
    char *out = malloc(cap * 2), *copy = strdup(merged);
    if (out == NULL || copy == NULL) {
        free(out);
        free(copy);
        free(merged);
        return NULL;
    }
    out[0] = '\0';
    /* every partition of merged: min with the shard's (0 when it lacks it) */
    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        char *eq = strrchr(tok, '=');
        if (eq == NULL)
            continue;
        long long wm = atoll(eq + 1), other = 0;
        size_t klen = (size_t)(eq - tok);
        for (const char *p = shard; *p != '\0';) {
            const char *end = strchr(p, ','), *peq = strchr(p, '=');
            if (end == NULL)
                end = p + strlen(p);
            if (peq != NULL && peq < end && (size_t)(peq - p) == klen && memcmp(p, tok, klen) == 0)
                other = atoll(peq + 1);
            p = *end ? end + 1 : end;
        }
        len += (size_t)snprintf(out + len, cap * 2 - len, "%s%.*s=%lld", len ? "," : "", (int)klen,
                                tok, wm < other ? wm : other);
    }
    /* partitions only the shard has: 0 on the others */
    for (const char *p = shard; *p != '\0';) {
        const char *end = strchr(p, ','), *peq = strchr(p, '=');
        if (end == NULL)
            end = p + strlen(p);
        if (peq != NULL && peq < end) {
            size_t klen = (size_t)(peq - p);
            int seen = 0;
            for (const char *q = merged; *q != '\0' && !seen;) {
                const char *qe = strchr(q, ','), *qeq = strchr(q, '=');
                if (qe == NULL)
                    qe = q + strlen(q);
                seen =
                    qeq != NULL && qeq < qe && (size_t)(qeq - q) == klen && memcmp(q, p, klen) == 0;
                q = *qe ? qe + 1 : qe;
            }
            if (!seen && len + klen + 8 < cap * 2)
                len += (size_t)snprintf(out + len, cap * 2 - len, "%s%.*s=0", len ? "," : "",
                                        (int)klen, p);
        }
        p = *end ? end + 1 : end;
    }
    free(copy);
    free(merged);
    return out;
}

/*
 * The weights of model name: one transaction for a model of one shard; for
 * a sharded one (docs/design.md "Shards"), one per shard, assembled, with
 * the sums of the shards' epochs and versions and the lowest watermark of
 * every partition over the shards. The shards are read one after another,
 * so the vector may mix a shard read before and one read after some
 * update: each slice is one shard's consistent state at one instant.
 */
static fr_err_t read_weights(psstore_conn_t *c, const char *name, int training, float *w, size_t n,
                             uint64_t *epoch, int64_t *version, char **offsets,
                             int64_t *shard_versions, int *nshards)
{
    fr_err_t err;
    if (offsets != NULL)
        *offsets = NULL;
    if ((err = ps_check_name(c, name)) != FR_OK)
        return err;
    int S = 1;
    size_t bounds[PSSTORE_SHARDS_MAX + 1];
    if ((err = ps_model_layout(c, name, &S, bounds)) != FR_OK && err != FR_ERR_NOTFOUND)
        return err;
    if (nshards != NULL)
        *nshards = S;
    if (S == 1) {
        err = read_one(c, name, training, w, n, epoch, version, offsets);
        if (err == FR_OK && shard_versions != NULL && version != NULL)
            shard_versions[0] = *version;
        return err;
    }
    if (bounds[S] != n)
        return ps_fail(c, FR_ERR_RANGE, "model '%s' holds %zu floats of weights, expected %zu",
                       name, bounds[S], n);
    uint64_t esum = 0;
    int64_t vsum = 0;
    char *merged = NULL;
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX], *text = NULL;
        uint64_t e = 0;
        int64_t v = 0;
        ps_shard_tag(tag, name, k, S);
        err = read_one(c, tag, training, w + bounds[k], bounds[k + 1] - bounds[k], &e, &v,
                       offsets != NULL ? &text : NULL);
        if (err != FR_OK) {
            free(merged);
            return ps_fail(c, err, "model '%s', shard %d: %s", name, k, psstore_conn_error(c));
        }
        esum += e;
        vsum += v;
        if (shard_versions != NULL)
            shard_versions[k] = v;
        if (offsets != NULL) {
            merged = watermarks_min(merged, text, k == 0);
            free(text);
            if (merged == NULL)
                return ps_fail(c, FR_ERR_NOMEM, "out of memory");
        }
    }
    if (epoch != NULL)
        *epoch = esum;
    if (version != NULL)
        *version = vsum;
    if (offsets != NULL)
        *offsets = merged;
    return FR_OK;
}

fr_err_t psstore_model_weights(psstore_conn_t *c, const char *name, float *w, size_t n,
                               uint64_t *epoch, int64_t *version)
{
    return read_weights(c, name, 0, w, n, epoch, version, NULL, NULL, NULL);
}

fr_err_t psstore_model_weights_training(psstore_conn_t *c, const char *name, float *w, size_t n,
                                        uint64_t *epoch, int64_t *version)
{
    return read_weights(c, name, 1, w, n, epoch, version, NULL, NULL, NULL);
}

fr_err_t psstore_model_weights_offsets(psstore_conn_t *c, const char *name, float *w, size_t n,
                                       uint64_t *epoch, int64_t *version, char **offsets)
{
    return read_weights(c, name, 0, w, n, epoch, version, offsets, NULL, NULL);
}

fr_err_t psstore_model_weights_shards(psstore_conn_t *c, const char *name, float *w, size_t n,
                                      uint64_t *epoch, int64_t *version, char **offsets,
                                      int64_t *shard_versions, int *nshards)
{
    return read_weights(c, name, 0, w, n, epoch, version, offsets, shard_versions, nshards);
}

static fr_err_t version_one(psstore_conn_t *c, const char *name, int64_t *version);

/* A sharded model's version is the sum of its shards'. */
fr_err_t psstore_model_version(psstore_conn_t *c, const char *name, int64_t *version)
{
    fr_err_t err;
    if ((err = ps_check_name(c, name)) != FR_OK)
        return err;
    int S = 1;
    size_t bounds[PSSTORE_SHARDS_MAX + 1];
    if ((err = ps_model_layout(c, name, &S, bounds)) != FR_OK)
        return err;
    int64_t sum = 0;
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX];
        int64_t v = 0;
        ps_shard_tag(tag, name, k, S);
        if ((err = version_one(c, tag, &v)) != FR_OK)
            return err;
        sum += v;
    }
    *version = sum;
    return FR_OK;
}

static fr_err_t version_one(psstore_conn_t *c, const char *name, int64_t *version)
{
    fr_err_t err;
    char key[PS_KEY_MAX];
    ps_key(key, name, "ver");
    redisReply *r = ps_cmd(c, 1, &err, "GET %s", key);
    if (r == NULL)
        return err;
    if (r->type == REDIS_REPLY_NIL)
        err = ps_fail(c, FR_ERR_NOTFOUND, "no model '%s'", name);
    else if (reply_int64(r, version) != 0)
        err = ps_fail(c, FR_ERR_PARSE, "model '%s' has a bad ver", name);
    freeReplyObject(r);
    return err;
}

/* Adds the model name of a key "freshet:{m}:meta" to the list; other keys
 * that happen to match the pattern are skipped. */
static fr_err_t add_model_name(void *ctx, const char *key, size_t len)
{
    static const char head[] = "freshet:{", tail[] = "}:meta";
    size_t hl = sizeof(head) - 1, tl = sizeof(tail) - 1;
    if (len <= hl + tl || len - hl - tl > 64 || memcmp(key, head, hl) != 0 ||
        memcmp(key + len - tl, tail, tl) != 0)
        return FR_OK;
    for (size_t i = hl; i < len - tl; i++) {
        if (!fr_name_char((unsigned char)key[i]))
            return FR_OK;
    }
    return ps_keylist_add(ctx, key + hl, len - hl - tl);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* SCANs for meta keys; SCAN may return a key twice, so the sorted list is
 * made unique. */
fr_err_t psstore_model_list(psstore_conn_t *c, char ***names, size_t *count)
{
    ps_keylist_t kl = {0};
    fr_err_t err = FR_OK;
    int nodes[PS_NODES_MAX]; /* a cluster: every master holds some models */
    int n = ps_conn_masters(c, nodes, PS_NODES_MAX);
    for (int i = 0; i < n && err == FR_OK; i++) {
        ps_conn_pin(c, nodes[i]);
        err = ps_scan(c, 1, "freshet:*:meta", add_model_name, &kl);
    }
    ps_conn_pin(c, -1);
    if (err != FR_OK) {
        ps_keylist_fini(&kl);
        return err;
    }
    if (kl.n > 1)
        qsort(kl.keys, kl.n, sizeof(kl.keys[0]), cmp_str);
    size_t out = 0;
    for (size_t i = 0; i < kl.n; i++) {
        if (out > 0 && strcmp(kl.keys[out - 1], kl.keys[i]) == 0)
            free(kl.keys[i]);
        else
            kl.keys[out++] = kl.keys[i];
    }
    *names = kl.keys;
    *count = out;
    return FR_OK;
}
