/*
 * The data-file helpers the text and shard kinds share (dataset_file.h).
 */
#include "train/dataset_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "train/checkpoint_fs.h"

int64_t dataset_tail_len(int64_t n, int seq)
{
    int64_t window = (int64_t)seq + 1;
    int64_t tail = n / 10 > window ? n / 10 : window;
    return n - tail >= window ? tail : 0;
}

spmd_status dataset_open_file(const char *who, const char *path, int *fd, int64_t *size)
{
    *fd = ckpt_open_input(path);
    if (*fd < 0)
        return base_error(SPMD_ERR_IO, "%s: cannot open %s: %s", who, path, strerror(errno));
    struct stat st;
    spmd_status rc = SPMD_OK;
    if (fstat(*fd, &st) != 0)
        rc = base_error(SPMD_ERR_IO, "%s: cannot stat %s: %s", who, path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = base_error(SPMD_ERR_IO, "%s: %s is not a regular file", who, path);
    if (rc != SPMD_OK) {
        close(*fd);
        *fd = -1;
        return rc;
    }
    *size = (int64_t)st.st_size;
    return SPMD_OK;
}
