/*
 * fuzz_replay.c - libFuzzer target for replay requests (psstore/positions/replayspec.c):
 * the input as a stored replay text, and split at its first newline into a
 * command-line verb and its argument. Whatever parses must format, and
 * what it formats must parse back to the same request (a replay stored by
 * one process is read by another); anything else aborts.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "psstore/positions/positions.h"

/* Checks the round trip of a parsed request: format, parse, format again,
 * the same text. */
static void round_trip(const psstore_replay_t *r)
{
    static psstore_replay_t back;
    static char a[PSSTORE_REPLAY_SPEC_MAX], b[PSSTORE_REPLAY_SPEC_MAX];
    char errstr[256];
    if (psstore_replay_format(r, a, sizeof(a)) != FR_OK)
        return; /* too long to store, or refused: never stored */
    if (psstore_replay_parse(&back, a, strlen(a), errstr, sizeof(errstr)) != FR_OK)
        abort(); /* a text format wrote that parse refuses */
    if (psstore_replay_format(&back, b, sizeof(b)) != FR_OK || strcmp(a, b) != 0)
        abort(); /* the request changed on the way */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static psstore_replay_t r; /* large: 16 KB of partitions */
    char errstr[256];
    char *copy = malloc(size ? size : 1); /* exact size: ASan sees an over-read */
    memcpy(copy, data, size);
    if (psstore_replay_parse(&r, copy, size, errstr, sizeof(errstr)) == FR_OK)
        round_trip(&r);
    free(copy);

    const uint8_t *nl = memchr(data, '\n', size);
    if (nl != NULL && size < 4096) {
        char verb[4096], arg[4096];
        size_t vl = (size_t)(nl - data), al = size - vl - 1;
        memcpy(verb, data, vl);
        verb[vl] = '\0';
        memcpy(arg, nl + 1, al);
        arg[al] = '\0';
        if (psstore_replay_from_verb(&r, verb, al > 0 ? arg : NULL, 1796000000000, errstr,
                                     sizeof(errstr)) == FR_OK)
            round_trip(&r);
    }
    return 0;
}
