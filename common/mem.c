/*
 * mem.c - memory helpers.
 */
#include "common/common.h"

void fr_mem_touch(void *p, size_t bytes)
{
    volatile unsigned char *q = p;
    for (size_t i = 0; i < bytes; i += 4096)
        q[i] = q[i];
    if (bytes > 0)
        q[bytes - 1] = q[bytes - 1];
}
