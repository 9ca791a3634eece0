"""traceroof's fuzz harness (docs/fuzzing.md): ``python fuzz/run.py TARGET --runs N``."""
