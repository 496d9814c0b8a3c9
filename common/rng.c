/*
 * rng.c - xoshiro256** (Blackman and Vigna, 2018) seeded through splitmix64,
 * so that any 64-bit seed gives a well mixed state, and the FNV-1a hash
 * (Fowler, Noll and Vo). Written from the published algorithm descriptions.
 * fr_random is the unseeded source beside them: the kernel's bytes.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/common.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void fr_rng_seed(fr_rng_t *rng, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&x);
}

uint64_t fr_rng_next(fr_rng_t *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double fr_rng_uniform(fr_rng_t *rng)
{
    return (double)(fr_rng_next(rng) >> 11) * 0x1.0p-53;
}

uint64_t fr_rng_below(fr_rng_t *rng, uint64_t n)
{
    /* Rejection sampling: draws in the incomplete top interval are retried. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do {
        r = fr_rng_next(rng);
    } while (r >= limit);
    return r % n;
}

void fr_rng_shuffle(fr_rng_t *rng, uint32_t *idx, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)fr_rng_below(rng, i);
        uint32_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

uint64_t fr_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

fr_err_t fr_random(void *p, size_t n)
{
    unsigned char *q = p;
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(q + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    if (got == n)
        return FR_OK;
    /* a kernel without getrandom(2): the device */
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return FR_ERR_IO;
    ssize_t r = read(fd, q, n);
    close(fd);
    return r == (ssize_t)n ? FR_OK : FR_ERR_IO;
}

uint64_t fr_random_u64(void)
{
    uint64_t v = 0;
    if (fr_random(&v, sizeof(v)) != FR_OK || v == 0)
        v = fr_clock_mono_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ull;
    return v;
}
