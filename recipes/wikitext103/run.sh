#!/usr/bin/env bash
# SPADE language model on WikiText-103 (SPADE paper section 4.2, appendix C.3), stage by stage.
#
#   recipes/wikitext103/run.sh [--stage N] [--stop-stage N] [--arch spade_lm_wiki103|local_lm_wiki103|spade_lm]
#
# Stages: 0 download WikiText-103 (skipped when present), 1 fairseq-preprocess, 2 fairseq-train (Baevski & Auli's
# adaptive-input recipe, 286k updates of 3072 tokens), 3 fairseq-eval-lm on valid and test (sequence 3072,
# context window 400), 4 print a markdown perplexity table. Every stage can be re-run on its own.
#
# Environment: DATA_DIR (raw wiki.*.tokens; default data/wikitext-103), WORK_DIR (default exp/wikitext103),
# TRAIN_ARGS (extra fairseq-train arguments, e.g. --max-update 1000), EVAL_ARGS, TOKENS_PER_SAMPLE (3072),
# CONTEXT_WINDOW (400), PYTHON_BIN (directory of the fairseq-* commands; default: .venv/bin if present).
# NPROC (default 1): stage 2 trains with NPROC processes (one per GPU) under torchrun, each update then takes
# NPROC x 3 (--update-freq) batches of TOKENS_PER_SAMPLE tokens; NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT for
# several nodes (recipes/common.sh). On CPU add --cpu --distributed-backend gloo to TRAIN_ARGS.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
stage=0
stop_stage=4
arch=spade_lm_wiki103
recipe_options="--arch"
recipe_option() { arch="$2"; }  # --arch NAME
# shellcheck source=../common.sh
source "$repo/recipes/common.sh" "$@"  # the command line (and the shared settings)
data_dir="${DATA_DIR:-data/wikitext-103}"
work_dir="${WORK_DIR:-exp/wikitext103}"
tokens_per_sample="${TOKENS_PER_SAMPLE:-3072}"
context_window="${CONTEXT_WINDOW:-400}"
data_bin="$work_dir/data-bin"
save_dir="$work_dir/checkpoints/$arch"

[[ "$tokens_per_sample" =~ ^[1-9][0-9]*$ ]] ||
  { echo "TOKENS_PER_SAMPLE must be a positive integer, got '$tokens_per_sample'" >&2; exit 2; }
[[ "$context_window" =~ ^[0-9]+$ ]] ||
  { echo "CONTEXT_WINDOW must be a non-negative integer, got '$context_window'" >&2; exit 2; }
# eval-lm scores TOKENS_PER_SAMPLE - CONTEXT_WINDOW new tokens per block (fairseq fails on "negative dimensions")
if [[ $stage -le 3 && $stop_stage -ge 3 && "$context_window" -ge "$tokens_per_sample" ]]; then
  echo "CONTEXT_WINDOW ($context_window) must be smaller than TOKENS_PER_SAMPLE ($tokens_per_sample)" >&2; exit 2
fi

# scored_tokens LOG: the number of tokens fairseq-eval-lm scored in LOG; fails naming LOG when there are none
# (eval-lm then still prints "Evaluated 0 tokens ... Perplexity: 1.00" and exits 0).
scored_tokens() {
  local tokens
  tokens="$({ grep -o 'Evaluated [0-9,]* tokens' "$1" || true; } | tail -1 | cut -d' ' -f2 | tr -d ,)"
  [[ -n "$tokens" && "$tokens" -gt 0 ]] || {
    echo "no token was scored in $1 (was TOKENS_PER_SAMPLE longer than the split or than the model was trained" \
      "on?)" >&2; return 1; }
  echo "$tokens"
}

if [[ $stage -le 0 && $stop_stage -ge 0 ]]; then
  if [[ -f "$data_dir/wiki.train.tokens" ]]; then
    log "stage 0: $data_dir already has WikiText-103, skipping the download"
  else
    log "stage 0: downloading WikiText-103 into $data_dir"
    mkdir -p "$data_dir"
    url=https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip
    tmp="$(mktemp -d)"
    curl -fL --retry 3 -o "$tmp/wikitext-103-v1.zip" "$url"
    unzip -q "$tmp/wikitext-103-v1.zip" -d "$tmp"
    mv "$tmp"/wikitext-103/wiki.*.tokens "$data_dir"/
    rm -rf "$tmp"
  fi
fi

if [[ $stage -le 1 && $stop_stage -ge 1 ]]; then
  log "stage 1: fairseq-preprocess $data_dir -> $data_bin"
  for split in train valid test; do
    [[ -s "$data_dir/wiki.$split.tokens" ]] || { echo "missing or empty $data_dir/wiki.$split.tokens" >&2; exit 1; }
  done
  run fairseq-preprocess --only-source --trainpref "$data_dir/wiki.train.tokens" \
    --validpref "$data_dir/wiki.valid.tokens" --testpref "$data_dir/wiki.test.tokens" \
    --destdir "$data_bin" --workers "$(nproc)"
fi

if [[ $stage -le 2 && $stop_stage -ge 2 ]]; then
  log "stage 2: fairseq-train --arch $arch -> $save_dir (resumes from checkpoint_last.pt if present)"
  # the *_wiki103 architectures have an adaptive softmax, whose loss is adaptive_loss; spade_lm has a full one
  criterion=cross_entropy
  [[ "$arch" == *_wiki103 ]] && criterion=adaptive_loss
  # Baevski & Auli (2019) as published with fairseq; SPADE appendix C.3 keeps these settings.
  # shellcheck disable=SC2086
  fairseq_train "$data_bin" --user-dir "$user_dir" --task language_modeling --arch "$arch" \
    --save-dir "$save_dir" --tokens-per-sample "$tokens_per_sample" --sample-break-mode none \
    --max-tokens "$tokens_per_sample" --update-freq 3 --max-update 286000 \
    --optimizer nag --lr 1.0 --lr-scheduler cosine --lr-period-updates 270000 --t-mult 2 --lr-shrink 0.75 \
    --warmup-updates 16000 --warmup-init-lr 1e-07 --stop-min-lr 1e-09 --clip-norm 0.1 \
    --criterion "$criterion" --seed 1 --skip-invalid-size-inputs-valid-test --ddp-backend legacy_ddp \
    --log-format simple --log-interval 100 ${TRAIN_ARGS:-}
fi

if [[ $stage -le 3 && $stop_stage -ge 3 ]]; then
  for split in valid test; do
    log "stage 3: fairseq-eval-lm on $split (tokens per sample $tokens_per_sample, context window $context_window)"
    # fairseq 0.12 drops a last batch whose size is not a multiple of --required-batch-size-multiple (8 by
    # default), which here would be the last block of the split: score every block.
    # The log streams as it comes, but its perplexity line only once tokens were scored (with none, eval-lm
    # prints "Perplexity: 1.00" and exits 0).
    f="$work_dir/eval_${arch}_$split.log"
    # shellcheck disable=SC2086
    run fairseq-eval-lm "$data_bin" --user-dir "$user_dir" --path "$save_dir/checkpoint_best.pt" \
      --gen-subset "$split" --tokens-per-sample "$tokens_per_sample" --context-window "$context_window" \
      --max-tokens "$tokens_per_sample" --required-batch-size-multiple 1 --softmax-batch 1024 ${EVAL_ARGS:-} 2>&1 |
      tee "$f" | { grep -v 'Perplexity: ' || true; }
    scored_tokens "$f" >/dev/null || exit 1
    grep 'Perplexity: ' "$f" | tail -1
  done
fi

if [[ $stage -le 4 && $stop_stage -ge 4 ]]; then
  log "stage 4: perplexity table"
  echo
  echo "| model | valid ppl | test ppl |"
  echo "|---|---|---|"
  row="| $arch |"
  for split in valid test; do
    f="$work_dir/eval_${arch}_$split.log"
    [[ -f "$f" ]] || { echo "missing $f: run stage 3 first" >&2; exit 1; }
    scored_tokens "$f" >/dev/null || exit 1
    ppl="$({ grep -o 'Perplexity: [0-9.]*' "$f" || true; } | tail -1 | cut -d' ' -f2)"
    [[ -n "$ppl" ]] || { echo "no perplexity in $f" >&2; exit 1; }
    row="$row $ppl |"
  done
  echo "$row"
fi
