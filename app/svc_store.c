/*
 * svc_store.c - what a command does to the store in place of an applier:
 * creates [model] when the store has none (ps, run), and executes a
 * model's waiting requests when no applier holds its lease (model
 * rollback and delete, replay).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "model/model.h"
#include "psstore/psstore.h"

/*
 * Creates the model from [model] when the store has none; refuses one with
 * other layers or loss. Returns 0 or an exit status.
 */
int app_ensure_model(const char *cmd, const fr_config_t *cfg)
{
    char errstr[512];
    const char *url = fr_config_get(cfg, "redis", "url");
    const char *name = fr_config_get(cfg, "model", "name");
    model_t m;
    model_loss_t loss;
    if (fr_config_get(cfg, "model", "sparse")[0] != '\0')
        return app_usage_error(cmd, "[model] sparse: a sparse model is not a dense "
                                    "model");
    if (model_loss_parse(fr_config_get(cfg, "model", "loss"), &loss) != FR_OK ||
        model_init(&m, fr_config_get(cfg, "model", "layers"), loss, errstr, sizeof(errstr)) !=
            FR_OK)
        return app_usage_error(cmd, "[model]: %s", errstr);
    psstore_conn_t *c = psstore_conn_new(url, 2000, errstr, sizeof(errstr));
    if (c == NULL) {
        fprintf(stderr, "freshet %s: %s\n", cmd, errstr);
        return APP_EXIT_USAGE;
    }
    int rc = 0;
    psstore_model_info_t info;
    fr_err_t err = psstore_model_info(c, name, &info);
    char layers[256];
    model_layers(&m, layers, sizeof(layers));
    if (err == FR_OK) {
        if (strcmp(info.layers, layers) != 0 || strcmp(info.loss, model_loss_name(loss)) != 0)
            rc = app_usage_error(cmd,
                                 "model '%s' in the store is %s %s, the configuration says %s %s",
                                 name, info.layers, info.loss, layers, model_loss_name(loss));
    } else if (err == FR_ERR_NOTFOUND) {
        float *w = NULL;
        const char *init = fr_config_get(cfg, "model", "init");
        if (init[0] != '\0') {
            model_t fm;
            if (model_load(init, &loss, &fm, &w, errstr, sizeof(errstr)) != FR_OK ||
                !model_equal(&fm, &m)) {
                rc = app_usage_error(cmd, "[model] init %s: %s", init,
                                     w ? "holds another model" : errstr);
            }
        } else if ((w = malloc(m.nparams * sizeof(float))) != NULL) {
            model_params_init(&m, w, (uint64_t)fr_config_get_int(cfg, "model", "seed"));
        }
        if (rc == 0 && w != NULL) {
            psstore_model_spec_t spec = {layers, model_loss_name(loss), m.nparams,
                                         (int)fr_config_get_int(cfg, "psstore", "shards"), NULL};
            if (psstore_model_create(c, name, &spec, w, 0) != FR_OK &&
                psstore_model_info(c, name, &info) != FR_OK) {
                fprintf(stderr, "freshet %s: %s\n", cmd, psstore_conn_error(c));
                rc = APP_EXIT_FAILURE;
            } else {
                fr_log(FR_LOG_INFO, "%s: created model '%s' (%s %s, %zu parameters, %d shards)",
                       cmd, name, layers, model_loss_name(loss), m.nparams, spec.shards);
            }
        }
        free(w);
    } else {
        fprintf(stderr, "freshet %s: %s\n", cmd, psstore_conn_error(c));
        rc = APP_EXIT_USAGE;
    }
    psstore_conn_destroy(c);
    return rc;
}

/* Executes the model's waiting requests here when no applier runs: per
 * shard of a sharded model, each shard whose lease is free. */
fr_err_t app_execute_requests(const char *cmd, psstore_conn_t *c, const char *url, const char *name)
{
    int held = 1;
    psstore_model_info_t info;
    fr_err_t err = psstore_model_info(c, name, &info);
    if (err == FR_OK && info.shards == 1)
        err = psstore_lease_held(c, name, &held);
    if (err != FR_OK || (info.shards == 1 && held))
        return err;
    char errstr[512];
    for (int k = 0; k < info.shards && err == FR_OK; k++) {
        psstore_applier_conf_t conf;
        psstore_applier_conf_init(&conf);
        conf.url = url;
        conf.model = name;
        conf.shard = k;
        conf.requests_only = 1;
        psstore_applier_t *a = psstore_applier_new(&conf, errstr, sizeof(errstr));
        if (a == NULL) {
            fprintf(stderr, "freshet %s: %s\n", cmd, errstr);
            return FR_ERR_STATE;
        }
        /* a standby (the shard's applier runs) returns at once: it executes them */
        err = psstore_applier_poll(a, 10);
        if (err != FR_OK)
            fprintf(stderr, "freshet %s: %s\n", cmd, psstore_applier_error(a));
        /* already set: the run commits once and releases the lease */
        atomic_int stop = 1;
        psstore_applier_run(a, &stop); /* releases the lease */
        psstore_applier_destroy(a);
    }
    return err;
}
