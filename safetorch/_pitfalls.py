"""The pitfall table: one row per PyTorch pitfall, tying its three faces together.

Standard library only (``safetorch check`` and the docs read it without torch). Each row names
the public safetorch function(s) that are the one implementation of the pitfall, the
monkeypatch family that routes legacy torch calls to them, the ``safetorch check`` rule codes
that find the legacy spelling in source code, and the id of the runtime finding a check
reports. A face a pitfall cannot have carries the reason instead. ``functions`` lists every
pitfall function a face of the row names: the function that reports its runtime finding
(``st.lint_model``, ``st.check_loader``) and the ones its messages suggest. ``tests/core/
test_core_pitfalls.py`` proves every row resolves (functions exist, patches are declared, rules
are registered, findings are emitted) and that the README's table is :func:`markdown_table`.

``python -m safetorch._pitfalls`` prints the table.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

__all__ = ["Pitfall", "PITFALLS", "by_id", "for_rule", "for_finding", "for_patch", "markdown_table"]


class Pitfall(NamedTuple):
    """One pitfall and its faces (``None`` for a face it cannot have, with the reason)."""

    id: str
    title: str
    problem: str
    functions: Tuple[str, ...]  # "st.<name>" (dir(st)) or "st.<subpackage>.<name>"
    patch: Optional[str]  # the st.patch() family
    rules: Tuple[str, ...]  # safetorch check codes
    findings: Tuple[str, ...]  # runtime finding ids (Finding.rule) of lint_model/check_loader
    docs: str  # docs page and anchor
    no_patch: str = ""  # why there is no patch, when there is none
    no_rule: str = ""  # why there is no rule, when there is none
    no_function: str = ""  # why there is no safetorch function, when there is none

    @property
    def finding(self) -> Optional[str]:
        """The pitfall's main runtime finding id (the first of ``findings``), or None.

        >>> by_id("bias-before-bn").finding, by_id("cuda-index-assert").finding
        ('bias-before-bn', None)
        """
        return self.findings[0] if self.findings else None


PITFALLS: Tuple[Pitfall, ...] = (
    Pitfall(
        "load-without-weights-only",
        "Loading a checkpoint runs its code",
        "torch.load unpickles arbitrary objects unless weights_only=True (the default only "
        "from torch 2.6)",
        ("st.load", "st.save", "st.trust"),
        "load",
        ("ST003",),
        (),
        "docs/checkpoints.md#load-safely-on-every-torch",
    ),
    Pitfall(
        "load-without-map-location",
        "Checkpoints load onto the device they were saved from",
        "a GPU-saved checkpoint fails on a CPU-only machine without map_location",
        ("st.load",),
        "load",
        ("ST004",),
        (),
        "docs/checkpoints.md#load-safely-on-every-torch",
    ),
    Pitfall(
        "state-dict-of-wrapped-model",
        "Wrapper prefixes break loading",
        "DataParallel/DDP/compile/FSDP add module./_orig_mod./... to every key",
        ("st.load_state_dict", "st.unwrap_model"),
        "state_dict",
        ("ST011",),
        (),
        "docs/checkpoints.md#load-a-checkpoint-into-any-model-wrapped-or-not",
    ),
    Pitfall(
        "discarded-nonstrict-load",
        "strict=False hides what did not load",
        "load_state_dict(strict=False) reports mismatches only in a return value code ignores",
        ("st.load_state_dict",),
        "state_dict",
        ("ST012",),
        (),
        "docs/checkpoints.md#load-a-checkpoint-into-any-model-wrapped-or-not",
    ),
    Pitfall(
        "cuda-index-assert",
        "An out-of-range index kills the CUDA context",
        "CUDA index kernels assert on the device; the process must restart",
        ("st.checked_index", "st.index_select", "st.gather"),
        "index",
        (),
        (),
        "docs/tensors.md#checked-indexing-stchecked_index-stindex_select-stgather",
        no_rule="index values are runtime data: no static rule can tell a bad index",
    ),
    Pitfall(
        "detach-then-inplace",
        "detach() shares memory",
        "an in-place op on a detached tensor changes the original (a 'snapshot' that is not)",
        ("st.safe_copy",),
        None,
        ("ST005",),
        (),
        "docs/tensors.md#stsafe_copyobj-detachclone-semantics-also-for-nested-state-dicts",
        no_patch="detach() is right in most code; only its use as a copy is the pitfall",
    ),
    Pitfall(
        "deprecated-upsample",
        "Deprecated upsampling entry points",
        "F.upsample*/nn.Upsampling*2d warn, and upsample_bilinear implies align_corners=True",
        ("st.upsample", "st.upsample_nearest", "st.upsample_bilinear", "st.Upsample"),
        "upsample",
        ("ST001", "ST002"),
        (),
        "docs/nn.md#upsampling-without-the-deprecated-entry-points",
    ),
    Pitfall(
        "torch-syncbn-device",
        "SyncBatchNorm where it cannot run",
        "convert_sync_batchnorm converts without a process group or on devices it cannot use",
        ("st.convert_sync_batchnorm", "st.SyncBatchNorm", "st.lint_model"),
        "syncbn",
        ("ST014",),
        ("torch-syncbn-device",),
        "docs/nn.md#syncbatchnorm-that-also-runs-on-cpugloo-converted-only-when-it-means-something",
    ),
    Pitfall(
        "bias-before-bn",
        "A bias right before BatchNorm",
        "the mean subtraction cancels it: wasted parameters and compute",
        ("st.lint_model",),
        None,
        ("ST008",),
        ("bias-before-bn",),
        "docs/nn.md#model-lint-bias-before-bn-dropout-before-bn-meaningless-bn-statistics",
        no_patch="a model's structure is reported, never rewritten at run time",
    ),
    Pitfall(
        "dropout-before-bn",
        "Dropout before BatchNorm",
        "train and eval statistics disagree (variance shift)",
        ("st.lint_model", "st.nn.recalibrate_bn"),
        None,
        ("ST009",),
        ("dropout-before-bn",),
        "docs/nn.md#model-lint-bias-before-bn-dropout-before-bn-meaningless-bn-statistics",
        no_patch="a model's structure is reported, never rewritten at run time",
    ),
    Pitfall(
        "bn-statistics",
        "Meaningless BatchNorm statistics",
        "batches of one, no running stats or odd momentum make eval much worse than train",
        ("st.lint_model", "st.nn.recalibrate_bn", "st.nn.bn_report"),
        None,
        ("ST015",),
        ("bn-batch-of-one", "bn-no-running-stats", "bn-momentum"),
        "docs/nn.md#eval-much-worse-than-train-batchnorm-statistics",
        no_patch="statistics are a property of the data and model, checked and recalibrated",
    ),
    Pitfall(
        "functional-dropout-without-training",
        "F.dropout stays on in eval mode",
        "F.dropout(x, p) in forward ignores model.eval() unless training=self.training",
        (),
        None,
        ("ST016",),
        (),
        "docs/check.md#rules",
        no_patch="F.dropout's training flag is the caller's; changing it would change training",
        no_function="the fix is one keyword (training=self.training), written by safetorch check "
        "--fix; no model check can see a functional call inside forward",
    ),
    Pitfall(
        "batch-not-pinnable",
        "pin_memory=True silently skips custom batches",
        "batch objects without pin_memory() stay pageable: no overlap of copy and compute",
        ("st.PinnedBatch", "st.data.pin", "st.data.collate", "st.check_loader"),
        "pin_memory",
        ("ST010",),
        ("batch-not-pinnable",),
        "docs/data.md#batches-that-actually-get-pinned-stpinnedbatch-stcollate-stpin",
    ),
    Pitfall(
        "loader-settings",
        "DataLoader settings that waste or skew work",
        "a partial last batch into BatchNorm, no workers, pin_memory without an accelerator",
        ("st.check_loader", "st.data.SafeDataLoader"),
        None,
        (),
        (
            "partial-last-batch",
            "last-batch-size-1-batchnorm",
            "num-workers-0",
            "pin-memory-no-accelerator",
        ),
        "docs/data.md#loader-checks-stcheck_loader-stsafedataloader",
        no_patch="loader settings are the user's choice: checked and explained, not changed",
        no_rule="batch and dataset sizes are runtime values",
    ),
    Pitfall(
        "unsynced-cuda-timing",
        "Timing CUDA without synchronizing",
        "CUDA is asynchronous: wall-clock readings time the launch, not the work",
        ("st.cuda_timer", "st.timing.benchmark"),
        None,
        ("ST006",),
        (),
        "docs/timing.md#timing",
        no_patch="a clock reading cannot be told from other clock readings at run time",
    ),
    Pitfall(
        "legacy-api",
        "Removed and changed APIs in legacy code",
        "torch._six, torch.solve/lstsq/eig/symeig/matrix_rank, legacy autograd Functions, "
        "volatile=True, loss.data[0], size_average=/reduce=, backward(retain_variables=), "
        "a BCELoss target of another shape, checkpoints of torch < 0.4, "
        "0.3's truncating integer / and contiguous element-wise results fail or change "
        "meaning on new torch; a fork child after OpenMP hangs",
        ("st.legacy", "st.load_state_dict"),
        "legacy",
        (
            *("ST017", "ST018", "ST019", "ST020", "ST021", "ST022", "ST023", "ST024", "ST025"),
            *("ST026", "ST027", "ST028", "ST029"),
        ),
        (),
        "docs/patching.md#legacy-code-on-new-torch-legacy-patch",
    ),
    Pitfall(
        "data-parallel",
        "nn.DataParallel",
        "slower than DDP and overloads cuda:0 with the gathered outputs",
        ("st.nn.BalancedDataParallel", "st.unwrap_model"),
        None,
        ("ST013",),
        (),
        "docs/data.md#stbalanceddataparallel",
        no_patch="replacing the parallel wrapper changes how a script is launched",
    ),
    Pitfall(
        "positional-with-default",
        "A positional argparse argument with a default",
        "argparse ignores default= on a positional without nargs='?': the argument stays "
        "required and the default is dead",
        (),
        None,
        ("ST007",),
        (),
        "docs/check.md#rules",
        no_patch="argparse is not torch: safetorch never patches it",
        no_function="the fix is one keyword (nargs='?'), written by safetorch check --fix",
    ),
)


def by_id(pitfall_id: str) -> Pitfall:
    """The row with this id.

    >>> by_id("load-without-weights-only").functions
    ('st.load', 'st.save', 'st.trust')
    """
    for row in PITFALLS:
        if row.id == pitfall_id:
            return row
    raise KeyError(f"no pitfall {pitfall_id!r}; ids: {[r.id for r in PITFALLS]}")


def _listing(face: str, value: str) -> Pitfall:
    for row in PITFALLS:
        if value in getattr(row, face):
            return row
    raise KeyError(f"no pitfall lists {face[:-1]} {value!r}")


def for_rule(code: str) -> Pitfall:
    """The row a ``safetorch check`` rule code belongs to.

    >>> for_rule("ST008").id
    'bias-before-bn'
    """
    return _listing("rules", code)


def for_finding(finding_id: str) -> Pitfall:
    """The row a runtime finding id (``Finding.rule``) belongs to.

    >>> for_finding("bn-momentum").id
    'bn-statistics'
    """
    return _listing("findings", finding_id)


def for_patch(name: str) -> Tuple[str, ...]:
    """The ids of the pitfalls a monkeypatch family routes (``st.patch(name)``).

    >>> for_patch("load")
    ('load-without-weights-only', 'load-without-map-location')
    """
    return tuple(row.id for row in PITFALLS if row.patch == name)


# The README is also read on a package index, without the repository: its links are absolute.
DOCS_BASE = "https://github.com/safetorch/safetorch/blob/main/"


def markdown_table() -> str:
    """The one-screen table the README shows (generated from :data:`PITFALLS`).

    >>> markdown_table().splitlines()[0]
    '| pitfall | safe function | patch | rule |'
    """
    lines: List[str] = ["| pitfall | safe function | patch | rule |", "|---|---|---|---|"]
    for row in PITFALLS:
        functions = ", ".join(f"`{f}`" for f in row.functions) or "-"
        patch = f"`{row.patch}`" if row.patch else "-"
        rules = ", ".join(row.rules) or "-"
        lines.append(f"| [{row.title}]({DOCS_BASE}{row.docs}) | {functions} | {patch} | {rules} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
