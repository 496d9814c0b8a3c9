/*
 * fuzz_config.c - libFuzzer target for the configuration parser
 * (common/config.c): the input as an INI file (through a memory file, so
 * fopen reads it as a user's file), then each of its lines as a --set
 * assignment. A configuration that loads must hand back every key's value
 * in its type; a refused one must leave the previous one whole.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char errstr[512], path[64];
    int fd = memfd_create("freshet-fuzz.conf", 0);
    if (fd < 0)
        return 0;
    if (size > 0 && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    fr_config_t *cfg = fr_config_new();
    if (cfg == NULL) {
        close(fd);
        return 0;
    }
    if (fr_config_set(cfg, "model.layers=4-8-3", errstr, sizeof(errstr)) != FR_OK)
        abort();
    if (fr_config_load_file(cfg, path, errstr, sizeof(errstr)) != FR_OK &&
        strcmp(fr_config_get(cfg, "model", "layers"), "4-8-3") != 0)
        abort(); /* a refused file changed the configuration */
    /* the typed reads of keys of each type, whatever was loaded */
    (void)fr_config_get_int(cfg, "ingest", "batch");
    (void)fr_config_get_double(cfg, "controller", "lr");
    (void)fr_config_get_bool(cfg, "serve", "infer");
    if (fr_config_get(cfg, "redis", "url") == NULL)
        abort();
    for (size_t i = 0; i < fr_config_kafka_count(cfg); i++) {
        const char *k, *v;
        fr_config_kafka_at(cfg, i, &k, &v);
        if (k == NULL || v == NULL)
            abort();
    }
    /* each line as an override */
    char line[1024];
    size_t start = 0;
    for (size_t i = 0; i <= size; i++) {
        if (i < size && data[i] != '\n')
            continue;
        size_t n = i - start < sizeof(line) - 1 ? i - start : sizeof(line) - 1;
        memcpy(line, data + start, n);
        line[n] = '\0';
        if (memchr(line, '\0', n) == NULL)
            (void)fr_config_set(cfg, line, errstr, sizeof(errstr));
        start = i + 1;
    }
    fr_config_destroy(cfg);
    close(fd);
    return 0;
}
