/*
 * client.c - the trainer-facing client of one worker thread: pull the
 * weights when (epoch, version) moved, push gradients into the grads
 * stream with backpressure (docs/design.md "Redis layout").
 *
 * A client owns one connection and belongs to one thread. Errors are
 * returned as fr_err_t with the reason in psstore_client_error(); nothing
 * here logs (the caller handles and logs).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "psstore/grads/grads_int.h"

#define CLIENT_TIMEOUT_MS    2000 /* connect and command timeout             */
#define CLIENT_BACKOFF_FIRST 1    /* ms: first wait while the stream is full  */
#define CLIENT_BACKOFF_MAX   20   /* ms: longest wait between two checks      */

struct psstore_client {
    psstore_conn_t *c;
    char model[65];
    size_t nparams;
    int any_length; /* a sparse model's: gradients of any length */
    int64_t max_pending;
    char key_meta[PS_KEY_MAX];
    char key_ver[PS_KEY_MAX];
    char key_w[PS_KEY_MAX];
    char key_grads[PS_KEY_MAX];
    char key_members[PS_KEY_MAX];
    char key_rounds[PS_KEY_MAX];
    char key_versions[PS_KEY_MAX];
    char key_drops[PS_KEY_MAX];
    ps_grad_args_t args; /* XADD arguments, reused by every push */
    uint64_t bytes;      /* payload bytes pulled and pushed      */
    char last_id[64];    /* stream id of the last push           */
    /* a sharded model (docs/design.md "Shards"): a client per shard, each
     * pulling and pushing its slice under its shard's tag; this one keeps
     * the model's membership */
    int nsub;
    psstore_client_t *sub[PSSTORE_SHARDS_MAX];
    psstore_shard_at_t at; /* each shard's (epoch, version) of the last pull */
};

/* Writes how errors name the Redis of c: "host:port" or the socket path. */
static void client_endpoint(const psstore_conn_t *c, char *buf, size_t size)
{
    if (c->url.unix_socket)
        snprintf(buf, size, "%s", c->url.path);
    else if (strchr(c->url.host, ':') != NULL)
        snprintf(buf, size, "[%s]:%d", c->url.host, c->url.port);
    else
        snprintf(buf, size, "%s:%d", c->url.host, c->url.port);
}

/* The "model 'm' does not exist in redis EP" error, as FR_ERR_NOTFOUND. */
static fr_err_t no_model(psstore_client_t *cl)
{
    char ep[300];
    client_endpoint(cl->c, ep, sizeof(ep));
    return ps_fail(cl->c, FR_ERR_NOTFOUND, "model '%s' does not exist in redis %s", cl->model, ep);
}

/* Sleeps ms milliseconds, resuming after signals. */
static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Parses a whole bulk-string (or integer) reply as a decimal integer:
 * signed when is_signed, else unsigned 64-bit. Returns 0 or -1. */
static int reply_number(const redisReply *r, int is_signed, uint64_t *u, int64_t *s)
{
    if (r->type == REDIS_REPLY_INTEGER) {
        if (!is_signed && r->integer < 0)
            return -1;
        *u = (uint64_t)r->integer;
        *s = (int64_t)r->integer;
        return 0;
    }
    if (r->type != REDIS_REPLY_STRING || r->len == 0 || r->len > 20)
        return -1;
    char buf[24], *end;
    memcpy(buf, r->str, r->len);
    buf[r->len] = '\0';
    if (buf[0] == ' ' || buf[0] == '+' || (!is_signed && buf[0] == '-'))
        return -1;
    errno = 0;
    if (is_signed)
        *s = strtoll(buf, &end, 10);
    else
        *u = strtoull(buf, &end, 10);
    return errno != 0 || end != buf + r->len ? -1 : 0;
}

/* Asks one command whose reply is an integer (EXISTS, STRLEN, XLEN);
 * safe to repeat, so it is retried once over a reconnect. */
static fr_err_t ask_integer(psstore_client_t *cl, const char *cmd, const char *key, long long *out)
{
    const char *argv[] = {cmd, key};
    size_t lens[] = {strlen(cmd), strlen(key)};
    fr_err_t err;
    redisReply *r = ps_cmd_argv(cl->c, 1, 2, argv, lens, &err);
    if (r == NULL)
        return err;
    if (r->type != REDIS_REPLY_INTEGER) {
        freeReplyObject(r);
        return ps_fail(cl->c, FR_ERR_REDIS, "redis: %s %s: unexpected reply type", cmd, key);
    }
    *out = r->integer;
    freeReplyObject(r);
    return FR_OK;
}

/* Checks that the model exists and has nparams floats of weights. */
static fr_err_t client_check_model(psstore_client_t *cl)
{
    long long exists = 0, bytes = 0;
    fr_err_t err = ask_integer(cl, "EXISTS", cl->key_meta, &exists);
    if (err != FR_OK)
        return err;
    if (exists == 0)
        return no_model(cl);
    err = ask_integer(cl, "STRLEN", cl->key_w, &bytes);
    if (err != FR_OK)
        return err;
    if (bytes == 0)
        return ps_fail(cl->c, FR_ERR_NOTFOUND, "model '%s' has no weights (%s is missing)",
                       cl->model, cl->key_w);
    if (bytes % (long long)sizeof(float) != 0)
        return ps_fail(cl->c, FR_ERR_RANGE,
                       "model '%s' has weights of %lld bytes in the store, not whole float32s",
                       cl->model, bytes);
    if ((unsigned long long)bytes != cl->nparams * sizeof(float))
        return ps_fail(cl->c, FR_ERR_RANGE,
                       "model '%s' has %lld parameters in the store, this worker expects %zu",
                       cl->model, bytes / (long long)sizeof(float), cl->nparams);
    return FR_OK;
}

/* A client of the keys under tag (a model's name, or a shard's tag) with
 * nparams floats, connected; its model is not checked yet. */
static psstore_client_t *client_open(const char *url, const char *tag, size_t nparams,
                                     int64_t max_pending, char *errstr, size_t size)
{
    psstore_client_t *cl = calloc(1, sizeof(*cl));
    if (cl == NULL) {
        fr_errorf(FR_ERR_NOMEM, errstr, size, "psstore client: out of memory");
        return NULL;
    }
    snprintf(cl->model, sizeof(cl->model), "%s", tag);
    cl->nparams = nparams;
    cl->max_pending = max_pending;
    ps_key(cl->key_meta, tag, "meta");
    ps_key(cl->key_ver, tag, "ver");
    ps_key_shard(cl->key_w, tag, "w", 0);
    ps_key(cl->key_grads, tag, "grads");
    ps_key(cl->key_members, tag, "members");
    ps_key(cl->key_rounds, tag, "rounds");
    ps_key(cl->key_versions, tag, "versions");
    ps_key(cl->key_drops, tag, "drops");
    cl->c = psstore_conn_new(url, CLIENT_TIMEOUT_MS, errstr, size);
    if (cl->c == NULL) {
        free(cl);
        return NULL;
    }
    return cl;
}

/*
 * Connects to url and checks that model exists with nparams parameters.
 * NULL with errstr on a bad argument, an unreachable Redis, a missing model
 * or a model of another size. Caller frees with psstore_client_destroy().
 * A sharded model gets a client per shard besides this one.
 */
psstore_client_t *psstore_client_new(const char *url, const char *model, size_t nparams,
                                     int64_t max_pending, char *errstr, size_t size)
{
    if (url == NULL || model == NULL) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "psstore client: no url or no model");
        return NULL;
    }
    if (psstore_model_name_check(model, errstr, size) != FR_OK)
        return NULL;
    if (nparams == 0 || nparams > SIZE_MAX / sizeof(float) || max_pending < 1) {
        fr_errorf(FR_ERR_INVAL, errstr, size,
                  "psstore client: nparams (%zu) and max_pending (%" PRId64 ") must be >= 1",
                  nparams, max_pending);
        return NULL;
    }
    psstore_client_t *cl = client_open(url, model, nparams, max_pending, errstr, size);
    if (cl == NULL)
        return NULL;
    int S = 1;
    fr_err_t err = ps_model_layout(cl->c, model, &S, cl->at.bounds);
    if (err == FR_ERR_NOTFOUND)
        err = no_model(cl);
    if (err == FR_OK && S == 1)
        err = client_check_model(cl);
    if (err == FR_OK && S > 1 && cl->at.bounds[S] != nparams)
        err = ps_fail(cl->c, FR_ERR_RANGE,
                      "model '%s' has %zu parameters in the store, this worker expects %zu", model,
                      cl->at.bounds[S], nparams);
    if (err != FR_OK) {
        fr_errorf(FR_ERR_INVAL, errstr, size, "%s", psstore_conn_error(cl->c));
        goto err;
    }
    for (int k = 0; k < S && S > 1; k++) {
        char tag[PS_TAG_MAX];
        ps_shard_tag(tag, model, k, S);
        size_t len = cl->at.bounds[k + 1] - cl->at.bounds[k];
        cl->sub[k] = client_open(url, tag, len, max_pending, errstr, size);
        if (cl->sub[k] == NULL)
            goto err;
        cl->nsub = k + 1;
        if (client_check_model(cl->sub[k]) != FR_OK) {
            fr_errorf(FR_ERR_INVAL, errstr, size, "%s", psstore_conn_error(cl->sub[k]->c));
            goto err;
        }
    }
    cl->at.n = S > 1 ? S : 0;
    return cl;
err:
    psstore_client_destroy(cl);
    return NULL;
}

void psstore_client_destroy(psstore_client_t *cl)
{
    if (cl == NULL)
        return;
    for (int k = 0; k < cl->nsub; k++)
        psstore_client_destroy(cl->sub[k]);
    psstore_conn_destroy(cl->c);
    ps_grad_args_fini(&cl->args);
    free(cl);
}

void psstore_client_set_cancel(psstore_client_t *cl, psstore_cancel_fn fn, void *arg)
{
    psstore_conn_set_cancel(cl->c, fn, arg);
    for (int k = 0; k < cl->nsub; k++)
        psstore_conn_set_cancel(cl->sub[k]->c, fn, arg);
}

psstore_shard_at_t *psstore_client_at(psstore_client_t *cl)
{
    return cl != NULL && cl->nsub > 0 ? &cl->at : NULL;
}

/* A shard client's failure, reported on the model's client. */
static fr_err_t sub_failed(psstore_client_t *cl, int k, fr_err_t err)
{
    return ps_fail(cl->c, err, "shard %d: %s", k, psstore_conn_error(cl->sub[k]->c));
}

/* The same for shard k's client sub, which is cl itself at one shard. */
static fr_err_t sub_failed_at(psstore_client_t *cl, psstore_client_t *sub, int k, fr_err_t err)
{
    if (sub == cl)
        return err;
    return ps_fail(cl->c, err, "shard %d: %s", k, psstore_conn_error(sub->c));
}

const char *psstore_client_error(const psstore_client_t *cl)
{
    return cl != NULL ? psstore_conn_error(cl->c) : "psstore: no client";
}

uint64_t psstore_client_bytes(const psstore_client_t *cl)
{
    if (cl == NULL)
        return 0;
    uint64_t sum = cl->bytes;
    for (int k = 0; k < cl->nsub; k++)
        sum += cl->sub[k]->bytes;
    return sum;
}

/* ------------------------------------------------------------------------
 * Pull
 * ---------------------------------------------------------------------- */

/*
 * Sends n commands in one round trip and reads their n replies into
 * replies[] (NULL where a command failed). Every appended command's reply
 * is read, so the connection stays in step after an error reply. Returns
 * FR_OK or the first error (c->errstr says why); the caller frees the
 * replies with free_replies() either way.
 */
static fr_err_t pipeline(psstore_conn_t *c, int n, const int *argc, const char *const *argv[],
                         const size_t *lens[], redisReply **replies)
{
    fr_err_t first = FR_OK, err;
    int sent = 0;
    for (int i = 0; i < n; i++)
        replies[i] = NULL;
    for (; sent < n; sent++) {
        err = ps_pipeline_append(c, argc[sent], (const char **)argv[sent], lens[sent]);
        if (err != FR_OK) {
            first = err;
            break;
        }
    }
    for (int i = 0; i < sent; i++) {
        replies[i] = ps_pipeline_read(c, &err);
        if (replies[i] == NULL && first == FR_OK)
            first = err;
    }
    return first;
}

static void free_replies(redisReply **replies, int n)
{
    for (int i = 0; i < n; i++) {
        freeReplyObject(replies[i]);
        replies[i] = NULL;
    }
}

/* One round trip: the store's (epoch, version). FR_ERR_NOTFOUND when the
 * model has gone. */
static fr_err_t pull_check(psstore_client_t *cl, uint64_t *epoch, int64_t *version)
{
    const char *get[] = {"GET", cl->key_ver}, *hget[] = {"HGET", cl->key_meta, "epoch"};
    const size_t get_l[] = {3, strlen(cl->key_ver)}, hget_l[] = {4, strlen(cl->key_meta), 5};
    const int argc[] = {2, 3};
    const char *const *argv[] = {get, hget};
    const size_t *lens[] = {get_l, hget_l};
    redisReply *r[2];
    fr_err_t err = pipeline(cl->c, 2, argc, argv, lens, r);
    uint64_t u = 0;
    int64_t s = 0;
    if (err != FR_OK)
        goto out;
    if (r[0]->type == REDIS_REPLY_NIL || r[1]->type == REDIS_REPLY_NIL) {
        err = no_model(cl);
        goto out;
    }
    if (reply_number(r[0], 1, &u, version) != 0 || reply_number(r[1], 0, epoch, &s) != 0)
        err = ps_fail(cl->c, FR_ERR_REDIS, "model '%s': bad version or epoch in the store",
                      cl->model);
out:
    free_replies(r, 2);
    return err;
}

/* One round trip: MULTI / HGET meta epoch / GET ver / GET w:0 / EXEC, so
 * the weights and their (epoch, version) come from one instant. Copies
 * the weights into w. */
static fr_err_t pull_read(psstore_client_t *cl, float *w, uint64_t *epoch, int64_t *version)
{
    const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"};
    const char *hget[] = {"HGET", cl->key_meta, "epoch"}, *getv[] = {"GET", cl->key_ver},
               *getw[] = {"GET", cl->key_w};
    const size_t multi_l[] = {5}, exec_l[] = {4}, hget_l[] = {4, strlen(cl->key_meta), 5},
                 getv_l[] = {3, strlen(cl->key_ver)}, getw_l[] = {3, strlen(cl->key_w)};
    const int argc[] = {1, 3, 2, 2, 1};
    const char *const *argv[] = {multi, hget, getv, getw, exec};
    const size_t *lens[] = {multi_l, hget_l, getv_l, getw_l, exec_l};
    redisReply *r[5];
    fr_err_t err = pipeline(cl->c, 5, argc, argv, lens, r);
    if (err != FR_OK)
        goto out;
    const redisReply *x = r[4];
    if (x->type != REDIS_REPLY_ARRAY || x->elements != 3) {
        err = ps_fail(cl->c, FR_ERR_REDIS, "model '%s': the weights transaction failed", cl->model);
        goto out;
    }
    const redisReply *re = x->element[0], *rv = x->element[1], *rw = x->element[2];
    if (re->type == REDIS_REPLY_NIL || rv->type == REDIS_REPLY_NIL || rw->type == REDIS_REPLY_NIL) {
        err = no_model(cl);
        goto out;
    }
    uint64_t e = 0, u = 0;
    int64_t v = 0, s = 0;
    if (reply_number(re, 0, &e, &s) != 0 || reply_number(rv, 1, &u, &v) != 0 ||
        rw->type != REDIS_REPLY_STRING) {
        err = ps_fail(cl->c, FR_ERR_REDIS, "model '%s': bad epoch, version or weights", cl->model);
        goto out;
    }
    if (rw->len != cl->nparams * sizeof(float)) {
        err = ps_fail(cl->c, FR_ERR_RANGE,
                      "model '%s' has %zu parameters in the store, this worker expects %zu",
                      cl->model, rw->len / sizeof(float), cl->nparams);
        goto out;
    }
    memcpy(w, rw->str, rw->len);
    cl->bytes += rw->len;
    *epoch = e;
    *version = v;
out:
    free_replies(r, 5);
    return err;
}

/*
 * Pulls the weights into w[nparams] when the store's (epoch, version)
 * differs from (*epoch, *version): one round trip when nothing changed,
 * two when it did. The reads are repeated once when the connection broke
 * (they are safe to repeat). On error w, *epoch and *version are left as
 * they were and *changed is 0.
 */
/* The (epoch, version) check of pull_check, in two halves: queued and sent
 * (check_send), then read (check_recv), so that several shards' checks
 * share one round trip's time. */
static fr_err_t check_send(psstore_client_t *cl)
{
    const char *get[] = {"GET", cl->key_ver}, *hget[] = {"HGET", cl->key_meta, "epoch"};
    fr_err_t err = ps_pipeline_append(cl->c, 2, get, NULL);
    if (err == FR_OK && (err = ps_pipeline_append(cl->c, 3, hget, NULL)) != FR_OK) {
        ps_pipeline_discard(cl->c); /* the first went in: the pipeline is out of step */
        return err;
    }
    return err == FR_OK ? ps_pipeline_flush(cl->c) : err;
}

static fr_err_t check_recv(psstore_client_t *cl, uint64_t *epoch, int64_t *version)
{
    fr_err_t err, first = FR_OK;
    redisReply *r[2];
    for (int i = 0; i < 2; i++) { /* both replies, to stay in step */
        r[i] = ps_pipeline_read(cl->c, &err);
        if (r[i] == NULL && first == FR_OK)
            first = err;
    }
    uint64_t u = 0;
    int64_t s = 0;
    if (first == FR_OK && (r[0]->type == REDIS_REPLY_NIL || r[1]->type == REDIS_REPLY_NIL))
        first = no_model(cl);
    else if (first == FR_OK &&
             (reply_number(r[0], 1, &u, version) != 0 || reply_number(r[1], 0, epoch, &s) != 0))
        first = ps_fail(cl->c, FR_ERR_REDIS, "model '%s': bad version or epoch in the store",
                        cl->model);
    free_replies(r, 2);
    return first;
}

/*
 * A sharded model: every shard's (epoch, version) checked at once (each on
 * its own connection, so the round trips overlap), then the slice of each
 * shard that moved since cl->at read in its own transaction. *epoch and
 * *version receive the sums. A failure after some slices were copied
 * marks at torn: the next pull reports a change.
 */
static fr_err_t pull_shards_once(psstore_client_t *cl, float *w, uint64_t *epoch, int64_t *version,
                                 int *changed)
{
    psstore_shard_at_t *at = &cl->at;
    fr_err_t sent[PSSTORE_SHARDS_MAX], first = FR_OK;
    int bad = -1;
    for (int k = 0; k < cl->nsub; k++)
        sent[k] = check_send(cl->sub[k]);
    for (int k = 0; k < cl->nsub; k++) { /* every sent check is read, whatever failed */
        uint64_t e = 0;
        int64_t v = 0;
        fr_err_t err = sent[k] == FR_OK ? check_recv(cl->sub[k], &e, &v) : sent[k];
        if (err == FR_OK && first == FR_OK && (e != at->epochs[k] || v != at->versions[k])) {
            err = pull_read(cl->sub[k], w + at->bounds[k], &at->epochs[k], &at->versions[k]);
            *changed |= err == FR_OK;
        }
        if (err != FR_OK && first == FR_OK) {
            first = err;
            bad = k;
        }
    }
    if (first != FR_OK) {
        at->torn |= *changed;
        *changed = 0;
        return sub_failed(cl, bad, first);
    }
    at->epoch = 0;
    at->version = 0;
    for (int k = 0; k < cl->nsub; k++) {
        at->epoch += at->epochs[k];
        at->version += at->versions[k];
    }
    *changed |= at->torn;
    at->torn = 0;
    *epoch = at->epoch;
    *version = at->version;
    return FR_OK;
}

/* pull_shards_once, again once when a shard's connection broke on the way
 * (the reads are safe to repeat), as psstore_pull does for one shard. */
static fr_err_t pull_shards(psstore_client_t *cl, float *w, uint64_t *epoch, int64_t *version,
                            int *changed)
{
    fr_err_t err = pull_shards_once(cl, w, epoch, version, changed);
    int broken = 0;
    for (int k = 0; err != FR_OK && k < cl->nsub; k++)
        broken |= cl->sub[k]->c->ctx == NULL;
    return broken ? pull_shards_once(cl, w, epoch, version, changed) : err;
}

fr_err_t psstore_pull(psstore_client_t *cl, float *w, uint64_t *epoch, int64_t *version,
                      int *changed)
{
    if (cl == NULL || w == NULL || epoch == NULL || version == NULL || changed == NULL)
        return cl ? ps_fail(cl->c, FR_ERR_INVAL, "psstore_pull: NULL argument") : FR_ERR_INVAL;
    *changed = 0;
    if (cl->nsub > 0)
        return pull_shards(cl, w, epoch, version, changed);
    fr_err_t err = FR_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        uint64_t e = 0;
        int64_t v = 0;
        err = pull_check(cl, &e, &v);
        if (err == FR_OK && e == *epoch && v == *version)
            return FR_OK;
        if (err == FR_OK)
            err = pull_read(cl, w, epoch, version);
        if (err == FR_OK) {
            *changed = 1;
            return FR_OK;
        }
        if (cl->c->ctx != NULL) /* not a broken connection: repeating won't help */
            break;
    }
    return err;
}

/* ------------------------------------------------------------------------
 * Push
 * ---------------------------------------------------------------------- */

/*
 * Backpressure: waits while the grads stream holds max_pending entries or
 * more (so that this push keeps it within max_pending), checking XLEN
 * after 1, 2, 4 ... up to 20 ms, for at most timeout_ms (< 0: no limit).
 * FR_ERR_TIMEOUT when the stream is still full.
 */
static fr_err_t wait_for_room(psstore_client_t *cl, int timeout_ms)
{
    uint64_t start = fr_clock_mono_ns();
    long delay = CLIENT_BACKOFF_FIRST;
    for (;;) {
        long long pending = 0;
        fr_err_t err = ask_integer(cl, "XLEN", cl->key_grads, &pending);
        if (err != FR_OK)
            return err;
        if (pending < cl->max_pending)
            return FR_OK;
        long long waited = (long long)((fr_clock_mono_ns() - start) / 1000000u);
        if (timeout_ms >= 0 && waited >= timeout_ms)
            return ps_fail(cl->c, FR_ERR_TIMEOUT,
                           "%lld gradients waiting (max_pending %" PRId64
                           ") for %lld ms: is an applier running?",
                           pending, cl->max_pending, waited);
        long nap = delay;
        if (timeout_ms >= 0 && nap > timeout_ms - waited)
            nap = (long)(timeout_ms - waited);
        sleep_ms(nap > 0 ? nap : 1);
        delay = delay * 2 < CLIENT_BACKOFF_MAX ? delay * 2 : CLIENT_BACKOFF_MAX;
    }
}

/*
 * Appends g to the grads stream once there is room (see wait_for_room).
 * FR_ERR_INVAL when g is inconsistent (its length is not the model's, or
 * the message format refuses it); the XADD is never repeated over a
 * reconnect, so a broken connection is FR_ERR_REDIS and the entry may or
 * may not have been added (the applier drops a duplicate by its offsets).
 */
/*
 * A sharded model (docs/design.md "Shards"): each shard gets its slice,
 * with the (epoch, version) of that shard the gradient was computed on
 * and the whole gradient's L2 norm, so that every shard rejects a
 * non-finite gradient and clips alike. The slices go out together
 * (psstore_push_each: every room check, then every XADD, in flight at
 * once); a failure leaves the shards that took theirs holding it, and the
 * gap rule reads the batch again (those shards drop it as a duplicate).
 */
static fr_err_t push_shards(psstore_client_t *cl, const psstore_grad_t *g, int timeout_ms)
{
    const psstore_shard_at_t *at = g->at != NULL ? g->at : &cl->at;
    if (at->n != cl->nsub)
        return ps_fail(cl->c, FR_ERR_INVAL, "push: the gradient names %d shards, the model %d",
                       at->n, cl->nsub);
    double norm = ps_grad_norm(g);
    psstore_grad_t slices[PSSTORE_SHARDS_MAX];
    for (int k = 0; k < cl->nsub; k++)
        ps_grad_slice(g, at, k, norm, &slices[k]);
    return psstore_push_each(cl, slices, cl->nsub, timeout_ms);
}

fr_err_t psstore_push(psstore_client_t *cl, const psstore_grad_t *g, int timeout_ms)
{
    if (cl == NULL || g == NULL)
        return cl ? ps_fail(cl->c, FR_ERR_INVAL, "psstore_push: NULL argument") : FR_ERR_INVAL;
    if (g->n > 0 && (cl->any_length ? g->len == 0 : g->len != cl->nparams))
        return ps_fail(cl->c, FR_ERR_INVAL,
                       "push: gradient of %zu floats, model '%s' has %zu parameters", g->len,
                       cl->model, cl->nparams);
    if (cl->nsub > 0)
        return push_shards(cl, g, timeout_ms);
    fr_err_t err = ps_grad_encode(&cl->args, cl->key_grads, g);
    if (err == FR_ERR_INVAL)
        return ps_fail(cl->c, err, "push: %s", cl->args.text ? cl->args.text : "bad gradient");
    if (err != FR_OK)
        return ps_fail(cl->c, err, "push: out of memory");
    err = wait_for_room(cl, timeout_ms);
    if (err != FR_OK)
        return err;
    redisReply *r = ps_cmd_argv(cl->c, 0, cl->args.argc, cl->args.argv, cl->args.lens, &err);
    if (r == NULL)
        return err;
    snprintf(cl->last_id, sizeof(cl->last_id), "%.*s", r->str != NULL ? (int)r->len : 0,
             r->str != NULL ? r->str : "");
    freeReplyObject(r);
    cl->bytes += g->len * sizeof(float);
    return FR_OK;
}

/* One reply of a pipeline on c: an integer into *v (XLEN), or the id of
 * an XADD into id[64] (v NULL). */
static fr_err_t read_one(psstore_conn_t *c, long long *v, char *id)
{
    fr_err_t err;
    redisReply *r = ps_pipeline_read(c, &err);
    if (r == NULL)
        return err;
    if (v != NULL && r->type == REDIS_REPLY_INTEGER)
        *v = r->integer;
    else if (v == NULL && r->type == REDIS_REPLY_STRING)
        snprintf(id, 64, "%.*s", (int)r->len, r->str);
    else
        err = ps_fail(c, FR_ERR_REDIS, "push: unexpected reply%s%.200s",
                      r->type == REDIS_REPLY_ERROR ? ": " : "",
                      r->type == REDIS_REPLY_ERROR ? r->str : "");
    freeReplyObject(r);
    return err;
}

fr_err_t psstore_push_each(psstore_client_t *cl, const psstore_grad_t *parts, int n, int timeout_ms)
{
    psstore_client_t *sh[PSSTORE_SHARDS_MAX];
    fr_err_t first = FR_OK;
    int at = -1; /* the shard of the first error */
    if (n < 1 || n > PSSTORE_SHARDS_MAX)
        return ps_fail(cl->c, FR_ERR_INVAL, "push: %d parts", n);
    for (int k = 0; k < n; k++) {
        if ((sh[k] = psstore_client_shard(cl, k)) == NULL)
            return ps_fail(cl->c, FR_ERR_INVAL, "push: the model has no shard %d", k);
        const psstore_grad_t *g = &parts[k];
        if (g->n > 0 && (sh[k]->any_length ? g->len == 0 : g->len != sh[k]->nparams))
            return ps_fail(cl->c, FR_ERR_INVAL,
                           "push: shard %d: gradient of %zu floats, %zu parameters", k, g->len,
                           sh[k]->nparams);
        fr_err_t err = ps_grad_encode(&sh[k]->args, sh[k]->key_grads, g);
        if (err != FR_OK)
            return ps_fail(cl->c, err, "push: shard %d: %s", k,
                           err == FR_ERR_INVAL && sh[k]->args.text ? sh[k]->args.text
                                                                   : "bad gradient");
    }
    /* room: every shard's XLEN in flight at once; a full stream waits */
    long long pending[PSSTORE_SHARDS_MAX];
    int sent[PSSTORE_SHARDS_MAX];
    for (int k = 0; k < n; k++) {
        const char *argv[] = {"XLEN", sh[k]->key_grads};
        pending[k] = 0;
        sent[k] = ps_pipeline_append(sh[k]->c, 2, argv, NULL) == FR_OK &&
                  ps_pipeline_flush(sh[k]->c) == FR_OK;
    }
    for (int k = 0; k < n; k++) {
        fr_err_t err = sent[k] ? read_one(sh[k]->c, &pending[k], NULL) : FR_ERR_REDIS;
        /* a full stream waits; a broken connection asks again, reconnected */
        if (err != FR_OK || pending[k] >= sh[k]->max_pending)
            err = wait_for_room(sh[k], timeout_ms);
        if (err != FR_OK && first == FR_OK) {
            first = err;
            at = k;
        }
    }
    if (first != FR_OK)
        return sub_failed_at(cl, sh[at], at, first);
    /* the gradients: every XADD in flight at once. A failure leaves the
     * shards that added theirs holding it: the gap rule reads the batch
     * again and they drop it as a duplicate */
    for (int k = 0; k < n; k++)
        sent[k] = ps_pipeline_append(sh[k]->c, sh[k]->args.argc, sh[k]->args.argv,
                                     sh[k]->args.lens) == FR_OK &&
                  ps_pipeline_flush(sh[k]->c) == FR_OK;
    for (int k = 0; k < n; k++) {
        fr_err_t err = sent[k] ? read_one(sh[k]->c, NULL, sh[k]->last_id) : FR_ERR_REDIS;
        if (err == FR_OK)
            sh[k]->bytes += parts[k].len * sizeof(float);
        else if (first == FR_OK) {
            first = err;
            at = k;
        }
    }
    if (first != FR_OK)
        return sub_failed_at(cl, sh[at], at, first);
    /* the in-flight bound and the gap rule look up the last shard's entry */
    if (sh[n - 1] != cl)
        memcpy(cl->last_id, sh[n - 1]->last_id, sizeof(cl->last_id));
    return FR_OK;
}

void psstore_client_any_length(psstore_client_t *cl)
{
    cl->any_length = 1;
    for (int k = 0; k < cl->nsub; k++)
        cl->sub[k]->any_length = 1;
}

psstore_conn_t *psstore_client_conn(psstore_client_t *cl)
{
    return cl->c;
}

psstore_client_t *psstore_client_shard(psstore_client_t *cl, int k)
{
    if (cl->nsub == 0)
        return k == 0 ? cl : NULL;
    return k >= 0 && k < cl->nsub ? cl->sub[k] : NULL;
}

const char *psstore_client_last_id(const psstore_client_t *cl)
{
    return cl->last_id;
}

fr_err_t psstore_client_quarantine(psstore_client_t *cl, const psstore_range_t *pos, size_t n)
{
    return psstore_quarantine_add(cl->c, cl->model, pos, n);
}

/* ------------------------------------------------------------------------
 * Membership (docs/design.md "Membership")
 * ---------------------------------------------------------------------- */
fr_err_t psstore_member_beat(psstore_client_t *cl, const psstore_member_t *m)
{
    char val[128];
    int len = ps_member_format(m, val, sizeof(val));
    if (len < 0 || m->id[0] == '\0')
        return ps_fail(cl->c, FR_ERR_INVAL, "member: bad entry for '%s'", m->id);
    const char *argv[] = {"HSET", cl->key_members, m->id, val};
    size_t lens[] = {4, strlen(cl->key_members), strlen(m->id), (size_t)len};
    fr_err_t err;
    redisReply *r = ps_cmd_argv(cl->c, 1, 4, argv, lens, &err);
    freeReplyObject(r);
    return r == NULL ? err : FR_OK;
}

fr_err_t psstore_member_leave(psstore_client_t *cl, const char *id)
{
    const char *argv[] = {"HDEL", cl->key_members, id};
    size_t lens[] = {4, strlen(cl->key_members), strlen(id)};
    fr_err_t err;
    redisReply *r = ps_cmd_argv(cl->c, 1, 3, argv, lens, &err);
    freeReplyObject(r);
    return r == NULL ? err : FR_OK;
}

fr_err_t psstore_members_read(psstore_client_t *cl, psstore_member_t **members, size_t *n,
                              size_t *cap)
{
    return ps_members_read(cl->c, cl->key_members, members, n, cap);
}

fr_err_t psstore_round_read(psstore_client_t *cl, int group, int64_t *round)
{
    fr_err_t err;
    if (cl->nsub > 0) { /* rounds close per shard: a worker waits for all */
        int64_t least = INT64_MAX;
        for (int k = 0; k < cl->nsub; k++) {
            int64_t r = 0;
            if ((err = psstore_round_read(cl->sub[k], group, &r)) != FR_OK)
                return sub_failed(cl, k, err);
            least = r < least ? r : least;
        }
        *round = least;
        return FR_OK;
    }
    redisReply *r = ps_cmd(cl->c, 1, &err, "HGET %s %d", cl->key_rounds, group);
    if (r == NULL)
        return err;
    uint64_t u = 0;
    int64_t v = 0;
    if (r->type == REDIS_REPLY_NIL)
        v = 0;
    else if (reply_number(r, 1, &u, &v) != 0 || v < 0) {
        freeReplyObject(r);
        return ps_fail(cl->c, FR_ERR_REDIS, "redis: %s field %d is not a round count",
                       cl->key_rounds, group);
    }
    freeReplyObject(r);
    *round = v;
    return FR_OK;
}

/* The newest ids of the versions and drops streams: every commit that
 * applies or drops a gradient, or closes a round, adds to one of them. */
static fr_err_t last_commit_ids(psstore_client_t *cl, char (*ids)[PSSTORE_STREAM_ID_MAX])
{
    fr_err_t err = ps_stream_last_id(cl->c, cl->key_versions, ids[0]);
    return err != FR_OK ? err : ps_stream_last_id(cl->c, cl->key_drops, ids[1]);
}

/* Blocks up to block_ms (clamped to half the client's timeout) until either
 * stream has an entry after ids: a commit happened. */
static fr_err_t wait_commit(psstore_client_t *cl, char (*ids)[PSSTORE_STREAM_ID_MAX], int block_ms)
{
    fr_err_t err;
    if (block_ms < 1 || block_ms > CLIENT_TIMEOUT_MS / 2)
        block_ms = block_ms < 1 ? 1 : CLIENT_TIMEOUT_MS / 2;
    redisReply *r = ps_cmd(cl->c, 0, &err, "XREAD COUNT 1 BLOCK %d STREAMS %s %s %s %s", block_ms,
                           cl->key_versions, cl->key_drops, ids[0], ids[1]);
    if (r == NULL)
        return err;
    freeReplyObject(r);
    return FR_OK;
}

fr_err_t psstore_round_wait(psstore_client_t *cl, int group, int64_t round, int block_ms,
                            int64_t *now)
{
    /* the newest ids first, then the count: a round closed after these
     * reads adds an entry to one of the two streams (its version, or its
     * drops) in the transaction that counts it, and XREAD wakes on it */
    char ids[2][PSSTORE_STREAM_ID_MAX];
    fr_err_t err;
    for (int k = 0; k < cl->nsub; k++) {
        /* the first shard that has not closed round yet is the one to wait on */
        if ((err = psstore_round_wait(cl->sub[k], group, round, block_ms, now)) != FR_OK)
            return sub_failed(cl, k, err);
        if (*now <= round)
            return FR_OK;
    }
    if (cl->nsub > 0)
        return psstore_round_read(cl, group, now);
    if ((err = last_commit_ids(cl, ids)) != FR_OK ||
        (err = psstore_round_read(cl, group, now)) != FR_OK || *now > round ||
        (err = wait_commit(cl, ids, block_ms)) != FR_OK)
        return err;
    return psstore_round_read(cl, group, now);
}

/* Whether the grads stream no longer holds entry id (the applier deletes an
 * entry in the commit that decides it). */
static fr_err_t entry_gone(psstore_client_t *cl, const char *id, int *gone)
{
    fr_err_t err;
    redisReply *r = ps_cmd(cl->c, 0, &err, "XRANGE %s %s %s", cl->key_grads, id, id);
    if (r == NULL)
        return err;
    *gone = r->type == REDIS_REPLY_ARRAY && r->elements == 0;
    freeReplyObject(r);
    return FR_OK;
}

fr_err_t psstore_applied_wait(psstore_client_t *cl, const char *id, int block_ms, int *applied)
{
    char ids[2][PSSTORE_STREAM_ID_MAX];
    fr_err_t err;
    *applied = 0;
    if (id == NULL || id[0] == '\0') {
        *applied = 1;
        return FR_OK;
    }
    if (cl->nsub > 0) /* the id is the last shard's entry (push_shards) */
        return psstore_applied_wait(cl->sub[cl->nsub - 1], id, block_ms, applied);
    /* the common case first; then, as psstore_round_wait does, the newest
     * ids before a second look, so that a commit in between adds an entry
     * XREAD wakes on */
    if ((err = entry_gone(cl, id, applied)) != FR_OK || *applied ||
        (err = last_commit_ids(cl, ids)) != FR_OK || (err = entry_gone(cl, id, applied)) != FR_OK ||
        *applied || (err = wait_commit(cl, ids, block_ms)) != FR_OK)
        return err;
    return entry_gone(cl, id, applied);
}

fr_err_t psstore_phase_read(psstore_client_t *cl, psstore_phase_t *phase)
{
    fr_err_t err;
    if (cl->nsub > 0) /* every shard's applier runs the same mode; shard 0's phase */
        cl = cl->sub[0];
    redisReply *r = ps_cmd(cl->c, 0, &err, "HGET %s phase", cl->key_meta);
    if (r == NULL)
        return err;
    char name[16] = "";
    if (r->type == REDIS_REPLY_STRING)
        ps_reply_copy(name, sizeof(name), r);
    freeReplyObject(r);
    *phase = psstore_phase_parse(name);
    return FR_OK;
}
