/*
 * svc_conf.c - the service roles' settings from the configuration: the
 * applier's (with its controller's) and serve's, each read the same way by
 * every command that runs the role (ps, run, train, serve, check).
 */
#include <stdio.h>
#include <string.h>

#include "app/app.h"
#include "psstore/psstore.h"
#include "serve/serve.h"

/* The controller settings of [controller]. Returns 0 or an exit status. */
int app_controller_conf(const char *cmd, const fr_config_t *cfg, psstore_ctl_conf_t *ctl)
{
    psstore_ctl_conf_init(ctl);
    ctl->lr = fr_config_get_double(cfg, "controller", "lr");
    ctl->warmup = fr_config_get_int(cfg, "controller", "warmup");
    ctl->max_staleness = fr_config_get_int(cfg, "controller", "max_staleness");
    ctl->clip_norm = fr_config_get_double(cfg, "controller", "clip_norm");
    ctl->dc_lambda = fr_config_get_double(cfg, "controller", "dc_lambda");
    ctl->dc_adaptive = fr_config_get_bool(cfg, "controller", "dc_adaptive");
    ctl->dc_ring = (int)fr_config_get_int(cfg, "controller", "dc_ring");
    ctl->momentum = fr_config_get_double(cfg, "controller", "momentum");
    ctl->average = fr_config_get_int(cfg, "controller", "average");
    if (psstore_policy_parse(fr_config_get(cfg, "controller", "policy"), &ctl->policy) != FR_OK ||
        psstore_optim_parse(fr_config_get(cfg, "controller", "optimizer"), &ctl->optim) != FR_OK)
        return app_usage_error(cmd, "bad [controller] policy or optimizer");
    const char *mode = fr_config_get(cfg, "trainer", "mode");
    if (strcmp(mode, "adaptive") == 0 || strcmp(mode, "auto") == 0)
        ctl->policy = PSSTORE_POLICY_ADAPTIVE;
    return 0;
}

int app_applier_conf(const char *cmd, const fr_config_t *cfg, fr_metrics_t *metrics,
                     psstore_applier_conf_t *conf)
{
    psstore_applier_conf_init(conf);
    int rc = app_controller_conf(cmd, cfg, &conf->ctl);
    conf->url = fr_config_get(cfg, "redis", "url");
    conf->model = fr_config_get(cfg, "model", "name");
    conf->lease_ms = fr_config_get_int(cfg, "psstore", "lease_ms");
    /* -1, the default: the model's own (docs/design.md "The store written
     * behind"). A dense commit writes the whole model; a sparse one only the
     * rows its window changed, so it can close twice as often. */
    conf->commit_ms = fr_config_get_int(cfg, "psstore", "commit_ms");
    if (conf->commit_ms < 0)
        conf->commit_ms = fr_config_get(cfg, "model", "sparse")[0] != '\0'
                              ? PSSTORE_COMMIT_MS_SPARSE
                              : PSSTORE_COMMIT_MS_DENSE;
    conf->versions_keep = fr_config_get_int(cfg, "psstore", "versions_keep");
    conf->snapshot_every = fr_config_get_int(cfg, "psstore", "snapshot_every");
    conf->snapshot_seconds = fr_config_get_double(cfg, "psstore", "snapshot_seconds");
    conf->snapshot_retain = fr_config_get_int(cfg, "psstore", "snapshot_retain");
    conf->audit = fr_config_get_bool(cfg, "psstore", "audit");
    conf->wait_replicas = (int)fr_config_get_int(cfg, "redis", "wait_replicas");
    conf->wait_timeout_ms = fr_config_get_int(cfg, "redis", "wait_timeout_ms");
    conf->npushers = (int)fr_config_get_int(cfg, "trainer", "workers");
    if (psstore_mode_parse(fr_config_get(cfg, "trainer", "mode"), &conf->mode) != FR_OK)
        rc = app_usage_error(cmd, "bad [trainer] mode");
    conf->backups = (int)fr_config_get_int(cfg, "trainer", "backups");
    conf->commit_drained =
        fr_config_get_int(cfg, "trainer", "in_flight") > 0 && !psstore_mode_rounds(conf->mode);
    conf->sync_lr_linear = strcmp(fr_config_get(cfg, "trainer", "sync_lr_scale"), "linear") == 0;
    conf->member_timeout_ms =
        (int64_t)(fr_config_get_double(cfg, "trainer", "member_timeout") * 1000);
    conf->round_timeout_ms =
        (int64_t)(fr_config_get_double(cfg, "trainer", "round_timeout") * 1000);
    if (conf->member_timeout_ms < 1 || conf->round_timeout_ms < 1)
        rc = app_usage_error(cmd, "[trainer] member_timeout and round_timeout must be at least "
                                  "a millisecond");
    conf->metrics = metrics;
    return rc;
}

int app_serve_conf(const char *cmd, const fr_config_t *cfg, fr_metrics_t *metrics,
                   serve_conf_t *conf)
{
    serve_conf_init(conf);
    conf->listen = fr_config_get(cfg, "serve", "listen");
    conf->redis_url = fr_config_get(cfg, "redis", "url");
    conf->model = fr_config_get(cfg, "model", "name");
    conf->token = fr_config_get(cfg, "serve", "token");
    conf->protect_reads = fr_config_get_bool(cfg, "serve", "protect_reads");
    conf->refresh_ms = fr_config_get_int(cfg, "serve", "refresh_ms");
    conf->tls_cert = fr_config_get(cfg, "serve", "tls_cert");
    conf->tls_key = fr_config_get(cfg, "serve", "tls_key");
    conf->chartjs = fr_config_get(cfg, "serve", "chartjs");
    conf->max_body = (size_t)fr_config_get_int(cfg, "serve", "max_body");
    conf->header_timeout_s = (int)fr_config_get_int(cfg, "serve", "header_timeout");
    conf->max_connections = (int)fr_config_get_int(cfg, "serve", "max_connections");
    conf->infer = fr_config_get_bool(cfg, "serve", "infer");
    conf->infer_threads = (int)fr_config_get_int(cfg, "serve", "infer_threads");
    conf->infer_queue = (int)fr_config_get_int(cfg, "serve", "infer_queue");
    conf->allowed_hosts = fr_config_get(cfg, "serve", "allowed_hosts");
    conf->metrics = metrics;
    if (conf->protect_reads && conf->token[0] == '\0')
        return app_usage_error(cmd, "[serve] protect_reads needs [serve] token (or "
                                    "FRESHET_TOKEN)");
    return 0;
}
