#!/usr/bin/env bash
# Masked language modelling on long documents (MSSM paper section 4.2, Table 4): the MSSM encoder against the
# sliding-window attention baseline, stage by stage.
#
#   recipes/mlm/run.sh [--stage N] [--stop-stage N] [--conf FILE]
#
# Stages: 0 the generated document sample (only with GENERATE_SAMPLE=1, conf/sample.sh), 1 tokenise
# (SentencePiece trained on train.txt, or GPT-2 BPE when GPT2_ENCODER_JSON and GPT2_VOCAB_BPE are set),
# 2 fairseq-preprocess (a re-run keeps the dictionary or fails: binarise in recipes/common.sh), 3 fairseq-train
# --task masked_lm at TOKENS_PER_SAMPLE (4096) for each of ARCHS (resumes from checkpoint_last.pt), 4
# fairseq-validate on valid and test, 5 a markdown perplexity table, then the same masked tokens split by whether
# the same token is visible within the sliding window's reach (ssm-mlm-evidence-ppl, with SSM outputs zeroed and a
# unigram row),
# 6 sentence_prediction fine-tuning from each pre-trained checkpoint (--finetune-from-model: a restart resumes from
# the fine-tuned checkpoint_last.pt) on LABELLED_DIR's TSV with an accuracy table (skipped, saying so, when
# LABELLED_DIR is empty). Every stage can be re-run on its own.
#
# --conf: conf/mlm.sh (your corpus in RAW_DIR, Table 4's 24-layer models; the default) or conf/sample.sh (the
# generated sample and small models, minutes on a CPU). Environment: WORK_DIR (default exp/mlm or
# exp/mlm_sample), TRAIN_ARGS / FINETUNE_ARGS / VALID_ARGS (extra arguments of fairseq-train / fairseq-train for
# fine-tuning / fairseq-validate), SEED (default 1; of training and fine-tuning: validation always masks with seed 1,
# so every model and seed is scored on the same masked tokens), PYTHON_BIN (directory of python and the fairseq-*
# commands; default .venv/bin if present), and any variable of the conf file in upper case. NPROC (default 1):
# stages 3 and 6 train with NPROC processes (one per GPU) under torchrun, each update then takes NPROC x UPDATE_FREQ
# batches; NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT for several nodes (recipes/common.sh). On CPU add
# --cpu --distributed-backend gloo --ddp-backend legacy_ddp to TRAIN_ARGS and FINETUNE_ARGS.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
stage=0
stop_stage=6
conf="$repo/recipes/mlm/conf/mlm.sh"
# shellcheck source=../common.sh
source "$repo/recipes/common.sh" "$@"  # the command line (and the shared settings)
default_work="exp/mlm"
[[ "$(basename "$conf")" == sample.sh ]] && default_work="exp/mlm_sample"
work_dir="${WORK_DIR:-$default_work}"
# shellcheck source=conf/mlm.sh
source "$conf"
bpe_dir="$work_dir/bpe"
data_bin="$work_dir/data-bin"

if [[ $stage -le 0 && $stop_stage -ge 0 ]]; then
  if [[ "$generate_sample" == 1 ]]; then
    log "stage 0: generating the long-document sample into $raw_dir"
    run python "$repo/scripts/make_long_documents.py" "$raw_dir" --labelled-words "${labelled_words:-0}" \
      --labelled-evidence "${labelled_evidence:-anywhere}" --labelled "${labelled_passages:-400}"
  else
    log "stage 0: using the corpus in $raw_dir (GENERATE_SAMPLE=0)"
  fi
fi

if [[ $stage -le 1 && $stop_stage -ge 1 ]]; then
  log "stage 1: tokenising $raw_dir -> $bpe_dir"
  tokeniser=(--vocab-size "$vocab_size")
  if [[ -n "${GPT2_ENCODER_JSON:-}" || -n "${GPT2_VOCAB_BPE:-}" ]]; then
    tokeniser=(--gpt2-encoder-json "${GPT2_ENCODER_JSON:-}" --gpt2-vocab-bpe "${GPT2_VOCAB_BPE:-}")
  fi
  run python "$repo/scripts/prepare_mlm.py" --raw "$raw_dir" --out "$bpe_dir" "${tokeniser[@]}" \
    ${labelled_dir:+--labelled "$labelled_dir"}
fi

if [[ $stage -le 2 && $stop_stage -ge 2 ]]; then
  log "stage 2: fairseq-preprocess $bpe_dir -> $data_bin"
  binarise "$data_bin" --only-source --trainpref "$bpe_dir/train.bpe" --validpref "$bpe_dir/valid.bpe" \
    --testpref "$bpe_dir/test.bpe" --workers "$(nproc)"
  if [[ -n "$labelled_dir" ]]; then
    binarise "$data_bin/labelled/input0" --only-source --trainpref "$bpe_dir/labelled/input0/train.bpe" \
      --validpref "$bpe_dir/labelled/input0/valid.bpe" --srcdict "$data_bin/dict.txt" --workers "$(nproc)"
    binarise "$data_bin/labelled/label" --only-source --trainpref "$bpe_dir/labelled/label/train.label" \
      --validpref "$bpe_dir/labelled/label/valid.label" --workers "$(nproc)"
  fi
fi

if [[ $stage -le 3 && $stop_stage -ge 3 ]]; then
  for arch in $archs; do
    log "stage 3: fairseq-train --task masked_lm --arch $arch -> $work_dir/checkpoints/$arch (resumes if present)"
    # shellcheck disable=SC2086
    train_arch "$arch" "$work_dir/train_$arch.log" "$data_bin" --task masked_lm --criterion masked_lm \
      --save-dir "$work_dir/checkpoints/$arch" \
      --tokens-per-sample "$tokens_per_sample" --sample-break-mode complete_doc \
      --batch-size "$batch_size" --update-freq "$update_freq" --max-update "$max_update" \
      --optimizer adam --adam-betas "(0.9,0.98)" --adam-eps 1e-6 --weight-decay 0.01 --clip-norm 1.0 \
      --lr "$lr" --lr-scheduler polynomial_decay --warmup-updates "$warmup_updates" --total-num-update "$max_update" \
      --required-batch-size-multiple 1 --skip-invalid-size-inputs-valid-test --seed "$seed" \
      --log-format simple --log-interval 10 ${TRAIN_ARGS:-}
  done
fi

if [[ $stage -le 4 && $stop_stage -ge 4 ]]; then
  for arch in $archs; do
    log "stage 4: fairseq-validate $arch on valid and test"
    # shellcheck disable=SC2086
    run fairseq-validate "$data_bin" --user-dir "$user_dir" --task masked_lm \
      --path "$work_dir/checkpoints/$arch/checkpoint_best.pt" --valid-subset valid,test \
      --tokens-per-sample "$tokens_per_sample" --sample-break-mode complete_doc --batch-size "$batch_size" \
      --required-batch-size-multiple 1 --seed 1 ${VALID_ARGS:-} 2>&1 | tee "$work_dir/validate_$arch.log"
  done
fi

if [[ $stage -le 5 && $stop_stage -ge 5 ]]; then
  log "stage 5: perplexity table (masked tokens, ${tokens_per_sample}-token sequences)"
  table_start model parameters "valid ppl" "test ppl"
  for arch in $archs; do
    ppl=()
    for split in valid test; do
      ppl+=("$(metric "$work_dir/validate_$arch.log" 4 perplexity \
        "valid on '$split' subset.*| ppl [0-9][0-9.]*")")
    done
    params="$(logged_parameters "$work_dir/train_$arch.log" 3)"
    table_add "$arch" "$params" "${ppl[@]}"
  done
  echo
  table_print
  # the same checkpoints by where the evidence for a masked token lies (the sliding window's reach: its layers x
  # window, or EVIDENCE_REACH), each SSM model also with its SSM outputs zeroed, and the unigram reference
  reach=()
  [[ -n "${EVIDENCE_REACH:-}" ]] && reach=(--reach "$EVIDENCE_REACH")
  if [[ -z "${EVIDENCE_REACH:-}" && " $archs " != *" local_roberta_"* ]]; then
    log "stage 5: no sliding-window model in ARCHS and no EVIDENCE_REACH: no table by evidence"
  else
    checkpoints=()
    for arch in $archs; do checkpoints+=(--checkpoint "$arch=$work_dir/checkpoints/$arch/checkpoint_best.pt"); done
    for split in valid test; do
      log "stage 5: masked-token perplexity on $split by where the evidence lies"
      saved_table "$work_dir/evidence_$split.md" python "$repo/scripts/mlm_evidence_perplexity.py" "$data_bin" \
        "${checkpoints[@]}" ${reach[@]+"${reach[@]}"} --split "$split" --ablate-ssm --batch-size "$batch_size"
    done
  fi
fi

if [[ $stage -le 6 && $stop_stage -ge 6 ]]; then
  if [[ -z "$labelled_dir" ]]; then
    log "stage 6: no LABELLED_DIR, skipping sentence_prediction fine-tuning"
  else
    labels="$data_bin/labelled/label/dict.txt"
    [[ -f "$labels" ]] || { echo "missing $labels: run stage 2 with LABELLED_DIR set" >&2; exit 1; }
    classes="$(grep -c . "$labels")"
    for arch in $archs; do
      log "stage 6: fine-tuning $arch with --task sentence_prediction ($classes classes)"
      # shellcheck disable=SC2086
      train_arch "$arch" "$work_dir/finetune_$arch.log" "$data_bin/labelled" --task sentence_prediction \
        --criterion sentence_prediction --num-classes "$classes" \
        --finetune-from-model "$work_dir/checkpoints/$arch/checkpoint_best.pt" \
        --save-dir "$work_dir/checkpoints/${arch}_finetuned" \
        --init-token 0 --separator-token 2 --max-positions "$tokens_per_sample" --batch-size 16 \
        --max-epoch "$finetune_max_epoch" --optimizer adam --adam-betas "(0.9,0.98)" --adam-eps 1e-6 \
        --lr "$finetune_lr" --lr-scheduler fixed --required-batch-size-multiple 1 --no-epoch-checkpoints \
        --best-checkpoint-metric accuracy --maximize-best-checkpoint-metric --seed "$seed" \
        --log-format simple --log-interval 10 ${FINETUNE_ARGS:-}
    done
    table_start model "fine-tuned valid accuracy (%)"
    for arch in $archs; do
      accuracy="$(metric "$work_dir/finetune_$arch.log" 6 "validation accuracy" \
        "valid on 'valid' subset.*| accuracy [0-9][0-9.]*")"
      table_add "$arch" "$accuracy"
    done
    echo
    table_print
  fi
fi
