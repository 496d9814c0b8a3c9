/*
 * load.c - what the commands load before they work: their configuration
 * (--config, --set, the environment) and a data file for a model's schema.
 * Built in every configuration: fit and eval load data files in a
 * FRESHET_CORE_ONLY build too.
 */
#include <getopt.h>
#include <stdio.h>

#include "app/app.h"

/* Loads --config and --set into cfg; returns 0 or an exit status. */
int app_load_config(const char *cmd, fr_config_t *cfg, int argc, char **argv, void (*usage)(FILE *))
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"set", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    char errstr[512];
    int c, rc = 0;
    app_opts_begin();
    while (rc == 0 &&
           (c = app_opts_next(cmd, argc, argv, ":h", longopts, NULL, usage, &rc)) != -1) {
        switch (c) {
        case 'c':
            if (fr_config_load_file(cfg, optarg, errstr, sizeof(errstr)) != FR_OK) {
                fprintf(stderr, "freshet %s: %s\n", cmd, errstr);
                return APP_EXIT_USAGE;
            }
            break;
        case 's':
            if (fr_config_set(cfg, optarg, errstr, sizeof(errstr)) != FR_OK) {
                fprintf(stderr, "freshet %s: %s\n", cmd, errstr);
                return APP_EXIT_USAGE;
            }
            break;
        }
    }
    if ((rc = app_opts_end(cmd, argc, argv, rc)) != 0)
        return rc;
    if (fr_config_apply_env(cfg, errstr, sizeof(errstr)) != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", cmd, errstr);
        return APP_EXIT_USAGE;
    }
    return 0;
}

int app_load_dataset(const char *cmd, const char *labels_opt, ingest_dataset_t *ds,
                     const ingest_schema_t *schema, ingest_format_t format, const char *data,
                     const char *labels)
{
    char errstr[512];
    if (format == INGEST_FORMAT_IDX && labels == NULL)
        return app_usage_error(cmd, "--format idx needs %s FILE for %s", labels_opt, data);
    fr_err_t err = ingest_dataset_load(ds, schema, format, data, labels, errstr, sizeof(errstr));
    if (err != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", cmd, errstr);
        return err == FR_ERR_NOMEM ? APP_EXIT_FAILURE : APP_EXIT_USAGE;
    }
    for (int r = 1; r < INGEST_REJECT_COUNT; r++) {
        if (ds->rejected[r] > 0)
            fr_log(
                FR_LOG_WARN, "%s: skipped %llu records of %s (%s; first at %s %llu)", cmd,
                (unsigned long long)ds->rejected[r], data, ingest_reject_name((ingest_reject_t)r),
                format == INGEST_FORMAT_CSV || format == INGEST_FORMAT_LIBSVM ? "line" : "record",
                (unsigned long long)ds->first_bad_line[r]);
    }
    if (ds->n == 0) {
        fprintf(stderr, "freshet %s: %s holds no valid record\n", cmd, data);
        return APP_EXIT_USAGE;
    }
    return 0;
}
