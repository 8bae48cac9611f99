/* The compiled steps of a feed's preparation (omnitrace.spantable.Prepared) and of the
   event log's decoding (omnitrace.eventlog): each is a numpy reference in Python, which
   stays the rule; tests/unit/test_decodec.py compares the two on random inputs. Built at
   install when a C compiler is there (setup.py, optional); without one, the references
   run. Why by hand: numpy moves a structured row once per operation (a mask, a stable
   argsort then a take, a key then an argsort then a take), and each of those passes over
   a feed costs as much as the whole step does here in one or two.

   Rows are eventlog.EVENT_DTYPE (36 bytes, packed: t i8 @0, a i8 @8, req u4 @16, chunk
   i4 @20, kind u2 @24, stage i2 @26, b i4 @28, ring i4 @32), little endian as the dtype
   says (the module refuses to build elsewhere). Buffers are C-contiguous; the GIL is
   released while the rows are worked.

   group(rows, known, out, pos, starts[, keep[, counts]]) -> (kept, unknown, steps, max ring, uncounted)
       spantable.group_reference: the rows whose kind is known (known: 256 bytes, kind
       k >= 255 reads known[255], which must be 0) and kept (keep: 256 bytes, a subset of
       known; all known where not given) and that carry a request, grouped by
       kind in feed order (a stable counting sort) into out, each one's index in rows
       into pos (int64), starts (int64[257]): kind k's rows are out[starts[k]:starts[k+1]];
       unknown: rows of no known kind; steps: rows of a known kind without a request; the
       greatest ring of all rows (-1: none). Given counts (int64, 256 per ring for rings
       0..n-1: spantable.ring_kinds_reference), each row of a kind up to 255 adds one to
       counts[ring * 256 + kind]; uncounted: the rows of a ring outside 0..n-1 (0 where
       counts is not given).
   of_kinds(rows, kinds, out) -> n
       spantable.of_kinds_reference: the rows whose kind k has kinds[k] != 0 (kinds: 256
       bytes, the last 0: kinds past 255 are never taken) into out, in order; n of them.
   latest(rows, top, seen[, known]) -> (lo, hi)
       spantable.requests_reference: the least and greatest request of (one or more) rows
       (given known, 256 bytes as group's: only the rows of a known kind with a request;
       lo > hi where there is none);
       where hi - lo < len(seen), request q's seen[q - lo] = 1 (0 for the rest up to hi)
       and top[q - lo] its rows' greatest t (int64); else top and seen are left alone.
   sender_tasks(rows, deq kind, process-end kind, put-end kind, deq, start, end, j)
       spantable.sender_tasks_reference over one sender's rows in time order, given deq
       (int64: the indices of its dequeues, ascending): for the k-th dequeue, j[k] the index
       of the row that ends its task (len(rows): none yet), start[k] its start, and where
       j[k] < len(rows), end[k] its end; the caller keeps the closed tasks.
   strings(slots, i, nxt, string kind, strings, ids, texts, lut, drops) -> (status, i, nxt)
       record.SlotDecoder._take_string over a cut's STRING records, from slot i (nxt: the
       first slot that can hold a record): each whole one's slot range appended to drops
       (a list of (lo, hi)) and its string defined as _define and RequestIds.intern do
       (strings, ids, texts: their dict, dict and list; lut: uint32). Stops at the end (0),
       at a string cut off (1), or at one Python takes (2: a table reset, a table to grow,
       a negative length): i is then that record's, nxt as before it.
   keep_runs(rec, drops, out) -> kept
       record.keep_runs_reference: the 32-byte records of rec outside the (lo, hi) ranges of
       drops (int64 pairs, ascending and disjoint) into out, in order.
   map_req(rec, lo, hi, lut)
       record.map_ids_reference, in place: records lo..hi-1 of rec (32-byte ring
       records) get req = lut[req] (uint32), 0 past the table's end.
   events_of(rec, out, ring, offset)
       eventlog.events_of_reference: 32-byte ring records into the first len(rec) rows of
       out, ``ring`` set and ``t`` + offset (wrapping, as numpy's int64 does). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "omnitrace._decodec reads little-endian rows in place"
#endif

#define ROW 36
#define RECORD 32
#define OFF_REQ 16
#define OFF_CHUNK 20
#define OFF_KIND 24
#define OFF_STAGE 26
#define OFF_B 28
#define OFF_RING 32

static inline uint16_t u16_at(const char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t u32_at(const char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline int16_t i16_at(const char *p) { int16_t v; memcpy(&v, p, 2); return v; }
static inline int32_t i32_at(const char *p) { int32_t v; memcpy(&v, p, 4); return v; }

static int too_small(Py_buffer *b, Py_ssize_t need, const char *what) {
    if (b->len >= need) return 0;
    PyErr_Format(PyExc_ValueError, "_decodec: %s holds %zd bytes, needs %zd", what, b->len, need);
    return 1;
}

/* ---------------------------------------------------------------------- group */
static PyObject *group(PyObject *self, PyObject *args) {
    Py_buffer rows, known, out, pos, starts, keep = {0}, counts = {0};
    if (!PyArg_ParseTuple(args, "y*y*w*w*w*|y*w*", &rows, &known, &out, &pos, &starts, &keep, &counts)) return NULL;
    Py_ssize_t n = rows.len / ROW, kept = 0, unknown = 0, steps = 0, uncounted = 0;
    int64_t rings = counts.buf ? counts.len / (256 * 8) : 0;
    int32_t top_ring = n ? INT32_MIN : -1;
    PyObject *res = NULL;
    if (rows.len % ROW || known.len != 256 || ((const char *)known.buf)[255]
        || (keep.buf && (keep.len != 256 || ((const char *)keep.buf)[255]))
        || (counts.buf && counts.len % (256 * 8))) {
        PyErr_SetString(PyExc_ValueError, "_decodec.group: rows of 36 bytes, 256 known (and kept) kinds, the last not, "
                                          "256 int64 counts per ring");
        goto done;
    }
    if (too_small(&out, n * ROW, "out") || too_small(&pos, n * 8, "pos") || too_small(&starts, 257 * 8, "starts"))
        goto done;
    Py_BEGIN_ALLOW_THREADS
    const char *r = rows.buf, *kn = known.buf, *kp = keep.buf ? keep.buf : known.buf;
    int64_t *st = starts.buf, *ps = pos.buf, *cn = counts.buf, next[256];
    char *o = out.buf;
    memset(st, 0, 257 * sizeof(int64_t));
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *row = r + i * ROW;
        unsigned k = u16_at(row + OFF_KIND);
        int32_t ring = i32_at(row + OFF_RING);
        top_ring = ring > top_ring ? ring : top_ring;
        if (cn) {
            if (ring < 0 || ring >= rings) uncounted++;
            else if (k <= 255) cn[(int64_t)ring * 256 + k]++;
        }
        if (k > 255 || !kn[k]) unknown++;
        else if (!u32_at(row + OFF_REQ)) steps++;
        else if (kp[k]) st[k + 1]++;
    }
    for (int k = 0; k < 256; k++) {
        st[k + 1] += st[k];
        next[k] = st[k];
    }
    kept = st[256];
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *row = r + i * ROW;
        unsigned k = u16_at(row + OFF_KIND);
        if (k > 255 || !kp[k] || !u32_at(row + OFF_REQ)) continue;
        int64_t at = next[k]++;
        memcpy(o + at * ROW, row, ROW);
        ps[at] = i;
    }
    Py_END_ALLOW_THREADS
    res = Py_BuildValue("nnnin", kept, unknown, steps, (int)top_ring, uncounted);
done:
    PyBuffer_Release(&rows); PyBuffer_Release(&known); PyBuffer_Release(&out);
    PyBuffer_Release(&pos); PyBuffer_Release(&starts);
    if (keep.buf) PyBuffer_Release(&keep);
    if (counts.buf) PyBuffer_Release(&counts);
    return res;
}

/* ---------------------------------------------------------------------- of_kinds */
static PyObject *of_kinds(PyObject *self, PyObject *args) {
    Py_buffer rows, kinds, out;
    if (!PyArg_ParseTuple(args, "y*y*w*", &rows, &kinds, &out)) return NULL;
    Py_ssize_t n = rows.len / ROW, taken = 0;
    PyObject *res = NULL;
    if (rows.len % ROW || kinds.len != 256 || ((const char *)kinds.buf)[255]) {
        PyErr_SetString(PyExc_ValueError, "_decodec.of_kinds: rows of 36 bytes, 256 kinds, the last not");
        goto done;
    }
    if (too_small(&out, n * ROW, "out")) goto done;
    Py_BEGIN_ALLOW_THREADS
    const char *r = rows.buf, *kn = kinds.buf;
    char *o = out.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned k = u16_at(r + i * ROW + OFF_KIND);
        if (k <= 255 && kn[k]) memcpy(o + ROW * taken++, r + i * ROW, ROW);
    }
    Py_END_ALLOW_THREADS
    res = PyLong_FromSsize_t(taken);
done:
    PyBuffer_Release(&rows); PyBuffer_Release(&kinds); PyBuffer_Release(&out);
    return res;
}

/* ---------------------------------------------------------------------- latest */
/* whether latest counts a row: every row, or (given known) one of a known kind with a request */
static inline int counted(const char *row, const char *kn) {
    if (!kn) return 1;
    unsigned k = u16_at(row + OFF_KIND);
    return k <= 255 && kn[k] && u32_at(row + OFF_REQ);
}

static PyObject *latest(PyObject *self, PyObject *args) {
    Py_buffer rows, top, seen, known = {0};
    if (!PyArg_ParseTuple(args, "y*w*w*|y*", &rows, &top, &seen, &known)) return NULL;
    Py_ssize_t n = rows.len / ROW, size = seen.len;
    PyObject *res = NULL;
    if (rows.len % ROW || !n || top.len != size * 8
        || (known.buf && (known.len != 256 || ((const char *)known.buf)[255]))) {
        PyErr_SetString(PyExc_ValueError, "_decodec.latest: one or more rows of 36 bytes, as many int64 tops as seen bytes, 256 known kinds, the last not");
        goto done;
    }
    const char *r = rows.buf, *kn = known.buf;
    uint32_t lo = UINT32_MAX, hi = 0;
    int fits;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!counted(r + i * ROW, kn)) continue;
        uint32_t q = u32_at(r + i * ROW + OFF_REQ);
        lo = q < lo ? q : lo;
        hi = q > hi ? q : hi;
    }
    fits = lo <= hi && (uint64_t)hi - lo < (uint64_t)size;
    if (fits) {
        int64_t *tp = top.buf;
        unsigned char *sn = seen.buf;
        memset(sn, 0, (size_t)(hi - lo) + 1);
        for (Py_ssize_t i = 0; i < n; i++) {
            const char *row = r + i * ROW;
            if (!counted(row, kn)) continue;
            uint32_t at = u32_at(row + OFF_REQ) - lo;
            int64_t t;
            memcpy(&t, row, 8);
            if (!sn[at] || t > tp[at]) tp[at] = t;
            sn[at] = 1;
        }
    }
    Py_END_ALLOW_THREADS
    res = Py_BuildValue("kk", (unsigned long)lo, (unsigned long)hi);
done:
    PyBuffer_Release(&rows); PyBuffer_Release(&top); PyBuffer_Release(&seen);
    if (known.buf) PyBuffer_Release(&known);
    return res;
}

/* ---------------------------------------------------------------------- sender_tasks */
#define OFF_A 8

typedef struct { uint64_t key; int64_t at; } PEntry;  /* (req, chunk) -> a PROCESS_END's index */

static inline uint64_t req_chunk(const char *row) {
    return ((uint64_t)u32_at(row + OFF_REQ) << 32) | u32_at(row + OFF_CHUNK);
}

static inline int64_t t_at(const char *row) { int64_t v; memcpy(&v, row, 8); return v; }

/* For each dequeue (deq[0..m-1], ascending), the index of the first PROCESS_END after it of
   its own request and chunk (n: none): one backward pass, the latest one seen per key in an
   open-addressed table. Returns 0 when out of memory. */
static int own_process_ends(const char *r, Py_ssize_t n, const int64_t *deq, Py_ssize_t m, unsigned pe,
                            int64_t *own) {
    size_t size = 16;
    while (size < 2 * (size_t)n) size *= 2;
    PEntry *table = calloc(size, sizeof(PEntry));  /* at == 0: empty (stored as index + 1) */
    if (!table) return 0;
    Py_ssize_t k = m - 1;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        const char *row = r + i * ROW;
        int is_deq = k >= 0 && deq[k] == i;
        if (!is_deq && u16_at(row + OFF_KIND) != pe) continue;
        uint64_t key = req_chunk(row), h = (key * 0x9E3779B97F4A7C15ull) >> 20;
        size_t at = h & (size - 1);
        while (table[at].at && table[at].key != key) at = (at + 1) & (size - 1);
        if (is_deq) {
            own[k--] = table[at].at ? table[at].at - 1 : n;
        } else {
            table[at].key = key;
            table[at].at = i + 1;
        }
    }
    free(table);
    return 1;
}

static PyObject *sender_tasks(PyObject *self, PyObject *args) {
    Py_buffer rows, deq_b, out_start, out_end, out_j;
    unsigned deq_kind, pe_kind, put_kind;
    if (!PyArg_ParseTuple(args, "y*IIIy*w*w*w*", &rows, &deq_kind, &pe_kind, &put_kind, &deq_b,
                          &out_start, &out_end, &out_j)) return NULL;
    Py_ssize_t n = rows.len / ROW, m = deq_b.len / 8;
    PyObject *res = NULL;
    int64_t *own = NULL;
    if (rows.len % ROW || deq_b.len % 8 || out_start.len < m * 8 || out_end.len < m * 8 || out_j.len < m * 8) {
        PyErr_SetString(PyExc_ValueError, "_decodec.sender_tasks: rows of 36 bytes, int64 dequeues and outputs as many");
        goto done;
    }
    const char *r = rows.buf;
    const int64_t *deq = deq_b.buf;
    for (Py_ssize_t k = 0; k < m; k++)
        if (deq[k] < 0 || deq[k] >= n || (k && deq[k] <= deq[k - 1]) || u16_at(r + deq[k] * ROW + OFF_KIND) != deq_kind) {
            PyErr_SetString(PyExc_ValueError, "_decodec.sender_tasks: dequeues must be the rows of their kind, ascending");
            goto done;
        }
    int64_t *start = out_start.buf, *end = out_end.buf, *j = out_j.buf;
    int batch_any = 0;
    for (Py_ssize_t k = 0; k + 1 < m; k++) batch_any |= t_at(r + deq[k] * ROW) == t_at(r + deq[k + 1] * ROW);
    if (batch_any && !(own = malloc(sizeof(int64_t) * (m ? m : 1)))) {
        PyErr_NoMemory();
        goto done;
    }
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    /* the first closer after each dequeue: a PUT_END, a 0-byte PROCESS_END or a dequeue */
    int64_t next_closer = n;
    Py_ssize_t k = m - 1;
    for (Py_ssize_t i = n - 1; i >= 0 && k >= 0; i--) {
        const char *row = r + i * ROW;
        unsigned kind = u16_at(row + OFF_KIND);
        if (i == deq[k]) j[k--] = next_closer;
        if (kind == put_kind || kind == deq_kind || (kind == pe_kind && t_at(row + OFF_A) == 0)) next_closer = i;
    }
    for (k = 0; k < m; k++) {  /* a closer of another task falls back to the next dequeue */
        int64_t c = j[k];
        const char *d = r + deq[k] * ROW, *e = r + c * ROW;
        int valid = c < n;
        if (valid) {
            unsigned kc = u16_at(e + OFF_KIND);
            valid = kc == deq_kind || (u32_at(e + OFF_REQ) == u32_at(d + OFF_REQ)
                                       && (kc == put_kind || i32_at(e + OFF_CHUNK) == i32_at(d + OFF_CHUNK)));
        }
        if (!valid) j[k] = k + 1 < m ? deq[k + 1] : n;
        start[k] = t_at(d);
    }
    if (batch_any) {  /* a batch's tasks end at their own PROCESS_END, each after the last */
        ok = own_process_ends(r, n, deq, m, pe_kind, own);
        for (k = 0; ok && k < m; k++) {
            int64_t t = t_at(r + deq[k] * ROW);
            int in_batch = (k && t == t_at(r + deq[k - 1] * ROW)) || (k + 1 < m && t == t_at(r + deq[k + 1] * ROW));
            if (in_batch) j[k] = own[k];
        }
        for (k = 1; ok && k < m; k++) {  /* (0 where none: the reference's maximum with 0) */
            int64_t t = t_at(r + deq[k] * ROW), tp = t_at(r + deq[k - 1] * ROW);
            int64_t prev_end = tp == t && j[k - 1] < n ? t_at(r + j[k - 1] * ROW) : 0;
            start[k] = start[k] > prev_end ? start[k] : prev_end;
        }
    }
    for (k = 0; ok && k < m; k++)
        if (j[k] < n) {
            int64_t t = t_at(r + j[k] * ROW);
            end[k] = t > start[k] ? t : start[k];
        }
    Py_END_ALLOW_THREADS
    if (!ok) {
        PyErr_NoMemory();
        goto done;
    }
    Py_INCREF(Py_None);
    res = Py_None;
done:
    free(own);
    PyBuffer_Release(&rows); PyBuffer_Release(&deq_b);
    PyBuffer_Release(&out_start); PyBuffer_Release(&out_end); PyBuffer_Release(&out_j);
    return res;
}

/* ---------------------------------------------------------------------- events_of */
static PyObject *events_of(PyObject *self, PyObject *args) {
    Py_buffer rec, out;
    int ring;
    long long offset;
    if (!PyArg_ParseTuple(args, "y*w*iL", &rec, &out, &ring, &offset)) return NULL;
    Py_ssize_t n = rec.len / RECORD;
    PyObject *res = NULL;
    if (rec.len % RECORD) {
        PyErr_SetString(PyExc_ValueError, "_decodec.events_of: records of 32 bytes");
        goto done;
    }
    if (too_small(&out, n * ROW, "out")) goto done;
    Py_BEGIN_ALLOW_THREADS
    const char *r = rec.buf;
    char *o = out.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        char *row = o + i * ROW;
        uint64_t t;
        memcpy(row, r + i * RECORD, RECORD);
        memcpy(&t, row, 8);
        t += (uint64_t)offset;
        memcpy(row, &t, 8);
        memcpy(row + OFF_RING, &ring, 4);
    }
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    res = Py_None;
done:
    PyBuffer_Release(&rec); PyBuffer_Release(&out);
    return res;
}

/* ---------------------------------------------------------------------- map_req */
static PyObject *map_req(PyObject *self, PyObject *args) {
    Py_buffer rec, lut;
    Py_ssize_t lo, hi;
    if (!PyArg_ParseTuple(args, "w*nny*", &rec, &lo, &hi, &lut)) return NULL;
    Py_ssize_t n = rec.len / RECORD, size = lut.len / 4;
    PyObject *res = NULL;
    if (rec.len % RECORD || lut.len % 4 || lo < 0 || hi < lo || hi > n) {
        PyErr_SetString(PyExc_ValueError, "_decodec.map_req: records of 32 bytes, 0 <= lo <= hi <= records, a uint32 table");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    char *r = rec.buf;
    const uint32_t *table = lut.buf;
    for (Py_ssize_t i = lo; i < hi; i++) {
        char *at = r + i * RECORD + OFF_REQ;
        uint32_t id = u32_at(at);
        id = id < (uint64_t)size ? table[id] : 0;
        memcpy(at, &id, 4);
    }
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    res = Py_None;
done:
    PyBuffer_Release(&rec); PyBuffer_Release(&lut);
    return res;
}

/* ---------------------------------------------------------------------- strings */
enum { STRINGS_DONE, STRINGS_CUT, STRINGS_BY_PYTHON };

/* Store one string as record.SlotDecoder._define does (no reset: the caller's), its
   run-wide id as record.RequestIds.intern gives it. 0: a Python error is set. */
static int define_one(PyObject *strings, PyObject *ids, PyObject *texts, uint32_t *lut, long rid,
                      const char *data, Py_ssize_t length) {
    PyObject *text = PyUnicode_DecodeUTF8(data, length, "replace"), *key = PyLong_FromLong(rid), *id = NULL;
    int ok = text && key && PyDict_SetItem(strings, key, text) == 0;
    if (ok && !(id = PyDict_GetItemWithError(ids, text))) {
        ok = !PyErr_Occurred() && (id = PyLong_FromSsize_t(PyList_GET_SIZE(texts)))
             && PyDict_SetItem(ids, text, id) == 0 && PyList_Append(texts, text) == 0;
        Py_XDECREF(id);  /* the dict holds it */
        id = ok ? PyDict_GetItemWithError(ids, text) : NULL;
        ok = ok && id;
    }
    if (ok) lut[rid] = (uint32_t)PyLong_AsUnsignedLong(id);
    Py_XDECREF(text);
    Py_XDECREF(key);
    return ok && !PyErr_Occurred();
}

static PyObject *strings(PyObject *self, PyObject *args) {
    Py_buffer raw, lut;
    Py_ssize_t i, nxt;
    unsigned kind;
    PyObject *strs, *ids, *texts, *drops;
    if (!PyArg_ParseTuple(args, "y*nnIO!O!O!w*O!", &raw, &i, &nxt, &kind, &PyDict_Type, &strs, &PyDict_Type,
                          &ids, &PyList_Type, &texts, &lut, &PyList_Type, &drops)) return NULL;
    Py_ssize_t n = raw.len / RECORD, size = lut.len / 4;
    const char *r = raw.buf;
    int status = STRINGS_DONE;
    PyObject *res = NULL;
    if (raw.len % RECORD || lut.len % 4 || i < 0) {
        PyErr_SetString(PyExc_ValueError, "_decodec.strings: 32-byte slots, a uint32 table");
        goto done;
    }
    for (; i < n; i++) {
        const char *rec = r + i * RECORD;
        if (u16_at(rec + OFF_KIND) != kind || i < nxt) continue;
        int64_t length;
        memcpy(&length, rec + 8, 8);
        /* the reference's arithmetic: slots = ceil(length / 32), also for a negative one */
        int64_t slots = (length >> 5) + ((length & 31) != 0), room = n - i - 1;
        long rid = (long)u32_at(rec + OFF_REQ);
        if (slots > room || length < 0 || (rid == 1 && PyDict_Size(strs)) || rid >= size) {
            status = slots > room ? STRINGS_CUT : STRINGS_BY_PYTHON;  /* a reset, a table to grow */
            break;
        }
        PyObject *range = Py_BuildValue("(nn)", i, (Py_ssize_t)(i + 1 + slots));
        int ok = range && PyList_Append(drops, range) == 0;
        Py_XDECREF(range);
        if (!ok || !define_one(strs, ids, texts, lut.buf, rid, rec + RECORD, (Py_ssize_t)length)) goto done;
        nxt = i + 1 + slots;
    }
    res = Py_BuildValue("inn", status, i, nxt);
done:
    PyBuffer_Release(&raw); PyBuffer_Release(&lut);
    return res;
}

/* ---------------------------------------------------------------------- keep_runs */
static PyObject *keep_runs(PyObject *self, PyObject *args) {
    Py_buffer rec, drops, out;
    if (!PyArg_ParseTuple(args, "y*y*w*", &rec, &drops, &out)) return NULL;
    Py_ssize_t n = rec.len / RECORD, m = drops.len / 16, kept = 0;
    PyObject *res = NULL;
    const int64_t *d = drops.buf;
    int ok = !(rec.len % RECORD) && !(drops.len % 16);
    for (Py_ssize_t j = 0, at = 0; ok && j < m; j++) {  /* ascending, disjoint, inside */
        ok = d[2 * j] >= at && d[2 * j + 1] >= d[2 * j] && d[2 * j + 1] <= n;
        kept += ok ? d[2 * j] - at : 0;
        at = ok ? d[2 * j + 1] : at;
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "_decodec.keep_runs: records of 32 bytes, (lo, hi) int64 ranges ascending and disjoint");
        goto done;
    }
    kept += n - (m ? d[2 * m - 1] : 0);
    if (too_small(&out, kept * RECORD, "out")) goto done;
    Py_BEGIN_ALLOW_THREADS
    const char *r = rec.buf;
    char *o = out.buf;
    Py_ssize_t at = 0;
    for (Py_ssize_t j = 0; j <= m; j++) {
        Py_ssize_t lo = j < m ? d[2 * j] : n;
        memcpy(o, r + at * RECORD, (size_t)(lo - at) * RECORD);
        o += (lo - at) * RECORD;
        at = j < m ? d[2 * j + 1] : n;
    }
    Py_END_ALLOW_THREADS
    res = PyLong_FromSsize_t(kept);
done:
    PyBuffer_Release(&rec); PyBuffer_Release(&drops); PyBuffer_Release(&out);
    return res;
}

static PyMethodDef methods[] = {
    {"strings", strings, METH_VARARGS, "A cut's STRING records defined, up to one Python must take."},
    {"sender_tasks", sender_tasks, METH_VARARGS, "The sender rule over one sender's events."},
    {"latest", latest, METH_VARARGS, "Each request's latest t, by request - lo."},
    {"keep_runs", keep_runs, METH_VARARGS, "Records less the dropped ranges."},
    {"map_req", map_req, METH_VARARGS, "Ring request ids -> run-wide ids, in place."},
    {"group", group, METH_VARARGS, "Known-kind rows with a request, grouped by kind (stable)."},
    {"of_kinds", of_kinds, METH_VARARGS, "The rows of some kinds, in order."},
    {"events_of", events_of, METH_VARARGS, "Ring records -> event rows of one ring."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_decodec", NULL, -1, methods};

PyMODINIT_FUNC PyInit__decodec(void) { return PyModule_Create(&module); }
