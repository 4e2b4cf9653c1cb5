/* limestone: the pwal entry walk, the compiled twin of walcore.limestone.scan._scan_fast (see there).
 *
 * limestone_scan(fd, data, base, size, durable_epoch, state)
 *   fd: the pwal file, open for reading (a put_blob's id count past `data` is read with pread)
 *   data: a buffer of the file's bytes from file offset `base`; size: the file's size
 *   durable_epoch: the directory's durable epoch (an int)
 *   state: None at the start of the file, then the `state` returned by the previous call
 * returns None where _scan_fast gives way to the exact walk (a short, unknown or misplaced entry, a
 * durable-epoch record, a durable snippet left without end marker although the file has them), else
 *   (at, state, entries, counts, (durable, canceled), epochs, nondurable, blob_puts):
 *   at: the file offset of the next entry to walk, from which to pass the next buffer (== size: done; it
 *       may lie past `data`, when a value runs past it: skipped unread); always > base unless base == size
 *   entries: entries walked; counts: 11 ints, per entry type the data entries in durable snippets;
 *   (durable, canceled): snippet headers of each kind; epochs: (lowest, highest) header epoch, or None;
 *   nondurable: [(offset, epoch)] of the headers past the durable epoch, in file order;
 *   blob_puts: [(offset, ids_at, count)] of the put_blob entries in durable snippets, in file order: the
 *       entry's offset and where its `count` u64 blob ids are in the file, for the caller to check.
 * Every length is checked against the file's size before the walk moves on, and against the buffer before
 * a byte is read from it; offsets are uint64 (a file's size is below 2^63, lengths below 2^35). */
#include "scan.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

enum { PUT = 1, SNIPPET_HEADER = 2, SNIPPET_END = 3, REMOVE = 5, CANCELED_HEADER = 6, CLEAR_STORAGE = 7,
       ADD_STORAGE = 8, REMOVE_STORAGE = 9, PUT_BLOB = 10, TYPES = 11 };

/* The walk's state between calls: in a durable snippet (_scan_fast's `valid`), where a snippet header must
 * come (`first`), end markers seen in this file (`markers_seen`). */
enum { VALID = 1, FIRST = 2, MARKERS = 4, START = VALID | FIRST };

enum step { MORE, GIVE_UP, FAILED }; /* why the walk of a buffer stopped */

struct walk {
    int fd;
    const unsigned char *data;
    uint64_t base, len, size, durable_epoch;
    long state;
    uint64_t at; /* file offset of the next entry */
    uint64_t entries, counts[TYPES], durable, canceled, lo, hi;
    int have_epochs;
    PyObject *nondurable, *blob_puts; /* lists, owned by limestone_scan */
};

/* The unsigned little-endian integer of the n (4 or 8) bytes at p, which need not be aligned. */
static uint64_t load_le(const unsigned char *p, size_t n)
{
    uint64_t v = 0;
    memcpy(&v, p, n);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v) >> (64 - 8 * n);
#endif
    return v;
}

/* Bytes of an entry needed to know its length (what _scan_fast checks before reading on); 0: not an entry
 * _scan_fast walks. */
static uint64_t fixed_size(unsigned kind)
{
    switch (kind) {
    case PUT: case PUT_BLOB: return 17; /* type, key_len, value_len, storage_id */
    case REMOVE: return 5;              /* type, key_len */
    case SNIPPET_HEADER: case CANCELED_HEADER: return 9;
    case SNIPPET_END: return 10;
    case CLEAR_STORAGE: case ADD_STORAGE: case REMOVE_STORAGE: return 25; /* type, storage_id, write version */
    default: return 0; /* unknown, or a durable-epoch record (4) */
    }
}

/* Appends a tuple built from `format` to `list`; -1 with an exception set on failure. */
static int append(PyObject *list, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    PyObject *item = Py_VaBuildValue(format, args);
    va_end(args);
    if (item == NULL)
        return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

/* The put_blob id count (u32) at file offset `at`: from the buffer, else read from the file (the value
 * before it ran past the buffer). 1: read; 0: the file ends first; -1: an OS error (exception set). */
static int blob_count(struct walk *w, uint64_t at, uint32_t *count)
{
    if (at + 4 <= w->base + w->len) {
        *count = (uint32_t)load_le(w->data + (at - w->base), 4);
        return 1;
    }
    unsigned char bytes[4];
    size_t got = 0;
    while (got < sizeof bytes) {
        ssize_t n = pread(w->fd, bytes + got, sizeof bytes - got, (off_t)(at + got));
        if (n < 0 && errno == EINTR) {
            if (PyErr_CheckSignals() < 0)
                return -1;
            continue;
        }
        if (n < 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        if (n == 0)
            return 0;
        got += (size_t)n;
    }
    *count = (uint32_t)load_le(bytes, 4);
    return 1;
}

/* Walks the entries from w->at while they are in the buffer; w->at is left at the first one not walked. */
static enum step walk_buffer(struct walk *w)
{
    while (w->at < w->size) {
        uint64_t i = w->at - w->base;
        if (i >= w->len)
            return MORE; /* the walk skipped past the buffer */
        const unsigned char *e = w->data + i;
        unsigned kind = e[0];
        uint64_t fixed = fixed_size(kind);
        if (fixed == 0 || w->size - w->at < fixed)
            return GIVE_UP; /* not an entry, or one cut off by the end of the file */
        if (w->len - i < fixed)
            return MORE; /* it runs past the buffer: the caller passes the bytes from w->at */
        uint64_t end;
        if (kind == SNIPPET_HEADER || kind == CANCELED_HEADER) {
            if ((w->state & START) == VALID && (w->state & MARKERS))
                return GIVE_UP; /* a durable snippet left unclosed in a file whose snippets have end markers */
            uint64_t epoch = load_le(e + 1, 8);
            if (!w->have_epochs) {
                w->lo = w->hi = epoch;
                w->have_epochs = 1;
            } else if (epoch > w->hi) {
                w->hi = epoch;
            } else if (epoch < w->lo) {
                w->lo = epoch;
            }
            if (kind == CANCELED_HEADER) {
                w->state &= ~VALID;
                w->canceled++;
            } else if (epoch <= w->durable_epoch) {
                w->state |= VALID;
                w->durable++;
            } else {
                w->state &= ~VALID;
                if (append(w->nondurable, "(KK)", (unsigned long long)w->at, (unsigned long long)epoch) < 0)
                    return FAILED;
            }
            w->state &= ~FIRST;
            end = w->at + 9;
        } else if (kind == SNIPPET_END) {
            if (w->state & FIRST)
                return GIVE_UP;
            w->state = FIRST | MARKERS;
            end = w->at + 10;
        } else {
            if (w->state & FIRST)
                return GIVE_UP; /* a data entry where a snippet header must come */
            if (kind == PUT || kind == PUT_BLOB)
                end = w->at + 33 + load_le(e + 1, 4) + load_le(e + 5, 4); /* + key, write version, value */
            else if (kind == REMOVE)
                end = w->at + 29 + load_le(e + 1, 4); /* + storage id, key, write version */
            else
                end = w->at + 25;
            uint64_t ids_at = 0;
            uint32_t count = 0;
            if (kind == PUT_BLOB) { /* then the count of blob ids, and the ids */
                if (end + 4 > w->size)
                    return GIVE_UP;
                int found = blob_count(w, end, &count);
                if (found <= 0)
                    return found < 0 ? FAILED : GIVE_UP;
                ids_at = end + 4;
                end = ids_at + 8 * (uint64_t)count;
            }
            if (end > w->size)
                return GIVE_UP;
            if (w->state & VALID) {
                w->counts[kind]++;
                if (kind == PUT_BLOB && append(w->blob_puts, "(KKk)", (unsigned long long)w->at,
                                               (unsigned long long)ids_at, (unsigned long)count) < 0)
                    return FAILED;
            }
        }
        w->entries++;
        w->at = end;
    }
    /* The end of the file. */
    if ((w->state & START) == VALID && (w->state & MARKERS))
        return GIVE_UP; /* the last durable snippet has no end marker */
    return MORE;
}

/* limestone_scan's tuple for a walk that went well; NULL with an exception set. */
static PyObject *walk_result(const struct walk *w)
{
    PyObject *counts = PyTuple_New(TYPES);
    if (counts == NULL)
        return NULL;
    for (Py_ssize_t t = 0; t < TYPES; t++) {
        PyObject *n = PyLong_FromUnsignedLongLong(w->counts[t]);
        if (n == NULL) {
            Py_DECREF(counts);
            return NULL;
        }
        PyTuple_SET_ITEM(counts, t, n);
    }
    PyObject *epochs = w->have_epochs ? Py_BuildValue("(KK)", (unsigned long long)w->lo, (unsigned long long)w->hi)
                                      : Py_NewRef(Py_None);
    if (epochs == NULL) {
        Py_DECREF(counts);
        return NULL;
    }
    /* N: the tuple takes over counts and epochs (and releases them if it cannot be built) */
    return Py_BuildValue("(KlKN(KK)NOO)", (unsigned long long)w->at, w->state, (unsigned long long)w->entries,
                         counts, (unsigned long long)w->durable, (unsigned long long)w->canceled, epochs,
                         w->nondurable, w->blob_puts);
}

/* limestone_scan once its buffer and lists are in w: checks the other arguments, walks, and says what it found. */
static PyObject *run_walk(struct walk *w, long long base, long long size, PyObject *durable_epoch, PyObject *state)
{
    if (base < 0 || size < base) {
        PyErr_SetString(PyExc_ValueError, "limestone_scan: need 0 <= base <= size");
        return NULL;
    }
    w->base = w->at = (uint64_t)base;
    w->size = (uint64_t)size;
    w->state = START;
    if (state != Py_None) {
        w->state = PyLong_AsLong(state);
        if (w->state == -1 && PyErr_Occurred())
            return NULL;
        if (w->state & ~(long)(VALID | FIRST | MARKERS)) {
            PyErr_SetString(PyExc_ValueError, "limestone_scan: not a state it returned");
            return NULL;
        }
    }
    w->durable_epoch = PyLong_AsUnsignedLongLong(durable_epoch);
    if (w->durable_epoch == (uint64_t)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear(); /* negative or past 64 bits: the exact walk compares epochs with it as Python does */
        Py_RETURN_NONE;
    }
    enum step step = walk_buffer(w);
    if (step == FAILED)
        return NULL;
    if (step == GIVE_UP || (w->at == w->base && w->at < w->size)) {
        /* or no progress: the buffer is shorter than an entry's fixed part (a short read) */
        Py_RETURN_NONE;
    }
    return walk_result(w);
}

PyObject *limestone_scan(PyObject *module, PyObject *args)
{
    int fd;
    Py_buffer view;
    long long base, size;
    PyObject *durable_epoch, *state;
    if (!PyArg_ParseTuple(args, "iy*LLO!O", &fd, &view, &base, &size, &PyLong_Type, &durable_epoch, &state))
        return NULL;
    struct walk w = {.fd = fd, .data = view.buf, .len = (uint64_t)view.len, .nondurable = PyList_New(0),
                     .blob_puts = PyList_New(0)};
    PyObject *result = w.nondurable && w.blob_puts ? run_walk(&w, base, size, durable_epoch, state) : NULL;
    Py_XDECREF(w.nondurable);
    Py_XDECREF(w.blob_puts);
    PyBuffer_Release(&view);
    return result;
}
