"""Which locked outputs depend on the CPU: the pipeline's deterministic stages run under
XLA code generation for different vector instruction sets, on one machine.

XLA compiles for the host CPU, and the instruction set it may use (SSE4.2, AVX2,
AVX-512, ...) decides how a reduction is vectorized, so the order in which a dot product
or a sum adds its terms, and with it the last bits of a float result. ``XLA_FLAGS=
--xla_cpu_max_isa=<ISA>`` caps what XLA may use, which emulates older CPUs on this one.

For each ISA, a fresh copy of the project runs ``dvc repro check`` (prepare, train,
forward, check: everything but the measured bench and track), with its own JAX
compilation cache. The script prints, for each locked output, whether its hash is the
same under every ISA, and writes the table as JSON.

Usage (from the project root)::

    python benchmarks/lock_across_cpus.py --json benchmarks/lock_across_cpus.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.helpers

# The wall-time records differ on every run by nature; the code records are the same
# source under every ISA.
IGNORED = ("reports/stages/", "reports/code/")
ISAS = ("native", "AVX2", "AVX", "SSE4_2")
# The stages `dvc repro check` runs (bench and track are measured: never reproduced).
STAGES_RUN = ("prepare", "train", "forward", "check")


def _locked_outputs(project: Path) -> dict[str, str]:
    """output path -> md5, for the outs of the stages run in dvc.lock (wall-time records
    aside)."""
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    return {
        out["path"]: out["md5"]
        for name in STAGES_RUN
        for out in lock[name].get("outs", [])
        if not out["path"].startswith(IGNORED)
    }


def run_under(isa: str, base: Path) -> dict[str, str]:
    from tests.helpers.project import commit_all, copy_project, run

    project = copy_project(base / isa)
    commit_all(project)
    env = {} if isa == "native" else {"XLA_FLAGS": f"--xla_cpu_max_isa={isa}"}
    start = time.monotonic()
    run(project, "dvc", "repro", "check", env=env)
    print(f"{isa}: dvc repro check in {time.monotonic() - start:.0f} s", flush=True)
    return _locked_outputs(project)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the table here")
    parser.add_argument("--isa", action="append", help=f"the ISAs to compare (default {ISAS})")
    args = parser.parse_args()
    isas = args.isa or list(ISAS)
    with tempfile.TemporaryDirectory() as scratch:
        hashes = {isa: run_under(isa, Path(scratch)) for isa in isas}
    outputs = sorted(set().union(*hashes.values()))
    table = {
        out: {
            "same_under_every_isa": len({hashes[isa].get(out) for isa in isas}) == 1,
            "groups": _groups({isa: hashes[isa].get(out) for isa in isas}),
        }
        for out in outputs
    }
    width = max(map(len, outputs))
    for out, row in table.items():
        verdict = (
            "same"
            if row["same_under_every_isa"]
            else "DIFFERS: " + " | ".join(", ".join(group) for group in row["groups"])
        )
        print(f"{out:<{width}}  {verdict}")
    if args.json:
        report = {
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "machine": platform.processor() or platform.machine(),
            "cpu": _cpu_model(),
            "isas": isas,
            "outputs": table,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _groups(by_isa: dict[str, str | None]) -> list[list[str]]:
    """The ISAs grouped by the hash they gave (one group: the same everywhere)."""
    groups: dict[str | None, list[str]] = {}
    for isa, digest in by_isa.items():
        groups.setdefault(digest, []).append(isa)
    return list(groups.values())


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
