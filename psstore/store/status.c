/*
 * status.c - what operators and serve read about a model besides its
 * weights: the versions and drops streams, retained snapshots, membership,
 * per-partition watermarks and log ends, holdout evaluations; and the two
 * reports other roles add for them (log ends from consumers, evaluations
 * from the evaluator). Nothing here writes the applier's state.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/store/store_int.h"

#define EVALS_KEEP 1000 /* MAXLEN ~ of the evals stream */

static const char *const drop_names[] = {"epoch",     "replay",    "duplicate",
                                         "malformed", "nonfinite", "staleness",
                                         "empty",     "stopped",   "backup"};

const char *psstore_drop_name(psstore_drop_t d)
{
    return (unsigned)d < sizeof(drop_names) / sizeof(drop_names[0]) ? drop_names[d] : "unknown";
}

static int64_t num(const redisReply *r)
{
    return r != NULL && r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : 0;
}

/* The value of field name in a stream entry's field/value array, or NULL. */
static const redisReply *field(const redisReply *kv, const char *name)
{
    if (kv == NULL || kv->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t i = 0; i + 1 < kv->elements; i += 2) {
        const redisReply *f = kv->element[i];
        if (f->type == REDIS_REPLY_STRING && f->len == strlen(name) &&
            memcmp(f->str, name, f->len) == 0)
            return kv->element[i + 1];
    }
    return NULL;
}

static double dbl(const redisReply *r)
{
    return r != NULL && r->type == REDIS_REPLY_STRING ? strtod(r->str, NULL) : 0.0;
}

/*
 * XREVRANGE key + - COUNT max (the newest entries first): take(kv, out, k)
 * fills the k-th element of out from an entry's field/value array; entries
 * of another shape are skipped. *n receives the count taken.
 */
static fr_err_t read_tail(psstore_conn_t *c, const char *model, const char *what, size_t max,
                          void (*take)(const redisReply *kv, void *out, size_t k), void *out,
                          size_t *n)
{
    char key[PS_KEY_MAX], tag[PS_TAG_MAX];
    fr_err_t err;
    *n = 0;
    /* a sharded model's versions and drops: shard 0's (docs/design.md "Shards") */
    if (strcmp(what, "evals") != 0 && (err = ps_read_tag(c, model, tag)) != FR_OK)
        return err;
    ps_key(key, strcmp(what, "evals") != 0 ? tag : model, what);
    redisReply *r = ps_cmd(c, 1, &err, "XREVRANGE %s + - COUNT %lld", key, (long long)max);
    if (r == NULL)
        return err;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements && *n < max; i++) {
        const redisReply *e = r->element[i];
        if (e->type == REDIS_REPLY_ARRAY && e->elements == 2)
            take(e->element[1], out, (*n)++);
    }
    freeReplyObject(r);
    return FR_OK;
}

static void take_version(const redisReply *kv, void *out, size_t k)
{
    psstore_version_entry_t *v = (psstore_version_entry_t *)out + k;
    v->version = num(field(kv, "version"));
    const redisReply *ep = field(kv, "epoch");
    v->epoch = ep != NULL && ep->type == REDIS_REPLY_STRING ? strtoull(ep->str, NULL, 10) : 0;
    v->tau = num(field(kv, "tau"));
    v->lr_eff = dbl(field(kv, "lr_eff"));
    v->loss = dbl(field(kv, "loss"));
    v->n = num(field(kv, "n"));
    v->k = field(kv, "k") != NULL ? num(field(kv, "k")) : 1;
    v->t_ms = num(field(kv, "t"));
    long long lo = 0, hi = 0;
    const redisReply *ts = field(kv, "ts");
    char tsbuf[64];
    ps_reply_copy(tsbuf, sizeof(tsbuf), ts);
    if (ts == NULL || sscanf(tsbuf, "%lld:%lld", &lo, &hi) != 2 || lo <= 0 || hi < lo)
        lo = hi = 0;
    v->ts_min_ms = lo;
    v->ts_max_ms = hi;
    ps_reply_copy(v->worker, sizeof(v->worker), field(kv, "worker"));
    v->rollback_from = field(kv, "rollback_from") != NULL ? num(field(kv, "rollback_from")) : -1;
}

fr_err_t psstore_versions_tail(psstore_conn_t *c, const char *model, size_t max,
                               psstore_version_entry_t *out, size_t *n)
{
    return read_tail(c, model, "versions", max, take_version, out, n);
}

static void take_drop(const redisReply *kv, void *out, size_t k)
{
    psstore_drop_entry_t *d = (psstore_drop_entry_t *)out + k;
    ps_reply_copy(d->worker, sizeof(d->worker), field(kv, "worker"));
    ps_reply_copy(d->reason, sizeof(d->reason), field(kv, "reason"));
    d->n = num(field(kv, "n"));
    d->t_ms = num(field(kv, "t"));
}

fr_err_t psstore_drops_tail(psstore_conn_t *c, const char *model, size_t max,
                            psstore_drop_entry_t *out, size_t *n)
{
    return read_tail(c, model, "drops", max, take_drop, out, n);
}

fr_err_t psstore_eval_report(psstore_conn_t *c, const char *model, int64_t version, double accuracy,
                             double loss)
{
    char key[PS_KEY_MAX], ver[32], acc[32], lss[32], now[32];
    fr_err_t err;
    ps_key(key, model, "evals");
    snprintf(ver, sizeof(ver), "%lld", (long long)version);
    snprintf(acc, sizeof(acc), "%.9g", accuracy);
    snprintf(lss, sizeof(lss), "%.9g", loss);
    snprintf(now, sizeof(now), "%lld", (long long)fr_clock_unix_ms());
    redisReply *r = ps_cmd(c, 0, &err, "XADD %s MAXLEN ~ %d * version %s accuracy %s loss %s t %s",
                           key, EVALS_KEEP, ver, acc, lss, now);
    if (r == NULL)
        return err;
    freeReplyObject(r);
    return FR_OK;
}

fr_err_t psstore_eval_report_progressive(psstore_conn_t *c, const char *model, int64_t version,
                                         double logloss, double auc, double floor, size_t n)
{
    char key[PS_KEY_MAX], keep[16], ver[32], lss[32], a[32], fl[32], cnt[32], now[32];
    fr_err_t err;
    ps_key(key, model, "evals");
    snprintf(keep, sizeof(keep), "%d", EVALS_KEEP);
    snprintf(ver, sizeof(ver), "%lld", (long long)version);
    snprintf(lss, sizeof(lss), "%.9g", logloss);
    snprintf(a, sizeof(a), "%.9g", auc);
    snprintf(fl, sizeof(fl), "%.9g", floor);
    snprintf(cnt, sizeof(cnt), "%zu", n);
    snprintf(now, sizeof(now), "%lld", (long long)fr_clock_unix_ms());
    const char *argv[18] = {"XADD", key,    "MAXLEN", "~", keep, "*", "version",
                            ver,    "loss", lss,      "n", cnt,  "t", now};
    int argc = 14;
    if (isfinite(auc)) {
        argv[argc++] = "auc";
        argv[argc++] = a;
    }
    if (isfinite(floor)) {
        argv[argc++] = "floor";
        argv[argc++] = fl;
    }
    redisReply *r = ps_cmd_argv(c, 0, argc, argv, NULL, &err);
    if (r == NULL)
        return err;
    freeReplyObject(r);
    return FR_OK;
}

/* A number field, NAN when the entry lacks it. */
static double dbl_or_nan(const redisReply *kv, const char *name)
{
    const redisReply *f = field(kv, name);
    return f != NULL ? dbl(f) : NAN;
}

static void take_eval(const redisReply *kv, void *out, size_t k)
{
    psstore_eval_entry_t *v = (psstore_eval_entry_t *)out + k;
    v->version = num(field(kv, "version"));
    v->accuracy = dbl_or_nan(kv, "accuracy");
    v->loss = dbl(field(kv, "loss"));
    v->auc = dbl_or_nan(kv, "auc");
    v->floor = dbl_or_nan(kv, "floor");
    v->n = num(field(kv, "n"));
    v->t_ms = num(field(kv, "t"));
}

fr_err_t psstore_evals_tail(psstore_conn_t *c, const char *model, size_t max,
                            psstore_eval_entry_t *out, size_t *n)
{
    return read_tail(c, model, "evals", max, take_eval, out, n);
}

fr_err_t psstore_snapshots_list(psstore_conn_t *c, const char *model, psstore_snapshot_info_t *out,
                                size_t max, size_t *n)
{
    char key[PS_KEY_MAX], tag[PS_TAG_MAX];
    fr_err_t err;
    *n = 0;
    if ((err = ps_read_tag(c, model, tag)) != FR_OK) /* sharded: shard 0 names them */
        return err;
    ps_key(key, tag, "snaps");
    redisReply *r = ps_cmd(c, 1, &err, "ZRANGE %s 0 -1 WITHSCORES", key);
    if (r == NULL)
        return err;
    /* the newest max of them, oldest first */
    size_t total = r->type == REDIS_REPLY_ARRAY ? r->elements / 2 : 0;
    for (size_t i = total > max ? total - max : 0; i < total; i++) {
        out[*n].version = num(r->element[2 * i]);
        out[*n].time_ms = num(r->element[2 * i + 1]);
        (*n)++;
    }
    freeReplyObject(r);
    return FR_OK;
}

fr_err_t psstore_members_list(psstore_conn_t *c, const char *model, psstore_member_t **members,
                              size_t *n, size_t *cap)
{
    char key[PS_KEY_MAX];
    ps_key(key, model, "members");
    return ps_members_read(c, key, members, n, cap);
}

fr_err_t psstore_logend_report(psstore_conn_t *c, const char *model, const psstore_logend_t *ends,
                               size_t n)
{
    if (n == 0)
        return FR_OK;
    char key[PS_KEY_MAX];
    ps_key(key, model, "logend");
    size_t argc = 2 + 2 * n;
    const char **argv = calloc(argc, sizeof(*argv));
    size_t *lens = calloc(argc, sizeof(*lens));
    char *buf = malloc(n * 340);
    if (argv == NULL || lens == NULL || buf == NULL) {
        free(argv);
        free(lens);
        free(buf);
        return ps_fail(c, FR_ERR_NOMEM, "logend: out of memory");
    }
    argv[0] = "HSET";
    argv[1] = key;
    lens[0] = 4;
    lens[1] = strlen(key);
    int64_t now = fr_clock_unix_ms();
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        char *f = buf + off;
        int fl = psstore_key_format(f, PSSTORE_KEY_MAX, ends[i].topic, ends[i].partition);
        if (fl > PSSTORE_KEY_MAX - 1)
            fl = PSSTORE_KEY_MAX - 1;
        char *v = f + fl + 1;
        int vl = snprintf(v, 64, "%lld %lld %lld", (long long)ends[i].log_end,
                          (long long)ends[i].watermark, (long long)now);
        argv[2 + 2 * i] = f;
        lens[2 + 2 * i] = (size_t)fl;
        argv[3 + 2 * i] = v;
        lens[3 + 2 * i] = (size_t)vl;
        off += (size_t)fl + 1 + (size_t)vl + 1;
    }
    fr_err_t err;
    redisReply *r = ps_cmd_argv(c, 1, (int)argc, argv, lens, &err);
    free(argv);
    free(lens);
    free(buf);
    if (r == NULL)
        return err;
    freeReplyObject(r);
    return FR_OK;
}

static int part_cmp(const void *a, const void *b)
{
    const psstore_partition_status_t *x = a, *y = b;
    int t = strcmp(x->topic, y->topic);
    if (t != 0)
        return t;
    return x->partition < y->partition ? -1 : x->partition > y->partition;
}

fr_err_t psstore_partitions_read(psstore_conn_t *c, const char *model,
                                 psstore_partition_status_t **parts, size_t *n, size_t *cap)
{
    char k_off[PS_KEY_MAX], k_end[PS_KEY_MAX], tag[PS_TAG_MAX];
    fr_err_t err;
    if ((err = ps_read_tag(c, model, tag)) != FR_OK)
        return err;
    int sharded = strcmp(tag, model) != 0;
    ps_key(k_off, tag, "offsets");
    ps_key(k_end, model, "logend");
    redisReply *ro = ps_cmd(c, 1, &err, "HGETALL %s", k_off);
    if (ro == NULL)
        return err;
    redisReply *re = ps_cmd(c, 1, &err, "HGETALL %s", k_end);
    if (re == NULL) {
        freeReplyObject(ro);
        return err;
    }
    *n = 0;
    size_t no = ro->type == REDIS_REPLY_ARRAY ? ro->elements / 2 : 0;
    size_t ne = re->type == REDIS_REPLY_ARRAY ? re->elements / 2 : 0;
    if (no + ne > *cap) {
        psstore_partition_status_t *p = realloc(*parts, (no + ne) * sizeof(*p));
        if (p == NULL) {
            freeReplyObject(ro);
            freeReplyObject(re);
            return ps_fail(c, FR_ERR_NOMEM, "partitions: out of memory");
        }
        *parts = p;
        *cap = no + ne;
    }
    for (size_t i = 0; i < no; i++) {
        const redisReply *k = ro->element[2 * i], *v = ro->element[2 * i + 1];
        psstore_partition_status_t *p = &(*parts)[*n];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING ||
            psstore_key_parse(k->str, k->len, p->topic, sizeof(p->topic), &p->partition) != 0)
            continue;
        psstore_partition_offsets_t po;
        psstore_poff_init(&po, 0);
        if (psstore_poff_parse(&po, v->str, v->len, NULL, 0) != FR_OK) {
            psstore_poff_fini(&po);
            continue;
        }
        p->watermark = po.watermark;
        p->spans = po.nspans;
        psstore_poff_fini(&po);
        /* sharded: shard 0 lists the partitions; their offsets are what the
         * consumer starts from (the lowest watermark over the shards) */
        int found = 0;
        psstore_poff_init(&po, 0);
        if (sharded &&
            psstore_offsets_read(c, model, p->topic, p->partition, &po, &found) == FR_OK) {
            p->watermark = po.watermark;
            p->spans = po.nspans;
        }
        psstore_poff_fini(&po);
        p->log_end = p->lag = -1;
        p->log_end_ms = 0;
        (*n)++;
    }
    size_t nwm = *n;
    for (size_t i = 0; i < ne; i++) {
        const redisReply *k = re->element[2 * i], *v = re->element[2 * i + 1];
        char topic[256];
        int32_t partition;
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING ||
            psstore_key_parse(k->str, k->len, topic, sizeof(topic), &partition) != 0)
            continue;
        long long end = -1, w = -1, ms = 0;
        char val[96];
        snprintf(val, sizeof(val), "%.*s", (int)v->len, v->str);
        if (sscanf(val, "%lld %lld %lld", &end, &w, &ms) != 3 || end < 0 || w < 0)
            continue;
        psstore_partition_status_t *p = NULL;
        for (size_t j = 0; j < nwm && p == NULL; j++)
            if ((*parts)[j].partition == partition && strcmp((*parts)[j].topic, topic) == 0)
                p = &(*parts)[j];
        if (p == NULL) { /* a log end the store has no watermark for yet */
            p = &(*parts)[(*n)++];
            snprintf(p->topic, sizeof(p->topic), "%s", topic);
            p->partition = partition;
            p->watermark = 0;
            p->spans = 0;
            p->log_end = p->lag = -1;
        }
        p->log_end = end;
        p->lag = end > w ? end - w : 0;
        p->log_end_ms = ms;
    }
    freeReplyObject(ro);
    freeReplyObject(re);
    if (*n > 1)
        qsort(*parts, *n, sizeof(**parts), part_cmp);
    return FR_OK;
}

/* ---- following the versions stream ---------------------------------------- */

fr_err_t psstore_versions_last_id(psstore_conn_t *c, const char *model, char *id)
{
    char key[PS_KEY_MAX], tag[PS_TAG_MAX];
    fr_err_t err = ps_read_tag(c, model, tag); /* sharded: shard 0's stream */
    if (err != FR_OK)
        return err;
    ps_key(key, tag, "versions");
    return ps_stream_last_id(c, key, id);
}

fr_err_t ps_stream_last_id(psstore_conn_t *c, const char *key, char *id)
{
    fr_err_t err;
    redisReply *r = ps_cmd(c, 1, &err, "XREVRANGE %s + - COUNT 1", key);
    if (r == NULL)
        return err;
    snprintf(id, PSSTORE_STREAM_ID_MAX, "0-0");
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
        r->element[0]->type == REDIS_REPLY_ARRAY && r->element[0]->elements == 2)
        ps_reply_copy(id, PSSTORE_STREAM_ID_MAX, r->element[0]->element[0]);
    freeReplyObject(r);
    return FR_OK;
}

fr_err_t psstore_versions_wait(psstore_conn_t *c, const char *const *models, size_t n,
                               char (*ids)[PSSTORE_STREAM_ID_MAX], int block_ms, int *moved)
{
    if (n == 0)
        return FR_OK;
    size_t argc = 6 + 2 * n;
    const char **argv = calloc(argc, sizeof(*argv));
    char(*keys)[PS_KEY_MAX] = calloc(n, sizeof(*keys));
    if (argv == NULL || keys == NULL) {
        free(argv);
        free(keys);
        return ps_fail(c, FR_ERR_NOMEM, "versions: out of memory");
    }
    char block[32];
    snprintf(block, sizeof(block), "%d", block_ms < 0 ? 0 : block_ms);
    argv[0] = "XREAD";
    argv[1] = "COUNT";
    argv[2] = "1";
    argv[3] = "BLOCK";
    argv[4] = block;
    argv[5] = "STREAMS";
    for (size_t i = 0; i < n; i++) {
        /* a sharded model wakes on shard 0's versions: in every mode each
         * gradient moves every shard, shard 0 with the others */
        char tag[PS_TAG_MAX];
        fr_err_t terr = ps_read_tag(c, models[i], tag);
        if (terr != FR_OK) {
            free(argv);
            free(keys);
            return terr;
        }
        ps_key(keys[i], tag, "versions");
        argv[6 + i] = keys[i];
        argv[6 + n + i] = ids[i];
        moved[i] = 0;
    }
    fr_err_t err;
    redisReply *r = ps_cmd_argv(c, 1, (int)argc, argv, NULL, &err);
    free(argv);
    if (r == NULL) {
        free(keys);
        return err;
    }
    /* [[key, [[id, fields]]], ...]; nil on a timeout */
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        const redisReply *s = r->element[i];
        if (s->type != REDIS_REPLY_ARRAY || s->elements != 2 ||
            s->element[0]->type != REDIS_REPLY_STRING)
            continue;
        for (size_t j = 0; j < n; j++)
            if (strlen(keys[j]) == s->element[0]->len &&
                memcmp(keys[j], s->element[0]->str, s->element[0]->len) == 0)
                moved[j] = 1;
    }
    freeReplyObject(r);
    free(keys);
    /* jump to the newest entry of every stream that moved */
    for (size_t j = 0; j < n; j++)
        if (moved[j] && (err = psstore_versions_last_id(c, models[j], ids[j])) != FR_OK)
            return err;
    return FR_OK;
}
