/*
 * fit_sparse.c - "freshet fit-sparse": trains a sparse model (hashed LR or
 * a factorization machine, docs/design.md "Sparse models") offline from a
 * Criteo or libsvm file, one pass in file order, with progressive
 * validation: every batch is scored before the model learns from it, and
 * the logloss and AUC of those scores are printed per window. It runs the
 * computations the streaming path runs (sparse/), on a table in memory.
 */
#ifdef FRESHET_HAVE_SPARSE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "ingest/ingest.h"
#include "sparse/prog.h"
#include "sparse/sparse.h"

#define CMD              "fit-sparse"
#define LINE_MAX_BYTES   (1 << 16) /* a longer line is refused, and skipped */
#define BINARY_FRAME_MAX (1 << 20) /* a longer binary record: not such a file */

static void fit_sparse_usage(FILE *out)
{
    fprintf(out, "usage: freshet fit-sparse --sparse fields:F,buckets:2^B,dim:D --data FILE\n"
                 "                          --format criteo|libsvm|binary [options]\n"
                 "\n"
                 "Trains a sparse model offline, one pass over FILE in order ('-': standard\n"
                 "input), with progressive validation: each batch is scored before the model\n"
                 "learns from it. One line per window: the window's mean logloss, AUC and\n"
                 "click rate, and samples/s; at the end the mean logloss of every record.\n"
                 "D = 0 is hashed logistic regression, D > 0 a factorization machine;\n"
                 "fields:F,buckets:2^B,dim:D,tower:64-32 adds a dense ReLU tower over the\n"
                 "fields' embeddings; ,classes:C a softmax over C classes (labels 0..C-1).\n"
                 "\n"
                 "  --sparse S           the table: fields per record (criteo: 39), 2^B rows,\n"
                 "                       embedding width D\n"
                 "  --data FILE          the records, one a line ('-': standard input);\n"
                 "                       gzip data is recognised and read as it is\n"
                 "  --format F           criteo | libsvm | binary (records each after its\n"
                 "                       length, 4 bytes LE, as produce --encode binary writes)\n"
                 "  --optimizer O        ftrl (linear weights and bias; embeddings by adagrad)\n"
                 "                       | adagrad                              (default ftrl)\n"
                 "  --lr X               Adagrad's learning rate               (default 0.02)\n"
                 "  --alpha X            FTRL alpha                            (default 0.1)\n"
                 "  --beta X             FTRL beta                             (default 1)\n"
                 "  --l1 X, --l2 X       FTRL regularization of linear weights (default 0)\n"
                 "  --init-std X         embeddings' initial standard deviation (default 0.01)\n"
                 "  --seed S             seed of the embeddings' initial values (default 42)\n"
                 "  --batch B            records per step                      (default 256)\n"
                 "  --window N           records per progress line             (default 100000)\n"
                 "  --limit N            stop after N records\n"
                 "  --freeze-after N     learn from the first N records only, and score the\n"
                 "                       rest with the model frozen (how a model that stops\n"
                 "                       training falls behind a drifting stream)\n"
                 "  --out W              write the table as safetensors: \"rows\" [2^B, K+D] and\n"
                 "                       \"bias\" [K] (K = 1, or the classes of a softmax), and\n"
                 "                       \"tower\" [P] with a tower; the shape in its metadata\n"
                 "  -h, --help           this text\n"
                 "\n"
                 "Malformed records are skipped and counted by reason. Exit status: 0 done,\n"
                 "1 failed (out of memory, unwritable --out), 2 bad arguments or an\n"
                 "unreadable file.\n");
}

typedef struct fit_sparse_opts {
    const char *spec, *data, *format, *optimizer, *out;
    double lr, alpha, beta, l1, l2, init_std;
    long long seed, batch, window, limit, freeze;
} fit_sparse_opts_t;

static int parse_opts(fit_sparse_opts_t *o, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"sparse", required_argument, NULL, 'S'},       {"data", required_argument, NULL, 'd'},
        {"format", required_argument, NULL, 'f'},       {"optimizer", required_argument, NULL, 'o'},
        {"lr", required_argument, NULL, 'r'},           {"alpha", required_argument, NULL, 'a'},
        {"beta", required_argument, NULL, 'B'},         {"l1", required_argument, NULL, '1'},
        {"l2", required_argument, NULL, '2'},           {"init-std", required_argument, NULL, 'i'},
        {"seed", required_argument, NULL, 's'},         {"batch", required_argument, NULL, 'b'},
        {"window", required_argument, NULL, 'w'},       {"limit", required_argument, NULL, 'n'},
        {"out", required_argument, NULL, 'O'},          {"help", no_argument, NULL, 'h'},
        {"freeze-after", required_argument, NULL, 'F'}, {NULL, 0, NULL, 0},
    };
    sparse_optim_t d; /* the optimizer's defaults are sparse_optim_defaults' */
    sparse_optim_defaults(&d, SPARSE_OPTIM_FTRL);
    *o = (fit_sparse_opts_t){.optimizer = "ftrl",
                             .lr = d.lr,
                             .alpha = d.alpha,
                             .beta = d.beta,
                             .l1 = d.l1,
                             .l2 = d.l2,
                             .init_std = d.init_std,
                             .seed = 42,
                             .batch = 256,
                             .window = 100000};
    int c, rc = 0;
    app_opts_begin();
    while (rc == 0 && (c = app_opts_next(CMD, argc, argv, ":h", longopts, NULL, fit_sparse_usage,
                                         &rc)) != -1) {
        switch (c) {
        case 'S': o->spec = optarg; break;
        case 'd': o->data = optarg; break;
        case 'f': o->format = optarg; break;
        case 'o': o->optimizer = optarg; break;
        case 'r': rc = app_parse_double(CMD, "--lr", optarg, 0, 1e3, &o->lr); break;
        case 'a': rc = app_parse_double(CMD, "--alpha", optarg, 1e-9, 1e3, &o->alpha); break;
        case 'B': rc = app_parse_double(CMD, "--beta", optarg, 0, 1e3, &o->beta); break;
        case '1': rc = app_parse_double(CMD, "--l1", optarg, 0, 1e6, &o->l1); break;
        case '2': rc = app_parse_double(CMD, "--l2", optarg, 0, 1e6, &o->l2); break;
        case 'i': rc = app_parse_double(CMD, "--init-std", optarg, 0, 10, &o->init_std); break;
        case 's': rc = app_parse_long(CMD, "--seed", optarg, 0, INT64_MAX, &o->seed); break;
        case 'b': rc = app_parse_long(CMD, "--batch", optarg, 1, 1 << 20, &o->batch); break;
        case 'w': rc = app_parse_long(CMD, "--window", optarg, 1, 1 << 28, &o->window); break;
        case 'n': rc = app_parse_long(CMD, "--limit", optarg, 1, INT64_MAX, &o->limit); break;
        case 'O': o->out = optarg; break;
        case 'F':
            rc = app_parse_long(CMD, "--freeze-after", optarg, 1, INT64_MAX, &o->freeze);
            break;
        }
    }
    if ((rc = app_opts_end(CMD, argc, argv, rc)) != 0)
        return rc;
    if (o->spec == NULL || o->data == NULL || o->format == NULL)
        return app_usage_error(CMD, "--sparse, --data and --format are required");
    sparse_layout_t layout;
    if (sparse_layout_parse(o->format, &layout) != FR_OK)
        return app_usage_error(CMD, "--format must be criteo, libsvm or binary, got '%s'",
                               o->format);
    return 0;
}

/* The model in memory: the table, its optimizer state and the dense part
 * (the bias and the tower) with its state. */
typedef struct table {
    sparse_spec_t spec;
    sparse_optim_t optim;
    size_t rl, sl;
    float *rows, *state, *dense, *dense_state, *gdense;
} table_t;

static int table_init(table_t *t, uint64_t nrows)
{
    t->rl = sparse_row_len(&t->spec);
    t->sl = sparse_state_len(&t->spec, &t->optim);
    t->rows = malloc(nrows * t->rl * sizeof(float));
    t->state = malloc(nrows * t->sl * sizeof(float));
    t->dense = malloc(sparse_dense_len(&t->spec) * sizeof(float));
    t->gdense = malloc(sparse_dense_len(&t->spec) * sizeof(float));
    t->dense_state = calloc(sparse_dense_state_len(&t->spec), sizeof(float));
    if (t->rows == NULL || t->state == NULL || t->dense == NULL || t->gdense == NULL ||
        t->dense_state == NULL) {
        fprintf(stderr, "freshet %s: out of memory for %llu rows\n", CMD,
                (unsigned long long)nrows);
        return APP_EXIT_FAILURE;
    }
    for (uint64_t r = 0; r < nrows; r++)
        sparse_row_init(&t->spec, &t->optim, (uint32_t)r, t->rows + r * t->rl,
                        t->state + r * t->sl);
    sparse_dense_init(&t->spec, t->optim.seed, t->dense); /* as the store's creation */
    return 0;
}

/* One step on batch b: pull, score (into p) and gradient, then apply
 * unless learn is 0. */
static void table_step(table_t *t, const sparse_batch_t *b, float *params, float *grad, float *p,
                       int learn)
{
    for (size_t r = 0; r < b->nrows; r++)
        memcpy(params + r * t->rl, t->rows + (size_t)b->rows[r] * t->rl, t->rl * sizeof(float));
    sparse_fm_grad(&t->spec, b, params, t->dense, grad, t->gdense, p);
    if (!learn)
        return;
    for (size_t r = 0; r < b->nrows; r++)
        sparse_row_step(&t->spec, &t->optim, t->rows + (size_t)b->rows[r] * t->rl,
                        t->state + (size_t)b->rows[r] * t->sl, grad + r * t->rl);
    sparse_dense_step(&t->spec, &t->optim, t->dense, t->dense_state, t->gdense);
}

static int table_write(const table_t *t, const char *path, uint64_t nrows)
{
    char spec[128], errstr[512];
    sparse_spec_format(&t->spec, spec, sizeof(spec));
    size_t ntower = sparse_tower_len(&t->spec), K = (size_t)sparse_outputs(&t->spec);
    fr_st_tensor_t tensors[3] = {
        {.name = "rows",
         .dtype = "F32",
         .ndim = 2,
         .shape = {(int64_t)nrows, (int64_t)t->rl},
         .data = t->rows,
         .nbytes = nrows * t->rl * sizeof(float)},
        {.name = "bias",
         .dtype = "F32",
         .ndim = 1,
         .shape = {(int64_t)K},
         .data = t->dense,
         .nbytes = K * sizeof(float)},
        {.name = "tower", /* the layers' W[in][out] and b[out], in order */
         .dtype = "F32",
         .ndim = 1,
         .shape = {(int64_t)ntower},
         .data = t->dense + K,
         .nbytes = ntower * sizeof(float)},
    };
    fr_st_kv_t meta[2] = {{"sparse", spec}, {"optimizer", sparse_optim_name(t->optim.kind)}};
    if (fr_st_write_file(path, tensors, ntower > 0 ? 3 : 2, meta, 2, errstr, sizeof(errstr)) !=
        FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
        return APP_EXIT_FAILURE;
    }
    printf("wrote %s\n", path);
    return 0;
}

/* The pass over the records. */
typedef struct pass {
    const fit_sparse_opts_t *o;
    table_t *t;
    sparse_batch_t *b;
    sparse_prog_t *pv;
    float *params, *grad, *p;
    uint64_t t0, tw;
    int64_t records, rejected[8];
    const char *reasons[8];
    int nreasons;
} pass_t;

/* Counts a refused record under its reason. */
static void count_reject(pass_t *ps, const char *why)
{
    int i = 0;
    while (i < ps->nreasons && strcmp(ps->reasons[i], why) != 0)
        i++;
    if (i == ps->nreasons && ps->nreasons < 8)
        ps->reasons[ps->nreasons++] = why;
    if (i < 8)
        ps->rejected[i]++;
}

/* Steps on the batch and reports the windows it closed. */
static void flush_batch(pass_t *ps)
{
    if (ps->b->n == 0)
        return;
    /* a batch the freeze point cuts is learned whole */
    int learn = ps->o->freeze == 0 || ps->records - (int64_t)ps->b->n < ps->o->freeze;
    table_step(ps->t, ps->b, ps->params, ps->grad, ps->p, learn);
    for (size_t i = 0; i < ps->b->n; i++) {
        sparse_prog_window_t w;
        /* a softmax's p is its own class's: scored as a positive */
        float y = ps->t->spec.classes > 0 ? 1.0f : ps->b->samples[i].label;
        if (!sparse_prog_add(ps->pv, ps->p[i], y, &w))
            continue;
        uint64_t now = fr_clock_mono_ns();
        double secs = (double)(now - ps->tw) * 1e-9; /* ~0 for a window inside a batch */
        printf("window %lld: %zu records, logloss %.5f, auc %.4f, ctr %.4f, %.0f samples/s\n",
               (long long)w.index, w.n, w.logloss, w.auc, w.ctr,
               secs > 1e-6 ? (double)w.n / secs : 0.0);
        fflush(stdout);
        ps->tw = now;
    }
    sparse_batch_clear(ps->b);
}

/* Takes one parsed record (or counts its refusal). */
static void take(pass_t *ps, fr_err_t err, const sparse_sample_t *s, const char *why)
{
    if (err != FR_OK) {
        count_reject(ps, why);
        return;
    }
    sparse_batch_add(ps->b, s);
    ps->records++;
    if (ps->b->n == ps->b->cap)
        flush_batch(ps);
}

/*
 * Every record of the file: lines, or for the binary layout records each
 * after its length (4 bytes LE; a length beyond BINARY_FRAME_MAX means the
 * file is not such records). A line longer than LINE_MAX_BYTES is refused
 * as "too long" and skipped. Returns 0 or an exit status.
 */
static int run_records(pass_t *ps, ingest_file_t *f, sparse_layout_t layout)
{
    const fit_sparse_opts_t *o = ps->o;
    char errstr[512];
    fr_err_t err = FR_OK;
    while (o->limit == 0 || ps->records < o->limit) {
        const void *rec;
        const char *line;
        size_t len;
        err = layout == SPARSE_LAYOUT_BINARY
                  ? ingest_file_framed(f, &rec, &len, errstr, sizeof(errstr))
                  : ingest_file_line(f, &line, &len, errstr, sizeof(errstr));
        if (layout != SPARSE_LAYOUT_BINARY)
            rec = line;
        if (err == FR_ERR_RANGE) {
            count_reject(ps, "too long");
            continue;
        }
        if (err != FR_OK)
            break;
        sparse_sample_t s;
        const char *why = "";
        fr_err_t perr = sparse_parse_record(&ps->t->spec, layout, rec, len, &s, &why);
        take(ps, perr, &s, why);
    }
    flush_batch(ps);
    if (err != FR_OK && err != FR_ERR_NOTFOUND) {
        fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
        return APP_EXIT_USAGE;
    }
    if (ps->records == 0) {
        fprintf(stderr, "freshet %s: %s: no record of format %s\n", CMD, o->data, o->format);
        return APP_EXIT_USAGE;
    }
    return 0;
}

int app_cmd_fit_sparse(int argc, char **argv)
{
    fit_sparse_opts_t o;
    int rc = parse_opts(&o, argc, argv);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    char errstr[512];
    table_t t = {0};
    if (sparse_spec_parse(o.spec, &t.spec, errstr, sizeof(errstr)) != FR_OK)
        return app_usage_error(CMD, "%s", errstr);
    sparse_optim_kind_t kind;
    if (sparse_optim_parse(o.optimizer, &kind) != FR_OK)
        return app_usage_error(CMD, "--optimizer must be ftrl or adagrad, got '%s'", o.optimizer);
    sparse_layout_t layout = SPARSE_LAYOUT_CRITEO;
    (void)sparse_layout_parse(o.format, &layout); /* checked by parse_opts */
    if (layout == SPARSE_LAYOUT_CRITEO && t.spec.fields < SPARSE_CRITEO_FIELDS)
        return app_usage_error(CMD, "--format criteo needs fields:%d or more, got %d",
                               SPARSE_CRITEO_FIELDS, t.spec.fields);
    sparse_optim_defaults(&t.optim, kind);
    t.optim.lr = (float)o.lr;
    t.optim.alpha = (float)o.alpha;
    t.optim.beta = (float)o.beta;
    t.optim.l1 = (float)o.l1;
    t.optim.l2 = (float)o.l2;
    t.optim.init_std = (float)o.init_std;
    t.optim.seed = (uint64_t)o.seed;
    ingest_file_t *in =
        ingest_file_open(o.data, layout == SPARSE_LAYOUT_BINARY ? BINARY_FRAME_MAX : LINE_MAX_BYTES,
                         errstr, sizeof(errstr));
    if (in == NULL) {
        fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
        return APP_EXIT_USAGE;
    }
    const uint64_t nrows = (uint64_t)1 << t.spec.bits;
    pass_t ps = {.o = &o, .t = &t};
    size_t cap = (size_t)o.batch * SPARSE_FIELDS_MAX * sparse_row_len(&t.spec);
    ps.b = sparse_batch_new((size_t)o.batch);
    ps.pv = sparse_prog_new((size_t)o.window);
    if (ps.pv != NULL && t.spec.classes > 0)
        sparse_prog_multiclass(ps.pv);
    ps.params = malloc(cap * sizeof(float));
    ps.grad = malloc(cap * sizeof(float));
    ps.p = malloc((size_t)o.batch * sizeof(float));
    if (ps.b == NULL || ps.pv == NULL || ps.params == NULL || ps.grad == NULL || ps.p == NULL) {
        fprintf(stderr, "freshet %s: out of memory\n", CMD);
        rc = APP_EXIT_FAILURE;
    }
    if (rc == 0)
        rc = table_init(&t, nrows);
    ps.t0 = ps.tw = fr_clock_mono_ns();
    if (rc == 0)
        rc = run_records(&ps, in, layout);
    if (rc == 0) {
        sparse_prog_window_t w;
        sparse_prog_open(ps.pv, &w);
        if (w.n > 0)
            printf("window %lld (partial): %zu records, logloss %.5f, auc %.4f, ctr %.4f\n",
                   (long long)w.index, w.n, w.logloss, w.auc, w.ctr);
        int64_t n;
        double mean = sparse_prog_mean(ps.pv, &n);
        double secs = (double)(fr_clock_mono_ns() - ps.t0) * 1e-9;
        printf("%lld records, progressive logloss %.5f, %.0f samples/s\n", (long long)n, mean,
               (double)n / secs);
        for (int i = 0; i < ps.nreasons; i++)
            fprintf(stderr, "freshet %s: %lld records skipped: %s\n", CMD,
                    (long long)ps.rejected[i], ps.reasons[i]);
        if (o.out != NULL)
            rc = table_write(&t, o.out, nrows);
    }
    ingest_file_close(in);
    sparse_batch_destroy(ps.b);
    sparse_prog_destroy(ps.pv);
    free(ps.params);
    free(ps.grad);
    free(ps.p);
    free(t.rows);
    free(t.state);
    free(t.dense);
    free(t.gdense);
    free(t.dense_state);
    return rc;
}
#endif
