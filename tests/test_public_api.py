"""The public names resolve from `qwenvl_lab`, and `import qwenvl_lab` stays light."""

import subprocess
import sys

import pytest

import qwenvl_lab


def test_every_public_name_resolves_to_its_step_module():
    for name in qwenvl_lab.__all__:
        obj = getattr(qwenvl_lab, name)
        assert obj.__module__.startswith("qwenvl_lab."), name


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        qwenvl_lab.nope  # noqa: B018


def test_import_does_not_load_the_model_or_transformers():
    code = "import sys, qwenvl_lab; print('transformers' in sys.modules, 'qwenvl_lab.modeling' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
