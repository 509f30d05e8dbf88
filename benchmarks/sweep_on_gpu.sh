#!/usr/bin/env bash
# The sweep's boards (scoreboard rules SW and D) on one GPU machine, in calls that resume: the six
# seeded boards and two small-data boards side by side, two scoreboard processes that never share a
# board file, each bringing its boards back into $OUT (benchmarks/boards_on_gpu.sh).
#
#   benchmarks/sweep_on_gpu.sh            # the same command resumes: finished units do not run again
#
# - the six seeded boards: the sweep (sf_sweep: seven schedule-free runs on every row) and leadline
#   at seeds 0-2 with this version's defaults (--refresh-defaults: a unit of the earlier defaults runs
#   again once, then stays);
# - the small boards (320 rows): the sweep, and leadline (this version's defaults, as above), schedule-free
#   and the recipe at seeds 0-2.
# Environment: STOP (seconds after which no unit starts; default 500), TIMEOUT (one unit's seconds;
# default 560), SEEDED (the seeded boards, TASK:REGIME; default the six), SEEDED_PARALLEL (runs side by
# side on each seeded board; default 1), SMALL_PARALLEL (the same on each small board; default 2 on a
# card over 100 GB, else 1): 22 training processes with 8 judges on an 80 GB card ran 40 of the
# sweep's 56 runs out of memory, RESULTS (default
# /root/results: outside the tree, so a later call resumes from it), MODEL, DATA as boards_on_gpu.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
export MODEL=${MODEL:-/tmp/smol_hf} STOP=${STOP:-500} TIMEOUT=${TIMEOUT:-560} RESULTS=${RESULTS:-/root/results}
mkdir -p "$RESULTS"
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
if [[ ! -d $MODEL ]]; then  # once, before the two scripts that would each write it
  PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} python3 benchmarks/gguf_to_folder.py /root/assets/smol.gguf "$MODEL" || exit 1
fi
card_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
SEEDED_PARALLEL=${SEEDED_PARALLEL:-1}
SMALL_PARALLEL=${SMALL_PARALLEL:-$(( ${card_mib:-0} > 100000 ? 2 : 1 ))}
SEEDED=${SEEDED:-"debian_sections:lora man_sections:lora py_modules:lora code_trace:lora gsm_symbolic:full debian_summary:long"}
BOARDS=$SEEDED ARMS=sf_sweep,leadline SEEDS=3 PARALLEL=$SEEDED_PARALLEL PACK=seeded \
  EXTRA="--refresh-defaults leadline" benchmarks/boards_on_gpu.sh > /tmp/seeded.log 2>&1 &
BOARDS="debian_sections:small man_sections:small" ARMS=sf_sweep,leadline,schedulefree,recipe SEEDS=3 PARALLEL=$SMALL_PARALLEL \
  PACK=small EXTRA="--refresh-defaults leadline" benchmarks/boards_on_gpu.sh > /tmp/small.log 2>&1 &
wait
tail -n 30 /tmp/seeded.log /tmp/small.log
