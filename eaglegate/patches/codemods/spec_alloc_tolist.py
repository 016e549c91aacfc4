"""Backport of SGLang PR #35377 ("[Spec] Avoid tensor scalar reads in spec decode
allocation", first released in 0.5.19) to the releases whose `alloc_for_spec_decode`
(`srt/mem_cache/allocation.py`, 0.5.16 to 0.5.18) still ends with

    for i, req in enumerate(reqs):
        req.kv.kv_allocated_len = max(req.kv.kv_allocated_len, int(nxt_kv_lens_cpu[i]))

one tensor-scalar read, a torch dispatch, per request and step. A gated step pays it too:
it still goes through the speculative decode preparation (`eagle_prepare_for_decode`). The
loop becomes 0.5.19's:

    nxt_kv_lens_list = nxt_kv_lens_cpu.tolist()
    for req, nxt_kv_len in zip(reqs, nxt_kv_lens_list, strict=True):
        req.kv.kv_allocated_len = max(req.kv.kv_allocated_len, nxt_kv_len)

The same values in the same order: the lengths are an int32 CPU tensor, whose `int(t[i])`
and `t.tolist()[i]` are the same Python int; `strict=True` as upstream (every caller passes
one length per request). The gate does not depend on it. The new line carries an
`# eaglegate:` comment, the mark by which `verify` and `status` find a patched file.

Only a loop of exactly that shape, a statement of the function's own body, is rewritten;
`generate` runs `backport_where_present`, which leaves a release without one unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from eaglegate.patches.codemods.common import Anchor, code, parse

FUNCTION = "alloc_for_spec_decode"
ALLOCATED = "kv_allocated_len"
# Upstream's names for the lengths as a list and one of them.
LENS_LIST = "nxt_kv_lens_list"
LEN_ITEM = "nxt_kv_len"
MARK = "# eaglegate: backport of SGLang PR #35377"

_POSITIONAL = m.Arg(keyword=None, star="")
# `<req>...kv_allocated_len = max(<the same>, <value>)`, the loop's one statement.
_KEEP_MAX = m.IndentedBlock(
    body=[
        m.SimpleStatementLine(
            body=[
                m.Assign(
                    targets=[m.AssignTarget(target=m.Attribute(attr=m.Name(ALLOCATED)))],
                    value=m.Call(func=m.Name("max"), args=[_POSITIONAL, _POSITIONAL]),
                )
            ]
        )
    ]
)
# `for <index>, <req> in enumerate(<reqs>):` around `_KEEP_MAX`.
_ENUMERATE_LOOP = m.For(
    target=m.Tuple(elements=[m.Element(m.Name()), m.Element(m.Name())]),
    iter=m.Call(func=m.Name("enumerate"), args=[_POSITIONAL]),
    body=_KEEP_MAX,
    orelse=None,
    asynchronous=None,
)
# `for <req>, <len> in zip(<reqs>, <list>, strict=True):` around `_KEEP_MAX`: the list form.
_ZIP_LOOP = m.For(
    target=m.Tuple(elements=[m.Element(m.Name()), m.Element(m.Name())]),
    iter=m.Call(
        func=m.Name("zip"),
        args=[
            _POSITIONAL,
            m.Arg(value=m.Name(), keyword=None),
            m.Arg(keyword=m.Name("strict"), value=m.Name("True")),
        ],
    ),
    body=_KEEP_MAX,
    orelse=None,
    asynchronous=None,
)


@dataclass(frozen=True)
class _Loop:
    """The per-index loop's parts: `for <index>, <req> in enumerate(<reqs>): <allocated> =
    max(<allocated>, int(<lens>[<index>]))`."""

    node: cst.For
    index: str
    req: str
    reqs: cst.BaseExpression
    allocated: cst.BaseExpression
    lens: str


def _loop_parts(node: cst.For) -> tuple[str, str, cst.Assign, cst.Call]:
    """The two target names, the body's assignment and its `max(...)` of a matched loop."""
    target = cst.ensure_type(node.target, cst.Tuple)
    first, second = (cst.ensure_type(e.value, cst.Name).value for e in target.elements)
    line = cst.ensure_type(
        cst.ensure_type(node.body, cst.IndentedBlock).body[0], cst.SimpleStatementLine
    )
    assign = cst.ensure_type(line.body[0], cst.Assign)
    return first, second, assign, cst.ensure_type(assign.value, cst.Call)


def _root_name(node: cst.BaseExpression) -> str | None:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None


def _keeps_own_allocation(assign: cst.Assign, keep_max: cst.Call, req: str) -> bool:
    """`<req>...kv_allocated_len = max(<the same attribute>, ...)`."""
    allocated = assign.targets[0].target
    return _root_name(allocated) == req and code(keep_max.args[0].value) == code(allocated)


def _as_scalar_loop(node: cst.BaseStatement) -> _Loop | None:
    """The per-index loop's parts, or None when `node` is not exactly that loop."""
    if not (isinstance(node, cst.For) and m.matches(node, _ENUMERATE_LOOP)):
        return None
    index, req, assign, keep_max = _loop_parts(node)
    read = keep_max.args[1].value
    # `int(<lens>[<index>])`: one scalar read of the lengths, at this request's index.
    scalar_read = m.Call(
        func=m.Name("int"),
        args=[
            m.Arg(
                keyword=None,
                star="",
                value=m.Subscript(
                    value=m.Name(), slice=[m.SubscriptElement(slice=m.Index(value=m.Name(index)))]
                ),
            )
        ],
    )
    if not (_keeps_own_allocation(assign, keep_max, req) and m.matches(read, scalar_read)):
        return None
    lens = cst.ensure_type(
        cst.ensure_type(cst.ensure_type(read, cst.Call).args[0].value, cst.Subscript).value,
        cst.Name,
    )
    iterable = cst.ensure_type(node.iter, cst.Call)
    return _Loop(node, index, req, iterable.args[0].value, assign.targets[0].target, lens.value)


def _is_list_loop(node: cst.BaseStatement) -> bool:
    """`for <req>, <len> in zip(<reqs>, <list>, strict=True): <allocated> = max(<allocated>,
    <len>)`: the list form (0.5.19 on, or a patched release)."""
    if not (isinstance(node, cst.For) and m.matches(node, _ZIP_LOOP)):
        return False
    req, item, assign, keep_max = _loop_parts(node)
    return _keeps_own_allocation(assign, keep_max, req) and m.matches(
        keep_max.args[1].value, m.Name(item)
    )


def _own_statements(func: cst.FunctionDef) -> list[cst.BaseStatement]:
    body = func.body
    return list(body.body) if isinstance(body, cst.IndentedBlock) else []


def _functions(module: cst.Module) -> list[cst.FunctionDef]:
    return [s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == FUNCTION]


def _has_scalar_loop(module: cst.Module) -> bool:
    return any(_as_scalar_loop(s) for func in _functions(module) for s in _own_statements(func))


def reads_scalar_per_request(source: str, file: str = "sglang/srt/mem_cache/allocation.py") -> bool:
    """Whether `alloc_for_spec_decode` here holds the per-index loop (0.5.16 to 0.5.18): the
    one shape this backport rewrites. A loop that does anything else is not PR #35377's and
    is left alone: the backport only saves time, and the gate is right without it, so a shape
    it does not know keeps its code rather than have the patch guess or refuse the gate."""
    if f"def {FUNCTION}(" not in source:  # the text test keeps other modules unparsed
        return False
    return _has_scalar_loop(parse(source, file))


def backport_where_present(source: str, file: str = "sglang/srt/mem_cache/allocation.py") -> str:
    """What `generate` runs: the backport where the per-index loop is
    (`reads_scalar_per_request`), the source unchanged elsewhere; the module parsed once."""
    if f"def {FUNCTION}(" not in source:
        return source
    module = parse(source, file)
    return _rewrite(module, source, file) if _has_scalar_loop(module) else source


def patch_alloc_for_spec_decode(
    source: str, file: str = "sglang/srt/mem_cache/allocation.py"
) -> str:
    """`alloc_for_spec_decode`'s per-index loop in PR #35377's list form; unchanged where the
    function already has that form."""
    return _rewrite(parse(source, file), source, file)


def _rewrite(module: cst.Module, source: str, file: str) -> str:
    funcs = _functions(module)
    Anchor(file, FUNCTION, "module-level function definition").check(len(funcs))
    func = funcs[0]
    statements = _own_statements(func)
    loops = [loop for loop in map(_as_scalar_loop, statements) if loop is not None]
    if not loops and any(_is_list_loop(s) for s in statements):
        return source  # patched, or a release with PR #35377 (0.5.19 on)
    Anchor(
        file,
        FUNCTION,
        f"the loop `for i, req in enumerate(reqs): req.kv.{ALLOCATED} = max(req.kv.{ALLOCATED}, "
        "int(<lens>[i]))` in its own body (or PR #35377's list form)",
    ).check(len(loops))
    loop = loops[0]
    # The rewrite binds two names and unbinds the index: neither may change another statement.
    Anchor(
        file, FUNCTION, f"uses of the names `{LENS_LIST}`, `{LEN_ITEM}` the rewrite adds", 0
    ).check(len(m.findall(func, m.Name(LENS_LIST) | m.Name(LEN_ITEM))))
    at = statements.index(loop.node)
    after = statements[at + 1 :]
    Anchor(
        file, FUNCTION, f"statements after the loop that read its index `{loop.index}`", 0
    ).check(sum(len(m.findall(s, m.Name(loop.index))) for s in after))
    lens_list = cst.parse_statement(f"{LENS_LIST} = {loop.lens}.tolist()  {MARK}\n")
    allocated = code(loop.allocated)
    list_loop = cst.parse_statement(
        f"for {loop.req}, {LEN_ITEM} in zip({code(loop.reqs)}, {LENS_LIST}, strict=True):\n"
        f"    {allocated} = max({allocated}, {LEN_ITEM})\n"
    )
    new_statements = [
        *statements[:at],
        lens_list.with_changes(leading_lines=loop.node.leading_lines),
        list_loop,
        *statements[at + 1 :],
    ]
    body = cst.ensure_type(func.body, cst.IndentedBlock)
    new_func = func.with_changes(body=body.with_changes(body=new_statements))
    return module.with_changes(body=[new_func if s is func else s for s in module.body]).code
