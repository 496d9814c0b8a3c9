/*
 * chaos.c - the chaos suite (docs/operations.md "The chaos suite"): faults
 * injected in a random order into a `freshet run` that trains from a live
 * stream with the audit on, and exactly once checked after every recovery
 * twice: from the audit, and from the weights (ledger.h), which trusts
 * nothing freshet writes about itself.
 *
 * The world: a real redis-server (AOF, fsync always), the dev broker, a
 * producer thread streaming the ledger's records (ledger.h: a saturated
 * logistic regression whose weights are a sum over the records applied) at
 * CHAOS_RATE records/s over 4 partitions, `freshet run` (2 async workers,
 * batches of one, lease 5 s, its own serve) restarted like a supervisor
 * would when it dies, and a separate `freshet serve`. The fault kinds:
 *
 *   kill_run       SIGKILL of run, started again at once
 *   stop_run       SIGSTOP of run past its lease, then SIGCONT
 *   kill_serve     SIGKILL of the separate serve, started again at once
 *   stop_redis     SIGSTOP of redis-server for 3 s
 *   restart_redis  SIGKILL of redis-server, restarted on its AOF
 *   broker         every broker down for 3 s, then up
 *   descriptors    400 idle connections to run's HTTP port (run has 256
 *                  descriptors) for 3 s: training must go on
 *   poison         6 records of 3e38 and 6 of NaN in the stream: rejected,
 *                  the model never stops
 *
 * With CHAOS_SPLIT=1 the roles run apart instead of in one `freshet run`:
 * `freshet ps` and two `freshet train` (a consumer group), each started
 * again when it dies, the separate serve limited to 256 descriptors (the
 * descriptors kind aims at it), and run's two kinds become:
 *
 *   kill_train     SIGKILL of a trainer, started again at once (its
 *                  partitions come back through the group's rebalance)
 *   kill_ps        SIGKILL of ps, started again at once
 *   stop_ps        SIGSTOP of ps past its lease, then SIGCONT
 *
 * With CHAOS_SPARSE=1 the model is a sparse one (fields:39, 2^16 rows,
 * D = 4, FTRL; Criteo lines of one click in 8, batches of 4), whose
 * applier's table in run is written behind to Redis (docs/design.md "The
 * store written behind"): a kill or a Redis fault lands inside a window.
 * Its weights follow no ledger, so exactly once is checked from the audit
 * and the watermarks alone, and poison (a dense model's out-of-range
 * values) is not among its kinds; its serve is checked on /rows.
 *
 * With CHAOS_CLUSTER=1 the store is a Redis Cluster of 3 masters with a
 * replica each instead, and the two Redis kinds become:
 *
 *   kill_master    SIGKILL of the master serving the model (its replica
 *                  takes over), the node restarted as a replica after
 *   migrate        the model's slot moved to another master, key by key
 *
 * Recovery is measured from the end of the fault (the kill, the SIGCONT,
 * the restart, the brokers up, the connections closed, the poison
 * delivered) to the service working again: a new version applied (serve:
 * answering with the store's version; descriptors: /livez answering;
 * poison: every partition's watermark past the poison).
 *
 * Exactly once from the weights, after each recovery and at the end: the
 * producer held still, the ledger reads every record the topic holds with
 * a consumer of its own, waits for the store's bias to count them all, and
 * ledger.py recomputes the weights with numpy; they must equal Redis's w:0
 * bit for bit.
 *
 * Exactly once from the audit, after each recovery and at the end: the audit (read whole
 * each time: a fail-over may lose writes not yet replicated, the audit's
 * with the rest of their transaction) entries that mark positions (every outcome but duplicate and
 * replay) are counted per position; a position marked twice is doubled, a position below its
 * partition's watermark marked never is lost. The suite injects no
 * rollback or replay, so a position must be marked once across epochs (a
 * Redis restart starts a new epoch without undoing anything) and every
 * entry must be of generation 0.
 *
 * Profiles: CHAOS_PER_KIND faults of each kind (1 in the test command, 20
 * for a release check), CHAOS_SEED (default: the clock), CHAOS_KINDS (a
 * comma list, default all), CHAOS_RATE (records/s, default 1000),
 * CHAOS_OUT (a JSON report). Exit 0 when every fault recovered within 60 s,
 * nothing was lost or doubled in the audit, and the weights equalled the
 * ledger's every time.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "harness.h"
#include "ingest/ingest.h"
#include "ledger.h"

#define MODEL      "chaos"
#define TOPIC      "chaos"
#define NPARTS     4
#define D          LEDGER_FEATURES
#define RECOVER_MS 60000
#define RUN_FDS    256

enum kind {
    K_KILL_RUN,
    K_STOP_RUN,
    K_KILL_SERVE,
    K_STOP_REDIS,
    K_RESTART_REDIS,
    K_BROKER,
    K_DESCRIPTORS,
    K_POISON,
    K_KILL_MASTER,
    K_MIGRATE,
    K_KILL_TRAIN,
    K_KILL_PS,
    K_STOP_PS,
    NKINDS
};
static const char *const kind_name[NKINDS] = {
    "kill_run", "stop_run",    "kill_serve", "stop_redis", "restart_redis", "broker", "descriptors",
    "poison",   "kill_master", "migrate",    "kill_train", "kill_ps",       "stop_ps"};

static harness_redis_t redis;
static harness_cluster_t cl;
static int cluster_mode; /* CHAOS_CLUSTER=1: the store is cl, not redis */
static harness_broker_t broker;
static int split;  /* CHAOS_SPLIT=1: ps and two train instead of run */
static int sparse; /* CHAOS_SPARSE=1: a sparse model, its table written behind */
static char dir[256], conf[320], run_log[320], serve_log[320], ps_log[320], train_log[2][320];
static pid_t run_pid, serve_pid, ps_pid, train_pid[2];
static int serve_port;
static int lease_ms = 5000;

/* ---------------------------------------------------------------- stream */

static struct {
    pthread_t tid;
    ingest_producer_t *p;
    int rate;
    atomic_int stop, pause, paused, poison;
    atomic_llong sent;
} prod;

/* Record k of the sparse stream: a Criteo line (label, 13 counts, 26
 * categories) drawn from k, a click one time in 8, the categories from a
 * few thousand values a field (rows seen again, and new ones). */
static size_t sparse_record(int64_t k, char *out, size_t size)
{
    uint64_t h = (uint64_t)k * 0x9E3779B97F4A7C15ull + 1;
    int n = snprintf(out, size, "%d", (int)(h >> 61 == 0));
    for (int i = 0; i < 39 && n > 0 && (size_t)n < size; i++) {
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        n += i < 13 ? snprintf(out + n, size - (size_t)n, "\t%d", (int)(h >> 58))
                    : snprintf(out + n, size - (size_t)n, "\t%x", (unsigned)((h >> 33) % 4096));
    }
    return n > 0 && (size_t)n < size ? (size_t)n : 0;
}

static void *produce_loop(void *arg)
{
    (void)arg;
    int64_t k = 0;
    uint64_t t0 = fr_clock_mono_ns(), paused_at = 0;
    while (!atomic_load(&prod.stop)) {
        if (atomic_load(&prod.pause)) {
            if (paused_at == 0)
                paused_at = fr_clock_mono_ns();
            atomic_store(&prod.paused, 1);
            harness_sleep_ms(2);
            continue;
        }
        if (paused_at != 0) { /* the rate goes on from where it was, without a burst */
            t0 += fr_clock_mono_ns() - paused_at;
            paused_at = 0;
        }
        atomic_store(&prod.paused, 0);
        int64_t due = (int64_t)((double)(fr_clock_mono_ns() - t0) * 1e-9 * prod.rate);
        if (k >= due) {
            harness_sleep_ms(5);
            continue;
        }
        if (sparse) {
            char line[512];
            size_t len = sparse_record(k, line, sizeof(line));
            if (ingest_producer_send(prod.p, TOPIC, (int32_t)(k % NPARTS), NULL, 0, line, len, NULL,
                                     NULL) != FR_OK) {
                harness_sleep_ms(10);
                continue;
            }
            atomic_fetch_add(&prod.sent, 1);
            k++;
            continue;
        }
        float v[D + 1];
        ledger_record(k, v);
        int poison = atomic_load(&prod.poison);
        if (poison > 0) {
            /* half magnitude (finite, 3e38), half NaN */
            for (int i = 1; i <= D; i++)
                v[i] = poison % 2 ? 3e38f : NAN;
            atomic_fetch_sub(&prod.poison, 1);
        }
        if (ingest_producer_send(prod.p, TOPIC, (int32_t)(k % NPARTS), NULL, 0, v, sizeof(v), NULL,
                                 NULL) != FR_OK) {
            harness_sleep_ms(10);
            continue;
        }
        atomic_fetch_add(&prod.sent, 1);
        k++;
    }
    return NULL;
}

/* Holds the producer still and waits for every record sent so far to be
 * delivered; returns how many were delivered in all (-1 on a timeout). The
 * producer goes on after, unless hold (then producer_release). */
static int64_t producer_hold(int hold)
{
    atomic_store(&prod.pause, 1);
    while (!atomic_load(&prod.paused))
        harness_sleep_ms(1);
    uint64_t delivered = 0, failed = 0;
    fr_err_t err = ingest_producer_flush(prod.p, 30000, &delivered, &failed);
    if (!hold) {
        atomic_store(&prod.paused, 0);
        atomic_store(&prod.pause, 0);
    }
    if (failed != 0)
        fprintf(stderr, "chaos: %llu records failed delivery: %s\n", (unsigned long long)failed,
                ingest_producer_error(prod.p));
    return err == FR_OK ? (int64_t)delivered : -1;
}

static int64_t producer_sync(void)
{
    return producer_hold(0);
}

static void producer_release(void)
{
    atomic_store(&prod.paused, 0);
    atomic_store(&prod.pause, 0);
}

/* ----------------------------------------------------------------- store */

/* The Redis that serves the model: the one redis-server, or the cluster's
 * master of the model's slot (NULL while none does). */
static const harness_redis_t *store_node(void)
{
    if (!cluster_mode)
        return &redis;
    int owner = harness_cluster_owner(&cl, "freshet:{" MODEL "}:meta");
    return owner >= 0 ? &cl.node[owner] : NULL;
}

/* The integer reply of a Redis command (nil: 0), or -1 while Redis cannot
 * answer. */
static int64_t redis_int(const char *fmt, const char *a, const char *b)
{
    char out[128];
    const harness_redis_t *node = store_node();
    if (node == NULL || harness_redis_query(node, out, sizeof(out), fmt, a, b) != 0)
        return -1;
    if (strcmp(out, "(nil)") == 0)
        return 0;
    /* an offsets value is W, W;intervals or W@generation; anything else
     * (LOADING, MOVED, CLUSTERDOWN...) is an error: unknown */
    char *end;
    long long v = strtoll(out, &end, 10);
    return end != out && (*end == '\0' || *end == ';' || *end == '@') ? v : -1;
}

static int64_t store_version(void)
{
    return redis_int("GET freshet:{%s}:ver", MODEL, NULL);
}

/* The watermark of each partition into wm[NPARTS]; their sum, or -1. */
static int64_t watermarks(int64_t *wm)
{
    int64_t sum = 0;
    for (int p = 0; p < NPARTS; p++) {
        char field[64];
        snprintf(field, sizeof(field), TOPIC "/%d", p);
        int64_t v = redis_int("HGET freshet:{%s}:offsets %s", MODEL, field);
        if (v < 0)
            return -1;
        if (wm != NULL)
            wm[p] = v;
        sum += v;
    }
    return sum;
}

/* ------------------------------------------------------------ the audit */

static struct {
    int *marks[NPARTS];
    size_t cap[NPARTS];
    int64_t entries, doubled, lost, bad_generation;
    uint64_t epochs[64];
    int nepochs;
    char outcomes[16][32];
    int64_t outcome_positions[16];
    int noutcomes;
} au;

static void mark(int p, int64_t first, int64_t last)
{
    if (first < 0 || last < first || p < 0 || p >= NPARTS)
        return;
    if ((size_t)last >= au.cap[p]) {
        size_t cap = au.cap[p] ? au.cap[p] : 4096;
        while (cap <= (size_t)last)
            cap *= 2;
        int *grown = realloc(au.marks[p], cap * sizeof(int));
        if (grown == NULL)
            abort();
        memset(grown + au.cap[p], 0, (cap - au.cap[p]) * sizeof(int));
        au.marks[p] = grown;
        au.cap[p] = cap;
    }
    for (int64_t pos = first; pos <= last; pos++)
        if (++au.marks[p][pos] == 2)
            au.doubled++;
}

static void count_outcome(const char *o, int64_t positions)
{
    int i = 0;
    while (i < au.noutcomes && strcmp(au.outcomes[i], o) != 0)
        i++;
    if (i == au.noutcomes && au.noutcomes < 16)
        snprintf(au.outcomes[au.noutcomes++], sizeof(au.outcomes[0]), "%s", o);
    if (i < 16)
        au.outcome_positions[i] += positions;
}

/* Reads the whole audit again (what a fail-over lost is gone from it,
 * with the watermarks it moved); 0, or -1 while Redis cannot answer. */
static int audit_read(void)
{
    const harness_redis_t *node = store_node();
    redisContext *c = node != NULL ? redisConnect("127.0.0.1", node->port) : NULL;
    if (c == NULL || c->err) {
        if (c != NULL)
            redisFree(c);
        return -1;
    }
    for (int p = 0; p < NPARTS; p++)
        if (au.cap[p] > 0)
            memset(au.marks[p], 0, au.cap[p] * sizeof(int));
    au.entries = au.doubled = au.bad_generation = 0;
    au.nepochs = 0;
    memset(au.outcome_positions, 0, sizeof(au.outcome_positions));
    char last[64] = "-";
    for (;;) {
        char from[70];
        snprintf(from, sizeof(from), "%s%s", strcmp(last, "-") == 0 ? "" : "(", last);
        redisReply *r = redisCommand(c, "XRANGE freshet:{%s}:audit %s + COUNT 5000", MODEL, from);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
            if (r != NULL)
                freeReplyObject(r);
            redisFree(c);
            return -1;
        }
        for (size_t i = 0; i < r->elements; i++) {
            harness_audit_entry_t e;
            harness_audit_parse(r->element[i]->element[1], &e);
            au.entries++;
            int known = 0;
            for (int k = 0; k < au.nepochs; k++)
                known |= au.epochs[k] == e.epoch;
            if (!known && au.nepochs < 64)
                au.epochs[au.nepochs++] = e.epoch;
            if (e.generation != 0)
                au.bad_generation++;
            if (strcmp(e.outcome, "duplicate") == 0 || strcmp(e.outcome, "replay") == 0)
                continue;
            count_outcome(e.outcome, e.last - e.first + 1);
            mark((int)e.partition, e.first, e.last);
        }
        size_t n = r->elements;
        if (n > 0)
            snprintf(last, sizeof(last), "%s", r->element[n - 1]->element[0]->str);
        freeReplyObject(r);
        if (n < 5000)
            break;
    }
    redisFree(c);
    return 0;
}

/* Exactly once so far: the watermarks first, then the audit (an entry and
 * the watermark it moves are one transaction). Counts the positions lost
 * below the watermarks now; 0, or -1 while Redis cannot answer. */
static int check_exactly_once(int64_t *lost_now)
{
    int64_t wm[NPARTS];
    const harness_redis_t *node = store_node();
    int wm_failed = watermarks(wm) < 0, audit_failed = !wm_failed && audit_read() != 0;
    if (wm_failed || audit_failed) {
        static uint64_t said;
        if (fr_clock_mono_ns() - said > 1000000000u) { /* why, once a second */
            said = fr_clock_mono_ns();
            char out[256] = "";
            if (node != NULL)
                harness_redis_query(node, out, sizeof(out), "HGET freshet:{%s}:offsets %s", MODEL,
                                    TOPIC "/0");
            fprintf(stderr, "chaos: the store cannot be read (%s): %s (port %d): %s\n",
                    wm_failed ? "watermarks" : "audit",
                    node == NULL ? "no master serves the model" : "its master",
                    node != NULL ? node->port : 0, out);
        }
        return -1;
    }
    *lost_now = 0;
    for (int p = 0; p < NPARTS; p++)
        for (int64_t pos = 0; pos < wm[p]; pos++)
            if ((size_t)pos >= au.cap[p] || au.marks[p][pos] == 0)
                (*lost_now)++;
    return 0;
}

/* ------------------------------------------------------------- processes */

static pid_t spawn(const char *role, const char *log, int max_fds, const char *set)
{
    struct rlimit was, low;
    getrlimit(RLIMIT_NOFILE, &was);
    low = was;
    if (max_fds > 0 && (rlim_t)max_fds < was.rlim_cur)
        low.rlim_cur = (rlim_t)max_fds;
    setrlimit(RLIMIT_NOFILE, &low);
    char *argv[] = {FRESHET_BIN,          (char *)role, "--config", conf,
                    set ? "--set" : NULL, (char *)set,  NULL};
    pid_t pid = harness_spawn(argv, log);
    setrlimit(RLIMIT_NOFILE, &was);
    return pid;
}

/* The port of the last "serve: listening on" line of log (0: none). */
static int logged_port(const char *log)
{
    FILE *f = fopen(log, "r");
    if (f == NULL)
        return 0;
    char line[1024];
    int port = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *p = strstr(line, "serve: listening on ");
        const char *q = p != NULL ? strstr(p, "(port ") : NULL;
        if (q != NULL)
            port = atoi(q + 6);
    }
    fclose(f);
    return port;
}

/* GET path on port into resp[size] (what arrived in 2 s, '\0'-ended);
 * the status, 0 when nothing answered. */
static int http_exchange(int port, const char *path, char *resp, size_t size)
{
    resp[0] = '\0';
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char req[512];
    size_t got = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
        int n = snprintf(req, sizeof(req),
                         "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
        if (write(fd, req, (size_t)n) == n) {
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            while (got + 1 < size && poll(&pf, 1, 2000) > 0) {
                ssize_t r = read(fd, resp + got, size - 1 - got);
                if (r <= 0)
                    break;
                got += (size_t)r;
            }
        }
    }
    close(fd);
    resp[got] = '\0';
    int code = 0;
    return sscanf(resp, "HTTP/1.%*d %d", &code) == 1 ? code : 0;
}

/* GET path on port: the status, 0 when nothing answered; the value of
 * X-Freshet-Version into *version when asked. */
static int http_get(int port, const char *path, int64_t *version)
{
    char resp[4096];
    int code = http_exchange(port, path, resp, sizeof(resp));
    const char *v = strstr(resp, "X-Freshet-Version: ");
    if (version != NULL)
        *version = v != NULL ? strtoll(v + 19, NULL, 10) : -1;
    return code;
}

/* Stops every process started, by PID. */
static void stop_all(void)
{
    harness_kill_children();
    harness_broker_stop(&broker);
    if (cluster_mode)
        harness_cluster_stop(&cl);
    else
        harness_redis_stop(&redis);
}

/* SIGTERM or SIGINT (a test timeout, Ctrl-C): every process started is
 * killed by PID (kill(2) is async-signal-safe), the logs kept. */
static void on_signal(int sig)
{
    (void)sig;
    pid_t pids[7 + HARNESS_CLUSTER_MAX] = {run_pid,      serve_pid,    broker.pid, redis.pid,
                                           train_pid[0], train_pid[1], ps_pid};
    for (int i = 0; i < cl.n; i++)
        pids[7 + i] = cl.node[i].pid;
    for (size_t i = 0; i < sizeof(pids) / sizeof(pids[0]); i++)
        if (pids[i] > 0)
            kill(pids[i], SIGKILL);
    _exit(1);
}

/* Stops everything and exits 1, keeping the logs. */
static void die(const char *why)
{
    fprintf(stderr, "chaos: %s; logs kept in %s\n", why, dir);
    stop_all();
    exit(1);
}

static void start_run(void)
{
    run_pid = spawn("run", run_log, RUN_FDS, NULL);
    if (run_pid <= 0)
        die("cannot start freshet run");
}

static void start_ps(void)
{
    ps_pid = spawn("ps", ps_log, 0, NULL);
    if (ps_pid <= 0)
        die("cannot start freshet ps");
}

static void start_train(int i)
{
    train_pid[i] = spawn("train", train_log[i], 0, NULL);
    if (train_pid[i] <= 0)
        die("cannot start freshet train");
}

static void start_serve(void)
{
    char set[64];
    snprintf(set, sizeof(set), "serve.listen=127.0.0.1:%d", serve_port);
    serve_pid = spawn("serve", serve_log, split ? RUN_FDS : 0, set);
    if (serve_pid <= 0)
        die("cannot start freshet serve");
}

/* A supervisor's restart: a run or serve that exited is started again
 * (and said so). */
static void supervise(void)
{
    int status;
    if (run_pid > 0 && waitpid(run_pid, &status, WNOHANG) == run_pid) {
        fprintf(stderr, "chaos: freshet run exited (status %d); starting it again\n", status);
        start_run();
    }
    if (serve_pid > 0 && waitpid(serve_pid, &status, WNOHANG) == serve_pid) {
        fprintf(stderr, "chaos: freshet serve exited (status %d); starting it again\n", status);
        start_serve();
    }
    if (ps_pid > 0 && waitpid(ps_pid, &status, WNOHANG) == ps_pid) {
        fprintf(stderr, "chaos: freshet ps exited (status %d); starting it again\n", status);
        start_ps();
    }
    for (int i = 0; i < 2; i++)
        if (train_pid[i] > 0 && waitpid(train_pid[i], &status, WNOHANG) == train_pid[i]) {
            fprintf(stderr, "chaos: freshet train %d exited (status %d); starting it again\n", i,
                    status);
            start_train(i);
        }
}

/* Waits until a version above `above` is applied; ms waited, or -1. */
static int64_t await_version(int64_t above, uint64_t since_ns)
{
    for (;;) {
        supervise();
        int64_t v = store_version();
        uint64_t now = fr_clock_mono_ns();
        if (v > above)
            return (int64_t)((now - since_ns) / 1000000);
        if (now - since_ns > (uint64_t)RECOVER_MS * 1000000)
            return -1;
        harness_sleep_ms(5);
    }
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

/* --------------------------------------------------------------- faults */

/* The sum of run's rejected-record counters of reasons magnitude and
 * nonfinite on its /metrics; split, the records in the dead-letter topic
 * (-1 when it does not answer). */
static rd_kafka_t *dlq_rk; /* reads the dead-letter topic's end */

static int64_t rejected(void)
{
    if (split) { /* the trainers have no /metrics: what they sent to the dead-letter topic */
        char e[256];
        if (dlq_rk == NULL) {
            rd_kafka_conf_t *c = rd_kafka_conf_new();
            if (rd_kafka_conf_set(c, "bootstrap.servers", broker.bootstrap, e, sizeof(e)) !=
                    RD_KAFKA_CONF_OK ||
                (dlq_rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, e, sizeof(e))) == NULL) {
                rd_kafka_conf_destroy(c);
                return -1;
            }
        }
        int64_t lo, hi;
        return rd_kafka_query_watermark_offsets(dlq_rk, "chaos-dlq", 0, &lo, &hi, 5000) ==
                       RD_KAFKA_RESP_ERR_NO_ERROR
                   ? hi
                   : -1;
    }
    static char resp[1 << 18];
    if (http_exchange(logged_port(run_log), "/metrics", resp, sizeof(resp)) != 200)
        return -1;
    int64_t sum = 0;
    for (const char *l = resp; (l = strstr(l, "\nfreshet_ingest_records_rejected_total{")) != NULL;
         l++) {
        char labels[256];
        size_t len = strcspn(l + 1, "}\n");
        snprintf(labels, sizeof(labels), "%.*s", (int)len, l + 1);
        if (l[1 + len] == '}' && (strstr(labels, "reason=\"magnitude\"") != NULL ||
                                  strstr(labels, "reason=\"nonfinite\"") != NULL))
            sum += strtoll(l + 2 + len, NULL, 10);
    }
    return sum;
}

/* A line in run's log, so that its timestamps can be read against the
 * faults. */
static void log_marker(const char *kind)
{
    FILE *f = fopen(split ? ps_log : run_log, "a");
    if (f != NULL) {
        fprintf(f, "=== chaos: %s at unix ms %lld\n", kind, (long long)fr_clock_unix_ms());
        fclose(f);
    }
}

/* When the last fault ended (inject sets it): catch-up counts from here. */
static uint64_t fault_end_ns;

static uint64_t fault_ended(void)
{
    fault_end_ns = fr_clock_mono_ns();
    return fault_end_ns;
}

/* SIGKILL of an applier's process (run, ps), started again at once by
 * start: recovered at the next version applied. */
static int64_t kill_and_restart(pid_t pid, void (*start)(void))
{
    kill(pid, SIGKILL);
    harness_wait(pid, 5000);
    uint64_t t = fault_ended();
    start();
    return await_version(store_version(), t);
}

/* SIGSTOP of an applier's process past its lease, then SIGCONT: recovered
 * at the next version applied. */
static int64_t stop_past_lease(pid_t pid)
{
    kill(pid, SIGSTOP);
    harness_sleep_ms(lease_ms + 1000);
    int64_t v0 = store_version();
    kill(pid, SIGCONT);
    return await_version(v0, fault_ended());
}

/* Injects one fault and waits for the recovery; its time in ms, or -1. */
static int64_t inject(enum kind k)
{
    int64_t v0 = store_version();
    log_marker(kind_name[k]);
    uint64_t t;
    switch (k) {
    case K_KILL_RUN: return kill_and_restart(run_pid, start_run);
    case K_STOP_RUN: return stop_past_lease(run_pid);
    case K_KILL_SERVE: {
        kill(serve_pid, SIGKILL);
        harness_wait(serve_pid, 5000);
        t = fault_ended();
        start_serve();
        char path[128]; /* a sparse model's rows carry the version too */
        snprintf(path, sizeof(path),
                 sparse ? "/v2/models/%s/rows?ids=0" : "/v2/models/%s/weights?format=raw", MODEL);
        for (;;) {
            int64_t want = store_version(), got = -1;
            if (http_get(serve_port, path, &got) == 200 && got >= want)
                return (int64_t)((fr_clock_mono_ns() - t) / 1000000);
            if (fr_clock_mono_ns() - t > (uint64_t)RECOVER_MS * 1000000)
                return -1;
            harness_sleep_ms(5);
        }
    }
    case K_KILL_TRAIN: {
        /* the killed trainer's partitions are back when every partition
         * has a record delivered after the kill trained: the stream's
         * records go round-robin, so partition p then holds
         * d / NPARTS + (p < d % NPARTS) of the d delivered by the kill
         * (a watermark read at the kill would move at once, with the
         * gradients the dead trainer had pushed) */
        static int which;
        int i = which++ % 2;
        int64_t d = producer_sync(), wm[NPARTS];
        if (d < 0)
            return -1;
        kill(train_pid[i], SIGKILL);
        harness_wait(train_pid[i], 5000);
        t = fault_ended();
        start_train(i);
        for (;;) {
            supervise();
            int moved = 0;
            if (watermarks(wm) >= 0)
                for (int p = 0; p < NPARTS; p++)
                    moved += wm[p] > d / NPARTS + (p < d % NPARTS);
            if (moved == NPARTS)
                return (int64_t)((fr_clock_mono_ns() - t) / 1000000);
            if (fr_clock_mono_ns() - t > (uint64_t)RECOVER_MS * 1000000)
                return -1;
            harness_sleep_ms(5);
        }
    }
    case K_KILL_PS: return kill_and_restart(ps_pid, start_ps);
    case K_STOP_PS: return stop_past_lease(ps_pid);
    case K_STOP_REDIS:
        kill(redis.pid, SIGSTOP);
        harness_sleep_ms(3000);
        kill(redis.pid, SIGCONT);
        return await_version(v0, fault_ended());
    case K_RESTART_REDIS:
        harness_redis_kill(&redis, SIGKILL);
        if (harness_redis_restart(&redis) != 0) {
            fprintf(stderr, "chaos: redis-server did not restart\n");
            return -1;
        }
        t = fault_ended();
        return await_version(store_version(), t);
    case K_BROKER:
        kill(broker.pid, SIGUSR1);
        harness_sleep_ms(3000);
        v0 = store_version();
        kill(broker.pid, SIGUSR2);
        return await_version(v0, fault_ended());
    case K_DESCRIPTORS: {
        /* at run's port, or split at the serve's (both have 256) */
        const char *log = split ? serve_log : run_log;
        int port = logged_port(log);
        enum { N = 400 };
        static int fds[N];
        long log0 = file_size(log);
        for (int i = 0; i < N; i++) {
            fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
            struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            if (fds[i] >= 0)
                connect(fds[i], (struct sockaddr *)&a, sizeof(a));
        }
        harness_sleep_ms(500);
        v0 = store_version();
        harness_sleep_ms(2500);
        int64_t v1 = store_version();
        for (int i = 0; i < N; i++)
            if (fds[i] >= 0)
                close(fds[i]);
        t = fault_ended();
        long grew = file_size(log) - log0;
        if (v1 <= v0) {
            fprintf(stderr, "chaos: training stopped while descriptors ran out (v %lld)\n",
                    (long long)v0);
            return -1;
        }
        if (grew > 64 * 1024) {
            fprintf(stderr, "chaos: %s grew by %ld bytes while descriptors ran out\n", log, grew);
            return -1;
        }
        for (;;) {
            if (http_get(logged_port(log), "/livez", NULL) == 200)
                return (int64_t)((fr_clock_mono_ns() - t) / 1000000);
            if (fr_clock_mono_ns() - t > (uint64_t)RECOVER_MS * 1000000)
                return -1;
            harness_sleep_ms(5);
        }
    }
    case K_KILL_MASTER: {
        const char *key = "freshet:{" MODEL "}:meta";
        int victim = harness_cluster_owner(&cl, key);
        if (victim < 0)
            return -1;
        harness_redis_kill(&cl.node[victim], SIGKILL);
        t = fault_ended();
        v0 = -1;
        for (int waited = 0; v0 < 0 && waited < RECOVER_MS; waited += 10) {
            v0 = store_version(); /* the promoted replica's (writes may be lost) */
            harness_sleep_ms(10);
        }
        int64_t ms = await_version(v0, t);
        if (harness_cluster_revive(&cl, victim, key) != 0)
            return -1;
        return ms;
    }
    case K_MIGRATE: {
        const char *key = "freshet:{" MODEL "}:meta";
        int from = harness_cluster_owner(&cl, key), to = harness_cluster_other_master(&cl, from);
        if (from < 0 || to < 0 || harness_cluster_migrate(&cl, key, to, 5) != 0)
            return -1;
        t = fault_ended();
        return await_version(store_version(), t);
    }
    case K_POISON: {
        int64_t rej0 = rejected();
        atomic_store(&prod.poison, 12);
        while (atomic_load(&prod.poison) > 0)
            harness_sleep_ms(1);
        t = fault_ended();
        int64_t delivered = producer_sync();
        if (delivered < 0)
            return -1;
        for (;;) {
            supervise();
            int64_t sum = watermarks(NULL);
            if (sum >= delivered)
                break;
            if (fr_clock_mono_ns() - t > (uint64_t)RECOVER_MS * 1000000)
                return -1;
            harness_sleep_ms(5);
        }
        int64_t ms = (int64_t)((fr_clock_mono_ns() - t) / 1000000);
        char out[300];
        if (store_node() == NULL ||
            harness_redis_query(store_node(), out, sizeof(out), "HGET freshet:{%s}:meta stopped",
                                MODEL) != 0 ||
            strcmp(out, "(nil)") != 0) {
            fprintf(stderr, "chaos: the poison stopped the model (%s)\n", out);
            return -1;
        }
        int64_t rej1 = rejected();
        uint64_t asked = fr_clock_mono_ns();
        while (split && rej1 - rej0 < 12 && fr_clock_mono_ns() - asked < 10000000000u) {
            harness_sleep_ms(50); /* the trainers' dead letters are sent in the background */
            rej1 = rejected();
        }
        if (rej0 < 0 || rej1 - rej0 < 12) { /* a re-read rejects them again: more */
            fprintf(stderr, "chaos: %s %lld poison records rejected, not 12\n",
                    split ? "the dead-letter topic got" : "run counted", (long long)(rej1 - rej0));
            return -1;
        }
        return ms;
    }
    default: return -1;
    }
}

/* ------------------------------------------------------------------ main */

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (nearest rank) of n sorted values. */
static int64_t quantile(const int64_t *v, int n, double q)
{
    int i = (int)ceil(q * n) - 1;
    return n == 0 ? -1 : v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static int env_int(const char *name, int def)
{
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? atoi(v) : def;
}

/* The ledger model (ledger.h): batches of one, plain SGD at 2^-10, from
 * the ledger's initial weights; or (sparse) a sparse model at its defaults,
 * written behind in run. The sections all share follow the model's own. */
static void write_config(void)
{
    char init[320], model[512];
    if (sparse) {
        snprintf(model, sizeof(model),
                 "[model]\nname = " MODEL "\nsparse = fields:39,buckets:2^16,dim:4\n"
                 "[ingest]\nformat = criteo\nbatch = 4\n");
    } else {
        char log[320];
        snprintf(init, sizeof(init), "%s/init.safetensors", dir);
        snprintf(log, sizeof(log), "%s/ledger.log", dir);
        if (ledger_init(init, log) != 0)
            die("cannot write the ledger's initial weights (ledger.py init)");
        snprintf(model, sizeof(model),
                 "[model]\nname = " MODEL "\nlayers = " LEDGER_LAYERS
                 "\nloss = logistic\ninit = %s\n"
                 "[ingest]\nformat = f32\nbatch = 1\n"
                 "[trainer]\nmode = async\n"
                 "[controller]\nlr = " LEDGER_LR "\npolicy = constant\noptimizer = sgd\n",
                 init);
    }
    FILE *f = fopen(conf, "w");
    if (f == NULL) {
        perror(conf);
        exit(1);
    }
    fprintf(f,
            "%s"
            "[kafka]\nbootstrap.servers = %s\nsession.timeout.ms = 6000\n"
            "heartbeat.interval.ms = 500\n%s"
            "[ingest]\ntopic = " TOPIC "\ndead_letter_topic = chaos-dlq\n"
            "[redis]\nurl = %s\n"
            "[serve]\nlisten = 127.0.0.1:0\n"
            "[trainer]\nworkers = 2\nbackend = cpu\n"
            "[psstore]\naudit = true\nlease_ms = %d\n",
            model, broker.bootstrap, getenv("CHAOS_KAFKA") ? getenv("CHAOS_KAFKA") : "",
            cluster_mode ? cl.url : redis.url, lease_ms);
    fclose(f);
}

int main(void)
{
    int per_kind = env_int("CHAOS_PER_KIND", 1);
    uint64_t seed = (uint64_t)env_int("CHAOS_SEED", (int)(fr_clock_unix_ms() % 1000000));
    prod.rate = env_int("CHAOS_RATE", 1000);
    int want[NKINDS];
    const char *kinds = getenv("CHAOS_KINDS");
    cluster_mode = env_int("CHAOS_CLUSTER", 0) != 0;
    split = env_int("CHAOS_SPLIT", 0) != 0;
    sparse = env_int("CHAOS_SPARSE", 0) != 0;
    for (int k = 0; k < NKINDS; k++) {
        int store_kind = k == K_STOP_REDIS || k == K_RESTART_REDIS;
        int cluster_kind = k == K_KILL_MASTER || k == K_MIGRATE;
        int run_kind = k == K_KILL_RUN || k == K_STOP_RUN;
        int split_kind = k == K_KILL_TRAIN || k == K_KILL_PS || k == K_STOP_PS;
        want[k] = (kinds == NULL || *kinds == '\0' || strstr(kinds, kind_name[k]) != NULL) &&
                  !(cluster_mode ? store_kind : cluster_kind) && !(split ? run_kind : split_kind) &&
                  !(sparse && k == K_POISON);
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);

    if (harness_tmpdir(dir, "chaos") != 0 ||
        (cluster_mode
             ? harness_cluster_start(&cl, 3, 1)
             : harness_redis_start(&redis, "--appendonly yes --appendfsync always")) != 0 ||
        harness_broker_start(&broker, FRESHET_BIN, "--topic " TOPIC ":4 --topic chaos-dlq:1") !=
            0) {
        fprintf(stderr, "chaos: cannot start Redis and the dev broker\n");
        stop_all();
        return 1;
    }
    snprintf(conf, sizeof(conf), "%s/chaos.conf", dir);
    snprintf(run_log, sizeof(run_log), "%s/run.log", dir);
    snprintf(serve_log, sizeof(serve_log), "%s/serve.log", dir);
    snprintf(ps_log, sizeof(ps_log), "%s/ps.log", dir);
    for (int i = 0; i < 2; i++)
        snprintf(train_log[i], sizeof(train_log[i]), "%s/train%d.log", dir, i);
    write_config();
    char errstr[256];
    /* the stream's own producer retries a broker back from an outage within
     * a second: the recovery measured is run's, not the producer's backoff;
     * and it sends batches of ~25 records: the dev broker walks a
     * partition's batches on every fetch, and a long run of one-record
     * batches saturated it within minutes (docs/operations.md "The dev
     * broker's limits") */
    static const char *const props[][2] = {{"reconnect.backoff.max.ms", "1000"},
                                           {"linger.ms", "100"}};
    prod.p = ingest_producer_new(broker.bootstrap, props, 2, errstr, sizeof(errstr));
    if (prod.p == NULL)
        die(errstr);
    pthread_create(&prod.tid, NULL, produce_loop, NULL);
    if (split) {
        start_ps();
        start_train(0);
        start_train(1);
    } else {
        start_run();
    }
    /* the separate serve binds a port of the kernel's choice (a port found
     * free and closed could be taken before serve binds it), then keeps it
     * across its restarts */
    start_serve();
    for (uint64_t t = fr_clock_mono_ns(); (serve_port = logged_port(serve_log)) == 0;) {
        if (fr_clock_mono_ns() - t > (uint64_t)RECOVER_MS * 1000000u)
            die("freshet serve never said its port");
        supervise();
        harness_sleep_ms(20);
    }
    if (await_version(0, fr_clock_mono_ns()) < 0)
        die(split ? "freshet ps never applied a version" : "freshet run never applied a version");

    /* the plan: per_kind faults of each wanted kind, shuffled */
    int nplan = 0;
    enum kind *plan = calloc((size_t)(NKINDS * per_kind) + 1, sizeof(*plan));
    for (int k = 0; k < NKINDS; k++)
        for (int i = 0; want[k] && i < per_kind; i++)
            plan[nplan++] = (enum kind)k;
    fr_rng_t rng;
    fr_rng_seed(&rng, seed);
    for (int i = nplan - 1; i > 0; i--) {
        int j = (int)(fr_rng_uniform(&rng) * (i + 1));
        enum kind tmp = plan[i];
        plan[i] = plan[j];
        plan[j] = tmp;
    }
    printf("chaos: seed %llu, %d faults, %d records/s over %d partitions, %s, %s, %s\n",
           (unsigned long long)seed, nplan, prod.rate, NPARTS,
           sparse ? "a sparse model (exactly once from the audit; no ledger)"
                  : "the ledger's model",
           split ? "ps and two train" : "one run",
           cluster_mode ? "a Redis Cluster of 3 masters and 3 replicas" : "one redis-server (AOF)");

    int64_t *rec[NKINDS], *caught[NKINDS];
    int nrec[NKINDS] = {0}, failed = 0;
    for (int k = 0; k < NKINDS; k++) {
        rec[k] = calloc((size_t)per_kind + 1, sizeof(int64_t));
        caught[k] = calloc((size_t)per_kind + 1, sizeof(int64_t));
    }
    for (int i = 0; i < nplan; i++) {
        /* steady state first: a second of training since the last fault */
        int64_t v = store_version();
        harness_sleep_ms(1000);
        if (await_version(v, fr_clock_mono_ns()) < 0) {
            fprintf(stderr, "chaos: no training before fault %d\n", i + 1);
            failed++;
            break;
        }
        enum kind k = plan[i];
        int64_t ms = inject(k), behind = -1;
        if (ms >= 0) {
            /* caught up: every record delivered by now is trained (what a
             * fault left in flight comes back by the gap rule) */
            uint64_t end_ns = fault_end_ns;
            int64_t due = producer_sync();
            while (due >= 0 && fr_clock_mono_ns() - end_ns < (uint64_t)RECOVER_MS * 1000000u) {
                supervise();
                if (watermarks(NULL) >= due) {
                    behind = (int64_t)((fr_clock_mono_ns() - end_ns) / 1000000u);
                    break;
                }
                harness_sleep_ms(5);
            }
        }
        int64_t lost = 0;
        int tries = 0, checked = 0;
        while (!(checked = check_exactly_once(&lost) == 0) && tries++ < 100)
            harness_sleep_ms(50);
        if (!checked)
            fprintf(stderr, "chaos: the audit could not be read after fault %d\n", i + 1);
        printf("chaos: fault %3d/%d %-13s resumed in %6lld ms, caught up in %6lld ms; entries "
               "%lld, doubled %lld, lost %lld, epochs %d\n",
               i + 1, nplan, kind_name[k], (long long)ms, (long long)behind, (long long)au.entries,
               (long long)au.doubled, (long long)lost, au.nepochs);
        fflush(stdout);
        /* and from the weights, trusting nothing freshet wrote about itself */
        int ledger = sparse ? 0 : -1; /* a sparse model: the audit's check above */
        if (!sparse && ms >= 0 && producer_hold(1) >= 0) {
            ledger =
                ledger_check(broker.bootstrap, TOPIC, NPARTS, MODEL, store_node, dir, RECOVER_MS);
            producer_release();
        }
        if (ms < 0 || behind < 0 || !checked || lost != 0 || au.doubled != 0 ||
            au.bad_generation != 0 || ledger != 0) {
            failed++;
            fprintf(stderr, "chaos: fault %d (%s) failed; logs in %s\n", i + 1, kind_name[k], dir);
            break;
        }
        caught[k][nrec[k]] = behind;
        rec[k][nrec[k]++] = ms;
    }

    /* the end: the stream stops, every record delivered is trained once */
    atomic_store(&prod.stop, 1);
    pthread_join(prod.tid, NULL);
    uint64_t delivered = 0, failed_delivery = 0;
    ingest_producer_flush(prod.p, 30000, &delivered, &failed_delivery);
    int64_t lost = 0, sum = 0;
    uint64_t t = fr_clock_mono_ns();
    while (!failed && (sum = watermarks(NULL)) < (int64_t)delivered &&
           fr_clock_mono_ns() - t < (uint64_t)RECOVER_MS * 1000000) {
        supervise();
        harness_sleep_ms(50);
    }
    if (check_exactly_once(&lost) != 0 || sum < (int64_t)delivered)
        failed++;
    else if (!sparse &&
             ledger_check(broker.bootstrap, TOPIC, NPARTS, MODEL, store_node, dir, RECOVER_MS) != 0)
        failed++;
    ledger_fini();
    kill(serve_pid, SIGTERM);
    pid_t roles[3] = {split ? ps_pid : run_pid, split ? train_pid[0] : 0, split ? train_pid[1] : 0};
    for (int i = 0; i < 3; i++)
        if (roles[i] > 0)
            kill(roles[i], SIGTERM);
    harness_wait(serve_pid, 20000);
    for (int i = 0; i < 3; i++) {
        if (roles[i] <= 0)
            continue;
        int status = harness_wait(roles[i], 30000); /* past the roles' own 20 s stop watchdog */
        if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "chaos: freshet %s did not exit 0 on SIGTERM (status %d)\n",
                    !split   ? "run"
                    : i == 0 ? "ps"
                             : "train",
                    status);
            failed++;
        }
    }

    printf("\n| kind | faults | resumed p50 (ms) | p99 | max | caught up p50 (ms) | p99 | max |\n"
           "| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    FILE *out = getenv("CHAOS_OUT") ? fopen(getenv("CHAOS_OUT"), "w") : NULL;
    if (out != NULL)
        fprintf(out, "{\"seed\": %llu, \"rate\": %d, \"kinds\": {", (unsigned long long)seed,
                prod.rate);
    int first = 1;
    for (int k = 0; k < NKINDS; k++) {
        if (nrec[k] == 0)
            continue;
        qsort(rec[k], (size_t)nrec[k], sizeof(int64_t), cmp_i64);
        qsort(caught[k], (size_t)nrec[k], sizeof(int64_t), cmp_i64);
        int64_t p50 = quantile(rec[k], nrec[k], 0.5), p99 = quantile(rec[k], nrec[k], 0.99);
        int64_t c50 = quantile(caught[k], nrec[k], 0.5), c99 = quantile(caught[k], nrec[k], 0.99);
        printf("| %s | %d | %lld | %lld | %lld | %lld | %lld | %lld |\n", kind_name[k], nrec[k],
               (long long)p50, (long long)p99, (long long)rec[k][nrec[k] - 1], (long long)c50,
               (long long)c99, (long long)caught[k][nrec[k] - 1]);
        if (out != NULL)
            fprintf(out,
                    "%s\"%s\": {\"faults\": %d, \"resumed_p50_ms\": %lld, \"resumed_p99_ms\": "
                    "%lld, \"caught_up_p50_ms\": %lld, \"caught_up_p99_ms\": %lld}",
                    first ? "" : ", ", kind_name[k], nrec[k], (long long)p50, (long long)p99,
                    (long long)c50, (long long)c99);
        first = 0;
    }
    printf("\nrecords delivered %llu, positions trained %lld (audit entries %lld, epochs %d): "
           "lost %lld, doubled %lld\n",
           (unsigned long long)delivered, (long long)sum, (long long)au.entries, au.nepochs,
           (long long)lost, (long long)au.doubled);
    printf("positions by outcome:");
    for (int i = 0; i < au.noutcomes; i++)
        printf(" %s %lld", au.outcomes[i], (long long)au.outcome_positions[i]);
    printf("\n");
    if (out != NULL) {
        fprintf(out,
                "}, \"delivered\": %llu, \"trained\": %lld, \"lost\": %lld, \"doubled\": %lld, "
                "\"failed\": %d}\n",
                (unsigned long long)delivered, (long long)sum, (long long)lost,
                (long long)au.doubled, failed);
        fclose(out);
    }
    ingest_producer_destroy(prod.p);
    if (dlq_rk != NULL)
        rd_kafka_destroy(dlq_rk);
    free(plan);
    for (int k = 0; k < NKINDS; k++) {
        free(rec[k]);
        free(caught[k]);
    }
    for (int p = 0; p < NPARTS; p++)
        free(au.marks[p]);
    int ok = !failed && lost == 0 && au.doubled == 0 && au.bad_generation == 0;
    stop_all();
    if (ok && getenv("CHAOS_KEEP") == NULL)
        harness_rmdir(dir);
    else if (ok)
        fprintf(stderr, "chaos: logs kept in %s\n", dir);
    else
        fprintf(stderr, "chaos: FAILED; logs kept in %s\n", dir);
    return ok ? 0 : 1;
}
