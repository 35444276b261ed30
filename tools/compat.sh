#!/usr/bin/env bash
# Compatibility matrix: run the whole test suite on real torch releases (`make test-compat`).
#
# Usage: bash tools/compat.sh [--setup-only] [VERSION ...]     (default: every version below)
#
# For each torch VERSION: a cached venv .venv-compat/VERSION (git-ignored) holding exactly that
# torch, the test dependencies and safetorch (`pip install --no-deps -e .`), then
# `python -m pytest -q -p no:cacheprovider tests` with a JUnit XML. Per-version results are
# written to benchmarks/compat/VERSION.json and benchmarks/COMPAT.md is regenerated from all of
# them (versions not run this time keep their last recorded row). A version that cannot be
# installed is recorded with pip's exact error and the matrix goes on with the rest.
#
# Exit status: 0 when every requested version installed and its suite passed, 1 otherwise.
#
# Environment:
#   COMPAT_PYTHON   interpreter for the venvs (default: python3; needs 3.11 for 2.13/2.14 wheels)
#   COMPAT_TIMEOUT  seconds allowed for one version's pytest run (default 1800)
#   COMPAT_NOTE     a note recorded with each version run and shown in COMPAT.md
#   COMPAT_PYTEST_ARGS  extra pytest arguments (e.g. "-x" or a test path filter via -k)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1

ALL_VERSIONS=(1.13.1 2.1.2 2.6.0 2.13.0 2.14.1)
PYTHON="${COMPAT_PYTHON:-python3}"
TIMEOUT="${COMPAT_TIMEOUT:-1800}"
VENVS="$ROOT/.venv-compat"
RESULTS="$ROOT/benchmarks/compat"
# Test dependencies (pyproject's dev extra minus the linters). torch is pinned in the same pip
# command, so the resolver can never swap in another torch for one of these.
TEST_DEPS=(pytest hypothesis "wrapt>=1.14" "packaging>=20" safetensors)

setup_only=0
versions=()
for arg in "$@"; do
    case "$arg" in
        --setup-only) setup_only=1 ;;
        -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
        [0-9]*) versions+=("$arg") ;;
        *) echo "compat.sh: unknown argument '$arg' (expected --setup-only or a torch version such as 2.6.0)" >&2; exit 2 ;;
    esac
done
[ ${#versions[@]} -eq 0 ] && versions=("${ALL_VERSIONS[@]}")

# numpy: torch < 2.3 was built against numpy 1.x and cannot use numpy 2.
numpy_spec() {
    case "$1" in
        1.* | 2.0.* | 2.1.* | 2.2.*) echo "numpy<2" ;;
        *) echo "numpy" ;;
    esac
}

log() { echo "[compat $(date +%H:%M:%S)] $*"; }

# setup VERSION -> 0 when the venv holds that torch and safetorch; writes install.log/install.err.
setup() {
    local v="$1" venv="$VENVS/$1"
    local stamp="$venv/.safetorch-compat-installed"
    mkdir -p "$VENVS"
    if [ -f "$stamp" ] && [ "$stamp" -nt "$ROOT/pyproject.toml" ] && [ -x "$venv/bin/python" ]; then
        log "torch $v: cached venv $venv"
        return 0
    fi
    rm -f "$venv/install.err"
    log "torch $v: creating $venv (this can download several GB)"
    if [ ! -x "$venv/bin/python" ]; then
        if ! "$PYTHON" -m venv "$venv" >"$VENVS/$v.venv.log" 2>&1; then
            mkdir -p "$venv"
            { echo "venv creation with $PYTHON failed:"; tail -n 3 "$VENVS/$v.venv.log"; } >"$venv/install.err"
            log "torch $v: $(cat "$venv/install.err")"
            return 1
        fi
    fi
    local pip=("$venv/bin/python" -m pip --disable-pip-version-check)
    if ! "${pip[@]}" install --progress-bar off "torch==$v" "$(numpy_spec "$v")" "${TEST_DEPS[@]}" \
        >"$venv/install.log" 2>&1; then
        # pip's own explanation: from its first error line on (the conflict, the missing wheel)
        grep -v "^WARNING: Location" "$venv/install.log" | sed -n '/^ERROR\|^error/,$p' | head -n 20 \
            >"$venv/install.err"
        [ -s "$venv/install.err" ] || tail -n 8 "$venv/install.log" >"$venv/install.err"
        log "torch $v: pip install failed: $(head -n 2 "$venv/install.err")"
        return 1
    fi
    # safetorch itself: editable, without dependencies (its torch>=1.13 must not trigger pip).
    if ! "${pip[@]}" install --no-deps -e "$ROOT" >>"$venv/install.log" 2>&1; then
        tail -n 5 "$venv/install.log" >"$venv/install.err"
        log "torch $v: installing safetorch failed"
        return 1
    fi
    local got
    got="$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>>"$venv/install.log")"
    if [ "${got%%+*}" != "$v" ]; then
        echo "venv has torch '$got', expected $v (import failed or pip swapped torch; see $venv/install.log)" \
            >"$venv/install.err"
        tail -n 3 "$venv/install.log" >>"$venv/install.err"
        log "torch $v: $(head -n 1 "$venv/install.err")"
        return 1
    fi
    "${pip[@]}" freeze >"$venv/freeze.txt" 2>/dev/null
    touch "$stamp"
    log "torch $v: installed torch $got ($(du -sh "$venv" 2>/dev/null | cut -f1))"
}

# run VERSION -> pytest exit status; leaves junit.xml and pytest.log in the venv.
run_suite() {
    local v="$1" venv="$VENVS/$1" rc
    log "torch $v: running the suite (timeout ${TIMEOUT}s)"
    # shellcheck disable=SC2086
    timeout "$TIMEOUT" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests \
        --junitxml="$venv/junit.xml" -o junit_family=xunit1 ${COMPAT_PYTEST_ARGS:-} \
        >"$venv/pytest.log" 2>&1
    rc=$?
    tail -n 1 "$venv/pytest.log"
    return $rc
}

status=0
for v in "${versions[@]}"; do
    venv="$VENVS/$v"
    if ! setup "$v"; then
        status=1
        "$PYTHON" tools/compat_report.py record "$v" --venv "$venv" --install-failed || status=1
        continue
    fi
    [ "$setup_only" -eq 1 ] && continue
    commit="$("$PYTHON" tools/compat_report.py commit)"  # what the suite is about to test
    run_suite "$v"
    rc=$?
    [ "$rc" -ne 0 ] && status=1
    "$venv/bin/python" tools/compat_report.py record "$v" --venv "$venv" --pytest-rc "$rc" --commit "$commit" || status=1
done

if [ "$setup_only" -eq 0 ]; then
    "$PYTHON" tools/compat_report.py render || status=1
    log "results: benchmarks/COMPAT.md"
fi
exit $status
