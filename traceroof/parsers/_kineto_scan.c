/* _kineto_scan: a validating scanner of a Kineto JSON event array into columns.
 *
 * Scanner(spellings).scan(data) -> dict | None;  Scanner.strings(start) -> list;
 * Scanner.truncate(n): forget the dictionary's codes >= n;  Scanner.remap(d, table): the
 * codes of a scan's result d replaced by table[code], in place (another dictionary's codes);
 * Scanner.absorb(helper): the helper's strings interned into this dictionary (for remap).
 * Scanner(spellings, False): results without their new strings (a helper's).
 *
 * scan() runs with the GIL released: one Scanner may scan in a worker thread while other
 * Python code runs (one scan at a time per Scanner: a second, or strings(), while a scan
 * is running raises RuntimeError). Its dict carries ``strings``, the dictionary entries the
 * scan added (codes n_strings - len(strings) .. n_strings - 1), so that the caller can grow
 * its copy of the dictionary in file order without calling back into a busy Scanner.
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

#include "_kineto_lex.h"

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

/* the dictionary's codes [start, n) as a list of str (code 0: None) */
static PyObject *strings_from(Intern *t, size_t start) {
    if (start > t->n) start = t->n;
    PyObject *out = PyList_New((Py_ssize_t)(t->n - start));
    if (!out) return NULL;
    for (size_t i = start; i < t->n; i++) {
        PyObject *u;
        if (i == 0) { Py_INCREF(Py_None); u = Py_None; }
        else u = PyUnicode_DecodeUTF8(t->arena + t->off[i], (Py_ssize_t)t->len[i], "strict");
        if (!u) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, (Py_ssize_t)(i - start), u);
    }
    return out;
}

static PyObject *build_result(Scan *s, size_t n0, int with_strings) {
    Cols *k = &s->cols;
    size_t n = k->n;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    if (set_item(d, "strings", with_strings ? strings_from(&s->strings, n0) : PyList_New(0)) < 0
        || set_item(d, "n_before", PyLong_FromSize_t(n0)) < 0)
        goto fail;
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
    int busy;             /* a scan is running with the GIL released */
    int with_strings;     /* scan() results carry the strings they added */
} Scanner;

static int check_free(Scanner *self) {
    if (!self->s || !self->spellings) { PyErr_SetString(PyExc_RuntimeError, "Scanner not initialised"); return -1; }
    if (self->busy) { PyErr_SetString(PyExc_RuntimeError, "Scanner is in use by another thread"); return -1; }
    return 0;
}

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
    int with_strings = 1;
    (void)kw;
    if (!PyArg_ParseTuple(args, "O|p", &spellings, &with_strings)) return -1;
    self->with_strings = with_strings;
    if (self->s) { PyErr_SetString(PyExc_RuntimeError, "Scanner already initialised"); return -1; }
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
    if (check_free(self) < 0) return NULL;
    int bare = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &view, &bare)) return NULL;
    Scan *s = self->s;
    s->cols.n = 0;  /* the column buffers are kept from scan to scan */
    size_t n0 = s->strings.n;
    Cur c = {(const unsigned char *)view.buf, (const unsigned char *)view.buf + view.len};
    int r;
    PyObject *out = NULL;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    r = scan_array(s, &c, bare);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (r == NOMEM) { intern_rollback(&s->strings, n0); PyErr_NoMemory(); }
    else if (r != OK) { intern_rollback(&s->strings, n0); Py_INCREF(Py_None); out = Py_None; }
    else out = build_result(s, n0, self->with_strings);
    if (s->cols.cap > ((size_t)1 << 20)) {  /* a huge piece: do not keep its buffers */
        cols_free(&s->cols);
        memset(&s->cols, 0, offsetof(Cols, nslots));
    }
    PyBuffer_Release(&view);
    return out;
}

static PyObject *Scanner_strings(Scanner *self, PyObject *args) {
    Py_ssize_t start;
    if (check_free(self) < 0) return NULL;
    if (!PyArg_ParseTuple(args, "n", &start)) return NULL;
    return strings_from(&self->s->strings, start < 0 ? 0 : (size_t)start);
}

/* remap one int32 column (a bytes object of the result dict, rewritten in place) */
static int remap_i32(PyObject *b, const int32_t *tab, Py_ssize_t ntab) {
    if (!PyBytes_Check(b)) { PyErr_SetString(PyExc_TypeError, "remap: a column is not bytes"); return -1; }
    int32_t *v = (int32_t *)PyBytes_AS_STRING(b);
    Py_ssize_t n = PyBytes_GET_SIZE(b) / 4;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (v[i] < 0 || v[i] >= ntab) { PyErr_SetString(PyExc_ValueError, "remap: a code beyond the table"); return -1; }
        v[i] = tab[v[i]];
    }
    return 0;
}

/* remap(d, table): every code of scan()'s result ``d`` (the int32 columns, and the string
 * values, kind 3, of the NUMBER slots) replaced by table[code], in place: d's bytes are the
 * scan's own, referenced by nothing else yet. table: an int32 buffer covering every code. */
static PyObject *Scanner_remap(Scanner *self, PyObject *args) {
    PyObject *d;
    Py_buffer tb;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!y*", &PyDict_Type, &d, &tb)) return NULL;
    const int32_t *tab = (const int32_t *)tb.buf;
    Py_ssize_t ntab = tb.len / 4;
    static const char *keys[] = {"ph", "cat", "name", "pid", "tid"};
    for (int i = 0; i < 5; i++) {
        PyObject *b = PyDict_GetItemString(d, keys[i]);
        if (!b) { PyErr_SetString(PyExc_KeyError, keys[i]); goto fail; }
        if (remap_i32(b, tab, ntab) < 0) goto fail;
    }
    PyObject *slots = PyDict_GetItemString(d, "slots");
    if (!slots || !PyList_Check(slots)) { PyErr_SetString(PyExc_KeyError, "slots"); goto fail; }
    for (Py_ssize_t sl = 0; sl < PyList_GET_SIZE(slots); sl++) {
        PyObject *t = PyList_GET_ITEM(slots, sl);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) { PyErr_SetString(PyExc_TypeError, "remap: a slot"); goto fail; }
        PyObject *k = PyTuple_GET_ITEM(t, 0), *v = PyTuple_GET_ITEM(t, 1);
        if (k == Py_None) { if (remap_i32(v, tab, ntab) < 0) goto fail; continue; }
        if (!PyBytes_Check(k) || !PyBytes_Check(v) || PyBytes_GET_SIZE(v) != 8 * PyBytes_GET_SIZE(k)) {
            PyErr_SetString(PyExc_TypeError, "remap: a NUMBER slot");
            goto fail;
        }
        const uint8_t *kinds = (const uint8_t *)PyBytes_AS_STRING(k);
        int64_t *vals = (int64_t *)PyBytes_AS_STRING(v);
        for (Py_ssize_t i = 0; i < PyBytes_GET_SIZE(k); i++) {
            if (kinds[i] != 3) continue;
            if (vals[i] < 0 || vals[i] >= ntab) { PyErr_SetString(PyExc_ValueError, "remap: a code beyond the table"); goto fail; }
            vals[i] = tab[vals[i]];
        }
    }
    PyBuffer_Release(&tb);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&tb);
    return NULL;
}

/* absorb(helper) -> (table, strings): every string of ``helper``'s dictionary (codes 1..) interned
 * into this one in code order; table: int32 bytes, helper code -> this one's code (table[0] =
 * 0); strings: this dictionary's new entries, in code order. The helper's dictionary is then
 * emptied (its next scan starts afresh). */
static PyObject *Scanner_absorb(Scanner *self, PyObject *args);

/* truncate(n): forget the codes >= n (the strings of scans whose results are discarded) */
static PyObject *Scanner_truncate(Scanner *self, PyObject *args) {
    Py_ssize_t n;
    if (check_free(self) < 0) return NULL;
    if (!PyArg_ParseTuple(args, "n", &n)) return NULL;
    if (n < 1) n = 1;
    intern_rollback(&self->s->strings, (size_t)n);
    Py_RETURN_NONE;
}

static PyObject *Scanner_absorb(Scanner *self, PyObject *args) {
    PyObject *other;
    if (check_free(self) < 0) return NULL;
    if (!PyArg_ParseTuple(args, "O!", Py_TYPE(self), &other)) return NULL;
    Scanner *h = (Scanner *)other;
    if (h == self) { PyErr_SetString(PyExc_ValueError, "absorb: a scanner cannot absorb itself"); return NULL; }
    if (check_free(h) < 0) return NULL;
    Intern *o = &self->s->strings, *t = &h->s->strings;
    size_t n0 = o->n;
    PyObject *tab = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(t->n * 4));
    if (!tab) return NULL;
    int32_t *m = (int32_t *)PyBytes_AS_STRING(tab);
    m[0] = 0;
    for (size_t c = 1; c < t->n; c++) {
        int64_t v = intern(o, t->arena + t->off[c], t->len[c]);
        if (v < 0) { intern_rollback(o, n0); Py_DECREF(tab); return PyErr_NoMemory(); }
        m[c] = (int32_t)v;
    }
    PyObject *added = strings_from(o, n0);
    if (!added) { intern_rollback(o, n0); Py_DECREF(tab); return NULL; }
    memset(t->table, 0, t->tcap * sizeof(uint32_t));  /* the helper starts afresh */
    t->n = 1;
    t->arena_len = 0;
    return Py_BuildValue("(NN)", tab, added);
}

static PyMethodDef Scanner_methods[] = {
    {"absorb", (PyCFunction)Scanner_absorb, METH_VARARGS,
     "absorb(helper) -> (table, strings): the helper's strings interned here; its dictionary emptied."},
    {"remap", (PyCFunction)Scanner_remap, METH_VARARGS,
     "remap(d, table): scan()'s result d with every code replaced by table[code] (in place)."},
    {"truncate", (PyCFunction)Scanner_truncate, METH_VARARGS,
     "truncate(n): forget the dictionary's codes n and above (n >= 1)."},
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

/* ---- A mapped file cut while it is read (kineto_blocks.mapped) --------------------------
 * Reading a page of a mapping past the end of a file that was made shorter raises SIGBUS,
 * which Python cannot catch. guard_map(buffer, message) registers the buffer's address range
 * and installs (once) a SIGBUS handler: a fault inside a registered range writes the range's
 * message and the byte offset ("...: byte N: ...") on stderr and ends the process with exit
 * code 4 (an unreadable trace, traceroof.errors.TraceFormatError); a fault elsewhere puts the
 * previous action back (ours again at the next guard_map) and returns, so the fault repeats
 * under it (the default: the
 * process ends with the signal, as without the guard). unguard_map(slot) frees the slot.
 * The handler only reads the static table and calls write(2) and _exit(2):
 * async-signal-safe (POSIX.1-2008, signal-safety(7)). */
#if defined(__unix__) || defined(__APPLE__)
#include <signal.h>
#include <unistd.h>
#define GUARD_SLOTS 16
#define GUARD_MSG 600
static volatile sig_atomic_t guard_used[GUARD_SLOTS];
static uintptr_t guard_lo[GUARD_SLOTS], guard_hi[GUARD_SLOTS];
static char guard_head[GUARD_SLOTS][GUARD_MSG], guard_tail[GUARD_SLOTS][GUARD_MSG];
static struct sigaction guard_old;
static volatile sig_atomic_t guard_installed = 0;

static void guard_write(const char *s) {
    size_t n = strlen(s);
    while (n) {
        ssize_t w = write(2, s, n);
        if (w <= 0) return;
        s += w; n -= (size_t)w;
    }
}

static void guard_on_bus(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < GUARD_SLOTS; i++) {
        if (guard_used[i] && a >= guard_lo[i] && a < guard_hi[i]) {
            char num[24]; int k = 23; uintptr_t off = a - guard_lo[i];
            num[k] = 0;
            do { num[--k] = (char)('0' + off % 10); off /= 10; } while (off && k > 0);
            guard_write(guard_head[i]); guard_write(num + k); guard_write(guard_tail[i]);
            _exit(4);
        }
    }
    /* not ours: the fault repeats under the old action; the next guard_map installs ours again */
    guard_installed = 0;
    sigaction(sig, &guard_old, NULL);
}

static PyObject *guard_map(PyObject *self, PyObject *args) {
    PyObject *obj; const char *head, *tail;
    if (!PyArg_ParseTuple(args, "Oss", &obj, &head, &tail)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) return NULL;
    uintptr_t lo = (uintptr_t)view.buf, hi = lo + (uintptr_t)view.len;
    PyBuffer_Release(&view);  /* the pages stay mapped as long as the mmap object is open */
    if (!guard_installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = guard_on_bus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &guard_old) != 0) Py_RETURN_NONE;
        guard_installed = 1;
    }
    for (int i = 0; i < GUARD_SLOTS; i++) {
        if (!guard_used[i]) {
            guard_lo[i] = lo; guard_hi[i] = hi;
            strncpy(guard_head[i], head, GUARD_MSG - 1); guard_head[i][GUARD_MSG - 1] = 0;
            strncpy(guard_tail[i], tail, GUARD_MSG - 1); guard_tail[i][GUARD_MSG - 1] = 0;
            guard_used[i] = 1;
            return PyLong_FromLong(i);
        }
    }
    Py_RETURN_NONE;  /* every slot taken: the caller does not map */
}

static PyObject *unguard_map(PyObject *self, PyObject *args) {
    int i;
    if (!PyArg_ParseTuple(args, "i", &i)) return NULL;
    if (i >= 0 && i < GUARD_SLOTS) guard_used[i] = 0;
    Py_RETURN_NONE;
}
#else
static PyObject *guard_map(PyObject *self, PyObject *args) { Py_RETURN_NONE; }
static PyObject *unguard_map(PyObject *self, PyObject *args) { Py_RETURN_NONE; }
#endif

static PyMethodDef module_methods[] = {
    {"guard_map", guard_map, METH_VARARGS,
     "guard_map(buffer, head, tail) -> slot or None: a SIGBUS inside buffer's bytes writes head, the byte offset and tail on stderr and exits with code 4."},
    {"unguard_map", unguard_map, METH_VARARGS, "unguard_map(slot): the range of guard_map's slot no longer guarded."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kineto_scan", NULL, -1, module_methods, NULL, NULL, NULL, NULL};

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
