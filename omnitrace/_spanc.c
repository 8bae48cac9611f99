/* Row-at-a-time passes of the span load in C: a structured row's fields written or read
   in one pass over the rows, where numpy makes one strided pass per field (and one more
   copy per gather, mask and concatenate).

   The rules and their numpy references live in Python; this file follows them and the
   tests compare the two on random inputs (tests/unit/test_spanc.py):

   chunk_spans(b, bi, e, ei, replicas, name, figure_from, out)
       spantable.SpanBuilder's chunk span rows (CHUNK_DTYPE, "S"; reference:
       SpanBuilder.chunk_rows_reference): row i from begin event b[bi[i]] and end event
       e[ei[i]] (EVENT_DTYPE); figure_from: 0 none, 1 the begin's a, 2 the end's a; 3: a poll
       lag row (SpanBuilder.poll_rows_reference).
   event_keys(rows, stage_from_b, out)
       spantable._key of each event's (request, stage or b, chunk) into out (int64).
   pair_sorted(bk, bo, ek, eo, out_b, out_e) -> n
       spantable.match's pairing (reference: spantable.pair_reference) of begins and ends
       already in (key, time) order: bk/ek their keys, bo/eo their indexes.
   report_split(chunks, skip, first_audio, first_start, early, snap, fifo, xfer, bad)
       analyze.tables.ReportTables' split of one feed's chunk spans (reference:
       tables.split_reference) into the tables' free tails (early rows: EARLY_DTYPE, "R");
       returns the rows written to each and the skipped count.

   Byte buffers; the row layouts are those LAYOUT names (the Python side compares it with
   its dtypes and uses the references where they differ). The GIL is released while the
   rows are walked. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define LAYOUT "E36:t0,a8,req16,chunk20,kind24,stage26,b28,ring32;" \
    "S64:name0,reason1,stage2,peer4,replica6,req8,chunk12,ring16,start20,end28,figure36," \
    "blocked44,by052,by156,by260;" \
    "P14:req0,stage4,dur6;F26:req0,stage4,ahead6,dur10,blocked18;" \
    "X25:req0,put4,producer5,consumer7,dur9,bytes17;I6:req0,name4,reason5;" \
    "R48:name0,reason1,stage2,peer4,replica6,req8,chunk12,start16,end24,figure32,blocked40"

enum { EV = 36, SPAN = 64, SNAP = 14, FIFO = 26, XFER = 25, BAD = 6, EARLY = 48 };
/* span names (spantable.NAMES) the split reads */
enum { N_SNAPSHOT = 3, N_FIFO = 4, N_PUT = 6, N_GET = 7 };
/* the same for rowops.compiled, which uses this module only where Python's agree */
#define CONSTANTS "N_SNAPSHOT=3,N_FIFO=4,N_PUT=6,N_GET=7"

#define GET(type, p, off) ({ type v_; memcpy(&v_, (p) + (off), sizeof v_); v_; })
#define PUT(type, p, off, val) do { type v_ = (type)(val); memcpy((p) + (off), &v_, sizeof v_); } while (0)

static int get_buffer(PyObject *obj, Py_buffer *view, const char *name, int writable) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    (void)name;
    return 0;
}

static int rows_of(Py_buffer *v, Py_ssize_t size, const char *name, Py_ssize_t *n) {
    if (v->len % size) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is no whole number of %zd-byte rows",
                     name, v->len, size);
        return -1;
    }
    *n = v->len / size;
    return 0;
}

/* ------------------------------------------------------------------ chunk_spans */
enum { POLL = 3 };  /* figure_from of a poll lag span: its ring, replica and key are the end's */

typedef struct {
    const char *b, *e;
    const int64_t *bi, *ei, *replicas;
    char *out;
    Py_ssize_t n, nb, ne, nrep;
    int name, figure_from;
} Chunks;

/* Row i's begin and end events and its ring (the end's for a poll lag span, else the
   begin's); 0 where an index or the ring is out of range. */
static inline int row_events(const Chunks *c, Py_ssize_t i, const char **b, const char **e,
                             int32_t *ring) {
    int64_t x = c->bi[i], y = c->ei[i];
    if (x < 0 || x >= c->nb || y < 0 || y >= c->ne) return 0;
    *b = c->b + x * EV;
    *e = c->e + y * EV;
    *ring = GET(int32_t, c->figure_from == POLL ? *e : *b, 32);
    return *ring >= 0 && *ring < c->nrep;
}

/* Writes the rows; 0 at the first row out of range (the rows from it on unwritten). */
static int write_chunks(const Chunks *c) {
    int poll = c->figure_from == POLL;
    for (Py_ssize_t i = 0; i < c->n; i++) {
        const char *b, *e;
        int32_t ring;
        if (!row_events(c, i, &b, &e, &ring)) return 0;
        /* a poll lag span is the consumer's (its end's), from the producer's put end */
        const char *own = poll ? e : b;
        char *r = c->out + i * SPAN;
        int64_t bt = GET(int64_t, b, 0), et = GET(int64_t, e, 0);
        memset(r, 0, SPAN);
        r[0] = (char)c->name;
        memcpy(r + 2, own + 26, 2);                               /* stage */
        if (poll) memcpy(r + 4, b + 26, 2);                       /* peer: the producer's stage */
        else PUT(int16_t, r, 4, GET(int32_t, e, 28));             /* peer: the end's b */
        PUT(int16_t, r, 6, c->replicas[ring]);
        memcpy(r + 8, own + 16, 4);                               /* req */
        memcpy(r + 12, own + 20, 4);                              /* chunk */
        memcpy(r + 16, own + 32, 4);                              /* ring */
        PUT(int64_t, r, 20, bt);
        PUT(int64_t, r, 28, et > bt ? et : bt);
        if (c->figure_from == 1) memcpy(r + 36, b + 8, 8);
        else if (c->figure_from == 2) memcpy(r + 36, e + 8, 8);
    }
    return 1;
}

static PyObject *chunk_spans(PyObject *self, PyObject *args) {
    PyObject *o[6];
    Chunks c;
    if (!PyArg_ParseTuple(args, "OOOOOiiO", &o[0], &o[1], &o[2], &o[3], &o[4], &c.name,
                          &c.figure_from, &o[5]))
        return NULL;
    Py_buffer v[6];
    int got = 0, ok = 0;
    static const char *names[] = {"b", "bi", "e", "ei", "replicas", "out"};
    for (; got < 6; got++)
        if (get_buffer(o[got], &v[got], names[got], got == 5) < 0) goto done;
    Py_ssize_t nbi, nei, nout;
    if (rows_of(&v[0], EV, "b", &c.nb) || rows_of(&v[2], EV, "e", &c.ne)
        || rows_of(&v[1], 8, "bi", &nbi) || rows_of(&v[3], 8, "ei", &nei)
        || rows_of(&v[4], 8, "replicas", &c.nrep) || rows_of(&v[5], SPAN, "out", &nout))
        goto done;
    if (nbi != nei || nout < nbi) {
        PyErr_SetString(PyExc_ValueError, "chunk_spans: bi and ei differ in length or out is short");
        goto done;
    }
    c.b = v[0].buf; c.bi = v[1].buf; c.e = v[2].buf; c.ei = v[3].buf;
    c.replicas = v[4].buf; c.out = v[5].buf; c.n = nbi;
    int fine;
    Py_BEGIN_ALLOW_THREADS
    fine = write_chunks(&c);
    Py_END_ALLOW_THREADS
    if (!fine) {
        PyErr_SetString(PyExc_IndexError, "chunk_spans: an index or ring out of range");
        goto done;
    }
    ok = 1;
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ keys, pairs */
static PyObject *event_keys(PyObject *self, PyObject *args) {
    PyObject *o[2];
    int stage_from_b;
    if (!PyArg_ParseTuple(args, "OpO", &o[0], &stage_from_b, &o[1])) return NULL;
    Py_buffer v[2];
    Py_ssize_t n, nout;
    if (get_buffer(o[0], &v[0], "rows", 0) < 0) return NULL;
    if (get_buffer(o[1], &v[1], "out", 1) < 0) { PyBuffer_Release(&v[0]); return NULL; }
    int ok = !rows_of(&v[0], EV, "rows", &n) && !rows_of(&v[1], 8, "out", &nout);
    if (ok && nout != n) {
        PyErr_SetString(PyExc_ValueError, "event_keys: out is not one key per row");
        ok = 0;
    }
    if (ok) {
        const char *rows = v[0].buf;
        uint64_t *out = v[1].buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            const char *r = rows + i * EV;
            int64_t stage = stage_from_b ? GET(int32_t, r, 28) : GET(int16_t, r, 26);
            uint64_t req = GET(uint32_t, r, 16);
            int64_t chunk = GET(int32_t, r, 20);
            out[i] = (req << 31) | ((uint64_t)(stage + 1) << 24) | (uint64_t)(chunk + 1);
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&v[0]);
    PyBuffer_Release(&v[1]);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *pair_sorted(PyObject *self, PyObject *args) {
    enum { NB = 6 };
    PyObject *o[NB];
    if (!PyArg_ParseTuple(args, "OOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5])) return NULL;
    static const char *names[NB] = {"bk", "bo", "ek", "eo", "out_b", "out_e"};
    Py_buffer v[NB];
    Py_ssize_t rows[NB], n = 0;
    int got = 0, ok = 0;
    for (; got < NB; got++)
        if (get_buffer(o[got], &v[got], names[got], got >= 4) < 0) goto done;
    for (int i = 0; i < NB; i++)
        if (rows_of(&v[i], 8, names[i], &rows[i])) goto done;
    Py_ssize_t nb = rows[0], ne = rows[2];
    if (rows[1] != nb || rows[3] != ne || rows[4] < (nb < ne ? nb : ne) || rows[5] < rows[4]) {
        PyErr_SetString(PyExc_ValueError, "pair_sorted: keys and orders differ in length, or out is short");
        goto done;
    }
    const int64_t *bk = v[0].buf, *bo = v[1].buf, *ek = v[2].buf, *eo = v[3].buf;
    int64_t *ob = v[4].buf, *oe = v[5].buf;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t i = 0, j = 0;
    while (i < nb && j < ne) {
        if (bk[i] < ek[j]) i++;
        else if (bk[i] > ek[j]) j++;
        else { ob[n] = bo[i++]; oe[n++] = eo[j++]; }
    }
    Py_END_ALLOW_THREADS
    ok = 1;
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    if (!ok) return NULL;
    return PyLong_FromSsize_t(n);
}

/* ------------------------------------------------------------------ report_split */
typedef struct {
    const char *spans;
    const uint8_t *skip;
    const int64_t *fa;
    int64_t *first;
    char *early, *snap, *fifo, *xfer, *bad;
    Py_ssize_t n, nskip, nfa, nfirst;
    Py_ssize_t counts[6];  /* early, snap, fifo, xfer, bad, skipped */
} Split;

static int split_reqs_ok(const Split *s) {
    for (Py_ssize_t i = 0; i < s->n; i++) {
        uint32_t req = GET(uint32_t, s->spans + i * SPAN, 8);
        if (req >= s->nskip || req >= s->nfa || req >= s->nfirst) return 0;
    }
    return 1;
}

/* A complete chunk span's figure row, if its name has one. */
static void figure_row(Split *s, const char *r, int name, uint32_t req, int64_t dur) {
    if (name == N_SNAPSHOT) {
        char *o = s->snap + s->counts[1]++ * SNAP;
        memcpy(o, &req, 4); memcpy(o + 4, r + 2, 2); PUT(int64_t, o, 6, dur);
    } else if (name == N_FIFO) {
        char *o = s->fifo + s->counts[2]++ * FIFO;
        memcpy(o, &req, 4); memcpy(o + 4, r + 2, 2);
        PUT(int32_t, o, 6, GET(int64_t, r, 36));                  /* ahead: figure */
        PUT(int64_t, o, 10, dur);
        memcpy(o + 18, r + 44, 8);                                /* blocked */
    } else if (name == N_PUT || name == N_GET) {
        char *o = s->xfer + s->counts[3]++ * XFER;
        int put = name == N_PUT;
        memcpy(o, &req, 4); o[4] = (char)put;
        memcpy(o + (put ? 5 : 7), r + 2, 2);                      /* stage: producer of a put */
        memcpy(o + (put ? 7 : 5), r + 4, 2);                      /* peer */
        PUT(int64_t, o, 9, dur);
        memcpy(o + 17, r + 36, 8);                                /* bytes: figure */
    }
}

static void split_rows(Split *s) {
    for (Py_ssize_t i = 0; i < s->n; i++) {
        const char *r = s->spans + i * SPAN;
        int name = r[0], reason = r[1];
        uint32_t req = GET(uint32_t, r, 8);
        int gone = s->skip[req] != 0;
        s->counts[5] += gone;
        int64_t start = GET(int64_t, r, 20), end = GET(int64_t, r, 28);
        if (reason == 0) {
            figure_row(s, r, name, req, (int64_t)((uint64_t)end - (uint64_t)start));
        } else {
            char *o = s->bad + s->counts[4]++ * BAD;
            memcpy(o, &req, 4); o[4] = (char)name; o[5] = (char)reason;
        }
        if (start < s->first[req]) s->first[req] = start;
        int64_t t = s->fa[req];
        if (!gone && (t == 0 || start <= t)) {  /* its columns the readers read */
            char *o = s->early + s->counts[0]++ * EARLY;
            memcpy(o, r, 16);                                     /* name .. chunk */
            memcpy(o + 16, r + 20, 32);                           /* start .. blocked */
        }
    }
}

static PyObject *report_split(PyObject *self, PyObject *args) {
    enum { NB = 9 };
    PyObject *o[NB];
    if (!PyArg_ParseTuple(args, "OOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6],
                          &o[7], &o[8]))
        return NULL;
    static const char *names[NB] = {"chunks", "skip", "first_audio", "first_start", "early",
                                    "snap", "fifo", "xfer", "bad"};
    static const Py_ssize_t sizes[NB] = {SPAN, 1, 8, 8, EARLY, SNAP, FIFO, XFER, BAD};
    Py_buffer v[NB];
    Py_ssize_t rows[NB];
    Split s;
    int got = 0, ok = 0;
    for (; got < NB; got++)
        if (get_buffer(o[got], &v[got], names[got], got >= 3) < 0) goto done;
    for (int i = 0; i < NB; i++)
        if (rows_of(&v[i], sizes[i], names[i], &rows[i])) goto done;
    for (int i = 4; i < NB; i++)
        if (rows[i] < rows[0]) {
            PyErr_Format(PyExc_ValueError, "report_split: %s holds fewer rows than chunks", names[i]);
            goto done;
        }
    memset(&s, 0, sizeof s);
    s.spans = v[0].buf; s.skip = v[1].buf; s.fa = v[2].buf; s.first = v[3].buf;
    s.early = v[4].buf; s.snap = v[5].buf; s.fifo = v[6].buf; s.xfer = v[7].buf;
    s.bad = v[8].buf;
    s.n = rows[0]; s.nskip = rows[1]; s.nfa = rows[2]; s.nfirst = rows[3];
    int fine;
    Py_BEGIN_ALLOW_THREADS
    fine = split_reqs_ok(&s);
    if (fine) split_rows(&s);
    Py_END_ALLOW_THREADS
    if (!fine) {
        PyErr_SetString(PyExc_IndexError, "report_split: a request id out of range");
        goto done;
    }
    ok = 1;
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    if (!ok) return NULL;
    return Py_BuildValue("nnnnnn", s.counts[0], s.counts[1], s.counts[2], s.counts[3],
                         s.counts[4], s.counts[5]);
}

static PyMethodDef methods[] = {
    {"chunk_spans", chunk_spans, METH_VARARGS, "Chunk span rows from matched begin/end events."},
    {"event_keys", event_keys, METH_VARARGS, "Each event's (request, stage, chunk) key."},
    {"pair_sorted", pair_sorted, METH_VARARGS, "Pair begins and ends by key, both in key order."},
    {"report_split", report_split, METH_VARARGS, "One feed's chunk spans into the report's tables."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef spanc_module = {
    PyModuleDef_HEAD_INIT, "omnitrace._spanc",
    "Row-at-a-time passes of the span load (see _spanc.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__spanc(void) {
    PyObject *m = PyModule_Create(&spanc_module);
    if (m && (PyModule_AddStringConstant(m, "LAYOUT", LAYOUT) < 0
              || PyModule_AddStringConstant(m, "CONSTANTS", CONSTANTS) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
