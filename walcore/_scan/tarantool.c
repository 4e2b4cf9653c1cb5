#include "scan.h"
int tarantool_add_types(PyObject *module) { return 0; }
