"""The workbook and benchmark layer, above the loss: the notebooks' helpers and the GPU harness.

The loss (``orpo_lib`` itself) never imports this package; everything here imports the loss.

* ``bench`` — the benchmark harness (``python -m orpo_lib.workbook.bench``): every provider interleaved on
  the same inputs, recorded as JSON with provenance in ``figures/data/``.
* ``trl_bench`` — TRL's ``ORPOTrainer`` and ``FusedORPOTrainer`` trained side by side on models shaped like real
  ones: step time, tokens/s, peak memory, the most pairs a step fits.
* ``measurements`` — reading those records back: tables, ratios, captions.
* ``memory`` — the analytic model of the bytes each implementation holds.
* ``derivation`` — the numbers notebook 1 shows (gradients against float64, the stable log(1 - p)).
* ``kernel_tour`` — notebook 2's toy rows, float64 references, the library's row kernels on them and the
  chunk plan as data.
* ``plots``, ``widgets`` — the figures and the ipywidgets views of the notebooks.
* ``figures`` — rebuilds ``figures/`` from ``figures/data/`` (``make figures``).
* ``notebooks`` — runs the notebooks headless with papermill (``make notebooks``).
* ``report`` — writes the executed notebooks as self-contained HTML pages with an index (``make report``).
* ``gpu_notebooks`` — runs the notebooks on a GPU machine without Jupyter, GPU cells included, and records them.
* ``record`` — the small JSON record a notebook writes, which the tests read.
"""
