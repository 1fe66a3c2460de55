# Shared by the recipes' run.sh, which sets "repo" and its defaults, then sources this with its arguments
# (source "$repo/recipes/common.sh" "$@"): the command line, where the fairseq commands are, how training is
# launched, and logging.
# PYTHON_BIN: directory of python and the fairseq-* commands (and torchrun); default .venv/bin of the repository
# if present, else the PATH. USER_DIR: see below.
# NPROC (default 1): training processes per node, one per GPU. NNODES (default 1), and with NNODES > 1 also
# NODE_RANK (this node, 0 .. NNODES-1), MASTER_ADDR (node 0's address) and MASTER_PORT (default 29500): multi-node
# training. With NPROC * NNODES > 1 the training stages launch fairseq-train under torchrun (fairseq's own
# distributed data parallel training; the batch of one update is NPROC * NNODES * --update-freq batches).

# The command line: --stage N and --stop-stage N (the first and last stage run; defaults: run.sh's stage and
# stop_stage), --conf FILE where run.sh sets a default conf (the file must exist; run.sh sources it after this),
# and the recipe's own options, which run.sh lists in recipe_options ("--arch", or "--a, --b") and takes in
# recipe_option OPTION VALUE. Anything else exits 2 naming every option the recipe accepts.
recipe_usage="--stage, --stop-stage${recipe_options:+, $recipe_options}${conf:+, --conf}"
while [[ $# -gt 0 ]]; do
  [[ "$1" =~ ^--[a-z-]+$ && ", $recipe_usage, " == *", $1, "* ]] ||
    { echo "unknown argument: $1 (expected $recipe_usage)" >&2; exit 2; }
  [[ $# -ge 2 ]] || { echo "$1 needs a value" >&2; exit 2; }
  case "$1" in
    --stage) stage="$2" ;;
    --stop-stage) stop_stage="$2" ;;
    --conf) conf="$2" ;;
    *) recipe_option "$1" "$2" ;;
  esac
  shift 2
done
[[ "${stage-0}" =~ ^[0-9]+$ ]] || { echo "--stage takes a stage number, got '$stage'" >&2; exit 2; }
[[ "${stop_stage-0}" =~ ^[0-9]+$ ]] || { echo "--stop-stage takes a stage number, got '$stop_stage'" >&2; exit 2; }
[[ "$recipe_usage" != *--conf || -f "$conf" ]] || { echo "no such conf file: $conf" >&2; exit 2; }

bin="${PYTHON_BIN:-}"
if [[ -z "$bin" && -x "$repo/.venv/bin/fairseq-train" ]]; then bin="$repo/.venv/bin"; fi
run() { "${bin:+$bin/}$@"; }
log() { echo "[$(date '+%H:%M:%S')] $*"; }
# arch_args ARCH: the conf's model_args (MODEL_ARGS) and its model_args_ARCH, the arguments of one architecture
# (what makes the compared models equal in size)
arch_args() { local own="model_args_$1"; echo "$model_args ${!own:-}"; }
# train_arch ARCH LOG DATA ARGS...: fairseq_train (below) on DATA for architecture ARCH, with the plugin, the conf's
# arguments of ARCH (arch_args) and ARGS; prints fairseq-train's output and appends it to LOG
train_arch() {
  local arch="$1" train_log="$2" data="$3"
  shift 3
  # shellcheck disable=SC2046
  fairseq_train "$data" --user-dir "$user_dir" --arch "$arch" $(arch_args "$arch") "$@" 2>&1 | tee -a "$train_log"
}

# binarise DEST ARGS...: fairseq-preprocess ARGS --destdir DEST, restartable and safe for the checkpoints trained on
# DEST. It writes DEST.new and moves it to DEST only when the dictionary it built (DEST.new/dict.txt) is the one
# DEST already has, if any: a changed corpus or tokenisation would otherwise give old checkpoints a new dictionary
# of the same size without an error (fairseq checks sizes only). A different dictionary exits naming both files.
binarise() {
  local dest="$1"
  shift
  rm -rf "$dest.new"
  run fairseq-preprocess "$@" --destdir "$dest.new"
  if [[ -f "$dest/dict.txt" ]] && ! cmp -s "$dest/dict.txt" "$dest.new/dict.txt"; then
    echo "$dest.new/dict.txt differs from $dest/dict.txt, the dictionary of the models trained on $dest: the" \
      "corpus or its tokenisation changed. Remove $dest and those checkpoints to start again with the new" \
      "dictionary (or restore the old corpus)." >&2
    exit 1
  fi
  rm -rf "$dest"
  mv "$dest.new" "$dest"
}

# Reading numbers from fairseq's logs. A reader that finds none exits non-zero, naming the file and the stage that
# writes it: assign its output before use (x="$(metric ...)"), so that set -e ends the recipe there.
# logged FILE PATTERN: the number that ends the last match of PATTERN (grep's basic regular expression) in FILE;
# empty when there is none or no FILE
logged() { { grep -so -- "$2" "$1" || true; } | tail -n 1 | awk '{print $NF}'; }
# metric FILE STAGE WHAT PATTERN: the number `logged FILE PATTERN` finds; exits naming FILE when it is missing (run
# STAGE first) or holds no WHAT (STAGE scored nothing)
metric() {
  local value
  [[ -f "$1" ]] || { echo "missing $1: run stage $2 first" >&2; exit 1; }
  value="$(logged "$1" "$4")"
  [[ -n "$value" ]] || { echo "no $3 in $1 (written by stage $2): nothing was scored" >&2; exit 1; }
  echo "$value"
}
# logged_parameters LOG STAGE: the parameter count (with its commas) fairseq-train, run by STAGE, wrote to LOG
logged_parameters() { metric "$1" "$2" "parameter count" 'num. shared model params: [0-9][0-9,]*'; }
# scored_tokens LOG: the number of tokens fairseq-eval-lm scored in LOG; fails naming LOG when there are none
# (eval-lm then still prints "Evaluated 0 tokens ... Perplexity: 1.00" and exits 0)
scored_tokens() {
  local tokens
  tokens="$(logged "$1" 'Evaluated [0-9][0-9,]*' | tr -d ,)"
  [[ -n "$tokens" && "$tokens" -gt 0 ]] || {
    echo "no token was scored in $1 (was TOKENS_PER_SAMPLE longer than the split or than the model was trained" \
      "on?)" >&2; return 1; }
  echo "$tokens"
}
# mean_range NUMBER...: their mean (min-max) to two decimals, or the one number alone
mean_range() {
  printf '%s\n' "$@" | awk '{s += $1; n++; if (n == 1 || $1 < lo) lo = $1; if (n == 1 || $1 > hi) hi = $1}
    END {if (n == 1) printf "%.2f", s; else printf "%.2f (%.2f-%.2f)", s / n, lo, hi}'
}

# Result tables, in markdown. A table is gathered row by row and printed whole by table_print, so that a number that
# cannot be read ends the recipe before any row is printed: never a partial table, nor one that scored nothing.
# table_start TITLE...: starts a table (the variable "table") with these column titles
table_start() {
  table="$(table_row "$@")"$'\n'"|$(printf -- '---|%.0s' "$@")"
  table_rows=0
}
# table_row CELL...: prints the markdown row "| CELL | CELL |"
table_row() { printf '|'; printf ' %s |' "$@"; printf '\n'; }
# table_add CELL...: adds a row to the table; exits when a cell is empty (its reader failed in an argument)
table_add() {
  local cell
  for cell in "$@"; do
    [[ -n "$cell" ]] || { echo "an empty cell in the row of $1: nothing was scored" >&2; exit 1; }
  done
  table+=$'\n'"$(table_row "$@")"
  table_rows=$((table_rows + 1))
}
# table_print [FILE]: prints the table (and writes it to FILE); exits when it has no row
table_print() {
  [[ "$table_rows" -gt 0 ]] || { echo "nothing was scored: no row in the table" >&2; exit 1; }
  printf '%s\n' "$table" | tee ${1:+"$1"}
}
# saved_table FILE COMMAND...: runs COMMAND (run), which prints a markdown table, into FILE, then prints an empty
# line and FILE
saved_table() {
  local file="$1"
  shift
  run "$@" > "$file"
  echo
  cat "$file"
}

# USER_DIR: the plugin directory given to fairseq's --user-dir; default: the ssm_fairseq package that this python
# imports (what `python -m ssm_fairseq.user_dir` prints: the clone with `make setup`'s editable install, or an
# installed wheel), so that fairseq runs the same code as the preparation and averaging commands. Found without
# importing the package (which imports fairseq: seconds).
user_dir="${USER_DIR:-}"
if [[ -z "$user_dir" ]]; then
  find_package='import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("ssm_fairseq").origin))'
  user_dir="$(run python -c "$find_package" 2>/dev/null)" || {
    echo "cannot import ssm_fairseq with ${bin:+$bin/}python: run 'make setup' or pip install the package" >&2
    exit 1
  }
fi

nproc_per_node="${NPROC:-1}"
num_nodes="${NNODES:-1}"
[[ "$nproc_per_node" =~ ^[1-9][0-9]*$ ]] ||
  { echo "NPROC must be a positive integer, got '$nproc_per_node'" >&2; exit 2; }
[[ "$num_nodes" =~ ^[1-9][0-9]*$ ]] || { echo "NNODES must be a positive integer, got '$num_nodes'" >&2; exit 2; }
if [[ "$num_nodes" -gt 1 ]]; then
  [[ "${NODE_RANK:-}" =~ ^[0-9]+$ && "${NODE_RANK}" -lt "$num_nodes" ]] ||
    { echo "NNODES=$num_nodes needs NODE_RANK (0 to $((num_nodes - 1))), got '${NODE_RANK:-}'" >&2; exit 2; }
  [[ -n "${MASTER_ADDR:-}" ]] || { echo "NNODES=$num_nodes needs MASTER_ADDR (the address of node 0)" >&2; exit 2; }
fi

# fairseq_train ARGS...: fairseq-train ARGS in this process, or with NPROC * NNODES > 1 one fairseq-train per
# process under torchrun. fairseq 0.12 reads torchrun's environment only when its world size (default: the GPUs
# visible) is above 1, else every process trains alone (exit 0, the same checkpoints written by all), and then
# takes the GPU from RANK % GPU count, which divides by zero on CPU. So the world size and env:// are given here;
# rank -1 lets torch read RANK, and fairseq takes the device from LOCAL_RANK. Without MASTER_ADDR / MASTER_PORT
# a single node rendezvouses on a free local port (torchrun --standalone). On CPU add to TRAIN_ARGS:
# --cpu --distributed-backend gloo --ddp-backend legacy_ddp (fairseq's pytorch_ddp wrapper needs a GPU).
fairseq_train() {
  local world=$((nproc_per_node * num_nodes))
  if [[ "$world" -eq 1 ]]; then
    run fairseq-train "$@"
    return
  fi
  local launch=(--nproc_per_node "$nproc_per_node" --nnodes "$num_nodes")
  [[ -n "${NODE_RANK:-}" ]] && launch+=(--node_rank "$NODE_RANK")
  [[ -n "${MASTER_ADDR:-}" ]] && launch+=(--master_addr "$MASTER_ADDR")
  [[ -n "${MASTER_PORT:-}" ]] && launch+=(--master_port "$MASTER_PORT")
  [[ "$num_nodes" -eq 1 && -z "${MASTER_ADDR:-}${MASTER_PORT:-}" ]] && launch+=(--standalone)
  log "torchrun: $nproc_per_node processes on this node, $world in all"
  run torchrun "${launch[@]}" --no-python "${bin:+$bin/}fairseq-train" "$@" --distributed-world-size "$world" \
    --distributed-init-method env:// --distributed-no-spawn --distributed-rank -1
}
