/*
 * Why a JSON text did not parse, for messages that name the cause: a text
 * that nests deeper than the parser follows (cJSON stops at
 * CJSON_NESTING_LIMIT levels: a valid file can still be refused), one cut
 * short (an object, array or string left open at its end), or a syntax
 * error at a byte.
 */
#ifndef SPMD_TRAIN_JSON_TEXT_H
#define SPMD_TRAIN_JSON_TEXT_H

#include <stddef.h>

/* The levels of arrays and objects a JSON text may nest here. */
int json_text_depth_limit(void);

/* Why `text` (len bytes) is not JSON cJSON parses, as a phrase that
 * follows the file's name ("nests 200001 levels of arrays and objects
 * deep; at most 1000 are read", "is cut short: ...", "is not JSON: a
 * syntax error at byte N (line L)"), into buf; returns buf.  Call it after
 * cJSON_ParseWithLength failed on the same text. */
const char *json_text_why_not(const char *text, size_t len, char *buf, size_t size);

#endif
