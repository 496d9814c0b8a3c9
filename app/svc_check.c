/*
 * svc_check.c - "freshet check": a configuration checked without starting
 * anything (docs/operations.md "Configuration"): what the roles would
 * refuse at start (every key's type and range, the model, the mode and
 * controller, the Redis URL, serve's settings, the record format against
 * the model) is reported here, before a deployment rolls out.
 */
#include <stdio.h>
#include <string.h>

#include "app/app.h"
#include "ingest/ingest.h"
#include "model/model.h"
#include "psstore/psstore.h"
#include "serve/serve.h"
#ifdef FRESHET_HAVE_SPARSE
#include "sparse/sparse.h"
#endif

#define CMD "check"

static void check_usage(FILE *out)
{
    fprintf(out, "usage: freshet check --config F [--set section.key=value ...]\n"
                 "\n"
                 "Checks a configuration as freshet run, train, ps and serve read it, without\n"
                 "connecting to Kafka or Redis: every key's type and range, [model] (layers and\n"
                 "loss, or a sparse table), [trainer] mode and [controller], [redis] url (one\n"
                 "server or a cluster's seeds), [serve], and [ingest] format against the model.\n"
                 "Prints one line that sums the configuration up and exits 0, or names what is\n"
                 "wrong and exits 2.\n"
                 "\n"
                 "  --config F           INI configuration (deploy/freshet.conf.example)\n"
                 "  --set S.K=V          override one key (repeatable)\n"
                 "  -h, --help           this text\n");
}

/* The model's part: its spec, and the record formats it reads. */
static int check_model(const fr_config_t *cfg, char *what, size_t size)
{
    char errstr[512];
    const char *sparse = fr_config_get(cfg, "model", "sparse");
    const char *format = fr_config_get(cfg, "ingest", "format");
    if (sparse[0] != '\0') {
#ifdef FRESHET_HAVE_SPARSE
        sparse_spec_t spec;
        sparse_layout_t layout;
        if (sparse_spec_parse(sparse, &spec, errstr, sizeof(errstr)) != FR_OK)
            return app_usage_error(CMD, "[model] sparse: %s", errstr);
        if (sparse_layout_parse(format, &layout) != FR_OK)
            return app_usage_error(CMD,
                                   "[ingest] format %s: a sparse model reads criteo, libsvm or "
                                   "binary records",
                                   format);
        snprintf(what, size, "sparse %s", sparse);
        return 0;
#else
        return app_usage_error(CMD, "[model] sparse: this build has no sparse models (libxxhash)");
#endif
    }
    model_t m;
    model_loss_t loss;
    ingest_format_t f;
    if (model_loss_parse(fr_config_get(cfg, "model", "loss"), &loss) != FR_OK ||
        model_init(&m, fr_config_get(cfg, "model", "layers"), loss, errstr, sizeof(errstr)) !=
            FR_OK)
        return app_usage_error(CMD, "[model]: %s", errstr);
    if (ingest_format_parse(format, &f) != FR_OK || f == INGEST_FORMAT_IDX)
        return app_usage_error(CMD, "[ingest] format %s: a dense model reads csv, libsvm or f32",
                               format);
    char layers[256];
    model_layers(&m, layers, sizeof(layers));
    snprintf(what, size, "%s %s, %zu parameters", layers, model_loss_name(loss), m.nparams);
    return 0;
}

int app_cmd_check(int argc, char **argv)
{
    char what[512], errstr[512];
    psstore_applier_conf_t ac;
    serve_conf_t sc;
    psstore_url_t url;
    fr_metrics_t *metrics = NULL; /* the roles' settings name one; nothing is counted */
    fr_config_t *cfg = fr_config_new();
    int rc = cfg != NULL ? app_load_config(CMD, cfg, argc, argv, check_usage) : APP_EXIT_FAILURE;
    if (rc == 0 && (metrics = fr_metrics_new()) == NULL)
        rc = APP_EXIT_FAILURE;
    if (rc == 0)
        rc = check_model(cfg, what, sizeof(what));
    if (rc == 0)
        rc = app_applier_conf(CMD, cfg, metrics, &ac);
    if (rc == 0)
        rc = app_serve_conf(CMD, cfg, metrics, &sc);
    if (rc == 0 && psstore_model_name_check(fr_config_get(cfg, "model", "name"), errstr,
                                            sizeof(errstr)) != FR_OK)
        rc = app_usage_error(CMD, "[model] name: %s", errstr);
    if (rc == 0 && psstore_url_parse(fr_config_get(cfg, "redis", "url"), &url, errstr,
                                     sizeof(errstr)) != FR_OK)
        rc = app_usage_error(CMD, "[redis] url: %s", errstr);
    const char *bootstrap = "";
    for (size_t i = 0; i < fr_config_kafka_count(cfg); i++) {
        const char *k, *v;
        fr_config_kafka_at(cfg, i, &k, &v);
        if (strcmp(k, "bootstrap.servers") == 0)
            bootstrap = v;
    }
    if (rc == 0 && bootstrap[0] == '\0')
        rc = app_usage_error(CMD, "[kafka] bootstrap.servers is not set");
    if (rc == 0) {
        const char *listen = fr_config_get(cfg, "serve", "listen");
        printf("freshet check: ok: model %s (%s), %d shard%s, mode %s; redis %s; kafka %s, "
               "topic %s (%s); serve %s\n",
               fr_config_get(cfg, "model", "name"), what,
               (int)fr_config_get_int(cfg, "psstore", "shards"),
               fr_config_get_int(cfg, "psstore", "shards") == 1 ? "" : "s",
               fr_config_get(cfg, "trainer", "mode"),
               url.unix_socket  ? "unix socket"
               : url.nseeds > 1 ? "cluster"
                                : "server",
               bootstrap, fr_config_get(cfg, "ingest", "topic"),
               fr_config_get(cfg, "ingest", "format"), listen[0] ? listen : "off");
        if (url.nseeds > 1)
            printf("freshet check: the cluster's seeds: %d\n", url.nseeds);
    }
    fr_metrics_destroy(metrics);
    fr_config_destroy(cfg);
    return rc < 0 ? 0 : rc;
}
