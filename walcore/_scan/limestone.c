/* limestone: the pwal entry walk. (Being written.) */
#include "scan.h"

PyObject *limestone_scan(PyObject *module, PyObject *args)
{
    PyErr_SetString(PyExc_NotImplementedError, "limestone_scan is not written yet");
    return NULL;
}
