/*
 * stop.c - how a long-running command stops: SIGINT and SIGTERM set
 * app_stop, the command names the stage of its stop it is in, and a
 * watchdog ends a stop that hangs (docs/operations.md, "One machine:
 * `freshet run`", its last paragraph).
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "app/app.h"

/* A signal handler may touch an atomic object only when it is lock-free. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "app_stop is set by a signal handler");
atomic_int app_stop;

static void on_stop_signal(int sig)
{
    (void)sig;
    atomic_store(&app_stop, 1);
}

static _Atomic(const char *) stop_stage = "stopping";

void app_stop_stage(const char *stage)
{
    atomic_store(&stop_stage, stage);
}

typedef struct watchdog {
    const char *cmd;
    int seconds;
} watchdog_t;

static void *watchdog_main(void *arg)
{
    watchdog_t *w = arg;
    struct timespec ts = {w->seconds, 0};
    while (nanosleep(&ts, &ts) != 0) {
    }
    fr_log(FR_LOG_ERROR,
           "%s: not stopped %d s after the signal (hung in: %s); exiting without a clean stop",
           w->cmd, w->seconds, atomic_load(&stop_stage));
    _exit(APP_EXIT_FAILURE);
    return NULL;
}

void app_stop_watchdog(const char *cmd, int seconds)
{
    static watchdog_t w;
    static atomic_int started;
    if (atomic_exchange(&started, 1))
        return;
    w.cmd = cmd;
    w.seconds = seconds;
    pthread_t tid;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&tid, &attr, watchdog_main, &w) != 0)
        fr_log(FR_LOG_WARN, "%s: no stop watchdog (thread creation failed)", cmd);
    pthread_attr_destroy(&attr);
}

void app_stop_on_signals(int ignore_sigpipe)
{
    struct sigaction sa = {.sa_handler = on_stop_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (ignore_sigpipe)
        signal(SIGPIPE, SIG_IGN); /* a client that hangs up is an error return, not a signal */
}
