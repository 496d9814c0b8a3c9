/*
 * fuzz_grad.c - libFuzzer target for the gradient message decoder: the
 * input is split on '\n' into alternating field names and values (as a
 * stream entry would carry them) and decoded for a 4-parameter model. Every
 * value lives in its own exact-size allocation so ASan sees any over-read.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/grads/grads_int.h"

#define MAX_PARTS 32

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ps_grad_msg_t msg; /* reused, as the applier does */
    char *parts[MAX_PARTS];
    size_t lens[MAX_PARTS], n = 0, start = 0;
    for (size_t i = 0; i <= size && n < MAX_PARTS; i++) {
        if (i == size || data[i] == '\n') {
            lens[n] = i - start;
            parts[n] = malloc(lens[n] ? lens[n] : 1);
            memcpy(parts[n], data + start, lens[n]);
            n++;
            start = i + 1;
        }
    }
    size_t nf = n / 2;
    const char *fields[MAX_PARTS / 2], *vals[MAX_PARTS / 2];
    size_t flens[MAX_PARTS / 2], vlens[MAX_PARTS / 2];
    for (size_t i = 0; i < nf; i++) {
        fields[i] = parts[2 * i];
        flens[i] = lens[2 * i];
        vals[i] = parts[2 * i + 1];
        vlens[i] = lens[2 * i + 1];
    }
    char why[256];
    if (ps_grad_decode(&msg, nf, fields, flens, vals, vlens, 4, why, sizeof(why)) == FR_OK) {
        const psstore_grad_t *g = &msg.g;
        if (g->nranges == 0 || (g->n > 0 && g->len != 4) || (g->n == 0 && g->reason == NULL))
            abort(); /* the decoder's contract broken */
        for (size_t i = 0; i < g->nranges; i++)
            if (g->ranges[i].from >= g->ranges[i].to || g->ranges[i].partition < 0)
                abort();
    }
    for (size_t i = 0; i < n; i++)
        free(parts[i]);
    return 0;
}
