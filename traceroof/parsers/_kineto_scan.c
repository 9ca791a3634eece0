/* _kineto_scan: a validating scanner of a Kineto JSON event array into columns.
 *
 * Scanner(spellings).scan(data) -> dict | None;  Scanner.strings(start) -> list
 *
 *   spellings  a tuple of (key: bytes, slot: int, kind: int): the ``args`` keys to read
 *              (kind 0 NUMBER, 1 JSON_TEXT, 2 ANY); spellings of one slot in precedence order.
 *   data       any buffer: a JSON array of event objects, ``[ {...}, ... ]`` (whitespace
 *              around it allowed, nothing else); with ``bare``, its items without the
 *              brackets (``{...}, {...}``, at least one).
 *
 * One Scanner holds one string dictionary for all its scans (a file's chunks): codes are
 * stable across scans; ``strings(start)`` returns the dictionary from code ``start`` on.
 *
 * Returns None ("not handled") for anything it does not fully validate and understand:
 * invalid JSON, invalid UTF-8 anywhere, an escape in a key, a lone surrogate, nesting
 * deeper than MAX_DEPTH, an event that is not an object, a field of an unexpected type
 * (bool/object/array/float where an id is expected, a string ts), an integer beyond 18
 * digits, a number whose exponent is beyond +-300, a time beyond int64 ns. The caller then
 * decodes the same bytes with msgspec, exactly as without this module.
 *
 * Every read is bounded by the buffer's end; every loop advances or fails; recursion is
 * bounded by MAX_DEPTH; all allocations are checked (failure: MemoryError).
 *
 * Output columns (little-endian machine arrays in bytes objects, one entry per event):
 *   ph, cat, name, pid, tid: int32 codes into ``strings`` (0 = absent/null; strings[0] is
 *     None); a pid/tid integer is the code of its decimal text (as Python's str(int)).
 *   ts, dur: int64 ns (kineto_times.raw_us_to_ns's arithmetic, exact, never float64);
 *   ts_state, dur_state: uint8, 0 absent, 1 null, 2 a number.
 *   slots: per slot, (kinds, values): NUMBER: kinds uint8 (0 none, 2 int, 3 string),
 *     values int64 (the int, or the string's code); JSON_TEXT: (None, int32 codes of the raw
 *     text with newlines and the whitespace after them removed; 0 when the first present
 *     spelling is null/empty/absent); ANY: (None, int32 code of a string value, 0 otherwise).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <stddef.h>

#define MAX_DEPTH 64
#define MAX_SPELLINGS 48
#define MAX_SLOTS 32
#define MAX_EXP 300
#define INT_DIGITS 18

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} Cur;

/* ----------------------------------------------------------------- string interning */
typedef struct {
    char *arena;
    size_t arena_len, arena_cap;
    size_t *off;      /* per code (1-based; index 0 unused) */
    size_t *len;
    size_t n, cap;    /* codes used (incl. 0), capacity */
    uint32_t *table;  /* open addressing: code or 0 */
    size_t tcap;      /* power of two */
} Intern;

static int intern_init(Intern *t) {
    memset(t, 0, sizeof(*t));
    t->cap = 256;
    t->off = malloc(t->cap * sizeof(size_t));
    t->len = malloc(t->cap * sizeof(size_t));
    t->tcap = 1024;
    t->table = calloc(t->tcap, sizeof(uint32_t));
    t->arena_cap = 1 << 16;
    t->arena = malloc(t->arena_cap);
    t->n = 1;
    if (!t->off || !t->len || !t->table || !t->arena) return -1;
    t->off[0] = t->len[0] = 0;
    return 0;
}

static void intern_free(Intern *t) {
    free(t->arena); free(t->off); free(t->len); free(t->table);
}

static inline uint64_t mix8(uint64_t h, const char *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
    return h ^ (h >> 31);
}

static uint64_t hash_bytes(const char *s, size_t n) {
    /* 8 bytes a step (multiply-xorshift), the tail byte by byte. A string over 128 bytes
     * (a long kernel name) is hashed on its length, first and last 64 bytes and 16 words
     * spread over the middle: equal strings still compare with memcmp, so this only
     * decides how well codes spread. */
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    if (n > 128) {
        for (size_t i = 0; i < 64; i += 8) h = mix8(h, s + i);
        for (size_t i = n - 64; i + 8 <= n; i += 8) h = mix8(h, s + i);
        size_t step = (n - 128) / 16;
        if (step) for (size_t i = 64; i + 8 <= n - 64; i += step) h = mix8(h, s + i);
    } else {
        size_t i = 0;
        for (; i + 8 <= n; i += 8) h = mix8(h, s + i);
        for (; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001B3ULL;
    }
    h ^= h >> 29;
    h *= 0x94D049BB133111EBULL;
    h ^= h >> 32;
    return h;
}

static int intern_grow_table(Intern *t) {
    size_t ncap = t->tcap * 2;
    uint32_t *nt = calloc(ncap, sizeof(uint32_t));
    if (!nt) return -1;
    for (size_t c = 1; c < t->n; c++) {
        uint64_t h = hash_bytes(t->arena + t->off[c], t->len[c]);
        size_t i = (size_t)h & (ncap - 1);
        while (nt[i]) i = (i + 1) & (ncap - 1);
        nt[i] = (uint32_t)c;
    }
    free(t->table);
    t->table = nt;
    t->tcap = ncap;
    return 0;
}

/* the code of s[0:n] (added when new); -1 on allocation failure */
static int64_t intern(Intern *t, const char *s, size_t n) {
    uint64_t h = hash_bytes(s, n);
    size_t i = (size_t)h & (t->tcap - 1);
    while (t->table[i]) {
        uint32_t c = t->table[i];
        if (t->len[c] == n && memcmp(t->arena + t->off[c], s, n) == 0) return c;
        i = (i + 1) & (t->tcap - 1);
    }
    if (t->n >= 0x7fffffff) return -1;
    if (t->n == t->cap) {
        size_t nc = t->cap * 2;
        size_t *o = realloc(t->off, nc * sizeof(size_t));
        if (!o) return -1;
        t->off = o;
        size_t *l = realloc(t->len, nc * sizeof(size_t));
        if (!l) return -1;
        t->len = l;
        t->cap = nc;
    }
    if (t->arena_len + n > t->arena_cap) {
        size_t nc = t->arena_cap;
        while (t->arena_len + n > nc) nc *= 2;
        char *a = realloc(t->arena, nc);
        if (!a) return -1;
        t->arena = a;
        t->arena_cap = nc;
    }
    if (n) memcpy(t->arena + t->arena_len, s, n);
    uint32_t code = (uint32_t)t->n;
    t->off[code] = t->arena_len;
    t->len[code] = n;
    t->arena_len += n;
    t->n++;
    t->table[i] = code;
    if (t->n * 2 > t->tcap && intern_grow_table(t) < 0) return -1;
    return code;
}

/* ----------------------------------------------------------------- scratch buffer */
typedef struct {
    char *b;
    size_t n, cap;
} Buf;

static int buf_put(Buf *b, const char *s, size_t n) {
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (b->n + n > nc) nc *= 2;
        char *x = realloc(b->b, nc);
        if (!x) return -1;
        b->b = x;
        b->cap = nc;
    }
    memcpy(b->b + b->n, s, n);
    b->n += n;
    return 0;
}

/* ----------------------------------------------------------------- lexing */
/* result codes */
#define OK 0
#define NO -1      /* not handled */
#define NOMEM -2   /* allocation failed */

static void skip_ws(Cur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++;
}

/* one UTF-8 sequence at c->p (first byte >= 0x80): strict (no overlong, no surrogate, <= U+10FFFF) */
static int utf8_seq(Cur *c) {
    const unsigned char *p = c->p;
    size_t left = (size_t)(c->end - p);
    unsigned char b0 = p[0];
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        if (left < 2 || (p[1] & 0xC0) != 0x80) return NO;
        c->p += 2;
        return OK;
    }
    if (b0 >= 0xE0 && b0 <= 0xEF) {
        if (left < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return NO;
        if (b0 == 0xE0 && p[1] < 0xA0) return NO;  /* overlong */
        if (b0 == 0xED && p[1] >= 0xA0) return NO;  /* surrogate */
        c->p += 3;
        return OK;
    }
    if (b0 >= 0xF0 && b0 <= 0xF4) {
        if (left < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return NO;
        if (b0 == 0xF0 && p[1] < 0x90) return NO;
        if (b0 == 0xF4 && p[1] >= 0x90) return NO;
        c->p += 4;
        return OK;
    }
    return NO;
}

static int hex4(const unsigned char *p, const unsigned char *end, unsigned *out) {
    if (end - p < 4) return NO;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char h = p[i];
        v <<= 4;
        if (h >= '0' && h <= '9') v |= (unsigned)(h - '0');
        else if (h >= 'a' && h <= 'f') v |= (unsigned)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') v |= (unsigned)(h - 'A' + 10);
        else return NO;
    }
    *out = v;
    return OK;
}

static int put_utf8(Buf *o, unsigned cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) { u[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12)); u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18)); u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
    }
    return buf_put(o, u, n) < 0 ? NOMEM : OK;
}

/* A string at c->p (its opening quote). Validates it; when ``o`` is given, appends the
 * decoded UTF-8 to it. ``raw_start``/``raw_len`` (when given): the content between the
 * quotes, and *escaped says whether it holds a backslash. */
static int lex_string(Cur *c, Buf *o, int *escaped) {
    if (c->p >= c->end || *c->p != '"') return NO;
    c->p++;
    if (escaped) *escaped = 0;
    for (;;) {
        const unsigned char *run = c->p;
        /* 8 bytes a step while none is a quote, a backslash, < 0x20 or >= 0x80 (SWAR:
         * "has a byte less than n" / "has a zero byte" have no false negatives) */
        while (c->end - c->p >= 8) {
            uint64_t w;
            memcpy(&w, c->p, 8);
            const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
            uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
            uint64_t hit = (w & high) | ((w - ones * 0x20) & ~w & high) | ((q - ones) & ~q & high)
                           | ((b - ones) & ~b & high);
            if (hit) break;
            c->p += 8;
        }
        while (c->p < c->end && *c->p >= 0x20 && *c->p != '"' && *c->p != '\\' && *c->p < 0x80) c->p++;
        if (o && c->p > run && buf_put(o, (const char *)run, (size_t)(c->p - run)) < 0) return NOMEM;
        if (c->p >= c->end) return NO;
        unsigned char ch = *c->p;
        if (ch == '"') { c->p++; return OK; }
        if (ch < 0x20) return NO;
        if (ch >= 0x80) {
            const unsigned char *s = c->p;
            if (utf8_seq(c) != OK) return NO;
            if (o && buf_put(o, (const char *)s, (size_t)(c->p - s)) < 0) return NOMEM;
            continue;
        }
        /* a backslash */
        if (escaped) *escaped = 1;
        if (c->end - c->p < 2) return NO;
        unsigned char e = c->p[1];
        char d;
        switch (e) {
        case '"': d = '"'; break;
        case '\\': d = '\\'; break;
        case '/': d = '/'; break;
        case 'b': d = '\b'; break;
        case 'f': d = '\f'; break;
        case 'n': d = '\n'; break;
        case 'r': d = '\r'; break;
        case 't': d = '\t'; break;
        case 'u': {
            unsigned cp;
            if (hex4(c->p + 2, c->end, &cp) != OK) return NO;
            c->p += 6;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return NO;  /* lone low surrogate */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (c->end - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u') return NO;
                if (hex4(c->p + 2, c->end, &lo) != OK || lo < 0xDC00 || lo > 0xDFFF) return NO;
                c->p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (o) { int r = put_utf8(o, cp); if (r != OK) return r; }
            continue;
        }
        default: return NO;
        }
        c->p += 2;
        if (o && buf_put(o, &d, 1) < 0) return NOMEM;
    }
}

/* A JSON number at c->p: validates it. Fills the parts when asked. */
typedef struct {
    int neg;
    const unsigned char *ip; size_t ip_n;   /* integer digits */
    const unsigned char *fp; size_t fp_n;   /* fraction digits (0 when none) */
    int has_exp; long exp;                  /* exponent (bounded to +-MAX_EXP) */
} Num;

static int lex_number(Cur *c, Num *n) {
    Num tmp;
    if (!n) n = &tmp;
    memset(n, 0, sizeof(*n));
    if (c->p < c->end && *c->p == '-') { n->neg = 1; c->p++; }
    if (c->p >= c->end) return NO;
    n->ip = c->p;
    if (*c->p == '0') c->p++;
    else if (*c->p >= '1' && *c->p <= '9') { while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++; }
    else return NO;
    n->ip_n = (size_t)(c->p - n->ip);
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        n->fp = c->p;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
        n->fp_n = (size_t)(c->p - n->fp);
        if (!n->fp_n) return NO;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        int eneg = 0;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-')) { eneg = *c->p == '-'; c->p++; }
        const unsigned char *es = c->p;
        long e = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            if (e <= MAX_EXP) e = e * 10 + (*c->p - '0');
            c->p++;
        }
        if (c->p == es) return NO;
        if (e > MAX_EXP) return NO;  /* beyond what msgspec's float holds: not handled */
        n->has_exp = 1;
        n->exp = eneg ? -e : e;
    }
    if (n->ip_n + n->fp_n > 400) return NO;
    return OK;
}

static int skip_value(Cur *c, int depth);

static int skip_container(Cur *c, int depth, unsigned char close) {
    if (depth >= MAX_DEPTH) return NO;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == close) { c->p++; return OK; }
    for (;;) {
        if (close == '}') {
            int r = lex_string(c, NULL, NULL);
            if (r != OK) return r;
            skip_ws(c);
            if (c->p >= c->end || *c->p != ':') return NO;
            c->p++;
            skip_ws(c);
        }
        int r = skip_value(c, depth + 1);
        if (r != OK) return r;
        skip_ws(c);
        if (c->p >= c->end) return NO;
        if (*c->p == ',') { c->p++; skip_ws(c); continue; }
        if (*c->p == close) { c->p++; return OK; }
        return NO;
    }
}

static int lit(Cur *c, const char *w, size_t n) {
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) return NO;
    c->p += n;
    return OK;
}

static int skip_value(Cur *c, int depth) {
    if (c->p >= c->end) return NO;
    switch (*c->p) {
    case '"': return lex_string(c, NULL, NULL);
    case '{': return skip_container(c, depth, '}');
    case '[': return skip_container(c, depth, ']');
    case 't': return lit(c, "true", 4);
    case 'f': return lit(c, "false", 5);
    case 'n': return lit(c, "null", 4);
    default: return lex_number(c, NULL);
    }
}

/* ----------------------------------------------------------------- numbers */
static const uint64_t POW10[20] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL, 100000000ULL,
    1000000000ULL, 10000000000ULL, 100000000000ULL, 1000000000000ULL, 10000000000000ULL,
    100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL,
    1000000000000000000ULL, 10000000000000000000ULL};

#define NS_MAX 9000000000000000000ULL  /* a bound below INT64_MAX: beyond it, not handled */

/* µs number → ns as kineto_times.raw_us_to_ns: without an exponent, integer part * 1000 +
 * the first 3 decimals + 1 when the 4th is >= 5 (then the sign); with one, Decimal(v) * 1000
 * rounded half-even. */
static int us_to_ns(const Num *n, int64_t *out) {
    if (!n->has_exp) {
        if (n->ip_n > INT_DIGITS) return NO;
        uint64_t ip = 0;
        for (size_t i = 0; i < n->ip_n; i++) ip = ip * 10 + (uint64_t)(n->ip[i] - '0');
        if (ip > (NS_MAX - 1000) / 1000) return NO;
        uint64_t f = 0;
        for (size_t i = 0; i < 3; i++) f = f * 10 + (i < n->fp_n ? (uint64_t)(n->fp[i] - '0') : 0);
        uint64_t ns = ip * 1000 + f + (n->fp_n > 3 && n->fp[3] >= '5' ? 1 : 0);
        *out = n->neg ? -(int64_t)ns : (int64_t)ns;
        return OK;
    }
    if (n->ip_n + n->fp_n > INT_DIGITS) return NO;
    uint64_t d = 0;
    for (size_t i = 0; i < n->ip_n; i++) d = d * 10 + (uint64_t)(n->ip[i] - '0');
    for (size_t i = 0; i < n->fp_n; i++) d = d * 10 + (uint64_t)(n->fp[i] - '0');
    long k = n->exp - (long)n->fp_n + 3;  /* ns = d * 10^k */
    uint64_t ns;
    if (d == 0) ns = 0;
    else if (k >= 0) {
        if (k > 18 || d > NS_MAX / POW10[k]) return NO;
        ns = d * POW10[k];
    } else if (k < -19) {
        ns = 0;  /* d < 1e18 < half of 10^-k */
    } else {
        uint64_t p = POW10[-k], q = d / p, r = d % p, half = p / 2;
        if (r > half || (r == half && (q & 1))) q++;
        ns = q;
    }
    *out = n->neg ? -(int64_t)ns : (int64_t)ns;
    return OK;
}

/* an integer (no fraction, no exponent, <= INT_DIGITS digits) → int64; NO otherwise */
static int num_int(const Num *n, int64_t *out) {
    if (n->fp_n || n->has_exp || n->ip_n > INT_DIGITS) return NO;
    int64_t v = 0;
    for (size_t i = 0; i < n->ip_n; i++) v = v * 10 + (n->ip[i] - '0');
    *out = n->neg ? -v : v;
    return OK;
}

/* ----------------------------------------------------------------- the scan */
enum { K_NUMBER = 0, K_TEXT = 1, K_ANY = 2 };

typedef struct {
    const char *key; size_t key_n;
    int slot, kind;
} Spell;

typedef struct {
    size_t n, cap;
    int32_t *ph, *cat, *name, *pid, *tid;
    int64_t *ts, *dur;
    uint8_t *ts_st, *dur_st;
    uint8_t *sk[MAX_SLOTS];   /* NUMBER kinds */
    int64_t *sv[MAX_SLOTS];   /* NUMBER values / TEXT, ANY codes (as int64 while scanning) */
    int nslots;
    int slot_kind[MAX_SLOTS];
} Cols;

typedef struct {
    Spell sp[MAX_SPELLINGS];
    int nsp;
    int slot_n[MAX_SLOTS];                 /* spellings per slot */
    int slot_sp[MAX_SLOTS][MAX_SPELLINGS];  /* their indexes, in precedence order */
    Cols cols;
    Intern strings;
    Buf tmp;
} Scan;

static int cols_grow(Cols *k) {
    size_t nc = k->cap ? k->cap * 2 : 1024;
#define GROW(f) do { void *x = realloc(k->f, nc * sizeof(*k->f)); if (!x) return NOMEM; k->f = x; } while (0)
    GROW(ph); GROW(cat); GROW(name); GROW(pid); GROW(tid);
    GROW(ts); GROW(dur); GROW(ts_st); GROW(dur_st);
    for (int s = 0; s < k->nslots; s++) { GROW(sk[s]); GROW(sv[s]); }
#undef GROW
    k->cap = nc;
    return OK;
}

static void cols_free(Cols *k) {
    free(k->ph); free(k->cat); free(k->name); free(k->pid); free(k->tid);
    free(k->ts); free(k->dur); free(k->ts_st); free(k->dur_st);
    for (int s = 0; s < MAX_SLOTS; s++) { free(k->sk[s]); free(k->sv[s]); }
}

/* a string value → its code (decoded) */
static int string_code(Scan *s, Cur *c, int64_t *code) {
    const unsigned char *start = c->p + 1;
    int esc;
    int r = lex_string(c, NULL, &esc);
    if (r != OK) return r;
    int64_t v;
    if (!esc) {
        v = intern(&s->strings, (const char *)start, (size_t)(c->p - 1 - start));
    } else {  /* decode the escapes: lex it again into the scratch buffer */
        Cur again = {start - 1, c->p};
        s->tmp.n = 0;
        r = lex_string(&again, &s->tmp, NULL);
        if (r != OK) return r;
        v = intern(&s->strings, s->tmp.b ? s->tmp.b : "", s->tmp.n);
    }
    if (v < 0) return NOMEM;
    *code = v;
    return OK;
}

/* ph / cat / name: a string or null (Any in msgspec; other types: not handled here) */
static int str_or_null(Scan *s, Cur *c, int32_t *out) {
    if (c->p < c->end && *c->p == '"') {
        int64_t code;
        int r = string_code(s, c, &code);
        if (r != OK) return r;
        *out = (int32_t)code;
        return OK;
    }
    if (lit(c, "null", 4) == OK) { *out = 0; return OK; }
    return NO;
}

/* pid / tid: int (its decimal text), string or null */
static int id_text(Scan *s, Cur *c, int32_t *out) {
    if (c->p < c->end && (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))) {
        Num n;
        int64_t v;
        if (lex_number(c, &n) != OK || num_int(&n, &v) != OK) return NO;
        /* a JSON integer's text is Python's str(int) of it, but for "-0" */
        const char *txt = v == 0 ? "0" : (const char *)n.ip - n.neg;
        size_t len = v == 0 ? 1 : n.ip_n + (size_t)n.neg;
        int64_t code = intern(&s->strings, txt, len);
        if (code < 0) return NOMEM;
        *out = (int32_t)code;
        return OK;
    }
    return str_or_null(s, c, out);
}

/* ts / dur: a number or null (a Raw in msgspec: any other value is not handled here) */
static int time_value(Cur *c, int64_t *ns, uint8_t *st) {
    if (lit(c, "null", 4) == OK) { *ns = 0; *st = 1; return OK; }
    Num n;
    if (lex_number(c, &n) != OK || us_to_ns(&n, ns) != OK) return NO;
    *st = 2;
    return OK;
}

/* the raw text of a value with newlines and the whitespace after them removed (outside
 * strings: a validated value has no raw newline inside a string) → its code; 0 for "null" */
static int text_code(Scan *s, Cur *c, int64_t *code) {
    const unsigned char *start = c->p;
    int r = skip_value(c, 2);
    if (r != OK) return r;
    s->tmp.n = 0;
    const unsigned char *p = start;
    while (p < c->p) {
        const unsigned char *run = p;
        while (p < c->p && *p != '\n' && *p != '\r') p++;
        if (p > run && buf_put(&s->tmp, (const char *)run, (size_t)(p - run)) < 0) return NOMEM;
        /* a newline and the whitespace after it (the regex ``[\r\n]\s*`` of texts()) */
        while (p < c->p && (*p == '\n' || *p == '\r' || *p == ' ' || *p == '\t')) p++;
    }
    if (s->tmp.n == 4 && memcmp(s->tmp.b, "null", 4) == 0) { *code = 0; return OK; }
    int64_t v = intern(&s->strings, s->tmp.b ? s->tmp.b : "", s->tmp.n);
    if (v < 0) return NOMEM;
    *code = v;
    return OK;
}

/* the ``args`` object: fills the per-spelling values (last duplicate wins) */
static int scan_args(Scan *s, Cur *c, uint8_t *st, int64_t *val) {
    if (lit(c, "null", 4) == OK) return OK;
    if (c->p >= c->end || *c->p != '{') return NO;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') { c->p++; return OK; }
    for (;;) {
        const unsigned char *k0 = c->p + 1;
        int esc;
        int r = lex_string(c, NULL, &esc);
        if (r != OK) return r;
        if (esc) return NO;  /* an escaped key: msgspec matches its decoded form */
        size_t kn = (size_t)(c->p - 1 - k0);
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':') return NO;
        c->p++;
        skip_ws(c);
        int hit = -1;
        for (int i = 0; i < s->nsp; i++)
            if (s->sp[i].key_n == kn && memcmp(s->sp[i].key, k0, kn) == 0) { hit = i; break; }
        if (hit < 0) {
            r = skip_value(c, 2);
        } else if (s->sp[hit].kind == K_NUMBER) {
            if (lit(c, "null", 4) == OK) { st[hit] = 1; }
            else if (c->p < c->end && *c->p == '"') { r = string_code(s, c, &val[hit]); st[hit] = 3; }
            else {
                Num n;
                r = lex_number(c, &n);
                if (r == OK) r = num_int(&n, &val[hit]);
                st[hit] = 2;
            }
        } else if (s->sp[hit].kind == K_TEXT) {
            r = text_code(s, c, &val[hit]);
            st[hit] = 1;
        } else {
            if (c->p < c->end && *c->p == '"') { r = string_code(s, c, &val[hit]); st[hit] = 3; }
            else { r = skip_value(c, 2); st[hit] = 1; val[hit] = 0; }
        }
        if (r != OK) return r;
        skip_ws(c);
        if (c->p >= c->end) return NO;
        if (*c->p == ',') { c->p++; skip_ws(c); continue; }
        if (*c->p == '}') { c->p++; return OK; }
        return NO;
    }
}

/* resolve the spellings of each slot: the first present one wins (NUMBER: not null;
 * JSON_TEXT: present, even null; ANY: present) */
static void resolve(Scan *s, size_t row, const uint8_t *st, const int64_t *val, int any) {
    Cols *k = &s->cols;
    for (int sl = 0; sl < k->nslots; sl++) {
        uint8_t kind = 0;
        int64_t v = 0;
        if (any) {
            for (int j = 0; j < s->slot_n[sl]; j++) {
                int i = s->slot_sp[sl][j];
                if (!st[i] || (s->sp[i].kind == K_NUMBER && st[i] < 2)) continue;
                kind = st[i];
                v = val[i];
                break;
            }
        }
        if (k->slot_kind[sl] == K_NUMBER) { k->sk[sl][row] = kind; k->sv[sl][row] = v; }
        else k->sv[sl][row] = (k->slot_kind[sl] == K_ANY && kind != 3) ? 0 : v;
    }
}

#define KEY(w) (kn == sizeof(w) - 1 && memcmp(k0, w, kn) == 0)

static int scan_event(Scan *s, Cur *c) {
    Cols *k = &s->cols;
    if (k->n == k->cap && cols_grow(k) != OK) return NOMEM;
    size_t row = k->n;
    uint8_t st[MAX_SPELLINGS];
    int64_t val[MAX_SPELLINGS];
    int any = 0;
    k->ph[row] = k->cat[row] = k->name[row] = k->pid[row] = k->tid[row] = 0;
    k->ts[row] = k->dur[row] = 0;
    k->ts_st[row] = k->dur_st[row] = 0;
    if (c->p >= c->end || *c->p != '{') return NO;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') { c->p++; goto done; }
    for (;;) {
        const unsigned char *k0 = c->p + 1;
        int esc, r;
        r = lex_string(c, NULL, &esc);
        if (r != OK) return r;
        if (esc) return NO;
        size_t kn = (size_t)(c->p - 1 - k0);
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':') return NO;
        c->p++;
        skip_ws(c);
        if (KEY("ph")) r = str_or_null(s, c, &k->ph[row]);
        else if (KEY("cat")) r = str_or_null(s, c, &k->cat[row]);
        else if (KEY("name")) r = str_or_null(s, c, &k->name[row]);
        else if (KEY("pid")) r = id_text(s, c, &k->pid[row]);
        else if (KEY("tid")) r = id_text(s, c, &k->tid[row]);
        else if (KEY("ts")) r = time_value(c, &k->ts[row], &k->ts_st[row]);
        else if (KEY("dur")) r = time_value(c, &k->dur[row], &k->dur_st[row]);
        else if (KEY("id")) { int32_t ignored; r = id_text(s, c, &ignored); }
        else if (KEY("args")) { memset(st, 0, sizeof st); any = 1; r = scan_args(s, c, st, val); }
        else r = skip_value(c, 1);
        if (r != OK) return r;
        skip_ws(c);
        if (c->p >= c->end) return NO;
        if (*c->p == ',') { c->p++; skip_ws(c); continue; }
        if (*c->p == '}') { c->p++; break; }
        return NO;
    }
done:
    resolve(s, row, st, val, any);
    k->n++;
    return OK;
}

/* ``[ event, ... ]`` (bare: ``event, ...`` without the brackets, at least one event),
 * whitespace around it, nothing else */
static int scan_array(Scan *s, Cur *c, int bare) {
    skip_ws(c);
    if (!bare) {
        if (c->p >= c->end || *c->p != '[') return NO;
        c->p++;
        skip_ws(c);
    }
    if (!bare && c->p < c->end && *c->p == ']') c->p++;
    else for (;;) {
        int r = scan_event(s, c);
        if (r != OK) return r;
        skip_ws(c);
        if (bare && c->p == c->end) break;
        if (c->p >= c->end) return NO;
        if (*c->p == ',') { c->p++; skip_ws(c); continue; }
        if (!bare && *c->p == ']') { c->p++; break; }
        return NO;
    }
    skip_ws(c);
    return c->p == c->end ? OK : NO;
}

/* ----------------------------------------------------------------- Python glue */
static PyObject *bytes_of(const void *p, size_t n) {
    return PyBytes_FromStringAndSize(n ? (const char *)p : "", (Py_ssize_t)n);
}

static PyObject *int32_bytes(const int64_t *v, size_t n) {
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * 4));
    if (!b) return NULL;
    int32_t *o = (int32_t *)PyBytes_AS_STRING(b);
    for (size_t i = 0; i < n; i++) o[i] = (int32_t)v[i];
    return b;
}

static int set_item(PyObject *d, const char *key, PyObject *v) {
    if (!v) return -1;
    int r = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return r;
}

static PyObject *build_result(Scan *s) {
    Cols *k = &s->cols;
    size_t n = k->n;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    if (set_item(d, "n", PyLong_FromSize_t(n)) < 0 || set_item(d, "n_strings", PyLong_FromSize_t(s->strings.n)) < 0)
        goto fail;
    if (set_item(d, "ph", bytes_of(k->ph, n * 4)) < 0 || set_item(d, "cat", bytes_of(k->cat, n * 4)) < 0
        || set_item(d, "name", bytes_of(k->name, n * 4)) < 0 || set_item(d, "pid", bytes_of(k->pid, n * 4)) < 0
        || set_item(d, "tid", bytes_of(k->tid, n * 4)) < 0 || set_item(d, "ts", bytes_of(k->ts, n * 8)) < 0
        || set_item(d, "dur", bytes_of(k->dur, n * 8)) < 0 || set_item(d, "ts_state", bytes_of(k->ts_st, n)) < 0
        || set_item(d, "dur_state", bytes_of(k->dur_st, n)) < 0)
        goto fail;
    PyObject *slots = PyList_New(k->nslots);
    if (!slots) goto fail;
    for (int sl = 0; sl < k->nslots; sl++) {
        PyObject *t;
        if (k->slot_kind[sl] == K_NUMBER)
            t = Py_BuildValue("(NN)", bytes_of(k->sk[sl], n), bytes_of(k->sv[sl], n * 8));
        else
            t = Py_BuildValue("(ON)", Py_None, int32_bytes(k->sv[sl], n));
        if (!t) { Py_DECREF(slots); goto fail; }
        PyList_SET_ITEM(slots, sl, t);
    }
    if (set_item(d, "slots", slots) < 0) goto fail;
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

static int parse_spellings(Scan *s, PyObject *spellings) {
    if (!PyTuple_Check(spellings)) { PyErr_SetString(PyExc_TypeError, "spellings must be a tuple"); return -1; }
    Py_ssize_t m = PyTuple_GET_SIZE(spellings);
    if (m > MAX_SPELLINGS) { PyErr_SetString(PyExc_ValueError, "too many spellings"); return -1; }
    s->nsp = (int)m;
    s->cols.nslots = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *it = PyTuple_GET_ITEM(spellings, i);
        const char *key;
        Py_ssize_t kn;
        int slot, kind;
        if (!PyArg_ParseTuple(it, "y#ii", &key, &kn, &slot, &kind)) return -1;
        if (slot < 0 || slot >= MAX_SLOTS || kind < 0 || kind > 2) {
            PyErr_SetString(PyExc_ValueError, "bad spelling slot or kind");
            return -1;
        }
        s->sp[i].key = key; s->sp[i].key_n = (size_t)kn; s->sp[i].slot = slot; s->sp[i].kind = kind;
        if (slot >= s->cols.nslots) s->cols.nslots = slot + 1;
        s->slot_sp[slot][s->slot_n[slot]++] = (int)i;
        s->cols.slot_kind[slot] = kind;
    }
    return 0;
}

/* forget the codes >= n0 (a scan that was not handled): removed in reverse insertion
 * order, which restores the linear-probing table exactly */
static void intern_rollback(Intern *t, size_t n0) {
    while (t->n > n0) {
        uint32_t code = (uint32_t)(t->n - 1);
        uint64_t h = hash_bytes(t->arena + t->off[code], t->len[code]);
        size_t i = (size_t)h & (t->tcap - 1);
        size_t guard = 0;
        while (t->table[i] != code && guard++ < t->tcap) i = (i + 1) & (t->tcap - 1);
        if (t->table[i] == code) t->table[i] = 0;
        t->arena_len = t->off[code];
        t->n--;
    }
}

typedef struct {
    PyObject_HEAD
    Scan *s;
    PyObject *spellings;  /* keeps the key bytes alive */
} Scanner;

static void Scanner_dealloc(Scanner *self) {
    if (self->s) {
        intern_free(&self->s->strings);
        cols_free(&self->s->cols);
        free(self->s->tmp.b);
        free(self->s);
    }
    Py_XDECREF(self->spellings);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Scanner_init(Scanner *self, PyObject *args, PyObject *kw) {
    PyObject *spellings;
    (void)kw;
    if (!PyArg_ParseTuple(args, "O", &spellings)) return -1;
    if (self->s) return 0;
    self->s = calloc(1, sizeof(Scan));
    if (!self->s) { PyErr_NoMemory(); return -1; }
    if (intern_init(&self->s->strings) < 0) { PyErr_NoMemory(); return -1; }
    if (parse_spellings(self->s, spellings) < 0) return -1;
    Py_INCREF(spellings);
    self->spellings = spellings;
    return 0;
}

static PyObject *Scanner_scan(Scanner *self, PyObject *args) {
    Py_buffer view;
    if (!self->s || !self->spellings) { PyErr_SetString(PyExc_RuntimeError, "Scanner not initialised"); return NULL; }
    int bare = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &view, &bare)) return NULL;
    Scan *s = self->s;
    s->cols.n = 0;  /* the column buffers are kept from scan to scan */
    size_t n0 = s->strings.n;
    Cur c = {(const unsigned char *)view.buf, (const unsigned char *)view.buf + view.len};
    int r;
    PyObject *out = NULL;
    Py_BEGIN_ALLOW_THREADS
    r = scan_array(s, &c, bare);
    Py_END_ALLOW_THREADS
    if (r == NOMEM) { intern_rollback(&s->strings, n0); PyErr_NoMemory(); }
    else if (r != OK) { intern_rollback(&s->strings, n0); Py_INCREF(Py_None); out = Py_None; }
    else out = build_result(s);
    if (s->cols.cap > ((size_t)1 << 20)) {  /* a huge piece: do not keep its buffers */
        cols_free(&s->cols);
        memset(&s->cols, 0, offsetof(Cols, nslots));
    }
    PyBuffer_Release(&view);
    return out;
}

static PyObject *Scanner_strings(Scanner *self, PyObject *args) {
    Py_ssize_t start;
    if (!self->s) { PyErr_SetString(PyExc_RuntimeError, "Scanner not initialised"); return NULL; }
    if (!PyArg_ParseTuple(args, "n", &start)) return NULL;
    Intern *t = &self->s->strings;
    if (start < 0) start = 0;
    if ((size_t)start > t->n) start = (Py_ssize_t)t->n;
    PyObject *out = PyList_New((Py_ssize_t)t->n - start);
    if (!out) return NULL;
    for (size_t i = (size_t)start; i < t->n; i++) {
        PyObject *u;
        if (i == 0) { Py_INCREF(Py_None); u = Py_None; }
        else u = PyUnicode_DecodeUTF8(t->arena + t->off[i], (Py_ssize_t)t->len[i], "strict");
        if (!u) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, (Py_ssize_t)(i - (size_t)start), u);
    }
    return out;
}

static PyMethodDef Scanner_methods[] = {
    {"scan", (PyCFunction)Scanner_scan, METH_VARARGS,
     "scan(data, bare=False) -> dict | None: the columns of a JSON event array (bare: its items "
     "without the brackets); None when not handled."},
    {"strings", (PyCFunction)Scanner_strings, METH_VARARGS,
     "strings(start) -> list: the dictionary from code ``start`` on (code 0 is None)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "traceroof.parsers._kineto_scan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(spellings): scans event arrays into columns; one string dictionary for all scans.",
    .tp_methods = Scanner_methods,
    .tp_init = (initproc)Scanner_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kineto_scan", NULL, -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kineto_scan(void) {
    if (PyType_Ready(&ScannerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
