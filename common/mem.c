/*
 * mem.c - memory helpers.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>

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
