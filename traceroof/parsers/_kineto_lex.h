/* _kineto_lex.h: the lexing half of _kineto_scan.c (one translation unit: included once).
 *
 * String interning (one dictionary per Scanner), a scratch buffer, a strict JSON lexer
 * (strings with UTF-8 validation and escapes, numbers, skipping any value to a bounded
 * depth) and the exact us -> ns conversion. Every read is bounded by Cur.end. */
#ifndef TRACEROOF_KINETO_LEX_H
#define TRACEROOF_KINETO_LEX_H

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

#endif
