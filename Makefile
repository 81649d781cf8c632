# Two commands do all the set-up on a fresh machine (Python >= 3.10):
#   make book   builds the website into _build/html
#   make test   runs every test: pytest on tests/ and nbval on book/
# Both create .venv and install what the book needs. TORCH picks the torch build: the default
# pins the CPU-tested release; `make book TORCH=torch` takes whatever pip resolves.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATA ?= ../shared/data/multi30k
# test processes: one per core (the tests wait on kernels, browsers and graders about half the time), and the cores
# shared out among them: torch's threads spin while they wait, and two processes of two threads on two cores ran
# some cells fifteen times as slowly as one process did
CORES := $(shell nproc 2>/dev/null || echo 2)
JOBS ?= $(CORES)
NBVAL := --nbval-lax --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
MODEL := book/_static/model
FIXTURES := web/test/fixtures/fixtures.json

.PHONY: book test setup data export outputs vendor-vega clean

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3" >/dev/null
	touch $@

setup: $(STAMP)

# Fill the Multi30k cache from a local copy when there is one; otherwise the loader downloads.
data: $(STAMP)
	@if [ -d "$(DATA)" ]; then $(BIN)/python -m aiayn.data prime "$(DATA)"; else $(BIN)/python -m aiayn.data fetch; fi

# The page "Try the model": ONNX Runtime Web from npm (package-lock.json), and the shipped models as ONNX graphs with
# what the page loads, made again when a model, the exporter, the page's scripts or the figures it quotes change.
# Without npm the page says that its files are missing.
node_modules/.package-lock.json: package-lock.json
	@command -v npm >/dev/null || { echo "npm is not installed: the page 'Try the model' will lack its model"; exit 0; }
	npm ci --no-audit --no-fund

$(MODEL)/manifest.json: $(STAMP) node_modules/.package-lock.json pretrained/en-de.pt pretrained/de-en.pt \
		aiayn/browser.py $(wildcard web/*.js web/*.css results/browser_*.json)
	@if [ -d node_modules/onnxruntime-web ]; then $(BIN)/python -m aiayn.browser export --out $(MODEL); fi

# What `node --test web/test/` (run by tests/test_browser.py) compares the page's JavaScript against.
$(FIXTURES): $(MODEL)/manifest.json
	@if [ -f $< ]; then $(BIN)/python -m aiayn.browser fixtures --model-dir $(MODEL) --out $(dir $@); fi

book: data $(MODEL)/manifest.json
	$(BIN)/jupyter-book build . -W -n --keep-going

test: data $(FIXTURES)
	$(BIN)/python -m aiayn._export --check
	$(BIN)/ruff format --check --quiet . && $(BIN)/ruff check --quiet .
	OMP_NUM_THREADS=$$(( $(CORES) / $(JOBS) > 1 ? $(CORES) / $(JOBS) : 1 )) \
		$(BIN)/python -m pytest -p no:cacheprovider --durations=25 -n $(JOBS) --dist loadfile tests book $(NBVAL)

# Write the chapters' export cells into aiayn/.
export: $(STAMP)
	$(BIN)/python -m aiayn._export

# Re-execute every chapter in place, refreshing the outputs stored in the notebooks.
outputs: data
	$(BIN)/python -m aiayn._book execute

vendor-vega: $(STAMP)
	$(BIN)/python -m aiayn._book vendor-vega

clean:
	rm -rf _build $(MODEL) $(dir $(FIXTURES))
