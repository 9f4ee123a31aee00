"""The `trl-ext` console command (`trl_ext.cli:main`): recipes as subcommands, shipped configs by name, `trl-ext env`;
and the package data that makes them work from an installed wheel."""

import configparser
import fnmatch
from importlib.resources import files
from pathlib import Path

import pytest

from trl_ext import cli


ROOT = Path(__file__).parent.parent


def test_env_prints_the_versions_a_bug_report_needs(capsys):
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    for name in ("python", "trl-ext", "torch", "transformers", "trl", "accelerate", "peft", "GPUs"):
        assert f"- {name}: " in out, name
    assert "- vllm: " in out  # installed version or "not installed"


def test_usage_and_unknown_commands(capsys):
    assert cli.main([]) == 0 and "trl-ext rlcr" not in capsys.readouterr().err
    assert cli.main(["nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'nope'" in err and "absolute_zero" in err


@pytest.mark.parametrize(
    "command, module", [("rlcr", "rlcr"), ("replay_grpo", "replay"), ("absolute_zero", "absolute_zero")]
)
def test_a_subcommand_runs_its_recipe_with_a_shipped_config_by_name(command, module, monkeypatch, tmp_path):
    import importlib

    recipe = importlib.import_module(f"trl_ext.recipe.{module}")
    calls = []
    monkeypatch.setattr(recipe, "run", calls.append)
    monkeypatch.chdir(tmp_path)
    name = recipe.DEFAULT_CONFIG
    assert cli.main([command, "--config", name, "--max_steps", "2"]) == 0
    (argv,) = calls
    assert Path(argv[1]) == Path(str(files("trl_ext.recipe") / "configs" / name)) and argv[2:] == ["--max_steps", "2"]
    (tmp_path / "mine.yaml").write_text("max_steps: 1\n")
    cli.main([command, "--config", "mine.yaml"])
    assert calls[-1] == ["--config", "mine.yaml"]  # a file here wins


def test_the_console_script_and_the_configs_ship_with_the_package():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    assert setup["options.entry_points"]["console_scripts"].split() == ["trl-ext", "=", "trl_ext.cli:main"]
    patterns = setup["options.package_data"]["trl_ext.recipe"].split()
    shipped = sorted(p.name for p in Path(str(files("trl_ext.recipe") / "configs")).glob("*.yaml"))
    assert len(shipped) >= 9
    assert all(any(fnmatch.fnmatch(f"configs/{name}", pattern) for pattern in patterns) for name in shipped)
    # a clone's recipes/configs is the same folder, so `--config recipes/configs/...` keeps working
    assert sorted(p.name for p in (ROOT / "recipes" / "configs").glob("*.yaml")) == shipped
