/*
 * rows.c - a sparse model's rows over HTTP (docs/design.md "Serving sparse
 * models"): the latest rows by id, the delta since a version (rows changed
 * and tombstones of rows evicted), and the whole table a page at a time
 * for a cold start. http.c dispatches to them.
 *
 * Thread: the loop. Unlike the weights of a dense model, which the
 * follower reads once for every client, these answers depend on the
 * request, so each reads Redis in one bounded transaction on the loop's
 * own connection (at most SV_ROWS_MAX rows: a few milliseconds).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "psstore/psstore.h"
#include "serve/serve_int.h"

#define SV_ROWS_MAX      16384 /* rows one answer reads at most               */
#define SV_ROWS_DEFAULT  4096  /* ... when the client does not say            */
#define SV_DELTA_COMMITS 256   /* commits one delta reads at most              */

/* A read that failed: 404 when the model is gone, else 503 (and the
 * connection is made again at the next request). */
static void read_failed(struct serve *s, struct evhttp_request *req, const char *name, fr_err_t err)
{
    if (err == FR_ERR_NOTFOUND)
        sv_send_error(s, req, 404, "no model '%s'", name);
    else
        sv_op_failed(s, req);
}

/* A sparse model's table and row initialisation, from its meta; 0 after
 * answering the error. */
static int sparse_model(struct serve *s, struct evhttp_request *req, psstore_conn_t *c,
                        const char *name, sparse_spec_t *spec, sparse_optim_t *optim)
{
    psstore_model_info_t info;
    fr_err_t err = psstore_model_info(c, name, &info);
    if (err == FR_ERR_NOTFOUND) {
        sv_send_error(s, req, 404, "no model '%s'", name);
        return 0;
    }
    if (err != FR_OK) {
        sv_op_failed(s, req);
        return 0;
    }
    char errstr[256];
    if (info.sparse[0] == '\0') {
        sv_send_error(s, req, 400,
                      "model '%s' is a dense model (%s): read its weights at "
                      "/v2/models/%s/weights",
                      name, info.layers, name);
        return 0;
    }
    if (psstore_sparse_meta_parse(info.sparse, spec, optim, errstr, sizeof(errstr)) != FR_OK) {
        sv_send_error(s, req, 500, "model '%s': %s", name, errstr);
        return 0;
    }
    return 1;
}

/* The loop's connection and the sparse model name's table and row
 * initialisation; NULL after answering the error. */
static psstore_conn_t *sparse_open(struct serve *s, struct evhttp_request *req, const char *name,
                                   sparse_spec_t *spec, sparse_optim_t *optim)
{
    psstore_conn_t *c = sv_op_conn(s, req);
    return c != NULL && sparse_model(s, req, c, name, spec, optim) ? c : NULL;
}

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

/* What an answer says besides its rows. */
typedef struct answer {
    const char *model;
    const char *kind; /* "rows", "delta", "table" */
    const sparse_spec_t *spec;
    const psstore_rows_page_t *page;
    const uint32_t *stored; /* rows: 1 where the store holds the row, else NULL */
    int64_t since;          /* delta */
    const char *cursor;     /* table: the next page's cursor */
} answer_t;

static void headers(struct evhttp_request *req, const answer_t *a)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    char num[32];
    snprintf(num, sizeof(num), "%lld", (long long)a->page->version);
    evhttp_add_header(h, "X-Freshet-Version", num);
    snprintf(num, sizeof(num), "%llu", (unsigned long long)a->page->epoch);
    evhttp_add_header(h, "X-Freshet-Epoch", num);
    evhttp_add_header(h, "Cache-Control", "no-store");
}

static void send_json(struct serve *s, struct evhttp_request *req, const answer_t *a)
{
    const psstore_rows_page_t *p = a->page;
    size_t keep = sparse_row_len(a->spec);
    sv_buf_t b = {0};
    sv_printf(&b, "{\"model\":");
    sv_json_str(&b, a->model);
    sv_printf(&b, ",\"epoch\":\"%llu\",\"version\":%lld,\"bias\":", (unsigned long long)p->epoch,
              (long long)p->version);
    sv_json_f32(&b, p->bias);
    if (strcmp(a->kind, "delta") == 0)
        sv_printf(&b, ",\"since\":%lld,\"more\":%s,\"time_ms\":%lld", (long long)a->since,
                  p->more ? "true" : "false", (long long)p->time_ms);
    if (a->cursor != NULL) {
        sv_puts(&b, ",\"cursor\":");
        sv_json_str(&b, a->cursor);
    }
    sv_puts(&b, ",\"ids\":[");
    for (size_t i = 0; i < p->n; i++)
        sv_printf(&b, i ? ",%u" : "%u", p->ids[i]);
    sv_puts(&b, "],\"rows\":[");
    for (size_t i = 0; i < p->n; i++) {
        sv_puts(&b, i ? ",[" : "[");
        for (size_t k = 0; k < keep; k++) {
            sv_puts(&b, k ? "," : "");
            sv_json_f32(&b, p->params[i * keep + k]);
        }
        sv_puts(&b, "]");
    }
    sv_puts(&b, "]");
    if (a->stored != NULL) {
        sv_puts(&b, ",\"stored\":[");
        for (size_t i = 0; i < p->n; i++)
            sv_printf(&b, i ? ",%s" : "%s", a->stored[i] ? "true" : "false");
        sv_puts(&b, "]");
    }
    if (strcmp(a->kind, "delta") == 0) {
        sv_puts(&b, ",\"tombstones\":[");
        for (size_t i = 0; i < p->ngone; i++)
            sv_printf(&b, i ? ",%u" : "%u", p->gone[i]);
        sv_puts(&b, "]");
    }
    sv_puts(&b, "}\n");
    if (b.failed) {
        sv_buf_fini(&b);
        sv_send_error(s, req, 500, "out of memory");
        return;
    }
    headers(req, a);
    sv_send_text(s, req, 200, "application/json", b.p, b.len);
    sv_buf_fini(&b);
}

/* The answer as safetensors: ids (U32 [n]), rows (F32 [n, 1 + D]), bias
 * (F32 [1]), and stored (U32 [n]) for /rows or tombstones (U32 [g]) for
 * /delta; the metadata names the model, table, epoch, version and what
 * comes next. */
static void send_safetensors(struct serve *s, struct evhttp_request *req, const answer_t *a)
{
    const psstore_rows_page_t *p = a->page;
    int64_t keep = (int64_t)sparse_row_len(a->spec);
    char table[64], ep[32], ver[32], since[32], more[8], t[32];
    sparse_spec_format(a->spec, table, sizeof(table));
    snprintf(ep, sizeof(ep), "%llu", (unsigned long long)p->epoch);
    snprintf(ver, sizeof(ver), "%lld", (long long)p->version);
    snprintf(since, sizeof(since), "%lld", (long long)a->since);
    snprintf(more, sizeof(more), "%s", p->more ? "true" : "false");
    snprintf(t, sizeof(t), "%lld", (long long)p->time_ms);
    fr_st_kv_t meta[8] = {{"freshet.model", a->model},
                          {"freshet.sparse", table},
                          {"freshet.epoch", ep},
                          {"freshet.version", ver}};
    size_t nmeta = 4;
    if (strcmp(a->kind, "delta") == 0) {
        meta[nmeta++] = (fr_st_kv_t){"freshet.since", since};
        meta[nmeta++] = (fr_st_kv_t){"freshet.more", more};
        meta[nmeta++] = (fr_st_kv_t){"freshet.time_ms", t};
    }
    if (a->cursor != NULL)
        meta[nmeta++] = (fr_st_kv_t){"freshet.cursor", a->cursor};
    fr_st_tensor_t ts[4] = {
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
        {.name = "bias", .dtype = "F32", .ndim = 1, .shape = {1}, .data = &p->bias, .nbytes = 4},
    };
    size_t nt = 3;
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
        sv_send_error(s, req, 500, "%s", errstr);
        return;
    }
    headers(req, a);
    sv_send_text(s, req, 200, "application/octet-stream", (const char *)img, len);
    free(img);
}

static void send_answer(struct serve *s, struct evhttp_request *req, const answer_t *a, int json)
{
    if (json)
        send_json(s, req, a);
    else
        send_safetensors(s, req, a);
}

/* Parses "1,2,3" into rows below 2^bits; the count, or -1 after answering
 * the error. */
static long parse_ids(struct serve *s, struct evhttp_request *req, const char *text, int bits,
                      uint32_t *rows)
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
        if (v >> bits != 0) {
            sv_send_error(s, req, 400, "ids: row %llu is beyond the table's 2^%d rows", v, bits);
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
    sparse_spec_t spec;
    sparse_optim_t optim;
    psstore_conn_t *c = sparse_open(s, req, name, &spec, &optim);
    if (c == NULL)
        return;
    uint32_t *rows = malloc(SV_ROWS_MAX * sizeof(*rows)), *stored = NULL;
    psstore_rows_page_t page = {0};
    size_t keep = sparse_row_len(&spec), slen = sparse_state_len(&spec, &optim);
    float *state = malloc((slen ? slen : 1) * sizeof(float));
    fr_err_t err;
    long n =
        rows != NULL && state != NULL ? parse_ids(s, req, text ? text : "", spec.bits, rows) : -2;
    if (n == -2)
        sv_send_error(s, req, 500, "out of memory");
    if (n > 0) {
        page.ids = rows;
        page.n = (size_t)n;
        page.params = malloc((size_t)n * keep * sizeof(float));
        page.found = malloc((size_t)n);
        stored = malloc((size_t)n * sizeof(*stored));
        if (page.params == NULL || page.found == NULL || stored == NULL) {
            sv_send_error(s, req, 500, "out of memory");
        } else if ((err = psstore_rows_pull(c, name, &spec, &optim, rows, (size_t)n, page.params,
                                            page.found, &page.bias, &page.epoch, &page.version)) !=
                   FR_OK) {
            read_failed(s, req, name, err);
        } else {
            /* a row the store lacks has its initial value: the one the
             * model scores with */
            for (long i = 0; i < n; i++) {
                stored[i] = page.found[i];
                if (!page.found[i])
                    sparse_row_init(&spec, &optim, rows[i], page.params + i * keep, state);
            }
            answer_t a = {
                .model = name, .kind = "rows", .spec = &spec, .page = &page, .stored = stored};
            send_answer(s, req, &a, json);
        }
    }
    free(page.params);
    free(page.found);
    free(stored);
    free(rows);
    free(state);
}

void sv_route_delta(struct serve *s, struct evhttp_request *req, const char *name,
                    struct evkeyvalq *params)
{
    int json = param_json(s, req, params);
    int64_t since, max_rows;
    const char *ep = evhttp_find_header(params, "epoch");
    if (json < 0)
        return;
    if (evhttp_find_header(params, "since") == NULL ||
        param_i64(params, "since", 0, INT64_MAX - 1, &since) != 0) {
        sv_send_error(s, req, 400,
                      "since is required: the version of the rows the client holds (0: none; "
                      "a cold start reads /table first)");
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
    sparse_spec_t spec;
    sparse_optim_t optim;
    psstore_conn_t *c = sparse_open(s, req, name, &spec, &optim);
    if (c == NULL)
        return;
    psstore_rows_page_t page = {0};
    fr_err_t err = psstore_rows_delta(c, name, &spec, &optim, since, SV_DELTA_COMMITS,
                                      (size_t)max_rows, &page);
    if (err != FR_OK) {
        psstore_rows_page_fini(&page);
        read_failed(s, req, name, err);
        return;
    }
    if (ep != NULL && strtoull(ep, NULL, 10) != page.epoch)
        sv_send_error(s, req, 410,
                      "epoch %s is not the model's (%llu): it was created again or rolled "
                      "back; reload /v2/models/%s/table",
                      ep, (unsigned long long)page.epoch, name);
    else if (page.expired && since > page.head)
        sv_send_error(s, req, 410,
                      "version %lld is newer than the model's (%lld): it was created again or "
                      "lost writes; reload /v2/models/%s/table",
                      (long long)since, (long long)page.head, name);
    else if (page.expired)
        sv_send_error(s, req, 410,
                      "version %lld is older than the changes kept (from version %lld, [sparse] "
                      "delta_seconds); reload /v2/models/%s/table",
                      (long long)since, (long long)page.floor, name);
    else {
        answer_t a = {.model = name, .kind = "delta", .spec = &spec, .page = &page, .since = since};
        send_answer(s, req, &a, json);
    }
    psstore_rows_page_fini(&page);
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
    char *end;
    errno = 0;
    (void)strtoull(cursor, &end, 10); /* HSCAN's cursors are unsigned 64-bit */
    if (*end != '\0' || errno != 0 || strspn(cursor, "0123456789") != strlen(cursor)) {
        sv_send_error(s, req, 400, "cursor must be the decimal cursor a page gave");
        return;
    }
    if (param_i64(params, "count", SV_ROWS_DEFAULT, SV_ROWS_MAX, &count) != 0 || count == 0) {
        sv_send_error(s, req, 400, "count must be 1..%d", SV_ROWS_MAX);
        return;
    }
    sparse_spec_t spec;
    sparse_optim_t optim;
    psstore_conn_t *c = sparse_open(s, req, name, &spec, &optim);
    if (c == NULL)
        return;
    psstore_rows_page_t page = {0};
    char next[32];
    fr_err_t err = psstore_rows_scan(c, name, &spec, &optim, cursor, (size_t)count, &page, next);
    if (err != FR_OK) {
        psstore_rows_page_fini(&page);
        read_failed(s, req, name, err);
        return;
    }
    answer_t a = {.model = name, .kind = "table", .spec = &spec, .page = &page, .cursor = next};
    send_answer(s, req, &a, json);
    psstore_rows_page_fini(&page);
}
