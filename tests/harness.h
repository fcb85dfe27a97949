/*
 * A tiny test harness: test cases grouped into named groups, a per-case failure log and the
 * final "N passed, M failed, K skipped" line. A test case is one configuration (operation,
 * dtypes, shape, options); it fails if any of its checks fails.
 */
#ifndef FNORM_TESTS_HARNESS_H
#define FNORM_TESTS_HARNESS_H

#include <stdint.h>

typedef struct test_options {
  int cpu_only; /* --cpu-only: count the CUDA cases as skipped without touching CUDA */
  int quick;    /* --quick: a reduced set of cases (sanitizers, compute-sanitizer) */
  int verbose;  /* --verbose (1): a line per case with its worst error/tolerance; --details (2) */
  const char *filter; /* --filter SUBSTR: run only the cases whose name contains SUBSTR */
  const char *groups; /* --group LIST: only the groups whose name contains one of LIST's
                       * comma-separated substrings */
  uint64_t seed;      /* --seed N: mixed into every case's own seed */
  long shard_index;   /* --shard K/N: of the cases --filter and --group select, only the K-th of */
  long shard_count;   /* every N (0-based; 0 without --shard), so that N runs split a suite */
} test_options;

/* Set once by main() from the command line, read by every group. */
extern test_options g_opt;

void group_begin(const char *name);
void group_end(void);

/* While a skip reason is set, case_begin() counts matching cases as skipped and returns 0. */
void skip_all_begin(const char *reason);
void skip_all_end(void);

/* Names a case (printf-style). Returns 1 if it should run now, 0 if it is filtered out or
 * skipped; the caller runs its checks and calls case_end() only after a 1. */
int case_begin(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* Records a failed check of the current case and prints it (the first few per case). */
void case_fail(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* Marks the current case skipped (it then counts neither as passed nor failed). */
void case_skip(const char *reason);
/* For --verbose: the worst error/tolerance ratio seen by the current case's checks. */
void case_note_ratio(double ratio);
int case_failed(void);
const char *case_name(void);
/* A seed derived from --seed and the case name, so that --filter does not change the data. */
uint64_t case_seed(void);
void case_end(void);

/* Prints the final line; returns the process exit status. */
int harness_finish(void);

double now_seconds(void);

#endif /* FNORM_TESTS_HARNESS_H */
