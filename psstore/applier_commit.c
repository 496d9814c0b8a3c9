/*
 * applier_commit.c - the applier's commit: everything applied or dropped
 * since the last one, written in ONE MULTI/EXEC transaction guarded by
 * WATCH lease (docs/design.md "One writer and fencing"): weights, optimizer
 * state, version, offsets, the versions, drops and audit streams, a due
 * snapshot, the rounds closed and the XACK/XDEL of the consumed entries.
 * A nil EXEC means the lease was lost: the state is dropped.
 *
 * Thread: the applier's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/applier_int.h"

/* An argv under construction for one command of the transaction. */
typedef struct cmd {
    const char **argv;
    size_t *lens;
    int argc, cap;
} cmd_t;

static int cmd_add(cmd_t *c, const char *p, size_t len)
{
    if (c->argc == c->cap) {
        int cap = c->cap ? 2 * c->cap : 32;
        const char **av = realloc(c->argv, (size_t)cap * sizeof(*av));
        size_t *lv = realloc(c->lens, (size_t)cap * sizeof(*lv));
        if (av != NULL)
            c->argv = av;
        if (lv != NULL)
            c->lens = lv;
        if (av == NULL || lv == NULL)
            return -1;
        c->cap = cap;
    }
    c->argv[c->argc] = p;
    c->lens[c->argc++] = len;
    return 0;
}

static int cmd_adds(cmd_t *c, const char *s)
{
    return cmd_add(c, s, strlen(s));
}

/* Sends c and resets it; counts the command for the reply read-back. */
static fr_err_t cmd_send(psstore_applier_t *a, cmd_t *c, int *queued)
{
    fr_err_t err = ps_pipeline_append(a->c, c->argc, c->argv, c->lens);
    c->argc = 0;
    if (err == FR_OK)
        (*queued)++;
    return err;
}

/* Queues XADD key [MAXLEN ~ keep] * f v ... for every entry in b. */
static fr_err_t queue_entries(psstore_applier_t *a, cmd_t *c, const char *key, buf_t *b,
                              long long keep, int *queued)
{
    char keep_s[32];
    snprintf(keep_s, sizeof(keep_s), "%lld", keep);
    size_t pos = 0;
    while (pos < b->len) {
        cmd_adds(c, "XADD");
        cmd_adds(c, key);
        if (keep > 0) {
            cmd_adds(c, "MAXLEN");
            cmd_adds(c, "~");
            cmd_adds(c, keep_s);
        }
        cmd_adds(c, "*");
        while (pos < b->len && b->p[pos] != '\1') {
            size_t len = strlen(b->p + pos);
            cmd_add(c, b->p + pos, len);
            pos += len + 1;
        }
        pos++; /* the \1 between entries */
        fr_err_t err = cmd_send(a, c, queued);
        if (err != FR_OK)
            return err;
    }
    return FR_OK;
}

/* Nonzero when a snapshot is due with this commit. */
static int snapshot_due(const psstore_applier_t *a)
{
    if (!a->weights_dirty || a->version <= a->snap_version)
        return 0;
    if (a->conf.snapshot_every > 0 && a->version - a->snap_version >= a->conf.snapshot_every)
        return 1;
    return a->conf.snapshot_seconds > 0 &&
           (double)(fr_clock_mono_ns() - a->snap_ns) * 1e-9 >= a->conf.snapshot_seconds;
}

/* "key=value\n" for every partition: the offsets of a snapshot. */
static fr_err_t offsets_text(psstore_applier_t *a, buf_t *out)
{
    out->len = 0;
    for (size_t i = 0; i < a->nparts; i++) {
        char *text;
        size_t len;
        if (psstore_poff_format(&a->parts[i].po, &text, &len) != FR_OK)
            return FR_ERR_NOMEM;
        int bad = ps_buf_add(out, a->parts[i].key, strlen(a->parts[i].key)) ||
                  ps_buf_add(out, "=", 1) || ps_buf_add(out, text, len) || ps_buf_add(out, "\n", 1);
        free(text);
        if (bad)
            return FR_ERR_NOMEM;
    }
    return FR_OK;
}

/* Queues the snapshot of the current version and the trimming of old ones. */
static fr_err_t queue_snapshot(psstore_applier_t *a, cmd_t *c, buf_t *offs, int *queued,
                               char (*nums)[32])
{
    char snap_key[PS_KEY_MAX];
    ps_key_shard(snap_key, a->model, "snap", a->version);
    fr_err_t err = offsets_text(a, offs);
    if (err != FR_OK)
        return err;
    snprintf(nums[0], 32, "%llu", (unsigned long long)a->epoch);
    snprintf(nums[1], 32, "%lld", (long long)a->version);
    snprintf(nums[2], 32, "%lld", (long long)fr_clock_unix_ms());
    snprintf(nums[3], 32, "%.9g", a->last_loss);
    cmd_adds(c, "HSET");
    cmd_adds(c, snap_key);
    cmd_adds(c, "weights");
    cmd_add(c, (const char *)a->w, a->n * sizeof(float));
    cmd_adds(c, "opt");
    cmd_add(c, (const char *)a->opt, a->opt_len * sizeof(float));
    cmd_adds(c, "offsets");
    cmd_add(c, offs->p ? offs->p : "", offs->len);
    cmd_adds(c, "epoch");
    cmd_adds(c, nums[0]);
    cmd_adds(c, "version");
    cmd_adds(c, nums[1]);
    cmd_adds(c, "time");
    cmd_adds(c, nums[2]);
    cmd_adds(c, "loss");
    cmd_adds(c, nums[3]);
    if ((err = cmd_send(a, c, queued)) != FR_OK)
        return err;
    cmd_adds(c, "ZADD");
    cmd_adds(c, a->k_snaps);
    cmd_adds(c, nums[2]);
    cmd_adds(c, nums[1]);
    if ((err = cmd_send(a, c, queued)) != FR_OK)
        return err;
    size_t excess = a->nsnaps + 1 > (size_t)a->conf.snapshot_retain
                        ? a->nsnaps + 1 - (size_t)a->conf.snapshot_retain
                        : 0;
    for (size_t i = 0; i < excess && i < 8; i++) {
        char old_key[PS_KEY_MAX];
        ps_key_shard(old_key, a->model, "snap", a->snaps[i]);
        snprintf(nums[4 + i], 32, "%lld", (long long)a->snaps[i]);
        cmd_adds(c, "DEL");
        cmd_adds(c, old_key);
        if ((err = cmd_send(a, c, queued)) != FR_OK)
            return err;
        cmd_adds(c, "ZREM");
        cmd_adds(c, a->k_snaps);
        cmd_adds(c, nums[4 + i]);
        if ((err = cmd_send(a, c, queued)) != FR_OK)
            return err;
    }
    snprintf(nums[12], 32, "%llu-v%lld", (unsigned long long)a->epoch, (long long)a->version);
    cmd_adds(c, "PUBLISH");
    cmd_adds(c, a->k_pub);
    cmd_adds(c, nums[12]);
    return cmd_send(a, c, queued);
}

/* After a committed snapshot: the in-memory list follows the store's. */
static void snapshot_done(psstore_applier_t *a)
{
    size_t excess = a->nsnaps + 1 > (size_t)a->conf.snapshot_retain
                        ? a->nsnaps + 1 - (size_t)a->conf.snapshot_retain
                        : 0;
    if (excess > 8)
        excess = 8;
    memmove(a->snaps, a->snaps + excess, (a->nsnaps - excess) * sizeof(int64_t));
    a->nsnaps -= excess;
    if (a->nsnaps < MAX_SNAPS)
        a->snaps[a->nsnaps++] = a->version;
    a->snap_version = a->version;
    a->snap_ns = fr_clock_mono_ns();
}

/* Nonzero when every weight is finite: an OR over the exponent bits, which
 * the compiler vectorises (a float sum chain would not). */
static int weights_finite(const psstore_applier_t *a)
{
    const uint32_t *bits = (const uint32_t *)a->w;
    uint32_t bad = 0;
    for (size_t i = 0; i < a->n; i++)
        bad |= (uint32_t)((bits[i] & 0x7f800000u) == 0x7f800000u);
    return bad == 0;
}

/*
 * Commits everything applied or dropped since the last commit in one
 * transaction guarded by WATCH lease. A refused transaction (the lease
 * changed hands) drops the in-memory state; that is not an error.
 */
fr_err_t ps_applier_commit(psstore_applier_t *a)
{
    int dirty_parts = 0;
    for (size_t i = 0; i < a->nparts; i++)
        dirty_parts += a->parts[i].dirty;
    if (a->nids == 0 && !a->weights_dirty && dirty_parts == 0 && a->audit.len == 0 &&
        a->req_id[0] == '\0')
        return FR_OK;
    if (a->weights_dirty && !weights_finite(a)) {
        char reason[128];
        snprintf(reason, sizeof(reason), "weights went non-finite at version %lld",
                 (long long)a->version);
        ps_applier_drop_state(a); /* nothing of it is written */
        ps_applier_stop_model(a, reason);
        return FR_OK;
    }
    fr_err_t err;
    int queued = 0;
    cmd_t c = {0};
    buf_t offs = {0};
    char **offtext = calloc(a->nparts ? a->nparts : 1, sizeof(char *));
    size_t *offlen = calloc(a->nparts ? a->nparts : 1, sizeof(size_t));
    char nums[16][32], lease_ms[32];
    int snap = snapshot_due(a);
    if (offtext == NULL || offlen == NULL) {
        err = ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
        goto out;
    }

    int ours;
    redisReply *r;
    if ((err = ps_applier_watch_lease(a, &ours)) != FR_OK)
        goto out;
    if (!ours) {
        ps_applier_fenced(a, "before commit");
        goto out;
    }

    cmd_adds(&c, "MULTI");
    if ((err = cmd_send(a, &c, &queued)) != FR_OK)
        goto out;
    if (a->weights_dirty) {
        cmd_adds(&c, "SET");
        cmd_adds(&c, a->k_w);
        cmd_add(&c, (const char *)a->w, a->n * sizeof(float));
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
        if (a->opt_len > 0) {
            cmd_adds(&c, "SET");
            cmd_adds(&c, a->k_opt);
            cmd_add(&c, (const char *)a->opt, a->opt_len * sizeof(float));
            if ((err = cmd_send(a, &c, &queued)) != FR_OK)
                goto out;
        }
        snprintf(nums[15], 32, "%lld", (long long)a->version);
        cmd_adds(&c, "SET");
        cmd_adds(&c, a->k_ver);
        cmd_adds(&c, nums[15]);
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
    }
    if (a->new_epoch) {
        /* a new lineage (rollback) also lifts the divergence guard's stop */
        snprintf(nums[14], 32, "%llu", (unsigned long long)a->epoch);
        cmd_adds(&c, "HSET");
        cmd_adds(&c, a->k_meta);
        cmd_adds(&c, "epoch");
        cmd_adds(&c, nums[14]);
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
        cmd_adds(&c, "HDEL");
        cmd_adds(&c, a->k_meta);
        cmd_adds(&c, "stopped");
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
    }
    if (a->offsets_reset) {
        cmd_adds(&c, "DEL");
        cmd_adds(&c, a->k_off);
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
    }
    if (a->req_id[0] != '\0') {
        cmd_adds(&c, "XDEL");
        cmd_adds(&c, a->k_req);
        cmd_adds(&c, a->req_id);
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
    }
    if (a->replay_gen > 0) {
        snprintf(nums[13], 32, "%lld", (long long)a->replay_gen);
        cmd_adds(&c, "HSET");
        cmd_adds(&c, a->k_meta);
        cmd_adds(&c, "replay_generation");
        cmd_adds(&c, nums[13]);
        cmd_adds(&c, "replay");
        cmd_adds(&c, a->replay_spec);
        cmd_adds(&c, "replay_requested");
        cmd_adds(&c, a->replay_when);
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
    }
    if (dirty_parts > 0) {
        cmd_adds(&c, "HSET");
        cmd_adds(&c, a->k_off);
        for (size_t i = 0; i < a->nparts; i++) {
            if (!a->parts[i].dirty)
                continue;
            if (psstore_poff_format(&a->parts[i].po, &offtext[i], &offlen[i]) != FR_OK) {
                err = ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory");
                goto out;
            }
            cmd_adds(&c, a->parts[i].key);
            cmd_add(&c, offtext[i], offlen[i]);
        }
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
    }
    if ((err = queue_entries(a, &c, a->k_versions, &a->versions, a->conf.versions_keep, &queued)) !=
            FR_OK ||
        (err = queue_entries(a, &c, a->k_drops, &a->drops, a->conf.versions_keep, &queued)) !=
            FR_OK ||
        (err = queue_entries(a, &c, a->k_audit, &a->audit, 0, &queued)) != FR_OK)
        goto out;
    if (snap && (err = queue_snapshot(a, &c, &offs, &queued, nums)) != FR_OK)
        goto out;
    for (int g = 0; g < MAX_GROUPS; g++) {
        if (a->closed[g] == 0)
            continue;
        char field[16], by[32];
        snprintf(field, sizeof(field), "%d", g);
        snprintf(by, sizeof(by), "%lld", (long long)a->closed[g]);
        cmd_adds(&c, "HINCRBY");
        cmd_adds(&c, a->k_rounds);
        cmd_adds(&c, field);
        cmd_adds(&c, by);
        if ((err = cmd_send(a, &c, &queued)) != FR_OK)
            goto out;
    }
    if (a->nids > 0) {
        for (int pass = 0; pass < 2; pass++) {
            cmd_adds(&c, pass == 0 ? "XACK" : "XDEL");
            cmd_adds(&c, a->k_grads);
            if (pass == 0)
                cmd_adds(&c, GROUP);
            for (size_t pos = 0; pos < a->ids.len; pos += strlen(a->ids.p + pos) + 1)
                cmd_adds(&c, a->ids.p + pos);
            if ((err = cmd_send(a, &c, &queued)) != FR_OK)
                goto out;
        }
    }
    snprintf(lease_ms, sizeof(lease_ms), "%lld", (long long)a->conf.lease_ms);
    cmd_adds(&c, "PEXPIRE");
    cmd_adds(&c, a->k_lease);
    cmd_adds(&c, lease_ms);
    if ((err = cmd_send(a, &c, &queued)) != FR_OK)
        goto out;
    cmd_adds(&c, "EXEC");
    if ((err = cmd_send(a, &c, &queued)) != FR_OK)
        goto out;

    /* MULTI's OK and each QUEUED, then EXEC's array (nil: the lease moved) */
    redisReply *exec = NULL;
    for (int i = 0; i < queued; i++) {
        r = ps_pipeline_read(a->c, &err);
        if (r == NULL && a->c->ctx == NULL)
            goto out; /* connection lost: unknown whether EXEC ran; poll reloads */
        if (i == queued - 1)
            exec = r;
        else
            freeReplyObject(r);
    }
    if (exec == NULL && a->c->ctx != NULL && err == FR_ERR_REDIS) {
        /* EXECABORT and the like: Redis refused the transaction (not the
         * lease); nothing was written, so reload and report the reason */
        fr_log(FR_LOG_ERROR, "applier %s: commit refused: %s", a->model, psstore_conn_error(a->c));
        ps_applier_drop_state(a);
        goto out;
    }
    if (exec == NULL || exec->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(exec);
        ps_applier_fenced(a, "at EXEC");
        err = FR_OK;
        goto out;
    }
    for (size_t i = 0; i < exec->elements; i++) {
        if (exec->element[i]->type == REDIS_REPLY_ERROR) {
            /* a command inside failed (Redis does not roll back): the store
             * may be inconsistent; stop and say so rather than go on */
            char reason[256];
            snprintf(reason, sizeof(reason), "a commit failed inside its transaction: %.200s",
                     exec->element[i]->str);
            freeReplyObject(exec);
            ps_applier_drop_state(a);
            ps_applier_stop_model(a, reason);
            err = FR_ERR_REDIS;
            goto out;
        }
    }
    freeReplyObject(exec);
    uint64_t payload = a->weights_dirty ? (a->n + a->opt_len) * sizeof(float) : 0;
    if (snap)
        payload += (a->n + a->opt_len) * sizeof(float);
    pthread_mutex_lock(&a->lock);
    a->stats.commits++;
    a->stats.bytes += payload;
    pthread_mutex_unlock(&a->lock);
    fr_series_add(a->m_commits, 1);
    fr_series_add(a->m_bytes, (double)payload);
    if (snap)
        snapshot_done(a);
    for (size_t i = 0; i < a->nparts; i++)
        a->parts[i].dirty = 0;
    a->committed = a->version;
    a->renew_ns = fr_clock_mono_ns();
    a->ids.len = a->versions.len = a->drops.len = a->audit.len = 0;
    a->nids = 0;
    a->weights_dirty = 0;
    a->new_epoch = a->offsets_reset = 0;
    a->req_id[0] = '\0';
    a->replay_gen = 0;
    memset(a->closed, 0, sizeof(a->closed));
    if (a->nts_pending > 0) {
        int64_t now = fr_clock_unix_ms();
        pthread_mutex_lock(&a->lock);
        for (size_t i = 0; i < a->nts_pending; i++)
            a->fresh[a->nfresh++ % FRESH_RING] = now - a->ts_pending[i];
        pthread_mutex_unlock(&a->lock);
        for (size_t i = 0; i < a->nts_pending; i++)
            fr_series_observe(a->m_fresh, (double)(now - a->ts_pending[i]) * 1e-3);
        a->nts_pending = 0;
    }
    fr_series_set(a->m_version, (double)a->committed);
    ps_applier_stats_update(a);
    err = FR_OK;
out:
    for (size_t i = 0; offtext != NULL && i < a->nparts; i++)
        free(offtext[i]);
    free(offtext);
    free(offlen);
    free(offs.p);
    free(c.argv);
    free(c.lens);
    return err;
}
