"""docs/estimate.md stays true (issue 18, "every option with a worked example whose numbers a
test checks"): every option of ``traceroof estimate`` is documented, and each worked example's
command, run here, prints the numbers the page states for it."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from conftest import MODELS, REPO

from traceroof.cli import cli

DOC = (REPO / "docs" / "estimate.md").read_text()
FLAT = " ".join(DOC.split())


def test_every_option_is_documented() -> None:
    cmd = cli.commands["estimate"]
    names = [o for p in cmd.params for o in p.opts if o.startswith("--")]
    assert len(names) > 25
    missing = [n for n in names if n not in ("--help", "--debug") and f"`{n}" not in DOC
               and f"{n} " not in DOC]
    assert not missing, missing


#: (worked-example command, numbers it prints: each as printed, or (as printed, as the page
#: writes it) where the page rounds or changes the unit)
EXAMPLES = [
    (["--model", "llama3-70b.json", "--chip", "tpu-v5p", "--seq", "8192", "--tokens", "15e12",
      "--chips", "8960", "--mfu", "0.4", "--price-per-chip-hour", "2"],
     [("6.350e+24", "6.350e24"), ("4.832e+23", "4.832e23"), "44.7 days", "48.1 days",
      "10,337,929", ("$20,675,858.41", "$20,675,858"), "4,153,632 s", "3,859,878 s"]),
    (["--model", "llama2-7b.json", "--chip", "h100"],
     ["13.48 GB", "80.86 GB", "26.95 GB", "53.91 GB", "131,584 B", "393,728 B", "8,192 B",
      "17.25 GB", "0.52 GB", "125.59 GB"]),
    (["--model", "llama3-70b.json", "--chip", "h100", "--seq", "8192", "--mfu", "0.4", "--tp", "8",
      "--pp", "4", "--fsdp", "32", "--global-batch-tokens", "4194304"],
     ["4.715 s", ("883.99 ms", "0.884 s"), ("763.55 ms", "0.7635 s"), "2.822 s",
      ("88.19 ms", "88.2 ms"), ("10.74 ms", "10.7 ms"), ("774.29 ms", "0.774 s"),
      ("6.373 s", "6.37 s"), ("<= 44.5", "= 44.5 (8: met)"), (">= 7,915.2", "7,915 (8,192: met)"),
      (">= 30.0", "m ≥ 30"), "22.48 GB",
      "24.11 GB", "16 micro-batches"]),
    (["--model", "llama2-7b.json", "--chip", "h100", "--search", "--chips", "8",
      "--global-batch-tokens", "1048576"],
     [("fsdp=8 5.783 s", "fsdp=8 at 5.783 s"), ("125.59 GB", "125.6 GB"),
      ("layouts tried 16", "16 layouts tried")]),
    (["--model", "llama2-7b.json", "--chip", "h100", "--serve", "--tpot-ms", "20",
      "--price-per-chip-hour", "2.5"],
     [("4.66 ms", "4.664 ms"), ("19.41 ms", "19.41 ms"), "1,237", "51.5", "60.24 ms",
      ("$0.56 per M tokens", "$0.5616 per M tokens"), ("within 20 ms/token 24", "24 sequences")]),
    (["--model", "deepseek-v2-lite.json", "--chip", "h100"], ["31,104 B", "15,706,357,760"]),
    (["--model", "llama2-7b.json", "--chip", "a100", "--weight-dtype", "int4"],
     [("1.65 ms", "1.652 ms")]),
    (["--model", "llama2-7b.json", "--chip", "h100", "--weight-dtype", "int4"],
     [("1.01 ms", "1.006 ms"), ("3.37 GB", "3,369,207,808 B")]),
]


@pytest.mark.parametrize("args, numbers", EXAMPLES,
                         ids=[f"{a[1]}-{a[3]}-{i}" for i, (a, _) in enumerate(EXAMPLES)])
def test_worked_example(args, numbers) -> None:
    argv = [str(MODELS / a) if a.endswith(".json") else a for a in args]
    res = CliRunner().invoke(cli, ["estimate", *argv, "-q"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = re.sub(r"\s+", " ", res.output)
    assert args[1] in DOC  # the page names the model file
    for n in numbers:
        printed, on_page = (n, n) if isinstance(n, str) else n
        assert printed in out, f"{printed!r} not printed by estimate {' '.join(args)}"
        assert on_page in FLAT, f"{on_page!r} is not on docs/estimate.md"
