/*
 * `spmd visualize`: which device holds which block of a 1-D or 2-D
 * tensor under a spec, e.g.
 *   spmd visualize --mesh 4x2 --axes replica,fsdp --shape 8,6 --spec 'fsdp, None'
 */
#include "commands/visualize.h"

#include "flags.h"
#include "message.h"

#include "spmd/mesh.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int cmd_visualize(int argc, char **argv)
{
    cli_opts o;
    int rc = flags_read(argc, argv, CMD_VISUALIZE, &o);
    if (rc) return rc < 0 ? 0 : rc;
    const char *mesh = o.mesh, *axes = o.axes, *shape = o.shape, *spec = o.spec;
    if (!shape || !spec) {
        flags_usage(stderr, CMD_VISUALIZE);
        return cli_fail("visualize needs --shape (e.g. 8,6) and --spec");
    }
    int64_t dims[SPMD_MAX_RANK];
    int rank = 0, given = 1;
    for (const char *s = shape; *s; s++) given += *s == ',';
    if (given > SPMD_MAX_RANK)
        return cli_fail("--shape '%s' has %d dimensions; a tensor has at most %d", shape, given,
                        SPMD_MAX_RANK);
    for (const char *s = shape; *s;) {
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || v <= 0 || rank == SPMD_MAX_RANK)
            return cli_fail("--shape wants positive sizes like 8,6, got '%s'", shape);
        /* Block sizes are rounded up: a size near 2^63 would overflow. */
        if (errno == ERANGE || v > (1LL << 62))
            return cli_fail("--shape: size %.*s is more than 2^62, got '%s'", (int)(end - s), s,
                            shape);
        dims[rank++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return cli_fail("--shape wants positive sizes like 8,6, got '%s'", shape);
    }
    spmd_mesh *m = spmd_mesh_parse(mesh, axes);
    if (!m) return cli_fail("--mesh %s --axes %s: %s", mesh, axes, spmd_last_error());
    /* The picture is cut at the buffer's size: a bigger one until it fits
     * (a 4096-device mesh draws more than 64 KiB). */
    char *buf = NULL;
    int n = 0;
    for (size_t size = 1 << 16; size <= (size_t)1 << 30; size *= 2) {
        free(buf);
        if (!(buf = malloc(size))) break;
        n = spmd_sharding_visualize(m, spec, rank, dims, buf, size);
        if (n < 0 || (size_t)n < size - 1) break;
    }
    spmd_mesh_free(m);
    if (!buf) return cli_fail("out of memory for the picture");
    if (n < 0) {
        free(buf);
        return cli_fail("%s", spmd_last_error());
    }
    fputs(buf, stdout);
    free(buf);
    return 0;
}
