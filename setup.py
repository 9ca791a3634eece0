"""Build of the optional native readers: the Kineto JSON scanner
(``traceroof/parsers/_kineto_scan.c``) and the XPlane event decoder
(``traceroof/parsers/_xplane_scan.c``).

Everything else is declared in ``pyproject.toml``. Both extensions are optional: where they
cannot be compiled (no C compiler), the install still succeeds and traceroof decodes Kineto
JSON with msgspec alone (``traceroof.parsers.kineto_native.AVAILABLE`` is then False) and
XPlane events with numpy and protobuf (``traceroof.parsers.xplane_proto_events.NATIVE`` False).
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
        ),
        Extension(
            "traceroof.parsers._xplane_scan",
            ["traceroof/parsers/_xplane_scan.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
