/* walcore._scan: the compiled hot loops of walvault's scans. Each walk here accepts only what the pure-Python
 * reference walk accepts with the same result, and stops (handing the position back) at anything else, so that
 * the reference decides every finding: the two cores agree on every input by construction. Every length read
 * from the input is checked against the buffer before it is used. */
#ifndef WALCORE_SCAN_H
#define WALCORE_SCAN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

/* CRC-32C as Tarantool computes it: register starting at `crc` (0 for a block), no final XOR. */
uint32_t scan_crc32c(uint32_t crc, const unsigned char *p, size_t n);
void scan_crc32c_init(void); /* once, at module import */

/* Tarantool: adds the BlockScanner type to the module. */
int tarantool_add_types(PyObject *module);

/* limestone: the pwal entry walk (METH_VARARGS). */
PyObject *limestone_scan(PyObject *module, PyObject *args);

#endif
