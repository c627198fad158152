/*
 * Reading the spmd tool's JSON reports in the test_cli* tests.
 */
#ifndef SPMD_TESTS_SUPPORT_JSON_H
#define SPMD_TESTS_SUPPORT_JSON_H

#include <cJSON.h>

/* The JSON document in file `path` (at most 1 MiB); fails the test when
 * the file is missing or does not parse.  cJSON_Delete it. */
cJSON *support_load_json(const char *path);

#endif
