"""The pitfall table: one row per PyTorch pitfall, tying its three faces together.

Standard library only (``safetorch check`` and the docs read it without torch). Each row names
the public safetorch function(s) that are the one implementation of the pitfall, the
monkeypatch family that routes legacy torch calls to them, the ``safetorch check`` rule codes
that find the legacy spelling in source code, and the id of the runtime finding a check
reports. A face a pitfall cannot have carries the reason instead. ``tests/core/
test_core_pitfalls.py`` proves every row resolves (functions exist, patches are declared, rules
are registered, findings are emitted) and that the README's table is :func:`markdown_table`.

``python -m safetorch._pitfalls`` prints the table.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

__all__ = ["Pitfall", "PITFALLS", "by_id", "markdown_table"]


class Pitfall(NamedTuple):
    """One pitfall and its faces (``None`` for a face it cannot have, with the reason)."""

    id: str
    title: str
    problem: str
    functions: Tuple[str, ...]  # "st.<name>" (exported) or "st.<subpackage>.<name>"
    patch: Optional[str]  # the st.patch() family
    rules: Tuple[str, ...]  # safetorch check codes
    finding: Optional[str]  # runtime finding id (Finding.rule)
    docs: str  # docs page and anchor
    no_patch: str = ""  # why there is no patch, when there is none
    no_rule: str = ""  # why there is no rule, when there is none


PITFALLS: Tuple[Pitfall, ...] = (
    Pitfall(
        "unsafe-load",
        "Loading a checkpoint runs its code",
        "torch.load unpickles arbitrary objects unless weights_only=True (the default only "
        "from torch 2.6)",
        ("st.load",),
        "load",
        ("ST003",),
        None,
        "docs/checkpoints.md#load-safely-on-every-torch",
    ),
    Pitfall(
        "load-device",
        "Checkpoints load onto the device they were saved from",
        "a GPU-saved checkpoint fails on a CPU-only machine without map_location",
        ("st.load",),
        "load",
        ("ST004",),
        None,
        "docs/checkpoints.md#load-safely-on-every-torch",
    ),
    Pitfall(
        "wrapped-state-dict",
        "Wrapper prefixes break loading",
        "DataParallel/DDP/compile/FSDP add module./_orig_mod./... to every key",
        ("st.load_state_dict", "st.checkpoint.unwrap_model"),
        "state_dict",
        ("ST011",),
        None,
        "docs/checkpoints.md#load-a-checkpoint-into-any-model-wrapped-or-not",
    ),
    Pitfall(
        "silent-nonstrict-load",
        "strict=False hides what did not load",
        "load_state_dict(strict=False) reports mismatches only in a return value code ignores",
        ("st.load_state_dict",),
        "state_dict",
        ("ST012",),
        None,
        "docs/checkpoints.md#load-a-checkpoint-into-any-model-wrapped-or-not",
    ),
    Pitfall(
        "cuda-index-assert",
        "An out-of-range index kills the CUDA context",
        "CUDA index kernels assert on the device; the process must restart",
        ("st.checked_index", "st.index_select", "st.gather"),
        "index",
        (),
        None,
        "docs/tensors.md#checked-indexing-stchecked_index-stindex_select-stgather",
        no_rule="index values are runtime data: no static rule can tell a bad index",
    ),
    Pitfall(
        "detach-inplace",
        "detach() shares memory",
        "an in-place op on a detached tensor changes the original (a 'snapshot' that is not)",
        ("st.safe_copy",),
        None,
        ("ST005",),
        None,
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
        None,
        "docs/nn.md#upsampling-without-the-deprecated-entry-points",
    ),
    Pitfall(
        "syncbn-without-process-group",
        "SyncBatchNorm where it cannot run",
        "convert_sync_batchnorm converts without a process group or on devices it cannot use",
        ("st.convert_sync_batchnorm", "st.SyncBatchNorm"),
        "syncbn",
        ("ST014",),
        "torch-syncbn-device",
        "docs/nn.md#syncbatchnorm-that-also-runs-on-cpugloo-converted-only-when-it-means-something",
    ),
    Pitfall(
        "bias-before-bn",
        "A bias right before BatchNorm",
        "the mean subtraction cancels it: wasted parameters and compute",
        ("st.lint_model",),
        None,
        ("ST008",),
        "bias-before-bn",
        "docs/nn.md#model-lint-bias-before-bn-dropout-before-bn-meaningless-bn-statistics",
        no_patch="a model's structure is reported, never rewritten at run time",
    ),
    Pitfall(
        "dropout-before-bn",
        "Dropout before BatchNorm",
        "train and eval statistics disagree (variance shift)",
        ("st.lint_model",),
        None,
        ("ST009",),
        "dropout-before-bn",
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
        "bn-batch-of-one",
        "docs/nn.md#eval-much-worse-than-train-batchnorm-statistics",
        no_patch="statistics are a property of the data and model, checked and recalibrated",
    ),
    Pitfall(
        "functional-dropout-in-eval",
        "F.dropout stays on in eval mode",
        "F.dropout(x, p) in forward ignores model.eval() unless training=self.training",
        ("st.lint_model",),
        None,
        ("ST016",),
        None,
        "docs/check.md#rules",
        no_patch="F.dropout's training flag is the caller's; changing it would change training",
    ),
    Pitfall(
        "unpinned-batch",
        "pin_memory=True silently skips custom batches",
        "batch objects without pin_memory() stay pageable: no overlap of copy and compute",
        ("st.PinnedBatch", "st.data.pin", "st.data.collate"),
        "pin_memory",
        ("ST010",),
        "batch-not-pinnable",
        "docs/data.md#batches-that-actually-get-pinned-stpinnedbatch-stcollate-stpin",
    ),
    Pitfall(
        "loader-settings",
        "DataLoader settings that waste or skew work",
        "a partial last batch into BatchNorm, no workers, pin_memory without an accelerator",
        ("st.check_loader", "st.data.SafeDataLoader"),
        None,
        (),
        "partial-last-batch",
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
        None,
        "docs/timing.md#timing",
        no_patch="a clock reading cannot be told from other clock readings at run time",
    ),
    Pitfall(
        "legacy-api",
        "Removed and changed APIs in legacy code",
        "torch._six, torch.solve/lstsq/eig/symeig/matrix_rank, legacy autograd Functions, "
        "volatile=True, loss.data[0], size_average=/reduce= fail or change meaning on new torch",
        ("st.legacy",),
        "legacy",
        ("ST017", "ST018", "ST019", "ST020", "ST021", "ST022"),
        None,
        "docs/patching.md#legacy-code-on-new-torch-legacy-patch",
    ),
    Pitfall(
        "data-parallel",
        "nn.DataParallel",
        "slower than DDP and overloads cuda:0 with the gathered outputs",
        ("st.nn.BalancedDataParallel", "st.checkpoint.unwrap_model"),
        None,
        ("ST013",),
        None,
        "docs/data.md#stbalanceddataparallel",
        no_patch="replacing the parallel wrapper changes how a script is launched",
    ),
)


def by_id(pitfall_id: str) -> Pitfall:
    """The row with this id.

    >>> by_id("unsafe-load").functions
    ('st.load',)
    """
    for row in PITFALLS:
        if row.id == pitfall_id:
            return row
    raise KeyError(f"no pitfall {pitfall_id!r}; ids: {[r.id for r in PITFALLS]}")


def markdown_table() -> str:
    """The one-screen table the README shows (generated from :data:`PITFALLS`).

    >>> markdown_table().splitlines()[0]
    '| pitfall | safe function | patch | rule |'
    """
    lines: List[str] = ["| pitfall | safe function | patch | rule |", "|---|---|---|---|"]
    for row in PITFALLS:
        functions = ", ".join(f"`{f}`" for f in row.functions)
        patch = f"`{row.patch}`" if row.patch else "-"
        rules = ", ".join(row.rules) or "-"
        lines.append(f"| [{row.title}]({row.docs}) | {functions} | {patch} | {rules} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
