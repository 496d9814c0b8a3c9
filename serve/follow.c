/*
 * follow.c - the follower thread: it keeps each wanted model's latest
 * weights, retained snapshots, metadata and stats encoded in memory, so
 * that the loop answers every client without touching Redis.
 *
 * It blocks on the versions streams of the followed models (XREAD BLOCK),
 * reads new weights at most once per (epoch, version) and at most every
 * refresh_ms, and rebuilds the stats of a model once a second while a
 * dashboard asks for them. Nothing here writes the store.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/model.h"
#include "serve/serve_int.h"

#define FOLLOW_BLOCK_MS   100  /* longest XREAD BLOCK: new requests, stop  */
#define FOLLOW_TIMEOUT_MS 2000 /* Redis connect and command timeout         */
#define MODELS_EVERY_MS   2000 /* re-reading the list of models             */
#define CHECK_EVERY_MS    1000 /* reading info even without a stream entry  */
#define STATS_EVERY_MS    1000 /* rebuilding wanted stats                   */
#define VERSIONS_WINDOW   2000 /* versions entries the stats look at        */
#define DROPS_WINDOW      1000
#define EVALS_WINDOW      300
#define SERIES_MAX        300   /* one point per second                      */
#define FRESH_WINDOW      256   /* batches the freshness looks at (the applier's) */
#define RATE_WINDOW_MS    10000 /* throughput and per-worker speed           */

static const double stale_bounds[] = {0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128};
#define NBOUNDS (sizeof(stale_bounds) / sizeof(stale_bounds[0]))

static uint64_t ms_since(uint64_t ns)
{
    return (fr_clock_mono_ns() - ns) / 1000000u;
}

sv_model_t *sv_model_get(struct serve *s, const char *name, int create)
{
    for (size_t i = 0; i < s->nmodels; i++)
        if (strcmp(s->models[i]->name, name) == 0)
            return s->models[i];
    if (!create || s->nmodels >= (size_t)s->conf.max_models ||
        psstore_model_name_check(name, NULL, 0) != FR_OK)
        return NULL;
    sv_model_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    snprintf(m->name, sizeof(m->name), "%s", name);
    snprintf(m->last_id, sizeof(m->last_id), "0-0");
    m->pending = 1;
    s->models[s->nmodels++] = m;
    return m;
}

/* ---- weights -------------------------------------------------------------- */

/* Encodes w as a view of (epoch, version). NULL on a bad model or no memory. */
static sv_view_t *make_view(const model_t *tm, const char *model, const float *w, uint64_t epoch,
                            int64_t version, int64_t time_ms, const char *offsets, char *why,
                            size_t whysize)
{
    char ver[32], ep[32];
    snprintf(ver, sizeof(ver), "%lld", (long long)version);
    snprintf(ep, sizeof(ep), "%llu", (unsigned long long)epoch);
    fr_st_kv_t extra[] = {{"freshet.model", model},
                          {"freshet.version", ver},
                          {"freshet.epoch", ep},
                          {"freshet.offsets", offsets != NULL ? offsets : ""}};
    uint8_t *st;
    size_t len;
    if (model_encode(tm, w, extra, offsets != NULL ? 4 : 3, &st, &len, why, whysize) != FR_OK)
        return NULL;
    sv_view_t *v = calloc(1, sizeof(*v));
    if (v == NULL) {
        free(st);
        snprintf(why, whysize, "out of memory");
        return NULL;
    }
    v->offsets = strdup(offsets != NULL ? offsets : "");
    if (v->offsets == NULL) {
        free(st);
        free(v);
        snprintf(why, whysize, "out of memory");
        return NULL;
    }
    atomic_init(&v->refs, 1);
    v->epoch = epoch;
    v->version = version;
    v->time_ms = time_ms;
    model_layers(tm, v->layers, sizeof(v->layers));
    snprintf(v->loss, sizeof(v->loss), "%s", model_loss_name(tm->loss));
    snprintf(v->etag, sizeof(v->etag), "\"%llu-v%lld\"", (unsigned long long)epoch,
             (long long)version);
    v->st = (char *)st;
    v->st_len = len;
    v->raw_len = tm->nparams * sizeof(float);
    v->raw_off = len - v->raw_len; /* tensors are contiguous, in layout order, at the end */
    return v;
}

/* Notes why m's weights cannot be served; waiting clients get the reason. */
static void model_error(struct serve *s, sv_model_t *m, const char *why, int *changed)
{
    pthread_mutex_lock(&s->lock);
    if (strncmp(m->error, why, sizeof(m->error) - 1) != 0) {
        snprintf(m->error, sizeof(m->error), "%.255s", why);
        m->seq++;
        *changed = 1;
    }
    pthread_mutex_unlock(&s->lock);
}

/* Replaces *slot by v (v's reference moves into the slot). Under s->lock. */
static void put_view(sv_view_t **slot, sv_view_t *v)
{
    sv_view_t *old = *slot;
    *slot = v;
    sv_view_unref(old);
}

int sv_snapshot_unserved(const sv_model_t *m, int64_t version)
{
    for (size_t i = 0; i < m->nunserved; i++)
        if (m->unserved[i] == version)
            return 1;
    return 0;
}

/* Drops m's weights and snapshots: the model left the store. */
static void model_gone(struct serve *s, sv_model_t *m, int *changed)
{
    pthread_mutex_lock(&s->lock);
    if (m->present || m->cur != NULL) {
        m->present = 0;
        put_view(&m->cur, NULL);
        for (size_t i = 0; i < m->nsnaps; i++)
            sv_view_unref(m->snaps[i]);
        m->nsnaps = 0;
        m->nlisted = 0;
        m->nunserved = 0;
        m->published_ms = 0;
        m->seq++;
        *changed = 1;
    }
    pthread_mutex_unlock(&s->lock);
}

/*
 * Reads m's info into m->info and *info, and sets *load when its weights
 * are to be read now. Returns FR_ERR_REDIS-class errors only; a model gone
 * or malformed is handled here (*load stays 0).
 */
static fr_err_t refresh_info(struct serve *s, psstore_conn_t *c, sv_model_t *m,
                             psstore_model_info_t *info, int *changed, int *load)
{
    *load = 0;
    fr_err_t err = psstore_model_info(c, m->name, info);
    if (err == FR_ERR_NOTFOUND) {
        model_gone(s, m, changed);
        m->pending = 0;
        return FR_OK;
    }
    if (err == FR_ERR_PARSE || err == FR_ERR_RANGE || err == FR_ERR_INVAL) {
        /* this model's keys are malformed: its error, not the store's */
        model_error(s, m, psstore_conn_error(c), changed);
        m->pending = 0;
        return FR_OK;
    }
    if (err != FR_OK)
        return err;
    /* the retained snapshots: listed for stats and metadata whether or not
     * anyone reads weights here (freshet run's own serve, say) */
    psstore_snapshot_info_t listed[SV_MAX_SNAPS];
    size_t nlisted = 0;
    if ((err = psstore_snapshots_list(c, m->name, listed, SV_MAX_SNAPS, &nlisted)) != FR_OK)
        return err;
    int64_t published = 0;
    for (size_t i = 0; i < nlisted; i++)
        published = listed[i].time_ms > published ? listed[i].time_ms : published;
    pthread_mutex_lock(&s->lock);
    int was_present = m->present;
    int info_moved = memcmp(&m->info, info, sizeof(*info)) != 0 || nlisted != m->nlisted ||
                     memcmp(m->listed, listed, nlisted * sizeof(listed[0])) != 0;
    m->info = *info;
    m->present = 1;
    memcpy(m->listed, listed, nlisted * sizeof(listed[0]));
    m->nlisted = nlisted;
    m->published_ms = published;
    if (!was_present || info_moved) {
        m->seq++;
        *changed = 1;
    }
    if (published > 0) {
        const char *lv[] = {m->name};
        fr_series_set(fr_metric_series(s->m_published, lv), (double)published / 1000.0);
    }
    /* kept current while asked for; read once in any case (readiness) */
    int wanted = fr_clock_unix_ms() - m->wanted_ms < SV_WANTED_MS || m->cur == NULL;
    sv_view_t *cur = m->cur;
    /* a retained snapshot listed but neither held nor known unservable is
     * read with the weights, even when they did not move (a client that
     * asked for it was told to try again) */
    int missing = 0;
    for (size_t i = 0; i < m->nlisted && !missing; i++) {
        int held = sv_snapshot_unserved(m, m->listed[i].version);
        for (size_t j = 0; j < m->nsnaps && !held; j++)
            held = m->snaps[j]->version == m->listed[i].version;
        missing = !held;
    }
    int moved =
        cur == NULL || cur->epoch != info->epoch || cur->version != info->version || missing;
    pthread_mutex_unlock(&s->lock);
    m->pending = 0;
    if (!wanted || !moved)
        return FR_OK;
    if (cur != NULL && ms_since(m->loaded_ns) < (uint64_t)s->conf.refresh_ms) {
        m->pending = 1; /* read it once refresh_ms has passed */
        return FR_OK;
    }
    *load = 1;
    return FR_OK;
}

/*
 * Reads m's current weights into *w (grown to the model's size) and
 * encodes them as *v (caller unrefs), with their JSON while clients ask for
 * it. Returns FR_ERR_REDIS-class errors or FR_ERR_NOMEM; a model that
 * cannot be read or encoded is noted in m->error and leaves *v NULL.
 */
static fr_err_t refresh_weights(struct serve *s, psstore_conn_t *c, sv_model_t *m,
                                const psstore_model_info_t *info, model_t *tm, float **w,
                                size_t *wcap, int *changed, sv_view_t **v)
{
    model_loss_t loss;
    char why[256] = "";
    *v = NULL;
    if (info->sparse[0] != '\0') { /* docs/design.md "Sparse models": no weights vector */
        char msg[512];
        snprintf(msg, sizeof(msg),
                 "model '%s' is a sparse model (%s): it has no weights vector; read its "
                 "rows at /v2/models/%s/rows, /delta and /table",
                 m->name, info->sparse, m->name);
        model_error(s, m, msg, changed);
        return FR_OK;
    }
    if (model_loss_parse(info->loss, &loss) != FR_OK ||
        model_init(tm, info->layers, loss, why, sizeof(why)) != FR_OK) {
        pthread_mutex_lock(&s->lock);
        char msg[1024];
        snprintf(msg, sizeof(msg), "model '%s' has layers '%s' and loss '%s': %s", m->name,
                 info->layers, info->loss, why[0] ? why : "unknown loss");
        pthread_mutex_unlock(&s->lock);
        model_error(s, m, msg, changed);
        return FR_OK;
    }
    if (tm->nparams > *wcap) {
        float *p = realloc(*w, tm->nparams * sizeof(float));
        if (p == NULL)
            return FR_ERR_NOMEM;
        *w = p;
        *wcap = tm->nparams;
    }
    uint64_t epoch;
    int64_t version, shard_versions[PSSTORE_SHARDS_MAX];
    int nshards = 1;
    char *offsets = NULL;
    fr_err_t err = psstore_model_weights_shards(c, m->name, *w, tm->nparams, &epoch, &version,
                                                &offsets, shard_versions, &nshards);
    if (err == FR_ERR_NOTFOUND || err == FR_ERR_RANGE || err == FR_ERR_PARSE) {
        model_error(s, m, psstore_conn_error(c), changed);
        return FR_OK;
    }
    if (err != FR_OK)
        return err;
    m->loaded_ns = fr_clock_mono_ns();
    *v = make_view(tm, m->name, *w, epoch, version, fr_clock_unix_ms(), offsets, why, sizeof(why));
    free(offsets);
    for (int k = 0, len = 0; *v != NULL && nshards > 1 && k < nshards; k++)
        len += snprintf((*v)->shard_versions + len, sizeof((*v)->shard_versions) - (size_t)len,
                        "%s%lld", k ? "," : "", (long long)shard_versions[k]);
    if (*v == NULL) {
        char msg[300];
        snprintf(msg, sizeof(msg), "encoding the weights: %.200s", why);
        model_error(s, m, msg, changed);
        return FR_OK;
    }
    /* JSON takes ms per 100K floats: made here, off the HTTP loop, while
     * clients ask for it (else the loop makes it on demand) */
    pthread_mutex_lock(&s->lock);
    int json = fr_clock_unix_ms() - m->json_wanted_ms < SV_WANTED_MS;
    pthread_mutex_unlock(&s->lock);
    if (json && ((*v)->json = sv_weights_json(m->name, *v)) != NULL) {
        const char *lv[] = {m->name, "follower"};
        fr_series_add(fr_metric_series(s->m_json, lv), 1);
    }
    return FR_OK;
}

/*
 * The retained snapshots of epoch into snaps[SV_MAX_SNAPS] (each a
 * reference the caller owns): each read once, kept until it leaves the
 * retained set; w is scratch of tm's size. Returns FR_ERR_REDIS-class
 * errors, holding no reference.
 */
static fr_err_t refresh_snapshots(struct serve *s, psstore_conn_t *c, sv_model_t *m,
                                  const model_t *tm, float *w, uint64_t epoch, sv_view_t **snaps,
                                  size_t *nsnaps, int64_t *unserved, size_t *nunserved)
{
    psstore_snapshot_info_t list[SV_MAX_SNAPS];
    char why[256] = "";
    fr_err_t err;
    *nsnaps = 0;
    *nunserved = 0;
    pthread_mutex_lock(&s->lock); /* as refresh_info listed them just now */
    size_t nlist = m->nlisted;
    memcpy(list, m->listed, nlist * sizeof(list[0]));
    pthread_mutex_unlock(&s->lock);
    for (size_t i = 0; i < nlist; i++) {
        sv_view_t *have = NULL;
        pthread_mutex_lock(&s->lock);
        for (size_t j = 0; j < m->nsnaps && have == NULL; j++)
            if (m->snaps[j]->version == list[i].version && m->snaps[j]->epoch == epoch)
                have = sv_view_ref(m->snaps[j]);
        pthread_mutex_unlock(&s->lock);
        if (have == NULL) {
            uint64_t sep;
            err = psstore_snapshot_weights(c, m->name, list[i].version, w, tm->nparams, &sep);
            if (err == FR_ERR_NOTFOUND || err == FR_ERR_RANGE)
                continue; /* trimmed meanwhile */
            if (err != FR_OK) {
                for (size_t j = 0; j < *nsnaps; j++)
                    sv_view_unref(snaps[j]);
                return err;
            }
            if (sep == epoch)
                have = make_view(tm, m->name, w, sep, list[i].version, list[i].time_ms, NULL, why,
                                 sizeof(why));
            if (have == NULL) { /* another lineage (before a rollback), or unreadable */
                unserved[(*nunserved)++] = list[i].version;
                continue;
            }
        }
        snaps[(*nsnaps)++] = have;
    }
    return FR_OK;
}

/* Serves v and snaps from now on (their references move into m) and
 * clears m's error. */
static void refresh_publish(struct serve *s, sv_model_t *m, sv_view_t *v, sv_view_t **snaps,
                            size_t nsnaps, const int64_t *unserved, size_t nunserved, int *changed)
{
    int64_t version = v->version;
    pthread_mutex_lock(&s->lock);
    put_view(&m->cur, v);
    for (size_t i = 0; i < m->nsnaps; i++)
        sv_view_unref(m->snaps[i]);
    memcpy(m->snaps, snaps, nsnaps * sizeof(snaps[0]));
    m->nsnaps = nsnaps;
    memcpy(m->unserved, unserved, nunserved * sizeof(unserved[0]));
    m->nunserved = nunserved;
    m->error[0] = '\0';
    m->seq++;
    pthread_mutex_unlock(&s->lock);
    *changed = 1;
    const char *lv[] = {m->name};
    fr_series_set(fr_metric_series(s->m_version, lv), (double)version);
    fr_series_add(fr_metric_series(s->m_loads, lv), 1);
}

/*
 * Reads the model's info and, when its (epoch, version) moved and
 * refresh_ms has passed since the last read, its weights and any retained
 * snapshot not held yet. Returns FR_ERR_REDIS-class errors only; a model
 * that cannot be encoded is noted in m->error.
 */
static fr_err_t refresh_model(struct serve *s, psstore_conn_t *c, sv_model_t *m, float **w,
                              size_t *wcap, int *changed)
{
    psstore_model_info_t info;
    int load;
    fr_err_t err = refresh_info(s, c, m, &info, changed, &load);
    if (err != FR_OK || !load)
        return err;
    model_t tm;
    sv_view_t *v;
    if ((err = refresh_weights(s, c, m, &info, &tm, w, wcap, changed, &v)) != FR_OK || v == NULL)
        return err;
    sv_view_t *snaps[SV_MAX_SNAPS];
    size_t nsnaps;
    int64_t unserved[SV_MAX_SNAPS];
    size_t nunserved;
    err = refresh_snapshots(s, c, m, &tm, *w, v->epoch, snaps, &nsnaps, unserved, &nunserved);
    if (err != FR_OK) {
        sv_view_unref(v);
        return err;
    }
    refresh_publish(s, m, v, snaps, nsnaps, unserved, nunserved, changed);
    return FR_OK;
}

/* ---- stats ------------------------------------------------------------------ */

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

typedef struct stats_scratch {
    psstore_version_entry_t *ver;
    psstore_drop_entry_t *drops;
    psstore_eval_entry_t *evals;
    psstore_member_t *members;
    size_t members_cap;
    psstore_partition_status_t *parts;
    size_t parts_cap;
    int64_t *taus;
    size_t nver, ndrops, nevals, nmem, nparts; /* what the last read filled */
} stats_scratch_t;

static void scratch_fini(stats_scratch_t *x)
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
static fr_err_t stats_read(psstore_conn_t *c, const sv_model_t *m, stats_scratch_t *x)
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
static void stats_staleness(fr_buf_t *b, stats_scratch_t *x, int64_t now)
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

/* Builds the stats JSON of m (docs/http.md "Stats"; the README lists its
 * fields). Returns FR_ERR_REDIS-class errors or FR_ERR_NOMEM. */
static fr_err_t build_stats(struct serve *s, psstore_conn_t *c, sv_model_t *m, stats_scratch_t *x)
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

/* The metadata JSON (Open Inference Protocol shape). Under s->lock. */
static void build_meta(sv_model_t *m)
{
    const psstore_model_info_t *info = &m->info;
    int dims[FR_LAYERS_MAX], ndims = 0;
    if (fr_layers_parse(info->layers, dims, &ndims, NULL, 0) != FR_OK)
        ndims = 0;
    fr_buf_t b = {0};
    fr_buf_puts(&b, "{\"name\":");
    fr_json_str(&b, m->name);
    fr_buf_puts(&b, ",\"versions\":[");
    size_t n = 0;
    for (size_t i = 0; i < m->nlisted; i++)
        if (m->listed[i].version != info->version && !sv_snapshot_unserved(m, m->listed[i].version))
            fr_buf_printf(&b, "%s\"%lld\"", n++ ? "," : "", (long long)m->listed[i].version);
    fr_buf_printf(&b, "%s\"%lld\"],\"platform\":\"freshet\"", n ? "," : "",
                  (long long)info->version);
    if (ndims >= 2) { /* what POST .../infer takes and gives (infer.c) */
        fr_buf_printf(&b, ",\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[-1,%d]}]",
                      dims[0]);
        if (strcmp(info->loss, "softmax") == 0)
            fr_buf_printf(&b,
                          ",\"outputs\":[{\"name\":\"probabilities\",\"datatype\":\"FP32\","
                          "\"shape\":[-1,%d]},{\"name\":\"argmax\",\"datatype\":\"INT64\","
                          "\"shape\":[-1]}]",
                          dims[ndims - 1]);
        else
            fr_buf_printf(&b,
                          ",\"outputs\":[{\"name\":\"%s\",\"datatype\":\"FP32\",\"shape\":[-1,1]}]",
                          strcmp(info->loss, "logistic") == 0 ? "probability" : "score");
    }
    fr_buf_puts(&b, ",\"parameters\":{\"layers\":");
    fr_json_str(&b, info->layers);
    fr_buf_puts(&b, ",\"loss\":");
    fr_json_str(&b, info->loss);
    fr_buf_puts(&b, ",\"mode\":");
    fr_json_str(&b, info->mode);
    fr_buf_printf(
        &b, ",\"epoch\":\"%llu\",\"version\":%lld,\"shards\":%d,\"bytes\":%zu,\"created_ms\":%lld",
        (unsigned long long)info->epoch, (long long)info->version, info->shards, info->bytes,
        (long long)info->created_ms);
    fr_buf_puts(&b, ",\"stopped\":");
    fr_json_str(&b, info->stopped);
    /* the watermarks of the weights served: every position below them is in */
    fr_buf_puts(&b, ",\"offsets\":{");
    const char *o = m->cur != NULL ? m->cur->offsets : "";
    for (size_t k = 0; *o != '\0'; k++) {
        const char *eq = strchr(o, '='), *end = strchr(o, ',');
        if (end == NULL)
            end = o + strlen(o);
        if (eq == NULL || eq > end)
            break;
        char key[300];
        snprintf(key, sizeof(key), "%.*s", (int)(eq - o), o);
        fr_buf_puts(&b, k ? "," : "");
        fr_json_str(&b, key);
        fr_buf_printf(&b, ":%.*s", (int)(end - eq - 1), eq + 1);
        o = *end ? end + 1 : end;
    }
    fr_buf_puts(&b, "}");
    fr_buf_puts(&b, ",\"stats\":\"/v2/models/");
    fr_buf_puts(&b, m->name); /* names are [A-Za-z0-9._-] */
    fr_buf_puts(&b, "/stats\"}}");
    size_t len;
    char *text = fr_buf_take(&b, &len);
    sv_blob_t *blob = text != NULL ? sv_blob_new(text, len) : NULL;
    if (blob != NULL) {
        sv_blob_unref(m->meta);
        m->meta = blob;
    }
}

/* ---- the thread ----------------------------------------------------------- */

static void set_store(struct serve *s, int up, const char *why)
{
    pthread_mutex_lock(&s->lock);
    int changed = s->store_up != up;
    s->store_up = up;
    snprintf(s->store_error, sizeof(s->store_error), "%s", up ? "" : why);
    pthread_mutex_unlock(&s->lock);
    fr_series_set(s->m_store_up, up);
    if (changed) {
        if (up)
            fr_log(FR_LOG_INFO, "serve: store reachable");
        else
            fr_log(FR_LOG_WARN, "serve: store unreachable: %s", why);
        sv_notify(s);
    }
}

/* Sleeps up to ms, cut short by stop. */
static void nap(struct serve *s, int ms)
{
    struct timespec ts;
    fr_clock_deadline(&ts, ms);
    pthread_mutex_lock(&s->lock);
    if (!atomic_load(&s->stop))
        pthread_cond_timedwait(&s->wake, &s->lock, &ts);
    pthread_mutex_unlock(&s->lock);
}

static fr_err_t read_models(struct serve *s, psstore_conn_t *c)
{
    char **names;
    size_t n;
    fr_err_t err = psstore_model_list(c, &names, &n);
    if (err != FR_OK)
        return err;
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->nnames; i++)
        free(s->names[i]);
    free(s->names);
    s->names = names;
    s->nnames = n;
    s->models_ms = fr_clock_unix_ms();
    /* the default model is always followed; others once asked for */
    if (s->model[0] != '\0')
        sv_model_get(s, s->model, 1);
    pthread_mutex_unlock(&s->lock);
    return FR_OK;
}

/* The follower thread's own state: its connection and scratch. */
typedef struct follower {
    psstore_conn_t *c;
    float *w;
    size_t wcap;
    stats_scratch_t scratch;
    uint64_t models_ns, check_ns;
    const char **names;                 /* [max_models]: the streams to block on */
    char (*ids)[PSSTORE_STREAM_ID_MAX]; /* [max_models]: their last ids */
    int *moved;                         /* [max_models]: which of them moved */
    sv_model_t **ms;                    /* [max_models]: the models of this turn */
} follower_t;

/*
 * One model's turn: its info and weights when due (all: the once-a-second
 * look at every model), its metadata when it changed and its stats while
 * a dashboard asks. Lowers *next_ms to when its pending weights are due.
 * Returns FR_ERR_REDIS-class errors or FR_ERR_NOMEM.
 */
static fr_err_t follow_model(struct serve *s, follower_t *f, sv_model_t *m, int all, int *changed,
                             int *next_ms)
{
    fr_err_t err = FR_OK;
    pthread_mutex_lock(&s->lock);
    int64_t now = fr_clock_unix_ms();
    int wanted = now - m->wanted_ms < SV_WANTED_MS;
    m->watched = wanted || now - m->stats_wanted_ms < SV_STATS_WANTED_MS;
    /* a client now waits for weights not kept current so far */
    int behind = m->present && wanted && m->cur != NULL &&
                 (m->cur->epoch != m->info.epoch || m->cur->version != m->info.version);
    pthread_mutex_unlock(&s->lock);
    /* a model no client asks for is looked at once a second only:
     * freshet run without HTTP clients costs the store next to
     * nothing */
    if (all || (m->pending && m->watched) || behind)
        err = refresh_model(s, f->c, m, &f->w, &f->wcap, changed);
    if (err == FR_OK && m->pending) {
        int64_t left = s->conf.refresh_ms - (int64_t)ms_since(m->loaded_ns);
        if (left < *next_ms)
            *next_ms = left < 1 ? 1 : (int)left;
    }
    pthread_mutex_lock(&s->lock);
    int stats_wanted = m->present && fr_clock_unix_ms() - m->stats_wanted_ms < SV_STATS_WANTED_MS;
    if (m->present && (m->meta == NULL || m->meta_seq != m->seq)) {
        build_meta(m);
        m->meta_seq = m->seq;
    }
    pthread_mutex_unlock(&s->lock);
    if (err == FR_OK && stats_wanted &&
        (m->stats_ns == 0 || ms_since(m->stats_ns) >= STATS_EVERY_MS)) {
        err = build_stats(s, f->c, m, &f->scratch);
        m->stats_ns = fr_clock_mono_ns();
        *changed = 1;
    }
    return err;
}

/*
 * Blocks up to next_ms on the versions streams of the watched models among
 * f->ms[n] (napping when there is none) and marks those that moved
 * pending. Returns FR_ERR_REDIS-class errors.
 */
static fr_err_t follow_wait(struct serve *s, follower_t *f, size_t n, int next_ms)
{
    fr_err_t err;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        sv_model_t *m = f->ms[i];
        if (!m->present || !m->watched) {
            snprintf(m->last_id, sizeof(m->last_id), "0-0"); /* newest when back */
            continue;
        }
        if (strcmp(m->last_id, "0-0") == 0 &&
            (err = psstore_versions_last_id(f->c, m->name, m->last_id)) != FR_OK)
            return err;
        f->names[k] = m->name;
        memcpy(f->ids[k], m->last_id, PSSTORE_STREAM_ID_MAX);
        f->ms[k++] = m;
    }
    if (k == 0) {
        nap(s, next_ms);
        return FR_OK;
    }
    if ((err = psstore_versions_wait(f->c, f->names, k, f->ids, next_ms, f->moved)) != FR_OK)
        return err;
    for (size_t i = 0; i < k; i++) {
        memcpy(f->ms[i]->last_id, f->ids[i], PSSTORE_STREAM_ID_MAX);
        if (f->moved[i])
            f->ms[i]->pending = 1;
    }
    return FR_OK;
}

/* One turn of the follower on a connected store: the list of models when
 * due, each model, then the wait for the next turn. Returns
 * FR_ERR_REDIS-class errors or FR_ERR_NOMEM. */
static fr_err_t follow_turn(struct serve *s, follower_t *f)
{
    fr_err_t err = FR_OK;
    if (f->models_ns == 0 || ms_since(f->models_ns) >= MODELS_EVERY_MS) {
        if ((err = read_models(s, f->c)) != FR_OK)
            return err;
        f->models_ns = fr_clock_mono_ns();
    }
    /* the models to look at this turn */
    pthread_mutex_lock(&s->lock);
    size_t n = s->nmodels;
    memcpy(f->ms, s->models, n * sizeof(*f->ms));
    pthread_mutex_unlock(&s->lock);
    int all = f->check_ns == 0 || ms_since(f->check_ns) >= CHECK_EVERY_MS, changed = 0;
    if (all)
        f->check_ns = fr_clock_mono_ns();
    int next_ms = FOLLOW_BLOCK_MS;
    for (size_t i = 0; i < n && err == FR_OK; i++)
        err = follow_model(s, f, f->ms[i], all, &changed, &next_ms);
    if (err != FR_OK)
        return err;
    set_store(s, 1, "");
    if (changed)
        sv_notify(s);
    /* block on the versions streams of the models clients ask for */
    return follow_wait(s, f, n, next_ms);
}

void *sv_follow_main(void *arg)
{
    struct serve *s = arg;
    fr_thread_name("fr-follow");
    follower_t f = {0};
    f.names = calloc((size_t)s->conf.max_models, sizeof(*f.names));
    f.ids = calloc((size_t)s->conf.max_models, sizeof(*f.ids));
    f.moved = calloc((size_t)s->conf.max_models, sizeof(*f.moved));
    f.ms = calloc((size_t)s->conf.max_models, sizeof(*f.ms));
    if (f.names == NULL || f.ids == NULL || f.moved == NULL || f.ms == NULL) {
        fr_log(FR_LOG_ERROR, "serve: out of memory");
        goto out;
    }
    while (!atomic_load(&s->stop)) {
        char errstr[256];
        if (f.c == NULL) {
            f.c = psstore_conn_new(s->redis_url, FOLLOW_TIMEOUT_MS, errstr, sizeof(errstr));
            if (f.c == NULL) {
                set_store(s, 0, errstr);
                nap(s, 500);
                continue;
            }
            f.models_ns = f.check_ns = 0;
        }
        fr_err_t err = follow_turn(s, &f);
        if (err == FR_OK)
            continue;
        if (err == FR_ERR_NOMEM) {
            set_store(s, 0, "out of memory");
            nap(s, 500);
            continue;
        }
        set_store(s, 0, psstore_conn_error(f.c));
        psstore_conn_destroy(f.c);
        f.c = NULL;
        nap(s, 500);
    }
out:
    psstore_conn_destroy(f.c);
    free(f.w);
    scratch_fini(&f.scratch);
    free(f.names);
    free(f.ids);
    free(f.moved);
    free(f.ms);
    return NULL;
}
