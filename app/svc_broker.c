/*
 * svc_broker.c - "freshet broker": a local Kafka-protocol broker for
 * development and tests (librdkafka's mock cluster), with its brokers taken
 * down and brought back by signals so that tests in other processes can
 * simulate an outage.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "app/app.h"

#define CMD "broker"

#define BROKER_MAX_TOPICS 64

static volatile sig_atomic_t stop_flag, down_flag, up_flag;

/* Signal handler: only sets the flag that the main loop acts on. */
static void on_signal(int sig)
{
    if (sig == SIGUSR1)
        down_flag = 1;
    else if (sig == SIGUSR2)
        up_flag = 1;
    else
        stop_flag = 1;
}

static void broker_usage(FILE *out)
{
    fprintf(
        out,
        "usage: freshet broker [--brokers N] [--topic NAME:PARTITIONS]... [--bootstrap-file F]\n"
        "\n"
        "Runs a local Kafka-protocol broker in this process, built on librdkafka's mock\n"
        "cluster, prints \"bootstrap.servers=HOST:PORT,...\" on stdout and serves until\n"
        "SIGINT or SIGTERM (exit 0). It picks free loopback ports itself.\n"
        "\n"
        "FOR DEVELOPMENT AND TESTS ONLY, NEVER FOR PRODUCTION. Its limits:\n"
        "  - data is kept in memory only and is gone when it exits;\n"
        "  - at most 5 MiB is kept per partition: older records vanish silently.\n"
        "    Preload with many partitions (e.g. 48 for Fashion-MNIST as f32), or\n"
        "    produce no faster than training consumes;\n"
        "  - no offset lookup by timestamp: offsets_for_times answers -1;\n"
        "  - a consumer group rebalance takes session.timeout.ms minus 1 s, and the\n"
        "    first join about 3 s;\n"
        "  - no consumer group description: lag tools cannot list the group.\n"
        "\n"
        "  --brokers N          brokers in the cluster, 1..16            (default 1)\n"
        "  --topic NAME:P       create topic NAME with P partitions (repeatable);\n"
        "                       other topics are created on first use\n"
        "  --bootstrap-file F   also write the bootstrap list (one line) to F,\n"
        "                       atomically (temporary file + rename)\n"
        "  -h, --help           this text\n"
        "\n"
        "Signals: SIGUSR1 takes every broker down (connections close, clients retry),\n"
        "SIGUSR2 brings them back; SIGINT or SIGTERM stops the broker.\n"
        "\n"
        "Exit status: 0 stopped by a signal, 1 the cluster could not start, 2 bad\n"
        "arguments or an unwritable --bootstrap-file.\n");
}

typedef struct broker_opts {
    long long nbrokers;
    const char *bootstrap_file;
    char *topics[BROKER_MAX_TOPICS]; /* "name:partitions", borrowed from argv */
    int ntopics;
} broker_opts_t;

/* Parses the options into o; returns 0, -1 after --help, or an exit status. */
static int parse_opts(broker_opts_t *o, int argc, char **argv)
{
    static const struct option longopts[] = {
        {"brokers", required_argument, NULL, 'n'},
        {"topic", required_argument, NULL, 't'},
        {"bootstrap-file", required_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (broker_opts_t){.nbrokers = 1};
    int c, rc = 0;
    app_opts_begin();
    while (rc == 0 &&
           (c = app_opts_next(CMD, argc, argv, ":h", longopts, NULL, broker_usage, &rc)) != -1) {
        switch (c) {
        case 'n': rc = app_parse_long(CMD, "--brokers", optarg, 1, 16, &o->nbrokers); break;
        case 't':
            if (o->ntopics == BROKER_MAX_TOPICS)
                rc = app_usage_error(CMD, "at most %d --topic options", BROKER_MAX_TOPICS);
            else
                o->topics[o->ntopics++] = optarg;
            break;
        case 'f': o->bootstrap_file = optarg; break;
        }
    }
    return app_opts_end(CMD, argc, argv, rc);
}

/*
 * Creates the topic of one "--topic NAME:PARTITIONS" value. Returns 0 or
 * an exit status after printing why.
 */
static int create_topic(ingest_broker_t *b, const char *spec)
{
    char name[INGEST_TOPIC_MAX + 1], errstr[512];
    const char *colon = strrchr(spec, ':');
    long long partitions;
    if (colon == NULL || colon == spec || (size_t)(colon - spec) > INGEST_TOPIC_MAX)
        return app_usage_error(CMD, "--topic expects NAME:PARTITIONS, got '%s'", spec);
    if (app_parse_long(CMD, "--topic partitions", colon + 1, 1, 100000, &partitions) != 0)
        return APP_EXIT_USAGE;
    memcpy(name, spec, (size_t)(colon - spec));
    name[colon - spec] = '\0';
    if (ingest_broker_topic(b, name, (int)partitions, errstr, sizeof(errstr)) != FR_OK) {
        fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
        return APP_EXIT_USAGE;
    }
    fr_log(FR_LOG_INFO, "broker: topic %s with %lld partitions", name, partitions);
    return 0;
}

/*
 * Writes the bootstrap list and a newline to path atomically: into
 * "path.tmp.PID" first, then renamed over path, so that a reader that sees
 * the file sees all of it. Returns 0 or an exit status after printing why.
 */
static int write_bootstrap_file(const char *path, const char *list)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof(tmp))
        return app_usage_error(CMD, "--bootstrap-file path is too long");
    FILE *f = fopen(tmp, "w");
    int ok = f != NULL && fprintf(f, "%s\n", list) > 0;
    if (f != NULL && fclose(f) != 0)
        ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "freshet %s: --bootstrap-file %s: %s\n", CMD, path, strerror(errno));
        unlink(tmp);
        return APP_EXIT_USAGE;
    }
    return 0;
}

/* Serves until SIGINT or SIGTERM, switching the brokers on SIGUSR1/2 (the
 * handlers are installed by the caller). */
static void serve(ingest_broker_t *b)
{
    while (!stop_flag) {
        if (down_flag) {
            down_flag = 0;
            fr_err_t err = ingest_broker_set_up(b, 0);
            fr_log(err == FR_OK ? FR_LOG_INFO : FR_LOG_WARN, "broker: SIGUSR1: brokers down%s",
                   err == FR_OK ? "" : " (some refused)");
        }
        if (up_flag) {
            up_flag = 0;
            fr_err_t err = ingest_broker_set_up(b, 1);
            fr_log(err == FR_OK ? FR_LOG_INFO : FR_LOG_WARN, "broker: SIGUSR2: brokers up%s",
                   err == FR_OK ? "" : " (some refused)");
        }
        struct timespec ts = {0, 50000000L};
        nanosleep(&ts, NULL); /* a signal cuts it short */
    }
    fr_log(FR_LOG_INFO, "broker: stopping");
}

int app_cmd_broker(int argc, char **argv)
{
    broker_opts_t o;
    char errstr[512];
    int rc = parse_opts(&o, argc, argv);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    /* handlers first: a signal that arrives while starting is not lost (nor
     * fatal, as SIGUSR1's default action would be) */
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    ingest_broker_t *b = ingest_broker_new((int)o.nbrokers, errstr, sizeof(errstr));
    if (b == NULL) {
        fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
        return APP_EXIT_FAILURE;
    }
    for (int i = 0; i < o.ntopics && rc == 0; i++)
        rc = create_topic(b, o.topics[i]);
    const char *list = ingest_broker_bootstraps(b);
    if (rc == 0 && o.bootstrap_file != NULL)
        rc = write_bootstrap_file(o.bootstrap_file, list);
    if (rc == 0) {
        printf("bootstrap.servers=%s\n", list);
        fflush(stdout);
        fr_log(FR_LOG_INFO, "broker: %lld brokers at %s (development only: see --help)", o.nbrokers,
               list);
        serve(b);
    }
    ingest_broker_destroy(b);
    return rc;
}
