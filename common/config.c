/*
 * config.c - the INI configuration: one schema table that knows every key
 * (type, default, range, documentation), a line parser for files, the
 * "--set section.key=value" overrides, environment overrides for secrets and
 * the generator of deploy/freshet.conf.example.
 *
 * A config is not thread-safe while it is modified; once loaded, readers on
 * any thread may share it.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/common.h"

typedef enum conf_type {
    CT_STRING,
    CT_INT,
    CT_DOUBLE,
    CT_BOOL,
    CT_ENUM,
} conf_type_t;

/* conf_key_t.flags */
#define CK_MIN_OPEN 1u /* double: the minimum itself is excluded */
#define CK_MAX_OPEN 2u /* double: the maximum itself is excluded */
#define CK_SECRET   4u /* never echoed; the example shows it empty */

/* A string validator: 1 when value is acceptable, 0 otherwise. What it
 * accepts is worded in the schema entry, next to it. */
typedef int (*conf_check_fn)(const char *value);

typedef struct conf_key {
    const char *section;
    const char *key;
    conf_type_t type;
    const char *def;
    int64_t imin, imax; /* CT_INT, inclusive */
    double dmin, dmax;  /* CT_DOUBLE, see CK_MIN_OPEN / CK_MAX_OPEN */
    unsigned flags;
    const char *accepts; /* CT_ENUM: "a|b|c"; checked CT_STRING: what it accepts */
    conf_check_fn check; /* CT_STRING: optional */
    const char *doc;     /* one line for the example file */
} conf_key_t;

#define NO_MAX INT64_MAX

/* One schema entry per key; these macros keep each one to one entry. */
// clang-format off
#define K_STR(s, k, def, doc) {s, k, CT_STRING, def, 0, 0, 0, 0, 0, NULL, NULL, doc}
#define K_CHK(s, k, def, chk, acc, doc) {s, k, CT_STRING, def, 0, 0, 0, 0, 0, acc, chk, doc}
#define K_SECRET(s, k, doc) {s, k, CT_STRING, "", 0, 0, 0, 0, CK_SECRET, NULL, NULL, doc}
#define K_INT(s, k, def, lo, hi, doc) {s, k, CT_INT, def, lo, hi, 0, 0, 0, NULL, NULL, doc}
#define K_DBL(s, k, def, lo, hi, fl, doc) {s, k, CT_DOUBLE, def, 0, 0, lo, hi, fl, NULL, NULL, doc}
#define K_BOOL(s, k, def, doc) {s, k, CT_BOOL, def, 0, 0, 0, 0, 0, NULL, NULL, doc}
#define K_ENUM(s, k, def, ch, doc) {s, k, CT_ENUM, def, 0, 0, 0, 0, 0, ch, NULL, doc}
// clang-format on

static int check_model_name(const char *value);
static int check_layers(const char *value);

/* The schema: every key of docs/operations.md "Configuration" except [kafka], whose
 * keys are librdkafka's and pass verbatim. Adding a key is one entry here;
 * the example file, validation and getters follow from it. */
static const conf_key_t schema[] = {
    K_CHK("model", "name", "default", check_model_name,
          "a name of 1 to 64 characters from [A-Za-z0-9._-]",
          "Model name; Redis keys and the consumer group (freshet.<name>) use it."),
    K_CHK("model", "layers", "784-256-10", check_layers,
          "2 to 16 layer widths in 1..1048576 joined by '-'",
          "Layer widths from input to output, e.g. 784-256-10."),
    K_ENUM("model", "loss", "softmax", "softmax|logistic|mse", "Loss on the output layer."),
    K_INT("model", "seed", "42", 0, NO_MAX, "Seed for weight initialisation."),
    K_STR("model", "init", "",
          "Initial weights: a safetensors file (empty: random initialisation)."),
    K_STR("model", "sparse", "",
          "A sparse model's table, fields:F,buckets:2^B,dim:D (hashed logistic regression at "
          "D = 0, a factorization machine above), with ,tower:H1-H2 a dense ReLU tower over the "
          "embeddings, with ,classes:C a softmax over C classes; empty: the dense model of "
          "layers."),

    K_STR("ingest", "topic", "freshet.samples", "Kafka topic to consume."),
    K_ENUM("ingest", "format", "f32", "csv|libsvm|f32|criteo|binary",
           "Record encoding (a sparse model: criteo, libsvm or binary)."),
    K_INT("ingest", "features", "0", 0, NO_MAX,
          "Features per sample (0: the model's input width)."),
    K_DBL("ingest", "max_abs_feature", "1e6", 0, 3e38, 0,
          "A record with a feature of larger magnitude is rejected (reason magnitude): finite, "
          "it would still overflow a gradient (0: no limit)."),
    K_INT("ingest", "batch", "64", 1, 65536, "Samples per batch."),
    K_INT("ingest", "queue", "16", 1, 1 << 20,
          "Batches buffered for the trainers; when full, consumption pauses."),
    K_INT("ingest", "linger_ms", "10", 0, 600000,
          "Milliseconds a batch may wait for more samples after its first; then it is sent short."),
    K_INT("ingest", "decode_threads", "-1", -1, 16,
          "Threads that decode records beside the poll thread while a backlog is read (0: the "
          "poll thread decodes alone; -1: 1 on a machine of 2 or more cores, else 0). A dense "
          "model's f32 records are never handed off: their decode is a copy."),
    K_ENUM("ingest", "start", "earliest", "earliest|latest",
           "Where a partition the store has never seen starts (Kafka's committed offsets are never "
           "used)."),
    K_ENUM("ingest", "assignment", "auto", "auto|group|all",
           "How partitions are shared: group (the consumer group freshet.<model>), all (this "
           "process takes every partition without joining the group: restarts skip the group's "
           "rebalance), auto (all for freshet run, group for freshet train)."),
    K_STR("ingest", "dead_letter_topic", "",
          "Topic that receives rejected records (empty: they are only counted)."),

    K_STR("redis", "url", "redis://127.0.0.1:6379/0",
          "redis://[user:pass@]host:port/db, unix:///path, or a Redis Cluster's seeds "
          "redis://host:port,host:port (FRESHET_REDIS_URL overrides)."),
    K_INT("redis", "wait_replicas", "0", 0, 64,
          "Replicas each applier commit waits for (WAIT); commits that reach fewer are counted "
          "(0: no wait)."),
    K_INT("redis", "wait_timeout_ms", "1000", 1, 4000,
          "How long a commit waits for wait_replicas replicas (below the applier's 5 s command "
          "timeout)."),

    K_INT("trainer", "workers", "2", 1, 1024, "Trainer worker threads."),
    K_ENUM("trainer", "backend", "auto", "auto|cpu|cuda",
           "Compute backend (auto: CUDA where a GPU exists, else the CPU)."),
    K_STR("trainer", "devices", "",
          "CUDA device of each worker, e.g. 0,0,1 (repeated when shorter than the workers; "
          "empty: device 0)."),
    K_ENUM("trainer", "mode", "async", "async|sync|backup|groups|ssp|adaptive|auto",
           "Training mode."),
    K_INT("trainer", "backups", "0", 0, NO_MAX, "Backup workers per round (mode = backup)."),
    K_INT("trainer", "groups", "1", 1, 256,
          "Worker groups (mode = groups): worker i of a process is in group i % groups."),
    K_INT("trainer", "ssp_bound", "3", 0, NO_MAX,
          "Steps a worker may run ahead of the slowest live one (mode = ssp)."),
    K_STR("trainer", "slowdown", "",
          "Artificial slowdown for experiments: <worker>:<factor>[:<seconds>],... (empty: none)."),
    K_ENUM("trainer", "sync_lr_scale", "none", "none|linear",
           "Learning-rate scaling with the number of workers in synchronous rounds."),
    K_DBL("trainer", "member_timeout", "10", 0, HUGE_VAL, CK_MIN_OPEN,
          "Seconds of silence before a worker leaves its group."),
    K_DBL("trainer", "round_timeout", "5", 0, HUGE_VAL, CK_MIN_OPEN,
          "Seconds a synchronous round waits for its workers."),
    K_INT("trainer", "idle_ms", "2000", 0, NO_MAX,
          "Milliseconds without data before a worker counts as idle."),
    K_INT("trainer", "in_flight", "1", 0, 16,
          "Gradients a worker may have pushed and not yet applied when it pulls (0: no bound)."),

    K_DBL("controller", "lr", "0.05", 0, HUGE_VAL, CK_MIN_OPEN, "Base learning rate."),
    K_ENUM("controller", "policy", "constant", "constant|inverse|delay|adaptive",
           "Staleness-aware learning-rate policy."),
    K_INT("controller", "warmup", "0", 0, NO_MAX, "Warm-up updates (0: none)."),
    K_INT("controller", "max_staleness", "0", 0, NO_MAX,
          "Drop gradients staler than this many versions (0: no limit)."),
    K_DBL("controller", "clip_norm", "0", 0, HUGE_VAL, 0,
          "Clip gradients to this L2 norm (0: no clipping)."),
    K_DBL("controller", "dc_lambda", "0", 0, HUGE_VAL, 0, "Delay-compensation strength (0: off)."),
    K_BOOL("controller", "dc_adaptive", "false", "Adapt the delay-compensation strength."),
    K_INT("controller", "dc_ring", "8", 1, 1024, "Weight versions kept for delay compensation."),
    K_INT("controller", "average", "6400", 0, NO_MAX,
          "Samples the served weights average over (0: serve the training weights)."),
    K_ENUM("controller", "optimizer", "sgd", "sgd|momentum|adagrad", "Update rule."),
    K_DBL("controller", "momentum", "0.9", 0, 1, CK_MAX_OPEN,
          "Momentum coefficient (optimizer = momentum)."),

    K_ENUM("sparse", "optimizer", "ftrl", "ftrl|adagrad",
           "A sparse model's per-row optimizer (ftrl: FTRL-Proximal on the linear weights and the "
           "bias, Adagrad on the embeddings)."),
    K_DBL("sparse", "lr", "0.02", 0, HUGE_VAL, CK_MIN_OPEN, "Adagrad's learning rate."),
    K_DBL("sparse", "alpha", "0.1", 0, HUGE_VAL, CK_MIN_OPEN, "FTRL's alpha."),
    K_DBL("sparse", "beta", "1", 0, HUGE_VAL, 0, "FTRL's beta."),
    K_DBL("sparse", "l1", "0", 0, HUGE_VAL, 0, "FTRL's L1 regularization."),
    K_DBL("sparse", "l2", "0", 0, HUGE_VAL, 0, "FTRL's L2 regularization."),
    K_INT("sparse", "min_count", "1", 1, 255,
          "Admission: a row the store lacks is created at the min_count-th gradient that names "
          "it (counted in the applier's sketch); until then its value is the initial one and "
          "its gradients are dropped."),
    K_INT("sparse", "ttl_seconds", "0", 0, 315360000,
          "Eviction: a row no gradient stepped for this many seconds is deleted and published "
          "as a tombstone in /delta (0: rows are kept)."),
    K_INT("sparse", "delta_seconds", "60", 1, 604800,
          "Seconds of history the changes stream keeps for /delta: a client that asks at least "
          "this often never needs the full table again (memory: 4 bytes per row written)."),
    K_INT("sparse", "window", "100000", 1, NO_MAX,
          "Records per progressive-validation window: each window's logloss and AUC are logged, "
          "every record scored before the model learned from it."),

    K_INT("psstore", "shards", "1", 1, 64,
          "Shards a new model is cut into (a dense model's weights at row boundaries, a "
          "sparse model's rows by row % S), each with its own applier and Redis Cluster slot "
          "(chosen when the model is created; 1 keeps one)."),
    K_INT("psstore", "max_pending", "64", 1, NO_MAX,
          "Gradients that may wait in the grads stream; a push waits beyond it (backpressure)."),
    K_INT("psstore", "commit_ms", "-1", -1, NO_MAX,
          "Milliseconds to group updates into one commit of the weights to Redis (0: commit "
          "each; -1: 10 for a dense model, 5 for a sparse one, whose commit writes only the "
          "rows that changed; readers see a version at most this much later). A sparse model "
          "in freshet run writes its window behind: sooner at 64 gradients or 65,536 changed "
          "rows."),
    K_BOOL("psstore", "audit", "false",
           "Append every applied or dropped batch's intervals to the audit stream."),
    K_DBL("psstore", "gap_timeout", "10", 0, HUGE_VAL, CK_MIN_OPEN,
          "Seconds to wait for a missing offset range."),
    K_INT("psstore", "versions_keep", "10000", 1, NO_MAX, "Version notifications kept."),
    K_INT("psstore", "snapshot_every", "100", 0, NO_MAX,
          "Publish a snapshot every N versions (0: off)."),
    K_DBL("psstore", "snapshot_seconds", "60", 0, HUGE_VAL, 0,
          "Publish a snapshot at least every N seconds (0: off)."),
    K_INT("psstore", "snapshot_retain", "10", 1, NO_MAX, "Snapshots retained."),
    K_INT("psstore", "lease_ms", "5000", 100, NO_MAX,
          "Applier lease in milliseconds; a standby takes over when it lapses."),

    K_STR("serve", "listen", "127.0.0.1:8080",
          "HTTP listen address, host:port or [v6]:port (port 0: any free one; empty: freshet "
          "run serves no HTTP)."),
    K_SECRET("serve", "token",
             "Bearer token for replay and rollback (empty: both refused); prefer FRESHET_TOKEN."),
    K_BOOL("serve", "protect_reads", "false",
           "Require the token for reads as well (health and the dashboard page stay open)."),
    K_INT("serve", "refresh_ms", "20", 0, NO_MAX,
          "Weights are read from the store at most this often per model (milliseconds)."),
    K_STR("serve", "tls_cert", "", "TLS certificate chain, PEM (empty: plain HTTP)."),
    K_STR("serve", "tls_key", "", "TLS private key, PEM."),
    K_STR("serve", "chartjs", "/usr/share/javascript/chart.js/chart.min.js",
          "Chart.js (UMD build) the dashboard draws with (Debian: libjs-chart.js)."),
    K_INT("serve", "max_body", "1048576", 1024, 67108864,
          "Largest request body in bytes (an infer request's JSON takes about 10 bytes a "
          "feature)."),
    K_INT("serve", "header_timeout", "10", 1, 60,
          "Seconds a new connection has to send its first request, headers and body; a slow or "
          "silent one is closed (slowloris). After it, a connection may wait 60 s (a long-poll's "
          "30 s and a margin)."),
    K_INT("serve", "max_connections", "0", 0, 1000000,
          "HTTP connections open at most; more wait in the kernel's backlog until one closes, so "
          "that descriptors remain for Redis and Kafka (0: half the process's descriptor limit, "
          "at least 16)."),
    K_BOOL("serve", "infer", "true",
           "Answer POST /v2/models/{m}/infer with predictions from the weights served."),
    K_INT("serve", "infer_threads", "2", 1, 16, "Threads computing predictions."),
    K_INT("serve", "infer_queue", "256", 1, 65536,
          "Predictions waiting for a thread at most; beyond it a request gets 503."),
    K_STR("serve", "allowed_hosts", "",
          "Host header names answered, comma-separated (* any; empty: localhost, 127.0.0.1, ::1 "
          "and the listen host, or any when listening on every address)."),

    K_STR("eval", "data", "", "Evaluation data file (empty: no evaluation)."),
    K_STR("eval", "labels", "", "Labels file (format = idx)."),
    K_ENUM("eval", "format", "idx", "csv|libsvm|f32|idx", "Evaluation file format."),
    K_INT("eval", "every", "100", 0, NO_MAX, "Evaluate every N versions (0: off)."),
};

#define NKEYS (sizeof(schema) / sizeof(schema[0]))

/* Sections in file order; [kafka] takes any key. */
static const char *const sections[] = {
    "model",      "kafka",  "ingest",  "redis", "trainer",
    "controller", "sparse", "psstore", "serve", "eval",
};
#define NSECTIONS (sizeof(sections) / sizeof(sections[0]))

typedef struct conf_val {
    char *str; /* NULL: the schema default */
    int64_t i;
    double d;
} conf_val_t;

typedef struct kafka_prop {
    char *key;
    char *value;
} kafka_prop_t;

struct fr_config {
    conf_val_t vals[NKEYS];
    kafka_prop_t *kafka;
    size_t nkafka, capkafka;
};

/* Where an assignment came from, for the error prefix. */
typedef struct conf_where {
    const char *file; /* NULL: a --set, or env when set */
    size_t line;
    const char *env; /* the environment variable, or NULL */
} conf_where_t;

/* ------------------------------------------------------------------------
 * Validators
 * ---------------------------------------------------------------------- */

/* model.name: [A-Za-z0-9._-]{1,64}. */
static int check_model_name(const char *value)
{
    size_t n = strlen(value);
    if (n < 1 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (!fr_name_char((unsigned char)value[i]))
            return 0;
    }
    return 1;
}

/* model.layers: 2 to 16 positive integers, each at most 1 << 20, joined by
 * single '-' characters, digits only. */
static int check_layers(const char *value)
{
    int dims[FR_LAYERS_MAX], ndims;
    return fr_layers_parse(value, dims, &ndims, NULL, 0) == FR_OK;
}

/* ------------------------------------------------------------------------
 * Schema lookup and value parsing
 * ---------------------------------------------------------------------- */

static int section_known(const char *section)
{
    for (size_t i = 0; i < NSECTIONS; i++) {
        if (strcmp(sections[i], section) == 0)
            return 1;
    }
    return 0;
}

/* The schema index of section.key, or -1. */
static int key_index(const char *section, const char *key)
{
    if (section == NULL || key == NULL)
        return -1;
    for (size_t i = 0; i < NKEYS; i++) {
        if (strcmp(schema[i].section, section) == 0 && strcmp(schema[i].key, key) == 0)
            return (int)i;
    }
    return -1;
}

/* Parses "true/false, yes/no, on/off, 1/0" (case-insensitive) into *b;
 * returns 0 on success, -1 otherwise. */
static int parse_bool(const char *value, int *b)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(value, yes[i]) == 0) {
            *b = 1;
            return 0;
        }
        if (strcasecmp(value, no[i]) == 0) {
            *b = 0;
            return 0;
        }
    }
    return -1;
}

/* Whether value is one of the '|'-separated choices (case-sensitive). */
static int enum_has(const char *choices, const char *value)
{
    size_t n = strlen(value);
    const char *p = choices;
    while (*p != '\0') {
        const char *bar = strchr(p, '|');
        size_t len = bar != NULL ? (size_t)(bar - p) : strlen(p);
        if (len == n && n > 0 && strncmp(p, value, n) == 0)
            return 1;
        if (bar == NULL)
            break;
        p = bar + 1;
    }
    return 0;
}

/* Writes what a key accepts ("an integer in 1..1024", "one of a|b") into
 * buf; the same phrase serves error messages and the example file. An
 * unchecked string writes the empty string. */
static void describe_domain(const conf_key_t *k, char *buf, size_t size)
{
    const char *lo_op = (k->flags & CK_MIN_OPEN) ? ">" : ">=";
    switch (k->type) {
    case CT_INT:
        if (k->imax == NO_MAX)
            snprintf(buf, size, "an integer >= %lld", (long long)k->imin);
        else
            snprintf(buf, size, "an integer in %lld..%lld", (long long)k->imin, (long long)k->imax);
        return;
    case CT_DOUBLE:
        if (isinf(k->dmax))
            snprintf(buf, size, "a number %s %g", lo_op, k->dmin);
        else
            snprintf(buf, size, "a number in %c%g, %g%c", (k->flags & CK_MIN_OPEN) ? '(' : '[',
                     k->dmin, k->dmax, (k->flags & CK_MAX_OPEN) ? ')' : ']');
        return;
    case CT_BOOL: snprintf(buf, size, "a boolean (true/false, yes/no, on/off, 1/0)"); return;
    case CT_ENUM: snprintf(buf, size, "one of %s", k->accepts); return;
    case CT_STRING: snprintf(buf, size, "%s", k->accepts != NULL ? k->accepts : ""); return;
    }
    snprintf(buf, size, "%s", "");
}

/* Parses value for key k into v->i / v->d. Returns 0 when it is valid and
 * -1 otherwise; the caller then words the error with describe_domain(). */
static int parse_value(const conf_key_t *k, const char *value, conf_val_t *v)
{
    char *end = NULL;
    int b = 0;
    switch (k->type) {
    case CT_INT: {
        if (value[0] == '\0')
            return -1;
        errno = 0;
        long long x = strtoll(value, &end, 10);
        if (errno != 0 || *end != '\0' || x < k->imin || x > k->imax)
            return -1;
        v->i = x;
        v->d = (double)x;
        return 0;
    }
    case CT_DOUBLE: {
        if (value[0] == '\0')
            return -1;
        errno = 0;
        double x = strtod(value, &end);
        if (errno == ERANGE && fabs(x) > 1.0)
            return -1; /* overflow; an underflow to (near) zero is accepted */
        if (*end != '\0' || !isfinite(x))
            return -1;
        if ((k->flags & CK_MIN_OPEN) ? !(x > k->dmin) : !(x >= k->dmin))
            return -1;
        if ((k->flags & CK_MAX_OPEN) ? !(x < k->dmax) : !(x <= k->dmax))
            return -1;
        v->d = x;
        /* a double key read as an integer: saturated (a cast of 3e38 is
         * undefined behaviour; fuzz_config found it) */
        v->i = x >= 9.2e18 ? INT64_MAX : x <= -9.2e18 ? INT64_MIN : (int64_t)x;
        return 0;
    }
    case CT_BOOL:
        if (parse_bool(value, &b) != 0)
            return -1;
        v->i = b;
        v->d = b;
        return 0;
    case CT_ENUM: return enum_has(k->accepts, value) ? 0 : -1;
    case CT_STRING: return (k->check != NULL && !k->check(value)) ? -1 : 0;
    }
    return -1;
}

/* ------------------------------------------------------------------------
 * Assignment
 * ---------------------------------------------------------------------- */

/* Formats "FILE:LINE: [section] key: why", "--set section.key: why" or
 * "ENV: why" into errstr and returns err. key may be NULL. */
static fr_err_t where_error(const conf_where_t *w, fr_err_t err, char *errstr, size_t size,
                            const char *section, const char *key, const char *why)
{
    if (w->env != NULL)
        return fr_errorf(err, errstr, size, "%s: %s", w->env, why);
    if (w->file == NULL)
        return fr_errorf(err, errstr, size, "--set %s%s%s: %s", section, key ? "." : "",
                         key ? key : "", why);
    return fr_errorf(err, errstr, size, "%s:%zu: [%s]%s%s: %s", w->file, w->line, section,
                     key ? " " : "", key ? key : "", why);
}

/* Sets a [kafka] property, replacing an earlier value in place. */
static fr_err_t kafka_set(fr_config_t *cfg, const char *key, const char *value)
{
    for (size_t i = 0; i < cfg->nkafka; i++) {
        if (strcmp(cfg->kafka[i].key, key) == 0) {
            char *dup = strdup(value);
            if (dup == NULL)
                return FR_ERR_NOMEM;
            free(cfg->kafka[i].value);
            cfg->kafka[i].value = dup;
            return FR_OK;
        }
    }
    if (FR_GROW(cfg->kafka, cfg->capkafka, cfg->nkafka + 1) != FR_OK)
        return FR_ERR_NOMEM;
    char *k = strdup(key);
    char *v = strdup(value);
    if (k == NULL || v == NULL) {
        free(k);
        free(v);
        return FR_ERR_NOMEM;
    }
    cfg->kafka[cfg->nkafka].key = k;
    cfg->kafka[cfg->nkafka].value = v;
    cfg->nkafka++;
    return FR_OK;
}

/* Validates and stores section.key = value. On error nothing changes and
 * errstr is worded for w. */
static fr_err_t config_assign(fr_config_t *cfg, const conf_where_t *w, const char *section,
                              const char *key, const char *value, char *errstr, size_t size)
{
    char why[512];
    if (!section_known(section)) {
        snprintf(why, sizeof(why), "unknown section [%s]", section);
        return where_error(w, FR_ERR_INVAL, errstr, size, section, NULL, why);
    }
    if (key[0] == '\0')
        return where_error(w, FR_ERR_PARSE, errstr, size, section, NULL, "empty key");
    if (strcmp(section, "kafka") == 0) {
        if (kafka_set(cfg, key, value) != FR_OK)
            return where_error(w, FR_ERR_NOMEM, errstr, size, section, key, "out of memory");
        return FR_OK;
    }
    int idx = key_index(section, key);
    if (idx < 0)
        return where_error(w, FR_ERR_INVAL, errstr, size, section, key, "unknown key");

    const conf_key_t *k = &schema[idx];
    conf_val_t v = {NULL, 0, 0.0};
    if (parse_value(k, value, &v) != 0) {
        char domain[160];
        describe_domain(k, domain, sizeof(domain));
        if (k->flags & CK_SECRET) /* never echo a secret into a log line */
            snprintf(why, sizeof(why), "expected %s", domain);
        else
            snprintf(why, sizeof(why), "expected %s, got '%.200s'", domain, value);
        return where_error(w, FR_ERR_INVAL, errstr, size, section, key, why);
    }
    v.str = strdup(value);
    if (v.str == NULL)
        return where_error(w, FR_ERR_NOMEM, errstr, size, section, key, "out of memory");
    free(cfg->vals[idx].str);
    cfg->vals[idx] = v;
    return FR_OK;
}

/* ------------------------------------------------------------------------
 * Public API
 * ---------------------------------------------------------------------- */

/* A config holding every default, parsed through the same validation as
 * user values. NULL if out of memory (or, impossibly, a default that fails
 * its own schema, which is logged). */
fr_config_t *fr_config_new(void)
{
    fr_config_t *cfg = calloc(1, sizeof(*cfg));
    if (cfg == NULL)
        return NULL;
    for (size_t i = 0; i < NKEYS; i++) {
        if (parse_value(&schema[i], schema[i].def, &cfg->vals[i]) != 0) {
            fr_log(FR_LOG_ERROR, "config: the default of [%s] %s is invalid", schema[i].section,
                   schema[i].key);
            free(cfg);
            return NULL;
        }
        cfg->vals[i].str = NULL;
    }
    return cfg;
}

void fr_config_destroy(fr_config_t *cfg)
{
    if (cfg == NULL)
        return;
    for (size_t i = 0; i < NKEYS; i++)
        free(cfg->vals[i].str);
    for (size_t i = 0; i < cfg->nkafka; i++) {
        free(cfg->kafka[i].key);
        free(cfg->kafka[i].value);
    }
    free(cfg->kafka);
    free(cfg);
}

/* Trims ASCII whitespace from both ends of s in place; returns the new
 * start. */
static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n' || *s == '\f' || *s == '\v')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n' ||
                     s[n - 1] == '\f' || s[n - 1] == '\v'))
        s[--n] = '\0';
    return s;
}

/* Strips one pair of surrounding double quotes, if present, in place. */
static char *unquote(char *s)
{
    size_t n = strlen(s);
    if (n >= 2 && s[0] == '"' && s[n - 1] == '"') {
        s[n - 1] = '\0';
        return s + 1;
    }
    return s;
}

/* Parses one "[section]" line into section (size bytes). Returns FR_OK or a
 * parse error worded for file:line. */
static fr_err_t parse_header(char *line, const conf_where_t *w, char *section, size_t secsize,
                             char *errstr, size_t size)
{
    char *close = strchr(line, ']');
    if (close == NULL)
        return fr_errorf(FR_ERR_PARSE, errstr, size,
                         "%s:%zu: %.200s: unterminated section header (missing ']')", w->file,
                         w->line, line);
    char *rest = trim(close + 1);
    if (*rest != '\0' && *rest != '#' && *rest != ';')
        return fr_errorf(FR_ERR_PARSE, errstr, size,
                         "%s:%zu: %.200s: unexpected text after the section header", w->file,
                         w->line, line);
    *close = '\0';
    char *name = trim(line + 1);
    if (*name == '\0')
        return fr_errorf(FR_ERR_PARSE, errstr, size, "%s:%zu: []: empty section name", w->file,
                         w->line);
    if (!section_known(name))
        return fr_errorf(FR_ERR_INVAL, errstr, size, "%s:%zu: [%.200s]: unknown section", w->file,
                         w->line, name);
    snprintf(section, secsize, "%s", name);
    return FR_OK;
}

/* Parses and applies one line (without its newline). section carries the
 * current section between lines ("" before the first header). */
static fr_err_t parse_line(fr_config_t *cfg, char *raw, const conf_where_t *w, char *section,
                           size_t secsize, char *errstr, size_t size)
{
    char *line = trim(raw);
    if (*line == '\0' || *line == '#' || *line == ';')
        return FR_OK;
    if (*line == '[')
        return parse_header(line, w, section, secsize, errstr, size);

    char *eq = strchr(line, '=');
    if (section[0] == '\0') {
        if (eq != NULL)
            *eq = '\0';
        return fr_errorf(FR_ERR_PARSE, errstr, size,
                         "%s:%zu: %.200s: key outside a section (add a [section] header above it)",
                         w->file, w->line, trim(line));
    }
    if (eq == NULL)
        return where_error(w, FR_ERR_PARSE, errstr, size, section, line,
                           "missing '=' (expected key = value)");
    *eq = '\0';
    char *key = trim(line);
    char *value = unquote(trim(eq + 1));
    return config_assign(cfg, w, section, key, value, errstr, size);
}

/* Reads path line by line; stops at the first bad line, leaving earlier
 * lines applied. A missing or unreadable file is FR_ERR_IO. */
/* A deep copy of cfg; NULL if out of memory. */
static fr_config_t *config_clone(const fr_config_t *cfg)
{
    fr_config_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    memcpy(c->vals, cfg->vals, sizeof(c->vals));
    for (size_t i = 0; i < NKEYS; i++)
        c->vals[i].str = NULL;
    int bad = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        if (cfg->vals[i].str != NULL && (c->vals[i].str = strdup(cfg->vals[i].str)) == NULL)
            bad = 1;
    }
    if (cfg->nkafka > 0) {
        c->kafka = calloc(cfg->nkafka, sizeof(*c->kafka));
        bad |= c->kafka == NULL;
        for (size_t i = 0; c->kafka != NULL && i < cfg->nkafka; i++) {
            c->kafka[i].key = strdup(cfg->kafka[i].key);
            c->kafka[i].value = strdup(cfg->kafka[i].value);
            bad |= c->kafka[i].key == NULL || c->kafka[i].value == NULL;
            c->nkafka = c->capkafka = i + 1;
        }
    }
    if (bad) {
        fr_config_destroy(c);
        return NULL;
    }
    return c;
}

static fr_err_t load_file(fr_config_t *cfg, const char *path, char *errstr, size_t size);

/* Loads into a copy and keeps it only when the whole file is good: an error
 * leaves cfg exactly as it was (no partial application). */
fr_err_t fr_config_load_file(fr_config_t *cfg, const char *path, char *errstr, size_t size)
{
    fr_config_t *tmp = config_clone(cfg);
    if (tmp == NULL)
        return fr_errorf(FR_ERR_NOMEM, errstr, size, "%s: out of memory", path);
    fr_err_t err = load_file(tmp, path, errstr, size);
    if (err == FR_OK) {
        fr_config_t old = *cfg;
        *cfg = *tmp;
        *tmp = old; /* the old contents are freed with tmp */
    }
    fr_config_destroy(tmp);
    return err;
}

static fr_err_t load_file(fr_config_t *cfg, const char *path, char *errstr, size_t size)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return fr_errorf(FR_ERR_IO, errstr, size, "%s: %s", path, strerror(errno));

    conf_where_t w = {path, 0, NULL};
    char section[64] = "";
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n;
    fr_err_t err = FR_OK;
    while ((n = getline(&buf, &cap, f)) >= 0) {
        w.line++;
        char *line = buf;
        if (memchr(buf, '\0', (size_t)n) != NULL) {
            err = fr_errorf(FR_ERR_PARSE, errstr, size, "%s:%zu: NUL byte in line", path, w.line);
            goto out;
        }
        if (w.line == 1 && strncmp(line, "\xEF\xBB\xBF", 3) == 0)
            line += 3; /* a UTF-8 byte order mark */
        err = parse_line(cfg, line, &w, section, sizeof(section), errstr, size);
        if (err != FR_OK)
            goto out;
    }
    if (ferror(f))
        err = fr_errorf(FR_ERR_IO, errstr, size, "%s: %s", path, strerror(errno));
out:
    free(buf);
    fclose(f);
    return err;
}

/* "section.key=value": the section ends at the first '.', the key runs to
 * the first '=' (so [kafka] keys keep their dots). */
fr_err_t fr_config_set(fr_config_t *cfg, const char *assignment, char *errstr, size_t size)
{
    if (assignment == NULL)
        return fr_errorf(FR_ERR_INVAL, errstr, size, "--set: expected section.key=value");
    char *copy = strdup(assignment);
    if (copy == NULL)
        return fr_errorf(FR_ERR_NOMEM, errstr, size, "--set: out of memory");

    conf_where_t w = {NULL, 0, NULL};
    fr_err_t err;
    char *eq = strchr(copy, '=');
    if (eq != NULL)
        *eq = '\0';
    char *dot = strchr(copy, '.');
    if (eq == NULL || dot == NULL) {
        err = fr_errorf(FR_ERR_PARSE, errstr, size, "--set %.200s: expected section.key=value",
                        trim(copy));
        goto out;
    }
    *dot = '\0';
    char *section = trim(copy);
    char *key = trim(dot + 1);
    char *value = unquote(trim(eq + 1));
    err = config_assign(cfg, &w, section, key, value, errstr, size);
out:
    free(copy);
    return err;
}

/* Environment overrides for values that should not sit in files. */
fr_err_t fr_config_apply_env(fr_config_t *cfg, char *errstr, size_t size)
{
    static const struct {
        const char *env, *section, *key;
    } vars[] = {
        {"FRESHET_TOKEN", "serve", "token"},
        {"FRESHET_REDIS_URL", "redis", "url"},
    };
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *value = getenv(vars[i].env);
        if (value == NULL)
            continue;
        conf_where_t w = {NULL, 0, vars[i].env};
        fr_err_t err = config_assign(cfg, &w, vars[i].section, vars[i].key, value, errstr, size);
        if (err != FR_OK)
            return err;
    }
    return FR_OK;
}

const char *fr_config_get(const fr_config_t *cfg, const char *section, const char *key)
{
    int idx = key_index(section, key);
    if (cfg == NULL || idx < 0)
        return NULL;
    return cfg->vals[idx].str != NULL ? cfg->vals[idx].str : schema[idx].def;
}

int64_t fr_config_get_int(const fr_config_t *cfg, const char *section, const char *key)
{
    int idx = key_index(section, key);
    if (cfg == NULL || idx < 0 || schema[idx].type != CT_INT)
        return 0;
    return cfg->vals[idx].i;
}

double fr_config_get_double(const fr_config_t *cfg, const char *section, const char *key)
{
    int idx = key_index(section, key);
    if (cfg == NULL || idx < 0 || schema[idx].type != CT_DOUBLE)
        return 0.0;
    return cfg->vals[idx].d;
}

int fr_config_get_bool(const fr_config_t *cfg, const char *section, const char *key)
{
    int idx = key_index(section, key);
    if (cfg == NULL || idx < 0 || schema[idx].type != CT_BOOL)
        return 0;
    return cfg->vals[idx].i != 0;
}

const char *fr_config_default(const char *section, const char *key)
{
    int idx = key_index(section, key);
    return idx >= 0 ? schema[idx].def : NULL;
}

/* The default of [section] key parsed as fr_config_new() parses it, when
 * the key is of type type; all zero otherwise. */
static conf_val_t default_value(const char *section, const char *key, conf_type_t type)
{
    conf_val_t v = {NULL, 0, 0.0};
    int idx = key_index(section, key);
    if (idx < 0 || schema[idx].type != type)
        return v;
    if (parse_value(&schema[idx], schema[idx].def, &v) != 0)
        return (conf_val_t){NULL, 0, 0.0}; /* an invalid default: fr_config_new() says so */
    return v;
}

int64_t fr_config_default_int(const char *section, const char *key)
{
    return default_value(section, key, CT_INT).i;
}

double fr_config_default_double(const char *section, const char *key)
{
    return default_value(section, key, CT_DOUBLE).d;
}

int fr_config_default_bool(const char *section, const char *key)
{
    return default_value(section, key, CT_BOOL).i != 0;
}

size_t fr_config_kafka_count(const fr_config_t *cfg)
{
    return cfg != NULL ? cfg->nkafka : 0;
}

void fr_config_kafka_at(const fr_config_t *cfg, size_t i, const char **key, const char **value)
{
    const char *k = NULL, *v = NULL;
    if (cfg != NULL && i < cfg->nkafka) {
        k = cfg->kafka[i].key;
        v = cfg->kafka[i].value;
    }
    if (key != NULL)
        *key = k;
    if (value != NULL)
        *value = v;
}

/* The [kafka] block of the example: librdkafka's properties are not ours to
 * list, so it shows the common ones commented out. */
static void write_kafka_example(FILE *out)
{
    fputs("# Any librdkafka property passes verbatim, as with kcat -X (see librdkafka's\n"
          "# CONFIGURATION.md). freshet itself sets enable.auto.offset.store=false, and\n"
          "# group.id defaults to freshet.<model name>.\n"
          "# bootstrap.servers = 127.0.0.1:9092\n"
          "# group.id = freshet.default\n"
          "# security.protocol = sasl_ssl\n"
          "# sasl.mechanisms = PLAIN\n"
          "# sasl.username = freshet\n"
          "# sasl.password = secret\n",
          out);
}

/* Writes the documented example: per section, each key's doc as a comment,
 * what it accepts, then "key = default". Secrets are always shown empty. */
void fr_config_write_example(FILE *out)
{
    fputs("# freshet configuration (INI). Every key is shown with its default.\n"
          "#\n"
          "# Lines are \"key = value\" under a [section]; lines starting with '#' or ';'\n"
          "# are comments. A value is taken verbatim after trimming surrounding spaces\n"
          "# (a '#' inside it is part of it); surrounding double quotes are optional.\n"
          "# Override any key with --set section.key=value; the environment variables\n"
          "# FRESHET_TOKEN and FRESHET_REDIS_URL override serve.token and redis.url.\n",
          out);
    for (size_t s = 0; s < NSECTIONS; s++) {
        fprintf(out, "\n[%s]\n", sections[s]);
        if (strcmp(sections[s], "kafka") == 0) {
            write_kafka_example(out);
            continue;
        }
        int first = 1;
        for (size_t i = 0; i < NKEYS; i++) {
            const conf_key_t *k = &schema[i];
            if (strcmp(k->section, sections[s]) != 0)
                continue;
            char domain[160];
            describe_domain(k, domain, sizeof(domain));
            if (!first)
                fputc('\n', out);
            first = 0;
            fprintf(out, "# %s\n", k->doc);
            if (domain[0] != '\0')
                fprintf(out, "# Accepts %s.\n", domain);
            const char *def = (k->flags & CK_SECRET) ? "" : k->def;
            if (def[0] == '\0')
                fprintf(out, "%s =\n", k->key);
            else
                fprintf(out, "%s = %s\n", k->key, def);
        }
    }
}
