/*
 * The library as a user installs and links it (docs/library.md, "Installing"):
 * `cmake --install` of this build into a temporary prefix, then
 * examples/fsdp_replicas.c compiled against the installed headers and
 * shared library through `pkg-config --cflags --libs spmd`, and run with no
 * LD_LIBRARY_PATH: the dynamic linker must find the installed libspmd.so
 * (through the RPATH spmd.pc's Libs carry, CMakeLists.txt
 * SPMD_INSTALL_RPATH), and the program must train.  The installed `spmd`
 * must run the same way.  CMakeLists.txt passes the build's facts
 * (SPMD_BINARY_DIR, SPMD_CMAKE_COMMAND, SPMD_C_COMPILER,
 * SPMD_INSTALL_LIBDIR, SPMD_INSTALL_BINDIR, SPMD_PC_HAS_RPATH).
 * Skipped in sanitizer builds: a program built without the sanitizer
 * cannot load a library built with it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support_files.h"
#include "support_tool.h"

enum { OUT = 1 << 16 };

static char *dir;                 /* the temporary directory */
static char prefix[SUPPORT_PATH]; /* dir/prefix, the install prefix */
static char out[OUT];

/* `cmd` run by sh with LD_LIBRARY_PATH removed, its output in `out`. */
static int run_sh(const char *cmd, int timeout_s)
{
    char args[4 * SUPPORT_PATH];
    int n = snprintf(args, sizeof args, "-u LD_LIBRARY_PATH sh -c '%s' 2>&1", cmd);
    assert_true(n > 0 && (size_t)n < sizeof args);
    tool_limits limits = {.timeout_s = timeout_s};
    return support_run_tool("env", args, &limits, out, sizeof out);
}

static int setup(void **state)
{
    (void)state;
    dir = support_temp_dir("spmd-install");
    support_path_in(prefix, dir, "prefix");
    char cmd[3 * SUPPORT_PATH];
    snprintf(cmd, sizeof cmd, "\"%s\" --install \"%s\" --prefix \"%s\"", SPMD_CMAKE_COMMAND,
             SPMD_BINARY_DIR, prefix);
    int rc = run_sh(cmd, 120);
    if (rc != 0) print_error("cmake --install failed (%d):\n%s\n", rc, out);
    return rc == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    support_drop_dir(dir);
    return 0;
}

/* The installed spmd.pc: its Libs carry the RPATH unless the configured
 * libdir is a system directory. */
static void test_pc_file_carries_the_rpath(void **state)
{
    (void)state;
    char cmd[3 * SUPPORT_PATH];
    snprintf(cmd, sizeof cmd, "PKG_CONFIG_PATH=\"%s/%s/pkgconfig\" pkg-config --libs spmd", prefix,
             SPMD_INSTALL_LIBDIR);
    assert_int_equal(run_sh(cmd, 30), 0);
    char libdir[2 * SUPPORT_PATH];
    snprintf(libdir, sizeof libdir, "-L%s/%s", prefix, SPMD_INSTALL_LIBDIR);
    if (!strstr(out, libdir)) fail_msg("pkg-config --libs spmd: %s (no %s)", out, libdir);
    assert_non_null(strstr(out, "-lspmd"));
    if (SPMD_PC_HAS_RPATH) {
        char rpath[2 * SUPPORT_PATH];
        snprintf(rpath, sizeof rpath, "-Wl,-rpath,%s/%s", prefix, SPMD_INSTALL_LIBDIR);
        if (!strstr(out, rpath)) fail_msg("pkg-config --libs spmd: %s (no %s)", out, rpath);
    } else {
        assert_null(strstr(out, "-rpath"));
    }
}

/* A program built with pkg-config runs with no LD_LIBRARY_PATH, on the
 * installed library, and trains. */
static void test_program_linked_through_pkg_config_runs(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    print_message("note: a sanitizer build: a program without the sanitizer cannot load its "
                  "library; not checked here\n");
    skip();
#endif
    if (!SPMD_PC_HAS_RPATH) {
        print_message("note: the configured libdir is a system directory, so spmd.pc carries no "
                      "RPATH and a temporary prefix needs LD_LIBRARY_PATH; not checked here\n");
        skip();
    }
    char exe[SUPPORT_PATH], cmd[4 * SUPPORT_PATH];
    support_path_in(exe, dir, "fsdp_replicas");
    snprintf(cmd, sizeof cmd,
             "export PKG_CONFIG_PATH=\"%s/%s/pkgconfig\"; \"%s\" $(pkg-config --cflags spmd) "
             "\"%s/examples/fsdp_replicas.c\" -o \"%s\" $(pkg-config --libs spmd)",
             prefix, SPMD_INSTALL_LIBDIR, SPMD_C_COMPILER, SPMD_SOURCE_DIR, exe);
    int rc = run_sh(cmd, 120);
    if (rc != 0) fail_msg("building against the installed library failed (%d):\n%s", rc, out);

    /* The dynamic linker's choice, as ldd would print it. */
    snprintf(cmd, sizeof cmd, "LD_TRACE_LOADED_OBJECTS=1 \"%s\"", exe);
    assert_int_equal(run_sh(cmd, 30), 0);
    const char *found = strstr(out, "libspmd.so.0 => ");
    if (!found) fail_msg("the program does not load libspmd.so.0:\n%s", out);
    char loaded[SUPPORT_PATH], installed[2 * SUPPORT_PATH];
    snprintf(loaded, sizeof loaded, "%.*s", (int)strcspn(found + 16, " \n"), found + 16);
    snprintf(installed, sizeof installed, "%s/%s/libspmd.so.0", prefix, SPMD_INSTALL_LIBDIR);
    char *loaded_real = realpath(loaded, NULL), *installed_real = realpath(installed, NULL);
    assert_non_null(installed_real);
    if (!loaded_real || strcmp(loaded_real, installed_real) != 0)
        fail_msg("the program loads %s, not the installed %s", loaded, installed_real);
    free(loaded_real), free(installed_real);

    snprintf(cmd, sizeof cmd, "\"%s\" 3", exe);
    rc = run_sh(cmd, 300);
    if (rc != 0) fail_msg("the program failed (%d):\n%s", rc, out);
    assert_non_null(strstr(out, "loss"));
}

/* The installed tool runs with no LD_LIBRARY_PATH. */
static void test_installed_tool_runs(void **state)
{
    (void)state;
    char tool[2 * SUPPORT_PATH], cmd[3 * SUPPORT_PATH];
    snprintf(tool, sizeof tool, "%s/%s/spmd", prefix, SPMD_INSTALL_BINDIR);
    struct stat st;
    if (stat(tool, &st) != 0) {
        print_message("note: no spmd tool in this build (no tools/*.c)\n");
        skip();
    }
    snprintf(cmd, sizeof cmd, "\"%s\" explain --model mlp --mesh 2 --axes data", tool);
    int rc = run_sh(cmd, 120);
    if (rc != 0) fail_msg("the installed spmd failed (%d):\n%s", rc, out);
    assert_non_null(strstr(out, "collectives per step"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pc_file_carries_the_rpath),
        cmocka_unit_test(test_program_linked_through_pkg_config_runs),
        cmocka_unit_test(test_installed_tool_runs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
