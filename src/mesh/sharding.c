/*
 * Shardings: the partition-spec parser and printer, GSPMD HloSharding
 * text, block arithmetic and an ASCII picture of who holds what.
 *
 * Grammar of the text form (whitespace anywhere, columns are 1-based):
 *     spec    := [entry (',' entry)*] ['|' 'partial' '(' axes ')']
 *     entry   := 'None' | [groups '*'] (axis | '(' axes ')')
 *     axes    := axis (',' axis)* [',']
 *     axis    := identifier | 'quoted' | "quoted"
 * Quotes let Python users paste ('fsdp', None) entries as they write them;
 * the trailing comma inside parentheses is Python's one-tuple ('fsdp',).
 * `3*tensor` is a grouped split (mesh.h): the dim as 3 equal runs, each
 * split over 'tensor'.
 * Parentheses are checked in a first pass over the tokens, so an
 * unbalanced spec is reported as such instead of as whatever token the
 * parser meets first.
 */
#include "mesh/sharding.h"
#include "base/error.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sharding sharding_replicated(int rank)
{
    sharding s;
    memset(&s, 0, sizeof s);
    s.rank = rank;
    return s;
}

/* ---- Tokens ------------------------------------------------------------------ */

typedef enum tok_kind {
    TOK_END, TOK_NAME, TOK_NUMBER, TOK_STAR, TOK_LPAREN, TOK_RPAREN, TOK_COMMA, TOK_BAR, TOK_BAD
} tok_kind;

typedef struct token {
    tok_kind kind;
    int pos, len; /* byte offset and length in the text, quotes included */
    bool quoted;
} token;

static token lex(const char *text, int pos)
{
    while (isspace((unsigned char)text[pos])) pos++;
    token t = {TOK_END, pos, 0, false};
    char c = text[pos];
    const char *close;
    if (!c) return t;
    t.len = 1;
    switch (c) {
    case '(': t.kind = TOK_LPAREN; return t;
    case ')': t.kind = TOK_RPAREN; return t;
    case ',': t.kind = TOK_COMMA; return t;
    case '|': t.kind = TOK_BAR; return t;
    case '*': t.kind = TOK_STAR; return t;
    case '\'': case '"':
        close = strchr(text + pos + 1, c);
        t.kind = close ? TOK_NAME : TOK_BAD;
        t.quoted = close != NULL;
        if (close) t.len = (int)(close - (text + pos)) + 1;
        return t;
    default: break;
    }
    if (isdigit((unsigned char)c)) {
        while (isdigit((unsigned char)text[pos + t.len])) t.len++;
        t.kind = TOK_NUMBER;
        return t;
    }
    if (!isalpha((unsigned char)c) && c != '_') {
        t.kind = TOK_BAD;
        return t;
    }
    while (isalnum((unsigned char)text[pos + t.len]) || text[pos + t.len] == '_') t.len++;
    t.kind = TOK_NAME;
    return t;
}

static bool tok_is(const char *text, token t, const char *word)
{
    return t.kind == TOK_NAME && !t.quoted && (size_t)t.len == strlen(word) &&
           memcmp(text + t.pos, word, (size_t)t.len) == 0;
}

/* ---- Parser ---------------------------------------------------------------------- */

typedef struct parser {
    const char *text;
    const spmd_mesh *m;
    token tok;                     /* the current token */
    int used_at[MESH_MAX_AXES];    /* column where each axis was used, 0: unused */
} parser;

static void advance(parser *p) { p->tok = lex(p->text, p->tok.pos + p->tok.len); }

/* Every message starts with the spec, so columns can be counted; a long
 * spec is cut down to the stretch around byte offset `at`, where the
 * trouble is, so the reason and its column always fit after it. */
__attribute__((format(printf, 3, 4))) static spmd_status fail(const parser *p, int at,
                                                              const char *fmt, ...)
{
    char msg[512], quoted[MESH_EXCERPT_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = strlen(p->text);
    mesh_text_excerpt(p->text, (size_t)at, quoted, sizeof quoted);
    if (len < sizeof quoted) return base_error(SPMD_ERR_INVALID, "spec \"%s\": %s", quoted, msg);
    return base_error(SPMD_ERR_INVALID, "spec \"%s\" (%zu characters): %s", quoted, len, msg);
}

/* Tokens and names quoted in messages stop at this many characters. */
enum { QUOTE_MAX = 40 };

static spmd_status unexpected(const parser *p, const char *expected)
{
    int len = p->tok.len < QUOTE_MAX ? p->tok.len : QUOTE_MAX;
    return fail(p, p->tok.pos, "unexpected '%.*s%s' at column %d (expected %s)", len,
                p->text + p->tok.pos, len < p->tok.len ? "..." : "", p->tok.pos + 1, expected);
}

/* Bad characters, unclosed quotes and parentheses, nesting. */
static spmd_status check_tokens(const parser *p)
{
    int open = -1; /* offset of the '(' not yet closed */
    for (token t = lex(p->text, 0); t.kind != TOK_END; t = lex(p->text, t.pos + t.len)) {
        char c = p->text[t.pos];
        if (t.kind == TOK_BAD && (c == '\'' || c == '"'))
            return fail(p, t.pos, "the quote %c at column %d is never closed", c, t.pos + 1);
        if (t.kind == TOK_BAD && !isprint((unsigned char)c))
            return fail(p, t.pos, "unexpected byte 0x%02x at column %d", (unsigned char)c,
                        t.pos + 1);
        if (t.kind == TOK_BAD) return fail(p, t.pos, "unexpected '%c' at column %d", c, t.pos + 1);
        if (t.kind == TOK_LPAREN && open >= 0)
            return fail(p, t.pos, "'(' at column %d opens a tuple inside the one at column %d: "
                        "tuples do not nest", t.pos + 1, open + 1);
        if (t.kind == TOK_RPAREN && open < 0)
            return fail(p, t.pos, "unbalanced parentheses: ')' at column %d has no matching '('",
                        t.pos + 1);
        if (t.kind == TOK_LPAREN) open = t.pos;
        if (t.kind == TOK_RPAREN) open = -1;
    }
    if (open >= 0)
        return fail(p, open, "unbalanced parentheses: '(' at column %d is never closed",
                    open + 1);
    return SPMD_OK;
}

/* The axis the current name token names, appended to `dst`. */
static spmd_status parse_axis(parser *p, mesh_axes *dst)
{
    token t = p->tok;
    const char *name = p->text + t.pos + t.quoted;
    int len = t.len - 2 * t.quoted, column = t.pos + 1;
    if (tok_is(p->text, t, "None"))
        return fail(p, t.pos, "None at column %d cannot be part of a tuple or partial(...)",
                    column);
    int a = mesh_find_axis(p->m, name, (size_t)len);
    if (a < 0) {
        char axes[MESH_MAX_AXES * (MESH_MAX_NAME + 2)];
        mesh_text list;
        mesh_text_init(&list, axes, sizeof axes);
        mesh_axes all = mesh_axes_from_mask(p->m, ~0u);
        mesh_text_axes(&list, p->m, &all);
        int shown = len < QUOTE_MAX ? len : QUOTE_MAX;
        return fail(p, t.pos, "unknown axis '%.*s%s' at column %d (mesh axes: %s)", shown, name,
                    shown < len ? "..." : "", column, axes);
    }
    if (p->used_at[a])
        return fail(p, t.pos, "axis '%s' used twice (column %d), first at column %d",
                    p->m->names[a], column, p->used_at[a]);
    p->used_at[a] = column;
    dst->axis[dst->n++] = (int8_t)a;
    advance(p);
    return SPMD_OK;
}

/* '(' axes ')': a tuple entry, or the axes of partial(...). */
static spmd_status parse_axis_list(parser *p, mesh_axes *dst, const char *what)
{
    int open = p->tok.pos + 1;
    advance(p);
    if (p->tok.kind == TOK_RPAREN)
        return fail(p, open - 1, "empty %s '()' at column %d", what, open);
    for (;;) {
        if (p->tok.kind == TOK_COMMA)
            return fail(p, p->tok.pos, "empty entry at column %d", p->tok.pos + 1);
        if (p->tok.kind != TOK_NAME) return unexpected(p, "an axis name");
        spmd_status st = parse_axis(p, dst);
        if (st) return st;
        if (p->tok.kind == TOK_COMMA) advance(p);
        else if (p->tok.kind != TOK_RPAREN) return unexpected(p, "',' or ')'");
        if (p->tok.kind == TOK_RPAREN) break;
    }
    advance(p);
    return SPMD_OK;
}

static spmd_status parse_entry(parser *p, mesh_axes *dst)
{
    dst->n = 0;
    dst->groups = 0;
    if (p->tok.kind == TOK_NUMBER) {
        /* N*axis or N*(axes): a grouped split. */
        token num = p->tok;
        long groups = num.len <= 5 ? strtol(p->text + num.pos, NULL, 10) : 0;
        /* torch_xla's specs name mesh axes by index: here they go by name. */
        if (lex(p->text, num.pos + num.len).kind != TOK_STAR) {
            char axes[MESH_MAX_AXES * (MESH_MAX_NAME + 2)];
            mesh_text list;
            mesh_text_init(&list, axes, sizeof axes);
            mesh_axes all = mesh_axes_from_mask(p->m, ~0u);
            mesh_text_axes(&list, p->m, &all);
            return fail(p, num.pos, "an axis index '%.*s' at column %d: axes go by name here, not "
                        "by torch_xla's mesh index (mesh axes: %s); a group count wants '*' and "
                        "the axes after it (as in 2*%s)",
                        num.len < QUOTE_MAX ? num.len : QUOTE_MAX, p->text + num.pos, num.pos + 1,
                        axes, p->m->names[0]);
        }
        if (groups < 1 || groups > INT16_MAX)
            return fail(p, num.pos, "groups '%.*s' at column %d must be 1 to 32767",
                        num.len < QUOTE_MAX ? num.len : QUOTE_MAX, p->text + num.pos, num.pos + 1);
        advance(p); /* onto the '*' */
        int star = p->tok.pos + 1;
        advance(p);
        if (p->tok.kind == TOK_END || p->tok.kind == TOK_BAR)
            return fail(p, star - 1, "the '*' at column %d wants an axis or a tuple after it",
                        star);
        if (tok_is(p->text, p->tok, "None"))
            return fail(p, p->tok.pos, "None at column %d cannot be grouped (N*axis)",
                        p->tok.pos + 1);
        spmd_status st = p->tok.kind == TOK_NAME     ? parse_axis(p, dst)
                         : p->tok.kind == TOK_LPAREN ? parse_axis_list(p, dst, "tuple")
                                                     : unexpected(p, "an axis or a tuple after '*'");
        dst->groups = groups > 1 ? (int16_t)groups : 0;
        return st;
    }
    if (tok_is(p->text, p->tok, "None")) {
        advance(p);
        return SPMD_OK;
    }
    if (tok_is(p->text, p->tok, "partial") && lex(p->text, p->tok.pos + p->tok.len).kind == TOK_LPAREN)
        return fail(p, p->tok.pos, "partial(...) at column %d is not an entry: it goes last, "
                    "after a '|' (as in 'fsdp, None | partial(tensor)')", p->tok.pos + 1);
    if (p->tok.kind == TOK_NAME) return parse_axis(p, dst);
    if (p->tok.kind == TOK_LPAREN) return parse_axis_list(p, dst, "tuple");
    return fail(p, p->tok.pos, "empty entry at column %d", p->tok.pos + 1);
}

/* '|' 'partial' '(' axes ')' at the end of the spec. */
static spmd_status parse_partial(parser *p, uint32_t *partial)
{
    int bar = p->tok.pos + 1;
    advance(p);
    if (!tok_is(p->text, p->tok, "partial"))
        return fail(p, p->tok.pos, "expected partial(axes) after the '|' at column %d", bar);
    int word = p->tok.pos + 1;
    advance(p);
    if (p->tok.kind != TOK_LPAREN)
        return fail(p, p->tok.pos, "expected '(' after the partial at column %d", word);
    mesh_axes axes = {0};
    spmd_status st = parse_axis_list(p, &axes, "partial");
    if (st) return st;
    *partial = mesh_axes_mask(&axes);
    return p->tok.kind == TOK_END ? SPMD_OK : unexpected(p, "the end after partial(...)");
}

spmd_status sharding_parse(const char *text, const spmd_mesh *m, int rank, sharding *out)
{
    if (!text || !m || !out)
        return base_error(SPMD_ERR_INVALID, "sharding spec, mesh or result is NULL");
    parser p = {.text = text, .m = m};
    if (rank < 0 || rank > SPMD_MAX_RANK)
        return fail(&p, 0, "rank %d is outside 0..%d", rank, SPMD_MAX_RANK);
    spmd_status st = check_tokens(&p);
    if (st) return st;
    sharding s = sharding_replicated(rank);
    int n = 0;
    p.tok = lex(text, 0);
    while (p.tok.kind != TOK_END && p.tok.kind != TOK_BAR) {
        mesh_axes extra; /* entries past the rank: parsed, then counted in the error */
        st = parse_entry(&p, n < rank ? &s.dim[n] : &extra);
        if (st) return st;
        n++;
        if (p.tok.kind == TOK_COMMA) {
            advance(&p);
            if (p.tok.kind == TOK_END || p.tok.kind == TOK_BAR)
                return fail(&p, p.tok.pos, "empty entry at column %d", p.tok.pos + 1);
        } else if (p.tok.kind != TOK_END && p.tok.kind != TOK_BAR) {
            return unexpected(&p, "','");
        }
    }
    if (p.tok.kind == TOK_BAR && (st = parse_partial(&p, &s.partial))) return st;
    if (n != rank)
        return fail(&p, p.tok.pos, "%d %s for a rank-%d tensor", n, n == 1 ? "entry" : "entries",
                    rank);
    *out = s;
    return SPMD_OK;
}

/* ---- Printing ---------------------------------------------------------------- */

const char *sharding_format(const sharding *s, const spmd_mesh *m, char *buf, size_t size)
{
    mesh_text t;
    mesh_text_init(&t, buf, size);
    if (!t.size) return "";
    for (int d = 0; d < s->rank; d++) {
        const mesh_axes *axes = &s->dim[d];
        mesh_text_add(&t, "%s", d ? ", " : "");
        if (axes->n && mesh_axes_groups(axes) > 1) mesh_text_add(&t, "%d*", axes->groups);
        mesh_text_add(&t, "%s", axes->n == 0 ? "None" : axes->n > 1 ? "(" : "");
        mesh_text_axes(&t, m, axes);
        if (axes->n > 1) mesh_text_add(&t, ")");
    }
    if (s->partial) {
        mesh_axes partial = mesh_axes_from_mask(m, s->partial);
        mesh_text_add(&t, "%spartial(", s->rank ? " | " : "| ");
        mesh_text_axes(&t, m, &partial);
        mesh_text_add(&t, ")");
    }
    return buf;
}

static int compare_ints(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The device at flat index `tile` of a tile array whose dims are the
 * groups of axes (row-major; each group a mixed radix, major first). */
static int tile_device(const spmd_mesh *m, const mesh_axes *groups, int n_groups, int tile)
{
    int coords[MESH_MAX_AXES] = {0};
    for (int i = n_groups - 1; i >= 0; i--) {
        int size = mesh_axes_size(m, &groups[i]);
        mesh_set_coords(m, &groups[i], tile % size, coords);
        tile /= size;
    }
    return mesh_device_at(m, coords);
}

/*
 * XLA's HloSharding text.  The tile array is [blocks of each dim...,
 * unreduced, replicated], the last two only when larger than 1.  Pending
 * sums (partial axes) use XLA's UNREDUCED subgroup type, printed as
 * `last_tile_dims={unreduced}` (`{unreduced, replicated}` when unused
 * axes remain, in XLA's order of subgroup types), or `{unreduced}` alone
 * when nothing is tiled or replicated.  Like XLA's PartialTile, each
 * replicated group's device ids are listed sorted: its members hold the
 * same data, so the order carries no meaning.
 */
const char *sharding_format_hlo(const sharding *s, const spmd_mesh *m, char *buf, size_t size)
{
    mesh_text t;
    mesh_text_init(&t, buf, size);
    if (!t.size) return "";
    if (sharding_has_groups(s)) {
        /* HloSharding tiles each dim in contiguous blocks: no form for this. */
        mesh_text_add(&t, "{grouped split: no HloSharding form}");
        return buf;
    }
    mesh_axes groups[SPMD_MAX_RANK + 2];
    int n_groups = 0, tiles = 1;
    for (int d = 0; d < s->rank; d++) {
        groups[n_groups++] = s->dim[d];
        tiles *= mesh_axes_size(m, &s->dim[d]);
    }
    mesh_axes unreduced = mesh_axes_from_mask(m, s->partial);
    mesh_axes replicated = mesh_axes_from_mask(m, ~(s->partial | sharding_dim_axes(s)));
    int u = mesh_axes_size(m, &unreduced), r = mesh_axes_size(m, &replicated);
    if (tiles == 1 && u == 1) {
        mesh_text_add(&t, "{replicated}");
        return buf;
    }
    if (tiles == 1 && r == 1) {
        mesh_text_add(&t, "{unreduced}");
        return buf;
    }
    if (u > 1) groups[n_groups++] = unreduced;
    if (r > 1) groups[n_groups++] = replicated;
    mesh_text_add(&t, "{devices=[");
    for (int i = 0; i < n_groups; i++)
        mesh_text_add(&t, i ? ",%d" : "%d", mesh_axes_size(m, &groups[i]));
    mesh_text_add(&t, "]");
    int ids[MESH_MAX_DEVICES];
    for (int i = 0; i < m->n_devices; i++) ids[i] = tile_device(m, groups, n_groups, i);
    for (int i = 0; r > 1 && i < m->n_devices; i += r)
        qsort(ids + i, (size_t)r, sizeof *ids, compare_ints);
    for (int i = 0; i < m->n_devices; i++) mesh_text_add(&t, i ? ",%d" : "%d", ids[i]);
    if (u > 1)
        mesh_text_add(&t, " last_tile_dims={unreduced%s}", r > 1 ? ", replicated" : "");
    else if (r > 1)
        mesh_text_add(&t, " last_tile_dim_replicate");
    mesh_text_add(&t, "}");
    return buf;
}

/* ---- Block arithmetic ------------------------------------------------------------ */

bool sharding_equal(const sharding *a, const sharding *b)
{
    if (a->rank != b->rank || a->partial != b->partial) return false;
    for (int d = 0; d < a->rank; d++) {
        if (a->dim[d].n != b->dim[d].n) return false;
        if (a->dim[d].n && mesh_axes_groups(&a->dim[d]) != mesh_axes_groups(&b->dim[d]))
            return false;
        for (int i = 0; i < a->dim[d].n; i++)
            if (a->dim[d].axis[i] != b->dim[d].axis[i]) return false;
    }
    return true;
}

uint32_t sharding_dim_axes(const sharding *s)
{
    uint32_t mask = 0;
    for (int d = 0; d < s->rank; d++) mask |= mesh_axes_mask(&s->dim[d]);
    return mask;
}

int64_t sharding_blocks(const sharding *s, const spmd_mesh *m, int d)
{
    return mesh_axes_size(m, &s->dim[d]);
}

int64_t sharding_block_size(const sharding *s, const spmd_mesh *m, int d, int64_t global)
{
    /* A grouped split holds a block of each group (exact: never padded). */
    int64_t blocks = sharding_blocks(s, m, d), groups = mesh_axes_groups(&s->dim[d]);
    if (groups > 1) return global / groups / blocks * groups;
    return (global + blocks - 1) / blocks;
}

bool sharding_has_groups(const sharding *s)
{
    for (int d = 0; d < s->rank; d++)
        if (s->dim[d].n && mesh_axes_groups(&s->dim[d]) > 1) return true;
    return false;
}

bool sharding_groups_exact(const sharding *s, const spmd_mesh *m, int d, int64_t global)
{
    int64_t groups = mesh_axes_groups(&s->dim[d]);
    return groups == 1 || global % (groups * sharding_blocks(s, m, d)) == 0;
}

int64_t sharding_block_valid(const sharding *s, const spmd_mesh *m, int d, int64_t global,
                             int64_t block)
{
    int64_t size = sharding_block_size(s, m, d, global);
    if (mesh_axes_groups(&s->dim[d]) > 1) return size;
    int64_t left = global - block * size;
    return left < 0 ? 0 : left < size ? left : size;
}

int64_t sharding_block_index(const sharding *s, const spmd_mesh *m, int d, int device)
{
    return mesh_group_rank(m, device, &s->dim[d]);
}

void sharding_local_dims(const sharding *s, const spmd_mesh *m, int rank, const int64_t *dims,
                         int64_t *local)
{
    for (int d = 0; d < rank; d++) local[d] = sharding_block_size(s, m, d, dims[d]);
}

bool sharding_has_padding(const sharding *s, const spmd_mesh *m, const int64_t *dims)
{
    for (int d = 0; d < s->rank; d++)
        if (sharding_block_size(s, m, d, dims[d]) * sharding_blocks(s, m, d) > dims[d]) return true;
    return false;
}

/* ---- Picture ------------------------------------------------------------------------ */

enum { CELL_LABEL_MAX = 40 };

/* "0,2,4,6": the devices holding block (row, col), cut with "..." when long. */
static void cell_label(const sharding *s, const spmd_mesh *m, int64_t row, int64_t col,
                       char *buf, size_t size)
{
    mesh_text t;
    int n = 0;
    mesh_text_init(&t, buf, size);
    for (int dev = 0; dev < m->n_devices; dev++) {
        if (s->rank == 2 && sharding_block_index(s, m, 0, dev) != row) continue;
        if (s->rank >= 1 && sharding_block_index(s, m, s->rank - 1, dev) != col) continue;
        mesh_text_add(&t, n++ ? ",%d" : "%d", dev);
    }
    if (t.len >= size) memcpy(buf + size - 4, "...", 4);
}

/* +------+------+ with cells `width` wide. */
static void rule(mesh_text *t, int64_t cols, int width)
{
    char dashes[CELL_LABEL_MAX + 3];
    memset(dashes, '-', (size_t)width);
    dashes[width] = '\0';
    mesh_text_add(t, "+");
    for (int64_t c = 0; c < cols; c++) mesh_text_add(t, "%s+", dashes);
}

static void add_dims(mesh_text *t, int rank, const int64_t *dims)
{
    mesh_text_add(t, "[");
    for (int d = 0; d < rank; d++) mesh_text_add(t, d ? ", %lld" : "%lld", (long long)dims[d]);
    mesh_text_add(t, "]");
}

/* "[10, 6] as 'replica, fsdp': blocks of [3, 3], padded to [12, 6]" */
static void header(mesh_text *t, const sharding *s, const spmd_mesh *m, const int64_t *dims)
{
    char spec[256];
    int64_t block[SPMD_MAX_RANK], padded[SPMD_MAX_RANK];
    sharding_local_dims(s, m, s->rank, dims, block);
    for (int d = 0; d < s->rank; d++) padded[d] = block[d] * sharding_blocks(s, m, d);
    add_dims(t, s->rank, dims);
    mesh_text_add(t, " as '%s': blocks of ", sharding_format(s, m, spec, sizeof spec));
    add_dims(t, s->rank, block);
    if (sharding_has_padding(s, m, dims)) {
        mesh_text_add(t, ", padded to ");
        add_dims(t, s->rank, padded);
    }
    mesh_text_add(t, "\n");
}

/*
 * One line per block row between +---+ rules, every cell as wide as the
 * longest label: blocks are all the same (padded) size, so equal cells
 * are the honest picture.  A header line gives the shape, the spec and
 * the block shape.
 */
int sharding_visualize(const sharding *s, const spmd_mesh *m, int rank, const int64_t *dims,
                       char *buf, size_t size)
{
    if (!s || !m || (rank > 0 && !dims) || !buf || !size) {
        base_error(SPMD_ERR_INVALID, "sharding_visualize: a NULL argument");
        return -1;
    }
    if (rank > 2 || rank != s->rank) {
        base_error(SPMD_ERR_INVALID,
                   "sharding_visualize: can draw 1-D and 2-D tensors only, got rank %d (sharding "
                   "rank %d)", rank, s->rank);
        return -1;
    }
    if (sharding_has_groups(s)) {
        base_error(SPMD_ERR_UNSUPPORTED,
                   "sharding_visualize: a grouped split (N*axis) holds a block of every group "
                   "on each device; the picture draws one block per device");
        return -1;
    }
    char label[CELL_LABEL_MAX + 1];
    int64_t rows = rank == 2 ? sharding_blocks(s, m, 0) : 1;
    int64_t cols = rank >= 1 ? sharding_blocks(s, m, rank - 1) : 1;
    int width = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            cell_label(s, m, r, c, label, sizeof label);
            if ((int)strlen(label) > width) width = (int)strlen(label);
        }
    width += 2;
    mesh_text t;
    mesh_text_init(&t, buf, size);
    header(&t, s, m, dims);
    rule(&t, cols, width);
    for (int64_t r = 0; r < rows; r++) {
        mesh_text_add(&t, "\n|");
        for (int64_t c = 0; c < cols; c++) {
            cell_label(s, m, r, c, label, sizeof label);
            int len = (int)strlen(label), left = (width - len) / 2;
            mesh_text_add(&t, "%*s%s%*s|", left, "", label, width - len - left, "");
        }
        mesh_text_add(&t, "\n");
        rule(&t, cols, width);
    }
    mesh_text_add(&t, "\n");
    return (int)mesh_text_written(&t);
}
