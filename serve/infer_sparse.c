/*
 * infer_sparse.c - a sparse model's predictions (docs/design.md
 * "Predictions"): POST /v2/models/{m}/infer for a sparse model, whose
 * request infer.c passes on here. They run on the rows reader
 * (rows_sparse.c): the loop queues the body as one of its jobs; the
 * reader parses the records, reads their rows as /rows reads them
 * (sv_rows_read) and scores each sample by the model's definition; the
 * loop sends the answer.
 *
 * Threads: sv_infer_sparse_submit on the loop; sv_infer_sparse_run and
 * what it calls on the reader.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "serve/http_int.h"

#define job_error(j, ...) sv_job_error(&(j)->job, __VA_ARGS__)

/* ---- predictions of a sparse model, on the reader ------------------------------- */

/* A sparse model's infer request: records in the layout the model trains
 * on (the label is read and ignored), parsed into samples[n]; the id
 * echoed. 0, or -1 after setting the error. */
static int infer_parse(sv_rows_job_t *j, const sparse_spec_t *spec, sparse_sample_t **samples,
                       size_t *n, char *id, size_t idsize)
{
    json_error_t jerr;
    json_t *root = json_loadb(j->body, j->blen, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        job_error(j, 400, "malformed JSON body: %s (line %d, column %d)", jerr.text, jerr.line,
                  jerr.column);
        return -1;
    }
    int rc = -1;
    json_t *t = json_array_get(json_object_get(root, "inputs"), 0);
    json_t *data = json_object_get(t, "data"), *shape = json_object_get(t, "shape");
    const char *dt = json_string_value(json_object_get(t, "datatype"));
    const char *lname =
        json_string_value(json_object_get(json_object_get(root, "parameters"), "layout"));
    json_t *idv = json_object_get(root, "id");
    sparse_layout_t layout = SPARSE_LAYOUT_CRITEO;
    size_t count = json_array_size(data);
    if (!json_is_object(root) || json_array_size(json_object_get(root, "inputs")) != 1 ||
        dt == NULL || strcmp(dt, "BYTES") != 0 || !json_is_array(data) || count == 0 ||
        count > SV_ROWS_MAX || json_array_size(shape) != 1 ||
        json_integer_value(json_array_get(shape, 0)) != (json_int_t)count) {
        job_error(j, 400,
                  "a sparse model takes {\"inputs\": [{\"name\": \"records\", \"shape\": [n], "
                  "\"datatype\": \"BYTES\", \"data\": [\"<record>\", ...]}]}: n from 1 to %d "
                  "records as the topic carries them",
                  SV_ROWS_MAX);
        goto out;
    }
    if (lname != NULL &&
        (sparse_layout_parse(lname, &layout) != FR_OK || layout == SPARSE_LAYOUT_BINARY)) {
        job_error(j, 400, "parameters.layout must be criteo or libsvm");
        goto out;
    }
    if (idv != NULL && (!json_is_string(idv) || strlen(json_string_value(idv)) >= idsize)) {
        job_error(j, 400, "id must be a string of at most %zu bytes", idsize - 1);
        goto out;
    }
    snprintf(id, idsize, "%s", idv != NULL ? json_string_value(idv) : "");
    if ((*samples = malloc(count * sizeof(**samples))) == NULL) {
        job_error(j, 500, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        json_t *r = json_array_get(data, i);
        const char *why = "not a string";
        if (!json_is_string(r) ||
            sparse_parse_record(spec, layout, json_string_value(r), json_string_length(r),
                                *samples + i, &why) != FR_OK) {
            job_error(j, 400, "inputs[0].data[%zu]: not a %s record of this model (%s)", i,
                      layout == SPARSE_LAYOUT_CRITEO ? "criteo" : "libsvm", why);
            free(*samples);
            *samples = NULL;
            goto out;
        }
    }
    *n = count;
    rc = 0;
out:
    json_decref(root);
    return rc;
}

/* The answer: each sample's probability (one output) or class
 * probabilities and argmax (softmax), from its scores. */
static void infer_encode(sv_rows_job_t *j, const char *id, const double *score, size_t n, int K,
                         const psstore_rows_page_t *at)
{
    fr_buf_t b = {0};
    fr_buf_puts(&b, "{\"model_name\":");
    fr_json_str(&b, j->name);
    fr_buf_printf(&b, ",\"model_version\":\"%lld\"", (long long)at->version);
    if (id[0] != '\0') {
        fr_buf_puts(&b, ",\"id\":");
        fr_json_str(&b, id);
    }
    fr_buf_printf(&b,
                  ",\"parameters\":{\"epoch\":\"%llu\"},\"outputs\":[{\"name\":\"%s\","
                  "\"datatype\":\"FP32\",\"shape\":[%zu,%d],\"data\":[",
                  (unsigned long long)at->epoch, K == 1 ? "probability" : "probabilities", n, K);
    for (size_t i = 0; i < n; i++) {
        const double *z = score + i * (size_t)K;
        double top = z[0], sum = 0.0;
        for (int c = 1; c < K; c++)
            top = z[c] > top ? z[c] : top;
        for (int c = 0; c < K; c++)
            sum += exp(z[c] - top);
        for (int c = 0; c < K; c++) {
            fr_buf_puts(&b, i + (size_t)c > 0 ? "," : "");
            sv_json_f32(&b, (float)(K == 1 ? 1.0 / (1.0 + exp(-z[0])) : exp(z[c] - top) / sum));
        }
    }
    fr_buf_puts(&b, "]}");
    if (K > 1) {
        fr_buf_printf(&b, ",{\"name\":\"argmax\",\"datatype\":\"INT64\",\"shape\":[%zu],\"data\":[",
                      n);
        for (size_t i = 0; i < n; i++) {
            int best = 0;
            for (int c = 1; c < K; c++)
                best = score[i * (size_t)K + c] > score[i * (size_t)K + best] ? c : best;
            fr_buf_printf(&b, i ? ",%d" : "%d", best);
        }
        fr_buf_puts(&b, "]}");
    }
    fr_buf_puts(&b, "]}\n");
    if (b.failed) {
        fr_buf_fini(&b);
        job_error(j, 500, "out of memory");
        return;
    }
    sv_job_answer(&j->job, 200, "application/json", b.p, b.len);
    snprintf(j->job.version, sizeof(j->job.version), "%lld", (long long)at->version);
    snprintf(j->job.epoch, sizeof(j->job.epoch), "%llu", (unsigned long long)at->epoch);
}

/* Predictions of a sparse model (docs/design.md "Predictions"): the
 * records' rows read as /rows reads them, the dense part (biases, tower)
 * from shard 0, each sample scored by the model's definition
 * (sparse_fm_reference, in double). */
void sv_infer_sparse_run(sv_rows_job_t *j, psstore_conn_t **c, const sparse_spec_t *spec,
                         const sparse_optim_t *optim, int S)
{
    sparse_sample_t *samples = NULL;
    size_t n = 0;
    char id[128];
    if (infer_parse(j, spec, &samples, &n, id, sizeof(id)) != 0)
        return;
    const int K = sparse_outputs(spec);
    const size_t rl = sparse_row_len(spec), P = sparse_tower_len(spec);
    sparse_batch_t *b = sparse_batch_new(n);
    float *params = NULL, *dense = malloc((K + P) * sizeof(float));
    double *ddense = malloc((K + P) * sizeof(double));
    double *fp = malloc(SPARSE_FIELDS_MAX * rl * sizeof(double));
    double *score = malloc(n * (size_t)K * sizeof(double));
    uint32_t *stored = NULL;
    psstore_rows_page_t at = {0};
    if (b == NULL || dense == NULL || ddense == NULL || fp == NULL || score == NULL) {
        job_error(j, 500, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        if (sparse_batch_add(b, &samples[i]) != FR_OK) {
            job_error(j, 400, "inputs[0].data[%zu]: more than %d features", i, SPARSE_FIELDS_MAX);
            goto out;
        }
    params = malloc((b->nrows ? b->nrows : 1) * rl * sizeof(float));
    stored = malloc((b->nrows ? b->nrows : 1) * sizeof(*stored));
    if (params == NULL || stored == NULL) {
        job_error(j, 500, "out of memory");
        goto out;
    }
    if (sv_rows_read(j, c, spec, optim, S, b->rows, b->nrows, params, stored, dense,
                     P > 0 ? dense + K : NULL, &at) != 0)
        goto out;
    for (size_t k = 0; k < (size_t)K + P; k++)
        ddense[k] = dense[k];
    for (size_t i = 0; i < n; i++) {
        const sparse_sample_t *s = &b->samples[i];
        for (int k = 0; k < s->n; k++) { /* each feature's row, in double */
            FR_ASSERT(b->slot[i * SPARSE_FIELDS_MAX + k] < b->nrows); /* a row read above */
            for (size_t e = 0; e < rl; e++)
                fp[(size_t)k * rl + e] =
                    params[(size_t)b->slot[i * SPARSE_FIELDS_MAX + k] * rl + e];
        }
        sparse_fm_reference(spec, s, fp, ddense, score + i * (size_t)K);
    }
    infer_encode(j, id, score, n, K, &at);
out:
    sparse_batch_destroy(b);
    free(samples);
    free(params);
    free(stored);
    free(dense);
    free(ddense);
    free(fp);
    free(score);
}

/* ---- the request, on the loop ------------------------------------------------------ */

void sv_infer_sparse_submit(struct serve *s, struct evhttp_request *req, const char *name,
                            char *body, size_t len)
{
    sv_rows_job_t *j = sv_rows_job_new(s, req, name, SV_ROWS_JOB_INFER, 1);
    if (j == NULL) {
        free(body);
        return;
    }
    j->body = body;
    j->blen = len;
    sv_pool_submit(&s->rows, req, &j->job);
}
