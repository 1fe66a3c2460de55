# Shared by the recipes' run.sh (sourced after "repo" is set): where the fairseq commands are, and logging.
# PYTHON_BIN: directory of python and the fairseq-* commands; default .venv/bin of the repository if present.
bin="${PYTHON_BIN:-}"
if [[ -z "$bin" && -x "$repo/.venv/bin/fairseq-train" ]]; then bin="$repo/.venv/bin"; fi
run() { "${bin:+$bin/}$@"; }
log() { echo "[$(date '+%H:%M:%S')] $*"; }
