# The shipped espeak-ng mini corpus (recipes/librispeech/mini) with a small mssm_transducer: what `make demo`
# runs on 2 CPU cores. Same variables as conf/librispeech.sh.
corpus_root="${CORPUS_ROOT:-$repo/recipes/librispeech/mini/LibriSpeech}"
download="${DOWNLOAD:-0}"
train_sets="${TRAIN_SETS:-train-mini}"
train_name="${TRAIN_NAME:-}"
valid_sets="${VALID_SETS:-dev-mini}"
eval_sets="${EVAL_SETS:-dev-mini test-mini test-large}"   # test-large: 600 utterances, a WER tight enough to compare seeds
vocab_size="${VOCAB_SIZE:-128}"
specaugment="${SPECAUGMENT:-0}"                   # 1 slows the demo's convergence more than it helps
time_mask_width="${TIME_MASK_WIDTH:-20}"          # with SPECAUGMENT=1: utterances are about 2 s
cmvn="${CMVN:-utterance}"                         # global: training-set CMVN (gcmvn.npz), what streaming models need
arch="${ARCH:-mssm_transducer}"
model_args="${MODEL_ARGS:---encoder-layers 4 --encoder-embed-dim 144 --encoder-ffn-embed-dim 576 --ssm-heads 4 \
--ssm-state-size 16 --subsampler tr --predictor-embed-dim 128 --predictor-hidden-dim 128 --predictor-layers 1 \
--joint-dim 256 --aux-ctc-every 2}"
# On CPU our exact PyTorch RNN-T loss is faster than torchaudio's (scripts/benchmarks/rnnt_loss.py); the auxiliary
# CTC on layers 2 and 4 at full weight makes the encoder align within the few minutes the demo has. The full loss,
# not the pruned one: at 128 units its lattice is small, and the pruned loss (--rnnt-loss pruned
# --prune-warmup-updates 300) measured 12.0 / 16.6 dev / test WER against the full loss's 15.1 / 13.3 (one run
# each, 18 epochs, an earlier release: CHANGELOG.md).
criterion_args="${CRITERION_ARGS:---rnnt-backend pytorch --aux-ctc-weight 1.0}"
lr="${LR:-3e-3}"
warmup_updates="${WARMUP_UPDATES:-100}"
# 40 epochs, peak held to epoch 28: with 18 epochs (hold to 12) the dev loss was still falling steeply at the end
# and the test-mini WER over seeds 1-5 ranged 14.6-22.3% (a seed's luck was how far it got); 30 epochs (hold to
# 20) gave means of 12.0 and 13.0% in two runs, 40 epochs 11.4%, and on the 600 utterances of test-large the
# 40-epoch seeds are within 1.4x of each other (docs/asr.md: make demo over seeds; test-mini's 60 utterances
# cannot tell seeds that close apart). Averaging 5 or 10 epochs, SpecAugment with or without frequency masks and
# dropout 0.2 did not help; a higher or lower peak lr (6e-3, 2e-3) or smaller or larger batches (750, 3000 frames)
# learned more slowly over the first 8 epochs.
hold_until_epoch="${HOLD_UNTIL_EPOCH:-28}"
decay_per_epoch="${DECAY_PER_EPOCH:-0.8}"
max_epoch="${MAX_EPOCH:-40}"
max_tokens="${MAX_TOKENS:-1500}"
update_freq="${UPDATE_FREQ:-1}"
average_last="${AVERAGE_LAST:-3}"
# exact beam search (the default --search), no --blank-penalty: best on test-mini in one run of an earlier
# release (CHANGELOG.md); stage 4's modified search and blank penalty are DECODE_ARGS="--search modified
# --blank-penalty 0.5" (stage 8 sweeps its own blank penalties, BLANK_PENALTIES below, and refuses one in DECODE_ARGS)
beam="${BEAM:-4}"
decode_max_tokens="${DECODE_MAX_TOKENS:-20000}"
# Language-model fusion (stages 6-8): a small spade_lm on the training transcripts (lm_train_text empty), then the
# search of stage 4 fused with it at each of lm_weights (0: without the LM). Another LM_ARCH needs its own
# LM_MODEL_ARGS (e.g. LM_ARCH=transformer_lm LM_MODEL_ARGS="--decoder-layers 2 --decoder-embed-dim 128
# --decoder-input-dim 128 --decoder-output-dim 128 --decoder-ffn-embed-dim 512 --decoder-attention-heads 4
# --dropout 0.3": 429k parameters against the spade_lm's 482k; without the input and output dims, 659k).
lm_train_text="${LM_TRAIN_TEXT:-}"
lm_arch="${LM_ARCH:-spade_lm}"
lm_model_args="${LM_MODEL_ARGS:---decoder-layers 2 --decoder-embed-dim 128 --decoder-ffn-embed-dim 512 \
--decoder-attention-heads 4 --attention-window 32 --ssm-state-size 16 --dropout 0.3}"
lm_train_args="${LM_TRAIN_ARGS:---sample-break-mode eos --tokens-per-sample 128 --max-tokens 2048 --lr 1e-3 \
--warmup-updates 50 --max-update 600}"
lm_weights="${LM_WEIGHTS:-0 0.1 0.2 0.3 0.5}"
# LODR (stage 8): each weight above 0 subtracts that times a bigram of the training transcripts (built by stage 6)
# from every fused unit's score, at each LM weight above 0; 0 alone: shallow fusion only
ilm_weights="${ILM_WEIGHTS:-0 0.2}"
# stage 8: each blank penalty (fairseq-generate --blank-penalty, icefall's) at each pair of weights, the length
# reward for the deletions fusion adds; 0 alone: none
blank_penalties="${BLANK_PENALTIES:-0 1}"
