"""Build of the optional native Kineto scanner (``traceroof/parsers/_kineto_scan.c``).

Everything else is declared in ``pyproject.toml``. The extension is optional: where it cannot
be compiled (no C compiler), the install still succeeds and traceroof decodes Kineto JSON
with msgspec alone (``traceroof.parsers.kineto_native.AVAILABLE`` is then False).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "traceroof.parsers._kineto_scan",
            ["traceroof/parsers/_kineto_scan.c"],
            depends=["traceroof/parsers/_kineto_lex.h"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
