# LibriSpeech 960 h, MSSM paper section 4.1. Sourced by run.sh; every variable can be overridden from the
# environment (e.g. ARCH=stateformer_transducer, MAX_TOKENS=20000).
corpus_root="${CORPUS_ROOT:-data/LibriSpeech}"   # holds the subsets, as unpacked from openslr
download="${DOWNLOAD:-1}"                         # stage 0 fetches missing subsets from openslr
train_sets="${TRAIN_SETS:-train-clean-100 train-clean-360 train-other-500}"
train_name="${TRAIN_NAME:-train-960}"             # the combined training manifest
valid_sets="${VALID_SETS:-dev-clean,dev-other}"
eval_sets="${EVAL_SETS:-dev-clean dev-other test-clean test-other}"
vocab_size="${VOCAB_SIZE:-4096}"
specaugment="${SPECAUGMENT:-1}"
time_mask_width="${TIME_MASK_WIDTH:-100}"         # SpecAugment LD policy
arch="${ARCH:-mssm_transducer}"
model_args="${MODEL_ARGS:-}"
# Pruned RNN-T: at 4097 units the whole-batch lattice of a 40000-frame batch is tens of GB; the pruned loss is
# 6-11x faster with 6.7x less memory (scripts/benchmarks/rnnt_loss.py). CRITERION_ARGS="" trains the full lattice
# (add --joint-sub-batch N to bound its memory).
criterion_args="${CRITERION_ARGS---rnnt-loss pruned --prune-range 5}"
# Adam, linear warmup over 8000 updates, hold until epoch 60, then x0.96 per epoch, up to 200 epochs. The paper
# does not give the peak learning rate or the batch (it fills 32 A100s); these are ours.
lr="${LR:-1e-3}"
warmup_updates="${WARMUP_UPDATES:-8000}"
hold_until_epoch="${HOLD_UNTIL_EPOCH:-60}"
decay_per_epoch="${DECAY_PER_EPOCH:-0.96}"
max_epoch="${MAX_EPOCH:-200}"
max_tokens="${MAX_TOKENS:-40000}"
update_freq="${UPDATE_FREQ:-1}"
average_last="${AVERAGE_LAST:-10}"
# exact beam search, no --blank-penalty: what measured best on the mini corpus (not measured on LibriSpeech)
beam="${BEAM:-4}"
decode_max_tokens="${DECODE_MAX_TOKENS:-100000}"
