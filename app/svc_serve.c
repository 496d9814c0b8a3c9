/*
 * svc_serve.c - "freshet serve": the HTTP service alone (a serve replica):
 * weights with ETag and long-poll, snapshots, metadata, the dashboard and
 * its stats, /metrics, health, replay and rollback requests. Stateless:
 * run as many as readers need; each follows the store by itself.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "app/app.h"
#include "serve/serve.h"

#define CMD "serve"

static void serve_usage(FILE *out)
{
    fprintf(
        out,
        "usage: freshet serve --config F [--set section.key=value ...]\n"
        "\n"
        "Publishes the models of [redis] url over HTTP on [serve] listen until SIGINT or\n"
        "SIGTERM. [model] name is the default model (the dashboard's, and the one\n"
        "/readyz checks); every model in the store is served on request. serve never\n"
        "writes the store's state: replay and rollback are stored as requests for the\n"
        "model's applier, and need Authorization: Bearer <[serve] token or FRESHET_TOKEN>.\n"
        "\n"
        "  GET  /v2/models, /v2/models/{m}, /v2/models/{m}/ready\n"
        "  GET  /v2/models/{m}/weights?format=safetensors|raw|json[&after_version=N&wait=S]\n"
        "  GET  /v2/models/{m}/versions/{v}/weights   a retained snapshot\n"
        "  GET  /v2/models/{m}/stats, /dashboard, /metrics\n"
        "  GET  /livez, /readyz, /healthz, /v2/health/live, /v2/health/ready\n"
        "  POST /v2/models/{m}/replay    verb=to-earliest|to-latest|to-offset|to-datetime|\n"
        "                                by-duration|shift-by [arg=..] [topic=T] [execute=true]\n"
        "  POST /v2/models/{m}/rollback  version=N\n"
        "  POST /v2/models/{m}/infer     {\"inputs\": [{\"name\": \"x\", \"shape\": [n, d],\n"
        "                                \"datatype\": \"FP32\", \"data\": [...]}]} (KServe v2)\n"
        "\n"
        "  --config F           INI configuration (deploy/freshet.conf.example)\n"
        "  --set S.K=V          override one key (repeatable)\n"
        "  -h, --help           this text\n"
        "\n"
        "Exit statuses: 0 stopped by a signal, 2 bad configuration or address in use.\n");
}

int app_cmd_serve(int argc, char **argv)
{
    fr_config_t *cfg = fr_config_new();
    fr_metrics_t *metrics = fr_metrics_new();
    if (cfg == NULL || metrics == NULL) {
        fr_config_destroy(cfg);
        fr_metrics_destroy(metrics);
        return APP_EXIT_FAILURE;
    }
    char errstr[512];
    serve_t *s = NULL;
    serve_conf_t conf;
    int rc = app_load_config(CMD, cfg, argc, argv, serve_usage);
    if (rc != 0 || (rc = app_serve_conf(CMD, cfg, metrics, &conf)) != 0)
        goto out;
    if (conf.listen[0] == '\0') {
        rc = app_usage_error(CMD, "[serve] listen is empty");
        goto out;
    }
    s = serve_new(&conf, errstr, sizeof(errstr));
    if (s == NULL) {
        fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
        rc = APP_EXIT_USAGE;
        goto out;
    }
    app_stop_on_signals(1);
    if (serve_start(s, errstr, sizeof(errstr)) != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
        rc = APP_EXIT_FAILURE;
        goto out;
    }
    while (!atomic_load(&app_stop)) {
        struct timespec ts = {0, 50000000L};
        nanosleep(&ts, NULL);
    }
    fr_log(FR_LOG_INFO, "serve: stopping");
out:
    serve_destroy(s);
    fr_metrics_destroy(metrics);
    fr_config_destroy(cfg);
    return rc < 0 ? 0 : rc;
}
