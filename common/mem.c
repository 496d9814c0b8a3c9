/*
 * mem.c - memory helpers, and the thread facts that need _GNU_SOURCE (a
 * thread's name, the cores a process may use), and the growable array.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/common.h"

#define KEEP_MMAP_THRESHOLD (32 << 20) /* glibc's largest */
#define KEEP_TRIM_THRESHOLD (512 << 20)

void fr_mem_touch(void *p, size_t bytes)
{
    volatile unsigned char *q = p;
    for (size_t i = 0; i < bytes; i += 4096)
        q[i] = q[i];
    if (bytes > 0)
        q[bytes - 1] = q[bytes - 1];
}

void fr_mem_keep(void)
{
    /* mallopt fails only on out-of-range values; these are in range */
    mallopt(M_MMAP_THRESHOLD, KEEP_MMAP_THRESHOLD);
    mallopt(M_TRIM_THRESHOLD, KEEP_TRIM_THRESHOLD);
}

void fr_thread_name(const char *name)
{
    char buf[16];
    snprintf(buf, sizeof(buf), "%s", name);
    pthread_setname_np(pthread_self(), buf);
}

int fr_cpu_count(void)
{
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof(cpus), &cpus) != 0)
        return 1;
    int n = CPU_COUNT(&cpus);
    return n > 0 ? n : 1;
}

fr_err_t fr_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return FR_OK;
    size_t n = *cap ? *cap : 8;
    while (n < need) {
        if (n > SIZE_MAX / 2)
            return FR_ERR_NOMEM;
        n *= 2;
    }
    if (elem != 0 && n > SIZE_MAX / elem)
        return FR_ERR_NOMEM;
    void *q = realloc(*p, n * elem);
    if (q == NULL)
        return FR_ERR_NOMEM;
    *p = q;
    *cap = n;
    return FR_OK;
}
