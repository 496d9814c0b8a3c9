/*
 * app.h - private declarations of the freshet command: one function per
 * subcommand, and the option helpers they share.
 *
 * Exit statuses: 0 success, 1 a failure while working (backend, I/O after
 * start), 2 bad arguments, bad configuration or unreadable input files.
 */
#ifndef FRESHET_APP_H
#define FRESHET_APP_H

#include <getopt.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>

#include "common/common.h"
#include "ingest/ingest.h"
#include "model/model.h"
#include "trainer/trainer.h"

#define APP_EXIT_FAILURE 1
#define APP_EXIT_USAGE   2

int app_cmd_fit(int argc, char **argv);
int app_cmd_eval(int argc, char **argv);
#ifdef FRESHET_HAVE_SPARSE
int app_cmd_fit_sparse(int argc, char **argv); /* fit_sparse.c */
#endif

/* The service roles' stop: set by SIGINT and SIGTERM once
 * app_stop_on_signals installed the handlers (stop.c); ignore_sigpipe
 * also makes a peer's hang-up an error return instead of a signal. */
extern atomic_int app_stop;
void app_stop_on_signals(int ignore_sigpipe);
/* A bounded stop: after SIGINT or SIGTERM a role names the stage it is in
 * (app_stop_stage) and calls app_stop_watchdog once; if the process has not
 * exited seconds later, the watchdog logs the stage it hung in and exits
 * with APP_EXIT_FAILURE (nothing is lost: an unclean stop is a crash, which
 * the store's transactions and the gap rule cover). */
void app_stop_stage(const char *stage);
void app_stop_watchdog(const char *cmd, int seconds);

#ifdef FRESHET_HAVE_SERVICES
#include "psstore/psstore.h"

int app_cmd_model(int argc, char **argv);   /* svc_model.c */
int app_cmd_ps(int argc, char **argv);      /* svc_ps.c */
int app_cmd_broker(int argc, char **argv);  /* svc_broker.c */
int app_cmd_produce(int argc, char **argv); /* svc_produce.c */

/* [controller] (and [trainer] mode adaptive) as a controller conf
 * (svc_conf.c). */
int app_controller_conf(const char *cmd, const fr_config_t *cfg, psstore_ctl_conf_t *ctl);
/* Creates [model] in the store when absent; refuses one with other layers
 * or loss (svc_store.c). */
int app_ensure_model(const char *cmd, const fr_config_t *cfg);
/* The applier's settings from [redis], [model], [controller], [psstore] and
 * [trainer] workers (svc_conf.c). Returns 0 or an exit status. */
int app_applier_conf(const char *cmd, const fr_config_t *cfg, fr_metrics_t *metrics,
                     psstore_applier_conf_t *conf);
int app_cmd_run(int argc, char **argv); /* svc_run.c */
#define APP_MAX_PROPS 256               /* [kafka] properties, at most */
/* The consumer of [kafka], [ingest] and [psstore] gap_timeout, decoding
 * records by schema and format; props[APP_MAX_PROPS] receives the [kafka]
 * pairs. NULL after printing why (svc_run.c). */
ingest_consumer_t *app_consumer_open(const char *cmd, const fr_config_t *cfg,
                                     const ingest_schema_t *schema, ingest_format_t format,
                                     const char *(*props)[2], fr_metrics_t *metrics);
/* A [model] sparse's roles (svc_run_sparse.c): freshet run is both parts,
 * freshet ps the applier, freshet train the consumer and the workers. */
#define APP_SPARSE_APPLIER 1
#define APP_SPARSE_WORKERS 2
/* Runs parts of a [model] sparse until SIGINT, SIGTERM or samples_limit
 * applied samples (0: never; needs the applier). shards: the shards whose
 * appliers to run ("0-1"; NULL: all). Returns the exit status. */
int app_run_sparse(const char *cmd, const fr_config_t *cfg, fr_metrics_t *metrics,
                   const char *(*props)[2], int64_t samples_limit, int parts, const char *shards);
int app_cmd_train(int argc, char **argv); /* svc_run.c */
/* Executes the requests waiting for model name with an applier that only
 * executes requests, when no applier holds the lease (docs/design.md "One writer and fencing": the
 * CLI takes the lease itself); FR_OK at once while one does (svc_store.c). */
fr_err_t app_execute_requests(const char *cmd, psstore_conn_t *c, const char *url,
                              const char *name);
int app_cmd_replay(int argc, char **argv); /* svc_replay.c */

/* Samples applied to a model, counted from its versions stream (one entry
 * per applied update, each with its samples n): run's --samples stop and
 * compare's progress read it (svc_applied.c). Zero-initialise, then poll:
 * each poll adds the entries newer than the last one seen. */
typedef struct app_applied {
    int64_t version;  /* the newest version counted */
    int64_t samples;  /* samples of the updates counted */
    int64_t versions; /* updates counted (rollbacks excluded) */
} app_applied_t;
fr_err_t app_applied_poll(psstore_conn_t *c, const char *model, app_applied_t *ap);

int app_cmd_compare(int argc, char **argv); /* svc_compare.c */
/* What compare scores final weights with: the model, a backend, the [eval]
 * holdout set and a buffer of m->nparams floats (all borrowed). */
typedef struct app_holdout {
    const model_t *m;
    trainer_backend_t *be;
    const ingest_dataset_t *ds;
    float *w;
} app_holdout_t;
struct cmp_run;
/* Fills run r of compare (app/compare.h) from the store (its versions,
 * evals and drops streams, the last keep entries of each at most, and its
 * final weights scored on h) and from run's --summary file. 0, or -1 with
 * r->error (svc_compare_measure.c). */
int app_compare_measure(psstore_conn_t *c, const app_holdout_t *h, size_t keep, const char *summary,
                        struct cmp_run *r);

#include "serve/serve.h"
int app_cmd_serve(int argc, char **argv); /* svc_serve.c */
int app_cmd_check(int argc, char **argv); /* svc_check.c */
/* [serve], [redis] url and [model] name as a serve conf (strings borrowed
 * from cfg; svc_conf.c). Returns 0 or an exit status. */
int app_serve_conf(const char *cmd, const fr_config_t *cfg, fr_metrics_t *metrics,
                   serve_conf_t *conf);
#endif

/* Where --redis and [redis] url point when nothing else says
 * (common/config.c has the same default for [redis] url). */
#define APP_REDIS_URL_DEFAULT "redis://127.0.0.1:6379/0"
/* $FRESHET_REDIS_URL when set and not empty, else APP_REDIS_URL_DEFAULT. */
const char *app_redis_url_default(void);

/* One getopt_long pass over a command's argv (opts.c), read as
 *
 *     app_opts_begin();
 *     while (rc == 0 && (c = app_opts_next(CMD, argc, argv, ":h", longopts, NULL,
 *                                          usage, &rc)) != -1)
 *         switch (c) { ... the command's own options ... }
 *     if ((rc = app_opts_end(CMD, argc, argv, rc)) != 0)
 *         return rc;
 *
 * app_opts_next returns the next option as getopt_long does, except that it
 * answers those every command answers alike and then returns -1 with *rc
 * set: -h/--help prints usage on stdout (*rc = -1), a missing value or an
 * unknown option prints the usage error (*rc = APP_EXIT_USAGE). shortopts
 * starts with ':' and holds 'h'. app_opts_end returns rc, else the usage
 * error for an operand left after the options, else 0. */
void app_opts_begin(void);
int app_opts_next(const char *cmd, int argc, char **argv, const char *shortopts,
                  const struct option *longopts, int *idx, void (*usage)(FILE *), int *rc);
int app_opts_end(const char *cmd, int argc, char **argv, int rc);

/* Prints "freshet CMD: message" and a hint to --help on stderr; returns
 * APP_EXIT_USAGE. */
int app_usage_error(const char *cmd, const char *fmt, ...) FR_PRINTF(2, 3);

/* Strict number parsing of an option value: the whole string, in range.
 * On error prints the usage error and returns APP_EXIT_USAGE, else 0. */
int app_parse_long(const char *cmd, const char *opt, const char *s, long long min, long long max,
                   long long *out);
int app_parse_double(const char *cmd, const char *opt, const char *s, double min, double max,
                     double *out);

/* JSON text (jsonw.c): s as a JSON string; v as a number, null when it is
 * not finite. */
void app_json_str(FILE *out, const char *s);
void app_json_num(FILE *out, double v);
/* The number after the first "key": in text (for JSON whose keys are
 * unique, as run's summary). 0, or -1 when absent or not a number. */
int app_json_find_num(const char *text, const char *key, double *v);

/* Loads "--config F" and "--set S.K=V" options into cfg, then the
 * environment (load.c). Returns 0, -1 after printing --help, or an exit
 * status. */
int app_load_config(const char *cmd, fr_config_t *cfg, int argc, char **argv,
                    void (*usage)(FILE *));
/* Loads a data file for the model's schema (load.c) and reports what was skipped
 * (one warning line per reject reason); labels_opt names the option that
 * gives labels, for messages. Returns 0, or prints the error and returns
 * APP_EXIT_USAGE (APP_EXIT_FAILURE when out of memory). */
int app_load_dataset(const char *cmd, const char *labels_opt, ingest_dataset_t *ds,
                     const ingest_schema_t *schema, ingest_format_t format, const char *data,
                     const char *labels);

#endif
