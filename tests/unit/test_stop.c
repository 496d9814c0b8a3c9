/*
 * test_stop.c - how a command stops (app/stop.c): SIGTERM and SIGINT set
 * app_stop, and the stop watchdog ends a stop that hangs with exit 1 and a
 * line naming the stage it hung in, on time, once.
 *
 * Each case runs in a child process (the watchdog exits its process) whose
 * stderr is a pipe read by the test.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "app/app.h"

typedef struct child {
    pid_t pid;
    int err; /* the read end of its stderr */
} child_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void spawn(child_t *c, void (*body)(void))
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    c->pid = fork();
    assert_true(c->pid >= 0);
    if (c->pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        body();
        _exit(0);
    }
    close(fds[1]);
    c->err = fds[0];
}

/* Waits up to limit_s for the child; returns its wait status and what it
 * wrote to stderr (into out[size]), -1 after killing it on the limit. */
static int reap(child_t *c, double limit_s, char *out, size_t size)
{
    size_t len = 0;
    double end = now_s() + limit_s;
    int status = -1;
    for (;;) {
        pid_t r = waitpid(c->pid, &status, WNOHANG);
        if (r == c->pid)
            break;
        if (now_s() > end) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, NULL, 0);
            status = -1;
            break;
        }
        struct pollfd p = {c->err, POLLIN, 0};
        if (poll(&p, 1, 20) == 1 && len + 1 < size) {
            ssize_t n = read(c->err, out + len, size - 1 - len);
            if (n > 0)
                len += (size_t)n;
        }
    }
    ssize_t n;
    while (len + 1 < size && (n = read(c->err, out + len, size - 1 - len)) > 0)
        len += (size_t)n;
    out[len] = '\0';
    close(c->err);
    return status;
}

static void hang_in_a_stage(void)
{
    app_stop_stage("the applier (its last commit)");
    app_stop_watchdog("run", 1);
    app_stop_watchdog("run", 60); /* once: the second call changes nothing */
    app_stop_stage("the Kafka client (rd_kafka_destroy)");
    for (;;)
        pause();
}

static void test_a_hung_stop_exits_1_naming_its_stage(void **state)
{
    (void)state;
    child_t c;
    double t0 = now_s();
    spawn(&c, hang_in_a_stage);
    char err[4096];
    int status = reap(&c, 90, err, sizeof(err));
    double took = now_s() - t0;
    assert_true(status != -1);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), APP_EXIT_FAILURE);
    /* 1 s, not the second call's 60: 30 s is 30 times the first, so that
     * only the second call's watchdog (or none) fails it, however loaded
     * the machine */
    assert_true(took >= 0.95 && took < 30);
    assert_non_null(strstr(err, "run: not stopped 1 s after the signal (hung in: the Kafka "
                                "client (rd_kafka_destroy)); exiting without a clean stop"));
}

/* A stop of 0.3 s under a watchdog of 10 s: far enough apart that a busy
 * machine's scheduling never puts the watchdog first. */
static void stop_in_time(void)
{
    app_stop_watchdog("ps", 10);
    struct timespec ts = {0, 300 * 1000000};
    nanosleep(&ts, NULL);
    fputs("clean stop\n", stderr);
    exit(0);
}

static void test_a_stop_in_time_is_left_alone(void **state)
{
    (void)state;
    child_t c;
    spawn(&c, stop_in_time);
    char err[4096];
    int status = reap(&c, 30, err, sizeof(err));
    assert_true(status != -1 && WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_string_equal(err, "clean stop\n");
}

static void wait_for_a_signal(void)
{
    /* blocked until sigsuspend: a signal between the check and the wait
     * is not missed */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &old);
    app_stop_on_signals(1);
    fputs("ready\n", stderr);
    while (!atomic_load(&app_stop))
        sigsuspend(&old);
    /* SIGPIPE is ignored: a write to a closed pipe is an error return */
    int fds[2];
    if (pipe(fds) != 0)
        _exit(3);
    close(fds[0]);
    if (write(fds[1], "x", 1) != -1 || errno != EPIPE)
        _exit(4);
    fputs("app_stop set\n", stderr);
    exit(0);
}

static void test_sigterm_and_sigint_set_app_stop(void **state)
{
    (void)state;
    int sigs[] = {SIGTERM, SIGINT};
    for (int i = 0; i < 2; i++) {
        child_t c;
        spawn(&c, wait_for_a_signal);
        char ready[7] = {0};
        size_t got = 0;
        while (got < 6) { /* the handlers are in place once it said so */
            ssize_t n = read(c.err, ready + got, 6 - got);
            assert_true(n > 0);
            got += (size_t)n;
        }
        assert_string_equal(ready, "ready\n");
        kill(c.pid, sigs[i]);
        char err[4096];
        int status = reap(&c, 10, err, sizeof(err));
        assert_true(status != -1 && WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        assert_string_equal(err, "app_stop set\n");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_hung_stop_exits_1_naming_its_stage),
        cmocka_unit_test(test_a_stop_in_time_is_left_alone),
        cmocka_unit_test(test_sigterm_and_sigint_set_app_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
