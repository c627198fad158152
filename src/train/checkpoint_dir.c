/*
 * The checkpoint directory's names (train/checkpoint.h): DIR/step-NNNNNNNN
 * for each checkpoint and DIR/latest, one line naming the newest complete
 * one.
 */
#include "train/checkpoint.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "base/arena.h"
#include "base/error.h"
#include "train/checkpoint_fs.h"

void ckpt_step_name(int64_t step, char *buf) { snprintf(buf, 32, "step-%08lld", (long long)step); }

bool ckpt_parse_step_name(const char *name, int64_t *step)
{
    if (strncmp(name, "step-", 5) != 0 || !name[5]) return false;
    int64_t v = 0;
    for (const char *s = name + 5; *s; s++) {
        if (!isdigit((unsigned char)*s) || v > (INT64_MAX - 9) / 10) return false;
        v = v * 10 + (*s - '0');
    }
    *step = v;
    return true;
}

spmd_status ckpt_read_latest(const spmd_allocator *alloc, const char *dir, char *name,
                             const char *what)
{
    char path[CKPT_PATH_MAX];
    spmd_status st = ckpt_join(path, dir, CKPT_LATEST, what);
    if (st != SPMD_OK) return st;
    char *text;
    size_t len;
    if ((st = ckpt_read_file(alloc, path, 64, &text, &len, what)) != SPMD_OK) return st;
    while (len > 0 && isspace((unsigned char)text[len - 1])) text[--len] = '\0';
    int64_t step;
    /* Only a step name: the file must not lead a load out of DIR. */
    if (!ckpt_parse_step_name(text, &step) || len >= 32)
        st = base_error(SPMD_ERR_IO, "%s: %s does not hold a step name (\"step-NNNNNNNN\")", what,
                        path);
    else
        memcpy(name, text, len + 1);
    base_free(alloc, text);
    return st;
}
