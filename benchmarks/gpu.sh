#!/usr/bin/env bash
# The GPU table, as users train: fp32 weights + bf16 autocast (Seq2SeqTrainer(bf16=True)), fused AdamW,
# eager and torch.compile(model), each row against stock HF SDPA in the same process. From the repository root:
#
#   bash benchmarks/gpu.sh                  # on a GPU machine: PLAN=1, the issue table's rows, under 6 minutes
#   PLAN=2 RESUME=1 RESULTS=<PLAN=1's> bash benchmarks/gpu.sh   # compiled target rows, into the same folder
#   PLAN=3 RESUME=1 RESULTS=<the same> bash benchmarks/gpu.sh   # the last target rows, compile check, profiles, rest
#   PLAN_ONLY=1 PLAN=1 bash benchmarks/gpu.sh   # print the plan (name, plan, limit s, shape, mode, precision, rows)
#   WHEELS=.whl bash benchmarks/gpu.sh      # first install the wheels in .whl (a machine without them)
#       (make them here: pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#        transformers==5.23.0 regex; the lent GPU's python3 has transformers 5.17, below our 5.23)
#   SMOKE=1 PLAN=all bash benchmarks/gpu.sh # CPU smoke run of every part: tiny shapes, 1 repeat, aot_eager, outputs/
#
# Budget: each plan's part limits sum under DEADLINE (340 s) with the start (about 10 s: the import check; 20 s with
# WHEELS). From the H100 runs 1-4 (benchmarks/results/gpu/): tb-eager 61-70 s for 7 models with the naive port and
# generate at 12 repeats, mbart-eager 44-47 s for 5 mbart-large models, mbart-no-logits 36 s, tb-profile 45 s; a
# transformer-base inductor compile costs about 45 s a model (warmup_s 38-52 cold) and a compiled part 20 s more
# (tb-compiled: 193 s for stock, dhicm and eadra-scratch; 111 s for stock and eadra-scratch), a tiny one 26-30 s.
# The target rows need 12 transformer-base compiles (stock and four methods, default and reduce-overhead, stock again
# for the SEA parts), about 600 s: they cannot fit one 6-minute run, nor two, so they take the first parts of three
# plans, each under 6 minutes on its own (cold caches), the issue table's rows first:
#   PLAN=1  40 + 50 + 180 + 50 = 320 s
#     tb-eager       40  transformer-base 32x256 eager: dhicm eadra-scratch dea-rhe lpea-rhe (5 models, 8 repeats)
#     mbart-eager    50  mbart-large-8x512 eager: off dhicm-finetune eadra-finetune off-no-logits (the old mbart-eager
#                        and mbart-no-logits merged: one process, one stock, 5 models as before)
#     tb-compiled   180  transformer-base compiled, default mode: dhicm eadra-scratch (time and peak memory)
#     triton-check   50  EaDRA's tiled Triton pass (implementation="triton") against the eager and the compiled pass,
#                        alone, forward + backward (benchmarks/triton_check.py; no tile sweep, TRITON_CHECK adds one;
#                        its JSON is written as it goes, so a cut keeps the dtypes done): whether "auto" should choose it
#   PLAN=2  150 + 170 = 320 s: compiled target rows
#     tb-compiled-sea 150  default mode: dea-rhe lpea-rhe (stock's graph loaded from PLAN=1's cache if still there)
#     tb-compiled-ro 170  mode="reduce-overhead" (CUDA graphs, fixed shapes): dhicm eadra-scratch
#   PLAN=3  150 + 70 + 40 + 75 = 335 s, then what the deadline leaves (compile-check, cut if need be)
#     tb-compiled-ro-sea 150  reduce-overhead: dea-rhe lpea-rhe (the last target rows)
#     tb-papers      70  transformer-base eager: off fixed-attention rel-pos rel-pos-triton rel-pos-keys localness
#                        localness-rhe (the papers' comparison methods, 8 models; reported, not judged; rel-pos-triton:
#                        Rel_Pos's Triton kernels, implementation="triton", against rel-pos's PyTorch path)
#     rel-pos-check  40  benchmarks/rel_pos_check.py: Rel_Pos's Triton kernels (rel-pos-triton) against its PyTorch
#                        path and float64 at transformer-base's attention, fp32 and bf16, and their time (issue #63)
#     tb-flex        75  benchmarks/flex_check.py, transformer-base eager on flex_attention: stock (the ratios'
#                        baseline) and dhicm eadra-scratch dea-rhe lpea-rhe, stock on SDPA beside (is flex faster at
#                        all?), 6 repeats; first LPEA's bias gradient through flex's score_mod against SDPA's (a
#                        failure is reported, the times are not judged; flex's kernels compile in its first steps,
#                        about 3 score_mods; with SMOKE=1 neither runs: no flex backward on the CPU)
#     then: compile-check (75 s: tiny model, inductor: "all", every method in one compile), tb-profile (45 s:
#     torch.profiler of 2 eager steps of off dhicm eadra-scratch eadra-scratch-eager-pass dea-rhe lpea-rhe, the
#     kernels and operators over stock's; not judged), tb-profile-compiled (45 s: the same
#     compiled, dhicm eadra-scratch, their graphs from tb-compiled's cache), tb-triton (EaDRA's tiled Triton pass in
#     an eager step), mbart-eager-pass (EaDRA's eager pass in a step at mbart-large), mbart-eager-sea (dea-rhe lpea-rhe, eadra-finetune-no-logits and the naive port at
#     mbart-large), tb-naive (the naive port and generate), tb-bf16, mbart-compiled
# Compiled graphs are cached between parts and plans: TORCHINDUCTOR_CACHE_DIR (default /tmp/gpu-sh-inductor, kept
# across calls on a warm machine) with Inductor's FX graph cache and AOTAutograd's cache on: a graph compiled by one
# part is loaded, not compiled, by a later one (stock's, tb-profile-compiled's), and Triton kernels are reused.
#
# Output: RESULTS (default benchmarks/results/gpu/<gpu>-<date>-<time>; outputs/gpu-smoke-<time> with SMOKE=1) holds
# <part>.json (overhead.py's JSON; compile_check.py's for compile-check, triton_check.py's for triton-check,
# rel_pos_check.py's for rel-pos-check,
# profile_step.py's for tb-profile and tb-profile-compiled, flex_check.py's for tb-flex), logs/<part>.log and
# logs/<part>.tsv (status line), parts.tsv (every part's status, seconds, shape, mode, precision and rows) and
# summary.json (gpu_summary.py: each target row of its TARGET_ROWS met / not met / not measured and why, every check,
# one line per part and row, tb-flex's times), whose table is printed at the end;
# `python benchmarks/gpu_summary.py RESULTS --readme README.md` then writes the README's GPU table from that one folder.
#
# Environment: PYTHON (python3), DEVICE (cuda; cpu with SMOKE=1), PLAN (1, 2, 3 or all), PLAN_ONLY=1 (print the plan,
# run nothing), DEADLINE (seconds from the start for all parts, 340: a part gets the least of its own limit times
# LIMIT_SCALE (1; 10 with SMOKE=1) and what is left, and is skipped when less than MIN_PART_S, 20, is left), PARTS
# (the part names to run, all of the plan by default), BACKEND (inductor; aot_eager with SMOKE=1), WHEELS (a folder of
# wheels to install first into /tmp/gpu-sh-site, put first on PYTHONPATH), RESUME=1 (keep the parts of RESULTS whose
# JSON exists), TORCHINDUCTOR_CACHE_DIR (above), EXTRA_PARTS (lines "name|shape|mode|precision|rows|limit_s|overhead.py
# arguments", mode eager, compiled or reduce-overhead, run after the plan's parts, e.g.
# EXTRA_PARTS='tb-no-logits|transformer-base|eager|autocast-bf16|off off-no-logits|60|--repeats 6').
set -euo pipefail

START=$SECONDS  # the deadline counts from here: wheels and the first import included
PYTHON=${PYTHON:-python3}
SMOKE=${SMOKE:-0}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[[ -f benchmarks/overhead.py ]] || { echo "gpu.sh: run it from the repository root" >&2; exit 2; }
PLAN=${PLAN:-1}
PLAN_ONLY=${PLAN_ONLY:-0}
[[ $PLAN =~ ^(1|2|3|all)$ ]] || { echo "gpu.sh: PLAN=$PLAN: expected 1, 2, 3 or all" >&2; exit 2; }
# compiled graphs cached between parts and plans (see the header)
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/gpu-sh-inductor}
export TORCHINDUCTOR_FX_GRAPH_CACHE=1 TORCHINDUCTOR_AUTOGRAD_CACHE=1

if [[ -n ${WHEELS:-} && $PLAN_ONLY != 1 ]]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-sh-site \
        "$WHEELS"/*.whl
    export PYTHONPATH="/tmp/gpu-sh-site:$PYTHONPATH"
fi

gpu=no-gpu
[[ $PLAN_ONLY == 1 ]] || gpu=$("$PYTHON" -c "import torch, transformers, hf_headattn
print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no-gpu', '/ torch', torch.__version__,
      '/ transformers', transformers.__version__)") || {
    echo "gpu.sh: $PYTHON: no torch, transformers or hf_headattn" >&2
    exit 2
}
[[ $PLAN_ONLY == 1 ]] || echo "gpu.sh: $gpu"

if [[ $SMOKE == 1 ]]; then
    DEVICE=${DEVICE:-cpu} BACKEND=${BACKEND:-aot_eager} DEADLINE=${DEADLINE:-3000} LIMIT_SCALE=${LIMIT_SCALE:-10}
    TB=tiny LARGE=tiny PRECISION=autocast-bf16
    TB_TIMING=(--repeats 1 --warmup 1) LARGE_TIMING=(--repeats 1 --warmup 1) COMPILED_TIMING=(--repeats 1 --warmup 1)
    GENERATE=(--generate-beams 2 --generate-tokens 4 --generate-repeats 1)
    CHECK_ROWS=(dhicm all)
    PROFILE_TIMING=(--warmup 1 --steps 1)
    FLEX_TIMING=(--repeats 1 --warmup 1)
    TRITON_CHECK=(--layers 2 --batch 2 --heads 2 --length 40 --repeats 1)
    KERNEL_TIMING=(--repeats 1 --warmup 0)
    RESULTS=${RESULTS:-outputs/gpu-smoke-$(date +%Y%m%d-%H%M%S)}
    export TRITON_INTERPRET=1  # the Triton kernels (EaDRA's and Rel_Pos's) on CPU tensors, as the tests run them
else
    DEVICE=${DEVICE:-cuda} BACKEND=${BACKEND:-inductor} DEADLINE=${DEADLINE:-340} LIMIT_SCALE=${LIMIT_SCALE:-1}
    TB=transformer-base LARGE=mbart-large-8x512 PRECISION=autocast-bf16
    TB_TIMING=(--repeats 8 --warmup 2) LARGE_TIMING=(--repeats 6 --warmup 2) COMPILED_TIMING=(--repeats 6 --warmup 2)
    GENERATE=(--generate-beams 4 --generate-tokens 64 --generate-repeats 2)
    read -ra CHECK_ROWS <<<"${CHECK_ROWS:-all}"  # or: off dhicm dhicm-scaled eadra dea-rhe lpea-rhe all
    PROFILE_TIMING=(--warmup 3 --steps 2)
    FLEX_TIMING=(--repeats 6 --warmup 2)
    read -ra TRITON_CHECK <<<"${TRITON_CHECK:-}"  # e.g. --tiles 32x64 64x32 128x64: more tile shapes timed
    KERNEL_TIMING=(--repeats 10 --warmup 3)
    gpu=${gpu%% / torch*}
    slug=$(tr -cs 'a-z0-9' '-' <<<"${gpu,,}" | sed 's/-$//')  # e.g. nvidia-h100-80gb-hbm3
    RESULTS=${RESULTS:-benchmarks/results/gpu/$slug-$(date +%Y%m%d-%H%M)}
fi
EXTRA_PARTS=${EXTRA_PARTS:-}
MIN_PART_S=${MIN_PART_S:-20}
PARTS=${PARTS:-}
RESUME=${RESUME:-0}
[[ $PLAN_ONLY == 1 ]] || mkdir -p "$RESULTS/logs"
[[ $PLAN_ONLY == 1 ]] || echo "gpu.sh: results in $RESULTS (PLAN=$PLAN, device $DEVICE, backend $BACKEND, deadline \
$DEADLINE s)"

ORDER=() ALL_ORDER=()
SECTION=extra  # the plan of the parts that follow (set before each plan's parts)

# part NAME SHAPE MODE PRECISION ROWS LIMIT_S -- COMMAND...: run COMMAND under the part's time limit, record its status
part() {
    local name=$1 shape=$2 mode=$3 precision=$4 rows=$5 limit=$6 status seconds=0 rc=0
    shift 7
    ALL_ORDER+=("$name")  # (parts.tsv: the parts of every plan found in RESULTS, e.g. PLAN=1's after a PLAN=2 run)
    [[ $PLAN == all || $SECTION == "$PLAN" || $SECTION == extra ]] || return 0
    ORDER+=("$name")
    [[ -z $PARTS || " $PARTS " == *" $name "* ]] || return 0
    if [[ $PLAN_ONLY == 1 ]]; then
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$SECTION" "$limit" "$shape" "$mode" "$precision" "$rows"
        return 0
    fi
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
    [[ $mode == eager ]] || compile=(--compile --compile-backend "$BACKEND")
    [[ $mode != reduce-overhead ]] || compile+=(--compile-mode reduce-overhead)  # CUDA graphs
    # shellcheck disable=SC2086  # rows: one word each
    part "$name" "$shape" "$mode" "$precision" "$rows" "$limit" -- "$PYTHON" benchmarks/overhead.py --shape "$shape" \
        --device "$DEVICE" --precision "$precision" --rows $rows "${compile[@]}" "$@" --out "$RESULTS/$name.json"
}

# ---- PLAN=1: the issue table's rows (see the budget above) ----
SECTION=1
timing tb-eager "$TB" eager "$PRECISION" "dhicm eadra-scratch dea-rhe lpea-rhe" 40 "${TB_TIMING[@]}"
timing mbart-eager "$LARGE" eager "$PRECISION" "off dhicm-finetune eadra-finetune off-no-logits" 50 "${LARGE_TIMING[@]}"
timing tb-compiled "$TB" compiled "$PRECISION" "dhicm eadra-scratch" 180 "${COMPILED_TIMING[@]}"
part triton-check stacked triton fp32+bf16 "triton eager compiled" 50 -- "$PYTHON" benchmarks/triton_check.py \
    --device "$DEVICE" "${TRITON_CHECK[@]}" --out "$RESULTS/triton-check.json"
# ---- PLAN=2: the other compiled target rows ----
SECTION=2
timing tb-compiled-sea "$TB" compiled "$PRECISION" "dea-rhe lpea-rhe" 150 "${COMPILED_TIMING[@]}"
timing tb-compiled-ro "$TB" reduce-overhead "$PRECISION" "dhicm eadra-scratch" 170 "${COMPILED_TIMING[@]}"
# ---- PLAN=3: the last reduce-overhead rows, flex attention, the compile check, then the profiles and the rest ----
SECTION=3
timing tb-compiled-ro-sea "$TB" reduce-overhead "$PRECISION" "dea-rhe lpea-rhe" 150 "${COMPILED_TIMING[@]}"
# the papers' comparison methods (issue #54; not judged: the papers' own costs are Rel_Pos 1.034x, Localness 1.025x)
timing tb-papers "$TB" eager "$PRECISION" \
    "off fixed-attention rel-pos rel-pos-triton rel-pos-keys localness localness-rhe" 70 "${TB_TIMING[@]}"
part rel-pos-check "$TB" rel-pos-check "fp32+bf16" rel-pos-triton 40 -- "$PYTHON" benchmarks/rel_pos_check.py \
    --shape "$TB" --device "$DEVICE" "${KERNEL_TIMING[@]}" --out "$RESULTS/rel-pos-check.json"
FLEX_ROWS=(dhicm eadra-scratch dea-rhe lpea-rhe)  # (and stock on SDPA, row stock-sdpa)
part tb-flex "$TB" flex "$PRECISION" "${FLEX_ROWS[*]}" 75 -- "$PYTHON" benchmarks/flex_check.py --shape "$TB" \
    --device "$DEVICE" --precision "$PRECISION" --rows "${FLEX_ROWS[@]}" "${FLEX_TIMING[@]}" \
    --out "$RESULTS/tb-flex.json"
part compile-check tiny check "$PRECISION" "${CHECK_ROWS[*]}" 75 -- "$PYTHON" benchmarks/compile_check.py \
    --device "$DEVICE" --backend "$BACKEND" --precision "$PRECISION" --rows "${CHECK_ROWS[@]}" \
    --out "$RESULTS/compile-check.json"
PROFILE_ROWS=(off dhicm eadra-scratch eadra-scratch-eager-pass dea-rhe lpea-rhe)
part tb-profile "$TB" profile "$PRECISION" "${PROFILE_ROWS[*]}" 45 -- "$PYTHON" benchmarks/profile_step.py \
    --shape "$TB" --device "$DEVICE" --precision "$PRECISION" --rows "${PROFILE_ROWS[@]}" "${PROFILE_TIMING[@]}" \
    --out "$RESULTS/tb-profile.json"
part tb-profile-compiled "$TB" profile "$PRECISION" "dhicm eadra-scratch" 45 -- "$PYTHON" benchmarks/profile_step.py \
    --shape "$TB" --device "$DEVICE" --precision "$PRECISION" --rows dhicm eadra-scratch --compile "$BACKEND" \
    "${PROFILE_TIMING[@]}" --out "$RESULTS/tb-profile-compiled.json"
timing tb-triton "$TB" eager "$PRECISION" "off eadra-scratch eadra-scratch-triton" 40 "${TB_TIMING[@]}"
timing mbart-eager-pass "$LARGE" eager "$PRECISION" "off eadra-finetune eadra-finetune-eager-pass" 40 "${LARGE_TIMING[@]}"
timing mbart-eager-sea "$LARGE" eager "$PRECISION" "dea-rhe lpea-rhe eadra-finetune-no-logits" 60 --naive "${LARGE_TIMING[@]}"
timing tb-naive "$TB" eager "$PRECISION" "off dhicm eadra-scratch-eager-pass" 60 --naive \
    "${TB_TIMING[@]}" "${GENERATE[@]}"
timing tb-bf16 "$TB" eager bf16 "off off-no-logits" 40 "${TB_TIMING[@]}"
timing mbart-compiled "$LARGE" compiled "$PRECISION" "eadra-finetune" 150 "${COMPILED_TIMING[@]}"

# ---- EXTRA_PARTS: more parts, one a line, in every plan ----
SECTION=extra
while IFS='|' read -r name shape mode precision rows limit args; do
    [[ -n $name ]] || continue
    # shellcheck disable=SC2086  # args: overhead.py's arguments, split on spaces
    timing "$name" "$shape" "$mode" "$precision" "$rows" "$limit" $args
done <<<"$EXTRA_PARTS"

[[ $PLAN_ONLY != 1 ]] || exit 0
for name in "${ALL_ORDER[@]}"; do
    [[ ! -f $RESULTS/logs/$name.tsv ]] || cat "$RESULTS/logs/$name.tsv"
done >"$RESULTS/parts.tsv"
"$PYTHON" benchmarks/gpu_summary.py "$RESULTS"
echo "gpu.sh: $((SECONDS - START)) s; summary in $RESULTS/summary.json"
