/* Scratch directories and paths for tests (see support_files.h). */
#include "support_files.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/checkpoint_fs.h"

char *support_temp_dir(const char *name)
{
    char *dir = malloc(SUPPORT_PATH);
    assert_non_null(dir);
    int n = snprintf(dir, SUPPORT_PATH, "/tmp/%s-XXXXXX", name);
    assert_true(n > 0 && n < SUPPORT_PATH);
    assert_non_null(mkdtemp(dir));
    return dir;
}

void support_drop_dir(char *dir)
{
    assert_int_equal(ckpt_remove_tree(dir, "test"), SPMD_OK);
    free(dir);
}

const char *support_path_in(char *buf, const char *dir, const char *name)
{
    int n = snprintf(buf, SUPPORT_PATH, "%s/%s", dir, name);
    assert_true(n > 0 && n < SUPPORT_PATH);
    return buf;
}

int support_count_entries(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

char *support_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    assert_non_null(buf);
    for (size_t got; (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
            assert_non_null(buf);
        }
    }
    if (ferror(f)) fail_msg("cannot read %s", path);
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}
