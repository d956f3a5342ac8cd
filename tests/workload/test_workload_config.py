"""Settings and flag checks: fast, in this process (no training)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsdpctl.workload import REQUIREMENTS
from fsdpctl.workload import config as C
from fsdpctl.workload.config import ConfigError, TrainConfig, make_config, parse_args, to_argv

pytestmark = pytest.mark.workload

WORKLOAD = Path(C.__file__).parent


def test_defaults_parse():
    cfg = parse_args([])
    assert cfg == TrainConfig()
    assert cfg.fsdp == 2 and cfg.reshard_after_forward is None and cfg.no_checkpoint is False


def test_every_field_is_documented():
    assert set(C.FIELD_DOCS) == set(C.CONFIG_FIELDS)
    assert all("\n" not in doc for doc in C.FIELD_DOCS.values())


@pytest.mark.parametrize("argv, field, value", [
    (["--no-checkpoint"], "no_checkpoint", True),
    (["--no-no-checkpoint"], "no_checkpoint", False),
    (["--resume"], "resume", True),
    (["--no-resume"], "resume", False),
    (["--reshard-after-forward"], "reshard_after_forward", True),
    (["--no-reshard-after-forward"], "reshard_after_forward", False),
    (["--fsdp", "1"], "fsdp", 1),
    (["--steps", "none"], "steps", None),
    (["--lr", "1"], "lr", 1.0),
])
def test_flag_values(argv, field, value):
    assert getattr(parse_args(argv), field) == value


_values = {
    "steps": st.one_of(st.none(), st.integers(1, 10**6)),
    "batch_size": st.integers(1, 512),
    "lr": st.floats(1e-6, 1.0),
    "no_checkpoint": st.booleans(),
    "resume": st.booleans(),
    "reshard_after_forward": st.one_of(st.none(), st.booleans()),
    "sharding": st.sampled_from(["full", "grad-op", "no-shard", "hybrid"]),
    "fsdp": st.sampled_from([1, 2]),
    "dataset": st.sampled_from(["builtin", "wikitext2", "/data/my text"]),
    "export_full": st.one_of(st.none(), st.just("/tmp/out.pt")),
}


@settings(max_examples=60, deadline=None)
@given(st.fixed_dictionaries({}, optional=_values))
def test_to_argv_round_trips(values):
    """What the CLI writes with to_argv, the trainer reads back as the same config."""
    assert parse_args(to_argv(values)) == make_config(values)


@pytest.mark.parametrize("argv, name", [
    (["--batch-size", "x"], "batch_size"),
    (["--batch-size", "0"], "batch_size"),
    (["--fsdp", "3"], "fsdp"),
    (["--sharding", "zero3"], "sharding"),
    (["--mixed-precision", "fp8"], "mixed_precision"),
    (["--lr", "-1"], "lr"),
    (["--val-fraction", "1.5"], "val_fraction"),
    (["--vocab-size", "100"], "vocab_size"),
    (["--steps", "5", "--epochs", "1"], "steps"),
    (["--bogus", "1"], "command line"),
    (["--batch-size"], "command line"),
])
def test_bad_values_are_one_line_config_errors(argv, name):
    with pytest.raises(ConfigError) as info:
        parse_args(argv)
    assert info.value.name == name
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{name}: ") and "; " in text


def test_typo_flag_gets_a_suggestion():
    with pytest.raises(ConfigError, match="did you mean --steps"):
        parse_args(["--stpes", "3"])


def test_config_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"batch_size": 3, "sharding": "grad-op"}')
    cfg = parse_args(["--config", str(path), "--batch-size", "5"])
    assert (cfg.batch_size, cfg.sharding) == (5, "grad-op")  # flags override the file
    path.write_text("{broken")
    with pytest.raises(ConfigError, match="^config: "):
        parse_args(["--config", str(path)])


def test_config_module_does_not_import_torch():
    code = ("import sys, fsdpctl.workload.config as c; c.parse_args([]); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


ALLOWED_TOP = set(REQUIREMENTS)  # what doctor checks on every node: nothing else may be imported


def test_workload_modules_import_only_torch_numpy_tokenizers_stdlib():
    for path in WORKLOAD.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if name == "datasets":  # optional, imported only to fetch wikitext2
                    continue
                if path.name == "slurm_task.py" and top == "submitit":  # runs only inside submitit's task
                    continue
                if path.name == "trackers.py" and top in ("wandb", "mlflow") and node not in tree.body:
                    continue  # imported inside the tracker's start, only when a run asks for it
                assert top in ALLOWED_TOP or top in sys.stdlib_module_names, (path.name, name)


# ---------------------------------------------------------------- combinations (need torch)


@pytest.mark.parametrize("argv, name", [
    (["--fsdp", "1", "--cpu-offload"], "cpu_offload"),
    (["--compile"], "compile"),
    (["--fsdp", "2", "--backward-prefetch", "post"], "backward_prefetch"),
    (["--fsdp", "2", "--auto-wrap", "size"], "auto_wrap"),
    (["--fsdp", "1", "--reshard-after-forward"], "reshard_after_forward"),
    (["--fsdp", "1", "--no-reshard-after-forward"], "reshard_after_forward"),
    (["--sharding", "grad-op", "--reshard-after-forward"], "reshard_after_forward"),
    (["--sharding", "full", "--no-reshard-after-forward"], "reshard_after_forward"),
    (["--sharding", "no-shard", "--reshard-after-forward"], "reshard_after_forward"),
    (["--seq-len", "1000"], "seq_len"),
    (["--preset", "small", "--seq-len", "1024"], "seq_len"),
])
def test_impossible_combinations(argv, name):
    from fsdpctl.workload import parallelize

    cfg = parse_args(argv)
    with pytest.raises(ConfigError) as info:
        parallelize.check_combination(cfg, "cpu", world=2, local_world=2)
    assert info.value.name == name


@pytest.mark.parametrize("argv", [
    [], ["--fsdp", "1", "--sharding", "hybrid", "--backward-prefetch", "none"],
    ["--sharding", "hybrid", "--no-reshard-after-forward"], ["--sharding", "grad-op"],
    ["--cpu-offload", "--activation-checkpointing", "--mixed-precision", "bf16"],
    ["--fsdp", "1", "--auto-wrap", "size", "--mixed-precision", "fp16"],
])
def test_possible_combinations(argv):
    from fsdpctl.workload import parallelize

    parallelize.check_combination(parse_args(argv), "cpu", world=4, local_world=2)


def test_hybrid_needs_equal_nodes():
    from fsdpctl.workload import parallelize

    with pytest.raises(ConfigError, match="^sharding: "):
        parallelize.check_combination(parse_args(["--sharding", "hybrid"]), "cpu", 3, 2)


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # @record under capsys
@pytest.mark.parametrize("argv, name", [
    (["--compile"], "compile"),
    (["--fsdp", "2", "--backward-prefetch", "none"], "backward_prefetch"),
    (["--mixed-precision", "fp8"], "mixed_precision"),
    (["--stpes", "3"], "command line"),
])
def test_main_prints_one_line_and_exits_2(argv, name, capsys):
    """Errors found before any process group exists, through the real entry point."""
    from fsdpctl.workload import train

    with pytest.raises(SystemExit) as info:
        train.main(argv)
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1 and err.startswith(f"fsdpctl.workload: {name}: ")


def test_lr_schedule():
    from fsdpctl.workload.train import lr_at

    cfg = parse_args(["--lr", "1.0", "--min-lr", "0.1", "--warmup-steps", "4"])
    lrs = [lr_at(s, cfg, 20) for s in range(20)]
    assert lrs[:4] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert lrs[4] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:], strict=False))
    assert lr_at(20, cfg, 20) == pytest.approx(0.1)
