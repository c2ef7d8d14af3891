/*
 * rng.h — the reference workload's random numbers: counter-derived streams.
 *
 * Why not one global generator: a trajectory drawn on island 2 must be
 * reproducible on island 0, in the trainer, and in a rerun that ships full
 * checkpoints instead of patches.  So every random quantity comes from a
 * stream whose state is a pure function of its coordinates
 * (seed, domain, a, b, c) — e.g. (seed, SAMPLE, step, prompt, sample) — and
 * never of how many numbers someone else drew before.
 *
 * splitmix64 mixes the coordinates into a 64-bit key and expands the key into
 * the 256-bit state of xoshiro256** (Blackman & Vigna), the stream itself.
 * Header-only: everything is static inline.
 */
#ifndef RL_RNG_H
#define RL_RNG_H

#include <math.h>
#include <stdint.h>

/* Stream domains: the first coordinate, so that e.g. prompt 3 of step 5 and
 * sample 3 of step 5 never share a stream. */
enum { RL_RNG_INIT = 1, RL_RNG_PROMPT = 2, RL_RNG_SAMPLE = 3, RL_RNG_SFT = 4, RL_RNG_TEST = 99 };

typedef struct rl_rng {
    uint64_t s[4];
} rl_rng;

static inline uint64_t rl_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Stream for coordinates (seed, domain, a, b, c).  Each coordinate is folded
 * in through a full splitmix64 round, so nearby coordinates give unrelated
 * streams. */
static inline rl_rng rl_rng_stream(uint64_t seed, uint64_t domain, uint64_t a, uint64_t b,
                                   uint64_t c)
{
    uint64_t k = seed;
    uint64_t coords[4] = {domain, a, b, c};
    for (int i = 0; i < 4; i++) {
        uint64_t x = k ^ coords[i];
        k = rl_splitmix64(&x);
    }
    rl_rng r;
    for (int i = 0; i < 4; i++) r.s[i] = rl_splitmix64(&k);
    return r; /* splitmix64 output is never all-zero four times in a row */
}

static inline uint64_t rl_rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256** next output. */
static inline uint64_t rl_rng_next(rl_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rl_rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rl_rotl64(s[3], 45);
    return out;
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double rl_rng_uniform(rl_rng *r)
{
    return (double)(rl_rng_next(r) >> 11) * 0x1.0p-53;
}

/* Uniform integer in [0, n), n >= 1 (Lemire's multiply-shift; the bias of
 * at most n / 2^64 is irrelevant for n of a few dozen). */
static inline uint32_t rl_rng_below(rl_rng *r, uint32_t n)
{
    return (uint32_t)(((rl_rng_next(r) >> 32) * (uint64_t)n) >> 32);
}

/* Standard normal (Box-Muller; one of the pair is discarded, which keeps
 * the stream stateless beyond its xoshiro state). */
static inline double rl_rng_normal(rl_rng *r)
{
    double u1 = 1.0 - rl_rng_uniform(r); /* (0, 1]: log is finite */
    double u2 = rl_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif /* RL_RNG_H */
