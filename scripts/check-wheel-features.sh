#!/usr/bin/env bash
# Checks that the Python package (crates/orch-py) built alone resolves every shared dependency
# with the same features as `cargo build --workspace`. When they match, `pip install
# ./crates/orch-py` (or maturin) after a workspace build reuses wasmtime, cranelift and the rest
# instead of compiling them again; when they drift, this prints the lines to add to
# crates/orch-py/Cargo.toml and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."

tree() {
  cargo tree "$@" -e normal,build -f '{p} [{f}]' --prefix none --no-dedupe 2>/dev/null | sort -u
}
python3 - <(tree -p orch-py) <(tree --workspace) <<'PY'
import collections, re, sys

def load(path):
    features = collections.defaultdict(set)
    for line in open(path):
        m = re.match(r'(\S+) v(\S+)(?: \(.*?\))? \[(.*)\]', line.strip())
        if m:
            features[(m.group(1), m.group(2))] |= {f for f in m.group(3).split(',') if f}
    return features

package, workspace = load(sys.argv[1]), load(sys.argv[2])
if not package:
    sys.exit("cargo tree printed nothing for orch-py: run it by hand to see why")
drift = [(name, version, sorted(workspace.get((name, version), set())), sorted(features))
         for (name, version), features in sorted(package.items())
         if features != workspace.get((name, version), set())]
for name, version, wanted, has in drift:
    print(f"{name} {version}: the workspace builds it with {wanted}, orch-py alone with {has}")
    if set(has) - set(wanted):
        print(f"  orch-py turns on more than the workspace: {sorted(set(has) - set(wanted))}")
    else:
        default = "" if "default" in wanted else "default-features = false, "
        feats = ", ".join(f'"{f}"' for f in wanted)
        print(f'  add to crates/orch-py/Cargo.toml: {name} = {{ version = "{version}", {default}features = [{feats}] }}')
if drift:
    sys.exit(1)
print(f"orch-py alone resolves its {len(package)} dependencies as the workspace does")
PY
