/*
 * fuzz_http.c - libFuzzer target for serve's request path: each input is
 * sent as raw bytes over a loopback connection to one freshet serve
 * started at the first input (its store unreachable: the routes answer
 * from what they parse, refuse or 503), the write side is then shut, and
 * the answer read to its end. libevent's parser, the header checks, the
 * Host rule, the token check, the routes' parameter parsing and the error
 * answers all run on the server's loop thread under ASan/UBSan; a crash
 * there ends the process, which libFuzzer reports with the input.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "serve/serve.h"

static int port;

/* The server, once: loopback, a token, a store nobody listens on. */
static void start(void)
{
    static fr_metrics_t *metrics;
    static serve_t *s;
    char errstr[512];
    serve_conf_t conf;
    signal(SIGPIPE, SIG_IGN);
    fr_log_set_level(FR_LOG_ERROR);
    metrics = fr_metrics_new();
    serve_conf_init(&conf);
    conf.listen = "127.0.0.1:0";
    conf.redis_url = "redis://127.0.0.1:1/0";
    conf.model = "m";
    conf.token = "fuzz-token";
    conf.chartjs = "";
    conf.max_body = 4096;
    conf.metrics = metrics;
    s = serve_new(&conf, errstr, sizeof(errstr));
    if (s == NULL || serve_start(s, errstr, sizeof(errstr)) != FR_OK) {
        fprintf(stderr, "fuzz_http: %s\n", errstr);
        abort();
    }
    port = serve_port(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (port == 0)
        start();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    for (size_t off = 0; off < size;) {
        ssize_t n = write(fd, data + off, size - off);
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    shutdown(fd, SHUT_WR); /* the end of the request: the server answers or closes */
    char buf[65536];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (poll(&p, 1, 2000) > 0 && read(fd, buf, sizeof(buf)) > 0) {
    }
    close(fd);
    return 0;
}
