#!/usr/bin/env bash
# RNN-T speech recognition on LibriSpeech (MSSM paper section 4.1), stage by stage.
#
#   recipes/librispeech/run.sh [--stage N] [--stop-stage N] [--arch NAME] [--conf FILE]
#
# Stages: 0 download the subsets from openslr (skipped when present), 1 filterbanks, manifests, SentencePiece
# and config.yaml (scripts/prepare_librispeech.py), 2 fairseq-train (Adam, warmup_hold_exp_decay; resumes
# from checkpoint_last.pt), 3 average the last epoch checkpoints, 4 fairseq-generate on each evaluation set
# (transducer beam search), 5 print a markdown WER table. Every stage can be re-run on its own.
#
# --conf: conf/librispeech.sh (LibriSpeech 960 h, the default) or conf/mini.sh (the shipped mini corpus; what
# `make demo` runs). Environment: WORK_DIR (default exp/librispeech or exp/librispeech_mini), TRAIN_ARGS and
# DECODE_ARGS (extra fairseq-train / fairseq-generate arguments), PYTHON_BIN (directory of python and the
# fairseq-* commands; default .venv/bin if present), SEED (fairseq-train --seed, default 1), DATA_DIR (prepared
# data; default WORK_DIR/data, so that several runs can share one preparation), and any variable of the conf
# file in upper case. scripts/seed_spread.sh runs a conf with several seeds and prints the WER's mean and range.
# NPROC (default 1): stage 2 trains with NPROC processes (one per GPU) under torchrun, each update then takes
# NPROC x UPDATE_FREQ batches; NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT for several nodes (recipes/common.sh).
# On CPU: TRAIN_ARGS="--cpu --distributed-backend gloo --ddp-backend legacy_ddp".
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
stage=0
stop_stage=5
conf="$repo/recipes/librispeech/conf/librispeech.sh"
arch_override=
recipe_options="--arch"
recipe_option() { arch_override="$2"; }  # --arch NAME: in place of the conf's arch
# shellcheck source=../common.sh
source "$repo/recipes/common.sh" "$@"  # the command line (and the shared settings)
# shellcheck source=conf/librispeech.sh
source "$conf"
arch="${arch_override:-$arch}"
default_work="exp/librispeech"
[[ "$(basename "$conf")" == mini.sh ]] && default_work="exp/librispeech_mini"
work_dir="${WORK_DIR:-$default_work}"
data_dir="${DATA_DIR:-$work_dir/data}"
data_dir="$(mkdir -p "$data_dir" && CDPATH= cd -- "$data_dir" && pwd)"  # absolute: checkpoints name it
seed="${SEED:-1}"
[[ "$seed" =~ ^[0-9]+$ ]] || { echo "SEED must be a non-negative integer, got '$seed'" >&2; exit 2; }
save_dir="$work_dir/checkpoints/$arch"
averaged="$save_dir/checkpoint_avg$average_last.pt"
train_subset="${train_name:-${train_sets// /,}}"
# every subset once, in order: training, validation, evaluation
all_subsets="$(echo $train_sets ${valid_sets//,/ } $eval_sets | tr ' ' '\n' | awk '!seen[$0]++' | paste -sd' ')"

if [[ $stage -le 0 && $stop_stage -ge 0 ]]; then
  for subset in $all_subsets; do
    if [[ -d "$corpus_root/$subset" ]]; then
      log "stage 0: $corpus_root/$subset is present, skipping its download"
    elif [[ "$download" == 1 ]]; then
      log "stage 0: downloading $subset from openslr into $(dirname "$corpus_root")"
      mkdir -p "$(dirname "$corpus_root")"
      curl -fL --retry 3 "https://www.openslr.org/resources/12/$subset.tar.gz" | tar xz -C "$(dirname "$corpus_root")"
    else
      echo "missing subset $corpus_root/$subset (and downloading is off for this conf)" >&2
      exit 1
    fi
  done
fi

if [[ $stage -le 1 && $stop_stage -ge 1 ]]; then
  subsets="${all_subsets// /,}"
  log "stage 1: features, manifests, SentencePiece ($vocab_size) for $subsets -> $data_dir"
  run python "$repo/scripts/prepare_librispeech.py" --librispeech-root "$corpus_root" --out "$data_dir" \
    --subsets "$subsets" --train-subsets "${train_sets// /,}" ${train_name:+--combine-train "$train_name"} \
    --vocab-size "$vocab_size" --time-mask-width "$time_mask_width" $([[ "$specaugment" == 1 ]] || echo --no-specaugment)
fi

if [[ $stage -le 2 && $stop_stage -ge 2 ]]; then
  log "stage 2: fairseq-train --arch $arch -> $save_dir (resumes from checkpoint_last.pt if present)"
  # shellcheck disable=SC2086
  fairseq_train "$data_dir" --user-dir "$user_dir" --task speech_transducer \
    --train-subset "$train_subset" --valid-subset "$valid_sets" --arch "$arch" $model_args \
    --criterion transducer $criterion_args --optimizer adam --adam-betas "(0.9, 0.98)" --clip-norm 5 --lr "$lr" \
    --lr-scheduler warmup_hold_exp_decay --warmup-updates "$warmup_updates" \
    --hold-until-epoch "$hold_until_epoch" --decay-per-epoch "$decay_per_epoch" --max-epoch "$max_epoch" \
    --max-tokens "$max_tokens" --update-freq "$update_freq" --save-dir "$save_dir" \
    --keep-last-epochs "$average_last" --seed "$seed" --log-format simple --log-interval 50 ${TRAIN_ARGS:-}
fi

if [[ $stage -le 3 && $stop_stage -ge 3 ]]; then
  log "stage 3: averaging the last $average_last epoch checkpoints -> $averaged"
  run python "$repo/scripts/average_checkpoints.py" --checkpoint-dir "$save_dir" --last "$average_last" \
    --output "$averaged"
fi

if [[ $stage -le 4 && $stop_stage -ge 4 ]]; then
  for subset in $eval_sets; do
    log "stage 4: fairseq-generate $subset, beam $beam -> $work_dir/decode/$arch/$subset"
    # shellcheck disable=SC2086
    run fairseq-generate "$data_dir" --user-dir "$user_dir" --task speech_transducer \
      --path "$averaged" --gen-subset "$subset" --beam "$beam" --scoring wer --post-process sentencepiece \
      --max-tokens "$decode_max_tokens" --results-path "$work_dir/decode/$arch/$subset" ${DECODE_ARGS:-} \
      > /dev/null
    tail -n 1 "$work_dir/decode/$arch/$subset/generate-$subset.txt"
  done
fi

if [[ $stage -le 5 && $stop_stage -ge 5 ]]; then
  log "stage 5: WER table ($work_dir/decode/$arch)"
  header="| model |" rule="|---|" row="| $arch (beam $beam) |"
  for subset in $eval_sets; do
    result="$work_dir/decode/$arch/$subset/generate-$subset.txt"
    [[ -f "$result" ]] || { echo "no decoding of $subset: run stage 4 first ($result)" >&2; exit 1; }
    wer="$(sed -n 's/^Generate .* WER: \([0-9.]*\)$/\1/p' "$result" | tail -n 1)"
    [[ -n "$wer" ]] || { echo "no WER line in $result" >&2; exit 1; }
    header+=" $subset WER % |" rule+="---|" row+=" $wer |"
  done
  printf '%s\n%s\n%s\n' "$header" "$rule" "$row" | tee "$work_dir/wer_$arch.md"
fi
