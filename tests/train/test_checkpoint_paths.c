/*
 * Where a path lies (train/checkpoint_paths.h) and the writers' lock
 * shared within a process (train/checkpoint_fs.h):
 *   - ckpt_resolve follows every symbolic link, a dangling one to its
 *     target, relative ones from their directory, ".." after a link from
 *     the link's target; the part not there yet is taken as written; a
 *     loop of links and an empty path are errors;
 *   - ckpt_path_in_checkpoint finds a step directory's files, a
 *     checkpoint directory's own names (latest, step-*, copy-*), a known
 *     checkpoint that does not exist yet and the known one itself; not a
 *     file beside the checkpoints, nor a user's file called latest;
 *   - ckpt_check_save_dir refuses a file, a path under a file and a step
 *     directory, and takes a copy's directory (DIR/copy-C);
 *   - a second lock of a directory this process holds shares it: another
 *     process is refused until the last holder lets go, and a holder
 *     letting go early does not drop the lock.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support_files.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spmd/spmd.h"
#include "train/checkpoint_fs.h"
#include "train/checkpoint_paths.h"

static char *dir;
static char real_dir[CKPT_PATH_MAX]; /* realpath's PATH_MAX */

static int setup(void **state)
{
    (void)state;
    dir = support_temp_dir("test_checkpoint_paths");
    return dir && realpath(dir, real_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    support_drop_dir(dir);
    return 0;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* The resolved form of `path` equals real_dir + `want`. */
static void resolves_to(const char *path, const char *want)
{
    char got[CKPT_PATH_MAX], expect[2 * CKPT_PATH_MAX];
    if (ckpt_resolve(path, got, "test") != SPMD_OK) fail_msg("%s: %s", path, spmd_last_error());
    snprintf(expect, sizeof expect, "%s%s", real_dir, want);
    if (strcmp(got, expect)) fail_msg("%s resolves to %s, want %s", path, got, expect);
}

static void test_resolve(void **state)
{
    (void)state;
    char p[SUPPORT_PATH], q[SUPPORT_PATH + 32];
    assert_int_equal(mkdir(support_path_in(p, dir, "a"), 0755), 0);
    assert_int_equal(mkdir(support_path_in(p, dir, "a/b"), 0755), 0);
    resolves_to(support_path_in(p, dir, "a/b"), "/a/b");
    resolves_to(support_path_in(p, dir, "a/./b/../b/new.json"), "/a/b/new.json");
    resolves_to(support_path_in(p, dir, "missing/deeper/x"), "/missing/deeper/x");
    /* A dangling link, relative to its directory: its target. */
    assert_int_equal(symlink("b/target.json", support_path_in(p, dir, "a/link.json")), 0);
    resolves_to(p, "/a/b/target.json");
    /* A link to a directory, then "..": the target's parent. */
    assert_int_equal(symlink(support_path_in(q, dir, "a/b"), support_path_in(p, dir, "to-b")), 0);
    snprintf(q, sizeof q, "%s/to-b/../link.json", dir);
    resolves_to(q, "/a/b/target.json");
    /* A chain of links. */
    assert_int_equal(symlink("to-b", support_path_in(p, dir, "to-to-b")), 0);
    snprintf(q, sizeof q, "%s/to-to-b/x", dir);
    resolves_to(q, "/a/b/x");
    /* Errors. */
    char out[CKPT_PATH_MAX];
    assert_int_equal(symlink("loop", support_path_in(p, dir, "loop")), 0);
    snprintf(q, sizeof q, "%s/loop/x", dir);
    assert_int_not_equal(ckpt_resolve(q, out, "test"), SPMD_OK);
    assert_non_null(strstr(spmd_last_error(), "loop of symbolic links"));
    assert_int_not_equal(ckpt_resolve("", out, "test"), SPMD_OK);
    /* Relative paths from the working directory. */
    char cwd[CKPT_PATH_MAX];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(dir), 0);
    resolves_to("a/link.json", "/a/b/target.json");
    resolves_to(".", "");
    assert_int_equal(chdir(cwd), 0);
}

/* DIR/ck with latest -> step-00000002 (and its index), a file beside. */
static void make_checkpoint(char *ck)
{
    char p[SUPPORT_PATH];
    assert_int_equal(mkdir(support_path_in(ck, dir, "ck"), 0755), 0);
    assert_int_equal(mkdir(support_path_in(p, ck, "step-00000002"), 0755), 0);
    write_text(support_path_in(p, ck, "step-00000002/index.json"), "{}\n");
    write_text(support_path_in(p, ck, "latest"), "step-00000002\n");
}

static bool in_ckpt(const char *rel, const char *const *known, int n, bool copies_apart, char *found)
{
    char p[2 * CKPT_PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", real_dir, rel);
    return ckpt_path_in_checkpoint(p, known, n, copies_apart, found);
}

static void test_in_checkpoint(void **state)
{
    (void)state;
    char ck[SUPPORT_PATH], found[CKPT_PATH_MAX], want[2 * CKPT_PATH_MAX];
    make_checkpoint(ck);
    assert_true(in_ckpt("ck/step-00000002/index.json", NULL, 0, false, found));
    snprintf(want, sizeof want, "%s/ck/step-00000002", real_dir);
    assert_string_equal(found, want);
    assert_true(in_ckpt("ck/latest", NULL, 0, false, found));
    snprintf(want, sizeof want, "%s/ck", real_dir);
    assert_string_equal(found, want);
    assert_true(in_ckpt("ck/step-00000009", NULL, 0, false, NULL));
    assert_true(in_ckpt("ck/.lock", NULL, 0, false, NULL));
    assert_true(in_ckpt("ck/copy-1/x", NULL, 0, false, NULL));
    assert_false(in_ckpt("ck/copy-1", NULL, 0, true, NULL)); /* a copy's own checkpoint */
    assert_false(in_ckpt("ck/train.jsonl", NULL, 0, false, NULL));
    assert_false(in_ckpt("elsewhere/latest", NULL, 0, false, NULL));
    /* A user's file called latest makes no checkpoint directory. */
    char p[SUPPORT_PATH];
    assert_int_equal(mkdir(support_path_in(p, dir, "mine"), 0755), 0);
    write_text(support_path_in(p, dir, "mine/latest"), "my notes\n");
    assert_false(in_ckpt("mine/latest", NULL, 0, false, NULL));
    assert_false(in_ckpt("mine/step-1.json", NULL, 0, false, NULL));
    /* A checkpoint the caller names, not made yet, and the name itself. */
    char fresh[2 * CKPT_PATH_MAX];
    snprintf(fresh, sizeof fresh, "%s/new", real_dir);
    const char *known[] = {fresh};
    assert_true(in_ckpt("new/latest", known, 1, false, found));
    assert_string_equal(found, fresh);
    assert_true(in_ckpt("new", known, 1, false, NULL));
    assert_false(in_ckpt("new/log.jsonl", known, 1, false, NULL));
}

static void test_save_dir(void **state)
{
    (void)state;
    char ck[SUPPORT_PATH], p[SUPPORT_PATH];
    make_checkpoint(ck);
    assert_int_equal(ckpt_check_save_dir(ck, "test"), SPMD_OK);
    assert_int_equal(ckpt_check_save_dir(support_path_in(p, ck, "copy-0"), "test"), SPMD_OK);
    assert_int_equal(ckpt_check_save_dir(support_path_in(p, dir, "fresh/deeper"), "test"), SPMD_OK);
    assert_int_not_equal(ckpt_check_save_dir(support_path_in(p, ck, "step-00000002"), "test"), SPMD_OK);
    assert_non_null(strstr(spmd_last_error(), "inside the checkpoint"));
    assert_int_not_equal(ckpt_check_save_dir(support_path_in(p, ck, "latest"), "test"), SPMD_OK);
    assert_non_null(strstr(spmd_last_error(), "not a directory"));
    assert_int_not_equal(ckpt_check_save_dir(support_path_in(p, ck, "latest/sub"), "test"), SPMD_OK);
    assert_non_null(strstr(spmd_last_error(), "under a file"));
}

/* Whether a child process can lock `d` (and lets go at once). */
static bool other_process_locks(const char *d)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd;
        _exit(ckpt_lock_dir(d, &fd, "child") == SPMD_OK ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void test_lock_shared_in_a_process(void **state)
{
    (void)state;
    int first, second;
    assert_int_equal(ckpt_lock_dir(dir, &first, "test"), SPMD_OK);
    if (first < 0) skip(); /* a file system without locks */
    assert_false(other_process_locks(dir));
    assert_int_equal(ckpt_lock_dir(dir, &second, "test"), SPMD_OK);
    assert_int_equal(second, first);
    ckpt_unlock_dir(second); /* a save done: the run still holds it */
    assert_false(other_process_locks(dir));
    ckpt_unlock_dir(first);
    assert_true(other_process_locks(dir));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_resolve, setup, teardown),
        cmocka_unit_test_setup_teardown(test_in_checkpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lock_shared_in_a_process, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
