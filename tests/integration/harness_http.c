/*
 * harness_http.c - the integration tests' HTTP client: curl through popen,
 * the status, headers and body of each answer, and the checks on them
 * (CMocka failures). Apart from harness.c so that the benchmarks, which
 * link the harness without CMocka, need none of it.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

/* ---- the HTTP test client ------------------------------------------------ */

void harness_resp_free(harness_resp_t *r)
{
    free(r->body);
    r->body = NULL;
}

char *harness_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    assert_non_null(p);
    *len = fread(p, 1, (size_t)n, f);
    p[*len] = '\0';
    fclose(f);
    return p;
}

void harness_http(int port, const char *tmp_dir, harness_resp_t *r, const char *args,
                  const char *path)
{
    char hdr[320], body[320], cmd[4096];
    snprintf(hdr, sizeof(hdr), "%s/h.txt", tmp_dir);
    snprintf(body, sizeof(body), "%s/b.bin", tmp_dir);
    snprintf(cmd, sizeof(cmd),
             "curl -sS --max-time 40 -D %s -o %s -w '%%{http_code}' %s 'http://127.0.0.1:%d%s'",
             hdr, body, args, port, path);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    char code[16] = "";
    if (fgets(code, sizeof(code), f) == NULL)
        code[0] = '\0';
    int status = pclose(f);
    memset(r, 0, sizeof(*r));
    r->code = atoi(code);
    r->exit_status = status;
    size_t hl = 0;
    char *h = harness_read_file(hdr, &hl);
    if (h != NULL) {
        snprintf(r->headers, sizeof(r->headers), "%s", h);
        free(h);
    }
    r->body = harness_read_file(body, &r->len);
    if (r->body == NULL) {
        r->body = calloc(1, 1);
        r->len = 0;
    }
    unlink(hdr);
    unlink(body);
}

void harness_post_json(int port, const char *tmp_dir, harness_resp_t *r, const char *path,
                       const char *body, const char *extra)
{
    char file[320], args[1024];
    snprintf(file, sizeof(file), "%s/post.json", tmp_dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs(body, f);
    fclose(f);
    snprintf(args, sizeof(args), "-X POST %s %s --data-binary @%s",
             strstr(extra, "Content-Type") ? "" : "-H 'Content-Type: application/json'", extra,
             file);
    harness_http(port, tmp_dir, r, args, path);
    unlink(file);
}

int harness_resp_header(const harness_resp_t *r, const char *name, char *out, size_t size)
{
    size_t n = strlen(name);
    for (const char *line = r->headers; *line; line = strchr(line, '\n') + 1) {
        if (strncasecmp(line, name, n) == 0 && line[n] == ':') {
            const char *v = line + n + 1;
            while (*v == ' ')
                v++;
            size_t len = strcspn(v, "\r\n");
            snprintf(out, size, "%.*s", (int)len, v);
            return 0;
        }
        if (strchr(line, '\n') == NULL)
            break;
    }
    return -1;
}

void harness_expect_header(const harness_resp_t *r, const char *name, const char *want)
{
    char got[512];
    if (harness_resp_header(r, name, got, sizeof(got)) != 0)
        fail_msg("no %s header in:\n%s", name, r->headers);
    if (strcmp(got, want) != 0)
        fail_msg("%s: '%s', expected '%s'", name, got, want);
}

void harness_expect(const harness_resp_t *r, int code, const char *needle)
{
    if (r->code != code)
        fail_msg("status %d, expected %d; body: %.*s", r->code, code, (int)r->len, r->body);
    if (needle != NULL && strstr(r->body, needle) == NULL)
        fail_msg("body lacks '%s': %.*s", needle, (int)r->len, r->body);
}

void harness_await_code(int port, const char *tmp_dir, harness_resp_t *r, const char *path,
                        int code, int tries, int sleep_ms)
{
    for (int i = 0; i < tries; i++) {
        harness_http(port, tmp_dir, r, "--max-time 3", path);
        if (r->code == code || i == tries - 1)
            return;
        harness_resp_free(r);
        harness_sleep_ms(sleep_ms);
    }
}

void harness_raw_exchange(int port, const char *bytes, char *out, size_t size)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    size_t len = strlen(bytes);
    assert_int_equal(write(fd, bytes, len), (ssize_t)len);
    size_t got = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (got + 1 < size && poll(&p, 1, 3000) > 0) {
        ssize_t n = read(fd, out + got, size - 1 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    out[got] = '\0';
    close(fd);
}
