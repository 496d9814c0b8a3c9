/*
 * model.c - a model's lifecycle in Redis (docs/design.md "Redis layout"):
 * its name, create and delete. Its reads are in model_read.c, the offsets
 * ingest reads in offsets_read.c, its keys and shard layout in keys.c.
 *
 * Writers take care of the one-writer rule: create and delete run as one
 * WATCH/MULTI/EXEC over meta and lease, and refuse to touch a model whose
 * lease is held by a running applier. Every command after a WATCH is sent
 * without retry, because a silent reconnect would drop the WATCH and let
 * the transaction run unguarded.
 *
 * Threads: as the connection they are given (one thread at a time).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "psstore/store/store_int.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
/* w:<k> holds little-endian float32 and the weights are sent as they lie in
 * memory; a big-endian host would need a byte swap on every pull and push. */
#error "freshet stores weights as little-endian float32: big-endian hosts are not supported"
#endif

/* Transactions retried this many times when a watched key changes. */
#define MODEL_TX_TRIES 5
/* Redis strings hold at most 512 MiB (proto-max-bulk-len). */
#define MODEL_MAX_FLOATS ((size_t)512 * 1024 * 1024 / sizeof(float))

/*
 * Names become part of every key, between the braces of the hash tag, so a
 * brace, a glob character or a space would break the layout. The message
 * quotes a printable name and shows other bytes in hex.
 */
fr_err_t psstore_model_name_check(const char *name, char *errstr, size_t size)
{
    static const char rule[] = "names match [A-Za-z0-9._-]{1,64}";
    if (name == NULL || name[0] == '\0')
        return fr_errorf(FR_ERR_INVAL, errstr, size, "model name is empty (%s)", rule);
    size_t n = strlen(name);
    if (n > 64)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "model name is %zu characters long (%s)", n,
                         rule);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (fr_name_char(ch))
            continue;
        if (ch > ' ' && ch < 0x7f)
            return fr_errorf(FR_ERR_INVAL, errstr, size,
                             "model name '%s': '%c' is not allowed (%s)", name, ch, rule);
        return fr_errorf(FR_ERR_INVAL, errstr, size,
                         "model name: byte 0x%02x at position %zu is not allowed (%s)", ch, i,
                         rule);
    }
    return FR_OK;
}

/* Checks the name for a function of this file, into c->errstr. */
fr_err_t ps_check_name(psstore_conn_t *c, const char *name)
{
    return psstore_model_name_check(name, c->errstr, sizeof(c->errstr));
}

/* A fresh epoch: 64 random bits from the kernel, never 0 (0 stands for "no
 * epoch yet" in clients). FR_ERR_IO when the kernel gives none. */
static fr_err_t random_epoch(psstore_conn_t *c, uint64_t *epoch)
{
    for (int tries = 0; tries < 8; tries++)
        if (fr_random(epoch, sizeof(*epoch)) == FR_OK && *epoch != 0)
            return FR_OK;
    return ps_fail(c, FR_ERR_IO, "psstore: no random bytes for a new epoch: %s", strerror(errno));
}

/* Drops a WATCH after a refusal, so the connection can be reused. A failure
 * here is ignored: the refusal is what the caller reports. */
static void unwatch(psstore_conn_t *c)
{
    char saved[sizeof(c->errstr)];
    memcpy(saved, c->errstr, sizeof(saved));
    freeReplyObject(ps_cmd(c, 0, NULL, "UNWATCH"));
    memcpy(c->errstr, saved, sizeof(saved));
}

/*
 * The common start of create and delete: WATCH meta and lease, then
 * *exists = EXISTS meta and *leased = EXISTS lease. Returns FR_OK or an
 * error (the WATCH is then dropped).
 */
static fr_err_t watch_model(psstore_conn_t *c, const char *name, int *exists, int *leased)
{
    char meta[PS_KEY_MAX], lease[PS_KEY_MAX];
    ps_key(meta, name, "meta");
    ps_key(lease, name, "lease");
    fr_err_t err;
    redisReply *r = ps_cmd(c, 1, &err, "WATCH %s %s", meta, lease);
    if (r == NULL)
        return err;
    freeReplyObject(r);
    const char *argv[][2] = {{"EXISTS", meta}, {"EXISTS", lease}};
    int *out[] = {exists, leased};
    for (int i = 0; i < 2; i++) {
        r = ps_cmd_argv(c, 0, 2, argv[i], NULL, &err);
        if (r == NULL || r->type != REDIS_REPLY_INTEGER) {
            if (r != NULL)
                err = ps_unexpected(c, "EXISTS");
            freeReplyObject(r);
            unwatch(c);
            return err;
        }
        *out[i] = r->integer > 0;
        freeReplyObject(r);
    }
    return FR_OK;
}

/* FR_ERR_STATE naming the shard when an applier holds the lease of one of
 * the S shards of model name (S = 1: the model's own lease). */
static fr_err_t shards_unleased(psstore_conn_t *c, const char *name, int S, const char *doing)
{
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX], lease[PS_KEY_MAX];
        fr_err_t err;
        ps_shard_tag(tag, name, k, S);
        ps_key(lease, tag, "lease");
        redisReply *r = ps_cmd(c, 1, &err, "EXISTS %s", lease);
        if (r == NULL)
            return err;
        int held = r->type == REDIS_REPLY_INTEGER && r->integer > 0;
        freeReplyObject(r);
        if (held)
            return ps_fail(c, FR_ERR_STATE,
                           "model '%s' has a running applier (the lease of shard %d of %d is "
                           "held); stop it before %s the model",
                           name, k, S, doing);
    }
    return FR_OK;
}

/* Unlinks every shard key of name that any master holds, whatever shard
 * count wrote it (an interrupted create's leftovers too): SCAN of each
 * master for "freshet:{name/s*", then one UNLINK per key, routed by its
 * slot. */
static fr_err_t unlink_stale_shards(psstore_conn_t *c, const char *name)
{
    char pattern[PS_KEY_MAX];
    snprintf(pattern, sizeof(pattern), "freshet:\\{%s/s*", name);
    ps_keylist_t kl = {0};
    fr_err_t err = FR_OK;
    int nodes[PS_NODES_MAX];
    int n = ps_conn_masters(c, nodes, PS_NODES_MAX);
    for (int i = 0; i < n && err == FR_OK; i++) {
        ps_conn_pin(c, nodes[i]);
        err = ps_scan(c, 1, pattern, ps_keylist_add_key, &kl);
    }
    ps_conn_pin(c, -1);
    for (size_t i = 0; i < kl.n && err == FR_OK; i++) {
        const char *argv[] = {"UNLINK", kl.keys[i]};
        freeReplyObject(ps_cmd_argv(c, 1, 2, argv, NULL, &err));
    }
    ps_keylist_fini(&kl);
    return err;
}

/* Unlinks the keys of shards 0..S-1 of name (S > 1). */
static fr_err_t unlink_shards(psstore_conn_t *c, const char *name, int S)
{
    for (int k = 0; k < S && S > 1; k++) {
        char tag[PS_TAG_MAX];
        ps_shard_tag(tag, name, k, S);
        fr_err_t err = ps_unlink_tag(c, tag);
        if (err != FR_OK)
            return err;
    }
    return FR_OK;
}

/* ------------------------------------------------------------------------
 * Create and delete
 * ---------------------------------------------------------------------- */

/*
 * Judges EXEC's reply r (freed here): FR_OK when every command ran,
 * FR_ERR_STATE for a nil EXEC (a watched key changed: try again),
 * FR_ERR_REDIS with the message when a command failed inside.
 */
static fr_err_t exec_result(psstore_conn_t *c, redisReply *r)
{
    char ep[300];
    ps_endpoint(c, ep, sizeof(ep));
    fr_err_t err = FR_OK;
    if (r->type == REDIS_REPLY_NIL) {
        err = FR_ERR_STATE;
    } else if (r->type != REDIS_REPLY_ARRAY) {
        err = ps_fail(c, FR_ERR_REDIS, "redis %s: unexpected reply to EXEC", ep);
    } else {
        for (size_t i = 0; i < r->elements; i++) {
            if (r->element[i]->type == REDIS_REPLY_ERROR) {
                err = ps_fail(c, FR_ERR_REDIS, "redis %s: %.400s", ep, r->element[i]->str);
                break;
            }
        }
    }
    freeReplyObject(r);
    return err;
}

/* The checks of psstore_model_create's arguments, into c->errstr. */
static fr_err_t check_spec(psstore_conn_t *c, const psstore_model_spec_t *spec, const float *w)
{
    psstore_model_info_t info;
    if (spec == NULL || w == NULL || spec->layers == NULL || spec->loss == NULL)
        return ps_fail(c, FR_ERR_INVAL, "psstore: create needs a spec and weights");
    if (spec->layers[0] == '\0' || strlen(spec->layers) >= sizeof(info.layers))
        return ps_fail(c, FR_ERR_INVAL, "psstore: layers must be 1..%zu characters",
                       sizeof(info.layers) - 1);
    if (spec->loss[0] == '\0' || strlen(spec->loss) >= sizeof(info.loss))
        return ps_fail(c, FR_ERR_INVAL, "psstore: loss must be 1..%zu characters",
                       sizeof(info.loss) - 1);
    if (spec->nparams == 0 || spec->nparams > MODEL_MAX_FLOATS)
        return ps_fail(c, FR_ERR_RANGE,
                       "psstore: %zu parameters: a model holds 1 to 2^27 floats (Redis strings "
                       "hold at most 512 MiB)",
                       spec->nparams);
    /* a sparse model's w is its dense part (the bias and the tower) on
     * shard 0, one float held at 0 on each other shard (docs/design.md
     * "Sparse models on shards") */
    if (spec->sparse != NULL) {
        sparse_spec_t table;
        sparse_optim_t optim;
        char why[200];
        if (psstore_sparse_meta_parse(spec->sparse, &table, &optim, why, sizeof(why)) != FR_OK)
            return ps_fail(c, FR_ERR_INVAL, "psstore: %s", why);
        size_t want = sparse_dense_len(&table) + (size_t)(spec->shards > 1 ? spec->shards - 1 : 0);
        if (spec->nparams != want)
            return ps_fail(c, FR_ERR_INVAL,
                           "psstore: a sparse model's w is its dense part (%zu floats) and a "
                           "float a shard past 0: %zu floats, not %zu",
                           sparse_dense_len(&table), want, spec->nparams);
    }
    return FR_OK;
}

/*
 * Queues MULTI, the unlinking of kl, the new keys of tag and EXEC: meta
 * (the fields of fields[nfields], then created, epoch and redis_run_id),
 * ver 0, w:0 = w[n] and an empty opt:0. For a model of one shard tag is
 * the model; for shard k of a sharded model, the shard's tag. The weights
 * go out as they lie in memory (%b), with no copy of our own.
 */
static fr_err_t queue_create(psstore_conn_t *c, const char *tag, const char *const *fields,
                             int nfields, const float *w, size_t n, const char *run_id,
                             uint64_t epoch, const ps_keylist_t *kl, size_t *queued)
{
    char meta[PS_KEY_MAX], ver[PS_KEY_MAX], wkey[PS_KEY_MAX], opt[PS_KEY_MAX];
    char created[32], epoch_s[32];
    ps_key(meta, tag, "meta");
    ps_key(ver, tag, "ver");
    ps_key_shard(wkey, tag, "w", 0);
    ps_key_shard(opt, tag, "opt", 0);
    snprintf(created, sizeof(created), "%" PRId64, fr_clock_unix_ms());
    snprintf(epoch_s, sizeof(epoch_s), "%" PRIu64, epoch);

    const char *multi[] = {"MULTI"};
    const char *hset[16] = {"HSET", meta};
    int nh = 2;
    for (int i = 0; i < nfields && nh < 10; i++)
        hset[nh++] = fields[i];
    const char *tail[] = {"created", created, "epoch", epoch_s, "redis_run_id", run_id};
    for (size_t i = 0; i < sizeof(tail) / sizeof(tail[0]); i++)
        hset[nh++] = tail[i];
    const char *set_ver[] = {"SET", ver, "0"};
    const char *set_w[] = {"SET", wkey, (const char *)w};
    size_t set_w_lens[] = {3, strlen(wkey), n * sizeof(float)};
    const char *set_opt[] = {"SET", opt, ""};
    const char *exec[] = {"EXEC"};

    fr_err_t err = ps_pipeline_append(c, 1, multi, NULL);
    if (err != FR_OK)
        return err;
    ++*queued;
    if (kl != NULL && (err = ps_queue_unlink(c, kl, queued)) != FR_OK)
        return err;
    const int argcs[] = {nh, 3, 3, 3, 1};
    const char **argvs[] = {hset, set_ver, set_w, set_opt, exec};
    const size_t *lens[] = {NULL, NULL, set_w_lens, NULL, NULL};
    for (int i = 0; i < 5; i++) {
        if ((err = ps_pipeline_append(c, argcs[i], argvs[i], lens[i])) != FR_OK)
            return err;
        ++*queued;
    }
    return err;
}

/*
 * Ends a transaction whose commands were queued (err: how queueing went):
 * reads every reply when queueing succeeded, drops the connection
 * otherwise. Returns exec_result's verdict, FR_ERR_STATE when the WATCH
 * fired, or the error that stopped it.
 */
static fr_err_t finish_tx(psstore_conn_t *c, fr_err_t err, size_t queued)
{
    redisReply *r = NULL;
    if (err == FR_OK)
        r = ps_pipeline_finish(c, queued, &err);
    else
        ps_pipeline_discard(c);
    if (r == NULL && err != FR_OK)
        return err;
    return exec_result(c, r);
}

/*
 * Creates the model in one transaction: WATCH meta and lease, refuse an
 * existing model unless force, refuse a model a running applier holds,
 * then MULTI, unlink every key the name has (an old model's, or leftovers
 * without meta, such as stale offsets that would make the new model skip
 * records), write meta, ver, w:0 and opt:0, EXEC. A nil EXEC (a watched key
 * changed) starts over, up to MODEL_TX_TRIES times.
 */
/*
 * A sharded model (docs/design.md "Shards"): its shards live in S slots, so
 * no one transaction covers them. The old model's keys go first, model
 * meta first of all (the model then no longer exists for anyone), then
 * each shard is written in a transaction of its own (its meta with its own
 * epoch and its range, ver 0, its slice of w), and the model's meta
 * (layers, loss, shards, bounds) last: the model exists once every shard
 * does. An interrupted create leaves no meta, and the next create --force
 * clears what it wrote.
 */
static fr_err_t write_shards(psstore_conn_t *c, const char *name, const psstore_model_spec_t *spec,
                             const float *w, int S, const size_t *bounds, int exists, int old_S);

static fr_err_t create_sharded(psstore_conn_t *c, const char *name,
                               const psstore_model_spec_t *spec, const float *w, int force,
                               int old_S, int exists)
{
    int S = spec->shards;
    size_t bounds[PSSTORE_SHARDS_MAX + 1];
    char ep[300];
    fr_err_t err;
    if (spec->sparse != NULL) { /* rows go by row % S; w is shard 0's dense part, a float a
                                   shard past it (check_spec) */
        bounds[0] = 0;
        for (int k = 1; k <= S; k++)
            bounds[k] = spec->nparams - (size_t)(S - k);
    } else if (psstore_shard_bounds(spec->layers, spec->nparams, S, bounds, c->errstr,
                                    sizeof(c->errstr)) != FR_OK) {
        return FR_ERR_INVAL;
    }
    ps_endpoint(c, ep, sizeof(ep));
    if (exists && !force)
        return ps_fail(c, FR_ERR_EXISTS, "redis %s: model '%s' already exists", ep, name);
    /* one creator at a time: the shards are written in several transactions,
     * and a second creator's clearing would remove the first one's shards
     * (several `freshet train` starting at once on a missing model). The
     * lock's tag is no model's and no shard's. */
    char lock[PS_KEY_MAX], token[32];
    snprintf(lock, sizeof(lock), "freshet:{%s/create}:lock", name);
    snprintf(token, sizeof(token), "%016llx", (unsigned long long)fr_random_u64());
    redisReply *r = ps_cmd(c, 1, &err, "SET %s %s NX PX 30000", lock, token);
    if (r == NULL)
        return err;
    int mine = r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (!mine) {
        int other_S = 1;
        size_t other[PSSTORE_SHARDS_MAX + 1];
        for (int waited = 0; waited < 15000; waited += 50) { /* its model appears, or not */
            if (ps_model_layout(c, name, &other_S, other) == FR_OK)
                return ps_fail(c, FR_ERR_EXISTS,
                               "redis %s: model '%s' was created meanwhile by another process", ep,
                               name);
            struct timespec ts = {0, 50000000L};
            nanosleep(&ts, NULL);
        }
        return ps_fail(c, FR_ERR_STATE,
                       "redis %s: model '%s' is being created by another process; try again", ep,
                       name);
    }
    /* under the lock, look again: another creator may have finished first */
    size_t now_bounds[PSSTORE_SHARDS_MAX + 1];
    err = ps_model_layout(c, name, &old_S, now_bounds);
    exists = err == FR_OK;
    if (err == FR_ERR_NOTFOUND || (err == FR_OK && force))
        err = write_shards(c, name, spec, w, S, bounds, exists, old_S);
    else if (err == FR_OK)
        err = ps_fail(c, FR_ERR_EXISTS, "redis %s: model '%s' already exists", ep, name);
    /* the lock goes whatever happened (compare-and-delete: ours only) */
    static const char unlock[] = "if redis.call('GET', KEYS[1]) == ARGV[1] then return "
                                 "redis.call('DEL', KEYS[1]) end return 0";
    freeReplyObject(ps_cmd(c, 1, NULL, "EVAL %s 1 %s %s", unlock, lock, token));
    return err;
}

/* create_sharded's writes, under its lock. */
static fr_err_t write_shards(psstore_conn_t *c, const char *name, const psstore_model_spec_t *spec,
                             const float *w, int S, const size_t *bounds, int exists, int old_S)
{
    char text[PSSTORE_SHARDS_MAX * 21 + 1], created[32], shards_s[16];
    fr_err_t err;
    if (exists && (err = shards_unleased(c, name, old_S, "replacing")) != FR_OK)
        return err;
    if ((err = ps_unlink_tag(c, name)) != FR_OK || (err = unlink_stale_shards(c, name)) != FR_OK)
        return err;
    for (int k = 0; k < S; k++) {
        char tag[PS_TAG_MAX], meta[PS_KEY_MAX], run_id[64], ks[16], lo[24], hi[24];
        uint64_t epoch;
        ps_shard_tag(tag, name, k, S);
        ps_key(meta, tag, "meta");
        snprintf(ks, sizeof(ks), "%d", k);
        snprintf(lo, sizeof(lo), "%zu", bounds[k]);
        snprintf(hi, sizeof(hi), "%zu", bounds[k + 1]);
        if ((err = random_epoch(c, &epoch)) != FR_OK ||
            (err = ps_server_run_id(c, meta, run_id, sizeof(run_id))) != FR_OK)
            return err;
        const char *fields[] = {"shard", ks, "lo", lo, "hi", hi};
        size_t queued = 0;
        err = queue_create(c, tag, fields, 6, w + bounds[k], bounds[k + 1] - bounds[k], run_id,
                           epoch, NULL, &queued);
        if ((err = finish_tx(c, err, queued)) != FR_OK)
            return err;
    }
    char meta[PS_KEY_MAX];
    ps_key(meta, name, "meta");
    psstore_shard_bounds_format(text, sizeof(text), bounds, S);
    snprintf(created, sizeof(created), "%" PRId64, fr_clock_unix_ms());
    snprintf(shards_s, sizeof(shards_s), "%d", S);
    const char *hset[] = {"HSET",     meta,     "layers", spec->layers, "loss",
                          spec->loss, "shards", shards_s, "bounds",     text,
                          "created",  created,  "sparse", spec->sparse};
    int argc = spec->sparse != NULL ? 14 : 12; /* a sparse model names its table */
    redisReply *r = ps_cmd_argv(c, 1, argc, hset, NULL, &err);
    freeReplyObject(r);
    return err;
}

fr_err_t psstore_model_create(psstore_conn_t *c, const char *name, const psstore_model_spec_t *spec,
                              const float *w, int force)
{
    fr_err_t err;
    char ep[300], run_id[64];
    if ((err = ps_check_name(c, name)) != FR_OK || (err = check_spec(c, spec, w)) != FR_OK)
        return err;
    int old_S = 1;
    size_t old_bounds[PSSTORE_SHARDS_MAX + 1];
    err = ps_model_layout(c, name, &old_S, old_bounds);
    if (err != FR_OK && err != FR_ERR_NOTFOUND)
        return err;
    int had = err == FR_OK;
    if (spec->shards > 1)
        return create_sharded(c, name, spec, w, force, old_S, had);
    if (had && force && old_S > 1) {
        /* one shard replacing S: the old shards' keys go first */
        if ((err = shards_unleased(c, name, old_S, "replacing")) != FR_OK ||
            (err = unlink_stale_shards(c, name)) != FR_OK)
            return err;
    }
    uint64_t epoch;
    char meta[PS_KEY_MAX];
    ps_key(meta, name, "meta");
    if ((err = random_epoch(c, &epoch)) != FR_OK ||
        (err = ps_server_run_id(c, meta, run_id, sizeof(run_id))) != FR_OK)
        return err;
    ps_endpoint(c, ep, sizeof(ep));

    for (int tries = 0; tries < MODEL_TX_TRIES; tries++) {
        int exists, leased;
        if ((err = watch_model(c, name, &exists, &leased)) != FR_OK)
            return err;
        if (exists && !force) {
            unwatch(c);
            return ps_fail(c, FR_ERR_EXISTS, "redis %s: model '%s' already exists", ep, name);
        }
        if (exists && leased) {
            unwatch(c);
            return ps_fail(c, FR_ERR_STATE,
                           "redis %s: model '%s' has a running applier (its lease is held); stop "
                           "it before replacing the model",
                           ep, name);
        }
        ps_keylist_t kl = {0};
        size_t queued = 0;
        err = ps_model_keys(c, name, &kl);
        const char *fields[] = {"layers", spec->layers, "loss",   spec->loss,
                                "shards", "1",          "sparse", spec->sparse};
        int nfields = spec->sparse != NULL ? 8 : 6; /* a sparse model names its table */
        if (err == FR_OK)
            err = queue_create(c, name, fields, nfields, w, spec->nparams, run_id, epoch, &kl,
                               &queued);
        ps_keylist_fini(&kl);
        if ((err = finish_tx(c, err, queued)) != FR_ERR_STATE)
            return err;
    }
    return ps_fail(c, FR_ERR_STATE,
                   "redis %s: model '%s' kept changing while it was being created; try again", ep,
                   name);
}

/*
 * Deletes every key of the model in one transaction, as create replaces
 * one: FR_ERR_NOTFOUND without meta, FR_ERR_STATE while an applier holds
 * the lease (docs/design.md "One writer and fencing": only the lease holder writes the model).
 */
fr_err_t psstore_model_delete(psstore_conn_t *c, const char *name)
{
    fr_err_t err;
    char ep[300];
    if ((err = ps_check_name(c, name)) != FR_OK)
        return err;
    int S = 1;
    size_t bounds[PSSTORE_SHARDS_MAX + 1];
    err = ps_model_layout(c, name, &S, bounds);
    if (err != FR_OK && err != FR_ERR_NOTFOUND)
        return err;
    if (S > 1) {
        /* the model's own keys first (meta: the model is gone for everyone),
         * then each shard's; shards cannot be in one transaction */
        if ((err = shards_unleased(c, name, S, "deleting")) != FR_OK ||
            (err = ps_unlink_tag(c, name)) != FR_OK)
            return err;
        return unlink_shards(c, name, S);
    }
    ps_endpoint(c, ep, sizeof(ep));
    for (int tries = 0; tries < MODEL_TX_TRIES; tries++) {
        int exists, leased;
        if ((err = watch_model(c, name, &exists, &leased)) != FR_OK)
            return err;
        if (!exists || leased) {
            unwatch(c);
            if (!exists)
                return ps_fail(c, FR_ERR_NOTFOUND, "redis %s: no model '%s'", ep, name);
            return ps_fail(c, FR_ERR_STATE,
                           "redis %s: model '%s' has a running applier (its lease is held); "
                           "stop it before deleting the model",
                           ep, name);
        }
        ps_keylist_t kl = {0};
        size_t queued = 0;
        const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"};
        err = ps_model_keys(c, name, &kl);
        if (err == FR_OK && (err = ps_pipeline_append(c, 1, multi, NULL)) == FR_OK)
            queued++;
        if (err == FR_OK)
            err = ps_queue_unlink(c, &kl, &queued);
        if (err == FR_OK && (err = ps_pipeline_append(c, 1, exec, NULL)) == FR_OK)
            queued++;
        ps_keylist_fini(&kl);
        if ((err = finish_tx(c, err, queued)) != FR_ERR_STATE)
            return err;
    }
    return ps_fail(c, FR_ERR_STATE,
                   "redis %s: model '%s' kept changing while it was being deleted; try again", ep,
                   name);
}
