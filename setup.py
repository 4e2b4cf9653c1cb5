"""The compiled scan core (walcore._scan). Optional: without a C compiler walvault installs and runs on the
pure-Python reference walks, and says so (`walvault --version`, `walvault inspect`)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "walcore._scan",
    sources=["walcore/_scan/module.c", "walcore/_scan/crc32c.c", "walcore/_scan/tarantool.c",
             "walcore/_scan/limestone.c"],
    depends=["walcore/_scan/scan.h"],
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    optional=True,
)])
