/*
 * bench_records.h - the 784-feature records that bench_consume and
 * bench_decode share: record number id has feature 0 = id (exact in
 * float32 below 2^24) and features 1..D-1 from a hash of (id, j), uniform
 * in [0, 1) ("%.9g" in csv: mostly "0.123456791") or, with ints, integers
 * 0..255 ("37"); its label is a class below BENCH_CLASSES.
 */
#ifndef FRESHET_BENCH_RECORDS_H
#define FRESHET_BENCH_RECORDS_H

#include <stdint.h>

#define BENCH_FEATURES 784
#define BENCH_CLASSES  10

/* splitmix64's finaliser */
static inline uint64_t bench_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static inline float bench_feature(int ints, uint64_t id, int j)
{
    uint64_t h = bench_mix(id * BENCH_FEATURES + (uint64_t)j);
    if (j == 0)
        return (float)id;
    return ints ? (float)(h % 256) : (float)(h >> 40) * 0x1p-24f;
}

static inline float bench_label(uint64_t id)
{
    return (float)(bench_mix(~id) % BENCH_CLASSES);
}

#endif
