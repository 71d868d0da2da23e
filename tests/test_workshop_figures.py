"""The workshop's memory figures (`python tools/workshop_figures.py`, `make workshop-figures`): docs/workshop.md and
the Zero-to-JupyterHub values hold exactly what the committed class load measurement gives, and the rules that turn a
measurement into figures (rounding, class sizes, Binder's fit) do what they say."""

import json
import math
from pathlib import Path

import pytest
import yaml

from tools import workshop_figures as figures

REPO = Path(__file__).resolve().parents[1]
COMMITTED = json.loads((REPO / figures.MEASURED).read_text(encoding="utf-8"))


def test_the_documents_hold_the_committed_measurements_figures():
    for path, text in figures.documents(REPO, COMMITTED).items():
        assert path.read_text(encoding="utf-8") == text, f"{path.name}: run make workshop-figures"
    assert figures.main(["--check"]) == 0


def test_the_values_file_stays_yaml_with_the_derived_memory():
    values = yaml.safe_load((REPO / figures.Z2JH_VALUES).read_text(encoding="utf-8"))["singleuser"]
    f = figures.derived(COMMITTED)
    assert values["memory"] == {"guarantee": f"{f['per_learner_gib']}G", "limit": f"{f['two_open_gib']}G"}
    assert values["cpu"] == {"guarantee": 0.1, "limit": 2}


def made_up(kernels: dict, learner_peaks: list[tuple], server=0.15, cores=2, memory=23.5, slowest=None) -> dict:
    """A measurement in the class load JSON's shape: the lone learner's kernel peak and first cell's seconds per
    notebook, and each class learner's (kernel, server) peak."""
    slowest = slowest or {nb: 4.0 for nb in {*kernels, "01", "02"}}
    learner = {
        "server_start_s": 3.0,
        "latency": {"median_s": 0.02, "p95_s": 1.0, "max_s": 9.0},
        "kernel_cpu_s": {"01": 10.0, "02": 20.0},
        "pulls": [{"seconds": 5.0, "phase": "finished"}, {"seconds": 1.0, "phase": "finished"}],
        "errors": [],
        "output_differences": [],
    }
    return {
        "date": "2026-12-06T00:00:00+00:00",
        "machine": {"cpu": "a CPU", "cores": cores, "memory_gib": memory, "load_average": [0.5, 0.5, 0.5]},
        "load_average_end": [1.0, 1.0, 1.0],
        "versions": {"jupyterhub": "6", "jupyterlab": "4", "torch": "2.13"},
        "settings": {
            "learners": len(learner_peaks),
            "notebooks": ["01", "02"],
            "lone_notebooks": sorted(kernels),
            "code_cells": 10,
            "lone_code_cells": 20,
            "think_s": 2.0,
            "stagger_s": 5.0,
            "memory_samples_s": {"lone": 0.2, "class": 1.0},
        },
        "lone": {
            **learner,
            "peak_memory_gib": {"server_rss": server, "kernel_rss": max(kernels.values()), "kernel_pss": 1.0},
            "peak_memory_by_notebook_gib": {nb: {"kernel_rss": k, "server_rss": server} for nb, k in kernels.items()},
            "first_cell_s": slowest,  # each notebook's first cell (its imports), alone
            "latency_of_class_notebooks": {"median_s": 0.03, "p95_s": 0.9, "max_s": 4.0},
            "second_pull": {"kept_edit": True, "got_update": True},
        },
        "class": {
            "errors": 0,
            "output_differences": 0,
            "second_pulls_kept_edit_and_got_update": len(learner_peaks),
            "peak_memory_per_learner_gib": 1.2,
            "machine_memory_used_at_peak_gib": 3.0,
            "latency": {"median_s": 0.03, "p95_s": 1.5, "max_s": 12.0},
            "latency_vs_lone": {"median": 1.1, "p95": 1.6},
        },
        "shared_install_unchanged": True,
        "learners": [
            {**learner, "peak_memory_gib": {"kernel_rss": k, "server_rss": s, "kernel_pss": k - 0.1}}
            for k, s in learner_peaks
        ],
    }


def test_a_learner_and_a_class_from_the_measured_peaks():
    result = made_up({"01": 0.5, "02": 1.3}, [(1.22, 0.15), (1.18, 0.16)], slowest={"01": 3.0, "02": 4.6})
    f = figures.derived(result)
    assert f["one_open_gib"] == 1.37 and f["per_learner_gib"] == 1.4  # 1.22 + 0.15, rounded up
    assert f["two_open_gib"] == 2.6  # 1.37 + 1.22 = 2.59, rounded up
    first, *others = f["rows"]
    assert (first["cores"], first["memory_gib"]) == (2, 24)  # the measured machine, its memory rounded
    assert first["one_open"] == math.floor(22 / 1.4) == 15 and first["two_open"] == math.floor(22 / 2.6) == 8
    assert first["first_cells_s"] == round(8 * 4.6 / 2) == 18  # the slowest first cell of the class's notebooks
    assert [(r["cores"], r["one_open"], r["two_open"]) for r in others] == [(8, 21, 11), (16, 44, 23), (32, 90, 48)]
    assert f["cpu_s"] == (30, 30)


def test_binder_names_each_notebook_over_its_limit():
    fits = figures.derived(made_up({"01": 0.5, "07": 1.8}, [(1.0, 0.1)], server=0.15))
    assert fits["binder_misfits"] == [] and fits["worst"] == "07"  # 1.8 + 0.15 = 1.95 GiB within 2 GiB
    over = made_up({"01": 0.5, "05": 1.9, "07": 2.1}, [(1.0, 0.1)], server=0.15)
    assert figures.derived(over)["binder_misfits"] == ["05", "07"]
    text = figures.regions(over)["notebook-memory"]
    assert "notebooks 05 (2.05 GiB), 07 (2.25 GiB) do not fit" in text
    one = figures.regions(made_up({"01": 0.5, "07": 2.1}, [(1.0, 0.1)], server=0.15))["notebook-memory"]
    assert "notebook 07 (2.25 GiB) does not fit" in one


def test_every_marker_is_filled_and_a_missing_one_is_named():
    text = "a\n<!-- generated: one (x) -->\nold\n<!-- end generated: one -->\nb\n  # generated: two\n  old\n  # end generated: two\n"
    filled = figures.fill(text, {"one": "new 1", "two": "  new 2"}, "doc")
    assert filled == (
        "a\n<!-- generated: one (x) -->\nnew 1\n<!-- end generated: one -->\nb\n  # generated: two\n  new 2\n"
        "  # end generated: two\n"
    )
    assert figures.fill(filled, {"one": "new 1", "two": "  new 2"}, "doc") == filled
    with pytest.raises(figures.FiguresError, match=r"doc: markers missing for \['three'\]"):
        figures.fill(text, {"one": "", "two": "", "three": ""}, "doc")


def test_a_measurement_without_each_notebooks_memory_is_refused():
    old = made_up({"01": 0.5}, [(1.0, 0.1)])
    del old["lone"]["peak_memory_by_notebook_gib"]
    with pytest.raises(figures.FiguresError, match="peak_memory_by_notebook_gib.*make class-load"):
        figures.derived(old)
