/*
 * stats.c - the dashboard's stats of a model (docs/http.md "Stats"):
 * staleness, the versions series, holdout evaluations, partitions,
 * workers, drops and freshness, read from the store's streams and built
 * into one JSON document by the follower once a second while a dashboard
 * asks for them.
 *
 * Threads: the follower (follow.c) only; the document is published under
 * s->lock.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_int.h"

#define VERSIONS_WINDOW 2000 /* versions entries the stats look at        */
#define DROPS_WINDOW    1000
#define EVALS_WINDOW    300
#define SERIES_MAX      300   /* one point per second                      */
#define FRESH_WINDOW    256   /* batches the freshness looks at (the applier's) */
#define RATE_WINDOW_MS  10000 /* throughput and per-worker speed           */

static const double stale_bounds[] = {0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128};
#define NBOUNDS (sizeof(stale_bounds) / sizeof(stale_bounds[0]))

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The p-th percentile (nearest rank) of v[n], sorted in place; -1 when n = 0. */
static int64_t percentile(int64_t *v, size_t n, double p)
{
    if (n == 0)
        return -1;
    qsort(v, n, sizeof(*v), cmp_i64);
    size_t rank = (size_t)ceil(p * (double)n);
    return v[rank > 0 ? rank - 1 : 0];
}

void sv_stats_scratch_fini(sv_stats_scratch_t *x)
{
    free(x->ver);
    free(x->drops);
    free(x->evals);
    free(x->members);
    free(x->parts);
    free(x->taus);
}

/* Writes the per-worker rows: members first, then workers seen in the
 * window that are no members (left or in another mode). */
static void stats_workers(fr_buf_t *b, const psstore_member_t *mem, size_t nmem,
                          const psstore_version_entry_t *ver, size_t nver,
                          const psstore_drop_entry_t *drops, size_t ndrops, int64_t now)
{
    fr_buf_puts(b, "\"workers\":[");
    const char *seen[256];
    size_t nseen = 0, rows = 0;
    for (size_t pass = 0; pass < 2; pass++) {
        size_t count = pass == 0 ? nmem : nver;
        for (size_t i = 0; i < count && rows < 256; i++) {
            const char *id = pass == 0 ? mem[i].id : ver[i].worker;
            if (pass == 1) {
                if (ver[i].rollback_from >= 0 || id[0] == '\0')
                    continue;
                int dup = 0;
                for (size_t j = 0; j < nseen && !dup; j++)
                    dup = strcmp(seen[j], id) == 0;
                if (dup)
                    continue;
            }
            if (nseen < 256)
                seen[nseen++] = id;
            int64_t grads = 0, samples = 0, last_tau = -1, dropped = 0;
            for (size_t j = 0; j < nver; j++) {
                if (strcmp(ver[j].worker, id) != 0 || ver[j].rollback_from >= 0)
                    continue;
                grads += ver[j].k;
                if (last_tau < 0)
                    last_tau = ver[j].tau; /* newest first */
                if (now - ver[j].t_ms <= RATE_WINDOW_MS)
                    samples += ver[j].n;
            }
            for (size_t j = 0; j < ndrops; j++)
                if (strcmp(drops[j].worker, id) == 0)
                    dropped++;
            fr_buf_puts(b, rows++ ? ",{\"id\":" : "{\"id\":");
            fr_json_str(b, id);
            if (pass == 0) {
                fr_buf_puts(b, ",\"backend\":");
                fr_json_str(b, mem[i].backend);
                fr_buf_printf(b, ",\"group\":%d,\"idle\":%s,\"clock\":%lld,\"member\":true",
                              mem[i].group, mem[i].idle ? "true" : "false",
                              (long long)mem[i].clock);
            } else {
                fr_buf_puts(b, ",\"backend\":null,\"group\":null,\"idle\":null,\"clock\":null,"
                               "\"member\":false");
            }
            fr_buf_puts(b, ",\"samples_per_s\":");
            sv_json_num(b, (double)samples * 1000.0 / RATE_WINDOW_MS);
            fr_buf_printf(b, ",\"gradients\":%lld,\"last_tau\":", (long long)grads);
            if (last_tau >= 0)
                fr_buf_printf(b, "%lld", (long long)last_tau);
            else
                fr_buf_puts(b, "null");
            fr_buf_printf(b, ",\"dropped\":%lld}", (long long)dropped);
        }
    }
    fr_buf_puts(b, "]");
}

/* One point per second of the versions window, oldest first. */
static void stats_series(fr_buf_t *b, const psstore_version_entry_t *ver, size_t nver,
                         int64_t *taus)
{
    fr_buf_puts(b, "\"series\":[");
    /* the window is newest first: walk it backwards, a second at a time,
     * starting at most SERIES_MAX seconds before the newest entry */
    int64_t newest = nver > 0 ? ver[0].t_ms / 1000 : 0;
    size_t i = nver, points = 0;
    while (i > 0) {
        int64_t sec = ver[i - 1].t_ms / 1000;
        size_t ntau = 0;
        int64_t samples = 0, versions = 0;
        double lr = 0, loss = 0;
        while (i > 0 && ver[i - 1].t_ms / 1000 == sec) {
            const psstore_version_entry_t *e = &ver[--i];
            if (e->rollback_from >= 0)
                continue;
            taus[ntau++] = e->tau;
            samples += e->n;
            versions++;
            lr += e->lr_eff;
            loss += e->loss * (double)e->n;
        }
        if (versions == 0 || newest - sec >= SERIES_MAX)
            continue;
        int64_t p50 = percentile(taus, ntau, 0.5), p99 = percentile(taus, ntau, 0.99);
        fr_buf_printf(b,
                      "%s{\"t\":%lld,\"samples_per_s\":%lld,\"versions_per_s\":%lld,"
                      "\"tau_p50\":%lld,\"tau_p99\":%lld,\"lr_eff\":",
                      points++ ? "," : "", (long long)sec * 1000, (long long)samples,
                      (long long)versions, (long long)p50, (long long)p99);
        sv_json_num(b, lr / (double)versions);
        fr_buf_puts(b, ",\"loss\":");
        sv_json_num(b, samples > 0 ? loss / (double)samples : NAN);
        fr_buf_puts(b, "}");
    }
    fr_buf_puts(b, "]");
}

/* Reads the windows the stats look at into x, allocated on first use.
 * Returns FR_ERR_REDIS-class errors or FR_ERR_NOMEM. */
static fr_err_t stats_read(psstore_conn_t *c, const sv_model_t *m, sv_stats_scratch_t *x)
{
    if (x->ver == NULL)
        x->ver = malloc(VERSIONS_WINDOW * sizeof(*x->ver));
    if (x->drops == NULL)
        x->drops = malloc(DROPS_WINDOW * sizeof(*x->drops));
    if (x->evals == NULL)
        x->evals = malloc(EVALS_WINDOW * sizeof(*x->evals));
    if (x->taus == NULL)
        x->taus = malloc(VERSIONS_WINDOW * sizeof(*x->taus));
    if (x->ver == NULL || x->drops == NULL || x->evals == NULL || x->taus == NULL)
        return FR_ERR_NOMEM;
    x->nmem = 0;
    x->nparts = 0;
    fr_err_t err;
    if ((err = psstore_versions_tail(c, m->name, VERSIONS_WINDOW, x->ver, &x->nver)) != FR_OK ||
        (err = psstore_drops_tail(c, m->name, DROPS_WINDOW, x->drops, &x->ndrops)) != FR_OK ||
        (err = psstore_evals_tail(c, m->name, EVALS_WINDOW, x->evals, &x->nevals)) != FR_OK ||
        (err = psstore_members_list(c, m->name, &x->members, &x->nmem, &x->members_cap)) != FR_OK ||
        (err = psstore_partitions_read(c, m->name, &x->parts, &x->nparts, &x->parts_cap)) != FR_OK)
        return err;
    return FR_OK;
}

/* The model's info and snapshots, as the follower holds them; returns the
 * newest snapshot's time. Takes s->lock. */
static int64_t stats_model(fr_buf_t *b, struct serve *s, sv_model_t *m, int64_t now)
{
    pthread_mutex_lock(&s->lock);
    psstore_model_info_t info = m->info;
    int64_t published = m->published_ms;
    fr_buf_puts(b, "{\"model\":");
    fr_json_str(b, m->name);
    fr_buf_puts(b, ",\"store\":\"ok\",\"stopped\":");
    fr_json_str(b, info.stopped);
    fr_buf_printf(b, ",\"epoch\":\"%llu\",\"version\":%lld,\"layers\":",
                  (unsigned long long)info.epoch, (long long)info.version);
    fr_json_str(b, info.layers);
    fr_buf_puts(b, ",\"loss\":");
    fr_json_str(b, info.loss);
    fr_buf_puts(b, ",\"mode\":");
    fr_json_str(b, info.mode);
    fr_buf_puts(b, ",\"phase\":");
    fr_json_str(b, info.phase);
    fr_buf_printf(b, ",\"mode_switches\":%lld", (long long)info.mode_switches);
    fr_buf_printf(b, ",\"time_ms\":%lld,", (long long)now);
    fr_buf_puts(b, "\"snapshots\":[");
    for (size_t i = 0; i < m->nlisted; i++)
        fr_buf_printf(b, "%s{\"version\":%lld,\"time_ms\":%lld}", i ? "," : "",
                      (long long)m->listed[i].version, (long long)m->listed[i].time_ms);
    fr_buf_puts(b, "],");
    pthread_mutex_unlock(&s->lock);
    return published;
}

/* Staleness over the versions window, throughput over RATE_WINDOW_MS, the
 * newest lr_eff and train loss. */
static void stats_staleness(fr_buf_t *b, sv_stats_scratch_t *x, int64_t now)
{
    uint64_t counts[NBOUNDS + 1] = {0};
    size_t ntau = 0, nver = x->nver;
    int64_t rate_samples = 0, rate_versions = 0;
    for (size_t i = 0; i < nver; i++) {
        if (x->ver[i].rollback_from >= 0)
            continue;
        int64_t t = x->ver[i].tau;
        size_t k = 0;
        while (k < NBOUNDS && (double)t > stale_bounds[k])
            k++;
        counts[k]++;
        x->taus[ntau++] = t;
        if (now - x->ver[i].t_ms <= RATE_WINDOW_MS) {
            rate_samples += x->ver[i].n;
            rate_versions++;
        }
    }
    fr_buf_puts(b, "\"staleness\":{\"bounds\":[");
    for (size_t k = 0; k < NBOUNDS; k++)
        fr_buf_printf(b, "%s%g", k ? "," : "", stale_bounds[k]);
    fr_buf_puts(b, "],\"counts\":[");
    for (size_t k = 0; k <= NBOUNDS; k++)
        fr_buf_printf(b, "%s%llu", k ? "," : "", (unsigned long long)counts[k]);
    size_t window = ntau;
    int64_t p50 = percentile(x->taus, ntau, 0.5), p99 = percentile(x->taus, ntau, 0.99);
    fr_buf_printf(b, "],\"p50\":%lld,\"p99\":%lld,\"window\":%zu},", (long long)p50, (long long)p99,
                  window);
    fr_buf_puts(b, "\"throughput\":{\"samples_per_s\":");
    sv_json_num(b, (double)rate_samples * 1000.0 / RATE_WINDOW_MS);
    fr_buf_puts(b, ",\"versions_per_s\":");
    sv_json_num(b, (double)rate_versions * 1000.0 / RATE_WINDOW_MS);
    fr_buf_puts(b, "},\"lr_eff\":");
    sv_json_num(b, nver > 0 && x->ver[0].rollback_from < 0 ? x->ver[0].lr_eff : NAN);
    fr_buf_puts(b, ",\"train_loss\":");
    sv_json_num(b, nver > 0 && x->ver[0].rollback_from < 0 ? x->ver[0].loss : NAN);
}

/* The holdout evaluations, oldest first. */
static void stats_holdout(fr_buf_t *b, const psstore_eval_entry_t *evals, size_t nevals)
{
    fr_buf_puts(b, "\"holdout\":[");
    for (size_t i = nevals; i > 0; i--) {
        const psstore_eval_entry_t *e = &evals[i - 1];
        fr_buf_printf(b, "%s{\"t\":%lld,\"version\":%lld,\"accuracy\":", i < nevals ? "," : "",
                      (long long)e->t_ms, (long long)e->version);
        sv_json_num(b, e->accuracy);
        fr_buf_puts(b, ",\"loss\":");
        sv_json_num(b, e->loss);
        if (e->n > 0) { /* a sparse model's progressive window */
            fr_buf_puts(b, ",\"auc\":");
            sv_json_num(b, e->auc);
            fr_buf_puts(b, ",\"floor\":");
            sv_json_num(b, e->floor);
            fr_buf_printf(b, ",\"n\":%lld", (long long)e->n);
        }
        fr_buf_puts(b, "}");
    }
    fr_buf_puts(b, "]");
}

/* Each partition's watermark and, where a consumer reported it, its lag. */
static void stats_partitions(fr_buf_t *b, const psstore_partition_status_t *parts, size_t nparts)
{
    fr_buf_puts(b, "\"partitions\":[");
    for (size_t i = 0; i < nparts; i++) {
        const psstore_partition_status_t *p = &parts[i];
        fr_buf_puts(b, i ? ",{\"topic\":" : "{\"topic\":");
        fr_json_str(b, p->topic);
        fr_buf_printf(b, ",\"partition\":%d,\"watermark\":%lld,\"intervals\":%zu,",
                      (int)p->partition, (long long)p->watermark, p->spans);
        if (p->log_end >= 0)
            fr_buf_printf(b, "\"log_end\":%lld,\"lag\":%lld,\"reported_ms\":%lld}",
                          (long long)p->log_end, (long long)p->lag, (long long)p->log_end_ms);
        else
            fr_buf_puts(b, "\"log_end\":null,\"lag\":null,\"reported_ms\":null}");
    }
    fr_buf_puts(b, "]");
}

/* The drops window counted by reason; reasons never seen are left out. */
static void stats_dropped(fr_buf_t *b, const psstore_drop_entry_t *drops, size_t ndrops)
{
    fr_buf_puts(b, "\"dropped\":{");
    size_t nreasons = 0;
    for (int d = 0; d < PSSTORE_NDROP; d++) {
        const char *name = psstore_drop_name((psstore_drop_t)d);
        int64_t k = 0;
        for (size_t i = 0; i < ndrops; i++)
            k += strcmp(drops[i].reason, name) == 0;
        if (k > 0)
            fr_buf_printf(b, "%s\"%s\":%lld", nreasons++ ? "," : "", name, (long long)k);
    }
    fr_buf_puts(b, "}");
}

/* Freshness as the applier measures it: ms from the Kafka timestamps of
 * the oldest and newest sample of each of the last 256 batches to the
 * update holding them (here: its apply, at most commit_ms before the
 * commit). taus is scratch of 2 * FRESH_WINDOW. */
static void stats_freshness(fr_buf_t *b, const psstore_version_entry_t *ver, size_t nver,
                            int64_t *taus)
{
    size_t nf = 0;
    for (size_t i = 0; i < nver && i < FRESH_WINDOW; i++) {
        const psstore_version_entry_t *e = &ver[i];
        if (e->rollback_from >= 0 || e->ts_min_ms <= 0)
            continue;
        taus[nf++] = e->t_ms > e->ts_min_ms ? e->t_ms - e->ts_min_ms : 0;
        taus[nf++] = e->t_ms > e->ts_max_ms ? e->t_ms - e->ts_max_ms : 0;
    }
    fr_buf_puts(b, "\"freshness\":");
    if (nf > 0) {
        int64_t f50 = percentile(taus, nf, 0.5), f99 = percentile(taus, nf, 0.99);
        fr_buf_printf(b, "{\"p50_ms\":%lld,\"p99_ms\":%lld,\"window\":%zu}", (long long)f50,
                      (long long)f99, nf / 2);
    } else {
        fr_buf_puts(b, "null");
    }
}

fr_err_t sv_stats_build(struct serve *s, psstore_conn_t *c, sv_model_t *m, sv_stats_scratch_t *x)
{
    fr_err_t err = stats_read(c, m, x);
    if (err != FR_OK)
        return err;
    int64_t now = fr_clock_unix_ms();
    fr_buf_t b = {0};
    int64_t published = stats_model(&b, s, m, now);
    stats_staleness(&b, x, now);
    fr_buf_puts(&b, ",");
    stats_series(&b, x->ver, x->nver, x->taus);
    fr_buf_puts(&b, ",");
    stats_holdout(&b, x->evals, x->nevals);
    fr_buf_puts(&b, ",");
    stats_partitions(&b, x->parts, x->nparts);
    fr_buf_puts(&b, ",");
    stats_workers(&b, x->members, x->nmem, x->ver, x->nver, x->drops, x->ndrops, now);
    fr_buf_puts(&b, ",");
    stats_dropped(&b, x->drops, x->ndrops);
    fr_buf_puts(&b, ",");
    stats_freshness(&b, x->ver, x->nver, x->taus);
    fr_buf_puts(&b, ",\"published_ms\":");
    if (published > 0)
        fr_buf_printf(&b, "%lld", (long long)published);
    else
        fr_buf_puts(&b, "null");
    fr_buf_puts(&b, "}");
    size_t len;
    char *text = fr_buf_take(&b, &len);
    sv_blob_t *blob = text != NULL ? sv_blob_new(text, len) : NULL;
    if (blob == NULL)
        return FR_ERR_NOMEM;
    pthread_mutex_lock(&s->lock);
    sv_blob_unref(m->stats);
    m->stats = blob;
    m->stats_seq++;
    m->seq++;
    pthread_mutex_unlock(&s->lock);
    return FR_OK;
}
