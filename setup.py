"""Compiles the simulator's hot modules with Cython where a C compiler is present.

The list and the switch back to pure Python are in loadgen/compiled.py. A module that fails to
compile (or a machine without Cython or a compiler) is left as Python: the install never fails
for want of a compiler.
"""

import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "loadgen"))
from compiled import COMPILED_MODULES, pure_python_requested  # noqa: E402  (the module alone, not the package)

sys.path.pop(0)


def ext_modules() -> list:
    if pure_python_requested():
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        return []
    from setuptools import Extension

    # -ffp-contract=off: no fused multiply-adds, so floats round exactly as in Python (bit-identical runs)
    extensions = [Extension(name, [name.replace(".", "/") + ".py"], optional=True,
                            extra_compile_args=["-O2", "-ffp-contract=off"]) for name in COMPILED_MODULES]
    # annotation_typing off: an annotation never turns a variable into a C type, so every value is
    # the Python object it is in the source (a float stays a float, an int an int)
    directives = {"language_level": 3, "binding": True, "annotation_typing": False}
    compiled = []
    for extension in extensions:
        try:
            compiled += cythonize([extension], compiler_directives=directives, quiet=True)
        except Exception as exc:  # noqa: BLE001  a module that does not compile stays Python
            print(f"setup.py: {extension.name} runs as Python ({exc})", file=sys.stderr)
    return compiled


setup(ext_modules=ext_modules(), options={"build_ext": {"parallel": os.cpu_count() or 1}})
