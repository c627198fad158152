/* Why a JSON text did not parse (see json_text.h). */
#include "train/json_text.h"

#include <cJSON.h>

#include <stdbool.h>
#include <stdio.h>

int json_text_depth_limit(void) { return CJSON_NESTING_LIMIT; }

const char *json_text_why_not(const char *text, size_t len, char *buf, size_t size)
{
    /* One pass over the brackets outside strings: the deepest nesting,
     * and what is still open at the end. */
    long depth = 0, deepest = 0;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            if (++depth > deepest) deepest = depth;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    if (deepest > CJSON_NESTING_LIMIT) {
        snprintf(buf, size, "nests %ld levels of arrays and objects deep; at most %d are read",
                 deepest, CJSON_NESTING_LIMIT);
    } else if (in_string || depth > 0) {
        snprintf(buf, size, "is cut short: it ends at byte %zu inside %s (a file cut short, or "
                            "a write that did not finish)",
                 len, in_string ? "a string" : "an array or object left open");
    } else {
        const char *at = cJSON_GetErrorPtr();
        size_t offset = at && at >= text && at <= text + len ? (size_t)(at - text) : len;
        size_t line = 1;
        for (size_t i = 0; i < offset; i++) line += text[i] == '\n';
        snprintf(buf, size, "is not JSON: a syntax error at byte %zu (line %zu)", offset, line);
    }
    return buf;
}
