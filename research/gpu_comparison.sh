#!/usr/bin/env bash
# The papers' comparison rows of the converged study (converged_study.py `compare`: Rel_Pos, Rel_Pos+RHE, Localness,
# Localness+RHE, fixed attention; seed 1, the `small` shape, the GPU arm's schedule) in one call on a lent GPU, the
# runs side by side under CUDA MPS. From the repository root:
#
#   bash research/gpu_comparison.sh pack   # here, once (spaCy and pip's index reachable): -> .carry/ (27 MB):
#       Multi30k En-De, the GPU arm's tokenizer (8000 pieces) and the sources' parses (for the RHE rows), and the
#       wheels the lent GPU's python3 lacks (transformers, datasets and its dill and multiprocess, regex)
#   bash research/gpu_comparison.sh run    # there: the device tool's run(command="bash research/gpu_comparison.sh
#       run", carry=[".carry"], timeout_s=600); back in $OUT: records.tgz (the finished runs' records, paths from the
#       repository root), logs.tgz (each run's train.<session>.log), status.txt (the study's status, versions, the GPU)
#   tar xzf <files_at>/records.tgz && python research/converged_study.py table --device cuda   # here, after
#
# Resumable at run granularity: a run recorded in benchmarks/results/converged-cuda is skipped by the next call (its
# records committed); one cut short resumes from its last epoch in a second call on the same warm machine, and
# starts again on a fresh one (its checkpoints stay in /tmp there).
# Budget (one call of 600 s; the machine's start is not in it): about 15 s for the wheels, then the study until
# DEADLINE (540 s) with a training cap per run of CAP_MINUTES (7: each run's own clock, evaluations included, ends
# the epoch past it, then the best checkpoint's beam-5 validation score). The GPU arm's screen of 8 runs at a time
# stopped early after 5-10 minutes (24-40 epochs); 5 at a time, they run faster, and a run past the cap is recorded
# as stopped by it (the table says so).
#
# Environment: PYTHON (python3), CARRY (.carry), MULTI30K (pack: Multi30k's folder; default found or downloaded),
# PARALLEL (5), THREADS (2: CPU threads a run, as the screen had), CAP_MINUTES (7), DEADLINE (540 s), ROWS (the rows,
# default all of compare's), SMOKE=1 (here, on the CPU: no wheels, no MPS, the CPU arm's schedule, 3 steps a run, into
# outputs/gpu-comparison-smoke/).
set -euo pipefail

PYTHON=${PYTHON:-python3}
CARRY=${CARRY:-.carry}  # what travels with the call (git-ignored)
[[ -f research/converged_study.py ]] || { echo "gpu_comparison.sh: run it from the repository root" >&2; exit 2; }

pack() {
    # MULTI30K: a folder of Multi30k's files; default: found or downloaded, checksummed (docs/usage.md, Multi30k)
    local multi30k=${MULTI30K:-$("$PYTHON" -c "from hf_headattn.experiment.multi30k import find_multi30k
print(find_multi30k(languages=('en', 'de')))")}
    mkdir -p "$CARRY/multi30k" "$CARRY/wheels"
    cp "$multi30k"/{train,val,test_2016_flickr}.{en,de}.gz "$CARRY/multi30k/"
    "$PYTHON" research/converged_study.py prepare --device cuda --multi30k_dir "$CARRY/multi30k" \
        --tokenizer_dir "$CARRY/tokenizer" --parses_dir "$CARRY/parses"
    # the versions of this checkout's environment; the lent GPU's python3 has transformers 5.17 (below our lowest)
    local pins
    pins=$("$PYTHON" -c "from importlib.metadata import version as v
print(' '.join(f'{n}=={v(n)}' for n in ('transformers', 'datasets', 'dill', 'multiprocess', 'regex')))")
    # shellcheck disable=SC2086  # the pins are words
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$CARRY/wheels" $pins
    git rev-parse HEAD > "$CARRY/COMMIT"
    du -sh "$CARRY"
}

run() {
    local out=${OUT:-outputs/gpu-comparison} device=cuda extra=() results runs tokenizer=$CARRY/tokenizer
    local parses=$CARRY/parses
    local deadline=${DEADLINE:-540} cap=${CAP_MINUTES:-7} parallel=${PARALLEL:-5} threads=${THREADS:-2}
    [[ -d $CARRY/tokenizer && -d $CARRY/parses && -d $CARRY/multi30k ]] || {
        echo "gpu_comparison.sh: $CARRY/ lacks the tokenizer, parses or Multi30k: run 'pack' here first and carry" \
             "$CARRY" >&2; exit 2; }
    mkdir -p "$out"
    export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    if [[ ${SMOKE:-0} == 1 ]]; then
        local smoke=outputs/gpu-comparison-smoke samples=(--max_train_samples 64 --max_eval_samples 8)
        device=cpu results=$smoke/results runs=$smoke/runs parses=$smoke/parses
        tokenizer=$smoke/tokenizer  # the CPU arm's vocabulary (made when missing)
        extra=(-- --max_steps 3 "${samples[@]}")
        # the parses of the examples the runs read (one per example: hf-headattn parse with the same data flags)
        [[ -f $parses/parser.json ]] || "$PYTHON" -m hf_headattn parse --multi30k_dir "$CARRY/multi30k" \
            "${samples[@]}" --output_dir "$parses"
    else
        results=benchmarks/results/converged-cuda runs=/tmp/converged-cuda
        if compgen -G "$CARRY/wheels/*.whl" > /dev/null; then
            "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target /tmp/gpu-comparison-site "$CARRY"/wheels/*.whl
            export PYTHONPATH="/tmp/gpu-comparison-site:$PYTHONPATH"
        fi
        nvidia-cuda-mps-control -d 2>&1 || echo "gpu_comparison.sh: no MPS (the runs share the GPU by time slices)"
    fi
    # fail here, in seconds, rather than in five runs: the versions, and a model of each row on the device
    "$PYTHON" - "$device" <<'EOF' | tee "$out/status.txt"
import sys

sys.path.insert(0, "research")
import torch, transformers, datasets  # noqa: E401
import converged_study as cs
from hf_headattn import HeadAttnMarianConfig, HeadAttnMarianMTModel
from hf_headattn.experiment.presets import model_shape

device = sys.argv[1]
print(f"torch {torch.__version__}, transformers {transformers.__version__}, datasets {datasets.__version__}, "
      f"device {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}")
for row, (_, settings) in cs.COMPARISON.items():
    HeadAttnMarianMTModel(HeadAttnMarianConfig(**model_shape("tiny"), vocab_size=64, pad_token_id=0,
                                               decoder_start_token_id=0, **settings)).to(device)
print("every comparison row builds")
EOF
    local status=0
    # shellcheck disable=SC2086  # ROWS: row names
    timeout --kill-after=10 "$deadline" "$PYTHON" research/converged_study.py compare --device "$device" \
        --parallel "$parallel" --threads "$threads" --time_cap_minutes "$cap" --multi30k_dir "$CARRY/multi30k" \
        --tokenizer_dir "$tokenizer" --parses_dir "$parses" --results_dir "$results" \
        --output_dir "$runs" ${ROWS:+--rows $ROWS} "${extra[@]}" \
        2>&1 | tee "$out/compare.log" || status=$?
    "$PYTHON" research/converged_study.py status --device "$device" --results_dir "$results" --output_dir "$runs" \
        >> "$out/status.txt" 2>&1 || true
    echo "compare exit status $status (124: stopped at DEADLINE=$deadline s); commit $(cat "$CARRY/COMMIT" 2>/dev/null \
        || echo unknown)" | tee -a "$out/status.txt"
    # the comparison rows' records (paths from the repository root), and every session's log of their runs
    "$PYTHON" -c "import sys; sys.path.insert(0, 'research'); import converged_study as cs
from workshop.runs import record_path
paths = [record_path(sys.argv[1], 'screen', row, seed) for row in cs.COMPARISON for seed in cs.STEPS.screen_seeds]
print('\n'.join(str(path) for path in paths if path.is_file()))" "$results" | tar czf "$out/records.tgz" -T -
    { find "$runs" -name 'train.*.log' 2>/dev/null || true; } | tar czf "$out/logs.tgz" -T -
    ls -l "$out"
}

case ${1:-} in
    pack) pack ;;
    run) run ;;
    *) echo "usage: bash research/gpu_comparison.sh pack|run (see its header)" >&2; exit 2 ;;
esac
