/* The compiled writer of one thread's ring: omnitrace.record.Ring's record() in C.

   record.py owns the layout and states the rules; Ring there is the reference this file
   follows line for line (reserve, intern, record), and tests/unit/test_record.py writes
   the same calls through both and compares the rings byte for byte. Built at install
   when a C compiler is there (setup.py, optional); without one, record.py's Python
   writer is used. Why by hand: the call itself is the cost (~250 ns in Python, most of
   it the interpreter around one struct.pack_into), and no library packs into a caller's
   shared-memory ring.

   Only the ring's owning thread calls record(); the GIL is held throughout, so the only
   other party is the agent in another process: it reads the write cursor (stored last,
   release order) and writes the read cursor (loaded here with acquire order). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define HEADER_SIZE 256
#define RECORD_SIZE 32
#define OFF_WRITE 24
#define OFF_READ 32
#define OFF_DROPPED 40
#define OFF_STRING_SLOTS 88

typedef struct {
    PyObject_HEAD
    Py_buffer view;       /* the ring's shared memory, header first */
    char *base;
    uint64_t capacity, mask, w, free_slots, dropped, string_slots;
    Py_ssize_t max_interned;
    PyObject *ids;         /* request id str -> its number in this ring */
    PyObject *string_slots_fn; /* record.string_slots(rid, text) -> bytes: the one home of
                                  the STRING record's layout */
} Writer;

static inline void store_u64(char *p, uint64_t v) { __atomic_store_n((uint64_t *)p, v, __ATOMIC_RELEASE); }
static inline uint64_t load_u64(char *p) { return __atomic_load_n((uint64_t *)p, __ATOMIC_ACQUIRE); }

static int reserve(Writer *self, uint64_t n) {
    if (self->free_slots < n) {
        self->free_slots = self->capacity - (self->w - load_u64(self->base + OFF_READ));
        if (self->free_slots < n) {
            self->dropped += 1;
            store_u64(self->base + OFF_DROPPED, self->dropped);
            return 0;
        }
    }
    return 1;
}

/* The request's number in this ring, writing its STRING record on first use; 0 when the
   ring had no room (counted as a drop); -1 with an exception set on error. */
static long intern(Writer *self, PyObject *req) {
    Py_ssize_t have = PyDict_GET_SIZE(self->ids);
    int full = have >= self->max_interned;
    long rid = full ? 1 : (long)have + 1;
    PyObject *raw = PyObject_CallFunction(self->string_slots_fn, "lO", rid, req);
    if (raw == NULL) return -1;
    if (!PyBytes_Check(raw) || PyBytes_GET_SIZE(raw) % RECORD_SIZE) {
        Py_DECREF(raw);
        PyErr_SetString(PyExc_TypeError, "string_slots must return whole slots as bytes");
        return -1;
    }
    uint64_t slots = (uint64_t)PyBytes_GET_SIZE(raw) / RECORD_SIZE;
    if (!reserve(self, slots)) { Py_DECREF(raw); return 0; }
    if (full) PyDict_Clear(self->ids);
    const char *src = PyBytes_AS_STRING(raw);
    for (uint64_t i = 0; i < slots; i++)  /* slot by slot: it may wrap around the ring's end */
        memcpy(self->base + HEADER_SIZE + ((self->w + i) & self->mask) * RECORD_SIZE,
               src + i * RECORD_SIZE, RECORD_SIZE);
    Py_DECREF(raw);
    self->w += slots;
    self->free_slots -= slots;
    self->string_slots += slots;
    store_u64(self->base + OFF_STRING_SLOTS, self->string_slots);  /* before the cursor */
    store_u64(self->base + OFF_WRITE, self->w);
    PyObject *num = PyLong_FromLong(rid);
    if (num == NULL || PyDict_SetItem(self->ids, req, num) < 0) { Py_XDECREF(num); return -1; }
    Py_DECREF(num);
    return rid;
}

static int as_i64(PyObject *o, int64_t lo, int64_t hi, const char *what, int64_t *out) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < lo || v > hi) {
        PyErr_Format(PyExc_OverflowError, "record: %s out of range", what);
        return -1;
    }
    *out = v;
    return 0;
}

static const char *const ARG_NAMES[] = {"kind", "req", "stage", "chunk", "a", "b", "t"};

/* record(kind, req, stage, chunk=-1, a=0, b=0, t=0): as Ring.record. */
static PyObject *Writer_record(Writer *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *given[7] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    if (nargs > 7) { PyErr_SetString(PyExc_TypeError, "record() takes at most 7 arguments"); return NULL; }
    for (Py_ssize_t i = 0; i < nargs; i++) given[i] = args[i];
    if (kwnames != NULL) {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++) {
            const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
            int slot = -1;
            for (int j = 0; name != NULL && j < 7; j++) if (strcmp(name, ARG_NAMES[j]) == 0) slot = j;
            if (slot < 0 || given[slot] != NULL) {
                PyErr_Format(PyExc_TypeError, "record() got an unexpected or repeated argument %R",
                             PyTuple_GET_ITEM(kwnames, k));
                return NULL;
            }
            given[slot] = args[nargs + k];
        }
    }
    if (given[0] == NULL || given[1] == NULL || given[2] == NULL) {
        PyErr_SetString(PyExc_TypeError, "record() needs kind, req and stage");
        return NULL;
    }
    int64_t kind, stage, chunk = -1, a = 0, b = 0, t = 0;
    if (as_i64(given[0], 0, 0xFFFF, "kind", &kind) < 0) return NULL;
    if (as_i64(given[2], -0x8000, 0x7FFF, "stage", &stage) < 0) return NULL;
    if (given[3] && as_i64(given[3], INT32_MIN, INT32_MAX, "chunk", &chunk) < 0) return NULL;
    if (given[4] && as_i64(given[4], INT64_MIN, INT64_MAX, "a", &a) < 0) return NULL;
    if (given[5] && as_i64(given[5], INT32_MIN, INT32_MAX, "b", &b) < 0) return NULL;
    if (given[6] && as_i64(given[6], INT64_MIN, INT64_MAX, "t", &t) < 0) return NULL;
    PyObject *req = given[1];
    if (!PyUnicode_Check(req)) { PyErr_SetString(PyExc_TypeError, "record: req must be a str"); return NULL; }

    long rid;
    PyObject *num = PyDict_GetItemWithError(self->ids, req);  /* borrowed */
    if (num != NULL) {
        rid = PyLong_AsLong(num);
    } else {
        if (PyErr_Occurred()) return NULL;
        rid = intern(self, req);
        if (rid < 0) return NULL;
    }
    if (rid == 0 || (!self->free_slots && !reserve(self, 1))) Py_RETURN_NONE;
    if (t == 0) {  /* time.perf_counter_ns()'s clock on Linux */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    }
    /* (t_ns q, a q, request u32, chunk i32, kind u16, stage i16, b i32), little endian:
       native integers here, so Ring.writer() uses this writer on little-endian machines only */
    char *p = self->base + HEADER_SIZE + (self->w & self->mask) * RECORD_SIZE;
    uint32_t req32 = (uint32_t)rid;
    int32_t chunk32 = (int32_t)chunk, b32 = (int32_t)b;
    uint16_t kind16 = (uint16_t)kind;
    int16_t stage16 = (int16_t)stage;
    memcpy(p, &t, 8);
    memcpy(p + 8, &a, 8);
    memcpy(p + 16, &req32, 4);
    memcpy(p + 20, &chunk32, 4);
    memcpy(p + 24, &kind16, 2);
    memcpy(p + 26, &stage16, 2);
    memcpy(p + 28, &b32, 4);
    self->w += 1;
    self->free_slots -= 1;
    store_u64(self->base + OFF_WRITE, self->w);
    Py_RETURN_NONE;
}

static int Writer_init(Writer *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"buffer", "capacity", "string_slots", "max_interned", NULL};
    PyObject *buffer, *fn;
    unsigned long long capacity;
    Py_ssize_t max_interned;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OKOn", kwlist, &buffer, &capacity, &fn, &max_interned))
        return -1;
    if (capacity == 0 || (capacity & (capacity - 1))) {
        PyErr_SetString(PyExc_ValueError, "ring capacity must be a power of two");
        return -1;
    }
    if (self->base != NULL) { PyErr_SetString(PyExc_RuntimeError, "Writer already initialised"); return -1; }
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if ((uint64_t)self->view.len < HEADER_SIZE + capacity * RECORD_SIZE) {
        PyBuffer_Release(&self->view);
        PyErr_SetString(PyExc_ValueError, "buffer smaller than the ring");
        return -1;
    }
    self->base = self->view.buf;
    self->capacity = capacity;
    self->mask = capacity - 1;
    /* a writer takes over a ring as its header says (a fresh one: all zero) */
    self->w = load_u64(self->base + OFF_WRITE);
    self->dropped = load_u64(self->base + OFF_DROPPED);
    self->string_slots = load_u64(self->base + OFF_STRING_SLOTS);
    self->free_slots = capacity - (self->w - load_u64(self->base + OFF_READ));
    self->max_interned = max_interned;
    self->ids = PyDict_New();
    if (self->ids == NULL) return -1;
    Py_INCREF(fn);
    self->string_slots_fn = fn;
    return 0;
}

static PyObject *Writer_close(Writer *self, PyObject *Py_UNUSED(ignored)) {
    if (self->base != NULL) {
        PyBuffer_Release(&self->view);
        self->base = NULL;
    }
    Py_RETURN_NONE;
}

/* record() after close(): the ring's memory is gone; the writer becomes a no-op rather
   than writing into freed memory (a thread still holding it after its ring closed). */
static PyObject *Writer_record_checked(Writer *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (self->base == NULL) Py_RETURN_NONE;
    return Writer_record(self, args, nargs, kwnames);
}

static PyObject *Writer_state(Writer *self, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("{sKsKsKsKsO}", "w", self->w, "free", self->free_slots, "dropped", self->dropped,
                         "string_slots", self->string_slots, "ids", self->ids);
}

static void Writer_dealloc(Writer *self) {
    if (self->base != NULL) PyBuffer_Release(&self->view);
    Py_XDECREF(self->ids);
    Py_XDECREF(self->string_slots_fn);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Writer_methods[] = {
    {"record", (PyCFunction)(void (*)(void))Writer_record_checked, METH_FASTCALL | METH_KEYWORDS,
     "record(kind, req, stage, chunk=-1, a=0, b=0, t=0): append one event stamped now (or at t)"},
    {"close", (PyCFunction)Writer_close, METH_NOARGS, "release the ring's memory"},
    {"state", (PyCFunction)Writer_state, METH_NOARGS, "the writer's counters and id table (tests)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "omnitrace._ringc.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Writer(buffer, capacity, string_slots, max_interned): the compiled ring writer",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Writer_init,
    .tp_dealloc = (destructor)Writer_dealloc,
    .tp_methods = Writer_methods,
};

static struct PyModuleDef ringc_module = {
    PyModuleDef_HEAD_INIT, "omnitrace._ringc", "The compiled ring writer (see record.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__ringc(void) {
    if (PyType_Ready(&WriterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&ringc_module);
    if (m == NULL) return NULL;
    Py_INCREF(&WriterType);
    if (PyModule_AddObject(m, "Writer", (PyObject *)&WriterType) < 0) {
        Py_DECREF(&WriterType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
