/*
 * infer.c - predictions from the weights serve holds (docs/design.md
 * "Predictions"): POST /v2/models/{m}/infer in the Open Inference
 * Protocol's (KServe v2) JSON shape.
 *
 * The loop checks the request (the token when reads are protected, the
 * Content-Type, the model), takes a reference to the weights it will use
 * and queues the body as a job (pool.c). The inference workers take the
 * jobs queued at that moment, up to INFER_BATCH_JOBS, parse their bodies,
 * and run each group of jobs on the same weights as one batch through
 * model_forward (a weight row is then read once for all of them); the
 * loop sends the answers. A full queue answers 503 at once. A sparse
 * model's request goes to the rows reader instead (infer_sparse.c), from the
 * route or, when the loop could not tell what the model is yet, from the
 * worker.
 *
 * Threads: sv_route_infer on the loop; sv_infer_main and what it calls on
 * the workers, which read a model's views under s->lock only.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include "model/model.h"
#include "serve/http_int.h"

#define INFER_BATCH_JOBS 64    /* requests one worker takes at once at most       */
#define INFER_BATCH_ROWS 256   /* samples one forward pass runs at most           */
#define INFER_ROWS_MAX   65536 /* samples one request may send                    */
#define FRESH_WAIT_MS    5000  /* a model's weights being read for a request      */

/* One request: what the loop saw, then what the worker parsed and
 * computed. */
typedef struct infer_job {
    sv_job_t job;
    struct serve *s;
    sv_model_t *m;
    char name[65];
    char *body; /* the request's JSON, NUL-terminated */
    size_t blen;
    sv_latest_t latest; /* the weights: cur, a reference, or NULL while the
                           follower reads them */
    /* parsed */
    int64_t want_version; /* parameters.version, -1: the latest */
    char id[128];         /* echoed */
    int has_id;
    unsigned outputs; /* bit k: out_names[k] asked (0: all the model gives) */
    int parsed;       /* the body was parsed (or refused)             */
    uint64_t t0_ns;   /* when a worker first took the job             */
    float *x;         /* [n x d] */
    size_t n, d;
    float *out; /* [n x K] */
} infer_job_t;

/* The outputs a model of each loss gives, by name. */
static const struct {
    const char *name;
    model_loss_t loss;
    int argmax; /* the class of the largest probability (else the floats) */
} out_names[] = {
    {"probabilities", MODEL_LOSS_SOFTMAX, 0},
    {"argmax", MODEL_LOSS_SOFTMAX, 1},
    {"probability", MODEL_LOSS_LOGISTIC, 0},
    {"score", MODEL_LOSS_MSE, 0},
};
#define NOUT (sizeof(out_names) / sizeof(out_names[0]))

#define job_error(j, ...) sv_job_error(&(j)->job, __VA_ARGS__)

static void job_fini(sv_job_t *jb)
{
    infer_job_t *j = (infer_job_t *)jb;
    sv_view_unref(j->latest.cur);
    free(j->body);
    free(j->x);
    free(j->out);
}

/* ---- the request's body, on a worker ------------------------------------------------ */

/* One number of the input into *x; 0, or -1 after setting the error. */
static int number(infer_job_t *j, json_t *v, size_t at, float *x)
{
    if (!json_is_number(v)) {
        job_error(j, 400, "inputs[0].data[%zu] is not a number", at);
        return -1;
    }
    double d = json_number_value(v);
    if (!(fabs(d) <= FLT_MAX)) {
        job_error(j, 400, "inputs[0].data[%zu] = %g is beyond float32", at, d);
        return -1;
    }
    *x = (float)d;
    return 0;
}

/* The input's numbers into x[n * d]: n * d of them flat, or n rows of d
 * (row-major, as KServe allows); 0, or -1 after setting the error. */
static int read_data(infer_job_t *j, json_t *data, float *x)
{
    size_t n = j->n, d = j->d;
    int rows = json_is_array(json_array_get(data, 0));
    size_t want = rows ? n : n * d;
    if (!json_is_array(data) || json_array_size(data) != want) {
        job_error(j, 400, "inputs[0].data holds %zu %s; shape [%zu, %zu] needs %zu",
                  json_array_size(data), rows ? "rows" : "numbers", n, d, want);
        return -1;
    }
    for (size_t i = 0; i < want; i++) {
        json_t *v = json_array_get(data, i);
        if (!rows) {
            if (number(j, v, i, x + i) != 0)
                return -1;
            continue;
        }
        if (!json_is_array(v) || json_array_size(v) != d) {
            job_error(j, 400, "inputs[0].data[%zu] must be a row of %zu numbers", i, d);
            return -1;
        }
        for (size_t k = 0; k < d; k++)
            if (number(j, json_array_get(v, k), i * d + k, x + i * d + k) != 0)
                return -1;
    }
    return 0;
}

/* An integer member (or a decimal string of one) >= 0; -1 when it is
 * something else. */
static int64_t json_count(json_t *v)
{
    if (json_is_integer(v))
        return json_integer_value(v) >= 0 ? (int64_t)json_integer_value(v) : -1;
    if (json_is_string(v)) {
        const char *t = json_string_value(v);
        char *end;
        errno = 0;
        long long x = strtoll(t, &end, 10);
        if (*t != '\0' && *t != '-' && *t != '+' && *end == '\0' && errno == 0)
            return x;
    }
    return -1;
}

/* Parses j's body: the version asked, the id, the outputs named, the
 * input's shape and its numbers (checked against the model later, in
 * check_body); 0, or -1 after setting the error. The body is freed. */
static int parse_body(infer_job_t *j)
{
    json_error_t jerr;
    json_t *root = json_loadb(j->body, j->blen, JSON_REJECT_DUPLICATES, &jerr);
    free(j->body); /* parsed: the floats are all that is needed */
    j->body = NULL;
    if (root == NULL) {
        job_error(j, 400, "malformed JSON body: %s (line %d, column %d)", jerr.text, jerr.line,
                  jerr.column);
        return -1;
    }
    int rc = -1;
    json_t *inputs = json_object_get(root, "inputs");
    json_t *t = json_array_get(inputs, 0);
    if (!json_is_object(root) || !json_is_array(inputs) || json_array_size(inputs) != 1 ||
        !json_is_object(t)) {
        job_error(j, 400,
                  "the body must be {\"inputs\": [{\"name\": \"x\", \"shape\": [n, d], "
                  "\"datatype\": \"FP32\", \"data\": [...]}]}: one input tensor");
        goto out;
    }
    json_t *id = json_object_get(root, "id");
    if (id != NULL) {
        if (!json_is_string(id) || strlen(json_string_value(id)) >= sizeof(j->id)) {
            job_error(j, 400, "id must be a string of at most %zu bytes", sizeof(j->id) - 1);
            goto out;
        }
        snprintf(j->id, sizeof(j->id), "%s", json_string_value(id));
        j->has_id = 1;
    }
    json_t *params = json_object_get(root, "parameters"), *ver = json_object_get(params, "version");
    if (params != NULL && !json_is_object(params)) {
        job_error(j, 400, "parameters must be an object");
        goto out;
    }
    if (ver != NULL && (j->want_version = json_count(ver)) < 0) {
        job_error(j, 400, "parameters.version must be a version number (>= 0)");
        goto out;
    }
    const char *dt = json_string_value(json_object_get(t, "datatype"));
    if (dt == NULL || (strcmp(dt, "FP32") != 0 && strcmp(dt, "FP64") != 0)) {
        job_error(j, 400, "inputs[0].datatype must be FP32 (or FP64, read as float32)");
        goto out;
    }
    json_t *shape = json_object_get(t, "shape");
    json_t *s0 = json_array_get(shape, 0), *s1 = json_array_get(shape, 1);
    if (json_array_size(shape) != 2 || !json_is_integer(s0) || !json_is_integer(s1) ||
        json_integer_value(s0) < 1 || json_integer_value(s0) > INFER_ROWS_MAX ||
        json_integer_value(s1) < 1 || json_integer_value(s1) > MODEL_MAX_WIDTH) {
        job_error(j, 400, "inputs[0].shape must be [n, d]: n samples (1 to %d) of d features",
                  INFER_ROWS_MAX);
        goto out;
    }
    j->n = (size_t)json_integer_value(s0);
    j->d = (size_t)json_integer_value(s1);
    json_t *outs = json_object_get(root, "outputs");
    if (outs != NULL) {
        size_t i;
        json_t *o;
        if (!json_is_array(outs)) {
            job_error(j, 400, "outputs must be an array of {\"name\": ...}");
            goto out;
        }
        json_array_foreach(outs, i, o)
        {
            const char *on = json_string_value(json_object_get(o, "name"));
            size_t k = 0;
            while (k < NOUT && (on == NULL || strcmp(on, out_names[k].name) != 0))
                k++;
            if (k == NOUT) {
                job_error(j, 400,
                          "outputs[%zu]: no output %.64s (probabilities and argmax for a softmax "
                          "model, probability for a logistic one, score for mse)",
                          i, on != NULL ? on : "without a name");
                goto out;
            }
            j->outputs |= 1 << k;
        }
    }
    size_t cap = j->n * j->d;
    if (cap > j->blen / 2 + 1) { /* each number takes a digit and a comma at least */
        job_error(j, 400, "inputs[0].shape [%zu, %zu] asks for more numbers than the body holds",
                  j->n, j->d);
        goto out;
    }
    j->x = malloc(cap * sizeof(float));
    if (j->x == NULL) {
        job_error(j, 503, "out of memory for %zu inputs", cap);
        goto out;
    }
    if (read_data(j, json_object_get(t, "data"), j->x) != 0)
        goto out;
    rc = 0;
out:
    json_decref(root);
    return rc;
}

/* Checks a parsed request against the model it runs on; 0, or -1 after
 * setting the error. */
static int check_body(infer_job_t *j, const model_t *md)
{
    if (j->d != (size_t)md->dims[0]) {
        job_error(j, 400, "inputs[0].shape [%zu, %zu]: model '%s' takes %d features a sample", j->n,
                  j->d, j->name, md->dims[0]);
        return -1;
    }
    for (size_t k = 0; k < NOUT; k++)
        if ((j->outputs >> k & 1) && out_names[k].loss != md->loss) {
            job_error(j, 400, "outputs: a %s model gives no %s", model_loss_name(md->loss),
                      out_names[k].name);
            return -1;
        }
    return 0;
}

/* ---- the weights, on a worker ------------------------------------------------------- */

/* A sparse model's request, passed on to the rows reader (on the loop). */
static void to_rows(sv_job_t *jb, struct evhttp_request *req)
{
    infer_job_t *j = (infer_job_t *)jb;
    char *body = j->body;
    j->body = NULL;
    sv_infer_sparse_submit(j->s, req, j->name, body, j->blen);
}

/* What a worker can do with a job now. */
enum readiness { READY, ANSWERED, WAIT };

/*
 * Gets j ready without blocking: a model whose kind the loop could not
 * tell (its metadata not read yet) is passed on when sparse; the body is
 * parsed once; the view is the retained snapshot asked for (of the latest
 * weights' epoch) or the latest weights, which the loop may have found
 * stale: then the follower's read is awaited. WAIT means not yet (the job
 * goes back to the queue); ANSWERED, an error set or the job passed on;
 * READY, *view referenced.
 */
static enum readiness job_ready(infer_job_t *j, sv_view_t **view)
{
    struct serve *s = j->s;
    sv_model_t *m = j->m;
    *view = NULL;
    pthread_mutex_lock(&s->lock);
    int known = m->present, sparse = known && m->info.sparse[0] != '\0';
    sv_view_t *cur = m->cur;
    int fresh =
        j->latest.cur != NULL ||
        (cur != NULL &&
         ((cur->epoch == j->latest.known_epoch && cur->version >= j->latest.known_version) ||
          cur->epoch != j->latest.had_epoch || cur->version != j->latest.had_version));
    char why[256];
    snprintf(why, sizeof(why), "%s", m->error);
    pthread_mutex_unlock(&s->lock);
    int waited_out = fr_clock_mono_ns() - j->t0_ns > FRESH_WAIT_MS * 1000000ull;
    if (j->latest.cur == NULL && sparse && !j->parsed) {
        j->job.then = to_rows; /* the body, unparsed, goes with it */
        return ANSWERED;
    }
    if (j->latest.cur == NULL && sparse) { /* made again as a sparse model meanwhile */
        job_error(j, 503, "model '%s' was made again as a sparse model; send again", j->name);
        return ANSWERED;
    }
    if (j->latest.cur == NULL && !known && !waited_out)
        return WAIT; /* dense or sparse: its body is read the one way or the other */
    if (!j->parsed) {
        j->parsed = 1;
        if (parse_body(j) != 0)
            return ANSWERED;
    }
    if (!fresh) {
        if (!waited_out)
            return WAIT;
        job_error(j, 503, "model '%s': weights not read yet%s%s", j->name, why[0] ? ": " : "", why);
        return ANSWERED;
    }
    pthread_mutex_lock(&s->lock);
    sv_view_t *latest = j->latest.cur != NULL ? j->latest.cur : m->cur;
    if (latest == NULL) { /* deleted while the body was parsed */
        pthread_mutex_unlock(&s->lock);
        job_error(j, 503, "model '%s' left the store; try again", j->name);
        return ANSWERED;
    }
    if (j->want_version < 0) {
        *view = sv_view_ref(latest);
    } else if (latest->version == j->want_version) {
        *view = sv_view_ref(latest);
    } else {
        for (size_t i = 0; i < m->nsnaps && *view == NULL; i++)
            if (m->snaps[i]->version == j->want_version && m->snaps[i]->epoch == latest->epoch)
                *view = sv_view_ref(m->snaps[i]);
    }
    pthread_mutex_unlock(&s->lock);
    if (*view == NULL) {
        job_error(j, 404, "model '%s' retains no snapshot of version %lld in this epoch", j->name,
                  (long long)j->want_version);
        return ANSWERED;
    }
    return READY;
}

/* The float32 weights of v for model md, in place when aligned, else
 * copied into *copy (grown as needed); NULL when v does not hold md. */
static const float *view_weights(const sv_view_t *v, const model_t *md, float **copy,
                                 size_t *copy_cap)
{
    if (v->raw_len != md->nparams * sizeof(float))
        return NULL;
    const char *raw = v->st + v->raw_off;
    if (((uintptr_t)raw & (sizeof(float) - 1)) == 0)
        return (const float *)(const void *)raw;
    if (*copy_cap < md->nparams) {
        float *p = realloc(*copy, md->nparams * sizeof(float));
        if (p == NULL)
            return NULL;
        *copy = p;
        *copy_cap = md->nparams;
    }
    memcpy(*copy, raw, v->raw_len);
    return *copy;
}

/* ---- the answer, on a worker -------------------------------------------------------- */

static void encode(infer_job_t *j, const sv_view_t *v, model_loss_t loss, size_t K)
{
    unsigned want = j->outputs != 0 ? j->outputs : ~0u;
    fr_buf_t b = {0};
    fr_buf_puts(&b, "{\"model_name\":");
    fr_json_str(&b, j->name);
    fr_buf_printf(&b, ",\"model_version\":\"%lld\"", (long long)v->version);
    if (j->has_id) {
        fr_buf_puts(&b, ",\"id\":");
        fr_json_str(&b, j->id);
    }
    fr_buf_printf(&b, ",\"parameters\":{\"epoch\":\"%llu\"},\"outputs\":[",
                  (unsigned long long)v->epoch);
    int first = 1;
    for (size_t k = 0; k < NOUT; k++) {
        if (out_names[k].loss != loss || !(want >> k & 1))
            continue;
        int argmax = out_names[k].argmax;
        fr_buf_printf(&b, "%s{\"name\":\"%s\",\"datatype\":\"%s\",\"shape\":[%zu", first ? "" : ",",
                      out_names[k].name, argmax ? "INT64" : "FP32", j->n);
        if (!argmax)
            fr_buf_printf(&b, ",%zu", K);
        fr_buf_puts(&b, "],\"data\":[");
        for (size_t i = 0; i < j->n; i++) {
            const float *p = j->out + i * K;
            if (argmax) {
                size_t best = 0;
                for (size_t c = 1; c < K; c++)
                    best = p[c] > p[best] ? c : best;
                fr_buf_printf(&b, i ? ",%zu" : "%zu", best);
                continue;
            }
            for (size_t c = 0; c < K; c++) {
                if (i + c > 0)
                    fr_buf_puts(&b, ",");
                sv_json_f32(&b, p[c]);
            }
        }
        fr_buf_puts(&b, "]}");
        first = 0;
    }
    fr_buf_puts(&b, "]}\n");
    if (b.failed) {
        fr_buf_fini(&b);
        job_error(j, 503, "out of memory for the answer");
        return;
    }
    sv_job_answer(&j->job, 200, "application/json", b.p, b.len);
    snprintf(j->job.version, sizeof(j->job.version), "%lld", (long long)v->version);
    snprintf(j->job.epoch, sizeof(j->job.epoch), "%llu", (unsigned long long)v->epoch);
}

/* ---- a worker ------------------------------------------------------------------------- */

/* A worker's buffers, kept between jobs: the batch buffers grown by FR_GROW
 * (their sizes vary with the batch), w to the model's size exactly. */
typedef struct scratch {
    float *x, *out, *tmp, *w;
    size_t x_cap, out_cap, tmp_cap, w_cap;
} scratch_t;

/* Runs jobs group[lo..hi) (NULL: failed already) through md under w:
 * one job from its own floats, several copied into one batch. */
static void forward(const model_t *md, const float *w, infer_job_t **group, size_t lo, size_t hi,
                    size_t rows, scratch_t *sc)
{
    size_t d = (size_t)md->dims[0], K = (size_t)md->dims[md->nlayers], n = 0, at = 0;
    infer_job_t *one = NULL;
    for (size_t k = lo; k < hi; k++)
        if (group[k] != NULL) {
            one = group[k];
            n++;
        }
    if (n == 0)
        return;
    FR_ASSERT(n > 1 || one->n == rows); /* a job alone is run from its own floats */
    size_t chunk = rows < INFER_BATCH_ROWS ? rows : INFER_BATCH_ROWS;
    if (FR_GROW(sc->tmp, sc->tmp_cap, model_forward_scratch(md, chunk) + 1) != FR_OK ||
        (n > 1 && (FR_GROW(sc->x, sc->x_cap, rows * d) != FR_OK ||
                   FR_GROW(sc->out, sc->out_cap, rows * K) != FR_OK))) {
        for (size_t k = lo; k < hi; k++)
            if (group[k] != NULL)
                job_error(group[k], 503, "out of memory");
        return;
    }
    const float *x = one->x;
    float *out = one->out;
    if (n > 1) {
        for (size_t k = lo; k < hi; k++)
            if (group[k] != NULL) {
                FR_ASSERT(at + group[k]->n <= rows); /* sc->x holds rows samples */
                memcpy(sc->x + at * d, group[k]->x, group[k]->n * d * sizeof(float));
                at += group[k]->n;
            }
        x = sc->x;
        out = sc->out;
    }
    for (size_t r = 0; r < rows; r += chunk) {
        size_t k = rows - r < chunk ? rows - r : chunk;
        model_forward(md, w, x + r * d, k, out + r * K, sc->tmp);
    }
    if (n > 1)
        for (size_t k = lo, at2 = 0; k < hi; k++)
            if (group[k] != NULL) {
                memcpy(group[k]->out, sc->out + at2 * K, group[k]->n * K * sizeof(float));
                at2 += group[k]->n;
            }
}

/* Runs the jobs of group (all parsed, all on view v) in batches of at
 * most INFER_BATCH_ROWS samples (a larger request alone); sets their
 * answers. */
static void run_group(struct serve *s, infer_job_t **group, size_t ng, sv_view_t *v, scratch_t *sc)
{
    model_t md;
    model_loss_t loss;
    char errstr[256];
    const float *w = NULL;
    const char *lv[] = {group[0]->name}; /* every job here is of one model */
    if (model_loss_parse(v->loss, &loss) != FR_OK ||
        model_init(&md, v->layers, loss, errstr, sizeof(errstr)) != FR_OK ||
        (w = view_weights(v, &md, &sc->w, &sc->w_cap)) == NULL) {
        for (size_t i = 0; i < ng; i++)
            job_error(group[i], 500, "model '%s' version %lld: unreadable weights (%s, %s)",
                      group[i]->name, (long long)v->version, v->layers, v->loss);
        return;
    }
    size_t K = (size_t)md.dims[md.nlayers];
    for (size_t i = 0; i < ng; i++) {
        infer_job_t *j = group[i];
        if (check_body(j, &md) != 0) {
            group[i] = NULL;
        } else if ((j->out = malloc(j->n * K * sizeof(float))) == NULL) {
            job_error(j, 503, "out of memory for %zu predictions", j->n);
            group[i] = NULL;
        }
    }
    size_t lo = 0, rows = 0, batches = 0;
    for (size_t i = 0; i <= ng; i++) {
        size_t n = i < ng && group[i] != NULL ? group[i]->n : 0;
        if (i == ng || (rows > 0 && rows + n > INFER_BATCH_ROWS)) {
            forward(&md, w, group, lo, i, rows, sc);
            batches += rows > 0;
            lo = i;
            rows = 0;
        }
        rows += n;
    }
    size_t samples = 0;
    for (size_t i = 0; i < ng; i++)
        if (group[i] != NULL && group[i]->job.code == 0) {
            encode(group[i], v, loss, K);
            samples += group[i]->n;
        }
    fr_series_add(fr_metric_series(s->m_predictions, lv), (double)samples);
    fr_series_add(fr_metric_series(s->m_infer_batches, lv), (double)batches);
}

void *sv_infer_main(void *arg)
{
    struct serve *s = arg;
    fr_thread_name("fr-http-infer");
    sv_job_t *jobs[INFER_BATCH_JOBS], *waiting[INFER_BATCH_JOBS];
    infer_job_t *group[INFER_BATCH_JOBS];
    sv_view_t *views[INFER_BATCH_JOBS];
    scratch_t sc = {0};
    size_t n;
    while ((n = sv_pool_take(&s->infer, jobs, INFER_BATCH_JOBS)) > 0) {
        /* each parsed and on its weights; those whose weights are being read
         * go back to the queue, and a worker that found only such jobs
         * pauses before it looks again */
        size_t nwait = 0, nkept = 0;
        for (size_t i = 0; i < n; i++) {
            infer_job_t *j = (infer_job_t *)jobs[i];
            sv_view_t *v;
            if (j->t0_ns == 0)
                j->t0_ns = fr_clock_mono_ns();
            if (job_ready(j, &v) == WAIT) {
                waiting[nwait++] = jobs[i];
                continue;
            }
            views[nkept] = v;
            jobs[nkept++] = jobs[i];
        }
        if (nwait > 0)
            sv_pool_requeue(&s->infer, waiting, nwait, nwait == n);
        n = nkept;
        /* one group per view, in the order the jobs came */
        for (size_t i = 0; i < n; i++) {
            sv_view_t *v = views[i];
            if (v == NULL)
                continue;
            size_t ng = 0;
            for (size_t k = i; k < n; k++)
                if (views[k] == v) {
                    group[ng++] = (infer_job_t *)jobs[k];
                    views[k] = NULL;
                    if (k != i)
                        sv_view_unref(v); /* the group holds one reference */
                }
            run_group(s, group, ng, v, &sc);
            sv_view_unref(v);
        }
        if (n > 0)
            sv_pool_finish(&s->infer, jobs, n);
    }
    free(sc.x);
    free(sc.out);
    free(sc.tmp);
    free(sc.w);
    return NULL;
}

/* ---- the route, on the loop ------------------------------------------------------------- */

void sv_route_infer(struct serve *s, struct evhttp_request *req, const char *name,
                    struct evkeyvalq *params)
{
    (void)params;
    if (!s->conf.infer) {
        sv_send_error(s, req, 404, "predictions are off here ([serve] infer = false)");
        return;
    }
    const char *ct = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Type");
    size_t tl = ct != NULL ? strcspn(ct, "; \t") : 0;
    if (ct != NULL && !(tl == 16 && strncasecmp(ct, "application/json", 16) == 0)) {
        sv_send_error(s, req, 415, "Content-Type %.64s: send application/json", ct);
        return;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    if (len == 0) {
        sv_send_error(s, req, 400, "the body must be a KServe v2 inference request (JSON)");
        return;
    }
    sv_latest_t l;
    sv_model_t *m = sv_find_latest(s, req, name, &l);
    if (m == NULL)
        return;
    char *body = malloc(len + 1);
    infer_job_t *j = l.sparse ? NULL : calloc(1, sizeof(*j));
    if (body == NULL || (!l.sparse && j == NULL)) {
        free(j);
        free(body);
        sv_view_unref(l.cur);
        sv_send_error(s, req, 503, "out of memory");
        return;
    }
    evbuffer_copyout(in, body, len);
    body[len] = '\0';
    if (l.sparse) {           /* its rows are read for the request, by the rows reader */
        sv_view_unref(l.cur); /* a dense model's of that name, before it was made again */
        sv_infer_sparse_submit(s, req, name, body, len);
        return;
    }
    j->job.fini = job_fini;
    j->want_version = -1; /* the latest, unless the body names one */
    j->s = s;
    j->m = m;
    snprintf(j->name, sizeof(j->name), "%s", name);
    j->body = body;
    j->blen = len;
    /* stale weights (a model nobody asked for lately): the worker waits for
     * the follower's read, as a weights request does */
    j->latest = l;
    if (l.stale) {
        pthread_mutex_lock(&s->lock);
        pthread_cond_broadcast(&s->wake);
        pthread_mutex_unlock(&s->lock);
    }
    sv_pool_submit(&s->infer, req, &j->job);
}
