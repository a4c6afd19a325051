"""Build the native header codec (native/_native.pyx) into chronos.codec._native."""
from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [Extension("chronos.codec._native", ["native/_native.pyx"])],
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
    ),
)
