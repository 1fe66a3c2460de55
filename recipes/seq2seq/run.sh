#!/usr/bin/env bash
# The SPADE encoder-decoder (SPADE paper section 5.1): denoising pre-training, then sequence-to-sequence
# fine-tuning, for spade_transformer and its local-only twin, stage by stage.
#
#   recipes/seq2seq/run.sh [--stage N] [--stop-stage N] [--conf FILE]
#
# Stages: 0 the generated sample (GENERATE_SAMPLE=1: stories for pre-training and the far-ordering task),
# 1 SentencePiece trained on the pre-training text and the training pairs, every file encoded
# (scripts/prepare_seq2seq.py), 2 fairseq-preprocess (one joined dictionary with <mask>, shared by both tasks),
# 3 fairseq-train --task denoising (BART-style span masking) for each of ARCHS (none when PRETRAIN_UPDATES=0),
# 4 fairseq-train --task translation from the pre-trained checkpoint (from random weights without one),
# 5 fairseq-generate --beam BEAM on the test split, also for each of ABLATE_ARCHS with its SSM outputs zeroed
# (--model-overrides "{'ssm_ablation': True}"), 6 a markdown table: parameters, the
# share of outputs exactly right and right up to word order, sacreBLEU on detokenised text. Training resumes from
# checkpoint_last.pt (fine-tuning starts from the pre-trained model only when it has none: --finetune-from-model).
# Each architecture trains with MODEL_ARGS plus the conf's model_args_ARCH, and with SEED (default 1).
#
# RAW_DIR holds pretrain.train.txt and pretrain.valid.txt (paragraphs, an empty line between documents) and
# {train,valid,test}.{src,tgt} (one example per line). --conf: conf/sample.sh (generated, CPU, the default) or
# conf/t5_base.sh (spade_t5_base, Table 8). Environment: WORK_DIR (default exp/seq2seq_<conf>), PRETRAIN_ARGS /
# FINETUNE_ARGS / GENERATE_ARGS (extra flags), PYTHON_BIN, and any conf variable in upper case. NPROC (default
# 1): stages 3 and 4 train with NPROC processes (one per GPU) under torchrun, each update then takes NPROC batches;
# NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT for several nodes (recipes/common.sh). On CPU add
# --cpu --distributed-backend gloo --ddp-backend legacy_ddp to PRETRAIN_ARGS and FINETUNE_ARGS.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
stage=0
stop_stage=6
conf="$repo/recipes/seq2seq/conf/sample.sh"
# shellcheck source=../common.sh
source "$repo/recipes/common.sh" "$@"  # the command line (and the shared settings)
work_dir="${WORK_DIR:-exp/seq2seq_$(basename "$conf" .sh)}"
# shellcheck source=conf/sample.sh
source "$conf"
[[ "$pretrain_updates" =~ ^[0-9]+$ ]] ||
  { echo "PRETRAIN_UPDATES must be a whole number of updates (0: no pre-training), got '$pretrain_updates'" >&2; exit 2; }
pretrain_updates=$((10#$pretrain_updates))  # "00" is 0 too (fairseq-train reads --max-update 0 as no limit)
# what stages 5 and 6 decode and score: each of ARCHS, then each of ABLATE_ARCHS with its SSM outputs zeroed
results="$archs $(for arch in $ablate_archs; do echo "${arch}_ssm_zeroed"; done)"
bpe="$work_dir/bpe"
data_bin="$work_dir/data-bin"

if [[ $stage -le 0 && $stop_stage -ge 0 ]]; then
  if [[ "$generate_sample" == 1 ]]; then
    log "stage 0: generating stories and the far-ordering task ($order_length words, gap $order_gap) into $raw_dir"
    run python "$repo/scripts/make_long_documents.py" "$raw_dir/stories" --train 8 --valid 1 --test 1 --words 1500 \
      --labelled 0
    cp "$raw_dir/stories/train.txt" "$raw_dir/pretrain.train.txt"
    cp "$raw_dir/stories/valid.txt" "$raw_dir/pretrain.valid.txt"
    run python "$repo/scripts/make_order_task.py" "$raw_dir" --train "$order_examples" --length "$order_length" \
      --margin "$order_gap" --gap "$order_gap" --run "$order_run"
  else
    log "stage 0: using the corpus in $raw_dir (GENERATE_SAMPLE=0)"
  fi
fi

if [[ $stage -le 1 && $stop_stage -ge 1 ]]; then
  log "stage 1: SentencePiece ($vocab_size) and encoding -> $bpe"
  run python "$repo/scripts/prepare_seq2seq.py" --vocab-size "$vocab_size" --out "$bpe" \
    --train-text "$raw_dir/pretrain.train.txt" "$raw_dir/train.src" "$raw_dir/train.tgt" \
    --encode "$raw_dir"/pretrain.{train,valid}.txt "$raw_dir"/{train,valid,test}.{src,tgt}
fi

if [[ $stage -le 2 && $stop_stage -ge 2 ]]; then
  log "stage 2: fairseq-preprocess -> $data_bin (one dictionary, <mask> appended as the denoising task adds it)"
  # one dictionary of every piece in the pre-training text and in both sides of the training pairs (the text
  # SentencePiece was trained on), so that neither task meets <unk>; a re-run keeps it or fails (binarise)
  cat "$bpe/pretrain.train.txt" "$bpe/train.src" "$bpe/train.tgt" > "$work_dir/dictionary_text.txt"
  binarise "$work_dir/dict" --only-source --trainpref "$work_dir/dictionary_text.txt" --dict-only --workers "$(nproc)"
  cp "$work_dir/dict/dict.txt" "$work_dir/dict.txt"
  echo "<mask> 1" > "$work_dir/dict.mask.txt"
  cat "$work_dir/dict.txt" "$work_dir/dict.mask.txt" > "$work_dir/dict.with-mask.txt"
  mkdir -p "$data_bin"
  binarise "$data_bin/pairs" --source-lang src --target-lang tgt --srcdict "$work_dir/dict.with-mask.txt" \
    --tgtdict "$work_dir/dict.with-mask.txt" --trainpref "$bpe/train" --validpref "$bpe/valid" \
    --testpref "$bpe/test" --workers "$(nproc)"
  binarise "$data_bin/pretrain" --only-source --srcdict "$work_dir/dict.txt" --trainpref "$bpe/pretrain.train.txt" \
    --validpref "$bpe/pretrain.valid.txt" --workers "$(nproc)"
fi

if [[ $stage -le 3 && $stop_stage -ge 3 && "$pretrain_updates" == 0 ]]; then
  log "stage 3: no denoising pre-training (PRETRAIN_UPDATES=0): stage 4 starts from random weights"
elif [[ $stage -le 3 && $stop_stage -ge 3 ]]; then
  for arch in $archs; do
    log "stage 3: denoising pre-training of $arch -> $work_dir/checkpoints/$arch/pretrain"
    # shellcheck disable=SC2086
    train_arch "$arch" "$work_dir/pretrain_$arch.log" "$data_bin/pretrain" --task denoising \
      --share-all-embeddings --mask 0.3 --mask-length span-poisson --poisson-lambda 3.5 --replace-length 1 \
      --rotate 0 --permute-sentences 0 --insert 0 --tokens-per-sample "$tokens_per_sample" \
      --criterion cross_entropy --optimizer adam --adam-betas "(0.9,0.98)" --adam-eps 1e-6 --weight-decay 0.01 \
      --lr "$lr" --lr-scheduler polynomial_decay --warmup-updates "$((pretrain_updates / 10 + 1))" \
      --total-num-update "$pretrain_updates" --max-update "$pretrain_updates" --max-tokens "$max_tokens" \
      --required-batch-size-multiple 1 --save-dir "$work_dir/checkpoints/$arch/pretrain" --seed "$seed" \
      --log-format simple --log-interval 10 ${PRETRAIN_ARGS:-}
  done
fi

if [[ $stage -le 4 && $stop_stage -ge 4 ]]; then
  for arch in $archs; do
    log "stage 4: fine-tuning $arch with --task translation -> $work_dir/checkpoints/$arch/finetune"
    start=()  # random weights without pre-training
    [[ "$pretrain_updates" == 0 ]] ||
      start=(--finetune-from-model "$work_dir/checkpoints/$arch/pretrain/checkpoint_last.pt")
    # shellcheck disable=SC2086
    train_arch "$arch" "$work_dir/finetune_$arch.log" "$data_bin/pairs" --task translation \
      --share-all-embeddings "${start[@]}" \
      --criterion label_smoothed_cross_entropy --label-smoothing "$label_smoothing" \
      --optimizer adam --adam-betas "(0.9,0.98)" --adam-eps 1e-6 --lr "$lr" --lr-scheduler inverse_sqrt \
      --warmup-updates "$((finetune_updates / 10 + 1))" --max-update "$finetune_updates" --max-tokens "$max_tokens" \
      --required-batch-size-multiple 1 --skip-invalid-size-inputs-valid-test \
      --save-dir "$work_dir/checkpoints/$arch/finetune" --no-epoch-checkpoints --seed "$seed" \
      --log-format simple --log-interval 10 ${FINETUNE_ARGS:-}
  done
fi

if [[ $stage -le 5 && $stop_stage -ge 5 ]]; then
  for name in $results; do
    arch="${name%_ssm_zeroed}"
    ablation=()
    if [[ "$name" == "$arch" ]]; then
      log "stage 5: fairseq-generate --beam $beam with $arch on the test split"
    else
      log "stage 5: the same with $arch's SSM outputs zeroed (--model-overrides \"{'ssm_ablation': True}\")"
      ablation=(--model-overrides "{'ssm_ablation': True}")
    fi
    # shellcheck disable=SC2086
    { run fairseq-generate "$data_bin/pairs" --user-dir "$user_dir" --task translation \
        --path "$work_dir/checkpoints/$arch/finetune/checkpoint_best.pt" --gen-subset test --beam "$beam" \
        --max-len-a 0 --max-len-b 64 --batch-size 8 --required-batch-size-multiple 1 --post-process sentencepiece \
        --scoring sacrebleu ${ablation[@]+"${ablation[@]}"} ${GENERATE_ARGS:-} > "$work_dir/generate_$name.txt"; } \
      2>&1 | tee "$work_dir/generate_$name.log"
    [[ "$name" == "$arch" ]] || grep -q -- "--ssm-ablation: the outputs of" "$work_dir/generate_$name.log" || {
      echo "$arch's checkpoint did not take ssm_ablation (saved before the option existed?): no ablation row" >&2
      exit 1
    }
  done
fi

if [[ $stage -le 6 && $stop_stage -ge 6 ]]; then
  log "stage 6: results on the test split"
  table_start model parameters "test examples" "exactly right (%)" "right words, any order (%)" sacreBLEU
  for name in $results; do
    arch="${name%_ssm_zeroed}"
    f="$work_dir/generate_$name.txt"
    [[ -f "$f" ]] || { echo "missing $f: run stage 5 first" >&2; exit 1; }
    params="$(logged_parameters "$work_dir/finetune_$arch.log" 4)"
    label="$arch"
    [[ "$name" != "$arch" ]] && label="$arch, SSM output zeroed"
    scores="$(run python "$repo/scripts/score_generations.py" "$f")"
    IFS=$'\t' read -ra scores <<< "$scores"
    table_add "$label" "$params" "${scores[@]}"
  done
  echo
  table_print
fi
