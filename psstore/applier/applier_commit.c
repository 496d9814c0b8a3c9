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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/applier/applier_sparse.h"

/* ---- the transaction builder ------------------------------------------------ */

/*
 * A MULTI/EXEC transaction under construction. Each command goes to the
 * connection's pipeline as soon as it is complete (hiredis copies its
 * arguments, so they need to live only until txn_send). The first error is
 * kept and every later call does nothing, so the caller checks once, before
 * EXEC, instead of after every command.
 */
typedef struct txn {
    psstore_conn_t *c;
    const char **argv; /* the command being built */
    size_t *lens;
    int argc, cap;
    int queued;   /* commands appended: one reply each to read back */
    fr_err_t err; /* the first error; FR_OK while none */
    char *fmt;    /* a command in RESP (queue_rows) */
    size_t capfmt;
} txn_t;

#if defined(__GNUC__)
#define TXN_SENTINEL __attribute__((sentinel))
#else
#define TXN_SENTINEL
#endif

/* Records err unless an earlier error is recorded already. */
static void txn_fail(txn_t *t, fr_err_t err)
{
    if (t->err == FR_OK)
        t->err = err;
}

/* Adds one (binary safe) argument to the command being built. */
static void txn_arg(txn_t *t, const void *p, size_t len)
{
    if (t->err != FR_OK)
        return;
    if (t->argc == t->cap) {
        int cap = t->cap ? 2 * t->cap : 32;
        const char **av = realloc(t->argv, (size_t)cap * sizeof(*av));
        if (av != NULL)
            t->argv = av;
        size_t *lv = av != NULL ? realloc(t->lens, (size_t)cap * sizeof(*lv)) : NULL;
        if (lv != NULL)
            t->lens = lv;
        if (av == NULL || lv == NULL) {
            txn_fail(t, ps_fail(t->c, FR_ERR_NOMEM, "applier: out of memory"));
            return;
        }
        t->cap = cap;
    }
    t->argv[t->argc] = p;
    t->lens[t->argc++] = len;
}

static void txn_str(txn_t *t, const char *s)
{
    txn_arg(t, s, strlen(s));
}

/* Appends the command built so far to the pipeline; the next one starts. */
static void txn_send(txn_t *t)
{
    if (t->err == FR_OK) {
        t->err = ps_pipeline_append(t->c, t->argc, t->argv, t->lens);
        if (t->err == FR_OK)
            t->queued++;
    }
    t->argc = 0;
}

/* One command of string arguments, the last followed by NULL. */
static void txn_cmd(txn_t *t, const char *arg, ...) TXN_SENTINEL;
static void txn_cmd(txn_t *t, const char *arg, ...)
{
    va_list ap;
    va_start(ap, arg);
    for (const char *s = arg; s != NULL; s = va_arg(ap, const char *))
        txn_str(t, s);
    va_end(ap);
    txn_send(t);
}

/*
 * Sends EXEC and reads every reply: MULTI's OK, each QUEUED, then EXEC's,
 * returned through *exec (caller frees): an array, nil when the lease
 * moved, or NULL when Redis refused the transaction (EXECABORT and the
 * like: the reason is in the connection's error). Returns the first error
 * of the builder (having closed the connection, so that nothing it queued
 * is ever sent), or the read's when the connection broke (unknown then
 * whether EXEC ran).
 */
static fr_err_t txn_exec(txn_t *t, redisReply **exec)
{
    *exec = NULL;
    txn_cmd(t, "EXEC", NULL);
    if (t->err != FR_OK) {
        /* nothing was sent: the commands queued so far must never be */
        ps_pipeline_discard(t->c);
        return t->err;
    }
    for (int i = 0; i < t->queued; i++) {
        fr_err_t err;
        redisReply *r = ps_pipeline_read(t->c, &err);
        if (r == NULL && t->c->ctx == NULL)
            return err;
        if (i == t->queued - 1)
            *exec = r;
        else
            freeReplyObject(r);
    }
    return FR_OK;
}

static void txn_fini(txn_t *t)
{
    free(t->argv);
    free(t->lens);
    free(t->fmt);
}

/* ---- what a commit writes --------------------------------------------------- */

/* Queues XADD key [MAXLEN ~ keep] * f v ... for every entry in b. */
static void queue_entries(txn_t *t, const char *key, const fr_buf_t *b, long long keep)
{
    char keep_s[32];
    snprintf(keep_s, sizeof(keep_s), "%lld", keep);
    size_t pos = 0;
    while (pos < b->len) {
        txn_str(t, "XADD");
        txn_str(t, key);
        if (keep > 0) {
            txn_str(t, "MAXLEN");
            txn_str(t, "~");
            txn_str(t, keep_s);
        }
        txn_str(t, "*");
        while (pos < b->len && b->p[pos] != '\1') {
            size_t len = strlen(b->p + pos);
            txn_arg(t, b->p + pos, len);
            pos += len + 1;
        }
        pos++; /* the \1 between entries */
        txn_send(t);
    }
}

/* Writes "<c><n>\r\n" at p; returns the end. */
static char *resp_head(char *p, char c, size_t n)
{
    char digits[24];
    int k = 0;
    do
        digits[k++] = (char)('0' + n % 10);
    while ((n /= 10) > 0);
    *p++ = c;
    while (k > 0)
        *p++ = digits[--k];
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

/* Writes one bulk string at p; returns the end. */
static char *resp_bulk(char *p, const void *s, size_t n)
{
    p = resp_head(p, '$', n);
    memcpy(p, s, n);
    p += n;
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

/*
 * A sparse model's rows changed since the last commit: HSET rows, each
 * value the row's parameters and optimizer state as the table holds them,
 * PS_ROWS_CHUNK rows a command (applier_sparse.c). Each command is written
 * in RESP here, every row's field and value at fixed lengths, and queued
 * as it is (ps_pipeline_append_formatted): hiredis's formatting of two
 * arguments a row was most of the applier's CPU a sample, under the step
 * lock (docs/design.md "The store written behind").
 */
static void queue_rows(psstore_applier_t *a, txn_t *t)
{
    ps_sparse_t *sp = a->sp;
    char rows_key[PS_KEY_MAX];
    ps_key(rows_key, a->model, "rows");
    size_t klen = strlen(rows_key), vbytes = sp->vlen * sizeof(float);
    /* per row at most: $4, 4 bytes, $<vbytes>, the value, each line's CRLF */
    size_t per_row = 2 * 24 + 4 + vbytes + 4;
    size_t need = 3 * 24 + 8 + klen + PS_ROWS_CHUNK * per_row;
    if (t->err == FR_OK && need > t->capfmt) {
        char *f = realloc(t->fmt, need);
        if (f == NULL) {
            txn_fail(t, ps_fail(t->c, FR_ERR_NOMEM, "applier: out of memory"));
            return;
        }
        t->fmt = f;
        t->capfmt = need;
    }
    for (size_t at = 0; at < sp->ndirty && t->err == FR_OK; at += PS_ROWS_CHUNK) {
        size_t n = sp->ndirty - at < PS_ROWS_CHUNK ? sp->ndirty - at : PS_ROWS_CHUNK;
        char *p = resp_head(t->fmt, '*', 2 + 2 * n);
        p = resp_bulk(p, "HSET", 4);
        p = resp_bulk(p, rows_key, klen);
        for (size_t i = 0; i < n; i++) {
            size_t s = sp->dirty_list[at + i];
            unsigned char field[4];
            ps_row_field(sp->rows[s], field);
            p = resp_bulk(p, field, 4);
            p = resp_bulk(p, sp->vals + s * sp->vlen, vbytes);
        }
        FR_ASSERT((size_t)(p - t->fmt) <= t->capfmt); /* need counted every byte */
        t->err = ps_pipeline_append_formatted(t->c, rows_key, klen, t->fmt, (size_t)(p - t->fmt));
        if (t->err == FR_OK)
            t->queued++;
    }
}

/* Queues HDEL rows of the evicted rows, PS_ROWS_CHUNK a command. */
static void queue_evicted(psstore_applier_t *a, txn_t *t, const char *rows_key)
{
    ps_sparse_t *sp = a->sp;
    unsigned char fields[PS_ROWS_CHUNK][4];
    for (size_t at = 0; at < sp->nevict; at += PS_ROWS_CHUNK) {
        size_t n = sp->nevict - at < PS_ROWS_CHUNK ? sp->nevict - at : PS_ROWS_CHUNK;
        txn_str(t, "HDEL");
        txn_str(t, rows_key);
        for (size_t i = 0; i < n; i++) {
            ps_row_field(sp->evict[at + i], fields[i]);
            txn_arg(t, fields[i], 4);
        }
        txn_send(t);
    }
}

/* Queues the changes stream's entry of this commit, id "<version>-0":
 * the changed rows, then the evicted ones, each 4 bytes little-endian. */
static void queue_entry(psstore_applier_t *a, txn_t *t, const char *key)
{
    ps_sparse_t *sp = a->sp;
    size_t need = 4 * (sp->ndirty + sp->nevict);
    if (need > sp->capblob) {
        unsigned char *b = realloc(sp->blob, need);
        if (b == NULL) {
            txn_fail(t, ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory"));
            return;
        }
        sp->blob = b;
        sp->capblob = need;
    }
    for (size_t i = 0; i < sp->ndirty; i++)
        ps_row_field(sp->rows[sp->dirty_list[i]], sp->blob + 4 * i);
    for (size_t i = 0; i < sp->nevict; i++)
        ps_row_field(sp->evict[i], sp->blob + 4 * (sp->ndirty + i));
    char id[40], now[32];
    snprintf(id, sizeof(id), "%lld-0", (long long)a->version);
    snprintf(now, sizeof(now), "%lld", (long long)fr_clock_unix_ms());
    txn_str(t, "XADD");
    txn_str(t, key);
    txn_str(t, id);
    txn_str(t, "t");
    txn_str(t, now);
    txn_str(t, "rows");
    txn_arg(t, sp->blob, 4 * sp->ndirty);
    txn_str(t, "gone");
    txn_arg(t, sp->blob + 4 * sp->ndirty, 4 * sp->nevict);
    txn_send(t);
    sp->entry_queued = 1;
}

/*
 * A sparse model's part of a commit (docs/design.md "Serving sparse
 * models"): HSET of the rows changed since the last commit, HDEL of the
 * evicted ones (less those a gradient brought back since), the changes
 * stream's entry naming both under the commit's version, and the trimming
 * of entries older than delta_ms with meta's delta_floor, the version from
 * which the stream's history is whole.
 */
static void queue_sparse(psstore_applier_t *a, txn_t *t)
{
    ps_sparse_t *sp = a->sp;
    size_t kept = 0;
    for (size_t i = 0; i < sp->nevict; i++)
        if (!ps_sparse_holds(sp, sp->evict[i]))
            sp->evict[kept++] = sp->evict[i];
    sp->nevict = kept;
    sp->entry_queued = 0;
    char key[PS_KEY_MAX], rows_key[PS_KEY_MAX], num[32];
    ps_key(key, a->model, "changes");
    ps_key(rows_key, a->model, "rows");
    if (sp->reset_changes)
        txn_cmd(t, "DEL", key, NULL);
    if (sp->ndirty > 0)
        queue_rows(a, t);
    if (sp->nevict > 0)
        queue_evicted(a, t, rows_key);
    /* an entry for every commit that moves the version, even with no rows
     * (a bias step, rows not admitted yet): the stream then always ends at
     * the store's version, and a new applier can tell a whole history */
    if (a->version > sp->entry_version)
        queue_entry(a, t, key);
    else if (sp->ndirty > 0 || sp->nevict > 0) /* no id left (never expected): refuse deltas */
        sp->floor_next = a->version;
    int64_t old = ps_sparse_version_before(sp, sp->delta_ms);
    if (old > sp->floor_next)
        sp->floor_next = old;
    if (sp->floor_next > sp->floor || sp->reset_changes) {
        snprintf(num, sizeof(num), "%lld-0", (long long)sp->floor_next + 1);
        txn_cmd(t, "XTRIM", key, "MINID", num, NULL);
        snprintf(num, sizeof(num), "%lld", (long long)sp->floor_next);
        txn_cmd(t, "HSET", a->k_meta, "delta_floor", num, NULL);
    }
}

/*
 * Queues the weights, optimizer state, served average and version when
 * they moved, a new epoch (rollback), the reset of the offsets, the
 * deletion of the request this commit executes and the replay it
 * publishes.
 */
static void queue_state(psstore_applier_t *a, txn_t *t)
{
    char num[32];
    if (a->weights_dirty) {
        txn_str(t, "SET");
        txn_str(t, a->k_w);
        txn_arg(t, a->w, a->n * sizeof(float));
        txn_send(t);
        if (a->opt_len > 0) {
            txn_str(t, "SET");
            txn_str(t, a->k_opt);
            txn_arg(t, a->opt, a->opt_len * sizeof(float));
            txn_send(t);
        }
        if (a->avg != NULL) {
            txn_str(t, "SET");
            txn_str(t, a->k_avg);
            txn_arg(t, a->avg, a->n * sizeof(float));
            txn_send(t);
        } else if (a->avg_stale) {
            /* averaging off (or a requests-only applier's rollback to a
             * snapshot without an average): the readers then serve w.
             * Once: a failed commit reloads the state, which marks it again */
            txn_cmd(t, "DEL", a->k_avg, NULL);
            a->avg_stale = 0;
        }
        snprintf(num, sizeof(num), "%lld", (long long)a->version);
        txn_cmd(t, "SET", a->k_ver, num, NULL);
    }
    if (a->sp != NULL)
        queue_sparse(a, t);
    if (a->new_epoch) {
        /* a new lineage (rollback) also lifts the divergence guard's stop */
        snprintf(num, sizeof(num), "%llu", (unsigned long long)a->epoch);
        txn_cmd(t, "HSET", a->k_meta, "epoch", num, NULL);
        txn_cmd(t, "HDEL", a->k_meta, "stopped", NULL);
    }
    if (a->offsets_reset)
        txn_cmd(t, "DEL", a->k_off, NULL);
    if (a->req_id[0] != '\0')
        txn_cmd(t, "XDEL", a->k_req, a->req_id, NULL);
    if (a->replay_gen > 0) {
        /* set together with replay_gen (publish_replay, rollback): a NULL
         * would end txn_cmd's list early */
        FR_ASSERT(a->replay_spec != NULL && a->replay_when != NULL);
        snprintf(num, sizeof(num), "%lld", (long long)a->replay_gen);
        txn_cmd(t, "HSET", a->k_meta, "replay_generation", num, "replay", a->replay_spec,
                "replay_requested", a->replay_when, NULL);
    }
}

/* Queues one HSET of the offsets of every partition that changed. */
static void queue_offsets(psstore_applier_t *a, txn_t *t)
{
    char **text = calloc(a->nparts ? a->nparts : 1, sizeof(*text));
    if (text == NULL) {
        txn_fail(t, ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory"));
        return;
    }
    txn_str(t, "HSET");
    txn_str(t, a->k_off);
    for (size_t i = 0; i < a->nparts && t->err == FR_OK; i++) {
        size_t len;
        if (!a->parts[i].dirty)
            continue;
        if (psstore_poff_format(&a->parts[i].po, &text[i], &len) != FR_OK) {
            txn_fail(t, ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory"));
            break;
        }
        txn_str(t, a->parts[i].key);
        txn_arg(t, text[i], len);
    }
    txn_send(t);
    for (size_t i = 0; i < a->nparts; i++)
        free(text[i]);
    free(text);
}

/* Nonzero when a snapshot is due with this commit. */
static int snapshot_due(const psstore_applier_t *a)
{
    if (a->sp != NULL) /* a sparse model's rows are not in w: no snapshot of them yet */
        return 0;
    if (a->nshards > 1 && a->shard > 0) /* snapshots are shard 0's to schedule */
        return a->snap_req > 0;
    if (!a->weights_dirty || a->version <= a->snap_version)
        return 0;
    if (a->conf.snapshot_every > 0 && a->version - a->snap_version >= a->conf.snapshot_every)
        return 1;
    return a->conf.snapshot_seconds > 0 &&
           (double)(fr_clock_mono_ns() - a->snap_ns) * 1e-9 >= a->conf.snapshot_seconds;
}

/* "key=value\n" for every partition: the offsets of a snapshot. */
static fr_err_t offsets_text(psstore_applier_t *a, fr_buf_t *out)
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

/* The retained snapshots a new one pushes out, oldest first: at most 8 per
 * commit, so a lowered snapshot_retain trims over several commits. */
static size_t snapshots_excess(const psstore_applier_t *a)
{
    size_t excess = a->nsnaps + 1 > (size_t)a->conf.snapshot_retain
                        ? a->nsnaps + 1 - (size_t)a->conf.snapshot_retain
                        : 0;
    /* snapshot_retain >= 1 (checked by psstore_applier_new) */
    FR_ASSERT(excess <= a->nsnaps);
    return excess < 8 ? excess : 8;
}

/* The id of the snapshot this commit takes: the version, or for shards
 * 1..S-1 of a sharded model the id shard 0 asked for (docs/design.md
 * "Shards": snapshots are coordinated under shard 0's version). */
static int64_t snapshot_id(const psstore_applier_t *a)
{
    return a->nshards > 1 && a->shard > 0 ? a->snap_req : a->version;
}

/* Queues the snapshot of the current version and the trimming of old ones. */
static void queue_snapshot(psstore_applier_t *a, txn_t *t)
{
    /* an id taken again (shard 0's versions repeat after it lost writes):
     * the new part replaces the old, whose trimming would delete it */
    for (size_t i = 0; i < a->nsnaps; i++) {
        if (a->snaps[i] == snapshot_id(a)) {
            memmove(a->snaps + i, a->snaps + i + 1, (a->nsnaps - i - 1) * sizeof(a->snaps[0]));
            a->nsnaps--;
            break;
        }
    }
    char snap_key[PS_KEY_MAX], epoch[32], version[32], now[32], loss[32], pub[64], id[32];
    fr_buf_t offs = {0};
    if (offsets_text(a, &offs) != FR_OK) {
        fr_buf_fini(&offs);
        txn_fail(t, ps_fail(a->c, FR_ERR_NOMEM, "applier: out of memory"));
        return;
    }
    ps_key_shard(snap_key, a->model, "snap", snapshot_id(a));
    snprintf(id, sizeof(id), "%lld", (long long)snapshot_id(a));
    snprintf(epoch, sizeof(epoch), "%llu", (unsigned long long)a->epoch);
    snprintf(version, sizeof(version), "%lld", (long long)a->version);
    snprintf(now, sizeof(now), "%lld", (long long)fr_clock_unix_ms());
    snprintf(loss, sizeof(loss), "%.9g", a->last_loss);
    txn_str(t, "HSET");
    txn_str(t, snap_key);
    txn_str(t, "weights");
    txn_arg(t, a->w, a->n * sizeof(float));
    txn_str(t, "opt");
    txn_arg(t, a->opt, a->opt_len * sizeof(float));
    txn_str(t, "offsets");
    txn_arg(t, offs.p ? offs.p : "", offs.len);
    txn_str(t, "epoch");
    txn_str(t, epoch);
    txn_str(t, "version");
    txn_str(t, version);
    txn_str(t, "time");
    txn_str(t, now);
    txn_str(t, "loss");
    txn_str(t, loss);
    if (a->avg != NULL) {
        txn_str(t, "avg");
        txn_arg(t, a->avg, a->n * sizeof(float));
    }
    txn_send(t);
    fr_buf_fini(&offs);
    txn_cmd(t, "ZADD", a->k_snaps, now, id, NULL);
    size_t excess = snapshots_excess(a);
    for (size_t i = 0; i < excess; i++) {
        char old_key[PS_KEY_MAX], old[32];
        ps_key_shard(old_key, a->model, "snap", a->snaps[i]);
        snprintf(old, sizeof(old), "%lld", (long long)a->snaps[i]);
        txn_cmd(t, "DEL", old_key, NULL);
        txn_cmd(t, "ZREM", a->k_snaps, old, NULL);
    }
    snprintf(pub, sizeof(pub), "%llu-v%lld", (unsigned long long)a->epoch, (long long)a->version);
    txn_cmd(t, "PUBLISH", a->k_pub, pub, NULL);
}

/* After a committed snapshot (id, of version): the in-memory list follows
 * the store's. */
static void snapshot_done(psstore_applier_t *a, int64_t id, int64_t version)
{
    size_t excess = snapshots_excess(a);
    memmove(a->snaps, a->snaps + excess, (a->nsnaps - excess) * sizeof(int64_t));
    a->nsnaps -= excess;
    if (a->nsnaps < MAX_SNAPS)
        a->snaps[a->nsnaps++] = id;
    FR_ASSERT(a->nsnaps <= MAX_SNAPS);
    a->snap_version = version;
    a->snap_ns = fr_clock_mono_ns();
    a->snap_req = 0;
}

/*
 * Shard 0 of a sharded model after a committed snapshot: asks shards
 * 1..S-1 to take theirs under the same id at their next commit (a
 * "snapshot" request each). Outside the transaction, which cannot reach
 * other slots: a crash in between leaves the id on fewer shards, and
 * rollback refuses an id some shard lacks.
 */
static void snapshot_fan_out(psstore_applier_t *a, int64_t id)
{
    char v[32], now[32];
    snprintf(v, sizeof(v), "%lld", (long long)id);
    snprintf(now, sizeof(now), "%lld", (long long)fr_clock_unix_ms());
    for (int k = 1; k < a->nshards; k++) {
        char tag[PS_TAG_MAX], key[PS_KEY_MAX];
        fr_err_t err;
        ps_shard_tag(tag, a->name, k, a->nshards);
        ps_key(key, tag, "requests");
        redisReply *r =
            ps_cmd(a->c, 1, &err, "XADD %s * type snapshot version %s requested %s", key, v, now);
        if (r == NULL)
            fr_log(FR_LOG_WARN, "applier %s: snapshot %s not asked of shard %d: %s", a->model, v, k,
                   psstore_conn_error(a->c));
        freeReplyObject(r);
    }
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

/* Queues HINCRBY rounds of every group whose rounds closed since the last
 * commit (the workers' round counters). */
static void queue_rounds(psstore_applier_t *a, txn_t *t)
{
    for (int g = 0; g < MAX_GROUPS; g++) {
        if (a->closed[g] == 0)
            continue;
        char field[16], by[32];
        snprintf(field, sizeof(field), "%d", g);
        snprintf(by, sizeof(by), "%lld", (long long)a->closed[g]);
        txn_cmd(t, "HINCRBY", a->k_rounds, field, by, NULL);
    }
}

/* Queues XACK and XDEL of the stream entries consumed since the last commit. */
static void queue_acks(psstore_applier_t *a, txn_t *t)
{
    if (a->nids == 0)
        return;
    for (int pass = 0; pass < 2; pass++) {
        txn_str(t, pass == 0 ? "XACK" : "XDEL");
        txn_str(t, a->k_grads);
        if (pass == 0)
            txn_str(t, GROUP);
        size_t n = 0;
        for (size_t pos = 0; pos < a->ids.len; pos += strlen(a->ids.p + pos) + 1, n++)
            txn_str(t, a->ids.p + pos);
        /* the window acknowledges exactly the entries it decided: one more
         * would delete a gradient never applied, one fewer re-apply one */
        FR_ASSERT(n == a->nids);
        txn_send(t);
    }
}

/*
 * What a transaction carries of the state a pusher's step adds to (the
 * weights, the versions, drops and audit entries, the offsets, the
 * freshness timestamps): forgotten once queued, since the commit lets go
 * of the step lock while it waits for Redis and a pusher's step may add
 * more meanwhile, for the next commit. Should the commit fail the whole
 * state is dropped and reloaded, so nothing is lost by forgetting early.
 */
typedef struct sent {
    int weights;     /* the weights (and optimizer state) went */
    int64_t version; /* the version they are at                */
    int64_t snap_id; /* a snapshot's id, when one went          */
    size_t nts;      /* the freshness timestamps they cover    */
    size_t nevict;   /* a sparse model's rows deleted           */
    int entry;       /* ... and whether a changes entry went    */
} sent_t;

static void forget_sent(psstore_applier_t *a, sent_t *s)
{
    s->weights = a->weights_dirty;
    s->version = a->version;
    s->snap_id = snapshot_id(a);
    s->nts = a->nts_pending;
    s->nevict = a->sp != NULL ? a->sp->nevict : 0;
    s->entry = a->sp != NULL && a->sp->entry_queued;
    ps_sparse_committed(a->sp); /* the rows a step dirties from now on go next */
    a->weights_dirty = 0;
    fr_buf_reset(&a->versions);
    fr_buf_reset(&a->drops);
    fr_buf_reset(&a->audit);
    for (size_t i = 0; i < a->nparts; i++)
        a->parts[i].dirty = 0;
}

/* After EXEC succeeded: the counters, the freshness figures and the state
 * pending for the next commit start over. */
static void committed(psstore_applier_t *a, int snap, uint64_t spent, const sent_t *s)
{
    fr_series_observe(a->m_commit_latency, (double)spent * 1e-9);
    size_t floats = a->n + a->opt_len + (a->avg != NULL ? a->n : 0);
    uint64_t payload = s->weights ? floats * sizeof(float) : 0;
    if (snap)
        payload += floats * sizeof(float);
    pthread_mutex_lock(&a->lock);
    a->stats.commits++;
    a->stats.commit_ns += spent;
    a->stats.bytes += payload;
    pthread_mutex_unlock(&a->lock);
    fr_series_add(a->m_commits, 1);
    fr_series_add(a->m_bytes, (double)payload);
    if (snap)
        snapshot_done(a, s->snap_id, s->version);
    if (s->nevict > 0) {
        pthread_mutex_lock(&a->lock);
        a->stats.evicted += s->nevict;
        pthread_mutex_unlock(&a->lock);
        fr_series_add(a->m_evicted, (double)s->nevict);
    }
    ps_sparse_commit_done(a, s->version, s->entry);
    a->committed = s->version;
    a->renew_ns = fr_clock_mono_ns();
    ps_applier_forget_own(a);
    memset(a->closed, 0, sizeof(a->closed));
    if (s->nts > 0) {
        int64_t now = fr_clock_unix_ms();
        pthread_mutex_lock(&a->lock);
        for (size_t i = 0; i < s->nts; i++)
            a->fresh[a->nfresh++ % FRESH_RING] = now - a->ts_pending[i];
        pthread_mutex_unlock(&a->lock);
        for (size_t i = 0; i < s->nts; i++)
            fr_series_observe(a->m_fresh, (double)(now - a->ts_pending[i]) * 1e-3);
        /* those a pusher's step noted while the commit waited are the next's */
        a->nts_pending -= s->nts;
        memmove(a->ts_pending, a->ts_pending + s->nts, a->nts_pending * sizeof(*a->ts_pending));
    }
    if (fr_series_value(a->m_version) != (double)a->committed)
        fr_series_set(a->m_updated, (double)fr_clock_unix_ms() * 1e-3);
    fr_series_set(a->m_version, (double)a->committed);
    ps_applier_stats_update(a);
}

/*
 * [redis] wait_replicas: WAIT until that many replicas hold the commit (on a
 * cluster, the replicas of the model's master: WAIT goes where the commit
 * went), and count the commit when fewer did within wait_timeout_ms. A
 * failed WAIT counts too; the commit itself stands. version: the commit's,
 * for the log (the caller may have let go of the step lock).
 */
static void wait_replicas(psstore_applier_t *a, int64_t version)
{
    if (a->conf.wait_replicas <= 0)
        return;
    fr_err_t err;
    redisReply *r = ps_cmd(a->c, 0, &err, "WAIT %d %lld", a->conf.wait_replicas,
                           (long long)a->conf.wait_timeout_ms);
    long long acked = r != NULL && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    if (acked >= a->conf.wait_replicas)
        return;
    pthread_mutex_lock(&a->lock);
    uint64_t n = ++a->stats.unreplicated;
    pthread_mutex_unlock(&a->lock);
    fr_series_add(a->m_unreplicated, 1);
    if (n == 1 || n % 1000 == 0)
        fr_log(FR_LOG_WARN, "applier %s: commit at version %lld reached %lld of %d replicas (%s)",
               a->model, (long long)version, acked < 0 ? 0 : acked, a->conf.wait_replicas,
               acked < 0 ? psstore_conn_error(a->c) : "WAIT timed out");
}

/* ---- the commit ------------------------------------------------------------- */

/*
 * Commits everything applied or dropped since the last commit in one
 * transaction guarded by WATCH lease. A refused transaction (the lease
 * changed hands) drops the in-memory state; that is not an error.
 */
static fr_err_t commit(psstore_applier_t *a, int may_let_go);

fr_err_t ps_applier_commit(psstore_applier_t *a)
{
    return commit(a, 0);
}

fr_err_t ps_applier_commit_letting_go(psstore_applier_t *a)
{
    return commit(a, 1);
}

void ps_applier_commit_wait_for_test(psstore_applier_t *a, void (*fn)(void *), void *arg)
{
    a->commit_wait_fn = fn;
    a->commit_wait_arg = arg;
}

/* The partitions whose offsets moved since the last commit. */
static int dirty_parts_of(const psstore_applier_t *a)
{
    int n = 0;
    for (size_t i = 0; i < a->nparts; i++)
        n += a->parts[i].dirty;
    return n;
}

/* Weights that went non-finite are never written: the state is dropped
 * and the model stopped. Returns whether it happened. */
static int stopped_non_finite(psstore_applier_t *a)
{
    if (!a->weights_dirty || weights_finite(a))
        return 0;
    char reason[128];
    snprintf(reason, sizeof(reason), "weights went non-finite at version %lld",
             (long long)a->version);
    ps_applier_drop_state(a); /* nothing of it is written */
    ps_applier_stop_model(a, reason);
    return 1;
}

static fr_err_t commit(psstore_applier_t *a, int may_let_go)
{
    if (a->help_err != FR_OK) { /* a pusher's step failed: its state is never written */
        fr_err_t err = a->help_err;
        a->help_err = FR_OK;
        return err; /* the poll reloads */
    }
    if (a->nids == 0 && !a->weights_dirty && dirty_parts_of(a) == 0 && a->audit.len == 0 &&
        a->drops.len == 0 && a->req_id[0] == '\0' && !ps_sparse_trim_due(a->sp)) {
        if (a->sp != NULL) { /* decisions that changed nothing (duplicates): an empty window */
            a->sp->window = 0;
            a->sp->queued_upto = a->sp->committed_upto = a->sp->decided; /* nothing to lose */
        }
        return FR_OK;
    }
    if (stopped_non_finite(a))
        return FR_OK;
    uint64_t t0 = fr_clock_mono_ns();
    int snap = snapshot_due(a), ours;
    /* a sparse model's in-process steps go on during WATCH's round trip:
     * what the transaction carries is taken after it */
    int sparse_let_go = may_let_go && a->sp != NULL;
    if (sparse_let_go)
        ps_applier_step_pause(a);
    fr_err_t err = ps_applier_watch_lease(a, &ours);
    if (sparse_let_go)
        ps_applier_step_resume(a);
    if (err != FR_OK)
        return err;
    if (!ours) {
        ps_applier_fenced(a, "before commit");
        return FR_OK;
    }
    if (sparse_let_go && (a->help_err != FR_OK || stopped_non_finite(a))) {
        /* what the steps during WATCH did is not written */
        freeReplyObject(ps_cmd(a->c, 0, &err, "UNWATCH"));
        err = a->help_err;
        a->help_err = FR_OK;
        return err;
    }
    int dirty_parts = dirty_parts_of(a); /* with what the steps during WATCH marked */

    txn_t t = {.c = a->c};
    char lease_ms[32];
    snprintf(lease_ms, sizeof(lease_ms), "%lld", (long long)a->conf.lease_ms);
    txn_cmd(&t, "MULTI", NULL);
    queue_state(a, &t);
    if (dirty_parts > 0)
        queue_offsets(a, &t);
    queue_entries(&t, a->k_versions, &a->versions, a->conf.versions_keep);
    queue_entries(&t, a->k_drops, &a->drops, a->conf.versions_keep);
    queue_entries(&t, a->k_audit, &a->audit, 0);
    if (snap)
        queue_snapshot(a, &t);
    queue_rounds(a, &t);
    queue_acks(a, &t);
    txn_cmd(&t, "PEXPIRE", a->k_lease, lease_ms, NULL);
    sent_t sent;
    forget_sent(a, &sent);
    /* Redis's round trip without the step lock: a pusher may take its
     * step meanwhile (docs/design.md "The co-located fast path"). Its step
     * touches neither the connection nor what only this thread writes. */
    if (may_let_go) {
        ps_applier_step_pause(a);
        if (a->commit_wait_fn != NULL && (a->local != NULL || (a->sp != NULL && a->sp->inproc)))
            a->commit_wait_fn(a->commit_wait_arg);
    }
    /* the one check: after the first error nothing more was queued */
    redisReply *exec = NULL;
    err = txn_exec(&t, &exec);
    if (may_let_go)
        ps_applier_step_resume(a);
    if (err != FR_OK)
        goto out; /* unknown whether EXEC ran (or it was never sent): poll reloads */

    if (exec == NULL) {
        /* EXECABORT and the like: Redis refused the transaction (not the
         * lease); nothing was written, so reload and report the reason */
        fr_log(FR_LOG_ERROR, "applier %s: commit refused: %s", a->model, psstore_conn_error(a->c));
        ps_applier_drop_state(a);
        err = FR_ERR_REDIS;
        goto out;
    }
    if (exec->type != REDIS_REPLY_ARRAY) {
        ps_applier_fenced(a, "at EXEC");
        goto out;
    }
    for (size_t i = 0; i < exec->elements; i++) {
        if (exec->element[i]->type == REDIS_REPLY_ERROR) {
            /* a command inside failed (Redis does not roll back): the store
             * may be inconsistent; stop and say so rather than go on */
            char reason[256];
            snprintf(reason, sizeof(reason), "a commit failed inside its transaction: %.200s",
                     exec->element[i]->str);
            ps_applier_drop_state(a);
            ps_applier_stop_model(a, reason);
            err = FR_ERR_REDIS;
            goto out;
        }
    }
    uint64_t spent = fr_clock_mono_ns() - t0; /* to EXEC's reply, not the replicas' */
    if (a->conf.wait_replicas > 0) {          /* WAIT's round trip without the step lock too */
        if (may_let_go)
            ps_applier_step_pause(a);
        wait_replicas(a, sent.version);
        if (may_let_go)
            ps_applier_step_resume(a);
    }
    committed(a, snap, spent, &sent);
    if (snap && a->nshards > 1 && a->shard == 0)
        snapshot_fan_out(a, sent.snap_id);
out:
    freeReplyObject(exec);
    txn_fini(&t);
    return err;
}
