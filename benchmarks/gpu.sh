#!/usr/bin/env bash
# The GPU table, as users train: fp32 weights + bf16 autocast (Seq2SeqTrainer(bf16=True)), fused AdamW,
# eager and torch.compile(model), each row against stock HF SDPA in the same process. From the repository root:
#
#   bash benchmarks/gpu.sh                           # on a GPU machine: under 6 minutes (DEADLINE)
#   RESUME=1 RESULTS=<the first run's> bash benchmarks/gpu.sh   # a second run: the parts the deadline cut
#       (measured on an H100: tb-eager 70 s, mbart-eager 45 s, mbart-no-logits 36 s, tb-profile 45 s; a compile
#        takes about 30 s a model, so compile-check's 7 rows and tb-compiled's 5 do not fit one 6-minute run)
#   WHEELS=.whl bash benchmarks/gpu.sh               # first install the wheels in .whl (a machine without them)
#       (make them here: pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#        transformers==5.23.0 regex; the lent GPU's python3 has transformers 5.17, below our 5.23)
#   SMOKE=1 bash benchmarks/gpu.sh                   # CPU smoke run: tiny shapes, 1 repeat, aot_eager, outputs/
#   RESULTS=outputs/gpu RESUME=1 bash benchmarks/gpu.sh   # again: keeps the parts that finished, runs the rest
#
# Parts, in this order (each a process of its own with a time limit; its JSON is written as soon as it finishes):
#   triton-check     benchmarks/triton_check.py: EaDRA's Triton pass (implementation="triton") against the eager pass
#                    and float64 on the device, and the pass alone (forward + backward) timed against the eager and
#                    the compiled pass (12 layers of 32 x 6 heads x 256, float32 and bfloat16 heads); TRITON_CHECK:
#                    more arguments, e.g. "--tiles 32x64 64x32" (other tile shapes timed)
#   tb-triton        transformer-base 32x256, eager: off eadra-scratch eadra-scratch-triton-pass ("-triton-pass": the
#                    pass as Triton kernels; judged against EaDRA's targets)
#   mbart-triton     mbart-large-8x512, eager: off eadra-finetune eadra-finetune-triton-pass
#   tb-compiled      transformer-base, torch.compile(model) against compiled stock: COMPILED_ROWS (default off dhicm
#                    eadra-scratch dea-rhe lpea-rhe)
#   compile-check    benchmarks/compile_check.py: tiny model, inductor on the device, CHECK_ROWS (default eadra and
#                    all, every method at once; a compile takes 30 s to over a minute on an H100; DHICM's rows passed
#                    on CUDA already)
#   tb-eager         transformer-base 32x256, eager: off dhicm eadra-scratch eadra-scratch-eager-pass dea-rhe
#                    lpea-rhe, the naive port, and generate (beam 4, 64 new tokens, batch 32); "-eager-pass": EaDRA's
#                    regularizer pass not compiled (its "auto" compiles it on CUDA), the comparison that chose "auto"
#   mbart-eager      mbart-large-8x512, eager: off dhicm-finetune eadra-finetune eadra-finetune-eager-pass
#   mbart-eager-sea  mbart-large-8x512, eager: dea-rhe lpea-rhe and the naive port (apart from mbart-eager: seven
#                    mbart-large models with fp32 weights and AdamW state do not fit an H100's 80 GB at once)
#   mbart-no-logits  mbart-large-8x512, eager: off off-no-logits eadra-finetune-no-logits (the loss without
#                    the logits, against stock and the logits path)
#   tb-profile       benchmarks/profile_step.py: transformer-base, eager, a torch.profiler profile of 2 steps of
#                    stock and off dhicm eadra-scratch eadra-scratch-eager-pass dea-rhe lpea-rhe: each row's kernel
#                    time per step and the operators and kernels with the most self device time over stock's (not
#                    judged)
#   tb-profile-compiled  the same of torch.compile(model), stock's too: dhicm eadra-scratch (a compile a model)
#   tb-bf16          transformer-base, the model cast to bf16 (the earlier pure-bf16 runs): off off-no-logits
#   mbart-compiled   mbart-large-8x512 compiled: eadra-finetune only, the row whose target is judged there (an
#                    mbart-large compile takes about a minute a model); last, so the deadline cuts it first
#   EXTRA_PARTS      a place for more parts: lines "name|shape|mode|precision|rows|limit_s|overhead.py arguments"
#                    (mode: eager or compiled), after the others, e.g.
#                    EXTRA_PARTS='tb-no-logits|transformer-base|eager|autocast-bf16|off off-no-logits|60|--repeats 6'
#
# Output: RESULTS (default benchmarks/results/gpu/<gpu>-<date>-<time>; outputs/gpu-smoke-<time> with SMOKE=1) holds
# <part>.json (overhead.py's JSON; compile_check.py's for compile-check, triton_check.py's for triton-check,
# profile_step.py's for tb-profile and tb-profile-compiled),
# logs/<part>.log and logs/<part>.tsv (status line), parts.tsv (every part's status, seconds, shape, mode, precision
# and rows) and summary.json (gpu_summary.py: the GPU targets, each met / not met / not measured, and one line per
# part and row of the timing parts), whose table is printed at the end; tb-profile's table is in logs/tb-profile.log.
#
# Environment: PYTHON (python3), DEVICE (cuda; cpu with SMOKE=1), DEADLINE (seconds from the start for all parts,
# 340: a part gets the least of its own limit times LIMIT_SCALE (1; 10 with SMOKE=1) and what is left, and is skipped
# when less than MIN_PART_S, 20, is left), PARTS (the part names to run, all by default), BACKEND (inductor;
# aot_eager with SMOKE=1), WHEELS (a folder of wheels to install first into /tmp/gpu-sh-site, put first on
# PYTHONPATH), RESUME=1 (keep the parts of RESULTS whose JSON exists), EXTRA_PARTS (above).
set -euo pipefail

START=$SECONDS  # the deadline counts from here: wheels and the first import included
PYTHON=${PYTHON:-python3}
SMOKE=${SMOKE:-0}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[[ -f benchmarks/overhead.py ]] || { echo "gpu.sh: run it from the repository root" >&2; exit 2; }

if [[ -n ${WHEELS:-} ]]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-sh-site \
        "$WHEELS"/*.whl
    export PYTHONPATH="/tmp/gpu-sh-site:$PYTHONPATH"
fi

gpu=$("$PYTHON" -c "import torch, transformers, hf_headattn
print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no-gpu', '/ torch', torch.__version__,
      '/ transformers', transformers.__version__)") || {
    echo "gpu.sh: $PYTHON: no torch, transformers or hf_headattn" >&2
    exit 2
}
echo "gpu.sh: $gpu"

if [[ $SMOKE == 1 ]]; then
    DEVICE=${DEVICE:-cpu} BACKEND=${BACKEND:-aot_eager} DEADLINE=${DEADLINE:-3000} LIMIT_SCALE=${LIMIT_SCALE:-10}
    TB=tiny LARGE=tiny PRECISION=autocast-bf16
    TB_TIMING=(--repeats 1 --warmup 1) LARGE_TIMING=(--repeats 1 --warmup 1) COMPILED_TIMING=(--repeats 1 --warmup 1)
    GENERATE=(--generate-beams 2 --generate-tokens 4 --generate-repeats 1)
    CHECK_ROWS=(dhicm all)
    COMPILED_ROWS=(off dhicm eadra-scratch dea-rhe lpea-rhe)
    PROFILE_TIMING=(--warmup 1 --steps 1)
    TRITON_CHECK=(--layers 2 --batch 2 --heads 2 --length 40 --repeats 1)
    export TRITON_INTERPRET=1  # the Triton kernels run on the CPU under Triton's interpreter
    RESULTS=${RESULTS:-outputs/gpu-smoke-$(date +%Y%m%d-%H%M%S)}
else
    DEVICE=${DEVICE:-cuda} BACKEND=${BACKEND:-inductor} DEADLINE=${DEADLINE:-340} LIMIT_SCALE=${LIMIT_SCALE:-1}
    TB=transformer-base LARGE=mbart-large-8x512 PRECISION=autocast-bf16
    TB_TIMING=(--repeats 12 --warmup 3) LARGE_TIMING=(--repeats 6 --warmup 2) COMPILED_TIMING=(--repeats 8 --warmup 2)
    GENERATE=(--generate-beams 4 --generate-tokens 64 --generate-repeats 2)
    read -ra CHECK_ROWS <<<"${CHECK_ROWS:-eadra all}"  # or: off dhicm dhicm-scaled eadra dea-rhe lpea-rhe all
    read -ra COMPILED_ROWS <<<"${COMPILED_ROWS:-off dhicm eadra-scratch dea-rhe lpea-rhe}"
    PROFILE_TIMING=(--warmup 3 --steps 2)
    read -ra TRITON_CHECK <<<"${TRITON_CHECK:-}"  # e.g. --tiles 32x64 64x32 128x64: more tile shapes timed
    gpu=${gpu%% / torch*}
    slug=$(tr -cs 'a-z0-9' '-' <<<"${gpu,,}" | sed 's/-$//')  # e.g. nvidia-h100-80gb-hbm3
    RESULTS=${RESULTS:-benchmarks/results/gpu/$slug-$(date +%Y%m%d-%H%M)}
fi
EXTRA_PARTS=${EXTRA_PARTS:-}
MIN_PART_S=${MIN_PART_S:-20}
PARTS=${PARTS:-}
RESUME=${RESUME:-0}
mkdir -p "$RESULTS/logs"
echo "gpu.sh: results in $RESULTS (device $DEVICE, backend $BACKEND, deadline $DEADLINE s)"

ORDER=()

# part NAME SHAPE MODE PRECISION ROWS LIMIT_S -- COMMAND...: run COMMAND under the part's time limit, record its status
part() {
    local name=$1 shape=$2 mode=$3 precision=$4 rows=$5 limit=$6 status seconds=0 rc=0
    shift 7
    ORDER+=("$name")
    [[ -z $PARTS || " $PARTS " == *" $name "* ]] || return 0
    if [[ $RESUME == 1 && -s $RESULTS/$name.json && -s $RESULTS/logs/$name.tsv ]]; then
        echo "== $name: kept from the earlier run"; return 0
    fi
    local left=$((DEADLINE - (SECONDS - START)))
    if ((left < MIN_PART_S)); then
        status="skipped: deadline"
    else
        limit=$((limit * LIMIT_SCALE))
        ((limit < left)) || limit=$left
        echo "== $name (at most $limit s)"
        rm -f "$RESULTS/$name.json"
        local begin=$SECONDS
        timeout --kill-after=15 "$limit" "$@" >"$RESULTS/logs/$name.log" 2>&1 || rc=$?
        seconds=$((SECONDS - begin))
        case $rc in
            0) status=ok ;;
            124 | 137) status="timeout after $limit s" ;;
            *) status="failed: exit $rc (logs/$name.log)" ;;
        esac
        [[ $rc == 0 ]] || tail -n 5 "$RESULTS/logs/$name.log" | sed 's/^/   | /'
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$seconds" "$shape" "$mode" "$precision" "$rows" \
        >"$RESULTS/logs/$name.tsv"
    echo "   $name: $status ($seconds s)"
}

# timing NAME SHAPE MODE PRECISION ROWS LIMIT_S [overhead.py arguments]: a part of benchmarks/overhead.py
timing() {
    local name=$1 shape=$2 mode=$3 precision=$4 rows=$5 limit=$6 compile=()
    shift 6
    [[ $mode == compiled ]] && compile=(--compile --compile-backend "$BACKEND")
    # shellcheck disable=SC2086  # rows: one word each
    part "$name" "$shape" "$mode" "$precision" "$rows" "$limit" -- "$PYTHON" benchmarks/overhead.py --shape "$shape" \
        --device "$DEVICE" --precision "$precision" --rows $rows "${compile[@]}" "$@" --out "$RESULTS/$name.json"
}

# EaDRA's Triton pass first (the open question): equal to the eager pass on CUDA, then the pass alone and a step timed
part triton-check stacked triton fp32+bf16 "triton eager compiled" 90 -- "$PYTHON" benchmarks/triton_check.py \
    --device "$DEVICE" "${TRITON_CHECK[@]}" --out "$RESULTS/triton-check.json"
timing tb-triton "$TB" eager "$PRECISION" "off eadra-scratch eadra-scratch-triton-pass" 70 "${TB_TIMING[@]}"
timing mbart-triton "$LARGE" eager "$PRECISION" "off eadra-finetune eadra-finetune-triton-pass" 60 "${LARGE_TIMING[@]}"
# then what compiles on CUDA (both unmeasured there): compiled rows against compiled stock, and the compile check
timing tb-compiled "$TB" compiled "$PRECISION" "${COMPILED_ROWS[*]}" 200 "${COMPILED_TIMING[@]}"
part compile-check tiny check "$PRECISION" "${CHECK_ROWS[*]}" 150 -- "$PYTHON" benchmarks/compile_check.py \
    --device "$DEVICE" --backend "$BACKEND" --precision "$PRECISION" --rows "${CHECK_ROWS[@]}" \
    --out "$RESULTS/compile-check.json"
timing tb-eager "$TB" eager "$PRECISION" "off dhicm eadra-scratch eadra-scratch-eager-pass dea-rhe lpea-rhe" 150 \
    --naive "${TB_TIMING[@]}" "${GENERATE[@]}"
timing mbart-eager "$LARGE" eager "$PRECISION" "off dhicm-finetune eadra-finetune eadra-finetune-eager-pass" 90 \
    "${LARGE_TIMING[@]}"
timing mbart-eager-sea "$LARGE" eager "$PRECISION" "dea-rhe lpea-rhe" 70 --naive "${LARGE_TIMING[@]}"
# the loss without the logits (config.loss_without_logits), against stock and the logits path
timing mbart-no-logits "$LARGE" eager "$PRECISION" "off off-no-logits eadra-finetune-no-logits" 70 "${LARGE_TIMING[@]}"
PROFILE_ROWS=(off dhicm eadra-scratch eadra-scratch-eager-pass dea-rhe lpea-rhe)
part tb-profile "$TB" profile "$PRECISION" "${PROFILE_ROWS[*]}" 60 -- "$PYTHON" benchmarks/profile_step.py \
    --shape "$TB" --device "$DEVICE" --precision "$PRECISION" --rows "${PROFILE_ROWS[@]}" "${PROFILE_TIMING[@]}" \
    --out "$RESULTS/tb-profile.json"
part tb-profile-compiled "$TB" profile "$PRECISION" "dhicm eadra-scratch" 150 -- "$PYTHON" benchmarks/profile_step.py \
    --shape "$TB" --device "$DEVICE" --precision "$PRECISION" --rows dhicm eadra-scratch --compile "$BACKEND" \
    "${PROFILE_TIMING[@]}" --out "$RESULTS/tb-profile-compiled.json"
timing tb-bf16 "$TB" eager bf16 "off off-no-logits" 40 "${TB_TIMING[@]}"
timing mbart-compiled "$LARGE" compiled "$PRECISION" "eadra-finetune" 150 "${COMPILED_TIMING[@]}"

# ---- EXTRA_PARTS: more parts, one a line ----
while IFS='|' read -r name shape mode precision rows limit args; do
    [[ -n $name ]] || continue
    # shellcheck disable=SC2086  # args: overhead.py's arguments, split on spaces
    timing "$name" "$shape" "$mode" "$precision" "$rows" "$limit" $args
done <<<"$EXTRA_PARTS"

for name in "${ORDER[@]}"; do
    [[ ! -f $RESULTS/logs/$name.tsv ]] || cat "$RESULTS/logs/$name.tsv"
done >"$RESULTS/parts.tsv"
"$PYTHON" benchmarks/gpu_summary.py "$RESULTS"
echo "gpu.sh: $((SECONDS - START)) s; summary in $RESULTS/summary.json"
