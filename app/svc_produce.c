/*
 * svc_produce.c - "freshet produce": loads a data file into a Kafka topic,
 * one record a sample, encoded as csv, libsvm or f32, at a given rate; or
 * sends (or writes to a file) the synthetic click stream of sparse/synth.c
 * as Criteo lines.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "app/app.h"
#include "ingest/ingest.h"
#include "sparse/sparse.h"
#include "sparse/synth.h"

#define CMD "produce"

#define PRODUCE_MAX_PROPS    128
#define PRODUCE_MAX_FEATURES (1 << 20) /* as --features accepts */

static volatile sig_atomic_t stop_flag;

/* Signal handler: only counts the request; the send loop stops on it. */
static void on_signal(int sig)
{
    (void)sig;
    stop_flag++;
}

static void produce_usage(FILE *out)
{
    fprintf(out, "usage: freshet produce --bootstrap B --topic T --data F --format F --encode E\n"
                 "                       [--features D] [options]\n"
                 "       freshet produce --synthetic ctr (--bootstrap B --topic T | --out F)\n"
                 "                       [--encode criteo|binary] [--seed S] [--drift R]\n"
                 "                       [--window N] [options]\n"
                 "\n"
                 "Loads a data file and sends one Kafka record per sample to topic T, encoded\n"
                 "as --encode, then waits for every delivery and prints\n"
                 "\"produced N records to T (F failed)\". Record timestamps are the produce\n"
                 "time. Labels are taken as they are (any finite value), since the model is\n"
                 "not known here; records the file holds that cannot be read are skipped\n"
                 "with a warning.\n"
                 "\n"
                 "  --bootstrap B        bootstrap.servers (or bootstrap.servers in [kafka]/-X)\n"
                 "  --topic T            the topic\n"
                 "  --data F             the data file (.gz is decompressed)\n"
                 "  --labels F           its labels file (idx format only)\n"
                 "  --format F           csv | libsvm | f32 | idx: how the file is written;\n"
                 "                       or criteo | binary, a sparse model's records (lines,\n"
                 "                       or records each after their length, 4 bytes LE)\n"
                 "  --encode E           csv | libsvm | f32: how records are written; criteo\n"
                 "                       or binary for criteo files, binary for binary ones\n"
                 "  --features D         features a sample; required for csv, libsvm and f32.\n"
                 "                       idx takes it from the images file's header (rows x\n"
                 "                       cols: 784 for MNIST); given, it must agree\n"
                 "  --rate N             samples per second (default: as fast as possible)\n"
                 "  --loop               send the file again and again, until --limit or\n"
                 "                       SIGINT\n"
                 "  --limit N            stop after N records\n"
                 "  --partitions-by P    key: partition -1 and the sample's index in the file\n"
                 "                       (decimal) as the key, the default; roundrobin:\n"
                 "                       partition i mod the topic's partition count;\n"
                 "                       sticky: no key, librdkafka's sticky partitioner\n"
                 "                       (a run of records to one partition for\n"
                 "                       sticky.partitioning.linger.ms, as Kafka's\n"
                 "                       producers do with keyless records)\n"
                 "  -X key=value         a librdkafka property, as kcat's -X (repeatable;\n"
                 "                       overrides [kafka] of --config)\n"
                 "  --config F           a freshet INI file; its [kafka] properties are used\n"
                 "  -h, --help           this text\n"
                 "\n"
                 "The synthetic click stream (--synthetic ctr) replaces --data and --format:\n"
                 "Criteo-layout records (label, 13 integers, 26 categorical hex strings)\n"
                 "from a planted factorization machine, about 3%% clicks, sent until --limit\n"
                 "or SIGINT, or written to --out (which needs --limit). It logs the\n"
                 "Bayes-optimal logloss of each window, the floor no learner can beat, and\n"
                 "prints the whole stream's at the end.\n"
                 "  --encode E           criteo: tab-separated lines (the default); binary:\n"
                 "                       freshet's binary sparse record, the values as 64-bit\n"
                 "                       ids (in --out, each after its length, 4 bytes LE)\n"
                 "  --seed S             the stream's seed (default 1): same seed, same records\n"
                 "  --drift R            radians the planted weights turn per window, and the\n"
                 "                       chance per field and window that other values become\n"
                 "                       the frequent ones (0..1, default 0: no drift)\n"
                 "  --window N           records per window (default 100000)\n"
                 "  --out F              write the records to file F instead of Kafka\n"
                 "\n"
                 "SIGINT or SIGTERM stops sending; what was queued is still delivered (a\n"
                 "second signal stops waiting).\n"
                 "\n"
                 "Exit status: 0 every record delivered, 1 some failed (or stopped before\n"
                 "they were answered), 2 bad arguments or unreadable files.\n");
}

typedef struct produce_opts {
    const char *bootstrap, *topic, *data, *labels, *format, *encode, *config, *by;
    const char *synthetic, *out;
    long long features, limit, seed, window;
    double rate, drift;
    int loop, seed_given, window_given;
    char *xprops[PRODUCE_MAX_PROPS]; /* "key=value" of -X, borrowed from argv */
    int nx;
} produce_opts_t;

/* Nonzero when --format names a sparse file layout (criteo or binary),
 * into *layout. */
static int sparse_file_layout(const char *format, sparse_layout_t *layout)
{
    return format != NULL && sparse_layout_parse(format, layout) == FR_OK &&
           *layout != SPARSE_LAYOUT_LIBSVM; /* produce's libsvm is the dense layout */
}

/* Parses the options into o; returns 0, -1 after --help, or an exit status. */
static int parse_opts(produce_opts_t *o, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"bootstrap", required_argument, NULL, 'b'},
        {"topic", required_argument, NULL, 't'},
        {"data", required_argument, NULL, 'd'},
        {"labels", required_argument, NULL, 'y'},
        {"format", required_argument, NULL, 'f'},
        {"encode", required_argument, NULL, 'e'},
        {"features", required_argument, NULL, 'D'},
        {"rate", required_argument, NULL, 'r'},
        {"loop", no_argument, NULL, 'l'},
        {"limit", required_argument, NULL, 'n'},
        {"partitions-by", required_argument, NULL, 'p'},
        {"config", required_argument, NULL, 'c'},
        {"synthetic", required_argument, NULL, 'S'},
        {"seed", required_argument, NULL, 's'},
        {"drift", required_argument, NULL, 'R'},
        {"window", required_argument, NULL, 'W'},
        {"out", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (produce_opts_t){.by = "key", .seed = 1, .window = 100000};
    int c, rc = 0;
    app_opts_begin();
    while (rc == 0 &&
           (c = app_opts_next(CMD, argc, argv, ":hX:", longopts, NULL, produce_usage, &rc)) != -1) {
        switch (c) {
        case 'b': o->bootstrap = optarg; break;
        case 't': o->topic = optarg; break;
        case 'd': o->data = optarg; break;
        case 'y': o->labels = optarg; break;
        case 'f': o->format = optarg; break;
        case 'e': o->encode = optarg; break;
        case 'D':
            rc = app_parse_long(CMD, "--features", optarg, 1, PRODUCE_MAX_FEATURES, &o->features);
            break;
        case 'r': rc = app_parse_double(CMD, "--rate", optarg, 1e-3, 1e9, &o->rate); break;
        case 'l': o->loop = 1; break;
        case 'n': rc = app_parse_long(CMD, "--limit", optarg, 1, INT64_MAX, &o->limit); break;
        case 'p': o->by = optarg; break;
        case 'c': o->config = optarg; break;
        case 'S': o->synthetic = optarg; break;
        case 's':
            rc = app_parse_long(CMD, "--seed", optarg, 0, INT64_MAX, &o->seed);
            o->seed_given = 1;
            break;
        case 'R': rc = app_parse_double(CMD, "--drift", optarg, 0, 1, &o->drift); break;
        case 'W':
            rc = app_parse_long(CMD, "--window", optarg, 1, INT64_MAX, &o->window);
            o->window_given = 1;
            break;
        case 'o': o->out = optarg; break;
        case 'X':
            if (strchr(optarg, '=') == NULL || optarg[0] == '=')
                rc = app_usage_error(CMD, "-X expects key=value, got '%s'", optarg);
            else if (o->nx == PRODUCE_MAX_PROPS)
                rc = app_usage_error(CMD, "at most %d -X options", PRODUCE_MAX_PROPS);
            else
                o->xprops[o->nx++] = optarg;
            break;
        }
    }
    if ((rc = app_opts_end(CMD, argc, argv, rc)) != 0)
        return rc;
    if (strcmp(o->by, "key") != 0 && strcmp(o->by, "roundrobin") != 0 &&
        strcmp(o->by, "sticky") != 0)
        return app_usage_error(CMD, "--partitions-by must be key, roundrobin or sticky, got '%s'",
                               o->by);
    if (o->synthetic == NULL && (o->seed_given || o->drift > 0 || o->window_given))
        return app_usage_error(CMD, "--seed, --drift and --window go with --synthetic");
    if (o->synthetic != NULL) {
        if (strcmp(o->synthetic, "ctr") != 0)
            return app_usage_error(CMD, "--synthetic must be ctr, got '%s'", o->synthetic);
        if (o->data != NULL || o->format != NULL || o->loop || o->labels != NULL ||
            o->features != 0)
            return app_usage_error(CMD, "--synthetic replaces --data, --format, --labels, "
                                        "--features and --loop");
        if (o->encode != NULL && strcmp(o->encode, "criteo") != 0 &&
            strcmp(o->encode, "binary") != 0)
            return app_usage_error(CMD, "--synthetic encodes criteo or binary, got '%s'",
                                   o->encode);
        if (o->out != NULL && (o->bootstrap != NULL || o->nx > 0 || o->config != NULL ||
                               o->rate > 0 || strcmp(o->by, "key") != 0))
            return app_usage_error(CMD, "--out writes a file: --bootstrap, -X, --config, --rate "
                                        "and --partitions-by go with --topic");
        if ((o->topic == NULL) == (o->out == NULL))
            return app_usage_error(CMD, "--synthetic needs --topic T or --out F (one of them)");
        if (o->out != NULL && o->limit == 0)
            return app_usage_error(CMD, "--out needs --limit N (the stream has no end)");
        return 0;
    }
    if (o->out != NULL)
        return app_usage_error(CMD, "--out goes with --synthetic");
    if (o->topic == NULL || o->data == NULL || o->format == NULL || o->encode == NULL)
        return app_usage_error(CMD, "--topic, --data, --format and --encode are required");
    sparse_layout_t from, to;
    if (sparse_file_layout(o->format, &from)) {
        if (o->features != 0 || o->labels != NULL)
            return app_usage_error(CMD, "--features and --labels do not go with --format %s",
                                   o->format);
        if (!sparse_file_layout(o->encode, &to))
            return app_usage_error(CMD, "--format %s encodes criteo or binary, got '%s'", o->format,
                                   o->encode);
        if (from == SPARSE_LAYOUT_BINARY && to == SPARSE_LAYOUT_CRITEO)
            return app_usage_error(CMD, "binary records hold the values' ids, not their text: "
                                        "they cannot be encoded as criteo");
    }
    return 0;
}

/*
 * Settles --features: csv, libsvm and f32 need it; idx reads it from the
 * images file's header (rows x cols), and a --features given with idx
 * must agree with it. Returns 0 or an exit status.
 */
static int resolve_features(produce_opts_t *o, ingest_format_t format)
{
    if (format != INGEST_FORMAT_IDX) {
        if (o->features == 0)
            return app_usage_error(CMD,
                                   "--features D is required for --format %s (idx takes it "
                                   "from the images file)",
                                   o->format);
        return 0;
    }
    if (o->labels == NULL)
        return app_usage_error(CMD, "--format idx needs --labels FILE for %s", o->data);
    char errstr[512];
    int d;
    if (ingest_idx_features(o->data, &d, errstr, sizeof(errstr)) != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
        return APP_EXIT_USAGE;
    }
    if (d > PRODUCE_MAX_FEATURES)
        return app_usage_error(CMD, "%s: images of %d features, more than the %d a sample may have",
                               o->data, d, PRODUCE_MAX_FEATURES);
    if (o->features != 0 && o->features != d)
        return app_usage_error(CMD,
                               "--features %lld disagrees with %s, whose images are %d features "
                               "(leave --features out to take it from the file)",
                               o->features, o->data, d);
    o->features = d;
    return 0;
}

/*
 * Collects the librdkafka properties: [kafka] of --config in file order,
 * then -X in command line order (a later one overrides an earlier one in
 * librdkafka's conf). The -X values are split in place at '='. Returns 0
 * or an exit status; *has_bootstrap tells whether bootstrap.servers is
 * among them.
 */
static int collect_props(produce_opts_t *o, fr_config_t *cfg, const char *(*props)[2],
                         size_t *nprops, int *has_bootstrap)
{
    char errstr[512];
    size_t n = 0;
    if (o->config != NULL) {
        if (fr_config_load_file(cfg, o->config, errstr, sizeof(errstr)) != FR_OK) {
            fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
            return APP_EXIT_USAGE;
        }
        size_t count = fr_config_kafka_count(cfg);
        if (count > PRODUCE_MAX_PROPS)
            return app_usage_error(CMD, "%s: more than %d [kafka] properties", o->config,
                                   PRODUCE_MAX_PROPS);
        for (size_t i = 0; i < count; i++, n++)
            fr_config_kafka_at(cfg, i, &props[n][0], &props[n][1]);
    }
    for (int i = 0; i < o->nx; i++, n++) {
        char *eq = strchr(o->xprops[i], '=');
        *eq = '\0';
        props[n][0] = o->xprops[i];
        props[n][1] = eq + 1;
    }
    *has_bootstrap = 0;
    for (size_t i = 0; i < n; i++)
        *has_bootstrap |= strcmp(props[i][0], "bootstrap.servers") == 0;
    *nprops = n;
    return 0;
}

/* Sleeps until the monotonic time deadline_ns, or until a signal stops us. */
static void sleep_until(uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = fr_clock_mono_ns();
        if (now >= deadline_ns || stop_flag)
            return;
        uint64_t left = deadline_ns - now;
        struct timespec ts = {(time_t)(left / 1000000000u), (long)(left % 1000000000u)};
        nanosleep(&ts, NULL);
    }
}

typedef struct produce_run {
    const produce_opts_t *o;
    const ingest_dataset_t *ds;
    ingest_format_t encode;
    ingest_producer_t *p;
    int partitions; /* roundrobin: the topic's partition count; else 0 */
    int keyless;    /* sticky: no key, librdkafka picks the partition   */
    uint64_t sent;
} produce_run_t;

/*
 * Queues record rec[len] to the topic under key `index` (decimal), to
 * partition sent mod the partition count with roundrobin, and counts it;
 * sticky sends it without a key to partition -1 (librdkafka's choice);
 * planted (may be NULL) goes in its freshet-p header. Returns 0 or an exit
 * status (the producer's error printed).
 */
static int send_one(produce_run_t *r, const void *rec, size_t len, uint64_t index,
                    const char *planted)
{
    char key[32];
    int klen = snprintf(key, sizeof(key), "%llu", (unsigned long long)index);
    int32_t part = r->partitions > 0 ? (int32_t)(r->sent % (uint64_t)r->partitions) : -1;
    if (ingest_producer_send(r->p, r->o->topic, part, r->keyless ? NULL : key,
                             r->keyless ? 0 : (size_t)klen, rec, len,
                             planted != NULL ? INGEST_AUX_HEADER : NULL, planted) != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", CMD, ingest_producer_error(r->p));
        return APP_EXIT_FAILURE;
    }
    r->sent++;
    return 0;
}

/* Logs the records queued so far, every 5 s. */
static void log_progress(produce_run_t *r, uint64_t *last_log)
{
    uint64_t now = fr_clock_mono_ns();
    if (now - *last_log >= 5000000000ull) {
        fr_log(FR_LOG_INFO, "produce: %llu records queued to %s", (unsigned long long)r->sent,
               r->o->topic);
        *last_log = now;
    }
}

/*
 * The send loop: every sample in file order (again and again with --loop)
 * until --limit, a signal, or the end of the file; paced to --rate by
 * sleeping until each record's due time. Returns 0 or an exit status.
 */
static int send_all(produce_run_t *r)
{
    const produce_opts_t *o = r->o;
    const ingest_dataset_t *ds = r->ds;
    size_t d = (size_t)ds->features;
    size_t cap = r->encode == INGEST_FORMAT_F32 ? 4 * (d + 1) : 40 * (d + 1);
    char *buf = malloc(cap);
    if (buf == NULL) {
        fprintf(stderr, "freshet %s: out of memory\n", CMD);
        return APP_EXIT_FAILURE;
    }
    uint64_t t0 = fr_clock_mono_ns(), last_log = t0;
    int rc = 0;
    for (size_t i = 0; !stop_flag; i++) {
        if (i == ds->n) {
            if (!o->loop)
                break;
            i = 0;
        }
        if (o->limit > 0 && r->sent >= (uint64_t)o->limit)
            break;
        if (o->rate > 0)
            sleep_until(t0 + (uint64_t)((double)r->sent * 1e9 / o->rate));
        size_t len = ingest_encode(r->encode, ds->x + i * d, ds->features, ds->y[i], buf, cap);
        if (len == 0) {
            fprintf(stderr, "freshet %s: a record does not fit its buffer\n", CMD);
            rc = APP_EXIT_FAILURE;
            break;
        }
        if ((rc = send_one(r, buf, len, i, NULL)) != 0)
            break;
        log_progress(r, &last_log);
    }
    free(buf);
    return rc;
}

/*
 * Waits for every queued record to be answered (a second signal stops the
 * wait), prints the summary, and returns the exit status.
 */
static int finish(produce_run_t *r, int rc)
{
    uint64_t delivered = 0, failed = 0;
    int first_signal = stop_flag;
    fr_err_t err;
    do {
        err = ingest_producer_flush(r->p, 200, &delivered, &failed);
    } while (err == FR_ERR_TIMEOUT && stop_flag <= first_signal);
    uint64_t unanswered = r->sent - delivered - failed;
    printf("produced %llu records to %s (%llu failed)\n", (unsigned long long)delivered,
           r->o->topic, (unsigned long long)(failed + unanswered));
    fflush(stdout);
    if (failed + unanswered > 0) {
        fprintf(stderr, "freshet %s: %llu records not delivered%s%s\n", CMD,
                (unsigned long long)(failed + unanswered), failed > 0 ? ": " : "",
                failed > 0 ? ingest_producer_error(r->p) : "");
        if (rc == 0)
            rc = APP_EXIT_FAILURE;
    }
    return rc;
}

/* Asks the cluster for the topic's partition count. Returns 0 or an exit
 * status. */
static int find_partitions(produce_run_t *r)
{
    int n = ingest_producer_partitions(r->p, r->o->topic, 10000);
    if (n <= 0) {
        fprintf(stderr, "freshet %s: --partitions-by roundrobin: %s\n", CMD,
                ingest_producer_error(r->p));
        return APP_EXIT_FAILURE;
    }
    r->partitions = n;
    return 0;
}

/*
 * sticky: asks for the topic's metadata before the first record, so that
 * librdkafka knows every partition's leader and its sticky partitioner
 * keeps one partition from the start (while a partition's leader is
 * unknown it picks again for every record). Best effort: without an
 * answer the records still go, and librdkafka waits for the topic as it
 * does for keyed ones.
 */
static void learn_leaders(produce_run_t *r)
{
    if (ingest_producer_partitions(r->p, r->o->topic, 10000) <= 0)
        fr_log(FR_LOG_WARN, "produce: --partitions-by sticky: %s; sending anyway",
               ingest_producer_error(r->p));
}

/* Logs the floor of each window as it closes. */
static void synth_window_log(const sparse_synth_t *g, int64_t *logged)
{
    sparse_synth_floor_t f;
    sparse_synth_floor(g, &f);
    if (f.window == *logged)
        return;
    *logged = f.window;
    fr_log(FR_LOG_INFO, "synthetic ctr: window %lld: Bayes-optimal logloss %.5f",
           (long long)f.window - 1, f.last);
}

/*
 * The synthetic click stream: one Criteo line per record to the topic
 * (keyed by its index) or to file out, until --limit or a signal, paced
 * to --rate. Prints the floor of the records sent. Returns 0 or an exit
 * status.
 */
static int send_synthetic(produce_run_t *r, FILE *out)
{
    const produce_opts_t *o = r->o;
    char errstr[256], line[512];
    sparse_synth_t *g =
        sparse_synth_new((uint64_t)o->seed, o->drift, (size_t)o->window, errstr, sizeof(errstr));
    if (g == NULL)
        return app_usage_error(CMD, "%s", errstr);
    uint64_t t0 = fr_clock_mono_ns();
    int64_t logged = 0;
    int rc = 0, binary = o->encode != NULL && strcmp(o->encode, "binary") == 0;
    uint8_t bin[4 + SPARSE_BINARY_MAX];
    while (!stop_flag && (o->limit == 0 || r->sent < (uint64_t)o->limit)) {
        if (o->rate > 0)
            sleep_until(t0 + (uint64_t)((double)r->sent * 1e9 / o->rate));
        double planted;
        size_t len = sparse_synth_next(g, line, sizeof(line) - 1, &planted);
        synth_window_log(g, &logged);
        const void *rec = line;
        if (binary) { /* in a file, each record after its length (4 bytes LE) */
            sparse_ids_t ids;
            if (sparse_criteo_ids(line, len, &ids, NULL) != FR_OK ||
                (len = sparse_encode_binary(&ids, bin + 4, sizeof(bin) - 4)) == 0) {
                fprintf(stderr, "freshet %s: a synthetic record did not encode\n", CMD);
                rc = APP_EXIT_FAILURE;
                break;
            }
            for (int i = 0; i < 4; i++)
                bin[i] = (uint8_t)(len >> (8 * i));
            rec = out != NULL ? bin : bin + 4;
            len += out != NULL ? 4 : 0;
        } else if (out != NULL) {
            line[len++] = '\n';
        }
        if (out != NULL) {
            if (fwrite(rec, 1, len, out) != len) {
                fprintf(stderr, "freshet %s: %s: %s\n", CMD, o->out, strerror(errno));
                rc = APP_EXIT_FAILURE;
                break;
            }
            r->sent++;
        } else {
            /* the record's planted click probability rides in a header: the
             * floor a run's progressive windows are drawn against */
            char p[32];
            snprintf(p, sizeof(p), "%.9g", planted);
            if ((rc = send_one(r, rec, len, r->sent, p)) != 0)
                break;
        }
    }
    sparse_synth_floor_t f;
    sparse_synth_floor(g, &f);
    if (isfinite(f.current)) /* the last window, whole or not */
        fr_log(FR_LOG_INFO, "synthetic ctr: window %lld: Bayes-optimal logloss %.5f",
               (long long)f.window, f.current);
    printf("synthetic ctr: %llu records, click rate %.5f, Bayes-optimal logloss %.5f\n",
           (unsigned long long)r->sent, f.ctr, f.overall);
    sparse_synth_destroy(g);
    return rc;
}

/*
 * A sparse data file (--format criteo or binary): each record is checked
 * by its layout's parser and sent as it is, or a Criteo line re-encoded
 * as a binary record; records that do not parse are skipped and counted.
 * The file is read again and again with --loop. Returns 0 or an exit
 * status.
 */
static int send_sparse_file(produce_run_t *r, sparse_layout_t from, sparse_layout_t to)
{
    const produce_opts_t *o = r->o;
    const sparse_spec_t any = {.fields = SPARSE_FIELDS_MAX, .bits = SPARSE_BITS_MAX};
    char errstr[512];
    uint8_t bin[SPARSE_BINARY_MAX];
    uint64_t t0 = fr_clock_mono_ns(), last_log = t0, skipped = 0, index = 0, pass_sent = 0;
    const char *first_why = NULL;
    uint64_t first_at = 0;
    ingest_file_t *f = NULL;
    int rc = 0;
    while (rc == 0 && !stop_flag && (o->limit == 0 || r->sent < (uint64_t)o->limit)) {
        if (f == NULL) {
            f = ingest_file_open(o->data,
                                 from == SPARSE_LAYOUT_BINARY ? SPARSE_BINARY_MAX : 1 << 16, errstr,
                                 sizeof(errstr));
            if (f == NULL) {
                fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
                return APP_EXIT_USAGE;
            }
            index = pass_sent = 0;
        }
        const void *rec;
        const char *line;
        size_t len;
        fr_err_t err = from == SPARSE_LAYOUT_BINARY
                           ? ingest_file_framed(f, &rec, &len, errstr, sizeof(errstr))
                           : ingest_file_line(f, &line, &len, errstr, sizeof(errstr));
        if (from != SPARSE_LAYOUT_BINARY)
            rec = line;
        if (err == FR_ERR_NOTFOUND && o->loop && pass_sent > 0) {
            ingest_file_close(f); /* again, from the start */
            f = NULL;
            continue;
        }
        if (err == FR_ERR_NOTFOUND)
            break;
        if (err != FR_OK && err != FR_ERR_RANGE) { /* the file itself: cut, corrupt, foreign */
            fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
            rc = APP_EXIT_USAGE;
            break;
        }
        index++;
        const char *why = "too long";
        sparse_ids_t ids;
        sparse_sample_t s;
        if (err == FR_OK)
            err = from == SPARSE_LAYOUT_BINARY ? sparse_parse_binary(&any, rec, len, &s, &why)
                                               : sparse_criteo_ids(rec, len, &ids, &why);
        if (err != FR_OK) { /* a record that does not parse, or a line too long */
            if (skipped++ == 0) {
                first_why = why;
                first_at = index;
            }
            continue;
        }
        if (from == SPARSE_LAYOUT_CRITEO && to == SPARSE_LAYOUT_BINARY) {
            rec = bin;
            len = sparse_encode_binary(&ids, bin, sizeof(bin));
        }
        if (o->rate > 0)
            sleep_until(t0 + (uint64_t)((double)r->sent * 1e9 / o->rate));
        if ((rc = send_one(r, rec, len, index - 1, NULL)) == 0)
            pass_sent++;
        log_progress(r, &last_log);
    }
    ingest_file_close(f);
    if (skipped > 0)
        fprintf(stderr, "freshet %s: %s: %llu record(s) skipped (the first, record %llu: %s)\n",
                CMD, o->data, (unsigned long long)skipped, (unsigned long long)first_at, first_why);
    if (rc == 0 && r->sent == 0 && !stop_flag) {
        fprintf(stderr, "freshet %s: %s: no record of format %s\n", CMD, o->data, o->format);
        rc = APP_EXIT_USAGE;
    }
    return rc;
}

/* SIGINT and SIGTERM stop the sending (installed once the sending starts:
 * until then they end the process as usual). */
static void stop_on_signals(void)
{
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* --synthetic ctr --out F: the stream into a file, no Kafka. */
static int write_synthetic(const produce_opts_t *o)
{
    produce_run_t r = {.o = o};
    FILE *out = fopen(o->out, "w");
    if (out == NULL) {
        fprintf(stderr, "freshet %s: %s: %s\n", CMD, o->out, strerror(errno));
        return APP_EXIT_USAGE;
    }
    stop_on_signals();
    int rc = send_synthetic(&r, out);
    if (fclose(out) != 0 && rc == 0) {
        fprintf(stderr, "freshet %s: %s: %s\n", CMD, o->out, strerror(errno));
        rc = APP_EXIT_FAILURE;
    }
    return rc;
}

int app_cmd_produce(int argc, char **argv)
{
    produce_opts_t o;
    produce_run_t r = {.o = &o};
    ingest_dataset_t ds = {0};
    ingest_format_t format;
    const char *props[PRODUCE_MAX_PROPS * 2][2];
    size_t nprops = 0;
    int has_bootstrap = 0;
    char errstr[512];
    fr_config_t *cfg = NULL;
    int rc = parse_opts(&o, argc, argv);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    if (o.synthetic != NULL && o.out != NULL)
        return write_synthetic(&o);
    sparse_layout_t from = SPARSE_LAYOUT_CRITEO, to = SPARSE_LAYOUT_CRITEO;
    int sparse = o.synthetic == NULL && sparse_file_layout(o.format, &from);
    if (sparse)
        (void)sparse_file_layout(o.encode, &to); /* checked by parse_opts */
    if (o.synthetic == NULL && !sparse) {
        if (ingest_format_parse(o.format, &format) != FR_OK)
            return app_usage_error(
                CMD, "--format must be csv, libsvm, f32, idx, criteo or binary, got '%s'",
                o.format);
        if (ingest_format_parse(o.encode, &r.encode) != FR_OK || r.encode == INGEST_FORMAT_IDX)
            return app_usage_error(CMD, "--encode must be csv, libsvm or f32, got '%s'", o.encode);
        if ((rc = resolve_features(&o, format)) != 0)
            return rc;
    }
    if ((cfg = fr_config_new()) == NULL)
        return APP_EXIT_FAILURE;
    if ((rc = collect_props(&o, cfg, props, &nprops, &has_bootstrap)) != 0)
        goto out;
    if (o.bootstrap == NULL && !has_bootstrap) {
        rc = app_usage_error(CMD, "--bootstrap B is required (or bootstrap.servers in [kafka])");
        goto out;
    }
    if (o.synthetic == NULL && !sparse) {
        ingest_schema_t schema = {.features = (int)o.features, .label = INGEST_LABEL_REAL};
        rc = app_load_dataset(CMD, "--labels", &ds, &schema, format, o.data, o.labels);
        if (rc != 0)
            goto out;
        r.ds = &ds;
    }
    r.p = ingest_producer_new(o.bootstrap, props, nprops, errstr, sizeof(errstr));
    if (r.p == NULL) {
        rc = app_usage_error(CMD, "%s", errstr);
        goto out;
    }
    r.keyless = strcmp(o.by, "sticky") == 0;
    if (strcmp(o.by, "roundrobin") == 0 && (rc = find_partitions(&r)) != 0)
        goto out;
    if (r.keyless)
        learn_leaders(&r);
    stop_on_signals();
    rc = o.synthetic != NULL ? send_synthetic(&r, NULL)
         : sparse            ? send_sparse_file(&r, from, to)
                             : send_all(&r);
    rc = finish(&r, rc);
out:
    ingest_producer_destroy(r.p);
    ingest_dataset_fini(&ds);
    fr_config_destroy(cfg);
    return rc;
}
