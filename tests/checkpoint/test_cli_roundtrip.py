"""The ckpt round trip (issue 24): every ``safetorch ckpt`` command reads every layout the
library writes, takes ``--allow`` as ``st.load(allow=)`` does, says what it does not carry
over; ``CheckpointSaver``'s save()/save_state()/resume() agree or refuse the mix."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, Tuple

import pytest
import torch

import safetorch as st
from safetorch import _compat
from safetorch._cli import main
from safetorch.checkpoint import _cli_convert, _cli_progress
from safetorch.checkpoint import cli as ckpt_cli
from safetorch.errors import CheckpointError, UnsafeCheckpointError

TIMEOUT = 180  # seconds a child may take (torch's import included, on a loaded machine)

TRAIN = textwrap.dedent(
    """
    import sys, torch, safetorch as st

    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                   torch.nn.Linear(8, 2))

    def step(model, opt):
        x = torch.randn(16, 4)
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        return float(loss)

    if __name__ == "__main__":
        directory, epochs = sys.argv[1], int(sys.argv[2])
        model = build()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        saver = st.CheckpointSaver(directory, mode="min", top_k=1, max_history=2)
        resumed = saver.resume(model=model, optimizer=opt)
        start = 0 if resumed is None else resumed["epoch"] + 1
        print("resumed", resumed)
        for epoch in range(start, epochs):
            loss = step(model, opt)
            saver.save_state(epoch=epoch, metric=loss, model=model, optimizer=opt)
        print("kept", [p.rsplit("/", 1)[-1] for p in saver.kept])
    """
)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def _child(args: List[str], cwd: Path) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _ckpt(cwd: Path, *args: str) -> "subprocess.CompletedProcess[str]":
    return _child(["-m", "safetorch", "ckpt", *args], cwd)


def _run(*argv: str) -> Tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)
    )


@pytest.mark.slow
def test_train_save_resume_convert_diff_through_the_cli(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    (tmp_path / "train.py").write_text(TRAIN)
    run = tmp_path / "run"
    # train: two epochs, then a restart that resumes and trains two more
    first = _child(["train.py", str(run), "2"], tmp_path)
    assert first.returncode == 0 and "resumed None" in first.stdout, first.stderr
    again = _child(["train.py", str(run), "4"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert "resumed {'epoch': 1," in again.stdout, again.stdout
    newest = run / "state-000003.pt"
    assert newest.exists()

    # inspect: the saver directory stands for its newest state, the state file for its model
    ins = _ckpt(tmp_path, "inspect", "run")
    assert ins.returncode == 0, ins.stderr
    assert "CheckpointSaver directory" in ins.stdout
    assert "state-000003.pt" in ins.stdout and "CheckpointSaver.resume restores it" in ins.stdout
    assert "st.save_state checkpoint: objects model, optimizer" in ins.stdout
    assert "state dict: model (9 entries" in ins.stdout
    keys = _ckpt(tmp_path, "inspect", str(newest), "--keys", "--json")
    assert keys.returncode == 0, keys.stderr
    rows = json.loads(keys.stdout)["keys"]
    assert {r["state_dict"] for r in rows} == {"model"} and len(rows) == 9

    # convert: safetensors keeps the model and names what it leaves; torch keeps everything
    conv = _ckpt(tmp_path, "convert", "run", "model.safetensors", "--json")
    assert conv.returncode == 0, conv.stderr
    summary = json.loads(conv.stdout)
    assert summary["key"] == "model" and summary["tensors"] == 9
    assert summary["dropped"] == ["optimizer", "epoch", "metric", "rng"]
    text = _ckpt(tmp_path, "convert", str(newest), "again.safetensors")
    assert "not carried over: optimizer, epoch, metric, rng" in text.stdout, text.stderr
    copy = _ckpt(tmp_path, "convert", str(newest), "copy.pt", "--json")
    assert copy.returncode == 0 and json.loads(copy.stdout)["dropped"] == [], copy.stderr
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    assert st.load_state(tmp_path / "copy.pt", model=model, optimizer=opt)["epoch"] == 3

    # diff: the directory, the state file, its safetensors and DCP copies hold the same model
    same = _ckpt(tmp_path, "diff", "run", "model.safetensors")
    assert same.returncode == 0 and "identical: 9 equal" in same.stdout, same.stderr
    older = _ckpt(tmp_path, "diff", str(run / "state-000002.pt"), str(newest), "--json")
    assert older.returncode == 1, older.stderr
    assert json.loads(older.stdout)["value_changed"]
    if _compat.HAS_DCP:
        dcp = _ckpt(tmp_path, "convert", str(newest), "dcp", "--to", "dcp")
        assert dcp.returncode == 0, dcp.stderr
        back = _ckpt(tmp_path, "diff", "dcp", "model.safetensors")
        assert back.returncode == 0 and "identical" in back.stdout, back.stderr
        keyed = _ckpt(tmp_path, "diff", "dcp", str(newest), "--key", "model")
        assert keyed.returncode == 0 and "identical" in keyed.stdout, keyed.stderr
        code, out, err = _run("ckpt", "inspect", str(tmp_path / "dcp"))
        assert code == 0 and "state dict: model (9 tensors" in out, err

    # fit: what st.load_state_dict would do with the saver directory
    (tmp_path / "rt_models.py").write_text(TRAIN.replace('__name__ == "__main__"', "False"))
    fit = _ckpt(tmp_path, "fit", "run", "--model", "rt_models:build")
    assert fit.returncode == 0 and "fits" in fit.stdout, fit.stderr


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 4)).sum().backward()
    opt.step()
    return Path(st.save_state(tmp_path / "state.pt", model=model, optimizer=opt, epoch=3))


def test_state_file_is_read_as_load_state_dict_reads_it(state_file: Path, tmp_path: Path) -> None:
    code, out, err = _run("ckpt", "inspect", str(state_file))
    assert code == 0, err
    assert "state dict: model (9 entries; st.load_state_dict loads it)" in out
    assert "values epoch" in out and "RNG of 1 rank(s)" in out
    code, out, err = _run("ckpt", "inspect", str(state_file), "--keys", "*.weight")
    assert code == 0 and "[model]" in out and "0.weight" in out, err
    code, out, _ = _run("ckpt", "inspect", str(state_file), "--key", "model", "--json")
    assert code == 0 and json.loads(out)["state_dict_key"] == "model"
    # --key names what st.load_state_dict(key=) names: an object of the state file
    code, _, err = _run("ckpt", "inspect", str(state_file), "--key", "objects")
    assert code == 2 and "key='objects'" in err and "'model', 'optimizer'" in err
    with pytest.raises(CheckpointError, match="key='objects'"):
        st.load_state_dict(_model(), state_file, key="objects")
    code, out, err = _run(
        "ckpt", "convert", str(state_file), str(tmp_path / "m.pt"), "--key", "model"
    )
    assert code == 0, err
    assert "not carried over: optimizer, epoch, rng" in out
    assert sorted(st.load(tmp_path / "m.pt")) == sorted(_model().state_dict())


def test_convert_names_the_container_keys_it_drops(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    net = _model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    src = tmp_path / "ckpt.pt"
    torch.save({"state_dict": net.state_dict(), "optimizer": opt.state_dict(), "epoch": 4}, src)
    dst = tmp_path / "m.safetensors"
    code, out, err = _run("ckpt", "convert", str(src), str(dst), "--json")
    assert code == 0, err
    assert json.loads(out)["dropped"] == ["optimizer", "epoch"]
    code, out, err = _run("ckpt", "convert", str(src), str(tmp_path / "again.safetensors"))
    assert "not carried over: optimizer, epoch" in out and "--to torch keeps" in out
    code, out, _ = _run("ckpt", "convert", str(src), str(tmp_path / "all.pt"), "--json")
    assert json.loads(out)["dropped"] == []


@pytest.mark.skipif(not _compat.HAS_DCP, reason="torch.distributed.checkpoint needs torch 2.0")
def test_diff_reads_dcp_directories_and_shard_indexes(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    net = _model()
    src = tmp_path / "m.pt"
    torch.save({"state_dict": torch.nn.DataParallel(net).state_dict()}, src)
    assert _run("ckpt", "convert", str(src), str(tmp_path / "dcp"), "--to", "dcp")[0] == 0
    shards = tmp_path / "shards"
    argv = ["ckpt", "convert", str(src), str(shards), "--to", "safetensors"]
    assert _run(*argv, "--max-shard-size", "100B")[0] == 0
    for a, b in (
        ("dcp", "m.pt"),
        ("shards", "dcp"),
        ("shards/model.safetensors.index.json", "m.pt"),
    ):
        code, out, err = _run("ckpt", "diff", str(tmp_path / a), str(tmp_path / b))
        assert code == 0 and "identical" in out, (a, b, err)


def test_allow_is_st_load_allow_on_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("safetensors")
    (tmp_path / "rt_config.py").write_text(
        "import torch\n"
        "class Config:\n    def __init__(self):\n        self.lr = 0.1\n"
        "def build():\n    return torch.nn.Linear(4, 2)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("SAFETORCH_ALLOW", raising=False)
    import rt_config

    src = tmp_path / "cfg.pt"
    torch.save({"state_dict": rt_config.build().state_dict(), "config": rt_config.Config()}, src)
    with pytest.raises(UnsafeCheckpointError):
        st.load(src)
    assert st.load(src, allow=["rt_config.Config"])["config"].lr == 0.1  # the semantics to match
    out = tmp_path / "o.safetensors"
    commands = [
        ["inspect", str(src)],
        ["inspect", str(src), "--keys"],
        ["convert", str(src), str(out)],
        ["diff", str(src), str(src)],
        ["fit", str(src), "--model", "rt_config:build"],
    ]
    for argv in commands:
        code, stdout, stderr = _run("ckpt", *argv)
        assert code == 1 and "rt_config.Config" in stdout + stderr, (argv, stdout, stderr)
    for extra, env in ((["--allow", "rt_config.Config"], None), ([], "x.Y,rt_config.Config")):
        if env is not None:
            monkeypatch.setenv("SAFETORCH_ALLOW", env)
        for argv in commands:
            code, stdout, stderr = _run("ckpt", *argv, *extra)
            assert code == 0, (argv, env, stderr)
            if out.exists():
                out.unlink()
    code, _, err = _run("ckpt", "inspect", str(src), "--allow", "not a name")
    assert code == 2 and "--allow 'not a name'" in err


def test_verify_accepts_allow_and_a_saver_directory(tmp_path: Path) -> None:
    saver = st.CheckpointSaver(tmp_path / "run")
    saver.save({"w": torch.ones(2)}, epoch=0, metric=1.0)
    code, out, err = _run("ckpt", "verify", str(tmp_path / "run"), "--allow", "a.B")
    assert code == 0 and "2 files" in out, (out, err)  # best.pt and last.pt, every file


# --- CheckpointSaver: save()/save_state()/resume() agree or refuse the mix --------------------
def test_resume_after_save_says_why_it_cannot(tmp_path: Path) -> None:
    net = _model()
    saver = st.CheckpointSaver(tmp_path)
    saver.save({"model": net.state_dict(), "epoch": 0}, epoch=0, metric=1.0)
    with pytest.raises(CheckpointError, match=r"save\(\).*st.load_state_dict"):
        saver.resume(model=net)
    with pytest.raises(CheckpointError, match="last.pt"):
        st.CheckpointSaver(tmp_path).resume(model=net)  # a restarted run is told the same
    assert st.CheckpointSaver(tmp_path / "fresh").resume(model=net) is None


def test_save_and_save_state_refuse_to_share_a_directory(tmp_path: Path) -> None:
    net = _model()
    saver = st.CheckpointSaver(tmp_path / "a")
    saver.save({"model": net.state_dict()}, epoch=0, metric=1.0)
    with pytest.raises(ValueError, match="directory of their own"):
        saver.save_state(epoch=1, metric=0.5, model=net)
    states = st.CheckpointSaver(tmp_path / "b")
    states.save_state(epoch=0, metric=1.0, model=net)
    with pytest.raises(ValueError, match="holds save_state"):
        states.save({"model": net.state_dict()}, epoch=1, metric=0.5)
    with pytest.raises(ValueError, match="holds save_state"):
        st.CheckpointSaver(tmp_path / "b").save({}, epoch=1, metric=0.5)  # after a restart too


def test_top_k_with_save_is_refused_not_ignored(tmp_path: Path) -> None:
    for kwargs in ({"top_k": 3}, {"max_history": 2}, {"top_k": 0}):
        saver = st.CheckpointSaver(tmp_path, **kwargs)
        with pytest.raises(ValueError, match="apply to\\s+save_state"):
            saver.save({"w": torch.ones(1)}, epoch=0, metric=1.0)
    assert not (tmp_path / "last.pt").exists()


def test_ckpt_reads_a_save_directory_as_its_last_checkpoint(tmp_path: Path) -> None:
    saver = st.CheckpointSaver(tmp_path / "run", mode="max")
    for epoch, acc in enumerate([0.5, 0.7, 0.6]):
        saver.save({"model": _model().state_dict(), "epoch": epoch}, epoch=epoch, metric=acc)
    code, out, err = _run("ckpt", "inspect", str(tmp_path / "run"))
    assert code == 0, err
    assert "last checkpoint of CheckpointSaver.save (epoch 2)" in out
    code, out, err = _run("ckpt", "diff", str(tmp_path / "run"), str(tmp_path / "run/last.pt"))
    assert code == 0 and "identical" in out, err


# --- Ctrl-C and the progress bar ----------------------------------------------------------------
def test_interrupt_leaves_no_file_and_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("safetensors")
    src = tmp_path / "m.pt"
    torch.save(_model().state_dict(), src)

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    for dst, target in (
        ("o.pt", "torch.save"),
        ("o.safetensors", "safetorch.checkpoint._cli_convert._write_safetensors"),
    ):
        monkeypatch.setattr(target, interrupted)
        code, out, err = _run("ckpt", "convert", str(src), str(tmp_path / dst))
        monkeypatch.undo()
        assert code == 130 and out == "" and err == "safetorch ckpt convert: interrupted\n"
        assert sorted(os.listdir(tmp_path)) == ["m.pt"], os.listdir(tmp_path)


def test_interrupt_while_torch_imports_is_one_line(tmp_path: Path) -> None:
    """Ctrl-C during the seconds torch takes to import (the commonest moment): exit 130."""
    code = (
        "import sys, builtins\n"
        "real = builtins.__import__\n"
        "def imp(name, *a, **k):\n"
        "    if name == 'torch' or name.startswith('torch.'):\n"
        "        raise KeyboardInterrupt\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = imp\n"
        "from safetorch._cli import main\n"
        "raise SystemExit(main(sys.argv[1:]))\n"
    )
    done = _child(["-c", code, "ckpt", "diff", "a.pt", "b.pt"], tmp_path)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "safetorch ckpt diff: interrupted\n"


class _FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_throttled_in_binary_units(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(_cli_progress.time, "monotonic", lambda: clock[0])
    stream = _FakeTTY()
    bar = _cli_progress._Progress(10 * 2**20, stream, True)
    bar.start(10 * 2**20, "reading")
    for _ in range(1000):  # 1000 reads within 1 second: at most 10 redraws
        bar.advance(10 * 1024)
        clock[0] += 0.001
    assert bar.draws <= 11
    bar.finish()
    bar.close()
    text = stream.getvalue()
    assert "100.0% 10.0 MiB/10.0 MiB" in text and " MB" not in text and text.endswith("\n")
    erased = _FakeTTY()
    failed = _cli_progress._Progress(100, erased, True)
    failed.update(50, "writing", force=True)
    failed.close(ok=False)
    assert erased.getvalue().endswith("\r\x1b[K")  # erased: the error line stands alone


@pytest.mark.parametrize("dst", ["o.pt", "o.safetensors"])
def test_progress_covers_reading_and_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dst: str
) -> None:
    if dst.endswith(".safetensors"):
        pytest.importorskip("safetensors")
    src = tmp_path / "m.pt"
    torch.save({"w": torch.randn(256, 256), "b": torch.randn(256)}, src)
    monkeypatch.setattr(_cli_progress, "PROGRESS_MIN_BYTES", 0)
    stream = _FakeTTY()
    ckpt_cli.convert_checkpoint(str(src), str(tmp_path / dst), progress_stream=stream)
    text = stream.getvalue()
    assert "reading" in text and "writing" in text and "100.0%" in text
    assert torch.equal(st.load(tmp_path / dst)["w"], st.load(src)["w"])
    quiet = io.StringIO()  # not a terminal: nothing at all
    ckpt_cli.convert_checkpoint(str(src), str(tmp_path / ("q" + dst)), progress_stream=quiet)
    assert quiet.getvalue() == ""


def test_own_safetensors_writer_reads_back_with_safetensors(tmp_path: Path) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    tensors = {
        "f32": torch.randn(3, 4),
        "i64": torch.arange(5),
        "bool": torch.tensor([True, False]),
        "bf16": torch.randn(7).to(torch.bfloat16),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(2.5, dtype=torch.float16),
    }
    bar = _cli_progress._Progress(1, io.StringIO(), False)
    with open(tmp_path / "t.safetensors", "wb") as fh:
        _cli_convert._write_safetensors(tensors, fh, bar)
    back = safetensors_torch.load_file(str(tmp_path / "t.safetensors"))
    assert sorted(back) == sorted(tensors)
    for key, value in tensors.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value), key
    from safetorch.checkpoint.verify import verify_checkpoint

    assert verify_checkpoint(str(tmp_path / "t.safetensors")).ok
