/* tailguard._speedups: the relay's per-chunk hot loop in C (optional; see tailguard/speedups.py).

Two things, each the exact twin of Python code that stays as the fallback:

  has_content(data, start=0, end=None)   wire/chunks.py `has_content_py`: does an OpenAI chunk
                                         carry generated content, by its bytes
  ChunkStep(relay, clock, dec, tally, sink, conn, transport)
                                         a callable `step(data) -> bool` that does what
                                         `StreamRelay._chunk` does with the usual piece of a
                                         relayed body, in one C call

A piece of the body is "usual" when the decoder holds nothing and the piece is one whole event of
one LF-ended line (`SSEDecoder.frame`'s fast case) that carries content, in a run that has had its
first content already, for a request neither traced nor tracked, of at most `Tally.event_bytes`
bytes, whose answer has room for one more content event (`Tally.max_events`: past it
`Tally.content` cuts the answer). Such a piece's bytes are held by that count, not counted
(`Tally.read`), so the step adds no work for the answer's bounds but a compare or two. Then the step reads the clock,
counts the chunk (`Tally.content`: the watchdog's `last_at`, the record's `content_chunks` and
`last_content_at`, the ITL histogram's bucket), and writes the chunked frame to the client's
transport (`LeanSink.write_nowait`), or hands the piece to `sink.write_nowait` when no transport
is given. Anything else goes to `relay._chunk(data)` untouched: the step decides before it changes
anything, so the Python code sees exactly the state it would have seen without the extension.

The state stays in the Python objects (their slotted attributes read and written in place, see
`Field`), so either path can take any chunk of a stream: the step keeps only references that do
not change during a run.
*/
#define PY_SSIZE_T_CLEAN
/* What tailguard.speedups.ABI expects of this file (the attributes the step reads, the calls it makes):
   raised in both with every change, so a build of another version of this file is never used. */
#define SPEEDUPS_ABI 1
#include <Python.h>
#include <stddef.h>
#include <string.h>
#include <structmember.h>

/* Attribute names, interned once. */
static PyObject *s_buf, *s_started, *s_run_started, *s_last_content_at, *s_content_chunks, *s_last_at,
    *s_closing, *s_paused, *s_blocked, *s_transcript, *s_chunk, *s_write_nowait, *s_lo, *s_hi, *s_i,
    *s_counts, *s_sum, *s_observe, *s_write, *s_watchdog, *s_request, *s_itl, *s_max_events, *s_event_bytes, *s_one;

/* ---- the content test (wire/chunks.py) --------------------------------------------------- */

/* The names before a `:` whose non-empty string (or list) value is generated content. */
#define NAME(s) {s, sizeof(s) - 1}
static const struct { const char *s; Py_ssize_t n; } CONTENT_NAMES[] = {
    NAME("\"content\""), NAME("\"text\""), NAME("\"reasoning_content\""), NAME("\"reasoning\""),
    NAME("\"tool_calls\""),
};

/* Whether the value at d[j:n] (after spaces) is a non-empty string or list. */
static int value_nonempty(const char *d, Py_ssize_t n, Py_ssize_t j)
{
    while (j < n && d[j] == ' ')
        j++;
    return j + 1 < n && ((d[j] == '"' && d[j + 1] != '"') || (d[j] == '[' && d[j + 1] != ']'));
}

/* `has_content_py` on d[0:n], in one pass over its colons: a key is a name and a colon, so each
   colon after a quote, before a non-empty value, is tried against the five names (the Python
   searches each key in turn, the compact `"content":"` first; a key never overlaps itself, so
   both see every occurrence). From the end: a chunk's delta follows its id, model and the like,
   so a content chunk is told in a few dozen bytes. */
static int content_in(const char *d, Py_ssize_t n)
{
    for (Py_ssize_t c = n - 1; c > 0; c--) {
        if (d[c] != ':' || d[c - 1] != '"' || !value_nonempty(d, n, c + 1))
            continue;
        for (size_t i = 0; i < sizeof(CONTENT_NAMES) / sizeof(CONTENT_NAMES[0]); i++) {
            Py_ssize_t k = CONTENT_NAMES[i].n;
            if (c >= k && d[c - k] == '"' && memcmp(d + c - k, CONTENT_NAMES[i].s, (size_t)k) == 0)
                return 1;
        }
    }
    return 0;
}

PyDoc_STRVAR(has_content_doc,
"has_content(data, start=0, end=None) -> bool\n\n"
"True if the chunk in data[start:end] carries generated content (wire.chunks.has_content_py).");

static PyObject *has_content(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t start = 0, end = PY_SSIZE_T_MAX;
    if (nargs < 1 || nargs > 3)
        return PyErr_Format(PyExc_TypeError, "has_content() takes 1 to 3 arguments (%zd given)", nargs);
    if (!PyBytes_Check(args[0]))
        return PyErr_Format(PyExc_TypeError, "has_content() needs bytes, not %.100s", Py_TYPE(args[0])->tp_name);
    if (nargs > 1 && (start = PyNumber_AsSsize_t(args[1], PyExc_OverflowError)) == -1 && PyErr_Occurred())
        return NULL;
    if (nargs > 2 && args[2] != Py_None
        && (end = PyNumber_AsSsize_t(args[2], PyExc_OverflowError)) == -1 && PyErr_Occurred())
        return NULL;
    /* As data[start:end]: negative bounds count from the end, bounds past it are cut. */
    Py_ssize_t n = PySlice_AdjustIndices(PyBytes_GET_SIZE(args[0]), &start, &end, 1);
    return PyBool_FromLong(content_in(PyBytes_AS_STRING(args[0]) + start, n));
}

/* ---- attributes, in place ------------------------------------------------------------------ */

/* One attribute of one object. Where it is a writable `__slots__` member of the object's type
   (every attribute the step touches is one: the relay's objects are slotted), it is read and
   written at its offset in the object, as the member descriptor itself would (`PyMember_GetOne`,
   `PyMember_SetOne`), without the name's lookup through the type; else through
   `PyObject_GetAttr` and `PyObject_SetAttr`. `obj` is borrowed: the step holds it. */
typedef struct {
    PyObject *obj, *name;
    Py_ssize_t offset;  /* -1: by name */
} Field;

static void field_bind(Field *f, PyObject *obj, PyObject *name)
{
    PyTypeObject *tp = Py_TYPE(obj);
    f->obj = obj;
    f->name = name;
    f->offset = -1;
    if (tp->tp_getattro != PyObject_GenericGetAttr || tp->tp_setattro != PyObject_GenericSetAttr)
        return;  /* the type has its own __getattr__ or __setattr__ */
    PyObject *d = PyObject_GetAttr((PyObject *)tp, name);
    if (d == NULL) {
        PyErr_Clear();  /* not the type's: an instance attribute, read by name */
        return;
    }
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY))
            f->offset = m->offset;
    }
    Py_DECREF(d);
}

/* obj.name, a new reference (NULL with AttributeError where the slot is empty). */
static PyObject *field_get(Field *f)
{
    if (f->offset >= 0) {
        PyObject *v = *(PyObject **)((char *)f->obj + f->offset);
        if (v != NULL)
            return Py_NewRef(v);
    }
    return PyObject_GetAttr(f->obj, f->name);
}

static int field_set(Field *f, PyObject *v)
{
    if (f->offset < 0)
        return PyObject_SetAttr(f->obj, f->name, v);
    PyObject **slot = (PyObject **)((char *)f->obj + f->offset);
    PyObject *old = *slot;
    *slot = Py_NewRef(v);
    Py_XDECREF(old);
    return 0;
}

/* The truth of obj.name: 1, 0, or -1 with an error set. */
static int field_true(Field *f)
{
    PyObject *v = field_get(f);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* obj.name += x */
static int field_add(Field *f, PyObject *x)
{
    PyObject *v = field_get(f);
    if (v == NULL)
        return -1;
    PyObject *w = PyNumber_Add(v, x);
    Py_DECREF(v);
    if (w == NULL)
        return -1;
    int r = field_set(f, w);
    Py_DECREF(w);
    return r;
}

/* ---- ChunkStep --------------------------------------------------------------------------- */

/* The attributes the step reads and writes, by owner. */
enum {
    DEC_BUF, DEC_STARTED,                          /* SSEDecoder: a kept partial event; past the BOM */
    RUN_STARTED,                                   /* Tally: this run has had content */
    LAST_CONTENT_AT, CONTENT_CHUNKS,               /* Request (the tally's `request`) */
    LAST_AT,                                       /* DeadlineWatch */
    TRANSCRIPT, BLOCKED,                             /* StreamRelay */
    ITL_LO, ITL_HI, ITL_I, ITL_COUNTS, ITL_SUM,    /* ChunkHistogram: the last bucket, counts, sum */
    CLOSING, PAUSED,                               /* the lean connection (bound with a transport) */
    N_FIELDS,
};

typedef struct {
    PyObject_HEAD
    PyObject *relay, *clock, *dec, *tally, *watchdog, *request, *itl, *sink;
    PyObject *conn, *write;  /* the lean connection and its transport's `write`; NULL: `sink.write_nowait` */
    Py_ssize_t max_events, event_bytes;  /* `tally.max_events`, `tally.event_bytes`: fixed for the request */
    Py_ssize_t chunks;  /* the record's `content_chunks` as `usual` read it, for `count` */
    Field f[N_FIELDS];
    vectorcallfunc vectorcall;
} ChunkStep;

/* Whether `data` takes the fast path: 1, 0 (to `relay._chunk`), or -1 with an error set. Reads
   only, so that a 0 leaves every object as it was. */
static int usual(ChunkStep *s, PyObject *data)
{
    if (!PyBytes_CheckExact(data))
        return 0;
    const char *d = PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    /* One event of one line, LF-ended (`SSEDecoder.frame`'s fast case), that carries content. */
    if (n < 2 || n > s->event_bytes || d[n - 1] != '\n' || d[n - 2] != '\n' || memchr(d, '\r', (size_t)n) != NULL
        || memchr(d, '\n', (size_t)(n - 2)) != NULL || !content_in(d, n))
        return 0;
    int r = field_true(&s->f[DEC_BUF]);  /* the decoder keeps part of an event */
    if (r != 0)
        return r < 0 ? -1 : 0;
    if ((r = field_true(&s->f[DEC_STARTED])) != 1)  /* the stream's first bytes (a BOM?) */
        return r;
    if ((r = field_true(&s->f[RUN_STARTED])) != 1)  /* this run's first content */
        return r;
    PyObject *v = field_get(&s->f[LAST_CONTENT_AT]);
    if (v == NULL)
        return -1;
    r = v != Py_None;  /* else the request's first content */
    Py_DECREF(v);
    if (r == 0)
        return 0;
    if ((v = field_get(&s->f[CONTENT_CHUNKS])) == NULL)
        return -1;
    s->chunks = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    if (s->chunks == -1 && PyErr_Occurred())
        return -1;
    if (s->chunks >= s->max_events)  /* the answer's bound: `Tally.content` cuts it */
        return 0;
    if ((v = field_get(&s->f[TRANSCRIPT])) == NULL)
        return -1;
    r = v == Py_None;  /* else its content is kept as it goes */
    Py_DECREF(v);
    if (r == 0 || s->conn == NULL)
        return r;
    r = field_true(&s->f[CLOSING]);  /* the client left: `_chunk` raises ClientGone */
    return r < 0 ? -1 : !r;
}

/* lo < value <= hi, as Python compares them (floats directly). */
static int in_bucket(PyObject *lo, PyObject *value, PyObject *hi)
{
    if (PyFloat_CheckExact(lo) && PyFloat_CheckExact(value) && PyFloat_CheckExact(hi)) {
        double v = PyFloat_AS_DOUBLE(value);
        return PyFloat_AS_DOUBLE(lo) < v && v <= PyFloat_AS_DOUBLE(hi);
    }
    int r = PyObject_RichCompareBool(lo, value, Py_LT);
    return r == 1 ? PyObject_RichCompareBool(value, hi, Py_LE) : r;
}

/* `ChunkHistogram.observe(value)`: the last value's bucket when it holds `value`, else the
   method itself (its bisect). */
static int observe(ChunkStep *s, PyObject *value)
{
    PyObject *lo = field_get(&s->f[ITL_LO]), *hi = field_get(&s->f[ITL_HI]);
    int inside = lo != NULL && hi != NULL ? in_bucket(lo, value, hi) : -1;
    Py_XDECREF(lo);
    Py_XDECREF(hi);
    if (inside < 0)
        return -1;
    if (!inside) {
        PyObject *r = PyObject_CallMethodOneArg(s->itl, s_observe, value);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    PyObject *counts = field_get(&s->f[ITL_COUNTS]), *i = field_get(&s->f[ITL_I]), *c = NULL, *c1 = NULL;
    int r = -1;
    if (counts != NULL && i != NULL && (c = PyObject_GetItem(counts, i)) != NULL
        && (c1 = PyNumber_Add(c, s_one)) != NULL && PyObject_SetItem(counts, i, c1) == 0)
        r = field_add(&s->f[ITL_SUM], value);
    Py_XDECREF(counts);
    Py_XDECREF(i);
    Py_XDECREF(c);
    Py_XDECREF(c1);
    return r;
}

/* `Tally.content(now, 1)` past the run's first content: the watchdog, the record (its count as
   `usual` read it, one more), the gap. */
static int count(ChunkStep *s, PyObject *now)
{
    PyObject *chunks = PyLong_FromSsize_t(s->chunks + 1);
    if (chunks == NULL)
        return -1;
    int set = field_set(&s->f[LAST_AT], now) < 0 || field_set(&s->f[CONTENT_CHUNKS], chunks) < 0;
    Py_DECREF(chunks);
    if (set)
        return -1;
    PyObject *last = field_get(&s->f[LAST_CONTENT_AT]);
    if (last == NULL)
        return -1;
    PyObject *gap = NULL;
    int r = -1;
    if (field_set(&s->f[LAST_CONTENT_AT], now) == 0 && (gap = PyNumber_Subtract(now, last)) != NULL)
        r = observe(s, gap);
    Py_DECREF(last);
    Py_XDECREF(gap);
    return r;
}

/* `%x\r\n` of n into out (room for 2 * sizeof(n) + 2 bytes); its length. */
static Py_ssize_t size_line(char *out, size_t n)
{
    char digits[2 * sizeof(n)];
    Py_ssize_t k = 0;
    do {
        digits[k++] = "0123456789abcdef"[n & 15];
        n >>= 4;
    } while (n != 0);
    for (Py_ssize_t i = 0; i < k; i++)
        out[i] = digits[k - 1 - i];
    out[k] = '\r';
    out[k + 1] = '\n';
    return k + 2;
}

/* `LeanSink.write_nowait(data)`: one chunked frame (`%x\r\n` data `\r\n`) to the transport;
   1 while the client keeps up, 0 once its buffer is full, -1 on an error. */
static int write_frame(ChunkStep *s, PyObject *data)
{
    char size[2 * sizeof(size_t) + 2];
    Py_ssize_t n = PyBytes_GET_SIZE(data), h = size_line(size, (size_t)n);
    PyObject *frame = PyBytes_FromStringAndSize(NULL, h + n + 2);
    if (frame == NULL)
        return -1;
    char *f = PyBytes_AS_STRING(frame);
    memcpy(f, size, (size_t)h);
    memcpy(f + h, PyBytes_AS_STRING(data), (size_t)n);
    memcpy(f + h + n, "\r\n", 2);
    PyObject *r = PyObject_CallOneArg(s->write, frame);
    Py_DECREF(frame);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    int paused = field_true(&s->f[PAUSED]);
    return paused < 0 ? -1 : !paused;
}

/* The sink's own `write_nowait(data)`, for a sink with no transport of its own. */
static int write_sink(ChunkStep *s, PyObject *data)
{
    PyObject *r = PyObject_CallMethodOneArg(s->sink, s_write_nowait, data);
    if (r == NULL)
        return -1;
    int ok = PyObject_IsTrue(r);
    Py_DECREF(r);
    return ok;
}

/* step(data): `StreamRelay._chunk(data)`, in C for the usual piece. */
static PyObject *step_call(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    ChunkStep *s = (ChunkStep *)op;
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL)
        return PyErr_Format(PyExc_TypeError, "ChunkStep takes one positional argument");
    PyObject *data = args[0];
    int fast = usual(s, data);
    if (fast < 0)
        return NULL;
    if (!fast)
        return PyObject_CallMethodOneArg(s->relay, s_chunk, data);
    PyObject *now = PyObject_CallNoArgs(s->clock);
    if (now == NULL)
        return NULL;
    int r = count(s, now);
    Py_DECREF(now);
    if (r < 0 || (r = s->conn != NULL ? write_frame(s, data) : write_sink(s, data)) < 0)
        return NULL;
    if (!r && field_set(&s->f[BLOCKED], Py_True) < 0)  /* the caller must drain first */
        return NULL;
    return PyBool_FromLong(r);
}

/* Called before `__init__` has run (or after it failed): the step is not usable yet. */
static PyObject *step_unready(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return PyErr_Format(PyExc_TypeError, "ChunkStep was not initialised");
}

/* The fields, once the objects are held (the connection's only when there is one). */
static void bind_fields(ChunkStep *s)
{
    const struct { int field; PyObject *obj, *name; } binds[] = {
        {DEC_BUF, s->dec, s_buf}, {DEC_STARTED, s->dec, s_started}, {RUN_STARTED, s->tally, s_run_started},
        {LAST_CONTENT_AT, s->request, s_last_content_at}, {CONTENT_CHUNKS, s->request, s_content_chunks},
        {LAST_AT, s->watchdog, s_last_at}, {TRANSCRIPT, s->relay, s_transcript}, {BLOCKED, s->relay, s_blocked},
        {ITL_LO, s->itl, s_lo}, {ITL_HI, s->itl, s_hi}, {ITL_I, s->itl, s_i}, {ITL_COUNTS, s->itl, s_counts},
        {ITL_SUM, s->itl, s_sum}, {CLOSING, s->conn, s_closing}, {PAUSED, s->conn, s_paused},
    };
    for (size_t i = 0; i < sizeof(binds) / sizeof(binds[0]); i++)
        if (binds[i].obj != NULL)
            field_bind(&s->f[binds[i].field], binds[i].obj, binds[i].name);
}

static int step_init(PyObject *op, PyObject *args, PyObject *kwds)
{
    ChunkStep *s = (ChunkStep *)op;
    PyObject *relay, *clock, *dec, *tally, *sink, *conn, *transport;
    static char *names[] = {"relay", "clock", "dec", "tally", "sink", "conn", "transport", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOO:ChunkStep", names, &relay, &clock, &dec, &tally,
                                     &sink, &conn, &transport))
        return -1;
    if ((conn == Py_None) != (transport == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "ChunkStep: conn and transport go together");
        return -1;
    }
    PyObject *watchdog = PyObject_GetAttr(tally, s_watchdog), *request = PyObject_GetAttr(tally, s_request),
             *itl = PyObject_GetAttr(tally, s_itl), *max_events = PyObject_GetAttr(tally, s_max_events),
             *event_bytes = PyObject_GetAttr(tally, s_event_bytes), *write = NULL;
    Py_ssize_t bound = max_events == NULL ? -1 : PyLong_AsSsize_t(max_events);
    Py_ssize_t per_event = event_bytes == NULL ? -1 : PyLong_AsSsize_t(event_bytes);
    Py_XDECREF(max_events);
    Py_XDECREF(event_bytes);
    if (watchdog == NULL || request == NULL || itl == NULL || ((bound == -1 || per_event == -1) && PyErr_Occurred())
        || (transport != Py_None && (write = PyObject_GetAttr(transport, s_write)) == NULL)) {
        Py_XDECREF(watchdog);
        Py_XDECREF(request);
        Py_XDECREF(itl);
        return -1;
    }
    s->vectorcall = step_unready;  /* (a step initialised again is unusable until it is bound) */
    Py_XSETREF(s->relay, Py_NewRef(relay));
    Py_XSETREF(s->clock, Py_NewRef(clock));
    Py_XSETREF(s->dec, Py_NewRef(dec));
    Py_XSETREF(s->tally, Py_NewRef(tally));
    Py_XSETREF(s->sink, Py_NewRef(sink));
    Py_XSETREF(s->watchdog, watchdog);
    Py_XSETREF(s->request, request);
    Py_XSETREF(s->itl, itl);
    Py_XSETREF(s->conn, conn == Py_None ? NULL : Py_NewRef(conn));
    Py_XSETREF(s->write, write);
    s->max_events = bound;
    s->event_bytes = per_event;
    bind_fields(s);
    s->vectorcall = step_call;
    return 0;
}

/* Every object the step holds, for the collector: each visited, or each cleared. */
#define STEP_REFS(X) X(relay) X(clock) X(dec) X(tally) X(watchdog) X(request) X(itl) X(sink) X(conn) X(write)
#define VISIT(name) Py_VISIT(((ChunkStep *)op)->name);
#define CLEAR(name) Py_CLEAR(((ChunkStep *)op)->name);

static int step_traverse(PyObject *op, visitproc visit, void *arg) { STEP_REFS(VISIT) return 0; }

/* Cleared, the fields' borrowed objects may be gone: a call after it raises instead of reading them. */
static int step_clear(PyObject *op)
{
    ((ChunkStep *)op)->vectorcall = step_unready;
    STEP_REFS(CLEAR)
    return 0;
}

static void step_dealloc(PyObject *op)
{
    PyObject_GC_UnTrack(op);
    step_clear(op);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *step_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    ChunkStep *s = (ChunkStep *)type->tp_alloc(type, 0);
    if (s != NULL)
        s->vectorcall = step_unready;
    return (PyObject *)s;
}

PyDoc_STRVAR(step_doc,
"ChunkStep(relay, clock, dec, tally, sink, conn, transport)\n\n"
"`StreamRelay._chunk` for one run of a relay, the usual piece of the body in C (see the module's\n"
"source); `conn` and `transport` are the lean connection's, or both None (`sink.write_nowait`).");

static PyTypeObject ChunkStepType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tailguard._speedups.ChunkStep",
    .tp_basicsize = sizeof(ChunkStep),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = step_doc,
    .tp_new = step_new,
    .tp_init = step_init,
    .tp_traverse = step_traverse,
    .tp_clear = step_clear,
    .tp_dealloc = step_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(ChunkStep, vectorcall),
};

/* ---- the module -------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"has_content", (PyCFunction)(void (*)(void))has_content, METH_FASTCALL, has_content_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tailguard._speedups",
    "The relay's per-chunk hot loop in C; the pure-Python code is the fallback (tailguard.speedups).", -1, methods,
};

static int intern_names(void)
{
    struct { PyObject **slot; const char *name; } names[] = {
        {&s_buf, "_buf"}, {&s_started, "_started"}, {&s_run_started, "run_started"},
        {&s_last_content_at, "last_content_at"}, {&s_content_chunks, "content_chunks"}, {&s_last_at, "last_at"},
        {&s_closing, "closing"}, {&s_paused, "paused"}, {&s_blocked, "_blocked"}, {&s_transcript, "transcript"},
        {&s_chunk, "_chunk"}, {&s_write_nowait, "write_nowait"}, {&s_lo, "_lo"}, {&s_hi, "_hi"}, {&s_i, "_i"},
        {&s_counts, "counts"}, {&s_sum, "sum"}, {&s_observe, "observe"}, {&s_write, "write"},
        {&s_watchdog, "watchdog"}, {&s_request, "request"}, {&s_itl, "itl"}, {&s_max_events, "max_events"},
        {&s_event_bytes, "event_bytes"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL)
            return -1;
    return (s_one = PyLong_FromLong(1)) == NULL ? -1 : 0;
}

PyMODINIT_FUNC PyInit__speedups(void)
{
    if (intern_names() < 0 || PyType_Ready(&ChunkStepType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddObjectRef(m, "ChunkStep", (PyObject *)&ChunkStepType) < 0
                      || PyModule_AddIntConstant(m, "ABI", SPEEDUPS_ABI) < 0))
        Py_CLEAR(m);
    return m;
}
