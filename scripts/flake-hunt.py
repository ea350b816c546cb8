#!/usr/bin/env python3
"""Reruns chosen tests N times and prints, per test, how often it failed.

    scripts/flake-hunt.py --runs 50 python -k ddp      tests/python, pytest arguments after the kind
    scripts/flake-hunt.py --runs 5 python              the whole Python suite
    scripts/flake-hunt.py --runs 3 rust                cargo test --workspace (debug, as CI)
    scripts/flake-hunt.py --runs 20 rust -p orch-cli --test cli run::

`python` runs pytest in tests/python with the environment scripts/python-env.sh makes (reused when
it is there: ORCH_PY_REUSE=1) and the `orch` binary `cargo build` made; `rust` runs `cargo test
--workspace` with the given arguments (test-name filters after `--` reach the test binaries).
Each run's whole output is kept in target/flake-hunt/<kind>-<n>.log; a test that failed names the
logs that hold its failures. The exit status is 1 when any run had a failure, 0 otherwise.
"""

import argparse
import collections
import os
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")).resolve()

# pytest -rA summary lines: "PASSED test_x.py::test_y", "FAILED test_x.py::test_y - reason".
PYTEST_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)")
# libtest lines: "test run::name ... ok"; "Running tests/cli/main.rs (target/debug/deps/cli-…)".
RUST_LINE = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)")
RUST_BINARY = re.compile(r"^\s*Running (?:unittests )?(\S+)")


def python_command(extra):
    env = dict(os.environ, ORCH_PY_REUSE="1")
    venv = subprocess.run(
        [str(ROOT / "scripts" / "python-env.sh")], env=env, check=True, stdout=subprocess.PIPE, text=True
    ).stdout.strip().splitlines()[-1]
    orch = TARGET / "debug" / "orch"
    if not orch.exists():
        subprocess.run(["cargo", "build", "-p", "orch-cli"], cwd=ROOT, check=True)
    env.update(ORCH_BIN=str(orch), ORCH_REQUIRE_TORCH="1", ORCH_REQUIRE_TENSORFLOW="1")
    argv = [f"{venv}/bin/python", "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *extra]
    return argv, ROOT / "tests" / "python", env


def rust_command(extra):
    return ["cargo", "test", "--workspace", *extra], ROOT, dict(os.environ)


def outcomes(kind, text):
    """(test, passed) for every test a run reported."""
    found = []
    binary = ""
    for line in text.splitlines():
        if kind == "python":
            m = PYTEST_LINE.match(line)
            if m and m.group(1) in ("PASSED", "FAILED", "ERROR", "XPASS"):
                found.append((m.group(2), m.group(1) == "PASSED"))
        else:
            b = RUST_BINARY.match(line)
            if b:
                binary = b.group(1)
                continue
            m = RUST_LINE.match(line)
            if m and m.group(2) != "ignored":
                found.append((f"{binary} {m.group(1)}", m.group(2) == "ok"))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="how many times to run (default 10)")
    parser.add_argument("kind", choices=["python", "rust"])
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for pytest or cargo test")
    opts = parser.parse_args()
    if opts.runs < 1:
        parser.error("--runs must be at least 1")

    argv, cwd, env = (python_command if opts.kind == "python" else rust_command)(opts.args)
    logs = TARGET / "flake-hunt"
    logs.mkdir(parents=True, exist_ok=True)
    runs = collections.Counter()
    failures = collections.defaultdict(list)
    failed_runs = 0
    started = time.monotonic()
    for n in range(1, opts.runs + 1):
        t0 = time.monotonic()
        done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log = logs / f"{opts.kind}-{n}.log"
        log.write_text(done.stdout)
        seen = outcomes(opts.kind, done.stdout)
        for test, passed in seen:
            runs[test] += 1
            if not passed:
                failures[test].append(log.name)
        bad = [t for t, ok in seen if not ok]
        if done.returncode != 0:
            failed_runs += 1
            if not bad:
                # A run that failed without naming a test (a build error, a crashed binary).
                failures["(the run itself)"].append(log.name)
                runs["(the run itself)"] += 1
        print(
            f"run {n}/{opts.runs}: exit {done.returncode}, {len(seen)} tests, {len(bad)} failed,"
            f" {time.monotonic() - t0:.0f} s" + (f"  {', '.join(bad)}" if bad else ""),
            flush=True,
        )

    print(f"\n{opts.runs} runs of {' '.join(argv)} in {time.monotonic() - started:.0f} s;"
          f" {failed_runs} runs failed; logs in {logs}")
    if not failures:
        print(f"no failures ({len(runs)} tests)")
        return 0
    width = max(len(t) for t in failures)
    print(f"{'test'.ljust(width)}  failed/runs  logs")
    for test in sorted(failures, key=lambda t: -len(failures[t])):
        print(f"{test.ljust(width)}  {len(failures[test]):>6}/{runs[test]:<4}  {' '.join(failures[test][:5])}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
