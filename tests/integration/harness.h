/*
 * harness.h - integration test harness: real redis-server processes on
 * free loopback ports in temporary directories, started and stopped by
 * PID, and child processes (the freshet binary) with their output in a log.
 */
#ifndef FRESHET_TEST_HARNESS_H
#define FRESHET_TEST_HARNESS_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "psstore/psstore.h"

typedef struct harness_redis {
    pid_t pid;
    int port;
    char dir[256];  /* its working directory (AOF, log), removed on stop */
    char url[320];  /* redis://127.0.0.1:<port>/0 */
    char args[512]; /* extra arguments given at start, reused on restart */
} harness_redis_t;

/* A TCP port on 127.0.0.1 that was free a moment ago: closed again, so
 * another process may take it before the caller's server binds it. For a
 * port nothing should listen on, or for redis-server (which cannot bind
 * port 0 and say which port it got); a freshet server should listen on port
 * 0 and the test read its port from its log (harness_log_port). */
int harness_free_port(void);
/* A TCP port on 127.0.0.1 that nothing listens on (a connection is
 * refused) and that no other process can bind while *fd, a socket bound to
 * it but not listening, stays open: for a test of an unreachable server.
 * The caller closes *fd. -1 (and *fd -1) on failure. */
int harness_closed_port(int *fd);

/* Starts redis-server (extra_args: e.g. "--appendonly yes", may be NULL)
 * on a free port and waits until it has logged, under its own pid, that it
 * accepts connections, and answers PING: a PONG from another process's
 * server on the same port does not count. A server that cannot bind its
 * port exits, and the start is tried again on another (5 tries). Returns 0
 * or -1 (message on stderr). */
int harness_redis_start(harness_redis_t *r, const char *extra_args);
/* Stops it by PID (SIGTERM, then SIGKILL after 5 s) and keeps its dir. */
void harness_redis_kill(harness_redis_t *r, int sig);
/* Starts it again on the same port and dir (after a kill), and waits for
 * it as harness_redis_start does; -1 when it cannot bind the port (taken
 * meanwhile). */
int harness_redis_restart(harness_redis_t *r);
/* Stops it and removes its directory. */
void harness_redis_stop(harness_redis_t *r);

/* Runs "redis-cli -p PORT args..." style commands through hiredis and
 * returns the reply as text in out (integers as decimal, nil as "(nil)",
 * arrays joined by '\n'). Returns 0, or -1 on a connection error. */
int harness_redis_query(const harness_redis_t *r, char *out, size_t size, const char *fmt, ...);
/* The calls of command cmd (lower case) Redis counted since its start or
 * its last CONFIG RESETSTAT (INFO commandstats); 0 when none, -1 on a
 * connection error. */
int64_t harness_redis_calls(const harness_redis_t *r, const char *cmd);

/* ------------------------------------------------------------------------
 * A real Redis Cluster: masters x (1 + replicas) redis-server processes
 * with --cluster-enabled on free ports, joined by redis-cli --cluster
 * create, with cluster-node-timeout 2000 ms.
 * ---------------------------------------------------------------------- */
#define HARNESS_CLUSTER_MAX 9

typedef struct harness_cluster {
    harness_redis_t node[HARNESS_CLUSTER_MAX];
    int n;
    char url[600]; /* redis://127.0.0.1:<port>,... : every node a seed */
} harness_cluster_t;

/* Starts and joins the cluster and waits until every node reports
 * cluster_state:ok. Returns 0 or -1 (message on stderr; nothing left
 * running). */
int harness_cluster_start(harness_cluster_t *cl, int masters, int replicas);
/* Stops every node by PID and removes their directories. */
void harness_cluster_stop(harness_cluster_t *cl);
/* The index of the running master that serves key's slot, or -1. */
int harness_cluster_owner(const harness_cluster_t *cl, const char *key);
/* The 40-hex node id of node i into id[41]; 0 or -1. */
int harness_cluster_node_id(const harness_cluster_t *cl, int i, char *id);
/* Waits up to timeout_ms until every running node reports
 * cluster_state:ok, every replica's link to its master is up and a master
 * serves key; 0 or -1 (each node's view and log on stderr). */
int harness_cluster_wait_ok(const harness_cluster_t *cl, const char *key, int timeout_ms);
/* A running master other than node `not` (-1 for any), or -1. */
int harness_cluster_other_master(const harness_cluster_t *cl, int not_node);
/* Restarts a killed node and waits up to 30 s until the cluster serves key
 * and the node has rejoined as a replica with its link up (for a moment
 * after its restart it still believes it serves its old slots, empty). 0 or
 * -1. */
int harness_cluster_revive(harness_cluster_t *cl, int node, const char *key);
/* Moves key's slot from its master to node `to` while clients run:
 * IMPORTING/MIGRATING, MIGRATE of its keys one at a time (pause_ms between
 * keys), then SETSLOT NODE on every node. 0 or -1. */
int harness_cluster_migrate(const harness_cluster_t *cl, const char *key, int to, int pause_ms);

/* 1 in a build under AddressSanitizer or ThreadSanitizer (gcc or clang),
 * whose slowdown a timing bound or a long quality test must allow for,
 * else 0. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HARNESS_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define HARNESS_SANITIZED 1
#endif
#endif
#ifndef HARNESS_SANITIZED
#define HARNESS_SANITIZED 0
#endif

/* Forks and execs argv with stdout and stderr appended to log_path.
 * Returns the child's pid or -1. */
pid_t harness_spawn(char *const argv[], const char *log_path);
/* Waits up to timeout_ms for pid to exit; returns its wait status or -1
 * on timeout. */
int harness_wait(pid_t pid, int timeout_ms);
/* Kills (SIGKILL) and reaps every child harness_spawn started that is still
 * running: what a failed test left behind. harness_stack_stop calls it. */
void harness_kill_children(void);
/* harness_spawn, then harness_wait up to timeout_ms; a child still running
 * then is killed (SIGKILL) and reaped. Returns its wait status, or -1 on
 * timeout or when it could not be started. */
int harness_run(char *const argv[], const char *log_path, int timeout_ms);
/* Runs bin with the NULL-terminated arguments after it (harness_run) and
 * returns its exit status, or -1 when it did not exit normally within
 * timeout_ms. */
int harness_command(const char *log_path, int timeout_ms, const char *bin, ...);
/* Makes a private folder /tmp/freshet-test-NAME-XXXXXX into dir[256];
 * 0 or -1. */
int harness_tmpdir(char *dir, const char *name);
/* Removes a folder and everything in it; 0 or -1. */
int harness_rmdir(const char *dir);
/* Milliseconds sleep. */
void harness_sleep_ms(int ms);
/* Nonzero when the file contains needle. */
int harness_file_contains(const char *path, const char *needle);
/* How many times needle occurs in the file (0 when it cannot be read). */
int harness_file_count(const char *path, const char *needle);
/* Waits until the file holds needle at least count times: 0, or -1 once
 * timeout_ms passed without (the caller fails the test, saying what it
 * waited for). */
int harness_await_file(const char *path, const char *needle, int count, int timeout_ms);
/* The file's size in bytes, 0 when it does not exist: where the lines of a
 * child about to be started will begin in a log it appends to. */
long harness_file_size(const char *path);
/* The most gradients an applier had decided by the progress lines ("...,
 * applied N, ...", every 5 s) of the log after byte `from`, or -1 when
 * there is none. */
long harness_progress_applied(const char *log, long from);
/* The port freshet serve, run or ps listens on with [serve] listen =
 * 127.0.0.1:0 (the kernel picks a free port, so no other process can take
 * it in between), from the first "serve: listening on ... (port N)" line at
 * or after byte from of log; waits up to timeout_ms for it, then returns
 * -1 (message on stderr). */
int harness_log_port(const char *log, long from, int timeout_ms);

/* ------------------------------------------------------------------------
 * The dev broker: a "freshet broker" process on ports it picks itself.
 * ---------------------------------------------------------------------- */
typedef struct harness_broker {
    pid_t pid;
    char dir[256];       /* its temporary directory: bootstrap file and log */
    char log[320];       /* DIR/broker.log: its stdout and stderr */
    char bootstrap[512]; /* "127.0.0.1:port,..." */
} harness_broker_t;

/* Starts "bin broker --bootstrap-file DIR/bootstrap ARGS" (args split on
 * spaces, may be NULL) and waits up to 10 s for the bootstrap file. Returns
 * 0 or -1 (message on stderr; nothing left running). */
int harness_broker_start(harness_broker_t *b, const char *bin, const char *args);
/* Stops it by PID with SIGTERM (SIGKILL after 5 s) and removes its
 * directory. Returns its wait status, or -1 when it had to be killed or
 * was not running. */
int harness_broker_stop(harness_broker_t *b);

/* A Kafka test's world, in one call each way: a private folder
 * /tmp/freshet-test-NAME-XXXXXX in dir[256], a redis-server and "bin broker
 * broker_args". Start returns 0 or -1; stop stops both by PID and removes
 * the folder, returning 0 or -1. */
int harness_stack_start(char *dir, const char *name, harness_redis_t *r, harness_broker_t *b,
                        const char *bin, const char *broker_args);
int harness_stack_stop(const char *dir, harness_redis_t *r, harness_broker_t *b);

/* ------------------------------------------------------------------------
 * An applier in a thread of the test process.
 * ---------------------------------------------------------------------- */
typedef struct harness_applier {
    pthread_t tid;
    psstore_applier_t *a;
    atomic_int stop;
} harness_applier_t;

/* Creates the applier of conf and runs psstore_applier_run in a thread.
 * Returns 0, or -1 with the reason on stderr. */
int harness_applier_start(harness_applier_t *t, const psstore_applier_conf_t *conf);
/* Stops it (it commits and releases the lease), fills stats when not NULL
 * and frees it. */
void harness_applier_stop(harness_applier_t *t, psstore_applier_stats_t *stats);

/* Deterministic test gradients and models of the parameter store's tests:
 * g[n] uniform in [-0.5, 0.5) from seed; a model `name` of layers/loss with
 * weights w[n] created (replaced) in r's Redis; and its weights read back
 * with their epoch and version. The two Redis calls return 0, or -1 with
 * the reason on stderr. */
void harness_gradient(float *g, size_t n, uint64_t seed);
/* Pushes gradient g[len] through cl as worker "test/1/0" with a loss sum
 * of 1, covering positions [from, to) of partition of topic "t", computed
 * on (epoch, version); psstore_push's result. */
fr_err_t harness_push_range(psstore_client_t *cl, const float *g, size_t len, int32_t partition,
                            int64_t from, int64_t to, uint64_t epoch, int64_t version,
                            int timeout_ms);
int harness_model_create(const harness_redis_t *r, const char *name, const char *layers,
                         const char *loss, const float *w, size_t n);
/* The weights model name serves (its served average when it keeps one:
 * psstore_model_weights), or with training set its training weights
 * (psstore_model_weights_training). 0, or -1 after printing why. */
int harness_model_weights(const harness_redis_t *r, const char *name, float *w, size_t n,
                          uint64_t *epoch, int64_t *version);
int harness_model_weights_of(const harness_redis_t *r, const char *name, int training, float *w,
                             size_t n, uint64_t *epoch, int64_t *version);

/* One audit entry's fields (docs/operations.md "Check exactly-once with the
 * audit"); the strings are borrowed from the reply. */
typedef struct harness_audit_entry {
    long long first, last, partition, generation; /* -1, -1, -1, 0 when absent */
    unsigned long long epoch;
    const char *topic, *outcome; /* "" when absent */
} harness_audit_entry_t;

struct redisReply;
/* Reads an entry's field/value array (element[1] of an XRANGE item). */
void harness_audit_parse(const struct redisReply *kv, harness_audit_entry_t *e);

/* Counts, per position [0, n) of topic/partition (topic NULL: any), how
 * many audit entries of model with outcome `outcome` cover it, into
 * seen[n] (zeroed first); outcome NULL counts every outcome that marks
 * positions (all but "duplicate" and "replay"). Returns the number of matching entries, or -1
 * when Redis cannot be read. */
int harness_audit_count(const harness_redis_t *r, const char *model, const char *topic,
                        int32_t partition, const char *outcome, int *seen, int n);

/* ------------------------------------------------------------------------
 * An HTTP test client: curl through popen, its headers and body in files
 * under a temporary folder. The expect functions fail the test (cmocka).
 * ---------------------------------------------------------------------- */
typedef struct harness_resp {
    int code;           /* the HTTP status, 0 when curl got none */
    char headers[8192]; /* the headers as received (-D) */
    char *body;         /* the body, '\0'-terminated (never NULL) */
    size_t len;
    int exit_status; /* curl's wait status (pclose): 0 when it succeeded */
} harness_resp_t;

void harness_resp_free(harness_resp_t *r);
/* The file's contents, '\0'-terminated, its length in *len; NULL when it
 * cannot be opened. */
char *harness_read_file(const char *path, size_t *len);
/* curl -sS [args] http://127.0.0.1:port<path>: status, headers and body,
 * through the files tmp_dir/h.txt and tmp_dir/b.bin. */
/* POSTs body (JSON, written to a file in tmp_dir) to path, with extra curl
 * arguments (a Content-Type among them replaces application/json). */
void harness_post_json(int port, const char *tmp_dir, harness_resp_t *r, const char *path,
                       const char *body, const char *extra);
void harness_http(int port, const char *tmp_dir, harness_resp_t *r, const char *args,
                  const char *path);
/* The value of header name (case-insensitive) into out; 0 if present. */
int harness_resp_header(const harness_resp_t *r, const char *name, char *out, size_t size);
/* Fails unless the response has header name with the value want. */
void harness_expect_header(const harness_resp_t *r, const char *name, const char *want);
/* Fails unless the response has status code and, when needle is not
 * NULL, a body containing needle. */
void harness_expect(const harness_resp_t *r, int code, const char *needle);
/* Asks path on port every sleep_ms until it answers code (tries times at
 * most); r holds the last answer. */
void harness_await_code(int port, const char *tmp_dir, harness_resp_t *r, const char *path,
                        int code, int tries, int sleep_ms);
/* Sends raw bytes on a new connection to port and reads the answer (the
 * first size - 1 bytes, until the server closes or 3 s pass) into out. */
void harness_raw_exchange(int port, const char *bytes, char *out, size_t size);

#endif
