"""The checker's engine: parse a file once, walk its tree once, hand each node to the rules.

Pure stdlib (``ast``): the checker never imports torch, so it starts fast and runs where torch
is not installed. Positions: ``ast`` gives 1-based lines and 0-based *UTF-8 byte* columns;
everything this module hands out (diagnostics, edits) uses 0-based *character* columns
internally and 1-based character columns in ``Diagnostic``, like flake8 and ruff print them.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    ClassVar,
    Dict,
    Iterable,
    List,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
)

from safetorch.check._newer_syntax import newer_syntax
from safetorch.check.project import Project, parse

T = TypeVar("T")

__all__ = [
    "SAFE",
    "UNSAFE",
    "Context",
    "Diagnostic",
    "Edit",
    "Fix",
    "Options",
    "Positioned",
    "Rule",
    "analyze",
    "dotted_name",
    "end_position",
    "parse_codes",
    "split_lines",
]

#: A fix that keeps behaviour and checkpoint compatibility: ``--fix`` applies it.
SAFE = "safe"
#: A fix that changes what the code does (usually on purpose): only ``--unsafe-fixes`` applies it.
UNSAFE = "unsafe"

SYNTAX_ERROR_CODE = "ST000"

# The flake8 inline suppression: bare, or followed by a colon and codes (case-insensitive).
_NOQA = re.compile(
    r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.IGNORECASE
)
# Between the codes of a list: commas and whitespace ("ST003,ST004", "ST003, ST004").
_CODE_SEPARATORS = re.compile(r"[\s,]+")
# Lines exactly as the tokenizer counts them (str.splitlines would also split on \x0c, \x1c, ...).
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")

# Names that other spellings of the same torch object are folded into.
_CANONICAL = {
    "torch.nn.parallel.DataParallel": "torch.nn.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel": "torch.nn.DataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel": (
        "torch.nn.parallel.DistributedDataParallel"
    ),
    "torch.utils.data.dataloader.DataLoader": "torch.utils.data.DataLoader",
    "torch.serialization.load": "torch.load",
    "torch.serialization.save": "torch.save",
}


def parse_codes(spec: Union[str, Iterable[str], None]) -> Optional[Tuple[str, ...]]:
    """Rule codes as every list of them is read: ``--select``/``--ignore`` values, the codes of
    a ``# noqa:`` comment (a string: separated by commas or whitespace) and configuration lists
    (one code or prefix per item); stripped, upper-cased, empty items dropped.

    Args:
        spec: A string, an iterable of codes, or None.

    Returns:
        The codes in order, or None for None.

    >>> parse_codes("st003, ST004,,"), parse_codes(["st0 "]), parse_codes(None)
    (('ST003', 'ST004'), ('ST0',), None)
    """
    if spec is None:
        return None
    items = _CODE_SEPARATORS.split(spec) if isinstance(spec, str) else spec
    return tuple(code.strip().upper() for code in items if code.strip())


class Positioned(Protocol):
    """A node with a source position: every ``ast.expr`` and ``ast.stmt``, and ``keyword``,
    ``arg``, ``excepthandler``, ``alias``, ``pattern`` nodes (typeshed's ``ast.AST`` has none)."""

    lineno: int
    col_offset: int
    end_lineno: Optional[int]
    end_col_offset: Optional[int]


def end_position(node: Positioned) -> Tuple[int, int]:
    """(line, UTF-8 byte column) just past the end of ``node``; a parsed node always has one
    (a node made by hand without it gives its start)."""
    line, col = node.end_lineno, node.end_col_offset
    if line is None or col is None:
        return node.lineno, node.col_offset
    return line, col


def split_lines(source: str) -> List[str]:
    """Split ``source`` into lines with their endings, counting lines as ``ast`` does.

    Args:
        source: Python source text.

    Returns:
        The lines, each with its line ending (``\\n``, ``\\r\\n`` or ``\\r``) kept.

    >>> split_lines("a = 1\\r\\nb = '\\x0c'\\n")
    ['a = 1\\r\\n', "b = '\\x0c'\\n"]
    """
    return _LINE.findall(source)


def canonical(qualname: str) -> str:
    """Fold alternative spellings (``torch.nn.modules.conv.Conv2d``) into the public name."""
    if qualname.startswith("torch.nn.modules."):
        parts = qualname.split(".")
        if len(parts) >= 5:  # torch.nn.modules.<file>.<Name>[.attr]
            qualname = ".".join(["torch", "nn", *parts[4:]])
    return _CANONICAL.get(qualname, qualname)


def dotted_name(
    node: ast.AST, imports: Dict[str, str], local: Optional[str] = None
) -> Optional[str]:
    """``a.b.c`` with ``a`` replaced by what ``imports`` binds it to; a name no import binds
    gives None, or ``local`` + the name when ``local`` is given.

    >>> dotted_name(ast.parse("nn.Module", mode="eval").body, {"nn": "torch.nn"})
    'torch.nn.Module'
    >>> dotted_name(ast.parse("Net", mode="eval").body, {}, local="local:")
    'local:Net'
    """
    parts: List[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    base = imports.get(node.id)
    if base is None:
        if local is None:
            return None
        base = local + node.id
    return ".".join([base, *reversed(parts)])


@dataclass(frozen=True)
class Edit:
    """Replace the source text between two positions with ``content``.

    Lines are 1-based, columns 0-based characters; the end is exclusive. An insertion has
    equal start and end.

    >>> Edit(1, 4, 1, 4, ".clone()").content
    '.clone()'
    """

    line: int
    col: int
    end_line: int
    end_col: int
    content: str

    def to_dict(self) -> Dict[str, Any]:
        """JSON form with 1-based columns (the end column is exclusive)."""
        return {
            "line": self.line,
            "col": self.col + 1,
            "end_line": self.end_line,
            "end_col": self.end_col + 1,
            "content": self.content,
        }


@dataclass(frozen=True)
class Fix:
    """An automatic fix: what it does, the edits that do it, and whether it keeps behaviour.

    ``applicability`` is ``"safe"`` (keeps behaviour and checkpoint compatibility; ``--fix``
    applies it) or ``"unsafe"`` (changes behaviour, usually on purpose; only
    ``--unsafe-fixes`` applies it), as in ruff.

    >>> fix = Fix("add weights_only=True", (Edit(1, 13, 1, 13, ", weights_only=True"),))
    >>> fix.message, fix.applicability
    ('add weights_only=True', 'safe')
    """

    message: str
    edits: Tuple[Edit, ...]
    applicability: str = SAFE

    @property
    def safe(self) -> bool:
        """Whether plain ``--fix`` applies this fix."""
        return self.applicability == SAFE

    def to_dict(self) -> Dict[str, Any]:
        """JSON form: ``{"message": ..., "applicability": ..., "edits": [...]}``."""
        return {
            "message": self.message,
            "applicability": self.applicability,
            "edits": [e.to_dict() for e in self.edits],
        }


@dataclass(frozen=True)
class Options:
    """What rules may know about the project beyond the file (from ``[tool.safetorch]``).

    Attributes:
        min_torch: The oldest torch release the code supports, as ``(major, minor)``; None
            when unknown (rules then assume an old torch, the cautious side).
        project_root: The directory named on the command line the file was found under: the
            project's root when no ``pyproject.toml``/``setup.py``/``.git`` marks one (see
            :mod:`safetorch.check.project`).

    >>> Options(min_torch=(2, 6)).torch_at_least(2, 0)
    True
    >>> Options().torch_at_least(2, 0)
    False
    """

    min_torch: Optional[Tuple[int, int]] = None
    project_root: Optional[str] = None

    def torch_at_least(self, major: int, minor: int) -> bool:
        """True when every supported torch is at least ``major.minor``."""
        return self.min_torch is not None and self.min_torch >= (major, minor)


@dataclass(frozen=True)
class Diagnostic:
    """One finding of ``safetorch check``.

    Attributes:
        path: The file, as given on the command line (``"<string>"`` for source text).
        line: 1-based line of the start of the finding.
        col: 1-based character column of the start.
        end_line: 1-based line of the end.
        end_col: 1-based character column just past the end.
        code: The rule code, e.g. ``"ST003"``.
        message: What is wrong, and the safetorch function (or fix) that avoids it.
        fix: The automatic fix, or ``None`` when the rule only reports.

    >>> d = Diagnostic("train.py", 3, 5, 3, 20, "ST003", "torch.load without weights_only")
    >>> print(d)
    train.py:3:5: ST003 torch.load without weights_only
    """

    path: str
    line: int
    col: int
    end_line: int
    end_col: int
    code: str
    message: str
    fix: Optional[Fix] = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}"

    def to_dict(self) -> Dict[str, Any]:
        """JSON form: ``{path, line, col, end_line, end_col, code, message, fix}``."""
        return {
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "end_line": self.end_line,
            "end_col": self.end_col,
            "code": self.code,
            "message": self.message,
            "fix": None if self.fix is None else self.fix.to_dict(),
        }


class Context:
    """What the rules know about the file being checked: source, imports, scope, findings.

    >>> ctx = Context("m.py", "import torch.nn.functional as F\\nF.upsample(x)\\n")
    >>> ctx.add_imports(ctx.tree.body[0])
    >>> ctx.qualname(ctx.tree.body[1].value.func)
    'torch.nn.functional.upsample'
    """

    def __init__(
        self,
        path: str,
        source: str,
        tree: Optional[ast.Module] = None,
        options: Optional[Options] = None,
    ) -> None:
        self.path = path
        self.options = options or Options()
        self.source = source
        self.tree = parse(source, path) if tree is None else tree
        self.imports: Dict[str, str] = {}
        self.scope: ast.AST = self.tree
        self.diagnostics: List[Diagnostic] = []
        self.cache: Dict[str, Any] = {}  # analyses shared by several rules
        self._lines: Optional[List[str]] = None
        # Several rules ask about the same callee; nodes outlive the check, so ids are stable.
        self._qualnames: Dict[int, Optional[str]] = {}
        self._subtrees: Optional[_Subtrees] = None
        self._project: Optional[Project] = None

    # -- the project ---------------------------------------------------------------------
    @property
    def project(self) -> Project:
        """The project this file belongs to (its other files, parsed on first use)."""
        if self._project is None:
            self._project = Project.of(self.path, self.options.project_root)
        return self._project

    def project_facts(self, key: str, gather: Callable[[ast.Module, str], T]) -> Dict[str, T]:
        """``gather(tree, path)`` for every file of the project, this one included as it is
        now (its text may be mid-fix), keyed by the path relative to the project root.

        >>> def loads(tree, path):
        ...     return sum(isinstance(n, ast.Call) for n in ast.walk(tree))
        >>> Context("m.py", "f(g())\\n").project_facts("calls", loads)
        {'m.py': 2}
        """
        found = dict(self.project.facts(key, gather))
        mine = "project:" + key
        if mine not in self.cache:
            self.cache[mine] = gather(self.tree, self.project.relpath(self.path))
        found[self.project.relpath(self.path)] = self.cache[mine]
        return found

    # -- the tree ------------------------------------------------------------------------
    @property
    def subtrees(self) -> "_Subtrees":
        """The file's nodes in pre-order with each node's subtree span (built on first use)."""
        if self._subtrees is None:
            self._subtrees = _Subtrees(self.tree)
        return self._subtrees

    def walk(self, node: ast.AST) -> List[ast.AST]:
        """``node`` and every node under it, in pre-order: ``ast.walk`` for the rules, answered
        from this file's index (a slice of one traversal) when ``node`` belongs to its tree.

        The index belongs to this context, so files checked at the same time in several
        threads never see each other's.

        >>> ctx = Context("m.py", "x = f(y)\\n")
        >>> [type(n).__name__ for n in ctx.walk(ctx.tree.body[0].value)]
        ['Call', 'Name', 'Name']
        """
        index = self.subtrees
        found = index.span.get(id(node))
        if found is not None and index.order[found[0]] is node:
            return index.order[found[0] : found[1]]
        return list(ast.walk(node))

    # -- source text and positions -------------------------------------------------------
    @property
    def lines(self) -> List[str]:
        """The source lines, with endings."""
        if self._lines is None:
            self._lines = split_lines(self.source)
        return self._lines

    def char_col(self, line: int, byte_col: int) -> int:
        """Convert ``ast``'s UTF-8 byte column on ``line`` into a character column."""
        if line < 1 or line > len(self.lines):
            return byte_col
        text = self.lines[line - 1]
        if text.isascii():
            return byte_col
        return len(text.encode("utf-8")[:byte_col].decode("utf-8", errors="replace"))

    def start(self, node: Positioned) -> Tuple[int, int]:
        """(line, character column) where ``node`` starts."""
        line = node.lineno
        return line, self.char_col(line, node.col_offset)

    def end(self, node: Positioned) -> Tuple[int, int]:
        """(line, character column) just past the end of ``node``."""
        line, col = end_position(node)
        return line, self.char_col(line, col)

    def segment(self, node: Positioned) -> str:
        """The source text of ``node`` (whitespace and comments inside it kept)."""
        # Not ast.get_source_segment: it re-splits the whole file on every call.
        line, col = self.start(node)
        end_line, end_col = self.end(node)
        if line == end_line:
            return self.lines[line - 1][col:end_col]
        parts = [self.lines[line - 1][col:], *self.lines[line : end_line - 1]]
        parts.append(self.lines[end_line - 1][:end_col])
        return "".join(parts)

    # -- edits ---------------------------------------------------------------------------
    def replace(self, node: Positioned, content: str) -> Edit:
        """An edit replacing the whole text of ``node``."""
        return Edit(*self.start(node), *self.end(node), content)

    def insert_after(self, node: Positioned, content: str) -> Edit:
        """An edit inserting ``content`` right after ``node``."""
        line, col = self.end(node)
        return Edit(line, col, line, col, content)

    def replace_attr(self, node: ast.Attribute, attr: str) -> Edit:
        """An edit renaming the attribute of ``x.name`` (only the name's own span)."""
        line, col = self.end(node)
        return Edit(line, col - len(node.attr), line, col, attr)

    # -- names ---------------------------------------------------------------------------
    def add_imports(self, node: ast.AST) -> None:
        """Record the names an ``import`` / ``from ... import`` statement binds."""
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.imports[alias.asname] = alias.name
                else:
                    root = alias.name.split(".", 1)[0]
                    self.imports[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if alias.name != "*":
                    self.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def qualname(self, node: ast.AST) -> Optional[str]:
        """The dotted name an expression refers to through the file's imports, or None.

        ``F.upsample`` with ``import torch.nn.functional as F`` gives
        ``"torch.nn.functional.upsample"``; names that no import binds give None.
        """
        key = id(node)
        if key in self._qualnames:
            return self._qualnames[key]
        name = self._resolve(node)
        self._qualnames[key] = name
        return name

    def _resolve(self, node: ast.AST) -> Optional[str]:
        name = dotted_name(node, self.imports)
        return None if name is None else canonical(name)

    def spell(self, qualname: str) -> Optional[str]:
        """The shortest expression that names ``qualname`` with the file's imports, or None.

        >>> ctx = Context("m.py", "import torch as T\\n")
        >>> ctx.add_imports(ctx.tree.body[0])
        >>> ctx.spell("torch.nn.functional.interpolate")
        'T.nn.functional.interpolate'
        """
        best: Optional[str] = None
        for name, target in self.imports.items():
            if target == qualname:
                spelled = name
            elif qualname.startswith(target + "."):
                spelled = name + qualname[len(target) :]
            else:
                continue
            if best is None or len(spelled) < len(best):
                best = spelled
        return best

    # -- findings ------------------------------------------------------------------------
    def report(
        self,
        code: str,
        node: Positioned,
        message: str,
        fix: Optional[Fix] = None,
    ) -> None:
        """Record a finding spanning ``node``."""
        line, col = self.start(node)
        end_line, end_col = self.end(node)
        self.diagnostics.append(
            Diagnostic(self.path, line, col + 1, end_line, end_col + 1, code, message, fix)
        )

    def suppressed(self, diag: Diagnostic) -> bool:
        """True when a ``# noqa`` comment on the finding's first or last line covers it."""
        for line in {diag.line, diag.end_line}:
            if line < 1 or line > len(self.lines):
                continue
            text = self.lines[line - 1]
            if "noqa" not in text.lower():
                continue
            match = _NOQA.search(text)
            if match is None:
                continue
            codes = parse_codes(match.group("codes"))
            if codes is None or diag.code.upper() in codes:
                return True
        return False


class Rule:
    """Base of every rule: one pitfall, one code, one safetorch function.

    A subclass sets the class attributes below, lists the node types it wants in
    ``node_types`` and implements ``visit`` (called for each such node, in source order, with
    ``self.ctx.scope`` set to the enclosing function, class or module) and, for analyses that
    need the whole file, ``finish``. Its docstring is what ``safetorch check --explain``
    prints. One instance checks one file.
    """

    code: ClassVar[str] = ""
    name: ClassVar[str] = ""
    #: The id of its row in the pitfall table (``safetorch._pitfalls``).
    pitfall_id: ClassVar[str] = ""
    #: One line: what goes wrong.
    pitfall: ClassVar[str] = ""
    #: The public safetorch function for this pitfall (``"st.load"``), if there is one.
    safetorch: ClassVar[Optional[str]] = None
    #: The torch entry points this pitfall lives in (what monkeypatch mode would route).
    torch_symbols: ClassVar[Tuple[str, ...]] = ()
    #: Whether the rule can offer an automatic fix (for some of its findings).
    fixable: ClassVar[bool] = False
    #: How its fixes apply: ``"safe"``, ``"unsafe"``, or a short phrase when it depends.
    fix_applicability: ClassVar[str] = SAFE
    #: An opt-in rule (ruff's "preview"): its measured precision is below the default set's,
    #: so it runs only when selected by its exact code.
    preview: ClassVar[bool] = False
    node_types: ClassVar[Tuple[Type[ast.AST], ...]] = ()

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def visit(self, node: Any) -> None:
        """Look at one node of a type listed in ``node_types``."""

    def finish(self) -> None:
        """Called once after the walk, for rules that collect first and judge at the end."""

    def report(self, node: Positioned, message: str, fix: Optional[Fix] = None) -> None:
        """Record a finding of this rule spanning ``node``."""
        self.ctx.report(self.code, node, message, fix)


_SCOPES = frozenset({ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef})
# Fields that never hold a child node worth visiting (names, flags, operators, contexts).
_LEAF_FIELDS = frozenset(
    {"ctx", "op", "ops", "id", "attr", "arg", "kind", "type_comment", "level", "module"}
    | {"is_async", "conversion", "name", "names", "simple"}
)
_CHILD_FIELDS: Dict[Type[ast.AST], Tuple[str, ...]] = {}


def _child_fields(cls: Type[ast.AST]) -> Tuple[str, ...]:
    """The fields of node class ``cls`` that can hold child nodes (cached per class)."""
    fields = _CHILD_FIELDS.get(cls)
    if fields is None:
        fields = tuple(f for f in cls._fields if f not in _LEAF_FIELDS)
        if cls is ast.Constant or cls.__name__ == "MatchSingleton":
            fields = ()
        _CHILD_FIELDS[cls] = fields
    return fields


class _Subtrees:
    """Every node of one file in pre-order, with each node's subtree as a slice of that list.

    Rules ask for the nodes under a function or an expression many times (their own small
    analyses); one traversal up front answers each of those with a list slice instead of a new
    ``ast.walk``.
    """

    __slots__ = ("order", "span")

    def __init__(self, tree: ast.AST) -> None:
        order: List[ast.AST] = []
        span: Dict[int, Tuple[int, int]] = {}
        fields_of = _CHILD_FIELDS.get
        AST = ast.AST
        # (node, start index or -1): -1 enters the node, a start index closes its subtree
        stack: List[Tuple[ast.AST, int]] = [(tree, -1)]
        pop, push, append = stack.pop, stack.append, order.append
        while stack:
            node, start = pop()
            if start >= 0:
                span[id(node)] = (start, len(order))
                continue
            push((node, len(order)))
            append(node)
            cls = type(node)
            fields = fields_of(cls)
            if fields is None:
                fields = _child_fields(cls)
            children: List[ast.AST] = []
            for name in fields:
                value = getattr(node, name, None)
                if value.__class__ is list:
                    for item in value:
                        if isinstance(item, AST):
                            children.append(item)
                elif isinstance(value, AST):
                    children.append(value)
            for child in reversed(children):
                push((child, -1))
        self.order = order
        self.span = span


def _walk(
    ctx: Context, handlers: Dict[type, List[Callable[[Any], None]]], index: _Subtrees
) -> None:
    """Visit every node once, in source order (pre-order), with ``ctx.scope`` maintained.

    The one walk all rules share. The tree was traversed once already, into ``index`` (the
    pre-order list and each node's subtree span); this reads that list and keeps a stack of the
    enclosing scopes, each with the end of its subtree, instead of traversing again.
    """
    get = handlers.get
    order, span = index.order, index.span
    scopes: List[Tuple[ast.AST, int]] = [(ctx.tree, len(order))]
    for i, node in enumerate(order):
        while i >= scopes[-1][1]:
            scopes.pop()
        cls = type(node)
        handler_list = get(cls)
        if handler_list:
            ctx.scope = scopes[-1][0]  # a scope node's own handlers see the enclosing scope
            for handler in handler_list:
                handler(node)
        if cls in _SCOPES and node is not ctx.tree:
            scopes.append((node, span[id(node)][1]))


def _collect_toplevel_imports(ctx: Context) -> None:
    """Imports at module level (also inside if/try), before any rule looks at a name."""
    todo: List[ast.stmt] = list(ctx.tree.body)
    while todo:
        stmt = todo.pop()
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            ctx.add_imports(stmt)
        elif isinstance(stmt, (ast.If, ast.Try)):
            todo.extend(stmt.body)
            todo.extend(stmt.orelse)
            if isinstance(stmt, ast.Try):
                todo.extend(stmt.finalbody)
                for handler in stmt.handlers:
                    todo.extend(handler.body)


def _syntax_error(path: str, source: str, exc: Exception) -> Diagnostic:
    line = getattr(exc, "lineno", None) or 1
    col = getattr(exc, "offset", None) or 1
    msg = getattr(exc, "msg", None) or str(exc)
    newer = newer_syntax(source, line, msg)
    if newer is not None:
        msg += (
            f"; the file was not checked: {newer} is Python 3.12 syntax, which the Python "
            "running safetorch check does not parse (run it with Python 3.12 or newer)"
        )
    return Diagnostic(path, line, col, line, col, SYNTAX_ERROR_CODE, f"syntax error: {msg}")


def analyze(
    source: str,
    path: str,
    rules: Sequence[Type[Rule]],
    *,
    keep_syntax_errors: bool = True,
    options: Optional[Options] = None,
) -> List[Diagnostic]:
    """Run ``rules`` over ``source``; return the unsuppressed findings sorted by position.

    Args:
        source: Python source text.
        path: Name to report the findings under.
        rules: The rule classes to run.
        keep_syntax_errors: Report a file that does not parse as one ``ST000`` finding.
        options: Project facts the rules may use (the minimum torch version).

    Returns:
        The findings, sorted by (line, column, code).

    >>> analyze("def f(:\\n", "bad.py", [])[0].code
    'ST000'
    """
    try:
        tree = parse(source, path)
    except (SyntaxError, ValueError) as exc:  # ValueError: source with a NUL byte
        return [_syntax_error(path, source, exc)] if keep_syntax_errors else []
    ctx = Context(path, source, tree, options)
    _collect_toplevel_imports(ctx)
    handlers: Dict[type, List[Callable[[Any], None]]] = {
        ast.Import: [ctx.add_imports],
        ast.ImportFrom: [ctx.add_imports],
    }
    instances = [rule(ctx) for rule in rules]
    for inst in instances:
        for node_type in inst.node_types:
            handlers.setdefault(node_type, []).append(inst.visit)
    _walk(ctx, handlers, ctx.subtrees)
    ctx.scope = tree
    for inst in instances:
        inst.finish()
    found = [d for d in ctx.diagnostics if not ctx.suppressed(d)]
    found.sort(key=lambda d: (d.line, d.col, d.code))
    return found
