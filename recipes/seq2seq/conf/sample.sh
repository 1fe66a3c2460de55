# The generated sample: denoising pre-training on short generated stories (scripts/make_long_documents.py),
# fine-tuning on the long-range copy task (scripts/make_copy_task.py: a 4-word key, 1000 filler words, then
# "recall"; the target is the key), small models that run on a CPU. Every variable can be set by its upper-case name.
raw_dir="${RAW_DIR:-$work_dir/raw}"
generate_sample="${GENERATE_SAMPLE:-1}"
copy_examples="${COPY_EXAMPLES:-1000}"
copy_distance="${COPY_DISTANCE:-1000}"
vocab_size="${VOCAB_SIZE:-250}"
archs="${ARCHS:-spade_t5_small t5_small_local}"
model_args="${MODEL_ARGS:---embed-dim 128 --ffn-embed-dim 512 --attention-heads 4 --encoder-layers 2 --decoder-layers 2 \
--attention-window 64 --ssm-state-size 32 --max-source-positions 4096 --max-target-positions 512}"
tokens_per_sample="${TOKENS_PER_SAMPLE:-512}"
pretrain_updates="${PRETRAIN_UPDATES:-100}"
finetune_updates="${FINETUNE_UPDATES:-400}"
max_tokens="${MAX_TOKENS:-8192}"
lr="${LR:-1e-3}"
beam="${BEAM:-4}"
