/* The compiled FIFO culprit ranking: omnitrace.intervals.top_others in C.

   intervals.py owns the rule and states it; top_others_reference there (numpy: every
   (wait, task) overlap enumerated, then two lexsorts and a reduceat) is the reference this
   file follows, and tests/unit/test_intervals.py compares the two on random inputs. Built
   at install when a C compiler is there (setup.py, optional); without one, intervals.py
   uses the reference. Why by hand: a deep FIFO makes every wait overlap tens to hundreds of
   tasks, so the reference materialises hundreds of millions of pairs and sorts them twice;
   here each wait walks its candidate tasks once, sums overlap per owner in a small hash
   table and keeps its top k, in memory proportional to the widest wait.

   rank(starts, ends, owners, q0, q1, qowner, lo, hi, k, out_q, out_first, out_rank) -> n
   All arguments but k are C-contiguous int64 buffers. Wait i walks tasks [lo[i], hi[i]);
   for each other owner (!= qowner[i]) with positive overlap it writes one row, best first
   (total overlap descending, ties: the owner whose first overlapping task comes first),
   at most k per wait, waits in index order: the wait's index, that first task's index
   (the caller reads the owner from it), the rank from 0. The outputs must hold
   sum(min(k, hi - lo)) rows; n is the number written. The GIL is released while it runs. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { int64_t owner, sum, first; } Owner;   /* one other owner of the wait */
typedef struct { int64_t stamp, slot; } Bucket;      /* stamp: 1 + the wait using it */

/* Insertion rank of a before b: more overlap, then the earlier first task. */
static inline int before(const Owner *a, const Owner *b) {
    return a->sum > b->sum || (a->sum == b->sum && a->first < b->first);
}

static int by_rank(const void *a, const void *b) {
    return before((const Owner *)a, (const Owner *)b) ? -1 : before((const Owner *)b, (const Owner *)a);
}

static inline uint64_t mix(int64_t owner) {
    uint64_t h = (uint64_t)owner * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

typedef struct {
    const int64_t *starts, *ends, *owners, *q0, *q1, *qowner, *lo, *hi;
    int64_t *out_q, *out_first, *out_rank;
    Py_ssize_t n_tasks, n_waits, k;
    Bucket *table;        /* sized for the widest wait; a wait uses its first `mask + 1` */
    Owner *seen;          /* the wait's other owners, in order of their first task */
    Py_ssize_t *top;      /* indexes into seen: the best k so far, best first */
} Job;

/* Sum wait i's overlap per other owner into job->seen; returns how many owners. */
static Py_ssize_t sum_owners(Job *job, Py_ssize_t i) {
    int64_t q0 = job->q0[i], q1 = job->q1[i], me = job->qowner[i], stamp = (int64_t)i + 1;
    int64_t width = job->hi[i] - job->lo[i];
    uint64_t mask = 7;
    while ((int64_t)mask + 1 < 2 * width) mask = mask * 2 + 1;
    Py_ssize_t n = 0;
    for (int64_t j = job->lo[i]; j < job->hi[i]; j++) {
        int64_t owner = job->owners[j];
        int64_t a = job->starts[j] > q0 ? job->starts[j] : q0;
        int64_t b = job->ends[j] < q1 ? job->ends[j] : q1;
        if (b <= a || owner == me) continue;
        uint64_t h = mix(owner) & mask;
        while (job->table[h].stamp == stamp && job->seen[job->table[h].slot].owner != owner)
            h = (h + 1) & mask;
        if (job->table[h].stamp != stamp) {
            job->table[h].stamp = stamp;
            job->table[h].slot = n;
            job->seen[n++] = (Owner){owner, 0, j};
        }
        job->seen[job->table[h].slot].sum += b - a;
    }
    return n;
}

/* Wait i's best min(k, n) owners, best first, into job->top; returns how many. seen is
   in first-task order, so a later owner displaces an earlier one only with more overlap.
   A large k sorts instead (insertion would cost n * k). */
static Py_ssize_t best_owners(Job *job, Py_ssize_t n) {
    Py_ssize_t k = job->k < n ? job->k : n, have = 0;
    if (job->k > 16) {
        qsort(job->seen, (size_t)n, sizeof(Owner), by_rank);
        for (Py_ssize_t r = 0; r < k; r++) job->top[r] = r;
        return k;
    }
    for (Py_ssize_t s = 0; s < n; s++) {
        Py_ssize_t at = have;
        while (at > 0 && before(&job->seen[s], &job->seen[job->top[at - 1]])) at--;
        if (at >= k) continue;
        Py_ssize_t last = have < k ? have : k - 1;
        memmove(&job->top[at + 1], &job->top[at], (size_t)(last - at) * sizeof(Py_ssize_t));
        job->top[at] = s;
        if (have < k) have++;
    }
    return have;
}

static Py_ssize_t run(Job *job) {
    Py_ssize_t w = 0;
    for (Py_ssize_t i = 0; i < job->n_waits; i++) {
        if (job->hi[i] <= job->lo[i]) continue;
        Py_ssize_t kept = best_owners(job, sum_owners(job, i));
        for (Py_ssize_t r = 0; r < kept; r++, w++) {
            job->out_q[w] = i;
            job->out_first[w] = job->seen[job->top[r]].first;
            job->out_rank[w] = r;
        }
    }
    return w;
}

#define N_BUFFERS 11
static const char *const NAMES[N_BUFFERS] = {
    "starts", "ends", "owners", "q0", "q1", "qowner", "lo", "hi", "out_q", "out_first", "out_rank"};

static int get_int64(PyObject *obj, Py_buffer *view, const char *name, int writable) {
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    const char *f = view->format;
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    if (view->itemsize != 8 || view->ndim != 1 || !(strcmp(f, "q") == 0 || strcmp(f, "l") == 0)) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s: a 1-d C-contiguous int64 array is needed", name);
        return -1;
    }
    return 0;
}

/* Lengths agree, every wait's [lo, hi) lies in the tasks, the outputs hold every row;
   the widest wait (sizes the table) into *widest. */
static int check(Job *job, Py_buffer *v, Py_ssize_t *widest) {
    Py_ssize_t nt = v[0].shape[0], nw = v[3].shape[0], rows = 0, wide = 0;
    if (v[1].shape[0] != nt || v[2].shape[0] != nt) {
        PyErr_SetString(PyExc_ValueError, "starts, ends and owners differ in length");
        return -1;
    }
    for (int b = 4; b < 8; b++)
        if (v[b].shape[0] != nw) {
            PyErr_Format(PyExc_ValueError, "%s: not one entry per wait", NAMES[b]);
            return -1;
        }
    for (Py_ssize_t i = 0; i < nw; i++) {
        int64_t lo = job->lo[i], hi = job->hi[i];
        if (hi <= lo) continue;
        if (lo < 0 || hi > nt) {
            PyErr_SetString(PyExc_IndexError, "a wait's task range [lo, hi) is out of bounds");
            return -1;
        }
        rows += (hi - lo) < job->k ? (hi - lo) : job->k;
        if (hi - lo > wide) wide = hi - lo;
    }
    for (int b = 8; b < N_BUFFERS; b++)
        if (v[b].shape[0] < rows) {
            PyErr_Format(PyExc_ValueError, "%s: room for %zd rows is needed", NAMES[b], rows);
            return -1;
        }
    *widest = wide;
    return 0;
}

static Py_ssize_t rank_in(Job *job, Py_buffer *v) {
    job->starts = v[0].buf; job->ends = v[1].buf; job->owners = v[2].buf;
    job->q0 = v[3].buf; job->q1 = v[4].buf; job->qowner = v[5].buf;
    job->lo = v[6].buf; job->hi = v[7].buf;
    job->out_q = v[8].buf; job->out_first = v[9].buf; job->out_rank = v[10].buf;
    job->n_tasks = v[0].shape[0];
    job->n_waits = v[3].shape[0];
    Py_ssize_t widest;
    if (check(job, v, &widest) < 0) return -1;
    size_t buckets = 8;
    while ((Py_ssize_t)buckets < 2 * widest) buckets *= 2;
    job->table = PyMem_RawCalloc(buckets, sizeof(Bucket));
    job->seen = PyMem_RawMalloc((size_t)(widest + 1) * sizeof(Owner));
    job->top = PyMem_RawMalloc((size_t)(job->k + 1) * sizeof(Py_ssize_t));
    Py_ssize_t n = -1;
    if (job->table == NULL || job->seen == NULL || job->top == NULL) {
        PyErr_NoMemory();
    } else {
        Py_BEGIN_ALLOW_THREADS
        n = run(job);
        Py_END_ALLOW_THREADS
    }
    PyMem_RawFree(job->table);
    PyMem_RawFree(job->seen);
    PyMem_RawFree(job->top);
    return n;
}

static PyObject *rank(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != N_BUFFERS + 1) {
        PyErr_Format(PyExc_TypeError, "rank() takes %d arguments", N_BUFFERS + 1);
        return NULL;
    }
    Job job = {0};
    job.k = PyLong_AsSsize_t(args[8]);
    if (job.k == -1 && PyErr_Occurred()) return NULL;
    if (job.k < 0) job.k = 0;
    Py_buffer v[N_BUFFERS];
    int got = 0;
    Py_ssize_t n = -1;
    for (; got < N_BUFFERS; got++) {
        PyObject *obj = args[got < 8 ? got : got + 1];
        if (get_int64(obj, &v[got], NAMES[got], got >= 8) < 0) break;
    }
    if (got == N_BUFFERS) n = rank_in(&job, v);
    while (got > 0) PyBuffer_Release(&v[--got]);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

static PyMethodDef methods[] = {
    {"rank", (PyCFunction)(void (*)(void))rank, METH_FASTCALL,
     "rank(starts, ends, owners, q0, q1, qowner, lo, hi, k, out_q, out_first, out_rank) -> rows"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef intervalsc_module = {
    PyModuleDef_HEAD_INIT, "omnitrace._intervalsc",
    "The compiled FIFO culprit ranking (see intervals.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__intervalsc(void) { return PyModule_Create(&intervalsc_module); }
