/*
 * The tests' own binary16 and bfloat16 conversions, independent of the library's. Narrowing
 * rounds to nearest, ties to even; NaN stays NaN; overflow gives infinity.
 */
#ifndef FNORM_TESTS_HALFCONV_H
#define FNORM_TESTS_HALFCONV_H

#include <stdint.h>

uint16_t f32_to_f16(float value);
float f16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float value);
float bf16_to_f32(uint16_t bits);

uint32_t f32_bits(float value);
float f32_from_bits(uint32_t bits);

#endif /* FNORM_TESTS_HALFCONV_H */
