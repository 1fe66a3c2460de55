# The generated sample: denoising pre-training on short generated stories (scripts/make_long_documents.py),
# fine-tuning on the far-ordering task (scripts/make_order_task.py: two marker words, each 4 times in a row, among
# 120 filler words, at least 35 words apart and from either end; the target is the two markers in source order),
# small models that run on a CPU: 2 + 2 layers of 128 whose attention windows reach 2 x 16 pieces, so that no
# marker's encoding sees the other (filler words between them see both: a gap under twice the reach lets a local
# model learn the order from them, docs/seq2seq.md). Every variable can be set by its upper-case name.
raw_dir="${RAW_DIR:-$work_dir/raw}"
generate_sample="${GENERATE_SAMPLE:-1}"
order_examples="${ORDER_EXAMPLES:-2000}"
order_length="${ORDER_LENGTH:-120}"
order_gap="${ORDER_GAP:-35}"
order_run="${ORDER_RUN:-4}"
vocab_size="${VOCAB_SIZE:-250}"
archs="${ARCHS:-spade_t5_small t5_small_local}"
ablate_archs="${ABLATE_ARCHS:-spade_t5_small}"
model_args="${MODEL_ARGS:---embed-dim 128 --attention-heads 4 --encoder-layers 2 --decoder-layers 2 \
--attention-window 16 --ssm-state-size 32 --max-source-positions 1024 --max-target-positions 512}"
# equal sizes: the local model's wider FFN makes up for the S4 global layers (1,086,080 against 1,088,384)
model_args_spade_t5_small="${MODEL_ARGS_SPADE_T5_SMALL:---ffn-embed-dim 512}"
model_args_t5_small_local="${MODEL_ARGS_T5_SMALL_LOCAL:---ffn-embed-dim 640}"
tokens_per_sample="${TOKENS_PER_SAMPLE:-512}"
pretrain_updates="${PRETRAIN_UPDATES:-100}"
finetune_updates="${FINETUNE_UPDATES:-800}"
max_tokens="${MAX_TOKENS:-4096}"
lr="${LR:-2e-3}"
beam="${BEAM:-4}"
seed="${SEED:-1}"
