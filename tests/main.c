/* fnorm_tests: the test runner. See README.md ("Tests") for the options. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusednorm.h"
#include "harness.h"
#include "tests.h"

static int usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [--cpu-only] [--quick] [--filter SUBSTR] [--group LIST] [--shard K/N] "
          "[--seed N] [--verbose|--details]\n"
          "  --cpu-only       count the CUDA cases as skipped without touching CUDA\n"
          "  --quick          a reduced set of cases (for sanitizers and compute-sanitizer)\n"
          "  --filter SUBSTR  run only the cases whose name contains SUBSTR\n"
          "  --group LIST     run only the groups whose name contains one of LIST's\n"
          "                   comma-separated substrings (e.g. cuda-rows,cuda-layouts)\n"
          "  --shard K/N      of the cases selected, run only every N-th from the K-th (K from\n"
          "                   0 to N - 1): N runs, K = 0 .. N - 1, run each case once\n"
          "  --seed N         seed of the random inputs (default 1)\n"
          "  --verbose        a line per passing case: worst error/tolerance ratio, time\n"
          "  --details        and a line per check with its worst element\n",
          argv0);
  return 2;
}

int main(int argc, char **argv) {
  int k;
  double start;
  g_opt.seed = 1;
  for (k = 1; k < argc; k++) {
    if (strcmp(argv[k], "--cpu-only") == 0) {
      g_opt.cpu_only = 1;
    } else if (strcmp(argv[k], "--quick") == 0) {
      g_opt.quick = 1;
    } else if (strcmp(argv[k], "--verbose") == 0) {
      g_opt.verbose = 1;
    } else if (strcmp(argv[k], "--details") == 0) {
      g_opt.verbose = 2;
    } else if (strcmp(argv[k], "--filter") == 0 && k + 1 < argc) {
      g_opt.filter = argv[++k];
    } else if (strcmp(argv[k], "--group") == 0 && k + 1 < argc) {
      g_opt.groups = argv[++k];
    } else if (strcmp(argv[k], "--shard") == 0 && k + 1 < argc) {
      char *end;
      g_opt.shard_index = strtol(argv[++k], &end, 10);
      if (*end != '/' || end == argv[k])
        return usage(argv[0]);
      g_opt.shard_count = strtol(end + 1, &end, 10);
      if (*end != '\0' || g_opt.shard_count < 1 || g_opt.shard_index < 0 ||
          g_opt.shard_index >= g_opt.shard_count)
        return usage(argv[0]);
    } else if (strcmp(argv[k], "--seed") == 0 && k + 1 < argc) {
      char *end;
      g_opt.seed = strtoull(argv[++k], &end, 0);
      if (*end != '\0')
        return usage(argv[0]);
    } else {
      return usage(argv[0]);
    }
  }
  printf("fusednorm %s tests (header %s): seed %llu%s%s%s%s%s%s", fnorm_version_string(),
         FNORM_VERSION_STRING, (unsigned long long)g_opt.seed, g_opt.quick ? ", quick" : "",
         g_opt.cpu_only ? ", cpu only" : "", g_opt.filter ? ", filter: " : "",
         g_opt.filter ? g_opt.filter : "", g_opt.groups ? ", groups: " : "",
         g_opt.groups ? g_opt.groups : "");
  if (g_opt.shard_count > 0)
    printf(", shard %ld/%ld", g_opt.shard_index, g_opt.shard_count);
  printf("\n");
  fflush(stdout);
  start = now_seconds();
  run_api_tests();
  run_cpu_tests();
  run_cuda_tests();
  printf("total time %.1f s\n", now_seconds() - start);
  return harness_finish();
}
