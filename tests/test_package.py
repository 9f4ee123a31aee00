"""Package metadata and the TRL version guard."""

import importlib.metadata
import subprocess
import sys
import warnings

import pytest
from packaging.requirements import Requirement

import trl_ext
from trl_ext import compat


def test_trl_is_pinned_to_the_tested_minor():
    requires = [Requirement(r) for r in importlib.metadata.requires("trl-ext")]
    (trl_req,) = [r for r in requires if r.name == "trl" and not r.marker]
    assert "1.16.0" in trl_req.specifier and "1.16.9" in trl_req.specifier
    assert "1.17.0" not in trl_req.specifier and "1.15.2" not in trl_req.specifier
    names = {r.name for r in requires}
    assert {"transformers", "peft", "accelerate", "datasets", "math-verify", "matplotlib"} <= names
    extras = {str(r.marker) for r in requires if r.marker}
    assert any('extra == "vllm"' in e for e in extras) and any('extra == "deepspeed"' in e for e in extras)


def test_installed_trl_is_in_range_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compat.check_trl_version() is True


def test_untested_trl_warns_once_naming_the_range(monkeypatch):
    monkeypatch.setattr(compat, "_warned", False)
    with pytest.warns(UserWarning, match=r"trl<1\.17,>=1\.16\.0.*trl 1\.17\.0 is installed"):
        assert compat.check_trl_version("1.17.0") is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compat.check_trl_version("0.29.0") is False  # second time: silent


def test_import_warns_with_an_untested_trl():
    """`import trl_ext` itself performs the check (run in a fresh interpreter with a faked TRL version)."""
    code = (
        "import importlib.metadata as md, warnings\n"
        "real = md.version\n"
        "md.version = lambda name: '1.99.0' if name == 'trl' else real(name)\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import trl_ext\n"
        "print(sum('tested with trl' in str(x.message) for x in w))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "1"


def test_version_is_exposed():
    assert trl_ext.__version__ == importlib.metadata.version("trl-ext")


def _fresh_interpreter(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_import_is_cheap():
    """`import trl_ext` loads neither torch nor TRL nor transformers (the exports are lazy)."""
    out = _fresh_interpreter(
        "import sys, trl_ext\n"
        "print(sorted(m for m in ('torch', 'trl', 'transformers', 'datasets', 'peft', 'accelerate') if m in sys.modules))"
    )
    assert out == "[]"


@pytest.mark.slow  # a fresh interpreter importing TRL: seconds
def test_trainers_and_configs_are_exported_at_the_top_level():
    out = _fresh_interpreter(
        "import sys\n"
        "from trl_ext import (RLCRMultiTurnTrainer, RLCRMultiTurnConfig, ReplayGRPOTrainer, ReplayGRPOConfig,\n"
        "                     AbsoluteZeroTrainer, AbsoluteZeroConfig)\n"
        "import trl_ext.trainers as t\n"
        "same = [RLCRMultiTurnTrainer is t.RLCRMultiTurnTrainer, ReplayGRPOConfig is t.ReplayGRPOConfig,\n"
        "        AbsoluteZeroTrainer is t.AbsoluteZeroTrainer]\n"
        "print(all(same), 'trl' in sys.modules)"
    )
    assert out == "True True"


def test_every_public_name_resolves():
    assert set(trl_ext._LAZY) <= set(trl_ext.__all__) <= set(dir(trl_ext))
    for name in trl_ext.__all__:
        assert getattr(trl_ext, name) is not None
    from trl_ext.rewards import make_accuracy_reward
    from trl_ext.self_play import arithmetic_task

    assert trl_ext.make_accuracy_reward is make_accuracy_reward and trl_ext.arithmetic_task is arithmetic_task
    with pytest.raises(AttributeError, match="no attribute 'RLCRTrainer'"):
        trl_ext.RLCRTrainer  # noqa: B018


def test_the_vllm_extra_allows_only_what_trl_supports():
    """TRL 1.16 warns outside its own `vllm` extra's range (0.22.0 to 0.31.0): ours allows no more, and no less."""
    import configparser
    from pathlib import Path

    setup = configparser.ConfigParser()
    setup.read(Path(__file__).parent.parent / "setup.cfg")
    (ours,) = [Requirement(line) for line in setup["options.extras_require"]["vllm"].splitlines() if line.strip()]
    (theirs,) = [
        Requirement(r)
        for r in importlib.metadata.requires("trl")
        if Requirement(r).name == "vllm" and 'extra == "vllm"' in str(Requirement(r).marker)
    ]
    assert ours.specifier == theirs.specifier
    assert "0.31.0" in ours.specifier and "0.31.1" not in ours.specifier and "0.21.9" not in ours.specifier
