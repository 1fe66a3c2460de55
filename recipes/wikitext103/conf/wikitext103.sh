# WikiText-103 at the paper's scale (SPADE appendix C.3 on Baevski & Auli, 2019): stage 0 downloads the corpus,
# the 16-layer adaptive-input models train for 286k updates of 3 x 3072 tokens with NAG and a cosine schedule.
# Every variable can be overridden by its upper-case name.
data_dir="${DATA_DIR:-data/wikitext-103}"          # wiki.{train,valid,test}.tokens
generate_sample="${GENERATE_SAMPLE:-0}"           # 1: stage 0 writes the generated sample into data_dir instead
sample_args="${SAMPLE_ARGS:-}"                    # scripts/make_long_documents.py's options for that sample
archs="${ARCHS:-spade_lm_wiki103}"                 # also local_lm_wiki103 (the baseline without the global layer)
seeds="${SEEDS:-1}"                               # one training run per architecture and seed
model_args="${MODEL_ARGS:-}"                      # for every architecture (a conf may also set model_args_ARCH)
tokens_per_sample="${TOKENS_PER_SAMPLE:-3072}"
context_window="${CONTEXT_WINDOW:-400}"           # stage 3: tokens of context before each scored block
reach="${REACH:-}"                                # stage 5's near/beyond boundary (default: layers x window)
word_pattern="${WORD_PATTERN:-}"                  # stage 5 also scores the words matching it alone (re.fullmatch)
# the batch, optimiser and schedule (TRAIN_ARGS adds arguments after them)
optim_args="${OPTIM_ARGS:---max-tokens $tokens_per_sample --update-freq 3 --max-update 286000 --optimizer nag --lr 1.0 \
--lr-scheduler cosine --lr-period-updates 270000 --t-mult 2 --lr-shrink 0.75 --warmup-updates 16000 \
--warmup-init-lr 1e-07 --stop-min-lr 1e-09 --clip-norm 0.1}"
