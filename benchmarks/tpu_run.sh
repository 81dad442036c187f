#!/usr/bin/env bash
# vmapcheck on a TPU machine, as shipped, in one call of this workplace's device tool
# (docs/accelerators.md). Run from the repository root on the TPU machine; every result
# lands in $OUT (committed afterwards as benchmarks/tpu_*.json):
#
#   OUT=/some/folder benchmarks/tpu_run.sh install pipeline:mlp:synthetic:accelerator \
#       pipeline:flax_cnn:digits:accelerator numerics paired
#
# Steps, in the order given:
#   install                      the wheel in dist/ (make wheel) into a venv that sees the
#                                machine's own JAX/jaxlib/libtpu (--system-site-packages),
#                                from the machine's package index plus the wheels carried
#                                in .whl-tpu/ (no network there); `pip list` is kept
#   pipeline:MODEL:DATA:BENCH[:TARGET]
#                                a copy of this project, params composed with backend=tpu,
#                                then `dvc repro [TARGET]`; its verdict and figures collected
#   isolation                    prepare, train and check (the float64 oracle) run while
#                                another process holds the chip: they must never open it
#   numerics[:MODELS]            benchmarks/tpu_numerics.py: model x precision x path
#                                (MODELS: comma-separated, default every model; with
#                                MODELS the planted mistake is left to `planted`, and the
#                                JSON is tpu_numerics_<models>.json)
#   probe:MODEL:SIZES[:PREC]     benchmarks/tpu_compile_probe.py: each jit path's compile
#                                seconds at each batch size (comma-separated), at matmul
#                                precision PREC (default: the backend's)
#   planted                      tpu_numerics.py's planted mistake only (softmax over the
#                                batch axis) at f32 and bf16: its check must FAIL
#   paired[:SIDES]               verdict-paired on the chip: A/A, then ~40% more work
#                                (SIDES: aa, slow40 or both, the default)
#   acctest                      `python -m pytest tests/test_accelerator.py`, as documented
#   bitwise                      benchmarks/bitwise_report.py: bitwise batch invariance of
#                                the shipped mlp and flax_cnn on the chip, per batch path
# The machine has Python 3.11, JAX 0.10.2 and libtpu preinstalled, no sockets, and one
# process at a time may hold the chip.
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
REPO=$(pwd)
VENV=/tmp/vmapcheck-venv
WORK=/tmp/vmapcheck-tpu
export PATH="$VENV/bin:$PATH" DVC_NO_ANALYTICS=1 PYTHONUNBUFFERED=1
export GIT_AUTHOR_NAME=vmapcheck GIT_AUTHOR_EMAIL=vmapcheck@localhost
export GIT_COMMITTER_NAME=vmapcheck GIT_COMMITTER_EMAIL=vmapcheck@localhost
mkdir -p "$WORK"

# Each output line prefixed with the seconds since the step began.
stamped() { python3 -u -c 'import sys, time
t = time.time()
for line in sys.stdin:
    print(f"{time.time() - t:7.1f} {line}", end="", flush=True)'; }

step_install() {
    if [ ! -x "$VENV/bin/vmapcheck" ]; then
        python3 -m venv --system-site-packages "$VENV" || return 1
        local wheel
        wheel=$(ls "$REPO"/dist/vmapcheck-*.whl) || return 1
        PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip install --isolated --no-cache-dir \
            --disable-pip-version-check --only-binary=:all: \
            --index-url file:///opt/pypi/simple --find-links "$REPO/.whl-tpu" \
            "${wheel}[flax]" || return 1
    else
        # A warm machine from an earlier call: this checkout's vmapcheck, nothing else.
        PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip install --isolated --no-cache-dir \
            --disable-pip-version-check --no-deps --force-reinstall --quiet \
            "$(ls "$REPO"/dist/vmapcheck-*.whl)" || return 1
    fi
    "$VENV/bin/python" -m pip list --disable-pip-version-check > "$OUT/tpu_pip_list.txt"
    grep -iE '^(jax|jaxlib|libtpu|numpy|scipy|vmapcheck|mlflow|dvc|flax) ' "$OUT/tpu_pip_list.txt"
    python -c 'import sys, jax; print(sys.executable, sys.version.split()[0], jax.__version__, jax.__file__)'
}

# A copy of this repository's project (what `vmapcheck init` wrote) in its own git repo.
new_project() {
    local dir=$1
    rm -rf "$dir" && mkdir -p "$dir"
    cp -r "$REPO"/{dvc.yaml,params.yaml,conf,stages,data,reports,requirements.lock,VMAPCHECK.md,.dvc,.dvcignore,.gitignore} "$dir"/
    rm -rf "$dir/.dvc/cache" "$dir/.dvc/tmp"
    (cd "$dir" && git init -q && git add -A && git commit -qm "vmapcheck project") \
        || (cd "$dir" && dvc config core.no_scm true)
}

step_pipeline() {
    local model=$1 data=$2 bench=$3 target=${4:-} dir="$WORK/$1" rc began
    new_project "$dir"
    cd "$dir" || return 1
    vmapcheck params "model=$model" "data=$data" backend=tpu "bench=$bench" || return 1
    began=$(date +%s.%N)
    dvc repro $target 2>&1 | stamped
    rc=${PIPESTATUS[0]}
    vmapcheck summary --repro-status "$rc"
    python "$REPO/benchmarks/tpu_collect.py" "$dir" --repro-status "$rc" \
        --wall-s "$(python3 -c "import time; print(time.time() - $began)")" \
        --out "$OUT/tpu_pipeline_${model}${target:+_$target}.json"
    cd "$REPO" || return 1
}

hold_chip() {
    python -c 'import jax, time; print("holder:", jax.devices()); open("/tmp/held", "w").close(); time.sleep(900)' &
    HOLDER=$!
    for _ in $(seq 90); do [ -e /tmp/held ] && return 0; sleep 1; done
    return 1
}

free_chip() { kill "$HOLDER"; wait "$HOLDER" 2>/dev/null; rm -f /tmp/held; sleep 5; }

run_stage() {
    local began=$(date +%s.%N)
    python -m "vmapcheck.stages.$1" > "/tmp/stage_$1.log" 2>&1
    local rc=$?
    echo "isolation: $1 exit $rc in $(python3 -c "import time; print(round(time.time() - $began, 1))") s, $2; last line: $(grep -v '^ *$' "/tmp/stage_$1.log" | tail -n 1)"
}

step_isolation() {
    # prepare, train and check (the float64 oracle) run while another process holds the
    # chip: had any of them opened it, it would die on libtpu's lock.
    local dir="$WORK/isolation"
    new_project "$dir"
    cd "$dir" || return 1
    vmapcheck params model=mlp backend=tpu || return 1
    run_stage code "chip free"
    hold_chip || return 1
    run_stage prepare "chip held by pid $HOLDER"
    run_stage train "chip held by pid $HOLDER"
    free_chip
    run_stage forward "chip free"
    hold_chip || return 1
    run_stage check "chip held by pid $HOLDER"
    run_stage forward "chip held by pid $HOLDER (expected to fail: it needs the chip)"
    free_chip
    cd "$REPO" || return 1
}

step_numerics() {
    # Cells that finish are saved as they go; the budget keeps the call inside its limit.
    local out="$OUT/tpu_numerics" extra=()
    if [ -n "${1:-}" ]; then
        out="$OUT/tpu_numerics_${1//,/_}"
        extra=(--no-planted --models ${1//,/ })
    fi
    # NUMERICS_PRECISIONS (space-separated): those precisions only, named in the file.
    if [ -n "${NUMERICS_PRECISIONS:-}" ]; then
        out="${out}_${NUMERICS_PRECISIONS// /_}"
        extra+=(--precisions $NUMERICS_PRECISIONS)
    fi
    python "$REPO/benchmarks/tpu_numerics.py" --out "$out.json" "${extra[@]}" \
        --budget-s "${NUMERICS_BUDGET_S:-220}" > "$out.txt" 2>&1
    local rc=$?
    tail -n 40 "$out.txt"
    return $rc
}

step_probe() {
    python "$REPO/benchmarks/tpu_compile_probe.py" --model "$1" --sizes "$2" --hlo \
        ${3:+--matmul-precision "$3"} ${PROBE_PATHS:+--paths "$PROBE_PATHS"} \
        --limit-s "${PROBE_LIMIT_S:-100}" --out "$OUT/tpu_compile_probe_$1${3:+_$3}.json"
}

step_planted() {
    python "$REPO/benchmarks/tpu_numerics.py" --out "$OUT/tpu_planted.json" --models \
        --precisions f32 bf16 > "$OUT/tpu_planted.txt" 2>&1
    local rc=$?
    tail -n 20 "$OUT/tpu_planted.txt"
    return $rc
}

step_bitwise() {
    python "$REPO/benchmarks/bitwise_report.py" --json "$OUT/bitwise_tpu.json" \
        > "$OUT/bitwise_tpu.txt" 2>&1
    local rc=$?
    tail -n 40 "$OUT/bitwise_tpu.txt"
    return $rc
}

step_acctest() {
    # The accelerator test command as docs/development.md gives it, on the stock VM: its
    # platform start-up warnings must not stop the suite (issue 44). pytest from .whl-tpu.
    PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip install --isolated --no-cache-dir \
        --disable-pip-version-check --only-binary=:all: --quiet \
        --index-url file:///opt/pypi/simple --find-links "$REPO/.whl-tpu" pytest || return 1
    python -m pytest tests/test_accelerator.py -p no:cacheprovider > "$OUT/tpu_acctest.txt" 2>&1
    local rc=$?
    tail -n 15 "$OUT/tpu_acctest.txt"
    echo "acctest exit $rc"
    return $rc
}

step_paired() {
    local sides=${1:-both}
    # A wide MLP at batch sizes where the chip is busy: at the default width every jit
    # path is launch-bound on a TPU and 40% more work costs no time.
    local common=(model.hidden=[2048,2048] train.steps=0 data.n_rows=240 data.standard_batch=8 backend=tpu)
    for side in a b; do
        local dir="$WORK/paired_$side"
        new_project "$dir"
        cd "$dir" || return 1
        if [ "$side" = a ]; then vmapcheck params model=mlp "${common[@]}"; else
            vmapcheck params model=mlp_slow model.factory.extra_work=0.4 "${common[@]}"; fi
        python -m vmapcheck.stages.prepare > /dev/null && python -m vmapcheck.stages.train > /dev/null || return 1
    done
    # vmap_jit and direct_jit only: by default every single-device jit path is timed, and
    # map_jit (lax.map, one row a step) takes over a second a call at 65,536 rows of this
    # width on a TPU; a run with it did not reach its verdict in 4 minutes (2026-12-06).
    if [ "$sides" != slow40 ]; then
        cd "$WORK/paired_a" || return 1
        vmapcheck verdict-paired --baseline-project "$WORK/paired_a" --batch-sizes 16384,65536 \
            --paths vmap_jit,direct_jit --out "$OUT/tpu_paired_aa.json" 2>&1 | stamped
        echo "paired A/A exit ${PIPESTATUS[0]}"
    fi
    if [ "$sides" != aa ]; then
        cd "$WORK/paired_b" || return 1
        vmapcheck verdict-paired --baseline-project "$WORK/paired_a" --batch-sizes 16384,65536 \
            --paths vmap_jit,direct_jit --out "$OUT/tpu_paired_slow40.json" 2>&1 | stamped
        echo "paired +40% exit ${PIPESTATUS[0]}"
    fi
    cd "$REPO" || return 1
}

status=0
for step in "$@"; do
    IFS=: read -r name a b c d <<< "$step"
    echo "=== $step ($(date -u +%H:%M:%S))"
    began=$(date +%s)
    "step_$name" ${a:+"$a"} ${b:+"$b"} ${c:+"$c"} ${d:+"$d"} || { echo "=== $step FAILED"; status=1; }
    echo "=== $step took $(( $(date +%s) - began )) s"
done
exit $status
