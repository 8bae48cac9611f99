/* The compiled interval kernels, each the C twin of a numpy reference kept beside its
   caller and tested equal to it on random inputs (tests/unit/test_intervals_paths.py,
   tests/unit/rules/test_walk.py): rank (the FIFO culprit ranking, below), pieces
   (intervals.other_pieces), overlap (intervals.other_overlap: the FIFO blocked time), pairs
   (intervals.pair_figures: the head-of-line figures) and latest (rules/walk.py's
   latest-span lookups). Each section states its contract.

   The FIFO culprit ranking: omnitrace.intervals.top_others in C.

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

static int get_array(PyObject *obj, Py_buffer *view, const char *name, int writable, char kind) {
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    const char *f = view->format;
    if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
    int ok = kind == 'd' ? strcmp(f, "d") == 0 : (strcmp(f, "q") == 0 || strcmp(f, "l") == 0);
    if (view->itemsize != 8 || view->ndim != 1 || !ok) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "%s: a 1-d C-contiguous %s array is needed", name,
                     kind == 'd' ? "float64" : "int64");
        return -1;
    }
    return 0;
}

static int get_int64(PyObject *obj, Py_buffer *view, const char *name, int writable) {
    return get_array(obj, view, name, writable, 'q');
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

/* ---- The head-of-line pair figures: intervals.blocked_pairs_reference in C.

   pairs(vi, culprit, start, end, sender, task, wall, chunk, p_victim, p_culprit, p_wall,
         p_chunk, p_tasks) -> number of pairs
   Pieces (vi < len(wall), culprit, [start, end), sender, task) are the overlaps of the
   victims' critical-path waits with other requests' sender tasks. Per victim: wall (the
   union of its pieces, float64), chunk (their summed length); per (victim, culprit)
   pair, by victim then culprit: its share of the union (each moment split evenly among
   the culprits active then, an owner's overlapping pieces merged first), its summed
   length, its distinct (sender, task)s. The shares are the reference's floats bit for
   bit: one running integral over the whole call's edges (victims in index order, each
   victim's edges in time order; a zero-length step adds 0.0 and so changes nothing,
   whatever the order of tied edges), a share the integral's difference between its
   interval's edges, a pair's shares added in start order from 0.0. The pair outputs
   must hold one row per piece. */
typedef struct { int64_t culprit, start, end, sender, task; } Piece;
typedef struct { int64_t t; int64_t d, merged; } Edge;       /* d: +1 start, -1 end */
typedef struct { int64_t sender, task; } Task;
typedef struct { int64_t pair, start, end; double f0, f1; } Merged;

/* A stable sort of n items of `type` by `less`, with scratch `tmp`: insertion sort of
   runs of 16, then bottom-up merges. */
#define MERGE_SORT(name, type, less)                                                     \
    static void name(type *a, type *tmp, Py_ssize_t n) {                                 \
        for (Py_ssize_t lo = 0; lo < n; lo += 16) {                                      \
            Py_ssize_t hi = lo + 16 < n ? lo + 16 : n;                                   \
            for (Py_ssize_t i = lo + 1; i < hi; i++) {                                   \
                type x = a[i];                                                           \
                Py_ssize_t j = i;                                                        \
                for (; j > lo && less(&x, &a[j - 1]); j--) a[j] = a[j - 1];              \
                a[j] = x;                                                                \
            }                                                                            \
        }                                                                                \
        type *src = a, *dst = tmp;                                                       \
        for (Py_ssize_t w = 16; w < n; w *= 2) {                                         \
            for (Py_ssize_t lo = 0; lo < n; lo += 2 * w) {                               \
                Py_ssize_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n; \
                Py_ssize_t i = lo, j = mid, k = lo;                                      \
                while (i < mid && j < hi) dst[k++] = less(&src[j], &src[i]) ? src[j++] : src[i++]; \
                while (i < mid) dst[k++] = src[i++];                                     \
                while (j < hi) dst[k++] = src[j++];                                      \
            }                                                                            \
            type *t = src; src = dst; dst = t;                                           \
        }                                                                                \
        if (src != a) memcpy(a, src, (size_t)n * sizeof(type));                          \
    }
#define PIECE_LESS(x, y) ((x)->culprit < (y)->culprit || ((x)->culprit == (y)->culprit && (x)->start < (y)->start))
#define EDGE_LESS(x, y) ((x)->t < (y)->t || ((x)->t == (y)->t && (x)->d < (y)->d))
#define TASK_LESS(x, y) ((x)->sender < (y)->sender || ((x)->sender == (y)->sender && (x)->task < (y)->task))
MERGE_SORT(sort_pieces, Piece, PIECE_LESS)
MERGE_SORT(sort_tasks, Task, TASK_LESS)

/* Merge the nruns runs of edges a[bounds[r]:bounds[r + 1]], each in time order, into one
   (bottom-up, pairs of neighbours; bounds is overwritten). */
static void merge_runs(Edge *a, Edge *tmp, Py_ssize_t *bounds, Py_ssize_t nruns) {
    Py_ssize_t total = bounds[nruns];
    Edge *src = a, *dst = tmp;
    while (nruns > 1) {
        Py_ssize_t out = 0;
        for (Py_ssize_t r = 0; r < nruns; r += 2) {
            Py_ssize_t lo = bounds[r], mid = r + 1 < nruns ? bounds[r + 1] : total;
            Py_ssize_t hi = r + 2 < nruns ? bounds[r + 2] : total, i = lo, j = mid, k = lo;
            while (i < mid && j < hi) dst[k++] = EDGE_LESS(&src[j], &src[i]) ? src[j++] : src[i++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
            bounds[out++] = lo;
        }
        bounds[out] = total;
        nruns = out;
        Edge *t = src; src = dst; dst = t;
    }
    if (src != a) memcpy(a, src, (size_t)total * sizeof(Edge));
}

typedef struct {
    const int64_t *vi, *culprit, *start, *end, *sender, *task;
    double *wall, *p_wall;
    int64_t *chunk, *p_victim, *p_culprit, *p_chunk, *p_tasks;
    Py_ssize_t n, nv;
    Py_ssize_t *lo;       /* victim v's pieces: order[lo[v]:lo[v + 1]] */
    Py_ssize_t *order;
    Piece *pieces, *piece_tmp;
    Task *tasks, *task_tmp;
    Merged *merged;
    Edge *edges, *edge_tmp;
    Py_ssize_t *runs;     /* each pair's first merged interval: its edges are one time-sorted run */
    double F;             /* the running integral of 1 / active culprits, over the call */
} PairJob;

static Py_ssize_t distinct_tasks(PairJob *job, const Piece *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) job->tasks[i] = (Task){p[i].sender, p[i].task};
    sort_tasks(job->tasks, job->task_tmp, n);
    Py_ssize_t d = n > 0;
    for (Py_ssize_t i = 1; i < n; i++) d += TASK_LESS(&job->tasks[i - 1], &job->tasks[i]);
    return d;
}

/* Victim v's pairs from `row` on and its culprits' merged intervals; returns the pairs. */
static Py_ssize_t victim_pairs(PairJob *job, int64_t v, Py_ssize_t np_, Py_ssize_t row, Py_ssize_t *nm) {
    Piece *p = job->pieces;
    Py_ssize_t a = 0, m = 0, pairs = 0;
    while (a < np_) {
        job->runs[pairs] = 2 * m;
        Py_ssize_t b = a;
        int64_t sum = 0, s = p[a].start, reach = p[a].end;
        for (; b < np_ && p[b].culprit == p[a].culprit; b++) {
            sum += p[b].end - p[b].start;
            if (b > a && p[b].start > reach) {
                job->merged[m++] = (Merged){row + pairs, s, reach, 0.0, 0.0};
                s = p[b].start;
            }
            if (p[b].end > reach) reach = p[b].end;  /* a new run's too: its start > reach */
        }
        job->merged[m++] = (Merged){row + pairs, s, reach, 0.0, 0.0};
        job->p_victim[row + pairs] = v;
        job->p_culprit[row + pairs] = p[a].culprit;
        job->p_chunk[row + pairs] = sum;
        job->p_tasks[row + pairs] = distinct_tasks(job, &p[a], b - a);
        job->p_wall[row + pairs] = 0.0;
        pairs++;
        a = b;
    }
    job->runs[pairs] = 2 * m;
    *nm = m;
    return pairs;
}

/* Sweep the merged intervals' edges in time order: the union into wall[v], each merged
   interval's integral at its edges. A pair's merged intervals are disjoint and in start
   order, so its edges are in time order already: the pairs' runs are merged. */
static void sweep(PairJob *job, int64_t v, Py_ssize_t m, Py_ssize_t pairs) {
    Edge *e = job->edges;
    for (Py_ssize_t i = 0; i < m; i++) {
        e[2 * i] = (Edge){job->merged[i].start, 1, i};
        e[2 * i + 1] = (Edge){job->merged[i].end, -1, i};
    }
    merge_runs(e, job->edge_tmp, job->runs, pairs);
    int64_t active = 0;
    double wall = 0.0;
    for (Py_ssize_t k = 0; k < 2 * m; k++) {
        Merged *g = &job->merged[e[k].merged];
        if (e[k].d > 0) g->f0 = job->F; else g->f1 = job->F;
        active += e[k].d;
        int64_t len = (k + 1 < 2 * m && active != 0) ? e[k + 1].t - e[k].t : 0;
        wall += (double)len;
        job->F += active > 0 ? (double)len / (double)active : 0.0;
    }
    job->wall[v] = wall;
}

static Py_ssize_t run_pairs(PairJob *job) {
    Py_ssize_t row = 0;
    for (int64_t v = 0; v < job->nv; v++) {
        Py_ssize_t np_ = job->lo[v + 1] - job->lo[v], m = 0;
        int64_t chunk = 0;
        for (Py_ssize_t i = 0; i < np_; i++) {
            Py_ssize_t r = job->order[job->lo[v] + i];
            job->pieces[i] = (Piece){job->culprit[r], job->start[r], job->end[r], job->sender[r], job->task[r]};
            chunk += job->end[r] - job->start[r];
        }
        job->chunk[v] = chunk;
        job->wall[v] = 0.0;
        if (!np_) continue;
        sort_pieces(job->pieces, job->piece_tmp, np_);
        Py_ssize_t pairs = victim_pairs(job, v, np_, row, &m);
        sweep(job, v, m, pairs);
        for (Py_ssize_t i = 0; i < m; i++)   /* in start order per pair, as the reference adds */
            job->p_wall[job->merged[i].pair] += job->merged[i].f1 - job->merged[i].f0;
        row += pairs;
    }
    return row;
}

#define N_PAIR_BUFFERS 13
static const char *const PAIR_NAMES[N_PAIR_BUFFERS] = {
    "vi", "culprit", "start", "end", "sender", "task", "wall", "chunk", "p_victim", "p_culprit",
    "p_wall", "p_chunk", "p_tasks"};

/* Lengths agree, every vi indexes wall; then victim v's pieces bucketed (stably) into
   job->order[job->lo[v]:job->lo[v + 1]]; the most pieces of one victim into *widest. */
static int bucket_pieces(PairJob *job, Py_buffer *v, Py_ssize_t *widest) {
    job->n = v[0].shape[0];
    job->nv = v[6].shape[0];
    for (int b = 1; b < N_PAIR_BUFFERS; b++) {
        Py_ssize_t want = b == 6 || b == 7 ? job->nv : job->n;
        if (b < 6 ? v[b].shape[0] != want : v[b].shape[0] < want) {
            PyErr_Format(PyExc_ValueError, "%s: %s %zd entries", PAIR_NAMES[b],
                         b < 6 ? "not one per piece:" : "room for", want);
            return -1;
        }
    }
    job->lo = PyMem_RawCalloc((size_t)job->nv + 2, sizeof(Py_ssize_t));
    job->order = PyMem_RawMalloc(((size_t)job->n + 1) * sizeof(Py_ssize_t));
    if (job->lo == NULL || job->order == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < job->n; i++) {
        if (job->vi[i] < 0 || job->vi[i] >= job->nv) {
            PyErr_SetString(PyExc_IndexError, "a piece's victim index is out of bounds");
            return -1;
        }
        job->lo[job->vi[i] + 2]++;
    }
    Py_ssize_t wide = 0;
    for (Py_ssize_t g = 0; g < job->nv; g++) {
        if (job->lo[g + 2] > wide) wide = job->lo[g + 2];
        job->lo[g + 2] += job->lo[g + 1];
    }
    for (Py_ssize_t i = 0; i < job->n; i++) job->order[job->lo[job->vi[i] + 1]++] = i;
    *widest = wide;
    return 0;
}

static void free_pairs(PairJob *job) {
    void *bufs[] = {job->lo, job->order, job->pieces, job->piece_tmp, job->tasks, job->task_tmp,
                    job->merged, job->edges, job->edge_tmp, job->runs};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) PyMem_RawFree(bufs[i]);
}

static Py_ssize_t pairs_in(PairJob *job, Py_buffer *v) {
    job->vi = v[0].buf; job->culprit = v[1].buf; job->start = v[2].buf; job->end = v[3].buf;
    job->sender = v[4].buf; job->task = v[5].buf; job->wall = v[6].buf; job->chunk = v[7].buf;
    job->p_victim = v[8].buf; job->p_culprit = v[9].buf; job->p_wall = v[10].buf;
    job->p_chunk = v[11].buf; job->p_tasks = v[12].buf;
    Py_ssize_t widest = 0, n = -1;
    if (bucket_pieces(job, v, &widest) == 0) {
        size_t w = (size_t)widest + 1;
        job->pieces = PyMem_RawMalloc(w * sizeof(Piece));
        job->piece_tmp = PyMem_RawMalloc(w * sizeof(Piece));
        job->tasks = PyMem_RawMalloc(w * sizeof(Task));
        job->task_tmp = PyMem_RawMalloc(w * sizeof(Task));
        job->merged = PyMem_RawMalloc(w * sizeof(Merged));
        job->edges = PyMem_RawMalloc(2 * w * sizeof(Edge));
        job->edge_tmp = PyMem_RawMalloc(2 * w * sizeof(Edge));
        job->runs = PyMem_RawMalloc((w + 1) * sizeof(Py_ssize_t));
        if (!job->pieces || !job->piece_tmp || !job->tasks || !job->task_tmp || !job->merged
            || !job->edges || !job->edge_tmp || !job->runs) {
            PyErr_NoMemory();
        } else {
            Py_BEGIN_ALLOW_THREADS
            n = run_pairs(job);
            Py_END_ALLOW_THREADS
        }
    }
    free_pairs(job);
    return n;
}

static PyObject *pairs(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != N_PAIR_BUFFERS) {
        PyErr_Format(PyExc_TypeError, "pairs() takes %d arguments", N_PAIR_BUFFERS);
        return NULL;
    }
    PairJob job = {0};
    Py_buffer v[N_PAIR_BUFFERS];
    int got = 0;
    Py_ssize_t n = -1;
    for (; got < N_PAIR_BUFFERS; got++)
        if (get_array(args[got], &v[got], PAIR_NAMES[got], got >= 6, got == 6 || got == 10 ? 'd' : 'q') < 0)
            break;
    if (got == N_PAIR_BUFFERS) n = pairs_in(&job, v);
    while (got > 0) PyBuffer_Release(&v[--got]);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

/* ---- Overlap pieces: intervals.other_pieces (its numpy _pieces_in) in C.

   pieces(starts, ends, owners, q0, q1, qowner, lo, hi, out_q, out_iv, out_lo, out_hi) -> n
   Query i walks intervals [lo[i], hi[i]) and writes each overlap of positive length with
   an interval of another owner: (i, interval index, overlap start, overlap end), queries in
   index order, intervals in order. The outputs must hold sum(hi - lo) rows. */
static Py_ssize_t run_pieces(const int64_t *const *in, int64_t *const *out, Py_ssize_t nq) {
    const int64_t *starts = in[0], *ends = in[1], *owners = in[2], *q0 = in[3], *q1 = in[4],
                  *qowner = in[5], *lo = in[6], *hi = in[7];
    Py_ssize_t w = 0;
    for (Py_ssize_t i = 0; i < nq; i++) {
        int64_t a0 = q0[i], b0 = q1[i], me = qowner[i];
        for (int64_t j = lo[i]; j < hi[i]; j++) {
            int64_t a = starts[j] > a0 ? starts[j] : a0, b = ends[j] < b0 ? ends[j] : b0;
            if (b <= a || owners[j] == me) continue;
            out[0][w] = i; out[1][w] = j; out[2][w] = a; out[3][w] = b;
            w++;
        }
    }
    return w;
}

static const char *const PIECE_NAMES[12] = {
    "starts", "ends", "owners", "q0", "q1", "qowner", "lo", "hi", "out_q", "out_iv", "out_lo", "out_hi"};

/* Lengths agree, every [lo, hi) lies in the intervals, the outputs hold every row. */
static int check_pieces(Py_buffer *v) {
    Py_ssize_t nt = v[0].shape[0], nq = v[3].shape[0], rows = 0;
    const int64_t *lo = v[6].buf, *hi = v[7].buf;
    for (int b = 1; b < 8; b++)
        if (v[b].shape[0] != (b < 3 ? nt : nq)) {
            PyErr_Format(PyExc_ValueError, "%s: not one entry per %s", PIECE_NAMES[b], b < 3 ? "interval" : "query");
            return -1;
        }
    for (Py_ssize_t i = 0; i < nq; i++) {
        if (hi[i] <= lo[i]) continue;
        if (lo[i] < 0 || hi[i] > nt) {
            PyErr_SetString(PyExc_IndexError, "a query's interval range [lo, hi) is out of bounds");
            return -1;
        }
        rows += hi[i] - lo[i];
    }
    for (int b = 8; b < 12; b++)
        if (v[b].shape[0] < rows) {
            PyErr_Format(PyExc_ValueError, "%s: room for %zd rows is needed", PIECE_NAMES[b], rows);
            return -1;
        }
    return 0;
}

static PyObject *pieces(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "pieces() takes 12 arguments");
        return NULL;
    }
    Py_buffer v[12];
    int got = 0;
    Py_ssize_t n = -1;
    for (; got < 12; got++)
        if (get_int64(args[got], &v[got], PIECE_NAMES[got], got >= 8) < 0) break;
    if (got == 12 && check_pieces(v) == 0) {
        const int64_t *in[8];
        int64_t *out[4];
        for (int b = 0; b < 8; b++) in[b] = v[b].buf;
        for (int b = 0; b < 4; b++) out[b] = v[8 + b].buf;
        Py_BEGIN_ALLOW_THREADS
        n = run_pieces(in, out, v[3].shape[0]);
        Py_END_ALLOW_THREADS
    }
    while (got > 0) PyBuffer_Release(&v[--got]);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

/* ---- The walk's latest-span lookups: rules/walk.py _Latest.by (numpy) in C.

   latest(groups, lo, end, rowno, code, t, fallback, out) -> None
   Spans sorted by (group code, end, table order): group g's are [lo[g], lo[g + 1]), codes
   `groups` ascending. Per query: the row number of the latest span of its code's group
   ending by t[i] (among equal ends the first), -1 where none; with `fallback`, where none
   ends by t[i], the latest of the group; -1 where the code has no group. */
static Py_ssize_t upper_bound(const int64_t *a, Py_ssize_t lo, Py_ssize_t hi, int64_t x) {
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (a[mid] <= x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static Py_ssize_t lower_bound(const int64_t *a, Py_ssize_t lo, Py_ssize_t hi, int64_t x) {
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (a[mid] < x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static void run_latest(const int64_t *const *in, Py_ssize_t ng, Py_ssize_t nq, int fallback, int64_t *out) {
    const int64_t *groups = in[0], *lo = in[1], *end = in[2], *rowno = in[3], *code = in[4], *t = in[5];
    for (Py_ssize_t i = 0; i < nq; i++) {
        Py_ssize_t g = lower_bound(groups, 0, ng, code[i]);
        out[i] = -1;
        if (g >= ng || groups[g] != code[i]) continue;
        Py_ssize_t a = lo[g], b = lo[g + 1], p = upper_bound(end, a, b, t[i]) - 1;
        if (p < a) {
            if (!fallback) continue;
            p = b - 1;
        }
        out[i] = rowno[lower_bound(end, a, p, end[p])];
    }
}

static PyObject *latest(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    static const char *const names[8] = {"groups", "lo", "end", "rowno", "code", "t", "fallback", "out"};
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "latest() takes 8 arguments");
        return NULL;
    }
    int fallback = PyObject_IsTrue(args[6]);
    if (fallback < 0) return NULL;
    Py_buffer v[7];
    int got = 0, ok = 0;
    for (; got < 7; got++)
        if (get_int64(args[got < 6 ? got : 7], &v[got], names[got < 6 ? got : 7], got == 6) < 0) break;
    if (got == 7) {
        Py_ssize_t ng = v[0].shape[0], nrows = v[2].shape[0], nq = v[4].shape[0];
        const int64_t *lo = v[1].buf;
        ok = v[1].shape[0] == ng + 1 && v[3].shape[0] == nrows && v[5].shape[0] == nq && v[6].shape[0] == nq;
        for (Py_ssize_t g = 0; ok && g < ng; g++)
            ok = lo[g] >= 0 && lo[g] < lo[g + 1] && lo[g + 1] <= nrows;
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "latest(): lo must bound non-empty groups of the rows, "
                            "rowno match end, t and out match code");
        } else {
            const int64_t *in[6];
            for (int b = 0; b < 6; b++) in[b] = v[b].buf;
            Py_BEGIN_ALLOW_THREADS
            run_latest(in, ng, nq, fallback, v[6].buf);
            Py_END_ALLOW_THREADS
        }
    }
    while (got > 0) PyBuffer_Release(&v[--got]);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* ---- Blocked time: intervals.other_overlap (numpy prefix sums) in C.

   overlap(starts, ends, owners, q0, q1, qowner, lo, hi, out) -> bool
   Query i (q0[i] <= q1[i]) takes intervals [lo[i], hi[i]) and writes into out[i] its
   summed overlap with those of other owners. The reference's prefix sums give that sum
   only for disjoint intervals in time order: where these are not (an interval ending
   before it starts or after the next starts), nothing is written and it returns False
   (the caller keeps the reference's answer).

   A long wait spans many of its sender's tasks (~90 a query): walking them all costs more
   than prefix sums. Of disjoint time-ordered intervals, those starting before q0 are a
   prefix of the range and those ending after q1 a suffix (each clipped, walked one by
   one: at most one each for a query's own candidates); the rest lie inside the query,
   summed from prefix sums of all intervals less those of the query's own owner (prefix
   sums over the intervals sorted by (owner, index)). Unsigned sums: a difference of two
   wraps round exactly. */
static int disjoint(const int64_t *starts, const int64_t *ends, Py_ssize_t n) {
    for (Py_ssize_t j = 0; j < n; j++)
        if (ends[j] < starts[j] || (j + 1 < n && ends[j] > starts[j + 1])) return 0;
    return 1;
}

typedef struct { int64_t owner, idx; } OwnerKey;

static int by_owner_then_index(const void *x, const void *y) {
    const OwnerKey *a = x, *b = y;
    if (a->owner != b->owner) return a->owner < b->owner ? -1 : 1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

typedef struct {
    const int64_t *starts, *ends, *owners;
    Py_ssize_t n;
    uint64_t *cum, *own_cum;  /* n + 1 each: lengths summed in index order, in key order */
    OwnerKey *keys;           /* (owner, index) in order */
    Py_ssize_t *heads;        /* span + 1 group starts by owner - low (span 0: none) */
    int64_t low, span;
} Sums;

/* keys by (owner, index): a counting sort where the owners (a window's request ids) span
   a narrow range, each owner's group then found at once; else qsort. */
static int sort_keys(Sums *s) {
    Py_ssize_t n = s->n;
    int64_t lo = 0, hi = -1;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (j == 0 || s->owners[j] < lo) lo = s->owners[j];
        if (j == 0 || s->owners[j] > hi) hi = s->owners[j];
    }
    s->low = lo;
    s->span = n && (uint64_t)hi - (uint64_t)lo < (uint64_t)(4 * n + 64) ? hi - lo + 1 : 0;
    if (!s->span) {
        for (Py_ssize_t j = 0; j < n; j++) s->keys[j] = (OwnerKey){s->owners[j], j};
        qsort(s->keys, n, sizeof *s->keys, by_owner_then_index);
        return 1;
    }
    s->heads = calloc(s->span + 1, sizeof *s->heads);
    Py_ssize_t *next = malloc((s->span + 1) * sizeof *next);
    if (!s->heads || !next) { free(next); return 0; }
    for (Py_ssize_t j = 0; j < n; j++) s->heads[s->owners[j] - lo + 1]++;
    for (int64_t g = 0; g < s->span; g++) s->heads[g + 1] += s->heads[g];
    memcpy(next, s->heads, (s->span + 1) * sizeof *next);
    for (Py_ssize_t j = 0; j < n; j++) s->keys[next[s->owners[j] - lo]++] = (OwnerKey){s->owners[j], j};
    free(next);
    return 1;
}

/* keys[g0, g1) of owner ``me``. */
static void owner_group(const Sums *s, int64_t me, Py_ssize_t *g0, Py_ssize_t *g1) {
    if (s->span) {
        int64_t g = me - s->low;
        *g0 = *g1 = 0;
        if (me >= s->low && g < s->span) { *g0 = s->heads[g]; *g1 = s->heads[g + 1]; }
        return;
    }
    Py_ssize_t a = 0, b = s->n;
    while (a < b) { Py_ssize_t m = a + (b - a) / 2; if (s->keys[m].owner < me) a = m + 1; else b = m; }
    *g0 = a;
    b = s->n;
    while (a < b) { Py_ssize_t m = a + (b - a) / 2; if (s->keys[m].owner <= me) a = m + 1; else b = m; }
    *g1 = a;
}

/* The first of keys[a, b) (one owner's) of index >= idx. */
static Py_ssize_t index_bound(const OwnerKey *keys, Py_ssize_t a, Py_ssize_t b, int64_t idx) {
    while (a < b) {
        Py_ssize_t m = a + (b - a) / 2;
        if (keys[m].idx < idx) a = m + 1;
        else b = m;
    }
    return a;
}

static int sums_build(Sums *s) {
    Py_ssize_t n = s->n;
    s->cum = malloc((n + 1) * sizeof *s->cum);
    s->own_cum = malloc((n + 1) * sizeof *s->own_cum);
    s->keys = malloc((n ? n : 1) * sizeof *s->keys);
    if (!s->cum || !s->own_cum || !s->keys || !sort_keys(s)) return 0;
    s->cum[0] = s->own_cum[0] = 0;
    for (Py_ssize_t j = 0; j < n; j++)
        s->cum[j + 1] = s->cum[j] + ((uint64_t)s->ends[j] - (uint64_t)s->starts[j]);
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t j = s->keys[k].idx;
        s->own_cum[k + 1] = s->own_cum[k] + ((uint64_t)s->ends[j] - (uint64_t)s->starts[j]);
    }
    return 1;
}

static void sums_free(Sums *s) {
    free(s->cum);
    free(s->own_cum);
    free(s->keys);
    free(s->heads);
}

/* The query's overlap with interval j if another owner's, else 0. */
static inline uint64_t clipped(const Sums *s, int64_t j, int64_t a0, int64_t b0, int64_t me) {
    int64_t a = s->starts[j] > a0 ? s->starts[j] : a0, b = s->ends[j] < b0 ? s->ends[j] : b0;
    return b > a && s->owners[j] != me ? (uint64_t)b - (uint64_t)a : 0;
}

static int64_t query_overlap(const Sums *s, int64_t lo, int64_t hi, int64_t a0, int64_t b0,
                             int64_t me) {
    uint64_t sum = 0;
    while (lo < hi && s->starts[lo] < a0) sum += clipped(s, lo++, a0, b0, me);
    while (hi > lo && s->ends[hi - 1] > b0) sum += clipped(s, --hi, a0, b0, me);
    if (hi > lo) {  /* wholly inside the query: all of them, less the own owner's */
        Py_ssize_t g0, g1;
        owner_group(s, me, &g0, &g1);
        Py_ssize_t p0 = index_bound(s->keys, g0, g1, lo), p1 = index_bound(s->keys, p0, g1, hi);
        sum += (s->cum[hi] - s->cum[lo]) - (s->own_cum[p1] - s->own_cum[p0]);
    }
    return (int64_t)sum;
}

/* 0: out of memory (nothing written). */
static int run_overlap(const int64_t *const *in, Py_ssize_t nt, Py_ssize_t nq, int64_t *out) {
    const int64_t *q0 = in[3], *q1 = in[4], *qowner = in[5], *lo = in[6], *hi = in[7];
    Sums s = {in[0], in[1], in[2], nt, NULL, NULL, NULL, NULL, 0, 0};
    int ok = sums_build(&s);
    for (Py_ssize_t i = 0; ok && i < nq; i++)
        out[i] = hi[i] > lo[i] ? query_overlap(&s, lo[i], hi[i], q0[i], q1[i], qowner[i]) : 0;
    sums_free(&s);
    return ok;
}

static PyObject *overlap(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "overlap() takes 9 arguments");
        return NULL;
    }
    Py_buffer v[9];
    int got = 0, ok = -1;
    for (; got < 9; got++)
        if (get_int64(args[got], &v[got], got < 8 ? PIECE_NAMES[got] : "out", got == 8) < 0) break;
    if (got == 9) {
        Py_ssize_t nt = v[0].shape[0], nq = v[3].shape[0];
        const int64_t *lo = v[6].buf, *hi = v[7].buf, *q0 = v[3].buf, *q1 = v[4].buf;
        int shapes = v[1].shape[0] == nt && v[2].shape[0] == nt;
        for (int b = 4; b < 9; b++) shapes = shapes && v[b].shape[0] == nq;
        for (Py_ssize_t i = 0; shapes && i < nq; i++)
            shapes = q0[i] <= q1[i] && (hi[i] <= lo[i] || (lo[i] >= 0 && hi[i] <= nt));
        if (!shapes) {
            PyErr_SetString(PyExc_ValueError, "overlap(): one interval per starts/ends/owners row, one "
                            "query per q0/q1/qowner/lo/hi/out row, q0 <= q1, [lo, hi) within the intervals");
        } else {
            const int64_t *in[8];
            for (int b = 0; b < 8; b++) in[b] = v[b].buf;
            int memory = 1;
            Py_BEGIN_ALLOW_THREADS
            ok = disjoint(v[0].buf, v[1].buf, nt);
            if (ok) memory = run_overlap(in, nt, nq, v[8].buf);
            Py_END_ALLOW_THREADS
            if (!memory) {
                PyErr_NoMemory();
                ok = -1;
            }
        }
    }
    while (got > 0) PyBuffer_Release(&v[--got]);
    if (ok < 0) return NULL;
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"rank", (PyCFunction)(void (*)(void))rank, METH_FASTCALL,
     "rank(starts, ends, owners, q0, q1, qowner, lo, hi, k, out_q, out_first, out_rank) -> rows"},
    {"pieces", (PyCFunction)(void (*)(void))pieces, METH_FASTCALL,
     "pieces(starts, ends, owners, q0, q1, qowner, lo, hi, out_q, out_iv, out_lo, out_hi) -> rows"},
    {"overlap", (PyCFunction)(void (*)(void))overlap, METH_FASTCALL,
     "overlap(starts, ends, owners, q0, q1, qowner, lo, hi, out) -> whether the intervals are disjoint"},
    {"latest", (PyCFunction)(void (*)(void))latest, METH_FASTCALL,
     "latest(groups, lo, end, rowno, code, t, fallback, out) -> None"},
    {"pairs", (PyCFunction)(void (*)(void))pairs, METH_FASTCALL,
     "pairs(vi, culprit, start, end, sender, task, wall, chunk, p_victim, p_culprit, p_wall, p_chunk, "
     "p_tasks) -> pairs"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef intervalsc_module = {
    PyModuleDef_HEAD_INIT, "omnitrace._intervalsc",
    "The compiled FIFO culprit ranking and head-of-line pair figures (see intervals.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__intervalsc(void) { return PyModule_Create(&intervalsc_module); }
