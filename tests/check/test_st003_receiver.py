"""ST003 reads which module a strict ``load_state_dict`` loads into, and what a loaded name
holds until it is bound anew (issue 33, stop 58; found on the fourteenth and fifteenth batches'
ST003 findings, retired into development for the purpose before their reasons were read).

- A class of the project with its own ``load_state_dict`` made every strict load of the
  project "may take more than tensors" (no fix, a message citing that class), also a load
  into a plain module of another class. ``nn.Module.load_state_dict`` runs the module's own
  ``_load_from_state_dict`` and its submodules', never a submodule's ``load_state_dict``, so
  a class's own ``load_state_dict`` matters only for a module of that class (or a subclass).
  Where every module the load goes into is built from a class that neither has nor inherits
  one, the fix stays offered; anywhere the module is unknown, or a ``_load_from_state_dict``,
  ``set_extra_state`` or state-dict hook exists, nothing changes.
- ``ckpt = torch.load(p)`` ... ``ckpt = Net.from_pretrained(ckpt["name"])`` ...
  ``ckpt.eval()``: the module method is called on what the name holds after its rebinding,
  not on the file; it is no evidence that the file holds a whole module.

Each case sits beside its control; the idioms are written here in our own words.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Iterator, List

import pytest
from _check_project import TORCH_LOAD_WARNS, fresh_project, project_findings, write_project

from safetorch.check.config import Settings
from safetorch.check.engine import Diagnostic

torch = pytest.importorskip("torch")

UNSET = Settings()

SPEAKER = """
    import torch


    class SpeakerNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def load_state_dict(self, state_dict, strict=True):
            renamed = {k.replace("old.", ""): v for k, v in state_dict.items()}
            return super().load_state_dict(renamed, strict)


    class Vocoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.out = torch.nn.Linear(4, 1)
"""


@pytest.fixture(autouse=True)
def _fresh_projects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from fresh_project(tmp_path, monkeypatch, ("nets",))


def _one(root: Path, name: str) -> Diagnostic:
    found: List[Diagnostic] = project_findings(root, "ST003", UNSET)[name]
    (finding,) = found
    return finding


def _app(body: str) -> str:
    return "\n    import torch\n    from nets import SpeakerNet, Vocoder\n\n" + body


@pytest.mark.parametrize(
    "body",
    [
        "    voc = Vocoder()\n    voc.load_state_dict(torch.load('voc.pt', map_location='cpu'))\n",
        "    voc = Vocoder().to('cpu').eval()\n    sd = torch.load('voc.pt')\n"
        "    voc.load_state_dict(sd)\n",
        "    net = torch.nn.Linear(4, 4)\n    net.load_state_dict(torch.load('n.pt'))\n",
        "    voc = Vocoder()\n    voc.load_state_dict(torch.load('voc.pt'))\n"
        "    voc = voc.half().to('cpu')\n\n    def helper():\n        voc = make_anything()\n",
    ],
    ids=["plain-class", "through-a-name", "torch-class", "moved-and-shadowed"],
)
def test_a_load_into_a_module_of_a_plain_class_keeps_its_fix(tmp_path: Path, body: str) -> None:
    write_project(tmp_path, {"nets.py": SPEAKER, "app.py": _app(body)})
    finding = _one(tmp_path, "app.py")
    assert "own load_state_dict" not in finding.message
    assert finding.fix is not None


@pytest.mark.parametrize(
    "body",
    [
        "    spk = SpeakerNet()\n    spk.load_state_dict(torch.load('spk.pt'))\n",
        "    def restore(model, path):\n        model.load_state_dict(torch.load(path))\n",
        "    voc = Vocoder()\n    voc = SpeakerNet() if voc else voc\n"
        "    voc.load_state_dict(torch.load('spk.pt'))\n",
        "    voc = Vocoder()\n    voc = SpeakerNet()\n    voc.load_state_dict(torch.load('spk.pt'))\n",
        "    for voc in [Vocoder()]:\n        voc.load_state_dict(torch.load('v.pt'))\n",
        "    def make():\n        return Vocoder()\n\n    voc = make()\n"
        "    voc.load_state_dict(torch.load('v.pt'))\n",
        "    class Child(SpeakerNet):\n        pass\n\n    c = Child()\n"
        "    c.load_state_dict(torch.load('c.pt'))\n",
    ],
    ids=[
        "own-class",
        "parameter",
        "maybe-own",
        "rebound-to-own",
        "loop-target",
        "factory",
        "subclass",
    ],
)
def test_a_load_that_may_reach_the_own_load_state_dict_gets_no_fix(
    tmp_path: Path, body: str
) -> None:
    write_project(tmp_path, {"nets.py": SPEAKER, "app.py": _app(body)})
    finding = _one(tmp_path, "app.py")
    assert "own load_state_dict (nets.py:" in finding.message
    assert finding.fix is None


def test_an_aliased_import_of_the_own_class_gets_no_fix(tmp_path: Path) -> None:
    app = """
        import torch
        from nets import SpeakerNet as S

        spk = S()
        spk.load_state_dict(torch.load("spk.pt"))
    """
    write_project(tmp_path, {"nets.py": SPEAKER, "app.py": app})
    assert _one(tmp_path, "app.py").fix is None


@pytest.mark.parametrize("method", ["_load_from_state_dict", "set_extra_state"])
def test_a_submodule_hook_anywhere_still_blocks_the_fix(tmp_path: Path, method: str) -> None:
    # A submodule's _load_from_state_dict / set_extra_state runs inside any module's load.
    nets = (
        SPEAKER
        + f"""

    class Meter(torch.nn.Module):
        def {method}(self, *args):
            pass
"""
    )
    body = "    voc = Vocoder()\n    voc.load_state_dict(torch.load('voc.pt'))\n"
    write_project(tmp_path, {"nets.py": nets, "app.py": _app(body)})
    finding = _one(tmp_path, "app.py")
    assert f"own {method}" in finding.message or "own load_state_dict" in finding.message
    assert finding.fix is None


class _Raising(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(2, 2)

    def load_state_dict(self, state_dict, strict=True, assign=False):  # type: ignore[override]
        raise AssertionError("a submodule's own load_state_dict ran")


@TORCH_LOAD_WARNS
def test_torch_runs_no_submodule_load_state_dict_and_refuses_objects_in_a_strict_load(
    tmp_path: Path,
) -> None:
    # Side by side with torch, what the rule relies on: a module holding a submodule whose
    # class has its own load_state_dict loads without running it; a strict load of a plain
    # module refuses any value that is not a tensor, so what loads into it is what a
    # weights-only load reads.
    outer = torch.nn.Sequential(_Raising(), torch.nn.Linear(2, 2))
    outer.load_state_dict(outer.state_dict())
    with pytest.raises(AssertionError, match="own load_state_dict ran"):
        outer[0].load_state_dict(outer[0].state_dict())
    plain = torch.nn.Linear(2, 2)
    bad = {"weight": torch.nn.Identity(), "bias": torch.zeros(2)}
    with pytest.raises(RuntimeError, match="expected torch.Tensor"):
        plain.load_state_dict(bad)
    torch.save(plain.state_dict(), tmp_path / "plain.pt")
    plain.load_state_dict(torch.load(tmp_path / "plain.pt", weights_only=True))
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "bad.pt", weights_only=True)


def test_a_name_bound_anew_is_no_whole_module_evidence(tmp_path: Path) -> None:
    reader = """
        import torch
        from transformers import AutoModel


        def load_reader(path):
            model = torch.load(path, map_location="cpu")
            name = model["arguments"]["model"]
            model = AutoModel.from_pretrained(name)
            model.eval()
            return model
    """
    write_project(tmp_path, {"reader.py": reader})
    assert "whole module" not in _one(tmp_path, "reader.py").message


@pytest.mark.parametrize(
    "tail",
    [
        "    model.eval()\n    model = None\n",
        "    if path:\n        model = None\n    model.eval()\n",
        "    model = wrap(model.eval())\n",
        "    model = (model.get('ema') or model['model']).float()\n    model.eval()\n",
    ],
    ids=[
        "use-before-rebinding",
        "rebound-in-a-branch",
        "used-in-the-rebinding",
        "rebound-to-a-part-of-it",
    ],
)
def test_a_module_method_before_or_beside_a_rebinding_still_counts(
    tmp_path: Path, tail: str
) -> None:
    reader = (
        "\n    import torch\n\n\n    def load_reader(path, wrap):\n"
        "        model = torch.load(path, map_location='cpu')\n"
        + "".join("    " + line + "\n" for line in tail.splitlines())
    )
    write_project(tmp_path, {"reader.py": reader})
    finding = _one(tmp_path, "reader.py")
    assert "evidently holds a whole module" in finding.message
    assert finding.fix is None


_LOAD = "m.load_state_dict(torch.load('v.pt'))\n"
# Hostile projects (a red team's, stop 58): each may load into a module whose own
# load_state_dict takes the dict, or cannot be proven not to; the fix stays withheld.
HOSTILE = {
    "alias-defined-in-nets": ("Alias = SpeakerNet\n", "from nets import Alias\nm = Alias()\n"),
    "capitalised-factory": (
        "def Build():\n    return SpeakerNet()\n",
        "from nets import Build\nm = Build()\n",
    ),
    "subclass-of-an-aliased-base": (
        "",
        "from nets import SpeakerNet as Base\n\nclass Mine(Base):\n    pass\n\nm = Mine()\n",
    ),
    "method-assigned-in-a-class": (
        "",
        "from nets import SpeakerNet\n\nclass Mine(torch.nn.Module):\n"
        "    load_state_dict = SpeakerNet.load_state_dict\n\nm = Mine()\n",
    ),
    "monkeypatched-method": (
        "",
        "from nets import Vocoder\n\ndef custom(self, sd, strict=True):\n    pass\n\n"
        "Vocoder.load_state_dict = custom\nm = Vocoder()\n",
    ),
    "setattr-of-the-method": (
        "",
        "from nets import Vocoder\nsetattr(Vocoder, 'load_state_dict', print)\nm = Vocoder()\n",
    ),
    "global-rebinding": (
        "",
        "from nets import SpeakerNet, Vocoder\nm = Vocoder()\n\ndef pick():\n    global m\n"
        "    m = SpeakerNet()\n\npick()\n",
    ),
    "except-as": (
        "",
        "from nets import Vocoder\nm = Vocoder()\ntry:\n    import fancy\n"
        "except ImportError as m:\n    pass\n",
    ),
    "name-rebound-to-the-own-class": (
        "",
        "import sys\nfrom nets import SpeakerNet, Vocoder\nif sys.argv:\n"
        "    Vocoder = SpeakerNet\nm = Vocoder()\n",
    ),
    "type-made-class": (
        "",
        "Vocoder = type('Vocoder', (torch.nn.Module,), {})\nm = Vocoder()\n",
    ),
    "decorated-class": (
        "",
        "from nets import SpeakerNet\n\ndef loader(cls):\n    return cls\n\n@loader\n"
        "class Mine(torch.nn.Module):\n    pass\n\nm = Mine()\n",
    ),
    "metaclass": (
        "",
        "class Meta(type):\n    pass\n\nclass Mine(torch.nn.Module, metaclass=Meta):\n    pass\n\n"
        "m = Mine()\n",
    ),
    "names-set-by-computed-setattr": (
        "import sys\nfor name in ['Vocoder']:\n    setattr(sys.modules[__name__], name, SpeakerNet)\n",
        "from nets import Vocoder\nm = Vocoder()\n",
    ),
    "class-patched-from-another-module": (
        "",
        "import nets\nnets.Vocoder = nets.SpeakerNet\nfrom nets import Vocoder\nm = Vocoder()\n",
    ),
    "own-cuda-returning-another-module": (
        "",
        "from nets import SpeakerNet\n\nclass Wrapper(torch.nn.Module):\n"
        "    def cuda(self):\n        return SpeakerNet()\n\nm = Wrapper().cuda()\n",
    ),
    "method-imported-into-a-class": (
        "",
        "class Mine(torch.nn.Module):\n    from nets import load_state_dict\n\nm = Mine()\n",
    ),
    "import-fallback-under-the-name": (
        "",
        "try:\n    from fastnets import Vocoder\nexcept ImportError:\n"
        "    from nets import SpeakerNet as Vocoder\nm = Vocoder()\n",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_module_that_may_take_objects_keeps_the_fix_withheld(tmp_path: Path, case: str) -> None:
    nets_extra, app = HOSTILE[case]
    write_project(
        tmp_path,
        {"nets.py": SPEAKER + _indent(nets_extra), "app.py": "import torch\n" + app + _LOAD},
    )
    assert _one(tmp_path, "app.py").fix is None


@pytest.mark.parametrize(
    "body",
    [
        "def main(obj):\n    m = Vocoder()\n    match obj:\n        case SpeakerNet() as m:\n"
        "            pass\n    " + _LOAD,
        "def main():\n    m = Vocoder()\n\n    def pick():\n        nonlocal m\n"
        "        m = SpeakerNet()\n\n    pick()\n    " + _LOAD,
        "m = Vocoder()\nrestore = lambda m: " + _LOAD + "restore(SpeakerNet())\n",
        "class Base(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.net = Vocoder()\n\n    def restore(self):\n"
        "        self.net.load_state_dict(torch.load('v.pt'))\n\n"
        "class Spk(Base):\n    def __init__(self):\n        super().__init__()\n"
        "        self.net = SpeakerNet()\n",
        "m = Vocoder()\n\nclass Holder:\n    m = SpeakerNet()\n    " + _LOAD,
        "def build(Vocoder):\n    m = Vocoder()\n    " + _LOAD + "\nbuild(SpeakerNet)\n",
    ],
    ids=[
        "match-capture",
        "nonlocal",
        "lambda-parameter",
        "template-method",
        "class-body",
        "parameter-named-like-the-class",
    ],
)
def test_a_receiver_bound_where_the_checker_cannot_follow_gets_no_fix(
    tmp_path: Path, body: str
) -> None:
    write_project(tmp_path, {"nets.py": SPEAKER, "app.py": _app(_indent(body))})
    assert _one(tmp_path, "app.py").fix is None


def _indent(text: str) -> str:
    """``text`` at the indentation of SPEAKER's and _app's lines (write_project dedents)."""
    return "".join("    " + line if line.strip() else line for line in text.splitlines(True))
