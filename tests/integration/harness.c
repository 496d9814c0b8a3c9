/*
 * harness.c - see harness.h.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

void harness_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int harness_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    int port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

int harness_closed_port(int *fd)
{
    *fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    if (*fd < 0 || bind(*fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        getsockname(*fd, (struct sockaddr *)&sa, &len) != 0) {
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        return -1;
    }
    return ntohs(sa.sin_port);
}

/* Every child harness_spawn started, so that harness_kill_children can
 * stop those a failed test left behind. */
#define MAX_CHILDREN 256
static pid_t children[MAX_CHILDREN];
static int nchildren;

void harness_kill_children(void)
{
    for (int i = 0; i < nchildren; i++) {
        int status;
        if (waitpid(children[i], &status, WNOHANG) == 0) {
            kill(children[i], SIGKILL);
            waitpid(children[i], &status, 0);
        }
    }
    nchildren = 0;
}

pid_t harness_spawn(char *const argv[], const char *log_path)
{
    pid_t pid = fork();
    if (pid > 0 && nchildren < MAX_CHILDREN)
        children[nchildren++] = pid;
    if (pid != 0)
        return pid;
    int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
    }
    setpgid(0, 0);
    execvp(argv[0], argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

int harness_wait(pid_t pid, int timeout_ms)
{
    for (int waited = 0;; waited += 10) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        if (r < 0 || waited >= timeout_ms)
            return -1;
        harness_sleep_ms(10);
    }
}

/*
 * Nonzero when a Redis answers on port: PONG, or a NOAUTH error from a
 * server started with --requirepass (it is up; it just wants a password).
 */
int harness_run(char *const argv[], const char *log_path, int timeout_ms)
{
    pid_t pid = harness_spawn(argv, log_path);
    if (pid < 0)
        return -1;
    int status = harness_wait(pid, timeout_ms);
    if (status == -1) {
        kill(pid, SIGKILL);
        harness_wait(pid, 5000);
    }
    return status;
}

static int ping(int port)
{
    struct timeval tv = {0, 200000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c == NULL || c->err) {
        redisFree(c);
        return -1;
    }
    redisReply *r = redisCommand(c, "PING");
    int ok = r != NULL && ((r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0) ||
                           (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOAUTH", 6) == 0));
    freeReplyObject(r);
    redisFree(c);
    return ok ? 0 : -1;
}

/* Nonzero when a line of the file at path starts with prefix and holds
 * needle. */
static int log_has_line(const char *path, const char *prefix, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    char line[4096];
    size_t n = strlen(prefix);
    int found = 0;
    while (!found && fgets(line, sizeof(line), f) != NULL)
        found = strncmp(line, prefix, n) == 0 && strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

static int launch(harness_redis_t *r)
{
    char port[16], log[300], cmd[1024];
    snprintf(port, sizeof(port), "%d", r->port);
    snprintf(log, sizeof(log), "%s/redis.log", r->dir);
    /* the extra arguments are split on spaces: tests pass simple flags */
    char *argv[64];
    int argc = 0;
    argv[argc++] = "redis-server";
    argv[argc++] = "--port";
    argv[argc++] = port;
    argv[argc++] = "--bind";
    argv[argc++] = "127.0.0.1";
    argv[argc++] = "--dir";
    argv[argc++] = r->dir;
    argv[argc++] = "--save";
    argv[argc++] = "";
    argv[argc++] = "--daemonize";
    argv[argc++] = "no";
    snprintf(cmd, sizeof(cmd), "%s", r->args);
    for (char *tok = strtok(cmd, " "); tok != NULL && argc < 62; tok = strtok(NULL, " "))
        argv[argc++] = tok;
    argv[argc] = NULL;
    r->pid = harness_spawn(argv, log);
    if (r->pid < 0)
        return -1;
    /* A PONG alone does not say whose server answered: the port was free
     * when harness_free_port closed it, and another process (a test beside
     * this one) may have bound it since. Ours then exits ("Address already
     * in use") while the other answers. So the server must also have
     * logged, under its own pid, that it accepts connections: redis-server
     * does after it has bound the port. */
    char ready[32];
    snprintf(ready, sizeof(ready), "%d:", (int)r->pid);
    for (int i = 0; i < 1000; i++) {
        if (log_has_line(log, ready, "Ready to accept connections") && ping(r->port) == 0)
            return 0;
        if (harness_wait(r->pid, 0) != -1) {
            fprintf(stderr, "harness: redis-server exited; see %s\n", log);
            r->pid = 0;
            return -1;
        }
        harness_sleep_ms(10);
    }
    fprintf(stderr, "harness: redis-server on port %d not ready in 10 s; see %s\n", r->port, log);
    harness_redis_kill(r, SIGKILL); /* never leave a server running behind a failure */
    return -1;
}

int harness_redis_start(harness_redis_t *r, const char *extra_args)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->dir, sizeof(r->dir), "/tmp/freshet-test-redis-XXXXXX");
    if (mkdtemp(r->dir) == NULL) {
        perror("harness: mkdtemp");
        return -1;
    }
    snprintf(r->args, sizeof(r->args), "%s", extra_args ? extra_args : "");
    for (int attempt = 0; attempt < 5; attempt++) {
        r->port = harness_free_port();
        snprintf(r->url, sizeof(r->url), "redis://127.0.0.1:%d/0", r->port);
        if (launch(r) == 0)
            return 0;
    }
    return -1;
}

void harness_redis_kill(harness_redis_t *r, int sig)
{
    if (r->pid <= 0)
        return;
    kill(r->pid, sig);
    if (harness_wait(r->pid, 5000) == -1) {
        kill(r->pid, SIGKILL);
        harness_wait(r->pid, 5000);
    }
    r->pid = 0;
}

int harness_redis_restart(harness_redis_t *r)
{
    return launch(r);
}

void harness_redis_stop(harness_redis_t *r)
{
    harness_redis_kill(r, SIGTERM);
    if (r->dir[0] != '\0') {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", r->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "harness: could not remove %s\n", r->dir);
        r->dir[0] = '\0';
    }
}

static void reply_text(const redisReply *rep, char *out, size_t size, size_t *off)
{
    int n = 0;
    switch (rep->type) {
    case REDIS_REPLY_INTEGER: n = snprintf(out + *off, size - *off, "%lld", rep->integer); break;
    case REDIS_REPLY_NIL: n = snprintf(out + *off, size - *off, "(nil)"); break;
    case REDIS_REPLY_ARRAY:
        for (size_t i = 0; i < rep->elements; i++) {
            if (i > 0 && *off + 1 < size)
                out[(*off)++] = '\n';
            reply_text(rep->element[i], out, size, off);
        }
        return;
    default: n = snprintf(out + *off, size - *off, "%.*s", (int)rep->len, rep->str); break;
    }
    if (n > 0)
        *off = *off + (size_t)n < size ? *off + (size_t)n : size - 1;
}

int harness_redis_query(const harness_redis_t *r, char *out, size_t size, const char *fmt, ...)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    if (c == NULL || c->err) {
        redisFree(c);
        return -1;
    }
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (rep == NULL) {
        redisFree(c);
        return -1;
    }
    size_t off = 0;
    out[0] = '\0';
    reply_text(rep, out, size, &off);
    out[off < size ? off : size - 1] = '\0';
    freeReplyObject(rep);
    redisFree(c);
    return 0;
}

int64_t harness_redis_calls(const harness_redis_t *r, const char *cmd)
{
    static char out[1 << 16];
    if (harness_redis_query(r, out, sizeof(out), "INFO commandstats") != 0)
        return -1;
    char needle[64];
    snprintf(needle, sizeof(needle), "cmdstat_%s:calls=", cmd);
    const char *p = strstr(out, needle);
    return p != NULL ? strtoll(p + strlen(needle), NULL, 10) : 0;
}

int harness_file_contains(const char *path, const char *needle)
{
    return harness_file_count(path, needle) > 0;
}

int harness_file_count(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof(line), f) != NULL)
        for (const char *p = line; (p = strstr(p, needle)) != NULL; p += strlen(needle))
            n++;
    fclose(f);
    return n;
}

int harness_await_file(const char *path, const char *needle, int count, int timeout_ms)
{
    for (int waited = 0;; waited += 20) {
        if (harness_file_count(path, needle) >= count)
            return 0;
        if (waited >= timeout_ms)
            return -1;
        harness_sleep_ms(20);
    }
}

long harness_file_size(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : 0;
    fclose(f);
    return size > 0 ? size : 0;
}

long harness_progress_applied(const char *log, long from)
{
    FILE *f = fopen(log, "r");
    long most = -1;
    char line[1024];
    if (f == NULL || fseek(f, from, SEEK_SET) != 0) {
        if (f != NULL)
            fclose(f);
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL)
        for (const char *p = line; (p = strstr(p, ", applied ")) != NULL; p++) {
            long n = strtol(p + 10, NULL, 10);
            most = n > most ? n : most;
        }
    fclose(f);
    return most;
}

int harness_log_port(const char *log, long from, int timeout_ms)
{
    static const char marker[] = "serve: listening on ";
    for (int waited = 0;; waited += 20) {
        FILE *f = fopen(log, "r");
        if (f != NULL && fseek(f, from, SEEK_SET) == 0) {
            char line[4096];
            while (fgets(line, sizeof(line), f) != NULL) {
                const char *p = strstr(line, marker), *q = p ? strstr(p, "(port ") : NULL;
                int port = q != NULL ? atoi(q + strlen("(port ")) : 0;
                if (port > 0 && port < 65536) {
                    fclose(f);
                    return port;
                }
            }
        }
        if (f != NULL)
            fclose(f);
        if (waited >= timeout_ms) {
            fprintf(stderr, "harness: no \"%s... (port N)\" in %s after %d ms\n", marker, log,
                    timeout_ms);
            return -1;
        }
        harness_sleep_ms(20);
    }
}

/* ------------------------------------------------------------------------
 * The dev broker.
 * ---------------------------------------------------------------------- */

/*
 * Reads the first line of the bootstrap file into b->bootstrap. The broker
 * writes it atomically (temporary file + rename), so a file that exists is
 * complete. Returns 0, or -1 while it is missing or empty.
 */
static int read_bootstrap(harness_broker_t *b, const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    int ok = fgets(b->bootstrap, sizeof(b->bootstrap), f) != NULL;
    fclose(f);
    b->bootstrap[strcspn(b->bootstrap, "\r\n")] = '\0';
    return ok && b->bootstrap[0] != '\0' ? 0 : -1;
}

int harness_broker_start(harness_broker_t *b, const char *bin, const char *args)
{
    char path[300], cmd[1024];
    memset(b, 0, sizeof(*b));
    snprintf(b->dir, sizeof(b->dir), "/tmp/freshet-test-broker-XXXXXX");
    if (mkdtemp(b->dir) == NULL) {
        perror("harness: mkdtemp");
        return -1;
    }
    snprintf(b->log, sizeof(b->log), "%s/broker.log", b->dir);
    snprintf(path, sizeof(path), "%s/bootstrap", b->dir);
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)bin;
    argv[argc++] = "broker";
    argv[argc++] = "--bootstrap-file";
    argv[argc++] = path;
    snprintf(cmd, sizeof(cmd), "%s", args ? args : "");
    for (char *tok = strtok(cmd, " "); tok != NULL && argc < 62; tok = strtok(NULL, " "))
        argv[argc++] = tok;
    argv[argc] = NULL;
    b->pid = harness_spawn(argv, b->log);
    if (b->pid < 0)
        return -1;
    for (int i = 0; i < 1000; i++) {
        if (read_bootstrap(b, path) == 0)
            return 0;
        if (harness_wait(b->pid, 0) != -1) {
            fprintf(stderr, "harness: freshet broker exited; see %s\n", b->log);
            b->pid = 0;
            return -1;
        }
        harness_sleep_ms(10);
    }
    fprintf(stderr, "harness: freshet broker wrote no bootstrap file in 10 s; see %s\n", b->log);
    kill(b->pid, SIGKILL); /* never leave a broker running behind a failure */
    harness_wait(b->pid, 5000);
    b->pid = 0;
    return -1;
}

int harness_broker_stop(harness_broker_t *b)
{
    int status = -1;
    if (b->pid > 0) {
        kill(b->pid, SIGTERM);
        status = harness_wait(b->pid, 5000);
        if (status == -1) {
            kill(b->pid, SIGKILL);
            harness_wait(b->pid, 5000);
        }
        b->pid = 0;
    }
    if (b->dir[0] != '\0') {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", b->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "harness: could not remove %s\n", b->dir);
        b->dir[0] = '\0';
    }
    return status;
}

/* ------------------------------------------------------------------------
 * An applier in a thread.
 * ---------------------------------------------------------------------- */

static void *applier_main(void *arg)
{
    harness_applier_t *t = arg;
    psstore_applier_run(t->a, &t->stop);
    return NULL;
}

int harness_applier_start(harness_applier_t *t, const psstore_applier_conf_t *conf)
{
    char errstr[512];
    memset(t, 0, sizeof(*t));
    atomic_init(&t->stop, 0);
    t->a = psstore_applier_new(conf, errstr, sizeof(errstr));
    if (t->a == NULL) {
        fprintf(stderr, "harness: applier: %s\n", errstr);
        return -1;
    }
    if (pthread_create(&t->tid, NULL, applier_main, t) != 0) {
        psstore_applier_destroy(t->a);
        t->a = NULL;
        return -1;
    }
    return 0;
}

void harness_applier_stop(harness_applier_t *t, psstore_applier_stats_t *stats)
{
    if (t->a == NULL)
        return;
    atomic_store(&t->stop, 1);
    pthread_join(t->tid, NULL);
    if (stats != NULL)
        psstore_applier_stats(t->a, stats);
    psstore_applier_destroy(t->a);
    t->a = NULL;
}

void harness_audit_parse(const struct redisReply *kv, harness_audit_entry_t *e)
{
    *e = (harness_audit_entry_t){
        .first = -1, .last = -1, .partition = -1, .topic = "", .outcome = ""};
    for (size_t f = 0; f + 1 < kv->elements; f += 2) {
        const char *k = kv->element[f]->str, *v = kv->element[f + 1]->str;
        if (strcmp(k, "first") == 0)
            e->first = atoll(v);
        else if (strcmp(k, "last") == 0)
            e->last = atoll(v);
        else if (strcmp(k, "partition") == 0)
            e->partition = atoll(v);
        else if (strcmp(k, "generation") == 0)
            e->generation = atoll(v);
        else if (strcmp(k, "epoch") == 0)
            e->epoch = strtoull(v, NULL, 10);
        else if (strcmp(k, "topic") == 0)
            e->topic = v;
        else if (strcmp(k, "outcome") == 0)
            e->outcome = v;
    }
}

int harness_audit_count(const harness_redis_t *r, const char *model, const char *topic,
                        int32_t partition, const char *outcome, int *seen, int n)
{
    memset(seen, 0, (size_t)n * sizeof(*seen));
    redisContext *c = redisConnect("127.0.0.1", r->port);
    if (c == NULL || c->err) {
        if (c != NULL)
            redisFree(c);
        return -1;
    }
    redisReply *reply = redisCommand(c, "XRANGE freshet:{%s}:audit - +", model);
    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY) {
        if (reply != NULL)
            freeReplyObject(reply);
        redisFree(c);
        return -1;
    }
    int matched = 0;
    for (size_t i = 0; i < reply->elements; i++) {
        harness_audit_entry_t e;
        harness_audit_parse(reply->element[i]->element[1], &e);
        long long first = e.first, last = e.last, part = e.partition;
        const char *t = e.topic, *o = e.outcome;
        int want = outcome != NULL ? strcmp(o, outcome) == 0
                                   : strcmp(o, "duplicate") != 0 && strcmp(o, "replay") != 0;
        if (!want || (topic != NULL && (strcmp(t, topic) != 0 || part != partition)))
            continue;
        matched++;
        for (long long pos = first < 0 ? 0 : first; pos <= last && pos < n; pos++)
            seen[pos]++;
    }
    freeReplyObject(reply);
    redisFree(c);
    return matched;
}

int harness_command(const char *log_path, int timeout_ms, const char *bin, ...)
{
    char *argv[64];
    int argc = 0;
    va_list ap;
    argv[argc++] = (char *)bin;
    va_start(ap, bin);
    for (char *a; argc < 63 && (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    int status = harness_run(argv, log_path, timeout_ms);
    return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int harness_tmpdir(char *dir, const char *name)
{
    snprintf(dir, 256, "/tmp/freshet-test-%s-XXXXXX", name);
    return mkdtemp(dir) != NULL ? 0 : -1;
}

int harness_rmdir(const char *dir)
{
    char cmd[300];
    if (dir[0] == '\0')
        return 0;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int harness_stack_start(char *dir, const char *name, harness_redis_t *r, harness_broker_t *b,
                        const char *bin, const char *broker_args)
{
    if (harness_tmpdir(dir, name) != 0 || harness_redis_start(r, NULL) != 0)
        return -1;
    return harness_broker_start(b, bin, broker_args);
}

int harness_stack_stop(const char *dir, harness_redis_t *r, harness_broker_t *b)
{
    if (b->pid > 0)
        harness_broker_stop(b);
    harness_redis_stop(r);
    harness_kill_children(); /* those a failed test left behind */
    return harness_rmdir(dir);
}

void harness_gradient(float *g, size_t n, uint64_t seed)
{
    fr_rng_t rng;
    fr_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++)
        g[i] = (float)(fr_rng_uniform(&rng) - 0.5);
}

fr_err_t harness_push_range(psstore_client_t *cl, const float *g, size_t len, int32_t partition,
                            int64_t from, int64_t to, uint64_t epoch, int64_t version,
                            int timeout_ms)
{
    psstore_range_t range = {"t", partition, from, to};
    psstore_grad_t msg = {.epoch = epoch,
                          .version = version,
                          .worker = "test/1/0",
                          .n = to - from,
                          .loss_sum = 1,
                          .ranges = &range,
                          .nranges = 1,
                          .g = g,
                          .len = len};
    return psstore_push(cl, &msg, timeout_ms);
}

int harness_model_create(const harness_redis_t *r, const char *name, const char *layers,
                         const char *loss, const float *w, size_t n)
{
    char errstr[512];
    psstore_conn_t *c = psstore_conn_new(r->url, 2000, errstr, sizeof(errstr));
    if (c == NULL) {
        fprintf(stderr, "harness: %s\n", errstr);
        return -1;
    }
    psstore_model_spec_t spec = {layers, loss, n, 1, NULL};
    fr_err_t err = psstore_model_create(c, name, &spec, w, 1);
    if (err != FR_OK)
        fprintf(stderr, "harness: model create %s: %s\n", name, psstore_conn_error(c));
    psstore_conn_destroy(c);
    return err == FR_OK ? 0 : -1;
}

int harness_model_weights(const harness_redis_t *r, const char *name, float *w, size_t n,
                          uint64_t *epoch, int64_t *version)
{
    return harness_model_weights_of(r, name, 0, w, n, epoch, version);
}

int harness_model_weights_of(const harness_redis_t *r, const char *name, int training, float *w,
                             size_t n, uint64_t *epoch, int64_t *version)
{
    char errstr[512];
    psstore_conn_t *c = psstore_conn_new(r->url, 2000, errstr, sizeof(errstr));
    if (c == NULL) {
        fprintf(stderr, "harness: %s\n", errstr);
        return -1;
    }
    fr_err_t err = training ? psstore_model_weights_training(c, name, w, n, epoch, version)
                            : psstore_model_weights(c, name, w, n, epoch, version);
    if (err != FR_OK)
        fprintf(stderr, "harness: weights of %s: %s\n", name, psstore_conn_error(c));
    psstore_conn_destroy(c);
    return err == FR_OK ? 0 : -1;
}
