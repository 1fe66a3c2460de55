# Masked LM on a long-document corpus at Table 4's scale (MSSM paper section 4.2): 24-layer models of width
# 1024, 4096-token sequences, a batch of 8 sequences per GPU on 32 GPUs (here: --update-freq 32 on one),
# 100k updates with RoBERTa-large's optimiser. Every variable can be overridden by its upper-case name.
raw_dir="${RAW_DIR:-data/mlm}"                    # train.txt valid.txt test.txt: paragraphs, empty line between documents
labelled_dir="${LABELLED_DIR:-}"                  # train.tsv valid.tsv (label<TAB>text) for stage 6; empty: skip it
generate_sample="${GENERATE_SAMPLE:-0}"          # 1: stage 0 writes the generated sample into raw_dir
vocab_size="${VOCAB_SIZE:-32000}"                 # SentencePiece; GPT2_ENCODER_JSON + GPT2_VOCAB_BPE select GPT-2 BPE
archs="${ARCHS:-mssm_roberta_large local_roberta_large}"
model_args="${MODEL_ARGS:-}"
tokens_per_sample="${TOKENS_PER_SAMPLE:-4096}"
batch_size="${BATCH_SIZE:-8}"
update_freq="${UPDATE_FREQ:-32}"
lr="${LR:-3e-4}"
warmup_updates="${WARMUP_UPDATES:-10000}"
seed="${SEED:-1}"
max_update="${MAX_UPDATE:-100000}"
finetune_lr="${FINETUNE_LR:-1e-5}"
finetune_max_epoch="${FINETUNE_MAX_EPOCH:-10}"
