"""tools/stage_drift.py at the toy model's size: the JSON the GPU run writes at full size, with the fields docs/diff.md
fills its table from, and its refusals of a bad command line."""

import json

import pytest

from tools import stage_drift


@pytest.mark.slow
def test_the_toy_models_drift_is_written_as_json_with_the_tables_fields(tmp_path, capsys):
    assert stage_drift.main(["--model", "toy", "--engines", "float16/torch,float32/numba", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "stage_drift-toy.json").read_text())
    assert results["hardware"].startswith("CPU") and "stage_drift" in results["command"]
    assert results["sizes"]["lm_layers"] == "4" and results["tf32"] is False
    half, numba = results["runs"]
    assert (half["engine_dtype"], half["backend"], numba["backend"]) == ("float16", "torch", "numba")
    assert half["first_diverging_stage"] is None and half["same_answer"] and numba["first_diverging_stage"] is None
    rows = {row["name"]: row for row in half["stages"]}
    assert set(rows["layers.3"]) >= {"rel", "rel_over_u", "cosine", "tolerance", "status", "rel_over_tolerance"}
    assert rows["input_vit"]["dtype"] == "float16" and 0 < rows["input_vit"]["rel_over_u"] < 4
    assert "no divergence" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "toy", "--lm-layers", "2"], "use them with --model qwen-vl-chat"),
        (["--engines", "float16"], "is not DTYPE/BACKEND"),
        (["--engines", "float8/torch"], "is not DTYPE/BACKEND"),
        (["--engines", "float16/tensorrt"], "is not DTYPE/BACKEND"),
    ],
)
def test_a_bad_command_line_is_refused(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        stage_drift.main([*argv, "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
