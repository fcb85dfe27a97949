#include "halfconv.h"

#include <string.h>

uint32_t f32_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  return bits;
}

float f32_from_bits(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

/* Drops the low `shift` bits of `mant`, rounding to nearest with ties to even. A carry out
 * of the kept bits is correct: it moves the value to the next binade (or to infinity). */
static uint32_t round_shift_rne(uint32_t mant, int shift) {
  uint32_t kept = mant >> shift;
  uint32_t rest = mant & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (kept & 1u)))
    kept++;
  return kept;
}

uint16_t f32_to_f16(float value) {
  uint32_t bits = f32_bits(value);
  uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
  uint32_t mag = bits & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) /* NaN: keep the top payload bits and force a quiet NaN */
    return (uint16_t)(sign | 0x7E00u | ((mag >> 13) & 0x03FFu));
  if (mag >= 0x477FF000u) /* >= 65520, the midpoint above 65504, rounds to infinity */
    return (uint16_t)(sign | 0x7C00u);
  if (mag >= 0x38800000u) { /* normal binary16: >= 2^-14 */
    uint32_t exponent = (mag >> 23) - 127u + 15u;
    uint32_t mant = (exponent << 23) | (mag & 0x007FFFFFu);
    /* exponent and mantissa rounded together so that a carry bumps the exponent */
    return (uint16_t)(sign | round_shift_rne(mant, 13));
  }
  {
    /* Subnormal binary16 (or zero): count in units of 2^-24. The float is m * 2^(e - 23)
     * with m the 24-bit significand, so the unit count is m >> -(e + 1). */
    int e = (int)(mag >> 23) - 127;
    int shift = -(e + 1);
    uint32_t m = (mag & 0x007FFFFFu) | 0x00800000u;
    if (shift > 24) /* below 2^-25 (float subnormals included): rounds to zero */
      return sign;
    return (uint16_t)(sign | round_shift_rne(m, shift));
  }
}

float f16_to_f32(uint16_t bits) {
  uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1Fu;
  uint32_t mant = bits & 0x03FFu;
  if (exponent == 0x1Fu)
    return f32_from_bits(sign | 0x7F800000u | (mant << 13));
  if (exponent == 0) {
    /* zero or subnormal: mant * 2^-24, exact in float */
    float magnitude = (float)mant * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return f32_from_bits(sign | ((exponent + 112u) << 23) | (mant << 13));
}

uint16_t f32_to_bf16(float value) {
  uint32_t bits = f32_bits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
    return (uint16_t)((bits >> 16) | 0x0040u); /* NaN stays a (quiet) NaN */
  return (uint16_t)(round_shift_rne(bits & 0x7FFFFFFFu, 16) | ((bits >> 16) & 0x8000u));
}

float bf16_to_f32(uint16_t bits) {
  return f32_from_bits((uint32_t)bits << 16);
}
