#!/usr/bin/env bash
# Run several scoreboard boards side by side on one GPU machine, each board a process whose arms
# run as parallel processes, and bring every board's JSON back as one archive.
#
#   BOARDS="debian_sections:lora gsm_symbolic:full man_sections:short" ARMS=recipe,schedulefree,leadline \
#       benchmarks/boards_on_gpu.sh
#
# Six boards at three seeds: first each board's seed-0 recipe and leadline alone on the GPU (the
# cost ratio), then the rest side by side (seeds 1 and 2, schedule-free, the A/A control beside the others):
#   B="debian_sections:lora man_sections:lora gsm_symbolic:lora debian_summary:lora py_modules:lora code_trace:lora"
#   BOARDS=$B SERIAL=1 ARMS=recipe,leadline benchmarks/boards_on_gpu.sh
#   BOARDS=$B SEEDS=3 PARALLEL=2 benchmarks/boards_on_gpu.sh
#
# Each BOARDS entry is TASK:REGIME (benchmarks/scoreboard.py --regime). Environment:
#   ARMS       the arms of every board (default: recipe, schedulefree, schedulefree_again, leadline: the quick
#              board and its A/A control, which runs beside the board's other processes)
#   SEEDS      the seeded arms (leadline, schedulefree, the recipe) at seeds 0..SEEDS-1 (scoreboard.py --seeds;
#              default 1)
#   PARALLEL   arms side by side within a board (default 3)
#   STOP       no new unit starts after this many seconds (default 420)
#   SERIAL     1: the boards one after another, each arm alone on the GPU (PARALLEL is then 1 and every
#              unit is recorded as timed alone: the cost ratios the README quotes)
#   CARD       hold the card to this many GB (scoreboard.py --card-gb; a held card takes the GPU alone)
#   MODEL      a Hugging Face folder; written once from /root/assets/smol.gguf when missing
#   DATA       the shared data folder (default /root/assets/data)
#   RESULTS    where the boards' JSON files are written (default benchmarks/results; a folder outside the
#              tree, such as /root/results, keeps them across calls that each copy the tree anew, starting
#              from the tree's file where it has none); with $OUT set
#              (the device tool), they are also packed into $OUT/$PACK.tgz every 20 s and at the end,
#              so a call cut at its limit still brings back every finished unit.
#   PACK       the archive's name (default boards): two of these scripts side by side in one call
#              (boards with other ARMS) each bring back their own
#   TIMEOUT    the seconds one unit may run (scoreboard.py --timeout; default 400)
#   JUDGE_TOKENS  the most tokens a judge's scoring pass holds logits for (scoreboard.py --judge-tokens;
#              default 8192: each board's judge holds float32 logits over the whole vocabulary, and
#              eight judges at 64 rows a pass took most of an 80 GB card)
# A board file already under RESULTS resumes: its finished units do not run again.
set -uo pipefail

MODEL=${MODEL:-/tmp/smol_hf}
DATA=${DATA:-/root/assets/data}
RESULTS=${RESULTS:-benchmarks/results}
ARMS=${ARMS:-recipe,schedulefree,schedulefree_again,leadline}
SEEDS=${SEEDS:-1}
PARALLEL=${PARALLEL:-3}
SERIAL=${SERIAL:-0}
[[ $SERIAL == 1 ]] && PARALLEL=1
STOP=${STOP:-420}
PACK=${PACK:-boards}
TIMEOUT=${TIMEOUT:-400}
JUDGE_TOKENS=${JUDGE_TOKENS:-8192}
PY=${PYTHON:-python3}
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

if [[ ! -d $MODEL ]]; then
  [[ -f /root/assets/smol.gguf ]] || { echo "no $MODEL and no /root/assets/smol.gguf to write it from" >&2; exit 2; }
  $PY benchmarks/gguf_to_folder.py /root/assets/smol.gguf "$MODEL" || exit 1
fi

files=()  # the boards this call runs, and only those: an archive of every board would carry back stale copies
for b in ${BOARDS:?BOARDS=TASK:REGIME ...}; do
  task=${b%%:*} regime=${b#*:}
  name=scoreboard_${task}
  [[ $regime == lora ]] || name+=_${regime}
  [[ -n ${CARD:-} ]] && name+=_${CARD}gb
  files+=("$name.json")
done
pack() {  # the boards written so far, into $OUT (the device tool brings it back)
  [[ -n ${OUT:-} ]] || return 0
  (cd "$RESULTS" && tar czf "$OUT/$PACK.tgz.tmp" "${files[@]}" 2>/dev/null; mv "$OUT/$PACK.tgz.tmp" "$OUT/$PACK.tgz")
}

board() {  # one board, its log under /tmp
  local task=${1%%:*} regime=${1#*:} alone=() left=$((STOP - SECONDS))  # STOP counts from this script's start
  [[ $SERIAL == 1 ]] && alone=(--alone)
  (( left > 0 )) || { echo "$1 not started: STOP reached" > "/tmp/board_${task}_${regime}.log"; return; }
  local name=scoreboard_${task}
  [[ $regime == lora ]] || name+=_${regime}
  [[ -n ${CARD:-} ]] && name+=_${CARD}gb
  # a results folder outside the tree (a later call's copy of the tree would overwrite it) starts from the tree's file
  [[ -f $RESULTS/$name.json || ! -f benchmarks/results/$name.json ]] || cp "benchmarks/results/$name.json" "$RESULTS/"
  $PY benchmarks/scoreboard.py --task "$task" --regime "$regime" --model "$MODEL" --data-dir "$DATA" \
      --out "$RESULTS/$name.json" \
      --arms "$ARMS" --seeds "$SEEDS" --parallel "$PARALLEL" --em-rows 100 --stop-after "$left" --timeout "$TIMEOUT" --judge-tokens "$JUDGE_TOKENS" --work "/tmp/scoreboard_$regime" \
      ${CARD:+--card-gb $CARD} "${alone[@]}" ${EXTRA:-} > "/tmp/board_${task}_${regime}.log" 2>&1
}
if [[ $SERIAL == 1 ]]; then
  (for b in $BOARDS; do board "$b"; done) &
else
  for b in $BOARDS; do board "$b" & done
fi
while [[ -n $(jobs -rp) ]]; do
  sleep 20
  pack
  for b in $BOARDS; do tail -qn 1 "/tmp/board_${b%%:*}_${b#*:}.log" | cut -c1-160; done
done
wait
pack
if [[ -n ${OUT:-} ]]; then
  tar czf "$OUT/${PACK}_logs.tgz" /tmp/board_*.log /tmp/scoreboard_*/*/*.log 2>/dev/null
fi
for b in $BOARDS; do grep -h " accuracy \| test_ce \|FAILED\|raised" "/tmp/board_${b%%:*}_${b#*:}.log"; done
