#!/usr/bin/env bash
# RNN-T speech recognition on LibriSpeech (MSSM paper section 4.1), stage by stage.
#
#   recipes/librispeech/run.sh [--stage N] [--stop-stage N] [--arch NAME] [--conf FILE]
#
# Stages: 0 download the subsets from openslr (skipped when present), 1 filterbanks, manifests, SentencePiece
# and config.yaml (scripts/prepare_librispeech.py; the conf's cmvn: utterance, or global or adaptive for streaming
# models),
# 2 fairseq-train (Adam, warmup_hold_exp_decay; resumes from checkpoint_last.pt), 3 average the last epoch
# checkpoints, 4 fairseq-generate on each evaluation set (transducer beam search), 5 print a markdown WER table.
# Every stage can be re-run on its own.
# Language-model fusion, after stage 5 (run.sh --stage 6 --stop-stage 8): 6 language-model text in the
# transducer's units (the conf's lm_train_text, or the training transcripts; scripts/prepare_lm_text.py) and
# fairseq-preprocess with the data's dict.txt (and, when ilm_weights holds a weight above 0, the bigram of the
# training transcripts for LODR: scripts/build_bigram.py), 7 fairseq-train --task language_modeling --arch LM_ARCH,
# 8 stage 4's search fused with the LM (fairseq-generate --lm-path --lm-weight) at each weight of lm_weights, and with
# LODR at each pair of lm_weights x ilm_weights (--ilm-path --ilm-weight), each at every blank penalty of
# blank_penalties (--blank-penalty: the length reward), and a WER table whose last row repeats the row with the lowest
# WER on the first evaluation set (the weights chosen on dev).
#
# --conf: conf/librispeech.sh (LibriSpeech 960 h, the default), conf/mini.sh (the shipped mini corpus; what
# `make demo` runs) or conf/mini_streaming.sh (the mini corpus, a causal model that streams). Environment:
# WORK_DIR (default exp/librispeech, or exp/librispeech_<conf name> for the mini confs), TRAIN_ARGS and
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
# the mini confs each get their own directory (their data differ: mini_streaming.sh prepares with global CMVN)
[[ "$(basename "$conf")" == mini*.sh ]] && default_work="exp/librispeech_$(basename "$conf" .sh)"
work_dir="${WORK_DIR:-$default_work}"
data_dir="${DATA_DIR:-$work_dir/data}"
data_dir="$(mkdir -p "$data_dir" && CDPATH= cd -- "$data_dir" && pwd)"  # absolute: checkpoints name it
seed="${SEED:-1}"
[[ "$seed" =~ ^[0-9]+$ ]] || { echo "SEED must be a non-negative integer, got '$seed'" >&2; exit 2; }
save_dir="$work_dir/checkpoints/$arch"
averaged="$save_dir/checkpoint_avg$average_last.pt"
lm_dir="$work_dir/lm"
lm_save_dir="$work_dir/checkpoints/lm_$lm_arch"
bigram="$lm_dir/bigram.json"
ilm_weights="${ilm_weights:-0}"
blank_penalties="${blank_penalties:-0}"
is_zero() { awk -v w="$1" 'BEGIN { exit !(w == 0) }'; }  # is_zero WEIGHT: numerically 0 (0, 0.0, ...)
# LODR runs when ilm_weights (ILM_WEIGHTS in a conf) holds a weight above 0
lodr=0
for ilm_weight in $ilm_weights; do is_zero "$ilm_weight" || lodr=1; done
train_subset="${train_name:-${train_sets// /,}}"
# the WER tables' columns, and the line of fairseq-generate's output that ends with the WER
read -ra wer_columns <<< "$eval_sets"
wer_columns=("${wer_columns[@]/%/ WER %}")
wer_line='^Generate .* WER: [0-9][0-9.]*$'
# every subset once, in order: training, validation, evaluation
all_subsets="$(echo $train_sets ${valid_sets//,/ } $eval_sets | tr ' ' '\n' | awk '!seen[$0]++' | paste -sd' ')"

# stage 8's grid options in DECODE_ARGS would decode other settings than its table's rows name: refused before any
# stage runs
if [[ $stage -le 8 && $stop_stage -ge 8 ]]; then
  for flag in --lm-path --lm-weight --ilm-path --ilm-weight --blank-penalty; do
    if [[ " ${DECODE_ARGS:-} " == *" $flag "* || " ${DECODE_ARGS:-} " == *" $flag="* ]]; then
      echo "DECODE_ARGS sets $flag, which stage 8 sets per row (LM_WEIGHTS, ILM_WEIGHTS, BLANK_PENALTIES)" >&2
      exit 2
    fi
  done
fi

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
    --vocab-size "$vocab_size" --cmvn "$cmvn" --time-mask-width "$time_mask_width" \
    $([[ "$specaugment" == 1 ]] || echo --no-specaugment)
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
  table_start model "${wer_columns[@]}"
  wers=()
  for subset in $eval_sets; do
    wers+=("$(metric "$work_dir/decode/$arch/$subset/generate-$subset.txt" 4 WER "$wer_line")")
  done
  table_add "$arch (beam $beam)" "${wers[@]}"
  table_print "$work_dir/wer_$arch.md"
fi

if [[ $stage -le 6 && $stop_stage -ge 6 ]]; then
  [[ -f "$data_dir/dict.txt" ]] ||
    { echo "$data_dir/dict.txt missing (prepared by an earlier release): re-run stage 1" >&2; exit 1; }
  if [[ -n "$lm_train_text" ]]; then
    if [[ ! -f "$lm_train_text" && "$download" == 1 ]]; then
      log "stage 6: downloading the LibriSpeech LM corpus from openslr -> $lm_train_text"
      mkdir -p "$(dirname "$lm_train_text")"
      curl -fL --retry 3 -o "$lm_train_text.part" "https://www.openslr.org/resources/11/$(basename "$lm_train_text")"
      mv "$lm_train_text.part" "$lm_train_text"
    fi
    lm_source=(--train-text "$lm_train_text")
  else
    lm_source=(--train-manifests "${train_sets// /,}")
  fi
  log "stage 6: language-model text (${lm_source[*]}) in the transducer's units -> $lm_dir"
  run python "$repo/scripts/prepare_lm_text.py" --data "$data_dir" --out "$lm_dir/text" "${lm_source[@]}" \
    --valid-manifests "$valid_sets"
  run fairseq-preprocess --only-source --srcdict "$data_dir/dict.txt" --trainpref "$lm_dir/text/train.txt" \
    --validpref "$lm_dir/text/valid.txt" --destdir "$lm_dir/bin" --workers 2
  if [[ "$lodr" == 1 ]]; then
    log "stage 6: bigram of the training transcripts (the internal-LM estimate of LODR) -> $bigram"
    run python "$repo/scripts/build_bigram.py" --data "$data_dir" --manifests "${train_sets// /,}" --out "$bigram"
  fi
fi

if [[ $stage -le 7 && $stop_stage -ge 7 ]]; then
  log "stage 7: fairseq-train --task language_modeling --arch $lm_arch -> $lm_save_dir"
  # --required-batch-size-multiple 1: fairseq 0.12 leaves out the sentences that do not fill a multiple of 8 in a
  # batch (4 of the mini corpus's 60 validation sentences; all of a 2-sentence validation set)
  # shellcheck disable=SC2086
  fairseq_train "$lm_dir/bin" --user-dir "$user_dir" --task language_modeling --arch "$lm_arch" $lm_model_args \
    --optimizer adam --adam-betas "(0.9, 0.98)" --clip-norm 1 --lr-scheduler inverse_sqrt \
    --required-batch-size-multiple 1 $lm_train_args \
    --save-dir "$lm_save_dir" --no-epoch-checkpoints --seed "$seed" --log-format simple --log-interval 50
fi

if [[ $stage -le 8 && $stop_stage -ge 8 ]]; then
  lm_checkpoint="$lm_save_dir/checkpoint_best.pt"
  [[ -f "$lm_checkpoint" ]] || { echo "no language model $lm_checkpoint: run stage 7 first" >&2; exit 1; }
  [[ "$lodr" == 0 || -f "$bigram" ]] || { echo "no bigram $bigram for ILM_WEIGHTS=$ilm_weights: run stage 6" >&2; exit 1; }
  table_start "LM weight ($lm_arch)" "ILM weight (LODR)" "blank penalty" "${wer_columns[@]}"
  best_row=() best_wer=
  for weight in $lm_weights; do
    for ilm_weight in $ilm_weights; do
      # LODR subtracts the bigram from a fused score: without the LM (weight 0) there is nothing to correct
      if ! is_zero "$ilm_weight" && is_zero "$weight"; then continue; fi
      for blank_penalty in $blank_penalties; do
        grid_args=() suffix=
        if ! is_zero "$ilm_weight"; then
          grid_args=(--ilm-path "$bigram" --ilm-weight "$ilm_weight")
          suffix="_ilm_$ilm_weight"
        fi
        if ! is_zero "$blank_penalty"; then
          grid_args+=(--blank-penalty "$blank_penalty")
          suffix+="_bp_$blank_penalty"
        fi
        wers=()
        for subset in $eval_sets; do
          out="$work_dir/decode/$arch/lm_${lm_arch}_$weight$suffix/$subset"
          log "stage 8: fairseq-generate $subset, beam $beam, --lm-weight $weight ${grid_args[*]} -> $out"
          # shellcheck disable=SC2086
          run fairseq-generate "$data_dir" --user-dir "$user_dir" --task speech_transducer \
            --path "$averaged" --gen-subset "$subset" --beam "$beam" --scoring wer --post-process sentencepiece \
            --max-tokens "$decode_max_tokens" --lm-path "$lm_checkpoint" --lm-weight "$weight" "${grid_args[@]}" \
            --results-path "$out" ${DECODE_ARGS:-} > /dev/null
          wers+=("$(metric "$out/generate-$subset.txt" 8 WER "$wer_line")")
        done
        table_add "$weight" "$ilm_weight" "$blank_penalty" "${wers[@]}"
        # the weights chosen on dev: the lowest WER on the first evaluation set, the first such row on a tie
        if [[ -z "$best_wer" ]] || awk -v a="${wers[0]}" -v b="$best_wer" 'BEGIN { exit !(a < b) }'; then
          best_wer="${wers[0]}" best_row=("$weight" "$ilm_weight" "$blank_penalty" "${wers[@]}")
        fi
      done
    done
  done
  if [[ ${#best_row[@]} -eq 0 ]]; then
    echo "stage 8 decoded nothing: no row in LM_WEIGHTS='$lm_weights' x ILM_WEIGHTS='$ilm_weights' x" \
      "BLANK_PENALTIES='$blank_penalties' (LODR needs an LM weight above 0)" >&2
    exit 1
  fi
  table_add "chosen on ${eval_sets%% *}: ${best_row[0]}" "${best_row[@]:1}"
  table_print "$work_dir/wer_${arch}_lm_$lm_arch.md"
fi
