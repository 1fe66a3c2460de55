# The generated long-document sample (scripts/make_long_documents.py: 16 training stories of about 4000 words)
# with small models that train on 2 CPU cores in minutes. Same variables as conf/mlm.sh.
raw_dir="${RAW_DIR:-$work_dir/raw}"
labelled_dir="${LABELLED_DIR:-$work_dir/raw/labelled}"
generate_sample="${GENERATE_SAMPLE:-1}"
# 0: short labelled passages of their setting (a keyword decides the label); N: passages of about N words whose only
# evidence is one sentence anywhere in them (at 400 words, some 1,090 pieces, the MSSM model stays at chance: its
# first token forgets within about a hundred tokens; docs/masked_lm.md, "How far the first token sees")
labelled_words="${LABELLED_WORDS:-0}"
# with LABELLED_WORDS: where the one sentence of the setting stands (anywhere, or first: the control) and how many
# passages (4/5 train, 1/5 valid)
labelled_evidence="${LABELLED_EVIDENCE:-anywhere}"
labelled_passages="${LABELLED_PASSAGES:-400}"
vocab_size="${VOCAB_SIZE:-256}"
archs="${ARCHS:-mssm_roberta_base local_roberta_base}"
model_args="${MODEL_ARGS:---encoder-layers 2 --encoder-embed-dim 64 --encoder-attention-heads 4 --ssm-heads 4 \
--ssm-state-size 16}"
# equal sizes (tests/test_mssm_roberta.py checks them): 4096 learned positions would be 262k of the local model's
# parameters, so it takes the parameter-free sinusoidal ones and spends the MSSM block's parameters on its FFNs
model_args_mssm_roberta_base="${MODEL_ARGS_MSSM_ROBERTA_BASE:---encoder-ffn-embed-dim 256}"
model_args_local_roberta_base="${MODEL_ARGS_LOCAL_ROBERTA_BASE:---encoder-ffn-embed-dim 395 --encoder-sinusoidal-pos}"
tokens_per_sample="${TOKENS_PER_SAMPLE:-4096}"
batch_size="${BATCH_SIZE:-2}"
update_freq="${UPDATE_FREQ:-1}"
lr="${LR:-1e-3}"
warmup_updates="${WARMUP_UPDATES:-50}"
seed="${SEED:-1}"
max_update="${MAX_UPDATE:-400}"
finetune_lr="${FINETUNE_LR:-1e-3}"
finetune_max_epoch="${FINETUNE_MAX_EPOCH:-3}"
