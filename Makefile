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
NBVAL := --nbval-lax --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

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

book: data
	$(BIN)/jupyter-book build . -W -n --keep-going

test: data
	$(BIN)/python -m aiayn._export --check
	$(BIN)/ruff format --check --quiet . && $(BIN)/ruff check --quiet .
	$(BIN)/python -m pytest -p no:cacheprovider tests book $(NBVAL)

# Write the chapters' export cells into aiayn/.
export: $(STAMP)
	$(BIN)/python -m aiayn._export

# Re-execute every chapter in place, refreshing the outputs stored in the notebooks.
outputs: data
	$(BIN)/python -m aiayn._book execute

vendor-vega: $(STAMP)
	$(BIN)/python -m aiayn._book vendor-vega

clean:
	rm -rf _build
