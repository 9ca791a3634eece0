/* _xplane_scan: the events of an XLine (.xplane.pb, tensorflow/tsl/profiler/protobuf/xplane.proto)
 * decoded from the protobuf wire bytes straight into columns.
 *
 * events(buf, start, end) -> dict | None
 *
 *   buf    any buffer (bytes, memoryview, mmap) holding an XLine's bytes at [start, end)
 *   start  the offset of an XLine.events field (tag byte 0x22)
 *
 * Decodes the run of XLine.events fields from ``start`` to the first field that is not one
 * (not consumed) or to ``end``. Returns None ("not handled") for anything it does not fully
 * understand: a field other than those below, a wire type other than the field's, a varint
 * longer than 10 bytes or beyond 64 bits, a tag or length prefix longer than 5 bytes or
 * beyond what upb takes (a tag above UINT32_MAX, a length from INT32_MAX), a length past its
 * message's end, a str_value that is not UTF-8. The caller then decodes the same bytes with the Python decoder
 * (traceroof.parsers.xplane_proto_events), which is the arbiter through protobuf, exactly as
 * without this module.
 *
 *   XEvent: 1 metadata_id int64, 2 offset_ps int64 | 5 num_occurrences int64 (oneof data),
 *           3 duration_ps int64, 4 stats repeated XStat
 *   XStat:  1 metadata_id int64, oneof value: 2 double (fixed64), 3 uint64, 4 int64,
 *           5 str_value string, 6 bytes_value bytes, 7 ref_value uint64
 *
 * Protobuf's rules: a scalar field given twice keeps the last value; a oneof keeps the
 * member set last (so an event whose last ``data`` member is num_occurrences has
 * offset_ps 0 and is ``aggregated``, as protobuf's ``offset_ps`` reads then).
 *
 * The dict: ``stop`` (the offset after the run), ``n`` (events), and little-endian machine
 * arrays as bytes: ``metadata_id``, ``offset_ps``, ``duration_ps`` (int64 per event),
 * ``aggregated`` (uint8 per event), ``stat_event`` (int64: the event of each stat, in
 * order), ``stat_mid`` (int64), ``stat_kind`` (uint8: 0 no value, else the value's field
 * number), ``stat_value`` (uint64: the integer, the ref, the IEEE bits of a double; 0 for
 * a string or bytes), ``obj_index`` (int64: the stat entries holding a string or bytes
 * value) with ``objects`` (list: their str / bytes values, in that order).
 *
 * The scan runs with the GIL released (the buffer is held for its duration); the string
 * objects are made after it. Every read is bounded by its message's end; every loop
 * advances or fails; nothing recurses; every allocation is checked (failure: MemoryError).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *p;
    size_t n;   /* items */
    size_t cap; /* items */
} Vec;

static int grow(Vec *v, size_t item) {
    if (v->cap > SIZE_MAX / 2 / item)
        return -1;
    size_t cap = v->cap ? v->cap * 2 : 1024;
    char *q = (char *)realloc(v->p, cap * item);
    if (q == NULL)
        return -1;
    v->p = q;
    v->cap = cap;
    return 0;
}

#define PUSH(v, type, x)                                                                     \
    do {                                                                                     \
        if ((v).n == (v).cap && grow(&(v), sizeof(type)) < 0)                                \
            return ERR_MEMORY;                                                               \
        ((type *)(v).p)[(v).n++] = (x);                                                      \
    } while (0)

enum { OK = 0, ERR_UNHANDLED = 1, ERR_MEMORY = 2 };

typedef struct {
    Vec mid, off, dur, agg;                      /* per event */
    Vec s_ev, s_mid, s_kind, s_val;              /* per stat */
    Vec o_idx, o_pos, o_len, o_kind;             /* per string / bytes stat */
} Out;

static void out_free(Out *o) {
    Vec *all[] = {&o->mid, &o->off, &o->dur, &o->agg, &o->s_ev, &o->s_mid, &o->s_kind,
                  &o->s_val, &o->o_idx, &o->o_pos, &o->o_len, &o->o_kind};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        free(all[i]->p);
        all[i]->p = NULL;
        all[i]->n = all[i]->cap = 0;
    }
}

/* A varint at *pp (< end): 0 and the value, *pp after it; -1 when it runs past ``end``,
 * is longer than 10 bytes, or carries bits beyond 64 (left to protobuf). */
static inline int varint(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end)
            return -1;
        uint8_t b = *p++;
        if (i == 9 && b > 1)
            return -1;
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            *pp = p;
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* A tag or a length prefix as upb reads them (upb/wire/reader.c): at most 5 bytes and at
 * most ``max`` (a tag: UINT32_MAX; a length: below INT32_MAX); else -1 (protobuf rejects it). */
static inline int varint5(const uint8_t **pp, const uint8_t *end, uint64_t *out, uint64_t max) {
    const uint8_t *p0 = *pp;
    if (varint(pp, end, out) < 0 || *pp - p0 > 5 || *out > max)
        return -1;
    return 0;
}

/* A LEN field's content after its tag: [*pp + length prefix, + length) within ``end``. */
static inline int span(const uint8_t **pp, const uint8_t *end, const uint8_t **q) {
    uint64_t n;
    if (varint5(pp, end, &n, INT32_MAX - 1) < 0 || n > (uint64_t)(end - *pp))
        return -1;
    *q = *pp + n;
    return 0;
}

static int xstat(const uint8_t *p, const uint8_t *end, const uint8_t *base, int64_t event, Out *o) {
    uint64_t mid = 0, val = 0, tag, v;
    uint8_t kind = 0;
    const uint8_t *obj = NULL;
    size_t obj_len = 0;
    while (p < end) {
        if (varint5(&p, end, &tag, UINT32_MAX) < 0)
            return ERR_UNHANDLED;
        uint64_t field = tag >> 3, wt = tag & 7;
        if (wt == 0 && (field == 1 || field == 3 || field == 4 || field == 7)) {
            if (varint(&p, end, &v) < 0)
                return ERR_UNHANDLED;
            if (field == 1) {
                mid = v;
            } else {
                kind = (uint8_t)field;
                val = v;
            }
        } else if (wt == 1 && field == 2) {
            if (end - p < 8)
                return ERR_UNHANDLED;
            uint64_t bits = 0;
            for (int i = 7; i >= 0; i--)
                bits = (bits << 8) | p[i];
            p += 8;
            kind = 2;
            val = bits;
        } else if (wt == 2 && (field == 5 || field == 6)) {
            const uint8_t *q;
            if (span(&p, end, &q) < 0)
                return ERR_UNHANDLED;
            kind = (uint8_t)field;
            val = 0;
            obj = p;
            obj_len = (size_t)(q - p);
            p = q;
        } else {
            return ERR_UNHANDLED;
        }
    }
    int64_t index = (int64_t)o->s_mid.n;
    PUSH(o->s_ev, int64_t, event);
    PUSH(o->s_mid, int64_t, (int64_t)mid);
    PUSH(o->s_kind, uint8_t, kind);
    PUSH(o->s_val, uint64_t, val);
    if (kind == 5 || kind == 6) {
        PUSH(o->o_idx, int64_t, index);
        PUSH(o->o_pos, int64_t, (int64_t)(obj - base));
        PUSH(o->o_len, int64_t, (int64_t)obj_len);
        PUSH(o->o_kind, uint8_t, kind);
    }
    return OK;
}

static int xevent(const uint8_t *p, const uint8_t *end, const uint8_t *base, Out *o) {
    uint64_t mid = 0, off = 0, dur = 0, tag, v;
    uint8_t agg = 0;
    int64_t index = (int64_t)o->mid.n;
    while (p < end) {
        if (varint5(&p, end, &tag, UINT32_MAX) < 0)
            return ERR_UNHANDLED;
        uint64_t field = tag >> 3, wt = tag & 7;
        if (wt == 0 && (field == 1 || field == 2 || field == 3 || field == 5)) {
            if (varint(&p, end, &v) < 0)
                return ERR_UNHANDLED;
            if (field == 1) {
                mid = v;
            } else if (field == 2) {
                off = v;
                agg = 0;
            } else if (field == 3) {
                dur = v;
            } else {
                off = 0; /* oneof data: num_occurrences set last */
                agg = 1;
            }
        } else if (wt == 2 && field == 4) {
            const uint8_t *q;
            if (span(&p, end, &q) < 0)
                return ERR_UNHANDLED;
            int rc = xstat(p, q, base, index, o);
            if (rc != OK)
                return rc;
            p = q;
        } else {
            return ERR_UNHANDLED;
        }
    }
    PUSH(o->mid, int64_t, (int64_t)mid);
    PUSH(o->off, int64_t, (int64_t)off);
    PUSH(o->dur, int64_t, (int64_t)dur);
    PUSH(o->agg, uint8_t, agg);
    return OK;
}

/* The run of XLine.events fields at [start, end) of ``base``; *stop: where it ended. */
static int scan(const uint8_t *base, Py_ssize_t start, Py_ssize_t end, Py_ssize_t *stop, Out *o) {
    const uint8_t *p = base + start, *e = base + end;
    while (p < e && *p == 0x22) {
        const uint8_t *q;
        p++;
        if (span(&p, e, &q) < 0)
            return ERR_UNHANDLED;
        int rc = xevent(p, q, base, o);
        if (rc != OK)
            return rc;
        p = q;
    }
    *stop = (Py_ssize_t)(p - base);
    return OK;
}

static int put(PyObject *d, const char *key, const Vec *v, size_t item) {
    PyObject *b = PyBytes_FromStringAndSize(v->p ? v->p : "", (Py_ssize_t)(v->n * item));
    if (b == NULL)
        return -1;
    int rc = PyDict_SetItemString(d, key, b);
    Py_DECREF(b);
    return rc;
}

static PyObject *result(const uint8_t *base, Py_ssize_t stop, Out *o) {
    PyObject *objects = PyList_New((Py_ssize_t)o->o_idx.n);
    if (objects == NULL)
        return NULL;
    for (size_t i = 0; i < o->o_idx.n; i++) {
        const char *s = (const char *)base + ((int64_t *)o->o_pos.p)[i];
        Py_ssize_t n = (Py_ssize_t)((int64_t *)o->o_len.p)[i];
        PyObject *x = ((uint8_t *)o->o_kind.p)[i] == 5 ? PyUnicode_DecodeUTF8(s, n, NULL)
                                                       : PyBytes_FromStringAndSize(s, n);
        if (x == NULL) {
            Py_DECREF(objects);
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear(); /* not UTF-8: protobuf's to judge */
                Py_RETURN_NONE;
            }
            return NULL;
        }
        PyList_SET_ITEM(objects, (Py_ssize_t)i, x);
    }
    PyObject *d = PyDict_New();
    if (d == NULL) {
        Py_DECREF(objects);
        return NULL;
    }
    PyObject *stop_obj = PyLong_FromSsize_t(stop), *n_obj = PyLong_FromSize_t(o->mid.n);
    int bad = stop_obj == NULL || n_obj == NULL || PyDict_SetItemString(d, "stop", stop_obj) < 0 ||
              PyDict_SetItemString(d, "n", n_obj) < 0 || PyDict_SetItemString(d, "objects", objects) < 0;
    Py_XDECREF(stop_obj);
    Py_XDECREF(n_obj);
    Py_DECREF(objects);
    if (bad || put(d, "metadata_id", &o->mid, 8) < 0 || put(d, "offset_ps", &o->off, 8) < 0 ||
        put(d, "duration_ps", &o->dur, 8) < 0 || put(d, "aggregated", &o->agg, 1) < 0 ||
        put(d, "stat_event", &o->s_ev, 8) < 0 || put(d, "stat_mid", &o->s_mid, 8) < 0 ||
        put(d, "stat_kind", &o->s_kind, 1) < 0 || put(d, "stat_value", &o->s_val, 8) < 0 ||
        put(d, "obj_index", &o->o_idx, 8) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *events(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t start, end;
    (void)self;
    if (!PyArg_ParseTuple(args, "Onn:events", &obj, &start, &end))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (start < 0 || end > view.len || start > end) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "events: start/end outside the buffer");
        return NULL;
    }
    const uint8_t *base = (const uint8_t *)view.buf;
    Out o;
    memset(&o, 0, sizeof o);
    Py_ssize_t stop = start;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = scan(base, start, end, &stop, &o);
    Py_END_ALLOW_THREADS
    PyObject *out;
    if (rc == ERR_MEMORY)
        out = PyErr_NoMemory();
    else if (rc == ERR_UNHANDLED) {
        Py_INCREF(Py_None);
        out = Py_None;
    } else
        out = result(base, stop, &o);
    out_free(&o);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"events", events, METH_VARARGS,
     "events(buf, start, end) -> dict | None: the run of XLine.events fields at buf[start:end] "
     "in columns (see the module's source), None when not handled."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_xplane_scan",
                                    "XLine events from the protobuf wire bytes, in columns.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__xplane_scan(void) { return PyModule_Create(&module); }
