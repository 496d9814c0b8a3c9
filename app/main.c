/*
 * main.c - the freshet command: dispatch to subcommands (option helpers:
 * opts.c; configuration and data files: load.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "trainer/trainer.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"fit", app_cmd_fit, "train offline from a file and write safetensors weights"},
    {"eval", app_cmd_eval, "score weights on a file: {\"n\", \"loss\", \"accuracy\"}"},
#ifdef FRESHET_HAVE_SPARSE
    {"fit-sparse", app_cmd_fit_sparse,
     "train a sparse model (hashed LR, FM) offline, with progressive validation"},
#endif
#ifdef FRESHET_HAVE_SERVICES
    {"model", app_cmd_model, "create, show, list, delete, roll back or export models in Redis"},
    {"run", app_cmd_run, "train from Kafka in one process: consumer, workers and applier"},
    {"train", app_cmd_train, "consume from Kafka and push gradients (scale-out trainer role)"},
    {"ps", app_cmd_ps, "run the applier: the single writer of a model in Redis"},
    {"produce", app_cmd_produce, "load a data file into a Kafka topic, at a given rate"},
    {"broker", app_cmd_broker, "a local Kafka-protocol broker for development and tests"},
    {"replay", app_cmd_replay, "rewind a model's Kafka offsets (dry run unless --execute)"},
    {"compare", app_cmd_compare,
     "run freshet run per mode, workers and seed; report accuracy, speed and cost"},
    {"serve", app_cmd_serve,
     "publish weights, snapshots, stats, metrics and the dashboard over HTTP"},
    {"check", app_cmd_check, "check a configuration without starting anything"},
#endif
};
#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *out)
{
    fprintf(out, "usage: freshet <command> [options]\n\n"
                 "freshet trains models continuously from Kafka. Commands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out,
            "  %-10s print the version and the compute backends of this build\n\n"
            "'freshet <command> --help' describes a command's options.\n",
            "version");
}

int main(int argc, char **argv)
{
    fr_mem_keep();
    if (argc < 2) {
        usage(stderr);
        return APP_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(name, "version") == 0 || strcmp(name, "--version") == 0) {
        printf("freshet %s (backends: %s)\n", FRESHET_VERSION, trainer_backends_built());
        char module[4096];
        if (trainer_cuda_module(module, sizeof(module)))
            printf("cuda module: %s\n", module);
        else if (strstr(trainer_backends_built(), "cuda") != NULL)
            printf("cuda module: not found%s%s\n", module[0] != '\0' ? " at " : "", module);
        return 0;
    }
    for (size_t i = 0; i < NCOMMANDS; i++) {
        if (strcmp(name, commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "freshet: unknown command '%s'\n\n", name);
    usage(stderr);
    return APP_EXIT_USAGE;
}
