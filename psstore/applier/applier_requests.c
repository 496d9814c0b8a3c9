/*
 * applier_requests.c - the operator requests the applier executes from
 * freshet:{m}:requests: rollback to a retained snapshot, a replay's rewind
 * of offsets, publishing a replay, and deleting the model. Each one commits
 * with the deletion of its request.
 * See docs/design.md "Replay" and docs/design.md "Snapshots and publishing".
 *
 * Thread: the applier's.
 */
#include <stdio.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/applier/applier_int.h"

/*
 * Parses a snapshot's offsets text ("topic/partition=value\n"...). With
 * apply set, replaces every partition's offsets with it; without, only
 * checks it, so a bad snapshot is refused before anything is touched.
 */
static fr_err_t snapshot_offsets(psstore_applier_t *a, const char *text, size_t len, int apply)
{
    if (apply) {
        for (size_t i = 0; i < a->nparts; i++)
            psstore_poff_fini(&a->parts[i].po);
        a->nparts = 0;
    }
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = nl ? nl : end;
        char topic[PSSTORE_TOPIC_MAX + 1], why[128];
        int32_t partition;
        size_t voff;
        if (psstore_keyval_parse(p, (size_t)(line_end - p), topic, sizeof(topic), &partition,
                                 &voff) != FR_OK)
            return FR_ERR_PARSE;
        psstore_partition_offsets_t check;
        psstore_poff_init(&check, 0);
        fr_err_t err =
            psstore_poff_parse(&check, p + voff, (size_t)(line_end - p) - voff, why, sizeof(why));
        if (err == FR_OK && apply) {
            part_t *part = ps_applier_find_part(a, topic, partition, 1);
            if (part == NULL) {
                err = FR_ERR_NOMEM;
            } else {
                psstore_poff_fini(&part->po);
                part->po = check; /* takes it over */
                part->dirty = 1;
                psstore_poff_init(&check, 0);
            }
        }
        psstore_poff_fini(&check);
        if (err != FR_OK)
            return err;
        p = nl ? nl + 1 : end;
    }
    return FR_OK;
}

/* Closes the open rounds and commits what is held, so that a request's
 * transaction writes nothing else; the caller goes on only while the lease
 * is still held (a->active). */
static fr_err_t commit_first(psstore_applier_t *a)
{
    fr_err_t err = ps_applier_rounds_close(a, 1);
    return err == FR_OK ? ps_applier_commit(a) : err;
}

/*
 * Restores retained snapshot v as version current + 1 of a new epoch, with
 * its weights, optimizer state and offsets, in one transaction that also
 * deletes the request. A snapshot that is not retained leaves everything
 * as it is (the request is deleted and the failure logged).
 */
static fr_err_t rollback(psstore_applier_t *a, int64_t v, const char *req_id)
{
    fr_err_t err = commit_first(a); /* what was applied before the request */
    if (err != FR_OK || !a->active)
        return err;
    char key[PS_KEY_MAX];
    ps_key_shard(key, a->model, "snap", v);
    redisReply *r = ps_cmd(a->c, 1, &err, "HMGET %s weights opt offsets avg", key);
    if (r == NULL)
        return err;
    int ok = r->type == REDIS_REPLY_ARRAY && r->elements == 4 &&
             r->element[0]->type == REDIS_REPLY_STRING &&
             r->element[0]->len == a->n * sizeof(float);
    const redisReply *offs = ok ? r->element[2] : NULL;
    int offs_ok = ok && (offs->type != REDIS_REPLY_STRING ||
                         snapshot_offsets(a, offs->str, offs->len, 0) == FR_OK);
    if (!ok || !offs_ok) {
        freeReplyObject(r);
        fr_log(FR_LOG_ERROR, "applier %s: rollback to %lld: %s", a->model, (long long)v,
               ok ? "the snapshot's offsets are malformed" : "no such retained snapshot");
        snprintf(a->req_id, sizeof(a->req_id), "%s", req_id);
        return ps_applier_commit(a); /* deletes the request, changes nothing else */
    }
    memcpy(a->w, r->element[0]->str, a->n * sizeof(float));
    memset(a->opt, 0, a->opt_len * sizeof(float));
    if (r->element[1]->type == REDIS_REPLY_STRING &&
        r->element[1]->len == a->opt_len * sizeof(float))
        memcpy(a->opt, r->element[1]->str, r->element[1]->len);
    /* the snapshot's served average when it kept one, else its weights */
    err = ps_applier_average_start(a, r->element[3]);
    if (err == FR_OK)
        err = offs->type == REDIS_REPLY_STRING ? snapshot_offsets(a, offs->str, offs->len, 1)
                                               : snapshot_offsets(a, "", 0, 1);
    freeReplyObject(r);
    if (err != FR_OK) {
        ps_applier_drop_state(a); /* out of memory half way: reload from Redis */
        return ps_fail(a->c, err, "rollback to %lld: out of memory", (long long)v);
    }
    a->epoch = fr_random_u64();
    a->version++;
    a->new_epoch = a->offsets_reset = a->weights_dirty = 1;
    a->stopped[0] = '\0';
    a->guard_pos = a->guard_fill = a->guard_bad = 0;
    snprintf(a->req_id, sizeof(a->req_id), "%s", req_id);
    psstore_ctl_reset(a->ctl);
    psstore_ctl_record(a->ctl, a->version, a->w);
    if (a->versions.len > 0)
        ps_buf_add(&a->versions, "\1", 1);
    ps_buf_kv(&a->versions, "version", "%lld", (long long)a->version);
    ps_buf_kv(&a->versions, "epoch", "%llu", (unsigned long long)a->epoch);
    ps_buf_kv(&a->versions, "rollback_from", "%lld", (long long)v);
    ps_buf_kv(&a->versions, "t", "%lld", (long long)fr_clock_unix_ms());
    fr_log(FR_LOG_INFO, "applier %s: rolled back to snapshot %lld as version %lld of epoch %llu",
           a->model, (long long)v, (long long)a->version, (unsigned long long)a->epoch);
    a->snap_version = a->version; /* the restored weights are a snapshot already */
    /* the restored offsets carry the generations of their time: a published
     * replay is withdrawn (its generation stays) so that no consumer
     * resolves it again on top of them */
    int64_t replay_gen = 0;
    if (psstore_replay_current(a->c, a->model, &replay_gen, NULL, 0, NULL) == FR_OK &&
        replay_gen > 0) {
        a->replay_gen = replay_gen;
        a->replay_spec = "";
        a->replay_when = "0";
    }
    return ps_applier_commit(a);
}

/*
 * A replay's rewrite: for each "topic/partition=target" the watermark moves
 * to target, every applied interval is cleared and the generation recorded,
 * in one transaction with the request's deletion.
 */
static fr_err_t rewind_offsets(psstore_applier_t *a, int64_t generation, const char *targets,
                               const char *req_id)
{
    fr_err_t err = commit_first(a);
    if (err != FR_OK || !a->active)
        return err;
    for (const char *p = targets; *p != '\0';) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *next = comma ? comma + 1 : p + len;
        const char *item = p;
        p = next;
        char topic[PSSTORE_TOPIC_MAX + 1];
        int32_t partition;
        int64_t target;
        if (psstore_target_parse(item, len, topic, sizeof(topic), &partition, &target) != FR_OK) {
            fr_log(FR_LOG_WARN, "applier %s: bad rewind target '%.*s' ignored", a->model,
                   (int)(len < 299 ? len : 299), item);
            continue;
        }
        part_t *part = ps_applier_find_part(a, topic, partition, 1);
        if (part == NULL)
            return ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
        if (generation <= part->po.generation) {
            fr_log(FR_LOG_WARN,
                   "applier %s: rewind of %s/%" PRId32 " with generation %lld ignored: the "
                   "partition is at generation %lld already (another owner rewrote it first)",
                   a->model, topic, partition, (long long)generation,
                   (long long)part->po.generation);
            continue;
        }
        psstore_poff_rewind(&part->po, target);
        part->po.generation = generation;
        part->dirty = 1;
        fr_log(FR_LOG_INFO, "applier %s: replay generation %lld rewinds %s/%" PRId32 " to %" PRId64,
               a->model, (long long)generation, topic, partition, target);
    }
    snprintf(a->req_id, sizeof(a->req_id), "%s", req_id);
    return ps_applier_commit(a);
}

/*
 * An operator's replay: published in meta under the next replay
 * generation, with the request's text, in one transaction with the
 * request's deletion. The consumers owning the partitions resolve it and
 * send the rewrites (rewind_offsets).
 */
static fr_err_t publish_replay(psstore_applier_t *a, const char *spec, const char *requested,
                               const char *req_id)
{
    fr_err_t err = commit_first(a);
    if (err != FR_OK || !a->active)
        return err;
    int64_t generation = 0;
    if ((err = psstore_replay_current(a->c, a->model, &generation, NULL, 0, NULL)) != FR_OK)
        return err;
    a->replay_gen = generation + 1;
    a->replay_spec = spec;
    a->replay_when = requested;
    snprintf(a->req_id, sizeof(a->req_id), "%s", req_id);
    err = ps_applier_commit(a);
    if (err == FR_OK)
        fr_log(FR_LOG_INFO, "applier %s: replay generation %lld published: %s", a->model,
               (long long)generation + 1, spec);
    a->replay_gen = 0; /* the texts belong to the request's reply */
    return err;
}

/* A sharded model's delete: nonzero once no shard's meta is left, so the
 * shard that deletes last removes the model's own keys (meta among them):
 * until then the model stays, and with it what the other shards need to
 * run their part of the request. */
static int last_shard_gone(psstore_applier_t *a)
{
    for (int k = 0; k < a->nshards; k++) {
        char tag[PS_TAG_MAX], meta[PS_KEY_MAX];
        fr_err_t err;
        ps_shard_tag(tag, a->name, k, a->nshards);
        ps_key(meta, tag, "meta");
        redisReply *r = ps_cmd(a->c, 1, &err, "EXISTS %s", meta);
        int exists = r == NULL || r->type != REDIS_REPLY_INTEGER || r->integer > 0;
        freeReplyObject(r);
        if (exists)
            return 0;
    }
    return 1;
}

/* Deletes every key of the model (the lease too) under the lease. */
static fr_err_t delete_model(psstore_applier_t *a)
{
    ps_keylist_t kl = {0};
    fr_err_t err = ps_model_keys(a->c, a->model, &kl);
    int ours = 0;
    if (err != FR_OK || (err = ps_applier_watch_lease(a, &ours)) != FR_OK || !ours) {
        ps_keylist_fini(&kl);
        if (err == FR_OK)
            ps_applier_fenced(a, "before delete");
        return err;
    }
    const char *multi[] = {"MULTI"}, *exec_cmd[] = {"EXEC"};
    size_t queued = 0;
    if ((err = ps_pipeline_append(a->c, 1, multi, NULL)) == FR_OK)
        queued++;
    if (err == FR_OK)
        err = ps_queue_unlink(a->c, &kl, &queued);
    if (err == FR_OK && (err = ps_pipeline_append(a->c, 1, exec_cmd, NULL)) == FR_OK)
        queued++;
    ps_keylist_fini(&kl);
    redisReply *exec = NULL;
    for (size_t i = 0; i < queued && a->c->ctx != NULL; i++) {
        fr_err_t rerr;
        redisReply *r = ps_pipeline_read(a->c, &rerr); /* every reply, error replies too */
        if (i == queued - 1)
            exec = r;
        else
            freeReplyObject(r);
    }
    if (err != FR_OK || a->c->ctx == NULL) {
        freeReplyObject(exec);
        ps_applier_drop_state(a); /* unknown whether EXEC ran: reload */
        return err != FR_OK ? err : FR_ERR_REDIS;
    }
    int done = exec != NULL && exec->type == REDIS_REPLY_ARRAY;
    freeReplyObject(exec);
    if (!done) {
        ps_applier_fenced(a, "at delete");
        return FR_OK;
    }
    fr_log(FR_LOG_WARN, "applier %s: model deleted on request", a->model);
    if (a->nshards > 1 && last_shard_gone(a) && ps_unlink_tag(a->c, a->name) != FR_OK)
        fr_log(FR_LOG_WARN, "applier %s: deleting the model's own keys: %s", a->model,
               psstore_conn_error(a->c));
    ps_applier_drop_state(a);
    return FR_OK;
}

/* Executes the requests waiting in freshet:{m}:requests, oldest first. */
fr_err_t ps_applier_run_requests(psstore_applier_t *a)
{
    fr_err_t err;
    ps_applier_step_pause(a); /* pushers may step in during the round trip */
    redisReply *r = ps_cmd(a->c, 1, &err, "XRANGE %s - + COUNT 16", a->k_req);
    ps_applier_step_resume(a);
    if (r == NULL)
        return err;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements && a->active; i++) {
        const redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
            e->element[1]->type != REDIS_REPLY_ARRAY)
            continue;
        char id[64], type[32] = "", version[32] = "", generation[32] = "", requested[32] = "";
        const char *targets = "", *spec = "";
        ps_reply_str(e->element[0], id, sizeof(id));
        const redisReply *kv = e->element[1];
        for (size_t f = 0; f + 1 < kv->elements; f += 2) {
            if (strcmp(kv->element[f]->str, "type") == 0)
                ps_reply_str(kv->element[f + 1], type, sizeof(type));
            else if (strcmp(kv->element[f]->str, "version") == 0)
                ps_reply_str(kv->element[f + 1], version, sizeof(version));
            else if (strcmp(kv->element[f]->str, "generation") == 0)
                ps_reply_str(kv->element[f + 1], generation, sizeof(generation));
            else if (strcmp(kv->element[f]->str, "targets") == 0 &&
                     kv->element[f + 1]->type == REDIS_REPLY_STRING)
                targets = kv->element[f + 1]->str;
            else if (strcmp(kv->element[f]->str, "spec") == 0 &&
                     kv->element[f + 1]->type == REDIS_REPLY_STRING)
                spec = kv->element[f + 1]->str;
            else if (strcmp(kv->element[f]->str, "requested") == 0)
                ps_reply_str(kv->element[f + 1], requested, sizeof(requested));
        }
        if (strcmp(type, "rollback") == 0 && version[0] != '\0') {
            err = rollback(a, strtoll(version, NULL, 10), id);
        } else if (strcmp(type, "rewind") == 0 && generation[0] != '\0') {
            err = rewind_offsets(a, strtoll(generation, NULL, 10), targets, id);
        } else if (strcmp(type, "replay") == 0 && spec[0] != '\0') {
            err = publish_replay(a, spec, requested[0] != '\0' ? requested : "0", id);
        } else if (strcmp(type, "delete") == 0) {
            err = delete_model(a);
        } else if (strcmp(type, "snapshot") == 0 && version[0] != '\0' && a->shard > 0) {
            /* shard 0 took snapshot `version`: this shard's, under the same
             * id, in the commit that deletes the request */
            if ((err = commit_first(a)) == FR_OK && a->active) {
                a->snap_req = strtoll(version, NULL, 10);
                snprintf(a->req_id, sizeof(a->req_id), "%s", id);
                err = ps_applier_commit(a);
            }
        } else {
            fr_log(FR_LOG_WARN, "applier %s: unknown request '%s' (%s) deleted", a->model, type,
                   id);
            snprintf(a->req_id, sizeof(a->req_id), "%s", id);
            err = ps_applier_commit(a);
        }
        if (err != FR_OK)
            break;
    }
    freeReplyObject(r);
    return err;
}
