# SPADE section 5.1 and Table 8 (Base): spade_t5_base and its local-only twin, pre-trained with denoising on
# RAW_DIR/pretrain.{train,valid}.txt (sequence 1024, peak lr 4e-4, 10k warm-up) and fine-tuned on
# RAW_DIR/{train,valid,test}.{src,tgt}. A batch of 2048 sequences is --max-tokens 16384 x --update-freq on your GPUs.
raw_dir="${RAW_DIR:-data/seq2seq}"
generate_sample="${GENERATE_SAMPLE:-0}"
vocab_size="${VOCAB_SIZE:-32000}"
archs="${ARCHS:-spade_t5_base t5_base_local}"
ablate_archs="${ABLATE_ARCHS:-spade_t5_base}"
model_args="${MODEL_ARGS:---max-source-positions 16384 --max-target-positions 1024}"
tokens_per_sample="${TOKENS_PER_SAMPLE:-1024}"
pretrain_updates="${PRETRAIN_UPDATES:-125000}"
finetune_updates="${FINETUNE_UPDATES:-20000}"
label_smoothing="${LABEL_SMOOTHING:-0.1}"
max_tokens="${MAX_TOKENS:-16384}"
lr="${LR:-4e-4}"
beam="${BEAM:-4}"
seed="${SEED:-1}"
