#!/usr/bin/env bash
# The device runs still owed, one named part per device call (each under the 10-minute limit).
# Run from the repo root on the GPU machine; results go to $OUT. Parts, in the order that closes
# issues (benchmarks/README.md says why):
#   setup1                      carry .device/part1: the first half of the model and the gguf wheel
#   setup2                      carry .device/part2: the rest, joined, gguf installed, the HF folder written
#   gpu_tests                   the @pytest.mark.gpu tests (~30 s)
#   notrace                     issue 6: the run after the rate phases against a fresh one, real model (~60 s)
#   e8                          issue 6: E8 full with the diagnostic arms and the state check (~250 s)
#   e8_race                     issue 6: E8 full, one extra arm (~220 s); session 8 ran it at 4e3182f, whose look-ahead raced the warmup
#   e8w                         issue 6: the warmup question, five warmups at E8's rate, TF32 on and off (~200 s)
#   e8o                         issue 6: the warmup against the constant on three other orders of E8's rows (~140 s)
#   race                        issue 6: E11 untrained + race() on the quick plan's grid, paired with session 7's recipe (allow 560 s)
#   e11_null                    issue 6: E11's race() again under the decay-as-null ending, paired with session 9's
#                               untrained and recipe rows (~260 s)
#   e11_sched                   issue 6: E11's plan + LookaheadSchedule on the uncapped card under the decay-as-null
#                               ending, paired with session 9's untrained and recipe rows (~280 s; the 6 GB arm: e11_sched_cap)
#   e11_sched_cap               issue 6: the same arm with the process held to 6 GB (~290 s)
#   dist                        issue 9: one-GPU derive + scaleout (~160 s)
#   dist2                       issue 9 on nvidia-h200-x2: derive on 1 GPU, on 2 under DDP and under fully_shard,
#                               then compare (R1-R4, R7); the train arms (R5) after it, `distributed_derive.py`'s docstring
#   mem MODE CARD SEQ           issue 4: one memory_ramp case, e.g. `mem lora16 24 512` (~170 s);
#                               MEM_CHECKS=R1,R2,R5 (say) runs fewer of its rules (default: all);
#                               MEM_ALLOC=expandable_segments:True runs it under that allocator setting
#                               (the fix the ramp names when 1 row only fits with the allocator's retry)
#   noise_truth                 issue 5 (resolved with a miss): debian's draws against the brute force again (~150 s)
# Several parts in one call: `bash benchmarks/device_next.sh setup1 gpu_tests`.
set -u
OUT=${OUT:-/tmp/out}
export PYTHONPATH=src
M=/root/assets/smol_hf
while [ $# -gt 0 ]; do
  part=$1; shift
  case $part in
    setup1)
      mkdir -p /root/assets && cp -r .device/part1/. /root/assets/ ;;
    setup2)
      mkdir -p /root/assets && cp -r .device/part2/. /root/assets/ \
        && (cd /root/assets && cat smol.gguf.part-* > smol.gguf && rm smol.gguf.part-* \
            && python3 -m pip install -q --no-index --no-deps gguf-*.whl) \
        && python3 benchmarks/gguf_to_folder.py /root/assets/smol.gguf $M > "$OUT/gguf.log" 2>&1
      tail -1 "$OUT/gguf.log" ;;
    gpu_tests)
      timeout 150 python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tail -6 | tee "$OUT/gpu_tests.txt" ;;
    notrace)
      timeout 200 python3 benchmarks/phases_leave_no_trace.py --model $M --out "$OUT/phases_leave_no_trace_cuda.json" 2>&1 | tail -2 ;;
    e8)
      timeout 290 python3 benchmarks/rate_lookahead.py --model $M --experiment e8 --modes full --out "$OUT/rate_e8_full.json" > "$OUT/e8.log" 2>&1
      tail -6 "$OUT/e8.log" ;;
    e8_race)
      timeout 290 python3 benchmarks/rate_lookahead.py --model $M --experiment e8 --modes full --e8-extra lookahead_constant \
        --out "$OUT/rate_e8_full_warmup_race.json" > "$OUT/e8_race.log" 2>&1
      tail -4 "$OUT/e8_race.log" ;;
    e8w)
      timeout 150 python3 benchmarks/e8_warmup.py --model $M --data-dir /root/assets/data --judge 256 --out "$OUT/e8_warmup_tf32.json" 2>&1 | grep -v Loading | tail -5
      timeout 150 python3 benchmarks/e8_warmup.py --model $M --data-dir /root/assets/data --judge 256 --no-tf32 --out "$OUT/e8_warmup_fp32.json" 2>&1 | grep -v Loading | tail -5 ;;
    e8o)
      for k in 1 2 3; do
        timeout 60 python3 benchmarks/e8_warmup.py --model $M --data-dir /root/assets/data --judge 256 --arms constant,warmup \
          --order-seed $k --out "$OUT/e8_warmup_order$k.json" 2>&1 | grep -v Loading | tail -1
      done ;;
    race)
      timeout 560 python3 benchmarks/rate_lookahead.py --model $M --experiment e11 --e11-arms untrained,quick_race --max-seconds 200 \
        --e11-baselines benchmarks/results/rate_e11_race_s7.json \
        --out "$OUT/rate_e11_race.json" > "$OUT/e11_race.log" 2>&1
      tail -6 "$OUT/e11_race.log" ;;
    e11_null)
      timeout 560 python3 benchmarks/rate_lookahead.py --model $M --experiment e11 --e11-arms quick_race --max-seconds 200 \
        --e11-baselines benchmarks/results/rate_e11_race_s9.json \
        --out "$OUT/rate_e11_null.json" > "$OUT/e11_null.log" 2>&1
      tail -6 "$OUT/e11_null.log" ;;
    e11_sched)
      timeout 400 python3 benchmarks/rate_lookahead.py --model $M --experiment e11 --e11-arms plan_schedule --cap-gb 0 --max-seconds 400 \
        --e11-baselines benchmarks/results/rate_e11_race_s9.json \
        --out "$OUT/rate_e11_sched.json" > "$OUT/e11_sched.log" 2>&1
      tail -6 "$OUT/e11_sched.log" ;;
    e11_sched_cap)
      timeout 400 python3 benchmarks/rate_lookahead.py --model $M --experiment e11 --e11-arms plan_schedule_cap --cap-gb 6 --max-seconds 400 \
        --e11-baselines benchmarks/results/rate_e11_race_s9.json \
        --out "$OUT/rate_e11_sched_cap.json" > "$OUT/e11_sched_cap.log" 2>&1
      tail -6 "$OUT/e11_sched_cap.log" ;;
    dist)
      mkdir -p "$OUT/dist"
      timeout 200 python3 benchmarks/distributed_derive.py derive --model $M --out "$OUT/dist/derive_1.json" > "$OUT/dist/derive.log" 2>&1
      timeout 330 python3 benchmarks/distributed_derive.py scaleout --model $M --plan "$OUT/dist/derive_1.json" --out "$OUT/dist/scaleout.json" > "$OUT/dist/scaleout.log" 2>&1
      tail -n 3 "$OUT/dist/derive.log" "$OUT/dist/scaleout.log" ;;
    dist2)
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      W="$OUT/dist2"; mkdir -p "$W"
      timeout 200 python3 benchmarks/distributed_derive.py derive --model $M --out "$W/derive_1.json" > "$W/derive_1.log" 2>&1
      timeout 200 python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/distributed_derive.py derive --model $M \
        --out "$W/derive_2.json" > "$W/derive_2.log" 2>&1
      timeout 150 python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/distributed_derive.py derive --model $M \
        --shard fsdp2 --out "$W/derive_2_fsdp.json" > "$W/derive_2_fsdp.log" 2>&1
      python3 benchmarks/distributed_derive.py compare --dir "$W" --out "$W/compare.json" > "$W/compare.log" 2>&1
      tail -n 2 "$W"/*.log ;;
    noise_truth)
      timeout 300 python3 benchmarks/noise_probe.py --model $M --task debian_sections --sections A,B --out "$OUT/noise_debian_truth.json" 2>&1 | grep -v USDT | tail -4 ;;
    mem)
      mode=$1 card=$2 seq=$3; shift 3
      tag=${mode}_${card}gb_seq${seq}${MEM_ALLOC:+_expandable}
      env ${MEM_ALLOC:+PYTORCH_CUDA_ALLOC_CONF=$MEM_ALLOC} timeout 500 python3 benchmarks/memory_ramp.py --modes "$mode" --cards "$card" --seqs "$seq" \
        --checks "${MEM_CHECKS:-R1,R2,R3,R4,R5}" --out "$OUT/memory_ramp_${tag}.json" > "$OUT/mem_${tag}.log" 2>&1
      tail -4 "$OUT/mem_${tag}.log" ;;
    *)
      echo "unknown part: $part (see the header)"; exit 2 ;;
  esac
done
