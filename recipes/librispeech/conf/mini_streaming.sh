# The shipped mini corpus with a causal MSSM transducer that streams (ssm-transcribe --stream): conf/mini.sh's data,
# optimisation and decoding, with global CMVN (utterance CMVN needs the whole utterance) and the encoder causal.
# 5 forward-only MSSM layers have the parameters of mini.sh's 4 bidirectional ones (a forward-only layer has
# 11 D x D matrices to a bidirectional layer's 14): the pair compares offline and streaming at equal size, data
# and updates. (Its figures in docs/asr.md were measured when mini.sh trained 30 epochs, peak held to epoch 20:
# MAX_EPOCH=30 HOLD_UNTIL_EPOCH=20 reproduces them.)
# shellcheck source=mini.sh
source "$repo/recipes/librispeech/conf/mini.sh"
cmvn="${CMVN:-global}"
arch="${ARCH:-mssm_transducer_streaming}"
model_args="${MODEL_ARGS:---encoder-layers 5 --encoder-embed-dim 144 --encoder-ffn-embed-dim 576 --ssm-heads 4 \
--ssm-state-size 16 --subsampler tr --predictor-embed-dim 128 --predictor-hidden-dim 128 --predictor-layers 1 \
--joint-dim 256 --aux-ctc-every 2}"
