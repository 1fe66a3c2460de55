#!/usr/bin/env bash
# SPADE language model (SPADE paper section 4.2, appendix C.3) against its baselines, stage by stage.
#
#   recipes/wikitext103/run.sh [--stage N] [--stop-stage N] [--conf FILE] [--arch NAME]
#
# Stages: 0 the corpus (WikiText-103 downloaded, skipped when present; or, with GENERATE_SAMPLE=1, the generated
# long-document sample), 1 fairseq-preprocess, 2 fairseq-train each architecture of ARCHS with each seed of SEEDS
# (resumes from checkpoint_last.pt), 3 fairseq-eval-lm on valid and test (TOKENS_PER_SAMPLE tokens per block, of
# which CONTEXT_WINDOW are context only), 4 a markdown perplexity table with each model's parameters, 5 test
# perplexity split by the distance to the previous occurrence of the same word (within or beyond the local
# attention's reach), with each SSM model also scored with its SSM outputs zeroed (ssm-lm-distance-ppl), and
# again for the words matching WORD_PATTERN when the conf sets one (conf/long_documents.sh: the names). With
# several seeds a cell is the mean (min-max) over them. Every stage can be re-run on its own.
#
# --conf: conf/wikitext103.sh (WikiText-103 at the paper's scale, the default) or conf/long_documents.sh (the
# generated sample with spade_lm, local_lm and fairseq's transformer_lm at equal size, three seeds; minutes per
# model on a CPU). --arch NAME trains and scores that architecture only (ARCHS=NAME). Checkpoints go to
# WORK_DIR/checkpoints/ARCH_seedN. Environment: WORK_DIR (default exp/wikitext103, or exp/long_documents with
# conf/long_documents.sh), TRAIN_ARGS (extra fairseq-train arguments, e.g. --max-update 1000), EVAL_ARGS (extra
# fairseq-eval-lm arguments), PYTHON_BIN (directory of the fairseq-* commands; default: .venv/bin if present), and
# any variable of the conf file in upper case (DATA_DIR, ARCHS, SEEDS, TOKENS_PER_SAMPLE, CONTEXT_WINDOW, ...).
# NPROC (default 1): stage 2 trains with NPROC processes (one per GPU) under torchrun, each update then takes
# NPROC x --update-freq batches; NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT for several nodes
# (recipes/common.sh). On CPU add --cpu --distributed-backend gloo to TRAIN_ARGS.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
stage=0
stop_stage=5
conf="$repo/recipes/wikitext103/conf/wikitext103.sh"
arch_option=
recipe_options="--arch"
recipe_option() { arch_option="$2"; }  # --arch NAME
# shellcheck source=../common.sh
source "$repo/recipes/common.sh" "$@"  # the command line (and the shared settings)
default_work="exp/wikitext103"
[[ "$(basename "$conf")" == long_documents.sh ]] && default_work="exp/long_documents"
work_dir="${WORK_DIR:-$default_work}"
# shellcheck source=conf/wikitext103.sh
source "$conf"
[[ -n "$arch_option" ]] && archs="$arch_option"
data_bin="$work_dir/data-bin"
[[ -n "${archs// /}" ]] || { echo "ARCHS: no architecture given" >&2; exit 2; }
for seed in $seeds; do
  [[ "$seed" =~ ^[0-9]+$ ]] || { echo "SEEDS: '$seed' is not a non-negative integer" >&2; exit 2; }
done
[[ -n "${seeds// /}" ]] || { echo "SEEDS: no seed given" >&2; exit 2; }

[[ "$tokens_per_sample" =~ ^[1-9][0-9]*$ ]] ||
  { echo "TOKENS_PER_SAMPLE must be a positive integer, got '$tokens_per_sample'" >&2; exit 2; }
[[ "$context_window" =~ ^[0-9]+$ ]] ||
  { echo "CONTEXT_WINDOW must be a non-negative integer, got '$context_window'" >&2; exit 2; }
# eval-lm scores TOKENS_PER_SAMPLE - CONTEXT_WINDOW new tokens per block (fairseq fails on "negative dimensions")
if [[ $stage -le 3 && $stop_stage -ge 3 && "$context_window" -ge "$tokens_per_sample" ]]; then
  echo "CONTEXT_WINDOW ($context_window) must be smaller than TOKENS_PER_SAMPLE ($tokens_per_sample)" >&2; exit 2
fi

if [[ $stage -le 0 && $stop_stage -ge 0 ]]; then
  if [[ "$generate_sample" == 1 ]]; then
    log "stage 0: generating the long-document sample into $data_dir ($sample_args)"
    tmp="$(mktemp -d)"
    # shellcheck disable=SC2086
    run python "$repo/scripts/make_long_documents.py" "$tmp" $sample_args
    mkdir -p "$data_dir"
    for split in train valid test; do mv "$tmp/$split.txt" "$data_dir/wiki.$split.tokens"; done
    rm -rf "$tmp"
  elif [[ -f "$data_dir/wiki.train.tokens" ]]; then
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
  binarise "$data_bin" --only-source --trainpref "$data_dir/wiki.train.tokens" \
    --validpref "$data_dir/wiki.valid.tokens" --testpref "$data_dir/wiki.test.tokens" --workers "$(nproc)"
fi

if [[ $stage -le 2 && $stop_stage -ge 2 ]]; then
  for arch in $archs; do
    # the *_wiki103 architectures have an adaptive softmax, whose loss is adaptive_loss; the others a full one
    criterion=cross_entropy
    [[ "$arch" == *_wiki103 ]] && criterion=adaptive_loss
    for seed in $seeds; do
      save_dir="$work_dir/checkpoints/${arch}_seed$seed"
      log "stage 2: fairseq-train --arch $arch --seed $seed -> $save_dir (resumes from checkpoint_last.pt if present)"
      # shellcheck disable=SC2086
      train_arch "$arch" "$work_dir/train_${arch}_seed$seed.log" "$data_bin" --task language_modeling \
        --save-dir "$save_dir" --tokens-per-sample "$tokens_per_sample" --sample-break-mode none $optim_args \
        --criterion "$criterion" --seed "$seed" --skip-invalid-size-inputs-valid-test --ddp-backend legacy_ddp \
        --log-format simple --log-interval 100 ${TRAIN_ARGS:-}
    done
  done
fi

if [[ $stage -le 3 && $stop_stage -ge 3 ]]; then
  for arch in $archs; do
    for seed in $seeds; do
      for split in valid test; do
        log "stage 3: fairseq-eval-lm ${arch} (seed $seed) on $split (tokens per sample $tokens_per_sample," \
          "context window $context_window)"
        # fairseq 0.12 drops a last batch whose size is not a multiple of --required-batch-size-multiple (8 by
        # default), which here would be the last block of the split: score every block.
        # The log streams as it comes, but its perplexity line only once tokens were scored (with none, eval-lm
        # prints "Perplexity: 1.00" and exits 0).
        f="$work_dir/eval_${arch}_seed${seed}_$split.log"
        # shellcheck disable=SC2086
        run fairseq-eval-lm "$data_bin" --user-dir "$user_dir" \
          --path "$work_dir/checkpoints/${arch}_seed$seed/checkpoint_best.pt" --gen-subset "$split" \
          --tokens-per-sample "$tokens_per_sample" --context-window "$context_window" \
          --max-tokens "$tokens_per_sample" --required-batch-size-multiple 1 --softmax-batch 1024 ${EVAL_ARGS:-} \
          2>&1 | tee "$f" | { grep -v 'Perplexity: ' || true; }
        scored_tokens "$f" >/dev/null || exit 1
        grep 'Perplexity: ' "$f" | tail -1
      done
    done
  done
fi

if [[ $stage -le 4 && $stop_stage -ge 4 ]]; then
  log "stage 4: perplexity table (seeds: $seeds)"
  runs=""
  [[ "$(wc -w <<< "$seeds")" -gt 1 ]] && runs=" ($(wc -w <<< "$seeds") seeds)"
  table_start model parameters "valid ppl" "test ppl"
  for arch in $archs; do
    cells=()
    for split in valid test; do
      ppl=()
      for seed in $seeds; do
        f="$work_dir/eval_${arch}_seed${seed}_$split.log"
        ppl+=("$(metric "$f" 3 perplexity 'Perplexity: [0-9][0-9.]*')")
        scored_tokens "$f" >/dev/null
      done
      cells+=("$(mean_range "${ppl[@]}")")
    done
    params="$(logged_parameters "$work_dir/train_${arch}_seed${seeds%% *}.log" 2)"
    table_add "$arch$runs" "$params" "${cells[@]}"
  done
  echo
  table_print
fi

if [[ $stage -le 5 && $stop_stage -ge 5 ]]; then
  log "stage 5: test perplexity by the distance to the previous occurrence of the same word (seeds: $seeds)"
  checkpoints=()
  for arch in $archs; do
    for seed in $seeds; do
      checkpoints+=(--checkpoint "$arch=$work_dir/checkpoints/${arch}_seed$seed/checkpoint_best.pt")
    done
  done
  distance=(python "$repo/scripts/lm_distance_perplexity.py" "$data_bin" "${checkpoints[@]}" --split test
    --tokens-per-sample "$tokens_per_sample" ${reach:+--reach "$reach"} --ablate-ssm)
  saved_table "$work_dir/distance_table.md" "${distance[@]}"
  if [[ -n "$word_pattern" ]]; then
    log "stage 5: the same for the words matching $word_pattern only"
    saved_table "$work_dir/distance_table_words.md" "${distance[@]}" --only "$word_pattern"
  fi
fi
