"""Input formats: one module per format, each exposing ``read(path) -> Trace``."""
