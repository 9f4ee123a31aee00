"""The `trl-ext` command: the recipes as subcommands, as `trl grpo` runs TRL's, and `trl-ext env` for bug reports.

trl-ext rlcr --config rlcr_qwen2.5_1.5b.yaml        # a shipped config by name, or a path
trl-ext replay --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_path mine.jsonl
trl-ext absolute_zero --eval_only --model_name_or_path outputs/absolute-zero-smollm2-cpu
accelerate launch -m trl_ext.cli rlcr --config ...  # several processes
trl-ext env
"""

from __future__ import annotations

import importlib
import platform
import sys


# subcommand -> (recipe module, what it trains)
RECIPES = {
    "rlcr": ("trl_ext.recipe.rlcr", "RLCR: an answer turn, then calibrated confidence (RLCRMultiTurnTrainer)"),
    "replay": ("trl_ext.recipe.replay", "GRPO with experience replay (ReplayGRPOTrainer)"),
    "absolute_zero": ("trl_ext.recipe.absolute_zero", "Absolute Zero self-play (AbsoluteZeroTrainer)"),
}
ALIASES = {"replay_grpo": "replay", "absolute-zero": "absolute_zero"}
# The packages whose versions a bug report needs, in this order.
PACKAGES = (
    "trl-ext",
    "torch",
    "transformers",
    "trl",
    "accelerate",
    "peft",
    "datasets",
    "vllm",
    "deepspeed",
    "bitsandbytes",
    "math-verify",
    "tensorboard",
)


def usage() -> str:
    lines = ["usage: trl-ext <command> [flags]", "", "commands:"]
    lines += [f"  {name:<14} {what}" for name, (_, what) in RECIPES.items()]
    lines.append(f"  {'env':<14} print the versions a bug report needs")
    lines += [
        "",
        "`trl-ext <command> --help` lists a recipe's flags; `--config NAME.yaml` takes a shipped config by name.",
    ]
    return "\n".join(lines)


def environment() -> dict[str, str]:
    """Platform, Python, the packages of `PACKAGES` (installed version or "not installed") and the accelerators."""
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    info = {"platform": platform.platform(), "python": platform.python_version()}
    for name in PACKAGES:
        try:
            info[name] = version(name)
        except PackageNotFoundError:
            info[name] = "not installed"
    from . import __file__ as location
    from . import __version__

    info["trl-ext"] = f"{__version__} ({Path(location).parent})"  # the code imported, installed or not
    if commit := _clone_commit():
        info["trl-ext commit"] = commit
    try:
        import torch

        info["CUDA (torch build)"] = torch.version.cuda or "none"
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        info["GPUs"] = ", ".join(torch.cuda.get_device_name(i) for i in range(count)) or "none"
    except ImportError:
        pass
    return info


def _clone_commit() -> str | None:
    """The commit of the clone `trl_ext` is imported from (an editable install), with `+changes` when it has
    uncommitted changes; `None` for an installed wheel."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (commit + ("+changes" if dirty else "")) or None


def main(argv=None) -> int:
    """`trl-ext <command> [flags]`: run a recipe with its flags (a `--config` naming a shipped YAML by file name
    finds it in the package), or print the environment."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    command, flags = ALIASES.get(argv[0], argv[0]), argv[1:]
    if command == "env":
        info = environment()
        print("\n".join(f"- {key}: {value}" for key, value in info.items()))
        return 0
    if command not in RECIPES:
        print(f"trl-ext: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(RECIPES[command][0])
    module.run(shipped_configs(flags))
    return 0


def shipped_configs(flags: list[str]) -> list[str]:
    """`--config NAME.yaml` naming no file here but a config shipped in the package: its path in the package."""
    from pathlib import Path

    from .recipe.cli import config_path

    flags = list(flags)
    for i, flag in enumerate(flags[:-1]):
        if flag == "--config" and not Path(flags[i + 1]).exists() and "/" not in flags[i + 1]:
            flags[i + 1] = str(config_path(flags[i + 1]))
    return flags


if __name__ == "__main__":
    sys.exit(main())
