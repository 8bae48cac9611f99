"""The compiled parts and the package layout; everything else is in pyproject.toml. The
compiled parts: the ring writer (omnitrace/_ringc.c), the interval kernels of the FIFO and
head-of-line rules (omnitrace/_intervalsc.c), the span load's row passes (omnitrace/_spanc.c),
the event log's feed preparation (omnitrace/_decodec.c) and the span builder's request state
(omnitrace/_reqc.c); docs/architecture.md lists
each one's numpy reference. optional=True: where no C compiler is, the install goes on and
the same answers come from those references, slower.

The hook definitions live at the top of the repository (``patches/``: per target and
version, apart from the code they instrument with) and install as ``omnitrace.patches``
(``package_dir``), so an installed package, editable or not, imports them by that name."""
from setuptools import Extension, find_packages, setup

setup(packages=find_packages(include=["omnitrace", "omnitrace.*"])
      + ["omnitrace." + p for p in find_packages(include=["patches", "patches.*"])],
      package_dir={"omnitrace.patches": "patches"},
      ext_modules=[Extension(f"omnitrace.{name}", [f"omnitrace/{name}.c"], optional=True,
                             extra_compile_args=["-O2"])
                   for name in ("_ringc", "_intervalsc", "_spanc", "_decodec", "_reqc")])
