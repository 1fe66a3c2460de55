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
cmvn="${CMVN:-utterance}"                         # global: training-set CMVN (gcmvn.npz), what streaming models need
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
# exact beam search, no --blank-penalty: what measured best on the mini corpus's dev set (not measured on
# LibriSpeech); stage 8 sweeps BLANK_PENALTIES below
beam="${BEAM:-4}"
decode_max_tokens="${DECODE_MAX_TOKENS:-100000}"
# Language-model fusion (stages 6-8): spade_lm (its defaults: 6 layers of 512, window 128, an S4 global layer) on
# the LibriSpeech LM corpus (openslr 11, 800 M words; stage 6 downloads it when download=1), validated on valid_sets'
# transcripts. Not run by us: the sizes and the weights are a starting point, not measured settings.
lm_train_text="${LM_TRAIN_TEXT-$(dirname "$corpus_root")/librispeech-lm-norm.txt.gz}"
lm_arch="${LM_ARCH:-spade_lm}"
lm_model_args="${LM_MODEL_ARGS:-}"
lm_train_args="${LM_TRAIN_ARGS:---sample-break-mode complete --tokens-per-sample 512 --max-tokens 16384 --lr 5e-4 \
--warmup-updates 4000 --max-update 200000 --skip-invalid-size-inputs-valid-test}"
lm_weights="${LM_WEIGHTS:-0 0.1 0.2 0.3 0.4}"
# LODR (stage 8): each weight above 0 subtracts that times a bigram of the training transcripts (built by stage 6)
# from every fused unit's score, at each LM weight above 0; 0 alone: shallow fusion only
ilm_weights="${ILM_WEIGHTS:-0}"
# stage 8: each blank penalty (fairseq-generate --blank-penalty, icefall's) at each pair of weights, the length
# reward for the deletions fusion adds; 0 alone: none
blank_penalties="${BLANK_PENALTIES:-0}"
