"""Check the Triton kernels' `while` loops for the rule wave 47 learned (issue 13): a loop whose
body holds a CTA barrier must exit on values every warp of the program shares.

    python tools/check_loop_uniformity.py                  # kernels/*.py
    python tools/check_loop_uniformity.py kernels/persistent.py other.py

Why: a scalar `tl.load` is one load per warp, and where memory changes under the kernel (a header
the host or the copy engine writes, a flag another program raises) two warps can read two values.
A loop that exits on such a value lets one warp leave a poll before another; if the body holds a
barrier (`tl.debug_barrier`, and every reduction: `tl.sum`, `tl.max`, ... -- a reduction across
warps goes through shared memory between two barriers), the warps' barriers are out of step from
then on: wrong values read from shared memory, then a hang (kernels/persistent.py's inline poll
until wave 47: 3 wrong runs and 2 hangs in 363 runs of lstm_a's self-check stream on an H100).

How: a source check, per @triton.jit function (flow-insensitive: every assignment of a name
counts, and one made under an `if` or `while` whose test is not uniform is not uniform either):
- not uniform: the result of `tl.load`, `tl.atomic_*` and `tl.arange` (per thread, or per warp),
  and whatever is computed from such a value -- except through a reduction (`tl.sum`, `tl.max`,
  `tl.min`, ...: its scalar is the same in every thread), and `x * 0`;
- uniform: constants, the function's parameters (the kernel's arguments; a helper's are checked
  at its call sites: a call with a non-uniform argument gives a non-uniform result), the program
  id, and whatever is computed from uniform values only;
- a helper's result is not uniform when its `return` is not;
- a statement carrying a `# uniform: <reason>` comment (on any of its lines, or on lines of its
  own right above it) makes what it assigns or returns uniform: for values the analysis cannot see
  are shared (a word that, once seen, stays until every warp has seen it). Say why in the reason.
A loop is checked when its body calls a barrier or a helper that does (transitively). Not seen:
barriers the compiler inserts for layout conversions; loops written as `for` (their bounds are
the compiler's to keep uniform). Exit 1 when a loop breaks the rule; 2 on a file that does not
parse.
"""

from __future__ import annotations

import argparse
import ast
import glob
import io
import os
import sys
import tokenize
from dataclasses import dataclass

BARRIERS = frozenset({"debug_barrier", "sum", "max", "min", "reduce", "xor_sum", "argmax", "argmin", "cumsum",
                      "cumprod", "associative_scan", "dot", "histogram", "sort"})
"""tl.* calls that synchronise the program's warps (a CTA barrier, or shared memory between two)."""
REDUCTIONS = frozenset({"sum", "max", "min", "reduce", "xor_sum", "argmax", "argmin"})
"""tl.* calls whose (scalar) result every thread holds alike."""
PER_THREAD = ("load", "atomic_", "arange")
"""tl.* calls (by prefix) whose result may differ between threads or warps."""


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    function: str
    barrier: str  # what in the body synchronises the warps
    names: tuple[str, ...]  # the test's non-uniform names

    def __str__(self) -> str:
        return (f"{self.path}:{self.line}: {self.function}: a while loop whose body holds a barrier ({self.barrier}) "
                f"exits on {', '.join(self.names)}, not uniform across the program's warps")


def _tl_call(node: ast.AST) -> str | None:
    """The name of a `tl.` call (`tl.sum(x)`: "sum"; triton.language imported as tl), or of a
    reduction or barrier written as a tensor method (`x.sum()`: "sum"), else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        f = node.func
        if isinstance(f.value, ast.Name) and f.value.id == "tl":
            return f.attr
        if f.attr in BARRIERS:
            return f.attr
    return None


def _receiver(node: ast.Call) -> ast.AST | None:
    """`x` of a method call `x.m(...)` (not of a `tl.` function): its value flows into the result."""
    f = node.func
    if isinstance(f, ast.Attribute) and not (isinstance(f.value, ast.Name) and f.value.id == "tl"):
        return f.value
    return None


def _callee(node: ast.Call) -> str | None:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _is_jit(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        if (isinstance(d, ast.Attribute) and d.attr == "jit") or (isinstance(d, ast.Name) and d.id == "jit"):
            return True
    return False


def _waived_lines(source: str) -> set[int]:
    """Lines a `# uniform: <reason>` comment (a reason is required) covers: its own, and where it
    stands on lines of its own, the first line of the statement under it and its comment lines."""
    text_lines = source.splitlines()
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if text.startswith("uniform:") and text[len("uniform:"):].strip():
                at = tok.start[0]
                lines.add(at)
                if tok.line.lstrip().startswith("#"):
                    while at < len(text_lines) and text_lines[at].lstrip().startswith("#"):
                        at += 1  # the comment's continuation lines
                    lines.add(at + 1)  # the statement under it (1-based)
    return lines


def _waived(stmt: ast.stmt, waived: set[int]) -> bool:
    return any(line in waived for line in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))


def _targets(stmt: ast.stmt) -> list[str]:
    targets = (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
               if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) else [])
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


class Module:
    """The @triton.jit functions of some source files, with what each one's loops need."""

    def __init__(self, paths: list[str]):
        self.functions: dict[str, tuple[str, ast.FunctionDef, set[int]]] = {}
        for path in paths:
            with open(path) as f:
                source = f.read()
            tree = ast.parse(source, filename=path)
            waived = _waived_lines(source)
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef) and _is_jit(node):
                    self.functions[node.name] = (path, node, waived)
        self._barrier: dict[str, str | None] = {}
        self._returns_uniform: dict[str, bool] = {}

    # -- barriers

    def barrier_in(self, nodes: list[ast.AST], seen: frozenset[str] = frozenset()) -> str | None:
        """The first barrier the statements reach (directly or through a helper), described; None."""
        for stmt in nodes:
            for node in ast.walk(stmt):
                if not isinstance(node, ast.Call):
                    continue
                name = _tl_call(node)
                if name in BARRIERS:
                    return f"tl.{name} at line {node.lineno}"
                callee = _callee(node)
                if name is None and callee in self.functions and callee not in seen:
                    inner = self.function_barrier(callee, seen | {callee})
                    if inner:
                        return f"{callee} at line {node.lineno}: {inner}"
        return None

    def function_barrier(self, name: str, seen: frozenset[str] = frozenset()) -> str | None:
        if name not in self._barrier:
            self._barrier[name] = None  # recursion guard
            self._barrier[name] = self.barrier_in(self.functions[name][1].body, seen | {name})
        return self._barrier[name]

    # -- uniformity

    def returns_uniform(self, name: str) -> bool:
        if name not in self._returns_uniform:
            self._returns_uniform[name] = True  # recursion guard: assume, then settle
            self._returns_uniform[name] = self.analyse(name)[1]
        return self._returns_uniform[name]

    def uniform(self, expr: ast.AST, varying: set[str]) -> bool:
        """Whether `expr` holds the same value in every thread, given the non-uniform names."""
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult) and any(
                isinstance(side, ast.Constant) and side.value == 0 for side in (expr.left, expr.right)):
            return True  # x * 0: zero everywhere (how the kernels make an int64 zero from a load)
        if isinstance(expr, ast.Name):
            return expr.id not in varying
        if isinstance(expr, ast.Call):
            name = _tl_call(expr)
            if name in REDUCTIONS:
                return True
            if name is not None and name.startswith(PER_THREAD):
                return False
            callee = _callee(expr)
            if name is None and callee in self.functions and not self.returns_uniform(callee):
                return False
            args = list(expr.args) + [k.value for k in expr.keywords]
            receiver = _receiver(expr)
            if receiver is not None and name is None:  # x.to(...), x.reshape(...): x's value goes on
                args.append(receiver)
            return all(self.uniform(a, varying) for a in args)
        if isinstance(expr, (ast.Lambda, ast.Constant)):
            return True
        return all(self.uniform(c, varying) for c in ast.iter_child_nodes(expr))

    def analyse(self, name: str) -> tuple[set[str], bool]:
        """(the function's non-uniform names, whether every `return` is uniform), to a fixed point."""
        _, fn, waived = self.functions[name]
        varying: set[str] = set()
        while True:
            before = len(varying)
            returns_ok = self._walk(fn.body, varying, waived, control_uniform=True)
            if len(varying) == before:
                return varying, returns_ok

    def _walk(self, stmts: list[ast.stmt], varying: set[str], waived: set[int], control_uniform: bool) -> bool:
        returns_ok = True
        for stmt in stmts:
            if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                value = stmt.value
                ok = _waived(stmt, waived) or (control_uniform and value is not None and self.uniform(value, varying))
                if isinstance(stmt, ast.AugAssign):
                    ok = ok and (_waived(stmt, waived) or self.uniform(stmt.target, varying))
                if not ok:
                    varying.update(_targets(stmt))
            elif isinstance(stmt, ast.Return):
                if not _waived(stmt, waived):
                    returns_ok &= control_uniform and (stmt.value is None or self.uniform(stmt.value, varying))
            elif isinstance(stmt, (ast.If, ast.While)):
                inner = control_uniform and self.uniform(stmt.test, varying)
                returns_ok &= self._walk(stmt.body, varying, waived, inner)
                returns_ok &= self._walk(stmt.orelse, varying, waived, inner)
            elif isinstance(stmt, ast.For):
                inner = control_uniform and self.uniform(stmt.iter, varying)
                if not inner:
                    varying.update(n.id for n in ast.walk(stmt.target) if isinstance(n, ast.Name))
                returns_ok &= self._walk(stmt.body, varying, waived, inner)
            elif isinstance(stmt, ast.With):
                returns_ok &= self._walk(stmt.body, varying, waived, control_uniform)
        return returns_ok

    # -- the rule

    def findings(self) -> list[Finding]:
        out = []
        for name, (path, fn, _) in self.functions.items():
            varying, _ = self.analyse(name)
            for node in ast.walk(fn):
                if not isinstance(node, ast.While):
                    continue
                barrier = self.barrier_in(node.body)
                if barrier is None or self.uniform(node.test, varying):
                    continue
                names = sorted({n.id for n in ast.walk(node.test) if isinstance(n, ast.Name) and n.id in varying})
                out.append(Finding(path, node.lineno, name, barrier, tuple(names) or ("a per-thread load",)))
        return sorted(out, key=lambda f: (f.path, f.line))


def check(paths: list[str]) -> list[Finding]:
    """The loops of the @triton.jit functions in `paths` that break the rule (helpers resolved by name
    across all of them)."""
    return Module(paths).findings()


def default_paths() -> list[str]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return sorted(glob.glob(os.path.join(root, "kernels", "*.py")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", help="source files (default: kernels/*.py)")
    args = ap.parse_args(argv)
    paths = args.paths or default_paths()
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        ap.error(f"no such file: {', '.join(missing)}")
    try:
        found = check(paths)
    except SyntaxError as e:
        print(f"check_loop_uniformity: {e.filename}:{e.lineno}: does not parse: {e.msg}", file=sys.stderr)
        return 2
    for f in found:
        print(f)
    print(f"{len(found)} loop(s) break the rule in {len(paths)} file(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
