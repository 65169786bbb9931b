"""The record of a whole ``tests/cuda`` run on the GPU machine, kept in bench/results/.

The project's rule (CONTRIBUTING.md): a change to the CUDA provider, the capture runner or
what the GPU tests import ends with the whole ``tests/cuda`` run on the GPU machine at its
final commit, its counts recorded here. ``tests/test_gpu_suite_record.py`` holds CI to it.

On the GPU machine (``bench/gpu_check.sh tests`` does it)::

    python3 bench/record_gpu_suite.py --from-junit OUT/tests.xml --whole yes > OUT/gpu_suite.json

Back here, append that record (one JSON line) to bench/results/gpu-suite.jsonl::

    python bench/record_gpu_suite.py --append OUT/gpu_suite.json

Where no GPU machine can be had (the session's device time is spent), say so at HEAD::

    python bench/record_gpu_suite.py --not-run "why"
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

RECORDS = Path(__file__).resolve().parent / "results" / "gpu-suite.jsonl"


def from_junit(paths: list[Path], whole: bool) -> dict:
    """Counts of pytest junit files (the shards of one run, summed), with the commit the
    wheel was built from (COMMIT)."""
    counts = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for path in paths:
        root = ET.parse(path).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        for k in counts:
            counts[k] += int(suite.get(k, 0))
    # device_prepare.sh writes it into .device/head and .device/wheels
    commit_file = next(
        (p for p in (Path("COMMIT"), Path(".device/wheels/COMMIT")) if p.is_file()), Path("COMMIT")
    )
    device = "unknown"
    try:
        import cupy

        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception as exc:  # the record still says what ran
        device = f"unknown ({type(exc).__name__})"
    return {
        "commit": commit_file.read_text().strip() if commit_file.is_file() else "unknown",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "device": device,
        "whole": whole,
        "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
        "failed": counts["failures"],
        "errors": counts["errors"],
        "skipped": counts["skipped"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--from-junit", type=Path, nargs="+", help="pytest --junitxml file(s) of the run (shards)"
    )
    ap.add_argument("--whole", choices=("yes", "no"), default="yes")
    ap.add_argument("--append", type=Path, help="a record written by --from-junit")
    ap.add_argument(
        "--not-run",
        metavar="WHY",
        help="record that the whole suite could not run at HEAD, and why (no GPU machine)",
    )
    args = ap.parse_args(argv)
    if args.not_run:
        import subprocess

        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        record = {
            "commit": head,
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
            "whole": False,
            "not_run": args.not_run,
        }
        with RECORDS.open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"appended to {RECORDS}: {record}")
        return 0
    if args.from_junit:
        print(json.dumps(from_junit(args.from_junit, args.whole == "yes")))
        return 0
    if args.append:
        record = json.loads(args.append.read_text())
        with RECORDS.open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"appended to {RECORDS}: {record}")
        return 0
    ap.print_usage(sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
