/* Tarantool: the block loop and the row walk of walcore.tarantool.xlog, compiled.
 *
 * BlockScanner takes the blocks that continue a span as nearly every block does (a sound fixed header of any
 * msgpack width, a matching CRC-32C, a whole zstd frame, rows the reference walk accepts without a finding,
 * continuing each component's LSNs after a committed block) and stops at the first one that does not: the
 * reference loop (xlog._read_blocks) decides that block, findings and all. What it takes it adds to its span
 * exactly as xlog.merge_spans would. */
#include "scan.h"

#include <string.h>

enum {
    FIXHEADER_SIZE = 19,
    /* Components of one block and of one span; more (never seen: Tarantool has 32) go to the reference walk. */
    BLOCK_COMPONENTS = 32,
    SPAN_COMPONENTS = 64,
    /* Nesting beyond this goes to the reference walk (msgpack's own unpacker allows about 1000). */
    MAX_DEPTH = 64,
};
#define MAX_BLOCK_SIZE (UINT64_C(1) << 31)
#define NOP 12

/* Header keys (box/iproto_constants.h). */
enum { KEY_TYPE = 0x00, KEY_REPLICA_ID = 0x02, KEY_LSN = 0x03, KEY_GROUP_ID = 0x07, KEY_TSN = 0x08, KEY_FLAGS = 0x09 };

/* What take() tells the caller about the block where it stopped. */
enum { STOP_REFERENCE = 0, STOP_LIMIT = -1 };

typedef struct {
    uint64_t comp, first, last, lo, hi;
} Range;

typedef struct {
    Range range[BLOCK_COMPONENTS];
    int n;
    uint64_t rows;
    int last_commit;
} RowSummary;

static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* ------------------------------------------------------------------ msgpack, bounds-checked */

/* An integer of any encoding at *pp (as Python's msgpack reads it: an int, never a bool or float).
 * 1 and the value (negative: *neg set, *u its two's complement), or 0 when it is not an int or is cut off. */
static int read_int(const unsigned char **pp, const unsigned char *end, int *neg, uint64_t *u)
{
    const unsigned char *p = *pp;
    if (p >= end)
        return 0;
    unsigned char b = *p;
    if (b < 0x80 || b >= 0xe0) {
        *neg = b >= 0xe0;
        *u = b >= 0xe0 ? (uint64_t)(int64_t)(int8_t)b : b;
        *pp = p + 1;
        return 1;
    }
    int width, is_signed;
    switch (b) {
    case 0xcc: width = 1, is_signed = 0; break;
    case 0xcd: width = 2, is_signed = 0; break;
    case 0xce: width = 4, is_signed = 0; break;
    case 0xcf: width = 8, is_signed = 0; break;
    case 0xd0: width = 1, is_signed = 1; break;
    case 0xd1: width = 2, is_signed = 1; break;
    case 0xd2: width = 4, is_signed = 1; break;
    case 0xd3: width = 8, is_signed = 1; break;
    default: return 0;
    }
    if (end - p - 1 < width)
        return 0;
    uint64_t v = be(p + 1, width);
    if (is_signed && width < 8 && (v >> (8 * width - 1)))
        v |= ~UINT64_C(0) << (8 * width); /* sign-extend */
    *neg = is_signed && (v >> 63);
    *u = v;
    *pp = p + 1 + width;
    return 1;
}

static int is_container(unsigned char b)
{
    return (b >= 0x80 && b <= 0x9f) || (b >= 0xdc && b <= 0xdf);
}

/* Skip one msgpack object that Python's msgpack unpacks without error (raw, use_list=False,
 * strict_map_key=False). 0 at anything it might reject, or that this walk does not follow: the reserved
 * byte 0xc1, a cut-off object, ext type -1 (msgpack's Timestamp, which checks its data), a container as a
 * map key (a dict key must be hashable), nesting deeper than MAX_DEPTH. */
static int skip_object(const unsigned char **pp, const unsigned char *end, int depth)
{
    const unsigned char *p = *pp;
    if (p >= end)
        return 0;
    unsigned char b = *p++;
    size_t left = (size_t)(end - p);
    uint64_t n;
    if (b < 0x80 || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        *pp = p;
        return 1;
    }
    if (b <= 0x8f) {
        n = b & 0x0f;
        goto map;
    }
    if (b <= 0x9f) {
        n = b & 0x0f;
        goto array;
    }
    if (b <= 0xbf) {
        n = b & 0x1f;
        goto data;
    }
    switch (b) {
    case 0xc4: case 0xd9: /* bin 8, str 8 */
        if (left < 1) return 0;
        n = p[0], p += 1, left -= 1;
        goto data;
    case 0xc5: case 0xda:
        if (left < 2) return 0;
        n = be(p, 2), p += 2, left -= 2;
        goto data;
    case 0xc6: case 0xdb:
        if (left < 4) return 0;
        n = be(p, 4), p += 4, left -= 4;
        goto data;
    case 0xc7: case 0xc8: case 0xc9: { /* ext 8/16/32: length, then the type byte */
        int width = b == 0xc7 ? 1 : b == 0xc8 ? 2 : 4;
        if (left < (size_t)width + 1) return 0;
        n = be(p, width);
        if (p[width] & 0x80) return 0; /* a negative type: msgpack's ExtType takes 0..127, -1 is its Timestamp */
        p += width + 1, left -= width + 1;
        goto data;
    }
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: /* fixext 1..16: the type byte, then the data */
        if (left < 1 || (p[0] & 0x80)) return 0;
        n = (uint64_t)1 << (b - 0xd4);
        p += 1, left -= 1;
        goto data;
    case 0xca: n = 4; goto data;
    case 0xcb: case 0xcf: case 0xd3: n = 8; goto data;
    case 0xcc: case 0xd0: n = 1; goto data;
    case 0xcd: case 0xd1: n = 2; goto data;
    case 0xce: case 0xd2: n = 4; goto data;
    case 0xdc: case 0xde:
        if (left < 2) return 0;
        n = be(p, 2), p += 2;
        goto container;
    case 0xdd: case 0xdf:
        if (left < 4) return 0;
        n = be(p, 4), p += 4;
        goto container;
    default: /* 0xc1 */
        return 0;
    }
data:
    if (n > left)
        return 0;
    *pp = p + n;
    return 1;
container:
    if (b == 0xdc || b == 0xdd)
        goto array;
map:
    if (depth >= MAX_DEPTH || n > (size_t)(end - p) / 2)
        return 0;
    for (uint64_t i = 0; i < n; i++) {
        if (p >= end || is_container(*p) || !skip_object(&p, end, depth + 1) || !skip_object(&p, end, depth + 1))
            return 0;
    }
    *pp = p;
    return 1;
array:
    if (depth >= MAX_DEPTH || n > (size_t)(end - p))
        return 0;
    for (uint64_t i = 0; i < n; i++)
        if (!skip_object(&p, end, depth + 1))
            return 0;
    *pp = p;
    return 1;
}

/* ------------------------------------------------------------------ rows */

typedef struct {
    int is_nop;
    unsigned seen; /* bit per known key */
    uint64_t replica_id, lsn, tsn, flags;
} Header;

/* A row header as row._check_header accepts it, without a finding; 0 at anything else (and at a known key
 * given twice: Python keeps the last, this walk does not follow). */
static int read_header(const unsigned char **pp, const unsigned char *end, int xlog, Header *h)
{
    const unsigned char *p = *pp;
    if (p >= end)
        return 0;
    uint64_t n;
    unsigned char b = *p++;
    if (b >= 0x80 && b <= 0x8f) {
        n = b & 0x0f;
    } else if (b == 0xde && end - p >= 2) {
        n = be(p, 2), p += 2;
    } else if (b == 0xdf && end - p >= 4) {
        n = be(p, 4), p += 4;
    } else {
        return 0;
    }
    if (n > (size_t)(end - p) / 2)
        return 0;
    h->seen = 0;
    h->is_nop = 0;
    h->replica_id = h->lsn = h->tsn = h->flags = 0;
    for (uint64_t i = 0; i < n; i++) {
        int neg;
        uint64_t key;
        if (!read_int(&p, end, &neg, &key))
            return 0; /* a key that is not an int (a bool or float can equal one in Python) */
        if (neg || key > KEY_FLAGS || !((1u << key) & (1u << KEY_TYPE | 1u << KEY_REPLICA_ID | 1u << KEY_LSN |
                                                         1u << KEY_GROUP_ID | 1u << KEY_TSN | 1u << KEY_FLAGS))) {
            if (!skip_object(&p, end, 1))
                return 0;
            continue;
        }
        if (h->seen & (1u << key))
            return 0;
        h->seen |= 1u << key;
        int value_neg;
        uint64_t value;
        if (!read_int(&p, end, &value_neg, &value))
            return 0;
        if (key == KEY_TYPE) {
            h->is_nop = !value_neg && value == NOP;
            continue;
        }
        if (value_neg)
            return 0;
        if (key == KEY_REPLICA_ID)
            h->replica_id = value;
        else if (key == KEY_LSN)
            h->lsn = value;
        else if (key == KEY_TSN)
            h->tsn = value;
        else if (key == KEY_FLAGS)
            h->flags = value;
    }
    if (!(h->seen & (1u << KEY_TYPE)))
        return 0;
    if (xlog && h->lsn == 0)
        return 0;
    *pp = p;
    return 1;
}

/* The rows of one block, as row.summarize_rows sums them up when it finds nothing wrong; 0 when it would
 * find something, or might. */
static int walk_rows(const unsigned char *p, size_t len, int xlog, RowSummary *s)
{
    const unsigned char *end = p + len;
    s->n = 0;
    s->rows = 0;
    s->last_commit = 1;
    while (p < end) {
        Header h;
        if (!read_header(&p, end, xlog, &h))
            return 0;
        if (!h.is_nop && p < end && !skip_object(&p, end, 0))
            return 0;
        s->rows++;
        uint64_t comp = h.replica_id, lsn = h.lsn;
        Range *r = NULL;
        for (int i = 0; i < s->n; i++)
            if (s->range[i].comp == comp) {
                r = &s->range[i];
                break;
            }
        if (r == NULL) {
            if (s->n == BLOCK_COMPONENTS)
                return 0;
            r = &s->range[s->n++];
            *r = (Range){comp, lsn, lsn, lsn, lsn};
        } else {
            if (xlog && lsn != r->last + 1) /* also when last + 1 wraps: an xlog lsn is never 0 */
                return 0;
            r->last = lsn;
            if (lsn < r->lo)
                r->lo = lsn;
            if (lsn > r->hi)
                r->hi = lsn;
        }
        s->last_commit = !(h.seen & (1u << KEY_TSN)) || (h.flags & 1);
    }
    return 1;
}

/* ------------------------------------------------------------------ blocks */

/* block.parse_fixheader: 1 with the payload's length and CRC when the 19 bytes are a sound row or zstd block
 * header; 0 at anything else (the EOF marker included). */
static int parse_fixheader(const unsigned char *h, int *compressed, uint64_t *length, uint64_t *crc)
{
    if (h[0] != 0xd5 || h[1] != 0xba || h[2] != 0x0b || (h[3] != 0xab && h[3] != 0xba))
        return 0;
    *compressed = h[3] == 0xba;
    uint64_t field[3];
    int pos = 4;
    for (int i = 0; i < 3; i++) { /* len, crc32p (unused), crc32c: unsigned ints of any width */
        unsigned char b = h[pos];
        int width = b < 0x80 ? 0 : b == 0xcc ? 1 : b == 0xcd ? 2 : b == 0xce ? 4 : b == 0xcf ? 8 : -1;
        if (width < 0 || pos + 1 + width > FIXHEADER_SIZE)
            return 0;
        field[i] = width ? be(h + pos + 1, width) : b;
        pos += 1 + width;
        if (pos >= FIXHEADER_SIZE && i < 2)
            return 0;
    }
    if (pos < FIXHEADER_SIZE) { /* padding: one msgpack string reaching exactly the end of the header */
        unsigned char b = h[pos];
        int pad_end;
        if (b >= 0xa0 && b <= 0xbf)
            pad_end = pos + 1 + (b & 0x1f);
        else if (b == 0xd9 && pos + 1 < FIXHEADER_SIZE)
            pad_end = pos + 2 + h[pos + 1];
        else
            return 0;
        if (pad_end != FIXHEADER_SIZE)
            return 0;
    }
    if (field[2] > 0xFFFFFFFFu || field[0] == 0 || field[0] > MAX_BLOCK_SIZE)
        return 0;
    *length = field[0];
    *crc = field[2];
    return 1;
}

typedef struct {
    PyObject_HEAD
    int xlog;
    PyObject *decompress; /* block.decompress: zstd frames go to the zstandard module */
    /* The span (xlog.Span), as far as take() needs and changes it. */
    Range range[SPAN_COMPONENTS];
    int n;
    int last_commit, has_blocks;
    uint64_t rows, blocks, zstd_blocks;
    long long first_pos, last_block_pos; /* -1: none */
} BlockScanner;

/* Add a block's rows to the span as merge_spans does; 0 (the span unchanged) when merge_spans would find
 * something: a link to the previous block that is out of LSN order. */
static int merge(BlockScanner *self, const RowSummary *s)
{
    int new_comps = 0;
    Range *found[BLOCK_COMPONENTS];
    for (int i = 0; i < s->n; i++) {
        found[i] = NULL;
        for (int j = 0; j < self->n; j++)
            if (self->range[j].comp == s->range[i].comp) {
                found[i] = &self->range[j];
                break;
            }
        if (found[i] == NULL)
            new_comps++;
        else if (self->xlog && s->range[i].first != found[i]->last + 1)
            return 0;
    }
    if (self->n + new_comps > SPAN_COMPONENTS)
        return 0;
    for (int i = 0; i < s->n; i++) {
        const Range *b = &s->range[i];
        Range *a = found[i];
        if (a == NULL) {
            self->range[self->n++] = *b;
            continue;
        }
        a->last = b->last;
        if (b->lo < a->lo)
            a->lo = b->lo;
        if (b->hi > a->hi)
            a->hi = b->hi;
    }
    return 1;
}

/* The rows of a zstd block, through block.decompress; -1 on a Python error it does not own, 0 when the
 * reference must decide (a BlockError: the frame is damaged), 1 with the summary. `whole` is a memoryview of
 * the buffer take() walks; the payload goes out as a slice of it, which holds the buffer as long as anyone
 * keeps it (a view of raw memory would outlive the buffer in a callback that kept it). */
static int walk_compressed(BlockScanner *self, PyObject *whole, Py_ssize_t start, Py_ssize_t length, RowSummary *s)
{
    PyObject *payload = PySequence_GetSlice(whole, start, start + length);
    if (payload == NULL)
        return -1;
    PyObject *rows = PyObject_CallOneArg(self->decompress, payload);
    Py_DECREF(payload);
    if (rows == NULL) {
        if (PyErr_ExceptionMatches(PyExc_ValueError)) { /* BlockError: the reference finds it again */
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    if (!PyBytes_Check(rows)) {
        Py_DECREF(rows);
        PyErr_SetString(PyExc_TypeError, "decompress must return bytes");
        return -1;
    }
    int ok = walk_rows((const unsigned char *)PyBytes_AS_STRING(rows), (size_t)PyBytes_GET_SIZE(rows), self->xlog, s);
    Py_DECREF(rows);
    return ok;
}

static int scanner_init(BlockScanner *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"xlog", "decompress", NULL};
    int xlog;
    PyObject *decompress;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "pO:BlockScanner", kwlist, &xlog, &decompress))
        return -1;
    if (!PyCallable_Check(decompress)) {
        PyErr_SetString(PyExc_TypeError, "decompress must be callable");
        return -1;
    }
    self->xlog = xlog;
    Py_INCREF(decompress);
    Py_XSETREF(self->decompress, decompress);
    self->n = 0;
    return 0;
}

static void scanner_dealloc(BlockScanner *self)
{
    Py_XDECREF(self->decompress);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* 1 with the value; 0 (no error set) when it is no uint64 (a negative lsn the reference let through): the span
 * is then the reference's to continue; -1 on another error. */
static int as_u64(PyObject *item, uint64_t *out)
{
    *out = PyLong_AsUnsignedLongLong(item);
    if (!(*out == (uint64_t)-1 && PyErr_Occurred()))
        return 1;
    if (!PyErr_ExceptionMatches(PyExc_OverflowError))
        return -1;
    PyErr_Clear();
    return 0;
}

/* begin(lsns, last_commit, has_blocks): load the span's state. False (nothing loaded) when it has more
 * components than this walk keeps. */
static PyObject *scanner_begin(BlockScanner *self, PyObject *args)
{
    PyObject *lsns;
    int last_commit, has_blocks;
    if (!PyArg_ParseTuple(args, "O!pp", &PyDict_Type, &lsns, &last_commit, &has_blocks))
        return NULL;
    if (PyDict_GET_SIZE(lsns) > SPAN_COMPONENTS)
        Py_RETURN_FALSE;
    Py_ssize_t i = 0;
    PyObject *key, *value;
    int n = 0;
    while (PyDict_Next(lsns, &i, &key, &value)) {
        if (n == SPAN_COMPONENTS) /* the dict grew while its keys were read (an int subclass's __index__) */
            Py_RETURN_FALSE;
        Range *r = &self->range[n++];
        if (!PyList_Check(value) || PyList_GET_SIZE(value) != 4) {
            PyErr_SetString(PyExc_TypeError, "a span's LSNs are [first, last, min, max] lists");
            return NULL;
        }
        uint64_t *field[5] = {&r->comp, &r->first, &r->last, &r->lo, &r->hi};
        int ok = 1;
        for (int k = 0; k < 5 && ok > 0; k++)
            ok = as_u64(k ? PyList_GET_ITEM(value, k - 1) : key, field[k]);
        if (ok < 0)
            return NULL;
        if (ok == 0)
            Py_RETURN_FALSE;
    }
    self->n = n;
    self->last_commit = last_commit;
    self->has_blocks = has_blocks;
    self->rows = self->blocks = self->zstd_blocks = 0;
    self->first_pos = self->last_block_pos = -1;
    Py_RETURN_TRUE;
}

/* take(buffer, base, limit, size) -> (taken, need): walk the blocks of `buffer` (the file's bytes from
 * offset `base`) that start before buffer offset `limit`, in a file of `size` bytes. `taken` bytes were
 * taken; need > 0: the block there needs that many bytes in the buffer; need 0: the reference loop decides
 * that block; need -1: `limit` was reached. */
static PyObject *scanner_take(BlockScanner *self, PyObject *args)
{
    Py_buffer view;
    long long base, limit, size;
    if (self->decompress == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "BlockScanner.__init__ was not called");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*LLL", &view, &base, &limit, &size))
        return NULL;
    if (base < 0 || limit < 0 || size < base) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "take: need 0 <= base <= size and 0 <= limit");
        return NULL;
    }
    const unsigned char *buf = view.buf;
    long long len = view.len, off = 0, need = STOP_LIMIT;
    PyObject *whole = NULL; /* a memoryview of the buffer, made at the first zstd block */
    if (limit > len)
        limit = len;
    while (off < limit) {
        long long left = len - off;
        if (self->xlog && self->has_blocks && !self->last_commit) { /* merge_spans: unterminated_transaction */
            need = STOP_REFERENCE;
            break;
        }
        if ((uint64_t)base + (uint64_t)off + FIXHEADER_SIZE > (uint64_t)size) { /* EOF marker, or a cut header */
            need = STOP_REFERENCE;
            break;
        }
        if (left < FIXHEADER_SIZE) {
            need = FIXHEADER_SIZE;
            break;
        }
        int compressed;
        uint64_t length, crc;
        if (!parse_fixheader(buf + off, &compressed, &length, &crc) ||
            (uint64_t)base + (uint64_t)off + FIXHEADER_SIZE + length > (uint64_t)size) {
            need = STOP_REFERENCE;
            break;
        }
        if ((uint64_t)left < FIXHEADER_SIZE + length) {
            need = FIXHEADER_SIZE + (long long)length;
            break;
        }
        const unsigned char *payload = buf + off + FIXHEADER_SIZE;
        if (scan_crc32c(0, payload, (size_t)length) != crc) {
            need = STOP_REFERENCE;
            break;
        }
        RowSummary s;
        int ok;
        if (compressed) {
            if (whole == NULL && (whole = PyMemoryView_FromObject(view.obj)) == NULL) {
                ok = -1;
            } else {
                ok = walk_compressed(self, whole, (Py_ssize_t)(off + FIXHEADER_SIZE), (Py_ssize_t)length, &s);
            }
        } else {
            ok = walk_rows(payload, (size_t)length, self->xlog, &s);
        }
        if (ok < 0) {
            Py_XDECREF(whole);
            PyBuffer_Release(&view);
            return NULL;
        }
        if (!ok || !merge(self, &s)) {
            need = STOP_REFERENCE;
            break;
        }
        self->rows += s.rows;
        self->blocks++;
        self->zstd_blocks += compressed;
        self->last_commit = s.last_commit;
        self->has_blocks = 1;
        if (self->first_pos < 0)
            self->first_pos = base + off;
        self->last_block_pos = base + off;
        off += FIXHEADER_SIZE + (long long)length;
    }
    Py_XDECREF(whole);
    PyBuffer_Release(&view);
    return Py_BuildValue("LL", off, need);
}

/* end() -> (lsns, last_commit, rows, blocks, zstd_blocks, first_pos, last_block_pos): what take() added; lsns
 * is every component's (comp, first, last, min, max) in span order; a position is None when no block was
 * taken. */
static PyObject *scanner_end(BlockScanner *self, PyObject *unused)
{
    PyObject *ranges = PyList_New(self->n);
    if (ranges == NULL)
        return NULL;
    for (int i = 0; i < self->n; i++) {
        const Range *r = &self->range[i];
        PyObject *item = Py_BuildValue("(KKKKK)", r->comp, r->first, r->last, r->lo, r->hi);
        if (item == NULL) {
            Py_DECREF(ranges);
            return NULL;
        }
        PyList_SET_ITEM(ranges, i, item);
    }
    PyObject *first = self->first_pos < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(self->first_pos);
    PyObject *last = self->last_block_pos < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(self->last_block_pos);
    return Py_BuildValue("(NOKKKNN)", ranges, self->last_commit ? Py_True : Py_False, self->rows, self->blocks,
                         self->zstd_blocks, first, last);
}

static PyMethodDef scanner_methods[] = {
    {"begin", (PyCFunction)scanner_begin, METH_VARARGS, "begin(lsns, last_commit, has_blocks) -> bool"},
    {"take", (PyCFunction)scanner_take, METH_VARARGS, "take(buffer, base, limit, size) -> (taken, need)"},
    {"end", (PyCFunction)scanner_end, METH_NOARGS,
     "end() -> (lsns, last_commit, rows, blocks, zstd_blocks, first_pos, last_block_pos)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BlockScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "walcore._scan.BlockScanner",
    .tp_doc = "BlockScanner(xlog, decompress): the compiled block loop and row walk of one Tarantool file.",
    .tp_basicsize = sizeof(BlockScanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)scanner_init,
    .tp_dealloc = (destructor)scanner_dealloc,
    .tp_methods = scanner_methods,
};

int tarantool_add_types(PyObject *module)
{
    if (PyType_Ready(&BlockScannerType) < 0)
        return -1;
    Py_INCREF(&BlockScannerType);
    if (PyModule_AddObject(module, "BlockScanner", (PyObject *)&BlockScannerType) < 0) {
        Py_DECREF(&BlockScannerType);
        return -1;
    }
    return 0;
}
