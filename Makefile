# Reproduces the verified environment of DESIGN.md section 4 in .venv, then tests or demos.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ssm_fairseq-setup

.PHONY: setup test demo check-learning seed-spread clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torchaudio 2.11's binary loads only with torch 2.11.
	$(BIN)/pip install --quiet torch==2.11.0 torchaudio==2.11.0
	# fairseq 0.12 uses numpy 1.x APIs (np.compat in its datasets): keep numpy below 2.
	$(BIN)/pip install --quiet "numpy<2" cython "setuptools<81" wheel
	# fairseq-fixed compiles against the installed torch (about 4 minutes, once).
	$(BIN)/python -c "import fairseq" 2>/dev/null || \
		$(BIN)/pip install --quiet --no-build-isolation --no-cache-dir fairseq-fixed==0.12.3.1
	$(BIN)/pip install --quiet --no-build-isolation -e ".[test,plots,deploy,serve]"
	touch $(STAMP)

# Two pytest workers (pytest-xdist), each running a whole test file at a time, so that a file's fixtures are built
# once; the 25 slowest tests are listed, to keep the suite short.
# The package's bytecode is written first: where PYTHONDONTWRITEBYTECODE is set, every one of the suite's
# hundreds of interpreters would otherwise compile the modules it imports again (about 0.2 s a command).
test: setup
	$(BIN)/python -m compileall -q ssm_fairseq scripts
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25 tests

# Trains and decodes a small MSSM transducer on the shipped mini corpus (CPU; resumes if run again).
demo: setup
	PYTHON_BIN=$(abspath $(BIN)) bash recipes/librispeech/run.sh --conf recipes/librispeech/conf/mini.sh

# Learning guard (minutes, not part of test): the demo's first 8 epochs against a recorded known-good dev curve.
check-learning: setup
	$(BIN)/python scripts/check_learning.py

# The demo over 5 seeds (WER mean, min and max; about 30 minutes on 2 cores with 2 seeds at a time: 10 per pair).
seed-spread: setup
	PYTHON_BIN=$(abspath $(BIN)) bash scripts/seed_spread.sh --conf recipes/librispeech/conf/mini.sh --jobs 2

clean:
	rm -rf $(VENV) *.egg-info
