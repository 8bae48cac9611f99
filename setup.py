"""Only the compiled ring writer (omnitrace/_ringc.c); everything else is in pyproject.toml.
optional=True: where no C compiler is, the install goes on and omnitrace.record uses its
Python writer (the reference the compiled one is tested against)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("omnitrace._ringc", ["omnitrace/_ringc.c"], optional=True,
                             extra_compile_args=["-O2"])])
