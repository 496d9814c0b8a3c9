/*
 * cache.c - the weights cache of the follower: each followed model's
 * latest weights and retained snapshots, read from the store at most once
 * per (epoch, version) and encoded once as views (safetensors, and JSON
 * while clients ask for it), and its metadata JSON; published to the loop
 * under s->lock (docs/design.md "Snapshots and publishing").
 *
 * Threads: the follower (follow.c) only; the loop reads what is published
 * under s->lock, sv_cache_snapshot_unserved included.
 */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "serve/serve_int.h"

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
    FR_ASSERT(v->raw_len <= len);  /* the encoder wrote every weight */
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

int sv_cache_snapshot_unserved(const sv_model_t *m, int64_t version)
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
        int held = sv_cache_snapshot_unserved(m, m->listed[i].version);
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
    if (cur != NULL &&
        (fr_clock_mono_ns() - m->loaded_ns) / 1000000u < (uint64_t)s->conf.refresh_ms) {
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

fr_err_t sv_cache_refresh(struct serve *s, psstore_conn_t *c, sv_model_t *m, float **w,
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

void sv_cache_meta(sv_model_t *m)
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
        if (m->listed[i].version != info->version &&
            !sv_cache_snapshot_unserved(m, m->listed[i].version))
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
