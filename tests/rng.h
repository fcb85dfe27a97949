/* A small seeded PRNG for the tests: splitmix64, with uniform and normal draws. */
#ifndef FNORM_TESTS_RNG_H
#define FNORM_TESTS_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct rng {
  uint64_t state;
  double spare;   /* the second value of the last Box-Muller pair */
  int have_spare; /* whether spare is unused */
} rng;

/* A generator seeded with `seed`. */
static inline rng rng_seeded(uint64_t seed) {
  rng r;
  r.state = seed;
  r.spare = 0.0;
  r.have_spare = 0;
  return r;
}

static inline uint64_t rng_next(rng *r) {
  uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* splitmix64's finalizer alone: a well-mixed 64-bit value of x (to seed a stream of its own
 * from a seed and an index, streams that do not overlap as consecutive seeds would). */
static inline uint64_t rng_mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* Uniform in [0, 1), 53 random bits. */
static inline double rng_uniform(rng *r) {
  return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform in [lo, hi). */
static inline double rng_range(rng *r, double lo, double hi) {
  return lo + (hi - lo) * rng_uniform(r);
}

/* Standard normal (Box-Muller, both values of each pair used). */
static inline double rng_normal(rng *r) {
  double u1, u2, radius;
  if (r->have_spare) {
    r->have_spare = 0;
    return r->spare;
  }
  u1 = 1.0 - rng_uniform(r); /* (0, 1]: log is finite */
  u2 = rng_uniform(r);
  radius = sqrt(-2.0 * log(u1));
  r->spare = radius * sin(6.283185307179586 * u2);
  r->have_spare = 1;
  return radius * cos(6.283185307179586 * u2);
}

#endif /* FNORM_TESTS_RNG_H */
