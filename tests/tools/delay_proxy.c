/*
 * delay_proxy.c - a TCP proxy that holds every byte for a fixed time each way:
 * the distant Redis that loopback figures lack, on a kernel without tc netem
 * (bench/README.md "A distant store"; where freshet pays round trips to
 * Redis: docs/design.md "Performance model", "The co-located fast path"). A
 * test and bench tool, not part of freshet.
 *
 *   delay_proxy --listen PORT --to HOST:PORT --delay-us N [--port-file F]
 *
 * Listens on 127.0.0.1:PORT (0: the kernel picks a free one, which no other
 * process can take before the bind), prints "delay_proxy: listening on
 * 127.0.0.1:P" and writes P to F through a rename, so a reader never sees half
 * of it. Each accepted connection gets its own connection to HOST:PORT; every
 * chunk read from either side is written to the other N microseconds after it
 * was read, so a request and its answer pay 2N more than on loopback.
 *
 * Design: one thread and one epoll set. A connection has two ends (0: the
 * client, 1: the target) and a FIFO per direction of chunks stamped with the
 * time they fall due; a direction is written from its head only, which keeps
 * the order, and a partial write keeps its offset into the head. A timerfd is
 * armed at the earliest head due (epoll_wait's timeout counts milliseconds,
 * too coarse for 250 us) and the timer slack is set to 1 ns. A write that
 * meets a full socket buffer waits for EPOLLOUT; a direction holding 64 MiB or
 * more stops reading its source until it drains below that. The end of the
 * stream read from one end is queued as an empty chunk, so the other end sees
 * the close N us later, after every byte before it, and then both ends close;
 * an error on either end closes both at once. SIGTERM and SIGINT (a signalfd)
 * end the loop; the connections are closed and the counts and CPU time are
 * printed on stderr. Bad arguments exit 2, a failure 1.
 */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define CHUNK_MAX  (64 * 1024)        /* bytes a read takes at most */
#define QUEUE_MAX  ((size_t)64 << 20) /* a direction stops reading at this */
#define DELAY_MAX  60000000UL         /* one minute, in us */
#define EVENTS_MAX 64

/* Bytes read from one end, due at the other at due_ns; len 0: the end of
 * the stream. */
typedef struct chunk {
    struct chunk *next;
    uint64_t due_ns;
    size_t len, off; /* off: bytes of it written already */
    char data[];
} chunk_t;

typedef struct {
    chunk_t *head, *tail;
    size_t bytes; /* data bytes queued (written ones included until the chunk goes) */
    int eof;      /* the source's end of stream was read: nothing more comes */
} queue_t;

typedef struct conn conn_t;

typedef struct {
    conn_t *c;
    int fd;        /* -1 once closed */
    int i;         /* 0: the client, 1: the target */
    uint32_t want; /* the events registered with epoll */
    int blocked;   /* a write to it met a full buffer (or its connect is under way) */
    int gone;      /* out of the epoll set: it hung up after its end of stream */
} end_t;

struct conn {
    conn_t *next;
    end_t end[2];
    queue_t q[2];   /* q[d]: read from end[d], written to end[1 - d] */
    int connecting; /* end[1]'s connect is under way */
    int dead;       /* closed; freed after the current batch of events */
};

typedef struct {
    int ep, lfd, tfd, sfd;
    struct sockaddr_storage to;
    socklen_t to_len;
    const char *to_text;
    uint64_t delay_ns;
    uint64_t armed_ns; /* the timerfd's expiry, 0: disarmed */
    conn_t *conns;
    unsigned long accepted, failed;
    unsigned long long moved[2]; /* bytes written: [0] to the target, [1] back */
} proxy_t;

/* epoll tags of the proxy's own descriptors; an end_t pointer otherwise */
static char tag_listen, tag_timer, tag_signal;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: delay_proxy --listen PORT --to HOST:PORT --delay-us N [--port-file F]\n"
                 "  forwards each connection to 127.0.0.1:PORT (0: any free port) to HOST:PORT,\n"
                 "  every byte N microseconds later each way\n");
}

/* ---- the connection: queues, interest, closing ------------------------- */

static void queue_free(queue_t *q)
{
    chunk_t *k = q->head;
    while (k) {
        chunk_t *next = k->next;
        free(k);
        k = next;
    }
    q->head = q->tail = NULL;
    q->bytes = 0;
}

/* Appends len bytes of data (len 0: the end of the stream) due at due_ns.
 * Returns 0, or -1 out of memory. */
static int queue_push(queue_t *q, const char *data, size_t len, uint64_t due_ns)
{
    chunk_t *k = malloc(sizeof(*k) + len);
    if (!k)
        return -1;
    k->next = NULL;
    k->due_ns = due_ns;
    k->len = len;
    k->off = 0;
    if (len)
        memcpy(k->data, data, len);
    if (q->tail)
        q->tail->next = k;
    else
        q->head = k;
    q->tail = k;
    q->bytes += len;
    return 0;
}

/* Closes both ends and drops what is queued; the struct stays until the
 * batch of events that may still name its ends has been handled. Closing a
 * descriptor takes it out of the epoll set. */
static void conn_kill(conn_t *c)
{
    if (c->dead)
        return;
    for (int i = 0; i < 2; i++) {
        if (c->end[i].fd >= 0)
            close(c->end[i].fd);
        c->end[i].fd = -1;
        queue_free(&c->q[i]);
    }
    c->dead = 1;
}

/* Registers the events end e needs now: its connect's completion, or
 * reading while its direction has room and the stream goes on, and
 * writability while a write waits. */
static void end_update(proxy_t *p, end_t *e)
{
    conn_t *c = e->c;
    uint32_t want = 0;
    if (e->fd < 0 || e->gone)
        return;
    if (e->i == 1 && c->connecting) {
        want = EPOLLOUT;
    } else {
        if (!c->q[0].eof && !c->q[1].eof && c->q[e->i].bytes < QUEUE_MAX)
            want |= EPOLLIN;
        if (e->blocked)
            want |= EPOLLOUT;
    }
    if (want == e->want)
        return;
    struct epoll_event ev = {.events = want, .data.ptr = e};
    if (epoll_ctl(p->ep, EPOLL_CTL_MOD, e->fd, &ev) != 0) {
        fprintf(stderr, "delay_proxy: epoll_ctl: %s\n", strerror(errno));
        conn_kill(c);
        return;
    }
    e->want = want;
}

/* ---- moving bytes ------------------------------------------------------- */

/* Writes the chunks of direction d that are due by now to end 1 - d, in
 * order, until one is not due or the socket is full. The end-of-stream
 * chunk closes the connection. What goes to an end that hung up is
 * dropped, as is what was going to an end whose write fails after it ended
 * its own stream (it left); a write that fails towards any other end
 * closes the connection. */
static void queue_flush(proxy_t *p, conn_t *c, int d, uint64_t now)
{
    queue_t *q = &c->q[d];
    end_t *dst = &c->end[1 - d];
    if (dst->gone) {
        queue_free(q);
        return;
    }
    while (!c->dead && q->head && q->head->due_ns <= now && !dst->blocked) {
        chunk_t *k = q->head;
        if (k->len == 0) {
            conn_kill(c);
            return;
        }
        ssize_t n = send(dst->fd, k->data + k->off, k->len - k->off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                dst->blocked = 1;
                break;
            }
            if (c->q[1 - d].eof) {
                queue_free(q);
                break;
            }
            conn_kill(c);
            return;
        }
        k->off += (size_t)n;
        p->moved[d] += (unsigned long long)n;
        if (k->off < k->len)
            continue;
        q->head = k->next;
        if (!q->head)
            q->tail = NULL;
        q->bytes -= k->len;
        free(k);
    }
    end_update(p, dst);
    end_update(p, &c->end[d]); /* it may read again */
}

/* Reads what end e has, each read a chunk due delay_ns later. Stops at
 * EAGAIN, at the end of the stream, or once its direction holds QUEUE_MAX
 * unless force (a hang-up: the rest of the stream is in the kernel's
 * buffer, bounded, and must be read to see the end). */
static void end_read(proxy_t *p, end_t *e, int force)
{
    static char buf[CHUNK_MAX];
    conn_t *c = e->c;
    queue_t *q = &c->q[e->i];
    while (!c->dead && !q->eof && (force || q->bytes < QUEUE_MAX)) {
        ssize_t n = recv(e->fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n < 0 || queue_push(q, buf, (size_t)n, now_ns() + p->delay_ns) != 0) {
            conn_kill(c);
            return;
        }
        if (n == 0)
            q->eof = 1;
    }
    end_update(p, &c->end[0]);
    end_update(p, &c->end[1]);
}

/* The target's connect ended: the connection goes on, or closes. */
static void end_connected(proxy_t *p, end_t *e)
{
    conn_t *c = e->c;
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(e->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    if (err == EINPROGRESS)
        return;
    if (err != 0) {
        fprintf(stderr, "delay_proxy: connect to %s: %s\n", p->to_text, strerror(err));
        p->failed++;
        conn_kill(c);
        return;
    }
    c->connecting = 0;
    e->blocked = 0;
    end_update(p, e);
}

/* An epoll event of end e: its connect ended, it can take more bytes (the
 * next tick writes them), it has bytes to read, or it hung up. */
static void end_event(proxy_t *p, end_t *e, uint32_t events)
{
    conn_t *c = e->c;
    if (c->dead)
        return;
    if (e->i == 1 && c->connecting) {
        end_connected(p, e);
        return;
    }
    if (events & EPOLLOUT)
        e->blocked = 0; /* queue_flush, after this batch, writes */
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        int force = (events & (EPOLLHUP | EPOLLERR)) != 0;
        if (force && c->q[e->i].eof) {
            /* It hung up after its end of stream: nothing more goes to it,
             * and epoll would report the hang-up again and again. What it
             * sent before still goes to the other end, then both close. */
            epoll_ctl(p->ep, EPOLL_CTL_DEL, e->fd, NULL);
            e->gone = 1;
            queue_free(&c->q[1 - e->i]);
            return;
        }
        end_read(p, e, force);
    }
}

/* ---- accepting ---------------------------------------------------------- */

static void nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int watch(proxy_t *p, int fd, uint32_t events, void *ptr)
{
    struct epoll_event ev = {.events = events, .data.ptr = ptr};
    return epoll_ctl(p->ep, EPOLL_CTL_ADD, fd, &ev);
}

/* A connection for accepted descriptor fd, its connect to the target
 * started. Returns 0, or -1 (fd closed, the reason printed). */
static int conn_open(proxy_t *p, int fd)
{
    conn_t *c = calloc(1, sizeof(*c));
    int tfd = socket(p->to.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (!c || tfd < 0)
        goto err;
    nodelay(fd);
    nodelay(tfd);
    if (connect(tfd, (struct sockaddr *)&p->to, p->to_len) != 0 && errno != EINPROGRESS)
        goto err;
    c->connecting = 1;
    for (int i = 0; i < 2; i++) {
        c->end[i] = (end_t){.c = c, .fd = i ? tfd : fd, .i = i};
        c->end[i].want = i ? EPOLLOUT : EPOLLIN;
        c->end[i].blocked = i; /* nothing is written before the connect ends */
    }
    if (watch(p, fd, EPOLLIN, &c->end[0]) != 0 || watch(p, tfd, EPOLLOUT, &c->end[1]) != 0)
        goto err;
    c->next = p->conns;
    p->conns = c;
    p->accepted++;
    return 0;
err:
    fprintf(stderr, "delay_proxy: a connection to %s: %s\n", p->to_text, strerror(errno));
    p->failed++;
    close(fd);
    if (tfd >= 0)
        close(tfd);
    free(c);
    return -1;
}

/* Takes every connection the listener holds. An accept that fails for want
 * of descriptors or memory is printed, and tried again at the next event,
 * which comes at once while the listener holds connections: a tool for
 * tests, it spins rather than refuses. */
static void accept_all(proxy_t *p)
{
    for (;;) {
        int fd = accept4(p->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            conn_open(p, fd);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            fprintf(stderr, "delay_proxy: accept: %s\n", strerror(errno));
        return;
    }
}

/* ---- the loop ------------------------------------------------------------ */

/* Writes every due chunk, frees the connections that closed, and arms the
 * timer at the earliest head still waiting for its time (a head waiting for
 * a full socket waits for EPOLLOUT instead). */
static void tick(proxy_t *p)
{
    uint64_t now = now_ns(), next = 0;
    for (conn_t **pc = &p->conns; *pc;) {
        conn_t *c = *pc;
        for (int d = 0; d < 2; d++)
            queue_flush(p, c, d, now);
        if (c->dead) {
            *pc = c->next;
            free(c);
            continue;
        }
        for (int d = 0; d < 2; d++) {
            chunk_t *k = c->q[d].head;
            if (k && !c->end[1 - d].blocked && (next == 0 || k->due_ns < next))
                next = k->due_ns;
        }
        pc = &c->next;
    }
    if (next == p->armed_ns)
        return;
    struct itimerspec its = {
        .it_value = {(time_t)(next / 1000000000ULL), (long)(next % 1000000000ULL)}};
    if (timerfd_settime(p->tfd, TFD_TIMER_ABSTIME, &its, NULL) != 0)
        fprintf(stderr, "delay_proxy: timerfd_settime: %s\n", strerror(errno));
    p->armed_ns = next;
}

/* Runs until SIGTERM or SIGINT. Returns 0, or 1 if epoll_wait failed. */
static int run(proxy_t *p)
{
    struct epoll_event evs[EVENTS_MAX];
    for (;;) {
        int n = epoll_wait(p->ep, evs, EVENTS_MAX, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            fprintf(stderr, "delay_proxy: epoll_wait: %s\n", strerror(errno));
            return 1;
        }
        for (int i = 0; i < n; i++) {
            void *tag = evs[i].data.ptr;
            if (tag == &tag_signal)
                return 0;
            if (tag == &tag_listen) {
                accept_all(p);
            } else if (tag == &tag_timer) {
                uint64_t expirations;
                if (read(p->tfd, &expirations, sizeof(expirations)) < 0 && errno != EAGAIN)
                    fprintf(stderr, "delay_proxy: timerfd: %s\n", strerror(errno));
                p->armed_ns = 0;
            } else {
                end_event(p, tag, evs[i].events);
            }
        }
        tick(p);
    }
}

/* ---- setting up ---------------------------------------------------------- */

/* Resolves "HOST:PORT" ("[v6]:PORT" too) into p->to. Returns 0, or -1
 * with the reason printed. */
static int parse_target(proxy_t *p, const char *text)
{
    char host[256];
    const char *colon = strrchr(text, ':');
    size_t len = colon ? (size_t)(colon - text) : 0;
    if (!colon || len == 0 || len >= sizeof(host) || colon[1] == '\0') {
        fprintf(stderr, "delay_proxy: --to expects HOST:PORT, got '%s'\n", text);
        return -1;
    }
    memcpy(host, text, len);
    host[len] = '\0';
    char *h = host;
    if (h[0] == '[' && h[len - 1] == ']') {
        h[len - 1] = '\0';
        h++;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai;
    int rc = getaddrinfo(h, colon + 1, &hints, &ai);
    if (rc != 0) {
        fprintf(stderr, "delay_proxy: --to %s: %s\n", text, gai_strerror(rc));
        return -1;
    }
    memcpy(&p->to, ai->ai_addr, ai->ai_addrlen);
    p->to_len = ai->ai_addrlen;
    p->to_text = text;
    freeaddrinfo(ai);
    return 0;
}

/* Parses an unsigned decimal no larger than max into *out. Returns 0 or -1. */
static int parse_ulong(const char *s, unsigned long max, unsigned long *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (s[0] < '0' || s[0] > '9' || *end != '\0' || errno != 0 || v > max)
        return -1;
    *out = v;
    return 0;
}

/* Writes port to path through path.tmp and a rename. Returns 0 or -1. */
static int write_port_file(const char *path, int port)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
        return -1;
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    int bad = fprintf(f, "%d\n", port) < 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* The listening socket on 127.0.0.1:port; returns the port it got, or -1. */
static int listen_on(proxy_t *p, unsigned long port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    int one = 1;
    p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (p->lfd < 0 || setsockopt(p->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(p->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(p->lfd, 512) != 0 ||
        getsockname(p->lfd, (struct sockaddr *)&sa, &len) != 0)
        return -1;
    return ntohs(sa.sin_port);
}

/* The epoll set with the listener, the timer and SIGTERM/SIGINT (blocked,
 * read from a signalfd). Returns 0, or -1 with errno set. */
static int setup_loop(proxy_t *p)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    if (sigprocmask(SIG_BLOCK, &set, NULL) != 0)
        return -1;
    signal(SIGPIPE, SIG_IGN);
    p->sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    p->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    p->ep = epoll_create1(EPOLL_CLOEXEC);
    if (p->sfd < 0 || p->tfd < 0 || p->ep < 0)
        return -1;
    if (watch(p, p->lfd, EPOLLIN, &tag_listen) != 0 || watch(p, p->tfd, EPOLLIN, &tag_timer) != 0 ||
        watch(p, p->sfd, EPOLLIN, &tag_signal) != 0)
        return -1;
    /* the default slack (50 us) would be a fifth of a 250 us delay */
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    return 0;
}

/* The counts and the CPU time, on stderr: the benchmarks read the CPU. */
static void report(const proxy_t *p)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(stderr,
            "delay_proxy: %lu connections (%lu failed), %llu bytes to the target, %llu back; "
            "cpu %.3f s user, %.3f s system\n",
            p->accepted, p->failed, p->moved[0], p->moved[1],
            (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6,
            (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6);
}

typedef struct {
    unsigned long port, delay_us;
    const char *to, *port_file;
} args_t;

/* Reads the command line into a. Returns 0, 1 for --help (printed), or 2
 * for bad arguments (the reason printed): main's exit status. */
static int parse_args(int argc, char **argv, args_t *a)
{
    static const struct option opts[] = {
        {"listen", required_argument, NULL, 'l'},   {"to", required_argument, NULL, 't'},
        {"delay-us", required_argument, NULL, 'd'}, {"port-file", required_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0}};
    const char *listen_arg = NULL, *delay_arg = NULL;
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'l': listen_arg = optarg; break;
        case 't': a->to = optarg; break;
        case 'd': delay_arg = optarg; break;
        case 'f': a->port_file = optarg; break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc || !listen_arg || !a->to || !delay_arg) {
        usage(stderr);
        return 2;
    }
    if (parse_ulong(listen_arg, 65535, &a->port) != 0 ||
        parse_ulong(delay_arg, DELAY_MAX, &a->delay_us) != 0) {
        fprintf(stderr, "delay_proxy: --listen expects 0..65535 and --delay-us 0..%lu\n",
                DELAY_MAX);
        return 2;
    }
    return 0;
}

/* Closes every connection and the proxy's own descriptors. */
static void proxy_close(proxy_t *p)
{
    while (p->conns) {
        conn_t *c = p->conns;
        p->conns = c->next;
        conn_kill(c);
        free(c);
    }
    close(p->ep);
    close(p->lfd);
    close(p->tfd);
    close(p->sfd);
}

int main(int argc, char **argv)
{
    proxy_t p = {.ep = -1, .lfd = -1, .tfd = -1, .sfd = -1};
    args_t a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    if (parse_target(&p, a.to) != 0)
        return 2;
    p.delay_ns = (uint64_t)a.delay_us * 1000;
    int port = listen_on(&p, a.port);
    if (port < 0 || setup_loop(&p) != 0) {
        fprintf(stderr, "delay_proxy: listening on 127.0.0.1:%lu: %s\n", a.port, strerror(errno));
        return 1;
    }
    printf("delay_proxy: listening on 127.0.0.1:%d, to %s, %lu us each way\n", port, a.to,
           a.delay_us);
    fflush(stdout);
    if (a.port_file && write_port_file(a.port_file, port) != 0) {
        fprintf(stderr, "delay_proxy: writing %s: %s\n", a.port_file, strerror(errno));
        return 1;
    }
    rc = run(&p);
    report(&p);
    proxy_close(&p);
    return rc;
}
