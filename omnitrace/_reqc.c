/* The span builder's request and stage state in C: omnitrace.reqstate.RequestStates is
   the rule (in Python), this type follows it method for method, and
   tests/unit/test_reqstate.py feeds both the same random streams and compares every row
   and list they give. Why by hand: the rule is a loop over a request's events, each
   touching that request's state (a Python object per request and per visit: ~1.4 us an
   event, the largest single Python cost of a long run's load); here ~0.1 us.

   States()
     events(ev, replicas, now, last_t, found)   ev: EVENT rows ("E"), kinds FIRST_KIND..
         LAST_KIND in time order; replicas: int64 by ring; last_t: int64 by request;
         found: a reqstate.Found whose lists are appended to
     emits(rows, lo, ring, now)                 rows: EMIT rows ("M") grouped by visit, lo:
         int64 group starts, ring: int64 per group
     seen(reqs, now)                            a sequence of request ids
     expired(now, grace, ended_timeout, idle_timeout) -> [(req, reason)]
     live() -> [req]
     flush(which, last_t, dead) -> freed        which: [(req, reason)]; dead: uint8 by ring
     take() -> (requests, visits, emits)        bytearrays of "R", "V" and "M" rows
     len(), `req in states`

   Requests are found by id through a dense index (int32 per id, as the builder's last_t);
   their state and their visits' are pooled and reused once freed. A narrow field takes a
   wider value's low bits, as reqstate._rows casts. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define LAYOUT "E36:t0,a8,req16,chunk20,kind24,stage26,b28,ring32;" \
    "R62:req0,reason4,error5,status6,replica8,ring10,start14,end22,prompt_tokens30,max_tokens38," \
    "first_text46,first_audio54;" \
    "V33:name0,reason1,error2,status3,stage5,replica7,req9,ring13,start17,end25;" \
    "M28:req0,stage4,replica6,t8,packet16,modality24"

enum { EV = 36, REQ_ROW = 62, VISIT_ROW = 33, EMIT = 28 };
/* conventions.Ev kinds, spanrows names and reasons, conventions.API_STAGE, MARK_MODALITY:
   compared with Python's at import (rowops.compiled, from reqstate) through CONSTANTS */
enum { K_ARRIVE = 10, K_DISPATCH = 11, K_FIRST_TEXT = 12, K_FIRST_AUDIO = 13, K_END = 14,
       K_PARSED = 15, K_PACKET_RECEIVED = 16, K_PACKET_RESUMED = 17, K_TRACE_HI = 18,
       K_TRACE_LO = 19, K_ADD = 20, K_SCHEDULE = 21, K_FINISH = 22 };
enum { N_STAGE = 1, N_QUEUE = 2 };
enum { R_NONE = 0, R_WRITER_DIED = 1, R_UNFINISHED = 3, R_TIMEOUT = 4 };
#define API_STAGE (-1)
#define MARK_MODALITY (-1)
#define CONSTANTS "ARRIVE=10,DISPATCH=11,FIRST_TEXT=12,FIRST_AUDIO=13,END=14,PARSED=15,PACKET_RECEIVED=16," \
    "PACKET_RESUMED=17,TRACE_HI=18,TRACE_LO=19,ADD=20,SCHEDULE=21,FINISH=22,N_STAGE=1,N_QUEUE=2,R_NONE=0," \
    "R_WRITER_DIED=1,R_UNFINISHED=3,R_TIMEOUT=4,API_STAGE=-1,MARK_MODALITY=-1"

#define GET(type, p, off) ({ type v_; memcpy(&v_, (p) + (off), sizeof v_); v_; })
#define PUT(type, p, off, val) do { type v_ = (type)(val); memcpy((p) + (off), &v_, sizeof v_); } while (0)

typedef struct { char *p; Py_ssize_t n, cap; } Bytes;   /* a growing byte buffer */

static int grow(Bytes *b, Py_ssize_t more) {
    if (b->n + more <= b->cap) return 0;
    /* doubling, from what the first append needs: a visit's packets are a few rows */
    Py_ssize_t cap = 2 * b->cap > b->n + more ? 2 * b->cap : b->n + more;
    char *p = PyMem_Realloc(b->p, cap);
    if (!p) { PyErr_NoMemory(); return -1; }
    b->p = p;
    b->cap = cap;
    return 0;
}

typedef struct {
    int64_t add, sched, finish, last, status;
    int32_t ring, next;                  /* next: the request's next visit (-1: none) */
    int16_t stage, replica;
    uint8_t has_add, has_sched, has_finish, queue_done, done;
    Bytes emits;                         /* EMIT rows held until the stage span is out */
} Visit;

typedef struct {
    int64_t req, arrive, end, first_text, first_audio, prompt, max_tokens, status, trace_hi;
    double last_seen, complete_at;
    int32_t ring, replica, unfinished;
    int32_t first_visit, last_visit;     /* the visits in the order they came */
    int32_t prev, next;                  /* the open requests in the order they came */
    uint8_t has_arrive, has_end, has_first_text, has_first_audio, has_trace_hi, done, has_complete;
    Bytes marks;                         /* (t, kind) int64 pairs of API marks */
} Req;

typedef struct {
    PyObject_HEAD
    int32_t *slot_of; Py_ssize_t n_ids;  /* request id -> its Req slot (-1: none open) */
    uint8_t *arrived; Py_ssize_t n_arrived;  /* ids whose REQUEST_ARRIVE was seen */
    Req *reqs; int32_t n_reqs, cap_reqs, free_req;  /* free slots chained through next */
    Visit *visits; int32_t n_visits, cap_visits, free_visit;
    int32_t head, tail;                  /* the open requests, oldest first */
    Py_ssize_t open;
    Bytes out_req, out_visit, out_emit;
} States;

/* ---------------------------------------------------------------------- slots */
/* A full pool of `size`-byte items (`*cap` of them) doubled, from `first`: the items, maybe
   moved (pointers into them go stale); NULL with MemoryError set. Freed slots are reused
   before the pool grows: each pool chains its own through the items' `next`. */
static void *grown(void *items, int32_t *cap, size_t size, int32_t first) {
    int32_t n = *cap ? 2 * *cap : first;
    void *p = PyMem_Realloc(items, (size_t)n * size);
    if (!p) return PyErr_NoMemory();
    *cap = n;
    return p;
}

static int ensure_ids(States *s, int64_t req) {
    if (req < s->n_ids) return 0;
    Py_ssize_t n = s->n_ids ? s->n_ids : 1024;
    while (n <= req) n *= 2;
    int32_t *p = PyMem_Realloc(s->slot_of, n * sizeof(int32_t));
    if (!p) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = s->n_ids; i < n; i++) p[i] = -1;
    s->slot_of = p;
    s->n_ids = n;
    return 0;
}

static Req *find(States *s, int64_t req) {
    if (req < 0 || req >= s->n_ids || s->slot_of[req] < 0) return NULL;
    return &s->reqs[s->slot_of[req]];
}

/* the request's state, made where it has none; NULL with an exception set (memory) */
static Req *state(States *s, int64_t req, double now) {
    Req *r = find(s, req);
    if (!r) {
        if (req < 0 || ensure_ids(s, req) < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "_reqc: a negative request id");
            return NULL;
        }
        int32_t i;
        if (s->free_req >= 0) {
            i = s->free_req;
            s->free_req = s->reqs[i].next;
        } else {
            Req *p = s->n_reqs < s->cap_reqs ? s->reqs : grown(s->reqs, &s->cap_reqs, sizeof(Req), 1024);
            if (!p) return NULL;
            s->reqs = p;
            i = s->n_reqs++;
        }
        r = &s->reqs[i];
        memset(r, 0, sizeof *r);
        r->req = req;
        r->prompt = r->max_tokens = -1;
        r->ring = -1;
        r->first_visit = r->last_visit = -1;
        r->prev = s->tail;
        r->next = -1;
        if (s->tail >= 0) s->reqs[s->tail].next = i; else s->head = i;
        s->tail = i;
        s->slot_of[req] = i;
        s->open++;
    }
    r->last_seen = now;
    r->has_complete = 0;
    return r;
}

static void free_req(States *s, Req *r) {
    int32_t i = (int32_t)(r - s->reqs);
    for (int32_t v = r->first_visit; v >= 0;) {
        Visit *g = &s->visits[v];
        int32_t next = g->next;
        PyMem_Free(g->emits.p);
        g->emits.p = NULL;
        g->next = s->free_visit;
        s->free_visit = v;
        v = next;
    }
    PyMem_Free(r->marks.p);
    r->marks.p = NULL;
    if (r->prev >= 0) s->reqs[r->prev].next = r->next; else s->head = r->next;
    if (r->next >= 0) s->reqs[r->next].prev = r->prev; else s->tail = r->prev;
    s->slot_of[r->req] = -1;
    r->next = s->free_req;
    s->free_req = i;
    s->open--;
}

/* the request's visit of (stage, replica), made where it has none; NULL: no memory. The
   visits pool may move: the caller's Req pointer stays good (another pool). */
static Visit *visit(States *s, Req *r, int16_t stage, int16_t replica, int32_t ring) {
    for (int32_t v = r->first_visit; v >= 0; v = s->visits[v].next)
        if (s->visits[v].stage == stage && s->visits[v].replica == replica) return &s->visits[v];
    int32_t i;
    if (s->free_visit >= 0) {
        i = s->free_visit;
        s->free_visit = s->visits[i].next;
    } else {
        Visit *p = s->n_visits < s->cap_visits ? s->visits : grown(s->visits, &s->cap_visits, sizeof(Visit), 4096);
        if (!p) return NULL;
        s->visits = p;
        i = s->n_visits++;
    }
    Visit *g = &s->visits[i];
    memset(g, 0, sizeof *g);
    g->stage = stage;
    g->replica = replica;
    g->ring = ring;
    g->next = -1;
    if (r->last_visit >= 0) s->visits[r->last_visit].next = i; else r->first_visit = i;
    r->last_visit = i;
    r->unfinished++;
    return g;
}

/* ---------------------------------------------------------------------- rows */
static int reason_of(int32_t ring, int reason, const uint8_t *dead, Py_ssize_t n_dead) {
    if (reason != R_NONE && dead && ring >= 0 && ring < n_dead && dead[ring]) return R_WRITER_DIED;
    return reason;
}

static int complete(const Req *r) {
    if (r->has_arrive || r->has_end) {
        if (!r->has_end) return 0;
    } else if (r->first_visit < 0) {
        return 0;
    }
    return r->unfinished == 0;
}

static int request_row(States *s, Req *r, int reason, const int64_t *last_t, Py_ssize_t n_last,
                       const uint8_t *dead, Py_ssize_t n_dead) {
    if (r->done || (!r->has_arrive && reason == R_NONE)) return 0;
    r->done = 1;
    int64_t last = r->req < n_last ? last_t[r->req] : 0;
    int64_t start = r->has_arrive ? r->arrive : (r->has_end && r->end ? r->end : last);
    int64_t end = r->has_end ? r->end : last;
    if (grow(&s->out_req, REQ_ROW) < 0) return -1;
    char *o = s->out_req.p + s->out_req.n;
    s->out_req.n += REQ_ROW;
    PUT(uint32_t, o, 0, r->req);
    PUT(int8_t, o, 4, reason_of(r->ring, reason, dead, n_dead));
    PUT(uint8_t, o, 5, r->status != 0);
    PUT(int16_t, o, 6, r->status);
    PUT(int16_t, o, 8, r->replica);
    PUT(int32_t, o, 10, r->ring);
    PUT(int64_t, o, 14, start);
    PUT(int64_t, o, 22, end > start ? end : start);
    PUT(int64_t, o, 30, r->prompt);
    PUT(int64_t, o, 38, r->max_tokens);
    PUT(int64_t, o, 46, r->has_first_text ? r->first_text : 0);
    PUT(int64_t, o, 54, r->has_first_audio ? r->first_audio : 0);
    Py_ssize_t marks = r->marks.n / 16;
    if (marks) {  /* API marks travel as emit rows of stage API_STAGE */
        if (grow(&s->out_emit, marks * EMIT) < 0) return -1;
        for (Py_ssize_t m = 0; m < marks; m++) {
            char *e = s->out_emit.p + s->out_emit.n;
            s->out_emit.n += EMIT;
            PUT(uint32_t, e, 0, r->req);
            PUT(int16_t, e, 4, API_STAGE);
            PUT(int16_t, e, 6, r->replica);
            PUT(int64_t, e, 8, GET(int64_t, r->marks.p, m * 16));
            PUT(int64_t, e, 16, GET(int64_t, r->marks.p, m * 16 + 8));
            PUT(int32_t, e, 24, MARK_MODALITY);
        }
        r->marks.n = 0;
    }
    return 0;
}

static int visit_row(States *s, int name, int reason, int64_t status, const Req *r, const Visit *g,
                     int64_t start, int64_t end, const uint8_t *dead, Py_ssize_t n_dead) {
    if (grow(&s->out_visit, VISIT_ROW) < 0) return -1;
    char *o = s->out_visit.p + s->out_visit.n;
    s->out_visit.n += VISIT_ROW;
    PUT(int8_t, o, 0, name);
    PUT(int8_t, o, 1, reason_of(g->ring, reason, dead, n_dead));
    PUT(uint8_t, o, 2, status != 0);
    PUT(int16_t, o, 3, status);
    PUT(int16_t, o, 5, g->stage);
    PUT(int16_t, o, 7, g->replica);
    PUT(uint32_t, o, 9, r->req);
    PUT(int32_t, o, 13, g->ring);
    PUT(int64_t, o, 17, start);
    PUT(int64_t, o, 25, end > start ? end : start);
    return 0;
}

static int queue_row(States *s, const Req *r, Visit *g, int reason, const uint8_t *dead, Py_ssize_t n_dead) {
    if (g->queue_done || (!g->has_add && (reason == R_NONE || !g->has_sched))) return 0;
    g->queue_done = 1;
    int64_t start = g->has_add ? g->add : g->sched;
    int64_t end = g->has_sched ? g->sched : g->last;
    return visit_row(s, N_QUEUE, reason, 0, r, g, start, end, dead, n_dead);
}

static int stage_row(States *s, const Req *r, Visit *g, int reason, const uint8_t *dead, Py_ssize_t n_dead) {
    if (g->done) return 0;
    g->done = 1;
    int64_t start = g->has_add ? g->add : (g->has_sched && g->sched ? g->sched : g->last);
    int64_t end = g->has_finish ? g->finish : g->last;
    if (visit_row(s, N_STAGE, reason, g->status, r, g, start, end, dead, n_dead) < 0) return -1;
    if (g->emits.n) {
        if (grow(&s->out_emit, g->emits.n) < 0) return -1;
        memcpy(s->out_emit.p + s->out_emit.n, g->emits.p, g->emits.n);
        s->out_emit.n += g->emits.n;
        PyMem_Free(g->emits.p);
        memset(&g->emits, 0, sizeof g->emits);
    }
    return 0;
}

/* ---------------------------------------------------------------------- events */
static int append(PyObject *list, PyObject *item) {
    if (!item) return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

static PyObject *found_list(PyObject *found, const char *name) {
    PyObject *l = PyObject_GetAttrString(found, name);
    if (l && !PyList_Check(l)) {
        PyErr_Format(PyExc_TypeError, "_reqc: found.%s is not a list", name);
        Py_CLEAR(l);
    }
    return l;
}

static int one_event(States *s, const char *e, const int64_t *reps, Py_ssize_t n_reps, double now,
                     const int64_t *last_t, Py_ssize_t n_last, PyObject **out) {
    int64_t t = GET(int64_t, e, 0), a = GET(int64_t, e, 8);
    int64_t req = GET(uint32_t, e, 16);
    int32_t chunk = GET(int32_t, e, 20), b = GET(int32_t, e, 28), ring = GET(int32_t, e, 32);
    int kind = GET(uint16_t, e, 24);
    int16_t stage = GET(int16_t, e, 26);
    if (ring < 0 || ring >= n_reps) {
        PyErr_Format(PyExc_IndexError, "_reqc: ring %d has no replica", (int)ring);
        return -1;
    }
    Req *r = state(s, req, now);
    if (!r) return -1;
    if (kind >= K_ADD) {
        int16_t replica = (int16_t)reps[ring];
        Visit *g = visit(s, r, stage, replica, ring);
        if (!g) return -1;
        if (t > g->last) g->last = t;
        if (kind == K_ADD) {
            if (!g->has_add) {
                g->add = t;
                g->has_add = 1;
                if (g->has_sched && queue_row(s, r, g, R_NONE, NULL, 0) < 0) return -1;
            }
        } else if (kind == K_SCHEDULE) {
            if (!g->has_sched) {
                g->sched = t;
                g->has_sched = 1;
                if (queue_row(s, r, g, R_NONE, NULL, 0) < 0) return -1;
            }
        } else if (kind == K_FINISH) {
            if (!g->has_finish) r->unfinished--;
            g->finish = t;
            g->has_finish = 1;
            g->status = a;
            if (stage_row(s, r, g, R_NONE, NULL, 0) < 0) return -1;
            if (r->unfinished == 0 && complete(r)) {
                r->complete_at = now;
                r->has_complete = 1;
            }
        }
        return 0;
    }
    r->ring = ring;
    r->replica = (int32_t)reps[ring];
    PyObject *latencies = out[0], *arrivals = out[1], *ends = out[2], *contexts = out[3], *repeated = out[4];
    switch (kind) {
    case K_ARRIVE:
        if (!r->has_arrive && append(arrivals, PyLong_FromLongLong(req)) < 0) return -1;
        if (req < s->n_arrived && s->arrived[req]) {
            if (append(repeated, PyLong_FromLongLong(req)) < 0) return -1;
        } else {
            if (req >= s->n_arrived) {
                Py_ssize_t n = s->n_arrived ? s->n_arrived : 1024;
                while (n <= req) n *= 2;
                uint8_t *p = PyMem_Realloc(s->arrived, n);
                if (!p) { PyErr_NoMemory(); return -1; }
                memset(p + s->n_arrived, 0, n - s->n_arrived);
                s->arrived = p;
                s->n_arrived = n;
            }
            s->arrived[req] = 1;
        }
        r->arrive = t;
        r->has_arrive = 1;
        r->prompt = a;
        r->max_tokens = b;
        break;
    case K_FIRST_TEXT:
    case K_FIRST_AUDIO: {
        uint8_t *has = kind == K_FIRST_TEXT ? &r->has_first_text : &r->has_first_audio;
        if (!*has) {
            *has = 1;
            if (kind == K_FIRST_TEXT) r->first_text = t; else r->first_audio = t;
            if (r->has_arrive && append(latencies, Py_BuildValue("(iLidL)", kind, (long long)req, (int)r->replica,
                                                                 (double)(t - r->arrive) / 1e9, (long long)t)) < 0)
                return -1;
        }
        break;
    }
    case K_TRACE_HI:
        r->trace_hi = a;
        r->has_trace_hi = 1;
        break;
    case K_TRACE_LO:
        if (r->has_trace_hi && append(contexts, Py_BuildValue("(LLLii)", (long long)req, (long long)r->trace_hi,
                                                              (long long)a, (int)chunk, (int)b)) < 0)
            return -1;
        break;
    case K_END:
        if (!r->has_end) {
            if (append(ends, Py_BuildValue("(LL)", (long long)req, (long long)a)) < 0) return -1;
            if (r->has_arrive && append(latencies, Py_BuildValue("(iLidL)", kind, (long long)req, (int)r->replica,
                                                                 (double)(t - r->arrive) / 1e9, (long long)t)) < 0)
                return -1;
        }
        r->end = t;
        r->has_end = 1;
        r->status = a;
        if (request_row(s, r, R_NONE, last_t, n_last, NULL, 0) < 0) return -1;
        if (complete(r)) {
            r->complete_at = now;
            r->has_complete = 1;
        }
        break;
    case K_DISPATCH:
    case K_PARSED:
    case K_PACKET_RECEIVED:
    case K_PACKET_RESUMED:
        if (grow(&r->marks, 16) < 0) return -1;
        PUT(int64_t, r->marks.p, r->marks.n, t);
        PUT(int64_t, r->marks.p, r->marks.n + 8, (int64_t)kind);
        r->marks.n += 16;
        break;
    default:
        break;
    }
    return 0;
}

static int get_buffer(PyObject *obj, Py_buffer *v, Py_ssize_t item, const char *name, int writable) {
    if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (v->len % item) {
        PyErr_Format(PyExc_ValueError, "_reqc: %s: %zd bytes is no whole number of %zd-byte items", name, v->len, item);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static PyObject *States_events(States *s, PyObject *args) {
    PyObject *evo, *repo, *lasto, *found;
    double now;
    if (!PyArg_ParseTuple(args, "OOdOO", &evo, &repo, &now, &lasto, &found)) return NULL;
    Py_buffer ev, reps, last;
    if (get_buffer(evo, &ev, EV, "ev", 0) < 0) return NULL;
    if (get_buffer(repo, &reps, 8, "replicas", 0) < 0) { PyBuffer_Release(&ev); return NULL; }
    if (get_buffer(lasto, &last, 8, "last_t", 0) < 0) { PyBuffer_Release(&ev); PyBuffer_Release(&reps); return NULL; }
    static const char *names[5] = {"latencies", "arrivals", "ends", "contexts", "repeated"};
    PyObject *out[5] = {0}, *res = NULL;
    for (int i = 0; i < 5; i++)
        if (!(out[i] = found_list(found, names[i]))) goto done;
    for (Py_ssize_t i = 0; i < ev.len / EV; i++)
        if (one_event(s, (const char *)ev.buf + i * EV, reps.buf, reps.len / 8, now, last.buf, last.len / 8, out) < 0)
            goto done;
    res = Py_NewRef(Py_None);
done:
    for (int i = 0; i < 5; i++) Py_XDECREF(out[i]);
    PyBuffer_Release(&ev); PyBuffer_Release(&reps); PyBuffer_Release(&last);
    return res;
}

static PyObject *States_emits(States *s, PyObject *args) {
    PyObject *rowso, *loo, *ringo;
    double now;
    if (!PyArg_ParseTuple(args, "OOOd", &rowso, &loo, &ringo, &now)) return NULL;
    Py_buffer rows, lo, ring;
    if (get_buffer(rowso, &rows, EMIT, "rows", 0) < 0) return NULL;
    if (get_buffer(loo, &lo, 8, "lo", 0) < 0) { PyBuffer_Release(&rows); return NULL; }
    if (get_buffer(ringo, &ring, 8, "ring", 0) < 0) { PyBuffer_Release(&rows); PyBuffer_Release(&lo); return NULL; }
    PyObject *res = NULL;
    Py_ssize_t n = rows.len / EMIT, groups = lo.len / 8;
    const int64_t *l = lo.buf, *rg = ring.buf;
    const char *p = rows.buf;
    if (ring.len / 8 != groups) {
        PyErr_SetString(PyExc_ValueError, "_reqc.emits: a ring per group");
        goto done;
    }
    for (Py_ssize_t k = 0; k < groups; k++) {
        Py_ssize_t i = l[k], j = k + 1 < groups ? l[k + 1] : n;
        if (i < 0 || j > n || i >= j) {
            PyErr_SetString(PyExc_ValueError, "_reqc.emits: group starts ascending within the rows");
            goto done;
        }
        const char *first = p + i * EMIT;
        Req *r = state(s, GET(uint32_t, first, 0), now);
        if (!r) goto done;
        Visit *g = visit(s, r, GET(int16_t, first, 4), GET(int16_t, first, 6), (int32_t)rg[k]);
        if (!g) goto done;
        for (Py_ssize_t m = i; m < j; m++) {
            int64_t t = GET(int64_t, p + m * EMIT, 8);
            if (t > g->last) g->last = t;
        }
        if (grow(&g->emits, (j - i) * EMIT) < 0) goto done;
        memcpy(g->emits.p + g->emits.n, first, (j - i) * EMIT);
        g->emits.n += (j - i) * EMIT;
    }
    res = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&rows); PyBuffer_Release(&lo); PyBuffer_Release(&ring);
    return res;
}

static PyObject *States_seen(States *s, PyObject *args) {
    PyObject *reqs;
    double now;
    if (!PyArg_ParseTuple(args, "Od", &reqs, &now)) return NULL;
    PyObject *seq = PySequence_Fast(reqs, "_reqc.seen: a sequence of request ids");
    if (!seq) return NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        long long req = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (req == -1 && PyErr_Occurred()) { Py_DECREF(seq); return NULL; }
        Req *r = find(s, req);
        if (!r) continue;
        r->last_seen = now;
        if (r->has_complete || r->has_end) {
            r->has_complete = (uint8_t)complete(r);
            if (r->has_complete) r->complete_at = now;
        }
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

static PyObject *States_expired(States *s, PyObject *args) {
    double now, grace, ended, idle;
    if (!PyArg_ParseTuple(args, "dddd", &now, &grace, &ended, &idle)) return NULL;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (int32_t i = s->head; i >= 0; i = s->reqs[i].next) {
        const Req *r = &s->reqs[i];
        int reason = -1;
        if (r->has_complete && now - r->complete_at >= grace) reason = R_UNFINISHED;
        else if (r->has_end && now - r->last_seen >= ended) reason = R_UNFINISHED;
        else if (now - r->last_seen >= idle) reason = R_TIMEOUT;
        if (reason >= 0 && append(out, Py_BuildValue("(Li)", (long long)r->req, reason)) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyObject *States_live(States *s, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (int32_t i = s->head; i >= 0; i = s->reqs[i].next)
        if (append(out, PyLong_FromLongLong(s->reqs[i].req)) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    return out;
}

static int flush_one(States *s, Req *r, int reason, const int64_t *last_t, Py_ssize_t n_last,
                     const uint8_t *dead, Py_ssize_t n_dead) {
    for (int32_t v = r->first_visit; v >= 0; v = s->visits[v].next) {
        Visit *g = &s->visits[v];
        if (!g->queue_done && queue_row(s, r, g, reason, dead, n_dead) < 0) return -1;
        if (stage_row(s, r, g, g->has_finish ? R_NONE : reason, dead, n_dead) < 0) return -1;
    }
    if (!r->done && (r->has_arrive || r->has_end)
        && request_row(s, r, r->has_end ? R_NONE : reason, last_t, n_last, dead, n_dead) < 0)
        return -1;
    return 0;
}

static PyObject *States_flush(States *s, PyObject *args) {
    PyObject *which, *lasto, *deado;
    if (!PyArg_ParseTuple(args, "OOO", &which, &lasto, &deado)) return NULL;
    Py_buffer last, dead;
    if (get_buffer(lasto, &last, 8, "last_t", 0) < 0) return NULL;
    if (get_buffer(deado, &dead, 1, "dead", 0) < 0) { PyBuffer_Release(&last); return NULL; }
    PyObject *seq = PySequence_Fast(which, "_reqc.flush: a sequence of (request, reason)"), *res = NULL;
    Py_ssize_t freed = 0;
    if (!seq) goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        long long req;
        int reason;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "Li", &req, &reason)) goto done;
        Req *r = find(s, req);
        if (!r) continue;
        freed++;
        int rc = flush_one(s, r, reason, last.buf, last.len / 8, dead.buf, dead.len);
        free_req(s, r);
        if (rc < 0) goto done;
    }
    res = PyLong_FromSsize_t(freed);
done:
    Py_XDECREF(seq);
    PyBuffer_Release(&last); PyBuffer_Release(&dead);
    return res;
}

static PyObject *take_bytes(Bytes *b) {
    PyObject *out = PyByteArray_FromStringAndSize(b->p ? b->p : "", b->n);
    if (out) b->n = 0;
    return out;
}

static PyObject *States_take(States *s, PyObject *unused) {
    PyObject *r = take_bytes(&s->out_req), *v = r ? take_bytes(&s->out_visit) : NULL;
    PyObject *e = v ? take_bytes(&s->out_emit) : NULL;
    if (!e) { Py_XDECREF(r); Py_XDECREF(v); return NULL; }
    return Py_BuildValue("(NNN)", r, v, e);
}

static Py_ssize_t States_len(States *s) { return s->open; }

static int States_contains(States *s, PyObject *key) {
    long long req = PyLong_AsLongLong(key);
    if (req == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return find(s, req) != NULL;
}

static int States_init(States *s, PyObject *args, PyObject *kw) {
    if (!PyArg_ParseTuple(args, ":States")) return -1;
    s->free_req = s->free_visit = s->head = s->tail = -1;
    return 0;
}

static void States_dealloc(States *s) {
    for (int32_t i = s->head; i >= 0;) {
        int32_t next = s->reqs[i].next;
        free_req(s, &s->reqs[i]);
        i = next;
    }
    PyMem_Free(s->slot_of); PyMem_Free(s->arrived); PyMem_Free(s->reqs); PyMem_Free(s->visits);
    PyMem_Free(s->out_req.p); PyMem_Free(s->out_visit.p); PyMem_Free(s->out_emit.p);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef States_methods[] = {
    {"events", (PyCFunction)States_events, METH_VARARGS, "Take a feed's request and stage events."},
    {"emits", (PyCFunction)States_emits, METH_VARARGS, "Take packets onto their visits."},
    {"seen", (PyCFunction)States_seen, METH_VARARGS, "Requests seen again."},
    {"expired", (PyCFunction)States_expired, METH_VARARGS, "(request, reason) of those to free."},
    {"live", (PyCFunction)States_live, METH_NOARGS, "The open requests, oldest first."},
    {"flush", (PyCFunction)States_flush, METH_VARARGS, "Put out what is open of these requests; forget them."},
    {"take", (PyCFunction)States_take, METH_NOARGS, "The rows put out since the last take."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods States_seq = {.sq_length = (lenfunc)States_len, .sq_contains = (objobjproc)States_contains};

static PyTypeObject StatesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "omnitrace._reqc.States",
    .tp_basicsize = sizeof(States),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The span builder's request and stage state (reqstate.RequestStates in C).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)States_init,
    .tp_dealloc = (destructor)States_dealloc,
    .tp_methods = States_methods,
    .tp_as_sequence = &States_seq,
};

static struct PyModuleDef reqc_module = {
    PyModuleDef_HEAD_INIT, "omnitrace._reqc",
    "The span builder's request and stage state in C (omnitrace.reqstate is the rule).", -1, NULL,
};

PyMODINIT_FUNC PyInit__reqc(void) {
    if (PyType_Ready(&StatesType) < 0) return NULL;
    PyObject *m = PyModule_Create(&reqc_module);
    if (!m) return NULL;
    if (PyModule_AddStringConstant(m, "LAYOUT", LAYOUT) < 0 || PyModule_AddStringConstant(m, "CONSTANTS", CONSTANTS) < 0
        || PyModule_AddObjectRef(m, "States", (PyObject *)&StatesType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
