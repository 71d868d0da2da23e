"""The validation boundary: every check of what a caller hands the package, each rule written once.

A public entry (a notebook step, a runner's `generate`, a model's forward) calls one check at its top and then states
its rule plainly, as TensorRT-LLM's run.py does. `values` checks plain Python values (ints with the bool guard,
numbers) and imports no torch, so the pure-Python modules (`toy.shapes`, `grounding`, `files`) stay light; `tensors`
checks what is handed over as tensors: token ids, tasks, dtypes, prompt tables, image spans, finite values.
"""
