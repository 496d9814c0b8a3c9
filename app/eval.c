/*
 * eval.c - "freshet eval": score a weights file on a data file and print one
 * JSON object.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "trainer/trainer.h"

#define CMD "eval"

static void eval_usage(FILE *out)
{
    fprintf(out, "usage: freshet eval --weights W.safetensors --data FILE --format F [options]\n"
                 "\n"
                 "Scores weights on a file and prints one JSON object:\n"
                 "  {\"n\": samples, \"loss\": mean loss, \"accuracy\": fraction right}\n"
                 "(no accuracy for mse models). Records that fail to decode are skipped and\n"
                 "counted on stderr.\n"
                 "\n"
                 "  --weights W          safetensors weights (freshet's or PyTorch's layout)\n"
                 "  --data FILE          data to score (.gz is decompressed)\n"
                 "  --labels FILE        labels file (idx format only)\n"
                 "  --format F           csv | libsvm | f32 | idx\n"
                 "  --loss X             loss of a file without freshet.loss metadata\n"
                 "  --backend B          auto | cpu | cuda                   (default auto)\n"
                 "  -h, --help           this text\n"
                 "\n"
                 "Exit status: 0 done, 1 evaluation failed, 2 bad arguments or files.\n");
}

int app_cmd_eval(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"weights", required_argument, NULL, 'w'}, {"data", required_argument, NULL, 'd'},
        {"labels", required_argument, NULL, 'y'},  {"format", required_argument, NULL, 'f'},
        {"loss", required_argument, NULL, 'l'},    {"backend", required_argument, NULL, 'B'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    const char *weights = NULL, *data = NULL, *labels = NULL, *format_name = NULL;
    const char *loss_name = NULL, *backend = "auto";
    int c, rc = 0;
    app_opts_begin();
    while (rc == 0 &&
           (c = app_opts_next(CMD, argc, argv, ":h", longopts, NULL, eval_usage, &rc)) != -1) {
        switch (c) {
        case 'w': weights = optarg; break;
        case 'd': data = optarg; break;
        case 'y': labels = optarg; break;
        case 'f': format_name = optarg; break;
        case 'l': loss_name = optarg; break;
        case 'B': backend = optarg; break;
        }
    }
    if ((rc = app_opts_end(CMD, argc, argv, rc)) != 0)
        return rc < 0 ? 0 : rc; /* 0 after --help */
    if (weights == NULL || data == NULL || format_name == NULL)
        return app_usage_error(CMD, "--weights, --data and --format are required");
    ingest_format_t format;
    if (ingest_format_parse(format_name, &format) != FR_OK)
        return app_usage_error(CMD, "--format must be csv, libsvm, f32 or idx, got '%s'",
                               format_name);
    model_loss_t hint;
    if (loss_name != NULL && model_loss_parse(loss_name, &hint) != FR_OK)
        return app_usage_error(CMD, "--loss must be softmax, logistic or mse, got '%s'", loss_name);

    char errstr[512];
    model_t m;
    float *w = NULL;
    ingest_dataset_t ds = {0};
    trainer_backend_t *b = NULL;
    if (model_load(weights, loss_name ? &hint : NULL, &m, &w, errstr, sizeof(errstr))) {
        fprintf(stderr, "freshet %s: --weights %s\n", CMD, errstr);
        return APP_EXIT_USAGE;
    }
    ingest_schema_t schema;
    trainer_model_schema(&m, &schema);
    if ((rc = app_load_dataset(CMD, "--labels", &ds, &schema, format, data, labels)) != 0)
        goto out;
    b = trainer_backend_new(backend, &m, ds.n < 1024 ? (int)ds.n : 1024, 0, errstr, sizeof(errstr));
    if (b == NULL) {
        fprintf(stderr, "freshet %s: --backend %s: %s\n", CMD, backend, errstr);
        rc = strstr(errstr, "allocate") ? APP_EXIT_FAILURE : APP_EXIT_USAGE;
        goto out;
    }
    double loss = 0.0;
    int64_t right = 0;
    if (trainer_backend_load(b, w) != FR_OK ||
        trainer_backend_evaluate(b, &loss, &right, ds.x, ds.y, ds.n) != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", CMD, trainer_backend_error(b));
        rc = APP_EXIT_FAILURE;
        goto out;
    }
    printf("{\"n\": %zu, \"loss\": %.9g", ds.n, loss / (double)ds.n);
    if (m.loss != MODEL_LOSS_MSE)
        printf(", \"accuracy\": %.9g", (double)right / (double)ds.n);
    printf("}\n");
out:
    trainer_backend_destroy(b);
    ingest_dataset_fini(&ds);
    free(w);
    return rc;
}
