/*
 * svc_replay.c - "freshet replay": an operator's rewind of a model's Kafka
 * offsets with the verbs of kafka-consumer-groups --reset-offsets
 * (docs/design.md "Replay").
 *
 * A dry run (the default) prints the plan per partition and changes
 * nothing: the store's watermark and, when Kafka is reachable (--config
 * with bootstrap.servers in [kafka], or --bootstrap), the log bounds and
 * the resolved target; otherwise the symbolic target. --execute stores the
 * request; the applier publishes it under a new replay generation, and the
 * consumer owning each partition resolves it and has the applier rewrite
 * the partition's offsets.
 *
 * Exit statuses: 0 done; 2 bad arguments, an unreachable Redis, no such
 * model; 1 a failure while working (a Redis error, the request not taken up
 * in time).
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "ingest/ingest.h"
#include "psstore/psstore.h"

#define CMD               "replay"
#define REPLAY_TIMEOUT_MS 2000  /* Redis connect and command timeout        */
#define KAFKA_TIMEOUT_MS  10000 /* resolving one partition in a dry run     */
#define REPLAY_WAIT_MS    10000 /* for the applier to publish the request   */
#define REPLAY_MAX_PROPS  256

enum {
    OPT_REDIS = 1,
    OPT_MODEL,
    OPT_TOPIC,
    OPT_CONFIG,
    OPT_BOOTSTRAP,
    OPT_EXECUTE,
    OPT_VERB, /* every verb: long option index tells which */
};

typedef struct replay_opts {
    const char *redis, *model, *topic, *config, *bootstrap;
    const char *verb, *arg;
    int execute;
} replay_opts_t;

static void replay_usage(FILE *out)
{
    fprintf(out,
            "usage: freshet replay --model M VERB [--topic T] [--redis URL] [--config F]\n"
            "                      [--bootstrap B] [--execute]\n"
            "\n"
            "Rewinds the Kafka offsets model M trains from, as kafka-consumer-groups\n"
            "--reset-offsets does. Without --execute it prints the plan per partition and\n"
            "changes nothing. With --execute the request is stored; the model's applier\n"
            "publishes it under a new replay generation (when no applier runs, this command\n"
            "takes the lease for that alone), and the consumer that owns each partition\n"
            "resolves the target against Kafka, clamps it to the log, and has the applier\n"
            "set the watermark there and clear every applied interval above it. Gradients\n"
            "of batches read before the rewrite are dropped (reason \"replay\").\n"
            "\n"
            "VERB, exactly one:\n"
            "  --to-earliest        the log start\n"
            "  --to-latest          the log end (skip everything not yet applied)\n"
            "  --to-offset P:O[,P:O...]  partition P to offset O (others untouched)\n"
            "  --to-datetime T      the first record with timestamp >= T, ISO 8601\n"
            "                       (2026-11-29T20:00:00Z, +HH:MM zones, no zone = UTC)\n"
            "  --by-duration D      now minus D, ISO 8601 duration PnDTnHnMnS (PT1H30M)\n"
            "  --shift-by N         the store's watermark plus N (negative: back)\n"
            "\n"
            "  --model M            the model (default [model] name of --config)\n"
            "  --topic T            only this topic's partitions (default: all of the model's;\n"
            "                       the plan lists [ingest] topic of --config when Kafka is\n"
            "                       reachable)\n"
            "  --redis URL          redis://... (default [redis] url of --config, else\n"
            "                       $FRESHET_REDIS_URL, else " APP_REDIS_URL_DEFAULT ")\n"
            "  --config F           a freshet INI file: [redis], [model], [ingest] topic and\n"
            "                       [kafka] properties (resolved targets in the plan)\n"
            "  --bootstrap B        Kafka bootstrap servers (resolved targets in the plan)\n"
            "  --execute            store the request (default: a dry run)\n"
            "  -h, --help           this text\n");
}

/* Parses the command line into o. Returns 0, -1 after --help, or an exit
 * status after the usage error. */
static int parse_opts(int argc, char **argv, replay_opts_t *o)
{
    static const struct option longopts[] = {
        {"redis", required_argument, NULL, OPT_REDIS},
        {"model", required_argument, NULL, OPT_MODEL},
        {"topic", required_argument, NULL, OPT_TOPIC},
        {"config", required_argument, NULL, OPT_CONFIG},
        {"bootstrap", required_argument, NULL, OPT_BOOTSTRAP},
        {"execute", no_argument, NULL, OPT_EXECUTE},
        {"to-earliest", no_argument, NULL, OPT_VERB},
        {"to-latest", no_argument, NULL, OPT_VERB},
        {"to-offset", required_argument, NULL, OPT_VERB},
        {"to-datetime", required_argument, NULL, OPT_VERB},
        {"by-duration", required_argument, NULL, OPT_VERB},
        {"shift-by", required_argument, NULL, OPT_VERB},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (replay_opts_t){0};
    int c, idx, rc = 0;
    app_opts_begin();
    while (rc == 0 &&
           (c = app_opts_next(CMD, argc, argv, ":h", longopts, &idx, replay_usage, &rc)) != -1) {
        switch (c) {
        case OPT_REDIS: o->redis = optarg; break;
        case OPT_MODEL: o->model = optarg; break;
        case OPT_TOPIC: o->topic = optarg; break;
        case OPT_CONFIG: o->config = optarg; break;
        case OPT_BOOTSTRAP: o->bootstrap = optarg; break;
        case OPT_EXECUTE: o->execute = 1; break;
        case OPT_VERB:
            if (o->verb != NULL)
                return app_usage_error(CMD, "one verb only: --%s and --%s", o->verb,
                                       longopts[idx].name);
            o->verb = longopts[idx].name;
            o->arg = optarg;
            break;
        }
    }
    if ((rc = app_opts_end(CMD, argc, argv, rc)) != 0)
        return rc;
    if (o->verb == NULL)
        return app_usage_error(CMD, "a verb is required: --to-earliest, --to-latest, "
                                    "--to-offset, --to-datetime, --by-duration or --shift-by");
    return 0;
}

/* One partition of the plan. */
typedef struct plan_row {
    char topic[INGEST_TOPIC_MAX + 1];
    int32_t partition;
    int found;              /* the store has offsets for it             */
    int64_t watermark, gen; /* the store's                              */
    size_t spans;           /* applied intervals above the watermark    */
    int resolved;           /* lo, hi, target come from Kafka           */
    int64_t lo, hi, target;
} plan_row_t;

/* Appends a row for topic/partition with the store's offsets. */
static int plan_add(psstore_conn_t *c, const char *model, const char *topic, int32_t partition,
                    plan_row_t **rows, size_t *n, size_t *cap)
{
    if (FR_GROW(*rows, *cap, *n + 1) != FR_OK)
        return -1;
    plan_row_t *row = &(*rows)[*n];
    memset(row, 0, sizeof(*row));
    snprintf(row->topic, sizeof(row->topic), "%s", topic);
    row->partition = partition;
    psstore_partition_offsets_t po;
    psstore_poff_init(&po, 0);
    if (psstore_offsets_read(c, model, topic, partition, &po, &row->found) != FR_OK) {
        psstore_poff_fini(&po);
        return -1;
    }
    row->watermark = row->found ? po.watermark : -1;
    row->gen = po.generation;
    row->spans = po.nspans;
    psstore_poff_fini(&po);
    (*n)++;
    return 0;
}

/* Prints the plan table. */
static void plan_print(const psstore_replay_t *r, const plan_row_t *rows, size_t n)
{
    printf("%-24s %9s %12s %12s %12s  %s\n", "TOPIC", "PARTITION", "WATERMARK", "LOG-START",
           "LOG-END", "TARGET");
    for (size_t i = 0; i < n; i++) {
        const plan_row_t *row = &rows[i];
        char w[32] = "-", lo[32] = "-", hi[32] = "-", target[128];
        if (row->found)
            snprintf(w, sizeof(w), "%" PRId64, row->watermark);
        if (row->resolved) {
            snprintf(lo, sizeof(lo), "%" PRId64, row->lo);
            snprintf(hi, sizeof(hi), "%" PRId64, row->hi);
            snprintf(target, sizeof(target), "%" PRId64, row->target);
        } else if (!psstore_replay_applies(r, row->topic, row->partition, NULL)) {
            snprintf(target, sizeof(target), "unchanged");
        } else {
            psstore_replay_describe(r, row->partition, target, sizeof(target));
        }
        printf("%-24s %9" PRId32 " %12s %12s %12s  %s\n", row->topic, row->partition, w, lo, hi,
               target);
    }
}

/*
 * The rows of the plan: with a resolver, every partition of the topic with
 * its resolved target; else every partition the store keeps offsets for
 * (of --topic when given). Returns 0 or an exit status.
 */
static int plan_rows(psstore_conn_t *c, const replay_opts_t *o, const char *topic,
                     ingest_resolver_t *rs, const psstore_replay_t *r, plan_row_t **rows, size_t *n)
{
    size_t cap = 0;
    *rows = NULL;
    *n = 0;
    if (rs != NULL) {
        int32_t *parts = NULL;
        size_t nparts = 0;
        if (ingest_resolver_partitions(rs, topic, &parts, &nparts) != FR_OK) {
            fprintf(stderr, "freshet %s: %s\n", CMD, ingest_resolver_error(rs));
            return APP_EXIT_USAGE;
        }
        for (size_t i = 0; i < nparts; i++) {
            if (plan_add(c, o->model, topic, parts[i], rows, n, &cap) != 0) {
                free(parts);
                fprintf(stderr, "freshet %s: %s\n", CMD, psstore_conn_error(c));
                return APP_EXIT_FAILURE;
            }
            plan_row_t *row = &(*rows)[*n - 1];
            if (!psstore_replay_applies(r, topic, row->partition, NULL))
                continue;
            if (ingest_resolver_target(rs, r, topic, row->partition,
                                       row->found ? row->watermark : -1, KAFKA_TIMEOUT_MS,
                                       &row->target, &row->lo, &row->hi) != FR_OK) {
                fprintf(stderr, "freshet %s: %s/%" PRId32 ": %s (shown unresolved)\n", CMD, topic,
                        row->partition, ingest_resolver_error(rs));
                continue;
            }
            row->resolved = 1;
        }
        free(parts);
        return 0;
    }
    char **keys = NULL;
    size_t nkeys = 0;
    if (psstore_offsets_keys(c, o->model, &keys, &nkeys) != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", CMD, psstore_conn_error(c));
        return APP_EXIT_FAILURE;
    }
    int rc = 0;
    for (size_t i = 0; i < nkeys; i++) {
        char ktopic[PSSTORE_TOPIC_MAX + 1];
        int32_t partition;
        if (rc == 0 && psstore_key_parse(keys[i], strlen(keys[i]), ktopic, sizeof(ktopic),
                                         &partition) == FR_OK) {
            if ((o->topic == NULL || strcmp(o->topic, ktopic) == 0) &&
                plan_add(c, o->model, ktopic, partition, rows, n, &cap) != 0) {
                fprintf(stderr, "freshet %s: %s\n", CMD, psstore_conn_error(c));
                rc = APP_EXIT_FAILURE;
            }
        }
        free(keys[i]);
    }
    free(keys);
    return rc;
}

/*
 * Stores the request, has it published (by the running applier, or here
 * when none holds the lease) and reports its generation. Returns 0 or an
 * exit status.
 */
static int execute(psstore_conn_t *c, const char *url, const char *model, const char *spec)
{
    char id[64];
    int64_t gen = 0;
    fr_err_t err = psstore_request_replay(c, model, spec, id);
    if (err == FR_OK && app_execute_requests(CMD, c, url, model) != FR_OK)
        return APP_EXIT_FAILURE;
    if (err == FR_OK)
        err = psstore_request_wait(c, model, id, REPLAY_WAIT_MS);
    if (err == FR_OK)
        err = psstore_replay_current(c, model, &gen, NULL, 0, NULL);
    if (err != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", CMD, psstore_conn_error(c));
        return APP_EXIT_FAILURE;
    }
    printf("replay generation %" PRId64 " published for model %s: each partition's consumer "
           "resolves it and rewinds\n",
           gen, model);
    return 0;
}

/* Collects [kafka] of the configuration; returns the count or -1. */
static int kafka_props(const fr_config_t *cfg, const char *(*props)[2], int *has_bootstrap)
{
    size_t n = fr_config_kafka_count(cfg);
    if (n > REPLAY_MAX_PROPS)
        return -1;
    *has_bootstrap = 0;
    for (size_t i = 0; i < n; i++) {
        fr_config_kafka_at(cfg, i, &props[i][0], &props[i][1]);
        *has_bootstrap |= strcmp(props[i][0], "bootstrap.servers") == 0;
    }
    return (int)n;
}

int app_cmd_replay(int argc, char **argv)
{
    replay_opts_t o;
    int rc = parse_opts(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    char errstr[512];
    fr_config_t *cfg = fr_config_new();
    if (cfg == NULL)
        return APP_EXIT_FAILURE;
    if (o.config != NULL && fr_config_load_file(cfg, o.config, errstr, sizeof(errstr)) != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
        fr_config_destroy(cfg);
        return APP_EXIT_USAGE;
    }
    if (o.redis == NULL)
        o.redis = o.config != NULL ? fr_config_get(cfg, "redis", "url") : app_redis_url_default();
    if (o.model == NULL && o.config != NULL)
        o.model = fr_config_get(cfg, "model", "name");
    psstore_replay_t *r = malloc(sizeof(*r));
    char *spec = malloc(PSSTORE_REPLAY_SPEC_MAX);
    psstore_conn_t *c = NULL;
    ingest_resolver_t *rs = NULL;
    plan_row_t *rows = NULL;
    size_t nrows = 0;
    const char *(*props)[2] = calloc(REPLAY_MAX_PROPS, sizeof(*props));
    if (r == NULL || spec == NULL || props == NULL) {
        rc = APP_EXIT_FAILURE;
        goto out;
    }
    if (o.model == NULL) {
        rc = app_usage_error(CMD, "--model M is required (or --config with [model] name)");
        goto out;
    }
    if (psstore_model_name_check(o.model, errstr, sizeof(errstr)) != FR_OK) {
        rc = app_usage_error(CMD, "--model: %s", errstr);
        goto out;
    }
    if (psstore_replay_from_verb(r, o.verb, o.arg, fr_clock_unix_ms(), errstr, sizeof(errstr)) !=
        FR_OK) {
        rc = app_usage_error(CMD, "%s", errstr);
        goto out;
    }
    if (o.topic != NULL) {
        if (strlen(o.topic) > INGEST_TOPIC_MAX || o.topic[0] == '\0') {
            rc = app_usage_error(CMD, "--topic: 1 to %d characters", INGEST_TOPIC_MAX);
            goto out;
        }
        snprintf(r->topic, sizeof(r->topic), "%s", o.topic);
    }
    if (psstore_replay_format(r, spec, PSSTORE_REPLAY_SPEC_MAX) != FR_OK) {
        rc = app_usage_error(CMD, "the request is too long");
        goto out;
    }
    if ((c = psstore_conn_new(o.redis, REPLAY_TIMEOUT_MS, errstr, sizeof(errstr))) == NULL) {
        fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
        rc = APP_EXIT_USAGE;
        goto out;
    }
    psstore_model_info_t info;
    fr_err_t err = psstore_model_info(c, o.model, &info);
    if (err != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", CMD, psstore_conn_error(c));
        rc = err == FR_ERR_NOTFOUND ? APP_EXIT_USAGE : APP_EXIT_FAILURE;
        goto out;
    }
    /* Kafka, when we can reach it, resolves the plan's targets */
    int has_bootstrap = 0, nprops = o.config != NULL ? kafka_props(cfg, props, &has_bootstrap) : 0;
    if (nprops < 0) {
        rc =
            app_usage_error(CMD, "%s: more than %d [kafka] properties", o.config, REPLAY_MAX_PROPS);
        goto out;
    }
    const char *topic = o.topic != NULL    ? o.topic
                        : o.config != NULL ? fr_config_get(cfg, "ingest", "topic")
                                           : NULL;
    if (topic != NULL && (o.bootstrap != NULL || has_bootstrap) &&
        (rs = ingest_resolver_new(o.bootstrap, props, (size_t)nprops, errstr, sizeof(errstr))) ==
            NULL) {
        fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
        rc = APP_EXIT_USAGE;
        goto out;
    }
    if ((rc = plan_rows(c, &o, topic, rs, r, &rows, &nrows)) != 0)
        goto out;
    printf("replay plan for model %s (%s): %s\n", o.model,
           rs != NULL ? "targets resolved against Kafka now"
                      : "symbolic: each partition's consumer resolves it",
           spec);
    plan_print(r, rows, nrows);
    if (!o.execute) {
        printf("dry run: nothing changed (add --execute to rewind)\n");
        goto out;
    }
    rc = execute(c, o.redis, o.model, spec);
out:
    free(rows);
    if (rs != NULL)
        ingest_resolver_destroy(rs);
    psstore_conn_destroy(c);
    free(props);
    free(spec);
    free(r);
    fr_config_destroy(cfg);
    fflush(stdout);
    return rc;
}
