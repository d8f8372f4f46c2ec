# The command surface of orpo_lib. Every target does its own set-up on a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help setup test notebooks report figures bench lab ui-test strip clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 14

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[notebooks,test,trl]'
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

setup: $(STAMP)  ## create .venv with the package, notebook, test and trl extras (CPU torch)

test: $(STAMP)  ## run the test suite (CPU: Triton kernels through the interpreter)
	$(PY) -m pytest -q

notebooks: $(STAMP)  ## execute every notebook headless into build/notebooks and write the figures
	$(PY) -m orpo_lib.workbook.notebooks --out build/notebooks

report: $(STAMP)  ## execute the notebooks whose copy in build/notebooks is out of date, then write each as a self-contained HTML page, with an index, to build/report
	$(PY) -m orpo_lib.workbook.notebooks --out build/notebooks --reuse-newer
	$(PY) -m orpo_lib.workbook.report --notebooks build/notebooks --out build/report

figures: $(STAMP)  ## rebuild figures/ from the measured data in figures/data (no GPU needed)
	$(PY) -m orpo_lib.workbook.figures

bench: $(STAMP)  ## benchmark floor / baseline / fused (/ liger) into build/ (the workbook's records: python -m orpo_lib.workbook.records)
	$(PY) -m orpo_lib.workbook.bench

lab: $(STAMP)  ## open the workbook in JupyterLab (kernel python3 from .venv; no GPU: Triton interpreter)
	env -u MPLBACKEND $(PY) -m jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) notebooks

ui-test: $(STAMP)  ## run, check and screenshot every notebook in JupyterLab + Chromium (build/ui)
	test -x /usr/bin/chromium || { as_root=$$([ "$$(id -u)" = 0 ] || echo sudo); $$as_root apt-get update -qq && \
		$$as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	$(PY) -m pip install -q -c constraints.txt -e '.[notebooks,test,trl,ui-test]'
	UI_TEST=1 timeout --foreground -k 30 1800 $(PY) -m pytest -v tests/ui

strip: $(STAMP)  ## strip outputs from the committed notebooks
	$(VENV)/bin/nbstripout --extra-keys "metadata.papermill cell.metadata.papermill" notebooks/*.ipynb

clean:  ## remove build outputs (keeps .venv)
	rm -rf build .pytest_cache
