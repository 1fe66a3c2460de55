#!/usr/bin/env bash
# Runs the LibriSpeech recipe with several training seeds on one data preparation and prints each seed's WER
# and the mean, min, max and max / min over seeds: one seed is an anecdote. How much of that spread a test set of
# a given size shows by chance: scripts/spread_by_test_size.py WORK.
#
#   scripts/seed_spread.sh [--conf FILE] [--seeds "1 2 3 4 5"] [--work-dir DIR] [--arch NAME] [--jobs N]
#
# --jobs N trains N seeds at once, each with OMP_NUM_THREADS = (CPU cores / N) unless OMP_NUM_THREADS is set
# (on a 2-core CPU, --jobs 2 finishes 5 seeds sooner than one at a time; on a GPU leave it at 1). Two runs of this
# script at once share the cores too: give each its OMP_NUM_THREADS (e.g. 1 and 1 on 2 cores), else each job takes
# all of them and the threads fight (on 2 cores, training ran 6x slower).
# Defaults: conf recipes/librispeech/conf/mini.sh, seeds 1-5, work directory exp/seed_spread/<conf name>.
# Stages 0-1 (data) run once into WORK/data; stages 2-5 run per seed into WORK/seed<N> (log in WORK/seed<N>/run.log).
# A seed that already has its WER table is not re-run (delete WORK/seed<N> to redo it); an interrupted seed
# resumes from its last checkpoint. Every other variable of the recipe (MODEL_ARGS, LR, TRAIN_ARGS, ...) is passed
# through. The settings (the conf file, the values of the variables it reads, TRAIN_ARGS, DECODE_ARGS, --arch) are
# recorded in WORK/settings.txt: a later run into the same WORK with other settings is refused, so that one summary
# never mixes seeds trained differently. Exits non-zero, with the failing seed named, when any seed did not
# produce a WER for every evaluation set. The summary is also written to WORK/seed_spread.md.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
conf="$repo/recipes/librispeech/conf/mini.sh"
seeds="1 2 3 4 5"
jobs=1
work=
arch_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --conf) conf="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
    --work-dir) work="$2"; shift 2 ;;
    --arch) arch_args=(--arch "$2"); shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    *) echo "unknown argument: $1 (expected --conf, --seeds, --work-dir, --arch, --jobs)" >&2; exit 2 ;;
  esac
done
[[ -f "$conf" ]] || { echo "no such conf file: $conf" >&2; exit 2; }
for seed in $seeds; do
  [[ "$seed" =~ ^[0-9]+$ ]] || { echo "--seeds: '$seed' is not a non-negative integer" >&2; exit 2; }
done
[[ -n "${seeds// /}" ]] || { echo "--seeds: no seed given" >&2; exit 2; }
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "--jobs must be a positive integer, got '$jobs'" >&2; exit 2; }
threads="${OMP_NUM_THREADS:-$(( $(nproc) / jobs > 0 ? $(nproc) / jobs : 1 ))}"
work="${work:-exp/seed_spread/$(basename "$conf" .sh)}"
mkdir -p "$work"
work="$(CDPATH= cd -- "$work" && pwd)"
recipe=(bash "$repo/recipes/librispeech/run.sh" --conf "$conf" "${arch_args[@]}")
log() { echo "[$(date '+%H:%M:%S')] $*"; }

# what the seeds are trained with: the conf, and every variable it reads (${NAME:-default}) as set here
settings="$(cat "$conf"
  for name in $(grep -o '\${[A-Z_][A-Z0-9_]*:-' "$conf" | sed 's/^\${//; s/:-$//' | sort -u) TRAIN_ARGS DECODE_ARGS; do
    echo "$name=${!name-(unset)}"
  done
  echo "arch=${arch_args[*]-}")"
if [[ -f "$work/settings.txt" ]]; then
  if [[ "$(cat "$work/settings.txt")" != "$settings" ]]; then
    diff <(cat "$work/settings.txt") <(echo "$settings") >&2 || true
    echo "$work was run with other settings (above: < then, > now): use another --work-dir" >&2
    exit 2
  fi
else
  echo "$settings" > "$work/settings.txt"
fi

log "data: stages 0-1 -> $work/data"
WORK_DIR="$work" DATA_DIR="$work/data" "${recipe[@]}" --stop-stage 1

# train_seed SEED: stages 2-5 of one seed; returns non-zero (after printing its log's tail) if the recipe failed
train_seed() {
  local seed="$1" seed_dir="$work/seed$1" start=$SECONDS
  mkdir -p "$seed_dir"
  log "seed $seed: stages 2-5 -> $seed_dir (log: $seed_dir/run.log)"
  if ! OMP_NUM_THREADS="$threads" WORK_DIR="$seed_dir" DATA_DIR="$work/data" SEED="$seed" "${recipe[@]}" --stage 2 \
      > "$seed_dir/run.log" 2>&1; then
    tail -n 20 "$seed_dir/run.log" >&2
    echo "seed $seed failed: see $seed_dir/run.log" >&2
    return 1
  fi
  log "seed $seed: done in $((SECONDS - start)) s: $(tail -n 1 "$seed_dir"/wer_*.md)"
}

failed=0
running=0
for seed in $seeds; do
  if compgen -G "$work/seed$seed/wer_*.md" > /dev/null; then
    log "seed $seed: $(ls "$work/seed$seed"/wer_*.md) exists, not re-run"
    continue
  fi
  if [[ $running -ge $jobs ]]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
  train_seed "$seed" &
  running=$((running + 1))
done
while [[ $running -gt 0 ]]; do
  wait -n || failed=1
  running=$((running - 1))
done
[[ $failed == 0 ]] || { echo "at least one seed failed (above); no summary" >&2; exit 1; }

# One row per seed from each seed's WER table (| model | set1 | set2 | ...), then mean, min and max per column.
summary="$work/seed_spread.md"
python_bin="${PYTHON_BIN:-}"
[[ -z "$python_bin" && -x "$repo/.venv/bin/python" ]] && python_bin="$repo/.venv/bin"
"${python_bin:+$python_bin/}python" - "$work" $seeds <<'EOF' | tee "$summary"
import statistics
import sys
from pathlib import Path

work, seeds = Path(sys.argv[1]), sys.argv[2:]
header, rows = None, []
for seed in seeds:
    # stage 5's table; stages 6-8 write wer_<arch>_lm_<lm arch>.md beside it
    tables = sorted(t for t in (work / f"seed{seed}").glob("wer_*.md") if "_lm_" not in t.name)
    if len(tables) != 1:
        sys.exit(f"seed {seed}: expected one WER table in {work / f'seed{seed}'}, found {len(tables)}")
    lines = tables[0].read_text().splitlines()
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    if header is None:
        header = [c.strip() for c in lines[0].strip("|").split("|")]
    elif [c.strip() for c in lines[0].strip("|").split("|")] != header:
        sys.exit(f"seed {seed}: {tables[0]} scores other sets than the first seed ({lines[0]})")
    try:
        rows.append((seed, cells[0], [float(c) for c in cells[1:]]))
    except ValueError:
        sys.exit(f"seed {seed}: a WER in {tables[0]} is not a number: {lines[2]}")
print(f"| seed | {' | '.join(header)} |")
print("|---|" + "---|" * len(header))
for seed, model, wers in rows:
    print(f"| {seed} | {model} | {' | '.join(f'{w:.2f}' for w in wers)} |")
columns = list(zip(*(wers for _, _, wers in rows)))
for name, stat in (("mean", statistics.fmean), ("min", min), ("max", max)):
    print(f"| {name} | {len(rows)} seeds | {' | '.join(f'{stat(c):.2f}' for c in columns)} |")
ratios = [f"{max(c) / min(c):.2f}" if min(c) > 0 else "-" for c in columns]  # worst / best
print(f"| max / min | {len(rows)} seeds | {' | '.join(ratios)} |")
EOF
