#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

test_options g_opt;

/* Failures printed per case before the rest are only counted: enough to diagnose, without
 * flooding the log when one bug breaks every element. */
#define MAX_FAIL_LINES_PER_CASE 6

static long total_passed, total_failed, total_skipped;
static long selected_cases; /* cases --filter and --group let through, for --shard */
static long group_passed, group_failed, group_skipped;
static double group_start;
static const char *group_name = "";
static const char *skip_reason;

static char current_name[512];
static int current_failures;
static int current_skipped;
static double current_worst_ratio;
static double current_start; /* when the running case began (its time in --verbose's line) */

double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void group_begin(const char *name) {
  group_name = name;
  group_passed = group_failed = group_skipped = 0;
  group_start = now_seconds();
  printf("== %s\n", name);
  fflush(stdout);
}

void group_end(void) {
  printf("   %s: %ld passed, %ld failed, %ld skipped (%.1f s)\n", group_name, group_passed,
         group_failed, group_skipped, now_seconds() - group_start);
  fflush(stdout);
}

void skip_all_begin(const char *reason) {
  skip_reason = reason;
}
void skip_all_end(void) {
  skip_reason = NULL;
}

/* Whether the current group's name contains one of --group's comma-separated substrings. */
static int group_selected(void) {
  const char *item = g_opt.groups;
  if (item == NULL)
    return 1;
  while (*item != '\0') {
    const char *end = strchr(item, ',');
    const size_t len = end != NULL ? (size_t)(end - item) : strlen(item);
    const char *at;
    for (at = group_name; len > 0 && strlen(at) >= len; at++)
      if (strncmp(at, item, len) == 0)
        return 1;
    if (end == NULL)
      break;
    item = end + 1;
  }
  return 0;
}

int case_begin(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(current_name, sizeof current_name, fmt, ap);
  va_end(ap);
  if (g_opt.filter != NULL && strstr(current_name, g_opt.filter) == NULL)
    return 0;
  if (!group_selected())
    return 0;
  /* --shard K/N: the case's place among the selected ones, whatever runs or skips them; the
   * cases themselves are independent (each draws its inputs from its own name's seed). */
  if (g_opt.shard_count > 0 && selected_cases++ % g_opt.shard_count != g_opt.shard_index)
    return 0;
  if (skip_reason != NULL) {
    group_skipped++;
    total_skipped++;
    return 0;
  }
  current_failures = 0;
  current_skipped = 0;
  current_worst_ratio = 0.0;
  current_start = now_seconds();
  return 1;
}

void case_fail(const char *fmt, ...) {
  va_list ap;
  current_failures++;
  if (current_failures > MAX_FAIL_LINES_PER_CASE)
    return;
  printf("FAIL [%s] ", current_name);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  if (current_failures == MAX_FAIL_LINES_PER_CASE)
    printf("FAIL [%s] (further failures of this case not printed)\n", current_name);
  fflush(stdout);
}

void case_skip(const char *reason) {
  current_skipped = 1;
  printf("SKIP [%s] %s\n", current_name, reason);
}

void case_note_ratio(double ratio) {
  if (ratio > current_worst_ratio)
    current_worst_ratio = ratio;
}

int case_failed(void) {
  return current_failures > 0;
}
const char *case_name(void) {
  return current_name;
}

uint64_t case_seed(void) {
  /* FNV-1a over the name, then a splitmix64 finalizer with the global seed mixed in. */
  uint64_t h = 1469598103934665603ull;
  const unsigned char *p;
  for (p = (const unsigned char *)current_name; *p; p++) {
    h ^= *p;
    h *= 1099511628211ull;
  }
  h ^= g_opt.seed * 0x9E3779B97F4A7C15ull;
  h ^= h >> 30;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 27;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 31;
  return h;
}

void case_end(void) {
  if (current_failures > 0) {
    group_failed++;
    total_failed++;
  } else if (current_skipped) {
    group_skipped++;
    total_skipped++;
  } else {
    group_passed++;
    total_passed++;
    if (g_opt.verbose)
      printf("ok   [%s] worst err/tol %.3f (%.2f s)\n", current_name, current_worst_ratio,
             now_seconds() - current_start);
  }
}

int harness_finish(void) {
  printf("%ld passed, %ld failed, %ld skipped\n", total_passed, total_failed, total_skipped);
  if (total_passed + total_failed + total_skipped == 0) {
    /* a --filter, --group or --shard that matches nothing is a mistyped command, not a pass */
    printf("no case matched --filter/--group/--shard\n");
    fflush(stdout);
    return 1;
  }
  fflush(stdout);
  return total_failed > 0 ? 1 : 0;
}
