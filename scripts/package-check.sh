#!/usr/bin/env bash
# Installs target/debian/orch_*.deb (from scripts/package-deb.sh) on this machine and checks it
# as an admin meets it, then removes it again. Needs root, promtool (Debian: prometheus), man-db,
# systemd (systemd-analyze) and useradd. The daemon it starts serves this machine's devices ("auto":
# the CPU where there is no GPU) on /run/orch/orch.sock, so run it where no other orch daemon
# runs; it stops that daemon and purges the package on the way out, whatever happened.
set -euo pipefail
cd "$(dirname "$0")/.."

target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
debs=("$target"/debian/orch_*.deb)
deb=${debs[0]}
[[ -e "$deb" ]] || { echo "no package in $target/debian: run scripts/package-deb.sh first" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "package-check.sh installs a package: run it as root" >&2; exit 2; }
# Never on a machine that runs orch: the check starts the machine's daemon and purges the package.
if dpkg-query -W -f='${Status}' orch 2>/dev/null | grep -q "installed"; then
  echo "the orch package is installed here: package-check.sh would remove it; run it on a machine without orch" >&2
  exit 2
fi
if [[ -e /run/orch/orch.sock || -e /var/lib/orch/jobs.sqlite3 ]]; then
  echo "an orch daemon serves (or served) this machine (/run/orch/orch.sock or /var/lib/orch/jobs.sqlite3): package-check.sh would take its place; run it on a machine without orch" >&2
  exit 2
fi

user=orch-pkg-check
# What this check makes, so that it removes that and nothing else.
made_state=$([[ -e /var/lib/orch ]] && echo no || echo yes)
made_run=$([[ -e /run/orch ]] && echo no || echo yes)
made_user=no
daemon_pid=""
cleanup() {
  if [[ -n "$daemon_pid" ]]; then
    kill -TERM "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  dpkg -P orch orch-dbgsym >/dev/null 2>&1 || true
  rm -rf /run/orch/orch.sock /run/orch/owner.json /var/lib/orch/jobs.sqlite3* /var/lib/orch/jobs
  [[ $made_state == yes ]] && rm -rf /var/lib/orch
  [[ $made_run == yes ]] && rm -rf /run/orch
  [[ $made_user == yes ]] && userdel -r "$user" >/dev/null 2>&1
  true
}
trap cleanup EXIT
fail() { echo "package check: $*" >&2; exit 1; }
step() { echo "-- $*"; }

step "install $(basename "$deb") ($(du -h "$deb" | cut -f1))"
dpkg -i "$deb"
size=$(stat -c %s /usr/bin/orch)
echo "/usr/bin/orch: $size bytes ($((size / 1000000)) MB)"
(( size <= 40000000 )) || fail "/usr/bin/orch is $size bytes, over 40 MB"
[[ $(dpkg-query -W -f='${Conffiles}' orch) == *"/etc/orch/serve.toml"* ]] || fail "/etc/orch/serve.toml is not a conffile"

step "the unit: systemd-analyze verify"
unit=/lib/systemd/system/orch.service
verify=$(systemd-analyze verify "$unit" 2>&1 || true)
echo "${verify:-(no complaints)}"
# A container without a running systemd cannot load every dependency; the unit's own lines must
# raise nothing.
if grep -E "orch\.service:[0-9]+:" <<<"$verify"; then fail "systemd-analyze found errors in $unit"; fi

step "alert rules: promtool check and test"
promtool check rules /usr/share/orch/prometheus/orch-alerts.yml
(cd /usr/share/orch/prometheus && promtool test rules orch-alerts.test.yml)
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["panels"], "no panels"' \
  /usr/share/orch/grafana/orch-dashboard.json

step "man pages render"
# From the package's own files: a machine whose dpkg leaves out /usr/share/man (a minimal image's
# path-exclude) installs the package without them.
pages=$(mktemp -d)
dpkg-deb -x "$deb" "$pages"
MANPAGER=cat MANWIDTH=100 man -l "$pages/usr/share/man/man1/orch.1.gz" | grep -q "orch-submit" \
  || fail "man -l orch.1.gz does not list orch-submit"
MANPAGER=cat MANWIDTH=100 man -l "$pages/usr/share/man/man1/orch-run.1.gz" | grep -q -- "--gpus" \
  || fail "man -l orch-run.1.gz does not show --gpus"
rm -rf "$pages"

step "bash completion"
bash -c 'source /usr/share/bash-completion/completions/orch && complete -p orch' | grep -q orch \
  || fail "the bash completion registers nothing for orch"

step "the shipped config asks for a tenant; one with a tenant checks"
if out=$(orch serve --config /etc/orch/serve.toml --check 2>&1); then
  fail "the shipped config, which has no tenant, was accepted: $out"
fi
grep -q "tenant" <<<"$out" || fail "the shipped config's refusal does not mention a tenant: $out"
if ! id "$user" >/dev/null 2>&1; then
  useradd --create-home "$user"
  made_user=yes
fi
cat >> /etc/orch/serve.toml <<TOML

[[tenant]]
name = "lab"
users = ["$user"]
TOML
orch serve --config /etc/orch/serve.toml --check

step "start the daemon as the unit's ExecStart does"
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
# What systemd makes before ExecStart: RuntimeDirectory=orch, StateDirectory=orch.
install -d -m 0755 /run/orch
install -d -m 0700 /var/lib/orch
log=$(mktemp)
# shellcheck disable=SC2086
setsid $exec_start >"$log" 2>&1 &
daemon_pid=$!
for _ in $(seq 1 100); do
  [[ -S /run/orch/orch.sock ]] && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$log"; fail "the daemon exited at start"; }
  sleep 0.1
done
[[ -S /run/orch/orch.sock ]] || { cat "$log"; fail "no socket at /run/orch/orch.sock after 10 s"; }

step "submit as $user through /run/orch/orch.sock"
as_user() { runuser -u "$user" -- env -u ORCH_STATE_DIR -u ORCH_SERVER HOME="/home/$user" "$@"; }
id_=$(cd /tmp && as_user orch submit --gpus 1 -- sh -c 'echo "hello from $(id -un) on $CUDA_VISIBLE_DEVICES"')
echo "job $id_"
as_user timeout 60 orch wait "$id_" || { cat "$log"; fail "job $id_ did not succeed"; }
said=$(as_user orch logs "$id_")
echo "$said"
[[ "$said" == "hello from $user on "* ]] || fail "job $id_ printed '$said'"

step "stop the daemon; remove, then purge the package"
kill -TERM "$daemon_pid"
wait "$daemon_pid" || true
daemon_pid=""
[[ ! -e /run/orch/orch.sock ]] || fail "the daemon left its socket behind"
dpkg -r orch
[[ ! -e /usr/bin/orch ]] || fail "dpkg -r left /usr/bin/orch"
[[ -e /etc/orch/serve.toml ]] || fail "dpkg -r removed the admin's /etc/orch/serve.toml"
dpkg -P orch
[[ ! -e /etc/orch/serve.toml ]] || fail "dpkg -P left /etc/orch/serve.toml"
echo "package check: passed"
