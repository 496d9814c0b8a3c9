/*
 * rows_sparse.c - a sparse model's rows over HTTP (docs/design.md "Serving sparse
 * models"): the latest rows by id, the delta since a version (rows changed
 * and tombstones of rows evicted), and the whole table a page at a time
 * for a cold start. dispatch.c dispatches to them.
 *
 * Unlike the weights of a dense model, which the follower reads once for
 * every client, these answers depend on the request, so each is read from
 * Redis for its request, by a reader thread of its own (a pool of one,
 * pool.c): the loop checks the request and queues it; the reader reads the
 * store on its own connection and encodes the answer; the loop sends it.
 * A sparse model's predictions (infer_sparse.c) are jobs of the same
 * reader, and read their rows by sv_rows_read.
 *
 * Threads: sv_route_* run on the loop; sv_rows_main and what it calls on
 * the reader.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "serve/http_int.h"

#define SV_ROWS_DEFAULT  4096 /* rows one answer reads when the client does not say */
#define SV_DELTA_COMMITS 256  /* commits one delta reads at most */
#define READ_TIMEOUT_MS  5000 /* the reader's Redis timeout */

/* ---- answers, on the reader ------------------------------------------------------ */

#define job_error(j, ...) sv_job_error(&(j)->job, __VA_ARGS__)

/* What an answer says besides its rows. */
typedef struct answer {
    const char *model;
    const char *kind; /* "rows", "delta", "table" */
    const sparse_spec_t *spec;
    const psstore_rows_page_t *page;
    const uint32_t *stored; /* rows: 1 where the store holds the row, else NULL */
    const char *since;      /* delta: as asked */
    const char *next;       /* delta and table: the next delta's since, the
                               shards' versions ("v0.v1..."; the version at S = 1) */
    const char *cursor;     /* table: the next page's cursor */
} answer_t;

/* j's answer: 200 with body (malloc'ed, taken) and a's version and epoch. */
static void job_answer(sv_rows_job_t *j, const answer_t *a, const char *type, char *body,
                       size_t len)
{
    sv_job_answer(&j->job, 200, type, body, len);
    snprintf(j->job.version, sizeof(j->job.version), "%lld", (long long)a->page->version);
    snprintf(j->job.epoch, sizeof(j->job.epoch), "%llu", (unsigned long long)a->page->epoch);
}

/* The answer as JSON, for people. */
static void encode_json(sv_rows_job_t *j, const answer_t *a)
{
    const psstore_rows_page_t *p = a->page;
    size_t keep = sparse_row_len(a->spec);
    fr_buf_t b = {0};
    fr_buf_printf(&b, "{\"model\":");
    fr_json_str(&b, a->model);
    fr_buf_printf(&b,
                  ",\"epoch\":\"%llu\",\"version\":%lld,\"bias\":", (unsigned long long)p->epoch,
                  (long long)p->version);
    if (p->nbias <= 1) { /* one logistic output: a number, as ever */
        sv_json_f32(&b, p->bias[0]);
    } else { /* a softmax's, one a class */
        fr_buf_puts(&b, "[");
        for (int c = 0; c < p->nbias; c++) {
            if (c > 0)
                fr_buf_puts(&b, ",");
            sv_json_f32(&b, p->bias[c]);
        }
        fr_buf_puts(&b, "]");
    }
    if (p->ntower > 0) { /* the dense tower's parameters, layer after layer */
        fr_buf_puts(&b, ",\"tower\":[");
        for (size_t i = 0; i < p->ntower; i++) {
            if (i > 0)
                fr_buf_puts(&b, ",");
            sv_json_f32(&b, p->tower[i]);
        }
        fr_buf_puts(&b, "]");
    }
    if (strcmp(a->kind, "delta") == 0) {
        fr_buf_puts(&b, ",\"since\":"); /* a number at one shard, as ever; the vector's text */
        if (strchr(a->since, '.') == NULL)
            fr_buf_puts(&b, a->since);
        else
            fr_json_str(&b, a->since);
        fr_buf_printf(&b, ",\"more\":%s,\"time_ms\":%lld", p->more ? "true" : "false",
                      (long long)p->time_ms);
    }
    if (a->next != NULL) {
        fr_buf_puts(&b, ",\"next\":");
        if (strchr(a->next, '.') == NULL)
            fr_buf_puts(&b, a->next);
        else
            fr_json_str(&b, a->next);
    }
    if (a->cursor != NULL) {
        fr_buf_puts(&b, ",\"cursor\":");
        fr_json_str(&b, a->cursor);
    }
    fr_buf_puts(&b, ",\"ids\":[");
    for (size_t i = 0; i < p->n; i++)
        fr_buf_printf(&b, i ? ",%u" : "%u", p->ids[i]);
    fr_buf_puts(&b, "],\"rows\":[");
    for (size_t i = 0; i < p->n; i++) {
        fr_buf_puts(&b, i ? ",[" : "[");
        for (size_t k = 0; k < keep; k++) {
            fr_buf_puts(&b, k ? "," : "");
            sv_json_f32(&b, p->params[i * keep + k]);
        }
        fr_buf_puts(&b, "]");
    }
    fr_buf_puts(&b, "]");
    if (a->stored != NULL) {
        fr_buf_puts(&b, ",\"stored\":[");
        for (size_t i = 0; i < p->n; i++)
            fr_buf_printf(&b, i ? ",%s" : "%s", a->stored[i] ? "true" : "false");
        fr_buf_puts(&b, "]");
    }
    if (strcmp(a->kind, "delta") == 0) {
        fr_buf_puts(&b, ",\"tombstones\":[");
        for (size_t i = 0; i < p->ngone; i++)
            fr_buf_printf(&b, i ? ",%u" : "%u", p->gone[i]);
        fr_buf_puts(&b, "]");
    }
    fr_buf_puts(&b, "}\n");
    if (b.failed) {
        fr_buf_fini(&b);
        job_error(j, 500, "out of memory");
        return;
    }
    job_answer(j, a, "application/json", b.p, b.len);
}

/* The answer as safetensors: ids (U32 [n]), rows (F32 [n, K + D]), bias
 * (F32 [K], K the table's outputs), tower (F32 [P]) for a table with a
 * tower (not on /rows), and stored (U32 [n]) for /rows or tombstones (U32
 * [g]) for /delta; the metadata names the model, table, epoch, version
 * and what comes next. */
static void encode_safetensors(sv_rows_job_t *j, const answer_t *a)
{
    const psstore_rows_page_t *p = a->page;
    int64_t keep = (int64_t)sparse_row_len(a->spec);
    char table[64], ep[32], ver[32], more[8], t[32];
    sparse_spec_format(a->spec, table, sizeof(table));
    snprintf(ep, sizeof(ep), "%llu", (unsigned long long)p->epoch);
    snprintf(ver, sizeof(ver), "%lld", (long long)p->version);
    snprintf(more, sizeof(more), "%s", p->more ? "true" : "false");
    snprintf(t, sizeof(t), "%lld", (long long)p->time_ms);
    fr_st_kv_t meta[10] = {{"freshet.model", a->model},
                           {"freshet.sparse", table},
                           {"freshet.epoch", ep},
                           {"freshet.version", ver}};
    size_t nmeta = 4;
    if (strcmp(a->kind, "delta") == 0) {
        meta[nmeta++] = (fr_st_kv_t){"freshet.since", a->since};
        meta[nmeta++] = (fr_st_kv_t){"freshet.more", more};
        meta[nmeta++] = (fr_st_kv_t){"freshet.time_ms", t};
    }
    if (a->next != NULL)
        meta[nmeta++] = (fr_st_kv_t){"freshet.next", a->next};
    if (a->cursor != NULL)
        meta[nmeta++] = (fr_st_kv_t){"freshet.cursor", a->cursor};
    fr_st_tensor_t ts[5] = {
        {.name = "ids",
         .dtype = "U32",
         .ndim = 1,
         .shape = {(int64_t)p->n},
         .data = p->ids,
         .nbytes = p->n * 4},
        {.name = "rows",
         .dtype = "F32",
         .ndim = 2,
         .shape = {(int64_t)p->n, keep},
         .data = p->params,
         .nbytes = p->n * (size_t)keep * 4},
        {.name = "bias", /* one an output */
         .dtype = "F32",
         .ndim = 1,
         .shape = {p->nbias > 1 ? p->nbias : 1},
         .data = p->bias,
         .nbytes = (size_t)(p->nbias > 1 ? p->nbias : 1) * 4},
    };
    size_t nt = 3;
    if (p->ntower > 0)
        ts[nt++] = (fr_st_tensor_t){.name = "tower",
                                    .dtype = "F32",
                                    .ndim = 1,
                                    .shape = {(int64_t)p->ntower},
                                    .data = p->tower,
                                    .nbytes = p->ntower * 4};
    if (a->stored != NULL)
        ts[nt++] = (fr_st_tensor_t){.name = "stored",
                                    .dtype = "U32",
                                    .ndim = 1,
                                    .shape = {(int64_t)p->n},
                                    .data = a->stored,
                                    .nbytes = p->n * 4};
    if (strcmp(a->kind, "delta") == 0)
        ts[nt++] = (fr_st_tensor_t){.name = "tombstones",
                                    .dtype = "U32",
                                    .ndim = 1,
                                    .shape = {(int64_t)p->ngone},
                                    .data = p->gone,
                                    .nbytes = p->ngone * 4};
    uint8_t *img;
    size_t len;
    char errstr[256];
    if (fr_st_encode(ts, nt, meta, nmeta, &img, &len, errstr, sizeof(errstr)) != FR_OK) {
        job_error(j, 500, "%s", errstr);
        return;
    }
    job_answer(j, a, "application/octet-stream", (char *)img, len);
}

static void encode(sv_rows_job_t *j, const answer_t *a)
{
    if (j->json)
        encode_json(j, a);
    else
        encode_safetensors(j, a);
}

/* ---- the reads, on the reader ------------------------------------------------------ */

/* A read that failed: 404 when the model is gone, else 503 (the reader's
 * connection is made again for the next job). */
static void read_failed(sv_rows_job_t *j, psstore_conn_t **c, fr_err_t err)
{
    if (err == FR_ERR_NOTFOUND) {
        job_error(j, 404, "no model '%s'", j->name);
        return;
    }
    job_error(j, 503, "store: %s", psstore_conn_error(*c));
    psstore_conn_destroy(*c);
    *c = NULL;
}

/* The sparse model's table, row initialisation and shards, from its
 * meta; 0 after setting the error. */
static int sparse_model(sv_rows_job_t *j, psstore_conn_t **c, sparse_spec_t *spec,
                        sparse_optim_t *optim, int *S)
{
    psstore_model_info_t info;
    fr_err_t err = psstore_model_info(*c, j->name, &info);
    if (err != FR_OK) {
        read_failed(j, c, err);
        return 0;
    }
    char errstr[256];
    if (info.sparse[0] == '\0') {
        job_error(j, 400,
                  "model '%s' is a dense model (%s): read its weights at /v2/models/%s/weights",
                  j->name, info.layers, j->name);
        return 0;
    }
    if (psstore_sparse_meta_parse(info.sparse, spec, optim, errstr, sizeof(errstr)) != FR_OK) {
        job_error(j, 500, "model '%s': %s", j->name, errstr);
        return 0;
    }
    *S = info.shards > 1 ? info.shards : 1;
    return 1;
}

/* The shards' versions of p as the next delta's since: "v0.v1..." (the
 * version alone at S = 1). */
static void next_text(const psstore_rows_page_t *p, char *out, size_t size)
{
    size_t len = 0;
    out[0] = '\0';
    for (int k = 0; k < p->shards && len < size; k++)
        len += (size_t)snprintf(out + len, size - len, k ? ".%lld" : "%lld", (long long)p->at[k]);
}

/* j's since as S versions: one at S = 1; at S > 1 the S versions a page
 * or delta gave as next, or "0" (nothing held). 0, or -1 after setting
 * the error: 400 for text that is no list of versions, 410 for a list of
 * another length (the model was made again with other shards: reload). */
static int parse_since(sv_rows_job_t *j, int S, int64_t *since)
{
    const char *p = j->since;
    if (strcmp(p, "0") == 0) {
        memset(since, 0, (size_t)S * sizeof(*since));
        return 0;
    }
    int n = 0;
    for (;;) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || *p == '-' || *p == '+' || errno != 0 || v == INT64_MAX ||
            (*end != '.' && *end != '\0')) {
            job_error(j, 400,
                      "since '%.40s' is not the next a table page or delta gave (versions "
                      "separated by '.')",
                      j->since);
            return -1;
        }
        if (n < S)
            since[n] = v;
        n++;
        if (*end == '\0')
            break;
        p = end + 1;
    }
    if (n != S) {
        job_error(j, 410,
                  "since names %d shard%s; model '%s' has %d: it was created again; reload "
                  "/v2/models/%s/table",
                  n, n == 1 ? "" : "s", j->name, S, j->name);
        return -1;
    }
    return 0;
}

/* The latest value of rows ids[n], each read on its shard (row % S), in
 * the order asked, into params[n][sparse_row_len] (a row the store lacks
 * has its initial value: the one the model scores with; stored[i] says
 * which), shard 0's biases into bias[K] and, when tower is not NULL, its
 * tower; the epoch and version are the sums of the shards'. 0, or -1
 * after setting j's error. */
int sv_rows_read(sv_rows_job_t *j, psstore_conn_t **c, const sparse_spec_t *spec,
                 const sparse_optim_t *optim, int S, const uint32_t *ids, size_t n, float *params,
                 uint32_t *stored, float *bias, float *tower, psstore_rows_page_t *at)
{
    size_t keep = sparse_row_len(spec), slen = sparse_state_len(spec, optim);
    uint32_t *sids = malloc((n ? n : 1) * sizeof(*sids)),
             *order = malloc((n ? n : 1) * sizeof(*order));
    float *sparams = malloc((n ? n : 1) * keep * sizeof(float));
    uint8_t *sfound = malloc(n ? n : 1);
    float *state = malloc((slen ? slen : 1) * sizeof(float));
    fr_err_t err = FR_OK;
    int rc = -1;
    if (sids == NULL || order == NULL || sparams == NULL || sfound == NULL || state == NULL) {
        job_error(j, 500, "out of memory");
        goto out;
    }
    size_t off[PSSTORE_SHARDS_MAX + 1];
    psstore_sparse_group(ids, n, S, order, sids, off); /* the ids grouped by shard */
    FR_ASSERT(off[0] == 0 && off[S] == n);             /* the groups cover the ids */
    at->epoch = 0;
    at->version = 0;
    for (int k = 0; k < S && err == FR_OK; k++) {
        FR_ASSERT(off[k] <= off[k + 1]);
        size_t lo = off[k], m = off[k + 1] - lo, queued = 0;
        float b[SPARSE_CLASSES_MAX];
        uint64_t epoch;
        int64_t version;
        err = psstore_rows_pull_send(*c, j->name, k, S, sids + lo, m, &queued);
        if (err == FR_OK)
            err = psstore_rows_pull_recv(*c, j->name, spec, optim, m, queued, sparams + lo * keep,
                                         sfound + lo, b, k == 0 ? tower : NULL, &epoch, &version);
        if (err != FR_OK)
            break;
        at->epoch += epoch;
        at->version += version;
        if (k == 0)
            memcpy(bias, b, (size_t)sparse_outputs(spec) * sizeof(float));
    }
    if (err != FR_OK) {
        read_failed(j, c, err);
        goto out;
    }
    for (size_t x = 0; x < n; x++) {
        size_t i = order[x];
        stored[i] = sfound[x];
        if (sfound[x])
            memcpy(params + i * keep, sparams + x * keep, keep * sizeof(float));
        else
            sparse_row_init(spec, optim, ids[i], params + i * keep, state);
    }
    rc = 0;
out:
    free(sids);
    free(order);
    free(sparams);
    free(sfound);
    free(state);
    return rc;
}

/* The latest value of j's rows; the bias shard 0's. */
static void run_rows(sv_rows_job_t *j, psstore_conn_t **c, const sparse_spec_t *spec,
                     const sparse_optim_t *optim, int S)
{
    for (size_t i = 0; i < j->nids; i++) {
        if (j->ids[i] >> spec->bits != 0) {
            job_error(j, 400, "ids: row %u is beyond the table's 2^%d rows", j->ids[i], spec->bits);
            return;
        }
    }
    size_t keep = sparse_row_len(spec), n = j->nids;
    psstore_rows_page_t page = {.ids = j->ids, .n = n, .nbias = sparse_outputs(spec)};
    page.params = malloc(n * keep * sizeof(float));
    uint32_t *stored = malloc(n * sizeof(*stored));
    if (page.params == NULL || stored == NULL)
        job_error(j, 500, "out of memory");
    else if (sv_rows_read(j, c, spec, optim, S, j->ids, n, page.params, stored, page.bias, NULL,
                          &page) == 0) {
        answer_t a = {
            .model = j->name, .kind = "rows", .spec = spec, .page = &page, .stored = stored};
        encode(j, &a);
    }
    free(page.params);
    free(stored);
}

static void run_delta(sv_rows_job_t *j, psstore_conn_t **c, const sparse_spec_t *spec,
                      const sparse_optim_t *optim, int S)
{
    int64_t since[PSSTORE_SHARDS_MAX];
    if (parse_since(j, S, since) != 0)
        return;
    psstore_rows_page_t page = {0};
    fr_err_t err = psstore_rows_delta(*c, j->name, S, since, spec, optim, SV_DELTA_COMMITS,
                                      (size_t)j->max_rows, &page);
    char shard[32] = "", next[PSSTORE_SHARDS_MAX * 21], asked_text[PSSTORE_SHARDS_MAX * 21];
    if (S > 1)
        snprintf(shard, sizeof(shard), " on shard %d", page.expired_shard);
    int64_t asked = since[page.expired_shard];
    /* the expired test first: an expired delta stops at that shard, so its
     * epoch is not the whole model's */
    if (err != FR_OK)
        read_failed(j, c, err);
    else if (page.expired && asked > page.head)
        job_error(j, 410,
                  "version %lld%s is newer than the model's (%lld): it was created again or lost "
                  "writes; reload /v2/models/%s/table",
                  (long long)asked, shard, (long long)page.head, j->name);
    else if (page.expired)
        job_error(j, 410,
                  "version %lld%s is older than the changes kept (from version %lld, [sparse] "
                  "delta_seconds); reload /v2/models/%s/table",
                  (long long)asked, shard, (long long)page.floor, j->name);
    else if (j->epoch[0] != '\0' && strtoull(j->epoch, NULL, 10) != page.epoch)
        job_error(j, 410,
                  "epoch %s is not the model's (%llu): it was created again or rolled back; "
                  "reload /v2/models/%s/table",
                  j->epoch, (unsigned long long)page.epoch, j->name);
    else {
        next_text(&page, next, sizeof(next));
        /* since as the versions it names ("007" is 7) */
        psstore_rows_page_t asked_at = {.shards = S};
        memcpy(asked_at.at, since, (size_t)S * sizeof(*since));
        next_text(&asked_at, asked_text, sizeof(asked_text));
        answer_t a = {.model = j->name,
                      .kind = "delta",
                      .spec = spec,
                      .page = &page,
                      .since = asked_text,
                      .next = next};
        encode(j, &a);
    }
    psstore_rows_page_fini(&page);
}

static void run_table(sv_rows_job_t *j, psstore_conn_t **c, const sparse_spec_t *spec,
                      const sparse_optim_t *optim, int S)
{
    /* a cursor of another shard count: the model was made again */
    const char *dot = strchr(j->cursor, '.');
    if (dot != NULL ? S == 1 || strtol(j->cursor, NULL, 10) >= S
                    : S > 1 && strcmp(j->cursor, "0") != 0) {
        job_error(j, 410,
                  "cursor '%s' is not one of model '%s', which has %d shard%s: it was created "
                  "again; read its table again from cursor 0",
                  j->cursor, j->name, S, S == 1 ? "" : "s");
        return;
    }
    psstore_rows_page_t page = {0};
    char cursor[48], next[PSSTORE_SHARDS_MAX * 21];
    fr_err_t err =
        psstore_rows_scan(*c, j->name, S, spec, optim, j->cursor, (size_t)j->count, &page, cursor);
    if (err == FR_ERR_INVAL) {
        job_error(j, 400, "cursor '%s' is not one a page of this model gave: %s", j->cursor,
                  psstore_conn_error(*c));
    } else if (err != FR_OK) {
        read_failed(j, c, err);
    } else {
        next_text(&page, next, sizeof(next));
        answer_t a = {.model = j->name,
                      .kind = "table",
                      .spec = spec,
                      .page = &page,
                      .next = next,
                      .cursor = cursor};
        encode(j, &a);
    }
    psstore_rows_page_fini(&page);
}

/* The reader connection's cancel test: serve is stopping. */
static int stopping(void *arg)
{
    return atomic_load(&((struct serve *)arg)->stop) != 0;
}

/* Reads and encodes j's answer on the reader's connection *c (made when
 * NULL). */
static void run_job(struct serve *s, sv_rows_job_t *j, psstore_conn_t **c)
{
    char why[256];
    if (!sv_store_up(s, why)) {
        job_error(j, 503, "store unreachable: %s", why);
        return;
    }
    if (*c == NULL) {
        char errstr[256];
        if ((*c = psstore_conn_new(s->redis_url, READ_TIMEOUT_MS, errstr, sizeof(errstr))) ==
            NULL) {
            job_error(j, 503, "store unreachable: %s", errstr);
            return;
        }
        psstore_conn_set_cancel(*c, stopping, s); /* stop does not wait for a stalled store */
    }
    sparse_spec_t spec;
    sparse_optim_t optim;
    int S = 1;
    if (!sparse_model(j, c, &spec, &optim, &S))
        return;
    switch (j->kind) {
    case SV_ROWS_JOB_ROWS: run_rows(j, c, &spec, &optim, S); break;
    case SV_ROWS_JOB_DELTA: run_delta(j, c, &spec, &optim, S); break;
    case SV_ROWS_JOB_TABLE: run_table(j, c, &spec, &optim, S); break;
    case SV_ROWS_JOB_INFER: sv_infer_sparse_run(j, c, &spec, &optim, S); break;
    }
}

void *sv_rows_main(void *arg)
{
    struct serve *s = arg;
    fr_thread_name("fr-http-rows");
    psstore_conn_t *c = NULL;
    sv_job_t *j;
    while (sv_pool_take(&s->rows, &j, 1) == 1) {
        run_job(s, (sv_rows_job_t *)j, &c);
        sv_pool_finish(&s->rows, &j, 1);
    }
    psstore_conn_destroy(c);
    return NULL;
}

/* ---- jobs, on the loop --------------------------------------------------------------- */

static void job_fini(sv_job_t *j)
{
    free(((sv_rows_job_t *)j)->ids);
    free(((sv_rows_job_t *)j)->body);
}

/* A new job of kind for model name, or NULL after answering 500. */
sv_rows_job_t *sv_rows_job_new(struct serve *s, struct evhttp_request *req, const char *name,
                               enum sv_rows_kind kind, int json)
{
    sv_rows_job_t *j = calloc(1, sizeof(*j));
    if (j == NULL) {
        sv_send_error(s, req, 500, "out of memory");
        return NULL;
    }
    j->job.fini = job_fini;
    j->kind = kind;
    j->json = json;
    snprintf(j->name, sizeof(j->name), "%s", name);
    return j;
}

/* A job the route turned down before queueing it. */
static void job_free(sv_rows_job_t *j)
{
    free(j->ids);
    free(j);
}

/* ---- the routes, on the loop ------------------------------------------------------- */

/* Parses a non-negative decimal parameter (absent: def); -1 when it is not
 * one or exceeds max. */
static int param_i64(struct evkeyvalq *params, const char *key, int64_t def, int64_t max,
                     int64_t *v)
{
    const char *t = evhttp_find_header(params, key);
    if (t == NULL) {
        *v = def;
        return 0;
    }
    char *end;
    errno = 0;
    long long x = strtoll(t, &end, 10);
    if (*t == '\0' || *t == '-' || *t == '+' || errno != 0 || *end != '\0' || x > max)
        return -1;
    *v = x;
    return 0;
}

/* "safetensors" (default: 0) or "json" (1); -1 after answering 400 for
 * anything else. */
static int param_json(struct serve *s, struct evhttp_request *req, struct evkeyvalq *params)
{
    const char *f = evhttp_find_header(params, "format");
    if (f == NULL || strcmp(f, "safetensors") == 0)
        return 0;
    if (strcmp(f, "json") == 0)
        return 1;
    sv_send_error(s, req, 400, "format must be safetensors or json");
    return -1;
}

/* Parses "1,2,3" into rows[SV_ROWS_MAX] (the table's bound is the
 * reader's to check); the count, or -1 after answering the error. */
static long parse_ids(struct serve *s, struct evhttp_request *req, const char *text, uint32_t *rows)
{
    long n = 0;
    const char *p = text;
    while (*p != '\0') {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || *p == '-' || *p == '+' || errno != 0 || (*end != ',' && *end != '\0')) {
            sv_send_error(s, req, 400, "ids: '%.40s' is not a list of row numbers", p);
            return -1;
        }
        if (v > UINT32_MAX) {
            sv_send_error(s, req, 400, "ids: row %llu is beyond any table", v);
            return -1;
        }
        if (n == SV_ROWS_MAX) {
            sv_send_error(s, req, 400, "ids: at most %d rows a request", SV_ROWS_MAX);
            return -1;
        }
        rows[n++] = (uint32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    if (n == 0)
        sv_send_error(s, req, 400, "ids is required: rows as decimal numbers, comma-separated");
    return n > 0 ? n : -1;
}

void sv_route_rows(struct serve *s, struct evhttp_request *req, const char *name,
                   struct evkeyvalq *params)
{
    int json = param_json(s, req, params);
    const char *text = evhttp_find_header(params, "ids");
    if (json < 0)
        return;
    sv_rows_job_t *j = sv_rows_job_new(s, req, name, SV_ROWS_JOB_ROWS, json);
    if (j == NULL)
        return;
    if ((j->ids = malloc(SV_ROWS_MAX * sizeof(*j->ids))) == NULL) {
        job_free(j);
        sv_send_error(s, req, 500, "out of memory");
        return;
    }
    long n = parse_ids(s, req, text ? text : "", j->ids);
    if (n < 0) {
        job_free(j);
        return;
    }
    j->nids = (size_t)n;
    uint32_t *fit = realloc(j->ids, (size_t)n * sizeof(*j->ids)); /* a queued job keeps its own */
    if (fit != NULL)
        j->ids = fit;
    sv_pool_submit(&s->rows, req, &j->job);
}

void sv_route_delta(struct serve *s, struct evhttp_request *req, const char *name,
                    struct evkeyvalq *params)
{
    int json = param_json(s, req, params);
    int64_t max_rows;
    const char *ep = evhttp_find_header(params, "epoch");
    const char *since = evhttp_find_header(params, "since");
    if (json < 0)
        return;
    /* its shape here, its values against the model's shards on the reader */
    if (since == NULL || since[0] == '\0' || strspn(since, "0123456789.") != strlen(since) ||
        strlen(since) >= sizeof(((sv_rows_job_t *)0)->since)) {
        sv_send_error(s, req, 400,
                      "since is required: the next a table page or delta gave, the version of "
                      "the rows the client holds (0: none; a cold start reads /table first)");
        return;
    }
    if (param_i64(params, "max_rows", SV_ROWS_DEFAULT, SV_ROWS_MAX, &max_rows) != 0 ||
        max_rows == 0) {
        sv_send_error(s, req, 400, "max_rows must be 1..%d", SV_ROWS_MAX);
        return;
    }
    if (ep != NULL &&
        (ep[0] == '\0' || strspn(ep, "0123456789") != strlen(ep) || strlen(ep) > 20)) {
        sv_send_error(s, req, 400, "epoch must be the decimal epoch a delta or page gave");
        return;
    }
    sv_rows_job_t *j = sv_rows_job_new(s, req, name, SV_ROWS_JOB_DELTA, json);
    if (j == NULL)
        return;
    snprintf(j->since, sizeof(j->since), "%s", since);
    j->max_rows = max_rows;
    snprintf(j->epoch, sizeof(j->epoch), "%s", ep != NULL ? ep : "");
    sv_pool_submit(&s->rows, req, &j->job);
}

void sv_route_table(struct serve *s, struct evhttp_request *req, const char *name,
                    struct evkeyvalq *params)
{
    int json = param_json(s, req, params);
    int64_t count;
    const char *cursor = evhttp_find_header(params, "cursor");
    if (json < 0)
        return;
    if (cursor == NULL || cursor[0] == '\0')
        cursor = "0";
    /* "c", or "k.c" for a model of shards: its shape here, the shard on
     * the reader */
    const char *dot = strchr(cursor, '.');
    char *end;
    errno = 0;
    (void)strtoull(dot != NULL ? dot + 1 : cursor, &end, 10); /* HSCAN's: unsigned 64-bit */
    if (errno != 0 || strspn(cursor, "0123456789.") != strlen(cursor) ||
        (dot != NULL && (dot == cursor || strchr(dot + 1, '.') != NULL || dot[1] == '\0')) ||
        strlen(dot != NULL ? dot + 1 : cursor) > 20 ||
        strlen(cursor) >= sizeof(((sv_rows_job_t *)0)->cursor)) {
        sv_send_error(s, req, 400, "cursor must be the cursor a page gave");
        return;
    }
    if (param_i64(params, "count", SV_ROWS_DEFAULT, SV_ROWS_MAX, &count) != 0 || count == 0) {
        sv_send_error(s, req, 400, "count must be 1..%d", SV_ROWS_MAX);
        return;
    }
    sv_rows_job_t *j = sv_rows_job_new(s, req, name, SV_ROWS_JOB_TABLE, json);
    if (j == NULL)
        return;
    snprintf(j->cursor, sizeof(j->cursor), "%s", cursor);
    j->count = count;
    sv_pool_submit(&s->rows, req, &j->job);
}
