/*
 * svc_compare.c - "freshet compare": the seed's question (when does
 * synchronous, asynchronous or a hybrid training win, on accuracy,
 * efficiency and cost) answered on the user's own data. For every
 * configuration of the grid (mode x workers x straggler x seed) it runs
 * the real "freshet run" (this binary, /proc/self/exe) with --config and
 * --set overrides under a fresh model name until --samples samples were
 * applied, then reads what the run left in Redis (the versions, evals and
 * drops streams, the final weights) and run's --summary, and writes the
 * reports (compare_report.c). docs/design.md "Training modes".
 *
 * Nothing is deleted from Redis unless --cleanup. Threads: main thread only.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "app/app.h"
#include "app/compare.h"
#include "trainer/trainer.h"

#define CMD          "compare"
#define MAX_SETS     64
#define MAX_LIST     32
#define POLL_MS      250
#define EVALS_WANTED 30   /* holdout evaluations per run, about   */
#define TARGET_FRAC  0.98 /* default target: of the best cell's mean */

static const char *const known_modes[] = {"async",  "adaptive", "sync", "backup",
                                          "groups", "ssp",      "auto"};

static void compare_usage(FILE *out)
{
    fprintf(
        out,
        "usage: freshet compare --config F [--modes M,...] [--workers W,...] [--straggler W:F]\n"
        "                       [--seeds K] [--samples N] [--target ACC] [--out DIR]\n"
        "                       [--set S.K=V ...] [--stall S] [--cleanup]\n"
        "\n"
        "Runs freshet run once per configuration (mode x workers x straggler x seed) on\n"
        "[ingest] topic, [redis] url and the holdout set of [eval] (required), each under a\n"
        "fresh model name <[model] name>-cmp-<mode>-w<W>-<none|straggler>-<seed>-<run id>,\n"
        "until N samples were applied; then reads the store (versions, evals, drops, the\n"
        "final weights) and writes DIR/report.json, DIR/report.md and DIR/report.html:\n"
        "accuracy at equal samples, time and samples to the target, samples/s, speed-up,\n"
        "staleness, lr_eff, waits, drops, rounds, learning curves and a verdict.\n"
        "\n"
        "  --config F        the INI configuration every run starts from\n"
        "  --modes LIST      of async, adaptive, sync, backup (trainer.backups=1), groups\n"
        "                    (trainer.groups=2), ssp, auto (default async,sync)\n"
        "  --workers LIST    worker counts (default 2)\n"
        "  --straggler W:F   also run each configuration with worker W slowed F times\n"
        "                    ([trainer] slowdown)\n"
        "  --seeds K         seeds [model] seed .. seed+K-1 (default 1)\n"
        "  --samples N       samples applied per run (default 60000)\n"
        "  --target ACC      holdout accuracy to reach (default 0.98 x the best cell's mean\n"
        "                    final accuracy)\n"
        "  --out DIR         the reports' folder (default freshet-compare), with runs/:\n"
        "                    each run's log and summary\n"
        "  --set S.K=V       override a key for every run (repeatable)\n"
        "  --stall S         stop a run that applied nothing for S seconds (default 60)\n"
        "  --cleanup         delete each run's model from Redis once measured\n"
        "  -h, --help        this text\n"
        "\n"
        "Exit status: 0 the reports were written, 1 no run could be measured or a report\n"
        "could not be written, 2 bad arguments or configuration.\n");
}

/* What the command line asked for. */
typedef struct cmp_opts {
    const char *config, *out, *straggler;
    const char *sets[MAX_SETS];
    int nsets;
    const char *modes[MAX_LIST];
    int nmodes;
    int workers[MAX_LIST];
    int nworkers;
    long long seeds, samples, stall_s;
    double target;
    int cleanup;
} cmp_opts_t;

/* Splits a comma list of modes into o->modes (pointers into text, which
 * is modified). Returns 0 or the usage error. */
static int parse_modes(cmp_opts_t *o, char *text)
{
    o->nmodes = 0;
    for (char *save = NULL, *m = strtok_r(text, ",", &save); m != NULL;
         m = strtok_r(NULL, ",", &save)) {
        size_t k = 0;
        while (k < sizeof(known_modes) / sizeof(known_modes[0]) && strcmp(m, known_modes[k]) != 0)
            k++;
        if (k == sizeof(known_modes) / sizeof(known_modes[0]))
            return app_usage_error(CMD,
                                   "--modes: unknown mode '%s' (async, adaptive, sync, backup, "
                                   "groups, ssp, auto)",
                                   m);
        if (o->nmodes == MAX_LIST)
            return app_usage_error(CMD, "--modes: more than %d modes", MAX_LIST);
        o->modes[o->nmodes++] = m;
    }
    return o->nmodes > 0 ? 0 : app_usage_error(CMD, "--modes: no mode given");
}

static int parse_workers(cmp_opts_t *o, char *text)
{
    o->nworkers = 0;
    for (char *save = NULL, *w = strtok_r(text, ",", &save); w != NULL;
         w = strtok_r(NULL, ",", &save)) {
        long long n;
        if (o->nworkers == MAX_LIST)
            return app_usage_error(CMD, "--workers: more than %d values", MAX_LIST);
        if (app_parse_long(CMD, "--workers", w, 1, 1024, &n) != 0)
            return APP_EXIT_USAGE;
        o->workers[o->nworkers++] = (int)n;
    }
    return o->nworkers > 0 ? 0 : app_usage_error(CMD, "--workers: no value given");
}

/* The options into o (lists in the caller's buffers). Returns 0, -1 after
 * --help, or an exit status. */
static int parse_opts(cmp_opts_t *o, int argc, char **argv, char *modes, char *workers)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"modes", required_argument, NULL, 'm'},
        {"workers", required_argument, NULL, 'w'},
        {"straggler", required_argument, NULL, 'S'},
        {"seeds", required_argument, NULL, 'k'},
        {"samples", required_argument, NULL, 'n'},
        {"target", required_argument, NULL, 't'},
        {"out", required_argument, NULL, 'o'},
        {"set", required_argument, NULL, 's'},
        {"stall", required_argument, NULL, 'l'},
        {"cleanup", no_argument, NULL, 'C'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, rc = 0;
    app_opts_begin();
    while (rc == 0 &&
           (c = app_opts_next(CMD, argc, argv, ":h", longopts, NULL, compare_usage, &rc)) != -1) {
        switch (c) {
        case 'c': o->config = optarg; break;
        case 'm': snprintf(modes, 256, "%s", optarg); break;
        case 'w': snprintf(workers, 256, "%s", optarg); break;
        case 'S': o->straggler = optarg; break;
        case 'k': rc = app_parse_long(CMD, "--seeds", optarg, 1, 1000, &o->seeds); break;
        case 'n': rc = app_parse_long(CMD, "--samples", optarg, 1, INT64_MAX, &o->samples); break;
        case 't': rc = app_parse_double(CMD, "--target", optarg, 0, 1, &o->target); break;
        case 'o': o->out = optarg; break;
        case 'l': rc = app_parse_long(CMD, "--stall", optarg, 1, 86400, &o->stall_s); break;
        case 'C': o->cleanup = 1; break;
        case 's':
            if (o->nsets == MAX_SETS)
                rc = app_usage_error(CMD, "more than %d --set", MAX_SETS);
            else
                o->sets[o->nsets++] = optarg;
            break;
        }
    }
    if ((rc = app_opts_end(CMD, argc, argv, rc)) != 0)
        return rc;
    if (o->config == NULL)
        return app_usage_error(CMD, "--config F is required");
    if ((rc = parse_modes(o, modes)) != 0 || (rc = parse_workers(o, workers)) != 0)
        return rc;
    return 0;
}

/* The configuration every run starts from, and what compare itself needs
 * of it: the holdout set and the model. */
typedef struct cmp_env {
    fr_config_t *cfg;
    model_t m;
    ingest_dataset_t ds;
    trainer_backend_t *be;
    float *w;
    psstore_conn_t *store;
    char run_id[16];
} cmp_env_t;

/* Loads --config and --set, checks [eval] and --straggler, loads the
 * holdout and connects to Redis. Returns 0 or an exit status. */
static int env_open(cmp_env_t *e, const cmp_opts_t *o)
{
    char errstr[512];
    if ((e->cfg = fr_config_new()) == NULL)
        return APP_EXIT_FAILURE;
    if (fr_config_load_file(e->cfg, o->config, errstr, sizeof(errstr)) != FR_OK)
        return fprintf(stderr, "freshet %s: %s\n", CMD, errstr), APP_EXIT_USAGE;
    for (int i = 0; i < o->nsets; i++) {
        if (fr_config_set(e->cfg, o->sets[i], errstr, sizeof(errstr)) != FR_OK)
            return fprintf(stderr, "freshet %s: %s\n", CMD, errstr), APP_EXIT_USAGE;
    }
    if (fr_config_apply_env(e->cfg, errstr, sizeof(errstr)) != FR_OK)
        return fprintf(stderr, "freshet %s: %s\n", CMD, errstr), APP_EXIT_USAGE;
    const char *data = fr_config_get(e->cfg, "eval", "data");
    if (data[0] == '\0')
        return app_usage_error(CMD,
                               "%s: [eval] data is empty: compare scores every run on that "
                               "holdout set",
                               o->config);
    for (int i = 0; o->straggler != NULL && i < o->nworkers; i++) {
        double *f = calloc((size_t)o->workers[i], sizeof(double));
        fr_err_t err = f == NULL ? FR_ERR_NOMEM
                                 : trainer_slowdown_parse(o->straggler, o->workers[i], f, errstr,
                                                          sizeof(errstr));
        free(f);
        if (err != FR_OK)
            return app_usage_error(CMD, "--straggler at %d workers: %s", o->workers[i],
                                   err == FR_ERR_NOMEM ? "out of memory" : errstr);
    }
    model_loss_t loss;
    if (model_loss_parse(fr_config_get(e->cfg, "model", "loss"), &loss) != FR_OK ||
        model_init(&e->m, fr_config_get(e->cfg, "model", "layers"), loss, errstr, sizeof(errstr)) !=
            FR_OK)
        return app_usage_error(CMD, "[model]: %s", errstr);
    ingest_format_t format;
    ingest_schema_t schema;
    if (ingest_format_parse(fr_config_get(e->cfg, "eval", "format"), &format) != FR_OK)
        return app_usage_error(CMD, "[eval] format: csv, libsvm, f32 or idx");
    trainer_model_schema(&e->m, &schema);
    const char *labels = fr_config_get(e->cfg, "eval", "labels");
    int rc = app_load_dataset(CMD, "[eval] labels", &e->ds, &schema, format, data,
                              labels[0] != '\0' ? labels : NULL);
    if (rc != 0)
        return rc;
    e->be = trainer_backend_new(fr_config_get(e->cfg, "trainer", "backend"), &e->m, 1024, 0, errstr,
                                sizeof(errstr));
    e->w = malloc(e->m.nparams * sizeof(float));
    if (e->be == NULL || e->w == NULL)
        return fprintf(stderr, "freshet %s: [eval]: %s\n", CMD, e->be ? "out of memory" : errstr),
               APP_EXIT_FAILURE;
    e->store =
        psstore_conn_new(fr_config_get(e->cfg, "redis", "url"), 2000, errstr, sizeof(errstr));
    if (e->store == NULL)
        return fprintf(stderr, "freshet %s: %s\n", CMD, errstr), APP_EXIT_FAILURE;
    /* a run-unique suffix: reruns never reuse a model name */
    snprintf(e->run_id, sizeof(e->run_id), "%llx%x",
             (unsigned long long)(fr_clock_unix_ms() / 1000) & 0xffffffull, getpid() & 0xff);
    return 0;
}

static void env_close(cmp_env_t *e)
{
    psstore_conn_destroy(e->store);
    trainer_backend_destroy(e->be);
    free(e->w);
    ingest_dataset_fini(&e->ds);
    fr_config_destroy(e->cfg);
}

/* Gradients a version averages in mode with W workers: versions per run
 * are about samples / (batch x this). */
static int64_t per_version(const char *mode, int workers)
{
    if (strcmp(mode, "sync") == 0)
        return workers;
    if (strcmp(mode, "backup") == 0)
        return workers > 1 ? workers - 1 : 1;
    if (strcmp(mode, "groups") == 0)
        return (workers + 1) / 2;
    return 1;
}

/* The run's argv for execv (its own strings in args); returns argc. */
static int run_argv(const cmp_opts_t *o, const cmp_env_t *e, const cmp_run_t *r,
                    const char *summary, char args[][160], char **argv, int max)
{
    int n = 0;
#define ARG(...) snprintf(args[n], sizeof(args[n]), __VA_ARGS__), argv[n] = args[n], n++
    ARG("freshet");
    ARG("run");
    argv[n++] = (char *)"--config";
    argv[n++] = (char *)o->config;
    for (int i = 0; i < o->nsets && n + 2 < max; i++) {
        argv[n++] = (char *)"--set";
        argv[n++] = (char *)o->sets[i];
    }
    int64_t batch = fr_config_get_int(e->cfg, "ingest", "batch");
    int64_t every = o->samples / (batch * per_version(r->mode, r->workers)) / EVALS_WANTED;
    int64_t pending = fr_config_get_int(e->cfg, "psstore", "max_pending");
    const char *sets[][2] = {{"model.name", r->model}, {"trainer.mode", r->mode}};
    for (size_t i = 0; i < 2; i++) {
        ARG("--set");
        ARG("%s=%s", sets[i][0], sets[i][1]);
    }
    ARG("--set");
    ARG("trainer.workers=%d", r->workers);
    ARG("--set");
    ARG("model.seed=%lld", (long long)r->seed);
    ARG("--set");
    ARG("trainer.slowdown=%s", r->straggler ? o->straggler : "");
    ARG("--set");
    ARG("psstore.versions_keep=%lld", (long long)o->samples + 1000);
    ARG("--set");
    ARG("eval.every=%lld", (long long)(every > 1 ? every : 1));
    ARG("--set");
    ARG("serve.listen=");
    /* the round modes need two slots of the stream per worker */
    ARG("--set");
    ARG("psstore.max_pending=%lld",
        (long long)(pending > 2 * r->workers ? pending : 2 * r->workers));
    if (strcmp(r->mode, "backup") == 0) {
        ARG("--set");
        ARG("trainer.backups=1");
    }
    if (strcmp(r->mode, "groups") == 0) {
        ARG("--set");
        ARG("trainer.groups=2");
    }
    ARG("--samples");
    ARG("%lld", (long long)o->samples);
    ARG("--summary");
    argv[n++] = (char *)summary;
#undef ARG
    argv[n] = NULL;
    return n;
}

/* Progress on stderr: a bar redrawn in place on a terminal, else a plain
 * line per run and every 10 s. */
typedef struct progress {
    int tty;
    size_t i, n; /* the run under way, of n */
    uint64_t t0, last_line;
    int64_t done; /* samples of the runs finished */
} progress_t;

static void progress_show(progress_t *p, const cmp_run_t *r, int64_t samples, int64_t limit)
{
    uint64_t now = fr_clock_mono_ns();
    double done = (double)p->done + (double)(samples < limit ? samples : limit);
    double total = (double)p->n * (double)limit;
    double el = (double)(now - p->t0) * 1e-9;
    double eta = done > 0 ? el * (total - done) / done : NAN;
    char eta_s[32] = "?";
    if (isfinite(eta))
        snprintf(eta_s, sizeof(eta_s), "%dm%02ds", (int)eta / 60, (int)eta % 60);
    if (p->tty) {
        char bar[31];
        int fill = (int)(30 * done / total);
        for (int k = 0; k < 30; k++)
            bar[k] = k < fill ? '#' : '.';
        bar[30] = '\0';
        fprintf(stderr, "\r\033[K[%s] run %zu/%zu %s w%d%s seed %lld: %lld/%lld samples, ETA %s",
                bar, p->i + 1, p->n, r->mode, r->workers, r->straggler ? " straggler" : "",
                (long long)r->seed, (long long)samples, (long long)limit, eta_s);
    } else if (now - p->last_line >= 10000000000ull || samples == 0) {
        fprintf(stderr, "compare: run %zu/%zu %s: %lld/%lld samples, ETA %s\n", p->i + 1, p->n,
                r->model, (long long)samples, (long long)limit, eta_s);
        p->last_line = now;
    }
}

/* The last "freshet run: ..." line of the run's log, the reason a run
 * that failed gives; else the log's last line. */
static void log_error(const char *log, char *out, size_t size)
{
    char line[1024], last[1024] = "";
    snprintf(out, size, "exited with an error (see %.200s)", log);
    FILE *f = fopen(log, "r");
    if (f == NULL)
        return;
    while (fgets(line, sizeof(line), f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "freshet run:", 12) == 0 || last[0] == '\0')
            snprintf(last, sizeof(last), "%s", line);
    }
    fclose(f);
    if (last[0] != '\0')
        snprintf(out, size, "%s", last);
}

/* Forks and execs freshet run for r with stdout and stderr to log. The
 * child's pid, or -1 with r->error. */
static pid_t run_spawn(const cmp_opts_t *o, const cmp_env_t *e, cmp_run_t *r, const char *log,
                       const char *summary)
{
    static char args[48][160];
    char *argv[2 * MAX_SETS + 48];
    run_argv(o, e, r, summary, args, argv, 2 * MAX_SETS + 40);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        snprintf(r->error, sizeof(r->error), "%.200s: %s", log, strerror(errno));
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        close(fd);
        execv("/proc/self/exe", argv);
        fprintf(stderr, "freshet run: exec /proc/self/exe: %s\n", strerror(errno));
        _exit(APP_EXIT_FAILURE);
    }
    close(fd);
    if (pid < 0)
        snprintf(r->error, sizeof(r->error), "fork: %s", strerror(errno));
    return pid;
}

/* Waits for the run, showing progress; stops it (SIGTERM) when compare is
 * interrupted or nothing was applied for --stall seconds. Returns the
 * exit status, or -1 with r->error. */
static int run_wait(const cmp_opts_t *o, const cmp_env_t *e, cmp_run_t *r, pid_t pid, progress_t *p)
{
    app_applied_t ap = {0};
    uint64_t moved = fr_clock_mono_ns();
    int status, stopped = 0;
    progress_show(p, r, 0, o->samples);
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            break;
        if (w < 0 && errno != EINTR) {
            snprintf(r->error, sizeof(r->error), "waitpid: %s", strerror(errno));
            return -1;
        }
        int64_t before = ap.samples;
        if (app_applied_poll(e->store, r->model, &ap) == FR_OK && ap.samples != before)
            moved = fr_clock_mono_ns();
        progress_show(p, r, ap.samples, o->samples);
        uint64_t idle = fr_clock_mono_ns() - moved;
        if (!stopped && (atomic_load(&app_stop) || idle > (uint64_t)o->stall_s * 1000000000ull)) {
            snprintf(r->error, sizeof(r->error), "%s",
                     atomic_load(&app_stop)
                         ? "interrupted"
                         : "stalled: nothing applied for --stall seconds (does [ingest] topic "
                           "hold --samples samples?)");
            kill(pid, SIGTERM);
            stopped = 1;
        }
        struct timespec ts = {0, POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (p->tty)
        fputs("\r\033[K", stderr);
    if (stopped)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The grid's runs in order: workers, straggler (none, then the given
 * one), mode, seed; each with its fresh model name. NULL when out of
 * memory. */
static cmp_run_t *grid_runs(const cmp_opts_t *o, const cmp_env_t *e, size_t *n)
{
    int nstrag = o->straggler != NULL ? 2 : 1;
    *n = (size_t)o->nworkers * (size_t)nstrag * (size_t)o->nmodes * (size_t)o->seeds;
    cmp_run_t *runs = calloc(*n, sizeof(*runs));
    if (runs == NULL)
        return NULL;
    const char *base = fr_config_get(e->cfg, "model", "name");
    int64_t seed0 = fr_config_get_int(e->cfg, "model", "seed");
    char strag[32] = "none";
    if (o->straggler != NULL) { /* names take [A-Za-z0-9._-]: 0:10 -> 0-10 */
        snprintf(strag, sizeof(strag), "%s", o->straggler);
        for (char *p = strag; *p; p++)
            if (!fr_name_char(*p))
                *p = '-';
    }
    size_t i = 0;
    for (int w = 0; w < o->nworkers; w++)
        for (int s = 0; s < nstrag; s++)
            for (int m = 0; m < o->nmodes; m++)
                for (long long k = 0; k < o->seeds; k++, i++) {
                    cmp_run_t *r = &runs[i];
                    snprintf(r->mode, sizeof(r->mode), "%s", o->modes[m]);
                    r->workers = o->workers[w];
                    r->straggler = s;
                    r->seed = seed0 + k;
                    r->target_t_s = r->target_samples = NAN;
                    char name[256];
                    snprintf(name, sizeof(name), "%s-cmp-%s-w%d-%s-%lld-%s", base, r->mode,
                             r->workers, s ? strag : "none", (long long)r->seed, e->run_id);
                    if (strlen(name) >= sizeof(r->model)) {
                        fprintf(stderr,
                                "freshet %s: run name %s is over 64 characters: "
                                "shorten [model] name\n",
                                CMD, name);
                        free(runs);
                        return NULL;
                    }
                    memcpy(r->model, name, strlen(name) + 1);
                }
    return runs;
}

/* One run: spawn, wait, measure, optionally delete its model. */
static void grid_run_one(const cmp_opts_t *o, cmp_env_t *e, cmp_run_t *r, progress_t *p)
{
    char log[4096], summary[4096];
    snprintf(log, sizeof(log), "%s/runs/%s.log", o->out, r->model);
    snprintf(summary, sizeof(summary), "%s/runs/%s.summary.json", o->out, r->model);
    pid_t pid = run_spawn(o, e, r, log, summary);
    if (pid < 0)
        return;
    r->exit_status = run_wait(o, e, r, pid, p);
    if (r->exit_status != 0) {
        if (r->exit_status > 0)
            log_error(log, r->error, sizeof(r->error));
        return;
    }
    app_holdout_t h = {&e->m, e->be, &e->ds, e->w};
    r->ok = app_compare_measure(e->store, &h, (size_t)o->samples + 1000, summary, r) == 0;
    if (o->cleanup && psstore_model_delete(e->store, r->model) != FR_OK)
        fr_log(FR_LOG_WARN, "compare: --cleanup %s: %s", r->model, psstore_conn_error(e->store));
}

/* Every run of the grid, in order; stops early when interrupted. */
static void grid_run(const cmp_opts_t *o, cmp_env_t *e, cmp_grid_t *g)
{
    progress_t p = {.tty = isatty(STDERR_FILENO), .n = g->nruns, .t0 = fr_clock_mono_ns()};
    for (size_t i = 0; i < g->nruns && !atomic_load(&app_stop); i++) {
        cmp_run_t *r = &g->runs[i];
        p.i = i;
        grid_run_one(o, e, r, &p);
        p.done += o->samples;
        if (r->ok)
            fprintf(stderr,
                    "compare: run %zu/%zu %s: %lld samples, %lld versions, accuracy %.4f, "
                    "%.0f samples/s\n",
                    i + 1, g->nruns, r->model, (long long)r->samples, (long long)r->versions,
                    r->accuracy, r->samples_per_s);
        else
            fprintf(stderr, "compare: run %zu/%zu %s failed: %s\n", i + 1, g->nruns, r->model,
                    r->error);
    }
}

static int make_dirs(const char *out)
{
    char runs[4096];
    snprintf(runs, sizeof(runs), "%s/runs", out);
    if ((mkdir(out, 0755) != 0 && errno != EEXIST) || (mkdir(runs, 0755) != 0 && errno != EEXIST))
        return fprintf(stderr, "freshet %s: --out %s: %s\n", CMD, out, strerror(errno)),
               APP_EXIT_USAGE;
    return 0;
}

/* The target, the aggregates and the reports of the runs done. */
static int grid_report(const cmp_opts_t *o, const cmp_env_t *e, cmp_grid_t *g)
{
    char errstr[512];
    size_t ok = 0;
    for (size_t i = 0; i < g->nruns; i++)
        ok += g->runs[i].ok;
    g->target_given = o->target > 0;
    g->target = g->target_given ? o->target : cmp_default_target(g, TARGET_FRAC);
    cmp_apply_target(g);
    snprintf(g->chartjs, sizeof(g->chartjs), "%s", fr_config_get(e->cfg, "serve", "chartjs"));
    if (cmp_aggregate(g) != 0 || cmp_report_write(g, o->out, errstr, sizeof(errstr)) != 0) {
        fprintf(stderr, "freshet %s: %s\n", CMD, errstr);
        return APP_EXIT_FAILURE;
    }
    fprintf(stderr, "compare: %zu of %zu runs measured; %s/report.md, report.json, report.html\n",
            ok, g->nruns, o->out);
    return ok > 0 ? 0 : APP_EXIT_FAILURE;
}

int app_cmd_compare(int argc, char **argv)
{
    char modes[256] = "async,sync", workers[256] = "2";
    cmp_opts_t o = {.out = "freshet-compare", .seeds = 1, .samples = 60000, .stall_s = 60};
    cmp_env_t e = {0};
    cmp_grid_t g = {0};
    int rc = parse_opts(&o, argc, argv, modes, workers);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    if ((rc = env_open(&e, &o)) != 0 || (rc = make_dirs(o.out)) != 0)
        goto out;
    if ((g.runs = grid_runs(&o, &e, &g.nruns)) == NULL) {
        rc = APP_EXIT_FAILURE;
        goto out;
    }
    g.config = o.config;
    g.straggler = o.straggler;
    g.samples = o.samples;
    g.seeds = (int)o.seeds;
    app_stop_on_signals(1);
    grid_run(&o, &e, &g);
    rc = grid_report(&o, &e, &g);
out:
    for (size_t i = 0; i < g.nruns; i++)
        free(g.runs[i].curve.pts);
    free(g.runs);
    free(g.aggs);
    env_close(&e);
    return rc;
}
