/*
 * llm.c token shards: a header of 256 little-endian int32 (magic 20240520,
 * version 1, token count) followed by that many uint16 tokens.  Files are
 * read with pread, a window at a time, so a glob of many large shards
 * costs neither memory nor address space, and a file cut short while in
 * use fails the read with its name (a mapping would fault with SIGBUS).
 * Every file is validated when the dataset opens, so a bad shard fails at
 * startup, not hours into training.
 *
 * Each split is a list of segments (a token range of one file); a sample is
 * a window of seq+1 tokens inside one segment, never across files, since a
 * shard boundary is not a place where text continues.
 */
#include "train/dataset.h"
#include "train/dataset_file.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/rng.h"
#include "train/checkpoint_fs.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_BYTES (256 * 4)

/* Tokens read at a time (on the stack). */
enum { CHUNK_TOKENS = 4096 };

typedef struct shard_file {
    char *path;
    int fd;          /* -1: opened for each read (too many files to keep open) */
    int64_t ntok;
    int32_t max_tok;
} shard_file;

typedef struct segment {
    int file;
    int64_t begin, len;
    int64_t windows_before; /* windows in earlier segments of the split */
    int64_t strides_before; /* the same, counting only windows every seq tokens */
} segment;

typedef struct shards {
    shard_file *files;
    int nfiles;
    segment *seg[2];
    int nseg[2];
    int64_t windows[2];
    int64_t strides[2]; /* windows starting every seq tokens (sequential order) */
    uint64_t stream[2];
} shards;

static void shards_destroy(void *impl)
{
    shards *s = impl;
    for (int i = 0; i < s->nfiles; i++) {
        if (s->files[i].fd >= 0) close(s->files[i].fd);
        free(s->files[i].path);
    }
    free(s->files);
    free(s->seg[0]);
    free(s->seg[1]);
    free(s);
}

static int32_t le32(const uint8_t *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

static int32_t le16(const uint8_t *p) { return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8); }

/* Up to n bytes at `offset`, fewer only at the end of the file; -1 with
 * errno on an error. */
static int64_t read_at(int fd, uint8_t *buf, int64_t n, int64_t offset)
{
    int64_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, (size_t)(n - got), (off_t)(offset + got));
        if (r > 0) got += r;
        else if (r == 0) break;
        else if (errno != EINTR) return -1;
    }
    return got;
}

static int64_t file_bytes(const shard_file *f) { return SHARD_HEADER_BYTES + 2 * f->ntok; }

/* Tokens [first, first + n) of f, n <= CHUNK_TOKENS, as they are stored.
 * The file was checked when the dataset opened; one that has shrunk,
 * grown or gone since fails here, named. */
static spmd_status read_tokens(const shard_file *f, int fd, int64_t first, int64_t n,
                               uint8_t *buf)
{
    int own = -1;
    if (fd < 0) {
        struct stat st;
        own = fd = ckpt_open_input(f->path);
        if (fd < 0)
            return base_error(SPMD_ERR_IO, "shards: cannot open %s again: %s", f->path,
                              strerror(errno));
        if (fstat(fd, &st) == 0 && (!S_ISREG(st.st_mode) || st.st_size != file_bytes(f))) {
            close(fd);
            return base_error(SPMD_ERR_IO,
                              "shards: %s changed while in use: it has %lld bytes, %lld when "
                              "the data set was opened", f->path, (long long)st.st_size,
                              (long long)file_bytes(f));
        }
    }
    int64_t at = SHARD_HEADER_BYTES + 2 * first;
    int64_t got = read_at(fd, buf, 2 * n, at);
    int err = errno;
    if (own >= 0) close(own);
    if (got == 2 * n) return SPMD_OK;
    if (got < 0)
        return base_error(SPMD_ERR_IO, "shards: cannot read %s: %s", f->path, strerror(err));
    return base_error(SPMD_ERR_IO,
                      "shards: %s changed while in use: it ends before byte %lld, it had %lld "
                      "bytes when the data set was opened (truncated or rewritten since?)",
                      f->path, (long long)(at + 2 * n), (long long)file_bytes(f));
}

/* The index of the first token of f not below `limit`, or -1; *max gets
 * the largest token. */
static spmd_status scan_tokens(const shard_file *f, int fd, int32_t limit, int64_t *first_over,
                               int32_t *max)
{
    uint8_t buf[2 * CHUNK_TOKENS];
    *first_over = -1;
    *max = 0;
    for (int64_t k = 0; k < f->ntok; k += CHUNK_TOKENS) {
        int64_t n = f->ntok - k < CHUNK_TOKENS ? f->ntok - k : CHUNK_TOKENS;
        spmd_status rc = read_tokens(f, fd, k, n, buf);
        if (rc != SPMD_OK) return rc;
        for (int64_t i = 0; i < n; i++) {
            int32_t tok = le16(buf + 2 * i);
            if (tok > *max) *max = tok;
            if (tok >= limit && *first_over < 0) *first_over = k + i;
        }
    }
    return SPMD_OK;
}

/* Finds the segment holding window w: binary search on windows_before, or
 * on strides_before when w counts windows every seq tokens. */
static const segment *find_segment(const shards *s, spmd_split split, int64_t w, bool strided)
{
    int lo = 0, hi = s->nseg[split] - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        const segment *g = &s->seg[split][mid];
        if ((strided ? g->strides_before : g->windows_before) <= w) lo = mid;
        else hi = mid - 1;
    }
    return &s->seg[split][lo];
}

/* The first token of sample `index`: a window drawn by (seed, split,
 * index), or, in sequential order, window `index` of those every seq
 * tokens, wrapping round. */
static const segment *locate(const spmd_dataset *d, spmd_split split, uint64_t index, int64_t *at)
{
    const shards *s = d->impl;
    if (d->order == SPMD_DATA_SEQUENTIAL) {
        int64_t w = (int64_t)(index % (uint64_t)s->strides[split]);
        const segment *g = find_segment(s, split, w, true);
        *at = g->begin + (w - g->strides_before) * d->seq;
        return g;
    }
    int64_t w = (int64_t)(base_rng_bits(d->seed, s->stream[split], index) %
                          (uint64_t)s->windows[split]);
    const segment *g = find_segment(s, split, w, false);
    *at = g->begin + (w - g->windows_before);
    return g;
}

static spmd_status shards_sample(const spmd_dataset *d, spmd_split split, uint64_t index,
                                 int32_t *tokens, uint8_t *scored)
{
    (void)scored;
    const shards *s = d->impl;
    int64_t at;
    const segment *g = locate(d, split, index, &at);
    const shard_file *f = &s->files[g->file];
    uint8_t buf[2 * CHUNK_TOKENS];
    for (int64_t done = 0; done <= d->seq; done += CHUNK_TOKENS) {
        int64_t n = d->seq + 1 - done < CHUNK_TOKENS ? d->seq + 1 - done : CHUNK_TOKENS;
        spmd_status rc = read_tokens(f, f->fd, at + done, n, buf);
        if (rc != SPMD_OK) return rc;
        for (int64_t i = 0; i < n; i++) tokens[done + i] = le16(buf + 2 * i);
    }
    return SPMD_OK;
}

static spmd_status shards_check_vocab(const spmd_dataset *d, int vocab)
{
    const shards *s = d->impl;
    for (int i = 0; i < s->nfiles; i++) {
        const shard_file *f = &s->files[i];
        if (f->max_tok < vocab) continue; /* known since the dataset opened */
        int64_t k;
        int32_t max;
        spmd_status rc = scan_tokens(f, f->fd, vocab, &k, &max);
        if (rc != SPMD_OK) return rc;
        if (k >= 0) {
            uint8_t tok[2];
            rc = read_tokens(f, f->fd, k, 1, tok);
            if (rc != SPMD_OK) return rc;
            return base_error(SPMD_ERR_INVALID,
                              "shards: %s: token %d at index %lld (byte offset %lld) is not "
                              "below the model's vocabulary %d",
                              f->path, (int)le16(tok), (long long)k,
                              (long long)(SHARD_HEADER_BYTES + 2 * k), vocab);
        }
    }
    return SPMD_OK;
}

static const dataset_ops shards_ops = {shards_sample, shards_check_vocab, shards_destroy};

/* What a wrong magic number may be instead (llm.c's other binary files). */
static const char *magic_hint(int32_t magic)
{
    switch (magic) {
    case 20240326: return "it looks like an llm.c model checkpoint, not token data";
    case 20240328: return "it looks like an llm.c tokenizer file, not token data";
    default:
        return "this may be a different format (older llm.c data files had no header; re-run "
               "the prepro script), or a text file named .bin";
    }
}

/* Checks the header of f (open as fd, `size` bytes); fills f->ntok. */
static spmd_status check_header(shard_file *f, int fd, int64_t size)
{
    const char *path = f->path;
    if (size == 0)
        return base_error(SPMD_ERR_INVALID,
                          "shards: %s is empty: truncated header (an llm.c shard starts with a "
                          "%d-byte header)", path, SHARD_HEADER_BYTES);
    uint8_t head[SHARD_HEADER_BYTES];
    int64_t n = read_at(fd, head, size < SHARD_HEADER_BYTES ? size : SHARD_HEADER_BYTES, 0);
    if (n < 0) return base_error(SPMD_ERR_IO, "shards: cannot read %s: %s", path, strerror(errno));
    /* The magic first, even in a short file: a wrong format is the likelier
     * cause and the more useful message. */
    if (n >= 4 && le32(head) != SHARD_MAGIC)
        return base_error(SPMD_ERR_INVALID,
                          "shards: %s: wrong magic number %d (expected %d for an llm.c token "
                          "shard): %s", path, (int)le32(head), SHARD_MAGIC,
                          magic_hint(le32(head)));
    if (n < SHARD_HEADER_BYTES)
        return base_error(SPMD_ERR_INVALID,
                          "shards: %s: truncated header: the file has %lld bytes, the header "
                          "alone needs %d", path, (long long)size, SHARD_HEADER_BYTES);
    int32_t version = le32(head + 4), count = le32(head + 8);
    if (version != SHARD_VERSION)
        return base_error(SPMD_ERR_UNSUPPORTED,
                          "shards: %s: unsupported version %d (expected %d, uint16 GPT-2 "
                          "tokens%s)", path, (int)version, SHARD_VERSION,
                          version == 2 ? "; version 2 holds uint32 LLaMA 3 tokens" : "");
    if (count <= 0)
        return base_error(SPMD_ERR_INVALID, "shards: %s: header says %d tokens: zero tokens",
                          path, (int)count);
    int64_t want = SHARD_HEADER_BYTES + 2 * (int64_t)count;
    if (size != want)
        return base_error(SPMD_ERR_INVALID,
                          "shards: %s: header says %d tokens (%lld bytes with the header) but "
                          "the file has %lld bytes: %s", path, (int)count, (long long)want,
                          (long long)size,
                          size < want ? "truncated file" : "trailing bytes after the tokens");
    f->ntok = count;
    return SPMD_OK;
}

/* Opens and validates one file, and finds its largest token; keeps it
 * open if `keep_open`. */
static spmd_status load_shard(shard_file *f, bool keep_open)
{
    int fd;
    int64_t size, over;
    spmd_status rc = dataset_open_file("shards", f->path, &fd, &size);
    if (rc != SPMD_OK) return rc;
    rc = check_header(f, fd, size);
    if (rc == SPMD_OK) rc = scan_tokens(f, fd, INT32_MAX, &over, &f->max_tok);
    if (rc == SPMD_OK && keep_open) f->fd = fd;
    else close(fd);
    return rc;
}

/* Files kept open: half the open-file limit (ulimit -n), the rest is the
 * process's; files past it are opened for each read. */
static int files_kept_open(void)
{
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) != 0) return 0;
    if (nofile.rlim_cur == RLIM_INFINITY || nofile.rlim_cur / 2 > 1 << 20) return 1 << 20;
    return (int)(nofile.rlim_cur / 2);
}

static int cmp_path(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted paths for `pattern` (a plain path gives itself). */
static spmd_status expand(shards *s, const char *pattern)
{
    struct stat st;
    if (stat(pattern, &st) == 0 || !strpbrk(pattern, "*?[")) {
        s->files = calloc(1, sizeof *s->files);
        if (!s->files || !(s->files[0].path = strdup(pattern)))
            return base_error(SPMD_ERR_NOMEM, "shards: out of memory");
        s->nfiles = 1;
        return SPMD_OK;
    }
    glob_t g;
    int r = glob(pattern, 0, NULL, &g);
    if (r == GLOB_NOMATCH) {
        globfree(&g);
        return base_error(SPMD_ERR_IO, "shards: no file matches %s", pattern);
    }
    if (r != 0) {
        globfree(&g);
        return base_error(r == GLOB_NOSPACE ? SPMD_ERR_NOMEM : SPMD_ERR_IO,
                          "shards: cannot expand %s (%s)", pattern,
                          r == GLOB_NOSPACE ? "out of memory" : "read error");
    }
    spmd_status rc = SPMD_OK;
    if (g.gl_pathc > 1 << 20)
        rc = base_error(SPMD_ERR_UNSUPPORTED, "shards: %s matches %zu files (at most %d)",
                        pattern, (size_t)g.gl_pathc, 1 << 20);
    else if (!(s->files = calloc(g.gl_pathc, sizeof *s->files)))
        rc = base_error(SPMD_ERR_NOMEM, "shards: out of memory");
    for (size_t i = 0; rc == SPMD_OK && i < g.gl_pathc; i++, s->nfiles++)
        if (!(s->files[i].path = strdup(g.gl_pathv[i])))
            rc = base_error(SPMD_ERR_NOMEM, "shards: out of memory");
    globfree(&g);
    if (rc != SPMD_OK) return rc;
    /* glob sorts by the locale's collation; byte order keeps the file order,
     * and so the held-out choice, the same everywhere. */
    char **names = malloc((size_t)s->nfiles * sizeof *names);
    if (!names) return base_error(SPMD_ERR_NOMEM, "shards: out of memory");
    for (int i = 0; i < s->nfiles; i++) names[i] = s->files[i].path;
    qsort(names, (size_t)s->nfiles, sizeof *names, cmp_path);
    for (int i = 0; i < s->nfiles; i++) s->files[i].path = names[i];
    free(names);
    return SPMD_OK;
}

static bool named_val(const char *path)
{
    const char *base = strrchr(path, '/');
    return strstr(base ? base + 1 : path, "val") != NULL;
}

static spmd_status add_segment(shards *s, spmd_split split, int file, int64_t begin, int64_t len,
                               int seq)
{
    segment *grown = realloc(s->seg[split], (size_t)(s->nseg[split] + 1) * sizeof *grown);
    if (!grown) return base_error(SPMD_ERR_NOMEM, "shards: out of memory");
    s->seg[split] = grown;
    grown[s->nseg[split]++] = (segment){file, begin, len, s->windows[split], s->strides[split]};
    if (len > seq) s->windows[split] += len - seq;
    if (len > seq) s->strides[split] += (len - 1) / seq;
    return SPMD_OK;
}

/* Splits the files into training and held-out segments; `what` gets the
 * held-out rule for the description. */
static spmd_status plan_splits(shards *s, int seq, char *what, size_t what_size)
{
    spmd_status rc = SPMD_OK;
    if (s->nfiles == 1) {
        int64_t tail = dataset_tail_len(s->files[0].ntok, seq);
        if (tail == 0)
            return base_error(SPMD_ERR_INVALID,
                              "shards: %s has %lld tokens, too short for seq %d: one file needs "
                              "a training and a held-out window of seq+1 tokens each (at least "
                              "%lld)", s->files[0].path, (long long)s->files[0].ntok, seq,
                              2 * ((long long)seq + 1));
        int64_t n = s->files[0].ntok;
        rc = add_segment(s, SPMD_SPLIT_TRAIN, 0, 0, n - tail, seq);
        if (rc == SPMD_OK) rc = add_segment(s, SPMD_SPLIT_HELDOUT, 0, n - tail, tail, seq);
        snprintf(what, what_size, "last %lld tokens held out", (long long)tail);
        return rc;
    }
    int nval = 0;
    for (int i = 0; i < s->nfiles; i++) nval += named_val(s->files[i].path);
    bool by_name = nval > 0 && nval < s->nfiles;
    for (int i = 0; rc == SPMD_OK && i < s->nfiles; i++) {
        bool held = by_name ? named_val(s->files[i].path) : i == 0;
        rc = add_segment(s, held ? SPMD_SPLIT_HELDOUT : SPMD_SPLIT_TRAIN, i, 0, s->files[i].ntok,
                         seq);
    }
    if (rc != SPMD_OK) return rc;
    if (by_name)
        snprintf(what, what_size, "%d file%s named *val* held out", nval, nval > 1 ? "s" : "");
    else
        snprintf(what, what_size, "first file %s held out", s->files[0].path);
    for (int split = 0; split < 2; split++)
        if (s->windows[split] == 0)
            return base_error(SPMD_ERR_INVALID,
                              "shards: no %s file has more than seq = %d tokens (%s), so there "
                              "is no %s window", split ? "held-out" : "training", seq, what,
                              split ? "held-out" : "training");
    return SPMD_OK;
}

spmd_status dataset_shards_open(spmd_dataset *d, const char *pattern)
{
    shards *s = calloc(1, sizeof *s);
    if (!s) return base_error(SPMD_ERR_NOMEM, "shards: out of memory");
    spmd_status rc = expand(s, pattern);
    for (int i = 0; i < s->nfiles; i++) s->files[i].fd = -1;
    int64_t total = 0;
    int32_t max_tok = 0;
    int keep = files_kept_open();
    for (int i = 0; rc == SPMD_OK && i < s->nfiles; i++) {
        rc = load_shard(&s->files[i], i < keep);
        total += s->files[i].ntok;
        if (s->files[i].max_tok > max_tok) max_tok = s->files[i].max_tok;
    }
    char what[256] = "";
    if (rc == SPMD_OK) rc = plan_splits(s, d->seq, what, sizeof what);
    if (rc != SPMD_OK) {
        shards_destroy(s);
        return rc;
    }
    s->stream[SPMD_SPLIT_TRAIN] = base_rng_stream("data.shards.train");
    s->stream[SPMD_SPLIT_HELDOUT] = base_rng_stream("data.shards.heldout");
    d->impl = s;
    d->ops = &shards_ops;
    d->vocab = max_tok + 1;
    d->can_sequential = true;
    d->heldout_size = s->windows[SPMD_SPLIT_HELDOUT];
    snprintf(d->describe, sizeof d->describe, "shards: %d file%s, %lld tokens, %s", s->nfiles,
             s->nfiles > 1 ? "s" : "", (long long)total, what);
    return SPMD_OK;
}
