/* Reading JSON reports (see support_json.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "support_json.h"

#include <stdio.h>

cJSON *support_load_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    static char buf[1 << 23]; /* a trace of a few steps takes megabytes */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    if (!j) fail_msg("%s is not JSON", path);
    return j;
}
