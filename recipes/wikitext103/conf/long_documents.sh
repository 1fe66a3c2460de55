# The generated long-document sample (scripts/make_long_documents.py: 400 training stories of about 4000 words,
# people and places drawn from a pool of 64 names, so which names a story uses is known only from its earlier
# text), with three models of equal size (within 0.1%) that train in minutes each on 2 CPU cores:
# spade_lm (a global S4 layer at the bottom, window 16), local_lm (the same without the S4 layer, a wider FFN)
# and fairseq's transformer_lm (full causal attention over the 512-token block). Same variables as
# conf/wikitext103.sh.
data_dir="${DATA_DIR:-$work_dir/raw}"
generate_sample="${GENERATE_SAMPLE:-1}"
sample_args="${SAMPLE_ARGS:---train 400 --valid 4 --test 4 --words 4000 --name-pool 64 --split-punctuation}"
archs="${ARCHS:-spade_lm local_lm transformer_lm}"
seeds="${SEEDS:-1 2 3}"
model_args="${MODEL_ARGS:---decoder-layers 2 --decoder-embed-dim 64 --decoder-attention-heads 4 --dropout 0.1}"
model_args_spade_lm="${MODEL_ARGS_SPADE_LM:---decoder-ffn-embed-dim 256 --attention-window 16 --ssm-state-size 64}"
model_args_local_lm="${MODEL_ARGS_LOCAL_LM:---decoder-ffn-embed-dim 321 --attention-window 16}"
model_args_transformer_lm="${MODEL_ARGS_TRANSFORMER_LM:---decoder-ffn-embed-dim 321 --decoder-input-dim 64 \
--decoder-output-dim 64 --decoder-normalize-before}"
tokens_per_sample="${TOKENS_PER_SAMPLE:-512}"
context_window="${CONTEXT_WINDOW:-0}"
reach="${REACH:-}"
# the invented names: capitalised words other than the sentence openings the generator writes
word_pattern="${WORD_PATTERN:-(?!(This|The|Everyone|At|After|In|Before|That)\$)[A-Z][a-z]+}"
optim_args="${OPTIM_ARGS:---max-tokens 4096 --update-freq 1 --max-update 1500 --optimizer adam \
--adam-betas (0.9,0.98) --lr 2e-3 --lr-scheduler inverse_sqrt --warmup-updates 100 --warmup-init-lr 1e-07 \
--clip-norm 1.0 --validate-interval-updates 250}"
