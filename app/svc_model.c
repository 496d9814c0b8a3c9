/*
 * svc_model.c - "freshet model create|show|list|delete": a model's lifecycle
 * in the Redis parameter store (docs/design.md "Redis layout").
 *
 * Exit statuses as for every command: 0 done; 2 bad arguments, a bad name
 * or URL, an unreachable Redis, a model that exists (create) or does not
 * (show, delete), a Redis that evicts keys; 1 a failure while working (a
 * Redis error mid-way, an applier holding the model that create --force
 * would replace, a delete request its applier did not execute in time).
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "model/model.h"
#include "psstore/psstore.h"

#define CMD "model"
/* Connect and command timeout: an unreachable Redis never hangs a command. */
#define MODEL_TIMEOUT_MS 2000
/* How long delete waits for a running applier to execute its request. */
#define MODEL_REQUEST_WAIT_MS 10000

/* The options, one bit each, so that every verb says which it takes. */
enum {
    OPT_REDIS = 1 << 0,
    OPT_NAME = 1 << 1,
    OPT_LAYERS = 1 << 2,
    OPT_LOSS = 1 << 3,
    OPT_INIT = 1 << 4,
    OPT_SEED = 1 << 5,
    OPT_FORCE = 1 << 6,
    OPT_YES = 1 << 7,
    OPT_VERSION = 1 << 8,
    OPT_OUT = 1 << 9,
    OPT_SHARDS = 1 << 10,
};

typedef struct model_opts {
    const char *redis, *name, *layers, *loss, *init, *out;
    long long seed, version, shards;
    int seed_given, force, yes;
} model_opts_t;

static const char redis_help[] =
    "  --redis URL          redis://[user:pass@]host[:port][/db] or unix:///path[?db=N]\n"
    "                       (default $FRESHET_REDIS_URL, else " APP_REDIS_URL_DEFAULT ")\n";

static void model_usage(FILE *out)
{
    fprintf(out,
            "usage: freshet model <verb> [options]\n"
            "\n"
            "Manages models in the Redis parameter store. Verbs:\n"
            "  create   create a model at version 0 from --layers/--loss or --init weights\n"
            "  show     print a model's metadata as one JSON object\n"
            "  list     print the names of all models, one per line, sorted\n"
            "  delete   delete every key of a model (needs --yes)\n"
            "  rollback restore a retained snapshot as a new version of a new epoch\n"
            "  export   write the current weights as a safetensors file\n"
            "\n"
            "'freshet model <verb> --help' describes a verb's options. Model names match\n"
            "[A-Za-z0-9._-]{1,64}.\n"
            "\n"
            "Exit status: 0 done, 1 a Redis failure while working, 2 bad arguments, an\n"
            "unreachable Redis, or a model that exists (create) or does not (show, delete).\n");
}

static void create_usage(FILE *out)
{
    fprintf(out,
            "usage: freshet model create --name M (--layers L | --init W) [options]\n"
            "\n"
            "Creates model M at version 0 of a fresh epoch: metadata, weights and empty\n"
            "optimizer state, in one transaction. Refuses a Redis whose maxmemory-policy\n"
            "evicts keys, and an existing model unless --force.\n"
            "\n"
            "%s"
            "  --name M             the model's name\n"
            "  --layers L           layer widths, e.g. 784-256-10 (from --init when omitted)\n"
            "  --loss X             softmax | logistic | mse (default softmax, or --init's)\n"
            "  --init W             initial weights from a safetensors file\n"
            "  --seed S             seed of the He-uniform initial weights (default 42)\n"
            "  --shards S           cut the weights into S shards, each with its own\n"
            "                       applier, on its own Redis Cluster slot (default 1;\n"
            "                       1..64, at row boundaries, balanced by bytes)\n"
            "  --force              replace an existing model of that name (all its keys)\n"
            "  -h, --help           this text\n",
            redis_help);
}

static void show_usage(FILE *out)
{
    fprintf(out,
            "usage: freshet model show --name M [--redis URL]\n"
            "\n"
            "Prints one JSON object: name, layers, loss, epoch (a string: 64 bits),\n"
            "version, shards, bytes, created_ms, stopped (only when the divergence guard\n"
            "stopped the applier) and snapshots (retained versions, oldest first). A\n"
            "sharded model adds bounds (shard k holds floats bounds[k]..bounds[k+1]) and\n"
            "shard_versions; its version and epoch are the sums of its shards'.\n"
            "\n"
            "%s"
            "  --name M             the model's name\n"
            "  -h, --help           this text\n",
            redis_help);
}

static void list_usage(FILE *out)
{
    fprintf(out,
            "usage: freshet model list [--redis URL]\n"
            "\n"
            "Prints the names of all models in the database, one per line, sorted.\n"
            "\n"
            "%s"
            "  -h, --help           this text\n",
            redis_help);
}

static void delete_usage(FILE *out)
{
    fprintf(out,
            "usage: freshet model delete --name M --yes [--redis URL]\n"
            "\n"
            "Deletes every key of model M (weights, offsets, snapshots, streams) in one\n"
            "transaction. While an applier runs (holds the model's lease), the deletion is\n"
            "a request that applier executes; the command waits up to 10 s for it.\n"
            "\n"
            "%s"
            "  --name M             the model's name\n"
            "  --yes                confirm: nothing is deleted without it\n"
            "  -h, --help           this text\n",
            redis_help);
}

/*
 * Parses the options of verb (argv[0] is the verb) into o, accepting only
 * those in allowed. Returns 0, -1 after printing --help, or an exit status
 * after printing the usage error.
 */
static int parse_opts(const char *cmd, unsigned allowed, void (*usage)(FILE *), int argc,
                      char **argv, model_opts_t *o)
{
    static const struct option longopts[] = {
        {"redis", required_argument, NULL, OPT_REDIS},
        {"name", required_argument, NULL, OPT_NAME},
        {"layers", required_argument, NULL, OPT_LAYERS},
        {"loss", required_argument, NULL, OPT_LOSS},
        {"init", required_argument, NULL, OPT_INIT},
        {"seed", required_argument, NULL, OPT_SEED},
        {"force", no_argument, NULL, OPT_FORCE},
        {"yes", no_argument, NULL, OPT_YES},
        {"version", required_argument, NULL, OPT_VERSION},
        {"out", required_argument, NULL, OPT_OUT},
        {"shards", required_argument, NULL, OPT_SHARDS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (model_opts_t){.redis = app_redis_url_default(), .seed = 42, .version = -1, .shards = 1};
    int c, rc = 0;
    app_opts_begin();
    while (rc == 0 &&
           (c = app_opts_next(cmd, argc, argv, ":h", longopts, NULL, usage, &rc)) != -1) {
        if (!(allowed & (unsigned)c))
            return app_usage_error(cmd, "%s does not apply here", argv[optind - 1]);
        switch (c) {
        case OPT_REDIS: o->redis = optarg; break;
        case OPT_NAME: o->name = optarg; break;
        case OPT_LAYERS: o->layers = optarg; break;
        case OPT_LOSS: o->loss = optarg; break;
        case OPT_INIT: o->init = optarg; break;
        case OPT_OUT: o->out = optarg; break;
        case OPT_SEED:
            o->seed_given = 1;
            rc = app_parse_long(cmd, "--seed", optarg, 0, INT64_MAX, &o->seed);
            break;
        case OPT_FORCE: o->force = 1; break;
        case OPT_YES: o->yes = 1; break;
        case OPT_SHARDS:
            rc = app_parse_long(cmd, "--shards", optarg, 1, PSSTORE_SHARDS_MAX, &o->shards);
            break;
        case OPT_VERSION:
            rc = app_parse_long(cmd, "--version", optarg, 0, INT64_MAX, &o->version);
            break;
        }
    }
    if ((rc = app_opts_end(cmd, argc, argv, rc)) != 0)
        return rc;
    if ((allowed & OPT_NAME) && o->name == NULL)
        return app_usage_error(cmd, "--name M is required");
    char errstr[256];
    if (o->name != NULL && psstore_model_name_check(o->name, errstr, sizeof(errstr)) != FR_OK)
        return app_usage_error(cmd, "--name: %s", errstr);
    return 0;
}

/*
 * Connects to Redis within MODEL_TIMEOUT_MS. A bad URL or an unreachable
 * Redis is reported on one line; returns 0 or APP_EXIT_USAGE.
 */
static int connect_redis(const char *cmd, const char *url, psstore_conn_t **c)
{
    char errstr[512];
    *c = psstore_conn_new(url, MODEL_TIMEOUT_MS, errstr, sizeof(errstr));
    if (*c == NULL) {
        fprintf(stderr, "freshet %s: %s\n", cmd, errstr);
        return APP_EXIT_USAGE;
    }
    return 0;
}

/*
 * Reports a failed store call and maps it to an exit status: the user's
 * mistakes (a model that exists or is missing, an evicting Redis) are 2,
 * failures while working 1.
 */
static int store_failed(const char *cmd, psstore_conn_t *c, fr_err_t err, const char *hint)
{
    fprintf(stderr, "freshet %s: %s%s\n", cmd, psstore_conn_error(c), hint ? hint : "");
    switch (err) {
    case FR_ERR_EXISTS:
    case FR_ERR_NOTFOUND:
    case FR_ERR_INVAL:
    case FR_ERR_UNSUPPORTED: return APP_EXIT_USAGE;
    default: return APP_EXIT_FAILURE;
    }
}

/*
 * The model and its initial weights from the options: --init (whose layers
 * and loss must match --layers and --loss where given) or --layers with
 * seeded He-uniform weights. On success *w is malloc'ed [m->nparams], the
 * caller frees. Returns 0 or an exit status after printing why.
 */
static int initial_weights(const char *cmd, const model_opts_t *o, model_t *m, float **w)
{
    char errstr[512];
    model_loss_t loss = MODEL_LOSS_SOFTMAX;
    if (o->loss != NULL && model_loss_parse(o->loss, &loss) != FR_OK)
        return app_usage_error(cmd, "--loss must be softmax, logistic or mse, got '%s'", o->loss);
    if (o->init == NULL) {
        if (o->layers == NULL)
            return app_usage_error(cmd, "--layers L is required (or --init W to take them from)");
        if (model_init(m, o->layers, loss, errstr, sizeof(errstr)) != FR_OK)
            return app_usage_error(cmd, "--layers: %s", errstr);
        *w = malloc(m->nparams * sizeof(float));
        if (*w == NULL) {
            fprintf(stderr, "freshet %s: out of memory\n", cmd);
            return APP_EXIT_FAILURE;
        }
        model_params_init(m, *w, (uint64_t)o->seed);
        return 0;
    }
    if (o->seed_given)
        return app_usage_error(cmd, "--seed draws initial weights; --init gives them already");
    if (model_load(o->init, &loss, m, w, errstr, sizeof(errstr)) != FR_OK) {
        fprintf(stderr, "freshet %s: --init %s\n", cmd, errstr);
        return APP_EXIT_USAGE;
    }
    model_t want;
    int rc = 0;
    if (o->loss != NULL && m->loss != loss) {
        rc = app_usage_error(cmd, "--init %s holds a %s model, not --loss %s", o->init,
                             model_loss_name(m->loss), o->loss);
    } else if (o->layers != NULL) {
        if (model_init(&want, o->layers, m->loss, errstr, sizeof(errstr)) != FR_OK) {
            rc = app_usage_error(cmd, "--layers: %s", errstr);
        } else if (!model_equal(&want, m)) {
            char a[256], b[256];
            model_layers(m, a, sizeof(a));
            model_layers(&want, b, sizeof(b));
            rc = app_usage_error(cmd, "--init %s holds a %s model, not --layers %s", o->init, a, b);
        }
    }
    if (rc != 0) {
        free(*w);
        *w = NULL;
    }
    return rc;
}

/*
 * "model create": the model and its weights from the options, then a Redis
 * that keeps keys (noeviction), then one transaction. Returns the exit
 * status.
 */
static int cmd_create(int argc, char **argv)
{
    static const char cmd[] = CMD " create";
    model_opts_t o;
    int rc = parse_opts(cmd,
                        OPT_REDIS | OPT_NAME | OPT_LAYERS | OPT_LOSS | OPT_INIT | OPT_SEED |
                            OPT_FORCE | OPT_SHARDS,
                        create_usage, argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    model_t m;
    float *w = NULL;
    psstore_conn_t *c = NULL;
    if ((rc = initial_weights(cmd, &o, &m, &w)) != 0 || (rc = connect_redis(cmd, o.redis, &c)))
        goto out;
    fr_err_t err = psstore_conn_check_policy(c);
    if (err != FR_OK) {
        rc = store_failed(cmd, c, err, NULL);
        goto out;
    }
    char layers[256];
    model_layers(&m, layers, sizeof(layers));
    psstore_model_spec_t spec = {layers, model_loss_name(m.loss), m.nparams, (int)o.shards, NULL};
    err = psstore_model_create(c, o.name, &spec, w, o.force);
    if (err != FR_OK) {
        rc = store_failed(cmd, c, err, err == FR_ERR_EXISTS ? " (--force replaces it)" : NULL);
        goto out;
    }
    printf("created model %s: %s %s, %zu parameters, %d shard%s, version 0\n", o.name, layers,
           spec.loss, m.nparams, spec.shards, spec.shards == 1 ? "" : "s");
out:
    psstore_conn_destroy(c);
    free(w);
    return rc;
}

/* One JSON object on one line; "stopped" only when the guard stopped the
 * applier; the epoch as a string, since JSON numbers lose 64-bit values. */
static void print_info(FILE *out, const psstore_model_info_t *info)
{
    fputs("{\"name\":", out);
    app_json_str(out, info->name);
    fputs(",\"layers\":", out);
    app_json_str(out, info->layers);
    fputs(",\"loss\":", out);
    app_json_str(out, info->loss);
    fprintf(out,
            ",\"epoch\":\"%" PRIu64 "\",\"version\":%" PRId64 ",\"shards\":%d,\"bytes\":%zu,"
            "\"created_ms\":%" PRId64,
            info->epoch, info->version, info->shards, info->bytes, info->created_ms);
    if (info->shards > 1) { /* each shard's range of floats and version */
        fputs(",\"bounds\":[", out);
        for (int k = 0; k <= info->shards; k++)
            fprintf(out, "%s%zu", k ? "," : "", info->bounds[k]);
        fputs("],\"shard_versions\":[", out);
        for (int k = 0; k < info->shards; k++)
            fprintf(out, "%s%" PRId64, k ? "," : "", info->shard_versions[k]);
        fputc(']', out);
    }
    if (info->stopped[0] != '\0') {
        fputs(",\"stopped\":", out);
        app_json_str(out, info->stopped);
    }
    fputs(",\"snapshots\":[", out);
    for (size_t i = 0; i < info->nsnaps; i++)
        fprintf(out, "%s%" PRId64, i ? "," : "", info->snaps[i]);
    fputs("],\"redis\":", out);
    app_json_str(out, info->node);
    if (info->slot >= 0)
        fprintf(out, ",\"slot\":%d", info->slot);
    fputs("}\n", out);
}

/* "model show": psstore_model_info as JSON on stdout. */
static int cmd_show(int argc, char **argv)
{
    static const char cmd[] = CMD " show";
    model_opts_t o;
    int rc = parse_opts(cmd, OPT_REDIS | OPT_NAME, show_usage, argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    psstore_conn_t *c;
    if ((rc = connect_redis(cmd, o.redis, &c)) != 0)
        return rc;
    psstore_model_info_t info;
    fr_err_t err = psstore_model_info(c, o.name, &info);
    if (err != FR_OK)
        rc = store_failed(cmd, c, err, NULL);
    else
        print_info(stdout, &info);
    psstore_conn_destroy(c);
    return rc;
}

static void export_usage(FILE *out)
{
    fprintf(out,
            "usage: freshet model export --name M --out W.safetensors [--redis URL]\n"
            "\n"
            "Writes model M's current weights (read with their epoch and version in one\n"
            "transaction) as safetensors, as freshet fit writes them: freshet eval and\n"
            "PyTorch read them. The metadata holds freshet.version and freshet.epoch.\n"
            "\n"
            "%s"
            "  --name M             the model's name\n"
            "  --out W              the file to write\n"
            "  -h, --help           this text\n",
            redis_help);
}

/* "model export": the current weights to a safetensors file. */
static int cmd_export(int argc, char **argv)
{
    static const char cmd[] = CMD " export";
    model_opts_t o;
    int rc = parse_opts(cmd, OPT_REDIS | OPT_NAME | OPT_OUT, export_usage, argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    if (o.out == NULL)
        return app_usage_error(cmd, "--out W is required");
    psstore_conn_t *c;
    if ((rc = connect_redis(cmd, o.redis, &c)) != 0)
        return rc;
    psstore_model_info_t info;
    model_t m;
    model_loss_t loss;
    char errstr[512];
    float *w = NULL;
    fr_err_t err = psstore_model_info(c, o.name, &info);
    if (err != FR_OK) {
        rc = store_failed(cmd, c, err, NULL);
    } else if (model_loss_parse(info.loss, &loss) != FR_OK ||
               model_init(&m, info.layers, loss, errstr, sizeof(errstr)) != FR_OK) {
        fprintf(stderr, "freshet %s: model %s holds layers '%s' and loss '%s'\n", cmd, o.name,
                info.layers, info.loss);
        rc = APP_EXIT_FAILURE;
    } else if ((w = malloc(m.nparams * sizeof(float))) == NULL) {
        rc = APP_EXIT_FAILURE;
    } else {
        uint64_t epoch;
        int64_t version;
        if ((err = psstore_model_weights(c, o.name, w, m.nparams, &epoch, &version)) != FR_OK) {
            rc = store_failed(cmd, c, err, NULL);
        } else {
            char vbuf[32], ebuf[32];
            snprintf(vbuf, sizeof(vbuf), "%lld", (long long)version);
            snprintf(ebuf, sizeof(ebuf), "%llu", (unsigned long long)epoch);
            const fr_st_kv_t extra[] = {{"freshet.version", vbuf}, {"freshet.epoch", ebuf}};
            if (model_save(o.out, &m, w, extra, 2, errstr, sizeof(errstr)) != FR_OK) {
                fprintf(stderr, "freshet %s: %s\n", cmd, errstr);
                rc = APP_EXIT_FAILURE;
            } else {
                printf("wrote model %s version %lld of epoch %llu to %s\n", o.name,
                       (long long)version, (unsigned long long)epoch, o.out);
            }
        }
    }
    free(w);
    psstore_conn_destroy(c);
    return rc;
}

/* "model list": one name per line, sorted; nothing for an empty store. */
static int cmd_list(int argc, char **argv)
{
    static const char cmd[] = CMD " list";
    model_opts_t o;
    int rc = parse_opts(cmd, OPT_REDIS, list_usage, argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    psstore_conn_t *c;
    if ((rc = connect_redis(cmd, o.redis, &c)) != 0)
        return rc;
    char **names = NULL;
    size_t n = 0;
    fr_err_t err = psstore_model_list(c, &names, &n);
    if (err != FR_OK)
        rc = store_failed(cmd, c, err, NULL);
    for (size_t i = 0; i < n; i++) {
        printf("%s\n", names[i]);
        free(names[i]);
    }
    free(names);
    psstore_conn_destroy(c);
    return rc;
}

/*
 * Has the model's running applier delete it (docs/design.md "One writer and fencing": only the
 * lease holder writes a model): appends a delete request and waits for the applier to execute it.
 * Returns the exit status.
 */
static int delete_by_applier(const char *cmd, psstore_conn_t *c, const char *url, const char *name)
{
    char id[64];
    fr_err_t err = psstore_request_delete(c, name, id);
    /* a sharded model: shards without a running applier delete their part here */
    if (err == FR_OK && app_execute_requests(cmd, c, url, name) != FR_OK)
        return APP_EXIT_FAILURE;
    if (err == FR_OK)
        err = psstore_request_wait(c, name, id, MODEL_REQUEST_WAIT_MS);
    if (err != FR_OK)
        return store_failed(cmd, c, err, NULL);
    printf("deleted model %s (by its running applier)\n", name);
    return 0;
}

/*
 * "model delete": only with --yes. One transaction deletes every key; a
 * model whose applier is running is deleted by that applier instead.
 */
static int cmd_delete(int argc, char **argv)
{
    static const char cmd[] = CMD " delete";
    model_opts_t o;
    int rc = parse_opts(cmd, OPT_REDIS | OPT_NAME | OPT_YES, delete_usage, argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    if (!o.yes)
        return app_usage_error(cmd, "refusing to delete model %s without --yes", o.name);
    psstore_conn_t *c;
    if ((rc = connect_redis(cmd, o.redis, &c)) != 0)
        return rc;
    int held = 0;
    fr_err_t err = psstore_model_delete(c, o.name);
    if (err == FR_ERR_STATE && psstore_lease_held(c, o.name, &held) == FR_OK && held)
        rc = delete_by_applier(cmd, c, o.redis, o.name);
    else if (err != FR_OK)
        rc = store_failed(cmd, c, err, NULL);
    else
        printf("deleted model %s\n", o.name);
    psstore_conn_destroy(c);
    return rc;
}

static void rollback_usage(FILE *out)
{
    fprintf(out,
            "usage: freshet model rollback --name M --version V [--redis URL]\n"
            "\n"
            "Restores retained snapshot V of model M (weights, optimizer state, offsets)\n"
            "as a new version of a new epoch; training continues from the snapshot's\n"
            "offsets. The rollback is a request for the model's applier; when none runs,\n"
            "this command takes the lease and executes it itself (nothing else). It waits\n"
            "up to 10 s. 'freshet model show' lists the retained snapshots.\n"
            "\n"
            "%s"
            "  --name M             the model's name\n"
            "  --version V          a retained snapshot's version\n"
            "  -h, --help           this text\n",
            redis_help);
}

/* "model rollback": a request, executed by the running applier or here. */
static int cmd_rollback(int argc, char **argv)
{
    static const char cmd[] = CMD " rollback";
    model_opts_t o;
    int rc = parse_opts(cmd, OPT_REDIS | OPT_NAME | OPT_VERSION, rollback_usage, argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    if (o.version < 0)
        return app_usage_error(cmd, "--version V is required");
    psstore_conn_t *c;
    if ((rc = connect_redis(cmd, o.redis, &c)) != 0)
        return rc;
    psstore_model_info_t info;
    char id[64];
    fr_err_t err = psstore_model_info(c, o.name, &info);
    if (err == FR_OK) {
        int retained = 0;
        for (size_t i = 0; i < info.nsnaps; i++)
            retained |= info.snaps[i] == o.version;
        if (!retained) {
            rc = app_usage_error(cmd, "model %s retains no snapshot of version %lld", o.name,
                                 o.version);
            psstore_conn_destroy(c);
            return rc;
        }
        err = psstore_request_rollback(c, o.name, o.version, id);
    }
    if (err == FR_OK && app_execute_requests(cmd, c, o.redis, o.name) != FR_OK) {
        psstore_conn_destroy(c);
        return APP_EXIT_FAILURE;
    }
    if (err == FR_OK)
        err = psstore_request_wait(c, o.name, id, MODEL_REQUEST_WAIT_MS);
    if (err == FR_OK && (err = psstore_model_info(c, o.name, &info)) == FR_OK)
        printf("rolled back model %s to snapshot %lld: now version %lld of epoch %llu\n", o.name,
               o.version, (long long)info.version, (unsigned long long)info.epoch);
    if (err != FR_OK)
        rc = store_failed(cmd, c, err, NULL);
    psstore_conn_destroy(c);
    return rc;
}

/*
 * "freshet model <verb> ...": argv[0] is "model", argv[1] the verb, whose
 * function gets argv + 1 (the verb in place of the program name).
 */
int app_cmd_model(int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*run)(int argc, char **argv);
    } verbs[] = {
        {"create", cmd_create}, {"show", cmd_show},         {"list", cmd_list},
        {"delete", cmd_delete}, {"rollback", cmd_rollback}, {"export", cmd_export},
    };
    if (argc < 2) {
        model_usage(stderr);
        return APP_EXIT_USAGE;
    }
    const char *verb = argv[1];
    if (strcmp(verb, "--help") == 0 || strcmp(verb, "-h") == 0 || strcmp(verb, "help") == 0) {
        model_usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++) {
        if (strcmp(verb, verbs[i].name) == 0) {
            int rc = verbs[i].run(argc - 1, argv + 1);
            fflush(stdout);
            return rc;
        }
    }
    return app_usage_error(
        CMD, "unknown verb '%s' (create, show, list, delete, rollback or export)", verb);
}
