"""Every accelerate config parses with accelerate's own loader into the intended setup."""

from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType


CONFIGS = Path(__file__).parents[2] / "accelerate_configs"
EXPECTED = {
    "single_gpu.yaml": (DistributedType.NO, 1),
    "multi_gpu.yaml": (DistributedType.MULTI_GPU, 8),
    "zero2.yaml": (DistributedType.DEEPSPEED, 8),
    "zero3.yaml": (DistributedType.DEEPSPEED, 8),
    "fsdp2.yaml": (DistributedType.FSDP, 8),
    "fsdp2_generation.yaml": (DistributedType.FSDP, 8),
}


def test_every_config_is_covered():
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_loads_with_accelerate(name):
    config = load_config_from_file(str(CONFIGS / name))
    distributed_type, num_processes = EXPECTED[name]
    assert config.distributed_type == distributed_type
    assert config.num_processes == num_processes
    assert config.mixed_precision == "bf16" and not config.use_cpu
    if name.startswith("zero"):
        assert config.deepspeed_config["zero_stage"] == int(name[4])
    if name.startswith("fsdp2"):
        assert config.fsdp_config["fsdp_version"] == 2
        # kept gathered after the forward: generation all-gathers once per step, not once per token
        assert config.fsdp_config["fsdp_reshard_after_forward"] == (name == "fsdp2.yaml")
    # What `accelerate launch --config_file` does with it before spawning anything
    args = launch_command_parser().parse_args(["--config_file", str(CONFIGS / name), "recipes/rlcr.py"])
    args, _, _ = _validate_launch_command(args)
    assert args.num_processes == num_processes
    assert args.use_deepspeed == (distributed_type == DistributedType.DEEPSPEED)
    assert args.use_fsdp == (distributed_type == DistributedType.FSDP)
    assert args.multi_gpu == (distributed_type == DistributedType.MULTI_GPU)
