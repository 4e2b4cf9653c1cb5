/* The module walcore._scan: see scan.h. */
#include "scan.h"

static PyObject *crc32c_py(PyObject *module, PyObject *args)
{
    Py_buffer view;
    unsigned long crc = 0;
    if (!PyArg_ParseTuple(args, "y*|k", &view, &crc))
        return NULL;
    uint32_t result = scan_crc32c((uint32_t)crc, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(result);
}

static PyMethodDef methods[] = {
    {"tarantool_crc32c", crc32c_py, METH_VARARGS,
     "tarantool_crc32c(data, crc=0): CRC-32C continued from `crc` with no final XOR (Tarantool's block CRC)."},
    {"limestone_scan", limestone_scan, METH_VARARGS,
     "The fast walk of a pwal file's entries (see walcore.limestone.scan)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "walcore._scan",
    .m_doc = "walvault's compiled scan core (see walcore.scancore).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__scan(void)
{
    scan_crc32c_init();
    PyObject *module = PyModule_Create(&module_def);
    if (module && tarantool_add_types(module) < 0)
        Py_CLEAR(module);
    return module;
}
