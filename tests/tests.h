/* The test groups, run in this order by main(). */
#ifndef FNORM_TESTS_TESTS_H
#define FNORM_TESTS_TESTS_H

void run_api_tests(void);  /* test_api.c: version, statuses, descriptor, every bad input */
void run_cpu_tests(void);  /* test_cpu.c: numerics of the CPU backend */
void run_cuda_tests(void); /* test_cuda.c: the GPU against the CPU and the reference */

#endif /* FNORM_TESTS_TESTS_H */
