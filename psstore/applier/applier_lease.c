/*
 * applier_lease.c - the lease and the state behind it: taking the lease
 * and loading weights, offsets and snapshots, renewing it, fencing when it
 * is lost, the guarded writes to meta, and the divergence guard that stops
 * a model whose gradients go non-finite.
 * See docs/design.md "One writer and fencing" and docs/design.md "Epochs".
 *
 * Thread: the applier's.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "psstore/applier/applier_sparse.h"

/*
 * This process's machine and pid namespace, "<boot id, 32 hex>.<pid
 * namespace inode>", into out[size] ("" when /proc does not tell): two tokens with
 * the same host name and scope name processes that kill(2) can see.
 */
void ps_applier_scope(char *out, size_t size)
{
    char boot[64] = "", ns[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        if (fgets(boot, sizeof(boot), f) == NULL)
            boot[0] = '\0';
        fclose(f);
    }
    char *w = boot; /* the boot id's 32 hex digits, without dashes */
    for (const char *r = boot; *r != '\0' && *r != '\n'; r++)
        if (*r != '-')
            *w++ = *r;
    *w = '\0';
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
    ns[n > 0 ? n : 0] = '\0';
    const char *ino = strchr(ns, '[');
    if (boot[0] == '\0' || ino == NULL) {
        out[0] = '\0';
        return;
    }
    snprintf(out, size, "%s.%.*s", boot, (int)strcspn(ino + 1, "]"), ino + 1);
}

/* Splits a token host/pid/random/scope: its pid, host (the part before the
 * first '/') and scope (after the last); 0, or -1 for another shape. */
static int token_parts(const char *token, long *pid, const char **host, size_t *hostlen,
                       const char **scope)
{
    const char *slash = strchr(token, '/'), *last = strrchr(token, '/');
    if (slash == NULL || last == slash)
        return -1;
    char *end;
    errno = 0;
    *pid = strtol(slash + 1, &end, 10);
    if (errno != 0 || *end != '/' || *pid <= 0)
        return -1;
    *host = token;
    *hostlen = (size_t)(slash - token);
    *scope = last + 1;
    return 0;
}

/*
 * 1 when the lease's holder is a process of this machine and pid namespace
 * (same host name and scope in the token) that no longer exists: a crashed
 * applier whose lease would otherwise run out its time. A pid reused since
 * counts as alive, which only means waiting for the expiry.
 */
static int holder_dead(const psstore_applier_t *a, const char *holder)
{
    long mine, theirs;
    const char *h1, *h2, *s1, *s2;
    size_t l1, l2;
    if (token_parts(a->token, &mine, &h1, &l1, &s1) != 0 ||
        token_parts(holder, &theirs, &h2, &l2, &s2) != 0)
        return 0;
    if (s1[0] == '\0' || strcmp(s1, s2) != 0 || l1 != l2 || memcmp(h1, h2, l1) != 0 ||
        theirs == mine)
        return 0;
    return kill((pid_t)theirs, 0) == -1 && errno == ESRCH;
}

/* Replaces the lease of a dead holder with ours, if it is still theirs
 * (compare-and-set); *got = 1 when it is ours now. */
static fr_err_t take_from_dead(psstore_applier_t *a, const char *holder, int *got)
{
    static const char script[] = "if redis.call('GET', KEYS[1]) == ARGV[1] then "
                                 "return redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end "
                                 "return false";
    char ms[32];
    snprintf(ms, sizeof(ms), "%lld", (long long)a->conf.lease_ms);
    fr_err_t err;
    redisReply *r =
        ps_cmd(a->c, 0, &err, "EVAL %s 1 %s %s %s %s", script, a->k_lease, holder, a->token, ms);
    if (r == NULL)
        return err;
    *got = r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (*got)
        fr_log(FR_LOG_WARN,
               "applier %s: the lease's holder %s is dead (this machine, no such process): "
               "taking the lease without waiting for it to expire",
               a->model, holder);
    return FR_OK;
}

/* A reply's string as a NUL-terminated copy in out (truncated to size). */
void ps_reply_str(const redisReply *r, char *out, size_t size)
{
    out[0] = '\0';
    if (r != NULL && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS))
        snprintf(out, size, "%.*s", (int)r->len, r->str);
    else if (r != NULL && r->type == REDIS_REPLY_INTEGER)
        snprintf(out, size, "%lld", r->integer);
}

/*
 * HSET meta field value [field value] only while this applier holds the
 * lease (a Lua script checks the token), so a stalled applier that lost the
 * lease cannot change its successor's epoch or stop its model. Returns
 * FR_OK with *done = 0 when the lease is someone else's.
 */
fr_err_t ps_applier_meta_set(psstore_applier_t *a, int *done, const char *f1, const char *v1,
                             const char *f2, const char *v2)
{
    static const char *script = "if redis.call('GET', KEYS[1]) == ARGV[1] then "
                                "redis.call('HSET', KEYS[2], unpack(ARGV, 2)) return 1 end "
                                "return 0";
    const char *argv[] = {"EVAL", script, "2", a->k_lease, a->k_meta, a->token, f1, v1, f2, v2};
    fr_err_t err;
    redisReply *r = ps_cmd_argv(a->c, 0, f2 ? 10 : 8, argv, NULL, &err);
    if (r == NULL)
        return err;
    *done = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    return FR_OK;
}

/* Reads meta: the epoch (none: the model does not exist), the divergence
 * guard's stop, and the run_id of the Redis that set the epoch into
 * meta_run[size]. */
static fr_err_t load_meta(psstore_applier_t *a, char *meta_run, size_t size)
{
    fr_err_t err;
    char epoch_s[32] = "", stopped[256] = "";
    meta_run[0] = '\0';
    redisReply *r = ps_cmd(a->c, 1, &err, "HMGET %s epoch redis_run_id stopped", a->k_meta);
    if (r == NULL)
        return err;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 3) {
        ps_reply_str(r->element[0], epoch_s, sizeof(epoch_s));
        ps_reply_str(r->element[1], meta_run, size);
        ps_reply_str(r->element[2], stopped, sizeof(stopped));
    }
    freeReplyObject(r);
    if (epoch_s[0] == '\0')
        return ps_fail(a->c, FR_ERR_NOTFOUND, "model '%s' does not exist", a->model);
    a->epoch = strtoull(epoch_s, NULL, 10);
    snprintf(a->stopped, sizeof(a->stopped), "%s", stopped);
    return FR_OK;
}

/* Reads the weights (their length is n), the optimizer state, the served
 * average and the version. */
static fr_err_t load_weights(psstore_applier_t *a)
{
    fr_err_t err;
    redisReply *r = ps_cmd(a->c, 1, &err, "GET %s", a->k_w);
    if (r == NULL)
        return err;
    if (r->type != REDIS_REPLY_STRING || r->len == 0 || r->len % 4 != 0) {
        freeReplyObject(r);
        return ps_fail(a->c, FR_ERR_PARSE, "model '%s': weights missing or not float32", a->model);
    }
    a->n = r->len / 4;
    a->opt_len = psstore_optim_state_len(a->conf.ctl.optim, a->n);
    if (a->sp != NULL) {
        /* a sparse model's w is its dense part on shard 0 (the bias and the
         * tower: sparse_dense_step's state), one float held at 0 elsewhere */
        size_t want = a->shard == 0 ? sparse_dense_len(&a->sp->spec) : 1;
        if (a->n != want) {
            freeReplyObject(r);
            return ps_fail(a->c, FR_ERR_PARSE,
                           "model '%s': w:0 of shard %d holds %zu floats; its table wants %zu "
                           "(shard 0: the biases and the tower; past it: one)",
                           a->model, a->shard, a->n, want);
        }
        a->opt_len = a->shard == 0 ? sparse_dense_state_len(&a->sp->spec) : 2;
    }
    if (a->conf.requests_only)
        a->opt_len = a->n; /* kept verbatim from snapshots: room for any optimizer */
    a->w = malloc(a->n * sizeof(float));
    a->g = malloc(a->n * sizeof(float));
    a->opt = calloc(a->opt_len ? a->opt_len : 1, sizeof(float));
    if (a->w == NULL || a->g == NULL || a->opt == NULL) {
        freeReplyObject(r);
        return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
    }
    memcpy(a->w, r->str, r->len);
    freeReplyObject(r);

    r = ps_cmd(a->c, 1, &err, "GET %s", a->k_opt);
    if (r == NULL)
        return err;
    if (r->type == REDIS_REPLY_STRING && r->len == a->opt_len * sizeof(float))
        memcpy(a->opt, r->str, r->len);
    else if (r->type == REDIS_REPLY_STRING && r->len != 0)
        fr_log(FR_LOG_WARN, "applier %s: optimizer state of %zu bytes does not fit %s; zeroed",
               a->model, (size_t)r->len, psstore_optim_name(a->conf.ctl.optim));
    freeReplyObject(r);

    r = ps_cmd(a->c, 1, &err, "GET %s", a->k_avg);
    if (r == NULL)
        return err;
    err = ps_applier_average_start(a, r);
    freeReplyObject(r);
    if (err != FR_OK)
        return err;

    r = ps_cmd(a->c, 1, &err, "GET %s", a->k_ver);
    if (r == NULL)
        return err;
    char ver[32];
    ps_reply_str(r, ver, sizeof(ver));
    freeReplyObject(r);
    a->version = a->committed = strtoll(ver, NULL, 10);
    return FR_OK;
}

/* Reads the offsets of every partition and the retained snapshots. */
static fr_err_t load_offsets(psstore_applier_t *a)
{
    fr_err_t err;
    redisReply *r = ps_cmd(a->c, 1, &err, "HGETALL %s", a->k_off);
    if (r == NULL)
        return err;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2) {
        part_t *p = NULL;
        char key[272], topic[PSSTORE_TOPIC_MAX + 1];
        int32_t partition;
        ps_reply_str(r->element[i], key, sizeof(key));
        if (psstore_key_parse(key, strlen(key), topic, sizeof(topic), &partition) == FR_OK)
            p = ps_applier_find_part(a, topic, partition, 1);
        char why[128];
        if (p == NULL || psstore_poff_parse(&p->po, r->element[i + 1]->str, r->element[i + 1]->len,
                                            why, sizeof(why)) != FR_OK) {
            freeReplyObject(r);
            return ps_fail(a->c, FR_ERR_PARSE, "model '%s': bad offsets entry '%s'", a->model, key);
        }
    }
    freeReplyObject(r);

    r = ps_cmd(a->c, 1, &err, "ZRANGE %s 0 -1", a->k_snaps);
    if (r == NULL)
        return err;
    a->nsnaps = 0;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements && i < MAX_SNAPS; i++)
        a->snaps[a->nsnaps++] = strtoll(r->element[i]->str, NULL, 10);
    freeReplyObject(r);
    a->snap_version = a->nsnaps ? a->snaps[a->nsnaps - 1] : a->version;
    a->snap_ns = fr_clock_mono_ns();
    return FR_OK;
}

/* Starts a new epoch, written under the lease with run_id, the Redis that
 * holds it now. */
static fr_err_t new_epoch(psstore_applier_t *a, const char *run_id)
{
    fr_err_t err;
    uint64_t epoch = fr_random_u64();
    char epoch_s[32];
    int done = 0;
    snprintf(epoch_s, sizeof(epoch_s), "%llu", (unsigned long long)epoch);
    if ((err = ps_applier_meta_set(a, &done, "epoch", epoch_s, "redis_run_id", run_id)) != FR_OK)
        return err;
    if (!done)
        return ps_fail(a->c, FR_ERR_STATE, "model '%s': lease lost while taking over", a->model);
    fr_log(FR_LOG_WARN,
           "applier %s: the Redis serving the model changed (restart, fail-over or slot "
           "migration: its run_id differs): new epoch %llu at version %lld",
           a->model, (unsigned long long)epoch, (long long)a->version);
    a->epoch = epoch;
    psstore_ctl_reset(a->ctl);
    psstore_ctl_record(a->ctl, a->version, a->w);
    return FR_OK;
}

/*
 * Loads weights, optimizer state, version, offsets and snapshots from Redis
 * after taking the lease. Starts a new epoch when Redis restarted since the
 * model's epoch was set (its run_id changed): acknowledged writes may have
 * been lost, so a version number may be reissued.
 */
static fr_err_t load_state(psstore_applier_t *a)
{
    fr_err_t err;
    char run_id[64], meta_run[64];
    if ((err = ps_server_run_id(a->c, a->k_meta, run_id, sizeof(run_id))) != FR_OK ||
        (err = load_meta(a, meta_run, sizeof(meta_run))) != FR_OK ||
        (err = load_weights(a)) != FR_OK || (err = load_offsets(a)) != FR_OK)
        return err;

    char errstr[256];
    a->ctl = psstore_ctl_new(&a->conf.ctl, a->n, errstr, sizeof(errstr));
    if (a->ctl == NULL)
        return ps_fail(a->c, FR_ERR_INVAL, "%s", errstr);
    psstore_ctl_record(a->ctl, a->version, a->w);

    /* the group sees every entry ever pushed: created at id 0 */
    redisReply *r = ps_cmd(a->c, 1, &err, "XGROUP CREATE %s %s 0 MKSTREAM", a->k_grads, GROUP);
    if (r == NULL && strstr(psstore_conn_error(a->c), "BUSYGROUP") == NULL)
        return err;
    freeReplyObject(r);

    /* the mode this applier runs, for operators (serve's metadata) */
    int shown = 0;
    if ((err = ps_applier_meta_set(a, &shown, "mode", psstore_mode_name(a->conf.mode), NULL,
                                   NULL)) != FR_OK)
        return err;
    /* Redis restarted (or the model came from elsewhere): a new epoch */
    return strcmp(run_id, meta_run) != 0 ? new_epoch(a, run_id) : FR_OK;
}

/*
 * Claims every entry pending on other consumers of the group (a dead or
 * stalled applier's) so this applier applies them; rule 1 discards any whose
 * positions were applied already.
 */
fr_err_t ps_applier_claim_pending(psstore_applier_t *a, long long min_idle_ms)
{
    char start[64] = "0-0";
    for (int rounds = 0; rounds < 10000; rounds++) {
        fr_err_t err;
        redisReply *r = ps_cmd(a->c, 0, &err, "XAUTOCLAIM %s %s %s %lld %s COUNT 1000 JUSTID",
                               a->k_grads, GROUP, a->token, min_idle_ms, start);
        if (r == NULL)
            return err;
        if (r->type != REDIS_REPLY_ARRAY || r->elements < 2) {
            freeReplyObject(r);
            return FR_OK;
        }
        ps_reply_str(r->element[0], start, sizeof(start));
        freeReplyObject(r);
        if (strcmp(start, "0-0") == 0)
            return FR_OK;
    }
    return FR_OK;
}

/* Takes the lease when it is free and loads the state behind it. */
fr_err_t ps_applier_try_acquire(psstore_applier_t *a)
{
    fr_err_t err;
    redisReply *r = ps_cmd(a->c, 1, &err, "EXISTS %s", a->k_meta);
    if (r == NULL)
        return err;
    int exists = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    if (!exists)
        return FR_OK; /* deleted (or not yet created): nothing to hold */
    r = ps_cmd(a->c, 0, &err, "SET %s %s NX PX %lld", a->k_lease, a->token,
               (long long)a->conf.lease_ms);
    if (r == NULL)
        return err;
    int got = r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (!got) {
        /* still ours after an error made us drop the state? then reload;
         * a crashed holder on this machine: take it now */
        r = ps_cmd(a->c, 1, &err, "GET %s", a->k_lease);
        if (r == NULL)
            return err;
        char holder[sizeof(a->token)] = "";
        ps_reply_str(r, holder, sizeof(holder));
        freeReplyObject(r);
        got = strcmp(holder, a->token) == 0;
        if (!got && holder_dead(a, holder) && (err = take_from_dead(a, holder, &got)) != FR_OK)
            return err;
        if (!got)
            return FR_OK;
    }
    a->active = 1;
    a->renew_ns = fr_clock_mono_ns();
    fr_series_add(a->m_takeovers, 1);
    fr_series_set(a->m_updated, (double)fr_clock_unix_ms() * 1e-3);
    if ((err = load_state(a)) != FR_OK || (err = ps_sparse_load(a)) != FR_OK ||
        (err = ps_applier_claim_pending(a, 0)) != FR_OK) {
        fr_log(FR_LOG_ERROR, "applier %s: taking over failed: %s", a->model,
               psstore_conn_error(a->c));
        ps_applier_drop_state(a);
        return err;
    }
    ps_sparse_ready(a->sp, 1);
    a->read_own_pending = 1;
    snprintf(a->pending_from, sizeof(a->pending_from), "0");
    a->reconnects = a->c->reconnects;
    a->claim_ns = fr_clock_mono_ns();
    fr_log(FR_LOG_INFO,
           "applier %s: holding the lease (%s) at version %lld of epoch %llu, committing every "
           "%lld ms",
           a->model, a->token, (long long)a->version, (unsigned long long)a->epoch,
           (long long)a->conf.commit_ms);
    if (a->local != NULL && a->stopped[0] == '\0') {
        memset(a->local_rounds, 0, sizeof(a->local_rounds));
        ps_local_open(a->local, a->w, a->epoch, a->version);
    }
    ps_applier_stats_update(a);
    return FR_OK;
}

/* The lease was lost: forget everything and go back to standby. */
void ps_applier_fenced(psstore_applier_t *a, const char *when)
{
    fr_log(FR_LOG_WARN,
           "applier %s: lease lost (%s): discarding %zu uncommitted gradients, standing by",
           a->model, when, a->nids);
    pthread_mutex_lock(&a->lock);
    a->stats.fenced++;
    pthread_mutex_unlock(&a->lock);
    fr_series_add(a->m_fenced, 1);
    ps_applier_drop_state(a);
}

/* Extends the lease when a third of it has passed without a commit. */
fr_err_t ps_applier_renew(psstore_applier_t *a)
{
    static const char *script = "if redis.call('GET', KEYS[1]) == ARGV[1] then "
                                "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";
    uint64_t now = fr_clock_mono_ns();
    if ((now - a->renew_ns) < (uint64_t)a->conf.lease_ms * 1000000ull / 3)
        return FR_OK;
    fr_err_t err;
    redisReply *r = ps_cmd(a->c, 1, &err, "EVAL %s 1 %s %s %lld", script, a->k_lease, a->token,
                           (long long)a->conf.lease_ms);
    if (r == NULL)
        return err;
    int ok = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    if (!ok)
        ps_applier_fenced(a, "renewal");
    else
        a->renew_ns = now;
    return FR_OK;
}
/*
 * WATCH lease and GET it in one pipelined round trip: from here on a change
 * of lease fails EXEC. *ours = 0 (and UNWATCH sent) when another applier
 * holds it. A lost connection is an error: a reconnect would drop the WATCH.
 */
fr_err_t ps_applier_watch_lease(psstore_applier_t *a, int *ours)
{
    const char *watch[] = {"WATCH", a->k_lease}, *get[] = {"GET", a->k_lease};
    fr_err_t err = ps_pipeline_append(a->c, 2, watch, NULL);
    if (err == FR_OK)
        err = ps_pipeline_append(a->c, 2, get, NULL);
    if (err != FR_OK)
        return err;
    fr_err_t e1, e2;
    redisReply *w = ps_pipeline_read(a->c, &e1);
    redisReply *r = a->c->ctx != NULL ? ps_pipeline_read(a->c, &e2) : NULL;
    *ours =
        w != NULL && r != NULL && r->type == REDIS_REPLY_STRING && strcmp(r->str, a->token) == 0;
    freeReplyObject(w);
    freeReplyObject(r);
    if (a->c->ctx == NULL)
        return FR_ERR_REDIS;
    if (!*ours)
        freeReplyObject(ps_cmd(a->c, 0, &err, "UNWATCH"));
    return FR_OK;
}

/* ---- the divergence guard ------------------------------------------------------------ */

void ps_applier_guard_record(psstore_applier_t *a, int bad)
{
    if (a->guard_fill == GUARD_WINDOW)
        a->guard_bad -= a->guard[a->guard_pos];
    else
        a->guard_fill++;
    a->guard[a->guard_pos] = (uint8_t)bad;
    a->guard_bad += bad;
    a->guard_pos = (a->guard_pos + 1) % GUARD_WINDOW;
    /* the window counts its bad gradients: at most as many as it holds */
    FR_ASSERT(bad == 0 || bad == 1);
    FR_ASSERT(a->guard_bad >= 0 && a->guard_bad <= a->guard_fill && a->guard_fill <= GUARD_WINDOW);
    if (a->guard_bad * 100 > GUARD_MAX_BAD * GUARD_WINDOW && a->stopped[0] == '\0') {
        char reason[128];
        snprintf(reason, sizeof(reason), "%d of the last %d gradients were non-finite",
                 a->guard_bad, a->guard_fill);
        ps_applier_stop_model(a, reason);
    }
}

/* Writes meta.stopped = a->stopped under the lease. */
static void stop_write(psstore_applier_t *a)
{
    int done = 0;
    if (ps_applier_meta_set(a, &done, "stopped", a->stopped, NULL, NULL) == FR_OK && !done)
        ps_applier_fenced(a, "stopping the model");
    ps_applier_stats_update(a);
}

/* Writes meta.stopped = reason under the lease (the divergence guard). In
 * a pusher's step (psstore_local_push_help) the model stops at once and
 * the write waits for the applier's thread (ps_applier_stop_write). */
void ps_applier_stop_model(psstore_applier_t *a, const char *reason)
{
    snprintf(a->stopped, sizeof(a->stopped), "%s", reason);
    fr_log(FR_LOG_ERROR, "applier %s: divergence guard: %s; applying stopped", a->model, reason);
    if (a->local != NULL)
        ps_local_close(a->local); /* workers wait on the stream's bound */
    if (a->in_help) {
        a->stop_write_due = 1;
        ps_applier_stats_update(a);
        return;
    }
    stop_write(a);
}

void ps_applier_stop_write(psstore_applier_t *a)
{
    if (!a->stop_write_due || !a->active)
        return;
    a->stop_write_due = 0;
    stop_write(a);
}
