#!/usr/bin/env bash
# Compatibility matrix: run the whole test suite on real Python and torch releases
# (`make test-compat`).
#
# Usage: bash tools/compat.sh [--setup-only] [--runs N] [ROW ...]    (default: every row below)
#
# A ROW is TORCH (on Python $COMPAT_DEFAULT_PYTHON), PYTHON:TORCH, PYTHON:TORCH:min or
# PYTHON:TORCH:noextras, e.g. 2.6.0, 3.9:2.8.0, 3.9:1.13.1:min, 3.11:2.13.0:noextras. A `min`
# row installs every test dependency and runtime dependency at its floor (the `>=` bounds of
# pyproject.toml, pinned with `==`). A `noextras` row installs none of safetorch's optional
# extras (every package of an optional-dependencies group other than dev, e.g. safetensors, is
# left out of the test dependencies) and checks after the install that none of them, nor
# triton, can be imported: the tests that need one skip with a reason naming it.
#
# For each row: a cached venv .venv-compat/py<PYTHON>-<TORCH>[-min|-noextras] (git-ignored) holding exactly
# that torch, the test dependencies (pyproject's dev extra minus the linters) and safetorch
# (`pip install --no-deps -e .`); then the suite (`python -m pytest -q -p no:cacheprovider tests`)
# runs N times (default 2), each with its own JUnit XML. A test whose outcome differs between the
# runs is reported as flaky and makes the row red. Per-row results are written to
# benchmarks/compat/<row>.json and benchmarks/COMPAT.md is regenerated from all of them (rows not
# run this time keep their last record). A row that cannot be installed is recorded with the
# exact error and the matrix goes on with the rest.
#
# Every run has a per-test deadline (tests/conftest.py, SAFETORCH_TEST_DEADLINE): a test still
# running after it fails with its node id and the run goes on; one that never returns to Python
# (a hang holding the GIL, e.g. a process group destroyed inside a tensor deallocation, issue 27)
# is aborted after a grace period by a watchdog that names it, and the row is recorded as hung.
#
# Exit status: 0 when every requested row installed and all its runs passed with no flaky test.
#
# Environment:
#   COMPAT_RUNS            runs of the suite per row (default 2; --runs overrides)
#   COMPAT_DEFAULT_PYTHON  Python for a bare TORCH row (default 3.11)
#   COMPAT_TIMEOUT         seconds allowed for one run of the suite (default 1800)
#   COMPAT_TEST_DEADLINE   seconds allowed for one test (default 300; its watchdog aborts the
#                          run max(30, half of it) later if the test never returns to Python)
#   COMPAT_NOTE            a note recorded with each row run and shown in COMPAT.md
#   COMPAT_PYTEST_ARGS     extra pytest arguments (e.g. "-x" or a test path filter via -k)
# Interpreters are found as pythonX.Y on PATH, then ~/.pyenv/versions/X.Y.*/bin/python.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1

# The floors and the newest releases: lowest supported Python (3.9) with the lowest supported
# torch (1.13.1), with 2.1.2 and 2.6.0 (Python 3.9 with torch 2.6.0 is where a process group
# destroyed inside a tensor deallocation deadlocked, issue 27), with the newest torch that has
# cp39 wheels (2.8.0), and with every dependency at its floor; Python 3.11 with each torch the
# project has tracked, and with none of the optional extras (on the CPU build of 2.13.0, which
# does not pull in triton).
ALL_ROWS=(3.9:1.13.1:min 3.9:1.13.1 3.9:2.1.2 3.9:2.6.0 3.9:2.8.0
    3.11:1.13.1 3.11:2.1.2 3.11:2.6.0 3.11:2.13.0 3.11:2.13.0:noextras 3.11:2.14.1)
DEFAULT_PYTHON="${COMPAT_DEFAULT_PYTHON:-3.11}"
RUNS="${COMPAT_RUNS:-2}"
TIMEOUT="${COMPAT_TIMEOUT:-1800}"
DEADLINE="${COMPAT_TEST_DEADLINE:-300}"
VENVS="$ROOT/.venv-compat"
HOST_PY="$(command -v python3)"  # runs tools/compat_report.py outside the venvs (needs 3.11+)

setup_only=0
rows=()
while [ $# -gt 0 ]; do
    case "$1" in
        --setup-only) setup_only=1 ;;
        --runs) shift; RUNS="${1:-}" ;;
        --runs=*) RUNS="${1#--runs=}" ;;
        -h | --help) sed -n '2,39p' "$0"; exit 0 ;;
        [0-9]*) rows+=("$1") ;;
        *) echo "compat.sh: unknown argument '$1' (expected --setup-only, --runs N or a row such as 2.6.0 or 3.9:2.8.0)" >&2; exit 2 ;;
    esac
    shift
done
case "$RUNS" in '' | *[!0-9]* | 0) echo "compat.sh: --runs needs a positive integer" >&2; exit 2 ;; esac
[ ${#rows[@]} -eq 0 ] && rows=("${ALL_ROWS[@]}")

log() { echo "[compat $(date +%H:%M:%S)] $*"; }

# numpy: torch < 2.3 was built against numpy 1.x and cannot use numpy 2.
numpy_spec() {
    case "$1" in
        1.* | 2.0.* | 2.1.* | 2.2.*) echo "numpy<2" ;;
        *) echo "numpy" ;;
    esac
}

# find_python X.Y -> path of an interpreter reporting exactly X.Y (pyenv shims may lie).
find_python() {
    local want="$1" cand
    for cand in "$(command -v "python$want" 2>/dev/null)" \
        $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$want".*/bin/python 2>/dev/null | sort -V -r); do
        [ -n "$cand" ] && [ -x "$cand" ] || continue
        if [ "$("$cand" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$want" ]; then
            echo "$cand"
            return 0
        fi
    done
    return 1
}

# test_deps KIND -> one requirement per line: the runtime dependencies and the dev extra, minus
# torch, the linters and the packaging tools; as declared (KIND=newest), pinned at their floors
# (KIND=min), or as declared minus every package of safetorch's other extras (KIND=noextras).
test_deps() {
    "$HOST_PY" - "$1" "$ROOT/pyproject.toml" <<'PY'
import re, sys, tomllib
kind, path = sys.argv[1], sys.argv[2]
project = tomllib.load(open(path, "rb"))["project"]
dev = project["optional-dependencies"]["dev"]
# the linters, and the packaging tools of `make dist` (not run by the suite; twine's floor
# needs a newer packaging than safetorch's own floor)
linters = {"ruff", "mypy", "build", "twine", "setuptools"}
def name_of(req):
    return re.split(r"[<>=!~; \[]", req, maxsplit=1)[0].lower()
if kind == "noextras":
    linters |= {name_of(r) for g, reqs in project["optional-dependencies"].items() if g != "dev" for r in reqs}
for req in project["dependencies"] + dev:
    name = name_of(req)
    if name in linters or name == "torch":
        continue
    if kind == "min":
        floor = re.search(r">=\s*([\w.]+)", req)
        print(f"{name}=={floor.group(1)}" if floor else req)
    else:
        print(req)
PY
}

# extras_absent VENV -> 0 when none of safetorch's optional extras (pyproject's groups other than
# dev) nor triton can be imported in the venv (a dependency may have pulled one in).
extras_absent() {
    local mods
    mods="$("$HOST_PY" - "$ROOT/pyproject.toml" <<'PY'
import re, sys, tomllib
groups = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]
names = {re.split(r"[<>=!~; \[]", r, maxsplit=1)[0] for g, reqs in groups.items() if g != "dev" for r in reqs}
print(" ".join(sorted(n.lower().replace("-", "_") for n in names | {"triton"})))
PY
)"
    "$1/bin/python" - $mods <<'PY'
import importlib.util, sys
present = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None]
if present:
    sys.exit("noextras venv can import optional extras: " + ", ".join(present))
PY
}

# setup ROW PYVERSION TORCH KIND -> 0 when the venv holds that torch and safetorch.
setup() {
    local row="$1" pyv="$2" v="$3" kind="$4" venv="$VENVS/$1" python deps
    local stamp="$venv/.safetorch-compat-installed"
    mkdir -p "$VENVS"
    if [ -f "$stamp" ] && [ "$stamp" -nt "$ROOT/pyproject.toml" ] && [ -x "$venv/bin/python" ]; then
        log "$row: cached venv $venv"
        return 0
    fi
    rm -f "$venv/install.err"
    if ! python="$(find_python "$pyv")"; then
        mkdir -p "$venv"
        echo "no Python $pyv interpreter found (python$pyv on PATH or ~/.pyenv/versions/$pyv.*)" >"$venv/install.err"
        log "$row: $(cat "$venv/install.err")"
        return 1
    fi
    log "$row: creating $venv with $python (this can download several GB)"
    if [ ! -x "$venv/bin/python" ]; then
        if ! "$python" -m venv "$venv" >"$VENVS/$row.venv.log" 2>&1; then
            mkdir -p "$venv"
            { echo "venv creation with $python failed:"; tail -n 3 "$VENVS/$row.venv.log"; } >"$venv/install.err"
            log "$row: $(cat "$venv/install.err")"
            return 1
        fi
    fi
    mapfile -t deps < <(test_deps "$kind")
    [ "$kind" = min ] || deps+=("$(numpy_spec "$v")")
    local pip=("$venv/bin/python" -m pip --disable-pip-version-check)
    # torch is pinned in the same pip command, so the resolver can never swap in another torch.
    if ! "${pip[@]}" install --progress-bar off "torch==$v" "${deps[@]}" >"$venv/install.log" 2>&1; then
        # pip's own explanation: from its first error line on (the conflict, the missing wheel)
        grep -v "^WARNING: Location" "$venv/install.log" | sed -n '/^ERROR\|^error/,$p' | head -n 20 \
            >"$venv/install.err"
        [ -s "$venv/install.err" ] || tail -n 8 "$venv/install.log" >"$venv/install.err"
        log "$row: pip install failed: $(head -n 2 "$venv/install.err")"
        return 1
    fi
    # safetorch itself: editable, without dependencies (its torch>=1.13 must not trigger pip).
    if ! "${pip[@]}" install --no-deps -e "$ROOT" >>"$venv/install.log" 2>&1; then
        tail -n 5 "$venv/install.log" >"$venv/install.err"
        log "$row: installing safetorch failed"
        return 1
    fi
    local got
    got="$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>>"$venv/install.log")"
    if [ "${got%%+*}" != "$v" ]; then
        echo "venv has torch '$got', expected $v (import failed or pip swapped torch; see $venv/install.log)" \
            >"$venv/install.err"
        tail -n 3 "$venv/install.log" >>"$venv/install.err"
        log "$row: $(head -n 1 "$venv/install.err")"
        return 1
    fi
    if [ "$kind" = noextras ] && ! extras_absent "$venv" >"$venv/install.err" 2>&1; then
        log "$row: $(cat "$venv/install.err")"
        return 1
    fi
    "${pip[@]}" freeze >"$venv/freeze.txt" 2>/dev/null
    touch "$stamp"
    log "$row: installed torch $got ($(du -sh "$venv" 2>/dev/null | cut -f1))"
}

# run_suite ROW I -> pytest exit status; leaves junit-I.xml and pytest-I.log in the venv.
run_suite() {
    local row="$1" i="$2" venv="$VENVS/$1" rc
    log "$row: run $i/$RUNS of the suite (timeout ${TIMEOUT}s, ${DEADLINE}s per test)"
    rm -f "$venv/junit-$i.xml"
    # shellcheck disable=SC2086
    SAFETORCH_TEST_DEADLINE="$DEADLINE" \
        timeout "$TIMEOUT" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests \
        --junitxml="$venv/junit-$i.xml" -o junit_family=xunit1 ${COMPAT_PYTEST_ARGS:-} \
        >"$venv/pytest-$i.log" 2>&1
    rc=$?
    log "$row: run $i: $(tail -n 1 "$venv/pytest-$i.log")"
    # a test that hung holding the GIL: the deadline watchdog aborted the run and named it
    grep -m 1 "safetorch test deadline:" "$venv/pytest-$i.log" | while read -r line; do log "$row: run $i: $line"; done
    return $rc
}

status=0
for spec in "${rows[@]}"; do
    IFS=: read -r a b c <<<"$spec"
    if [ -z "$b" ]; then pyv="$DEFAULT_PYTHON" v="$a" kind=newest; else pyv="$a" v="$b" kind="${c:-newest}"; fi
    case "$kind" in newest | min | noextras) ;; *) echo "compat.sh: row '$spec': expected PYTHON:TORCH[:min|:noextras]" >&2; exit 2 ;; esac
    row="py$pyv-$v"
    [ "$kind" = newest ] || row="$row-$kind"
    venv="$VENVS/$row"
    meta=("$row" --venv "$venv" --python "$pyv" --torch "$v" --deps "$kind")
    if ! setup "$row" "$pyv" "$v" "$kind"; then
        status=1
        "$HOST_PY" tools/compat_report.py record "${meta[@]}" --install-failed || status=1
        continue
    fi
    [ "$setup_only" -eq 1 ] && continue
    commit="$("$HOST_PY" tools/compat_report.py commit)"  # what the suite is about to test
    rcs=()
    for i in $(seq 1 "$RUNS"); do
        run_suite "$row" "$i"
        rcs+=("$?")
    done
    "$venv/bin/python" tools/compat_report.py record "${meta[@]}" --commit "$commit" \
        --pytest-rcs "$(IFS=,; echo "${rcs[*]}")"
    [ $? -ne 0 ] && status=1
done

if [ "$setup_only" -eq 0 ]; then
    "$HOST_PY" tools/compat_report.py render || status=1
    log "results: benchmarks/COMPAT.md"
fi
exit $status
